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

What this module shares with spark/streaming.py, spark/native.py and spark/mutate.py lives in
modules that import none of them: spark/options.py (the options, :class:`~spark.options.Settings`,
the replica and storage they name), spark/schema.py (schemas between the table and Spark),
spark/writer.py (the write path: executors' parts, the job's commit) and spark/changes.py (read
tasks of changes). The data source, its readers and their partitions stay here: Spark loads them by
path (``pyspark_mergetxn`` names ``spark.datasource.MergetxnDataSource``).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import math
import os
import re
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
)
from pyspark.sql.types import StructType

from coordinator.core import deletions, errors, keyfold, keytables
from coordinator.core.conflicts import Policy
from coordinator.core.errors import InvalidInput
from coordinator.core.tabledata import may_match
from coordinator.model.catalog import TableDef
from parts.io.format import read_part
from parts.io.storage import Storage
from parts.model.meta import PartMeta
from spark.changes import ChangesPartition, changes_partitions, read_changes
from spark.options import (
    READ_ONLY_OPTIONS,
    Settings,
    connect,
    join,
    option,
    schema_options,
    settings,
    storage_for,
    table_def,
    visible_for_read,
)
from spark.schema import arrow_schema, check_write_schema, fit, spark_schema
from spark.writer import MergetxnWriter, rollback_quietly, trace_commit

NAME = "mergetxn"
SPLIT_ROWS = (
    1_000_000  # at most this many rows per read task (bytes: option split_bytes), so reads spread over the cores
)
BATCH_ROWS = 65_536


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
# A read or write with neither a table name nor a CREATE TABLE's options in its schema: Spark
# consults no data source for a CREATE TABLE with a column list (it keeps the columns, drops the
# options) and hands a CTAS's rows to writer() with no options either.
NOT_A_MERGETXN_TABLE = (
    "mergetxn: no table name. In SQL, a table USING mergetxn takes its columns from the mergetxn "
    "table: CREATE TABLE with a column list, and CREATE TABLE ... AS SELECT, are not supported. "
    "Create the table with the client (client.create_table) or `mergetxn table create`, then "
    "DROP TABLE this one and CREATE TABLE t USING mergetxn OPTIONS (path 'table', replica "
    "'host:port') without columns, and INSERT INTO t SELECT ...; with DataFrames give the name to "
    "load()/save()"
)


def catalog_options(options: Any) -> dict[str, str] | None:
    """A CREATE TABLE's options worth keeping for the table's later reads and writes (None: the
    options are not a CREATE TABLE's)."""
    keys = {str(k).lower() for k in options}
    if "provider" not in keys or not ({"path", "location"} & keys):
        return None
    out = {
        str(k).lower(): str(v)
        for k, v in options.items()
        if str(k).lower() not in _CATALOG_KEYS
        and not str(k).lower().startswith("option.")
        and not _SECRET_OPTION.search(str(k))
    }
    out.setdefault("path", str(options.get("location")))
    return out


def with_catalog_options(schema: StructType, options: Any) -> StructType:
    """``schema`` carrying a CREATE TABLE's options in its fields' metadata (unchanged otherwise)."""
    kept = catalog_options(options)
    if kept is None:
        return schema
    from pyspark.sql.types import StructField

    text = json.dumps(kept, sort_keys=True)
    return StructType(
        [
            StructField(f.name, f.dataType, f.nullable, {**(f.metadata or {}), CATALOG_METADATA: text})
            for f in schema.fields
        ]
    )


