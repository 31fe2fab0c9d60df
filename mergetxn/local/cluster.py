"""The embedded default: a real ZooKeeper and N replica processes on this machine."""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from coordinator.core import retries
from coordinator.core.errors import InvalidInput, ReplicaUnavailable, quote
from coordinator.wire.security import (
    ENV_CREDENTIALS,
    REPLICA_FILE,
    Credentials,
    admin_credentials,
    make_cluster_credentials,
)
from mergetxn.client.arguments import checked, checked_methods
from mergetxn.client.client import Client
from mergetxn.local.zkserver import StartStop, ZooKeeperHandle, start_zookeeper

log = logging.getLogger(__name__)

T = TypeVar("T")
# The checkout (or site-packages) that holds this code's packages: the replicas import theirs
# from here, not from whatever directory the cluster was started in.
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _replica_index(method: Callable[..., T]) -> Callable[..., T]:
    """Refuse a replica index that is not one of this cluster's (a negative one would name a
    replica from the end: ``kill_replica(-1)`` must not kill the last one)."""

    @functools.wraps(method)
    def indexed(self: LocalCluster, *args: Any, **kwargs: Any) -> T:
        i = args[0] if args else kwargs.get("i", 0)
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.n:
            raise InvalidInput(f"replica index must be an integer from 0 to {self.n - 1}, not {quote(i)}")
        return method(self, *args, **kwargs)

    return indexed


