"""The columnar fold of keys tables (coordinator/core/keyfold.py) gives exactly what the
row-by-row fold it replaced gives (tests/support/keys_reference.py): for reads (``merge``),
compaction (``fold``) and ``changes`` (``row_changes``), on random histories of PUT, UPDATE,
DELETE and read-lock versions over several parts, with ties and random ``_seq`` orders,
compaction outputs (``_ver``), a transaction's own parts, nulls, garbage in the columns a version
does not set, single and multi-column keys of every common type, and empty inputs. "Exactly":
the same schema, the same rows in the same order, the same values.
"""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from support import keys_reference as ref
from support.hypo import deterministic

from coordinator.core import keyfold, keypoint, keytables

# Deterministic in CI (no example database, a fixed derivation of examples) and under 30 s.
FAST = deterministic(100)

# key type -> a small pool of values (collisions are the point); floats include -0.0 and 0.0
KEY_TYPES = {
    "int64": (pa.int64(), [-3, 0, 1, 2, 7]),
    "string": (pa.string(), ["", "a", "ab", "b", "é"]),
    "float64": (pa.float64(), [-1.5, -0.0, 0.0, 2.25]),
    "binary": (pa.binary(), [b"", b"\x00", b"a", b"\xff"]),
    "date32": (pa.date32(), [dt.date(2020, 1, 1), dt.date(1999, 12, 31), dt.date(2020, 1, 2)]),
    "bool": (pa.bool_(), [False, True]),
    "decimal": (pa.decimal128(9, 2), [decimal.Decimal("-1.50"), decimal.Decimal("0.00"), decimal.Decimal("3.25")]),
    "timestamp": (
        pa.timestamp("us", tz="UTC"),
        [dt.datetime(2021, 5, 1, tzinfo=dt.UTC), dt.datetime(2021, 5, 2, tzinfo=dt.UTC)],
    ),
}
VALUE_TYPES = {
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "string": (pa.string(), st.text(max_size=4)),
    "float64": (pa.float64(), st.floats()),  # NaN too: an unchanged NaN is no change
    "bool": (pa.bool_(), st.booleans()),
}
OPS = [keytables.PUT, keytables.UPDATE, keytables.DELETE, keytables.LOCK_STRONG, keytables.LOCK_WEAK]


@st.composite
def tables(draw: st.DrawFn, key_kinds: tuple[str, ...] = tuple(KEY_TYPES)) -> tuple[pa.Schema, tuple[str, ...]]:
    """A keys table's schema and primary key: 1-3 key columns, 0-3 others (some not null)."""
    kinds = draw(st.lists(st.sampled_from(sorted(key_kinds)), min_size=1, max_size=3))
    fields = [pa.field(f"k{i}", KEY_TYPES[kind][0], nullable=False) for i, kind in enumerate(kinds)]
    values = draw(st.lists(st.sampled_from(sorted(VALUE_TYPES)), max_size=3))
    fields += [pa.field(f"c{i}", VALUE_TYPES[kind][0], nullable=draw(st.booleans())) for i, kind in enumerate(values)]
    order = draw(st.permutations(range(len(fields))))  # key columns need not come first
    return pa.schema([fields[i] for i in order]), tuple(f.name for f in fields[: len(kinds)])


def _key_pool(schema: pa.Schema, pk: tuple[str, ...]) -> dict[str, list]:
    return {k: KEY_TYPES[next(n for n, (t, _) in KEY_TYPES.items() if t == schema.field(k).type)][1] for k in pk}


def _value_strategy(schema: pa.Schema, name: str) -> st.SearchStrategy:
    t = schema.field(name).type
    return st.none() | next(s for typ, s in VALUE_TYPES.values() if typ == t)


