"""Pure checks of the conflict rules, the visibility rule and the version arithmetic.

Every expected value here is written out independently from the rules as
docs/rules.md#conflict-rules and docs/rules.md#visibility state them (the tables are transcribed as
text and parsed), never derived from the module under test, so a wrong cell in
``coordinator.core.conflicts.MAXCOMPUTE`` or a slip in ``is_visible`` makes a test fail. No I/O: this
whole module runs in well under a second.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pyarrow as pa
import pytest

from coordinator.core import jsonwire
from coordinator.core.conflicts import (
    COMPACTIONS,
    DATA_CHANGING,
    MAXCOMPUTE,
    Kind,
    Policy,
    Summary,
    Verdict,
    append_later_succeeds,
    check,
    later_succeeds,
)
from coordinator.core.versions import (
    COUNTER_STRIDE,
    EPOCH_STRIDE,
    NO_CSN,
    Tid,
    check_host_id,
    csn_of,
    epoch_full,
    local_counter,
    seq_of_node,
    split_csn,
)
from coordinator.core.visibility import is_visible
from coordinator.errors import ConflictError, ConflictKind, from_dict
from coordinator.model.catalog import TableDef
from coordinator.model.records import LogEntry
from parts.model.meta import PartMeta
from replicas.state import ReplicaState

# =============================================================================================
# The tables, transcribed from docs/rules.md#conflict-rules
# =============================================================================================

# docs/rules.md#policy-maxcompute: the earlier-committed job always stands; does the later one
# succeed?
MAXCOMPUTE_TEXT = """
| earlier \\ later | OVERWRITE | INSERT | MUTATE | MINOR_COMPACT | MAJOR_COMPACT |
|---|---|---|---|---|---|
| OVERWRITE | succeeds, overwrites | fails | fails | fails | fails |
| INSERT | succeeds, overwrites | fails | fails | succeeds | fails |
| MUTATE | succeeds, overwrites | fails | fails | succeeds | fails |
| MINOR_COMPACT | succeeds, overwrites | succeeds | succeeds | fails | succeeds |
| MAJOR_COMPACT | succeeds, overwrites | succeeds | succeeds | fails | fails |
"""


def _parse_table(text: str) -> dict[tuple[str, str], bool]:
    """``{(earlier, later): later succeeds}`` from a markdown table."""
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in text.strip().splitlines()
        if line.strip() and not line.strip().startswith("|---")
    ]
    header, body = rows[0][1:], rows[1:]
    out: dict[tuple[str, str], bool] = {}
    for row in body:
        for later, cell in zip(header, row[1:], strict=True):
            assert cell.startswith(("succeeds", "fails")), cell
            out[(row[0], later)] = cell.startswith("succeeds")
    return out


EXPECTED_MAXCOMPUTE = _parse_table(MAXCOMPUTE_TEXT)
KIND_NAMES = ["OVERWRITE", "INSERT", "MUTATE", "MINOR_COMPACT", "MAJOR_COMPACT"]
CELLS = list(itertools.product(KIND_NAMES, KIND_NAMES))


def expected_append(earlier: str, later: str) -> bool:
    """docs/rules.md#policy-append: INSERT never fails; a later OVERWRITE succeeds; a later MUTATE or
    compaction fails if any other transaction committed to its target since its snapshot."""
    return later in ("INSERT", "OVERWRITE")


def test_transcription_is_complete() -> None:
    """The parsed table has all 25 cells and exactly the 12 successes
    docs/rules.md#policy-maxcompute lists."""
    assert set(EXPECTED_MAXCOMPUTE) == set(CELLS)
    assert sum(EXPECTED_MAXCOMPUTE.values()) == 12
    assert {k.value for k in Kind} == set(KIND_NAMES)
    assert {p.value for p in Policy} >= {"parts", "maxcompute", "append"}
    assert {k.value for k in COMPACTIONS} == {"MINOR_COMPACT", "MAJOR_COMPACT"}
    assert {k.value for k in DATA_CHANGING} == {"OVERWRITE", "INSERT", "MUTATE"}


