"""ZooKeeper recipes of our own, in the manner of kazoo's (kazoo/recipe/*.py).

**Compare-and-swap** (:func:`cas_update`) on one znode holding a small document: read its data
and version, compute the new data, write it with ``version=`` (or create the node if it did not
exist). When another writer got in between (BadVersionError, NodeExistsError, NoNodeError), the
step raises kazoo's ForceRetryError so that the client's command retry (``zk.retry``, the policy
that also covers a lost connection) runs the whole step again, as kazoo's Counter does
(kazoo/recipe/counter.py, ``_inner_change``). The change may therefore run several times, and once
more after a write whose answer was lost: it must compute the new data from what it was given
(e.g. "raise to at least N"), never from how often it ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.retry import ForceRetryError


def cas_update(zk: Any, path: str, change: Callable[[bytes | None], bytes | None]) -> bytes | None:
    """Replace the data of ``path`` with ``change(data)`` atomically; returns what it holds then.

    ``change`` gets the current data (None: no such node) and returns the new data, or None to
    leave the node as it is. A writer that keeps winning the race for longer than ``zk.retry``
    allows makes this raise kazoo's RetryFailedError."""

    def step() -> bytes | None:
        try:
            data, stat = zk.get(path)
        except NoNodeError:
            data, stat = None, None
        new = change(data)
        if new is None:
            return data
        try:
            if stat is None:
                zk.create(path, new)
            else:
                zk.set(path, new, version=stat.version)
        except (BadVersionError, NodeExistsError, NoNodeError):
            raise ForceRetryError() from None
        return new

    return zk.retry(step)


def release_quietly(lock: Any) -> None:
    """Release a kazoo Lock held for one pass (cleanup, a table's merges), saying nothing when
    the session is in trouble: its node is ephemeral, and goes with the session."""
    try:
        lock.release()
    except Exception:  # pragma: no cover - session trouble; the node is ephemeral
        pass
