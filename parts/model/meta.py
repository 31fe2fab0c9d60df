"""What a commit records about a part (:class:`PartMeta`): the pure half of the part format.

The log entry, the WAL and the RPC all carry part descriptors, so their type lives below every
layer that does I/O; parts/io/format.py writes and reads the files they describe.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from coordinator.core import tabledata as ops
from coordinator.core.errors import CorruptMetadata, InvalidInput, quote

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
    schema_version: int = 0  # the table definition's ddl_version it was written for (coordinator/model/catalog.py)
    # A keys-table part's key range and Bloom filter (coordinator/core/keytables.py "key summaries"), so the
    # key conflict check and point reads skip parts unopened; None (older parts, other tables):
    # the part may hold any key.
    key_summary: dict[str, Any] | None = None

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
        }

    @classmethod
    def from_dict(cls, d: Any) -> PartMeta:
        """Validate and rebuild; CorruptMetadata names the first field that is wrong."""
        if not isinstance(d, dict):
            raise CorruptMetadata(f"part metadata must be a JSON object, got {type(d).__name__}")
        where = f"part metadata {quote(d.get('path') or d.get('name'))}"

        def need(key: str, types: tuple[type, ...], what: str) -> Any:
            if key not in d:
                raise CorruptMetadata(f"{where}: missing key {quote(key)}")
            value = d[key]
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                raise CorruptMetadata(f"{where}: {quote(key)} must be {what}, got {quote(value)}")
            return value

        name = need("name", (str,), "a part name")
        if not _NAME_RE.match(name):
            raise CorruptMetadata(f"{where}: 'name' {quote(name)} is not a valid part name")
        table = need("table", (str,), "a table name")
        try:
            ops.validate_name("table", table)
        except InvalidInput as exc:
            raise CorruptMetadata(f"{where}: {exc.message}") from None
        partition = need("partition", (list, tuple), "a list of scalars")
        if not all(isinstance(v, _SCALARS) for v in partition):
            raise CorruptMetadata(f"{where}: 'partition' must hold only JSON scalars, got {quote(partition)}")
        path = need("path", (str,), "a relative path")
        if path.startswith("/") or ".." in path.split("/") or not path.endswith(".parquet"):
            raise CorruptMetadata(f"{where}: 'path' {quote(path)} is not a relative .parquet path")
        rows = need("rows", (int,), "a non-negative integer")
        size = need("size", (int,), "a non-negative integer")
        if rows < 0 or size < 0:
            raise CorruptMetadata(f"{where}: 'rows' and 'size' must be non-negative, got {rows}, {size}")
        checksum = need("checksum", (str,), "a checksum string")
        if not _CHECKSUM_RE.match(checksum):
            raise CorruptMetadata(f"{where}: 'checksum' {quote(checksum)} is not 'crc32:<8 hex digits>'")
        raw_stats = need("stats", (dict,), "an object of column -> [min, max]")
        stats: dict[str, tuple[Any, Any]] = {}
        cut = ops.STAT_PREFIX
        for col, rng in raw_stats.items():
            if rng is None:
                stats[col] = (None, None)
                continue
            if not (isinstance(rng, (list, tuple)) and len(rng) == 2 and all(isinstance(v, _SCALARS) for v in rng)):
                raise CorruptMetadata(f"{where}: stats for column {quote(col)} must be [min, max], got {quote(rng)}")
            lo, hi = rng
            if (isinstance(lo, str) and len(lo) > cut) or (isinstance(hi, str) and len(hi) > cut):
                lo, hi = ops.bound_range(lo, hi)  # a client's (or an old part's) long min/max
            stats[col] = (lo, hi)
        creation_tid = need("creation_tid", (str,), "a transaction id string")
        created_at = need("created_at", (int, float), "a number (epoch seconds)")
        if not math.isfinite(created_at):
            raise CorruptMetadata(f"{where}: 'created_at' must be finite, got {quote(created_at)}")
        schema_version = d.get("schema_version", 0)
        if not isinstance(schema_version, int) or isinstance(schema_version, bool) or schema_version < 0:
            raise CorruptMetadata(
                f"{where}: 'schema_version' must be a non-negative integer, got {quote(schema_version)}"
            )
        key_summary = d.get("key_summary")
        if key_summary is not None:
            from coordinator.core.keytables import bound_summary, summary_problem

            problem = summary_problem(key_summary)
            if problem is not None:
                raise CorruptMetadata(f"{where}: 'key_summary' {problem}")
            key_summary = bound_summary(key_summary)
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
        )


def sidecar_path(parquet_path: str) -> str:
    """``x.parquet`` -> ``x.json``."""
    return parquet_path[: -len(".parquet")] + ".json" if parquet_path.endswith(".parquet") else parquet_path + ".json"
