"""The `mergetxn` Spark data source against real Spark (local mode), a real ZooKeeper and real
replica processes: append and overwrite, multi-table transactions through option `txn`, task
retries and aborted jobs (every row exactly once, orphans never visible), snapshot reads while
writes commit, part pruning counted by the parts actually read, Spark-side UPDATE/DELETE, and the
errors a Spark user gets.

One SparkSession (`local[2,4]`: two cores, a task may fail 4 times) and one 2-replica cluster
serve the whole module; every test uses its own tables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support.cluster import make_cluster  # tests/ is on sys.path
from support.waiting import poll

import coordinator
from mergetxn.client import Client

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("k", pa.string()), ("v", pa.float64())])
DDL = "id bigint, k string, v double"


# ---------------------------------------------------------------------------------------------
# Helpers (also used by test_spark_s3.py)


def new_session(app: str, master: str = "local[2,4]"):
    """A SparkSession whose Python workers run this interpreter (the venv), with the data
    source registered (and Spark's filter pushdown for Python data sources turned on)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import spark as mergetxn_spark

    session = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    mergetxn_spark.register(session)
    return session


def rows(start: int, n: int, keys: str = "abc") -> list[tuple]:
    return [(i, keys[i % len(keys)], i * 0.5) for i in range(start, start + n)]


def frame(spark, data: list[tuple], slices: int = 2, ddl: str = DDL):
    """A DataFrame from Python rows, spread over ``slices`` Spark partitions (no pandas needed)."""
    return spark.createDataFrame(spark.sparkContext.parallelize(data, slices), ddl)


def as_rows(t: pa.Table, cols: tuple[str, ...] = ("id", "k", "v")) -> list[tuple]:
    return sorted(zip(*(t.column(c).to_pylist() for c in cols))) if t.num_rows else []


def spark_rows(df, cols: tuple[str, ...] = ("id", "k", "v")) -> list[tuple]:
    return sorted(tuple(r[c] for c in cols) for r in df.collect())


def visible_parts(client: Client, table: str) -> list[dict]:
    return [p for p in client.parts(table).to_pylist() if p["visible"]]


def writer(df, replica: str, mode: str = "append", **options: str):
    w = df.write.format("mergetxn").option("replica", replica).mode(mode)
    for k, v in options.items():
        w = w.option(k, v)
    return w


def reader(spark, replica: str, **options: str):
    r = spark.read.format("mergetxn").option("replica", replica)
    for k, v in options.items():
        r = r.option(k, v)
    return r


def gc_collects(client: Client, files: Callable[[], set[str]], timeout: float = 60.0) -> bool:
    """Run cleanup passes until ``files()`` is empty: orphans are collected once older than the
    grace period (at least 5 s); a bounded poll, not a fixed sleep."""

    def done() -> bool:
        client.gc(grace_seconds=0)
        return not files()

    return poll(done, timeout=timeout, interval=1.0)


def local_files(cluster: coordinator.LocalCluster, table: str) -> set[str]:
    root = Path(cluster.storage_url) / table
    return {p.relative_to(root).as_posix() for p in root.rglob("*.parquet")} if root.exists() else set()


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    with make_cluster(tmp_path_factory, None, "sparkcluster", replicas=2) as c:
        yield c


@pytest.fixture(scope="module")
def r0(cluster: coordinator.LocalCluster) -> str:
    return cluster.replica_addresses[0]


@pytest.fixture(scope="module")
def spark(cluster: coordinator.LocalCluster):
    from pyspark import cloudpickle

    # Executors cannot import this test module: ship its functions by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    session = new_session("mergetxn-tests")
    yield session
    session.stop()


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    """A directory for marker files that executors and the test use to order events."""
    d = tmp_path / "marks"
    d.mkdir()
    return d


# ---------------------------------------------------------------------------------------------
# Append and overwrite


def test_append_then_overwrite_partitions_and_whole_table(spark, c0: Client, r0: str) -> None:
    c0.create_table("sp_events", SCHEMA, partition_by=["k"], auto_merge=False)
    writer(frame(spark, rows(0, 90)), r0).save("sp_events")
    writer(frame(spark, rows(90, 30)), r0).save("sp_events")
    assert as_rows(c0.read("sp_events")) == sorted(rows(0, 120))
    # Each job is one commit: its parts share one CSN, and two jobs made two CSNs.
    assert len({p["creation_csn"] for p in visible_parts(c0, "sp_events")}) == 2

    # INSERT OVERWRITE replaces the partitions present in the data ('a' only), nothing else.
    new_a = [(1000 + i, "a", 1.0) for i in range(5)]
    writer(frame(spark, new_a), r0, mode="overwrite").save("sp_events")
    expected = sorted(new_a + [r for r in rows(0, 120) if r[1] != "a"])
    assert as_rows(c0.read("sp_events")) == expected
    assert spark_rows(reader(spark, r0).load("sp_events")) == expected

    # Unpartitioned: overwrite replaces the whole table.
    c0.create_table("sp_flat", SCHEMA, auto_merge=False)
    writer(frame(spark, rows(0, 50)), r0).save("sp_flat")
    writer(frame(spark, rows(500, 7)), r0, mode="overwrite").save("sp_flat")
    assert as_rows(c0.read("sp_flat")) == sorted(rows(500, 7))


def test_read_schema_nullability_and_types(spark, c0: Client, r0: str) -> None:
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            ("d", pa.date32()),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("flag", pa.bool_()),
            ("n", pa.int32()),
        ]
    )
    c0.create_table("sp_types", schema, auto_merge=False)
    import datetime as dt

    data = pa.table(
        {
            "id": [1, 2],
            "d": [dt.date(2024, 1, 1), None],
            "ts": [dt.datetime(2024, 1, 1, 12, tzinfo=dt.UTC), None],
            "flag": [True, None],
            "n": pa.array([7, None], pa.int32()),
        },
        schema=schema,
    )
    with c0.transaction() as tx:
        tx.insert("sp_types", data)
    df = reader(spark, r0).load("sp_types")
    fields = {f.name: f for f in df.schema.fields}
    assert not fields["id"].nullable and fields["d"].nullable
    assert [fields[c].dataType.simpleString() for c in ("id", "d", "ts", "flag", "n")] == [
        "bigint",
        "date",
        "timestamp",
        "boolean",
        "int",
    ]
    got = sorted(df.collect(), key=lambda r: r["id"])
    assert got[0]["d"] == dt.date(2024, 1, 1) and got[0]["n"] == 7 and got[1]["ts"] is None
    # A write of the same rows goes through the same schema check and round-trips.
    c0.create_table("sp_types2", schema, auto_merge=False)
    writer(df, r0).save("sp_types2")
    assert c0.read("sp_types2").sort_by("id").equals(c0.read("sp_types").sort_by("id"))


