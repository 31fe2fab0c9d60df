"""Background merges, cleanup that respects snapshots in use, incremental reads and the event log,
against real ZooKeeper and real replica processes (replicas/merges.py, cleanup.py, leases.py, history.py).

Two module-scoped clusters on the session's ZooKeeper: ``auto`` (two replicas, background merges
and cleanup running at short intervals) and ``manual`` (two replicas, nothing in the background,
so cleanup reports are deterministic). Settings reach the replica processes through the
settings given to LocalCluster (``replicas.settings``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from click.testing import CliRunner
from support.cluster import make_cluster  # tests/ is on sys.path
from support.data import sorted_rows
from support.waiting import wait_until
from support.zk import kazoo

from coordinator import LocalCluster
from coordinator.core.tabledata import partition_key
from coordinator.errors import InvalidInput, SnapshotUnavailable, TableNotFound
from coordinator.model.catalog import TableDef
from coordinator.model.records import Insert, Truncate
from mergetxn.cli import cli
from mergetxn.local.zkserver import ZooKeeperServer
from parts.io.format import write_part
from parts.io.storage import Storage
from replicas.replica import Replica, ReplicaConfig
from replicas.server import SWITCH_INTERVAL

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.int32()), ("v", pa.string())])


def data(ids: list[int], p: int | list[int] = 0, v: str = "x") -> pa.Table:
    ps = p if isinstance(p, list) else [p] * len(ids)
    return pa.table({"id": ids, "p": ps, "v": [f"{v}{i}" for i in ids]}, schema=SCHEMA)


@pytest.fixture(scope="module")
def auto(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator[LocalCluster]:
    with make_cluster(
        tmp_path_factory,
        zk_server,
        "auto",
        replicas=2,
        settings={
            # inline_rows 0: these tests follow the files merges write and cleanup collects (docs/architecture/small-writes.md)
            "inline_rows": 0,
            "merge_interval": 0.2,
            "merge_min_parts": 4,
            "gc_interval": 0.5,
            "read_lease_seconds": 1,
        },
    ) as c:
        yield c


@pytest.fixture(scope="module")
def manual(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator[LocalCluster]:
    with make_cluster(
        tmp_path_factory,
        zk_server,
        "manual",
        replicas=2,
        settings={
            # inline_rows 0: these tests follow the files merges write and cleanup collects (docs/architecture/small-writes.md)
            "inline_rows": 0,
            "merge_interval": 0,
            "gc_interval": 0,
            "read_lease_seconds": 1,
        },
    ) as c:
        yield c


def test_settings_reach_every_replica_and_bad_ones_start_nothing(auto: LocalCluster, tmp_path: Path) -> None:
    for i in range(2):
        info = auto.client(i).call("info")
        settings = info["settings"]
        assert settings["merge_min_parts"] == 4 and settings["gc_interval"] == 0.5
        assert info["switch_interval"] == pytest.approx(SWITCH_INTERVAL)
        assert settings["retain_entries"] == 5000  # not given: the default
    for bad, why in (
        ({"retain_entrys": 10}, "unknown replica setting 'retain_entrys'"),
        ({"retain_entries": -1}, "at least 0"),
        ({"merge_min_parts": 2.5}, "an integer"),
        ({"gc_interval": "soon"}, "a number"),
    ):
        with pytest.raises(InvalidInput, match=why):
            LocalCluster(tmp_path / "never", replicas=1, settings=bad)
    with pytest.raises(InvalidInput, match="txn_max_rows must be at least 1"):
        LocalCluster(tmp_path / "never", replicas=1, txn_max_rows=0)
    assert not (tmp_path / "never").exists()


def alive_node(cluster: LocalCluster, i: int) -> dict:
    with kazoo(cluster.zk_address) as zk:
        raw, _ = zk.get(f"/mergetxn/replicas/r{i}/alive")
    return json.loads(raw)


def holds(cluster: LocalCluster, i: int, txn_id: str) -> bool:
    """Whether replica ``i`` publishes ``txn_id`` among the snapshots it has in use."""
    return any(h == txn_id for _, h in alive_node(cluster, i).get("snapshots", ()))


# -- background merges ----------------------------------------------------------------------------


def test_merges_beside_writers_and_an_old_reader(auto: LocalCluster) -> None:
    """Background merges run while two writers insert and a reader holds an old snapshot: the
    reader's results never change, no writer fails, the parts the reader sees survive cleanup
    while it runs and are deleted (by background cleanup alone) after it ends."""
    t = "merge_rw"
    c0, c1 = auto.client(0), auto.client(1)
    c0.create_table(t, SCHEMA, partition_by=["p"], auto_merge=True)
    expected: list[tuple] = []
    for i in range(3):
        batch = data([10 * i, 10 * i + 1], p=[0, 1])
        with c0.transaction() as tx:
            tx.insert(t, batch)
        expected += sorted_rows(batch)
    c1.wait_for(tx.csn)
    reader = c1.begin()
    base = sorted_rows(reader.read(t))
    assert base == sorted(expected)
    needed = [r for r in c0.parts(t).to_pylist() if r["visible"]]
    assert len(needed) == 6
    storage = Storage(auto.storage_url)

    errors: list[BaseException] = []
    inserted: list[list[tuple]] = [[], []]

    def writer(k: int) -> None:
        cl = auto.client(k)
        try:
            for j in range(25):
                batch = data([1000 * (k + 1) + j], p=[j % 2])
                with cl.transaction() as tx:
                    tx.insert(t, batch)
                inserted[k] += sorted_rows(batch)
        except BaseException as exc:  # reported below: a writer must never fail
            errors.append(exc)
        finally:
            cl.close()

    threads = [threading.Thread(target=writer, args=(k,)) for k in (0, 1)]
    for th in threads:
        th.start()
    reads = 0
    while any(th.is_alive() for th in threads):
        assert sorted_rows(reader.read(t)) == base
        reads += 1
    for th in threads:
        th.join()
    assert not errors, errors
    assert reads > 0
    expected += inserted[0] + inserted[1]

    # Merges took the reader's parts away from the latest snapshot...
    def all_merged() -> bool:
        recs = {r["name"]: r for r in c0.parts(t).to_pylist()}
        return all(recs[p["name"]]["removal_csn"] is not None for p in needed)

    wait_until(all_merged, 60, "background merges to replace the reader's parts")
    merges = [e for e in c0.events(t).to_pylist() + c1.events(t).to_pylist() if e["event"] == "merge"]
    assert any(e["outcome"] == "committed" for e in merges)
    # ...but cleanup (background, and a pass by hand here) keeps them while the reader runs.
    report = c0.gc()
    kept = {k["path"]: k["reason"] for k in report["kept"]}
    for p in needed:
        assert p["path"] not in {r["path"] for r in report["removed"]}
        assert reader.id in kept[p["path"]], kept[p["path"]]
        assert storage.exists(p["path"])
    assert sorted_rows(reader.read(t)) == base
    assert sorted_rows(c0.read(t)) == sorted(expected)
    assert sorted_rows(c1.read(t)) == sorted(expected)

    reader.rollback()
    wait_until(
        lambda: not any(storage.exists(p["path"]) for p in needed),
        30,
        "background cleanup to delete the reader's parts after it ended",
    )
    assert sorted_rows(c0.read(t)) == sorted(expected)
    recs = {r["name"]: r for r in c0.parts(t).to_pylist()}
    # collected, or already forgotten altogether (records of collected parts are pruned in turn)
    assert all(p["name"] not in recs or recs[p["name"]]["collected"] for p in needed)
    for c in (c0, c1):
        c.close()


def test_two_replicas_never_run_the_same_merge(auto: LocalCluster) -> None:
    """Both replicas look for merges on the same table every 0.2 s; the table's leader lock
    (kazoo Lock under /mergetxn/leaders/<table>) lets one merge at a time, after catching up,
    so no part is ever the source of two merge attempts and no merge loses a conflict."""
    t = "merge_once"
    c0, c1 = auto.client(0), auto.client(1)
    # Its own retention window: with the session's 0 s, cleanup may forget the first merges'
    # conflict history (their kinds) before the events are read.
    c0.create_table(t, SCHEMA, auto_merge=True, retention_seconds=3600)
    expected = []
    for j in range(24):
        batch = data([j])
        with (c0 if j % 2 else c1).transaction() as tx:
            tx.insert(t, batch)
        expected += sorted_rows(batch)

    def settled() -> bool:
        live = [r for r in c0.parts(t).to_pylist() if r["visible"]]
        return len(live) < 4

    wait_until(settled, 60, "merges to bring the table under 4 parts")
    merges = [
        e
        for e in c0.events(t).to_pylist() + c1.events(t).to_pylist()
        if e["event"] == "merge" and e["outcome"] != "skipped"
    ]
    assert merges and all(e["outcome"] == "committed" for e in merges), merges
    sources = Counter(s for e in merges for s in e["part"].split(","))
    assert max(sources.values()) == 1, [s for s, n in sources.items() if n > 1]
    c0.wait_for(max(e["csn"] for e in merges))  # a merge replica 1 committed: applied on replica 0 too
    commits = [e for e in c0.events(t).to_pylist() if e["event"] == "commit" and e["kinds"] == "MINOR_COMPACT"]
    assert sorted(e["csn"] for e in commits) == sorted(e["csn"] for e in merges)
    assert all(e["time"] is not None for e in commits)
    with kazoo(auto.zk_address) as zk:
        assert zk.exists(f"/mergetxn/leaders/{t}") is not None
    assert sorted_rows(c1.read(t)) == sorted(expected)


def test_auto_merge_false_is_left_alone(auto: LocalCluster) -> None:
    t = "merge_never"
    c0 = auto.client(0)
    c0.create_table(t, SCHEMA, auto_merge=False)
    for j in range(8):
        with c0.transaction() as tx:
            tx.insert(t, data([j]))
    # A table with auto_merge=True created after it gets merged: the merge loop has looked at both.
    witness = "merge_witness"
    c0.create_table(witness, SCHEMA, auto_merge=True)
    for j in range(4):
        with c0.transaction() as tx:
            tx.insert(witness, data([j]))
    wait_until(lambda: sum(r["visible"] for r in c0.parts(witness).to_pylist()) == 1, 30, "the witness merge")
    assert sum(r["visible"] for r in c0.parts(t).to_pylist()) == 8
    assert not [e for e in c0.events(t).to_pylist() if e["event"] == "merge"]


def test_background_cleanup_counts_young_orphans_and_never_takes_a_part_committed_meanwhile(
    zk_address: str, tmp_path: Path
) -> None:
    """A background pass (``detail=False``) deletes old orphans, only counts the young ones, and
    a part whose commit is applied while the pass runs (after its unlocked lookup found the file
    unreferenced) is kept: the pass looks again under the state lock before deleting."""
    r = Replica(
        ReplicaConfig(
            zk=zk_address,
            storage_url=str(tmp_path / "storage"),
            host_id="g0",
            data_dir=tmp_path / "replica",
            merge_interval=0,
            gc_interval=0,
        )
    )
    r.start()
    root = tmp_path / "storage"
    old = time.time() - 3600
    try:
        r.create_table(TableDef.new("bg", SCHEMA))
        ghost = write_part(r.storage, "bg", [], (), data([1]), "T1-0-gone")
        young = write_part(r.storage, "bg", [], (), data([2]), "T1-1-gone")
        txn = r.transactions.begin()
        late = write_part(r.storage, "bg", [], (), data([3]), txn.id)
        r.transactions.stage(txn.id, Insert("bg", added=(late,)))
        for m in (ghost, late):
            for p in (m.path, m.meta_path):
                os.utime(root / p, (old, old))
        listing = r.storage.list_with_mtime
        committed: list[int] = []

        def list_then_commit(prefix: str, want=None):
            out = listing(prefix, want)  # ``want`` saw the staged part unreferenced
            committed.append(r.transactions.commit(txn.id))
            return out

        r.storage.list_with_mtime = list_then_commit  # type: ignore[method-assign]
        report = r.cleanup.gc(orphans=True, detail=False)
        assert committed and [p for p, _ in listing("bg/", None)].count(late.path) == 1
        assert {x["path"] for x in report["removed"]} == {ghost.path, ghost.meta_path}
        assert report["young_orphans"] == 2 and not report["kept"]
        assert r.storage.exists(young.path) and r.storage.exists(late.path)
        assert [m.name for m in r.state.visible("bg", committed[0])] == [late.name]
    finally:
        r.stop()


def test_merge_whose_source_was_removed_fails_cleanly(zk_address: str, tmp_path: Path) -> None:
    """A merge whose source part another transaction removes before it commits loses the
    conflict (parts policy): recorded as an event, nothing of it stays in storage, data intact."""
    r = Replica(
        ReplicaConfig(
            zk=zk_address,
            storage_url=str(tmp_path / "storage"),
            host_id="m0",
            data_dir=tmp_path / "replica",
            merge_interval=0,
            gc_interval=0,
        )
    )
    r.start()
    try:
        r.create_table(TableDef.new("mc", SCHEMA))
        for i in range(3):
            txn = r.transactions.begin()
            meta = write_part(r.storage, "mc", [], (), data([i]), txn.id)
            r.transactions.stage(txn.id, Insert("mc", added=(meta,)))
            r.transactions.commit(txn.id)
        live = r.state.visible("mc", r.state.applied)
        pkey = partition_key(())

        def concurrent_truncate() -> None:
            t2 = r.transactions.begin()
            r.transactions.stage(t2.id, Truncate("mc", removed=(live[0].name,), partitions=(pkey,)))
            r.transactions.commit(t2.id)

        out = r.merges.run_merge(
            r.table("mc"), "minor", pkey, [m.name for m in live], before_commit=concurrent_truncate
        )
        assert out["outcome"] == "conflict", out
        ev = [e for e in r.changefeed.events("mc") if e["event"] == "merge"]
        assert ev and ev[-1]["outcome"] == "conflict" and "already removed" in ev[-1]["reason"]
        merge_tid = ev[-1]["tid"]
        assert not [p for p in r.storage.list("mc/") if merge_tid.replace(".", "_") in p]
        names = sorted(m.name for m in r.state.visible("mc", r.state.applied))
        assert names == sorted(m.name for m in live[1:])
        # The merge is retried later on what is there now, and then succeeds.
        r.merges._backoff.clear()
        plan = r.merges.plan_merges(r.table("mc"))
        assert plan == []  # two small parts are below merge_min_parts (8)
        out = r.merges.run_merge(r.table("mc"), "minor", pkey, names)
        assert out["outcome"] == "committed"
        assert len(r.state.visible("mc", r.state.applied)) == 1
    finally:
        r.stop()


# -- cleanup -----------------------------------------------------------------------------------------


def test_gc_keeps_what_a_snapshot_on_another_replica_sees(manual: LocalCluster) -> None:
    t, other = "gc_report", "gc_untouched"
    c0, c1 = manual.client(0), manual.client(1)
    c0.create_table(t, SCHEMA)
    c0.create_table(other, SCHEMA)
    for i in range(3):
        with c0.transaction() as tx:
            tx.insert(t, data([i]))
    with c0.transaction() as tx:
        tx.insert(other, data([7]))
    before = dt.datetime.now(dt.UTC)
    old = [r for r in c0.parts(t).to_pylist() if r["visible"]]
    storage = Storage(manual.storage_url)

    c1.wait_for(tx.csn)
    reader = c1.begin()  # on the other replica
    base = sorted_rows(reader.read(t))
    wait_until(lambda: holds(manual, 1, reader.id), 10, "replica 1 to publish the reader's snapshot")
    with c0.transaction() as tx:
        tx.overwrite(t, data([100, 101]))
    removal = tx.csn

    report = c0.gc()
    kept = {k["path"]: k for k in report["kept"] if k["table"] == t}
    assert report["min_snapshot"] <= reader.snapshot < removal
    for p in old:
        assert p["path"] in kept
        assert reader.id in kept[p["path"]]["reason"] and f"snapshot {reader.snapshot}" in kept[p["path"]]["reason"]
        assert storage.exists(p["path"])
    assert not [r for r in report["removed"] if r["table"] == t]
    notes = {r["name"]: r for r in c0.parts(t).to_pylist()}
    for p in old:
        assert notes[p["name"]]["why_kept"].startswith(f"visible to snapshot {reader.snapshot}")
        assert notes[p["name"]]["collected"] is False
    assert sorted_rows(reader.read(t)) == base

    reader.rollback()
    wait_until(lambda: not holds(manual, 1, reader.id), 10, "replica 1 to publish that the reader ended")
    report = wait_until(
        lambda: (lambda r: r if any(x["table"] == t for x in r["removed"]) else None)(c0.gc()),
        10,
        "a pass that removes the overwritten parts (read leases expire after 1 s)",
    )
    removed = {r["path"]: r["reason"] for r in report["removed"] if r["table"] == t}
    assert set(removed) == {p["path"] for p in old}
    assert all(f"removed at CSN {removal}" in why for why in removed.values())
    assert report["watermark"] >= removal
    for p in old:
        assert not storage.exists(p["path"])
        assert not storage.exists(p["path"][: -len(".parquet")] + ".json")
    notes = {r["name"]: r for r in c0.parts(t).to_pylist()}
    assert all(notes[p["name"]]["collected"] and notes[p["name"]]["why_kept"] is None for p in old)

    # Reads of a snapshot whose parts were collected say so, on both replicas; nothing else does.
    for c in (c0, c1):
        with pytest.raises(SnapshotUnavailable, match="older than retained"):
            c.read(t, snapshot=reader.snapshot)
        with pytest.raises(SnapshotUnavailable, match="older than retained"):
            c.read(t, as_of=before)
        with pytest.raises(SnapshotUnavailable, match="older than retained"):
            c.changes(t, reader.snapshot, removal)
        assert sorted_rows(c.read(t)) == sorted_rows(data([100, 101]))
        assert sorted_rows(c.read(other, snapshot=reader.snapshot)) == sorted_rows(
            data([7])
        )  # nothing of it was removed
        assert c.changes(t, removal).num_rows == 0
    # A second pass finds nothing more to do for this table.
    again = c0.gc()
    assert not [r for r in again["removed"] if r["table"] == t]
    for c in (c0, c1):
        c.close()


def test_a_plain_read_pins_nothing_once_it_returned(
    zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Beyond the retention window only snapshots in use are protected
    (docs/rules.md#history-retention): after plain reads of an old snapshot (by snapshot, as_of,
    changes; on both replicas) have returned, a pass deletes the parts removed after it at once,
    although read_lease_seconds (for Spark jobs) is the default 300 s; while a read is in progress
    (its lease taken, not released) the pass keeps them."""
    t = "lease_read"
    with make_cluster(
        # inline_rows 0: these tests follow the files merges write and cleanup collects (docs/architecture/small-writes.md)
        tmp_path_factory,
        zk_server,
        "lease_read",
        replicas=2,
        settings={"inline_rows": 0, "merge_interval": 0, "gc_interval": 0},
    ) as c:
        c0, c1 = c.client(0), c.client(1)
        c0.create_table(t, SCHEMA, auto_merge=False)
        for i in range(2):
            with c0.transaction() as tx:
                tx.insert(t, data([i]))
        old_snapshot = tx.csn
        between = dt.datetime.now(dt.UTC)
        old = [r["path"] for r in c0.parts(t).to_pylist() if r["visible"]]
        with c0.transaction() as tx:
            tx.overwrite(t, data([10]))
        removal = tx.csn
        c1.wait_for(removal)
        storage = Storage(c.storage_url)

        for cl in (c1, c0):  # the pass computes replica 0's snapshots in use fresh
            assert sorted_rows(cl.read(t, snapshot=old_snapshot)) == sorted_rows(data([0, 1]))
            assert cl.read(t, as_of=between).num_rows == 2
            assert cl.changes(t, 0, old_snapshot).num_rows == 2
        # Replica 1 publishes what it has in use every half second.
        wait_until(
            lambda: alive_node(c, 1).get("oldest_snapshot", 0) >= removal,
            10,
            "replica 1 to publish that its reads hold nothing",
        )
        report = c0.gc()
        assert {r["path"] for r in report["removed"] if r["table"] == t} == set(old), report
        assert not [k for k in report["kept"] if k["table"] == t], report
        assert not any(s["holder"] == "read" for s in report["snapshots_in_use"]), report
        assert not any(storage.exists(p) for p in old)

        # A read in progress (the parts answered with a lease, the files not read yet) is kept.
        before = [r["path"] for r in c0.parts(t).to_pylist() if r["visible"]]
        snap = c0.snapshot()
        with c0.transaction() as tx:
            tx.overwrite(t, data([20]))
        c1.wait_for(tx.csn)
        reading = c1.call("visible", table=t, snapshot=snap)
        assert [m["path"] for m in reading["parts"]] == before and reading["lease"]
        wait_until(
            lambda: any(s == snap for s, _ in alive_node(c, 1).get("snapshots", ())),
            10,
            "replica 1 to publish the read's snapshot",
        )
        report = c0.gc()
        kept = {k["path"]: k["reason"] for k in report["kept"] if k["table"] == t}
        assert set(kept) == set(before) and all(f"a read at snapshot {snap}" in why for why in kept.values()), kept
        assert all(storage.exists(p) for p in before)
        assert c1.call("renew", lease=reading["lease"])["renewed"]
        assert c1.call("release", lease=reading["lease"]) == {"released": True}
        assert not c1.call("renew", lease=reading["lease"])["renewed"]
        wait_until(
            lambda: {r["path"] for r in c0.gc()["removed"] if r["table"] == t} == set(before),
            10,
            "a pass that removes the parts once the read released its lease",
        )
        for cl in (c0, c1):
            assert sorted_rows(cl.read(t)) == sorted_rows(data([20]))
            cl.close()


