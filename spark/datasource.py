"""The ``mergetxn`` data source for Spark 4's Python Data Source API.

Where each piece runs matters, because nothing in the driver's Python memory reaches the others:

* ``DataSource.schema()``, ``reader()``, ``pushFilters()``, ``partitions()`` and ``writer()`` run in
  short-lived Python *planner* processes that the driver JVM starts. They talk to a replica
  (option ``replica``): the table definition, the visible part list, BEGIN.
* ``DataSourceReader.read()`` and ``DataSourceArrowWriter.write()`` run in Python workers on the
  executors. They touch only object storage: a read task reads the parts it was handed (checksum
  checked); a write task writes its Arrow batches as parts and returns their descriptors.
* ``DataSourceWriter.commit(messages)`` / ``abort(messages)`` run in a planner process again, once
  per job, with the messages of the task attempts Spark accepted (one per task: retries and
  speculative duplicates that lost are not among them). The commit stages every descriptor in one
  transaction and commits it; only parts named there ever become visible. Files of failed or
  duplicate attempts are orphans: their names start with the transaction id (as every part's
  does), no commit names them, and ``mergetxn gc`` collects them.

With option ``txn`` the write joins a transaction that the driver opened (``client.begin()``) and
only stages into it: several writes, to several tables, then become visible at one CSN when the
driver commits, or never.

Options ``app_id`` and ``app_version`` (a write without ``txn``) make the job's commit idempotent
(``tx.set_app_version``): a version at or below the one committed for that application fails the
job with ``DuplicateCommit`` and nothing of it is visible (an exactly-once sink's batch).

A job that commits on its own does so in a planner process, so the driver learns neither its
transaction nor its CSN from ``save()``. Option ``trace_commits`` (a file on the driver's host)
tells it: one JSON line when the write begins its transaction (``{"event": "begin", "table",
"txn", "snapshot"}``; or ``"join"`` with option ``txn``), one when it staged its parts into a
joined transaction (``"staged"``, with the number of ``parts``), and one once its own transaction committed
(``"committed"``, with ``csn``). With the transaction id known before any task runs, a caller
whose job failed or whose driver lost the answer can always ask ``commit_status``.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import math
import os
import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from coordinator.core import errors, keyfold, keys
from coordinator.core.conflicts import Policy
from coordinator.core.errors import InvalidInput, ReplicaUnavailable
from coordinator.core.tabledata import conform, may_match, split_by_partition
from coordinator.model.catalog import TableDef
from parts.io.format import read_part, write_part
from parts.io.storage import Storage
from parts.model.meta import PartMeta

NAME = "mergetxn"
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
PART_BYTES = 64 * 1024 * 1024  # Arrow bytes a write task buffers before it writes them as a part
SPLIT_BYTES = 32 * 1024 * 1024  # at most this many Parquet bytes per read task (small parts grouped)
SPLIT_ROWS = 1_000_000  # and at most this many rows, so reads spread over the cores
BATCH_ROWS = 65_536


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


def _option(options: Any, name: str) -> str | None:
    value = options.get(name)
    if value is None:
        return None
    value = str(value).strip()
    return value or None


def _int_option(options: Any, name: str, minimum: int = 0) -> int | None:
    text = _option(options, name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise InvalidInput(f"mergetxn option {name!r} must be an integer, not {text!r}") from None
    if value < minimum:
        raise InvalidInput(f"mergetxn option {name!r} must be >= {minimum}, not {value}")
    return value


def _time_option(options: Any, name: str) -> dt.datetime | None:
    """An ISO 8601 time with a zone (``2025-01-31T12:00:00+00:00``, ``...Z``) or epoch seconds."""
    text = _option(options, name)
    if text is None:
        return None
    try:
        return dt.datetime.fromtimestamp(float(text), dt.UTC)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidInput(f"mergetxn option {name!r} must be an ISO 8601 time with a zone "
                           f"or epoch seconds, not {text!r}") from None
    if when.tzinfo is None or when.utcoffset() is None:
        raise InvalidInput(f"mergetxn option {name!r} needs a time zone (e.g. {text}+00:00)")
    return when


def storage_options(options: Any) -> dict | None:
    """s3fs options from ``s3_*`` options; None (the environment, as Storage does) when none
    is given. Options given are completed from the usual AWS variables."""
    given: dict[str, str] = {}
    for name, target in S3_OPTIONS.items():  # several names (aliases) per s3fs argument
        value = _option(options, name)
        if value is not None:
            given.setdefault(target, value)
    if not given:
        return None
    from parts.io.storage import _s3_env_options

    out = _s3_env_options()
    region = given.pop("region", None)
    out.update(given)
    if region:
        out["client_kwargs"] = {"region_name": region}
    return out


def settings(options: Any, *, write: bool = False) -> Settings:
    """Validate the options of one read or write, naming what is wrong."""
    table = _option(options, "path")
    if table is None:
        raise InvalidInput("mergetxn: no table name; give it to load()/save(), e.g. "
                           "spark.read.format('mergetxn').load('events')")
    from coordinator.core.tabledata import validate_name

    validate_name("table", table)
    replica = _option(options, "replica") or os.environ.get(REPLICA_ENV)
    if not replica:
        raise InvalidInput(f"mergetxn: option 'replica' (host:port of a mergetxn replica) is required "
                           f"(or set {REPLICA_ENV})")
    if write:
        misplaced = [n for n in READ_ONLY_OPTIONS if _option(options, n) is not None]
        if misplaced:
            raise InvalidInput(f"mergetxn: option(s) {misplaced} apply to reads, not writes")
    elif _option(options, "txn") is not None:
        raise InvalidInput("mergetxn: option 'txn' applies to writes; a transaction's own reads "
                           "go through the Python client (tx.read)")
    app = _app_option(options, write)
    snapshot = _int_option(options, "snapshot")
    as_of = _time_option(options, "as_of")
    if snapshot is not None and as_of is not None:
        raise InvalidInput("mergetxn: give either option 'snapshot' or 'as_of', not both")
    changes = None
    start, end, by = (_option(options, n) for n in ("changes_from", "changes_to", "changes_by"))
    if start is not None or end is not None or by is not None:
        if start is None:
            raise InvalidInput("mergetxn: option 'changes_from' is required for an incremental read")
        if snapshot is not None or as_of is not None:
            raise InvalidInput("mergetxn: changes_* options cannot be combined with snapshot/as_of")
        by = (by or "id").lower()
        if by == "id":
            changes = (_int_option(options, "changes_from"), _int_option(options, "changes_to"), by)
        elif by == "time":
            changes = (_time_option(options, "changes_from"), _time_option(options, "changes_to"), by)
        else:
            raise InvalidInput(f"mergetxn: option 'changes_by' must be 'id' or 'time', not {by!r}")
    lease = (_option(options, "lease") or "spark").lower()
    if lease not in ("spark", "none"):
        raise InvalidInput(f"mergetxn: option 'lease' must be 'spark' (the read keeps its snapshot in use "
                           f"read_lease_seconds after planning) or 'none' (the caller holds it), not {lease!r}")
    return Settings(
        table=table,
        replica=replica,
        lease=lease,
        txn=_option(options, "txn"),
        snapshot=snapshot,
        as_of=None if as_of is None else as_of.timestamp(),
        changes=changes,
        rows_per_part=_int_option(options, "rows_per_part", 1),
        split_bytes=_int_option(options, "split_bytes", 1) or SPLIT_BYTES,
        trace_reads=_option(options, "trace_reads"),
        trace_commits=_option(options, "trace_commits"),
        storage_options=storage_options(options),
        credentials=_option(options, "credentials"),
        app=app,
    )


def _app_option(options: Any, write: bool) -> tuple[str, int] | None:
    """Options ``app_id`` and ``app_version``: a write without ``txn`` commits idempotently
    (``tx.set_app_version``); both or neither, and only on such a write."""
    from coordinator.core.conflicts import check_app_version

    app_id, version = _option(options, "app_id"), _option(options, "app_version")
    if app_id is None and version is None:
        return None
    if not write:
        raise InvalidInput("mergetxn: options 'app_id' and 'app_version' apply to writes, not reads")
    if app_id is None or version is None:
        raise InvalidInput("mergetxn: options 'app_id' and 'app_version' go together: give both")
    if _option(options, "txn") is not None:
        raise InvalidInput("mergetxn: options 'app_id'/'app_version' make a write commit on its own; with "
                           "option 'txn' set the version on the transaction (tx.set_app_version)")
    return check_app_version(app_id, _int_option(options, "app_version", 0))


def connect(s: Settings):
    """A client of the replica named by the options, with an error a Spark user understands."""
    from coordinator.api.client import Client

    try:
        return Client(s.replica, s.storage_options, credentials=s.credentials)
    except ReplicaUnavailable as exc:
        raise ReplicaUnavailable(f"mergetxn: cannot reach replica {s.replica} (option 'replica'): "
                                 f"{exc.message}") from None


def table_def(client, s: Settings) -> TableDef:
    """The table's definition at the read's snapshot (``snapshot``, ``as_of``, the end of a
    ``changes`` range by id), else the latest: a read sees the schema at its snapshot."""
    snapshot = s.snapshot
    if snapshot is None and s.changes is not None and s.changes[2] == "id":
        snapshot = s.changes[1]
    try:
        return client.table_at(s.table, snapshot=snapshot, as_of=s.as_of)
    except errors.TableNotFound as exc:
        raise errors.TableNotFound(f"mergetxn: unknown table {s.table!r} (replica {s.replica}): "
                                   f"{exc.message}", table=s.table) from None


# ---------------------------------------------------------------------------------------------
# Per-process caches (executors reuse their Python workers)

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


def spark_schema(schema: pa.Schema) -> StructType:
    """The table's schema as Spark sees it; nullability kept, naive timestamps as TIMESTAMP_NTZ."""
    from pyspark.sql.pandas.types import from_arrow_schema

    try:
        return from_arrow_schema(schema, prefer_timestamp_ntz=True)
    except (TypeError, NotImplementedError, Exception) as exc:  # pyspark raises its own types
        raise InvalidInput(f"mergetxn: a column type of {schema} has no Spark equivalent: {exc}") from None


def arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timestamp_utc=True)


# ---------------------------------------------------------------------------------------------
# Tables in Spark's session catalog (CREATE TABLE t USING mergetxn OPTIONS (...))
#
# Spark hands a CREATE TABLE's options to the data source's schema() (with keys of its own:
# ``provider``, ``location``, ``owner``, ``option.*``) and keeps them in the catalog, but a later
# SELECT or INSERT on the table reaches the data source with no options at all (Spark 4.1), only
# with the schema the catalog kept. So schema() writes the table's options into each field's
# metadata and reader()/writer() read them back from there when they got no table name.
# Secrets stay out (S3 keys, tokens: give them through the environment to such tables).

CATALOG_METADATA = "mergetxn.table_options"
_CATALOG_KEYS = ("provider", "location", "owner")  # what Spark's session catalog adds to a CREATE's options
_SECRET_OPTION = re.compile(r"secret|token|password|key$", re.IGNORECASE)
_MAX_CATALOG_OPTIONS = 16 * 1024  # characters of JSON worth reading back


def catalog_options(options: Any) -> dict[str, str] | None:
    """A CREATE TABLE's options worth keeping for the table's later reads and writes (None: the
    options are not a CREATE TABLE's)."""
    keys = {str(k).lower() for k in options}
    if "provider" not in keys or not ({"path", "location"} & keys):
        return None
    out = {str(k).lower(): str(v) for k, v in options.items()
           if str(k).lower() not in _CATALOG_KEYS and not str(k).lower().startswith("option.")
           and not _SECRET_OPTION.search(str(k))}
    out.setdefault("path", str(options.get("location")))
    return out


