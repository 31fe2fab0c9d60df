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

``native`` is the fast path (spark/native.py): ``spark.write_table(df, t, mode="overwrite")``
(Spark's own Parquet writer into a staging directory, the driver commits the files as parts) and
``spark.read_table(session, t)`` (Spark's own Parquet reader over the visible parts), measured in
the same rounds; its ratios ``native / parquet`` are the targets (write <= 1.10x, read <= 1.05x).

A fourth system shows the floor of the road itself: ``plainpq``, a bare Python data source that
writes each task's Arrow batches as one Parquet file with pyarrow and reads files back the same
way (no transaction, replica, checksum or part metadata). Spark moves the rows between the JVM and
the Python workers as Arrow for any Python data source, and on two cores that conversion alone
costs more than Spark's own Parquet writer and reader; ``mergetxn / plainpq`` is the price of
transactions on top of it.

A keys table (``--keys-rows N``; ``--only-keys`` runs it alone): N keys
loaded by the client in 4 commits plus 2 update-mode upserts of 5% of the keys (auto merge off,
so a read folds 1.1 N versions; ``--keys-whole-upserts``: overwrite-mode upserts of whole rows,
read by deletion vectors), read with ``spark.read_table`` (Spark's Parquet reader, the fold
in Spark: spark/keysfold.py), against ``spark.read.parquet`` of the folded rows (``client.read``
written as Parquet, 4 files) and against the data source (the fold in Python workers: what
``read_table`` of a keys table fell back to before); target ``read_table / parquet`` <= 1.5x.
Each keys round also records where the CPU went: the JVM's threads by kind (``jit``: HotSpot's
compiler threads, ``task``: executor task threads, ``gc``, ``other``: the driver's planning,
broadcasts, scheduling), the driver's and the replica's CPU, and how many classes Spark's code
generator compiled (``codegen``: 0 when its cache served every stage). ``--keys-floor`` adds
the *floor* of a read that folds this table's shape: the four insert parts read as they are and
joined (broadcast) with the upserted keys' folded values, read from a Parquet file written
beforehand, so with no fold, no driver work and no aggregate left in the read; it checks once
that the floor's rows equal the folded rows.

    .venv/bin/python benchmarks/spark_io.py [--rows 1000000,5000000] [--repeat 3] [--master local[2]]
                                            [--keys-rows 1000000] [--only-keys] [--keys-no-data-source] [--keys-floor]
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
from typing import Any

# Benchmarks load one partition of a table without merges with thousands of parts: the
# replicas they start take no backpressure (docs/rules.md, "Too many parts"), or they would
# measure its delays and refusals instead of the path they are about.
os.environ.setdefault("MERGETXN_PARTS_TO_DELAY_INSERT", "0")
os.environ.setdefault("MERGETXN_PARTS_TO_THROW_INSERT", "0")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def plain_source(schema_ddl: str) -> type:
    """The ``plainpq`` data source (see the module docstring): defined here, shipped by value."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceReader,
        InputPartition,
        WriterCommitMessage,
    )

    class PlainWriter(DataSourceArrowWriter):
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

    class PlainReader(DataSourceReader):
        def __init__(self, path: str) -> None:
            self.path = path

        def partitions(self):
            names = sorted(f for f in os.listdir(self.path) if f.endswith(".parquet"))
            return [InputPartition(os.path.join(self.path, f)) for f in names]

        def read(self, partition):
            import pyarrow.parquet as pq

            yield from pq.read_table(partition.value).to_batches(max_chunksize=65_536)

    class PlainSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "plainpq"

        def schema(self) -> str:
            return schema_ddl

        def writer(self, schema, overwrite: bool):
            path = self.options["path"]
            if overwrite:
                shutil.rmtree(path, ignore_errors=True)
            os.makedirs(path, exist_ok=True)
            return PlainWriter(path)

        def reader(self, schema):
            return PlainReader(self.options["path"])

    return PlainSource


def frame(spark, rows: int):
    """Four columns of the usual kinds: a key, a small int, a double and a short string."""
    return spark.range(rows).selectExpr(
        "id",
        "cast(id % 100 as int) as k",
        "cast(rand(7) * 1000 as double) as v",
        "concat('name-', cast(id % 1000 as string)) as s",
    )


_TICK = os.sysconf("SC_CLK_TCK")


def _stat(path: str) -> tuple[str, list[str]] | None:
    """A /proc ``stat`` file: the name in parentheses and the fields after it (None: gone)."""
    try:
        with open(path) as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()


def _cpu_by_pid() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, user+system CPU seconds of the process and its reaped children)."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (got := _stat(f"/proc/{name}/stat")) is not None:
            fields = got[1]
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


def _jvm_threads(pid: int) -> dict[int, tuple[str, float]]:
    """thread id -> (name, user+system CPU seconds) of the JVM's threads."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        if (got := _stat(f"/proc/{pid}/task/{tid}/stat")) is not None:
            name, fields = got
            out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / _TICK)
    return out


