"""History retention (docs/rules.md#history-retention) and parts no refused or repeated commit can
touch, against real ZooKeeper and three real replica processes.

``win``: three replicas with the default window set explicitly (3600 s; the test session's
default is 0, see conftest.py), nothing in the background: every cleanup pass is asked for here,
so what it keeps and removes is deterministic.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from support.cluster import make_cluster  # tests/ is on sys.path
from support.data import id_rows, ids
from support.waiting import wait_until
from support.zk import kazoo

from coordinator import LocalCluster
from coordinator.errors import CorruptMetadata, InvalidInput, SnapshotUnavailable
from coordinator.zk.watermark import Marks
from mergetxn.cli import cli
from mergetxn.client import Client
from mergetxn.local.zkserver import ZooKeeperServer
from mergetxn.tools.status import gather
from parts.io.format import write_part

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])
PSCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string())])


@pytest.fixture(scope="module")
def win(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator[LocalCluster]:
    with make_cluster(
        tmp_path_factory,
        zk_server,
        "retention",
        replicas=3,
        settings={
            # inline_rows 0: these tests follow the files cleanup collects (docs/architecture/small-writes.md)
            "inline_rows": 0,
            "retention_seconds": 3600,
            "merge_interval": 0,
            "gc_interval": 0,
            "read_lease_seconds": 1,
        },
    ) as c:
        yield c


@pytest.fixture
def c0(win: LocalCluster) -> Iterator[Client]:
    c = win.client(0)
    yield c
    c.close()


def every_replica(win: LocalCluster) -> list[Client]:
    return [win.client(i) for i in range(3)]


def rows(t: pa.Table) -> list[int]:
    return sorted(ids(t))


def commit(c: Client, table: str, data: pa.Table) -> int:
    with c.transaction() as tx:
        tx.insert(table, data)
    return tx.csn


# -- the surface ----------------------------------------------------------------------------------
def test_retention_is_set_altered_and_described(win: LocalCluster, c0: Client) -> None:
    c0.create_table("rt_default", SCHEMA)
    c0.create_table("rt_own", SCHEMA, retention_seconds=5)
    assert c0.describe_table("rt_default")["retention_seconds"] == 3600  # the replicas' default
    assert c0.describe_table("rt_own")["retention_seconds"] == 5
    csn = c0.alter_table("rt_own", retention_seconds=120.5)
    assert c0.describe_table("rt_own")["retention_seconds"] == 120.5
    assert win.client(2).describe_table("rt_own", snapshot=csn)["retention_seconds"] == 120.5
    c0.alter_table("rt_own", retention_seconds=None)  # back to the replicas' default
    assert c0.describe_table("rt_own")["retention_seconds"] == 3600
    c0.create_table(
        "rt_keys",
        pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.int64())]),
        primary_key=["k"],
        conflict_policy="keys",
        retention_seconds=0,
    )
    c0.alter_table("rt_keys", retention_seconds=7)  # any table, keys tables included
    assert c0.describe_table("rt_keys")["retention_seconds"] == 7


@pytest.mark.parametrize("bad", [-1, -0.5, math.nan, math.inf, "60", True, [1]])
def test_bad_retention_is_refused_and_changes_nothing(win: LocalCluster, c0: Client, bad: object) -> None:
    before = c0.snapshot()
    with pytest.raises(InvalidInput, match="retention_seconds"):
        c0.create_table("rt_bad", SCHEMA, retention_seconds=bad)
    assert "rt_bad" not in c0.tables() and c0.snapshot() == before
    c0.create_table("rt_alter_bad", SCHEMA, retention_seconds=9) if "rt_alter_bad" not in c0.tables() else None
    before = c0.snapshot()
    with pytest.raises(InvalidInput, match="retention_seconds"):
        c0.alter_table("rt_alter_bad", retention_seconds=bad)
    assert c0.snapshot() == before and c0.describe_table("rt_alter_bad")["retention_seconds"] == 9


def test_the_replica_setting_is_checked(tmp_path: Path) -> None:
    for bad in (-1, "x", math.inf):
        with pytest.raises(InvalidInput, match="retention_seconds"):
            LocalCluster(tmp_path / "never", replicas=1, settings={"retention_seconds": bad})


def test_cli_table_create_alter_describe(win: LocalCluster) -> None:
    runner = CliRunner()
    base = ["--replica", win.replica_addresses[0]]
    r = runner.invoke(cli, ["table", "create", "rt_cli", "--schema", "id:int64", "--retention-seconds", "30", *base])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["table", "describe", "rt_cli", "--json", *base])
    assert json.loads(r.output)["retention_seconds"] == 30
    r = runner.invoke(cli, ["table", "describe", "rt_cli", *base])
    assert "history retention: 30s (the table's own)" in r.output
    r = runner.invoke(cli, ["table", "alter", "rt_cli", "--retention-seconds", "default", "--json", *base])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["retention_seconds"] == 3600
    r = runner.invoke(cli, ["table", "alter", "rt_cli", "--retention-seconds", "-3", *base])
    assert r.exit_code == 2 and "retention_seconds" in r.output + (r.stderr or "")


# -- within the window ----------------------------------------------------------------------------
def test_snapshots_and_changes_in_the_window_survive_compaction_and_cleanup(win: LocalCluster, c0: Client) -> None:
    """Issue 19's first defect: a compaction replaced the parts a snapshot saw, then cleanup ran;
    the snapshot, time travel to it and changes from it must still read on every replica, and the
    cleanup report says the parts are kept for the window, and until when."""
    t = "rt_window"
    c0.create_table(t, SCHEMA, auto_merge=False)
    a = commit(c0, t, id_rows(3))
    at_a = dt.datetime.now(dt.UTC)
    b = commit(c0, t, id_rows(2, start=10))
    c0.compact(t, kind="major")
    with c0.transaction() as tx:
        tx.truncate(t)

    def settled() -> dict | None:  # once every replica published that it applied the truncate
        report = c0.gc()
        assert not [r for r in report["removed"] if r["table"] == t]
        kept = [k for k in report["kept"] if k["table"] == t]
        return report if len(kept) >= 3 and all("retention window" in k["reason"] for k in kept) else None

    report = wait_until(settled, 30, "the replicas to publish the truncate as applied")
    kept = [k for k in report["kept"] if k["table"] == t]
    for k in kept:
        assert "retention window" in k["reason"] and "retention_seconds=3600" in k["reason"], k
        until = dt.datetime.fromisoformat(k["reason"].rsplit("kept until ", 1)[1])
        assert dt.timedelta(seconds=3590) < until - dt.datetime.now(dt.UTC) <= dt.timedelta(seconds=3600)
    assert report["kept_for_window"] >= 3
    for c in every_replica(win):
        assert rows(c.read(t, snapshot=a)) == [0, 1, 2]
        assert rows(c.read(t, as_of=at_a)) == [0, 1, 2]
        assert rows(c.read(t, snapshot=b)) == [0, 1, 2, 10, 11]
        assert c.read(t, snapshot=tx.csn).num_rows == 0
        ch = c.changes(t, a, compactions=False)
        assert sorted(ch.filter(pa.compute.equal(ch["_change"], "insert"))["id"].to_pylist()) == [10, 11]
        assert sorted(ch.filter(pa.compute.equal(ch["_change"], "delete"))["id"].to_pylist()) == [0, 1, 2, 10, 11]
        assert c.check(t)["ok"]
        c.close()
    notes = {p["name"]: p for p in c0.parts(t).to_pylist()}
    assert all(not p["visible"] for p in notes.values())


def test_a_short_window_expires(win: LocalCluster, c0: Client) -> None:
    """Beyond the window only snapshots in use are protected: once it has passed, cleanup takes
    the parts and a read there is refused on every replica, naming the table's retention."""
    t = "rt_short"
    c0.create_table(t, SCHEMA, auto_merge=False, retention_seconds=1)
    a = commit(c0, t, id_rows(3))
    with c0.transaction() as tx:
        tx.overwrite(t, id_rows(1, start=7))
    wait_until(lambda: any(r["table"] == t for r in c0.gc()["removed"]), 30, "the 1 s window to pass")
    for c in every_replica(win):
        with pytest.raises(SnapshotUnavailable, match=r"table 'rt_short' keeps history for 1s \(retention_seconds\)"):
            c.read(t, snapshot=a)
        with pytest.raises(SnapshotUnavailable, match="retention_seconds"):
            c.changes(t, a - 1)
        assert rows(c.read(t, snapshot=tx.csn)) == [7]
        c.close()


