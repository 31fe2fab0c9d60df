"""The ``mergetxn`` command line: run the servers, operate tables, and see the product work.

Servers run in the foreground (``zk start``, ``replica start``) so a process supervisor or a
terminal owns them. Client commands talk to one replica (``--replica host:port`` or
``MERGETXN_REPLICA``) and wait ``--timeout`` seconds at most for it to answer. Every error ends
the command with one red line ``error: <message>`` on stderr and an exit code that says which
kind of error it was (:data:`EXIT_CODES`), never a traceback (unless ``--log-level DEBUG``): an
operator should see what was wrong, not where in the code it was found.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import click
import pyarrow as pa
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from coordinator.core import errors
from coordinator.core.conflicts import Policy
from coordinator.core.errors import InvalidInput, MergetxnError, quote
from coordinator.model.users import check_name as check_user_name
from mergetxn.tools.jsonrows import json_value
from mergetxn.tools.jsonrows import stream as json_stream
from replicas import logs
from replicas.settings import click_options

if TYPE_CHECKING:
    from mergetxn.chaos.run import Result

log = logging.getLogger(__name__)

ENV_REPLICA = "MERGETXN_REPLICA"
ENV_TIMEOUT = "MERGETXN_TIMEOUT"
DEFAULT_TIMEOUT = 10.0  # seconds a replica has to answer: a port that accepts and never answers fails fast
WORK_TIMEOUT = 600.0  # compact and gc: how long the work may take once the replica answered

# Exit codes, distinct per kind of failure (README "Command line" lists them).
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


def exit_code(exc: BaseException) -> int:
    """The exit code for an error a command ended with (see :data:`EXIT_CODES`)."""
    # By name: coordinator.core.errors may not have this class yet (the security work adds it).
    if any(c.__name__ == "AuthenticationFailed" for c in type(exc).__mro__):
        return EXIT_AUTH
    for cls, code in (
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
    ):
        if isinstance(exc, cls):
            return code
    return EXIT_INTERNAL


# ---------------------------------------------------------------------------------------------
# Output helpers


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


def fail(message: str, code: int = EXIT_ERROR) -> None:
    """End the command with a clear error (exit code 2 unless told)."""
    print_error(message)
    raise SystemExit(code)


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


def rows_table(rows: list[dict], columns: list[str], title: str | None = None) -> Table:
    out = Table(title=title, title_justify="left")
    for c in columns:
        out.add_column(c, overflow="fold")
    for r in rows:
        out.add_row(*(_cell(r.get(c)) for c in columns))
    return out


# ---------------------------------------------------------------------------------------------
# Parsing


_TYPES: dict[str, Callable[[], pa.DataType]] = {
    "int8": pa.int8,
    "int16": pa.int16,
    "int32": pa.int32,
    "int64": pa.int64,
    "uint8": pa.uint8,
    "uint16": pa.uint16,
    "uint32": pa.uint32,
    "uint64": pa.uint64,
    "int": pa.int64,
    "long": pa.int64,
    "float16": pa.float16,
    "float32": pa.float32,
    "float64": pa.float64,
    "float": pa.float32,
    "double": pa.float64,
    "string": pa.string,
    "utf8": pa.string,
    "str": pa.string,
    "large_string": pa.large_string,
    "binary": pa.binary,
    "large_binary": pa.large_binary,
    "bool": pa.bool_,
    "boolean": pa.bool_,
    "date32": pa.date32,
    "date": pa.date32,
    "date64": pa.date64,
}
_PARAM_TYPE = re.compile(r"^(timestamp|decimal128|decimal|time64|time32)\s*[\[(](.*)[\])]$", re.I)


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets, so ``timestamp[us, UTC]`` stays one item."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


def parse_type(text: str) -> pa.DataType:
    """``int64``, ``string``, ``date32``, ``timestamp[us]``, ``timestamp[us, UTC]``,
    ``decimal128(10, 2)``, ``list<int64>``..."""
    t = text.strip()
    if t.lower() in _TYPES:
        return _TYPES[t.lower()]()
    m = _PARAM_TYPE.match(t)
    if m:
        kind, args = m.group(1).lower(), [a.strip() for a in m.group(2).split(",") if a.strip()]
        try:
            if kind == "timestamp" and 1 <= len(args) <= 2:
                return pa.timestamp(args[0].lower(), tz=args[1] if len(args) == 2 else None)
            if kind in ("decimal", "decimal128") and len(args) == 2:
                return pa.decimal128(int(args[0]), int(args[1]))
            if kind in ("time32", "time64") and len(args) == 1:
                return getattr(pa, kind)(args[0].lower())
        except (ValueError, TypeError, pa.ArrowException) as exc:
            raise InvalidInput(f"bad type {text!r}: {exc}") from None
    m = re.match(r"^list\s*<(.*)>$", t, re.I)
    if m:
        return pa.list_(parse_type(m.group(1)))
    known = ", ".join(sorted(_TYPES)) + ", timestamp[unit(, tz)], decimal128(p, s), list<type>"
    raise InvalidInput(f"unknown column type {text.strip()!r}; known types: {known}")


def parse_schema(text: str) -> pa.Schema:
    """``"id:int64,name:string,day:date32"``; append ``!`` or `` not null`` to a type for a
    column that may not hold nulls (``id:int64!``)."""
    fields = []
    for item in _split_top(text):
        item = item.strip()
        if not item:
            continue
        if ":" not in item:
            raise InvalidInput(f"schema item {item!r} must be name:type (e.g. id:int64)")
        name, type_text = (s.strip() for s in item.split(":", 1))
        nullable = True
        if type_text.endswith("!"):
            type_text, nullable = type_text[:-1], False
        elif type_text.lower().endswith(" not null"):
            type_text, nullable = type_text[: -len(" not null")], False
        fields.append(pa.field(name, parse_type(type_text), nullable=nullable))
    if not fields:
        raise InvalidInput("schema is empty; give name:type pairs, e.g. 'id:int64,name:string'")
    return pa.schema(fields)


def parse_as_of(text: str) -> dt.datetime:
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidInput(f"--as-of {text!r} is not an ISO 8601 date-time") from None
    if when.tzinfo is None or when.utcoffset() is None:
        raise InvalidInput(f"--as-of {text!r} has no timezone; add one, e.g. {text.strip()}+00:00 or Z")
    return when


def partition_values(client: Any, table: str, values: tuple[str, ...]) -> list[Any] | None:
    """CLI partition strings as the typed values a table's partition columns hold (integers and
    booleans as such; dates and strings as text, which is how partition values are keyed).
    Several partition columns: a JSON list (``'["2024-01-01", 3]'``) or comma-separated values."""
    if not values:
        return None
    tdef = client.table(table)
    cols = list(tdef.partition_by)
    if not cols:
        raise InvalidInput(f"table {table!r} is not partitioned; --partition does not apply")

    def typed(col: str, raw: Any) -> Any:
        if not isinstance(raw, str):
            return raw
        t = tdef.schema.field(col).type
        try:
            if pa.types.is_integer(t):
                return int(raw)
            if pa.types.is_boolean(t):
                if raw.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(raw)
                return raw.lower() in ("true", "1")
        except ValueError:
            raise InvalidInput(f"partition value {raw!r} does not fit column {col!r} ({t})") from None
        return raw

    out = []
    for v in values:
        if len(cols) == 1:
            out.append(typed(cols[0], v))
            continue
        try:
            items = json.loads(v) if v.strip().startswith("[") else [s.strip() for s in v.split(",")]
        except ValueError:
            raise InvalidInput(f"partition {v!r} is not a JSON list") from None
        if len(items) != len(cols):
            raise InvalidInput(f"partition {v!r} needs {len(cols)} values for columns {cols}")
        out.append(tuple(typed(c, x) for c, x in zip(cols, items)))
    return out


CSV_BLOCK_BYTES = 4 << 20


def file_batches(path: Path, schema: pa.Schema, batch_rows: int) -> tuple[int | None, Iterator[pa.Table]]:
    """A Parquet or CSV file as tables of about ``batch_rows`` rows, read as they are asked for
    (never the whole file in memory), and its row count when the file says (Parquet). CSV
    columns are parsed with the table's types."""
    suffixes = [s.lower() for s in path.suffixes]
    try:
        if suffixes and suffixes[-1] in (".parquet", ".pq", ".parq"):
            import pyarrow.parquet as pq

            pf = pq.ParquetFile(path)

            def parquet() -> Iterator[pa.Table]:
                for batch in pf.iter_batches(batch_size=batch_rows):
                    yield pa.Table.from_batches([batch])

            return pf.metadata.num_rows, _reading(path, parquet())
        if ".csv" in suffixes or ".tsv" in suffixes:
            import pyarrow.csv as pcsv

            delimiter = "\t" if ".tsv" in suffixes else ","
            types = {f.name: f.type for f in schema}
            reader = pcsv.open_csv(
                path,
                read_options=pcsv.ReadOptions(block_size=CSV_BLOCK_BYTES),
                parse_options=pcsv.ParseOptions(delimiter=delimiter),
                convert_options=pcsv.ConvertOptions(column_types=types, strings_can_be_null=True),
            )

            def csv() -> Iterator[pa.Table]:
                pending: list[pa.RecordBatch] = []
                have = 0
                for batch in reader:
                    pending.append(batch)
                    have += batch.num_rows
                    if have >= batch_rows:
                        yield pa.Table.from_batches(pending)
                        pending, have = [], 0
                if pending:
                    yield pa.Table.from_batches(pending)

            return None, _reading(path, csv())
    except (pa.ArrowException, OSError) as exc:
        raise InvalidInput(f"cannot read {path}: {exc}") from None
    raise InvalidInput(f"cannot tell the format of {path}: use a .parquet or .csv file")


