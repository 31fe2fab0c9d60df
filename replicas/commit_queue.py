"""The group committer's queue and thread: commits wait here, one thread takes them in batches.

Callers (the RPC server's threads, DDL) put a :class:`Pending` on the queue and either wait for
it or get a callback; the one committer thread takes the next batch (:meth:`CommitQueue.take`)
and hands it to the committer, which decides and writes it (replicas/committer.py). Members the
committer defers go back to the head of the queue in their order. Nobody is left waiting: a
batch that fails unexpectedly fails every member not yet answered, and stopping fails the rest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from coordinator.core.errors import MergetxnError, TransactionAborted, quote

if TYPE_CHECKING:
    from coordinator.model.catalog import TableDef
    from parts.model.meta import PartMeta
    from replicas.running import RunningTxn

log = logging.getLogger(__name__)

MAX_BATCH = 512
ASYNC_PER_BATCH = 16  # async commits of one client session in one batch (see CommitQueue.take)


@dataclass
class Pending:
    """One commit (or DDL) waiting for its answer."""

    txn: RunningTxn | None = None
    table: TableDef | None = None  # CREATE TABLE
    # ALTER TABLE: name, add_columns, rename_columns, retention (None: unchanged; else a 1-tuple)
    alter: tuple[str, Any, Any, Any] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    csn: int | None = None
    error: Exception | None = None
    key_hints: set[str] = field(default_factory=set)
    extra_files: list[PartMeta] = field(default_factory=list)
    files_verified_at: int | None = None  # the fence version after which its staged files were seen
    queued: float = field(default_factory=time.monotonic)  # the commit latency metric starts here

    callback: Callable[[int | None, Exception | None], None] | None = None

    @property
    def ddl(self) -> bool:
        return self.table is not None or self.alter is not None

    @property
    def committing(self) -> RunningTxn:
        """The transaction of a commit (every member but CREATE and ALTER TABLE, which the
        committer hands to replicas/table_changes.py before anything reads this)."""
        assert self.txn is not None, "a CREATE or ALTER TABLE member has no transaction"
        return self.txn

    def resolve(self, csn: int | None = None, error: Exception | None = None) -> None:
        self.csn, self.error = csn, error
        self.done.set()
        if self.callback is not None:
            try:
                self.callback(csn, error)
            except Exception:  # the answer could not be queued: never break the committer
                log.exception("commit callback failed")

    def answer(self) -> int | None:
        """The CSN it committed at, once decided; its error raised otherwise."""
        if self.error is not None:
            raise self.error
        return self.csn


class CommitQueue:
    """The queue of commits and the one thread that takes them in batches.

    ``handle(batch)``: decide and write a batch, returning the members deferred to the next one;
    ``fail(pending, error)``: answer one member with an error (and clean up after it)."""

    def __init__(
        self, handle: Callable[[list[Pending]], list[Pending]], fail: Callable[[Pending, Exception], None]
    ) -> None:
        self.handle, self.fail = handle, fail
        self.items: deque[Pending] = deque()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="committer", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self.thread.join(timeout=5)

    def put(self, p: Pending) -> Pending:
        with self._cond:
            self.items.append(p)
            self._cond.notify()
        return p

    def wait(self, p: Pending) -> int:
        """Queue ``p`` and wait for its answer (:meth:`Pending.answer`)."""
        self.put(p).done.wait()
        csn = p.answer()
        assert csn is not None, "a member is resolved with its CSN or its error"
        return csn

    def _next(self) -> list[Pending] | None:
        """The next batch, waiting for one; None once stopped."""
        with self._cond:
            while not self.items and not self._stop.is_set():
                self._cond.wait(0.5)
            if self._stop.is_set():
                return None
            return self.take()

    def _run(self) -> None:
        while (batch := self._next()) is not None:
            try:
                deferred = self.handle(batch)
                if deferred:
                    with self._cond:
                        self.items.extendleft(reversed(deferred))
            except Exception as exc:  # never leave a caller waiting
                log.exception("commit batch failed")
                error = exc if isinstance(exc, MergetxnError) else TransactionAborted(f"commit failed: {quote(exc)}")
                for p in batch:
                    if not p.done.is_set():
                        self.fail(p, error)
        for p in list(self.items):
            self.fail(p, TransactionAborted("replica is shutting down"))

    def take(self) -> list[Pending]:
        """The next batch, taken from the queue under its lock: a DDL alone, else up to
        MAX_BATCH commits in queue order, at most ASYNC_PER_BATCH of them async commits of one
        client session. A client's backlog of async commits to one keys target commits one per
        batch anyway (two writes of a key never share a CSN); the cap keeps the rest of it from
        being looked at, and deferred, in every batch. Those left keep their order at the head."""
        if self.items[0].ddl:
            return [self.items.popleft()]
        batch: list[Pending] = []
        later: list[Pending] = []
        taken: dict[str, int] = {}
        while self.items and not self.items[0].ddl and len(batch) < MAX_BATCH and len(later) < MAX_BATCH:
            p = self.items.popleft()
            session = p.txn.async_session if p.txn is not None else None
            if session is not None:
                if taken.get(session, 0) >= ASYNC_PER_BATCH:
                    later.append(p)
                    continue
                taken[session] = taken.get(session, 0) + 1
            batch.append(p)
        self.items.extendleft(reversed(later))
        return batch
