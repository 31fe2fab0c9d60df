"""A replica's snapshots and tables as its clients read them: wait for a snapshot to be applied,
catch up with the log, resolve ``snapshot``/``as_of``, look a table up (waiting for one created
through another replica), describe it, and list the parts a read sees (leased meanwhile)."""

from __future__ import annotations

import errno
import json

from kazoo.exceptions import NoNodeError

from coordinator.core.errors import (
    InvalidInput,
    ReplicaUnavailable,
    SnapshotUnavailable,
    TableNotFound,
    quote,
)
from coordinator.core.versions import split_csn
from coordinator.model.catalog import INLINE_OPTIONS, PARTS_OPTIONS, TableDef, TableDropped
from coordinator.zk.log import table_node_dropped
from parts.model.meta import PartMeta
from replicas.replica_fields import ReplicaFields


class SnapshotReads(ReplicaFields):
    """Reads at a snapshot: the snapshot and table methods of ``Replica``."""

    # -- snapshots ---------------------------------------------------------------------------
    def snapshot(self) -> int:
        return self.state.applied

    def wait_snapshot(self, csn: int) -> None:
        """Block until ``csn`` is applied here (bounded), or raise a clear error."""
        if not isinstance(csn, int) or isinstance(csn, bool) or csn < 0:
            raise InvalidInput(f"snapshot must be a non-negative integer CSN, not {quote(csn)}")
        if csn <= self.state.applied:
            return  # a snapshot already applied needs nothing more, even if later entries fail
        if self.state.failure is not None:
            # The log did not apply last time: look again now (an operator may have repaired
            # the node); this raises CorruptMetadata naming the node while it still does not parse.
            self.started_follower.pull()
            self.state.clear_failure()
            if csn <= self.state.applied:
                return
        epoch, seq = split_csn(csn)
        if self.log.fetch(epoch, seq) is None and self._synced_fetch(epoch, seq) is None:
            raise SnapshotUnavailable(
                f"snapshot {csn} is newer than the log (latest applied here: {self.state.applied})",
                snapshot=csn,
                latest=self.state.applied,
            )
        self.started_follower.poke()
        if not self.state.wait_applied(csn, self.config.read_wait_seconds) or self.state.applied < csn:
            if self.state.failure is not None:
                raise self.state.failure
            raise ReplicaUnavailable(
                f"replica {self.host_id} did not apply snapshot {csn} within {self.config.read_wait_seconds:g}s "
                f"(applied: {self.state.applied})"
            )

    def catch_up(self) -> None:
        """Apply everything committed up to now before deciding (cleanup's orphan fence relies on
        it: every commit that happened before the fence moved must be seen). A pull alone is not
        enough: it stops where this replica's own commit is in flight, and entries of other
        replicas may lie beyond; so wait until the last entry ZooKeeper holds now is applied."""
        self.zk.sync(self.log.log_path())
        try:
            self.started_follower.pull()
        except OSError as exc:  # its WAL's disk full or read-only, storage erring: ask another replica
            raise ReplicaUnavailable(
                f"replica {self.host_id} cannot apply the log now (applied: CSN {self.state.applied}): "
                f"{exc.strerror or exc}; another replica can answer",
                errno=errno.errorcode.get(exc.errno or 0, str(exc.errno)),
            ) from None
        end = self.log.last_csn()
        if not self.state.wait_applied(end, self.config.read_wait_seconds) and self.state.failure is None:
            raise ReplicaUnavailable(
                f"replica {self.host_id} did not apply the log up to CSN {end} "
                f"in {self.config.read_wait_seconds:g}s (applied: {self.state.applied})"
            )
        if self.state.failure is not None:
            raise self.state.failure

    def _synced_fetch(self, epoch: int, seq: int) -> bytes | None:
        """Fetch an entry after a ``sync``: the ZooKeeper member this session talks to may lag
        the leader (an ensemble), so a commit made through another member can look missing."""
        self.zk.sync(self.log.log_path())
        return self.log.fetch(epoch, seq)

    def resolve_snapshot(self, snapshot: int | None, as_of: float | None, table: str | None = None) -> int:
        if snapshot is not None and as_of is not None:
            raise InvalidInput("give either snapshot or as_of, not both")
        if as_of is not None:
            if isinstance(as_of, bool) or not isinstance(as_of, (int, float)):
                raise InvalidInput(f"as_of must be a timestamp, not {quote(as_of)}")
            self.retention.check_not_future(float(as_of), "as_of")
            snap = self.state.csn_at_time(float(as_of))
            self.retention.check_as_of(snap, as_of, table)
            return snap
        if snapshot is None:
            return self.state.applied
        if isinstance(snapshot, int):
            self.retention.check(snapshot, table)  # refused below what is retained
        self.wait_snapshot(snapshot)
        return snapshot

    # -- tables ------------------------------------------------------------------------------
    def table(self, name: str, snapshot: int | None = None) -> TableDef:
        if not isinstance(name, str):
            raise InvalidInput(f"table name must be a string, not {type(name).__name__}")
        t = self.state.table(name, snapshot)
        if t is None:
            from coordinator.core.tabledata import validate_name

            validate_name("table", name)
            if self.state.table(name) is None and self._table_node_live(name):
                # Created through another replica and not applied here yet: wait for the follower
                # to apply it, so that a table that exists is never reported unknown. (Not a
                # pull() of our own: that runs for as long as commits keep coming.)
                if self.state.failure is not None:
                    # The log stopped at an entry that does not parse: look again now; this
                    # raises CorruptMetadata naming the node while it still does not parse.
                    self.started_follower.pull()
                    self.state.clear_failure()
                self.started_follower.poke()
                self.state.wait_until(
                    lambda: self.state.table(name) is not None or self.state.failure is not None,
                    self.config.read_wait_seconds,
                )
                t = self.state.table(name, snapshot)
            if t is None:
                created = self.state.table(name)
                if created is not None:
                    raise TableNotFound(
                        f"table {quote(name)} does not exist at snapshot {snapshot} "
                        f"(created at CSN {created.created_csn})",
                        table=name,
                    )
                rec = self.state.record(name, snapshot)
                if isinstance(rec, TableDropped):
                    raise TableNotFound(
                        f"table {quote(name)} was dropped at CSN {rec.csn} (by {rec.tid})",
                        table=name,
                        dropped_csn=rec.csn,
                    )
                raise TableNotFound(f"unknown table {quote(name)}", table=name)
        return t

    def _table_node_live(self, name: str) -> bool:
        """Whether ZooKeeper holds table ``name`` as existing (created, maybe not applied here)."""
        try:
            data, _ = self.zk.get(self.log.table_path(name))
        except NoNodeError:
            return False
        return not table_node_dropped(data)

    def create_table(self, tdef: TableDef) -> int:
        return self.started_committer.create_table(tdef)

    def alter_table(self, name: str, add_columns: object, rename_columns: object, options: object = None) -> int:
        """ALTER TABLE; ``options``: new values of the table's options (catalog.ALTERABLE)."""
        self.table(name)  # TableNotFound first, as every statement says it
        return self.started_committer.alter_table(name, add_columns, rename_columns, options)

    def describe_table(self, name: str, snapshot: int | None = None) -> dict:
        """A table's definition at a snapshot (the latest by default) with what it holds then."""
        snap = self.state.applied if snapshot is None else self.resolve_snapshot(snapshot, None, name)
        tdef = self.table(name, snap)
        metas = self.state.visible(name, snap)
        records = [r for r in self.state.catalog_records(name) if r.csn >= tdef.created_csn and r.csn <= snap]
        return {
            **tdef.to_dict(),
            "retention_seconds": self.retention.seconds(tdef),
            "retention_default": tdef.retention_seconds is None,
            **dict(zip(PARTS_OPTIONS, self.transactions.parts_limits(tdef))),
            # the inline thresholds in force ((0, 0): this table's inserts are never inlined)
            **dict(zip(INLINE_OPTIONS, tdef.inline_limits(self.config.inline_rows, self.config.inline_bytes))),
            "inlined_parts": sum(m.inlined for m in metas),
            "snapshot": snap,
            "schema_version": tdef.ddl_version,
            "parts": len(metas),
            "rows": sum(m.rows for m in metas),
            "bytes": sum(m.size for m in metas),
            "partitions": len({m.partition_key for m in metas}),
            "history": [
                {
                    "csn": r.csn,
                    "ddl_version": r.ddl_version,
                    "what": "created" if r.csn == tdef.created_csn else "altered",
                }
                for r in records
            ],
        }

    def read_parts(
        self,
        table: str,
        snapshot: int | None = None,
        as_of: float | None = None,
        pkeys: list[str] | None = None,
        fresh: bool = False,
        lease: str = "read",
        owner: str | None = None,
    ) -> tuple[int, list[PartMeta], str | None]:
        """Parts visible at a snapshot (the latest by default), for a read outside a transaction:
        the snapshot is leased (``lease``: "read", "spark" or "none"; see replicas/leases.py)
        until the reader releases the lease id returned, or it lapses. SnapshotUnavailable if
        cleanup took a part it needs (``fresh``: read the cleanup watermark from ZooKeeper, not
        the watched copy); nothing stays leased when this fails. ``owner``: the user reading
        (its lease counts against its quota)."""
        if snapshot is None and as_of is None:
            self.table(table)  # catches up first if the table was just created elsewhere
        self.retention.ensure_applied()
        if snapshot is None and as_of is None:
            snap, lease_id = self.leases.lease(None, lease, owner)
        else:
            snap, lease_id = self.leases.lease(self.resolve_snapshot(snapshot, as_of, table), lease, owner)
        try:
            self.table(table, snap)
            metas = self.state.visible(table, snap, pkeys=pkeys)
            self.retention.check(snap, table, metas, fresh)
        except BaseException:
            if lease_id is not None:
                self.leases.release(lease_id)
            raise
        return snap, metas, lease_id

    # -- introspection -----------------------------------------------------------------------
    def part_records(self, table: str) -> list[dict]:
        self.table(table)
        note = self.cleanup.part_notes()  # why a removed part is still in storage
        latest, recs = self.state.listing(table)
        out = []
        for rec in recs:
            out.append(
                {
                    "name": rec.meta.name,
                    "partition": json.dumps(list(rec.meta.partition)),
                    "path": rec.meta.path,
                    "rows": rec.meta.rows,
                    "size": rec.meta.size,
                    "inlined": rec.meta.inlined,
                    # content the record itself holds (an inlined part's until its flush), and
                    # the bundle a flush moved it to (PartMeta.spilled)
                    "held_bytes": 0 if rec.meta.inline is None else len(rec.meta.inline),
                    "bundle": None if rec.meta.spilled is None else rec.meta.spilled[0],
                    "creation_tid": rec.meta.creation_tid,
                    "creation_csn": rec.creation_csn,
                    "removal_tid": rec.removal_tid,
                    "removal_csn": rec.removal_csn,
                    "visible": rec.removal_csn is None or rec.removal_csn > latest,
                    **dict(zip(("why_kept", "collected"), note(rec))),
                }
            )
        return out
