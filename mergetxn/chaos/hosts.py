"""Simulated hosts on one Linux machine: what ``mergetxn chaos`` runs its workloads on.

Every guarantee of mergetxn is about hosts that fail and networks that split, so the harness
needs several hosts with a real network between them. A cluster here is ``hosts`` hosts (3 by
default), each running one member of a ZooKeeper ensemble (``mergetxn zk start --id``) and one
replica (``mergetxn replica start``), all started through the real command line; the parts are
in storage every host sees (a local directory unless ``storage_url`` says otherwise). Host ``i``
(0-based in this API) is named ``h<i+1>``, its ZooKeeper member has myid ``i+1`` and its replica
host id ``r<i+1>``.

Two forms implement one interface:

* :class:`NamespaceCluster` (root, Linux): a network namespace per host (``mtx-h1``...), each
  with its own address ``10.231.0.(11+i)`` on a bridge ``mtxbr0`` (``10.231.0.1``, where the
  harness's own clients come from) through a veth pair; network faults are nftables rules in a
  table ``mtx`` inside each namespace and ``tc netem`` on the veths (where the kernel has
  sch_netem: delays need it, losses do not). Each replica's WAL directory
  is a small tmpfs of its own, so a full disk can be injected.
* :class:`LoopbackCluster`: everything on 127.0.0.1 with distinct ports, for machines where
  namespaces cannot be made. Faults by signals and :class:`~mergetxn.chaos.proxy.TcpProxy`:
  each replica reaches every ZooKeeper member through a proxy of its own, and clients reach
  each replica through one. Faults between hosts (isolation, partitions, one-way loss) cannot be
  expressed there; :meth:`supports` says what can.

:func:`make_cluster` picks the namespace form when it can and logs why not otherwise.

The interface (``i``, ``src``, ``dst``: host indices from 0):

* ``start()``, ``stop()`` (everything started is stopped, everything created removed; safe
  after a partial start), context manager; ``hosts``, ``zk_address`` (every member, as the
  harness reaches them), ``replica_addresses``, ``storage_url``, ``timings`` (seconds of the
  last start, replica start and ZooKeeper start).
* Processes: ``kill_replica(i)`` (SIGKILL), ``start_replica(i)`` (same port, data directory
  and host id; returns once it serves), ``pause_replica(i)`` / ``resume_replica(i)``
  (SIGSTOP/SIGCONT), ``replica_running(i)``; ``kill_zk(i)``, ``start_zk(i)`` (returns once the
  member serves), ``zk_running(i)``, ``zk_leader()``.
* Network faults, all undone by ``heal()``: ``isolate(i)`` (host i cut from every other host
  and from the harness), ``partition(groups)`` (hosts in different groups cannot talk; the
  harness reaches all), ``cut_from_zk(i)`` (replica i reaches no ZooKeeper member; clients still
  reach it), ``cut_one_way(src, dst)`` (packets from src to dst dropped), ``slow(i, delay_ms,
  loss_pct)`` (each way; needs ``tc netem`` in the namespace form, which some kernels lack),
  ``lossy(i, loss_pct)`` (packets lost each way), ``expire_session(i)`` (blocks: replica i cut
  from ZooKeeper until the ensemble expired its session, then restored, and by default until
  the replica holds a new one).
* Storage: ``fill_wal_disk(i)`` / ``free_wal_disk(i)`` (a balloon file on replica i's tmpfs).
* ``supports()``: the fault kinds (:data:`FAULT_KINDS`) this form can inject; the others raise
  :class:`FaultNotSupported`.

Nothing outlives the harness: ``stop()`` runs from the context manager, at interpreter exit and
on SIGTERM/SIGHUP; a harness killed with SIGKILL leaves things behind that :func:`cleanup`
(called by every ``start()``) finds by the prefix ``mtx``: namespaces, links, tmpfs mounts
named ``mtx-wal-<harness pid>-h<n>``, and processes carrying ``MERGETXN_CHAOS_OWNER=mtx:<harness
pid>`` in their environment whose harness is gone.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from coordinator.core import retries
from coordinator.core.errors import InvalidInput
from coordinator.wire.security import (
    ADMIN_FILE,
    ENV_CREDENTIALS,
    REPLICA_FILE,
    Credentials,
    make_cluster_credentials,
    zk_client_args,
    zk_tls_context,
)
from coordinator.zk.log import CsnLog
from mergetxn.chaos.proxy import TcpProxy
from mergetxn.local.cluster import wait_stopped
from mergetxn.local.zkserver import ChildProcess, MemberAddress, free_ports, server_mode
from replicas.settings import SETTINGS, command_line

log = logging.getLogger(__name__)

PREFIX = "mtx"
SUBNET = "10.231.0"
BRIDGE = f"{PREFIX}br0"
BRIDGE_ADDRESS = f"{SUBNET}.1"
ZK_CLIENT_PORT, ZK_QUORUM_PORT, ZK_ELECTION_PORT = 2181, 2888, 3888
REPLICA_PORT = 7070
WAL_TMPFS_MB = 64
ENV_OWNER = "MERGETXN_CHAOS_OWNER"
BALLOON = ".mtx-balloon"

ZK_JVM_FLAGS = ("-XX:+UnlockDiagnosticVMOptions", "-XX:-BytecodeVerificationRemote")
"""Extra JVM flags of the ensemble's members (``JDK_JAVA_OPTIONS``): see ``_spawn_zk``."""

FAULT_KINDS: tuple[str, ...] = (
    "kill_replica",
    "pause_replica",
    "kill_zk",
    "isolate",
    "partition",
    "cut_from_zk",
    "cut_one_way",
    "slow",
    "lossy",
    "expire_session",
    "fill_wal_disk",
)
"""Every fault kind a cluster may support (:meth:`supports`)."""

# Replica settings the cluster decides itself (where it listens, whom it talks to).
_FIXED_SETTINGS = frozenset({"zk", "storage_url", "host_id", "data_dir", "port", "host"})

T = TypeVar("T")


class HostsError(RuntimeError):
    """Setting up or tearing down the simulated hosts failed (a command, a process)."""


class FaultNotSupported(HostsError):
    """This form of cluster cannot inject that fault (see ``supports()``)."""


class _NotYet(Exception):
    """Raised inside waits: the awaited state has not come yet."""


def _wait(check: Callable[[], T], timeout: float, what: str, interval: float = 0.1) -> T:
    """``check()``'s result once it stops raising _NotYet; other errors propagate at once."""
    try:
        for attempt in retries.harness_wait(timeout, _NotYet, interval):
            with attempt:
                return check()
    except _NotYet as exc:
        raise TimeoutError(f"{what}: not after {timeout:.0f} s ({exc})") from None
    raise AssertionError("unreachable")


