"""Faults against the real ZooKeeper: what a client sees when processes and connections die.

* (a) a replica SIGKILLed while many commits run on it: after restart nothing is half-visible
  (atomicity across two tables), every CSN a client saw is there, its running transactions are
  aborted, and the part files of its never-committed transactions are gone from storage;
* (b) one replica's ZooKeeper session expires (its traffic is cut in a proxy longer than the
  session timeout): its running transactions abort naming the session loss, and nothing else
  changes;
* (c) the connection drops during the commit multi, after the server ran it or instead of it:
  the caller gets a CSN (committed exactly once) or a definite error (nothing visible), never a
  hang, never "unknown", never a double commit;
* (d) the ZooKeeper server restarts: clients carry on once it is back;
* (e) a member of a 3-node ensemble (the leader) is killed under load: no client notices.

Faults (b) and (c) need one replica whose ZooKeeper traffic can be cut alone: it runs in this
process (Replica + ReplicaServer) with its kazoo client going through :mod:`tests.zkproxy`, next to
a LocalCluster whose replicas talk to the same ZooKeeper directly.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest
from kazoo.client import KazooClient
from support.cluster import make_cluster  # tests/ is on sys.path
from support.waiting import NotYet, eventually
from support.zk import kazoo, make_chroot
from zkproxy import ZkProxy  # tests/ is on sys.path (rootdir-relative test modules)

from coordinator.errors import MergetxnError, ReplicaUnavailable, TransactionAborted
from coordinator.model.records import ManifestPointer, decode_log_node
from coordinator.zk.log import CsnLog
from mergetxn.client import Client, Transaction
from mergetxn.local.cluster import LocalCluster
from mergetxn.local.zkserver import ZooKeeperEnsemble, ZooKeeperServer
from parts.io.storage import Storage
from replicas.replica import Replica, ReplicaConfig
from replicas.server import ReplicaServer

pytestmark = pytest.mark.slow

ROOT = "/mergetxn"
SCHEMA = pa.schema([("k", pa.int64()), ("j", pa.int64())])
ROWS = 3  # rows per transaction and table: a key is present with exactly ROWS rows or not at all
PROXIED_SESSION_TIMEOUT = 3.0


def rows(key: int) -> pa.Table:
    return pa.table({"k": [key] * ROWS, "j": list(range(ROWS))}, schema=SCHEMA)


def key_counts(client: Client, table: str, snapshot: int | None = None) -> Counter:
    return Counter(client.read(table, snapshot=snapshot).column("k").to_pylist())


def files_of(storage: Storage, tid: str) -> list[str]:
    """Files in storage that a transaction wrote (part names start with the creating tid)."""
    return [p for p in storage.list() if p.rsplit("/", 1)[-1].startswith(f"{tid}_")]


def log_mentions(zk: KazooClient, storage: Storage, tid: str) -> int:
    """How many CSN log entries name ``tid``: 1 for a committed transaction, 0 otherwise."""
    csn_log = CsnLog(zk, ROOT)
    n = 0
    for epoch in csn_log.epochs():
        for seq in csn_log.list_seqs(epoch):
            entry = decode_log_node(csn_log.fetch(epoch, seq), f"{epoch}/{seq}")
            if isinstance(entry, ManifestPointer):
                entry = decode_log_node(storage.get(entry.path), entry.path)
            n += sum(1 for t in entry.txns if t.tid == tid)
    return n


def commit_outcome(tx: Transaction) -> int | MergetxnError:
    """The CSN, or the definite error the replica answered with."""
    try:
        return tx.commit()
    except MergetxnError as exc:
        return exc


def begin_when_ready(client: Client, timeout: float = 60.0) -> Transaction:
    """BEGIN, waiting (bounded) while the replica reconnects to ZooKeeper."""
    return eventually(client.begin, timeout, retry_on=(ReplicaUnavailable,))


# ----------------------------------------------------------------------------------------------
# Module fixtures: one ZooKeeper chroot, one 2-replica cluster, one proxied in-process replica


@pytest.fixture(scope="module")
def zk_chroot(zk_server: ZooKeeperServer) -> str:
    return make_chroot(zk_server, "faults")


@pytest.fixture(scope="module")
def observer(zk_server: ZooKeeperServer, zk_chroot: str) -> Iterator[KazooClient]:
    """A kazoo client straight to ZooKeeper (no proxy) for looking at znodes from outside."""
    with kazoo(zk_server.address + zk_chroot) as zk:
        yield zk


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer, zk_chroot: str
) -> Iterator[LocalCluster]:
    # inline_rows 0: these faults are about staged part files (orphans, rollbacks, the fence);
    # inlined writes have no file and their own crash tests (test_inline_faults.py)
    settings = {"inline_rows": 0}
    with make_cluster(
        tmp_path_factory, zk_server.address + zk_chroot, "faults", replicas=2, root=ROOT, settings=settings
    ) as c:
        yield c


@dataclass
class Proxied:
    proxy: ZkProxy
    replica: Replica
    client: Client
    storage: Storage


@pytest.fixture(scope="module")
def proxied(
    tmp_path_factory: pytest.TempPathFactory,
    zk_server: ZooKeeperServer,
    zk_chroot: str,
    cluster: LocalCluster,
) -> Iterator[Proxied]:
    """Replica ``px`` in this process, its ZooKeeper traffic through a fault-injecting proxy."""
    proxy = ZkProxy(zk_server.address).start()
    config = ReplicaConfig(
        zk=proxy.address + zk_chroot,
        storage_url=cluster.storage_url,
        host_id="px",
        data_dir=Path(tmp_path_factory.mktemp("px")),
        root=ROOT,
        session_timeout=PROXIED_SESSION_TIMEOUT,
        inline_rows=0,  # as the cluster's: staged part files are what these faults are about
    )
    replica = Replica(config)
    replica.start()
    server = ReplicaServer(replica)
    replica.set_address(server.address)
    threading.Thread(target=server.serve, name="px-server", daemon=True).start()
    client = Client(server.address)
    try:
        yield Proxied(proxy, replica, client, Storage(cluster.storage_url))
    finally:
        client.close()
        server.shutdown()
        replica.stop()
        proxy.stop()


def create_tables(cluster: LocalCluster, *names: str, **kwargs: object) -> int:
    """Create tables through replica 0; returns the CSN by which all of them exist."""
    c0 = cluster.client(0)
    csn = 0
    for name in names:
        csn = c0.create_table(name, SCHEMA, auto_merge=False, **kwargs)
    return csn


# ----------------------------------------------------------------------------------------------
# (a) SIGKILL of a replica while commits run on it


@dataclass
class Attempt:
    key: int
    tx: Transaction
    attempted: bool = False
    csn: int | None = None
    error: MergetxnError | None = None
    done_at: float | None = None  # when its commit call returned or raised


def test_replica_sigkill_mid_commit(cluster: LocalCluster) -> None:
    """Kill replica 1 while 12 threads commit two-table transactions on it, restart it."""
    a, b = "kill_a", "kill_b"
    threads_n, per_thread, kill_after = 12, 6, 20
    storage = Storage(cluster.storage_url)
    c1 = cluster.client(1)
    c1.wait_for(create_tables(cluster, a, b))

    base = c1.begin()
    base.insert(a, rows(0))
    base.insert(b, rows(0))
    base.commit()
    old = c1.begin()  # running when the replica dies, never asked to commit before
    old.insert(a, rows(-1))
    old.insert(b, rows(-1))
    assert files_of(storage, old.id), "the staged transaction wrote no part files"

    attempts: list[list[Attempt]] = [[] for _ in range(threads_n)]
    barrier = threading.Barrier(threads_n + 1, timeout=120)
    committed = threading.Condition()
    n_committed = 0

    def worker(i: int) -> None:
        nonlocal n_committed
        client = Client(cluster.replica_addresses[1])
        for j in range(per_thread):
            key = 1 + i * per_thread + j
            tx = client.begin()
            tx.insert(a, rows(key))
            tx.insert(b, rows(key))
            attempts[i].append(Attempt(key, tx))
        barrier.wait()
        for at in attempts[i]:
            at.attempted = True
            try:
                at.csn = at.tx.commit()
            except MergetxnError as exc:
                at.error = exc
                return  # the replica is gone; the rest stay running (to be aborted)
            finally:
                at.done_at = time.monotonic()
            with committed:
                n_committed += 1
                committed.notify_all()

    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads_n)]
    for t in workers:
        t.start()
    barrier.wait()
    with committed:
        assert committed.wait_for(lambda: n_committed >= kill_after, timeout=60), "commits stalled"
    killed_at = time.monotonic()
    cluster.kill_replica(1)
    for t in workers:
        t.join(60)
        assert not t.is_alive(), "a client hung after its replica was killed"

    everything = [at for per in attempts for at in per]
    # In flight: answered only after the kill. Its client asked the other replica:
    # committed (a CSN), aborted (TransactionAborted), or still unknown (OutcomeUnknown).
    in_flight = [at for at in everything if at.attempted and (at.error is not None or at.done_at > killed_at)]
    never_tried = [at for at in everything if not at.attempted]
    assert in_flight, "no commit was in flight when the replica was killed: not a mid-commit kill"
    assert never_tried, "every transaction committed before the kill"
    for at in in_flight:
        assert at.csn is not None or isinstance(at.error, (ReplicaUnavailable, TransactionAborted)), at.error

    cluster.start_replica(1)
    c0, c1 = cluster.client(0), cluster.client(1)
    snap = max(c0.snapshot(), c1.snapshot())
    c0.wait_for(snap)
    c1.wait_for(snap)
    for client in (c0, c1):
        in_a, in_b = key_counts(client, a, snap), key_counts(client, b, snap)
        assert in_a[0] == in_b[0] == ROWS, "data committed before the kill was lost"
        assert set(in_a.values()) <= {ROWS} and set(in_b.values()) <= {ROWS}, "rows appear twice"
        assert set(in_a) == set(in_b), f"half-visible transactions: {set(in_a) ^ set(in_b)}"
        for at in everything:
            status = client.commit_status(at.tx.tid)
            visible = at.key in in_a
            if at.csn is not None:
                assert visible, f"{at.tx.id} got CSN {at.csn} but its rows are gone"
                assert (status.status, status.csn) == ("committed", at.csn)
            else:
                assert visible == (status.status == "committed"), (at.tx.id, status, visible)
                assert status.status in ("committed", "aborted"), status  # decided on every replica
        assert -1 not in in_a

    # Transactions running on the replica when it died are aborted, and their files are gone.
    for at in never_tried + [Attempt(-1, old)]:
        with pytest.raises(TransactionAborted):
            at.tx.commit()
    in_a = key_counts(c1, a)
    for at in everything + [Attempt(-1, old)]:
        if at.key not in in_a:
            assert not files_of(storage, at.tx.id), f"{at.tx.id} never committed; its files stayed"

    # The restarted replica takes new transactions, with tids never used before.
    tx = c1.begin()
    assert tx.id not in {at.tx.id for at in everything} | {old.id, base.id}
    tx.insert(a, rows(10_000))
    tx.insert(b, rows(10_000))
    c0.wait_for(tx.commit())
    assert key_counts(c0, a)[10_000] == key_counts(c0, b)[10_000] == ROWS


# ----------------------------------------------------------------------------------------------
# (b) session expiry of one replica


def test_session_expiry_aborts_only_that_replicas_transactions(
    cluster: LocalCluster, proxied: Proxied, observer: KazooClient
) -> None:
    """Cut px off from ZooKeeper until the server expires its session (its ephemeral node goes),
    while replica 0 keeps committing; then let px reconnect."""
    t = "expiry"
    c0, px = cluster.client(0), proxied.client
    px.wait_for(create_tables(cluster, t))
    before = px.begin()
    before.insert(t, rows(1))
    before.commit()
    doomed = px.begin()
    doomed.insert(t, rows(2))
    assert files_of(proxied.storage, doomed.id)
    other = c0.begin()  # on another replica: must not notice
    other.insert(t, rows(3))
    alive = f"{ROOT}/replicas/px/alive"
    assert observer.exists(alive)

    def expired() -> None:
        if observer.exists(alive) is not None:
            raise NotYet("px's session still lives on the server")

    proxied.proxy.block()
    try:
        eventually(expired, timeout=PROXIED_SESSION_TIMEOUT * 10)
        other_csn = other.commit()
        during = c0.begin()
        during.insert(t, rows(4))
        during_csn = during.commit()
        assert key_counts(px, t)[1] == ROWS, "the cut-off replica stopped serving reads"
    finally:
        proxied.proxy.unblock()

    def doomed_aborted() -> None:
        if px.commit_status(doomed.tid).status != "aborted":
            raise NotYet("px has not noticed its session expired")

    eventually(doomed_aborted)
    with pytest.raises(TransactionAborted, match="session"):
        doomed.commit()
    assert not files_of(proxied.storage, doomed.id), "files of the aborted transaction stayed"

    tx = begin_when_ready(px)
    tx.insert(t, rows(5))
    csn = tx.commit()
    assert csn > max(other_csn, during_csn)
    c0.wait_for(csn)
    for client in (c0, px):
        assert key_counts(client, t, csn) == Counter({1: ROWS, 3: ROWS, 4: ROWS, 5: ROWS})
    assert px.commit_status(other.tid).csn == other_csn

    def registered_again() -> None:
        if observer.exists(alive) is None:
            raise NotYet("px has not re-published its alive node in the new session")

    eventually(registered_again)


def test_an_aborted_transaction_reads_aborted_only_once_its_files_are_gone(
    cluster: LocalCluster, proxied: Proxied, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever sees the outcome ``aborted`` (commit_status, the client's commit) finds the
    transaction's own staged files deleted: the abort deletes them before it publishes the state.
    Asked from a second connection at the moment each file is deleted, the outcome still reads
    running (it read aborted, and a session-expiry test found a file left, when the order was the
    other way round)."""
    t = "abort_order"
    px = proxied.client
    px.wait_for(create_tables(cluster, t))
    tx = px.begin()
    tx.insert(t, rows(1))
    assert files_of(proxied.storage, tx.id)
    seen: list[str] = []
    delete = proxied.replica.storage.delete
    with Client(px.address) as asker:

        def watched_delete(path: str) -> None:
            if path.rsplit("/", 1)[-1].startswith(f"{tx.id}_"):
                seen.append(asker.commit_status(tx.tid).status)
            delete(path)

        monkeypatch.setattr(proxied.replica.storage, "delete", watched_delete)
        tx.rollback()
    assert seen and set(seen) == {"running"}, f"the outcome read {seen} while the files were deleted"
    assert not files_of(proxied.storage, tx.id)
    assert px.commit_status(tx.tid).status == "aborted"


