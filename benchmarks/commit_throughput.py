#!/usr/bin/env python
"""Commit throughput of small transactions, side by side in one run on one machine.

Measured (commits per second, fixed duration per case after a warm-up):

* raw ZooKeeper: synchronous sequential ``create`` (one create per round trip) from 1 thread, and
  from 16 threads sharing one kazoo client or each with its own; the best is reported as "raw".
  This is the physical limit of one commit = one ZooKeeper write here.
* mergetxn (LocalCluster on the same ZooKeeper server): 10-row insert transactions
  (``with client.transaction() as tx: tx.insert(t, ten_rows)``) with 1 and 4 concurrent writers,
  and the same rows by the one-call ``client.insert(t, ten_rows)``;
  metadata-only commits with 16 concurrent clients (see ``benchmarks/README.md`` for the exact
  definition); the same on a 3-replica cluster with writers spread over the replicas.
* deltalake (delta-rs ``write_deltalake(mode="append")``) and pyiceberg (``SqlCatalog`` on sqlite,
  ``table.append``) appending the same 10 rows, 1 and 4 writers on one table; conflicts are
  retried and only successful commits count.
* DuckLake (PyPI's duckdb with the duckdb-ext-ducklake/-postgres/-sqlite packages, whose extension
  files are loaded from the package: nothing is downloaded) appending the same 10 rows, 1 and 4
  writers on one table, with the catalog on a PostgreSQL server that the benchmark starts and stops
  itself (as the ``postgres`` user when run as root) and with the catalog in SQLite; data files on
  local disk, or the rows inlined in the catalog (``DATA_INLINING_ROW_LIMIT``).

Every writer is its own process (as independent jobs would be), so no writer waits on another's
GIL; raw ZooKeeper uses threads, as asked (kazoo pipelines requests of threads sharing a client).

    .venv/bin/python benchmarks/commit_throughput.py [--seconds N] [--out benchmarks/results/commit_throughput.json]
    .venv/bin/python benchmarks/commit_throughput.py --profile 2000   # where a commit spends its time
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import json
import multiprocessing as mp
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# MERGETXN_CODE=<checkout>: that checkout's code (another tree measured with this script; the
# scripts that import this module, keys_bench.py among them, take the same variable).
ROOT = Path(os.environ.get("MERGETXN_CODE") or Path(__file__).resolve().parent.parent)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402

# Benchmarks load one partition of a table without merges with thousands of parts: the
# replicas they start take no backpressure (docs/rules.md, "Too many parts"), or they would
# measure its delays and refusals instead of the path they are about.
os.environ.setdefault("MERGETXN_PARTS_TO_DELAY_INSERT", "0")
os.environ.setdefault("MERGETXN_PARTS_TO_THROW_INSERT", "0")

RAW_PAYLOAD = 512  # bytes per raw sequential create: about one small commit entry
TABLE = "bench"


LINKS_PER_WRITER_PER_S = 300


def ten_rows(seed: int = 0) -> pa.Table:
    """The 10 rows every system appends per commit."""
    base = seed * 10
    return pa.table(
        {
            "id": pa.array(range(base, base + 10), pa.int64()),
            "name": pa.array([f"row-{i}" for i in range(base, base + 10)], pa.string()),
            "value": pa.array([i * 0.5 for i in range(10)], pa.float64()),
        }
    )


# ------------------------------------------------------------------------------------------
# The timed loop, shared by every case


@dataclasses.dataclass
class Tally:
    count: int = 0
    retries: int = 0
    errors: int = 0
    first_errors: list[str] = dataclasses.field(default_factory=list)
    latencies: list[float] = dataclasses.field(default_factory=list)
    cpu: dict[str, float] = dataclasses.field(default_factory=dict)
    phases: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds per client phase


def timed_loop(op: Callable[[], int], warm_end: float, end: float) -> Tally:
    """Run ``op`` until ``end``; count the commits that finish in [warm_end, end].

    ``op`` returns how many times it had to retry (conflicts) before its commit succeeded.
    """
    t = Tally()
    while True:
        t0 = time.time()
        if t0 >= end:
            break
        try:
            retries = op()
        except Exception as exc:  # a failed commit: counted, never a success
            t.errors += 1
            if len(t.first_errors) < 3:
                t.first_errors.append(repr(exc)[:300])
            continue
        t1 = time.time()
        if warm_end <= t1 <= end:
            t.count += 1
            t.retries += retries
            t.latencies.append(t1 - t0)
    return t


# ------------------------------------------------------------------------------------------
# Writers (one process each)


PHASES: dict[str, float] = collections.defaultdict(float)  # filled by timed writers (profile mode)


def _op_mergetxn_insert(params: dict, idx: int) -> Callable[[], int]:
    from mergetxn.client import Client

    client = Client(params["addresses"][idx % len(params["addresses"])], credentials=params.get("credentials"))
    rows = ten_rows(idx)
    table = params["table"]

    def op() -> int:
        with client.transaction() as tx:
            tx.insert(table, rows)
        return 0

    if not params.get("phases"):
        return op

    # Profile mode: the same statements as tx.insert, timed phase by phase on the client.
    from coordinator.core.tabledata import conform
    from coordinator.model.records import Insert
    from parts.io.storage import Storage

    put = Storage.put

    def timed_put(self, relpath, data, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return put(self, relpath, data, *args, **kwargs)
        finally:
            kind = "Parquet file" if relpath.endswith(".parquet") else "sidecar"
            PHASES[f"client: storage.put of the {kind}"] += time.perf_counter() - t0

    Storage.put = timed_put

    def timed_op() -> int:
        c0, t0 = time.thread_time(), time.perf_counter()
        tx = client.begin()
        c1, t1 = time.thread_time(), time.perf_counter()
        tdef = client.table(table)
        parts = tx._write(tdef, conform(tdef.schema, rows, table))
        c2, t2 = time.thread_time(), time.perf_counter()
        tx._stage(Insert(table, tuple(parts)))
        c3, t3 = time.thread_time(), time.perf_counter()
        tx.commit()
        c4, t4 = time.thread_time(), time.perf_counter()
        PHASES["client: begin RPC"] += t1 - t0
        PHASES["client: conform + write part (Parquet + both puts)"] += t2 - t1
        PHASES["client: stage RPC"] += t3 - t2
        PHASES["client: commit RPC (group commit, multi, WAL fsync, apply)"] += t4 - t3
        PHASES["client: transaction total"] += t4 - t0
        for name, cpu in (("begin", c1 - c0), ("write", c2 - c1), ("stage", c3 - c2), ("commit", c4 - c3)):
            PHASES[f"client CPU (its thread): {name}"] += cpu
        return 0

    return timed_op


def _op_mergetxn_insert_call(params: dict, idx: int) -> Callable[[], int]:
    """The same 10-row insert as a transaction of its own in one call: ``client.insert(t, rows)``
    (the parts are written, then one round trip begins, stages and commits)."""
    from mergetxn.client import Client

    client = Client(params["addresses"][idx % len(params["addresses"])], credentials=params.get("credentials"))
    rows = ten_rows(idx)
    table = params["table"]

    def op() -> int:
        client.insert(table, rows)
        return 0

    if not params.get("phases"):
        return op

    from parts.io.format import write_part

    def timed_write_part(*args, **kwargs):
        c0, t0 = time.thread_time(), time.perf_counter()
        try:
            return write_part(*args, **kwargs)
        finally:
            PHASES["client: write part (Parquet + both puts)"] += time.perf_counter() - t0
            PHASES["client CPU (its thread): write"] += time.thread_time() - c0

    import parts.io.write as write_road

    write_road.write_part = timed_write_part  # profile mode only: the writer process's own module

    def timed_op() -> int:
        c0, t0 = time.thread_time(), time.perf_counter()
        client.insert(table, rows)
        PHASES["client: transaction total"] += time.perf_counter() - t0
        PHASES["client CPU (its thread): total"] += time.thread_time() - c0
        return 0

    return timed_op


def _premade_parts(params: dict, idx: int) -> tuple[Any, Any, str, Iterator[str]]:
    """(client, template part, its directory, unused part names) for metadata-only commits.

    One part file is written durably (``write_part``: Parquet + fsync + rename + directory
    fsync); ``links`` hard links to it are made under distinct part names and their directory is
    fsynced once. Every commit then takes the next unused one, so every commit references a
    distinct, complete, durable part file that no other commit references, and the timed
    commit itself does no data I/O (what a Spark driver commits: parts its executors wrote).
    """
    from mergetxn.client import Client
    from parts.io.format import new_part_name, write_part
    from parts.io.storage import _fsync_dir

    client = Client(params["addresses"][idx % len(params["addresses"])], credentials=params.get("credentials"))
    table = params["table"]
    tdef = client.table(table)
    template = write_part(client.storage, table, list(tdef.partition_by), (), ten_rows(idx), f"bench-w{idx}")
    root = Path(params["storage_root"])
    src = root / template.path
    directory = template.path.rsplit("/", 1)[0]
    names = []
    for _ in range(params["links"]):
        name = new_part_name(f"bench-w{idx}")
        os.link(src, root / directory / f"{name}.parquet")
        names.append(name)
    _fsync_dir(str(root / directory))
    return client, template, directory, iter(names)  # StopIteration surfaces: links are sized generously


def _op_mergetxn_metadata(params: dict, idx: int) -> Callable[[], int]:
    """Metadata-only commits as a transaction: ``with client.transaction() as tx:
    tx.add_parts(t, [part])`` (three round trips: begin, stage, commit)."""
    client, template, directory, names = _premade_parts(params, idx)
    table = params["table"]

    def op() -> int:
        name = next(names)
        with client.transaction() as tx:
            meta = dataclasses.replace(
                template, name=name, path=f"{directory}/{name}.parquet", creation_tid=tx.id, created_at=time.time()
            )
            tx.add_parts(table, [meta])
        return 0

    return op


def _op_mergetxn_commit_parts(params: dict, idx: int) -> Callable[[], int]:
    """Metadata-only commits in one call: ``client.commit_parts(t, [part])`` (one round trip; the
    replica begins, stages and commits)."""
    client, template, directory, names = _premade_parts(params, idx)
    table = params["table"]

    def op() -> int:
        name = next(names)
        meta = dataclasses.replace(template, name=name, path=f"{directory}/{name}.parquet", created_at=time.time())
        client.commit_parts(table, [meta])
        return 0

    return op


def _op_deltalake(params: dict, idx: int) -> Callable[[], int]:
    from deltalake import write_deltalake

    rows = ten_rows(idx)
    path = params["path"]

    def op() -> int:
        for attempt in range(1000):
            try:
                write_deltalake(path, rows, mode="append")
                return attempt
            except Exception as exc:  # CommitFailedError and friends on concurrent appends
                if attempt == 999:
                    raise
                if "onflict" not in repr(exc) and "ommit" not in repr(exc) and "ersion" not in repr(exc):
                    raise
        return 0

    return op


def _op_pyiceberg(params: dict, idx: int) -> Callable[[], int]:
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import CommitFailedException

    catalog = SqlCatalog("bench", uri=params["uri"], warehouse=params["warehouse"])
    table = catalog.load_table(params["ident"])
    rows = ten_rows(idx)

    def op() -> int:
        nonlocal table
        for attempt in range(1000):
            try:
                table.append(rows)
                return attempt
            except CommitFailedException:
                table = catalog.load_table(params["ident"])
            except Exception as exc:  # sqlite "database is locked" under concurrent writers
                if "locked" not in repr(exc) or attempt == 999:
                    raise
                table = catalog.load_table(params["ident"])
        return 0

    return op


def ducklake_extensions() -> dict[str, str]:
    """Extension name -> file of the DuckDB extensions DuckLake needs, from the PyPI packages
    duckdb-ext-* (each holds one ``.duckdb_extension`` file). Raises ``LookupError`` naming what is
    missing: the benchmark loads these files and never lets DuckDB download one."""
    import importlib.metadata

    out = {}
    for dist in DUCKLAKE_PACKAGES:
        try:
            files = importlib.metadata.files(dist) or []
        except importlib.metadata.PackageNotFoundError:
            raise LookupError(f"{dist} is not installed (pip install -c constraints.txt -e '.[bench]')") from None
        found = [f for f in files if f.name.endswith(".duckdb_extension")]
        if len(found) != 1:
            raise LookupError(f"{dist} holds {len(found)} .duckdb_extension files, expected 1")
        out[found[0].name.split(".", 1)[0]] = str(found[0].locate())
    return out


DUCKLAKE_PACKAGES = ("duckdb-ext-ducklake", "duckdb-ext-postgres", "duckdb-ext-sqlite")


def ducklake_connect(extensions: dict[str, str], attach: str) -> Any:
    """A DuckDB connection with the extension files loaded (never auto-installed or
    auto-loaded, so nothing is fetched) and the DuckLake catalog attached as ``lake``."""
    import duckdb

    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    for path in extensions.values():
        con.execute(f"LOAD '{path}'")
    con.execute(attach)
    return con


def _op_ducklake(params: dict, idx: int) -> Callable[[], int]:
    import duckdb

    con = ducklake_connect(params["extensions"], params["attach"])
    con.register("ten_rows", ten_rows(idx))

    def op() -> int:
        for attempt in range(1000):
            try:
                con.execute(f"INSERT INTO lake.{params['table']} SELECT * FROM ten_rows")
                return attempt
            except duckdb.Error as exc:
                # DuckLake retries a conflicting commit itself (ducklake_max_retry_count); what
                # still fails is a conflict it gave up on, or SQLite's "database is locked".
                text = repr(exc)
                if attempt == 999 or not any(w in text for w in ("onflict", "locked", "busy", "etry")):
                    raise
                with contextlib.suppress(duckdb.Error):
                    con.execute("ROLLBACK")
        return 0

    return op


OPS: dict[str, Callable[[dict, int], Callable[[], int]]] = {
    "mergetxn_insert": _op_mergetxn_insert,
    "mergetxn_insert_call": _op_mergetxn_insert_call,
    "mergetxn_metadata": _op_mergetxn_metadata,
    "mergetxn_commit_parts": _op_mergetxn_commit_parts,
    "deltalake": _op_deltalake,
    "pyiceberg": _op_pyiceberg,
    "ducklake": _op_ducklake,
}


def _worker(kind: str, params: dict, idx: int, ready: Any, go: Any, times: Any, results: Any) -> None:
    import logging

    logging.getLogger("pyiceberg").setLevel(logging.ERROR)  # its own retry notices: we count retries
    try:
        op = OPS[kind](params, idx)
    except BaseException as exc:
        ready.put((idx, repr(exc)))
        return
    ready.put((idx, None))
    go.wait()
    warm_end, end = times[0], times[1]
    PHASES.clear()
    prof = None
    if params.get("cprofile_dir"):  # profile mode: where the writer's CPU goes (one file per writer)
        import cProfile

        prof = cProfile.Profile(time.thread_time)  # CPU, not wall time
        prof.enable()
    cpu0 = time.process_time()
    tally = timed_loop(op, warm_end, end)
    cpu1 = time.process_time()
    if prof is not None:
        prof.disable()
        prof.dump_stats(os.path.join(params["cprofile_dir"], f"writer-{idx}.prof"))
        tally.cpu = {"writer": cpu1 - cpu0}
    tally.phases = dict(PHASES)
    results.put((idx, dataclasses.asdict(tally)))


def busy_seconds() -> float:
    """CPU time the whole machine spent busy so far (all cores, from /proc/stat)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None | Callable[[], float]) -> float:
    """User + system CPU time of a process so far (0 when unknown); a callable is asked instead
    (a server of many processes, see ``PostgresServer.cpu_seconds``)."""
    if pid is None:
        return 0.0
    if callable(pid):
        return pid()
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def run_processes(
    kind: str,
    params: dict,
    writers: int,
    warmup: float,
    seconds: float,
    watch: dict[str, int | None | Callable[[], float]] | None = None,
    at_window: Callable[[int], None] | None = None,
) -> Tally:
    """``writers`` processes run ``kind`` at once; their tallies are summed. The CPU time that
    the processes in ``watch`` (name -> pid) spend during the measured window goes into
    ``Tally.cpu`` (seconds). ``at_window`` (with ``watch``) is called with 0 as the window
    opens and with 1 as it closes (the probes of ``profile_replicas``)."""
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
        cpu0: dict[str, float] = {}
        if watch is not None:

            def writers_cpu() -> float:
                return sum(cpu_seconds(p.pid) for p in procs)

            time.sleep(max(0.0, times[0] - time.time()))
            if at_window is not None:
                at_window(0)
            busy0 = busy_seconds()
            cpu0 = {k: cpu_seconds(p) for k, p in watch.items()}
            cpu0["writers"] = writers_cpu()
            time.sleep(max(0.0, times[1] - time.time()))
            cpu1 = {k: cpu_seconds(p) for k, p in watch.items()}
            cpu1["writers"] = writers_cpu()
            busy1 = busy_seconds()
            if at_window is not None:
                at_window(1)
            cpu0["other processes"] = 0.0
            cpu1["other processes"] = max(
                0.0, (busy1 - busy0) - sum(cpu1[k] - cpu0[k] for k in cpu1 if k != "other processes")
            )
        tallies = [Tally(**results.get(timeout=warmup + seconds + 300)[1]) for _ in range(writers)]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    total = Tally()
    if watch is not None:
        total.cpu = {k: round(cpu1[k] - cpu0[k], 3) for k in cpu1}
    for t in tallies:
        for k, v in t.cpu.items():
            total.cpu[k] = total.cpu.get(k, 0.0) + v
        for k, v in t.phases.items():
            total.phases[k] = total.phases.get(k, 0.0) + v
        total.count += t.count
        total.retries += t.retries
        total.errors += t.errors
        total.first_errors += t.first_errors[: 3 - len(total.first_errors)]
        total.latencies += t.latencies
    return total


