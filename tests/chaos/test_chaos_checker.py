"""The chaos checker on hand-made histories: valid ones of each workload shape give no finding,
and each anomaly gives its own kind (and no other where that is possible). Pure code, no cluster.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from mergetxn.chaos.checker import KINDS, Finding, check, describe, summary
from mergetxn.chaos.history import Final, Header, History, Op

AUTO = "auto"


def r(t: str, k: Any, v: Any) -> list:
    return ["r", t, k, v]


def a(t: str, k: Any, e: Any) -> list:
    return ["append", t, k, e]


def d(t: str, k: Any, e: Any) -> list:
    return ["delete", t, k, e]


def s(t: str, k: Any, v: Any) -> list:
    return ["set", t, k, v]


def ow(t: str, k: Any, xs: list) -> list:
    return ["overwrite", t, k, xs]


def op(
    *mops: list,
    snap: int | None = 0,
    csn: int | None = None,
    outcome: str | None = None,
    tid: str | None = AUTO,
    replica: int = 0,
    resolved: str | None = None,
) -> Op:
    """An op; committed when it has a csn, aborted otherwise (``hist`` numbers it)."""
    outcome = outcome or ("committed" if csn is not None else "aborted")
    return Op(
        -1,
        0,
        replica,
        "test",
        tid,
        snap,
        0.0,
        1.0,
        [list(m) for m in mops],
        outcome,  # type: ignore[arg-type]
        csn,
        error=None if outcome == "committed" else "ConflictError",
        resolved=resolved,
    )


def hist(
    *ops: Op,
    tables: dict | None = None,
    initial: dict | None = None,
    workload: str = "append",
    finals: tuple[Final, ...] = (),
) -> History:
    tables = tables or {"s": "set", "g": "register"}
    for i, o in enumerate(ops):
        o.index = i
        if o.tid == AUTO:
            o.tid = f"t{i}"
    return History(Header(1, workload, "none", tables, initial or {}), list(ops), [], list(finals))


def statuses(h: History) -> dict[str, list]:
    """What a healthy replica answers for every tid: committed ones with their csn."""
    return {
        o.tid: ["committed", o.csn] if o.outcome == "committed" else ["aborted", None]
        for o in h.ops
        if o.tid is not None
    }


def with_finals(h: History, csn: int, tables: dict, replicas: int = 3) -> History:
    h.finals = [Final(i, csn, tables, statuses(h)) for i in range(replicas)]
    return h


def kinds(h: History) -> set[str]:
    return {f.kind for f in check(h)}


def only(h: History, kind: str) -> list[Finding]:
    found = check(h)
    assert {f.kind for f in found} == {kind}, [describe(f) for f in found]
    return found


# -- valid histories ---------------------------------------------------------------------------


def valid_append() -> History:
    h = hist(
        op(r("s", 1, [100]), a("s", 1, 1), r("s", 1, [1, 100]), snap=0, csn=1),
        # a group commit: two ops share csn 2
        op(r("s", 1, [1, 100]), a("s", 1, 2), snap=1, csn=2),
        op(a("s", 2, 3), r("s", 2, [3]), snap=1, csn=2),
        # aborted, but its reads (own append included) were consistent
        op(r("s", 1, [1, 2, 100]), a("s", 1, 4), r("s", 1, [1, 2, 4, 100]), snap=2),
        # indeterminate, later resolved committed by commit_status
        op(d("s", 1, 100), r("s", 1, [1, 2]), snap=2, csn=3, resolved="commit_status"),
        # whole-table read; own append then delete leaves no row
        op(
            r("s", None, {"1": [1, 2], "2": [3]}),
            a("s", 3, 5),
            d("s", 3, 5),
            r("s", 3, None),
            r("s", None, {"1": [1, 2], "2": [3]}),
            snap=3,
            csn=4,
        ),
        op(snap=None, tid=None),  # begin failed
        # a stale snapshot sees the old state; read-only, its csn is its snapshot
        op(r("s", 1, [1, 100]), r("s", 2, []), snap=1, csn=1),
        # concurrent appends to one key are fine
        op(a("s", 2, 6), snap=3, csn=5),
        op(a("s", 2, 7), r("s", 2, [3, 7]), snap=3, csn=6),
        initial={"s": {"1": [100]}},
    )
    return with_finals(h, 6, {"s": {"1": [1, 2], "2": [3, 6, 7]}})


def valid_bank() -> History:
    init = {"b": {"w": 0, "x": 10, "y": 10, "z": 0}}
    h = hist(
        op(
            r("b", None, {"w": 0, "x": 10, "y": 10, "z": 0}),
            s("b", "x", 5),
            s("b", "z", 5),
            r("b", None, {"w": 0, "x": 5, "y": 10, "z": 5}),
            snap=0,
            csn=1,
        ),
        op(r("b", "y", 10), s("b", "y", 7), r("b", "y", 7), s("b", "x", 8), snap=1, csn=2),
        # group commit of disjoint keys
        op(r("b", "z", 5), s("b", "z", 4), s("b", "x", 9), snap=2, csn=3),
        op(r("b", "y", 7), s("b", "y", 6), s("b", "w", 1), snap=2, csn=3, replica=1),
        op(r("b", None, {"w": 1, "x": 9, "y": 6, "z": 4}), s("b", "x", 0), snap=3),  # aborted
        op(r("b", None, {"w": 0, "x": 10, "y": 10, "z": 0}), snap=0, csn=0),  # read-only
        tables={"b": "register"},
        initial=init,
        workload="bank",
    )
    return with_finals(h, 3, {"b": {"w": 1, "x": 9, "y": 6, "z": 4}})


def valid_overwrite() -> History:
    """Spark jobs' INSERT OVERWRITE of one key under ``parts``: what the job saw goes, what others
    committed after its snapshot stays."""
    h = hist(
        op(a("s", 1, 1), snap=0, csn=1),
        # overwrites key 1 as of csn 1 (elements 100 and 1), reads its own result
        op(r("s", 1, [1, 100]), ow("s", 1, [10, 11]), r("s", 1, [10, 11]), snap=1, csn=3),
        # concurrent with it: an append after its snapshot survives the overwrite
        op(a("s", 1, 2), snap=1, csn=2),
        op(r("s", 1, [2, 10, 11]), r("s", None, {"1": [2, 10, 11]}), snap=3, csn=3),
        # two overwrites of a key empty at both snapshots both commit: nothing was removed twice
        op(ow("s", 2, [20]), snap=3, csn=4),
        op(ow("s", 2, [21]), snap=3, csn=5),
        op(r("s", 2, [20, 21]), snap=5, csn=5),
        # appends then overwrites in one op: only the overwrite's elements are left
        op(a("s", 3, 30), ow("s", 3, [31, 32]), r("s", 3, [31, 32]), snap=5, csn=6),
        # an aborted overwrite changes nothing
        op(ow("s", 1, [40]), snap=6),
        op(r("s", None, {"1": [2, 10, 11], "2": [20, 21], "3": [31, 32]}), snap=6, csn=6),
        # a job that joined a driver transaction: read, Spark append, overwrite of another key
        op(r("s", 1, [2, 10, 11]), a("s", 1, 50), ow("s", 2, [51]), snap=6, csn=7),
        initial={"s": {"1": [100]}},
    )
    return with_finals(h, 7, {"s": {"1": [2, 10, 11, 50], "2": [51], "3": [31, 32]}})


@pytest.mark.parametrize("make", [valid_append, valid_bank, valid_overwrite])
def test_valid_history_has_no_finding(make) -> None:
    h = make()
    assert check(h) == []
    assert sum(summary(check(h)).values()) == 0
    assert set(summary([])) == set(KINDS)


@pytest.mark.parametrize("make", [valid_append, valid_overwrite])
def test_valid_history_survives_json_lines(tmp_path, make) -> None:
    h = make()
    h.write(tmp_path / "history.jsonl")
    assert check(History.read(tmp_path / "history.jsonl")) == []


def test_empty_history() -> None:
    assert check(hist()) == []


# -- one anomaly each ----------------------------------------------------------------------------


def test_si_read_missing_a_committed_element() -> None:
    [f] = only(hist(op(a("s", 1, 1), csn=1), op(r("s", 1, []), snap=1, csn=1)), "si-read")
    assert f.ops[0] == 1 and 0 in f.ops
    assert "expected [1], got no row" in f.message and "snapshot 1" in f.message and "t1" in f.message


def test_si_read_from_the_future() -> None:
    [f] = only(hist(op(a("s", 1, 1), csn=2), op(r("s", 1, [1]), snap=1)), "si-read")
    assert "expected no row, got [1]" in f.message


def test_si_read_missing_own_write() -> None:
    only(hist(op(a("s", 1, 1), r("s", 1, []), snap=0)), "si-read")


def test_si_read_whole_table_names_the_key() -> None:
    h = hist(op(a("s", 1, 1), a("s", 2, 2), csn=1), op(r("s", None, {"1": [1]}), snap=1))
    [f] = only(h, "si-read")
    assert "s['2']" in f.message


def test_si_read_stale_register_and_duplicate_element() -> None:
    h = hist(
        op(s("g", "k", 1), a("s", 1, 9), csn=1),
        op(s("g", "k", 2), snap=1, csn=2),
        op(r("g", "k", 1), r("s", 1, [9, 9]), snap=2),
    )
    assert [f.kind for f in check(h)] == ["si-read", "si-read"]


def test_aborted_read() -> None:
    for outcome in ("aborted", "indeterminate"):
        h = hist(op(a("s", 1, 7), outcome=outcome, resolved=None), op(r("s", 1, [7]), snap=0, csn=0))
        found = [f for f in check(h) if f.kind != "unresolved"]
        assert [f.kind for f in found] == ["aborted-read"], found
        assert found[0].ops == (1, 0)


def test_aborted_read_of_a_register() -> None:
    h = hist(op(s("g", "k", 1), csn=1), op(s("g", "k", 42), snap=1), op(r("g", "k", 42), snap=1))
    only(h, "aborted-read")


def test_aborted_register_value_equal_to_a_committed_one_is_si_read() -> None:
    h = hist(
        op(s("g", "k", 1), csn=1),
        op(s("g", "k", 2), snap=1),
        op(s("g", "k", 2), snap=1, csn=2),
        op(r("g", "k", 2), snap=1),
    )
    only(h, "si-read")


def test_intermediate_read_of_a_set() -> None:
    h = hist(op(a("s", 1, 5), d("s", 1, 5), a("s", 1, 6), csn=1), op(r("s", 1, [5, 6]), snap=1))
    [f] = only(h, "intermediate-read")
    assert f.ops == (1, 0)


def test_intermediate_read_of_a_register() -> None:
    h = hist(op(s("g", "k", 1), s("g", "k", 2), csn=1), op(r("g", "k", 1), snap=1))
    only(h, "intermediate-read")


def test_lost_update_on_a_register() -> None:
    h = hist(op(s("g", "k", 1), snap=0, csn=1), op(r("g", "k", None), s("g", "k", 2), snap=0, csn=2))
    [f] = only(h, "lost-update")
    assert f.ops == (0, 1)


def test_lost_update_in_one_group_commit() -> None:
    [f] = only(hist(op(s("g", "k", 1), snap=0, csn=1), op(s("g", "k", 2), snap=0, csn=1)), "lost-update")
    assert f.ops == (0, 1)


def test_lost_update_two_deletes_of_one_element() -> None:
    h = hist(op(a("s", 1, 1), csn=1), op(d("s", 1, 1), snap=1, csn=2), op(d("s", 1, 1), snap=1, csn=3))
    only(h, "lost-update")


def test_no_lost_update_when_not_overlapping() -> None:
    assert check(hist(op(s("g", "k", 1), csn=1), op(s("g", "k", 2), snap=1, csn=2))) == []


def serializable(o: Op) -> Op:
    o.isolation = "serializable"
    return o


def write_skew(iso: str) -> History:
    """Write skew on the invariant x + y >= 1 (both 1; docs/rules.md#serializable-transactions): two
    ops each read both keys at snapshot 0 and set the other one to 0; both commit, which snapshot
    isolation allows."""
    ops = [op(r("g", "x", None), r("g", "y", None), s("g", k, 0), snap=0, csn=c) for k, c in (("x", 1), ("y", 2))]
    for o in ops:
        o.isolation = iso
    return hist(*ops)


def test_write_skew_is_a_read_set_change_only_for_serializable_ops() -> None:
    assert check(write_skew("snapshot")) == []
    [f] = only(write_skew("serializable"), "read-set-changed")
    assert f.ops == (1, 0) and "csn 1" in f.message  # the later committer read what the first wrote


def test_read_set_whole_table_read_and_a_group_commit() -> None:
    # a whole-table read is changed by a write of any key of that table, not of another table
    h = hist(op(s("g", "z", 1), snap=0, csn=1), serializable(op(r("g", None, {}), s("g", "w", 2), snap=0, csn=2)))
    only(h, "read-set-changed")
    h = hist(op(a("s", 1, 1), snap=0, csn=1), serializable(op(r("g", None, {}), s("g", "w", 2), snap=0, csn=2)))
    assert check(h) == []
    # one group commit has a serial order with the reader first; a commit before the snapshot is no change
    assert check(hist(op(s("g", "z", 1), csn=1), serializable(op(r("g", "z", None), s("g", "w", 2), csn=1)))) == []
    assert check(hist(op(s("g", "z", 1), csn=1), serializable(op(r("g", "z", 1), s("g", "w", 2), snap=1, csn=2)))) == []


def test_reads_of_other_ops_do_not_change_a_read_set() -> None:
    # an op that only read the key commits (at a csn of its own) between the snapshot and the csn
    h = hist(op(r("g", "x", None), snap=0, csn=1), serializable(op(r("g", "x", None), s("g", "y", 1), snap=0, csn=2)))
    assert check(h) == []


def test_read_only_and_aborted_serializable_ops_are_not_checked() -> None:
    # read-only: commits at its snapshot (its reads were one snapshot); aborted: did not commit
    assert check(hist(op(s("g", "x", 1), csn=1), serializable(op(r("g", "x", None), snap=0, csn=0)))) == []
    assert check(hist(op(s("g", "x", 1), csn=1), serializable(op(r("g", "x", None), s("g", "y", 1), snap=0)))) == []


LWW = {"n": "lww", "g": "register"}


def none(o: Op, durability: str = "sync", flushed: bool = False) -> Op:
    o.atomicity, o.durability, o.flushed = "none", durability, flushed
    return o


def test_lww_overlapping_writers_both_commit_and_the_later_csn_wins() -> None:
    h = hist(
        none(op(s("n", "k", 1), snap=0, csn=1)),
        none(op(s("n", "k", 2), snap=0, csn=2)),
        op(r("n", "k", 2), snap=2, csn=2),
        tables=LWW,
    )
    assert check(with_finals(h, 2, {"n": {"k": 2}, "g": {}})) == []
    # the same two writers on a register table: a lost update
    h = hist(op(s("g", "k", 1), snap=0, csn=1), op(s("g", "k", 2), snap=0, csn=2), tables=LWW)
    only(h, "lost-update")
    # and the earlier value left in the final is a lost commit
    h = hist(none(op(s("n", "k", 1), snap=0, csn=1)), none(op(s("n", "k", 2), snap=0, csn=2)), tables=LWW)
    assert "lost-commit" in kinds(with_finals(h, 2, {"n": {"k": 1}, "g": {}}))


def test_lww_reads_see_the_latest_applied_state_never_an_older_one() -> None:
    writes = [none(op(s("n", "k", 1), snap=0, csn=1)), none(op(s("n", "k", 2), snap=1, csn=2))]
    # begun at snapshot 1, it may read 1 (its snapshot's value) or 2 (committed after it)
    for seen in (1, 2):
        assert check(hist(*writes, none(op(r("n", "k", seen), snap=1, csn=1)), tables=LWW)) == []
    # never what was overwritten before its snapshot, nor an aborted write, nor past its own write
    only(hist(*writes, none(op(r("n", "k", 1), snap=2, csn=2)), tables=LWW), "si-read")
    only(
        hist(*writes, none(op(s("n", "k", 9), snap=2)), none(op(r("n", "k", 9), snap=2, csn=2)), tables=LWW),
        "aborted-read",
    )
    only(hist(*writes, none(op(s("n", "j", 5), s("n", "k", 7), r("n", "k", 2), snap=1, csn=3)), tables=LWW), "si-read")
    # a whole-table read: each key checked the same way
    assert check(hist(*writes, none(op(r("n", None, {"k": 2}), snap=1, csn=1)), tables=LWW)) == []
    only(hist(*writes, none(op(r("n", None, {"k": 1}), snap=2, csn=2)), tables=LWW), "si-read")


def test_flushed_async_commit_must_commit() -> None:
    h = hist(none(op(s("n", "k", 1), snap=0, csn=None, outcome="aborted"), "async", flushed=True), tables=LWW)
    [f] = only(h, "lost-commit")
    assert "flush acknowledged" in f.message
    # not flushed: a crash may lose it, whole; one that wrote nothing leaves no trace to confirm
    assert check(hist(none(op(s("n", "k", 1), snap=0, outcome="aborted"), "async"), tables=LWW)) == []
    assert check(hist(none(op(r("n", "k", None), snap=0, outcome="aborted"), "async", flushed=True), tables=LWW)) == []


def test_async_commits_of_one_client_commit_in_its_order() -> None:
    a, b = none(op(s("n", "k", 1), snap=0, csn=2), "async"), none(op(s("n", "j", 1), snap=0, csn=1), "async")
    [f] = only(hist(a, b, tables=LWW), "async-order")
    assert f.ops == (0, 1)
    b.replica = 1  # another replica: another session, no order promised
    assert check(hist(a, b, tables=LWW)) == []


def test_final_missing_an_acknowledged_element_is_a_lost_commit() -> None:
    h = hist(op(a("s", 1, 1), csn=1), op(a("s", 1, 2), snap=1, csn=2))
    with_finals(h, 2, {"s": {"1": [1]}}, replicas=1)
    [f] = only(h, "lost-commit")
    assert "expected [1, 2], got [1]" in f.message and f.ops == (1,)


def test_status_aborted_for_an_acknowledged_commit() -> None:
    h = with_finals(hist(op(a("s", 1, 1), csn=1)), 1, {"s": {"1": [1]}}, replicas=2)
    h.finals[1].statuses["t0"] = ["aborted", None]
    [f] = only(h, "lost-commit")
    assert "replica 1 answers aborted" in f.message


def test_status_with_another_csn() -> None:
    h = with_finals(hist(op(a("s", 1, 1), csn=1)), 1, {"s": {"1": [1]}}, replicas=1)
    h.finals[0].statuses["t0"] = ["committed", 3]
    only(h, "lost-commit")


def test_read_only_commit_needs_no_status() -> None:
    h = with_finals(hist(op(r("s", 1, None), csn=0)), 0, {})
    h.finals[0].statuses["t0"] = ["not_committed", None]
    assert check(h) == []


def test_replicas_diverging_at_one_csn() -> None:
    h = with_finals(hist(op(a("s", 1, 1), csn=1)), 1, {"s": {"1": [1]}}, replicas=2)
    h.finals[1] = Final(1, 1, {"s": {"1": [1], "2": [99]}}, h.finals[1].statuses)
    assert kinds(h) == {"divergence", "lost-commit"}  # replica 1 also differs from the model
    [div] = [f for f in check(h) if f.kind == "divergence"]
    assert "s['2']" in div.message


def test_replicas_at_different_csns() -> None:
    h = with_finals(hist(op(a("s", 1, 1), csn=1), op(a("s", 1, 2), snap=1, csn=2)), 2, {"s": {"1": [1, 2]}}, replicas=2)
    h.finals[0] = Final(0, 1, {"s": {"1": [1]}}, h.finals[0].statuses)
    found = only(h, "divergence")
    assert len(found) == 2  # different csns, and replica 0 behind op 1's commit
    assert found[1].ops == (1,)


def test_reused_tid() -> None:
    [f] = only(hist(op(a("s", 1, 1), csn=1, tid="x"), op(a("s", 1, 2), snap=1, csn=2, tid="x")), "tid-reused")
    assert f.ops == (0, 1)


def test_unresolved() -> None:
    [f] = only(hist(op(a("s", 1, 1), outcome="indeterminate")), "unresolved")
    assert f.ops == (0,) and "indeterminate" in f.message


def test_committed_without_csn_is_unresolved() -> None:
    only(hist(op(a("s", 1, 1), outcome="committed")), "unresolved")


def test_bank_total_broken_in_a_read_and_a_final() -> None:
    init = {"b": {"x": 10, "y": 10}}
    h = hist(
        op(r("b", None, {"x": 10, "y": 10}), s("b", "x", 5), csn=1),  # money vanished
        op(r("b", None, {"x": 5, "y": 10}), snap=1),
        tables={"b": "register"},
        initial=init,
        workload="bank",
    )
    with_finals(h, 1, {"b": {"x": 5, "y": 10}}, replicas=1)
    found = only(h, "invariant")
    assert len(found) == 2 and "sum 15, not 20" in found[0].message


def test_bank_table_by_name_in_another_workload() -> None:
    h = hist(
        op(s("bank1", "x", 5), csn=1),
        op(r("bank1", None, {"x": 5}), snap=1),
        tables={"bank1": "register", "g": "register"},
        initial={"bank1": {"x": 10}},
    )
    only(h, "invariant")
    h.header.tables = {"g": "register"}
    assert check(h) == []


def test_bank_read_after_own_write_is_not_checked() -> None:
    h = hist(
        op(s("b", "x", 5), r("b", None, {"x": 5, "y": 10}), snap=0),
        tables={"b": "register"},
        initial={"b": {"x": 10, "y": 10}},
        workload="bank",
    )
    assert check(h) == []


def test_overwrite_that_left_what_it_saw_is_si_read() -> None:
    h = hist(op(a("s", 1, 1), snap=0, csn=1), op(ow("s", 1, [2]), snap=1, csn=2), op(r("s", 1, [1, 2]), snap=2, csn=2))
    [f] = only(h, "si-read")
    assert "expected [2], got [1, 2]" in f.message and f.ops == (2, 0)


def test_overwrite_that_removed_a_later_commit_is_si_read() -> None:
    """An element committed after the overwrite's snapshot must survive it."""
    h = hist(
        op(a("s", 1, 1), snap=0, csn=1),
        op(ow("s", 1, [3]), snap=1, csn=3),
        op(a("s", 1, 2), snap=1, csn=2),
        op(r("s", 1, [3]), snap=3, csn=3),
    )
    [f] = only(h, "si-read")
    assert "expected [2, 3], got [3]" in f.message


def test_two_overlapping_overwrites_removing_one_element_are_a_lost_update() -> None:
    h = hist(op(a("s", 1, 1), snap=0, csn=1), op(ow("s", 1, [2]), snap=1, csn=2), op(ow("s", 1, [3]), snap=1, csn=3))
    [f] = only(h, "lost-update")
    assert f.ops == (1, 2) and "delete 1 from s['1']" in f.message
    # one after the other (the second saw the first): fine
    h = hist(
        op(a("s", 1, 1), snap=0, csn=1),
        op(ow("s", 1, [2]), snap=1, csn=2),
        op(ow("s", 1, [3]), snap=2, csn=3),
        op(r("s", 1, [3]), snap=3, csn=3),
    )
    assert check(h) == []


def test_overwrite_beside_a_delete_of_an_element_it_saw_is_a_lost_update() -> None:
    h = hist(
        op(a("s", 1, 1), a("s", 1, 2), snap=0, csn=1),
        op(d("s", 1, 1), snap=1, csn=2),
        op(ow("s", 1, [3]), snap=1, csn=2),
    )
    assert kinds(h) == {"lost-update"}


def test_reading_an_element_the_op_itself_overwrote_is_intermediate() -> None:
    h = hist(op(a("s", 1, 1), ow("s", 1, [2]), snap=0, csn=1), op(r("s", 1, [1, 2]), snap=1, csn=1))
    only(h, "intermediate-read")


def test_aborted_overwrite_elements_visible() -> None:
    h = hist(op(ow("s", 1, [1]), snap=0, outcome="aborted"), op(r("s", 1, [1]), snap=0, csn=0))
    only(h, "aborted-read")


def test_final_still_holding_what_an_overwrite_removed_is_a_lost_commit() -> None:
    h = hist(op(a("s", 1, 1), snap=0, csn=1), op(ow("s", 1, [2]), snap=1, csn=2))
    with_finals(h, 2, {"s": {"1": [1, 2]}})
    assert kinds(h) == {"lost-commit"}


def test_final_showing_an_aborted_element() -> None:
    h = with_finals(hist(op(a("s", 1, 1), csn=1), op(a("s", 1, 2), snap=1)), 1, {"s": {"1": [1, 2]}}, replicas=1)
    [f] = only(h, "aborted-visible")
    assert f.ops == (1,)


def test_malformed_reads_are_findings_not_crashes() -> None:
    h = hist(op(r("s", 1, 5), r("g", "k", [1, 2]), r("s", None, None), snap=0))
    assert [f.kind for f in check(h)] == ["si-read", "si-read"]


def test_describe_and_summary() -> None:
    f = Finding("lost-update", "x and y", (1, 2))
    assert describe(f) == "lost-update: x and y [ops 1, 2]"
    assert summary([f, f])["lost-update"] == 2 and summary([f])["si-read"] == 0


def test_kinds_are_documented() -> None:
    assert set(KINDS) == {
        "si-read",
        "aborted-read",
        "intermediate-read",
        "lost-update",
        "lost-commit",
        "divergence",
        "tid-reused",
        "unresolved",
        "invariant",
        "aborted-visible",
        "read-set-changed",
        "async-order",
    }
    assert all(KINDS.values())


# -- generated histories -----------------------------------------------------------------------


def generate(seed: int, n: int = 60, overwrites: bool = False) -> History:
    """A valid history: ops begin at the latest csn or (append-only) an older one, commit in csn
    order (sometimes two at one csn, writing disjoint keys), sometimes abort; every read is the
    model's state at the snapshot plus the op's own writes. With ``overwrites``, ops at the
    latest csn also overwrite keys (what they saw goes; appends of concurrent older ops stay)."""
    rnd = random.Random(seed)
    keys = ["1", "2", "3"]
    states: list[dict] = [{"s": {}, "g": {}}]  # state after csn i
    ops: list[Op] = []
    elem = 0
    for _ in range(n):
        group = 2 if rnd.random() < 0.2 else 1
        csn, latest = len(states), len(states) - 1
        used: set[str] = set()
        for _ in range(group):
            free = [k for k in keys if k not in used]
            old = rnd.random() < 0.3 or not free  # an old snapshot only reads and appends
            free = free or keys
            mops: list[list] = []
            removed: list[set] = []  # per overwrite mop: what it saw
            snap = rnd.randrange(latest + 1) if old else latest
            own = {t: dict(v) for t, v in states[snap].items()}
            for _ in range(rnd.randint(1, 5)):
                k = rnd.choice(free)
                x = rnd.random()
                if x < 0.3:
                    mops.append(r("s", k, sorted(own["s"].get(k, []))))
                elif x < 0.4:
                    mops.append(r("s", None, {kk: sorted(v) for kk, v in own["s"].items() if v}))
                elif x < 0.5:
                    mops.append(r("g", k, own["g"].get(k)))
                elif x < 0.75:
                    elem += 1
                    mops.append(a("s", k, elem))
                    own["s"][k] = own["s"].get(k, set()) | {elem}
                elif overwrites and x < 0.8 and not old:
                    new = list(range(elem + 1, elem + 1 + rnd.randint(0, 2)))
                    elem += len(new)
                    mops.append(ow("s", k, new))
                    removed.append(set(own["s"].get(k, set())))
                    own["s"][k] = set(new)
                    used.add(k)
                elif x < 0.85 and not old and own["s"].get(k):
                    e = rnd.choice(sorted(own["s"][k]))
                    mops.append(d("s", k, e))
                    own["s"][k] = own["s"][k] - {e}
                    used.add(k)
                elif not old:
                    elem += 1
                    mops.append(s("g", k, elem))
                    own["g"][k] = elem
                    used.add(k)
            commit = rnd.random() < 0.8
            writes = any(m[0] != "r" for m in mops)
            ops.append(op(*mops, snap=snap, csn=(csn if writes else snap) if commit else None))
            if commit and writes:
                if len(states) == csn:  # the group's first commit
                    states.append({t: dict(v) for t, v in states[latest].items()})
                saw = iter(removed)
                for m in mops:
                    if m[0] == "append":
                        states[-1]["s"][m[2]] = states[-1]["s"].get(m[2], set()) | {m[3]}
                    elif m[0] == "delete":
                        states[-1]["s"][m[2]] = states[-1]["s"][m[2]] - {m[3]}
                    elif m[0] == "set":
                        states[-1]["g"][m[2]] = m[3]
                    elif m[0] == "overwrite":
                        states[-1]["s"][m[2]] = (states[-1]["s"].get(m[2], set()) - next(saw)) | set(m[3])
    last = states[-1]
    h = hist(*ops)
    tables = {"s": {k: sorted(v) for k, v in last["s"].items() if v}, "g": dict(last["g"])}
    return with_finals(h, len(states) - 1, tables)


@pytest.mark.parametrize("seed", range(40))
def test_generated_valid_histories(seed: int) -> None:
    h = generate(seed)
    assert [describe(f) for f in check(h)] == []


@pytest.mark.parametrize("seed", range(40))
def test_generated_valid_histories_with_overwrites(seed: int) -> None:
    h = generate(seed, overwrites=True)
    assert any(m[0] == "overwrite" for o in h.ops if o.outcome == "committed" for m in o.mops)
    assert [describe(f) for f in check(h)] == []


@pytest.mark.parametrize("seed", range(20))
def test_generated_histories_with_overwrites_missing_one_element(seed: int) -> None:
    h = generate(seed, overwrites=True)
    rnd = random.Random(seed)
    reads = [(o, m) for o in h.ops for m in o.mops if m[0] == "r" and m[1] == "s" and m[2] is not None and m[3]]
    if not reads:
        pytest.skip("no non-empty set read")
    o, m = rnd.choice(reads)
    drop = rnd.choice(m[3])
    m[3] = [e for e in m[3] if e != drop]
    assert only(h, "si-read")[0].ops[0] == o.index


def test_op_order_in_the_file_does_not_matter() -> None:
    """history.jsonl lists ops in the order they ended, not by index."""
    h = generate(7)
    expected = check(h)
    random.Random(7).shuffle(h.ops)
    assert check(h) == expected == []
    h.ops[0].mops.append(r("s", "1", [-1]))
    assert kinds(h) == {"si-read"}


@pytest.mark.parametrize("seed", range(40))
def test_generated_histories_missing_one_element(seed: int) -> None:
    h = generate(seed)
    rnd = random.Random(seed)
    reads = [(o, m) for o in h.ops for m in o.mops if m[0] == "r" and m[1] == "s" and m[2] is not None and m[3]]
    if not reads:
        pytest.skip("no non-empty set read")
    o, m = rnd.choice(reads)
    drop = rnd.choice(m[3])
    m[3] = [e for e in m[3] if e != drop]
    found = only(h, "si-read")
    assert found[0].ops[0] == o.index


@pytest.mark.parametrize("seed", range(40))
def test_generated_histories_reading_an_aborted_element(seed: int) -> None:
    h = generate(seed)
    rnd = random.Random(seed)
    aborted = [(m[2], m[3]) for o in h.ops if o.outcome == "aborted" for m in o.mops if m[0] == "append"]
    reads = [(o, m) for o in h.ops for m in o.mops if m[0] == "r" and m[1] == "s" and m[2] is not None]
    key, elem = rnd.choice(aborted)
    o, m = rnd.choice([(o, m) for o, m in reads if m[2] == key and elem not in (m[3] or [])])
    m[3] = sorted([*(m[3] or []), elem])
    [f] = only(h, "aborted-read")
    assert f.ops[0] == o.index


def test_storage_errors_are_expected_only_under_storage_faults() -> None:
    from mergetxn.chaos.report import summarize

    h = hist(op(a("s", 1, 1), csn=1), op(a("s", 1, 2), snap=1))
    h.ops[1].error = "StorageError"
    for nemesis, unexpected in (
        ("kill-replica,wal-full", {}),
        ("s3-errors", {}),
        ("kill-replica", {"StorageError": 1}),
    ):
        h.header.nemesis = nemesis
        assert summarize(h, [])["ops"]["unexpected_errors"] == unexpected


# -- the verdict: what fails a run besides the checker's findings ------------------------------


def test_a_breach_beside_the_history_fails_the_run() -> None:
    """A part file gone or a denied call done fails the run though the history is valid (they
    were only printed as the harness's troubles, and the run exited 0)."""
    from mergetxn.chaos.run import conclude

    h = valid_append()
    assert conclude(h, None).exit_code == 0
    assert conclude(h, None, problems=["kill-replica r1: heal failed: x"]).exit_code == 0  # the harness's own
    for breach in (
        "table 'la0': part p (visible, committed at CSN 3): file 'la0/p.parquet' is missing",
        "hostile lane: replica a let the lane's reader do what its grants deny (insert)",
    ):
        result = conclude(h, None, breaches=[breach])
        assert result.exit_code == 1 and result.summary["breaches"] == [breach]


def test_a_kind_of_fault_whose_every_injection_failed_makes_the_check_incomplete() -> None:
    from mergetxn.chaos.history import Fault
    from mergetxn.chaos.run import untested_kinds

    took = Fault("kill-replica", "r1", 1.0, 2.0, "")
    failed = Fault("expire-session", "r2", 1.0, 2.0, "inject failed: HostsError: r2 has no session")
    assert untested_kinds([took, failed, Fault("expire-session", "r3", 3.0, 4.0, "")]) == []  # one took
    (why,) = untested_kinds([took, failed])
    assert why.startswith("no expire-session fault took effect: all 1 injection(s) failed (inject failed: HostsError")
    assert untested_kinds([]) == []