def table_options(options: Any, schema: StructType | None, write: bool = False) -> Any:
    """The options of one read or write: as given, or, for a table of the session catalog (no
    table name given), those its CREATE TABLE kept in the schema (reads at the table's
    ``snapshot``/``as_of``; writes without them)."""
    if option(options, "path") is not None or schema is None:
        return options
    texts = {(f.metadata or {}).get(CATALOG_METADATA) for f in schema.fields} - {None}
    if not texts:
        raise InvalidInput(NOT_A_MERGETXN_TABLE)
    if len(texts) != 1:
        raise InvalidInput("mergetxn: the table's columns name different mergetxn tables in their metadata")
    text = texts.pop()
    try:
        kept = json.loads(text) if isinstance(text, str) and len(text) <= _MAX_CATALOG_OPTIONS else None
    except ValueError:
        kept = None
    if not isinstance(kept, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in kept.items()):
        raise InvalidInput(
            f"mergetxn: the catalog's {CATALOG_METADATA} metadata does not parse; create the "
            "table again (CREATE TABLE ... USING mergetxn OPTIONS (path 'table', replica 'host:port'))"
        )
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
            url = client.storage.url
        cls = PruningReader if _pushdown_enabled() else MergetxnReader
        return cls(s, schema, tdef.to_dict(), url)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        s = settings(table_options(self.options, schema, write=True), write=True)
        with connect(s) as client:
            url = client.storage.url
            if s.txn is not None:
                tx = join(client, s)
            else:  # committed by another process (the commit runner): no client session holds it
                tx = client.begin(detached=True)
            try:  # the rows are written for the table as the transaction sees it
                tdef = tx.table(s.table)
                check_write_schema(tdef, schema)
            except errors.TableNotFound as exc:
                if s.txn is None:
                    rollback_quietly(tx)
                raise errors.TableNotFound(
                    f"mergetxn: unknown table {s.table!r} (replica {s.replica}): {exc.message}", table=s.table
                ) from None
            except BaseException:
                if s.txn is None:
                    rollback_quietly(tx)
                raise
            if s.trace_commits:
                event = {"event": "join"} if s.txn is not None else {"event": "begin", "snapshot": tx.snapshot}
                try:
                    trace_commit(s.trace_commits, {**event, "table": s.table, "txn": tx.id})
                except InvalidInput:
                    if s.txn is None:
                        rollback_quietly(tx)
                    raise
        return MergetxnWriter(
            s,
            tdef.to_dict(),
            url,
            tx.id,
            own=s.txn is None,
            overwrite=overwrite,
            partition_limit=client.max_partition_value_bytes,
        )

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

    # No public road: a planner process has no SparkSession/conf, and pyspark 4.1 passes the flag to no DataSource API.
    frame: FrameType | None = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            break
        if "enable_pushdown" in frame.f_locals:
            return bool(frame.f_locals["enable_pushdown"])
        frame = frame.f_back
    return True


# ---------------------------------------------------------------------------------------------
# Reads


