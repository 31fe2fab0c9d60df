"""Spark at native speed: ``read_table`` and ``write_table`` move rows with Spark's own Parquet
reader and writer, and the driver does the transaction around them.

Where the rows go and where the transaction happens (compare spark/datasource.py, where every row
crosses into Python workers as Arrow):

* ``write_table`` begins a transaction (or joins ``txn``) on the driver, writes the DataFrame with
  ``df.write.parquet`` into a staging directory unique to the transaction and the job
  (``<table>/_staging/<txn>_<16 hex>/``), under Spark's default commit protocol (the v1 file
  output committer): a task attempt writes under ``_temporary``, only the attempt that the
  driver's output commit coordinator authorises is moved into place, and ``_SUCCESS`` appears
  only once the job committed. Task retries and speculative duplicates therefore leave at most
  one copy of each task's output, and a failed job none. The driver then lists the committed
  files, reads each one's footer (rows, min/max per column, the partition values of its rows)
  and its CRC-32 in one read (page-cache hot), renames it to a part file of the transaction
  (``<table>/<partition>/<txn>_<16 hex>.parquet``, the layout of every part), fsyncs it, and
  stages all of them in the transaction as one INSERT or INSERT OVERWRITE. A job that fails
  leaves the transaction rolled back; whatever it left in storage carries the transaction's id in
  its path, so cleanup collects it once the transaction is known not to be running (the staging
  directory included: replicas/cleanup.py).
* ``read_table`` asks the replica for the parts visible at the snapshot under a read lease, keeps
  the lease (renewed) while the returned DataFrame is alive and, once it is gone, until no Spark
  job runs in the context and at least :data:`RELEASE_LINGER` seconds passed (a DataFrame derived
  from it and evaluated at once still finds its files; one evaluated much later may find a file
  collected and fails, never returns other rows). ``where`` prunes parts by partition values and
  min/max and filters the rows in Spark. Integrity without a second read of the data: the
  driver checks each file's size and footer row count against the part's metadata, and Spark
  verifies Parquet page checksums where the file has them (Spark's writer writes them).

Spark's filesystem (Hadoop's) reaches a local directory; it cannot reach storage that mergetxn
opens with fsspec/s3fs (``s3://``) unless Hadoop's S3 connector (``s3a://``) is on Spark's class
path with the same credentials, which this module does not configure. For any storage that is not
a local directory, and for tables Spark's Parquet reader cannot read as they are (nanosecond
timestamps, unsigned 64-bit integers, renamed columns), both functions say why (a warning) and
take the data source path, with the same guarantees. A keys table's parts hold versions:
``read_table`` reads them with Spark's Parquet reader too and folds them per key in Spark
(spark/keysfold.py); ``write_table`` of a keys table takes the data source path (its rows become
versions with hidden columns).
"""

from __future__ import annotations

import atexit
import datetime as dt
import json
import os
import shutil
import threading
import time
import warnings
import weakref
import zlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from coordinator.core import deletions, errors
from coordinator.core.errors import CorruptPart, InvalidInput
from coordinator.core.tabledata import json_scalar, may_match, validate_name
from coordinator.model.catalog import Policy, TableDef
from parts.io.format import STAGING_DIR, column_stats, new_part_name, part_path
from parts.io.rewrite import read_parts
from parts.model.meta import PartMeta
from spark import keysfold
from spark.options import join_transaction, visible_for_read
from spark.schema import arrow_schema, check_write_schema, fit, spark_schema

REPLICA_ENV = "MERGETXN_REPLICA"
REPLICA_CONF = "spark.mergetxn.replica"  # set by spark.register(session, replica=...)
RELEASE_LINGER = 10.0  # seconds a read's snapshot stays leased after its DataFrame is gone
VERIFY_PAGES = {"parquet.page.verify-checksum.enabled": "true"}
WRITE_OPTIONS = {
    "parquet.page.write-checksum.enabled": "true",
    "mapreduce.fileoutputcommitter.algorithm.version": "1",
}  # Spark's default committer
_OPS = {"==", "=", "!=", "<", "<=", ">", ">=", "in", "not in"}
_THREADS = 8


class NativeFallback(UserWarning):
    """read_table/write_table took the data source path; the message says why."""


# ---------------------------------------------------------------------------------------------
# Arguments


