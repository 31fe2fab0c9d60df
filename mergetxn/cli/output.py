"""What every command shares: how it talks to a replica and what it prints.

A client command is one shape, :func:`answer`: connect to ``--replica`` (within ``--timeout``),
make one call with the client, print the result as JSON (``--json``) or for a terminal. Every
error ends the command in :class:`MergetxnGroup` with one red line ``error: <message>`` on stderr
and the exit code of its kind (:data:`EXIT_CODES`, :func:`exit_code`), never a traceback.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar
from urllib.parse import urlsplit, urlunsplit

import click
import pyarrow as pa
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from coordinator.core import errors
from coordinator.core.errors import MergetxnError
from mergetxn.tools.jsonrows import json_value

if TYPE_CHECKING:
    from mergetxn.client.client import Client

log = logging.getLogger("mergetxn.cli")
T = TypeVar("T")

DEFAULT_TIMEOUT = 10.0  # seconds a replica has to answer: a port that accepts and never answers fails fast
WORK_TIMEOUT = 600.0  # compact, gc, check, backup, restore: how long the work may take once the replica answered

# Exit codes, distinct per kind of failure (the guide's reference lists them).
EXIT_OK = 0
EXIT_UNHEALTHY = 1  # status: something is unhealthy; chaos: findings
EXIT_USAGE = 2  # bad arguments or input (click's usage errors too); nothing was changed
EXIT_NOT_FOUND = 3  # no such table, snapshot not (or no longer) available
EXIT_CONFLICT = 4  # the transaction lost a conflict: retrying it is safe
EXIT_UNAVAILABLE = 5  # a replica, ZooKeeper or storage could not be reached, did not answer or refused
EXIT_AUTH = 6  # authentication failed
EXIT_ABORTED = 7  # the transaction was aborted (killed, past a limit, session lost)
EXIT_CORRUPT = 8  # a part file or log entry does not match what was written
EXIT_DENIED = 9  # permission denied: the user's role or grants do not allow it (or a quota is reached)
EXIT_INTERNAL = 70  # anything unexpected (a bug): run again with --log-level DEBUG for the traceback
EXIT_INTERRUPTED = 130
EXIT_ERROR = EXIT_USAGE  # what fail() ends with unless told

EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_UNHEALTHY: "unhealthy (status) or findings (chaos)",
    EXIT_USAGE: "usage error or invalid input; nothing was changed",
    EXIT_NOT_FOUND: "not found: no such table or transaction, or the snapshot is not available",
    EXIT_CONFLICT: "conflict: another transaction committed first; retrying is safe",
    EXIT_UNAVAILABLE: "unavailable: a replica or ZooKeeper did not answer (in --timeout), storage refused, "
    "or a partition holds too many parts (try again later)",
    EXIT_AUTH: "authentication failed",
    EXIT_ABORTED: "the transaction was aborted",
    EXIT_CORRUPT: "corrupt data: a part, log entry or backup does not match what was written",
    EXIT_DENIED: "permission denied: the user's role or grants do not allow it, or its quota is reached",
    EXIT_INTERNAL: "internal error (a bug); --log-level DEBUG shows the traceback",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}

_CODE_OF: tuple[tuple[type[BaseException], int], ...] = (
    (errors.PermissionDenied, EXIT_DENIED),
    (errors.ConflictError, EXIT_CONFLICT),
    (errors.TableNotFound, EXIT_NOT_FOUND),
    (errors.TransactionNotFound, EXIT_NOT_FOUND),
    (errors.SnapshotUnavailable, EXIT_NOT_FOUND),
    (errors.InvalidInput, EXIT_USAGE),
    (errors.ReplicaUnavailable, EXIT_UNAVAILABLE),
    (errors.StorageError, EXIT_UNAVAILABLE),  # storage refused (disk full, read-only): as a raw OSError
    (errors.TooManyParts, EXIT_UNAVAILABLE),  # a partition holds too many parts: again after merges
    (errors.TransactionAborted, EXIT_ABORTED),
    (errors.CorruptPart, EXIT_CORRUPT),
    (errors.CorruptMetadata, EXIT_CORRUPT),
)


def exit_code(exc: BaseException) -> int:
    """The exit code for an error a command ended with (see :data:`EXIT_CODES`)."""
    if any(c.__name__ == "AuthenticationFailed" for c in type(exc).__mro__):
        return EXIT_AUTH
    return next((code for cls, code in _CODE_OF if isinstance(exc, cls)), EXIT_INTERNAL)


# -- the console ---------------------------------------------------------------------------------


class _Console(Console):
    """rich's console, except that a closed pipe is left to :class:`MergetxnGroup` (rich's own
    handling exits with status 1)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def console(stderr: bool = False) -> Console:
    """A console for this invocation (``sys.stdout`` may be swapped by tests). Wide when not a
    terminal so piped tables are not folded into unreadable columns."""
    stream = sys.stderr if stderr else sys.stdout
    width = None
    if not stream.isatty():
        width = int(os.environ.get("COLUMNS") or 0) or 200
    return _Console(stderr=stderr, width=width, highlight=False)


