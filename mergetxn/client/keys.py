"""A transaction's statements on keys tables: upsert, delete and lock by key, overwrite and update by key."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.core import keytables
from coordinator.core.errors import InvalidInput, quote
from coordinator.core.tabledata import (
    apply_update,
    split_by_partition,
)
from coordinator.model.atomicity import NONE
from coordinator.model.catalog import TableDef
from coordinator.model.records import (
    Insert,
)
from mergetxn.client.base import TransactionBase, named
from mergetxn.client.checks import (
    as_table,
    in_partitions,
    need_keys_table,
    partition_values,
    refuse_outside,
)


class KeysStatements(TransactionBase):
    """Statements of a transaction that write a keys table's versions (a part of :class:`Transaction`)."""

    @named("upsert")
    def upsert(self, table: str, data: pa.Table, update: bool = False) -> int:
        """Write rows by key into a keys table; returns the number of rows. ``update=False``
        (overwrite mode): a row replaces any earlier row with its key, columns absent from
        ``data`` null. ``update=True``: absent columns keep the values they had (a key with no
        row yet gets nulls there); every non-nullable column must be written.

        Raises:
            InvalidInput: not a keys table, or rows without their keys or of the wrong types.
            TransactionAborted: the transaction has ended.
        """
        self._check_open()
        tdef = need_keys_table(self.table(table), "upsert")
        if update:
            return self._write_update(tdef, as_table(data, tdef.name))
        return self._write_versions(tdef, data, keytables.PUT)

    @named("delete_keys")
    def delete_keys(self, table: str, keys_: pa.Table) -> int:
        """Delete the rows of a keys table with these keys (a pyarrow.Table of the key columns;
        keys without a row are fine); returns the number of keys given.

        Raises:
            InvalidInput: not a keys table, or ``keys_`` is not a table of its key columns.
            TransactionAborted: the transaction has ended.
        """
        self._check_open()
        tdef = need_keys_table(self.table(table), "delete_keys")
        return self._write_versions(tdef, keys_, keytables.DELETE)

    @named("lock_keys")
    def lock_keys(self, table: str, keys_: pa.Table, mode: str = "shared_strong") -> int:
        """Read-lock keys of a keys table (a pyarrow.Table of the key columns) until the commit:
        it then fails with ConflictError if a transaction that committed after this one's
        snapshot wrote one of them. ``"shared_strong"`` also makes a transaction that writes
        one of them and commits after this one, from an older snapshot, fail;
        ``"shared_weak"`` leaves nothing behind. Read locks never conflict with each other.
        Returns the number of keys given.

        Raises:
            InvalidInput: not a keys table, an unknown ``mode``, or wrong keys.
            TransactionAborted: the transaction has ended.
        """
        self._check_open()
        tdef = need_keys_table(self.table(table), "lock_keys")
        if self._atomicity == NONE:
            raise InvalidInput(
                f"lock_keys on {quote(table)}: transaction {self.id} was begun with atomicity='none', "
                "which takes no locks (its commits never conflict); lock keys in a transaction begun "
                "with atomicity='full' on a table whose atomicity is 'full'",
                table=table,
                id=self.id,
            )
        if mode not in keytables.LOCK_MODES:
            raise InvalidInput(
                f"lock_keys mode must be one of {sorted(keytables.LOCK_MODES)}, not {quote(mode)}", table=table
            )
        return self._write_versions(tdef, keys_, keytables.LOCK_MODES[mode])

    def _write_versions(self, tdef: TableDef, data: Any, op: int) -> int:
        return self._stage_versions(
            tdef, keytables.versions(tdef.schema, tdef.primary_key, tdef.name, as_table(data, tdef.name), op, 1)
        )

    def _write_update(self, tdef: TableDef, data: pa.Table, written: Sequence[str] | None = None) -> int:
        """Update-mode versions of ``data`` (``written``: the columns it writes, when it holds
        others), written whole: each column they do not write holds its key's value at this
        transaction's snapshot with its own writes (null where the key has no row), so a read
        by deletion vectors takes the row as it is. Their ``_cols`` still names the columns
        written: the conflict rules take those columns' lock groups, and the fold applies
        only them (what the replica checks before it takes such a row as whole)."""
        versions = keytables.versions(tdef.schema, tdef.primary_key, tdef.name, data, keytables.UPDATE, 1, written)
        wrote = set(keytables.written_columns(versions))
        absent = [c for c in tdef.schema.names if c not in tdef.primary_key and c not in wrote]
        if absent and versions.num_rows:
            current = self._current(tdef, versions.select(list(tdef.primary_key)), absent)
            versions = keytables.fill_columns(versions, current, tdef.primary_key, absent)
        return self._stage_versions(tdef, versions)

    def _stage_versions(self, tdef: TableDef, versions: pa.Table) -> int:
        """Number ``versions`` after this transaction's earlier ones (``_seq``: later writes win)
        and stage them as parts; returns how many."""
        n = versions.num_rows
        i = versions.schema.get_field_index(keytables.SEQ)
        versions = versions.set_column(
            i, versions.schema.field(i), pa.array(range(self._seq + 1, self._seq + 1 + n), pa.int64())
        )
        self._seq += n
        parts = self._write(tdef, versions)
        if parts:
            self._stage(Insert(tdef.name, tuple(parts)))
        return versions.num_rows

    def _overwrite_keys(self, tdef: TableDef, data: Any, partitions: Sequence[Any] | None) -> int:
        """INSERT OVERWRITE of a keys table: every key the target partitions hold at this
        transaction's snapshot (with its own writes) is deleted, then ``data`` written in
        overwrite mode; a key in both ends with the new row."""
        data = as_table(data, tdef.name)
        versions = keytables.versions(
            tdef.schema, tdef.primary_key, tdef.name, data, keytables.PUT, 1
        )  # its problems first
        present = [p for p, _ in split_by_partition(data.select(list(tdef.partition_by)), list(tdef.partition_by))]
        targets: list[tuple] | None
        if partitions is not None:
            targets = partition_values(tdef, partitions)
            refuse_outside(tdef.name, present, targets)
        else:
            targets = present if tdef.partition_by else None
        self._delete_all_keys(tdef, targets)
        return self._stage_versions(tdef, versions)

    def _delete_all_keys(self, tdef: TableDef, targets: list[tuple] | None) -> int:
        """Delete every key of ``targets`` (partitions; None: the whole table) that a read here
        returns; the read is part of a serializable transaction's read set."""
        if targets == []:
            return 0
        where = None if targets is None else in_partitions(tdef, targets)
        self._record_read(tdef, where)
        metas, csns, vectors = self._visible_whole(tdef.name)
        live = self._rows(tdef, metas, csns, list(tdef.primary_key), where, vectors)
        return self._write_versions(tdef, live, keytables.DELETE) if live.num_rows else 0

    def _update_keys(self, tdef: TableDef, where: pc.Expression, assigns: dict[str, pc.Expression]) -> int:
        """UPDATE of a keys table: the rows matching at this transaction's snapshot (with its own
        writes) get update-mode versions of the assigned columns (so only their lock groups are
        taken)."""
        fixed = [c for c in assigns if c in tdef.primary_key]
        if fixed:
            raise InvalidInput(
                f"update of keys table {quote(tdef.name)} cannot set primary key column(s) {fixed} "
                "(delete the row and insert it under the new key)",
                table=tdef.name,
            )
        matched = self.read(tdef.name, where=where)  # recorded in the read set
        if not matched.num_rows:
            return 0
        updated, _ = apply_update(matched, where, assigns)
        return self._write_update(tdef, updated, written=list(assigns))
