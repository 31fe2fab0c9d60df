"""Maintenance now rather than in the background: ``compact`` a table, one ``gc`` pass, and
``check`` storage against the log (``--repair`` mends what can be mended)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape

from coordinator.core.errors import InvalidInput
from mergetxn.cli.options import json_option, repeatable, replica_option, shown
from mergetxn.cli.output import EXIT_CORRUPT, answer, connected, console, fail, long_timeout, rows_table, working
from mergetxn.cli.parsing import partition_values

if TYPE_CHECKING:
    from mergetxn.client.client import Client


@click.command(short_help="Compact a table now.")
@click.argument("table_name", metavar="TABLE")
@shown(
    "--kind",
    type=click.Choice(["minor", "major"]),
    default="minor",
    help="minor merges small parts; major rewrites every part of a partition.",
)
@repeatable(
    "--partition",
    "partitions",
    metavar="VALUE",
    help="Only this partition (repeatable; several partition columns: a JSON list).",
)
@json_option("Print the outcome as one JSON object.")
@replica_option
def compact(table_name: str, kind: str, partitions: tuple[str, ...], as_json: bool, replica: str) -> None:
    """Compact TABLE now, as a transaction of its own.

    The replica has --timeout to answer; the compaction itself may then take up to 10 minutes
    (or --timeout, if longer)."""

    def run(client: Client) -> dict[str, Any]:
        before = client.parts(table_name).to_pylist()
        values = partition_values(client, table_name, partitions)
        started = time.monotonic()
        with working(f"compacting {table_name} ({kind})"), connected(replica, long_timeout()) as slow:
            csn = slow.compact(table_name, kind=kind, partitions=values)
        elapsed = time.monotonic() - started
        return _compacted(table_name, kind, csn, before, client.parts(table_name).to_pylist(), elapsed)

    answer(replica, run, _show_compacted, as_json, data=lambda r: r | {"seconds": round(r["seconds"], 3)})


def _compacted(table: str, kind: str, csn: int, before: list[dict], after: list[dict], seconds: float) -> dict:
    """What a compaction did, from the table's parts before and after it."""
    seen = {r["name"] for r in before}
    return {
        "table": table,
        "kind": kind,
        "csn": csn,
        "merged": sum(1 for r in after if r["removal_csn"] == csn),
        "into": sum(1 for r in after if r["name"] not in seen and r["creation_csn"] == csn),
        "visible_before": sum(1 for r in before if r["visible"]),
        "visible_after": sum(1 for r in after if r["visible"]),
        "seconds": seconds,
    }


def _show_compacted(r: dict) -> None:
    out, table, kind = console(), escape(r["table"]), r["kind"]
    if r["merged"] == 0 and r["into"] == 0:
        out.print(f"nothing to compact in {table} ({kind}); {r['visible_after']} visible parts ({r['seconds']:.2f}s)")
        return
    out.print(
        f"compacted {table} ({kind}): {r['merged']} parts merged into {r['into']}; "
        f"visible parts {r['visible_before']} -> {r['visible_after']}; committed at CSN {r['csn']} ({r['seconds']:.2f}s)"
    )


@click.command(short_help="Run one garbage-collection pass.")
@click.option(
    "--grace-seconds",
    type=float,
    default=None,
    help="Keep unreferenced files younger than this (default: the replica's setting).",
)
@json_option("Print the whole report as JSON.")
@replica_option
def gc(grace_seconds: float | None, as_json: bool, replica: str) -> None:
    """Run one garbage-collection pass now and show what was removed and kept, and why.

    The replica has --timeout to answer; the pass itself may then take up to 10 minutes (or
    --timeout, if longer)."""
    answer(replica, lambda client: client.gc(grace_seconds=grace_seconds), _show_gc, as_json, work="collecting garbage")


def _show_gc(result: dict) -> None:
    out = console()
    cols = ["table", "path", "reason"]
    if result["removed"]:
        out.print(rows_table(result["removed"], cols, title="removed"))
    if result["kept"]:
        out.print(rows_table(result["kept"], cols, title="kept"))
    in_use = ", ".join(f"{s['snapshot']} ({s['holder']} on {s['host']})" for s in result["snapshots_in_use"][:5])
    out.print(
        f"removed {len(result['removed'])} files, kept {len(result['kept'])} "
        f"({result.get('kept_for_window', 0)} for tables' retention windows); oldest snapshot in use "
        f"{result['min_snapshot']} [{escape(in_use)}]; parts removed at or before CSN "
        f"{result['watermark']} and past their table's window are gone ({result['seconds']:.2f}s)"
    )


