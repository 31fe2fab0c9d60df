"""Table definitions: what the log's DDL entries carry and what clients conform data to.

A table's life is a list of records by CSN, all derived from the log: a :class:`TableDef` when
it is created (``created_csn``) and each time it is altered (``version_csn``), and a
:class:`TableDropped` when it is dropped (a table of the same name may be created again after
it). ``ddl_version`` is the data version of the table's znode ``tables/<name>`` after that DDL:
every DDL on the name bumps it, and every commit that writes the table checks it, so no commit
decided on a definition that a concurrent DDL replaced can happen.

Schema changes (``ALTER TABLE``): adding a nullable column and renaming a column. A part records
the ``ddl_version`` of the definition it was written for (``PartMeta.schema_version``);
:meth:`TableDef.upgrade` reads a part written for an older version under this definition:
columns renamed since carry their new names, columns added since are null.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from coordinator.core import keytables
from coordinator.core.conflicts import Policy as Policy  # also named from here (replicas, spark)
from coordinator.core.errors import CorruptMetadata, InvalidInput, quote
from coordinator.core.tabledata import (
    schema_from_json,
    schema_to_json,
    validate_name,
    validate_schema,
)
from parts.model.meta import INLINE_MAX_BYTES

# A schema change, recorded in the definition: (ddl_version it came with, "add" | "rename",
# the column's name after it, its name before it: "" for an added column).
SchemaChange = tuple[int, str, str, str]


KEYS_TXN_MAX_SECONDS = 60.0  # a keys table's default limits (docs/rules.md#transaction-limits)
KEYS_TXN_MAX_ROWS = 100_000


def check_limits(table: str, seconds: object, rows: object) -> tuple[float | None, int | None]:
    """Validate a table's transaction limits: each None or a positive number (rows: an integer);
    InvalidInput naming the bad value otherwise."""
    if seconds is not None:
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not seconds > 0
            or seconds == float("inf")
        ):
            raise InvalidInput(
                f"txn_max_seconds of table {quote(table)} must be a positive number of seconds, not {quote(seconds)}",
                table=table,
                txn_max_seconds=repr(seconds),
            )
        seconds = float(seconds)
    if rows is not None:
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise InvalidInput(
                f"txn_max_rows of table {quote(table)} must be a positive integer, not {quote(rows)}",
                table=table,
                txn_max_rows=repr(rows),
            )
    return seconds, rows


def check_retention(table: str, seconds: object) -> float | None:
    """Validate a table's history retention: None (the replica-wide default) or a finite number
    of seconds >= 0; InvalidInput naming ``retention_seconds`` otherwise."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
        raise InvalidInput(
            f"retention_seconds of table {quote(table)} must be a finite number of seconds >= 0 "
            f"(or None: the replica-wide default), not {quote(seconds)}",
            table=table,
            retention_seconds=repr(seconds)[:100],
        )
    return float(seconds)


# Backpressure on inserts (docs/rules.md#too-many-parts): a table's own thresholds of visible parts
# per partition (None: the replica's setting of the same name; 0: never, for this table).
PARTS_OPTIONS = ("parts_to_delay_insert", "parts_to_throw_insert")
# Small writes (docs/architecture/small-writes.md): an insert of at most ``inline_rows`` rows per
# partition whose Parquet is at most ``inline_bytes`` travels in its log entry, without a part file
# (None: the replica's setting of the same name; 0: never, for this table).
INLINE_OPTIONS = ("inline_rows", "inline_bytes")
# What ALTER TABLE may set besides the schema (each None: back to the replica-wide default).
ALTERABLE = ("retention_seconds", *PARTS_OPTIONS, *INLINE_OPTIONS)


def _policy(conflict_policy: str) -> Policy:
    """The conflict policy of that name; InvalidInput naming the choices for any other."""
    try:
        return Policy(conflict_policy)
    except ValueError:
        choices = ", ".join(p.value for p in Policy)
        raise InvalidInput(f"unknown conflict_policy {quote(conflict_policy)}; choose one of {choices}") from None


