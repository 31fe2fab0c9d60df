"""Structured Streaming through `format("mergetxn")` (spark/streaming.py) against real Spark (local
mode), a real ZooKeeper and a real replica.

The sink: every micro-batch committed exactly once, across restarts from the checkpoint, when the
commit runner dies after the parts are written and before the commit (the batch runs again and
commits once) or after the commit and before Spark's commit log (Spark replays the batch; the
replay's DuplicateCommit is a success and leaves no file), the same with the whole driver (a
process of its own) SIGKILLed at those points, and when a checkpoint's commit log entry is lost. Two racing commits with the same app version are tested without Spark in
tests/integration/test_app_version.py (exactly one wins).

The source: changes with CSNs as offsets, resumed from the checkpoint without gaps or repeats
while other commits land between runs; by time, compactions never appear.

The input of the sink is a directory of Parquet files filled between runs, one file a batch
(`maxFilesPerTrigger=1`), each run `trigger(availableNow=True)`: the batches are known exactly.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.cluster import make_cluster  # tests/ is on sys.path
from test_spark import DDL, SCHEMA, as_rows, local_files, new_session, rows, visible_parts

import coordinator
from mergetxn.client import Client

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    with make_cluster(tmp_path_factory, None, "streamcluster", replicas=1) as c:
        yield c


@pytest.fixture(scope="module")
def r0(cluster: coordinator.LocalCluster) -> str:
    return cluster.replica_addresses[0]


@pytest.fixture(scope="module")
def spark(cluster: coordinator.LocalCluster):
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    session = new_session("mergetxn-streaming-tests")
    yield session
    session.stop()


def arrow(data: list[tuple]) -> pa.Table:
    return pa.table({"id": [r[0] for r in data], "k": [r[1] for r in data], "v": [r[2] for r in data]}, schema=SCHEMA)


class Input:
    """A directory of Parquet files that a file stream reads one file per batch."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "input"
        self.dir.mkdir()
        self.n = 0

    def add(self, data: list[tuple]) -> None:
        path = self.dir / f"f{self.n:04d}.parquet"
        pq.write_table(arrow(data), path)
        when = 1_700_000_000 + self.n  # the file source takes the oldest first: one file per batch, in order
        os.utime(path, (when, when))
        self.n += 1


def run_sink(spark, src: Input, ckpt: Path, table: str, replica: str, **options: str) -> None:
    """One run of the query over what the input holds now, from ``ckpt``."""
    df = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).parquet(str(src.dir))
    w = df.writeStream.format("mergetxn").option("replica", replica).option("checkpointLocation", str(ckpt))
    for k, v in options.items():
        w = w.option(k, v)
    q = w.trigger(availableNow=True).start(table)
    try:
        q.awaitTermination()
    finally:
        q.stop()


def query_id(ckpt: Path) -> str:
    return json.loads((ckpt / "metadata").read_text().splitlines()[0])["id"]


def commit_csns(client: Client, table: str) -> set[int]:
    return {p["creation_csn"] for p in visible_parts(client, table)}


# ---------------------------------------------------------------------------------------------
# The sink


def test_each_batch_committed_once_across_restarts(spark, c0: Client, r0: str, tmp_path: Path) -> None:
    c0.create_table("ss_once", SCHEMA, auto_merge=False)
    src, ckpt = Input(tmp_path), tmp_path / "ckpt"
    for i in range(3):
        src.add(rows(i * 10, 10))
    run_sink(spark, src, ckpt, "ss_once", r0)
    assert as_rows(c0.read("ss_once")) == sorted(rows(0, 30))
    assert len(commit_csns(c0, "ss_once")) == 3  # one commit per micro-batch
    app = "spark-stream:" + query_id(ckpt)
    assert c0.app_version(app) == 2

    # A restart from the checkpoint goes on with batches 3 and 4, nothing of 0..2 again.
    src.add(rows(30, 5))
    src.add(rows(35, 5))
    run_sink(spark, src, ckpt, "ss_once", r0)
    assert as_rows(c0.read("ss_once")) == sorted(rows(0, 40))
    assert len(commit_csns(c0, "ss_once")) == 5 and c0.app_version(app) == 4
    # A new checkpoint is a new query: its batches start at 0 again and are not taken for replays.
    run_sink(spark, src, tmp_path / "ckpt2", "ss_once", r0)
    assert c0.read("ss_once").num_rows == 80


