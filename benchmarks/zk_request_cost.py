"""ZooKeeper's CPU per request of each kind the commit path sends, at a paced rate.

Starts a fresh ZooKeeper (as ``commit_throughput.py`` does, warmed the same way), then for each
kind sends requests one after the other at ``--rate`` per second for ``--seconds`` and reads the
server's user and system CPU from /proc, its JIT compilation and GC time from ``jstat`` (when
the JDK has it). ``idle`` sends nothing: the server's fixed cost per second, which a commit rate
spreads over its commits. Kinds: ``create`` (a sequential create, the raw benchmark's request),
``multi`` (the shape of a one-table insert commit: owner, fence and table checks, one target
set, the epoch check and the sequential entry of ~500 bytes), ``multi+exists`` (the same and the
follower's exists watch on the next position, which commits once sent), ``exists``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from commit_throughput import cpu_seconds, warm_up_zookeeper  # noqa: E402


def proc_times(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tck, int(fields[12]) / tck


def jstat(pid: int) -> dict[str, float]:
    """JIT compile seconds and GC seconds so far (empty without jstat)."""
    out: dict[str, float] = {}
    try:
        comp = subprocess.run(["jstat", "-compiler", str(pid)], capture_output=True, text=True, timeout=30).stdout
        gc = subprocess.run(["jstat", "-gcutil", str(pid)], capture_output=True, text=True, timeout=30).stdout
        head, vals = comp.split("\n")[:2]
        d = dict(zip(head.split(), vals.split()))
        out["jit_s"], out["compiled"] = float(d["Time"]), float(d["Compiled"])
        head, vals = gc.split("\n")[:2]
        d = dict(zip(head.split(), vals.split()))
        out["gc_s"] = float(d["GCT"])
    except (OSError, ValueError, KeyError, subprocess.SubprocessError):
        pass
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=110.0)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--kinds", default="idle,create,exists,multi,multi+exists,idle")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    from kazoo.client import KazooClient

    from mergetxn.local.zkserver import ZooKeeperServer

    work = Path(tempfile.mkdtemp(prefix="zk-request-cost-"))
    zk_server = ZooKeeperServer(work / "zookeeper")
    zk_server.start()
    results = []
    try:
        warm_up_zookeeper(zk_server.address)
        zk = KazooClient(hosts=zk_server.address, timeout=30)
        zk.start(timeout=30)
        for p in ("/r/owner", "/r/fence", "/r/tables/t", "/r/targets/t", "/r/log/e-0"):
            zk.ensure_path(p)
        entry = b"x" * 500
        seq = [0]

        def one(kind: str) -> None:
            if kind == "create":
                zk.create("/r/log/e-0/c-", entry, sequence=True)
            elif kind == "exists":
                zk.exists("/r/log/e-0/nothing", watch=lambda *_: None)
            elif kind.startswith("multi"):
                t = zk.transaction()
                t.check("/r/owner", 0)
                t.check("/r/fence", 0)
                t.check("/r/tables/t", 0)
                t.set_data("/r/targets/t", b"", version=-1)
                t.check("/r/log/e-0", 0)
                t.create("/r/log/e-0/c-", entry, sequence=True)
                res = t.commit()
                if any(isinstance(r, Exception) for r in res):
                    raise RuntimeError(res)
                seq[0] += 1
                if kind == "multi+exists":
                    zk.exists(f"/r/log/e-0/c-{seq[0] + 10**9:010d}", watch=lambda *_: None)

        pid = zk_server.pid
        assert pid is not None
        for kind in a.kinds.split(","):
            # A first pass unmeasured (the JIT's share of a new kind), then the measured one.
            for measured in (False, True):
                j0, t0 = jstat(pid), proc_times(pid)
                n = 0
                start = time.monotonic()
                while (now := time.monotonic()) - start < a.seconds:
                    if kind != "idle":
                        one(kind)
                        n += 1
                    nxt = start + n / a.rate if kind != "idle" else now + 0.1
                    if nxt > time.monotonic():
                        threading.Event().wait(nxt - time.monotonic())
                elapsed = time.monotonic() - start
                t1, j1 = proc_times(pid), jstat(pid)
                if not measured:
                    continue
                user, sys_ = t1[0] - t0[0], t1[1] - t0[1]
                rec = {
                    "kind": kind,
                    "requests_per_s": round(n / elapsed, 1),
                    "zk_cpu_ms_per_s": round((user + sys_) * 1000 / elapsed, 1),
                    "zk_user_ms_per_s": round(user * 1000 / elapsed, 1),
                    "zk_sys_ms_per_s": round(sys_ * 1000 / elapsed, 1),
                    "zk_cpu_ms_per_request": round((user + sys_) * 1000 / n, 3) if n else None,
                    "jit_ms_per_s": round((j1.get("jit_s", 0) - j0.get("jit_s", 0)) * 1000 / elapsed, 1),
                    "gc_ms_per_s": round((j1.get("gc_s", 0) - j0.get("gc_s", 0)) * 1000 / elapsed, 1),
                    "methods_compiled": j1.get("compiled", 0) - j0.get("compiled", 0),
                }
                results.append(rec)
                print(json.dumps(rec), flush=True)
        zk.stop()
        zk.close()
        _ = cpu_seconds
    finally:
        zk_server.stop()
        shutil.rmtree(work, ignore_errors=True)
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
