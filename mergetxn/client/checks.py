"""Argument and data checks that the client's modules share."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.core.conflicts import Policy
from coordinator.core.errors import InvalidInput, quote
from coordinator.core.tabledata import (
    json_scalar,
)
from coordinator.model.catalog import TableDef


def need_keys_table(tdef: TableDef, what: str) -> TableDef:
    if tdef.conflict_policy is not Policy.KEYS:
        raise InvalidInput(
            f"{what} needs a keys table; {quote(tdef.name)} has conflict_policy {quote(tdef.conflict_policy.value)}",
            table=tdef.name,
        )
    return tdef


def as_table(data: Any, table: str) -> pa.Table:
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if not isinstance(data, pa.Table):
        raise InvalidInput(f"data for {quote(table)} must be a pyarrow.Table, not {type(data).__name__}")
    return data


def in_partitions(tdef: TableDef, targets: Sequence[tuple]) -> pc.Expression:
    """A filter matching the rows of the partitions ``targets`` (values of ``partition_by``)."""
    expr = None
    for values in targets:
        term = None
        for col, v in zip(tdef.partition_by, values):
            eq = pc.field(col) == pa.scalar(v, tdef.schema.field(col).type)
            term = eq if term is None else term & eq
        expr = term if expr is None else expr | term
    return expr if expr is not None else pc.scalar(True)


def partition_values(tdef: TableDef, partitions: Sequence[Any]) -> list[tuple]:
    if not tdef.partition_by:
        raise InvalidInput(f"table {quote(tdef.name)} is not partitioned; partitions must be None")
    if isinstance(partitions, (str, bytes)) or not isinstance(partitions, Sequence):
        raise InvalidInput(f"partitions must be a list of partition values, not {quote(partitions)}")
    out = []
    for p in partitions:
        values = tuple(p) if isinstance(p, (tuple, list)) else (p,)
        if len(values) != len(tdef.partition_by):
            raise InvalidInput(f"partition {quote(p)} does not match partition columns {list(tdef.partition_by)}")
        for col, v in zip(tdef.partition_by, values):
            check_partition_value(tdef, col, v)
        out.append(tuple(json_scalar(v) for v in values))
    return out


def check_partition_value(tdef: TableDef, column: str, value: Any) -> None:
    """A partition value given by the caller (truncate, overwrite, compact ``partitions=``) must
    be of its column's type: a value of another type names no partition, and the statement would
    silently do nothing."""
    if value is None:
        return
    t = tdef.schema.field(column).type
    if pa.types.is_boolean(t):
        ok = isinstance(value, bool)
    elif pa.types.is_integer(t):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        ok = isinstance(value, str)
    elif pa.types.is_date(t):
        ok = isinstance(value, dt.date) and not isinstance(value, dt.datetime)
        if isinstance(value, str):
            try:
                dt.date.fromisoformat(value)
                ok = True
            except ValueError:
                ok = False
    else:
        ok = True
    if not ok:
        raise InvalidInput(
            f"partition value {quote(value)} ({type(value).__name__}) does not match partition column "
            f"{quote(column)} of table {quote(tdef.name)}, which is {t}",
            table=tdef.name,
            column=column,
            value=repr(value),
        )


def timestamp_of(when: Any, what: str) -> float:
    if not isinstance(when, dt.datetime) or when.tzinfo is None or when.utcoffset() is None:
        raise InvalidInput(f"{what} must be a timezone-aware datetime, not {quote(when)}")
    return when.timestamp()


def refuse_outside(table: str, present: Sequence[tuple], targets: Sequence[tuple]) -> None:
    """An overwrite's rows must lie in the partitions it names: InvalidInput naming the others."""
    outside = [p for p in present if p not in targets]
    if outside:
        raise InvalidInput(
            f"overwrite of {quote(table)}: data has rows in partition(s) {quote(outside)} "
            f"outside the partitions given {targets}"
        )