def with_catalog_options(schema: StructType, options: Any) -> StructType:
    """``schema`` carrying a CREATE TABLE's options in its fields' metadata (unchanged otherwise)."""
    kept = catalog_options(options)
    if kept is None:
        return schema
    from pyspark.sql.types import StructField

    text = json.dumps(kept, sort_keys=True)
    return StructType([StructField(f.name, f.dataType, f.nullable, {**(f.metadata or {}), CATALOG_METADATA: text})
                       for f in schema.fields])


def table_options(options: Any, schema: StructType | None, write: bool = False) -> Any:
    """The options of one read or write: as given, or, for a table of the session catalog (no
    table name given), those its CREATE TABLE kept in the schema (reads at the table's
    ``snapshot``/``as_of``; writes without them)."""
    if _option(options, "path") is not None or schema is None:
        return options
    texts = {(f.metadata or {}).get(CATALOG_METADATA) for f in schema.fields} - {None}
    if not texts:
        return options
    if len(texts) != 1:
        raise InvalidInput("mergetxn: the table's columns name different mergetxn tables in their metadata")
    text = texts.pop()
    try:
        kept = json.loads(text) if isinstance(text, str) and len(text) <= _MAX_CATALOG_OPTIONS else None
    except ValueError:
        kept = None
    if not isinstance(kept, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in kept.items()):
        raise InvalidInput(f"mergetxn: the catalog's {CATALOG_METADATA} metadata does not parse; create the "
                           "table again (CREATE TABLE ... USING mergetxn OPTIONS (path 'table', replica 'host:port'))")
    if write:
        kept = {k: v for k, v in kept.items() if k not in READ_ONLY_OPTIONS}
    return {**dict(options), **kept}


