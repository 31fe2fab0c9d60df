"""Transactions end to end on a real LocalCluster (real ZooKeeper, replica processes, local
storage): read-your-writes, rollback, snapshot isolation across replicas, time travel, group
commit, multi-table atomicity, epoch roll-over, mutations, overwrite/truncate, and the operator
views (parts, commit_status, transactions, kill)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from rpcproxy import RpcProxy  # tests/ is on sys.path
from support.cluster import make_cluster
from support.data import ID_V, commit_insert, id_rows, ids

import coordinator
from coordinator.core.versions import EPOCH_STRIDE, split_csn
from coordinator.errors import ConflictError, InvalidInput, TransactionAborted
from mergetxn.client import Client, Transaction
from mergetxn.local.zkserver import ZooKeeperServer
from parts.io.format import write_part
from parts.model.meta import PartMeta

pytestmark = pytest.mark.zk

SCHEMA = ID_V
PSCHEMA = pa.schema([("p", pa.int64()), ("id", pa.int64()), ("v", pa.string())])


# ---------------------------------------------------------------------------------------------
# Fixtures and helpers


@pytest.fixture(scope="module")
def cluster(zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    """One 3-replica cluster for the module (tests use distinct table names)."""
    with make_cluster(tmp_path_factory, zk_server, "txcluster", replicas=3) as c:
        yield c


def prows(p: int, ids: list[int], tag: str = "x") -> pa.Table:
    return pa.table(
        {"p": pa.array([p] * len(ids), pa.int64()), "id": pa.array(ids, pa.int64()), "v": [f"{tag}{i}" for i in ids]},
        schema=PSCHEMA,
    )


def as_set(t: pa.Table, *cols: str) -> set[tuple]:
    """Rows as a set of tuples (order of rows across parts is not part of the contract)."""
    cols = cols or tuple(t.column_names)
    return set(zip(*(t.column(c).to_pylist() for c in cols))) if t.num_rows else set()


def storage_files(cluster: coordinator.LocalCluster, table: str) -> set[str]:
    root = Path(cluster.storage_url) / table
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} if root.exists() else set()


# ---------------------------------------------------------------------------------------------
# Read your writes, rollback


def test_read_your_writes_inside_and_across_transactions(c0: Client) -> None:
    """A transaction sees its own staged rows; the same client's next transaction sees the commit."""
    c0.create_table("ryw", SCHEMA)
    tx = c0.begin()
    assert tx.read("ryw").num_rows == 0
    tx.insert("ryw", id_rows(3))
    assert ids(tx.read("ryw")) == [0, 1, 2]
    tx.insert("ryw", id_rows(2, start=10))
    assert ids(tx.read("ryw")) == [0, 1, 2, 10, 11]
    # Another transaction does not see uncommitted rows.
    other = c0.begin()
    assert other.read("ryw").num_rows == 0
    other.rollback()
    csn = tx.commit()
    assert tx.csn == csn and csn > tx.snapshot
    for k in range(3):
        with c0.transaction() as tx2:
            assert tx2.snapshot >= csn
            assert len(tx2.read("ryw")) == 5 + k
            tx2.insert("ryw", id_rows(1, start=100 + k))
        assert tx2.csn > csn
        csn = tx2.csn
        assert ids(c0.read("ryw")) == [0, 1, 2, 10, 11] + [100 + i for i in range(k + 1)]


def test_rollback_leaves_nothing(cluster: coordinator.LocalCluster, c0: Client) -> None:
    """Rolled-back parts never become visible, are not listed as parts, and their files are gone."""
    c0.create_table("rb", SCHEMA, inline_rows=0)  # follows the rolled-back part files: no inlining
    commit_insert(c0, "rb", id_rows(2))
    before_parts = c0.parts("rb").to_pylist()
    before_files = storage_files(cluster, "rb")
    tx = c0.begin()
    tx.insert("rb", id_rows(5, start=50))
    assert len(storage_files(cluster, "rb")) > len(before_files)  # the part was written
    tx.rollback()
    assert ids(c0.read("rb")) == [0, 1]
    assert c0.parts("rb").to_pylist() == before_parts
    assert storage_files(cluster, "rb") == before_files
    assert c0.commit_status(tx.tid).status == "aborted"
    with pytest.raises(TransactionAborted):
        tx.commit()


def test_context_manager_rolls_back_on_exception(cluster: coordinator.LocalCluster, c0: Client) -> None:
    c0.create_table("rbctx", SCHEMA)
    before_files = storage_files(cluster, "rbctx")
    with pytest.raises(RuntimeError, match="boom"):
        with c0.transaction() as tx:
            tx.insert("rbctx", id_rows(4))
            raise RuntimeError("boom")
    assert tx.csn is None
    assert c0.read("rbctx").num_rows == 0
    assert c0.parts("rbctx").num_rows == 0
    assert storage_files(cluster, "rbctx") == before_files
    assert c0.commit_status(tx.tid).status == "aborted"


# ---------------------------------------------------------------------------------------------
# Snapshot isolation and time travel


