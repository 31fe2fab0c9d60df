"""What a replica measures about itself.

Counting must cost the commit path nothing it can feel: the committer keeps plain integers that
only its own thread writes (:class:`CommitStats`: conflicts by kind, a latency histogram as
bucket counts), merges and cleanup count their outcomes the same way, and everything else
(applied CSN, lag, running transactions) is read when someone asks. :class:`Stats` is one
reading of it all (``Replica.stats``); replicas/exporter.py turns it into metric families at
scrape time and serves them when the replica runs with ``--metrics-port``.

:class:`LogWatch` is what the log-tail thread sees of the log each tick (replicas/checkpoint.py):
the newest entry in ZooKeeper, how many entries it holds, the sizes of the WAL and the
checkpoints. A replica's lag is then the entries between its applied CSN and that end, and the
seconds since it first saw an entry it has not applied yet (0 when it has applied all it saw).
``info`` (and ``mergetxn status``) report both.

:func:`ready_problem` is what ``/ready`` answers (200 while the replica serves and is caught up,
503 with the reason otherwise).
"""

from __future__ import annotations

import logging
import os
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordinator.core.errors import ConflictKind
from coordinator.core.versions import csn_of, split_csn
from coordinator.zk.log import given_out
from coordinator.zk.needed import hole_message
from replicas.context import ReplicaContext, ReplicaPart

if TYPE_CHECKING:  # pragma: no cover
    pass

log = logging.getLogger(__name__)

#: Upper bounds (seconds) of the commit latency histogram's buckets; +Inf is implied.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
MAX_PENDING = 10_000  # LogWatch: log ends seen and not applied yet that it remembers
READY_MAX_LAG_SECONDS = 3.0  # /ready: how long an entry seen in the log may stay unapplied
ZK_STATES = ("CONNECTED", "SUSPENDED", "LOST")  # kazoo's KazooState values

#: Why transactions end aborted, as the ``reason`` label of ``mergetxn_transactions_aborted_total``
#: (replicas/registry.py counts them), matched against the start of the reason when none is given.
ABORT_REASONS = (
    "rolled_back",
    "killed",
    "conflict",
    "time_limit",
    "row_limit",
    "session_lost",
    "client_session_timeout",
    "fenced",
    "storage",
    "invalid",
    "failed",
    "other",
)


def abort_kind(reason: str) -> str:
    """The ``reason`` label for an abort whose caller named no kind, from its message."""
    text = reason.lower()
    for needle, kind in (
        ("killed by an operator", "killed"),
        ("time limit", "time_limit"),
        ("row limit", "row_limit"),
        ("lost its zookeeper session", "session_lost"),
        ("was fenced", "fenced"),
        ("rolled back", "rolled_back"),
    ):
        if needle in text:
            return kind
    return "other"


def ready_problem(
    serving: bool,
    zk_state: str,
    session_lost: bool,
    awake: bool,
    log_failure: object,
    lag_seconds: float,
    max_lag: float = READY_MAX_LAG_SECONDS,
    missing: list[str] | None = None,
) -> str | None:
    """Why a replica is not ready to take clients (None when it is): not serving yet, without a
    usable ZooKeeper session, standing still since a pause, a ZooKeeper node it needs missing
    or its log with holes (``missing``: what and what to do, coordinator/zk/needed.py), stopped
    at a log entry it cannot apply, or an entry it saw in the log left unapplied for more than
    ``max_lag`` seconds."""
    if not serving:
        return "not serving yet"
    if zk_state != "CONNECTED" or session_lost:
        return f"no usable ZooKeeper session ({'LOST' if session_lost else zk_state})"
    if not awake:
        return "making sure of its ZooKeeper session after standing still"
    if missing:
        return "; ".join(missing)
    if log_failure is not None:
        return f"stopped at a log entry it cannot apply: {log_failure}"
    if lag_seconds > max_lag:
        return f"catching up: an entry of the log has waited {lag_seconds:.1f}s (more than {max_lag:g}s)"
    return None


class CommitStats:
    """Counted by the committer thread only (a single writer, so no lock): failed commits,
    conflicts by :class:`ConflictKind`, and the latency of successful commits from the queue
    to the decision, as histogram bucket counts."""

    def __init__(self) -> None:
        self.conflicts: dict[str, int] = {str(k): 0 for k in ConflictKind}
        self.failed = 0  # commits that did not commit, conflicts included
        self.latency_counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0

    def failure(self, conflict_kind: Any = None, conflict: bool = False) -> None:
        self.failed += 1
        if conflict:
            kind = str(conflict_kind) if conflict_kind is not None else "UNKNOWN"
            self.conflicts[kind] = self.conflicts.get(kind, 0) + 1

    def observe(self, seconds: float) -> None:
        self.latency_counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.latency_sum += seconds


