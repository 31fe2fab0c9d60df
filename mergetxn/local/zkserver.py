"""A real ZooKeeper server for development, tests and the embedded default.

mergetxn needs a real ZooKeeper (no mock can stand in for its ordering, sessions and ``multi``
semantics), but a user who runs ``./dev quickstart`` should not have to install one. The pyspark
wheel, which we depend on anyway, ships ``zookeeper-3.9.x.jar`` with everything it needs
(jute, netty, slf4j, log4j2), so with Java 17 we can run the genuine server from those jars.

This module starts and stops such servers:

* :class:`ZooKeeperServer`: one standalone server (``ZooKeeperServerMain``).
* :class:`ZooKeeperMember`: one member (``QuorumPeerMain``) of a static ensemble whose members
  may live on different hosts (``mergetxn zk start --id N --members ...``).
* :class:`ZooKeeperEnsemble`: a quorum of such members on 127.0.0.1, for tests that kill a
  member while clients keep working.
* :func:`start_zookeeper`: what the product uses; an address given by the user (argument or
  ``MERGETXN_ZK``), else a testcontainers ZooKeeper when Docker answers, else the embedded server.

Every Java process runs in its own process group, is stopped at interpreter exit, and is watched
by a tiny watchdog process that kills it when the Python parent dies without cleaning up
(SIGKILL, OOM), so no stray ZooKeeper outlives the test run or the CLI that started it.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import random
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Self

from coordinator.core import retries

if TYPE_CHECKING:
    from coordinator.wire.security import Credentials

__all__ = [
    "STATUS_WORDS",
    "ZooKeeperTls",
    "harden_root",
    "MemberAddress",
    "ZooKeeperEnsemble",
    "ZooKeeperMember",
    "ZooKeeperHandle",
    "ZooKeeperNotReady",
    "ZooKeeperServer",
    "ExternalZooKeeper",
    "ContainerZooKeeper",
    "find_pyspark_jars",
    "four_letter_word",
    "java_executable",
    "parse_members",
    "server_mode",
    "start_zookeeper",
]

MIN_JAVA = 17
LOCALHOST = "127.0.0.1"

#: JVM flags for the embedded servers: a small heap (ZooKeeper holds only metadata here) and a
#: simple GC; IPv4 so that 127.0.0.1 is what the server binds. The C1 compiler only (as the
#: ensemble members, mergetxn/cli/servers.py MEMBER_JVM_FLAGS): at a hundred commits a second C2 kept compiling for
#: over a minute and was most of ZooKeeper's CPU per commit (1.0-3.0 ms per commit multi against
#: 1.0-1.1 with C1 alone; measured with benchmarks/zk_request_cost.py).
JVM_FLAGS: tuple[str, ...] = (
    "-Xms32m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Djava.net.preferIPv4Stack=true",
    "-Djava.awt.headless=true",
    # log4j 1.x JMX bridge is not on the classpath; without this ZooKeeper warns at start.
    "-Dzookeeper.jmx.log4j.disable=true",
)


class ZooKeeperNotReady(Exception):
    """The server does not serve requests (yet)."""


# --------------------------------------------------------------------------------------------
# Locating Java and the jars


def find_pyspark_jars() -> Path:
    """Directory of the jars inside the installed pyspark wheel (holds zookeeper-3.9.x.jar).

    Found with ``importlib.util.find_spec`` so that pyspark itself is not imported (slow)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.origin:
        raise RuntimeError(
            "pyspark is not installed in this interpreter; the embedded ZooKeeper runs from the "
            "jars it ships. Run ./dev setup (or pip install 'pyspark>=4.1,<4.2')."
        )
    jars = Path(spec.origin).resolve().parent / "jars"
    if not any(jars.glob("zookeeper-[0-9]*.jar")):
        raise RuntimeError(f"no zookeeper-*.jar in {jars}; is this a full pyspark install?")
    return jars


def _parse_java_major(version_output: str) -> int | None:
    """Major version from ``java -version`` output ("1.8.0_392" -> 8, "17.0.15" -> 17)."""
    m = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if not m:
        return None
    major = int(m.group(1))
    if major == 1 and m.group(2):
        return int(m.group(2))
    return major


def _release_file_major(java: str) -> int | None:
    """Major version from the JDK's ``release`` file next to ``bin/java`` (no JVM start)."""
    release = Path(java).resolve().parent.parent / "release"
    try:
        text = release.read_text(errors="replace")
    except OSError:
        return None
    m = re.search(r'^JAVA_VERSION="(\d+)(?:\.(\d+))?', text, re.MULTILINE)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2)) if major == 1 and m.group(2) else major


@cache
def _java_major(java: str) -> int | None:
    """Java major version; reads the ``release`` file when there is one, since starting a JVM
    just to ask ``java -version`` costs a second on a loaded machine."""
    major = _release_file_major(java)
    if major is not None:
        return major
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return _parse_java_major(out.stderr + out.stdout)


