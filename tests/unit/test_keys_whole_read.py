"""A whole read's shorter roads through a keys table's fold (keyfold.py):
parts passed through without a fold, the version check skipped, columns left undecoded by what
the parts' statistics prove. Each against the row-by-row
reference (tests/support/keys_reference.py) over random histories built to reach the roads:
parts written sorted by key (as parts/io/format.py writes them) with each key once or not,
key ranges apart or overlapping, orders tied or not, compaction outputs with ``_ver``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import keys_reference as ref
from support.hypo import deterministic

from coordinator.core import keyfold, keytables
from coordinator.core.keytables import COLS, DELETE, LOCK_WEAK, OP, OWN, PUT, SEQ, UPDATE, VER
from parts.io.format import column_stats

FAST = deterministic(150)

KEYS = {
    "int64": (pa.int64(), list(range(-6, 30))),
    "string": (pa.string(), ["", "a", "ab", "b", "ba", "z", "é", "éa"]),
    "float64": (pa.float64(), [-1.5, -0.0, 0.0, 2.25, 3.0]),
}


def _sort_key(v):
    return v.encode() if isinstance(v, str) else v


@st.composite
def histories(draw: st.DrawFn):
    """One key column; parts whose keys each come once, sorted (mostly) or not, drawn from one
    slice of the key pool each (ranges apart) or from all of it; PUT-only, upsert or any ops;
    orders 1-8 (ties) or OWN; some compaction outputs (``_ver``)."""
    kind = draw(st.sampled_from(sorted(KEYS)))
    key_type, pool = KEYS[kind]
    schema = pa.schema(
        [pa.field("v", pa.int64()), pa.field("k", key_type, nullable=False), pa.field("s", pa.string(), nullable=False)]
    )
    ops = draw(
        st.sampled_from(
            [(PUT,), (PUT,), (PUT, DELETE), (PUT, DELETE, LOCK_WEAK), (PUT, UPDATE), (PUT, UPDATE, DELETE, LOCK_WEAK)]
        )
    )
    n = draw(st.integers(1, 5))
    apart = draw(st.booleans())
    ordered_pool = sorted(pool, key=_sort_key)
    parts = []
    for i in range(n):
        if apart:
            lo, hi = i * len(ordered_pool) // n, (i + 1) * len(ordered_pool) // n
            mine = ordered_pool[lo:hi]
        else:
            mine = ordered_pool
        if not mine:
            continue
        once = draw(st.integers(0, 2)) > 0
        keys = (
            draw(st.lists(st.sampled_from(mine), unique=True, max_size=8))
            if once
            else draw(st.lists(st.sampled_from(mine), max_size=8))
        )
        folded = draw(st.integers(0, 4)) == 0
        rows = []
        for k in keys:
            op = draw(st.sampled_from(ops))
            rows.append(
                {
                    "k": k,
                    "v": draw(st.none() | st.integers(-3, 3)),
                    "s": draw(st.sampled_from(["x", "y", ""])),
                    OP: op,
                    SEQ: draw(st.integers(0, 3)),
                    COLS: draw(st.sampled_from(["", "v", "s", "v,s"])) if op == UPDATE else None,
                    **({VER: draw(st.integers(1, 9))} if folded else {}),
                }
            )
        if draw(st.integers(0, 2)) > 0:  # unsorted: a key's versions out of _seq order
            rows.sort(key=lambda r: (_sort_key(r["k"]), r.get(VER) or 0, r[SEQ]))
        own = not folded and draw(st.integers(0, 6)) == 0
        order = OWN if own else draw(st.integers(1, 8))
        layout = keytables.folded_schema(schema, ("k",)) if folded else keytables.file_schema(schema, ("k",))
        parts.append((order, pa.Table.from_pylist(rows, schema=layout)))
    return schema, ("k",), parts


def same(got: pa.Table, want: pa.Table) -> None:
    assert got.schema.equals(want.schema), (got.schema, want.schema)
    assert repr(got.to_pylist()) == repr(want.to_pylist())


@FAST
@given(histories())
def test_merge_on_sorted_parts_equals_the_reference(history) -> None:
    """Parts apart or not, keys once or not: the pass-through, the unchecked version order and
    the usual roads give the reference's rows."""
    schema, pk, parts = history
    same(keyfold.merge(schema, pk, parts), ref.merge(schema, pk, parts))