def test_a_short_window_brings_background_cleanup_sooner(
    tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer
) -> None:
    """Background passes come every ``gc_interval`` or a quarter of the shortest retention window,
    whichever is shorter (at least 1 s): with ``gc_interval`` an hour and a table's window 2 s, the
    file of a part removed there is collected by a background pass (nobody asks for one) within
    seconds, so storage holds little beyond the live data and the window's removed parts."""
    settings = {"inline_rows": 0, "merge_interval": 0, "gc_interval": 3600, "retention_seconds": 3600}
    with make_cluster(tmp_path_factory, zk_server, "short-window-gc", replicas=1, settings=settings) as c:
        client = c.client(0)
        client.create_table("sw", SCHEMA, auto_merge=False, retention_seconds=2)
        commit(client, "sw", id_rows(3))
        (path,) = client.parts("sw").column("path").to_pylist()
        with client.transaction() as tx:
            tx.overwrite("sw", id_rows(1, start=7))
        assert os.path.exists(os.path.join(c.storage_url, path)), "the removed part's file is in its window"
        wait_until(lambda: not os.path.exists(os.path.join(c.storage_url, path)), 30, "a background pass")
        assert rows(client.read("sw")) == [7]
        client.close()


def test_zero_keeps_only_snapshots_in_use(win: LocalCluster, c0: Client) -> None:
    t = "rt_zero"
    c0.create_table(t, SCHEMA, auto_merge=False, retention_seconds=0)
    a = commit(c0, t, id_rows(3))
    c1 = win.client(1)
    c1.call("wait", snapshot=a)
    reader = c1.begin()  # holds snapshot a (or later, with nothing of t changed)
    assert reader.snapshot >= a
    with c0.transaction() as tx:
        tx.overwrite(t, id_rows(1, start=7))

    def named() -> list | None:  # once r1 published the reader's snapshot
        report = c0.gc()
        assert not [r for r in report["removed"] if r["table"] == t]
        kept = [k for k in report["kept"] if k["table"] == t]
        return kept if kept and all(reader.id in k["reason"] for k in kept) else None

    wait_until(named, 30, "the reader's snapshot to keep the part")
    assert rows(reader.read(t)) == [0, 1, 2]
    reader.rollback()
    removed = wait_until(
        lambda: [r for r in c0.gc()["removed"] if r["table"] == t], 30, "cleanup to take the part once the reader ended"
    )
    assert len(removed) == 1
    for c in every_replica(win):
        with pytest.raises(SnapshotUnavailable, match="keeps history for 0s"):
            c.read(t, snapshot=a)
        c.close()