def run_threads(
    make_op: Callable[[int], Callable[[], int]],
    threads: int,
    warmup: float,
    seconds: float,
    watch: dict[str, int | None] | None = None,
) -> Tally:
    ops = [make_op(i) for i in range(threads)]
    now = time.time()
    warm_end, end = now + warmup, now + warmup + seconds
    out: list[Tally] = [Tally() for _ in range(threads)]

    def run(i: int) -> None:
        out[i] = timed_loop(ops[i], warm_end, end)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    total = Tally()
    if watch:
        time.sleep(max(0.0, warm_end - time.time()))
        busy0 = busy_seconds()
        cpu0 = {k: cpu_seconds(p) for k, p in watch.items()}
        time.sleep(max(0.0, end - time.time()))
        total.cpu = {k: round(cpu_seconds(p) - cpu0[k], 3) for k, p in watch.items()}
        total.cpu["other processes"] = round(max(0.0, busy_seconds() - busy0 - sum(total.cpu.values())), 3)
    for t in ts:
        t.join()
    for t in out:
        total.count += t.count
        total.errors += t.errors
        total.first_errors += t.first_errors[: 3 - len(total.first_errors)]
        total.latencies += t.latencies
    return total


def summarize(t: Tally, seconds: float, **extra: Any) -> dict:
    lat = sorted(t.latencies)

    def pct(q: float) -> float | None:
        return round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1000, 2) if lat else None

    out = {
        "commits_per_s": round(t.count / seconds, 1),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
        "commits": t.count,
        "seconds": seconds,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "retries": t.retries,
        "errors": t.errors,
    }
    if t.first_errors:
        out["first_errors"] = t.first_errors
    if t.cpu and t.count:
        out["cpu_ms_per_commit"] = {k: round(v * 1000 / t.count, 3) for k, v in t.cpu.items() if k != "other processes"}
    if "other processes" in t.cpu:
        # Share of the machine that processes outside this benchmark used meanwhile: noise.
        out["other_cpu_share"] = round(t.cpu["other processes"] / ((os.cpu_count() or 1) * seconds), 3)
    out.update(extra)
    return out


