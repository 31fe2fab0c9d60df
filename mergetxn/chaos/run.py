"""One chaos run: a cluster, workloads and a nemesis for a while, then heal, resolve, read, check.

:func:`run_chaos` is what ``mergetxn chaos`` runs: a :class:`Campaign`, whose methods are the run's
phases, in order. The order after the faults matters: the nemesis stops (every fault healed), the
cluster is healed again as a whole (anything still down is restarted), the run waits until every
replica commits again, then the clients stop; every indeterminate outcome is resolved with
``commit_status`` (a transaction still running for a client that is gone is killed first: no caller
may be left not knowing); every replica is read at one CSN; the checker reads the history; the
report is written. :func:`conclude` is that last part on its own, so a saved or hand-made history
can be checked without a cluster.

Three cluster forms: ``namespaces`` and ``loopback`` (``mergetxn.chaos.hosts``: a ZooKeeper
ensemble of 3, network faults) and ``single`` (:class:`SingleHostCluster`: one ZooKeeper server
and three replica processes on this machine, replica signal faults only).

The Spark workload (``workload="spark"``, or ``spark=True`` beside the others) adds a Spark
standalone cluster on the same hosts (:class:`SparkSide`): its master on the first host, a worker
on each other host, the driver in the harness, so executors run on other hosts than the driver;
its jobs go through the ``mergetxn`` data source and are recorded in the same history, and the
fault ``kill-executor`` becomes possible. It is heavy (five JVMs more, and Python workers), so
``all`` leaves it out unless asked.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import random
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa

from coordinator.core import retries
from coordinator.core.errors import (
    InvalidInput,
    MergetxnError,
    ReplicaUnavailable,
    SnapshotUnavailable,
)
from coordinator.core.versions import Tid
from coordinator.wire.security import ADMIN_FILE, ENV_CREDENTIALS, Credentials
from mergetxn.chaos import report
from mergetxn.chaos.history import Fault, Final, Header, History, Op
from mergetxn.chaos.hostile import Hostile
from mergetxn.chaos.nemesis import (
    LANES,
    PAUSE,
    RECOVERY_LIMIT,
    Nemesis,
    NothingToFault,
    brief,
    choose_kinds,
    wait_all_serving,
)
from mergetxn.chaos.workloads import (
    CLIENT_TIMEOUT,
    LA_SCHEMA,
    PROBE_SCHEMA,
    KillClients,
    Recorder,
    Worker,
    create_table,
    register_table,
    register_values,
    set_values,
    workloads_for,
)
from mergetxn.client.client import Client
from mergetxn.local.cluster import LocalCluster
from mergetxn.local.zkserver import StartStop

FORMS = ("auto", "namespaces", "loopback", "single")
STORAGES = ("dir", "s3")
# Short, so an expired or cut replica is noticed within a fault's recovery and expire-session
# takes about 3 s (cut until ZooKeeper expires the session, then a new one); 5 ticks of the
# harness's ZooKeeper (200 ms), well above its minimum of 2.
SESSION_TIMEOUT = 2.0
# Replica settings for a run: merges, cleanup and the log tail all busy within seconds, so they
# run under the faults too (defaults would wait minutes before the first checkpoint or major merge);
# a 5 s history window, so cleanup collects within the run while reads of recent snapshots and
# changes lean on the window (docs/rules.md#history-retention).
REPLICA_SETTINGS: dict[str, float | int] = {
    "merge_interval": 0.5,
    "merge_min_parts": 4,
    "major_idle_seconds": 3.0,
    "gc_interval": 2.0,
    "gc_grace_seconds": 20.0,
    "checkpoint_every": 500,
    "retain_entries": 1000,
    "local_checkpoint_every": 500,
    "retention_seconds": 5.0,
    # Small writes (docs/architecture/small-writes.md): the workloads' small inserts are inlined
    # (la1's are not: its table turns it off, so inlined and file-backed parts meet in one
    # transaction), and flushes run often: every 3 inlined parts of a partition or after 1 s.
    "inline_flush_parts": 3,
    "inline_flush_seconds": 1.0,
}
RESOLVE_LIMIT = 60.0  # seconds to learn one indeterminate outcome
FINAL_TIMEOUT = 60.0
PIDS_FILE = "chaos-pids.json"
SPARK_JOBS = 2  # Spark job threads (one session): each job uses both executors
SPARK_TASK_DELAY = 0.3  # seconds each Spark task sleeps first, so an executor can be killed mid-task
SPARK_JOIN = 180.0  # seconds a Spark job thread may take to finish its job after the run
SPARK_LANES = 1  # the nemesis's lanes by default when Spark runs (see run_chaos)
SPARK_PAUSE = 10.0  # and the longest pause of a lane between two faults (a job takes 5-30 s here)


# -- the single-host form -------------------------------------------------------------------------


class SingleHostCluster(StartStop):
    """One machine, one ZooKeeper server, ``hosts`` replica processes (``LocalCluster``), with the
    interface of ``mergetxn.chaos.hosts``' clusters. Only the replica signal faults exist here
    (SIGKILL, SIGSTOP, and a SIGSTOP past the session timeout for session expiry); it is the form
    that runs wherever mergetxn runs (no root, no ensemble)."""

    form = "single"

    def __init__(
        self,
        workdir: str | os.PathLike,
        hosts: int = 3,
        session_timeout: float = SESSION_TIMEOUT,
        replica_settings: dict[str, float | int] | None = None,
        storage_url: str | None = None,
        secure: bool = False,
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.hosts = hosts
        self.secure = bool(secure)
        self._local = LocalCluster(
            self.workdir,
            replicas=hosts,
            storage_url=storage_url,
            session_timeout=session_timeout,
            settings=replica_settings,
            secure=secure,
        )
        self.services: list[Any] = []  # started before ZooKeeper and the replicas (S3 storage)

    @property
    def zk_address(self) -> str:
        return self._local.zk_address

    @property
    def replica_addresses(self) -> list[str]:
        return self._local.replica_addresses

    @property
    def storage_url(self) -> str:
        return self._local.storage_url

    @property
    def credentials_path(self) -> Path | None:
        """The first admin user's credentials file of a secured cluster (None when unsecured)."""
        return self.workdir / "security" / ADMIN_FILE if self.secure else None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            for service in self.services:
                service.start(self)
            self._local.start()
        finally:
            self._write_pids()

    def stop(self) -> None:
        try:
            self._local.stop()
        finally:
            (self.workdir / PIDS_FILE).unlink(missing_ok=True)
            for service in reversed(self.services):
                service.stop()

    def supports(self) -> set[str]:
        return {"kill_replica", "pause_replica", "expire_session"}

    def kill_replica(self, i: int) -> None:
        self._local.kill_replica(i)

    def start_replica(self, i: int) -> str:
        try:
            return self._local.start_replica(i)
        finally:
            self._write_pids()

    def pause_replica(self, i: int) -> None:
        self._local.pause_replica(i)

    def resume_replica(self, i: int) -> None:
        self._local.resume_replica(i)

    def replica_running(self, i: int) -> bool:
        return self._local.replica_pid(i) is not None

    def replica_dir(self, i: int) -> Path:
        """Replica ``i``'s directory (its log, data and settings)."""
        return self._local.replica_dir(i)

    def expire_session(self, i: int) -> None:
        """Expire replica ``i``'s ZooKeeper session the way a long GC pause does: SIGSTOP for
        longer than the session timeout (ZooKeeper gives up on it), then SIGCONT; the replica
        finds its session gone when it wakes and must open a new one."""
        self._local.pause_replica(i)
        try:
            time.sleep(self._local.session_timeout * 1.5 + 0.5)
        finally:
            self._local.resume_replica(i)

    def heal(self) -> None:
        """No network faults exist in this form: nothing to undo."""

    def _write_pids(self) -> None:
        """Record what runs, so :func:`cleanup_single` can stop it after a crashed harness
        (replica processes run in sessions of their own and outlive their parent)."""
        zk = self._local.zk
        pids = [
            p
            for p in [
                getattr(zk, "pid", None),  # an external ZooKeeper runs no process here
                *(self._local.replica_pid(i) for i in range(self.hosts)),
            ]
            if p
        ]
        (self.workdir / PIDS_FILE).write_text(json.dumps(pids))


