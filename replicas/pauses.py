"""Noticing that this process stood still (SIGSTOP, a long GC pause, a frozen VM).

While a replica stands still its ZooKeeper session may expire: its alive node vanishes, and
cleanup on the other replicas may delete parts that this replica's running transactions and its
latest applied snapshot still see. When it runs again, everything it holds in memory is as it
was, and kazoo learns that the session expired only once its connection thread gets to talk to
the server: until then the replica would hand out snapshots and part lists whose files are gone
(readers got ``CorruptPart``; `mergetxn chaos` found it).

So a ticker thread stamps the monotonic clock every :data:`TICK` seconds, and a gap longer than
the threshold closes a gate: requests wait at the gate (the RPC server asks :meth:`wait_awake`)
until this replica has proved its session with a ``sync`` round trip (an expired session is
noticed there: its transactions are aborted and a new incarnation registered, see
replicas/replica.py) and caught up with the log. A request that arrives before the ticker woke
up sees the stale stamp itself and waits too.
"""

from __future__ import annotations

import logging
import threading
import time

from kazoo.exceptions import KazooException

from coordinator.core import retries
from coordinator.core.errors import CorruptMetadata, MergetxnError, ReplicaUnavailable
from replicas.context import ReplicaContext, ReplicaPart
from replicas.zksession import ZkSession

log = logging.getLogger(__name__)

TICK = 0.1  # seconds between stamps


class _NotYet(retries.TryAgain):
    """The new session is not registered yet."""


class PauseGuard(ReplicaPart):
    """The gate of one replica: ``zk`` and ``layout`` (its CsnLog) for the ``sync`` round trip,
    ``zk_session`` for whether the session is usable (replicas/zksession.py) and the replica's
    stop, ``catch_up`` to apply the log up to its end (``Replica.catch_up``)."""

    def __init__(self, context: ReplicaContext, zk_session: ZkSession) -> None:
        super().__init__(context)
        self.layout, self.session_timeout = context.log, context.config.session_timeout
        self.zk_session, self.catch_up = zk_session, context.catch_up
        timeout = self.session_timeout
        # A gap this long may have cost the session (ZooKeeper expires it after ``timeout``,
        # counted from the last ping, which kazoo sends every third of it).
        self.threshold = max(0.5, timeout / 3)
        self._stamp = time.monotonic()
        self._open = threading.Event()
        self._open.set()
        self.pauses = 0  # seen since the start (for ``info``)
        self._thread = threading.Thread(target=self._run, name="pause-guard", daemon=True)

    def start(self) -> None:
        self._stamp = time.monotonic()
        self._thread.start()

    def _stale(self) -> bool:
        return time.monotonic() - self._stamp > self.threshold

    def awake(self) -> bool:
        """True unless this process stood still lately and has not made sure of its session."""
        return self._open.is_set() and not self._stale()

    def wait_awake(self, timeout: float) -> None:
        """Return at once unless this process stood still lately; then wait until the replica
        proved its session and caught up, or raise ReplicaUnavailable after ``timeout``."""
        if self.awake():
            return
        deadline = time.monotonic() + timeout
        while True:
            if self.awake():
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise ReplicaUnavailable(
                    f"replica {self.host_id} stood still (paused) and is still making sure of its ZooKeeper "
                    "session and catching up with the log; try again"
                )
            self._open.wait(min(left, TICK))

    def _run(self) -> None:
        stop = self.zk_session.stop
        while not stop.wait(TICK):
            now = time.monotonic()
            gap = now - self._stamp
            if gap > self.threshold:
                self._open.clear()
                self.pauses += 1
                log.warning(
                    "replica %s stood still for %.1fs: making sure of its ZooKeeper session before serving again",
                    self.host_id,
                    gap,
                )
                self._stamp = time.monotonic()  # requests keep waiting: the gate is closed
                try:
                    self._recover()
                except Exception as exc:  # the next tick looks again; requests time out meanwhile
                    log.warning("replica %s could not make sure of its session: %r", self.host_id, exc)
                    self._stamp = 0.0
                    continue
                self._open.set()
            self._stamp = time.monotonic()

    def _recover(self) -> None:
        """A round trip on a session that is usable (after an expiry: a new one, registered),
        then the log up to its end."""
        for attempt in retries.session_check(
            max(30.0, 3 * self.session_timeout), on=(_NotYet, KazooException, MergetxnError)
        ):
            with attempt:
                if self.zk_session.stop.is_set():
                    return
                self.zk.sync(self.layout.log_path())  # raises on an expired session
                if not self.zk_session.usable():
                    raise _NotYet("waiting for a new session to be registered")
                try:
                    self.catch_up()
                except CorruptMetadata:
                    return  # the log stops at an entry that does not parse: serve what came before