def test_snapshot_isolation_across_replicas(c0: Client, c1: Client) -> None:
    """A transaction begun on replica 0 never sees what replica 1 commits after its snapshot,
    even once replica 0 has applied that commit; a new transaction does."""
    c0.create_table("si", SCHEMA)
    commit_insert(c0, "si", id_rows(3))
    tx = c0.begin()
    first = tx.read("si")
    csn = commit_insert(c1, "si", id_rows(4, start=20, tag="late"))
    assert csn > tx.snapshot
    c0.wait_for(csn)
    assert c0.snapshot() >= csn
    second = tx.read("si")
    assert as_set(first) == as_set(second)
    assert ids(second) == [0, 1, 2]
    # The transaction's own writes come on top of its snapshot, still without the other commit.
    tx.insert("si", id_rows(1, start=9))
    assert ids(tx.read("si")) == [0, 1, 2, 9]
    tx.commit()
    with c0.transaction() as fresh:
        assert ids(fresh.read("si")) == [0, 1, 2, 9, 20, 21, 22, 23]


def test_commit_on_one_replica_readable_on_another_at_its_csn(
    c0: Client, c1: Client, cluster: coordinator.LocalCluster
) -> None:
    """read(snapshot=csn) on replica 0 waits until it has applied replica 1's commit."""
    c1.create_table("xrep", SCHEMA)
    csn = commit_insert(c1, "xrep", id_rows(6))
    assert ids(c0.read("xrep", snapshot=csn)) == list(range(6))
    c2 = cluster.client(2)
    assert ids(c2.read("xrep", snapshot=csn)) == list(range(6))
    # An earlier snapshot of the same table (it exists, still empty, at the commit before).
    assert c0.read("xrep", snapshot=csn - 1).num_rows == 0


def test_time_travel_by_snapshot_and_as_of(c0: Client, c1: Client) -> None:
    c0.create_table("tt", SCHEMA)
    csn1 = commit_insert(c0, "tt", id_rows(2))
    between = dt.datetime.now(dt.UTC)
    csn2 = commit_insert(c1, "tt", id_rows(2, start=2))
    with c0.transaction() as tx:
        tx.delete("tt", pc.field("id") == 0)
    csn3 = tx.csn
    assert csn1 < csn2 < csn3
    c0.wait_for(csn3)
    assert ids(c0.read("tt", snapshot=csn1)) == [0, 1]
    assert ids(c0.read("tt", snapshot=csn2)) == [0, 1, 2, 3]
    assert ids(c0.read("tt", snapshot=csn3)) == [1, 2, 3]
    assert ids(c0.read("tt")) == [1, 2, 3]
    # as_of: the snapshot of the last data-changing commit at or before the time.
    assert ids(c0.read("tt", as_of=between)) == [0, 1]
    other_zone = between.astimezone(dt.timezone(dt.timedelta(hours=5, minutes=30)))
    assert ids(c1.read("tt", as_of=other_zone)) == [0, 1]
    now = dt.datetime.now(dt.UTC)
    assert ids(c0.read("tt", as_of=now)) == [1, 2, 3]


# ---------------------------------------------------------------------------------------------
# Group commit and atomicity


def simultaneous_commits(
    cluster: coordinator.LocalCluster, table: str, n: int, start: int, overwrite: int | None = None
) -> tuple[list[Transaction], list[int | BaseException], list[Client]]:
    """``n`` transactions on replica 2, each inserting one row (ids ``start``..; transaction
    ``overwrite`` overwrites the table with its row instead), all begun before any commits, then
    committed at once from ``n`` threads (a barrier)."""
    clients = [cluster.client(2) for _ in range(n)]
    txs = [cl.begin() for cl in clients]
    for i, tx in enumerate(txs):
        (tx.overwrite if i == overwrite else tx.insert)(table, id_rows(1, start=start + i))
    barrier = threading.Barrier(n)
    outcomes: list[int | BaseException] = [RuntimeError("no outcome")] * n

    def commit(i: int) -> None:
        try:
            barrier.wait(timeout=60)
            outcomes[i] = txs[i].commit()
        except BaseException as exc:  # the caller asserts on it
            outcomes[i] = exc

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return txs, outcomes, clients


@pytest.mark.parametrize("policy", ["parts", "append"])
def test_group_commit_shares_csns(cluster: coordinator.LocalCluster, policy: str) -> None:
    """32 transactions inserting into one target at once on one replica share ZooKeeper multis:
    fewer CSNs than commits. Every commit succeeds and every row is there. Under ``parts``
    INSERTs check no target; under ``append`` they check the table's target and pass the rules
    against each other, so they share a multi too."""
    n = 32
    table = f"gc_{policy}"
    setup = cluster.client(2)
    setup.create_table(table, SCHEMA, conflict_policy=policy)
    shared_seen = False
    total = 0
    for round_no in range(3):  # a round may, rarely, not overlap; a non-batching commit never does
        txs, csns, clients = simultaneous_commits(cluster, table, n, 1000 * round_no)
        assert all(isinstance(c, int) for c in csns), csns
        total += n
        got = setup.read(table, snapshot=max(csns))
        assert got.num_rows == total
        assert set(ids(got)) >= {1000 * round_no + i for i in range(n)}
        for tx in txs:
            assert setup.commit_status(tx.tid).csn == tx.csn
        for cl in clients:
            cl.close()
        if len(set(csns)) < n:
            shared_seen = True
            break
    assert shared_seen, "no two of 32 simultaneous commits ever shared a CSN: no group commit"


