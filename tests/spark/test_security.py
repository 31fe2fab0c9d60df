"""Security (docs/surface.md#security): a secured cluster's replicas serve only TLS clients that
authenticate with the cluster's credentials, its ZooKeeper nodes are readable and writable by
that identity only, and its secret appears in no log, error, ``info`` or command line.

The first tests drive the RPC layer alone (an RpcServer with TLS and an authenticator, no
replica); the rest a LocalCluster(secure=True): its own ZooKeeper and replica processes, with
replica logs at DEBUG so that whatever kazoo logs about its auth packet is there to look for.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from kazoo.client import KazooClient
from support.cluster import make_cluster  # tests/ is on sys.path
from support.waiting import poll
from support.zk import assert_no_session

import coordinator
from coordinator import errors
from coordinator.wire.rpc import AUTH_FRAME, RpcClient, RpcServer, frame, read_frame
from coordinator.wire.security import (
    CLIENT_FILE,
    REPLICA_FILE,
    Credentials,
    make_cluster_credentials,
    zk_client_args,
)
from mergetxn.cli import cli

SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.string())])


# ---------------------------------------------------------------------------------------------
# Credentials files


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Credentials:
    return make_cluster_credentials(tmp_path_factory.mktemp("creds"), hosts=["127.0.0.1", "localhost"])


def test_credentials_files_are_private_and_never_show_the_secret(made: Credentials) -> None:
    d = made.ca_file.parent
    for name in (REPLICA_FILE, CLIENT_FILE, "replica.key"):
        assert (d / name).stat().st_mode & 0o777 == 0o600, name
    # Two identities (docs/surface.md#users-roles-and-grants): the clients' file is the first admin
    # user's, with a secret of its own; the replicas' file holds only the admin's salted hash.
    client = Credentials.from_file(d / CLIENT_FILE)
    assert (client.user, client.ca_file) == ("admin", made.ca_file)
    assert client.secret != made.secret and client.secret not in (d / REPLICA_FILE).read_text()
    assert made.admin is not None and made.admin[0] == "admin" and made.admin[1].startswith("scrypt$")
    assert client.cert_file is None and client.key_file is None and not client.is_replica
    for shown in (repr(made), str(made), repr(client), f"{made}", repr([made])):
        assert made.secret not in shown and client.secret not in shown and "***" in shown
        assert made.admin[1] not in shown


def test_a_credentials_file_others_may_read_is_refused_naming_the_fix(made: Credentials, tmp_path: Path) -> None:
    path = made.client().to_file(tmp_path / "c.json")
    os.chmod(path, 0o644)
    with pytest.raises(errors.InvalidInput, match=r"chmod 600") as info:
        Credentials.from_file(path)
    assert str(path) in info.value.message and made.secret not in info.value.message
    os.chmod(path, 0o600)
    assert Credentials.from_file(path).secret == made.secret


def test_credentials_from_toml_and_from_the_environment(
    made: Credentials, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text(f'user = "{made.user}"\nsecret = "{made.secret}"\nca_file = "{made.ca_file}"\n')
    toml.chmod(0o600)
    assert Credentials.from_file(toml).client() == made.client()
    monkeypatch.delenv("MERGETXN_CREDENTIALS", raising=False)
    assert Credentials.from_env() is None
    monkeypatch.setenv("MERGETXN_CREDENTIALS", str(toml))
    assert Credentials.from_env().secret == made.secret


def test_a_bad_credentials_file_is_named_without_its_secret(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"user": "u", "secret": "short-secret-x"}))
    path.chmod(0o600)
    with pytest.raises(errors.InvalidInput, match="at least 16 characters") as info:
        Credentials.from_file(path)
    assert str(path) in info.value.message and "short-secret-x" not in info.value.message


# ---------------------------------------------------------------------------------------------
# The RPC layer: TLS and authentication


class Echo:
    def dispatch(self, action: str, args: dict) -> dict:
        if action == "big":
            return {"ok": True, "result": "x" * args["size"]}
        return {"ok": True, "result": [action, args.get("n")]}


@pytest.fixture
def secured(made: Credentials) -> Iterator[RpcServer]:
    server = RpcServer("127.0.0.1", 0, Echo().dispatch, tls=made.server_context(), authenticate=made.authenticator())
    thread = threading.Thread(target=server.serve, name="rpc-io", daemon=True)
    thread.start()
    yield server
    server.shutdown()
    thread.join(10)


def address(server: RpcServer) -> str:
    return f"127.0.0.1:{server.port}"


def tls_socket(server: RpcServer, made: Credentials) -> tuple[ssl.SSLSocket, object]:
    sock = made.client_context().wrap_socket(
        socket.create_connection(("127.0.0.1", server.port), timeout=10), server_hostname="127.0.0.1"
    )
    return sock, sock.makefile("rb")


def test_the_right_credentials_get_answers_large_ones_whole(secured: RpcServer, made: Credentials) -> None:
    client = RpcClient(address(secured), 10, made.client())
    try:
        assert client.call("echo", {"n": 1}) == ["echo", 1]
        assert len(client.call("big", {"size": 8 * 1024 * 1024})) == 8 * 1024 * 1024  # many TLS records
        assert client.call("echo", {"n": 2}) == ["echo", 2]  # the same connection, still in step
        other = threading.Thread(target=client.call, args=("echo", {"n": 3}))  # a connection of its own
        other.start()
        other.join(10)
        assert poll(lambda: secured.connections == 2, timeout=10)
    finally:
        client.close()
    assert poll(lambda: not secured.connections, timeout=10)  # close() closed every thread's TLS connection


def test_concurrent_authenticated_clients_each_get_their_own_answers(secured: RpcServer, made: Credentials) -> None:
    n, calls = 8, 40
    start = threading.Barrier(n)
    wrong: list[object] = []

    def work(i: int) -> None:
        client = RpcClient(address(secured), 10, made.client())
        try:
            start.wait(10)
            for j in range(calls):
                got = client.call("echo", {"n": i * 1000 + j})
                if got != ["echo", i * 1000 + j]:
                    wrong.append(got)
        except Exception as exc:  # noqa: BLE001 - reported below
            wrong.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not wrong


def test_a_plaintext_client_gets_authentication_failed(secured: RpcServer) -> None:
    client = RpcClient(address(secured), 10)
    with pytest.raises(errors.AuthenticationFailed, match="requires TLS and credentials"):
        client.call("echo", {"n": 1})
    client.close()


@pytest.mark.parametrize("who", ["secret", "user"])
def test_a_wrong_secret_or_user_gets_authentication_failed(secured: RpcServer, made: Credentials, who: str) -> None:
    wrong = Credentials(
        made.user if who == "secret" else "intruder", "W" * 40 if who == "secret" else made.secret, made.ca_file
    )
    client = RpcClient(address(secured), 10, wrong)
    with pytest.raises(errors.AuthenticationFailed, match="wrong user or secret") as info:
        client.call("echo", {"n": 1})
    assert made.secret not in str(info.value) and "W" * 40 not in str(info.value)
    client.close()


def test_a_replica_certificate_from_another_ca_is_refused(
    secured: RpcServer, made: Credentials, tmp_path: Path
) -> None:
    other = make_cluster_credentials(tmp_path / "other")
    client = RpcClient(address(secured), 10, Credentials(made.user, made.secret, other.ca_file))
    with pytest.raises(errors.AuthenticationFailed, match="certificate"):
        client.call("echo", {"n": 1})
    client.close()


def test_a_client_with_credentials_refuses_a_plaintext_replica(made: Credentials) -> None:
    server = RpcServer("127.0.0.1", 0, Echo().dispatch)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        client = RpcClient(address(server), 10, made.client())
        with pytest.raises(errors.AuthenticationFailed, match="TLS"):
            client.call("echo", {"n": 1})
        client.close()
        assert RpcClient(address(server), 10).call("echo", {"n": 3}) == ["echo", 3]  # unsecured: as before
    finally:
        server.shutdown()


def test_a_request_before_auth_is_refused_and_the_connection_closed(secured: RpcServer, made: Credentials) -> None:
    sock, rfile = tls_socket(secured, made)
    with sock:
        sock.sendall(frame({"a": "echo", "b": {"n": 1}}))
        reply = read_frame(rfile)
        assert reply["error"]["type"] == "AuthenticationFailed"
        assert "authentication before any request" in reply["error"]["message"]
        assert rfile.read(1) == b""  # closed


def test_a_large_unauthenticated_frame_is_refused_and_the_server_keeps_serving(
    secured: RpcServer, made: Credentials
) -> None:
    sock, rfile = tls_socket(secured, made)
    with sock:
        sock.sendall(struct.pack(">I", 100 * 1024 * 1024) + b"x" * 1024)  # far past AUTH_FRAME
        reply = read_frame(rfile)
        assert reply["error"]["type"] == "AuthenticationFailed"
        assert str(100 * 1024 * 1024) in reply["error"]["message"] and AUTH_FRAME < 100 * 1024 * 1024
        assert rfile.read(1) == b""
    client = RpcClient(address(secured), 10, made.client())
    assert client.call("echo", {"n": 7}) == ["echo", 7]
    client.close()


def test_a_connection_that_never_authenticates_is_closed(secured: RpcServer, made: Credentials) -> None:
    secured.handshake_seconds = 0.5
    silent = socket.create_connection(("127.0.0.1", secured.port), timeout=10)  # sends nothing at all
    sock, rfile = tls_socket(secured, made)  # a TLS handshake, then nothing
    with silent, sock:
        assert silent.recv(1) == b""
        assert rfile.read(1) == b""
    client = RpcClient(address(secured), 10, made.client())  # authenticated ones stay
    assert client.call("echo", {"n": 1}) == ["echo", 1]
    assert poll(lambda: secured.connections == 1, timeout=10)
    client.close()


# ---------------------------------------------------------------------------------------------
# A secured LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    """Two replicas and their own ZooKeeper, secured; replica logs at DEBUG."""
    with make_cluster(
        tmp_path_factory,
        None,
        "secure",
        replicas=2,
        secure=True,
        env={"MERGETXN_LOG": "DEBUG,kazoo=DEBUG,botocore=DEBUG"},
    ) as c:  # every logger, kazoo (its auth packet) included
        yield c


@pytest.fixture(scope="module")
def c0(cluster: coordinator.LocalCluster) -> Iterator[coordinator.Client]:
    client = cluster.client(0)
    yield client
    client.close()


@pytest.fixture(scope="module")
def events(c0: coordinator.Client) -> str:
    """A table with two rows, created once for the module's tests."""
    c0.create_table("events", SCHEMA, auto_merge=False)
    with c0.transaction() as tx:
        tx.insert("events", pa.table({"id": [1, 2], "k": ["a", "b"]}))
    return "events"


