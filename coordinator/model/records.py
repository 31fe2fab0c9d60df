"""The typed contracts between the layers, each encoded and decoded in one place.

Pure: no ZooKeeper, no storage, no sockets. Everything that a replica writes for others to read
(a log entry, a WAL record, its alive node) or answers about a transaction's fate is one type
here, so that a field added by a later feature is added once:

* :class:`LogEntry` (with :class:`TxnRecord` and :class:`Change`): one znode of the CSN log (or
  the manifest file a :class:`ManifestPointer` names when the entry is too large for ZooKeeper);
* :data:`WalRecord`: :class:`WalEntry` (an applied log entry), :class:`WalStaged` (part files a
  running transaction wrote), :class:`WalBase` (the local state snapshot a compacted WAL continues);
* :class:`AliveRecord`: what ``replicas/<host>/alive`` says (read by cleanup and the log tail);
* :class:`TxnState` and :class:`CommitStatus`: a transaction's state, on the replica and over RPC;
* :data:`StagedOp`: one statement a transaction stages (:class:`Insert`, :class:`Overwrite`,
  :class:`Truncate`, :class:`Mutate`, :class:`Compact`), sent by the client, decoded by the replica
  with :func:`op_from_dict`.

Decoding validates: anything malformed is :class:`~coordinator.core.errors.CorruptMetadata` naming
where it came from (a staged operation, which a client sends: :class:`~coordinator.core.errors.InvalidInput`
naming the field), and nothing is half decoded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Literal

from coordinator.core import jsonwire
from coordinator.core.conflicts import Kind, check_app_version
from coordinator.core.errors import CorruptMetadata, InvalidInput, clip, quote
from coordinator.core.versions import Tid
from coordinator.model.catalog import TableDef, TableDropped, TableRecord
from coordinator.model.znodes import MALFORMED, corrupt, text
from parts.model.meta import PartMeta, spill_location

ENTRY_FORMAT = 1


class TxnState(StrEnum):
    RUNNING = "running"
    COMMITTING = "committing"
    COMMITTED = "committed"
    ABORTED = "aborted"
    # commit_status only: committed longer ago than the replica's outcome window (outcome_seconds),
    # so neither committed nor aborted can be told (never a transaction's state in the registry).
    UNKNOWN = "unknown"


# -- staged operations ----------------------------------------------------------------------------
# One type per statement, told apart by ``kind`` (the ``"op"`` key on the wire). The conflict rules'
# operation kind (``operation_kind``) is the type's. What a statement cannot have (an INSERT's
# removed parts, ...) reads as empty, so folding statements into an effect reads them all alike.
# ``partitions`` are partition keys (coordinator.core.tabledata.partition_key); None: where its parts are.


class _AddsRows:
    """An operation whose rows are those of the parts it adds."""

    added: tuple[PartMeta, ...]

    @property
    def rows(self) -> int:
        return sum(m.rows for m in self.added)


def _replacing(op: Overwrite | Mutate | Compact) -> dict[str, Any]:
    """The wire fields, in order, of an operation that replaces ``removed`` parts by ``added``."""
    return {
        "op": op.kind,
        "table": op.table,
        "added": [m.to_dict() for m in op.added],
        "removed": list(op.removed),
        "partitions": None if op.partitions is None else list(op.partitions),
    }


@dataclass(frozen=True)
class Insert(_AddsRows):
    """INSERT INTO: parts added."""

    table: str
    added: tuple[PartMeta, ...] = ()
    kind: Literal["insert"] = field(default="insert", init=False)

    removed: ClassVar[tuple[str, ...]] = ()
    partitions: ClassVar[None] = None
    whole_table: ClassVar[bool] = False
    operation_kind: ClassVar[Kind] = Kind.INSERT

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.kind, "table": self.table, "added": [m.to_dict() for m in self.added]}


@dataclass(frozen=True)
class Overwrite(_AddsRows):
    """INSERT OVERWRITE: the parts it saw in ``partitions`` (``removed``) replaced by ``added``."""

    table: str
    added: tuple[PartMeta, ...] = ()
    removed: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    kind: Literal["overwrite"] = field(default="overwrite", init=False)

    whole_table: ClassVar[bool] = False
    operation_kind: ClassVar[Kind] = Kind.OVERWRITE

    def to_dict(self) -> dict[str, Any]:
        return _replacing(self)


@dataclass(frozen=True)
class Truncate:
    """TRUNCATE of ``partitions``, or (None) of the whole table: the parts it saw removed."""

    table: str
    removed: tuple[str, ...] = ()
    partitions: tuple[str, ...] | None = None
    kind: Literal["truncate"] = field(default="truncate", init=False)

    added: ClassVar[tuple[PartMeta, ...]] = ()
    rows: ClassVar[int] = 0
    operation_kind: ClassVar[Kind] = Kind.OVERWRITE

    @property
    def whole_table(self) -> bool:
        return self.partitions is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.kind,
            "table": self.table,
            "removed": list(self.removed),
            "partitions": None if self.partitions is None else list(self.partitions),
            "whole_table": self.whole_table,
        }


@dataclass(frozen=True)
class Mutate(_AddsRows):
    """DELETE or UPDATE, copy-on-write: ``removed`` parts rewritten as ``added``. The predicate
    (``where``, substrait, base64) and an update's ``assignments`` (coordinator.core.tabledata.encode_assignments)
    travel with it, so the replica can redo it on the current parts at commit."""

    kind: Literal["delete", "update"]
    table: str
    where: str
    added: tuple[PartMeta, ...] = ()
    removed: tuple[str, ...] = ()
    partitions: tuple[str, ...] | None = None
    assignments: str | None = None

    whole_table: ClassVar[bool] = False
    operation_kind: ClassVar[Kind] = Kind.MUTATE

    def to_dict(self) -> dict[str, Any]:
        d = {**_replacing(self), "where": self.where}
        if self.kind == "update":
            d["assignments"] = self.assignments
        return d


_COMPACT_KINDS = {"minor": Kind.MINOR_COMPACT, "major": Kind.MAJOR_COMPACT}


@dataclass(frozen=True)
class Compact:
    """A compaction (``compact_kind`` minor or major): ``removed`` parts merged into ``added``.

    ``rows`` is what counts against the transaction's row limit: 0 unless set (it is not on the
    wire); ``client.compact`` sets it, a staged or background compaction does not."""

    table: str
    compact_kind: Literal["minor", "major"]
    added: tuple[PartMeta, ...] = ()
    removed: tuple[str, ...] = ()
    partitions: tuple[str, ...] | None = None
    rows: int = field(default=0, compare=False)
    kind: Literal["compact"] = field(default="compact", init=False)
    # A replica's own flush (parts.io.rewrite.compact with ``spill``): (removed inlined part,
    # bundle path, offset) each, which its Change records (PartMeta.spilled). Never on the wire:
    # a client's compaction cannot name it (op_from_dict refuses the key).
    spilled: tuple[tuple[str, str, int], ...] = field(default=(), compare=False)

    whole_table: ClassVar[bool] = False

    @property
    def operation_kind(self) -> Kind:
        return _COMPACT_KINDS[self.compact_kind]

    def to_dict(self) -> dict[str, Any]:
        return {**_replacing(self), "compact_kind": self.compact_kind}


@dataclass(frozen=True)
class DropTable:
    """DROP TABLE: from the transaction's CSN on the table does not exist. What it removes is
    not listed: the log's apply removes every part of the table live at that CSN (so a part
    committed elsewhere just before it is removed too, on every replica alike)."""

    table: str
    kind: Literal["drop_table"] = field(default="drop_table", init=False)

    added: ClassVar[tuple[PartMeta, ...]] = ()
    removed: ClassVar[tuple[str, ...]] = ()
    partitions: ClassVar[None] = None
    whole_table: ClassVar[bool] = False
    rows: ClassVar[int] = 0
    operation_kind: ClassVar[Kind] = Kind.OVERWRITE

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.kind, "table": self.table}


StagedOp = Insert | Overwrite | Truncate | Mutate | Compact | DropTable

# The keys each operation may carry on the wire besides "op" and "table".
_OP_KEYS: dict[str, frozenset[str]] = {
    "insert": frozenset({"added"}),
    "overwrite": frozenset({"added", "removed", "partitions"}),
    "truncate": frozenset({"removed", "partitions", "whole_table"}),
    "delete": frozenset({"added", "removed", "partitions", "where"}),
    "update": frozenset({"added", "removed", "partitions", "where", "assignments"}),
    "compact": frozenset({"added", "removed", "partitions", "compact_kind"}),
    "drop_table": frozenset(),
}
_ANY_OP_KEY = frozenset().union(*_OP_KEYS.values())


def op_from_dict(d: Any) -> StagedOp:
    """Decode a staged operation (what :meth:`to_dict` gives). Anything wrong with its shape is
    InvalidInput naming the field, a bad part descriptor in ``added`` included (it comes from a
    caller: what :meth:`PartMeta.from_dict` calls CorruptMetadata is bad input here). A key of another kind of operation is accepted only empty (null,
    false, []), so the encoding that carried every key with those values still decodes."""
    if not isinstance(d, dict):
        raise InvalidInput(f"a staged operation must be an object, got {type(d).__name__}")
    op = d.get("op")
    if op not in _OP_KEYS:
        raise InvalidInput(f"unknown operation {quote(op)}: 'op' must be one of {', '.join(_OP_KEYS)}")
    table = d.get("table")
    if not isinstance(table, str):
        raise InvalidInput(f"{op}: 'table' must be a table name, got {quote(table)}")
    _check_foreign_keys(d, op)
    return _DECODERS[op](_OpFields(d, op, table, _added(d, op, table)))


def _check_foreign_keys(d: dict[str, Any], op: str) -> None:
    """Refuse a key no operation has, and a key of another kind of operation unless empty."""
    for key, value in d.items():
        if key in ("op", "table") or key in _OP_KEYS[op]:
            continue
        if key not in _ANY_OP_KEY:
            raise InvalidInput(f"{op}: unknown field {quote(key)}")
        if not (value is None or value is False or value == []):
            raise InvalidInput(f"{op}: {quote(key)} is not a field of {op}, got {quote(value)}")


def _added(d: dict[str, Any], op: str, table: str) -> tuple[PartMeta, ...]:
    """The part descriptors in ``added``; a bad one is the caller's bad input."""
    added_raw = d.get("added")
    if added_raw is not None and not isinstance(added_raw, list):
        raise InvalidInput(f"{op}: 'added' must be a list of part descriptors, got {quote(added_raw)}")
    try:
        return tuple(PartMeta.from_dict(m) for m in added_raw or ())
    except CorruptMetadata as exc:  # a caller's descriptor: bad input, not corrupt storage (exit 2, not 8)
        raise InvalidInput(f"{op}: {exc.message}", table=table) from None