@click.command(short_help="Check storage against the log (every part file present and as committed).")
@click.argument("tables", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Every table (the default when no TABLE is given).")
@click.option("--quick", is_flag=True, help="Presence and sizes only (no file is read).")
@click.option(
    "--repair",
    is_flag=True,
    help="Rewrite each visible part whose intact file contradicts its metadata from the file's rows, "
    "as one compaction transaction per table.",
)
@json_option("Print the whole report as JSON.")
@replica_option
def check(tables: tuple[str, ...], every: bool, quick: bool, repair: bool, as_json: bool, replica: str) -> None:
    """Check that every part a read may still need (visible now, or kept for time travel within
    the retention window) is in storage with the size and checksum it was committed with, and
    that its file bears out the rest of its metadata (rows, columns, statistics, partition, key
    summary); TABLES, or every table (--all, or none named). Exit 8 when a file is missing or
    differs, naming each part and what to do: --repair mends a part whose file is intact and whose
    metadata is wrong (a compaction rewrites it from the file's rows); a missing or damaged file
    needs `mergetxn restore` from a backup."""
    if every and tables:
        raise InvalidInput("give TABLE names or --all, not both")
    if repair and quick:
        raise InvalidInput("--repair needs the files read: leave out --quick")
    named = list(tables) or None

    def run(client: Client) -> dict:
        result = client.check(named, checksums=not quick)
        if repair and not result["ok"]:
            from mergetxn.tools.repair import repair as mend

            result["repaired"] = mend(client, result)
            if result["repaired"]:
                result = _after_repair(client.check(named), result["repaired"])
        return result

    result = answer(replica, run, _print_check, as_json, work="checking part files")
    if not result["ok"]:
        found = [f"{t['table']}: {p['problem']}" for t in result["tables"] for p in t["problems"]]
        more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
        fail(
            f"{len(found)} part file(s) missing or not as committed (snapshot {result['snapshot']}): "
            f"{'; '.join(found[:3])}{more}{_check_advice(result)}",
            EXIT_CORRUPT,
        )


def _check_advice(result: dict) -> str:
    """What to do about the problems ``mergetxn check`` found."""
    problems = [p for t in result["tables"] for p in t["problems"]]
    if any(p.get("repairable") and p["visible"] for p in problems):
        return "; run `mergetxn check --repair` to rewrite the parts whose file is intact from their rows"
    if any(p["visible"] for p in problems):
        return "; restore the damaged tables from a backup (`mergetxn restore DIR`)"
    return (
        "; only parts no longer visible (replaced or removed) are affected: snapshots before their removal "
        "cannot be read; cleanup collects them once past the retention window"
    )


def _after_repair(result: dict, repaired: list[dict]) -> dict:
    """The check after a repair: the parts it replaced are no longer problems of the table (they
    stay in storage for the snapshots before the repair until cleanup collects them)."""
    done = {(r["table"], p) for r in repaired for p in r["parts"]}
    tables = [
        {**t, "problems": [p for p in t["problems"] if p["visible"] or (t["table"], p["part"]) not in done]}
        for t in result["tables"]
    ]
    return {**result, "tables": tables, "ok": not any(t["problems"] for t in tables), "repaired": repaired}


def _print_check(result: dict) -> None:
    """The report of ``mergetxn check`` (and what --repair committed)."""
    out = console()
    for r in result.get("repaired", ()):
        out.print(
            f"repaired {escape(r['table'])}: {len(r['parts'])} part(s) rewritten from their files at CSN {r['csn']}"
        )
    problems = [{"table": t["table"], **p} for t in result["tables"] for p in t["problems"]]
    if problems:
        out.print(rows_table(problems, ["table", "part", "problem"], title="problems"))
    for t in result["tables"]:
        state = "ok" if not t["problems"] else f"{len(t['problems'])} problem(s)"
        out.print(f"{escape(t['table'])}: {t['parts']} parts, {t['bytes']} bytes: {state}")
    ok = sum(1 for t in result["tables"] if not t["problems"])
    out.print(f"{ok} of {len(result['tables'])} table(s) ok at snapshot {result['snapshot']}")