# ---------------------------------------------------------------------------------------------
# The data source


class MergetxnDataSource(DataSource):
    """``spark.read.format("mergetxn")`` / ``df.write.format("mergetxn")``; the path is the table."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        from spark.streaming import schema_options

        s = settings(schema_options(self.options))
        with connect(s) as client:
            tdef = table_def(client, s)
        schema = tdef.schema
        if s.changes is not None:
            schema = schema.append(pa.field("_change", pa.string(), nullable=False))
            schema = schema.append(pa.field("_csn", pa.int64(), nullable=False))
        return with_catalog_options(spark_schema(schema), self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        s = settings(table_options(self.options, schema))
        with connect(s) as client:
            tdef = table_def(client, s)
            url = client.call("info")["storage_url"]
        cls = PruningReader if _pushdown_enabled() else MergetxnReader
        return cls(s, schema, tdef.to_dict(), url)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        s = settings(table_options(self.options, schema, write=True), write=True)
        with connect(s) as client:
            url = client.call("info")["storage_url"]
            if s.txn is not None:
                tx = join(client, s)
            else:  # committed by another process (the commit runner): no client session holds it
                tx = client.begin(detached=True)
            try:  # the rows are written for the table as the transaction sees it
                tdef = tx.table(s.table)
                check_write_schema(tdef, schema)
            except errors.TableNotFound as exc:
                if s.txn is None:
                    _rollback_quietly(tx)
                raise errors.TableNotFound(f"mergetxn: unknown table {s.table!r} (replica {s.replica}): "
                                           f"{exc.message}", table=s.table) from None
            except BaseException:
                if s.txn is None:
                    _rollback_quietly(tx)
                raise
            if s.trace_commits:
                event = {"event": "join"} if s.txn is not None else {"event": "begin", "snapshot": tx.snapshot}
                try:
                    _trace_commit(s.trace_commits, {**event, "table": s.table, "txn": tx.id})
                except InvalidInput:
                    if s.txn is None:
                        _rollback_quietly(tx)
                    raise
        return MergetxnWriter(s, tdef.to_dict(), url, tx.id, own=s.txn is None, overwrite=overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool):  # noqa: N802 - Spark's name
        """``df.writeStream.format("mergetxn")``: each micro-batch committed exactly once
        (spark/streaming.py)."""
        from spark.streaming import stream_writer

        return stream_writer(self.options, schema, overwrite)

    def streamReader(self, schema: StructType):  # noqa: N802 - Spark's name
        """``spark.readStream.format("mergetxn")``: the table's changes, CSNs as offsets
        (spark/streaming.py)."""
        from spark.streaming import stream_reader

        return stream_reader(self.options, schema)


def _pushdown_enabled() -> bool:
    """Whether Spark will call ``pushFilters`` for this read. Spark 4.1 refuses a reader that
    implements it while ``spark.sql.python.filterPushdown.enabled`` is false, and tells the
    reader nothing; its planner keeps the flag in a local named ``enable_pushdown`` (the pushdown
    planner, used only when the flag is on, has none)."""
    import sys

    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            break
        if "enable_pushdown" in frame.f_locals:
            return bool(frame.f_locals["enable_pushdown"])
        frame = frame.f_back
    return True


def check_write_schema(tdef: TableDef, schema: StructType) -> None:
    """Fail the job before any task runs when the DataFrame's columns do not fit the table
    (missing, unexpected, or a type that would lose values), naming every such column."""
    try:
        incoming = arrow_schema(schema)
    except Exception as exc:
        raise InvalidInput(f"mergetxn: write to {tdef.name!r}: a column type has no Arrow "
                           f"equivalent: {exc}") from None
    empty = pa.Table.from_batches([], schema=pa.schema([f.with_nullable(True) for f in incoming]))
    empty = _align_time_zones(empty, tdef.schema)
    try:
        conform(tdef.schema, empty, tdef.name, what="mergetxn: schema mismatch writing to",
                required=tdef.partition_by)
    except InvalidInput as exc:
        raise InvalidInput(f"{exc.message} (table columns: "
                           f"{[f'{f.name} {f.type}' for f in tdef.schema]})", table=tdef.name) from None


def join(client, s: Settings):
    """The driver's open transaction (option ``txn``), checked to be running on this replica."""
    from coordinator.core.versions import Tid

    try:
        tid = Tid.parse(s.txn)
    except ValueError:
        raise InvalidInput(f"mergetxn: option 'txn' must be a transaction id (tx.id), not {s.txn!r}") from None
    if tid.host_id != client.host_id:
        raise InvalidInput(f"mergetxn: transaction {s.txn} runs on replica {tid.host_id}, but option "
                           f"'replica' names {s.replica} ({client.host_id}); use that replica's address")
    tx = client.join(s.txn)
    try:
        client.call("visible", table=s.table, id=tx.id, partitions=[])
    except errors.TransactionAborted as exc:
        raise errors.TransactionAborted(f"mergetxn: cannot join transaction {s.txn}: {exc.message}",
                                        id=s.txn) from None
    return tx


