"""ZooKeeper in a secured cluster.

Its client port is TLS only and completes a handshake only with a client presenting a
certificate of the cluster CA (a made-up identity gets no session, so ZooKeeper 3.9.4's
ACL-less deleteContainer is out of its reach), the certificate is the replicas' x509 identity, only ``srvr`` of the four-letter words is served, ``/`` carries the identity's ACL, an
ensemble's members talk mutual TLS; ``mergetxn status`` works on it. And the log is never
skipped: a committed entry deleted under a fresh replica's feet stops that replica with
CorruptMetadata naming the node, ``mergetxn status`` reports it, no replica diverges.

All against the real processes: a secured LocalCluster (its own embedded ZooKeeper) and a
secured 3-member ZooKeeperEnsemble.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import struct
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError
from support.cluster import make_cluster  # tests/ is on sys.path
from support.waiting import wait_until
from support.zk import assert_no_session

import coordinator
from coordinator.core.versions import split_csn
from coordinator.errors import CorruptMetadata, InvalidInput
from coordinator.wire.security import (
    REPLICA_FILE,
    Credentials,
    make_cluster_credentials,
    zk_client_args,
    zk_tls_context,
)
from coordinator.zk.log import CsnLog
from mergetxn.cli import cli
from mergetxn.local.zkserver import ZooKeeperEnsemble, four_letter_word

pytestmark = pytest.mark.zk

SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.string())])
EXIT_UNHEALTHY = 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    """Three secured replicas and their own (secured) ZooKeeper."""
    with make_cluster(tmp_path_factory, None, "zkhard", replicas=3, secure=True) as c:
        yield c


def kazoo(hosts: str, **kwargs: object) -> KazooClient:
    zk = KazooClient(hosts=hosts, timeout=10, connection_retry={"max_tries": 0}, **kwargs)
    zk.start(timeout=15)
    return zk


def close(zk: KazooClient) -> None:
    zk.stop()
    zk.close()


def replicas(cluster: coordinator.LocalCluster) -> Credentials:
    """The replicas' identity (the one ZooKeeper knows; a user's credentials log in to replicas only)."""
    return Credentials.from_file(cluster.workdir / "security" / REPLICA_FILE)


def tls_args(cluster: coordinator.LocalCluster) -> dict:
    """TLS that verifies ZooKeeper's certificate, and no identity."""
    return {"use_ssl": True, "ca": str(replicas(cluster).ca_file), "check_hostname": True}


def replica_identity(cluster: coordinator.LocalCluster) -> dict:
    """kazoo's arguments for the replicas' identity over TLS."""
    return zk_client_args(replicas(cluster))


def host_port(cluster: coordinator.LocalCluster) -> tuple[str, int]:
    host, port = cluster.zk_address.split("/", 1)[0].rsplit(":", 1)
    return host, int(port)


def _frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def _ustring(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">i", len(data)) + data


def delete_container(host: str, port: int, path: str, context: ssl.SSLContext | None) -> None:
    """A session made by hand in ZooKeeper's wire format (kazoo has no call for opcode 20): the
    connect request, a made-up digest identity (``evil:evil``), then ``deleteContainer`` of
    ``path``, each answer read. ZooKeeper 3.9.4 checks no ACL for deleteContainer: whoever has a
    session deletes any empty node. A refused connection is swallowed: what counts is the node."""
    connect = struct.pack(">iqiq", 0, 0, 10000, 0) + struct.pack(">i", 16) + bytes(16) + b"\0"
    auth = struct.pack(">iii", -4, 100, 0) + _ustring("digest") + _ustring("evil:evil")
    delete = struct.pack(">ii", 1, 20) + _ustring(path)
    with contextlib.suppress(OSError):
        raw = socket.create_connection((host, port), timeout=5)
        sock = raw if context is None else context.wrap_socket(raw, server_hostname=host)
        with sock:
            for body in (connect, auth, delete):
                sock.sendall(_frame(body))
                (n,) = struct.unpack(">i", _read(sock, 4))
                _read(sock, n)


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("closed by ZooKeeper")
        data += chunk
    return data


