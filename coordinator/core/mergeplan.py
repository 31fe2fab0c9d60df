"""Which parts of a partition a background merge takes (replicas/merges.py): pure rules, no I/O.

Parts are put in *size tiers* (each ``min_parts`` times the one below), and a merge takes parts of
one tier: a row is then rewritten about once per tier it climbs, so what merges write grows with
``n log n`` of what was inserted. Merging every small part at once rewrote the partition's merged
part each time, ``n**2``: under sustained 10-row inserts merges fell behind, visible parts piled
up and removed parts filled storage (benchmarks/soak.py, docs/architecture/replicas.md#maintenance-background-work-on-the-replicas).

* :func:`small_merge`: parts below ``merge_small_bytes`` of every table, tier 0 below
  :data:`SMALL_TIER_BYTES`. Of the tiers holding ``min_parts`` parts, the one holding the most
  is merged (the lowest on ties), so the tier fresh inserts land in, always full under load, does
  not starve the ones above: a tier grows by one part per merge of the tier below, and is merged
  once it holds more than the arrivals of one merge.
* :func:`tiered_merge`: a keys table's parts of ``merge_small_bytes`` and more, tiers from
  there up (a read folds every version of every part).
* :func:`inline_flush`: a partition's inlined parts (small writes carried in their log entries,
  docs/architecture/small-writes.md), all of them once they are many, large or old enough: the
  flush is a merge whose output is a part in storage. Everywhere else an inlined part counts as
  size 0 (tier 0): it is tinier than any part in storage in what a merge rewrites of it.
"""

from __future__ import annotations

from collections.abc import Sequence

SMALL_TIER_BYTES = 16 * 1024  # tier 0 of the small parts: a few hundred rows, a few merges of inserts


def _tier(size: int, base: int, factor: int) -> int:
    t, bound = 0, base
    while size >= bound:
        t, bound = t + 1, bound * factor
    return t


def small_merge(sizes: Sequence[int], small_bytes: int, min_parts: int, max_parts: int) -> list[int]:
    """Which of a partition's parts below ``small_bytes`` (their sizes, in the order given) to
    merge: tier 0 below :data:`SMALL_TIER_BYTES`, tier t from ``SMALL_TIER_BYTES *
    min_parts**(t-1)`` up to ``min_parts`` times that; of the tiers holding ``min_parts`` parts,
    the one holding the most (the lowest on ties), its first ``max_parts``. While the small parts
    are ``min_parts`` or more and hold at most ``min_parts`` tier-0 sizes together, all of them
    (a few small parts either side of a tier's bound are merged, and rewriting that little costs
    nothing). Indices into ``sizes``, in order; empty when nothing is due."""
    if min_parts < 2:
        return []
    small = [i for i, size in enumerate(sizes) if size < small_bytes]
    if len(small) >= min_parts and sum(sizes[i] for i in small) <= SMALL_TIER_BYTES * min_parts:
        return small[: max(2, max_parts)]
    tiers: dict[int, list[int]] = {}
    for i, size in enumerate(sizes):
        if size < small_bytes:
            tiers.setdefault(_tier(size, SMALL_TIER_BYTES, min_parts), []).append(i)
    full = [t for t in sorted(tiers) if len(tiers[t]) >= min_parts]
    if not full:
        return []
    most = max(full, key=lambda t: (len(tiers[t]), -t))
    return tiers[most][: max(2, max_parts)]


def tiered_merge(sizes: Sequence[int], small_bytes: int, min_parts: int, max_parts: int) -> list[int]:
    """Which of a keys-table partition's parts (their sizes, in commit order) to merge beside the
    minor merges of small ones: a read folds every version of every part, and parts past
    ``small_bytes`` are never minor-merged again, so under endless upserts they (and the
    versions they repeat) would pile up until a major merge. Parts of ``small_bytes`` and more
    are put in tiers by size (tier t: ``small_bytes * min_parts**t`` up to ``min_parts`` times
    that); the lowest tier holding ``min_parts`` parts is merged (its oldest ``max_parts``), so
    a partition keeps at most ``min_parts - 1`` parts per tier and the tiers grow with the log
    of its size. Indices into ``sizes``, in commit order; empty when nothing is due."""
    if small_bytes <= 0 or min_parts < 2:
        return []
    tiers: dict[int, list[int]] = {}
    for i, size in enumerate(sizes):
        if size >= small_bytes:
            tiers.setdefault(_tier(size, small_bytes * min_parts, min_parts), []).append(i)
    for t in sorted(tiers):
        if len(tiers[t]) >= min_parts:
            return tiers[t][: max(2, max_parts)]
    return []


def inline_flush(inlined: Sequence[tuple[int, float]], parts: int, size: int, seconds: float, now: float) -> bool:
    """Whether a partition's inlined parts (``(size, created_at)`` each) are due for a flush:
    ``parts`` of them or more, ``size`` bytes or more together, or the oldest ``seconds`` old
    or older at ``now``."""
    if not inlined:
        return False
    return len(inlined) >= parts or sum(s for s, _ in inlined) >= size or now - min(t for _, t in inlined) >= seconds
