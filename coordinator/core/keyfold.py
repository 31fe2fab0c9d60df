"""The fold of a keys table's versions in columnar form (the rules: coordinator/core/keytables.py).

Every read, compaction and ``changes`` of a keys table folds versions per key. Doing it row by
row in Python cost 66x a ``parts`` table's read, so here it is a handful of Arrow kernels over
whole columns, with no per-row Python:

1. the versions of every part are put in one table, read locks left out, and sorted (stably) by
   key, then version (``_ver``, else the part's order), then ``_seq``;
2. the sorted rows are cut into *segments*: a key's versions for a read, a *run* of them (no
   version of another part between) for a compaction;
3. the row a segment gives after any of its versions is read off by index arithmetic: for a
   column, the value of the last row up to there in the segment that sets it (a PUT sets every
   column, an UPDATE the columns in its ``_cols``, a DELETE sets every non-key column to null),
   found with a running maximum of "row index where the column is set", kept only when it lies
   inside the segment. A read takes each key's row after its last version, a compaction each
   run's, ``changes`` each key's row before and after each commit, all in one pass.

A read has shorter roads, all decided from the versions themselves:
parts whose keys each rise strictly (every part is written sorted by key) and whose key ranges
do not meet, all of them PUTs (a table after a major compaction), are their rows, put in key
order, with no sort and no gather; and when every part's keys rise strictly, the parts have
distinct orders and none has ``_ver``, the versions put one part after the other in CSN order
are in version order per key, so a stable sort by key alone leaves them in order (not checked)
and, for one integer key column whose values are dense enough, each key's last version is found
with no sort at all, by writing each row's index into its key's slot (:func:`_last_by_slot`). A
reader may leave out the columns a part's statistics prove constant (:func:`read_plan`).

Each step is a fixed number of kernels per column, whatever the number of versions; on a few
versions (a point read) the fixed cost is some hundred microseconds.

The row-by-row fold it replaces is kept in tests/support/keys_reference.py, and
tests/unit/test_keys_fold.py checks on random histories that both give identical tables.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from coordinator.core.keytables import (
    COLS,
    DELETE,
    LOCK_STRONG,
    OP,
    OWN,
    PUT,
    SEQ,
    UPDATE,
    VER,
    changes_schema,
    folded_schema,
)

_V = "_v"  # a version's place: its _ver, else its part's order (a transaction's own: last)
_TAG = "_tag"  # in a compaction: 0 a version of a source, 1 one of another part
_OWN_ORDER = (1 << 63) - 1  # OWN as an int64: after every CSN
_MASK_BITS = 62  # non-key columns per int64 mask when a run's written columns are spelled out


def merge(schema: pa.Schema, primary_key: Sequence[str], parts: Iterable[tuple[float, pa.Table]]) -> pa.Table:
    """One row per key from versions: ``parts`` are ``(order, rows in the part layout)``, the
    order a committed part's creation CSN (or :data:`~coordinator.core.keytables.OWN`). Per key the
    versions apply in (version, ``_seq``) order, a row's version its ``_ver`` (compaction
    output) or else its part's order: PUT replaces the row, UPDATE sets the columns it wrote on
    the row so far (on none: the others null), DELETE removes it. Rows come sorted by key."""
    parts = _in_csn_order(list(parts))
    live = [(o, t) for o, t in parts if t.num_rows]
    rising = len(primary_key) == 1 and all(_rising([t.column(primary_key[0]) for _, t in live]))
    if rising and live:
        passed = _passed_through(schema, primary_key[0], live)
        if passed is not None:
            return passed
    data = _versions(schema, parts)
    if data.num_rows == 0:
        return schema.empty_table()
    op = data.column(OP)
    op_lo, op_hi = (v.as_py() for v in pc.min_max(op).values())
    if op_lo > UPDATE or op_hi < UPDATE or not pc.any(pc.equal(op, UPDATE)).as_py():
        # PUTs and DELETEs only (upserts, the usual history): a key is its last version, or gone.
        # Only the key, version and _seq columns are put in order; the other columns are taken
        # once, at the rows kept (a read's cost is then about one sort of the keys). Each part
        # holding a key once, in distinct orders and without _ver: the stable key sort leaves
        # versions in order (parts are in CSN order), so that is not checked, and a dense
        # integer key needs no sort: each key's last row is the last written to its slot.
        ordered = (
            rising
            and len({o for o, _ in live}) == len(live)
            and not any(VER in t.column_names and t.column(VER).null_count < t.num_rows for _, t in live)
        )
        rows = _last_by_slot(data.column(primary_key[0])) if ordered else None
        if rows is not None:
            # Each key's last version found without a sort: its row, the keys taken from it.
            if op_hi >= DELETE and pc.any(pc.equal(op, DELETE)).as_py():
                rows = pc.filter(rows, pc.not_equal(_take(op, rows), DELETE))
            return pa.Table.from_arrays([_take(data.column(c), rows) for c in schema.names], schema=schema)
        order, starts, keys = _version_order(data, primary_key, ordered)
        at = pc.indices_nonzero(_shifted(starts, True, forward=False))  # each key's last, sorted
        if op_hi >= DELETE and pc.any(pc.equal(op, DELETE)).as_py():
            at = pc.filter(at, pc.not_equal(_take(op, pc.take(order, at)), DELETE))
        rows = pc.take(order, at)
        return pa.Table.from_arrays(
            [
                pc.take(keys.column(c), at) if c in keys.column_names else _take(data.column(c), rows)
                for c in schema.names
            ],
            schema=schema,
        )
    order, starts, _ = _version_order(data, primary_key)
    fold = _Fold(data.take(order).combine_chunks(), starts, schema.names, primary_key)
    state = fold.at(fold.lasts)
    return state.rows(schema).filter(state.exists())


def over_live(
    schema: pa.Schema,
    primary_key: Sequence[str],
    data: pa.Table,
    keep: np.ndarray,
    order: pa.Array,
    own: Sequence[pa.Table],
) -> pa.Table:
    """The rows of ``data`` that ``keep`` marks, at ``order`` (one row per key, in key order, in
    ``schema``: a snapshot's live rows read by deletion vectors, :func:`live_key_order`) with a transaction's
    own versions ``own`` (each in the part layout) applied on top: what :func:`merge` of every
    version gives, the fold run over the keys ``own`` touches alone (each one's live row a PUT
    before its own versions). The other rows are copied once: the result is one gather of
    ``data`` and the folded rows, put in key order by where the folded keys fall among the
    others (a binary search for one numeric key column, else a sort of the keys); the touched
    rows are picked by a filter (a take from the parts' many chunks would join them first).
    Rows come sorted by key."""
    own = [t for t in own if t.num_rows]
    if not own:
        return data.take(order)
    pk = list(primary_key)
    at = np.asarray(order, dtype=np.int64)
    theirs = pa.table({k: pa.chunked_array([t.column(k).cast(data.schema.field(k).type) for t in own]) for k in pk})
    hit = _touching(_compared(data.select(pk)), _compared(theirs))  # over every row, dead ones too
    before = data.filter(pa.array(hit & keep))
    n = before.num_rows
    puts = before.append_column(OP, pa.array(np.full(n, PUT, np.int8)))
    folded = merge(
        schema, pk, [(0, puts.append_column(SEQ, pa.array(np.zeros(n, np.int64)))), *((OWN, t) for t in own)]
    )
    folded = folded if folded.schema.equals(data.schema) else folded.select(data.column_names).cast(data.schema)
    rest = at[~hit[at]]
    new = np.arange(data.num_rows, data.num_rows + folded.num_rows, dtype=np.int64)
    points = _insertion_points(data.column(pk[0]), rest, folded.column(pk[0])) if len(pk) == 1 else None
    if points is not None:
        rows = np.insert(rest, points, new)
    else:
        both = pa.concat_tables([data.select(pk).take(pa.array(rest)), folded.select(pk)])
        rows = np.concatenate([rest, new])[np.asarray(_key_order(both, pk))]
    return pa.concat_tables([data, folded]).take(pa.array(rows))


def _insertion_points(keys: pa.ChunkedArray, rest: np.ndarray, among: pa.ChunkedArray | pa.Array) -> np.ndarray | None:
    """Where each of ``among`` (sorted keys) falls among ``keys`` at ``rest`` (rows whose keys
    ascend, none equal to one of them), by binary search: integer or float keys; else None."""
    if not (pa.types.is_integer(keys.type) or keys.type in (pa.float32(), pa.float64())):
        return None
    values, wanted = keys.to_numpy(), among.to_numpy()
    if len(wanted) <= _BISECT_MAX:  # a few: bisect ``rest`` through ``values``, gathering none
        return np.array([bisect.bisect_left(rest, v, key=values.__getitem__) for v in wanted], np.int64)
    return np.asarray(np.searchsorted(values[rest], wanted), dtype=np.int64)


_BISECT_MAX = 512  # folded keys placed by Python's bisect (20 steps each for a million rows)


def _compared(keys: pa.Table) -> pa.Table:
    """Key columns as the fold compares them (equal values are one key): a float column's -0.0
    as 0.0 (adding 0.0 turns one into the other), which hashing would tell apart."""
    return pa.table(
        {
            name: pc.add(col, pa.scalar(0.0, col.type)) if col.type in (pa.float32(), pa.float64()) else col
            for name, col in zip(keys.column_names, keys.columns)
        }
    )


def _touching(live_keys: pa.Table, keys: pa.Table) -> np.ndarray:
    """One bool per row of ``live_keys`` (distinct keys): whether its key is among ``keys``'."""
    if live_keys.num_columns == 1:
        found = pc.is_in(live_keys.column(0), value_set=keys.column(0).combine_chunks())
        return np.asarray(found, dtype=bool)
    rows = live_keys.append_column("_row", pa.array(np.arange(live_keys.num_rows, dtype=np.int64)))
    hit = rows.join(keys.group_by(keys.column_names).aggregate([]), keys.column_names, join_type="left semi")
    out = np.zeros(live_keys.num_rows, bool)
    out[hit.column("_row").to_numpy()] = True
    return out


def version_rows(data: pa.Table, order: int, primary_key: Sequence[str]) -> pa.Table:
    """The versions of a committed part (``order``: its creation CSN) as a table of its key
    columns, ``_ver`` and ``_seq``, read locks left out: what :func:`fold` takes as ``others``.
    ``data`` needs the key columns, ``_op``, ``_seq`` and, for a compaction's output, ``_ver``."""
    ver = data.column(VER) if VER in data.column_names else pa.nulls(data.num_rows, pa.int64())
    out = pa.Table.from_arrays(
        [
            *(data.column(k) for k in primary_key),
            pc.coalesce(ver.cast(pa.int64()), pa.scalar(order, pa.int64())),
            data.column(SEQ).cast(pa.int64()),
        ],
        names=[*primary_key, VER, SEQ],
    )
    return out.filter(_not_lock(data.column(OP)))


def fold(
    schema: pa.Schema, primary_key: Sequence[str], sources: Iterable[tuple[int, pa.Table]], others: pa.Table | None
) -> pa.Table:
    """A compaction's output (:func:`~coordinator.core.keytables.folded_schema`, sorted by key then
    version) from the versions of its ``sources`` (``(creation CSN, rows)`` of committed parts)
    given ``others``: the versions (:func:`version_rows`) of every other part a read may combine
    with the output (the parts visible beside the sources; later ones sort after them all and
    need not be given).

    Per key, the sources' versions between two versions of ``others`` form a run, folded to one
    version placed where the run's last one was (its ``_ver`` and ``_seq``): a PUT or DELETE
    absorbs what precedes it in the run, later UPDATEs apply onto it (a DELETE followed by
    UPDATEs becomes a PUT with the other columns null, as a read folds them); a run of UPDATEs
    stays one UPDATE of the union of their columns. A run that ends deleted and has no version of
    ``others`` before it is dropped: no older version is left for it to hide. Read locks go."""
    out_schema = folded_schema(schema, primary_key)
    data = _versions(schema, list(sources))
    if data.num_rows == 0:
        return out_schema.empty_table()
    data = data.append_column(_TAG, pa.repeat(pa.scalar(0, pa.int8()), data.num_rows))
    if others is not None and others.num_rows:
        n = others.num_rows
        extra = {
            **{k: others.column(k).cast(schema.field(k).type) for k in primary_key},
            _V: others.column(VER).cast(pa.int64()),
            SEQ: others.column(SEQ).cast(pa.int64()),
            _TAG: pa.repeat(pa.scalar(1, pa.int8()), n),
        }
        cols = [extra[f.name] if f.name in extra else pa.nulls(n, f.type) for f in data.schema]
        data = pa.concat_tables([data, pa.Table.from_arrays(cols, schema=data.schema)])
    data = _sorted(data, primary_key, tagged=True)
    # Per row, the versions of others before it in its key: a run that ends deleted with none
    # before it is dropped. Others sort after a source version they tie with (bisect_left).
    other = pc.equal(data.column(_TAG), 1).combine_chunks()
    count = pc.cumulative_sum(other.cast(pa.int64()))
    key_start = _key_starts(data, primary_key)
    key_first = pc.cumulative_max(pc.if_else(key_start, _arange(data.num_rows), 0))
    older = pc.subtract(count, pc.subtract(pc.take(count, key_first), pc.take(other, key_first).cast(pa.int64())))
    run_start = pc.or_(key_start, _shifted(other))
    mine = pc.invert(other)
    data, run_start, older = data.filter(mine), pc.filter(run_start, mine), pc.filter(older, mine)
    runs = _Fold(data, run_start, schema.names, primary_key)
    last = runs.lasts
    state = runs.at(last)
    op = state.folded_op()
    keep = pc.invert(pc.and_(pc.equal(op, DELETE), pc.equal(pc.take(older, last), 0)))
    cols = pc.if_else(pc.equal(op, UPDATE), state.written_text(), pa.scalar(None, pa.string()))
    arrays = [
        *state.rows(schema).columns,
        op.cast(pa.int8()),
        pc.take(data.column(SEQ), last),
        cols,
        pc.take(data.column(_V), last),
    ]
    return pa.Table.from_arrays(arrays, schema=out_schema).filter(keep)


def _as_puts(before: pa.Table, names: Sequence[str]) -> pa.Table:
    """``before``'s rows (its ``names`` columns) as a version table of PUTs, sequence 0 and no
    column list, to fold ahead of every commit's versions."""
    n = before.num_rows
    return pa.Table.from_arrays(
        [
            *before.select(names).columns,
            pa.repeat(pa.scalar(PUT, pa.int8()), n),
            pa.repeat(pa.scalar(0, pa.int64()), n),
            pa.nulls(n, pa.string()),
        ],
        names=[*names, OP, SEQ, COLS],
    )


def row_changes(
    schema: pa.Schema, primary_key: Sequence[str], before: pa.Table, commits: Iterable[tuple[int, Sequence[pa.Table]]]
) -> pa.Table:
    """The row changes of a keys table, one commit after the other: for each key a commit wrote
    whose row it changed, a ``delete`` of the row it had (if any) and an ``insert`` of the row
    it has after (if any), deletes first, keys sorted, with ``_csn``. ``before``: the rows (at
    least those of the keys written) at the snapshot before the first commit; ``commits``:
    ``(csn, version tables)`` in CSN order. A rewrite of a row to the same values, a read lock
    and a delete of a missing key change nothing and show nothing, so what the rows of
    ``changes`` add up to is always what a read at the end returns.

    One fold of ``before`` (as PUTs ordered first) and every commit's versions: a commit's
    versions of a key are a stretch of that key's sorted versions, the row before is the fold up
    to the row preceding the stretch, the row after the fold up to its last. A column is unchanged
    when both come from the same version (as the same Python object compared equal) or are equal
    (nulls equal)."""
    out_schema = changes_schema(schema)
    names = schema.names
    base = _as_puts(before, names)
    data = _versions(schema, [(-1, base), *((csn, t) for csn, parts in commits for t in parts)])
    if data.num_rows == 0:
        return out_schema.empty_table()
    data = _sorted(data, primary_key)
    key_start = _key_starts(data, primary_key)
    fold = _Fold(data, key_start, names, primary_key)
    ver = data.column(_V).combine_chunks()
    stretch_start = pc.or_(key_start, pc.not_equal(ver, _shifted(ver, -1)))
    last = pc.indices_nonzero(_shifted(stretch_start, True, forward=False)).cast(pa.int64())
    first = pc.take(pc.cumulative_max(pc.if_else(stretch_start, fold.idx, 0)), last)
    csn = pc.take(ver, last)
    committed = pc.not_equal(csn, -1)
    last, first, csn = pc.filter(last, committed), pc.filter(first, committed), pc.filter(csn, committed)
    had_row = pc.invert(pc.take(key_start, first))
    was = fold.at(pc.max_element_wise(pc.subtract(first, 1), 0))
    now = fold.at(last)
    had = pc.and_(had_row, was.exists())
    has = now.exists()
    same = pc.and_(had, has)
    for c in names:
        from_same = pc.fill_null(pc.equal(was.source(c), now.source(c)), False)
        old, new = was.value(c), now.value(c)
        equal = pc.or_(pc.fill_null(pc.equal(old, new), False), pc.and_(pc.is_null(old), pc.is_null(new)))
        same = pc.and_(same, pc.or_(from_same, equal))
    changed = pc.invert(same)
    pieces: list[pa.Table] = []
    for state, kind, shown in ((was, "delete", pc.and_(changed, had)), (now, "insert", pc.and_(changed, has))):
        rows = state.rows(schema)
        m = rows.num_rows
        rows = rows.append_column(out_schema.field("_change"), pa.repeat(pa.scalar(kind), m))
        rows = rows.append_column(out_schema.field("_csn"), csn)
        pieces.append(rows.append_column("_rank", pa.repeat(pa.scalar(len(pieces), pa.int8()), m)).filter(shown))
    out = pa.concat_tables(pieces)
    out = out.take(pc.sort_indices(out, sort_keys=[("_csn", "ascending"), ("_rank", "ascending")]))
    return out.drop_columns(["_rank"]).combine_chunks()


# -- a whole read's shorter roads ------------------------------------------------------------------
def strictly_increasing(col: pa.Array | pa.ChunkedArray) -> bool:
    """Whether each value of a key column is greater than the one before: each key occurs once,
    in key order. A comparison that is not plainly true (NaN; 0.0 after -0.0, one key) says no."""
    n = len(col)
    if n < 2:
        return True
    return bool(pc.all(pc.fill_null(pc.greater(col.slice(1), col.slice(0, n - 1)), False)).as_py())


def _passed_through(schema: pa.Schema, column: str, parts: list[tuple[float, pa.Table]]) -> pa.Table | None:
    """The rows of ``parts`` (each non-empty, its keys rising strictly, one key column) when
    every version is a PUT and their key ranges do not meet: each key then has one version, and
    its row is it. The parts put in key order; no sort, no gather. None otherwise."""
    key_type = schema.field(column).type
    firsts, lasts = _ends(key_type, [t.column(column) for _, t in parts])
    by_key = pc.sort_indices(firsts)  # the order a sort of the keys gives (Arrow's, not Python's)
    firsts, lasts = pc.take(firsts, by_key), pc.take(lasts, by_key)
    n = len(parts)
    if n > 1 and not pc.all(pc.fill_null(pc.less(lasts.slice(0, n - 1), firsts.slice(1)), False)).as_py():
        return None
    ops = _joined([t.column(OP) for _, t in parts])  # one kernel call, not one a part
    for op in [ops] if ops is not None else [t.column(OP) for _, t in parts]:
        lo, hi = pc.min_max(op).values()
        if lo.as_py() != PUT or hi.as_py() != PUT:
            return None
    data = _versions(schema, [parts[i] for i in by_key.to_pylist()])
    return pa.Table.from_arrays([data.column(c) for c in schema.names], schema=schema)


def _ends(key_type: pa.DataType, cols: Sequence[pa.ChunkedArray | pa.Array]) -> tuple[pa.Array, pa.Array]:
    """The first and the last value of each column (each non-empty), as ``key_type``: taken at
    once from the columns one after the other (one slice a part cost 1-2 ms over 120 parts)
    when they are of that type, else part by part."""
    whole = _joined(cols)
    if whole is not None and whole.type == key_type:
        ends = list(itertools.accumulate(len(c) for c in cols))
        at = pa.array([0, *ends[:-1], *(e - 1 for e in ends)], pa.int64())
        got = pc.take(whole, at).combine_chunks()
        return got.slice(0, len(cols)), got.slice(len(cols))

    def end(col: pa.ChunkedArray | pa.Array, at: int) -> pa.Array:
        got = col.slice(at, 1)
        got = got.combine_chunks() if isinstance(got, pa.ChunkedArray) else got
        return got if got.type == key_type else got.cast(key_type)

    return pa.concat_arrays([end(c, 0) for c in cols]), pa.concat_arrays([end(c, len(c) - 1) for c in cols])


@dataclass(frozen=True)
class ReadPlan:
    """What of a part a whole read decodes (:func:`read_plan`): ``columns`` (None: all of them);
    ``if_repeated``: the columns that order a key's versions, decoded only when a key occurs
    twice in the part (each key once: :func:`completed` fills them); ``put_only``: every
    version is a PUT, ``_op`` is not read."""

    columns: tuple[str, ...] | None
    if_repeated: tuple[str, ...]
    put_only: bool


def read_plan(
    schema: pa.Schema,
    primary_key: Sequence[str],
    stats: Mapping[str, Any] | None,
    shared_order: bool,
    alone: bool,
    values: Sequence[str] | None = None,
) -> ReadPlan:
    """Which columns of a part a whole read must decode, from the part's column statistics
    (``[min, max]`` per column, written with it; no ``_op`` statistics: nothing is proved, all
    are read). ``_op`` all PUT: not read. No UPDATE among the ops: ``_cols`` not read (an
    UPDATE-free part's is null). The version columns (``_ver``, ``_seq``) only order the
    versions of one key: a part whose key range meets no other part's (``alone``) needs them
    only when a key occurs twice in it; else ``_ver`` is read when the part has it, and
    ``_seq``, which orders versions of one key that have one version (part order or
    ``_ver``), when the part has ``_ver`` or another version of the read may have its order
    (``shared_order``: :func:`shared_orders`), else only when a key occurs twice in it. With
    more than one key column, both always. ``values``: the non-key columns the reader keeps
    (None: all)."""
    ops = _int_range(stats, OP)
    if stats is None or ops is None:
        return ReadPlan(None, (), False)
    keep = [c for c in schema.names if values is None or c in primary_key or c in values]
    put_only = ops == (PUT, PUT)
    columns = [*keep, *(() if put_only else (OP,)), *((COLS,) if ops[0] <= UPDATE <= ops[1] else ())]
    ordering = [VER, SEQ] if VER in stats else [SEQ]
    if len(primary_key) != 1 or (not alone and (VER in stats or shared_order)):
        return ReadPlan((*columns, *ordering), (), put_only)
    if alone:
        return ReadPlan(tuple(columns), tuple(ordering), put_only)
    return ReadPlan(tuple(columns), (SEQ,), put_only)


def also_read(plan: ReadPlan, keys: pa.Table, primary_key: Sequence[str]) -> tuple[str, ...]:
    """The columns ``plan`` holds back that a part must decode after all, given its key columns
    as read (``keys``): those ordering versions, when a key occurs twice in it."""
    if not plan.if_repeated or strictly_increasing(keys.column(primary_key[0])):
        return ()
    return plan.if_repeated


def repeating(plans: Sequence[ReadPlan], keys: Sequence[pa.ChunkedArray | pa.Array | None]) -> list[int]:
    """Of parts read by ``plans`` without the columns held back (``keys``: each part's first key
    column as read, None for a part read otherwise), the ones in which a key occurs twice and
    that must decode them after all: what :func:`also_read` tells part by part, told for all of
    them by one comparison over their keys one after the other (120 parts one by one: ~4 ms of
    CPU)."""
    held = [(i, k) for i, (p, k) in enumerate(zip(plans, keys)) if p.if_repeated and k is not None]
    rising = _rising([k for _, k in held])
    return [i for (i, _), ok in zip(held, rising) if not ok]


def shared_orders(orders: Sequence[float], stats: Sequence[Mapping[str, Any] | None]) -> list[bool]:
    """Per part of a read (its order and column statistics), whether a version of another part
    may have its order: another part has the same order, or a compaction output's ``_ver``
    range (unknown: any) holds it. Such a part's ``_seq`` is read (:func:`read_plan`)."""
    count: dict[float, int] = {}
    for o in orders:
        count[o] = count.get(o, 0) + 1
    spans = []
    for s in stats:
        if s is None or OP not in s:
            spans.append((float("-inf"), float("inf")))  # nothing recorded: it may hold anything
        elif VER in s:
            r = _int_range(s, VER)
            spans.append((float("-inf"), float("inf")) if r is None else r)
    return [count[o] > 1 or any(lo <= o <= hi for lo, hi in spans) for o in orders]


def alone(column: str, stats: Sequence[Mapping[str, Any] | None]) -> list[bool]:
    """Per part of a read, whether its range of key ``column`` (its statistics, integers only:
    Python orders them as Arrow does) meets no other part's: its versions are then the only
    ones of its keys. A part without such statistics is never alone, and meets every other."""
    spans = [_int_range(s, column) for s in stats]
    out = [False] * len(spans)
    known = sorted((r[0], r[1], i) for i, r in enumerate(spans) if r is not None)
    if len(known) < len(spans):
        return out
    reach = None  # the highest key of the parts before (in order of their lowest)
    for j, (lo, hi, i) in enumerate(known):
        out[i] = (reach is None or reach < lo) and (j == len(known) - 1 or hi < known[j + 1][0])
        reach = hi if reach is None else max(reach, hi)
    return out


def _int_range(stats: Mapping[str, Any] | None, name: str) -> tuple[int, int] | None:
    """``stats[name]`` when it is ``[min, max]`` of integers (bools are not), else None."""
    r = stats.get(name) if isinstance(stats, Mapping) else None
    if isinstance(r, (tuple, list)) and len(r) == 2 and type(r[0]) is int and type(r[1]) is int:
        return r[0], r[1]
    return None


def completed(plan: ReadPlan, data: pa.Table) -> pa.Table:
    """A part's versions read by ``plan``, completed to what :func:`merge` takes: ``_op`` PUT
    when it was not read, ``_seq`` 0 when it was not (it orders nothing there: :func:`read_plan`;
    without ``_ver`` a version's is its part's order). A column left out otherwise (``_cols``, a
    value column) :func:`merge` reads as null."""
    n = data.num_rows
    if plan.put_only and OP not in data.column_names:
        data = data.append_column(pa.field(OP, pa.int8()), _constant(PUT, pa.int8(), n))
    if SEQ not in data.column_names:
        data = data.append_column(pa.field(SEQ, pa.int64()), _constant(0, pa.int64(), n))
    return data


def laid_out(layout: pa.Schema, plan: ReadPlan, data: pa.Table) -> pa.Table:
    """A part's versions decoded by ``plan`` in ``layout`` (``keytables.file_schema``: what a
    read of every column gives, ``_ver`` after it when it was read), as a point read's few-version
    fold takes them from every part alike: :func:`completed`, then each column not read null (a
    value column the reader does not keep, an UPDATE-free part's ``_cols``). A column read with
    another type than ``layout``'s (a part of another definition) leaves ``data`` as
    :func:`completed` gives it."""
    data = completed(plan, data)
    if plan.columns is None:
        return data
    n, have = data.num_rows, data.schema
    fields = [*layout, *((have.field(VER),) if VER in have.names else ())]
    if any(f.name in have.names and have.field(f.name).type != f.type for f in fields):
        return data
    cols = [data.column(f.name) if f.name in have.names else pa.nulls(n, f.type) for f in fields]
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


def _joined(cols: Sequence[pa.Array | pa.ChunkedArray]) -> pa.ChunkedArray | None:
    """The columns one after the other (no copy), or None when their types differ."""
    chunks = [ch for c in cols for ch in (c.chunks if isinstance(c, pa.ChunkedArray) else [c])]
    if not chunks or any(ch.type != chunks[0].type for ch in chunks):
        return None
    return pa.chunked_array(chunks, chunks[0].type)


def _rising(cols: Sequence[pa.Array | pa.ChunkedArray]) -> list[bool]:
    """Per column (a part's key column), whether its values rise strictly (each key once), told
    by one comparison over all of them one after the other, where every place it fails must be
    where a part starts (120 parts checked one by one cost 10 ms); part by part when that does
    not tell (many fail)."""
    whole = _joined(cols)
    if whole is None or len(cols) < 2:
        return [strictly_increasing(c) for c in cols]
    n = len(whole)
    if n < 2:
        return [True] * len(cols)
    holds = pc.greater(whole.slice(1), whole.slice(0, n - 1))
    fails = pc.indices_nonzero(pc.invert(pc.fill_null(holds, False)))
    if len(fails) > 2 * len(cols):
        return [strictly_increasing(c) for c in cols]
    starts = list(itertools.accumulate((len(c) for c in cols[:-1]), initial=0))
    begun = set(starts)
    out = [True] * len(cols)
    for at in fails.to_pylist():
        row = at + 1  # the row not above the one before it
        if row not in begun:
            out[bisect.bisect_right(starts, row) - 1] = False
    return out


# -- the machinery -----------------------------------------------------------------------------
def _arange(n: int) -> pa.Array:
    return pc.subtract(pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), n)), 1)


