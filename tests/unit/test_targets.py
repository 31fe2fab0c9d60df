"""Pure checks of conflict target selection (coordinator/core/targets.py) and of the group
committer's batching decision (coordinator.core.conflicts.fits_beside).

Every statement is written out as the client stages it (coordinator/client.py): an INSERT adds
parts; an OVERWRITE names its partitions, removes what it saw there and adds; a TRUNCATE removes
and names its partitions, or acts on the whole table; a DELETE or UPDATE removes the parts it
rewrote and adds their rewrites (an unpartitioned table's names partition ``[]``); a compaction
removes its sources and adds the merged parts. Expected keys are written out by hand per policy.
No I/O.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest

from coordinator.core.conflicts import Kind, Policy, Summary, fits_beside
from coordinator.core.targets import (
    Statement,
    checked_keys,
    live_partitions,
    read_keys,
    whole_table_targets,
)

# =============================================================================================
# The world: table ``t`` partitioned (partition [3] was emptied, [4] does not exist yet),
# table ``u`` unpartitioned, table ``e`` whose only partition was emptied.
# =============================================================================================

LIVE = {
    "t": {"[1]": {"a1", "a2"}, "[2]": {"b1"}, "[3]": set()},
    "u": {"[]": {"u1", "u2"}},
    "e": {"[7]": set()},
}
PART_PKEY = {"a1": "[1]", "a2": "[1]", "b1": "[2]", "u1": "[]", "u2": "[]"}
POLICIES = ["parts", "maxcompute", "append"]
KIND_NAMES = ["OVERWRITE", "INSERT", "MUTATE", "MINOR_COMPACT", "MAJOR_COMPACT"]

INS, OVW, MUT, MIN, MAJ = Kind.INSERT, Kind.OVERWRITE, Kind.MUTATE, Kind.MINOR_COMPACT, Kind.MAJOR_COMPACT


@dataclass
class Case:
    """One transaction: its staged statements, its folded effect, and the keys expected under
    ``parts`` and under ``maxcompute``/``append`` (identical for those two)."""

    statements: list[Statement]
    effect: dict[tuple[str, str], Summary]
    parts_read: set[str]
    parts_checked: set[str]
    other_read: set[str]
    other_checked: set[str]
    whole_tables: set[str] = field(default_factory=set)


def S(kinds: set[Kind], removed: tuple[str, ...] = ()) -> Summary:  # noqa: N802
    return Summary("L", frozenset(kinds), frozenset(removed))


def removed_pkeys(names: tuple[str, ...]) -> list[str]:
    return [PART_PKEY[n] for n in names]


CASES: dict[str, Case] = {
    "insert, partitioned, one new partition": Case(
        [Statement("t", added=["[1]", "[4]"])],
        {("t", "[1]"): S({INS}), ("t", "[4]"): S({INS})},
        parts_read=set(),
        parts_checked=set(),
        other_read={"t", "t/%5B1%5D", "t/%5B4%5D"},
        other_checked={"t/%5B1%5D", "t/%5B4%5D"},
    ),
    "insert, unpartitioned": Case(
        [Statement("u", added=["[]"])],
        {("u", "[]"): S({INS})},
        parts_read=set(),
        parts_checked=set(),
        other_read={"u", "u/%5B%5D"},
        other_checked={"u/%5B%5D"},
    ),
    "overwrite of partition [1]": Case(
        [Statement("t", added=["[1]"], removed=removed_pkeys(("a1", "a2")), partitions=["[1]"])],
        {("t", "[1]"): S({OVW}, ("a1", "a2"))},
        parts_read={"t/%5B1%5D"},
        parts_checked={"t/%5B1%5D"},
        other_read={"t", "t/%5B1%5D"},
        other_checked={"t/%5B1%5D"},
    ),
    "overwrite of an emptied partition (removes nothing)": Case(
        [Statement("t", added=["[3]"], partitions=["[3]"])],
        {("t", "[3]"): S({OVW})},
        parts_read=set(),
        parts_checked=set(),
        other_read={"t", "t/%5B3%5D"},
        other_checked={"t/%5B3%5D"},
    ),
    "overwrite, unpartitioned": Case(
        [Statement("u", added=["[]"], removed=removed_pkeys(("u1", "u2")), partitions=["[]"])],
        {("u", "[]"): S({OVW}, ("u1", "u2"))},
        parts_read={"u/%5B%5D"},
        parts_checked={"u/%5B%5D"},
        other_read={"u", "u/%5B%5D"},
        other_checked={"u/%5B%5D"},
    ),
    "truncate of partitions [1] and [2]": Case(
        [Statement("t", removed=removed_pkeys(("a1", "a2", "b1")), partitions=["[1]", "[2]"])],
        {("t", "[1]"): S({OVW}, ("a1", "a2")), ("t", "[2]"): S({OVW}, ("b1",))},
        parts_read={"t/%5B1%5D", "t/%5B2%5D"},
        parts_checked={"t/%5B1%5D", "t/%5B2%5D"},
        other_read={"t", "t/%5B1%5D", "t/%5B2%5D"},
        other_checked={"t/%5B1%5D", "t/%5B2%5D"},
    ),
    "truncate of the whole partitioned table": Case(
        [Statement("t", removed=removed_pkeys(("a1", "a2", "b1")), whole_table=True)],
        {("t", "[1]"): S({OVW}, ("a1", "a2")), ("t", "[2]"): S({OVW}, ("b1",))},
        parts_read={"t/%5B1%5D", "t/%5B2%5D"},
        parts_checked={"t/%5B1%5D", "t/%5B2%5D"},
        other_read={"t", "t/%5B1%5D", "t/%5B2%5D"},
        other_checked={"t", "t/%5B1%5D", "t/%5B2%5D"},
        whole_tables={"t"},
    ),
    "truncate of the whole unpartitioned table": Case(
        [Statement("u", removed=removed_pkeys(("u1", "u2")), whole_table=True)],
        {("u", "[]"): S({OVW}, ("u1", "u2"))},
        parts_read={"u/%5B%5D"},
        parts_checked={"u/%5B%5D"},
        other_read={"u", "u/%5B%5D"},
        other_checked={"u", "u/%5B%5D"},
        whole_tables={"u"},
    ),
    "truncate of a whole table with no live part": Case(
        [Statement("e", whole_table=True)],
        {},
        parts_read=set(),
        parts_checked=set(),
        other_read={"e"},
        other_checked={"e"},
        whole_tables={"e"},
    ),
    "delete in partition [1]": Case(
        [Statement("t", added=["[1]"], removed=removed_pkeys(("a1",)))],
        {("t", "[1]"): S({MUT}, ("a1",))},
        parts_read={"t/%5B1%5D"},
        parts_checked={"t/%5B1%5D"},
        other_read={"t", "t/%5B1%5D"},
        other_checked={"t/%5B1%5D"},
    ),
    "update across partitions [1] and [2]": Case(
        [Statement("t", added=["[1]", "[2]"], removed=removed_pkeys(("a2", "b1")))],
        {("t", "[1]"): S({MUT}, ("a2",)), ("t", "[2]"): S({MUT}, ("b1",))},
        parts_read={"t/%5B1%5D", "t/%5B2%5D"},
        parts_checked={"t/%5B1%5D", "t/%5B2%5D"},
        other_read={"t", "t/%5B1%5D", "t/%5B2%5D"},
        other_checked={"t/%5B1%5D", "t/%5B2%5D"},
    ),
    "delete matching nothing, unpartitioned": Case(
        [Statement("u", partitions=["[]"])],
        {("u", "[]"): S({MUT})},
        parts_read=set(),
        parts_checked=set(),
        other_read={"u", "u/%5B%5D"},
        other_checked={"u/%5B%5D"},
    ),
    "minor compaction of partition [1]": Case(
        [Statement("t", added=["[1]"], removed=removed_pkeys(("a1", "a2")), partitions=["[1]"])],
        {("t", "[1]"): S({MIN}, ("a1", "a2"))},
        parts_read={"t/%5B1%5D"},
        parts_checked={"t/%5B1%5D"},
        other_read={"t", "t/%5B1%5D"},
        other_checked={"t/%5B1%5D"},
    ),
    "major compaction of every partition (not a whole-table statement)": Case(
        [Statement("t", added=["[1]", "[2]"], removed=removed_pkeys(("a1", "a2", "b1")))],
        {("t", "[1]"): S({MAJ}, ("a1", "a2")), ("t", "[2]"): S({MAJ}, ("b1",))},
        parts_read={"t/%5B1%5D", "t/%5B2%5D"},
        parts_checked={"t/%5B1%5D", "t/%5B2%5D"},
        other_read={"t", "t/%5B1%5D", "t/%5B2%5D"},
        other_checked={"t/%5B1%5D", "t/%5B2%5D"},
    ),
    "insert, then delete of its own part (nothing committed is removed)": Case(
        [Statement("t", added=["[1]"]), Statement("t", added=["[1]"], partitions=())],
        {("t", "[1]"): S({INS, MUT})},
        parts_read=set(),
        parts_checked=set(),
        other_read={"t", "t/%5B1%5D"},
        other_checked={"t/%5B1%5D"},
    ),
}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", list(CASES))
def test_keys_per_operation(policy: str, name: str) -> None:
    c = CASES[name]
    tables = {st.table for st in c.statements}
    policies = dict.fromkeys(tables, policy)
    read = read_keys(policies, c.statements, LIVE)
    checked = checked_keys(policies, c.effect, c.whole_tables, LIVE)
    if policy == "parts":
        assert (read, checked) == (c.parts_read, c.parts_checked)
    else:
        assert (read, checked) == (c.other_read, c.other_checked)
    # What the multi checks was read on the first attempt: no NeedKeys round for these.
    assert checked <= read


@pytest.mark.parametrize("kind", list(Kind))
def test_parts_checks_exactly_the_partitions_it_removes_from(kind: Kind) -> None:
    """Under ``parts`` the kind never matters: a target is checked when the transaction
    removes a committed part there, whatever statement did it; an INSERT checks nothing."""
    effect = {("t", "[1]"): S({kind}, ("a1",)), ("t", "[2]"): S({kind}), ("u", "[]"): S({kind})}
    policies = {"t": "parts", "u": "parts"}
    assert checked_keys(policies, effect, (), LIVE) == {"t/%5B1%5D"}
    stmts = [Statement("t", added=["[1]", "[2]"], removed=["[1]"]), Statement("u", added=["[]"], partitions=["[]"])]
    assert read_keys(policies, stmts, LIVE) == {"t/%5B1%5D"}


@pytest.mark.parametrize("policy", ["maxcompute", "append"])
@pytest.mark.parametrize("kind", list(Kind))
def test_other_policies_check_every_target_touched(policy: str, kind: Kind) -> None:
    effect = {("t", "[1]"): S({kind}, ("a1",)), ("t", "[2]"): S({kind}), ("u", "[]"): S({kind})}
    policies = {"t": policy, "u": policy}
    assert checked_keys(policies, effect, (), LIVE) == {"t/%5B1%5D", "t/%5B2%5D", "u/%5B%5D"}


def test_parts_inserts_check_no_target() -> None:
    for stmt in (Statement("t", added=["[1]", "[4]"]), Statement("u", added=["[]"])):
        assert read_keys({stmt.table: Policy.PARTS}, [stmt], LIVE) == set()
    effect = {("t", "[1]"): S({INS}), ("t", "[4]"): S({INS}), ("u", "[]"): S({INS})}
    assert checked_keys({"t": Policy.PARTS, "u": Policy.PARTS}, effect, (), LIVE) == set()


@pytest.mark.parametrize("policy", ["maxcompute", "append"])
def test_whole_table_statement_checks_table_node_and_every_live_partition(policy: str) -> None:
    """The table node (a partition created after the snapshot bumps it) and each partition that
    has live parts, also those the statement removes nothing from; an emptied one is left out."""
    live = {"t": {"[1]": {"a1"}, "[2]": {"b1"}, "[3]": set(), "[5]": {"f1"}}}
    effect = {("t", "[1]"): S({OVW}, ("a1",)), ("t", "[2]"): S({OVW}, ("b1",))}
    want = {"t", "t/%5B1%5D", "t/%5B2%5D", "t/%5B5%5D"}
    assert checked_keys({"t": policy}, effect, {"t"}, live) == want
    assert read_keys({"t": policy}, [Statement("t", removed=["[1]", "[2]"], whole_table=True)], live) == want
    assert checked_keys({"t": "parts"}, effect, {"t"}, live) == {"t/%5B1%5D", "t/%5B2%5D"}


def test_mixed_policies_in_one_transaction() -> None:
    """Each table is judged by its own policy."""
    policies = {"t": "parts", "u": "append"}
    stmts = [Statement("t", added=["[1]"]), Statement("u", added=["[]"])]
    assert read_keys(policies, stmts, LIVE) == {"u", "u/%5B%5D"}
    effect = {("t", "[1]"): S({INS}), ("u", "[]"): S({INS})}
    assert checked_keys(policies, effect, (), LIVE) == {"u/%5B%5D"}
    effect = {("t", "[1]"): S({OVW}, ("a1",)), ("u", "[]"): S({OVW}, ("u1",))}
    assert checked_keys(policies, effect, {"t", "u"}, LIVE) == {"t/%5B1%5D", "u", "u/%5B%5D"}


def test_policy_names_and_members_are_both_accepted() -> None:
    stmt = [Statement("t", added=["[1]"])]
    assert read_keys({"t": "maxcompute"}, stmt, LIVE) == read_keys({"t": Policy.MAXCOMPUTE}, stmt, LIVE)
    with pytest.raises(ValueError):
        read_keys({"t": "maxcompute-ish"}, stmt, LIVE)


def test_live_partitions() -> None:
    assert live_partitions(LIVE, "t") == {"[1]", "[2]"}
    assert live_partitions(LIVE, "e") == set()
    assert live_partitions(LIVE, "nope") == set()


KNOWN = [("t", "[1]"), ("t", "[2]"), ("t", "[3]"), ("u", "[]"), ("e", "[7]")]


@pytest.mark.parametrize("policy", POLICIES)
def test_whole_table_targets(policy: str) -> None:
    """A whole-table statement is replayed when anything committed since its snapshot on any
    partition its table ever had (emptied ones too) under maxcompute/append; never under parts."""
    got = whole_table_targets({"t": policy}, {"t"}, KNOWN)
    assert got == (set() if policy == "parts" else {("t", "[1]"), ("t", "[2]"), ("t", "[3]")})
    assert whole_table_targets({"t": policy}, (), KNOWN) == set()


def test_whole_table_targets_per_table() -> None:
    got = whole_table_targets({"t": "parts", "u": "append", "e": "maxcompute"}, {"t", "u", "e"}, KNOWN)
    assert got == {("u", "[]"), ("e", "[7]")}


# =============================================================================================
# fits_beside: may a member share the batch's multi with members already accepted there?
# =============================================================================================


def B(tid: str, kinds: set[Kind], removed: tuple[str, ...] = ()) -> Summary:  # noqa: N802
    return Summary(tid, frozenset(kinds), frozenset(removed))


T1 = ("t", "[1]")


def test_append_inserts_share() -> None:
    in_batch = {T1: [B("A", {INS}), B("B", {INS})]}
    assert fits_beside({"t": "append"}, {T1: S({INS})}, (), in_batch)


def test_maxcompute_insert_after_insert_does_not_share() -> None:
    assert not fits_beside({"t": "maxcompute"}, {T1: S({INS})}, (), {T1: [B("A", {INS})]})


def test_maxcompute_insert_after_compaction_shares() -> None:
    """The table lets an INSERT succeed after a compaction; its rebase changes nothing."""
    for kind in (MIN, MAJ):
        assert fits_beside({"t": "maxcompute"}, {T1: S({INS})}, (), {T1: [B("A", {kind}, ("a1",))]})


def test_parts_removals_of_different_parts_share() -> None:
    in_batch = {T1: [B("A", {MUT}, ("a1",))]}
    assert fits_beside({"t": "parts"}, {T1: S({MUT}, ("a2",))}, (), in_batch)
    assert fits_beside({"t": "parts"}, {T1: S({MIN}, ("a2",))}, (), in_batch)


def test_parts_removals_of_the_same_part_do_not_share() -> None:
    in_batch = {T1: [B("A", {INS}), B("B", {MUT}, ("a1", "a2"))]}
    assert not fits_beside({"t": "parts"}, {T1: S({MAJ}, ("a2",))}, (), in_batch)
    assert not fits_beside({"t": "parts"}, {T1: S({OVW}, ("a1",))}, (), in_batch)


def test_append_overwrite_after_insert_does_not_share() -> None:
    """It would succeed, but replayed: it must also remove what the INSERT adds."""
    assert not fits_beside({"t": "append"}, {T1: S({OVW}, ("a1",))}, (), {T1: [B("A", {INS})]})


def test_append_insert_after_overwrite_shares() -> None:
    assert fits_beside({"t": "append"}, {T1: S({INS})}, (), {T1: [B("A", {OVW}, ("a1", "a2"))]})


@pytest.mark.parametrize("policy", ["maxcompute", "append"])
def test_whole_table_statement_beside_a_member_on_that_table_does_not_share(policy: str) -> None:
    """Even on another partition: the statement would be replayed on what the member adds."""
    later = {T1: S({OVW}, ("a1", "a2"))}
    assert not fits_beside({"t": policy}, later, {"t"}, {("t", "[2]"): [B("A", {INS})]})
    assert fits_beside({"t": policy, "u": policy}, later, {"t"}, {("u", "[]"): [B("A", {INS})]})


def test_whole_table_statement_under_parts_shares_unless_a_part_overlaps() -> None:
    later = {T1: S({OVW}, ("a1", "a2")), ("t", "[2]"): S({OVW}, ("b1",))}
    assert fits_beside({"t": "parts"}, later, {"t"}, {("t", "[2]"): [B("A", {INS})], ("t", "[4]"): [B("A", {INS})]})
    assert not fits_beside({"t": "parts"}, later, {"t"}, {("t", "[2]"): [B("A", {MUT}, ("b1",))]})


def test_nothing_in_common_shares() -> None:
    for policy in POLICIES:
        later = {T1: S({OVW}, ("a1",))}
        assert fits_beside({"t": policy}, later, (), {("t", "[2]"): [B("A", {OVW}, ("b1",))]})
        assert fits_beside({"t": policy}, later, (), {})


def test_any_target_in_common_can_hold_it_back() -> None:
    """Fine on one shared target, not on the other: it waits."""
    later = {T1: S({INS}), ("t", "[2]"): S({INS})}
    in_batch = {T1: [B("A", {INS})], ("t", "[2]"): [B("B", {MUT}, ("b1",))]}
    assert fits_beside({"t": "append"}, {T1: S({INS})}, (), in_batch)
    assert fits_beside({"t": "append"}, later, (), in_batch)
    assert not fits_beside(
        {"t": "maxcompute"}, later, (), {("t", "[2]"): [B("B", {MIN}, ("b1",))], T1: [B("A", {INS})]}
    )


# One member already in the batch on the target, the later one beside it (no shared removal):
# written out per policy from docs/rules.md#conflict-rules. A later INSERT fits when the rules let
# it succeed (its rebase changes nothing); anything else fits only when nothing would be replayed,
# i.e. only under ``parts``.
MAXCOMPUTE_INSERT_SUCCEEDS_AFTER = {"MINOR_COMPACT", "MAJOR_COMPACT"}


def expected_fits(policy: str, earlier: str, later: str) -> bool:
    if policy == "parts":
        return True
    if later != "INSERT":
        return False
    return policy == "append" or earlier in MAXCOMPUTE_INSERT_SUCCEEDS_AFTER


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(("earlier", "later"), list(itertools.product(KIND_NAMES, KIND_NAMES)))
def test_fits_beside_every_pair(policy: str, earlier: str, later: str) -> None:
    removes = {"INSERT": ()}
    e = B("A", {Kind(earlier)}, removes.get(earlier, ("a1",)))
    lat = S({Kind(later)}, removes.get(later, ("a2",)))
    assert fits_beside({"t": policy}, {T1: lat}, (), {T1: [e]}) is expected_fits(policy, earlier, later)
    if earlier != "INSERT" and later != "INSERT":  # both remove a1: never in one multi
        assert not fits_beside({"t": policy}, {T1: S({Kind(later)}, ("a1",))}, (), {T1: [e]})
