"""Table lifecycle: DROP TABLE as a transaction at a CSN, DESCRIBE, ALTER TABLE (add a
nullable column, rename a column) with parts written before read under the new schema, bad
alters, definitions too large for a znode, the CLI subcommands, and replicas that converge and
restart with it all. Against real replica processes and ZooKeeper."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from click.testing import CliRunner
from support.cluster import make_cluster  # tests/ is on sys.path
from support.data import ID_V, id_rows, ids
from support.waiting import wait_until

import coordinator
from coordinator.errors import (
    ConflictError,
    ConflictKind,
    CorruptMetadata,
    InvalidInput,
    TableNotFound,
)
from mergetxn.client import Client
from mergetxn.local.zkserver import ZooKeeperServer

pytestmark = pytest.mark.zk

KEYED = pa.schema([pa.field("id", pa.int64(), False), ("v", pa.string())])  # a keys table's ID_V


@pytest.fixture(scope="module")
def cluster(zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    # inline_rows 0: these tests follow the files cleanup collects (docs/architecture/small-writes.md)
    with make_cluster(
        tmp_path_factory, zk_server, "lifecycle", replicas=2, settings={"inline_rows": 0, "gc_grace_seconds": 3600}
    ) as c:
        yield c


def part_files(cluster: coordinator.LocalCluster, table: str) -> set[str]:
    root = Path(cluster.storage_url) / table
    return {str(p.relative_to(root)) for p in root.rglob("*.parquet")} if root.exists() else set()


# ---------------------------------------------------------------------------------------------
# DROP TABLE


def test_drop_is_a_transaction_at_a_csn(cluster: coordinator.LocalCluster, c0: Client, c1: Client) -> None:
    c0.create_table("dropme", ID_V, auto_merge=False)
    with c0.transaction() as tx:
        tx.insert("dropme", id_rows(3))
    before = tx.csn
    drop = c0.drop_table("dropme")
    assert drop > before
    # before the drop: still there; after: gone, on both replicas
    assert ids(c0.read("dropme", snapshot=before)) == [0, 1, 2]
    for c in (c0, c1):
        c.wait_for(drop)
        with pytest.raises(TableNotFound, match=f"dropped at CSN {drop}"):
            c.read("dropme")
        assert "dropme" not in c.tables()
    assert ids(c1.read("dropme", snapshot=before)) == [0, 1, 2]
    with pytest.raises(TableNotFound):
        c0.describe_table("dropme")
    # a table of the same name again, with another schema: empty, and the old snapshot still reads the old one
    schema = pa.schema([("k", pa.string())])
    created = c1.create_table("dropme", schema)
    assert created > drop
    assert c0.read("dropme").num_rows == 0
    with c0.transaction() as tx:
        tx.insert("dropme", pa.table({"k": ["a"]}, schema=schema))
    assert (
        c1.read("dropme").to_pylist() == [{"k": "a"}]
        or c1.wait_for(tx.csn)
        or c1.read("dropme").to_pylist() == [{"k": "a"}]
    )
    assert ids(c0.read("dropme", snapshot=before)) == [0, 1, 2]
    with pytest.raises(TableNotFound):
        c0.read("dropme", snapshot=drop)


def test_writer_concurrent_with_a_drop_conflicts(c0: Client, c1: Client) -> None:
    c0.create_table("race", ID_V, auto_merge=False)
    writer = c1.begin()  # on the other replica
    writer.insert("race", id_rows(2))
    drop = c0.drop_table("race")
    with pytest.raises(ConflictError) as info:
        writer.commit()
    assert info.value.kind is ConflictKind.TABLE_DROPPED
    assert f"dropped at CSN {drop}" in info.value.message
    # and also when the table was created again meanwhile
    c0.create_table("race", ID_V, auto_merge=False)
    stale = c0.begin()
    stale.insert("race", id_rows(1))
    c1.drop_table("race")
    c1.create_table("race", ID_V, auto_merge=False)
    with pytest.raises(ConflictError, match="dropped"):
        stale.commit()
    assert c0.read("race").num_rows == 0


def test_drop_wins_over_a_part_committed_just_before_it(c0: Client, c1: Client) -> None:
    """A part committed on another replica right before the drop is removed by it too."""
    c0.create_table("late", ID_V, auto_merge=False)
    dropper = c0.begin()
    dropper.drop_table("late")
    with c1.transaction() as tx:
        tx.insert("late", id_rows(4))
    csn = dropper.commit()
    assert csn > tx.csn
    c1.wait_for(csn)
    parts = c1.parts  # the part record remains (removed by the drop) until cleanup
    with pytest.raises(TableNotFound):
        parts("late")
    assert ids(c1.read("late", snapshot=tx.csn)) == [0, 1, 2, 3]


def test_a_table_made_again_with_another_schema_takes_inserts_of_it(c0: Client, c1: Client) -> None:
    """A client that looked a table up keeps its definition for one-call inserts; a table of the
    same name dropped and made again with another schema, by this client or another, takes rows
    of the new schema from it at once (the old definition refused them as unknown columns)."""
    day = pa.schema([("id", pa.int64()), ("day", pa.string())])
    for dropper in (c0, c1):
        c0.create_table("again", ID_V)
        c0.insert("again", id_rows(2))
        dropper.drop_table("again")
        made = dropper.create_table("again", day)
        c0.read("again", snapshot=made)  # replica 0 has applied the new table (an insert there begins after it)
        c0.insert("again", pa.table({"id": [1], "day": ["mon"]}, schema=day))
        assert c0.read("again").to_pylist() == [{"id": 1, "day": "mon"}]
        c0.drop_table("again")


@pytest.mark.parametrize("policy", ["parts", "keys"])
def test_changes_across_a_drop_and_a_table_made_again(c0: Client, policy: str) -> None:
    """``changes`` over a range that reaches back past a drop into an earlier table of the name:
    with the same definition the drop deletes every row it had (a keys table showed none: its
    rows lived on in the changes), and what the changes add up to is the read at the end; with
    another definition InvalidInput names the drop (a raw pyarrow error before)."""
    keys = {"primary_key": ("id",), "conflict_policy": "keys"} if policy == "keys" else {}
    table = f"again_{policy}"
    c0.create_table(table, KEYED, **keys)
    c0.insert(table, id_rows(3).cast(KEYED))
    dropped = c0.drop_table(table)
    c0.create_table(table, KEYED, **keys)
    c0.insert(table, id_rows(2, 2).cast(KEYED))
    got = [(r["id"], r["_change"], r["_csn"]) for r in c0.changes(table, 0).to_pylist()]
    assert sorted(x for x in got if x[2] == dropped) == [
        (0, "delete", dropped),
        (1, "delete", dropped),
        (2, "delete", dropped),
    ]
    net: dict[int, int] = {}
    for i, change, _ in got:
        net[i] = net.get(i, 0) + (1 if change == "insert" else -1)
    assert sorted(i for i, n in net.items() if n) == ids(c0.read(table)) == [2, 3]
    assert [(r["id"], r["_change"]) for r in c0.changes(table, 0, dropped - 1).to_pylist()] == [
        (0, "insert"),
        (1, "insert"),
        (2, "insert"),
    ]
    assert [r["id"] for r in c0.changes(table, dropped).to_pylist()] == [2, 3]
    by_time = c0.changes(table, datetime.fromtimestamp(0, UTC), by="time").to_pylist()
    assert sorted((r["id"], r["_change"]) for r in by_time) == sorted((i, ch) for i, ch, _ in got)
    c0.drop_table(table)
    c0.create_table(table, pa.schema([pa.field("id", pa.string(), False), ("v", pa.int64())]), **keys)
    with pytest.raises(InvalidInput, match=r"reaches back past its drop at CSN \d+ into a table of the same name"):
        c0.changes(table, 0)
    c0.drop_table(table)


def test_changes_refuse_drops_that_are_not_csns(c0: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``changes`` answer naming drops that are not CSNs is CorruptMetadata, and the answer's
    lease is let go."""
    c0.create_table("forged_drops", KEYED)
    c0.insert("forged_drops", id_rows(1).cast(KEYED))
    call, leases, released = c0.call, [], []

    def forged(action: str, **args: object) -> dict:
        if action == "release":
            released.append(args["lease"])
        r = call(action, **args)
        if action == "changes":
            leases.append(r["lease"])
            r["dropped"] = ["3"]
        return r

    monkeypatch.setattr(c0, "call", forged)
    with pytest.raises(CorruptMetadata, match=r"drops that are not CSNs: \['3'\]"):
        c0.changes("forged_drops", 0)
    assert leases and leases[0] is not None and released == leases
    monkeypatch.undo()
    c0.drop_table("forged_drops")