# ----------------------------------------------------------------------------------------------
# (c) connection lost during the commit multi


@pytest.mark.parametrize("concurrent", [1, 4])
@pytest.mark.parametrize("fault", ["after", "instead"])
def test_connection_lost_during_commit_multi(
    cluster: LocalCluster, proxied: Proxied, observer: KazooClient, fault: str, concurrent: int
) -> None:
    """'after': the multi ran but its reply is lost; 'instead': it never reached the server."""
    t = f"lost_{fault}_{concurrent}"
    c0, px = cluster.client(0), proxied.client
    px.wait_for(create_tables(cluster, t))
    txs = []
    for key in range(concurrent):
        tx = begin_when_ready(px)
        tx.insert(t, rows(key))
        txs.append(tx)
    armed = proxied.proxy.drop_after_next_multi() if fault == "after" else proxied.proxy.drop_instead_of_next_multi()
    barrier = threading.Barrier(concurrent, timeout=60)

    def commit(tx: Transaction) -> int | MergetxnError:
        barrier.wait()
        return commit_outcome(tx)

    pool = ThreadPoolExecutor(concurrent)
    try:
        futures = [pool.submit(commit, tx) for tx in txs]
        outcomes = [f.result(timeout=120) for f in futures]  # a hang fails here
    finally:
        proxied.proxy.disarm()
        pool.shutdown(wait=False, cancel_futures=True)
    assert armed.fired.is_set(), "the fault was never injected"

    latest = max([o for o in outcomes if isinstance(o, int)], default=px.snapshot())
    c0.wait_for(latest)
    for key, (tx, outcome) in enumerate(zip(txs, outcomes)):
        mentions = log_mentions(observer, proxied.storage, tx.id)
        status = px.commit_status(tx.tid)
        if isinstance(outcome, int):
            assert mentions == 1, f"{tx.id} is in the log {mentions} times"
            assert (status.status, status.csn) == ("committed", outcome)
            for client in (px, c0):
                assert key_counts(client, t, latest)[key] == ROWS
        else:
            assert not isinstance(outcome, ReplicaUnavailable), f"answer left unknown: {outcome!r}"
            assert mentions == 0, f"{tx.id} reported {outcome!r} but is in the log"
            assert status.status != "committed"
            for client in (px, c0):
                assert key_counts(client, t, latest)[key] == 0
    # The replica goes on committing normally afterwards.
    tx = begin_when_ready(px)
    tx.insert(t, rows(100))
    csn = tx.commit()
    c0.wait_for(csn)
    assert key_counts(c0, t, csn)[100] == ROWS


