#!/usr/bin/env python
"""What ``durability="async"`` buys (YTsaurus: "units of milliseconds at the cost of
preservation"; docs/rules.md#atomicity-and-durability): one client writing one key per
transaction into a keys table with ``atomicity="none"``, begin + insert + commit in a loop, ``durability="sync"`` against
``"async"`` (then one ``flush()``), alternating round by round on one 1-replica LocalCluster.

Reported per side: the median and 90th percentile of ``tx.commit()`` alone, and the whole loop
per transaction including the final flush (the client's throughput). The best round of each.

    .venv/bin/python benchmarks/async_commits.py [--txns 300] [--rounds 3] [--out benchmarks/results/async_commits.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402

from mergetxn.local.cluster import LocalCluster  # noqa: E402

# Benchmarks load one partition of a table without merges with thousands of parts: the
# replicas they start take no backpressure (docs/rules.md, "Too many parts"), or they would
# measure its delays and refusals instead of the path they are about.
os.environ.setdefault("MERGETXN_PARTS_TO_DELAY_INSERT", "0")
os.environ.setdefault("MERGETXN_PARTS_TO_THROW_INSERT", "0")

SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.int64())])


def one_round(client, table: str, durability: str, txns: int) -> dict:
    """``txns`` transactions of one row each (50 distinct keys), then a flush."""
    commit_ms = []
    start = time.perf_counter()
    for i in range(txns):
        tx = client.begin(atomicity="none", durability=durability)
        tx.insert(table, pa.table({"k": pa.array([i % 50], pa.int64()), "v": pa.array([i], pa.int64())}))
        t = time.perf_counter()
        tx.commit()
        commit_ms.append((time.perf_counter() - t) * 1e3)
    client.flush()
    total = time.perf_counter() - start
    commit_ms.sort()
    return {
        "commit_median_ms": round(statistics.median(commit_ms), 3),
        "commit_p90_ms": round(commit_ms[int(0.9 * len(commit_ms))], 3),
        "per_txn_ms_with_flush": round(total / txns * 1e3, 3),
        "txns": txns,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--txns", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    best: dict[str, dict] = {}
    with LocalCluster(tempfile.mkdtemp(prefix="async-bench-"), replicas=1) as cluster:
        client = cluster.client(0)
        for r in range(a.rounds):
            for durability in ("sync", "async"):
                table = f"t_{durability}_{r}"  # a fresh table each round: the same history size
                client.create_table(table, SCHEMA, primary_key=("k",), conflict_policy="keys", atomicity="none")
                got = one_round(client, table, durability, a.txns)
                print(durability, r, got, flush=True)
                if durability not in best or got["per_txn_ms_with_flush"] < best[durability]["per_txn_ms_with_flush"]:
                    best[durability] = got
    print(json.dumps(best, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(best, indent=2) + "\n")


if __name__ == "__main__":
    main()
