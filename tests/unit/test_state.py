"""The replica's pure parts: its state (replicas/state.py: everything derived from the log) and
a transaction's effect (replicas/running.py: staged operations folded into what the commit
entry carries and the conflict rules look at).

No ZooKeeper, no storage. The visibility rule (docs/rules.md#visibility), exhaustively against the
state, is tests/unit/test_rules.py's; the conflict rules and batching decisions over summaries
(fits_beside) are tests/unit/test_rules.py's and tests/unit/test_targets.py's; the checkpoint file format is
tests/integration/test_log_tail.py's. Staged operations are built by ``support.builders.staged`` only."""

from __future__ import annotations

import copy

import pytest
from support.builders import change, entry, part, staged, table_def, tid  # tests/ is on sys.path

from coordinator.core.conflicts import Kind, Summary, fits_beside
from coordinator.core.versions import Tid
from coordinator.errors import CorruptMetadata
from coordinator.model.records import Change
from replicas.running import Effect, RunningTxn
from replicas.state import ReplicaState

A, B, C, R = tid(1), tid(2), tid(3), tid(4)
P1, P2 = "[1]", "[2]"


def names(metas: list) -> list[str]:
    return [m.name for m in metas]


def built() -> ReplicaState:
    """CSN 1 creates t (partitioned by p); 2: A adds a1 (p=1), a2 (p=2); 3: B overwrites p=1
    (removes a1, adds b1); 4: a compaction C of p=2 (a2 -> c2, no time version)."""
    st = ReplicaState()
    st.apply(1, 0, 0, entry(ddl=[table_def("t")], versions={"t": 0}))
    st.apply(
        2,
        0,
        1,
        entry(
            (
                A,
                [
                    change("t", (1,), [Kind.INSERT], added=[part("a1", partition=(1,), creator=A)]),
                    change("t", (2,), [Kind.INSERT], added=[part("a2", partition=(2,), creator=A)]),
                ],
            ),
            time=2.0,
            time_version=2.0,
        ),
    )
    st.apply(
        3,
        0,
        2,
        entry(
            (B, [change("t", (1,), [Kind.OVERWRITE], added=[part("b1", partition=(1,), creator=B)], removed=["a1"])]),
            versions={f"t/{P1}": 1},
            time=3.0,
            time_version=3.0,
        ),
    )
    st.apply(
        4,
        0,
        3,
        entry(
            (
                C,
                [
                    change(
                        "t", (2,), [Kind.MINOR_COMPACT], added=[part("c2", partition=(2,), creator=C)], removed=["a2"]
                    )
                ],
            ),
            versions={f"t/{P2}": 1},
            time=4.0,
            time_version=None,
        ),
    )
    return st


# =============================================================================================
# The replica state
# =============================================================================================


def test_apply_records_position_tables_and_commits() -> None:
    st = built()
    assert st.applied == 4 and st.position == (0, 4) and st.applied_count == 4
    assert st.tid_csn == {A: 2, B: 3, C: 4}
    assert st.table("t").created_csn == 1
    assert st.table("t", snapshot=0) is None and st.table("t", snapshot=1) is not None
    assert st.table("nosuch") is None
    rec = st.parts["a1"]
    assert (rec.creation_csn, rec.removal_tid, rec.removal_csn, rec.pkey) == (2, B, 3, P1)
    assert st.parts["b1"].removal_csn is None


@pytest.mark.parametrize(
    "snapshot,visible",
    [
        (0, []),
        (1, []),
        (2, ["a1", "a2"]),
        (3, ["a2", "b1"]),
        (4, ["b1", "c2"]),
        (99, ["b1", "c2"]),
    ],
)
def test_visible_at_each_snapshot(snapshot: int, visible: list[str]) -> None:
    """Older snapshots take the slow path (every record), the latest the sorted live index:
    both answer in name order."""
    assert names(built().visible("t", snapshot)) == visible


