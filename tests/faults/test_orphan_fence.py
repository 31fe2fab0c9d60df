"""No acknowledged commit's data is ever deleted by cleanup (coordinator/zk/orphan_fence.py).

Cleanup takes a part file for an orphan when it is older than the grace period and no alive
replica published its transaction as running. A replica that stalls (SIGSTOP here: a long GC
pause or a frozen VM does the same) before it published a transaction can come back and commit
it. Each test makes cleanup on the other replica collect the file while the owner is frozen,
then lets the owner go on, and asserts the guarantee: the commit is refused (TransactionAborted,
nothing visible) and every replica still reads the table. Without the fence the commit returned
a CSN and every later read failed with CorruptPart ("... is missing").

File ages are set with os.utime (cleanup reads mtimes from the listing), so nothing here waits
for the grace period to pass.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from support.cluster import make_cluster  # tests/ is on sys.path
from support.failpoints import commit_held_at_multi
from support.zk import kazoo

from coordinator import LocalCluster
from coordinator.errors import InvalidInput, TransactionAborted
from mergetxn.local.zkserver import ZooKeeperServer
from parts.io.format import write_part
from parts.io.storage import Storage

pytestmark = pytest.mark.slow

SCHEMA = pa.schema([("id", pa.int64())])
HOUR_AGO = time.time() - 3600


@pytest.fixture(scope="module")
def failpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("failpoints")


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer, failpoints: Path
) -> Iterator[LocalCluster]:
    """Two replicas, nothing in the background (cleanup runs when a test asks), failpoints on."""
    with make_cluster(
        tmp_path_factory,
        zk_server,
        "fence",
        replicas=2,
        # inline_rows 0: the fence is about staged part files; an inlined part has none
        settings={"gc_interval": 0, "merge_interval": 0, "inline_rows": 0},
        env={"MERGETXN_FAILPOINTS": str(failpoints)},
    ) as c:
        yield c


def staged_files(cluster: LocalCluster, table: str, tid: str) -> list[str]:
    return [p for p in Storage(cluster.storage_url).list(f"{table}/") if tid in p]


def age(cluster: LocalCluster, paths: list[str]) -> None:
    for p in paths:
        os.utime(Path(cluster.storage_url) / p, (HOUR_AGO, HOUR_AGO))


def collect(cluster: LocalCluster, paths: list[str]) -> None:
    """A cleanup pass on replica 1 that must delete ``paths`` (else the fault did not happen)."""
    report = cluster.client(1).gc(grace_seconds=0)
    removed = {r["path"] for r in report["removed"]}
    kept = {r["path"]: r["reason"] for r in report["kept"]}
    missing = [p for p in paths if p not in removed]
    assert not missing, f"cleanup did not collect {missing}: {[kept.get(p) for p in missing]}"


def assert_readable(cluster: LocalCluster, table: str, ids: list[int]) -> None:
    for i in range(cluster.n):
        got = sorted(cluster.client(i).read(table).column("id").to_pylist())
        assert got == ids, f"replica {i}"


def test_stall_between_staging_and_commit(cluster: LocalCluster) -> None:
    t = "fence_stall_staged"
    c0 = cluster.client(0)
    c0.create_table(t, SCHEMA)
    with c0.transaction() as tx:
        tx.insert(t, pa.table({"id": [1]}, schema=SCHEMA))
    tx = c0.begin()
    tx.insert(t, pa.table({"id": [2]}, schema=SCHEMA))  # written and staged
    cluster.pause_replica(0)  # before the replica publishes the transaction as running (1 s)
    try:
        files = staged_files(cluster, t, tx.id)
        assert len(files) == 2  # the part and its sidecar
        age(cluster, files)
        collect(cluster, files)
    finally:
        cluster.resume_replica(0)
    with pytest.raises(TransactionAborted, match="cannot commit"):
        tx.commit()
    assert_readable(cluster, t, [1])


def test_stall_during_the_commit(cluster: LocalCluster, failpoints: Path) -> None:
    t = "fence_stall_commit"
    c0 = cluster.client(0)
    c0.create_table(t, SCHEMA)
    tx = c0.begin()
    tx.insert(t, pa.table({"id": [7]}, schema=SCHEMA))
    with commit_held_at_multi(failpoints, tx) as held:  # decided, its files verified
        cluster.pause_replica(0)
        try:
            files = staged_files(cluster, t, tx.id)
            age(cluster, files)
            collect(cluster, files)
        finally:
            cluster.resume_replica(0)
    outcome = held.outcome
    assert len(outcome) == 1
    assert isinstance(outcome[0], TransactionAborted), f"the commit returned {outcome[0]!r}"
    assert "cleanup took its part" in str(outcome[0]) or "is gone from storage" in str(outcome[0])
    assert_readable(cluster, t, [])


def test_commit_parts_of_a_collected_file(cluster: LocalCluster) -> None:
    t = "fence_commit_parts"
    c0 = cluster.client(0)
    c0.create_table(t, SCHEMA)
    storage = Storage(cluster.storage_url)
    meta = write_part(storage, t, [], (), pa.table({"id": [3]}, schema=SCHEMA), "T1-1-writer")
    files = [meta.path, meta.path[: -len(".parquet")] + ".json"]
    age(cluster, files)
    collect(cluster, files)
    # Refused at stage now, before the fence is asked: its file is read to check its metadata
    # (docs/rules.md, "What a part's metadata is checked against"); the fence refuses a file
    # collected after that (the tests above).
    with pytest.raises(InvalidInput, match="names no file in storage"):
        c0.commit_parts(t, [meta])
    assert_readable(cluster, t, [])


def test_a_pass_that_died_after_condemning_is_finished_by_the_next(cluster: LocalCluster) -> None:
    """Files announced on the fence by a pass that never confirmed them stay refused, and the
    next pass deletes and confirms them."""
    from coordinator.zk.orphan_fence import OrphanFence

    t = "fence_leftover"
    c0 = cluster.client(0)
    c0.create_table(t, SCHEMA)
    tx = c0.begin()
    tx.insert(t, pa.table({"id": [4]}, schema=SCHEMA))
    files = staged_files(cluster, t, tx.id)
    with kazoo(cluster.zk_address) as zk:
        fence = OrphanFence(zk, cluster.root.rstrip("/") + "/fence", "dead-pass")
        fence.start()
        fence.announce(files)  # ... and the pass dies here, before deleting anything
        with pytest.raises(TransactionAborted, match="cleanup took its part"):
            tx.commit()
        cluster.client(1).gc(grace_seconds=0)
        assert fence.refresh()[1] == frozenset()
        assert not any(Storage(cluster.storage_url).exists(p) for p in files)
    assert_readable(cluster, t, [])