# ------------------------------------------------------------------------------------------
# Cases


def bench_raw_zookeeper(
    address: str, zk_pid: int | None, warmup: float, seconds: float, log: Callable[[str], None]
) -> dict:
    from kazoo.client import KazooClient

    def kazoo() -> KazooClient:
        c = KazooClient(hosts=address, timeout=30)
        c.start(timeout=30)
        return c

    payload = b"x" * RAW_PAYLOAD
    out = {}
    admin = kazoo()
    admin.ensure_path("/raw")
    clients: list[KazooClient] = [admin]
    try:

        def case(name: str, threads: int, per_thread_client: bool) -> None:
            own = [kazoo() for _ in range(threads)] if per_thread_client else []
            clients.extend(own)

            def make(i: int) -> Callable[[], int]:
                c = own[i] if per_thread_client else admin
                parent = f"/raw/{name}-{i}"
                c.ensure_path(parent)

                def op() -> int:
                    c.create(f"{parent}/c-", payload, sequence=True)
                    return 0

                return op

            t = run_threads(make, threads, warmup, seconds, {"zookeeper": zk_pid, "benchmark": os.getpid()})
            out[name] = summarize(t, seconds, threads=threads, clients=threads if per_thread_client else 1)
            log(f"  {name}: {out[name]['commits_per_s']} creates/s")

        case("raw_zk_1_thread", 1, False)
        case("raw_zk_16_threads_shared_client", 16, False)
        case("raw_zk_16_threads_own_clients", 16, True)
    finally:
        for c in clients:
            try:
                c.stop()
                c.close()
            except Exception:
                pass
    return out