# =============================================================================================
# maxcompute
# =============================================================================================


@pytest.mark.parametrize(("earlier", "later"), CELLS)
def test_maxcompute_cell(earlier: str, later: str) -> None:
    """One committed earlier job, one later job: the verdict is the table's cell; a loss names the
    earlier tid; a success after a commit asks for a rebase."""
    want = EXPECTED_MAXCOMPUTE[(earlier, later)]
    assert MAXCOMPUTE[Kind(earlier)][Kind(later)] is want
    assert later_succeeds(Policy.MAXCOMPUTE, Kind(earlier), Kind(later)) is want
    v = check("maxcompute", Summary.of("L", [later]), [Summary.of("E", [earlier])])
    assert isinstance(v, Verdict)
    assert v.ok is want
    if want:
        assert v.rebase is True
        assert v.winner is None
        assert v.kind is None
    else:
        assert v.winner == "E"
        assert later in v.reason and earlier in v.reason
        assert v.kind is ConflictKind.TARGET_CHANGED


def test_maxcompute_table_shape() -> None:
    """The module's table has exactly the 25 cells, nothing more."""
    assert set(MAXCOMPUTE) == set(Kind)
    for row in MAXCOMPUTE.values():
        assert set(row) == set(Kind)


# =============================================================================================
# append
# =============================================================================================


@pytest.mark.parametrize(("earlier", "later"), CELLS)
def test_append_cell(earlier: str, later: str) -> None:
    want = expected_append(earlier, later)
    assert append_later_succeeds(Kind(earlier), Kind(later)) is want
    assert later_succeeds(Policy.APPEND, Kind(earlier), Kind(later)) is want
    v = check(Policy.APPEND, Summary.of("L", [later]), [Summary.of("E", [earlier])])
    assert v.ok is want
    if want:
        assert v.rebase is True and v.winner is None and v.kind is None
    else:
        assert v.winner == "E"
        assert v.kind is ConflictKind.TARGET_CHANGED


# =============================================================================================
# parts: only two removals of the same part conflict, whatever the kinds
# =============================================================================================


@pytest.mark.parametrize(("earlier", "later"), CELLS)
@pytest.mark.parametrize(
    ("earlier_removed", "later_removed", "overlap"),
    [
        ((), (), False),
        (("p1",), (), False),
        ((), ("p1",), False),
        (("p1",), ("p2",), False),
        (("p1", "p2"), ("p3", "p4"), False),
        (("p1",), ("p1",), True),
        (("p1", "p2"), ("p2", "p3"), True),
        (("p1", "p2", "p3"), ("p0", "p3"), True),
    ],
)
def test_parts_cell(
    earlier: str,
    later: str,
    earlier_removed: tuple[str, ...],
    later_removed: tuple[str, ...],
    overlap: bool,
) -> None:
    """Kinds never decide under ``parts``; an overlap of removed parts always loses to the
    earlier tid; nothing is ever rebased (an OVERWRITE removes what it saw). The loss is a
    compaction's lost sources when the later transaction compacted, else a part removed twice."""
    v = check(
        "parts",
        Summary.of("L", [later], later_removed),
        [Summary.of("E", [earlier], earlier_removed)],
    )
    if overlap:
        assert not v.ok
        assert v.winner == "E"
        common = sorted(set(earlier_removed) & set(later_removed))
        assert any(p in v.reason for p in common)
        compaction = later in ("MINOR_COMPACT", "MAJOR_COMPACT")
        assert v.kind is (ConflictKind.SOURCES_REMOVED if compaction else ConflictKind.PART_REMOVED_TWICE)
    else:
        assert v.ok and not v.rebase and v.winner is None and v.kind is None
    assert later_succeeds(Policy.PARTS, Kind(earlier), Kind(later)) is True