# ---------------------------------------------------------------------------------------------
# Writes


@dataclass
class PartsMessage(WriterCommitMessage):
    """What one accepted task attempt wrote: part descriptors (JSON-safe dicts)."""

    parts: list[dict]
    rows: int
    task: int = -1
    attempt: int = -1


class MergetxnWriter(DataSourceArrowWriter):
    """Executors write Arrow batches as parts; the job's commit stages them in one transaction."""

    def __init__(self, s: Settings, tdef: dict, storage_url: str, txn_id: str, own: bool,
                 overwrite: bool) -> None:
        self.s = s
        self.tdef = tdef
        self.storage_url = storage_url
        self.txn_id = txn_id
        self.own = own
        self.overwrite = overwrite

    def __repr__(self) -> str:
        return f"MergetxnWriter(table={self.s.table!r}, txn={self.txn_id}, overwrite={self.overwrite})"

    # -- executors ----------------------------------------------------------------------------
    def write(self, iterator: Iterator[pa.RecordBatch]) -> PartsMessage:
        """Buffer batches and write them as parts; each chunk is encoded and stored in a
        background thread while the next one arrives from the JVM."""
        from concurrent.futures import Future, ThreadPoolExecutor

        tdef = TableDef.from_dict(self.tdef)
        storage = storage_for(self.storage_url, self.s.storage_options)
        limit_rows = self.s.rows_per_part or math.inf
        written: list[PartMeta] = []
        buffer: list[pa.RecordBatch] = []
        rows = nbytes = 0
        pending: Future | None = None
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mergetxn-part")

        def flush(batches: list[pa.RecordBatch]) -> None:
            nonlocal pending
            if pending is not None:
                written.extend(pending.result())  # at most one chunk in flight: memory stays bounded
            pending = pool.submit(self._flush, storage, tdef, batches)

        try:
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                buffer.append(batch)
                rows += batch.num_rows
                nbytes += batch.nbytes
                if rows >= limit_rows or nbytes >= PART_BYTES:
                    flush(buffer)
                    buffer, rows, nbytes = [], 0, 0
            if buffer:
                flush(buffer)
            if pending is not None:
                written.extend(pending.result())
                pending = None
        except BaseException:
            # This attempt will not be committed: its parts would only be orphans.
            if pending is not None:
                try:
                    written.extend(pending.result())
                except Exception:
                    pass
            for m in written:
                _delete_quietly(storage, m.path)
            raise
        finally:
            pool.shutdown(wait=True)
        task, attempt = _task_ids()
        return PartsMessage([m.to_dict() for m in written], sum(m.rows for m in written), task, attempt)

    def _flush(self, storage: Storage, tdef: TableDef, batches: list[pa.RecordBatch]) -> list[PartMeta]:
        data = _align_time_zones(pa.Table.from_batches(batches), tdef.schema)
        if tdef.conflict_policy is Policy.KEYS:  # rows by key in overwrite mode, as tx.insert writes them
            data = keys.versions(tdef.schema, tdef.primary_key, tdef.name, data, keys.PUT, self._next_seq(data.num_rows))
        else:
            data = conform(tdef.schema, data, tdef.name, what="mergetxn: write to", required=tdef.partition_by)
        return [
            write_part(storage, tdef.name, list(tdef.partition_by), partition, chunk, self.txn_id, tdef.ddl_version,
                       primary_key=tdef.primary_key if tdef.conflict_policy is Policy.KEYS else ())
            for partition, chunk in split_by_partition(data, list(tdef.partition_by))
        ]

    def _next_seq(self, n: int) -> int:
        """The first ``_seq`` of ``n`` versions: each task numbers its own from its partition id
        on (2**40 apart), so versions of one job never share one (a key written twice in one job
        keeps the later row of the later task)."""
        task = _task_ids()[0]
        first = getattr(self, "_seq", (task << 40) + 1)
        self._seq = first + n
        return first

    # -- driver -------------------------------------------------------------------------------
    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        metas = _metas(messages)
        s = self.s
        with connect(s) as client:
            tx = client.join(self.txn_id)
            op = "overwrite" if self.overwrite else "insert"
            try:
                tx.add_parts(s.table, metas, op=op)
                if self.own and s.app is not None:
                    tx.set_app_version(*s.app)  # DuplicateCommit at the commit if it was committed
            except errors.MergetxnError as exc:
                if self.own:
                    _rollback_quietly(tx)
                raise type(exc)(f"mergetxn: staging the write to {s.table!r} in transaction "
                                f"{self.txn_id} failed: {exc.message}", **exc.details) from None
            if not self.own:
                if s.trace_commits:
                    _trace_commit(s.trace_commits, {"event": "staged", "table": s.table, "txn": self.txn_id,
                                                    "parts": len(metas)}, quiet=True)
                return
            try:
                csn = tx.commit()
            except errors.ConflictError as exc:
                raise errors.ConflictError(
                    f"mergetxn: the write to {s.table!r} (transaction {self.txn_id}) conflicts with "
                    f"transaction {exc.winner}, which committed first; nothing of this write is "
                    f"visible. {exc.message}", **exc.details) from None
            if s.trace_commits:
                _trace_commit(s.trace_commits, {"event": "committed", "table": s.table, "txn": self.txn_id,
                                                "csn": csn, "parts": len(metas)}, quiet=True)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Remove what the accepted tasks wrote, unless a commit may reference it."""
        metas = _metas(messages)
        s = self.s
        try:
            client = connect(s)
        except errors.MergetxnError:
            return  # cannot tell what the replica holds: leave the files to gc
        with client:
            storage = client.storage
            try:
                if self.own:
                    status = client.commit_status(self.txn_id)
                    if status.status in ("committed", "committing"):
                        return
                    _rollback_quietly(client.join(self.txn_id))
                    keep: set[str] = set()
                else:
                    try:
                        r = client.call("visible", table=s.table, id=self.txn_id)
                        keep = {m["name"] for m in r["parts"]}
                    except errors.TransactionAborted:
                        keep = set()
            except errors.MergetxnError:
                return
            for m in metas:
                if m.name not in keep:
                    _delete_quietly(storage, m.path)


def _align_time_zones(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """Spark labels zoned timestamps with its session time zone (e.g. ``Etc/UTC``); the instants
    are the same in any zone, so relabel them with the table's zone before conforming."""
    for i, name in enumerate(data.column_names):
        t = data.schema.field(i).type
        idx = schema.get_field_index(name)
        if idx < 0 or not pa.types.is_timestamp(t) or t.tz is None:
            continue
        want = schema.field(idx).type
        if pa.types.is_timestamp(want) and want.tz is not None and want.tz != t.tz:
            data = data.set_column(i, name, data.column(i).cast(pa.timestamp(t.unit, tz=want.tz)))
    return data


