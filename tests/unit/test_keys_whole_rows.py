"""Update-mode writes made whole (coordinator/core/keytables.py ``keys_where`` and
``fill_columns``, used by ``Transaction._write_update``): the filter a write reads its keys'
current rows by matches exactly those keys (and is a point read's, up to its limit), and each
version gets its key's current values in the columns it did not write, null where the key has no
row, in its own row order; for one- and two-column keys of common types, keys written twice."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st
from support.hypo import deterministic

from coordinator.core import keytables

FAST = deterministic(100)

POOLS = {
    "int64": (pa.int64(), [-3, 0, 1, 2, 7, 2**40]),
    "string": (pa.string(), ["", "a", "ab", "é"]),
    "binary": (pa.binary(), [b"", b"\x00", b"\xff"]),
    "date32": (pa.date32(), [dt.date(2020, 1, 1), dt.date(1999, 12, 31)]),
    "bool": (pa.bool_(), [False, True]),
    "int32": (pa.int32(), [-(2**31), 0, 5, 2**31 - 1]),
}


@st.composite
def cases(draw: st.DrawFn) -> tuple[pa.Schema, list[str], pa.Table, pa.Table]:
    kinds = draw(
        st.sampled_from(
            [("int64",), ("int32",), ("string",), ("binary",), ("date32",), ("int64", "string"), ("bool", "date32")]
        )
    )
    pk = [f"k{i}" for i in range(len(kinds))]
    schema = pa.schema(
        [pa.field(n, POOLS[t][0], False) for n, t in zip(pk, kinds)] + [("v", pa.int64()), ("w", pa.string())]
    )
    key = st.tuples(*(st.sampled_from(POOLS[t][1]) for t in kinds))
    current_keys = draw(st.lists(key, unique=True, max_size=8))
    cur = {n: [k[i] for k in current_keys] for i, n in enumerate(pk)}
    cur |= {"v": draw(st.lists(st.none() | st.integers(0, 9), min_size=len(current_keys), max_size=len(current_keys)))}
    cur |= {"w": [draw(st.none() | st.text(max_size=2)) for _ in current_keys]}
    current = pa.table(cur, schema=schema)
    cut = draw(st.integers(0, len(current_keys)))  # a read's rows come in chunks
    current = pa.concat_tables([current.slice(0, cut), current.slice(cut)])
    written = draw(st.lists(key, min_size=1, max_size=8))  # a key may be written twice
    data = pa.table(
        {**{n: [k[i] for k in written] for i, n in enumerate(pk)}, "v": list(range(len(written)))},
        schema=pa.schema([schema.field(n) for n in [*pk, "v"]]),
    )
    return schema, pk, current, data


@FAST
@given(cases())
def test_each_version_gets_its_keys_current_values_in_the_columns_it_did_not_write(case) -> None:
    schema, pk, current, data = case
    versions = keytables.versions(schema, pk, "t", data, keytables.UPDATE, 1)
    filled = keytables.fill_columns(versions, current, pk, ["w"])
    now = {tuple(r[k] for k in pk): r["w"] for r in current.to_pylist()}
    assert filled.column_names == versions.column_names
    assert filled.drop_columns(["w"]).equals(versions.drop_columns(["w"]))  # order and the rest unchanged
    assert filled.column("w").to_pylist() == [now.get(tuple(r[k] for k in pk)) for r in data.to_pylist()]
    assert keytables.written_columns(filled) == ["v"]


@FAST
@given(cases(), st.integers(1, 10))
def test_the_filter_of_a_writes_keys_matches_exactly_them(case, limit) -> None:
    schema, pk, current, data = case
    where = keytables.keys_where(pk, schema, data.select(pk), limit=limit)
    wanted = {tuple(r[k] for k in pk) for r in data.to_pylist()}
    got = {tuple(r[k] for k in pk) for r in current.filter(where).to_pylist()}
    held = {tuple(r[k] for k in pk) for r in current.to_pylist()}
    if len(wanted) <= limit:
        assert got == wanted & held
        if all(schema.field(k).type in (pa.int64(), pa.string(), pa.bool_()) for k in pk):
            assert set(keytables.point_keys(where, schema, pk, exact=True)) == wanted  # a point read's
    else:
        assert got >= wanted & held  # isin per column: at least those keys (the fill joins exactly)
