"""Client sessions: a transaction belongs to the client that began it (docs/rules.md#client-sessions),
as ClickHouse ends a transaction with its session.

A :class:`mergetxn.client.client.Client` names itself with a random session id, sends it with each
``begin`` and, while it holds transactions, a ``heartbeat`` every third of the replica's
``client_session_timeout`` from a thread of its own (so a long call on another connection, or a
reconnection after a network blip, does not silence it). The session is the client, not a TCP
connection: a client's threads each have their own connection.

A session not heard from for ``client_session_timeout`` seconds is gone (its process died, stood
still or was cut off): the replica's reaper aborts its running transactions with a reason naming
the session and the setting, which ``commit_status`` and the events show. Only sessions that hold
running transactions are remembered, so a client cannot grow this table with heartbeats.

A session id is the client's word, so it is the user's own name for it: sessions are kept by
(user, id) (the user None on an unsecured replica), and a heartbeat keeps alive the sessions of
that id that its caller may act for (coordinator/core/grants.py, ``acts_for``: its own, or any for
an admin). Another user's heartbeat with the same id, or a transaction it begins under that id,
touches a session of its own and never the first user's.

Pure bookkeeping over a clock handed in: the registry (replicas/registry.py) does the aborting.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from coordinator.core.errors import InvalidInput, quote
from coordinator.core.grants import Grantee, acts_for
from coordinator.model.atomicity import MAX_SESSION

Key = tuple[str | None, str]  # (the user that began it, None on an unsecured replica; its session id)


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
        self._heard: dict[str, dict[str | None, float]] = {}  # session id -> its user -> when
        self._lock = threading.Lock()
        self._last_check: float | None = None

    def began(self, key: Key, now: float) -> None:
        """A transaction of session ``key`` began: it is heard from now, and remembered."""
        owner, session = key
        with self._lock:
            self._heard.setdefault(session, {})[owner] = now

    def heard(self, session: str, now: float, who: Grantee | None = None) -> bool:
        """A heartbeat from ``who`` (None: an unsecured replica's caller): True when this replica
        remembers a session of that id that ``who`` may act for (holding running transactions
        here), each such one heard from now."""
        with self._lock:
            owners = self._heard.get(session, {})
            hit = [owner for owner in owners if acts_for(who, owner)]
            for owner in hit:
                owners[owner] = now
            return bool(hit)

    def silent_for(self, key: Key, now: float) -> float:
        """Seconds since session ``key`` was last heard from (0 for one not remembered)."""
        heard = self._heard.get(key[1], {}).get(key[0])
        return 0.0 if heard is None else max(0.0, now - heard)

    def expired(self, holding: Iterable[Key], now: float) -> dict[Key, float]:
        """The sessions among ``holding`` (those with running transactions) silent past the
        timeout, with how long; sessions holding nothing any more are forgotten. A gap in these
        checks longer than half the timeout (and MIN_GAP) means this process stood still (or was starved):
        then nobody could be heard, so every session is heard from now instead of expired."""
        holding = set(holding)
        with self._lock:
            stood_still = self._last_check is not None and now - self._last_check > max(self.timeout / 2, MIN_GAP)
            self._last_check = now
            heard = {(o, s): t for s, owners in self._heard.items() for o, t in owners.items() if (o, s) in holding}
            if stood_still:
                heard = dict.fromkeys(heard, now)
            self._heard = {}
            for (o, s), t in heard.items():
                self._heard.setdefault(s, {})[o] = t
            return {k: now - t for k, t in heard.items() if now - t > self.timeout}