def _run(argv: list[str], input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a system command (ip, nft, tc, mount); a failure names the command and its error."""
    try:
        done = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HostsError(f"{' '.join(argv)}: {exc}") from None
    if check and done.returncode != 0:
        raise HostsError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return done


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --------------------------------------------------------------------------------------------
# Processes


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        out.setdefault(ppid, []).append(int(entry))
    return out


def _tree(pid: int) -> list[int]:
    """``pid`` and every descendant (the zk CLI's JVM and its watchdog run in sessions of
    their own, so a process group alone would miss them)."""
    children = _children()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s process group and every descendant, as a crash of the host would:
    stopped first so that nothing forks while the tree is collected."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGSTOP)
    for p in _tree(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class _Proc(ChildProcess):
    """One CLI process of the cluster (a ZooKeeper member or a replica): its own session, its
    output appended to ``log_path``."""

    def __init__(self, name: str, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_offset = 0
        self.paused = False

    def start(self, argv: list[str], env: Mapping[str, str], cwd: Path) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.log_offset = out.tell()
            out.write(f"--- {time.strftime('%H:%M:%S')} starting {self.name}: {' '.join(argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,  # a group of its own: kill and pause reach all of it
                close_fds=True,
            )
        self.paused = False

    def new_output(self) -> str:
        """What it wrote since it was last started."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def exited(self) -> HostsError:
        assert self.proc is not None
        return HostsError(
            f"{self.name} exited with {self.proc.returncode}; its log ({self.log_path}):\n{_tail(self.log_path)}"
        )

    def signal(self, sig: int) -> None:
        if self.running and self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL everything it started, at once; no shutdown code runs."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            _kill_tree(self.proc.pid)
        self.proc.wait()
        self.paused = False

    def stop(self, timeout: float) -> None:
        """SIGTERM (a clean stop, a paused process resumed first), then SIGKILL."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0f s after SIGTERM; killing it", self.name, timeout)
        self.kill()


def _owner_processes(prefix: str) -> list[tuple[int, int]]:
    """(pid, harness pid) of every process whose environment names a harness of ``prefix``."""
    marker = f"{ENV_OWNER}={prefix}:".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        for item in environ.split(b"\0"):
            if item.startswith(marker):
                with contextlib.suppress(ValueError):
                    out.append((int(entry), int(item[len(marker) :])))
                break
    return out


# --------------------------------------------------------------------------------------------
# Leftovers and clean-up


# The names this module gives things, and only those: other tools on the machine may use the
# same prefix for names of their own (say mtx-sp1), which a clean-up must leave alone.
def _namespace_name(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"{re.escape(prefix)}-h\d+")


def _link_name(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"{re.escape(prefix)}(br0|v\d+[bh])")


def _mount_source(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"{re.escape(prefix)}-wal-(\d+)-h\d+")


def _namespaces(prefix: str) -> list[str]:
    """This module's namespaces (``<prefix>-h<n>``)."""
    if shutil.which("ip") is None:
        return []
    done = _run(["ip", "netns", "list"], check=False)
    names = [line.split()[0] for line in done.stdout.splitlines() if line.strip()]
    return [n for n in names if _namespace_name(prefix).fullmatch(n)]


def _links(prefix: str) -> list[str]:
    """This module's links in the root namespace (``<prefix>br0``, ``<prefix>v<n>b``)."""
    if shutil.which("ip") is None:
        return []
    done = _run(["ip", "-o", "link", "show"], check=False)
    out = []
    for line in done.stdout.splitlines():
        fields = line.split(":", 2)
        if len(fields) >= 2:
            name = fields[1].strip().split("@")[0]
            if _link_name(prefix).fullmatch(name):
                out.append(name)
    return out


def _mounts(prefix: str, workdir: Path | None = None) -> list[tuple[str, str]]:
    """(source, mount point) of tmpfs mounts made by a harness of ``prefix`` (by their source
    name), or lying under ``workdir``."""
    out = []
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) < 3 or fields[2] != "tmpfs":
            continue
        source, point = fields[0], fields[1].replace("\\040", " ")
        ours = _mount_source(prefix).fullmatch(source) is not None
        under = workdir is not None and (point + "/").startswith(str(workdir) + "/")
        if ours or under:
            out.append((source, point))
    return out


def _mount_owner(source: str, prefix: str) -> int | None:
    """The harness pid in a mount source ``<prefix>-wal-<pid>-h<n>``."""
    m = _mount_source(prefix).fullmatch(source)
    return int(m.group(1)) if m else None


def leftovers(prefix: str = PREFIX, workdir: Path | str | None = None, owner: int | None = None) -> list[str]:
    """Everything a harness of ``prefix`` made that still exists (live harnesses' included):
    namespaces, links, tmpfs mounts, processes; with ``owner``, only the mounts and processes
    of the harness with that pid (namespaces and links have no owner but the lock's holder).
    Empty after a clean stop or :func:`cleanup`."""
    wd = Path(workdir).resolve() if workdir is not None else None
    out = [f"namespace {n}" for n in _namespaces(prefix)]
    out += [f"link {n}" for n in _links(prefix)]
    out += [
        f"tmpfs {src} on {point}"
        for src, point in _mounts(prefix, wd)
        if owner is None or _mount_owner(src, prefix) in (owner, None)
    ]
    out += [
        f"process {pid} (harness {harness})"
        for pid, harness in _owner_processes(prefix)
        if owner is None or harness == owner
    ]
    return out


# The namespace form's names are global to the machine: one harness at a time holds this lock
# (flock: released by the kernel when its holder dies, however it dies).
_LOCKS: dict[str, int] = {}
_LOCKS_GUARD = threading.Lock()


def _lock_path(prefix: str) -> Path:
    return Path(tempfile.gettempdir()) / f"{prefix}-chaos-namespaces.lock"