def replicas_identity(cluster: coordinator.LocalCluster) -> Credentials:
    """The replicas' credentials (the ZooKeeper identity): no user holds them."""
    return Credentials.from_file(cluster.workdir / "security" / REPLICA_FILE)


def kazoo_client(cluster: coordinator.LocalCluster) -> KazooClient:
    """A session of the replicas' identity: the cluster's ZooKeeper serves TLS only, and only to
    holders of a certificate of the cluster CA (tests/integration/test_zk_hardening.py)."""
    zk = KazooClient(hosts=cluster.zk_address, timeout=10, **zk_client_args(replicas_identity(cluster)))
    zk.start(timeout=30)
    return zk


def test_without_credentials_a_client_gets_authentication_failed_and_nothing_changes(
    cluster: coordinator.LocalCluster, c0: coordinator.Client
) -> None:
    address = cluster.replica_addresses[0]
    with pytest.raises(errors.AuthenticationFailed, match="credentials"):
        coordinator.connect(address)
    raw = RpcClient(address, 10)  # straight to the action, past the client library's info call
    with pytest.raises(errors.AuthenticationFailed):
        raw.call("create_table", {"name": "sneaky", "schema": []})
    raw.close()
    assert "sneaky" not in c0.tables()
    zk = kazoo_client(cluster)
    try:
        assert not zk.exists(f"{cluster.root}/tables/sneaky")
    finally:
        zk.stop()
        zk.close()


