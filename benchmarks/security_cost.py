#!/usr/bin/env python
"""The price of security: commit throughput and latency of a secured cluster (TLS, client
authentication, ZooKeeper ACLs and ZooKeeper over TLS: ``LocalCluster(secure=True)``) against an
unsecured one, the same workload, in one run.

Both clusters (1 replica each, the pure commit path) run at once, each on a fresh embedded
ZooKeeper server of its own (the secured cluster's serves TLS only and requires its identity,
as ``LocalCluster(secure=True)`` starts it); the cases alternate between them round by round
(plain, secure, plain, secure, ...) so that the VM's drift over minutes moves both sides alike.
Cases: benchmarks/commit_throughput.py's 10-row insert transactions, 4 writers, and its
metadata-only one-call commits (``commit_parts`` of pre-written parts), 16 clients (one process
each, each its own ``Client``: one TLS connection per writer, authenticated once as the admin
user, so every request also passes the replica's grant check). Per
case the best round of each side is reported, and the ratio secure/plain.

Also, less sensitive to a busy machine: the CPU time (server and client, one process) of one
RPC call on a persistent connection, plaintext against TLS + authenticated, on an in-process
``RpcServer`` answering inline (the I/O thread's path of begin, stage and commit).

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

CASES = [("insert_4_writers", "mergetxn_insert", 4), ("commit_parts_16_clients", "mergetxn_commit_parts", 16)]
LINKS_PER_WRITER_PER_S = 250  # pre-made part files per metadata-only writer and second (commit_throughput.py)


def rpc_cpu_per_call(calls: int, creds) -> float:
    """Microseconds of process CPU per call of a 200-byte request answered inline."""
    import threading

    from coordinator.wire.rpc import RpcClient, RpcServer

    def inline(action: str, args: dict, reply) -> bool:
        reply({"ok": True, "result": {"csn": 1, "id": args["id"]}})
        return True

    server = RpcServer(
        "127.0.0.1",
        0,
        lambda a, b: {"ok": True},
        inline=inline,
        tls=None if creds is None else creds.server_context(),
        authenticate=None if creds is None else creds.authenticator(),
    )
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    client = RpcClient(f"127.0.0.1:{server.port}", 10, None if creds is None else creds.client())
    args = {"id": "T1-4294967297-r0", "ops": ["x" * 150]}
    try:
        for _ in range(200):
            client.call("commit", args)
        t0 = time.process_time()
        for _ in range(calls):
            client.call("commit", args)
        return round((time.process_time() - t0) / calls * 1e6, 1)
    finally:
        client.close()
        server.shutdown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rpc-calls", type=int, default=20000)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "security_cost.json")
    a = ap.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, flush=True)

    from coordinator.wire.security import CLIENT_FILE, make_cluster_credentials, zk_client_args
    from mergetxn.local.cluster import LocalCluster
    from mergetxn.local.zkserver import ZooKeeperServer

    result: dict = {
        "machine": ct.machine(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rounds": [],
    }
    with tempfile.TemporaryDirectory(prefix="mtx-security-") as tmp:
        work = Path(tmp)
        creds = make_cluster_credentials(work / "rpc-creds")
        rpc = {"plain": [], "secure": []}
        for _ in range(3):
            rpc["plain"].append(rpc_cpu_per_call(a.rpc_calls, None))
            rpc["secure"].append(rpc_cpu_per_call(a.rpc_calls, creds))
        result["rpc_cpu_us_per_call"] = {k: min(v) for k, v in rpc.items()} | {"all": rpc}
        log(f"RPC CPU per call (us, best of 3): plain {min(rpc['plain'])}, TLS + auth {min(rpc['secure'])}")
        # The secured cluster's credentials first: its ZooKeeper serves with them, and
        # LocalCluster(secure=True) uses those it finds in its workdir.
        cluster_creds = make_cluster_credentials(work / "secure" / "security")
        with (
            ZooKeeperServer(work / "zookeeper") as plain_zk,
            ZooKeeperServer(work / "zookeeper-secure", credentials=cluster_creds) as secure_zk,
        ):
            ct.warm_up_zookeeper(plain_zk.address)
            ct.warm_up_zookeeper(secure_zk.address, **zk_client_args(cluster_creds))
            with (
                LocalCluster(work / "plain", replicas=1, zk_address=plain_zk.address, root="/plain") as plain,
                LocalCluster(
                    work / "secure", replicas=1, zk_address=secure_zk.address, root="/secure", secure=True
                ) as secure,
            ):
                sides = {
                    "plain": (plain, None, plain_zk),
                    "secure": (secure, str(secure.workdir / "security" / CLIENT_FILE), secure_zk),
                }
                for r in range(a.rounds):
                    rnd: dict = {}
                    for side, (cluster, creds, zk) in sides.items():
                        admin = cluster.client(0)
                        for case, kind, writers in CASES:
                            table = f"{ct.TABLE}_{case}_{r}"
                            admin.create_table(table, ct.ten_rows().schema, auto_merge=False)
                            params = {
                                "addresses": list(cluster.replica_addresses),
                                "table": table,
                                "credentials": creds,
                                "storage_root": cluster.storage_url,
                                "links": int((a.warmup + a.seconds) * LINKS_PER_WRITER_PER_S) + 200,
                            }
                            watch = {"zookeeper": zk.pid, "replica-0": cluster.replica_pid(0)}
                            t = ct.run_processes(kind, params, writers, a.warmup, a.seconds, watch)
                            rnd.setdefault(case, {})[side] = ct.summarize(t, a.seconds, writers=writers)
                            s = rnd[case][side]
                            log(
                                f"round {r} {side} {case}: {s['commits_per_s']} commits/s, p50 {s['p50_ms']} ms, "
                                f"p99 {s['p99_ms']} ms, errors {s.get('errors')}"
                            )
                        admin.close()
                    result["rounds"].append(rnd)
    best = {
        case: {
            side: max((rnd[case][side] for rnd in result["rounds"]), key=lambda s: s["commits_per_s"])
            for side in ("plain", "secure")
        }
        for case, _, _ in CASES
    }
    result["best"] = best
    result["ratios"] = {
        case: {
            "throughput_secure_over_plain": round(b["secure"]["commits_per_s"] / b["plain"]["commits_per_s"], 3),
            "p50_secure_over_plain": round(b["secure"]["p50_ms"] / b["plain"]["p50_ms"], 3),
            "per_round_throughput": [
                round(rnd[case]["secure"]["commits_per_s"] / rnd[case]["plain"]["commits_per_s"], 3)
                for rnd in result["rounds"]
            ],
        }
        for case, b in best.items()
    }
    result["ratios"]["rpc_cpu_per_call_secure_over_plain"] = round(
        result["rpc_cpu_us_per_call"]["secure"] / result["rpc_cpu_us_per_call"]["plain"], 3
    )
    log(json.dumps(result["ratios"], indent=2))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"written to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
