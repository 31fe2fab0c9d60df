#!/usr/bin/env python
"""The price of security: commit throughput and latency of a secured cluster (TLS, client
authentication, ZooKeeper ACLs: ``LocalCluster(secure=True)``) against an unsecured one, the
same workload, in one run.

Both clusters (1 replica each, the pure commit path) run at once on one fresh embedded
ZooKeeper server, each under a root of its own; the cases alternate between them round by round
(plain, secure, plain, secure, ...) so that the VM's drift over minutes moves both sides alike.
Case: benchmarks/commit_throughput.py's 10-row insert transactions, 4 writers (one process
each, each its own ``Client``: one TLS connection per writer thread, authenticated once). Per
case the best round of each side is reported, and the ratio secure/plain.

    .venv/bin/python benchmarks/security_cost.py [--seconds 8] [--rounds 3] [--out benchmarks/results/security_cost.json]
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

CASES = [("insert_4_writers", "mergetxn_insert", 4)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "security_cost.json")
    a = ap.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, flush=True)

    from coordinator.security import CLIENT_FILE
    from mergetxn.cluster import LocalCluster
    from mergetxn.zkserver import ZooKeeperServer

    result: dict = {"machine": ct.machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "rounds": []}
    with tempfile.TemporaryDirectory(prefix="mtx-security-") as tmp:
        work = Path(tmp)
        with ZooKeeperServer(work / "zookeeper") as zk:
            ct.warm_up_zookeeper(zk.address)
            with LocalCluster(work / "plain", replicas=1, zk_address=zk.address, root="/plain") as plain, \
                    LocalCluster(work / "secure", replicas=1, zk_address=zk.address, root="/secure",
                                 secure=True) as secure:
                sides = {"plain": (plain, None),
                         "secure": (secure, str(secure.workdir / "security" / CLIENT_FILE))}
                for r in range(a.rounds):
                    rnd: dict = {}
                    for side, (cluster, creds) in sides.items():
                        admin = cluster.client(0)
                        for case, kind, writers in CASES:
                            table = f"{ct.TABLE}_{case}_{r}"
                            admin.create_table(table, ct.ten_rows().schema, auto_merge=False)
                            params = {"addresses": list(cluster.replica_addresses), "table": table,
                                      "credentials": creds}
                            watch = {"zookeeper": zk.pid, "replica-0": cluster.replica_pid(0)}
                            t = ct.run_processes(kind, params, writers, a.warmup, a.seconds, watch)
                            rnd.setdefault(case, {})[side] = ct.summarize(t, a.seconds, writers=writers)
                            s = rnd[case][side]
                            log(f"round {r} {side} {case}: {s['commits_per_s']} commits/s, p50 {s['p50_ms']} ms, "
                                f"p99 {s['p99_ms']} ms, errors {s.get('errors')}")
                        admin.close()
                    result["rounds"].append(rnd)
    best = {case: {side: max((rnd[case][side] for rnd in result["rounds"]), key=lambda s: s["commits_per_s"])
                   for side in ("plain", "secure")} for case, _, _ in CASES}
    result["best"] = best
    result["ratios"] = {
        case: {
            "throughput_secure_over_plain": round(b["secure"]["commits_per_s"] / b["plain"]["commits_per_s"], 3),
            "p50_secure_over_plain": round(b["secure"]["p50_ms"] / b["plain"]["p50_ms"], 3),
            "per_round_throughput": [round(rnd[case]["secure"]["commits_per_s"] / rnd[case]["plain"]["commits_per_s"], 3)
                                     for rnd in result["rounds"]],
        }
        for case, b in best.items()
    }
    log(json.dumps(result["ratios"], indent=2))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"written to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
