#!/usr/bin/env python
"""A month of use in an hour: what a replica keeps while writers never stop.

``--writers`` processes (4) call ``client.insert`` with 10 rows as fast as the cluster takes them
(spread over the replicas), default settings but for ``--retention`` (the replicas'
``retention_seconds``) and ``--outcome`` (``outcome_seconds``), merges and cleanup running in the
background. Every ``--every`` commits (10,000) a sample records, for the window since the last:
the commit rate, p50/p99 of the writers' insert latency, refusals for too many parts; and then,
per replica: RSS, checkpoint and WAL bytes, the entries of every structure ``info`` reports
(``structures``: part records, remembered outcomes, time versions, ...); for the cluster:
ZooKeeper's node count (``mntr``), visible parts (the most in one partition) and removed parts
still in storage, the bytes of storage and of the live data. When the writers stop it watches
the visible parts fall back under ``parts_to_delay_insert``, then restarts replica 0 and times it.

Targets (docs/architecture/bounds.md): at the last sample against the 20,000-commit one, rate at
least 0.95x, p99 at most 1.2x, RSS and checkpoint within 10 %; visible parts never above the
refusal threshold, back under the delay threshold within a minute of the load stopping; storage
at most 1.5x the live data plus the window's removed parts.

    .venv/bin/python benchmarks/soak.py --commits 1000000 [--replicas 3] [--out benchmarks/results/soak.json]

``--plot FILE.png`` draws each sampled figure against commits (matplotlib).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import platform
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402

TABLE = "soak"
STOP = -1  # a writer's last message


def ten_rows(seed: int) -> pa.Table:
    return pa.table({"id": pa.array(range(seed * 10, seed * 10 + 10), pa.int64()), "v": [f"r{seed}"] * 10})


def _writer(address: str, first: int, stride: int, total: mp.Value, limit: int, out: mp.Queue) -> None:
    """Insert until ``total`` reaches ``limit``; send (latencies, refusals) every 200 commits."""
    import coordinator
    from coordinator.errors import TooManyParts

    client = coordinator.connect(address)
    latencies: list[float] = []
    refused = 0
    seed = first
    while True:
        with total.get_lock():
            if total.value >= limit:
                break
            total.value += 1
        t0 = time.perf_counter()
        while True:
            try:
                client.insert(TABLE, ten_rows(seed))
                break
            except TooManyParts:
                refused += 1  # nothing was written: the same rows again once merges caught up
                time.sleep(1.0)
        latencies.append(time.perf_counter() - t0)
        seed += stride
        if len(latencies) >= 200:
            out.put((latencies, refused))
            latencies, refused = [], 0
    out.put((latencies, refused))
    out.put(STOP)
    client.close()


def rss_bytes(pid: int | None) -> int:
    if pid is None:
        return 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def dir_bytes(path: Path) -> int:
    """Bytes of the files under ``path``; a file cleanup removes while this counts is left out
    (a FileNotFoundError here once ended a soak run, the cluster going down with it)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


def zk_nodes(cluster) -> int:
    from mergetxn.local.zkserver import four_letter_word

    host, port = cluster.zk_address.rsplit(",", 1)[0].rsplit(":", 1)
    for line in four_letter_word(host, int(port), "mntr").splitlines():
        if line.startswith("zk_znode_count"):
            return int(line.split()[1])
    return -1


def table_figures(client, window_csn: int = 0, overdue_csn: int = 0) -> dict:
    """Visible parts (total and the most in one partition), removed parts whose files are still
    held, part records of collected files, live bytes; and of the held parts, the bytes of those
    removed inside the retention window (above ``window_csn``) and how many were removed at or
    below ``overdue_csn`` (the window and two cleanup intervals ago: collection lag)."""
    parts = client.parts(TABLE).to_pylist()
    visible = [p for p in parts if p["visible"]]
    held = [p for p in parts if not p["visible"] and not p["collected"] and p["removal_csn"] is not None]
    per_partition: dict[str, int] = {}
    for p in visible:
        per_partition[p["partition"]] = per_partition.get(p["partition"], 0) + 1
    return {
        "visible_parts": len(visible),
        "visible_per_partition_max": max(per_partition.values(), default=0),
        "part_records": len(parts),
        "removed_held": len(held),
        "collected_records": sum(1 for p in parts if p["collected"]),
        "live_bytes": sum(p["size"] for p in visible),
        "window_removed_bytes": sum(p["size"] for p in held if p["removal_csn"] > window_csn),
        "overdue_parts": sum(1 for p in held if p["removal_csn"] <= overdue_csn),
    }


