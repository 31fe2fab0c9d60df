"""Commit throughput by conflict policy: the same concurrent loads on a ``parts``, an ``append``
and a ``maxcompute`` table (one target each, 1-replica LocalCluster), so that a change to how the
committer batches commits that check a target shows.

    .venv/bin/python benchmarks/policy_throughput.py [--seconds 5] [--out benchmarks/results/policy_throughput.json]

Under ``maxcompute`` concurrent INSERTs into one target conflict by the rules (docs/rules.md#policy-maxcompute:
the later fails), so its writers mostly retry: its rate is that of the rules, not of the committer.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import commit_throughput as ct  # noqa: E402

CASES = [("mergetxn_insert", 4), ("mergetxn_metadata", 16)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--policies", default="parts,append,maxcompute")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "policy_throughput.json"))
    a = ap.parse_args(argv)
    from mergetxn.local.cluster import LocalCluster

    out: dict[str, dict] = {}
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="mergetxn-policy-") as work, LocalCluster(work, replicas=1) as cluster:
        admin = cluster.client(0)
        for policy in a.policies.split(","):
            for kind, writers in CASES:
                table = f"p_{policy}_{kind}"
                admin.create_table(table, ct.ten_rows().schema, conflict_policy=policy, auto_merge=False)
                params = {
                    "addresses": cluster.replica_addresses,
                    "table": table,
                    "storage_root": cluster.storage_url,
                    "links": int((a.warmup + a.seconds) * ct.LINKS_PER_WRITER_PER_S) + 500,
                }
                timings = ct.run_processes(
                    kind, params, writers, a.warmup, a.seconds, {"replica": cluster.replica_pid(0)}
                )
                name = f"{policy}_{kind.removeprefix('mergetxn_')}_{writers}w"
                out[name] = ct.summarize(timings, a.seconds, writers=writers)
                print(
                    f"{name}: {out[name]['commits_per_s']} commits/s (p50 {out[name]['p50_ms']} ms, "
                    f"retries {out[name]['retries']})",
                    flush=True,
                )
        committer = admin.call("info")["committer"]
    report = {
        "benchmark": "policy_throughput",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "seconds_per_case": a.seconds,
        "machine": ct.machine(),
        "results": out,
        "committer": committer,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
