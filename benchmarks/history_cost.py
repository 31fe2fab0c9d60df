#!/usr/bin/env python
"""How commit cost grows with history: p50/p99 latency of a 10-row insert transaction after 100
commits and after 100,000, on one table, with everything a replica runs by default in the
background (merges, cleanup, the log tail: default settings, nothing turned off).

Phases, on a LocalCluster with one replica (embedded ZooKeeper, local storage):

1. Warm-up, not measured: ``--warmup`` commits from the same ``--writers`` processes that grow
   the history later (ZooKeeper's JIT, the replica's caches, merges and cleanup get going, the
   writers' code paths run), then ``--early`` sequential commits from the sampling client.
2. ``--samples`` sequential 10-row inserts, each timed (begin to commit returned): the early
   figure (after 1,100 commits by default).
3. History grows to ``--history`` commits: 10-row insert transactions from ``--writers``
   processes (as independent jobs would be); the visible part count is polled meanwhile.
4. ``--samples`` sequential 10-row inserts timed again: the late figure.

Both samples are taken the same way right after the writers stop. Each also reports the CPU ms
per commit of ZooKeeper, the replica and this process, and the replica's ``info()`` (log, WAL,
checkpoint, part records); ``--profile DIR`` adds a CPU-weighted stack sample of the replica
during each (benchmarks/sampler/sitecustomize.py, loaded into the replica only then).

The ratio late/early of p50 and p99 is what the README reports (target: at most 1.2x; delta-rs
measured 1.9x and pyiceberg 16x after only 1,000 commits on this machine).

    .venv/bin/python benchmarks/history_cost.py [--history 100000] [--out benchmarks/results/history_cost.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402

# Benchmarks load one partition of a table without merges with thousands of parts: the
# replicas they start take no backpressure (docs/rules.md, "Too many parts"), or they would
# measure its delays and refusals instead of the path they are about.
os.environ.setdefault("MERGETXN_PARTS_TO_DELAY_INSERT", "0")
os.environ.setdefault("MERGETXN_PARTS_TO_THROW_INSERT", "0")

TABLE = "history"


def ten_rows(seed: int) -> pa.Table:
    return pa.table(
        {"id": pa.array(range(seed * 10, seed * 10 + 10), pa.int64()), "v": [f"row{seed}-{i}" for i in range(10)]}
    )


def _writer(address: str, start: int, count: int, done: mp.Value) -> None:
    import coordinator

    client = coordinator.connect(address)
    for i in range(start, start + count):
        with client.transaction() as tx:
            tx.insert(TABLE, ten_rows(i))
        with done.get_lock():
            done.value += 1
    client.close()


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (0 when unknown)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def visible_parts(client) -> tuple[int, int]:
    """(visible parts, part records) of the table now."""
    parts = client.parts(TABLE)
    return sum(parts.column("visible").to_pylist()), parts.num_rows


class PartWatch:
    """Polls the visible part count while the writers run (merges must keep it bounded)."""

    def __init__(self, address: str, every: float = 5.0) -> None:
        import coordinator

        self.client = coordinator.connect(address)
        self.every, self.stop, self.seen = every, threading.Event(), []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self.stop.wait(self.every):
            try:
                visible, records = visible_parts(self.client)
            except Exception as exc:  # noqa: BLE001 - a poll is best effort
                print(f"  part poll failed: {exc}", flush=True)
                continue
            self.seen.append((round(time.monotonic() - t0, 1), visible, records))

    def __enter__(self) -> PartWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.client.close()

    def summary(self) -> dict:
        vis = [v for _, v, _ in self.seen] or [0]
        return {
            "polls": len(self.seen),
            "visible_max": max(vis),
            "visible_mean": round(statistics.fmean(vis), 1),
            "visible_last_quarter_max": max(vis[len(vis) * 3 // 4 :] or [0]),
            "records_max": max([r for _, _, r in self.seen] or [0]),
            "trace": self.seen[:: max(1, len(self.seen) // 40)],
        }


def grow(address: str, commits: int, writers: int, first: int) -> float:
    """``commits`` insert transactions from ``writers`` processes; returns seconds."""
    done = mp.Value("q", 0)
    per = commits // writers
    procs = [
        mp.Process(target=_writer, args=(address, first + k * per, per + (commits % writers if k == 0 else 0), done))
        for k in range(writers)
    ]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    last = 0.0
    while any(p.is_alive() for p in procs):
        time.sleep(1.0)
        if time.monotonic() - last > 30:
            last = time.monotonic()
            print(f"  history: {done.value}/{commits} commits, {time.monotonic() - t0:.0f}s", flush=True)
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"a writer failed (exit code {p.exitcode})")
    return time.monotonic() - t0


def sample(client, n: int, first: int, cluster, profile: str | None, label: str) -> dict:
    """``n`` timed sequential inserts; with the CPU per commit of each process and the replica's state."""
    pids = {"zookeeper": cluster.zk.pid, "replica": cluster.replica_pid(0)}
    if profile:
        Path(profile, "control").write_text(label)
        time.sleep(0.5)  # the sampler looks every 0.2 s
    cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
    me0 = time.process_time()
    latencies = []
    for i in range(n):
        t0 = time.perf_counter()
        with client.transaction() as tx:
            tx.insert(TABLE, ten_rows(first + i))
        latencies.append(time.perf_counter() - t0)
    cpu = {k: round((cpu_seconds(p) - cpu0[k]) * 1e3 / n, 3) for k, p in pids.items()}
    cpu["client"] = round((time.process_time() - me0) * 1e3 / n, 3)
    if profile:
        Path(profile, "control").write_text("")
    info = client.call("info")
    visible, records = visible_parts(client)
    latencies.sort()
    return {
        "n": n,
        "cpu_ms_per_commit": cpu,
        "visible_parts": visible,
        "part_records": records,
        "log": info.get("log"),
        "merges": info.get("merges"),
        "cleanup_last": (info.get("cleanup") or {}).get("last"),
        "p50_ms": round(statistics.median(latencies) * 1e3, 3),
        "p99_ms": round(latencies[min(n - 1, int(n * 0.99))] * 1e3, 3),
        "mean_ms": round(statistics.fmean(latencies) * 1e3, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--history", type=int, default=100_000, help="commits before the late sample (default 100000)")
    ap.add_argument(
        "--warmup", type=int, default=1000, help="unmeasured commits from the writers before the early sample"
    )
    ap.add_argument("--early", type=int, default=100, help="then sequential unmeasured commits (default 100)")
    ap.add_argument("--samples", type=int, default=1000, help="timed commits per sample (default 1000)")
    ap.add_argument("--writers", type=int, default=4, help="processes growing the history (default 4)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "history_cost.json"))
    ap.add_argument("--profile", default=None, metavar="DIR", help="stack-sample the replica during each sample")
    ap.add_argument("--settings", default="{}", help="replica settings as JSON (default: none, the defaults)")
    args = ap.parse_args()
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        Path(args.profile, "control").write_text("")
        os.environ["MERGETXN_SAMPLER_DIR"] = str(Path(args.profile).resolve())
        os.environ["PYTHONPATH"] = str(ROOT / "benchmarks" / "sampler") + os.pathsep + os.environ.get("PYTHONPATH", "")

    import coordinator

    with (
        tempfile.TemporaryDirectory(prefix="mergetxn-history-") as work,
        coordinator.LocalCluster(work, replicas=1, settings=json.loads(args.settings)) as cluster,
    ):
        client = cluster.client(0)
        client.create_table(TABLE, ten_rows(0).schema)
        seed = 1
        address = cluster.replica_addresses[0]
        with PartWatch(address) as warm_watch:
            warm_seconds = grow(address, args.warmup, args.writers, seed)
        seed += args.warmup
        for _ in range(args.early):
            with client.transaction() as tx:
                tx.insert(TABLE, ten_rows(seed))
            seed += 1
        before = args.warmup + args.early
        early = sample(client, args.samples, seed, cluster, args.profile, "early")
        seed += args.samples
        print(f"after {before} commits ({warm_seconds:.0f}s to warm up): {json.dumps(early)}", flush=True)
        grown = args.history - (before + args.samples)
        with PartWatch(address) as watch:
            seconds = grow(address, grown, args.writers, seed)
        seed += grown
        late = sample(client, args.samples, seed, cluster, args.profile, "late")
        info = client.call("info")
        print(f"after {args.history} commits ({seconds:.0f}s to grow): {json.dumps(late)}", flush=True)
    result = {
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": platform.platform(),
        "load_at_end": os.getloadavg(),
        "history": args.history,
        "warmup": args.warmup,
        "early_after": before,
        "writers": args.writers,
        "grow_seconds": round(seconds, 1),
        "grow_commits_per_second": round(grown / seconds, 1),
        "parts_while_warming": warm_watch.summary(),
        "parts_while_growing": watch.summary(),
        "early": early,
        "late": late,
        "ratio_p50": round(late["p50_ms"] / early["p50_ms"], 3),
        "ratio_p99": round(late["p99_ms"] / early["p99_ms"], 3),
        "visible_parts_at_end": late["visible_parts"],
        "part_records_at_end": late["part_records"],
        "replica_settings": info.get("settings"),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    keys = ("ratio_p50", "ratio_p99", "visible_parts_at_end", "grow_commits_per_second")
    print(json.dumps({k: result[k] for k in keys}))
    print(json.dumps({"visible_max_while_growing": watch.summary()["visible_max"]}))


if __name__ == "__main__":
    main()
