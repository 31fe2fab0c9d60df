"""The cleanup watermark: znode ``gc``, JSON ``{"watermark": W, "collected": C}``, only ever raised.

Parts removed at or below ``W`` may be gone from storage (a pass raises it before deleting them:
a read that would need one is refused instead of finding a file missing); ``C`` is raised once
every deletion up to it succeeded, so later passes skip those parts and replicas may forget them
(replicas/retention.py). Every replica keeps a watched copy; a pass raises both with a
compare-and-swap (coordinator/zkrecipes.py), so two passes never lower what the other wrote.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError

from coordinator import jsonwire
from coordinator.errors import CorruptMetadata
from coordinator.zkrecipes import cas_update


class Watermark:
    def __init__(self, zk: KazooClient, path: str, identity: str) -> None:
        self.zk = zk
        self.path = path
        self.identity = identity
        self.watermark = 0
        self.collected = 0
        self._lock = threading.Lock()
        self.on_error = None  # called with CorruptMetadata when a watched copy does not parse

    def start(self) -> None:
        """Create the node if needed, read it, and keep the copy current with a watch."""
        try:
            self.zk.retry(self.zk.create, self.path, jsonwire.dumps({"watermark": 0, "collected": 0}))
        except NodeExistsError:
            pass
        self.refresh()
        self.zk.DataWatch(self.path, self._on_change)

    def _on_change(self, data: bytes | None, stat: Any) -> None:
        if data is not None:
            try:
                self._remember(self._parse(data))
            except CorruptMetadata as exc:
                if self.on_error is not None:
                    self.on_error(exc)

    def _parse(self, data: bytes) -> tuple[int, int]:
        try:
            d = jsonwire.loads(data)
            return int(d["watermark"]), int(d.get("collected", 0))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptMetadata(f"znode {self.path} does not parse: {exc!r}") from exc

    def _remember(self, values: tuple[int, int]) -> tuple[int, int]:
        with self._lock:
            self.watermark = max(self.watermark, values[0])
            self.collected = max(self.collected, values[1])
        return values

    def refresh(self) -> int:
        """Read the node now (a reader that found a part missing asks again); the watermark."""
        self._remember(self._parse(self.zk.retry(self.zk.get, self.path)[0]))
        return self.watermark

    def raise_to(self, watermark: int, collected: int | None = None) -> tuple[int, int]:
        """Raise the node to at least these values; returns (watermark, collected) it holds."""

        def change(data: bytes | None) -> bytes | None:
            cur = self._parse(data) if data is not None else (0, 0)
            new = (max(cur[0], watermark), max(cur[1], collected if collected is not None else 0))
            if new == cur:
                return None
            return jsonwire.dumps({"watermark": new[0], "collected": new[1], "by": self.identity, "time": time.time()})

        return self._remember(self._parse(cas_update(self.zk, self.path, change)))
