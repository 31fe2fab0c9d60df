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

import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError

from coordinator.core import jsonwire
from coordinator.core.errors import CorruptMetadata
from coordinator.zk.recipes import cas_update

MAX_HORIZONS = 100_000  # tables named in the node (about 60 bytes each: well within a znode)


@dataclass(frozen=True)
class Marks:
    """What the ``gc`` node says (pure: parsed, merged and asked without ZooKeeper)."""

    watermark: int = 0
    collected: int = 0
    horizons: Mapping[str, float] = field(default_factory=dict)
    legacy: int = 0

    def may_be_gone(self, table: str, removal_csn: int | None, removal_time: float | None) -> bool:
        """Whether cleanup may have deleted the part of ``table`` removed at that CSN and time."""
        if removal_csn is None:
            return False
        if removal_csn <= self.legacy:
            return True
        if removal_csn > self.watermark:
            return False
        horizon = self.horizons.get(table)
        # A removal recorded without its time (a checkpoint from before retention) counts as old.
        return horizon is not None and (removal_time is None or removal_time <= horizon)

    def merged(self, other: Marks) -> Marks:
        """Each number the larger of both (what two passes raised, in either order)."""
        horizons = dict(self.horizons)
        for t, h in other.horizons.items():
            if h > horizons.get(t, -math.inf):
                horizons[t] = h
        return Marks(max(self.watermark, other.watermark), max(self.collected, other.collected), horizons,
                     max(self.legacy, other.legacy))

    def to_bytes(self, identity: str) -> bytes:
        return jsonwire.dumps({"watermark": self.watermark, "collected": self.collected,
                               "horizons": dict(sorted(self.horizons.items())), "legacy": self.legacy,
                               "by": identity, "time": time.time()})

    @classmethod
    def parse(cls, data: bytes, where: str) -> Marks:
        """CorruptMetadata naming ``where`` for anything but a node this module wrote. A node
        written before retention windows (no ``horizons``) collected every part removed at or
        below its watermark: that is its ``legacy``."""
        try:
            d = jsonwire.loads(data)
            if not isinstance(d, dict):
                raise TypeError(f"a JSON object is needed, not {type(d).__name__}")
            w, c = _count(d["watermark"]), _count(d.get("collected", 0))
            if "horizons" not in d:
                return cls(w, c, {}, w)
            raw = d["horizons"]
            if not isinstance(raw, dict) or len(raw) > MAX_HORIZONS:
                raise TypeError(f"horizons must map at most {MAX_HORIZONS} table names to times")
            horizons = {}
            for t, h in raw.items():
                if isinstance(h, bool) or not isinstance(h, (int, float)) or not math.isfinite(h):
                    raise TypeError(f"horizon of {t!r} is not a finite number")
                horizons[str(t)] = float(h)
            return cls(w, c, horizons, _count(d.get("legacy", 0)))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptMetadata(f"znode {where} does not parse: {exc!r}") from exc


def _count(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise TypeError(f"{v!r} is not a CSN")
    return v


class Watermark:
    def __init__(self, zk: KazooClient, path: str, identity: str) -> None:
        self.zk = zk
        self.path = path
        self.identity = identity
        self.marks = Marks()
        self._lock = threading.Lock()
        self.on_error = None  # called with CorruptMetadata when a watched copy does not parse

    @property
    def watermark(self) -> int:
        return self.marks.watermark

    @property
    def collected(self) -> int:
        return self.marks.collected

    def start(self) -> None:
        """Create the node if needed, read it, and keep the copy current with a watch."""
        try:
            self.zk.retry(self.zk.create, self.path, Marks().to_bytes(self.identity))
        except NodeExistsError:
            pass
        self.refresh()
        self.zk.DataWatch(self.path, self._on_change)

    def _on_change(self, data: bytes | None, stat: Any) -> None:
        if data is not None:
            try:
                self._remember(Marks.parse(data, self.path))
            except CorruptMetadata as exc:
                if self.on_error is not None:
                    self.on_error(exc)

    def _remember(self, marks: Marks) -> Marks:
        with self._lock:
            self.marks = self.marks.merged(marks)
            return self.marks

    def refresh(self) -> Marks:
        """Read the node now (a reader that found a part missing asks again)."""
        return self._remember(Marks.parse(self.zk.retry(self.zk.get, self.path)[0], self.path))

    def raise_to(self, watermark: int, collected: int | None = None,
                 horizons: Mapping[str, float] | None = None, keep: set[str] | None = None) -> Marks:
        """Raise the node to at least these values; returns what it holds then. With ``keep``
        (a pass that collected every removed part at or below ``collected``), the horizons of
        the other tables go and ``legacy`` is raised to ``collected``: every part they could still
        say "gone" of is at or below it, so the node stays the size of the tables with removed
        parts still in storage, however many tables come and go."""
        want = Marks(watermark, collected or 0, dict(horizons or {}))

        def change(data: bytes | None) -> bytes | None:
            cur = Marks.parse(data, self.path) if data is not None else Marks()
            new = cur.merged(want)
            if keep is not None and collected is not None:
                new = Marks(new.watermark, new.collected, {t: h for t, h in new.horizons.items() if t in keep},
                            max(new.legacy, min(collected, new.collected)))
            return None if new == cur else new.to_bytes(self.identity)

        data = cas_update(self.zk, self.path, change)
        return self._remember(want if data is None else Marks.parse(data, self.path))