@dataclass(frozen=True)
class _OpFields:
    """A staged operation's fields on the wire, read one by one; errors name the operation."""

    d: dict[str, Any]
    op: str
    table: str
    added: tuple[PartMeta, ...]

    def names(self, key: str) -> tuple[str, ...]:
        v = self.d.get(key)
        if v is None:
            return ()
        if not isinstance(v, list) or not all(isinstance(n, str) for n in v):
            raise InvalidInput(f"{self.op}: {quote(key)} must be a list of part names, got {quote(v)}")
        return tuple(v)

    def pkeys(self) -> tuple[str, ...] | None:
        v = self.d.get("partitions")
        if v is None:
            return None
        if not isinstance(v, list) or not all(isinstance(p, str) for p in v):
            raise InvalidInput(f"{self.op}: 'partitions' must be null or a list of partition keys, got {quote(v)}")
        return tuple(v)

    def text(self, key: str) -> str:
        v = self.d.get(key)
        if not isinstance(v, str):
            raise InvalidInput(f"{self.op}: {quote(key)} must be a string, got {quote(v)}")
        return v


def _overwrite(f: _OpFields) -> Overwrite:
    partitions = f.pkeys()
    if partitions is None:
        raise InvalidInput("overwrite: 'partitions' must be the list of partition keys it replaces")
    return Overwrite(f.table, f.added, f.names("removed"), partitions)


