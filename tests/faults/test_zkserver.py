"""The embedded ZooKeeper: a real server from the pyspark jars, started, stopped, killed and
restarted without losing data; a 3-node ensemble that survives losing a member."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, SessionExpiredError
from kazoo.retry import KazooRetry

from mergetxn.local.zkserver import (
    ExternalZooKeeper,
    ZooKeeperEnsemble,
    ZooKeeperServer,
    _parse_java_major,
    find_pyspark_jars,
    four_letter_word,
    java_executable,
    server_mode,
    start_zookeeper,
)

pytestmark = pytest.mark.zk

REPO = Path(__file__).resolve().parents[2]


def connect(hosts: str, timeout: float = 10.0) -> KazooClient:
    client = KazooClient(
        hosts=hosts,
        timeout=timeout,
        connection_retry=KazooRetry(max_tries=-1, max_delay=0.5),
        command_retry=KazooRetry(max_tries=-1, max_delay=0.5, deadline=60),
    )
    client.start(timeout=30)
    return client


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); look at its state.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_environment_has_java_and_jars() -> None:
    assert list(find_pyspark_jars().glob("zookeeper-3.9*.jar"))
    assert Path(java_executable()).exists()


def test_parse_java_version() -> None:
    assert _parse_java_major('openjdk version "17.0.15" 2025-04-15') == 17
    assert _parse_java_major('java version "1.8.0_392"') == 8
    assert _parse_java_major('openjdk version "21" 2023-09-19') == 21
    assert _parse_java_major("garbage") is None


def test_java_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nojava"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="Java 17"):
        java_executable()


def test_start_write_stop_start_keeps_data(tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path / "zk")
    address = server.start()
    assert address == server.address == f"127.0.0.1:{server.port}"
    assert server.running
    assert server_mode("127.0.0.1", server.port) == "standalone"
    assert four_letter_word("127.0.0.1", server.port, "ruok") == "imok"

    client = connect(address)
    client.create("/kept", b"before restart", makepath=True)
    client.stop()
    client.close()

    server.stop()
    assert not server.running
    assert not port_open(server.port)
    server.stop()  # idempotent

    port = server.port
    assert server.start() == address
    assert server.port == port
    client = connect(address)
    try:
        assert client.get("/kept")[0] == b"before restart"
    finally:
        client.stop()
        client.close()
        server.stop()

    log = (tmp_path / "zk" / "zookeeper.log").read_text()
    assert "ZooKeeperServer" in log  # log4j writes to the file in workdir


def test_kill_then_restart_keeps_acknowledged_writes(tmp_path: Path) -> None:
    with ZooKeeperServer(tmp_path / "zk") as server:
        client = connect(server.address)
        for i in range(20):
            client.create(f"/k/n{i:02d}", str(i).encode(), makepath=True)
        pid = server.pid
        assert pid is not None

        server.kill()
        assert not server.running
        assert not pid_alive(pid)
        assert not port_open(server.port)

        server.start()
        # The same client reconnects to the same address; its session survived the restart
        # (sessions are persisted) unless it expired meanwhile.
        try:
            children = client.get_children("/k")
        except SessionExpiredError:
            client.stop()
            client = connect(server.address)
            children = client.get_children("/k")
        assert sorted(children) == [f"n{i:02d}" for i in range(20)]
        client.stop()
        client.close()
    assert not server.running


def test_restart_hard_and_port_choice(tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path / "zk", port=None)
    try:
        first = server.start()
        assert server.restart(hard=True) == first
        assert server.restart() == first
    finally:
        server.stop()


def test_session_timeouts_are_short_minimum_and_generous_maximum(
    zk_server: ZooKeeperServer,
) -> None:
    """minSessionTimeout = 2 ticks (fast expiry tests); clients asking 30 s get 30 s."""

    def negotiated(client: KazooClient) -> int:
        sid = client.client_id[0]
        cons = four_letter_word("127.0.0.1", zk_server.port, "cons")
        for line in cons.splitlines():
            if f"sid=0x{sid:x}," in line:
                m = re.search(r"\bto=(\d+)", line)
                assert m, line
                return int(m.group(1))
        raise AssertionError(f"session 0x{sid:x} not in cons output:\n{cons}")

    short = connect(zk_server.address, timeout=0.1)
    long = connect(zk_server.address, timeout=30)
    try:
        assert negotiated(short) == 2 * zk_server.tick_ms
        assert negotiated(long) == 30000
    finally:
        for c in (short, long):
            c.stop()
            c.close()


def test_zk_address_fixture_gives_an_existing_private_chroot(
    zk_server: ZooKeeperServer, zk_address: str, zk_client: KazooClient
) -> None:
    assert zk_address.startswith(zk_server.address + "/t")
    chroot = zk_address[len(zk_server.address) :]
    zk_client.create("/mine", b"x")
    root = connect(zk_server.address)
    try:
        assert root.get(f"{chroot}/mine")[0] == b"x"
    finally:
        root.stop()
        root.close()


def test_start_zookeeper_with_given_address_starts_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    handle = start_zookeeper(tmp_path, address="zk1:2181,zk2:2181/mergetxn")
    assert isinstance(handle, ExternalZooKeeper)
    assert handle.address == "zk1:2181,zk2:2181/mergetxn"
    handle.stop()

    monkeypatch.setenv("MERGETXN_ZK", "elsewhere:2181")
    handle = start_zookeeper(tmp_path)
    assert handle.address == "elsewhere:2181"
    handle.stop()
    assert not (tmp_path / "data").exists()


def test_start_zookeeper_embedded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MERGETXN_ZK", "embedded")
    handle = start_zookeeper(tmp_path)
    try:
        assert isinstance(handle, ZooKeeperServer)
        client = connect(handle.address)
        client.ensure_path("/ok")
        client.stop()
        client.close()
    finally:
        handle.stop()
    assert (tmp_path / "data").is_dir()


def test_refuses_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        server = ZooKeeperServer(tmp_path / "zk", port=s.getsockname()[1])
        with pytest.raises(RuntimeError, match="in use"):
            server.start()
    assert not server.running


def test_server_dies_with_its_python_parent(tmp_path: Path) -> None:
    """A SIGKILLed parent cannot run atexit; the watchdog must take the JVM down."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from mergetxn.local.zkserver import ZooKeeperServer
        s = ZooKeeperServer({str(tmp_path / "zk")!r})
        s.start()
        print(s.pid, s.port, flush=True)
        import time
        time.sleep(600)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pid_s, port_s = parent.stdout.readline().split()
        pid, port = int(pid_s), int(port_s)
        assert pid_alive(pid) and port_open(port)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 15
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(pid), "ZooKeeper outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def _write(client: KazooClient, path: str, value: bytes) -> None:
    """Create-or-set with retries across connection loss (a retried create may find the node
    its first attempt made)."""

    def once() -> None:
        try:
            client.create(path, value, makepath=True)
        except NodeExistsError:
            client.set(path, value)

    client.retry(once)


