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

``--only brute``: a legitimate client's call latency (``snapshot``, p50/p90/max) on a secured
1-replica LocalCluster, quiet and then under a brute force of wrong-secret logins from 100
loopback addresses (127.0.1.1-100, ``--brute-rate`` a second, from a process of its own; each
naming the admin, or with ``--many-users`` a made-up user name each), for
each ``--code`` root (default: this tree; e.g. ``--code /work/main --code .`` measures another
checkout's replicas against this one's), the roots alternating round by round. Each root runs
in a process of its own with that root first on ``sys.path`` (its replicas run its code).

    .venv/bin/python benchmarks/security_cost.py --only brute [--code ROOT ...] [--brute-rounds 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = Path(os.environ.get("MERGETXN_BENCH_CODE") or ROOT)  # --only brute: the code a side measures
for p in (CODE, ROOT / "benchmarks"):
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


BRUTE_SOURCES = [f"127.0.1.{i}" for i in range(1, 101)]


def percentiles(latencies: list[float]) -> dict:
    """p50, p90 and max of call latencies, in ms."""
    ms = sorted(x * 1000 for x in latencies)
    return {
        "calls": len(ms),
        "p50_ms": round(statistics.median(ms), 3),
        "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 3),
        "max_ms": round(ms[-1], 3),
    }


def call_latencies(client, seconds: float) -> list[float]:
    """``snapshot`` calls one after another (1 ms apart) for ``seconds``: each one's latency."""
    out: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        client.snapshot()
        out.append(time.perf_counter() - t0)
        time.sleep(0.001)
    return out


def attack(address: str, user: str, rate: float, seconds: float, many_users: bool = False, threads: int = 8) -> dict:
    """Wrong-secret logins naming ``user`` (``many_users``: a made-up user name each) at
    ``rate`` a second in all, from BRUTE_SOURCES in turn (TLS, the server's certificate not
    checked): how each was answered."""
    import socket
    import ssl

    from coordinator.wire.rpc import frame, read_frame

    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    host, port = address.rsplit(":", 1)
    counts: dict[str, int] = {}
    lock = threading.Lock()
    start = time.monotonic()
    slots = iter(range(int(rate * seconds)))

    def one(source: str, user: str) -> str:
        try:
            with socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0)) as raw:
                with ctx.wrap_socket(raw, server_hostname=host) as sock:
                    sock.sendall(frame({"a": "auth", "b": {"user": user, "secret": "not-the-secret-" + "x" * 28}}))
                    reply = read_frame(sock.makefile("rb"))
        except (OSError, EOFError, ValueError) as exc:
            return f"error: {type(exc).__name__}"
        message = str((reply.get("error") or {}).get("message", ""))
        if reply.get("ok"):
            return "accepted"
        if "wrong user or secret" in message:
            return "checked"
        if "too many failed logins" in message:
            return "throttled"
        return f"{(reply.get('error') or {}).get('type')}"

    def worker() -> None:
        while True:
            with lock:
                i = next(slots, None)
            if i is None:
                return
            time.sleep(max(0.0, start + i / rate - time.monotonic()))
            outcome = one(BRUTE_SOURCES[i % len(BRUTE_SOURCES)], f"guess{i}" if many_users else user)
            with lock:
                counts[outcome] = counts.get(outcome, 0) + 1

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = time.monotonic() - start
    return {"attempts": sum(counts.values()), "seconds": round(elapsed, 2), "outcomes": counts}


