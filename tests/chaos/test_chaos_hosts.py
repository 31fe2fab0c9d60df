"""The simulated hosts of ``mergetxn chaos`` (mergetxn/chaos/hosts.py) and its TCP proxy.

The namespace form needs root (it skips otherwise): one cluster of three hosts serves the tests
of :class:`TestNamespaceCluster` in order, each fault proven by traffic that fails while it lasts
and flows again after ``heal()``, and each test leaving the cluster healthy for the next. A
harness killed with SIGKILL is cleaned up by :func:`cleanup`. The loopback form runs anywhere.
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError
from support.waiting import NotYet, eventually, wait_until
from support.zk import kazoo

from coordinator import connect
from coordinator.errors import MergetxnError, TransactionAborted
from mergetxn.chaos.hosts import (
    FAULT_KINDS,
    FaultNotSupported,
    HostsError,
    LoopbackCluster,
    NamespaceCluster,
    cleanup,
    leftovers,
    make_cluster,
    namespaces_unavailable,
)
from mergetxn.chaos.proxy import TcpProxy
from mergetxn.client import Client

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
# Quiet replicas: no background merges or cleanup passes competing for the two cores.
QUIET = {"merge_interval": 0, "gc_interval": 0}

needs_namespaces = pytest.mark.skipif(
    os.geteuid() != 0, reason="network namespaces need root (the loopback form is tested below)"
)


@pytest.fixture
def namespaces() -> None:
    """Skip when namespaces cannot be made now (another harness on this machine holds them:
    they are one per machine)."""
    reason = namespaces_unavailable()
    if reason is not None:
        pytest.skip(reason)


def ours() -> list[str]:
    """What a harness of this process left: namespaces, links, its mounts and processes (not
    those of another session's harness running beside the tests)."""
    return leftovers(owner=os.getpid())


def rows(*keys: int) -> pa.Table:
    return pa.table({"k": list(keys), "v": [f"v{k}" for k in keys]}, schema=SCHEMA)


def commit(address: str, table: str, *keys: int, timeout: float = 60.0) -> int:
    """Insert ``keys`` on the replica at ``address`` in one transaction, retried while the
    replica recovers from a fault; its CSN."""

    def attempt() -> int:
        client = Client(address, timeout=20)
        try:
            with client.transaction() as tx:
                tx.insert(table, rows(*keys))
            return tx.csn
        except (MergetxnError, OSError) as exc:
            raise NotYet(f"commit on {address}: {exc!r}") from exc
        finally:
            client.close()

    return eventually(attempt, timeout)


def connect_seconds(address: str, timeout: float = 5.0) -> float:
    """The time a TCP connection takes to open (one round trip)."""
    host, _, port = address.rpartition(":")
    began = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=timeout):
        return time.monotonic() - began


def zk_writes(hosts: str, path: str, timeout: float = 5.0) -> bool:
    """Whether a kazoo client on ``hosts`` connects and writes within ``timeout``."""
    client = KazooClient(hosts=hosts, timeout=timeout, connection_retry={"max_tries": 0})
    try:
        client.start(timeout=timeout)
        client.ensure_path(path)
        client.set(path, b"x")
        return True
    except (KazooTimeoutError, KazooException):
        return False
    finally:
        client.stop()
        client.close()


# -------------------------------------------------------------------------------------------------
# The proxy alone (no JVM)


@pytest.fixture
def echo_server() -> Iterator[str]:
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    listener.close()


def round_trip(sock: socket.socket, payload: bytes = b"ping") -> float:
    began = time.monotonic()
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = sock.recv(65536)
        assert chunk, "connection closed"
        got += chunk
    assert got == payload
    return time.monotonic() - began


def test_proxy_relays_delays_blocks_and_drops(echo_server: str) -> None:
    with TcpProxy(echo_server) as proxy:
        host, port = proxy.host, proxy.port
        with socket.create_connection((host, port), timeout=5) as s:
            assert round_trip(s) < 0.1
            proxy.delay = 0.1
            assert 0.2 <= round_trip(s) < 1.0  # 0.1 s each way
            proxy.delay = 0.0

            proxy.block(hang=True)  # a partition: nothing flows, nothing is refused
            s.sendall(b"held")
            s.settimeout(0.5)
            with pytest.raises(TimeoutError):
                s.recv(10)
            proxy.unblock()  # what was sent meanwhile arrives, as TCP retransmits it
            s.settimeout(5)
            assert s.recv(10) == b"held"

            proxy.block()  # refused: live connections cut
            assert s.recv(10) == b""
        with socket.create_connection((host, port), timeout=5) as s:
            assert s.recv(10) == b""  # accepted and closed at once
        proxy.unblock()
        with socket.create_connection((host, port), timeout=5) as s:
            assert round_trip(s) < 0.5
            proxy.drop = 1.0
            s.sendall(b"x")
            with pytest.raises(ConnectionResetError):
                while s.recv(10):
                    pass
        proxy.heal()
        with socket.create_connection((host, port), timeout=5) as s:
            assert round_trip(s) < 0.5
            assert proxy.connections == 1