def test_a_made_up_identity_gets_no_session_and_delete_container_changes_nothing(
    cluster: coordinator.LocalCluster, tmp_path: Path
) -> None:
    """Issue 33: over TLS with only the CA (no client certificate) and a made-up digest identity,
    ZooKeeper 3.9.4 opened a session (``enforce.auth`` takes any digest name), and its
    deleteContainer (opcode 20, no ACL check) deleted the fence, the users and log entries. Now
    the handshake needs a certificate of the cluster CA: no session for a made-up identity, over
    TLS with the CA only, with another CA's certificate, or in clear; the fence, the users and
    the log stay; the replicas keep working."""
    host, port = host_port(cluster)
    fence, users = f"{cluster.root}/fence", f"{cluster.root}/users"
    made_up = [("digest", "evil:evil")]
    stranger = make_cluster_credentials(tmp_path / "stranger")  # a certificate of another CA
    for args in (
        tls_args(cluster),
        {**tls_args(cluster), "certfile": str(stranger.cert_file), "keyfile": str(stranger.key_file)},
    ):
        assert_no_session(cluster.zk_address, auth_data=made_up, **args)
    ca_only = ssl.create_default_context(cafile=str(replicas(cluster).ca_file))
    for path in (fence, users):
        for context in (ca_only, None):
            delete_container(host, port, path, context)
    admin = kazoo(cluster.zk_address, **replica_identity(cluster))
    try:
        assert admin.exists(fence) is not None and admin.exists(users) is not None
        # The hand-made session is real: with the replica certificate it deletes an empty node.
        probe = admin.create(f"{cluster.root}/probe-container", b"", acl=replicas(cluster).zk_acl())
        delete_container(host, port, probe, zk_tls_context(replicas(cluster)))
        assert admin.exists(probe) is None
    finally:
        close(admin)
    client = cluster.client(0)
    client.create_table("after_attack", SCHEMA)
    with client.transaction() as tx:
        tx.insert("after_attack", pa.table({"id": [1], "k": ["a"]}))
    assert cluster.client(1).read("after_attack", snapshot=tx.csn).column("id").to_pylist() == [1]


def test_the_plain_client_port_is_gone(cluster: coordinator.LocalCluster) -> None:
    """No clear-text session: a plain kazoo client never connects, a plain four-letter word gets
    no answer (the digest secret never crosses the wire in clear)."""
    zk = KazooClient(
        hosts=cluster.zk_address, timeout=3, connection_retry={"max_tries": 1}, auth_data=replicas(cluster).zk_auth()
    )
    with pytest.raises(Exception):  # noqa: B017, PT011 - kazoo's timeout or a dropped connection
        zk.start(timeout=5)
    zk.stop()
    zk.close()
    host, port = host_port(cluster)
    try:
        reply = four_letter_word(host, port, "srvr", timeout=3)
    except OSError:
        reply = ""
    assert "Mode:" not in reply
    cfg = (cluster.workdir / "zookeeper" / "zoo.cfg").read_text()
    assert "secureClientPort=" in cfg and "\nclientPort=" not in cfg


def test_a_tls_session_with_the_identity_works_and_checks_the_host_name(cluster: coordinator.LocalCluster) -> None:
    zk = kazoo(cluster.zk_address, **replica_identity(cluster))
    try:
        assert {"log", "tables", "replicas"} <= set(zk.get_children(cluster.root))
        zk.create(f"{cluster.root}/probe", b"x", acl=replicas(cluster).zk_acl())
        zk.delete(f"{cluster.root}/probe")
    finally:
        close(zk)
    # The certificate names 127.0.0.1 and localhost: any other name is refused.
    ctx = ssl.create_default_context(cafile=str(replicas(cluster).ca_file))
    host, port = host_port(cluster)
    with pytest.raises(ssl.SSLCertVerificationError):
        ctx.wrap_socket(socket.create_connection((host, port), timeout=5), server_hostname="zk.example.org")


