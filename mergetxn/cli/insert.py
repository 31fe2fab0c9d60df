"""``mergetxn insert``: a Parquet or CSV file into a table, in one transaction.

The file is read by batches, and each batch goes through the client's own statements of the one
transaction, as a Python writer's would: ``tx.insert``, ``tx.upsert`` on a keys table, and for
``--overwrite`` ``tx.overwrite`` of the partitions a batch is the first to hold (later batches
add to what the file put there). The client conforms, splits and writes the parts; a refused
statement or a failure anywhere rolls the transaction back, and the replica deletes what it
staged.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import pyarrow as pa
from rich.markup import escape

from coordinator.core import errors
from coordinator.core.conflicts import Policy
from coordinator.core.errors import quote
from coordinator.core.tabledata import partition_key, split_by_partition
from mergetxn.cli.files import file_batches
from mergetxn.cli.options import json_option, replica_option, shown
from mergetxn.cli.output import connected, echo_json, progress, say

if TYPE_CHECKING:
    from coordinator.model.catalog import TableDef
    from mergetxn.client.client import Transaction


@click.command(short_help="Insert a Parquet or CSV file into a table.")
@click.argument("table_name", metavar="TABLE")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--overwrite",
    is_flag=True,
    help="INSERT OVERWRITE: replace the partitions present in FILE "
    "(the whole table if unpartitioned). Not for keys tables, which are written by key.",
)
@click.option(
    "--update",
    is_flag=True,
    help="Keys tables: update mode (columns FILE lacks keep their values; "
    "without it a row replaces its key's row, absent columns null).",
)
@shown(
    "--batch-rows",
    type=click.IntRange(min=1),
    default=1_000_000,
    help="Rows read from FILE at a time (each batch is written as parts of its own).",
)
@json_option("Print the outcome as one JSON object.")
@replica_option
def insert(
    table_name: str, file: Path, overwrite: bool, update: bool, batch_rows: int, as_json: bool, replica: str
) -> None:
    """Insert the rows of FILE (Parquet or CSV, by extension) into TABLE in one transaction.

    FILE is read by batches (never whole in memory); each batch is written to storage as it
    comes, and the transaction commits once at the end. Columns are conformed to the table's
    schema (nullable columns FILE lacks are null); a mismatch is an error and changes nothing.
    A keys table is written by key, as client upserts are. A FILE without rows commits nothing.
    """
    """Insert the rows of FILE (Parquet or CSV, by extension) into TABLE in one transaction.

    FILE is read by batches (never whole in memory); each batch is written to storage as it
    comes, and the transaction commits once at the end. Columns are conformed to the table's
    schema (nullable columns FILE lacks are null); a mismatch is an error and changes nothing.
    A keys table is written by key, as client upserts are. A FILE without rows commits nothing.
    """
    with connected(replica) as client:
        tx = client.begin()
        try:
            tdef = tx.table(table_name)  # as the transaction sees it: its schema and schema version
            _check_insert_mode(table_name, tdef.conflict_policy is Policy.KEYS, overwrite, update)
            batches = _Batches(tx, tdef, overwrite, update)
            rows = _write_file(batches, file, tdef.schema, batch_rows)
            if rows == 0:
                tx.rollback()
            else:
                tx.commit()
        except BaseException:
            if tx.csn is None:
                try:
                    tx.rollback()
                except errors.MergetxnError:
                    pass
            raise
    outcome = {"table": table_name, "rows": rows, "parts": batches.parts, "csn": tx.csn if rows else None}
    _print_outcome(outcome | {"tid": tx.id if rows else None, "overwrite": overwrite, "update": update}, file, as_json)


def _print_outcome(outcome: dict[str, Any], file: Path, as_json: bool) -> None:
    if as_json:
        echo_json(outcome)
        return
    table = escape(outcome["table"])
    if outcome["rows"] == 0:
        say(f"{escape(file.name)} holds no rows: nothing inserted into {table}, nothing committed")
        return
    verb = "overwrote with" if outcome["overwrite"] else ("updated by key" if outcome["update"] else "inserted")
    say(f"{verb} {outcome['rows']} rows into {table}; committed at CSN {outcome['csn']} (tid {outcome['tid']})")


def _check_insert_mode(table_name: str, by_key: bool, overwrite: bool, update: bool) -> None:
    """``--overwrite`` is for tables written by part, ``--update`` for keys tables."""
    if by_key and overwrite:
        raise errors.InvalidInput(
            f"insert --overwrite: {quote(table_name)} is a keys table, written by "
            "key (a row replaces its key's row): drop --overwrite, or truncate first"
        )
    if update and not by_key:
        raise errors.InvalidInput(
            f"insert --update: {quote(table_name)} is not a keys table (update mode writes by key)"
        )


def _write_file(batches: _Batches, file: Path, schema: pa.Schema, batch_rows: int) -> int:
    """FILE's rows through ``batches`` by batches of about ``batch_rows``, with progress: the
    rows written."""
    total, tables = file_batches(file, schema, batch_rows)
    rows = 0
    with progress(f"writing {file.name}", total) as advance:
        for data in tables:
            rows += batches.add(data)
            advance(data.num_rows)
    return rows


class _Batches:
    """Each batch of a file as statements of the one transaction ``tx``: by key on a keys table
    (``tx.upsert``), else ``tx.insert``; with ``overwrite``, ``tx.overwrite`` of each partition
    the first batch holding it (the whole table for an unpartitioned one), so that the file
    replaces what the table held there once. ``parts``: the parts written (a keys table: the
    batches staged)."""

    def __init__(self, tx: Transaction, tdef: TableDef, overwrite: bool, update: bool) -> None:
        self.tx, self.tdef, self.overwrite, self.update = tx, tdef, overwrite, update
        self.replaced: set[str] = set()  # the partitions (partition keys) the overwrite replaced so far
        self.parts = 0

    def add(self, data: pa.Table) -> int:
        """Stage ``data``; the rows staged."""
        table, by = self.tdef.name, list(self.tdef.partition_by)
        if self.tdef.conflict_policy is Policy.KEYS:
            if data.num_rows == 0:
                return 0
            self.parts += 1
            return self.tx.upsert(table, data, update=self.update)
        if not self.overwrite:
            rows, held = self.tx.insert(table, data), _partitions(data, by)  # the client checks the data first
        elif data.num_rows == 0:
            return 0  # an empty overwrite of an unpartitioned table would empty it
        else:
            rows, held = self._overwrite(data, by)
        self.parts += len(held)
        return rows

    def _overwrite(self, data: pa.Table, by: list[str]) -> tuple[int, set[str]]:
        """Overwrite the partitions of ``data`` no earlier batch held, insert into the others;
        the rows staged and the partitions ``data`` is in."""
        table = self.tdef.name
        if not self.replaced:  # the first batch: the client checks it as any overwrite
            rows = self.tx.overwrite(table, data)
            self.replaced.update(held := _partitions(data, by))
            return rows, held
        held = _partitions(data, by)  # as the first batch's: one file, one schema
        fresh = held - self.replaced
        self.replaced |= held
        if not fresh:
            return self.tx.insert(table, data), held
        if fresh == held:
            return self.tx.overwrite(table, data), held
        groups = split_by_partition(data, by)
        new = pa.concat_tables([chunk for p, chunk in groups if partition_key(p) in fresh])
        again = pa.concat_tables([chunk for p, chunk in groups if partition_key(p) not in fresh])
        return self.tx.overwrite(table, new) + self.tx.insert(table, again), held


def _partitions(data: pa.Table, by: list[str]) -> set[str]:
    """The partitions ``data``'s rows are in, as partition keys."""
    if data.num_rows == 0:
        return set()
    if not by:
        return {partition_key(())}
    unique = data.select(by).group_by(by, use_threads=False).aggregate([])
    return {partition_key(values) for values in zip(*(unique.column(c).to_pylist() for c in by))}
