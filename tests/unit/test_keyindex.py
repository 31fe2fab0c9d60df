"""The key index of keys targets (coordinator/core/keyindex.py): which parts the key conflict
check verifies, looked up by the keys written. Tables of cases; the property that the indexed
check decides exactly as the per-part check is in tests/integration/test_keys_storage.py."""

from __future__ import annotations

import pytest

from coordinator.core.keyindex import KeyIndex, listed_keys


def _summary(*rows: list) -> dict:
    return {"lo": None, "hi": None, "m": 8, "k": 1, "bloom": "/w==", "exact": [list(r) for r in rows]}


LISTED = [
    (None, None),  # no summary (written before summaries): not listed
    ({"lo": None, "hi": None, "m": 8, "k": 1, "bloom": "/w=="}, None),  # a large part: no versions listed
    (_summary(), (0, [])),
    (_summary([1, 0, None], [2, 0, None], [1, 2, "a"]), (1, [(1,), (2,)])),  # distinct, first-seen order
    (_summary(["x", 3, 0, None]), (2, [("x", 3)])),
    (_summary([1, 0, None], ["x", 3, 0, None]), None),  # ragged rows: not trusted as a key list
]


@pytest.mark.parametrize(("summary", "want"), LISTED)
def test_listed_keys(summary: dict | None, want: tuple | None) -> None:
    assert listed_keys(summary) == want


def _index() -> KeyIndex:
    """csn 10: p1 writes 1, 2; csn 20: p2 writes 2, 3; csn 20: p3 is large (loose); csn 30: p4 is
    a compaction's output; csn 40: p5 writes 1; csn 50: p6 lists no version."""
    ix = KeyIndex()
    ix.add(10, "p1", _summary([1, 0, None], [2, 0, None]), False)
    ix.add(20, "p2", _summary([2, 0, None], [3, 3, None]), False)
    ix.add(20, "p3", {"lo": None, "hi": None, "m": 8, "k": 1, "bloom": "/w=="}, False)
    ix.add(30, "p4", _summary([1, 0, None]), True)
    ix.add(40, "p5", _summary([1, 1, "a"]), False)
    ix.add(50, "p6", _summary(), False)
    return ix


CANDIDATES = [
    # (snapshot, keys written, key columns, expected (csn, name, listed) in commit order)
    (0, [(1,)], 1, [(10, "p1", True), (20, "p3", False), (40, "p5", True)]),
    (0, [(2,)], 1, [(10, "p1", True), (20, "p2", True), (20, "p3", False)]),
    (0, [(3,), (2,)], 1, [(10, "p1", True), (20, "p2", True), (20, "p3", False)]),
    (10, [(1,), (2,)], 1, [(20, "p2", True), (20, "p3", False), (40, "p5", True)]),
    (20, [(1,)], 1, [(40, "p5", True)]),
    (20, [(9,)], 1, []),  # nobody wrote it: nothing to verify (the loose one is at or below 20)
    (0, [(9,)], 1, [(20, "p3", False)]),  # only the loose part is probed
    (50, [(1,), (2,), (3,)], 1, []),
    (0, [], 1, [(20, "p3", False)]),
    (0, [(1,)], 2, None),  # the parts list keys of one column, the table has two: probe every part
]


@pytest.mark.parametrize(("snapshot", "keys", "width", "want"), CANDIDATES)
def test_candidates(snapshot: int, keys: list[tuple], width: int, want: list | None) -> None:
    assert _index().candidates(snapshot, keys, width) == want


PRUNES = [
    # (floor, expected candidates for keys 1, 2, 3 at snapshot 0, entries left)
    (0, [(10, "p1", True), (20, "p2", True), (20, "p3", False), (40, "p5", True)], 6),
    (10, [(20, "p2", True), (20, "p3", False), (40, "p5", True)], 4),
    (20, [(40, "p5", True)], 1),
    (40, [], 0),
    (99, [], 0),
]


@pytest.mark.parametrize(("floor", "want", "left"), PRUNES)
def test_prune_forgets_what_is_at_or_below_the_floor(floor: int, want: list, left: int) -> None:
    ix = _index()
    ix.prune(floor)
    assert ix.candidates(0, [(1,), (2,), (3,)], 1) == want
    assert len(ix) == left
    assert ix.empty() == (left == 0)


def test_a_pruned_width_no_longer_forces_the_fallback() -> None:
    ix = _index()
    ix.add(60, "p7", _summary(["x", 1, 0, None]), False)
    assert ix.candidates(0, [(1,)], 1) is None
    ix.prune(60)
    assert ix.candidates(0, [(1,)], 1) == []
    ix.add(70, "p8", _summary([1, 0, None]), False)
    assert ix.candidates(60, [(1,)], 1) == [(70, "p8", True)]
