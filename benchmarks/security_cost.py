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
``--only commit``: the price of checking every part's metadata against its file at stage time
(docs/rules.md, "What a part's metadata is checked against"), paired: one writer's sequential
10-row inserts (``client.insert``, one replica) where the replica checks every other stage and
skips the check on the others (benchmarks/replica_probe), so that checked and unchecked inserts
interleave on the same machine, cluster and table; latency of each half (after a tenth of
warm-up) and the check's CPU per insert, with the replica's default thresholds (inserts
inlined) and with ``inline_rows`` 0 (each insert a part file). With ``--old CHECKOUT``, also
that checkout's replicas against this tree's, rounds alternating (both their own cluster). And
the verification's cost per MB of a large part (read, crc32, footer, statistics), in this process.

    .venv/bin/python benchmarks/security_cost.py --only commit [--paired-commits 20000] [--old DIR --commits 500 --rounds 3]
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
        "commit": ct.code_commit(CODE),
        "quiet": quiet_s,
        "attack": attack_s,
        "p50_attack_over_quiet": round(attack_s["p50_ms"] / quiet_s["p50_ms"], 2),
        "brute_force": json.loads(out.strip().splitlines()[-1]),
        "load_average": load,
    }


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


# -- the commit path with metadata checks (--only commit) -------------------------------------
_INSERT_WORKER = r"""
import json, os, sys, tempfile, time
sys.path.insert(0, sys.argv[1] + "/benchmarks")
import commit_throughput as ct
from mergetxn.local.cluster import LocalCluster
import replicas
def cpu(pid):  # the replica process's CPU seconds, every thread (user and system)
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
with tempfile.TemporaryDirectory(prefix="mtx-meta-") as tmp, LocalCluster(tmp, replicas=1) as cluster:
    client = cluster.client(0)
    client.create_table("t", ct.ten_rows().schema, auto_merge=False)
    pid = cluster.replica_pid(0)
    print(json.dumps({"ready": replicas.__file__}), flush=True)
    seed = 0
    for line in sys.stdin:
        n = int(line)
        lat = []
        c0 = cpu(pid)
        t0 = time.perf_counter()
        for _ in range(n):
            data = ct.ten_rows(seed)
            seed += 1
            s = time.perf_counter()
            client.insert("t", data)
            lat.append(time.perf_counter() - s)
        seconds = time.perf_counter() - t0
        print(json.dumps({"seconds": seconds, "latencies": lat, "replica_cpu": cpu(pid) - c0}), flush=True)
    client.close()
"""


_PAIRED_WORKER = r"""
import json, os, sys, tempfile, time
root, probes, commits = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, root + "/benchmarks")
import commit_throughput as ct
from mergetxn.local.cluster import LocalCluster
os.environ["PYTHONPATH"] = os.pathsep.join([root, root + "/benchmarks/replica_probe"])  # the replica's only
os.environ["MERGETXN_BENCH_PROBE"] = probes
os.environ["MERGETXN_BENCH_PROBE_SKIP_VERIFY"] = "alternate"
with tempfile.TemporaryDirectory(prefix="mtx-paired-") as tmp, LocalCluster(tmp, replicas=1) as cluster:
    client = cluster.client(0)
    client.create_table("t", ct.ten_rows().schema)  # merges on: 20,000 inserts stay few parts, as in use
    pid = cluster.replica_pid(0)
    lat = []
    for seed in range(commits):
        data = ct.ten_rows(seed)
        s = time.perf_counter()
        client.insert("t", data)
        lat.append(time.perf_counter() - s)
    snap = ct._probe_ask(os.path.join(probes, f"probe-{pid}.sock"), "snap")
    inlined = int(client.parts("t").column("inlined").to_pylist().count(True)) if commits else 0
    print(json.dumps({"latencies": lat, "verify": snap["timers"].get("verify_claims"), "inlined_left": inlined}))
    client.close()
"""


