"""A replica's view of the log: tables, parts with their versions, tid->csn, conflict history.

Everything here is derived from log entries applied in CSN order (from the WAL on start, then
from ZooKeeper), so the state is never kept in two places that must agree: replaying the same
entries gives the same state. The snapshot version is ``applied``: every entry up to it is here.
This module applies entries; replicas/state.py composes the whole :class:`ReplicaState`.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from itertools import chain
from typing import Generic, TypeVar

from coordinator.core import keytables
from coordinator.core.conflicts import Kind, Policy, Summary
from coordinator.core.keyindex import KeyIndex
from coordinator.core.tabledata import partition_key
from coordinator.model.catalog import TableDef, TableDropped, TableRecord
from coordinator.model.records import Change, LogEntry
from parts.model.meta import PartMeta

log = logging.getLogger(__name__)


def first_csn(t: tuple) -> int:
    return t[0]


def record_csn(r: TableRecord) -> int:
    return r.csn


def keys_at(records: list[TableRecord], csn: int) -> bool:
    """Whether the table of these records (by CSN) was a keys table at ``csn``."""
    i = bisect.bisect_right(records, csn, key=record_csn)
    last = records[i - 1] if i > 0 else None
    return isinstance(last, TableDef) and last.conflict_policy is Policy.KEYS


K = TypeVar("K", str, tuple[int, str])  # a part's name, or its creation CSN and name


class SortedIndex(Generic[K]):
    """Values kept in key order, in chunks of at most ``2 * CHUNK``: an insert or removal moves
    at most a chunk (a flat sorted list of 100,000 parts moved the whole list, ~0.1 ms per part
    applied); :meth:`values` copies a flattened list, rebuilt only after a change (its keys only when
    some are left out)."""

    CHUNK = 512

    def __init__(self, items: Iterable[tuple[K, object]] = ()) -> None:
        pairs = sorted(items, key=lambda kv: kv[0])
        self._keys: list[list[K]] = [
            [k for k, _ in pairs[i : i + self.CHUNK]] for i in range(0, len(pairs), self.CHUNK)
        ]
        self._vals = [[v for _, v in pairs[i : i + self.CHUNK]] for i in range(0, len(pairs), self.CHUNK)]
        self._maxes: list[K] = [ks[-1] for ks in self._keys]
        self._len = len(pairs)
        self._flat: list | None = None
        self._flat_keys: list[K] | None = None

    def __len__(self) -> int:
        return self._len

    def add(self, key: K, value: object) -> None:
        """Insert, or replace the value of an existing key."""
        self._flat = self._flat_keys = None
        if not self._keys:
            self._keys, self._vals, self._maxes = [[key]], [[value]], [key]
            self._len = 1
            return
        c = min(bisect.bisect_left(self._maxes, key), len(self._maxes) - 1)
        keys, vals = self._keys[c], self._vals[c]
        i = bisect.bisect_left(keys, key)
        if i < len(keys) and keys[i] == key:
            vals[i] = value
            return
        keys.insert(i, key)
        vals.insert(i, value)
        self._maxes[c] = keys[-1]
        self._len += 1
        if len(keys) > 2 * self.CHUNK:
            self._keys[c : c + 1] = [keys[: self.CHUNK], keys[self.CHUNK :]]
            self._vals[c : c + 1] = [vals[: self.CHUNK], vals[self.CHUNK :]]
            self._maxes[c : c + 1] = [keys[self.CHUNK - 1], keys[-1]]

    def remove(self, key: K) -> None:
        """Remove ``key`` if present."""
        c = bisect.bisect_left(self._maxes, key)
        if c == len(self._maxes):
            return
        keys, vals = self._keys[c], self._vals[c]
        i = bisect.bisect_left(keys, key)
        if i == len(keys) or keys[i] != key:
            return
        del keys[i]
        del vals[i]
        self._flat = self._flat_keys = None
        self._len -= 1
        if keys:
            self._maxes[c] = keys[-1]
        else:
            del self._keys[c], self._vals[c], self._maxes[c]

    def keys(self) -> list[K]:
        return list(chain.from_iterable(self._keys))

    def view(self) -> list:
        """The values in key order, the list kept until the next change (the caller must not
        change it: a point read's probe lists them at every lookup, and copying thousands of
        parts each time showed in the replica's profile)."""
        if self._flat is None:
            self._flat = list(chain.from_iterable(self._vals))
        return self._flat

    def values(self, without: frozenset[K] | set[K] = frozenset()) -> list:
        """The values in key order, leaving out the keys in ``without`` (a new list: the caller
        may change it). A few keys left out are found by bisection, not by a scan."""
        out = self.view().copy()
        if not without:
            return out
        if self._flat_keys is None:
            self._flat_keys = list(chain.from_iterable(self._keys))
        keys = self._flat_keys
        if len(without) <= 64:
            drop = []
            for k in without:
                i = bisect.bisect_left(keys, k)
                if i < len(keys) and keys[i] == k:
                    drop.append(i)
            for i in sorted(drop, reverse=True):
                del out[i]
        else:
            out = [v for k, v in zip(keys, out) if k not in without]
        return out


@dataclass
class PartRecord:
    meta: PartMeta
    creation_csn: int
    removal_tid: str | None = None
    removal_csn: int | None = None
    removal_time: float | None = None  # the removing commit's time (its log entry's): history retention

    @property
    def removed_csn(self) -> int:
        """The CSN that removed this part, for a part known to be removed (cleanup's candidates)."""
        assert self.removal_csn is not None, f"part {self.meta.name} is not removed"
        return self.removal_csn

    @property
    def pkey(self) -> str:
        return partition_key(self.meta.partition)


class AppliedState:
    """The fields derived from the log and the application of one entry to them."""

    def __init__(self, outcome_seconds: float = math.inf, clock: Callable[[], float] = time.time) -> None:
        """``outcome_seconds``: how long a commit's outcome is remembered (the replica setting;
        unbounded by default); ``clock``: now, which the log entries' times never run ahead of."""
        self.lock = threading.RLock()
        self.applied_cond = threading.Condition(self.lock)
        self.applied = 0
        self.position = (0, 0)  # (epoch, next sequence number) to fetch
        self.tables: dict[str, TableDef] = {}  # the tables that exist now (the last record of each name)
        # Every name's records, by CSN: created, altered, dropped (coordinator/model/catalog.py).
        self.catalog: dict[str, list[TableRecord]] = {}
        self.ddl_csns: list[int] = []  # CSNs of the entries that changed the catalog, ascending
        self.parts: dict[str, PartRecord] = {}
        self.by_table: dict[str, set[str]] = defaultdict(set)
        self.live: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        self._init_outcomes(outcome_seconds, clock)
        self.conflict_history: dict[tuple[str, str], list[tuple[int, Summary]]] = defaultdict(list)
        self.versions: dict[str, int] = {}
        # Idempotent commits: app id -> (highest version committed, the CSN that holds it). State,
        # not history: never pruned, carried by every checkpoint.
        self.apps: dict[str, tuple[int, int]] = {}
        self.time_csns: list[int] = []  # CSNs of data-changing commits, ascending
        self.time_values: list[float] = []  # their time versions
        # prune() forgets the front of both, past every window, in batches of TIME_TRIM_BATCH (state_pruning.py);
        # the last CSN it forgot (0: none), and times before what is kept are then unknown here.
        self.time_trimmed = 0
        self.failure: Exception | None = None  # a log entry that could not be applied
        # Live parts per table sorted by name, names and metas side by side: the latest-snapshot
        # lookup is then a list copy, not a sort of every live part (benchmarks/snapshot_lookup.py).
        self.live_sorted: dict[str, SortedIndex[str]] = {}  # name -> PartMeta of the live parts
        # The same in creation order ((creation CSN, name) -> PartMeta): what a point read's
        # probe lists, so the parts committed since its last layout come at the end of the list
        # (in name order they fall between others and the probe aligned piece by piece).
        self.live_created: dict[str, SortedIndex[tuple[int, str]]] = {}
        self.all_sorted: dict[str, SortedIndex[str]] = {}  # name -> PartRecord of every part
        self.applied_count = 0  # entries applied by this process (local checkpoints count them)
        # Parts removed, in removal order (removals are applied in CSN order): prune() forgets
        # them from the front once no served snapshot can see them, so the state, its lookups
        # at older snapshots and its checkpoints do not grow with history.
        self.removals: deque[tuple[int, str]] = deque()
        self.pruned = 0  # nothing removed at or below it is known here any more
        # Per table name, the highest CSN of what prune() forgot of it that a snapshot read needs
        # (a part's removal, a superseded definition): a snapshot of it below that would be
        # incomplete; ``lost_history`` also counts its commits' summaries, which ``changes``
        # needs. Reads of tables prune() never touched stay served however far ``pruned`` moved
        # (replicas/retention.py).
        self.lost: dict[str, int] = {}
        self.lost_history: dict[str, int] = {}
        # Parts added per (table, partition key), as (creation CSN, name) in CSN order: the commits
        # since a snapshot on one target without scanning every part (replicas/keylocks.py).
        # Derived from ``parts`` (restore rebuilds it); prune drops what is at or below its floor.
        self.created: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
        # The same parts of keys tables (added while their table was one) by the keys they write,
        # per target: the key conflict check looks up the keys it writes (coordinator/core/keyindex.py).
        # Derived from ``created`` (restore rebuilds it); pruned with it.
        self.key_index: dict[tuple[str, str], KeyIndex] = {}
        # Every field above that the log derives must also be in export()/restore() (state_checkpoint.py):
        # a replica rebuilt from a checkpoint has nothing else (replicas/checkpoint.py).

    def _init_outcomes(self, outcome_seconds: float, clock: Callable[[], float]) -> None:
        """Outcomes (docs/rules.md#outcomes): tid -> the CSN it committed at, for the commits of the
        last ``outcome_seconds`` by their log entry's time (never ahead of ``clock``).
        ``outcomes`` lists them as (entry time, CSN, tids) in CSN order, and apply() forgets
        from its front, so the map and checkpoints hold the window, not history. Every commit
        above ``outcome_floor`` is in tid_csn; one at or below it may be forgotten
        (:meth:`forgotten`, :meth:`commit_csn`: then its part records may still tell)."""
        self.tid_csn: dict[str, int] = {}
        self.outcomes: deque[tuple[float, int, tuple[str, ...]]] = deque()
        self.outcome_floor = 0
        self.outcome_seconds = outcome_seconds
        self.clock = clock
        self._outcomes_kept = 0  # > 0: a lost commit answer is being looked up, forget nothing

    # -- applying the log ------------------------------------------------------------------
    def apply(self, csn: int, epoch: int, seq: int, entry: LogEntry) -> None:
        """Apply one entry (validated whole when it was decoded, so never half applied).
        Idempotent: an entry at or below ``applied`` is skipped."""
        with self.lock:
            if csn <= self.applied:
                return
            for t in entry.ddl:
                self._apply_ddl(csn, t, entry.time)
            if entry.ddl:
                self.ddl_csns.append(csn)
            data_time = None
            if entry.txns:
                self.outcomes.append((entry.time, csn, tuple(txn.tid for txn in entry.txns)))
            for txn in entry.txns:
                self.tid_csn[txn.tid] = csn
                if txn.time_version is not None:
                    data_time = txn.time_version
                for ch in txn.changes:
                    self._apply_change(csn, txn.tid, ch, entry.time)
                for app_id, version in txn.apps.items():
                    held = self.apps.get(app_id)
                    if held is None or version > held[0]:
                        self.apps[app_id] = (version, csn)
            for k, v in entry.versions.items():
                if v > self.versions.get(k, -1):
                    self.versions[k] = v
            if data_time is not None:
                self.time_csns.append(csn)
                self.time_values.append(data_time)
            self.applied = csn
            self.position = (epoch, seq + 1)
            self.applied_count += 1
            self._forget_outcomes(entry.time)
            self.applied_cond.notify_all()

    def _forget_outcomes(self, now: float) -> None:
        """Forget the outcomes of the commits older than ``outcome_seconds`` before ``now`` (the
        entry just applied: every replica forgets alike, but never ahead of this clock), in CSN
        order, moving ``outcome_floor`` up to the last CSN forgotten."""
        if self._outcomes_kept:
            return
        cutoff = min(now, self.clock()) - self.outcome_seconds
        outcomes, tid_csn = self.outcomes, self.tid_csn
        while outcomes and outcomes[0][0] < cutoff:
            _, csn, tids = outcomes.popleft()
            for tid in tids:
                if tid_csn.get(tid) == csn:
                    del tid_csn[tid]
            self.outcome_floor = csn

    def _apply_ddl(self, csn: int, t: TableRecord, when: float) -> None:
        if isinstance(t, TableDropped):
            self.catalog.setdefault(t.name, []).append(replace(t, csn=csn))
            self.tables.pop(t.name, None)
            # Every part of the table live now goes, whichever commit (on whichever replica)
            # added it: so every replica removes the same ones. The drop is their removal.
            live = self.live.pop(t.name, {})
            self.live_sorted.pop(t.name, None)
            self.live_created.pop(t.name, None)
            for pkey, names in sorted(live.items()):
                for name in names:
                    rec = self.parts[name]
                    rec.removal_tid, rec.removal_csn, rec.removal_time = t.tid, csn, when
                    self.removals.append((csn, name))
                self.conflict_history[(t.name, pkey)].append((csn, Summary.of(t.tid, (Kind.OVERWRITE,), names)))
            return
        t = t.with_csn(csn)
        self.catalog.setdefault(t.name, []).append(t)
        self.tables[t.name] = t

    def _apply_change(self, csn: int, tid: str, ch: Change, when: float) -> None:
        live = self.live[ch.table]
        tdef = self.tables.get(ch.table)
        keyed = tdef is not None and tdef.conflict_policy is Policy.KEYS
        for meta in ch.added:
            if meta.name in self.parts:
                # A part name is committed at most once (the replica refuses it when staged); a
                # second commit naming it (two replicas raced, a hostile entry) adds nothing, on
                # every replica alike: snapshots stay immutable.
                log.warning(
                    "CSN %d adds part %s of %r that CSN %d committed: ignored",
                    csn,
                    meta.name,
                    ch.table,
                    self.parts[meta.name].creation_csn,
                )
                continue
            rec = self.parts[meta.name] = PartRecord(meta, csn)
            self.by_table[ch.table].add(meta.name)
            target = (ch.table, partition_key(meta.partition))
            self.created[target].append((csn, meta.name))
            if keyed:
                self._key_index(target).add(csn, meta.name, meta.key_summary, keytables.folded(meta))
            live[target[1]].add(meta.name)
            self._index_add(ch.table, meta, rec)
        for name in ch.removed:
            removed = self.parts.get(name)
            if removed is None:
                continue
            rec = removed
            if rec.removal_csn is not None:
                continue  # removed once already (never by a valid entry: deterministic anyway)
            rec.removal_tid, rec.removal_csn, rec.removal_time = tid, csn, when
            at = ch.spilled.get(name)
            if at is not None and rec.meta.inline is not None:  # a flush: its bytes are in the bundle now
                rec.meta = replace(rec.meta, inline=None, spilled=at)
            self.removals.append((csn, name))
            live[rec.pkey].discard(name)
            self._index_remove(rec.meta.table, rec)
        self.conflict_history[(ch.table, ch.pkey)].append((csn, Summary.of(tid, ch.kinds, ch.removed)))

    def _key_index(self, target: tuple[str, str]) -> KeyIndex:
        index = self.key_index.get(target)
        if index is None:
            index = self.key_index[target] = KeyIndex()
        return index

    def _index_add(self, table: str, meta: PartMeta, rec: PartRecord) -> None:
        if table not in self.live_sorted:
            self.live_sorted[table], self.live_created[table] = SortedIndex(), SortedIndex()
        if table not in self.all_sorted:
            self.all_sorted[table] = SortedIndex()
        self.live_sorted[table].add(meta.name, meta)
        self.live_created[table].add((rec.creation_csn, meta.name), meta)
        self.all_sorted[table].add(meta.name, rec)

    def _index_remove(self, table: str, rec: PartRecord) -> None:
        if table in self.live_sorted:
            self.live_sorted[table].remove(rec.meta.name)
        if table in self.live_created:
            self.live_created[table].remove((rec.creation_csn, rec.meta.name))

    def advance_epoch(self, epoch: int) -> None:
        """Every entry of a sealed epoch is applied: the next one starts at sequence 0."""
        with self.lock:
            if self.position[0] <= epoch:
                self.position = (epoch + 1, 0)
                self.applied_cond.notify_all()  # the log tail waits for a sealed epoch to be passed

    def set_failure(self, exc: Exception) -> None:
        """A log entry could not be applied: reads waiting for it stop waiting and report it."""
        with self.lock:
            self.failure = exc
            self.applied_cond.notify_all()

    def clear_failure(self) -> None:
        """The log applies again (or is to be looked at again)."""
        with self.lock:
            self.failure = None