def java_executable() -> str:
    """Path of a Java >= 17 executable: ``$JAVA_HOME/bin/java`` if set, else ``java`` on PATH.

    Raises RuntimeError with a hint when Java is missing or too old (ZooKeeper 3.9 and Spark 4
    both need 17)."""
    candidates: list[str] = []
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidates.append(str(Path(java_home) / "bin" / "java"))
    on_path = shutil.which("java")
    if on_path:
        candidates.append(on_path)
    if not candidates:
        raise RuntimeError(
            f"Java {MIN_JAVA}+ is needed for the embedded ZooKeeper and for Spark, but no java "
            "was found (JAVA_HOME unset, none on PATH). Run ./dev setup, or install "
            "openjdk-17-jre-headless, or give a ZooKeeper address (MERGETXN_ZK)."
        )
    seen: list[str] = []
    for java in candidates:
        if not os.access(java, os.X_OK):
            seen.append(f"{java} (not executable)")
            continue
        major = _java_major(java)
        if major is not None and major >= MIN_JAVA:
            return java
        seen.append(f"{java} (version {major if major is not None else 'unknown'})")
    raise RuntimeError(
        f"Java {MIN_JAVA}+ is needed for the embedded ZooKeeper and for Spark; found only: "
        + ", ".join(seen)
        + ". Set JAVA_HOME to a Java 17 install or run ./dev setup."
    )


# --------------------------------------------------------------------------------------------
# Small helpers


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports it picks itself (a ``bind`` to port 0, a ``connect``'s source
    port): Linux's default when the file cannot be read."""
    try:
        low, high = (int(x) for x in EPHEMERAL_RANGE_FILE.read_text().split()[:2])
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_ports(n: int, host: str = LOCALHOST) -> list[int]:
    """n distinct free TCP ports (all held open together so they differ), outside the kernel's
    ephemeral range where it can: a port is picked now and bound later by a server we start, and
    in between any socket the kernel numbers itself (a replica's listener on port 0, a client's
    outgoing connection) could take one from that range (a ZooKeeper member refused "port in use"
    in chaos campaigns)."""
    low, high = ephemeral_range()
    candidates = [*range(20000, min(low, 32768)), *range(max(high + 1, 61000), 65536)]
    random.shuffle(candidates)
    socks: list[socket.socket] = []
    try:
        for port in candidates:
            if len(socks) == n:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        while len(socks) < n:  # that range is taken: the kernel picks from its own
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def four_letter_word(
    host: str, port: int, word: str = "srvr", timeout: float = 2.0, context: ssl.SSLContext | None = None
) -> str:
    """Send a ZooKeeper four-letter command (``ruok``, ``srvr``, ``stat``, ``mntr``...) and
    return the reply. Unsecured embedded servers whitelist all of them; a secured one serves
    only :data:`STATUS_WORDS`, over TLS (``context``: one that verifies its certificate)."""
    with socket.create_connection((host, port), timeout=timeout) as raw:
        s = raw if context is None else context.wrap_socket(raw, server_hostname=host)
        with s:
            s.sendall(word.encode("ascii"))
            chunks: list[bytes] = []
            while sum(map(len, chunks)) < 1 << 20:  # bounded: srvr is a few hundred bytes
                try:
                    data = s.recv(65536)
                except ssl.SSLEOFError:  # closed without a TLS close_notify: the reply is whole
                    break
                if not data:
                    break
                chunks.append(data)
    return b"".join(chunks).decode("utf-8", "replace")


def server_mode(host: str, port: int, timeout: float = 2.0, context: ssl.SSLContext | None = None) -> str | None:
    """'standalone', 'leader' or 'follower' when the server serves requests, else None.

    ``ruok`` answers "imok" even for a quorum member without a quorum; ``srvr`` reports a
    Mode only when the server really serves, so that is what readiness checks use."""
    try:
        reply = four_letter_word(host, port, "srvr", timeout, context)
    except OSError:
        return None
    m = re.search(r"^Mode: (\w+)", reply, re.MULTILINE)
    return m.group(1) if m else None


def _ensure_port_free(port: int, what: str, host: str = LOCALHOST) -> None:
    """Refuse to start on a port something already listens on: a leftover server there would
    answer our readiness probe and hide that our own JVM failed to bind."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        if s.connect_ex((host, port)) == 0:
            raise RuntimeError(f"cannot start {what}: port {port} on {host} is in use")


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


# Java processes we started and have not stopped, for the atexit cleanup (a plain set: a server
# whose handle was dropped must still be stopped at exit).
_LIVE: set[JavaProcess] = set()
_LIVE_LOCK = threading.Lock()


@atexit.register
def _stop_all_at_exit() -> None:
    with _LIVE_LOCK:
        procs = list(_LIVE)
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.stop(timeout=5)


# The watchdog: blocks reading a pipe whose only writer is the Python parent. A byte means "the
# parent stopped the server itself, exit quietly"; EOF means the parent died, so it kills the
# Java process group (SIGTERM, then SIGKILL).
_WATCHDOG_CODE = r"""# mergetxn zookeeper watchdog
import os, signal, sys, time
pgid = int(sys.argv[1])
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
try:
    data = os.read(0, 1)