@st.composite
def part_rows(
    draw: st.DrawFn, schema: pa.Schema, pk: tuple[str, ...], folded: bool, ops: tuple[int, ...] = OPS
) -> pa.Table:
    """One part's versions in the file layout (plus ``_ver`` when ``folded``): random keys from
    small pools, random ops and ``_seq`` (ties included), UPDATEs naming random columns (in any
    order, maybe none), and random values everywhere, also where a version sets nothing."""
    pool = _key_pool(schema, pk)
    others = [n for n in schema.names if n not in pk]
    rows = []
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.sampled_from(ops))
        row = {k: draw(st.sampled_from(pool[k])) for k in pk}
        row.update({c: draw(_value_strategy(schema, c)) for c in others})
        row[keytables.OP] = op
        row[keytables.SEQ] = draw(st.integers(0, 3))
        row[keytables.COLS] = None
        if op == keytables.UPDATE:
            row[keytables.COLS] = ",".join(draw(st.lists(st.sampled_from(others), unique=True))) if others else ""
        if folded:
            row[keytables.VER] = draw(st.integers(1, 8))
        rows.append(row)
    layout = keytables.folded_schema(schema, pk) if folded else keytables.file_schema(schema, pk)
    return pa.Table.from_pylist(rows, schema=layout)


@st.composite
def histories(
    draw: st.DrawFn,
    own: bool = True,
    allow_folded: bool = True,
    ops: tuple[int, ...] = OPS,
    key_kinds: tuple[str, ...] = tuple(KEY_TYPES),
):
    """A table and its parts ``(order, rows)``: creation CSNs 1-8 (ties between parts: often),
    some compaction outputs, maybe a transaction's own parts (order OWN)."""
    schema, pk = draw(tables(key_kinds))
    parts = []
    for _ in range(draw(st.integers(0, 5))):
        is_own = own and draw(st.booleans()) and draw(st.booleans())
        order = keytables.OWN if is_own else draw(st.integers(1, 8))
        folded = allow_folded and not is_own and draw(st.booleans()) and draw(st.booleans())
        parts.append((order, draw(part_rows(schema, pk, folded, ops))))
    return schema, pk, parts


def same(got: pa.Table, want: pa.Table) -> None:
    """Same schema, rows, order and values; repr tells -0.0 from 0.0 and takes NaN as NaN."""
    assert got.schema.equals(want.schema, check_metadata=True), (got.schema, want.schema)
    assert repr(got.to_pylist()) == repr(want.to_pylist())


@FAST
@given(histories())
def test_merge_equals_the_reference(history) -> None:
    schema, pk, parts = history
    same(keyfold.merge(schema, pk, parts), ref.merge(schema, pk, parts))


@FAST
@given(histories(ops=tuple(o for o in OPS if o != keytables.UPDATE)))
def test_merge_of_puts_and_deletes_equals_the_reference(history) -> None:
    """Histories without UPDATE take merge's short road (each key its last version): the same rows."""
    schema, pk, parts = history
    same(keyfold.merge(schema, pk, parts), ref.merge(schema, pk, parts))


PLAIN_KEYS = ("int64", "string", "binary", "bool")  # the key types keypoint folds in Python


@FAST
@given(histories(allow_folded=False, key_kinds=PLAIN_KEYS))
def test_the_few_versions_fold_equals_the_reference(history) -> None:
    """A point read's fold in Python (coordinator/core/keypoint.py) on parts of one layout with
    plain key types gives exactly what the reference (and so ``keyfold.merge``) gives."""
    schema, pk, parts = history
    got = keypoint.merge_few(schema, pk, parts)
    assert got is not None
    same(got, ref.merge(schema, pk, parts))


@FAST
@given(histories(allow_folded=False, key_kinds=PLAIN_KEYS), st.data())
def test_the_fold_of_one_version_equals_the_reference(history, data) -> None:
    """A lookup's commonest case, one version of the key (a PUT, an UPDATE, a DELETE or a read
    lock; keypoint.merge_few's short road): exactly the reference's table."""
    schema, pk, parts = history
    given_rows = [(order, d) for order, d in parts if d.num_rows]
    assume(given_rows)
    order, d = data.draw(st.sampled_from(given_rows))
    one = [(order, d.slice(data.draw(st.integers(0, d.num_rows - 1)), 1))]
    got = keypoint.merge_few(schema, pk, one)
    assert got is not None
    same(got, ref.merge(schema, pk, one))


