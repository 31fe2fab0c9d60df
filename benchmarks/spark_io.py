"""Spark write and read through the mergetxn data source against plain Parquet, in one run.

For each size (1M and 5M rows by default) the same DataFrame is written with
``df.write.format("mergetxn").mode("overwrite").save(t)`` (executors write parts, one commit
through a replica) and with ``df.write.mode("overwrite").parquet(path)``; then both are read back
in full, ``spark.read.format("mergetxn").load(t)`` against ``spark.read.parquet(path)``, each
consumed by the ``noop`` sink so every row and column crosses into the JVM. Rounds alternate the
two systems; the median of ``--repeat`` rounds is reported, with ratios mergetxn / parquet.

Besides wall time, each case reports the CPU seconds that the Spark JVM and its Python workers
(the process tree of the JVM) and the replica spent: on a small shared machine wall time moves
with whatever else runs, CPU time much less.

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


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_by_pid() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, user+system CPU seconds of the process and its reaped children)."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(name)] = (int(fields[1]), sum(int(x) for x in fields[11:15]) / _TICK)
    return out


def tree_cpu(roots: list[int]) -> float:
    """CPU seconds of the given processes and all their descendants (live ones, plus what they
    reaped)."""
    procs = _cpu_by_pid()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    total, stack, seen = 0.0, list(roots), set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += procs.get(pid, (0, 0.0))[1]
        stack.extend(children.get(pid, ()))
    return total


def timed(fn, roots: list[int]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process trees at ``roots``) of one call."""
    cpu = tree_cpu(roots)
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start, tree_cpu(roots) - cpu


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
            roots = [session.sparkContext._jvm.java.lang.ProcessHandle.current().pid(),
                     cluster.replica_pid(0)]
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
                runs: dict[str, list[tuple[float, float]]] = {
                    "write_mergetxn": [], "write_parquet": [], "read_mergetxn": [], "read_parquet": []}
                for _ in range(a.repeat):
                    runs["write_mergetxn"].append(timed(
                        lambda: df.write.format("mergetxn").mode("overwrite").save(table), roots))
                    runs["write_parquet"].append(timed(lambda: df.write.mode("overwrite").parquet(path), roots))
                    runs["read_mergetxn"].append(timed(lambda: session.read.format("mergetxn").load(table)
                                                       .write.format("noop").mode("overwrite").save(), roots))
                    runs["read_parquet"].append(timed(lambda: session.read.parquet(path)
                                                      .write.format("noop").mode("overwrite").save(), roots))
                assert client.read(table, columns=["id"]).num_rows == rows
                assert session.read.format("mergetxn").load(table).count() == rows
                parts = client.parts(table).filter(pa.compute.field("visible")).num_rows
                wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
                cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
                r = results["sizes"][str(rows)] = {
                    "wall": {k: round(v, 3) for k, v in wall.items()},
                    "cpu": {k: round(v, 3) for k, v in cpu.items()},
                    "write_ratio": round(wall["write_mergetxn"] / wall["write_parquet"], 3),
                    "read_ratio": round(wall["read_mergetxn"] / wall["read_parquet"], 3),
                    "write_cpu_ratio": round(cpu["write_mergetxn"] / cpu["write_parquet"], 3),
                    "read_cpu_ratio": round(cpu["read_mergetxn"] / cpu["read_parquet"], 3),
                    "runs": runs,
                    "parts": parts,
                }
                print(f"{rows:>9} rows: write {wall['write_mergetxn']:.2f}s vs {wall['write_parquet']:.2f}s "
                      f"({r['write_ratio']:.2f}x, CPU {r['write_cpu_ratio']:.2f}x), read {wall['read_mergetxn']:.2f}s "
                      f"vs {wall['read_parquet']:.2f}s ({r['read_ratio']:.2f}x, CPU {r['read_cpu_ratio']:.2f}x)",
                      flush=True)
            session.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print("| rows | write mergetxn | write parquet | ratio (CPU) | read mergetxn | read parquet | ratio (CPU) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for rows, r in results["sizes"].items():
        w, c = r["wall"], r["cpu"]
        print(f"| {int(rows):,} | {w['write_mergetxn']:.2f}s ({c['write_mergetxn']:.1f} cpu-s) | "
              f"{w['write_parquet']:.2f}s ({c['write_parquet']:.1f}) | {r['write_ratio']:.2f}x "
              f"({r['write_cpu_ratio']:.2f}x) | {w['read_mergetxn']:.2f}s ({c['read_mergetxn']:.1f}) | "
              f"{w['read_parquet']:.2f}s ({c['read_parquet']:.1f}) | {r['read_ratio']:.2f}x ({r['read_cpu_ratio']:.2f}x) |")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