def brute_side(quiet: float, seconds: float, rate: float, many_users: bool) -> dict:
    """One side of ``--only brute`` (this process runs CODE's replicas): the quiet latencies,
    then those under the attack (a process of its own), and the attack's outcomes."""
    from mergetxn.local.cluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="mtx-brute-") as tmp, LocalCluster(tmp, replicas=1, secure=True) as c:
        client = c.client(0)
        call_latencies(client, 1.0)  # warm-up
        load = [os.getloadavg()[0]]
        quiet_lat = call_latencies(client, quiet)
        args = json.dumps(
            {
                "address": c.replica_addresses[0],
                "user": c.credentials.user,
                "rate": rate,
                "seconds": seconds,
                "many_users": many_users,
            }
        )
        env = {**os.environ, "MERGETXN_BENCH_CODE": str(CODE)}
        proc = subprocess.Popen(
            [sys.executable, __file__, "--attack", args], stdout=subprocess.PIPE, text=True, env=env
        )
        attack_lat = call_latencies(client, seconds)
        out, _ = proc.communicate(timeout=seconds + 120)
        load.append(os.getloadavg()[0])
        client.close()
    quiet_s, attack_s = percentiles(quiet_lat), percentiles(attack_lat)
    return {
        "code": str(CODE),
        "commit": _commit(CODE),
        "quiet": quiet_s,
        "attack": attack_s,
        "p50_attack_over_quiet": round(attack_s["p50_ms"] / quiet_s["p50_ms"], 2),
        "brute_force": json.loads(out.strip().splitlines()[-1]),
        "load_average": load,
    }


def _commit(root: Path) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main_brute(a: argparse.Namespace) -> int:
    """``--only brute``: each --code root's side in a process of its own, alternating by round."""
    codes = [str(Path(c).resolve()) for c in (a.code or [ROOT])]
    result: dict = {
        "machine": ct.machine(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rate_per_s": a.brute_rate,
        "user_names": "a made-up one per login" if a.many_users else "the admin's",
        "sources": len(BRUTE_SOURCES),
        "rounds": [],
    }
    for r in range(a.brute_rounds):
        rnd = {}
        for code in codes:
            side = json.dumps(
                {"quiet": a.quiet_seconds, "seconds": a.brute_seconds, "rate": a.brute_rate, "many_users": a.many_users}
            )
            proc = subprocess.run(
                [sys.executable, __file__, "--side", side],
                env={**os.environ, "MERGETXN_BENCH_CODE": code, "PYTHONPATH": code},
                capture_output=True,
                text=True,
                cwd=code,
                timeout=600,
            )
            if proc.returncode:
                raise SystemExit(f"the side of {code} failed:\n{proc.stderr[-4000:]}")
            rnd[code] = s = json.loads(proc.stdout.strip().splitlines()[-1])
            print(
                f"round {r} {code} ({s['commit']}): quiet p50 {s['quiet']['p50_ms']} ms, p90 {s['quiet']['p90_ms']}, "
                f"max {s['quiet']['max_ms']}; attacked p50 {s['attack']['p50_ms']} ms, p90 {s['attack']['p90_ms']}, "
                f"max {s['attack']['max_ms']} ({s['p50_attack_over_quiet']}x); {s['brute_force']}; "
                f"load {s['load_average']}",
                flush=True,
            )
        result["rounds"].append(rnd)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {a.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rpc-calls", type=int, default=20000)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--only", choices=["brute"], help="one measurement only: brute (logins under a brute force)")
    ap.add_argument("--code", action="append", help="--only brute: a checkout whose replicas to measure (repeat)")
    ap.add_argument("--brute-rounds", type=int, default=2)
    ap.add_argument("--brute-rate", type=float, default=50.0, help="wrong-secret logins a second in all")
    ap.add_argument("--brute-seconds", type=float, default=10.0)
    ap.add_argument("--quiet-seconds", type=float, default=5.0)
    ap.add_argument("--many-users", action="store_true", help="--only brute: each login names another made-up user")
    ap.add_argument("--side", help=argparse.SUPPRESS)
    ap.add_argument("--attack", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.attack:
        print(json.dumps(attack(**json.loads(a.attack))))
        return 0
    if a.side:
        print(json.dumps(brute_side(**json.loads(a.side))))
        return 0
    if a.only == "brute":
        a.out = a.out or ROOT / "benchmarks" / "results" / "security_brute.json"
        return main_brute(a)
    a.out = a.out or ROOT / "benchmarks" / "results" / "security_cost.json"

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
