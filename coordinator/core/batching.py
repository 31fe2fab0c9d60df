"""Which members of a commit batch share its multi, and what that multi expects.

The group committer (replicas/committer.py) plans each member against the state (the conflict
rules, key locks, staged files, read sets: all I/O or state) and summarises what the plan says as a
:class:`Member`, plain frozen data. From those summaries alone this module decides, as delta-rs's
conflict checker decides from its ``WinningCommitSummary``, which members are accepted into the
batch and which wait for the next one and why (:func:`compose`), the target versions the multi
expects (:func:`expected_versions`), the table nodes it checks or tombstones and the drops it
records (:func:`table_writes`), and which member records are data changes or too large.

It lives in the pure core (no ZooKeeper, no storage, no replica types: it is under mypy and
tested as tables of cases in tests/unit/test_batching.py) because nothing here needs more than
strings, versions and the conflict rules' summaries; the committer turns the answers into log
records and znode writes.

Two members of a batch never check the same target unless the second fits beside the first
(:func:`coordinator.core.conflicts.fits_beside`), so their verdicts cannot depend on each other.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, TypeVar

from coordinator.core.conflicts import DATA_CHANGING, Policy, Summary, fits_beside
from coordinator.core.readsets import counter_key

Target = tuple[str, str]  # (table, partition key)
T = TypeVar("T")


class Wait(StrEnum):
    """Why a member waits for the next batch."""

    ASYNC_ORDER = "an earlier async commit of its client session waits for the next batch"
    MISSING_VERSIONS = "the versions of some targets it checks were not read"
    READ_WRITTEN = "a member accepted before it writes what it read"
    APP_TAKEN = "a member accepted before it records a version of the same application"
    TARGET_SHARED = "it does not fit beside the members accepted before it on a target"
    DROP_ALONE = "a dropped table goes alone with its drop"


@dataclass(frozen=True)
class Member:
    """What the composition needs of one planned member: its targets and tables, no state.

    ``checked``: the targets its conflict rules check (target keys, coordinator/core/targets.py);
    ``app_keys``: its applications' targets; ``reading``: the targets its read set checks (empty
    unless it is serializable), over ``read_tables``; ``writes``/``drops``: the tables it writes
    and those it drops (one per DROP TABLE, in order); ``targets``: its effect per (table, partition key), as the rules take it;
    ``whole_tables``: tables it acts on as a whole; ``policies``: the policy of each of its
    tables; ``keys_written``: per keys target, the keys it writes there (None where its keys are
    not known: it then shares any keys target); ``async_session``: its client's async session."""

    tid: str
    checked: frozenset[str] = frozenset()
    app_keys: frozenset[str] = frozenset()
    reading: frozenset[str] = frozenset()
    read_tables: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()
    drops: tuple[str, ...] = ()  # in the order of its DROP TABLE operations
    targets: Mapping[Target, Summary] = field(default_factory=dict)
    whole_tables: frozenset[str] = frozenset()
    policies: Mapping[str, Policy] = field(default_factory=dict)
    keys_written: Mapping[Target, frozenset[tuple[Any, ...]]] | None = None
    async_session: str | None = None

    @property
    def keys(self) -> set[str]:
        """Every target the multi checks and bumps for it."""
        return set(self.checked) | self.app_keys | self.reading

    @property
    def data_change(self) -> bool:
        """Whether its record carries a time version: it changes rows (a compaction alone does
        not) or drops a table."""
        return any(k in DATA_CHANGING for s in self.targets.values() for k in s.kinds) or bool(self.drops)


@dataclass
class Composition(Generic[T]):
    """The outcome of :func:`compose`: the accepted members (in batch order, with their
    summaries), the deferred ones with why, the key hints of those deferred for missing
    versions, and what the accepted ones take together."""

    offered: int = 0
    accepted: list[tuple[T, Member]] = field(default_factory=list)
    deferred: list[tuple[T, Wait]] = field(default_factory=list)
    hints: list[tuple[T, set[str]]] = field(default_factory=list)
    taken: set[str] = field(default_factory=set)
    writing: set[str] = field(default_factory=set)  # tables the accepted members write
    dropping: set[str] = field(default_factory=set)  # tables an accepted member drops
    counters_checked: dict[str, int] = field(default_factory=dict)
    in_batch: dict[Target, list[Summary]] = field(default_factory=lambda: defaultdict(list))
    held: set[str] = field(default_factory=set)  # async sessions with a member deferred
    planned: dict[str, Mapping[Target, frozenset[tuple[Any, ...]]] | None] = field(default_factory=dict)  # keys written

    @property
    def stalled(self) -> bool:
        """Nothing accepted and every member deferred: the batch needs more target versions."""
        return not self.accepted and bool(self.deferred) and len(self.deferred) == self.offered


def shares_keys(
    policies: Mapping[str, Policy],
    targets: Mapping[Target, Summary],
    mine: Mapping[Target, frozenset[tuple[Any, ...]]] | None,
    in_batch: Mapping[Target, Sequence[Summary]],
    planned: Callable[[str], Mapping[Target, frozenset[tuple[Any, ...]]] | None],
) -> bool:
    """Whether a member must wait because it has a key in common with a member already accepted
    on a keys target they both write (or the keys of either are not known): two writes of a key
    never share a CSN. ``planned(tid)``: the keys another member writes per target."""
    for target in targets:
        if policies.get(target[0]) is not Policy.KEYS or target not in in_batch:
            continue
        my_keys = (mine or {}).get(target)
        if my_keys is None:
            return True
        for other in in_batch[target]:
            theirs = (planned(other.tid) or {}).get(target)
            if theirs is None or not my_keys.isdisjoint(theirs):
                return True
    return False


