"""Replica recovery on a real LocalCluster: a restarted replica comes back from its WAL with the
same state; one that was down (stopped or SIGKILLed) while others committed catches up from
ZooKeeper; a torn last WAL record is dropped, not fatal; a lost data directory is rebuilt from
the log; transaction ids stay unique across restarts; a killed replica's uncommitted parts never
become visible."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.compute as pc
import pytest
from support.cluster import make_cluster  # tests/ is on sys.path
from support.data import ID_V, commit_insert, id_rows, ids

import coordinator
from coordinator.core.versions import COUNTER_STRIDE
from coordinator.model.records import WalEntry
from mergetxn.client import Client
from mergetxn.local.zkserver import ZooKeeperServer
from replicas.wal import Wal

pytestmark = pytest.mark.zk

SCHEMA = ID_V


@pytest.fixture(scope="module")
def cluster(zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    with make_cluster(tmp_path_factory, zk_server, "recovery", replicas=3) as c:
        yield c


@pytest.fixture
def restore(cluster: coordinator.LocalCluster) -> Iterator[None]:
    """Whatever a test stops, it is running again for the next test."""
    yield
    for i in range(cluster.n):
        if cluster.replica_pid(i) is None:
            cluster.start_replica(i)


def wal_path(cluster: coordinator.LocalCluster, i: int) -> Path:
    return cluster.workdir / f"replica-{i}" / "wal.log"


def replica_log(cluster: coordinator.LocalCluster, i: int) -> str:
    return (cluster.workdir / f"replica-{i}" / "replica.log").read_text(errors="replace")


def state_of(client: Client, tables: list[str]) -> dict:
    """What must survive a restart: the snapshot, every part record, every visible row."""
    return {
        "snapshot": client.snapshot(),
        "parts": {t: sorted(client.parts(t).to_pylist(), key=lambda r: r["name"]) for t in tables},
        "rows": {t: ids(client.read(t)) for t in tables},
    }


def wal_entries(path: Path) -> list[WalEntry]:
    """The entry records of a stopped replica's WAL (read from a copy: opening may truncate)."""
    copy = path.with_name("wal.copy")
    shutil.copyfile(path, copy)
    try:
        wal = Wal(copy)
        wal.close()
        return [r for r in wal.records() if isinstance(r, WalEntry)]
    finally:
        copy.unlink()


def restart(cluster: coordinator.LocalCluster, i: int) -> float:
    t0 = time.monotonic()
    cluster.start_replica(i)
    return time.monotonic() - t0


# ---------------------------------------------------------------------------------------------


def test_restart_recovers_same_state_from_wal(
    cluster: coordinator.LocalCluster, restore: None, record_property
) -> None:
    c0 = cluster.client(0)
    c0.create_table("wal_a", SCHEMA, auto_merge=False)
    c0.create_table("wal_b", SCHEMA, auto_merge=False)
    for k in range(8):
        commit_insert(c0, "wal_a" if k % 2 else "wal_b", id_rows(3, start=10 * k))
    with c0.transaction() as tx:
        tx.delete("wal_a", pc.field("id") == 10)
    before = state_of(c0, ["wal_a", "wal_b"])
    cluster.stop_replica(0)
    entries = wal_entries(wal_path(cluster, 0))
    assert entries and max(r.csn for r in entries) == before["snapshot"]
    elapsed = restart(cluster, 0)
    record_property("replica_restart_seconds", round(elapsed, 3))
    assert elapsed < 60
    after = state_of(cluster.client(0), ["wal_a", "wal_b"])
    assert after == before
    # It keeps working: a new commit lands on top of the recovered state.
    c0 = cluster.client(0)
    csn = commit_insert(c0, "wal_a", id_rows(1, start=999))
    assert csn > before["snapshot"]
    assert ids(c0.read("wal_a")) == before["rows"]["wal_a"] + [999]


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_down_replica_catches_up_from_zookeeper(cluster: coordinator.LocalCluster, restore: None, how: str) -> None:
    table = f"catchup_{how}"
    c0 = cluster.client(0)
    c0.create_table(table, SCHEMA, auto_merge=False)
    commit_insert(c0, table, id_rows(2))
    cluster.client(1).wait_for(c0.snapshot())
    (cluster.stop_replica if how == "stop" else cluster.kill_replica)(1)
    last = 0
    for k in range(12):
        last = commit_insert(cluster.client(k % 2 * 2), table, id_rows(1, start=100 + k))  # replicas 0 and 2
    cluster.client(0).wait_for(last)
    restart(cluster, 1)
    c1 = cluster.client(1)
    c1.wait_for(last)
    assert ids(c1.read(table, snapshot=last)) == [0, 1] + list(range(100, 112))
    assert state_of(c1, [table]) == state_of(cluster.client(0), [table])  # same snapshot, parts, rows


