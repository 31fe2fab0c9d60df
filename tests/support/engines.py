"""A table's ``n`` column as each engine reads it from ``client.dataset``: pyarrow, DuckDB
(through ``duckdb_view``) and Polars, for tests that check every reader sees the same rows."""

from __future__ import annotations

import duckdb
import polars as pl
import pyarrow as pa

from mergetxn.client.client import Client
from parts.io.dataset import duckdb_view


def ns(t: pa.Table) -> list[int]:
    return sorted(t.column("n").to_pylist())


def engines(client: Client, table: str, snapshot: int) -> tuple[list[int], list[int], list[int]]:
    """The ``n`` of ``table`` at ``snapshot`` through a dataset, DuckDB (duckdb_view) and Polars."""
    with client.dataset(table, snapshot=snapshot) as d:
        con = duckdb.connect()
        duckdb_view(con, "t", d)
        by_duck = sorted(r[0] for r in con.execute("SELECT n FROM t").fetchall())
        by_polars = sorted(pl.scan_pyarrow_dataset(d).select("n").collect()["n"].to_list())
        by_arrow = ns(d.to_table())
    return by_arrow, by_duck, by_polars