@FAST
@given(histories())
def test_the_few_versions_fold_answers_right_or_leaves_it_to_merge(history) -> None:
    """On any history (floats, dates, decimals, timestamps in keys; compaction outputs beside
    plain parts) it gives the reference's table or None (merge folds it)."""
    schema, pk, parts = history
    got = keypoint.merge_few(schema, pk, parts)
    if got is not None:
        same(got, ref.merge(schema, pk, parts))
    plain = all(schema.field(k).type in [KEY_TYPES[kind][0] for kind in PLAIN_KEYS] for k in pk)
    layouts = {d.schema.to_string() for _, d in parts if d.num_rows}
    assert (got is not None) == (plain and len(layouts) <= 1 or not layouts)


@FAST
@given(histories(own=False), st.data())
def test_fold_equals_the_reference(history, data) -> None:
    schema, pk, parts = history
    chosen = data.draw(st.sets(st.integers(0, max(0, len(parts) - 1)))) if parts else set()
    sources = [p for i, p in enumerate(parts) if i in chosen]
    rest = [p for i, p in enumerate(parts) if i not in chosen]
    theirs: dict[tuple, list] = {}
    for order, t in rest:
        for k, vs in ref.row_versions(t, order, pk).items():
            theirs.setdefault(k, []).extend(vs)
    found = [keyfold.version_rows(t, order, pk) for order, t in rest]
    mine = pa.concat_tables(found) if found else None
    same(keyfold.fold(schema, pk, sources, mine), ref.fold(schema, pk, sources, theirs))


@FAST
@given(histories(own=False), st.data())
def test_row_changes_equal_the_reference(history, data) -> None:
    schema, pk, parts = history
    split = data.draw(st.integers(0, len(parts)))
    before = ref.merge(schema, pk, parts[:split])
    commits: list[tuple[int, list[pa.Table]]] = []
    csn = 100
    for _, t in parts[split:]:  # each later part a commit, or joined to the one before
        t = t.drop_columns([keytables.VER]) if keytables.VER in t.column_names else t
        if commits and data.draw(st.booleans()):
            commits[-1][1].append(t)
        else:
            csn += data.draw(st.integers(1, 3))
            commits.append((csn, [t]))
    same(keyfold.row_changes(schema, pk, before, commits), ref.row_changes(schema, pk, before, commits))


def test_empty_inputs() -> None:
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.string())])
    pk = ("k",)
    empty = keytables.file_schema(schema, pk).empty_table()
    for parts in ([], [(1, empty)], [(keytables.OWN, empty), (2, empty)]):
        same(keyfold.merge(schema, pk, parts), ref.merge(schema, pk, parts))
        same(
            keyfold.fold(schema, pk, [p for p in parts if p[0] != keytables.OWN], None),
            ref.fold(schema, pk, [p for p in parts if p[0] != keytables.OWN], {}),
        )
    same(
        keyfold.row_changes(schema, pk, schema.empty_table(), []), ref.row_changes(schema, pk, schema.empty_table(), [])
    )


@pytest.mark.parametrize("op", [keytables.LOCK_STRONG, keytables.LOCK_WEAK])
def test_a_history_of_read_locks_alone_reads_empty(op: int) -> None:
    """Guards the property tests against a reference that went wrong the same way: read locks
    are never rows, whatever their columns hold."""
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.string())])
    t = keytables.versions(schema, ("k",), "t", pa.table({"k": [1, 2]}), op, 0)
    assert keyfold.merge(schema, ("k",), [(1, t)]).num_rows == 0
    assert keyfold.fold(schema, ("k",), [(1, t)], None).num_rows == 0