def test_killed_replica_loses_nothing_committed_and_shows_nothing_uncommitted(
    cluster: coordinator.LocalCluster, restore: None
) -> None:
    c2 = cluster.client(2)
    c2.create_table("killed", SCHEMA, auto_merge=False, inline_rows=0)  # part files: an inlined part has none
    committed = commit_insert(c2, "killed", id_rows(5))
    open_tx = c2.begin()
    open_tx.insert("killed", id_rows(5, start=50))
    staged = open_tx.read("killed")
    assert staged.num_rows == 10
    part_files = {p.name for p in (Path(cluster.storage_url) / "killed").rglob("*.parquet")}
    assert len(part_files) == 2  # the committed part and the staged one
    cluster.kill_replica(2)
    restart(cluster, 2)
    c2 = cluster.client(2)
    assert ids(c2.read("killed")) == list(range(5))
    assert c2.snapshot() >= committed
    assert c2.commit_status(open_tx.tid).status == "aborted"
    assert c2.commit_status(open_tx.tid).csn is None
    # The staged part of the transaction that died with the replica is removed on restart.
    left = {p.name for p in (Path(cluster.storage_url) / "killed").rglob("*.parquet")}
    (visible,) = c2.parts("killed").column("path").to_pylist()
    assert left == {Path(visible).name}
    # The other replicas never saw it either.
    assert ids(cluster.client(0).read("killed", snapshot=c2.snapshot())) == list(range(5))


def test_torn_last_wal_record_is_dropped(cluster: coordinator.LocalCluster, restore: None) -> None:
    c0 = cluster.client(0)
    c0.create_table("torn", SCHEMA, auto_merge=False)
    for k in range(4):
        last = commit_insert(c0, "torn", id_rows(1, start=k))
    cluster.client(1).wait_for(last)
    cluster.stop_replica(1)
    path = wal_path(cluster, 1)
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size - 5)  # the last record (an applied entry) is now torn
    # Others commit meanwhile; the torn entry and these must all come from ZooKeeper.
    for k in range(4, 7):
        last = commit_insert(c0, "torn", id_rows(1, start=k))
    restart(cluster, 1)
    assert cluster.replica_pid(1) is not None
    c1 = cluster.client(1)
    assert ids(c1.read("torn", snapshot=last)) == list(range(7))
    assert "torn last record" in replica_log(cluster, 1)
    assert state_of(c1, ["torn"]) == state_of(c0, ["torn"])
    # The WAL was cut back to a record boundary and continued cleanly: it parses as a whole.
    cluster.stop_replica(1)
    copy = path.with_name("wal.check")
    shutil.copyfile(path, copy)
    wal = Wal(copy)
    wal.close()
    assert wal.dropped_tail == 0
    csns = [r.csn for r in wal.records() if isinstance(r, WalEntry)]
    assert max(csns) >= last
    restart(cluster, 1)
    assert ids(cluster.client(1).read("torn", snapshot=last)) == list(range(7))


def test_lost_data_directory_is_rebuilt_from_the_log(cluster: coordinator.LocalCluster, restore: None) -> None:
    c0 = cluster.client(0)
    c0.create_table("lost", SCHEMA, auto_merge=False)
    last = commit_insert(c0, "lost", id_rows(3))
    c1 = cluster.client(1)
    c1.wait_for(last)
    tid_before = c1.begin().tid
    cluster.kill_replica(1)
    shutil.rmtree(cluster.workdir / "replica-1")
    restart(cluster, 1)
    c1 = cluster.client(1)
    c1.wait_for(last)
    assert ids(c1.read("lost")) == [0, 1, 2]
    assert state_of(c1, ["lost"]) == state_of(c0, ["lost"])
    tx = c1.begin()
    assert tx.tid != tid_before
    assert tx.tid.local_counter // COUNTER_STRIDE > tid_before.local_counter // COUNTER_STRIDE
    tx.rollback()


def test_tids_unique_across_restarts(cluster: coordinator.LocalCluster, restore: None) -> None:
    seen: set = set()
    incarnations: list[int] = []
    for _ in range(3):
        c = cluster.client(2)
        txs = [c.begin() for _ in range(3)]
        for tx in txs:
            assert tx.tid not in seen
            seen.add(tx.tid)
            tx.rollback()
        counters = [tx.tid.local_counter for tx in txs]
        assert len(set(counters)) == 3
        incarnations.append(counters[0] // COUNTER_STRIDE)
        cluster.stop_replica(2)
        restart(cluster, 2)
    assert incarnations == sorted(incarnations) and len(set(incarnations)) == 3
    # Same snapshot, same position in the counter, different incarnation: still distinct ids.
    assert len({(t.start_csn, t.local_counter % COUNTER_STRIDE) for t in seen}) < len(seen)