@pytest.mark.slow
def test_ensemble_survives_losing_a_member(tmp_path: Path) -> None:
    ensemble = ZooKeeperEnsemble(tmp_path / "ens", size=3)
    try:
        address = ensemble.start()
        assert address.count(",") == 2
        assert sorted(ensemble.mode(i) or "" for i in range(3)) == [
            "follower",
            "follower",
            "leader",
        ]
        client = connect(address)
        written: dict[str, bytes] = {}

        def work(tag: str, n: int) -> None:
            for i in range(n):
                path = f"/e/{tag}{i:03d}"
                _write(client, path, path.encode())
                written[path] = path.encode()
                assert client.retry(client.get, path)[0] == written[path]

        work("before", 20)

        # Kill the leader: the worst case (a new election).
        victim = ensemble.leader()
        assert victim is not None
        ensemble.kill_member(victim)
        assert not ensemble.running(victim)
        ensemble.wait_quorum(timeout=60)
        work("during", 50)
        others = [i for i in range(3) if i != victim]
        assert {ensemble.mode(i) for i in others} == {"leader", "follower"}

        ensemble.start_member(victim)
        assert ensemble.mode(victim) in ("leader", "follower")
        work("after", 20)

        # Every member, the restarted one included, has every write.
        for i in range(3):
            member = connect(ensemble.member_address(i))
            try:
                member.sync("/e")
                for path, value in written.items():
                    assert member.get(path)[0] == value
            finally:
                member.stop()
                member.close()
        client.stop()
        client.close()
    finally:
        ensemble.stop()
    assert not any(ensemble.running(i) for i in range(3))


@pytest.mark.slow
def test_ensemble_without_quorum_stops_serving_and_recovers(tmp_path: Path) -> None:
    with ZooKeeperEnsemble(tmp_path / "ens", size=3) as ensemble:
        client = connect(ensemble.address)
        _write(client, "/q", b"1")
        client.stop()
        client.close()
        ensemble.kill_member(0)
        ensemble.kill_member(1)
        deadline = time.monotonic() + 30
        while ensemble.mode(2) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ensemble.mode(2) is None  # a lone member never serves
        ensemble.start_member(0)
        ensemble.start_member(1)
        ensemble.wait_quorum()
        client = connect(ensemble.address)
        try:
            assert client.retry(client.get, "/q")[0] == b"1"
        finally:
            client.stop()
            client.close()


def test_zk_start_with_credentials_serves_tls_only_to_certificate_holders(tmp_path: Path) -> None:
    """``mergetxn zk start --credentials FILE``: the secured server (TLS only, sessions only for
    holders of a certificate of the cluster CA, ``/`` under the identity's ACL), as
    LocalCluster(secure=True) starts it."""
    from support.zk import assert_no_session

    from coordinator.wire.security import REPLICA_FILE, make_cluster_credentials, zk_client_args, zk_tls_context

    creds = make_cluster_credentials(tmp_path / "security")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mergetxn.cli",
            "zk",
            "start",
            "--dir",
            str(tmp_path / "zk"),
            "--credentials",
            str(tmp_path / "security" / REPLICA_FILE),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")},
    )
    try:
        address = None
        for line in proc.stdout:
            if line.startswith("READY "):
                address = line.split()[1]
                break
        assert address, f"no READY line (rc={proc.poll()})"
        host, port = address.rsplit(":", 1)
        assert "Mode: standalone" in four_letter_word(host, int(port), "srvr", 5, zk_tls_context(creds))
        for context in (None, creds.client_context()):  # in clear, or TLS without the replica certificate
            try:
                reply = four_letter_word(host, int(port), "srvr", 5, context)
            except OSError:
                reply = ""
            assert "Mode:" not in reply
        ok = KazooClient(hosts=address, timeout=10, **zk_client_args(creds))
        ok.start(timeout=30)
        try:
            ok.create("/probe", b"x", acl=creds.zk_acl())
            assert {acl.id.scheme for acl in ok.get_acls("/")[0]} == {"digest", "x509"}
        finally:
            ok.stop()
            ok.close()
        for auth in (None, [("digest", "intruder:whatever-it-is")]):  # no certificate: no session
            assert_no_session(address, auth_data=auth, use_ssl=True, ca=str(creds.ca_file), check_hostname=True)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