@checked_methods
class LocalCluster(StartStop):
    """Context manager: ZooKeeper + ``replicas`` replica processes, local storage in ``workdir``.

    Replica ``i`` keeps its host id (``r<i>``), data directory and port across
    :meth:`kill_replica` / :meth:`start_replica`, so a restarted replica recovers from its WAL
    and clients find it at the same address.

    ``secure=True``: new credentials in ``workdir/security`` (coordinator/wire/security.py): the
    replicas' identity (their TLS certificate and the ZooKeeper identity: the root is under its
    ACLs) and the first admin user's. The replicas serve only TLS clients that log in as a user,
    and check every call against the user's role and grants. :attr:`credentials` are the admin's
    (what ``coordinator.connect`` takes, and :meth:`client` uses); :meth:`add_user` makes more
    users. Processes get the credentials file's path, never a secret.
    """

    @functools.partial(checked, "LocalCluster")
    def __init__(
        self,
        workdir: str | os.PathLike,
        replicas: int = 3,
        zk_address: str | None = None,
        storage_url: str | None = None,
        epoch_size: int | None = None,
        txn_max_seconds: float = 3600.0,
        txn_max_rows: int = 100_000_000,
        session_timeout: float = 10.0,
        root: str = "/mergetxn",
        settings: dict[str, float | int] | None = None,
        metrics: bool = False,
        secure: bool = False,
    ) -> None:
        """``settings``: tunable replica settings by name (``replicas.settings.TUNABLE``: merges,
        cleanup, ``retain_entries`` and the rest of the log tail), for every replica. Every value
        is checked (``replicas.settings.SETTINGS``) before anything starts. ``metrics``: every
        replica serves Prometheus metrics on a free port (its ``info`` says where)."""
        from replicas.settings import SETTINGS, check_setting

        if settings is not None and not isinstance(settings, dict):
            raise InvalidInput(f"settings must be a dict of replica settings, not {type(settings).__name__}")
        self.settings = {name: check_setting(name, v) for name, v in (settings or {}).items()}
        self.workdir = Path(workdir).resolve()
        self.n = replicas
        self._zk_arg = zk_address
        self.storage_url = storage_url or str(self.workdir / "storage")
        self.epoch_size = SETTINGS["epoch_size"].check(epoch_size)
        self.txn_max_seconds = SETTINGS["txn_max_seconds"].check(txn_max_seconds)
        self.txn_max_rows = SETTINGS["txn_max_rows"].check(txn_max_rows)
        self.session_timeout = SETTINGS["session_timeout"].check(session_timeout)
        self.root = SETTINGS["root"].check(root)
        self.metrics = bool(metrics)
        self.secure = bool(secure)
        self._credentials: Credentials | None = None  # the replicas' identity
        self._admin: Credentials | None = None
        self.zk: ZooKeeperHandle | None = None  # started by start()
        self._procs: list[subprocess.Popen | None] = [None] * replicas
        self._ports: list[int] = [0] * replicas
        self.replica_addresses: list[str] = [""] * replicas

    @property
    def zk_address(self) -> str:
        return self._zk().address

    def _zk(self) -> ZooKeeperHandle:
        if self.zk is None:
            raise ReplicaUnavailable("the cluster is not started: call start() (or use it in a with block) first")
        return self.zk

    @property
    def credentials(self) -> Credentials | None:
        """The admin user's credentials (None unless ``secure``): what ``coordinator.connect``
        takes. They log in to replicas only, never to ZooKeeper."""
        return self._admin

    def add_user(self, name: str, role: str, tables: list[str] | None = None) -> Credentials:
        """A new user of role ``"admin"``, ``"writer"`` or ``"reader"`` with grants on ``tables``
        (None: every table); its credentials (``client.create_user`` as the admin)."""
        if not self.secure:
            raise InvalidInput("add_user: only a secured cluster has users (LocalCluster(..., secure=True))")
        running = [i for i, a in enumerate(self.replica_addresses) if a and self.replica_pid(i)]
        if self._admin is None or not running:
            raise ReplicaUnavailable("add_user: no replica is running (start the cluster first)")
        with self.client(running[0]) as c:
            return c.create_user(name, role, tables)

    def _credentials_file(self) -> Path:
        return self.workdir / "security" / REPLICA_FILE

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.secure and self._credentials is None:  # kept in the workdir: a restart on it keeps them
            self._credentials = (
                Credentials.from_file(self._credentials_file())
                if self._credentials_file().exists()
                else make_cluster_credentials(self.workdir / "security", ("127.0.0.1", "localhost"))
            )
            self._admin = admin_credentials(self.workdir / "security")
        # Secure: the embedded ZooKeeper serves TLS only, refuses sessions without the replicas'
        # identity and keeps / under its ACL (mergetxn/local/zkserver.py, ZooKeeperTls).
        self.zk = start_zookeeper(self.workdir / "zookeeper", self._zk_arg, self._credentials)
        try:
            for i in range(self.n):
                self.start_replica(i, wait=False)
            for i in range(self.n):
                self._wait_ready(i)
        except BaseException:
            self.stop()
            raise

    def replica_dir(self, i: int) -> Path:
        """Replica i's directory (its WAL, log and address file): what a report points at."""
        return self.workdir / f"replica-{i}"

    @_replica_index
    def start_replica(self, i: int, wait: bool = True) -> str:
        """Start (or restart) replica ``i``; returns its address once it serves."""
        running = self._procs[i]
        if running is not None and running.poll() is None:
            return self.replica_addresses[i]
        d = self.replica_dir(i)
        d.mkdir(parents=True, exist_ok=True)
        ready = d / "address"
        ready.unlink(missing_ok=True)
        from replicas.settings import command_line

        argv = [
            sys.executable,
            "-m",
            "replicas.server",
            "--ready-file",
            str(ready),
            *command_line(
                {
                    "zk": self._zk().address,
                    "storage_url": self.storage_url,
                    "host_id": f"r{i}",
                    "data_dir": d,
                    "port": self._ports[i],
                    "root": self.root,
                    "epoch_size": self.epoch_size,
                    "txn_max_seconds": self.txn_max_seconds,
                    "txn_max_rows": self.txn_max_rows,
                    "session_timeout": self.session_timeout,
                    "metrics_port": 0 if self.metrics else None,
                    **self.settings,
                    "credentials_file": self._credentials_file() if self.secure else None,
                }
            ),
        ]
        env = dict(os.environ)
        env.pop(ENV_CREDENTIALS, None)  # the replicas' credentials are what ``secure`` says
        env["PYTHONPATH"] = str(PROJECT_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        log = open(d / "replica.log", "ab")
        self._procs[i] = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, env=env, start_new_session=True)
        log.close()
        if wait:
            self._wait_ready(i)
        return self.replica_addresses[i]

    @_replica_index
    def pause_replica(self, i: int) -> None:
        """SIGSTOP replica ``i``: a long GC pause or a frozen VM, for fault tests."""
        proc = self._procs[i]
        if proc is None or proc.poll() is not None:
            raise InvalidInput(f"replica {i} is not running")
        proc.send_signal(signal.SIGSTOP)
        if not wait_stopped([proc.pid]):  # a thread in a long fsync: still a pause, as the chaos hosts take it
            log.warning("replica %d: SIGSTOP sent, some thread still runs after 10 s", i)

    @_replica_index
    def resume_replica(self, i: int) -> None:
        """SIGCONT replica ``i`` after :meth:`pause_replica`."""
        proc = self._procs[i]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)

    def _wait_ready(self, i: int, timeout: float = 90.0) -> None:
        ready = self.replica_dir(i) / "address"

        def check() -> None:
            proc = self._procs[i]
            assert proc is not None  # started before it is waited for
            if proc.poll() is not None:
                tail = (self.replica_dir(i) / "replica.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"replica {i} exited with {proc.returncode}:\n{tail}")
            if not ready.exists():
                raise ReplicaUnavailable(f"replica {i} not ready")

        for attempt in retries.until_ready(timeout, on=ReplicaUnavailable):
            with attempt:
                check()
        address = ready.read_text().strip()
        self.replica_addresses[i] = address
        self._ports[i] = int(address.rsplit(":", 1)[1])

    @_replica_index
    def kill_replica(self, i: int) -> None:
        """SIGKILL replica ``i`` (fault tests): no shutdown code runs."""
        proc = self._procs[i]
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self._procs[i] = None

    @_replica_index
    def stop_replica(self, i: int, timeout: float = 15.0) -> None:
        proc = self._procs[i]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a paused replica handles SIGTERM only once resumed
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._procs[i] = None

    @_replica_index
    def replica_pid(self, i: int) -> int | None:
        proc = self._procs[i]
        return proc.pid if proc is not None and proc.poll() is None else None

    @_replica_index
    def client(self, i: int = 0) -> Client:
        """A client of replica ``i`` (a new one each call; they are cheap)."""
        if not self.replica_addresses[i]:
            raise ReplicaUnavailable(f"replica {i} is not running")
        return Client(self.replica_addresses[i], credentials=self.credentials)

    def stop(self) -> None:
        deadline = time.monotonic() + 20
        for proc in self._procs:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for i, proc in enumerate(self._procs):
            if proc is not None:
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                self._procs[i] = None
        if self.zk is not None:
            self.zk.stop()


def _stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (or gone): SIGSTOP is delivered to each thread
    as it next enters the kernel, so a thread on the other CPU may still answer a request sent
    right after ``kill`` returned."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("T", "t", "Z", "X"):
            return False
    return True


def wait_stopped(pids: list[int], timeout: float = 10.0) -> bool:
    """Poll until every thread of ``pids`` is stopped; False after ``timeout`` (a thread in an
    uninterruptible wait, an fsync, stops only once it returns)."""
    return retries.until_true(timeout, 0.01)(lambda: all(_stopped(p) for p in pids))