def _only_visible_files(cluster: coordinator.LocalCluster, c0: Client, table: str) -> bool:
    root = Path(cluster.storage_url) / table
    visible = {str(Path(cluster.storage_url) / p["path"]) for p in visible_parts(c0, table)}
    return {str(root / f) for f in local_files(cluster, table)} == visible


def test_commit_runner_dies_before_the_commit(spark, cluster, c0: Client, r0: str, tmp_path: Path) -> None:
    """Parts written, nothing committed: the restarted query runs the batch again, once."""
    c0.create_table("ss_before", SCHEMA, auto_merge=False)
    src, ckpt, fp = Input(tmp_path), tmp_path / "ckpt", tmp_path / "fp"
    fp.mkdir()
    src.add(rows(0, 10))
    run_sink(spark, src, ckpt, "ss_before", r0)
    src.add(rows(10, 10))
    (fp / "stream_before_commit").touch()
    with pytest.raises(Exception):
        run_sink(spark, src, ckpt, "ss_before", r0, failpoints=str(fp))
    assert (fp / "stream_before_commit.reached").exists()
    assert as_rows(c0.read("ss_before")) == sorted(rows(0, 10))
    # Spark aborts the failed batch (its transaction rolled back, its parts deleted); a driver
    # killed outright leaves them to cleanup: either way none is visible.
    run_sink(spark, src, ckpt, "ss_before", r0)
    assert as_rows(c0.read("ss_before")) == sorted(rows(0, 20))
    assert c0.app_version("spark-stream:" + query_id(ckpt)) == 1


def test_commit_runner_dies_after_the_commit_replay_is_exactly_once(
    spark, cluster, c0: Client, r0: str, tmp_path: Path
) -> None:
    """Committed at the replica, not in Spark's commit log: Spark replays the batch on restart
    and the replay changes nothing (and leaves no file behind)."""
    c0.create_table("ss_after", SCHEMA, auto_merge=False)
    src, ckpt, fp = Input(tmp_path), tmp_path / "ckpt", tmp_path / "fp"
    fp.mkdir()
    src.add(rows(0, 10))
    src.add(rows(10, 10))
    (fp / "stream_after_commit").touch()
    with pytest.raises(Exception):
        run_sink(spark, src, ckpt, "ss_after", r0, failpoints=str(fp))
    assert (fp / "stream_after_commit.reached").exists()
    assert as_rows(c0.read("ss_after")) == sorted(rows(0, 10))  # batch 0 committed at the replica
    assert not (ckpt / "commits" / "0").exists()  # ... and not in Spark's commit log
    run_sink(spark, src, ckpt, "ss_after", r0)
    assert as_rows(c0.read("ss_after")) == sorted(rows(0, 20))
    assert (ckpt / "commits" / "1").exists()
    assert _only_visible_files(cluster, c0, "ss_after")  # the replay's parts were deleted


def test_lost_commit_log_entry_replays_once(spark, cluster, c0: Client, r0: str, tmp_path: Path) -> None:
    c0.create_table("ss_replay", SCHEMA, auto_merge=False)
    src, ckpt = Input(tmp_path), tmp_path / "ckpt"
    for i in range(2):
        src.add(rows(i * 10, 10))
    run_sink(spark, src, ckpt, "ss_replay", r0)
    before = visible_parts(c0, "ss_replay")
    for name in ("1", ".1.crc"):  # Spark runs batch 1 again on restart
        (ckpt / "commits" / name).unlink(missing_ok=True)
    run_sink(spark, src, ckpt, "ss_replay", r0)
    assert (ckpt / "commits" / "1").exists()
    assert as_rows(c0.read("ss_replay")) == sorted(rows(0, 20))
    assert visible_parts(c0, "ss_replay") == before
    assert _only_visible_files(cluster, c0, "ss_replay")


