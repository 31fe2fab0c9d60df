"""The ``mergetxn`` group itself (``--log-level``, ``--log-file``, ``--version``) and its commands,
each from the module of its group."""

from __future__ import annotations

from pathlib import Path

import click

from coordinator.core.errors import InvalidInput
from mergetxn.cli.backup import backup, restore
from mergetxn.cli.chaos import chaos
from mergetxn.cli.data import changes, history, parts, read, snapshot
from mergetxn.cli.insert import insert
from mergetxn.cli.maintenance import check, compact, gc
from mergetxn.cli.options import file_option
from mergetxn.cli.output import EXIT_CODES, MergetxnGroup
from mergetxn.cli.quickstart import quickstart
from mergetxn.cli.security import security
from mergetxn.cli.servers import replica, zk
from mergetxn.cli.status import status
from mergetxn.cli.tables import table
from mergetxn.cli.transactions import txn
from replicas import logs


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mergetxn")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _exit_codes_epilog() -> str:
    return "\b\nExit codes:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_CODES.items())


def _set_up_logging(ctx: click.Context, spec: str | None, file: Path | None) -> None:
    try:
        logs.configure(spec, file)
    except InvalidInput as exc:
        raise click.BadParameter(exc.message, ctx=ctx, param_hint="--log-level/--log-file") from None


@click.group(cls=MergetxnGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=_exit_codes_epilog())
@click.version_option(_version(), "--version", prog_name="mergetxn", message="%(prog)s %(version)s")
@click.option(
    "--log-level",
    "log_level",
    envvar=logs.ENV_LEVEL,
    default="WARNING",
    show_default=True,
    metavar="LEVEL[,LOGGER=LEVEL...]",
    help="Level of mergetxn's own log lines; other libraries (kazoo, botocore, ...) stay at "
    f"WARNING unless named, e.g. INFO,kazoo=DEBUG (env {logs.ENV_LEVEL}).",
)
@file_option(
    "--log-file",
    "log_file",
    envvar=logs.ENV_FILE,
    help=f"Append log lines to this file instead of stderr (env {logs.ENV_FILE}).",
)
@click.pass_context
def cli(ctx: click.Context, log_level: str, log_file: Path | None) -> None:
    """mergetxn: transactions for replicated MergeTree-style tables.

    Start with `mergetxn quickstart` to see it work on this machine. Client commands talk to
    one replica: pass --replica host:port or set MERGETXN_REPLICA. `mergetxn status` checks a
    whole cluster (its exit code makes it a health check).
    """
    _set_up_logging(ctx, log_level, log_file)


for _command in (
    zk,
    replica,
    table,
    insert,
    read,
    parts,
    compact,
    gc,
    check,
    backup,
    restore,
    history,
    changes,
    snapshot,
    status,
    txn,
    quickstart,
    chaos,
    security,
):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    """Console script entry point (``mergetxn``)."""
    cli.main(args=argv, prog_name="mergetxn")