def test_orphans_are_collected_after_the_grace_period(manual: LocalCluster) -> None:
    t = "gc_orphans"
    c0, c1 = manual.client(0), manual.client(1)
    c0.create_table(t, SCHEMA)
    with c0.transaction() as tx:
        tx.insert(t, data([1]))
    committed_tid = tx.id
    storage = Storage(manual.storage_url)
    root = Path(manual.storage_url)
    old = time.time() - 3600

    def age(path: str) -> None:
        os.utime(root / path, (old, old))

    def sidecar(path: str) -> str:
        return path[: -len(".parquet")] + ".json"

    ghost = write_part(storage, t, [], (), data([2]), "T1-0-ghost")  # a writer that crashed
    young = write_part(storage, t, [], (), data([3]), "T1-1-ghost")  # the same, moments ago
    attempt = write_part(storage, t, [], (), data([4]), committed_tid)  # a failed Spark attempt
    for p in (ghost.path, sidecar(ghost.path), attempt.path, sidecar(attempt.path)):
        age(p)
    temp = f"{t}/_/.{ghost.name.replace('ghost', 'other')}.parquet.tmp-0123456789ab"
    (root / temp).write_bytes(b"half a part")
    age(temp)
    foreign = f"{t}/_/README.txt"  # not a part file: never touched
    (root / foreign).write_text("hello")
    age(foreign)

    running = c1.begin()  # a long transaction on the other replica, its part written long ago
    running.insert(t, data([5]))
    running.read(t)  # the insert reaches the replica
    staged = [p for p in storage.list(f"{t}/") if running.id in p and p.endswith(".parquet")]
    assert len(staged) == 1
    age(staged[0])
    wait_until(
        lambda: running.id in alive_node(manual, 1).get("running", ()),
        10,
        "replica 1 to publish its running transaction",
    )

    report = c0.gc()
    removed = {r["path"]: r["reason"] for r in report["removed"] if r["table"] == t}
    kept = {r["path"]: r["reason"] for r in report["kept"] if r["table"] == t}
    assert set(removed) == {ghost.path, sidecar(ghost.path), attempt.path, sidecar(attempt.path), temp}
    assert "never committed" in removed[ghost.path]
    assert f"not referenced by its transaction {committed_tid}" in removed[attempt.path]
    assert "temporary file" in removed[temp]
    assert "younger than the grace period" in kept[young.path]
    assert report["young_orphans"] >= 2  # the young part and its sidecar
    assert "staged by transaction" in kept[staged[0]] and running.id in kept[staged[0]]
    assert storage.exists(young.path) and storage.exists(staged[0]) and storage.exists(foreign)
    c0.wait_for(running.commit())
    assert sorted_rows(c0.read(t)) == sorted_rows(data([1, 5]))
    # Past the grace period the young orphan goes too (grace never drops below MIN_GRACE).
    age(young.path)
    report = c0.gc(grace_seconds=0)
    assert young.path in {r["path"] for r in report["removed"]}
    assert storage.exists(foreign)
    assert sorted_rows(c1.read(t)) == sorted_rows(data([1, 5]))
    for c in (c0, c1):
        c.close()


