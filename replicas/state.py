"""A replica's view of the log: tables, parts with their versions, tid->csn, conflict history.

Everything here is derived from log entries applied in CSN order (from the WAL on start, then
from ZooKeeper), so the state is never kept in two places that must agree: replaying the same
entries gives the same state. The snapshot version is ``applied``: every entry up to it is here.
"""

from __future__ import annotations

import bisect
import gc
import heapq
import logging
import math
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from itertools import chain

from coordinator.core import keytables
from coordinator.core.conflicts import COMPACTIONS, Kind, Policy, Summary
from coordinator.core.errors import CorruptMetadata, SnapshotUnavailable
from coordinator.core.keyindex import KeyIndex
from coordinator.core.readsets import Touch
from coordinator.core.tabledata import partition_key
from coordinator.core.versions import Tid
from coordinator.core.visibility import is_visible
from coordinator.model.catalog import TableDef, TableDropped, TableRecord
from coordinator.model.records import Change, LogEntry
from parts.model.meta import PartMeta
from replicas.checkpoint import no_gc

log = logging.getLogger(__name__)

TIME_TRIM_BATCH = 1000  # commit times forgotten at once past every window (ReplicaState._trim_times)


def _name(meta: PartMeta) -> str:
    return meta.name


def _first(t: tuple) -> int:
    return t[0]


def _record_csn(r: TableRecord) -> int:
    return r.csn


def _keys_at(records: list[TableRecord], csn: int) -> bool:
    """Whether the table of these records (by CSN) was a keys table at ``csn``."""
    i = bisect.bisect_right(records, csn, key=_record_csn)
    return i > 0 and isinstance(records[i - 1], TableDef) and records[i - 1].conflict_policy is Policy.KEYS


class SortedIndex:
    """Values kept in key order, in chunks of at most ``2 * CHUNK``: an insert or removal moves
    at most a chunk (a flat sorted list of 100,000 parts moved the whole list, ~0.1 ms per part
    applied); :meth:`values` copies a flattened list, rebuilt only after a change."""

    CHUNK = 512

    def __init__(self, items: Iterable[tuple[str, object]] = ()) -> None:
        pairs = sorted(items, key=lambda kv: kv[0])
        self._keys = [[k for k, _ in pairs[i : i + self.CHUNK]] for i in range(0, len(pairs), self.CHUNK)]
        self._vals = [[v for _, v in pairs[i : i + self.CHUNK]] for i in range(0, len(pairs), self.CHUNK)]
        self._maxes = [ks[-1] for ks in self._keys]
        self._len = len(pairs)
        self._flat: list | None = None
        self._flat_keys: list[str] = []

    def __len__(self) -> int:
        return self._len

    def add(self, key: str, value: object) -> None:
        """Insert, or replace the value of an existing key."""
        self._flat = None
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

    def remove(self, key: str) -> None:
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
        self._flat = None
        self._len -= 1
        if keys:
            self._maxes[c] = keys[-1]
        else:
            del self._keys[c], self._vals[c], self._maxes[c]

    def keys(self) -> list[str]:
        return list(chain.from_iterable(self._keys))

    def values(self, without: frozenset[str] | set[str] = frozenset()) -> list:
        """The values in key order, leaving out the keys in ``without`` (a new list: the caller
        may change it). A few keys left out are found by bisection, not by a scan."""
        if self._flat is None:
            self._flat = list(chain.from_iterable(self._vals))
            self._flat_keys = list(chain.from_iterable(self._keys))
        out = self._flat.copy()
        if without and len(without) <= 64:
            keys = self._flat_keys
            drop = []
            for k in without:
                i = bisect.bisect_left(keys, k)
                if i < len(keys) and keys[i] == k:
                    drop.append(i)
            for i in sorted(drop, reverse=True):
                del out[i]
        elif without:
            out = [v for k, v in zip(self._flat_keys, out) if k not in without]
        return out


@dataclass
class PartRecord:
    meta: PartMeta
    creation_csn: int
    removal_tid: str | None = None
    removal_csn: int | None = None
    removal_time: float | None = None  # the removing commit's time (its log entry's): history retention

    @property
    def pkey(self) -> str:
        return partition_key(self.meta.partition)