class PartsPartition(InputPartition):
    """One read task: a few parts of one snapshot (descriptors only; no credentials)."""

    def __init__(
        self, index: int, parts: list[dict], csns: dict[str, int] | None = None, dead: dict[str, str] | None = None
    ) -> None:
        super().__init__(index)
        self.parts = parts
        self.csns = csns  # a keys table's partition: part -> creation CSN, the order its versions fold in
        self.dead = dead  # a keys table's parts read by deletion vectors: part -> its vector (base64)

    def __repr__(self) -> str:
        return f"PartsPartition({self.value}, {len(self.parts)} part(s))"


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
    def partitions(self) -> Sequence[InputPartition]:
        s = self.s
        with connect(s) as client:
            if s.changes is not None:
                return self._changes_partitions(client, s.changes)
            args: dict[str, Any] = {"table": s.table}
            if s.snapshot is not None:
                args["snapshot"] = s.snapshot
            if s.as_of is not None:
                args["as_of"] = s.as_of
            try:
                # The job's snapshot stays in use until the lease lapses (read_lease_seconds after
                # planning): Spark tells a reader nothing when the job ends, so there is no release.
                r = visible_for_read(client, args, s.lease)
            except errors.TableNotFound as exc:
                raise errors.TableNotFound(f"mergetxn: {exc.message}", table=s.table) from None
        metas = [PartMeta.from_dict(m) for m in r["parts"]]
        where = self.where()
        tdef = TableDef.from_dict(self.tdef)
        if tdef.conflict_policy is Policy.KEYS and r.get("vectors") is None:
            return _keys_partitions(tdef, metas, r.get("csns") or {}, where)
        dead = None if tdef.conflict_policy is not Policy.KEYS else checked_vectors(tdef, metas, r["vectors"])
        if where is not None:
            # A keys table's live rows (its parts minus their vectors) are rows of the table as
            # it is at the snapshot: a part whose statistics miss the filter holds none it keeps.
            metas = [
                m
                for m in metas
                if may_match(
                    tdef.stats_at(m.stats, m.schema_version), list(tdef.partition_by), m.partition, where, tdef.schema
                )
            ]
        return [
            PartsPartition(
                i, [m.to_dict() for m in group], dead={m.name: dead[m.name] for m in group} if dead else None
            )
            for i, group in enumerate(_group(metas, s.split_bytes))
        ]

    def _changes_partitions(self, client, changes: tuple[Any, Any, str]) -> Sequence[InputPartition]:
        start, end, by = changes
        return changes_partitions(client.changes(self.s.table, start, end, by=by))

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
        target = arrow_schema(StructType.fromJson(json.loads(self.schema_json)))
        if isinstance(partition, ChangesPartition):
            yield from read_changes(partition, target)
            return
        partition = cast(PartsPartition, partition)  # partitions() plans these and ChangesPartitions only
        storage = storage_for(self.storage_url, self.s.storage_options)
        metas = [PartMeta.from_dict(d) for d in partition.parts]
        tdef = TableDef.from_dict(self.tdef)
        if partition.csns is not None:  # a keys table's partition: its versions fold to one row per key
            csns = partition.csns
            folded = keyfold.merge(
                tdef.schema,
                tdef.primary_key,
                [
                    (csns.get(m.name, keytables.OWN), d)
                    for m, d in zip(metas, _prefetch(storage, metas, self.s.trace_reads))
                ],
            )
            yield from fit(folded, target).to_batches(max_chunksize=BATCH_ROWS)
            return
        for m, data in zip(metas, _prefetch(storage, metas, self.s.trace_reads, tdef)):
            if partition.dead is not None:  # a keys table's part minus its deletion vector
                data = minus_rows(data, deletions.decode_rows(partition.dead[m.name], m.rows))
            yield from fit(data, target).to_batches(max_chunksize=BATCH_ROWS)


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

        ops = {
            EqualTo: "==",
            EqualNullSafe: "==",
            GreaterThan: ">",
            GreaterThanOrEqual: ">=",
            LessThan: "<",
            LessThanOrEqual: "<=",
        }
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


def checked_vectors(tdef: TableDef, metas: Sequence[PartMeta], vectors: Any) -> dict[str, str]:
    """The replica's deletion vectors of ``metas`` as sent (part name -> base64), once checked
    (:func:`deletions.sent_vectors`: else CorruptMetadata); each task decodes its own."""
    deletions.sent_vectors(tdef.name, vectors, [(m.name, m.rows) for m in metas])
    return {m.name: vectors[m.name] for m in metas}


def minus_rows(data: pa.Table, rows: Any) -> pa.Table:
    """``data`` without the rows at the positions ``rows`` (a deletion vector)."""
    if not len(rows):
        return data
    keep = np.ones(data.num_rows, bool)
    keep[rows] = False
    return data.filter(pa.array(keep))


def _keys_partitions(
    tdef: TableDef, metas: list[PartMeta], csns: dict[str, int], where: pc.Expression | None
) -> list[InputPartition]:
    """Read tasks of a keys table: one per table partition (a key lives in one), all its parts
    folded together. Only partition values prune: a part whose statistics miss the filter may
    still hold the newest version of a row that another part's older version matches."""
    by_partition: dict[str, list[PartMeta]] = {}
    for m in metas:
        if where is None or may_match({}, list(tdef.partition_by), m.partition, where, tdef.schema):
            by_partition.setdefault(m.partition_key, []).append(m)
    return [
        PartsPartition(i, [m.to_dict() for m in group], {m.name: csns[m.name] for m in group if m.name in csns})
        for i, (_, group) in enumerate(sorted(by_partition.items()))
    ]


def _prunable(value: Any) -> bool:
    """Literals whose order against part statistics is exact (see coordinator.core.tabledata.may_match)."""
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, (bool, int, str)) or (isinstance(value, dt.date) and not isinstance(value, dt.datetime))


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


def _prefetch(
    storage: Storage, metas: list[PartMeta], trace: str | None, tdef: TableDef | None = None
) -> Iterator[pa.Table]:
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
