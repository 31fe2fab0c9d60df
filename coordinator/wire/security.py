"""A secured cluster's two identities: the replicas' and its users' (docs/surface.md#security and
docs/surface.md#users-roles-and-grants).

* **The replicas' identity** (:class:`Credentials` with a certificate and key, the replica
  credentials file ``credentials.json``): a user name and secret that log in to ZooKeeper (digest
  scheme; every node under the root carries an ACL that lets only this identity read or write it,
  replicas/replica.py), the replicas' TLS certificate and key, and what one replica presents to
  another (a forwarded ``commit_status``). Only replicas (and an operator's ``mergetxn status``)
  hold it.
* **Users** (:class:`Credentials` without certificate or key, e.g. ``admin.json``): a user name,
  a secret and the CA that signed the replicas' certificate. They log in to replicas only, over
  TLS with an ``auth`` request (coordinator/wire/rpc.py); the replicas check them against the users
  stored in ZooKeeper, salted and hashed (coordinator/model/users.py, replicas/users.py), and each call
  against the user's role and grants (coordinator/core/grants.py). Nothing in a user's file logs in to
  ZooKeeper: its secret is no ZooKeeper identity's, and :meth:`Credentials.zk_auth` refuses it.

A credentials file names its other files relative to its own directory::

    {"user": "mergetxn", "secret": "...", "ca_file": "ca.pem", "cert_file": "replica.pem",
     "key_file": "replica.key", "admin": {"user": "admin", "hash": "scrypt$..."}}   (replicas)
    {"user": "admin", "secret": "...", "ca_file": "ca.pem"}                          (a user)

``admin`` (the replicas' file only) is the first admin user, salted and hashed: the first replica
to start on a new root stores it (replicas/users.py); later ones find the users there.
:func:`make_cluster_credentials` (``mergetxn security init``) makes both files. A secret is never
printed: not in ``repr``, errors, logs, ``info`` or a command line (a process takes the file's
path, ``--credentials FILE`` or ``MERGETXN_CREDENTIALS``).
"""

from __future__ import annotations

import functools
import hmac
import json
import logging
import os
import secrets
import ssl
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from coordinator.core.errors import InvalidInput

if TYPE_CHECKING:
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

ENV_CREDENTIALS = "MERGETXN_CREDENTIALS"
DEFAULT_USER = "mergetxn"
MIN_SECRET = 16  # characters; make_cluster_credentials makes 43
DEFAULT_ADMIN = "admin"
ADMIN_FILE = "admin.json"  # what make_cluster_credentials writes for the first admin user
CLIENT_FILE = ADMIN_FILE  # the clients' file: a user's (the admin's, until an admin adds others)
REPLICA_FILE = "credentials.json"  # and for replicas


def _read_credentials_fields(path: Path) -> dict:
    """The fields of the credentials file at ``path``, refused (InvalidInput) when others may
    read it, it cannot be read or parsed, it is not an object, holds a field it should not, or
    lacks the user or the secret (a string each)."""
    _check_private(path, "credentials file")
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidInput(f"credentials file {path} cannot be read: {exc.strerror or exc}") from None
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except ValueError as exc:
        raise InvalidInput(
            f"credentials file {path} does not parse as "
            f"{'TOML' if path.suffix == '.toml' else 'JSON'}: {type(exc).__name__}"
        ) from None
    if not isinstance(data, dict):
        raise InvalidInput(f"credentials file {path} must hold an object with user, secret and ca_file")
    unknown = sorted(set(data) - {"user", "secret", "ca_file", "cert_file", "key_file", "admin"})
    if unknown:
        raise InvalidInput(f"credentials file {path}: unknown field(s) {unknown}")
    for name in ("user", "secret"):
        if not isinstance(data.get(name), str):
            raise InvalidInput(f"credentials file {path}: field {name!r} (a string) is missing")
    return data