# ---------------------------------------------------------------------------------------------
# Errors a Spark user understands, with nothing left visible


def test_unknown_table_schema_mismatch_unreachable_replica(spark, c0: Client, r0: str) -> None:
    with pytest.raises(Exception, match=r"unknown table 'sp_nope'"):
        reader(spark, r0).load("sp_nope").collect()
    with pytest.raises(Exception, match=r"unknown table 'sp_nope'"):
        writer(frame(spark, rows(0, 3)), r0).save("sp_nope")

    c0.create_table("sp_strict", SCHEMA, auto_merge=False)
    bad = frame(spark, [(1, "a", 1.0, "x")], ddl="id bigint, k string, v double, extra string")
    with pytest.raises(Exception, match=r"schema mismatch.*unexpected column\(s\) \['extra'\]"):
        writer(bad, r0).save("sp_strict")
    narrow = frame(spark, [(1, 2)], ddl="id bigint, v bigint")
    with pytest.raises(Exception) as ei:
        writer(narrow, r0).save("sp_strict")
    # 'k' is nullable: a DataFrame lacking it writes null there (docs/surface.md#tables);
    # 'v' cannot narrow
    assert "missing column" not in str(ei.value) and "column 'v' is int64, table has double" in str(ei.value)
    # Nulls in a NOT NULL column: the tasks fail, the job aborts, nothing is visible.
    running = {t["id"] for t in c0.transactions()}
    nulls = frame(spark, [(None, "a", 1.0)], ddl="id bigint, k string, v double")
    with pytest.raises(Exception, match=r"column 'id' is not nullable"):
        writer(nulls, r0).save("sp_strict")
    assert c0.read("sp_strict").num_rows == 0 and visible_parts(c0, "sp_strict") == []
    assert {t["id"] for t in c0.transactions()} == running  # the job's transaction was rolled back

    with pytest.raises(Exception, match=r"cannot reach replica 127\.0\.0\.1:1 \(option 'replica'\)"):
        writer(frame(spark, rows(0, 3)), "127.0.0.1:1").save("sp_strict")
    with pytest.raises(Exception, match=r"cannot reach replica 127\.0\.0\.1:1"):
        reader(spark, "127.0.0.1:1").load("sp_strict").collect()
    with pytest.raises(Exception, match=r"option\(s\) \['snapshot'\] apply to reads"):
        writer(frame(spark, rows(0, 3)), r0, snapshot="1").save("sp_strict")
    assert c0.read("sp_strict").num_rows == 0