def _task_ids() -> tuple[int, int]:
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None:
            return ctx.partitionId(), ctx.attemptNumber()
    except Exception:
        pass
    return -1, -1


def _metas(messages: Sequence[WriterCommitMessage | None]) -> list[PartMeta]:
    """Descriptors of the accepted attempts, each part once."""
    out: dict[str, PartMeta] = {}
    for msg in messages:
        if isinstance(msg, PartsMessage):
            for d in msg.parts:
                m = PartMeta.from_dict(d)
                out.setdefault(m.name, m)
    return list(out.values())


def _rollback_quietly(tx) -> None:
    try:
        tx.rollback()
    except errors.MergetxnError:
        pass


def _delete_quietly(storage: Storage, path: str) -> None:
    for p in (path, path[: -len(".parquet")] + ".json"):
        try:
            storage.delete(p)
        except Exception:
            pass


# ---------------------------------------------------------------------------------------------
# Reads


class PartsPartition(InputPartition):
    """One read task: a few parts of one snapshot (descriptors only; no credentials)."""

    def __init__(self, index: int, parts: list[dict], csns: dict[str, int] | None = None) -> None:
        super().__init__(index)
        self.parts = parts
        self.csns = csns  # a keys table's partition: part -> creation CSN, the order its versions fold in

    def __repr__(self) -> str:
        return f"PartsPartition({self.value}, {len(self.parts)} part(s))"


class ChangesPartition(InputPartition):
    """One read task of an incremental read: rows already selected by the replica (Arrow IPC)."""

    def __init__(self, index: int, ipc: bytes) -> None:
        super().__init__(index)
        self.ipc = ipc

    def __repr__(self) -> str:
        return f"ChangesPartition({self.value}, {len(self.ipc)} bytes)"