def test_sink_bad_options(spark, c0: Client, r0: str, tmp_path: Path) -> None:
    c0.create_table("ss_bad", SCHEMA, auto_merge=False)
    src = Input(tmp_path)
    src.add(rows(0, 3))
    with pytest.raises(Exception, match=r"option 'app_version' does not apply to a stream"):
        run_sink(spark, src, tmp_path / "c1", "ss_bad", r0, app_version="3")
    with pytest.raises(Exception, match=r"unknown table 'ss_nope'"):
        run_sink(spark, src, tmp_path / "c2", "ss_nope", r0)
    assert c0.read("ss_bad").num_rows == 0


# ---------------------------------------------------------------------------------------------
# The source


def run_source(spark, ckpt: Path, out: Path, table: str, replica: str, **options: str) -> None:
    """One run of a stream of ``table``'s changes into Parquet files under ``out``."""
    r = spark.readStream.format("mergetxn").option("replica", replica)
    for k, v in options.items():
        r = r.option(k, v)
    q = (
        r.load(table)
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    try:
        q.awaitTermination()
    finally:
        q.stop()


def streamed(spark, out: Path) -> list[tuple]:
    if not out.exists():
        return []
    return sorted((r["_csn"], r["_change"], r["id"]) for r in spark.read.parquet(str(out)).collect())


def insert(client: Client, table: str, data: list[tuple]) -> int:
    with client.transaction() as tx:
        tx.insert(table, arrow(data))
    return tx.csn


def test_source_resumes_from_its_checkpoint_without_gaps_or_repeats(spark, c0: Client, r0: str, tmp_path: Path) -> None:
    # Its own retention window: between runs nothing pins what the stream has yet to read, and a
    # stopped stream resumes only within the window (with the session's 0 s cleanup could forget
    # the overwrite's history first: SnapshotUnavailable, seen once in CI under load).
    c0.create_table("ss_src", SCHEMA, auto_merge=False, retention_seconds=3600)
    c0.create_table("ss_other", SCHEMA, auto_merge=False)
    insert(c0, "ss_src", rows(0, 3))  # before the start: never streamed
    start = c0.snapshot()
    a = insert(c0, "ss_src", rows(3, 3))
    b = insert(c0, "ss_src", rows(6, 2))
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    run_source(spark, ckpt, out, "ss_src", r0, changes_from=str(start))
    expected = [(a, "insert", i) for i in range(3, 6)] + [(b, "insert", i) for i in range(6, 8)]
    assert streamed(spark, out) == sorted(expected)

    # Between runs: commits to the table (an overwrite: its deletes too) and to another table.
    c = insert(c0, "ss_src", rows(8, 2))
    insert(c0, "ss_other", rows(0, 5))
    with c0.transaction() as tx:
        tx.overwrite("ss_src", arrow(rows(100, 1)))
    d = tx.csn
    run_source(spark, ckpt, out, "ss_src", r0, changes_from=str(start))
    expected += [(c, "insert", i) for i in range(8, 10)]
    expected += [(d, "delete", i) for i in range(0, 10)] + [(d, "insert", 100)]
    assert streamed(spark, out) == sorted(expected)  # each change once, none missing

    # A run with nothing new adds nothing.
    run_source(spark, ckpt, out, "ss_src", r0, changes_from=str(start))
    assert streamed(spark, out) == sorted(expected)


def test_source_by_time_leaves_compactions_out(spark, c0: Client, r0: str, tmp_path: Path) -> None:
    c0.create_table("ss_time", SCHEMA, auto_merge=False)
    pin = c0.begin()  # keeps cleanup from collecting what the compaction removed before the streams read it
    start = pin.snapshot
    a = insert(c0, "ss_time", rows(0, 2))
    b = insert(c0, "ss_time", rows(2, 2))
    compaction = c0.compact("ss_time", kind="major")
    c = insert(c0, "ss_time", rows(4, 1))
    inserts = [(a, "insert", 0), (a, "insert", 1), (b, "insert", 2), (b, "insert", 3), (c, "insert", 4)]
    out_time, out_id = tmp_path / "by_time", tmp_path / "by_id"
    run_source(spark, tmp_path / "ck_time", out_time, "ss_time", r0, changes_from=str(start), changes_by="time")
    assert streamed(spark, out_time) == sorted(inserts)
    run_source(spark, tmp_path / "ck_id", out_id, "ss_time", r0, changes_from=str(start))
    by_id = streamed(spark, out_id)
    assert {r[0] for r in by_id} == {a, b, compaction, c}  # by id the compaction's rewrite shows
    assert sorted(r for r in by_id if r[0] == compaction) == sorted(
        [(compaction, "delete", i) for i in range(4)] + [(compaction, "insert", i) for i in range(4)]
    )
    pin.rollback()


def test_source_needs_changes_from(spark, c0: Client, r0: str, tmp_path: Path) -> None:
    c0.create_table("ss_src_bad", SCHEMA, auto_merge=False)
    with pytest.raises(Exception, match=r"needs option 'changes_from'"):
        run_source(spark, tmp_path / "ck", tmp_path / "out", "ss_src_bad", r0)
    with pytest.raises(Exception, match=r"'changes_from' must be an integer, not 'yesterday'"):
        run_source(spark, tmp_path / "ck2", tmp_path / "out2", "ss_src_bad", r0, changes_from="yesterday")
    # 'latest': only what commits from the query's start.
    insert(c0, "ss_src_bad", rows(0, 2))
    run_source(spark, tmp_path / "ck3", tmp_path / "out3", "ss_src_bad", r0, changes_from="latest")
    assert streamed(spark, tmp_path / "out3") == []
    d = insert(c0, "ss_src_bad", rows(2, 1))
    run_source(spark, tmp_path / "ck3", tmp_path / "out3", "ss_src_bad", r0, changes_from="latest")
    assert streamed(spark, tmp_path / "out3") == [(d, "insert", 2)]


def test_changes_by_id_without_compactions_is_by_time(c0: Client) -> None:
    """What a by-time stream reads per batch: by id with CSN bounds, leaving out what by time
    leaves out (a compaction's rewrite), the same rows as by time."""
    import datetime as dt

    c0.create_table("ss_nocompact", SCHEMA, auto_merge=False)
    pin = c0.begin()  # keeps what the compaction removed readable
    t0 = dt.datetime.now(dt.UTC)
    start = pin.snapshot
    a = insert(c0, "ss_nocompact", rows(0, 2))
    b = insert(c0, "ss_nocompact", rows(2, 2))
    compaction = c0.compact("ss_nocompact", kind="major")
    insert(c0, "ss_nocompact", rows(4, 1))

    def keyed(t: pa.Table) -> list[tuple]:
        return sorted(zip(t.column("_csn").to_pylist(), t.column("_change").to_pylist(), t.column("id").to_pylist()))

    by_time = keyed(c0.changes("ss_nocompact", t0, by="time"))
    assert keyed(c0.changes("ss_nocompact", start, by="id", compactions=False)) == by_time
    assert compaction not in {r[0] for r in by_time} and {a, b} <= {r[0] for r in by_time}
    assert compaction in {r[0] for r in keyed(c0.changes("ss_nocompact", start, by="id"))}
    # CSN bounds hold: (a, compaction] by id without compactions is b's rows only.
    assert keyed(c0.changes("ss_nocompact", a, compaction, by="id", compactions=False)) == [
        (b, "insert", 2),
        (b, "insert", 3),
    ]
    pin.rollback()


# ---------------------------------------------------------------------------------------------
# A driver killed outright (SIGKILL of its process group: no abort, no cleanup of its own)

DRIVER = r"""
import sys
sys.path[:0] = [{root!r}, {tests!r}, {here!r}]
from test_spark import DDL, new_session
spark = new_session("killed-driver", master="local[2]")
df = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).parquet({src!r})
q = (df.writeStream.format("mergetxn").option("replica", {replica!r}).option("checkpointLocation", {ckpt!r})
     .option("failpoints", {fp!r}).trigger(availableNow=True).start({table!r}))
q.awaitTermination()
"""


@pytest.mark.parametrize("point", ["stream_before_commit", "stream_after_commit"])
def test_driver_killed_between_writing_and_committing(
    spark, cluster, c0: Client, r0: str, tmp_path: Path, point: str
) -> None:
    """The driver (a process of its own) is SIGKILLed while batch 1's commit runner is held at
    ``point``: parts written and not committed, or committed at the replica and not in Spark's
    commit log. Restarted from the checkpoint, the query leaves every row exactly once; what the
    dead batch wrote is never visible, and cleanup collects it once its transaction is gone."""
    import signal
    import subprocess

    from support.waiting import wait_until
    from test_spark import ROOT, gc_collects

    table = f"ss_kill_{point.split('_')[1]}"
    c0.create_table(table, SCHEMA, auto_merge=False)
    src, ckpt, fp = Input(tmp_path), tmp_path / "ckpt", tmp_path / "fp"
    fp.mkdir()
    src.add(rows(0, 10))
    run_sink(spark, src, ckpt, table, r0)  # batch 0, committed
    src.add(rows(10, 10))
    (fp / point).write_text("hold")
    script = DRIVER.format(
        root=str(ROOT),
        tests=str(ROOT / "tests"),
        here=str(Path(__file__).parent),
        src=str(src.dir),
        replica=r0,
        ckpt=str(ckpt),
        fp=str(fp),
        table=table,
    )
    driver = subprocess.Popen(
        [sys.executable, "-c", script], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_until(lambda: (fp / f"{point}.reached").exists() or driver.poll() is not None, timeout=240)
        assert (fp / f"{point}.reached").exists(), f"the driver exited ({driver.returncode}) before {point}"
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    assert (ckpt / "commits" / "0").exists() and not (ckpt / "commits" / "1").exists()
    committed = rows(0, 20) if point == "stream_after_commit" else rows(0, 10)
    assert as_rows(c0.read(table)) == sorted(committed)

    run_sink(spark, src, ckpt, table, r0)
    assert as_rows(c0.read(table)) == sorted(rows(0, 20))
    assert c0.app_version("spark-stream:" + query_id(ckpt)) == 1
    # Before the commit, the dead batch's transaction still runs (until txn_max_seconds) and
    # keeps its parts; once it is gone, cleanup collects them. After it, nothing is left.
    for t in c0.transactions():
        prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", t["id"]) + "_"  # parts are named after their transaction
        if t["state"] == "running" and any(f.startswith(prefix) for f in _file_names(cluster, table)):
            c0.kill(t["id"])
    assert gc_collects(c0, lambda: set(local_files(cluster, table)) - _visible_files(c0, table))


def _file_names(cluster: coordinator.LocalCluster, table: str) -> set[str]:
    return {Path(f).name for f in local_files(cluster, table)}


def _visible_files(c0: Client, table: str) -> set[str]:
    return {str(Path(p["path"]).relative_to(table)) for p in visible_parts(c0, table)}


def test_a_running_stream_pins_what_it_has_yet_to_read(c0: Client, r0: str) -> None:
    """Between two batches of a running query, a compaction removes the parts the next batch
    reads and cleanup runs: the reader's lease at the start of its next batch keeps them. Driven
    as Spark drives the reader (initialOffset, latestOffset, partitions, read, commit), in this
    process."""
    from spark.datasource import MergetxnDataSource

    c0.create_table("ss_pin", SCHEMA, auto_merge=False)
    start = c0.snapshot()
    source = MergetxnDataSource({"path": "ss_pin", "replica": r0, "changes_from": str(start), "changes_by": "time"})
    reader = source.streamReader(source.schema())

    def batch(lo: dict, hi: dict) -> list[tuple]:
        out = []
        for part in reader.partitions(lo, hi):
            for b in reader.read(part):
                out += zip(b.column("_csn").to_pylist(), b.column("_change").to_pylist(), b.column("id").to_pylist())
        return sorted(out)

    try:
        off0 = reader.initialOffset()
        a = insert(c0, "ss_pin", rows(0, 2))
        off1 = reader.latestOffset()
        assert batch(off0, off1) == [(a, "insert", 0), (a, "insert", 1)]
        reader.commit(off1)

        b = insert(c0, "ss_pin", rows(2, 2))
        c0.compact("ss_pin", kind="major")  # removes a's and b's parts
        c0.gc(grace_seconds=0)
        off2 = reader.latestOffset()
        assert batch(off1, off2) == [(b, "insert", 2), (b, "insert", 3)]
        reader.commit(off2)
    finally:
        reader.stop()


def test_keys_table_stream_writes_by_key_and_streams_row_changes(spark, c0: Client, r0: str, tmp_path: Path) -> None:
    """A keys table through both ends: the sink writes each batch by key (a later batch's row
    replaces an earlier one of its key), the source streams row changes per key."""
    # Its own retention window: the source reads changes from before the sink's commits, and with
    # the session's 0 s cleanup may forget that history first (SnapshotUnavailable, under load).
    c0.create_table(
        "ss_keys", SCHEMA, primary_key=("id",), conflict_policy="keys", auto_merge=False, retention_seconds=3600
    )
    start = c0.snapshot()
    src, ckpt = Input(tmp_path), tmp_path / "ckpt"
    src.add(rows(0, 5))
    src.add([(i, "new", 99.0) for i in range(3, 8)])
    run_sink(spark, src, ckpt, "ss_keys", r0)
    assert as_rows(c0.read("ss_keys")) == sorted(rows(0, 3) + [(i, "new", 99.0) for i in range(3, 8)])
    first, second = sorted(commit_csns(c0, "ss_keys"))
    out = tmp_path / "out"
    run_source(spark, tmp_path / "ck_src", out, "ss_keys", r0, changes_from=str(start))
    expected = [(first, "insert", i) for i in range(5)]
    expected += [(second, "delete", i) for i in (3, 4)] + [(second, "insert", i) for i in range(3, 8)]
    assert streamed(spark, out) == sorted(expected)


def run_native(spark, src: Input, ckpt: Path, table: str, replica: str) -> None:
    import spark as mspark

    df = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).parquet(str(src.dir))
    q = mspark.write_stream(df, table, str(ckpt), replica=replica, trigger={"availableNow": True})
    try:
        q.awaitTermination()
    finally:
        q.stop()


def test_write_stream_native_each_batch_once_across_restarts_and_replays(
    spark, cluster, c0: Client, r0: str, tmp_path: Path
) -> None:
    """spark.write_stream (Spark's own Parquet writer under foreachBatch): one commit per batch,
    a restart goes on, a batch replayed after its commit (its commit-log entry lost) adds
    nothing; the app version is the query's."""
    c0.create_table("ss_native", SCHEMA, auto_merge=False)
    src, ckpt = Input(tmp_path), tmp_path / "ckpt"
    for i in range(2):
        src.add(rows(i * 10, 10))
    run_native(spark, src, ckpt, "ss_native", r0)
    assert as_rows(c0.read("ss_native")) == sorted(rows(0, 20))
    assert len(commit_csns(c0, "ss_native")) == 2
    assert c0.app_version("spark-stream:" + query_id(ckpt)) == 1
    before = visible_parts(c0, "ss_native")
    for name in ("1", ".1.crc"):
        (ckpt / "commits" / name).unlink(missing_ok=True)
    src.add(rows(20, 5))
    run_native(spark, src, ckpt, "ss_native", r0)
    assert as_rows(c0.read("ss_native")) == sorted(rows(0, 25))  # batch 1 once, batch 2 added
    assert [p for p in visible_parts(c0, "ss_native") if p["name"] in {b["name"] for b in before}] == before
    assert len(commit_csns(c0, "ss_native")) == 3