def _compete(replica: str, marks: str, table: str, data: list[tuple]):
    """Executor side of the conflict test: once, while the Spark job (whose transaction is
    already open) runs, commit an INSERT of another transaction into the same table."""

    def run(index: int, it):
        out = list(it)
        if index == 0:
            from mergetxn.client import Client

            with Client(replica) as cl, cl.transaction() as tx:
                tx.insert(
                    table,
                    pa.table(
                        {"id": [r[0] for r in data], "k": [r[1] for r in data], "v": [r[2] for r in data]},
                        schema=SCHEMA,
                    ),
                )
            Path(marks, "winner").write_text(tx.id)
        return iter(out)

    return run


def test_conflict_names_the_winner_and_leaves_nothing(spark, c0: Client, r0: str, marks: Path) -> None:
    c0.create_table("sp_mc", SCHEMA, conflict_policy="maxcompute", auto_merge=False)
    theirs = [(900, "z", 9.0)]
    data = spark.sparkContext.parallelize(rows(0, 20), 2).mapPartitionsWithIndex(
        _compete(r0, str(marks), "sp_mc", theirs)
    )
    with pytest.raises(Exception) as ei:
        writer(spark.createDataFrame(data, DDL), r0).save("sp_mc")
    winner = (marks / "winner").read_text()
    assert f"conflicts with transaction {winner}, which committed first" in str(ei.value)
    assert as_rows(c0.read("sp_mc")) == theirs  # the Spark job left nothing visible
    assert all(p["creation_tid"] == winner for p in visible_parts(c0, "sp_mc"))


def test_app_version_options_make_a_write_idempotent(spark, c0: Client, r0: str) -> None:
    """Options app_id/app_version: the job's commit records the version; the same batch written
    again fails naming the CSN that holds it, and leaves nothing visible."""
    c0.create_table("sp_sink", SCHEMA, auto_merge=False)
    writer(frame(spark, rows(0, 4)), r0, app_id="sp-sink", app_version="3").save("sp_sink")
    assert c0.app_version("sp-sink") == 3
    before = as_rows(c0.read("sp_sink"))
    with pytest.raises(Exception, match="DuplicateCommit|duplicate commit of application 'sp-sink' version 3"):
        writer(frame(spark, rows(100, 4)), r0, app_id="sp-sink", app_version="3").save("sp_sink")
    assert as_rows(c0.read("sp_sink")) == before
    writer(frame(spark, rows(100, 4)), r0, app_id="sp-sink", app_version="4").save("sp_sink")
    assert c0.app_version("sp-sink") == 4 and len(as_rows(c0.read("sp_sink"))) == 8


# ---------------------------------------------------------------------------------------------
# Several writes, several tables, one transaction


def test_txn_option_commits_two_tables_at_one_csn(spark, c0: Client, r0: str, cluster) -> None:
    c0.create_table("sp_orders", SCHEMA, auto_merge=False)
    c0.create_table("sp_items", SCHEMA, partition_by=["k"], auto_merge=False)
    tx = c0.begin()
    writer(frame(spark, rows(0, 40)), r0, txn=tx.id).save("sp_orders")
    writer(frame(spark, rows(100, 60)), r0, txn=tx.id).save("sp_items")
    # Staged, not committed: no reader sees any of it, not through Spark either.
    assert c0.read("sp_orders").num_rows == 0 and c0.read("sp_items").num_rows == 0
    assert reader(spark, r0).load("sp_items").count() == 0
    assert as_rows(tx.read("sp_items")) == sorted(rows(100, 60))  # the transaction sees its own
    csn = tx.commit()
    assert as_rows(c0.read("sp_orders")) == sorted(rows(0, 40))
    assert as_rows(c0.read("sp_items")) == sorted(rows(100, 60))
    csns = {p["creation_csn"] for t in ("sp_orders", "sp_items") for p in visible_parts(c0, t)}
    assert csns == {csn}
    assert c0.read("sp_orders", snapshot=csn - 1).num_rows == 0  # nothing of it before that CSN

    # All or nothing: the second write fails, the driver rolls back, neither table changes.
    tx2 = c0.begin()
    writer(frame(spark, rows(1000, 10)), r0, txn=tx2.id).save("sp_orders")
    with pytest.raises(Exception, match="schema mismatch"):
        writer(frame(spark, [(1, 2)], ddl="id bigint, q bigint"), r0, txn=tx2.id).save("sp_items")
    tx2.rollback()
    assert as_rows(c0.read("sp_orders")) == sorted(rows(0, 40))
    assert c0.commit_status(tx2.id).status == "aborted"

    # A transaction lives on one replica: naming another one is a clear error.
    tx3 = c0.begin()
    with pytest.raises(Exception, match=rf"transaction {tx3.id} runs on replica r0"):
        writer(frame(spark, rows(0, 1)), cluster.replica_addresses[1], txn=tx3.id).save("sp_orders")
    tx3.rollback()
    with pytest.raises(Exception, match=rf"cannot join transaction {tx3.id}"):
        writer(frame(spark, rows(0, 1)), r0, txn=tx3.id).save("sp_orders")