def test_four_letter_words_are_limited_to_srvr(cluster: coordinator.LocalCluster) -> None:
    host, port = host_port(cluster)
    ctx = zk_tls_context(replicas(cluster))
    assert "Mode: standalone" in four_letter_word(host, port, "srvr", 5, ctx)
    try:  # without the replica certificate: no handshake, no answer
        reply = four_letter_word(host, port, "srvr", 5, replicas(cluster).client_context())
    except OSError:
        reply = ""
    assert "Mode:" not in reply
    for word in ("dump", "cons", "wchc", "envi", "stat", "mntr", "conf", "crst"):
        reply = four_letter_word(host, port, word, 5, ctx)
        assert "not in the whitelist" in reply, (word, reply)
        assert cluster.root not in reply and "127.0.0.1" not in reply


def test_the_root_is_the_replicas_identitys_only(cluster: coordinator.LocalCluster) -> None:
    admin = kazoo(cluster.zk_address, **replica_identity(cluster))
    try:
        acls, _ = admin.get_acls("/")
        assert {acl.id.scheme for acl in acls} == {"digest", "x509"}
        assert all(acl.id.id.startswith(("mergetxn:", "CN=mergetxn replica")) for acl in acls)
    finally:
        close(admin)
    # The certificate alone is the replicas' identity (x509, by its subject): no digest needed.
    args = {k: v for k, v in replica_identity(cluster).items() if k != "auth_data"}
    zk = kazoo(cluster.zk_address, **args)
    try:
        zk.create(f"{cluster.root}/by-certificate", b"x", acl=replicas(cluster).zk_acl())
        zk.delete(f"{cluster.root}/by-certificate")
    finally:
        close(zk)


def test_status_works_on_a_secured_cluster(cluster: coordinator.LocalCluster) -> None:
    path = str(cluster.workdir / "security" / REPLICA_FILE)
    result = CliRunner().invoke(
        cli,
        ["status", "--replica", cluster.replica_addresses[0], "--credentials", path, "--json"],
        env={"MERGETXN_CREDENTIALS": ""},
    )
    assert result.exit_code == 0, result.output
    assert '"mode": "standalone"' in result.output
    assert replicas(cluster).secret not in result.output


@pytest.mark.slow
def test_a_secured_ensemble_with_mutual_tls_between_members_serves(tmp_path: Path) -> None:
    creds = make_cluster_credentials(tmp_path / "security")
    with ZooKeeperEnsemble(tmp_path / "zk", size=3, credentials=creds) as ensemble:
        modes = sorted(ensemble.mode(i) or "" for i in range(3))
        assert modes == ["follower", "follower", "leader"]
        for i in range(3):
            cfg = (ensemble.member_dir(i) / "zoo.cfg").read_text()
            assert "sslQuorum=true" in cfg and "ssl.quorum.clientAuth=need" in cfg and "\nclientPort=" not in cfg
        args = zk_client_args(creds)
        writer = kazoo(ensemble.member_address(0), **args)
        reader = kazoo(ensemble.member_address(2), **args)
        try:
            writer.create("/mergetxn-probe", b"through the quorum", acl=creds.zk_acl())
            reader.sync("/mergetxn-probe")
            assert reader.get("/mergetxn-probe")[0] == b"through the quorum"
        finally:
            close(writer)
            close(reader)
        assert_no_session(  # no certificate of the cluster CA: no session
            ensemble.member_address(1),
            use_ssl=True,
            ca=str(creds.ca_file),
            check_hostname=True,
            auth_data=[("digest", "evil:evil")],
        )
        # A member whose quorum certificate comes from other credentials is not let in.
        other = make_cluster_credentials(tmp_path / "other")
        from mergetxn.local.zkserver import ZooKeeperTls

        stranger = ZooKeeperTls.from_credentials(other, tmp_path / "stranger", quorum_host="127.0.0.1")
        ensemble.stop_member(2)
        log = ensemble.member_dir(2) / "zookeeper.log"
        start = log.stat().st_size
        shutil.copy(stranger.quorum_keystore, ensemble.members[2].tls.quorum_keystore)
        ensemble.members[2].start(wait=False)

        def refused() -> set[bytes]:  # peers member 3 failed to reach (TLS) since its restart
            with open(log, "rb") as f:
                f.seek(start)
                text = f.read()
            return {peer for peer in (b"1", b"2") if b"Cannot open channel to " + peer + b" " in text}

        wait_until(lambda: refused() == {b"1", b"2"}, 120, "member 3 to be refused by both peers")
        assert ensemble.mode(2) is None  # its peers never let it in: no quorum certificate of theirs
        assert ensemble.mode(0) and ensemble.mode(1)
        # With its own certificate back it joins again: the certificate was what kept it out.
        ensemble.stop_member(2)
        ZooKeeperTls.from_credentials(creds, ensemble.member_dir(2) / "tls", quorum_host="127.0.0.1")
        ensemble.start_member(2)
        assert ensemble.mode(2) == "follower"


