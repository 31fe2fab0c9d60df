"""The cleanup watermark: znode ``gc``, what cleanup may have deleted, only ever raised.

JSON ``{"watermark": W, "collected": C, "horizons": {table: H}, "legacy": L}``. A part of table
``T`` removed by the commit at CSN ``r`` and time ``t`` may be gone from storage when

    r <= L   or   (r <= W and t <= H[T])

(:meth:`Marks.may_be_gone`): ``W`` bounds the snapshots in use (a part removed above it is
visible to one of them), ``H[T]`` is the end of ``T``'s retention window as the pass saw it (its
clock minus the table's ``retention_seconds``; docs/rules.md#history-retention), and ``L`` is what
passes from before retention windows existed collected (every part removed at or below it). A
pass raises the node *before* deleting, so a read that would need a deleted part is refused with
SnapshotUnavailable instead of finding a file missing, and every replica decides "gone" from
these numbers alone: the same answer everywhere, whatever each replica's own settings say.

``C`` is raised once every part removed at or below it is deleted, so later passes skip those
parts and replicas may forget them (replicas/retention.py). Every replica keeps a watched copy; a
pass raises everything with a compare-and-swap (coordinator/zk/recipes.py), each number to the
larger of both, so two passes never lower what the other wrote.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError

from coordinator.core.errors import CorruptMetadata
from coordinator.model.znodes import (  # the node's body (pure); Marks is used from here too
    MAX_HORIZONS,
    Marks,
)
from coordinator.zk.recipes import cas_update

__all__ = ["MAX_HORIZONS", "Marks", "Watermark"]


class Watermark:
    def __init__(self, zk: KazooClient, path: str, identity: str) -> None:
        self.zk = zk
        self.path = path
        self.identity = identity
        self.marks = Marks()
        self._lock = threading.Lock()
        self.on_error: Callable[[CorruptMetadata], None] | None = (
            None  # called with CorruptMetadata when a watched copy does not parse
        )

    @property
    def watermark(self) -> int:
        return self.marks.watermark

    @property
    def collected(self) -> int:
        return self.marks.collected

    def start(self) -> None:
        """Create the node if needed, read it, and keep the copy current with a watch."""
        try:
            self.zk.retry(self.zk.create, self.path, Marks().encode(self.identity))
        except NodeExistsError:
            pass
        self.refresh()
        self.zk.DataWatch(self.path, self._on_change)

    def _on_change(self, data: bytes | None, stat: Any) -> None:
        if data is not None:
            try:
                self._remember(Marks.decode(data, self.path))
            except CorruptMetadata as exc:
                if self.on_error is not None:
                    self.on_error(exc)

    def _remember(self, marks: Marks) -> Marks:
        with self._lock:
            self.marks = self.marks.merged(marks)
            return self.marks

    def refresh(self) -> Marks:
        """Read the node now (a reader that found a part missing asks again), after a ``sync``:
        the ZooKeeper member this session reads from may lag the pass that raised it."""
        self.zk.retry(self.zk.sync, self.path)
        return self._remember(Marks.decode(self.zk.retry(self.zk.get, self.path)[0], self.path))

    def raise_to(
        self,
        watermark: int,
        collected: int | None = None,
        horizons: Mapping[str, float] | None = None,
        keep: set[str] | None = None,
    ) -> Marks:
        """Raise the node to at least these values; returns what it holds then. With ``keep``
        (a pass that collected every removed part at or below ``collected``), the horizons of
        the other tables go and ``legacy`` is raised to ``collected``: every part they could still
        say "gone" of is at or below it, so the node stays the size of the tables with removed
        parts still in storage, however many tables come and go."""
        want = Marks(watermark, collected or 0, dict(horizons or {}))

        def change(data: bytes | None) -> bytes | None:
            cur = Marks.decode(data, self.path) if data is not None else Marks()
            new = cur.merged(want)
            if keep is not None and collected is not None:
                new = Marks(
                    new.watermark,
                    new.collected,
                    {t: h for t, h in new.horizons.items() if t in keep},
                    max(new.legacy, min(collected, new.collected)),
                )
            return None if new == cur else new.encode(self.identity)

        data = cas_update(self.zk, self.path, change)
        return self._remember(want if data is None else Marks.decode(data, self.path))
