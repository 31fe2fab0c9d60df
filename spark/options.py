"""The options of one read or write of the ``mergetxn`` data source, parsed into :class:`Settings`,
and what they name: the replica (:func:`connect`, :func:`table_def`, :func:`join` for option
``txn``) and the storage (:func:`storage_for`, one client per worker process and configuration).

Shared by the batch data source (spark/datasource.py), the streaming sink and source
(spark/streaming.py) and the executors' UPDATE/DELETE (spark/mutate.py).
"""

from __future__ import annotations

import datetime as dt
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from coordinator.core import errors
from coordinator.core.errors import InvalidInput, ReplicaUnavailable
from coordinator.model.catalog import TableDef
from parts.io.storage import Storage

REPLICA_ENV = "MERGETXN_REPLICA"  # fallback for option `replica`
WRITE_OPTIONS = frozenset({"replica", "txn", "rows_per_part", "app_id", "app_version"})
READ_ONLY_OPTIONS = ("snapshot", "as_of", "changes_from", "changes_to", "changes_by")
S3_OPTIONS = {
    "s3_endpoint": "endpoint_url",
    "s3_key": "key",
    "s3_access_key": "key",
    "s3_secret": "secret",
    "s3_secret_key": "secret",
    "s3_token": "token",
    "s3_session_token": "token",
    "s3_region": "region",
}
# Every option the data source reads (reads, writes, streams, UPDATE/DELETE), by its lower-case
# name: Spark hands them in a case-insensitive map. ``failpoints`` is for tests (spark/streaming.py).
OPTIONS = frozenset(
    {
        "path",
        "replica",
        "credentials",
        "txn",
        "app_id",
        "app_version",
        "rows_per_part",
        "split_bytes",
        "lease",
        "trace_reads",
        "trace_commits",
        "failpoints",
        *READ_ONLY_OPTIONS,
        *S3_OPTIONS,
    }
)
# Keys that Spark itself puts among a data source's options: load()'s several paths, a CREATE
# TABLE's catalog keys (and each of its options again as ``option.<name>``), a stream's checkpoint.
SPARK_OPTIONS = frozenset({"paths", "location", "provider", "owner", "checkpointlocation"})
SPLIT_BYTES = 32 * 1024 * 1024  # at most this many Parquet bytes per read task (small parts grouped)
LATEST = "latest"  # a stream's option changes_from: the changes from the query's start


# ---------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True)
class Settings:
    """Parsed options. ``storage_options`` may hold credentials: it is never printed.
    ``credentials`` is the path of a secured cluster's credentials file (option ``credentials``,
    else ``MERGETXN_CREDENTIALS`` where the client runs): options may show in plans, so only the
    path ever travels, and the driver and every task read the file where they run."""

    table: str
    replica: str
    txn: str | None = None
    snapshot: int | None = None
    as_of: float | None = None
    changes: tuple[Any, Any, str] | None = None
    rows_per_part: int | None = None
    split_bytes: int = SPLIT_BYTES
    trace_reads: str | None = None
    trace_commits: str | None = None
    storage_options: dict | None = field(default=None, repr=False)
    credentials: str | None = None
    lease: str = "spark"  # option 'lease': "none" when the caller holds the snapshot (spark.read_table)
    app: tuple[str, int] | None = None  # options app_id, app_version: an idempotent write's


def option(options: Any, name: str) -> str | None:
    value = options.get(name)
    if value is None:
        return None
    value = str(value).strip()
    return value or None