def replica_figures(cluster, clients: list) -> list[dict]:
    out = []
    for i, c in enumerate(clients):
        info = c.call("info")
        log = info.get("log") or {}
        out.append(
            {
                "rss": rss_bytes(cluster.replica_pid(i)),
                "checkpoint_bytes": (log.get("checkpoint") or {}).get("bytes") or 0,
                "local_checkpoint_bytes": log.get("local_checkpoint_bytes") or 0,
                "wal_bytes": log.get("wal_bytes") or 0,
                "log_entries": log.get("entries") or 0,
                "structures": info.get("structures") or {},
                "memory": info.get("memory") or {},
                "merges": info.get("merges"),
                "delayed_refused": info.get("inserts"),
            }
        )
    return out


class Sampler:
    """Collects the writers' latencies and takes a sample every ``every`` commits."""

    def __init__(self, cluster, clients: list, storage: Path, every: int, out: mp.Queue) -> None:
        self.cluster, self.clients, self.storage, self.every, self.out = cluster, clients, storage, every, out
        self.samples: list[dict] = []
        self.window: list[float] = []
        self.refused = 0
        self.done = 0
        self.t_last = time.monotonic()
        self.csns: deque[tuple[float, int]] = deque()  # (time, applied CSN) each second: the window's CSNs
        self.retention, self.lag = 0.0, 0.0  # retention_seconds, and two gc_interval
        self.partial: Path | None = None  # written after every sample

    def csn_at(self, when: float) -> int:
        """The applied CSN last seen at or before ``when`` (0: none)."""
        found = 0
        for t, csn in self.csns:
            if t > when:
                break
            found = csn
        return found

    def poll_csn(self) -> None:
        now = time.time()
        if not self.csns or now - self.csns[-1][0] >= 1.0:
            self.csns.append((now, self.clients[0].call("info")["applied_csn"]))
            while now - self.csns[0][0] > self.retention + self.lag + 5:
                self.csns.popleft()

    def drain(self, timeout: float) -> bool:
        """Take one message; False once a writer said it stopped."""
        self.poll_csn()
        try:
            msg = self.out.get(timeout=timeout)
        except queue.Empty:
            return True
        if msg == STOP:
            return False
        latencies, refused = msg
        self.window.extend(latencies)
        self.refused += refused
        self.done += len(latencies)
        if self.done >= (len(self.samples) + 1) * self.every:
            self.take()
        return True

    def take(self) -> None:
        now = time.monotonic()
        lat = sorted(self.window)
        at = time.time()
        table = table_figures(
            self.clients[0], self.csn_at(at - self.retention), self.csn_at(at - self.retention - self.lag)
        )
        sample = {
            "commits": self.done,
            "rate": round(len(lat) / (now - self.t_last), 1),
            "p50_ms": round(statistics.median(lat) * 1e3, 2),
            "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3, 2),
            "refused": self.refused,
            "load_average": round(os.getloadavg()[0], 2),  # what else ran on the machine
            "zk_nodes": zk_nodes(self.cluster),
            "storage_bytes": dir_bytes(self.storage),
            **table,
            "replicas": replica_figures(self.cluster, self.clients),
        }
        self.samples.append(sample)
        if self.partial is not None:  # what was sampled survives a run that ends early
            self.partial.write_text(json.dumps({"partial": True, "samples": self.samples}, indent=1) + "\n")
        r0 = sample["replicas"][0]
        print(
            f"{self.done:>9,} commits {sample['rate']:>6}/s p50 {sample['p50_ms']} p99 {sample['p99_ms']} ms"
            f" visible {table['visible_parts']} held {table['removed_held']} storage {sample['storage_bytes'] >> 20} MB"
            f" rss {r0['rss'] >> 20} MB ckpt {r0['checkpoint_bytes'] >> 10} KB zk {sample['zk_nodes']}"
            f" {json.dumps(r0['structures'])} {json.dumps(r0['memory'])}",
            flush=True,
        )
        self.window, self.refused = [], 0
        self.t_last = time.monotonic()  # sampling time is not the writers' time


