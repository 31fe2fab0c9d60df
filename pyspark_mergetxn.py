"""Spark 4 auto-registration of the ``mergetxn`` data source (see spark/datasource.py)."""

from spark.datasource import MergetxnDataSource as DefaultSource

__all__ = ["DefaultSource"]