# =============================================================================================
# check(): several earlier commits, several kinds, own entries, nothing committed
# =============================================================================================


@pytest.mark.parametrize("policy", ["maxcompute", "append", "parts"])
@pytest.mark.parametrize("later", KIND_NAMES)
def test_nothing_committed_meanwhile(policy: str, later: str) -> None:
    """No commit since the snapshot: success, and no rebase (the plan stands as staged)."""
    v = check(policy, Summary.of("L", [later], ["p1"]), [])
    assert v == Verdict(True, rebase=False, winner=None, reason=v.reason)


@pytest.mark.parametrize("policy", ["maxcompute", "append", "parts"])
@pytest.mark.parametrize(("earlier", "later"), CELLS)
def test_own_entries_are_ignored(policy: str, earlier: str, later: str) -> None:
    """A summary carrying the later transaction's own tid is never a winner nor a reason to
    rebase (a replica may see its own commit in the history)."""
    v = check(policy, Summary.of("L", [later], ["p1"]), [Summary.of("L", [earlier], ["p1"])])
    assert v.ok and not v.rebase


def _nonempty_subsets(names: list[str]) -> list[tuple[str, ...]]:
    return [c for r in range(1, len(names) + 1) for c in itertools.combinations(names, r)]


@pytest.mark.parametrize("policy", ["maxcompute", "append"])
def test_kind_sets(policy: str) -> None:
    """A transaction that did several kinds on a target loses if any (earlier kind, later kind)
    pair of the table fails: every subset against every subset."""
    table = EXPECTED_MAXCOMPUTE if policy == "maxcompute" else {c: expected_append(*c) for c in CELLS}
    for ek in _nonempty_subsets(KIND_NAMES):
        for lk in _nonempty_subsets(KIND_NAMES):
            want = all(table[(e, lat)] for e in ek for lat in lk)
            v = check(policy, Summary.of("L", lk), [Summary.of("E", ek)])
            assert v.ok is want, (ek, lk)
            assert v.rebase is want
            assert v.winner == (None if want else "E")
            assert v.kind is (None if want else ConflictKind.TARGET_CHANGED)


def test_parts_kind_sets() -> None:
    """Under ``parts`` a loss is SOURCES_REMOVED exactly when the later transaction's removals
    on the target were a compaction's: it compacted there and neither overwrote nor mutated (an
    INSERT removes nothing; an OVERWRITE, TRUNCATE, DELETE or UPDATE that removed the part makes
    it a part removed twice). The earlier transaction's kinds never matter."""
    for ek in _nonempty_subsets(KIND_NAMES):
        for lk in _nonempty_subsets(KIND_NAMES):
            v = check("parts", Summary.of("L", lk, ["p1"]), [Summary.of("E", ek, ["p1"])])
            compacted = bool({"MINOR_COMPACT", "MAJOR_COMPACT"} & set(lk))
            removed_otherwise = bool({"OVERWRITE", "MUTATE"} & set(lk))
            want = (
                ConflictKind.SOURCES_REMOVED if compacted and not removed_otherwise else ConflictKind.PART_REMOVED_TWICE
            )
            assert not v.ok and v.winner == "E" and v.kind is want, (ek, lk)


@pytest.mark.parametrize("policy", ["maxcompute", "append"])
@pytest.mark.parametrize(("a", "b", "later"), list(itertools.product(KIND_NAMES, KIND_NAMES, KIND_NAMES)))
def test_two_earlier_commits(policy: str, a: str, b: str, later: str) -> None:
    """With commits E1 then E2 since the snapshot, the winner named is the first one (in commit
    order) that the later kind loses to; success needs both cells to succeed."""
    table = EXPECTED_MAXCOMPUTE if policy == "maxcompute" else {c: expected_append(*c) for c in CELLS}
    v = check(policy, Summary.of("L", [later]), [Summary.of("E1", [a]), Summary.of("E2", [b])])
    if not table[(a, later)]:
        assert not v.ok and v.winner == "E1"
    elif not table[(b, later)]:
        assert not v.ok and v.winner == "E2"
    else:
        assert v.ok and v.rebase