def test_a_wrong_secret_gets_authentication_failed(cluster: coordinator.LocalCluster) -> None:
    good = cluster.credentials
    wrong = Credentials(good.user, "not-the-secret-" * 3, good.ca_file)
    with pytest.raises(errors.AuthenticationFailed, match="wrong user or secret") as info:
        coordinator.connect(cluster.replica_addresses[1], credentials=wrong)
    assert good.secret not in str(info.value) and wrong.secret not in str(info.value)


def test_the_right_credentials_work_end_to_end(cluster: coordinator.LocalCluster, c0: coordinator.Client) -> None:
    c0.create_table("e2e", SCHEMA, auto_merge=False)
    with c0.transaction() as tx:
        tx.insert("e2e", pa.table({"id": [1, 2], "k": ["a", "b"]}))
    csn = tx.csn
    c1 = coordinator.connect(cluster.replica_addresses[1], credentials=cluster.credentials)
    try:
        assert sorted(c1.read("e2e", snapshot=csn).column("id").to_pylist()) == [1, 2]
        assert c1.commit_status(tx.id).status == "committed"
        running = c0.begin()
        # Asked on replica 1, the owner (replica 0) decides: a question forwarded replica to
        # replica, over TLS with the cluster's credentials.
        assert c1.commit_status(running.id).status == "running"
        running.rollback()
        with c0.transaction() as tx2:
            tx2.truncate("e2e")
        report = c0.gc()
        assert report is not None
        assert c0.read("e2e").num_rows == 0
    finally:
        c1.close()