def test_visible_in_chosen_partitions_and_with_own_writes() -> None:
    st = built()
    assert names(st.visible("t", 4, pkeys=[P2])) == ["c2"]
    assert names(st.visible("t", 2, pkeys=[P1])) == ["a1"]
    assert names(st.visible("t", 4, pkeys=[])) == []
    own = part("r1", partition=(1,), creator=R)
    # A running reader R sees its own part and not what it removed, on both paths.
    assert names(st.visible("t", 4, R, [own], {"b1"})) == ["c2", "r1"]
    assert names(st.visible("t", 2, R, [own], {"a2"})) == ["a1", "r1"]
    assert names(st.visible("t", 2, R, [own], set(), pkeys=[P2])) == ["a2"]
    assert names(st.visible("other", 4)) == []


def test_versions_only_go_up() -> None:
    st = built()
    assert st.versions == {"t": 0, f"t/{P1}": 1, f"t/{P2}": 1}
    st.apply(5, 0, 4, entry((R, []), versions={f"t/{P1}": 0, f"t/{P2}": 2}))
    assert st.versions == {"t": 0, f"t/{P1}": 1, f"t/{P2}": 2}


def test_winners_are_the_commits_on_one_target_after_a_snapshot() -> None:
    st = built()
    assert st.winners("t", P1, 1) == [
        Summary(A, frozenset({Kind.INSERT})),
        Summary(B, frozenset({Kind.OVERWRITE}), frozenset({"a1"})),
    ]
    assert st.winners("t", P1, 2) == [Summary(B, frozenset({Kind.OVERWRITE}), frozenset({"a1"}))]
    assert st.winners("t", P1, 3) == []
    assert st.winners("t", P2, 2) == [Summary(C, frozenset({Kind.MINOR_COMPACT}), frozenset({"a2"}))]
    assert st.winners("t", "[3]", 0) == [] and st.winners("u", P1, 0) == []
    assert sorted(st.conflict_history) == [("t", P1), ("t", P2)]


@pytest.mark.parametrize(
    "after,removed",
    [(0, ["a1", "a2"]), (2, ["a1", "a2"]), (3, ["a2"]), (4, [])],
)
def test_removed_after_a_csn(after: int, removed: list[str]) -> None:
    assert sorted(r.meta.name for r in built().removed_after(after)) == removed


@pytest.mark.parametrize("count,newest", [(0, []), (1, ["c2"]), (2, ["c2", "b1"]), (9, ["c2", "b1"])])
def test_newest_live_parts(count: int, newest: list[str]) -> None:
    assert [r.meta.name for r in built().newest_live(count)] == newest


def test_the_part_readers_named_for_other_modules() -> None:
    """What cleanup, the registry, the parts listing and the changefeed read under the state lock."""
    st = built()
    assert st.part("a1") is st.parts["a1"] and st.part("nosuch") is None
    assert st.created_by("t", A) == {"a1", "a2"} and st.created_by("t", "nosuch") == set()
    assert st.created_by("nosuch", A) == set()
    applied, recs = st.listing("t")
    assert applied == 4 and [r.meta.name for r in recs] == ["a1", "a2", "b1", "c2"]
    assert recs[0] == st.parts["a1"] and recs[0] is not st.parts["a1"]  # a copy, read under the lock
    assert st.listing("nosuch") == (4, [])
    recs, history = st.changes_of("t")
    assert sorted(r.meta.name for r in recs) == ["a1", "a2", "b1", "c2"]
    assert {pk: [csn for csn, _ in ev] for pk, ev in history.items()} == {P1: [2, 3], P2: [2, 4]}
    assert st.changes_of("nosuch") == ([], {})


def test_csn_at_time_counts_data_changing_commits_only() -> None:
    st = built()  # the compaction at CSN 4 has no time version
    assert [st.csn_at_time(w) for w in (0.5, 2.0, 2.5, 3.0, 100.0)] == [0, 2, 2, 3, 3]


def test_an_entry_at_or_below_applied_is_skipped() -> None:
    st = built()
    before = st.export()
    again = entry(
        (A, [change("t", (1,), [Kind.INSERT], added=[part("zz", partition=(1,), creator=A)])]), versions={"t": 9}
    )
    st.apply(4, 0, 3, again)  # the entry at applied, again
    st.apply(2, 0, 1, again)  # an older one
    assert st.export() == before and st.applied_count == 4
    assert "zz" not in st.parts