def test_the_gc_node_keeps_horizons_only_of_tables_with_parts_in_storage(
    tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer
) -> None:
    """Once cleanup collected every removed part at or below a table's removals (``collected``
    is one number for the cluster: a part kept for a longer window holds it back), that table's
    horizon leaves the gc node (what it could say is covered by ``legacy``), so the node holds
    the tables with removals still in storage, not every table ever cleaned; reads keep being
    refused alike."""
    with make_cluster(
        tmp_path_factory,
        zk_server,
        "retention-node",
        replicas=1,
        # inline_rows 0: these tests follow the files cleanup collects (docs/architecture/small-writes.md)
        settings={
            "inline_rows": 0,
            "retention_seconds": 0,
            "merge_interval": 0,
            "gc_interval": 0,
            "read_lease_seconds": 1,
        },
    ) as win:
        c0 = win.client(0)
        _horizon_goes(win, c0)
        c0.close()


def _horizon_goes(win: LocalCluster, c0: Client) -> None:
    t = "rt_node"
    c0.create_table(t, SCHEMA, auto_merge=False)
    a = commit(c0, t, id_rows(3))
    with c0.transaction() as tx:
        tx.overwrite(t, id_rows(1, start=7))
    wait_until(lambda: any(r["table"] == t for r in c0.gc()["removed"]), 30, "cleanup to take the part")
    c0.gc()  # the pass after: collected is past the removal, the horizon goes
    with kazoo(win.zk_address) as zk:
        marks = Marks.parse(zk.get(f"{win.root}/gc")[0], "gc")
    assert t not in marks.horizons and marks.legacy >= tx.csn
    assert marks.may_be_gone(t, tx.csn, time.time())
    with pytest.raises(SnapshotUnavailable):
        c0.read(t, snapshot=a)