def test_trace_commits_tells_the_driver_its_transaction_and_csn(spark, c0: Client, r0: str, tmp_path: Path) -> None:
    """A job committing on its own does so in a planner process: option trace_commits is how
    the driver learns its transaction (before any task runs) and its CSN."""
    c0.create_table("sp_trace", SCHEMA, partition_by=["k"], auto_merge=False)
    trace = tmp_path / "commits.jsonl"

    def events() -> list[dict]:
        return [json.loads(line) for line in trace.read_text().splitlines()]

    writer(frame(spark, rows(0, 20)), r0, trace_commits=str(trace)).save("sp_trace")
    begin, committed = events()
    assert begin["event"] == "begin" and committed["event"] == "committed"
    assert begin["txn"] == committed["txn"] and begin["table"] == committed["table"] == "sp_trace"
    parts = visible_parts(c0, "sp_trace")
    assert {p["creation_tid"] for p in parts} == {begin["txn"]}
    assert {p["creation_csn"] for p in parts} == {committed["csn"]} and committed["parts"] == len(parts)
    assert begin["snapshot"] < committed["csn"]
    assert c0.commit_status(begin["txn"]).csn == committed["csn"]

    # A failed job: its transaction is known, and it did not commit.
    trace.unlink()
    rdd = spark.sparkContext.parallelize(rows(100, 40), 4).mapPartitionsWithIndex(_always_fail_partition_zero)
    with pytest.raises(Exception, match="injected failure on every attempt"):
        writer(spark.createDataFrame(rdd, DDL), r0, trace_commits=str(trace)).save("sp_trace")
    [begin] = events()
    assert c0.commit_status(begin["txn"]).status == "aborted"

    # Joining a driver's transaction: "join", then "staged"; the driver commits.
    trace.unlink()
    tx = c0.begin()
    writer(frame(spark, rows(200, 10)), r0, txn=tx.id, trace_commits=str(trace)).save("sp_trace")
    assert [(e["event"], e["txn"]) for e in events()] == [("join", tx.id), ("staged", tx.id)]
    assert events()[1]["parts"] > 0
    tx.commit()

    # A trace that cannot be written fails the job before anything runs, leaving no transaction.
    running = {t["id"] for t in c0.transactions()}
    with pytest.raises(Exception, match="option 'trace_commits': cannot write"):
        writer(frame(spark, rows(300, 5)), r0, trace_commits=str(tmp_path / "no" / "such.jsonl")).save("sp_trace")
    assert {t["id"] for t in c0.transactions()} == running
    assert as_rows(c0.read("sp_trace")) == sorted(rows(0, 20) + rows(200, 10))


# ---------------------------------------------------------------------------------------------
# Task retries and aborted jobs: every row exactly once, orphans never visible


def local_sidecars(storage_dir: str, table: str) -> Callable[[], list[dict]]:
    """A picklable lister of the part sidecars of ``table`` in local storage (for executors)."""

    def sidecars() -> list[dict]:
        root = Path(storage_dir, table)
        out = []
        for path in root.rglob("*.json") if root.exists() else ():
            try:
                out.append(json.loads(path.read_text()))
            except ValueError:
                continue  # being written
        return out

    return sidecars


