"""The batch composition of the group committer, as tables of cases (coordinator/core/batching.py).

Each case is a batch of member summaries in queue order and what becomes of each member:
accepted into the multi, or deferred to the next batch and why, or failed by its planning (then
neither). The expected outcomes are written out from the rules as replicas/committer.py and
docs/rules.md state them, never derived from the module under test. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from coordinator.core import batching
from coordinator.core.batching import Member, Wait
from coordinator.core.conflicts import Kind, Policy, Summary

OK = "accepted"
FAILED = "failed"


def member(
    tid: str,
    *,
    table: str = "t",
    pkey: str = "[1]",
    kinds: Iterable[str] = ("INSERT",),
    policy: Policy = Policy.MAXCOMPUTE,
    checked: Iterable[str] | None = None,
    apps: Iterable[str] = (),
    reads: Iterable[str] = (),
    writes: Iterable[str] | None = None,
    drops: Iterable[str] = (),
    whole: Iterable[str] = (),
    keys: dict | None = None,
    session: str | None = None,
    failed: bool = False,
) -> tuple[Member, bool]:
    """A member writing ``kinds`` on one target (``table``, ``pkey``) of a table of ``policy``;
    ``reads``: the tables a serializable member read (their counter targets are its read keys)."""
    target = (table, pkey)
    reads = tuple(reads)
    m = Member(
        tid,
        checked=frozenset([f"{table}/{pkey}"] if checked is None else checked),
        app_keys=frozenset(f"@app:{a}" for a in apps),
        reading=frozenset(f"{r}/[read]" for r in reads),
        read_tables=frozenset(reads),
        writes=frozenset([table] if writes is None else writes) - set(drops),
        drops=tuple(drops),
        targets={target: Summary.of(tid, kinds)} if kinds else {},
        whole_tables=frozenset(whole),
        policies={table: policy},
        keys_written=keys,
        async_session=session,
    )
    return m, failed


KNOWN = {
    **{f"{t}/[{p}]": 1 for t in "tuv" for p in (1, 2)},
    **{f"{t}/[read]": 1 for t in "tuv"},
    **{f"@app:{a}": 1 for a in "xy"},
    "t": 1,
    "u": 1,
}

# (case, members in queue order, what becomes of each)
CASES = [
    ("disjoint targets share the multi", [member("A"), member("B", pkey="[2]")], {"A": OK, "B": OK}),
    (
        "maxcompute INSERT after an INSERT on its target: not beside it",
        [member("A"), member("B")],
        {"A": OK, "B": Wait.TARGET_SHARED},
    ),
    (
        "append INSERTs on one target fit beside each other",
        [member("A", policy=Policy.APPEND), member("B", policy=Policy.APPEND)],
        {"A": OK, "B": OK},
    ),
    (
        "append MUTATE after an INSERT on its target: not beside it",
        [member("A", policy=Policy.APPEND), member("B", policy=Policy.APPEND, kinds=["MUTATE"])],
        {"A": OK, "B": Wait.TARGET_SHARED},
    ),
    (
        "a whole-table statement waits for members on its table",
        [
            member("A"),
            member("B", pkey="[2]", kinds=["OVERWRITE"], whole=["t"], checked=["t/[2]", "t/[1]"]),
        ],
        {"A": OK, "B": Wait.TARGET_SHARED},
    ),
    (
        "a keys member with keys apart from the one before fits beside it",
        [
            member("A", policy=Policy.KEYS, keys={("t", "[1]"): frozenset({(1,)})}),
            member("B", policy=Policy.KEYS, keys={("t", "[1]"): frozenset({(2,)})}),
        ],
        {"A": OK, "B": OK},
    ),
    (
        "a keys member with a key in common waits",
        [
            member("A", policy=Policy.KEYS, keys={("t", "[1]"): frozenset({(1,), (2,)})}),
            member("B", policy=Policy.KEYS, keys={("t", "[1]"): frozenset({(2,)})}),
        ],
        {"A": OK, "B": Wait.TARGET_SHARED},
    ),
    (
        "a keys member whose keys are not known waits",
        [member("A", policy=Policy.KEYS, keys={("t", "[1]"): frozenset({(1,)})}), member("B", policy=Policy.KEYS)],
        {"A": OK, "B": Wait.TARGET_SHARED},
    ),
    (
        "a keys member waits after one whose keys are not known",
        [member("A", policy=Policy.KEYS), member("B", policy=Policy.KEYS, keys={("t", "[1]"): frozenset({(1,)})})],
        {"A": OK, "B": Wait.TARGET_SHARED},
    ),
    (
        "an application's versions one commit at a time",
        [member("A", apps=["x"]), member("B", pkey="[2]", apps=["x"]), member("C", table="u", apps=["y"])],
        {"A": OK, "B": Wait.APP_TAKEN, "C": OK},
    ),
    (
        "app key taken even where the targets would fit beside",
        [member("A", policy=Policy.APPEND, apps=["x"]), member("B", policy=Policy.APPEND, apps=["x"])],
        {"A": OK, "B": Wait.APP_TAKEN},
    ),
    (
        "a serializable read of a table written before it in the batch",
        [member("A"), member("B", table="u", reads=["t"])],
        {"A": OK, "B": Wait.READ_WRITTEN},
    ),
    (
        "a serializable read of a table dropped before it in the batch",
        [member("A", table="v", drops=["t"], kinds=(), checked=[]), member("B", table="u", reads=["t"])],
        {"A": OK, "B": Wait.READ_WRITTEN},
    ),
    (
        "a serializable read whose target a member took",
        [member("A", table="u", checked=["t/[read]"]), member("B", table="v", reads=["t"])],
        {"A": OK, "B": Wait.READ_WRITTEN},
    ),
    (
        "a serializable read of a table nobody in the batch writes",
        [member("A", table="u"), member("B", table="v", reads=["t"])],
        {"A": OK, "B": OK},
    ),
    (
        "a serializable read is decided before the app key rule",
        [member("A", apps=["x"]), member("B", table="u", apps=["x"], reads=["t"])],
        {"A": OK, "B": Wait.READ_WRITTEN},
    ),
    (
        "a drop goes alone with its table: written first",
        [member("A"), member("B", table="v", drops=["t"], kinds=(), checked=[])],
        {"A": OK, "B": Wait.DROP_ALONE},
    ),
    (
        "a drop goes alone with its table: dropped first",
        [member("A", table="v", drops=["t"], kinds=(), checked=[]), member("B")],
        {"A": OK, "B": Wait.DROP_ALONE},
    ),
    (
        "two drops of one table",
        [
            member("A", table="v", drops=["t"], kinds=(), checked=[]),
            member("B", table="u", drops=["t"], kinds=(), checked=[]),
        ],
        {"A": OK, "B": Wait.DROP_ALONE},
    ),
    (
        "a drop beside writes to other tables",
        [member("A", table="u"), member("B", table="v", drops=["t"], kinds=(), checked=[])],
        {"A": OK, "B": OK},
    ),
    (
        "missing versions: deferred with key hints",
        [member("A", checked=["t/[9]"]), member("B", pkey="[2]")],
        {"A": Wait.MISSING_VERSIONS, "B": OK},
    ),
    (
        "missing versions are looked at before everything else",
        [member("A", apps=["x"]), member("B", apps=["x"], checked=["t/[9]"])],
        {"A": OK, "B": Wait.MISSING_VERSIONS},
    ),
    (
        "async order: once a member of a session waits, its later ones wait",
        [
            member("A", session="s", checked=["t/[9]"]),
            member("B", pkey="[2]", session="s"),
            member("C", table="u", session="z"),
            member("D", table="u", pkey="[2]", session="s"),
        ],
        {"A": Wait.MISSING_VERSIONS, "B": Wait.ASYNC_ORDER, "C": OK, "D": Wait.ASYNC_ORDER},
    ),
    (
        "async order: a session held by a member that does not fit",
        [member("A"), member("B", session="s"), member("C", pkey="[2]", session="s")],
        {"A": OK, "B": Wait.TARGET_SHARED, "C": Wait.ASYNC_ORDER},
    ),
    (
        "async order: a member failed by its planning holds nobody",
        [member("A", session="s", failed=True), member("B", pkey="[2]", session="s")],
        {"A": FAILED, "B": OK},
    ),
    (
        "a synchronous member that waits holds nobody",
        [member("A"), member("B"), member("C", pkey="[2]")],
        {"A": OK, "B": Wait.TARGET_SHARED, "C": OK},
    ),
]


def _compose(members: list[tuple[Member, bool]], versions=None, local=None):
    summarized: list[str] = []

    def summarize(item: tuple[Member, bool]) -> Member | None:
        summarized.append(item[0].tid)
        return None if item[1] else item[0]

    c = batching.compose(
        members,
        lambda item: item[0].async_session,
        summarize,
        dict(KNOWN) if versions is None else versions,
        {f"{t}@writes": 7 for t in "tuv"},
        local,
    )
    return c, summarized


def _outcomes(c: batching.Composition, members) -> dict[str, object]:
    got: dict[str, object] = {m.tid: FAILED for m, _ in members}
    got.update({m.tid: OK for _, m in c.accepted})
    got.update({item[0].tid: why for item, why in c.deferred})
    return got


@pytest.mark.parametrize(("case", "members", "want"), CASES, ids=[c[0] for c in CASES])
def test_composition(case: str, members, want: dict[str, object]) -> None:
    c, summarized = _compose(members)
    assert _outcomes(c, members) == want
    # A member held back by its session is not even planned; every other one is, once.
    assert summarized == [m.tid for m, _ in members if want[m.tid] is not Wait.ASYNC_ORDER]
    assert [m.tid for _, m in c.accepted] == [t for t, w in want.items() if w == OK]
    assert c.offered == len(members)


def test_accepted_take_their_keys_tables_and_counters() -> None:
    members = [
        member("A", apps=["x"]),
        member("B", table="u", reads=["v"]),
        member("C", table="v", drops=["u"], kinds=(), checked=[]),
    ]
    c, _ = _compose(members)
    assert [m.tid for _, m in c.accepted] == ["A", "B"]
    assert c.taken == {"t/[1]", "@app:x", "u/[1]", "v/[read]"}
    assert c.writing == {"t", "u"} and c.dropping == set()
    assert c.counters_checked == {"v@writes": 7}
    assert dict(c.in_batch) == {
        ("t", "[1]"): [Summary.of("A", ["INSERT"])],
        ("u", "[1]"): [Summary.of("B", ["INSERT"])],
    }


def test_missing_versions_become_key_hints() -> None:
    told = []
    members = [member("A", checked=["t/[1]", "t/[8]", "t/[9]"])]
    c = batching.compose(members, lambda i: None, lambda i: i[0], dict(KNOWN), hint=lambda i, k: told.append(k))
    assert c.hints == [(members[0], {"t/[8]", "t/[9]"})]
    assert told == [{"t/[8]", "t/[9]"}]
    assert c.stalled  # every member deferred: the batch reads more versions (NeedKeys)


@pytest.mark.parametrize(
    ("members", "stalled"),
    [
        ([member("A", checked=["t/[9]"]), member("B", checked=["t/[8]"])], True),
        ([member("A", checked=["t/[9]"]), member("B", failed=True)], False),  # one failed: not all deferred
        ([member("A", checked=["t/[9]"]), member("B")], False),
        ([member("A", failed=True)], False),
    ],
)
def test_stalled(members, stalled: bool) -> None:
    c, _ = _compose(members)
    assert c.stalled is stalled


def test_local_versions_fill_in_every_key() -> None:
    """A first attempt on local versions: every key's version is known (None: no node yet)."""
    versions: dict[str, int | None] = {}
    local = {"t/[1]": 4}.get
    c, _ = _compose([member("A"), member("B", checked=["t/[9]"], pkey="[9]")], versions, local)
    assert [m.tid for _, m in c.accepted] == ["A", "B"]
    assert versions == {"t/[1]": 4, "t/[9]": None}