@dataclass(frozen=True, repr=False)
class Credentials:
    """An identity and the TLS files that go with it: the replicas' (with ``cert_file`` and
    ``key_file``) or a user's (see the module docstring)."""

    user: str
    secret: str = field(repr=False)
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    admin: tuple[str, str] | None = field(default=None, repr=False)  # the first admin: (name, secret hash)

    def __post_init__(self) -> None:
        if not isinstance(self.user, str) or not self.user or ":" in self.user:
            raise InvalidInput(f"credentials: user must be a non-empty name without ':', not {self.user!r}")
        if not isinstance(self.secret, str) or len(self.secret) < MIN_SECRET:
            raise InvalidInput(
                f"credentials: the secret must be a string of at least {MIN_SECRET} characters "
                "(mergetxn security init makes one)"
            )
        for name in ("ca_file", "cert_file", "key_file"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))
        if (self.cert_file is None) != (self.key_file is None):
            raise InvalidInput("credentials: cert_file and key_file go together (a replica needs both)")

    def __repr__(self) -> str:
        files = ", ".join(
            f"{n}={str(getattr(self, n))!r}"
            for n in ("ca_file", "cert_file", "key_file")
            if getattr(self, n) is not None
        )
        return f"Credentials(user={self.user!r}, secret='***'{', ' + files if files else ''})"

    __str__ = __repr__

    # -- files -------------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Credentials:
        """Read a credentials file (JSON, or TOML when it ends in .toml). Refused when anyone
        but its owner may read it (it holds the secret): ``chmod 600`` it."""
        path = Path(path).expanduser()
        data = _read_credentials_fields(path)

        def file(name: str) -> Path | None:
            value = data.get(name)
            if value is None:
                return None
            if not isinstance(value, str):
                raise InvalidInput(f"credentials file {path}: field {name!r} must be a path")
            p = Path(value).expanduser()
            p = p if p.is_absolute() else path.parent.resolve() / p
            if not p.is_file():
                raise InvalidInput(f"credentials file {path}: {name} {p} does not exist")
            return p

        admin = data.get("admin")
        if admin is not None and not (
            isinstance(admin, dict) and isinstance(admin.get("user"), str) and isinstance(admin.get("hash"), str)
        ):
            raise InvalidInput(f"credentials file {path}: field 'admin' must hold the first admin's user and hash")
        try:
            creds = cls(
                data["user"],
                data["secret"],
                file("ca_file"),
                file("cert_file"),
                file("key_file"),
                None if admin is None else (admin["user"], admin["hash"]),
            )
        except InvalidInput as exc:
            raise InvalidInput(f"credentials file {path}: {exc.message.removeprefix('credentials: ')}") from None
        if creds.key_file is not None:
            _check_private(creds.key_file, "private key")
        return creds

    @classmethod
    def from_env(cls) -> Credentials | None:
        """The credentials file named by ``MERGETXN_CREDENTIALS``, or None when it is not set."""
        path = os.environ.get(ENV_CREDENTIALS, "").strip()
        return cls.from_file(path) if path else None

    def to_file(self, path: str | os.PathLike) -> Path:
        """Write this as a JSON credentials file (mode 0600), naming files beside it relatively."""
        path = Path(path)

        def rel(p: Path | None) -> str | None:
            if p is None:
                return None
            p = Path(p).resolve()
            return p.name if p.parent == path.parent.resolve() else str(p)

        data = {
            "user": self.user,
            "secret": self.secret,
            "ca_file": rel(self.ca_file),
            "cert_file": rel(self.cert_file),
            "key_file": rel(self.key_file),
            "admin": None if self.admin is None else {"user": self.admin[0], "hash": self.admin[1]},
        }
        _write_private(path, json.dumps({k: v for k, v in data.items() if v is not None}, indent=2) + "\n")
        return path

    @property
    def is_replica(self) -> bool:
        """Whether this is the replicas' identity (it has their certificate and key)."""
        return self.cert_file is not None

    def client(self) -> Credentials:
        """The same identity without the replica's certificate and key: for the replicas'
        identity, what a replica (or an operator's ``mergetxn status``) presents to a replica.
        Never hand it to users: it is the ZooKeeper identity (give them a user's credentials)."""
        return replace(self, cert_file=None, key_file=None, admin=None)

    # -- TLS and the check of an ``auth`` request ---------------------------------------------
    def client_context(self) -> ssl.SSLContext:
        """TLS 1.2+ verifying the replica's certificate against ``ca_file``, host name or IP
        address included."""
        if self.ca_file is None:
            raise InvalidInput(
                "credentials: ca_file (the CA that signed the replicas' certificate) is needed to connect"
            )
        try:
            return _client_context(self.ca_file, self.ca_file.stat().st_mtime_ns)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidInput(f"credentials: CA file {self.ca_file} does not load: {exc}") from None

    def server_context(self) -> ssl.SSLContext:
        """TLS 1.2+ with the replica's certificate and key."""
        if self.cert_file is None or self.key_file is None:
            raise InvalidInput(
                "credentials: a replica needs cert_file and key_file (its certificate and key; "
                "mergetxn security init writes them)"
            )
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        # No session tickets: an idle client connection then has nothing to read but a close,
        # which is how the client tells it is still open (coordinator/wire/rpc.py, _alive).
        ctx.num_tickets = 0
        try:
            ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        except (OSError, ssl.SSLError) as exc:
            raise InvalidInput(
                f"credentials: certificate {self.cert_file} with key {self.key_file} does not load: {exc}"
            ) from None
        return ctx

    def authenticator(self) -> Callable[[dict], str | None]:
        """The check of an ``auth`` request's ``{"user", "secret"}`` naming this identity alone
        (constant-time compares): the user name, or None. A replica checks users too
        (replicas/users.py); this serves an RPC server with one identity."""
        user, secret = self.user.encode(), self.secret.encode()

        def check(args: dict) -> str | None:
            u, s = args.get("user"), args.get("secret")
            if not isinstance(u, str) or not isinstance(s, str):
                return None
            return (
                self.user if hmac.compare_digest(u.encode(), user) & hmac.compare_digest(s.encode(), secret) else None
            )

        return check

    def auth_request(self) -> dict:
        """The arguments of the ``auth`` request a client sends first on each connection."""
        return {"user": self.user, "secret": self.secret}

    # -- ZooKeeper -----------------------------------------------------------------------------
    def zk_auth(self) -> list[tuple[str, str]]:
        """kazoo's ``auth_data``: the replicas' digest identity (a user's credentials have none)."""
        self._zk_identity()
        return [("digest", f"{self.user}:{self.secret}")]

    def zk_acl(self) -> list:
        """kazoo's ``default_acl``: every permission for this identity, none for anyone else: its
        certificate's subject (``x509`` scheme: ZooKeeper authenticates the client certificate of
        every session) and its digest identity (the ACL of nodes made before certificates were
        required, which sessions still log in with)."""
        from kazoo.security import ACL, Id, Permissions, make_digest_acl

        self._zk_identity()
        assert self.cert_file is not None
        return [
            ACL(Permissions.ALL, Id("x509", zk_x509_subject(self.cert_file))),
            make_digest_acl(self.user, self.secret, all=True),
        ]

    def _zk_identity(self) -> None:
        if not self.is_replica:
            raise InvalidInput(
                f"credentials of user {self.user!r} log in to replicas only: ZooKeeper takes the "
                "replicas' credentials file (mergetxn security init's credentials.json)"
            )

    def redactor(self) -> logging.Filter:
        """A logging filter that replaces the secret in any record (kazoo logs its auth packet)."""
        return _Redact(self.secret)