def after_load(client, delay_threshold: int, seconds: float = 60.0) -> dict:
    """Visible parts per partition each 5 s after the writers stop, until under the threshold."""
    t0, trace = time.monotonic(), []
    while time.monotonic() - t0 <= seconds:
        most = table_figures(client)["visible_per_partition_max"]
        trace.append((round(time.monotonic() - t0, 1), most))
        if delay_threshold <= 0 or most < delay_threshold:
            return {"under_delay_after_s": trace[-1][0], "trace": trace}
        time.sleep(5.0)
    return {"under_delay_after_s": None, "trace": trace}


def restart_seconds(cluster, i: int) -> float:
    cluster.stop_replica(i)
    t0 = time.monotonic()
    cluster.start_replica(i)
    return round(time.monotonic() - t0, 2)


def targets(samples: list[dict], base_at: int, band: int = 5) -> dict:
    """The last sample against the one nearest ``base_at`` commits (rate, p99, RSS, checkpoint),
    and the same ratios between the medians of ``band`` samples around each (``*_band``): one
    sample of a checkpoint swings with the removed parts held at that moment (2,000-7,000 in a
    10 s window), one of RSS with the allocators' last trim, so the band shows the trend."""
    i = min(range(len(samples)), key=lambda j: abs(samples[j]["commits"] - base_at))
    base, last = samples[i], samples[-1]
    lo = max(0, min(i - band // 2, len(samples) - band))
    around, end = samples[lo : lo + band], samples[-band:]

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 3) if b else None

    figures = {
        "rate": lambda s: s["rate"],
        "p99": lambda s: s["p99_ms"],
        "rss": lambda s: s["replicas"][0]["rss"],
        "checkpoint": lambda s: s["replicas"][0]["checkpoint_bytes"],
    }
    out: dict = {"base_commits": base["commits"], "last_commits": last["commits"]}
    for name, of in figures.items():
        out[name] = ratio(of(last), of(base))
        out[f"{name}_band"] = ratio(statistics.median(map(of, end)), statistics.median(map(of, around)))
    return out | {
        "band_samples": band,
        "visible_per_partition_max": max(s["visible_per_partition_max"] for s in samples),
        "overdue_parts_max": max(s["overdue_parts"] for s in samples),
        "storage_over_live_and_window": max(storage_ratios(samples)),
        "storage_over_live_and_window_median": round(statistics.median(storage_ratios(samples)), 3),
    }


def storage_ratios(samples: list[dict]) -> list[float]:
    """Per sample: storage's bytes over the live parts' and the window's removed parts' (what is
    beyond them: parts removed before the window whose cleanup pass has not come yet, a merged
    part's sidecar, the cluster checkpoints, files of inserts in flight)."""
    return [round(s["storage_bytes"] / (s["live_bytes"] + s["window_removed_bytes"]), 3) for s in samples]


# What --check holds to no growth: per sample, a structure's size (bounded by the windows and the load).
BOUNDED = (
    "part_records",
    "removed_part_records",
    "outcomes",
    "time_versions",
    "conflict_history",
    "created",
    "catalog_records",
    "ddl_csns",
    "finished_transactions",
)


def series(samples: list[dict]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {k: [s["replicas"][0]["structures"].get(k, 0) for s in samples] for k in BOUNDED}
    for k in ("checkpoint_bytes", "local_checkpoint_bytes"):
        out[k] = [s["replicas"][0][k] for s in samples]
    for k in ("zk_nodes", "removed_held"):  # (visible parts: held to the thresholds)
        out[k] = [s[k] for s in samples]
    # Storage past the live rows (removed parts in the window, sidecars, checkpoints): the live
    # rows themselves grow with every insert (22 MB after 1,000,000 10-row commits), rightly.
    out["storage_beyond_live"] = [s["storage_bytes"] - s["live_bytes"] for s in samples]
    return out


def growth(values: list[float]) -> float:
    """The least-squares line's rise over the samples, relative to their mean (0: flat)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2 or mean == 0:
        return 0.0
    xm = (n - 1) / 2
    slope = sum((i - xm) * (v - mean) for i, v in enumerate(values)) / sum((i - xm) ** 2 for i in range(n))
    return slope * (n - 1) / mean


def grows(values: list[float]) -> bool:
    """Whether ``values`` (a structure's sizes, sample by sample) grow with the commits: a fitted
    rise above half their mean, AND a last value past twice the largest of the first third. A
    structure kept by history grows 3x over 9,000 -> 30,000 commits and fails both; one bounded by
    its windows moves between levels as cleanup passes and the window's floor come (part records
    3,200 for four samples then 5,700 for three, in a 30,000-commit run: a fitted rise of 0.71
    alone, 1.8x the first third's largest), and passes. Samples before a structure's first
    appearance (0: no checkpoint written yet, the first may come after 18,000 commits) are not
    its size and are left out."""
    values = values[next((i for i, v in enumerate(values) if v), len(values)) :]
    if not values:
        return False
    first = max(values[: max(1, len(values) // 3)])
    return growth(values) > 0.5 and values[-1] > 2 * first


def check(result: dict, warmup: int, throw_at: int, delay_at: int) -> list[str]:
    """What --check finds wrong: a bounded structure that grows past the warm-up samples
    (:func:`grows`), visible parts past the refusal threshold, or not back under the delay
    threshold within a minute of the load stopping."""
    found = []
    for k, values in series(result["samples"][warmup:]).items():
        if grows(values):
            found.append(f"{k} grows with the commits: {values} (fitted rise {growth(values):.2f} of its mean)")
    most = result["targets"]["visible_per_partition_max"]
    if throw_at and most > throw_at:
        found.append(f"visible parts in one partition reached {most}, past parts_to_throw_insert {throw_at}")
    if delay_at and result["after_load"]["under_delay_after_s"] is None:
        found.append(f"visible parts not under parts_to_delay_insert {delay_at} within a minute of the load stopping")
    return found


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    x = [s["commits"] for s in samples]
    series = {
        "commits/s": [s["rate"] for s in samples],
        "p50 / p99 ms": ([s["p50_ms"] for s in samples], [s["p99_ms"] for s in samples]),
        "replica RSS MB": [s["replicas"][0]["rss"] / 2**20 for s in samples],
        "checkpoint / WAL KB": (
            [s["replicas"][0]["checkpoint_bytes"] / 1024 for s in samples],
            [s["replicas"][0]["wal_bytes"] / 1024 for s in samples],
        ),
        "ZooKeeper nodes": [s["zk_nodes"] for s in samples],
        "visible / held parts": ([s["visible_parts"] for s in samples], [s["removed_held"] for s in samples]),
        "storage / live MB": (
            [s["storage_bytes"] / 2**20 for s in samples],
            [s["live_bytes"] / 2**20 for s in samples],
        ),
        "part records / outcomes (k)": (
            [s["replicas"][0]["structures"].get("part_records", 0) / 1e3 for s in samples],
            [s["replicas"][0]["structures"].get("outcomes", 0) / 1e3 for s in samples],
        ),
    }
    fig, axes = plt.subplots(4, 2, figsize=(11, 12), sharex=True)
    for ax, (title, ys) in zip(axes.flat, series.items()):
        for y in ys if isinstance(ys, tuple) else (ys,):
            ax.plot(x, y, marker=".")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("commits")
    fig.suptitle(f"soak: {result['replicas']} replica(s), {result['writers']} writers, {result['commit']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commits", type=int, default=1_000_000)
    ap.add_argument("--every", type=int, default=10_000, help="commits between samples")
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--retention", type=float, default=10.0, help="the replicas' retention_seconds")
    ap.add_argument("--outcome", type=float, default=None, help="the replicas' outcome_seconds (default: theirs)")
    ap.add_argument("--base", type=int, default=20_000, help="the sample the last one is compared with")
    ap.add_argument("--settings", default="{}", help="more replica settings as JSON")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "soak.json"))
    ap.add_argument("--plot", default=None, metavar="FILE.png")
    ap.add_argument("--check", action="store_true", help="exit 1 when a bounded structure grows (CI)")
    ap.add_argument("--warmup", type=int, default=3, help="samples --check leaves out (the windows filling)")
    ap.add_argument("--workdir", default=None, help="keep the cluster's directory (logs) under this one")
    args = ap.parse_args()

    import coordinator

    settings = {"retention_seconds": args.retention, **json.loads(args.settings)}
    if args.outcome is not None:
        settings["outcome_seconds"] = args.outcome
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    started = time.time()
    with (
        (
            tempfile.TemporaryDirectory(prefix="mergetxn-soak-")
            if args.workdir is None
            else contextlib.nullcontext(tempfile.mkdtemp(prefix="mergetxn-soak-", dir=args.workdir))
        ) as work,
        coordinator.LocalCluster(work, replicas=args.replicas, settings=settings) as cluster,
    ):
        clients = [cluster.client(i) for i in range(args.replicas)]
        clients[0].create_table(TABLE, ten_rows(0).schema)
        settings_now = clients[0].call("info")["settings"]
        delay = int(settings_now.get("parts_to_delay_insert") or 0)
        throw = int(settings_now.get("parts_to_throw_insert") or 0)
        total, out = mp.Value("q", 0), mp.Queue()
        procs = [
            mp.Process(
                target=_writer,
                args=(cluster.replica_addresses[k % args.replicas], k + 1, args.writers, total, args.commits, out),
            )
            for k in range(args.writers)
        ]
        sampler = Sampler(cluster, clients, Path(cluster.storage_url), args.every, out)
        sampler.partial = Path(args.out).with_suffix(".partial.json")
        sampler.retention, sampler.lag = args.retention, 2 * float(clients[0].call("info")["settings"]["gc_interval"])
        t0 = time.monotonic()
        for p in procs:
            p.start()
        running = len(procs)
        while running:
            running -= not sampler.drain(5.0)
        load_seconds = time.monotonic() - t0
        for p in procs:
            p.join()
        failed = [p.exitcode for p in procs if p.exitcode != 0]
        if failed:
            gone = [i for i in range(args.replicas) if cluster.replica_pid(i) is None]
            raise SystemExit(
                f"soak: {len(failed)} writer(s) failed after {sampler.done:,} commits (exit codes {failed}); replicas "
                f"no longer running: {gone or 'none'} (their logs: {work}/replica-N/replica.log); the samples so far: "
                f"{sampler.partial}"
            )
        if sampler.window:
            sampler.take()
        settle = after_load(clients[0], delay)
        restart = restart_seconds(cluster, 0)
        for c in clients:
            c.close()
    result = {
        "time": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
        "commit": commit.stdout.strip(),
        "machine": f"{platform.platform()}, {os.cpu_count()} cores",
        "commits": args.commits,
        "writers": args.writers,
        "replicas": args.replicas,
        "settings": settings,
        "load_seconds": round(load_seconds, 1),
        "after_load": settle,
        "restart_seconds": restart,
        "targets": targets(sampler.samples, args.base),
        "samples": sampler.samples,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        plot(result, args.plot)
    print(json.dumps({k: result[k] for k in ("load_seconds", "restart_seconds", "targets")}))
    print(json.dumps({"under_delay_after_s": settle["under_delay_after_s"]}))
    if args.check:
        found = check(result, args.warmup, throw, delay)
        for line in found:
            print(f"soak check: {line}", file=sys.stderr)
        if found:
            raise SystemExit(1)
        print(f"soak check: no bounded structure grew over {len(result['samples']) - args.warmup} samples")


if __name__ == "__main__":
    main()
