"""The replica's sorted index of parts (replicas/applied_state.py ``SortedIndex``): values in key
order through inserts, replacements and removals across chunk splits and empty chunks, the kept
view shared until the next change, copies the caller may change, and keys left out."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from replicas.applied_state import SortedIndex

_KEYS = st.integers(0, 300).map(lambda i: f"p{i:04d}")
_STEPS = st.lists(st.tuples(st.sampled_from(["add", "remove", "view", "values"]), _KEYS, st.integers()), max_size=400)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(start=st.dictionaries(_KEYS, st.integers(), max_size=100), steps=_STEPS, without=st.sets(_KEYS, max_size=80))
def test_sorted_index_gives_the_values_in_key_order_after_every_change(
    start: dict[str, int], steps: list[tuple[str, str, int]], without: set[str]
) -> None:
    chunk, SortedIndex.CHUNK = SortedIndex.CHUNK, 4  # splits and emptied chunks within a few steps
    try:
        index, ref = SortedIndex(start.items()), dict(start)
        for op, key, value in steps:
            if op == "add":
                index.add(key, value)
                ref[key] = value
            elif op == "remove":
                index.remove(key)
                ref.pop(key, None)
            want = [ref[k] for k in sorted(ref)]
            if op == "view":
                seen = index.view()
                assert seen == want and index.view() is seen  # kept until the next change
            elif op == "values":
                copy = index.values()
                copy.append(object())  # the caller's to change: the index is not
                assert index.view() == want and len(index) == len(ref)
                assert index.values(without) == [ref[k] for k in sorted(ref) if k not in without]
                assert index.values(set(sorted(without)[:3])) == [
                    ref[k] for k in sorted(ref) if k not in sorted(without)[:3]
                ]
        assert index.values() == [ref[k] for k in sorted(ref)] and index.keys() == sorted(ref)
    finally:
        SortedIndex.CHUNK = chunk
