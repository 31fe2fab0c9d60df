"""The fold of a point read's few versions (issue 24 item 3): a keys-table lookup folds the
versions of one key or a handful, where :func:`coordinator.core.keyfold.merge`'s fixed cost of
some twenty Arrow kernels is most of the read's client side. Up to :data:`FEW` versions whose
key columns are ints, strings, bools or binary (Python orders and compares them as Arrow does),
all parts in one layout, the order and the fold are worked out in Python on the few key, op and
version values, and the rows are taken from the versions with one ``take`` per column. Anything
else is None: the caller folds with ``keyfold.merge``. Both give identical tables
(tests/unit/test_keys_fold.py checks it against the reference fold on random histories).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.core.keytables import COLS, DELETE, LOCK_STRONG, OP, OWN, PUT, SEQ, VER, mix64_type

FEW = 64  # versions at most; beyond, the kernels' fixed cost is no longer most of the fold
_OWN_ORDER = (1 << 63) - 1  # OWN as an int64: after every CSN (as keyfold orders it)


def merge_few(
    schema: pa.Schema, primary_key: Sequence[str], parts: Iterable[tuple[float, pa.Table]]
) -> pa.Table | None:
    """What ``keyfold.merge(schema, primary_key, parts)`` gives, when the versions are few and
    plain (see the module docstring); None otherwise."""
    given = [(order, data) for order, data in parts if data.num_rows]
    if not given:
        return schema.empty_table()
    n = sum(data.num_rows for _, data in given)
    layout = given[0][1].schema
    if (
        n > FEW
        or not primary_key
        or any(not data.schema.equals(layout) for _, data in given[1:])
        or any(c not in layout.names for c in (OP, SEQ, COLS))
        or any(f.name not in layout.names or layout.field(f.name).type != f.type for f in schema)
        or not all(mix64_type(schema.field(k).type) for k in primary_key)
    ):
        return None
    data = given[0][1] if len(given) == 1 else pa.concat_tables([d for _, d in given])
    if any(data.column(k).null_count for k in primary_key):
        return None
    if n == 1:  # a lookup of a key written once since its last compaction: its one version
        op = data.column(OP)[0].as_py()
        if op == PUT:
            return pa.Table.from_arrays([data.column(c) for c in schema.names], schema=schema)
        if op == DELETE or (isinstance(op, int) and op >= LOCK_STRONG):
            return schema.empty_table()
    keys = list(zip(*(data.column(k).to_pylist() for k in primary_key)))
    ops, seqs = data.column(OP).to_pylist(), data.column(SEQ).to_pylist()
    written = data.column(COLS).to_pylist()
    places = [_OWN_ORDER if order == OWN else int(order) for order, d in given for _ in range(d.num_rows)]
    if VER in layout.names:
        places = [p if v is None else v for p, v in zip(places, data.column(VER).to_pylist())]
    rows = sorted((i for i in range(n) if ops[i] < LOCK_STRONG), key=lambda i: (keys[i], places[i], seqs[i]))
    others = [c for c in schema.names if c not in primary_key]
    sources: dict[str, list[int | None]] = {c: [] for c in schema.names}
    at = 0
    while at < len(rows):
        end = at
        while end + 1 < len(rows) and keys[rows[end + 1]] == keys[rows[at]]:
            end += 1
        last = rows[end]
        if ops[last] != DELETE:
            src: dict[str, int | None] = dict.fromkeys(others)
            for i in rows[at : end + 1]:
                if ops[i] == PUT or ops[i] == DELETE:
                    value = i if ops[i] == PUT else None
                    src = dict.fromkeys(others, value)
                else:  # UPDATE: the columns it wrote
                    for c in filter(None, (written[i] or "").split(",")):
                        if c in src:
                            src[c] = i
            for c in schema.names:
                sources[c].append(last if c in primary_key else src[c])
        at = end + 1
    return pa.Table.from_arrays(
        [pc.take(data.column(c), pa.array(sources[c], pa.int64())) for c in schema.names], schema=schema
    )
