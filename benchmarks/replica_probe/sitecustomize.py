"""A probe inside each replica process of ``commit_throughput.py --profile-kind mergetxn3_*``.

Python imports ``sitecustomize`` at start-up from the path; the benchmark puts this directory on
the replicas' ``PYTHONPATH`` (only theirs) and names a directory in ``MERGETXN_BENCH_PROBE``.
Without that variable it does nothing. With it, the replica process:

* counts kazoo's requests by type (``KazooClient._call``: every request this process sends to
  ZooKeeper, the follower's, the committer's, the log tail's, the alive node's);
* times (thread CPU) a few methods of the follower's and committer's path once ``arm`` is asked;
* with ``MERGETXN_BENCH_PROBE_CPROFILE=1``, runs every thread it starts under its own cProfile
  (CPU time), read while running (``getstats``) so that a window's stats are a difference;
* with ``MERGETXN_BENCH_PROBE_SKIP_VERIFY=alternate``, skips the stage-time check of parts
  against their files (``Staging.verify_claims``) on every other call (the 2nd, 4th, ...), and
  counts the calls and the thread CPU of the checks made (timer ``verify_claims``): the paired
  measurement of ``security_cost.py --only commit``, where one writer's sequential inserts
  alternate checked and unchecked on one replica, so that both halves see the same machine;
* answers ``snap`` on a unix socket ``<dir>/probe-<pid>.sock`` with all of that and each
  thread's CPU seconds (``/proc/self/task``) by its ``threading`` name.

Benchmark code only: no replica module knows about it.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import socket
import threading
import time

_DIR = os.environ.get("MERGETXN_BENCH_PROBE")


def _label(code: object) -> str:
    if isinstance(code, str):
        return code
    path = code.co_filename
    for marker in ("/site-packages/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:
        path = "/".join(path.rsplit("/", 2)[-2:])
    return f"{path}:{code.co_firstlineno}({code.co_name})"


class _Probe:
    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.zk: collections.Counter = collections.Counter()
        self.timers: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
        self.profiles: list[tuple[threading.Thread, object]] = []
        self.lock = threading.Lock()
        self.armed = False

    def install(self) -> None:
        import kazoo.client

        orig = kazoo.client.KazooClient._call
        zk = self.zk

        def counting_call(client, request, async_object):
            zk[type(request).__name__] += 1
            return orig(client, request, async_object)

        kazoo.client.KazooClient._call = counting_call
        if os.environ.get("MERGETXN_BENCH_PROBE_CPROFILE") == "1":
            self._profile_threads()
        if os.environ.get("MERGETXN_BENCH_PROBE_SKIP_VERIFY") == "alternate":
            self._alternate_verify()
        threading.Thread(target=self._serve, name="bench-probe", daemon=True).start()

    def _profile_threads(self) -> None:
        import cProfile

        run = threading.Thread.run
        probe = self

        def profiled_run(thread):
            prof = cProfile.Profile(time.thread_time)  # CPU, not wall time
            with probe.lock:
                probe.profiles.append((thread, prof))
            prof.enable()
            try:
                run(thread)
            finally:
                prof.disable()

        threading.Thread.run = profiled_run

    def _alternate_verify(self) -> None:
        """``Staging.verify_claims`` made on the 1st, 3rd, ... call and skipped on the others."""
        from replicas.staging import Staging

        check = Staging.verify_claims
        slot = self.timers["verify_claims"]  # [calls, thread CPU of the checks made]

        @functools.wraps(check)
        def alternate(staging, table, op):
            call = slot[0]
            slot[0] += 1
            if call % 2:
                return None
            c0 = time.thread_time()
            try:
                return check(staging, table, op)
            finally:
                slot[1] += time.thread_time() - c0

        Staging.verify_claims = alternate

    def arm(self) -> None:
        """Thread-CPU timers on the methods a commit passes through, by name (old trees may lack some)."""
        if self.armed:
            return
        self.armed = True
        import importlib

        for module, cls, attr in (
            ("replicas.wal", "Wal", "append"),
            ("replicas.state", "ReplicaState", "apply"),
            ("replicas.follower", "Follower", "_fetch_batch"),
            ("replicas.follower", "Follower", "_pull"),
            ("replicas.follower", "Follower", "apply_own"),
            ("replicas.follower", "Follower", "decode"),
            ("coordinator.zk.log", "CsnLog", "fetch"),
            ("coordinator.zk.log", "CsnLog", "watch_next"),
            ("coordinator.zk.log", "CsnLog", "commit"),
            ("replicas.committer", "Committer", "_commit_batch"),
            ("replicas.committer", "Committer", "_target_versions"),
            ("replicas.state", "ReplicaState", "wait_versions"),
            ("replicas.state", "ReplicaState", "wait_applied"),
            ("replicas.wal", "Wal", "_write"),
        ):
            try:
                owner = getattr(importlib.import_module(module), cls)
                f = owner.__dict__[attr]
            except (ImportError, AttributeError, KeyError):
                continue
            setattr(owner, attr, self._timed(f, f"{cls}.{attr}"))

    def _timed(self, f, label: str):
        """Thread CPU (``label``) and wall time (``label [wall]``) spent in ``f``."""
        slot, wall = self.timers[label], self.timers[label + " [wall]"]

        @functools.wraps(f)
        def g(*a, **k):
            c0, w0 = time.thread_time(), time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                slot[0] += 1
                slot[1] += time.thread_time() - c0
                wall[0] += 1
                wall[1] += time.perf_counter() - w0

        return g

    def snapshot(self) -> dict:
        names = {t.native_id: t.name for t in threading.enumerate()}
        tick = os.sysconf("SC_CLK_TCK")
        threads = {}
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/stat") as fh:
                    stat = fh.read()
                comm = stat[stat.index("(") + 1 : stat.rindex(")")]
                fields = stat.rsplit(")", 1)[1].split()
                threads[task] = [names.get(int(task)) or comm, (int(fields[11]) + int(fields[12])) / tick]
            except (OSError, ValueError):
                continue
        profiles = []
        with self.lock:
            held = list(self.profiles)
        for i, (thread, prof) in enumerate(held):
            rows = {}
            for e in prof.getstats():
                rows[_label(e.code)] = [e.callcount, e.inlinetime, e.totaltime]
            profiles.append([i, thread.name, rows])
        return {
            "pid": os.getpid(),
            "cpu": time.process_time(),
            "threads": threads,
            "zk": dict(self.zk),
            "timers": {k: list(v) for k, v in self.timers.items()},
            "profiles": profiles,
        }

    def _serve(self) -> None:
        path = os.path.join(self.dir, f"probe-{os.getpid()}.sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(4)
        while True:
            conn, _ = srv.accept()
            with conn:
                cmd = conn.makefile("r").readline().strip()
                if cmd == "arm":
                    self.arm()
                    conn.sendall(b"{}\n")
                elif cmd == "snap":
                    conn.sendall(json.dumps(self.snapshot()).encode() + b"\n")


if _DIR:
    _Probe(_DIR).install()