def check_parts_option(table: str, option: str, value: object) -> int | None:
    """Validate a table's ``parts_to_delay_insert``/``parts_to_throw_insert``: None (the
    replica-wide default) or an integer >= 0 (0: never); InvalidInput naming the option otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(
            f"{option} of table {quote(table)} must be an integer >= 0 (0: never; None: the replica-wide "
            f"default), not {quote(value)}",
            table=table,
            **{option: repr(value)[:100]},
        )
    return value


def check_inline_option(table: str, option: str, value: object) -> int | None:
    """Validate a table's ``inline_rows``/``inline_bytes``: None (the replica-wide default) or an
    integer >= 0 (0: never inline), ``inline_bytes`` at most :data:`INLINE_MAX_BYTES`."""
    value = check_parts_option(table, option, value)
    if option == "inline_bytes" and value is not None and value > INLINE_MAX_BYTES:
        raise InvalidInput(
            f"inline_bytes of table {quote(table)} must be at most {INLINE_MAX_BYTES} (what a log entry "
            f"carries of one part), not {value}",
            table=table,
            inline_bytes=value,
        )
    return value


def check_option(table: str, option: str, value: object) -> float | int | None:
    """One of :data:`ALTERABLE` checked (InvalidInput naming it otherwise)."""
    if option == "retention_seconds":
        return check_retention(table, value)
    if option in PARTS_OPTIONS:
        return check_parts_option(table, option, value)
    if option in INLINE_OPTIONS:
        return check_inline_option(table, option, value)
    raise InvalidInput(f"alter {quote(table)}: unknown option {quote(option)}; known: {', '.join(ALTERABLE)}")


def effective_limits(
    tables: Iterable[TableDef], replica_seconds: float, replica_rows: int
) -> tuple[float, str | None, int, str | None]:
    """The limits binding a transaction that wrote ``tables`` (TableDefs): the smallest among the
    tables' own and the replica-wide ones, each with the table it comes from (None: the replica)."""
    seconds, s_from, rows, r_from = replica_seconds, None, replica_rows, None
    for t in sorted(tables, key=lambda t: t.name):
        if t.txn_max_seconds is not None and t.txn_max_seconds < seconds:
            seconds, s_from = t.txn_max_seconds, t.name
        if t.txn_max_rows is not None and t.txn_max_rows < rows:
            rows, r_from = t.txn_max_rows, t.name
    return seconds, s_from, rows, r_from