def _acquire_lock(prefix: str) -> bool:
    """Take the namespace lock for this process; False when a live harness holds it."""
    with _LOCKS_GUARD:
        if prefix in _LOCKS:
            return True
        fd = os.open(_lock_path(prefix), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        _LOCKS[prefix] = fd
        return True


def _release_lock(prefix: str) -> None:
    with _LOCKS_GUARD:
        fd = _LOCKS.pop(prefix, None)
    if fd is not None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _lock_holder(prefix: str) -> str:
    try:
        return _lock_path(prefix).read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def cleanup(prefix: str = PREFIX, workdir: Path | str | None = None) -> list[str]:
    """Remove what an earlier harness of ``prefix`` left behind (one killed with SIGKILL, say):
    processes in its namespaces and processes whose harness is gone, the namespaces, links
    whose name starts with ``prefix``, tmpfs mounts of dead harnesses (and any under
    ``workdir``). A live harness's namespaces, processes and mounts are left alone (this
    process's too). Returns what it removed."""
    wd = Path(workdir).resolve() if workdir is not None else None
    if prefix in _LOCKS:
        log.warning("namespaces %s-* belong to a cluster of this process: left alone", prefix)
        return _cleanup(prefix, wd, namespaces=False)
    if os.geteuid() == 0 and _acquire_lock(prefix):
        try:
            return _cleanup(prefix, wd, namespaces=True)
        finally:
            _release_lock(prefix)
    if _namespaces(prefix):
        log.warning(
            "namespaces %s-* belong to a running harness (pid %s): left alone",
            prefix,
            _lock_holder(prefix),
        )
    return _cleanup(prefix, wd, namespaces=False)


def _cleanup(prefix: str, workdir: Path | None, namespaces: bool) -> list[str]:
    """:func:`cleanup`'s work; ``namespaces`` only with the namespace lock held."""
    removed: list[str] = []
    if namespaces:
        for ns in _namespaces(prefix):
            for text in _run(["ip", "netns", "pids", ns], check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(text), signal.SIGKILL)
                    removed.append(f"process {text} in {ns}")
    for pid, owner in _owner_processes(prefix):
        if owner != os.getpid() and not _pid_alive(owner):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                removed.append(f"process {pid} (harness {owner})")
    if namespaces:
        for ns in _namespaces(prefix):
            _wait_namespace_empty(ns)
            _run(["ip", "netns", "delete", ns], check=False)
            removed.append(f"namespace {ns}")
        for link in _links(prefix):
            if _run(["ip", "link", "delete", link], check=False).returncode == 0:
                removed.append(f"link {link}")
    for source, point in _mounts(prefix, workdir):
        holder = _mount_owner(source, prefix)
        under = workdir is not None and (point + "/").startswith(str(workdir) + "/")
        if under or holder is None or (holder != os.getpid() and not _pid_alive(holder)):
            if _run(["umount", "-l", point], check=False).returncode == 0:
                removed.append(f"tmpfs {point}")
    if removed:
        log.warning("cleaned up leftovers of an earlier harness: %s", ", ".join(removed))
    return removed


def _wait_namespace_empty(ns: str, timeout: float = 10.0) -> None:
    """Killed processes take a moment to leave; a namespace deleted before keeps its veth."""

    def check() -> None:
        if _run(["ip", "netns", "pids", ns], check=False).stdout.split():
            raise _NotYet(f"processes still in {ns}")

    with contextlib.suppress(TimeoutError):
        _wait(check, timeout, f"namespace {ns} empty", interval=0.05)


# --------------------------------------------------------------------------------------------
# The safety net: live clusters are stopped at exit and on SIGTERM/SIGHUP.

_LIVE: set[_Cluster] = set()  # strong: a cluster dropped unstopped is still stopped at exit
_HANDLERS_INSTALLED = False


def _stop_live() -> None:
    for cluster in list(_LIVE):
        with contextlib.suppress(Exception):
            cluster.stop()


def _on_signal(signum: int, frame: Any) -> None:
    log.warning("signal %d: stopping the simulated hosts", signum)
    _stop_live()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_safety_net() -> None:
    """Stop live clusters at exit and on SIGTERM/SIGHUP (Ctrl-C raises KeyboardInterrupt, which
    unwinds through ``with`` and then exit). Handlers someone else installed are kept."""
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(_stop_live)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _on_signal)


# --------------------------------------------------------------------------------------------
# The common part of both forms


def _package_root() -> Path:
    return Path(__file__).resolve().parent.parent.parent