def _truncate(f: _OpFields) -> Truncate:
    partitions = f.pkeys()
    whole = f.d.get("whole_table", partitions is None)
    if not isinstance(whole, bool) or whole != (partitions is None):
        raise InvalidInput(
            f"truncate: 'whole_table' must be true exactly when 'partitions' is null, "
            f"got {quote(whole)} with partitions {quote(partitions)}"
        )
    return Truncate(f.table, f.names("removed"), partitions)


def _compact(f: _OpFields) -> Compact:
    kind = f.d.get("compact_kind")
    if kind not in _COMPACT_KINDS:
        raise InvalidInput(f"compact: 'compact_kind': compaction kind must be 'minor' or 'major', not {quote(kind)}")
    return Compact(f.table, kind, f.added, f.names("removed"), f.pkeys())


def _mutate(f: _OpFields, kind: Literal["delete", "update"]) -> Mutate:
    where = f.text("where")
    removed, partitions = f.names("removed"), f.pkeys()
    return Mutate(
        kind, f.table, where, f.added, removed, partitions, f.text("assignments") if kind == "update" else None
    )


# The decoder of each kind of staged operation (its fields' keys: _OP_KEYS).
_DECODERS: dict[str, Callable[[_OpFields], StagedOp]] = {
    "insert": lambda f: Insert(f.table, f.added),
    "overwrite": _overwrite,
    "truncate": _truncate,
    "delete": lambda f: _mutate(f, "delete"),
    "update": lambda f: _mutate(f, "update"),
    "compact": _compact,
    "drop_table": lambda f: DropTable(f.table),
}


