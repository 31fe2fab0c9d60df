"""The client's tables: create, describe, alter and drop them, and the definitions a transaction sees."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from coordinator.core import errors
from coordinator.core.errors import InvalidInput, ReplicaUnavailable, quote
from coordinator.core.tabledata import (
    schema_to_json,
)
from coordinator.model.catalog import TableDef, check_option
from coordinator.model.records import (
    DropTable,
)
from mergetxn.client.base import ClientBase, StillCommitting, TransactionBase, named
from mergetxn.client.checks import (
    timestamp_of,
)

_UNCHANGED = object()  # alter_table: a setting not given stays as it is


_CREATE_FIELDS = frozenset(
    {
        "name",
        "schema",
        "partition_by",
        "primary_key",
        "conflict_policy",
        "auto_merge",
        "lock_groups",
        "atomicity",
        "txn_max_seconds",
        "txn_max_rows",
        "retention_seconds",
        "parts_to_delay_insert",
        "parts_to_throw_insert",
        "inline_rows",
        "inline_bytes",
    }
)


class Tables(ClientBase):
    """The client's table definitions and DDL (a part of :class:`mergetxn.client.client.Client`)."""

    # -- tables ------------------------------------------------------------------------------
    def create_table(
        self,
        name: str,
        schema: pa.Schema,
        partition_by: Sequence[str] = (),
        primary_key: Sequence[str] = (),
        conflict_policy: str = "parts",
        auto_merge: bool = True,
        lock_groups: Mapping[str, Sequence[str]] | None = None,
        atomicity: str = "full",
        txn_max_seconds: float | None = None,
        txn_max_rows: int | None = None,
        retention_seconds: float | None = None,
        parts_to_delay_insert: int | None = None,
        parts_to_throw_insert: int | None = None,
        inline_rows: int | None = None,
        inline_bytes: int | None = None,
    ) -> int:
        """Create a table; returns the CSN at which it exists. If the connection breaks before
        the answer, the replica is asked whether the table exists as asked (and the creation
        sent again if it does not), so the caller is never left not knowing.
        ``conflict_policy="keys"`` (with ``primary_key``, ``lock_groups``, ``atomicity``): a
        keys table (docs/rules.md#keys-tables, coordinator/core/keytables.py). ``txn_max_seconds`` and
        ``txn_max_rows``: limits for the transactions writing this table (the smallest among the
        tables a transaction wrote and the replica's binds it); a keys table defaults to 60 s and
        100,000 rows, others to none (only the replica-wide limits). ``retention_seconds``: how
        long snapshots and ``changes`` of this table stay readable after a commit replaced what
        they saw (docs/rules.md#history-retention; None: the replica-wide default, 3600 s).
        ``parts_to_delay_insert`` and ``parts_to_throw_insert``: an insert into a partition holding
        that many visible parts is delayed, or refused with TooManyParts (docs/rules.md#too-many-parts;
        None: the replica-wide settings of the same names, 150 and 300; 0: never).
        ``inline_rows``, ``inline_bytes``: smaller inserts go in the log entry, no file (small-writes.md).

        Raises:
            InvalidInput: a bad name, schema, key, partitioning, policy or setting, or the table exists.
        """
        tdef = TableDef.new(
            name,
            schema,
            partition_by,
            primary_key,
            conflict_policy,
            auto_merge,
            lock_groups,
            atomicity,
            txn_max_seconds,
            txn_max_rows,
            retention_seconds,
            parts_to_delay_insert,
            parts_to_throw_insert,
            inline_rows,
            inline_bytes,
        )
        args = {k: v for k, v in tdef.to_dict().items() if k in _CREATE_FIELDS}  # what a CREATE says
        self._tables.pop(name, None)  # a table of this name dropped before: its definition goes
        try:
            return self.call("create_table", **args)["csn"]
        except ReplicaUnavailable:
            pass  # looked up outside the handler: what that raises does not chain to the break
        return self._created_after_break(tdef, args)

    def _created_after_break(self, tdef: TableDef, args: dict[str, Any]) -> int:
        """After a connection broke before ``create_table``'s answer: look the table up (sending
        the creation again while it does not exist) until it is decided; its created CSN, or
        InvalidInput if a table of that name exists with another definition."""

        def look_up() -> TableDef | int:
            try:
                return TableDef.from_dict(self.call("table", name=tdef.name))
            except errors.TableNotFound:
                try:  # never created (or still on its way): ask again; a twin is refused
                    return self.call("create_table", **args)["csn"]
                except InvalidInput as exc:
                    if "already exists" not in exc.message:
                        raise
                    raise StillCommitting(f"the creation of table {quote(tdef.name)}") from None  # look again

        found = self._wait_decided(look_up)
        if isinstance(found, int):
            return found
        if not found.same_definition(tdef):
            raise InvalidInput(f"table {quote(tdef.name)} already exists with another definition", table=tdef.name)
        return found.created_csn

    def table(self, name: str) -> TableDef:
        """The table's definition as this client last looked it up (the latest then).

        Raises:
            TableNotFound: no such table.
        """
        if name not in self._tables:
            return self._table_at(name, None, None)
        return self._tables[name][0]

    def table_at(self, name: str, snapshot: int | None = None, as_of: dt.datetime | float | None = None) -> TableDef:
        """The table's definition at ``snapshot`` (a CSN) or ``as_of`` (a time), else the latest
        now (asked, not cached): the schema that a read there returns.

        Raises:
            TableNotFound: no such table then.
            SnapshotUnavailable: that snapshot is not retained.
        """
        if as_of is not None:
            when = as_of if isinstance(as_of, float | int) else timestamp_of(as_of, "as_of")
            d = self.call("table", name=name, as_of=when)
            return TableDef.from_dict(d)
        return self._table_at(name, snapshot, None)

    def describe_table(self, name: str, snapshot: int | None = None) -> dict:
        """The table at ``snapshot`` (the latest by default): ``schema`` (a pyarrow.Schema),
        ``partition_by``, ``primary_key``, ``conflict_policy``, ``auto_merge``, ``created_csn``,
        ``schema_version`` and ``version_csn`` (the CSN of its last ALTER, 0 if none), what it
        holds (``parts``, ``rows``, ``bytes``, ``partitions``), its ``history`` (created,
        altered: CSN each), and the ``retention_seconds``, ``parts_to_delay_insert`` and
        ``parts_to_throw_insert`` in force (its own, else the replica's).

        Raises:
            TableNotFound: no such table at that snapshot.
            SnapshotUnavailable: that snapshot is not retained.
        """
        d = self.call("describe_table", name=name, **({} if snapshot is None else {"snapshot": snapshot}))
        d["schema"] = TableDef.from_dict(d).schema
        d["partition_by"], d["primary_key"] = tuple(d["partition_by"]), tuple(d["primary_key"])
        d.setdefault("version_csn", 0)
        d.setdefault("ddl_version", 0)
        d.pop("changes", None)
        return d

    def drop_table(self, name: str) -> int:
        """DROP TABLE as a transaction of its own; returns its CSN. Reads at older snapshots still
        see the table (while retained); its files are collected by cleanup once no snapshot in
        use sees them; a table of the same name may be created afterwards.

        Raises:
            TableNotFound: no such table.
            ConflictError: a transaction writing the table committed first.
        """
        with self.transaction() as tx:
            tx.drop_table(name)
        assert tx.csn is not None
        self._tables.pop(name, None)
        return tx.csn

    def alter_table(
        self,
        name: str,
        add_columns: pa.Schema | Sequence[pa.Field] | None = None,
        rename_columns: Mapping[str, str] | None = None,
        retention_seconds: float | None | object = _UNCHANGED,
        parts_to_delay_insert: int | None | object = _UNCHANGED,
        parts_to_throw_insert: int | None | object = _UNCHANGED,
        inline_rows: int | None | object = _UNCHANGED,
        inline_bytes: int | None | object = _UNCHANGED,
    ) -> int:
        """ALTER TABLE: add nullable columns (rows written before read them as null), rename
        columns ({old: new}; rows written before read under the new names) and change the
        table's ``retention_seconds``, ``parts_to_delay_insert``, ``parts_to_throw_insert``,
        ``inline_rows`` and ``inline_bytes`` (None: back to the replica-wide default). Returns the CSN from which the new definition
        holds. Partition and key columns cannot be renamed; a bad alter is InvalidInput naming the
        problem and changes nothing.

        Raises:
            InvalidInput: a change the table cannot take (named), or no such table.
            ConflictError: another change of the table committed first.
        """
        given = dict(
            retention_seconds=retention_seconds,
            parts_to_delay_insert=parts_to_delay_insert,
            parts_to_throw_insert=parts_to_throw_insert,
            inline_rows=inline_rows,
            inline_bytes=inline_bytes,
        )
        options = {k: v for k, v in given.items() if v is not _UNCHANGED}
        for option, value in options.items():
            check_option(name, option, value)
        if add_columns is not None and not isinstance(add_columns, pa.Schema):
            if isinstance(add_columns, pa.Field):
                add_columns = [add_columns]
            if not isinstance(add_columns, Sequence) or not all(isinstance(f, pa.Field) for f in add_columns):
                raise InvalidInput(
                    f"alter {quote(name)}: add_columns must be a pyarrow.Schema or a list of "
                    f"pyarrow.Field, not {quote(add_columns)}"
                )
            add_columns = pa.schema(list(add_columns))
        if rename_columns is not None and not isinstance(rename_columns, Mapping):
            raise InvalidInput(f"alter {quote(name)}: rename_columns must map old column names to new ones")
        args: dict[str, Any] = {"name": name}
        if add_columns is not None:
            args["add_columns"] = schema_to_json(add_columns)
        if rename_columns is not None:
            args["rename_columns"] = dict(rename_columns)
        args.update(options)
        csn = self.call("alter_table", **args)["csn"]
        self._tables.pop(name, None)
        return csn

    def tables(self) -> list[str]:
        """The names of the tables that exist now."""
        return self.call("tables")

    def _table_at(self, name: str, snapshot: int | None, ddl: int | None) -> TableDef:
        """The definition at ``snapshot`` (None: the latest), whose last catalog change is ``ddl``
        (None: unknown): from the cache when it holds there, else asked."""
        cached = self._tables.get(name)
        if cached is not None and snapshot is not None and ddl is not None:
            tdef, at = cached
            if tdef.csn <= snapshot and ddl <= at:
                return tdef
        d = self.call("table", name=name, **({} if snapshot is None else {"snapshot": snapshot}))
        tdef, at = TableDef.from_dict(d), int(d.get("at") or 0)
        if cached is None or at >= cached[1]:
            self._tables[name] = (tdef, at)
        return tdef


class TransactionTables(TransactionBase):
    """A transaction's view of table definitions, and its DROP TABLE (a part of :class:`Transaction`)."""

    def table(self, name: str) -> TableDef:
        """The table's definition as this transaction sees it (at its snapshot; the latest for
        a table created since).

        Raises:
            TableNotFound: no such table at this transaction's snapshot, nor created since.
        """
        try:
            return self.client._table_at(name, self.snapshot, self._ddl)
        except errors.TableNotFound:
            latest = self.client._table_at(name, None, None)
            if latest.created_csn <= self.snapshot:
                raise
            return latest  # created after the snapshot: a transaction may write it

    @named("drop_table")
    def drop_table(self, table: str) -> None:
        """DROP TABLE in this transaction: at its CSN the table stops existing (its parts are
        removed then, whoever committed them); a transaction that wrote the table and commits
        after it fails with ConflictError naming the drop. It cannot also write the table.

        Raises:
            TableNotFound: no such table.
            TransactionAborted: the transaction has ended.
        """
        self._check_open()
        self.table(table)
        self._stage(DropTable(table))