def _address(session: Any, replica: str | None) -> str:
    address = replica or _conf(session, REPLICA_CONF) or os.environ.get(REPLICA_ENV)
    if not address:
        raise InvalidInput(
            f"mergetxn: no replica: pass replica='host:port', or spark.register(session, "
            f"replica=...), or set {REPLICA_ENV}"
        )
    if not isinstance(address, str) or ":" not in address:
        raise InvalidInput(f"mergetxn: replica must be 'host:port', not {address!r}")
    return address


def _conf(session: Any, key: str) -> str | None:
    try:
        return session.conf.get(key, None)
    except Exception:
        return None


def _client(address: str):
    from mergetxn.client.client import Client

    try:
        return Client(address)
    except errors.ReplicaUnavailable as exc:
        raise errors.ReplicaUnavailable(f"mergetxn: cannot reach replica {address}: {exc.message}") from None


def _blocker(storage: Any, tdef: TableDef, metas: Sequence[PartMeta] = (), write: bool = False) -> str | None:
    """Why Spark's own Parquet reader (writer, with ``write``) cannot serve this table here (None:
    it can). A keys table is read so (its versions folded in Spark: spark/keysfold.py), not
    written: its rows become versions with hidden columns."""
    if write and tdef.conflict_policy is Policy.KEYS:
        return (
            "it is a keys table (conflict_policy='keys'): its rows are written as versions, with their hidden columns"
        )
    if not storage.is_local:
        return (
            f"storage {storage.url} is not a local directory; Spark's filesystem cannot reach "
            f"what mergetxn opens through fsspec (s3:// via s3fs) without Hadoop's S3 connector"
        )
    for f in tdef.schema:
        t = f.type
        if pa.types.is_timestamp(t) and t.unit == "ns":
            return f"column {f.name!r} is {t} (Spark's Parquet reader has no nanosecond timestamps)"
        if pa.types.is_uint64(t) or not _flat_type(t):
            return f"column {f.name!r} is {t}, which Spark's Parquet reader does not map as the table does"
    if any(m.inlined for m in metas) and tdef.conflict_policy is Policy.KEYS:
        return "the keys table holds inlined parts, which its fold in Spark does not read"
    renames = {v for v, kind, _, _ in tdef.changes if kind == "rename"}
    old = [m.name for m in metas if any(v > m.schema_version for v in renames)]
    if old:
        return f"part(s) {old[:3]} were written before a column was renamed"
    return None


