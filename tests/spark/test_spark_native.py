"""``spark.read_table`` / ``spark.write_table`` (spark/native.py) against real Spark (local mode,
speculation on), a real ZooKeeper and real replica processes: round trip of types and partitions,
snapshot and as_of reads while writes commit, pruning counted by the files Spark reads, exactly
once under a failed-and-retried task, a failed job leaving nothing,
cleanup collecting a staging directory, joining a transaction, overwrite, a corrupt part found
from its footer, and the snapshot held while a read_table DataFrame lives.
"""

from __future__ import annotations

import datetime as dt
import decimal
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from support.cluster import make_cluster
from support.waiting import poll
from test_spark import as_rows  # tests/ is on sys.path

import coordinator
import spark as mspark
from coordinator.errors import CorruptPart, InvalidInput
from mergetxn.client import Client
from spark import native

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("error::spark.native.NativeFallback")]

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("k", pa.string()), ("v", pa.float64())])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    with make_cluster(tmp_path_factory, None, "nativecluster", replicas=2) as c:
        yield c


@pytest.fixture(scope="module")
def r0(cluster: coordinator.LocalCluster) -> str:
    return cluster.replica_addresses[0]


@pytest.fixture(scope="module")
def c0(cluster: coordinator.LocalCluster) -> Iterator[Client]:
    c = cluster.client(0)
    yield c
    c.close()


@pytest.fixture(scope="module")
def spark(cluster: coordinator.LocalCluster):
    """``local[2,4]``: two cores, a task may fail 4 times. (Spark runs no speculative attempt in
    local mode: tests/spark/test_spark_native_cluster.py has the speculation test, on a standalone
    cluster.)"""
    from pyspark import cloudpickle
    from pyspark.sql import SparkSession

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("mergetxn-native-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    mspark.register(session, replica=cluster.replica_addresses[0])
    yield session
    session.stop()


def frame(spark, start: int, n: int, slices: int = 2):
    return spark.range(start, start + n, numPartitions=slices).selectExpr(
        "id", "concat('k', cast(id % 3 as string)) as k", "cast(id as double) * 0.5 as v"
    )


def expected(start: int, n: int) -> list[tuple]:
    return [(i, f"k{i % 3}", i * 0.5) for i in range(start, start + n)]


def srows(df) -> list[tuple]:
    return sorted((r["id"], r["k"], r["v"]) for r in df.collect())


def visible(c: Client, table: str) -> list[dict]:
    return [p for p in c.parts(table).to_pylist() if p["visible"]]


# ---------------------------------------------------------------------------------------------
# Round trip


def test_round_trip_types_partitions_and_python_parts(spark, c0: Client) -> None:
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            ("day", pa.date32()),
            ("i8", pa.int8()),
            ("i16", pa.int16()),
            ("i32", pa.int32()),
            ("f32", pa.float32()),
            ("v", pa.float64()),
            ("s", pa.string()),
            ("b", pa.bool_()),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("ntz", pa.timestamp("us")),
            ("dec", pa.decimal128(10, 2)),
            ("bin", pa.binary()),
        ]
    )
    c0.create_table("nt_types", schema, partition_by=("day",), auto_merge=False)
    df = spark.range(0, 300, numPartitions=3).selectExpr(
        "id",
        "date_add(date'2024-01-01', cast(id % 3 as int)) as day",
        "cast(id % 100 as tinyint) as i8",
        "cast(id as smallint) as i16",
        "cast(id as int) as i32",
        "cast(id as float) as f32",
        "cast(id as double) / 4 as v",
        "if(id % 7 = 0, null, concat('s', id)) as s",
        "id % 2 = 0 as b",
        "timestamp'2024-01-01 00:00:00Z' + make_interval(0, 0, 0, 0, 0, 0, id) as ts",
        "cast(timestamp_ntz'2024-01-01 00:00:00' + make_interval(0, 0, 0, 0, 0, 0, id) as timestamp_ntz) as ntz",
        "cast(cast(id as decimal(10, 2)) / 8 as decimal(10, 2)) as dec",
        "cast(concat('b', id) as binary) as bin",
    )
    csn = mspark.write_table(df.selectExpr(*schema.names), "nt_types")
    assert isinstance(csn, int)
    parts = visible(c0, "nt_types")
    assert len({p["creation_csn"] for p in parts}) == 1 and {p["partition"] for p in parts} == {
        '["2024-01-01"]',
        '["2024-01-02"]',
        '["2024-01-03"]',
    }
    # Parts written by Spark read back through the Python client (checksum verified), typed as the table.
    got = c0.read("nt_types").sort_by("id")
    assert got.schema.equals(schema) and got.num_rows == 300
    assert got.column("s").null_count == 43 and got.column("dec")[8].as_py() == decimal.Decimal("1.00")
    assert got.column("ts")[61].as_py() == dt.datetime(2024, 1, 1, 0, 1, 1, tzinfo=dt.UTC)
    # Rows written by the Python client sit beside them; read_table reads both kinds of part.
    with c0.transaction() as tx:
        tx.insert("nt_types", got.slice(0, 5).set_column(0, "id", pa.array(range(1000, 1005), pa.int64())))
    back = mspark.read_table(spark, "nt_types")
    assert [f.name for f in back.schema.fields] == schema.names
    assert back.schema["ntz"].dataType.simpleString() == "timestamp_ntz"
    table = pa.Table.from_pylist([r.asDict() for r in back.collect()])
    assert table.num_rows == 305
    expected_t = c0.read("nt_types")
    assert sorted(table.column("id").to_pylist()) == sorted(expected_t.column("id").to_pylist())
    by_id = {r["id"]: r for r in back.collect()}
    assert by_id[61]["s"] == "s61" and by_id[7]["s"] is None and by_id[1003]["dec"] == decimal.Decimal("0.38")


