"""What a commit records about a part (:class:`PartMeta`): the pure half of the part format.

The log entry, the WAL and the RPC all carry part descriptors, so their type lives below every
layer that does I/O; parts/io/format.py writes and reads the files they describe.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from dataclasses import dataclass, field
from typing import Any

from coordinator.core import tabledata as ops
from coordinator.core.errors import CorruptMetadata, InvalidInput, quote

_CHECKSUM_RE = re.compile(r"^crc32:[0-9a-f]{8}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,200}$")
_SCALARS = (type(None), bool, int, float, str)
# The most bytes an inlined part may carry in its metadata, whatever a setting says: a log entry,
# a WAL record and a checkpoint hold it (docs/architecture/small-writes.md). The settings
# (inline_bytes per table and replica) are at most this.
INLINE_MAX_BYTES = 256 * 1024
# A flush's bundle (``bundle_path``): the flushed inlined parts' bytes, one after the other. No
# offset into one is past this (a bundle holds at most a merge's worth of inlined parts).
BUNDLE_MAX_OFFSET = 1 << 40
BUNDLE_SUFFIX = ".inlined"


@dataclass(frozen=True)
class PartMeta:
    """What a commit records about a part: enough to find, verify and prune it unopened."""

    name: str
    table: str
    partition: tuple[Any, ...]
    path: str
    rows: int
    size: int
    checksum: str
    stats: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    creation_tid: str = ""
    created_at: float = 0.0
    schema_version: int = 0  # the table definition's ddl_version it was written for (coordinator/model/catalog.py)
    # A keys-table part's key range and Bloom filter (coordinator/core/keytables.py "key summaries"), so the
    # key conflict check and point reads skip parts unopened; None (older parts, other tables):
    # the part may hold any key.
    key_summary: dict[str, Any] | None = None
    # An inlined part (a small write): its whole Parquet file, carried in the metadata itself (in
    # the log entry, the WAL and checkpoints) instead of in storage; ``path`` names where a file
    # would be and none is ever written there; ``size`` and ``checksum`` are this content's. None:
    # a part in storage. A flush (a merge) turns inlined parts into a part in storage.
    inline: bytes | None = field(default=None, repr=False)
    # An inlined part its flush removed (docs/architecture/small-writes.md, "Bounds"): its bytes
    # are no longer in its metadata but at ``(bundle path, byte offset)`` in the bundle the flush
    # wrote beside the part it merged them into (:func:`bundle_path`), ``size`` bytes long; set
    # only by applying the flush's log entry, never with ``inline``. None: anything else.
    spilled: tuple[str, int] | None = None

    @property
    def inlined(self) -> bool:
        """Whether the part has no file of its own in storage: its content is in its metadata,
        or (``spilled``) in its flush's bundle. Either way read through
        :func:`parts.io.format.part_content`, never at ``path``."""
        return self.inline is not None or self.spilled is not None

    @property
    def partition_key(self) -> str:
        """Canonical partition string (see :func:`coordinator.core.tabledata.partition_key`)."""
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
            **({"schema_version": self.schema_version} if self.schema_version else {}),
            **({"key_summary": self.key_summary} if self.key_summary is not None else {}),
            **({"inline": base64.b64encode(self.inline).decode("ascii")} if self.inline is not None else {}),
            **({"spilled": list(self.spilled)} if self.spilled is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Any) -> PartMeta:
        """Validate and rebuild; CorruptMetadata names the first field that is wrong.

        One pass, cheap when the descriptor is well formed (every staged part's comes from a
        client through here): a field of the exact JSON type is taken at once, anything else goes
        through :func:`_need`, which accepts what ``isinstance`` accepts (bool never as a number)
        and says what is wrong; the message's subject is built only for a refusal."""
        if not isinstance(d, dict):
            raise CorruptMetadata(f"part metadata must be a JSON object, got {type(d).__name__}")
        name, table, partition, path = _location(d)
        rows, size, checksum = _extent(d)
        raw_stats = d.get("stats", _MISSING)
        if type(raw_stats) is not dict:
            raw_stats = _need(d, "stats", (dict,), "an object of column -> [min, max]")
        stats = _stats(d, raw_stats)
        creation_tid, created_at, schema_version = _origin(d)
        key_summary = _key_summary(d)
        inline = _inline(d, size)
        spilled = None if d.get("spilled") is None else spill_location(d["spilled"], _where(d), table)
        if spilled is not None and inline is not None:
            raise CorruptMetadata(
                f"{_where(d)}: 'spilled' and 'inline' exclude each other (its bytes are in one place)"
            )
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
            schema_version=schema_version,
            key_summary=key_summary,
            inline=inline,
            spilled=spilled,
        )