def cleanup_single(workdir: Path) -> list[int]:
    """Kill the processes an earlier single-host run in ``workdir`` left (those recorded in its
    pid file whose command line still names ``workdir``); returns their pids."""
    path = Path(workdir).resolve() / PIDS_FILE
    try:
        pids = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    killed = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(Path(workdir).resolve()) in cmdline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    continue
            killed.append(pid)
    path.unlink(missing_ok=True)
    return killed


LOCK_FILE = ".chaos.lock"


@contextlib.contextmanager
def workdir_lock(workdir: str | os.PathLike) -> Iterator[None]:
    """Hold ``workdir`` for one run (or clean-up) at a time: a second run there would remove
    the first one's cluster as an earlier run's leftovers. RuntimeError naming the holder's pid."""
    path = Path(workdir).resolve()
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise RuntimeError(
                f"another chaos run (pid {holder}) uses {path}: give this one its own --workdir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def cleanup(workdir: Path) -> list[str]:
    """Remove what an earlier run left: its processes (single form), the hosts' namespaces and
    rules (``mergetxn.chaos.hosts.cleanup``), and the run's directory. Returns what it did."""
    with workdir_lock(workdir):
        return _cleanup_unlocked(workdir)


def _cleanup_unlocked(workdir: Path) -> list[str]:
    cluster_dir = Path(workdir) / "cluster"
    from mergetxn.chaos import hosts
    from mergetxn.chaos.spark_cluster import cleanup_spark

    done = [f"killed pid {p}" for p in cleanup_single(cluster_dir)]
    done += [f"killed Spark process {line}" for line in cleanup_spark(Path(workdir) / "spark" / "standalone")]
    done += hosts.cleanup(workdir=cluster_dir)
    for d in (cluster_dir, Path(workdir) / "spark"):
        if d.exists():
            shutil.rmtree(d, ignore_errors=True)
            done.append(f"removed {d}")
    return done


def open_cluster(
    form: str,
    workdir: Path,
    session_timeout: float = SESSION_TIMEOUT,
    replica_settings: dict[str, float | int] | None = None,
    storage_url: str | None = None,
    secure: bool = False,
) -> Any:
    """The cluster for ``form`` (not started). ``auto``: namespaces when this machine can make
    them, else loopback (``hosts.make_cluster`` decides and says why). ``storage_url``: where
    the parts are (default: a directory in ``workdir``). ``secure``: TLS, users and grants, the
    ZooKeeper ensemble TLS-only under the replicas' identity (``credentials_path``: the admin's)."""
    if form not in FORMS:
        raise InvalidInput(f"unknown form {form!r}: choose from {', '.join(FORMS)}")
    settings = dict(REPLICA_SETTINGS if replica_settings is None else replica_settings)
    if form == "single":
        return SingleHostCluster(workdir, 3, session_timeout, settings, storage_url, secure=secure)
    from mergetxn.chaos import hosts

    make: Callable[..., Any] = {
        "auto": hosts.make_cluster,
        "namespaces": hosts.NamespaceCluster,
        "loopback": hosts.LoopbackCluster,
    }[form]
    return make(
        workdir,
        hosts=3,
        session_timeout=session_timeout,
        replica_settings=settings,
        storage_url=storage_url,
        secure=secure,
    )


@contextlib.contextmanager
def client_credentials(path: Path | None) -> Iterator[None]:
    """Every client of the run (the workloads', the probes', the killed clients' processes, the
    checks') logs in as the admin of a secured cluster: ``MERGETXN_CREDENTIALS`` names its file
    while the run lasts, as an operator's environment would."""
    before = os.environ.get(ENV_CREDENTIALS)
    if path is None:
        os.environ.pop(ENV_CREDENTIALS, None)
    else:
        os.environ[ENV_CREDENTIALS] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV_CREDENTIALS, None)
        else:
            os.environ[ENV_CREDENTIALS] = before


