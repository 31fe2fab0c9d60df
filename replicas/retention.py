"""What a replica still serves: one check on every read outside a transaction.

Three numbers decide it, each raised by what the cluster did and never lowered:

* the log tail's ``retained`` (replicas/checkpoint.py): snapshots below it are refused whole (the
  time-travel window: the newest ``retain_entries`` log entries);
* cleanup's ``watermark`` (replicas/cleanup.py): parts removed at or below it may be gone from
  storage, so a snapshot that sees one is refused, while older snapshots that see only kept parts
  stay readable (SPEC: cleanup deletes a removed part as soon as no snapshot in use sees it);
* the state's ``pruned`` floor, derived from both (``min(retained, collected)``): what this
  replica has forgotten (ReplicaState.prune); never above ``retained``.

Transactions need none of this: their snapshots are in use, so nothing they see is collected or
forgotten.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from coordinator.errors import ReplicaUnavailable, SnapshotUnavailable
from parts.meta import PartMeta

if TYPE_CHECKING:  # pragma: no cover
    from replicas.replica import Replica


class Retention:
    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.state = replica.state

    def oldest(self) -> int:
        """The oldest snapshot served whole."""
        tail = self.replica.tail
        return max(tail.retained if tail is not None else 0, self.state.pruned)

    def ensure_applied(self) -> None:
        """A replica behind cleanup's watermark (restarted from an old WAL) would not know which
        parts are gone: catch up to it before serving a snapshot."""
        w = self.replica.cleanup.watermark
        if w <= self.state.applied:
            return
        self.replica.follower.poke()
        if not self.state.wait_applied(w, self.replica.config.read_wait_seconds) or self.state.applied < w:
            if self.state.failure is not None:
                raise self.state.failure
            raise ReplicaUnavailable(f"replica {self.replica.host_id} has not applied the cleanup watermark "
                                     f"{w} yet (applied: {self.state.applied})")

    def check(self, snapshot: int, table: str | None = None, metas: list[PartMeta] = (),
              fresh: bool = False, context: str = "") -> None:
        """SnapshotUnavailable unless ``snapshot`` is served: not below the oldest served whole,
        and none of ``metas`` (the parts visible at it) collected by cleanup (``fresh``: read
        cleanup's watermark from ZooKeeper, not the watched copy)."""
        oldest = self.oldest()
        if snapshot < oldest:
            raise SnapshotUnavailable(
                f"snapshot {snapshot} is older than what is retained (oldest: {oldest})"
                + (f" ({context})" if context else ""),
                snapshot=snapshot, oldest=oldest,
            )
        if not metas:
            return
        cleanup = self.replica.cleanup
        w = cleanup.refresh_watermark() if fresh else cleanup.watermark
        if snapshot >= w:
            return
        gone = self.collected(metas, w)
        if gone:
            m, removal = gone[0]
            raise SnapshotUnavailable(
                f"snapshot {snapshot} of table {table!r} is older than retained: cleanup collected parts "
                f"removed at or before CSN {w} (part {m.name}, removed at CSN {removal})",
                snapshot=snapshot, table=table, retained_from=w,
            )

    def check_as_of(self, snapshot: int, as_of: float) -> None:
        when = datetime.fromtimestamp(float(as_of), UTC).isoformat()
        self.check(snapshot, context=f"the last data-changing commit at or before as_of {when}")

    @staticmethod
    def check_not_future(when: float, what: str) -> None:
        """A time in the future names no snapshot yet: a read "as of" it now would return the
        latest data and a later one other data (not repeatable). Refused, as a CSN beyond the
        log is."""
        now = time.time()
        if when > now:
            at = datetime.fromtimestamp(float(when), UTC).isoformat()
            raise SnapshotUnavailable(
                f"{what} {at} is in the future (the replica's clock reads "
                f"{datetime.fromtimestamp(now, UTC).isoformat()}): no snapshot exists for it yet",
                time=when, now=now)

    def check_changes(self, table: str, start: object, end: object, by: str, first: int,
                      metas: list[PartMeta], fresh: bool = False) -> None:
        """For incremental reads from ``start`` (its CSN ``first``): refused below what this
        replica forgot (changes come from the state), and when cleanup collected a part they name."""
        pruned = self.state.pruned
        if first < pruned:
            raise SnapshotUnavailable(
                f"changes of {table!r} from {start} by {by} are older than what is retained: the commits "
                f"at or below CSN {pruned} are forgotten (the log is trimmed and cleanup "
                "collected their parts)", table=table, start=start, retained_from=pruned)
        cleanup = self.replica.cleanup
        w = cleanup.refresh_watermark() if fresh else cleanup.watermark
        gone = self.collected(metas, w)
        if gone:
            raise SnapshotUnavailable(
                f"changes of {table!r} in ({start}, {end if end is not None else 'latest'}] by {by} are older than "
                f"retained: cleanup collected {len(gone)} part(s) they need (parts removed at or before CSN {w}, "
                f"e.g. {gone[0][0].name})", table=table, start=start, end=end, retained_from=w,
            )

    def collected(self, metas: list[PartMeta], watermark: int) -> list[tuple[PartMeta, int]]:
        """The parts among ``metas`` removed at or below ``watermark``, with their removal CSN."""
        parts = self.state.parts
        out = []
        for m in metas:
            rec = parts.get(m.name)
            if rec is not None and rec.removal_csn is not None and rec.removal_csn <= watermark:
                out.append((m, rec.removal_csn))
        return out
