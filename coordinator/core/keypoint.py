"""The fold of a point read's few versions: a keys-table lookup folds the
versions of one key or a handful, where :func:`coordinator.core.keyfold.merge`'s fixed cost of
some twenty Arrow kernels is most of the read's client side. Up to :data:`FEW` versions whose
key columns are ints, strings, bools or binary (Python orders and compares them as Arrow does),
all parts in one layout, the order and the fold are worked out in Python on the few key, op and
version values, and the rows are taken from the versions with one ``take`` per column. Anything
else is None: the caller folds with ``keyfold.merge``. Both give identical tables
(tests/unit/test_keys_fold.py checks it against the reference fold on random histories).

A point read also reads its candidate parts newest first and stops once every key it looks up
has a PUT or DELETE later than any version the parts left can hold (:func:`top_place`,
:func:`note_settled`, :func:`settled`): the fold of a key starts over at its last PUT or DELETE,
so versions before it change nothing (tests/unit/test_keys_point.py: the fold of the parts read
equals the fold of all of them on random histories).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.core.keytables import COLS, DELETE, LOCK_STRONG, OP, OWN, PUT, SEQ, VER, mix64_type

_NEVER = float("-inf")

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
    if n > FEW or not _plain_layout(schema, primary_key, [d for _, d in given]):
        return None
    data = given[0][1] if len(given) == 1 else pa.concat_tables([d for _, d in given])
    if any(data.column(k).null_count for k in primary_key):
        return None
    if n == 1 and (single := _one_version(schema, data)) is not None:
        return single
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
            src = _row_sources(rows[at : end + 1], ops, written, others)
            for c in schema.names:
                sources[c].append(last if c in primary_key else src[c])
        at = end + 1
    return pa.Table.from_arrays(
        [pc.take(data.column(c), pa.array(sources[c], pa.int64())) for c in schema.names], schema=schema
    )


def _plain_layout(schema: pa.Schema, primary_key: Sequence[str], tables: Sequence[pa.Table]) -> bool:
    """Whether the parts share one layout that carries the log columns and the schema's columns
    as typed, under a key of plain columns: what ``merge_few`` folds."""
    layout = tables[0].schema
    return (
        bool(primary_key)
        and all(data.schema.equals(layout) for data in tables[1:])
        and all(c in layout.names for c in (OP, SEQ, COLS))
        and all(f.name in layout.names and layout.field(f.name).type == f.type for f in schema)
        and all(mix64_type(schema.field(k).type) for k in primary_key)
    )


def _one_version(schema: pa.Schema, data: pa.Table) -> pa.Table | None:
    """A key written once since its last compaction: its row when a put, nothing when a delete or
    a strong lock; None when that one version does not settle it (an update or a weak lock)."""
    op = data.column(OP)[0].as_py()
    if op == PUT:
        return pa.Table.from_arrays([data.column(c) for c in schema.names], schema=schema)
    if op == DELETE or (isinstance(op, int) and op >= LOCK_STRONG):
        return schema.empty_table()
    return None


def _row_sources(
    versions: Sequence[int], ops: Sequence[Any], written: Sequence[str | None], others: Sequence[str]
) -> dict[str, int | None]:
    """For one key's versions in order, the row each non-key column's latest value comes from
    (None: no value, after a delete or before any put)."""
    src: dict[str, int | None] = dict.fromkeys(others)
    for i in versions:
        if ops[i] == PUT or ops[i] == DELETE:
            value = i if ops[i] == PUT else None
            src = dict.fromkeys(others, value)
        else:  # UPDATE: the columns it wrote
            for c in filter(None, (written[i] or "").split(",")):
                if c in src:
                    src[c] = i
    return src


def plain_keys(schema: pa.Schema, primary_key: Sequence[str]) -> bool:
    """Key columns whose values Python compares as Arrow does (ints, strings, bools, binary):
    a key read back from a part is then found by equality among the keys looked up."""
    return bool(primary_key) and all(mix64_type(schema.field(k).type) for k in primary_key)


def top_place(order: float, stats: Mapping[str, Any]) -> float:
    """The latest place (version) any version of a part may take: its ``order`` (creation CSN;
    a transaction's own part: OWN, after every CSN) or, in a compaction's output, its highest
    ``_ver`` when that is later (from the part's statistics; statistics that do not bound it:
    OWN, so the part is never passed over)."""
    ver = stats.get(VER)
    if ver is None:  # no _ver column: each version's place is the part's order
        return order
    lo, hi = ver
    if hi is None:
        return order if lo is None else OWN  # every _ver null, or no upper bound known
    if type(hi) is int:
        return max(order, hi)
    return OWN


def note_settled(found: dict[tuple[Any, ...], float], data: pa.Table, order: float, primary_key: Sequence[str]) -> None:
    """Record in ``found`` (key -> the latest place of a PUT or DELETE of it seen) the PUTs and
    DELETEs among ``data``, one part's versions (of ``order``) of the keys looked up."""
    if not data.num_rows or OP not in data.column_names:  # no op to go by: nothing settled, all read
        return
    ops = data.column(OP).to_pylist()
    vers = data.column(VER).to_pylist() if VER in data.column_names else None
    keys = zip(*(data.column(k).to_pylist() for k in primary_key))
    for i, key in enumerate(keys):
        if ops[i] != PUT and ops[i] != DELETE:
            continue
        place = order if vers is None or vers[i] is None else vers[i]
        if place > found.get(key, _NEVER):
            found[key] = place


def settled(wanted: Iterable[tuple[Any, ...]], found: Mapping[tuple[Any, ...], float], top: float) -> bool:
    """Whether every key of ``wanted`` has a PUT or DELETE (``found``, :func:`note_settled`)
    strictly later than ``top``: then no version of a part whose :func:`top_place` is at most
    ``top`` changes what the fold gives (a tie is not passed over: ``_seq`` orders it)."""
    return all(found.get(key, _NEVER) > top for key in wanted)


def newest_first(
    orders: Sequence[float],
    stats: Sequence[Mapping[str, Any]],
    wanted: Sequence[tuple[Any, ...]],
    primary_key: Sequence[str],
    read: Callable[[int], pa.Table],
) -> list[tuple[float, pa.Table]]:
    """``(order, read(i))`` of the parts a point read of ``wanted`` needs, in the parts' order
    (so a fold of them orders ties as the fold of every part would): ``read(i)`` gives part
    ``i``'s versions of those keys; parts are read by descending :func:`top_place` (ties in
    their order) until the next one cannot change the fold (:func:`settled`). For plain key
    columns only (:func:`plain_keys`)."""
    tops = [top_place(o, s) for o, s in zip(orders, stats)]
    got: dict[int, pa.Table] = {}
    found: dict[tuple[Any, ...], float] = {}
    for i in sorted(range(len(orders)), key=tops.__getitem__, reverse=True):  # reverse keeps ties in order
        if found and settled(wanted, found, tops[i]):
            break
        got[i] = read(i)
        note_settled(found, got[i], orders[i], primary_key)
    return [(orders[i], got[i]) for i in sorted(got)]
