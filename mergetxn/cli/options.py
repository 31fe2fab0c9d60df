"""The options several commands share: where the replica or ZooKeeper is, how long it has to
answer, and a secured cluster's credentials."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from mergetxn.cli.output import DEFAULT_TIMEOUT

if TYPE_CHECKING:
    from coordinator.wire.security import Credentials

ENV_REPLICA = "MERGETXN_REPLICA"
ENV_TIMEOUT = "MERGETXN_TIMEOUT"
ENV_CREDENTIALS = "MERGETXN_CREDENTIALS"

F = TypeVar("F", bound=Callable[..., Any])


def _keep(key: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """An option callback that keeps the value in the context's meta under ``key`` (where
    :func:`mergetxn.cli.output.connected` looks)."""

    def keep(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        ctx.meta[key] = value
        return value

    return keep


def timeout_option(f: F) -> F:
    """``--timeout``: how long a replica (or ZooKeeper) has to answer; kept in the context."""
    return click.option(
        "--timeout",
        type=click.FloatRange(min=0, min_open=True),
        envvar=ENV_TIMEOUT,
        default=DEFAULT_TIMEOUT,
        show_default=True,
        expose_value=False,
        callback=_keep("mergetxn.timeout"),
        metavar="SECONDS",
        help=f"Seconds to wait for a replica to connect and answer each request (env {ENV_TIMEOUT}).",
    )(f)


def replica_option(f: F) -> F:
    """``--replica`` (required), ``--timeout`` and ``--credentials`` of a client command."""
    f = click.option(  # a secured cluster's credentials; connected() reads them from the context
        "--credentials",
        envvar=ENV_CREDENTIALS,
        type=click.Path(dir_okay=False, path_type=Path),
        expose_value=False,
        callback=_keep("mergetxn.credentials"),
        metavar="FILE",
        help=f"The secured cluster's credentials file (default: ${ENV_CREDENTIALS}).",
    )(f)
    return timeout_option(
        click.option(
            "--replica",
            envvar=ENV_REPLICA,
            required=True,
            metavar="HOST:PORT",
            help=f"Replica to talk to (default: ${ENV_REPLICA}).",
        )(f)
    )


def zookeeper_location(replica_help: str) -> Callable[[F], F]:
    """The options of a command that finds ZooKeeper through a replica or is told it directly."""

    def decorate(fn: F) -> F:
        fn = click.option(
            "--root", default="/mergetxn", show_default=True, help="mergetxn's ZooKeeper root node (with --zk)."
        )(fn)
        fn = click.option(
            "--zk",
            "zk_hosts",
            default=None,
            metavar="HOSTS",
            help="ZooKeeper connection string (host:port,...[/chroot]) instead of asking a replica.",
        )(fn)
        return click.option(
            "--replica",
            envvar=ENV_REPLICA,
            default=None,
            metavar="HOST:PORT",
            help=f"{replica_help} (default: ${ENV_REPLICA}).",
        )(fn)

    return decorate


def credentials_option(what_for: str) -> Callable[[F], F]:
    """``--credentials FILE`` of a command that talks to ZooKeeper itself (``what_for`` says why)."""
    return file_option(
        "--credentials",
        envvar=ENV_CREDENTIALS,
        metavar="FILE",
        help=f"A secured cluster's credentials file (default: ${ENV_CREDENTIALS}): {what_for}",
    )


def zookeeper_access(replica: str | None, zk_hosts: str | None, credentials: Path | None) -> Credentials | None:
    """What a command that talks to ZooKeeper itself starts with: the credentials file read (and
    kept where :func:`mergetxn.cli.output.connected` finds them), a usage error unless
    ``--replica`` or ``--zk`` says where to go, and kazoo's own log quiet unless asked for (a
    ZooKeeper that is down is one error line or one problem, not a log)."""
    from coordinator.wire.security import Credentials

    creds = None if credentials is None else Credentials.from_file(credentials)
    click.get_current_context().meta["mergetxn.credentials"] = creds
    if replica is None and zk_hosts is None:
        raise click.UsageError(f"give --replica (or set {ENV_REPLICA}) or --zk")
    kazoo_log = logging.getLogger("kazoo")
    if kazoo_log.level == logging.NOTSET:
        kazoo_log.setLevel(logging.CRITICAL)
    return creds


def json_option(help: str) -> Callable[[F], F]:
    """``--json`` (``as_json``) of a command that prints JSON instead of text; ``help`` says what."""
    return click.option("--json", "as_json", is_flag=True, help=help)


def shown(*decls: str, type: click.ParamType | type, default: Any, help: str) -> Callable[[F], F]:
    """An option of ``type`` whose default its help shows (``show_default``); with ``type=bool``
    and a ``--this/--that`` declaration, a pair of flags."""
    return click.option(*decls, type=type, default=default, show_default=True, help=help)


def repeatable(*decls: str, metavar: str, help: str) -> Callable[[F], F]:
    """An option given any number of times (its values a tuple, empty when it is not given)."""
    return click.option(*decls, multiple=True, metavar=metavar, help=help)


def file_option(*decls: str, help: str, metavar: str | None = None, envvar: str | None = None) -> Callable[[F], F]:
    """An option naming a file: a :class:`~pathlib.Path` (not checked to exist), None when it is
    not given."""
    return click.option(
        *decls, type=click.Path(dir_okay=False, path_type=Path), default=None, metavar=metavar, envvar=envvar, help=help
    )


def directory_option(*decls: str, help: str) -> Callable[[F], F]:
    """An option naming a directory: a :class:`~pathlib.Path` (not checked to exist), None when it
    is not given."""
    return click.option(*decls, type=click.Path(file_okay=False, path_type=Path), default=None, help=help)
