"""Reading a table: ``read`` at a snapshot or time, ``changes`` between two CSNs, ``history`` of
its commits, ``parts`` and their versions, and the replica's ``snapshot``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click
import pyarrow as pa
from rich.markup import escape

from coordinator.core.conflicts import Policy
from coordinator.core.errors import InvalidInput
from mergetxn.cli.files import READ_FORMATS, output_format, print_rows, write_out
from mergetxn.cli.options import file_option, json_option, replica_option, shown
from mergetxn.cli.output import answer, ask, connected, console, rows_table
from mergetxn.cli.parsing import parse_as_of

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from mergetxn.client.client import Client

_OUTPUT = file_option(
    "--output",
    "-o",
    help="Write all rows to this file (format from --format, else from its extension: .csv, "
    ".json/.jsonl, else Parquet) instead of printing.",
)
_LIMIT = shown("--limit", type=click.IntRange(min=0), default=50, help="Rows to print (--format table only).")


def _format_option(help_text: str) -> Callable[[Callable], Callable]:
    return click.option("--format", "fmt", type=click.Choice(READ_FORMATS), default=None, help=help_text)


@click.command(short_help="Read a table at a snapshot or time.")
@click.argument("table_name", metavar="TABLE")
@click.option("--snapshot", type=click.IntRange(min=0), default=None, help="Read at this CSN.")
@click.option(
    "--as-of",
    "as_of",
    default=None,
    metavar="ISO8601",
    help="Read as of a time, with timezone (e.g. 2024-05-01T12:00:00+00:00).",
)
@_OUTPUT
@_format_option(
    "table: the first --limit rows, for a terminal (the default without --output); csv, json "
    "(one object per line) or parquet: every row, to --output or stdout, streamed part by part."
)
@_LIMIT
@replica_option
def read(
    table_name: str,
    snapshot: int | None,
    as_of: str | None,
    output: Path | None,
    fmt: str | None,
    limit: int,
    replica: str,
) -> None:
    """Read TABLE at one consistent snapshot: the latest, a CSN, or as of a time."""
    if snapshot is not None and as_of is not None:
        raise InvalidInput("give either --snapshot or --as-of, not both")
    when = parse_as_of(as_of) if as_of is not None else None
    fmt = output_format(fmt, output)
    with connected(replica) as client, client.scan(table_name, snapshot=snapshot, as_of=when) as (snap, metas, parts):
        tdef = client.table_at(table_name, snap)
        # A keys table's versions fold by partition and key range as they stream (bounded
        # memory): its row count is known only at the end.
        keys = tdef.conflict_policy is Policy.KEYS
        total: int | None = None if keys else sum(m.rows for m in metas)
        what = f"rows of {escape(table_name)} " + (
            f"at snapshot {snap}" if when is None else f"as of {when.isoformat()}"
        )
        if fmt != "table":
            write_out(parts, tdef.schema, fmt, output, total, what)
            return
        shown, seen = _first_rows(parts, limit, keys)
        print_rows(tdef.schema.empty_table() if shown is None else shown, seen if total is None else total, limit, what)


def _first_rows(parts: Iterator[pa.Table], limit: int, to_the_end: bool) -> tuple[pa.Table | None, int]:
    """The first ``limit`` rows of ``parts`` (None: none) and how many rows were seen;
    ``to_the_end``: every part is counted (a keys table's count is known only so)."""
    shown: list[pa.Table] = []
    have = seen = 0
    for data in parts:
        seen += data.num_rows
        if have < limit:
            shown.append(data.slice(0, limit - have))
            have += shown[-1].num_rows
        elif not to_the_end:
            break
    return (pa.concat_tables(shown) if shown else None), seen


@click.command(short_help="Rows a table's commits added and removed between two CSNs.")
@click.argument("table_name", metavar="TABLE")
@click.option("--from", "start", type=click.IntRange(min=0), required=True, help="After this CSN.")
@click.option("--to", "end", type=click.IntRange(min=0), default=None, help="Up to this CSN (default: the latest).")
@file_option(
    "--output",
    "-o",
    help="Write the rows to this file (format from --format, else from its extension).",
)
@_format_option(
    "table: the first --limit rows (the default without --output); csv, json or parquet: every row, to --output or "
    "stdout."
)
@_LIMIT
@replica_option
def changes(
    table_name: str, start: int, end: int | None, output: Path | None, fmt: str | None, limit: int, replica: str
) -> None:
    """The rows added (_change insert) and removed (_change delete) by TABLE's commits whose CSN
    is in (--from, --to], with the _csn of each: client.changes by id."""
    fmt = output_format(fmt, output)
    data = ask(replica, lambda client: client.changes(table_name, start, end))
    what = f"changed rows of {escape(table_name)} in ({start}, {'latest' if end is None else end}]"
    if fmt == "table":
        print_rows(data.slice(0, limit), data.num_rows, limit, what)
        return
    write_out(iter([data]), data.schema, fmt, output, data.num_rows, what)


@click.command(short_help="A table's commits: kind, rows, who; aborts and why.")
@click.argument("table_name", metavar="TABLE")
@shown("--limit", type=click.IntRange(min=1, max=10_000), default=50, help="The most recent entries to print.")
@shown("--format", "fmt", type=click.Choice(["table", "json"]), default="table", help="json: one object per line.")
@replica_option
def history(table_name: str, limit: int, fmt: str, replica: str) -> None:
    """TABLE's history, oldest first: each commit's CSN, time, kind, rows of the parts it added
    and removed, transaction and replica; its DDL; and the aborts this replica remembers, with
    their reason."""
    from mergetxn.tools import recovery

    def show(entries: list[dict]) -> None:
        out = console()
        columns = ["csn", "time", "kind", "rows_added", "rows_removed", "tid", "host", "user", "reason"]
        out.print(rows_table(entries, columns))
        out.print(f"{len(entries)} entries of {escape(table_name)}'s history (--limit {limit})")

    answer(replica, lambda client: recovery.history(client, table_name, limit), show, fmt == "json", lines=True)


@click.command(short_help="List a table's parts and their versions.")
@click.argument("table_name", metavar="TABLE")
@shown(
    "--all/--visible",
    "show_all",
    type=bool,
    default=True,
    help="Show removed parts too, or only the visible ones.",
)
@json_option("One JSON object per line.")
@replica_option
def parts(table_name: str, show_all: bool, as_json: bool, replica: str) -> None:
    """List TABLE's parts with their versions (creation and removal tid/CSN, visibility)."""

    def listed(client: Client) -> list[dict]:
        rows = client.parts(table_name).to_pylist()
        if not show_all:
            return [r for r in rows if r["visible"]]
        return [r for r in rows if not r.get("collected")]  # in storage: visible, or why kept

    def show(rows: list[dict]) -> None:
        cols = ["name", "partition", "rows", "creation_tid", "creation_csn", "removal_tid", "removal_csn", "visible"]
        out = console()
        out.print(rows_table(rows, cols + (["why_kept"] if show_all else [])))
        visible = sum(1 for r in rows if r["visible"])
        out.print(
            f"{len(rows)} parts of {escape(table_name)}, {visible} visible, "
            f"{sum(r['rows'] for r in rows if r['visible'])} visible rows"
        )

    # --json: the partition as its values, not as JSON text inside JSON
    answer(
        replica,
        listed,
        show,
        as_json,
        data=lambda rows: [{**r, "partition": json.loads(r["partition"])} for r in rows],
        lines=True,
    )


@click.command(short_help="Print the replica's snapshot CSN.")
@json_option('Print {"snapshot": CSN}.')
@replica_option
def snapshot(as_json: bool, replica: str) -> None:
    """Print the replica's snapshot CSN (everything up to it is applied there)."""
    answer(replica, lambda client: client.snapshot(), click.echo, as_json, data=lambda csn: {"snapshot": csn})
