"""``mergetxn quickstart``: mergetxn at work on an embedded cluster (mergetxn/tools/quickstart.py)."""

from __future__ import annotations

from pathlib import Path

import click

from mergetxn.cli.options import directory_option
from mergetxn.cli.output import console


@click.command(short_help="See mergetxn work on an embedded cluster.")
@directory_option(
    "--workdir",
    help="Directory for ZooKeeper, replicas and storage (must be empty; default: a temp dir).",
)
@click.option("--keep", is_flag=True, help="Keep the working directory (data and logs) afterwards.")
def quickstart(workdir: Path | None, keep: bool) -> None:
    """Start an embedded cluster (ZooKeeper + 3 replicas), run a short workload that shows
    transactions, conflicts, rebased retries, multi-table commits, snapshot reads, time travel
    and a Spark job writing two tables in one transaction, print a summary, and stop everything.
    Exit code 0 only if every step behaved."""
    from mergetxn.tools.quickstart import run

    raise SystemExit(run(workdir, keep, console()))