def _constant(value: int, type_: pa.DataType, n: int) -> pa.Array:
    """``n`` times the integer ``value`` (of fixed-width ``type_``): a zeroed buffer, plus
    ``value`` when it is not 0. ``pa.repeat`` costs some ten times more (30-60 us for 10,000
    values), paid per part of a read."""
    zeros = pa.Array.from_buffers(type_, n, [None, pa.py_buffer(bytes(n * type_.byte_width))])
    return zeros if value == 0 else pc.add(zeros, pa.scalar(value, type_))


def _shifted(a: pa.Array, fill: object = False, forward: bool = True) -> pa.Array:
    """``a`` moved one row on (each row sees the one before; the first ``fill``), or, with
    ``forward=False``, one row back (each sees the one after; the last ``fill``)."""
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    pad = pa.array([fill], a.type)
    return pa.concat_arrays([pad, a.slice(0, len(a) - 1)] if forward else [a.slice(1), pad])


def _not_lock(op: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Whether each ``_op`` is a version: PUT, UPDATE and DELETE are 0-2, the read locks 3-4."""
    return pc.less(op, LOCK_STRONG)


def _versions(schema: pa.Schema, parts: list[tuple[float, pa.Table]]) -> pa.Table:
    """The versions of ``parts`` in one table (the table's columns as declared but nullable,
    ``_op``, ``_seq``, ``_cols`` and ``_v``), read locks left out, in input order."""
    layout = pa.schema(
        [f.with_nullable(True) for f in schema]
        + [pa.field(OP, pa.int8()), pa.field(SEQ, pa.int64()), pa.field(COLS, pa.string()), pa.field(_V, pa.int64())]
    )
    wanted = [f.name for f in layout if f.name != _V]
    data = _versions_alike(wanted, parts)
    pieces = [] if data is not None else _versions_pieces(wanted, parts)
    if data is None and not pieces:
        return layout.empty_table()
    if data is None:
        first = pieces[0].schema
        same = all(p.schema.equals(first) for p in pieces)
        data = pa.concat_tables(pieces, promote_options="none" if same else "permissive")
    if not data.schema.equals(layout):
        have = set(data.schema.names)
        data = pa.Table.from_arrays(
            [
                pa.nulls(data.num_rows, f.type)
                if f.name not in have
                else data.column(f.name)
                if data.schema.field(f.name).type == f.type
                else data.column(f.name).cast(f.type)
                for f in layout
            ],
            schema=layout,
        )
    op = data.column(OP)
    if data.num_rows and pc.max(op).as_py() >= LOCK_STRONG:
        return data.filter(_not_lock(op))
    return data  # no read lock: no filter, which would copy every column


def _order_of(order: float) -> int:
    return _OWN_ORDER if order == OWN else int(order)


def _versions_alike(wanted: Sequence[str], parts: list[tuple[float, pa.Table]]) -> pa.Table | None:
    """What :func:`_versions` puts together, before its layout, when the parts (the non-empty
    ones) have one schema and no ``_ver``: built column by column from their chunks, each
    version's ``_v`` its part's order decoded from one run per part (120 parts one table at a
    time: ~3 ms). None for other parts, or none."""
    live = [(o, t) for o, t in parts if t.num_rows]
    if not live or VER in live[0][1].column_names:
        return None
    first = live[0][1].schema
    if not all(t.schema.equals(first) for _, t in live[1:]):
        return None
    names = [c for c in wanted if c in set(first.names)]
    ends = pa.array(list(itertools.accumulate(t.num_rows for _, t in live)), pa.int64())
    orders = pa.array([_order_of(o) for o, _ in live], pa.int64())
    cols = [pa.chunked_array([ch for _, t in live for ch in t.column(c).chunks], first.field(c).type) for c in names]
    ver = pc.run_end_decode(pa.RunEndEncodedArray.from_arrays(ends, orders))
    return pa.Table.from_arrays([*cols, ver], schema=pa.schema([*(first.field(c) for c in names), (_V, pa.int64())]))


def _versions_pieces(wanted: Sequence[str], parts: list[tuple[float, pa.Table]]) -> list[pa.Table]:
    """Each non-empty part's versions with its ``_v``, for :func:`_versions` to concatenate."""
    pieces = []
    for order, data in parts:
        n = data.num_rows
        if n == 0:
            continue
        have = data.schema.names
        at = pa.scalar(_order_of(order), pa.int64())
        ver = (
            pc.coalesce(data.column(VER).cast(pa.int64()), at) if VER in have else _constant(at.as_py(), pa.int64(), n)
        )
        present = set(have)
        names = [c for c in wanted if c in present]
        pieces.append((data if names == have else data.select(names)).append_column(_V, ver))
    return pieces


def _in_csn_order(parts: list[tuple[float, pa.Table]]) -> list[tuple[float, pa.Table]]:
    """``parts`` in the order of their versions when each part's versions are its order (no
    ``_ver``): a stable sort by key then leaves every key's versions in order, where parts in
    any other order (a replica lists them by name) make the fold sort by version too. With a
    ``_ver`` (a compaction's output) the parts stay as given: a part's place then decides ties
    of (version, ``_seq``) with other parts, and the fold sorts fully if it must."""
    if any(VER in t.column_names and t.column(VER).null_count < t.num_rows for _, t in parts):
        return parts
    return sorted(parts, key=lambda p: p[0])


def _sorted(data: pa.Table, primary_key: Sequence[str], tagged: bool = False) -> pa.Table:
    """``data`` stably sorted by key, version, ``_seq`` (and, in a compaction, sources first)."""
    if not tagged:
        return data.take(_version_order(data, primary_key)[0]).combine_chunks()
    keyed = [(k, "ascending") for k in primary_key]
    by = keyed + [(_V, "ascending"), (SEQ, "ascending"), (_TAG, "ascending")]
    return data.take(pc.sort_indices(data.combine_chunks(), sort_keys=by)).combine_chunks()


def _version_order(
    data: pa.Table, primary_key: Sequence[str], ordered: bool = False
) -> tuple[pa.Array, pa.Array, pa.Table]:
    """The indices that put ``data`` in (key, version, ``_seq``) order, stably; in that order,
    True where a key starts (:func:`_key_starts`); and the key columns in that order. Parts are
    written sorted by key, version, ``_seq`` and given in CSN order (as a read's are), so a
    stable sort by key alone almost always leaves each key's versions in order: it is checked
    (unless the caller proved it: ``ordered``), and only if not are the rows sorted by all three."""
    # One array per column: a take from 100 chunks costs several times a copy and a take.
    keys = data.select(list(primary_key)).combine_chunks()
    order = _key_order(keys, primary_key)
    keys = keys.take(order)
    starts = _key_starts(keys, primary_key)
    if ordered:
        return order, starts, keys
    cols = data.select([*primary_key, _V, SEQ]).combine_chunks()
    if _in_version_order(cols.select([_V, SEQ]).take(order), starts):
        return order, starts, keys
    # The same keys in the same order: only rows within a key move, so ``starts`` and the
    # sorted keys hold (equal keys can differ only as -0.0 and 0.0 do: taken again).
    by = [(k, "ascending") for k in primary_key] + [(_V, "ascending"), (SEQ, "ascending")]
    order = pc.sort_indices(cols, sort_keys=by)
    return order, starts, cols.select(list(primary_key)).take(order)


def _in_version_order(data: pa.Table, key_starts: pa.Array) -> bool:
    """Whether each row's (version, ``_seq``) is at or after the row before's in the same key
    (``data`` sorted by key; ``key_starts`` True where a key starts)."""
    if data.num_rows < 2:
        return True
    ver, seq = data.column(_V), data.column(SEQ)
    v0, v1 = ver.slice(0, data.num_rows - 1), ver.slice(1)
    s0, s1 = seq.slice(0, data.num_rows - 1), seq.slice(1)
    ok = pc.or_(pc.greater(v1, v0), pc.and_(pc.equal(v1, v0), pc.greater_equal(s1, s0)))
    return bool(pc.all(pc.or_(ok, key_starts.slice(1))).as_py())


def ascending(data: pa.Table, primary_key: Sequence[str]) -> bool:
    """Whether the rows of ``data`` are in strictly ascending order of a one-column key (a
    compacted part's rows, read alone); False for a key of more columns (not looked at)."""
    if len(primary_key) != 1 or data.num_rows < 2:
        return len(primary_key) == 1
    col = data.column(primary_key[0])
    try:
        return bool(pc.all(pc.greater(col.slice(1), col.slice(0, len(col) - 1))).as_py())
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        return False


def live_key_order(data: pa.Table, primary_key: Sequence[str], keep: np.ndarray | None = None) -> pa.Array:
    """The indices of the rows of ``data`` that ``keep`` marks (None: all; live rows of a read by
    deletion vectors: their keys are distinct) in key order: by slot, with no sort and no copy of
    the keys, for one dense integer key column (:func:`_last_by_slot`, the rows not kept left
    out), else the kept rows as they are when their keys ascend, or as :func:`_key_order` sorts them."""
    if len(primary_key) == 1 and data.num_rows:
        slots = _last_by_slot(data.column(primary_key[0]), keep)
        if slots is not None:
            return slots
    live = pa.array(np.flatnonzero(keep) if keep is not None else np.arange(data.num_rows))
    keys = data.select(list(primary_key)).take(live)
    if ascending(keys, primary_key):
        return live
    return pc.take(live, _key_order(keys, primary_key))


def _key_order(data: pa.Table, primary_key: Sequence[str]) -> pa.Array:
    """The indices of a stable sort of ``data`` by key. One integer key column (the usual key)
    whose values span at most 2**48 is sorted by radix: a few passes of Arrow's counting sort
    over 12 bits at a time, each linear, where a comparison sort of a million keys costs some
    times more. Other keys: Arrow's (stable) comparison sort."""
    keys = data.select(list(primary_key)).combine_chunks()
    if len(primary_key) == 1 and keys.num_rows >= _RADIX_MIN_ROWS:
        col = keys.column(0).chunk(0) if keys.column(0).num_chunks == 1 else keys.column(0).combine_chunks()
        order = _radix_order(col)
        if order is not None:
            return order
    return pc.sort_indices(keys, sort_keys=[(k, "ascending") for k in primary_key])


_RADIX_MIN_ROWS = 1 << 15  # below, one comparison sort costs less than the passes' fixed cost
_RADIX_BITS = 12  # Arrow sorts integers spanning at most 4,096 values by counting
_RADIX_MAX_PASSES = 4


def _radix_order(col: pa.Array) -> pa.Array | None:
    """A stable sort's indices of an integer column without nulls by least-significant-digit
    radix, or None (not integers, nulls, or values spanning more than 4 passes)."""
    if not pa.types.is_integer(col.type) or col.null_count:
        return None
    if len(col) == 0:
        return pc.sort_indices(col)
    lo, hi = (v.as_py() for v in pc.min_max(col).values())
    span = hi - lo
    passes = max(1, -(-span.bit_length() // _RADIX_BITS))
    if passes > _RADIX_MAX_PASSES:
        return None
    # Offsets from the least value: non-negative and below 2**48, so no type overflows.
    wide = pa.uint64() if col.type == pa.uint64() else pa.int64()
    offset = pc.subtract(col.cast(wide), pa.scalar(lo, wide))
    mask = pa.scalar((1 << _RADIX_BITS) - 1, wide)
    order = None
    for i in range(passes):
        shifted = pc.shift_right(offset, pa.scalar(i * _RADIX_BITS, wide)) if i else offset
        digit = pc.bit_wise_and(shifted, mask).cast(pa.uint16())
        order = pc.sort_indices(digit) if order is None else pc.take(order, pc.sort_indices(pc.take(digit, order)))
    return order


_SLOTS_PER_ROW = 4  # an integer key spanning at most this many values per version: a slot each


def _last_by_slot(col: pa.ChunkedArray | pa.Array, keep: np.ndarray | None = None) -> pa.Array | None:
    """For one integer key column without nulls whose rows are versions in order (each key's
    later versions further on), the row of each key's last version, in key order, or None (not
    integers, nulls, or values spanning more than :data:`_SLOTS_PER_ROW` per row). ``keep``
    (one bool a row): only those rows count, the others written nowhere.

    No sort: each row writes its index into the slot of its key (its offset from the least
    key), a later row over an earlier one (``inverse_permutation`` visits the indices in order,
    the last one written stays), and the filled slots, read in slot order, are the keys in
    order. Linear in rows plus span, where a sort of a million keys by radix costs some times
    more."""
    if not pa.types.is_integer(col.type) or col.null_count or len(col) == 0 or not _last_wins():
        return None
    lo, hi = (v.as_py() for v in pc.min_max(col).values())
    span = hi - lo + 1
    if span > _SLOTS_PER_ROW * len(col):
        return None
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    # The offsets lie in [0, span), span at most 4 a row: int64 holds them whatever the key type
    # (a subtraction that wraps past the type's end wraps back: Arrow's unchecked subtract).
    wide = pa.uint64() if col.type == pa.uint64() else pa.int64()
    offset = pc.subtract(col.cast(wide), pa.scalar(lo, wide)).cast(pa.int64())
    if keep is not None:  # a null offset is written nowhere
        offset = pa.array(offset.to_numpy(), pa.int64(), mask=~keep)
    kind = pa.int32() if len(col) < 2**31 - 1 else pa.int64()
    slots = pc.inverse_permutation(offset, max_index=span - 1, output_type=kind)
    return pc.drop_null(slots)


_LAST_WINS: list[bool] = []


def _last_wins() -> bool:
    """Whether ``inverse_permutation`` keeps the last of the indices that meet in one slot (what
    :func:`_last_by_slot` relies on; Arrow's kernel visits them in order, as its ``scatter``
    documents by example): checked once per process, else the fold sorts."""
    if not _LAST_WINS:
        got = pc.inverse_permutation(pa.array([1, 0, 1, 1, 0], pa.int64()), max_index=1)
        # and over many rows meeting in each slot (a kernel that split long inputs would show it)
        n, slots = 1 << 17, 1 << 10
        many = pc.inverse_permutation(pc.bit_wise_and(_arange(n), slots - 1), max_index=slots - 1)
        _LAST_WINS.append(
            got.to_pylist() == [4, 3]
            and many.cast(pa.int64()).equals(pc.add(_arange(slots), pa.scalar(n - slots, pa.int64())))
        )
    return _LAST_WINS[0]


def _take(col: pa.ChunkedArray | pa.Array, rows: pa.Array) -> pa.Array:
    """``col`` at ``rows``, as one array (a take from many chunks costs more than a copy and a take)."""
    return pc.take(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col, rows)


def _key_starts(data: pa.Table, primary_key: Sequence[str]) -> pa.Array:
    """True where a sorted row's key differs from the row before (and on the first row)."""
    n = data.num_rows
    if n == 0:
        return pa.array([], pa.bool_())
    differs = None
    for k in primary_key:
        col = data.column(k)
        col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        d = pc.fill_null(pc.not_equal(col.slice(1), col.slice(0, n - 1)), True)
        differs = d if differs is None else pc.or_(differs, d)
    assert differs is not None
    return pa.concat_arrays([pa.array([True]), differs])


class _Fold:
    """Sorted versions cut into segments (``start``: True on each segment's first row). What
    applying a segment's versions in order up to a row gives is :meth:`at` that row."""

    def __init__(self, data: pa.Table, start: pa.Array, names: Sequence[str], primary_key: Sequence[str]):
        n = data.num_rows
        self.data, self.names, self.pk = data, list(names), list(primary_key)
        self.idx = _arange(n)
        start = start.combine_chunks() if isinstance(start, pa.ChunkedArray) else start
        self.lasts = pc.indices_nonzero(_shifted(start, True, forward=False)).cast(pa.int64())
        self.first_of = pc.cumulative_max(pc.if_else(start, self.idx, 0))
        op = data.column(OP).combine_chunks()
        self.op = op
        self.is_put, self.is_del, self.is_upd = pc.equal(op, PUT), pc.equal(op, DELETE), pc.equal(op, UPDATE)
        self.resets = pc.or_(self.is_put, self.is_del)
        # Where a row's key columns come from: a PUT or DELETE, or an UPDATE on no row.
        self.key_sets = pc.or_(self.resets, pc.and_(self.is_upd, pc.or_(start, _shifted(self.is_del))))
        self.written = _written_masks(data.column(COLS), [c for c in names if c not in self.pk])
        self._latest: dict[str, pa.Array] = {}

    def latest(self, name: str) -> pa.Array:
        """Per row, the last row up to it where ``name``'s mask holds (-1: none): a running max."""
        if name not in self._latest:
            if name == "@key":
                sets = self.key_sets
            elif name == "@reset":
                sets = self.resets
            elif name.startswith("@update:"):
                sets = pc.and_(self.is_upd, self.written[name[8:]])
            else:
                sets = pc.or_(self.resets, pc.and_(self.is_upd, self.written[name]))
            self._latest[name] = pc.cumulative_max(pc.if_else(sets, self.idx, -1))
        return self._latest[name]

    def at(self, rows: pa.Array) -> _State:
        return _State(self, rows)


class _State:
    """Per row of ``rows`` (indices into a :class:`_Fold`'s versions), the row its segment gives
    after its versions up to that one (none when the last of them that counts is a DELETE)."""

    def __init__(self, fold: _Fold, rows: pa.Array):
        self.fold, self.rows_at = fold, rows
        self.first = pc.take(fold.first_of, rows)
        self._src: dict[str, pa.Array] = {}

    def _pick(self, name: str) -> pa.Array:
        latest = pc.take(self.fold.latest(name), self.rows_at)
        return pc.if_else(pc.greater_equal(latest, self.first), latest, pa.scalar(None, pa.int64()))

    def exists(self) -> pa.Array:
        return pc.not_equal(pc.take(self.fold.op, self.rows_at), DELETE)

    def source(self, c: str) -> pa.Array:
        """The version column ``c``'s value comes from (null: the value is null)."""
        if c not in self._src:
            if c in self.fold.pk:
                self._src[c] = self._pick("@key")
            else:
                at = self._pick(c)
                deleted = pc.fill_null(pc.take(self.fold.is_del, at), True)
                self._src[c] = pc.if_else(deleted, pa.scalar(None, pa.int64()), at)
        return self._src[c]

    def value(self, c: str) -> pa.Array:
        return pc.take(self.fold.data.column(c), self.source(c))

    def rows(self, schema: pa.Schema) -> pa.Table:
        return pa.Table.from_arrays([self.value(c) for c in schema.names], schema=schema)

    def folded_op(self) -> pa.Array:
        """The one version equivalent to these versions applied onto any row: the op of the last
        PUT or DELETE when nothing follows it, PUT when UPDATEs do, UPDATE when there is none."""
        reset = self._pick("@reset")
        last_op = pc.take(self.fold.op, self.rows_at).cast(pa.int64())
        return pc.if_else(
            pc.is_null(reset), UPDATE, pc.if_else(pc.fill_null(pc.equal(reset, self.rows_at), False), last_op, PUT)
        )

    def written_text(self) -> pa.Array:
        """The non-key columns an UPDATE among these versions writes, comma-separated in table
        order (an UPDATE's ``_cols``); spelled out once per distinct set of columns."""
        cols = [c for c in self.fold.names if c not in self.fold.pk]
        m = len(self.rows_at)
        text = pa.repeat(pa.scalar(""), m)
        for at in range(0, len(cols), _MASK_BITS):
            chunk = cols[at : at + _MASK_BITS]
            mask = pa.repeat(pa.scalar(0, pa.int64()), m)
            for bit, c in enumerate(chunk):
                mask = pc.add(mask, pc.if_else(pc.is_valid(self._pick(f"@update:{c}")), 1 << bit, 0))
            distinct = pc.unique(mask)
            spelled = pa.array(
                [",".join(c for b, c in enumerate(chunk) if v >> b & 1) for v in distinct.to_pylist()], pa.string()
            )
            part = pc.take(spelled, pc.index_in(mask, distinct))
            both = pc.binary_join_element_wise(text, part, ",")  # no nulls here (see _written_masks)
            text = pc.if_else(pc.equal(text, ""), part, pc.if_else(pc.equal(part, ""), text, both))
        return text


def _written_masks(cols: pa.ChunkedArray | pa.Array, names: Sequence[str]) -> dict[str, pa.Array]:
    """Per non-key column, whether each row's ``_cols`` names it (split on commas, as written):
    computed once per distinct ``_cols`` value, then spread over the rows. (Text is built with no
    nulls: ``binary_join_element_wise`` with ``null_handling="skip"`` drops all-null rows in
    pyarrow 26.)"""
    enc = pc.dictionary_encode(cols.combine_chunks() if isinstance(cols, pa.ChunkedArray) else cols)
    values = [set(filter(None, (v or "").split(","))) for v in enc.dictionary.to_pylist()]
    return {c: pc.fill_null(pc.take(pa.array([c in v for v in values], pa.bool_()), enc.indices), False) for c in names}