# -------------------------------------------------------------------------------------------------
# A killed harness


CHILD = """
import sys, time
from mergetxn.chaos.hosts import NamespaceCluster
cluster = NamespaceCluster(sys.argv[1], hosts=int(sys.argv[2]), replica_settings={"merge_interval": 0, "gc_interval": 0})
if sys.argv[3] == "with":
    with cluster:
        print("STARTED", flush=True)
        time.sleep(600)
else:
    cluster.start()
    print("STARTED", flush=True)
    time.sleep(600)
"""


def start_child_harness(workdir: Path, hosts: int, form: str) -> subprocess.Popen[str]:
    """A harness in a process of its own, once its cluster is up."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(workdir), str(hosts), form],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    timer = threading.Timer(120, child.kill)
    timer.start()
    output = []
    try:
        for line in child.stdout:
            output.append(line)
            if "STARTED" in line:
                return child
    finally:
        timer.cancel()
    child.kill()
    child.wait()
    raise AssertionError("the harness did not start its cluster:\n" + "".join(output))


@pytest.mark.slow
@needs_namespaces
def test_cleanup_after_the_harness_was_killed(tmp_path: Path, namespaces: None) -> None:
    workdir = tmp_path / "killed"
    child = start_child_harness(workdir, 2, "plain")
    try:
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    left = leftovers(owner=child.pid)
    kinds = {item.split()[0] for item in left}
    assert {"namespace", "link", "tmpfs", "process"} <= kinds, left

    removed = cleanup(workdir=workdir)
    assert removed
    assert leftovers(owner=child.pid) == []


@pytest.mark.slow
@needs_namespaces
@pytest.mark.parametrize("sig, form", [(signal.SIGINT, "with"), (signal.SIGTERM, "plain")], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_harness_removes_everything(tmp_path: Path, sig: int, form: str, namespaces: None) -> None:
    """Ctrl-C unwinds through ``with``; SIGTERM (no ``with``) reaches the safety net."""
    child = start_child_harness(tmp_path / "interrupted", 1, form)
    try:
        child.send_signal(sig)
        rest = child.communicate(timeout=60)[0]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode != 0, rest
    assert leftovers(owner=child.pid) == [], rest


@pytest.mark.slow
@needs_namespaces
def test_a_failed_start_removes_what_it_made(tmp_path: Path, namespaces: None) -> None:
    cluster = NamespaceCluster(tmp_path / "failed", hosts=1, storage_url="nosuchscheme://bucket/x")
    with pytest.raises(HostsError, match="replica r1"):
        cluster.start()
    assert ours() == []
    cluster.stop()  # again: nothing to do


# -------------------------------------------------------------------------------------------------
# The namespace form


@pytest.fixture(scope="class")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamespaceCluster]:
    reason = namespaces_unavailable()
    if reason is not None:
        pytest.skip(reason)
    c = make_cluster(tmp_path_factory.mktemp("ns"), hosts=3, session_timeout=4.0, replica_settings=QUIET)
    assert isinstance(c, NamespaceCluster), getattr(c, "fallback_reason", "")
    with c:
        connect(c.replica_addresses[0]).create_table("probe", SCHEMA)
        yield c


@pytest.fixture
def healthy(cluster: NamespaceCluster) -> Iterator[NamespaceCluster]:
    """The cluster, healed and serving commits on every replica after the test."""
    try:
        yield cluster
    finally:
        cluster.heal()
        for i in range(cluster.hosts):
            if not cluster.zk_running(i):
                cluster.start_zk(i)
            if not cluster.replica_running(i):
                cluster.start_replica(i)
            if cluster.replica_paused(i):
                cluster.resume_replica(i)
        for i in range(cluster.hosts):
            cluster.free_wal_disk(i)
            commit(cluster.replica_addresses[i], "probe", 10_000 + i, timeout=90)


def udp_received(cluster: NamespaceCluster, src: int, dst: int, count: int = 5, port: int = 9931) -> int:
    """How many of ``count`` datagrams sent from host ``src`` arrive at host ``dst``."""
    address = (cluster.host_address(dst), port)
    receive = (
        "import socket\n"
        f"s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind({address!r})\n"
        "s.settimeout(1.0); print('bound', flush=True); n = 0\n"
        "try:\n    while s.recv(100):\n        n += 1\nexcept OSError:\n    pass\n"
        "print(n, flush=True)\n"
    )
    send = (
        "import socket, time\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"for _ in range({count}):\n"
        "    try:\n"
        f"        s.sendto(b'x', {address!r})\n"
        "    except PermissionError:\n        pass\n"  # what a dropping output chain answers
        "    time.sleep(0.002)\n"
    )
    ns = ["ip", "netns", "exec"]
    receiver = subprocess.Popen(
        [*ns, cluster.namespace(dst), sys.executable, "-I", "-S", "-c", receive], stdout=subprocess.PIPE, text=True
    )
    try:
        assert receiver.stdout.readline().strip() == "bound"
        subprocess.run([*ns, cluster.namespace(src), sys.executable, "-I", "-S", "-c", send], check=True, timeout=30)
        return int(receiver.communicate(timeout=30)[0].strip())
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()


@pytest.mark.slow
@needs_namespaces
class TestNamespaceCluster:
    def test_hosts_have_their_own_addresses_and_an_ensemble(self, cluster: NamespaceCluster) -> None:
        assert set(FAULT_KINDS) - {"slow"} <= cluster.supports()
        assert cluster.zk_address == "10.231.0.11:2181,10.231.0.12:2181,10.231.0.13:2181"
        assert cluster.replica_addresses == ["10.231.0.11:7070", "10.231.0.12:7070", "10.231.0.13:7070"]
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert all(f"mtx-h{i}" in names for i in (1, 2, 3))
        assert sorted(cluster.zk_mode(i) or "" for i in range(3)) == ["follower", "follower", "leader"]
        assert cluster.zk_leader() in (0, 1, 2)
        # kazoo from the root namespace writes through the ensemble; every member sees it
        with kazoo(cluster.zk_address) as zk:
            zk.ensure_path("/harness")
            zk.set("/harness", b"hello")
        for member in cluster.zk_address.split(","):
            with kazoo(member) as zk:
                zk.sync("/harness")
                assert zk.get("/harness")[0] == b"hello"
        # the replicas' processes live in their hosts' namespaces
        for i in range(3):
            pids = subprocess.run(
                ["ip", "netns", "pids", cluster.namespace(i)], capture_output=True, text=True
            ).stdout.split()
            assert str(cluster.replica_pid(i)) in pids

    def test_a_replica_on_every_host_commits(self, healthy: NamespaceCluster) -> None:
        c = healthy
        clients = [connect(a) for a in c.replica_addresses]
        csn = clients[1].create_table("everywhere", SCHEMA)
        for client in clients:
            client.wait_for(csn)
        csns = []
        for i, client in enumerate(clients):
            with client.transaction() as tx:
                tx.insert("everywhere", rows(i))
            csns.append(tx.csn)
        assert csns == sorted(csns)
        for client in clients:
            client.wait_for(csns[-1])
            assert sorted(client.read("everywhere", snapshot=csns[-1])["k"].to_pylist()) == [0, 1, 2]

    def test_isolate(self, healthy: NamespaceCluster) -> None:
        c = healthy
        c.isolate(1)
        h1, h2 = c.host_address(1), c.host_address(2)
        assert not c.connects(None, c.replica_addresses[1])  # the harness's clients neither
        assert not c.connects(0, f"{h1}:2181")
        assert not c.connects(1, f"{h2}:2181")
        assert c.connects(0, f"{h2}:2181")  # the others still talk
        assert c.connects(None, c.replica_addresses[0])
        c.heal()
        assert c.connects(None, c.replica_addresses[1])
        assert c.connects(0, f"{h1}:2181")

    def test_partition_splits_the_ensemble(self, healthy: NamespaceCluster) -> None:
        c = healthy
        c.partition([[0], [1, 2]])
        assert not c.connects(0, f"{c.host_address(1)}:2888")
        assert c.connects(1, f"{c.host_address(2)}:2181")
        assert all(c.connects(None, a) for a in c.replica_addresses)  # the harness reaches all
        wait_until(lambda: c.zk_mode(0) is None, 30, "the minority member to stop serving")
        majority = ",".join(c.zk_address.split(",")[1:])
        assert zk_writes(majority, "/partitioned")
        assert not zk_writes(c.zk_address.split(",")[0], "/partitioned", timeout=2)  # kazoo timeout
        c.heal()
        wait_until(lambda: c.zk_mode(0) is not None, 60, "the minority member to serve again")
        assert zk_writes(c.zk_address.split(",")[0], "/partitioned")

    def test_cut_from_zk(self, healthy: NamespaceCluster) -> None:
        c = healthy
        c.cut_from_zk(2)
        members = c.zk_address.split(",")
        assert not any(c.connects(2, m) for m in members)  # its own host's member included
        assert c.connects(1, members[0])
        assert c.connects(None, c.replica_addresses[2])  # clients still reach it
        assert zk_writes(members[2], "/cut")  # and the member on its host still serves
        c.heal()
        assert all(c.connects(2, m) for m in members)

    def test_cut_one_way(self, healthy: NamespaceCluster) -> None:
        c = healthy
        c.cut_one_way(0, 1)
        assert udp_received(c, 0, 1) == 0
        assert udp_received(c, 1, 0) == 5
        assert not c.connects(0, f"{c.host_address(1)}:2181")
        c.heal()
        assert udp_received(c, 0, 1) == 5

    def test_slow(self, healthy: NamespaceCluster) -> None:
        c = healthy
        if "slow" not in c.supports():  # this kernel has no sch_netem: delays cannot be made
            with pytest.raises(FaultNotSupported, match="netem"):
                c.slow(1, 100)
            pytest.skip("no tc netem in this kernel (CONFIG_NET_SCH_NETEM)")
        address = c.replica_addresses[1]
        before = statistics.median(connect_seconds(address) for _ in range(3))
        c.slow(1, 100)
        slowed = statistics.median(connect_seconds(address) for _ in range(3))
        c.heal()
        after = statistics.median(connect_seconds(address) for _ in range(3))
        assert before < 0.05 and after < 0.05, (before, after)
        assert 0.19 <= slowed < 1.0, slowed  # 100 ms each way

    def test_lossy(self, healthy: NamespaceCluster) -> None:
        c = healthy
        c.lossy(1, 50)  # each way: a datagram from host 0 to host 1 passes one of them
        got = udp_received(c, 0, 1, count=400)
        assert 140 <= got <= 260, got  # binomial(400, 0.5): 200 +- 6 sigma
        assert udp_received(c, 0, 2, count=50) == 50  # the other hosts' links are clean
        c.heal()
        c.lossy(1, 10)
        commit(c.replica_addresses[1], "probe", 9)  # TCP gets through, late
        c.heal()
        assert udp_received(c, 0, 1, count=50) == 50

    def test_killed_zookeeper_leader(self, healthy: NamespaceCluster) -> None:
        c = healthy
        leader = c.zk_leader()
        assert leader is not None
        c.kill_zk(leader)
        assert not c.zk_running(leader)
        with kazoo(c.zk_address) as zk:  # kazoo from the root namespace fails over
            zk.retry(zk.ensure_path, "/after-leader")
        wait_until(lambda: c.zk_leader() not in (None, leader), 30, "a new leader")
        commit(c.replica_addresses[leader], "probe", 1)  # its replica commits through the others
        c.start_zk(leader)
        print(f"ZooKeeper member restart (rejoin) took {c.timings['start_zk']:.1f} s")
        assert c.zk_mode(leader) == "follower"

    def test_replica_kill_restart_pause(self, healthy: NamespaceCluster) -> None:
        c = healthy
        csn = commit(c.replica_addresses[2], "probe", 2)
        c.kill_replica(2)
        assert not c.replica_running(2)
        assert not c.connects(None, c.replica_addresses[2])
        assert c.start_replica(2) == c.replica_addresses[2]
        print(f"replica restart took {c.timings['start_replica']:.1f} s")
        client = connect(c.replica_addresses[2])
        client.wait_for(csn)
        assert 2 in client.read("probe", snapshot=csn)["k"].to_pylist()
        commit(c.replica_addresses[2], "probe", 3)

        c.pause_replica(0)
        assert c.replica_paused(0) and c.replica_running(0)
        with pytest.raises(Exception):  # noqa: B017 - whatever a client gets from a frozen server
            Client(c.replica_addresses[0], timeout=1).close()
        c.resume_replica(0)
        commit(c.replica_addresses[0], "probe", 4)

    def test_expired_session_aborts_running_transactions(self, healthy: NamespaceCluster) -> None:
        c = healthy
        client = connect(c.replica_addresses[0])
        tx = client.begin()
        tx.insert("probe", rows(5))
        cut = c.expire_session(0)
        print(f"session expiry: cut off {cut:.1f} s (session timeout {c.session_timeout} s)")
        # the ensemble counts from the last packet it heard, a ping interval before the cut at most
        assert cut >= c.session_timeout / 2

        def aborted() -> None:
            if client.commit_status(tx.tid).status != "aborted":
                raise NotYet(f"{tx.id} not aborted yet")

        eventually(aborted, 30)
        with pytest.raises(TransactionAborted, match="lost its ZooKeeper session"):
            tx.commit()
        commit(c.replica_addresses[0], "probe", 6)

    def test_full_wal_disk(self, healthy: NamespaceCluster) -> None:
        c = healthy
        assert c.fill_wal_disk(1) > 32 * 1024 * 1024
        client = Client(c.replica_addresses[1], timeout=30)
        failure = None
        for n in range(100):  # the WAL's last page of the tmpfs takes a few records still
            try:
                with client.transaction() as tx:
                    tx.insert("probe", rows(100 + n))
            except MergetxnError as exc:
                failure = exc
                break
        assert failure is not None, "100 commits on a full WAL disk all succeeded"
        print(f"a commit on a full WAL disk, after {n} that fit: {type(failure).__name__}: {failure}")
        assert "No space left on device" in str(failure)
        assert c.replica_running(1)
        c.free_wal_disk(1)
        commit(c.replica_addresses[1], "probe", 8)

    def test_stop_leaves_nothing(self, cluster: NamespaceCluster) -> None:
        print(f"namespace cluster start took {cluster.timings['start']:.1f} s")
        cluster.stop()
        assert ours() == []
        assert not any(cluster.replica_running(i) or cluster.zk_running(i) for i in range(3))


# -------------------------------------------------------------------------------------------------
# The loopback form


def test_make_cluster_says_why_it_falls_back_to_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import mergetxn.chaos.hosts as hosts

    monkeypatch.setattr(hosts, "namespaces_unavailable", lambda: "network namespaces need root")
    cluster = make_cluster(tmp_path, hosts=3)
    assert isinstance(cluster, LoopbackCluster)
    assert cluster.fallback_reason == "network namespaces need root"
    assert "loopback, not in network namespaces: network namespaces need root" in caplog.text


@pytest.mark.slow
def test_loopback_cluster(tmp_path: Path) -> None:
    c = LoopbackCluster(tmp_path / "lo", hosts=3, session_timeout=4.0, replica_settings=QUIET)
    assert {"isolate", "partition", "cut_one_way"}.isdisjoint(c.supports())
    with c:
        print(f"loopback cluster start took {c.timings['start']:.1f} s")
        assert all(a.startswith("127.0.0.1:") for a in [*c.replica_addresses, *c.zk_address.split(",")])
        connect(c.replica_addresses[0]).create_table("probe", SCHEMA)
        csn = commit(c.replica_addresses[1], "probe", 1)

        c.kill_replica(1)
        assert not c.replica_running(1)
        c.start_replica(1)
        print(f"loopback replica restart took {c.timings['start_replica']:.1f} s")
        client = connect(c.replica_addresses[1])
        client.wait_for(csn)
        assert client.read("probe", snapshot=csn)["k"].to_pylist() == [1]

        # replica 0's way to ZooKeeper is cut (its proxies hang), other clients are not
        c.cut_from_zk(0)
        zk_via_replica0 = c.replica_zk_address(0)
        assert not zk_writes(zk_via_replica0, "/cut", timeout=2)
        assert zk_writes(c.zk_address, "/cut")
        c.heal()
        assert zk_writes(zk_via_replica0, "/cut")
        commit(c.replica_addresses[0], "probe", 2)

        leader = c.zk_leader()
        assert leader is not None
        c.kill_zk(leader)
        commit(c.replica_addresses[leader], "probe", 3)
        c.start_zk(leader)
        print(f"loopback ZooKeeper member restart took {c.timings['start_zk']:.1f} s")

        assert c.expire_session(2) > 0
        commit(c.replica_addresses[2], "probe", 4)

        with pytest.raises(FaultNotSupported, match="not supported"):
            c.isolate(0)
    left = leftovers(workdir=tmp_path, owner=os.getpid())
    assert [x for x in left if x.startswith(("process", "tmpfs"))] == []
