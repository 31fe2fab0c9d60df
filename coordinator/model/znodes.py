"""The body of every ZooKeeper node mergetxn writes or reads, one typed record each (pure).

Each record encodes with :meth:`encode` (JSON through :mod:`coordinator.core.jsonwire`) and
decodes with ``decode(data, where)``: a node body is input from outside this process (another
replica's version, an operator's hand, a bit flip), so decoding refuses anything but what a writer
of this format wrote, with :class:`~coordinator.core.errors.CorruptMetadata` naming the node (a
bounded message), and never raises anything else.

The nodes (paths: coordinator/zk/log.py), where each body's record lives:

==========================  ========================================================================
``config``                  :class:`ConfigRecord` (``{"epoch_size": N}``)
``log/e-<epoch>``           :class:`EpochNode` (empty while open, ``sealed`` once sealed; what counts
                            is its data version)
``log/e-<epoch>/c-<seq>``   coordinator/model/records.py: :class:`~coordinator.model.records.LogEntry`
                            or its :class:`~coordinator.model.records.ManifestPointer`
                            (:func:`~coordinator.model.records.decode_log_node`)
``tables/<table>``          :class:`TableNode` (a marker: exists, or dropped)
``targets/...``             :data:`TARGET_BODY`: always empty, only the data version counts
``replicas/<host>``         :class:`OwnerRecord` (the owner node: its version is the incarnation)
``replicas/<host>/alive``   coordinator/model/records.py: :class:`~coordinator.model.records.AliveRecord`
``fence``                   :class:`FenceRecord` (the orphan fence: coordinator/zk/orphan_fence.py)
``gc``                      :class:`Marks` (cleanup's watermark: coordinator/zk/watermark.py)
``checkpoint``              :class:`TailRecord` (the log tail: replicas/checkpoint.py)
``users``                   :class:`UsersNode` (coordinator/model/users.py holds its records)
==========================  ========================================================================

The kazoo lock recipes' nodes (``gc/lock``, ``leaders/<table>``, ``locks/trim``) hold what kazoo
writes (the contender's identifier); mergetxn never reads their bodies.

Formats stay readable both ways between replicas of mixed versions: every reader of earlier
versions parses these bodies with a JSON parser, so a writer here may emit compact JSON where an
earlier one put spaces (``json.dumps``), and every decoder here accepts both.
"""

from __future__ import annotations

import math
import time as _time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from coordinator.core import jsonwire
from coordinator.core.errors import CorruptMetadata, InvalidInput, clip, quote
from coordinator.model import users as user_records

# What a decoder turns into CorruptMetadata: whatever taking apart a parsed JSON value can raise
# (ArithmeticError: a float beyond range; RecursionError: str() or repr() of deep nesting).
MALFORMED = (ValueError, KeyError, TypeError, AttributeError, ArithmeticError, RecursionError, InvalidInput)
MAX_INT = 2**63 - 1  # what ZooKeeper (and a replica's counters) hold: larger is not ours


def corrupt(where: str, why: object) -> CorruptMetadata:
    """CorruptMetadata naming the node ``where`` and saying (bounded) why its body is refused."""
    if isinstance(why, BaseException):
        why = f"{type(why).__name__}: {why}" if not isinstance(why, RecursionError) else "nested too deep"
    return CorruptMetadata(f"znode {clip(where)} does not parse: {clip(why)}", node=clip(where))


def load_object(data: Any, where: str) -> dict[str, Any]:
    """``data`` parsed as a JSON object (CorruptMetadata naming ``where`` otherwise)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise corrupt(where, f"a node's body is bytes, not {type(data).__name__}")
    try:
        d = jsonwire.loads(data)
    except MALFORMED as exc:
        raise corrupt(where, exc) from None
    if not isinstance(d, dict):
        raise corrupt(where, f"a JSON object is needed, not {type(d).__name__}")
    return d


def count(v: Any, what: str, low: int = 0) -> int:
    """An integer in ``[low, MAX_INT]`` (never a bool): a CSN, a version, a size."""
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= MAX_INT:
        raise ValueError(f"{what} must be an integer from {low} to {MAX_INT}, not {quote(v)}")
    return v


def number(v: Any, what: str) -> float:
    """A finite number (never a bool): a time."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{what} must be a number, not {quote(v)}")
    f = float(v)  # OverflowError for an int beyond a float: caught by the decoders as malformed
    if not math.isfinite(f):
        raise ValueError(f"{what} must be a finite number, not {quote(v)}")
    return f


