"""Parts: immutable Parquet files of one table partition, their metadata, and the storage
they live in. Pure of ZooKeeper and transactions; both clients and replicas use it.

Two layers: ``parts.model`` (a part's metadata record, pure) and ``parts.io`` (part files,
storage, rewrites, datasets). The names below load on first use, so that importing one layer
does not pull in the other."""

from __future__ import annotations

from typing import TYPE_CHECKING

from coordinator.core.lazy import lazy_names

if TYPE_CHECKING:
    from parts.io.format import new_part_name, read_meta, read_part, write_part
    from parts.io.storage import Storage
    from parts.model.meta import PartMeta

_LAZY = {
    "PartMeta": "parts.model.meta",
    "Storage": "parts.io.storage",
    "new_part_name": "parts.io.format",
    "read_meta": "parts.io.format",
    "read_part": "parts.io.format",
    "write_part": "parts.io.format",
}

__all__ = ["PartMeta", "Storage", "new_part_name", "read_meta", "read_part", "write_part"]


__getattr__ = lazy_names(__name__, _LAZY, globals())
