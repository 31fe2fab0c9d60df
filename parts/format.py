"""The part format: one Parquet file per part plus a JSON sidecar holding its :class:`PartMeta`.

Layout under the storage root: ``<table>/<partition_dir>/<name>.parquet`` and ``<same>.json``.
The Parquet file is written first and durably, then the sidecar, so a sidecar always describes
a complete file. The checksum and size recorded at write time are checked on every read: a part
that changed, shrank or vanished raises CorruptPart instead of returning wrong rows.
Version metadata (creation/removal CSN, removal tid) is not stored here: parts are immutable and
those facts belong to the commit log.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from coordinator.errors import CorruptMetadata, CorruptPart, InvalidInput
from parts import ops
from parts.storage import Storage

COMPRESSION = "zstd"
_CHECKSUM_RE = re.compile(r"^crc32:[0-9a-f]{8}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,200}$")
_SCALARS = (type(None), bool, int, float, str)


@dataclass(frozen=True)
class PartMeta:
    """What a commit records about a part: enough to find, verify and prune it unopened."""

    name: str
    table: str
    partition: tuple
    path: str
    rows: int
    size: int
    checksum: str
    stats: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    creation_tid: str = ""
    created_at: float = 0.0

    @property
    def partition_key(self) -> str:
        """Canonical partition string (see :func:`parts.ops.partition_key`)."""
        return ops.partition_key(self.partition)

    @property
    def meta_path(self) -> str:
        """Path of the JSON sidecar."""
        return sidecar_path(self.path)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (tuples become lists)."""
        return {
            "name": self.name,
            "table": self.table,
            "partition": list(self.partition),
            "path": self.path,
            "rows": self.rows,
            "size": self.size,
            "checksum": self.checksum,
            "stats": {k: (None if v is None else list(v)) for k, v in self.stats.items()},
            "creation_tid": self.creation_tid,
            "created_at": self.created_at,
        }

    @classmethod
    def from_dict(cls, d: Any) -> PartMeta:
        """Validate and rebuild; CorruptMetadata names the first field that is wrong."""
        if not isinstance(d, dict):
            raise CorruptMetadata(f"part metadata must be a JSON object, got {type(d).__name__}")
        where = f"part metadata {d.get('path') or d.get('name')!r}"

        def need(key: str, types: tuple[type, ...], what: str) -> Any:
            if key not in d:
                raise CorruptMetadata(f"{where}: missing key {key!r}")
            value = d[key]
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                raise CorruptMetadata(f"{where}: {key!r} must be {what}, got {value!r}")
            return value

        name = need("name", (str,), "a part name")
        if not _NAME_RE.match(name):
            raise CorruptMetadata(f"{where}: 'name' {name!r} is not a valid part name")
        table = need("table", (str,), "a table name")
        try:
            ops.validate_name("table", table)
        except InvalidInput as exc:
            raise CorruptMetadata(f"{where}: {exc.message}") from None
        partition = need("partition", (list, tuple), "a list of scalars")
        if not all(isinstance(v, _SCALARS) for v in partition):
            raise CorruptMetadata(
                f"{where}: 'partition' must hold only JSON scalars, got {partition!r}"
            )
        path = need("path", (str,), "a relative path")
        if path.startswith("/") or ".." in path.split("/") or not path.endswith(".parquet"):
            raise CorruptMetadata(f"{where}: 'path' {path!r} is not a relative .parquet path")
        rows = need("rows", (int,), "a non-negative integer")
        size = need("size", (int,), "a non-negative integer")
        if rows < 0 or size < 0:
            raise CorruptMetadata(
                f"{where}: 'rows' and 'size' must be non-negative, got {rows}, {size}"
            )
        checksum = need("checksum", (str,), "a checksum string")
        if not _CHECKSUM_RE.match(checksum):
            raise CorruptMetadata(f"{where}: 'checksum' {checksum!r} is not 'crc32:<8 hex digits>'")
        raw_stats = need("stats", (dict,), "an object of column -> [min, max]")
        stats: dict[str, tuple[Any, Any]] = {}
        for col, rng in raw_stats.items():
            if rng is None:
                stats[col] = (None, None)
                continue
            if not (
                isinstance(rng, (list, tuple))
                and len(rng) == 2
                and all(isinstance(v, _SCALARS) for v in rng)
            ):
                raise CorruptMetadata(
                    f"{where}: stats for column {col!r} must be [min, max], got {rng!r}"
                )
            stats[col] = (rng[0], rng[1])
        creation_tid = need("creation_tid", (str,), "a transaction id string")
        created_at = need("created_at", (int, float), "a number (epoch seconds)")
        if not math.isfinite(created_at):
            raise CorruptMetadata(f"{where}: 'created_at' must be finite, got {created_at!r}")
        return cls(
            name=name,
            table=table,
            partition=tuple(partition),
            path=path,
            rows=rows,
            size=size,
            checksum=checksum,
            stats=stats,
            creation_tid=creation_tid,
            created_at=float(created_at),
        )