except OSError:
    data = b""
if data:
    sys.exit(0)
def alive():
    try:
        os.killpg(pgid, 0)
        return True
    except OSError:
        return False
try:
    os.killpg(pgid, signal.SIGTERM)
except OSError:
    sys.exit(0)
deadline = time.monotonic() + 5
while alive() and time.monotonic() < deadline:
    time.sleep(0.05)
if alive():
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""


class ChildProcess:
    """A process this interpreter started (``proc``: its Popen, None before): whether it runs,
    and its pid while it does. The chaos harness's processes share it."""

    proc: subprocess.Popen[bytes] | None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.running and self.proc is not None else None


class JavaProcess(ChildProcess):
    """One ZooKeeper JVM in its own process group, with a watchdog tied to this interpreter."""

    def __init__(self, argv: list[str], log_path: Path, cwd: Path) -> None:
        self.argv = argv
        self.log_path = log_path
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._watch_fd: int | None = None

    def start(self) -> None:
        if self.running:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                start_new_session=True,  # own process group: Ctrl-C in a shell does not reach it
                close_fds=True,
            )
        self._start_watchdog(self.proc.pid)
        with _LIVE_LOCK:
            _LIVE.add(self)

    def _start_watchdog(self, pgid: int) -> None:
        r, w = os.pipe()  # non-inheritable by default; only the watchdog gets r (as stdin)
        try:
            self._watchdog = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _WATCHDOG_CODE, str(pgid)],
                stdin=r,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            os.close(r)
        self._watch_fd = w

    def _release_watchdog(self) -> None:
        """Tell the watchdog to exit without touching the JVM (we stop it ourselves)."""
        if self._watch_fd is not None:
            with contextlib.suppress(OSError):
                os.write(self._watch_fd, b"x")
            with contextlib.suppress(OSError):
                os.close(self._watch_fd)
            self._watch_fd = None
        if self._watchdog is not None:
            try:
                self._watchdog.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
                self._watchdog.wait()
            self._watchdog = None

    def _signal_group(self, sig: int) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (ZooKeeper shuts down cleanly), wait, then SIGKILL."""
        if self.proc is None:
            return
        self._release_watchdog()
        self._signal_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            self.proc.wait()
        self._forget()

    def kill(self) -> None:
        """SIGKILL, as a crash would: no shutdown hooks, no clean close of sessions."""
        if self.proc is None:
            return
        self._release_watchdog()
        self._signal_group(signal.SIGKILL)
        self.proc.wait()
        self._forget()

    def _forget(self) -> None:
        self.proc = None
        with _LIVE_LOCK:
            _LIVE.discard(self)


def _log4j2_config(log_file: Path) -> str:
    """log4j2 properties sending everything to one file, rolled over at 64 MB with 3 kept (a
    secured server logs every refused TLS handshake with its stack trace: whoever reaches the
    port must not fill the disk); nothing on the console."""
    return "\n".join(
        [
            "status = error",
            "name = mergetxn-zookeeper",
            "appender.file.type = RollingFile",
            "appender.file.name = FILE",
            f"appender.file.fileName = {log_file}",
            f"appender.file.filePattern = {log_file}.%i",
            "appender.file.policies.type = Policies",
            "appender.file.policies.size.type = SizeBasedTriggeringPolicy",
            "appender.file.policies.size.size = 64MB",
            "appender.file.strategy.type = DefaultRolloverStrategy",
            "appender.file.strategy.max = 3",
            "appender.file.append = true",
            "appender.file.layout.type = PatternLayout",
            "appender.file.layout.pattern = %d{ISO8601} [%t] %-5level %c{1} - %m%n",
            "rootLogger.level = info",
            "rootLogger.appenderRef.file.ref = FILE",
            "",
        ]
    )


def _write_cfg(path: Path, settings: Mapping[str, Any]) -> None:
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))


def _java_argv(main_class: str, cfg: Path, log4j2: Path, log_dir: Path, extra_flags: Iterable[str] = ()) -> list[str]:
    jars = find_pyspark_jars()
    return [
        java_executable(),
        *JVM_FLAGS,
        *extra_flags,
        f"-Dlog4j2.configurationFile={log4j2}",
        f"-Dzookeeper.log.dir={log_dir}",
        "-cp",
        f"{jars}/*",
        main_class,
        str(cfg),
    ]


def _wait_until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``check()`` until it returns without raising ZooKeeperNotReady; other errors
    (a crashed process) propagate at once."""
    try:
        for attempt in retries.until_ready(timeout, on=ZooKeeperNotReady, every=interval):
            with attempt:
                return check()
    except ZooKeeperNotReady as last:
        raise TimeoutError(f"{what} not ready after {timeout:.0f}s: {last}") from None
    raise AssertionError("unreachable")


