"""One sequential commit's wall-clock timeline, across the writer, the replica and ZooKeeper.

A probe, not a benchmark of rates: one writer commits sequentially
(``client.insert`` of 10 rows, or ``client.commit_parts`` of a premade part), and every stage of
each commit is stamped with ``time.monotonic_ns()`` (CLOCK_MONOTONIC: one clock for every process
of the machine) in the process where it happens. The replica's stamps come from wrappers this
script installs in the replica process through a ``sitecustomize`` on its PYTHONPATH (read by
the interpreter at start, only when ``LATENCY_TIMELINE_OUT`` is set); the replica dumps them at
exit. Each replica stamp is given to the writer's commit whose [start, end] holds it (the writer
is sequential, so at most one commit is in flight), and the table is the median over commits of
each stage's offset from the commit's start and of its step from the stage before.

    PYTHONPATH=$PWD python benchmarks/latency_timeline.py --case insert --commits 500 --warmup 100

The wrappers cost about a microsecond per stamp (~30-40 per commit): they are in every figure.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# Benchmarks load one partition of a table without merges with thousands of parts: the
# replicas they start take no backpressure (docs/rules.md, "Too many parts"), or they would
# measure its delays and refusals instead of the path they are about.
os.environ.setdefault("MERGETXN_PARTS_TO_DELAY_INSERT", "0")
os.environ.setdefault("MERGETXN_PARTS_TO_THROW_INSERT", "0")

EVENTS: list[tuple[int, str, str]] = []  # (monotonic ns, stage, thread name)
HERE = Path(__file__).resolve().parent


def mark(name: str) -> None:
    EVENTS.append((time.monotonic_ns(), name, threading.current_thread().name))


def wrap(owner: Any, attr: str, before: Any = None, after: str | None = None) -> None:
    """Stamp ``before`` (a name, or a function of the call's arguments giving one) on entry and
    ``after`` on return of ``owner.attr``."""
    f = getattr(owner, attr, None)
    if f is None:  # not in this tree's code
        return

    def stamped(*a: Any, **k: Any) -> Any:
        if before is not None:
            mark(before if isinstance(before, str) else before(*a, **k))
        try:
            return f(*a, **k)
        finally:
            if after is not None:
                mark(after)

    setattr(owner, attr, stamped)


ZK_TYPES = {1: "create", 3: "exists", 4: "getData", 5: "setData", 11: "ping", 13: "check", 14: "multi", 15: "create2"}


def _zk_name(prefix: str):
    def name(handler: Any, *a: Any, **k: Any) -> str:
        if prefix == "send":
            request = a[0]
        else:
            pending = handler.client._pending
            request = pending[0][0] if pending else None
        kind = getattr(request, "type", None)
        return f"zk.{prefix}.{ZK_TYPES.get(kind, kind)}"

    return name


def install_common() -> None:
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        mark("fsync")
        try:
            real_fsync(fd)
        finally:
            mark("fsync.done")

    os.fsync = fsync


def install_replica() -> None:
    """The replica's stages (RPC I/O thread, committer, follower, kazoo's connection thread)."""
    from kazoo.protocol.connection import ConnectionHandler

    from coordinator.wire.rpc import RpcServer
    from coordinator.zk.log import CsnLog
    from replicas.commit_queue import CommitQueue, Pending
    from replicas.committer import Committer
    from replicas.follower import Follower
    from replicas.registry import Transactions
    from replicas.state import ReplicaState
    from replicas.wal import Wal

    install_common()
    wrap(RpcServer, "_read", "rpc.read")
    wrap(RpcServer, "_request", "rpc.request", "rpc.inline.done")
    wrap(Transactions, "begin", None, "rpc.begun")
    wrap(Transactions, "stage", None, "rpc.staged")
    wrap(CommitQueue, "put", "rpc.queued")
    wrap(CommitQueue, "_next", None, "c.woke")
    wrap(Committer, "_read", None, "c.read")
    wrap(Committer, "_prepare", "c.composed", "c.prepared")
    wrap(CsnLog, "commit", "c.multi.call", "c.multi.returned")
    wrap(ConnectionHandler, "_submit", _zk_name("send"))
    wrap(ConnectionHandler, "_read_response", _zk_name("recv"))
    wrap(Follower, "_hand_over", "c.handover", "c.handover.done")
    wrap(Wal, "append", "wal.append", "wal.append.done")
    wrap(ReplicaState, "apply", "apply", "apply.done")
    wrap(Committer, "_finish", "c.finish")
    wrap(ReplicaState, "wait_applied", None, "c.applied_seen")
    wrap(Transactions, "finish", None, "c.txn_finished")
    wrap(Pending, "resolve", "c.resolve")
    wrap(RpcServer, "call_soon", "c.answer.queued")
    wrap(RpcServer, "_run_calls", "rpc.woke.answer")
    wrap(RpcServer, "_send", "rpc.send", "rpc.sent")
    wrap(RpcServer, "_send_from_elsewhere", "c.answer.send", "c.answer.sent")
    wrap(RpcServer, "_queue_answer", "rpc.queue_answer")
    wrap(Follower, "_pull", "f.pull", "f.pull.done")
    wrap(Committer, "_sync_wal", "c.wal_sync")

    out = os.environ["LATENCY_TIMELINE_OUT"]

    def dump() -> None:
        with open(f"{out}/replica-{os.getpid()}.json", "w") as f:
            json.dump(EVENTS, f)

    atexit.register(dump)


def install_client() -> None:
    import mergetxn.client.client as api
    from coordinator.wire import rpc
    from parts.io import format as fmt
    from parts.io.storage import Storage

    install_common()
    wrap(api.Client, "_commit_parts", "w.commit_parts")
    wrap(api, "conform", None, "w.conformed")
    wrap(fmt, "_parquet_bytes", "w.parquet", "w.parquet.done")
    wrap(Storage, "put", "w.put", "w.put.done")
    wrap(rpc.RpcClient, "_exchange", "w.send")
    wrap(rpc, "read_frame", "w.sent", "w.answer")


# ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Commit:
    start: int
    end: int
    events: list[tuple[int, str, str]] = dataclasses.field(default_factory=list)


def analyse(commits: list[Commit], replica_events: list[tuple[int, str, str]]) -> dict:
    """The replica's events cut into one run per request (each starts where the RPC thread
    reads a request); a run goes to the commit whose [start, end] holds its start, with all its
    events, also those after the writer had its answer (the committer's tail). Then the median
    offset from the commit's start of each stage+thread (its n-th occurrence in the commit
    named ``#n``), in order of median."""
    replica_events.sort()
    runs: list[list[tuple[int, str, str]]] = []
    for e in replica_events:
        if e[1] == "rpc.read" or not runs:
            runs.append([])
        runs[-1].append(e)
    i = 0
    for c in commits:
        while i < len(runs) and runs[i][0][0] < c.start:
            i += 1
        while i < len(runs) and runs[i][0][0] <= c.end:
            c.events += runs[i]
            i += 1
        c.events.sort()
    offsets: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    for c in commits:
        seen: dict[str, int] = {}
        for t, name, thread in c.events:
            key = f"{name} [{thread}]"
            seen[key] = seen.get(key, 0) + 1
            if seen[key] > 1:
                key += f" #{seen[key]}"
            counts[key] = counts.get(key, 0) + 1
            offsets.setdefault(key, []).append((t - c.start) / 1e6)
    n = len(commits)
    rows = []
    for key, xs in offsets.items():
        rows.append(
            {
                "stage": key,
                "median_ms": round(statistics.median(xs), 3),
                "p10_ms": round(sorted(xs)[len(xs) // 10], 3),
                "p90_ms": round(sorted(xs)[len(xs) * 9 // 10], 3),
                "share": round(len(xs) / n, 3),
                "per_commit": round(counts[key] / n, 2),
            }
        )
    rows.sort(key=lambda r: r["median_ms"])
    total = [(c.end - c.start) / 1e6 for c in commits]
    return {
        "commits": n,
        "total_p50_ms": round(statistics.median(total), 3),
        "total_p10_ms": round(sorted(total)[n // 10], 3),
        "total_p90_ms": round(sorted(total)[n * 9 // 10], 3),
        "path": path_steps(commits),
        "stages": rows,
    }


# The one commit's path, stage by stage, as its table reads it: the
# writer's, the replica's RPC thread, the committer, kazoo's thread, the answer. A stage that a
# tree's code does not have (the answer's hand-off to the RPC thread, or the direct send) is
# left out of that tree's table.
PATH = [
    ("w.conformed", "MainThread", "writer: conform the rows"),
    ("w.parquet", "MainThread", "writer: split, name the part"),
    ("w.parquet.done", "MainThread", "writer: Parquet encoding"),
    ("w.put", "MainThread", "writer: column stats, descriptor"),
    ("fsync", "MainThread", "writer: create + write the part file"),
    ("fsync.done", "MainThread", "writer: fsync of the part file"),
    ("fsync.done#2", "MainThread", "writer: fsync of its directory"),
    ("w.commit_parts", "MainThread", "writer: to the one call (insert: puts returned)"),
    ("w.send", "MainThread", "writer: request built (args, descriptors)"),
    ("w.sent", "MainThread", "writer: frame encoded and sent"),
    ("rpc.read", "rpc", "replica RPC thread woken, reads"),
    ("rpc.request", "rpc", "request decoded (JSON)"),
    ("rpc.begun", "rpc", "protocol check, grants, begin"),
    ("wal.append", "rpc", "stage: checks, containment, descriptor"),
    ("wal.append.done", "rpc", "stage: WAL record of the staged part (no fsync)"),
    ("rpc.queued", "rpc", "commit_async: queued for the committer"),
    ("c.woke", "committer", "committer woken (Condition + GIL)"),
    ("c.read", "committer", "committer: what the batch reads (local)"),
    ("c.composed", "committer", "committer: plan + compose (conflict rules, files)"),
    ("c.prepared", "committer", "committer: the entry built and encoded"),
    ("c.multi.call", "committer", "committer: spill check, counters, failpoint"),
    ("zk.send.multi", "Thread-3 (zk_loop)", "multi built, kazoo thread woken, sends"),
    ("zk.recv.multi", "Thread-3 (zk_loop)", "ZooKeeper: the multi (its log fsync)"),
    ("c.multi.returned", "committer", "kazoo decodes, committer woken"),
    ("fsync", "committer", "own entry: WAL record built, written"),
    ("fsync.done", "committer", "own entry: WAL fsync"),
    ("apply.done", "committer", "own entry: applied to the state"),
    ("c.wal_sync", "committer", "answered: to the WAL fsync"),
    ("c.resolve", "committer", "answering: registry, metrics"),
    ("c.answer.queued", "committer", "answer encoded, I/O thread woken"),
    ("rpc.woke.answer", "rpc", "RPC thread woken for the answer"),
    ("rpc.send", "rpc", "RPC thread: calls run"),
    ("c.answer.send", "committer", "answer: to the send"),
    ("w.answer", "MainThread", "writer woken, answer read (send + wake-up)"),
    ("w.end", "MainThread", "writer: decoded, returned"),
]


def path_steps(commits: list[Commit]) -> list[dict]:
    """Per commit, the time of each PATH stage (its first occurrence; ``#2``: its second) and
    the step from the stage before it on the path; the medians over commits. Stages present in
    fewer than 90% of the commits are left out."""
    times: list[dict[str, float]] = []
    for c in commits:
        at: dict[str, float] = {"start": 0.0, "w.end [MainThread]": (c.end - c.start) / 1e6}
        seen: dict[str, int] = {}
        for t, name, thread in c.events:
            key = f"{name} [{thread}]"
            seen[key] = seen.get(key, 0) + 1
            named = key if seen[key] == 1 else f"{name}#{seen[key]} [{thread}]"
            at.setdefault(named, (t - c.start) / 1e6)
        times.append(at)
    keys = [f"{n} [{th}]" for n, th, _ in PATH]
    keys = [k for k in keys if sum(k in at for at in times) >= 0.9 * len(times)]
    if "c.answer.send [committer]" in keys:  # the committer sends the answer: the RPC thread comes after
        keys = [k for k in keys if k.split(" ")[0] not in ("c.answer.queued", "rpc.woke.answer", "rpc.send")]
    # In the order they happen in this tree's code (the WAL fsync may come after the answer).
    keys.sort(key=lambda k: statistics.median(at[k] for at in times if k in at))
    out = []
    prev = "start"
    for key in keys:
        steps = [at[key] - at[prev] for at in times if key in at and prev in at]
        offs = [at[key] for at in times if key in at]
        label = next(d for n, th, d in PATH if f"{n} [{th}]" == key)
        out.append(
            {
                "stage": key,
                "what": label,
                "at_ms": round(statistics.median(offs), 3),
                "step_ms": round(statistics.median(steps), 3),
            }
        )
        prev = key
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--case", choices=("insert", "commit_parts"), default="insert")
    p.add_argument("--commits", type=int, default=500)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--pause", type=float, default=0.0, help="seconds between commits (0: back to back)")
    p.add_argument("--work", default="/tmp/latency-timeline")
    p.add_argument("--out", default=None, help="JSON file for the result (and OUT.raw: every stamp)")
    p.add_argument(
        "--reanalyse", nargs="+", default=None, help="OUT.raw files: their commits pooled in one table; runs nothing"
    )
    a = p.parse_args(argv)
    if a.reanalyse:
        commits: list[Commit] = []
        events: list[tuple[int, str, str]] = []
        for f in a.reanalyse:
            raw = json.loads(Path(f).read_text())
            commits += [Commit(s, e, [tuple(x) for x in ev]) for s, e, ev in raw["commits"]]
            events += [tuple(x) for x in raw["replica"]]
        commits.sort(key=lambda c: c.start)
        result = analyse(commits, events)
        if a.out:
            Path(a.out).write_text(json.dumps(result, indent=1))
        report({**result, "case": a.case, "load": "?", "load_after": "?"})
        return

    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    hooks = Path(tempfile.mkdtemp(prefix="hooks-", dir=work))
    (hooks / "sitecustomize.py").write_text(
        "import os, sys\n"
        "if os.environ.get('LATENCY_TIMELINE_OUT'):\n"
        f"    sys.path.insert(0, {str(HERE)!r})\n"
        "    import latency_timeline\n"
        "    latency_timeline.install_replica()\n"
    )
    out_dir = work / "events"
    out_dir.mkdir()
    os.environ["LATENCY_TIMELINE_OUT"] = str(out_dir)
    os.environ["PYTHONPATH"] = os.environ.get("PYTHONPATH", "") + os.pathsep + str(hooks)

    import pyarrow as pa

    from mergetxn.local.cluster import LocalCluster

    rows = pa.table(
        {
            "id": pa.array(range(10), pa.int64()),
            "name": pa.array([f"row-{i}" for i in range(10)], pa.string()),
            "value": pa.array([i * 0.5 for i in range(10)], pa.float64()),
        }
    )
    load = os.getloadavg()
    with LocalCluster(work / "cluster", replicas=1) as cluster:
        os.environ.pop("LATENCY_TIMELINE_OUT")
        client = cluster.client(0)
        client.create_table("t", rows.schema, auto_merge=False)
        install_client()
        op = _op(a.case, client, rows, cluster.storage_url, a.commits + a.warmup)
        done: list[Commit] = []
        for i in range(a.commits + a.warmup):
            del EVENTS[:]
            t0 = time.monotonic_ns()
            op()
            t1 = time.monotonic_ns()
            if i >= a.warmup:
                done.append(Commit(t0, t1, list(EVENTS)))
            if a.pause:
                time.sleep(a.pause)
        client.close()
    load_after = os.getloadavg()
    replica_events: list[tuple[int, str, str]] = []
    for f in out_dir.glob("replica-*.json"):
        replica_events += [tuple(e) for e in json.loads(f.read_text())]
    if a.out:
        raw = {"commits": [dataclasses.astuple(c) for c in done], "replica": replica_events}
        Path(a.out + ".raw").write_text(json.dumps(raw))
    result = analyse(done, replica_events)
    result.update(
        case=a.case,
        at=time.strftime("%Y-%m-%d %H:%M:%S"),
        load=[round(x, 2) for x in load],
        load_after=[round(x, 2) for x in load_after],
        code=str(HERE.parent),
    )
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    report(result)
    shutil.rmtree(work, ignore_errors=True)


def report(result: dict) -> None:
    print(
        f"{result['case']}: {result['commits']} commits, p50 {result['total_p50_ms']} ms "
        f"(p10 {result['total_p10_ms']}, p90 {result['total_p90_ms']}); load {result['load']} -> {result['load_after']}"
    )
    print(f"{'path: what the step from the stage before does':52} {'stage [thread]':34} {'at':>7} {'step':>7}")
    for r in result["path"]:
        print(f"{r['what'][:52]:52} {r['stage'][:34]:34} {r['at_ms']:7.3f} {r['step_ms']:7.3f}")
    print(f"{'every stage [thread]':56} {'median':>8} {'p10':>8} {'p90':>8} {'share':>6} {'n/c':>5}")
    prev = 0.0
    for r in result["stages"]:
        print(
            f"{r['stage'][:56]:56} {r['median_ms']:8.3f} {r['p10_ms']:8.3f} {r['p90_ms']:8.3f} "
            f"{r['share']:6.2f} {r['per_commit']:5.2f}  +{r['median_ms'] - prev:.3f}"
        )
        prev = r["median_ms"]


def _op(case: str, client: Any, rows: Any, storage_root: str, n: int):
    if case == "insert":
        return lambda: client.insert("t", rows)
    from parts.io.format import new_part_name, write_part
    from parts.io.storage import _fsync_dir

    tdef = client.table("t")
    template = write_part(client.storage, "t", list(tdef.partition_by), (), rows, "probe")
    src = Path(storage_root) / template.path
    directory = template.path.rsplit("/", 1)[0]
    names = []
    for _ in range(n):
        name = new_part_name("probe")
        os.link(src, Path(storage_root) / directory / f"{name}.parquet")
        names.append(name)
    _fsync_dir(str(Path(storage_root) / directory))
    it = iter(names)

    def op() -> None:
        name = next(it)
        meta = dataclasses.replace(template, name=name, path=f"{directory}/{name}.parquet", created_at=time.time())
        client.commit_parts("t", [meta])

    return op


if __name__ == "__main__":
    main()