def test_the_window_survives_a_replica_restart(win: LocalCluster, c0: Client) -> None:
    t = "rt_restart"
    c0.create_table(t, SCHEMA, auto_merge=False)
    a = commit(c0, t, id_rows(3))
    with c0.transaction() as tx:
        tx.overwrite(t, id_rows(1, start=7))
    win.kill_replica(2)
    win.start_replica(2)
    c2 = win.client(2)

    def decided() -> dict | None:  # by the restarted replica: the removal's time came back with it
        report = c2.gc()
        assert not any(r["table"] == t for r in report["removed"])
        kept = [k for k in report["kept"] if k["table"] == t]
        return report if kept and all("retention window" in k["reason"] for k in kept) else None

    wait_until(decided, 30, "every replica to publish the overwrite as applied")
    for c in (c2, win.client(0)):
        assert rows(c.read(t, snapshot=a)) == [0, 1, 2]
    c2.close()


# -- the gc node (pure) ---------------------------------------------------------------------------
def test_marks_decide_what_may_be_gone() -> None:
    m = Marks(watermark=10, collected=5, horizons={"t": 100.0}, legacy=3)
    assert m.may_be_gone("t", 3, None) and m.may_be_gone("u", 2, 999.0)  # legacy: any table
    assert m.may_be_gone("t", 10, 100.0) and not m.may_be_gone("t", 10, 100.5)  # the window
    assert not m.may_be_gone("t", 11, 0.0)  # above the watermark: in use
    assert not m.may_be_gone("u", 9, 0.0)  # no horizon for u: nothing of it collected
    assert not m.may_be_gone("t", None, None)
    other = Marks(watermark=8, collected=7, horizons={"t": 50.0, "u": 20.0})
    both = m.merged(other)
    assert both == other.merged(m)
    assert (both.watermark, both.collected, dict(both.horizons), both.legacy) == (10, 7, {"t": 100.0, "u": 20.0}, 3)


def test_marks_parse_old_and_refuse_garbage() -> None:
    old = Marks.parse(b'{"watermark": 12, "collected": 12}', "/gc")
    assert old.legacy == 12 and old.may_be_gone("any", 12, None)
    new = Marks.parse(Marks(4, 3, {"t": 1.5}, 0).to_bytes("r0"), "/gc")
    assert (new.watermark, new.collected, dict(new.horizons)) == (4, 3, {"t": 1.5})
    for bad in (
        b"[",
        b"[]",
        b'{"watermark": -1}',
        b'{"watermark": 1, "horizons": {"t": "x"}}',
        b'{"watermark": 1, "horizons": {"t": NaN}}',
        b'{"watermark": true}',
    ):
        with pytest.raises(CorruptMetadata, match="/gc"):
            Marks.parse(bad, "/gc")


# -- a part name is committed at most once ----------------------------------------------------------
def test_a_repeated_one_call_commit_is_answered_with_its_csn_and_changes_nothing(win: LocalCluster, c0: Client) -> None:
    """A writer that re-sends its batch after a lost answer: within the grace window it used to
    commit again at a new CSN B (a read at A then returned nothing); past half the grace period
    it was refused and the client deleted the committed files. Now: the same commit, its CSN,
    whenever it comes (the retry is answered before the age of the parts is looked at), as long as
    its metadata is what was committed (docs/rules.md, "What a part's metadata is checked
    against"): another ``created_at`` is other metadata, refused, and changes nothing."""
    t = "rt_resend"
    c0.create_table(t, SCHEMA)
    meta = write_part(c0.storage, t, [], (), id_rows(3), "job-1")
    a = c0.commit_parts(t, [meta])
    assert c0.commit_parts(t, [meta]) == a  # sent again at once
    old = dataclasses.replace(meta, created_at=time.time() - 3600)
    with pytest.raises(InvalidInput, match="other metadata"):
        c0.commit_parts(t, [old])
    assert c0.commit_parts(t, [meta]) == a
    for c in every_replica(win):
        assert rows(c.read(t, snapshot=a)) == [0, 1, 2]
        ch = c.changes(t, 0)
        assert ch["_csn"].to_pylist() == [a, a, a]
        c.close()
    assert (Path(win.storage_url) / meta.path).exists()