def redact(url: str) -> str:
    """A URL or address without its password (storage URLs may carry credentials)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.password is None and "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    user = parts.username or ""
    netloc = f"{user}:***@{host}" if user else f"***@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def print_error(message: str) -> None:
    """One red line on stderr; ``soft_wrap`` keeps it one line however long."""
    console(stderr=True).print(f"error: {escape(message)}", style="bold red", soft_wrap=True)


def fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    """End the command with a clear error (exit code 2 unless told)."""
    print_error(message)
    raise SystemExit(code)


def say(text: str, stderr: bool = False, soft_wrap: bool = False) -> None:
    """A line of rich markup for a terminal (on stderr when the data itself goes to stdout;
    ``soft_wrap``: never folded, however long)."""
    console(stderr=stderr).print(text, soft_wrap=soft_wrap)


class MergetxnGroup(click.Group):
    """A click group that ends every error with one red line and its exit code
    (:func:`exit_code`): mergetxn errors by kind, anything else as internal (70), its traceback
    only in the log at DEBUG."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a reader that went away shows here at the latest, handled below
            return result
        except BrokenPipeError:  # output piped into `head`, which has what it wanted: no error
            _discard_stdout()
            ctx.exit(EXIT_OK)
        except (click.exceptions.Exit, click.Abort, click.ClickException):
            raise
        except MergetxnError as exc:
            log.debug("command failed", exc_info=True)
            print_error(exc.message)
            ctx.exit(exit_code(exc))
        except KeyboardInterrupt:
            print_error("interrupted")
            ctx.exit(EXIT_INTERRUPTED)
        except Exception as exc:
            log.debug("command failed unexpectedly", exc_info=True)
            code = EXIT_UNAVAILABLE if isinstance(exc, OSError) else EXIT_INTERNAL  # storage, network
            print_error(f"{type(exc).__name__}: {exc}")
            ctx.exit(code)


def _discard_stdout() -> None:
    """Point stdout at /dev/null after its reader closed the pipe, so that nothing written or
    flushed later (at exit too) fails again (Python's recipe for SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a file (a test's capture)
        pass


# -- tables and JSON -------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def arrow_table(data: pa.Table, title: str | None = None, limit: int | None = None) -> Table:
    """A rich table of the first ``limit`` rows of an Arrow table."""
    out = Table(title=title, title_justify="left")
    for f in data.schema:
        numeric = pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type)
        out.add_column(f.name, justify="right" if numeric else "left", overflow="fold")
    shown = data if limit is None else data.slice(0, limit)
    for row in shown.to_pylist():
        out.add_row(*(_cell(row[n]) for n in data.column_names))
    return out


def rows_table(rows: Sequence[dict], columns: list[str], title: str | None = None) -> Table:
    """A rich table of ``columns`` of ``rows`` (dicts; a missing key is an empty cell)."""
    out = Table(title=title, title_justify="left")
    for c in columns:
        out.add_column(c, overflow="fold")
    for r in rows:
        out.add_row(*(_cell(r.get(c)) for c in columns))
    return out


def echo_json(value: Any) -> None:
    """One JSON document on stdout (what ``--json`` prints)."""
    click.echo(json.dumps(value, default=json_value))


# -- progress on stderr ----------------------------------------------------------------------------


@contextmanager
def working(description: str) -> Iterator[None]:
    """A spinner on stderr while the block runs (nothing when stderr is not a terminal)."""
    err = console(stderr=True)
    if not err.is_terminal:
        yield
        return
    with err.status(escape(description) + "...", spinner="dots"):
        yield


@contextmanager
def progress(description: str, total: float | None) -> Iterator[Callable[[float], None]]:
    """A progress bar on stderr (rows, out of ``total`` when known) while the block runs; nothing
    when stderr is not a terminal, so scripts and logs see only the result. Yields ``advance``."""
    err = console(stderr=True)
    if not err.is_terminal:
        yield lambda n: None
        return
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = [
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f}" + (f" of {total:,.0f}" if total else "") + " rows"),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(escape(description), total=total)
        yield lambda n: bar.advance(task, n)


# -- a replica ----------------------------------------------------------------------------------


def call_timeout() -> float:
    """This command's ``--timeout``."""
    ctx = click.get_current_context(silent=True)
    return (ctx.meta.get("mergetxn.timeout") if ctx else None) or DEFAULT_TIMEOUT


def long_timeout() -> float:
    """How long compact, gc, check, backup and restore wait for the work, once the replica
    answered within --timeout."""
    return max(call_timeout(), WORK_TIMEOUT)


@contextmanager
def connected(address: str, timeout: float | None = None) -> Iterator[Client]:
    """A client of the replica at ``address`` (this command's --timeout and --credentials),
    closed on the way out."""
    from mergetxn.client.client import Client

    ctx = click.get_current_context(silent=True)
    client = Client(
        address,
        timeout=timeout or call_timeout(),
        long_calls={},  # --timeout bounds each request
        credentials=ctx.meta.get("mergetxn.credentials") if ctx else None,
    )
    log.debug("connected to replica %s at %s", client.host_id, address)
    try:
        yield client
    finally:
        client.close()


def ask(replica: str, call: Callable[[Client], T], work: str | None = None) -> T:
    """``call`` with a client of ``replica``; its result. ``work``: the call is work that may
    take long (a spinner says ``work``): the replica answers within --timeout first, then the
    work may take :func:`long_timeout`."""
    if work is None:
        with connected(replica) as client:
            return call(client)
    with connected(replica):  # answers within --timeout: then the work may take its time
        pass
    with working(work), connected(replica, long_timeout()) as client:
        return call(client)


def answer(
    replica: str,
    call: Callable[[Client], T],
    show: Callable[[T], object],
    as_json: bool = False,
    data: Callable[[T], Any] | None = None,
    lines: bool = False,
    work: str | None = None,
) -> T:
    """A client command's one shape: ``call`` with a client of ``replica`` (:func:`ask`), then
    the result printed: ``as_json``, as JSON (``data`` of it, if given; ``lines``: one object per
    line of a list), else by ``show``. Its errors end the command in :class:`MergetxnGroup`, one
    line and the exit code of their kind. Returns the result."""
    result = ask(replica, call, work)
    if not as_json:
        show(result)
        return result
    value: Any = result if data is None else data(result)
    for item in value if lines else [value]:
        echo_json(item)
    return result