def read_as_planned(schema: pa.Schema, pk: tuple[str, ...], parts: list, values=None) -> list:
    """What client._fold_whole and keyscan.read_versions decode of each part, from the
    statistics parts/io/format.py writes: the plan's columns, then the ones held back if a key
    repeats, completed."""
    orders = [o for o, _ in parts]
    stats = [column_stats(t) for _, t in parts]
    plans = [
        keyfold.read_plan(schema, pk, s, shared, alone, values)
        for s, shared, alone in zip(stats, keyfold.shared_orders(orders, stats), keyfold.alone(pk[0], stats))
    ]
    out = []
    for (order, t), plan in zip(parts, plans):
        if plan.columns is None:
            out.append((order, t))
            continue
        data = t.select([c for c in plan.columns if c in t.column_names])
        for c in keyfold.also_read(plan, data, pk):
            if c in t.column_names:
                data = data.append_column(t.schema.field(c), t.column(c))
        out.append((order, keyfold.completed(plan, data)))
    return out


@FAST
@given(histories())
def test_a_read_of_the_planned_columns_equals_the_reference(history) -> None:
    """Leaving out ``_op`` (all PUT), ``_cols`` (no UPDATE), ``_ver`` and ``_seq`` (a part alone
    in its key range, or in an order of its own, holding each key once) folds to the same rows."""
    schema, pk, parts = history
    same(keyfold.merge(schema, pk, read_as_planned(schema, pk, parts)), ref.merge(schema, pk, parts))


@FAST
@given(histories())
def test_a_read_of_some_columns_keeps_them_as_the_whole_read(history) -> None:
    schema, pk, parts = history
    got = keyfold.merge(schema, pk, read_as_planned(schema, pk, parts, values=["s"])).select(["k", "s"])
    same(got, ref.merge(schema, pk, parts).select(["k", "s"]))


@pytest.mark.parametrize(
    ("spans", "want"),
    [
        ([(0, 9)], [True]),
        ([(0, 4), (5, 9)], [True, True]),
        ([(0, 5), (5, 9)], [False, False]),  # key 5 in both
        ([(0, 9), (2, 3), (10, 12)], [False, False, True]),
        ([(2, 3), (0, 9), (10, 12)], [False, False, True]),
        ([(0, 100), (2, 3), (50, 60)], [False, False, False]),  # the wide one reaches past the next
        ([(10, 12), (0, 1)], [True, True]),
        ([(0, 1), None], [False, False]),  # no statistics: may hold anything
        ([(0, 1), ("a", "b")], [False, False]),  # not integers: not compared
        ([(0, 1), (True, True)], [False, False]),  # bools are not integers here
    ],
)
def test_alone(spans, want) -> None:
    stats = [{} if s is None else {"k": s} for s in spans]
    assert keyfold.alone("k", stats) == want