def _reading(path: Path, tables: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """``tables`` with a read error anywhere in the file reported as bad input."""
    try:
        yield from tables
    except (pa.ArrowException, OSError) as exc:
        raise InvalidInput(f"cannot read {path}: {exc}") from None


def echo_json(value: Any) -> None:
    """One JSON document on stdout (what ``--json`` prints)."""
    click.echo(json.dumps(value, default=json_value))


def long_timeout() -> float:
    """How long compact and gc wait for the work, once the replica answered within --timeout."""
    return max(call_timeout(), WORK_TIMEOUT)


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


# ---------------------------------------------------------------------------------------------
# Commands


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
@click.option(
    "--log-file",
    "log_file",
    envvar=logs.ENV_FILE,
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
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


def replica_option(f: Callable) -> Callable:
    f = click.option(  # a secured cluster's credentials; connected() reads them from the context
        "--credentials",
        envvar="MERGETXN_CREDENTIALS",
        type=click.Path(dir_okay=False, path_type=Path),
        expose_value=False,
        callback=lambda ctx, param, value: ctx.meta.__setitem__("mergetxn.credentials", value),
        metavar="FILE",
        help="The secured cluster's credentials file (default: $MERGETXN_CREDENTIALS).",
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


def timeout_option(f: Callable) -> Callable:
    """``--timeout``: how long a replica (or ZooKeeper) has to answer; kept in the context."""

    def keep(ctx: click.Context, param: click.Parameter, value: float) -> float:
        ctx.meta["mergetxn.timeout"] = value
        return value

    return click.option(
        "--timeout",
        type=click.FloatRange(min=0, min_open=True),
        envvar=ENV_TIMEOUT,
        default=DEFAULT_TIMEOUT,
        show_default=True,
        expose_value=False,
        callback=keep,
        metavar="SECONDS",
        help=f"Seconds to wait for a replica to connect and answer each request (env {ENV_TIMEOUT}).",
    )(f)


def call_timeout() -> float:
    """This command's ``--timeout``."""
    ctx = click.get_current_context(silent=True)
    return (ctx.meta.get("mergetxn.timeout") if ctx else None) or DEFAULT_TIMEOUT


@contextmanager
def connected(address: str, timeout: float | None = None) -> Iterator[Any]:
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


@contextmanager
def stop_signals() -> Iterator[threading.Event]:
    """An event set on SIGINT/SIGTERM, so foreground servers stop cleanly either way."""
    stop = threading.Event()
    previous = {}

    def handler(signum: int, frame: Any) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, handler)
    try:
        yield stop
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


# -- servers -----------------------------------------------------------------------------------


@cli.group()
def zk() -> None:
    """Run an embedded ZooKeeper server."""


@zk.command("start")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".mergetxn") / "zookeeper",
    show_default=True,
    help="Data and log directory (kept across restarts).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Client port of a standalone server (default: a free one).",
)
@click.option(
    "--id",
    "myid",
    type=click.IntRange(1, 255),
    default=None,
    help="Run member N (1-based myid) of the ensemble given by --members instead of a standalone server.",
)
@click.option(
    "--members",
    default=None,
    metavar="H:C:Q:E,...",
    help="Every member of the ensemble in id order, as host:clientPort:quorumPort:electionPort "
    "separated by commas; member --id listens on its own host.",
)
@click.option(
    "--tick-ms",
    type=click.IntRange(10, 60000),
    default=200,
    show_default=True,
    help="ZooKeeper tickTime: sessions may be as short as 2 ticks.",
)
@click.option(
    "--credentials",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="A secured cluster's replica credentials file (mergetxn security init): TLS only on the "
    "client port and between members, sessions only for clients presenting a certificate of the "
    "cluster CA (the replicas'), / under the identity's ACL.",
)
def zk_start(
    directory: Path,
    port: int | None,
    myid: int | None,
    members: str | None,
    tick_ms: int,
    credentials: Path | None,
) -> None:
    """Run a real ZooKeeper server (from the pyspark jars, Java 17) in the foreground: a
    standalone server, or with --id and --members one member of an ensemble.

    Prints READY <host:port> once it serves (a member: once it has joined a quorum); Ctrl-C or
    SIGTERM stops it cleanly.
    """
    from coordinator.wire.security import Credentials

    creds = None if credentials is None else Credentials.from_file(credentials)
    if myid is None and members is None:
        _zk_standalone(directory, port, tick_ms, creds)
        return
    if myid is None or members is None:
        fail("--id and --members go together: give both to run a member of an ensemble")
    if port is not None:
        fail("--port is for a standalone server; a member's client port comes from --members")
    _zk_member(directory, myid, members, tick_ms, creds)


def _zk_standalone(directory: Path, port: int | None, tick_ms: int, creds: Any = None) -> None:
    from mergetxn.local.zkserver import ZooKeeperServer

    server = ZooKeeperServer(directory, port=port or None, tick_ms=tick_ms, credentials=creds)
    out = console()
    with stop_signals() as stop:
        try:
            address = server.start()
        except (RuntimeError, TimeoutError, OSError) as exc:
            server.stop()
            fail(f"ZooKeeper did not start: {exc}")
        out.print(f"ZooKeeper serving at [bold]{address}[/] (data and logs in {server.workdir})")
        out.print("Ctrl-C stops it.")
        print(f"READY {address}", flush=True)  # the one line a script waits for
        try:
            while not stop.wait(0.5):
                if not server.running:
                    fail(f"ZooKeeper exited unexpectedly; see {server.log_file}")
        finally:
            server.stop()
    out.print("ZooKeeper stopped.")


#: A member's JVM: ZooKeeper holds only metadata here, and a host runs a replica beside it. C1
#: only: a member that restarts (after a crash, a kill by mergetxn chaos) serves again in about
#: half the time on a busy machine, where C2's compiler threads compete with everything else
#: for the cores while the JVM starts; ZooKeeper's work here never needs C2's code.
MEMBER_JVM_FLAGS = ("-Xms16m", "-Xmx192m", "-XX:TieredStopAtLevel=1")


def _zk_member(directory: Path, myid: int, members_text: str, tick_ms: int, creds: Any = None) -> None:
    """One member of an ensemble, in the foreground until SIGTERM/SIGINT. A member without a
    quorum is not an error (its peers may start later): it waits, and says READY once it
    serves."""
    from mergetxn.local.zkserver import ZooKeeperMember, parse_members

    try:
        members = parse_members(members_text)
    except ValueError as exc:
        fail(f"bad --members: {exc}")
    if myid > len(members):
        fail(f"--id {myid} names no member: --members lists {len(members)}")
    member = ZooKeeperMember(directory, myid, members, tick_ms, jvm_flags=MEMBER_JVM_FLAGS, credentials=creds)
    out = console()
    with stop_signals() as stop:
        try:
            member.start(wait=False)
        except (RuntimeError, OSError) as exc:
            member.stop()
            fail(f"ZooKeeper member {myid} did not start: {exc}")
        out.print(
            f"ZooKeeper member {myid} of {len(members)} started at [bold]{member.address}[/] "
            f"(data and logs in {member.workdir}); waiting for a quorum. Ctrl-C stops it."
        )
        sys.stdout.flush()
        serving = False
        try:
            while not stop.wait(0.2):
                if not member.running:
                    fail(f"ZooKeeper member {myid} exited unexpectedly; see {member.log_file}")
                if not serving and member.mode() is not None:
                    serving = True
                    if creds is not None:  # every member does it (idempotent): / under the identity's ACL
                        from mergetxn.local.zkserver import harden_root

                        harden_root(member.address, creds)
                    print(f"READY {member.address}", flush=True)
        finally:
            member.stop()
    out.print(f"ZooKeeper member {myid} stopped.")


