"""Spark write and read through the mergetxn data source against plain Parquet, in one run.

For each size (1M and 5M rows by default) the same DataFrame is written with
``df.write.format("mergetxn").mode("overwrite").save(t)`` (executors write parts, one commit
through a replica) and with ``df.write.mode("overwrite").parquet(path)``; then both are read back
in full, ``spark.read.format("mergetxn").load(t)`` against ``spark.read.parquet(path)``, each
consumed by the ``noop`` sink so every row and column crosses into the JVM. Rounds alternate the
two systems; the median of ``--repeat`` rounds is reported, with ratios mergetxn / parquet.

    .venv/bin/python benchmarks/spark_io.py [--rows 1000000,5000000] [--repeat 3] [--master local[2]]
                                            [--out benchmarks/results/spark_io.json]
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def frame(spark, rows: int):
    """Four columns of the usual kinds: a key, a small int, a double and a short string."""
    return spark.range(rows).selectExpr(
        "id",
        "cast(id % 100 as int) as k",
        "cast(rand(7) * 1000 as double) as v",
        "concat('name-', cast(id % 1000 as string)) as s",
    )


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1000000,5000000")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "spark_io.json"))
    a = p.parse_args()
    sizes = [int(x) for x in a.rows.split(",") if x]

    import pyarrow as pa
    from pyspark.sql import SparkSession

    import coordinator
    import spark as mergetxn_spark

    work = Path(tempfile.mkdtemp(prefix="mergetxn-spark-bench-"))
    results: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                 "master": a.master}, "sizes": {}}
    try:
        with coordinator.LocalCluster(work / "cluster", replicas=1) as cluster:
            client = cluster.client(0)
            replica = cluster.replica_addresses[0]
            session = (SparkSession.builder.master(a.master).appName("mergetxn-spark-io")
                       .config("spark.ui.enabled", "false")
                       .config("spark.driver.memory", "2g")
                       .config("spark.pyspark.python", sys.executable)
                       .config("spark.sql.shuffle.partitions", "2")
                       .getOrCreate())
            session.sparkContext.setLogLevel("ERROR")
            mergetxn_spark.register(session, replica=replica)
            import pyspark

            results["machine"]["spark"] = pyspark.__version__
            schema = pa.schema([("id", pa.int64()), ("k", pa.int32()), ("v", pa.float64()), ("s", pa.string())])
            for rows in sizes:
                table = f"bench_{rows}"
                client.create_table(table, schema)
                path = str(work / f"parquet_{rows}")
                df = frame(session, rows)
                # Warm-up (JIT, Python workers, imports) at a small size, not measured.
                frame(session, 10_000).write.format("mergetxn").mode("overwrite").save(table)
                frame(session, 10_000).write.mode("overwrite").parquet(path)
                session.read.format("mergetxn").load(table).write.format("noop").mode("overwrite").save()
                session.read.parquet(path).write.format("noop").mode("overwrite").save()
                w_m, w_p, r_m, r_p = [], [], [], []
                for _ in range(a.repeat):
                    w_m.append(timed(lambda: df.write.format("mergetxn").mode("overwrite").save(table)))
                    w_p.append(timed(lambda: df.write.mode("overwrite").parquet(path)))
                    r_m.append(timed(lambda: session.read.format("mergetxn").load(table)
                                     .write.format("noop").mode("overwrite").save()))
                    r_p.append(timed(lambda: session.read.parquet(path)
                                     .write.format("noop").mode("overwrite").save()))
                assert client.read(table, columns=["id"]).num_rows == rows
                assert session.read.format("mergetxn").load(table).count() == rows
                parts = client.parts(table).filter(pa.compute.field("visible")).num_rows
                med = {k: statistics.median(v) for k, v in
                       (("write_mergetxn", w_m), ("write_parquet", w_p), ("read_mergetxn", r_m),
                        ("read_parquet", r_p))}
                results["sizes"][str(rows)] = {
                    **{k: round(v, 3) for k, v in med.items()},
                    "write_ratio": round(med["write_mergetxn"] / med["write_parquet"], 3),
                    "read_ratio": round(med["read_mergetxn"] / med["read_parquet"], 3),
                    "runs": {"write_mergetxn": w_m, "write_parquet": w_p, "read_mergetxn": r_m,
                             "read_parquet": r_p},
                    "parts": parts,
                }
                print(f"{rows:>9} rows: write {med['write_mergetxn']:.2f}s vs {med['write_parquet']:.2f}s "
                      f"({results['sizes'][str(rows)]['write_ratio']:.2f}x), read {med['read_mergetxn']:.2f}s vs "
                      f"{med['read_parquet']:.2f}s ({results['sizes'][str(rows)]['read_ratio']:.2f}x)", flush=True)
            session.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print("| rows | write mergetxn | write parquet | ratio | read mergetxn | read parquet | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for rows, r in results["sizes"].items():
        print(f"| {int(rows):,} | {r['write_mergetxn']:.2f}s | {r['write_parquet']:.2f}s | {r['write_ratio']:.2f}x "
              f"| {r['read_mergetxn']:.2f}s | {r['read_parquet']:.2f}s | {r['read_ratio']:.2f}x |")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
