"""Cleanup on one replica: collected parts, the watermark node ``gc``, orphans behind the fence.

**Cleanup** (:meth:`Cleanup.gc`, one pass, under the lock ``gc/lock``): the smallest published
value over the alive replicas (this replica's computed fresh) is ``min_snapshot``. A part removed by
a commit at ``removal_csn <= min_snapshot`` is invisible to every snapshot in use and to every later
one; it is kept still for its table's retention window (docs/rules.md#history-retention): until
``removal_time + retention_seconds``, the table's as defined at ``min_snapshot`` (the replica-wide
default when it sets none), so that every snapshot and ``changes`` range in the window stays
readable. Before deleting anything the pass raises the ZooKeeper node ``gc``
(coordinator/zk/watermark.py: the watermark and each table's horizon, only ever raised): a read that
would need a part that may be gone fails with SnapshotUnavailable ("older than retained") instead of
CorruptPart, on every replica alike. ``collected`` is raised to the highest CSN at or below which
every removed part is deleted, so later passes skip those parts and replicas forget them.

Files that no commit references (parts of transactions that never committed, of crashed writers,
of failed Spark attempts, and temporary files of interrupted puts) are deleted once older than the
grace period (``gc_grace_seconds``, never below :data:`MIN_GRACE`) unless the transaction named in
the part's name is still running on an alive replica (replicas publish the ids of their running
transactions older than ``leases.RUNNING_MIN_AGE``). Before deciding, the pass reads the alive nodes
and then catches up with the log, so a transaction that committed after the publication is seen as
committed. All of that only spares the transactions that look alive; what makes deleting safe is
the orphan fence (coordinator/zk/orphan_fence.py): part files are announced there before they are deleted,
and no commit can name an announced or deleted file, however long its replica stalled. Only files under table directories whose names have the shape of part files are ever
considered, so manifests and checkpoints are never touched.
What the snapshots in use are, and how a replica publishes them: replicas/leases.py.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from coordinator.core.conflicts import Policy
from coordinator.core.errors import (
    InvalidInput,
    ReplicaUnavailable,
    quote,
)
from coordinator.core.versions import COUNTER_STRIDE, Tid
from coordinator.model.records import AliveRecord
from coordinator.zk.alive import read_alive
from coordinator.zk.orphan_fence import MAX_PENDING
from coordinator.zk.recipes import release_quietly
from coordinator.zk.watermark import Marks
from parts.io.format import STAGING_DIR
from parts.io.storage import is_temp_file
from parts.model.meta import BUNDLE_SUFFIX, bundle_path, sidecar_path
from replicas.context import ReplicaContext, ReplicaPart
from replicas.settings import MIN_GRACE

if TYPE_CHECKING:
    from coordinator.model.records import AliveRecord
    from parts.model.meta import PartMeta
    from replicas.registry import Transactions
    from replicas.retention import Retention
    from replicas.state import PartRecord

log = logging.getLogger(__name__)

_PART_STEM_RE = re.compile(r"^(.+)_[0-9a-f]{16}$")
_TMP_RE = re.compile(r"^\.(.+)\.tmp-[0-9a-f]{12}$")
MIN_PASS_SECONDS = 1.0  # background cleanup passes never come closer together than this


def pass_interval(gc_interval: float, windows: Iterable[float]) -> float:
    """Seconds between background cleanup passes: ``gc_interval``, or a quarter of the shortest
    retention window in force (``windows``; a window of 0, which keeps only the snapshots in
    use, does not count) when that is shorter, never under :data:`MIN_PASS_SECONDS`; so a
    removed part outlives its window by at most about a quarter of it, and storage holds the
    live data and the window's removed parts and not much more (docs/architecture/bounds.md).
    ``gc_interval`` 0 (never) stays 0."""
    if gc_interval <= 0:
        return 0.0
    shortest = min((w for w in windows if w > 0), default=math.inf)
    return min(gc_interval, max(MIN_PASS_SECONDS, shortest / 4))


_NOT_TRANSACTIONS = frozenset({"read", "spark", "replica snapshot"})  # holders of a snapshot that write nothing


def _part_file(path: str) -> tuple[str, bool, re.Match] | None:
    """(part name, is a temporary file, stem match) for a part file, sidecar or flush bundle under a table's
    partition directory (or a temporary file of one), or any file under a staging directory
    ``<table>/_staging/<txn>_<16 hex>/`` (its name then stands for the part: never referenced);
    None for anything else."""
    if path.count("/") < 2:
        return None
    segments = path.split("/", 3)
    if len(segments) == 4 and segments[1] == STAGING_DIR:
        staged = _PART_STEM_RE.match(segments[2])
        return None if staged is None else (segments[2], False, staged)
    base = path.rsplit("/", 1)[1]
    temp = is_temp_file(path)
    inner = base
    if temp:
        t = _TMP_RE.match(base)
        inner = t.group(1) if t else base
    if inner.endswith(".parquet"):
        stem = inner[: -len(".parquet")]
    elif inner.endswith(".json"):
        stem = inner[: -len(".json")]
    elif inner.endswith(BUNDLE_SUFFIX):  # a flush's bundle: its merged part's (bundle_path)
        stem = inner[: -len(BUNDLE_SUFFIX)]
    else:
        return None
    m = _PART_STEM_RE.match(stem)
    return None if m is None else (stem, temp, m)


def _files_of(meta: PartMeta, bundles: set[str]) -> tuple[str, ...]:
    """What cleanup deletes of a removed part past its window: its file, sidecar and flush
    bundle (parts.io.format.store_bundle: kept while its part is recorded, for the parts that
    flush removed); of a flushed inlined part (``spilled``), that bundle: every part it holds
    was removed by the same flush, at the same CSN and time, so no read may take any of them
    once one's window passed (the bundle goes then, or with its part if that goes first);
    nothing of an inlined part, nor a bundle in ``bundles`` (deleted already: it is added)."""
    if meta.spilled is not None:
        if meta.spilled[0] in bundles:
            return ()
        bundles.add(meta.spilled[0])
        return (meta.spilled[0],)
    if meta.inlined:
        return ()
    return meta.path, sidecar_path(meta.path), bundle_path(meta.path)


def _age(seconds: float) -> str:
    return f"{seconds:.1f}s"


class Cleanup(ReplicaPart):
    """Cleanup passes and the retention watermark of one replica (``replica.cleanup``)."""

    def __init__(
        self,
        context: ReplicaContext,
        retention: Retention,
        transactions: Transactions,
    ) -> None:
        """``self.node``: the context's ``gc`` watermark, which this replica raises (shared with
        ``retention``)."""
        super().__init__(context)
        self.node, self.fence, self.retention, self.transactions = (
            context.watermark,
            context.fence,
            retention,
            transactions,
        )
        self.alive_record, self.catch_up = context.alive_record, context.catch_up
        self._last_gc = time.monotonic()
        self._last_orphans = time.monotonic()
        self.last_gc_report: dict | None = None
        self.last_gc_at: float | None = None  # wall time the last pass here ended (or failed)
        self.last_gc_error: str | None = None
        self.passes = 0  # metrics: passes run here, failed, files removed
        self.failures = 0
        self.files_removed = 0

    # -- the watermark node (coordinator/zk/watermark.py) ---------------------------------------------
    def start(self) -> None:
        self.node.on_error = lambda exc: log.error("%s", exc)
        self.node.start()

    # -- cleanup ---------------------------------------------------------------------------------
    def background_pass(self, now: float) -> None:
        """The maintenance thread's turn: a pass every ``gc_interval`` seconds, or more often when
        a retention window is short (:func:`pass_interval`), looking for orphans every
        ``max(gc_interval, grace / 2)``."""
        c = self.config
        windows = [self.retention.seconds(None), *(self.retention.seconds(d) for d in self.state.table_defs())]
        interval = pass_interval(c.gc_interval, windows)
        if interval > 0 and now - self._last_gc >= interval:
            self._last_gc = now
            orphans = now - self._last_orphans >= max(c.gc_interval, max(c.gc_grace_seconds, MIN_GRACE) / 2)
            self.gc(orphans=orphans, wait=False, detail=False)

    def gc(
        self, grace_seconds: float | None = None, orphans: bool = True, wait: bool = True, detail: bool = True
    ) -> dict | None:
        """One cleanup pass; None when ``wait`` is False and another replica holds the lock.
        ``young_orphans`` counts the unreferenced files younger than the grace period; without
        ``detail`` (background passes) they are not listed one by one in ``kept``."""
        zk = self.zk
        lock = zk.Lock(self.log.gc_lock_path(), identifier=self.host_id)
        if not lock.acquire(blocking=wait, timeout=60 if wait else None):
            if wait:
                raise ReplicaUnavailable("another cleanup pass held the cleanup lock for 60s")
            return None
        try:
            report = self._gc_pass(grace_seconds, orphans, detail)
        except Exception as exc:
            self.passes += 1
            self.failures += 1
            self.last_gc_at, self.last_gc_error = time.time(), f"{type(exc).__name__}: {exc}"
            raise
        finally:
            release_quietly(lock)
        self.passes += 1
        self.files_removed += len(report["removed"])
        self.last_gc_report, self.last_gc_at, self.last_gc_error = report, time.time(), None
        log.info(
            "cleanup pass: removed %d files, kept %d, young orphans %s, watermark CSN %s, %.2fs",
            len(report["removed"]),
            len(report.get("kept", ())),
            report.get("young_orphans"),
            report.get("watermark"),
            report.get("seconds") or 0.0,
        )
        return report

    def alive(self) -> dict[str, AliveRecord]:
        """Alive replicas' published records (a malformed one keeps everything: its
        ``oldest_snapshot`` is 0); this replica's own computed now."""
        out = read_alive(self.zk, self.log)
        out[self.host_id] = self.alive_record()
        return out

    def _gc_pass(self, grace_seconds: float | None, orphans: bool, detail: bool = True) -> dict:
        started = time.time()
        grace = self._grace(grace_seconds)
        alive = self.alive()  # first the published data, then the log (see the module docstring)
        self.catch_up()
        alive[self.host_id] = self.alive_record()
        min_snapshot = min(d.oldest_snapshot for d in alive.values())
        holders = self._holders(alive)
        candidates = self.state.removed_after(self.node.collected)
        # A removal CSN, once set, never changes: read outside the state lock, it is what it was.
        tables = sorted(
            {r.meta.table for r in candidates if r.removal_csn is not None and r.removal_csn <= min_snapshot}
        )
        windows = {t: self.retention.table_seconds(t, min_snapshot) for t in tables}
        marks = self.node.raise_to(min_snapshot, horizons={t: started - w for t, w in windows.items()})
        removed, kept, window_kept, lowest_kept = self._sweep(candidates, marks, min_snapshot, holders, windows, detail)
        collected = marks.watermark if lowest_kept is None else min(marks.watermark, lowest_kept - 1)
        if collected > marks.collected:
            # Tables with a removed part still in storage above it keep their horizon; for the
            # others everything their horizon could say is "gone" is at or below it (legacy).
            keep = {r.meta.table for r in candidates if r.removed_csn > collected}
            self.node.raise_to(min_snapshot, collected=collected, keep=keep)
        young = 0
        if orphans:
            young = self._collect_orphans(alive, grace, removed, kept, detail)
            self._last_orphans = time.monotonic()
        return {
            "host": self.host_id,
            "min_snapshot": min_snapshot,
            "watermark": self.node.watermark,
            "grace_seconds": grace,
            "snapshots_in_use": [{"host": h, "snapshot": s, "holder": t} for s, h, t in holders],
            "retention_seconds": windows,
            "removed": removed,
            "kept": kept,
            "kept_for_window": window_kept,
            "orphans_checked": orphans,
            "young_orphans": young,
            "seconds": round(time.time() - started, 3),
        }

    def _grace(self, grace_seconds: float | None) -> float:
        """The pass's grace for orphans: the setting unless given, checked, at least MIN_GRACE."""
        grace = self.config.gc_grace_seconds if grace_seconds is None else float(grace_seconds)
        if not math.isfinite(grace) or grace < 0:
            raise InvalidInput(f"grace_seconds must be a non-negative number, not {quote(grace_seconds)}")
        return max(grace, MIN_GRACE)

    def _sweep(
        self,
        candidates: list[PartRecord],
        marks: Marks,
        min_snapshot: int,
        holders: list[tuple[int, str, str]],
        windows: dict[str, float],
        detail: bool,
    ) -> tuple[list[dict], list[dict], int, int | None]:
        """Delete every removed part no snapshot in use and no retention window holds: the
        removed and kept entries, the count kept for a window, the lowest removal CSN kept."""
        removed: list[dict] = []
        kept: list[dict] = []
        window_kept = 0
        lowest_kept: int | None = None  # the lowest removal CSN of a part still in storage
        # Tables with a part kept for its retention window: a background pass (no report of each
        # kept part) only counts their later removals, which are inside the window too (commit
        # times follow CSNs; a clock running behind on another replica only delays a deletion to
        # a later pass). Every part the window holds was otherwise tested on every pass, 10 s
        # apart: a cost that grew with the history the window holds (benchmarks/history_cost.py).
        windowed: set[str] = set()
        bundles: set[str] = set()  # flush bundles deleted in this pass (many flushed parts name one)
        for rec in sorted(candidates, key=lambda r: (r.removed_csn, r.meta.name)):
            if not detail and rec.meta.table in windowed and rec.removed_csn <= min_snapshot:
                window_kept += 1
                continue
            entry = {
                "path": (rec.meta.spilled or (rec.meta.path,))[0],  # a flushed inlined part's: its bundle
                "part": rec.meta.name,
                "table": rec.meta.table,
                "removal_csn": rec.removal_csn,
            }
            if not marks.may_be_gone(rec.meta.table, rec.removal_csn, rec.removal_time):
                if lowest_kept is None:
                    lowest_kept = rec.removed_csn
                if rec.removed_csn > min_snapshot:
                    kept.append({**entry, "reason": self._kept_reason(rec, holders, min_snapshot)})
                    continue
                window_kept += 1
                windowed.add(rec.meta.table)
                if detail:
                    kept.append({**entry, "reason": self._window_reason(rec, windows.get(rec.meta.table))})
                continue
            files = _files_of(rec.meta, bundles)
            if not files:  # an inlined part: no file, its record goes with the state's pruning
                continue
            try:
                present = self._delete_files(files)
            except Exception as exc:
                if lowest_kept is None:
                    lowest_kept = rec.removed_csn
                kept.append({**entry, "reason": f"delete failed: {quote(exc)}"})
                continue
            if present:
                removed.append(
                    {**entry, "reason": self._removed_reason(rec, min_snapshot, windows.get(rec.meta.table))}
                )
        return removed, kept, window_kept, lowest_kept

    def _delete_files(self, files: tuple[str, ...]) -> bool:
        """Delete a removed part's files (:func:`_files_of`); whether the first was there."""
        present = self.storage.exists(files[0])
        for p in files:
            self.storage.delete(p)
        return present

    @staticmethod
    def _removed_reason(rec: PartRecord, min_snapshot: int, window: float | None) -> str:
        return (
            f"removed at CSN {rec.removal_csn} by {rec.removal_tid}; "
            f"no snapshot in use can see it (oldest in use: {min_snapshot})"
            + ("" if window is None else f" and its table's retention window ({window:g}s) has passed")
        )

    @staticmethod
    def _holders(alive: dict[str, AliveRecord]) -> list[tuple[int, str, str]]:
        """(snapshot, host, holder) for every published snapshot in use, oldest first; a replica
        whose oldest is its own snapshot version shows as holder "replica snapshot"."""
        out = []
        for host, d in alive.items():
            pairs = list(d.snapshots)
            for s, h in pairs:
                out.append((s, host, h))
            if not pairs or d.oldest_snapshot < min(s for s, _ in pairs):
                out.append((d.oldest_snapshot, host, "replica snapshot"))
        return sorted(out)

    @staticmethod
    def _holder_text(host: str, holder: str, snapshot: int) -> str:
        if holder == "read":
            return f"a read at snapshot {snapshot} on {host} (lease)"
        if holder == "spark":
            return f"a Spark job reading snapshot {snapshot} through {host} (lease)"
        if holder == "replica snapshot":
            return f"replica {host}, which has applied the log up to {snapshot} only"
        return f"running transaction {holder} on {host} (snapshot {snapshot})"

    @staticmethod
    def _window_reason(rec: Any, window: float | None) -> str:
        removed_at = rec.removal_time or 0.0
        until = datetime.fromtimestamp(removed_at + (window or 0.0), UTC).isoformat()
        return (
            f"kept for the retention window of table {rec.meta.table!r} (retention_seconds={window:g}): "
            f"removed at CSN {rec.removal_csn} at {datetime.fromtimestamp(removed_at, UTC).isoformat()}, "
            f"kept until {until}"
        )

    def _kept_reason(self, rec: Any, holders: list[tuple[int, str, str]], min_snapshot: int) -> str:
        for s, host, holder in holders:
            if rec.creation_csn <= s < rec.removal_csn:
                return "visible to " + self._holder_text(host, holder, s)
        tdef = self.state.tables.get(rec.meta.table)
        if tdef is not None and tdef.conflict_policy is Policy.KEYS:
            # A keys table's part written after a running transaction's snapshot is what that
            # transaction's commit-time key check reads (replicas/keylocks.py), compacted or not.
            for s, host, holder in holders:
                if s < rec.creation_csn and holder not in _NOT_TRANSACTIONS:
                    return (
                        f"written at CSN {rec.creation_csn}, after the snapshot of "
                        f"{self._holder_text(host, holder, s)}, whose key check at commit reads it"
                    )
        s, host, holder = holders[0] if holders else (min_snapshot, "?", "replica snapshot")
        return (
            f"awaiting gc: removed at CSN {rec.removal_csn}, after the oldest snapshot in use "
            f"({self._holder_text(host, holder, s)})"
        )

    def _running_view(self, alive: dict[str, AliveRecord]) -> tuple[set[str], set[str], dict[str, int]]:
        """The transactions running anywhere (as the alive records and this replica tell), the
        hosts that cannot tell which of theirs run, and each host's incarnation."""
        running: set[str] = set()
        overflow_hosts: set[str] = set()
        incarnations: dict[str, int] = {}
        for host, d in alive.items():
            running.update(d.running)
            if not d.knows_running:
                overflow_hosts.add(host)  # cannot tell which of its transactions run: keep all
            incarnations[host] = d.incarnation
        running.update(t.id for t in self.transactions.running_now())
        return running, overflow_hosts, incarnations

    def _unreferenced_why(
        self, name: str, running: set[str], overflow_hosts: set[str], incarnations: dict[str, int]
    ) -> tuple[str, str | None]:
        """The transaction id a part file's name carries (``name`` as written) and why no commit
        references the file; None for why when its transaction may still be running."""
        try:
            tid: Tid | None = Tid.parse(name)
        except ValueError:
            tid = None
        tid_s = str(tid) if tid else name
        forgotten = tid is not None and self.state.forgotten(tid_s)
        committed = self.state.commit_csn(tid_s) if tid is not None and not forgotten else None
        if committed is not None:
            return tid_s, f"not referenced by its transaction {tid_s}, which committed at CSN {committed}"
        if forgotten and tid_s not in running:
            # Began below the outcome window: ended long ago (committed or not), and no
            # part record names this file; a commit naming it after all is refused by the
            # orphan fence.
            return tid_s, f"its transaction {tid_s} began below the outcome window (outcome_seconds)"
        maybe_running = tid is not None and (
            tid_s in running
            or (
                tid.host_id in overflow_hosts
                # a restarted replica's earlier incarnations have no running transactions
                and tid.local_counter // COUNTER_STRIDE >= incarnations.get(tid.host_id, 0)
            )
        )
        if maybe_running:
            return tid_s, None
        return tid_s, f"its transaction {tid_s} never committed" if tid is not None else "no commit references it"

    def _collect_orphans(
        self, alive: dict[str, AliveRecord], grace: float, removed: list[dict], kept: list[dict], detail: bool = True
    ) -> int:
        """Delete the part files no commit references once they are older than the grace period.

        Returns how many unreferenced files are younger than the grace period; with ``detail``
        False (background passes) those are only counted, not listed one by one in ``kept``. The
        listing carries each file's mtime; a file is looked up by its part name in the applied
        state, and a file about to be deleted is looked up there once more after the fence's catch-up."""
        running, overflow_hosts, incarnations = self._running_view(alive)
        storage = self.storage
        young = 0
        now = time.time()
        condemned: list[tuple[str, dict, str]] = []  # (path, report entry, why): deleted behind the fence
        for table in sorted(self.state.tables):

            def unreferenced(path: str, table: str = table) -> bool:
                found = _part_file(path)
                return found is not None and (found[1] or not self._referenced(table, found[0], path))

            for path, mtime in storage.list_with_mtime(table + "/", unreferenced):
                stem, temp, m = _part_file(path)  # type: ignore[misc]
                age = now - mtime
                if age < grace:
                    young += 1
                    if not detail:
                        continue
                entry = {"path": path, "part": stem, "table": table}
                tid_s, unreferenced_why = self._unreferenced_why(m.group(1), running, overflow_hosts, incarnations)
                if unreferenced_why is None:
                    kept.append({**entry, "reason": f"staged by transaction {tid_s}, which may still be running"})
                    continue
                why = unreferenced_why
                if temp:
                    why = "temporary file of an interrupted write; " + why
                if age < grace:
                    kept.append(
                        {**entry, "reason": f"{why}, but younger than the grace period ({_age(age)} < {_age(grace)})"}
                    )
                    continue
                why = f"orphan: {why} (age {_age(age)} >= grace {_age(grace)})"
                if not temp:
                    condemned.append((path, entry, why))
                    continue
                try:  # a temporary file is never named by a commit
                    storage.delete(path)
                except Exception as exc:
                    kept.append({**entry, "reason": f"delete failed: {quote(exc)}"})
                    continue
                removed.append({**entry, "reason": why})
        self._delete_behind_fence(condemned, removed, kept)
        return young

    def _delete_behind_fence(
        self, condemned: list[tuple[str, dict, str]], removed: list[dict], kept: list[dict]
    ) -> None:
        """Delete part files decided orphans, and those an earlier pass condemned and did not
        finish, so that no commit can name them (coordinator/zk/orphan_fence.py): announce them on the
        fence, catch up with the log, keep what a commit applied meanwhile names, delete the
        rest, confirm."""
        fence = self.fence
        _, pending = fence.current()
        if not condemned and not pending:
            return
        announced, pending = fence.announce(path for path, _, _ in condemned)
        now_set = set(announced)
        for path, entry, _ in condemned:
            if path not in now_set and path not in pending:
                kept.append(
                    {
                        **entry,
                        "reason": f"orphan, left for the next pass (at most {MAX_PENDING} "
                        "files are condemned at a time)",
                    }
                )
        # Every commit applied before the announcement is in the log now; any later one that
        # names these files is refused by the fence.
        self.catch_up()
        ours = {path: (entry, why) for path, entry, why in condemned if path in pending}
        earlier = sorted(pending - ours.keys())
        settled: list[str] = []
        for path in list(ours) + earlier:
            entry, why = ours.get(path) or (
                {"path": path, "part": None, "table": path.split("/", 1)[0]},
                "orphan condemned by an earlier cleanup pass that did not finish",
            )
            found = _part_file(path)
            if found is not None and self._referenced(entry["table"], found[0], path):
                settled.append(path)  # committed before the announcement: not an orphan
                continue
            try:
                self.storage.delete(path)
            except Exception as exc:
                kept.append({**entry, "reason": f"delete failed: {quote(exc)}"})
                continue
            settled.append(path)
            removed.append({**entry, "part": entry["part"] or (found[0] if found else None), "reason": why})
        fence.confirm(settled)

    def _referenced(self, table: str, stem: str, path: str) -> bool:
        """Whether ``path`` is the file, sidecar or flush bundle of a part of ``table`` some commit
        added (the applied state keeps a record of every part, removed ones included). A file at
        an inlined part's path is no part's: none is ever written there."""
        rec = self.state.part(stem)
        return (
            rec is not None
            and not rec.meta.inlined
            and rec.meta.table == table
            and path in (rec.meta.path, sidecar_path(rec.meta.path), bundle_path(rec.meta.path))
        )

    # -- introspection ---------------------------------------------------------------------------
    def part_notes(self) -> Callable[[Any], tuple[str | None, bool]]:
        """A function giving (why_kept, collected) for a part record, for ``client.parts``."""
        try:
            alive = self.alive()
        except Exception:  # introspection must not fail on a ZooKeeper hiccup
            alive = {self.host_id: self.alive_record()}
        # Only transactions and read leases are named: "awaiting gc" otherwise (a lagging replica's
        # own snapshot version holds cleanup back too, but says nothing about this part).
        holders = [h for h in self._holders(alive) if h[2] != "replica snapshot"]
        marks = self.node.marks
        retention = self.retention
        now = time.time()

        def note(rec: Any) -> tuple[str | None, bool]:
            if rec.removal_csn is None:
                return None, False
            if marks.may_be_gone(rec.meta.table, rec.removal_csn, rec.removal_time):
                return None, True
            window = retention.table_seconds(rec.meta.table, rec.removal_csn)
            if rec.removal_time is not None and rec.removal_time + window > now:
                return self._window_reason(rec, window), False
            for s, host, holder in holders:
                if rec.creation_csn <= s < rec.removal_csn:
                    return f"visible to snapshot {s} ({self._holder_text(host, holder, s)})", False
            return "awaiting gc", False

        return note
