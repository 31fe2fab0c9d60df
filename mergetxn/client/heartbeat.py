"""A client's session kept alive (replicas/sessions.py has the replica's side).

A transaction belongs to the session of the client that began it; the replica aborts it once
the session goes unheard for ``client_session_timeout``. While a :class:`mergetxn.client.client.Client`
holds transactions, :class:`Heartbeat` sends ``heartbeat`` with the session id every third of
that timeout from a daemon thread with its own connection: a long call on another thread's
connection, or a reconnection after a blip, does not silence the session, while a process that
died or stands still (SIGSTOP) is silent, which is the point.

The client learns the addresses of the cluster's other live replicas (``peers``) when it
connects, and the same thread again every :data:`PEERS_EVERY` seconds while it beats: a commit
whose replica died before answering asks one of them for its outcome (mergetxn/client/client.py,
``Transaction._outcome``), and a call to a replica that stopped answering names them in its
error; the replica is dead by then, so it is asked beforehand, off the commit's path.

Transactions are held weakly: one the program dropped without commit or rollback stops being
kept alive once it is collected. The thread holds no reference to the client, so a client that
is garbage stops its heartbeat too (``weakref.finalize`` in the client).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

from coordinator.core.errors import MergetxnError

log = logging.getLogger(__name__)

BEATS_PER_TIMEOUT = 3  # heartbeats per session timeout: one or two may be lost or late
MIN_INTERVAL, MAX_INTERVAL = 0.1, 10.0
PEERS_EVERY = 60.0  # seconds between looks at the other live replicas' addresses


class Heartbeat:
    """The heartbeat of one client session over ``rpc`` (a coordinator.wire.rpc.RpcClient)."""

    def __init__(self, rpc: Any, session: str) -> None:
        self._rpc = rpc
        self.session = session
        self._held: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.interval = MAX_INTERVAL
        self.peers: list[str] = []  # the other live replicas' addresses, as last learnt
        self._peers_at: float | None = None
        self._holds = 0  # holds so far: an answer about an earlier moment clears nothing newer

    def hold(self, txn: Any, session_timeout: object) -> None:
        """``txn`` (begun with this session) is kept alive until :meth:`release`; the replica's
        ``client_session_timeout`` (its begin answer) sets the pace."""
        if isinstance(session_timeout, (int, float)) and not isinstance(session_timeout, bool) and session_timeout > 0:
            self.interval = min(MAX_INTERVAL, max(MIN_INTERVAL, session_timeout / BEATS_PER_TIMEOUT))
        with self._lock:
            self._held.add(txn)
            self._holds += 1
            if self._thread is None and not self._stop.is_set():  # its first beat at once: peers learnt early
                self._thread = threading.Thread(
                    target=self._run, name=f"mergetxn-heartbeat-{self.session[:8]}", daemon=True
                )
                self._wake.set()
                self._thread.start()

    def release(self, txn: Any) -> None:
        with self._lock:
            self._held.discard(txn)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()

    def _holding(self) -> bool:
        with self._lock:
            return len(self._held) > 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set() or not self._holding():
                continue
            with self._lock:
                holds = self._holds
            self.learn_peers()
            try:
                answer = self._rpc.call(
                    "heartbeat", {"session": self.session}, timeout=max(1.0, self.interval * BEATS_PER_TIMEOUT)
                )
            except MergetxnError as exc:  # the replica away for a moment: the next beat tries again
                log.debug("heartbeat of session %s: %s", self.session, exc.message)
                continue
            except Exception as exc:  # noqa: BLE001 - a closed client: the thread ends quietly
                log.debug("heartbeat of session %s: %r", self.session, exc)
                continue
            if isinstance(answer, dict) and answer.get("known") is False:
                with self._lock:  # the replica holds nothing of this session (all ended there)
                    if self._holds == holds:
                        self._held = weakref.WeakSet()

    def learn_peers(self, timeout: float | None = None) -> None:
        """Ask the replica for :attr:`peers` unless it was asked in the last PEERS_EVERY seconds;
        a failure leaves them as they were. The client asks once when it connects (a call to a
        replica that stopped answering names them: mergetxn/client/client.py, ``Client.call``)."""
        now = time.monotonic()
        if self._peers_at is not None and now - self._peers_at < PEERS_EVERY:
            return
        wait = max(1.0, self.interval * BEATS_PER_TIMEOUT) if timeout is None else timeout
        try:
            answer = self._rpc.call("peers", {}, timeout=wait)
        except Exception as exc:  # noqa: BLE001 - an older replica, or one away: asked again next beat
            log.debug("peers of session %s: %r", self.session, exc)
            return
        found = answer.get("replicas") if isinstance(answer, dict) else None
        if isinstance(found, list) and all(isinstance(a, str) for a in found):
            self.peers, self._peers_at = found[:64], now
