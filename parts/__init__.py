"""Parts: immutable Parquet files of one table partition, their metadata, and the storage
they live in. Pure of ZooKeeper and transactions; both clients and replicas use it."""

from parts.format import new_part_name, read_meta, read_part, write_part
from parts.meta import PartMeta
from parts.storage import Storage

__all__ = ["PartMeta", "Storage", "new_part_name", "read_meta", "read_part", "write_part"]
