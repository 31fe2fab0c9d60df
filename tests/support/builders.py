"""Pure values for unit tests of the replica state, effects and the model: parts, changes, log
entries and staged operations, with defaults for everything a test does not care about.

Staged operations are built only through :func:`staged`, so a change to how a staged operation is
constructed is adapted here once."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from coordinator.core.conflicts import Kind
from coordinator.core.tabledata import partition_key
from coordinator.core.versions import Tid
from coordinator.model.catalog import TableDef
from coordinator.model.records import (
    Change,
    Compact,
    Insert,
    LogEntry,
    Mutate,
    Overwrite,
    StagedOp,
    Truncate,
    TxnRecord,
)
from parts.model.meta import PartMeta

ID_SCHEMA = pa.schema([("p", pa.int64()), ("id", pa.int64())])


def tid(n: int, start_csn: int = 1, host: str = "r0") -> str:
    """A transaction id (``T<start_csn>-<n>-<host>``)."""
    return str(Tid(start_csn, n, host))


def part(name: str, table: str = "t", partition: tuple = (), creator: str = "", rows: int = 1) -> PartMeta:
    """A part descriptor whose file nobody reads."""
    return PartMeta(
        name=name,
        table=table,
        partition=partition,
        path=f"{table}/{name}.parquet",
        rows=rows,
        size=10,
        checksum="crc32:0000abcd",
        stats={"id": (0, rows)},
        creation_tid=creator,
        created_at=1.0,
    )


def table_def(name: str = "t", partitioned: bool = True) -> TableDef:
    """A table of :data:`ID_SCHEMA`, partitioned by ``p`` unless told otherwise."""
    return TableDef.new(name, ID_SCHEMA, partition_by=("p",) if partitioned else ())


def change(
    table: str, partition: tuple, kinds: Iterable[Kind], added: Iterable[PartMeta] = (), removed: Iterable[str] = ()
) -> Change:
    """What one transaction did to one target (the target's key is derived from ``partition``)."""
    return Change(table, partition_key(partition), tuple(kinds), tuple(added), tuple(removed))


def entry(
    *txns: tuple[str, list[Change]],
    versions: dict[str, int] | None = None,
    ddl: Iterable[TableDef] = (),
    time: float = 1.0,
    time_version: float | None = 1.0,
) -> LogEntry:
    """A log entry: one TxnRecord per ``(tid, changes)``, all with ``time_version``."""
    return LogEntry(
        time=time,
        versions=dict(versions or {}),
        txns=tuple(TxnRecord(t, time_version, tuple(chs)) for t, chs in txns),
        ddl=tuple(ddl),
    )


def staged(
    op: str,
    table: str = "t",
    added: Iterable[PartMeta] = (),
    removed: Iterable[str] = (),
    partitions: list[str] | None = None,
    whole_table: bool = False,
    compact_kind: str | None = None,
) -> StagedOp:
    """One staged operation (``op``: insert, overwrite, truncate, delete, update, compact)."""
    added, removed = tuple(added), tuple(removed)
    parts = None if partitions is None else tuple(partitions)
    if op == "insert":
        return Insert(table, added)
    if op == "overwrite":
        return Overwrite(table, added, removed, parts or ())
    if op == "truncate":
        return Truncate(table, removed, None if whole_table else parts)
    if op in ("delete", "update"):
        return Mutate(op, table, "where", added, removed, parts, "set" if op == "update" else None)
    return Compact(table, compact_kind or "minor", added, removed, parts)