# -- the versions the multi expects --------------------------------------------------------------
@pytest.mark.parametrize(
    ("taken", "versions", "local", "want", "missing"),
    [
        (["t/[1]"], {"t/[1]": 3}, None, {"t/[1]": 3}, None),
        (["@app:x"], {"@app:x": None}, None, {"@app:x": None}, None),  # no partition node: no table level
        (["t@writes"], {"t@writes": None}, None, {"t@writes": None}, None),
        (["t/[1]"], {"t/[1]": None, "t": 5}, None, {"t/[1]": None, "t": 5}, None),  # new partition node
        (["t/[1]"], {"t/[1]": None, "t": None}, None, {"t/[1]": None, "t": None}, None),  # new table target too
        (["t/[1]"], {"t/[1]": None}, None, {"t/[1]": None, "t": None}, "t"),  # table level not read
        (["t/[1]"], {"t/[1]": None}, {"t": 2}.get, {"t/[1]": None, "t": 2}, None),  # local: from the state
    ],
)
def test_expected_versions(taken, versions, local, want, missing) -> None:
    expected, table = batching.expected_versions(taken, dict(versions), local)
    assert (expected, table) == (want, missing)


def test_new_versions() -> None:
    assert batching.new_versions({"a": None, "b": 4}) == {"a": 0, "b": 5}


