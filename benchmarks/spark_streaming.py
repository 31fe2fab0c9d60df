"""The streaming sink against Spark's own file sink, in one run: rows per second.

The same input (a directory of ``--files`` Parquet files of ``--rows`` rows each, four columns of
the usual kinds), read by Spark's file source one file a micro-batch (``maxFilesPerTrigger=1``),
with the same trigger (``availableNow``), written either by
``writeStream.format("mergetxn").option("checkpointLocation", d).start(table)`` (executors write
parts, one idempotent commit per micro-batch through a replica) or by
``writeStream.format("parquet")`` (Spark's file sink and its metadata log). Each round starts a
new query over a new checkpoint and a new output; rounds rotate the sinks; the median of
``--repeat`` rounds is reported, with the ratio of times mergetxn / parquet (the target is at
most 1.2). A fourth, ``native``, is ``spark.write_stream`` (``foreachBatch`` with Spark's own
Parquet writer under each batch, committed by ``write_table`` with the same idempotent app
version). A third sink, ``plainpq`` (a bare Python streaming sink writing Parquet with pyarrow,
committing nothing), shows the floor of Spark's Python streaming write path. CPU seconds of the Spark JVM's process tree and of the replica are reported beside the
wall time (see spark_io.py).

    .venv/bin/python benchmarks/spark_streaming.py [--files 5] [--rows 1000000] [--repeat 3]
                                                   [--master local[2]]
                                                   [--out benchmarks/results/spark_streaming.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from spark_io import timed  # noqa: E402 - after the path is set

# Benchmarks load one partition of a table without merges with thousands of parts: the
# replicas they start take no backpressure (docs/rules.md, "Too many parts"), or they would
# measure its delays and refusals instead of the path they are about.
os.environ.setdefault("MERGETXN_PARTS_TO_DELAY_INSERT", "0")
os.environ.setdefault("MERGETXN_PARTS_TO_THROW_INSERT", "0")

DDL = "id bigint, k int, v double, s string"


def make_input(directory: Path, files: int, rows: int) -> None:
    import random

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    rng = random.Random(7)
    names = pa.array([f"name-{i}" for i in range(1000)])
    for f in range(files):
        ids = pa.array(range(f * rows, (f + 1) * rows), pa.int64())
        data = pa.table(
            {
                "id": ids,
                "k": pc.cast(pc.remainder(ids, 100), pa.int32()),
                "v": pa.array([rng.random() * 1000 for _ in range(rows)], pa.float64()),
                "s": names.take(pc.remainder(ids, 1000)),
            }
        )
        pq.write_table(data, directory / f"part-{f:04d}.parquet")


def plain_stream_source() -> type:
    """``plainpq``: a bare Python streaming sink that writes each task's Arrow batches as one
    Parquet file with pyarrow and commits nothing (no transaction, replica, checksum or part
    metadata): the floor of Spark's Python streaming write path, which mergetxn's sink rides."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

    class PlainStreamWriter(DataSourceStreamArrowWriter):
        def __init__(self, path: str) -> None:
            self.path = path

        def write(self, iterator):
            import uuid

            import pyarrow as pa
            import pyarrow.parquet as pq

            batches = [b for b in iterator if b.num_rows]
            if batches:
                pq.write_table(
                    pa.Table.from_batches(batches), f"{self.path}/{uuid.uuid4().hex}.parquet", compression="zstd"
                )
            return WriterCommitMessage()

        def commit(self, messages, batchId):  # noqa: N803
            pass

    class PlainStreamSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "plainpq"

        def streamWriter(self, schema, overwrite: bool):  # noqa: N802
            os.makedirs(self.options["path"], exist_ok=True)
            return PlainStreamWriter(self.options["path"])

    return PlainStreamSource


