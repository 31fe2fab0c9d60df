"""A snapshot's parts as a ``pyarrow.dataset.Dataset``, so that DuckDB, Polars and anything else
that scans Arrow datasets reads them with its own filter pushdown.

Each part is one Parquet fragment of the table's schema (as defined at the snapshot) whose
partition expression is the part's partition values: a filter on a partition column skips whole
parts before a byte is read, and the footers' row-group statistics skip row groups inside the
rest. Every part file holds its partition columns itself, so a row reads the same
whether its value comes from the file or from the expression. A part written before a column was
added lacks it: the dataset's schema makes it null, as ``client.read`` does. A part written before
a column was *renamed* cannot be read by name from its file; those few are read and upgraded in
memory (:meth:`TableDef.upgrade`) and joined to the file fragments as one in-memory child.

Before the dataset is handed out each file's size is compared with what the commit recorded: a
truncated, replaced or missing file is ``CorruptPart`` naming it, not a wrong answer later inside
an engine. Footers are left to the scan, which reads only those of the parts a filter keeps (a
file the same size as its part but unreadable fails there, in the engine's words). Checksums are
not verified (that would read every byte twice); ``client.check`` does that.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from coordinator.catalog import TableDef
from coordinator.errors import CorruptPart, quote
from parts.meta import PartMeta
from parts.rewrite import read_parts
from parts.storage import Storage

SIZE_THREADS = 16  # object store sizes asked at once (latency-bound)


def partition_expression(tdef: TableDef, partition: Sequence[Any]) -> pc.Expression:
    """What every row of a part of ``partition`` satisfies: ``col == value`` per partition column
    (``is_null`` for a null value), typed as the column is; ``True`` when unpartitioned."""
    expr = pc.scalar(True)
    for column, value in zip(tdef.partition_by, partition):
        typ = tdef.schema.field(column).type
        term = pc.field(column).is_null() if value is None else pc.field(column) == _typed(value, typ)
        expr = term if expr.equals(pc.scalar(True)) else expr & term
    return expr


def _typed(value: Any, typ: pa.DataType) -> pa.Scalar:
    """A partition value as stored in a part's metadata (JSON: dates as ISO text) as a scalar of
    the column's type."""
    if pa.types.is_date(typ) and isinstance(value, str):
        value = dt.date.fromisoformat(value)
    return pa.scalar(value, typ)


def _renamed_since(tdef: TableDef, meta: PartMeta) -> bool:
    """Whether the part's file names a column otherwise than ``tdef`` does (a rename since it
    was written); columns added since are merely absent, which the dataset schema fills."""
    return any(old is not None and old != now for now, old in zip(tdef.schema.names, tdef.names_at(meta.schema_version)))


def snapshot_dataset(storage: Storage, tdef: TableDef, metas: Sequence[PartMeta]) -> ds.Dataset:
    """The rows of ``metas`` (the parts visible at one snapshot, of table ``tdef``) as a dataset
    of ``tdef.schema``: a ``FileSystemDataset`` of one fragment per part, or a ``UnionDataset`` of
    it and the upgraded rows of parts written before a rename."""
    filesystem = storage.arrow_filesystem()
    fmt = ds.ParquetFileFormat()
    by_file = [m for m in metas if not _renamed_since(tdef, m)]
    fragments = [
        fmt.make_fragment(storage.arrow_path(m.path), filesystem, file_size=m.size,
                          partition_expression=partition_expression(tdef, m.partition))
        for m in by_file
    ]
    _check_sizes(storage, by_file)
    files = ds.FileSystemDataset(fragments, tdef.schema, fmt, filesystem)
    upgraded = [m for m in metas if _renamed_since(tdef, m)]
    if not upgraded:
        return files
    rows = ds.dataset(pa.concat_tables(read_parts(storage, upgraded, table=tdef)))
    return ds.dataset([files, rows])


def table_dataset(tdef: TableDef, data: pa.Table) -> ds.Dataset:
    """Rows already in memory (a keys table's fold: one row per key) as a dataset of the table."""
    return ds.dataset(data.cast(tdef.schema) if data.schema != tdef.schema else data)


def _check_sizes(storage: Storage, metas: Sequence[PartMeta]) -> None:
    """Each part's file is there with the size its commit recorded; ``CorruptPart`` names the
    first that is not (a stat each; on an object store, several at once)."""
    def check(meta: PartMeta) -> None:
        try:
            size = storage.size(meta.path)
        except FileNotFoundError:
            raise CorruptPart(f"part {quote(meta.path)} is missing from {storage}", path=meta.path) from None
        if size != meta.size:
            raise CorruptPart(f"part {quote(meta.path)} has {size} bytes, {meta.size} were written "
                              "(truncated or replaced)", path=meta.path)

    if storage.is_local or len(metas) <= 1:
        for meta in metas:
            check(meta)
        return
    with ThreadPoolExecutor(max_workers=min(SIZE_THREADS, len(metas))) as pool:
        list(pool.map(check, metas))
