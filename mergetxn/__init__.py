"""mergetxn: transactions for replicated MergeTree-style tables.

``import mergetxn`` gives the public API (docs/surface.md#one-public-import): :func:`connect`,
:class:`LocalCluster` (the embedded default), :mod:`mergetxn.errors` (the classes of
``coordinator.errors``, the same objects), :mod:`mergetxn.spark` (``register``, ``read_table``,
``write_table``, ``write_stream``), and the :class:`Client`, :class:`Transaction`,
:class:`CommitStatus` and :class:`Tid` types, and :func:`duckdb_view` (a dataset read by
DuckDB's own Parquet reader). Every name keeps working where it was
(``coordinator.connect``, ``spark.read_table``, ...). The names load on first use, so that
``mergetxn.cli`` and the replica processes it starts do not pay for the client or Spark.

The tools live beside them: ``mergetxn.cli`` (the ``mergetxn`` command), ``mergetxn.tools.quickstart``,
``mergetxn.local.cluster``, ``mergetxn.local.zkserver``, ``mergetxn.chaos``; nothing in the layers below
imports them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coordinator.core.versions import Tid
    from mergetxn import errors, spark
    from mergetxn.client.client import Client, CommitStatus, Transaction, connect
    from mergetxn.local.cluster import LocalCluster
    from parts.io.dataset import duckdb_view

# name -> (module, attribute or None for the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    "connect": ("mergetxn.client.client", "connect"),
    "Client": ("mergetxn.client.client", "Client"),
    "Transaction": ("mergetxn.client.client", "Transaction"),
    "CommitStatus": ("mergetxn.client.client", "CommitStatus"),
    "Tid": ("coordinator.core.versions", "Tid"),
    "LocalCluster": ("mergetxn.local.cluster", "LocalCluster"),
    "errors": ("mergetxn.errors", None),
    "spark": ("mergetxn.spark", None),
    "duckdb_view": ("parts.io.dataset", "duckdb_view"),
}

__all__ = ["Client", "CommitStatus", "LocalCluster", "Tid", "Transaction", "connect", "duckdb_view", "errors", "spark"]


def __getattr__(name: str) -> Any:
    entry = _LAZY.get(name)
    if entry is None:
        raise AttributeError(f"module 'mergetxn' has no attribute {name!r}")
    import importlib

    module, attribute = entry
    value = importlib.import_module(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