class MergetxnReader(DataSourceReader):
    """Plans one read task per part (small parts grouped) from the visible part list."""

    def __init__(self, s: Settings, schema: StructType, tdef: dict, storage_url: str) -> None:
        self.s = s
        self.schema_json = schema.json()
        self.tdef = tdef
        self.storage_url = storage_url
        self.pushed: list[tuple[str, str, Any]] = []

    def __repr__(self) -> str:
        return f"{type(self).__name__}(table={self.s.table!r}, pushed={len(self.pushed)})"

    # -- planning -----------------------------------------------------------------------------
    def partitions(self) -> list[InputPartition]:
        s = self.s
        with connect(s) as client:
            if s.changes is not None:
                return self._changes_partitions(client)
            args: dict[str, Any] = {"table": s.table}
            if s.snapshot is not None:
                args["snapshot"] = s.snapshot
            if s.as_of is not None:
                args["as_of"] = s.as_of
            try:
                # The job's snapshot stays in use until the lease lapses (read_lease_seconds after
                # planning): Spark tells a reader nothing when the job ends, so there is no release.
                r = client.call("visible", lease=s.lease, **args)
            except errors.TableNotFound as exc:
                raise errors.TableNotFound(f"mergetxn: {exc.message}", table=s.table) from None
        metas = [PartMeta.from_dict(m) for m in r["parts"]]
        where = self.where()
        tdef = TableDef.from_dict(self.tdef)
        if tdef.conflict_policy is Policy.KEYS:
            return _keys_partitions(tdef, metas, r.get("csns") or {}, where)
        if where is not None:
            metas = [m for m in metas
                     if may_match(tdef.stats_at(m.stats, m.schema_version), list(tdef.partition_by), m.partition,
                                  where, tdef.schema)]
        return [PartsPartition(i, [m.to_dict() for m in group])
                for i, group in enumerate(_group(metas, s.split_bytes))]

    def _changes_partitions(self, client) -> list[InputPartition]:
        start, end, by = self.s.changes
        data = client.changes(self.s.table, start, end, by=by)
        out = []
        for i, batch in enumerate(data.combine_chunks().to_batches(max_chunksize=1_000_000)):
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, batch.schema) as w:
                w.write_batch(batch)
            out.append(ChangesPartition(i, sink.getvalue().to_pybytes()))
        return out

    def where(self) -> pc.Expression | None:
        """The pushed filters as one expression that ``may_match`` understands."""
        expr = None
        for col, op, value in self.pushed:
            if op == "in":
                term = None
                for v in value:
                    t = pc.field(col) == v
                    term = t if term is None else (term | t)
            else:
                term = _CMP[op](pc.field(col), value)
            expr = term if expr is None else (expr & term)
        return expr

    # -- executors ----------------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if partition is None:  # Spark's stand-in when partitions() planned none (no parts)
            return
        target = arrow_schema(StructType.fromJson(_loads(self.schema_json)))
        if isinstance(partition, ChangesPartition):
            with pa.ipc.open_stream(partition.ipc) as r:
                for batch in r:
                    yield _fit(pa.Table.from_batches([batch]), target).to_batches()[0]
            return
        storage = storage_for(self.storage_url, self.s.storage_options)
        metas = [PartMeta.from_dict(d) for d in partition.parts]
        tdef = TableDef.from_dict(self.tdef)
        if partition.csns is not None:  # a keys table's partition: its versions fold to one row per key
            csns = partition.csns
            folded = keyfold.merge(tdef.schema, tdef.primary_key,
                                [(csns.get(m.name, keys.OWN), d)
                                 for m, d in zip(metas, _prefetch(storage, metas, self.s.trace_reads))])
            yield from _fit(folded, target).to_batches(max_chunksize=BATCH_ROWS)
            return
        for data in _prefetch(storage, metas, self.s.trace_reads, tdef):
            yield from _fit(data, target).to_batches(max_chunksize=BATCH_ROWS)