def test_not_null_bad_input_and_keys_tables(spark, c0: Client) -> None:
    c0.create_table("nt_nn", SCHEMA, auto_merge=False)
    bad = spark.range(0, 10, numPartitions=1).selectExpr("if(id = 5, null, id) as id", "'a' as k", "1.0d as v")
    with pytest.raises(Exception, match="NOT NULL"):
        mspark.write_table(bad, "nt_nn")
    assert c0.read("nt_nn").num_rows == 0 and not local_files_of(c0, "nt_nn")
    with pytest.raises(InvalidInput, match="mode"):
        mspark.write_table(frame(spark, 0, 3), "nt_nn", mode="upsert")
    with pytest.raises(InvalidInput, match="nope"):
        mspark.read_table(spark, "nt_nn", where=[("nope", "==", 1)])
    # A keys table is written through the data source path (rows become versions), saying so,
    # and read by Spark's Parquet reader, versions folded per key in Spark (no warning).
    c0.create_table("nt_keys", SCHEMA, primary_key=("id",), conflict_policy="keys")
    with pytest.warns(native.NativeFallback, match="keys table"):
        mspark.write_table(frame(spark, 0, 3), "nt_keys")
    with pytest.warns(native.NativeFallback, match="keys table"):
        mspark.write_table(frame(spark, 2, 3), "nt_keys")  # key 2 written again: one row
    got = mspark.read_table(spark, "nt_keys")
    assert sorted(tuple(r) for r in got.collect()) == expected(0, 5)


def test_writes_lacking_an_added_nullable_column_fill_null(spark, c0: Client, r0: str) -> None:
    """docs/surface.md#tables: after alter_table adds a nullable column, a DataFrame without it
    writes null there, through write_table (Spark's Parquet writer) and the data source alike; a
    missing non-nullable column is still refused by name, before any task runs."""
    c0.create_table("nt_added", SCHEMA, auto_merge=False)
    c0.alter_table("nt_added", add_columns=[pa.field("note", pa.string())])
    mspark.write_table(frame(spark, 0, 3), "nt_added")
    frame(spark, 3, 2).write.format("mergetxn").option("replica", r0).mode("append").save("nt_added")
    got = sorted(c0.read("nt_added").to_pylist(), key=lambda r: r["id"])
    assert [(r["id"], r["note"]) for r in got] == [(i, None) for i in range(5)]
    assert sorted(tuple(r)[:3] for r in mspark.read_table(spark, "nt_added").collect()) == expected(0, 5)
    with pytest.raises(InvalidInput, match=r"missing column\(s\) \['id'\]"):
        mspark.write_table(frame(spark, 0, 1).drop("id"), "nt_added")
    assert c0.read("nt_added").num_rows == 5


def local_files_of(c: Client, table: str) -> set[str]:
    root = Path(c.storage.url) / table
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} if root.exists() else set()


# ---------------------------------------------------------------------------------------------
# Snapshots


