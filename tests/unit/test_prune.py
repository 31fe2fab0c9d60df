"""The replica state forgets what no served snapshot can see (ReplicaState.prune), so its size,
its lookups at older snapshots and its checkpoints do not grow with history. Pure: no I/O."""

from __future__ import annotations

import pyarrow as pa
import pytest

from coordinator.core.conflicts import Kind
from coordinator.core.errors import SnapshotUnavailable
from coordinator.core.versions import Tid
from coordinator.model.catalog import TableDef
from coordinator.model.records import Change, LogEntry, TxnRecord
from parts.model.meta import PartMeta
from replicas import checkpoint
from replicas.state import TIME_TRIM_BATCH, ReplicaState


def part(name: str, tid: str) -> PartMeta:
    return PartMeta(name, "t", (), f"t/_/{name}.parquet", 1, 1, "crc32:00000000", {}, tid)


def commit(st: ReplicaState, csn: int, n: int, added: list[str], removed: list[str]) -> None:
    tid = str(Tid(csn - 1, n, "r0"))
    kinds = (Kind.MINOR_COMPACT,) if removed else (Kind.INSERT,)
    change = Change("t", "[]", kinds, tuple(part(a, tid) for a in added), tuple(removed))
    st.apply(csn, 0, csn - 1, LogEntry(time=float(csn), versions={}, txns=(TxnRecord(tid, None, (change,)),)))


def build() -> ReplicaState:
    """CSN 1 creates t; 2, 3: insert p1, p2; 4: a merge replaces them by m1; 5: insert p3;
    6: a merge replaces m1 and p3 by m2."""
    st = ReplicaState()
    st.apply(1, 0, 0, LogEntry(time=1.0, versions={}, ddl=(TableDef.new("t", pa.schema([("k", pa.int64())])),)))
    commit(st, 2, 1, ["p1"], [])
    commit(st, 3, 2, ["p2"], [])
    commit(st, 4, 3, ["m1"], ["p1", "p2"])
    commit(st, 5, 4, ["p3"], [])
    commit(st, 6, 5, ["m2"], ["m1", "p3"])
    return st


def names(st: ReplicaState, snapshot: int) -> list[str]:
    return [m.name for m in st.visible("t", snapshot)]


def test_prune_forgets_only_what_no_served_snapshot_sees() -> None:
    st = build()
    before = {s: names(st, s) for s in range(4, 7)}
    assert st.prune(3) == 0 and set(st.parts) == {"p1", "p2", "m1", "p3", "m2"}
    assert st.prune(4) == 2  # p1, p2 were removed at 4
    assert set(st.parts) == {"m1", "p3", "m2"}
    assert {s: names(st, s) for s in range(4, 7)} == before  # every snapshot >= 4 reads the same
    assert st.winners("t", "[]", 4) and all(s.tid != str(Tid(3, 3, "r0")) for s in st.winners("t", "[]", 4))
    assert st.prune(4) == 0 and st.prune(2) == 0  # never lowered, never twice
    assert st.prune(6) == 2 and set(st.parts) == {"m2"} and names(st, 6) == ["m2"]


def test_prune_floor_never_passes_what_is_applied() -> None:
    st = build()
    st.prune(100)
    assert st.pruned == 6


def test_pruned_state_survives_a_checkpoint_and_keeps_pruning() -> None:
    st = build()
    st.prune(4)
    back = ReplicaState()
    back.restore(checkpoint.decode(checkpoint.encode(st.export()), "mem"), "mem")
    assert back.pruned == 4 and back.export() == st.export()
    assert back.prune(6) == 2 and set(back.parts) == {"m2"}


def timed(n: int) -> ReplicaState:
    """``n`` inserts at CSNs 2.., each with its CSN as time version."""
    st = ReplicaState()
    st.apply(1, 0, 0, LogEntry(time=1.0, versions={}, ddl=(TableDef.new("t", pa.schema([("k", pa.int64())])),)))
    for csn in range(2, n + 2):
        tid = str(Tid(csn - 1, 1, "r0"))
        change = Change("t", "[]", (Kind.INSERT,), (part(f"p{csn}", tid),), ())
        entry = LogEntry(time=float(csn), versions={}, txns=(TxnRecord(tid, float(csn), (change,)),))
        st.apply(csn, 0, csn - 1, entry)
    return st


def test_commit_times_are_forgotten_past_the_windows_in_batches() -> None:
    """The time index (as_of reads, changes by time) holds the windows' commits, not history."""
    assert TIME_TRIM_BATCH == 1000
    st = timed(5_000)
    st.prune(500)  # fewer than a batch below the floor: nothing forgotten, every time answered
    assert st.sizes()["time_versions"] == 5_000 and st.csn_at_time(3.5) == 3
    st.prune(4_000)
    assert st.sizes()["time_versions"] == 5_002 - 4_000  # CSNs 4,000 (the floor's: it stays) to 5,001
    assert st.csn_at_time(4_000.5) == 4_000 and st.csn_at_time(4_000.0) == 4_000
    with pytest.raises(SnapshotUnavailable, match="older than the commit times this replica keeps"):
        st.csn_at_time(3_999.5)  # never answered by a later commit (a read would see its rows)
    assert st.csn_at_time(100.0, strict=False) == 3_999  # a lower bound: the last one forgotten
    back = ReplicaState()
    back.restore(checkpoint.decode(checkpoint.encode(st.export()), "mem"), "mem")
    assert back.sizes()["time_versions"] == st.sizes()["time_versions"]
    with pytest.raises(SnapshotUnavailable):
        back.csn_at_time(100.0)


def test_catalog_changes_are_forgotten_past_the_floor_but_the_last() -> None:
    st = ReplicaState()
    schema = pa.schema([("k", pa.int64())])
    for csn in range(1, 6):  # five definitions of t (as alter_table makes), then inserts
        st.apply(csn, 0, csn - 1, LogEntry(time=float(csn), versions={}, ddl=(TableDef.new("t", schema),)))
    commit(st, 6, 1, ["p1"], [])
    assert st.sizes()["ddl_csns"] == 5 and st.last_ddl(6) == 5
    st.prune(6)
    assert st.sizes()["ddl_csns"] == 1 and st.last_ddl(6) == 5 and st.sizes()["catalog_records"] == 1


@pytest.mark.parametrize(
    ("gc_interval", "windows", "expected"),
    [
        (10.0, [3600.0], 10.0),  # the default: an hour's window leaves gc_interval as it is
        (10.0, [3600.0, 10.0], 2.5),  # a table's 10 s window: a pass every quarter of it
        (10.0, [3600.0, 2.0], 1.0),  # never closer than MIN_PASS_SECONDS
        (10.0, [0.0, 3600.0], 10.0),  # a window of 0 keeps only snapshots in use: gc_interval
        (10.0, [0.0, 0.5], 1.0),
        (0.0, [1.0], 0.0),  # gc_interval 0: never, whatever the windows
        (30.0, [], 30.0),
    ],
)
def test_cleanup_passes_come_often_enough_for_the_shortest_window(
    gc_interval: float, windows: list[float], expected: float
) -> None:
    """A removed part outlives its window by at most about a quarter of the window (and at least
    MIN_PASS_SECONDS): storage stays near the live data plus the window's removed parts."""
    from replicas.cleanup import MIN_PASS_SECONDS, pass_interval

    assert MIN_PASS_SECONDS == 1.0
    assert pass_interval(gc_interval, windows) == expected
