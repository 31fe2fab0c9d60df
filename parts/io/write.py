"""The one road from a table's data to written parts (docs/architecture/tables.md).

Every writer goes through :func:`write_data`: ``Client.insert``, ``Transaction.insert``,
``overwrite``, ``upsert`` and the other keys-table statements, restore (through
``Transaction.insert``), rewrites of parts by DELETE/UPDATE, and Spark's Python writer. It
conforms rows to the table's schema (an absent nullable column filled with nulls), splits them by
partition (a partition value over the replica's bound refused before any file is written),
writes each partition's rows as one part (or, a small insert's, inlines it: its Parquet bytes in
its metadata, no file; docs/architecture/small-writes.md) and, on a keys table, records the part's key summary.
Merges and compactions write the one part a group of stored parts folds into
(parts/io/rewrite.py): their rows are already the table's, of one known partition.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from coordinator.core.conflicts import Policy
from coordinator.core.tabledata import conform, split_by_partition
from coordinator.model.catalog import TableDef
from parts.io.format import write_part
from parts.io.storage import Storage
from parts.model.meta import PartMeta


def write_data(
    storage: Storage,
    tdef: TableDef,
    data: pa.Table,
    tid: str,
    *,
    what: str = "insert into",
    limit: int | None = None,
    sidecar: bool = True,
    before_write: Callable[[list[tuple]], None] | None = None,
    inline: tuple[int, int] | None = None,
) -> list[PartMeta]:
    """Write ``data`` into ``tdef``'s table as parts named after ``tid``; return their metadata
    (no part for no rows), in the order of each partition's first row.

    On a table of another policy ``data`` is rows, conformed here to the table's columns, order
    and types (InvalidInput naming every wrong column, prefixed by ``what`` and the table; the
    partition columns must be present). On a keys table ``data`` is already its versions (made by
    ``coordinator.core.keytables.versions``, which checks the rows), and each part carries its key
    summary. ``limit``: the replica's bound on a partition value in bytes (None: unchecked).
    ``sidecar=False``: no sidecar files (a writer that commits the parts in the same call).
    ``before_write``: called with the partitions present after the checks and before any file
    is written (an overwrite checks them against the partitions it replaces); what it raises
    leaves nothing written. ``inline``: ``(rows, bytes)`` (``TableDef.inline_limits``): a
    partition's part of at most that many rows whose Parquet is at most that many bytes is
    inlined (its bytes in its metadata, no file; docs/architecture/small-writes.md); never on a
    keys table (its parts' writing changes with deletion vectors)."""
    keys = tdef.conflict_policy is Policy.KEYS
    inline = None if keys or inline is None or min(inline) <= 0 else inline
    if not keys:
        data = conform(tdef.schema, data, tdef.name, what=what, required=tdef.partition_by)
    split = split_by_partition(data, list(tdef.partition_by), limit, tdef.name)
    if before_write is not None:
        before_write([partition for partition, _ in split])
    return [
        write_part(
            storage,
            tdef.name,
            list(tdef.partition_by),
            partition,
            chunk,
            tid,
            tdef.ddl_version,
            primary_key=tdef.primary_key if keys else (),
            sidecar=sidecar,
            inline=inline,
        )
        for partition, chunk in split
    ]