def fail_first_attempt(marks: str, sidecars: Callable[[], list[dict]]):
    """Partition 0's first attempt emits all its rows but the last, waits until the writer of
    the same task has stored parts of them (parts whose ids are all at most partition 0's last
    id), records those parts, then fails. Later attempts emit everything."""

    def run(index: int, it):
        data = list(it)
        first = not Path(marks, "attempted").exists()
        if index != 0 or not first:
            yield from data
            return
        Path(marks, "attempted").write_text("1")
        # Far more than the worker's output buffer: these rows reach the writer while we wait.
        yield from data[:-1]
        own_max = data[-1][0]

        def own_parts() -> list[str]:
            return sorted(m["name"] for m in sidecars() if m["stats"]["id"][1] <= own_max)

        deadline = time.monotonic() + 60
        while not own_parts() and time.monotonic() < deadline:
            time.sleep(0.05)
        Path(marks, "seen.json").write_text(json.dumps(own_parts()))
        raise RuntimeError("injected failure after the task's first part was written")

    return run


def test_task_failing_after_writing_a_part_is_retried_exactly_once(
    spark, c0: Client, r0: str, cluster, marks: Path
) -> None:
    c0.create_table("sp_retry", SCHEMA, auto_merge=False)
    data = rows(0, 160_000)
    rdd = spark.sparkContext.parallelize(data, 4).mapPartitionsWithIndex(
        fail_first_attempt(str(marks), local_sidecars(cluster.storage_url, "sp_retry"))
    )
    writer(spark.createDataFrame(rdd, DDL), r0, rows_per_part="5000").save("sp_retry")
    seen = json.loads((marks / "seen.json").read_text())
    assert seen, "the failing attempt should have written a part before failing"
    got = c0.read("sp_retry")
    assert got.num_rows == len(data)
    assert sorted(got.column("id").to_pylist()) == [r[0] for r in data]  # no row twice, none lost
    visible = {p["name"] for p in visible_parts(c0, "sp_retry")}
    assert not visible & set(seen)  # the failed attempt's parts: never visible
    assert len({p["creation_csn"] for p in visible_parts(c0, "sp_retry")}) == 1
    # Whatever a failed attempt left behind is an orphan: never visible, and named after the
    # job's transaction (which committed without it), so `mergetxn gc` can tell it is garbage.
    txn = {p["creation_tid"] for p in visible_parts(c0, "sp_retry")}.pop()
    orphans = {f.rsplit("/", 1)[-1][: -len(".parquet")] for f in local_files(cluster, "sp_retry")} - visible
    assert all(o.startswith(txn.replace(":", "_")) for o in orphans), (txn, orphans)
    assert gc_collects(
        c0,
        lambda: {
            f for f in local_files(cluster, "sp_retry") if f.rsplit("/", 1)[-1][: -len(".parquet")] not in visible
        },
    )
    assert sorted(c0.read("sp_retry").column("id").to_pylist()) == [r[0] for r in data]


def _always_fail_partition_zero(index: int, it):
    data = list(it)
    if index == 0:
        raise RuntimeError("injected failure on every attempt")
    return iter(data)


def test_aborted_job_leaves_nothing_visible_and_removes_its_parts(spark, c0: Client, r0: str, cluster) -> None:
    c0.create_table("sp_abort", SCHEMA, auto_merge=False)
    writer(frame(spark, rows(0, 10)), r0).save("sp_abort")
    before_files = local_files(cluster, "sp_abort")
    before_txns = {t["id"] for t in c0.transactions()}
    rdd = spark.sparkContext.parallelize(rows(100, 400), 4).mapPartitionsWithIndex(_always_fail_partition_zero)
    with pytest.raises(Exception, match="injected failure on every attempt"):
        writer(spark.createDataFrame(rdd, DDL), r0).save("sp_abort")
    assert as_rows(c0.read("sp_abort")) == sorted(rows(0, 10))
    assert {t["id"] for t in c0.transactions()} == before_txns  # its transaction: rolled back
    # abort() removed the parts of the tasks Spark had accepted. A task still running when the
    # job failed is killed, maybe after writing its part: that orphan is named after the
    # rolled-back transaction, and cleanup collects it.
    left = local_files(cluster, "sp_abort") - before_files
    txns = {f.rsplit("/", 1)[-1].rsplit("_", 1)[0] for f in left}
    assert all(c0.commit_status(t).status == "aborted" for t in txns)
    assert gc_collects(c0, lambda: local_files(cluster, "sp_abort") - before_files)
    assert as_rows(c0.read("sp_abort")) == sorted(rows(0, 10))


def _block_partition_zero(marks: str):
    def run(index: int, it):
        data = list(it)
        if index == 0:
            Path(marks, "blocked").write_text("1")
            deadline = time.monotonic() + 120
            while not Path(marks, "release").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return iter(data)

    return run