def run(session, source: Path, sink: str, target: str, checkpoint: Path, replica: str) -> None:
    df = session.readStream.schema(DDL).option("maxFilesPerTrigger", 1).parquet(str(source))
    if sink == "native":  # spark.write_stream: foreachBatch + write_table, exactly once by batch id
        import spark as mergetxn_spark

        mergetxn_spark.write_stream(
            df, target, str(checkpoint), replica=replica, trigger={"availableNow": True}
        ).awaitTermination()
        return
    w = df.writeStream.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
    if sink == "mergetxn":
        q = w.format("mergetxn").option("replica", replica).start(target)
    elif sink == "plainpq":
        q = w.format("plainpq").start(target)
    else:
        q = w.format("parquet").option("path", target).start()
    q.awaitTermination()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=5)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "spark_streaming.json"))
    a = p.parse_args()

    import pyarrow as pa
    from pyspark.sql import SparkSession

    import coordinator
    import spark as mergetxn_spark

    work = Path(tempfile.mkdtemp(prefix="mergetxn-stream-bench-"))
    total = a.files * a.rows
    results: dict = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "master": a.master},
        "files": a.files,
        "rows_per_file": a.rows,
        "rows": total,
        "rounds": [],
    }
    try:
        make_input(work / "input", a.files, a.rows)
        with coordinator.LocalCluster(work / "cluster", replicas=1) as cluster:
            client = cluster.client(0)
            replica = cluster.replica_addresses[0]
            session = (
                SparkSession.builder.master(a.master)
                .appName("mergetxn-spark-streaming")
                .config("spark.ui.enabled", "false")
                .config("spark.driver.memory", "2g")
                .config("spark.pyspark.python", sys.executable)
                .config("spark.sql.shuffle.partitions", "2")
                .getOrCreate()
            )
            session.sparkContext.setLogLevel("ERROR")
            mergetxn_spark.register(session, replica=replica)
            session.dataSource.register(plain_stream_source())
            import pyspark

            results["machine"]["spark"] = pyspark.__version__
            roots = [session.sparkContext._jvm.java.lang.ProcessHandle.current().pid(), cluster.replica_pid(0)]
            schema = pa.schema([("id", pa.int64()), ("k", pa.int32()), ("v", pa.float64()), ("s", pa.string())])
            # One untimed round each: JVM classes, Python workers and the replica warmed up.
            client.create_table("warm", schema)
            run(session, work / "input", "mergetxn", "warm", work / "ck-warm-m", replica)
            run(session, work / "input", "parquet", str(work / "out-warm"), work / "ck-warm-p", replica)
            run(session, work / "input", "plainpq", str(work / "plain-warm"), work / "ck-warm-x", replica)
            client.create_table("warm_native", schema)
            run(session, work / "input", "native", "warm_native", work / "ck-warm-n", replica)
            for i in range(a.repeat):
                table = f"stream_{i}"
                client.create_table(table, schema)
                client.create_table(f"{table}_native", schema)
                sinks = ["mergetxn", "parquet", "plainpq", "native"]
                for sink in sinks[i % 4 :] + sinks[: i % 4]:
                    target = {"mergetxn": table, "native": f"{table}_native"}.get(sink, str(work / f"out-{sink}-{i}"))
                    wall, cpu = timed(
                        lambda: run(session, work / "input", sink, target, work / f"ck-{sink}-{i}", replica), roots
                    )
                    results["rounds"].append({"round": i, "sink": sink, "seconds": wall, "cpu_seconds": cpu})
                    print(
                        f"round {i} {sink:8s} {wall:6.2f}s  {total / wall:12,.0f} rows/s  cpu {cpu:6.2f}s", flush=True
                    )
                assert client.read(table, columns=["id"]).num_rows == total
                assert client.read(f"{table}_native", columns=["id"]).num_rows == total
            session.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    summary = {}
    for sink in ("mergetxn", "parquet", "plainpq", "native"):
        secs = [r["seconds"] for r in results["rounds"] if r["sink"] == sink]
        cpus = [r["cpu_seconds"] for r in results["rounds"] if r["sink"] == sink]
        summary[sink] = {
            "median_seconds": statistics.median(secs),
            "rows_per_second": total / statistics.median(secs),
            "median_cpu_seconds": statistics.median(cpus),
        }
    summary["ratio_time_mergetxn_over_parquet"] = (
        summary["mergetxn"]["median_seconds"] / summary["parquet"]["median_seconds"]
    )
    summary["ratio_cpu_mergetxn_over_parquet"] = (
        summary["mergetxn"]["median_cpu_seconds"] / summary["parquet"]["median_cpu_seconds"]
    )
    summary["ratio_time_mergetxn_over_plainpq"] = (
        summary["mergetxn"]["median_seconds"] / summary["plainpq"]["median_seconds"]
    )
    summary["ratio_time_plainpq_over_parquet"] = (
        summary["plainpq"]["median_seconds"] / summary["parquet"]["median_seconds"]
    )
    summary["ratio_time_native_over_parquet"] = (
        summary["native"]["median_seconds"] / summary["parquet"]["median_seconds"]
    )
    summary["ratio_cpu_native_over_parquet"] = (
        summary["native"]["median_cpu_seconds"] / summary["parquet"]["median_cpu_seconds"]
    )
    results["summary"] = summary
    print(json.dumps(summary, indent=2))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