def paired_cost(commits: int, inline: bool) -> dict:
    """Sequential 10-row inserts on one replica whose stage-time check runs on every other one
    (benchmarks/replica_probe, ``MERGETXN_BENCH_PROBE_SKIP_VERIFY=alternate``): the checked and
    the unchecked inserts interleave, so both halves see the same machine, cluster and table.
    ``inline``: the replica's default thresholds (10-row inserts inlined); else ``inline_rows`` 0
    (each insert a part file)."""
    with tempfile.TemporaryDirectory(prefix="mtx-probe-") as probes:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        if not inline:
            env["MERGETXN_INLINE_ROWS"] = "0"
        out = subprocess.run(
            [sys.executable, "-c", _PAIRED_WORKER, str(ROOT), probes, str(commits)],
            capture_output=True,
            text=True,
            env=env,
            cwd=str(ROOT),
            check=True,
            timeout=3600,
        ).stdout
    got = json.loads(out.strip().splitlines()[-1])
    calls, check_cpu = got["verify"]
    assert calls == commits, f"the replica checked {calls} stages for {commits} inserts: the pairing is off"
    lat = got["latencies"][commits // 10 :]  # the first tenth warms up
    start = commits // 10
    checked = sorted(x for i, x in enumerate(lat, start) if i % 2 == 0)
    unchecked = sorted(x for i, x in enumerate(lat, start) if i % 2 == 1)

    def summary(xs: list[float]) -> dict:
        return {
            "p50_ms": round(xs[len(xs) // 2] * 1e3, 3),
            "p90_ms": round(xs[int(len(xs) * 0.9)] * 1e3, 3),
            "mean_ms": round(statistics.fmean(xs) * 1e3, 3),
        }

    res = {"inlined": inline, "commits": commits, "checked": summary(checked), "unchecked": summary(unchecked)}
    res["p50_checked_over_unchecked"] = round(res["checked"]["p50_ms"] / res["unchecked"]["p50_ms"], 3)
    res["mean_checked_over_unchecked"] = round(res["checked"]["mean_ms"] / res["unchecked"]["mean_ms"], 3)
    res["check_cpu_us"] = round(check_cpu / ((calls + 1) // 2) * 1e6, 1)
    return res


def _insert_worker(root: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(root))
    proc = subprocess.Popen(
        [sys.executable, "-c", _INSERT_WORKER, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(root),
    )
    assert proc.stdout is not None
    ready = json.loads(proc.stdout.readline())
    print(f"worker on {ready['ready']}", flush=True)
    return proc


def _insert_round(proc: subprocess.Popen, commits: int) -> dict:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{commits}\n")
    proc.stdin.flush()
    got = json.loads(proc.stdout.readline())
    lat = sorted(got["latencies"])
    return {
        "commits_per_s": round(commits / got["seconds"], 1),
        "p50_ms": round(lat[len(lat) // 2] * 1e3, 3),
        "p90_ms": round(lat[int(len(lat) * 0.9)] * 1e3, 3),
        "mean_ms": round(sum(lat) / len(lat) * 1e3, 3),
        "replica_cpu_us_per_commit": round(got["replica_cpu"] / commits * 1e6),
    }


def verification_per_mb(megabytes: int = 64) -> dict:
    """Milliseconds per MB of checking one large part against its metadata, by step: at stage
    (``all``: read, crc32, footer, statistics from the footer) and in ``mergetxn check``
    (``check_decoded``: every column decoded)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from parts.io.format import checksum_of, file_claims, write_part
    from parts.io.storage import Storage

    rows = megabytes * 1024 * 1024 // 24
    data = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "name": pa.array([f"row-{i % 100_000}" for i in range(rows)]),
            "value": pa.array([i * 0.5 for i in range(rows)], pa.float64()),
        }
    )
    with tempfile.TemporaryDirectory(prefix="mtx-meta-mb-") as tmp:
        storage = Storage(tmp)
        meta = write_part(storage, "t", [], (), data, "bench", sidecar=False)
        mb = meta.size / 1e6
        steps: dict[str, list[float]] = {"read": [], "crc32": [], "footer": [], "all": [], "check_decoded": []}
        for _ in range(3):
            t0 = time.perf_counter()
            raw = storage.get(meta.path)
            t1 = time.perf_counter()
            checksum_of(raw)
            t2 = time.perf_counter()
            pq.ParquetFile(pa.BufferReader(raw)).metadata
            t3 = time.perf_counter()
            assert file_claims(storage.get(meta.path), meta, data.schema) is None
            t4 = time.perf_counter()
            assert file_claims(storage.get(meta.path), meta, data.schema, decoded=True) is None
            t5 = time.perf_counter()
            for k, took in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                steps[k].append(round(took * 1e3 / mb, 3))
    return {"part_mb": round(mb, 1), "rows": rows} | {f"{k}_ms_per_mb": min(v) for k, v in steps.items()}


def verification_small_us(calls: int = 3000) -> dict:
    """Microseconds of one stage-time check of a 10-row insert's part (read, crc32, footer, columns,
    statistics), and of its steps alone, in this process (best of 3)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from parts.io.format import checksum_of, file_claims, write_part
    from parts.io.storage import Storage

    data = ct.ten_rows()
    with tempfile.TemporaryDirectory(prefix="mtx-meta-small-") as tmp:
        storage = Storage(tmp)
        meta = write_part(storage, "t", [], (), data, "bench", sidecar=False)
        raw = storage.get(meta.path)
        steps = {
            "read": lambda: storage.get(meta.path),
            "crc32": lambda: checksum_of(raw),
            "footer": lambda: pq.ParquetFile(pa.BufferReader(raw)).metadata,
            "all": lambda: file_claims(storage.get(meta.path), meta, data.schema),
        }
        out = {}
        for name, step in steps.items():
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                for _ in range(calls):
                    step()
                best = min(best, (time.perf_counter() - t0) / calls)
            out[f"{name}_us"] = round(best * 1e6, 1)
    return {"part_bytes": meta.size} | out


def commit_cost(old: Path, commits: int, rounds: int) -> dict:
    """Sequential 10-row inserts, old code against this tree, alternated round by round."""
    sides = {"old": _insert_worker(old), "new": _insert_worker(ROOT)}
    out: dict = {"load_before": os.getloadavg(), "rounds": []}
    try:
        for r in range(rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            rnd = {side: _insert_round(sides[side], commits) for side in order}
            out["rounds"].append(rnd)
            print(f"round {r}: {json.dumps(rnd)}", flush=True)
    finally:
        for proc in sides.values():
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=60)
    out["load_after"] = os.getloadavg()
    med = {s: sorted(rnd[s]["p50_ms"] for rnd in out["rounds"])[rounds // 2] for s in ("old", "new")}
    thr = {s: sorted(rnd[s]["commits_per_s"] for rnd in out["rounds"])[rounds // 2] for s in ("old", "new")}
    out["median_p50_ms"], out["median_commits_per_s"] = med, thr
    out["p50_new_over_old"] = round(med["new"] / med["old"], 3)
    out["throughput_new_over_old"] = round(thr["new"] / thr["old"], 3)
    out["per_round_p50_new_over_old"] = [round(r["new"]["p50_ms"] / r["old"]["p50_ms"], 3) for r in out["rounds"]]
    cpu = {s: sorted(rnd[s]["replica_cpu_us_per_commit"] for rnd in out["rounds"])[rounds // 2] for s in ("old", "new")}
    out["median_replica_cpu_us_per_commit"] = cpu
    out["replica_cpu_new_over_old"] = round(cpu["new"] / cpu["old"], 3)
    return out


def main_commit(a: argparse.Namespace) -> int:
    result: dict = {
        "machine": ct.machine(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "code": ct.code_commit(ROOT),
        "load_before": os.getloadavg(),
        "paired": [paired_cost(a.paired_commits, inline) for inline in (True, False)],
        "load_after_paired": os.getloadavg(),
    }
    for side in result["paired"]:
        print(json.dumps(side), flush=True)
    if a.old is not None:
        result["old"], result["new"] = ct.code_commit(a.old), ct.code_commit(ROOT)
        result["commits_per_round"] = a.commits
        result["insert"] = commit_cost(a.old, a.commits, a.rounds)
        print(json.dumps({k: result["insert"][k] for k in ("p50_new_over_old", "throughput_new_over_old")}))
    result["verification"] = verification_per_mb(a.megabytes)
    result["verification_10_rows"] = verification_small_us()
    print(json.dumps(result["verification"]))
    print(json.dumps(result["verification_10_rows"]))
    out = a.out if a.out is not None else ROOT / "benchmarks" / "results" / "security_cost_commit.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rpc-calls", type=int, default=20000)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--only",
        choices=["brute", "commit"],
        help="one measurement only: brute (logins under a brute force), commit (the metadata checks' cost)",
    )
    ap.add_argument("--old", type=Path, help="--only commit: also compare with this checkout, round by round")
    ap.add_argument(
        "--paired-commits", type=int, default=20000, help="--only commit: inserts of each paired run (half checked)"
    )
    ap.add_argument("--commits", type=int, default=500, help="--only commit: sequential inserts per round")
    ap.add_argument("--megabytes", type=int, default=64, help="--only commit: the large part's size")
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
    if a.only == "commit":
        return main_commit(a)
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
