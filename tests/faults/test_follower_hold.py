"""A commit that meets another replica's DDL it has not applied yet catches up by itself.

The committer's multi is refused when a table node moved (``TableMoved``: a DDL since the
definition it decided on); it must then apply the log up to that DDL and decide again. It did
that inside ``Follower.local_commit``, where the follower holds off (a local commit hands its own
entry over) and so did the catch-up's own pull: the entry was applied only if the follower
thread had read it before the commit began, else the commit waited ``read_wait_seconds`` (30 s)
and was aborted. A follower that watches the next position after every own entry mostly got
there first; one that lingers after its own entries (measured with
benchmarks/commit_throughput.py) stalled ``integration/test_table_lifecycle.py::
test_a_transaction_begun_before_an_alter_still_commits`` so. Here r0's follower thread is held
at a failpoint (replicas/failpoints.py) from before the other replica's ALTER until after the
commit: the commit must succeed without it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from support.cluster import environ, make_cluster  # tests/ is on sys.path
from support.data import ID_V, id_rows
from support.waiting import wait_until

from coordinator import LocalCluster
from mergetxn.local.zkserver import ZooKeeperServer


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator[LocalCluster]:
    with make_cluster(
        tmp_path_factory, zk_server, "follower_hold", replicas=2, settings={"merge_interval": 0, "gc_interval": 0}
    ) as c:
        yield c


def test_a_commit_meeting_another_replicas_alter_catches_up_with_its_follower_held(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    failpoints = tmp_path / "failpoints"
    failpoints.mkdir()
    cluster.stop_replica(0)
    with environ({"MERGETXN_FAILPOINTS": str(failpoints)}):
        cluster.start_replica(0)
    c0, c1 = cluster.client(0), cluster.client(1)
    c0.create_table("held", ID_V, auto_merge=False)
    tx = c0.begin()
    tx.insert("held", id_rows(2))
    armed = failpoints / "follower_loop"
    armed.touch()
    try:
        wait_until((failpoints / "follower_loop.reached").exists, 30, "r0's follower thread to hold")
        c1.alter_table("held", add_columns=[pa.field("extra", pa.string())], rename_columns={"v": "w"})
        tx.commit()  # r0 has not applied the ALTER: its multi is refused, it catches up and decides again
    finally:
        armed.unlink(missing_ok=True)
    assert c0.read("held").to_pylist() == [{"id": 0, "w": "v0", "extra": None}, {"id": 1, "w": "v1", "extra": None}]