class SparkSide:
    """The Spark workload's world in a run: a standalone cluster on the run's hosts, one driver
    session in this process, the workload and its job threads; and ``kill-executor``
    (:class:`~mergetxn.chaos.nemesis.ExecutorFaults`).

    Namespace form: the master in the first host's namespace on its address, a worker in each
    other host's namespace, the driver here at the bridge's address (the executors, on the
    workers' hosts, reach it there). Other forms: everything on 127.0.0.1."""

    def __init__(self, cluster: Any, workdir: Path, task_delay: float = SPARK_TASK_DELAY) -> None:
        from mergetxn.chaos.spark_cluster import SparkStandalone
        from mergetxn.chaos.spark_workload import SparkWorkload

        self.workdir = Path(workdir)
        self.task_delay = task_delay
        n = cluster.hosts
        if hasattr(cluster, "namespace") and hasattr(cluster, "host_address"):
            from mergetxn.chaos.hosts import BRIDGE_ADDRESS

            others = list(range(1, n)) or [0]
            self.standalone = SparkStandalone(
                self.workdir / "standalone",
                master_host=cluster.host_address(0),
                worker_hosts=[cluster.host_address(i) for i in others],
                netns=[cluster.namespace(0), *(cluster.namespace(i) for i in others)],
            )
            self.driver_host = BRIDGE_ADDRESS
        else:
            self.standalone = SparkStandalone(self.workdir / "standalone")
            self.driver_host = "127.0.0.1"
        self.marks = self.workdir / "marks"
        self.marks.mkdir(parents=True, exist_ok=True)
        self.workload = SparkWorkload(self.workdir / "traces", delay=task_delay, marks=self.marks)
        self.session: Any = None
        self.app_id: str | None = None
        self._victim: Any = None
        self._hit: set[str] = set()  # jobs (tags) that lost an executor: their retries are spared
        self.workers: list[Any] = []
        self.timings: dict[str, float] = {}

    @property
    def executors_wanted(self) -> int:
        return len(self.standalone.worker_hosts)

    def start(self) -> None:
        """The standalone cluster, then the driver's session; returns once every worker runs
        an executor of it."""
        from pyspark import SparkContext

        if SparkContext._active_spark_context is not None:  # one per process: it would be reused
            raise RuntimeError("a SparkContext already runs in this process; the Spark workload needs its own")
        t0 = time.monotonic()
        self.standalone.start()
        self.timings["standalone"] = round(time.monotonic() - t0, 1)
        os.environ["SPARK_LOCAL_IP"] = self.driver_host  # the driver's own address (else it warns)
        self.session = self.standalone.session(
            "mergetxn-chaos", driver_host=self.driver_host, log_level="WARN", **self.standalone.driver_log_conf()
        )
        self.app_id = self.session.sparkContext.applicationId
        if not self._wait_registered(120.0):
            raise RuntimeError(
                f"Spark: {len(self.registered())} of {self.executors_wanted} executors registered "
                f"with the driver within 120s (logs in {self.standalone.workdir})"
            )
        self.timings["executors"] = round(time.monotonic() - t0, 1)
        self._warm_up()
        self.timings["start"] = round(time.monotonic() - t0, 1)

    def _warm_up(self) -> None:
        """A first job on every executor that imports what the data source's tasks import: the
        executors' Python workers (reused by later tasks) start cold otherwise, and the first
        real job would take tens of seconds of the run."""
        n = 2 * self.executors_wanted
        self.session.sparkContext.parallelize(range(n), n).mapPartitions(_import_data_source).collect()

    def registered(self) -> list[str]:
        """The ids of the executors the driver has now (registered, not lost)."""
        ids = self.session.sparkContext._jsc.sc().getExecutorIds()
        return [str(ids.apply(i)) for i in range(ids.size())]

    def _wait_registered(self, timeout: float, without: str | None = None) -> bool:
        """Wait until the driver has every executor (none of them ``without``)."""

        def registered() -> bool:
            ids = self.registered()
            return len(ids) >= self.executors_wanted and without not in ids

        return bool(retries.until_true(timeout, 0.2)(registered))

    def start_jobs(
        self,
        first_process: int,
        addresses: Callable[[], list[str]],
        hosts: int,
        rec: Recorder,
        stop: threading.Event,
        rng: random.Random,
        jobs: int = SPARK_JOBS,
    ) -> None:
        from mergetxn.chaos.spark_workload import SparkWorker

        self.workers = [
            SparkWorker(
                first_process + j,
                j % hosts,
                addresses,
                self.workload,
                self.session,
                rec,
                stop,
                rng.randrange(2**31),
                timeout=CLIENT_TIMEOUT,
            )
            for j in range(jobs)
        ]
        for w in self.workers:
            w.start()

    def join(self, timeout: float = SPARK_JOIN) -> list[str]:
        """Wait for the job threads (told to stop); returns what went wrong with them."""
        problems = []
        deadline = time.monotonic() + timeout
        for w in self.workers:
            w.join(max(0.0, deadline - time.monotonic()))
            if w.is_alive():
                problems.append(f"Spark job thread {w.name} still ran {timeout:g}s after the run (its op is missing)")
            elif w.error is not None:
                problems.append(f"Spark job thread {w.name} failed: {brief(w.error)}")
        return problems

    # -- kill-executor ------------------------------------------------------------------------
    def kill(self, rng: random.Random) -> str:
        """SIGKILL the executor of a task that has just begun (see
        :meth:`SparkStandalone.kill_executor_mid_task`); NothingToFault when no task runs. A job
        loses one executor at most: its retried tasks are spared, so it can finish (on two
        executors that each take seconds to replace, a job hit again and again never would)."""
        self._victim = None
        victim, how, job = self.standalone.kill_executor_mid_task(
            self.marks, started_within=self.task_delay, app_id=self.app_id, spare=self._hit
        )
        if victim is None or job is None:
            raise NothingToFault(how)
        self._victim = victim
        self._hit.add(job)
        return f"SIGKILL executor {victim.executor_id} on {victim.host} (pid {victim.pid}) {how}"

    def restore(self) -> None:
        """Return once the killed executor is gone and its replacement has registered with the
        driver (the worker starts one at once: a JVM, seconds on a busy machine)."""
        victim = getattr(self, "_victim", None)
        if victim is None:
            return
        if not self.standalone.wait_gone(victim.pid, 10.0):
            raise RuntimeError(f"executor {victim.executor_id} (pid {victim.pid}) still runs 10s after SIGKILL")
        if not self._wait_registered(RECOVERY_LIMIT, without=victim.executor_id):
            raise RuntimeError(
                f"{len(self.registered())} of {self.executors_wanted} executors registered "
                f"{RECOVERY_LIMIT:g}s after executor {victim.executor_id} was killed"
            )

    def stop(self) -> list[str]:
        """Stop the session and the standalone cluster (nothing of it is left); returns errors."""
        problems = []
        if self.session is not None:
            try:
                self.session.stop()
            except Exception as exc:
                problems.append(f"stopping the Spark session: {brief(exc)}")
            self.session = None
        try:
            self.standalone.stop()
        except Exception as exc:
            problems.append(f"stopping the Spark cluster: {brief(exc)}")
        return problems


