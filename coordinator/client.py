"""``coordinator.client``: the Python client's older public module name (the client is
:mod:`mergetxn.client`)."""

from mergetxn.client.client import Client, CommitStatus, Transaction, connect

__all__ = ["Client", "CommitStatus", "Transaction", "connect"]
