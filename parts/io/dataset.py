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

DuckDB scanning an Arrow dataset lets pyarrow decode the pages and then converts the arrays,
about twice the CPU of its own Parquet reader (benchmarks/dataset_read.py, docs/benchmarks.md). :func:`duckdb_view` gives
DuckDB the files themselves where that reads the same rows: a dataset of local parts that all
hold every column.

Before the dataset is handed out each file's size is compared with what the commit recorded: a
truncated, replaced or missing file is ``CorruptPart`` naming it, not a wrong answer later inside
an engine. Footers are left to the scan, which reads only those of the parts a filter keeps (a
file the same size as its part but unreadable fails there, in the engine's words). Checksums are
not verified (that would read every byte twice); ``client.check`` does that.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from coordinator.core.errors import CorruptPart, InvalidInput, quote
from coordinator.model.catalog import TableDef
from parts.io.rewrite import joined, read_parts
from parts.io.storage import Storage
from parts.model.meta import PartMeta

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


WHOLE, LACKING, RENAMED = "whole", "lacking", "renamed"  # a part's file against the definition


def _shape(tdef: TableDef, meta: PartMeta) -> str:
    """How the part's file stands to ``tdef``: every column under its name now (``WHOLE``),
    some column added since and absent (``LACKING``: the dataset schema fills null), or some
    column renamed since (``RENAMED``: only an upgrade in memory reads it by its new name)."""
    before = tdef.names_at(meta.schema_version)
    if any(old is not None and old != now for now, old in zip(tdef.schema.names, before)):
        return RENAMED
    return LACKING if any(old is None for old in before) else WHOLE


def snapshot_dataset(storage: Storage, tdef: TableDef, metas: Sequence[PartMeta], cached: bool = False) -> ds.Dataset:
    """The rows of ``metas`` (the parts visible at one snapshot, of table ``tdef``) as a dataset
    of ``tdef.schema``: a ``FileSystemDataset`` of one fragment per part; when some parts predate
    an ``alter_table``, a ``UnionDataset`` of the parts holding every column, those lacking a
    column added since (each a fragment too), and the upgraded rows of those written before a
    rename (in memory). Inlined parts (docs/architecture/small-writes.md: their Parquet bytes in
    their metadata) are decoded, checked and upgraded into one more in-memory child (``cached``:
    decoded once per process, :func:`parts.io.rewrite.read_parts`), their rows in few chunks."""
    filesystem = storage.arrow_filesystem()
    fmt = ds.ParquetFileFormat()
    shapes: dict[str, list[PartMeta]] = {WHOLE: [], LACKING: [], RENAMED: []}
    inlined = [m for m in metas if m.inlined]
    for m in metas:
        if not m.inlined:
            shapes[_shape(tdef, m)].append(m)
    _check_sizes(storage, shapes[WHOLE] + shapes[LACKING])

    def files(group: list[PartMeta]) -> ds.FileSystemDataset:
        fragments = [
            fmt.make_fragment(
                storage.arrow_path(m.path),
                filesystem,
                file_size=m.size,
                partition_expression=partition_expression(tdef, m.partition),
            )
            for m in group
        ]
        return ds.FileSystemDataset(fragments, tdef.schema, fmt, filesystem)

    children: list[ds.Dataset] = [files(shapes[kind]) for kind in (WHOLE, LACKING) if shapes[kind]]
    if shapes[RENAMED]:
        children.append(ds.dataset(pa.concat_tables(read_parts(storage, shapes[RENAMED], table=tdef))))
    if inlined:  # their bytes are in their metadata: decoded (and checked) here, one child in memory
        children.append(
            table_dataset(tdef, joined(inlined, read_parts(storage, inlined, table=tdef, cached=cached), tdef.schema))
        )
    if len(children) <= 1:
        return children[0] if children else files([])
    return ds.dataset(children)


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
            raise CorruptPart(
                f"part {quote(meta.path)} has {size} bytes, {meta.size} were written (truncated or replaced)",
                path=meta.path,
            )

    if storage.is_local or len(metas) <= 1:
        for meta in metas:
            check(meta)
        return
    with ThreadPoolExecutor(max_workers=min(SIZE_THREADS, len(metas))) as pool:
        list(pool.map(check, metas))


def duckdb_view(con: Any, name: str, dataset: ds.Dataset) -> None:
    """Make ``name`` a temporary view of ``dataset`` (from ``client.dataset``) on the DuckDB
    connection ``con``: DuckDB's own Parquet reader over the part files, their columns cast to
    the types ``con.register`` would give, when every fragment is a local file holding every
    column (one ``FileSystemDataset``); otherwise the dataset registered (Arrow). Same rows,
    types and pruning either way. Like the dataset, use it inside the block that holds it."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise InvalidInput(f"view name must be a non-empty string, not {quote(name)}")
    if not (
        isinstance(dataset, ds.FileSystemDataset)
        and isinstance(dataset.filesystem, pafs.LocalFileSystem)
        and dataset.files
    ):
        con.register(name, dataset)
        return
    probe = f"__mergetxn_schema_{uuid.uuid4().hex}"
    con.register(probe, dataset.schema.empty_table())
    try:
        types = {row[0]: row[1] for row in con.execute(f"DESCRIBE {_ident(probe)}").fetchall()}
    finally:
        con.unregister(probe)
    columns = ", ".join(f"CAST({_ident(c)} AS {types[c]}) AS {_ident(c)}" for c in dataset.schema.names)
    files = ", ".join(_literal(f) for f in dataset.files)
    con.execute(f"CREATE OR REPLACE TEMP VIEW {_ident(name)} AS SELECT {columns} FROM read_parquet([{files}])")


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