def _import_data_source(rows: Any) -> list[int]:
    """A Spark task that imports the data source's modules in its Python worker."""
    import spark.datasource  # noqa: F401

    return [len(list(rows))]


def form_of(cluster: Any) -> str:
    return str(getattr(cluster, "form", None) or type(cluster).__name__.removesuffix("Cluster").lower())


# -- after the run --------------------------------------------------------------------------------


def heal_everything(cluster: Any, names: list[str]) -> list[str]:
    """Undo every fault the nemesis may have left and start whatever is down; returns errors.
    ``names``: the replicas' host ids, for the messages."""
    problems: list[str] = []
    supported = {s.replace("-", "_") for s in cluster.supports()}

    def attempt(what: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as exc:
            problems.append(f"{what}: {brief(exc)}")

    if getattr(cluster, "s3", None) is not None:  # first: a replica cannot start while S3 fails
        attempt("heal S3", cluster.s3.heal)
    if supported & {"isolate", "partition", "cut_from_zk", "cut_one_way", "slow", "lossy", "expire_session"}:
        attempt("heal the network", cluster.heal)
    for i in range(cluster.hosts):
        if "kill_zk" in supported and not getattr(cluster, "zk_running", lambda i: False)(i):
            attempt(f"start ZooKeeper member {i}", partial(cluster.start_zk, i))
        if "fill_wal_disk" in supported:
            attempt(f"free {names[i]}'s WAL disk", partial(cluster.free_wal_disk, i))
        if "pause_replica" in supported:
            attempt(f"resume {names[i]}", partial(cluster.resume_replica, i))
        if not cluster.replica_running(i):
            attempt(f"start {names[i]}", partial(cluster.start_replica, i))
    return problems


class _Undecided(Exception):
    pass


class _StatusAsker:
    """Asks every replica for an op's ``commit_status`` (a client opened when its replica is
    first reachable: one may be down for good); kills a transaction still running on its
    owner. ``killed`` and ``last`` (every answer of the latest round) are kept by op index."""

    def __init__(self, addresses: list[str], host_ids: list[str]) -> None:
        self.addresses = addresses
        self.host_ids = host_ids
        self.clients: dict[int, Client] = {}
        self.index = {h: i for i, h in enumerate(host_ids)}
        self.killed: dict[int, str] = {}
        self.last: dict[int, str] = {}

    def ask(self, op: Op) -> tuple[str, int | None, str] | None:
        """(status, CSN, how it was learned) once decided, else None."""
        owner = self.index.get(Tid.parse(op.tid or "").host_id)
        answers = self._answers(op.tid or "")
        self.last[op.index] = (
            ", ".join(f"{self.host_ids[i]}: {st.status}" for i, st in answers.items()) or "no replica answered"
        )
        for i, st in answers.items():
            if st.status == "committed":
                return "committed", st.csn, f"{self.host_ids[i]} answered committed at CSN {st.csn}"
        for i, st in answers.items():
            if st.status == "aborted":
                return "aborted", None, f"{self.host_ids[i]} answered aborted ({st.reason})"
        if owner is not None and owner in answers and answers[owner].status == "running":
            self._kill(op, owner)
        return None

    def _answers(self, tid: str) -> dict[int, Any]:
        answers: dict[int, Any] = {}
        for i, address in enumerate(self.addresses):
            try:
                if i not in self.clients:
                    self.clients[i] = Client(address, timeout=10.0)
                answers[i] = self.clients[i].commit_status(tid)
            except (MergetxnError, OSError):
                continue
        return answers

    def _kill(self, op: Op, owner: int) -> None:
        try:
            self.clients[owner].kill(op.tid or "")
            self.killed[op.index] = f"killed on {self.host_ids[owner]} (still running, its client gone)"
        except (MergetxnError, OSError):
            pass

    def close(self) -> None:
        for c in self.clients.values():
            c.close()


def resolve(ops: list[Op], addresses: list[str], host_ids: list[str], limit: float = RESOLVE_LIMIT) -> int:
    """Learn the outcome of every indeterminate op with ``commit_status``, asked of every replica:
    ``committed`` from any of them, or ``aborted`` (the owner's answer, or anyone's once the owner
    is gone); a transaction still ``running`` (its client is gone) is killed on its replica first,
    then asked again. Rounds over the undecided ones until ``limit`` seconds passed. Updates the
    ops in place (``resolved`` says how); returns how many stay unresolved."""
    asker = _StatusAsker(addresses, host_ids)
    pending = [op for op in ops if op.outcome == "indeterminate" and op.tid is not None]

    def round_() -> None:
        for op in list(pending):
            decided = asker.ask(op)
            if decided is None:
                continue
            status, csn, how = decided
            op.outcome = status  # type: ignore[assignment]
            op.csn = csn
            op.resolved = "; ".join(x for x in (asker.killed.get(op.index), f"commit_status: {how}") if x)
            pending.remove(op)
        if pending:
            raise _Undecided(f"{len(pending)} undecided")

    try:
        try:
            retries.harness_wait(limit, Exception, 0.5)(round_)
        except _Undecided:
            pass
        for op in pending:
            op.message += f"; unresolved after {limit:g}s ({asker.last.get(op.index, 'not asked')})"
    finally:
        asker.close()
    return len(pending)


def take_finals(
    addresses: list[str], tables: dict[str, str], tids: list[str], replicas: list[int] | None = None
) -> list[Final]:
    """Every replica's (of ``replicas``, default all) contents at one CSN (the highest any of
    them applied) and its ``commit_status`` answer for each of ``tids``.

    Nothing pins that CSN (a plain read pins its snapshot only while it reads), so a merge that
    commits meanwhile and a cleanup pass after it can make it unreadable (SnapshotUnavailable):
    then every replica is read again at the newest CSN, until the merges have settled."""
    which = list(range(len(addresses))) if replicas is None else list(replicas)
    clients = [
        retries.harness_wait(FINAL_TIMEOUT, Exception, 0.5)(lambda a=addresses[i]: Client(a, timeout=FINAL_TIMEOUT))
        for i in which
    ]

    def contents_at_one_csn() -> tuple[int, list[dict[str, dict[str, Any]]]]:
        csn = max(retries.harness_wait(FINAL_TIMEOUT, Exception, 0.2)(c.snapshot) for c in clients)
        out = []
        for client in clients:
            contents: dict[str, dict[str, Any]] = {}
            read: dict[str, pa.Table] = {}
            for table, kind in tables.items():
                physical, column = register_table(table)
                if physical not in read:
                    read[physical] = retries.harness_wait(FINAL_TIMEOUT, (ReplicaUnavailable, OSError), 0.5)(
                        lambda t=physical, c=client: c.read(t, snapshot=csn)
                    )
                data = read[physical]
                if kind == "set":
                    contents[table] = set_values(data)
                else:
                    contents[table] = register_values(data, data.schema.names[0], column or data.schema.names[1])
            out.append(contents)
        return csn, out

    try:
        csn, contents = retries.harness_wait(2 * FINAL_TIMEOUT, SnapshotUnavailable, 1.0)(contents_at_one_csn)
        finals = []
        for i, client in enumerate(clients):
            statuses: dict[str, list[Any]] = {}
            for tid in tids:
                try:
                    st = retries.harness_wait(10.0, Exception, 0.2)(lambda t=tid, c=client: c.commit_status(t))
                    statuses[tid] = [st.status, st.csn]
                except Exception as exc:
                    statuses[tid] = [f"error: {type(exc).__name__}", None]
            finals.append(Final(which[i], csn, contents[i], statuses))
        return finals
    finally:
        for c in clients:
            c.close()


# -- the run --------------------------------------------------------------------------------------


@dataclass
class Result:
    """A run's outcome: the history, what the checker found, the summary, where the report is."""

    history: History
    findings: list[Any]
    summary: dict[str, Any]
    report_dir: Path | None
    problems: list[str] = field(default_factory=list)  # the harness's own troubles (healing, setup)
    incomplete: list[str] = field(default_factory=list)  # why the check could not be whole
    breaches: list[str] = field(default_factory=list)  # found beside the history: a part file gone, a denied call done

    @property
    def exit_code(self) -> int:
        return report.verdict(self.findings, self.incomplete, self.breaches)


def conclude(
    history: History,
    report_dir: Path | None,
    problems: list[str] | None = None,
    incomplete: list[str] | None = None,
    extra: dict[str, Any] | None = None,
    breaches: list[str] | None = None,
) -> Result:
    """Check a history and write its report (``report_dir`` None: no files). ``problems``: the
    harness's own troubles, reported; ``incomplete``: why the check could not be whole (a replica
    that never served again, finals that could not be read), which fails the run as a finding does;
    ``breaches``: what the run found wrong outside the history (a part file a read may still need
    missing or damaged, a hostile call that did what its grants deny), which fails it too."""
    from mergetxn.chaos.checker import check

    findings = check(history)
    summary = report.summarize(
        history,
        findings,
        extra={
            **(extra or {}),
            "problems": problems or [],
            "incomplete": incomplete or [],
            "breaches": breaches or [],
        },
    )
    if report_dir is not None:
        report.write_report(history, findings, summary, Path(report_dir))
    return Result(
        history,
        findings,
        summary,
        None if report_dir is None else Path(report_dir),
        problems or [],
        incomplete or [],
        breaches or [],
    )


def run_chaos(
    workdir: str | os.PathLike,
    seconds: float,
    seed: int | None = None,
    workload: str = "all",
    nemesis: str = "all",
    report_dir: str | os.PathLike | None = "chaos-report",
    clients_per_replica: int = 2,
    form: str = "auto",
    say: Callable[[str], None] = lambda text: None,
    spark: bool = False,
    max_faults: int | None = None,
    lanes: int | None = None,
    pause: float | None = None,
    storage: str = "dir",
    hostile: bool = True,
    secure: bool = False,
) -> Result:
    """Run a chaos campaign (see the module doc); ``say`` hears progress lines.

    ``workload``: ``list-append``, ``bank``, ``spark`` or ``all`` (the first two); ``spark``:
    add the Spark workload to the others. ``max_faults``: the nemesis stops after that many
    faults and the run ends once they are healed and measured, or at ``seconds`` (then fewer
    faults than asked make the check incomplete: exit code 1). ``lanes``: how many faults the
    nemesis may have under way at once; by default :data:`LANES`, or :data:`SPARK_LANES` with the
    Spark workload (on a small machine its jobs take tens of seconds under load, and with three
    lanes nearly every one of them meets a killed or cut replica before it commits). ``pause``:
    a lane waits a random time up to this many seconds between two faults; by default
    0.3 s, or :data:`SPARK_PAUSE` with the Spark workload (same reason). ``storage``: ``dir``
    (a directory every host sees) or ``s3`` (moto's S3 server, ``mergetxn.chaos.s3``). ``hostile``:
    run the hostile-client lane beside the workloads (``mergetxn.chaos.hostile``): junk frames,
    idle connections and forged parts at random replicas; a forged part accepted is a problem, and
    after the run every table's part files are checked against the log; on a secured cluster it also
    makes calls that a reader's or writer's grants deny (each must raise PermissionDenied and change
    nothing). ``secure``: the cluster is secured (``open_cluster``); every client logs in as its
    admin."""
    if secure and (spark or workload == "spark"):
        raise InvalidInput(
            "a secured chaos run has no Spark workload yet: its executors would need the "
            "credentials file too (run --secure without --spark)"
        )
    with workdir_lock(workdir), client_credentials(None):  # an unsecured run's clients present nothing
        options = campaign_options(
            workdir,
            seconds,
            seed,
            workload,
            nemesis,
            report_dir,
            clients_per_replica,
            form,
            spark,
            max_faults,
            lanes,
            pause,
            storage,
            hostile,
            secure,
        )
        return Campaign(options, say).run()


@dataclass(frozen=True)
class CampaignOptions:
    """A campaign's options, checked, with their defaults filled in (see :func:`run_chaos`)."""

    workdir: Path
    seconds: float
    seed: int
    workload: str
    nemesis: str
    report_dir: Path | None
    clients_per_replica: int
    form: str
    use_spark: bool  # the Spark workload runs (--spark, or the workload spark)
    max_faults: int | None
    lanes: int
    pause: float
    storage: str
    hostile: bool
    secure: bool


def campaign_options(
    workdir: str | os.PathLike,
    seconds: float,
    seed: int | None,
    workload: str,
    nemesis: str,
    report_dir: str | os.PathLike | None,
    clients_per_replica: int,
    form: str,
    spark: bool,
    max_faults: int | None,
    lanes: int | None,
    pause: float | None,
    storage: str,
    hostile: bool,
    secure: bool,
) -> CampaignOptions:
    """:func:`run_chaos`'s options checked (InvalidInput names the wrong one), defaults filled in:
    a random seed, and the lanes and pause of the workloads chosen."""
    from mergetxn.chaos.s3 import check_kinds

    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    if clients_per_replica < 1:
        raise InvalidInput(f"clients per replica must be at least 1, not {clients_per_replica}")
    if seconds <= 0:
        raise InvalidInput(f"seconds must be positive, not {seconds}")
    if storage not in STORAGES:
        raise InvalidInput(f"unknown storage {storage!r}: choose from {', '.join(STORAGES)}")
    check_kinds(nemesis, storage)
    use_spark = spark or workload == "spark"
    lanes, pause = _pace(use_spark, lanes, pause)
    if max_faults is not None and max_faults < 1:
        raise InvalidInput(f"faults must be at least 1, not {max_faults}")
    return CampaignOptions(
        workdir=Path(workdir).resolve(),
        seconds=seconds,
        seed=seed,
        workload=workload,
        nemesis=nemesis,
        report_dir=None if report_dir is None else Path(report_dir),
        clients_per_replica=clients_per_replica,
        form=form,
        use_spark=use_spark,
        max_faults=max_faults,
        lanes=lanes,
        pause=pause,
        storage=storage,
        hostile=hostile,
        secure=secure,
    )


def _pace(use_spark: bool, lanes: int | None, pause: float | None) -> tuple[int, float]:
    """The nemesis's lanes and its longest pause between two faults, checked; by default those
    of the workloads chosen (see :func:`run_chaos`)."""
    lanes = lanes if lanes is not None else SPARK_LANES if use_spark else LANES
    pause = pause if pause is not None else SPARK_PAUSE if use_spark else PAUSE[1]
    if lanes < 1:
        raise InvalidInput(f"lanes must be at least 1, not {lanes}")
    if not 0 <= pause <= 3600:
        raise InvalidInput(f"pause must be between 0 and 3600 seconds, not {pause}")
    return lanes, pause


class Campaign:
    """One chaos run, its phases in the order :meth:`run` takes them: open the cluster (made
    here), start it, create the tables, start the load and the faults, watch until the time or
    the faults asked for are spent, stop the faults and heal, stop the load, resolve the
    indeterminate outcomes, read every replica's final contents, check the part files, check the
    history. Whatever happens, :meth:`close` stops everything the run started."""

    def __init__(self, options: CampaignOptions, say: Callable[[str], None]) -> None:
        self.o = options
        self.say = say
        self.wls = [] if options.workload == "spark" else workloads_for(options.workload)
        self.cluster, self.s3 = self._open_cluster()
        supported = set(self.cluster.supports()) | ({"kill_executor"} if options.use_spark else set())
        supported |= self.s3.supports() if self.s3 else set()
        self.kinds, left_out = choose_kinds(options.nemesis, supported)
        self.left_out = [k for k in left_out if k != "kill-executor"]  # not the form's doing: no Spark workload
        self.rng = random.Random(options.seed)
        self.rec = Recorder()
        self.stop = threading.Event()  # the workloads stop
        self.workers: list[Worker] = []
        self.clients = 0  # the workers
        self.nem: Nemesis | None = None
        self.killers: KillClients | None = None
        self.sp: SparkSide | None = None
        self.lane: Hostile | None = None
        self.initial: dict[str, dict[str, Any]] = {}
        self.tables: dict[str, Any] = {}
        self.host_ids: list[str] = []
        self.failed: list[int] = []  # replicas that served no commit after healing
        self.problems: list[str] = []
        self.incomplete: list[str] = []
        self.breaches: list[str] = []
        self.small_writes: dict[str, Any] = {}  # the inlined and file-backed parts seen after the run

    def _open_cluster(self) -> tuple[Any, Any]:
        """What a killed run left in the workdir removed, then the cluster (and its S3) made."""
        from mergetxn.chaos.s3 import S3Storage

        workdir = self.o.workdir
        for line in _cleanup_unlocked(workdir):  # the run holds the workdir's lock
            self.say(f"cleanup: {line}")
        s3 = S3Storage(workdir / "cluster" / "s3", seed=self.o.seed) if self.o.storage == "s3" else None
        cluster = open_cluster(
            self.o.form, workdir / "cluster", storage_url=s3.url if s3 else None, secure=self.o.secure
        )
        if s3 is not None:
            s3.attach(cluster)
        if getattr(cluster, "fallback_reason", None):
            self.say(f"simulated hosts on loopback, not in network namespaces: {cluster.fallback_reason}")
        return cluster, s3

    def addresses(self) -> list[str]:
        return list(self.cluster.replica_addresses)

    def run(self) -> Result:
        try:
            self.start_cluster()
            self.create_tables()
            self.start_load_and_faults()
            self.watch()
            self.stop_faults_and_heal()
            self.stop_load()
            ops, tids = self.resolve_outcomes()
            finals = self.read_finals(tids)
            self.check_part_files()
            return self.check(ops, finals)
        finally:
            self.close()

    def start_cluster(self) -> None:
        """The cluster started (and its Spark side, with the Spark workload)."""
        o, cluster = self.o, self.cluster
        self.say(f"starting the {'secured ' if o.secure else ''}{form_of(cluster)} cluster in {o.workdir / 'cluster'}")
        cluster.start()
        if o.secure:
            os.environ[ENV_CREDENTIALS] = str(cluster.credentials_path)  # restored by client_credentials
        if self.s3 is not None:
            self.say(
                f"parts in {self.s3.url} on moto's S3 server, reached through a fault proxy at {self.s3.proxy.url}"
            )
        if o.use_spark:
            self.sp = sp = SparkSide(cluster, o.workdir / "spark")
            self.say(
                f"starting Spark: master on {sp.standalone.master_host}, workers on "
                f"{', '.join(sp.standalone.worker_hosts)}, the driver here at {sp.driver_host}"
            )
            sp.start()
            self.say(f"Spark up in {sp.timings['start']:g}s with {sp.executors_wanted} executors")

    def create_tables(self) -> None:
        """Every workload's tables (and the probe's) created, the replicas' host ids learned;
        then every replica must commit."""
        admin = Client(self.cluster.replica_addresses[0], timeout=FINAL_TIMEOUT)
        try:
            for w in self.wls:
                self.initial |= w.create(admin)
                self.tables |= w.tables
            if self.sp is not None:
                self.initial |= self.sp.workload.create(admin)
                self.tables |= self.sp.workload.tables
            if "kill-client" in self.kinds and "la0" not in self.tables:  # the killed clients insert there
                create_table(admin, "la0", LA_SCHEMA, ["key"], "parts")
                self.tables["la0"] = "set"
            create_table(admin, "probe", PROBE_SCHEMA, [], "parts")
            for a in self.cluster.replica_addresses:
                with Client(a, timeout=FINAL_TIMEOUT) as c:
                    self.host_ids.append(c.host_id)
        finally:
            admin.close()
        failed = wait_all_serving(self.addresses, self.cluster.hosts)
        if failed:
            raise RuntimeError(f"replica(s) {failed} never committed after start")

    def _header(self) -> Header:
        """The history's header; said, with what the form cannot inject."""
        o = self.o
        name = o.workload if not o.use_spark or o.workload == "spark" else f"{o.workload}+spark"
        header = Header(
            seed=o.seed,
            workload=name,
            nemesis=",".join(self.kinds) or "none",
            tables=self.tables,
            initial=self.initial,
            started=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            form=form_of(self.cluster),
        )
        if self.left_out:
            self.say(f"the {header.form} form cannot inject: {', '.join(self.left_out)}")
        quota = "" if o.max_faults is None else f", or until {o.max_faults} faults"
        self.say(
            f"seed {o.seed}; workload {name}; faults {header.nemesis} ({o.lanes} at a time); {o.seconds:g}s{quota}"
        )
        return header

    def start_load_and_faults(self) -> None:
        """The workers, the Spark jobs and the hostile lane started, then the nemesis."""
        o, hosts = self.o, self.cluster.hosts
        self.header = self._header()
        self.rec.t0 = time.monotonic()
        self.clients = n = hosts * o.clients_per_replica * len(self.wls)
        self.workers = [
            Worker(
                p,
                p % hosts,
                self.addresses,
                self.wls[(p // hosts) % len(self.wls)],
                self.rec,
                self.stop,
                self.rng.randrange(2**31),
            )
            for p in range(n)
        ]
        self.nem = nem = self._nemesis()
        for w in self.workers:
            w.start()
        if self.sp is not None:
            self.sp.start_jobs(n + 1, self.addresses, hosts, self.rec, self.stop, self.rng)
        if o.hostile:
            self.lane = Hostile(
                self.addresses,
                self.stop,
                self.rng.randrange(2**31),
                credentials=Credentials.from_file(self.cluster.credentials_path) if o.secure else None,
            )
            self.lane.start()
        nem.start()

    def _nemesis(self) -> Nemesis:
        """The nemesis (not started), and the killers of clients it calls on."""
        self.killers = killers = KillClients(self.rec, self.clients)  # one timeline lane for every killed client
        if "kill-client" in self.kinds:
            killers.prepare()
        cluster = self.cluster
        return Nemesis(
            cluster,
            self.kinds,
            self.o.seed,
            self.rec,
            lambda i, r: killers.kill_one(cluster.replica_addresses[i], i, r).detail,
            replica_names=self.host_ids,
            executors=self.sp,
            max_faults=self.o.max_faults,
            lanes=self.o.lanes,
            pause=(0.0, self.o.pause),
        )

    def _started_nemesis(self) -> Nemesis:
        if self.nem is None:
            raise RuntimeError("the nemesis has not started")
        return self.nem

    def watch(self) -> None:
        """Progress said every 5 s until the time is up or (``max_faults``) the nemesis finished."""
        nem = self._started_nemesis()
        deadline = time.monotonic() + self.o.seconds
        while (left := deadline - time.monotonic()) > 0 and not (self.o.max_faults and nem.finished.is_set()):
            nem.finished.wait(min(left, 5.0))
            self.say(f"{self.rec.now():6.1f}s  {len(self.rec.ops)} ops, {len(nem.faults)} faults")

    def stop_faults_and_heal(self) -> None:
        """The nemesis stopped (each fault healed and its recovery measured), everything healed;
        a fault kind never tested, faults short of those asked for and a replica that serves no
        commit again make the check incomplete."""
        nem, o = self._started_nemesis(), self.o
        self.say("stopping the nemesis; healing")
        nem.stop()
        self.problems += nem.errors
        self.incomplete += untested_kinds(nem.faults)
        if o.max_faults is not None and len(nem.faults) < o.max_faults:
            self.incomplete.append(
                f"only {len(nem.faults)} of the {o.max_faults} faults asked for were injected in {o.seconds:g}s"
            )
        self.problems += heal_everything(self.cluster, self.host_ids)
        self.failed = wait_all_serving(self.addresses, self.cluster.hosts)
        for i in self.failed:
            self.incomplete.append(
                f"replica {self.host_ids[i]} served no commit {RECOVERY_LIMIT:g}s after healing "
                f"(its log: {_log_hint(self.cluster, i)})"
            )

    def stop_load(self) -> None:
        """The workers, the Spark jobs and the hostile lane stopped; what the lane found kept."""
        self.stop.set()
        for w in self.workers:
            w.join(60)
        if self.sp is not None:
            self.problems += self.sp.join()
            self.problems += self.sp.stop()
        lane = self.lane
        if lane is not None:
            lane.join(60)
            self.breaches += lane.findings
            if lane.is_alive() or lane.error is not None:
                self.problems.append(
                    f"the hostile lane {'did not stop' if lane.is_alive() else 'failed'}: {lane.summary()['error']}"
                )

    def resolve_outcomes(self) -> tuple[list[Op], list[str]]:
        """The ops in order, indeterminate outcomes resolved, and the transactions whose
        ``commit_status`` every replica must answer."""
        self.say("resolving indeterminate outcomes")
        ops = sorted(self.rec.ops, key=lambda o: o.index)
        resolve(ops, self.cluster.replica_addresses, self.host_ids)
        # A transaction that wrote nothing commits without a log entry: no replica can name a CSN for it.
        tids = [
            o.tid
            for o in ops
            if o.tid and writes(o) and (o.outcome == "committed" or o.resolved or o.outcome == "indeterminate")
        ]
        return ops, tids

    def serving(self) -> list[int]:
        """The replicas that served a commit after healing."""
        return [i for i in range(self.cluster.hosts) if i not in self.failed]

    def read_finals(self, tids: list[str]) -> list[Final]:
        """Every serving replica's contents at one CSN; none read makes the check incomplete."""
        self.say("reading every replica at one CSN")
        serving = self.serving()
        if not serving:  # each is named above as served no commit: nothing to read
            self.incomplete.append("no replica served after healing: no final contents to compare")
            return []
        try:
            return take_finals(self.cluster.replica_addresses, self.tables, tids, serving)
        except Exception as exc:  # the check cannot be complete without them: said, and exit code 1
            self.incomplete.append(f"could not read every replica at one CSN: {brief(exc)}")
            return []

    def check_part_files(self) -> None:
        """Every part file a read may need, and what the hostile lane's denied calls left, checked
        through the first serving replica."""
        serving = self.serving()
        if not serving:
            return
        address = self.cluster.replica_addresses[serving[0]]
        damaged, why_not = check_storage(address)
        self.breaches += damaged
        self.incomplete += why_not
        self.small_writes = small_writes(address, [t for t in self.tables if t.startswith("la")])
        if self.lane is not None:
            try:
                self.breaches += self.lane.verify(address)
            except MergetxnError as exc:
                self.incomplete.append(f"could not check what the hostile lane's denied calls left: {brief(exc)}")

    def check(self, ops: list[Op], finals: list[Final]) -> Result:
        """The history checked and its report written."""
        nem = self._started_nemesis()
        history = History(self.header, ops, sorted(nem.faults, key=lambda f: f.start), finals)
        self.say("checking the history")
        return conclude(
            history, self.o.report_dir, self.problems, self.incomplete, breaches=self.breaches, extra=self._extra()
        )

    def _extra(self) -> dict[str, Any]:
        """The summary's figures of the run beside the history's."""
        o, sp = self.o, self.sp
        return {
            "seconds": o.seconds,
            "clients": self.clients + (len(sp.workers) if sp else 0),
            "failovers": sum(w.failovers for w in [*self.workers, *(sp.workers if sp else [])]),
            "left_out": self.left_out,
            "max_faults": o.max_faults,
            "lanes": o.lanes,
            "pause": o.pause,
            "run_seconds": round(self.rec.now(), 1),
            "storage": o.storage,
            **({"s3": self.s3.stats()} if self.s3 else {}),
            **({"hostile": self.lane.summary()} if self.lane is not None else {}),
            **({"small_writes": self.small_writes} if self.small_writes else {}),
        }

    def close(self) -> None:
        """Everything the run started stopped, whatever happened: the load, the nemesis (healing
        only), the killers, the Spark side, the cluster."""
        self.stop.set()
        if self.nem is not None:
            self.nem.stop(30, measure=False)
        if self.killers is not None:
            self.killers.close()
        for w in self.workers:
            w.join(15)
        if self.sp is not None:
            self.sp.join(30)
            self.sp.stop()
        self.cluster.stop()


def check_storage(address: str) -> tuple[list[str], list[str]]:
    """Every part file a read may still need, checked against the log (size and checksum) through
    one replica: a file that a refused, forged or aborted call deleted, or that cleanup took too
    early, is found here. Returns (what is missing or damaged, why the check could not be made)."""
    try:
        with Client(address, timeout=FINAL_TIMEOUT) as c:
            result = c.check()
    except Exception as exc:  # the check cannot be complete without it
        return [], [f"could not check the part files through {address}: {brief(exc)}"]
    return [
        f"table {t['table']!r}: part {p['part']} ({'visible' if p.get('visible') else 'removed, in the retention window'}, "
        f"committed at CSN {p.get('creation_csn')}): {p['problem']}"
        for t in result["tables"]
        for p in t["problems"]
    ], []


def small_writes(address: str, tables: list[str]) -> dict[str, Any]:
    """Per table, its parts after the run (visible, and removed within the retention window)
    inlined and in files: that the run wrote both kinds side by side and flushed inlined parts
    away (docs/architecture/small-writes.md). Empty when it cannot be read."""
    try:
        with Client(address, timeout=FINAL_TIMEOUT) as c:
            out: dict[str, Any] = {}
            for table in tables:
                parts = c.parts(table).to_pylist()
                inlined = [p for p in parts if p["inlined"]]
                out[table] = {
                    "inlined_visible": sum(1 for p in inlined if p["visible"]),
                    "inlined_removed": sum(1 for p in inlined if not p["visible"]),
                    "files": len(parts) - len(inlined),
                }
            return out
    except Exception:  # noqa: BLE001 - a figure of the summary, not a check: left out
        return {}


def untested_kinds(faults: list[Fault]) -> list[str]:
    """Kinds of fault the run meant to test but never did: every injection of them failed."""
    out = []
    for kind in sorted({f.kind for f in faults}):
        details = [f.detail for f in faults if f.kind == kind]
        if all(d.startswith("inject failed") for d in details):
            out.append(f"no {kind} fault took effect: all {len(details)} injection(s) failed ({details[-1][:200]})")
    return out


def _log_hint(cluster: Any, i: int) -> str:
    """Where replica ``i``'s log is, for a message (each form keeps it elsewhere)."""
    for candidate in (getattr(cluster, "host_dir", None), getattr(cluster, "replica_dir", None)):
        if candidate is not None:
            return str(candidate(i) / "replica.log")
    return "see the cluster directory"


def writes(op: Op) -> bool:
    """Whether ``op`` asked for any write (only those reach the log)."""
    return any(m[0] != "r" for m in op.mops)


def history_from(path: Path) -> History:
    """A history written by a run (``history.jsonl``), for ``mergetxn chaos --check-history``."""
    if not Path(path).exists():
        raise InvalidInput(f"no history at {path}")
    try:
        return History.read(Path(path))
    except (ValueError, TypeError, KeyError) as exc:
        raise InvalidInput(f"{path} is not a chaos history: {exc}") from None


__all__ = [
    "FORMS",
    "Campaign",
    "CampaignOptions",
    "Result",
    "SingleHostCluster",
    "campaign_options",
    "cleanup",
    "conclude",
    "history_from",
    "open_cluster",
    "resolve",
    "run_chaos",
    "take_finals",
    "writes",
]
