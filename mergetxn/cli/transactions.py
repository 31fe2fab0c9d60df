"""``mergetxn txn``: list and kill the transactions running on a replica."""

from __future__ import annotations

import click
from rich.markup import escape

from mergetxn.cli.options import json_option, replica_option
from mergetxn.cli.output import answer, console, rows_table, say


@click.group()
def txn() -> None:
    """List and kill running transactions."""


@txn.command("list")
@json_option("One JSON object per line.")
@replica_option
def txn_list(as_json: bool, replica: str) -> None:
    """List the transactions running on the replica."""
    answer(replica, lambda client: client.transactions(), _show_running, as_json, lines=True)


def _show_running(txns: list[dict]) -> None:
    rows = [{**t, "age": f"{t.get('age_seconds', 0):.1f}s", "tables": ",".join(t.get("tables") or ())} for t in txns]
    out = console()
    if not rows:
        out.print("no running transactions")
        return
    out.print(rows_table(rows, ["id", "snapshot", "age", "state", "rows", "operations", "tables"]))
    out.print(f"{len(rows)} running transaction(s)")


@txn.command("kill")
@click.argument("txn_id", metavar="ID")
@json_option("Print the replica's answer as one JSON object.")
@replica_option
def txn_kill(txn_id: str, as_json: bool, replica: str) -> None:
    """Abort running transaction ID (its parts are removed; its commit will fail)."""

    def show(result: dict) -> None:
        state = result.get("state", "?") if isinstance(result, dict) else "?"
        reason = result.get("reason", "") if isinstance(result, dict) else ""
        say(f"transaction {escape(txn_id)}: {state}" + (f" ({escape(reason)})" if reason else ""))

    answer(replica, lambda client: client.kill(txn_id), show, as_json)