def _thread_kind(name: str) -> str:
    if "CompilerThre" in name:
        return "jit"
    if name.startswith("Executor task"):
        return "task"
    if name.startswith(("GC ", "G1 ")):
        return "gc"
    return "other"


def split_cpu(fn, roots: list[int], jvm_pid: int, codegen: Any) -> dict:
    """One call's wall and CPU seconds (as :func:`timed`), the JVM's CPU by thread kind, the
    driver's and the replica's (``roots[0]``, ``roots[2]``) and Spark's codegen compilations."""
    procs = _cpu_by_pid()
    mine = [procs.get(roots[0], (0, 0.0))[1], procs.get(roots[2], (0, 0.0))[1]]
    threads, compiled = _jvm_threads(jvm_pid), codegen.getCount()
    wall, cpu = timed(fn, roots)
    after, procs = _jvm_threads(jvm_pid), _cpu_by_pid()
    out = {"wall": round(wall, 3), "cpu": round(cpu, 3), "jit": 0.0, "task": 0.0, "gc": 0.0, "other": 0.0}
    for tid, (name, c) in after.items():
        out[_thread_kind(name)] += c - threads.get(tid, (name, 0.0))[1]
    for k in ("jit", "task", "gc", "other"):
        out[k] = round(out[k], 3)
    out["driver"] = round(procs.get(roots[0], (0, 0.0))[1] - mine[0], 3)
    out["replica"] = round(procs.get(roots[2], (0, 0.0))[1] - mine[1], 3)
    out["codegen"] = codegen.getCount() - compiled
    out["load"] = round(os.getloadavg()[0], 2)
    return out


