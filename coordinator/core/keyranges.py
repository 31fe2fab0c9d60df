"""Key ranges for reading a keys table in bounded memory.

A keys table's read folds every version of a key (coordinator/core/keyfold.py), so folding a
whole partition at once needs all its versions in memory, several times over while the fold
sorts and takes. A key lives in one partition and the fold is per key, so any split of a
partition's key space into ranges folds range by range to the same rows: ``scan`` reads every
part restricted to one range (``lo <= key < hi`` on the first key column that is not a partition column), folds, yields, and
drops it before the next. These are the pure rules: how many ranges a partition needs for a
memory budget, where their bounds fall (quantiles of a sample of keys), and which rows or
Parquet row groups a range holds.

A range is cut on that one column only: a partition where it has few
distinct values (fewer than the ranges it would need) gets fewer, larger ranges. That is the
one case where the budget is not kept; the rows are right whatever the split.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

DEFAULT_BUDGET = 256 << 20  # bytes a keys-table scan aims to keep in memory at once
MIN_BUDGET = 1 << 20
# Peak memory of a fold over the versions it is given (concat, sort, take, the fold's per-column
# index arrays and its output), measured on int/float/string tables in
# tests/unit/test_keys_scan.py: about 3-4x; 5 leaves room for Parquet's decode buffers.
FOLD_FACTOR = 5
# A part's file expands on decode by at most about this much (Parquet's dictionary and RLE
# encodings, zstd): below budget / (FOLD_FACTOR * this) of files a partition is one range
# without looking inside a file.
EXPANSION = 16
SAMPLES_PER_RANGE = 64
MAX_SAMPLES = 1 << 16


def ranges_needed(decoded_bytes: int, budget: int) -> int:
    """How many key ranges a partition whose versions decode to ``decoded_bytes`` needs so that
    each one's fold fits ``budget`` (at least 1)."""
    return max(1, math.ceil(decoded_bytes * FOLD_FACTOR / max(1, budget)))


def surely_fits(file_bytes: int, budget: int) -> bool:
    """Whether files of ``file_bytes`` in all fold in ``budget`` whatever their encoding."""
    return file_bytes * EXPANSION * FOLD_FACTOR <= budget


def sample_stride(rows: int, total_rows: int, ranges: int) -> int:
    """Every how many rows of a part of ``rows`` (of ``total_rows`` in its partition) to sample a
    key so that the partition gives about :data:`SAMPLES_PER_RANGE` per range."""
    wanted = min(MAX_SAMPLES, ranges * SAMPLES_PER_RANGE)
    return max(1, (max(1, total_rows) + wanted - 1) // wanted)


def bounds(sample: pa.Array | pa.ChunkedArray, ranges: int) -> list[Any]:
    """The inner bounds (ascending, distinct Python values) cutting the sampled keys into
    ``ranges`` ranges of about equal size: range i holds keys in [bounds[i-1], bounds[i]), the
    first from the lowest key, the last to the highest. Fewer bounds when the sample has fewer
    distinct values; none for one range."""
    if ranges <= 1 or len(sample) == 0:
        return []
    ordered = pc.take(sample, pc.sort_indices(sample)).to_pylist()
    out: list[Any] = []
    for i in range(1, ranges):
        v = ordered[min(len(ordered) - 1, i * len(ordered) // ranges)]
        if (not out or v > out[-1]) and v > ordered[0]:
            out.append(v)
    return out


def spans(inner: Sequence[Any]) -> list[tuple[Any, Any]]:
    """``(lo, hi)`` of each range the inner bounds make, None for an open end."""
    ends: list[Any] = [None, *inner, None]
    return list(zip(ends[:-1], ends[1:]))


def in_range(column: pa.Array | pa.ChunkedArray, lo: Any, hi: Any) -> pa.Array | None:
    """Which values of a key column lie in ``[lo, hi)`` (None: all of them)."""
    mask = None
    if lo is not None:
        mask = pc.greater_equal(column, pa.scalar(lo, column.type))
    if hi is not None:
        below = pc.less(column, pa.scalar(hi, column.type))
        mask = below if mask is None else pc.and_(mask, below)
    return mask


def kept(column: pa.Array | pa.ChunkedArray, lo: Any, hi: Any, first: int, dead: np.ndarray | None) -> pa.Array | None:
    """Which rows of a batch (its key ``column``; its first row the part's row ``first``) lie in
    ``[lo, hi)`` and are not among ``dead`` (the part's deleted row numbers; None: none), or
    None: all of them."""
    mask = in_range(column, lo, hi)
    if dead is None or not len(dead):
        return mask
    live = ~np.isin(np.arange(first, first + len(column), dtype=np.int64), dead)
    return pa.array(live) if mask is None else pc.and_(mask, pa.array(live))


def may_overlap(lo_stat: Any, hi_stat: Any, lo: Any, hi: Any) -> bool:
    """Whether a row group whose key column spans [``lo_stat``, ``hi_stat``] (its footer
    statistics; None: unknown) may hold a key in [``lo``, ``hi``)."""
    if lo_stat is None or hi_stat is None:
        return True
    try:
        if hi is not None and lo_stat >= hi:
            return False
        if lo is not None and hi_stat < lo:
            return False
    except TypeError:  # statistics of another Python type than the bounds: read it
        return True
    return True