def test_drop_in_a_transaction_cannot_write_the_table(c0: Client) -> None:
    c0.create_table("both", ID_V, auto_merge=False)
    tx = c0.begin()
    tx.insert("both", id_rows(1))
    with pytest.raises(InvalidInput, match="cannot also write"):
        tx.drop_table("both")
    tx.rollback()
    tx = c0.begin()
    tx.drop_table("both")
    with pytest.raises(InvalidInput, match="cannot also write"):
        tx.insert("both", id_rows(1))
    tx.rollback()
    assert "both" in c0.tables()


def test_gc_collects_a_dropped_table_only_when_no_snapshot_in_use_sees_it(
    cluster: coordinator.LocalCluster, c0: Client, c1: Client
) -> None:
    c0.create_table("collect", ID_V, auto_merge=False)
    with c0.transaction() as tx:
        tx.insert("collect", id_rows(3))
    files = part_files(cluster, "collect")
    assert files
    c1.wait_for(tx.csn)
    holder = c1.begin()  # a running transaction on the other replica holds the snapshot before the drop
    assert ids(holder.read("collect")) == [0, 1, 2]
    c0.drop_table("collect")
    report = c0.gc()
    assert part_files(cluster, "collect") == files, report  # still seen by the holder's snapshot
    assert ids(holder.read("collect")) == [0, 1, 2]
    kept = [k for k in report["kept"] if k["table"] == "collect"]
    assert kept and all("snapshot" in k["reason"] for k in kept), report
    holder.rollback()
    # once replica 1 publishes that the holder ended, a pass collects the files
    wait_until(
        lambda: (c0.gc(), part_files(cluster, "collect") == set())[1],
        30,
        "a cleanup pass that collects the dropped table's files",
    )