@cli.group()
def replica() -> None:
    """Run a replica process."""


def _load_config(ctx: click.Context, param: click.Parameter, path: Path | None) -> Path | None:
    """``--config FILE``: a TOML file of replica settings (names as the flags', with _ or -),
    used as the defaults of the flags; flags and environment variables override it."""
    if path is None:
        return None
    import tomllib

    from replicas.settings import SETTINGS

    try:
        with open(path, "rb") as f:
            values = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}", ctx=ctx, param=param) from None
    by_flag = {s.option[2:]: name for name, s in SETTINGS.items()}
    defaults = {}
    for key, value in values.items():
        name = by_flag.get(key.replace("_", "-"), key.replace("-", "_"))
        if name not in SETTINGS or isinstance(value, (dict, list)):
            known = ", ".join(s.option[2:] for s in SETTINGS.values())
            raise click.BadParameter(f"{path}: unknown replica setting {key!r}; known: {known}", ctx=ctx, param=param)
        defaults[name] = value
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return path


@replica.command("start")
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    is_eager=True,
    expose_value=False,
    callback=_load_config,
    metavar="FILE",
    help='A TOML file of settings (e.g. zk = "h:2181", storage = "s3://b/w", port = 7070); '
    "flags and MERGETXN_* variables override it.",
)
@click_options
def replica_start(**values: Any) -> None:
    """Run a replica in the foreground: follows the CSN log, runs transactions, serves snapshots.

    Prints READY <host:port> once it serves (and METRICS <url> first with --metrics-port);
    Ctrl-C or SIGTERM stops it cleanly, SIGHUP reopens --log-file. Refused (exit 2, nothing
    registered) when a live replica holds --host-id, a port is in use or --storage is not the
    cluster's; exits 5 when ZooKeeper does not answer at --zk within --zk-connect-timeout.
    """
    from coordinator.core.versions import check_host_id
    from replicas.server import run
    from replicas.settings import ReplicaConfig

    host_id = values["host_id"]
    try:
        check_host_id(host_id)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    config = ReplicaConfig(**values)
    console(stderr=True).print(
        f"replica {host_id}: ZooKeeper {redact(config.zk)}, storage {redact(config.storage_url)}, WAL in "
        f"{config.data_dir}",
        soft_wrap=True,
    )
    try:
        run(config)
    except MergetxnError:
        raise
    except Exception as exc:  # e.g. ZooKeeper unreachable: one line, not a traceback
        log.debug("replica failed", exc_info=True)
        fail(f"replica {host_id} failed: {type(exc).__name__}: {exc}", EXIT_UNAVAILABLE)


def _zookeeper_location(replica_help: str) -> Callable[[Callable], Callable]:
    """The options of a command that finds ZooKeeper through a replica or is told it directly."""

    def decorate(fn: Callable) -> Callable:
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


@replica.command("retire")
@click.argument("host_id", metavar="ID")
@_zookeeper_location("Ask this (other) replica where ZooKeeper is")
@click.option(
    "--credentials",
    envvar="MERGETXN_CREDENTIALS",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="A secured cluster's credentials file (default: $MERGETXN_CREDENTIALS): its ZooKeeper "
    "nodes are the replicas' identity's only.",
)
@timeout_option
def replica_retire(
    host_id: str, replica: str | None, zk_hosts: str | None, root: str, credentials: Path | None
) -> None:
    """Retire replica ID for good: `status` stops counting it, and no transaction it began can
    commit any more. Refused (exit 2) for an ID that breaks the host-id rule, while it is alive
    (stop it first) or if no replica ID is registered. Starting a replica with that --host-id
    again registers it anew.
    """
    from coordinator.core.versions import check_host_id
    from coordinator.wire.security import Credentials
    from mergetxn.tools.status import retire

    try:  # before ZooKeeper: an empty id would name the registrations' own node
        check_host_id(host_id)
    except ValueError as exc:
        raise InvalidInput(f"replica retire: {exc}; give the --host-id the replica ran with", host_id=host_id) from None
    creds = None if credentials is None else Credentials.from_file(credentials)
    click.get_current_context().meta["mergetxn.credentials"] = creds  # connected() takes them
    if zk_hosts is None:
        if replica is None:
            raise click.UsageError(f"give --replica (or set {ENV_REPLICA}) or --zk")
        with connected(replica) as client:
            info = client.call("info")
        if "zk" not in info:
            raise click.UsageError(f"replica {replica} tells ZooKeeper's address to admins only: give --zk HOSTS")
        zk_hosts, root = info["zk"], info["root"]
    kazoo_log = logging.getLogger("kazoo")
    if kazoo_log.level == logging.NOTSET:  # not asked for: a ZooKeeper that is down is one error line
        kazoo_log.setLevel(logging.CRITICAL)
    incarnation = retire(zk_hosts, root, host_id, call_timeout(), creds)
    console().print(
        f"replica {host_id} retired (its incarnation {incarnation} is fenced); `mergetxn status` no longer counts it",
        soft_wrap=True,
    )


# -- tables ----------------------------------------------------------------------------------


@cli.group()
def table() -> None:
    """Create, describe, alter, drop and list tables."""


@table.command("create")
@click.argument("name")
@click.option(
    "--schema",
    "schema_text",
    required=True,
    metavar="COLS",
    help='Columns as name:type pairs, e.g. "id:int64,name:string,day:date32" (append ! for NOT NULL).',
)
@click.option(
    "--partition-by",
    multiple=True,
    metavar="COL",
    help="Partition column (repeat for several; a comma list also works).",
)
@click.option(
    "--primary-key", multiple=True, metavar="COL", help="Primary key column (repeatable; a comma list also works)."
)
@click.option(
    "--policy",
    type=click.Choice(["parts", "maxcompute", "append", "keys"]),
    default="parts",
    show_default=True,
    help="Conflict policy for concurrent writers (keys: a keys table, needs --primary-key).",
)
@click.option(
    "--lock-group",
    "lock_group",
    multiple=True,
    metavar="NAME=COL1,COL2",
    help="Keys tables: a lock group and its columns (repeatable).",
)
@click.option(
    "--atomicity",
    type=click.Choice(["full", "none"]),
    default="full",
    show_default=True,
    help="Keys tables: full (transactions) or none (each write on its own).",
)
@click.option(
    "--txn-max-seconds",
    type=float,
    default=None,
    help="Abort a transaction writing this table after this many seconds (keys tables: 60).",
)
@click.option(
    "--txn-max-rows",
    type=int,
    default=None,
    help="Abort a transaction staging more rows than this (keys tables: 100000).",
)
@click.option(
    "--retention-seconds",
    type=float,
    default=None,
    help="Keep snapshots and changes of this table readable this long after a commit replaced what "
    "they saw (default: the replicas' retention_seconds, 3600).",
)
@click.option(
    "--parts-to-delay-insert",
    type=click.IntRange(min=0),
    default=None,
    help="Delay inserts into a partition holding this many visible parts (0: never; default: the replicas' setting, 150).",
)
@click.option(
    "--parts-to-throw-insert",
    type=click.IntRange(min=0),
    default=None,
    help="Refuse inserts into a partition holding this many visible parts (0: never; default: the replicas' setting, 300).",
)
@click.option("--no-auto-merge", is_flag=True, help="Keep background merges away from this table.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as one JSON object.")
@replica_option
def table_create(
    name: str,
    schema_text: str,
    partition_by: tuple[str, ...],
    primary_key: tuple[str, ...],
    policy: str,
    lock_group: tuple[str, ...],
    atomicity: str,
    txn_max_seconds: float | None,
    txn_max_rows: int | None,
    retention_seconds: float | None,
    parts_to_delay_insert: int | None,
    parts_to_throw_insert: int | None,
    no_auto_merge: bool,
    as_json: bool,
    replica: str,
) -> None:
    """Create table NAME."""
    schema = parse_schema(schema_text)
    pby = _column_list(partition_by)
    pkey = _column_list(primary_key)
    groups = _lock_groups(lock_group)
    with connected(replica) as client:
        csn = client.create_table(
            name,
            schema,
            partition_by=pby,
            primary_key=pkey,
            conflict_policy=policy,
            auto_merge=not no_auto_merge,
            lock_groups=groups or None,
            atomicity=atomicity,
            txn_max_seconds=txn_max_seconds,
            txn_max_rows=txn_max_rows,
            retention_seconds=retention_seconds,
            parts_to_delay_insert=parts_to_delay_insert,
            parts_to_throw_insert=parts_to_throw_insert,
        )
    if as_json:
        echo_json(
            {
                "table": name,
                "csn": csn,
                "policy": policy,
                "partition_by": pby,
                "primary_key": pkey,
                "lock_groups": groups,
                "atomicity": atomicity,
                "txn_max_seconds": txn_max_seconds,
                "txn_max_rows": txn_max_rows,
                "retention_seconds": retention_seconds,
                "parts_to_delay_insert": parts_to_delay_insert,
                "parts_to_throw_insert": parts_to_throw_insert,
            }
        )
        return
    extra = f", partitioned by {', '.join(pby)}" if pby else ""
    console().print(f"created table [bold]{escape(name)}[/] (policy {policy}{extra}) at CSN {csn}")