def test_parts_winner_is_first_overlapping() -> None:
    v = check(
        "parts",
        Summary.of("L", ["MUTATE"], ["p1", "p2"]),
        [
            Summary.of("E1", ["INSERT"], []),
            Summary.of("E2", ["MUTATE"], ["p2"]),
            Summary.of("E3", ["MUTATE"], ["p1"]),
        ],
    )
    assert not v.ok and v.winner == "E2"
    v = check(
        "parts",
        Summary.of("L", ["MAJOR_COMPACT"], ["p1"]),
        [Summary.of("E1", ["OVERWRITE"], ["p9"]), Summary.of("E2", ["INSERT"], [])],
    )
    assert v.ok and not v.rebase


def test_conflict_kinds() -> None:
    """The kinds a caller can tell apart: three that the policies raise, one a drop of the table
    raises, two reserved for keys tables and serializable transactions."""
    assert {k.value for k in ConflictKind} == {
        "PART_REMOVED_TWICE",
        "TARGET_CHANGED",
        "SOURCES_REMOVED",
        "TABLE_DROPPED",
        "KEY_WRITTEN",
        "READ_SET_CHANGED",
    }


@pytest.mark.parametrize("kind", list(ConflictKind))
def test_conflict_kind_survives_the_wire(kind: ConflictKind) -> None:
    """A replica's ConflictError is JSON on the RPC and rebuilt by the client: ``kind`` and
    ``winner`` come through, ``kind`` as the enum."""
    exc = ConflictError("lost", winner="(1, 2, 'r0')", kind=str(kind), table="t", partition="[]")
    back = from_dict(jsonwire.loads(jsonwire.dumps(exc.to_dict())))
    assert type(back) is ConflictError
    assert back.kind is kind and back.winner == "(1, 2, 'r0')" and back.message == "lost"
    assert ConflictError("lost", kind=kind).kind is kind


@pytest.mark.parametrize("details", [{}, {"kind": None}, {"kind": "FROM_A_NEWER_REPLICA"}, {"kind": ["x"]}])
def test_conflict_kind_unknown_is_none(details: dict) -> None:
    assert ConflictError("lost", **details).kind is None


def test_bad_policy_and_kind_are_rejected() -> None:
    with pytest.raises(ValueError):
        check("keys-but-misspelt", Summary.of("L", ["INSERT"]), [])
    with pytest.raises(ValueError):
        Summary.of("L", ["UPSERT"])


# =============================================================================================
# Visibility (docs/rules.md#visibility: the ClickHouse RFC's "Snapshots and data parts visibility")
# =============================================================================================


def seed_004_visible(
    snapshot: int,
    current_tid: str | None,
    mintid: str,
    mincsn: int | None,
    maxtid: str | None,
    maxcsn: int | None,
) -> bool:
    """The ClickHouse RFC's bullets (docs/rules.md#visibility), restated. A part is visible when

    * it was created by the current transaction (``mintid == current_tid``), or
    * ``CSN(mintid) && CSN(mintid) <= snapshotVersion && (!CSN(maxtid) ||
      snapshotVersion < CSN(maxtid)) && (!maxtid || maxtid != current_tid)``;

    and, as the last clause says and ClickHouse's VersionMetadata::isVisible checks first, never
    when the current transaction itself removed it (a part a transaction created and then
    removed again is gone for it). A plain read (no transaction) has no current tid.
    """
    in_txn = current_tid is not None
    removed_by_me = in_txn and maxtid is not None and maxtid == current_tid
    if removed_by_me:
        return False
    if in_txn and mintid == current_tid:
        return True
    return (
        mincsn is not None
        and mincsn <= snapshot
        and (maxcsn is None or snapshot < maxcsn)
        and (maxtid is None or maxtid != current_tid)
    )