def bench_mergetxn(
    workdir: Path,
    zk_address: str,
    zk_pid: int | None,
    replicas: int,
    root: str,
    cases: list[tuple[str, str, int, bool]],
    warmup: float,
    seconds: float,
    log: Callable[[str], None],
) -> dict:
    """``cases``: (result name, worker kind, writers, spread over replicas)."""
    from mergetxn.local.cluster import LocalCluster

    out = {}
    with LocalCluster(workdir, replicas=replicas, zk_address=zk_address, root=root) as cluster:
        admin = cluster.client(0)
        for name, kind, writers, spread in cases:
            table = f"{TABLE}_{name}"
            admin.create_table(table, ten_rows().schema, auto_merge=False)
            addresses = cluster.replica_addresses if spread else cluster.replica_addresses[:1]
            # Pre-made part files per metadata-only writer: ~2.5x what one of 16 writers commits
            # at the best rate seen (~2,000/s in all). Not far more: files that no commit names
            # yet are what the replica's cleanup pass lists and weighs every 30 s, and 100,000 of
            # them (the 600/s per writer of earlier runs) cost it 0.1 ms of CPU per commit. One or
            # a few writers get up to 1,200/s each (a lone writer is faster than one of 16).
            params = {
                "addresses": addresses,
                "table": table,
                "storage_root": cluster.storage_url,
                "links": int((warmup + seconds) * max(LINKS_PER_WRITER_PER_S, 1200 // writers)) + 500,
            }
            watch = {"zookeeper": zk_pid, **{f"replica-{i}": cluster.replica_pid(i) for i in range(replicas)}}
            before = batching_counters(cluster, table)
            t = run_processes(kind, params, writers, warmup, seconds, watch)
            batching = batching_ratios(
                before, batching_counters(cluster, table), files=kind.startswith("mergetxn_insert")
            )
            out[name] = summarize(
                t, seconds, writers=writers, replicas=replicas, replicas_used=len(addresses), batching=batching
            )
            log(f"  {name}: {out[name]['commits_per_s']} commits/s (p50 {out[name]['p50_ms']} ms)")
        admin.close()
    return out


def batching_counters(cluster: Any, table: str) -> dict[str, int]:
    """Every replica's commits, group-commit batches (one ZooKeeper multi each) and WAL fsyncs so
    far, and the part files in ``table``'s folder (the warm-up's and the measured commits')."""
    counts = {"commits": 0, "multis": 0, "wal_syncs": 0}
    for i in range(len(cluster.replica_addresses)):
        with contextlib.closing(cluster.client(i)) as c:
            committer = c.call("info").get("committer") or {}
        counts["commits"] += int(committer.get("commits", 0))
        counts["multis"] += int(committer.get("batches", 0))
        counts["wal_syncs"] += int(committer.get("wal_syncs", 0))
    folder = Path(cluster.storage_url) / table
    counts["part_files"] = sum(1 for _ in folder.rglob("*.parquet")) if folder.is_dir() else 0
    return counts


def batching_ratios(before: dict[str, int], after: dict[str, int], files: bool) -> dict[str, float | int | None]:
    """What the measured window's commits cost together: commits per ZooKeeper multi, per WAL
    fsync (on every replica: a follower's applies are fsynced too) and, with ``files`` (inserts:
    the metadata-only cases commit files made before the run), part files written per commit."""
    d = {k: after[k] - before[k] for k in after if files or k != "part_files"}
    commits = d["commits"]
    return {
        **d,
        "commits_per_multi": round(commits / d["multis"], 2) if d["multis"] else None,
        "commits_per_wal_fsync": round(commits / d["wal_syncs"], 2) if d["wal_syncs"] else None,
        **({"part_files_per_commit": round(d["part_files"] / commits, 3) if commits else None} if files else {}),
    }


def bench_deltalake(workdir: Path, warmup: float, seconds: float, log: Callable[[str], None]) -> dict:
    out = {}
    for writers in (1, 4):
        path = workdir / f"delta_{writers}w"
        from deltalake import write_deltalake

        write_deltalake(str(path), ten_rows(), mode="append")  # create the table outside the loop
        name = f"deltalake_insert_{writers}w"
        out[name] = summarize(
            run_processes("deltalake", {"path": str(path)}, writers, warmup, seconds, {}), seconds, writers=writers
        )
        log(f"  {name}: {out[name]['commits_per_s']} commits/s (retries {out[name]['retries']})")
    return out


def bench_pyiceberg(workdir: Path, warmup: float, seconds: float, log: Callable[[str], None]) -> dict:
    from pyiceberg.catalog.sql import SqlCatalog

    out = {}
    uri = f"sqlite:///{workdir / 'catalog.db'}"
    warehouse = f"file://{workdir / 'warehouse'}"
    (workdir / "warehouse").mkdir(parents=True, exist_ok=True)
    catalog = SqlCatalog("bench", uri=uri, warehouse=warehouse)
    catalog.create_namespace("bench")
    for writers in (1, 4):
        ident = f"bench.t{writers}w"
        catalog.create_table(ident, schema=ten_rows().schema)
        name = f"pyiceberg_insert_{writers}w"
        params = {"uri": uri, "warehouse": warehouse, "ident": ident}
        out[name] = summarize(
            run_processes("pyiceberg", params, writers, warmup, seconds, {}), seconds, writers=writers
        )
        log(f"  {name}: {out[name]['commits_per_s']} commits/s (retries {out[name]['retries']})")
    return out


class PostgresServer:
    """A throwaway PostgreSQL server from the distribution's packages (``/usr/lib/postgresql/N``)
    for DuckLake's catalog: its own data directory in a new temp dir, a free loopback port, the
    unix socket beside the data, trust authentication (loopback only). Run as root, every server
    command runs as the unprivileged ``postgres`` user (PostgreSQL refuses to run as root).
    ``stop`` (also on errors and Ctrl-C, through ``with``) stops it and removes the directory."""

    def __init__(self, databases: tuple[str, ...] = ("ducklake",)) -> None:
        self.databases = databases
        self.bindir = self.find_bindir()
        self.dir: Path | None = None
        self.port = 0
        self.pid: int | None = None

    @staticmethod
    def find_bindir() -> Path:
        """The newest installed server's binaries; ``LookupError`` saying why when there is none."""
        import glob
        import pwd

        found = sorted(
            (Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")),
            key=lambda b: int(b.parent.name) if b.parent.name.isdigit() else 0,
        )
        if not found:
            raise LookupError("no PostgreSQL server installed (/usr/lib/postgresql/*/bin/initdb; Debian: postgresql)")
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise LookupError("running as root and there is no 'postgres' user to run the server as") from None
        return found[-1]

    def _run(self, *args: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        done = subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(
                f"{Path(args[0]).name} failed ({done.returncode}): {(done.stderr or done.stdout)[-800:]}"
            )

    def start(self) -> None:
        import socket

        self.dir = Path(tempfile.mkdtemp(prefix="mergetxn-bench-pg-"))  # in /tmp: the postgres user can reach it
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        data = self.dir / "data"
        self._run(str(self.bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(self.dir / "server.log"),
            "-w",
            "-t",
            "60",
            "-o",
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir}",
            "start",
        )
        self.pid = int((data / "postmaster.pid").read_text().split("\n", 1)[0])
        for db in self.databases:
            self._run(str(self.bindir / "createdb"), "-h", str(self.dir), "-p", str(self.port), db)

    def stop(self) -> None:
        """Stop the server if it runs (also one interrupted while starting: its pid file says so)
        and remove its directory. Should ``pg_ctl stop`` fail, the postmaster gets SIGQUIT."""
        if self.dir is None:
            return
        data = self.dir / "data"
        try:
            if (data / "postmaster.pid").exists():
                try:
                    self._run(str(self.bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
                except (RuntimeError, OSError, subprocess.TimeoutExpired):
                    pid = self.pid or int((data / "postmaster.pid").read_text().split("\n", 1)[0])
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGQUIT)
                    raise
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir, self.pid = None, None

    def __enter__(self) -> PostgresServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def libpq(self, database: str) -> str:
        return f"dbname={database} host=127.0.0.1 port={self.port} user=postgres"

    def cpu_seconds(self) -> float:
        """CPU time of the whole server so far: the postmaster, the children it has reaped
                (backends of closed connections) and its live children (backends, checkpointer, WAL
                writer...), read from /proc. A child that has exited but is not reaped yet shows no CPU
                in either place, and one reaped while the children are listed would be missed: the reading
        is taken again (briefly) until neither happened."""
        if self.pid is None:
            return 0.0

        def stat(pid: int | str) -> list[str] | None:
            try:
                return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                return None

        for _ in range(50):
            own = stat(self.pid)
            if own is None:
                return 0.0
            total = sum(int(x) for x in own[11:15])  # utime stime cutime cstime
            unsettled = False
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    f = stat(entry)
                    if f is not None and f[1] == str(self.pid):  # ppid
                        unsettled = unsettled or f[0] == "Z"
                        total += sum(int(x) for x in f[11:15])
            # A child reaped during the scan is in neither reading: read again.
            again = stat(self.pid)
            unsettled = unsettled or again is None or again[13:15] != own[13:15]
            if not unsettled:
                break
            time.sleep(0.01)
        return total / os.sysconf("SC_CLK_TCK")


DUCKLAKE_VARIANTS = (("files", 0), ("inlined", 100))  # DATA_INLINING_ROW_LIMIT: 0 = a Parquet file per commit


def bench_ducklake(workdir: Path, warmup: float, seconds: float, log: Callable[[str], None]) -> dict:
    """DuckLake appends with the catalog on PostgreSQL and on SQLite, each with data files and
    with the rows inlined in the catalog. A catalog that cannot run here is reported as skipped."""
    out: dict[str, dict] = {}
    names = [(cat, var, w) for cat in ("pg", "sqlite") for var, _ in DUCKLAKE_VARIANTS for w in (1, 4)]

    def skip(catalog: str, reason: str) -> None:
        for cat, var, w in names:
            if cat == catalog:
                out[f"ducklake_{cat}_{var}_insert_{w}w"] = {"skipped": reason, "writers": w}
        log(f"  ducklake {catalog}: skipped ({reason})")

    try:
        every_extension = ducklake_extensions()
    except LookupError as exc:
        skip("pg", str(exc))
        skip("sqlite", str(exc))
        return out

    def cases(catalog: str, spec: Callable[[str], str], watch: dict[str, int | None | Callable[[], float]]) -> None:
        """``spec(variant)``: the metadata catalog of that variant (one catalog per variant)."""
        for var, limit in DUCKLAKE_VARIANTS:
            data = workdir / f"{catalog}_{var}"
            data.mkdir(parents=True, exist_ok=True)
            attach = f"ATTACH 'ducklake:{spec(var)}' AS lake (DATA_PATH '{data}/', DATA_INLINING_ROW_LIMIT {limit})"
            needed = {"ducklake", "postgres_scanner" if catalog == "pg" else "sqlite_scanner"}
            extensions = {k: v for k, v in every_extension.items() if k in needed}
            con = ducklake_connect(extensions, attach)
            con.register("ten_rows", ten_rows())
            for w in (1, 4):
                con.execute(f"CREATE TABLE lake.bench_{var}_{w}w AS SELECT * FROM ten_rows WITH NO DATA")
            con.close()  # no idle connection of this process in the catalog while the writers run
            for w in (1, 4):
                table = f"bench_{var}_{w}w"
                name = f"ducklake_{catalog}_{var}_insert_{w}w"
                params = {"extensions": extensions, "attach": attach, "table": table}
                t = run_processes("ducklake", params, w, warmup, seconds, watch)
                files = sum(1 for _ in data.rglob("*.parquet"))
                out[name] = summarize(t, seconds, writers=w, catalog=catalog, data_inlining_row_limit=limit)
                out[name]["parquet_files_so_far"] = files
                log(
                    f"  {name}: {out[name]['commits_per_s']} commits/s (p50 {out[name]['p50_ms']} ms, "
                    f"retries {out[name]['retries']}, errors {out[name]['errors']}, {files} files)"
                )

    try:
        server = PostgresServer(tuple(f"ducklake_{var}" for var, _ in DUCKLAKE_VARIANTS))
    except LookupError as exc:
        skip("pg", str(exc))
    else:
        with server:
            cases("pg", lambda var: f"postgres:{server.libpq(f'ducklake_{var}')}", {"postgres": server.cpu_seconds})
    cases("sqlite", lambda var: f"sqlite:{workdir / f'catalog_{var}.sqlite'}", {})
    return out


def code_commit(root: Path) -> str:
    """The short commit hash of the checkout at ``root`` ("unknown" outside git)."""
    try:
        return subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    import importlib.metadata

    import deltalake
    import pyiceberg

    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "memory": mem,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "pyarrow": pa.__version__,
        "deltalake": deltalake.__version__,
        "pyiceberg": pyiceberg.__version__,
        **{dist: version(dist) for dist in ("duckdb", *DUCKLAKE_PACKAGES)},
        "fsync_per_s": _fsync_rate(),
    }


def _fsync_rate() -> float:
    """Small write + fsync rate of the disk the run uses (what every durable commit pays)."""
    fd, path = tempfile.mkstemp(dir=tempfile.gettempdir())
    try:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 0.5:
            os.write(fd, b"x" * 128)
            os.fsync(fd)
            n += 1
        return round(n / (time.perf_counter() - t0))
    finally:
        os.close(fd)
        os.unlink(path)


def ratios(r: dict) -> dict:
    def get(name: str) -> float | None:
        return r.get(name, {}).get("commits_per_s")

    def div(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    def best(prefix: str, writers: int) -> tuple[float | None, str | None]:
        """The fastest DuckLake variant (data files or inlined rows) with this many writers."""
        runs = [(get(n), n) for n in r if n.startswith(prefix) and n.endswith(f"_insert_{writers}w") and get(n)]
        return max(runs, default=(None, None))

    raw_names = [n for n in r if n.startswith("raw_zk_")]
    raw_best = max((get(n) or 0 for n in raw_names), default=None)
    out = {
        "raw_zk_best": raw_best,
        "mergetxn_4w_over_deltalake_4w": div(get("mergetxn_insert_4w"), get("deltalake_insert_4w")),
        "mergetxn_1w_over_deltalake_1w": div(get("mergetxn_insert_1w"), get("deltalake_insert_1w")),
        "mergetxn_4w_over_pyiceberg_4w": div(get("mergetxn_insert_4w"), get("pyiceberg_insert_4w")),
        "mergetxn_1w_over_pyiceberg_1w": div(get("mergetxn_insert_1w"), get("pyiceberg_insert_1w")),
        "mergetxn_metadata_16c_over_raw_zk_best": div(get("mergetxn_metadata_16c"), raw_best),
        "mergetxn_metadata_16c_over_raw_zk_1_thread": div(get("mergetxn_metadata_16c"), get("raw_zk_1_thread")),
        "mergetxn_commit_parts_16c_over_raw_zk_best": div(get("mergetxn_commit_parts_16c"), raw_best),
        "mergetxn_commit_parts_16c_over_raw_zk_1_thread": div(get("mergetxn_commit_parts_16c"), get("raw_zk_1_thread")),
        # The target: 3 replicas on one box >= 0.7x of 1 replica (the same writers).
        "mergetxn_3r_insert_4w_over_1r": div(get("mergetxn_3r_insert_4w_spread"), get("mergetxn_insert_4w")),
        "mergetxn_3r_metadata_16c_over_1r": div(get("mergetxn_3r_metadata_16c_spread"), get("mergetxn_metadata_16c")),
    }
    shares = [v["other_cpu_share"] for v in r.values() if v.get("other_cpu_share") is not None]
    out["max_other_cpu_share"] = max(shares, default=None)  # > ~0.1: other work disturbed the run
    out["target_10x_deltalake_4w_met"] = (out["mergetxn_4w_over_deltalake_4w"] or 0) >= 10
    out["target_metadata_16c_above_raw_1_thread_met"] = (out["mergetxn_metadata_16c_over_raw_zk_1_thread"] or 0) > 1
    out["target_metadata_16c_above_raw_best_met"] = (out["mergetxn_metadata_16c_over_raw_zk_best"] or 0) > 1
    out["target_commit_parts_16c_above_raw_1_thread_met"] = (
        out["mergetxn_commit_parts_16c_over_raw_zk_1_thread"] or 0
    ) > 1
    for catalog in ("pg", "sqlite"):
        for writers in (4, 1):
            rate, name = best(f"ducklake_{catalog}_", writers)
            key = f"mergetxn_{writers}w_over_ducklake_{catalog}_{writers}w"
            out[key] = div(get(f"mergetxn_insert_{writers}w"), rate)
            out[f"{key}_against"] = name  # the DuckLake variant compared with: the best of the run
            # DuckLake's INSERT is one statement in autocommit: client.insert is its like for like.
            call = f"mergetxn_insert_call_{writers}w_over_ducklake_{catalog}_{writers}w"
            out[call] = div(get(f"mergetxn_insert_call_{writers}w"), rate)
    for writers, target in ((4, 5), (1, 3)):
        ratio = out[f"mergetxn_{writers}w_over_ducklake_pg_{writers}w"]
        out[f"target_{target}x_ducklake_pg_{writers}w_met"] = None if ratio is None else ratio >= target
    return out


def round_ratios(rounds: list[dict]) -> list[dict]:
    """The headline ratios within each round: both sides measured minutes apart on the same VM,
    so a slow or fast spell of the machine moves both (the spread between rounds is large)."""
    out = []
    for r in rounds:
        full = ratios(r)
        out.append(
            {
                k: full[k]
                for k in (
                    "mergetxn_4w_over_deltalake_4w",
                    "mergetxn_4w_over_ducklake_pg_4w",
                    "mergetxn_1w_over_ducklake_pg_1w",
                    "mergetxn_insert_call_4w_over_ducklake_pg_4w",
                    "mergetxn_insert_call_1w_over_ducklake_pg_1w",
                    "mergetxn_metadata_16c_over_raw_zk_1_thread",
                    "mergetxn_metadata_16c_over_raw_zk_best",
                    "mergetxn_commit_parts_16c_over_raw_zk_1_thread",
                    "mergetxn_commit_parts_16c_over_raw_zk_best",
                )
            }
        )
    return out


def table_markdown(r: dict) -> str:
    lines = [
        "| case | writers | commits/s | p50 ms | p99 ms | retries | errors | CPU ms/commit | other CPU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, v in r.items():
        w = v.get("writers") or v.get("threads")
        if "skipped" in v:
            lines.append(f"| {name} | {w} | skipped: {v['skipped']} | | | | | | |")
            continue
        cpu = " + ".join(f"{k} {x}" for k, x in v.get("cpu_ms_per_commit", {}).items())
        other = v.get("other_cpu_share")
        lines.append(
            f"| {name} | {w} | {v['commits_per_s']} | {v['p50_ms']} | {v['p99_ms']} | "
            f"{v['retries']} | {v['errors']} | {cpu} | {'' if other is None else f'{other:.0%}'} |"
        )
    return "\n".join(lines)


def ducklake_ratios_markdown(ratios: dict) -> str:
    """mergetxn against the best DuckLake variant of the run, with the targets."""
    lines = ["| ratio | value | against | target | met |", "|---|---|---|---|---|"]
    for catalog in ("pg", "sqlite"):
        for writers, target in ((4, 5), (1, 3)):
            key = f"mergetxn_{writers}w_over_ducklake_{catalog}_{writers}w"
            if catalog == "pg":
                met = ratios.get(f"target_{target}x_ducklake_pg_{writers}w_met")
                goal, verdict = f">= {target}x", "not measured" if met is None else ("yes" if met else "no")
            else:
                goal, verdict = "", ""
            value = ratios.get(key)
            lines.append(
                f"| {key} | {'' if value is None else f'{value}x'} | {ratios.get(key + '_against') or ''} | "
                f"{goal} | {verdict} |"
            )
            call = f"mergetxn_insert_call_{writers}w_over_ducklake_{catalog}_{writers}w"
            if ratios.get(call) is not None:
                lines.append(f"| {call} | {ratios[call]}x | {ratios.get(key + '_against') or ''} | | |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# Profile: where one mergetxn commit spends its time (replica in this process, writers outside)


def thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds of every thread of this process: native id -> (name, seconds). Python
    threads are named by their ``threading`` name; native ones (gRPC) by their OS name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat.rsplit(")", 1)[1].split()
            tid = int(task.name)
            name = names.get(tid) or comm
            name = "".join(c for c in name if not c.isdigit()).rstrip("-_ ") or comm  # group pools
            out[tid] = (name, (int(fields[11]) + int(fields[12])) / tick)
        except (OSError, ValueError):
            continue
    return out


def profile(
    commits_seconds: float, writers: int, kind: str, top: int, log: Callable[[str], None], dump: str | None = None
) -> dict:
    """Run a replica in-process with timers on the commit path and cProfile on its threads;
    ``dump``: also write the replica's whole cProfile there (pstats format, for callers/callees)."""
    import cProfile
    import io
    import pstats

    import kazoo.client

    import coordinator.zk.log
    import replicas.committer
    import replicas.follower
    import replicas.state
    import replicas.wal
    from mergetxn.client import Client
    from mergetxn.local.zkserver import ZooKeeperServer
    from replicas.replica import Replica, ReplicaConfig
    from replicas.server import ReplicaServer

    zkops: collections.Counter = collections.Counter()
    timers: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    orig_call = kazoo.client.KazooClient._call

    def counting_call(self, request, async_object):
        zkops[type(request).__name__] += 1
        return orig_call(self, request, async_object)

    def timed(obj: Any, attr: str, label: str) -> None:
        f = getattr(obj, attr)

        @functools.wraps(f)
        def g(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                timers[label] += time.perf_counter() - t0
                calls[label] += 1

        setattr(obj, attr, g)

    profiles: list[cProfile.Profile] = []
    local = threading.local()

    def profiled(obj: Any, attr: str) -> None:
        setattr(obj, attr, profiled_fn(getattr(obj, attr)))

    def profiled_fn(f: Callable) -> Callable:
        @functools.wraps(f)
        def g(*a, **k):
            prof = getattr(local, "prof", None)
            if prof is None:
                prof = local.prof = cProfile.Profile(time.thread_time)  # CPU, not wall time
                profiles.append(prof)
                local.depth = 0
            if local.depth:  # nested (a handler inside the RPC loop's event): already on
                return f(*a, **k)
            local.depth += 1
            prof.enable()
            try:
                return f(*a, **k)
            finally:
                prof.disable()
                local.depth -= 1

        return g

    kazoo.client.KazooClient._call = counting_call
    sys.setswitchinterval(0.0005)  # as replicas/server.py sets it in a replica process
    timed(replicas.wal.Wal, "append", "WAL append (+fsync for log entries)")
    timed(replicas.state.ReplicaState, "apply", "apply entry to replica state")
    timed(replicas.state.ReplicaState, "wait_applied", "committer waits for apply (follower)")
    timed(coordinator.zk.log.CsnLog, "commit", "ZooKeeper commit multi")
    timed(coordinator.zk.log.CsnLog, "fetch", "ZooKeeper log fetch (follower)")
    timed(replicas.committer.Committer, "_commit_batch", "committer batch total")
    timed(replicas.committer.Committer, "_plan", "conflict decision (plan)")
    timed(replicas.follower.Follower, "_fetch_batch", "follower fetch batch")
    timed(ReplicaServer, "_begin", "RPC handler: begin")
    import replicas.registry as rr

    timed(rr.Transactions, "stage", "RPC handler: stage")
    timed(rr.Transactions, "commit", "RPC handler: commit (incl. waiting for group commit)")
    profiled(replicas.committer.Committer, "_commit_batch")
    profiled(replicas.follower.Follower, "pull")
    profiled(rr.Transactions, "stage")
    profiled(ReplicaServer, "_begin")

    work = Path(tempfile.mkdtemp(prefix="mergetxn-profile-"))
    zk = ZooKeeperServer(work / "zookeeper")
    zk.start()
    try:
        replica = Replica(
            ReplicaConfig(zk=zk.address, storage_url=str(work / "storage"), host_id="r0", data_dir=work / "replica-0")
        )
        replica.start()
        server = ReplicaServer(replica)
        server.handlers = {k: profiled_fn(f) for k, f in server.handlers.items()}
        for attr in ("_serve_conn", "_run_calls"):  # the RPC I/O thread's events: framing, inline handlers
            setattr(server, attr, profiled_fn(getattr(server, attr)))
        replica.set_address(server.address)
        threading.Thread(target=server.serve, daemon=True).start()
        client = Client(server.address)
        client.create_table(TABLE, ten_rows().schema, auto_merge=False)
        params = {
            "addresses": [server.address],
            "table": TABLE,
            "storage_root": str(work / "storage"),
            "links": int(commits_seconds * 1000) + 2000,
            "phases": True,
            "cprofile_dir": str(work),
        }
        run_processes(kind, params, writers, 0.5, 1.0)  # warm the JIT, caches and connections
        zkops.clear()
        timers.clear()
        calls.clear()
        for p in profiles:
            p.clear()
        replica.committer.batches = replica.committer.committed = 0
        # Threads come and go (gRPC's pool): sample every thread's CPU time while the load runs.
        threads0 = thread_cpu()
        seen: dict[int, tuple[str, float]] = dict(threads0)
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(0.05):
                seen.update(thread_cpu())

        sampler = threading.Thread(target=sample, daemon=True)
        cpu0 = cpu_seconds(os.getpid()), cpu_seconds(zk.pid)
        sampler.start()
        t = run_processes(kind, params, writers, 0.0, commits_seconds)
        sampling.set()
        sampler.join()
        seen.update(thread_cpu())
        cpu1 = cpu_seconds(os.getpid()), cpu_seconds(zk.pid)
        n = max(1, replica.committer.committed)
        by_thread: dict[str, float] = collections.defaultdict(float)
        for tid, (name, secs) in seen.items():
            by_thread[name] += secs - threads0.get(tid, (name, 0.0))[1]
        committed, batches = replica.committer.committed, replica.committer.batches
        client.close()
        server.shutdown()
        replica.stop()
        stats = None
        for p in profiles:
            p.create_stats()
            if not p.stats:
                continue
            if stats is None:
                stats = pstats.Stats(p)
            else:
                stats.add(p)
        buf = io.StringIO()
        if stats is not None and dump:
            stats.dump_stats(dump)
        if stats is not None:
            stats.stream = buf
            stats.sort_stats("tottime").print_stats(top)
            stats.sort_stats("cumulative").print_stats(top)
        writer_files = sorted(str(f) for f in work.glob("writer-*.prof"))
        if writer_files:
            buf.write("\n=== writer processes (cProfile of the timed loop) ===\n")
            wstats = pstats.Stats(*writer_files, stream=buf)
            wstats.sort_stats("tottime").print_stats(top)
            wstats.sort_stats("cumulative").print_stats(top)
        result = {
            "kind": kind,
            "writers": writers,
            "seconds": commits_seconds,
            "commits": committed,
            "batches": batches,
            "commits_per_s": round(t.count / commits_seconds, 1),
            "errors": t.errors,
            "first_errors": t.first_errors,
            "client_ms_per_transaction": {k: round(v / max(1, t.count) * 1000, 3) for k, v in t.phases.items()},
            "replica_ms_per_commit": {k: round(v / n * 1000, 3) for k, v in sorted(timers.items())},
            "calls_per_commit": {k: round(v / n, 2) for k, v in sorted(calls.items())},
            "zookeeper_requests_per_commit": {k: round(v / n, 2) for k, v in sorted(zkops.items())},
            "cpu_ms_per_commit": {
                "replica process": round((cpu1[0] - cpu0[0]) * 1000 / n, 3),
                "zookeeper": round((cpu1[1] - cpu0[1]) * 1000 / n, 3),
                "writers (under cProfile)": round(t.cpu.get("writer", 0.0) * 1000 / n, 3),
            },
            "replica_cpu_ms_per_commit_by_thread": {
                k: round(v * 1000 / n, 3) for k, v in sorted(by_thread.items(), key=lambda kv: -kv[1]) if v > 0
            },
            "cprofile_top": buf.getvalue(),
        }
        log(json.dumps({k: v for k, v in result.items() if k != "cprofile_top"}, indent=2))
        log(result["cprofile_top"])
        return result
    finally:
        kazoo.client.KazooClient._call = orig_call
        zk.stop()
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------------------


PROBE_DIR = ROOT / "benchmarks" / "replica_probe"  # its sitecustomize.py goes into each replica process


def _probe_ask(sock: Path, cmd: str) -> dict:
    """One command to a replica's probe (benchmarks/replica_probe/sitecustomize.py), its JSON answer."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(60)
        s.connect(str(sock))
        s.sendall(cmd.encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            buf += chunk
    return json.loads(buf)


def _zk_mntr(address: str) -> dict[str, float]:
    """ZooKeeper's ``mntr`` counters (the numeric ones)."""
    import socket

    host, port = address.rsplit(":", 1)
    buf = b""
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"mntr")
        while chunk := s.recv(65536):
            buf += chunk
    out = {}
    for line in buf.decode(errors="replace").splitlines():
        k, _, v = line.partition("\t")
        try:
            out[k] = float(v)
        except ValueError:
            continue
    return out


def _thread_group(name: str) -> str:
    """A thread's name without its pool number: ``Thread-7 (zk_loop)`` -> ``(zk_loop)``."""
    if name.startswith("Thread-") and " " in name:
        name = name.split(" ", 1)[1]
    return "".join(c for c in name if not c.isdigit()).rstrip("-_ ") or name


def profile_replicas(
    commits_seconds: float,
    writers: int,
    kind: str,
    replicas: int,
    log: Callable[[str], None],
    cprofile: bool = False,
    top: int = 25,
) -> dict:
    """The 3-replica case profiled from inside each replica process (benchmarks/replica_probe):
    CPU ms per commit of every replica by thread (committer, follower, RPC, kazoo), kazoo's
    requests per commit by type, thread CPU timers on the follower's and committer's methods,
    ZooKeeper's ``mntr`` counters per commit and, with ``cprofile``, each replica's cProfile of
    the window (every thread, CPU time). Replicas are real processes as in ``bench_mergetxn``;
    the writers (``writers`` processes of ``kind``) are spread over them."""
    from mergetxn.local.cluster import LocalCluster
    from mergetxn.local.zkserver import ZooKeeperServer

    work = Path(tempfile.mkdtemp(prefix="mergetxn-profile3-"))
    probes = work / "probes"
    probes.mkdir()
    zk = ZooKeeperServer(work / "zookeeper")
    zk.start()
    env_keys = ("PYTHONPATH", "MERGETXN_BENCH_PROBE", "MERGETXN_BENCH_PROBE_CPROFILE")
    saved = {k: os.environ.get(k) for k in env_keys}
    cluster = None
    try:
        warm_up_zookeeper(zk.address)
        cluster = LocalCluster(work / "cluster", replicas=replicas, zk_address=zk.address, root="/profile3")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROBE_DIR), saved["PYTHONPATH"]) if p)
        os.environ["MERGETXN_BENCH_PROBE"] = str(probes)
        os.environ["MERGETXN_BENCH_PROBE_CPROFILE"] = "1" if cprofile else "0"
        try:
            cluster.start()  # only the replicas get the probe: the writers are spawned below
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        pids = [cluster.replica_pid(i) for i in range(replicas)]
        socks = [probes / f"probe-{pid}.sock" for pid in pids]
        deadline = time.monotonic() + 30
        while not all(s.exists() for s in socks):
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica probes did not start: {socks} (PYTHONPATH reaches the replicas?)")
            time.sleep(0.1)
        for s in socks:
            _probe_ask(s, "arm")
        admin = cluster.client(0)
        table = f"{TABLE}_profile3"
        admin.create_table(table, ten_rows().schema, auto_merge=False)
        warmup = 2.0
        params = {
            "addresses": cluster.replica_addresses,
            "table": table,
            "storage_root": cluster.storage_url,
            "links": int((warmup + commits_seconds) * max(LINKS_PER_WRITER_PER_S, 1200 // writers)) + 500,
        }
        watch: dict[str, int | None | Callable[[], float]] = {
            "zookeeper": zk.pid,
            **{f"replica-{i}": pid for i, pid in enumerate(pids)},
        }
        snaps: dict[int, tuple[list[dict], dict[str, float]]] = {}

        def at_window(i: int) -> None:
            snaps[i] = ([_probe_ask(s, "snap") for s in socks], _zk_mntr(zk.address))

        t = run_processes(kind, params, writers, warmup, commits_seconds, watch, at_window)
        admin.close()
        n = max(1, t.count)
        per_replica = []
        profile_rows: dict[str, dict[str, list[float]]] = collections.defaultdict(
            lambda: collections.defaultdict(lambda: [0, 0.0, 0.0])
        )
        for r, (a, b) in enumerate(zip(snaps[0][0], snaps[1][0], strict=True)):
            threads: dict[str, float] = collections.defaultdict(float)
            for tid, (name, secs) in b["threads"].items():
                threads[_thread_group(name)] += secs - a["threads"].get(tid, [name, 0.0])[1]
            timers = {}
            for label, (calls, secs) in sorted(b["timers"].items()):
                c0, s0 = a["timers"].get(label, [0, 0.0])
                if calls - c0:
                    timers[label] = {
                        "calls_per_commit": round((calls - c0) / n, 3),
                        "cpu_ms_per_commit": round((secs - s0) * 1000 / n, 3),
                        "cpu_us_per_call": round((secs - s0) * 1e6 / (calls - c0), 1),
                    }
            before = {i: rows for i, _, rows in a["profiles"]}
            for i, name, rows in b["profiles"]:
                group = profile_rows[_thread_group(name)]
                old = before.get(i, {})
                for label, (cc, inline, total) in rows.items():
                    c0, i0, t0 = old.get(label, [0, 0.0, 0.0])
                    if cc - c0 or total - t0 > 0:
                        row = group[label]
                        row[0] += cc - c0
                        row[1] += inline - i0
                        row[2] += total - t0
            per_replica.append(
                {
                    "replica": r,
                    "process_cpu_ms_per_commit": round((b["cpu"] - a["cpu"]) * 1000 / n, 3),
                    "thread_cpu_ms_per_commit": {
                        k: round(v * 1000 / n, 3) for k, v in sorted(threads.items(), key=lambda kv: -kv[1]) if v > 0
                    },
                    "zookeeper_requests_per_commit": {
                        k: round((v - a["zk"].get(k, 0)) / n, 3)
                        for k, v in sorted(b["zk"].items())
                        if v - a["zk"].get(k, 0)
                    },
                    "timers": timers,
                }
            )
        m0, m1 = snaps[0][1], snaps[1][1]
        mntr = {
            k: round((m1[k] - m0.get(k, 0.0)) / n, 3)
            for k in sorted(m1)
            if k.startswith(("zk_packets", "zk_cnt_", "zk_write", "zk_read")) or k.endswith("_count")
            if m1[k] - m0.get(k, 0.0) > 0
        }
        buf = []
        if cprofile:
            k = replicas * n
            for group, rows in sorted(profile_rows.items(), key=lambda kv: -sum(r[1] for r in kv[1].values())):
                own = sum(r[1] for r in rows.values()) * 1000 / k
                if own < 0.01:
                    continue
                buf.append(f"\n=== thread {group}: {own:.3f} ms CPU per commit per replica (under cProfile) ===")
                for title, col in (("own time", 1), ("cumulative", 2)):
                    buf.append(f"-- by {title}: calls/commit, own ms/commit, cumulative ms/commit, function")
                    for label, (cc, inline, total) in sorted(rows.items(), key=lambda kv: -kv[1][col])[:top]:
                        buf.append(f"{cc / k:10.3f} {inline * 1000 / k:9.4f} {total * 1000 / k:9.4f}  {label}")
        result = {
            "kind": kind,
            "writers": writers,
            "replicas": replicas,
            "seconds": commits_seconds,
            "cprofile": cprofile,
            "commits": t.count,
            "commits_per_s": round(t.count / commits_seconds, 1),
            "errors": t.errors,
            "first_errors": t.first_errors,
            "load_avg_1m_after": round(os.getloadavg()[0], 2),
            "other_cpu_share": round(t.cpu.get("other processes", 0.0) / ((os.cpu_count() or 1) * commits_seconds), 3),
            "cpu_ms_per_commit": {k: round(v * 1000 / n, 3) for k, v in t.cpu.items() if k != "other processes"},
            "zookeeper_mntr_per_commit": mntr,
            "per_replica": per_replica,
            "cprofile_top": "\n".join(buf),
        }
        log(json.dumps({k: v for k, v in result.items() if k != "cprofile_top"}, indent=2))
        if buf:
            log(result["cprofile_top"])
        return result
    finally:
        if cluster is not None:
            cluster.stop()
        zk.stop()
        shutil.rmtree(work, ignore_errors=True)


def warm_up_zookeeper(address: str, seconds: float = 4.0, **client_args: object) -> None:
    """Give a new ZooKeeper server's JIT the commit path's work (creates, multis, exists
    watches) before anything is measured on it, then remove what that left behind.
    ``client_args``: kazoo's, for a secured server (coordinator.wire.security.zk_client_args)."""
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=address, timeout=30, **client_args)
    zk.start(timeout=30)
    try:
        zk.ensure_path("/warmup")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            asyncs = []
            for _ in range(64):
                t = zk.transaction()
                t.check("/warmup", -1)
                t.create("/warmup/c-", b"x" * RAW_PAYLOAD, sequence=True)
                asyncs.append(t.commit_async())
                asyncs.append(zk.exists_async("/warmup/c-0000000000"))
            for a in asyncs:
                a.get(timeout=30)
        end = time.monotonic() + seconds / 2  # and one request per round trip, as a single writer
        while time.monotonic() < end:
            zk.create("/warmup/c-", b"x" * RAW_PAYLOAD, sequence=True)
        zk.delete("/warmup", recursive=True)
    finally:
        zk.stop()
        zk.close()


def warm_up_machine(work: Path, seconds: float, log: Callable[[str], None]) -> None:
    """Load the machine as the cases will before measuring anything, and throw the figures away.

    On this VM the first minute or two of load after an idle spell runs slow (every case of a
    first round, the raw ZooKeeper ones included, 10-40 % below the same case minutes later),
    which made a first round's ratios say more about the machine than about the code."""
    from mergetxn.local.zkserver import ZooKeeperServer

    log(f"warming the machine up ({seconds:g} s of unmeasured 4-writer mergetxn inserts)")
    zk = ZooKeeperServer(work / "zookeeper")
    zk.start()
    try:
        bench_mergetxn(
            work / "cluster",
            zk.address,
            zk.pid,
            1,
            "/warmup",
            [("machine_warmup", "mergetxn_insert", 4, False)],
            1.0,
            seconds,
            lambda _msg: None,
        )
    finally:
        zk.stop()
        shutil.rmtree(work, ignore_errors=True)


def run_round(groups: set[str], work: Path, warmup: float, seconds: float, log: Callable[[str], None]) -> dict:
    """Every group once, each ZooKeeper group on a fresh ZooKeeper server: the raw cases leave
    ~80,000 znodes (40 MB) behind, whose heap and snapshots would slow whatever ran after them."""
    from mergetxn.local.zkserver import ZooKeeperServer

    results: dict[str, dict] = {}

    @contextlib.contextmanager
    def fresh_zookeeper(name: str) -> Iterator[ZooKeeperServer]:
        zk = ZooKeeperServer(work / f"zookeeper-{name}")
        zk.start()
        try:
            warm_up_zookeeper(zk.address)
            yield zk
        finally:
            zk.stop()

    if "raw" in groups:
        log("raw ZooKeeper (sequential create, one per round trip):")
        with fresh_zookeeper("raw") as zk:
            results.update(bench_raw_zookeeper(zk.address, zk.pid, warmup, seconds, log))
    if "mergetxn" in groups:
        log("mergetxn, 1 replica:")
        with fresh_zookeeper("mergetxn1") as zk:
            results.update(
                bench_mergetxn(
                    work / "mergetxn1",
                    zk.address,
                    zk.pid,
                    1,
                    "/bench1",
                    [
                        ("mergetxn_insert_1w", "mergetxn_insert", 1, False),
                        ("mergetxn_insert_4w", "mergetxn_insert", 4, False),
                        ("mergetxn_insert_call_1w", "mergetxn_insert_call", 1, False),
                        ("mergetxn_insert_call_4w", "mergetxn_insert_call", 4, False),
                        ("mergetxn_insert_call_16w", "mergetxn_insert_call", 16, False),
                        ("mergetxn_metadata_16c", "mergetxn_metadata", 16, False),
                        ("mergetxn_commit_parts_16c", "mergetxn_commit_parts", 16, False),
                        # The floor of an insert that wrote no part file (its rows carried in the
                        # commit): the same one round trip with the part already written.
                        ("mergetxn_commit_parts_1w", "mergetxn_commit_parts", 1, False),
                        ("mergetxn_commit_parts_4w", "mergetxn_commit_parts", 4, False),
                    ],
                    warmup,
                    seconds,
                    log,
                )
            )
    if "mergetxn3" in groups:
        log("mergetxn, 3 replicas, writers spread over them:")
        with fresh_zookeeper("mergetxn3") as zk:
            results.update(
                bench_mergetxn(
                    work / "mergetxn3",
                    zk.address,
                    zk.pid,
                    3,
                    "/bench3",
                    [
                        ("mergetxn_3r_insert_4w_spread", "mergetxn_insert", 4, True),
                        ("mergetxn_3r_metadata_16c_spread", "mergetxn_metadata", 16, True),
                    ],
                    warmup,
                    seconds,
                    log,
                )
            )
    if "deltalake" in groups:
        log("deltalake (delta-rs), append:")
        results.update(bench_deltalake(work / "delta", warmup, seconds, log))
    if "pyiceberg" in groups:
        log("pyiceberg (SqlCatalog on sqlite), append:")
        results.update(bench_pyiceberg(work / "iceberg", warmup, seconds, log))
    if "ducklake" in groups:
        log("DuckLake (duckdb), append, catalog on PostgreSQL and on SQLite:")
        results.update(bench_ducklake(work / "ducklake", warmup, seconds, log))
    return results


def least_disturbed(rounds: list[dict]) -> dict:
    """Per case, the record of the round in which other processes used the least CPU (the
    machine is shared; other work only ever lowers a rate). Every round's rate and disturbance
    is kept in ``rounds``."""
    if len(rounds) == 1:
        return rounds[0]
    out = {}
    for name in rounds[0]:
        runs = [r[name] for r in rounds if name in r and "skipped" not in r[name]]
        if not runs:
            out[name] = rounds[0][name]
            continue
        best = min(runs, key=lambda v: (round(v.get("other_cpu_share") or 0.0, 2), -v["commits_per_s"]))
        rec = dict(best)
        rec["rounds"] = [
            {"commits_per_s": v["commits_per_s"], "other_cpu_share": v.get("other_cpu_share")} for v in runs
        ]
        out[name] = rec
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per case (default 8)")
    ap.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per case (default 2)")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every case this many times, rounds interleaved; report per case the round "
        "least disturbed by other processes (default 1)",
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "commit_throughput.json"))
    ap.add_argument("--workdir", default=None, help="scratch directory (default: a new temp dir)")
    ap.add_argument(
        "--only",
        default="raw,mergetxn,mergetxn3,deltalake,pyiceberg,ducklake",
        help="comma-separated groups to run (raw, mergetxn, mergetxn3, deltalake, pyiceberg, ducklake)",
    )
    ap.add_argument(
        "--machine-warmup",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="unmeasured 4-writer mergetxn inserts before the first round (default 60; 0: none)",
    )
    ap.add_argument(
        "--profile",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="instead of the comparison: profile the mergetxn commit path for SECONDS",
    )
    ap.add_argument("--profile-writers", type=int, default=1)
    ap.add_argument(
        "--profile-kind",
        default="mergetxn_insert",
        choices=[
            "mergetxn_insert",
            "mergetxn_insert_call",
            "mergetxn_metadata",
            "mergetxn_commit_parts",
            "mergetxn3_metadata",
            "mergetxn3_insert",
        ],
        help="what --profile runs; mergetxn3_*: 3 replica processes with the writers spread over them, each "
        "replica measured from inside (benchmarks/replica_probe: CPU by thread, ZooKeeper requests by type, "
        "timers; cProfile of every thread with --profile-cprofile)",
    )
    ap.add_argument("--profile-cprofile", action="store_true", help="mergetxn3_*: cProfile every replica thread")
    ap.add_argument("--profile-out", default=None)
    a = ap.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, flush=True)

    import logging

    logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # kazoo's chatter on client close

    if a.profile:
        dump = str(Path(a.profile_out).with_suffix(".prof")) if a.profile_out else None
        if a.profile_kind.startswith("mergetxn3_"):
            kind = a.profile_kind.replace("mergetxn3_", "mergetxn_")
            res = profile_replicas(a.profile, a.profile_writers, kind, 3, log, a.profile_cprofile)
        else:
            res = profile(a.profile, a.profile_writers, a.profile_kind, 40, log, dump)
        if a.profile_out:
            Path(a.profile_out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.profile_out).write_text(json.dumps(res, indent=2) + "\n")
        return 0

    groups = {g.strip() for g in a.only.split(",") if g.strip()}
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="mergetxn-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    info = machine()
    log(f"machine: {info['cpus']} CPUs, {info['cpu']}, {info['memory']}, fsync {info['fsync_per_s']}/s")
    if a.machine_warmup > 0:
        warm_up_machine(work / "machine-warmup", a.machine_warmup, log)
    rounds = []
    for r in range(a.repeat):
        if a.repeat > 1:
            log(f"== round {r + 1} of {a.repeat}")
        rounds.append(run_round(groups, work / f"round-{r}", a.warmup, a.seconds, log))
    results = least_disturbed(rounds)
    per_round = round_ratios(rounds)

    report = {
        "benchmark": "commit_throughput",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "wall_seconds": round(time.time() - started, 1),
        "config": {
            "seconds_per_case": a.seconds,
            "warmup_per_case": a.warmup,
            "rounds": a.repeat,
            "machine_warmup_seconds": a.machine_warmup,
            "rows_per_commit": 10,
            "raw_payload_bytes": RAW_PAYLOAD,
            "writers": "one process each (raw ZooKeeper: threads)",
        },
        "machine": info,
        "results": results,
        "ratios": {**ratios(results), "per_round": per_round},
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    log("\n" + table_markdown(results))
    if "ducklake" in groups:
        log("\n" + ducklake_ratios_markdown(report["ratios"]))
    log("\n" + json.dumps(report["ratios"], indent=2))
    log(f"\nwritten to {out} ({report['wall_seconds']} s)")
    if not a.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
