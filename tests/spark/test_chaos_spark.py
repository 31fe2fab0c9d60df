"""The Spark workload of ``mergetxn chaos`` on a Spark standalone cluster (a master and two
workers from the pyspark package's classes, on loopback) against a LocalCluster (a real
ZooKeeper and two replicas): the history its jobs make passes the checker; an executor SIGKILLed
in the middle of a job's tasks still gives every committed element exactly once; stopping the
standalone cluster leaves no process of it behind.

One LocalCluster, one standalone cluster and one SparkSession serve the module (one SparkContext
per process); each test uses its own table.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cluster import make_cluster  # tests/ is on sys.path
from support.waiting import poll

from mergetxn.chaos.checker import check, describe
from mergetxn.chaos.history import Final, Header, History, Op
from mergetxn.chaos.spark_cluster import MARKER, SparkStandalone, _processes, cleanup_spark
from mergetxn.chaos.spark_workload import SparkWorker, SparkWorkload, set_values
from mergetxn.chaos.workloads import Recorder
from mergetxn.client import Client

pytestmark = pytest.mark.slow


def finals(clients: list[Client], table: str, ops: list[Op]) -> list[Final]:
    """Every replica's contents at one CSN, and its commit_status answer for every tid."""
    csn = max(c.snapshot() for c in clients)
    out = []
    for i, c in enumerate(clients):
        c.wait_for(csn)
        contents = {table: set_values(c.read(table, snapshot=csn))}
        statuses = {}
        for o in ops:
            if o.tid is not None:
                st = c.commit_status(o.tid)
                statuses[o.tid] = [st.status, st.csn]
        out.append(Final(i, csn, contents, statuses))
    return out


def history(workload: SparkWorkload, rec: Recorder, clients: list[Client]) -> History:
    """The run's history (also written next to the job traces, to look at after a failure)."""
    header = Header(seed=0, workload="spark", nemesis="none", tables=workload.tables, form="loopback")
    h = History(header, list(rec.ops), [], finals(clients, workload.table, rec.ops))
    h.write(workload.workdir / "history.jsonl")
    return h


def assert_clean(h: History) -> None:
    found = check(h)
    assert not found, "\n".join(describe(f) for f in found)
    assert not [o for o in h.ops if o.outcome == "indeterminate"]


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with make_cluster(tmp_path_factory, None, "chaosspark", replicas=2) as c:
        yield c


@pytest.fixture(scope="module")
def clients(cluster) -> list[Client]:
    return [cluster.client(i) for i in range(2)]


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    sa = SparkStandalone(tmp_path_factory.mktemp("standalone"))
    t0 = time.monotonic()
    sa.start()
    print(f"standalone cluster started in {time.monotonic() - t0:.1f}s {sa.timings}")
    try:
        yield sa
    finally:
        sa.stop()


@pytest.fixture(scope="module")
def session(standalone: SparkStandalone):
    t0 = time.monotonic()
    s = standalone.session("mergetxn-chaos-spark")
    print(f"session with {len(standalone.executors())} executors in {time.monotonic() - t0:.1f}s")
    yield s
    s.stop()


# ---------------------------------------------------------------------------------------------


def test_jobs_make_a_history_the_checker_accepts(session, cluster, clients, tmp_path: Path) -> None:
    """A planned job thread on replica 0 (every kind of job) beside a SparkWorker on replica 1
    (jobs at random), both on the one session."""
    wl = SparkWorkload(tmp_path / "traces", table="spw", keys=3, partitions=2)
    wl.create(clients[0])
    rec = Recorder()
    stop = threading.Event()
    worker = SparkWorker(1, 1, lambda: list(cluster.replica_addresses), wl, session, rec, stop, seed=5)
    worker.start()
    rng = random.Random(0)
    planned: dict[str, Op] = {}
    try:
        for kind in ("append", "overwrite", "txn", "read", "native", "native-read", "overwrite"):
            t0 = time.monotonic()
            op = planned[kind] = wl.job(session, clients[0], 0, 0, rng, rec, kind=kind)
            note = "" if op.outcome == "committed" else f" {op.error}: {op.message}"
            print(f"{kind} job on r0: {op.outcome} in {time.monotonic() - t0:.1f}s{note}")
    finally:
        stop.set()
        worker.join(300)
    assert worker.error is None and not worker.is_alive()
    for _ in range(3):  # overwrites may lose conflicts (to each other, to merges): one that commits
        if wl.job(session, clients[0], 0, 0, rng, rec, kind="overwrite").outcome == "committed":
            break
    h = history(wl, rec, clients)
    for o in h.ops:
        if o.process == 1 or o.outcome != "committed":
            print(
                f"op {o.index} on r{o.replica} ({o.mops[0][0] if o.mops else '-'}...): {o.outcome} "
                f"{o.error or ''} {o.message[:300]}"
            )
    assert_clean(h)
    assert any(o.process == 1 for o in h.ops)
    outcomes = Counter(o.outcome for o in h.ops)
    assert outcomes["committed"] >= len(h.ops) // 2, [(o.outcome, o.error, o.message) for o in h.ops]

    def kind(o: Op) -> str:
        return o.mops[0][0] if o.mops[0][0] != "r" else "txn" if o.tid else "read"

    # Spark's own Parquet reader and writer (spark.read_table / write_table) in the same history
    assert planned["native-read"].outcome == "committed" and planned["native-read"].mops
    assert planned["native"].outcome == "committed" or planned["native"].error == "ConflictError", planned["native"]
    committed = {kind(o) for o in h.ops if o.outcome == "committed"}
    assert {"append", "overwrite", "read"} <= committed, committed
    # A job that committed on its own: its tid, snapshot and csn came from the data source.
    own = [o for o in h.ops if o.outcome == "committed" and o.mops[0][0] in ("append", "overwrite")]
    assert all(o.tid and o.snapshot is not None and o.csn > o.snapshot for o in own)
    assert all(st == ["committed", o.csn] for o in own for st in [h.finals[0].statuses[o.tid]])