CSNS: list[int | None] = [None, 1, 2, 3, 4]


def test_visibility_exhaustive() -> None:
    """Every combination over snapshot 0..4, creation/removal CSN None/1..4, removal by nobody,
    by another transaction or by the creator, and reader = creator / remover / other / none."""
    checked = 0
    for snapshot in range(5):
        for mincsn in CSNS:
            for maxtid in (None, "R", "C"):
                for maxcsn in CSNS if maxtid is not None else [None]:
                    for reader in ("C", "R", "X", None):
                        want = seed_004_visible(snapshot, reader, "C", mincsn, maxtid, maxcsn)
                        got = is_visible(snapshot, reader, "C", mincsn, maxtid, maxcsn)
                        assert got is want, (snapshot, reader, mincsn, maxtid, maxcsn)
                        checked += 1
    assert checked == 5 * 5 * (1 + 5 + 5) * 4


def test_visibility_landmarks() -> None:
    """A few cases spelled out, so that the restatement above cannot drift unnoticed."""
    # committed at 2, seen from 2 on, gone from its removal CSN on
    assert not is_visible(1, None, "C", 2, None, None)
    assert is_visible(2, None, "C", 2, None, None)
    assert is_visible(3, None, "C", 2, "R", 4)
    assert not is_visible(4, None, "C", 2, "R", 4)
    # a running creator sees its own part; others do not
    assert is_visible(0, "C", "C", None, None, None)
    assert not is_visible(4, "X", "C", None, None, None)
    # a running remover no longer sees the part; others still do until the removal commits
    assert not is_visible(3, "R", "C", 2, "R", None)
    assert is_visible(3, "X", "C", 2, "R", None)
    # created and removed by the same running transaction: gone for it
    assert not is_visible(3, "C", "C", None, "C", None)


# =============================================================================================
# versions: CSNs across epochs, tids
# =============================================================================================


LARGE_EPOCHS = [0, 1, 2, 7, 1000, 2**20, 2**32 - 1]
SEQS = [
    0,
    1,
    2,
    9,
    10,
    11,
    999_999,
    1_000_000,
    1_000_001,
    2**30,
    EPOCH_STRIDE - 2,
    EPOCH_STRIDE - 1,
]


def test_csn_round_trip() -> None:
    for epoch in LARGE_EPOCHS:
        for seq in SEQS:
            csn = csn_of(epoch, seq)
            assert csn > NO_CSN
            assert split_csn(csn) == (epoch, seq)
    for csn in [1, 2, 3, EPOCH_STRIDE, EPOCH_STRIDE + 1, 2**40 + 17, 2**62]:
        assert csn_of(*split_csn(csn)) == csn


def test_first_csn_is_one() -> None:
    """0 means 'nothing' (the snapshot of an empty log); the first entry gets CSN 1."""
    assert NO_CSN == 0
    assert csn_of(0, 0) == 1


@pytest.mark.parametrize("epoch_size", [1, 2, 10, 1_000_000])
def test_csn_monotonic_across_epochs_with_overshoot(epoch_size: int) -> None:
    """Commits in log order (epoch, seq) get strictly increasing CSNs, even when racing
    committers overshoot ``epoch_size`` in an epoch before it is sealed: every CSN of an epoch
    is below every CSN of the next."""
    order: list[tuple[int, int]] = []
    for epoch in range(4):
        seqs = list(range(min(epoch_size, 50))) + [
            epoch_size - 1,
            epoch_size,
            epoch_size + 3,
            epoch_size * 10,
            EPOCH_STRIDE - 1,
        ]
        order += [(epoch, s) for s in sorted(set(s for s in seqs if 0 <= s < EPOCH_STRIDE))]
    csns = [csn_of(e, s) for e, s in order]
    assert all(a < b for a, b in zip(csns, csns[1:]))
    for epoch in range(3):
        assert csn_of(epoch, EPOCH_STRIDE - 1) < csn_of(epoch + 1, 0)
    assert epoch_full(epoch_size - 1, epoch_size)
    assert epoch_full(epoch_size + 5, epoch_size)
    if epoch_size > 1:
        assert not epoch_full(epoch_size - 2, epoch_size)