_MISSING = object()


def _where(d: dict[str, Any]) -> str:
    """The subject of a refusal: the descriptor's path or name, quoted (built only to refuse)."""
    return f"part metadata {quote(d.get('path') or d.get('name'))}"


def _need(d: dict[str, Any], key: str, types: tuple[type, ...], what: str) -> Any:
    """``d[key]`` if it is one of ``types`` (a bool only where bool is named), else CorruptMetadata."""
    if key not in d:
        raise CorruptMetadata(f"{_where(d)}: missing key {quote(key)}")
    value = d[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise CorruptMetadata(f"{_where(d)}: {quote(key)} must be {what}, got {quote(value)}")
    return value


def _location(d: dict[str, Any]) -> tuple[str, str, list[Any] | tuple[Any, ...], str]:
    """A descriptor's name, table, partition values and relative path, each checked."""
    get = d.get
    name = get("name", _MISSING)
    if type(name) is not str:
        name = _need(d, "name", (str,), "a part name")
    if not _NAME_RE.match(name):
        raise CorruptMetadata(f"{_where(d)}: 'name' {quote(name)} is not a valid part name")
    table = get("table", _MISSING)
    if type(table) is not str:
        table = _need(d, "table", (str,), "a table name")
    try:
        ops.validate_name("table", table)
    except InvalidInput as exc:
        raise CorruptMetadata(f"{_where(d)}: {exc.message}") from None
    partition = get("partition", _MISSING)
    if type(partition) is not list:
        partition = _need(d, "partition", (list, tuple), "a list of scalars")
    for v in partition:
        if not isinstance(v, _SCALARS):
            raise CorruptMetadata(f"{_where(d)}: 'partition' must hold only JSON scalars, got {quote(partition)}")
    path = get("path", _MISSING)
    if type(path) is not str:
        path = _need(d, "path", (str,), "a relative path")
    if path.startswith("/") or not path.endswith(".parquet") or ".." in path.split("/"):
        raise CorruptMetadata(f"{_where(d)}: 'path' {quote(path)} is not a relative .parquet path")
    return name, table, partition, path


def _extent(d: dict[str, Any]) -> tuple[int, int, str]:
    """A descriptor's row count, size in bytes and checksum, each checked."""
    get = d.get
    rows = get("rows", _MISSING)
    if type(rows) is not int:
        rows = _need(d, "rows", (int,), "a non-negative integer")
    size = get("size", _MISSING)
    if type(size) is not int:
        size = _need(d, "size", (int,), "a non-negative integer")
    if rows < 0 or size < 0:
        raise CorruptMetadata(f"{_where(d)}: 'rows' and 'size' must be non-negative, got {rows}, {size}")
    checksum = get("checksum", _MISSING)
    if type(checksum) is not str:
        checksum = _need(d, "checksum", (str,), "a checksum string")
    if not _CHECKSUM_RE.match(checksum):
        raise CorruptMetadata(f"{_where(d)}: 'checksum' {quote(checksum)} is not 'crc32:<8 hex digits>'")
    return rows, size, checksum


def _origin(d: dict[str, Any]) -> tuple[str, int | float, int]:
    """The transaction that wrote a part, when, and for which schema version, each checked."""
    get = d.get
    creation_tid = get("creation_tid", _MISSING)
    if type(creation_tid) is not str:
        creation_tid = _need(d, "creation_tid", (str,), "a transaction id string")
    created_at = get("created_at", _MISSING)
    if type(created_at) is not float and type(created_at) is not int:
        created_at = _need(d, "created_at", (int, float), "a number (epoch seconds)")
    if not math.isfinite(created_at):
        raise CorruptMetadata(f"{_where(d)}: 'created_at' must be finite, got {quote(created_at)}")
    schema_version = get("schema_version", 0)
    if not isinstance(schema_version, int) or isinstance(schema_version, bool) or schema_version < 0:
        raise CorruptMetadata(
            f"{_where(d)}: 'schema_version' must be a non-negative integer, got {quote(schema_version)}"
        )
    return creation_tid, created_at, schema_version


def _key_summary(d: dict[str, Any]) -> dict[str, Any] | None:
    """A keys-table part's key summary, checked and bounded; None when it has none."""
    key_summary = d.get("key_summary")
    if key_summary is None:
        return None
    from coordinator.core.keytables import bound_summary, summary_problem

    problem = summary_problem(key_summary)
    if problem is not None:
        raise CorruptMetadata(f"{_where(d)}: 'key_summary' {problem}")
    return bound_summary(key_summary)


def _inline(d: dict[str, Any], size: int) -> bytes | None:
    """An inlined part's content (base64 in JSON), bounded by :data:`INLINE_MAX_BYTES` and of
    exactly ``size`` bytes; None when the part is in storage."""
    encoded = d.get("inline")
    if encoded is None:
        return None
    if type(encoded) is not str:
        raise CorruptMetadata(f"{_where(d)}: 'inline' must be a base64 string, got {type(encoded).__name__}")
    if len(encoded) > 4 * (INLINE_MAX_BYTES // 3 + 1):
        raise CorruptMetadata(f"{_where(d)}: 'inline' holds more than {INLINE_MAX_BYTES} bytes")
    try:
        content = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise CorruptMetadata(f"{_where(d)}: 'inline' is not valid base64") from None
    if len(content) != size:
        raise CorruptMetadata(f"{_where(d)}: 'inline' holds {len(content)} bytes, 'size' says {size}")
    return content


def _stats(d: dict[str, Any], raw_stats: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The per-column [min, max] of a descriptor, long strings cut to the statistics bound."""
    stats: dict[str, tuple[Any, Any]] = {}
    cut = ops.STAT_PREFIX
    for col, rng in raw_stats.items():
        if rng is None:
            stats[col] = (None, None)
            continue
        if not (
            isinstance(rng, (list, tuple))
            and len(rng) == 2
            and isinstance(rng[0], _SCALARS)
            and isinstance(rng[1], _SCALARS)
        ):
            raise CorruptMetadata(f"{_where(d)}: stats for column {quote(col)} must be [min, max], got {quote(rng)}")
        lo, hi = rng
        if (isinstance(lo, str) and len(lo) > cut) or (isinstance(hi, str) and len(hi) > cut):
            lo, hi = ops.bound_range(lo, hi)  # a client's (or an old part's) long min/max
        stats[col] = (lo, hi)
    return stats


def sidecar_path(parquet_path: str) -> str:
    """``x.parquet`` -> ``x.json``."""
    return parquet_path[: -len(".parquet")] + ".json" if parquet_path.endswith(".parquet") else parquet_path + ".json"


def bundle_path(parquet_path: str) -> str:
    """``x.parquet`` -> ``x.inlined``: the bundle of the inlined parts a flush merged into the
    part at ``x.parquet`` (their Parquet bytes one after the other), deleted with that part."""
    stem = parquet_path[: -len(".parquet")] if parquet_path.endswith(".parquet") else parquet_path
    return stem + BUNDLE_SUFFIX


def spill_location(value: Any, where: str, table: str | None = None) -> tuple[str, int]:
    """A spilled part's ``[bundle path, byte offset]`` (``PartMeta.spilled``, a flush's log entry),
    checked as hostile input: a relative path ending in :data:`BUNDLE_SUFFIX` without ``..`` (under
    ``table``'s directory when given: a flush's bundle is beside its part), an integer offset from
    0 to :data:`BUNDLE_MAX_OFFSET`; CorruptMetadata naming ``where`` otherwise."""
    if type(value) not in (list, tuple) or len(value) != 2:
        raise CorruptMetadata(f"{where}: 'spilled' must be [bundle path, byte offset], got {quote(value)}")
    path, offset = value
    if (
        type(path) is not str
        or not 0 < len(path) <= 1024
        or path.startswith("/")
        or not path.endswith(BUNDLE_SUFFIX)
        or ".." in path.split("/")
        or (table is not None and not path.startswith(table + "/"))
    ):
        raise CorruptMetadata(
            f"{where}: 'spilled' path {quote(path)} is not a relative {BUNDLE_SUFFIX} path under its table"
        )
    if type(offset) is not int or not 0 <= offset <= BUNDLE_MAX_OFFSET:
        raise CorruptMetadata(
            f"{where}: 'spilled' offset must be an integer from 0 to {BUNDLE_MAX_OFFSET}, got {quote(offset)}"
        )
    return path, offset