def _outcomes(
    payload: dict, tid_csn: dict[str, int], fallback: float
) -> tuple[deque[tuple[float, int, tuple[str, ...]]], int]:
    """The outcome window of a checkpoint: (entry time, CSN, tids) per commit in CSN order, and
    its floor. A checkpoint written before it carries no times: its commits count as made at
    ``fallback`` (its newest time version), so the window forgets them from there."""
    times = dict(zip(payload.get("outcome_csns", ()), payload.get("outcome_times", ()), strict=True))
    by_csn: dict[int, list[str]] = defaultdict(list)
    for tid, csn in tid_csn.items():
        by_csn[csn].append(tid)
    window = deque((float(times.get(csn, fallback)), csn, tuple(tids)) for csn, tids in sorted(by_csn.items()))
    return window, int(payload.get("outcome_floor", 0))


# -- checkpoint decoding (ReplicaState.restore): each raises what malformed data raises, which
# restore reports as CorruptMetadata.
def _export_parts(recs: list[tuple[PartMeta, int, str | None, int | None, float | None]]) -> dict:
    """A checkpoint's parts as columns (``payload["parts"]``): the metadata's fields, the stats
    by shape, then each record's creation and removal."""
    names = [f.name for f in fields(PartMeta) if f.name != "stats"]
    metas = [r[0] for r in recs]
    parts: dict = {"fields": names}
    for n in names:
        parts[n] = [getattr(m, n) for m in metas]
    shapes: dict[tuple, int] = {}
    shape_col, values = [], []
    for m in metas:
        keys = tuple(m.stats)
        shape_col.append(shapes.setdefault(keys, len(shapes)))
        for v in m.stats.values():
            values.extend(v)
    parts["stats_keys"] = [list(k) for k in shapes]
    parts["stats_shape"] = shape_col
    parts["stats_values"] = values
    parts["creation_csn"] = [r[1] for r in recs]
    parts["removal_tid"] = [r[2] for r in recs]
    parts["removal_csn"] = [r[3] for r in recs]
    parts["removal_time"] = [r[4] for r in recs]
    return parts


def _export_history(history: list[tuple[tuple[str, str], list[tuple[int, Summary]]]]) -> dict:
    """A checkpoint's conflict history as columns (``payload["history"]``), operation kinds by set."""
    kind_sets: dict[frozenset, int] = {}
    h: dict = {"keys": [], "key": [], "csn": [], "tid": [], "kinds": [], "removed_at": [], "removed": []}
    for i, (key, events) in enumerate(history):
        h["keys"].append(list(key))
        for csn, s in events:
            if s.removed:
                h["removed_at"].append(len(h["csn"]))
                h["removed"].append(sorted(s.removed))
            h["key"].append(i)
            h["csn"].append(csn)
            h["tid"].append(s.tid)
            h["kinds"].append(kind_sets.setdefault(s.kinds, len(kind_sets)))
    h["kind_sets"] = [sorted(k.value for k in ks) for ks in kind_sets]
    return h


def _restore_catalog(payload: dict) -> tuple[dict[str, TableDef], dict[str, list[TableRecord]], list[int]]:
    """A checkpoint's tables, its catalog (each table's records) and the CSNs of its DDL."""
    tables = {d["name"]: TableDef.from_dict(d) for d in payload["tables"]}
    catalog: dict[str, list[TableRecord]] = {}
    if "catalog" in payload:
        for d in payload["catalog"]:
            r = TableDropped.from_dict(d["dropped"]) if "dropped" in d else TableDef.from_dict(d["table"])
            catalog.setdefault(r.name, []).append(r)
    else:  # written before tables could be altered or dropped
        catalog = {name: [t] for name, t in tables.items()}
    ddl_csns = sorted({_record_csn(r) for records in catalog.values() for r in records})
    return tables, catalog, ddl_csns


