"""``coordinator.client``: the Python client's public module name (coordinator/api/client.py)."""

from coordinator.api.client import Client, CommitStatus, Transaction, connect

__all__ = ["Client", "CommitStatus", "Transaction", "connect"]