@functools.lru_cache(maxsize=16)
def _client_context(ca_file: Path, mtime_ns: int) -> ssl.SSLContext:
    """One context per CA file (as it is now): loading it costs more than a connection's handshake."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the certificate and the host name or IP
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_verify_locations(cafile=str(ca_file))
    return ctx


class _Redact(logging.Filter):
    def __init__(self, secret: str) -> None:
        super().__init__()
        self._secret = secret

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self._secret in message:
            record.msg, record.args = message.replace(self._secret, "***"), None
        return True


def resolve(credentials: Credentials | str | os.PathLike | None) -> Credentials | None:
    """``credentials`` as given (a path is read), or from ``MERGETXN_CREDENTIALS`` when None."""
    if credentials is None:
        return Credentials.from_env()
    if isinstance(credentials, Credentials):
        return credentials
    if isinstance(credentials, (str, os.PathLike)):
        return Credentials.from_file(credentials)
    raise InvalidInput(
        f"credentials must be a Credentials or the path of a credentials file, not {type(credentials).__name__}"
    )


def _check_private(path: Path, what: str) -> None:
    try:
        st = path.stat()
    except OSError as exc:
        raise InvalidInput(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    if st.st_mode & 0o077:
        raise InvalidInput(
            f"{what} {path} may be read by others (mode {stat.S_IMODE(st.st_mode):04o}): it holds "
            f"a secret; make it private with: chmod 600 {path}"
        )


def _write_private(path: Path, text: str | bytes) -> None:
    """Write a file only its owner may read (created 0600, replaced atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(text.encode() if isinstance(text, str) else text)
    os.replace(tmp, path)


# -- backups: a manifest's MAC under a key derived from the replicas' secret -----------------------
BACKUP_MAC_LABEL = b"mergetxn backup manifest MAC v1"  # HKDF info: this key serves nothing else


def backup_mac(identity: Credentials, digest: str) -> str:
    """HMAC-SHA256 (hex) of a backup manifest's SHA-256 ``digest`` (64 hex digits) under a key
    derived from the replicas' secret with HKDF and :data:`BACKUP_MAC_LABEL`: only a holder of the
    secret (a replica, for an admin: mergetxn/tools/recovery.py) makes or checks one. Neither the
    key nor the secret is returned or logged."""
    if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise InvalidInput("backup_mac: digest must be a SHA-256 in 64 lowercase hex digits", field="digest")
    return hmac.new(_backup_key(identity.user, identity.secret), bytes.fromhex(digest), "sha256").hexdigest()


@functools.lru_cache(maxsize=4)
def _backup_key(user: str, secret: str) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(hashes.SHA256(), 32, salt=user.encode(), info=BACKUP_MAC_LABEL).derive(secret.encode())


def make_user_credentials(name: str, ca_file: Path | None) -> Credentials:
    """A user's credentials with a new secret (43 characters, 256 random bits)."""
    return Credentials(name, secrets.token_urlsafe(32), ca_file)


def _alt_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    """The replica certificate's subject alternative names for ``hosts`` (an IP address or a DNS
    name each, blanks and repeats dropped); InvalidInput when none is left."""
    import ipaddress

    from cryptography import x509

    hosts = list(dict.fromkeys(h.strip() for h in hosts if h and h.strip()))
    if not hosts:
        raise InvalidInput("make_cluster_credentials: give at least one host (IP address or DNS name)")
    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    return sans


def _cluster_ca(now: dt.datetime, days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Name, x509.Certificate]:
    """A new private CA valid from ``now`` for ``days``: its key, name and certificate."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"mergetxn cluster CA {secrets.token_hex(4)}")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return ca_key, ca_name, ca_cert


def _replica_certificate(
    ca_key: ec.EllipticCurvePrivateKey, ca_name: x509.Name, sans: list[x509.GeneralName], now: dt.datetime, days: int
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A new key and the one replica certificate for ``sans``, signed by the CA, valid from
    ``now`` for ``days``."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mergetxn replica")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        # Server usage: replicas and ZooKeeper serve with it; client usage: replicas present it to
        # ZooKeeper, which opens sessions to holders of a cluster CA certificate only.
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def make_cluster_credentials(
    directory: str | os.PathLike,
    hosts: Iterable[str] = ("127.0.0.1", "localhost"),
    user: str = DEFAULT_USER,
    days: int = 825,
    admin: str = DEFAULT_ADMIN,
) -> Credentials:
    """Make a private CA, a replica certificate for ``hosts`` (IP addresses and DNS names, as
    clients will address the replicas) and a new secret in ``directory``:

    ``ca.pem`` (the CA certificate: what clients verify replicas with), ``replica.pem`` and
    ``replica.key`` (one certificate for every replica), ``credentials.json`` (the replicas'
    identity, ``user``, with the first admin's name and salted hash) and ``admin.json`` (the
    admin user ``admin``'s credentials, for clients). Keys and credentials files are mode 0600.
    The CA's key is not kept: to add a host, make new credentials and hand them out again.

    Returns the replicas' credentials (:func:`admin_credentials` reads the admin's)."""
    from coordinator.model.users import check_name, hash_secret

    check_name(admin)
    if admin == user:
        raise InvalidInput(f"the admin user must have another name than the replicas' identity {user!r}")
    import datetime as dt

    from cryptography.hazmat.primitives import serialization

    sans = _alt_names(hosts)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    ca_key, ca_name, ca_cert = _cluster_ca(now, days)
    key, cert = _replica_certificate(ca_key, ca_name, sans, now, days)
    pem = serialization.Encoding.PEM
    (d / "ca.pem").write_bytes(ca_cert.public_bytes(pem))
    (d / "replica.pem").write_bytes(cert.public_bytes(pem))
    _write_private(
        d / "replica.key", key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    first = make_user_credentials(admin, d / "ca.pem")
    creds = Credentials(
        user,
        secrets.token_urlsafe(32),
        d / "ca.pem",
        d / "replica.pem",
        d / "replica.key",
        (admin, hash_secret(first.secret)),
    )
    creds.to_file(d / REPLICA_FILE)
    first.to_file(d / ADMIN_FILE)
    return Credentials.from_file(d / REPLICA_FILE)


def admin_credentials(directory: str | os.PathLike) -> Credentials:
    """The first admin user's credentials that :func:`make_cluster_credentials` wrote."""
    return Credentials.from_file(Path(directory) / ADMIN_FILE)


# -- ZooKeeper in a secured cluster: TLS stores and kazoo's arguments (the replicas' identity) ----
#
# ZooKeeper serves its clients over TLS only (secureClientPort, PEM stores) with the replica
# certificate and key, which clients check against the cluster CA and their host name, and it
# opens a session only to a client that presents a certificate the cluster CA signed
# (ssl.clientAuth=need): the replica certificate, with client usage. ZooKeeper's x509 scheme
# names the session by the certificate's subject (the nodes' ACL, with the digest identity), and
# a session not so authenticated is closed (enforce.auth). The CA's key is not kept, so the
# quorum (member to member, mutual TLS) gets its own CA, derived from the secret: every member
# holding the replicas' credentials makes the same CA key on its own host and signs its own
# certificate, and nobody without the secret can make one (mergetxn/local/zkserver.py,
# docs/architecture/wire-and-security.md).

ZK_SERVER_STORE = "zookeeper-server.pem"  # key and certificate ZooKeeper serves its client port with
ZK_TRUST_STORE = "zookeeper-ca.pem"  # the cluster CA: verifies the client certificate of every session
ZK_QUORUM_STORE = "zookeeper-quorum.pem"  # this member's quorum key and certificate
ZK_QUORUM_TRUST = "zookeeper-quorum-ca.pem"  # the quorum CA derived from the secret


def zk_client_args(creds: Credentials | None) -> dict:
    """kazoo ``KazooClient`` keyword arguments for the replicas' identity: TLS that presents the
    replica certificate and key (ZooKeeper opens no session without a certificate of the cluster
    CA) and verifies ZooKeeper's certificate against the cluster CA and the host name, and the
    digest identity (``{}`` for an unsecured cluster)."""
    if creds is None:
        return {}
    if creds.ca_file is None:
        raise InvalidInput("credentials: ca_file is needed to reach a secured cluster's ZooKeeper over TLS")
    auth = creds.zk_auth()  # refuses a user's credentials: only the replicas' reach ZooKeeper
    assert creds.cert_file is not None and creds.key_file is not None
    _check_client_usage(creds.cert_file)
    return {
        "auth_data": auth,
        "use_ssl": True,
        "ca": str(creds.ca_file),
        "certfile": str(creds.cert_file),
        "keyfile": str(creds.key_file),
        "verify_certs": True,
        "check_hostname": True,
    }


def zk_tls_context(creds: Credentials) -> ssl.SSLContext:
    """TLS to a secured ZooKeeper outside kazoo (the ``srvr`` four-letter word of ``mergetxn
    status`` and the readiness checks): verifies ZooKeeper's certificate and host name against
    the cluster CA and presents the replica certificate, without which ZooKeeper completes no
    handshake."""
    creds.zk_auth()  # refuses a user's credentials: only the replicas' reach ZooKeeper
    assert creds.cert_file is not None and creds.key_file is not None
    _check_client_usage(creds.cert_file)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_verify_locations(cafile=str(creds.ca_file))
        ctx.load_cert_chain(str(creds.cert_file), str(creds.key_file))
    except (OSError, ssl.SSLError, TypeError) as exc:
        raise InvalidInput(f"credentials: the TLS files for ZooKeeper do not load: {exc}") from None
    return ctx


def zk_x509_subject(cert_file: Path) -> str:
    """The name ZooKeeper's x509 scheme gives a session presenting ``cert_file``: its subject,
    as Java writes it (RFC 2253)."""
    return _certificate(cert_file, cert_file.stat().st_mtime_ns).subject.rfc4514_string()


@functools.lru_cache(maxsize=16)
def _certificate(cert_file: Path, mtime_ns: int) -> x509.Certificate:
    from cryptography import x509 as x509_

    try:
        return x509_.load_pem_x509_certificate(cert_file.read_bytes())
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"credentials: certificate {cert_file} does not load: {exc}") from None