def _flat_type(t: pa.DataType) -> bool:
    return (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        and not pa.types.is_float16(t)
        or pa.types.is_boolean(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_date32(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_decimal128(t)
    )


def _fallback(what: str, why: str) -> None:
    warnings.warn(f"mergetxn: spark.{what} takes the data source path: {why}", NativeFallback, stacklevel=3)


# ---------------------------------------------------------------------------------------------
# where: [(column, op, value), ...], all of which must hold


def parse_where(where: Any, tdef: TableDef) -> list[tuple[str, str, Any]]:
    """Validate ``where`` (a list of ``(column, op, value)``, op one of ``== != < <= > >= in
    "not in"``; the conjunction of all, pyarrow's ``filters`` form), naming what is wrong."""
    if where is None:
        return []
    if isinstance(where, tuple) and len(where) == 3 and isinstance(where[0], str):
        where = [where]
    if not isinstance(where, (list, tuple)):
        raise InvalidInput(f"mergetxn: where must be a list of (column, op, value), not {where!r}")
    out = []
    for term in where:
        if not (isinstance(term, (list, tuple)) and len(term) == 3):
            raise InvalidInput(f"mergetxn: where term {term!r} is not (column, op, value)")
        col, op, value = term
        if col not in tdef.schema.names:
            raise InvalidInput(
                f"mergetxn: where names column {col!r}, which {tdef.name!r} does not have "
                f"(columns: {tdef.schema.names})",
                missing=[col],
            )
        if op not in _OPS:
            raise InvalidInput(f"mergetxn: where op {op!r} is not one of {sorted(_OPS)}")
        if op in ("in", "not in") and not isinstance(value, (list, tuple, set, frozenset)):
            raise InvalidInput(f"mergetxn: where ({col!r}, {op!r}, ...) needs a list of values, not {value!r}")
        out.append((col, "==" if op == "=" else op, value))
    return out


def _arrow_where(terms: list[tuple[str, str, Any]]) -> pc.Expression | None:
    """The terms that can rule a part out (comparisons, ``in`` as an OR of equalities) as one
    expression for ``may_match``; ``!=`` and ``not in`` prune nothing and are left to Spark."""
    expr = None
    for col, op, value in terms:
        f = pc.field(col)
        if op == "in":
            term = None
            for v in value:
                term = (f == v) if term is None else (term | (f == v))
            if term is None:
                continue
        elif op in ("!=", "not in"):
            continue
        else:
            term = {"==": f == value, "<": f < value, "<=": f <= value, ">": f > value, ">=": f >= value}[op]
        expr = term if expr is None else expr & term
    return expr


def _spark_where(terms: list[tuple[str, str, Any]]):
    from pyspark.sql import functions as F

    cond = None
    for col, op, value in terms:
        c = F.col(col)
        if op in ("in", "not in"):
            term = c.isin(list(value))
            term = ~term if op == "not in" else term
        else:
            lit = F.lit(value)
            term = {"==": c == lit, "!=": c != lit, "<": c < lit, "<=": c <= lit, ">": c > lit, ">=": c >= lit}[op]
        cond = term if cond is None else cond & term
    return cond


# ---------------------------------------------------------------------------------------------
# Reads


def read_table(
    session: Any,
    table: str,
    snapshot: int | None = None,
    as_of: dt.datetime | None = None,
    replica: str | None = None,
    where: Any = None,
):
    """``table`` at the latest snapshot, at ``snapshot`` (a CSN) or ``as_of`` (an aware datetime),
    as a DataFrame that Spark's own Parquet reader reads from the parts visible there. ``where``
    (``[(column, op, value), ...]``) skips parts by partition values and min/max and filters
    the rows. The snapshot stays in use while the DataFrame lives (see the module docstring)."""
    validate_name("table", table)
    if snapshot is not None and as_of is not None:
        raise InvalidInput("mergetxn: give either snapshot or as_of, not both")
    address = _address(session, replica)
    client = _client(address)
    try:
        r = _visible(client, _visible_args(table, snapshot, as_of))
    except BaseException:
        client.close()
        raise
    hold = _Hold(client, r.get("lease"), float(r.get("lease_seconds") or 30.0), session)
    try:
        snap = r["snapshot"]
        tdef = client.table_at(table, snapshot=snap)  # the schema a read at this snapshot returns
        terms = parse_where(where, tdef)
        metas = [PartMeta.from_dict(m) for m in r["parts"]]
        why = _blocker(client.storage, tdef, metas)
        if why is not None:  # the data source reads the snapshot this hold keeps in use
            _fallback("read_table", why)
            df = _read_by_data_source(session, address, table, snap, terms)
            hold.attach(df, snap, [m.name for m in metas])
            return df
        keys = tdef.conflict_policy is Policy.KEYS
        metas = _parts_that_may_match(tdef, metas, terms, keys)
        stored = [m for m in metas if not m.inlined]
        root = os.path.abspath(client.storage.url)
        paths = [os.path.join(root, *m.path.split("/")) for m in stored]
        verify_footers(stored, paths)
        if keys and "vectors" in r and len(stored) == len(metas):  # the parts minus their deletion vectors
            df = _read_minus_vectors(session, tdef, metas, paths, r["vectors"])
        elif keys:  # versions folded per key by Spark (spark/keysfold.py)
            df = keysfold.read_folded(
                session, tdef, metas, ["file://" + p for p in paths], r.get("csns") or {}, VERIFY_PAGES
            )
        else:
            df = _read_plain(session, client.storage, tdef, metas, paths)
        if terms:
            df = df.where(_spark_where(terms))
    except BaseException:
        hold.release()
        raise
    hold.attach(df, snap, [m.name for m in metas])
    return df


def _visible(client: Any, args: dict[str, Any]) -> dict:
    """``visible`` for a read, with a keys table's deletion vectors when the replica has them."""
    return visible_for_read(client, args, "read")


_FILE, _ROW = "__mergetxn_file", "__mergetxn_row"


def row_key_shift(sizes: Sequence[int], rows: Sequence[int], dead: Sequence[np.ndarray]) -> int | None:
    """The shift ``b`` that names each row of files of these ``sizes``, ``rows`` and ``dead``
    rows (sorted positions) by one 64-bit integer, ``(file size << b) + row index``, so that
    the integers of the dead rows name exactly them: the bits of the largest row count, when
    files that share a size have the same dead rows (a position dead in one and not in another
    would be named by one integer) and the largest size, shifted, stays below 2**63; else None
    (the rows are then named by file name and row index)."""
    if not sizes:
        return None
    shift = max(max(rows), 1).bit_length()
    if max(sizes) >= 1 << (63 - shift):
        return None
    seen: dict[int, np.ndarray] = {}
    for size, d in zip(sizes, dead):
        if not np.array_equal(seen.setdefault(size, d), d):
            return None
    return shift


def _read_minus_vectors(
    session: Any, tdef: TableDef, metas: Sequence[PartMeta], paths: Sequence[str], vectors: Any
) -> Any:
    """A keys table's live rows (docs/architecture/keys-vectors.md): its part files (keys
    tables never inline) by Spark's own Parquet reader less the rows the vectors name, by a
    broadcast anti-join (the dead rows go to the executors once). A row is named by one integer
    built from its file's size (checked against the part's before Spark runs, verify_footers)
    and its row index, both from the reader's ``_metadata`` (:func:`row_key_shift`), or by file
    name and row index when sizes do not tell the files apart. The dead rows reach Spark as one
    row per part, its positions an array that Spark explodes (:func:`_dead_rows`). The vectors
    come from the replica, checked (one per part, rows the part has: else CorruptMetadata)."""
    from pyspark.sql import functions as F

    dead = deletions.sent_vectors(tdef.name, vectors, [(m.name, m.rows) for m in metas])
    schema = spark_schema(tdef.schema)
    if not paths:
        return session.createDataFrame([], schema)
    df = _parquet(session, schema, paths)
    hit = {m.name: p for m, p in zip(metas, paths) if len(dead[m.name])}
    if not hit:
        return df
    shift = row_key_shift([m.size for m in metas], [m.rows for m in metas], [dead[m.name] for m in metas])
    if shift is not None:  # one part of each size: the others of that size have its dead rows
        by_size = {m.size: dead[m.name] for m in metas if m.name in hit}
        gone = _dead_rows(session, pa.array([s << shift for s in by_size], pa.int64()), list(by_size.values()))
        gone = gone.select((F.col("part") + F.col("row")).alias(_ROW))
        key = F.shiftleft(F.col("_metadata.file_size"), shift) + F.col("_metadata.row_index")
        df, on = df.select("*", key.alias(_ROW)), [_ROW]
    else:
        files = pa.array([os.path.basename(p) for p in hit.values()], pa.string())
        gone = _dead_rows(session, files, [dead[n] for n in hit]).toDF(_FILE, _ROW)
        df = df.select("*", F.col("_metadata.file_name").alias(_FILE), F.col("_metadata.row_index").alias(_ROW))
        on = [_FILE, _ROW]
    return df.join(F.broadcast(gone), on, "left_anti").drop(*on)


_LIST_VALUES = 1 << 30  # positions per Arrow list chunk: its int32 offsets stay in range


def _dead_rows(session: Any, parts: pa.Array, rows: Sequence[np.ndarray]) -> Any:
    """A DataFrame of ``(part, row)``, a row for each position in ``rows[i]`` labelled
    ``parts[i]``. Spark is given one row per part, its positions as an array, and explodes them
    itself: Arrow rows become Spark rows one by one, and a row per position cost read_table of
    a 1M-key table with 100,000 dead rows about 0.2 s more CPU (benchmarks/spark_io.py --only-keys)."""
    from pyspark.sql import functions as F

    bounds, start, held = [], 0, 0
    for i, r in enumerate(rows):
        if held and held + len(r) > _LIST_VALUES:
            bounds.append((start, i))
            start, held = i, 0
        held += len(r)
    bounds.append((start, len(rows)))
    chunks = [
        pa.ListArray.from_arrays(
            pa.array(np.cumsum([0, *(len(x) for x in rows[a:b])]), pa.int32()),  # refuses past 2**31
            pa.array(np.concatenate(rows[a:b]), pa.int64()),
        )
        for a, b in bounds
    ]
    table = pa.table({"part": parts, "rows": pa.chunked_array(chunks, pa.list_(pa.int64()))})
    return session.createDataFrame(table).select("part", F.explode("rows").alias("row"))


def _parquet(session: Any, schema: Any, paths: Sequence[str]) -> Any:
    """The part files at ``paths`` by Spark's own Parquet reader, their pages checked."""
    reader = session.read.schema(schema)
    for k, v in VERIFY_PAGES.items():
        reader = reader.option(k, v)
    return reader.parquet(*("file://" + p for p in paths))


def _read_plain(session: Any, storage: Any, tdef: TableDef, metas: Sequence[PartMeta], paths: Sequence[str]) -> Any:
    """A plain table's parts ``metas``: the files at ``paths`` (those not inlined) by Spark's own
    Parquet reader, with the inlined parts' rows beside them."""
    schema = spark_schema(tdef.schema)
    df = _parquet(session, schema, paths) if paths else session.createDataFrame([], schema)
    if len(paths) < len(metas):
        df = df.unionByName(_inlined_frame(session, storage, tdef, metas))
    return df


def _inlined_frame(session: Any, storage: Any, tdef: TableDef, metas: Sequence[PartMeta]) -> Any:
    """The rows of the inlined parts among ``metas`` (small writes carried in their metadata,
    docs/architecture/small-writes.md) as a DataFrame of the table's schema: decoded and checked
    here (read_part: size, checksum, rows), a few thousand rows at most between flushes."""
    schema = spark_schema(tdef.schema)
    data = pa.concat_tables(read_parts(storage, [m for m in metas if m.inlined], table=tdef))
    return session.createDataFrame(fit(data, arrow_schema(schema)), schema=schema)


def _visible_args(table: str, snapshot: int | None, as_of: dt.datetime | None) -> dict[str, Any]:
    """:func:`mergetxn.client.reads.visible_args`, its InvalidInput said as mergetxn's."""
    from mergetxn.client.reads import visible_args

    try:
        return visible_args(table, snapshot, as_of)
    except InvalidInput as e:
        raise InvalidInput(f"mergetxn: {e}") from None


def _read_by_data_source(session: Any, address: str, table: str, snap: int, terms: list[tuple[str, str, Any]]) -> Any:
    """``table`` at ``snap`` read through the mergetxn data source (without a lease of its own),
    filtered by ``terms``."""
    df = (
        session.read.format("mergetxn")
        .option("replica", address)
        .option("snapshot", str(snap))
        .option("lease", "none")
        .load(table)
    )
    return df if not terms else df.where(_spark_where(terms))


def _parts_that_may_match(
    tdef: TableDef, metas: list[PartMeta], terms: list[tuple[str, str, Any]], keys: bool
) -> list[PartMeta]:
    """The parts whose partition values and min/max may match ``terms``. A keys table's parts
    hold versions: only its partition values rule a part out (a newer version in another part
    may move a row out of a filter on any other column)."""
    expr = _arrow_where([t for t in terms if not keys or t[0] in tdef.partition_by])
    if expr is None:
        return metas
    return [
        m
        for m in metas
        if may_match(tdef.stats_at(m.stats, m.schema_version), list(tdef.partition_by), m.partition, expr, tdef.schema)
    ]


def verify_footers(metas: Sequence[PartMeta], paths: Sequence[str]) -> None:
    """Each file has the size recorded at commit and a footer with the recorded row count
    (CorruptPart otherwise): a truncated, replaced or missing file is found before Spark runs,
    reading only the footers."""

    def check(item: tuple[PartMeta, str]) -> None:
        m, path = item
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            raise CorruptPart(f"part {m.path!r} of {m.table!r} is missing", path=m.path) from None
        if size != m.size:
            raise CorruptPart(
                f"part {m.path!r} has {size} bytes, {m.size} were written (truncated or replaced)", path=m.path
            )
        try:
            rows = pq.read_metadata(path).num_rows
        except (pa.ArrowException, OSError) as exc:
            raise CorruptPart(f"part {m.path!r} has no readable Parquet footer: {exc}", path=m.path) from None
        if rows != m.rows:
            raise CorruptPart(f"part {m.path!r} has {rows} rows in its footer, {m.rows} were written", path=m.path)

    items = list(zip(metas, paths))
    if len(items) <= 4:
        for item in items:
            check(item)
        return
    with ThreadPoolExecutor(max_workers=_THREADS) as pool:
        list(pool.map(check, items))


class _Hold:
    """A read's lease on its snapshot, renewed in a thread, released once the DataFrame is gone,
    no Spark job runs in its context and :data:`RELEASE_LINGER` seconds passed."""

    _live: set[_Hold] = set()
    _lock = threading.Lock()

    def __init__(self, client: Any, lease: str | None, lease_seconds: float, session: Any) -> None:
        self.client = client
        self.lease = lease
        self.lease_seconds = lease_seconds
        self.session = session
        self.snapshot: int | None = None
        self.parts: list[str] = []
        self.gone_at: float | None = None
        self.done = threading.Event()
        self.released = False

    def attach(self, df: Any, snapshot: int, parts: list[str]) -> None:
        self.snapshot, self.parts = snapshot, parts
        weakref.finalize(df, self.dataframe_gone)
        with self._lock:
            self._live.add(self)
        threading.Thread(target=self._run, name=f"mergetxn-hold-{snapshot}", daemon=True).start()

    def dataframe_gone(self) -> None:
        self.gone_at = time.monotonic()

    def _jobs_running(self) -> bool:
        try:
            return bool(self.session.sparkContext.statusTracker().getActiveJobsIds())
        except Exception:
            return False  # the session stopped: nothing reads the files any more

    def _run(self) -> None:
        last_renew = time.monotonic()
        while not self.done.wait(0.5):
            now = time.monotonic()
            if self.gone_at is not None and now - self.gone_at >= RELEASE_LINGER and not self._jobs_running():
                break
            if now - last_renew >= self.lease_seconds / 3:
                try:
                    if not self.client.call("renew", lease=self.lease)["renewed"]:
                        break  # lapsed: a file cleanup takes meanwhile fails the read, never changes it
                except Exception:
                    break
                last_renew = now
        self.release()

    def release(self) -> None:
        with self._lock:
            if self.released:
                return
            self.released = True
            self._live.discard(self)
        self.done.set()
        try:
            if self.lease is not None:
                self.client.call("release", lease=self.lease)
        except Exception:
            pass  # it lapses on its own (also when the replica is gone at exit)
        finally:
            try:
                self.client.close()
            except Exception:
                pass

    @classmethod
    def described(cls) -> list[dict]:
        """Each live hold: its snapshot, lease, parts and whether its DataFrame is alive."""
        with cls._lock:
            return [
                {"snapshot": h.snapshot, "lease": h.lease, "parts": len(h.parts), "dataframe_alive": h.gone_at is None}
                for h in cls._live
            ]

    @classmethod
    def release_all(cls) -> None:
        with cls._lock:
            live = list(cls._live)
        for h in live:
            h.release()


def holds() -> list[dict]:
    """The snapshots that read_table DataFrames of this process keep in use (introspection)."""
    return _Hold.described()


atexit.register(_Hold.release_all)


# ---------------------------------------------------------------------------------------------
# Writes


def write_table(
    df: Any,
    table: str,
    mode: str = "append",
    txn: Any = None,
    replica: str | None = None,
    app_version: tuple[str, int] | None = None,
) -> int | None:
    """Write ``df`` to ``table`` with Spark's own Parquet writer and commit the files as parts:
    ``mode`` "append" (INSERT) or "overwrite" (INSERT OVERWRITE of the partitions written, the
    whole table when it is not partitioned, as the data source does). Returns the CSN, or None
    when it joined ``txn`` (a transaction or its id, open on that replica): the parts then become
    visible when the transaction commits, or never. ``app_version`` (``(app_id, version)``) makes
    the commit idempotent (``tx.set_app_version``: DuplicateCommit if that version or a later one
    was committed), as an exactly-once streaming sink needs (:func:`spark.streaming.write_stream`)."""
    validate_name("table", table)
    if mode not in ("append", "overwrite"):
        raise InvalidInput(f"mergetxn: write_table mode must be 'append' or 'overwrite', not {mode!r}")
    session = df.sparkSession
    address = _address(session, replica)
    txn_id = getattr(txn, "id", txn)
    if txn_id is not None and not isinstance(txn_id, str):
        raise InvalidInput(f"mergetxn: txn must be a transaction or its id (tx.id), not {txn!r}")
    with _client(address) as client:
        said = f"replica {address} is {client.host_id}"
        tx = join_transaction(client, txn_id, table, "txn", said) if txn_id is not None else client.begin()
        own = txn_id is None
        try:
            try:
                tdef = tx.table(table)
            except errors.TableNotFound as exc:
                raise errors.TableNotFound(
                    f"mergetxn: unknown table {table!r} (replica {address}): {exc.message}", table=table
                ) from None
            check_write_schema(tdef, df.schema)
            why = _blocker(client.storage, tdef, write=True)
            if why is not None:
                _fallback("write_table", why)
                (df.write.format("mergetxn").option("replica", address).option("txn", tx.id).mode(mode).save(table))
            else:
                metas = _write_parts(df, tdef, client.storage, tx.id)
                try:
                    tx.add_parts(table, metas, op="overwrite" if mode == "overwrite" else "insert")
                except BaseException:
                    for m in metas:  # add_parts deletes them when it refuses; a lost answer leaves them to gc
                        _unlink_quietly(os.path.join(os.path.abspath(client.storage.url), *m.path.split("/")))
                    raise
            if app_version is not None:
                tx.set_app_version(*app_version)
            if not own:
                return None
            return tx.commit()
        except BaseException:
            if own and tx.csn is None:
                try:
                    tx.rollback()
                except errors.MergetxnError:
                    pass
            raise


def _prepare(df: Any, tdef: TableDef, hidden: list[str]):
    """The DataFrame as the table stores it: its columns in order and types (a nullable column
    it lacks as nulls), a NOT NULL column failing the task on a null, and a copy of each partition column to partition the files by
    (so every file keeps the partition columns themselves, as every part does)."""
    from pyspark.sql import functions as F

    target = spark_schema(tdef.schema)
    have = {f.name: f for f in df.schema}
    cols = []
    for f in target.fields:
        if f.name not in have:  # a nullable column the DataFrame lacks (check_write_schema let it by)
            cols.append(F.lit(None).cast(f.dataType).alias(f.name))
            continue
        c = F.col(f"`{f.name}`")
        if have[f.name].dataType != f.dataType:
            c = c.cast(f.dataType)
        if not f.nullable and have[f.name].nullable:
            c = F.when(
                c.isNull(),
                F.raise_error(
                    F.lit(f"mergetxn: write to {tdef.name!r}: column {f.name!r} is NOT NULL and a row has null")
                ),
            ).otherwise(c)
        cols.append(c.alias(f.name))
    cols += [F.col(f"`{p}`").alias(h) for p, h in zip(tdef.partition_by, hidden)]
    return df.select(*cols)


def _write_parts(df: Any, tdef: TableDef, storage: Any, txn_id: str) -> list[PartMeta]:
    """Spark writes the files into this job's staging directory; the driver turns the committed
    ones into parts of the transaction (see the module docstring). Nothing is left in staging."""
    root = os.path.abspath(storage.url)
    stem = new_part_name(txn_id)
    staging = os.path.join(root, tdef.name, STAGING_DIR, stem)
    hidden = [f"__mergetxn_p{i}" for i in range(len(tdef.partition_by))]
    data = _prepare(df, tdef, hidden)
    w = data.write.mode("errorifexists")
    for k, v in WRITE_OPTIONS.items():
        w = w.option(k, v)
    if hidden:
        w = w.partitionBy(*hidden)
    try:
        with _micros_timestamps(df.sparkSession):
            w.parquet("file://" + staging)
        if not os.path.exists(os.path.join(staging, "_SUCCESS")):
            raise errors.TransactionAborted(
                f"mergetxn: the Spark job writing {tdef.name!r} did not commit its output (no _SUCCESS in {staging})"
            )
        files = _committed_files(staging)
        with ThreadPoolExecutor(max_workers=_THREADS) as pool:
            adopted = list(pool.map(lambda f: _adopt(f, tdef, root, txn_id), files))
        metas = [m for m in adopted if m is not None]
        for d in sorted({os.path.dirname(os.path.join(root, *m.path.split("/"))) for m in metas}):
            _fsync_dir(d)
        return metas
    finally:
        shutil.rmtree(staging, ignore_errors=True)


_ts_lock = threading.Lock()
_ts_users: dict[int, list] = {}  # id(session) -> [writes running, the setting before the first]
_TS_KEY = "spark.sql.parquet.outputTimestampType"


@contextmanager
def _micros_timestamps(session: Any) -> Iterator[None]:
    """Timestamps written as TIMESTAMP_MICROS (what pyarrow reads back as the table's type), not
    Spark's default INT96. A session setting (no per-write option exists): set by the first of
    this process's concurrent writes on the session, restored by the last."""
    key = id(session)
    with _ts_lock:
        entry = _ts_users.setdefault(key, [0, _conf(session, _TS_KEY)])
        entry[0] += 1
        session.conf.set(_TS_KEY, "TIMESTAMP_MICROS")
    try:
        yield
    finally:
        with _ts_lock:
            entry[0] -= 1
            if entry[0] == 0:
                del _ts_users[key]
                if entry[1] is not None:
                    session.conf.set(_TS_KEY, entry[1])


def _committed_files(staging: str) -> list[str]:
    """The data files of the committed task attempts (never ``_temporary``, ``.crc`` or markers)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(staging):
        dirnames[:] = [d for d in dirnames if d != "_temporary" and not d.startswith(".")]
        out += [os.path.join(dirpath, f) for f in filenames if f.endswith(".parquet") and not f.startswith(("_", "."))]
    return sorted(out)


def _adopt(path: str, tdef: TableDef, root: str, txn_id: str) -> PartMeta | None:
    """One committed file as a part of the transaction: its metadata from one read of the file
    (CRC-32, footer), then renamed into the table's layout and fsynced. None for an empty file."""
    with open(path, "rb") as f:
        raw = f.read()
    pf = pq.ParquetFile(pa.BufferReader(raw))
    md = pf.metadata
    if md.num_rows == 0:
        os.unlink(path)
        return None
    partition: tuple = ()
    if tdef.partition_by:
        first = pf.read_row_group(0, columns=list(tdef.partition_by)).slice(0, 1)
        partition = tuple(
            json_scalar(first.column(c).cast(tdef.schema.field(c).type)[0].as_py()) for c in tdef.partition_by
        )
    name = new_part_name(txn_id)
    rel = part_path(tdef.name, list(tdef.partition_by), partition, name)
    meta = PartMeta(
        name=name,
        table=tdef.name,
        partition=partition,
        path=rel,
        rows=md.num_rows,
        size=len(raw),
        checksum="crc32:%08x" % (zlib.crc32(raw) & 0xFFFFFFFF),
        stats=footer_stats(md, tdef.schema),
        creation_tid=txn_id,
        created_at=time.time(),
        schema_version=tdef.ddl_version,
    )
    target = os.path.join(root, *rel.split("/"))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.rename(path, target)
    fd = os.open(target, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    sidecar = target[: -len(".parquet")] + ".json"  # advisory, as write_part's
    with open(sidecar, "w") as f:
        json.dump(meta.to_dict(), f, separators=(",", ":"), allow_nan=False)
    return meta


def footer_stats(md: pq.FileMetaData, schema: pa.Schema) -> dict[str, tuple[Any, Any]]:
    """Min/max per column from the footer, in the form ``column_stats`` gives for the rows
    (the same pruning either way). A column is left out where the footer cannot vouch for it:
    no statistics in some row group, floats (NaN is not ordered), nested types."""
    index = {md.schema.column(j).path: j for j in range(md.num_columns)}
    lows: dict[str, list] = {}
    for f in schema:
        t = f.type
        j = index.get(f.name)
        if j is None or pa.types.is_floating(t) or not _flat_type(t):
            continue
        lo = hi = None
        ok = True
        for g in range(md.num_row_groups):
            st = md.row_group(g).column(j).statistics
            if st is None:
                ok = False
                break
            if st.has_min_max:
                lo = st.min if lo is None else min(lo, st.min)
                hi = st.max if hi is None else max(hi, st.max)
            elif st.null_count != md.row_group(g).num_rows:
                ok = False
                break
        if ok:
            lows[f.name] = [lo, hi]
    if not lows:
        return {}
    cols = {}
    for name, (lo, hi) in lows.items():
        t = schema.field(name).type
        try:
            cols[name] = pa.nulls(2, t) if lo is None else pa.array([lo, hi]).cast(t)
        except (pa.ArrowException, TypeError, ValueError):
            continue
    return column_stats(pa.table(cols)) if cols else {}


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: str) -> None:
    for p in (path, path[: -len(".parquet")] + ".json"):
        try:
            os.unlink(p)
        except OSError:
            pass
