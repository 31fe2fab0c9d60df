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

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pyspark is imported only when a session registers the source
    from spark.datasource import MergetxnDataSource

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: Any, replica: str | None = None) -> None:
    """Register the data source with ``spark`` (a SparkSession). With ``replica``, reads and
    writes that give no ``replica`` option use this one.

    When neither ``spark.pyspark.python`` nor ``PYSPARK_PYTHON`` names the interpreter of Spark's
    Python workers, they run ``python3`` from PATH: if that one cannot import mergetxn (a virtual
    environment's interpreter runs this driver, say), the data source could only fail later in
    every task with ``ModuleNotFoundError``; this raises InvalidInput now, saying what to set."""
    from spark.datasource import MergetxnDataSource

    check_worker_python(spark)
    source = MergetxnDataSource
    if replica is not None:
        source = _with_default_replica(replica)
    spark.dataSource.register(source)
    spark.conf.set(PUSHDOWN_CONF, "true")
    if replica is not None:
        from spark.native import REPLICA_CONF

        spark.conf.set(REPLICA_CONF, replica)  # read_table / write_table without replica=


def check_worker_python(spark: Any) -> None:
    """Refuse a session whose Python workers would run an interpreter without mergetxn (only when
    the session leaves the choice to PATH: an interpreter named on purpose may live on other hosts)."""
    import os
    import shutil
    import subprocess
    import sys

    from coordinator.core.errors import InvalidInput

    try:
        named = spark.conf.get("spark.pyspark.python", None)
    except Exception:  # noqa: BLE001 - a Spark Connect session or an odd conf: nothing to check here
        return
    if named or os.environ.get("PYSPARK_PYTHON"):
        return
    found = shutil.which("python3")
    if found is None:
        raise InvalidInput(
            "Spark's Python workers run `python3` from PATH and there is none; set PYSPARK_PYTHON="
            f"{sys.executable} (or spark.pyspark.python) before creating the SparkSession"
        )
    if os.path.realpath(found) == os.path.realpath(sys.executable):
        return
    try:
        probe = subprocess.run(
            [found, "-c", "import mergetxn.client.client, spark.datasource"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return  # cannot tell: let Spark say
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or [f"it exited with status {probe.returncode}"])[-1][:200]
        raise InvalidInput(
            f"Spark's Python workers would run {found} (python3 from PATH), which cannot import "
            f"mergetxn ({why}); set PYSPARK_PYTHON={sys.executable} (or "
            f".config('spark.pyspark.python', {sys.executable!r})) before creating the SparkSession"
        )


def _with_default_replica(replica: str) -> type[MergetxnDataSource]:
    from coordinator.core.errors import InvalidInput
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


__all__ = [
    "PUSHDOWN_CONF",
    "MergetxnDataSource",
    "delete",
    "read_table",
    "register",
    "update",
    "write_stream",
    "write_table",
]