def _check_client_usage(cert_file: Path) -> None:
    """Refuse a replica certificate ZooKeeper would refuse as a client's: one made before
    replicas presented it to ZooKeeper (server usage only), naming the fix."""
    from cryptography import x509 as x509_
    from cryptography.x509.oid import ExtendedKeyUsageOID

    cert = _certificate(cert_file, cert_file.stat().st_mtime_ns)
    try:
        usages = cert.extensions.get_extension_for_class(x509_.ExtendedKeyUsage).value
    except x509_.ExtensionNotFound:
        return
    if ExtendedKeyUsageOID.CLIENT_AUTH not in usages:
        raise InvalidInput(
            f"credentials: certificate {cert_file} is for servers only, and a secured ZooKeeper opens "
            "sessions only to clients presenting a certificate of the cluster CA: make new credentials "
            "with mergetxn security init (its replica certificate serves both) and hand them out again"
        )


def zk_server_stores(creds: Credentials, directory: str | os.PathLike) -> tuple[Path, Path]:
    """ZooKeeper's client-port PEM key store (the replica key and certificate in one file,
    mode 0600) and trust store (the cluster CA), written in ``directory``."""
    if creds.cert_file is None or creds.key_file is None or creds.ca_file is None:
        raise InvalidInput(
            "credentials: ZooKeeper's TLS needs the replicas' credentials file (ca_file, cert_file "
            "and key_file; mergetxn security init writes them)"
        )
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    try:
        key, cert, ca = creds.key_file.read_bytes(), creds.cert_file.read_bytes(), creds.ca_file.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"credentials: a TLS file does not read: {exc.strerror or exc}") from None
    _write_private(d / ZK_SERVER_STORE, key + cert)
    _write_private(d / ZK_TRUST_STORE, ca)
    return d / ZK_SERVER_STORE, d / ZK_TRUST_STORE


