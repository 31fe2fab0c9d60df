"""A Spark standalone cluster from the pyspark package's own classes, for the Spark workload of
``mergetxn chaos``: a master and one worker per simulated host, executors on other hosts than
the driver, and an executor that can be killed mid-task.

Every process is ``java -cp <pyspark>/jars/* org.apache.spark.deploy.master.Master`` (or
``...worker.Worker``), the JVM and jars that the embedded ZooKeeper uses too
(:func:`mergetxn.local.zkserver.java_executable`, :func:`~mergetxn.local.zkserver.find_pyspark_jars`), with
``SPARK_HOME`` the pyspark package so that a worker can build its executors' command lines. A
process runs inside a network namespace when one is given for it (``ip netns exec <ns> ...``;
index 0 of ``netns`` is the master, then the workers), in its own process group, with its log
and work directory under ``workdir``, and with ``MERGETXN_SPARK_DIR=<workdir>`` in its
environment: executors and their Python workers inherit it, which is how
:meth:`SparkStandalone.kill_executor` and :func:`cleanup_spark` find them in ``/proc``.

Two forms, one class:

* loopback: everything on 127.0.0.1 (``SparkStandalone(workdir)``), what the tests use;
* namespaces: ``SparkStandalone(workdir, master_host="10.231.0.11", worker_hosts=("10.231.0.12",
  "10.231.0.13"), netns=("mtx-h1", "mtx-h2", "mtx-h3"))`` and sessions made with
  ``session(app, driver_host="10.231.0.1")`` (the harness's address on the bridge), so that the
  executors reach the driver, which runs in the harness's own namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.core import retries
from mergetxn.local.zkserver import (
    JavaProcess,
    find_pyspark_jars,
    free_ports,
    java_executable,
    log_tail,
)

MARKER = "MERGETXN_SPARK_DIR"  # in the environment of every process of one standalone cluster
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# The master and the workers only keep books: a small heap, and C1 only (they start faster).
DAEMON_JVM_FLAGS = (
    "-Xms32m",
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Djava.net.preferIPv4Stack=true",
    "-Djava.awt.headless=true",
    "-Dspark.master.rest.enabled=false",
)  # its REST server has a fixed port (6066)
ROOT = Path(__file__).resolve().parents[2]  # the project: executors import its packages from here


class SparkClusterError(RuntimeError):
    """The standalone cluster did not start (the message has the log's tail)."""


@dataclass(frozen=True)
class Executor:
    """One running executor JVM of this cluster."""

    pid: int
    app_id: str
    executor_id: str
    host: str


def _spark_home() -> Path:
    return find_pyspark_jars().parent


def _log4j2(path: Path, log_file: Path) -> Path:
    """log4j2 properties: INFO to one file (the master's registration lines are what a person
    reads when a worker does not come)."""
    path.write_text(
        "\n".join(
            [
                "status = error",
                "appender.file.type = File",
                "appender.file.name = FILE",
                f"appender.file.fileName = {log_file}",
                "appender.file.append = true",
                "appender.file.layout.type = PatternLayout",
                "appender.file.layout.pattern = %d{ISO8601} [%t] %-5level %c{1} - %m%n",
                "rootLogger.level = info",
                "rootLogger.appenderRef.file.ref = FILE",
                "logger.jetty.name = org.sparkproject.jetty",
                "logger.jetty.level = warn",
                "",
            ]
        )
    )
    return path


class SparkStandalone:
    """A Spark standalone master and ``len(worker_hosts)`` workers (1 core, ``worker_memory``
    each), stopped by :meth:`stop` or on leaving the ``with`` block, also after a partial start.

    ``netns[i]``: the network namespace process ``i`` runs in (0: the master, then the workers),
    or None for this one. ``python``: the interpreter of the executors' Python workers (and the
    driver's), by default the one running this code."""

    def __init__(
        self,
        workdir: str | os.PathLike,
        master_host: str = "127.0.0.1",
        worker_hosts: Sequence[str] = ("127.0.0.1", "127.0.0.1"),
        netns: Sequence[str | None] = (None, None, None),
        python: str = sys.executable,
        worker_memory: str = "1g",
        executor_memory: str = "512m",
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.master_host = master_host
        self.worker_hosts = tuple(worker_hosts)
        self.netns = tuple(netns) + (None,) * (1 + len(self.worker_hosts) - len(netns))
        if len(self.netns) != 1 + len(self.worker_hosts):
            raise ValueError(
                f"netns names the master and each worker: {len(self.worker_hosts) + 1} entries, not {len(netns)}"
            )
        self.python = python
        self.worker_memory = worker_memory
        self.executor_memory = executor_memory
        self.master_port, self.master_ui_port, *self.worker_ports = free_ports(2 + 2 * len(self.worker_hosts))
        self._procs: list[JavaProcess] = []
        self.timings: dict[str, float] = {}

    # -- addresses ------------------------------------------------------------------------------
    @property
    def master_url(self) -> str:
        return f"spark://{self.master_host}:{self.master_port}"

    @property
    def master_ui(self) -> str:
        return f"http://{self.master_host}:{self.master_ui_port}"

    def log_path(self, i: int) -> Path:
        """Process ``i``'s log (0: the master, then the workers)."""
        return self.workdir / ("master.log" if i == 0 else f"worker-{i}.log")

    def worker_dir(self, i: int) -> Path:
        """Worker ``i``'s (1-based) work directory: its executors' directories and logs."""
        return self.workdir / f"worker-{i}"

    # -- life -----------------------------------------------------------------------------------
    def __enter__(self) -> SparkStandalone:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _env(self, i: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "SPARK_HOME": str(_spark_home()),
                "SPARK_SCALA_VERSION": "2.13",  # what the launcher would read from its build dirs
                "PYSPARK_PYTHON": self.python,
                "SPARK_LOG_DIR": str(self.workdir),
                "SPARK_LOCAL_IP": self.master_host if i == 0 else self.worker_hosts[i - 1],  # also its UI's
                MARKER: str(self.workdir),
            }
        )
        java_home = Path(java_executable()).resolve().parent.parent
        env.setdefault("JAVA_HOME", str(java_home))
        return env

    def _argv(self, i: int, main_class: str, args: list[str]) -> list[str]:
        conf = _log4j2(self.workdir / f"log4j2-{i}.properties", self.log_path(i))
        env = [f"{k}={v}" for k, v in sorted(self._env(i).items()) if k != "PWD"]
        ns = self.netns[i]
        prefix = ["ip", "netns", "exec", ns] if ns else []
        # `env` puts the environment on the command line: the process is started by
        # mergetxn.local.zkserver's process holder (own process group, a watchdog tied to this
        # interpreter), which passes its own environment on.
        return [
            *prefix,
            "env",
            "-i",
            *env,
            java_executable(),
            *DAEMON_JVM_FLAGS,
            f"-Dlog4j2.configurationFile={conf}",
            "-cp",
            f"{find_pyspark_jars()}/*",
            main_class,
            *args,
        ]

    def start(self, timeout: float = 120.0) -> SparkStandalone:
        """Start the master, then the workers; return once the master lists every worker
        alive. Stops what it started when that fails."""
        t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._start(
                0,
                MASTER_CLASS,
                ["--host", self.master_host, "--port", str(self.master_port), "--webui-port", str(self.master_ui_port)],
            )
            self._wait(lambda: self._state() is not None, timeout, "the master to serve its status", [0])
            self.timings["master"] = round(time.monotonic() - t0, 2)
            for w, host in enumerate(self.worker_hosts, start=1):
                port, ui = self.worker_ports[2 * (w - 1) : 2 * w]
                self.worker_dir(w).mkdir(parents=True, exist_ok=True)
                self._start(
                    w,
                    WORKER_CLASS,
                    [
                        "--host",
                        host,
                        "--port",
                        str(port),
                        "--webui-port",
                        str(ui),
                        "--cores",
                        "1",
                        "--memory",
                        self.worker_memory,
                        "--work-dir",
                        str(self.worker_dir(w)),
                        self.master_url,
                    ],
                )
            want = len(self.worker_hosts)
            self._wait(
                lambda: len(self.alive_workers()) >= want,
                timeout - (time.monotonic() - t0),
                f"{want} workers to register with the master",
                range(want + 1),
            )
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = round(time.monotonic() - t0, 2)
        return self

    def _start(self, i: int, main_class: str, args: list[str]) -> None:
        proc = JavaProcess(
            self._argv(i, main_class, args), self.workdir / f"{'master' if i == 0 else f'worker-{i}'}.out", self.workdir
        )
        proc.start()
        self._procs.append(proc)

    def _wait(self, check: Any, timeout: float, what: str, procs: Iterable[int]) -> None:
        procs = list(procs)

        def failed(why: str, i: int) -> SparkClusterError:
            out = self._procs[i].log_path if i < len(self._procs) else self.log_path(i)
            return SparkClusterError(
                f"Spark standalone: waiting for {what}: {why}; "
                f"{self.log_path(i)}:\n{log_tail(self.log_path(i))}\n{out}:\n{log_tail(out)}"
            )

        def ready() -> bool:
            if check():
                return True
            dead = [i for i in procs if i < len(self._procs) and not self._procs[i].running]
            if dead:
                raise failed(f"process {dead[0]} exited", dead[0])
            return False

        if not retries.until_true(max(timeout, 1.0), 0.2)(ready):
            raise failed(f"not within {timeout:.0f}s", procs[-1])

    def _state(self) -> dict | None:
        """The master's status (its web UI's ``/json/``), None while it does not answer."""
        try:
            with urllib.request.urlopen(f"{self.master_ui}/json/", timeout=2) as r:
                return json.load(r)
        except (OSError, ValueError):
            return None

    def alive_workers(self) -> list[dict]:
        state = self._state() or {}
        return [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every process (workers first, which stop their executors), then whatever of
        this cluster is left (executors, Python workers): nothing of it outlives this call."""
        for proc in reversed(self._procs):
            with contextlib.suppress(Exception):
                proc.stop(timeout=timeout)
        self._procs = []
        cleanup_spark(self.workdir)

    @property
    def running(self) -> bool:
        return bool(self._procs) and all(p.running for p in self._procs)

    # -- executors --------------------------------------------------------------------------------
    def executors(self) -> list[Executor]:
        """The executor JVMs of this cluster that run now."""
        out = []
        for pid, argv in _processes(self.workdir):
            if EXECUTOR_CLASS in argv:
                out.append(Executor(pid, _arg(argv, "--app-id"), _arg(argv, "--executor-id"), _arg(argv, "--hostname")))
        return sorted(out, key=lambda e: (e.app_id, e.executor_id))

    def kill_executor(self, app_id: str | None = None, choose: Any = None) -> Executor | None:
        """SIGKILL one running executor JVM (of application ``app_id`` if given), as a crash of
        its host would; its worker reports it lost and the driver runs its tasks again
        elsewhere. ``choose``: picks one from a list (e.g. ``random.Random(seed).choice``), the
        first by default. Returns the executor killed, None when none runs."""
        execs = [e for e in self.executors() if app_id is None or e.app_id == app_id]
        if not execs:
            return None
        victim = choose(execs) if choose else execs[0]
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim.pid, signal.SIGKILL)
        return victim

    def executor_of(self, pid: int) -> Executor | None:
        """The executor of this cluster that process ``pid`` runs under (itself, or one of its
        descendants: the executor's Python daemon and the workers it forks), None if none."""
        execs = {e.pid: e for e in self.executors()}
        seen: set[int] = set()
        while pid > 1 and pid not in seen:
            if pid in execs:
                return execs[pid]
            seen.add(pid)
            pid = _parent(pid)
        return None

    def kill_executor_mid_task(
        self,
        marks: str | os.PathLike,
        started_within: float,
        wait: float = 30.0,
        app_id: str | None = None,
        spare: Container[str] = (),
    ) -> tuple[Executor | None, str, str | None]:
        """SIGKILL an executor while it runs a task: wait (up to ``wait`` seconds) for a task
        attempt that started less than ``started_within`` seconds ago (its mark file in
        ``marks``, see ``mergetxn.chaos.spark_workload.Rows``: named ``<tag>-<pid>-<partition>-
        <attempt>`` after the Python worker running it) and kill the executor that worker runs
        under; tasks of the jobs named in ``spare`` (their tags) are left alone. Returns the
        executor killed (None when no task ran within the wait: nothing is killed then), a
        sentence saying what it was doing, and the tag of the job whose task it ran."""
        deadline = time.monotonic() + wait
        marks = Path(marks)
        while True:
            now = time.time()
            for name, mtime in _recent_marks(marks, now - started_within):
                with contextlib.suppress(ValueError, IndexError):
                    tag, pid, partition, attempt = name.rsplit("-", 3)
                    if tag in spare:
                        continue
                    victim = self.executor_of(int(pid))
                    if victim is not None and (app_id is None or victim.app_id == app_id):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(victim.pid, signal.SIGKILL)
                        return (
                            victim,
                            (
                                f"while it ran task {partition} (attempt {attempt}) of job {tag}, "
                                f"{now - mtime:.2f}s after the task began"
                            ),
                            tag,
                        )
            if time.monotonic() >= deadline:
                return None, f"no task ran within {wait:g}s: nothing killed", None
            time.sleep(0.05)

    def wait_gone(self, pid: int, timeout: float) -> bool:
        """Wait until process ``pid`` is gone (or a zombie); returns whether it is."""
        return bool(retries.until_true(timeout, 0.05)(lambda: pid not in {p for p, _ in _processes(self.workdir)}))

    # -- a driver -----------------------------------------------------------------------------
    def driver_log_conf(self) -> dict[str, str]:
        """Session settings that send the driver's log to ``driver.log`` in the work directory
        instead of the console (for a harness that prints its own progress)."""
        conf = _log4j2(self.workdir / "log4j2-driver.properties", self.workdir / "driver.log")
        return {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={conf}"}

    def conf(self, app_name: str, driver_host: str = "127.0.0.1") -> dict[str, str]:
        """The session settings for a driver of this cluster at ``driver_host`` (the address
        the executors reach it at: 127.0.0.1 in the loopback form, the harness's bridge address
        in the namespace form)."""
        pythonpath = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        return {
            "spark.master": self.master_url,
            "spark.app.name": app_name,
            "spark.driver.host": driver_host,
            "spark.driver.bindAddress": driver_host,
            "spark.driver.memory": "1g",
            "spark.executor.memory": self.executor_memory,
            "spark.executor.cores": "1",
            "spark.cores.max": str(len(self.worker_hosts)),
            "spark.task.maxFailures": "8",  # a killed executor's tasks are run again
            "spark.pyspark.python": self.python,
            "spark.pyspark.driver.python": self.python,
            "spark.executorEnv.PYTHONPATH": pythonpath,
            "spark.executorEnv.PYSPARK_PYTHON": self.python,
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.network.timeout": "60s",
            "spark.executor.heartbeatInterval": "5s",
            # Executors only hand rows to Python workers here: C1 starts a replacement faster.
            "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        }

    def session(self, app_name: str, driver_host: str = "127.0.0.1", log_level: str = "ERROR", **extra: str) -> Any:
        """A SparkSession of this cluster with the mergetxn data source registered (one
        SparkContext per process: stop the session before making another); ``log_level``: what
        the driver prints (``extra`` may send its log elsewhere)."""
        from pyspark.sql import SparkSession

        import spark as mergetxn_spark

        os.environ["PYSPARK_PYTHON"] = self.python
        os.environ["PYSPARK_DRIVER_PYTHON"] = self.python
        builder = SparkSession.builder
        for k, v in (self.conf(app_name, driver_host) | extra).items():
            builder = builder.config(k, v)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel(log_level)
        mergetxn_spark.register(session)
        return session


# -- finding this cluster's processes -----------------------------------------------------------


def _arg(argv: list[str], name: str) -> str:
    with contextlib.suppress(ValueError, IndexError):
        return argv[argv.index(name) + 1]
    return ""


def _parent(pid: int) -> int:
    """Process ``pid``'s parent (0 when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _recent_marks(marks: Path, since: float) -> list[tuple[str, float]]:
    """``(name, mtime)`` of the mark files touched after ``since`` (epoch seconds), newest
    first; older ones (more than a minute) are removed on the way, so the directory stays
    small over a long run."""
    out = []
    try:
        entries = list(os.scandir(marks))
    except OSError:
        return []
    for entry in entries:
        try:
            mtime = entry.stat().st_mtime
        except OSError:
            continue
        if mtime >= since:
            out.append((entry.name, mtime))
        elif mtime < since - 60:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
    return sorted(out, key=lambda nm: -nm[1])


def _processes(workdir: Path) -> list[tuple[int, list[str]]]:
    """``(pid, argv)`` of every process whose environment says it belongs to the standalone
    cluster in ``workdir`` (the marker is inherited by executors and their Python workers)."""
    want = f"{MARKER}={Path(workdir).resolve()}".encode()
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if want not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if argv:  # a zombie has no cmdline: nothing left to kill
            out.append((int(entry.name), argv))
    return out


def cleanup_spark(workdir: str | os.PathLike) -> list[str]:
    """SIGKILL every process left of the standalone cluster in ``workdir`` (after a harness
    killed without stopping it, or a process its parent did not stop); returns what it
    killed, one line each."""
    killed = []
    for _ in range(5):  # a killed executor's Python workers may still be forking
        procs = _processes(Path(workdir))
        if not procs:
            break
        for pid, argv in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                name = next((a for a in argv if a.startswith("org.apache.spark.")), " ".join(argv[:3]))
                killed.append(f"{pid} {name}")
        time.sleep(0.2)
    return killed