def _session_settings(tick_ms: int) -> dict[str, Any]:
    return {
        "tickTime": tick_ms,
        # Short tick and minimum session timeout so expiry tests run in seconds; a generous
        # maximum so production-like clients asking for 10-30 s get what they ask for (the
        # default maximum is 20 ticks, i.e. only 4 s with a 200 ms tick).
        "minSessionTimeout": 2 * tick_ms,
        "maxSessionTimeout": 60000,
        "maxClientCnxns": 0,
        "4lw.commands.whitelist": "*",
        "admin.enableServer": "false",
        "autopurge.snapRetainCount": 3,
        "autopurge.purgeInterval": 1,
    }


# --------------------------------------------------------------------------------------------
# Secure mode: what a secured cluster's ZooKeeper serves with

#: The four-letter words a secured server answers: ``srvr`` is all ``mergetxn status`` and the
#: readiness checks send. ``dump``, ``cons``, ``wchc``, ``envi``... (paths, sessions, client
#: addresses, the environment) are refused.
STATUS_WORDS = "srvr"

NETTY = "org.apache.zookeeper.server.NettyServerCnxnFactory"
X509_PROVIDER = "org.apache.zookeeper.server.auth.X509AuthenticationProvider"


@dataclass(frozen=True)
class ZooKeeperTls:
    """PEM stores a secured ZooKeeper serves with (made by :meth:`from_credentials` from the
    cluster's credentials, coordinator/wire/security.py): the client port's key store (the replica
    certificate, which clients check against the cluster CA and the host name) and trust store,
    and for an ensemble member the quorum's (mutual TLS, a CA derived from the secret)."""

    keystore: Path
    truststore: Path
    quorum_keystore: Path | None = None
    quorum_truststore: Path | None = None

    @classmethod
    def from_credentials(cls, creds: Credentials, directory: Path, quorum_host: str | None = None) -> ZooKeeperTls:
        """Write the stores in ``directory`` (keys mode 0600); ``quorum_host``: this member's
        host, for an ensemble member's quorum certificate."""
        from coordinator.wire.security import zk_quorum_stores, zk_server_stores

        keystore, truststore = zk_server_stores(creds, directory)
        if quorum_host is None:
            return cls(keystore, truststore)
        return cls(keystore, truststore, *zk_quorum_stores(creds, directory, quorum_host))

    def client_context(self) -> ssl.SSLContext:
        """TLS that verifies the server's certificate and host name and presents the replica
        certificate (without one the server completes no handshake): readiness checks."""
        ctx = ssl.create_default_context(cafile=str(self.truststore))
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(str(self.keystore))  # the key store holds the replica key and certificate
        return ctx

    def settings(self, host: str, port: int) -> dict[str, Any]:
        """zoo.cfg for the client side: TLS only (no clientPort); a handshake completes only for
        a client presenting a certificate of the cluster CA (``ssl.clientAuth=need``), which the
        ``x509`` scheme then names by its subject; a session so unauthenticated is closed at its
        first request (``enforce.auth``); only :data:`STATUS_WORDS`."""
        out: dict[str, Any] = {
            "secureClientPort": port,
            "secureClientPortAddress": host,
            "serverCnxnFactory": NETTY,
            "ssl.keyStore.location": self.keystore,
            "ssl.keyStore.type": "PEM",
            "ssl.trustStore.location": self.truststore,
            "ssl.trustStore.type": "PEM",
            "ssl.clientAuth": "need",  # no certificate of the cluster CA, no session
            # A client is who its certificate says, from wherever it connects (an operator's
            # mergetxn status on another host): its address is not checked against the names.
            "ssl.clientHostnameVerification": "false",
            "authProvider.x509": X509_PROVIDER,
            "enforce.auth.enabled": "true",
            "enforce.auth.schemes": "x509",
            "4lw.commands.whitelist": STATUS_WORDS,
        }
        if self.quorum_keystore is not None:
            out.update(
                {
                    "sslQuorum": "true",  # members talk mutual TLS: only holders of the secret join
                    "ssl.quorum.keyStore.location": self.quorum_keystore,
                    "ssl.quorum.keyStore.type": "PEM",
                    "ssl.quorum.trustStore.location": self.quorum_truststore,
                    "ssl.quorum.trustStore.type": "PEM",
                    "ssl.quorum.clientAuth": "need",
                    "ssl.quorum.hostnameVerification": "true",
                }
            )
        return out