def test_append_overwrite_among_simultaneous_inserts_is_serial(cluster: coordinator.LocalCluster) -> None:
    """``append``: an OVERWRITE committed at once with INSERTs replaces what committed before it;
    INSERTs sharing its multi or later stay. The result is that of a serial order: an INSERT's
    row is there exactly when its CSN is not below the OVERWRITE's."""
    setup = cluster.client(2)
    setup.create_table("ap_race", SCHEMA, conflict_policy="append")
    commit_insert(setup, "ap_race", id_rows(3, start=100))
    txs, outcomes, clients = simultaneous_commits(cluster, "ap_race", 12, 0, overwrite=5)
    assert all(isinstance(o, int) for o in outcomes), outcomes
    at = outcomes[5]
    expected = sorted(i for i, csn in enumerate(outcomes) if csn >= at)
    assert ids(setup.read("ap_race", snapshot=max(outcomes))) == expected
    assert ids(setup.read("ap_race", snapshot=at - 1))[-3:] == [100, 101, 102]
    for cl in clients:
        cl.close()


def test_simultaneous_maxcompute_inserts_one_wins(cluster: coordinator.LocalCluster) -> None:
    """Under ``maxcompute`` an INSERT fails after another INSERT committed to its target since its
    snapshot: of 8 INSERTs begun at one snapshot and committed at once (so several reach the
    committer together), exactly one commits; every other names it and leaves nothing behind."""
    setup = cluster.client(2)
    setup.create_table("mc_race", SCHEMA, conflict_policy="maxcompute")
    txs, outcomes, clients = simultaneous_commits(cluster, "mc_race", 8, 0)
    won = [(tx, o) for tx, o in zip(txs, outcomes) if isinstance(o, int)]
    assert len(won) == 1, outcomes
    winner, csn = won[0]
    for o in outcomes:
        if not isinstance(o, int):
            assert isinstance(o, ConflictError) and o.winner == winner.id, o
    assert ids(setup.read("mc_race", snapshot=csn)) == [txs.index(winner)]
    assert ids(setup.read("mc_race")) == [txs.index(winner)]
    for cl in clients:
        cl.close()


def test_multi_table_commit_is_atomic_at_one_csn(c0: Client, c1: Client) -> None:
    c0.create_table("mt_a", SCHEMA)
    c0.create_table("mt_b", PSCHEMA, partition_by=["p"])
    with c0.transaction() as tx:
        tx.insert("mt_a", id_rows(3))
        tx.insert("mt_b", pa.concat_tables([prows(1, [1, 2]), prows(2, [3])]))
    csn = tx.csn
    for table in ("mt_a", "mt_b"):
        p = c1.parts(table) if c1.snapshot() >= csn else None
        if p is None:
            c1.wait_for(csn)
            p = c1.parts(table)
        assert set(p.column("creation_csn").to_pylist()) == {csn}
        assert set(p.column("creation_tid").to_pylist()) == {tx.id}
    assert c1.read("mt_a", snapshot=csn - 1).num_rows == 0
    assert c1.read("mt_b", snapshot=csn - 1).num_rows == 0
    assert c1.read("mt_a", snapshot=csn).num_rows == 3
    assert c1.read("mt_b", snapshot=csn).num_rows == 3
    assert c1.commit_status(tx.tid).csn == csn


# ---------------------------------------------------------------------------------------------
# Epochs


