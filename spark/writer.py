"""Writes of the ``mergetxn`` data source: executors write Arrow batches as parts and send back
their descriptors (:class:`PartsMessage`); the job's commit stages them in one transaction
(:class:`MergetxnWriter`). The streaming sink (spark/streaming.py) writes its micro-batches with
the same writer; spark/mutate.py deletes its parts with :func:`parts.io.format.delete_part`.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from coordinator.core import errors, keytables
from coordinator.core.conflicts import Policy
from coordinator.core.errors import InvalidInput
from coordinator.model.catalog import TableDef
from parts.io.format import delete_part
from parts.io.storage import Storage
from parts.io.write import write_data
from parts.model.meta import PartMeta
from spark.options import Settings, connect, storage_for
from spark.schema import align_time_zones

PART_BYTES = 64 * 1024 * 1024  # Arrow bytes a write task buffers before it writes them as a part


@dataclass
class PartsMessage(WriterCommitMessage):
    """What one accepted task attempt wrote: part descriptors (JSON-safe dicts)."""

    parts: list[dict]
    rows: int
    task: int = -1
    attempt: int = -1


class MergetxnWriter(DataSourceArrowWriter):
    """Executors write Arrow batches as parts; the job's commit stages them in one transaction."""

    def __init__(
        self,
        s: Settings,
        tdef: dict,
        storage_url: str,
        txn_id: str,
        own: bool,
        overwrite: bool,
        partition_limit: int | None = None,
    ) -> None:
        """``partition_limit``: the replica's ``max_partition_value_bytes`` (``client.
        max_partition_value_bytes``), checked by each task before it writes a file."""
        self.s = s
        self.tdef = tdef
        self.storage_url = storage_url
        self.txn_id = txn_id
        self.own = own
        self.overwrite = overwrite
        self.partition_limit = partition_limit

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
                delete_part(storage, m.path)
            raise
        finally:
            pool.shutdown(wait=True)
        task, attempt = _task_ids()
        return PartsMessage([m.to_dict() for m in written], sum(m.rows for m in written), task, attempt)

    def _flush(self, storage: Storage, tdef: TableDef, batches: list[pa.RecordBatch]) -> list[PartMeta]:
        data = align_time_zones(pa.Table.from_batches(batches), tdef.schema)
        if tdef.conflict_policy is Policy.KEYS:  # rows by key in overwrite mode, as tx.insert writes them
            data = keytables.versions(
                tdef.schema, tdef.primary_key, tdef.name, data, keytables.PUT, self._next_seq(data.num_rows)
            )
        return write_data(storage, tdef, data, self.txn_id, what="mergetxn: write to", limit=self.partition_limit)

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
        metas = part_metas(messages)
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
                    rollback_quietly(tx)
                raise type(exc)(
                    f"mergetxn: staging the write to {s.table!r} in transaction {self.txn_id} failed: {exc.message}",
                    **exc.details,
                ) from None
            if not self.own:
                if s.trace_commits:
                    trace_commit(
                        s.trace_commits,
                        {"event": "staged", "table": s.table, "txn": self.txn_id, "parts": len(metas)},
                        quiet=True,
                    )
                return
            try:
                csn = tx.commit()
            except errors.ConflictError as exc:
                raise errors.ConflictError(
                    f"mergetxn: the write to {s.table!r} (transaction {self.txn_id}) conflicts with "
                    f"transaction {exc.winner}, which committed first; nothing of this write is "
                    f"visible. {exc.message}",
                    **exc.details,
                ) from None
            if s.trace_commits:
                trace_commit(
                    s.trace_commits,
                    {"event": "committed", "table": s.table, "txn": self.txn_id, "csn": csn, "parts": len(metas)},
                    quiet=True,
                )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Remove what the accepted tasks wrote, unless a commit may reference it."""
        metas = part_metas(messages)
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
                    if status.status in ("committed", "committing", "unknown"):  # unknown: keep the files
                        return
                    rollback_quietly(client.join(self.txn_id))
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
                    delete_part(storage, m.path)


def _task_ids() -> tuple[int, int]:
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None:
            return ctx.partitionId(), ctx.attemptNumber()
    except Exception:
        pass
    return -1, -1


def part_metas(messages: Sequence[WriterCommitMessage | None]) -> list[PartMeta]:
    """Descriptors of the accepted attempts, each part once."""
    out: dict[str, PartMeta] = {}
    for msg in messages:
        if isinstance(msg, PartsMessage):
            for d in msg.parts:
                m = PartMeta.from_dict(d)
                out.setdefault(m.name, m)
    return list(out.values())


def rollback_quietly(tx) -> None:
    try:
        tx.rollback()
    except errors.MergetxnError:
        pass


def trace_commit(path: str, event: dict, quiet: bool = False) -> None:
    """Option ``trace_commits``: append one JSON line (see spark/datasource.py's docstring). ``quiet``
    after the commit: a trace that cannot be written must not make a committed job fail (the
    caller still has the ``begin`` line to ask ``commit_status`` with)."""
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