def test_csn_beyond_32_bits() -> None:
    """ZooKeeper sequence numbers are signed 32-bit; CSNs must keep growing past 2**31."""
    assert csn_of(1, 0) > 2**31 - 1
    assert csn_of(3, 5) > 2**32
    assert csn_of(2**33, 0) > 2**63


@pytest.mark.parametrize(("epoch", "seq"), [(-1, 0), (0, -1), (0, EPOCH_STRIDE), (0, EPOCH_STRIDE + 5)])
def test_csn_of_rejects_bad_input(epoch: int, seq: int) -> None:
    with pytest.raises(ValueError):
        csn_of(epoch, seq)


@pytest.mark.parametrize("csn", [0, -1, -(2**31)])
def test_split_csn_rejects_non_entries(csn: int) -> None:
    with pytest.raises(ValueError):
        split_csn(csn)


def test_seq_of_node() -> None:
    assert seq_of_node("c-0000000000") == 0
    assert seq_of_node("c-0000000042") == 42
    assert seq_of_node("c-2147483647") == 2**31 - 1
    for bad in ("c-42", "e-0000000001", "c-00000000x1", "", "c-00000000001", "c-0000000042\n"):
        with pytest.raises(ValueError):
            seq_of_node(bad)


@pytest.mark.parametrize(
    "tid",
    [
        Tid(0, 0, "r0"),
        Tid(17, 3, "host-1.example_com"),
        Tid(csn_of(5, 123), local_counter(9, 77), "r12"),
        Tid(2**62, COUNTER_STRIDE * 1000 + 5, "a" * 64),
    ],
)
def test_tid_round_trip(tid: Tid) -> None:
    text = str(tid)
    assert Tid.parse(text) == tid
    assert str(Tid.parse(text)) == text
    assert (tid.start_csn, tid.local_counter, tid.host_id) == tuple(tid)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "T",
        "T1-2",
        "T1-2-",
        "X1-2-r0",
        "t1-2-r0",
        "T-1-2-r0",
        "T1--2-r0",
        "T1-2-r/0",
        "T1-2-r 0",
        "T1-2-" + "a" * 65,
        "T1.5-2-r0",
        " T1-2-r0",
        "T1-2-r0\n",
    ],
)
def test_tid_parse_rejects_bad_input(text: str) -> None:
    with pytest.raises(ValueError) as info:
        Tid.parse(text)
    assert "transaction id" in str(info.value)


def test_tid_parse_rejects_none() -> None:
    with pytest.raises(ValueError):
        Tid.parse(None)  # type: ignore[arg-type]


def test_local_counters_never_repeat_across_incarnations() -> None:
    seen = {local_counter(inc, n) for inc in range(4) for n in (0, 1, 2, COUNTER_STRIDE - 1)}
    assert len(seen) == 16
    assert local_counter(0, COUNTER_STRIDE - 1) < local_counter(1, 0)
    with pytest.raises(OverflowError):
        local_counter(0, COUNTER_STRIDE)
    with pytest.raises(OverflowError):
        local_counter(0, -1)


@pytest.mark.parametrize("host", ["", "a/b", "a b", "a" * 65, "r0\n", "é", ".", ".."])
def test_bad_host_ids(host: str) -> None:
    with pytest.raises(ValueError):
        check_host_id(host)
    assert check_host_id("r0") == "r0"


# =============================================================================================
# The replica's part index applies the same rule (its fast path for the latest snapshot included)
# =============================================================================================


def _meta(name: str, creator: str) -> dict:
    return PartMeta(name, "t", (), f"t/_/{name}.parquet", 1, 1, "crc32:00000000", {}, creator).to_dict()