def test_snapshot_and_as_of_reads_while_writes_commit(spark, c0: Client) -> None:
    c0.create_table("nt_snap", SCHEMA, auto_merge=False)
    first = mspark.write_table(frame(spark, 0, 40), "nt_snap")
    time.sleep(0.01)  # as_of is a wall-clock time: one strictly between the two commits
    between = dt.datetime.now(dt.UTC)
    time.sleep(0.01)
    latest_before = mspark.read_table(spark, "nt_snap")  # planned now, evaluated after the next commit
    second = mspark.write_table(frame(spark, 40, 20), "nt_snap")
    assert second > first
    assert srows(latest_before) == expected(0, 40)
    assert srows(mspark.read_table(spark, "nt_snap", snapshot=first)) == expected(0, 40)
    assert srows(mspark.read_table(spark, "nt_snap", as_of=between)) == expected(0, 40)
    assert srows(mspark.read_table(spark, "nt_snap")) == expected(0, 60)


def test_snapshot_held_while_dataframe_lives(spark, c0: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    c0.create_table("nt_hold", SCHEMA, auto_merge=False)
    mspark.write_table(frame(spark, 0, 30), "nt_hold")
    mspark.write_table(frame(spark, 30, 10), "nt_hold")
    df = mspark.read_table(spark, "nt_hold")
    old = {p["name"] for p in visible(c0, "nt_hold")}
    # A concurrent major compaction replaces every part the DataFrame reads, then cleanup runs.
    c0.compact("nt_hold", kind="major")
    assert not old & {p["name"] for p in visible(c0, "nt_hold")}
    report = c0.gc(grace_seconds=0)
    assert not {r.get("part") for r in report["removed"]} & old
    mspark.write_table(frame(spark, 100, 5), "nt_hold", mode="overwrite")
    assert not {r.get("part") for r in c0.gc(grace_seconds=0)["removed"]} & old
    assert srows(df) == expected(0, 40)  # evaluated after cleanup: the files were kept
    # Once the DataFrame is gone (and no job runs) the lease is released and cleanup takes them.
    monkeypatch.setattr(native, "RELEASE_LINGER", 0.5)
    del df
    assert poll(lambda: not native.holds(), timeout=30, interval=0.2)
    last: dict = {}

    def collected() -> bool:
        last["report"] = c0.gc(grace_seconds=0)
        return not (old & {r.get("part") for r in last["report"]["kept"]}) and not any(
            Path(c0.storage.url, "nt_hold").rglob(f"{next(iter(old))}.parquet")
        )

    assert poll(collected, timeout=60, interval=1.0), [
        r.get("reason") for r in last["report"]["kept"] if r.get("part") in old
    ]


# ---------------------------------------------------------------------------------------------
# Pruning


def test_pruning_by_partition_and_min_max_counts_files_read(spark, c0: Client) -> None:
    c0.create_table("nt_prune", SCHEMA, partition_by=("k",), auto_merge=False)
    mspark.write_table(frame(spark, 0, 30), "nt_prune")
    mspark.write_table(frame(spark, 1000, 30), "nt_prune")
    parts = visible(c0, "nt_prune")
    df = mspark.read_table(spark, "nt_prune", where=[("k", "==", "k1")])
    files = {Path(f).stem for f in df.inputFiles()}
    assert files == {p["name"] for p in parts if p["partition"] == '["k1"]'}
    assert srows(df) == [r for r in expected(0, 30) + expected(1000, 30) if r[1] == "k1"]
    low = mspark.read_table(spark, "nt_prune", where=[("id", ">=", 1000), ("k", "in", ["k0", "k2"])])
    second = {
        p["name"]
        for p in parts
        if p["creation_csn"] == max(q["creation_csn"] for q in parts) and p["partition"] != '["k1"]'
    }
    assert {Path(f).stem for f in low.inputFiles()} == second
    assert srows(low) == [r for r in expected(1000, 30) if r[1] != "k1"]


# ---------------------------------------------------------------------------------------------
# Exactly once


def fail_once(marks: str):
    """Partition 0's first attempt passes all its rows to the writer but the last, then fails:
    its output is (partly) written; the retry writes the whole task again."""

    def run(index: int, it):
        data = list(it)
        if index != 0 or Path(marks, "failed").exists():
            yield from data
            return
        Path(marks, "failed").write_text("1")
        yield from data[:-1]
        raise RuntimeError("injected failure after the task's rows were written")

    return run


def test_task_failed_after_writing_and_retried_counts_once(spark, c0: Client, tmp_path: Path) -> None:
    c0.create_table("nt_retry", SCHEMA, auto_merge=False)
    src = frame(spark, 0, 4000)
    df = spark.createDataFrame(src.rdd.mapPartitionsWithIndex(fail_once(str(tmp_path))), src.schema)
    mspark.write_table(df, "nt_retry")
    assert (tmp_path / "failed").exists()
    assert as_rows(c0.read("nt_retry")) == expected(0, 4000)


def always_fail(index: int, it):
    data = list(it)
    if index == 1:
        raise RuntimeError("injected: this job fails")
    yield from data


def test_failed_job_leaves_nothing_and_cleanup_collects_staging(spark, c0: Client, r0: str) -> None:
    c0.create_table("nt_fail", SCHEMA, auto_merge=False)
    mspark.write_table(frame(spark, 0, 10), "nt_fail")
    before = local_files_of(c0, "nt_fail")
    src = frame(spark, 100, 1000)
    df = spark.createDataFrame(src.rdd.mapPartitionsWithIndex(always_fail), src.schema)
    with pytest.raises(Exception, match="injected"):
        mspark.write_table(df, "nt_fail")
    assert as_rows(c0.read("nt_fail")) == expected(0, 10)
    assert local_files_of(c0, "nt_fail") == before
    # A driver that died mid-job leaves its staging directory: cleanup collects it once its
    # transaction is known not to run, and keeps a running transaction's.
    dead = c0.begin()
    dead.rollback()
    alive = c0.begin()
    root = Path(c0.storage.url) / "nt_fail" / "_staging"
    from parts.io.format import new_part_name

    dead_dir, alive_dir = root / new_part_name(dead.id), root / new_part_name(alive.id)
    for d in (dead_dir, alive_dir):
        (d / "_temporary" / "0").mkdir(parents=True)
        (d / "_temporary" / "0" / "part-00000-x.c000.snappy.parquet").write_bytes(b"PAR1")
        (d / ".part-00000-x.c000.snappy.parquet.crc").write_bytes(b"x")
    assert poll(
        lambda: (c0.gc(grace_seconds=0), not any(p.is_file() for p in dead_dir.rglob("*")))[1], timeout=60, interval=1.0
    )
    assert any(p.is_file() for p in alive_dir.rglob("*"))
    alive.rollback()


# ---------------------------------------------------------------------------------------------
# Transactions and overwrite


def test_join_transaction_returns_none_and_commits_with_it(spark, c0: Client, cluster) -> None:
    c0.create_table("nt_txn_a", SCHEMA, auto_merge=False)
    c0.create_table("nt_txn_b", SCHEMA, auto_merge=False)
    tx = c0.begin()
    assert mspark.write_table(frame(spark, 0, 20), "nt_txn_a", txn=tx) is None
    assert mspark.write_table(frame(spark, 20, 10), "nt_txn_b", txn=tx.id) is None
    other = cluster.client(1)
    assert other.read("nt_txn_a").num_rows == 0 and mspark.read_table(spark, "nt_txn_b").count() == 0
    assert as_rows(tx.read("nt_txn_a")) == expected(0, 20)
    csn = tx.commit()
    other.wait_for(csn)
    assert as_rows(other.read("nt_txn_a")) == expected(0, 20) and as_rows(other.read("nt_txn_b")) == expected(20, 10)
    assert {p["creation_csn"] for p in visible(c0, "nt_txn_a") + visible(c0, "nt_txn_b")} == {csn}
    # A rolled-back transaction makes nothing of the write visible.
    tx2 = c0.begin()
    mspark.write_table(frame(spark, 500, 5), "nt_txn_a", txn=tx2)
    tx2.rollback()
    assert as_rows(c0.read("nt_txn_a")) == expected(0, 20)
    other.close()


def test_overwrite_partitions_and_whole_table(spark, c0: Client) -> None:
    c0.create_table("nt_over", SCHEMA, partition_by=("k",), auto_merge=False)
    mspark.write_table(frame(spark, 0, 30), "nt_over")
    new = spark.range(1000, 1005, numPartitions=1).selectExpr("id", "'k0' as k", "1.0d as v")
    mspark.write_table(new, "nt_over", mode="overwrite")
    want = sorted([(i, "k0", 1.0) for i in range(1000, 1005)] + [r for r in expected(0, 30) if r[1] != "k0"])
    assert as_rows(c0.read("nt_over")) == want == srows(mspark.read_table(spark, "nt_over"))
    c0.create_table("nt_over_flat", SCHEMA, auto_merge=False)
    mspark.write_table(frame(spark, 0, 30), "nt_over_flat")
    mspark.write_table(frame(spark, 70, 3), "nt_over_flat", mode="overwrite")
    assert as_rows(c0.read("nt_over_flat")) == expected(70, 3)


# ---------------------------------------------------------------------------------------------
# Integrity


def test_corrupt_or_truncated_part_is_detected(spark, c0: Client) -> None:
    c0.create_table("nt_bad", SCHEMA, auto_merge=False)
    mspark.write_table(frame(spark, 0, 500, slices=1), "nt_bad")
    (part,) = visible(c0, "nt_bad")
    path = next(Path(c0.storage.url, "nt_bad").rglob(f"{part['name']}.parquet"))
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])  # truncated
    with pytest.raises(CorruptPart, match="bytes"):
        mspark.read_table(spark, "nt_bad")
    path.write_bytes(raw[:-12] + b"\0" * 12)  # same size, footer destroyed
    with pytest.raises(CorruptPart, match="footer"):
        mspark.read_table(spark, "nt_bad")
    path.write_bytes(raw)
    assert mspark.read_table(spark, "nt_bad").count() == 500