def _restore_metas(cols: dict) -> list[PartMeta]:
    """A checkpoint's parts' metadata, from its columns (``payload["parts"]``)."""
    names = list(cols["fields"])
    columns = [cols[n] for n in names]
    ip = names.index("partition")
    columns[ip] = [tuple(p) for p in columns[ip]]
    shapes = [tuple(k) for k in cols["stats_keys"]]
    flat = iter(cols["stats_values"])
    pairs = zip(flat, flat)  # (min, max); zip(keys, pairs) takes exactly len(keys) of them
    stats_col = [dict(zip(shapes[s], pairs)) for s in cols["stats_shape"]]
    if next(flat, pairs) is not pairs:
        raise ValueError("stats values do not match their shapes")
    names.append("stats")
    columns.append(stats_col)
    current = [f.name for f in fields(PartMeta)]
    if sorted(names) == sorted(current):
        order = [names.index(n) for n in current]
        return [PartMeta(*(row[i] for i in order)) for row in zip(*columns, strict=True)]
    # written by another version: match by name, new fields take their defaults
    keep = [(i, n) for i, n in enumerate(names) if n in set(current)]
    return [PartMeta(**{n: row[i] for i, n in keep}) for row in zip(*columns, strict=True)]


def _restore_parts(
    metas: list[PartMeta], cols: dict
) -> tuple[dict[str, PartRecord], dict[str, set[str]], dict[str, dict[str, set[str]]], dict[tuple, str]]:
    """A checkpoint's part records, part names by table, live part names by table and partition
    key, and the partition keys computed on the way."""
    parts: dict[str, PartRecord] = {}
    by_table: dict[str, set[str]] = defaultdict(set)
    live: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    pkeys: dict[tuple, str] = {}
    rtimes = cols.get("removal_time") or [None] * len(metas)  # absent: written before retention
    for meta, ccsn, rtid, rcsn, rtime in zip(
        metas, cols["creation_csn"], cols["removal_tid"], cols["removal_csn"], rtimes, strict=True
    ):
        parts[meta.name] = PartRecord(
            meta, int(ccsn), rtid, None if rcsn is None else int(rcsn), None if rtime is None else float(rtime)
        )
        by_table[meta.table].add(meta.name)
        if rcsn is None:
            pk = pkeys.get(meta.partition)
            if pk is None:
                pk = pkeys[meta.partition] = partition_key(meta.partition)
            live[meta.table][pk].add(meta.name)
    return parts, by_table, live, pkeys


def _restore_history(h: dict) -> dict[tuple[str, str], list[tuple[int, Summary]]]:
    """A checkpoint's conflict history (``payload["history"]``), by (table, partition key)."""
    keys = [(str(t), str(pk)) for t, pk in h["keys"]]
    kind_sets = [frozenset(Kind(k) for k in ks) for ks in h["kind_sets"]]
    removed = dict(zip(h["removed_at"], h["removed"], strict=True))
    none: frozenset[str] = frozenset()
    history: dict[tuple[str, str], list[tuple[int, Summary]]] = defaultdict(list)
    for i, (k, csn, tid, ks) in enumerate(zip(h["key"], h["csn"], h["tid"], h["kinds"], strict=True)):
        r = removed.get(i)
        history[keys[k]].append((csn, Summary(tid, kind_sets[ks], none if r is None else frozenset(r))))
    return history


def _restore_lost(
    payload: dict, catalog: dict[str, list[TableRecord]], pruned: int
) -> tuple[dict[str, int], dict[str, int]]:
    """Up to which CSN each table's parts and conflict history may be incomplete."""
    if "lost" in payload:
        lost = {str(k): int(v) for k, v in payload["lost"].items()}
        lost_history = {str(k): int(v) for k, v in payload.get("lost_history", {}).items()}
    else:  # written before: everything below its floor may be incomplete
        lost = {name: pruned for name in catalog}
        lost_history = dict(lost)
    return lost, lost_history