class LogWatch(ReplicaPart):
    """The log as the log-tail thread last saw it (:meth:`observe`, every tail tick); read by
    ``info`` and the metrics without any ZooKeeper request."""

    def __init__(
        self,
        context: ReplicaContext,
        wal_path: Callable[[], Path | None],
        tail: Callable[[], dict | None],
    ) -> None:
        """``wal_path`` and ``tail``: the WAL's file and the cluster checkpoint's record, as they
        are once the replica started (None before)."""
        super().__init__(context)
        self.local_checkpoint_path = Path(context.config.data_dir) / "state.ckpt"
        self.wal_path, self.tail = wal_path, tail
        self.end = 0  # CSN of the newest entry in ZooKeeper
        self.entries = 0  # entries ZooKeeper holds (every epoch not trimmed)
        self.epochs = 0
        self.observed_at: float | None = None  # wall time of the last observation
        self.wal_bytes = 0
        self.local_checkpoint_bytes = 0
        self.checkpoint: dict | None = None  # the cluster checkpoint: csn, path, bytes, time
        self._counts: dict[int, int] = {}  # entries per epoch, as last seen
        self._sealed: dict[int, tuple[int, int]] = {}  # sealed epochs (they never change): entries, last CSN
        self._pending: tuple[tuple[int, float], ...] = ()  # (end, monotonic time first seen) > applied
        self._holes: dict[int, int] = {}  # committed entries deleted, by epoch (as last seen)

    def observe(self) -> None:
        """Look at the log's end and the files (the log-tail thread; a few small requests)."""
        counts: dict[int, int] = {}
        end = 0
        for e in self.log.epochs():
            if e in self._sealed:
                counts[e], last = self._sealed[e]
            else:
                stat = self.zk.exists(self.log.epoch_path(e))
                if stat is None:
                    continue
                counts[e] = stat.numChildren
                self._holes[e] = given_out(stat) - stat.numChildren  # an epoch is trimmed whole, never thinned
                # Children are numbered from 0 in creation order; cversion also counts deletions,
                # so a deleted entry would otherwise look like one more entry not applied yet.
                last = csn_of(e, given_out(stat) - 1) if given_out(stat) > 0 else 0
                if stat.version >= 1:
                    self._sealed[e] = (counts[e], last)
            end = max(end, last)
        for e in [e for e in self._sealed if e not in counts]:
            del self._sealed[e]  # trimmed
        self._holes = {e: n for e, n in self._holes.items() if e in counts}
        applied = self.state.applied
        now = time.monotonic()
        pending = [p for p in self._pending if p[0] > applied]
        if end > applied and (not pending or end > pending[-1][0]) and len(pending) < MAX_PENDING:
            pending.append((end, now))
        self._pending = tuple(pending)
        self._counts, self.end, self.entries, self.epochs = counts, end, sum(counts.values()), len(counts)
        wal_path = self.wal_path()
        self.wal_bytes = _size(wal_path) if wal_path is not None else 0
        self.local_checkpoint_bytes = _size(self.local_checkpoint_path)
        self._look_at_checkpoint()
        self.observed_at = time.time()

    def _look_at_checkpoint(self) -> None:
        tail = self.tail()
        if not tail:
            self.checkpoint = None
            return
        if self.checkpoint is None or self.checkpoint.get("path") != tail.get("path"):
            try:
                size = self.storage.size(str(tail["path"]))
            except Exception as exc:  # noqa: BLE001 - only a number in a report
                log.debug("checkpoint size of %s: %r", tail.get("path"), exc)
                size = None
            self.checkpoint = {
                "csn": tail.get("csn"),
                "path": tail.get("path"),
                "bytes": size,
                "time": tail.get("time"),
                "retained": tail.get("retained"),
            }

    def holes(self) -> list[str]:
        """The log's epochs (not trimmed) that lost committed entries, as last seen: a sentence
        each (coordinator/zk/needed.py)."""
        tail = self.tail()
        trimmed = int(tail.get("trimmed_epoch", -1)) if tail else -1
        return [
            hole_message(self.log.epoch_path(e), n) for e, n in sorted(self._holes.items()) if n > 0 and e > trimmed
        ]

    def lag(self, applied: int) -> tuple[int, float]:
        """(entries, seconds) this replica is behind the log's end as last seen."""
        pending = self._pending
        oldest = next((t for csn, t in pending if csn > applied), None)
        seconds = 0.0 if oldest is None else max(0.0, time.monotonic() - oldest)
        return self._entries_after(applied), seconds

    def _entries_after(self, applied: int) -> int:
        end, counts = self.end, self._counts
        if end <= applied:
            return 0
        if applied <= 0:
            return sum(counts.values())
        ea, sa = split_csn(applied)
        ee, se = split_csn(end)
        if ea == ee:
            return se - sa
        return max(0, counts.get(ea, 0) - (sa + 1)) + sum(n for e, n in counts.items() if ea < e <= ee)


def _size(path: str | os.PathLike) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


@dataclass(frozen=True)
class Stats:
    """One reading of everything the replica counts: ``info`` (replicas/replica.py) and the
    Prometheus collector both report from it, so the two never count separately."""

    commits: int
    commit_batches: int
    commit_failures: int
    local_version_misses: int
    conflicts: dict[str, int]  # by kind
    latency_counts: tuple[int, ...]  # per LATENCY_BUCKETS bound, then +Inf
    latency_sum: float
    has_committer: bool
    applied_csn: int
    log_end_csn: int
    log_entries: int
    lag_entries: int
    lag_seconds: float
    running_transactions: int
    wal_bytes: int
    wal_syncs: int
    cleanup_passes: int
    cleanup_failures: int
    cleanup_files_removed: int
    merges: dict[str, int]  # by outcome
    aborted: dict[str, int]  # by reason
    inserts_held: dict[str, float]  # delayed, refused, delay_seconds (docs/rules.md#too-many-parts)
    zk_state: str
    session_lost: bool
    incarnation: int