@pytest.fixture
def epoch_cluster(
    zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[coordinator.LocalCluster]:
    with make_cluster(tmp_path_factory, zk_server, "epochs", replicas=2, epoch_size=3) as c:
        yield c


def test_epoch_rollover(epoch_cluster: coordinator.LocalCluster) -> None:
    """With 3 entries per epoch, ~30 commits from two replicas span many epochs: CSNs grow
    strictly per client, every row is there, old snapshots read right across epoch boundaries,
    and a replica restarted after several epochs catches up."""
    cl = [epoch_cluster.client(0), epoch_cluster.client(1)]
    cl[0].create_table("ep", SCHEMA)
    history: list[tuple[int, list[int]]] = []  # (csn, ids visible at it)
    last = {0: 0, 1: 0}
    expected: list[int] = []
    for i in range(30):
        who = i % 2
        csn = commit_insert(cl[who], "ep", id_rows(1, start=i))
        assert csn > last[who], f"CSN went backwards on client {who}: {csn} after {last[who]}"
        last[who] = csn
        expected.append(i)
        history.append((csn, list(expected)))
    csns = [c for c, _ in history]
    assert csns == sorted(csns) and len(set(csns)) == len(csns)  # commits were serial here
    epochs = {split_csn(c)[0] for c in csns}
    assert len(epochs) >= 8, f"expected many epochs with epoch_size=3, got {sorted(epochs)}"
    assert max(csns) > EPOCH_STRIDE * 8
    for who in (0, 1):
        cl[who].wait_for(max(csns))
        assert ids(cl[who].read("ep")) == expected
        for csn, want in history:
            assert ids(cl[who].read("ep", snapshot=csn)) == want, f"replica {who} at CSN {csn}"

    # Replica 1 misses several epochs, then catches up from ZooKeeper.
    epoch_cluster.stop_replica(1)
    for i in range(30, 42):
        csn = commit_insert(cl[0], "ep", id_rows(1, start=i))
        expected.append(i)
        history.append((csn, list(expected)))
    assert split_csn(history[-1][0])[0] >= split_csn(history[29][0])[0] + 3
    epoch_cluster.start_replica(1)
    fresh = epoch_cluster.client(1)
    assert ids(fresh.read("ep", snapshot=history[-1][0])) == expected
    assert fresh.snapshot() >= history[-1][0]
    for csn, want in history[::5]:
        assert ids(fresh.read("ep", snapshot=csn)) == want
    # And it commits into the current epoch.
    csn = commit_insert(fresh, "ep", id_rows(1, start=99))
    assert csn > history[-1][0]
    assert ids(cl[0].read("ep", snapshot=csn)) == expected + [99]


# ---------------------------------------------------------------------------------------------
# Mutations, overwrite, truncate


def test_update_and_delete_with_expressions(c0: Client, c1: Client) -> None:
    schema = pa.schema([("id", pa.int64()), ("n", pa.int64()), ("v", pa.string())])
    c0.create_table("mut", schema)
    data = pa.table(
        {"id": list(range(10)), "n": [i * 10 for i in range(10)], "v": [f"s{i}" for i in range(10)]}, schema=schema
    )
    commit_insert(c0, "mut", data)
    with c0.transaction() as tx:
        assert tx.delete("mut", pc.field("id") >= 7) == 3
        assert ids(tx.read("mut")) == list(range(7))
        n = tx.update("mut", pc.field("id").isin([0, 2, 4, 6]), {"n": pc.field("n") + pc.field("id"), "v": "even"})
        assert n == 4  # 0, 2, 4, 6
        assert tx.update("mut", pc.field("id") > 100, {"v": "nobody"}) == 0
        assert tx.delete("mut", pc.field("v") == "nothing-matches") == 0
    got = {r["id"]: (r["n"], r["v"]) for r in c1.read("mut", snapshot=tx.csn).to_pylist()}
    assert got == {
        0: (0, "even"),
        1: (10, "s1"),
        2: (22, "even"),
        3: (30, "s3"),
        4: (44, "even"),
        5: (50, "s5"),
        6: (66, "even"),
    }
    # A null-aware predicate and setting null.
    with c0.transaction() as tx2:
        tx2.update("mut", pc.field("id") == 1, {"v": None})
        tx2.delete("mut", pc.field("v").is_null())
    assert ids(c0.read("mut")) == [0, 2, 3, 4, 5, 6]
    # The earlier snapshot is untouched by the later mutations.
    assert len(c0.read("mut", snapshot=tx.csn)) == 7


def test_overwrite_partitions(c0: Client) -> None:
    c0.create_table("ow", PSCHEMA, partition_by=["p"])
    commit_insert(c0, "ow", pa.concat_tables([prows(1, [1, 2]), prows(2, [3, 4]), prows(3, [5])]))
    with c0.transaction() as tx:
        tx.overwrite("ow", prows(2, [40], tag="new"), partitions=[2])
    got = as_set(c0.read("ow"), "p", "id", "v")
    assert got == {(1, 1, "x1"), (1, 2, "x2"), (2, 40, "new40"), (3, 5, "x5")}
    # Without partitions: the partitions present in the data are replaced, the rest stays.
    with c0.transaction() as tx:
        tx.overwrite("ow", pa.concat_tables([prows(1, [10]), prows(4, [11])]))
    got = as_set(c0.read("ow"), "p", "id")
    assert got == {(1, 10), (2, 40), (3, 5), (4, 11)}
    # Overwriting a partition with nothing empties just it.
    with c0.transaction() as tx:
        tx.overwrite("ow", PSCHEMA.empty_table(), partitions=[3])
    assert as_set(c0.read("ow"), "p", "id") == {(1, 10), (2, 40), (4, 11)}
    # Unpartitioned: overwrite replaces everything, inside the transaction too.
    c0.create_table("ow_flat", SCHEMA)
    commit_insert(c0, "ow_flat", id_rows(5))
    with c0.transaction() as tx:
        tx.overwrite("ow_flat", id_rows(2, start=70))
        assert ids(tx.read("ow_flat")) == [70, 71]
    assert ids(c0.read("ow_flat")) == [70, 71]


def test_truncate(c0: Client) -> None:
    c0.create_table("tr", PSCHEMA, partition_by=["p"])
    commit_insert(c0, "tr", pa.concat_tables([prows(1, [1]), prows(2, [2, 3]), prows(3, [4])]))
    with c0.transaction() as tx:
        assert tx.truncate("tr", partitions=[2]) == 1
        assert as_set(tx.read("tr"), "p", "id") == {(1, 1), (3, 4)}
    assert as_set(c0.read("tr"), "p", "id") == {(1, 1), (3, 4)}
    with c0.transaction() as tx2:
        tx2.truncate("tr")
        assert tx2.read("tr").num_rows == 0
        tx2.insert("tr", prows(5, [9]))  # a write after the truncate in the same transaction survives
    assert as_set(c0.read("tr"), "p", "id") == {(5, 9)}
    assert as_set(c0.read("tr", snapshot=tx.csn), "p", "id") == {(1, 1), (3, 4)}


# ---------------------------------------------------------------------------------------------
# Operator views


def test_parts_columns_after_insert_and_delete(c0: Client) -> None:
    c0.create_table("pv", PSCHEMA, partition_by=["p"])
    with c0.transaction() as ins:
        ins.insert("pv", pa.concat_tables([prows(1, [1, 2, 3]), prows(2, [4])]))
    p = c0.parts("pv")
    for col in ("name", "partition", "rows", "creation_tid", "creation_csn", "removal_tid", "removal_csn", "visible"):
        assert col in p.column_names
    recs = {json.loads(r["partition"])[0]: r for r in p.to_pylist()}
    assert set(recs) == {1, 2}
    assert recs[1]["rows"] == 3 and recs[2]["rows"] == 1
    for r in recs.values():
        assert r["creation_tid"] == ins.id
        assert r["creation_csn"] == ins.csn
        assert r["removal_tid"] is None and r["removal_csn"] is None
        assert r["visible"] is True

    with c0.transaction() as dl:
        assert dl.delete("pv", pc.field("id") == 2) == 1
    after = {r["name"]: r for r in c0.parts("pv").to_pylist()}
    old1, old2 = recs[1]["name"], recs[2]["name"]
    assert after[old1]["removal_tid"] == dl.id
    assert after[old1]["removal_csn"] == dl.csn
    assert after[old1]["visible"] is False
    assert after[old2] == recs[2]  # untouched part of the other partition
    new = [r for n, r in after.items() if n not in (old1, old2)]
    assert len(new) == 1
    assert new[0]["rows"] == 2 and json.loads(new[0]["partition"]) == [1]
    assert new[0]["creation_tid"] == dl.id and new[0]["creation_csn"] == dl.csn
    assert new[0]["visible"] is True and new[0]["removal_csn"] is None
    assert sum(r["rows"] for r in after.values() if r["visible"]) == c0.read("pv").num_rows == 3


def test_commit_status_and_transactions_and_kill(c0: Client, c1: Client) -> None:
    c0.create_table("ops", SCHEMA)
    done = c0.begin()
    done.insert("ops", id_rows(1))
    done.commit()
    aborted = c0.begin()
    aborted.insert("ops", id_rows(1, start=5))
    aborted.rollback()
    running = c0.begin()
    running.insert("ops", id_rows(2, start=10))

    st = c0.commit_status(done.tid)
    assert (st.status, st.csn) == ("committed", done.csn)
    c1.wait_for(done.csn)
    assert c1.commit_status(done.tid).csn == done.csn  # every replica knows from the log
    assert c0.commit_status(aborted.tid).status == "aborted"
    assert c0.commit_status(aborted.tid).csn is None
    assert c0.commit_status(running.tid).status == "running"
    assert c0.commit_status(str(running.tid)).status == "running"

    listed = {t["id"]: t for t in c0.transactions()}
    assert running.id in listed
    assert listed[running.id]["snapshot"] == running.snapshot
    assert listed[running.id]["rows"] == 2
    assert done.id not in listed and aborted.id not in listed

    victim = c0.begin()
    victim.insert("ops", id_rows(3, start=20))
    c0.kill(victim.id)
    assert victim.id not in {t["id"] for t in c0.transactions()}
    with pytest.raises(TransactionAborted, match="killed"):
        victim.commit()
    assert c0.commit_status(victim.tid).status == "aborted"
    running.commit()
    assert ids(c0.read("ops")) == [0, 10, 11]


def test_transaction_handle_fields(c0: Client) -> None:
    """tid is a (start_csn, local_counter, host_id) named tuple; id names it; snapshot is the start."""
    tx: Transaction = c0.begin()
    try:
        assert isinstance(tx.tid, coordinator.Tid)
        assert tx.tid.start_csn == tx.snapshot
        assert tx.tid.host_id == c0.host_id
        assert coordinator.Tid.parse(tx.id) == tx.tid
        other = c0.begin()
        assert other.tid.local_counter != tx.tid.local_counter
        other.rollback()
    finally:
        tx.rollback()


# ---------------------------------------------------------------------------------------------
# One-call commits of parts already in storage (client.commit_parts)


def written(client: Client, table: str, data: pa.Table, partition: tuple = (), by: str = "job-1") -> PartMeta:
    tdef = client.table(table)
    return write_part(client.storage, table, list(tdef.partition_by), partition, data, by)


def test_commit_parts_is_one_atomic_transaction(cluster: coordinator.LocalCluster, c0: Client, c1: Client) -> None:
    """Parts written beforehand become visible together at the CSN the call returns, on every
    replica, as the parts of one transaction (its id is their creation_tid)."""
    c1.wait_for(c0.create_table("cparts", SCHEMA))
    metas = [written(c0, "cparts", id_rows(2)), written(c0, "cparts", id_rows(3, start=10))]
    csn = c1.commit_parts("cparts", metas)
    c0.wait_for(csn)
    for client in (c0, c1):
        assert ids(client.read("cparts", snapshot=csn)) == [0, 1, 10, 11, 12]
        assert client.read("cparts", snapshot=csn - 1).num_rows == 0
    parts = c0.parts("cparts").to_pylist()
    assert {p["name"] for p in parts} == {m.name for m in metas}
    tids = {p["creation_tid"] for p in parts}
    assert len(tids) == 1 and {p["creation_csn"] for p in parts} == {csn}
    (tid,) = tids
    assert c0.commit_status(tid).status == "committed" and c0.commit_status(tid).csn == csn
    assert c1._part_status("cparts", metas[0].name).csn == csn
    assert c1._part_status("cparts", "never_0123456789abcdef").status == "aborted"
    assert c1.commit_parts("cparts", []) == c1.snapshot()  # nothing to commit: the snapshot


def test_commit_parts_overwrite_replaces_what_its_snapshot_sees(c0: Client) -> None:
    c0.create_table("cparts_ow", PSCHEMA, partition_by=["p"])
    commit_insert(c0, "cparts_ow", pa.concat_tables([prows(1, [1, 2]), prows(2, [3])]))
    csn = c0.commit_parts("cparts_ow", [written(c0, "cparts_ow", prows(1, [7]), (1,))], op="overwrite")
    assert as_set(c0.read("cparts_ow", snapshot=csn), "p", "id") == {(1, 7), (2, 3)}
    csn = c0.commit_parts(
        "cparts_ow", [written(c0, "cparts_ow", prows(1, [8]), (1,))], op="overwrite", partitions=[1, 2]
    )
    assert as_set(c0.read("cparts_ow", snapshot=csn), "p", "id") == {(1, 8)}
    before = c0.snapshot()
    stray = written(c0, "cparts_ow", prows(3, [9]), (3,))
    with pytest.raises(InvalidInput, match="outside the partitions given"):
        c0.commit_parts("cparts_ow", [stray], op="overwrite", partitions=[1])
    with pytest.raises(InvalidInput, match="op must be"):
        c0.commit_parts("cparts_ow", [stray], op="delete")
    assert c0.snapshot() == before


def test_commit_parts_refused_changes_nothing_and_leaves_the_callers_files(
    cluster: coordinator.LocalCluster, c0: Client
) -> None:
    """A refused one-call commit makes nothing visible, and the files it was handed stay: they are
    the caller's (a refusal deleted a caller's valid part); cleanup collects what no
    commit names once older than the grace period."""
    c0.create_table("cparts_bad", SCHEMA)
    before = c0.snapshot()
    good = written(c0, "cparts_bad", id_rows(1))
    bad = dataclasses.replace(written(c0, "cparts_bad", id_rows(1, start=5)), checksum="md5:nope")
    with pytest.raises(InvalidInput, match="checksum"):  # a caller's descriptor: bad input, not corrupt data
        c0.commit_parts("cparts_bad", [good, bad])
    assert c0.snapshot() == before and c0.read("cparts_bad").num_rows == 0
    files = {str(Path(m.path).relative_to("cparts_bad")) for m in (good, bad)}
    assert files <= storage_files(cluster, "cparts_bad")
    stale = dataclasses.replace(written(c0, "cparts_bad", id_rows(1)), created_at=time.time() - 3600)
    with pytest.raises(InvalidInput, match="grace period"):
        c0.commit_parts("cparts_bad", [stale])
    assert c0.snapshot() == before
    assert str(Path(stale.path).relative_to("cparts_bad")) in storage_files(cluster, "cparts_bad")
    c0.create_table("cparts_other", SCHEMA)
    with pytest.raises(InvalidInput, match="do not belong"):
        c0.commit_parts("cparts_bad", [written(c0, "cparts_other", id_rows(1))])
    assert c0.snapshot() > before and c0.read("cparts_bad").num_rows == 0
    c0.commit_parts("cparts_bad", [good])  # the caller's part, still there, commits later
    assert c0.read("cparts_bad").num_rows == 1


def test_old_parts_are_staged_only_under_their_transactions_name(c0: Client) -> None:
    """Cleanup keeps a running transaction's files by the tid in their names; a part written long
    ago under another name could be collected around its commit, so staging it is refused."""
    c0.create_table("stale_parts", SCHEMA)
    long_ago = time.time() - 3600
    with c0.transaction() as tx:
        foreign = dataclasses.replace(written(c0, "stale_parts", id_rows(1), by="job-7"), created_at=long_ago)
        with pytest.raises(InvalidInput, match=f"does not carry transaction {tx.id}"):
            tx.add_parts("stale_parts", [foreign])
        own = dataclasses.replace(written(c0, "stale_parts", id_rows(2, start=5), by=tx.id), created_at=long_ago)
        tx.add_parts("stale_parts", [own])  # a long job's part, kept by its running transaction's name
    assert ids(c0.read("stale_parts", snapshot=tx.csn)) == [5, 6]


@pytest.mark.parametrize("op", ["insert", "overwrite"])  # answered on the I/O thread / a worker
@pytest.mark.parametrize("fault", ["reply", "request"])
def test_commit_parts_answer_lost_is_looked_up_by_part(
    cluster: coordinator.LocalCluster, c0: Client, fault: str, op: str
) -> None:
    """The connection breaks during the one call: after the replica committed ('reply': the
    answer is lost), or before it heard of it ('request'). The caller gets the CSN, or a
    TransactionAborted with its files left to it; never "unknown". The same call sent again
    after the commit is answered with that commit's CSN and changes nothing (a part is committed
    at most once: snapshots never change)."""
    t = f"cparts_lost_{fault}_{op}"
    c0.create_table(t, SCHEMA)
    with RpcProxy(cluster.replica_addresses[0]) as proxy:
        client = coordinator.connect(proxy.address)
        metas = [written(client, t, id_rows(2))]
        fired = proxy.drop_reply_of("commit_parts") if fault == "reply" else proxy.drop_request_of("commit_parts")
        if fault == "reply":
            csn = client.commit_parts(t, metas, op=op)
            assert fired.is_set()
            assert ids(c0.read(t, snapshot=csn)) == [0, 1]
            assert client.commit_parts(t, metas, op=op) == csn  # the retry of a job that lost the answer
            parts = c0.parts(t).to_pylist()
            assert [(p["name"], p["creation_csn"]) for p in parts] == [(metas[0].name, csn)]
            assert ids(c0.read(t, snapshot=csn)) == [0, 1] and ids(c0.read(t)) == [0, 1]
        else:
            with pytest.raises(TransactionAborted, match="did not happen"):
                client.commit_parts(t, metas, op=op)
            assert fired.is_set()
            assert c0.read(t).num_rows == 0
            assert (Path(cluster.storage_url) / metas[0].path).exists()  # the caller's file
        client.close()


# ---------------------------------------------------------------------------------------------
# One-call inserts (client.insert)


def test_client_insert_is_one_transaction_in_one_call(
    cluster: coordinator.LocalCluster, c0: Client, c1: Client
) -> None:
    """client.insert writes the rows and commits them as a transaction of its own: visible
    together at the CSN it returns, on every replica, one creation tid per call; no rows commit
    nothing; a keys table's rows go by key."""
    c1.wait_for(c0.create_table("ins1", PSCHEMA, partition_by=["p"]))
    csn = c0.insert("ins1", pa.concat_tables([prows(1, [1, 2]), prows(2, [3])]))
    c1.wait_for(csn)
    for client in (c0, c1):
        assert as_set(client.read("ins1", snapshot=csn), "p", "id") == {(1, 1), (1, 2), (2, 3)}
        assert client.read("ins1", snapshot=csn - 1).num_rows == 0
    parts = c0.parts("ins1").to_pylist()
    assert len(parts) == 2 and {p["creation_csn"] for p in parts} == {csn}
    (tid,) = {p["creation_tid"] for p in parts}
    assert c1.commit_status(tid).status == "committed" and c1.commit_status(tid).csn == csn
    assert c0.insert("ins1", prows(1, [])) == c0.snapshot()  # no rows: nothing written or committed
    assert len(c0.parts("ins1")) == 2
    keys = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
    c0.create_table("ins1_keys", keys, primary_key=["id"], conflict_policy="keys")
    c0.insert("ins1_keys", id_rows(2).cast(keys))
    csn = c0.insert("ins1_keys", id_rows(1, tag="w").cast(keys))
    assert sorted(c0.read("ins1_keys", snapshot=csn).to_pylist(), key=lambda r: r["id"]) == [
        {"id": 0, "v": "w0"},
        {"id": 1, "v": "v1"},
    ]


def test_client_insert_refused_changes_nothing_and_leaves_no_files(
    cluster: coordinator.LocalCluster, c0: Client, c1: Client
) -> None:
    """A refused one-call insert makes nothing visible and deletes the files it wrote (nothing
    names them); written for a definition a DDL replaced since the client looked it up, it looks
    the table up again and commits under the new one."""
    c0.create_table("ins_bad", SCHEMA, txn_max_rows=2, inline_rows=0)  # follows the part files: no inlining
    before = c0.snapshot()
    with pytest.raises(TransactionAborted, match="txn_max_rows"):
        c0.insert("ins_bad", id_rows(3))
    assert c0.snapshot() == before and c0.read("ins_bad").num_rows == 0
    assert not storage_files(cluster, "ins_bad")
    assert c0.insert("ins_bad", id_rows(2)) > before
    c1.wait_for(c0.snapshot())
    c1.table("ins_bad")  # cached by c1 ...
    c0.alter_table("ins_bad", add_columns=[pa.field("extra", pa.int64())])  # ... and replaced here
    csn = c1.insert("ins_bad", id_rows(1, start=7))
    rows = {r["id"]: r for r in c0.read("ins_bad", snapshot=max(csn, c0.snapshot())).to_pylist()}
    assert set(rows) == {0, 1, 7} and rows[7]["extra"] is None
    names = {p["name"] for p in c0.parts("ins_bad").to_pylist()}
    assert {Path(f).name.rsplit(".", 1)[0] for f in storage_files(cluster, "ins_bad")} == names


@pytest.mark.parametrize("fault", ["reply", "request"])
def test_client_insert_answer_lost_is_looked_up(cluster: coordinator.LocalCluster, c0: Client, fault: str) -> None:
    """The connection breaks during client.insert: after the replica committed ('reply'), or
    before it heard of it ('request'). The caller gets the CSN (the rows committed once), or
    TransactionAborted (nothing visible); never "unknown"."""
    t = f"ins_lost_{fault}"
    c0.create_table(t, SCHEMA)
    with RpcProxy(cluster.replica_addresses[0]) as proxy:
        client = coordinator.connect(proxy.address)
        client.table(t)
        fired = proxy.drop_reply_of("commit_parts") if fault == "reply" else proxy.drop_request_of("commit_parts")
        if fault == "reply":
            csn = client.insert(t, id_rows(2))
            assert fired.is_set()
            assert ids(c0.read(t, snapshot=csn)) == [0, 1] and ids(c0.read(t)) == [0, 1]
            assert [p["creation_csn"] for p in c0.parts(t).to_pylist()] == [csn]
        else:
            with pytest.raises(TransactionAborted, match="did not happen"):
                client.insert(t, id_rows(2))
            assert fired.is_set()
            assert c0.read(t).num_rows == 0
        client.close()


@pytest.mark.parametrize("fault", ["reply", "request"])
def test_commit_answer_lost_between_client_and_replica(
    cluster: coordinator.LocalCluster, c0: Client, fault: str
) -> None:
    """The client's connection to its replica breaks during tx.commit(): after the replica
    committed (the answer is lost), or before it read the request. The caller gets the CSN, or
    TransactionAborted, and then the transaction is over on the replica too (not left running,
    able to commit later), its files gone."""
    t = f"commit_lost_{fault}"
    c0.create_table(t, SCHEMA)
    with RpcProxy(cluster.replica_addresses[0]) as proxy:
        client = coordinator.connect(proxy.address)
        tx = client.begin()
        tx.insert(t, id_rows(3))
        fired = proxy.drop_reply_of("commit") if fault == "reply" else proxy.drop_request_of("commit")
        if fault == "reply":
            csn = tx.commit()
            assert fired.is_set() and ids(c0.read(t, snapshot=csn)) == [0, 1, 2]
        else:
            with pytest.raises(TransactionAborted, match="did not commit"):
                tx.commit()
            assert fired.is_set()
            assert c0.commit_status(tx.id).status == "aborted"
            assert tx.id not in {d["id"] for d in c0.transactions() if d["state"] == "running"}
            assert c0.read(t).num_rows == 0 and not storage_files(cluster, t)
        client.close()


@pytest.mark.parametrize("fault", ["reply", "request"])
def test_create_table_answer_lost_is_looked_up(cluster: coordinator.LocalCluster, c0: Client, fault: str) -> None:
    """Table creation is a commit too: when the connection breaks during it, the client finds
    out whether the table exists as asked (creating it if the request never arrived)."""
    t = f"create_lost_{fault}"
    with RpcProxy(cluster.replica_addresses[0]) as proxy:
        client = coordinator.connect(proxy.address)
        fired = proxy.drop_reply_of("create_table") if fault == "reply" else proxy.drop_request_of("create_table")
        csn = client.create_table(t, SCHEMA)
        assert fired.is_set()
        c0.wait_for(csn)
        assert c0.table(t).created_csn == csn and c0.table(t).schema == SCHEMA
        # The same name asked again with another schema, the request lost: refused, not "unknown".
        proxy.drop_request_of("create_table")
        with pytest.raises(InvalidInput, match="already exists"):
            client.create_table(t, PSCHEMA)
        assert c0.table(t).schema == SCHEMA
        client.close()


def test_begin_answer_lost_leaves_one_transaction(cluster: coordinator.LocalCluster, c0: Client) -> None:
    """The answer to begin is lost and the client sends it again: the replica answers with the
    transaction it began the first time, so no transaction is left running unseen (holding
    cleanup and the log tail back until its time limit)."""
    t = "begin_lost"
    c0.create_table(t, SCHEMA)

    def running() -> set[str]:
        return {d["id"] for d in c0.transactions() if d["state"] == "running"}

    before = running()
    with RpcProxy(cluster.replica_addresses[0]) as proxy:
        client = coordinator.connect(proxy.address)
        fired = proxy.drop_reply_of("begin")
        tx = client.begin()
        assert fired.is_set()
        assert running() - before == {tx.id}
        tx.insert(t, id_rows(2))
        csn = tx.commit()
        client.close()
    assert ids(c0.read(t, snapshot=csn)) == [0, 1]
    assert running() - before == set()
    # A token names one begin: the same token answers the same transaction, another a new one.
    first = c0.call("begin", token="begin-lost-token")
    assert c0.call("begin", token="begin-lost-token") == first
    other = c0.call("begin", token="another-token")
    assert other["id"] != first["id"]
    for r in (first, other):
        c0.call("rollback", id=r["id"])
    with pytest.raises(InvalidInput, match="token"):
        c0.call("begin", token=7)