def _column_list(options: tuple[str, ...]) -> list[str]:
    """The columns of a repeatable, comma-separated option, in order."""
    return [c.strip() for p in options for c in p.split(",") if c.strip()]


def _lock_groups(specs: tuple[str, ...]) -> dict[str, list[str]]:
    """``--lock-group NAME=COL1,COL2`` options as lock groups (a malformed one is a usage error)."""
    groups: dict[str, list[str]] = {}
    for spec in specs:
        gname, sep, cols = spec.partition("=")
        if not sep or not gname.strip():
            raise click.BadParameter(f"{spec!r} is not NAME=COL1,COL2", param_hint="--lock-group")
        groups[gname.strip()] = [c.strip() for c in cols.split(",") if c.strip()]
    return groups


@table.command("drop")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@replica_option
def table_drop(name: str, as_json: bool, replica: str) -> None:
    """Drop table NAME (a transaction: reads at older snapshots still see it; cleanup collects
    its files once no snapshot in use does)."""
    with connected(replica) as client:
        csn = client.drop_table(name)
    if as_json:
        click.echo(json.dumps({"table": name, "csn": csn}))
        return
    console().print(f"dropped table [bold]{escape(name)}[/] at CSN {csn}")


def _describe_json(d: dict) -> dict:
    out = {k: v for k, v in d.items() if k != "schema"}
    out["columns"] = [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in d["schema"]]
    out["partition_by"], out["primary_key"] = list(d["partition_by"]), list(d["primary_key"])
    out.setdefault("lock_groups", {})
    out.setdefault("atomicity", "full")
    out.setdefault("txn_max_seconds", None)
    out.setdefault("txn_max_rows", None)
    return out


@table.command("describe")
@click.argument("name")
@click.option("--snapshot", type=int, default=None, help="Describe it at this CSN (default: the latest).")
@click.option("--json", "as_json", is_flag=True, help="Print the description as JSON.")
@replica_option
def table_describe(name: str, snapshot: int | None, as_json: bool, replica: str) -> None:
    """Show table NAME: columns, partitioning, key, policy, creation CSN, schema version, parts and rows."""
    with connected(replica) as client:
        d = _describe_json(client.describe_table(name, snapshot=snapshot))
    if as_json:
        click.echo(json.dumps(d, default=str))
        return
    out = console()
    out.print(rows_table(d["columns"], ["name", "type", "nullable"], title=f"table {d['name']}"))
    out.print(
        f"partition by: {', '.join(d['partition_by']) or '-'}; primary key: {', '.join(d['primary_key']) or '-'}; "
        f"policy {d['conflict_policy']}; auto merge {'on' if d['auto_merge'] else 'off'}"
    )
    if d["conflict_policy"] == "keys":
        groups = "; ".join(f"{g}={','.join(cols)}" for g, cols in d["lock_groups"].items()) or "-"
        out.print(f"lock groups: {escape(groups)}; atomicity {d['atomicity']}")
    limits = [
        f"{d['txn_max_seconds']:g}s" if d["txn_max_seconds"] is not None else None,
        f"{d['txn_max_rows']} rows" if d["txn_max_rows"] is not None else None,
    ]
    out.print("transaction limits: " + (", ".join(x for x in limits if x) or "the replica's only"))
    if d.get("retention_seconds") is not None:
        out.print(
            f"history retention: {d['retention_seconds']:g}s"
            + (" (the replicas' default)" if d.get("retention_default") else " (the table's own)")
        )
    if d.get("parts_to_throw_insert") is not None:
        out.print(
            f"too many parts: inserts delayed from {d['parts_to_delay_insert']} and refused from "
            f"{d['parts_to_throw_insert']} visible parts in a partition (0: never)"
        )
    out.print(
        f"created at CSN {d['created_csn']}; schema version {d['schema_version']}"
        + (f" (altered at CSN {d['version_csn']})" if d.get("version_csn") else "")
        + f"; at snapshot {d['snapshot']}: {d['parts']} parts, {d['rows']} rows in {d['partitions']} partitions"
    )


@table.command("alter")
@click.argument("name")
@click.option(
    "--add-column",
    "add",
    multiple=True,
    metavar="NAME:TYPE",
    help="Add a nullable column (repeatable; rows written before read it as null).",
)
@click.option("--rename-column", "rename", multiple=True, metavar="OLD=NEW", help="Rename a column (repeatable).")
@click.option(
    "--retention-seconds",
    "retention",
    default=None,
    metavar="SECONDS|default",
    help="The table's history retention in seconds, or 'default' for the replicas' retention_seconds.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the new description as JSON.")
@replica_option
def table_alter(
    name: str, add: tuple[str, ...], rename: tuple[str, ...], retention: str | None, as_json: bool, replica: str
) -> None:
    """Alter table NAME: add nullable columns, rename columns, change its history retention."""
    adds = parse_schema(",".join(add)) if add else None
    renames = {}
    for item in rename:
        if "=" not in item:
            raise InvalidInput(f"--rename-column {item!r} must be OLD=NEW")
        old, new = (x.strip() for x in item.split("=", 1))
        renames[old] = new
    extra: dict = {}
    if retention is not None:
        if retention.strip().lower() == "default":
            extra["retention_seconds"] = None
        else:
            try:
                extra["retention_seconds"] = float(retention)
            except ValueError:
                raise InvalidInput(
                    f"--retention-seconds {retention!r} must be a number of seconds or 'default'",
                    retention_seconds=retention[:100],
                ) from None
    with connected(replica) as client:
        csn = client.alter_table(name, add_columns=adds, rename_columns=renames or None, **extra)
        d = _describe_json(client.describe_table(name))
    if as_json:
        click.echo(json.dumps({**d, "csn": csn}, default=str))
        return
    console().print(
        f"altered table [bold]{escape(name)}[/] at CSN {csn}: columns "
        f"{', '.join(c['name'] + ' ' + c['type'] for c in d['columns'])}"
    )


@table.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the names as one JSON list.")
@replica_option
def table_list(as_json: bool, replica: str) -> None:
    """List the tables."""
    with connected(replica) as client:
        names = client.tables()
    if as_json:
        echo_json(names)
        return
    for n in names:
        click.echo(n)


# -- data ------------------------------------------------------------------------------------


@cli.command(short_help="Insert a Parquet or CSV file into a table.")
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
@click.option(
    "--batch-rows",
    type=click.IntRange(min=1),
    default=1_000_000,
    show_default=True,
    help="Rows read from FILE at a time (each batch is written as parts of its own).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as one JSON object.")
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
    with connected(replica) as client:
        tx = client.begin()
        try:
            tdef = tx.table(table_name)  # as the transaction sees it: its schema and schema version
            by_key = tdef.conflict_policy is Policy.KEYS
            _check_insert_mode(table_name, by_key, overwrite, update)
            writer = _KeyWriter(tx, table_name, update) if by_key else _PartWriter(client, tx, tdef, overwrite)
            rows, parts = _write_file(writer, file, tdef.schema, batch_rows)
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
    csn = tx.csn if rows else None
    if as_json:
        echo_json(
            {
                "table": table_name,
                "rows": rows,
                "parts": parts,
                "csn": csn,
                "tid": tx.id if rows else None,
                "overwrite": overwrite,
                "update": update,
            }
        )
        return
    if rows == 0:
        console().print(
            f"{escape(file.name)} holds no rows: nothing inserted into {escape(table_name)}, nothing committed"
        )
        return
    verb = "overwrote with" if overwrite else ("updated by key" if update else "inserted")
    console().print(f"{verb} {rows} rows into {escape(table_name)}; committed at CSN {tx.csn} (tid {tx.id})")


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


