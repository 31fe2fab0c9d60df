"""Which parts a background merge takes (coordinator/core/mergeplan.py): the small-part tiers as a
table of cases, and simulated sustained inserts: parts stay few and each byte is rewritten about
once per tier (merging every small part at once rewrote the whole partition at every merge)."""

from __future__ import annotations

import pytest

from coordinator.core import mergeplan

K = mergeplan.SMALL_TIER_BYTES
SMALL = 32 * 1024 * 1024  # merge_small_bytes' default


@pytest.mark.parametrize(
    ("sizes", "want"),
    [
        ([], []),
        ([100] * 3, []),  # fewer than min_parts (4) in tier 0
        ([100] * 4, [0, 1, 2, 3]),
        ([100, K, 100, 100, 100], [0, 1, 2, 3, 4]),  # few and little together: all of them
        ([100, 4 * K, 100, 100, 100], [0, 2, 3, 4]),  # more than 4 tier-0 sizes together: by tier
        ([K, 2 * K, 3 * K, 4 * K - 1], [0, 1, 2, 3]),  # tier 1: K .. 4K
        ([K, 100, 2 * K, 100, 3 * K, 100, 4 * K - 1, 100], [1, 3, 5, 7]),  # equal counts: the lowest
        ([K, 100, 2 * K, 100, 3 * K, 100, K, 100, K], [0, 2, 4, 6, 8]),  # five in tier 1, four in tier 0
        ([K - 1, K, K - 1, K], [0, 1, 2, 3]),  # two either side of tier 0's bound: few and little
        ([100] * 9, [0, 1, 2, 3, 4, 5]),  # at most max_parts (6), the first
        ([SMALL] * 8, []),  # parts past merge_small_bytes are not small
        ([SMALL - 1] * 4, [0, 1, 2, 3]),
    ],
)
def test_small_merge(sizes: list[int], want: list[int]) -> None:
    assert mergeplan.small_merge(sizes, SMALL, 4, 6) == want


def test_a_merge_takes_two_parts_at_least() -> None:
    assert mergeplan.small_merge([100] * 5, SMALL, 4, 1) == [0, 1]


def simulate(arrivals_per_merge: int, inserts: int, size: int = 1500) -> tuple[int, float]:
    """Inserts of ``size`` bytes arrive ``arrivals_per_merge`` at a time, one merge between
    (merge_min_parts 8, merge_max_parts 64, as the defaults); (most parts, bytes written by
    merges per byte inserted)."""
    parts: list[int] = []
    most, written = 0, 0
    for _ in range(inserts // arrivals_per_merge):
        parts += [size] * arrivals_per_merge
        most = max(most, len(parts))
        pick = mergeplan.small_merge(parts, SMALL, 8, 64)
        if pick:
            merged = sum(parts[i] for i in pick)
            written += merged
            chosen = set(pick)
            parts = [s for i, s in enumerate(parts) if i not in chosen] + [merged]
    return most, written / (inserts * size)


@pytest.mark.parametrize("arrivals", [1, 8, 40, 60])  # fewer than merge_max_parts: one merge can keep up
def test_sustained_inserts_keep_parts_few_and_rewrite_each_byte_once_per_tier(arrivals: int) -> None:
    most, amplification = simulate(arrivals, 200_000)
    # 300 MB in 1.5 kB parts: tiers 16 kB .. 32 MB of x8 are 5, so about 5 rewrites of each byte.
    assert amplification <= 7, amplification
    assert most <= 8 * 6 + 3 * arrivals, most  # a few per tier, and what arrives during a few merges


def test_merging_every_small_part_at_once_was_quadratic() -> None:
    """What the rule replaced, simulated the same way: the guarantee above is not a property of
    the simulation."""
    parts: list[int] = []
    written = 0
    for _ in range(20_000 // 40):
        parts += [1500] * 40
        if len(parts) >= 8:
            merged = sum(parts[:64])
            written += merged
            parts = parts[64:] + [merged]
    assert written / (20_000 * 1500) > 50