def test_job_cancelled_mid_way_leaves_nothing(spark, c0: Client, r0: str, cluster, marks: Path) -> None:
    """Cancel a write job while one task hangs and the others have written their parts: the
    job's transaction is rolled back, its parts removed, nothing becomes visible."""
    c0.create_table("sp_cancel", SCHEMA, auto_merge=False)
    running = {t["id"] for t in c0.transactions()}
    rdd = spark.sparkContext.parallelize(rows(0, 4000), 4).mapPartitionsWithIndex(_block_partition_zero(str(marks)))
    df = spark.createDataFrame(rdd, DDL)
    sidecars = local_sidecars(cluster.storage_url, "sp_cancel")
    sc = spark.sparkContext

    def cancel_when_mid_way() -> None:
        # Partitions 1-3 have written their parts; partition 0 hangs.
        if poll(lambda: (marks / "blocked").exists() and len(sidecars()) >= 3, timeout=60):
            sc.cancelJobsWithTag("sp-cancel")
        (marks / "release").write_text("1")

    canceller = threading.Thread(target=cancel_when_mid_way)
    canceller.start()
    sc.addJobTag("sp-cancel")  # save() runs here: the data source is registered in this session
    try:
        with pytest.raises(Exception, match="(?i)cancel"):
            writer(df, r0).save("sp_cancel")
    finally:
        sc.removeJobTag("sp-cancel")
        canceller.join(120)
    assert c0.read("sp_cancel").num_rows == 0 and visible_parts(c0, "sp_cancel") == []
    assert {t["id"] for t in c0.transactions()} == running  # the job's transaction: rolled back
    # abort() removed the parts of the tasks Spark had accepted; a task killed between writing
    # its part and reporting it leaves an orphan named after the rolled-back transaction, which
    # cleanup collects.
    left = local_files(cluster, "sp_cancel")
    txns = {f.rsplit("/", 1)[-1].rsplit("_", 1)[0] for f in left}
    assert all(c0.commit_status(t).status == "aborted" for t in txns)
    assert gc_collects(c0, lambda: local_files(cluster, "sp_cancel"))


# ---------------------------------------------------------------------------------------------
# Snapshots


def _pause_first_read(marks: str):
    """Executor side: the first read task announces it started, then waits for the test to
    commit new writes before it reads on."""

    def run(index: int, it):
        if index == 0:
            Path(marks, "reading").write_text("1")
            deadline = time.monotonic() + 60
            while not Path(marks, "committed").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
        return it

    return run


def test_reads_keep_their_snapshot_while_new_writes_commit(spark, c0: Client, r0: str, marks: Path) -> None:
    import datetime as dt

    c0.create_table("sp_snap", SCHEMA, auto_merge=False)
    writer(frame(spark, rows(0, 30)), r0).save("sp_snap")
    csn1 = max(p["creation_csn"] for p in visible_parts(c0, "sp_snap"))
    between = dt.datetime.now(dt.UTC)
    writer(frame(spark, rows(30, 20)), r0).save("sp_snap")
    assert sorted(r[0] for r in reader(spark, r0, snapshot=str(csn1)).load("sp_snap").collect()) == list(range(30))
    assert reader(spark, r0, as_of=between.isoformat()).load("sp_snap").count() == 30

    # A latest read in flight: its tasks are paused while an overwrite and an insert commit.
    df = reader(spark, r0).load("sp_snap")
    result: dict = {}

    def run() -> None:
        result["rows"] = df.rdd.mapPartitionsWithIndex(_pause_first_read(str(marks))).map(lambda r: r["id"]).collect()

    t = threading.Thread(target=run)
    t.start()
    assert poll(lambda: (marks / "reading").exists(), timeout=60)
    with c0.transaction() as tx:
        tx.overwrite("sp_snap", pa.table({"id": [7000], "k": ["n"], "v": [0.0]}, schema=SCHEMA))
    writer(frame(spark, rows(9000, 5)), r0).save("sp_snap")
    (marks / "committed").write_text("1")
    t.join(120)
    assert sorted(result["rows"]) == list(range(50))  # exactly the snapshot planned, nothing newer
    assert sorted(r[0] for r in reader(spark, r0).load("sp_snap").collect()) == [7000] + list(range(9000, 9005))
    with pytest.raises(Exception, match=r"snapshot"):
        reader(spark, r0, snapshot=str(10**12)).load("sp_snap").collect()


