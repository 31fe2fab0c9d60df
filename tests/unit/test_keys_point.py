"""A point read's parts read newest first (coordinator/core/keypoint.py ``newest_first``, issue
24 item 3): the parts it reads fold to exactly what every candidate part folds to, on random
histories of PUT, UPDATE, DELETE and read-lock versions over parts with tied creation CSNs,
compaction outputs whose ``_ver`` lies above or below their own CSN, a transaction's own parts,
missing or unbounded ``_ver`` statistics, and lookups of keys present, absent or several at once;
and it does pass over parts (a check that never skips would prove nothing)."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st
from support import keys_reference as ref
from support.hypo import deterministic

from coordinator.core import keypoint, keytables

FAST = deterministic(300)
OPS = [keytables.PUT, keytables.UPDATE, keytables.DELETE, keytables.LOCK_STRONG, keytables.LOCK_WEAK]
KEYS = {"int64": (pa.int64(), [-3, 0, 1, 2, 7]), "string": (pa.string(), ["", "a", "ab", "é"])}


@st.composite
def lookups(draw: st.DrawFn):
    """A table (1-2 plain key columns, a value column), its candidate parts ``(order, rows,
    stats)`` and the keys looked up."""
    kinds = draw(st.lists(st.sampled_from(sorted(KEYS)), min_size=1, max_size=2))
    pk = tuple(f"k{i}" for i in range(len(kinds)))
    schema = pa.schema([*(pa.field(k, KEYS[kind][0], nullable=False) for k, kind in zip(pk, kinds)), ("v", pa.int64())])
    pools = [KEYS[kind][1][: draw(st.integers(1, 3))] for kind in kinds]  # few keys: versions collide
    key = st.tuples(*(st.sampled_from(p) for p in pools))
    parts = []
    for _ in range(draw(st.integers(0, 6))):
        own = draw(st.integers(0, 5)) == 0
        order = keytables.OWN if own else draw(st.integers(1, 6))
        folded = not own and draw(st.booleans())
        rows = []
        for _ in range(draw(st.integers(0, 4))):
            op = draw(st.sampled_from(OPS))
            row = dict(zip(pk, draw(key)))
            row.update(
                v=draw(st.none() | st.integers(-5, 5)),
                _op=op,
                _seq=draw(st.integers(0, 2)),
                _cols=draw(st.sampled_from(["", "v"])) if op == keytables.UPDATE else None,
            )
            if folded:
                row[keytables.VER] = draw(st.none() | st.integers(1, 8))
            rows.append(row)
        layout = keytables.folded_schema(schema, pk) if folded else keytables.file_schema(schema, pk)
        data = pa.Table.from_pylist(rows, schema=layout)
        stats = {}
        if folded:
            vers = [r[keytables.VER] for r in rows if r[keytables.VER] is not None]
            how = draw(st.sampled_from(["true", "true", "missing", "unbounded"]))
            if how == "true":
                stats[keytables.VER] = (min(vers), max(vers)) if vers else (None, None)
            elif how == "unbounded":
                stats[keytables.VER] = (min(vers, default=0), None)
            # "missing": no statistics for _ver, as a part without the column (the bound is its order)
            if how == "missing" and any(v > order for v in vers):
                stats[keytables.VER] = (min(vers), max(vers))  # a writer's statistics are true
        parts.append((order, data, stats))
    wanted = sorted(set(draw(st.lists(key, min_size=1, max_size=3))))
    return schema, pk, parts, wanted


def _rows_of(data: pa.Table, pk: tuple, wanted: list[tuple]) -> pa.Table:
    keep = [i for i, r in enumerate(zip(*(data.column(k).to_pylist() for k in pk))) if r in wanted]
    return data.take(pa.array(keep, pa.int64()))


@FAST
@given(lookups())
def test_the_parts_read_fold_as_every_candidate(lookup) -> None:
    schema, pk, parts, wanted = lookup
    every = [(order, _rows_of(data, pk, wanted)) for order, data, _ in parts]
    read: list[int] = []

    def reader(i: int) -> pa.Table:
        read.append(i)
        return every[i][1]

    got = keypoint.newest_first([o for o, _, _ in parts], [s for _, _, s in parts], wanted, pk, reader)
    assert len(read) == len(set(read)) and sorted(i for i in read) == sorted(read)
    assert [t for _, t in got] == [every[i][1] for i in sorted(read)]  # in the parts' order
    want = ref.merge(schema, pk, every)
    assert repr(ref.merge(schema, pk, got).to_pylist()) == repr(want.to_pylist())
    few = keypoint.merge_few(schema, pk, got)
    if few is not None:
        assert repr(few.to_pylist()) == repr(want.to_pylist())


def test_an_older_part_is_passed_over_once_the_key_is_written_later() -> None:
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.int64())])
    layout = keytables.file_schema(schema, ("k",))

    def part(op: int) -> pa.Table:
        return pa.Table.from_pylist([{"k": 1, "v": 5, "_op": op, "_seq": 0, "_cols": None}], schema=layout)

    def run(parts: list[tuple[float, pa.Table]], stats: list[dict] | None = None) -> list[int]:
        read: list[int] = []
        keypoint.newest_first(
            [o for o, _ in parts],
            stats or [{} for _ in parts],
            [(1,)],
            ("k",),
            lambda i: read.append(i) or parts[i][1],  # type: ignore[func-returns-value]
        )
        return read

    empty = part(keytables.PUT).slice(0, 0)
    assert run([(3, empty), (9, part(keytables.PUT)), (5, empty)]) == [1]  # the newest holds a PUT
    assert run([(3, empty), (9, part(keytables.DELETE)), (5, empty)]) == [1]
    assert run([(3, empty), (9, part(keytables.UPDATE)), (5, empty)]) == [1, 2, 0]  # an UPDATE needs what came before
    assert run([(3, empty), (9, part(keytables.LOCK_WEAK)), (5, empty)]) == [1, 2, 0]
    assert run([(9, empty), (9, part(keytables.PUT))]) == [0, 1]  # a tie is read: _seq orders it
    assert run([(3, empty), (9, part(keytables.PUT))], [{keytables.VER: (1, 12)}, {}]) == [0, 1]  # _ver above
    assert run([(3, empty), (9, part(keytables.PUT))], [{keytables.VER: (1, None)}, {}]) == [0, 1]  # unbounded
    assert run([(3, empty), (9, part(keytables.PUT))], [{keytables.VER: (None, None)}, {}]) == [1]
    assert run([(keytables.OWN, part(keytables.PUT)), (9, empty)]) == [0]  # a transaction's own write
    assert run([(keytables.OWN, empty), (keytables.OWN, part(keytables.PUT))]) == [0, 1]


def test_top_place() -> None:
    own = keytables.OWN
    cases = [
        (5, {}, 5),
        (5, {"k": (1, 9)}, 5),
        (5, {keytables.VER: (1, 3)}, 5),
        (5, {keytables.VER: (1, 8)}, 8),
        (5, {keytables.VER: (None, None)}, 5),
        (5, {keytables.VER: (1, None)}, own),
        (5, {keytables.VER: ("a", "b")}, own),
        (own, {}, own),
    ]
    for order, stats, want in cases:
        assert keypoint.top_place(order, stats) == want, (order, stats)
