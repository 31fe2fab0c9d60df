"""``backup`` a table at a CSN into a directory, and ``restore`` it as one transaction
(mergetxn/tools/recovery.py does the work)."""

from __future__ import annotations

import click
from rich.markup import escape

from mergetxn.cli.options import json_option, replica_option
from mergetxn.cli.output import answer, redact, say


@click.command(short_help="Copy a table's definition and parts at a CSN into a directory.")
@click.argument("table_name", metavar="TABLE")
@click.argument("directory", metavar="DIR")
@click.option("--snapshot", type=click.IntRange(min=0), default=None, help="Back up at this CSN (default: the latest).")
@json_option("Print the manifest written as one JSON object.")
@replica_option
def backup(table_name: str, directory: str, snapshot: int | None, as_json: bool, replica: str) -> None:
    """Copy TABLE at one snapshot into DIR (a local directory or an fsspec URL such as s3://):
    every visible part file, byte for byte, and manifest.json (definition, CSN, each part's size,
    checksum and SHA-256; on a secured cluster, as an admin, a MAC that restore checks). The
    snapshot is held while the files are copied."""
    from mergetxn.tools import recovery

    def show(manifest: dict) -> None:
        say(
            f"backed up {escape(table_name)} at CSN {manifest['csn']}: {len(manifest['parts'])} parts, "
            f"{manifest['rows']} rows, {manifest['bytes']} bytes to {escape(redact(directory))}"
        )

    answer(
        replica,
        lambda client: recovery.backup(client, table_name, directory, snapshot),
        show,
        as_json,
        data=lambda manifest: {k: v for k, v in manifest.items() if k != "parts"} | {"parts": len(manifest["parts"])},
        work=f"backing up {table_name}",
    )


@click.command(short_help="Restore a backup as one transaction (under a new name or in place).")
@click.argument("directory", metavar="DIR")
@click.option(
    "--as",
    "as_name",
    default=None,
    metavar="NAME",
    help="Restore into a new table of this name (default: the backed-up table: replaced in "
    "place if it exists, created if not).",
)
@click.option(
    "--unverified",
    is_flag=True,
    help="On a secured cluster, restore a backup whose MAC is missing or not this cluster's (one "
    "made on an unsecured or another cluster): only from a directory no one else could write.",
)
@json_option("Print the outcome as one JSON object.")
@replica_option
def restore(directory: str, as_name: str | None, unverified: bool, as_json: bool, replica: str) -> None:
    """Restore the table backed up in DIR at its CSN, as one transaction, whatever the table's
    txn_max_rows and txn_max_seconds. Every file is checked against the manifest first, and on a
    secured cluster (as an admin) the manifest against its MAC: a damaged or forged backup is
    refused (exit 8; one without a MAC: exit 2) and changes nothing."""
    from mergetxn.tools import recovery

    def show(result: dict) -> None:
        how = "into new table" if result["created"] else "in place into"
        say(
            f"restored {result['rows']} rows {how} {escape(result['table'])} as of backup CSN "
            f"{result['from_csn']}; committed at CSN {result['csn']}"
        )

    answer(
        replica,
        lambda client: recovery.restore(client, directory, as_name, unverified),
        show,
        as_json,
        work="restoring",
    )