def _restore_key_index(
    parts: dict[str, PartRecord], pkeys: dict[tuple, str], pruned: int, catalog: dict[str, list[TableRecord]]
) -> tuple[dict[tuple[str, str], list[tuple[int, str]]], dict[tuple[str, str], KeyIndex]]:
    """The parts created above ``pruned`` by (table, partition key), in CSN order, and the key
    index of those a keys table holds."""
    created: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    for n, r in parts.items():
        if r.creation_csn > pruned:
            pk = pkeys.get(r.meta.partition)
            if pk is None:
                pk = pkeys[r.meta.partition] = partition_key(r.meta.partition)
            created[(r.meta.table, pk)].append((r.creation_csn, n))
    key_index: dict[tuple[str, str], KeyIndex] = {}
    for (table, pk), added in created.items():
        added.sort()
        records = catalog.get(table, [])
        for csn, n in added:
            if _keys_at(records, csn):
                meta = parts[n].meta
                key_index.setdefault((table, pk), KeyIndex()).add(csn, n, meta.key_summary, keytables.folded(meta))
    return created, key_index


class ReplicaState:
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
        # prune() forgets the front of both, past every window, in batches of TIME_TRIM_BATCH;
        # the last CSN it forgot (0: none), and times before what is kept are then unknown here.
        self.time_trimmed = 0
        self.failure: Exception | None = None  # a log entry that could not be applied
        # Live parts per table sorted by name, names and metas side by side: the latest-snapshot
        # lookup is then a list copy, not a sort of every live part (benchmarks/snapshot_lookup.py).
        self.live_sorted: dict[str, SortedIndex] = {}  # name -> PartMeta of the live parts
        self.all_sorted: dict[str, SortedIndex] = {}  # name -> PartRecord of every part
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
        # Every field above that the log derives must also be in export()/restore() below:
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
            rec = self.parts.get(name)
            if rec is None:
                continue
            if rec.removal_csn is not None:
                continue  # removed once already (never by a valid entry: deterministic anyway)
            rec.removal_tid, rec.removal_csn, rec.removal_time = tid, csn, when
            self.removals.append((csn, name))
            live[rec.pkey].discard(name)
            self._index_remove(rec.meta.table, name)
        self.conflict_history[(ch.table, ch.pkey)].append((csn, Summary.of(tid, ch.kinds, ch.removed)))

    def _key_index(self, target: tuple[str, str]) -> KeyIndex:
        index = self.key_index.get(target)
        if index is None:
            index = self.key_index[target] = KeyIndex()
        return index

    def _index_add(self, table: str, meta: PartMeta, rec: PartRecord) -> None:
        for index, item in ((self.live_sorted, meta), (self.all_sorted, rec)):
            if table not in index:
                index[table] = SortedIndex()
            index[table].add(meta.name, item)

    def _index_remove(self, table: str, name: str) -> None:
        if table in self.live_sorted:
            self.live_sorted[table].remove(name)

    def advance_epoch(self, epoch: int) -> None:
        """Every entry of a sealed epoch is applied: the next one starts at sequence 0."""
        with self.lock:
            if self.position[0] <= epoch:
                self.position = (epoch + 1, 0)
                self.applied_cond.notify_all()  # the log tail waits for a sealed epoch to be passed

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
            i = bisect.bisect_right(added, floor, key=_first)
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
            i = bisect.bisect_right(records, floor, key=_record_csn)
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

    # -- queries -----------------------------------------------------------------------------
    def lost_below(self, table: str, history: bool = False) -> int:
        """A snapshot of ``table`` below this is incomplete here (``history``: its ``changes``
        from below it are)."""
        lost = self.lost.get(table, 0)
        return max(lost, self.lost_history.get(table, 0)) if history else lost

    def created_since(self, table: str, pkey: str, snapshot: int) -> list[tuple[int, PartMeta]]:
        """``(creation CSN, meta)`` of the parts added to one target (a partition key) by commits
        after ``snapshot``, in CSN order: a bisection, not a scan of every part."""
        with self.lock:
            added = self.created.get((table, pkey), ())
            i = bisect.bisect_right(added, snapshot, key=_first)
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
            records = records[: bisect.bisect_right(records, snapshot, key=_record_csn)]
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
    ) -> list[PartMeta]:
        """Parts of ``table`` visible at ``snapshot`` to ``reader_tid`` (docs/rules.md#visibility)."""
        wanted = None if pkeys is None else set(pkeys)
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
        out = []
        pkey_of: dict[tuple, str] = {}
        for rec in self._candidates(table, snapshot, reader_tid, wanted):
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
        names: list[str] = []
        limit = len(index)
        for csn, name in reversed(self.removals):
            if csn <= snapshot:
                break
            if len(names) >= limit:
                return index.values()
            names.append(name)
        live = self.live.get(table, {})
        for pk in live.keys() if wanted is None else wanted & live.keys():
            names.extend(live[pk])
        parts = self.parts
        recs = {n: rec for n in names if (rec := parts.get(n)) is not None and rec.meta.table == table}
        return [recs[n] for n in sorted(recs)]

    # -- checkpoints (replicas/checkpoint.py encodes these) ------------------------------------
    def export(self) -> dict:
        """Everything the log has built here, as plain JSON-ready data at one CSN (``applied``).

        Only references are taken under the lock (parts' metadata is immutable), so applying
        and serving pause for a few milliseconds even at 100,000 parts; the columns are built
        after. Everything is flat columns (nested JSON decodes ten times slower): part fields as
        columns following PartMeta's fields (a field added there is carried along), stats as a
        flat value list shaped by a small table of key lists, history events as columns."""
        with no_gc():
            return self._export()

    def _export(self) -> dict:
        with self.lock:
            applied, position = self.applied, self.position
            recs = [(r.meta, r.creation_csn, r.removal_tid, r.removal_csn, r.removal_time) for r in self.parts.values()]
            tables = [t.to_dict() for t in self.tables.values()]
            catalog = [
                {"dropped": r.to_dict()} if isinstance(r, TableDropped) else {"table": r.to_dict()}
                for records in self.catalog.values()
                for r in records
            ]
            pruned, lost, lost_history = self.pruned, dict(self.lost), dict(self.lost_history)
            tids, tid_csns = list(self.tid_csn), list(self.tid_csn.values())
            outcome_csns = [csn for _, csn, _ in self.outcomes]
            outcome_times = [t for t, _, _ in self.outcomes]
            outcome_floor = self.outcome_floor
            history = [(k, list(v)) for k, v in self.conflict_history.items()]
            versions = dict(self.versions)
            apps = {app_id: list(held) for app_id, held in self.apps.items()}
            time_csns, time_values = list(self.time_csns), list(self.time_values)
            time_trimmed = self.time_trimmed
        parts = _export_parts(recs)
        h = _export_history(history)
        return {
            "applied": applied,
            "position": list(position),
            "tables": tables,
            "catalog": catalog,
            "parts": parts,
            "tids": tids,
            "tid_csns": tid_csns,
            "outcome_csns": outcome_csns,
            "outcome_times": outcome_times,
            "outcome_floor": outcome_floor,
            "history": h,
            "versions": versions,
            "apps": apps,
            "time_csns": time_csns,
            "time_values": time_values,
            "time_trimmed": time_trimmed,
            "pruned": pruned,
            "lost": lost,
            "lost_history": lost_history,
        }

    def restore(self, payload: dict, where: str) -> None:
        """Replace everything here with an :meth:`export` payload (a checkpoint). Malformed
        data is CorruptMetadata naming ``where``; the state is untouched then."""
        with no_gc():
            self._restore(payload, where)
        # Hundreds of thousands of long-lived objects: keep the cyclic GC from walking them on
        # every full collection (replaying a WAL tail after this ran 5x slower without it).
        gc.freeze()

    def _restore(self, payload: dict, where: str) -> None:
        try:
            tables, catalog, ddl_csns = _restore_catalog(payload)
            cols = payload["parts"]
            metas = _restore_metas(cols)
            parts, by_table, live, pkeys = _restore_parts(metas, cols)
            live_sorted = {
                table: SortedIndex((n, parts[n].meta) for names_ in by_pkey.values() for n in names_)
                for table, by_pkey in live.items()
            }
            all_sorted = {table: SortedIndex((n, parts[n]) for n in names_) for table, names_ in by_table.items()}
            tid_csn = {str(t): int(c) for t, c in zip(payload["tids"], payload["tid_csns"], strict=True)}
            history = _restore_history(payload["history"])
            versions = {str(k): int(v) for k, v in payload["versions"].items()}
            apps = {str(k): (int(v), int(c)) for k, (v, c) in payload.get("apps", {}).items()}
            time_csns = [int(c) for c in payload["time_csns"]]
            time_values = [float(v) for v in payload["time_values"]]
            time_trimmed = int(payload.get("time_trimmed", 0))
            outcomes, outcome_floor = _outcomes(payload, tid_csn, max(time_values, default=0.0))
            applied = int(payload["applied"])
            position = (int(payload["position"][0]), int(payload["position"][1]))
            pruned = int(payload.get("pruned", 0))
            lost, lost_history = _restore_lost(payload, catalog, pruned)
            removals = deque(sorted((r.removal_csn, n) for n, r in parts.items() if r.removal_csn is not None))
            created, key_index = _restore_key_index(parts, pkeys, pruned, catalog)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise CorruptMetadata(f"checkpoint {where} is malformed: {exc!r}") from exc
        with self.lock:
            self.tables, self.parts, self.by_table, self.live = tables, parts, by_table, live
            self.catalog, self.ddl_csns = catalog, ddl_csns
            self.live_sorted, self.tid_csn, self.conflict_history, self.versions = (
                live_sorted,
                tid_csn,
                history,
                versions,
            )
            self.apps = apps
            self.outcomes, self.outcome_floor = outcomes, outcome_floor
            self.all_sorted = all_sorted
            self.time_csns, self.time_values, self.time_trimmed = time_csns, time_values, time_trimmed
            self.applied, self.position = applied, position
            self.pruned, self.removals, self.lost, self.lost_history = pruned, removals, lost, lost_history
            self.created, self.key_index = created, key_index
            self.failure = None
            self.applied_cond.notify_all()

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

    def app_version(self, app_id: str) -> tuple[int, int] | None:
        """The highest version of application ``app_id`` committed up to ``applied``, and the CSN
        that holds it (None: none)."""
        return self.apps.get(app_id)

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

    def set_failure(self, exc: Exception) -> None:
        """A log entry could not be applied: reads waiting for it stop waiting and report it."""
        with self.lock:
            self.failure = exc
            self.applied_cond.notify_all()

    def clear_failure(self) -> None:
        """The log applies again (or is to be looked at again)."""
        with self.lock:
            self.failure = None

    def creation_csns(self, names: Iterable[str]) -> dict[str, int | None]:
        """The creation CSN of each committed part among ``names`` (others are left out): a keys
        table orders the versions of a key by them (coordinator/core/keytables.py)."""
        with self.lock:
            return {n: rec.creation_csn for n in names if (rec := self.parts.get(n)) is not None}

    def catalog_records(self, name: str) -> list[TableRecord]:
        """Table ``name``'s records (created, altered, dropped), by CSN."""
        with self.lock:
            return list(self.catalog.get(name, ()))

    def table_defs(self) -> list[TableDef]:
        """Every definition any table had that this replica still knows (not the drops)."""
        with self.lock:
            return [r for records in self.catalog.values() for r in records if isinstance(r, TableDef)]

    def part_records(self, table: str) -> list[PartRecord]:
        """The records of ``table``'s parts, visible or removed (what prune() forgot is gone)."""
        with self.lock:
            return [self.parts[n] for n in self.by_table.get(table, ()) if n in self.parts]

    def time_versions(self) -> dict[int, float]:
        """Each data-changing commit's CSN with its time version."""
        with self.lock:
            return dict(zip(self.time_csns, self.time_values))

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

    def newest_live(self, count: int) -> list[PartRecord]:
        """The records of the ``count`` live parts committed last (the storage probe at start)."""
        with self.lock:
            return heapq.nlargest(
                count, (r for r in self.parts.values() if r.removal_csn is None), key=lambda r: r.creation_csn or 0
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
            compacted, changed = set(), set()  # tids that only compacted these tables, and others
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
                        rec.removal_csn is not None
                        and rec.removal_csn > snapshot
                        and rec.removal_tid not in compactions
                    ):
                        touched.append(Touch(rec.removal_tid, rec.removal_csn, t, name, m.partition, m.stats, False))
        return touched