def test_removing_a_part_the_state_never_had_is_no_error() -> None:
    st = built()
    st.apply(5, 0, 4, entry((R, [change("t", (1,), [Kind.MUTATE], removed=["ghost", "b1"])])))
    assert "ghost" not in st.parts and st.parts["b1"].removal_csn == 5
    assert names(st.visible("t", 5)) == ["c2"]


def test_advance_epoch_moves_the_position_forward_only() -> None:
    st = built()
    st.advance_epoch(0)
    assert st.position == (1, 0)
    st.advance_epoch(0)
    assert st.position == (1, 0)
    st.apply(2**31 + 1, 1, 0, entry((R, [])))
    assert st.position == (1, 1)


def test_wait_applied_and_versions_answer_at_once_when_there() -> None:
    st = built()
    assert st.wait_applied(4, 0) and not st.wait_applied(5, 0)
    assert st.wait_versions({f"t/{P1}": 1, "t/[9]": None}, 0)
    assert not st.wait_versions({f"t/{P1}": 2}, 0)


def test_export_restore_round_trip() -> None:
    st = built()
    back = ReplicaState()
    back.restore(copy.deepcopy(st.export()), "mem")
    assert back.export() == st.export()
    assert (back.applied, back.position, back.tid_csn, back.versions) == (
        st.applied,
        st.position,
        st.tid_csn,
        st.versions,
    )
    assert back.table("t") == st.table("t")
    for snapshot in range(6):
        assert back.visible("t", snapshot) == st.visible("t", snapshot)
        for pkey in (P1, P2):
            assert back.winners("t", pkey, snapshot) == st.winners("t", pkey, snapshot)
    assert back.csn_at_time(3.5) == st.csn_at_time(3.5)
    # ... and it carries on from there as the original does.
    nxt = entry((R, [change("t", (2,), [Kind.OVERWRITE], removed=["c2"])]), versions={f"t/{P2}": 2})
    for s in (st, back):
        s.apply(5, 0, 4, nxt)
    assert back.export() == st.export()
    # A point read's probe is given the live parts in creation order (a0, committed last, last),
    # restored alike.
    later = entry((R, [change("t", (2,), [Kind.INSERT], added=[part("a0", partition=(2,), creator=R)])]))
    for s in (st, back):
        s.apply(6, 0, 5, later)
        assert _probed(s, 6) == ["b1", "a0"] and names(s.visible("t", 6)) == ["a0", "b1"]


def _probed(state: ReplicaState, snapshot: int) -> list[str]:
    """The parts a point read's probe (``visible``'s ``keep``) is given at ``snapshot``."""
    seen: list[str] = []

    def keep(metas: list, at: int) -> list:
        seen.extend(m.name for m in metas)
        return metas

    state.visible("t", snapshot, keep=keep)
    return seen


def test_restore_of_a_checkpoint_written_without_a_part_field_takes_its_default() -> None:
    payload = built().export()
    parts = payload["parts"]
    parts["fields"].remove("created_at")
    del parts["created_at"]
    back = ReplicaState()
    back.restore(payload, "old")
    assert {m.created_at for m in back.visible("t", 4)} == {0.0}
    assert names(back.visible("t", 4)) == ["b1", "c2"]


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: p.pop("history"),
        lambda p: p["parts"].pop("removal_csn"),
        lambda p: p["parts"]["creation_csn"].pop(),
        lambda p: p["parts"]["stats_values"].append(7),
        lambda p: p.update(applied="many"),
        lambda p: p["history"]["kind_sets"].append(["BOGUS"]),
    ],
    ids=["no-history", "no-column", "short-column", "stats-misshaped", "bad-applied", "bad-kind"],
)
def test_a_malformed_checkpoint_leaves_the_state_untouched(damage) -> None:
    st = built()
    payload = st.export()
    damage(payload)
    before = st.export()
    with pytest.raises(CorruptMetadata, match="checkpoint mem-7 is malformed"):
        st.restore(payload, "mem-7")
    assert st.export() == before