# ----------------------------------------------------------------------------------------------
# (d) ZooKeeper server restart


@pytest.mark.parametrize("hard", [False, True], ids=["stop", "sigkill"])
def test_zookeeper_restart(tmp_path: Path, hard: bool) -> None:
    """ZooKeeper goes down (stopped, or SIGKILLed) with a commit waiting on it, and comes back
    on the same port and data, well within the replicas' 10 s session timeout."""
    t = "zk_restart"
    server = ZooKeeperServer(tmp_path / "zk")
    server.start()
    try:
        with LocalCluster(tmp_path / "cluster", replicas=2, zk_address=server.address) as c:
            c0, c1 = c.client(0), c.client(1)
            c1.wait_for(c0.create_table(t, SCHEMA, auto_merge=False))
            with c1.transaction() as tx:
                tx.insert(t, rows(1))
            pending = c0.begin()
            pending.insert(t, rows(2))

            if hard:
                server.kill()
            else:
                server.stop()
            pool = ThreadPoolExecutor(1)
            try:
                fut = pool.submit(commit_outcome, pending)

                def committing() -> None:
                    states = {d["id"]: d["state"] for d in c0.transactions()}
                    if states.get(pending.id) != "committing":
                        raise NotYet(f"commit not in progress yet: {states}")

                eventually(committing)
                assert key_counts(c1, t)[1] == ROWS, "reads stopped while ZooKeeper was down"
                server.start()
                outcome = fut.result(timeout=120)  # a hang fails here
            finally:
                pool.shutdown(wait=False, cancel_futures=True)
            # The sessions outlived the outage, so the waiting commit went through.
            assert isinstance(outcome, int), f"commit across the restart failed: {outcome!r}"

            csn = outcome
            for key, client in ((10, c0), (11, c1)):
                tx = begin_when_ready(client)
                tx.insert(t, rows(key))
                csn = max(csn, tx.commit())
            for client in (c0, c1):
                client.wait_for(csn)
                counts = key_counts(client, t, csn)
                assert counts == Counter({1: ROWS, 2: ROWS, 10: ROWS, 11: ROWS})
                assert client.commit_status(pending.tid).csn == outcome
    finally:
        server.stop()


