"""Commit history on one replica: incremental reads (``changes``) and the event log.

Both are derived from what the log built here (part records with their creation and removal
CSNs, the conflict history's operation kinds per partition, the time versions; checkpoints
included), so they are the same on every replica. ``changes`` leases what it read
(replicas/leases.py) and refuses a range whose parts cleanup collected (replicas/cleanup.py).

**Events.** Commit, part-added and part-removed events are derived from the log as applied here
(the same on every replica); begin, rollback and merge events of this replica are kept in a
bounded in-memory ring (:data:`EVENT_RING`), lost when the process restarts.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from coordinator.core.conflicts import COMPACTIONS, Kind, Summary
from coordinator.core.errors import InvalidInput, SnapshotUnavailable, quote
from coordinator.core.tabledata import partition_key
from coordinator.core.versions import Tid
from coordinator.model.catalog import TableDropped
from coordinator.model.records import TxnState
from replicas.context import ReplicaContext, ReplicaPart

if TYPE_CHECKING:
    from collections.abc import Callable

    from replicas.leases import Leases
    from replicas.retention import Retention
    from replicas.state import PartRecord

EVENT_RING = 10_000


class ChangeFeed(ReplicaPart):
    """Incremental reads and events of one replica (``replica.changefeed``)."""

    def __init__(self, context: ReplicaContext, retention: Retention, leases: Leases) -> None:
        """``table`` and ``wait_snapshot``: the context's (``Replica.table``, which waits for a
        table created elsewhere, and ``Replica.wait_snapshot``)."""
        super().__init__(context)
        self.table, self.wait_snapshot = context.table, context.wait_snapshot
        self.retention, self.leases = retention, leases
        self._events: deque[dict] = deque(maxlen=EVENT_RING)
        self._event_seq = 0

    # -- events ------------------------------------------------------------------------------------
    def record(self, event: str, **fields: Any) -> None:
        """A local event (begin, rollback, merge) in the bounded ring."""
        self._event_seq += 1
        self._events.append(
            {"time": time.time(), "event": event, "host": self.host_id, "_seq": self._event_seq, **fields}
        )

    def on_begin(self, txn: Any) -> None:
        self.record("begin", tid=txn.id, snapshot=txn.snapshot, user=getattr(txn, "owner", None), _txn=txn)

    def on_end(self, txn: Any) -> None:
        if txn.state == TxnState.ABORTED:
            self.record(
                "rollback",
                tid=txn.id,
                snapshot=txn.snapshot,
                reason=txn.reason,
                user=getattr(txn, "owner", None),
                _txn=txn,
            )

    def ring_size(self) -> int:
        """Local events held now (at most :data:`EVENT_RING`)."""
        return len(self._events)

    def events(self, table: str | None = None, since_csn: int | None = None) -> list[dict]:
        """Events, oldest first: commits and parts from the log; begin, rollback and merges of
        this replica from its ring. ``since_csn`` keeps commit events above it and local events of
        transactions whose snapshot is at or above it."""
        if table is not None:
            self.table(table)
        if since_csn is not None and (isinstance(since_csn, bool) or not isinstance(since_csn, int)):
            raise InvalidInput(f"since_csn must be an integer CSN, not {quote(since_csn)}")
        since = -1 if since_csn is None else since_csn
        out = self._log_events(table, since) + self._ring_events(table, since)
        out.sort(key=lambda e: (e["time"] if e["time"] is not None else 0, e.get("csn") or 0, e["_order"]))
        for e in out:
            e.pop("_order", None)
            e.pop("_seq", None)
        return out

    def _log_events(self, table: str | None, since: int) -> list[dict]:
        """Commit, part_removed and part_added events of the log's commits above ``since``."""
        out: list[dict] = []
        tables = [table] if table is not None else sorted(self.state.tables)
        for t in tables:
            for c in self._commits(t, since, None):
                when = c["time_version"] if c["time_version"] is not None else c["written_at"]
                base = {"time": when, "table": t, "tid": c["tid"], "csn": c["csn"], "host": Tid.parse(c["tid"]).host_id}
                out.append(
                    {
                        **base,
                        "event": "commit",
                        "kinds": ",".join(c["kinds"]),
                        "rows": sum(m.rows for m in c["added"]),
                        "_order": 0,
                    }
                )
                for m in c["removed"]:
                    out.append(
                        {
                            **base,
                            "event": "part_removed",
                            "part": m.name,
                            "partition": partition_key(m.partition),
                            "rows": m.rows,
                            "_order": 1,
                        }
                    )
                for m in c["added"]:
                    out.append(
                        {
                            **base,
                            "event": "part_added",
                            "part": m.name,
                            "partition": partition_key(m.partition),
                            "rows": m.rows,
                            "_order": 2,
                        }
                    )
        return out

    def _ring_events(self, table: str | None, since: int) -> list[dict]:
        """Begin, rollback and merge events of this replica's ring, one per touched table."""
        out: list[dict] = []
        for e in list(self._events):
            txn = e.get("_txn")
            snap = e.get("snapshot")
            if snap is not None and snap < since:
                continue
            if e["event"] == "merge":
                if table is None or e["table"] == table:
                    out.append(
                        {k: v for k, v in e.items() if k not in ("sources", "kind")}
                        | {"kinds": e["kind"], "part": ",".join(e["sources"]), "_order": 0}
                    )
                continue
            touched = sorted({op.table for op in txn.ops}) if txn is not None else []
            if table is not None:
                if table not in touched:
                    continue
                touched = [table]
            for t in touched or [None]:
                out.append({k: v for k, v in e.items() if k != "_txn"} | {"table": t, "_order": 0})
        return out

    # -- commit history (incremental reads) ------------------------------------------------------
    def _time_versions(self) -> dict[int, float]:
        return self.state.time_versions()

    def _commits(self, table: str, lo: float, hi: float | None, by: str = "id", compactions: bool = True) -> list[dict]:
        """Commits to ``table`` whose version is in (lo, hi], derived from the part records (which
        parts each CSN added and removed), the conflict history (each commit's operation kinds per
        partition) and the time versions: all of it is what the log built here, checkpoints included.
        Without ``compactions`` (always so by time) what only compacted a partition is left out."""
        data_only = by == "time" or not compactions
        tv = self._time_versions()
        recs, history = self.state.changes_of(table)
        in_range = _range_test(tv, by, compactions, lo, hi)
        found = _CommitSet(tv, history, data_only)
        for rec in recs:
            found.add_record(rec, in_range)
        # Commits that added and removed nothing here still happened (e.g. an empty truncate).
        found.add_history(in_range)
        return found.result()

    def _drops(self, table: str, first: int, end: Any, by: str, commits: list[dict]) -> list[int]:
        """The CSNs in the range at which a table of this name was dropped: the range reaches back
        into an earlier table of the name. By id (``end`` a CSN) every drop in (first, end]; by
        time the drops among ``commits`` (one that removed no rows has no time to be placed by)."""
        drops = [r.csn for r in self.state.catalog_records(table) if isinstance(r, TableDropped) and r.csn > first]
        if by == "id":
            return [d for d in drops if d <= end]
        listed = {c["csn"] for c in commits}
        return [d for d in drops if d in listed]

    def _check_id_range(self, start: Any, end: Any) -> Any:
        """Refuses a range by id that is not of CSNs; the end (the applied CSN if none), once this
        replica's snapshot reached it."""
        for what, v in (("start", start), ("end", end)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise InvalidInput(f"changes by id: {what} must be a non-negative integer CSN, not {quote(v)}")
        if start is None:
            raise InvalidInput("changes: start is required")
        if end is None:
            end = self.state.applied
        else:
            self.wait_snapshot(end)
        return end

    def _check_time_range(self, start: Any, end: Any) -> None:
        """Refuses a range by time that is not of timestamps, or reaches into the future."""
        for what, v in (("start", start), ("end", end)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                raise InvalidInput(f"changes by time: {what} must be a timestamp, not {quote(v)}")
        if start is None:
            raise InvalidInput("changes: start is required")
        for what, v in (("start", start), ("end", end)):
            if v is not None:
                self.retention.check_not_future(float(v), f"changes by time: {what}")

    def _lease_checked(
        self,
        table: str,
        start: Any,
        end: Any,
        by: str,
        first: int,
        commits: list[dict],
        fresh: bool,
        lease: str,
        owner: str | None,
    ) -> str | None:
        """Leases what ``commits`` read (if any) and checks that none of it was collected; the
        lease's id, released again if the check fails."""
        lease_id = None
        if commits:  # keeps what they read in use until the client has read it
            lease_id = self.leases.lease(min(c["csn"] for c in commits) - 1, lease, owner)[1]
        try:
            self.retention.check_changes(
                table, start, end, by, first, [m for c in commits for m in c["added"] + c["removed"]], fresh
            )
        except SnapshotUnavailable:
            if lease_id is not None:
                self.leases.release(lease_id)
            raise
        return lease_id

    def changes(
        self,
        table: str,
        start: Any,
        end: Any = None,
        by: str = "id",
        fresh: bool = False,
        lease: str = "read",
        compactions: bool = True,
        owner: str | None = None,
    ) -> dict:
        """Parts added and removed by the commits to ``table`` whose version is in (start, end]
        (by id without ``compactions``: leaving out what by time leaves out, keyed by CSNs);
        with ``lease`` (see :meth:`Leases.lease <replicas.leases.Leases.lease>`) pinning what they read, named in the answer, when
        there are any, until the caller releases it. Nothing stays leased if this fails."""
        if by not in ("id", "time"):
            raise InvalidInput(f"by must be 'id' or 'time', not {quote(by)}")
        tdef = self.table(table)
        self.retention.ensure_applied()
        if by == "id":
            end = self._check_id_range(start, end)
        else:
            self._check_time_range(start, end)
        if end is not None and end < start:
            raise InvalidInput(f"changes: end {quote(end)} is before start {quote(start)}")
        first = start if by == "id" else self.state.csn_at_time(start)
        commits = self._commits(table, start, end, by, compactions)
        lease_id = self._lease_checked(table, start, end, by, first, commits, fresh, lease, owner)
        rows = _part_rows(commits)
        return {
            "table": tdef.name,
            "dropped": self._drops(table, first, end, by, commits),
            "by": by,
            "start": start,
            "end": end,
            "parts": rows,
            "lease": lease_id,
            "commits": [
                {"csn": c["csn"], "tid": c["tid"], "time_version": c["time_version"], "kinds": c["kinds"]}
                for c in commits
            ],
        }


def _range_test(
    tv: dict[int, float], by: str, compactions: bool, lo: float, hi: float | None
) -> Callable[[int | None], bool]:
    """Whether a CSN's version (its id, or its time version by time) is in (lo, hi]."""

    def version(csn: int) -> float | None:
        if by == "id":  # without compactions, only the commits that have a time version
            return float(csn) if compactions or csn in tv else None
        return tv.get(csn)

    def in_range(csn: int | None) -> bool:
        if csn is None:
            return False
        v = version(csn)
        return v is not None and v > lo and (hi is None or v <= hi)

    return in_range


class _CommitSet:
    """The commits :meth:`ChangeFeed._commits` gathers, keyed by (CSN, tid)."""

    def __init__(self, tv: dict[int, float], history: dict[str, list[tuple[int, Summary]]], data_only: bool) -> None:
        self.tv = tv
        self.history = history
        self.data_only = data_only
        self.commits: dict[tuple[int, str], dict] = {}

    def kinds_of(self, pkey: str, csn: int, tid: str) -> frozenset[Kind] | None:
        ev = self.history.get(pkey, ())
        i = bisect.bisect_left(ev, csn, key=lambda e: e[0])
        while i < len(ev) and ev[i][0] == csn:
            if ev[i][1].tid == tid:
                return ev[i][1].kinds
            i += 1
        return None

    def commit(self, csn: int, tid: str) -> dict:
        c = self.commits.get((csn, tid))
        if c is None:
            c = self.commits[(csn, tid)] = {
                "csn": csn,
                "tid": tid,
                "time_version": self.tv.get(csn),
                "added": [],
                "removed": [],
                "kinds": set(),
                "written_at": None,
            }
        return c

    def compaction_only(self, pkey: str, csn: int, tid: str, c: dict) -> bool:
        kinds = self.kinds_of(pkey, csn, tid)
        if kinds:
            c["kinds"].update(k.value for k in kinds)
        return kinds is not None and kinds <= COMPACTIONS

    def add_record(self, rec: PartRecord, in_range: Callable[[int | None], bool]) -> None:
        """The part ``rec`` added by its creating commit and removed by its removing one."""
        pkey = rec.pkey
        if in_range(rec.creation_csn):
            c = self.commit(rec.creation_csn, rec.meta.creation_tid)
            if not (self.data_only and self.compaction_only(pkey, rec.creation_csn, rec.meta.creation_tid, c)):
                c["added"].append(rec.meta)
                c["written_at"] = max(c["written_at"] or 0.0, rec.meta.created_at)
        if rec.removal_csn is not None and rec.removal_tid is not None and in_range(rec.removal_csn):
            c = self.commit(rec.removal_csn, rec.removal_tid)
            if not (self.data_only and self.compaction_only(pkey, rec.removal_csn, rec.removal_tid, c)):
                c["removed"].append(rec.meta)

    def add_history(self, in_range: Callable[[int | None], bool]) -> None:
        """Each commit in range the conflict history names, with its operation kinds."""
        for _pkey, ev in self.history.items():
            for csn, s in ev:
                if in_range(csn) and not (self.data_only and s.kinds <= COMPACTIONS):
                    self.commit(csn, s.tid)["kinds"].update(k.value for k in s.kinds)

    def result(self) -> list[dict]:
        """The commits in (CSN, tid) order, their parts by name (by data only: none that only compacted)."""
        out = []
        for c in sorted(self.commits.values(), key=lambda c: (c["csn"], c["tid"])):
            if self.data_only and not c["added"] and not c["removed"] and c["kinds"] <= {k.value for k in COMPACTIONS}:
                continue
            c["added"].sort(key=lambda m: m.name)
            c["removed"].sort(key=lambda m: m.name)
            c["kinds"] = sorted(c["kinds"])
            out.append(c)
        return out


def _part_rows(commits: list[dict]) -> list[dict]:
    """One row per part each commit removed, then per part it added, in commit order."""
    rows = []
    for c in commits:
        for m in c["removed"]:
            rows.append({"change": "delete", "csn": c["csn"], "part": m.to_dict()})
        for m in c["added"]:
            rows.append({"change": "insert", "csn": c["csn"], "part": m.to_dict()})
    return rows
