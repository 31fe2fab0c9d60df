"""Structured Streaming on Spark 4's Python streaming data source API: an exactly-once sink and a
source of changes, both behind ``format("mergetxn")`` (the hooks are ``streamWriter`` and
``streamReader`` of :class:`spark.datasource.MergetxnDataSource`).

The sink (``df.writeStream.format("mergetxn").option("checkpointLocation", d).start(table)``)
commits every micro-batch as one transaction carrying the application version
``(app id, batch id)`` (``tx.set_app_version``). Spark calls the Python side three times a batch,
each in a process of its own: ``streamWriter()`` in a planner process, whose writer is pickled to
the executors; ``write()`` in the executors; and ``streamWriter()`` again, then
``commit(messages, batchId)``, in the driver's commit runner. So:

* the batch's transaction is begun when its writer is shipped to the executors (pickled), never
  by the commit runner's writer, which is not shipped; the executors name their parts after it
  (cleanup keeps a running transaction's files) and their messages carry its id to the commit;
* the commit joins it, stages the parts, sets the version and commits. A batch that Spark runs
  again (the query died after the commit and before Spark wrote its own commit log, or a
  checkpoint's ``commits/<n>`` was lost) fails that commit with ``DuplicateCommit``: nothing of
  it is visible, the commit returns as a success, and the replay's parts are deleted at once
  (``mergetxn gc`` would collect them anyway: their transaction aborted);
* the app id is ``spark-stream:<query id>``: Spark keeps the query id in the checkpoint
  (``<checkpointLocation>/metadata``), the same for every restart from that checkpoint and new
  for a new checkpoint, whose batch ids start again at 0. Where that file cannot be read (a
  file system neither local nor fsspec's), give option ``app_id`` — stable across restarts of
  this query and unique to it.

Output mode ``complete`` (Spark's ``overwrite``) replaces the whole table in each batch's commit.

The source (``spark.readStream.format("mergetxn").option("changes_from", csn).load(table)``)
streams the rows of the parts added (``_change`` "insert") and removed ("delete") by each commit,
with ``_csn``; offsets are ``{"csn": n}``, a batch covers (start, end] and reads it with
``client.changes``. ``changes_from`` is required (it gives the stream its schema): a CSN, the
changes after it, or ``"latest"``, the changes committed from the query's start. A restarted query
resumes from its checkpoint's offset. The latest offset never passes the replica's snapshot:
every commit at or below a replica's snapshot is applied there, so no commit can later appear
inside a range already read (no gaps), and none is read twice (the ranges do not overlap); after
its first answer it is the last commit that changed the table, so commits elsewhere make no empty
batches. ``changes_by="time"`` leaves compaction commits out, keeping CSN offsets. While the query
runs, its reader holds a read lease at the start of its next batch (renewed by a thread of the
stream reader's process), so cleanup keeps what the stream has yet to read however far it lags;
while it is stopped nothing is pinned, and changes older than what cleanup retained then fail the
query with ``SnapshotUnavailable`` instead of being skipped. Rows travel from the driver to the
tasks in the planned partitions (Arrow IPC), as the batch source's incremental reads do.

Option ``failpoints`` (a directory; tests): when ``<dir>/stream_before_commit`` or
``<dir>/stream_after_commit`` exists, the commit runner that reaches that point removes it,
creates ``<name>.reached`` and dies (``os._exit``), as a driver killed there would; if the file
says ``hold``, it waits there instead, for the test to kill the driver itself.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from coordinator.core import errors
from coordinator.core.errors import InvalidInput
from parts.io.format import delete_part
from spark.changes import ChangesPartition, changes_partitions, read_changes
from spark.options import LATEST, Settings, connect, option, settings
from spark.schema import arrow_schema, check_write_schema
from spark.writer import MergetxnWriter, PartsMessage, part_metas, rollback_quietly

APP_PREFIX = "spark-stream:"


# ---------------------------------------------------------------------------------------------
# Options


def _sink_settings(options: Mapping[str, Any]) -> tuple[Settings, str | None]:
    """The sink's settings and its ``app_id`` option; ``app_version`` and ``txn`` do not apply:
    a stream's version is its batch id and each batch commits on its own."""
    for name in ("app_version", "txn"):
        if option(options, name) is not None:
            raise InvalidInput(
                f"mergetxn: option {name!r} does not apply to a stream: each micro-batch "
                "commits on its own, versioned by its batch id"
            )
    app_id = option(options, "app_id")
    rest = {k: v for k, v in options.items() if k.lower() != "app_id"}
    return settings(rest, write=True), app_id