def _quorum_ca(creds: Credentials) -> tuple:
    """The quorum CA's key (derived from the secret: the same on every member) and certificate."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    from cryptography.x509.oid import NameOID

    order = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551  # P-256
    seed = HKDF(hashes.SHA256(), 48, salt=b"mergetxn zookeeper quorum", info=creds.user.encode()).derive(
        creds.secret.encode()
    )
    key = ec.derive_private_key(int.from_bytes(seed, "big") % (order - 1) + 1, ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mergetxn ZooKeeper quorum CA")])
    start = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=365 * 30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def zk_quorum_stores(creds: Credentials, directory: str | os.PathLike, host: str, days: int = 825) -> tuple[Path, Path]:
    """A member's quorum PEM key store (a new key and a certificate for ``host``, usable as TLS
    server and client, signed by the quorum CA; mode 0600) and trust store (the quorum CA)."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_key, ca_cert = _quorum_ca(creds)
    try:
        san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        san = x509.DNSName(host)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"mergetxn ZooKeeper {host}")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([san]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    d = Path(directory)
    _write_private(
        d / ZK_QUORUM_STORE,
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        + cert.public_bytes(pem),
    )
    _write_private(d / ZK_QUORUM_TRUST, ca_cert.public_bytes(pem))
    return d / ZK_QUORUM_STORE, d / ZK_QUORUM_TRUST