def test_incremental_read_of_changes(spark, c0: Client, r0: str) -> None:
    """changes_from/changes_to/changes_by: the rows added and removed by the commits in the
    half-open range, with `_change` and `_csn`, the same as client.changes gives."""
    import datetime as dt

    if not hasattr(Client, "changes"):
        pytest.skip("Client.changes is not in this tree yet")
    c0.create_table("sp_chg", SCHEMA, auto_merge=False)
    writer(frame(spark, rows(0, 10)), r0).save("sp_chg")
    csn1 = max(p["creation_csn"] for p in visible_parts(c0, "sp_chg"))
    t1 = dt.datetime.now(dt.UTC)
    writer(frame(spark, rows(10, 5)), r0).save("sp_chg")
    csn2 = max(p["creation_csn"] for p in visible_parts(c0, "sp_chg"))
    hold = c0.begin()  # a snapshot in use keeps the files the overwrite removes (their deletes)
    writer(frame(spark, rows(100, 3)), r0, mode="overwrite").save("sp_chg")
    csn3 = max(p["creation_csn"] for p in visible_parts(c0, "sp_chg"))

    def key(r) -> tuple:
        return (r[0], r[3], r[4])

    df = reader(spark, r0, changes_from=str(csn1)).load("sp_chg")
    assert [f.name for f in df.schema.fields] == ["id", "k", "v", "_change", "_csn"]
    got = sorted(key(tuple(r)) for r in df.collect())
    want = c0.changes("sp_chg", csn1)
    assert got == sorted(key(r) for r in zip(*(want.column(c).to_pylist() for c in want.column_names)))
    assert sum(1 for g in got if g[1] == "insert") == 8 and sum(1 for g in got if g[1] == "delete") == 15
    assert {g[2] for g in got} <= set(range(csn1 + 1, csn3 + 1))
    until = reader(spark, r0, changes_from=str(csn1), changes_to=str(csn2)).load("sp_chg")
    assert sorted(r["id"] for r in until.collect()) == list(range(10, 15))
    by_time = reader(spark, r0, changes_from=t1.isoformat(), changes_by="time").load("sp_chg")
    assert by_time.count() == len(got)
    with pytest.raises(Exception, match="changes_by' must be 'id' or 'time'"):
        reader(spark, r0, changes_from="1", changes_by="size").load("sp_chg").collect()
    hold.rollback()


def test_reads_see_the_schema_at_their_snapshot_after_an_alter(spark, c0: Client, r0: str) -> None:
    """A column renamed and one added: the data source reads the parts written before under
    the new schema (the renamed column by its new name, the added one null), reads at an older
    snapshot with the schema then, and writes must match the new schema."""
    c0.create_table("sp_alter", SCHEMA, auto_merge=False)
    writer(frame(spark, rows(0, 6)), r0).save("sp_alter")
    before = c0.snapshot()
    c0.alter_table("sp_alter", add_columns=[pa.field("note", pa.string())], rename_columns={"v": "value"})
    df = reader(spark, r0).load("sp_alter")
    assert [f.name for f in df.schema.fields] == ["id", "k", "value", "note"]
    assert spark_rows(df, ("id", "k", "value", "note")) == sorted(r + (None,) for r in rows(0, 6))
    old = reader(spark, r0, snapshot=str(before)).load("sp_alter")
    assert [f.name for f in old.schema.fields] == ["id", "k", "v"]
    assert spark_rows(old) == sorted(rows(0, 6))
    with pytest.raises(Exception, match="value|note"):
        writer(frame(spark, rows(10, 2)), r0).save("sp_alter")  # the old schema
    writer(frame(spark, [(20, "a", 1.5, "n")], ddl="id bigint, k string, value double, note string"), r0).save(
        "sp_alter"
    )
    assert spark_rows(reader(spark, r0).load("sp_alter").where("id = 20"), ("id", "value", "note")) == [(20, 1.5, "n")]


# ---------------------------------------------------------------------------------------------
# Pruning, proven by the parts actually read