# =============================================================================================
# Effects: a transaction's staged operations, folded
# =============================================================================================

COMMITTED = {"b1": P1, "c2": P2}  # committed parts a transaction may remove, and their targets


def fold(*ops) -> Effect:
    """What the committer does: fold each operation in, committed parts' targets looked up."""
    eff = Effect()
    for op in ops:
        eff.add_op(op, {n: COMMITTED[n] for n in op.removed if n not in eff.added})
    return eff


def test_an_insert_adds_parts_on_their_targets() -> None:
    eff = fold(staged("insert", added=[part("n1", partition=(1,)), part("n2", partition=(2,))]))
    assert sorted(eff.added) == ["n1", "n2"] and not eff.removed and not eff.whole_tables
    assert eff.kinds == {("t", P1): {Kind.INSERT}, ("t", P2): {Kind.INSERT}}


def test_removing_committed_parts_records_their_target() -> None:
    eff = fold(staged("overwrite", added=[part("n1", partition=(1,))], removed=["b1"], partitions=[P1]))
    assert eff.removed == {"b1": ("t", P1)}
    assert eff.kinds == {("t", P1): {Kind.OVERWRITE}}
    assert eff.removed_in("t", P1) == {"b1"} and eff.removed_in("t", P2) == frozenset()


def test_removing_an_own_part_discards_it() -> None:
    own = part("n1", partition=(1,))
    eff = fold(staged("insert", added=[own]), staged("delete", added=[part("n1b", partition=(1,))], removed=["n1"]))
    assert sorted(eff.added) == ["n1b"] and eff.discarded == [own] and not eff.removed
    assert eff.kinds == {("t", P1): {Kind.INSERT, Kind.MUTATE}}


def test_partitions_and_whole_table_without_parts() -> None:
    """A TRUNCATE of partitions with nothing in them still acts on them; without partitions it
    acts on the whole table."""
    eff = fold(staged("truncate", partitions=["[3]"]), staged("truncate", table="u", whole_table=True))
    assert eff.kinds == {("t", "[3]"): {Kind.OVERWRITE}}
    assert eff.whole_tables == {"u"}


@pytest.mark.parametrize(
    "op,compact_kind,kind",
    [
        ("insert", None, Kind.INSERT),
        ("overwrite", None, Kind.OVERWRITE),
        ("truncate", None, Kind.OVERWRITE),
        ("delete", None, Kind.MUTATE),
        ("update", None, Kind.MUTATE),
        ("compact", "minor", Kind.MINOR_COMPACT),
        ("compact", "major", Kind.MAJOR_COMPACT),
    ],
)
def test_each_operation_folds_to_its_kind(op: str, compact_kind: str | None, kind: Kind) -> None:
    eff = fold(staged(op, added=[part("n2", partition=(2,))], removed=["c2"], compact_kind=compact_kind))
    assert eff.kinds == {("t", P2): {kind}}


def sample_effect() -> Effect:
    return fold(
        staged("insert", added=[part("n1", partition=(1,)), part("n2", partition=(2,))]),
        staged("delete", added=[part("m1", partition=(1,))], removed=["b1"]),
        staged("insert", table="u", added=[part("x", table="u")]),
    )


def test_summaries_per_target() -> None:
    assert sample_effect().summaries(R) == {
        ("t", P1): Summary(R, frozenset({Kind.INSERT, Kind.MUTATE}), frozenset({"b1"})),
        ("t", P2): Summary(R, frozenset({Kind.INSERT})),
        ("u", "[]"): Summary(R, frozenset({Kind.INSERT})),
    }


def test_changes_are_in_a_deterministic_order() -> None:
    chs = sample_effect().changes()
    assert chs == [
        Change("t", P1, (Kind.INSERT, Kind.MUTATE), (part("m1", partition=(1,)), part("n1", partition=(1,))), ("b1",)),
        Change("t", P2, (Kind.INSERT,), (part("n2", partition=(2,)),), ()),
        Change("u", "[]", (Kind.INSERT,), (part("x", table="u"),), ()),
    ]
    assert sample_effect().changes() == chs