class _Cluster:
    """What both forms share: the processes, their waits, the WAL disks and the interface.

    Subclasses say where hosts listen (:meth:`_member_addresses`, :meth:`_replica_listen`),
    how a host's process is started (:meth:`exec_prefix`), how replica i reaches ZooKeeper
    (:meth:`replica_zk_address`), and implement the network faults."""

    form = "?"

    def __init__(
        self,
        workdir: Path | str,
        hosts: int = 3,
        session_timeout: float = 4.0,
        replica_settings: dict[str, Any] | None = None,
        storage_url: str | None = None,
        zk_tick_ms: int = 200,
        wal_tmpfs: bool = True,
        secure: bool = False,
    ) -> None:
        """``wal_tmpfs``: each replica's WAL on a small tmpfs of its own (when root), so a full
        disk can be injected; False keeps it on the work directory's disk (benchmarks: an fsync
        on tmpfs costs nothing, so a comparison with replicas on disk would flatter the hosts).

        ``secure``: a secured cluster (docs/surface.md#security): new credentials in
        ``workdir/security`` naming every host's address, the ensemble TLS-only with its mutual-TLS
        quorum and the replicas' identity, replicas that serve logged-in users only.
        :attr:`credentials_path` is the first admin's file (what clients take)."""
        if not 1 <= hosts <= 200:
            raise InvalidInput(f"hosts must be between 1 and 200, not {hosts!r}")
        self.workdir = Path(workdir).resolve()
        self.hosts = hosts
        self.session_timeout = SETTINGS["session_timeout"].check(session_timeout)
        self.replica_settings = self._check_settings(replica_settings or {})
        self.storage_url = storage_url or str(self.workdir / "storage")
        self.zk_tick_ms = zk_tick_ms
        self.wal_tmpfs = wal_tmpfs
        self.secure = bool(secure)
        self._replica_credentials: Credentials | None = None  # the replicas' identity once made (secure only)
        self.owner = f"{PREFIX}:{os.getpid()}"
        self.timings: dict[str, float] = {}
        self._zk = [_Proc(f"ZooKeeper member {i + 1} (h{i + 1})", self.host_dir(i) / "zk.out") for i in range(hosts)]
        self._replicas = [_Proc(f"replica r{i + 1} (h{i + 1})", self.host_dir(i) / "replica.log") for i in range(hosts)]
        self._mounted: list[Path] = []
        self._balloons: dict[int, Path] = {}
        # started once the network exists and before any process, stopped after them (S3 storage)
        self.services: list[Any] = []
        self._started = False
        self._lock = threading.RLock()

    @staticmethod
    def _check_settings(values: Mapping[str, Any]) -> dict[str, Any]:
        out = {}
        for name, value in values.items():
            if name in _FIXED_SETTINGS:
                raise InvalidInput(f"replica setting {name} is the cluster's to choose")
            if name not in SETTINGS:
                raise InvalidInput(f"unknown replica setting {name!r}; known: {', '.join(SETTINGS)}")
            out[name] = SETTINGS[name].check(value)
        return out

    # -- layout ---------------------------------------------------------------------------------
    def host_name(self, i: int) -> str:
        return f"h{self._index(i) + 1}"

    def host_dir(self, i: int) -> Path:
        return self.workdir / f"h{i + 1}"

    def wal_dir(self, i: int) -> Path:
        """Replica i's data directory (its WAL and state snapshot)."""
        return self.host_dir(i) / "wal"

    def _index(self, i: int) -> int:
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self.hosts:
            raise InvalidInput(f"no host {i!r}: hosts are 0..{self.hosts - 1}")
        return i

    def _member_addresses(self) -> list[MemberAddress]:
        raise NotImplementedError

    def _replica_listen(self, i: int) -> tuple[str, int]:
        raise NotImplementedError

    def exec_prefix(self, i: int) -> list[str]:
        """The command prefix that runs a process on host i (nothing on the loopback form)."""
        raise NotImplementedError

    def replica_zk_address(self, i: int) -> str:
        """The ZooKeeper hosts string replica i is given (in the loopback form: its proxies)."""
        raise NotImplementedError

    @property
    def zk_address(self) -> str:
        """Every member's client address as the harness reaches them (a kazoo hosts string)."""
        return ",".join(m.client_address for m in self._member_addresses())

    @property
    def replica_addresses(self) -> list[str]:
        """Where the harness's clients reach each replica."""
        return [f"{h}:{p}" for h, p in (self._replica_listen(i) for i in range(self.hosts))]

    @property
    def security_dir(self) -> Path:
        return self.workdir / "security"

    @property
    def credentials_path(self) -> Path | None:
        """The first admin user's credentials file of a secured cluster (None when unsecured)."""
        return self.security_dir / ADMIN_FILE if self.secure else None

    def _make_credentials(self) -> None:
        """The cluster's CA, the certificate every member and replica serves (naming each address
        the harness, the replicas and the members use) and the two identities."""
        hosts = [m.host for m in self._member_addresses()]
        hosts += [h for h, _ in (self._replica_listen(i) for i in range(self.hosts))]
        self._replica_credentials = make_cluster_credentials(self.security_dir, [*hosts, "127.0.0.1", "localhost"])

    def _tls(self) -> Any:
        """The TLS context the harness checks the members' four-letter words with (None: plain):
        it presents the replica certificate, as a secured member serves only its holders."""
        return None if self._replica_credentials is None else zk_tls_context(self._replica_credentials)

    # -- lifecycle --------------------------------------------------------------------------------
    def __enter__(self: T) -> T:
        self.start()  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 120.0) -> None:
        """Create the hosts, start the ensemble, then a replica per host; returns once every
        member and replica serves. On failure everything made so far is removed again."""
        with self._lock:
            if self._started:
                return
            _install_safety_net()
            began = time.monotonic()
            self._started = True
            _LIVE.add(self)
            try:
                self.workdir.mkdir(parents=True, exist_ok=True)
                if "://" not in self.storage_url:
                    Path(self.storage_url).mkdir(parents=True, exist_ok=True)
                self._setup()
                if self.secure:
                    self._make_credentials()
                for service in self.services:
                    service.start(self)
                for i in range(self.hosts):
                    self.host_dir(i).mkdir(parents=True, exist_ok=True)
                    self.wal_dir(i).mkdir(parents=True, exist_ok=True)
                    self._mount_wal(i)
                for i in range(self.hosts):
                    self._spawn_zk(i)
                deadline = began + timeout
                for i in range(self.hosts):
                    self._wait_zk(i, max(5.0, deadline - time.monotonic()))
                for i in range(self.hosts):
                    self._spawn_replica(i)
                for i in range(self.hosts):
                    self._wait_replica(i, max(5.0, deadline - time.monotonic()))
            except BaseException:
                self.stop()
                raise
            self.timings["start"] = time.monotonic() - began
            log.info(
                "%s cluster of %d hosts up in %.1f s: ZooKeeper %s, replicas %s",
                self.form,
                self.hosts,
                self.timings["start"],
                self.zk_address,
                ", ".join(self.replica_addresses),
            )

    def stop(self) -> None:
        """Stop every process, undo every fault, remove what was created. Idempotent; works
        after a partial start. Errors are logged and the rest still removed."""
        with self._lock:
            if not self._started:
                return
            steps: list[tuple[str, Callable[[], None]]] = [
                ("heal", self.heal),
                *((f"stop replica {i}", lambda i=i: self._replicas[i].stop(15.0)) for i in range(self.hosts)),
                *((f"stop ZooKeeper {i}", lambda i=i: self._zk[i].stop(20.0)) for i in range(self.hosts)),
                *((f"stop {s!r}", s.stop) for s in reversed(self.services)),
                ("balloons", self._remove_balloons),
                ("unmount", self._unmount_all),
                ("teardown", self._teardown),
            ]
            for what, step in steps:
                try:
                    step()
                except Exception:
                    log.exception("stopping the simulated hosts: %s failed", what)
            self._started = False
            _LIVE.discard(self)

    def _setup(self) -> None:
        """Make the network (namespaces or proxies)."""

    def _teardown(self) -> None:
        """Remove the network."""

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        root = str(_package_root())
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env[ENV_OWNER] = self.owner
        env["PYTHONUNBUFFERED"] = "1"
        env.pop(ENV_CREDENTIALS, None)  # the members' and replicas' credentials are what ``secure`` says
        return env

    def _credentials_args(self) -> list[str]:
        return ["--credentials", str(self.security_dir / REPLICA_FILE)] if self.secure else []

    def _cli(self, i: int, *args: str) -> list[str]:
        return [*self.exec_prefix(i), sys.executable, "-m", "mergetxn.cli", *args]

    # -- ZooKeeper --------------------------------------------------------------------------------
    def _spawn_zk(self, i: int) -> None:
        members = ",".join(str(m) for m in self._member_addresses())
        argv = self._cli(
            i,
            "zk",
            "start",
            "--id",
            str(i + 1),
            "--members",
            members,
            "--dir",
            str(self.host_dir(i) / "zk"),
            "--tick-ms",
            str(self.zk_tick_ms),
            *self._credentials_args(),
        )
        env = self._env()
        # A member that is killed and restarted all run long must rejoin fast on busy cores: skip
        # verifying the bytecode of ZooKeeper's jars (from the pyspark wheel) as the JVM loads
        # them, a quarter of a restart's CPU (the CLI's own flags already make it C1 only).
        env["JDK_JAVA_OPTIONS"] = " ".join(filter(None, [env.get("JDK_JAVA_OPTIONS"), *ZK_JVM_FLAGS]))
        self._zk[i].start(argv, env, self.host_dir(i))

    def _wait_zk(self, i: int, timeout: float) -> None:
        member = self._member_addresses()[i]
        proc = self._zk[i]

        def check() -> None:
            if not proc.running:
                raise proc.exited()
            if server_mode(member.host, member.client_port, timeout=1.0, context=self._tls()) is None:
                raise _NotYet(f"member {i + 1} at {member.client_address} not serving")

        _wait(check, timeout, f"ZooKeeper member {i + 1} ({self.host_name(i)})", interval=0.1)

    def kill_zk(self, i: int) -> None:
        """SIGKILL host i's ZooKeeper member (the CLI and its JVM at once), as a crash."""
        self._zk[self._index(i)].kill()
        log.info("killed ZooKeeper member %d", i + 1)

    def start_zk(self, i: int, timeout: float = 60.0) -> None:
        """(Re)start host i's member on its data; returns once it serves (has a quorum)."""
        i = self._index(i)
        self._restart("start_zk", self._zk[i].running, partial(self._spawn_zk, i), partial(self._wait_zk, i, timeout))
        log.info("ZooKeeper member %d serves again after %.1f s", i + 1, self.timings["start_zk"])

    def _restart(self, what: str, running: bool, spawn: Callable[[], None], wait: Callable[[], None]) -> None:
        """Spawn a process unless ``running``, then ``wait`` until it serves; the time it took
        is ``timings[what]``."""
        began = time.monotonic()
        if not running:
            spawn()
        wait()
        self.timings[what] = time.monotonic() - began

    def zk_running(self, i: int) -> bool:
        return self._zk[self._index(i)].running

    def zk_mode(self, i: int) -> str | None:
        """'leader' / 'follower' while host i's member serves (as the harness sees it)."""
        m = self._member_addresses()[self._index(i)]
        return server_mode(m.host, m.client_port, timeout=1.0, context=self._tls()) if self._zk[i].running else None

    def zk_leader(self) -> int | None:
        """The host whose member leads, if the harness reaches one that says so."""
        for i in range(self.hosts):
            if self.zk_mode(i) == "leader":
                return i
        return None

    # -- replicas ---------------------------------------------------------------------------------
    def _spawn_replica(self, i: int) -> None:
        host, port = self._replica_bind(i)
        values: dict[str, Any] = {
            "zk": self.replica_zk_address(i),
            "storage_url": self.storage_url,
            "host_id": f"r{i + 1}",
            "data_dir": self.wal_dir(i),
            "host": host,
            "port": port,
            "session_timeout": self.session_timeout,
            # a restart may come while the host is still cut from the ensemble: wait as a replica
            # did before the 10 s default, rather than count a slow heal as a failed start
            "zk_connect_timeout": 30.0,
            **self.replica_settings,
        }
        # Unsecured: --insecure, on addresses of the harness's own network namespaces (protected
        # mode refuses a non-loopback --host otherwise).
        security = self._credentials_args() or ["--insecure"]
        self._replicas[i].start(
            self._cli(i, "replica", "start", *command_line(values), *security), self._env(), self.host_dir(i)
        )

    def _replica_bind(self, i: int) -> tuple[str, int]:
        """Where replica i's process listens (the loopback form puts a proxy in front)."""
        return self._replica_listen(i)

    def _wait_replica(self, i: int, timeout: float) -> None:
        proc = self._replicas[i]
        host, port = self._replica_bind(i)

        def check() -> None:
            if not proc.running:
                raise proc.exited()
            if f"READY {host}:{port}" not in proc.new_output():
                raise _NotYet(f"replica r{i + 1} has not said READY")

        _wait(check, timeout, f"replica r{i + 1} ({self.host_name(i)})", interval=0.05)

    def start_replica(self, i: int, timeout: float = 90.0) -> str:
        """(Re)start replica i on its port, data directory and host id; returns its address
        once it serves (it printed ``READY``)."""
        i = self._index(i)
        running = self._replicas[i].running
        self._restart(
            "start_replica", running, partial(self._spawn_replica, i), partial(self._wait_replica, i, timeout)
        )
        log.info("replica r%d serves after %.1f s", i + 1, self.timings["start_replica"])
        return self.replica_addresses[i]

    def kill_replica(self, i: int) -> None:
        """SIGKILL replica i's process group: no shutdown code runs."""
        self._replicas[self._index(i)].kill()
        log.info("killed replica r%d", i + 1)

    def stop_replica(self, i: int, timeout: float = 15.0) -> None:
        """Stop replica i cleanly (SIGTERM), SIGKILL after ``timeout``."""
        self._replicas[self._index(i)].stop(timeout)

    def pause_replica(self, i: int) -> None:
        """SIGSTOP replica i (a long GC pause, a frozen VM)."""
        proc = self._replicas[self._index(i)]
        if not proc.running:
            raise HostsError(f"replica r{i + 1} is not running")
        proc.signal(signal.SIGSTOP)
        proc.paused = True
        if proc.pid is not None and not wait_stopped(_tree(proc.pid)):
            log.warning("replica r%d: SIGSTOP sent, some thread still runs after 10 s", i + 1)
        log.info("paused replica r%d", i + 1)

    def resume_replica(self, i: int) -> None:
        """SIGCONT replica i after :meth:`pause_replica`."""
        proc = self._replicas[self._index(i)]
        proc.signal(signal.SIGCONT)
        proc.paused = False
        log.info("resumed replica r%d", i + 1)

    def replica_running(self, i: int) -> bool:
        """Its process lives (a paused one too: see :meth:`replica_paused`)."""
        return self._replicas[self._index(i)].running

    def replica_paused(self, i: int) -> bool:
        proc = self._replicas[self._index(i)]
        return proc.running and proc.paused

    def replica_pid(self, i: int) -> int | None:
        return self._replicas[self._index(i)].pid

    # -- network faults ---------------------------------------------------------------------------
    def supports(self) -> set[str]:
        """The fault kinds (:data:`FAULT_KINDS`) this cluster can inject."""
        raise NotImplementedError

    def _require(self, kind: str) -> None:
        if kind not in self.supports():
            raise FaultNotSupported(f"{kind} is not supported by the {self.form} form of the simulated hosts")

    def heal(self) -> None:
        """Undo every network fault (a full WAL disk is undone by :meth:`free_wal_disk`)."""
        raise NotImplementedError

    def isolate(self, i: int) -> None:
        raise FaultNotSupported(f"isolate is not supported by the {self.form} form")

    def partition(self, groups: list[list[int]]) -> None:
        raise FaultNotSupported(f"partition is not supported by the {self.form} form")

    def cut_one_way(self, src: int, dst: int) -> None:
        raise FaultNotSupported(f"cut_one_way is not supported by the {self.form} form")

    def cut_from_zk(self, i: int) -> None:
        raise NotImplementedError

    def restore_zk(self, i: int) -> None:
        """Undo :meth:`cut_from_zk` of replica i only (``heal`` undoes everything)."""
        raise NotImplementedError

    def slow(self, i: int, delay_ms: float, loss_pct: float = 0.0) -> None:
        raise NotImplementedError

    def lossy(self, i: int, loss_pct: float) -> None:
        raise NotImplementedError

    def alive_path(self, i: int) -> str:
        """Replica i's ephemeral alive node: it lives exactly as long as the replica's session."""
        root = self.replica_settings.get("root", SETTINGS["root"].default)
        return CsnLog(None, root).alive_path(f"r{self._index(i) + 1}")

    def expire_session(self, i: int, recovered: bool = True, timeout: float | None = None) -> float:
        """Expire replica i's ZooKeeper session: cut it from ZooKeeper until the ensemble has
        expired the session (its alive node is gone), then restore; with ``recovered``, wait
        until the replica has learnt it and holds a new session (its alive node is back), so its
        running transactions are being aborted. Blocks meanwhile; returns the seconds the cut
        lasted."""
        i = self._index(i)
        self._require("expire_session")
        timeout = timeout if timeout is not None else 3 * self.session_timeout + 30
        path = self.alive_path(i)
        with self._observer() as zk:
            if zk.exists(path) is None:
                raise HostsError(f"replica r{i + 1} has no session to expire ({path} is missing)")
            began = time.monotonic()
            self.cut_from_zk(i)
            try:

                def gone() -> None:
                    if zk.retry(zk.exists, path) is not None:
                        raise _NotYet(f"{path} still exists")

                _wait(gone, timeout, f"replica r{i + 1}'s session to expire", interval=0.1)
            finally:
                self.restore_zk(i)
            cut = time.monotonic() - began
            log.info("replica r%d's ZooKeeper session expired after %.1f s cut off", i + 1, cut)
            if recovered:

                def back() -> None:
                    if zk.retry(zk.exists, path) is None:
                        raise _NotYet(f"{path} not back")

                _wait(back, timeout, f"replica r{i + 1} to get a new session", interval=0.1)
        return cut

    @contextlib.contextmanager
    def _observer(self) -> Iterator[KazooClient]:
        """A kazoo client of the harness on the whole ensemble."""
        zk = KazooClient(hosts=self.zk_address, timeout=10.0, **zk_client_args(self._replica_credentials))
        # A member being killed or cut and a busy machine (a TLS handshake per member tried) can
        # take a first connection past 30 s: the harness's own client tries again, not the run.
        for attempt in retries.harness_connect(KazooTimeoutError):
            with attempt:
                zk.start(timeout=30)
        try:
            yield zk
        finally:
            zk.stop()
            zk.close()

    @staticmethod
    def _check_slow(delay_ms: float, loss_pct: float) -> None:
        if not 0 <= delay_ms <= 60_000:
            raise InvalidInput(f"delay_ms must be between 0 and 60000, not {delay_ms!r}")
        if not 0 <= loss_pct <= 100:
            raise InvalidInput(f"loss_pct must be between 0 and 100, not {loss_pct!r}")

    # -- storage faults ---------------------------------------------------------------------------
    def _can_mount(self) -> bool:
        return os.geteuid() == 0 and shutil.which("mount") is not None

    def _mount_wal(self, i: int) -> None:
        """Replica i's WAL directory on a tmpfs of its own, so it can be filled."""
        if not (self.wal_tmpfs and self._can_mount()):
            return
        point = self.wal_dir(i)
        source = f"{PREFIX}-wal-{os.getpid()}-h{i + 1}"
        _run(["mount", "-t", "tmpfs", "-o", f"size={WAL_TMPFS_MB}m,mode=0755", source, str(point)])
        self._mounted.append(point)

    def _unmount_all(self) -> None:
        while self._mounted:
            point = self._mounted.pop()
            if _run(["umount", str(point)], check=False).returncode != 0:
                _run(["umount", "-l", str(point)])

    def fill_wal_disk(self, i: int) -> int:
        """Fill replica i's WAL disk with a balloon file; returns its size in bytes."""
        i = self._index(i)
        self._require("fill_wal_disk")
        balloon = self.wal_dir(i) / BALLOON
        fd = os.open(balloon, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            st = os.statvfs(self.wal_dir(i))
            with contextlib.suppress(OSError):
                os.posix_fallocate(fd, os.fstat(fd).st_size, st.f_bavail * st.f_frsize)
            block = b"\0" * 4096
            with contextlib.suppress(OSError):  # the bytes fallocate left, until ENOSPC
                while os.write(fd, block):
                    pass
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        self._balloons[i] = balloon
        log.info("filled replica r%d's WAL disk (%d bytes)", i + 1, size)
        return size

    def free_wal_disk(self, i: int) -> None:
        """Remove the balloon of :meth:`fill_wal_disk`."""
        i = self._index(i)
        balloon = self._balloons.pop(i, self.wal_dir(i) / BALLOON)
        balloon.unlink(missing_ok=True)
        log.info("freed replica r%d's WAL disk", i + 1)

    def _remove_balloons(self) -> None:
        for i in list(self._balloons):
            self.free_wal_disk(i)

    def __repr__(self) -> str:
        state = "started" if self._started else "stopped"
        return f"{type(self).__name__}({self.workdir}, hosts={self.hosts}, {state})"


# --------------------------------------------------------------------------------------------
# Network namespaces


class NamespaceCluster(_Cluster):
    """A host per network namespace, on a bridge in the root namespace (root, Linux).

    Addresses: the bridge ``10.231.0.1/24`` (where the harness's clients come from), host i
    ``10.231.0.(11+i)``; each host's member listens on 2181 (quorum 2888, election 3888) and its
    replica on 7070. Faults are nftables rules in a table ``inet mtx`` of each namespace
    (rebuilt atomically from :attr:`_rules` on every change) and netem on both ends of a veth.
    """

    form = "namespace"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # host -> [(tag, chain, rule)]: the rules now in force there
        self._rules: dict[int, list[tuple[str, str, str]]] = {i: [] for i in range(self.hosts)}
        self._slowed: set[int] = set()
        self._made = False
        self._netem = False  # whether this kernel has sch_netem (found out at start)

    # -- layout ---------------------------------------------------------------------------------
    def namespace(self, i: int) -> str:
        return f"{PREFIX}-h{self._index(i) + 1}"

    def host_address(self, i: int) -> str:
        return f"{SUBNET}.{11 + self._index(i)}"

    def _veth(self, i: int) -> tuple[str, str]:
        """(bridge end in the root namespace, host end in the host's namespace)."""
        return f"{PREFIX}v{i + 1}b", f"{PREFIX}v{i + 1}h"

    def _member_addresses(self) -> list[MemberAddress]:
        return [
            MemberAddress(self.host_address(i), ZK_CLIENT_PORT, ZK_QUORUM_PORT, ZK_ELECTION_PORT)
            for i in range(self.hosts)
        ]

    def _replica_listen(self, i: int) -> tuple[str, int]:
        return self.host_address(i), REPLICA_PORT

    def exec_prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(i)]

    def replica_zk_address(self, i: int) -> str:
        return self.zk_address

    # -- making the network ---------------------------------------------------------------------
    def _setup(self) -> None:
        if not _acquire_lock(PREFIX):
            raise HostsError(
                f"another harness (pid {_lock_holder(PREFIX)}) runs simulated hosts in namespaces "
                f"{PREFIX}-*; one at a time on a machine"
            )
        self._made = True  # from here on, _teardown removes what exists and frees the lock
        _cleanup(PREFIX, None, namespaces=True)
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        _run(["ip", "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE])
        _run(["ip", "link", "set", BRIDGE, "up"])
        for i in range(self.hosts):
            ns, (outer, inner) = self.namespace(i), self._veth(i)
            _run(["ip", "netns", "add", ns])
            _run(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner])
            _run(["ip", "link", "set", inner, "netns", ns])
            _run(["ip", "link", "set", outer, "master", BRIDGE])
            _run(["ip", "link", "set", outer, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.host_address(i)}/24", "dev", inner])
            _run(["ip", "-n", ns, "link", "set", inner, "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            self._apply_rules(i)
        self._netem = self._probe_netem()
        log.info(
            "made namespaces %s on bridge %s",
            ", ".join(self.namespace(i) for i in range(self.hosts)),
            BRIDGE,
        )

    def _teardown(self) -> None:
        if not self._made:
            return
        try:
            for i in range(self.hosts):
                ns = self.namespace(i)
                for pid in _run(["ip", "netns", "pids", ns], check=False).stdout.split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)
                _wait_namespace_empty(ns)
                _run(["ip", "netns", "delete", ns], check=False)
            for link in _links(PREFIX):
                _run(["ip", "link", "delete", link], check=False)
        finally:
            self._made = False
            _release_lock(PREFIX)

    # -- nftables -------------------------------------------------------------------------------
    def _apply_rules(self, i: int) -> None:
        """Replace host i's table ``inet mtx`` with the rules in force, in one transaction."""
        chains: dict[str, list[str]] = {"input": [], "output": []}
        for _, chain, rule in self._rules[i]:
            chains[chain].append(rule)
        body = "\n".join(
            f"  chain {chain} {{\n    type filter hook {chain} priority 0; policy accept;\n"
            + "".join(f"    {r}\n" for r in rules)
            + "  }"
            for chain, rules in chains.items()
        )
        script = f"table inet {PREFIX} {{}}\ndelete table inet {PREFIX}\ntable inet {PREFIX} {{\n{body}\n}}\n"
        _run(["ip", "netns", "exec", self.namespace(i), "nft", "-f", "-"], input=script)

    def _add_rules(self, i: int, tag: str, rules: Iterable[tuple[str, str]]) -> None:
        self._rules[i].extend((tag, chain, rule) for chain, rule in rules)
        self._apply_rules(i)

    def _remove_rules(self, tag: str) -> None:
        for i in range(self.hosts):
            before = len(self._rules[i])
            self._rules[i] = [r for r in self._rules[i] if r[0] != tag]
            if len(self._rules[i]) != before:
                self._apply_rules(i)

    def supports(self) -> set[str]:
        kinds = set(FAULT_KINDS)  # root, so the WAL disks are tmpfs mounts
        if not self.wal_tmpfs:
            kinds.discard("fill_wal_disk")
        if not self._netem:
            kinds.discard("slow")  # a kernel without sch_netem cannot delay packets
        return kinds

    def heal(self) -> None:
        """Flush every namespace's rules and remove every netem."""
        if not self._made:
            return
        for i in range(self.hosts):
            if self._rules[i]:
                self._rules[i] = []
                self._apply_rules(i)
        for i in sorted(self._slowed):
            outer, inner = self._veth(i)
            _run(["tc", "qdisc", "del", "dev", outer, "root"], check=False)
            _run(["tc", "-n", self.namespace(i), "qdisc", "del", "dev", inner, "root"], check=False)
        self._slowed.clear()
        log.info("healed the network")

    def isolate(self, i: int) -> None:
        """Host i reaches nothing outside itself, and nothing reaches it (the harness neither)."""
        i = self._index(i)
        self._add_rules(
            i,
            f"isolate-{i}",
            [("input", 'iifname != "lo" drop'), ("output", 'oifname != "lo" drop')],
        )
        log.info("isolated host %s", self.host_name(i))

    def partition(self, groups: list[list[int]]) -> None:
        """Hosts in different groups cannot talk; every host must be in exactly one group. The
        harness still reaches all."""
        seen: list[int] = [self._index(h) for g in groups for h in g]
        if sorted(seen) != list(range(self.hosts)):
            raise InvalidInput(f"partition {groups!r}: every host 0..{self.hosts - 1} must be in exactly one group")
        tag = f"partition-{groups!r}"
        for group in groups:
            others = [self.host_address(h) for h in range(self.hosts) if h not in group]
            if not others:
                continue
            addresses = "{ " + ", ".join(others) + " }"
            for h in group:
                self._add_rules(
                    h,
                    tag,
                    [
                        ("input", f"ip saddr {addresses} drop"),
                        ("output", f"ip daddr {addresses} drop"),
                    ],
                )
        log.info("partitioned hosts into %s", groups)

    def cut_from_zk(self, i: int) -> None:
        """Replica i reaches no ZooKeeper member (its own host's included); its clients still
        reach it and the members keep their quorum."""
        i = self._index(i)
        self._add_rules(
            i,
            f"zk-{i}",
            [
                ("output", f"tcp dport {ZK_CLIENT_PORT} drop"),
                ("input", f"tcp sport {ZK_CLIENT_PORT} drop"),
            ],
        )
        log.info("cut replica r%d from ZooKeeper", i + 1)

    def restore_zk(self, i: int) -> None:
        self._remove_rules(f"zk-{self._index(i)}")

    def cut_one_way(self, src: int, dst: int) -> None:
        """Packets from host src to host dst are dropped; dst to src still flow (so TCP
        between them stalls both ways, datagrams only one way)."""
        src, dst = self._index(src), self._index(dst)
        if src == dst:
            raise InvalidInput("cut_one_way needs two different hosts")
        self._add_rules(src, f"oneway-{src}-{dst}", [("output", f"ip daddr {self.host_address(dst)} drop")])
        log.info("cut %s -> %s", self.host_name(src), self.host_name(dst))

    def _probe_netem(self) -> bool:
        """Whether ``tc ... netem`` works here (kernels built without sch_netem refuse it)."""
        outer, _ = self._veth(0)
        done = _run(["tc", "qdisc", "add", "dev", outer, "root", "netem", "delay", "0ms"], check=False)
        if done.returncode != 0:
            log.warning(
                "no packet delay on these hosts: tc netem failed (%s); slow() is not supported, "
                "lossy() drops packets with nftables instead",
                done.stderr.strip(),
            )
            return False
        _run(["tc", "qdisc", "del", "dev", outer, "root"], check=False)
        return True

    def lossy(self, i: int, loss_pct: float) -> None:
        """Every packet to or from host i (the harness's included) is lost with ``loss_pct``
        percent each way (nftables ``numgen random``): TCP retransmits, so round trips grow by
        retransmission timeouts, as over a bad link."""
        i = self._index(i)
        self._check_slow(0, loss_pct)
        threshold = round(loss_pct * 100)  # in 1/10000
        self._add_rules(
            i,
            f"lossy-{i}",
            [
                ("input", f'iifname != "lo" numgen random mod 10000 < {threshold} drop'),
                ("output", f'oifname != "lo" numgen random mod 10000 < {threshold} drop'),
            ],
        )
        log.info("lossy host %s: %s%% of packets lost each way", self.host_name(i), loss_pct)

    def slow(self, i: int, delay_ms: float, loss_pct: float = 0.0) -> None:
        """netem on both ends of host i's veth: every packet to or from host i is delayed by
        ``delay_ms`` each way (a round trip by twice that) and lost with ``loss_pct`` percent.
        Without sch_netem in the kernel only ``delay_ms=0`` works (as :meth:`lossy`)."""
        i = self._index(i)
        self._check_slow(delay_ms, loss_pct)
        if not self._netem:
            if delay_ms == 0:
                self.lossy(i, loss_pct)
                return
            raise FaultNotSupported(
                "slow needs tc netem, which this kernel lacks (CONFIG_NET_SCH_NETEM); lossy() drops packets instead"
            )
        outer, inner = self._veth(i)
        netem = ["netem", "delay", f"{delay_ms}ms", "loss", f"{loss_pct}%", "limit", "100000"]
        _run(["tc", "qdisc", "replace", "dev", outer, "root", *netem])
        _run(["tc", "-n", self.namespace(i), "qdisc", "replace", "dev", inner, "root", *netem])
        self._slowed.add(i)
        log.info("slowed host %s: %s ms each way, %s%% loss", self.host_name(i), delay_ms, loss_pct)

    def connects(self, src: int | None, address: str, timeout: float = 1.0) -> bool:
        """Whether a TCP connection from host ``src`` (None: the harness) to ``address`` opens
        within ``timeout``: a probe for tests and for checking that a fault took effect."""
        host, _, port = address.rpartition(":")
        if src is None:
            try:
                with socket.create_connection((host, int(port)), timeout=timeout):
                    return True
            except OSError:
                return False
        code = (
            "import socket,sys\n"
            f"try:\n socket.create_connection(({host!r},{int(port)}),timeout={timeout}).close()\n"
            "except OSError:\n sys.exit(1)\n"
        )
        done = _run([*self.exec_prefix(src), sys.executable, "-I", "-S", "-c", code], check=False)
        return done.returncode == 0


# --------------------------------------------------------------------------------------------
# Loopback


class LoopbackCluster(_Cluster):
    """Every process on 127.0.0.1 with ports of its own, for machines without namespaces.

    Each replica reaches every ZooKeeper member through a proxy of its own and clients reach
    it through one more, so faults on one replica's links leave the others alone. There are no
    links between hosts to cut (the members talk to each other directly): isolate, partition and
    cut_one_way are not supported; a full WAL disk only when we may mount a tmpfs (root)."""

    form = "loopback"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        ports = free_ports(4 * self.hosts)
        n = self.hosts
        self._members = [MemberAddress("127.0.0.1", ports[i], ports[n + i], ports[2 * n + i]) for i in range(n)]
        self._replica_ports = ports[3 * n :]
        self._zk_proxies: list[list[TcpProxy]] = []
        self._client_proxies: list[TcpProxy] = []

    def _member_addresses(self) -> list[MemberAddress]:
        return self._members

    def _replica_bind(self, i: int) -> tuple[str, int]:
        return "127.0.0.1", self._replica_ports[i]

    def _replica_listen(self, i: int) -> tuple[str, int]:
        if self._client_proxies:
            return "127.0.0.1", self._client_proxies[i].port
        return self._replica_bind(i)

    def exec_prefix(self, i: int) -> list[str]:
        return []

    def replica_zk_address(self, i: int) -> str:
        return ",".join(p.address for p in self._zk_proxies[i])

    def _setup(self) -> None:
        cleanup(PREFIX)
        for i in range(self.hosts):
            self._zk_proxies.append(
                [
                    TcpProxy(m.client_address, name=f"{PREFIX}-r{i + 1}-zk{j + 1}").start()
                    for j, m in enumerate(self._members)
                ]
            )
            host, port = self._replica_bind(i)
            self._client_proxies.append(TcpProxy(f"{host}:{port}", name=f"{PREFIX}-r{i + 1}").start())

    def _teardown(self) -> None:
        for proxy in [*self._client_proxies, *(p for ps in self._zk_proxies for p in ps)]:
            proxy.stop()

    def _proxies(self, i: int) -> list[TcpProxy]:
        return [*self._zk_proxies[i], self._client_proxies[i]]

    def supports(self) -> set[str]:
        kinds = {
            "kill_replica",
            "pause_replica",
            "kill_zk",
            "cut_from_zk",
            "slow",
            "lossy",
            "expire_session",
        }
        if self._mounted or (not self._started and self._can_mount()):
            kinds.add("fill_wal_disk")
        return kinds

    def heal(self) -> None:
        for proxy in [*self._client_proxies, *(p for ps in self._zk_proxies for p in ps)]:
            proxy.heal()
        log.info("healed the proxies")

    def cut_from_zk(self, i: int) -> None:
        """Replica i's proxies to every member stop relaying (held, not refused: the replica
        learns it only by its own timeouts, as across a real partition)."""
        for proxy in self._zk_proxies[self._index(i)]:
            proxy.block(hang=True)
        log.info("cut replica r%d from ZooKeeper", i + 1)

    def restore_zk(self, i: int) -> None:
        for proxy in self._zk_proxies[self._index(i)]:
            proxy.unblock()

    def slow(self, i: int, delay_ms: float, loss_pct: float = 0.0) -> None:
        """Every chunk on replica i's links (to ZooKeeper, from clients) is late by ``delay_ms``
        each way; ``loss_pct`` percent of them by a retransmission timeout more."""
        i = self._index(i)
        self._check_slow(delay_ms, loss_pct)
        for proxy in self._proxies(i):
            proxy.delay = delay_ms / 1000
            proxy.loss = loss_pct / 100
        log.info("slowed replica r%d's links: %s ms each way, %s%% loss", i + 1, delay_ms, loss_pct)

    def lossy(self, i: int, loss_pct: float) -> None:
        """:meth:`slow` without delay: ``loss_pct`` percent of chunks late by a retransmission."""
        self.slow(i, 0, loss_pct)


# --------------------------------------------------------------------------------------------
# Choosing


def namespaces_unavailable() -> str | None:
    """Why the namespace form cannot run here, or None when it can."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return f"network namespaces need root (running as uid {os.geteuid()})"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables"), ("tc", "iproute2")):
        if shutil.which(tool) is None:
            return f"{tool} is missing (install {package}; ./dev setup installs nftables)"
    probe = f"{PREFIX}-probe{os.getpid()}"
    done = _run(["ip", "netns", "add", probe], check=False)
    if done.returncode != 0:
        return f"ip netns add failed: {done.stderr.strip()}"
    _run(["ip", "netns", "delete", probe], check=False)
    if not _acquire_lock(PREFIX):
        return f"another harness (pid {_lock_holder(PREFIX)}) runs simulated hosts in namespaces"
    _release_lock(PREFIX)
    return None


def make_cluster(workdir: Path | str, **kwargs: Any) -> NamespaceCluster | LoopbackCluster:
    """A :class:`NamespaceCluster` when namespaces can be made here, else a
    :class:`LoopbackCluster` (saying why in the log, and in its ``fallback_reason``)."""
    reason = namespaces_unavailable()
    if reason is None:
        return NamespaceCluster(workdir, **kwargs)
    log.warning("simulated hosts on loopback, not in network namespaces: %s", reason)
    cluster = LoopbackCluster(workdir, **kwargs)
    cluster.fallback_reason = reason  # type: ignore[attr-defined]
    return cluster