# ---------------------------------------------------------------------------------------------
# DESCRIBE


def test_describe(c0: Client) -> None:
    schema = pa.schema([("p", pa.int64()), ("id", pa.int64()), ("v", pa.string())])
    created = c0.create_table(
        "described", schema, partition_by=["p"], primary_key=["id"], conflict_policy="append", auto_merge=False
    )
    with c0.transaction() as tx:
        tx.insert("described", pa.table({"p": [1, 1, 2], "id": [1, 2, 3], "v": ["a", "b", "c"]}, schema=schema))
    d = c0.describe_table("described")
    assert d["schema"] == schema
    assert d["partition_by"] == ("p",) and d["primary_key"] == ("id",)
    assert d["conflict_policy"] == "append" and d["auto_merge"] is False
    assert d["created_csn"] == created
    assert (d["parts"], d["rows"], d["partitions"]) == (2, 3, 2)
    assert d["schema_version"] == 0 and d["history"] == [{"csn": created, "ddl_version": 0, "what": "created"}]
    assert c0.describe_table("described", snapshot=created)["rows"] == 0


# ---------------------------------------------------------------------------------------------
# ALTER TABLE


def test_add_column(c0: Client, c1: Client) -> None:
    c0.create_table("grow", ID_V, auto_merge=False)
    with c0.transaction() as tx:
        tx.insert("grow", id_rows(2))
    old = tx.csn
    altered = c0.alter_table("grow", add_columns=[pa.field("n", pa.int32())])
    new_schema = ID_V.append(pa.field("n", pa.int32()))
    # old parts read with nulls in the new column, on both replicas
    c1.wait_for(altered)
    for c in (c0, c1):
        assert c.read("grow").to_pylist() == [{"id": 0, "v": "v0", "n": None}, {"id": 1, "v": "v1", "n": None}]
    assert c0.read("grow", snapshot=old).schema == ID_V  # the schema at that snapshot
    # writers that predate the column go on: it is nullable, so they write null
    # (docs/surface.md#tables)
    tx = c1.begin()
    tx.insert("grow", id_rows(1, start=4))
    tx.insert("grow", pa.table({"id": [5], "v": ["x"], "n": [7]}, schema=new_schema))
    tx.commit()
    c0.wait_for(tx.csn)
    assert sorted(c0.read("grow").to_pylist(), key=lambda r: r["id"])[-2:] == [
        {"id": 4, "v": "v4", "n": None},
        {"id": 5, "v": "x", "n": 7},
    ]
    assert c0.read("grow", where=pc.field("n") == 7).num_rows == 1
    assert c0.read("grow", where=pc.field("n").is_null()).num_rows == 3
    d = c0.describe_table("grow")
    assert d["schema"] == new_schema and d["schema_version"] == 1 and d["version_csn"] == altered
    # compaction merges parts of both schema versions
    c0.compact("grow", kind="major")
    assert sorted(c0.read("grow").to_pylist(), key=lambda r: r["id"]) == [
        {"id": 0, "v": "v0", "n": None},
        {"id": 1, "v": "v1", "n": None},
        {"id": 4, "v": "v4", "n": None},
        {"id": 5, "v": "x", "n": 7},
    ]
    # changes see the schema at their end
    ch = c0.changes("grow", 0, old)
    assert ch.schema.names == ["id", "v", "_change", "_csn"]
    assert c0.changes("grow", 0).schema.names == ["id", "v", "n", "_change", "_csn"]


