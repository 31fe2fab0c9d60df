"""Parts: immutable Parquet files of one table partition, their metadata, and the storage
they live in. Pure of ZooKeeper and transactions; both clients and replicas use it.

``coordinator`` is imported first on purpose: its package imports modules of this one, and our
modules import ``coordinator.errors``; entering through ``parts`` must let ``coordinator``
finish initialising before any ``parts`` submodule is half-loaded.
"""

import coordinator  # noqa: F401  (import order, see above)
from parts.format import PartMeta, new_part_name, read_meta, read_part, write_part
from parts.storage import Storage

__all__ = ["PartMeta", "Storage", "new_part_name", "read_meta", "read_part", "write_part"]