# -- the log --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Change:
    """What one transaction of an entry did to one target (table partition). ``spilled`` (a
    flush's): removed inlined part -> (bundle path, offset) where the flush stored its bytes;
    applying the entry drops the bytes from the part's record and keeps this instead
    (PartMeta.spilled, docs/architecture/small-writes.md "Bounds"); on the wire only when any."""

    table: str
    pkey: str
    kinds: tuple[Kind, ...]
    added: tuple[PartMeta, ...]
    removed: tuple[str, ...]
    spilled: dict[str, tuple[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "table": self.table,
            "pkey": self.pkey,
            "kinds": [k.value for k in self.kinds],
            "added": [m.to_dict() for m in self.added],
            "removed": list(self.removed),
        }
        if self.spilled:
            d["spilled"] = {n: list(at) for n, at in self.spilled.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Change:
        removed = tuple(str(n) for n in d.get("removed", ()))
        return cls(
            str(d["table"]),
            str(d["pkey"]),
            tuple(Kind(k) for k in d["kinds"]),
            tuple(PartMeta.from_dict(m) for m in d.get("added", ())),
            removed,
            _spilled(d.get("spilled"), removed, str(d["table"])),
        )


def _spilled(raw: Any, removed: tuple[str, ...], table: str) -> dict[str, tuple[str, int]]:
    """A change's ``spilled``, checked: an object of removed part name -> [bundle path under
    ``table``, offset]."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise CorruptMetadata(f"a change's 'spilled' must be an object of part name -> location, got {quote(raw)}")
    names = set(removed)
    out = {}
    for name, at in raw.items():
        if name not in names:
            raise CorruptMetadata(f"a change's 'spilled' names part {quote(name)}, which it does not remove")
        out[name] = spill_location(at, f"the spilled part {quote(name)}", table)
    return out


@dataclass(frozen=True)
class TxnRecord:
    """One committed transaction in an entry: its tid, time version (None for compactions),
    changes per target, and the application versions it recorded (``apps``: app id -> version,
    ``tx.set_app_version``; on the wire only when there are any)."""

    tid: str
    time_version: float | None
    changes: tuple[Change, ...]
    apps: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "tid": self.tid,
            "time_version": self.time_version,
            "changes": [c.to_dict() for c in self.changes],
        }
        if self.apps:
            d["apps"] = dict(self.apps)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TxnRecord:
        Tid.parse(d["tid"])
        tv = d.get("time_version")
        apps = d.get("apps") or {}
        if not isinstance(apps, dict):
            raise ValueError(f"'apps' of {d['tid']} must be an object of app id -> version, not {quote(apps)}")
        try:
            apps = dict(check_app_version(k, v) for k, v in apps.items())
        except InvalidInput as exc:
            raise ValueError(exc.message) from None
        return cls(
            str(d["tid"]),
            None if tv is None else float(tv),
            tuple(Change.from_dict(c) for c in d.get("changes", ())),
            apps,
        )


@dataclass(frozen=True)
class LogEntry:
    """One commit point: the transactions that share its CSN, the tables it creates, alters
    (a :class:`TableDef` with ``created_csn`` set: the whole new definition) or drops
    (:class:`TableDropped`), and the new version of every conflict target it bumped."""

    time: float
    versions: dict[str, int]
    txns: tuple[TxnRecord, ...] = ()
    ddl: tuple[TableRecord, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "v": ENTRY_FORMAT,
            "time": self.time,
            "versions": dict(self.versions),
            "txns": [t.to_dict() for t in self.txns],
        }
        if self.ddl:
            d["ddl"] = [_ddl_to_dict(t) for t in self.ddl]
        return d

    def encode(self) -> bytes:
        return jsonwire.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Any, where: str) -> LogEntry:
        """Validate a decoded entry whole (CorruptMetadata naming ``where``): a malformed entry is
        refused before anything applies it or the WAL records it."""
        if not isinstance(d, dict) or d.get("v") != ENTRY_FORMAT:
            raise CorruptMetadata(f"log entry {where} has no supported format version (want v={ENTRY_FORMAT})")
        try:
            return cls(
                time=float(d.get("time", 0.0)),
                versions={str(k): int(v) for k, v in d.get("versions", {}).items()},
                txns=tuple(TxnRecord.from_dict(t) for t in d.get("txns", ())),
                ddl=tuple(_ddl_from_dict(x) for x in d.get("ddl", ())),
            )
        except MALFORMED as exc:  # (RecursionError: nesting too deep to take apart; ArithmeticError: a huge number)
            why = "nested too deep" if isinstance(exc, RecursionError) else quote(exc)
            raise CorruptMetadata(f"log entry {where} is malformed: {why}") from None
        except CorruptMetadata as exc:
            raise CorruptMetadata(f"log entry {where} is malformed: {exc.message}") from exc


def _ddl_to_dict(t: TableRecord) -> dict[str, Any]:
    if isinstance(t, TableDropped):
        return {"drop_table": t.to_dict()}
    return {"alter_table" if t.created_csn else "create_table": t.to_dict()}


def _ddl_from_dict(x: dict[str, Any]) -> TableRecord:
    if "drop_table" in x:
        return TableDropped.from_dict(x["drop_table"])
    if "alter_table" in x:
        t = TableDef.from_dict(x["alter_table"])
        if not t.created_csn:
            raise ValueError(f"alter_table of {quote(t.name)} names no created_csn")
        return t
    return TableDef.from_dict(x["create_table"])


@dataclass(frozen=True)
class ManifestPointer:
    """What the znode holds when the entry went to a manifest file in storage (too large)."""

    path: str

    def encode(self) -> bytes:
        return jsonwire.dumps({"v": ENTRY_FORMAT, "manifest": self.path}, sort_keys=True)


def decode_log_node(data: bytes, where: str) -> LogEntry | ManifestPointer:
    """A log znode's data (or a manifest file's): the entry, or the pointer to its manifest."""
    try:
        d = jsonwire.loads(data)
    except (ValueError, TypeError) as exc:  # (UnicodeDecodeError is a ValueError)
        raise CorruptMetadata(f"log entry {where} is not valid JSON: {clip(exc)}") from None
    if isinstance(d, dict) and d.get("v") == ENTRY_FORMAT and "manifest" in d:
        if not isinstance(d["manifest"], str):
            raise CorruptMetadata(f"log entry {where} names a manifest that is not a path: {quote(d['manifest'])}")
        return ManifestPointer(d["manifest"])
    return LogEntry.from_dict(d, where)


# -- the WAL --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WalEntry:
    """A log entry applied here (the WAL caches the log: replayed on restart). Written with
    ``entry`` (and its encoding in ``raw`` when at hand, so it is not encoded twice); read back
    with ``raw`` holding the decoded JSON, validated only when replayed (:meth:`log_entry`)."""

    csn: int
    epoch: int
    seq: int
    entry: LogEntry | None = None
    raw: bytes | dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def log_entry(self, where: str) -> LogEntry:
        if self.entry is not None:
            return self.entry
        return LogEntry.from_dict(self.raw, f"{where} (CSN {self.csn})")


@dataclass(frozen=True)
class WalStaged:
    """Part files a running transaction wrote: deleted on restart unless it committed."""

    tid: str
    paths: tuple[str, ...]


@dataclass(frozen=True)
class WalBase:
    """First record of a compacted WAL: its entries continue the local state snapshot at ``csn``."""

    csn: int


WalRecord = WalEntry | WalStaged | WalBase


def wal_record_body(rec: WalRecord) -> bytes:
    """A WAL record's encoding (the one place that knows it)."""
    if isinstance(rec, WalEntry):
        if isinstance(rec.raw, bytes):
            body = rec.raw
        elif rec.raw is not None:
            body = jsonwire.dumps(rec.raw)
        else:
            body = rec.log_entry("the WAL record being written").encode()
        return b'{"csn":%d,"epoch":%d,"seq":%d,"entry":%b}' % (rec.csn, rec.epoch, rec.seq, body)
    if isinstance(rec, WalStaged):
        return jsonwire.dumps({"staged": rec.tid, "paths": list(rec.paths)})
    return jsonwire.dumps({"base": rec.csn})


def wal_record_from_dict(d: Any, where: str) -> WalRecord:
    """A decoded WAL record by its kind (an entry's own fields are checked when it is replayed)."""
    try:
        if "entry" in d:
            return WalEntry(int(d["csn"]), int(d["epoch"]), int(d["seq"]), raw=d["entry"])
        if "staged" in d:
            return WalStaged(str(d["staged"]), tuple(str(p) for p in d.get("paths", ())))
        if "base" in d:
            return WalBase(int(d["base"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptMetadata(f"{where}: record is malformed: {quote(exc)}") from exc
    raise CorruptMetadata(f"{where}: record of no known kind: {quote(sorted(d) if isinstance(d, dict) else d)}")


# -- the alive node -------------------------------------------------------------------------------
@dataclass(frozen=True)
class AliveRecord:
    """``replicas/<host>/alive``: where a replica serves, what it applied, and the snapshots and
    transactions it still needs (cleanup and the log tail keep what those can see).

    ``oldest_snapshot`` is the lowest CSN the replica needs; a node that does not parse decodes as
    ``malformed`` with ``oldest_snapshot`` 0, so readers keep everything (conservative)."""

    address: str = ""
    incarnation: int = 0
    applied: int = 0
    oldest_txn_snapshot: int | None = None  # of its running transactions (the log tail keeps it)
    oldest_snapshot: int = 0  # of everything in use there: transactions, reads, its own applied
    snapshots: tuple[tuple[int, str], ...] = ()  # the oldest holder of each distinct snapshot
    running: tuple[str, ...] = ()  # running transactions old enough to publish
    running_overflow: bool = False
    malformed: bool = False

    def encode(self) -> bytes:
        return jsonwire.dumps(
            {
                "address": self.address,
                "incarnation": self.incarnation,
                "applied": self.applied,
                "min_snapshot": self.oldest_txn_snapshot,
                "oldest_snapshot": self.oldest_snapshot,
                "snapshots": [list(p) for p in self.snapshots],
                "running": list(self.running),
                "running_overflow": self.running_overflow,
            }
        )

    @property
    def knows_running(self) -> bool:
        """Whether ``running`` lists every long-enough running transaction (else keep them all)."""
        return not (self.running_overflow or self.malformed)

    @classmethod
    def decode(cls, data: bytes, where: str | None = None) -> AliveRecord:
        """The record a node's body holds. A body that does not parse decodes, without ``where``,
        as a ``malformed`` record (what readers want: it keeps everything), and with ``where`` is
        CorruptMetadata naming that node; never anything else (the body is input from outside)."""
        try:
            return cls._fields(data)
        except MALFORMED as exc:
            if where is None:
                return cls(malformed=True)
            raise corrupt(where, exc) from None

    @classmethod
    def _fields(cls, data: bytes) -> AliveRecord:
        def csn(v: Any) -> int | None:
            return v if isinstance(v, int) and not isinstance(v, bool) else None

        d = jsonwire.loads(data)
        if not isinstance(d, dict):
            raise TypeError(f"a JSON object is needed, not {type(d).__name__}")
        applied = csn(d.get("applied"))
        needs = [v for v in (applied, csn(d.get("oldest_snapshot")), csn(d.get("min_snapshot"))) if v is not None]
        return cls(
            address=str(d.get("address", "")),
            incarnation=int(d.get("incarnation", 0)),
            applied=applied or 0,
            oldest_txn_snapshot=csn(d.get("min_snapshot")),
            oldest_snapshot=min(needs) if needs else 0,
            snapshots=tuple(
                (int(s), text(h, "a snapshot's holder in the alive node"))
                for s, h in d.get("snapshots", ())
                if csn(s) is not None
            ),
            running=tuple(text(t, "a running tid in the alive node") for t in d.get("running", ())),
            running_overflow=bool(d.get("running_overflow")) or "running" not in d,
        )


# -- outcomes -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CommitStatus:
    """What ``commit_status`` answers, on the replica and in the client alike."""

    tid: str
    status: str  # a TxnState value: "committed" (csn set), "aborted", "running", "committing" or "unknown"
    csn: int | None = None
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"tid": self.tid, "status": str(self.status), "csn": self.csn, "reason": self.reason}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CommitStatus:
        return cls(str(d.get("tid", "")), str(d["status"]), d.get("csn"), str(d.get("reason", "")))


__all__ = [
    "AliveRecord",
    "Change",
    "CommitStatus",
    "Compact",
    "DropTable",
    "Insert",
    "LogEntry",
    "ManifestPointer",
    "Mutate",
    "Overwrite",
    "StagedOp",
    "Truncate",
    "TxnRecord",
    "TxnState",
    "WalBase",
    "WalEntry",
    "WalRecord",
    "WalStaged",
    "decode_log_node",
    "op_from_dict",
    "wal_record_body",
    "wal_record_from_dict",
]