def test_a_committed_part_in_another_commit_is_refused_and_every_file_stays(win: LocalCluster, c0: Client) -> None:
    t = "rt_twice"
    c0.create_table(t, SCHEMA)
    meta = write_part(c0.storage, t, [], (), id_rows(3), "job-2")
    a = c0.commit_parts(t, [meta])
    other = write_part(c0.storage, t, [], (), id_rows(2, start=10), "job-3")
    before = c0.snapshot()
    for metas in ([meta, other], [dataclasses.replace(meta, created_at=time.time() - 3600), other]):
        with pytest.raises(InvalidInput, match=f"part {meta.name} .* was committed at CSN {a}"):
            c0.commit_parts(t, metas)
    with c0.transaction() as tx:  # the same in a transaction: the statement is refused
        with pytest.raises(InvalidInput, match=f"committed at CSN {a}"):
            tx.add_parts(t, [meta])
        tx.add_parts(t, [other])  # the transaction goes on
    assert c0.snapshot() == tx.csn and tx.csn == before + 1
    for c in every_replica(win):
        assert rows(c.read(t, snapshot=a)) == [0, 1, 2]
        assert rows(c.read(t, snapshot=tx.csn)) == [0, 1, 2, 10, 11]  # waits until that replica applied it
        assert c.check(t)["ok"]
        c.close()
    assert (Path(win.storage_url) / meta.path).exists() and (Path(win.storage_url) / other.path).exists()


def test_a_part_cannot_name_another_tables_file(win: LocalCluster, c0: Client) -> None:
    """Issue 20: a part of table A staged with table B's committed file as its path, then rolled
    back, deleted B's file; a committed part of A could read B's rows."""
    c0.create_table("rt_victim", SCHEMA)
    c0.create_table("rt_thief", SCHEMA)
    victim = write_part(c0.storage, "rt_victim", [], (), id_rows(3), "job-4")
    c0.commit_parts("rt_victim", [victim])
    mine = write_part(c0.storage, "rt_thief", [], (), id_rows(1), "job-5")
    forged = [
        dataclasses.replace(mine, path=victim.path, size=victim.size, checksum=victim.checksum),
        dataclasses.replace(mine, path="rt_thief/_/" + victim.name + ".parquet"),
        dataclasses.replace(victim, table="rt_thief", path="rt_thief/_/" + victim.name + ".parquet"),
    ]
    tx = c0.begin()
    for f in forged:
        with pytest.raises(InvalidInput, match="names the file|committed at CSN"):
            tx.add_parts("rt_thief", [f])
    tx.rollback()
    with pytest.raises(InvalidInput, match="names the file"):
        c0.commit_parts("rt_thief", [forged[0]])
    assert (Path(win.storage_url) / victim.path).exists()
    assert rows(c0.read("rt_victim")) == [0, 1, 2] and c0.read("rt_thief").num_rows == 0


def test_a_part_cannot_lead_out_of_the_storage_root(win: LocalCluster, c0: Client, tmp_path: Path) -> None:
    c0.create_table("rt_link", PSCHEMA, partition_by=["p"])
    outside = tmp_path / "outside"
    outside.mkdir()
    table_dir = Path(win.storage_url) / "rt_link"
    table_dir.mkdir(parents=True, exist_ok=True)
    os.symlink(outside, table_dir / "p=x")  # what a client with write access to storage can do
    tx = c0.begin()
    meta = write_part(c0.storage, "rt_link", ["p"], ("x",), pa.table({"id": [1], "p": ["x"]}, schema=PSCHEMA), tx.id)
    assert (outside / (meta.name + ".parquet")).exists()
    with pytest.raises(InvalidInput, match="out of the storage root"):
        tx.add_parts("rt_link", [meta])
    tx.rollback()
    assert (outside / (meta.name + ".parquet")).exists()  # nothing outside the root is deleted
    assert c0.read("rt_link").num_rows == 0


def test_check_and_status_report_a_missing_part_file(win: LocalCluster, c0: Client) -> None:
    t = "rt_missing"
    c0.create_table(t, SCHEMA)
    meta = write_part(c0.storage, t, [], (), id_rows(3), "job-6")
    c0.commit_parts(t, [meta])
    assert c0.check(t)["ok"]
    status = gather(win.replica_addresses[0], None, timeout=10)
    assert status["healthy"], status["problems"]
    (Path(win.storage_url) / meta.path).unlink()
    result = c0.check(t)
    assert not result["ok"]
    assert [p["part"] for p in result["tables"][0]["problems"]] == [meta.name]
    assert "is missing" in result["tables"][0]["problems"][0]["problem"]
    status = gather(win.replica_addresses[0], None, timeout=10)
    assert not status["healthy"] and any(meta.name in p for p in status["problems"])
    r = CliRunner().invoke(cli, ["check", t, "--replica", win.replica_addresses[1]])
    assert r.exit_code == 8 and meta.name in r.output
    c0.drop_table(t)  # leave the cluster healthy for the tests after this one
