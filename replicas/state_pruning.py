"""Forgetting what no served snapshot needs: a replica state's pruning (parts removed, history,
indexes, the catalog), its time index (commit times by CSN) and the outcomes it still knows."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from coordinator.core.errors import SnapshotUnavailable
from coordinator.core.versions import Tid
from coordinator.model.catalog import TableDropped
from replicas.applied_state import AppliedState, PartRecord, first_csn, record_csn

TIME_TRIM_BATCH = 1000  # commit times forgotten at once past every window (StatePruning._trim_times)


class StatePruning(AppliedState):
    """Pruning below a floor, and the time index and outcome lookups that pruning bounds."""

    def prune(self, floor: int) -> int:
        """Forget the parts removed at or below ``floor``, and the conflict history at or below
        it; returns how many part records went. The caller guarantees that no snapshot below
        ``floor`` is served any more and that the files of those parts are collected: no served
        snapshot can see such a part (its removal is at or below every one of them), no running
        transaction's conflict check looks at commits at or below its snapshot, and incremental
        reads starting below ``floor`` are refused (see ``pruned``)."""
        with self.lock:
            floor = min(floor, self.applied)
            if floor <= self.pruned:
                return 0
            gone = self._prune_parts(floor)
            self._prune_history(floor)
            self._trim_times(floor)
            self._prune_indexes(floor)
            self._prune_catalog(floor)
            self.pruned = floor
            return gone

    def _prune_parts(self, floor: int) -> int:
        """Forget the part records removed at or below ``floor`` (under the lock); how many went."""
        gone = 0
        lost = self.lost
        while self.removals and self.removals[0][0] <= floor:
            removed_at, name = self.removals.popleft()
            rec = self.parts.pop(name, None)
            if rec is None:
                continue
            gone += 1
            table = rec.meta.table
            if removed_at > lost.get(table, 0):
                lost[table] = removed_at
            self.by_table[table].discard(name)
            index = self.all_sorted.get(table)
            if index is not None:
                index.remove(name)
        return gone

    def _prune_history(self, floor: int) -> None:
        """Forget the conflict history and the creations at or below ``floor`` (under the lock)."""
        lost_history = self.lost_history
        for (table, _), events in self.conflict_history.items():
            i = bisect.bisect_right(events, floor, key=lambda e: e[0])
            if i:
                if events[i - 1][0] > lost_history.get(table, 0):
                    lost_history[table] = events[i - 1][0]
                del events[:i]
        for target, added in list(self.created.items()):
            i = bisect.bisect_right(added, floor, key=first_csn)
            if i == len(added):
                del self.created[target]
            elif i:
                del added[:i]

    def _prune_indexes(self, floor: int) -> None:
        """Forget the DDL CSNs and the key index entries at or below ``floor`` (under the lock)."""
        i = bisect.bisect_right(self.ddl_csns, floor) - 1
        if i > 0:
            del self.ddl_csns[:i]  # the last at or below the floor stays: it defines snapshots above
        for target, index in list(self.key_index.items()):
            index.prune(floor)
            if index.empty() and target not in self.created:
                del self.key_index[target]

    def _prune_catalog(self, floor: int) -> None:
        """Forget the table records no snapshot above ``floor`` needs (under the lock)."""
        lost = self.lost
        for name, records in list(self.catalog.items()):
            i = bisect.bisect_right(records, floor, key=record_csn)
            if i and isinstance(records[i - 1], TableDropped) and i == len(records):
                del self.catalog[name]  # dropped for good: no served snapshot sees it
            elif i > 1:
                self.catalog[name] = records[i - 1 :]  # the one that holds at floor stays
                lost[name] = max(lost.get(name, 0), records[i - 1].csn)

    def _trim_times(self, floor: int) -> None:
        """Forget the times of the commits at or below ``floor`` but the last (a time after it
        still finds it), once they are :data:`TIME_TRIM_BATCH` or more: the index then holds the
        windows' commits, not history, and a delete from the front of a list is paid rarely."""
        i = bisect.bisect_right(self.time_csns, floor) - 1
        if i >= TIME_TRIM_BATCH:
            self.time_trimmed = self.time_csns[i - 1]
            del self.time_csns[:i]
            del self.time_values[:i]

    # -- what pruning leaves known ---------------------------------------------------------
    def lost_below(self, table: str, history: bool = False) -> int:
        """A snapshot of ``table`` below this is incomplete here (``history``: its ``changes``
        from below it are)."""
        lost = self.lost.get(table, 0)
        return max(lost, self.lost_history.get(table, 0)) if history else lost

    # -- outcomes (replicas/outcomes.py, replicas/commit_outcome.py, cleanup, recovery) ----------
    def forgotten(self, tid: str) -> bool:
        """Whether ``tid`` may have committed at a CSN whose outcome this replica forgot: it began
        below ``outcome_floor``. One that began at or above it committed, if at all, above it,
        where every commit applied here is remembered: its absence from ``tid_csn`` then means
        that it did not commit up to ``applied``."""
        try:
            return Tid.parse(tid).start_csn < self.outcome_floor
        except ValueError:
            return False  # not a tid: never in the log

    @contextmanager
    def outcomes_kept(self) -> Iterator[None]:
        """Forget no outcome while open: a lost commit answer is looked up in the log meanwhile
        (replicas/commit_outcome.py), however long ZooKeeper takes to come back."""
        with self.lock:
            self._outcomes_kept += 1
        try:
            yield
        finally:
            with self.lock:
                self._outcomes_kept -= 1

    def sizes(self) -> dict[str, int]:
        """How many entries each structure of the applied state holds now (``info``'s
        ``structures``; their bounds: docs/architecture/bounds.md)."""
        with self.lock:
            return {
                "part_records": len(self.parts),
                "removed_part_records": len(self.removals),
                "outcomes": len(self.tid_csn),
                "time_versions": len(self.time_csns),
                "conflict_history": sum(len(v) for v in self.conflict_history.values()),
                "created": sum(len(v) for v in self.created.values()),
                "catalog_records": sum(len(v) for v in self.catalog.values()),
                "ddl_csns": len(self.ddl_csns),
                "apps": len(self.apps),
                "versions": len(self.versions),
            }

    def outcome_counts(self) -> dict:
        """What the outcome window holds (``info``): transactions remembered, and the floor."""
        with self.lock:
            return {"remembered": len(self.tid_csn), "floor": self.outcome_floor, "seconds": self.outcome_seconds}

    def csn_at_time(self, when: float, strict: bool = True) -> int:
        """Snapshot of the last data-changing commit at or before ``when`` (0 if none). A time
        before the commit times kept here (:meth:`_trim_times`) raises SnapshotUnavailable, or
        (not ``strict``) answers the last CSN forgotten, a lower bound."""
        with self.lock:
            i = bisect.bisect_right(self.time_values, when)
            if i:
                return self.time_csns[i - 1]
            if not self.time_trimmed:
                return 0
            if not strict:
                return self.time_trimmed
            first = datetime.fromtimestamp(self.time_values[0], UTC).isoformat()
            raise SnapshotUnavailable(
                f"{datetime.fromtimestamp(when, UTC).isoformat()} is older than the commit times this replica "
                f"keeps (from {first}): older ones are forgotten once past every table's retention window "
                "(retention_seconds)",
                time=when,
            )

    def time_versions(self) -> dict[int, float]:
        """Each data-changing commit's CSN with its time version."""
        with self.lock:
            return dict(zip(self.time_csns, self.time_values))

    def removed_after(self, csn: int) -> list[PartRecord]:
        """The records of the parts removed by a commit above ``csn``, in removal order (cleanup:
        what a pass may delete that the last one did not): the end of ``removals``, not a scan of
        every record."""
        with self.lock:
            out = []
            for removed_at, name in reversed(self.removals):  # in CSN order: the newest first
                if removed_at <= csn:
                    break
                rec = self.parts.get(name)
                if rec is not None:
                    out.append(rec)
            out.reverse()
            return out

    def removed_held(self) -> int:
        """How many removed parts the state still holds (for the retention windows): what its
        export grows with besides the live parts."""
        return len(self.removals)