def test_gc_command_prints_the_report(manual: LocalCluster) -> None:
    runner = CliRunner(env={"MERGETXN_REPLICA": manual.replica_addresses[0]})
    r = runner.invoke(cli, ["gc", "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert {"removed", "kept", "min_snapshot", "watermark"} <= set(report)
    r = runner.invoke(cli, ["gc"], catch_exceptions=False)
    assert r.exit_code == 0 and "oldest snapshot in use" in r.output, r.output


# -- incremental reads ----------------------------------------------------------------------------------


def test_changes_by_id_and_by_time_row_by_row(manual: LocalCluster) -> None:
    t = "chg"
    c = manual.client(0)
    c.create_table(t, SCHEMA, partition_by=["p"], auto_merge=False)
    csns = [c.snapshot()]
    times = [dt.datetime.now(dt.UTC)]
    snaps: list[list[tuple]] = [[]]

    def step(fn: Callable[[], int]) -> None:
        csn = fn()
        csns.append(csn)
        times.append(dt.datetime.now(dt.UTC))
        snaps.append(sorted_rows(c.read(t, snapshot=csn)))

    def txn(body: Callable) -> Callable[[], int]:
        def run() -> int:
            with c.transaction() as tx:
                body(tx)
            return tx.csn

        return run

    step(txn(lambda tx: tx.insert(t, data([0, 1, 2, 3, 4, 5], p=[0, 1, 0, 1, 0, 1]))))  # 1 insert
    step(txn(lambda tx: tx.insert(t, data([6, 7, 8, 9], p=[0, 1, 0, 1]))))  # 2 insert
    step(txn(lambda tx: tx.delete(t, pc.field("id").isin([0, 3, 6, 9]))))  # 3 delete
    step(txn(lambda tx: tx.overwrite(t, data([100, 101, 102], p=1), partitions=[1])))  # 4 overwrite
    step(lambda: c.compact(t, kind="major"))  # 5 merge
    step(txn(lambda tx: tx.update(t, pc.field("id") == 2, {"v": "u"})))  # 6 update
    step(txn(lambda tx: tx.insert(t, data([200], p=0))))  # 7 insert
    MERGE = 5

    def split(ch: pa.Table) -> tuple[Counter, Counter]:
        ins, dels = Counter(), Counter()
        for r in ch.to_pylist():
            row = (r["id"], r["p"], r["v"])
            (ins if r["_change"] == "insert" else dels)[row] += 1
        return ins, dels

    by_id = []
    for i in range(1, 8):
        ch = c.changes(t, csns[i - 1], csns[i], by="id")
        assert ch.schema.names == SCHEMA.names + ["_change", "_csn"]
        assert set(ch.column("_csn").to_pylist()) == {csns[i]}
        ins, dels = split(ch)
        # Row by row, every commit: what it inserted minus what it deleted is the snapshot diff.
        assert ins + Counter(snaps[i - 1]) == dels + Counter(snaps[i]), i
        by_id.append(ch)
    ins, dels = split(by_id[0])
    assert dels == Counter() and ins == Counter(sorted_rows(data([0, 1, 2, 3, 4, 5], p=[0, 1, 0, 1, 0, 1])))
    ins, dels = split(by_id[2])  # copy-on-write DELETE: rewritten parts out, their survivors in
    assert dels - ins == Counter(r for r in snaps[2] if r[0] % 3 == 0) and not ins - dels
    ins, dels = split(by_id[3])  # OVERWRITE of partition 1
    assert dels == Counter(r for r in snaps[3] if r[1] == 1) and ins == Counter(sorted_rows(data([100, 101, 102], p=1)))
    ins, dels = split(by_id[MERGE - 1])  # the merge: the same rows out and in, by ID version
    assert ins == dels == Counter(snaps[4]) and ins
    ins, dels = split(by_id[5])
    assert dels - ins == Counter([(2, 0, "x2")]) and ins - dels == Counter([(2, 0, "u")])
    # Deletes come before inserts within a commit; commits in CSN order.
    order = [(r["_csn"], r["_change"] == "insert") for r in c.changes(t, csns[0], csns[7]).to_pylist()]
    assert order == sorted(order)

    whole = c.changes(t, csns[0], csns[7], by="id")
    assert sorted_rows(whole) == sorted(r for ch in by_id for r in sorted_rows(ch))
    assert sorted_rows(c.changes(t, csns[5])) == sorted_rows(pa.concat_tables(by_id[5:]))  # end defaults to latest

    # By time version: the merge never appears; everything else exactly as by ID.
    for i in range(1, 8):
        ch = c.changes(t, times[i - 1], times[i], by="time")
        if i == MERGE:
            assert ch.num_rows == 0 and ch.schema == whole.schema
        else:
            assert sorted_rows(ch) == sorted_rows(by_id[i - 1]), i
    by_time = c.changes(t, times[0], times[7], by="time")
    assert csns[MERGE] not in by_time.column("_csn").to_pylist()
    assert sorted_rows(by_time) == sorted(r for i, ch in enumerate(by_id, 1) if i != MERGE for r in sorted_rows(ch))
    assert sorted_rows(c.changes(t, times[0], by="time")) == sorted_rows(by_time)

    with pytest.raises(InvalidInput, match="by must be"):
        c.changes(t, 0, by="version")
    with pytest.raises(InvalidInput, match="timezone-aware"):
        c.changes(t, dt.datetime.now(), by="time")
    with pytest.raises(InvalidInput, match="before start"):
        c.changes(t, csns[3], csns[2])
    c.close()


# -- introspection ------------------------------------------------------------------------------


def test_event_log(manual: LocalCluster) -> None:
    t = "ev"
    c = manual.client(0)
    c.create_table(t, SCHEMA)
    with c.transaction() as tx:
        tx.insert(t, data([1, 2]))
    first = tx.csn
    tx2 = c.begin()
    tx2.insert(t, data([3]))
    tx2.read(t)  # staged now, so the replica knows the table it touched
    tx2.rollback()
    with c.transaction() as tx3:
        tx3.overwrite(t, data([4]))
    ev = c.events(t).to_pylist()
    kinds = [(e["event"], e["tid"]) for e in ev]
    assert ("begin", tx.id) in kinds and ("commit", tx.id) in kinds and ("part_added", tx.id) in kinds
    assert ("begin", tx2.id) in kinds and ("rollback", tx2.id) in kinds
    assert ("commit", tx2.id) not in kinds
    assert ("part_removed", tx3.id) in kinds and ("part_added", tx3.id) in kinds
    commit = next(e for e in ev if e["event"] == "commit" and e["tid"] == tx.id)
    assert commit["csn"] == first and commit["rows"] == 2 and commit["kinds"] == "INSERT"
    assert commit["time"].tzinfo is not None
    removed = next(e for e in ev if e["event"] == "part_removed")
    assert removed["csn"] == tx3.csn and removed["rows"] == 2
    later = c.events(t, since_csn=first).to_pylist()
    assert ("commit", tx.id) not in [(e["event"], e["tid"]) for e in later]
    assert ("commit", tx3.id) in [(e["event"], e["tid"]) for e in later]
    assert any(e["table"] == t for e in c.events().to_pylist())
    times = [e["time"] for e in ev]
    assert times == sorted(times)
    c.close()


def test_transactions_show_snapshot_and_age(manual: LocalCluster) -> None:
    c = manual.client(1)
    tx = c.begin()
    row = next(r for r in c.transactions() if r["id"] == tx.id)
    assert row["snapshot"] == tx.snapshot and row["age_seconds"] >= 0
    tx.rollback()
    c.close()


def test_bad_maintenance_input_is_refused(manual: LocalCluster) -> None:
    c = manual.client(0)
    c.create_table("bad_in", SCHEMA)
    with pytest.raises(InvalidInput, match="grace_seconds"):
        c.gc(grace_seconds=-1)
    with pytest.raises(InvalidInput, match="since_csn"):
        c.events("bad_in", since_csn="yesterday")
    with pytest.raises(InvalidInput, match="integer CSN"):
        c.changes("bad_in", "a")
    with pytest.raises(TableNotFound):
        c.changes("no_such_table", 0)
    with pytest.raises(TableNotFound):
        c.events("no_such_table")
    with pytest.raises(SnapshotUnavailable, match="newer than the log"):
        c.changes("bad_in", 0, 10**9)
    assert c.changes("bad_in", 0).num_rows == 0
    c.close()