_CMP = {
    "==": lambda a, b: a == b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


class PruningReader(MergetxnReader):
    """The reader when Spark pushes filters down (``spark.sql.python.filterPushdown.enabled``):
    it keeps comparisons of a column with a literal to skip parts by partition value and by
    column min/max, and hands every filter back, so Spark still filters the rows."""

    def pushFilters(self, filters):  # noqa: N802 - Spark's name
        from pyspark.sql.datasource import (
            EqualNullSafe,
            EqualTo,
            GreaterThan,
            GreaterThanOrEqual,
            In,
            LessThan,
            LessThanOrEqual,
        )

        ops = {EqualTo: "==", EqualNullSafe: "==", GreaterThan: ">", GreaterThanOrEqual: ">=",
               LessThan: "<", LessThanOrEqual: "<="}
        names = set(TableDef.from_dict(self.tdef).schema.names)
        for f in filters:
            attr = getattr(f, "attribute", ())
            if len(attr) == 1 and attr[0] in names:
                value = getattr(f, "value", None)
                if type(f) in ops and _prunable(value):
                    self.pushed.append((attr[0], ops[type(f)], value))
                elif isinstance(f, In) and 0 < len(value) <= 64 and all(_prunable(v) for v in value):
                    self.pushed.append((attr[0], "in", tuple(value)))
            yield f  # Spark evaluates every filter on the rows it gets


def _keys_partitions(tdef: TableDef, metas: list[PartMeta], csns: dict[str, int],
                     where: pc.Expression | None) -> list[InputPartition]:
    """Read tasks of a keys table: one per table partition (a key lives in one), all its parts
    folded together. Only partition values prune: a part whose statistics miss the filter may
    still hold the newest version of a row that another part's older version matches."""
    by_partition: dict[str, list[PartMeta]] = {}
    for m in metas:
        if where is None or may_match({}, list(tdef.partition_by), m.partition, where, tdef.schema):
            by_partition.setdefault(m.partition_key, []).append(m)
    return [PartsPartition(i, [m.to_dict() for m in group], {m.name: csns[m.name] for m in group if m.name in csns})
            for i, (_, group) in enumerate(sorted(by_partition.items()))]


def _prunable(value: Any) -> bool:
    """Literals whose order against part statistics is exact (see coordinator.core.tabledata.may_match)."""
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, (bool, int, str)) or (
        isinstance(value, dt.date) and not isinstance(value, dt.datetime))


def _loads(text: str) -> dict:
    import json

    return json.loads(text)


def _group(metas: list[PartMeta], split_bytes: int) -> list[list[PartMeta]]:
    """Read tasks: one per part; small parts of a partition packed together, up to
    ``split_bytes`` and SPLIT_ROWS per task."""
    metas = sorted(metas, key=lambda m: (m.partition_key, m.name))
    groups: list[list[PartMeta]] = []
    size = rows = 0
    for m in metas:
        if groups and size + m.size <= split_bytes and rows + m.rows <= SPLIT_ROWS:
            groups[-1].append(m)
            size += m.size
            rows += m.rows
        else:
            groups.append([m])
            size, rows = m.size, m.rows
    return groups


def _prefetch(storage: Storage, metas: list[PartMeta], trace: str | None,
              tdef: TableDef | None = None) -> Iterator[pa.Table]:
    """Read the parts in order, the next one in the background while this one is consumed;
    with ``tdef``, each under that definition (columns renamed or added since it was written)."""
    from concurrent.futures import ThreadPoolExecutor

    def load(m: PartMeta) -> pa.Table:
        if trace:
            _trace(trace, m)
        data = read_part(storage, m)
        return data if tdef is None else tdef.upgrade(data, m.schema_version)

    if len(metas) <= 1:
        for m in metas:
            yield load(m)
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(load, metas[0])
        for nxt in metas[1:]:
            data = future.result()
            future = pool.submit(load, nxt)
            yield data
        yield future.result()


def _trace(path: str, m: PartMeta) -> None:
    """Option ``trace_reads``: append ``<table> <part>`` per part read (tests, debugging)."""
    line = f"{m.table} {m.name}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, line)
    finally:
        os.close(fd)


def _trace_commit(path: str, event: dict, quiet: bool = False) -> None:
    """Option ``trace_commits``: append one JSON line (see the module's docstring). ``quiet``
    after the commit: a trace that cannot be written must not make a committed job fail (the
    caller still has the ``begin`` line to ask ``commit_status`` with)."""
    import json

    line = (json.dumps(event, sort_keys=True) + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        if quiet:
            return
        raise InvalidInput(f"mergetxn: option 'trace_commits': cannot write {path!r}: {exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, line)
    finally:
        os.close(fd)


def _fit(data: pa.Table, target: pa.Schema) -> pa.Table:
    """The columns Spark asked for, in its order and Arrow types."""
    if data.schema.equals(target, check_metadata=False):
        return data
    missing = [f.name for f in target if f.name not in data.column_names]
    if missing:
        raise InvalidInput(f"mergetxn: the table has no column(s) {missing}")
    cols = []
    for f in target:
        col = data.column(f.name)
        if not col.type.equals(f.type):
            col = col.cast(f.type)
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=pa.schema([f.with_nullable(True) for f in target]))