def _wait(c: Composition[T], m: Member, known: Mapping[str, int | None], keys: set[str]) -> Wait | None:
    """Why ``m`` waits for the next batch given the members accepted so far, or None."""
    if any(k not in known for k in keys):
        return Wait.MISSING_VERSIONS
    if m.reading and (m.reading & c.taken or m.read_tables & (c.writing | c.dropping)):
        return Wait.READ_WRITTEN  # the next batch decides it against their commit
    if keys & c.taken:
        if m.app_keys & c.taken:
            return Wait.APP_TAKEN  # an application's versions are decided one commit at a time
        if shares_keys(m.policies, m.targets, m.keys_written, c.in_batch, c.planned.get) or not fits_beside(
            m.policies, m.targets, m.whole_tables, c.in_batch
        ):
            return Wait.TARGET_SHARED
    if set(m.drops) & (c.dropping | c.writing) or m.writes & c.dropping:
        return Wait.DROP_ALONE
    return None


def _accept(c: Composition[T], item: T, m: Member, keys: set[str], read_counters: Mapping[str, int]) -> None:
    c.dropping |= set(m.drops)
    c.writing |= m.writes
    c.taken |= keys
    if m.reading:
        c.counters_checked.update({counter_key(t): read_counters[counter_key(t)] for t in m.read_tables})
    c.accepted.append((item, m))
    c.planned[m.tid] = m.keys_written
    for target, s in m.targets.items():
        c.in_batch[target].append(s)


def compose(
    items: Iterable[T],
    session: Callable[[T], str | None],
    summarize: Callable[[T], Member | None],
    versions: MutableMapping[str, int | None],
    read_counters: Mapping[str, int] = {},
    local: Callable[[str], int | None] | None = None,
    hint: Callable[[T, set[str]], None] | None = None,
) -> Composition[T]:
    """Accept or defer each of ``items`` in order. ``session(item)``: its async session;
    ``summarize(item)``: its summary, or None when planning failed it (it is then neither
    accepted nor deferred); called only for a member not held back by its session.
    ``versions``: the target versions read; ``local``: the version of a target this replica
    applied (a first attempt on local versions: every target's version is then known, and
    ``versions`` is filled in); ``read_counters``: the write counters of the tables read;
    ``hint(item, keys)``: told at once of the keys whose versions a deferred member misses (the
    next attempt reads them), as :attr:`Composition.hints` lists them."""
    c: Composition[T] = Composition()
    for item in items:
        c.offered += 1
        s = session(item)
        if s is not None and s in c.held:
            c.deferred.append((item, Wait.ASYNC_ORDER))
            continue  # one client's async commits get CSNs in the order it made them
        m = summarize(item)
        if m is None:
            continue
        keys = m.keys
        if local is not None:
            for k in keys - versions.keys():
                versions[k] = local(k)
        why = _wait(c, m, versions, keys)
        if why is None:
            _accept(c, item, m, keys, read_counters)
            continue
        if why is Wait.MISSING_VERSIONS:
            c.hints.append((item, {k for k in keys if k not in versions}))
            if hint is not None:
                hint(item, c.hints[-1][1])
        c.deferred.append((item, why))
        if s is not None:
            c.held.add(s)
    return c


def expected_versions(
    taken: Iterable[str],
    versions: MutableMapping[str, int | None],
    local: Callable[[str], int | None] | None = None,
) -> tuple[dict[str, int | None], str | None]:
    """The version the multi expects of every target taken, and the first table whose
    table-level version is needed but was not read (else None): a new partition node (version
    None) moves its table's target too. ``local`` fills in that version from the replica's state."""
    expected = {k: versions[k] for k in taken}
    for k, v in list(expected.items()):
        table, pkey = k.split("/", 1)[0], ("/" in k)
        if pkey and v is None:
            if local is not None and table not in versions:
                versions[table] = local(table)
            expected[table] = versions.get(table)
            if table not in versions:
                return expected, table
    return expected, None


def new_versions(expected: Mapping[str, int | None]) -> dict[str, int]:
    """The versions the targets have once the multi bumped them (recorded in the entry)."""
    return {k: (0 if v is None else v + 1) for k, v in expected.items()}


def table_writes(
    members: Sequence[Member], writing: Iterable[str], table_versions: Mapping[str, int]
) -> tuple[dict[str, tuple[int, bool]], list[tuple[str, str, int]]]:
    """The table nodes the multi writes: every table written checked at the version of the
    definition it was decided on, and a dropped one set past it (``True``: tombstoned); and the
    drops as (table, tid, new DDL version). So no commit decided before a DDL on its table
    happens after it."""
    tables = {t: (table_versions[t], False) for t in writing}
    drops = []
    for m in members:
        for table in m.drops:
            v = table_versions[table]
            tables[table] = (v, True)
            drops.append((table, m.tid, v + 1))
    return tables, drops


def oversized(sizes: Sequence[int], limit: int) -> list[int]:
    """The positions of the member records over ``limit`` bytes (``max_commit_bytes``): a batch
    of members each under the limit commits whatever its total."""
    return [i for i, size in enumerate(sizes) if size > limit]
