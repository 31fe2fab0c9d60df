"""Client sessions: a transaction belongs to the client that began it (docs/rules.md#client-sessions),
as ClickHouse ends a transaction with its session.

A :class:`coordinator.api.client.Client` names itself with a random session id, sends it with each
``begin`` and, while it holds transactions, a ``heartbeat`` every third of the replica's
``client_session_timeout`` from a thread of its own (so a long call on another connection, or a
reconnection after a network blip, does not silence it). The session is the client, not a TCP
connection: a client's threads each have their own connection.

A session not heard from for ``client_session_timeout`` seconds is gone (its process died, stood
still or was cut off): the replica's reaper aborts its running transactions with a reason naming
the session and the setting, which ``commit_status`` and the events show. Only sessions that hold
running transactions are remembered, so a client cannot grow this table with heartbeats.

Pure bookkeeping over a clock handed in: the registry (replicas/registry.py) does the aborting.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from coordinator.core.errors import InvalidInput, quote
from coordinator.model.atomicity import MAX_SESSION


def check_session_id(session: object) -> str:
    """A client's session id as sent over the wire, or InvalidInput naming what is wrong."""
    if not isinstance(session, str) or not 0 < len(session) <= MAX_SESSION or not session.isprintable():
        raise InvalidInput(
            f"session must be a string of 1 to {MAX_SESSION} printable characters naming the "
            f"client, not {quote(session)}"
        )
    return session


# A gap between two expiry checks (the reaper looks every 0.5 s) longer than half the timeout,
# and at least this, is this process standing still, not its clients.
MIN_GAP = 1.0


class Sessions:
    """When each client session holding running transactions was last heard from."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._heard: dict[str, float] = {}
        self._lock = threading.Lock()
        self._last_check: float | None = None

    def began(self, session: str, now: float) -> None:
        """A transaction of ``session`` began: it is heard from now, and remembered."""
        with self._lock:
            self._heard[session] = now

    def heard(self, session: str, now: float) -> bool:
        """A heartbeat (or any request naming it): True when the session is one this replica
        remembers (it holds running transactions here)."""
        with self._lock:
            if session not in self._heard:
                return False
            self._heard[session] = now
            return True

    def silent_for(self, session: str, now: float) -> float:
        """Seconds since ``session`` was last heard from (0 for one not remembered)."""
        heard = self._heard.get(session)
        return 0.0 if heard is None else max(0.0, now - heard)

    def expired(self, holding: Iterable[str], now: float) -> dict[str, float]:
        """The sessions among ``holding`` (those with running transactions) silent past the
        timeout, with how long; sessions holding nothing any more are forgotten. A gap in these
        checks longer than half the timeout (and MIN_GAP) means this process stood still (or was starved):
        then nobody could be heard, so every session is heard from now instead of expired."""
        holding = set(holding)
        with self._lock:
            stood_still = self._last_check is not None and now - self._last_check > max(self.timeout / 2, MIN_GAP)
            self._last_check = now
            for s in [s for s in self._heard if s not in holding]:
                del self._heard[s]
            if stood_still:
                for s in self._heard:
                    self._heard[s] = now
                return {}
            return {s: now - t for s, t in self._heard.items() if now - t > self.timeout}