@pytest.mark.parametrize(
    ("stats", "shared", "alone", "columns", "if_repeated", "put_only"),
    [
        ({}, False, True, None, (), False),  # nothing recorded: everything
        ({OP: (PUT, PUT)}, False, True, ("v", "k", "s"), (SEQ,), True),
        ({OP: (PUT, PUT), VER: (1, 5)}, False, True, ("v", "k", "s"), (VER, SEQ), True),
        ({OP: (PUT, PUT), VER: (1, 5)}, False, False, ("v", "k", "s", VER, SEQ), (), True),
        ({OP: (PUT, PUT)}, True, False, ("v", "k", "s", SEQ), (), True),
        ({OP: (PUT, PUT)}, False, False, ("v", "k", "s"), (SEQ,), True),
        ({OP: (PUT, DELETE)}, False, False, ("v", "k", "s", OP, COLS), (SEQ,), False),
        ({OP: (DELETE, LOCK_WEAK)}, False, False, ("v", "k", "s", OP), (SEQ,), False),
        ({OP: (PUT, UPDATE)}, False, False, ("v", "k", "s", OP, COLS), (SEQ,), False),
        ({OP: (False, False)}, False, False, None, (), False),  # bools are not ops
        ({OP: (None, None)}, False, False, None, (), False),
    ],
)
def test_read_plan(stats, shared, alone, columns, if_repeated, put_only) -> None:
    schema = pa.schema(
        [pa.field("v", pa.int64()), pa.field("k", pa.int64(), nullable=False), pa.field("s", pa.string())]
    )
    plan = keyfold.read_plan(schema, ("k",), stats, shared, alone)
    assert (plan.columns, plan.if_repeated, plan.put_only) == (columns, if_repeated, put_only)


def test_read_plan_with_two_key_columns_reads_the_version_columns() -> None:
    schema = pa.schema([pa.field("a", pa.int64(), nullable=False), pa.field("b", pa.int64(), nullable=False)])
    plan = keyfold.read_plan(schema, ("a", "b"), {OP: (PUT, PUT)}, False, True)
    assert plan.columns == ("a", "b", SEQ) and plan.if_repeated == ()


def test_shared_orders() -> None:
    assert keyfold.shared_orders([1, 2, 2, OWN], [{OP: (0, 0)}] * 4) == [False, True, True, False]
    assert keyfold.shared_orders([1, 7, 9], [{OP: (0, 0)}, {OP: (0, 0), VER: (5, 8)}, {OP: (0, 0)}]) == [
        False,
        True,
        False,
    ]
    assert keyfold.shared_orders([1, 9], [{OP: (0, 0)}, {}]) == [True, True]  # unknown: may hold any


def test_a_compacted_table_passes_through_in_key_order() -> None:
    """Parts apart in key range, each key once, all PUT: their rows in key order, and a part
    that overlaps another (or a DELETE) sends the read down the fold, with the same answer."""
    schema = pa.schema([pa.field("k", pa.string(), nullable=False), pa.field("v", pa.int64())])
    pk = ("k",)

    def part(keys: list[str], op: int = PUT) -> pa.Table:
        data = pa.table({"k": pa.array(keys), "v": pa.array(range(len(keys)), pa.int64())})
        return keytables.versions(schema, pk, "t", data if op == PUT else data.select(["k"]), op, 0)

    parts = [(5, part(["m", "n", "é"])), (3, part(["a", "b"])), (4, part(["c", "d"]))]
    got = keyfold.merge(schema, pk, parts)
    assert got.column("k").to_pylist() == ["a", "b", "c", "d", "m", "n", "é"]
    same(got, ref.merge(schema, pk, parts))
    for extra in ([(6, part(["b"]))], [(6, part(["zz"], DELETE))], [(2, part(["d", "e"]))]):
        same(keyfold.merge(schema, pk, parts + extra), ref.merge(schema, pk, parts + extra))


@pytest.mark.parametrize(
    ("parts", "want"),
    [
        ([[1, 2, 3], [0, 5]], [True, True]),  # a drop where a part starts is no repeat
        ([[1, 2, 2], [0, 5]], [False, True]),
        ([[1, 2], [], [0, 1], [], [3, 1]], [True, True, True, True, False]),  # empty parts
        ([[1], [1]], [True, True]),
        ([[3, 2, 1, 0, -1, -2, -3], [9, 8, 7, 6, 5, 4, 3]], [False, False]),  # many fail: part by part
        ([[0.0, -0.0]], [False]),
    ],
)
def test_rising(parts, want) -> None:
    cols = [pa.array(p, pa.float64() if any(isinstance(v, float) for v in p) else pa.int64()) for p in parts]
    assert keyfold._rising(cols) == want
    assert [keyfold.strictly_increasing(c) for c in cols] == want


