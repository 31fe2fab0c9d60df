"""What a replica still serves: one check on every read outside a transaction.

History retention (docs/rules.md#history-retention): a part removed by a commit at time ``t`` stays in
storage until ``t + retention_seconds`` of its table (the replica-wide default when the table sets
none), and beyond that while a snapshot in use sees it. Cleanup (replicas/cleanup.py) decides
that, and writes what it may have deleted into the ``gc`` node before deleting
(coordinator/zk/watermark.py, :class:`Marks`): every replica answers "may be gone" from that node
alone, so a read is refused (SnapshotUnavailable naming the table's retention) on every replica
alike, never served with a file missing.

The state's ``pruned`` floor is cleanup's ``collected`` (every part removed at or below it is
deleted), held below every commit still inside the longest window (:meth:`Retention.window_floor`):
a replica forgets those parts' records and the history up to it (ReplicaState.prune), so a
snapshot below the floor is refused whole, and so is a ``changes`` range starting below it in a
table that existed there. That is the one notion of what is retained: the log tail's trimming
(replicas/checkpoint.py) only bounds what ZooKeeper holds, and reads never need a trimmed entry
(the state and its checkpoints carry every record in the window).

Transactions need none of this: their snapshots are in use, so nothing they see is collected or
forgotten.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from coordinator.core.errors import ReplicaUnavailable, SnapshotUnavailable
from coordinator.model.catalog import TableDef
from coordinator.zk.watermark import Marks
from parts.model.meta import PartMeta
from replicas.context import ReplicaContext, ReplicaPart

if TYPE_CHECKING:  # pragma: no cover
    pass


class Retention(ReplicaPart):
    def __init__(self, context: ReplicaContext) -> None:
        """``self.node``: the context's watched ``gc`` node (coordinator/zk/watermark.py), which
        cleanup raises."""
        super().__init__(context)
        self.node, self.poke_follower = context.watermark, context.poke_follower

    def oldest(self, table: str | None = None) -> int:
        """The oldest snapshot served whole (of ``table``: below it this replica forgot something
        of that table; without one, anything)."""
        return self.state.pruned if table is None else self.state.lost_below(table)

    def seconds(self, tdef: TableDef | None) -> float:
        """The retention window of a table definition: its own, else the replica-wide default."""
        if tdef is not None and tdef.retention_seconds is not None:
            return tdef.retention_seconds
        return float(self.config.retention_seconds)

    def table_seconds(self, table: str, at: int) -> float:
        """The window of ``table`` as defined at CSN ``at`` (or, dropped by then, as last defined)."""
        tdef = self.state.table(table, at)
        if tdef is None:
            defs = [r for r in self.state.catalog_records(table) if isinstance(r, TableDef)]
            tdef = defs[-1] if defs else None
        return self.seconds(tdef)

    def window_floor(self) -> int:
        """The last data-changing commit before the longest window of any table began: every
        snapshot and ``changes`` range in a window starts above it, so the state never forgets
        anything at or above it (its history included) while it is in a window."""
        defs = self.state.table_defs()
        longest = max((self.seconds(t) for t in defs), default=self.seconds(None))
        return self.state.csn_at_time(time.time() - longest, strict=False)

    def _window_text(self, table: str | None) -> str:
        if table is None:
            return (
                f"; replicas keep history for {self.seconds(None):g}s by default (retention_seconds; a table "
                "may set its own), and beyond that only while a snapshot is in use"
            )
        seconds = self.table_seconds(table, self.state.applied)
        return (
            f"; table {table!r} keeps history for {seconds:g}s (retention_seconds), and beyond that only "
            "while a snapshot is in use"
        )

    def ensure_applied(self) -> None:
        """A replica behind cleanup's watermark (restarted from an old WAL) would not know which
        parts are gone: catch up to it before serving a snapshot."""
        w = self.node.watermark
        if w <= self.state.applied:
            return
        self.poke_follower()
        if not self.state.wait_applied(w, self.config.read_wait_seconds) or self.state.applied < w:
            if self.state.failure is not None:
                raise self.state.failure
            raise ReplicaUnavailable(
                f"replica {self.host_id} has not applied the cleanup watermark {w} yet (applied: {self.state.applied})"
            )

    def check(
        self,
        snapshot: int,
        table: str | None = None,
        metas: Sequence[PartMeta] = (),
        fresh: bool = False,
        context: str = "",
    ) -> None:
        """SnapshotUnavailable unless ``snapshot`` is served: not below the oldest served whole,
        and none of ``metas`` (the parts visible at it) collected by cleanup (``fresh``: read
        cleanup's watermark from ZooKeeper, not the watched copy)."""
        oldest = self.oldest(table)
        if snapshot < oldest:
            raise SnapshotUnavailable(
                f"snapshot {snapshot} is older than what is retained (oldest: {oldest})"
                + (f" ({context})" if context else "")
                + self._window_text(table),
                snapshot=snapshot,
                oldest=oldest,
            )
        if not metas:
            return
        if fresh:
            self.node.refresh()
        marks = self.node.marks
        if snapshot >= marks.watermark:
            return
        gone = self.collected(metas, marks)
        if gone:
            m, removal = gone[0]
            raise SnapshotUnavailable(
                f"snapshot {snapshot} of table {table!r} is older than retained: cleanup collected parts "
                f"it sees (part {m.name}, removed at CSN {removal})" + self._window_text(table),
                snapshot=snapshot,
                table=table,
                retained_from=marks.watermark,
                retention_seconds=self.table_seconds(table, self.state.applied) if table else None,
            )

    def check_as_of(self, snapshot: int, as_of: float, table: str | None = None) -> None:
        when = datetime.fromtimestamp(float(as_of), UTC).isoformat()
        self.check(snapshot, table, context=f"the last data-changing commit at or before as_of {when}")

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
                time=when,
                now=now,
            )

    def check_changes(
        self, table: str, start: object, end: object, by: str, first: int, metas: list[PartMeta], fresh: bool = False
    ) -> None:
        """For incremental reads from ``start`` (its CSN ``first``): refused below what this
        replica forgot (changes come from the state), and when cleanup collected a part they name."""
        pruned = self.state.lost_below(table, history=True)
        if first < pruned:
            raise SnapshotUnavailable(
                f"changes of {table!r} from {start} by {by} are older than what is retained: the commits "
                f"at or below CSN {pruned} are forgotten (cleanup collected their parts)" + self._window_text(table),
                table=table,
                start=start,
                retained_from=pruned,
            )
        if fresh:
            self.node.refresh()
        gone = self.collected(metas, self.node.marks)
        if gone:
            raise SnapshotUnavailable(
                f"changes of {table!r} in ({start}, {end if end is not None else 'latest'}] by {by} are older than "
                f"retained: cleanup collected {len(gone)} part(s) they need (e.g. {gone[0][0].name}, removed at "
                f"CSN {gone[0][1]})" + self._window_text(table),
                table=table,
                start=start,
                end=end,
                retained_from=self.node.marks.watermark,
            )

    def collected(self, metas: Sequence[PartMeta], marks: Marks) -> list[tuple[PartMeta, int]]:
        """The parts among ``metas`` that cleanup may have deleted, with their removal CSN."""
        parts = self.state.parts
        out = []
        for m in metas:
            rec = parts.get(m.name)
            if rec is None or rec.removal_csn is None:
                continue
            if marks.may_be_gone(m.table, rec.removal_csn, rec.removal_time):
                out.append((m, rec.removal_csn))
        return out
