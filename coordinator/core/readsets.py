"""Serializable transactions: a transaction's read set and the rule that decides it at commit.

``client.begin(isolation="serializable")`` records every read the transaction makes (``tx.read``,
and the rows ``tx.delete``/``tx.update`` select) as a :class:`Read`: a table and a predicate
(encoded as delete and update predicates are, ``coordinator.core.tabledata.encode_expression``; None: every row).
Besides its table's conflict policy, such a transaction that wrote something fails at commit with
``ConflictError`` (``READ_SET_CHANGED``) when a transaction that committed after its snapshot
added or removed a part that may hold a row its reads returned or could have returned
(:func:`check_reads`): so of two transactions in write skew, the later to commit fails. One that
wrote nothing always commits: its reads were one snapshot.

The decision is at the level of part statistics, as partition pruning is: a part "may match" a
read when its partition values and per-column min/max do not rule the predicate out
(``coordinator.core.tabledata.may_match``). It never misses a change to a row that was or could have been read; it
may report one whose rows did not in fact match (a part whose range spans the predicate).

Which conflict targets such a commit checks and bumps (:func:`read_keys`): the table node (it
moves when a partition node is created, so new partitions are seen) and the node of every
partition the predicates may reach. Every commit that removes parts, and under ``maxcompute`` and
``append`` every commit, checks and bumps its partitions' nodes, so a change of the read set by
another replica between the decision and the multi makes the multi miss and the decision is made
again. A ``parts`` INSERT checks no node (coordinator/core/targets.py: such INSERTs never contend), so
each table also has a write counter, :func:`counter_key`: every commit that writes a ``parts``
table or drops any table bumps it whatever its version (no contention), and a serializable commit
reads the counters of the tables it read, catches up with the log, decides, and checks them at
those versions in its multi. Counters are not conflict targets: no log entry records them.

No I/O: the committer (replicas/committer.py) hands in what its state knows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from coordinator.core.errors import (
    ConflictError,
    ConflictKind,
    CorruptMetadata,
    InvalidInput,
    quote,
)
from coordinator.core.tabledata import decode_expression, may_match, partition_from_key
from coordinator.core.targets import target_key

SNAPSHOT = "snapshot"
SERIALIZABLE = "serializable"
ISOLATIONS = (SNAPSHOT, SERIALIZABLE)


COUNTER_SUFFIX = "@writes"  # no table name holds "@" (coordinator.core.tabledata: names are identifiers)


def counter_key(table: str) -> str:
    """Key of a table's write counter (its znode is ``targets/<table>@writes``)."""
    return table + COUNTER_SUFFIX


def check_isolation(value: object) -> str:
    """An isolation level ``begin`` accepts, or InvalidInput naming the value and the choices."""
    if not isinstance(value, str) or value not in ISOLATIONS:
        raise InvalidInput(f"isolation must be one of {list(ISOLATIONS)}, not {quote(value)}", isolation=repr(value))
    return value


@dataclass(frozen=True)
class Read:
    """One read of a serializable transaction: ``table`` rows matching ``where`` (an encoded
    predicate; None: every row)."""

    table: str
    where: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table, "where": self.where}

    @classmethod
    def from_dict(cls, d: Any) -> Read:
        if (
            not isinstance(d, dict)
            or not isinstance(d.get("table"), str)
            or not (d.get("where") is None or isinstance(d.get("where"), str))
        ):
            raise InvalidInput(f"a read must be {{'table': str, 'where': str | None}}, not {quote(d)}")
        return cls(d["table"], d.get("where"))


@dataclass(frozen=True)
class Touch:
    """A part that a commit after the reader's snapshot added (``added``) or removed."""

    tid: str
    csn: int
    table: str
    part: str
    partition: tuple[Any, ...]
    stats: Mapping[str, Any] = field(default_factory=dict)
    added: bool = True


@dataclass(frozen=True)
class Shape:
    """What the rule needs of a table: its partition columns and the schema predicates decode on."""

    partition_by: Sequence[str]
    schema: pa.Schema
    # A keys table's primary key: a new version of a key changes that key's row whatever the
    # version's other values are (an overwrite with a non-matching value removes a matching
    # row), so only the key columns' statistics may rule a part out.
    primary_key: Sequence[str] | None = None


def _predicate(read: Read, shape: Shape) -> Any:
    """The decoded predicate; None (every row: the conservative answer) when there is none or it
    no longer decodes against the table's current columns (the table was altered since)."""
    if read.where is None:
        return None
    try:
        return decode_expression(read.where, shape.schema)
    except CorruptMetadata:
        return None


def may_touch(read: Read, touch: Touch, shape: Shape) -> bool:
    """Whether a part a later commit added or removed may hold a row ``read`` returned or could
    have returned (False only when its partition values or statistics rule the predicate out)."""
    if touch.table != read.table:
        return False
    stats = dict(touch.stats)
    if shape.primary_key is not None:
        stats = {c: v for c, v in stats.items() if c in shape.primary_key}
    return may_match(stats, list(shape.partition_by), touch.partition, _predicate(read, shape), shape.schema)


def check_reads(
    tid: str, reads: Iterable[Read], touched: Iterable[Touch], shapes: Mapping[str, Shape]
) -> ConflictError | None:
    """The ConflictError a serializable transaction ``tid`` that wrote something loses with, or
    None: the first (by CSN, then part name) part that a commit after its snapshot added or
    removed and that may match one of its ``reads``. Parts of tables not in ``shapes`` (gone:
    dropped) match every read of them."""
    reads = list(reads)
    for t in sorted(touched, key=lambda t: (t.csn, t.part)):
        if t.tid == tid:
            continue
        for r in reads:
            if r.table != t.table:
                continue
            shape = shapes.get(t.table)
            if shape is not None and not may_touch(r, t, shape):
                continue
            what = "every row" if r.where is None else "a predicate"
            return ConflictError(
                f"transaction {tid} lost to {t.tid} on table {quote(t.table)}: it read {what} of {quote(t.table)} and "
                f"{t.tid} (CSN {t.csn}, after its snapshot) {'added' if t.added else 'removed'} part {t.part} "
                f"in partition {list(t.partition)} that may hold such rows (serializable isolation)",
                winner=t.tid,
                kind=str(ConflictKind.READ_SET_CHANGED),
                table=t.table,
                partition=list(t.partition),
                part=t.part,
                csn=t.csn,
                predicate=r.where,
            )
    return None


def partitions_reached(read: Read, pkeys: Iterable[str], shape: Shape) -> set[str]:
    """Of the partition keys ``pkeys``, those a read's predicate may reach by partition values."""
    where = _predicate(read, shape)
    return {pk for pk in pkeys if may_match({}, list(shape.partition_by), partition_from_key(pk), where, shape.schema)}


def read_keys(reads: Iterable[Read], pkeys: Mapping[str, Iterable[str]], shapes: Mapping[str, Shape]) -> set[str]:
    """Targets a serializable commit checks and bumps for its reads: every read table's node and
    the nodes of its partitions (``pkeys``: every partition known of it) the predicates may
    reach. Tables not in ``shapes`` (dropped) contribute their table node only."""
    keys: set[str] = set()
    for r in reads:
        keys.add(r.table)
        shape = shapes.get(r.table)
        if shape is None:
            continue
        keys.update(target_key(r.table, pk) for pk in partitions_reached(r, pkeys.get(r.table, ()), shape))
    return keys
