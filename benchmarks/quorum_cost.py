#!/usr/bin/env python
"""The price of a real quorum: commit throughput and latency on 3 simulated hosts against one
ZooKeeper server on loopback, the same workload, in one run.

* ``hosts``: ``mergetxn.chaos.hosts.NamespaceCluster``: 3 network namespaces on a bridge, a
  ZooKeeper ensemble of 3 (one member per host) and a replica per host, all started through the
  CLI; writers in the root namespace reach the replicas over the bridge (veth pairs, the kernel's
  network stack, no added delay). A commit is a quorum write: the leader waits for one follower.
  The replicas' WALs stay on the work directory's disk, as in the loopback case (the chaos
  harness puts them on tmpfs, where an fsync costs nothing).
* ``loopback``: ``mergetxn.local.cluster.LocalCluster``: one standalone ZooKeeper server and 3 replicas
  on 127.0.0.1 (what the other benchmarks and the tests use).

Cases (benchmarks/commit_throughput.py's writers, one process each): 10-row insert transactions
with 1 writer and with 6 writers spread over the 3 replicas. Needs root (network namespaces). Each
case also reports the machine's busy CPU per commit (``/proc/stat``), the writers' apart: on a
quiet machine the rest is ZooKeeper's members and the replicas, what a quorum adds.

    .venv/bin/python benchmarks/quorum_cost.py [--seconds 15] [--out benchmarks/results/quorum_cost.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import commit_throughput as ct  # noqa: E402

CASES = [("insert_1_writer", 1), ("insert_6_writers", 6)]


def bench(cluster, name: str, warmup: float, seconds: float, log) -> dict:
    from mergetxn.client import Client

    admin = Client(cluster.replica_addresses[0])
    out = {}
    for case, writers in CASES:
        table = f"{ct.TABLE}_{case}"
        admin.create_table(table, ct.ten_rows().schema, auto_merge=False)
        params = {"addresses": list(cluster.replica_addresses), "table": table}
        # watch={}: the machine's busy CPU in the window is counted (/proc/stat), the writers' apart;
        # the rest is ZooKeeper's members and the replicas (nothing else runs in a quiet run).
        t = ct.run_processes("mergetxn_insert", params, writers, warmup, seconds, watch={})
        out[case] = ct.summarize(t, seconds, writers=writers)
        if t.count:
            out[case]["cpu_ms_per_commit"] = {
                "zookeeper_and_replicas": round(t.cpu.get("other processes", 0.0) * 1000 / t.count, 3),
                "writers": round(t.cpu.get("writers", 0.0) * 1000 / t.count, 3),
            }
        log(
            f"  {name} {case}: {out[case]['commits_per_s']} commits/s, p50 {out[case]['p50_ms']} ms, "
            f"p99 {out[case]['p99_ms']} ms, CPU ms per commit {out[case].get('cpu_ms_per_commit')}"
        )
    admin.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "quorum_cost.json")
    a = ap.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, flush=True)

    from mergetxn.chaos.hosts import NamespaceCluster, namespaces_unavailable
    from mergetxn.local.cluster import LocalCluster

    why = namespaces_unavailable()
    if why:
        log(f"network namespaces unavailable: {why}")
        return 2
    result: dict = {"machine": ct.machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with tempfile.TemporaryDirectory(prefix="mtx-quorum-") as tmp:
        work = Path(tmp)
        log("3 hosts (network namespaces, ensemble of 3):")
        with NamespaceCluster(work / "hosts", hosts=3, session_timeout=10.0, wal_tmpfs=False) as cluster:
            result["hosts"] = bench(cluster, "hosts", a.warmup, a.seconds, log)
        log("loopback (one ZooKeeper server, 3 replicas on 127.0.0.1):")
        with LocalCluster(work / "loopback", replicas=3) as cluster:
            result["loopback"] = bench(cluster, "loopback", a.warmup, a.seconds, log)
    result["ratios"] = {
        case: {
            "throughput_hosts_over_loopback": round(
                result["hosts"][case]["commits_per_s"] / result["loopback"][case]["commits_per_s"], 2
            ),
            "p50_hosts_over_loopback": round(result["hosts"][case]["p50_ms"] / result["loopback"][case]["p50_ms"], 2),
            "p99_hosts_over_loopback": round(result["hosts"][case]["p99_ms"] / result["loopback"][case]["p99_ms"], 2),
        }
        for case, _ in CASES
    }
    log(json.dumps(result["ratios"], indent=2))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"written to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
