"""A replica that stood still (SIGSTOP: a long GC pause, a frozen VM) serves nothing stale.

Found by `mergetxn chaos` (single form, seeds 7 and 11): while a replica was frozen past its session
timeout, its alive node vanished and cleanup on another replica deleted parts that the frozen
replica's running transaction and its latest snapshot still saw. When it ran again it answered at
once, from memory: the running transaction's reads, a new transaction's reads and a plain read all
failed with ``CorruptPart`` ("missing from storage") instead of the transaction being aborted
(docs/rules.md#client-sessions: an expired session aborts that replica's running transactions) and
new reads seeing the current state. replicas/pauses.py closes a gate after such a gap until the
session is made sure of and the log caught up.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support.cluster import make_cluster  # tests/ is on sys.path
from support.waiting import poll, wait_until
from support.zk import kazoo

from coordinator import LocalCluster
from coordinator.errors import TransactionAborted
from mergetxn.local.zkserver import ZooKeeperServer

pytestmark = pytest.mark.slow

SCHEMA = pa.schema([("k", pa.int64())])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator[LocalCluster]:
    with make_cluster(
        tmp_path_factory,
        zk_server,
        "pauses",
        replicas=2,
        session_timeout=2.0,
        # inline_rows 0: what cleanup takes here are part files; an inlined part has none
        settings={"gc_interval": 0, "merge_interval": 0, "inline_rows": 0},
    ) as c:
        yield c


def test_a_replica_back_from_a_long_pause_serves_nothing_that_cleanup_took(cluster: LocalCluster) -> None:
    a, b = cluster.client(0), cluster.client(1)
    a.create_table("t", SCHEMA, auto_merge=False)
    with a.transaction() as tx:
        tx.insert("t", pa.table({"k": [1, 2]}, schema=SCHEMA))
    b.wait_for(a.snapshot())
    running = a.begin()
    assert running.read("t").num_rows == 2
    cluster.pause_replica(0)
    try:
        with b.transaction() as t2:
            t2.delete("t", pc.field("k") == 1)  # rewrites the part r0 still sees
        with kazoo(cluster.zk_address) as zk:
            wait_until(
                lambda: zk.exists(f"{cluster.root}/replicas/r0/alive") is None,
                30,
                "r0's session to expire while it is frozen",
            )
        removed = b.gc(grace_seconds=0)["removed"]
        assert any(r["path"].endswith(".parquet") for r in removed), "cleanup took nothing: no fault happened"
    finally:
        cluster.resume_replica(0)
    with pytest.raises(TransactionAborted):
        running.read("t")
    with a.transaction() as fresh:
        assert fresh.read("t").column("k").to_pylist() == [2]
    assert a.read("t").column("k").to_pylist() == [2]
    assert a.call("info")["pauses"] >= 1


def test_a_new_session_counts_only_once_the_old_sessions_transactions_are_aborted(zk_address: str, tmp_path) -> None:
    """After a lost session, the replica is back (``zk_session.lost`` cleared, which the pause
    guard waits for) only once every transaction of the old session is aborted, however long
    aborting one takes (here: its lock held by a statement in progress)."""
    from kazoo.client import KazooState

    from coordinator.model.records import TxnState
    from replicas.replica import Replica
    from replicas.settings import ReplicaConfig

    r = Replica(
        ReplicaConfig(
            zk=zk_address,
            storage_url=str(tmp_path / "storage"),
            host_id="lost0",
            data_dir=tmp_path / "replica",
            merge_interval=0,
            gc_interval=0,
        )
    )
    r.start()
    try:
        txn = r.transactions.begin()
        before = r.incarnation
        txn.lock.acquire()  # a statement of it in progress: its abort waits for this
        try:
            r._on_zk_state(KazooState.LOST)
            r._on_zk_state(KazooState.CONNECTED)  # re-registers in a thread
            wait_until(lambda: r.incarnation != before, 10, "the new registration")
            # Registered, the old transaction not yet aborted: not back (a second's look).
            assert not poll(lambda: not r.zk_session.lost.is_set(), timeout=1.0, interval=0.05), (
                "back before the old session's transaction was aborted"
            )
        finally:
            txn.lock.release()
        wait_until(lambda: not r.zk_session.lost.is_set(), 10, "back once the transaction is aborted")
        assert txn.state == TxnState.ABORTED
    finally:
        r.stop()
