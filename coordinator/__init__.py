"""mergetxn: transactions for replicated MergeTree-style tables.

``import coordinator`` gives the public Python surface: :class:`LocalCluster` (the embedded
default), :func:`connect`, the :class:`Tid` type, and the errors under ``coordinator.errors``.
The heavier names load on first use, so that ``parts`` (which needs only ``coordinator.errors``)
can be imported without pulling in the client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from coordinator import errors
from coordinator.versions import Tid

if TYPE_CHECKING:
    from coordinator.client import Client, CommitStatus, Transaction, connect
    from mergetxn.cluster import LocalCluster

_LAZY = {
    "Client": "coordinator.client",
    "CommitStatus": "coordinator.client",
    "Transaction": "coordinator.client",
    "connect": "coordinator.client",
    "LocalCluster": "mergetxn.cluster",
}

__all__ = ["Client", "CommitStatus", "LocalCluster", "Tid", "Transaction", "connect", "errors"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'coordinator' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
