"""PySpark integration: the `mergetxn` data source (Spark 4 Python Data Source API), and
``read_table`` / ``write_table`` (spark/native.py), which move rows with Spark's own Parquet reader
and writer and do the transaction on the driver.

``spark.register(session)`` makes ``format("mergetxn")`` available in a session and turns on
Spark's filter pushdown for Python data sources, which the data source uses to skip parts.
Installing the package is enough for the format itself (``pyspark_mergetxn`` is found by
Spark 4's data source lookup); ``register`` adds the pushdown setting and an optional default
replica.
"""

from __future__ import annotations

from typing import Any

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: Any, replica: str | None = None) -> None:
    """Register the data source with ``spark`` (a SparkSession). With ``replica``, reads and
    writes that give no ``replica`` option use this one."""
    from spark.datasource import MergetxnDataSource

    source = MergetxnDataSource
    if replica is not None:
        source = _with_default_replica(replica)
    spark.dataSource.register(source)
    spark.conf.set(PUSHDOWN_CONF, "true")
    if replica is not None:
        from spark.native import REPLICA_CONF

        spark.conf.set(REPLICA_CONF, replica)  # read_table / write_table without replica=


def _with_default_replica(replica: str) -> type:
    from coordinator.errors import InvalidInput
    from spark.datasource import MergetxnDataSource

    if not isinstance(replica, str) or ":" not in replica:
        raise InvalidInput(f"replica must be 'host:port', not {replica!r}")

    class DefaultReplicaSource(MergetxnDataSource):
        """The data source with a default for option ``replica`` (pickled by value to workers)."""

        def __init__(self, options: dict) -> None:
            if not options.get("replica"):
                options["replica"] = replica
            super().__init__(options)

    return DefaultReplicaSource


def __getattr__(name: str) -> Any:
    if name in ("MergetxnDataSource",):
        from spark import datasource

        return getattr(datasource, name)
    if name in ("read_table", "write_table"):
        from spark import native

        return getattr(native, name)
    if name == "write_stream":
        from spark import streaming

        return streaming.write_stream
    if name in ("delete", "update"):
        from spark import mutate

        return getattr(mutate, name)
    raise AttributeError(f"module 'spark' has no attribute {name!r}")


__all__ = ["PUSHDOWN_CONF", "MergetxnDataSource", "delete", "read_table", "register", "update", "write_stream",
           "write_table"]
