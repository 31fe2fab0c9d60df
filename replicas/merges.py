"""Background merges on one replica.

A replica looks at each ``auto_merge`` table every ``merge_interval`` seconds; when a partition has
``merge_min_parts`` small parts in one size tier (minor: ``coordinator.core.mergeplan.small_merge``,
so a row is rewritten once per tier, not at every merge), or, for a keys table, ``merge_min_parts``
parts past ``merge_small_bytes`` in one size tier (minor: ``mergeplan.tiered_merge``, so the
versions a read folds stay bounded under endless upserts), or has been idle
``major_idle_seconds`` with several parts (major), it takes the table's lock ``leaders/<table>`` (kazoo's Lock recipe, without waiting),
catches up with the log, and merges as an ordinary transaction (an ID version, no time version). A
merge that loses a conflict is logged, recorded as an event (replicas/changefeed.py) and retried later.
A partition's inlined parts (small writes, docs/architecture/small-writes.md) are flushed by such a
merge once ``mergeplan.inline_flush`` says so, on every table, ``auto_merge`` or not.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from coordinator.core import mergeplan
from coordinator.core.conflicts import Policy
from coordinator.core.errors import ConflictError, MergetxnError
from coordinator.model.catalog import TableDef
from coordinator.model.records import TxnState
from parts.io.format import delete_part
from parts.model.meta import PartMeta
from replicas import failpoints

if TYPE_CHECKING:
    from kazoo.client import KazooClient

    from coordinator.zk.log import CsnLog
    from parts.io.storage import Storage
    from replicas.registry import Transactions
    from replicas.settings import ReplicaConfig
    from replicas.state import ReplicaState

log = logging.getLogger(__name__)

MERGE_ROUND_SECONDS = 5.0  # a round keeps merging what is due (re-planned after each pass) at most this long
# After a round that merged, the next comes this soon, not ``merge_interval`` later: under
# sustained inserts a second's wait let 200 parts pile up before each round, past
# ``parts_to_delay_insert``, while each merge took 30 ms (benchmarks/soak.py).
BUSY_SECONDS = 0.2


MergeKind = Literal["minor", "major"]  # a minor merge of small parts, or a major one of a whole partition


class Merges:
    """Merge planning and merge transactions of one replica (``replica.merges``)."""

    def __init__(
        self,
        state: ReplicaState,
        config: ReplicaConfig,
        storage: Storage,
        zk: KazooClient,
        log: CsnLog,
        host_id: str,
        transactions: Transactions,
        table: Callable[[str], TableDef],
        catch_up: Callable[[], None],
        record: Callable[..., None],
        stopping: threading.Event,
    ) -> None:
        """``table``: a table's definition now; ``catch_up``: apply the log up to its end;
        ``record``: note an event in the replica's history (replicas/changefeed.py)."""
        self.state, self.config, self.storage, self.zk, self.log = state, config, storage, zk, log
        self.host_id, self.transactions, self.table, self.catch_up, self.record = (
            host_id,
            transactions,
            table,
            catch_up,
            record,
        )
        self._stop = stopping  # the replica is stopping: no further merges this round
        self._locks: dict[str, Any] = {}
        self._backoff: dict[tuple[str, str], float] = {}
        self._last_round = 0.0
        self._busy = False  # the last round merged: the next comes after BUSY_SECONDS
        self.outcomes: dict[str, int] = {"committed": 0, "conflict": 0, "failed": 0, "skipped": 0}  # metrics

    def start(self) -> None:
        zk = self.zk
        zk.retry(zk.ensure_path, self.log.leaders_path())

    def background_round(self, now: float) -> None:
        """The merges thread's turn: a merge round every ``merge_interval`` seconds, or
        :data:`BUSY_SECONDS` after a round that merged."""
        interval = self.config.merge_interval
        if interval > 0 and now - self._last_round >= (min(interval, BUSY_SECONDS) if self._busy else interval):
            self._last_round = now
            self._busy = self.merge_round() > 0

    def plan_merges(self, tdef: TableDef, flush_only: bool = False) -> list[tuple[MergeKind, str, list[PartMeta]]]:
        """(kind, pkey, sources) per partition that the policy says to merge now; ``flush_only``:
        only flushes of inlined parts (a table without ``auto_merge`` has its inlined parts
        flushed all the same: they live in log entries, WAL and checkpoints, which are bounded)."""
        now = time.time()
        live = self.state.live_names(tdef.name, at_least=1)  # the metas are looked up after
        parts = self.state.parts
        # A keys table's minor merge takes its parts in commit order: parts next to each
        # other in version order fold into fewer versions (coordinator/core/keytables.py, "runs").
        order = (
            (lambda m: (parts[m.name].creation_csn, m.name))
            if tdef.conflict_policy is Policy.KEYS
            else (lambda m: m.name)
        )
        plans: list[tuple[MergeKind, str, list[PartMeta]]] = []
        for pkey, names in sorted(live.items()):
            metas = [parts[n].meta for n in names if n in parts]
            # Flushes only (no auto_merge): the inlined parts alone are looked at, not sorted with
            # every other (thousands of parts in a table left unmerged: a sort per round).
            metas = sorted((m for m in metas if m.inlined) if flush_only else metas, key=order)
            plan = self._partition_plan(tdef, metas, now, flush_only)
            if plan is not None:
                plans.append((plan[0], pkey, plan[1]))
        return [p for p in plans if self._backoff.get((tdef.name, p[1]), 0) <= time.monotonic()]

    def _partition_plan(
        self, tdef: TableDef, metas: list[PartMeta], now: float, flush_only: bool
    ) -> tuple[MergeKind, list[PartMeta]] | None:
        """What to merge of one partition's live parts (``metas``), or None."""
        c = self.config
        inlined = [m for m in metas if m.inlined]
        due = mergeplan.inline_flush(
            [(m.size, m.created_at) for m in inlined],
            c.inline_flush_parts,
            c.inline_flush_bytes,
            c.inline_flush_seconds,
            now,
        )
        if due:  # a flush: the partition's inlined parts (the oldest first) become a part in storage
            return "minor", sorted(inlined, key=lambda m: (m.created_at, m.name))[: max(2, c.merge_max_parts)]
        if flush_only or len(metas) < 2:
            return None
        sizes = [0 if m.inlined else m.size for m in metas]  # an inlined part is tier 0
        small = mergeplan.small_merge(sizes, c.merge_small_bytes, c.merge_min_parts, c.merge_max_parts)
        tiered = (
            mergeplan.tiered_merge(sizes, c.merge_small_bytes, c.merge_min_parts, c.merge_max_parts)
            if tdef.conflict_policy is Policy.KEYS
            else []
        )
        if small or tiered:  # small parts by size tier, then a keys table's big ones
            return "minor", [metas[i] for i in small or tiered]
        if (
            len(metas) >= max(2, c.major_min_parts)
            and len(metas) <= c.merge_max_parts
            and sum(m.size for m in metas) <= c.major_max_bytes
            and now - max(m.created_at for m in metas) >= c.major_idle_seconds
        ):
            return "major", metas
        return None

    def merge_round(self) -> int:
        """Look at every table once (one without ``auto_merge`` for flushes of inlined parts only);
        returns how many merges committed here."""
        done = 0
        for name in sorted(self.state.tables):
            tdef = self.state.tables.get(name)
            if tdef is None or self._stop.is_set():
                continue
            if not self.plan_merges(tdef, flush_only=not tdef.auto_merge):
                continue
            lock = self._locks.get(name)
            if lock is None:
                lock = self._locks[name] = self.zk.Lock(self.log.leaders_path(name), identifier=self.host_id)
            if not lock.acquire(blocking=False):
                continue
            try:
                self.catch_up()  # what another replica merged before we got the lock is seen now
                # Plan again after merges that committed (writers keep adding parts): a round
                # that merged once per partition fell behind a few busy writers, and every part
                # left unmerged costs each later read and merge.
                budget = time.monotonic() + MERGE_ROUND_SECONDS
                while not self._stop.is_set():
                    merged = sum(
                        self.run_merge(tdef, kind, pkey, [m.name for m in sources]).get("outcome") == "committed"
                        for kind, pkey, sources in self.plan_merges(self.table(name), not tdef.auto_merge)
                    )
                    done += merged
                    if not merged or time.monotonic() > budget:
                        break
            finally:
                try:
                    lock.release()
                except Exception:  # pragma: no cover - session trouble; the node is ephemeral
                    pass
        return done

    def _not_merged(self, event: dict, outcome: str, reason: str, backoff: float) -> dict:
        """A merge that did not commit: its partition waits ``backoff`` seconds before the next
        one, and the outcome is counted and recorded."""
        self._backoff[(event["table"], event["partition"])] = time.monotonic() + backoff
        self.outcomes[outcome] += 1
        self.record("merge", outcome=outcome, reason=reason, **event)
        return {"outcome": outcome, "reason": reason}

    def run_merge(
        self,
        tdef: TableDef,
        kind: MergeKind,
        pkey: str,
        sources: list[str],
        before_commit: Callable[[], None] | None = None,
    ) -> dict:
        """Merge ``sources`` (parts of one partition) in a transaction of its own. A conflict is
        logged and recorded, never raised; the partition is retried after a short back-off."""
        from parts.io import rewrite

        txns = self.transactions
        txn = txns.begin()
        event = {
            "table": tdef.name,
            "partition": pkey,
            "kind": kind,
            "tid": txn.id,
            "snapshot": txn.snapshot,
            "sources": list(sources),
        }
        result = None
        staged = False
        try:
            _, visible = txns.visible_parts(tdef.name, txn.id, pkeys=[pkey])
            wanted = set(sources)
            parts = [m for m in visible if m.name in wanted]
            if len(parts) < (1 if any(m.inlined for m in parts) else 2):  # one inlined part alone is flushed
                txns.rollback(txn.id, "nothing left to merge")
                self._not_merged(event, "skipped", "sources no longer visible", 1.0)
                return {"outcome": "skipped"}
            csns = self.state.creation_csns(m.name for m in visible)  # a keys table's versions are ordered by them
            # exactly these; a flush's inlined parts also stored in a bundle beside its part (spill)
            result = rewrite.compact(self.storage, tdef, parts, "major", txn.id, csns, visible, spill=True)
            op = result.compaction(tdef.name, kind, (pkey,))
            txns.stage(txn.id, op, written_here=True)
            staged = True
            if failpoints.ON and any(m.inlined for m in parts):  # a flush: its file written, not committed
                failpoints.hit("flush_before_commit")  # (tests/faults/test_inline_faults.py)
            if before_commit is not None:
                before_commit()
            csn = txns.commit(txn.id)
        except ConflictError as exc:
            log.info("merge of %s partition %s lost a conflict (retried later): %s", tdef.name, pkey, exc.message)
            return self._not_merged(event, "conflict", exc.message, 2.0)
        except MergetxnError as exc:
            log.warning("merge of %s partition %s failed: %s", tdef.name, pkey, exc.message)
            return self._not_merged(event, "failed", exc.message, 10.0)
        finally:
            if txn.state == TxnState.RUNNING:
                txns.abort(txn, "merge failed")
            if result is not None and not staged:
                for m in result.added:
                    delete_part(self.storage, m.path)
        self.record("merge", outcome="committed", csn=csn, **event)
        self.outcomes["committed"] += 1
        return {"outcome": "committed", "csn": csn, "removed": len(result.removed), "added": len(result.added)}