T_A, T_B, T_C, T_R = (str(Tid(1, n, "r0")) for n in range(4))


def test_replica_state_visibility_matches_seed_rule() -> None:
    """Log: CSN 1 creates table t; 2: A adds p1, p2; 3: B removes p1, adds p3; 4: C removes p2
    and p3, adds p4. At every snapshot, for a plain read and for a running reader R with its own
    staged part and removal, the state's visible set is what the visibility rule gives part by part.
    """
    tdef = TableDef.new("t", pa.schema([("k", pa.int64())]))
    st = ReplicaState()
    st.apply(1, 0, 0, LogEntry(time=0.0, versions={}, ddl=(tdef,)))

    def change(tid: str, added: list[str], removed: list[str]) -> dict:
        return {
            "tid": tid,
            "changes": [
                {
                    "table": "t",
                    "pkey": "[]",
                    "kinds": ["MUTATE"],
                    "added": [_meta(n, tid) for n in added],
                    "removed": removed,
                }
            ],
        }

    log = {
        2: change(T_A, ["p1", "p2"], []),
        3: change(T_B, ["p3"], ["p1"]),
        4: change(T_C, ["p4"], ["p2", "p3"]),
    }
    # (creator, creation csn, remover, removal csn), written out from the log above
    versions = {
        "p1": (T_A, 2, T_B, 3),
        "p2": (T_A, 2, T_C, 4),
        "p3": (T_B, 3, T_C, 4),
        "p4": (T_C, 4, None, None),
    }
    own_meta = PartMeta.from_dict(_meta("r1", T_R))
    for applied in range(1, 5):
        if applied in log:
            st.apply(applied, 0, applied - 1, LogEntry.from_dict({"v": 1, "txns": [log[applied]]}, "test"))
        done = {n: v for n, v in versions.items() if v[1] <= applied}
        for snapshot in range(applied + 1):
            # a plain read
            want = sorted(
                n
                for n, (c, ccsn, r, rcsn) in done.items()
                if seed_004_visible(snapshot, None, c, ccsn, r, rcsn if (rcsn or 99) <= applied else None)
            )
            got = sorted(m.name for m in st.visible("t", snapshot))
            assert got == want, (applied, snapshot)
            for chosen in _CHOSEN:  # a point read's probe first, then the rule (below applied)
                got = [m.name for m in st.visible("t", snapshot, keep=_keeping(chosen, snapshot))]
                assert got == [n for n in want if n in chosen], (applied, snapshot, chosen)
            # a running reader R that staged r1 and removes every part that exists at its snapshot
            for removes in ([], sorted(done)):
                want = ["r1"] + [
                    n
                    for n, (c, ccsn, r, rcsn) in done.items()
                    if n not in removes
                    and seed_004_visible(snapshot, T_R, c, ccsn, r, rcsn if (rcsn or 99) <= applied else None)
                ]
                got = [m.name for m in st.visible("t", snapshot, T_R, [own_meta], set(removes))]
                assert sorted(got) == sorted(want), (applied, snapshot, removes)
                for chosen in _CHOSEN:
                    keep = _keeping(chosen, snapshot)
                    got = [m.name for m in st.visible("t", snapshot, T_R, [own_meta], set(removes), keep=keep)]
                    assert got == sorted(n for n in want if n in chosen), (applied, snapshot, removes, chosen)


_CHOSEN = ({"p1", "p3", "r1"}, {"p2", "p4"}, {"p1", "p2", "p3", "p4", "r1"}, set())


def _keeping(chosen: set[str], snapshot: int) -> Callable[[list[PartMeta], int], list[PartMeta]]:
    """A point read's probe (ReplicaState.visible's ``keep``) that keeps the parts named in
    ``chosen``, in their order, asked at ``snapshot`` only."""

    def keep(metas: list[PartMeta], at: int) -> list[PartMeta]:
        assert at == snapshot
        return [m for m in metas if m.name in chosen]

    return keep