@dataclass(frozen=True)
class SourceSettings:
    s: Settings
    start: int | None  # None: the latest CSN when the query starts
    by: str


def _source_settings(options: Mapping[str, Any]) -> SourceSettings:
    for name in ("changes_to", "snapshot", "as_of"):
        if option(options, name) is not None:
            raise InvalidInput(f"mergetxn: option {name!r} does not apply to a stream of changes")
    start_text = option(options, "changes_from")
    if start_text is None:
        raise InvalidInput(
            "mergetxn: a stream of changes needs option 'changes_from': a CSN (the changes "
            "committed after it) or 'latest' (those committed from the query's start)"
        )
    by = (option(options, "changes_by") or "id").lower()
    if by not in ("id", "time"):
        raise InvalidInput(f"mergetxn: option 'changes_by' must be 'id' or 'time', not {by!r}")
    start: int | None = None
    if start_text.lower() != LATEST:
        try:
            start = int(start_text)
        except ValueError:
            raise InvalidInput(
                f"mergetxn: a stream's option 'changes_from' must be a CSN (offsets are CSNs, "
                f"also by time) or 'latest', not {start_text!r}"
            ) from None
        if start < 0:
            raise InvalidInput(f"mergetxn: option 'changes_from' must be >= 0, not {start}")
    rest = {k: v for k, v in options.items() if k.lower() not in ("changes_from", "changes_by")}
    return SourceSettings(settings(rest), start, by)


# ---------------------------------------------------------------------------------------------
# The sink


def query_app_id(options: Mapping[str, Any], s: Settings) -> str:
    """The application id of a streaming query's commits: option ``app_id``, else derived from the
    query id that Spark keeps in ``<checkpointLocation>/metadata`` (see the module docstring)."""
    location = option({k.lower(): v for k, v in options.items()}, "checkpointlocation")
    if location is None:
        raise InvalidInput(
            "mergetxn: a streaming write needs option 'checkpointLocation' (its commits are "
            "idempotent by the query's id, kept there) or option 'app_id'"
        )
    path = location.rstrip("/") + "/metadata"
    try:
        text = _read_text(path, s)
        query_id = json.loads(text.splitlines()[0])["id"]
    except Exception as exc:  # any file system's error: say what to do instead
        raise InvalidInput(
            f"mergetxn: cannot read the streaming query's id from {path!r} ({exc}); give "
            "option 'app_id' (stable across restarts of this query, unique to it)"
        ) from None
    return APP_PREFIX + str(query_id)


def _read_text(path: str, s: Settings) -> str:
    if "://" not in path and not path.startswith("file:"):
        with open(path, encoding="utf-8") as f:
            return f.read()
    import fsspec

    if path.startswith("file:") and not path.startswith("file://"):
        path = "file://" + path[len("file:") :]
    if path.startswith("s3a://") or path.startswith("s3n://"):
        path = "s3://" + path.split("://", 1)[1]
    opts = dict(s.storage_options or {}) if path.startswith("s3://") else {}
    with fsspec.open(path, "rt", encoding="utf-8", **opts) as f:
        return f.read()


@dataclass
class StreamPartsMessage(PartsMessage):
    """A task's parts and the batch's transaction they were written for."""

    txn: str = ""


