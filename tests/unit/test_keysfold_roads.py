"""spark.keysfold.choose_roads: which parts of a keys table Spark reads as they are
(no fold, no shuffle) and which it folds and broadcasts; pure Arrow, no Spark. A table of cases:
each says the parts' keys (one list a part) and the roads expected."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core.keytables import OP, VER
from parts.model.meta import PartMeta
from spark.keysfold import choose_roads, op_range, overlaid, overlay, version_range
from spark.native import row_key_shift


def part(*keys: int, p: str = "x") -> pa.Table:
    return pa.table({"p": [p] * len(keys), "k": pa.array(keys, pa.int64())})


def big(lo: int, n: int, p: str = "x") -> pa.Table:
    return part(*range(lo, lo + n), p=p)


CASES = [
    # (case, parts, direct, small, keys only in small parts) ; None: fold everything
    ("one part", [big(0, 10)], (0,), (), None),
    ("disjoint parts", [big(0, 10), big(10, 10), big(20, 5)], (0, 1, 2), (), None),
    ("interleaved but disjoint", [part(0, 2, 4, 6), part(1, 3, 5, 7)], (0, 1), (), None),
    ("same keys in other partitions", [big(0, 10, "x"), big(0, 10, "y")], (0, 1), (), None),
    ("a small update of the big part", [big(0, 100), part(5, 7)], (0,), (1,), []),
    ("a small part with new keys", [big(0, 100), part(5, 500, 501)], (0,), (1,), [500, 501]),
    ("a small part sharing no key is direct too", [big(0, 100), part(5, 500), part(500, 600)], (0, 2), (1,), []),
    ("a key twice in the biggest part", [part(*range(50), 3), big(100, 60)], (1,), (0,), list(range(50))),
    ("two overlapping big parts", [big(0, 100), big(50, 60), part(1)], (0,), (1, 2), list(range(100, 110))),
    ("the small side bigger than the direct one", [big(0, 10), big(5, 10), big(8, 10)], None, None, None),
    ("every part holds a key twice", [part(1, 1), part(2, 2)], None, None, None),
]


@pytest.mark.parametrize(("case", "parts", "direct", "small", "alone"), CASES, ids=[c[0] for c in CASES])
def test_choose_roads(case: str, parts: list[pa.Table], direct, small, alone) -> None:  # noqa: ANN001
    roads = choose_roads(parts, ["p", "k"])
    if direct is None:
        assert roads is None, case
        return
    assert roads is not None, case
    assert (roads.direct, roads.small) == (direct, small), case
    if alone is None:
        assert roads.small_only is None, case
    else:
        assert roads.small_only is not None
        assert sorted(roads.small_only.column("k").to_pylist()) == alone, case


def test_the_small_side_is_bounded() -> None:
    parts = [big(0, 1000), part(*range(900, 1000))]
    assert choose_roads(parts, ["p", "k"], small_max=99) is None
    roads = choose_roads(parts, ["p", "k"], small_max=100)
    assert roads is not None and roads.direct == (0,)


def test_only_the_biggest_parts_are_candidates() -> None:
    parts = [big(0, 100), big(100, 10), big(200, 10)]
    roads = choose_roads(parts, ["p", "k"], candidates=2)
    assert roads is not None and (roads.direct, roads.small) == ((0, 1), (2,))


def meta(stats: dict, name: str = "p1") -> PartMeta:
    return PartMeta(
        name=name,
        table="t",
        partition=(),
        path=f"t/_/{name}.parquet",
        rows=1,
        size=1,
        checksum="crc32:00000000",
        stats=stats,
    )


# (case, direct parts' version ranges, small parts', overlay?)
OVERLAYS = [
    ("upserts after the bulk", [(2, 2), (3, 3)], [(4, 4), (9, 9)], True),
    ("a compaction's output, then upserts", [(2, 7)], [(8, 8)], True),
    ("a small part older than a direct one", [(2, 2), (5, 5)], [(4, 4)], False),
    ("the same CSN (one transaction's two parts): _seq decides", [(4, 4)], [(4, 4)], False),
    ("a compaction's output spanning a small part", [(2, 9)], [(5, 5)], False),
    ("no small part", [(2, 2)], [], False),
    ("a direct part without _ver statistics", [None], [(4, 4)], False),
    ("a small part without _ver statistics", [(2, 2)], [None], False),
]


@pytest.mark.parametrize(("case", "direct", "small", "expected"), OVERLAYS, ids=[c[0] for c in OVERLAYS])
def test_overlay(case: str, direct, small, expected: bool) -> None:  # noqa: ANN001
    assert overlay(direct, small) is expected, case


def test_version_and_op_ranges_from_statistics() -> None:
    assert version_range(meta({OP: (0, 0)}), 7) == (7, 7)  # a transaction's part: its creation CSN
    assert version_range(meta({OP: (0, 1), VER: (3, 6)}), 9) == (3, 6)  # a compaction's output: its _ver
    assert version_range(meta({VER: (None, None)}), 9) is None
    assert op_range(meta({OP: (0, 0)})) == (0, 0)
    assert op_range(meta({OP: (1, 3)})) == (1, 3)
    assert op_range(meta({})) == (0, 4)  # no statistics: any op, locks included
    assert op_range(meta({OP: (None, None)})) == (0, 4)


def reference(parts: list[list[tuple]], candidates: int, small_max: int) -> tuple | None:
    """choose_roads in plain Python sets: the rule it implements."""
    ranked = sorted(range(len(parts)), key=lambda i: -len(parts[i]))
    direct: list[int] = []
    taken: set[tuple] = set()
    for i in [i for i in ranked[:candidates] if parts[i]]:
        keys = set(parts[i])
        if len(keys) == len(parts[i]) and not keys & taken:
            direct.append(i)
            taken |= keys
    small = [i for i in range(len(parts)) if i not in direct]
    n_small = sum(len(parts[i]) for i in small)
    if not direct or n_small > small_max or n_small > sum(len(parts[i]) for i in direct):
        return None
    alone = {k for i in small for k in parts[i]} - taken
    return tuple(sorted(direct)), tuple(small), sorted(alone) if small else None


@pytest.mark.parametrize("seed", range(120))
def test_choose_roads_equals_the_rule_on_random_parts(seed: int) -> None:
    """Random parts (one or two key columns, keys held by up to all the parts, a key twice in a
    part, empty parts): the single sort's answer is the greedy rule's, pairs of parts at any
    distance in a run of equal keys included."""
    rng = random.Random(seed)
    two = seed % 2 == 0
    parts = []
    for _ in range(rng.randrange(1, 9)):
        n = rng.choice([0, 1, 3, 10, 40, 120])
        span = rng.choice([20, 200, 5000])
        if rng.random() < 0.7:  # each key once in the part
            keys = rng.sample(range(span), min(n, span))
        else:
            keys = [rng.randrange(span) for _ in range(n)]
        parts.append([(rng.choice("ab") if two else "x", k) for k in keys])
    candidates, small_max = rng.choice([8, 3]), rng.choice([1_000_000, 50])
    tables = [pa.table({"p": [k[0] for k in ks], "k": pa.array([k[1] for k in ks], pa.int64())}) for ks in parts]
    got = choose_roads(tables, ["p", "k"] if two else ["k"], candidates=candidates, small_max=small_max)
    want = reference(parts, candidates, small_max)
    if want is None:
        assert got is None
        return
    assert got is not None
    only = None
    if got.small_only is not None:
        cols = got.small_only.to_pydict()
        only = sorted(zip(cols["p"], cols["k"])) if two else sorted(("x", k) for k in cols["k"])
    assert (got.direct, got.small, only) == want


# (case, every part's version range, the direct parts, those the overlay road keeps)
OVERLAID = [
    ("all direct parts older", [(2, 2), (3, 3), (5, 5)], [0, 1], [0, 1]),
    ("a direct part of the small parts' transaction", [(2, 2), (5, 5), (5, 5)], [0, 1], [0]),
    ("a newer big part", [(2, 2), (4, 4), (7, 7)], [0, 2], [0]),
    ("moving one moves the cut", [(2, 2), (3, 6), (5, 5), (4, 4)], [0, 1, 2], [0]),
    ("no direct part older", [(5, 5), (4, 4)], [0], []),
    ("a part without statistics outside", [(2, 2), None], [0], []),
]


@pytest.mark.parametrize(("case", "ranges", "direct", "kept"), OVERLAID, ids=[c[0] for c in OVERLAID])
def test_overlaid(case: str, ranges, direct, kept) -> None:  # noqa: ANN001
    assert overlaid(ranges, direct) == kept, case


def test_choose_roads_among_allowed_parts() -> None:
    parts = [big(0, 100), big(100, 50), part(5, 7)]
    roads = choose_roads(parts, ["p", "k"], allowed=[0])
    assert roads is not None and (roads.direct, roads.small) == ((0,), (1, 2))
    assert roads.small_only is not None and sorted(roads.small_only.column("k").to_pylist()) == list(range(100, 150))


@st.composite
def files(draw: st.DrawFn) -> list[tuple[int, int, np.ndarray]]:
    """Files as ``(size, rows, dead rows)``: sizes from a few (so that files share them) or
    large, dead rows from a few patterns (so that files of one size may share them)."""
    out = []
    for _ in range(draw(st.integers(1, 6))):
        size = draw(st.sampled_from([10, 11, 12, 2**40, 2**62])) if draw(st.booleans()) else draw(st.integers(0, 2**20))
        rows = draw(st.integers(0, 40))
        dead = draw(st.sampled_from([[], [0], [0, 3], list(range(0, 40, 7))]))
        out.append((size, rows, np.array([d for d in dead if d < rows], np.int64)))
    return out


@settings(max_examples=500, deadline=None)
@given(files())
def test_row_keys_of_dead_rows_name_exactly_them(fs: list[tuple[int, int, np.ndarray]]) -> None:
    """spark.native.row_key_shift: with its shift, ``(size << shift) + row`` of the dead rows
    names exactly the dead rows of every file (no live row shares an integer with a dead one),
    all within a signed 64-bit integer; None only when two files of one size have different
    dead rows or the largest size does not fit once shifted."""
    sizes, rows, dead = [f[0] for f in fs], [f[1] for f in fs], [f[2] for f in fs]
    shift = row_key_shift(sizes, rows, dead)
    if shift is None:
        fits = max(sizes) < 1 << (63 - max(max(rows), 1).bit_length())
        shared = {}
        assert not fits or any(not np.array_equal(shared.setdefault(s, d), d) for s, d in zip(sizes, dead))
        return
    gone = {(s << shift) + int(r) for s, d in zip(sizes, dead) for r in d}
    assert all(k < 2**63 for s, n in zip(sizes, rows) for k in [(s << shift) + n])
    for s, n, d in fs:
        named = {r for r in range(n) if (s << shift) + r in gone}
        assert named == set(d.tolist())