def int_option(options: Any, name: str, minimum: int = 0) -> int | None:
    text = option(options, name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise InvalidInput(f"mergetxn option {name!r} must be an integer, not {text!r}") from None
    if value < minimum:
        raise InvalidInput(f"mergetxn option {name!r} must be >= {minimum}, not {value}")
    return value


def time_option(options: Any, name: str) -> dt.datetime | None:
    """An ISO 8601 time with a zone (``2025-01-31T12:00:00+00:00``, ``...Z``) or epoch seconds."""
    text = option(options, name)
    if text is None:
        return None
    try:
        return dt.datetime.fromtimestamp(float(text), dt.UTC)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidInput(
            f"mergetxn option {name!r} must be an ISO 8601 time with a zone or epoch seconds, not {text!r}"
        ) from None
    if when.tzinfo is None or when.utcoffset() is None:
        raise InvalidInput(f"mergetxn option {name!r} needs a time zone (e.g. {text}+00:00)")
    return when


def storage_options(options: Any) -> dict | None:
    """s3fs options from ``s3_*`` options; None (the environment, as Storage does) when none
    is given. Options given are completed from the usual AWS variables."""
    given: dict[str, str] = {}
    for name, target in S3_OPTIONS.items():  # several names (aliases) per s3fs argument
        value = option(options, name)
        if value is not None:
            given.setdefault(target, value)
    if not given:
        return None
    from parts.io.storage import s3_env_options

    out = s3_env_options()
    region = given.pop("region", None)
    out.update(given)
    if region:
        out["client_kwargs"] = {"region_name": region}
    return out


def check_names(options: Any) -> None:
    """Refuse an option the data source does not know (a misspelt ``snapshott`` would otherwise
    read the latest data without a word), naming the known ones."""
    names = {str(k).lower() for k in options}
    unknown = sorted(n for n in names - OPTIONS - SPARK_OPTIONS if not n.startswith("option."))
    if unknown:
        raise InvalidInput(
            f"mergetxn: unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"the options are: {', '.join(sorted(OPTIONS))}"
        )


def settings(options: Any, *, write: bool = False) -> Settings:
    """Validate the options of one read or write, naming what is wrong."""
    check_names(options)
    table = option(options, "path")
    if table is None:
        raise InvalidInput(
            "mergetxn: no table name; give it to load()/save(), e.g. spark.read.format('mergetxn').load('events')"
        )
    from coordinator.core.tabledata import validate_name

    validate_name("table", table)
    replica = option(options, "replica") or os.environ.get(REPLICA_ENV)
    if not replica:
        raise InvalidInput(
            f"mergetxn: option 'replica' (host:port of a mergetxn replica) is required (or set {REPLICA_ENV})"
        )
    if write:
        misplaced = [n for n in READ_ONLY_OPTIONS if option(options, n) is not None]
        if misplaced:
            raise InvalidInput(f"mergetxn: option(s) {misplaced} apply to reads, not writes")
    elif option(options, "txn") is not None:
        raise InvalidInput(
            "mergetxn: option 'txn' applies to writes; a transaction's own reads go through the Python client (tx.read)"
        )
    app = _app_option(options, write)
    snapshot = int_option(options, "snapshot")
    as_of = time_option(options, "as_of")
    if snapshot is not None and as_of is not None:
        raise InvalidInput("mergetxn: give either option 'snapshot' or 'as_of', not both")
    changes = _changes_option(options, snapshot, as_of)
    lease = (option(options, "lease") or "spark").lower()
    if lease not in ("spark", "none"):
        raise InvalidInput(
            f"mergetxn: option 'lease' must be 'spark' (the read keeps its snapshot in use "
            f"read_lease_seconds after planning) or 'none' (the caller holds it), not {lease!r}"
        )
    return Settings(
        table=table,
        replica=replica,
        lease=lease,
        txn=option(options, "txn"),
        snapshot=snapshot,
        as_of=None if as_of is None else as_of.timestamp(),
        changes=changes,
        rows_per_part=int_option(options, "rows_per_part", 1),
        split_bytes=int_option(options, "split_bytes", 1) or SPLIT_BYTES,
        trace_reads=option(options, "trace_reads"),
        trace_commits=option(options, "trace_commits"),
        storage_options=storage_options(options),
        credentials=option(options, "credentials"),
        app=app,
    )


def _changes_option(options: Any, snapshot: int | None, as_of: dt.datetime | None) -> tuple[Any, Any, str] | None:
    """Options ``changes_from``, ``changes_to`` and ``changes_by`` (``id`` or ``time``) of an
    incremental read: ``(from, to, by)``, None when none is given; ``changes_from`` required,
    and never with a snapshot or as_of."""
    start, end, by = (option(options, n) for n in ("changes_from", "changes_to", "changes_by"))
    if start is None and end is None and by is None:
        return None
    if start is None:
        raise InvalidInput("mergetxn: option 'changes_from' is required for an incremental read")
    if snapshot is not None or as_of is not None:
        raise InvalidInput("mergetxn: changes_* options cannot be combined with snapshot/as_of")
    by = (by or "id").lower()
    if by == "id":
        return (int_option(options, "changes_from"), int_option(options, "changes_to"), by)
    if by == "time":
        return (time_option(options, "changes_from"), time_option(options, "changes_to"), by)
    raise InvalidInput(f"mergetxn: option 'changes_by' must be 'id' or 'time', not {by!r}")


def _app_option(options: Any, write: bool) -> tuple[str, int] | None:
    """Options ``app_id`` and ``app_version``: a write without ``txn`` commits idempotently
    (``tx.set_app_version``); both or neither, and only on such a write."""
    from coordinator.core.conflicts import check_app_version

    app_id, version = option(options, "app_id"), option(options, "app_version")
    if app_id is None and version is None:
        return None
    if not write:
        raise InvalidInput("mergetxn: options 'app_id' and 'app_version' apply to writes, not reads")
    if app_id is None or version is None:
        raise InvalidInput("mergetxn: options 'app_id' and 'app_version' go together: give both")
    if option(options, "txn") is not None:
        raise InvalidInput(
            "mergetxn: options 'app_id'/'app_version' make a write commit on its own; with "
            "option 'txn' set the version on the transaction (tx.set_app_version)"
        )
    return check_app_version(app_id, int_option(options, "app_version", 0))


def schema_options(options: Mapping[str, Any]) -> dict:
    """The options as the batch source's schema() reads them: a stream's ``changes_from`` may be
    ``"latest"``, which only says that the rows are changes."""
    out = dict(options)
    for k, v in options.items():
        if k.lower() == "changes_from" and str(v).strip().lower() == LATEST:
            out[k] = "0"
    return out


# ---------------------------------------------------------------------------------------------
# The replica the options name


def connect(s: Settings):
    """A client of the replica named by the options, with an error a Spark user understands."""
    from mergetxn.client.client import Client

    try:
        return Client(s.replica, s.storage_options, credentials=s.credentials)
    except ReplicaUnavailable as exc:
        raise ReplicaUnavailable(
            f"mergetxn: cannot reach replica {s.replica} (option 'replica'): {exc.message}"
        ) from None


def visible_for_read(client: Any, args: dict[str, Any], lease: str) -> dict:
    """``visible`` for a read, asking for a keys table's deletion vectors (replicas/vectors.py);
    a replica from before them refuses the field: asked again without it. Slim: Spark's reads
    use no part's key filter (up to 64 KiB each, carried to every task with its parts)."""
    try:
        return client.call("visible", lease=lease, vectors=True, slim=True, **args)
    except InvalidInput as exc:
        if exc.details.get("field") != "vectors":
            raise
        return client.call("visible", lease=lease, slim=True, **args)


def table_def(client, s: Settings) -> TableDef:
    """The table's definition at the read's snapshot (``snapshot``, ``as_of``, the end of a
    ``changes`` range by id), else the latest: a read sees the schema at its snapshot."""
    snapshot = s.snapshot
    if snapshot is None and s.changes is not None and s.changes[2] == "id":
        snapshot = s.changes[1]
    try:
        return client.table_at(s.table, snapshot=snapshot, as_of=s.as_of)
    except errors.TableNotFound as exc:
        raise errors.TableNotFound(
            f"mergetxn: unknown table {s.table!r} (replica {s.replica}): {exc.message}", table=s.table
        ) from None


def join(client, s: Settings):
    """The driver's open transaction (option ``txn``), checked to be running on this replica."""
    replica = f"option 'replica' names {s.replica} ({client.host_id})"
    return join_transaction(client, s.txn, s.table, "option 'txn'", replica)


def join_transaction(client, txn: str | None, table: str, named: str, replica: str):
    """The driver's open transaction ``txn`` joined on ``client``'s replica, checked to run there
    and not to have ended; InvalidInput or TransactionAborted otherwise. ``named``: what the
    caller calls the transaction id, ``replica``: what it says of the replica, in the messages."""
    from coordinator.core.versions import Tid

    try:
        tid = Tid.parse(txn or "")  # None: ValueError as for any text not a tid
    except ValueError:
        raise InvalidInput(f"mergetxn: {named} must be a transaction id (tx.id), not {txn!r}") from None
    if tid.host_id != client.host_id:
        raise InvalidInput(
            f"mergetxn: transaction {txn} runs on replica {tid.host_id}, but {replica}; use that replica's address"
        )
    tx = client.join(txn)
    try:
        client.call("visible", table=table, id=tx.id, partitions=[])
    except errors.TransactionAborted as exc:
        raise errors.TransactionAborted(f"mergetxn: cannot join transaction {txn}: {exc.message}", id=txn) from None
    return tx


# ---------------------------------------------------------------------------------------------
# Storage: one client per process (executors reuse their Python workers)

_storages: dict[tuple, Storage] = {}
_storages_lock = threading.Lock()


def storage_for(url: str, options: dict | None) -> Storage:
    """One Storage (one s3fs client) per worker process and configuration."""
    key = (url, repr(sorted((options or {}).items())))
    with _storages_lock:
        st = _storages.get(key)
        if st is None:
            st = _storages[key] = Storage(url, None if options is None else dict(options))
        return st
