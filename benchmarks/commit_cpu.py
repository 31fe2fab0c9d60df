#!/usr/bin/env python
"""Where a commit's CPU goes: sequential 10-row ``client.insert`` calls on a 1-replica
LocalCluster, with the replica's default thresholds (each insert inlined in its log entry, no
part file: docs/architecture/small-writes.md) and with ``inline_rows`` 0 (each insert a part
file written by the writer), one after the other in one run.

Per case: commits/s and p50 of the insert; CPU per commit of each process (the writer, the
replica, ZooKeeper's JVM: /proc and the writer's own clock) and, inside the replica, by thread and
by function (a CPU-weighted stack sampler, benchmarks/sampler/sitecustomize.py, loaded into the
replica only: each thread's CPU clock read every 4 ms and charged to the stack it is in, so
that a few microseconds of a wait's wake-up count where the thread was found). Background merges
(the flushes of inlined parts among them) and cleanup run as by default; their CPU is in the
figures, as it is in a real replica's.

    .venv/bin/python benchmarks/commit_cpu.py [--commits 5000] [--out benchmarks/results/commit_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import commit_throughput as ct  # noqa: E402

SAMPLER = ROOT / "benchmarks" / "sampler"
WARMUP = 500  # unmeasured inserts first (the JIT of ZooKeeper, the caches, a first flush)


def _cpu(pid: int | None) -> float:
    """CPU seconds (user and system, every thread) of process ``pid`` so far; 0 without one."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sampled(folder: Path, label: str) -> dict:
    """The sampler's output for ``label`` (it writes it once the control file is emptied)."""
    (folder / "control").write_text("")
    out = folder / f"{label}.json"
    deadline = time.monotonic() + 10
    while not out.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the replica's sampler wrote no {out.name}: {list(folder.iterdir())}")
        time.sleep(0.1)
    return json.loads(out.read_text())


PUTS = [0]  # files the writer (this process) put into storage


def _count_puts() -> None:
    from parts.io.storage import Storage

    put = Storage.put

    def counted(self, *a, **k):  # type: ignore[no-untyped-def]
        PUTS[0] += 1
        return put(self, *a, **k)

    Storage.put = counted  # type: ignore[method-assign]


def run_case(label: str, inline: bool, commits: int, folder: Path) -> dict:
    from mergetxn.local.cluster import LocalCluster

    os.environ["MERGETXN_INLINE_ROWS"] = "100" if inline else "0"  # the replica's setting
    with tempfile.TemporaryDirectory(prefix="mtx-cpu-") as tmp, LocalCluster(tmp, replicas=1) as cluster:
        client = cluster.client(0)
        client.create_table("t", ct.ten_rows().schema)
        for seed in range(WARMUP):
            client.insert("t", ct.ten_rows(seed))
        pids = {"replica": cluster.replica_pid(0), "zookeeper": cluster._zk().pid}
        (folder / "control").write_text(label)
        time.sleep(0.5)  # the sampler looks at its control file every 0.2 s
        before = {k: _cpu(p) for k, p in pids.items()} | {"writer": time.process_time()}
        puts = PUTS[0]
        lat = []
        t0 = time.perf_counter()
        for seed in range(commits):
            data = ct.ten_rows(seed)
            s = time.perf_counter()
            client.insert("t", data)
            lat.append(time.perf_counter() - s)
        seconds = time.perf_counter() - t0
        after = {k: _cpu(p) for k, p in pids.items()} | {"writer": time.process_time()}
        puts = PUTS[0] - puts
        profile = _sampled(folder, label)
        client.close()
    lat.sort()
    per = {k: round((after[k] - before[k]) / commits * 1e3, 3) for k in before}

    def ms(v: float) -> float:
        return round(v / commits * 1e3, 4)

    return {
        "inlined": inline,
        "commits": commits,
        "commits_per_s": round(commits / seconds, 1),
        "p50_ms": round(lat[len(lat) // 2] * 1e3, 3),
        "p99_ms": round(lat[int(len(lat) * 0.99)] * 1e3, 3),
        "cpu_ms_per_commit": per | {"all": round(sum(per.values()), 3)},
        "writer_files_per_commit": round(puts / commits, 3),
        "replica_sampled_ms_per_commit": ms(profile["cpu_seconds"]),
        "replica_by_thread_ms": {k: ms(v) for k, v in profile["by_thread"].items() if ms(v) >= 0.001},
        "replica_inclusive_ms": {k: ms(v) for k, v in list(profile["inclusive"].items())[:60]},
        "replica_self_ms": {k: ms(v) for k, v in list(profile["self"].items())[:30]},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commits", type=int, default=5000)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "commit_cpu.json")
    a = ap.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="mtx-sampler-"))
    os.environ["MERGETXN_SAMPLER_DIR"] = str(folder)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(SAMPLER), str(ROOT), os.environ.get("PYTHONPATH", "")])
    _count_puts()
    result: dict = {
        "machine": ct.machine(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": ct.code_commit(ROOT),
        "load_before": os.getloadavg(),
        "cases": {},
    }
    for label, inline in (("inlined", True), ("part_file", False)):
        case = run_case(label, inline, a.commits, folder)
        result["cases"][label] = case
        keys = ("commits_per_s", "p50_ms", "cpu_ms_per_commit", "replica_by_thread_ms", "writer_files_per_commit")
        print(label, json.dumps({k: case[k] for k in keys}), flush=True)
    result["load_after"] = os.getloadavg()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