def test_rename_column(c0: Client, c1: Client) -> None:
    c0.create_table("renamed", ID_V, auto_merge=False)
    with c0.transaction() as tx:
        tx.insert("renamed", id_rows(2))
    old = tx.csn
    altered = c1.alter_table("renamed", rename_columns={"v": "label"})
    c0.wait_for(altered)
    assert c0.read("renamed").column_names == ["id", "label"]
    assert c0.read("renamed").column("label").to_pylist() == ["v0", "v1"]
    assert c0.read("renamed", snapshot=old).column_names == ["id", "v"]  # the old name at the old snapshot
    assert c0.read("renamed", where=pc.field("label") == "v1").num_rows == 1
    with c0.transaction() as tx:
        tx.insert("renamed", pa.table({"id": [9], "label": ["new"]}))
        tx.delete("renamed", pc.field("label") == "v0")
    assert sorted(c1.read("renamed").column("label").to_pylist()) == ["new", "v1"] or (
        c1.wait_for(tx.csn) or sorted(c1.read("renamed").column("label").to_pylist()) == ["new", "v1"]
    )
    # swap two names in one alter
    c0.alter_table("renamed", rename_columns={"label": "id2", "id": "label"})
    assert sorted(c0.read("renamed").to_pylist(), key=lambda r: r["label"]) == [
        {"label": 1, "id2": "v1"},
        {"label": 9, "id2": "new"},
    ]


def test_a_transaction_begun_before_an_alter_still_commits(c0: Client, c1: Client) -> None:
    """Its parts were written for the schema it saw; they read under the new one."""
    c0.create_table("overlap", ID_V, auto_merge=False)
    tx = c0.begin()
    tx.insert("overlap", id_rows(2))
    c1.alter_table("overlap", add_columns=[pa.field("extra", pa.string())], rename_columns={"v": "w"})
    tx.commit()
    assert c0.read("overlap").to_pylist() == [{"id": 0, "w": "v0", "extra": None}, {"id": 1, "w": "v1", "extra": None}]


def test_bad_alters_change_nothing(c0: Client) -> None:
    schema = pa.schema([("p", pa.int64()), ("id", pa.int64()), ("v", pa.string())])
    c0.create_table("strict", schema, partition_by=["p"], primary_key=["id"], auto_merge=False)
    before = (c0.describe_table("strict"), c0.snapshot())
    cases = [
        (dict(add_columns=[pa.field("z", pa.int64(), nullable=False)]), "'z' as not nullable"),
        (dict(add_columns=[pa.field("v", pa.int64())]), "cannot add column 'v'"),
        (dict(rename_columns={"v": "id"}), "cannot rename to 'id'"),
        (dict(rename_columns={"ghost": "g"}), "unknown column 'ghost'"),
        (dict(rename_columns={"p": "q"}), "partition column 'p'"),
        (dict(rename_columns={"id": "key"}), "primary key column 'id'"),
        (dict(rename_columns={"v": "a/b"}), "'a/b'"),
        (dict(), "nothing to change"),
        (dict(add_columns="n int"), "add_columns"),
    ]
    for kwargs, message in cases:
        with pytest.raises(InvalidInput, match=message):
            c0.alter_table("strict", **kwargs)
    assert (c0.describe_table("strict"), c0.snapshot()) == before
    with pytest.raises(TableNotFound):
        c0.alter_table("nosuch", add_columns=[pa.field("n", pa.int64())])


# ---------------------------------------------------------------------------------------------
# Definitions too large for a znode