def test_changes_applied_give_the_state_the_effect_describes() -> None:
    st = built()
    st.apply(5, 0, 4, entry((R, sample_effect().changes()), ddl=[table_def("u", partitioned=False)]))
    assert names(st.visible("t", 5)) == ["c2", "m1", "n1", "n2"]
    assert names(st.visible("u", 5)) == ["x"]
    assert st.winners("t", P1, 4) == [sample_effect().summaries(R)[("t", P1)]]


def test_own_parts_of_a_running_transaction() -> None:
    txn = RunningTxn(Tid.parse(R), snapshot=4)
    txn.ops = [
        staged("insert", added=[part("n1", partition=(1,)), part("n2", partition=(2,))]),
        staged("delete", added=[part("m1", partition=(1,))], removed=["n1", "b1"]),
    ]
    added, removed = txn.own_parts()
    assert sorted(names(added)) == ["m1", "n2"] and removed == {"b1"}
    assert txn.id == R


def test_what_the_committer_hands_the_batching_rule() -> None:
    """Effects folded as the committer folds them, judged by the batching rule: two INSERTs into
    one partition share a batch under ``parts`` and ``append`` (under ``maxcompute`` the later
    one loses); a DELETE of the part another member overwrites waits for the next batch."""
    first = fold(staged("insert", added=[part("n1", partition=(1,))]))
    second = fold(staged("insert", added=[part("n2", partition=(1,))]))
    in_batch = {k: [s] for k, s in first.summaries(A).items()}
    for policy in ("parts", "maxcompute", "append"):
        fits = fits_beside({"t": policy}, second.summaries(B), second.whole_tables, in_batch)
        assert fits is (policy != "maxcompute"), policy
    a = fold(staged("overwrite", removed=["b1"], partitions=[P1]))
    b = fold(staged("delete", removed=["b1"]))
    in_batch = {k: [s] for k, s in a.summaries(A).items()}
    assert not fits_beside({"t": "parts"}, b.summaries(B), b.whole_tables, in_batch)


def test_catalog_records_drops_alters_and_round_trips_through_a_checkpoint() -> None:
    """Drop, create again, alter: each snapshot sees the table as it was then, the drop removed
    every part live at it (also one it never listed), and a checkpoint restores it all."""
    import dataclasses

    import pyarrow as pa

    from coordinator.model.catalog import TableDropped
    from coordinator.model.records import LogEntry

    st = built()
    d = tid(5)
    st.apply(5, 0, 4, LogEntry(time=5.0, versions={}, txns=(), ddl=(TableDropped("t", d, 1),)))
    assert st.table("t") is None and st.table("t", snapshot=4) is not None and st.table("t", snapshot=5) is None
    assert st.visible("t", 5) == [] and names(st.visible("t", 4)) == ["b1", "c2"]
    assert {st.parts[n].removal_csn for n in ("b1", "c2")} == {5} and st.parts["b1"].removal_tid == d
    assert st.dropped_since("t", 4).csn == 5 and st.dropped_since("t", 5) is None
    st.apply(6, 0, 5, entry(ddl=[dataclasses.replace(table_def("t"), ddl_version=2)]))
    alt = st.table("t").altered(add_columns=[pa.field("extra", pa.int64())])
    st.apply(7, 0, 6, LogEntry(time=7.0, versions={}, ddl=(alt,)))
    assert st.table("t").version_csn == 7 and st.table("t", snapshot=6).version_csn == 0
    assert st.table("t", snapshot=6).created_csn == 6 and st.dropped_since("t", 4).csn == 5
    assert [st.last_ddl(s) for s in (0, 1, 4, 5, 6, 7, 9)] == [0, 1, 1, 5, 6, 7, 7]
    back = ReplicaState()
    back.restore(copy.deepcopy(st.export()), "mem")
    assert back.export() == st.export()
    for s in range(9):
        assert back.table("t", s) == st.table("t", s) and back.record("t", s) == st.record("t", s)
        assert back.last_ddl(s) == st.last_ddl(s)