def _write_file(writer: _KeyWriter | _PartWriter, file: Path, schema: pa.Schema, batch_rows: int) -> tuple[int, int]:
    """FILE's rows through ``writer`` by batches, with progress: the rows and the parts written.
    On any failure what the writer staged is discarded."""
    total, batches = file_batches(file, schema, batch_rows)
    rows = 0
    try:
        with progress(f"writing {file.name}", total) as advance:
            for data in batches:
                rows += writer.add(data)
                advance(data.num_rows)
        parts = writer.finish()
    except BaseException:
        writer.discard()
        raise
    return rows, parts


class _KeyWriter:
    """Each batch staged by key (``tx.upsert``: versions, locks and nulls as a client writes
    them); the replica's transaction owns what it staged."""

    def __init__(self, tx: Any, table_name: str, update: bool) -> None:
        self.tx, self.table, self.update, self.staged = tx, table_name, update, 0

    def add(self, data: pa.Table) -> int:
        if data.num_rows == 0:
            return 0
        self.staged += 1
        return self.tx.upsert(self.table, data, update=self.update)

    def finish(self) -> int:
        return self.staged

    def discard(self) -> None:
        pass


class _PartWriter:
    """Each batch conformed and written as parts as it comes; :meth:`finish` stages them all in
    one statement (INSERT, or OVERWRITE of the partitions present). :meth:`discard` deletes the
    parts written so far: nothing references them, so cleanup need not wait for them."""

    def __init__(self, client: Any, tx: Any, tdef: Any, overwrite: bool) -> None:
        self.client, self.tx, self.tdef, self.overwrite = client, tx, tdef, overwrite
        self.written: list[Any] = []

    def add(self, data: pa.Table) -> int:
        from coordinator.core.tabledata import conform, split_by_partition
        from parts.io.format import write_part

        tdef = self.tdef
        data = conform(
            tdef.schema,
            data,
            tdef.name,
            what="overwrite" if self.overwrite else "insert into",
            required=tdef.partition_by,
        )
        for partition, chunk in split_by_partition(data, list(tdef.partition_by)):
            self.written.append(
                write_part(
                    self.client.storage,
                    tdef.name,
                    list(tdef.partition_by),
                    partition,
                    chunk,
                    self.tx.id,
                    tdef.ddl_version,
                )
            )
        return data.num_rows

    def finish(self) -> int:
        if self.written:
            self.tx.add_parts(self.tdef.name, self.written, op="overwrite" if self.overwrite else "insert")
        return len(self.written)

    def discard(self) -> None:
        from parts.io.format import delete_part

        for meta in self.written:
            delete_part(self.client.storage, meta.path)  # quietly: what is left is an orphan for cleanup


READ_FORMATS = ("table", "csv", "json", "parquet")


