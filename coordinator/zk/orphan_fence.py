"""The orphan fence: no cleanup pass deletes a file that a commit can still name, and no commit
succeeds naming a file that is gone.

Cleanup decides that a file is an orphan from what it can see (its age, the log as applied, the
running transactions that replicas last published), and a replica that stalls (a GC pause, a
frozen VM, SIGSTOP) can come back and commit a transaction that staged that very file. Ages and
publications are timing; this recipe makes it a matter of order in ZooKeeper instead.

Znode ``fence`` (JSON ``{"pending": [path, ...]}``) lists the files that a cleanup pass has
condemned and not yet confirmed deleted. Its data version is the fence:

* **A cleanup pass** adds the files it is about to delete to ``pending`` (one compare-and-swap,
  which moves the version), *then* catches up with the log, drops every file some commit applied
  meanwhile names, deletes the rest, and finally removes from ``pending`` the files it deleted
  (or found referenced). A pass that dies or stalls in between leaves its files pending; the next
  pass deletes them and confirms them.
* **Every commit multi** checks the fence version ``v`` it read, and before the multi the
  committer refuses any part whose file is pending at ``v`` and verifies that every staged file
  exists (a ``stat``), after having read ``v``.

Why that suffices, for a commit C naming file F and a pass P deleting F: P announced F at some
version ``a`` before deleting it. If C's multi was applied before the announcement, P sees C in the
log when it catches up and keeps F. Otherwise C's multi checked a version ``v >= a``; at every
version from ``a`` until P (or a later pass) confirmed F deleted, F is pending, so C refused it;
and once confirmed, F is gone before ``v`` was read, so C's ``stat`` found it missing. Part names
are unique, so a confirmed path never comes back. A paused pass that wakes up after another pass
confirmed its files deletes files that are already gone, and nothing else.

A pass announces at most :data:`MAX_PENDING` paths (the znode stays far below ZooKeeper's 1 MB);
the rest wait for the next pass. Passes are serialised by the cleanup lock, but the
compare-and-swap makes the recipe safe without it too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.protocol.states import ZnodeStat

from coordinator.core.errors import CorruptMetadata
from coordinator.model.znodes import FenceRecord
from coordinator.zk.recipes import cas_update

MAX_PENDING = 4000

#: What the fence is, and what to do when it is gone (coordinator/zk/needed.py watches it).
FENCE = (
    "the orphan fence, which every commit checks, so every commit fails until it is back: "
    "restart one replica (its start makes the fence again, empty)"
)


def missing_message(path: str, what: str) -> str:
    """The sentence for a needed node that is gone (coordinator/zk/needed.py)."""
    return f"ZooKeeper node {path} is missing ({what}); only the replicas' identity can delete it"


class FenceMoved(Exception):
    """The fence version checked by a commit multi moved: re-read it, re-verify, try again."""


def _decode(data: bytes, path: str) -> frozenset[str]:
    return FenceRecord.decode(data, path).pending  # (the body: coordinator/model/znodes.py)


def _encode(pending: Iterable[str], by: str) -> bytes:
    return FenceRecord(frozenset(pending), by).encode()


class OrphanFence:
    """One replica's view of the fence (a watched copy) and the two steps of a cleanup pass."""

    def __init__(self, zk: KazooClient, path: str, identity: str) -> None:
        self.zk = zk
        self.path = path
        self.identity = identity
        self._lock = threading.Lock()
        self._version = -1
        self._pending: frozenset[str] = frozenset()

    def start(self) -> None:
        """Create the node if needed, read it, and keep the copy current with a watch."""
        try:
            self.zk.retry(self.zk.create, self.path, _encode((), self.identity))
        except NodeExistsError:
            pass
        self.refresh()
        self.zk.DataWatch(self.path, self._on_change)

    def _on_change(self, data: bytes | None, stat: ZnodeStat | None) -> None:
        if data is not None and stat is not None:
            try:
                self._remember(stat.version, _decode(data, self.path))
            except CorruptMetadata:  # commits keep checking the version; refresh() reports it
                pass

    def _remember(self, version: int, pending: frozenset[str]) -> None:
        with self._lock:
            if version > self._version:
                self._version, self._pending = version, pending

    def current(self) -> tuple[int, frozenset[str]]:
        """(version, pending paths) as last seen: what a commit verifies its files against."""
        with self._lock:
            return self._version, self._pending

    def refresh(self) -> tuple[int, frozenset[str]]:
        """Read the node now (after a commit multi found the fence moved); CorruptMetadata
        naming the node and what to do when it is gone (every commit fails until it is back)."""
        try:
            data, stat = self.zk.retry(self.zk.get, self.path)
        except NoNodeError:
            raise CorruptMetadata(missing_message(self.path, FENCE), node=self.path) from None
        self._remember(stat.version, _decode(data, self.path))
        return self.current()

    # -- the cleanup side ------------------------------------------------------------------------
    def _update(self, change: Callable[[frozenset[str]], frozenset[str]]) -> frozenset[str]:
        """Compare-and-swap ``pending -> change(pending)`` (coordinator/zk/recipes.py); returns the
        pending set written."""
        data = cas_update(self.zk, self.path, lambda d: _encode(change(_decode(d or b"", self.path)), self.identity))
        pending = _decode(data or b"", self.path)  # (never None: the change always writes)
        self.refresh()
        return pending

    def announce(self, paths: Iterable[str]) -> tuple[list[str], frozenset[str]]:
        """Condemn ``paths`` (at most what fits); returns (the paths announced now, every pending
        path, those of earlier unfinished passes included). Call before deleting any of them."""
        paths = list(paths)
        taken: list[str] = []

        def add(pending: frozenset[str]) -> frozenset[str]:
            room = max(0, MAX_PENDING - len(pending))
            taken[:] = [p for p in paths if p not in pending][:room]
            return pending | set(taken)

        pending = self._update(add)
        return taken, pending

    def confirm(self, paths: Iterable[str]) -> None:
        """Take ``paths`` off the pending list: each is deleted, or a commit references it."""
        done = set(paths)
        if done:
            self._update(lambda pending: pending - done)
