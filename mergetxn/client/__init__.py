"""The Python client: ``Client``, ``Transaction``, their argument checks and the session
heartbeat. It stands above ``replicas/`` and ``parts/`` (docs/architecture/index.md); ``import
mergetxn`` reaches it, and the older names ``coordinator.client`` and ``coordinator.api.*`` are
aliases of these modules. The names below load on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mergetxn.client.client import Client, CommitStatus, Transaction, connect

__all__ = ["Client", "CommitStatus", "Transaction", "connect"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'mergetxn.client' has no attribute {name!r}")
    from mergetxn.client import client

    value = getattr(client, name)
    globals()[name] = value
    return value