# ----------------------------------------------------------------------------------------------
# (e) one member of a 3-node ensemble killed under load


@dataclass
class Load:
    committed: dict[int, int] = field(default_factory=dict)  # key -> csn
    errors: list[tuple[int, BaseException]] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)


def test_ensemble_member_killed_under_load(tmp_path: Path) -> None:
    tables = ("ens_parts", "ens_append")
    per_replica, before_kill, after_kill = 3, 30, 60
    ens = ZooKeeperEnsemble(tmp_path / "ensemble", 3)
    ens.start()
    try:
        with LocalCluster(tmp_path / "cluster", replicas=2, zk_address=ens.address) as c:
            c0 = c.client(0)
            c0.create_table(tables[0], SCHEMA, auto_merge=False)
            csn = c0.create_table(tables[1], SCHEMA, auto_merge=False, conflict_policy="append")
            c.client(1).wait_for(csn)
            load = Load()
            stop = threading.Event()
            workers_n = 2 * per_replica
            barrier = threading.Barrier(workers_n + 1, timeout=60)

            def worker(i: int) -> None:
                client = c.client(i % 2)
                barrier.wait()
                n = 0
                while not stop.is_set():
                    key = i * 1_000_000 + n
                    n += 1
                    try:
                        with client.transaction() as tx:
                            for table in tables:
                                tx.insert(table, rows(key))
                    except BaseException as exc:  # noqa: BLE001 - every failure is a finding
                        with load.cond:
                            load.errors.append((key, exc))
                        continue
                    with load.cond:
                        load.committed[key] = tx.csn
                        load.cond.notify_all()

            threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(workers_n)]
            for th in threads:
                th.start()
            barrier.wait()
            with load.cond:
                assert load.cond.wait_for(lambda: len(load.committed) >= before_kill, 60)
            leader = ens.leader()
            assert leader is not None
            ens.kill_member(leader)
            with load.cond:
                at_kill = len(load.committed)
                assert load.cond.wait_for(lambda: len(load.committed) >= at_kill + after_kill, 90), (
                    f"commits stalled after the leader was killed; errors: {load.errors[:3]}"
                )
            stop.set()
            for th in threads:
                th.join(60)
                assert not th.is_alive()

            assert load.errors == [], f"clients noticed the kill: {load.errors[:5]}"
            latest = max(load.committed.values())
            for i in range(2):
                client = c.client(i)
                client.wait_for(latest)
                for table in tables:
                    counts = key_counts(client, table, latest)
                    assert counts == Counter({k: ROWS for k in load.committed}), (
                        f"{table} on replica {i}: lost {set(load.committed) - set(counts)}, "
                        f"unexpected {set(counts) - set(load.committed)}"
                    )
    finally:
        ens.stop()