@cli.command(short_help="Read a table at a snapshot or time.")
@click.argument("table_name", metavar="TABLE")
@click.option("--snapshot", type=click.IntRange(min=0), default=None, help="Read at this CSN.")
@click.option(
    "--as-of",
    "as_of",
    default=None,
    metavar="ISO8601",
    help="Read as of a time, with timezone (e.g. 2024-05-01T12:00:00+00:00).",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write all rows to this file (format from --format, else from its extension: .csv, "
    ".json/.jsonl, else Parquet) instead of printing.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(READ_FORMATS),
    default=None,
    help="table: the first --limit rows, for a terminal (the default without --output); csv, json "
    "(one object per line) or parquet: every row, to --output or stdout, streamed part by part.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=50,
    show_default=True,
    help="Rows to print (--format table only).",
)
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
    if fmt is None:
        fmt = "table" if output is None else _format_of(output)
    if fmt == "table" and output is not None:
        raise InvalidInput("--format table prints to the terminal; give csv, json or parquet with --output")
    with connected(replica) as client, client.scan(table_name, snapshot=snapshot, as_of=when) as (snap, metas, parts):
        # A keys table's versions fold by partition and key range as they stream (bounded
        # memory): its row count is known only at the end.
        keys = client.table_at(table_name, snap).conflict_policy is Policy.KEYS
        total: int | None = None if keys else sum(m.rows for m in metas)
        at = f"at snapshot {snap}" if when is None else f"as of {when.isoformat()}"
        if fmt == "table":
            shown: list[pa.Table] = []
            have = seen = 0
            for data in parts:
                seen += data.num_rows
                if have < limit:
                    shown.append(data.slice(0, limit - have))
                    have += shown[-1].num_rows
                elif not keys:
                    break
            count = seen if keys or total is None else total
            schema = client.table_at(table_name, snap).schema
            out = console()
            out.print(arrow_table(pa.concat_tables(shown) if shown else schema.empty_table()))
            more = f" (showing {limit})" if count > limit else ""
            out.print(f"{count} rows of {escape(table_name)} {at}{more}")
            return
        schema = client.table_at(table_name, snap).schema
        rows = write_rows(parts, schema, fmt, output, total)
    where = f" to {output}" if output is not None else ""
    text = f"wrote {rows} rows of {escape(table_name)} {at}{where}"
    console(stderr=output is None).print(text)


def _format_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        return "csv"
    if suffix in (".json", ".jsonl", ".ndjson"):
        return "json"
    return "parquet"


def write_rows(
    tables: Iterator[pa.Table], schema: pa.Schema, fmt: str, output: Path | None, total: int | None = None
) -> int:
    """Write ``tables`` as they come (one in memory at a time) in ``fmt`` to ``output`` or
    stdout; the number of rows written."""
    rows = 0
    try:
        if output is None:
            sys.stdout.flush()
        sink: Any = sys.stdout.buffer if output is None else open(output, "wb")  # noqa: SIM115
    except OSError as exc:
        raise InvalidInput(f"cannot write {output}: {exc}") from None
    try:
        with progress(f"reading into {output.name}" if output is not None else "reading", total) as advance:
            if fmt in ("parquet", "csv"):
                import pyarrow.csv as pcsv
                import pyarrow.parquet as pq

                with (pq.ParquetWriter if fmt == "parquet" else pcsv.CSVWriter)(sink, schema) as writer:
                    for data in tables:
                        writer.write_table(data)
                        rows += data.num_rows
                        advance(data.num_rows)
            else:
                for chunk, n in json_stream(tables):  # vectorised, two threads (mergetxn/tools/jsonrows.py)
                    sink.write(chunk)
                    rows += n
                    advance(n)
        sink.flush()
    except BrokenPipeError:
        raise  # stdout's reader went away: not an error (MergetxnGroup.invoke)
    except (OSError, pa.ArrowException) as exc:
        raise InvalidInput(f"cannot write {output or 'stdout'}: {exc}") from None
    finally:
        if output is not None:
            sink.close()
    return rows


@cli.command(short_help="List a table's parts and their versions.")
@click.argument("table_name", metavar="TABLE")
@click.option(
    "--all/--visible",
    "show_all",
    default=True,
    show_default=True,
    help="Show removed parts too, or only the visible ones.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@replica_option
def parts(table_name: str, show_all: bool, as_json: bool, replica: str) -> None:
    """List TABLE's parts with their versions (creation and removal tid/CSN, visibility)."""
    with connected(replica) as client:
        rows = client.parts(table_name).to_pylist()
    if not show_all:
        rows = [r for r in rows if r["visible"]]
    else:
        rows = [r for r in rows if not r.get("collected")]  # in storage: visible, or why kept
    if as_json:
        for r in rows:  # the partition as its values, not as JSON text inside JSON
            echo_json({**r, "partition": json.loads(r["partition"])})
        return
    cols = [
        "name",
        "partition",
        "rows",
        "creation_tid",
        "creation_csn",
        "removal_tid",
        "removal_csn",
        "visible",
    ] + (["why_kept"] if show_all else [])
    out = console()
    out.print(rows_table(rows, cols))
    visible = sum(1 for r in rows if r["visible"])
    out.print(
        f"{len(rows)} parts of {escape(table_name)}, {visible} visible, "
        f"{sum(r['rows'] for r in rows if r['visible'])} visible rows"
    )


@cli.command(short_help="Compact a table now.")
@click.argument("table_name", metavar="TABLE")
@click.option(
    "--kind",
    type=click.Choice(["minor", "major"]),
    default="minor",
    show_default=True,
    help="minor merges small parts; major rewrites every part of a partition.",
)
@click.option(
    "--partition",
    "partitions",
    multiple=True,
    metavar="VALUE",
    help="Only this partition (repeatable; several partition columns: a JSON list).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as one JSON object.")
@replica_option
def compact(table_name: str, kind: str, partitions: tuple[str, ...], as_json: bool, replica: str) -> None:
    """Compact TABLE now, as a transaction of its own.

    The replica has --timeout to answer; the compaction itself may then take up to 10 minutes
    (or --timeout, if longer)."""
    out = console()
    with connected(replica) as client:
        before = client.parts(table_name).to_pylist()
        values = partition_values(client, table_name, partitions)
        started = time.monotonic()
        with working(f"compacting {table_name} ({kind})"), connected(replica, long_timeout()) as slow:
            csn = slow.compact(table_name, kind=kind, partitions=values)
        elapsed = time.monotonic() - started
        after = client.parts(table_name).to_pylist()
    seen = {r["name"] for r in before}
    vis_before = sum(1 for r in before if r["visible"])
    vis_after = sum(1 for r in after if r["visible"])
    removed = sum(1 for r in after if r["removal_csn"] == csn)
    added = sum(1 for r in after if r["name"] not in seen and r["creation_csn"] == csn)
    if as_json:
        echo_json(
            {
                "table": table_name,
                "kind": kind,
                "csn": csn,
                "merged": removed,
                "into": added,
                "visible_before": vis_before,
                "visible_after": vis_after,
                "seconds": round(elapsed, 3),
            }
        )
        return
    if removed == 0 and added == 0:
        out.print(f"nothing to compact in {escape(table_name)} ({kind}); {vis_after} visible parts ({elapsed:.2f}s)")
        return
    out.print(
        f"compacted {escape(table_name)} ({kind}): {removed} parts merged into {added}; "
        f"visible parts {vis_before} -> {vis_after}; committed at CSN {csn} ({elapsed:.2f}s)"
    )


@cli.command(short_help="Run one garbage-collection pass.")
@click.option(
    "--grace-seconds",
    type=float,
    default=None,
    help="Keep unreferenced files younger than this (default: the replica's setting).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the whole report as JSON.")
@replica_option
def gc(grace_seconds: float | None, as_json: bool, replica: str) -> None:
    """Run one garbage-collection pass now and show what was removed and kept, and why.

    The replica has --timeout to answer; the pass itself may then take up to 10 minutes (or
    --timeout, if longer)."""
    with connected(replica):  # answers within --timeout: then the pass may take its time
        pass
    with working("collecting garbage"), connected(replica, long_timeout()) as client:
        result = client.gc(grace_seconds=grace_seconds)
    if as_json:
        echo_json(result)
        return
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


@cli.command(short_help="Check storage against the log (every part file present and as committed).")
@click.argument("tables", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Every table (the default when no TABLE is given).")
@click.option("--quick", is_flag=True, help="Presence and sizes only (no file is read).")
@click.option(
    "--repair",
    is_flag=True,
    help="Rewrite each visible part whose intact file contradicts its metadata from the file's rows, "
    "as one compaction transaction per table.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the whole report as JSON.")
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
    with connected(replica):
        pass
    with working("checking part files"), connected(replica, long_timeout()) as client:
        result = client.check(list(tables) or None, checksums=not quick)
        if repair and not result["ok"]:
            from mergetxn.tools.repair import repair as mend

            result["repaired"] = mend(client, result)
            if result["repaired"]:
                result = _after_repair(client.check(list(tables) or None), result["repaired"])
    _print_check(result, as_json)
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


def _print_check(result: dict, as_json: bool) -> None:
    """The report of ``mergetxn check`` (and what --repair committed)."""
    if as_json:
        echo_json(result)
        return
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


@cli.command(short_help="Copy a table's definition and parts at a CSN into a directory.")
@click.argument("table_name", metavar="TABLE")
@click.argument("directory", metavar="DIR")
@click.option("--snapshot", type=click.IntRange(min=0), default=None, help="Back up at this CSN (default: the latest).")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest written as one JSON object.")
@replica_option
def backup(table_name: str, directory: str, snapshot: int | None, as_json: bool, replica: str) -> None:
    """Copy TABLE at one snapshot into DIR (a local directory or an fsspec URL such as s3://):
    every visible part file, byte for byte, and manifest.json (definition, CSN, each part's size,
    checksum and SHA-256; on a secured cluster, as an admin, a MAC that restore checks). The
    snapshot is held while the files are copied."""
    from mergetxn.tools import recovery

    with connected(replica):
        pass
    with working(f"backing up {table_name}"), connected(replica, long_timeout()) as client:
        manifest = recovery.backup(client, table_name, directory, snapshot)
    if as_json:
        echo_json({k: v for k, v in manifest.items() if k != "parts"} | {"parts": len(manifest["parts"])})
        return
    console().print(
        f"backed up {escape(table_name)} at CSN {manifest['csn']}: {len(manifest['parts'])} parts, "
        f"{manifest['rows']} rows, {manifest['bytes']} bytes to {escape(redact(directory))}"
    )


@cli.command(short_help="Restore a backup as one transaction (under a new name or in place).")
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
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as one JSON object.")
@replica_option
def restore(directory: str, as_name: str | None, unverified: bool, as_json: bool, replica: str) -> None:
    """Restore the table backed up in DIR at its CSN, as one transaction, whatever the table's
    txn_max_rows and txn_max_seconds. Every file is checked against the manifest first, and on a
    secured cluster (as an admin) the manifest against its MAC: a damaged or forged backup is
    refused (exit 8; one without a MAC: exit 2) and changes nothing."""
    from mergetxn.tools import recovery

    with connected(replica):
        pass
    with working("restoring"), connected(replica, long_timeout()) as client:
        result = recovery.restore(client, directory, as_name, unverified)
    if as_json:
        echo_json(result)
        return
    how = "into new table" if result["created"] else "in place into"
    console().print(
        f"restored {result['rows']} rows {how} {escape(result['table'])} as of backup CSN "
        f"{result['from_csn']}; committed at CSN {result['csn']}"
    )


@cli.command(short_help="A table's commits: kind, rows, who; aborts and why.")
@click.argument("table_name", metavar="TABLE")
@click.option(
    "--limit",
    type=click.IntRange(min=1, max=10_000),
    default=50,
    show_default=True,
    help="The most recent entries to print.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="json: one object per line.",
)
@replica_option
def history(table_name: str, limit: int, fmt: str, replica: str) -> None:
    """TABLE's history, oldest first: each commit's CSN, time, kind, rows of the parts it added
    and removed, transaction and replica; its DDL; and the aborts this replica remembers, with
    their reason."""
    from mergetxn.tools import recovery

    with connected(replica) as client:
        entries = recovery.history(client, table_name, limit)
    if fmt == "json":
        for e in entries:
            echo_json(e)
        return
    out = console()
    out.print(
        rows_table(entries, ["csn", "time", "kind", "rows_added", "rows_removed", "tid", "host", "user", "reason"])
    )
    out.print(f"{len(entries)} entries of {escape(table_name)}'s history (--limit {limit})")


@cli.command(short_help="Rows a table's commits added and removed between two CSNs.")
@click.argument("table_name", metavar="TABLE")
@click.option("--from", "start", type=click.IntRange(min=0), required=True, help="After this CSN.")
@click.option("--to", "end", type=click.IntRange(min=0), default=None, help="Up to this CSN (default: the latest).")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the rows to this file (format from --format, else from its extension).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(READ_FORMATS),
    default=None,
    help="table: the first --limit rows (the default without --output); csv, json or parquet: "
    "every row, to --output or stdout.",
)
@click.option(
    "--limit", type=click.IntRange(min=0), default=50, show_default=True, help="Rows to print (--format table only)."
)
@replica_option
def changes(
    table_name: str, start: int, end: int | None, output: Path | None, fmt: str | None, limit: int, replica: str
) -> None:
    """The rows added (_change insert) and removed (_change delete) by TABLE's commits whose CSN
    is in (--from, --to], with the _csn of each: client.changes by id."""
    if fmt is None:
        fmt = "table" if output is None else _format_of(output)
    if fmt == "table" and output is not None:
        raise InvalidInput("--format table prints to the terminal; give csv, json or parquet with --output")
    with connected(replica) as client:
        data = client.changes(table_name, start, end)
    span = f"({start}, {'latest' if end is None else end}]"
    if fmt == "table":
        out = console()
        out.print(arrow_table(data.slice(0, limit)))
        more = f" (showing {limit})" if data.num_rows > limit else ""
        out.print(f"{data.num_rows} changed rows of {escape(table_name)} in {span}{more}")
        return
    rows = write_rows(iter([data]), data.schema, fmt, output, data.num_rows)
    where = f" to {output}" if output is not None else ""
    console(stderr=output is None).print(f"wrote {rows} changed rows of {escape(table_name)} in {span}{where}")


@cli.command(short_help="Print the replica's snapshot CSN.")
@click.option("--json", "as_json", is_flag=True, help='Print {"snapshot": CSN}.')
@replica_option
def snapshot(as_json: bool, replica: str) -> None:
    """Print the replica's snapshot CSN (everything up to it is applied there)."""
    with connected(replica) as client:
        csn = client.snapshot()
    if as_json:
        echo_json({"snapshot": csn})
        return
    click.echo(csn)


@cli.command(short_help="Check the cluster's health (exit code 1 when unhealthy).")
@_zookeeper_location("Ask this replica where ZooKeeper is")
@click.option(
    "--max-lag-seconds",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="A replica behind the log's end for longer is unhealthy.",
)
@click.option(
    "--ignore-host",
    "ignore",
    multiple=True,
    metavar="HOST_ID",
    help="A replica retired for good (still registered in ZooKeeper): shown, never unhealthy.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the whole report as one JSON object.")
@click.option(
    "--credentials",
    envvar="MERGETXN_CREDENTIALS",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="A secured cluster's credentials file (default: $MERGETXN_CREDENTIALS): for its "
    "replicas and its ZooKeeper nodes.",
)
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
    from coordinator.wire.security import Credentials
    from mergetxn.tools.status import gather

    creds = None if credentials is None else Credentials.from_file(credentials)
    click.get_current_context().meta["mergetxn.credentials"] = creds  # connected() takes them
    if replica is None and zk_hosts is None:
        raise click.UsageError(f"give --replica (or set {ENV_REPLICA}) or --zk")
    kazoo_log = logging.getLogger("kazoo")
    if kazoo_log.level == logging.NOTSET:  # not asked for: a ZooKeeper that is down is reported once, below
        kazoo_log.setLevel(logging.CRITICAL)
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


# -- transactions ------------------------------------------------------------------------------


@cli.group()
def txn() -> None:
    """List and kill running transactions."""


@txn.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@replica_option
def txn_list(as_json: bool, replica: str) -> None:
    """List the transactions running on the replica."""
    with connected(replica) as client:
        txns = client.transactions()
    if as_json:
        for t in txns:
            echo_json(t)
        return
    rows = [{**t, "age": f"{t.get('age_seconds', 0):.1f}s", "tables": ",".join(t.get("tables") or ())} for t in txns]
    out = console()
    if not rows:
        out.print("no running transactions")
        return
    out.print(rows_table(rows, ["id", "snapshot", "age", "state", "rows", "operations", "tables"]))
    out.print(f"{len(rows)} running transaction(s)")


@txn.command("kill")
@click.argument("txn_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print the replica's answer as one JSON object.")
@replica_option
def txn_kill(txn_id: str, as_json: bool, replica: str) -> None:
    """Abort running transaction ID (its parts are removed; its commit will fail)."""
    with connected(replica) as client:
        result = client.kill(txn_id)
    if as_json:
        echo_json(result)
        return
    state = result.get("state", "?") if isinstance(result, dict) else "?"
    reason = result.get("reason", "") if isinstance(result, dict) else ""
    console().print(f"transaction {escape(txn_id)}: {state}" + (f" ({escape(reason)})" if reason else ""))


# -- quickstart --------------------------------------------------------------------------------


@cli.command(short_help="See mergetxn work on an embedded cluster.")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
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


# -- chaos ---------------------------------------------------------------------------------------


@cli.command(short_help="Run workloads under injected faults and check the history.")
@click.option(
    "--seconds",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="How long the workloads and the nemesis run at most (setup and checking come on top).",
)
@click.option(
    "--faults",
    "max_faults",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Stop injecting after N faults: the run ends once they are healed and measured, or at "
    "--seconds; fewer than N by then fails the run (exit code 1). For a CI campaign of a "
    "known size, e.g. --faults 200 --seconds 300.",
)
@click.option(
    "--seed", type=int, default=None, help="Seed of the nemesis and the workloads (default: random, printed)."
)
@click.option(
    "--workload",
    type=click.Choice(["list-append", "bank", "keys", "spark", "all"]),
    default="all",
    show_default=True,
    help="'all' is list-append, bank and keys; 'spark' runs Spark jobs (append, overwrite, jobs joining a "
    "driver transaction, reads) through the data source on a Spark standalone cluster (a master "
    "and a worker per other host, executors on other hosts than the driver).",
)
@click.option(
    "--spark",
    is_flag=True,
    help="Add the Spark workload to the others. Spark is heavy (a master, two workers, two "
    "executors and the driver: six JVMs more, about 40 s to start): on a small machine it "
    "slows every other client, so it is left out unless asked for.",
)
@click.option(
    "--nemesis",
    default="all",
    show_default=True,
    metavar="KINDS",
    help="Fault kinds, comma separated (kill-replica, pause-replica, kill-zk, kill-zk-leader, isolate, "
    "partition-majority, cut-from-zk, bridge, slow, expire-session, wal-full, kill-client; "
    "s3-errors, s3-timeouts with --storage s3; kill-executor: a Spark executor SIGKILLed mid-task, "
    "with the Spark workload only), 'all' (every kind this form and workload support) or 'none'.",
)
@click.option(
    "--lanes",
    type=click.IntRange(min=1),
    default=None,
    help="Faults the nemesis may have under way at once (each lane waits for the recovery of its "
    "last one). Default 3, or 1 with the Spark workload, whose jobs take tens of seconds on a "
    "small machine and with three lanes nearly all meet a killed or cut replica.",
)
@click.option(
    "--pause",
    type=click.FloatRange(min=0, max=3600),
    default=None,
    metavar="SECONDS",
    help="A lane waits a random time up to this long between two faults. Default 0.3, or 10 with "
    "the Spark workload (same reason).",
)
@click.option(
    "--report",
    "report_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("chaos-report"),
    show_default=True,
    help="Directory for history.jsonl, findings.json, summary.json and timeline.html.",
)
@click.option(
    "--clients-per-replica",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Clients per replica and workload.",
)
@click.option(
    "--form",
    type=click.Choice(["auto", "namespaces", "loopback", "single"]),
    default="auto",
    show_default=True,
    help="Simulated hosts in network namespaces (needs root), on loopback, "
    "or a single host (one ZooKeeper, replica signal faults only).",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory for the cluster's data and logs (default: mergetxn-chaos in the temp dir).",
)
@click.option(
    "--storage",
    type=click.Choice(["dir", "s3"]),
    default="dir",
    show_default=True,
    help="Where the parts are: a directory every host sees, or a bucket on moto's S3 server on host 0 "
    "(behind a fault proxy: the s3-errors and s3-timeouts faults).",
)
@click.option(
    "--hostile/--no-hostile",
    default=True,
    show_default=True,
    help="Run the hostile-client lane beside the workloads: junk frames, idle connections and forged "
    "parts sent to random replicas (a forged part accepted, or a part file lost, is a finding).",
)
@click.option(
    "--secure/--no-secure",
    default=False,
    show_default=True,
    help="A secured cluster: TLS to the replicas and a TLS-only ZooKeeper ensemble under the replicas' "
    "identity, every client logged in as the admin; the hostile lane also makes calls a reader's "
    "and a writer's grants deny (each must be refused and change nothing). Not with --spark.",
)
@click.option(
    "--cleanup",
    "cleanup_only",
    is_flag=True,
    help="Only remove what an earlier run left (processes, namespaces, its directory) and exit.",
)
@click.option(
    "--check-history",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Check a saved history.jsonl and write its report, without running anything.",
)
def chaos(
    seconds: float,
    max_faults: int | None,
    seed: int | None,
    workload: str,
    spark: bool,
    nemesis: str,
    lanes: int | None,
    pause: float | None,
    report_dir: Path,
    clients_per_replica: int,
    form: str,
    workdir: Path | None,
    cleanup_only: bool,
    check_history: Path | None,
    storage: str,
    hostile: bool,
    secure: bool,
) -> None:
    """Start a cluster, run transactions on every replica while a nemesis kills, pauses, cuts
    and slows its processes, heal, resolve every unknown outcome, read every replica at one CSN,
    and check the history for isolation anomalies, lost commits, divergent replicas and
    unresolved outcomes. Exit code 0 only when nothing was found, 1 when something was
    (each finding printed), 2 when the run could not be set up."""
    import tempfile

    from mergetxn.chaos import report
    from mergetxn.chaos.run import conclude, history_from

    out = console()
    logging.getLogger("kazoo").setLevel(logging.ERROR)  # the nemesis's own ZooKeeper clients see every fault
    workdir = workdir or Path(tempfile.gettempdir()) / "mergetxn-chaos"
    if cleanup_only:
        _chaos_cleanup(workdir, out)
        return
    if check_history is not None:
        result = conclude(history_from(check_history), report_dir)
    else:
        result = _chaos_run(
            out,
            seed,
            workdir,
            seconds,
            workload=workload,
            nemesis=nemesis,
            report_dir=report_dir,
            clients_per_replica=clients_per_replica,
            form=form,
            spark=spark,
            max_faults=max_faults,
            lanes=lanes,
            pause=pause,
            storage=storage,
            hostile=hostile,
            secure=secure,
        )
    report.print_summary(result.summary, result.findings, out)
    out.print(f"report: {escape(str(report_dir))}/ ({', '.join(report.FILES)})")
    raise SystemExit(result.exit_code)


def _chaos_cleanup(workdir: Path, out: Console) -> None:
    """``chaos --cleanup``: remove what an earlier run left in ``workdir`` and say what was removed."""
    from mergetxn.chaos.run import cleanup

    try:
        done = cleanup(workdir)
    except RuntimeError as exc:  # another run holds the directory
        fail(str(exc))
    out.print("\n".join(escape(d) for d in done) if done else "nothing to clean up")


def _chaos_run(out: Console, seed: int | None, workdir: Path, seconds: float, **options: Any) -> Result:
    """One chaos campaign (``run_chaos`` with ``options``) under ``seed`` (a random one, printed, if
    none), its progress printed dim; SIGTERM stops it as Ctrl-C does (healed, cluster stopped,
    exit 130); a run that cannot be set up or finished fails."""
    import random

    from mergetxn.chaos.run import run_chaos

    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    out.print(f"seed {seed} (rerun with --seed {seed})")

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # SIGTERM stops the run as Ctrl-C does: healed, cluster stopped

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        result = run_chaos(workdir, seconds, seed, say=lambda text: out.print(escape(text), style="dim"), **options)
    except KeyboardInterrupt:
        print_error("interrupted; the cluster was stopped")
        raise SystemExit(130) from None
    except (MergetxnError, OSError, RuntimeError, TimeoutError) as exc:
        fail(f"the chaos run could not be set up or finished: {type(exc).__name__}: {exc}")
    finally:
        signal.signal(signal.SIGTERM, previous)
    return result


# -- security ----------------------------------------------------------------------------------


@cli.group()
def security() -> None:
    """A secured cluster's credentials and users (TLS, users with roles and grants, ZooKeeper ACLs)."""


@security.command("init")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--host",
    "hosts",
    multiple=True,
    default=("127.0.0.1", "localhost"),
    show_default=True,
    metavar="HOST",
    help="An IP address or DNS name clients reach replicas at (repeat for each).",
)
@click.option(
    "--user",
    default="mergetxn",
    show_default=True,
    help="The replicas' identity (their ZooKeeper digest user; no user logs in with it).",
)
@click.option("--admin", default="admin", show_default=True, help="The first admin user's name.")
def security_init(directory: Path, hosts: tuple[str, ...], user: str, admin: str) -> None:
    """Make a private CA, one replica certificate for every --host, the replicas' identity and
    the first admin user in DIRECTORY.

    Writes ca.pem, replica.pem, replica.key and two credentials files (mode 0600):
    credentials.json, the replicas' (`replica start --credentials`; it also logs in to
    ZooKeeper) and admin.json, the admin user's (clients: `--credentials` or
    MERGETXN_CREDENTIALS; `security add-user` makes more users). No secret is printed.
    """
    from coordinator.wire.security import ADMIN_FILE, REPLICA_FILE, make_cluster_credentials

    if (directory / REPLICA_FILE).exists():
        fail(f"{directory / REPLICA_FILE} exists: remove the directory's files to make new credentials")
    make_cluster_credentials(directory, hosts, user, admin=admin)
    out = console()
    out.print(f"credentials for host(s) {', '.join(hosts)} in {directory}:", soft_wrap=True)
    out.print(f"  replicas: mergetxn replica start --credentials {directory / REPLICA_FILE} ...", soft_wrap=True)
    out.print(f"  admin {admin!r}: MERGETXN_CREDENTIALS={directory / ADMIN_FILE} (or --credentials)", soft_wrap=True)


@security.command("add-user")
@click.argument("name")
@click.option(
    "--role",
    type=click.Choice(["admin", "writer", "reader"]),
    required=True,
    help="admin: everything; writer: reads and writes of its tables; reader: reads of its tables.",
)
@click.option(
    "--table",
    "tables",
    multiple=True,
    metavar="TABLE",
    help="A table the user has grants on (repeat for each; default: every table, later ones too).",
)
@click.option(
    "--out",
    "out_file",
    default=None,
    metavar="FILE|-",
    help="Where to write the user's credentials file (default: NAME.json beside the CA file of "
    "--credentials; never overwritten). '-': print it on stdout instead (to pipe into a "
    "secret store; the only time a secret is printed).",
)
@replica_option
def security_add_user(name: str, role: str, tables: tuple[str, ...], out_file: str | None, replica: str) -> None:
    """Add user NAME (as an admin: --credentials) and write its credentials file (mode 0600:
    its name, a new secret and the CA file). Hand that file to the user; the cluster keeps only
    a salted hash of the secret, which is printed only with --out -. The name and the file's
    directory are checked first: a user is added only when its file can be written (one whose
    file still fails to be written is dropped again)."""
    check_user_name(name)  # before anything: the name also names the credentials file
    with connected(replica) as client:
        if client.credentials is None:
            fail("security add-user: give an admin's credentials (--credentials or MERGETXN_CREDENTIALS)")
        ca = client.credentials.ca_file
        path = (
            None
            if out_file == "-"
            else Path(out_file)
            if out_file
            else (ca.parent if ca is not None else Path.cwd()) / f"{name}.json"
        )
        if path is not None:
            _check_credentials_path(path)
        creds = client.create_user(name, role, list(tables) or None)
        if path is not None:
            try:
                creds.to_file(path)
            except OSError as exc:
                client.drop_user(name)
                fail(f"{path} cannot be written ({exc.strerror or exc}): user {name!r} was not added", EXIT_UNAVAILABLE)
    grants = ", ".join(tables) if tables else "every table"
    if path is None:
        click.echo(
            json.dumps(
                {
                    "user": creds.user,
                    "secret": creds.secret,
                    **({"ca_file": str(creds.ca_file.resolve())} if creds.ca_file else {}),
                },
                indent=2,
            )
        )
        console(stderr=True).print(f"user {name!r} ({role}, tables: {grants}) added", soft_wrap=True)
        return
    console().print(f"user {name!r} ({role}, tables: {grants}): credentials in {path}", soft_wrap=True)


def _check_credentials_path(path: Path) -> None:
    """Refuse (InvalidInput) a credentials file that exists or whose directory is missing or not writable."""
    if path.exists() or path.is_symlink():
        raise InvalidInput(f"{path} exists: remove it or give --out", path=str(path))
    parent = path.parent
    if not parent.is_dir():
        raise InvalidInput(f"--out {path}: directory {parent} does not exist: create it or give another --out")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InvalidInput(f"--out {path}: directory {parent} is not writable: give another --out")


@security.command("drop-user")
@click.argument("name")
@replica_option
def security_drop_user(name: str, replica: str) -> None:
    """Drop user NAME (as an admin): its credentials are refused from now on, on every replica."""
    with connected(replica) as client:
        client.drop_user(name)
    console().print(f"user {name!r} dropped", soft_wrap=True)


@security.command("users")
@click.option("--json", "as_json", is_flag=True, help="Print the users as a JSON list.")
@replica_option
def security_users(as_json: bool, replica: str) -> None:
    """List the users (as an admin): name, role and tables."""
    with connected(replica) as client:
        users = client.users()
    if as_json:
        echo_json(users)
        return
    table = Table("name", "role", "tables")
    for u in users:
        table.add_row(
            escape(u["name"]), u["role"], "every table" if u["tables"] is None else escape(", ".join(u["tables"]))
        )
    console().print(table)


def main(argv: list[str] | None = None) -> None:
    """Console script entry point (``mergetxn``)."""
    cli.main(args=argv, prog_name="mergetxn")


if __name__ == "__main__":
    main()