def harden_root(hosts: str, creds: Credentials, timeout: float = 30.0) -> None:
    """Give ``/`` (world-writable in a new ZooKeeper) and ``/zookeeper/quota`` the ACL of the
    cluster's identity only, so that no other session creates, deletes or re-ACLs anything
    there. Idempotent; every member of an ensemble may do it."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoNodeError

    from coordinator.wire.security import zk_client_args

    zk = KazooClient(hosts=hosts, timeout=timeout, **zk_client_args(creds))
    zk.start(timeout=timeout)
    try:
        for path in ("/", "/zookeeper/quota"):
            with contextlib.suppress(NoNodeError):
                zk.set_acls(path, creds.zk_acl())
    finally:
        zk.stop()
        zk.close()


# --------------------------------------------------------------------------------------------
# What every server here is


class StartStop:
    """``with x:`` starts ``x`` and stops it when the block ends, however it ends."""

    def start(self) -> object:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class JvmServer(StartStop):
    """A server run as one JVM (:class:`JavaProcess`, in ``_proc`` once started)."""

    _proc: JavaProcess | None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.running

    @property
    def pid(self) -> int | None:
        """PID of the JVM (also its process group id), None when stopped."""
        return self._proc.pid if self._proc is not None and self._proc.running else None

    def stop(self, timeout: float = 15.0) -> None:
        """Graceful stop: SIGTERM, wait up to ``timeout``, then SIGKILL. Idempotent."""
        if self._proc is not None:
            self._proc.stop(timeout)

    def kill(self) -> None:
        """SIGKILL (a crash, for fault tests): the JVM dies at once, its sessions are not closed."""
        if self._proc is not None:
            self._proc.kill()


# --------------------------------------------------------------------------------------------
# Standalone server


class ZooKeeperServer(JvmServer):
    """One standalone ZooKeeper 3.9 server (``ZooKeeperServerMain``) on 127.0.0.1.

    Data (snapshots, transaction log) lives in ``workdir/data``, so :meth:`restart` and a new
    instance on the same workdir keep every znode. The port is chosen once (free port when
    None) and kept across restarts, so clients reconnect to the same address. Logs go to
    ``workdir/zookeeper.log`` (log4j) and ``workdir/zookeeper.out`` (JVM stdout/stderr).

    ``credentials`` (a secured cluster's replica credentials): TLS only on the port, sessions
    without the identity refused, ``/`` under the identity's ACL (:class:`ZooKeeperTls`,
    :func:`harden_root`); the stores are written in ``workdir/tls``.
    """

    def __init__(
        self,
        workdir: Path | str,
        port: int | None = None,
        tick_ms: int = 200,
        extra_config: Mapping[str, Any] | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.credentials = credentials
        self.tls = None if credentials is None else ZooKeeperTls.from_credentials(credentials, self.workdir / "tls")
        self.port = port if port is not None else free_ports(1)[0]
        self.tick_ms = tick_ms
        self.extra_config = dict(extra_config or {})
        self.data_dir = self.workdir / "data"
        self.log_file = self.workdir / "zookeeper.log"
        self.out_file = self.workdir / "zookeeper.out"
        self._proc = None

    @property
    def address(self) -> str:
        """``127.0.0.1:port``: a kazoo hosts string (append ``/chroot`` to confine a client)."""
        return f"{LOCALHOST}:{self.port}"

    def _configure(self) -> list[str]:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / "zoo.cfg"
        log4j2 = self.workdir / "log4j2.properties"
        port = (
            {"clientPort": self.port, "clientPortAddress": LOCALHOST}
            if self.tls is None
            else self.tls.settings(LOCALHOST, self.port)
        )
        settings = {
            **_session_settings(self.tick_ms),
            "dataDir": self.data_dir,
            **port,
            **self.extra_config,
        }
        _write_cfg(cfg, settings)
        log4j2.write_text(_log4j2_config(self.log_file))
        return _java_argv("org.apache.zookeeper.server.ZooKeeperServerMain", cfg, log4j2, self.workdir)

    def start(self, timeout: float = 60) -> str:
        """Start the JVM and return :attr:`address` once it really serves requests."""
        if not self.running:
            _ensure_port_free(self.port, f"ZooKeeper in {self.workdir}")
            self._proc = JavaProcess(self._configure(), self.out_file, self.workdir)
            self._proc.start()
        self.wait_serving(timeout)
        if self.credentials is not None:
            harden_root(self.address, self.credentials, timeout)
        return self.address

    def wait_serving(self, timeout: float = 60) -> None:
        """Block until ``srvr`` reports a mode; raise if the JVM exits or time runs out."""

        def check() -> str:
            if not self.running:
                raise RuntimeError(
                    f"ZooKeeper on port {self.port} exited; last log lines:\n"
                    f"{log_tail(self.out_file)}\n{log_tail(self.log_file)}"
                )
            mode = server_mode(LOCALHOST, self.port, context=None if self.tls is None else self.tls.client_context())
            if mode is None:
                raise ZooKeeperNotReady(f"{self.address} not serving yet")
            return mode

        try:
            _wait_until(check, timeout, f"ZooKeeper {self.address}")
        except TimeoutError as e:
            raise TimeoutError(f"{e}\nlast log lines:\n{log_tail(self.log_file)}") from None

    def restart(self, timeout: float = 60, hard: bool = False) -> str:
        """Stop (or kill, when ``hard``) and start again on the same port and data."""
        if hard:
            self.kill()
        else:
            self.stop()
        return self.start(timeout)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"ZooKeeperServer({self.address}, {state}, workdir={str(self.workdir)!r})"


# --------------------------------------------------------------------------------------------
# Ensemble members


@dataclass(frozen=True)
class MemberAddress:
    """Where one ensemble member listens: ``host:clientPort:quorumPort:electionPort``."""

    host: str
    client_port: int
    quorum_port: int
    election_port: int

    @property
    def client_address(self) -> str:
        return f"{self.host}:{self.client_port}"

    def __str__(self) -> str:
        return f"{self.host}:{self.client_port}:{self.quorum_port}:{self.election_port}"


def parse_members(text: str) -> list[MemberAddress]:
    """``host:clientPort:quorumPort:electionPort,...`` (in myid order) as addresses.

    Raises ValueError naming the item that does not parse, so a command line can say which."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise ValueError(f"{text!r} is not a list of host:clientPort:quorumPort:electionPort items separated by commas")
    members: list[MemberAddress] = []
    for item in items:
        parts = item.split(":")
        if len(parts) != 4 or not parts[0]:
            raise ValueError(f"member {item!r} is not host:clientPort:quorumPort:electionPort")
        try:
            ports = [int(p) for p in parts[1:]]
        except ValueError:
            raise ValueError(f"member {item!r} has a port that is not a number") from None
        if not all(1 <= p <= 65535 for p in ports):
            raise ValueError(f"member {item!r} has a port outside 1..65535")
        if len(set(ports)) != 3:
            raise ValueError(f"member {item!r} uses one port twice")
        members.append(MemberAddress(parts[0], *ports))
    taken: dict[tuple[str, int], str] = {}
    for m in members:
        for port in (m.client_port, m.quorum_port, m.election_port):
            other = taken.setdefault((m.host, port), str(m))
            if other != str(m):
                raise ValueError(f"members {other!r} and {str(m)!r} both use {m.host}:{port}")
    return members


