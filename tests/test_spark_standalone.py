"""The Spark tests that matter most, again on a Spark standalone cluster (issue 13 item 4): a
master and two workers from the pyspark package's own classes (mergetxn/chaos/spark_cluster.py),
so the data source's writer, commit and reader code run in executors, other processes than the
driver, as on a real cluster. The test functions are test_spark's and test_spark_keys' own,
collected here again with this module's fixtures (its cluster, its session).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_spark
import test_spark_keys
from support.cluster import make_cluster
from test_spark import (  # noqa: F401 - collected again here, with this module's fixtures
    test_aborted_job_leaves_nothing_visible_and_removes_its_parts,
    test_append_then_overwrite_partitions_and_whole_table,
    test_read_schema_nullability_and_types,
    test_reads_keep_their_snapshot_while_new_writes_commit,
    test_task_failing_after_writing_a_part_is_retried_exactly_once,
    test_txn_option_commits_two_tables_at_one_csn,
)
from test_spark_keys import test_spark_writes_by_key_and_reads_one_row_per_key  # noqa: F401

import coordinator
from mergetxn.chaos.spark_cluster import SparkStandalone

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    with make_cluster(tmp_path_factory, None, "sparkstandalone", replicas=2) as c:
        yield c


@pytest.fixture(scope="module")
def r0(cluster: coordinator.LocalCluster) -> str:
    return cluster.replica_addresses[0]


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory):
    from pyspark import cloudpickle

    # Executors import the project's packages, not the tests: ship the tests' functions by value.
    for module in (sys.modules[__name__], test_spark, test_spark_keys):
        cloudpickle.register_pickle_by_value(module)
    sa = SparkStandalone(tmp_path_factory.mktemp("standalone"))
    t0 = time.monotonic()
    sa.start()
    session = sa.session("mergetxn-standalone-tests")
    print(f"standalone cluster and session in {time.monotonic() - t0:.1f}s, {len(sa.executors())} executors")
    try:
        yield session
    finally:
        session.stop()
        sa.stop()


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    d = tmp_path / "marks"
    d.mkdir()
    return d


def test_executors_run_in_other_processes(spark) -> None:
    """What makes this module worth running: the Python code of tasks runs in executors, not
    in this (the driver's) process."""
    import os

    pids = set(spark.sparkContext.parallelize(range(8), 4).map(lambda _: os.getppid()).collect())
    assert os.getpid() not in pids and pids