def test_older_snapshots_see_what_every_record_tested_by_the_rule_says() -> None:
    """The lookup at an older snapshot tests only the parts live now and those removed after it
    (ReplicaState._candidates): against the visibility rule applied to every record ever
    written, over a history of inserts, merges, overwrites and a drop in two tables, at every
    snapshot, in every partition choice, for a plain reader, a running reader with its own
    writes and removals, and a reader whose transaction committed (it made parts: the full list)."""
    import random

    from coordinator.core.visibility import is_visible
    from coordinator.model.catalog import TableDropped

    rng = random.Random(7)
    st = ReplicaState()
    st.apply(1, 0, 0, entry(ddl=[table_def("t"), table_def("u")], versions={"t": 0, "u": 0}))
    live: dict[tuple[str, int], list[str]] = {(t, p): [] for t in "tu" for p in (1, 2)}
    n = 0
    for csn in range(2, 80):
        tbl, p = rng.choice("tu"), rng.choice((1, 2))
        n += 1
        who, name = tid(100 + csn), f"{tbl}{n:03d}"
        removed: list[str] = []
        if live[(tbl, p)] and rng.random() < 0.4:  # a merge or an overwrite of some live parts
            removed = rng.sample(live[(tbl, p)], rng.randint(1, len(live[(tbl, p)])))
        live[(tbl, p)] = [x for x in live[(tbl, p)] if x not in removed] + [name]
        added = [part(name, table=tbl, partition=(p,), creator=who)]
        st.apply(csn, 0, csn - 1, entry((who, [change(tbl, (p,), [Kind.INSERT], added=added, removed=removed)])))
    # the live parts in creation order are the live parts, no removed one left behind
    for tbl in "tu":
        assert [m.name for m in st.live_created[tbl].view()] == sorted(
            (n for p in (1, 2) for n in live[(tbl, p)]), key=lambda n: st.parts[n].creation_csn
        )
    st.apply(80, 0, 79, entry(ddl=[TableDropped("u", tid(999), 1)]))
    assert "u" not in st.live_created and "u" not in st.live_sorted
    committed = tid(110)  # made a part at CSN 10
    own = part("t999", partition=(1,), creator=R)
    every = sorted(st.parts.values(), key=lambda r: r.meta.name)

    def reference(table: str, snapshot: int, reader: str | None, own_removed: set, pkeys: set | None) -> list[str]:
        out = []
        for r in every:
            if r.meta.table != table or (pkeys is not None and r.pkey not in pkeys):
                continue
            removal_tid = reader if r.meta.name in own_removed else r.removal_tid
            removal_csn = r.removal_csn if removal_tid == r.removal_tid else None
            if is_visible(snapshot, reader, r.meta.creation_tid, r.creation_csn, removal_tid, removal_csn):
                out.append(r.meta.name)
        return out

    checked = 0
    for table in "tu":
        for snapshot in range(0, 80):  # below applied: the latest takes the live index
            for pkeys in (None, {P1}, {P2}, set()):
                for reader, own_added, own_removed in (
                    (None, [], set()),
                    (R, [own] if table == "t" else [], {n for n in live[(table, 1)][:1]}),
                    (committed, [], set()),
                ):
                    got = names(
                        st.visible(table, snapshot, reader, own_added, own_removed, None if pkeys is None else pkeys)
                    )
                    want = reference(table, snapshot, reader, own_removed, pkeys)
                    want += [m.name for m in own_added if pkeys is None or P1 in pkeys]
                    assert got == sorted(want), (table, snapshot, reader, pkeys)
                    # a point read's probe first (ReplicaState._visible_kept), then the rule
                    pk = None if pkeys is None else pkeys
                    for keep in (lambda ms, at: ms, lambda ms, at: [m for m in ms if m.name[-1] in "02468"]):
                        kept = names(st.visible(table, snapshot, reader, own_added, own_removed, pk, keep=keep))
                        assert kept == [n for n in sorted(want) if keep([_Named(n)], snapshot)], (table, snapshot)
                    checked += 1
    assert checked == 2 * 80 * 4 * 3


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name