class MergetxnStreamWriter(DataSourceStreamArrowWriter):
    """One micro-batch: executors write parts for the batch's transaction; the commit runner
    commits them with the version (app id, batch id)."""

    def __init__(self, s: Settings, app_id: str | None, options: dict, schema_json: str, overwrite: bool) -> None:
        self.s = s
        self.app_id = app_id
        self.options = options  # for the query id at commit (checkpointLocation)
        self.failpoints = option(options, "failpoints")
        self.schema_json = schema_json
        self.overwrite = overwrite
        self.txn_id: str | None = None  # begun when shipped (__getstate__)
        self.tdef: dict | None = None
        self.storage_url: str | None = None
        self.partition_limit: int | None = None  # the replica's max_partition_value_bytes

    def __repr__(self) -> str:
        return f"MergetxnStreamWriter(table={self.s.table!r}, txn={self.txn_id})"

    def __getstate__(self) -> dict:
        if self.txn_id is None:
            self._begin()
        return dict(self.__dict__)

    def _begin(self) -> None:
        """The batch's transaction, for the executors to name their parts after."""
        s = self.s
        with connect(s) as client:
            try:
                tdef = client.table_at(s.table)
            except errors.TableNotFound as exc:
                raise errors.TableNotFound(
                    f"mergetxn: unknown table {s.table!r} (replica {s.replica}): {exc.message}", table=s.table
                ) from None
            check_write_schema(tdef, StructType.fromJson(json.loads(self.schema_json)))
            url = client.storage.url
            tx = client.begin(detached=True)  # committed by the commit runner: no client session holds it
            self.tdef, self.storage_url, self.txn_id = tdef.to_dict(), url, tx.id
            self.partition_limit = client.max_partition_value_bytes

    def _batch_writer(self, txn_id: str) -> MergetxnWriter:
        return MergetxnWriter(
            self.s,
            self.tdef or {},
            self.storage_url or "",
            txn_id,
            own=True,
            overwrite=self.overwrite,
            partition_limit=self.partition_limit,
        )

    # -- executors ----------------------------------------------------------------------------
    def write(self, iterator: Iterator[pa.RecordBatch]) -> StreamPartsMessage:
        assert self.txn_id is not None, "the writer reaches executors pickled, its transaction begun"
        m = self._batch_writer(self.txn_id).write(iterator)
        return StreamPartsMessage(m.parts, m.rows, m.task, m.attempt, txn=self.txn_id)

    # -- driver (commit runner) ---------------------------------------------------------------
    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Commit the batch once: a batch committed before (a replay) changes nothing."""
        s = self.s
        app_id = self.app_id or query_app_id(self.options, s)
        metas = part_metas(messages)
        txns = {m.txn for m in messages if isinstance(m, StreamPartsMessage) and m.txn}
        if len(txns) > 1:
            raise InvalidInput(f"mergetxn: the tasks of batch {batchId} wrote for transactions {sorted(txns)}")
        _failpoint(self.failpoints, "stream_before_commit")
        with connect(s) as client:
            tx = client.join(txns.pop()) if txns else client.begin()
            try:
                if self.overwrite:
                    tx.truncate(s.table)
                tx.add_parts(s.table, metas, op="insert")
                tx.set_app_version(app_id, batchId)
            except errors.MergetxnError as exc:
                rollback_quietly(tx)
                raise type(exc)(
                    f"mergetxn: staging batch {batchId} of the stream into {s.table!r} failed: {exc.message}",
                    **exc.details,
                ) from None
            try:
                tx.commit()
            except errors.DuplicateCommit:
                for m in metas:  # a replay: nothing of it is visible, nothing references its parts
                    delete_part(client.storage, m.path)
                return
        _failpoint(self.failpoints, "stream_after_commit")

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """A failed batch: roll its transaction back and delete the parts of its accepted tasks."""
        txns = {m.txn for m in messages if isinstance(m, StreamPartsMessage) and m.txn}
        for txn in txns:
            self._batch_writer(txn).abort([m for m in messages if getattr(m, "txn", None) == txn])


def _failpoint(directory: str | None, name: str) -> None:
    """Option ``failpoints`` (tests): die here, as a driver killed at this point would."""
    if not directory:
        return
    armed = os.path.join(directory, name)
    try:
        with open(armed) as f:
            hold = f.read().strip() == "hold"
        os.remove(armed)
    except FileNotFoundError:
        return
    with open(armed + ".reached", "w"):
        pass
    while hold:  # until the driver is killed
        time.sleep(0.05)
    os._exit(70)


def stream_writer(options: Mapping[str, Any], schema: StructType, overwrite: bool) -> MergetxnStreamWriter:
    """``DataSource.streamWriter``: options checked now; the replica is asked once the writer is
    shipped to the executors (its transaction) and in the commit."""
    s, app_id = _sink_settings(options)
    return MergetxnStreamWriter(s, app_id, dict(options), schema.json(), overwrite)


# ---------------------------------------------------------------------------------------------
# The source


class MergetxnStreamReader(DataSourceStreamReader):
    """Changes of one table, micro-batch by micro-batch, with CSNs as offsets."""

    def __init__(self, src: SourceSettings, schema: StructType) -> None:
        self.src = src
        self.schema_json = schema.json()
        self._last: int | None = None  # this process's last latestOffset
        self._pin: tuple[int, str | None] | None = None  # (CSN, read lease) where the next batch starts
        self._pin_lock = threading.Lock()
        self._stopped = threading.Event()
        self._renewer: threading.Thread | None = None
        self._lease_seconds = 30.0
        names = set(schema.fieldNames())
        if not {"_change", "_csn"} <= names:
            raise InvalidInput("mergetxn: a stream of changes needs option 'changes_from' (a CSN or 'latest')")
        with connect(src.s) as client:
            snap = client.snapshot()
            self._changes(client, snap, snap)  # fails now where changes cannot be read (an unknown table)

    def __getstate__(self) -> dict:
        """What the tasks' ``read`` needs; the pin stays with the reader's process."""
        return {"src": self.src, "schema_json": self.schema_json}

    # -- the pin: cleanup keeps what the next batch reads --------------------------------------
    def _pin_at(self, csn: int) -> None:
        """Hold a read lease at ``csn`` (the start of the next batch) in place of the last one, so
        that cleanup keeps every part that the changes after it need while the query runs, however
        far behind it falls (a compaction and cleanup between two batches included). Renewed by a
        thread of this process (the stream reader's, which lives as long as the query); it lapses
        if the process dies. SnapshotUnavailable if ``csn`` is already older than retained."""
        with self._pin_lock:
            if self._pin is not None and self._pin[0] == csn:
                return
            with connect(self.src.s) as client:
                r = client.call("visible", table=self.src.s.table, snapshot=csn, partitions=[], lease="read")
                old, self._pin = self._pin, (csn, r.get("lease"))
                self._lease_seconds = float(r.get("lease_seconds") or 30.0)
                if old is not None and old[1] is not None:
                    _release_quietly(client, old[1])
            if self._renewer is None:
                self._renewer = threading.Thread(target=self._renew, name="mergetxn-stream-pin", daemon=True)
                self._renewer.start()

    def _renew(self) -> None:
        while not self._stopped.wait(self._lease_seconds / 3):
            with self._pin_lock:
                lease = None if self._pin is None else self._pin[1]
                if lease is None:
                    continue
                try:
                    with connect(self.src.s) as client:
                        client.call("renew", lease=lease)
                except errors.MergetxnError:
                    pass  # tried again at the next tick; a lapsed lease shows as SnapshotUnavailable

    def stop(self) -> None:
        self._stopped.set()
        with self._pin_lock:
            pin, self._pin = self._pin, None
        if pin is not None and pin[1] is not None:
            try:
                with connect(self.src.s) as client:
                    _release_quietly(client, pin[1])
            except errors.MergetxnError:
                pass  # it lapses

    def _changes(self, client, start: int, end: int) -> pa.Table:
        s = self.src.s
        try:
            return client.changes(s.table, start, end, by="id", compactions=self.src.by == "id")
        except errors.TableNotFound as exc:
            raise errors.TableNotFound(
                f"mergetxn: unknown table {s.table!r} (replica {s.replica}): {exc.message}", table=s.table
            ) from None

    def initialOffset(self) -> dict:  # noqa: N802 - Spark's names
        if self.src.start is not None:
            start = self.src.start
        else:
            with connect(self.src.s) as client:
                start = client.snapshot()
        self._pin_at(start)
        return {"csn": start}

    def latestOffset(self) -> dict:  # noqa: N802
        """The replica's snapshot (every commit at or below it is applied there); once this
        process has answered before, the last commit since that answer and at or below the
        snapshot that changed the table (compactions left out by time), so that commits to other
        tables make no empty batches. A restarted query's checkpointed offset is not told to the
        source: its first answer is the snapshot, an upper bound like any other."""
        s = self.src.s
        with connect(s) as client:
            snap = client.snapshot()
            start = self._last
            if start is None or snap <= start:
                self._last = max(snap, start if start is not None else self.src.start or 0)
                return {"csn": self._last}
            r = client.call(
                "changes", table=s.table, start=start, end=snap, by="id", lease="none", compactions=self.src.by == "id"
            )
        csns = [c["csn"] for c in r["commits"] if c["csn"] <= snap]
        self._last = max(csns, default=start)
        return {"csn": self._last}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        lo, hi = _csn(start), _csn(end)
        if hi <= lo:
            return []
        self._pin_at(lo)
        with connect(self.src.s) as client:
            data = self._changes(client, lo, hi)
        return changes_partitions(data)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if partition is None:
            return
        target = arrow_schema(StructType.fromJson(json.loads(self.schema_json)))
        yield from read_changes(cast(ChangesPartition, partition), target)  # partitions() plans only these

    def commit(self, end: dict) -> None:
        """Spark will not ask for changes at or before ``end`` again: the pin moves there."""
        self._pin_at(_csn(end))


def _release_quietly(client, lease: str) -> None:
    try:
        client.call("release", lease=lease)
    except errors.MergetxnError:
        pass  # it lapses


def _csn(offset: Mapping[str, Any]) -> int:
    try:
        return int(offset["csn"])
    except (KeyError, TypeError, ValueError):
        raise InvalidInput(f"mergetxn: a stream offset must be {{'csn': n}}, not {offset!r}") from None


def stream_reader(options: Mapping[str, Any], schema: StructType) -> MergetxnStreamReader:
    """``DataSource.streamReader``."""
    return MergetxnStreamReader(_source_settings(options), schema)


def write_stream(
    df: Any,
    table: str,
    checkpoint_location: str,
    replica: str | None = None,
    app_id: str | None = None,
    trigger: Mapping[str, Any] | None = None,
    output_mode: str = "append",
) -> Any:
    """Start a streaming query writing ``df`` (a streaming DataFrame) into ``table`` with Spark's
    own Parquet writer under each micro-batch (``foreachBatch`` + :func:`spark.native.write_table`),
    each batch committed exactly once as the ``format("mergetxn")`` sink does: an idempotent
    commit by ``(app id, batch id)``, the app id from the query id Spark keeps in
    ``checkpoint_location`` (or ``app_id``); a batch Spark replays after its commit raises
    DuplicateCommit, which is its success. ``output_mode`` "append" inserts each batch,
    "complete" overwrites the table with it. ``trigger``: ``DataStreamWriter.trigger``'s keyword
    arguments. Returns the StreamingQuery. The road for speed: the rows never cross into Python
    (the ``format("mergetxn")`` sink rides Spark's Python streaming path, about 2x Spark's file sink
    here; benchmarks/spark_streaming.py)."""
    from coordinator.core.errors import DuplicateCommit
    from spark.native import write_table

    if output_mode not in ("append", "complete"):
        raise InvalidInput(f"mergetxn: write_stream output_mode must be 'append' or 'complete', not {output_mode!r}")
    if not isinstance(checkpoint_location, str) or not checkpoint_location:
        raise InvalidInput(f"mergetxn: write_stream needs a checkpoint_location, not {checkpoint_location!r}")
    found: dict[str, str] = {}

    def app() -> str:
        if app_id is not None:
            return app_id
        if "app" not in found:  # Spark wrote the query's id there before the first batch
            found["app"] = query_app_id(
                {"checkpointLocation": checkpoint_location}, Settings(table=table, replica=replica or "")
            )
        return found["app"]

    def batch(batch_df: Any, batch_id: int) -> None:
        mode = "overwrite" if output_mode == "complete" else "append"
        try:
            write_table(batch_df, table, mode=mode, replica=replica, app_version=(app(), int(batch_id)))
        except DuplicateCommit:
            pass  # a replay of a batch already committed: its rows are there, once

    w = df.writeStream.foreachBatch(batch).outputMode(output_mode).option("checkpointLocation", checkpoint_location)
    if trigger:
        w = w.trigger(**trigger)
    return w.start()