def test_a_table_spark_cannot_read_natively_falls_back_to_the_data_source(spark, c0: Client) -> None:
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("at", pa.timestamp("ns", tz="UTC"))])
    c0.create_table("nt_nanos", schema, auto_merge=False)
    with c0.transaction() as tx:
        tx.insert(
            "nt_nanos",
            pa.table({"id": [1, 2], "at": pa.array([1_000, 2_000], pa.timestamp("ns", tz="UTC"))}, schema=schema),
        )
    with pytest.warns(native.NativeFallback, match="nanosecond"):
        df = mspark.read_table(spark, "nt_nanos", where=[("id", ">", 1)])
    assert [r["id"] for r in df.collect()] == [2]
    with pytest.warns(native.NativeFallback, match="nanosecond"):
        mspark.write_table(df.selectExpr("id + 10 as id", "at"), "nt_nanos")
    assert sorted(c0.read("nt_nanos").column("id").to_pylist()) == [1, 2, 12]


# ---------------------------------------------------------------------------------------------
# Small writes (docs/architecture/small-writes.md)


def test_inlined_rows_read_beside_part_files(spark, c0: Client, cluster) -> None:
    """Rows of small inserts travel in their commits (no part file); read_table and the data
    source read them beside the rows in part files, at the snapshot asked, filters included."""
    c0.create_table("nt_inline", SCHEMA, partition_by=("k",), auto_merge=False, inline_rows=100)
    rows = [(i, f"k{i % 3}", i * 0.5) for i in range(600)]

    def insert(lo: int, hi: int) -> None:
        ids, ks, vs = zip(*rows[lo:hi])
        c0.insert("nt_inline", pa.table({"id": list(ids), "k": list(ks), "v": list(vs)}, schema=SCHEMA))

    insert(0, 5)
    insert(5, 12)
    first = c0.snapshot()
    insert(12, 600)  # 588 rows, 196 per partition: over inline_rows, so part files
    files = sorted(Path(cluster.storage_url, "nt_inline").rglob("*.parquet"))
    assert len(files) == 3, files  # one per partition, of the large insert only
    df = mspark.read_table(spark, "nt_inline")
    assert srows(df) == rows
    assert srows(mspark.read_table(spark, "nt_inline", snapshot=first)) == rows[:12]
    assert srows(mspark.read_table(spark, "nt_inline", where=[("k", "==", "k1"), ("id", "<", 20)])) == [
        r for r in rows[:20] if r[1] == "k1"
    ]
    source = spark.read.format("mergetxn").load("nt_inline")
    assert srows(source) == rows
    # Flushed: the removed records keep no bytes, and both roads read them at the snapshot before
    # the flush from the flush's bundle (through read_part, checked).
    c0.compact("nt_inline", "minor")
    removed = [r for r in c0.parts("nt_inline").to_pylist() if r["inlined"] and not r["visible"]]
    assert len(removed) == 6 and all(r["held_bytes"] == 0 and r["bundle"] for r in removed)
    assert srows(mspark.read_table(spark, "nt_inline", snapshot=first)) == rows[:12]
    assert srows(spark.read.format("mergetxn").option("snapshot", first).load("nt_inline")) == rows[:12]
