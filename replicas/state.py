"""A replica's view of the log: tables, parts with their versions, tid->csn, conflict history.

Everything here is derived from log entries applied in CSN order (from the WAL on start, then
from ZooKeeper), so the state is never kept in two places that must agree: replaying the same
entries gives the same state. The snapshot version is ``applied``: every entry up to it is here.

:class:`ReplicaState` is that state with its jobs in their own modules: applying the log
(replicas/applied_state.py), pruning it and its time index (replicas/state_pruning.py), its
checkpoint form (replicas/state_checkpoint.py), and here the reads at a snapshot.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable
from dataclasses import replace

from coordinator.core.conflicts import COMPACTIONS, Summary
from coordinator.core.readsets import Touch
from coordinator.core.tabledata import partition_key
from coordinator.core.visibility import is_visible
from coordinator.model.catalog import TableDef, TableDropped, TableRecord
from parts.model.meta import PartMeta
from replicas.applied_state import PartRecord, SortedIndex, first_csn, record_csn
from replicas.state_checkpoint import StateCheckpoint
from replicas.state_pruning import TIME_TRIM_BATCH, StatePruning

__all__ = ["TIME_TRIM_BATCH", "PartRecord", "ReplicaState", "SortedIndex"]


# A point read's probe (see ReplicaState.visible): the parts of a list that may hold its keys, in
# their order, as the table is at a snapshot.
Keep = Callable[[list[PartMeta], int], list[PartMeta]]


def _name(meta: PartMeta) -> str:
    return meta.name


class ReplicaState(StateCheckpoint, StatePruning):
    """The applied log, read at a snapshot: what commits, reads and the key checks look up."""

    def created_since(self, table: str, pkey: str, snapshot: int) -> list[tuple[int, PartMeta]]:
        """``(creation CSN, meta)`` of the parts added to one target (a partition key) by commits
        after ``snapshot``, in CSN order: a bisection, not a scan of every part."""
        with self.lock:
            added = self.created.get((table, pkey), ())
            i = bisect.bisect_right(added, snapshot, key=first_csn)
            return [(csn, self.parts[name].meta) for csn, name in added[i:] if name in self.parts]

    def key_writers(
        self, table: str, pkey: str, snapshot: int, keys: Iterable[tuple], width: int
    ) -> list[tuple[int, PartMeta, bool]] | None:
        """The part of :meth:`created_since` that may write one of ``keys`` (a table of ``width``
        key columns), looked up by key, not by part: ``(creation CSN, meta, listed)``, listed
        when its summary lists one of them, else it lists none of its keys (the caller probes
        it). None when the target is not indexed here (the caller probes every part since the
        snapshot)."""
        with self.lock:
            index = self.key_index.get((table, pkey))
            found = None if index is None else index.candidates(snapshot, keys, width)
            if found is None:
                return None
            return [(csn, self.parts[name].meta, listed) for csn, name, listed in found if name in self.parts]

    def winners(self, table: str, pkey: str, snapshot: int) -> list[Summary]:
        """Commits on one target after ``snapshot``, in commit order."""
        with self.lock:
            events = self.conflict_history.get((table, pkey), [])
            i = bisect.bisect_right(events, snapshot, key=lambda e: e[0])
            return [s for _, s in events[i:]]

    def table(self, name: str, snapshot: int | None = None) -> TableDef | None:
        """The definition of ``name`` at ``snapshot`` (None: now); None if it did not exist then."""
        # No lock for the latest: one dict lookup is atomic, and a TableDef is never changed once
        # applied (every statement of every transaction asks; the state lock is the committer's).
        t = self.tables.get(name)
        if t is not None and (snapshot is None or t.csn <= snapshot):
            return t
        if snapshot is None:
            return None
        rec = self.record(name, snapshot)
        return rec if isinstance(rec, TableDef) else None

    def record(self, name: str, snapshot: int | None = None) -> TableRecord | None:
        """The last catalog record of ``name`` at or before ``snapshot`` (None: now)."""
        records = list(self.catalog.get(name, ()))  # a copy: apply may append meanwhile
        if snapshot is not None:
            records = records[: bisect.bisect_right(records, snapshot, key=record_csn)]
        return records[-1] if records else None

    def dropped_since(self, name: str, snapshot: int) -> TableDropped | None:
        """The drop that ended the table ``name`` a transaction at ``snapshot`` sees, if it was
        dropped since (and maybe created again)."""
        seen = self.table(name, snapshot)
        if seen is None:
            return None
        for rec in list(self.catalog.get(name, ())):
            if isinstance(rec, TableDropped) and rec.csn > snapshot:
                return rec
        return None

    def last_ddl(self, snapshot: int) -> int:
        """The CSN of the last catalog change at or before ``snapshot`` (0: none)."""
        i = bisect.bisect_right(self.ddl_csns, snapshot)
        return self.ddl_csns[i - 1] if i else 0

    def visible(
        self,
        table: str,
        snapshot: int,
        reader_tid: str | None = None,
        own_added: Iterable[PartMeta] = (),
        own_removed: frozenset[str] | set[str] = frozenset(),
        pkeys: Iterable[str] | None = None,
        keep: Keep | None = None,
    ) -> list[PartMeta]:
        """Parts of ``table`` visible at ``snapshot`` to ``reader_tid`` (docs/rules.md#visibility);
        with ``keep`` (a point read's probe, :data:`Keep`), only those it keeps."""
        wanted = None if pkeys is None else set(pkeys)
        if keep is not None:
            got = self._visible_kept(table, snapshot, reader_tid, own_added, own_removed, wanted, keep)
            if got is None:
                got = keep(self.visible(table, snapshot, reader_tid, own_added, own_removed, pkeys), snapshot)
            return got
        with self.lock:
            if snapshot >= self.applied and wanted is None:
                # The fast path: live parts kept sorted by name (no per-lookup sort).
                index = self.live_sorted.get(table)
                out = index.values(own_removed) if index is not None else []
                for meta in own_added:
                    if meta.table == table and meta.name not in own_removed:
                        bisect.insort(out, meta, key=_name)
                return out
            if snapshot >= self.applied:
                live = self.live.get(table, {})
                keys = live.keys() if wanted is None else (wanted & live.keys())
                names = [n for k in keys for n in live[k] if n not in own_removed]
                out = sorted((self.parts[n].meta for n in names), key=_name)
            else:
                out = self._visible_before(table, snapshot, reader_tid, own_removed, wanted)
        for meta in own_added:
            if meta.table == table and meta.name not in own_removed:
                if wanted is None or partition_key(meta.partition) in wanted:
                    bisect.insort(out, meta, key=_name)
        return out

    def _visible_before(
        self,
        table: str,
        snapshot: int,
        reader_tid: str | None,
        own_removed: frozenset[str] | set[str],
        wanted: set[str] | None,
    ) -> list[PartMeta]:
        """The committed parts of ``table`` visible at an older ``snapshot`` (below ``applied``)
        to ``reader_tid``, in name order: the records that can be visible at it, with the cheap
        tests first; the visibility rule (is_visible) decides the rest. Called with the lock held."""
        return self._visible_among(
            self._candidates(table, snapshot, reader_tid, wanted), snapshot, reader_tid, own_removed, wanted
        )

    def _visible_kept(
        self,
        table: str,
        snapshot: int,
        reader_tid: str | None,
        own_added: Iterable[PartMeta],
        own_removed: frozenset[str] | set[str],
        wanted: set[str] | None,
        keep: Keep,
    ) -> list[PartMeta] | None:
        """:meth:`visible` with ``keep`` (a point read), probing before the visibility rule: the
        parts live now, in creation order (the list the probe laid out at an earlier lookup, the
        parts committed since at its end), and those removed since ``snapshot`` are probed
        outside the lock, and the rule decides only for the few kept. The same parts as ``keep``
        of every visible part (a part kept is visible or not whatever else is there), without a
        walk of every record at each lookup. None: :meth:`_candidates` would take every record
        (an old snapshot, a committed reader)."""
        with self.lock:
            if snapshot < self.pruned:
                return None
            if reader_tid is not None and (reader_tid in self.tid_csn or self.forgotten(reader_tid)):
                return None
            index = self.live_created.get(table)
            live = index.view() if index is not None else []
            removed = self._removed_since(snapshot, len(self.all_sorted.get(table) or ()))
            if removed is None:
                return None
            recent = [rec.meta for n in removed if (rec := self.parts.get(n)) is not None and rec.meta.table == table]
        own = [
            m
            for m in own_added
            if m.table == table
            and m.name not in own_removed
            and (wanted is None or partition_key(m.partition) in wanted)
        ]
        ours = {m.name for m in own}  # not committed: no record, visible to their writer
        kept = keep(live + recent + own, snapshot)
        with self.lock:
            recs = [rec for m in kept if m.name not in ours and (rec := self.parts.get(m.name)) is not None]
            out = self._visible_among(recs, snapshot, reader_tid, own_removed, wanted)
        out += [m for m in kept if m.name in ours]
        out.sort(key=_name)
        return out

    def _visible_among(
        self,
        recs: Iterable[PartRecord],
        snapshot: int,
        reader_tid: str | None,
        own_removed: frozenset[str] | set[str],
        wanted: set[str] | None,
    ) -> list[PartMeta]:
        """The parts of committed records ``recs`` visible at ``snapshot`` to ``reader_tid``, in
        their order: the partition (``wanted``) and creation tests first, then the visibility
        rule. Called with the lock held."""
        out = []
        pkey_of: dict[tuple, str] = {}
        for rec in recs:
            meta = rec.meta
            if wanted is not None:
                pk = pkey_of.get(meta.partition)
                if pk is None:
                    pk = pkey_of[meta.partition] = partition_key(meta.partition)
                if pk not in wanted:
                    continue
            if rec.creation_csn > snapshot and meta.creation_tid != reader_tid:
                continue
            if reader_tid is None and not own_removed:
                if rec.removal_csn is None or rec.removal_csn > snapshot:
                    out.append(meta)
                continue
            removal_tid = reader_tid if meta.name in own_removed else rec.removal_tid
            removal_csn = rec.removal_csn if removal_tid == rec.removal_tid else None
            if is_visible(snapshot, reader_tid, meta.creation_tid, rec.creation_csn, removal_tid, removal_csn):
                out.append(meta)
        return out

    def _candidates(self, table: str, snapshot: int, reader_tid: str | None, wanted: set[str] | None) -> list:
        """The records of ``table`` a lookup at ``snapshot`` (below ``applied``) must test, in name
        order. A part visible there is live now or was removed after it (a removal at or below a
        snapshot hides the part from it, unless the reader made the part: a committed reader, only
        seen when a lost answer is resolved, takes the full list). So the parts live now and the
        removals newer than ``snapshot`` (the end of ``removals``, in CSN order) are enough, and a
        merge or a read a few commits behind no longer scans every record that the retention
        window holds (benchmarks/history_cost.py). Every record when that walk would be longer.
        Called with the lock held."""
        index = self.all_sorted.get(table)
        if index is None:
            return []
        if snapshot < self.pruned or (
            reader_tid is not None and (reader_tid in self.tid_csn or self.forgotten(reader_tid))
        ):
            return index.values()
        names = self._removed_since(snapshot, len(index))
        if names is None:
            return index.values()
        live = self.live.get(table, {})
        for pk in live.keys() if wanted is None else wanted & live.keys():
            names.extend(live[pk])
        parts = self.parts
        recs = {n: rec for n in names if (rec := parts.get(n)) is not None and rec.meta.table == table}
        return [recs[n] for n in sorted(recs)]

    def _removed_since(self, snapshot: int, limit: int) -> list[str] | None:
        """The names of the parts removed after ``snapshot`` (of any table: the end of
        ``removals``, newest first), or None when they are more than ``limit`` (a walk longer
        than a table's records: its every record is the shorter list). Called with the lock held."""
        names: list[str] = []
        for csn, name in reversed(self.removals):
            if csn <= snapshot:
                break
            if len(names) >= limit:
                return None
            names.append(name)
        return names

    def commit_csn(self, tid: str) -> int | None:
        """The CSN ``tid`` committed at, if this replica knows it: from the outcomes it remembers,
        else (only when :meth:`forgotten`) from a part record that it added or removed (every
        record carries its creating and removing transaction with their CSNs). None: it did not
        commit up to ``applied`` unless :meth:`forgotten` says that it may have."""
        with self.lock:
            csn = self.tid_csn.get(tid)
            if csn is not None or not self.forgotten(tid):
                return csn
            # Looked through outside the lock (commits go on meanwhile): a record's creator never
            # changes, and its removal is set once.
            recs = list(self.parts.values())
        for rec in recs:
            if rec.meta.creation_tid == tid:
                return rec.creation_csn
            if rec.removal_tid == tid and rec.removal_csn is not None:
                return rec.removal_csn
        return None

    def app_version(self, app_id: str) -> tuple[int, int] | None:
        """The highest version of application ``app_id`` committed up to ``applied``, and the CSN
        that holds it (None: none)."""
        return self.apps.get(app_id)

    def wait_applied(self, csn: int, timeout: float) -> bool:
        with self.lock:
            return self.applied_cond.wait_for(lambda: self.applied >= csn or self.failure is not None, timeout)

    def wait_versions(self, expected: dict[str, int | None], timeout: float) -> bool:
        """Wait until every target version read from ZooKeeper is reflected here."""

        def caught_up() -> bool:
            return all(v is None or self.versions.get(k, -1) >= v for k, v in expected.items())

        with self.lock:
            return self.applied_cond.wait_for(lambda: caught_up() or self.failure is not None, timeout)

    # -- what the replica's parts read and set under the state lock --------------------------
    def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait, at most ``timeout`` seconds, until ``predicate`` (called under the state lock,
        after each entry applied or failure set) holds; whether it does."""
        with self.lock:
            return self.applied_cond.wait_for(predicate, timeout)

    def creation_csns(self, names: Iterable[str]) -> dict[str, int]:
        """The creation CSN of each committed part among ``names`` (others are left out): a keys
        table orders the versions of a key by them (coordinator/core/keytables.py)."""
        with self.lock:
            return {n: rec.creation_csn for n in names if (rec := self.parts.get(n)) is not None}

    def catalog_records(self, name: str) -> list[TableRecord]:
        """Table ``name``'s records (created, altered, dropped), by CSN."""
        with self.lock:
            return list(self.catalog.get(name, ()))

    def incarnations(self) -> set[tuple[str, int]]:
        """The tables that exist now, each as its name and the CSN that created it."""
        with self.lock:
            return {(name, t.created_csn) for name, t in self.tables.items()}

    def table_defs(self) -> list[TableDef]:
        """Every definition any table had that this replica still knows (not the drops)."""
        with self.lock:
            return [r for records in self.catalog.values() for r in records if isinstance(r, TableDef)]

    def part_records(self, table: str) -> list[PartRecord]:
        """The records of ``table``'s parts, visible or removed (what prune() forgot is gone)."""
        with self.lock:
            return [self.parts[n] for n in self.by_table.get(table, ()) if n in self.parts]

    def live_names(self, table: str, at_least: int = 1) -> dict[str, list[str]]:
        """The names of ``table``'s live parts per partition key, for the partitions that hold
        at least ``at_least`` of them (names only: records are never dropped while live)."""
        with self.lock:
            return {pk: list(names) for pk, names in self.live.get(table, {}).items() if len(names) >= at_least}

    def live_count(self, table: str, pkey: str) -> int:
        """How many parts of ``table`` are visible now in partition ``pkey``: two dict lookups and
        the size of a set, without the lock (each step is atomic; the inserts' backpressure asks
        on every insert, replicas/registry.py)."""
        return len(self.live.get(table, {}).get(pkey, ()))

    def partition_keys(self, table: str) -> set[str]:
        """The partition keys of ``table`` that hold live parts or have a conflict history."""
        with self.lock:
            return set(self.live.get(table, {})) | {pk for t, pk in self.conflict_history if t == table}

    # -- what cleanup, the changefeed, the storage check, the registry and the parts listing read
    # -- under the state lock (no module but this one takes it) ----------------------
    def part(self, name: str) -> PartRecord | None:
        """Part ``name``'s record, visible or removed, or None (never committed, or forgotten by
        prune())."""
        with self.lock:
            return self.parts.get(name)

    def newest_live(self, count: int) -> list[PartRecord]:
        """The records of the ``count`` live parts in storage committed last (the storage probe at
        start; an inlined part has no file to look for)."""
        with self.lock:
            return heapq.nlargest(
                count,
                (r for r in self.parts.values() if r.removal_csn is None and not r.meta.inlined),
                key=lambda r: r.creation_csn or 0,
            )

    def created_by(self, table: str, tid: str) -> set[str]:
        """The names of ``table``'s parts that transaction ``tid`` added (a commit retried after
        its answer was lost tells it committed by them)."""
        with self.lock:
            return {n for n in self.by_table.get(table, ()) if self.parts[n].meta.creation_tid == tid}

    def listing(self, table: str) -> tuple[int, list[PartRecord]]:
        """The applied CSN and the records of ``table``'s parts, visible or removed, by name, read
        together (``client.parts``: what is visible is told against that CSN)."""
        with self.lock:
            # Copies: a removal is recorded in a record in place, three fields at once.
            return self.applied, [replace(self.parts[n]) for n in sorted(self.by_table.get(table, ()))]

    def changes_of(self, table: str) -> tuple[list[PartRecord], dict[str, list[tuple[int, Summary]]]]:
        """``table``'s part records and its conflict history per partition key, read together: the
        commits an incremental read lists are derived from both (replicas/changefeed.py)."""
        with self.lock:
            recs = [self.parts[n] for n in self.by_table.get(table, ())]
            history = {pk: list(ev) for (t, pk), ev in self.conflict_history.items() if t == table}
        return recs, history

    # -- for the group committer (replicas/committer.py): what it read under this state's lock,
    # behind methods so that the lock is taken here only, and a batch is decided on one view.
    def unchanged_since(self, applied: int) -> bool:
        """Whether no entry was applied since the applied CSN was ``applied`` (none is half
        applied while the lock is held): a batch decided on local versions is still current."""
        with self.lock:
            return self.applied == applied

    def read_set_touches(self, tables: set[str], snapshot: int) -> list[Touch]:
        """Every part of ``tables`` added or removed by a commit after ``snapshot``, except by
        transactions that only compacted these tables (they change no row): what a serializable
        transaction's read set is checked against (coordinator/core/readsets.py, check_reads)."""
        touched: list[Touch] = []
        with self.lock:
            compacted: set[str] = set()  # tids that only compacted these tables
            changed: set[str] = set()  # and the others
            for (t, _), events in self.conflict_history.items():
                if t in tables:
                    for csn, s in events:
                        if csn > snapshot:
                            (compacted if s.kinds <= COMPACTIONS else changed).add(s.tid)
            compactions = compacted - changed
            for t in tables:
                for name in self.by_table.get(t, ()):
                    rec = self.parts.get(name)
                    if rec is None:
                        continue
                    m = rec.meta
                    if rec.creation_csn > snapshot and m.creation_tid not in compactions:
                        touched.append(Touch(m.creation_tid, rec.creation_csn, t, name, m.partition, m.stats, True))
                    if (
                        rec.removal_tid is not None
                        and rec.removal_csn is not None
                        and rec.removal_csn > snapshot
                        and rec.removal_tid not in compactions
                    ):
                        touched.append(Touch(rec.removal_tid, rec.removal_csn, t, name, m.partition, m.stats, False))
        return touched
