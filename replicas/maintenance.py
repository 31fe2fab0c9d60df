"""Background work of a replica: merges, cleanup, incremental reads and the event log.

**Snapshots in use.** Each replica publishes in its ephemeral node ``replicas/<host>/alive`` the
oldest snapshot it still serves: the snapshots of its running transactions, of its read leases,
and its own snapshot version when nothing older is in use. A lease pins the snapshot of a read
outside a transaction from the moment the replica answers the part list: a plain read's lease
(holder "read") until its client has read the files and releases it, or lapses
:data:`READ_LEASE_SECONDS` after it was taken or last renewed (a client that died mid-read); a
Spark job's (holder "spark") from planning until it lapses ``read_lease_seconds`` later, since
Spark tells a reader nothing when the job ends. It refreshes the node from the reaper thread (every half second, only when the
values changed). A ``begin`` reads the snapshot and registers the transaction under the same lock
as the publisher computes the value, so a published value never exceeds a snapshot in use.

**Cleanup** (:meth:`Maintenance.gc`, one pass, under the lock ``gc/lock``): the smallest published
value over the alive replicas (this replica's computed fresh) is ``min_snapshot``. A part removed by
a commit at ``removal_csn <= min_snapshot`` is invisible to every snapshot in use and to every later
one, so its file may go. Before deleting anything the pass raises the watermark in the ZooKeeper
node ``gc`` (JSON ``{"watermark", "collected"}``, only ever raised): a read at a snapshot that sees a
part removed at or below the watermark fails with SnapshotUnavailable ("older than retained")
instead of CorruptPart; snapshots that see only retained parts stay readable. ``collected`` is
raised after every deletion up to it succeeded, so later passes skip those parts.

Files that no commit references (parts of transactions that never committed, of crashed writers,
of failed Spark attempts, and temporary files of interrupted puts) are deleted once older than the
grace period (``gc_grace_seconds``, never below :data:`MIN_GRACE`) unless the transaction named in
the part's name is still running on an alive replica (replicas publish the ids of their running
transactions older than :data:`RUNNING_MIN_AGE`). Before deciding, the pass reads the alive nodes
and then catches up with the log, so a transaction that committed after the publication is seen as
committed. All of that only spares the transactions that look alive; what makes deleting safe is
the orphan fence (coordinator/fence.py): part files are announced there before they are deleted,
and no commit can name an announced or deleted file, however long its replica stalled. Only files under table directories whose names have the shape of part files are ever
considered, so manifests and checkpoints are never touched.

**Merges.** A replica looks at each ``auto_merge`` table every ``merge_interval`` seconds; when a
partition has ``merge_min_parts`` small parts (minor) or has been idle ``major_idle_seconds`` with
several parts (major), it takes the table's lock ``leaders/<table>`` (kazoo's Lock recipe, without
waiting), catches up with the log, and merges as an ordinary transaction (an ID version, no time
version). A merge that loses a conflict is logged, recorded as an event and retried later.

**Events.** Commit, part-added and part-removed events are derived from the log as applied here
(the same on every replica); begin, rollback and merge events of this replica are kept in a
bounded in-memory ring (:data:`EVENT_RING`), lost when the process restarts.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import NodeExistsError, NoNodeError

from coordinator.catalog import TableDef
from coordinator.conflicts import COMPACTIONS, Kind
from coordinator.errors import (
    ConflictError,
    CorruptMetadata,
    InvalidInput,
    MergetxnError,
    ReplicaUnavailable,
    SnapshotUnavailable,
)
from coordinator.fence import MAX_PENDING
from coordinator.model import AliveRecord, TxnState
from coordinator.versions import COUNTER_STRIDE, Tid
from coordinator.zkrecipes import cas_update
from parts.format import PartMeta, sidecar_path
from parts.ops import partition_key
from parts.storage import is_temp_file

log = logging.getLogger(__name__)

MIN_GRACE = 5.0  # seconds; covers the publication lag of running transactions (see RUNNING_MIN_AGE)
RUNNING_MIN_AGE = 1.0  # running transactions at least this old are published by id
MAX_PUBLISHED_RUNNING = 1000  # beyond this a replica publishes "running_overflow" instead
MAX_PUBLISHED_SNAPSHOTS = 16
EVENT_RING = 10_000
_PART_STEM_RE = re.compile(r"^(.+)_[0-9a-f]{16}$")
_TMP_RE = re.compile(r"^\.(.+)\.tmp-[0-9a-f]{12}$")


def _part_file(path: str) -> tuple[str, bool, re.Match] | None:
    """(part name, is a temporary file, stem match) for a part file or sidecar under a table's
    partition directory (or a temporary file of one); None for anything else."""
    if path.count("/") < 2:
        return None
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
    else:
        return None
    m = _PART_STEM_RE.match(stem)
    return None if m is None else (stem, temp, m)


def _age(seconds: float) -> str:
    return f"{seconds:.1f}s"


READ_LEASE_SECONDS = 30.0  # a plain read's lease lapses this long after it was taken or renewed
LEASE_HOLDERS = ("read", "spark")


@dataclass
class Lease:
    snapshot: int
    holder: str  # "read" (a plain read, released when its client has read the files) or "spark"
    lapse: float
    expiry: float  # time.monotonic()


class Maintenance:
    """Merges, cleanup, retention checks, incremental reads and events of one replica."""

    def __init__(self, replica) -> None:
        self.replica = replica
        self.state = replica.state
        self.config = replica.config
        self.watermark = 0  # parts removed at or below it may be gone (the ZooKeeper node "gc")
        self.collected = 0
        self._events: deque[dict] = deque(maxlen=EVENT_RING)
        self._event_seq = 0
        self._leases: dict[str, Lease] = {}  # lease id -> lease
        self._locks: dict[str, Any] = {}
        self._backoff: dict[tuple[str, str], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="maintenance", daemon=True)
        self._last_gc = time.monotonic()
        self._last_orphans = time.monotonic()
        self.last_gc_report: dict | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def gc_path(self) -> str:
        return self.replica.log.path("gc")

    def start(self) -> None:
        zk = self.replica.zk
        try:
            zk.retry(zk.create, self.gc_path, json.dumps({"watermark": 0, "collected": 0}).encode())
        except NodeExistsError:
            pass
        zk.retry(zk.ensure_path, self.replica.log.path("leaders"))
        self._set_gc_node(zk.retry(zk.get, self.gc_path)[0])
        zk.DataWatch(self.gc_path, self._on_gc_node)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _on_gc_node(self, data: bytes | None, stat: Any) -> None:
        if data is not None:
            try:
                self._set_gc_node(data)
            except CorruptMetadata as exc:
                log.error("%s", exc)

    def _parse_gc_node(self, data: bytes) -> dict:
        try:
            d = json.loads(data)
            return {"watermark": int(d["watermark"]), "collected": int(d.get("collected", 0))}
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptMetadata(f"znode {self.gc_path} does not parse: {exc!r}") from exc

    def _set_gc_node(self, data: bytes) -> dict:
        d = self._parse_gc_node(data)
        self.watermark = max(self.watermark, d["watermark"])
        self.collected = max(self.collected, d["collected"])
        return d

    def refresh_watermark(self) -> int:
        """Read the watermark now (a client that found a part missing asks again)."""
        zk = self.replica.zk
        self._set_gc_node(zk.retry(zk.get, self.gc_path)[0])
        return self.watermark

    # -- snapshots in use ----------------------------------------------------------------------
    def lease(self, snapshot: int | None, holder: str = "read") -> tuple[int, str | None]:
        """Pin a read's snapshot until :meth:`release` or until the lease lapses (see the module
        docstring); None means the latest, read under the transaction lock so that the publisher
        never publishes past it. Returns the snapshot and the lease id (None: no lease, for
        ``holder`` "none" or a Spark lease with ``read_lease_seconds`` 0)."""
        if holder not in LEASE_HOLDERS + ("none",):
            raise InvalidInput(f"lease must be one of {list(LEASE_HOLDERS + ('none',))}, not {holder!r}")
        lapse = READ_LEASE_SECONDS if holder == "read" else self.config.read_lease_seconds if holder == "spark" else 0
        with self.replica.transactions._txn_lock:
            snap = self.state.applied if snapshot is None else snapshot
            if lapse <= 0:
                return snap, None
            lease_id = uuid.uuid4().hex
            self._leases[lease_id] = Lease(snap, holder, lapse, time.monotonic() + lapse)
        return snap, lease_id

    def renew(self, lease_id: str) -> dict:
        """Extend a lease by its lapse time; ``renewed`` is False once it has lapsed or ended
        (cleanup may have taken its parts since)."""
        now = time.monotonic()
        with self.replica.transactions._txn_lock:
            lease = self._leases.get(_lease_id(lease_id))
            if lease is None or lease.expiry <= now:
                return {"renewed": False}
            lease.expiry = now + lease.lapse
        return {"renewed": True, "seconds": lease.lapse}

    def release(self, lease_id: str) -> dict:
        """End a lease: its snapshot is no longer in use (for it)."""
        with self.replica.transactions._txn_lock:
            return {"released": self._leases.pop(_lease_id(lease_id), None) is not None}

    def in_use(self) -> tuple[int, list[tuple[int, str]], list[str], bool]:
        """(oldest snapshot, up to 16 oldest (snapshot, holder) pairs, ids of running transactions
        old enough to publish, overflow). Called with no lock held; takes the transaction lock."""
        now = time.monotonic()
        with self.replica.transactions._txn_lock:
            applied = self.state.applied
            txns = list(self.replica.transactions.txns.values())
            for lease_id in [k for k, lease in self._leases.items() if lease.expiry <= now]:
                del self._leases[lease_id]
            leases = [(lease.snapshot, lease.holder) for lease in self._leases.values()]
        holders = sorted([(t.snapshot, t.id) for t in txns] + leases)
        oldest = min([applied] + [s for s, _ in holders])
        running = sorted(t.id for t in txns if now - t.started >= RUNNING_MIN_AGE)
        overflow = len(running) > MAX_PUBLISHED_RUNNING
        picked: list[tuple[int, str]] = []
        seen: set[int] = set()
        for s, h in holders:  # the oldest holder of each distinct snapshot
            if s not in seen:
                seen.add(s)
                picked.append((s, h))
            if len(picked) >= MAX_PUBLISHED_SNAPSHOTS:
                break
        return oldest, picked, ([] if overflow else running), overflow

    def alive(self) -> dict[str, AliveRecord]:
        """Alive replicas' published records (a malformed one keeps everything: its
        ``oldest_snapshot`` is 0); this replica's own computed now."""
        zk = self.replica.zk
        out: dict[str, AliveRecord] = {}
        for host in zk.retry(zk.get_children, self.replica.log.path("replicas")):
            try:
                data, _ = zk.retry(zk.get, self.replica.log.path("replicas", host, "alive"))
            except NoNodeError:
                continue
            out[host] = AliveRecord.decode(data)
        out[self.replica.host_id] = self.replica.alive_record()
        return out

    # -- retention -----------------------------------------------------------------------------
    def ensure_applied_watermark(self) -> None:
        """A replica behind the watermark (restarted from an old WAL) would not know which parts
        are gone: catch up to it before serving a snapshot."""
        w = self.watermark
        if w <= self.state.applied:
            return
        self.replica.follower.poke()
        if not self.state.wait_applied(w, self.config.read_wait_seconds) or self.state.applied < w:
            if self.state.failure is not None:
                raise self.state.failure
            raise ReplicaUnavailable(f"replica {self.replica.host_id} has not applied the cleanup watermark "
                                     f"{w} yet (applied: {self.state.applied})")

    def check_retained(self, table: str, snapshot: int, metas: list[PartMeta], fresh: bool = False) -> None:
        """SnapshotUnavailable when a part visible at ``snapshot`` was removed at or below the
        watermark: cleanup may have deleted its file. Nothing to check at newer snapshots."""
        w = self.refresh_watermark() if fresh else self.watermark
        if snapshot >= w:
            return
        parts = self.state.parts
        for m in metas:
            rec = parts.get(m.name)
            if rec is not None and rec.removal_csn is not None and rec.removal_csn <= w:
                raise SnapshotUnavailable(
                    f"snapshot {snapshot} of table {table!r} is older than retained: cleanup collected parts "
                    f"removed at or before CSN {w} (part {m.name}, removed at CSN {rec.removal_csn})",
                    snapshot=snapshot, table=table, retained_from=w,
                )

    # -- cleanup ---------------------------------------------------------------------------------
    def gc(self, grace_seconds: float | None = None, orphans: bool = True, wait: bool = True,
           detail: bool = True) -> dict | None:
        """One cleanup pass; None when ``wait`` is False and another replica holds the lock.
        ``young_orphans`` counts the unreferenced files younger than the grace period; without
        ``detail`` (background passes) they are not listed one by one in ``kept``."""
        zk = self.replica.zk
        lock = zk.Lock(self.gc_path + "/lock", identifier=self.replica.host_id)
        if not lock.acquire(blocking=wait, timeout=60 if wait else None):
            if wait:
                raise ReplicaUnavailable("another cleanup pass held the cleanup lock for 60s")
            return None
        try:
            report = self._gc_pass(grace_seconds, orphans, detail)
        finally:
            try:
                lock.release()
            except Exception:  # pragma: no cover - session trouble; the node is ephemeral
                pass
        self.last_gc_report = report
        return report

    def _catch_up(self) -> None:
        """Apply everything committed up to now (sync, then pull) before deciding."""
        zk = self.replica.zk
        zk.sync(self.replica.log.path("log"))
        self.replica.follower.pull()
        if self.state.failure is not None:
            raise self.state.failure

    def _raise_gc_node(self, watermark: int, collected: int | None = None) -> dict:
        """Raise the node ``gc`` to at least these values (compare-and-swap; never lowers it)."""

        def change(data: bytes | None) -> bytes | None:
            cur = self._parse_gc_node(data) if data is not None else {"watermark": 0, "collected": 0}
            new = {"watermark": max(cur["watermark"], watermark),
                   "collected": max(cur["collected"], collected if collected is not None else 0)}
            if new == cur:
                return None
            return json.dumps({**new, "by": self.replica.host_id, "time": time.time()}).encode()

        return self._set_gc_node(cas_update(self.replica.zk, self.gc_path, change))

    def _gc_pass(self, grace_seconds: float | None, orphans: bool, detail: bool = True) -> dict:
        started = time.time()
        grace = self.config.gc_grace_seconds if grace_seconds is None else float(grace_seconds)
        if not math.isfinite(grace) or grace < 0:
            raise InvalidInput(f"grace_seconds must be a non-negative number, not {grace_seconds!r}")
        grace = max(grace, MIN_GRACE)
        alive = self.alive()  # first the published data, then the log (see the module docstring)
        self._catch_up()
        alive[self.replica.host_id] = self.replica.alive_record()
        min_snapshot = min(d.oldest_snapshot for d in alive.values())
        holders = self._holders(alive)
        node = self._raise_gc_node(min_snapshot)
        done = node["collected"]
        removed: list[dict] = []
        kept: list[dict] = []
        failed = False
        with self.state.lock:
            candidates = [r for r in self.state.parts.values() if r.removal_csn is not None and r.removal_csn > done]
        for rec in sorted(candidates, key=lambda r: (r.removal_csn, r.meta.name)):
            entry = {"path": rec.meta.path, "part": rec.meta.name, "table": rec.meta.table,
                     "removal_csn": rec.removal_csn}
            if rec.removal_csn > min_snapshot:
                kept.append({**entry, "reason": self._kept_reason(rec, holders, min_snapshot)})
                continue
            try:
                present = self.replica.storage.exists(rec.meta.path)
                self.replica.storage.delete(rec.meta.path)
                self.replica.storage.delete(sidecar_path(rec.meta.path))
            except Exception as exc:
                failed = True
                kept.append({**entry, "reason": f"delete failed: {exc!r}"})
                continue
            if present:
                removed.append({**entry, "reason": f"removed at CSN {rec.removal_csn} by {rec.removal_tid}; "
                                                   f"no snapshot in use can see it (oldest in use: {min_snapshot})"})
        if not failed:
            self._raise_gc_node(min_snapshot, collected=min_snapshot)
        young = 0
        if orphans:
            young = self._collect_orphans(alive, grace, removed, kept, detail)
            self._last_orphans = time.monotonic()
        return {
            "host": self.replica.host_id,
            "min_snapshot": min_snapshot,
            "watermark": self.watermark,
            "grace_seconds": grace,
            "snapshots_in_use": [{"host": h, "snapshot": s, "holder": t} for s, h, t in holders],
            "removed": removed,
            "kept": kept,
            "orphans_checked": orphans,
            "young_orphans": young,
            "seconds": round(time.time() - started, 3),
        }

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

    def _kept_reason(self, rec: Any, holders: list[tuple[int, str, str]], min_snapshot: int) -> str:
        for s, host, holder in holders:
            if rec.creation_csn <= s < rec.removal_csn:
                return "visible to " + self._holder_text(host, holder, s)
        s, host, holder = holders[0] if holders else (min_snapshot, "?", "replica snapshot")
        return (f"awaiting gc: removed at CSN {rec.removal_csn}, after the oldest snapshot in use "
                f"({self._holder_text(host, holder, s)})")

    def _collect_orphans(self, alive: dict[str, AliveRecord], grace: float, removed: list[dict], kept: list[dict],
                         detail: bool = True) -> int:
        """Delete the part files no commit references once they are older than the grace period.

        Returns how many unreferenced files are younger than the grace period; with ``detail``
        False (background passes) those are only counted, not listed one by one in ``kept``. The
        listing carries each file's mtime; a file is looked up by its part name in the applied
        state, and a file about to be deleted is checked once more under the state lock."""
        running: set[str] = set()
        overflow_hosts: set[str] = set()
        incarnations: dict[str, int] = {}
        for host, d in alive.items():
            running.update(d.running)
            if not d.knows_running:
                overflow_hosts.add(host)  # cannot tell which of its transactions run: keep all
            incarnations[host] = d.incarnation
        with self.replica.transactions._txn_lock:
            running.update(self.replica.transactions.txns)
        storage = self.replica.storage
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
                try:
                    tid: Tid | None = Tid.parse(m.group(1))
                except ValueError:
                    tid = None
                tid_s = str(tid) if tid else m.group(1)
                entry = {"path": path, "part": stem, "table": table}
                committed = self.state.tid_csn.get(tid_s) if tid is not None else None
                if committed is not None:
                    why = f"not referenced by its transaction {tid_s}, which committed at CSN {committed}"
                else:
                    maybe_running = tid is not None and (tid_s in running or (
                        tid.host_id in overflow_hosts
                        # a restarted replica's earlier incarnations have no running transactions
                        and tid.local_counter // COUNTER_STRIDE >= incarnations.get(tid.host_id, 0)))
                    if maybe_running:
                        kept.append({**entry, "reason": f"staged by transaction {tid_s}, which may still be running"})
                        continue
                    why = f"its transaction {tid_s} never committed" if tid is not None else "no commit references it"
                if temp:
                    why = "temporary file of an interrupted write; " + why
                if age < grace:
                    kept.append({**entry, "reason": f"{why}, but younger than the grace period "
                                                    f"({_age(age)} < {_age(grace)})"})
                    continue
                why = f"orphan: {why} (age {_age(age)} >= grace {_age(grace)})"
                if not temp:
                    condemned.append((path, entry, why))
                    continue
                try:  # a temporary file is never named by a commit
                    storage.delete(path)
                except Exception as exc:
                    kept.append({**entry, "reason": f"delete failed: {exc!r}"})
                    continue
                removed.append({**entry, "reason": why})
        self._delete_behind_fence(condemned, removed, kept)
        return young

    def _delete_behind_fence(self, condemned: list[tuple[str, dict, str]], removed: list[dict],
                             kept: list[dict]) -> None:
        """Delete part files decided orphans, and those an earlier pass condemned and did not
        finish, so that no commit can name them (coordinator/fence.py): announce them on the
        fence, catch up with the log, keep what a commit applied meanwhile names, delete the
        rest, confirm."""
        fence = self.replica.fence
        _, pending = fence.current()
        if not condemned and not pending:
            return
        announced, pending = fence.announce(path for path, _, _ in condemned)
        now_set = set(announced)
        for path, entry, _ in condemned:
            if path not in now_set and path not in pending:
                kept.append({**entry, "reason": f"orphan, left for the next pass (at most {MAX_PENDING} "
                                                "files are condemned at a time)"})
        # Every commit applied before the announcement is in the log now; any later one that
        # names these files is refused by the fence.
        self._catch_up()
        ours = {path: (entry, why) for path, entry, why in condemned if path in pending}
        earlier = sorted(pending - ours.keys())
        settled: list[str] = []
        for path in list(ours) + earlier:
            entry, why = ours.get(path) or ({"path": path, "part": None, "table": path.split("/", 1)[0]},
                                            "orphan condemned by an earlier cleanup pass that did not finish")
            found = _part_file(path)
            with self.state.lock:
                if found is not None and self._referenced(entry["table"], found[0], path):
                    settled.append(path)  # committed before the announcement: not an orphan
                    continue
            try:
                self.replica.storage.delete(path)
            except Exception as exc:
                kept.append({**entry, "reason": f"delete failed: {exc!r}"})
                continue
            settled.append(path)
            removed.append({**entry, "part": entry["part"] or (found[0] if found else None), "reason": why})
        fence.confirm(settled)

    def _referenced(self, table: str, stem: str, path: str) -> bool:
        """Whether ``path`` is the file or sidecar of a part of ``table`` some commit added (the
        applied state keeps a record of every part, removed ones included)."""
        rec = self.state.parts.get(stem)
        return rec is not None and rec.meta.table == table and path in (rec.meta.path, sidecar_path(rec.meta.path))

    # -- merges ----------------------------------------------------------------------------------
    def plan_merges(self, tdef: TableDef) -> list[tuple[str, str, list[PartMeta]]]:
        """(kind, pkey, sources) per partition that the policy says to merge now."""
        c = self.config
        now = time.time()
        with self.state.lock:  # names only: the metas are looked up after (records are never dropped)
            live = {pk: list(names) for pk, names in self.state.live.get(tdef.name, {}).items() if len(names) >= 2}
        parts = self.state.parts
        plans = []
        for pkey, names in sorted(live.items()):
            metas = sorted((parts[n].meta for n in names if n in parts), key=lambda m: m.name)
            small = [m for m in metas if m.size < c.merge_small_bytes]
            if c.merge_min_parts >= 2 and len(small) >= c.merge_min_parts:
                plans.append(("minor", pkey, small[: max(2, c.merge_max_parts)]))
            elif (len(metas) >= max(2, c.major_min_parts) and len(metas) <= c.merge_max_parts
                  and sum(m.size for m in metas) <= c.major_max_bytes
                  and now - max(m.created_at for m in metas) >= c.major_idle_seconds):
                plans.append(("major", pkey, metas))
        return [p for p in plans if self._backoff.get((tdef.name, p[1]), 0) <= time.monotonic()]

    def merge_round(self) -> int:
        """Look at every auto_merge table once; returns how many merges committed here."""
        done = 0
        for name in sorted(self.state.tables):
            tdef = self.state.tables.get(name)
            if tdef is None or not tdef.auto_merge or self._stop.is_set():
                continue
            if not self.plan_merges(tdef):
                continue
            lock = self._locks.get(name)
            if lock is None:
                lock = self._locks[name] = self.replica.zk.Lock(self.replica.log.path("leaders", name),
                                                                identifier=self.replica.host_id)
            if not lock.acquire(blocking=False):
                continue
            try:
                self._catch_up()  # what another replica merged before we got the lock is seen now
                for kind, pkey, sources in self.plan_merges(self.replica.table(name)):
                    if self.run_merge(tdef, kind, pkey, [m.name for m in sources]).get("outcome") == "committed":
                        done += 1
            finally:
                try:
                    lock.release()
                except Exception:  # pragma: no cover - session trouble; the node is ephemeral
                    pass
        return done

    def run_merge(self, tdef: TableDef, kind: str, pkey: str, sources: list[str],
                  before_commit: Callable[[], None] | None = None) -> dict:
        """Merge ``sources`` (parts of one partition) in a transaction of its own. A conflict is
        logged and recorded, never raised; the partition is retried after a short back-off."""
        from coordinator.model import Compact
        from parts import rewrite

        replica, txns = self.replica, self.replica.transactions
        txn = txns.begin()
        event = {"table": tdef.name, "partition": pkey, "kind": kind, "tid": txn.id, "snapshot": txn.snapshot,
                 "sources": list(sources)}
        result = None
        staged = False
        try:
            _, visible = txns.visible_parts(tdef.name, txn.id, pkeys=[pkey])
            wanted = set(sources)
            parts = [m for m in visible if m.name in wanted]
            if len(parts) < 2:
                txns.rollback(txn.id, "nothing left to merge")
                self._backoff[(tdef.name, pkey)] = time.monotonic() + 1.0
                self.record("merge", outcome="skipped", reason="sources no longer visible", **event)
                return {"outcome": "skipped"}
            result = rewrite.compact(replica.storage, tdef, parts, "major", txn.id)  # exactly these parts
            op = Compact(tdef.name, kind, added=tuple(result.added), removed=tuple(result.removed),
                         partitions=(pkey,))
            txns.stage(txn.id, op)
            staged = True
            if before_commit is not None:
                before_commit()
            csn = txns.commit(txn.id)
        except ConflictError as exc:
            log.info("merge of %s partition %s lost a conflict (retried later): %s", tdef.name, pkey, exc.message)
            self._backoff[(tdef.name, pkey)] = time.monotonic() + 2.0
            self.record("merge", outcome="conflict", reason=exc.message, **event)
            return {"outcome": "conflict", "reason": exc.message}
        except MergetxnError as exc:
            log.warning("merge of %s partition %s failed: %s", tdef.name, pkey, exc.message)
            self._backoff[(tdef.name, pkey)] = time.monotonic() + 10.0
            self.record("merge", outcome="failed", reason=exc.message, **event)
            return {"outcome": "failed", "reason": exc.message}
        finally:
            if txn.state == TxnState.RUNNING:
                txns.abort(txn, "merge failed")
            if result is not None and not staged:
                for m in result.added:
                    txns._delete_file(m.path)
        self.record("merge", outcome="committed", csn=csn, **event)
        return {"outcome": "committed", "csn": csn, "removed": len(result.removed), "added": len(result.added)}

    # -- the background thread ------------------------------------------------------------------
    def _run(self) -> None:
        c = self.config
        tick = min([x for x in (c.merge_interval, c.gc_interval, 1.0) if x > 0])
        last_merge = 0.0
        while not self._stop.wait(tick):
            if not self.replica._connected.is_set():
                continue
            now = time.monotonic()
            try:
                if c.merge_interval > 0 and now - last_merge >= c.merge_interval:
                    last_merge = now
                    self.merge_round()
                if c.gc_interval > 0 and now - self._last_gc >= c.gc_interval:
                    self._last_gc = now
                    orphans = now - self._last_orphans >= max(c.gc_interval, max(c.gc_grace_seconds, MIN_GRACE) / 2)
                    report = self.gc(orphans=orphans, wait=False, detail=False)
                    if report and report["removed"]:
                        log.info("cleanup removed %d files", len(report["removed"]))
            except Exception as exc:  # keep going: the next round tries again
                log.warning("maintenance round failed: %r", exc)

    # -- events ------------------------------------------------------------------------------------
    def record(self, event: str, **fields: Any) -> None:
        """A local event (begin, rollback, merge) in the bounded ring."""
        self._event_seq += 1
        self._events.append({"time": time.time(), "event": event, "host": self.replica.host_id,
                             "_seq": self._event_seq, **fields})

    def on_begin(self, txn: Any) -> None:
        self.record("begin", tid=txn.id, snapshot=txn.snapshot, _txn=txn)

    def on_end(self, txn: Any) -> None:
        if txn.state == TxnState.ABORTED:
            self.record("rollback", tid=txn.id, snapshot=txn.snapshot, reason=txn.reason, _txn=txn)

    def events(self, table: str | None = None, since_csn: int | None = None) -> list[dict]:
        """Events, oldest first: commits and parts from the log; begin, rollback and merges of
        this replica from its ring. ``since_csn`` keeps commit events above it and local events of
        transactions whose snapshot is at or above it."""
        if table is not None:
            self.replica.table(table)
        if since_csn is not None and (isinstance(since_csn, bool) or not isinstance(since_csn, int)):
            raise InvalidInput(f"since_csn must be an integer CSN, not {since_csn!r}")
        since = -1 if since_csn is None else since_csn
        out: list[dict] = []
        tables = [table] if table is not None else sorted(self.state.tables)
        for t in tables:
            for c in self._commits(t, since, None):
                when = c["time_version"] if c["time_version"] is not None else c["written_at"]
                base = {"time": when, "table": t, "tid": c["tid"], "csn": c["csn"], "host": Tid.parse(c["tid"]).host_id}
                out.append({**base, "event": "commit", "kinds": ",".join(c["kinds"]),
                            "rows": sum(m.rows for m in c["added"]), "_order": 0})
                for m in c["removed"]:
                    out.append({**base, "event": "part_removed", "part": m.name,
                                "partition": partition_key(m.partition), "rows": m.rows, "_order": 1})
                for m in c["added"]:
                    out.append({**base, "event": "part_added", "part": m.name,
                                "partition": partition_key(m.partition), "rows": m.rows, "_order": 2})
        for e in list(self._events):
            txn = e.get("_txn")
            snap = e.get("snapshot")
            if snap is not None and snap < since:
                continue
            if e["event"] == "merge":
                if table is None or e["table"] == table:
                    out.append({k: v for k, v in e.items() if k not in ("sources", "kind")}
                               | {"kinds": e["kind"], "part": ",".join(e["sources"]), "_order": 0})
                continue
            touched = sorted({op.table for op in txn.ops}) if txn is not None else []
            if table is not None:
                if table not in touched:
                    continue
                touched = [table]
            for t in touched or [None]:
                out.append({k: v for k, v in e.items() if k != "_txn"} | {"table": t, "_order": 0})
        out.sort(key=lambda e: (e["time"] if e["time"] is not None else 0, e.get("csn") or 0, e["_order"]))
        for e in out:
            e.pop("_order", None)
            e.pop("_seq", None)
        return out

    # -- commit history (incremental reads) ------------------------------------------------------
    def _time_versions(self) -> dict[int, float]:
        with self.state.lock:
            return dict(zip(self.state.time_csns, self.state.time_values))

    def _commits(self, table: str, lo: float, hi: float | None, by: str = "id") -> list[dict]:
        """Commits to ``table`` whose version is in (lo, hi], derived from the part records (which
        parts each CSN added and removed), the conflict history (each commit's operation kinds per
        partition) and the time versions: all of it is what the log built here, checkpoints included."""
        st = self.state
        tv = self._time_versions()
        with st.lock:
            recs = [st.parts[n] for n in st.by_table.get(table, ())]
            history = {pk: list(ev) for (t, pk), ev in st.history.items() if t == table}

        def version(csn: int) -> float | None:
            return float(csn) if by == "id" else tv.get(csn)

        def in_range(csn: int | None) -> bool:
            if csn is None:
                return False
            v = version(csn)
            return v is not None and v > lo and (hi is None or v <= hi)

        def kinds_of(pkey: str, csn: int, tid: str) -> frozenset[Kind] | None:
            ev = history.get(pkey, ())
            i = bisect.bisect_left(ev, csn, key=lambda e: e[0])
            while i < len(ev) and ev[i][0] == csn:
                if ev[i][1].tid == tid:
                    return ev[i][1].kinds
                i += 1
            return None

        commits: dict[tuple[int, str], dict] = {}

        def commit(csn: int, tid: str) -> dict:
            c = commits.get((csn, tid))
            if c is None:
                c = commits[(csn, tid)] = {"csn": csn, "tid": tid, "time_version": tv.get(csn), "added": [],
                                           "removed": [], "kinds": set(), "written_at": None}
            return c

        def compaction_only(pkey: str, csn: int, tid: str, c: dict) -> bool:
            kinds = kinds_of(pkey, csn, tid)
            if kinds:
                c["kinds"].update(k.value for k in kinds)
            return kinds is not None and kinds <= COMPACTIONS

        for rec in recs:
            pkey = rec.pkey
            if in_range(rec.creation_csn):
                c = commit(rec.creation_csn, rec.meta.creation_tid)
                if not (by == "time" and compaction_only(pkey, rec.creation_csn, rec.meta.creation_tid, c)):
                    c["added"].append(rec.meta)
                    c["written_at"] = max(c["written_at"] or 0.0, rec.meta.created_at)
            if in_range(rec.removal_csn):
                c = commit(rec.removal_csn, rec.removal_tid)
                if not (by == "time" and compaction_only(pkey, rec.removal_csn, rec.removal_tid, c)):
                    c["removed"].append(rec.meta)
        # Commits that added and removed nothing here still happened (e.g. an empty truncate).
        for pkey, ev in history.items():
            for csn, s in ev:
                if in_range(csn) and not (by == "time" and s.kinds <= COMPACTIONS):
                    commit(csn, s.tid)["kinds"].update(k.value for k in s.kinds)
        out = []
        for c in sorted(commits.values(), key=lambda c: (c["csn"], c["tid"])):
            if by == "time" and not c["added"] and not c["removed"] and c["kinds"] <= {k.value for k in COMPACTIONS}:
                continue
            c["added"].sort(key=lambda m: m.name)
            c["removed"].sort(key=lambda m: m.name)
            c["kinds"] = sorted(c["kinds"])
            out.append(c)
        return out

    def changes(self, table: str, start: Any, end: Any = None, by: str = "id", fresh: bool = False,
                lease: str = "read") -> dict:
        """Parts added and removed by the commits to ``table`` whose version is in (start, end];
        with ``lease`` (see :meth:`lease`) pinning what they read, named in the answer, when
        there are any, until the caller releases it. Nothing stays leased if this fails."""
        if by not in ("id", "time"):
            raise InvalidInput(f"by must be 'id' or 'time', not {by!r}")
        tdef = self.replica.table(table)
        self.ensure_applied_watermark()
        if by == "id":
            for what, v in (("start", start), ("end", end)):
                if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                    raise InvalidInput(f"changes by id: {what} must be a non-negative integer CSN, not {v!r}")
            if start is None:
                raise InvalidInput("changes: start is required")
            if end is None:
                end = self.state.applied
            else:
                self.replica.wait_snapshot(end)
        else:
            for what, v in (("start", start), ("end", end)):
                if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                    raise InvalidInput(f"changes by time: {what} must be a timestamp, not {v!r}")
            if start is None:
                raise InvalidInput("changes: start is required")
        if end is not None and end < start:
            raise InvalidInput(f"changes: end {end!r} is before start {start!r}")
        commits = self._commits(table, start, end, by)
        lease_id = None
        if commits:  # keeps what they read in use until the client has read it
            lease_id = self.lease(min(c["csn"] for c in commits) - 1, lease)[1]
        w = self.refresh_watermark() if fresh else self.watermark
        gone = [m for c in commits for m in c["added"] + c["removed"]
                if (r := self.state.parts.get(m.name)) is not None and r.removal_csn is not None and r.removal_csn <= w]
        if gone:
            if lease_id is not None:
                self.release(lease_id)
            raise SnapshotUnavailable(
                f"changes of {table!r} in ({start}, {end if end is not None else 'latest'}] by {by} are older than "
                f"retained: cleanup collected {len(gone)} part(s) they need (parts removed at or before CSN {w}, "
                f"e.g. {gone[0].name})", table=table, start=start, end=end, retained_from=w,
            )
        rows = []
        for c in commits:
            for m in c["removed"]:
                rows.append({"change": "delete", "csn": c["csn"], "part": m.to_dict()})
            for m in c["added"]:
                rows.append({"change": "insert", "csn": c["csn"], "part": m.to_dict()})
        return {"table": tdef.name, "by": by, "start": start, "end": end, "parts": rows, "lease": lease_id,
                "commits": [{"csn": c["csn"], "tid": c["tid"], "time_version": c["time_version"], "kinds": c["kinds"]}
                            for c in commits]}

    # -- introspection ---------------------------------------------------------------------------
    def part_notes(self) -> Callable[[Any], tuple[str | None, bool]]:
        """A function giving (why_kept, collected) for a part record, for ``client.parts``."""
        try:
            alive = self.alive()
        except Exception:  # introspection must not fail on a ZooKeeper hiccup
            alive = {self.replica.host_id: self.replica.alive_record()}
        # Only transactions and read leases are named: "awaiting gc" otherwise (a lagging replica's
        # own snapshot version holds cleanup back too, but says nothing about this part).
        holders = [h for h in self._holders(alive) if h[2] != "replica snapshot"]
        w = self.watermark

        def note(rec: Any) -> tuple[str | None, bool]:
            if rec.removal_csn is None:
                return None, False
            if rec.removal_csn <= w:
                return None, True
            for s, host, holder in holders:
                if rec.creation_csn <= s < rec.removal_csn:
                    return f"visible to snapshot {s} ({self._holder_text(host, holder, s)})", False
            return "awaiting gc", False

        return note


def _lease_id(lease_id: Any) -> str:
    if not isinstance(lease_id, str):
        raise InvalidInput(f"lease must be a lease id (a string), not {lease_id!r}")
    return lease_id