def test_partition_and_min_max_pruning_reads_only_matching_parts(spark, c0: Client, r0: str, tmp_path: Path) -> None:
    c0.create_table("sp_prune", SCHEMA, partition_by=["k"], auto_merge=False)
    for lo in (0, 1000):  # two commits: every partition gets two parts with disjoint id ranges
        with c0.transaction() as tx:
            tx.insert(
                "sp_prune",
                pa.table({"id": list(range(lo, lo + 400)), "k": list("abcd") * 100, "v": [1.0] * 400}, schema=SCHEMA),
            )
    assert len(visible_parts(c0, "sp_prune")) == 8
    trace = tmp_path / "reads.log"

    def parts_read(df, expected_ids: list[int]) -> int:
        trace.unlink(missing_ok=True)
        assert sorted(r["id"] for r in df.collect()) == expected_ids
        return len(trace.read_text().splitlines()) if trace.exists() else 0

    def load():
        return reader(spark, r0, trace_reads=str(trace), split_bytes="1").load("sp_prune")

    every = list(range(400)) + list(range(1000, 1400))
    assert parts_read(load(), every) == 8
    assert parts_read(load().filter("k = 'b'"), [i for i in every if i % 4 == 1]) == 2
    assert parts_read(load().filter("id >= 1000"), list(range(1000, 1400))) == 4
    assert parts_read(load().filter("k = 'c' and id < 100"), [i for i in range(100) if i % 4 == 2]) == 1
    assert parts_read(load().filter("k in ('a', 'd')"), [i for i in every if i % 4 in (0, 3)]) == 4
    assert parts_read(load().filter("id > 5000"), []) == 0
    # Filters pruning cannot use still give exact rows (Spark applies every filter itself).
    assert parts_read(load().filter("v + 1 = 2 and id % 400 = 7"), [7, 1207]) == 8


# ---------------------------------------------------------------------------------------------
# UPDATE and DELETE on the executors


def test_spark_delete_and_update_rewrite_only_affected_parts(spark, c0: Client, r0: str) -> None:
    from spark.mutate import delete, update

    c0.create_table("sp_mut", SCHEMA, partition_by=["k"], auto_merge=False)
    writer(frame(spark, rows(0, 300)), r0).save("sp_mut")
    before = {p["name"]: p for p in visible_parts(c0, "sp_mut")}
    in_a = {n for n, p in before.items() if json.loads(p["partition"]) == ["a"]}

    result = delete(spark, "sp_mut", (pc.field("k") == "a") & (pc.field("id") < 60), replica=r0)
    assert result.rows == 20 and result.csn is not None
    after = {p["name"] for p in visible_parts(c0, "sp_mut")}
    replaced = set(before) - after
    assert replaced and replaced <= in_a  # only parts of partition 'a' were rewritten
    assert result.parts_removed == len(replaced)
    expected = [r for r in rows(0, 300) if not (r[1] == "a" and r[0] < 60)]
    assert as_rows(c0.read("sp_mut")) == sorted(expected)

    result = update(spark, "sp_mut", pc.field("id") >= 290, {"v": -1.0}, replica=r0)
    assert result.rows == 10
    expected = [(i, k, -1.0 if i >= 290 else v) for i, k, v in expected]
    assert as_rows(c0.read("sp_mut")) == sorted(expected)
    assert (
        len({p["creation_csn"] for p in visible_parts(c0, "sp_mut") if p["name"] not in before}) == 2
    )  # one commit per statement

    # Inside a driver's transaction: staged, visible at its commit only.
    tx = c0.begin()
    staged = delete(spark, "sp_mut", pc.field("id") < 10, replica=r0, txn=tx.id)
    assert staged.csn is None and c0.read("sp_mut").num_rows == len(expected)
    tx.commit()
    assert c0.read("sp_mut").num_rows == len([r for r in expected if r[0] >= 10])
    with pytest.raises(Exception, match=r"missing column"):
        delete(spark, "sp_mut", pc.field("nope") == 1, replica=r0)


# ---------------------------------------------------------------------------------------------
# Registration


def test_format_is_found_by_spark_without_register(tmp_path: Path, c0: Client, r0: str) -> None:
    """Installing the package is enough: a fresh Spark (new JVM, started outside the repository)
    finds `pyspark_mergetxn` and reads through format("mergetxn") with no register() call."""
    c0.create_table("sp_auto", SCHEMA, auto_merge=False)
    with c0.transaction() as tx:
        tx.insert("sp_auto", pa.table({"id": [1, 2], "k": ["a", "b"], "v": [0.5, 1.5]}, schema=SCHEMA))
    script = (
        "import sys\n"
        "from pyspark.sql import SparkSession\n"
        "s = SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false').getOrCreate()\n"
        f"print('COUNT', s.read.format('mergetxn').option('replica', {r0!r}).load('sp_auto').count())\n"
        "s.stop()\n"
    )
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.pop("PYTHONPATH", None)
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert "COUNT 2" in out.stdout, out.stderr[-3000:]