def test_a_restarted_replica_is_secured_with_the_same_credentials(
    cluster: coordinator.LocalCluster, c0: coordinator.Client
) -> None:
    cluster.kill_replica(1)
    cluster.start_replica(1)
    with pytest.raises(errors.AuthenticationFailed):
        coordinator.connect(cluster.replica_addresses[1])
    with cluster.client(1) as c1:
        c1.call("wait", snapshot=c0.snapshot())
        assert c1.tables() == c0.tables()


def test_a_path_or_the_environment_gives_the_credentials(
    cluster: coordinator.LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = cluster.workdir / "security" / CLIENT_FILE
    with coordinator.connect(cluster.replica_addresses[0], credentials=str(path)) as c:
        assert c.snapshot() >= 0
    monkeypatch.setenv("MERGETXN_CREDENTIALS", str(path))
    with coordinator.connect(cluster.replica_addresses[0]) as c:
        assert c.snapshot() >= 0


def test_zookeeper_nodes_need_the_cluster_identity(cluster: coordinator.LocalCluster, c0: coordinator.Client) -> None:
    c0.create_table("acl_probe", SCHEMA, auto_merge=False)
    root = cluster.root
    admin = cluster.credentials  # a user, the admin included, holds no ZooKeeper identity
    for auth in (None, [("digest", "intruder:whatever-it-is")], [("digest", f"{admin.user}:{admin.secret}")]):
        # What a user holds (the CA, a name and secret): no certificate, no session.
        assert_no_session(cluster.zk_address, auth_data=auth, use_ssl=True, ca=str(admin.ca_file), check_hostname=True)
    zk = kazoo_client(cluster)
    try:
        data, stat = zk.get(
            f"{root}/tables/acl_probe"
        )  # the identity reads it (a marker: the definition is in the log)
        assert stat.version >= 0 and isinstance(json.loads(data), dict)
        # ACLs are not inherited in ZooKeeper: every node under the root must carry its own.
        # Walk them all (log entries, alive nodes, locks, fence, ...).
        nodes, todo = [], [root]
        while todo:
            node = todo.pop()
            nodes.append(node)
            todo += [f"{node}/{child}" for child in zk.get_children(node)]
        assert len(nodes) > 10
        open_nodes = [n for n in nodes if any(acl.id.scheme not in ("digest", "x509") for acl in zk.get_acls(n)[0])]
        assert not open_nodes
    finally:
        zk.stop()
        zk.close()


def test_a_large_unauthenticated_frame_is_refused_and_the_replica_keeps_serving(
    cluster: coordinator.LocalCluster, c0: coordinator.Client
) -> None:
    creds = cluster.credentials
    host, port = cluster.replica_addresses[0].rsplit(":", 1)
    sock = creds.client_context().wrap_socket(
        socket.create_connection((host, int(port)), timeout=10), server_hostname=host
    )
    with sock:
        sock.sendall(struct.pack(">I", 200 * 1024 * 1024) + b"{" * 4096)
        reply = read_frame(sock.makefile("rb"))
    assert reply["error"]["type"] == "AuthenticationFailed"
    assert c0.snapshot() >= 0


def test_secrets_appear_in_no_log_command_line_info_or_error(
    cluster: coordinator.LocalCluster, c0: coordinator.Client, events: str
) -> None:
    secrets = (cluster.credentials.secret, replicas_identity(cluster).secret)  # the admin's, the replicas'
    with c0.transaction() as tx:  # something for the DEBUG logs to say
        tx.insert("events", pa.table({"id": [9], "k": ["z"]}))
    info = c0.call("info")
    assert info["secure"] is True
    for secret in secrets:
        assert secret not in json.dumps(info)
        assert secret not in repr(cluster.credentials) and secret not in str(cluster.credentials)
    pids = [cluster.replica_pid(i) for i in range(cluster.n)] + [cluster.zk.pid]
    assert all(pids)
    for pid in pids:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        assert not any(secret in cmdline for secret in secrets)
    logs = [cluster.workdir / f"replica-{i}" / "replica.log" for i in range(cluster.n)]
    logs += [p for p in (cluster.workdir / "zookeeper").rglob("*") if p.is_file() and p.suffix in (".log", ".out")]
    assert any("kazoo" in p.read_text(errors="replace") for p in logs[: cluster.n])  # DEBUG did log
    for p in logs:
        text = p.read_text(errors="replace")
        assert not any(secret in text for secret in secrets), p
    # an error that carries a transaction's details
    with pytest.raises(errors.MergetxnError) as err:
        c0.call("rollback", id="not-a-tid")
    assert not any(secret in str(err.value) or secret in repr(err.value) for secret in secrets)


# ---------------------------------------------------------------------------------------------
# The command line


def test_cli_takes_credentials_by_option_or_environment(cluster: coordinator.LocalCluster, events: str) -> None:
    runner = CliRunner()
    path = str(cluster.workdir / "security" / CLIENT_FILE)
    address = cluster.replica_addresses[0]
    env = {"MERGETXN_CREDENTIALS": ""}
    refused = runner.invoke(cli, ["table", "list", "--replica", address], env=env)
    assert refused.exit_code == 6 and "credentials" in refused.output  # 6: authentication
    by_option = runner.invoke(cli, ["table", "list", "--replica", address, "--credentials", path], env=env)
    assert by_option.exit_code == 0, by_option.output
    assert "events" in by_option.output
    by_env = runner.invoke(cli, ["snapshot", "--replica", address], env={"MERGETXN_CREDENTIALS": path})
    assert by_env.exit_code == 0, by_env.output
    assert cluster.credentials.secret not in refused.output + by_option.output + by_env.output
    assert replicas_identity(cluster).secret not in refused.output + by_option.output + by_env.output


def test_cli_replica_start_with_credentials_joins_the_secured_cluster(
    cluster: coordinator.LocalCluster, c0: coordinator.Client, events: str, tmp_path: Path
) -> None:
    import shutil
    import subprocess
    import sys

    from test_cli import cli_env, wait_for_line

    creds_file = cluster.workdir / "security" / REPLICA_FILE
    loose = tmp_path / "loose"  # the same files, but the credentials file readable by the group
    shutil.copytree(creds_file.parent, loose)
    (loose / REPLICA_FILE).chmod(0o640)
    argv = [
        sys.executable,
        "-m",
        "mergetxn.cli",
        "replica",
        "start",
        "--zk",
        cluster.zk_address,
        "--storage",
        cluster.storage_url,
        "--host-id",
        "clisecure",
        "--data-dir",
        str(tmp_path / "wal"),
    ]
    refused = subprocess.run(
        [*argv, "--credentials", str(loose / REPLICA_FILE)], capture_output=True, text=True, env=cli_env(), timeout=120
    )
    assert refused.returncode == 2 and "chmod 600" in refused.stderr
    env = {**cli_env(), "MERGETXN_CREDENTIALS": str(creds_file)}  # the environment names the file
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        address = wait_for_line(proc, "READY").split()[1]
        assert replicas_identity(cluster).secret not in Path(f"/proc/{proc.pid}/cmdline").read_text(errors="replace")
        with pytest.raises(errors.AuthenticationFailed):
            coordinator.connect(address)
        with coordinator.connect(address, credentials=cluster.credentials) as c:
            assert c.call("info")["secure"] is True
            c.call("wait", snapshot=c0.snapshot())
            assert "events" in c.tables()
    finally:
        proc.terminate()
        proc.wait(30)


def test_cli_security_init_writes_private_credentials(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["security", "init", str(tmp_path / "sec"), "--host", "10.0.0.5", "--host", "replica1"]
    )
    assert result.exit_code == 0, result.output
    creds = Credentials.from_file(tmp_path / "sec" / REPLICA_FILE)
    admin = Credentials.from_file(tmp_path / "sec" / CLIENT_FILE)  # the first admin user's
    assert creds.secret not in result.output and admin.secret not in result.output
    assert admin.user == "admin" and creds.admin[0] == "admin" and str(tmp_path / "sec" / CLIENT_FILE) in result.output
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(creds.cert_file.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(a) for a in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.5"]
    assert sans.get_values_for_type(x509.DNSName) == ["replica1"]
    again = CliRunner().invoke(cli, ["security", "init", str(tmp_path / "sec")])
    assert again.exit_code == 2  # never overwrites credentials in use


# ---------------------------------------------------------------------------------------------
# Spark


@pytest.mark.slow
def test_spark_data_source_with_the_credentials_option(
    cluster: coordinator.LocalCluster, c0: coordinator.Client
) -> None:
    import sys

    from pyspark import cloudpickle
    from test_spark import new_session

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    address = cluster.replica_addresses[0]
    c0.create_table(
        "sp_secure", pa.schema([("id", pa.int64()), ("k", pa.string()), ("v", pa.float64())]), auto_merge=False
    )
    path = str(cluster.add_user("spark_etl", "writer", ["sp_secure"]).to_file(cluster.workdir / "spark_etl.json"))
    session = new_session("mergetxn-security")
    try:
        df = session.createDataFrame([(1, "a", 0.5), (2, "b", 1.0)], "id long, k string, v double")
        (
            df.write.format("mergetxn")
            .option("replica", address)
            .option("credentials", path)
            .mode("append")
            .save("sp_secure")
        )
        got = (
            session.read.format("mergetxn")
            .option("replica", address)
            .option("credentials", path)
            .load("sp_secure")
            .collect()
        )
        assert sorted(r["id"] for r in got) == [1, 2]
        with pytest.raises(Exception, match="AuthenticationFailed|requires TLS"):
            session.read.format("mergetxn").option("replica", address).load("sp_secure").collect()
    finally:
        session.stop()