def test_a_version_of_another_part_tied_with_a_source_version_splits_no_run() -> None:
    """A version elsewhere at exactly a source version's (version, ``_seq``) sorts after it (as
    ``bisect_left`` placed it): the run up to that version stays one. Ties this exact are rare
    in random histories, so the case is written out."""
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.string())])
    put = keytables.versions(schema, ("k",), "t", pa.table({"k": [1], "v": ["a"]}), keytables.PUT, 0)
    upd = keytables.versions(schema, ("k",), "t", pa.table({"k": [1], "v": ["b"]}), keytables.UPDATE, 1)
    theirs = pa.table({"k": [1], keytables.VER: [20], keytables.SEQ: [1]})
    got = keyfold.fold(schema, ("k",), [(10, put), (20, upd)], theirs)
    same(got, ref.fold(schema, ("k",), [(10, put), (20, upd)], {(1,): [(20, 1)]}))
    assert got.select(["v", keytables.OP, keytables.VER]).to_pylist() == [
        {"v": "b", keytables.OP: keytables.PUT, keytables.VER: 20}
    ]


def test_an_update_after_a_delete_takes_its_own_key_value() -> None:
    """-0.0 and 0.0 are one key; after a DELETE, an UPDATE makes the row anew from its own key
    value, as the reference does (and a PUT's row keeps the PUT's). Written out: random
    histories rarely put the two zeros in that order."""
    schema = pa.schema([pa.field("k", pa.float64(), nullable=False), pa.field("v", pa.string())])
    pk = ("k",)
    put = keytables.versions(schema, pk, "t", pa.table({"k": [0.0], "v": ["a"]}), keytables.PUT, 0)
    dele = keytables.versions(schema, pk, "t", pa.table({"k": [-0.0]}), keytables.DELETE, 1)
    upd = keytables.versions(schema, pk, "t", pa.table({"k": [0.0], "v": ["b"]}), keytables.UPDATE, 2)
    parts = [(1, put), (2, dele), (3, upd)]
    got = keyfold.merge(schema, pk, parts)
    same(got, ref.merge(schema, pk, parts))
    assert repr(got.to_pylist()) == repr([{"k": 0.0, "v": "b"}])
    same(keyfold.fold(schema, pk, parts, None), ref.fold(schema, pk, parts, {}))


def test_a_row_an_update_leaves_as_it_was_is_no_change_even_with_nan() -> None:
    """A column carried from the row before is unchanged though NaN != NaN (the reference's
    dicts hold the same float object); a PUT of NaN over NaN is a change in both. Written out:
    random histories rarely leave a whole row with a NaN as it was."""
    schema = pa.schema(
        [pa.field("k", pa.int64(), nullable=False), pa.field("x", pa.float64()), pa.field("s", pa.string())]
    )
    pk = ("k",)
    before = pa.table({"k": [1], "x": [float("nan")], "s": ["a"]}, schema=schema)
    upd = keytables.versions(schema, pk, "t", pa.table({"k": [1], "s": ["a"]}), keytables.UPDATE, 0)
    put = keytables.versions(schema, pk, "t", pa.table({"k": [1], "x": [float("nan")], "s": ["a"]}), keytables.PUT, 0)
    assert keyfold.row_changes(schema, pk, before, [(5, [upd])]).num_rows == 0
    for commits in ([(5, [upd])], [(5, [put])], [(5, [upd]), (6, [put])]):
        same(keyfold.row_changes(schema, pk, before, commits), ref.row_changes(schema, pk, before, commits))


# -- the read's roads for big inputs (whole-table read) --------------------------------
# A read sorts one integer key column by radix (keyfold._radix_order) from 32,768 rows on, and
# puts parts without ``_ver`` in CSN order so that a sort by key alone leaves versions in order
# (else it sorts by version too). Both are exercised on small inputs by lowering the thresholds;
# the properties stay "the same table as the reference fold".
INT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(), pa.uint64()]


