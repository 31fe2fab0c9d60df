#!/usr/bin/env python
"""A keys table read by ``scan`` in bounded memory: peak memory and time.

One 1-replica LocalCluster; a keys table (``k int64`` key, ``v int64``, ``s string``) of
``--keys`` keys (10,000,000) loaded in ``--commits`` (10) commits of shuffled keys, then
``--updates`` (5) update-mode upserts of 1% of the keys each (``v`` only: ``s`` carried), auto
merge off so every version stays. Then, each in a fresh process (so the peak is its own):
``client.scan(t)`` with the default budget (256 MiB), writing each table it yields to a Parquet
file as ``mergetxn read --output`` does, against the same scan with an unbounded budget (each
partition folded at once: the code path every scan took before, ``_read_keys``). Reported: the
process's peak RSS (``ru_maxrss``), Arrow's peak (``max_memory``), seconds, rows, tables yielded.

    .venv/bin/python benchmarks/keys_scan.py [--keys 10000000] [--out benchmarks/results/keys_scan.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(os.environ.get("MERGETXN_CODE") or Path(__file__).resolve().parent.parent)
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

TABLE = "kscan"
SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.int64()), pa.field("s", pa.string())])

SCANNER = """
import json, resource, sys, time
import pyarrow as pa, pyarrow.parquet as pq
import coordinator

# Benchmarks load one partition of a table without merges with thousands of parts: the
# replicas they start take no backpressure (docs/rules.md, "Too many parts"), or they would
# measure its delays and refusals instead of the path they are about.
os.environ.setdefault("MERGETXN_PARTS_TO_DELAY_INSERT", "0")
os.environ.setdefault("MERGETXN_PARTS_TO_THROW_INSERT", "0")
address, table, budget, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
client = coordinator.connect(address)
pool = pa.default_memory_pool()
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
rows = tables = 0
with client.scan(table, memory_budget=budget) as (snap, metas, parts):
    schema = client.table_at(table, snap).schema
    with pq.ParquetWriter(out, schema) as w:
        for t in parts:
            w.write_table(t)
            rows += t.num_rows
            tables += 1
            del t
print(json.dumps({"seconds": time.perf_counter() - t0, "rows": rows, "tables": tables,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rss_before_mb": rss0 / 1024, "arrow_peak_mb": pool.max_memory() / 2**20}))
"""


def scan(address: str, budget: int, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", SCANNER, address, TABLE, str(budget), str(out)], capture_output=True, text=True, env=env
    )
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=10_000_000)
    ap.add_argument("--commits", type=int, default=10)
    ap.add_argument("--updates", type=int, default=5)
    ap.add_argument("--budget", type=int, default=256 << 20)
    ap.add_argument("--skip-unbounded", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from coordinator import LocalCluster

    result: dict = {"keys": args.keys, "commits": args.commits, "updates": args.updates, "budget": args.budget}
    with tempfile.TemporaryDirectory(prefix="keys_scan_") as tmp, LocalCluster(Path(tmp) / "c", replicas=1) as cl:
        c = cl.client(0)
        c.create_table(
            TABLE,
            SCHEMA,
            primary_key=("k",),
            conflict_policy="keys",
            auto_merge=False,
            txn_max_rows=2 * args.keys,
            txn_max_seconds=7200,
        )
        t0 = time.perf_counter()
        order = pc.sort_indices(pc.random(args.keys, initializer=24)).cast(pa.int64())  # shuffled keys
        step = -(-args.keys // args.commits)
        for at in range(0, args.keys, step):
            chunk = order.slice(at, step)
            data = pa.table({"k": chunk, "v": chunk, "s": pc.cast(chunk, pa.string())}, schema=SCHEMA)
            with c.transaction() as tx:
                tx.insert(TABLE, data)
        for i in range(args.updates):
            ks = (
                pc.sort_indices(pc.random(args.keys, initializer=100 + i))
                .cast(pa.int64())
                .slice(0, max(1, args.keys // 100))
            )
            with c.transaction() as tx:
                tx.upsert(TABLE, pa.table({"k": ks, "v": pc.multiply(ks, 0)}), update=True)
        result["load_seconds"] = time.perf_counter() - t0
        parts = c.parts(TABLE)
        result["parts"] = parts.num_rows
        result["file_mb"] = sum(os.path.getsize(p) for p in Path(cl.storage_url).rglob("*.parquet")) / 2**20
        print("loaded", json.dumps(result), flush=True)
        result["bounded"] = scan(cl.replica_addresses[0], args.budget, Path(tmp) / "bounded.parquet")
        print("bounded", json.dumps(result["bounded"]), flush=True)
        if not args.skip_unbounded:
            result["unbounded"] = scan(cl.replica_addresses[0], 1 << 50, Path(tmp) / "whole.parquet")
            print("unbounded", json.dumps(result["unbounded"]), flush=True)
        result["load_average"] = os.getloadavg()
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
