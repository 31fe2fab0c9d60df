"""``mergetxn status``: the cluster's health, from ZooKeeper and every replica
(mergetxn/tools/status.py gathers it); the exit code makes it a health check."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mergetxn.cli.options import (
    credentials_option,
    json_option,
    repeatable,
    shown,
    timeout_option,
    zookeeper_access,
    zookeeper_location,
)
from mergetxn.cli.output import (
    EXIT_OK,
    EXIT_UNHEALTHY,
    call_timeout,
    connected,
    console,
    echo_json,
    rows_table,
    working,
)


@click.command(short_help="Check the cluster's health (exit code 1 when unhealthy).")
@zookeeper_location("Ask this replica where ZooKeeper is")
@shown(
    "--max-lag-seconds",
    type=click.FloatRange(min=0),
    default=30.0,
    help="A replica behind the log's end for longer is unhealthy.",
)
@repeatable(
    "--ignore-host",
    "ignore",
    metavar="HOST_ID",
    help="A replica retired for good (still registered in ZooKeeper): shown, never unhealthy.",
)
@json_option("Print the whole report as one JSON object.")
@credentials_option("for its replicas and its ZooKeeper nodes.")
@click.option(
    "--no-storage-check",
    "no_storage",
    is_flag=True,
    help="Skip the check that every part file a read may need is in storage (presence and size).",
)
@timeout_option
def status(
    replica: str | None,
    zk_hosts: str | None,
    root: str,
    max_lag_seconds: float,
    ignore: tuple[str, ...],
    as_json: bool,
    credentials: Path | None,
    no_storage: bool,
) -> None:
    """Show the cluster: ZooKeeper's members and their mode; every replica's applied CSN, lag
    behind the log's end (entries and seconds), running transactions and oldest snapshot in use
    (and who holds it); the log's and checkpoints' size; the last cleanup pass.

    Exit code 0 when healthy, 1 when something is not (a ZooKeeper member down, a replica down,
    unreachable, without a ZooKeeper session, stopped at a bad log entry, or lagging more than
    --max-lag-seconds; a part file that a read needs missing or of another size): each problem is
    named, so it serves as a health check.
    """
    from mergetxn.tools.status import gather

    creds = zookeeper_access(replica, zk_hosts, credentials)
    with working("gathering the cluster's status"):
        report = gather(
            replica,
            zk_hosts,
            root,
            call_timeout(),
            max_lag_seconds,
            ignore,
            connect=connected,
            credentials=creds,
            storage=not no_storage,
        )
    if as_json:
        echo_json(report)
    else:
        print_status(report)
    raise SystemExit(EXIT_OK if report["healthy"] else EXIT_UNHEALTHY)


def _bytes(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return ""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _ago(when: Any) -> str:
    return "" if not isinstance(when, (int, float)) else f"{max(0.0, time.time() - when):.0f}s ago"


def _holder(t: dict) -> str:
    """Who holds a running transaction: its user and client session (replicas/sessions.py)."""
    who = f"user {t['owner']}, " if t.get("owner") else ""
    if t.get("session") is None:
        return who + "no client session (only its time limit ends it)"
    return who + f"client session {t['session']} (last heard {t['session_silent_seconds']:.1f}s ago)"


def print_status(report: dict) -> None:
    out = console()
    zk = report["zookeeper"]
    if zk["members"]:
        out.print(
            rows_table(
                [{**m, "mode": m["mode"] or "DOWN"} for m in zk["members"]],
                ["address", "mode", "zxid", "nodes", "connections"],
                title=f"ZooKeeper {escape(str(zk['hosts']))}",
            )
        )
    out.print(_replicas_table(report))
    _print_log_and_transactions(report, out)
    for p in report["problems"]:
        out.print(f"problem: {escape(p)}", style="bold red", soft_wrap=True)
    if report["healthy"]:
        out.print("healthy", style="bold green")
    else:
        out.print(f"UNHEALTHY: {len(report['problems'])} problem(s)", style="bold red")


def _replicas_table(report: dict) -> Table:
    """A row per replica: its state and, when it answered, applied CSN, lag, transactions, WAL."""
    rows = []
    for r in report["replicas"].values():
        row = {"replica": r["host_id"], "address": r.get("address") or "", "state": r["state"]}
        if r["state"] == "ok":
            oldest = r["oldest_snapshot"]
            row.update(
                applied=r["applied_csn"],
                lag=f"{r['lag_entries']} / {r['lag_seconds']:.1f}s",
                running=r["running_transactions"],
                oldest=f"{oldest['snapshot']} ({oldest['holder']})",
                wal=_bytes(r["wal_bytes"]),
                metrics=r.get("metrics_address") or "",
                cleanup=_ago(r["cleanup"].get("last_at")),
            )
        if r.get("ignored"):
            row["state"] += " (ignored)"
        rows.append(row)
    return rows_table(
        rows,
        ["replica", "address", "state", "applied", "lag", "running", "oldest", "wal", "cleanup", "metrics"],
        title="replicas (lag: entries / seconds)",
    )


def _print_log_and_transactions(report: dict, out: Console) -> None:
    """The log's extent, the oldest snapshot in use, long-running and orphaned transactions, last cleanup."""
    lg = report.get("log")
    if lg:
        ck = lg.get("checkpoint")
        checkpoint = f"checkpoint at CSN {ck['csn']} ({_ago(ck.get('time'))})" if ck else "no checkpoint yet"
        out.print(
            f"log: end CSN {lg['end_csn']}, {lg['entries']} entries in {lg['epochs']} epoch(s) in ZooKeeper; "
            f"snapshots below {lg['retained']} trimmed; {checkpoint}; cleanup watermark "
            f"{lg.get('cleanup_watermark')}"
        )
    oldest = report.get("oldest_snapshot")
    if oldest:
        out.print(
            f"oldest snapshot in use: {oldest['snapshot']}, held by {escape(str(oldest['holder']))} on "
            f"{escape(oldest['host'])}; running transactions: {report['running_transactions']}"
        )
    for kind, what in (("long_running", "long-running"), ("orphaned", "orphaned")):
        for t in (report.get("transactions") or {}).get(kind, ()):
            out.print(
                f"{what} transaction {escape(t['id'])} on {escape(t['host'])}: {t['age_seconds']:.0f}s old, "
                f"held by {escape(_holder(t))}",
                soft_wrap=True,
            )
    last = report.get("last_cleanup")
    if last:
        result = (
            f"failed: {last['last_error']}"
            if last.get("last_error")
            else (f"removed {(last.get('last') or {}).get('removed', 0)} files")
        )
        out.print(f"last cleanup: on {escape(last['host'])} {_ago(last['last_at'])}, {escape(result)}")