def _int_range(t: pa.DataType) -> tuple[int, int]:
    bits = t.bit_width
    return (0, 2**bits - 1) if pa.types.is_unsigned_integer(t) else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


@st.composite
def int_columns(draw: st.DrawFn) -> pa.Array:
    """Integers of one type: a few clustered values (ties), or spread over up to the whole type."""
    t = draw(st.sampled_from(INT_TYPES))
    lo, hi = _int_range(t)
    base = draw(st.integers(lo, hi))
    width = draw(st.sampled_from([3, 300, 2**20, 2**50, hi - lo]))
    values = st.integers(max(lo, base - width), min(hi, base + width))
    return pa.array(draw(st.lists(values, max_size=60)), t)


@FAST
@given(int_columns(), st.sampled_from([1, 2, 5, 12]))
def test_radix_order_is_the_stable_sort(col: pa.Array, bits: int) -> None:
    """Indices equal to Arrow's stable sort's, whatever the type, sign, span and digit width;
    None (the caller then sorts by comparison) past the passes allowed."""
    old = keyfold._RADIX_BITS
    keyfold._RADIX_BITS = bits
    try:
        got = keyfold._radix_order(col)
    finally:
        keyfold._RADIX_BITS = old
    values = col.to_pylist()
    span = max(values) - min(values) if values else 0
    passes = max(1, -(-span.bit_length() // bits))
    if passes > keyfold._RADIX_MAX_PASSES:
        assert got is None
    else:
        assert got is not None
        assert got.to_pylist() == pc.sort_indices(col).to_pylist()


def test_radix_order_refuses_nulls_and_other_types() -> None:
    assert keyfold._radix_order(pa.array([3, None, 1], pa.int64())) is None
    assert keyfold._radix_order(pa.array([3.0, 1.0])) is None
    assert keyfold._radix_order(pa.array(["b", "a"])) is None


@st.composite
def int_key_histories(draw: st.DrawFn, ops: tuple[int, ...] = OPS):
    """A table keyed by one integer column, parts in any order (a replica lists them by name):
    many keys once (a base load), some rewritten; parts written sorted by key (as
    parts/io/format.py writes them) or not (a transaction's own); ties of orders; some with
    ``_ver``; nulls in the values; read locks."""
    t = draw(st.sampled_from([pa.int64(), pa.int32(), pa.uint64()]))
    lo, hi = _int_range(t)
    schema = pa.schema(
        [pa.field("v", pa.int64()), pa.field("k", t, nullable=False), pa.field("s", pa.string(), nullable=False)]
    )
    pk = ("k",)
    base = draw(st.integers(max(lo, -(2**40)), min(hi, 2**40)))
    spread = draw(st.sampled_from([10, 10_000, 2**36]))
    keys = st.integers(max(lo, base - spread), min(hi, base + spread))
    pool = draw(st.lists(keys, min_size=1, max_size=30, unique=True))
    parts = []
    for _ in range(draw(st.integers(1, 6))):
        folded = draw(st.integers(0, 5)) == 0
        order = keytables.OWN if not folded and draw(st.integers(0, 5)) == 0 else draw(st.integers(1, 9))
        rows = []
        for _ in range(draw(st.integers(0, 12))):
            op = draw(st.sampled_from(ops))
            row = {
                "k": draw(st.sampled_from(pool)),
                "v": draw(st.none() | st.integers(-5, 5)),
                "s": draw(st.text(max_size=2)),
            }
            row[keytables.OP] = op
            row[keytables.SEQ] = draw(st.integers(0, 3))
            row[keytables.COLS] = draw(st.sampled_from(["", "v", "s", "s,v"])) if op == keytables.UPDATE else None
            if folded:
                row[keytables.VER] = draw(st.integers(1, 9))
            rows.append(row)
        if draw(st.booleans()):
            rows.sort(key=lambda r: (r["k"], r.get(keytables.VER) or 0, r[keytables.SEQ]))
        layout = keytables.folded_schema(schema, pk) if folded else keytables.file_schema(schema, pk)
        parts.append((order, pa.Table.from_pylist(rows, schema=layout)))
    return schema, pk, parts


@FAST
@given(int_key_histories(), st.sampled_from([1, 3, 12]))
def test_merge_by_radix_equals_the_reference(history, bits: int) -> None:
    schema, pk, parts = history
    old = keyfold._RADIX_MIN_ROWS, keyfold._RADIX_BITS
    keyfold._RADIX_MIN_ROWS, keyfold._RADIX_BITS = 0, bits
    try:
        got = keyfold.merge(schema, pk, parts)
    finally:
        keyfold._RADIX_MIN_ROWS, keyfold._RADIX_BITS = old
    same(got, ref.merge(schema, pk, parts))


@FAST
@given(int_key_histories(ops=(keytables.PUT, keytables.DELETE, keytables.LOCK_WEAK)))
def test_merge_of_upserts_by_radix_equals_the_reference(history) -> None:
    """The short road (no UPDATE: each key's last version, keys from the sorted key column)."""
    schema, pk, parts = history
    old = keyfold._RADIX_MIN_ROWS
    keyfold._RADIX_MIN_ROWS = 0
    try:
        got = keyfold.merge(schema, pk, parts)
    finally:
        keyfold._RADIX_MIN_ROWS = old
    same(got, ref.merge(schema, pk, parts))


def test_a_big_read_takes_the_radix_road_and_equals_the_reference() -> None:
    """Past the radix threshold for real: 40,000 keys once in 4 parts given out of CSN order,
    plus two rewrites of some and a delete; the reference fold agrees."""
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.int64())])
    pk = ("k",)
    n = 40_000
    shuffled = [(i * 7919) % n - n // 2 for i in range(n)]  # a permutation, negative keys too

    def part(keys: list[int], v: int, op: int = keytables.PUT) -> pa.Table:
        data = pa.table({"k": pa.array(sorted(keys), pa.int64()), "v": pa.array([v] * len(keys), pa.int64())})
        return keytables.versions(schema, pk, "t", data if op == keytables.PUT else data.select(["k"]), op, 0)

    quarter = n // 4
    parts = [(10 + i, part(shuffled[i * quarter : (i + 1) * quarter], i)) for i in range(4)]
    parts += [
        (20, part(shuffled[::50], 100)),
        (21, part(shuffled[::70], 200)),
        (22, part(shuffled[::90], 0, keytables.DELETE)),
    ]
    parts = [parts[i] for i in (5, 2, 0, 6, 3, 1, 4)]
    assert len({k for _, t in parts for k in t.column("k").to_pylist()}) >= keyfold._RADIX_MIN_ROWS
    got = keyfold.merge(schema, pk, parts)
    same(got, ref.merge(schema, pk, parts))
    assert got.num_rows == n - len(shuffled[::90])


@FAST
@given(
    st.sampled_from(
        [(pa.int64(), st.integers(-5, 5)), (pa.string(), st.sampled_from(["", "a", "ab", "b", "é"]))]
    ).flatmap(lambda t: st.tuples(st.just(t[0]), st.lists(t[1], max_size=6)))
)
def test_ascending_says_whether_rows_are_already_in_key_order(case) -> None:
    """A read by vectors returns its rows as they are when ``ascending`` says they are in key
    order (a merged part's), else sorts them: it must say so exactly when a sort would not move them."""
    typ, values = case
    t = pa.table({"k": pa.array(values, typ)})
    strictly = all(a < b for a, b in zip(values, values[1:]))
    assert keyfold.ascending(t, ["k"]) == strictly
    assert not keyfold.ascending(pa.table({"k": pa.array(values, typ), "j": pa.array(values, typ)}), ["k", "j"])
