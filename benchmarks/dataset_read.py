#!/usr/bin/env python
r"""DuckDB reading a table through ``client.dataset`` against DuckDB reading the same Parquet
files directly (target: at most 1.2x).

One 1-replica LocalCluster; a ``parts`` table of ``--rows`` rows (default 10,000,000) in
``--days`` date partitions (default 20), loaded in ``--loads`` inserts (default 10) whose rows
span every day, so each insert adds one part per day (200 parts of 50,000 rows by default).
Columns: ``day`` (date32, the partition column), ``id`` (int64), ``n`` (int64), ``x`` (float64),
``s`` (a short string).

Cases, each timed ``--rounds`` times (median reported; the order alternates per round):

- **all**: ``SELECT day, count(*), sum(n), avg(x), max(s) ... GROUP BY day`` over every row.
- **one day**: the same with ``WHERE day = <the middle day>``; the fragments (parts) the dataset
  selects for that filter are reported beside the total.

``dataset`` times ``with client.dataset(t) as ds: con.register(...); con.sql(...).fetchall()``
whole (the ``visible`` call and lease, the size checks, DuckDB's scan through Arrow); ``view``
the same with ``parts.io.dataset.duckdb_view(con, "v", ds)`` instead of ``register`` (DuckDB's own
Parquet reader over the dataset's files);
``dataset query`` the SQL alone on a dataset already open; ``direct`` times
``read_parquet([...the part files...])`` with the same SQL (its file list given, as a reader that
already knows the paths would: no listing). Wall seconds and this process's CPU seconds (DuckDB
and Arrow run their threads in it).

``--only inlined``: reading rows held as inlined parts (small writes,
docs/architecture/small-writes.md) against the same rows in one part file (target: at most
1.2x). ``--inlined-rows`` rows (default 100,000) inserted ``--inlined-per-insert`` at a time
(default 10: 10,000 ``client.insert`` calls, each an inlined part; the replica's merge round and
its flushes are off, and the parts are checked to be inlined before anything is timed) into one
table, and in one insert (a part file) into another of the same columns; each read ``--rounds``
times, the order alternating per round: ``client.read(t)`` and
``client.dataset(t).to_table()``. Wall seconds and this process's CPU seconds (the replica's
work, answering ``visible`` with every inlined part's bytes, is in the wall time only).
Written under the key ``inlined`` of ``--out``, with the machine and the commit; ``--only``
keeps the other keys of an existing ``--out`` (``--only duckdb``: the cases above alone).

    .venv/bin/python benchmarks/dataset_read.py [--rows 10000000] [--days 20] [--loads 10] [--rounds 5] \
        [--threads N] [--only duckdb|inlined] [--inlined-rows 100000] [--inlined-per-insert 10] \
        [--out benchmarks/results/dataset_read.json]

Scratch data lives in a temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import commit_throughput as ct  # noqa: E402
import duckdb  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from parts.io.dataset import duckdb_view  # noqa: E402

# Benchmarks load one partition of a table without merges with thousands of parts: the
# replicas they start take no backpressure (docs/rules.md, "Too many parts"), or they would
# measure its delays and refusals instead of the path they are about.
os.environ.setdefault("MERGETXN_PARTS_TO_DELAY_INSERT", "0")
os.environ.setdefault("MERGETXN_PARTS_TO_THROW_INSERT", "0")

TABLE = "bench_events"
SCHEMA = pa.schema(
    [("day", pa.date32()), ("id", pa.int64()), ("n", pa.int64()), ("x", pa.float64()), ("s", pa.string())]
)
FIRST_DAY = dt.date(2024, 1, 1)
# --only inlined: the two tables, and the replica's flushes of inlined parts kept off (its merge
# round is off too: merge_interval 0), so every small insert stays an inlined part.
INLINED_TABLE, FILE_TABLE = "bench_inlined", "bench_one_file"
NO_FLUSH = {"inline_flush_parts": 1000, "inline_flush_bytes": 64 * 1024 * 1024, "inline_flush_seconds": 86400.0}
AGG = "SELECT day, count(*) AS rows_, sum(n) AS n, avg(x) AS x, max(s) AS s FROM {src}{where} GROUP BY day ORDER BY day"


def chunk(start: int, rows: int, days: int) -> pa.Table:
    """``rows`` rows from id ``start``, their days round-robin over ``days`` days."""
    ids = pa.array(range(start, start + rows), pa.int64())
    day_index = pc.remainder(ids, days).cast(pa.int32())
    first = (FIRST_DAY - dt.date(1970, 1, 1)).days
    day = pc.add(day_index, pa.scalar(first, pa.int32())).view(pa.date32())
    n = pc.remainder(pc.multiply(ids, 7), 1000)
    x = pc.divide(ids.cast(pa.float64()), 3.0)
    s = pc.binary_join_element_wise("s", pc.remainder(ids, 997).cast(pa.string()), "")
    return pa.table([day, ids, n, x, s], schema=SCHEMA)


def rounded(rows: list) -> list:
    """Result rows with the average rounded (summation order differs between scans)."""
    return [(day, count, n, round(x, 6), s) for day, count, n, x, s in rows]


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def medians(runs: list[tuple[float, float]]) -> dict[str, Any]:
    """Median wall and CPU seconds of ``runs`` ((wall, cpu) each), and every wall."""
    return {
        "wall_s": statistics.median(w for w, _ in runs),
        "cpu_s": statistics.median(c for _, c in runs),
        "walls": [round(w, 4) for w, _ in runs],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--days", type=int, default=20)
    ap.add_argument("--loads", type=int, default=10, help="inserts the rows are loaded in (parts = loads x days)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: DuckDB's)")
    ap.add_argument("--only", choices=["duckdb", "inlined"], default=None, help="one group of cases (default: both)")
    ap.add_argument("--inlined-rows", type=int, default=100_000, help="--only inlined: rows in each table")
    ap.add_argument("--inlined-per-insert", type=int, default=10, help="--only inlined: rows per small insert")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    from mergetxn.local.cluster import LocalCluster

    results: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="mergetxn-dsbench-") as work,
        LocalCluster(Path(work) / "cluster", replicas=1, settings={"merge_interval": 0, **NO_FLUSH}) as cluster,
    ):
        client = cluster.client(0)
        if a.only != "inlined":
            results.update(duckdb_cases(client, a))
        if a.only != "duckdb":
            results["inlined"] = inlined_case(client, a)
        client.close()
    print(json.dumps(results, indent=2))
    if a.out:
        out = Path(a.out)
        kept = json.loads(out.read_text()) if a.only and out.exists() else {}
        out.write_text(json.dumps({**kept, **results}, indent=2) + "\n")
    return 0


def duckdb_cases(client: Any, a: argparse.Namespace) -> dict[str, Any]:
    """DuckDB through ``client.dataset`` against ``read_parquet`` of the same files (the cases
    of the docstring's first part)."""
    results: dict[str, Any] = {
        "rows": a.rows,
        "days": a.days,
        "loads": a.loads,
        "rounds": a.rounds,
        "threads": a.threads,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "duckdb": duckdb.__version__,
        "pyarrow": pa.__version__,
    }
    # its parts are files whatever --rows says (DuckDB reads them directly too)
    client.create_table(TABLE, SCHEMA, partition_by=["day"], auto_merge=False, inline_rows=0)
    per_load = -(-a.rows // a.loads)
    t0 = time.perf_counter()
    for start in range(0, a.rows, per_load):
        with client.transaction() as tx:
            tx.insert(TABLE, chunk(start, min(per_load, a.rows - start), a.days))
    log(f"loaded {a.rows:,} rows in {time.perf_counter() - t0:.1f} s")

    mid = FIRST_DAY + dt.timedelta(days=a.days // 2)
    with client.dataset(TABLE) as d:
        paths = list(d.files)
        selected = len(list(d.get_fragments(filter=pc.field("day") == mid)))
    results.update(parts=len(paths), parts_selected_one_day=selected)
    log(f"{len(paths)} parts; the filter day = {mid} selects {selected} fragments")
    con = duckdb.connect()
    if a.threads:
        con.execute(f"SET threads = {a.threads}")
    direct_src = "read_parquet([" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "])"
    cases = {"all": "", "one day": f" WHERE day = DATE '{mid.isoformat()}'"}
    for name, where in cases.items():
        results[name] = duckdb_case(client, con, direct_src, name, where, a.rounds)
    return results


def duckdb_case(client: Any, con: Any, direct_src: str, name: str, where: str, rounds: int) -> dict[str, Any]:
    """One query (``where``) through a dataset, a dataset held open, ``duckdb_view`` and
    ``read_parquet`` of the files (``direct_src``), ``rounds`` times each."""

    def through_dataset(where: str) -> list:
        with client.dataset(TABLE) as ds_:
            con.register("t", ds_)
            try:
                return con.sql(AGG.format(src="t", where=where)).fetchall()
            finally:
                con.unregister("t")

    def through_view(where: str) -> list:
        with client.dataset(TABLE) as ds_:
            duckdb_view(con, "v", ds_)
            return con.sql(AGG.format(src="v", where=where)).fetchall()

    def direct(where: str) -> list:
        return con.sql(AGG.format(src=direct_src, where=where)).fetchall()

    expected = rounded(direct(where))  # the reads agree (and are warmed up)
    assert rounded(through_dataset(where)) == expected == rounded(through_view(where)), name
    runs: dict[str, list[tuple[float, float]]] = {"dataset": [], "dataset query": [], "view": [], "direct": []}
    ways = {"dataset": through_dataset, "view": through_view, "direct": direct}
    with client.dataset(TABLE) as held:
        con.register("held", held)
        for r in range(rounds):
            order = ["dataset", "view", "direct"] if r % 2 == 0 else ["direct", "view", "dataset"]
            for kind in order:
                runs[kind].append(timed(lambda k=kind, w=where: ways[k](w))[:2])
            runs["dataset query"].append(timed(lambda w=where: con.sql(AGG.format(src="held", where=w)).fetchall())[:2])
        con.unregister("held")
    summary = {k: medians(v) for k, v in runs.items()}
    base = summary["direct"]["wall_s"]
    summary["ratio"] = summary["dataset"]["wall_s"] / base
    summary["ratio_query"] = summary["dataset query"]["wall_s"] / base
    summary["ratio_cpu"] = summary["dataset"]["cpu_s"] / summary["direct"]["cpu_s"]
    summary["ratio_view"] = summary["view"]["wall_s"] / base
    summary["ratio_view_cpu"] = summary["view"]["cpu_s"] / summary["direct"]["cpu_s"]
    log(
        f"{name}: dataset {summary['dataset']['wall_s']:.3f} s, query alone "
        f"{summary['dataset query']['wall_s']:.3f} s, direct {base:.3f} s: "
        f"{summary['ratio']:.2f}x ({summary['ratio_query']:.2f}x query alone, CPU {summary['ratio_cpu']:.2f}x); "
        f"duckdb_view {summary['view']['wall_s']:.3f} s: {summary['ratio_view']:.2f}x (CPU {summary['ratio_view_cpu']:.2f}x)"
    )
    return summary


def inlined_case(client: Any, a: argparse.Namespace) -> dict[str, Any]:
    """``--only inlined``: the same rows read from inlined parts and from one part file."""
    rows, per = a.inlined_rows, a.inlined_per_insert
    client.create_table(INLINED_TABLE, SCHEMA, auto_merge=False)
    client.create_table(FILE_TABLE, SCHEMA, auto_merge=False, inline_rows=0)
    t0 = time.perf_counter()
    for start in range(0, rows, per):
        client.insert(INLINED_TABLE, chunk(start, min(per, rows - start), a.days))
    load_s = time.perf_counter() - t0
    client.insert(FILE_TABLE, chunk(0, rows, a.days))
    parts = {t: [p for p in client.parts(t).to_pylist() if p["visible"]] for t in (INLINED_TABLE, FILE_TABLE)}
    inserts = -(-rows // per)
    assert len(parts[INLINED_TABLE]) == inserts and all(p["inlined"] for p in parts[INLINED_TABLE]), "not all inlined"
    assert [p["inlined"] for p in parts[FILE_TABLE]] == [False], parts[FILE_TABLE]
    log(f"{inserts:,} inserts of {per} rows in {load_s:.1f} s ({inserts / load_s:.0f}/s), all inlined; one part file")

    def through_dataset(table: str) -> pa.Table:
        with client.dataset(table) as ds_:
            return ds_.to_table()

    ways: dict[str, Callable[[str], pa.Table]] = {"read": client.read, "dataset": through_dataset}
    results: dict[str, Any] = {
        "rows": rows,
        "rows_per_insert": per,
        "inlined_parts": inserts,
        "rounds": a.rounds,
        "load_s": round(load_s, 2),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "commit": ct.code_commit(ROOT),
        "machine": ct.machine(),
    }
    # The first read of each table, before any (the client decodes an inlined part once per process
    # and keeps it while its bytes are the same: parts.io.format.read_inlined); the medians below
    # are of the reads after it.
    results["first_read_s"] = {"inlined": timed(lambda: client.read(INLINED_TABLE))[0]}
    results["first_read_s"]["file"] = timed(lambda: client.read(FILE_TABLE))[0]
    for way, read in ways.items():
        expected = read(FILE_TABLE).sort_by("id")  # the reads agree (and are warmed up)
        assert read(INLINED_TABLE).sort_by("id").equals(expected), way
        runs: dict[str, list[tuple[float, float]]] = {"inlined": [], "file": []}
        for r in range(a.rounds):
            order = [("inlined", INLINED_TABLE), ("file", FILE_TABLE)]
            for kind, table in order if r % 2 == 0 else order[::-1]:
                runs[kind].append(timed(lambda t=table: read(t))[:2])
        summary: dict[str, Any] = {k: medians(v) for k, v in runs.items()}
        summary["ratio"] = summary["inlined"]["wall_s"] / summary["file"]["wall_s"]
        summary["ratio_cpu"] = summary["inlined"]["cpu_s"] / summary["file"]["cpu_s"]
        results[way] = summary
        log(
            f"inlined, {way}: {summary['inlined']['wall_s']:.3f} s from {inserts:,} inlined parts, "
            f"{summary['file']['wall_s']:.3f} s from one file: {summary['ratio']:.2f}x (CPU {summary['ratio_cpu']:.2f}x)"
        )
    return results


if __name__ == "__main__":
    raise SystemExit(main())
