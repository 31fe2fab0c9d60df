"""How the committer decides one member of a batch: the conflict rules against what committed on
its targets since its snapshot (a loss raised, a rebase replayed on the current parts), the
key conflicts of keys tables, the checked targets of its multi (:class:`Plan`), and a
serializable transaction's read set (coordinator/core/readsets.py). :class:`CommitRules` is the
base of ``Committer`` (replicas/committer.py), which batches, writes and answers."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from coordinator.core.conflicts import (
    Policy,
    Summary,
    check,
)
from coordinator.core.errors import (
    ConflictError,
    ConflictKind,
    InvalidInput,
    MergetxnError,
    quote,
)
from coordinator.core.readsets import Shape, check_reads, counter_key
from coordinator.core.readsets import read_keys as read_set_keys
from coordinator.core.tabledata import partition_key
from coordinator.core.targets import (
    Statement,
    app_key,
    checked_keys,
    read_keys,
    whole_table_targets,
)
from coordinator.model.atomicity import NONE
from coordinator.model.catalog import TableDef, TableDropped
from coordinator.model.records import Compact, Insert, Mutate, Overwrite, StagedOp, Truncate
from coordinator.zk.log import (
    VersionMoved,
)
from parts.model.meta import PartMeta
from replicas.commit_outcome import UNKNOWN_OUTCOME
from replicas.commit_queue import Pending
from replicas.keylocks import KeyConflicts
from replicas.running import Effect, RunningTxn

if TYPE_CHECKING:
    from coordinator.zk.log import CsnLog
    from parts.io.storage import Storage
    from replicas.state import ReplicaState


@dataclass
class Plan:
    """A member's folded effect, the targets its multi checks, and (computed once, read by the
    verdicts, the checked targets and the batching summary alike) its effect per target and the
    conflict policy of every table in it."""

    effect: Effect
    checked: set[str]
    summaries: dict[tuple[str, str], Summary] = field(default_factory=dict)
    policies: dict[str, Policy] = field(default_factory=dict)


class CommitRules:
    """The deciding half of the committer, over the fields ``Committer.__init__`` sets."""

    state: ReplicaState
    log: CsnLog
    storage: Storage
    table: Callable[[str], TableDef]
    catch_up: Callable[[], None]
    key_conflicts: KeyConflicts
    _counters: set[str]  # write counters known to exist (coordinator/core/readsets.py)

    # -- deciding ----------------------------------------------------------------------------
    def _policy(self, table: str) -> Policy:
        t = self.state.tables.get(table)
        if t is None and isinstance(self.state.record(table), TableDropped):
            # dropped: the member loses to the drop (_plan); until then, the last definition's
            return next(
                (r.conflict_policy for r in reversed(self.state.catalog.get(table, [])) if isinstance(r, TableDef)),
                Policy.PARTS,
            )
        return (t or self.table(table)).conflict_policy

    def _policies(self, tables) -> dict[str, Policy]:
        return {t: self._policy(t) for t in tables}

    def _initial_keys(self, p: Pending) -> set[str]:
        parts = self.state.parts
        statements = [
            Statement(
                op.table,
                added=[partition_key(m.partition) for m in op.added],
                removed=[rec.pkey for rec in map(parts.get, op.removed) if rec is not None],
                partitions=op.partitions or (),
                whole_table=op.whole_table,
            )
            for op in p.committing.ops
        ]
        keys = read_keys(self._policies({op.table for op in p.committing.ops}), statements, self.state.live)
        return keys | {app_key(a) for a in p.committing.apps}

    def _pkeys_of(self, txn: RunningTxn, names: Iterable[str], own: dict[str, PartMeta]) -> dict[str, str]:
        out = {}
        for n in names:
            if n in own:
                out[n] = partition_key(own[n].partition)
                continue
            rec = self.state.parts.get(n)
            if rec is None:
                raise InvalidInput(f"transaction {txn.id} removes unknown part {n}")
            out[n] = rec.pkey
        return out

    def _fold(self, txn: RunningTxn, ops: list[StagedOp]) -> Effect:
        eff = Effect()
        for op in ops:
            eff.add_op(op, self._pkeys_of(txn, op.removed, eff.added))
        return eff

    def _plan(self, p: Pending) -> Plan:
        txn = p.committing
        for table in sorted({op.table for op in txn.ops}):
            self._check_not_dropped(txn, table)
        plan = self._planned(txn, self._fold(txn, txn.ops))
        if self._verdicts(txn, plan):
            plan = self._planned(txn, self._replay(p))
            self._verdicts(txn, plan)
        if txn.atomicity != NONE:  # atomicity "none" takes no locks: the later commit wins per key
            added = plan.effect.added
            self.key_conflicts.check(
                txn.id, txn.snapshot, added, {m.table: plan.policies[m.table] for m in added.values()}
            )
        plan.checked = checked_keys(plan.policies, plan.summaries, plan.effect.whole_tables, self.state.live)
        return plan

    def _planned(self, txn: RunningTxn, eff: Effect) -> Plan:
        """``eff`` with its summaries per target and its tables' policies (checked: not yet)."""
        summaries = eff.summaries(txn.id)
        return Plan(eff, set(), summaries, self._policies({t for t, _ in summaries} | eff.whole_tables))

    def _check_not_dropped(self, txn: RunningTxn, table: str) -> None:
        """A transaction writing (or dropping) a table that was dropped after its snapshot loses to
        the drop, whether or not a table of that name was created again since."""
        drop = self.state.dropped_since(table, txn.snapshot)
        if drop is None and self.state.tables.get(table) is None:
            rec = self.state.record(table)
            drop = rec if isinstance(rec, TableDropped) else None
        if drop is not None:
            raise ConflictError(
                f"transaction {txn.id} lost to {drop.tid} on table {quote(table)}: the table was dropped at CSN "
                f"{drop.csn} (after this transaction's snapshot {txn.snapshot})",
                winner=drop.tid,
                kind=str(ConflictKind.TABLE_DROPPED),
                table=table,
                csn=drop.csn,
            )

    def _verdicts(self, txn: RunningTxn, plan: Plan) -> bool:
        """Apply the conflict rules to every target; raise on a loss; True if a rebase is needed."""
        rebase = False
        eff, summaries, policies = plan.effect, plan.summaries, plan.policies
        for (table, pkey), later in sorted(summaries.items()):
            winners = self.state.winners(table, pkey, txn.snapshot)
            v = check(policies[table], later, winners)
            if not v.ok:
                where = f"table {quote(table)}" + (f" partition {pkey}" if pkey != "[]" else "")
                raise ConflictError(
                    f"transaction {txn.id} lost to {v.winner} on {where}: {v.reason}",
                    winner=v.winner,
                    kind=str(v.kind),
                    table=table,
                    partition=pkey,
                )
            rebase |= v.rebase
        if rebase or not eff.whole_tables:
            return rebase
        targets = whole_table_targets(policies, eff.whole_tables, list(self.state.conflict_history))
        return any(self.state.winners(t, pk, txn.snapshot) for t, pk in targets)

    # -- serializable transactions (coordinator/core/readsets.py) ------------------------------------
    @staticmethod
    def _serializable(p: Pending) -> bool:
        """A member whose read set is checked: it read something and writes something."""
        return p.txn is not None and bool(p.txn.reads) and bool(p.txn.ops)

    def _catch_up_for_reads(self) -> None:
        """Apply the log up to its end before deciding read sets: a ``parts`` INSERT committed by
        another replica moves no target node, so only the log itself shows it."""
        try:
            self.catch_up()
        except MergetxnError as exc:
            raise VersionMoved(f"could not catch up with the log to decide a read set: {exc}") from exc

    def _read_counters(self, members: list[Pending]) -> dict[str, int]:
        """The write counters of every table a serializable member read, as ZooKeeper has them."""
        keys = {counter_key(r.table) for p in members if self._serializable(p) for r in p.committing.reads}
        try:
            found = self.log.ensure_counters(keys)
        except UNKNOWN_OUTCOME as exc:
            raise VersionMoved(f"ZooKeeper connection lost while reading write counters: {quote(exc)}") from exc
        self._counters |= keys
        return found

    def _counters_bumped(self, writing: set[str], dropping: set[str]) -> set[str]:
        """The write counters a batch bumps: of every ``parts`` table written (their INSERTs move
        no target) and every table dropped; created first where this replica never saw them."""
        keys = {counter_key(t) for t in writing if self._policy(t) is Policy.PARTS}
        keys |= {counter_key(t) for t in dropping}
        if keys - self._counters:
            try:
                self.log.ensure_counters(keys - self._counters)
            except UNKNOWN_OUTCOME as exc:
                raise VersionMoved(f"ZooKeeper connection lost while creating write counters: {quote(exc)}") from exc
            self._counters |= keys
        return keys

    def _shapes(self, tables) -> dict[str, Shape]:
        out = {}
        for t in tables:
            tdef = self.state.tables.get(t)
            if tdef is not None:
                out[t] = Shape(
                    tuple(tdef.partition_by),
                    tdef.schema,
                    tuple(tdef.primary_key) if tdef.conflict_policy is Policy.KEYS else None,
                )
        return out

    def _known_pkeys(self, table: str) -> set[str]:
        return self.state.partition_keys(table)

    def _read_keys(self, p: Pending) -> set[str]:
        """Targets a serializable member checks and bumps for its reads (readsets.read_keys)."""
        if not self._serializable(p):
            return set()
        tables = {r.table for r in p.committing.reads}
        return read_set_keys(p.committing.reads, {t: self._known_pkeys(t) for t in tables}, self._shapes(tables))

    def _check_reads(self, p: Pending) -> None:
        """Fail a serializable member whose read set a commit after its snapshot changed: every
        part of a table it read added or removed since, except by compactions (they change no
        row), decided by readsets.check_reads."""
        if not self._serializable(p):
            return
        txn = p.committing
        tables = {r.table for r in txn.reads}
        touched = self.state.read_set_touches(tables, txn.snapshot)
        lost = check_reads(txn.id, txn.reads, touched, self._shapes(tables))
        if lost is not None:
            raise lost

    def _replay(self, p: Pending) -> Effect:
        """Re-apply the transaction's operations on the parts as they are now."""
        from parts.io import rewrite

        txn = p.committing
        eff = Effect()
        for op in txn.ops:
            tdef = self.table(op.table)
            if tdef.conflict_policy is Policy.PARTS or isinstance(op, Insert):
                eff.add_op(op, self._pkeys_of(txn, op.removed, eff.added))
                continue
            pkeys = None if op.whole_table else op.partitions
            own_removed = set(eff.removed) | {m.name for m in eff.discarded}
            current = self.state.visible(
                op.table, self.state.applied, txn.id, list(eff.added.values()), own_removed, pkeys
            )
            if isinstance(op, Overwrite | Truncate):
                new_added = {m.name for m in op.added}
                op = replace(op, removed=tuple(m.name for m in current if m.name not in new_added))
            elif isinstance(op, Mutate | Compact) and not set(op.removed) <= {m.name for m in current}:
                p.extra_files.extend(op.added)  # the staged output is superseded: delete it too
                csns = self.state.creation_csns(m.name for m in current)  # a keys table's compaction orders by them
                op = rewrite.redo(self.storage, tdef, op, current, txn.id, csns)
                p.extra_files.extend(op.added)
            eff.add_op(op, self._pkeys_of(txn, op.removed, eff.added))
        return eff
