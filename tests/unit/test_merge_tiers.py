"""The minor merge's choice by size tier (replicas/merges.py, ``size_tier``): pure, a table of cases."""

from __future__ import annotations

import pytest

from parts.model.meta import PartMeta
from replicas.merges import size_tier


def parts(*sizes: int) -> list[PartMeta]:
    return [
        PartMeta(
            name=f"p{i:02d}",
            table="t",
            partition=(),
            path=f"t/p{i:02d}.parquet",
            rows=1,
            size=s,
            checksum="c",
            creation_tid="T",
        )
        for i, s in enumerate(sizes)
    ]


@pytest.mark.parametrize(
    "sizes,min_parts,max_parts,picked",
    [
        ((), 4, 64, []),
        ((100, 100, 100), 4, 64, []),  # too few
        ((100, 120, 110, 130), 4, 64, [0, 1, 2, 3]),  # like sizes: one tier
        ((100,) * 10, 4, 6, [0, 1, 2, 3, 4, 5]),  # at most max_parts, in their order
        ((800, 100, 100, 100, 100), 4, 64, [1, 2, 3, 4]),  # the merged part (tier 3) is left alone
        ((450, 500, 100, 460, 100, 470), 4, 64, [0, 1, 3, 5]),  # tier 2 holds 4, tier 0 two
        ((100, 450, 500, 100, 460), 4, 64, []),  # no tier holds 4
        ((100, 250, 399, 1599), 2, 64, [1, 2]),  # tiers of 2: [100,200) [200,400) [400,800)...; 1599 in tier 3
        ((0, 0, 0), 2, 64, [0, 1, 2]),  # empty files: the base is 1 byte
        ((100, 100), 1, 64, []),  # min_parts below 2: never
    ],
)
def test_the_lowest_tier_with_enough_parts_is_merged(
    sizes: tuple, min_parts: int, max_parts: int, picked: list[int]
) -> None:
    ps = parts(*sizes)
    assert size_tier(ps, min_parts, max_parts) == [ps[i] for i in picked]


def test_each_row_is_rewritten_about_log_times() -> None:
    """8 new parts of 1 KB at a time, merged as the policy says until nothing is due: the bytes
    written by merges stay within log_8 of the history per byte inserted (it was history / 8)."""
    live = []
    written = inserted = 0
    n = 0
    for _ in range(4096 // 8):
        for _ in range(8):
            live.append(
                PartMeta(
                    name=f"p{n:05d}",
                    table="t",
                    partition=(),
                    path="x",
                    rows=1,
                    size=1000,
                    checksum="c",
                    creation_tid="T",
                )
            )
            n += 1
            inserted += 1000
        while picked := size_tier(live, 8, 64):
            size = sum(m.size for m in picked)
            written += size
            live = [m for m in live if m not in picked] + [
                PartMeta(
                    name=f"p{n:05d}",
                    table="t",
                    partition=(),
                    path="x",
                    rows=1,
                    size=size,
                    checksum="c",
                    creation_tid="T",
                )
            ]
            n += 1
    assert written <= 4 * inserted  # log_8(4096) = 4 levels
    assert len(live) <= 4 * 7 + 8
