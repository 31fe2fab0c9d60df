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
DuckDB the local part files themselves (a column their files lack read as null) and registers
only the rows a dataset holds in memory beside them.

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
    an ``alter_table``, a ``UnionDataset`` of the parts holding every column and, one child per
    set of columns their files hold, those lacking a column added since (each a fragment too:
    the dataset schema fills null), and the upgraded rows of those written before a rename (in
    memory). Every file of one child holds the same columns, which :func:`duckdb_view` relies on.
    Inlined parts (docs/architecture/small-writes.md: their Parquet bytes in their metadata) are
    decoded, checked and upgraded into one more in-memory child (``cached``: decoded once per
    process, :func:`parts.io.rewrite.read_parts`), their rows in few chunks."""
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

    lacking: dict[tuple, list[PartMeta]] = {}
    for m in shapes[LACKING]:
        lacking.setdefault(tuple(tdef.names_at(m.schema_version)), []).append(m)
    groups = ([shapes[WHOLE]] if shapes[WHOLE] else []) + list(lacking.values())
    children: list[ds.Dataset] = [files(group) for group in groups]
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
    connection ``con``: DuckDB's own Parquet reader over the part files that are local, their
    columns cast to the types ``con.register`` would give (a column their files lack, added
    since, null), and the rows a dataset holds in memory (a keys table's parts with deleted rows,
    inlined small writes, parts written before a rename) registered beside them, as one
    ``UNION ALL``; a dataset with no local file is registered whole (Arrow). Same rows, types
    and pruning either way. Like the dataset, use it inside the block that holds it."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise InvalidInput(f"view name must be a non-empty string, not {quote(name)}")
    branches = [b for b in _branches(dataset) if not isinstance(b, ds.FileSystemDataset) or b.files]
    files = [b for b in branches if isinstance(b, ds.FileSystemDataset)]
    if not files or not all(_local_parquet(b) for b in files):
        con.register(name, dataset)
        return
    types = _duckdb_types(con, dataset.schema)
    selects = []
    for i, branch in enumerate(branches):
        if isinstance(branch, ds.FileSystemDataset):
            selects.append(_files_select(con, branch, types))
            continue
        held = f"__mergetxn_{name}_rows_{i}"  # replaced, not piled up, when the view is made again
        con.register(held, branch)
        selects.append(f"SELECT {_casts(types, set(types))} FROM {_ident(held)}")
    con.execute(f"CREATE OR REPLACE TEMP VIEW {_ident(name)} AS {' UNION ALL '.join(selects)}")


def _branches(dataset: ds.Dataset) -> list[ds.Dataset]:
    """The datasets that hold ``dataset``'s rows: its children, theirs, ..., or itself."""
    if isinstance(dataset, ds.UnionDataset):
        return [b for child in dataset.children for b in _branches(child)]
    return [dataset]


def _local_parquet(files: ds.FileSystemDataset) -> bool:
    return isinstance(files.filesystem, pafs.LocalFileSystem) and isinstance(files.format, ds.ParquetFileFormat)


def _duckdb_types(con: Any, schema: pa.Schema) -> dict[str, str]:
    """Each column's DuckDB type as ``con.register`` gives it, in the schema's order."""
    probe = f"__mergetxn_schema_{uuid.uuid4().hex}"
    con.register(probe, schema.empty_table())
    try:
        return {row[0]: row[1] for row in con.execute(f"DESCRIBE {_ident(probe)}").fetchall()}
    finally:
        con.unregister(probe)


def _files_select(con: Any, files: ds.FileSystemDataset, types: dict[str, str]) -> str:
    """A ``SELECT`` of the columns ``types`` names from DuckDB's reader over ``files``, whose
    every file holds the same columns (:func:`snapshot_dataset` groups them so): those its first
    file holds, the rest null."""
    held = {
        row[0] for row in con.execute(f"DESCRIBE SELECT * FROM read_parquet({_literal(files.files[0])})").fetchall()
    }
    paths = ", ".join(_literal(f) for f in files.files)
    return f"SELECT {_casts(types, held)} FROM read_parquet([{paths}])"


def _casts(types: dict[str, str], held: set[str]) -> str:
    return ", ".join(f"CAST({_ident(c) if c in held else 'NULL'} AS {typ}) AS {_ident(c)}" for c, typ in types.items())


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
