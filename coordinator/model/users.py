"""A secured cluster's users as stored (docs/surface.md#users-roles-and-grants): records and secrets.

Every user lives in one ZooKeeper node under the mergetxn root (coordinator/zk/log.py,
``users_path``), under the replicas' ACL: one JSON object ``{"users": {name: record}}``, changed
as a whole with a versioned set (replicas/users.py), so that a change is atomic and every replica
reads one consistent set. A record holds the role, the table grants (None: every table) and the
secret salted and hashed with scrypt, never the secret itself::

    {"role": "writer", "tables": ["events"], "secret": "scrypt$4096$8$1$<salt>$<hash>", "created_at": ...}

Everything here is pure: encoding, decoding (bounded; anything malformed is CorruptMetadata naming
the node), and checking what an admin asks for (InvalidInput naming the field).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import math
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from coordinator.core import jsonwire
from coordinator.core.errors import CorruptMetadata, InvalidInput, clip, quote
from coordinator.core.grants import Grantee, Role
from coordinator.core.tabledata import validate_name

# A login's check runs on the RPC server's login pool, off its I/O thread (coordinator/wire/rpc.py,
# LOGIN_WORKERS): N=2^12 keeps a failed login to about 15 ms of a core (2^14, the scrypt paper's
# interactive setting, took 60 ms here), and bounds what a brute force costs the replica's CPU.
# Secrets are made with 256 random bits (client.create_user), so the hash only has to make the
# users node useless to whoever reads it, which any salted hash of them does; the parameters
# are in each stored hash, so they can be raised later without making users again.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**12, 8, 1
MIN_SECRET, MAX_SECRET = 16, 256  # characters
MAX_USERS = 1000  # the node stays far below ZooKeeper's 1 MiB jute.maxbuffer
MAX_GRANTS = 1000  # tables per user
MAX_NAME = 64  # characters of a user name: it names a credentials file, and is in every log line about the user
_NAME_RE = re.compile(rf"^[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{MAX_NAME - 1}}}$")
NAME_RULE = f"1 to {MAX_NAME} letters, digits, '_', '.' or '-' (not starting with '.' or '-')"


def check_name(name: object) -> str:
    """A user name (:data:`NAME_RULE`), or InvalidInput naming the rule: what every road that
    makes a user (``client.create_user``, ``cluster.add_user``, ``mergetxn security add-user``)
    checks before anything else, so a bad name writes no file and sends no request."""
    if isinstance(name, str) and _NAME_RE.match(name):
        return name
    shown = quote(name, MAX_NAME) if isinstance(name, str) else f"of type {type(name).__name__}"
    raise InvalidInput(f"user name {shown} must be {NAME_RULE}", field="name", limit=MAX_NAME)


def check_role(role: object) -> Role:
    try:
        if isinstance(role, str):
            return Role(role)
    except ValueError:
        pass
    raise InvalidInput(f"role must be one of {[str(r) for r in Role]}, not {str(role)[:80]!r}", field="role")


def check_tables(tables: object, role: Role) -> tuple[str, ...] | None:
    """``None`` (every table, those created later included) or a list of table names."""
    if tables is None:
        return None
    if role is Role.ADMIN:
        raise InvalidInput("an admin has every table: give tables=None for an admin", field="tables")
    if isinstance(tables, str) or not isinstance(tables, (list, tuple)) or len(tables) > MAX_GRANTS:
        raise InvalidInput(
            f"tables must be None (every table) or a list of at most {MAX_GRANTS} table names", field="tables"
        )
    return tuple(sorted({validate_name("table", t) for t in tables}))


def check_secret(secret: object) -> str:
    if not isinstance(secret, str) or not MIN_SECRET <= len(secret) <= MAX_SECRET or not secret.isprintable():
        raise InvalidInput(f"a user's secret must be {MIN_SECRET} to {MAX_SECRET} printable characters", field="secret")
    return secret


def hash_secret(secret: str, salt: bytes | None = None) -> str:
    """``scrypt$N$r$p$<salt>$<hash>`` (base64): what a record keeps instead of the secret."""
    salt = os.urandom(16) if salt is None else salt
    digest = hashlib.scrypt(secret.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32)
    return "$".join(("scrypt", str(SCRYPT_N), str(SCRYPT_R), str(SCRYPT_P), _b64(salt), _b64(digest)))


def verify_secret(secret: str, encoded: str) -> bool:
    """Whether ``secret`` hashes to ``encoded`` (a constant-time compare of the hashes)."""
    try:
        scheme, n, r, p, salt, digest = encoded.split("$")
        if scheme != "scrypt":
            return False
        want = base64.b64decode(digest)
        got = hashlib.scrypt(
            secret.encode(),
            salt=base64.b64decode(salt),
            n=int(n),
            r=int(r),
            p=int(p),
            dklen=len(want),
            maxmem=64 * 1024 * 1024,
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, want)


@functools.cache
def decoy() -> str:
    """What an unknown user's secret is checked against, so that the answer takes as long as for
    a known user (a wrong name and a wrong secret look alike, also in time)."""
    return hash_secret(base64.b64encode(os.urandom(24)).decode())


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


@dataclass(frozen=True)
class UserRecord:
    """One user as stored; ``secret_hash`` identifies the credentials it was made with (a user
    dropped and made again under the same name has another)."""

    name: str
    role: Role
    tables: tuple[str, ...] | None
    secret_hash: str = field(repr=False)
    created_at: float = 0.0

    @classmethod
    def new(cls, name: object, role: object, tables: object, secret: object) -> UserRecord:
        """A new user from what an admin asked for (InvalidInput naming what is wrong)."""
        r = check_role(role)
        return cls(check_name(name), r, check_tables(tables, r), hash_secret(check_secret(secret)), time.time())

    def grantee(self) -> Grantee:
        return Grantee(self.name, self.role, None if self.tables is None else frozenset(self.tables))

    def public(self) -> dict[str, Any]:
        """What ``client.users()`` shows: never the hash."""
        return {
            "name": self.name,
            "role": str(self.role),
            "tables": None if self.tables is None else list(self.tables),
            "created_at": self.created_at,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": str(self.role),
            "tables": None if self.tables is None else list(self.tables),
            "secret": self.secret_hash,
            "created_at": self.created_at,
        }


def decode(data: bytes | None, where: str) -> dict[str, UserRecord]:
    """The users a node holds (empty for an empty node); CorruptMetadata naming ``where`` (a
    bounded message) for anything else, and nothing else: the body is input from outside."""
    if not data:
        return {}
    try:
        body = jsonwire.loads(data)  # (bounded nesting: see coordinator/core/jsonwire.py)
        if not isinstance(body, dict):
            raise ValueError(f"a JSON object is needed, not {type(body).__name__}")
        users = body["users"]
        if not isinstance(users, dict) or len(users) > MAX_USERS:
            raise ValueError(f"'users' must be an object of at most {MAX_USERS} users")
        out = {}
        for name, d in users.items():
            if not isinstance(d, dict):
                raise ValueError(f"user {quote(name)}: a record is an object, not {type(d).__name__}")
            role = Role(d["role"])
            tables = d.get("tables")
            if tables is not None and not (isinstance(tables, list) and all(isinstance(t, str) for t in tables)):
                raise ValueError(f"user {quote(name)}: 'tables' must be null or a list of names")
            if not isinstance(d["secret"], str):
                raise ValueError(f"user {quote(name)}: 'secret' must be a string")
            created_at = d.get("created_at") or 0.0
            if isinstance(created_at, bool) or not isinstance(created_at, (int, float, str)):
                raise ValueError(f"user {quote(name)}: 'created_at' must be a time, not {quote(created_at)}")
            created = float(created_at)
            if not math.isfinite(created):
                raise ValueError(f"user {quote(name)}: 'created_at' must be a finite time")
            out[check_name(name)] = UserRecord(
                name, role, None if tables is None else tuple(tables), d["secret"], created
            )
        return out
    except (ValueError, KeyError, TypeError, AttributeError, ArithmeticError, RecursionError, InvalidInput) as exc:
        why = "nested too deep" if isinstance(exc, RecursionError) else f"{type(exc).__name__}: {clip(exc)}"
        raise CorruptMetadata(f"users node {clip(where)} does not parse: {why}", node=clip(where)) from None


def encode(users: dict[str, UserRecord]) -> bytes:
    """The users node's body: ``{"users": {name: record}}``, keys sorted. Compact JSON through
    jsonwire (earlier versions wrote json.dumps's spaces: the same JSON, read alike both ways)."""
    if len(users) > MAX_USERS:
        raise InvalidInput(f"a cluster has at most {MAX_USERS} users")
    return jsonwire.dumps({"users": {n: u.to_dict() for n, u in sorted(users.items())}}, sort_keys=True)