def test_a_table_of_thousands_of_columns(c0: Client, c1: Client) -> None:
    """Its definition is larger than ZooKeeper's node limit: the DDL entry goes to a manifest in
    storage, as a large change set does (it failed after 6-93 s as TransactionAborted)."""
    n = 12_000
    schema = pa.schema([("id", pa.int64())] + [(f"column_with_a_long_name_{i:05d}", pa.int64()) for i in range(n)])
    assert len(coordinator.model.catalog.TableDef.new("wide", schema).to_dict()["schema"]) > 1_000_000
    csn = c0.create_table("wide", schema, auto_merge=False)
    c1.wait_for(csn)
    assert c1.describe_table("wide")["schema"] == schema
    extra = [pa.field(f"added_{i:05d}", pa.string()) for i in range(2000)]
    altered = c1.alter_table("wide", add_columns=extra)
    c0.wait_for(altered)
    assert len(c0.describe_table("wide")["schema"]) == n + 1 + 2000


# ---------------------------------------------------------------------------------------------
# Replicas converge and restart with the schema versions


def test_restart_keeps_drops_and_schema_versions(cluster: coordinator.LocalCluster) -> None:
    c0 = cluster.client(0)
    c0.create_table("survive", ID_V, auto_merge=False)
    with c0.transaction() as tx:
        tx.insert("survive", id_rows(2))
    c0.alter_table("survive", add_columns=[pa.field("n", pa.int64())], rename_columns={"v": "w"})
    c0.create_table("gone", ID_V, auto_merge=False)
    with c0.transaction() as tx:
        tx.insert("gone", id_rows(1))
    kept = tx.csn
    last = c0.drop_table("gone")
    cluster.kill_replica(1)
    cluster.start_replica(1)
    c1 = cluster.client(1)
    c1.wait_for(last)
    assert c1.read("survive").to_pylist() == [{"id": 0, "w": "v0", "n": None}, {"id": 1, "w": "v1", "n": None}]
    assert c1.describe_table("survive")["schema_version"] == 1
    with pytest.raises(TableNotFound, match="dropped"):
        c1.read("gone")
    assert ids(c1.read("gone", snapshot=kept)) == [0]


# ---------------------------------------------------------------------------------------------
# The command line


def test_cli_table_subcommands(cluster: coordinator.LocalCluster, c0: Client) -> None:
    from mergetxn.cli import cli as main

    runner = CliRunner()
    addr = cluster.replica_addresses[0]
    c0.create_table("clitab", ID_V, auto_merge=False)
    r = runner.invoke(main, ["table", "describe", "clitab", "--replica", addr, "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["name"] == "clitab" and [c["name"] for c in d["columns"]] == ["id", "v"]
    r = runner.invoke(
        main,
        [
            "table",
            "alter",
            "clitab",
            "--replica",
            addr,
            "--add-column",
            "n:int64",
            "--rename-column",
            "v=label",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    assert c0.describe_table("clitab")["schema"].names == ["id", "label", "n"]
    r = runner.invoke(main, ["table", "alter", "clitab", "--replica", addr, "--rename-column", "ghost=x"])
    assert r.exit_code == 2 and "ghost" in r.output
    r = runner.invoke(main, ["table", "describe", "clitab", "--replica", addr])
    assert r.exit_code == 0 and "label" in r.output
    # insert and read by the command line after the ALTER: parts for the new schema version
    before = c0.snapshot()
    src = cluster.workdir / "clitab.csv"
    src.write_text("id,label,n\n1,a,10\n2,b,20\n")
    r = runner.invoke(main, ["insert", "clitab", str(src), "--replica", addr, "--json"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["read", "clitab", "--replica", addr, "--format", "json"])
    assert r.exit_code == 0, r.output
    rows = sorted((json.loads(line) for line in r.stdout.splitlines() if line.strip()), key=lambda x: x["id"])
    assert rows == [{"id": 1, "label": "a", "n": 10}, {"id": 2, "label": "b", "n": 20}]
    r = runner.invoke(main, ["read", "clitab", "--replica", addr, "--format", "csv", "--snapshot", str(before)])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[0].replace('"', "") == "id,label,n"  # the schema at that snapshot
    r = runner.invoke(main, ["table", "drop", "clitab", "--replica", addr, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["csn"] > 0
    r = runner.invoke(main, ["table", "drop", "clitab", "--replica", addr])
    assert r.exit_code == 3 and "clitab" in r.output  # 3: not found
    r = runner.invoke(main, ["table", "describe", "clitab", "--replica", addr])
    assert r.exit_code == 3