def text(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{what} must be a string, not {quote(v)}")
    return v


# -- config -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConfigRecord:
    """``config``: the cluster's settings fixed when it was first used (the first writer decides)."""

    epoch_size: int

    def encode(self) -> bytes:
        return jsonwire.dumps({"epoch_size": self.epoch_size})

    @classmethod
    def decode(cls, data: bytes, where: str) -> ConfigRecord:
        # Earlier versions wrote json.dumps's '{"epoch_size": N}' (with a space): the same JSON.
        d = load_object(data, where)
        try:
            return cls(count(d["epoch_size"], "epoch_size", low=1))
        except MALFORMED as exc:
            raise corrupt(where, exc) from None


# -- epochs, tables, targets: markers ------------------------------------------------------------
TARGET_BODY = b""  # targets/...: a conflict target or a write counter is its data version alone


@dataclass(frozen=True)
class EpochNode:
    """``log/e-<epoch>``: its data version says open (0) or sealed (>= 1); the body says the same
    for a human reading the tree."""

    sealed: bool = False

    def encode(self) -> bytes:
        return b"sealed" if self.sealed else b""

    @classmethod
    def decode(cls, data: bytes, where: str) -> EpochNode:
        if data == b"sealed":
            return cls(True)
        if data == b"" or data is None:
            return cls(False)
        raise corrupt(where, f"an epoch node holds nothing or 'sealed', not {quote(data)}")


@dataclass(frozen=True)
class TableNode:
    """``tables/<table>``: a marker, ``{"table":true}`` while the table exists and
    ``{"dropped":true}`` once dropped (the definitions are in the log's DDL entries; its data
    version is bumped by every DDL on the name)."""

    dropped: bool = False

    def encode(self) -> bytes:
        return jsonwire.dumps({"dropped": True} if self.dropped else {"table": True})

    @classmethod
    def decode(cls, data: bytes, where: str) -> TableNode:
        d = load_object(data, where)
        if d == {"dropped": True}:
            return cls(True)
        if d == {"table": True}:
            return cls(False)
        raise corrupt(where, f'a table node holds {{"table":true}} or {{"dropped":true}}, not {quote(d)}')

    @staticmethod
    def says_dropped(data: bytes | None) -> bool:
        """Whether a table node's body says dropped. Anything else, garbage included, reads as a
        table that exists (its name stays taken): the conservative reading, as always."""
        return data == TOMBSTONE


TOMBSTONE = TableNode(dropped=True).encode()  # b'{"dropped":true}', as every version wrote it
TABLE_LIVE = TableNode(dropped=False).encode()  # b'{"table":true}'


# -- the owner node ----------------------------------------------------------------------------
@dataclass(frozen=True)
class OwnerRecord:
    """``replicas/<host>``: the host's registration. Its *data version* is the incarnation (every
    commit multi checks it); its body says who last moved it: the replica registering itself
    (``host_id`` only), another replica that fenced it to decide its transactions
    (``fenced_by``), or an operator that retired it (``retired_at``: ``mergetxn replica retire``;
    registering again clears it).

    One shape, written compact by :meth:`encode`: ``host_id`` always, the other keys only when set.
    Earlier versions wrote it in two places with ``json.dumps`` (spaces), as ``{"host_id": H}``,
    ``{"host_id": H, "fenced_by": F}`` or ``{"host_id": H, "retired_at": T}``; :meth:`decode`
    reads every one of those, and an empty body (``ensure_path`` made the node and the registering
    replica died before its ``set``) as a registration that says nothing."""

    host_id: str = ""
    fenced_by: str | None = None
    retired_at: float | None = None

    @property
    def retired(self) -> bool:
        return self.retired_at is not None

    def encode(self) -> bytes:
        d: dict[str, Any] = {"host_id": self.host_id}
        if self.fenced_by is not None:
            d["fenced_by"] = self.fenced_by
        if self.retired_at is not None:
            d["retired_at"] = self.retired_at
        return jsonwire.dumps(d)

    @classmethod
    def decode(cls, data: bytes, where: str) -> OwnerRecord:
        if data == b"":
            return cls()
        d = load_object(data, where)
        try:
            fenced_by, retired_at = d.get("fenced_by"), d.get("retired_at")
            return cls(
                text(d.get("host_id", ""), "host_id"),
                None if fenced_by is None else text(fenced_by, "fenced_by"),
                None if retired_at is None else number(retired_at, "retired_at"),
            )
        except MALFORMED as exc:
            raise corrupt(where, exc) from None


# -- the orphan fence --------------------------------------------------------------------------
@dataclass(frozen=True)
class FenceRecord:
    """``fence``: ``{"pending": [path, ...], "by": identity}``, the files cleanup condemned and
    has not confirmed deleted (coordinator/zk/orphan_fence.py); ``by``: who wrote it last (for people).
    An empty body holds nothing pending."""

    pending: frozenset[str] = frozenset()
    by: str = ""

    def encode(self) -> bytes:
        return jsonwire.dumps({"pending": sorted(self.pending), "by": self.by})

    @classmethod
    def decode(cls, data: bytes, where: str) -> FenceRecord:
        if data == b"":
            return cls()
        d = load_object(data, where)
        pending = d.get("pending", [])
        if not isinstance(pending, list) or not all(isinstance(p, str) for p in pending):
            raise corrupt(where, f"'pending' is not a list of paths: {quote(pending)}")
        by = d.get("by", "")
        return cls(frozenset(pending), by if isinstance(by, str) else "")


# -- cleanup's watermark -------------------------------------------------------------------------
MAX_HORIZONS = 100_000  # tables named in the gc node (about 60 bytes each: well within a znode)


@dataclass(frozen=True)
class Marks:
    """What the ``gc`` node says (coordinator/zk/watermark.py explains the numbers): parsed, merged
    and asked without ZooKeeper. The node also says who wrote it and when (``by``, ``time``: for
    people; not part of the marks)."""

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
        return Marks(
            max(self.watermark, other.watermark),
            max(self.collected, other.collected),
            horizons,
            max(self.legacy, other.legacy),
        )

    def encode(self, by: str = "") -> bytes:
        return jsonwire.dumps(
            {
                "watermark": self.watermark,
                "collected": self.collected,
                "horizons": dict(sorted(self.horizons.items())),
                "legacy": self.legacy,
                "by": by,
                "time": _time.time(),
            }
        )

    to_bytes = encode  # the name earlier callers use

    @classmethod
    def decode(cls, data: bytes, where: str) -> Marks:
        """CorruptMetadata naming ``where`` for anything but a node this format wrote. A node
        written before retention windows (no ``horizons``) collected every part removed at or
        below its watermark: that is its ``legacy``."""
        d = load_object(data, where)
        try:
            w, c = _csn(d["watermark"]), _csn(d.get("collected", 0))
            if "horizons" not in d:
                return cls(w, c, {}, w)
            raw = d["horizons"]
            if not isinstance(raw, dict) or len(raw) > MAX_HORIZONS:
                raise TypeError(f"horizons must map at most {MAX_HORIZONS} table names to times")
            horizons = {}
            for t, h in raw.items():
                if isinstance(h, bool) or not isinstance(h, (int, float)) or not math.isfinite(h):
                    raise TypeError(f"horizon of {quote(t)} is not a finite number")
                horizons[str(t)] = float(h)
            return cls(w, c, horizons, _csn(d.get("legacy", 0)))
        except MALFORMED as exc:
            raise corrupt(where, exc) from None

    parse = decode  # the name earlier callers use


def _csn(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise TypeError(f"{quote(v)} is not a CSN")
    return v


# -- the log tail --------------------------------------------------------------------------------
@dataclass(frozen=True)
class TailRecord:
    """``checkpoint``: the state up to CSN ``csn`` is in the checkpoint file ``path`` in storage;
    epochs <= ``trimmed_epoch`` may be gone; snapshots < ``retained`` are no longer served; ``time``:
    when a round wrote it (absent before the first). Written as sorted compact JSON, as before."""

    csn: int = 0
    path: str = ""
    trimmed_epoch: int = -1
    retained: int = 0
    time: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields by name, ``time`` only when set (what LogTail keeps and metrics show)."""
        d: dict[str, Any] = {
            "csn": self.csn,
            "path": self.path,
            "trimmed_epoch": self.trimmed_epoch,
            "retained": self.retained,
        }
        if self.time is not None:
            d["time"] = self.time
        return d

    def encode(self) -> bytes:
        return jsonwire.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Any, where: str) -> TailRecord:
        """From the node's fields (keys of a later version are ignored: it stays readable)."""
        if not isinstance(d, dict):
            raise corrupt(where, f"a JSON object is needed, not {type(d).__name__}")
        try:
            t = d.get("time")
            return cls(
                count(d["csn"], "csn"),
                text(d["path"], "path"),
                count(d["trimmed_epoch"], "trimmed_epoch", -1),
                count(d["retained"], "retained"),
                None if t is None else number(t, "time"),
            )
        except MALFORMED as exc:
            raise corrupt(where, exc) from None

    @classmethod
    def decode(cls, data: bytes, where: str) -> TailRecord:
        return cls.from_dict(load_object(data, where), where)


# -- users ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class UsersNode:
    """``users``: a secured cluster's users by name (coordinator/model/users.py: the records, their
    checks, and the body's encoding and decoding, which this wraps)."""

    users: Mapping[str, user_records.UserRecord] = field(default_factory=dict)

    def encode(self) -> bytes:
        return user_records.encode(dict(self.users))

    @classmethod
    def decode(cls, data: bytes, where: str) -> UsersNode:
        return cls(user_records.decode(data, where))


__all__ = [
    "MAX_HORIZONS",
    "TABLE_LIVE",
    "TARGET_BODY",
    "TOMBSTONE",
    "ConfigRecord",
    "EpochNode",
    "FenceRecord",
    "Marks",
    "OwnerRecord",
    "TableNode",
    "TailRecord",
    "UsersNode",
    "corrupt",
    "load_object",
]