# -- each key's last version by slot (keyfold._last_by_slot) ------------------
SLOT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(), pa.uint64()]


@st.composite
def slot_columns(draw: st.DrawFn) -> pa.Array:
    """Integers of one type near either end of it or around zero, dense (slots needed about the
    rows) or spread (more slots than the road allows), with repeats; sometimes a null."""
    t = draw(st.sampled_from(SLOT_TYPES))
    bits = t.bit_width
    lo, hi = (0, 2**bits - 1) if pa.types.is_unsigned_integer(t) else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    width = draw(st.sampled_from([0, 2, 10, 60, 2**40]))
    base = draw(st.sampled_from([lo, hi - min(width, hi - lo), max(lo, min(0, hi - width))]))
    values = st.integers(base, min(hi, base + width))
    got = draw(st.lists(values | st.none() if draw(st.integers(0, 9)) == 0 else values, max_size=40))
    return pa.array(got, t)


@FAST
@given(slot_columns())
def test_last_by_slot_is_each_keys_last_row_in_key_order(col: pa.Array) -> None:
    """The rows of each key's last occurrence, keys ascending; None for nulls or a span over
    the slots allowed per row (the caller then sorts)."""
    values = col.to_pylist()
    got = keyfold._last_by_slot(pa.chunked_array([col.slice(0, len(col) // 2), col.slice(len(col) // 2)], col.type))
    present = [v for v in values if v is not None]
    if not present or None in values or max(present) - min(present) + 1 > keyfold._SLOTS_PER_ROW * len(values):
        assert got is None
        return
    last = {v: i for i, v in enumerate(values)}
    assert got is not None and got.to_pylist() == [last[v] for v in sorted(last)]


@st.composite
def live_rows(draw: st.DrawFn) -> tuple[pa.Table, np.ndarray]:
    """A key column (integers by :func:`slot_columns` without nulls, or strings) with repeats, and
    the rows kept: at most one row of each key (a read by deletion vectors keeps one per key),
    sometimes none, sometimes every row of keys that come once."""
    if draw(st.booleans()):
        col = draw(slot_columns())
        col = pa.array([v for v in col.to_pylist() if v is not None], col.type)
    else:
        col = pa.array(draw(st.lists(st.sampled_from(KEYS["string"][1]), max_size=40)), pa.string())
    values = col.to_pylist()
    keep = np.zeros(len(values), bool)
    rows_of: dict = {}
    for i, v in enumerate(values):
        rows_of.setdefault(v, []).append(i)
    for rows in rows_of.values():
        pick = draw(st.integers(-1, len(rows) - 1))
        if pick >= 0:
            keep[rows[pick]] = True
    return pa.table({"k": col}), keep


@FAST
@given(live_rows())
def test_live_key_order_is_the_kept_rows_in_key_order(case: tuple[pa.Table, np.ndarray]) -> None:
    """keyfold.live_key_order (a whole read by deletion vectors): the indices of the kept rows,
    keys ascending, by slot or by sort, the rows left out never among them."""
    data, keep = case
    values = data.column("k").to_pylist()
    kept = sorted((i for i in range(len(values)) if keep[i]), key=lambda i: _sort_key(values[i]))
    got = keyfold.live_key_order(data, ["k"], keep)
    assert got.cast(pa.int64()).to_pylist() == kept
    col, half = data.column("k").combine_chunks(), len(values) // 2
    chunked = pa.table({"k": pa.chunked_array([col.slice(0, half), col.slice(half)], col.type)})
    assert keyfold.live_key_order(chunked, ["k"], keep).cast(pa.int64()).to_pylist() == kept


def test_last_by_slot_refuses_other_types() -> None:
    assert keyfold._last_by_slot(pa.array([1.0, 2.0])) is None
    assert keyfold._last_by_slot(pa.array(["a", "b"])) is None
    assert keyfold._last_by_slot(pa.array([], pa.int64())) is None
    assert keyfold._last_wins()  # the kernel this road relies on keeps the last index per slot


def test_a_big_upsert_history_takes_the_slot_road_and_equals_the_reference(monkeypatch) -> None:
    """The bench's shape at 40,000 keys: a base load of random keys in parts given out of CSN
    order, rewrites of some keys, a delete, a read lock; each key once per part, so versions
    are in order in CSN order and each key's last one is found by slot, not by a sort. The
    reference fold agrees, and the road taken is the slot one (the real function, watched)."""
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.int64())])
    pk = ("k",)
    n = 40_000
    shuffled = [(i * 7919) % n - n // 2 for i in range(n)]

    def part(keys: list[int], v: int, op: int = PUT) -> pa.Table:
        data = pa.table({"k": pa.array(sorted(keys), pa.int64()), "v": pa.array([v] * len(keys), pa.int64())})
        return keytables.versions(schema, pk, "t", data if op == PUT else data.select(["k"]), op, 0)

    quarter = n // 4
    parts = [(10 + i, part(shuffled[i * quarter : (i + 1) * quarter], i)) for i in range(4)]
    parts += [
        (20, part(shuffled[::50], 100)),
        (21, part(shuffled[::70], 200)),
        (22, part(shuffled[::90], 0, DELETE)),
        (23, part(shuffled[::30], 0, LOCK_WEAK)),
    ]
    parts = [parts[i] for i in (5, 2, 7, 0, 6, 3, 1, 4)]
    answers = []
    real = keyfold._last_by_slot
    monkeypatch.setattr(keyfold, "_last_by_slot", lambda col: answers.append(real(col)) or answers[-1])
    got = keyfold.merge(schema, pk, parts)
    assert len(answers) == 1 and answers[0] is not None  # dense keys: the slot road answered
    same(got, ref.merge(schema, pk, parts))
    assert got.num_rows == n - len(shuffled[::90])


@st.composite
def upsert_histories(draw: st.DrawFn):
    """What reaches the slot road: one integer key column of any width, keys near the type's
    ends or around zero, each part's keys once and sorted (as written), distinct orders (a
    transaction's own part maybe among them), PUT/DELETE versions and read locks; parts given
    in any order. Keys often rewritten, so the wrong version kept shows. Sometimes tied orders,
    where ``_seq`` orders versions and the road must not be taken."""
    t = draw(st.sampled_from([pa.int8(), pa.int32(), pa.int64(), pa.uint64()]))
    bits = t.bit_width
    lo, hi = (0, 2**bits - 1) if pa.types.is_unsigned_integer(t) else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    base = draw(st.sampled_from([lo, hi - 12, -5 if lo < 0 else 0]))
    schema = pa.schema(
        [pa.field("v", pa.int64()), pa.field("k", t, nullable=False), pa.field("s", pa.string(), nullable=False)]
    )
    tied = draw(st.integers(0, 3)) == 0
    orders = draw(st.lists(st.integers(1, 2 if tied else 9), min_size=2 if tied else 1, max_size=6, unique=not tied))
    if draw(st.integers(0, 3)) == 0:
        orders[-1] = OWN
    parts = []
    for order in orders:
        keys = sorted(draw(st.lists(st.integers(base, base + 12), unique=True, min_size=int(tied), max_size=10)))
        rows = [
            {
                "k": k,
                "v": draw(st.none() | st.integers(-3, 3)),
                "s": draw(st.sampled_from(["x", "y", ""])),
                OP: draw(st.sampled_from([PUT, PUT, DELETE, LOCK_WEAK])),
                SEQ: draw(st.integers(0, 3)),
                COLS: None,
            }
            for k in keys
        ]
        parts.append((order, pa.Table.from_pylist(rows, schema=keytables.file_schema(schema, ("k",)))))
    return schema, ("k",), draw(st.permutations(parts))


@FAST
@given(upsert_histories())
def test_merge_of_upserts_by_slot_equals_the_reference(history) -> None:
    schema, pk, parts = history
    same(keyfold.merge(schema, pk, parts), ref.merge(schema, pk, parts))
    same(keyfold.merge(schema, pk, read_as_planned(schema, pk, parts)), ref.merge(schema, pk, parts))


@pytest.mark.parametrize(
    ("key_type", "delta"),
    [(pa.int64(), True), (pa.int32(), True), (pa.uint64(), True), (pa.string(), False), (pa.float64(), False)],
)
@pytest.mark.parametrize("rows", [10, 20_000])  # a small part (no dictionaries, uncompressed) and a big one
def test_a_keys_part_writes_an_integer_key_in_delta_encoding(tmp_path, key_type, delta: bool, rows: int) -> None:
    """The keys writer (parts/io/format.py) stores a sorted integer first key column as
    DELTA_BINARY_PACKED, other key types and the other columns as before (dictionaries in a
    big part); the part reads back whole and by point as written."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from parts.io import format as part_format
    from parts.io.storage import Storage

    schema = pa.schema([pa.field("k", key_type, nullable=False), pa.field("v", pa.int64()), pa.field("s", pa.string())])
    raw_keys = [(i * 7919) % 50_000 for i in range(rows)]
    keys = [str(k) for k in raw_keys] if key_type == pa.string() else [float(k) for k in raw_keys]
    if pa.types.is_integer(key_type):
        keys = raw_keys
    data = pa.table({"k": pa.array(keys, key_type), "v": list(range(rows)), "s": [f"s{k % 7}" for k in raw_keys]})
    versions = keytables.versions(schema, ("k",), "t", data.cast(schema), PUT, 0)
    storage = Storage(str(tmp_path))
    meta = part_format.write_part(storage, "t", [], (), versions, "tx1", primary_key=("k",))
    md = pq.ParquetFile(str(tmp_path / meta.path)).metadata
    encodings = {md.schema.column(i).name: md.row_group(0).column(i).encodings for i in range(md.num_columns)}
    assert ("DELTA_BINARY_PACKED" in encodings["k"]) == delta
    assert not any("DELTA_BINARY_PACKED" in e for c, e in encodings.items() if c != "k")
    if rows > 1000:  # a big part keeps dictionaries for the other columns
        assert "RLE_DICTIONARY" in encodings["s"]
    whole = part_format.read_part(storage, meta)
    assert whole.column("k").to_pylist() == sorted(keys, key=_sort_key)
    want = versions.sort_by("k")
    assert whole.select(["k", "v", "s"]).equals(want.select(["k", "v", "s"]))
    for key in (keys[0], keys[-1]):
        got = part_format.read_part(storage, meta, keys=(["k"], [(key,)]))
        assert got.equals(whole.filter(pc.field("k") == key))


@FAST
@given(histories())
def test_repeating_names_the_parts_that_also_read_names(history) -> None:
    """``keyfold.repeating`` tells for all parts at once what ``also_read`` tells part by part:
    the parts read without their held-back columns in which a key occurs twice
    (client._fold_whole decodes every part first and checks after)."""
    schema, pk, parts = history
    orders = [o for o, _ in parts]
    stats = [column_stats(t) for _, t in parts]
    plans = [
        keyfold.read_plan(schema, pk, s, shared, alone)
        for s, shared, alone in zip(stats, keyfold.shared_orders(orders, stats), keyfold.alone(pk[0], stats))
    ]
    read = [
        None if p.columns is None else t.select([c for c in p.columns if c in t.column_names])
        for (_, t), p in zip(parts, plans)
    ]
    want = [i for i, (p, d) in enumerate(zip(plans, read)) if d is not None and keyfold.also_read(p, d, pk)]
    assert keyfold.repeating(plans, [None if d is None else d.column(pk[0]) for d in read]) == want


def test_read_all_versions_reads_again_the_parts_that_repeat_a_key(tmp_path) -> None:
    """Parts written as a keys table's are (one with a key twice, so its ``_seq`` matters; one
    with an UPDATE; plain upserts), decoded in a pool by ``keyscan.read_all_versions``: each
    part comes back as ``read_versions`` decodes it alone (the held-back ``_seq`` read again
    for the part that repeats a key, only for it), and the fold equals the reference's."""
    from concurrent.futures import ThreadPoolExecutor

    from parts.io import format as part_format
    from parts.io import keyscan
    from parts.io.storage import Storage

    schema = pa.schema(
        [pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.int64()), pa.field("s", pa.string())]
    )
    layout = keytables.file_schema(schema, ("k",))

    def rows(*versions: tuple) -> pa.Table:
        names = ["k", "v", "s", OP, SEQ, COLS]
        return pa.Table.from_pylist([dict(zip(names, r)) for r in versions], schema=layout)

    tables = [
        (10, rows((1, 1, "a", PUT, 0, None), (2, 2, "b", PUT, 1, None), (3, 3, "c", PUT, 2, None))),
        (11, rows((2, 20, "x", PUT, 0, None), (2, 21, "y", PUT, 1, None), (4, 4, "d", PUT, 2, None))),  # 2 twice
        (12, rows((1, None, None, UPDATE, 0, "v"), (3, 30, "z", PUT, 1, None))),
    ]
    storage = Storage(str(tmp_path))
    metas = [part_format.write_part(storage, "t", [], (), t, f"tx{o}", primary_key=("k",)) for o, t in tables]
    orders = [o for o, _ in tables]
    stats = [m.stats for m in metas]
    plans = [
        keyfold.read_plan(schema, ("k",), s, shared, alone)
        for s, shared, alone in zip(stats, keyfold.shared_orders(orders, stats), keyfold.alone("k", stats))
    ]
    assert all(p.if_repeated for p in plans)  # _seq held back: decoded only where a key repeats
    with ThreadPoolExecutor(max_workers=2) as pool:
        got = keyscan.read_all_versions(storage, metas, plans, ("k",), pool)
    alone_reads = [keyscan.read_versions(storage, m, p, ("k",)) for m, p in zip(metas, plans)]
    assert [g.equals(a) for g, a in zip(got, alone_reads)] == [True, True, True]
    assert got[1].column(SEQ).to_pylist() == [0, 1, 2]  # read again: the file's, not the constant 0
    assert got[0].column(SEQ).to_pylist() == [0, 0, 0]  # held back: each key once, it orders nothing
    same(keyfold.merge(schema, ("k",), list(zip(orders, got))), ref.merge(schema, ("k",), tables))


