"""mergetxn: transactions for replicated MergeTree-style tables.

``import coordinator`` gives the public Python surface: :class:`LocalCluster` (the embedded
default), :func:`connect`, the :class:`Tid` type, and the errors under ``coordinator.core.errors``.
The heavier names load on first use, so that the layers below (which need only ``coordinator.core``)
can be imported without pulling in the client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coordinator import errors  # the public name of coordinator/core/errors.py
from coordinator.core.lazy import lazy_names
from coordinator.core.versions import Tid

if TYPE_CHECKING:
    from mergetxn.client.client import Client, CommitStatus, Transaction, connect
    from mergetxn.local.cluster import LocalCluster

_LAZY = {
    "Client": "mergetxn.client.client",
    "CommitStatus": "mergetxn.client.client",
    "Transaction": "mergetxn.client.client",
    "connect": "mergetxn.client.client",
    "LocalCluster": "mergetxn.local.cluster",
}

__all__ = ["Client", "CommitStatus", "LocalCluster", "Tid", "Transaction", "connect", "errors"]


__getattr__ = lazy_names(__name__, _LAZY, globals())
