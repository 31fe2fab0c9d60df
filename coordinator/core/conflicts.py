"""Conflict rules: which of two overlapping transactions on one target may commit.

A target is one partition of a table (the whole table when it is not partitioned); transactions
on different targets never conflict. The committing ("later") transaction is summarised by the
operation kinds it performed on the target and the parts it removes there; every transaction that
committed to the target after the later one's snapshot ("earlier", in commit order) is summarised
the same way. :func:`check` is one function over those summaries, in the manner of delta-rs's
conflict checker, so every pair of kinds is testable without ZooKeeper.

Policies (docs/rules.md#conflict-rules):

* ``maxcompute`` (docs/rules.md#policy-maxcompute): the table below, verbatim.
* ``append`` (docs/rules.md#policy-append): INSERT never fails; OVERWRITE succeeds and overwrites; MUTATE and
  compactions fail if anything else committed to the target since their snapshot.
* ``parts`` (docs/rules.md#policy-parts): only two removals of the same part conflict.

When the later transaction may commit but something committed meanwhile, :class:`Verdict`
says ``rebase``: its operations must be replayed on the current parts (metadata only where its
inputs are intact). Under ``parts`` nothing is ever replayed: an OVERWRITE removes what it saw.

A loss carries its :class:`~coordinator.core.errors.ConflictKind`: ``TARGET_CHANGED`` when a
``maxcompute`` or ``append`` cell fails; under ``parts``, ``SOURCES_REMOVED`` when the loser's
removals on the target were a compaction's (it compacted there, and neither overwrote nor
mutated), ``PART_REMOVED_TWICE`` otherwise.

:func:`fits_beside` is the group committer's question (replicas/committer.py): may a transaction
share one multi with members of the batch that touch the same targets? Which targets a commit
checks at all is :mod:`coordinator.core.targets`.

Idempotent commits (``tx.set_app_version``) have a rule of their own, :func:`check_app_versions`:
a transaction that carries an application's version at or below the committed one loses with
:class:`~coordinator.core.errors.DuplicateCommit`. The committer decides it against the state at the
version of the application's target node (:func:`coordinator.core.targets.app_key`), which the commit
multi checks and bumps, so two commits of one application are decided one after the other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from coordinator.core.errors import ConflictKind, DuplicateCommit, InvalidInput, quote


class Kind(StrEnum):
    OVERWRITE = "OVERWRITE"  # INSERT OVERWRITE, TRUNCATE
    INSERT = "INSERT"
    MUTATE = "MUTATE"  # UPDATE, DELETE
    MINOR_COMPACT = "MINOR_COMPACT"
    MAJOR_COMPACT = "MAJOR_COMPACT"


class Policy(StrEnum):
    PARTS = "parts"
    MAXCOMPUTE = "maxcompute"
    APPEND = "append"
    KEYS = "keys"  # rows by primary key (docs/rules.md#keys-tables, coordinator/core/keytables.py)


COMPACTIONS = frozenset({Kind.MINOR_COMPACT, Kind.MAJOR_COMPACT})
DATA_CHANGING = frozenset(Kind) - COMPACTIONS
_REMOVING_STATEMENTS = frozenset({Kind.OVERWRITE, Kind.MUTATE})  # besides compactions, what removes parts

_O, _I, _M, _MI, _MA = Kind.OVERWRITE, Kind.INSERT, Kind.MUTATE, Kind.MINOR_COMPACT, Kind.MAJOR_COMPACT

# MAXCOMPUTE[earlier][later]: True when the later job succeeds (docs/rules.md#policy-maxcompute, its 25 cells).
MAXCOMPUTE: dict[Kind, dict[Kind, bool]] = {
    _O: {_O: True, _I: False, _M: False, _MI: False, _MA: False},
    _I: {_O: True, _I: False, _M: False, _MI: True, _MA: False},
    _M: {_O: True, _I: False, _M: False, _MI: True, _MA: False},
    _MI: {_O: True, _I: True, _M: True, _MI: False, _MA: True},
    _MA: {_O: True, _I: True, _M: True, _MI: False, _MA: False},
}


def append_later_succeeds(earlier: Kind, later: Kind) -> bool:
    """The ``append`` policy as a table over kinds (docs/rules.md#policy-append)."""
    return later in (Kind.INSERT, Kind.OVERWRITE)


@dataclass(frozen=True)
class Summary:
    """What one transaction did on one target."""

    tid: str
    kinds: frozenset[Kind]
    removed: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def of(cls, tid: str, kinds: Iterable[Kind | str], removed: Iterable[str] = ()) -> Summary:
        return cls(tid, frozenset(Kind(k) for k in kinds), frozenset(removed))


@dataclass(frozen=True)
class Verdict:
    ok: bool
    rebase: bool = False
    winner: str | None = None
    reason: str = ""
    kind: ConflictKind | None = None  # set exactly when not ok


def later_succeeds(policy: Policy, earlier: Kind, later: Kind) -> bool:
    """The kind-level rule of a policy; ``parts`` decides on removed parts, not kinds."""
    if policy is Policy.MAXCOMPUTE:
        return MAXCOMPUTE[earlier][later]
    if policy is Policy.APPEND:
        return append_later_succeeds(earlier, later)
    return True


def check(policy: Policy | str, later: Summary, earlier: Sequence[Summary]) -> Verdict:
    """Decide whether ``later`` may commit after ``earlier`` (in commit order) on one target."""
    policy = Policy(policy)
    # The kind-level rule per distinct kinds of a winner, decided once: a target's winners since
    # an old snapshot are many (a keys target's every commit) but of few kinds.
    lost_on: dict[frozenset[Kind], tuple[Kind, Kind] | None] = {}
    for winner in earlier:
        if winner.tid == later.tid:
            continue
        if policy is Policy.PARTS:
            both = later.removed & winner.removed
            if both:
                part = sorted(both)[0]
                compacted = later.kinds & COMPACTIONS and not later.kinds & _REMOVING_STATEMENTS
                kind = ConflictKind.SOURCES_REMOVED if compacted else ConflictKind.PART_REMOVED_TWICE
                return Verdict(
                    False, winner=winner.tid, reason=f"part {part} was already removed by {winner.tid}", kind=kind
                )
            continue
        if winner.kinds not in lost_on:
            lost_on[winner.kinds] = next(
                (
                    (e, lk)
                    for e in sorted(winner.kinds)
                    for lk in sorted(later.kinds)
                    if not later_succeeds(policy, e, lk)
                ),
                None,
            )
        pair = lost_on[winner.kinds]
        if pair is not None:
            e, lk = pair
            return Verdict(
                False,
                winner=winner.tid,
                reason=f"{lk.value} conflicts with {e.value} committed earlier by {winner.tid} ({policy.value} policy)",
                kind=ConflictKind.TARGET_CHANGED,
            )
    others = any(w.tid != later.tid for w in earlier)
    return Verdict(True, rebase=others and policy is not Policy.PARTS)


def fits_beside(
    policies: Mapping[str, Policy | str],
    later: Mapping[tuple[str, str], Summary],
    whole_tables: Iterable[str],
    in_batch: Mapping[tuple[str, str], Sequence[Summary]],
) -> bool:
    """Whether a transaction may join a commit batch whose accepted members touch some of its
    targets: exactly when committing right after them would succeed with the same effect (the
    rules pass against them, and any rebase they call for is an INSERT's, which changes
    nothing). Otherwise it waits for the next batch, decided against the committed state.

    ``later`` is the transaction's effect per (table, partition key), ``whole_tables`` the
    tables it acts on as a whole (TRUNCATE without partitions), ``in_batch`` the members already
    accepted per target, in batch order; ``policies`` maps each of its tables to its policy.
    An ``append`` table's concurrent INSERTs thus share one CSN, as ``parts`` INSERTs always
    could (they check no target)."""
    for (table, pkey), summary in later.items():
        earlier = in_batch.get((table, pkey))
        if not earlier:
            continue
        v = check(policies[table], summary, earlier)
        if not v.ok or (v.rebase and (summary.removed or not summary.kinds <= {Kind.INSERT})):
            return False
    for table in whole_tables:
        if Policy(policies[table]) is not Policy.PARTS and any(t == table for t, _ in in_batch):
            return False  # a whole-table statement would be replayed on what they add
    return True


# -- idempotent commits -----------------------------------------------------------------------------
MAX_APP_ID = 256  # characters
MAX_APP_VERSION = 2**63 - 1  # a signed 64-bit integer, as JSON readers elsewhere take it


def check_app_version(app_id: object, version: object) -> tuple[str, int]:
    """An application id and version a transaction may record (``tx.set_app_version``), or
    InvalidInput naming what is wrong: the id a non-empty string of at most 256 characters with no
    control characters, the version an integer from 0 to 2**63 - 1 (not a bool)."""
    if not isinstance(app_id, str) or not 0 < len(app_id) <= MAX_APP_ID or not app_id.isprintable():
        raise InvalidInput(
            f"app_id must be a non-empty string of at most {MAX_APP_ID} printable characters, not {quote(app_id)}",
            app_id=app_id if isinstance(app_id, str) else repr(app_id),
        )
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= MAX_APP_VERSION:
        raise InvalidInput(
            f"the version of application {quote(app_id)} must be an integer from 0 to {MAX_APP_VERSION}, "
            f"not {quote(version)}",
            app_id=app_id,
            version=repr(version),
        )
    return app_id, version


def check_app_versions(
    tid: str, apps: Mapping[str, int], committed: Mapping[str, tuple[int, int]]
) -> DuplicateCommit | None:
    """Whether transaction ``tid`` carrying ``apps`` (app id -> version) may commit after
    ``committed`` (app id -> (version, CSN that holds it)): the DuplicateCommit it loses with (the
    first app in name order whose version is at or below the committed one), or None."""
    for app_id, version in sorted(apps.items()):
        held = committed.get(app_id)
        if held is not None and version <= held[0]:
            return DuplicateCommit(
                f"transaction {tid} is a duplicate commit of application {quote(app_id)} version {version}: "
                f"CSN {held[1]} already holds version {held[0]}; nothing of it was committed",
                app_id=app_id,
                version=version,
                csn=held[1],
                committed_version=held[0],
                id=tid,
            )
    return None
