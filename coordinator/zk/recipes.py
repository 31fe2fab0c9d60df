"""ZooKeeper recipes of our own, in the manner of kazoo's (kazoo/recipe/*.py).

**Compare-and-swap** (:func:`cas_update`) on one znode holding a small document: read its data
and version, compute the new data, write it with ``version=`` (or create the node if it did not
exist). When another writer got in between (BadVersionError, NodeExistsError, NoNodeError), the
step raises kazoo's ForceRetryError so that the client's command retry (``zk.retry``, the policy
that also covers a lost connection) runs the whole step again, as kazoo's Counter does
(kazoo/recipe/counter.py, ``_inner_change``). The change may therefore run several times, and once
more after a write whose answer was lost: it must compute the new data from what it was given
(e.g. "raise to at least N"), never from how often it ran.

**Removing a watch** (:func:`remove_data_watch`): ZooKeeper 3.5's ``removeWatches`` request (op
18), which kazoo does not send. An exists-watch on a node that will never be created (the next
log position of an epoch that was sealed instead) stays on the server and in kazoo's table of
watchers for the whole session, and kazoo sends every path of that table again after each
reconnect: one such watch per epoch is a leak over a month. The request is built as kazoo's own
are (``kazoo.protocol.serialization``: a namedtuple with ``type``, ``serialize`` and
``deserialize``) and sent by ``_call``, the road every request of kazoo's own methods takes
(kazoo has no public one).
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NoWatcherError
from kazoo.protocol.serialization import int_struct, write_string
from kazoo.retry import ForceRetryError

DATA_WATCHES = 2  # RemoveWatchesRequest's watcher type: data (and exists) watches


class RemoveWatches(namedtuple("RemoveWatches", "path watcher_type")):
    """ZooKeeper's RemoveWatchesRequest: the session's watches of ``watcher_type`` on ``path``."""

    type = 18

    def serialize(self) -> bytearray:
        b = bytearray()
        b.extend(write_string(self.path))
        b.extend(int_struct.pack(self.watcher_type))
        return b

    @classmethod
    def deserialize(cls, _bytes: bytes, _offset: int) -> bool:
        return True  # the reply is the header alone


def remove_data_watch(zk: Any, path: str, timeout: float = 10.0) -> bool:
    """Remove this session's data (exists) watch on ``path`` at the server and forget its
    callbacks in kazoo; False if the server held none (it fired, or a reconnect dropped it)."""
    sent = (zk.chroot or "") + path
    result = zk.handler.async_result()
    zk._call(RemoveWatches(sent, DATA_WATCHES), result)
    zk._data_watchers.pop(sent, None)  # kazoo re-sends the paths it holds here after a reconnect
    try:
        return bool(result.get(timeout=timeout))
    except NoWatcherError:
        return False


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
