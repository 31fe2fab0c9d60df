"""A replica that stood still (SIGSTOP: a long GC pause, a frozen VM) serves nothing stale.

Found by `mergetxn chaos` (single form, seeds 7 and 11): while a replica was frozen past its
session timeout, its alive node vanished and cleanup on another replica deleted parts that the
frozen replica's running transaction and its latest snapshot still saw. When it ran again it
answered at once, from memory: the running transaction's reads, a new transaction's reads and a
plain read all failed with ``CorruptPart`` ("missing from storage") instead of the transaction
being aborted (SPEC: an expired session aborts that replica's running transactions) and new
reads seeing the current state. replicas/pauses.py closes a gate after such a gap until the
session is made sure of and the log caught up.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support.cluster import make_cluster  # tests/ is on sys.path
from support.waiting import wait_until
from support.zk import kazoo

from coordinator import LocalCluster
from coordinator.errors import TransactionAborted
from mergetxn.zkserver import ZooKeeperServer

pytestmark = pytest.mark.slow

SCHEMA = pa.schema([("k", pa.int64())])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator[LocalCluster]:
    with make_cluster(tmp_path_factory, zk_server, "pauses", replicas=2, session_timeout=2.0,
                      settings={"gc_interval": 0, "merge_interval": 0}) as c:
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
            wait_until(lambda: zk.exists(f"{cluster.root}/replicas/r0/alive") is None, 30,
                       "r0's session to expire while it is frozen")
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