def timed(fn, roots: list[int]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process trees at ``roots``) of one call."""
    cpu = tree_cpu(roots)
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start, tree_cpu(roots) - cpu


def keys_case(
    session,
    client,
    work: Path,
    rows: int,
    repeat: int,
    roots: list[int],
    data_source: bool = True,
    floor: bool = False,
    whole: bool = False,
) -> dict:
    """The keys-table read case (see the module docstring); ``whole``: the upserts write whole
    rows in overwrite mode (a read by deletion vectors, no fold)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    import spark as mergetxn_spark

    schema = pa.schema(
        [pa.field("id", pa.int64(), nullable=False), ("k", pa.int32()), ("v", pa.float64()), ("s", pa.string())]
    )
    table = f"keys_{rows}"
    client.create_table(
        table,
        schema,
        primary_key=("id",),
        conflict_policy="keys",
        auto_merge=False,
        txn_max_rows=2 * rows,
        txn_max_seconds=7200,
    )
    order = pc.sort_indices(pc.random(rows, initializer=7)).cast(pa.int64())
    step = -(-rows // 4)
    for at in range(0, rows, step):
        ids = order.slice(at, step)
        data = pa.table(
            {
                "id": ids,
                "k": pc.cast(pc.divide(ids, 1000), pa.int32()),
                "v": pc.random(len(ids), initializer=at),
                "s": pc.binary_join_element_wise("name-", pc.cast(ids, pa.string()), ""),
            },
            schema=schema,
        )
        with client.transaction() as tx:
            tx.insert(table, data)
    inserts = [p.as_py() for p in client.parts(table).column("path")]
    upserted = []
    for i in range(2):
        ids = pc.sort_indices(pc.random(rows, initializer=100 + i)).cast(pa.int64()).slice(0, rows // 20)
        upserted.append(ids)
        with client.transaction() as tx:
            if whole:
                k = pc.cast(pc.divide(ids, 1000), pa.int32())
                s = pc.binary_join_element_wise("name-", pc.cast(ids, pa.string()), "")
                data = pa.table({"id": ids, "k": k, "v": pc.random(len(ids), initializer=i), "s": s}, schema=schema)
                tx.upsert(table, data)
            else:
                tx.upsert(table, pa.table({"id": ids, "v": pc.random(len(ids), initializer=i)}), update=True)
    folded = client.read(table)
    if floor:  # the upserted keys' folded values (UPDATEs of v alone: k and s are the inserts')
        keys = pc.unique(pa.chunked_array(upserted))
        mask = pc.is_in(folded.column("id"), value_set=keys)
        small = folded.filter(mask).select(["id", "v"]).rename_columns(["id", "_folded_v"])
        pq.write_table(small, work / "floor_small.parquet")
        root = os.path.abspath(client.storage.url)
        direct = ["file://" + os.path.join(root, *p.split("/")) for p in inserts]
    path = work / f"folded_{rows}"
    path.mkdir()
    for i, piece in enumerate(range(0, folded.num_rows, -(-folded.num_rows // 4))):
        pq.write_table(folded.slice(piece, -(-folded.num_rows // 4)), path / f"{i}.parquet", compression="zstd")
    del folded
    noop = lambda df: df.write.format("noop").mode("overwrite").save()  # noqa: E731

    def floor_read():
        from pyspark.sql import functions as F

        small_side = F.broadcast(session.read.parquet("file://" + str(work / "floor_small.parquet")))
        return (
            session.read.parquet(*direct)
            .join(small_side, on="id", how="left_outer")
            .selectExpr("id", "k", "coalesce(_folded_v, v) AS v", "s")
        )

    cases = {
        "read_table": lambda: mergetxn_spark.read_table(session, table),
        "parquet": lambda: session.read.parquet(str(path)),
        **({"floor": floor_read} if floor else {}),
        **({"data_source": lambda: session.read.format("mergetxn").load(table)} if data_source else {}),
    }
    if floor:
        want = session.read.parquet(str(path))
        assert floor_read().exceptAll(want).count() == 0 and want.exceptAll(floor_read()).count() == 0
    for name in ("read_table", "parquet", "floor"):  # warm-up
        if name in cases:
            noop(cases[name]())
    jvm = session.sparkContext._jvm
    codegen = jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    split: dict[str, list[dict]] = {k: [] for k in cases}
    for _ in range(repeat):
        for name, make in cases.items():
            one = split_cpu(lambda: noop(make()), roots, roots[1], codegen)  # noqa: B023 - called at once
            split[name].append(one)
            runs[name].append((one["wall"], one["cpu"]))
    assert mergetxn_spark.read_table(session, table).count() == rows
    runs = {k: v for k, v in runs.items() if v}
    wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
    out = {
        "wall": {k: round(v, 3) for k, v in wall.items()},
        "cpu": {k: round(v, 3) for k, v in cpu.items()},
        "read_table_ratio": round(wall["read_table"] / wall["parquet"], 3),
        "read_table_cpu_ratio": round(cpu["read_table"] / cpu["parquet"], 3),
        "data_source_ratio": round(wall["data_source"] / wall["parquet"], 3) if data_source else None,
        "floor_cpu_ratio": round(cpu["floor"] / cpu["parquet"], 3) if floor else None,
        "parts": client.parts(table).filter(pc.field("visible")).num_rows,
        "load_average": os.getloadavg(),
        "runs": runs,
        "split": split,
    }
    for name, rounds in split.items():
        for k in ("jit", "task", "gc", "other", "driver", "replica"):
            out.setdefault("cpu_" + k, {})[name] = round(statistics.median(r[k] for r in rounds), 3)
    print(
        f"keys table {rows:,} keys: read_table {wall['read_table']:.2f}s, parquet of the folded rows "
        f"{wall['parquet']:.2f}s ({out['read_table_ratio']:.2f}x, CPU {out['read_table_cpu_ratio']:.2f}x), "
        f"data source {wall.get('data_source', 0):.2f}s ({out['data_source_ratio']}x), "
        f"floor CPU {out['floor_cpu_ratio']}x",
        flush=True,
    )
    for name, rounds in split.items():
        print(f"  {name}: " + "; ".join(json.dumps(r) for r in rounds), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1000000,5000000")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--keys-rows", type=int, default=0, help="keys of the keys-table case (0: skip it)")
    p.add_argument("--only-keys", action="store_true", help="run the keys-table case alone")
    p.add_argument(
        "--keys-whole-upserts",
        action="store_true",
        help="the keys case's upserts write whole rows in overwrite mode (read by deletion vectors)",
    )
    p.add_argument("--keys-no-data-source", action="store_true", help="keys case: skip the data source rounds")
    p.add_argument("--keys-floor", action="store_true", help="keys case: add the floor's rounds (module docstring)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "spark_io.json"))
    a = p.parse_args()
    sizes = [] if a.only_keys else [int(x) for x in a.rows.split(",") if x]

    import pyarrow as pa
    from pyspark.sql import SparkSession

    import coordinator
    import spark as mergetxn_spark

    work = Path(tempfile.mkdtemp(prefix="mergetxn-spark-bench-"))
    results: dict = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "master": a.master},
        "sizes": {},
    }
    try:
        with coordinator.LocalCluster(work / "cluster", replicas=1) as cluster:
            client = cluster.client(0)
            replica = cluster.replica_addresses[0]
            session = (
                SparkSession.builder.master(a.master)
                .appName("mergetxn-spark-io")
                .config("spark.ui.enabled", "false")
                .config("spark.driver.memory", "2g")
                .config("spark.pyspark.python", sys.executable)
                .config("spark.sql.shuffle.partitions", "2")
                .getOrCreate()
            )
            session.sparkContext.setLogLevel("ERROR")
            mergetxn_spark.register(session, replica=replica)
            session.dataSource.register(plain_source("id bigint, k int, v double, s string"))
            import pyspark

            results["machine"]["spark"] = pyspark.__version__
            roots = [
                os.getpid(),  # the driver: write_table adopts the files here
                session.sparkContext._jvm.java.lang.ProcessHandle.current().pid(),
                cluster.replica_pid(0),
            ]
            schema = pa.schema([("id", pa.int64()), ("k", pa.int32()), ("v", pa.float64()), ("s", pa.string())])
            for rows in sizes:
                table = f"bench_{rows}"
                client.create_table(table, schema)
                path = str(work / f"parquet_{rows}")
                plain = str(work / f"plainpq_{rows}")
                df = frame(session, rows)
                # Warm-up (JIT, Python workers, imports) at a small size, not measured.
                frame(session, 10_000).write.format("mergetxn").mode("overwrite").save(table)
                frame(session, 10_000).write.mode("overwrite").parquet(path)
                session.read.format("mergetxn").load(table).write.format("noop").mode("overwrite").save()
                native_table = f"native_{rows}"
                client.create_table(native_table, schema)
                mergetxn_spark.write_table(frame(session, 10_000), native_table, mode="overwrite")
                mergetxn_spark.read_table(session, native_table).write.format("noop").mode("overwrite").save()
                session.read.parquet(path).write.format("noop").mode("overwrite").save()
                frame(session, 10_000).write.format("plainpq").mode("overwrite").save(plain)
                session.read.format("plainpq").load(plain).write.format("noop").mode("overwrite").save()
                runs: dict[str, list[tuple[float, float]]] = {
                    k: []
                    for k in (
                        "write_mergetxn",
                        "write_native",
                        "write_parquet",
                        "write_plainpq",
                        "read_mergetxn",
                        "read_native",
                        "read_parquet",
                        "read_plainpq",
                    )
                }
                for _ in range(a.repeat):
                    runs["write_mergetxn"].append(
                        timed(lambda: df.write.format("mergetxn").mode("overwrite").save(table), roots)
                    )
                    runs["write_parquet"].append(timed(lambda: df.write.mode("overwrite").parquet(path), roots))
                    runs["write_native"].append(
                        timed(lambda: mergetxn_spark.write_table(df, native_table, mode="overwrite"), roots)
                    )
                    runs["write_plainpq"].append(
                        timed(lambda: df.write.format("plainpq").mode("overwrite").save(plain), roots)
                    )
                    runs["read_mergetxn"].append(
                        timed(
                            lambda: (
                                session.read.format("mergetxn")
                                .load(table)
                                .write.format("noop")
                                .mode("overwrite")
                                .save()
                            ),
                            roots,
                        )
                    )
                    runs["read_parquet"].append(
                        timed(lambda: session.read.parquet(path).write.format("noop").mode("overwrite").save(), roots)
                    )
                    runs["read_native"].append(
                        timed(
                            lambda: (
                                mergetxn_spark.read_table(session, native_table)
                                .write.format("noop")
                                .mode("overwrite")
                                .save()
                            ),
                            roots,
                        )
                    )
                    runs["read_plainpq"].append(
                        timed(
                            lambda: (
                                session.read.format("plainpq").load(plain).write.format("noop").mode("overwrite").save()
                            ),
                            roots,
                        )
                    )
                assert client.read(table, columns=["id"]).num_rows == rows
                assert session.read.format("mergetxn").load(table).count() == rows
                assert mergetxn_spark.read_table(session, native_table).count() == rows
                assert client.read(native_table, columns=["id"]).num_rows == rows
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
                    "native_write_ratio": round(wall["write_native"] / wall["write_parquet"], 3),
                    "native_read_ratio": round(wall["read_native"] / wall["read_parquet"], 3),
                    "native_write_cpu_ratio": round(cpu["write_native"] / cpu["write_parquet"], 3),
                    "native_read_cpu_ratio": round(cpu["read_native"] / cpu["read_parquet"], 3),
                    "write_vs_plainpq": round(wall["write_mergetxn"] / wall["write_plainpq"], 3),
                    "read_vs_plainpq": round(wall["read_mergetxn"] / wall["read_plainpq"], 3),
                    "runs": runs,
                    "parts": parts,
                }
                print(
                    f"{rows:>9} rows: write {wall['write_mergetxn']:.2f}s vs {wall['write_parquet']:.2f}s "
                    f"({r['write_ratio']:.2f}x, CPU {r['write_cpu_ratio']:.2f}x; plainpq {wall['write_plainpq']:.2f}s), "
                    f"read {wall['read_mergetxn']:.2f}s vs {wall['read_parquet']:.2f}s ({r['read_ratio']:.2f}x, "
                    f"CPU {r['read_cpu_ratio']:.2f}x; plainpq {wall['read_plainpq']:.2f}s); native write "
                    f"{wall['write_native']:.2f}s ({r['native_write_ratio']:.2f}x), read {wall['read_native']:.2f}s "
                    f"({r['native_read_ratio']:.2f}x)",
                    flush=True,
                )
            if a.keys_rows:
                results["keys"] = keys_case(
                    session,
                    client,
                    work,
                    a.keys_rows,
                    a.repeat,
                    roots,
                    data_source=not a.keys_no_data_source,
                    floor=a.keys_floor and not a.keys_whole_upserts,
                    whole=a.keys_whole_upserts,
                )
            session.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(
        "| rows | op | native (read_table/write_table) | mergetxn data source | parquet | "
        "plainpq (bare Python data source) | native / parquet | data source / parquet | data source / plainpq |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for rows, r in results["sizes"].items():
        w, c = r["wall"], r["cpu"]
        for op in ("write", "read"):
            print(
                f"| {int(rows):,} | {op} | {w[op + '_native']:.2f}s ({c[op + '_native']:.1f} cpu-s) | "
                f"{w[op + '_mergetxn']:.2f}s ({c[op + '_mergetxn']:.1f} cpu-s) | "
                f"{w[op + '_parquet']:.2f}s ({c[op + '_parquet']:.1f}) | "
                f"{w[op + '_plainpq']:.2f}s ({c[op + '_plainpq']:.1f}) | "
                f"{r['native_' + op + '_ratio']:.2f}x (CPU {r['native_' + op + '_cpu_ratio']:.2f}x) | "
                f"{r[op + '_ratio']:.2f}x (CPU {r[op + '_cpu_ratio']:.2f}x) | {r[op + '_vs_plainpq']:.2f}x |"
            )
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
