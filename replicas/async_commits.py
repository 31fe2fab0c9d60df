"""Async durability (``durability="async"``, docs/rules.md#atomicity-and-durability): commits
answered before ZooKeeper holds them, and ``client.flush()``, which waits until they are durable.

A transaction begun with ``durability="async"`` (only ``atomicity="none"``) commits as any other:
its part files are already in storage (written by the client, named in the WAL's ``staged``
records), and the commit goes to the group committer's queue (replicas/committer.py), which
decides it, writes it in a multi, appends it to the WAL and applies it. Only the answer differs:
the client is answered as soon as the commit is queued, i.e. the replica holds it in memory.
Its outcome is kept here, under the client's session (a random id each ``Client`` makes) and
the user that began it (None on an unsecured replica): a session id is the user's own name for its
commits, so another user's flush with that id finds none of them and is answered as a flush of a
session with no async commits (an admin's finds them: coordinator/core/grants.py, ``acts_for``).

``flush(session)`` waits until every async commit of the session that was queued when it was
called is decided (durable in ZooKeeper and applied here, or failed), then answers the session's
last CSN, how many async commits this process accepted for it, and the failures not yet
acknowledged (a later flush acknowledges them: a flush sent again after a lost answer gets the
same answer). The client compares the count with the commits it made (mergetxn/client/client.py):
the ones this process never heard of were accepted by an earlier process of the replica (it
crashed or restarted), and ``commit_status`` decides each of them.

The loss window: a commit answered but still queued (or in its multi) when the replica process
dies is lost: nothing of it is in ZooKeeper, and on restart its part files are deleted as those
of any transaction that never committed (replicas/replica.py, the WAL's ``staged`` records). A
multi either happened or not, so each lost commit is entirely absent and each other one entirely
present. After ``flush()`` returned, every async commit made before it is in ZooKeeper and
survives anything a sync commit survives. While queued, a commit is a running transaction
(state ``committing``): cleanup keeps its files and ``commit_status`` says ``committing``.

Memory: a session is forgotten once it has nothing pending and is the oldest of more than
:data:`MAX_SESSIONS`; failures beyond :data:`MAX_FAILURES` per session are dropped and the
session marked incomplete. Either way the client learns nothing wrong: it asks ``commit_status``
for every commit it cannot account for.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from coordinator.core.errors import MergetxnError, ReplicaUnavailable
from coordinator.core.grants import Grantee, Role
from replicas.running import RunningTxn
from replicas.sessions import Key

MAX_SESSIONS = 10_000
MAX_FAILURES = 1_000
FLUSH_WAIT = 300.0  # seconds a flush waits for the commits before it (the committer retries for 120 s)

Submit = Callable[[RunningTxn, Callable[[int | None, Exception | None], None]], None]


@dataclass
class _Session:
    accepted: int = 0  # async commits of this session this process accepted
    pending: set[str] = field(default_factory=set)  # their tids, while queued or committing
    last_csn: int | None = None
    failed: dict[str, dict] = field(default_factory=dict)  # tid -> error, until acknowledged
    complete: bool = True  # False once failures were dropped (MAX_FAILURES)


class AsyncCommits:
    """The async commits of one replica process, by client session (``replica.async_commits``)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._sessions: OrderedDict[Key, _Session] = OrderedDict()  # by (user, session id)
        self.accepted = 0  # all sessions: what ``info`` reports
        self.failed = 0
        self.flushing = 0  # flushes waiting now

    def accept(self, txn: RunningTxn, submit: Submit) -> None:
        """Record ``txn`` (state committing, its session set) as pending and queue its commit
        with ``submit``; returns once it is queued."""
        assert txn.async_session is not None
        session = (txn.owner, txn.async_session)
        with self._cond:
            s = self._sessions.get(session)
            if s is None:
                s = self._sessions[session] = _Session()
                self._forget_idle()
            else:
                self._sessions.move_to_end(session)
            s.accepted += 1
            s.pending.add(txn.id)
            self.accepted += 1
        submit(txn, lambda csn, error: self._decided(session, txn.id, csn, error))

    def _decided(self, session: Key, tid: str, csn: int | None, error: Exception | None) -> None:
        with self._cond:
            s = self._sessions.get(session)
            if s is not None:
                s.pending.discard(tid)
                if error is None:
                    s.last_csn = csn if s.last_csn is None or csn is None else max(s.last_csn, csn)
                elif len(s.failed) < MAX_FAILURES:
                    s.failed[tid] = _error(error)
                else:
                    s.complete = False
            if error is not None:
                self.failed += 1
            self._cond.notify_all()

    def _forget_idle(self) -> None:
        while len(self._sessions) > MAX_SESSIONS:
            idle = next((k for k, s in self._sessions.items() if not s.pending), None)
            if idle is None:
                return
            del self._sessions[idle]

    def _find(self, session: str, who: Grantee | None) -> _Session | None:
        """The async commits of ``session`` that ``who`` (None: an unsecured replica's caller) may
        flush: its own; for an admin without its own, the latest session of that id of any user."""
        own = self._sessions.get((None if who is None else who.name, session))
        if own is not None or who is None or who.role is not Role.ADMIN:
            return own
        return next((s for (_, sid), s in reversed(self._sessions.items()) if sid == session), None)

    def flush(
        self, session: str, ack: Iterable[str] = (), timeout: float = FLUSH_WAIT, who: Grantee | None = None
    ) -> dict:
        """Wait until the async commits of ``session`` queued so far are decided; drop the
        failures named in ``ack`` (the client reported them); answer ``{"csn", "accepted",
        "failed": [{"id", "type", "message"}], "complete"}``. ``who``: the caller (None on an
        unsecured replica): another user's session is answered as one with no async commits."""
        deadline = time.monotonic() + timeout
        with self._cond:
            s = self._find(session, who)
            if s is None:
                return {"csn": None, "accepted": 0, "failed": [], "complete": True}
            for tid in ack:
                s.failed.pop(tid, None)
            waiting = set(s.pending)
            self.flushing += 1
            try:
                while waiting & s.pending:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise ReplicaUnavailable(
                            f"flush: {len(waiting & s.pending)} async commit(s) of this client were still being "
                            f"committed after {timeout:g}s (ZooKeeper away?); flush again, or ask commit_status",
                            pending=sorted(waiting & s.pending)[:10],
                        )
                    self._cond.wait(left)
            finally:
                self.flushing -= 1
            return {
                "csn": s.last_csn,
                "accepted": s.accepted,
                "complete": s.complete,
                "failed": [{"id": tid, **err} for tid, err in s.failed.items()],
            }

    def drain(self, timeout: float) -> bool:
        """Wait (at most ``timeout``) until no async commit is pending: a replica stopping
        gracefully commits what it accepted before it stops. True if none is left."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while any(s.pending for s in self._sessions.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def describe(self) -> dict:
        with self._cond:
            return {
                "accepted": self.accepted,
                "failed": self.failed,
                "sessions": len(self._sessions),
                "flushing": self.flushing,
                "pending": sum(len(s.pending) for s in self._sessions.values()),
            }


def _error(exc: Exception) -> dict:
    if isinstance(exc, MergetxnError):
        return {"type": type(exc).__name__, "message": exc.message}
    return {"type": type(exc).__name__, "message": str(exc)}