@FAST
@given(histories())
def test_versions_put_together_by_columns_equal_them_put_together_by_tables(history) -> None:
    """``_versions`` builds the versions of parts of one schema without ``_ver`` column by
    column, each ``_v`` from one run per part: the same table as one
    table per part concatenated, which it still does for other parts."""
    schema, _, parts = history
    by_tables = keyfold._versions_pieces([f.name for f in schema] + [OP, SEQ, COLS], parts)
    got = keyfold._versions_alike([f.name for f in schema] + [OP, SEQ, COLS], parts)
    if got is None:
        return
    want = pa.concat_tables(by_tables)
    assert got.schema.equals(want.schema)
    assert got.equals(want)


@pytest.mark.parametrize("types", [(pa.int64(), pa.int64()), (pa.int32(), pa.int64()), (pa.string(), pa.string())])
def test_ends_are_each_columns_first_and_last(types) -> None:
    key_type = pa.int64() if pa.types.is_integer(types[0]) else pa.string()
    values = [[3, 5, 9], [1], [2, 4]] if key_type == pa.int64() else [["b", "c"], ["a"], ["d", "e", "f"]]
    cols = [pa.chunked_array([v[:1], v[1:]] if len(v) > 1 else [v], types[i % 2]) for i, v in enumerate(values)]
    firsts, lasts = keyfold._ends(key_type, cols)
    assert firsts.type == key_type and lasts.type == key_type
    assert firsts.to_pylist() == [v[0] for v in values]
    assert lasts.to_pylist() == [v[-1] for v in values]


