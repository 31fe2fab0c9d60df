"""spark.keysfold.choose_roads (issue 24): which parts of a keys table Spark reads as they are
(no fold, no shuffle) and which it folds and broadcasts; pure Arrow, no Spark. A table of cases:
each says the parts' keys (one list a part) and the roads expected."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark.keysfold import choose_roads


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