def test_executor_killed_mid_task_still_exactly_once(session, standalone, clients, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    wl = SparkWorkload(tmp_path / "traces", table="spk", keys=3, partitions=8, delay=0.5, marks=marks)
    wl.create(clients[0])
    rec = Recorder()
    rng = random.Random(7)
    for kind in ("append", "overwrite"):
        wl.job(session, clients[0], 0, 0, rng, rec, kind=kind)
    app = session.sparkContext.applicationId
    result: list[Op] = []
    job = threading.Thread(target=lambda: result.append(wl.job(session, clients[0], 0, 1, rng, rec, kind="append")))
    before = {p.name for p in marks.iterdir()}
    t0 = time.monotonic()
    job.start()
    # Both executors are running tasks of this job (each sleeps `delay` before writing its rows).
    assert poll(
        lambda: len({p.name.split("-")[1] for p in marks.iterdir() if p.name not in before}) >= 2,
        timeout=120,
        interval=0.05,
    )
    victim = standalone.kill_executor(app)
    assert victim is not None
    job.join(300)
    print(f"job with executor {victim.executor_id} killed: {time.monotonic() - t0:.1f}s")
    [op] = result
    assert op.outcome == "committed", (op.error, op.message)
    # The killed executor's tasks ran again: more attempts than tasks, or a retry attempt.
    attempts = [p.name.split("-") for p in marks.iterdir() if p.name not in before]
    assert len(attempts) > wl.partitions or any(int(a[3]) > 0 for a in attempts), attempts
    assert victim.pid not in {e.pid for e in standalone.executors()}
    for kind in ("append", "read"):  # the session works on (a new executor comes)
        wl.job(session, clients[1], 1, 2, rng, rec, kind=kind)
    h = history(wl, rec, clients)
    assert_clean(h)
    # Every element of the job exactly once, on every replica.
    got = Counter(e for f in h.finals for elems in f.tables["spk"].values() for e in elems)
    written = [m[3] for m in op.mops]
    assert all(got[e] == len(h.finals) for e in written), {e: got[e] for e in written}


def test_stop_leaves_no_process_behind(session, standalone: SparkStandalone) -> None:
    workdir = standalone.workdir
    assert standalone.executors(), "the session's executors run"
    # A leftover of a harness that died: any process carrying the cluster's marker.
    stray = subprocess.Popen(["sleep", "600"], env={**os.environ, MARKER: str(workdir)}, start_new_session=True)
    try:
        # Popen returns when the exec closes its error pipe, before the kernel has set up the
        # new image's environment: until then /proc/<pid>/environ reads empty.
        assert poll(lambda: stray.pid in {pid for pid, _ in _processes(workdir)}, 10)
        pids = {pid for pid, _ in _processes(workdir)}
        assert len(pids) >= 5  # master, 2 workers, 2 executors, the stray
        session.stop()
        standalone.stop()
        assert stray.wait(10) is not None  # stop() ends with cleanup_spark
        assert _processes(workdir) == [] and cleanup_spark(workdir) == []
        alive = [
            p for p in pids if Path(f"/proc/{p}").exists() and "Z" not in Path(f"/proc/{p}/stat").read_text().split()[2]
        ]
        assert alive == []
        assert standalone._state() is None  # the master's port is closed
    finally:
        if stray.poll() is None:
            stray.kill()
            stray.wait()


def test_chaos_spark_workload_under_executor_and_replica_kills(tmp_path: Path) -> None:
    """``mergetxn chaos --workload spark`` end to end on the single-host form, in a process of
    its own (one SparkContext per process): Spark jobs commit while executors are SIGKILLed
    mid-task and replicas are killed, the checker finds nothing, and nothing of Spark is left."""
    from mergetxn.chaos.history import History

    root = Path(__file__).resolve().parents[2]
    work, report = tmp_path / "work", tmp_path / "report"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    t0 = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mergetxn.cli",
            "chaos",
            "--seconds",
            "60",
            "--seed",
            "11",
            "--form",
            "single",
            "--workload",
            "spark",
            "--nemesis",
            "kill-executor,kill-replica",
            "--workdir",
            str(work),
            "--report",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
        cwd=root,
    )
    took = time.monotonic() - t0
    print(f"chaos run with Spark: exit {done.returncode} in {took:.0f}s\n{done.stdout[-3000:]}")
    assert done.returncode == 0, f"{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    h = History.read(report / "history.jsonl")
    spark_ops = [o for o in h.ops if o.workload == "spark"]
    committed = [o for o in spark_ops if o.outcome == "committed"]
    assert any(o.tid and any(m[0] != "r" for m in o.mops) for o in committed), [
        (o.outcome, o.error, o.message[:200]) for o in spark_ops
    ]
    assert "sp0" in h.header.tables and h.header.workload == "spark"
    kills = [f for f in h.faults if f.kind == "kill-executor"]
    assert any(f.detail.startswith("SIGKILL executor") for f in kills), [f.detail for f in h.faults]
    assert {f.kind for f in h.faults} <= {"kill-executor", "kill-replica"}
    assert all(f.tables["sp0"] == h.finals[0].tables["sp0"] for f in h.finals)
    assert _processes(work / "spark" / "standalone") == []
    assert took < 300
