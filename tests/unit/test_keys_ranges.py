"""The key-range rules of a bounded-memory keys-table scan (coordinator/core/keyranges.py), as
tables of cases: how many ranges, where their bounds fall, which rows and row groups a range holds."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from coordinator.core import keyranges


@pytest.mark.parametrize(
    ("decoded", "budget", "ranges"),
    [(0, 100, 1), (20, 100, 1), (21, 100, 2), (1000, 100, 50), (10**9, 256 << 20, 19)],
)
def test_ranges_needed(decoded: int, budget: int, ranges: int) -> None:
    assert keyranges.ranges_needed(decoded, budget) == ranges


@pytest.mark.parametrize(
    ("values", "ranges", "inner"),
    [
        (list(range(1000)) * 3, 4, [250, 500, 750]),
        (list(range(1000)), 1, []),
        ([], 4, []),
        (["a"] * 50, 4, []),  # one distinct value: one range
        (["a"] * 50 + ["b"] * 50, 4, ["b"]),  # fewer distinct values than ranges: fewer ranges
        (["d", "a", "c", "b"], 4, ["b", "c", "d"]),
        ([5, 5, 5, 1], 2, [5]),
    ],
)
def test_bounds(values: list, ranges: int, inner: list) -> None:
    sample = pa.array(values, pa.string() if values and isinstance(values[0], str) else pa.int64())
    assert keyranges.bounds(sample, ranges) == inner


@pytest.mark.parametrize("inner", [[], [3], [2, 5, 9], [0], [100]])
def test_every_key_falls_in_one_range(inner: list) -> None:
    keys = pa.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 9], pa.int64())
    hits = pa.repeat(pa.scalar(0, pa.int64()), len(keys))
    for lo, hi in keyranges.spans(inner):
        mask = keyranges.in_range(keys, lo, hi)
        mask = pa.repeat(pa.scalar(True), len(keys)) if mask is None else mask
        hits = pc.add(hits, mask.cast(pa.int64()))
    assert hits.to_pylist() == [1] * len(keys)


@pytest.mark.parametrize(
    ("stats", "span", "overlaps"),
    [
        ((0, 9), (None, None), True),
        ((0, 9), (10, None), False),
        ((0, 9), (9, None), True),
        ((0, 9), (None, 0), False),
        ((0, 9), (None, 1), True),
        ((None, None), (10, 20), True),  # no statistics: read it
        (("a", "c"), ("d", None), False),
        ((0, 9), ("a", None), True),  # another type: read it
    ],
)
def test_may_overlap(stats: tuple, span: tuple, overlaps: bool) -> None:
    assert keyranges.may_overlap(*stats, *span) is overlaps


@pytest.mark.parametrize(
    ("rows", "total", "ranges", "stride"), [(100, 100, 1, 2), (10**6, 10**7, 20, 7813), (10, 10, 5, 1)]
)
def test_sample_stride(rows: int, total: int, ranges: int, stride: int) -> None:
    assert keyranges.sample_stride(rows, total, ranges) == stride


@pytest.mark.parametrize(
    ("lo", "hi", "first", "dead", "want"),
    [
        (None, None, 0, None, None),  # everything: no mask
        (None, None, 0, np.array([], np.int64), None),
        (None, None, 10, np.array([3, 11, 14, 99], np.int64), [True, False, True, True, False]),
        (2, None, 0, None, [False, False, True, True, True]),
        (1, 4, 100, np.array([102], np.int64), [False, True, False, True, False]),
        (None, 3, 5, np.array([0, 1, 2, 3, 4], np.int64), [True, True, True, False, False]),
    ],
)
def test_kept_rows_lie_in_the_range_and_are_not_dead(lo, hi, first, dead, want) -> None:
    """Of a batch of keys 0-4 whose first row is the part's row ``first``: those in [lo, hi)
    whose row number is not in the part's deletion vector ``dead``."""
    got = keyranges.kept(pa.array([0, 1, 2, 3, 4], pa.int64()), lo, hi, first, dead)
    assert (got if got is None else got.to_pylist()) == want