@pytest.mark.parametrize(
    ("members", "writing", "tables", "drops"),
    [
        ([member("A")], {"t"}, {"t": (3, False)}, []),
        (
            [member("A", table="u"), member("B", table="v", drops=["t"], kinds=(), checked=[])],
            {"u"},
            {"u": (4, False), "t": (3, True)},
            [("t", "B", 4)],
        ),
        (
            [member("A", table="v", drops=["u", "t"], kinds=(), checked=[])],
            set(),
            {"u": (4, True), "t": (3, True)},
            [("u", "A", 5), ("t", "A", 4)],  # in the order of its DROP TABLE operations
        ),
    ],
)
def test_table_writes(members, writing, tables, drops) -> None:
    got = batching.table_writes([m for m, _ in members], writing, {"t": 3, "u": 4, "v": 5})
    assert got == (tables, drops)


@pytest.mark.parametrize(
    ("kinds", "drops", "data_change"),
    [
        (["INSERT"], (), True),
        (["OVERWRITE"], (), True),
        (["MUTATE"], (), True),
        (["MINOR_COMPACT"], (), False),
        (["MINOR_COMPACT", "MAJOR_COMPACT"], (), False),
        (["MINOR_COMPACT"], ("u",), True),
        ((), ("u",), True),
    ],
)
def test_data_change(kinds, drops, data_change: bool) -> None:
    m, _ = member("A", kinds=kinds, drops=drops)
    assert m.data_change is data_change


@pytest.mark.parametrize(
    ("sizes", "limit", "want"),
    [([10, 20, 30], 20, [2]), ([10, 20], 20, []), ([21, 5, 40], 20, [0, 2]), ([], 1, [])],
)
def test_oversized(sizes, limit, want) -> None:
    """Only members each over the limit are too large: a batch of smaller ones commits whatever its total."""
    assert batching.oversized(sizes, limit) == want


def test_wait_reasons_are_distinct() -> None:
    assert len({w.value for w in Wait}) == len(Wait)
    assert {k.value for k in Kind} >= {"INSERT", "MUTATE"}
