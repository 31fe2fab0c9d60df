"""Schemas between the table (Arrow) and Spark: the table's schema as Spark sees it, Spark's as
Arrow's, a DataFrame's columns checked against the table before a write, and rows fitted to what
Spark asked for. pyspark is imported only where a function needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from coordinator.core.errors import InvalidInput
from coordinator.core.tabledata import conform
from coordinator.model.catalog import TableDef

if TYPE_CHECKING:
    from pyspark.sql.types import StructType


def spark_schema(schema: pa.Schema) -> StructType:
    """The table's schema as Spark sees it; nullability kept, naive timestamps as TIMESTAMP_NTZ."""
    from pyspark.sql.pandas.types import from_arrow_schema

    try:
        return from_arrow_schema(schema, prefer_timestamp_ntz=True)
    except (TypeError, NotImplementedError, Exception) as exc:  # pyspark raises its own types
        raise InvalidInput(f"mergetxn: a column type of {schema} has no Spark equivalent: {exc}") from None


def arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timestamp_utc=True)


def check_write_schema(tdef: TableDef, schema: StructType) -> None:
    """Fail the job before any task runs when the DataFrame's columns do not fit the table
    (missing, unexpected, or a type that would lose values), naming every such column."""
    try:
        incoming = arrow_schema(schema)
    except Exception as exc:
        raise InvalidInput(f"mergetxn: write to {tdef.name!r}: a column type has no Arrow equivalent: {exc}") from None
    empty = pa.Table.from_batches([], schema=pa.schema([f.with_nullable(True) for f in incoming]))
    empty = align_time_zones(empty, tdef.schema)
    try:
        conform(tdef.schema, empty, tdef.name, what="mergetxn: schema mismatch writing to", required=tdef.partition_by)
    except InvalidInput as exc:
        raise InvalidInput(
            f"{exc.message} (table columns: {[f'{f.name} {f.type}' for f in tdef.schema]})", table=tdef.name
        ) from None


def align_time_zones(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """Spark labels zoned timestamps with its session time zone (e.g. ``Etc/UTC``); the instants
    are the same in any zone, so relabel them with the table's zone before conforming."""
    for i, name in enumerate(data.column_names):
        t = data.schema.field(i).type
        idx = schema.get_field_index(name)
        if idx < 0 or not pa.types.is_timestamp(t) or t.tz is None:
            continue
        want = schema.field(idx).type
        if pa.types.is_timestamp(want) and want.tz is not None and want.tz != t.tz:
            data = data.set_column(i, name, data.column(i).cast(pa.timestamp(t.unit, tz=want.tz)))
    return data


def fit(data: pa.Table, target: pa.Schema) -> pa.Table:
    """The columns Spark asked for, in its order and Arrow types."""
    if data.schema.equals(target, check_metadata=False):
        return data
    missing = [f.name for f in target if f.name not in data.column_names]
    if missing:
        raise InvalidInput(f"mergetxn: the table has no column(s) {missing}")
    cols = []
    for f in target:
        col = data.column(f.name)
        if not col.type.equals(f.type):
            col = col.cast(f.type)
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=pa.schema([f.with_nullable(True) for f in target]))