@st.composite
def own_over_committed(draw: st.DrawFn):
    """A history whose last parts (some, none or all of those without ``_ver``) are a
    transaction's own: the committed ones are read by vectors, the own ones folded over them."""
    schema, pk, parts = draw(histories())
    mine = draw(st.integers(0, len(parts)))
    tagged = [(OWN if i >= len(parts) - mine and VER not in t.column_names else o, t) for i, (o, t) in enumerate(parts)]
    return schema, pk, tagged, draw(st.randoms(use_true_random=False))


def scattered(live: pa.Table, rng) -> tuple[pa.Table, pa.Array]:
    """``live``'s rows shuffled among dead ones (copies, as superseded rows are), which of them
    are live, and the order that takes the live ones back out in key order."""
    n = live.num_rows
    dead = live.take(pa.array([rng.randrange(n) for _ in range(rng.randrange(4))] if n else [], pa.int64()))
    data = pa.concat_tables([live, dead])
    perm = list(range(data.num_rows))
    rng.shuffle(perm)
    where = {old: new for new, old in enumerate(perm)}
    keep = np.array([i < n for i in perm], bool)
    return data.take(pa.array(perm, pa.int64())), keep, pa.array([where[i] for i in range(n)], pa.int64())


@FAST
@given(own_over_committed())
def test_own_versions_over_live_rows_equal_the_fold_of_every_version(history) -> None:
    """A transaction's whole read by vectors (client._read_own_over_vectors): the committed
    parts' live rows (their fold, which the vectors leave) with its own versions folded over the
    keys they touch give the reference fold of every version, the others untouched."""
    schema, pk, parts, rng = history
    data, keep, order = scattered(keyfold.merge(schema, pk, [(o, t) for o, t in parts if o != OWN]), rng)
    own = [t for o, t in parts if o == OWN]
    same(keyfold.over_live(schema, pk, data, keep, order, own), ref.merge(schema, pk, parts))


