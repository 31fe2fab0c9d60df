"""The part format: one Parquet file per part plus a JSON sidecar holding its :class:`PartMeta`.

Layout under the storage root: ``<table>/<partition_dir>/<name>.parquet`` and ``<same>.json``.
The Parquet file is written first and durably, then the sidecar, so a sidecar always describes
a complete file (both are created at their fresh names: a writer that dies mid-way leaves a
partial file that no commit names, an orphan for cleanup). The checksum and size recorded at write time are checked on every read: a part
that changed, shrank or vanished raises CorruptPart instead of returning wrong rows.
Version metadata (creation/removal CSN, removal tid) is not stored here: parts are immutable and
those facts belong to the commit log.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import mmap
import re
import threading
import time
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from coordinator.core import keytables
from coordinator.core import tabledata as ops
from coordinator.core.errors import CorruptMetadata, CorruptPart, InvalidInput, clip, quote
from parts.io.storage import Storage
from parts.model.meta import INLINE_MAX_BYTES, PartMeta, bundle_path, sidecar_path

log = logging.getLogger(__name__)

COMPRESSION = "zstd"
# A part whose rows take fewer bytes than this in memory (a 10-row insert's: about 300) is
# written without compression or dictionaries: at that size they shrink nothing (the file of
# 10 rows of three columns is 1,155 bytes plain against 1,175 with zstd) and cost the writer
# about 0.1 ms of CPU per part. A merge's larger output is written compressed.
SMALL_PART_BYTES = 64 * 1024
# A keys table's part is written sorted by key (then version, _seq) in row groups of this many
# rows, each with min/max statistics: a point lookup reads only the row groups whose key range
# may hold the key (:func:`key_row_groups`), so its cost does not grow with the part's size.
KEYS_ROW_GROUP_ROWS = 8192
# Columns of at most this many rows get their min/max in Python (:func:`_small_min_max`), larger
# ones through pyarrow.compute, whose fixed cost per call exceeds the work on a few values.
SMALL_STATS_ROWS = 64
# The column types whose min and max a part records besides timestamps (column_stats).
_STATS_KINDS = (
    pa.types.is_integer,
    pa.types.is_floating,
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_date,
    pa.types.is_boolean,
)
# <table>/_staging/<txn>_<16 hex>/...: files a writer outside mergetxn (Spark's own Parquet writer,
# spark/native.py) puts there before they become parts; cleanup treats the whole directory as one
# unreferenced part of that transaction (replicas/cleanup.py).
STAGING_DIR = "_staging"
# Columns decoded to verify statistics that take more than this are handed back to the OS at once
# (a part with a 64 MiB value does not leave the replica 64 MiB larger).
RELEASE_AFTER_BYTES = 16 << 20


def checksum_of(data: bytes) -> str:
    """Whole-file checksum kept in :class:`PartMeta` (crc32: cheap, catches bit rot)."""
    return "crc32:%08x" % (zlib.crc32(data) & 0xFFFFFFFF)


def new_part_name(creation_tid: str) -> str:
    """A unique, file-name-safe part name: the creating tid plus 64 random bits, so Spark task
    retries and speculative attempts of one transaction never collide."""
    tid = re.sub(r"[^A-Za-z0-9_.-]", "_", str(creation_tid))[:120] or "tx"
    if not tid[0].isalnum():
        tid = "p" + tid
    return f"{tid}_{uuid.uuid4().hex[:16]}"


def _iso(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value


def column_stats(data: pa.Table) -> dict[str, tuple[Any, Any]]:
    """Min/max per column where ordering is meaningful and exact in JSON; (None, None) when all
    values are null. Floats with NaN or infinities are left out rather than misreport. Long
    strings are bounded (:func:`coordinator.core.tabledata.bound_stats`): a prefix for the min, an incremented
    prefix (or None: no upper bound) for the max, so one long value never makes metadata long."""
    stats: dict[str, tuple[Any, Any]] = {}
    for name, col in zip(data.column_names, data.columns):
        t = col.type
        if pa.types.is_timestamp(t):
            naive = col.cast(pa.timestamp(t.unit)) if t.tz is not None else col
            mm = pc.min_max(naive)
            lo, hi = mm["min"], mm["max"]
            if not lo.is_valid:
                stats[name] = (None, None)
                continue
            bounds = pa.array([lo.value, hi.value], pa.int64()).cast(naive.type)
            text = pc.strftime(bounds, format="%Y-%m-%dT%H:%M:%S")
            suffix = "+00:00" if t.tz is not None else ""
            stats[name] = (text[0].as_py() + suffix, text[1].as_py() + suffix)
            continue
        if not any(is_kind(t) for is_kind in _STATS_KINDS):
            continue
        if len(col) <= SMALL_STATS_ROWS:
            found = _small_min_max(col.to_pylist())
            if found is None:  # a NaN
                continue
            lo, hi = _iso(found[0]), _iso(found[1])
        else:
            if pa.types.is_floating(t) and col.null_count < len(col) and pc.any(pc.is_nan(col)).as_py():
                continue
            mm = pc.min_max(col)
            lo, hi = _iso(mm["min"].as_py()), _iso(mm["max"].as_py())
        if isinstance(lo, float) and not (math.isfinite(lo) and math.isfinite(hi)):
            continue
        stats[name] = (lo, hi)
    return ops.bound_stats(stats)


def _small_min_max(values: list[Any]) -> tuple[Any, Any] | None:
    """(min, max) of a few values as Python objects, nulls left out ((None, None) when all are
    null); None when one is a NaN. The same answer as ``pyarrow.compute.min_max`` for the types
    :func:`column_stats` takes (Python orders str by code point, as Arrow's UTF-8 bytes order),
    without a compute call per column (about 20 us each: most of a 10-row part's stats)."""
    present = [v for v in values if v is not None]
    if not present:
        return None, None
    if isinstance(present[0], float) and any(v != v for v in present):
        return None
    return min(present), max(present)


def part_path(table: str, partition_by: list[str], partition: tuple, name: str) -> str:
    """Where a part's Parquet file goes, relative to the storage root."""
    directory = ops.partition_dir(partition_by, partition)
    return f"{ops.validate_name('table', table)}/{directory}/{name}.parquet"


def write_part(
    storage: Storage,
    table: str,
    partition_by: list[str],
    partition: tuple,
    data: pa.Table,
    creation_tid: str,
    schema_version: int = 0,
    primary_key: Sequence[str] = (),
    sidecar: bool = True,
    inline: tuple[int, int] | None = None,
) -> PartMeta:
    """Serialise ``data`` to Parquet, store it durably, then its sidecar; return its metadata.
    Once this returns, the part can be referenced by a commit. ``primary_key`` (a keys table's)
    adds the key summary (coordinator/core/keytables.py) to the metadata. ``sidecar=False``: no
    sidecar (advisory, nothing reads it back; a writer that commits the part at once in the
    same call, ``client.insert``, saves a file creation per part). ``inline``: ``(rows, bytes)``:
    a part of at most that many rows whose Parquet is at most that many bytes is not stored at
    all: its metadata carries the bytes (``PartMeta.inline``, docs/architecture/small-writes.md)."""
    meta, raw = encode_part(table, partition_by, partition, data, creation_tid, schema_version, primary_key)
    if inline is not None and meta.rows <= inline[0] and len(raw) <= min(inline[1], INLINE_MAX_BYTES):
        return dataclasses.replace(meta, inline=raw)
    return store_part(storage, meta, raw, sidecar)


def encode_part(
    table: str,
    partition_by: list[str],
    partition: tuple,
    data: pa.Table,
    creation_tid: str,
    schema_version: int = 0,
    primary_key: Sequence[str] = (),
) -> tuple[PartMeta, bytes]:
    """``data`` as a new part's Parquet bytes and the metadata recording them (nothing stored)."""
    if not isinstance(data, pa.Table):
        raise InvalidInput(f"part data must be a pyarrow.Table, got {type(data).__name__}")
    partition = tuple(ops.json_scalar(v) for v in partition)
    name = new_part_name(creation_tid)
    path = part_path(table, list(partition_by), partition, name)
    if primary_key:
        data = _sorted_by_key(data, primary_key)
    raw = _parquet_bytes(
        data, row_group_size=KEYS_ROW_GROUP_ROWS if primary_key else None, delta=_delta_columns(data, primary_key)
    )
    meta = PartMeta(
        name=name,
        table=table,
        partition=partition,
        path=path,
        rows=data.num_rows,
        size=len(raw),
        checksum=checksum_of(raw),
        stats=column_stats(data),
        creation_tid=str(creation_tid),
        created_at=time.time(),
        schema_version=schema_version,
        key_summary={**keytables.summarize(data, primary_key), "ranges": file_ranges(raw)} if primary_key else None,
    )
    return meta, raw


def store_part(storage: Storage, meta: PartMeta, raw: bytes, sidecar: bool = True) -> PartMeta:
    """Store a part's bytes ``raw`` durably at ``meta.path``, then (``sidecar``) its sidecar."""
    path = meta.path
    storage.put(path, raw, fresh=True)  # a new random name that no commit names before this returns
    if not sidecar:
        return meta
    try:
        storage.put(
            meta.meta_path,
            json.dumps(meta.to_dict(), separators=(",", ":"), allow_nan=False).encode("utf-8"),
            durable=False,  # advisory: the commit entry carries the same metadata
            fresh=True,  # named after the new part; read by no one while it is written
        )
    except OSError:
        try:  # nothing will reference the part: do not leave it for cleanup
            storage.delete(path)
        except OSError:
            pass
        raise
    return meta


def _parquet_bytes(data: pa.Table, row_group_size: int | None, delta: Sequence[str] = ()) -> bytes:
    """``data`` as a Parquet file, with statistics; compressed (and dictionary encoded) unless
    it is small (:data:`SMALL_PART_BYTES`). ``delta``: integer columns written in
    DELTA_BINARY_PACKED encoding instead (:func:`_delta_columns`)."""
    small = data.nbytes < SMALL_PART_BYTES
    sink = pa.BufferOutputStream()
    dictionary: bool | list[str] = not small
    if delta and not small:
        dictionary = [c for c in data.column_names if c not in delta]
    pq.write_table(
        data,
        sink,
        compression="none" if small else COMPRESSION,
        use_dictionary=dictionary,
        column_encoding={c: "DELTA_BINARY_PACKED" for c in delta} or None,
        write_statistics=True,
        row_group_size=row_group_size,
    )
    return sink.getvalue().to_pybytes()


def _delta_columns(data: pa.Table, primary_key: Sequence[str]) -> list[str]:
    """A keys-table part's first key column when it holds integers: the part is sorted by it,
    so DELTA_BINARY_PACKED stores small steps, where a dictionary of as many distinct keys as
    rows costs more to decode than the keys themselves (a whole read of benchmarks/keys_bench.py's
    120 parts: the key column 11 ms of CPU against 27-31 ms, the files 45% smaller). Every Parquet reader in use reads it (Arrow, Spark 3.3+, DuckDB)."""
    if not primary_key:
        return []
    field = data.schema.field(primary_key[0])
    return [field.name] if pa.types.is_integer(field.type) else []


def _sorted_by_key(data: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """A keys-table part's versions sorted by key, then version (``_ver``, a compaction's) and
    ``_seq``: the order a read folds them in, so each key's versions stay in order."""
    if data.num_rows < 2:
        return data
    by = [*primary_key, *(c for c in (keytables.VER, keytables.SEQ) if c in data.column_names)]
    return data.take(pc.sort_indices(data, sort_keys=[(c, "ascending") for c in by]))


def key_row_groups(metadata: Any, primary_key: Sequence[str], keys: Sequence[tuple]) -> list[int]:
    """The row groups of a Parquet file (its ``metadata``) whose min/max statistics of the key
    columns may hold one of ``keys``: a group with no statistics for a key column, or values
    that do not compare with them, is kept. An old part (unsorted, one row group) keeps its
    one group when a key lies in its range."""
    return groups_holding(group_bounds(metadata, primary_key), keys)


def _chunk_span(c: Any) -> tuple[int, int]:
    """Where a column chunk's pages lie in its file: from its dictionary page (if any) on."""
    start = c.data_page_offset
    if c.has_dictionary_page and c.dictionary_page_offset is not None and 0 < c.dictionary_page_offset < start:
        start = c.dictionary_page_offset
    return start, start + c.total_compressed_size


def file_ranges(raw: bytes) -> dict:
    """A Parquet file's byte ranges with their crc32, recorded in a keys-table part's key summary
    when it is written (``"ranges"``, coordinator/core/keytables.py): the tail (footer, its length
    and the magic) and each row group's pages. A point read fetches and checks those alone
    (:func:`read_part` with ``keys``), so it never decodes a byte that is not as written."""
    view = memoryview(raw)
    footer = int.from_bytes(raw[-8:-4], "little") + 8
    md = pq.read_metadata(pa.BufferReader(raw))
    groups = []
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        spans = [_chunk_span(rg.column(i)) for i in range(rg.num_columns)]
        lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
        groups.append([lo, hi - lo, zlib.crc32(view[lo:hi])])
    return {"tail": [footer, zlib.crc32(view[len(raw) - footer :])], "groups": groups}


class _Cache:
    """Values by key, bounded by their recorded sizes (``max_bytes``) and their number
    (``count``), the least recently used going first (the newest always stays); any thread.
    Keys must name immutable content (parts never change)."""

    def __init__(self, max_bytes: int, count: int | None = None) -> None:
        self.max_bytes, self.count = max_bytes, count
        self._lock = threading.Lock()
        self._items: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Any) -> Any:
        with self._lock:
            got = self._items.get(key)
            if got is None:
                return None
            self._items.move_to_end(key)
            return got[0]

    def put(self, key: Any, value: Any, size: int) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (value, size)
            self._bytes += size
            count = self.count if self.count is not None else len(self._items)
            while len(self._items) > 1 and (len(self._items) > count or self._bytes > self.max_bytes):
                self._bytes -= self._items.popitem(last=False)[1][1]


# Parsed, verified footers of parts read by point reads, by path and checksum: a lookup in a part
# read before fetches only its row group. Each is (parsed footer, its row groups' key bounds, its
# size in bytes, the row groups checked to lie in their recorded ranges), sized by its recorded
# tail length (a footer of a part of a few row groups takes a few KB: a table's thousand parts fit).
_FOOTERS = _Cache(64 << 20, 1 << 16)

# Row groups of parts decoded by point reads, by path, checksum, group and the columns decoded,
# each sized by its decoded buffers (an uncompressed-block cache, as ClickHouse's): lookups and
# update-mode writes of keys spread over a table read the same groups again and again, and a
# group's decode (~0.25-0.6 ms for 8,192 rows of a few columns, most of it decompression) is most
# of a lookup's cost. Only bytes checked against the group's recorded crc32 are decoded.
_GROUPS = _Cache(64 << 20)


def group_bounds(metadata: Any, primary_key: Sequence[str]) -> list[list[tuple[Any, Any] | None]]:
    """Per row group, the (min, max) statistics of each key column (None: none to go by)."""
    names = metadata.schema.to_arrow_schema().names
    where = [names.index(k) if k in names else -1 for k in primary_key]
    out = []
    for g in range(metadata.num_row_groups):
        rg = metadata.row_group(g)
        bounds: list[tuple[Any, Any] | None] = []
        for i in where:
            st = rg.column(i).statistics if i >= 0 else None
            bounds.append((st.min, st.max) if st is not None and st.has_min_max else None)
        out.append(bounds)
    return out


def groups_holding(bounds: list[list[tuple[Any, Any] | None]], keys: Sequence[tuple]) -> list[int]:
    """The row groups (their :func:`group_bounds`) whose key statistics may hold one of ``keys``."""
    out = []
    for g, b in enumerate(bounds):
        single = len(b) == 1  # one key column (the common case): no generator
        one = b[0] if single else None
        for key in keys:
            try:
                if (
                    (one is None or one[0] <= key[0] <= one[1])
                    if single
                    else all(x is None or x[0] <= v <= x[1] for v, x in zip(key, b))
                ):
                    out.append(g)
                    break
            except TypeError:
                out.append(g)
                break
    return out


def _corrupt(meta: PartMeta, why: str) -> CorruptPart:
    return CorruptPart(f"part {quote(meta.path)} {why}", path=meta.path)


def _missing(storage: Storage, meta: PartMeta) -> CorruptPart:
    return _corrupt(meta, f"is missing from {storage}")


def _ranged_footer(storage: Storage, meta: PartMeta, ranges: dict, pk: Sequence[str]) -> tuple[Any, list, set]:
    """The part's footer (parsed), its row groups' key bounds and the ``(group, offset,
    length)`` whose pages were found inside that recorded byte range (filled by the reader),
    from its verified tail."""
    got = _FOOTERS.get((meta.path, meta.checksum))
    if got is not None:
        return got[0], got[1], got[3]
    length = _tail_length(meta, ranges)
    try:
        (tail,) = storage.get_ranges(meta.path, [(meta.size - length, length)])
    except FileNotFoundError:
        raise _missing(storage, meta) from None
    _check_tail(meta, ranges, tail)
    try:
        metadata = pq.read_metadata(pa.BufferReader(_sparse(meta.size, [(meta.size - length, tail)])))
    except (pa.ArrowException, OSError) as exc:
        raise _corrupt(meta, f"footer does not parse: {clip(exc)}") from None
    return _keep_footer(meta, ranges, pk, metadata)


def _tail_length(meta: PartMeta, ranges: dict) -> int:
    length = ranges["tail"][0]
    if length > meta.size:
        raise _corrupt(meta, f"has a tail of {length} bytes recorded, larger than the file ({meta.size})")
    return length


def _check_tail(meta: PartMeta, ranges: dict, tail: bytes) -> None:
    length, crc = ranges["tail"]
    if len(tail) != length or zlib.crc32(tail) != crc or tail[-4:] != b"PAR1":
        raise _corrupt(meta, "footer is not as written (truncated, replaced or rotted)")


def _keep_footer(meta: PartMeta, ranges: dict, pk: Sequence[str], metadata: Any) -> tuple[Any, list, set]:
    """A footer parsed from a verified tail, checked against the part's record, cached."""
    if metadata.num_rows != meta.rows or metadata.num_row_groups != len(ranges["groups"]):
        raise _corrupt(meta, "footer disagrees with its recorded rows or row groups")
    bounds = group_bounds(metadata, pk)
    inside: set[tuple[int, int, int]] = set()
    _FOOTERS.put((meta.path, meta.checksum), (metadata, bounds, ranges["tail"][0], inside), ranges["tail"][0])
    return metadata, bounds, inside


def _check_spans(meta: PartMeta, metadata: Any, inside: set, groups: list[int], spans: list) -> None:
    """Each row group's pages lie inside its recorded byte range, which lies inside the file."""
    for g, (at, n, _) in zip(groups, spans):
        if at + n > meta.size:
            raise _corrupt(meta, f"row group {g} lies outside its recorded byte range")
        if (g, at, n) in inside:  # this footer's group against this recorded range: checked once
            continue
        rg = metadata.row_group(g)
        for i in range(rg.num_columns):
            lo, hi = _chunk_span(rg.column(i))
            if lo < at or hi > at + n:
                raise _corrupt(meta, f"row group {g} lies outside its recorded byte range")
        inside.add((g, at, n))


def _check_pieces(meta: PartMeta, groups: list[int], spans: list, got: list[bytes]) -> None:
    for g, (_, n, crc), piece in zip(groups, spans, got):
        if len(piece) != n or zlib.crc32(piece) != crc:
            raise _corrupt(meta, f"row group {g} is not as written (truncated, replaced or rotted)")


def _read_one_group(
    storage: Storage,
    meta: PartMeta,
    ranges: dict,
    columns: list[str] | None,
    keys: tuple[Sequence[str], Sequence[tuple]],
) -> pa.Table:
    """:func:`_read_key_groups` of a part of one row group whose footer is not cached (a
    lookup's usual first read of a part): the tail and the group fetched in one request and
    the footer parsed once, by the reader that decodes the group. Every byte checked first."""
    pk, wanted = keys
    length = _tail_length(meta, ranges)
    spans = list(ranges["groups"])
    if spans[0][0] + spans[0][1] > meta.size:
        raise _corrupt(meta, "row group 0 lies outside its recorded byte range")
    try:
        tail, piece = storage.get_ranges(meta.path, [(meta.size - length, length), (spans[0][0], spans[0][1])])
    except FileNotFoundError:
        raise _missing(storage, meta) from None
    _check_tail(meta, ranges, tail)
    _check_pieces(meta, [0], spans, [piece])
    try:
        pf = pq.ParquetFile(pa.BufferReader(_sparse(meta.size, [(meta.size - length, tail), (spans[0][0], piece)])))
    except (pa.ArrowException, OSError) as exc:
        raise _corrupt(meta, f"footer does not parse: {clip(exc)}") from None
    metadata, bounds, inside = _keep_footer(meta, ranges, pk, pf.metadata)
    groups = groups_holding(bounds, wanted)
    _known_columns(meta, metadata, columns)
    if not groups:
        return _no_rows(metadata, columns)
    _check_spans(meta, metadata, inside, groups, spans)
    return keytables.rows_of_keys(_decoded(meta, pf, 0, columns), *keys)


def _known_columns(meta: PartMeta, metadata: Any, columns: list[str] | None) -> None:
    """InvalidInput for a column the part does not have (the Arrow schema built only then: a
    point read of every column, the usual one, does not need it)."""
    if columns is not None:
        names = metadata.schema.to_arrow_schema().names
        unknown = [c for c in columns if c not in names]
        if unknown:
            raise InvalidInput(f"read of part {quote(meta.path)}: unknown column(s) {quote(unknown)}", missing=unknown)


def _no_rows(metadata: Any, columns: list[str] | None) -> pa.Table:
    schema = metadata.schema.to_arrow_schema()
    return schema.empty_table() if columns is None else schema.empty_table().select(columns)


def _decoded(meta: PartMeta, pf: Any, group: int, columns: list[str] | None) -> pa.Table:
    """Row group ``group`` of ``pf`` (part ``meta``, its bytes checked), its ``columns``
    decoded, kept in :data:`_GROUPS`."""
    try:
        data = pf.read_row_groups([group], columns=columns, use_threads=False)
    except (pa.ArrowException, OSError) as exc:
        raise _corrupt(meta, f"does not parse as Parquet: {clip(exc)}") from None
    size = data.get_total_buffer_size()
    if size <= _GROUPS.max_bytes // 8:  # a huge group would push out every other for one lookup
        _GROUPS.put(_group_key(meta, group, columns), data, size)
    return data


def _group_key(meta: PartMeta, group: int, columns: list[str] | None) -> tuple:
    return (meta.path, meta.checksum, group, None if columns is None else tuple(columns))


_SMALL_SPARSE = 1 << 20  # a buffer of at most this many bytes is allocated, not mapped (cheaper)


def _sparse(size: int, pieces: list[tuple[int, bytes]]) -> Any:
    """A buffer of ``size`` bytes holding ``pieces`` at their offsets and zeros elsewhere (for a
    big file an anonymous mapping: untouched pages cost nothing), for the Parquet reader to
    decode from."""
    buf: Any = bytearray(size) if size <= _SMALL_SPARSE else mmap.mmap(-1, max(size, 1))
    buf[:4] = b"PAR1"
    for at, piece in pieces:
        buf[at : at + len(piece)] = piece
    return pa.py_buffer(buf)


def _read_key_groups(
    storage: Storage,
    meta: PartMeta,
    ranges: dict,
    columns: list[str] | None,
    keys: tuple[Sequence[str], Sequence[tuple]],
) -> pa.Table:
    """A point read of a part with recorded ``ranges``: its verified footer (cached), then only
    the row groups whose key statistics may hold a key, each fetched and checked against its
    crc32, and of their rows those keys'."""
    if len(ranges["groups"]) == 1 and _FOOTERS.get((meta.path, meta.checksum)) is None:
        return _read_one_group(storage, meta, ranges, columns, keys)
    pk, wanted = keys
    metadata, bounds, inside = _ranged_footer(storage, meta, ranges, pk)
    groups = groups_holding(bounds, wanted)
    _known_columns(meta, metadata, columns)
    if not groups:
        return _no_rows(metadata, columns)
    held = {g: _GROUPS.get(_group_key(meta, g, columns)) for g in groups}
    missing = [g for g in groups if held[g] is None]
    if missing:
        held.update(_fetch_groups(storage, meta, ranges, (metadata, inside), missing, columns))
    data = [held[g] for g in groups]
    return keytables.rows_of_keys(data[0] if len(data) == 1 else pa.concat_tables(data), *keys)


def _fetch_groups(
    storage: Storage,
    meta: PartMeta,
    ranges: dict,
    footer: tuple[Any, set],
    groups: list[int],
    columns: list[str] | None,
) -> dict[int, pa.Table]:
    """Row groups ``groups`` of a part with recorded ``ranges`` (``footer``: its parsed, checked
    footer and the groups known to lie in their ranges), each fetched, checked against its crc32
    and decoded (:func:`_decoded`)."""
    metadata, inside = footer
    spans = [ranges["groups"][g] for g in groups]
    _check_spans(meta, metadata, inside, groups, spans)
    try:
        got = storage.get_ranges(meta.path, [(at, n) for at, n, _ in spans])
    except FileNotFoundError:
        raise _missing(storage, meta) from None
    _check_pieces(meta, groups, spans, got)
    try:
        pf = pq.ParquetFile(
            pa.BufferReader(_sparse(meta.size, [(s[0], p) for s, p in zip(spans, got)])), metadata=metadata
        )
    except (pa.ArrowException, OSError) as exc:
        raise _corrupt(meta, f"does not parse as Parquet: {clip(exc)}") from None
    return {g: _decoded(meta, pf, g, columns) for g in groups}


def part_content(storage: Storage, meta: PartMeta) -> bytes:
    """A part's whole Parquet bytes as they are now, unchecked: an inlined part's from its
    metadata (docs/architecture/small-writes.md), any other's from storage (FileNotFoundError
    when its file is gone); an inlined part its flush removed (``spilled``) by a range read of
    the flush's bundle (FileNotFoundError when the bundle is gone; short when it was cut). The
    one road by which a reader gets a part's bytes."""
    if meta.inline is not None:
        return meta.inline
    if meta.spilled is not None:
        bundle, offset = meta.spilled
        return storage.get_ranges(bundle, [(offset, meta.size)])[0]
    return storage.get(meta.path)


def store_bundle(storage: Storage, merged: PartMeta, flushed: Sequence[PartMeta]) -> dict[str, tuple[str, int]]:
    """Store the inlined parts ``flushed`` (a flush's sources with ``inline`` bytes) durably as one
    bundle beside ``merged``, the part their rows went into (:func:`bundle_path`: deleted with
    it, kept by the orphan pass while it is recorded); returns part name -> ``(bundle path,
    offset)``, what the flush's log entry records (``PartMeta.spilled``). Nothing stored and {}
    when none has bytes."""
    held = [m for m in flushed if m.inline is not None]
    if not held:
        return {}
    path = bundle_path(merged.path)
    where: dict[str, tuple[str, int]] = {}
    offset = 0
    for m in held:
        where[m.name] = (path, offset)
        offset += len(m.inline or b"")
    storage.put(path, b"".join(m.inline or b"" for m in held), fresh=True)  # a new name, as the part's
    return where


def _ranges(meta: PartMeta) -> dict | None:
    if meta.inlined:
        return None  # an inlined part is read whole from its metadata (or its flush's bundle)
    summary = meta.key_summary
    return summary.get("ranges") if isinstance(summary, dict) else None


def verify_file(storage: Storage, meta: PartMeta, checksum: bool = True) -> str | None:
    """What is wrong with a part's file in storage (missing, another size, another checksum), or
    None when it is as written. Without ``checksum`` only its presence and size are looked at."""
    try:
        if not checksum and not meta.inlined:
            size = storage.size(meta.path)
            return None if size == meta.size else f"has {size} bytes, {meta.size} were written"
        raw = part_content(storage, meta)
    except FileNotFoundError:
        return "is missing"
    if len(raw) != meta.size:
        return f"has {len(raw)} bytes, {meta.size} were written"
    actual = checksum_of(raw)
    return None if actual == meta.checksum else f"has checksum {actual}, {meta.checksum} was written"


def read_part(
    storage: Storage,
    meta: PartMeta,
    columns: list[str] | None = None,
    keys: tuple[Sequence[str], Sequence[tuple]] | None = None,
) -> pa.Table:
    """The part's rows, only after its size and checksum match what was recorded. ``keys``
    (``(primary key columns, keys)``, a keys-table point read): only the row groups whose
    statistics may hold one of the keys are decoded (:func:`key_row_groups`), and of their rows
    only those keys' are returned: of a part whose key summary records its byte ranges (written
    since 2026-11-27), only its footer and those row groups are fetched, each checked against
    its recorded crc32 (:func:`file_ranges`); older parts are fetched and checked whole."""
    if keys is not None:
        ranges = _ranges(meta)
        if ranges is not None:
            return _read_key_groups(storage, meta, ranges, columns, keys)
    raw = verified_bytes(storage, meta)
    try:
        pf = pq.ParquetFile(pa.BufferReader(raw))
        if columns is not None:
            unknown = [c for c in columns if c not in pf.schema_arrow.names]
            if unknown:
                raise InvalidInput(
                    f"read of part {quote(meta.path)}: unknown column(s) {quote(unknown)}", missing=unknown
                )
        if keys is not None:
            if pf.metadata.num_rows != meta.rows:
                raise CorruptPart(
                    f"part {quote(meta.path)} has {pf.metadata.num_rows} rows, {meta.rows} were written",
                    path=meta.path,
                )
            pk, wanted = keys
            groups = key_row_groups(pf.metadata, pk, wanted)
            if not groups:
                return (
                    pf.schema_arrow.empty_table() if columns is None else pf.schema_arrow.empty_table().select(columns)
                )
            # One thread: a point read decodes a group or two, where a pool's hand-offs cost more.
            got = pf.read_row_groups(groups, columns=columns, use_threads=False)
            return keytables.rows_of_keys(got, pk, wanted)
        result = pf.read(columns=columns)
    except (pa.ArrowException, OSError) as exc:
        raise CorruptPart(f"part {quote(meta.path)} does not parse as Parquet: {clip(exc)}", path=meta.path) from None
    if result.num_rows != meta.rows:
        raise CorruptPart(
            f"part {quote(meta.path)} has {result.num_rows} rows, {meta.rows} were written",
            path=meta.path,
        )
    return result


# Inlined parts (docs/architecture/small-writes.md) decoded by read_inlined, by their claims (path,
# size, checksum, rows), each with the bytes it was decoded from: a part is taken from here only
# when the bytes in its metadata now are those bytes, so what a read returns and refuses is what
# decoding them again would. Until a flush every read of a table holds its inlined parts again;
# this decodes each once per process. Sized by the bytes held, raw and decoded.
_INLINED = _Cache(64 << 20)


def _inlined_key(meta: PartMeta) -> tuple[str, int, str, int]:
    return (meta.path, meta.size, meta.checksum, meta.rows)


def held_inlined(meta: PartMeta) -> pa.Table | None:
    """An inlined part's rows when :func:`read_inlined` decoded these very bytes under these
    claims before and still holds them, else None (a part in storage: always None)."""
    if meta.inline is None:
        return None
    got = _INLINED.get(_inlined_key(meta))
    return None if got is None or got[0] != meta.inline else got[1]


def read_inlined(storage: Storage, meta: PartMeta) -> pa.Table:
    """An inlined part's rows, as :func:`read_part` reads them (its bytes checked against its
    size, checksum and rows), decoded once per process while they stay in :data:`_INLINED`:
    the readers of a table whose inlined parts are not yet flushed (``client.read``,
    ``client.dataset``) read the same thousands of parts again and again."""
    if meta.inline is None:
        return read_part(storage, meta)
    got = held_inlined(meta)
    if got is None:
        got = read_part(storage, meta)
        _INLINED.put(_inlined_key(meta), (meta.inline, got), len(meta.inline) + got.get_total_buffer_size())
    return got


def verified_bytes(storage: Storage, meta: PartMeta) -> bytes:
    """The part file's bytes, once their size and checksum match what was recorded: nothing is
    decoded from a file that was truncated, replaced or rotted (an inlined part's bytes, from
    its metadata, are checked alike)."""
    try:
        raw = part_content(storage, meta)
    except FileNotFoundError:
        raise _missing(storage, meta) from None
    if len(raw) != meta.size:
        raise CorruptPart(
            f"part {quote(meta.path)} has {len(raw)} bytes, {meta.size} were written (truncated or replaced)",
            path=meta.path,
        )
    actual = checksum_of(raw)
    if actual != meta.checksum:
        raise CorruptPart(f"part {quote(meta.path)} checksum is {actual}, {meta.checksum} was written", path=meta.path)
    return raw


def read_meta(storage: Storage, relpath: str) -> PartMeta:
    """Load a sidecar; CorruptMetadata when it does not parse or describes another file.
    A missing sidecar raises FileNotFoundError (a writer may have died between the two puts)."""
    raw = storage.get(relpath)
    try:
        d = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptMetadata(f"part metadata {quote(relpath)} is not JSON: {clip(exc)}", path=relpath) from None
    meta = PartMeta.from_dict(d)
    if meta.meta_path != relpath:
        raise CorruptMetadata(f"part metadata {quote(relpath)} describes another file {quote(meta.path)}", path=relpath)
    return meta


def delete_part(storage: Storage, path: str) -> None:
    """Delete a part's file and, for a Parquet part, its sidecar and its flush's bundle (if it
    has one), quietly: the one way every layer drops the files of a transaction that will never
    commit (a failure is logged; cleanup takes whatever is left as an orphan after the grace
    period)."""
    for p in (path, sidecar_path(path), bundle_path(path)) if path.endswith(".parquet") else (path,):
        try:
            storage.delete(p)
        except Exception as exc:  # noqa: BLE001 - quietly, whatever the backend raised
            log.warning("could not delete %s: %r", p, exc)


# -- what a file says about itself (stage-time verification, ``mergetxn check``) ---------------
# A part's claims are verified against its file before any reader can see it (replicas/registry.py
# ``Transactions.check_added``; docs/rules.md "What a part's metadata is checked against"): the
# whole file is read once (its crc32), its footer parsed from those bytes (rows, columns, the
# per-row-group min/max statistics); a column whose footer statistics cannot vouch for it (a
# float, which may hold NaN; a row group without statistics) is decoded, and a keys table's key
# columns are decoded to check its key summary. Parts written by the replica itself (its merges and
# compactions) are not verified again.


def file_claims(
    raw: bytes,
    meta: PartMeta,
    expected: pa.Schema | None = None,
    partition_by: Sequence[str] = (),
    primary_key: Sequence[str] = (),
    decoded: bool = False,
) -> tuple[str, str] | None:
    """``(field, why)`` of the first claim of ``meta`` that its file's bytes ``raw`` refute, or
    None when every claim holds: size, checksum, rows (the footer), columns and types (against
    ``expected``, when given), column statistics and the values of the ``partition_by`` columns
    (a claimed [min, max] must cover the file's values; every row in the part's partition), and
    a keys-table part's key summary (``primary_key``: its key columns). The file's values come
    from its footer's statistics (see :func:`file_stats`), from its decoded columns with
    ``decoded``."""
    if len(raw) != meta.size:
        return "size", f"says {meta.size} bytes, the file has {len(raw)}"
    actual = checksum_of(raw)
    if actual != meta.checksum:
        return "checksum", f"says {meta.checksum}, the file's is {actual}"
    try:
        pf = _Footer(raw)
        md = pf.metadata
        schema = pf.schema_arrow
    except (pa.ArrowException, OSError) as exc:
        return "file", f"does not parse as Parquet: {clip(exc)}"
    if md.num_rows != meta.rows:
        return "rows", f"says {meta.rows} rows, the file's footer has {md.num_rows}"
    known = None if expected is None else _table_schema(expected)
    if known is not None:
        wrong = schema_problem(schema, expected) or (_nulls_problem(pf, schema, expected) if known.not_null else None)
        if wrong is not None:
            return "schema", wrong
    names = set(schema.names)
    wanted = [c for c in (*meta.stats, *partition_by) if c in names]
    try:
        single = [c for c, (lo, hi) in meta.stats.items() if lo is not None and lo == hi]
        plain = None if known is None or decoded else _plain_leaves(md, known)
        truth = file_stats(pf, wanted, decoded, exact=single, schema=schema, plain=plain)
        problem = claims_problem(meta, truth, names) or partition_problem(partition_by, meta.partition, truth)
        if problem is None and meta.key_summary is not None:
            problem = _summary_claims(raw, pf, meta.key_summary, primary_key)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:  # a string column that is not UTF-8
        return "file", f"does not decode: {clip(exc)}"
    return problem


class _Footer:
    """A Parquet file's footer as ``ParquetFile`` gives it (``metadata``, ``schema_arrow``,
    ``read``), parsed once by pyarrow's reader alone: the ``ParquetFile`` that decodes columns is
    made (from the parsed metadata, no second parse) only when a column must be read."""

    __slots__ = ("_raw", "_file", "metadata", "schema_arrow")

    def __init__(self, raw: bytes) -> None:
        reader = pq.ParquetReader()
        reader.open(pa.BufferReader(raw))
        self._raw = raw
        self._file: pq.ParquetFile | None = None
        self.metadata = reader.metadata
        self.schema_arrow = reader.schema_arrow

    def read(self, columns: list[str], use_threads: bool = False) -> pa.Table:
        if self._file is None:
            self._file = pq.ParquetFile(pa.BufferReader(self._raw), metadata=self.metadata)
        return self._file.read(columns=columns, use_threads=use_threads)


def file_meta(raw: bytes, meta: PartMeta) -> PartMeta:
    """``meta`` with what its file's bytes ``raw`` say in place of its claims: size, checksum,
    rows and column statistics from the file, no key summary (a part without one may hold any
    key). What a repair reads a part under whose committed metadata its file contradicts."""
    pf = pq.ParquetFile(pa.BufferReader(raw))
    return dataclasses.replace(
        meta,
        size=len(raw),
        checksum=checksum_of(raw),
        rows=pf.metadata.num_rows,
        stats=column_stats(pf.read(use_threads=False)),
        key_summary=None,
    )


def part_schema(schema: pa.Schema, primary_key: Sequence[str] = (), folded: bool = False) -> pa.Schema:
    """The columns a part file of a table of ``schema`` holds: the table's, or for a keys table
    (``primary_key``) its versions' layout, with ``_ver`` for a compaction's output (``folded``)."""
    if not primary_key:
        return schema
    return (keytables.folded_schema if folded else keytables.file_schema)(schema, primary_key)


def claims_problem(
    meta: PartMeta, truth: dict[str, tuple[Any, Any]], columns: Collection[str]
) -> tuple[str, str] | None:
    """``(field, why)`` when a statistic or partition value of ``meta`` is narrower than the
    file's own ``truth`` (its columns' [min, max] as :func:`column_stats` gives them; a column
    absent has no order the statistics can state), else None."""
    for col, claimed in meta.stats.items():
        if col not in columns:
            return f"stats.{col}", "names a column the file does not have"
        wrong = stat_problem(claimed, truth.get(col))
        if wrong is not None:
            return f"stats.{col}", wrong
    return None


def stat_problem(claimed: tuple[Any, Any], truth: tuple[Any, Any] | None) -> str | None:
    """Why a claimed [min, max] of a column does not cover the file's values (``truth``, None
    when they have no order: NaN, another type), or None. A wider range is allowed (it only
    prunes less); (None, None) claims every value null; a max of None claims no upper bound."""
    lo, hi = claimed
    if truth is None:
        return f"claims [{quote(lo)}, {quote(hi)}], the file's values have no [min, max] (NaN or unordered)"
    tlo, thi = truth
    if lo is None and hi is None:
        return (
            None
            if tlo is None and thi is None
            else f"claims every value null, the file has [{quote(tlo)}, {quote(thi)}]"
        )
    if tlo is None and thi is None:
        return None  # every value null: any range covers them
    try:
        low_ok = lo is None or (_same_kind(lo, tlo) and lo <= tlo)
        high_ok = hi is None or (thi is not None and _same_kind(hi, thi) and hi >= thi)
    except TypeError:
        low_ok = high_ok = False
    if low_ok and high_ok:
        return None
    return f"claims [{quote(lo)}, {quote(hi)}], the file's values span [{quote(tlo)}, {quote(thi)}]"


def _same_kind(a: Any, b: Any) -> bool:
    """Whether two statistics compare as the reader's pruning compares them (bools with bools,
    strings with strings, numbers with numbers)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool)
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str)
    return isinstance(a, (int, float)) and isinstance(b, (int, float))


def partition_problem(
    partition_by: Sequence[str], partition: tuple, truth: dict[str, tuple[Any, Any]]
) -> tuple[str, str] | None:
    """``(field, why)`` when a row of the file lies outside the partition the part claims (the
    file's partition columns' [min, max] is not [value, value], or not all null for a null)."""
    for col, value in zip(partition_by, partition):
        want = (None, None) if value is None else ops.bound_range(value, value)
        got = truth.get(col)
        if got is None or tuple(got) != tuple(want):
            return (
                f"partition.{col}",
                f"says {quote(value)}, the file's values of {quote(col)} span {quote(list(got) if got else got)}",
            )
    return None


def schema_problem(schema: pa.Schema, expected: pa.Schema) -> str | None:
    """Why a file's columns (``schema``) are not the table's (``expected``): a column the table
    does not have, a non-nullable one missing, or another type than a reader takes it as."""
    if schema.equals(expected):
        return None  # the usual case (a part written by write_part), decided in one call
    extra = [n for n in schema.names if expected.get_field_index(n) < 0]
    if extra:
        return f"the file has column(s) {quote(extra)} the table does not have (columns {expected.names})"
    for f in expected:
        i = schema.get_field_index(f.name)
        if i < 0:
            if not f.nullable:
                return f"the file lacks the non-nullable column {quote(f.name)}"
            continue
        t = schema.field(i).type
        if not _readable_as(t, f.type):
            return f"column {quote(f.name)} is {t} in the file, the table has {f.type}"
    return None


def _nulls_problem(pf: Any, schema: pa.Schema, expected: pa.Schema) -> str | None:
    """Why a file holds nulls where the table allows none (by its footer's null counts; a column
    with a row group that has none is decoded), or None."""
    md = pf.metadata
    if md.num_columns != len(schema):
        return None  # nested columns: no leaf-per-field footer to read (reads check them)
    for f in expected:
        if f.nullable:
            continue
        j = schema.get_field_index(f.name)
        if j < 0:
            continue
        stats = [md.row_group(g).column(j).statistics for g in range(md.num_row_groups)]
        if all(st is not None and st.has_null_count for st in stats):
            nulls = sum(st.null_count for st in stats)
        else:
            nulls = pf.read(columns=[f.name], use_threads=False).column(0).null_count
        if nulls:
            return f"column {quote(f.name)} is NOT NULL in the table and the file has {nulls} null(s)"
    return None


def _readable_as(t: pa.DataType, want: pa.DataType) -> bool:
    """Whether a file's column type reads as the table's (a read casts it: ``TableDef.upgrade``):
    the same, or of the same family as another engine's writer gives it (Spark's writes a uint8
    column as int16, a date64 as date32, timestamps in microseconds): integers, floats, dates,
    strings, binaries, timestamps that are both zoned or both naive, lists of such."""
    if t.equals(want):
        return True
    families = (
        (pa.types.is_integer,),
        (pa.types.is_floating,),
        (pa.types.is_date,),
        (pa.types.is_string, pa.types.is_large_string),
        (pa.types.is_binary, pa.types.is_large_binary),
    )
    for family in families:
        if any(f(t) for f in family) and any(f(want) for f in family):
            return True
    if pa.types.is_timestamp(t) and pa.types.is_timestamp(want):
        return (t.tz is None) == (want.tz is None)
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and (pa.types.is_list(want) or pa.types.is_large_list(want)):
        return _readable_as(t.value_type, want.value_type)
    return False


def file_stats(
    pf: Any,
    columns: Sequence[str],
    decoded: bool = False,
    exact: Sequence[str] = (),
    schema: Any = None,
    plain: dict[str, str] | None = None,
) -> dict[str, tuple[Any, Any]]:
    """The [min, max] of each of ``columns`` of a Parquet file (``pf``, a ``ParquetFile``), as
    :func:`column_stats` gives it for the rows: from the footer's statistics where every row group
    has them, by decoding the column otherwise. A float column's footer statistics leave NaN out:
    it is decoded when it is in ``exact`` (a claim of one value, which prunes ``!=``, where a NaN
    row matches); any other range is covered or not whatever NaN the column holds (no comparison
    but ``!=`` matches NaN). ``decoded``: every column decoded (what ``mergetxn check`` does: it
    also catches a footer whose statistics disagree with its own pages). A column with no order
    (all NaN, nested) is absent. ``schema``: the file's Arrow schema, when the caller has it.
    ``plain``: the columns whose footer statistics are read as their physical values (the kind
    of each, from :func:`_plain_leaves`: the file's Parquet columns are the ones pyarrow writes for
    the table's types), the same values as the logical ones at a third of the cost."""
    md = pf.metadata
    schema = pf.schema_arrow if schema is None else schema
    wanted = list(dict.fromkeys(columns))
    if decoded:
        return _decoded_stats(pf, wanted, exact) if wanted else {}
    flat = md.num_columns == len(schema)  # leaf j is field j (no nested column)
    index = {n: i for i, n in enumerate(schema.names)} if flat else _leaf_index(md)
    groups = [md.row_group(g) for g in range(md.num_row_groups)]
    out: dict[str, tuple[Any, Any]] = {}
    decode = []
    for name in wanted:
        kind = None if plain is None else plain.get(name)
        if kind is not None and name in index and not (kind == "float" and name in exact):
            bounds = _footer_bounds(groups, index[name], kind)
            if bounds is not None:
                out[name] = bounds if kind != "str" or bounds[0] is None else ops.bound_range(*bounds)
                continue
        t = schema.field(name).type
        floating = pa.types.is_floating(t)
        # a float16's footer statistics are its 2 bytes each: the column is decoded
        unusable = (floating and (name in exact or pa.types.is_float16(t))) or name not in index
        bounds = None if unusable else _footer_bounds(groups, index[name])
        if bounds is None:
            decode.append(name)
        elif bounds[0] is None:
            out[name] = (None, None)
        elif pa.types.is_integer(t) or pa.types.is_boolean(t) or floating:
            out[name] = bounds
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            out[name] = ops.bound_range(*bounds)
        elif pa.types.is_date32(t):
            out[name] = (bounds[0].isoformat(), bounds[1].isoformat())
        else:
            out.update(column_stats(pa.table({name: pa.array(list(bounds)).cast(t)})))
    if decode:
        out.update(_decoded_stats(pf, decode, exact))
    return out


def _leaf_index(md: Any) -> dict[str, int]:
    return {md.schema.column(j).path: j for j in range(md.num_columns)}


def _decoded_stats(pf: Any, columns: list[str], exact: Sequence[str] = ()) -> dict[str, tuple[Any, Any]]:
    """:func:`column_stats` of ``columns`` decoded, long strings cut to one character past the
    statistics bound first (the bounds of the prefixes are the bounds of the values, and a 64 MiB
    value is never copied into Python), NaN left out of a float column not in ``exact`` (as the
    footer's statistics leave it out: see :func:`file_stats`; a column of NaN alone has no
    order). A large file's columns are decoded one at a time, each one's memory given back before
    the next (``mergetxn check`` of a big part holds one decoded column, not the whole part)."""
    md = pf.metadata
    size = sum(md.row_group(g).total_byte_size for g in range(md.num_row_groups))
    if size <= RELEASE_AFTER_BYTES or len(columns) < 2:
        return _columns_stats(pf, columns, exact, release=size > RELEASE_AFTER_BYTES)
    out: dict[str, tuple[Any, Any]] = {}
    for name in columns:
        out.update(_columns_stats(pf, [name], exact, release=True))
    return out


def _columns_stats(pf: Any, columns: list[str], exact: Sequence[str], release: bool) -> dict[str, tuple[Any, Any]]:
    data = pf.read(columns=columns, use_threads=False)
    cut, unordered = [], set()
    for name, col in zip(data.column_names, data.columns):
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            col = pc.utf8_slice_codeunits(col, 0, ops.STAT_PREFIX + 1)
        elif pa.types.is_floating(col.type) and name not in exact and pc.any(pc.is_nan(col)).as_py():
            col = pc.if_else(pc.is_nan(col), None, col)
            unordered.update([name] if col.null_count == len(col) else [])
        cut.append(col)
    out = column_stats(pa.Table.from_arrays(cut, names=data.column_names))
    for name in unordered:
        out.pop(name, None)
    if release:
        del data, cut
        pa.default_memory_pool().release_unused()
    return out


def _footer_bounds(groups: list, j: int, raw: str | None = None) -> tuple[Any, Any] | None:
    """Column ``j``'s least and greatest value over the row groups' footer statistics (``groups``:
    the file's row groups' metadata; (None, None): every value null); None when a row group has
    none to go by, or a string statistic that is not UTF-8 (another writer's cut inside a
    character, or a forged footer: the column is decoded). ``raw``: the column's kind when its
    physical values are its logical ones (:func:`_plain_leaves`; ``"str"``: UTF-8 bytes)."""
    lo = hi = None
    for rg in groups:
        st = rg.column(j).statistics
        if st is None:
            return None
        try:
            pair = _min_max(st, raw)
        except UnicodeDecodeError:
            return None
        if pair is not None:
            lo = pair[0] if lo is None else min(lo, pair[0])
            hi = pair[1] if hi is None else max(hi, pair[1])
        elif not (st.has_null_count and st.null_count == rg.num_rows):
            return None
    return lo, hi


def _min_max(st: Any, raw: str | None) -> tuple[Any, Any] | None:
    """A row group's column statistics ``st``'s (min, max), None when it has none: its logical
    values, or with ``raw`` (:func:`_plain_leaves`) its physical ones, which are the same for
    those columns at a third of the cost (min_raw is None exactly when there is no min/max)."""
    if raw is None:
        return (st.min, st.max) if st.has_min_max else None
    low = st.min_raw
    if low is None:
        return None
    if raw == "str":
        return low.decode(), st.max_raw.decode()
    return low, st.max_raw


class _TableSchema:
    """What the check of a file against a table's part schema ``expected`` takes from it once:
    its NOT NULL columns, the Parquet schema pyarrow writes for it (``written``; None if it
    writes none) and the kind of each column's physical statistics values (:func:`_plain_kind`)."""

    __slots__ = ("expected", "not_null", "written", "kinds")

    def __init__(self, expected: pa.Schema) -> None:
        self.expected = expected
        self.not_null = [f.name for f in expected if not f.nullable]
        found = ((f.name, _plain_kind(f.type)) for f in expected)
        self.kinds = {name: kind for name, kind in found if kind is not None}
        try:
            self.written: Any = pq.ParquetFile(pa.BufferReader(_parquet_bytes(expected.empty_table(), None))).schema
        except (pa.ArrowException, OSError, ValueError, TypeError):
            self.written = None


# Recent tables' part schemas, the last used first (a keys table's is made anew per statement).
_TABLE_SCHEMAS: list[_TableSchema] = []
_TABLE_SCHEMAS_KEPT = 16


def _table_schema(expected: pa.Schema) -> _TableSchema:
    for known in _TABLE_SCHEMAS:
        if known.expected is expected or known.expected.equals(expected, check_metadata=True):
            return known
    known = _TableSchema(expected)
    _TABLE_SCHEMAS.insert(0, known)
    del _TABLE_SCHEMAS[_TABLE_SCHEMAS_KEPT:]
    return known


def _plain_kind(t: pa.DataType) -> str | None:
    """The kind of a column of type ``t``'s physical statistics values as pyarrow writes it when
    they are its logical ones (signed integers, 32- and 64-bit floats, booleans; strings as UTF-8
    bytes)."""
    if pa.types.is_signed_integer(t) or pa.types.is_boolean(t):
        return "int"
    if pa.types.is_float32(t) or pa.types.is_float64(t):  # a float16 is written as 2 bytes
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "str"
    return None


def _plain_leaves(md: Any, known: _TableSchema) -> dict[str, str] | None:
    """The columns of the file of footer ``md`` whose statistics are read as physical values,
    with their kinds (:func:`_plain_kind`), when its Parquet columns (leaves: names, physical and
    logical types, repetition, levels) are exactly the ones pyarrow writes for the table's part
    schema (``known``); else None (the logical statistics are read). The file's Arrow schema is
    compared with the table's on its own (:func:`schema_problem`)."""
    written = known.written
    if written is None or md.num_columns != len(known.expected) or not md.schema.equals(written):
        return None
    return known.kinds


def _summary_claims(raw: bytes, pf: Any, summary: dict, primary_key: Sequence[str]) -> tuple[str, str] | None:
    """``(field, why)`` when a keys-table part's key summary does not hold every key of its file,
    or its recorded byte ranges are not the file's."""
    ranges = summary.get("ranges")
    if ranges is not None and ranges != file_ranges(raw):
        return "key_summary.ranges", "are not the file's byte ranges and their crc32"
    names = pf.schema_arrow.names
    missing = [k for k in primary_key if k not in names]
    if missing or not primary_key:
        return "key_summary", f"the file lacks the key column(s) {quote(missing or list(primary_key))}"
    extra = [c for c in (keytables.OP, keytables.COLS) if c in names] if "exact" in summary else []
    data = pf.read(columns=[*primary_key, *extra], use_threads=False)
    wrong = keytables.summary_gap(summary, data, primary_key)
    return None if wrong is None else ("key_summary", wrong)