# ---------------------------------------------------------------------------------------------
# The log is never skipped (runs last: it leaves the module's cluster with a hole in its log)


def test_sequence_numbers_are_dense_and_a_deleted_one_is_not_given_again(zk_client: KazooClient) -> None:
    """What the follower's rule rests on (replicas/follower.py, _next_position): a multi that
    fails gives out no sequence number (a commit that lost its version check leaves no gap), and
    the number of a deleted entry is never given out again (a deleted entry is a hole below the
    later ones, which the follower refuses)."""
    zk_client.create("/e", b"")
    assert zk_client.create("/e/c-", b"", sequence=True).endswith("c-0000000000")
    t = zk_client.transaction()
    t.check("/e", 5)  # a version miss, as a commit that lost a race
    t.create("/e/c-", b"", sequence=True)
    assert isinstance(t.commit()[0], BadVersionError)
    assert zk_client.create("/e/c-", b"", sequence=True).endswith("c-0000000001")
    zk_client.delete("/e/c-0000000001")
    assert zk_client.create("/e/c-", b"", sequence=True).endswith("c-0000000002")
    assert sorted(zk_client.get_children("/e")) == ["c-0000000000", "c-0000000002"]


def test_the_follower_refuses_every_hole_below_the_end_and_waits_at_the_end(zk_client: KazooClient) -> None:
    """Where the log continues after a missing entry (Follower._next_position), on a log built
    in a real ZooKeeper: a hole below a later entry, below a sealed epoch's count, or a missing
    epoch below a later one is CorruptMetadata naming it; the end of the log is waited at; an
    epoch the tail trimmed sends the follower to the checkpoint."""
    from coordinator.zk.log import encode_tail
    from replicas.follower import TRIMMED, Follower
    from replicas.state import ReplicaState

    log = CsnLog(zk_client, "/mergetxn", epoch_size=1000)
    log.ensure_layout()
    follower = Follower(log, ReplicaState(), None, lambda pointer: b"")  # type: ignore[arg-type]

    def append(epoch: int) -> str:
        return zk_client.create(f"{log.epoch_path(epoch)}/c-", b"{}", sequence=True)

    nodes = [append(0) for _ in range(5)]
    assert follower._next_position(0, 5, False) is None  # the end: wait there
    zk_client.delete(nodes[2])
    with pytest.raises(CorruptMetadata, match=nodes[2]):
        follower._next_position(0, 2, False)
    zk_client.delete(nodes[4])  # the last one: nothing later, but its number was given out
    with pytest.raises(CorruptMetadata, match=nodes[4]):
        follower._next_position(0, 4, False)
    assert follower._next_position(0, 5, False) is None  # still the end: wait there
    later = append(0)
    assert later.endswith("c-0000000005")  # a deleted number is not given out again
    with pytest.raises(CorruptMetadata, match=nodes[4]):
        follower._next_position(0, 4, False)
    log.seal(0)
    assert follower._next_position(0, int(later.rsplit("-", 1)[1]) + 1, False) == (1, 0)  # past a sealed end
    with pytest.raises(CorruptMetadata, match=nodes[2]):
        follower._next_position(0, 2, False)
    log.seal(1)
    zk_client.delete(log.epoch_path(1))  # an empty sealed epoch gone, epoch 2 after it
    with pytest.raises(CorruptMetadata, match=log.epoch_path(1)):
        follower._next_position(1, 0, False)
    zk_client.create(log.tail_path(), encode_tail({"csn": 0, "path": "", "trimmed_epoch": 1, "retained": 0}))
    assert follower._next_position(0, 2, False) == TRIMMED  # trimmed: the checkpoint has it
    assert follower._next_position(1, 0, False) == TRIMMED