def sidecar_path(parquet_path: str) -> str:
    """``x.parquet`` -> ``x.json``."""
    return (
        parquet_path[: -len(".parquet")] + ".json"
        if parquet_path.endswith(".parquet")
        else parquet_path + ".json"
    )


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
    values are null. Floats with NaN or infinities are left out rather than misreport."""
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
        ok = (
            pa.types.is_integer(t)
            or pa.types.is_floating(t)
            or pa.types.is_string(t)
            or pa.types.is_large_string(t)
            or pa.types.is_date(t)
            or pa.types.is_boolean(t)
        )
        if not ok:
            continue
        if pa.types.is_floating(t) and col.null_count < len(col) and pc.any(pc.is_nan(col)).as_py():
            continue
        mm = pc.min_max(col)
        lo, hi = _iso(mm["min"].as_py()), _iso(mm["max"].as_py())
        if isinstance(lo, float) and not (math.isfinite(lo) and math.isfinite(hi)):
            continue
        stats[name] = (lo, hi)
    return stats


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
) -> PartMeta:
    """Serialise ``data`` to Parquet, store it durably, then its sidecar; return its metadata.
    Once this returns, the part can be referenced by a commit."""
    if not isinstance(data, pa.Table):
        raise InvalidInput(f"part data must be a pyarrow.Table, got {type(data).__name__}")
    partition = tuple(ops._json_scalar(v) for v in partition)
    name = new_part_name(creation_tid)
    path = part_path(table, list(partition_by), partition, name)
    sink = pa.BufferOutputStream()
    pq.write_table(data, sink, compression=COMPRESSION, write_statistics=True)
    raw = sink.getvalue().to_pybytes()
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
    )
    storage.put(path, raw)
    storage.put(
        meta.meta_path,
        json.dumps(meta.to_dict(), separators=(",", ":"), allow_nan=False).encode("utf-8"),
        durable=False,  # advisory: the commit entry carries the same metadata
    )
    return meta


def read_part(storage: Storage, meta: PartMeta, columns: list[str] | None = None) -> pa.Table:
    """The part's rows, only after its size and checksum match what was recorded."""
    try:
        raw = storage.get(meta.path)
    except FileNotFoundError:
        raise CorruptPart(f"part {meta.path!r} is missing from {storage}", path=meta.path) from None
    if len(raw) != meta.size:
        raise CorruptPart(
            f"part {meta.path!r} has {len(raw)} bytes, {meta.size} were written "
            "(truncated or replaced)",
            path=meta.path,
        )
    actual = checksum_of(raw)
    if actual != meta.checksum:
        raise CorruptPart(
            f"part {meta.path!r} checksum is {actual}, {meta.checksum} was written", path=meta.path
        )
    try:
        pf = pq.ParquetFile(pa.BufferReader(raw))
        if columns is not None:
            unknown = [c for c in columns if c not in pf.schema_arrow.names]
            if unknown:
                raise InvalidInput(
                    f"read of part {meta.path!r}: unknown column(s) {unknown}", missing=unknown
                )
        result = pf.read(columns=columns)
    except (pa.ArrowException, OSError) as exc:
        raise CorruptPart(
            f"part {meta.path!r} does not parse as Parquet: {exc}", path=meta.path
        ) from None
    if result.num_rows != meta.rows:
        raise CorruptPart(
            f"part {meta.path!r} has {result.num_rows} rows, {meta.rows} were written",
            path=meta.path,
        )
    return result


def read_meta(storage: Storage, relpath: str) -> PartMeta:
    """Load a sidecar; CorruptMetadata when it does not parse or describes another file.
    A missing sidecar raises FileNotFoundError (a writer may have died between the two puts)."""
    raw = storage.get(relpath)
    try:
        d = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptMetadata(
            f"part metadata {relpath!r} is not JSON: {exc}", path=relpath
        ) from None
    meta = PartMeta.from_dict(d)
    if meta.meta_path != relpath:
        raise CorruptMetadata(
            f"part metadata {relpath!r} describes another file {meta.path!r}", path=relpath
        )
    return meta
