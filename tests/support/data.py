"""Tables to write and ways to read them back, for the modules whose tables look alike."""

from __future__ import annotations

import pyarrow as pa

from mergetxn.client import Client

ID_V = pa.schema([("id", pa.int64()), ("v", pa.string())])


def id_rows(n: int, start: int = 0, tag: str = "v") -> pa.Table:
    """``n`` rows of :data:`ID_V`: ids ``start..start+n-1``, ``v`` = ``f"{tag}{id}"``."""
    ids_ = range(start, start + n)
    return pa.table({"id": pa.array(ids_, pa.int64()), "v": [f"{tag}{i}" for i in ids_]}, schema=ID_V)


def ids(t: pa.Table) -> list[int]:
    """The ``id`` column, sorted (reads return parts in no particular order)."""
    return sorted(t.column("id").to_pylist())


def sorted_rows(t: pa.Table) -> list[tuple]:
    """Every row as a tuple in column order, sorted (reads return parts in no particular order)."""
    return sorted(tuple(r.values()) for r in t.to_pylist())


def commit_insert(client: Client, table: str, data: pa.Table) -> int:
    """One transaction inserting ``data``; its CSN."""
    with client.transaction() as tx:
        tx.insert(table, data)
    assert tx.csn is not None
    return tx.csn
