"""``spark.write_table`` / ``spark.read_table`` on a Spark standalone cluster (master and two
workers from the pyspark package, executors in other processes than the driver): a task that
fails after writing and is retried, and speculative attempts (which Spark runs only outside local
mode), still make every row visible exactly once.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from support.cluster import make_cluster
from test_spark import as_rows  # tests/ is on sys.path

import coordinator
import spark as mspark
from mergetxn.chaos.spark_cluster import SparkStandalone
from mergetxn.client import Client

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("error::spark.native.NativeFallback")]

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("k", pa.string()), ("v", pa.float64())])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    with make_cluster(tmp_path_factory, None, "nativestandalone", replicas=1) as c:
        yield c


@pytest.fixture(scope="module")
def c0(cluster: coordinator.LocalCluster) -> Iterator[Client]:
    c = cluster.client(0)
    yield c
    c.close()


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory, cluster: coordinator.LocalCluster):
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # Two loopback addresses: Spark never runs a speculative copy on the host of the attempt it
    # copies, so the workers must look like two hosts.
    sa = SparkStandalone(tmp_path_factory.mktemp("standalone"), worker_hosts=("127.0.0.2", "127.0.0.3"))
    sa.start()
    try:
        s = sa.session(
            "mergetxn-native",
            **{
                "spark.task.maxFailures": "4",
                "spark.speculation": "true",
                "spark.speculation.interval": "100ms",
                "spark.speculation.multiplier": "1.5",
                "spark.speculation.quantile": "0.5",
                "spark.speculation.minTaskRuntime": "200ms",
            },
        )
        mspark.register(s, replica=cluster.replica_addresses[0])
        try:
            yield s
        finally:
            s.stop()
    finally:
        sa.stop()


def frame(spark, start: int, n: int, slices: int = 2):
    return spark.range(start, start + n, numPartitions=slices).selectExpr(
        "id", "concat('k', cast(id % 3 as string)) as k", "cast(id as double) * 0.5 as v"
    )


def expected(start: int, n: int) -> list[tuple]:
    return [(i, f"k{i % 3}", i * 0.5) for i in range(start, start + n)]


def fail_once(marks: str):
    """Partition 0's first attempt hands all its rows but the last to the writer, then fails."""

    def run(index: int, it):
        data = list(it)
        if index != 0 or Path(marks, "failed").exists():
            yield from data
            return
        Path(marks, "failed").write_text("1")
        yield from data[:-1]
        raise RuntimeError("injected failure after the task's rows were written")

    return run


def slow_first_attempt(marks: str):
    """Partition 0's first attempt is slow, so a speculative copy of it is launched; whichever
    finishes first is committed, the other is not."""

    def run(index: int, it):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        Path(marks, f"p{index}-a{ctx.attemptNumber()}").write_text("1")
        data = list(it)
        if index == 0 and ctx.attemptNumber() == 0:
            time.sleep(6)
        yield from data

    return run


def test_retried_task_and_speculative_attempts_count_once(session, c0: Client, tmp_path: Path) -> None:
    c0.create_table("ns_retry", SCHEMA, auto_merge=False)
    src = frame(session, 0, 3000)
    retry_marks = tmp_path / "retry"
    retry_marks.mkdir()
    df = session.createDataFrame(src.rdd.mapPartitionsWithIndex(fail_once(str(retry_marks))), src.schema)
    csn = mspark.write_table(df, "ns_retry")
    assert (retry_marks / "failed").exists()
    assert as_rows(c0.read("ns_retry")) == expected(0, 3000)

    c0.create_table("ns_spec", SCHEMA, auto_merge=False)
    spec_marks = tmp_path / "spec"
    spec_marks.mkdir()
    src = frame(session, 0, 2000, slices=6)
    df = session.createDataFrame(src.rdd.mapPartitionsWithIndex(slow_first_attempt(str(spec_marks))), src.schema)
    assert mspark.write_table(df, "ns_spec") > csn
    assert (spec_marks / "p0-a1").exists(), "no speculative attempt ran"
    assert as_rows(c0.read("ns_spec")) == expected(0, 2000)
    # Spark's own reader on the executors reads them back, once each.
    assert sorted(r["id"] for r in mspark.read_table(session, "ns_spec").select("id").collect()) == list(range(2000))