def test_own_versions_over_live_rows_with_two_key_columns() -> None:
    """Keys of two columns are matched whole (a join): an own version of (1, "b") leaves
    (1, "a") and (2, "b") as they are."""
    schema = pa.schema(
        [pa.field("a", pa.int64(), nullable=False), pa.field("b", pa.string(), nullable=False), ("v", pa.int64())]
    )
    pk = ("a", "b")
    layout = keytables.file_schema(schema, pk)
    committed = pa.Table.from_pylist(
        [{"a": a, "b": b, "v": v, OP: PUT, SEQ: 0, COLS: None} for a, b, v in [(1, "a", 1), (1, "b", 2), (2, "b", 3)]],
        schema=layout,
    )
    own = pa.Table.from_pylist(
        [
            {"a": 1, "b": "b", "v": 20, OP: UPDATE, SEQ: 0, COLS: "v"},
            {"a": 3, "b": "a", "v": 30, OP: PUT, SEQ: 1, COLS: None},
            {"a": 2, "b": "b", "v": None, OP: DELETE, SEQ: 2, COLS: None},
        ],
        schema=layout,
    )
    live = keyfold.merge(schema, pk, [(1, committed)])
    got = keyfold.over_live(schema, pk, live, np.ones(3, bool), pa.array([0, 1, 2]), [own])
    same(got, ref.merge(schema, pk, [(1, committed), (OWN, own)]))
    assert got.to_pylist() == [{"a": 1, "b": "a", "v": 1}, {"a": 1, "b": "b", "v": 20}, {"a": 3, "b": "a", "v": 30}]