def test_an_entry_made_after_the_followers_read_in_an_epoch_sealed_since_is_read_not_refused(
    zk_client: KazooClient,
) -> None:
    """The race of an epoch rollover: the follower reads entry (e, s) before its commit creates
    it, then the epoch is sealed (the next commit went to a new epoch); the entry exists when the
    follower looks again, so it is read, not taken for a deleted one (before the fix: CorruptMetadata
    "missing below the end of the log (... exists)" naming the very entry that exists; CI found it
    in test_epoch_rollover under load)."""
    from replicas.follower import Follower
    from replicas.state import ReplicaState

    log = CsnLog(zk_client, "/mergetxn", epoch_size=3)
    log.ensure_layout()
    follower = Follower(log, ReplicaState(), None, lambda pointer: b"")  # type: ignore[arg-type]
    for _ in range(3):
        zk_client.create(f"{log.epoch_path(0)}/c-", b"{}", sequence=True)
    log.seal(0)
    assert follower._next_position(0, 2, False) == (0, 2)
    assert follower._next_position(0, 3, False) == (1, 0)


@pytest.mark.slow
def test_a_deleted_log_entry_stops_a_fresh_replica_and_status_names_it(cluster: coordinator.LocalCluster) -> None:
    cluster.stop_replica(2)
    shutil.rmtree(cluster.workdir / "replica-2")  # a fresh replica: it will read the whole log from ZooKeeper
    c0 = cluster.client(0)
    c0.create_table("holes", SCHEMA, auto_merge=False)
    csns = []
    for i in range(3):
        with c0.transaction() as tx:
            tx.insert("holes", pa.table({"id": [i], "k": [str(i)]}))
        csns.append(tx.csn)
    final = csns[-1]
    epoch, seq = split_csn(csns[1])
    zk = kazoo(cluster.zk_address, **replica_identity(cluster))  # whoever holds the replicas' identity
    try:
        node = CsnLog(zk, cluster.root).entry_path(epoch, seq)
        zk.delete(node)
    finally:
        close(zk)

    cluster.start_replica(2)
    c2 = cluster.client(2)
    failure = wait_until(lambda: c2.call("info").get("log_failure"), 60, "replica 2 to stop at the hole")
    assert node in failure and "missing" in failure
    assert c2.snapshot() < csns[1]
    with pytest.raises(CorruptMetadata, match=node):
        c2.read("holes", snapshot=final)
    for i in (0, 1):  # the replicas that applied it before it went still have every commit
        assert sorted(cluster.client(i).read("holes", snapshot=final).column("id").to_pylist()) == [0, 1, 2]

    path = str(cluster.workdir / "security" / REPLICA_FILE)
    result = CliRunner().invoke(
        cli,
        ["status", "--replica", cluster.replica_addresses[0], "--credentials", path],
        env={"MERGETXN_CREDENTIALS": ""},
    )
    assert result.exit_code == EXIT_UNHEALTHY, result.output
    flat = " ".join(result.output.split())
    assert "r2" in flat and node.rsplit("/", 1)[1] in flat


def test_a_certificate_for_servers_only_is_refused_naming_security_init(tmp_path: Path) -> None:
    """Credentials made before ZooKeeper required a client certificate carry a server-only
    replica certificate, which ZooKeeper (Java) refuses as a client's: connecting with them is
    refused at once naming the fix, not left to time out."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    creds = make_cluster_credentials(tmp_path / "security")
    assert zk_client_args(creds)["certfile"] == str(creds.cert_file)
    key = serialization.load_pem_private_key(creds.key_file.read_bytes(), None)  # type: ignore[union-attr]
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mergetxn replica")])
    now = dt.datetime.now(dt.UTC)
    old = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    creds.cert_file.write_bytes(old.public_bytes(serialization.Encoding.PEM))  # type: ignore[union-attr]
    again = Credentials.from_file(tmp_path / "security" / REPLICA_FILE)
    with pytest.raises(InvalidInput, match="security init"):
        zk_client_args(again)
    with pytest.raises(InvalidInput, match="security init"):
        zk_tls_context(again)