@dataclass(frozen=True)
class TableDef:
    name: str
    schema: pa.Schema
    partition_by: tuple[str, ...] = ()
    primary_key: tuple[str, ...] = ()
    conflict_policy: Policy = Policy.PARTS
    auto_merge: bool = True
    created_csn: int = 0
    version_csn: int = 0  # the CSN of the DDL that made this definition (0: its creation)
    ddl_version: int = 0  # the table znode's version after that DDL; parts record it
    changes: tuple[SchemaChange, ...] = ()  # every schema change since the creation, in order
    lock_groups: tuple[tuple[str, tuple[str, ...]], ...] = ()  # keys tables: (group, its columns), by name
    atomicity: str = "full"  # keys tables: "full" | "none"
    txn_max_seconds: float | None = None  # per-table transaction limits (None: only the replica-wide ones)
    txn_max_rows: int | None = None
    # History retention (docs/rules.md#history-retention): removed parts kept this many seconds after
    # the commit that removed them (None: the replica-wide default, ``retention_seconds``).
    retention_seconds: float | None = None
    # Visible parts per partition past which inserts are delayed / refused (None: the replica's).
    parts_to_delay_insert: int | None = None
    parts_to_throw_insert: int | None = None
    # Small writes: the most rows and Parquet bytes of an inlined part (None: the replica's; 0: never).
    inline_rows: int | None = None
    inline_bytes: int | None = None

    @property
    def csn(self) -> int:
        """The CSN from which this definition holds."""
        return self.version_csn or self.created_csn

    def inline_limits(self, replica_rows: int, replica_bytes: int) -> tuple[int, int]:
        """``(rows, bytes)``: the most rows and Parquet bytes an inlined part of this table may
        have, the table's own settings over the replica's (``replica_rows``, ``replica_bytes``);
        ``(0, 0)``: this table's inserts are never inlined (off, or a keys table: its parts are
        versions whose writing deletion vectors will change, docs/architecture/small-writes.md)."""
        if self.conflict_policy is Policy.KEYS:
            return 0, 0
        rows = replica_rows if self.inline_rows is None else self.inline_rows
        size = min(INLINE_MAX_BYTES, replica_bytes if self.inline_bytes is None else self.inline_bytes)
        return (0, 0) if rows <= 0 or size <= 0 else (rows, size)

    @classmethod
    def new(
        cls,
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
    ) -> TableDef:
        """Validate a CREATE TABLE request; every problem is InvalidInput naming it. A ``keys``
        table (:mod:`coordinator.core.keytables`) never merges automatically: its parts are versions of
        rows, folded only on read."""
        validate_name("table", name)
        if not isinstance(schema, pa.Schema):
            raise InvalidInput(f"schema of table {quote(name)} must be a pyarrow.Schema, not {type(schema).__name__}")
        if isinstance(partition_by, str) or isinstance(primary_key, str):
            raise InvalidInput("partition_by and primary_key take a sequence of column names, not a string")
        partition_by, primary_key = tuple(partition_by), tuple(primary_key)
        validate_schema(schema, list(partition_by), list(primary_key))
        policy = _policy(conflict_policy)
        if not isinstance(auto_merge, bool):
            raise InvalidInput("auto_merge must be True or False")
        groups = keytables.check_definition(
            name, schema, partition_by, primary_key, policy.value, lock_groups, atomicity
        )
        if policy is Policy.KEYS:
            # The default limits of keys tables (docs/rules.md#transaction-limits).
            if txn_max_seconds is None:
                txn_max_seconds = KEYS_TXN_MAX_SECONDS
            if txn_max_rows is None:
                txn_max_rows = KEYS_TXN_MAX_ROWS
        txn_max_seconds, txn_max_rows = check_limits(name, txn_max_seconds, txn_max_rows)
        given = (retention_seconds, parts_to_delay_insert, parts_to_throw_insert, inline_rows, inline_bytes)
        options = {k: check_option(name, k, v) for k, v in zip(ALTERABLE, given, strict=True)}
        return cls(
            name,
            schema,
            partition_by,
            primary_key,
            policy,
            auto_merge,
            lock_groups=groups,
            atomicity=atomicity,
            txn_max_seconds=txn_max_seconds,
            txn_max_rows=txn_max_rows,
            **options,  # type: ignore[arg-type]
        )

    def to_dict(self) -> dict[str, Any]:
        d = {
            "name": self.name,
            "schema": schema_to_json(self.schema),
            "partition_by": list(self.partition_by),
            "primary_key": list(self.primary_key),
            "conflict_policy": self.conflict_policy.value,
            "auto_merge": self.auto_merge,
            "created_csn": self.created_csn,
        }
        if self.version_csn:
            d["version_csn"] = self.version_csn
        if self.ddl_version:
            d["ddl_version"] = self.ddl_version
        if self.changes:
            d["changes"] = [list(c) for c in self.changes]
        if self.lock_groups:
            d["lock_groups"] = {g: list(cols) for g, cols in self.lock_groups}
        if self.atomicity != "full":
            d["atomicity"] = self.atomicity
        if self.txn_max_seconds is not None:
            d["txn_max_seconds"] = self.txn_max_seconds
        if self.txn_max_rows is not None:
            d["txn_max_rows"] = self.txn_max_rows
        for option in ALTERABLE:
            if getattr(self, option) is not None:
                d[option] = getattr(self, option)
        return d

    def same_definition(self, other: TableDef) -> bool:
        """Whether both define the same table (what a CREATE asked for), whatever their CSNs."""
        return (
            self.name,
            self.partition_by,
            self.primary_key,
            self.conflict_policy,
            self.auto_merge,
            self.lock_groups,
            self.atomicity,
            self.txn_max_seconds,
            self.txn_max_rows,
            self.retention_seconds,
            self.parts_to_delay_insert,
            self.parts_to_throw_insert,
            self.inline_rows,
            self.inline_bytes,
        ) == (
            other.name,
            other.partition_by,
            other.primary_key,
            other.conflict_policy,
            other.auto_merge,
            other.lock_groups,
            other.atomicity,
            other.txn_max_seconds,
            other.txn_max_rows,
            other.retention_seconds,
            other.parts_to_delay_insert,
            other.parts_to_throw_insert,
            other.inline_rows,
            other.inline_bytes,
        ) and self.schema.equals(other.schema, check_metadata=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TableDef:
        try:
            return cls(
                name=str(d["name"]),
                schema=schema_from_json(d["schema"]),
                partition_by=tuple(d.get("partition_by") or ()),
                primary_key=tuple(d.get("primary_key") or ()),
                conflict_policy=Policy(d.get("conflict_policy", "parts")),
                auto_merge=bool(d.get("auto_merge", True)),
                created_csn=int(d.get("created_csn") or 0),
                version_csn=int(d.get("version_csn") or 0),
                ddl_version=int(d.get("ddl_version") or 0),
                changes=tuple(_change(c) for c in d.get("changes") or ()),
                lock_groups=tuple(
                    sorted((str(g), tuple(map(str, cols))) for g, cols in (d.get("lock_groups") or {}).items())
                ),
                atomicity=str(d.get("atomicity", "full")),
                txn_max_seconds=None if d.get("txn_max_seconds") is None else float(d["txn_max_seconds"]),
                txn_max_rows=None if d.get("txn_max_rows") is None else int(d["txn_max_rows"]),
                retention_seconds=None if d.get("retention_seconds") is None else float(d["retention_seconds"]),
                parts_to_delay_insert=None
                if d.get("parts_to_delay_insert") is None
                else int(d["parts_to_delay_insert"]),
                parts_to_throw_insert=None
                if d.get("parts_to_throw_insert") is None
                else int(d["parts_to_throw_insert"]),
                inline_rows=None if d.get("inline_rows") is None else int(d["inline_rows"]),
                inline_bytes=None if d.get("inline_bytes") is None else int(d["inline_bytes"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptMetadata(f"table definition does not parse: {quote(exc)}") from exc

    def with_csn(self, csn: int) -> TableDef:
        """As applied at ``csn``: a creation (``created_csn`` 0 in the entry) is created there,
        an alteration holds from there."""
        if self.created_csn == 0:
            return replace(self, created_csn=csn, version_csn=0)
        return replace(self, version_csn=csn)

    # -- schema changes ------------------------------------------------------------------------
    def altered(
        self,
        add_columns: pa.Schema | list[pa.Field] | None = None,
        rename_columns: dict[str, str] | None = None,
        version: int | None = None,
        options: Mapping[str, object] | None = None,
    ) -> TableDef:
        """The definition after ``ALTER TABLE``: ``add_columns`` (nullable fields, appended),
        ``rename_columns`` ({old: new}) and ``options`` (new values of :data:`ALTERABLE`: the
        table's ``retention_seconds``, ``parts_to_delay_insert``, ``parts_to_throw_insert``; None
        for one meaning the replica-wide default). Every problem is InvalidInput naming it, and
        nothing is changed then. The result holds from the next ddl_version (its CSN is set when
        the log applies it; ``version``: its ddl_version, by default the next)."""
        if not options:
            return self._schema_altered(add_columns, rename_columns, version)
        if not isinstance(options, Mapping):
            raise InvalidInput(f"alter {quote(self.name)}: options must map option names to values")
        values = {k: check_option(self.name, k, v) for k, v in options.items()}
        if add_columns is None and not rename_columns:
            v = self.ddl_version + 1 if version is None else version
            return replace(self, **values, ddl_version=v, version_csn=0)  # type: ignore[arg-type]
        return replace(self._schema_altered(add_columns, rename_columns, version), **values)  # type: ignore[arg-type]

    def _schema_altered(
        self, add_columns: pa.Schema | list[pa.Field] | None, rename_columns: dict[str, str] | None, version: int | None
    ) -> TableDef:
        """The definition after the schema part of ``altered``: columns added and renamed."""
        if self.conflict_policy is Policy.KEYS:
            raise InvalidInput(
                f"alter {quote(self.name)}: schema changes of keys tables are not supported yet; nothing was changed",
                table=self.name,
            )
        adds = _fields(add_columns, self.name)
        renames = rename_columns or {}
        if not isinstance(renames, dict):
            raise InvalidInput(
                f"alter {quote(self.name)}: rename_columns must map old names to new ones, not {type(renames).__name__}"
            )
        if not adds and not renames:
            raise InvalidInput(
                f"alter {quote(self.name)}: nothing to change (give add_columns, rename_columns or one of "
                f"{', '.join(ALTERABLE)})"
            )
        names = list(self.schema.names)
        problems = self._rename_problems(renames) + self._add_problems(adds, renames)
        if problems:
            raise InvalidInput(f"alter {quote(self.name)}: {'; '.join(problems)}; nothing was changed", table=self.name)
        v = self.ddl_version + 1 if version is None else version
        fields = [self.schema.field(i).with_name(renames.get(n, n)) for i, n in enumerate(names)] + list(adds)
        schema = pa.schema(fields, metadata=self.schema.metadata)
        validate_schema(schema, list(self.partition_by), list(self.primary_key))
        changes = (
            self.changes
            + tuple((v, "rename", new, old) for old, new in renames.items())
            + tuple((v, "add", f.name, "") for f in adds)
        )
        return replace(self, schema=schema, ddl_version=v, version_csn=0, changes=changes)

    def _rename_problems(self, renames: dict[str, str]) -> list[str]:
        """What is wrong with renaming columns by ``renames`` ({old: new}): an unknown or a
        partition or key column renamed, two renamed to one name, a rename onto a kept column."""
        names = list(self.schema.names)
        problems = []
        keys = set(self.partition_by) | set(self.primary_key)
        for old, new in renames.items():
            for n in (old, new):
                validate_name("column", n)
            if old not in names:
                problems.append(f"cannot rename unknown column {quote(old)} (columns: {names})")
            elif old in keys:
                what = "partition" if old in self.partition_by else "primary key"
                problems.append(f"cannot rename {what} column {quote(old)}")
        targets = list(renames.values())
        for new in sorted(set(targets)):
            if targets.count(new) > 1:
                problems.append(f"two columns cannot both be renamed to {quote(new)}")
            elif new in names and new not in renames:
                problems.append(f"cannot rename to {quote(new)}: the table has a column {quote(new)}")
        return problems

    def _add_problems(self, adds: list[pa.Field], renames: dict[str, str]) -> list[str]:
        """What is wrong with adding the fields ``adds`` after renaming by ``renames``: a name
        taken (by a column after the renames, or by another added one), a field not nullable."""
        after = {renames.get(n, n) for n in self.schema.names}
        added = Counter(f.name for f in adds)
        problems = []
        for f in adds:
            validate_name("column", f.name)
            if f.name in after or added[f.name] > 1:
                problems.append(f"cannot add column {quote(f.name)}: the table has a column {quote(f.name)}")
            if not f.nullable:
                problems.append(
                    f"cannot add column {quote(f.name)} as not nullable: the rows already in the table "
                    "have no value for it (add it nullable)"
                )
        return problems

    def names_at(self, schema_version: int) -> list[str | None]:
        """For each column of this definition, its name in a part written for
        ``schema_version`` (None: the column did not exist then)."""
        out: list[str | None] = list(self.schema.names)
        versions = sorted({c[0] for c in self.changes if c[0] > schema_version}, reverse=True)
        for v in versions:  # undo one ALTER at a time, its changes all at once (a swap of names)
            back = {name: (None if kind == "add" else before) for cv, kind, name, before in self.changes if cv == v}
            out = [back[n] if n in back else n for n in out]
        return out

    def current(self, schema_version: int) -> bool:
        """Whether rows written for ``schema_version`` read as they are under this definition
        (:meth:`upgrade` leaves them alone)."""
        return schema_version >= self.ddl_version or not self.changes

    def upgrade(self, data: pa.Table, schema_version: int) -> pa.Table:
        """Rows of a part written for ``schema_version``, under this definition: renamed columns
        under their names now, added columns null, in this schema's order and types."""
        if data.schema == self.schema:
            return data
        if schema_version >= self.ddl_version or not self.changes:
            olds: Sequence[str | None] = (
                self.schema.names
            )  # a file lacking a column (a writer's subset) reads null there
        else:
            olds = self.names_at(schema_version)
        cols = []
        for f, old in zip(self.schema, olds):
            if old is None or old not in data.column_names:
                cols.append(pa.nulls(data.num_rows, f.type))
            else:
                col = data.column(old)
                cols.append(col if col.type.equals(f.type) else col.cast(f.type))
        return pa.Table.from_arrays(cols, schema=self.schema)

    def stats_at(self, stats: dict[str, tuple[Any, Any]], schema_version: int) -> dict[str, tuple[Any, Any]]:
        """A part's column statistics under this definition's names (for pruning)."""
        if schema_version >= self.ddl_version or not self.changes:
            return dict(stats)
        out = {}
        for name, old in zip(self.schema.names, self.names_at(schema_version)):
            if old is not None and old in stats:
                out[name] = stats[old]
        return out


@dataclass(frozen=True)
class TableDropped:
    """The record a DROP TABLE leaves: the table does not exist from ``csn`` on (a table of the
    same name may be created later). ``tid`` is the transaction that dropped it."""

    name: str
    tid: str
    ddl_version: int
    csn: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "tid": self.tid, "ddl_version": self.ddl_version, "csn": self.csn}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TableDropped:
        try:
            return cls(str(d["name"]), str(d["tid"]), int(d["ddl_version"]), int(d.get("csn") or 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptMetadata(f"table drop record does not parse: {quote(exc)}") from exc


TableRecord = TableDef | TableDropped


def _change(c: object) -> SchemaChange:
    if not isinstance(c, list | tuple) or len(c) != 4 or c[1] not in ("add", "rename"):
        raise ValueError(f"schema change {quote(c)} is not [version, 'add'|'rename', name, before]")
    return (int(c[0]), str(c[1]), str(c[2]), str(c[3]))


def _fields(add_columns: object, table: str) -> list[pa.Field]:
    if add_columns is None:
        return []
    if isinstance(add_columns, pa.Field):
        add_columns = [add_columns]
    if isinstance(add_columns, pa.Schema):
        return list(add_columns)
    if isinstance(add_columns, list | tuple) and all(isinstance(f, pa.Field) for f in add_columns):
        return list(add_columns)
    raise InvalidInput(
        f"alter {quote(table)}: add_columns must be a pyarrow.Schema or a list of pyarrow.Field, "
        f"not {quote(add_columns)}"
    )
