#!/usr/bin/env python
"""Keys tables: commit throughput of key upserts, point lookups, and the cost of the
key conflict check, all in one run on one 1-replica LocalCluster.

(a) **Upserts**: 4 writer processes, each transaction ``tx.upsert`` of 10 random keys of a
    keys table that holds ``--keys`` keys (1M), the same in update mode (``update=True``,
    ``k`` and ``v`` written, ``s`` kept: read at write time), against the same 10-row appends
    (``tx.insert``) into a ``parts`` table (in the order upsert, update, parts, parts, update,
    upsert, half the time each, averaged: the first turn after the load runs slower, whichever
    table it is), and against delta-rs ``DeltaTable.merge`` of the
    same 10 rows (``k`` matched: update all, else insert) into a Delta table of the same keys in
    the same layout (about ``--parts`` files). Commits/s, latency, share of conflicts (a
    transaction that lost is retried with new keys; delta-rs commit conflicts likewise).
(b) **Point lookup**: ``client.read(t, where=pc.field("k") == key)`` of a random key at the
    latest snapshot of the keys table (``--keys`` keys over ``--parts`` parts, random keys per
    part, so the key range prunes nothing and the Bloom filters do the work); p50/p90 and the
    parts read per lookup. The keys table has auto-merge off (as the ``parts`` table of (a) and
    the tables of (d)): the lookups see the ``--parts`` parts the load made (a point read "over
    1,000 parts"), and no merge runs beside them, whose CPU the replica's figure per lookup
    otherwise took in (up to 9 of 10 ms per lookup, measured).
(c) **Key conflict check**: the commit latency of a 10-key upsert whose snapshot is N commits
    (10-key upserts of other keys, interleaved with its own: odd keys against even ones) old, N
    in 10, 100, 1,000, against a control begun after those commits (nothing to check); the
    difference is what checking the N commits costs.
(d) **Whole-table read and major compaction**: a keys table of ``--read-keys`` keys
    (1M) loaded in 100 upserts, then 20 upserts each rewriting 1% of the keys (auto-merge off,
    so a read folds every version), against a ``parts`` table of the same rows in 100 inserts:
    ``client.read`` of each (21 rounds alternated: the ratio of the medians, and of the bests),
    then ``client.compact(kind="major")`` of the keys table (versions folded per second) and the
    read after it.

    .venv/bin/python benchmarks/keys_bench.py [--quick] [--seconds 10] [--out benchmarks/results/keys_bench.json]
    .venv/bin/python benchmarks/keys_bench.py --only read [--read-keys 1000000]   # (d) alone
    .venv/bin/python benchmarks/keys_bench.py --only lookup [--keys 1000000 --parts 1000]   # (b) alone
    .venv/bin/python benchmarks/keys_bench.py --only upsert --out f.json   # (b), (a) without deltalake, (c)

``MERGETXN_CODE=<checkout>`` runs another checkout's code (client and replicas) with this script:
old and new measured side by side on the same machine.

Scratch data lives in a temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(os.environ.get("MERGETXN_CODE") or Path(__file__).resolve().parent.parent)
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import commit_throughput as ct  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

KEYS_TABLE, PARTS_TABLE = "kv", "appends"
SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.int64()), pa.field("s", pa.string())])


def rows(ks: list[int], v: int) -> pa.Table:
    """The rows every system writes: key, a value, a short string."""
    return pa.table(
        {
            "k": pa.array(ks, pa.int64()),
            "v": pa.array([v] * len(ks), pa.int64()),
            "s": pa.array([f"s{k % 1000}" for k in ks], pa.string()),
        },
        schema=SCHEMA,
    )


# ------------------------------------------------------------------------------------------
# (a) writers, one process each


def _op(kind: str, params: dict, idx: int) -> Callable[[], int]:
    rng = random.Random(idx)
    n = params["keys"]
    if kind == "deltalake_merge":
        from deltalake import DeltaTable

        path = params["path"]

        def merge() -> int:
            for attempt in range(1000):
                data = rows(rng.sample(range(n), 10), idx)
                try:
                    (
                        DeltaTable(path)
                        .merge(data, "t.k = s.k", source_alias="s", target_alias="t")
                        .when_matched_update_all()
                        .when_not_matched_insert_all()
                        .execute()
                    )
                    return attempt
                except Exception as exc:  # CommitFailedError and friends on concurrent merges
                    if attempt == 999 or not any(w in repr(exc) for w in ("onflict", "ommit", "ersion")):
                        raise
            return 0

        return merge

    from coordinator.errors import ConflictError
    from mergetxn.client import Client

    client = Client(params["address"])
    table = params["table"]

    def write() -> int:
        for attempt in range(1000):
            data = rows(rng.sample(range(n), 10), idx)
            try:
                with client.transaction() as tx:
                    if kind == "keys_update":  # update mode: ``s`` kept (read at write time)
                        tx.upsert(table, data.select(["k", "v"]), update=True)
                    else:
                        (tx.upsert if kind == "keys_upsert" else tx.insert)(table, data)
                return attempt
            except ConflictError:
                if attempt == 999:
                    raise
        return 0

    return write


def _worker(kind: str, params: dict, idx: int, ready: Any, go: Any, times: Any, results: Any) -> None:
    try:
        op = _op(kind, params, idx)
    except BaseException as exc:
        ready.put((idx, repr(exc)))
        return
    ready.put((idx, None))
    go.wait()
    tally = ct.timed_loop(op, times[0], times[1])
    results.put(
        (
            idx,
            {
                "count": tally.count,
                "retries": tally.retries,
                "errors": tally.errors,
                "first_errors": tally.first_errors,
                "latencies": tally.latencies,
            },
        )
    )


def run_writers(kind: str, params: dict, writers: int, warmup: float, seconds: float) -> dict:
    """``writers`` processes run ``kind`` for ``seconds`` after ``warmup``; summed."""
    ctx = mp.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    times = ctx.Array("d", 2)
    procs = [
        ctx.Process(target=_worker, args=(kind, params, i, ready, go, times, results), daemon=True)
        for i in range(writers)
    ]
    for p in procs:
        p.start()
    try:
        for _ in range(writers):
            idx, err = ready.get(timeout=300)
            if err is not None:
                raise RuntimeError(f"{kind} writer {idx} failed to set up: {err}")
        now = time.time()
        times[0], times[1] = now + warmup, now + warmup + seconds
        go.set()
        got = [results.get(timeout=warmup + seconds + 600)[1] for _ in range(writers)]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    total = ct.Tally()
    for g in got:
        total.count += g["count"]
        total.retries += g["retries"]
        total.errors += g["errors"]
        total.first_errors += g["first_errors"][: 3 - len(total.first_errors)]
        total.latencies += g["latencies"]
    out = ct.summarize(total, seconds, writers=writers)
    out["conflict_share"] = round(total.retries / max(1, total.count + total.retries), 4)
    return out


# ------------------------------------------------------------------------------------------
# Setup


def process_cpu(pid: int | None) -> float:
    """Seconds of CPU (user + system) a process has used so far (0 when unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, TypeError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_keys(client: Any, n: int, parts: int, log: Callable[[str], None]) -> list[int]:
    """``n`` keys in ``parts`` transactions of ``n / parts`` random keys each (a permutation)."""
    # txn_max_seconds: case (c)'s old transaction stays open while 1,000 commits run (over 60 s,
    # the default, on a loaded machine: a run lost it so).
    client.create_table(
        KEYS_TABLE, SCHEMA, primary_key=("k",), conflict_policy="keys", txn_max_seconds=3600, auto_merge=False
    )
    order = list(range(n))
    random.Random(0).shuffle(order)
    per = n // parts
    t0 = time.time()
    for i in range(parts):
        with client.transaction() as tx:
            tx.upsert(KEYS_TABLE, rows(order[i * per : (i + 1) * per], 0))
    log(f"  loaded {n:,} keys in {parts:,} commits ({time.time() - t0:.1f} s)")
    return order


def load_delta(path: Path, order: list[int], parts: int, log: Callable[[str], None]) -> dict:
    """The same keys in the same layout: one commit of ``parts`` files of random keys."""
    from deltalake import DeltaTable, write_deltalake

    per = len(order) // parts
    batches = [rows(order[i * per : (i + 1) * per], 0) for i in range(parts)]
    t0 = time.time()
    write_deltalake(
        str(path),
        pa.concat_tables(batches),
        mode="append",
        target_file_size=max(1, sum(b.nbytes for b in batches) // parts),
    )
    files = len(DeltaTable(str(path)).file_uris())
    log(f"  delta table: {len(order):,} keys in {files:,} files ({time.time() - t0:.1f} s)")
    return {"files": files}


# ------------------------------------------------------------------------------------------
# (b) point lookups


def bench_lookups(
    client: Any, n: int, lookups: int, log: Callable[[str], None], replica_pid: int | None = None
) -> dict:
    import mergetxn.client.keyreads as client_module  # where point reads read parts (read_part)

    real, reads = client_module.read_part, [0]

    def counting(*a: Any, **kw: Any) -> Any:
        reads[0] += 1
        return real(*a, **kw)

    client_module.read_part = counting
    rng = random.Random(1)
    times, per = [], []
    cpu0, rcpu0 = time.process_time(), process_cpu(replica_pid)
    try:
        for _ in range(lookups):
            key = rng.randrange(n)
            reads[0] = 0
            t0 = time.perf_counter()
            got = client.read(KEYS_TABLE, where=pc.field("k") == key)
            times.append(time.perf_counter() - t0)
            per.append(reads[0])
            assert got.num_rows == 1 and got.column("k")[0].as_py() == key, (key, got)
    finally:
        client_module.read_part = real
    cpu, rcpu = time.process_time() - cpu0, process_cpu(replica_pid) - rcpu0
    times.sort()
    out = {
        "lookups": lookups,
        "client_cpu_ms": round(cpu / lookups * 1000, 2),
        "replica_cpu_ms": round(rcpu / lookups * 1000, 2),
        "p50_ms": round(statistics.median(times) * 1000, 2),
        "p90_ms": round(times[int(0.9 * len(times))] * 1000, 2),
        "parts_read_mean": round(statistics.mean(per), 3),
        "parts_read_max": max(per),
    }
    log(
        f"  point lookup: p50 {out['p50_ms']} ms, p90 {out['p90_ms']} ms, "
        f"parts read {out['parts_read_mean']} (max {out['parts_read_max']}); CPU ms per lookup: client "
        f"{out['client_cpu_ms']}, replica {out['replica_cpu_ms']}"
    )
    return out


# ------------------------------------------------------------------------------------------
# (c) the key conflict check against N commits since the snapshot


def bench_conflict_check(
    client: Any, other: Any, n: int, counts: list[int], repeats: dict[int, int], log: Callable[[str], None]
) -> dict:
    """A transaction begins, ``N`` others commit 10-key upserts (random even keys), then it
    upserts 10 keys of its own (random odd keys: no conflict, and key ranges that overlap, so only
    the filters rule the others' parts out) and commits. Beside it, a control transaction begun
    after the ``N`` commits does the same (nothing to check), the two committed one after the
    other in alternating order: the difference of their commit latencies is what checking the
    ``N`` commits costs, whatever else the ``N`` commits left the replica busy with. Medians
    over ``repeats[N]`` rounds."""
    rng = random.Random(2)
    out: dict[str, Any] = {}

    def commit_timed(tx: Any) -> float:
        tx.upsert(KEYS_TABLE, rows(rng.sample(range(1, n, 2), 10), 2))
        t0 = time.perf_counter()
        tx.commit()
        return time.perf_counter() - t0

    for count in counts:
        old_lat, fresh_lat = [], []
        for r in range(repeats.get(count, 5)):
            old = client.begin()
            for _ in range(count):
                with other.transaction() as o:
                    o.upsert(KEYS_TABLE, rows(rng.sample(range(0, n, 2), 10), 1))
            fresh = client.begin()
            pair = [(old, old_lat), (fresh, fresh_lat)]
            for tx, lat in pair if r % 2 == 0 else pair[::-1]:
                lat.append(commit_timed(tx))
        row = {
            "commit_ms": round(statistics.median(old_lat) * 1000, 2),
            "control_commit_ms": round(statistics.median(fresh_lat) * 1000, 2),
            "rounds": len(old_lat),
        }
        row["check_ms"] = round(row["commit_ms"] - row["control_commit_ms"], 2)
        out[str(count)] = row
        log(
            f"  {count:>5} commits since the snapshot: commit {row['commit_ms']} ms, control "
            f"{row['control_commit_ms']} ms, check ~{row['check_ms']} ms (medians of {row['rounds']})"
        )
    return out


# ------------------------------------------------------------------------------------------
# (d) whole-table read of a keys table against a parts table; major compaction


READ_ROUNDS = 21  # whole reads of each table, alternated (case (d))


def _best(f: Callable[[], Any], rounds: int = 3) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = f()
        best = min(best, time.perf_counter() - t0)
    return best, out


def bench_whole_read(client: Any, n: int, log: Callable[[str], None]) -> dict:
    """The whole-read table: ``n`` keys in 100 upserts, 20 upserts of 1% of the keys each; the same
    ``n`` rows in a ``parts`` table in 100 inserts. Reads of both, major compaction, read after."""
    keys_t, parts_t = "kv_read", "parts_read"
    client.create_table(keys_t, SCHEMA, primary_key=("k",), conflict_policy="keys", auto_merge=False)
    client.create_table(parts_t, SCHEMA, conflict_policy="parts", auto_merge=False)
    rng = random.Random(3)
    order = list(range(n))
    rng.shuffle(order)
    per = n // 100
    t0 = time.time()
    for i in range(100):
        batch = order[i * per : (i + 1) * per]
        for table in (keys_t, parts_t):
            with client.transaction() as tx:
                (tx.upsert if table == keys_t else tx.insert)(table, rows(batch, 0))
    for r in range(20):
        with client.transaction() as tx:
            tx.upsert(keys_t, rows(sorted(rng.sample(range(n), n // 100)), r + 1))
    versions = n + 20 * (n // 100)
    log(f"  loaded {n:,} keys ({versions:,} versions in 120 commits) and {n:,} rows in 100 ({time.time() - t0:.1f} s)")
    out: dict[str, Any] = {"keys": n, "versions": versions}
    # The two reads alternated, READ_ROUNDS each: on a fast machine the parts read takes ~30 ms,
    # which a garbage collection or a scheduler tick moves by a third, so the ratio of the medians
    # is the steady figure; the best of each is kept beside it.
    times: dict[str, list[float]] = {keys_t: [], parts_t: []}
    for r in range(READ_ROUNDS):
        for table in (keys_t, parts_t) if r % 2 == 0 else (parts_t, keys_t):
            t0 = time.perf_counter()
            got = client.read(table)
            times[table].append(time.perf_counter() - t0)
            assert got.num_rows == n, (table, got.num_rows)
    out["keys_read_s"], out["parts_read_s"] = min(times[keys_t]), min(times[parts_t])
    out["keys_read_median_s"] = statistics.median(times[keys_t])
    out["parts_read_median_s"] = statistics.median(times[parts_t])
    out["keys_over_parts"] = round(out["keys_read_median_s"] / out["parts_read_median_s"], 2)
    out["keys_over_parts_best"] = round(out["keys_read_s"] / out["parts_read_s"], 2)
    out["read_rounds"] = READ_ROUNDS
    log(
        f"  whole read, median of {READ_ROUNDS} alternated: keys table {out['keys_read_median_s'] * 1e3:.1f} ms, "
        f"parts table {out['parts_read_median_s'] * 1e3:.1f} ms ({out['keys_over_parts']}x; best against best "
        f"{out['keys_read_s'] * 1e3:.1f} / {out['parts_read_s'] * 1e3:.1f} ms, {out['keys_over_parts_best']}x)"
    )
    out.update(_alternated_ratios(client, keys_t, parts_t, n, log))
    t0 = time.perf_counter()
    client.compact(keys_t, kind="major")
    out["major_compaction_s"] = round(time.perf_counter() - t0, 2)
    out["major_compaction_versions_per_s"] = round(versions / out["major_compaction_s"])
    out["keys_read_after_compaction_s"], got = _best(lambda: client.read(keys_t))
    assert got.num_rows == n, got.num_rows
    log(
        f"  major compaction: {out['major_compaction_s']:.2f} s ({out['major_compaction_versions_per_s']:,} "
        f"versions/s); read after it {out['keys_read_after_compaction_s']:.2f} s"
    )
    out["after_compaction"] = _alternated_ratios(client, keys_t, parts_t, n, log, only=("duckdb",))
    for k in (
        "keys_read_s",
        "parts_read_s",
        "keys_read_median_s",
        "parts_read_median_s",
        "keys_read_after_compaction_s",
    ):
        out[k] = round(out[k], 3)
    return out


DUCK_SQL = "SELECT count(*), sum(v), max(s) FROM v"


def _duckdb_query(client: Any, table: str) -> tuple:
    """``DUCK_SQL`` over ``client.dataset(table)`` through ``duckdb_view`` (a new connection)."""
    import duckdb

    from parts.io.dataset import duckdb_view

    with client.dataset(table) as d:
        con = duckdb.connect()
        duckdb_view(con, "v", d)
        return tuple(con.execute(DUCK_SQL).fetchone())


def _alternated_ratios(
    client: Any, keys_t: str, parts_t: str, n: int, log: Callable[[str], None], only: tuple[str, ...] = ()
) -> dict:
    """A filtered read (``s`` one of 10 of its 1,000 values: 1 % of the rows) and ``DUCK_SQL``
    through ``client.dataset`` and ``duckdb_view``, of each table (``only`` those cases when
    given), alternated ``READ_ROUNDS`` times: the ratio of the medians."""
    where = pc.field("s").isin([f"s{i}" for i in range(0, 1000, 100)])
    cases: dict[str, Callable[[str], Any]] = {
        "filtered_read": lambda t: client.read(t, where=where).num_rows,
        "duckdb": lambda t: _duckdb_query(client, t)[0],
    }
    out: dict[str, Any] = {}
    for case, run in cases.items():
        if only and case not in only:
            continue
        times: dict[str, list[float]] = {keys_t: [], parts_t: []}
        for r in range(READ_ROUNDS):
            for table in (keys_t, parts_t) if r % 2 == 0 else (parts_t, keys_t):
                t0 = time.perf_counter()
                got = run(table)
                times[table].append(time.perf_counter() - t0)
                assert got == (n if case == "duckdb" else n // 100), (case, table, got)
        keys_s, parts_s = statistics.median(times[keys_t]), statistics.median(times[parts_t])
        out[case] = {"keys_median_s": round(keys_s, 4), "parts_median_s": round(parts_s, 4)}
        out[case]["keys_over_parts"] = round(keys_s / parts_s, 2)
        log(
            f"  {case}, median of {READ_ROUNDS} alternated: keys table {keys_s * 1e3:.1f} ms, "
            f"parts table {parts_s * 1e3:.1f} ms ({out[case]['keys_over_parts']}x)"
        )
    return out


# ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: small tables, short cases")
    ap.add_argument("--keys", type=int, default=None, help="keys in the keys table (default 1,000,000)")
    ap.add_argument("--parts", type=int, default=None, help="parts (commits) it is loaded in (default 1,000)")
    ap.add_argument("--seconds", type=float, default=None, help="measured seconds per throughput case (10)")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--lookups", type=int, default=None)
    ap.add_argument("--skip-delta", action="store_true")
    ap.add_argument(
        "--only",
        choices=["read", "lookup", "upsert"],
        default=None,
        help="run one case alone: (d) the whole-table read and major compaction, (b) the point lookup, "
        "or (b), (a) without deltalake and (c) (upsert)",
    )
    ap.add_argument("--read-keys", type=int, default=None, help="keys of case (d)'s table (default 1,000,000)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    quick = a.quick
    n = a.keys or (20_000 if quick else 1_000_000)
    parts = a.parts or (50 if quick else 1_000)
    seconds = a.seconds or (2.0 if quick else 10.0)
    warmup = min(a.warmup, 0.5) if quick else a.warmup
    lookups = a.lookups or (20 if quick else 200)
    counts = [10, 100] if quick else [10, 100, 1000]
    repeats = {10: 5, 100: 2} if quick else {10: 20, 100: 8, 1000: 3}
    out_path = a.out or (
        None if quick or a.only else str(Path(__file__).resolve().parent / "results" / "keys_bench.json")
    )

    def log(msg: str) -> None:
        print(msg, flush=True)

    # Replicas start as ``python -m replicas.server``, which puts the working directory first on
    # their path: run from ROOT, or a MERGETXN_CODE run's replicas would import the code of the
    # directory it was started in (the client only would be ROOT's).
    out_path = None if out_path is None else str(Path(out_path).resolve())
    os.chdir(ROOT)
    import coordinator

    if not Path(coordinator.__file__).resolve().is_relative_to(ROOT.resolve()):
        # commit_throughput puts its own tree first on sys.path: MERGETXN_CODE must reach the client too
        raise SystemExit(f"keys_bench: the code imported is {coordinator.__file__}, not {ROOT}'s")
    from mergetxn.local.cluster import LocalCluster

    started = time.time()
    results: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="mergetxn-keys-") as work,
        LocalCluster(Path(work) / "cluster", replicas=1) as cluster,
    ):
        client, other = cluster.client(0), cluster.client(0)
        read_keys = a.read_keys or (20_000 if quick else 1_000_000)
        if a.only == "read":
            log(f"whole-table read, {read_keys:,} keys (code: {ROOT})")
            results["whole_read"] = bench_whole_read(client, read_keys, log)
            client.close()
            other.close()
            return _report(a, results, quick, n, parts, seconds, started, out_path, log)
        log(f"keys table of {n:,} keys over {parts:,} parts (code: {ROOT})")
        order = load_keys(client, n, parts, log)
        results["lookup"] = bench_lookups(client, n, lookups, log, cluster.replica_pid(0))
        if a.only == "lookup":
            client.close()
            other.close()
            return _report(a, results, quick, n, parts, seconds, started, out_path, log)
        client.create_table(PARTS_TABLE, SCHEMA, conflict_policy="parts", auto_merge=False)
        params = {"address": cluster.replica_addresses[0], "keys": n}
        log(f"throughput, {a.writers} writers, {seconds:g} s per table (two turns each)")
        # keys, parts, parts, keys (half the time each): whichever runs first after the load pays
        # for what the replica still does after it, so each side gets a first and a last turn.
        halves: dict[str, list[dict]] = {"keys_upsert": [], "keys_update": [], "parts_append": []}
        turns = ("keys_upsert", "keys_update", "parts_append", "parts_append", "keys_update", "keys_upsert")
        for kind in turns:
            table = PARTS_TABLE if kind == "parts_append" else KEYS_TABLE
            rcpu0 = process_cpu(cluster.replica_pid(0))
            r = run_writers(kind, {**params, "table": table}, a.writers, warmup, seconds / 2)
            # The replica's CPU over warmup and measured time, per commit at the measured rate.
            spent = process_cpu(cluster.replica_pid(0)) - rcpu0
            r["replica_cpu_ms_per_commit"] = round(
                spent * 1000 / max(1e-9, r["commits_per_s"] * (warmup + seconds / 2)), 2
            )
            halves[kind].append(r)
            log(
                f"  {kind}: {r['commits_per_s']} commits/s (p50 {r['p50_ms']} ms, conflicts {r['conflict_share']:.2%}, "
                f"replica CPU {r['replica_cpu_ms_per_commit']} ms/commit)"
            )
        for kind, runs in halves.items():
            results[kind] = {
                "commits_per_s": round(statistics.mean(r["commits_per_s"] for r in runs), 1),
                "p50_ms": round(statistics.mean(r["p50_ms"] for r in runs), 2),
                "conflict_share": round(statistics.mean(r["conflict_share"] for r in runs), 4),
                "replica_cpu_ms_per_commit": round(statistics.mean(r["replica_cpu_ms_per_commit"] for r in runs), 2),
                "halves": runs,
            }
        log(
            f"  keys upsert {results['keys_upsert']['commits_per_s']} commits/s, in update mode "
            f"{results['keys_update']['commits_per_s']}, parts append "
            f"{results['parts_append']['commits_per_s']} commits/s (means of both turns)"
        )
        if not a.skip_delta and a.only != "upsert":
            delta = Path(work) / "delta"
            results["delta_layout"] = load_delta(delta, order, parts, log)
            results["deltalake_merge"] = run_writers(
                "deltalake_merge", {**params, "path": str(delta)}, a.writers, warmup, seconds
            )
            log(
                f"  deltalake merge: {results['deltalake_merge']['commits_per_s']} commits/s "
                f"(p50 {results['deltalake_merge']['p50_ms']} ms, "
                f"conflicts {results['deltalake_merge']['conflict_share']:.2%})"
            )
        log("key conflict check")
        results["conflict_check"] = bench_conflict_check(client, other, n, counts, repeats, log)
        if a.only != "upsert":
            log(f"whole-table read, {read_keys:,} keys")
            results["whole_read"] = bench_whole_read(client, read_keys, log)
        client.close()
        other.close()

    def ratio(x: str, y: str) -> float | None:
        if x not in results or y not in results or not results[y]["commits_per_s"]:
            return None
        return round(results[x]["commits_per_s"] / results[y]["commits_per_s"], 2)

    slowdown = ratio("parts_append", "keys_upsert")
    over_delta = ratio("keys_upsert", "deltalake_merge")
    results["targets"] = {
        "parts_over_keys": slowdown,
        "keys_at_most_1_5x_slower": slowdown is not None and slowdown <= 1.5,
        "keys_over_deltalake_merge": over_delta,
        "at_least_10x_deltalake": None if over_delta is None else over_delta >= 10,
        "lookup_p50_under_20ms": results["lookup"]["p50_ms"] < 20,
    }
    log(f"targets: {results['targets']}")
    return _report(a, results, quick, n, parts, seconds, started, out_path, log)


def _report(
    a: Any,
    results: dict,
    quick: bool,
    n: int,
    parts: int,
    seconds: float,
    started: float,
    out_path: str | None,
    log: Callable[[str], None],
) -> int:
    report = {
        "benchmark": "keys_bench",
        "quick": quick,
        "keys": n,
        "parts": parts,
        "writers": a.writers,
        "seconds_per_case": seconds,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "wall_seconds": round(time.time() - started, 1),
        "machine": ct.machine(),
        "results": results,
    }
    if out_path:
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        Path(out_path).write_text(json.dumps(report, indent=2) + "\n")
        log(f"written to {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
