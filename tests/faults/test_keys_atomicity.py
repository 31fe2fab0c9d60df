"""Keys tables with ``atomicity="none"`` and ``durability="async"``
(docs/rules.md#atomicity-and-durability, after YTsaurus' "Weakening guarantees"), against a real
ZooKeeper and real replicas; the mode rules are pure (coordinator/model/atomicity.py) and tested without a
cluster.

* Modes: ``client.begin(atomicity=..., durability=...)`` checks its values; a transaction whose
  atomicity differs from a table it writes fails at commit with InvalidInput naming both modes
  and leaves nothing.
* ``atomicity="none"``: no locks, never a conflict, the later CSN wins per key (two writers held
  by a barrier both commit); ``lock_keys`` refused; reads see the latest applied state.
* ``durability="async"``: ``commit()`` returns None once queued; ``flush()`` returns the last CSN
  and raises naming failed commits; one client's async commits get CSNs in its order (a batch
  held at its multi by a failpoint, in-process replicas); queued commits' files are kept by
  cleanup; a SIGKILL loses only what was not flushed, each lost commit entirely, and their
  files are collected.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from rpcproxy import RpcProxy  # tests/ is on sys.path
from support.cluster import make_cluster
from support.waiting import wait_until
from test_log_tail import Node

from coordinator.errors import ConflictError, InvalidInput, TransactionAborted
from coordinator.model import atomicity
from coordinator.model.catalog import TableDef
from coordinator.model.records import Compact, DropTable, Insert
from mergetxn.client import Client
from mergetxn.local.zkserver import ZooKeeperServer
from replicas import failpoints

SCHEMA = pa.schema(
    [
        pa.field("p", pa.int64(), nullable=False),
        pa.field("k", pa.int64(), nullable=False),
        pa.field("v", pa.string()),
        pa.field("n", pa.int64()),
    ]
)


def rows(*items: tuple[int, int, str], n: int | None = None) -> pa.Table:
    return pa.Table.from_pylist([{"p": p, "k": k, "v": v, "n": n} for p, k, v in items], schema=SCHEMA)


def kv(t: pa.Table) -> dict[tuple[int, int], str]:
    return {(r["p"], r["k"]): r["v"] for r in t.to_pylist()}


# ---------------------------------------------------------------------------------------------
# Pure: the modes a transaction may be begun with, and the mismatch rule


BAD_MODES = [
    (("bogus", "sync"), "atomicity must be one of ['full', 'none'], not 'bogus'"),
    ((None, "sync"), "atomicity must be one of ['full', 'none'], not None"),
    (("none", "later"), "durability must be one of ['sync', 'async'], not 'later'"),
    (("none", 1), "durability must be one of ['sync', 'async'], not 1"),
    (("full", "async"), "durability='async' needs atomicity='none' (not 'full')"),
]


@pytest.mark.parametrize(("modes", "says"), BAD_MODES, ids=[s for _, s in BAD_MODES])
def test_bad_modes_name_the_value(modes: tuple, says: str) -> None:
    with pytest.raises(InvalidInput) as e:
        atomicity.check_modes(*modes)
    assert says in e.value.message


def test_good_modes_and_serializable_none() -> None:
    assert atomicity.check_modes("none", "async") == ("none", "async")
    assert atomicity.check_modes("full", "sync", "serializable") == ("full", "sync")
    with pytest.raises(InvalidInput, match="atomicity='none' cannot be serializable"):
        atomicity.check_modes("none", "sync", "serializable")
    with pytest.raises(InvalidInput, match="needs a session"):
        atomicity.check_session(None, "async")
    assert atomicity.check_session(None, "sync") is None


def _def(name: str, policy: str = "keys", atom: str = "full") -> TableDef:
    if policy != "keys":
        return TableDef.new(name, SCHEMA, conflict_policy=policy)
    return TableDef.new(name, SCHEMA, primary_key=("p", "k"), conflict_policy="keys", atomicity=atom)


TABLES = {
    "kfull": _def("kfull"),
    "knone": _def("knone", atom="none"),
    "plain": _def("plain", "parts"),
    "mc": _def("mc", "maxcompute"),
}


@pytest.mark.parametrize("txn_mode", ["full", "none"])
@pytest.mark.parametrize("table", sorted(TABLES))
@pytest.mark.parametrize("op", ["insert", "compact", "drop"])
def test_mismatch_rule_over_every_table_kind(txn_mode: str, table: str, op: str) -> None:
    ops = {"insert": Insert(table, ()), "compact": Compact(table, "minor"), "drop": DropTable(table)}
    wrong = atomicity.mismatch("T1", txn_mode, [ops[op]], TABLES.get)
    table_mode = "none" if table == "knone" else "full"
    if op == "insert":
        expected = txn_mode != table_mode  # rows by key only into a table of the same mode
    else:
        expected = txn_mode == "none"  # compact and drop: any table, but never in a non-atomic one
    assert (wrong is not None) == expected
    if wrong is not None:
        assert "atomicity='none'" in wrong.message and "T1" in wrong.message and table in wrong.message
        if op == "insert":  # both modes named
            assert f"atomicity={txn_mode!r}" in wrong.message and f"atomicity is {table_mode!r}" in wrong.message
    # A table that is gone is the commit's to decide (it lost to the drop): no mismatch.
    assert atomicity.mismatch("T1", txn_mode, [ops[op]], lambda name: None) is None


# ---------------------------------------------------------------------------------------------
# Against a cluster of two replica processes


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator:
    with make_cluster(tmp_path_factory, zk_server, "katom", replicas=2) as c:
        yield c


@pytest.fixture
def clients(cluster) -> Iterator[tuple[Client, Client]]:
    a, b = (cluster.client(i) for i in range(2))
    try:
        yield a, b
    finally:
        a.close()
        b.close()


_n = iter(range(10**6))


def new_table(c: Client, atom: str = "none", policy: str = "keys", **kw) -> str:
    name = f"ka{next(_n)}"
    if policy == "keys":
        c.create_table(
            name, SCHEMA, partition_by=("p",), primary_key=("p", "k"), conflict_policy="keys", atomicity=atom, **kw
        )
    else:
        c.create_table(name, SCHEMA, partition_by=("p",), conflict_policy=policy, **kw)
    return name


def part_files(cluster, table: str) -> set[str]:
    root = Path(cluster.storage_url.removeprefix("file://")) / table
    return {str(p.relative_to(root)) for p in root.rglob("*.parquet")} if root.exists() else set()


def test_begin_checks_its_modes(clients) -> None:
    a, _ = clients
    for kw, says in [
        ({"atomicity": "most"}, "'most'"),
        ({"durability": "eventual"}, "'eventual'"),
        ({"durability": "async"}, "needs atomicity='none' (not 'full')"),
        ({"atomicity": "none", "isolation": "serializable"}, "cannot be serializable"),
    ]:
        with pytest.raises(InvalidInput, match=re.escape(says)):
            a.begin(**kw)
        with pytest.raises(InvalidInput, match=re.escape(says)), a.transaction(**kw):
            pass
    # Over the wire too: a replica checks what a begin asks for.
    with pytest.raises(InvalidInput, match="atomicity must be one of"):
        a.call("begin", atomicity="half")
    with pytest.raises(InvalidInput, match="needs a session"):
        a.call("begin", atomicity="none", durability="async")
    tx = a.begin(atomicity="none", durability="async")
    assert (tx.atomicity, tx.durability, tx.isolation) == ("none", "async", "snapshot")
    assert {t["id"]: (t["atomicity"], t["durability"]) for t in a.transactions()}[tx.id] == ("none", "async")
    tx.rollback()
    tx = a.begin()
    assert (tx.atomicity, tx.durability) == ("full", "sync")
    tx.rollback()


MISMATCHES = [
    ("full", "none", "sync"),
    ("none", "full", "sync"),
    ("none", "parts", "sync"),
    ("none", "full", "async"),
    ("none", "parts", "async"),
]


@pytest.mark.parametrize(
    ("txn_mode", "table_kind", "durability"), MISMATCHES, ids=[f"{t} {d} txn on a {k} table" for t, k, d in MISMATCHES]
)
def test_mode_mismatch_fails_at_commit_naming_both_and_leaves_nothing(
    cluster, clients, txn_mode: str, table_kind: str, durability: str
) -> None:
    a, _ = clients
    # A parts table's small inserts are inlined, without files: inline_rows=0, so its files are counted.
    name = new_table(a, "full", policy="parts", inline_rows=0) if table_kind == "parts" else new_table(a, table_kind)
    with a.transaction(atomicity="full" if table_kind == "parts" else table_kind) as tx:
        tx.insert(name, rows((1, 1, "before")))
    before, files = a.read(name), part_files(cluster, name)
    tx = a.begin(atomicity=txn_mode, durability=durability)
    tx.insert(name, rows((1, 1, "mismatch"), (2, 5, "mismatch")))  # accepted: the check is at commit
    assert len(part_files(cluster, name)) > len(files)
    with pytest.raises(InvalidInput) as e:
        tx.commit()
    table_mode = "full" if table_kind == "parts" else table_kind
    assert f"atomicity={txn_mode!r}" in e.value.message and f"atomicity is {table_mode!r}" in e.value.message
    assert name in e.value.message and tx.id in e.value.message
    # Nothing of it: rows as before, its files deleted, its outcome aborted, it has ended.
    assert a.read(name).equals(before)
    assert part_files(cluster, name) == files
    assert a.commit_status(tx.id).status == "aborted"
    with pytest.raises(TransactionAborted):
        tx.insert(name, rows((3, 3, "x")))
    a.flush()  # nothing was queued: no failure to report


def test_context_manager_takes_the_modes(clients) -> None:
    a, _ = clients
    name = new_table(a)
    with pytest.raises(InvalidInput, match="atomicity is 'none'"), a.transaction() as tx:
        tx.insert(name, rows((1, 1, "full")))
    with a.transaction(atomicity="none") as tx:
        tx.insert(name, rows((1, 1, "none")))
    assert tx.csn is not None and kv(a.read(name)) == {(1, 1): "none"}


def test_non_atomic_writers_of_one_key_both_commit_and_the_later_csn_wins(cluster) -> None:
    """Non-atomic transactions take no locks (docs/rules.md#atomicity-and-durability), the last
    committed write wins. Two writers of the same key begin together, write, and commit at once (a
    barrier), 6 rounds, on two replicas and on one: both commit, and the key holds the row of the
    larger CSN. The same race on an atomicity-full table fails one of them (the control)."""
    conns = [cluster.client(i) for i in (0, 1, 0)]
    try:
        name, full = new_table(conns[0]), new_table(conns[0], "full")
        for pair in ((0, 1), (0, 2)):
            for round_ in range(6):
                barrier = threading.Barrier(2)
                results: list[object] = [None, None]

                def writer(i: int, table: str, mode: str) -> None:
                    tx = conns[pair[i]].begin(atomicity=mode)
                    tx.insert(table, rows((round_, 7, f"w{i}"), (round_, 100 + i, f"own{i}")))
                    barrier.wait()
                    try:
                        results[i] = (tx.commit(), f"w{i}")
                    except ConflictError as exc:
                        results[i] = exc

                threads = [threading.Thread(target=writer, args=(i, name, "none")) for i in range(2)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                assert all(isinstance(r, tuple) for r in results), results
                (c0, v0), (c1, v1) = results  # type: ignore[misc]
                assert c0 != c1  # never one CSN for two writes of a key: the order is defined
                conns[0].wait_for(max(c0, c1))
                got = kv(conns[0].read(name, where=pc.field("p") == round_))
                assert got == {(round_, 7): v0 if c0 > c1 else v1, (round_, 100): "own0", (round_, 101): "own1"}
                # The control: the same race on a table of atomicity 'full' fails one.
                barrier = threading.Barrier(2)
                threads = [threading.Thread(target=writer, args=(i, full, "full")) for i in range(2)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                assert sum(isinstance(r, ConflictError) for r in results) == 1, results
            name = new_table(conns[0])
    finally:
        for c in conns:
            c.close()


def test_lock_keys_is_refused_in_a_non_atomic_transaction(clients) -> None:
    a, _ = clients
    name = new_table(a)
    tx = a.begin(atomicity="none")
    with pytest.raises(InvalidInput, match="atomicity='none', which takes no locks"):
        tx.lock_keys(name, pa.table({"p": pa.array([1], pa.int64()), "k": pa.array([1], pa.int64())}))
    tx.insert(name, rows((1, 1, "still fine")))
    tx.commit()
    assert kv(a.read(name)) == {(1, 1): "still fine"}


def test_reads_see_the_latest_applied_state_with_own_writes(clients) -> None:
    """A non-atomic transaction reads what its replica applied at the time of the read, not its
    begin snapshot (a full one begun at the same time still reads its snapshot); with its own
    writes over it; deletes by predicate act on that state too."""
    a, b = clients
    name = new_table(a)
    with a.transaction(atomicity="none") as tx:
        tx.insert(name, rows((1, 1, "old"), (1, 2, "old")))
    none_tx, full_tx = a.begin(atomicity="none"), a.begin()
    with b.transaction(atomicity="none") as other:  # another replica, after both began
        other.insert(name, rows((1, 1, "new"), (2, 3, "new")))
    a.wait_for(other.csn)
    assert kv(none_tx.read(name)) == {(1, 1): "new", (1, 2): "old", (2, 3): "new"}
    assert kv(full_tx.read(name)) == {(1, 1): "old", (1, 2): "old"}
    none_tx.insert(name, rows((1, 2, "mine")))
    assert kv(none_tx.read(name, where=pc.field("p") == 1)) == {(1, 1): "new", (1, 2): "mine"}
    assert none_tx.delete(name, pc.field("p") == 2) == 1  # the key committed after its begin
    none_tx.commit()
    full_tx.rollback()
    assert kv(a.read(name)) == {(1, 1): "new", (1, 2): "mine"}


def test_async_commit_returns_none_and_flush_returns_the_last_csn(cluster, clients) -> None:
    a, b = clients
    name = new_table(a)
    assert a.flush() is None  # none ever
    txs = []
    for i in range(5):
        tx = a.begin(atomicity="none", durability="async")
        tx.insert(name, rows((i % 2, i, f"a{i}")))
        assert tx.commit() is None and tx.csn is None
        assert tx.commit() is None  # again: still None, nothing written twice
        txs.append(tx)
    empty = a.begin(atomicity="none", durability="async")
    assert empty.commit() is None
    last = a.flush()
    statuses = [a.commit_status(tx.id) for tx in txs]
    assert all(s.status == "committed" for s in statuses), statuses
    assert last == max(s.csn for s in statuses)
    assert [s.csn for s in statuses] == sorted(s.csn for s in statuses)  # in the order they were made
    # Durable and applied here: this client reads them, and the other replica at that CSN.
    assert kv(a.read(name)) == {(i % 2, i): f"a{i}" for i in range(5)}
    b.wait_for(last)
    assert b.read(name, snapshot=last).num_rows == 5
    assert a.flush() == last  # nothing new since: the same last CSN
    assert b.flush() is None  # another client: its own async commits (none)
    info = cluster.client(0).call("info")["async_commits"]
    assert info["accepted"] >= 5 and info["pending"] == 0


def test_flush_names_an_async_commit_that_failed(clients) -> None:
    """An async commit that fails after it was answered (here: its table dropped meanwhile, so
    it loses to the drop) is reported by the next flush, naming it, once."""
    a, _ = clients
    name = new_table(a)
    good = a.begin(atomicity="none", durability="async")
    good.insert(name, rows((1, 1, "good")))
    doomed = a.begin(atomicity="none", durability="async")
    doomed.insert(name, rows((1, 2, "doomed")))
    good.commit()
    csn = a.flush()
    a.drop_table(name)
    assert doomed.commit() is None  # answered: queued; the committer then finds the table dropped
    with pytest.raises(TransactionAborted) as e:
        a.flush()
    assert doomed.id in e.value.message and e.value.details["ids"] == [doomed.id] == e.value.ids
    assert "dropped" in e.value.message
    assert a.commit_status(doomed.id).status == "aborted"
    assert a.flush() == csn  # reported once; the last CSN is still the good one's


def test_lost_answers_of_an_async_commit_and_of_a_flush(cluster, clients) -> None:
    """The answer of an async commit lost (the connection cut after the replica queued it): the
    client waits for its outcome as a sync commit would, still returns None, and flush counts
    it. The answer of a flush lost: it is sent again, and the failure it reported is reported
    by the second one too (failures are dropped only when a later flush acknowledges them)."""
    a, _ = clients
    name = new_table(a)
    with RpcProxy(cluster.replica_addresses[0]) as proxy:
        c = Client(proxy.address)
        tx = c.begin(atomicity="none", durability="async")
        tx.insert(name, rows((1, 1, "answer lost")))
        fired = proxy.drop_reply_of("commit")
        assert tx.commit() is None
        assert fired.is_set() and tx.csn is not None
        assert c.flush() == tx.csn
        doomed = c.begin(atomicity="none", durability="async")
        doomed.insert(name, rows((1, 2, "doomed")))
        a.drop_table(name)
        assert doomed.commit() is None
        fired = proxy.drop_reply_of("flush")
        with pytest.raises(TransactionAborted) as e:
            c.flush()
        assert fired.is_set() and e.value.details["ids"] == [doomed.id]
        assert c.flush() == tx.csn
        c.close()


# ---------------------------------------------------------------------------------------------
# In-process replicas: the committer held at its multi by a failpoint


@pytest.fixture
def held(zk_address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable]:
    """``(node, hold, release)``: one in-process replica, ``hold()`` queues an async commit (of a
    client of its own) that stops just before its multi, the committer thread with it;
    ``release()`` lets it go."""
    points = tmp_path / "failpoints"
    points.mkdir()
    monkeypatch.setattr(failpoints, "_DIR", str(points))
    node = Node(zk_address, str(tmp_path / "storage"), tmp_path / "replica-0", "r0").start()
    armed, reached = points / "before_commit_multi", points / "before_commit_multi.reached"

    def hold(table: str) -> None:
        tx = node.client().begin(atomicity="none", durability="async")
        tx.insert(table, rows((99, 99, "blocker")))
        reached.unlink(missing_ok=True)
        armed.touch()
        tx.commit()
        wait_until(reached.exists, 30, "the blocker to reach its multi", interval=0.01)

    def release() -> None:
        armed.unlink(missing_ok=True)

    try:
        yield node, hold, release
    finally:
        release()
        node.stop()


def test_one_clients_async_commits_get_csns_in_its_order(held) -> None:
    """Queued behind a held batch: another client's commit to table X, then this client's async
    commit A1 to X and A2 to table Y. The next batch takes the other commit and must leave A1 for
    the batch after (one keys target per batch); A2 then waits too, so A1's CSN <= A2's."""
    node, hold, release = held
    c, other = node.client(), node.client()
    x, y = new_table(c), new_table(c)
    hold(x)
    queue = node.r.committer._queue
    first = other.begin(atomicity="none")
    first.insert(x, rows((1, 1, "other")))
    t = threading.Thread(target=first.commit)
    t.start()
    wait_until(lambda: len(queue) == 1, 30, "the other client's commit to queue", interval=0.01)
    a1 = c.begin(atomicity="none", durability="async")
    a1.insert(x, rows((1, 1, "a1")))
    a2 = c.begin(atomicity="none", durability="async")
    a2.insert(y, rows((1, 1, "a2")))
    assert a1.commit() is None and a2.commit() is None  # answered while the committer is held
    assert len(queue) == 3
    assert c.commit_status(a1.id).status == "committing"
    flushed: list[object] = []
    flusher = threading.Thread(target=lambda: flushed.append(c.flush()))  # waits for both
    flusher.start()
    wait_until(lambda: node.r.async_commits.flushing == 1, 30, "the flush to wait", interval=0.01)
    release()
    t.join(30)
    flusher.join(60)
    s1, s2 = c.commit_status(a1.id), c.commit_status(a2.id)
    assert s1.status == s2.status == "committed"
    assert first.csn < s1.csn <= s2.csn == flushed[0] == c.flush()
    assert kv(c.read(x))[(1, 1)] == "a1"  # the later commit of the key won


def test_a_backlog_of_async_commits_commits_in_the_clients_order(held) -> None:
    """40 async commits of one client over three tables (some targets shared, some not) queue
    behind a held batch, with another client's commits in between; released, they commit in the
    order made (non-decreasing CSNs), more than a batch's share of one session at a time, and
    the last write of each key wins."""
    node, hold, release = held
    c, other = node.client(), node.client()
    tables = [new_table(c) for _ in range(3)]
    hold(tables[0])
    mine = []
    for i in range(40):
        table = tables[(i * i) % 3]
        tx = c.begin(atomicity="none", durability="async")
        tx.insert(table, rows((i % 2, 1, f"c{i}"), (7, i, f"c{i}")))
        assert tx.commit() is None
        mine.append((tx, table))
        if i % 10 == 0:
            o = other.begin(atomicity="none", durability="async")
            o.insert(table, rows((9, i, "other")))
            o.commit()
    assert len(node.r.committer._queue) == 44
    release()
    last = c.flush()
    csns = [c.commit_status(tx.id).csn for tx, _ in mine]
    assert csns == sorted(csns) and csns[-1] == last
    other.flush()
    for table in tables:
        expect = {}
        for i, (tx, t) in enumerate(mine):
            if t == table:
                expect[(i % 2, 1)] = f"c{i}"
                expect[(7, i)] = f"c{i}"
        got = kv(c.read(table, where=pc.field("p") < 9))
        assert got == expect


def test_commit_status_and_cleanup_while_an_async_commit_is_queued(held, tmp_path: Path) -> None:
    """While queued, an async commit is ``committing`` and cleanup keeps its files (they look old
    enough to be orphans: their transaction is still running here); once released it commits
    with them. Before its commit it was ``running``."""
    node, hold, release = held
    c = node.client()
    name = new_table(c)
    hold(name)
    tx = c.begin(atomicity="none", durability="async")
    tx.insert(name, rows((1, 1, "queued"), (2, 2, "queued")))
    assert c.commit_status(tx.id).status == "running"
    assert tx.commit() is None
    assert c.commit_status(tx.id).status == "committing"
    storage = tmp_path / "storage" / name
    mine = [p for p in storage.rglob("*") if p.name.startswith(tx.id)]
    assert mine
    old = time.time() - 3600
    for p in mine:
        os.utime(p, (old, old))
    report = c.gc(grace_seconds=5)
    assert not {r["path"] for r in report["removed"]} & {str(p.relative_to(tmp_path / "storage")) for p in mine}
    assert all(p.exists() for p in mine)
    release()
    csn = c.flush()
    status = c.commit_status(tx.id)
    assert status.status == "committed" and status.csn == csn
    assert kv(c.read(name, where=pc.field("p") < 3)) == {(1, 1): "queued", (2, 2): "queued"}


def test_a_graceful_stop_commits_the_async_commits_it_accepted(held) -> None:
    """A replica asked to stop (SIGTERM) with async commits queued commits them before it stops
    (the loss window is a crash, not a shutdown): after a restart on the same data they are
    there."""
    node, hold, release = held
    c = node.client()
    name = new_table(c)
    hold(name)
    tx = c.begin(atomicity="none", durability="async")
    tx.insert(name, rows((1, 1, "accepted before the stop")))
    assert tx.commit() is None
    replica = node.r
    stopper = threading.Thread(target=node.stop)
    stopper.start()
    wait_until(lambda: node.server is None, 30, "the server to stop serving")
    assert replica.committer._thread.is_alive()  # the replica itself waits for its async commits
    release()
    stopper.join(60)
    node.start()
    c = node.client()
    assert c.commit_status(tx.id).status == "committed"
    assert kv(c.read(name, where=pc.field("p") == 1)) == {(1, 1): "accepted before the stop"}


# ---------------------------------------------------------------------------------------------
# SIGKILL of the replica: the loss window is what was not flushed


@pytest.fixture(scope="module")
def crash_cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator:
    points = tmp_path_factory.mktemp("katom-failpoints")
    with make_cluster(
        tmp_path_factory, zk_server, "katomcrash", replicas=1, env={"MERGETXN_FAILPOINTS": str(points)}
    ) as c:
        c.failpoints = points
        yield c


def restart(cluster) -> Client:
    cluster.kill_replica(0)
    cluster.start_replica(0)
    return cluster.client(0)


def test_sigkill_keeps_what_was_flushed_and_loses_the_rest_whole(crash_cluster) -> None:
    """Flushed async commits survive a SIGKILL and restart. Commits answered but held in the
    committer (a failpoint before the multi) when the replica is killed are lost, each
    entirely: none of their rows is visible, their outcome is aborted, their part files are
    gone, and the client's next flush names them."""
    cluster = crash_cluster
    c = cluster.client(0)
    name = new_table(c)
    for i in range(4):
        tx = c.begin(atomicity="none", durability="async")
        tx.insert(name, rows((0, i, "flushed"), (1, i, "flushed")))
        tx.commit()
    flushed = c.flush()
    armed = cluster.failpoints / "before_commit_multi"
    (cluster.failpoints / "before_commit_multi.reached").unlink(missing_ok=True)
    armed.touch()
    lost = []
    try:
        for i in range(3):
            tx = c.begin(atomicity="none", durability="async")
            tx.insert(name, rows((0, i, "lost"), (2, 10 + i, "lost")))  # overwrites a flushed key too
            assert tx.commit() is None
            lost.append(tx)
        wait_until((cluster.failpoints / "before_commit_multi.reached").exists, 30, "the batch to hold")
        lost_files = {f for f in part_files(cluster, name) if any(f.split("/")[-1].startswith(t.id) for t in lost)}
        assert len(lost_files) == 6
        c2 = restart(cluster)
    finally:
        armed.unlink(missing_ok=True)
    try:
        got = kv(c2.read(name))
        assert got == {(p, i): "flushed" for p in (0, 1) for i in range(4)}
        assert c2.snapshot() >= flushed
        for tx in lost:
            assert c2.commit_status(tx.id).status == "aborted"
        assert not part_files(cluster, name) & lost_files  # deleted on restart (WAL staged records)
        # The client that made them (its connection reopened): the restarted replica never heard
        # of them, commit_status decides each, and flush names them all, once.
        with pytest.raises(TransactionAborted) as e:
            c.flush()
        assert sorted(e.value.details["ids"]) == sorted(tx.id for tx in lost)
        assert all(tx.id in e.value.message for tx in lost)
        assert c.flush() == flushed
    finally:
        c.close()
        c2.close()


def test_sigkill_during_an_async_stream_leaves_no_commit_torn(crash_cluster) -> None:
    """A client streams async commits, each writing 6 keys over 3 partitions with its number,
    and the replica is SIGKILLed while they are queued and committing. After the restart every
    commit is entirely visible or entirely absent, the client's flush names exactly the absent
    ones, and commit_status agrees with what is visible."""
    cluster = crash_cluster
    c = cluster.client(0)
    name = new_table(c)
    txs = []
    for i in range(40):  # written first, committed in a burst: they queue faster than they commit
        tx = c.begin(atomicity="none", durability="async")
        tx.insert(
            name,
            pa.Table.from_pylist(
                [{"p": p, "k": 1000 * i + j, "v": f"c{i}", "n": i} for p in range(3) for j in range(2)], schema=SCHEMA
            ),
        )
        txs.append(tx)
    for tx in txs:
        assert tx.commit() is None
    c2 = restart(cluster)
    try:
        data = c2.read(name).to_pylist()
        counts: dict[int, int] = {}
        for r in data:
            counts[r["n"]] = counts.get(r["n"], 0) + 1
        assert set(counts.values()) <= {6}, counts  # whole or absent
        present = set(counts)
        for i, tx in enumerate(txs):
            assert c2.commit_status(tx.id).status == ("committed" if i in present else "aborted")
        absent = [tx.id for i, tx in enumerate(txs) if i not in present]
        if absent:
            with pytest.raises(TransactionAborted) as e:
                c.flush()
            assert sorted(e.value.details["ids"]) == sorted(absent)
        else:
            assert c.flush() is not None
    finally:
        c.close()
        c2.close()
