"""The outcome window (docs/rules.md#outcomes, replicas/state.py): ``tid -> csn`` holds the
commits of the last ``outcome_seconds`` (by their log entry's time, never ahead of the replica's
clock), its checkpoints carry only that, and a transaction below the window's floor is told
committed only by a part record that names it. Pure: no ZooKeeper, no storage.
"""

from __future__ import annotations

import pytest
from support.builders import change, entry, part, table_def, tid  # tests/ is on sys.path

from coordinator.core.conflicts import Kind
from coordinator.errors import CorruptMetadata
from replicas.state import ReplicaState

WINDOW = 10.0
COMMITS = 1000


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def committed(n: int = COMMITS, window: float = WINDOW) -> tuple[ReplicaState, Clock]:
    """CSN 1 creates t; CSN c (2..n+1) commits T<c-1>-c-r0 at time c, the first adding part p2."""
    clock = Clock()
    st = ReplicaState(window, clock)
    st.apply(1, 0, 0, entry(ddl=[table_def("t", partitioned=False)], time=1.0))
    for csn in range(2, n + 2):
        clock.now = float(csn)
        t = tid(csn, start_csn=csn - 1)
        added = [part(f"p{csn}", creator=t)] if csn == 2 else []
        st.apply(csn, 0, csn - 1, entry((t, [change("t", (), [Kind.INSERT], added=added)]), time=float(csn)))
    return st, clock


def test_the_map_holds_the_window_not_history() -> None:
    st, _ = committed()
    last = COMMITS + 1
    # Entries of the last WINDOW seconds (times last-10 .. last) are kept, older ones forgotten.
    assert sorted(st.tid_csn.values()) == list(range(last - 10, last + 1))
    assert st.outcome_floor == last - 11
    assert st.outcome_counts() == {"remembered": 11, "floor": last - 11, "seconds": WINDOW}


def test_forgotten_is_told_by_the_tids_start_against_the_floor() -> None:
    st, _ = committed()
    floor = st.outcome_floor
    assert not st.forgotten(tid(99, start_csn=floor))  # would commit above the floor: remembered
    assert st.forgotten(tid(99, start_csn=floor - 1))
    assert not st.forgotten("not a tid")
    # Began at the floor and not in the map: did not commit (the old answer stands).
    assert st.commit_csn(tid(99, start_csn=floor)) is None
    # A forgotten commit whose part is still recorded is told by it; one without is not.
    assert st.commit_csn(tid(2, start_csn=1)) == 2
    assert st.commit_csn(tid(3, start_csn=2)) is None and st.forgotten(tid(3, start_csn=2))
    # A remembered one from the map.
    last = COMMITS + 1
    assert st.commit_csn(tid(last, start_csn=last - 1)) == last


def test_a_removing_transaction_is_told_by_the_removal_it_recorded() -> None:
    st, clock = committed(n=5, window=1.0)
    clock.now = 100.0
    remover = tid(500, start_csn=6)
    st.apply(7, 0, 6, entry((remover, [change("t", (), [Kind.OVERWRITE], removed=["p2"])]), time=100.0))
    clock.now = 200.0
    st.apply(8, 0, 7, entry((tid(501, start_csn=7), []), time=200.0))
    assert remover not in st.tid_csn and st.forgotten(remover)
    assert st.commit_csn(remover) == 7


def test_checkpoints_carry_only_the_window_and_its_floor() -> None:
    st, clock = committed()
    payload = st.export()
    assert len(payload["tids"]) == len(payload["outcome_csns"]) == 11
    back = ReplicaState(WINDOW, clock)
    back.restore(payload, "mem")
    assert back.tid_csn == st.tid_csn and back.outcome_floor == st.outcome_floor
    assert list(back.outcomes) == list(st.outcomes)
    # The restored window goes on forgetting from where it was.
    clock.now = 5000.0
    back.apply(COMMITS + 2, 0, COMMITS + 1, entry((tid(9999, start_csn=COMMITS + 1), []), time=5000.0))
    assert back.tid_csn == {tid(9999, start_csn=COMMITS + 1): COMMITS + 2}
    with pytest.raises(CorruptMetadata):
        ReplicaState().restore({**payload, "outcome_times": [1.0]}, "mem")


def test_a_checkpoint_written_before_the_window_restores_and_is_forgotten_from_its_newest_time() -> None:
    st, clock = committed(n=20, window=1e9)
    old = {k: v for k, v in st.export().items() if not k.startswith("outcome_")}
    back = ReplicaState(WINDOW, clock)
    back.restore(old, "mem")
    assert len(back.tid_csn) == 20 and back.outcome_floor == 0  # nothing forgotten yet: no guess
    clock.now = 1000.0
    back.apply(22, 0, 21, entry((tid(777, start_csn=21), []), time=1000.0))
    assert list(back.tid_csn) == [tid(777, start_csn=21)] and back.outcome_floor == 21


def test_an_entry_time_ahead_of_the_clock_forgets_nothing_early() -> None:
    st, clock = committed(n=20)
    before = dict(st.tid_csn)
    st.apply(22, 0, 21, entry((tid(888, start_csn=21), []), time=1e12))  # a clock far ahead wrote it
    assert set(before) <= set(st.tid_csn)


def test_nothing_is_forgotten_while_a_lost_answer_is_looked_up() -> None:
    st, clock = committed(n=20)
    with st.outcomes_kept():
        clock.now = 1000.0
        st.apply(22, 0, 21, entry((tid(888, start_csn=21), []), time=1000.0))
        assert len(st.tid_csn) == 12
    clock.now = 1001.0
    st.apply(23, 0, 22, entry((tid(889, start_csn=22), []), time=1001.0))
    assert sorted(st.tid_csn.values()) == [22, 23]


def test_unbounded_by_default() -> None:
    st = ReplicaState()
    for csn in range(1, 200):
        st.apply(csn, 0, csn - 1, entry((tid(csn, start_csn=csn - 1), []), time=float(csn)))
    assert len(st.tid_csn) == 199 and st.outcome_floor == 0