class ZooKeeperMember(JvmServer):
    """One member (``QuorumPeerMain``) of a static ZooKeeper ensemble.

    ``members`` lists every member in myid order (``myid`` is 1-based); this one listens on its
    own entry's host (client port, quorum port, election port), so members may live on
    different hosts (network namespaces) or share 127.0.0.1 with distinct ports. Data lives in
    ``workdir/data`` (kept across restarts), logs in ``workdir/zookeeper.log`` and
    ``workdir/zookeeper.out``. Used by :class:`ZooKeeperEnsemble` and ``mergetxn zk start --id``.
    """

    def __init__(
        self,
        workdir: Path | str,
        myid: int,
        members: Iterable[MemberAddress],
        tick_ms: int = 200,
        jvm_flags: Iterable[str] = (),
        credentials: Credentials | None = None,
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.credentials = credentials
        self.members = list(members)
        if not 1 <= myid <= len(self.members):
            raise ValueError(f"member id {myid} is not between 1 and the number of members ({len(self.members)})")
        self.myid = myid
        self.tick_ms = tick_ms
        self.jvm_flags = tuple(jvm_flags)
        self.me = self.members[myid - 1]
        self.tls = (
            None
            if credentials is None
            else ZooKeeperTls.from_credentials(credentials, self.workdir / "tls", quorum_host=self.me.host)
        )
        self.log_file = self.workdir / "zookeeper.log"
        self.out_file = self.workdir / "zookeeper.out"
        self._proc = None

    @property
    def address(self) -> str:
        """This member's client address, ``host:port``."""
        return self.me.client_address

    @property
    def ensemble_address(self) -> str:
        """Every member's client address: a kazoo hosts string."""
        return ",".join(m.client_address for m in self.members)

    def mode(self) -> str | None:
        """'leader' / 'follower' while it serves, else None."""
        return server_mode(
            self.me.host, self.me.client_port, context=None if self.tls is None else self.tls.client_context()
        )

    def _configure(self) -> list[str]:
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        (data / "myid").write_text(f"{self.myid}\n")
        settings: dict[str, Any] = {
            **_session_settings(self.tick_ms),
            "initLimit": 20,
            "syncLimit": 10,
            "dataDir": data,
            **(
                {"clientPort": self.me.client_port, "clientPortAddress": self.me.host}
                if self.tls is None
                else self.tls.settings(self.me.host, self.me.client_port)
            ),
            "reconfigEnabled": "false",
            "standaloneEnabled": "false",
        }
        for j, m in enumerate(self.members, start=1):
            settings[f"server.{j}"] = f"{m.host}:{m.quorum_port}:{m.election_port}"
        cfg = self.workdir / "zoo.cfg"
        log4j2 = self.workdir / "log4j2.properties"
        _write_cfg(cfg, settings)
        log4j2.write_text(_log4j2_config(self.log_file))
        # Election connects to dead peers time out after cnxTimeout (5 s by default); keep
        # re-elections after a kill quick.
        return _java_argv(
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            cfg,
            log4j2,
            self.workdir,
            extra_flags=("-Dzookeeper.cnxTimeout=1000", *self.jvm_flags),
        )

    def start(self, timeout: float = 60, wait: bool = True) -> str:
        """Start the JVM; with ``wait``, return once it serves (which needs a quorum)."""
        if not self.running:
            self.workdir.mkdir(parents=True, exist_ok=True)
            me = self.me
            for port in (me.client_port, me.quorum_port, me.election_port):
                _ensure_port_free(port, f"ZooKeeper member {self.myid}", me.host)
            self._proc = JavaProcess(self._configure(), self.out_file, self.workdir)
            self._proc.start()
        if wait:
            self.wait_serving(timeout)
        return self.address

    def check_alive(self) -> None:
        """Raise RuntimeError with the log's tail when the JVM is not running."""
        if not self.running:
            raise RuntimeError(
                f"ZooKeeper member {self.myid} exited; last log lines:\n"
                f"{log_tail(self.out_file)}\n{log_tail(self.log_file)}"
            )

    def wait_serving(self, timeout: float = 60) -> str:
        """Block until it reports a mode (it joined a quorum); raise if the JVM exits."""

        def check() -> str:
            self.check_alive()
            mode = self.mode()
            if mode is None:
                raise ZooKeeperNotReady(f"member {self.myid} ({self.address}) not serving yet")
            return mode

        return _wait_until(check, timeout, f"ZooKeeper member {self.myid} {self.address}")

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"ZooKeeperMember({self.myid}, {self.me}, {state})"


class ZooKeeperEnsemble(StartStop):
    """A ZooKeeper quorum of ``size`` :class:`ZooKeeperMember` processes on 127.0.0.1.

    Each member has its own client, quorum and election ports (chosen once, kept across
    restarts) and its own ``workdir/zk<i>`` data directory. Members are numbered 0..size-1
    (their ZooKeeper ``myid`` is i+1). Used by fault tests: kill one member and check that
    clients connected with :attr:`address` keep reading and writing.
    """

    def __init__(
        self, workdir: Path | str, size: int = 3, tick_ms: int = 200, credentials: Credentials | None = None
    ) -> None:
        """``credentials``: a secured ensemble (TLS for clients and between members, sessions
        without the identity refused, ``/`` hardened once it serves; see :class:`ZooKeeperTls`)."""
        if size < 1:
            raise ValueError("an ensemble needs at least one member")
        self.workdir = Path(workdir).resolve()
        self.size = size
        self.tick_ms = tick_ms
        ports = free_ports(3 * size)
        self.client_ports = ports[0:size]
        self.quorum_ports = ports[size : 2 * size]
        self.election_ports = ports[2 * size : 3 * size]
        addresses = [
            MemberAddress(LOCALHOST, c, q, e)
            for c, q, e in zip(self.client_ports, self.quorum_ports, self.election_ports)
        ]
        self.credentials = credentials
        self.members = [
            ZooKeeperMember(self.member_dir(i), i + 1, addresses, tick_ms, credentials=credentials) for i in range(size)
        ]

    @property
    def address(self) -> str:
        """``127.0.0.1:p1,127.0.0.1:p2,...``: kazoo picks any member and fails over."""
        return ",".join(f"{LOCALHOST}:{p}" for p in self.client_ports)

    def member_address(self, i: int) -> str:
        return f"{LOCALHOST}:{self.client_ports[i]}"

    def member_dir(self, i: int) -> Path:
        return self.workdir / f"zk{i}"

    def running(self, i: int) -> bool:
        return self.members[i].running

    def mode(self, i: int) -> str | None:
        """'leader' / 'follower' when member i serves, else None."""
        return self.members[i].mode()

    def leader(self) -> int | None:
        """Index of the current leader, if any member reports being it."""
        for i in range(self.size):
            if self.running(i) and self.mode(i) == "leader":
                return i
        return None

    def _wait_members(self, members: list[int], timeout: float) -> None:
        def check() -> None:
            waiting = []
            for i in members:
                self.members[i].check_alive()
                if self.mode(i) is None:
                    waiting.append(i)
            if waiting:
                raise ZooKeeperNotReady(f"members {waiting} not serving yet")

        _wait_until(check, timeout, f"ZooKeeper ensemble {self.address}")

    def start(self, timeout: float = 90) -> str:
        """Start every member and return :attr:`address` once all of them serve."""
        for member in self.members:
            member.start(wait=False)
        self._wait_members(list(range(self.size)), timeout)
        if self.credentials is not None:
            harden_root(self.address, self.credentials, timeout)
        return self.address

    def start_member(self, i: int, timeout: float = 60) -> None:
        """(Re)start member i and wait until it has rejoined the quorum and serves."""
        self.members[i].start(wait=False)
        self._wait_members([i], timeout)

    def kill_member(self, i: int) -> None:
        """SIGKILL member i (a crash); the others keep a quorum while a majority lives."""
        self.members[i].kill()

    def stop_member(self, i: int, timeout: float = 15.0) -> None:
        """Graceful stop of member i."""
        self.members[i].stop(timeout)

    def wait_quorum(self, timeout: float = 60) -> None:
        """Wait until a majority of members serve (after a kill or a restart)."""
        need = self.size // 2 + 1

        def check() -> None:
            serving = [i for i in range(self.size) if self.running(i) and self.mode(i)]
            if len(serving) < need:
                raise ZooKeeperNotReady(f"only members {serving} serve, need {need}")

        _wait_until(check, timeout, f"ZooKeeper quorum {self.address}")

    def stop(self) -> None:
        """Stop every member (graceful). Idempotent."""
        for i in range(self.size):
            self.stop_member(i)

    def __repr__(self) -> str:
        up = [i for i in range(self.size) if self.running(i)]
        return f"ZooKeeperEnsemble({self.address}, running={up})"


# --------------------------------------------------------------------------------------------
# What the product uses


class ZooKeeperHandle(Protocol):
    """Whatever :func:`start_zookeeper` returns: an address to connect to and a stop."""

    @property
    def address(self) -> str: ...

    def stop(self) -> None: ...


class ExternalZooKeeper:
    """A ZooKeeper someone else runs: we only know its address; stop does nothing."""

    def __init__(self, address: str) -> None:
        self._address = address

    @property
    def address(self) -> str:
        return self._address

    def stop(self) -> None:
        """Nothing to stop: we did not start it."""

    def __repr__(self) -> str:
        return f"ExternalZooKeeper({self._address})"


class ContainerZooKeeper:
    """ZooKeeper in a Docker container through testcontainers (official ``zookeeper`` image)."""

    IMAGE = "zookeeper:3.9"

    def __init__(self, tick_ms: int = 200, image: str | None = None) -> None:
        from testcontainers.core.container import DockerContainer  # optional dependency

        self.container = (
            DockerContainer(image or self.IMAGE)
            .with_exposed_ports(2181)
            .with_env("ZOO_TICK_TIME", str(tick_ms))
            .with_env("ZOO_4LW_COMMANDS_WHITELIST", "*")
            .with_env("ZOO_ADMINSERVER_ENABLED", "false")
            .with_env("ZOO_MAX_CLIENT_CNXNS", "0")
            .with_env("ZOO_CFG_EXTRA", f"minSessionTimeout={2 * tick_ms} maxSessionTimeout=60000")
        )
        self._address: str | None = None

    def start(self, timeout: float = 120) -> str:
        self.container.start()
        host = self.container.get_container_host_ip()
        port = int(self.container.get_exposed_port(2181))

        def check() -> None:
            if server_mode(host, port) is None:
                raise ZooKeeperNotReady(f"{host}:{port} not serving yet")

        try:
            _wait_until(check, timeout, f"ZooKeeper container {host}:{port}", interval=0.25)
        except BaseException:
            self.stop()
            raise
        self._address = f"{host}:{port}"
        return self._address

    @property
    def address(self) -> str:
        if self._address is None:
            raise RuntimeError("container not started")
        return self._address

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.container.stop()

    def __repr__(self) -> str:
        return f"ContainerZooKeeper({self._address})"


def _docker_available() -> bool:
    """True when testcontainers is importable and a Docker engine answers a ping."""
    if importlib.util.find_spec("testcontainers") is None:
        return False
    try:
        import docker  # testcontainers depends on it

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def start_zookeeper(
    workdir: Path | str, address: str | None = None, credentials: Credentials | None = None
) -> ZooKeeperHandle:
    """A ZooKeeper for mergetxn to use, started if need be. In order of preference:

    1. ``address`` (or the ``MERGETXN_ZK`` environment variable): a ZooKeeper the user runs;
       nothing is started and ``stop()`` is a no-op. ``MERGETXN_ZK=embedded`` or ``=docker``
       instead force one of the two choices below.
    2. a testcontainers ZooKeeper, when the package is installed and a Docker engine answers;
    3. the embedded :class:`ZooKeeperServer` from the pyspark jars, with ``workdir`` as its
       directory (data in ``workdir/data``, logs in ``workdir/zookeeper.log``).

    The result has ``.address`` (a kazoo hosts string) and ``.stop()``. With ``credentials``
    (a secured cluster) what is started is the embedded server, secured (TLS only, identity
    required, ``/`` hardened: :class:`ZooKeeperServer`); a given address is used as it is.
    """
    choice = address or os.environ.get("MERGETXN_ZK") or ""
    choice = choice.strip()
    if choice and choice not in ("embedded", "docker"):
        return ExternalZooKeeper(choice)
    if credentials is not None:
        if choice == "docker":
            raise RuntimeError(
                "a secured cluster runs the embedded ZooKeeper (TLS, enforced authentication); "
                "MERGETXN_ZK=docker starts a plain one: unset it or give an address"
            )
        secured = ZooKeeperServer(workdir, credentials=credentials)
        secured.start()
        return secured
    if choice == "docker" or (not choice and _docker_available()):
        container = ContainerZooKeeper()
        container.start()
        return container
    server = ZooKeeperServer(workdir)
    server.start()
    return server


def _main(argv: list[str] | None = None) -> int:
    """``python -m mergetxn.local.zkserver [workdir] [port]``: run a standalone server until
    Ctrl-C (handy for poking at it with zkCli or kazoo)."""
    args = sys.argv[1:] if argv is None else argv
    workdir = Path(args[0]) if args else Path(".mergetxn") / "zookeeper"
    port = int(args[1]) if len(args) > 1 else None
    server = ZooKeeperServer(workdir, port=port)
    print(f"ZooKeeper serving at {server.start()} (logs in {server.log_file}); Ctrl-C stops it")
    try:
        while server.running:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
