"""UPDATE and DELETE for tables too large for one process: the rewrite runs on Spark executors.

The driver lists the parts visible to the transaction and keeps those whose partition values and
min/max statistics may hold matching rows; one Spark task per candidate part reads it (checksum
checked), applies the predicate, and writes the replacement parts straight to storage
(copy-on-write, as :mod:`parts.io.rewrite` does for the Python client). The driver then stages all
replacements as one DELETE or UPDATE (kind MUTATE) in one transaction and commits it, or, with
``txn``, stages them into the caller's transaction. The predicate and assignments travel with the
staged operation, so a replica that must rebase the transaction can redo them.

    from spark.mutate import delete, update
    delete(spark, "events", pc.field("day") < datetime.date(2024, 1, 1), replica="127.0.0.1:7000")
    update(spark, "events", pc.field("id") == 7, {"status": "void"}, replica="127.0.0.1:7000")

Only parts that actually contain matching rows are replaced; the others are not rewritten.
Files written by failed task attempts are never referenced by the commit (``mergetxn gc``
collects them).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from coordinator.core import errors
from coordinator.core.errors import InvalidInput
from coordinator.core.tabledata import (
    assignments,
    check_expression,
    decode_assignments,
    decode_expression,
    encode_assignments,
    encode_expression,
    may_match,
)
from coordinator.model.catalog import TableDef
from parts.io.format import delete_part
from parts.model.meta import PartMeta
from spark.options import Settings, connect, join, settings, storage_for, table_def

if TYPE_CHECKING:
    from mergetxn.client.client import Transaction


@dataclass(frozen=True)
class Mutation:
    """What a DELETE/UPDATE did: rows affected, parts replaced, and the commit (``csn`` is None
    when the rewrite was staged into the caller's transaction, option ``txn``)."""

    kind: str
    table: str
    txn: str
    rows: int
    parts_removed: int
    parts_added: int
    csn: int | None


def delete(
    spark: Any,
    table: str,
    where: pc.Expression,
    replica: str | None = None,
    txn: str | None = None,
    options: Mapping[str, str] | None = None,
) -> Mutation:
    """DELETE FROM ``table`` WHERE ``where`` (a pyarrow.compute.Expression), rewritten on the
    executors and committed as one MUTATE transaction."""
    return _mutate(spark, "delete", table, where, None, replica, txn, options)


def update(
    spark: Any,
    table: str,
    where: pc.Expression,
    set: Mapping[str, Any],  # noqa: A002
    replica: str | None = None,
    txn: str | None = None,
    options: Mapping[str, str] | None = None,
) -> Mutation:
    """UPDATE ``table`` SET ``set`` (column -> value or expression) WHERE ``where``."""
    return _mutate(spark, "update", table, where, set, replica, txn, options)


def _mutate(
    spark: Any,
    kind: str,
    table: str,
    where: pc.Expression,
    set_map: Mapping[str, Any] | None,
    replica: str | None,
    txn: str | None,
    options: Mapping[str, str] | None,
) -> Mutation:
    s = _mutation_settings(table, replica, txn, options)
    with connect(s) as client:
        tdef = table_def(client, s)
        encoded_where, encoded_set = _encoded_mutation(kind, table, where, set_map, tdef)
        tx = join(client, s) if s.txn is not None else client.begin()
        own = s.txn is None
        added: list[PartMeta] = []
        try:
            visible = [PartMeta.from_dict(m) for m in client.call("visible", table=table, id=tx.id)["parts"]]
            candidates = [
                m for m in visible if may_match(dict(m.stats), list(tdef.partition_by), m.partition, where, tdef.schema)
            ]
            removed: list[str] = []
            rows = 0
            if candidates:
                task = functools.partial(
                    _rewrite_task,
                    kind,
                    tdef.to_dict(),
                    encoded_where,
                    encoded_set,
                    client.storage.url,
                    s.storage_options,
                    tx.id,
                )
                rdd = spark.sparkContext.parallelize([m.to_dict() for m in candidates], len(candidates))
                for name, new_parts, n in rdd.mapPartitions(task).collect():
                    removed.append(name)
                    added.extend(PartMeta.from_dict(d) for d in new_parts)
                    rows += n
            tx.add_rewrite(table, kind, added, removed, where, set_map)
        except BaseException:
            for m in added:
                delete_part(client.storage, m.path)
            if own:
                try:
                    tx.rollback()
                except errors.MergetxnError:
                    pass
            raise
        csn = _commit_mutation(tx, kind, table) if own else None
        return Mutation(kind, table, tx.id, rows, len(removed), len(added), csn)


def _mutation_settings(table: str, replica: str | None, txn: str | None, options: Mapping[str, str] | None) -> Settings:
    """The write settings of a mutation of ``table``: its options (names lower-cased) with the
    table's path and the replica and transaction given as arguments."""
    opts = {str(k).lower(): v for k, v in dict(options or {}).items()}
    opts["path"] = table
    if replica is not None:
        opts["replica"] = replica
    if txn is not None:
        opts["txn"] = txn
    return settings(opts, write=True)


def _encoded_mutation(
    kind: str, table: str, where: pc.Expression, set_map: Mapping[str, Any] | None, tdef: TableDef
) -> tuple[str, str | None]:
    """The mutation's ``where`` and (for an update) ``set``, checked against the table's schema
    and encoded for the tasks; InvalidInput naming what is wrong otherwise."""
    if not isinstance(where, pc.Expression):
        raise InvalidInput(
            f"mergetxn {kind} on {table!r}: where must be a pyarrow.compute.Expression, not {type(where).__name__}"
        )
    check_expression(where, tdef.schema, f"{kind} on {table!r}")
    encoded_where = encode_expression(where, tdef.schema)
    encoded_set = None
    if kind == "update":
        if not isinstance(set_map, Mapping) or not set_map:
            raise InvalidInput(f"mergetxn update on {table!r}: set must map column names to values")
        encoded_set = encode_assignments(assignments(dict(set_map), tdef.schema), tdef.schema)
    return encoded_where, encoded_set


def _commit_mutation(tx: Transaction, kind: str, table: str) -> int | None:
    """Commit the mutation's own transaction; its CSN. A conflict is a ConflictError naming the
    mutation, its transaction and the winner."""
    try:
        return tx.commit()
    except errors.ConflictError as exc:
        raise errors.ConflictError(
            f"mergetxn: {kind} on {table!r} (transaction {tx.id}) conflicts with transaction "
            f"{exc.winner}, which committed first; nothing of it is visible. {exc.message}",
            **exc.details,
        ) from None


def _rewrite_task(
    kind: str,
    tdef_dict: dict,
    where_text: str,
    set_text: str | None,
    storage_url: str,
    storage_options: dict | None,
    txn_id: str,
    metas: Iterator[dict],
) -> Iterator[tuple[str, list[dict], int]]:
    """On an executor: rewrite each part given; yields (replaced part, new parts, rows affected)
    for parts that held matching rows. A failing attempt removes what it wrote."""
    from parts.io import rewrite

    tdef = TableDef.from_dict(tdef_dict)
    where = decode_expression(where_text, tdef.schema)
    storage = storage_for(storage_url, storage_options)
    done: list[PartMeta] = []
    out = []
    try:
        for d in metas:
            meta = PartMeta.from_dict(d)
            if kind == "delete":
                result = rewrite.delete(storage, tdef, [meta], where, txn_id)
            else:
                result = rewrite.update(
                    storage, tdef, [meta], where, decode_assignments(set_text or "", tdef.schema), txn_id
                )
            done.extend(result.added)
            if result.removed:
                out.append((meta.name, [m.to_dict() for m in result.added], result.affected_rows))
    except BaseException:
        for m in done:
            delete_part(storage, m.path)
        raise
    return iter(out)
