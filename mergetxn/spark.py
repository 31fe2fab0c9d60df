"""Spark, from the one public import: ``mergetxn.spark.register``, ``read_table``, ``write_table``
and ``write_stream`` are ``spark.register``, ``spark.native.read_table`` /
``write_table`` and ``spark.streaming.write_stream`` (loaded on first use: pyspark is heavy)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from coordinator.core.lazy import lazy_names

if TYPE_CHECKING:
    from spark import register
    from spark.native import read_table, write_table
    from spark.streaming import write_stream

_LAZY = {
    "register": "spark",
    "read_table": "spark.native",
    "write_table": "spark.native",
    "write_stream": "spark.streaming",
}

__all__ = ["read_table", "register", "write_stream", "write_table"]


__getattr__ = lazy_names(__name__, _LAZY, globals())
