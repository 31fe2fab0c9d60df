"""mergetxn: transactions for replicated MergeTree-style tables.

``import coordinator`` gives the public Python surface: :class:`LocalCluster` (the embedded
default), :func:`connect`, the :class:`Tid` type, and the errors under ``coordinator.errors``.
"""

from coordinator import errors
from coordinator.client import Client, CommitStatus, Transaction, connect
from coordinator.cluster import LocalCluster
from coordinator.versions import Tid

__all__ = ["Client", "CommitStatus", "LocalCluster", "Tid", "Transaction", "connect", "errors"]
