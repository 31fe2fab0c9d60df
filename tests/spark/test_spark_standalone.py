"""The Spark tests that matter most, again on a Spark standalone cluster: a
master and two workers from the pyspark package's own classes (mergetxn/chaos/spark_cluster.py),
so the data source's writer, commit and reader code, the native path's writes and reads and the
streaming sink and source run in executors, other processes than the driver, as on a real
cluster. The test functions are test_spark's, test_spark_keys', test_spark_native's and
test_spark_streaming's own, collected here again with this module's fixtures (its cluster, its
session). Speculation on a standalone cluster: test_spark_native_cluster.py.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_spark
import test_spark_keys
import test_spark_native
import test_spark_streaming
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
from test_spark_native import (  # noqa: F401
    test_failed_job_leaves_nothing_and_cleanup_collects_staging,
    test_pruning_by_partition_and_min_max_counts_files_read,
    test_round_trip_types_partitions_and_python_parts,
    test_snapshot_and_as_of_reads_while_writes_commit,
)
from test_spark_streaming import (  # noqa: F401
    test_commit_runner_dies_after_the_commit_replay_is_exactly_once,
    test_commit_runner_dies_before_the_commit,
    test_each_batch_committed_once_across_restarts,
    test_source_resumes_from_its_checkpoint_without_gaps_or_repeats,
    test_write_stream_native_each_batch_once_across_restarts_and_replays,
)

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
def spark(tmp_path_factory: pytest.TempPathFactory, cluster: coordinator.LocalCluster):
    from pyspark import cloudpickle

    # Executors import the project's packages, not the tests: ship the tests' functions by value.
    for module in (sys.modules[__name__], test_spark, test_spark_keys, test_spark_native, test_spark_streaming):
        cloudpickle.register_pickle_by_value(module)
    sa = SparkStandalone(tmp_path_factory.mktemp("standalone"))
    t0 = time.monotonic()
    sa.start()
    session = sa.session("mergetxn-standalone-tests")
    import spark as mspark

    mspark.register(session, replica=cluster.replica_addresses[0])  # read_table/write_table's default
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
