"""A replica's view of the log: tables, parts with their versions, tid->csn, conflict history.

Everything here is derived from log entries applied in CSN order (from the WAL on start, then
from ZooKeeper), so the state is never kept in two places that must agree: replaying the same
entries gives the same state. The snapshot version is ``applied``: every entry up to it is here.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from coordinator.catalog import TableDef
from coordinator.conflicts import Kind, Summary
from coordinator.errors import CorruptMetadata
from coordinator.versions import Tid
from coordinator.visibility import is_visible
from parts.format import PartMeta
from parts.ops import partition_key


@dataclass
class PartRecord:
    meta: PartMeta
    creation_csn: int
    removal_tid: str | None = None
    removal_csn: int | None = None

    @property
    def pkey(self) -> str:
        return partition_key(self.meta.partition)


@dataclass(frozen=True)
class Change:
    """What one transaction of an entry did to one target (table partition)."""

    table: str
    pkey: str
    kinds: tuple[Kind, ...]
    added: tuple[PartMeta, ...]
    removed: tuple[str, ...]

    def to_dict(self) -> dict:
        return {
            "table": self.table,
            "pkey": self.pkey,
            "kinds": [k.value for k in self.kinds],
            "added": [m.to_dict() for m in self.added],
            "removed": list(self.removed),
        }

    @classmethod
    def from_dict(cls, d: dict) -> Change:
        return cls(
            str(d["table"]),
            str(d["pkey"]),
            tuple(Kind(k) for k in d["kinds"]),
            tuple(PartMeta.from_dict(m) for m in d.get("added", ())),
            tuple(str(n) for n in d.get("removed", ())),
        )


class ReplicaState:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.applied_cond = threading.Condition(self.lock)
        self.applied = 0
        self.position = (0, 0)  # (epoch, next sequence number) to fetch
        self.tables: dict[str, TableDef] = {}
        self.parts: dict[str, PartRecord] = {}
        self.by_table: dict[str, set[str]] = defaultdict(set)
        self.live: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        self.tid_csn: dict[str, int] = {}
        self.history: dict[tuple[str, str], list[tuple[int, Summary]]] = defaultdict(list)
        self.versions: dict[str, int] = {}
        self.time_csns: list[int] = []  # CSNs of data-changing commits, ascending
        self.time_values: list[float] = []  # their time versions
        self.failure: Exception | None = None  # a log entry that could not be applied

    # -- applying the log ------------------------------------------------------------------
    def apply(self, csn: int, epoch: int, seq: int, entry: dict) -> None:
        """Apply one decoded entry. Idempotent: an entry at or below ``applied`` is skipped."""
        with self.lock:
            if csn <= self.applied:
                return
            ddl, txns, versions = self.parse_entry(entry, f"at CSN {csn} (epoch {epoch}, seq {seq})")
            for t in ddl:
                self.tables[t.name] = t.with_csn(csn)
            data_time = None
            for tid, time_version, changes in txns:
                self.tid_csn[tid] = csn
                if time_version is not None:
                    data_time = time_version
                for ch in changes:
                    self._apply_change(csn, tid, ch)
            for k, v in versions.items():
                if v > self.versions.get(k, -1):
                    self.versions[k] = v
            if data_time is not None:
                self.time_csns.append(csn)
                self.time_values.append(data_time)
            self.applied = csn
            self.position = (epoch, seq + 1)
            self.applied_cond.notify_all()

    @staticmethod
    def parse_entry(entry: dict, where: str) -> tuple[list[TableDef], list[tuple[str, float | None, list[Change]]],
                                                      dict[str, int]]:
        """Decode an entry's DDL, transactions and target versions without changing anything, so
        that a malformed entry is refused whole (CorruptMetadata naming ``where``), never half
        applied and never written to the WAL."""
        try:
            ddl = [TableDef.from_dict(d["create_table"]) for d in entry.get("ddl", ())]
            txns = []
            for t in entry.get("txns", ()):
                Tid.parse(t["tid"])
                tv = t.get("time_version")
                txns.append((str(t["tid"]), None if tv is None else float(tv),
                             [Change.from_dict(c) for c in t.get("changes", ())]))
            versions = {str(k): int(v) for k, v in entry.get("versions", {}).items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptMetadata(f"log entry {where} is malformed: {exc!r}") from exc
        except CorruptMetadata as exc:
            raise CorruptMetadata(f"log entry {where} is malformed: {exc.message}") from exc
        return ddl, txns, versions

    def _apply_change(self, csn: int, tid: str, ch: Change) -> None:
        live = self.live[ch.table]
        for meta in ch.added:
            self.parts[meta.name] = PartRecord(meta, csn)
            self.by_table[ch.table].add(meta.name)
            live[partition_key(meta.partition)].add(meta.name)
        for name in ch.removed:
            rec = self.parts.get(name)
            if rec is None:
                continue
            rec.removal_tid, rec.removal_csn = tid, csn
            live[rec.pkey].discard(name)
        self.history[(ch.table, ch.pkey)].append((csn, Summary.of(tid, ch.kinds, ch.removed)))

    def advance_epoch(self, epoch: int) -> None:
        """Every entry of a sealed epoch is applied: the next one starts at sequence 0."""
        with self.lock:
            if self.position[0] <= epoch:
                self.position = (epoch + 1, 0)

    # -- queries -----------------------------------------------------------------------------
    def winners(self, table: str, pkey: str, snapshot: int) -> list[Summary]:
        """Commits on one target after ``snapshot``, in commit order."""
        with self.lock:
            events = self.history.get((table, pkey), [])
            i = bisect.bisect_right(events, snapshot, key=lambda e: e[0])
            return [s for _, s in events[i:]]

    def table(self, name: str, snapshot: int | None = None) -> TableDef | None:
        with self.lock:
            t = self.tables.get(name)
            if t is None or (snapshot is not None and t.created_csn > snapshot):
                return None
            return t

    def visible(
        self,
        table: str,
        snapshot: int,
        reader_tid: str | None = None,
        own_added: Iterable[PartMeta] = (),
        own_removed: frozenset[str] | set[str] = frozenset(),
        pkeys: Iterable[str] | None = None,
    ) -> list[PartMeta]:
        """Parts of ``table`` visible at ``snapshot`` to ``reader_tid`` (seed 004's rule)."""
        wanted = None if pkeys is None else set(pkeys)
        with self.lock:
            if snapshot >= self.applied:
                live = self.live.get(table, {})
                keys = live.keys() if wanted is None else (wanted & live.keys())
                names = [n for k in keys for n in live[k] if n not in own_removed]
                out = [self.parts[n].meta for n in names]
            else:
                out = []
                for n in self.by_table.get(table, ()):
                    rec = self.parts[n]
                    if wanted is not None and rec.pkey not in wanted:
                        continue
                    removal_tid = reader_tid if n in own_removed else rec.removal_tid
                    removal_csn = rec.removal_csn if removal_tid == rec.removal_tid else None
                    if is_visible(snapshot, reader_tid, rec.meta.creation_tid, rec.creation_csn, removal_tid, removal_csn):
                        out.append(rec.meta)
        for meta in own_added:
            if meta.table == table and meta.name not in own_removed:
                if wanted is None or partition_key(meta.partition) in wanted:
                    out.append(meta)
        out.sort(key=lambda m: m.name)
        return out

    def csn_at_time(self, when: float) -> int:
        """Snapshot of the last data-changing commit at or before ``when`` (0 if none)."""
        with self.lock:
            i = bisect.bisect_right(self.time_values, when)
            return self.time_csns[i - 1] if i else 0

    def wait_applied(self, csn: int, timeout: float) -> bool:
        with self.lock:
            return self.applied_cond.wait_for(lambda: self.applied >= csn or self.failure is not None, timeout)

    def wait_versions(self, expected: dict[str, int | None], timeout: float) -> bool:
        """Wait until every target version read from ZooKeeper is reflected here."""
        def caught_up() -> bool:
            return all(v is None or self.versions.get(k, -1) >= v for k, v in expected.items())

        with self.lock:
            return self.applied_cond.wait_for(lambda: caught_up() or self.failure is not None, timeout)
