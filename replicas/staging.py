"""The staging rules of a running transaction: what a statement removes must be visible to it,
what it adds must be safe from cleanup and match its files, the limits of its tables and replica
bind it, and an insert into a crowded partition is delayed or refused (docs/rules.md)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from coordinator.core.conflicts import check_app_version
from coordinator.core.errors import (
    CorruptMetadata,
    InvalidInput,
    StorageError,
    TooManyParts,
    TransactionAborted,
    quote,
    storage_error,
)
from coordinator.core.readsets import Read
from coordinator.core.tabledata import check_partition_values, partition_from_key
from coordinator.model.catalog import Policy, TableDef
from coordinator.model.records import (
    Compact,
    DropTable,
    Insert,
    StagedOp,
    TxnState,
    WalStaged,
)
from parts.io.format import file_claims, part_path, part_schema
from parts.model.meta import PartMeta
from replicas.running import RunningTxn
from replicas.settings import MIN_GRACE
from replicas.txn_lifecycle import TxnLifecycle

if TYPE_CHECKING:
    from replicas.state import Keep


# Parts of at most this many bytes in all, in local storage, are checked against their files on
# the RPC I/O thread (a 10-row insert's part: about 1 KB, 0.1-0.2 ms); larger ones on a worker.
QUICK_VERIFY_BYTES = 64 << 10


def check_partition_bounds(table: TableDef, op: StagedOp, limit: int) -> None:
    """InvalidInput naming the column and ``limit`` when a partition value that ``op`` adds a
    part in, or names, is longer than ``limit`` bytes (docs/rules.md#partition-values): refused
    before anything of it is recorded, so it never reaches the WAL, the log or a znode name."""
    for meta in op.added:
        check_partition_values(table.name, table.partition_by, meta.partition, limit)
    for pkey in op.partitions or ():
        if len(pkey) <= limit:
            continue  # a key's JSON is at least as long as the UTF-8 of its values together
        try:
            values = partition_from_key(pkey)
        except CorruptMetadata as exc:
            raise InvalidInput(f"{op.kind} of {table.name!r}: {exc.message}", table=table.name) from None
        check_partition_values(table.name, table.partition_by, values, limit)


def insert_delay(count: int, delay_at: int, throw_at: int, max_delay: float) -> float | None:
    """The backpressure on an insert into a partition holding ``count`` visible parts
    (docs/rules.md#too-many-parts): None when it is refused (``throw_at`` set and reached);
    otherwise the seconds it waits first: none below ``delay_at`` (or without one), then, as
    ClickHouse's ``parts_to_delay_insert`` does, ``max_delay ** (k / span)`` in milliseconds for
    the k-th count at or past ``delay_at`` (k = 1 at ``delay_at``), ``span`` being
    ``throw_at - delay_at`` (``delay_at`` when nothing is refused): from about a millisecond
    to ``max_delay`` just below the refusal, never more than ``max_delay``. 0 turns a threshold off."""
    if throw_at and count >= throw_at:
        return None
    if not delay_at or count < delay_at or max_delay <= 0:
        return 0.0
    span = throw_at - delay_at if throw_at else delay_at
    k = count - delay_at + 1
    return min(max_delay, (max_delay * 1000) ** min(1.0, k / span) / 1000)


class Staging(TxnLifecycle):
    """Staging a statement in a running transaction, and the checks it passes first."""

    def stage(self, txn_id: str, op: StagedOp, written_here: bool = False, wait: bool = True) -> None:
        """Stage ``op`` in the running transaction ``txn_id``. The parts it adds are checked
        against their files first (:meth:`verify_claims`), unless ``written_here``: this replica
        wrote them itself (its merges and compactions), from parts it had verified. An insert
        into a crowded partition is delayed or refused first (:meth:`hold_back`); ``wait=False``
        (the RPC I/O thread, which hands an insert into a crowded partition to a worker first:
        :meth:`crowded`) never sleeps."""
        txn = self.running(txn_id)
        table = self.table(op.table, None)
        check_partition_bounds(table, op, self.config.max_partition_value_bytes)
        self._check_not_dropping(txn, op)
        if op.added:
            self._check_schema_version(txn, op, table)
        own_added, own_removed = txn.own_parts()
        own_names = {m.name for m in own_added}
        self._check_removed_visible(txn, op, own_added, own_removed, own_names)
        if not written_here:
            self.hold_back(txn, table, op, wait)  # too many parts: delayed or refused
        # Cleanup keeps the unreferenced files of a running transaction by the tid in their names;
        # a part named otherwise is kept only while younger than the grace period, so one written
        # long before it is staged could be collected before or after the commit: refuse it.
        self.check_added(table, op.added, own_names, txn.id)
        self.check_inlined(table, op)
        if op.added and not written_here:
            self.verify_claims(self.state.table(op.table, txn.snapshot) or table, op)
        self._check_not_old(txn, op)
        with txn.lock:
            if txn.state != TxnState.RUNNING:
                raise TransactionAborted(f"transaction {txn.id} is {txn.state}: {txn.reason}", id=txn.id)
            self._bind_table_limits_locked(txn, table)
            self._check_limits_locked(txn, op)
            txn.ops.append(op)
            txn.rows += 0 if isinstance(op, Compact) else op.rows
        if op.added:
            self._record_staged(txn, op)

    def _check_not_dropping(self, txn: RunningTxn, op: StagedOp) -> None:
        """Refuses ``op`` on a table ``txn`` drops, and a second drop of one it writes."""
        dropping = {o.table for o in txn.ops if isinstance(o, DropTable)}
        if op.table in dropping or (isinstance(op, DropTable) and any(o.table == op.table for o in txn.ops)):
            raise InvalidInput(
                f"transaction {txn.id} drops table {op.table!r} and cannot also write it (nor drop it twice)",
                table=op.table,
                id=txn.id,
            )

    def _check_schema_version(self, txn: RunningTxn, op: StagedOp, table: TableDef) -> None:
        """Parts are written for the definition the transaction sees (at its snapshot, or the
        latest for a table created since): one written for another is refused."""
        seen = self.state.table(op.table, txn.snapshot) or table
        stale = [m for m in op.added if m.schema_version != seen.ddl_version]
        if stale:
            raise InvalidInput(
                f"part {stale[0].name} was written for version {stale[0].schema_version} of table "
                f"{op.table!r}'s schema, transaction {txn.id} sees version {seen.ddl_version} "
                f"(columns {seen.schema.names}): write the rows for the table as the transaction sees it",
                table=op.table,
                schema_version=seen.ddl_version,
            )

    def _check_removed_visible(
        self,
        txn: RunningTxn,
        op: StagedOp,
        own_added: list[PartMeta],
        own_removed: set[str],
        own_names: set[str],
    ) -> None:
        """Refuses removing a part the transaction does not see (nor staged itself)."""
        visible = None
        for name in op.removed:
            if name in own_names:
                continue
            if visible is None:
                visible = {m.name for m in self.state.visible(op.table, txn.snapshot, txn.id, own_added, own_removed)}
            if name not in visible:
                raise InvalidInput(f"part {name} is not visible to transaction {txn.id} in table {op.table!r}")

    def _check_not_old(self, txn: RunningTxn, op: StagedOp) -> None:
        """Refuses a part written over half the cleanup grace period ago whose name does not
        carry the transaction (cleanup may take it for an orphan)."""
        old_after = max(self.config.gc_grace_seconds, MIN_GRACE) / 2
        now = time.time()
        for meta in op.added:
            if now - meta.created_at > old_after and not meta.name.startswith(txn.id + "_"):
                raise InvalidInput(
                    f"part {meta.name} was written {now - meta.created_at:.0f}s ago, more than half the cleanup "
                    f"grace period ({old_after * 2:g}s), and its name does not carry transaction {txn.id}: "
                    "cleanup may take it for an orphan. Commit parts soon after writing them, or name them "
                    "after the transaction that stages them (parts.io.format.write_part with its id)"
                )

    def _bind_table_limits_locked(self, txn: RunningTxn, table: TableDef) -> None:
        """A table with limits of its own binds the transaction from its first write there
        (unless it was begun free of them: a restore's). Under ``txn.lock``."""
        if (
            txn.table_limits
            and table.txn_max_seconds is not None
            and (txn.max_seconds is None or table.txn_max_seconds < txn.max_seconds[0])
        ):
            txn.max_seconds = (table.txn_max_seconds, table.name)
        if (
            txn.table_limits
            and table.txn_max_rows is not None
            and (txn.max_rows is None or table.txn_max_rows < txn.max_rows[0])
        ):
            txn.max_rows = (table.txn_max_rows, table.name)

    def _check_limits_locked(self, txn: RunningTxn, op: StagedOp) -> None:
        """Aborts ``txn`` (and raises) when ``op`` takes it over its row limit, or it is over its
        time limit. Under ``txn.lock``."""
        max_rows, rows_from = self.row_limit(txn)
        # A compaction rewrites rows it does not change: a keys table's limit is on what a
        # transaction writes (a keys table's 100,000 would otherwise refuse its compaction).
        if not isinstance(op, Compact) and txn.rows + op.rows > max_rows:
            if rows_from is None:
                reason = f"transaction {txn.id} exceeded its row limit of {max_rows} ({txn.rows + op.rows} rows staged)"
            else:
                reason = (
                    f"transaction {txn.id} exceeded the row limit (txn_max_rows) of table {rows_from!r}, "
                    f"{max_rows} ({txn.rows + op.rows} rows staged)"
                )
            self._abort_locked(txn, reason, [op], "row_limit")
            raise TransactionAborted(reason, id=txn.id)
        if time.monotonic() - txn.started > self.time_limit(txn)[0]:
            reason = self.time_reason(txn)
            self._abort_locked(txn, reason, [op], "time_limit")
            raise TransactionAborted(reason, id=txn.id)

    def _record_staged(self, txn: RunningTxn, op: StagedOp) -> None:
        """Records the files ``op`` added in the WAL; without the record a restart could not
        delete them, so a failure rolls the transaction back (StorageError). An op of inlined
        parts only records no path (they have no file) but is recorded all the same: a WAL that
        cannot take a record refuses the transaction here, with nothing committed, rather than
        let it commit an entry this replica could not then write to its WAL and apply."""
        paths = tuple(m.path for m in op.added if not m.inlined)  # an inlined part has no file to delete
        try:
            self.wal.append([WalStaged(txn.id, paths)], sync=False)
        except OSError as exc:
            # Without its record a restart could not delete the files: roll back now.
            err = storage_error(exc, "append", str(self.wal.path), f"the WAL of replica {self.host_id}")
            reason = (
                f"transaction {txn.id} was rolled back: replica {self.host_id} could not record its staged "
                f"parts in its WAL ({err.details['reason']}); if its WAL disk is full, free space there"
            )
            self.abort(txn, reason, "storage")
            raise StorageError(f"{reason}. {err.message}", **err.details, id=txn.id, rolled_back=True) from None

    # -- backpressure: visible parts per partition (docs/rules.md#too-many-parts) ---------------
    def parts_limits(self, table: TableDef) -> tuple[int, int]:
        """``(parts_to_delay_insert, parts_to_throw_insert)`` binding inserts into ``table``: its
        own where it sets them, else this replica's (0: never)."""
        c = self.config
        delay_at = c.parts_to_delay_insert if table.parts_to_delay_insert is None else table.parts_to_delay_insert
        throw_at = c.parts_to_throw_insert if table.parts_to_throw_insert is None else table.parts_to_throw_insert
        return delay_at, throw_at

    def crowded(self, table: TableDef, partitions: Iterable[str]) -> bool:
        """Whether an insert into these partition keys of ``table`` may be delayed or refused (a
        partition holds at least the lower threshold): the RPC I/O thread's cheap test, which
        hands such an insert to a worker (:meth:`hold_back` decides there)."""
        low = min((n for n in self.parts_limits(table) if n), default=0)
        return bool(low) and any(self.state.live_count(table.name, p) >= low for p in partitions)

    def hold_back(self, txn: RunningTxn, table: TableDef, op: StagedOp, wait: bool = True) -> None:
        """Delay or refuse an INSERT into a partition holding many visible parts (the transaction's
        own removals there not counted): TooManyParts past ``parts_to_throw_insert``, a sleep of
        :func:`insert_delay` past ``parts_to_delay_insert`` (not with ``wait=False``). Nothing else
        is held back (merges, compactions, overwrites, truncates, deletes and updates do not add
        parts to a partition), nor a restore's transaction (``table_limits=False``)."""
        if not isinstance(op, Insert) or not txn.table_limits:
            return
        partitions = {m.partition_key: m.partition for m in op.added}
        if not self.crowded(table, partitions):
            return
        delay_at, throw_at = self.parts_limits(table)
        _, removed = txn.own_parts()
        longest = 0.0
        for pkey, partition in partitions.items():
            count = self.state.live_count(table.name, pkey)
            count -= sum(
                1 for n in removed if (r := self.state.part(n)) and r.meta.table == table.name and r.pkey == pkey
            )
            delay = insert_delay(count, delay_at, throw_at, self.config.max_delay_to_insert)
            if delay is None:
                self._count_held("refused")
                raise self.too_many(table, partition, count, delay_at, throw_at)
            longest = max(longest, delay)
        if longest and wait:
            time.sleep(longest)
            self._count_held("delayed", longest)

    def too_many(self, table: TableDef, partition: tuple, count: int, delay_at: int, throw_at: int) -> TooManyParts:
        """The refusal of an insert into ``partition`` of ``table``, holding ``count`` parts."""
        own = table.parts_to_throw_insert is not None
        source = "the table's own" if own else f"the setting of replica {self.host_id}"
        return TooManyParts(
            f"too many parts: partition {quote(list(partition))} of table {quote(table.name)} holds {count} "
            f"visible parts, at or past parts_to_throw_insert={throw_at} ({source}; "
            f"parts_to_delay_insert={delay_at}): the insert was refused and nothing was changed. Insert "
            "again once merges brought the partition's parts down (client.compact(table, partitions=...) "
            "merges them now), or raise the table's parts_to_throw_insert (client.alter_table)",
            table=table.name,
            partition=list(partition),
            parts=count,
            parts_to_throw_insert=throw_at,
            parts_to_delay_insert=delay_at,
            setting_from="table" if own else "replica",
        )

    def _count_held(self, what: str, seconds: float = 0.0) -> None:
        with self._aborted_lock:
            self._held_back[what] += 1
            self._delay_seconds += seconds

    def held_back(self) -> dict[str, float]:
        """Inserts delayed and refused here, and the seconds they waited (metrics, ``info``)."""
        with self._aborted_lock:
            return {
                "delayed": self._held_back["delayed"],
                "refused": self._held_back["refused"],
                "delay_seconds": round(self._delay_seconds, 6),
            }

    def check_added(self, table: TableDef, added: tuple[PartMeta, ...], own_names: set[str], txn_id: str) -> None:
        """What a statement adds must be parts of its own (InvalidInput otherwise, nothing
        staged): each part of ``table``, its file where that table's layout puts a part of that
        name and partition (never another table's file, never a path out of the storage root
        through a link: a rollback deletes what was staged), staged once, and named by no commit
        before (a part name is committed at most once: snapshots never change)."""
        own = set(own_names)
        for meta in added:
            if meta.table != table.name:
                raise InvalidInput(
                    f"part {meta.name} belongs to table {meta.table!r}, not {table.name!r}",
                    part=meta.name,
                    table=table.name,
                )
            want = part_path(table.name, list(table.partition_by), meta.partition, meta.name)
            if meta.path != want:
                raise InvalidInput(
                    f"part {meta.name} of table {table.name!r} names the file {meta.path!r}; a part of "
                    f"that name and partition is the file {want!r}",
                    part=meta.name,
                    table=table.name,
                )
            if meta.name in own:
                raise InvalidInput(f"part {meta.name} is staged twice by transaction {txn_id}", part=meta.name)
            own.add(meta.name)
            rec = self.state.parts.get(meta.name)
            if rec is not None:
                raise InvalidInput(
                    f"part {meta.name} of table {rec.meta.table!r} was committed at CSN {rec.creation_csn} (by "
                    f"{rec.meta.creation_tid}): a part is committed at most once; nothing was changed",
                    part=meta.name,
                    table=rec.meta.table,
                    csn=rec.creation_csn,
                )
            if not self.storage.contained(meta.path):
                raise InvalidInput(
                    f"part {meta.name}'s file {meta.path!r} leads out of the storage root through a symbolic link",
                    part=meta.name,
                    table=table.name,
                )

    def verify_claims(self, table: TableDef, op: StagedOp) -> None:
        """Every part ``op`` adds is what its metadata says (parts.io.format.file_claims: size,
        checksum, rows, columns, statistics, partition, key summary), its file read once here, on
        the caller's thread and under no lock another transaction waits on; InvalidInput naming
        the part and the field otherwise, with nothing staged and the file left where it is."""
        pk = table.primary_key if table.conflict_policy is Policy.KEYS else ()
        expected = part_schema(table.schema, pk, folded=isinstance(op, Compact))
        for meta in op.added:
            if meta.inline is not None:  # an inlined part: its bytes are in its metadata, checked alike
                self._refuse_claim(table, meta, file_claims(meta.inline, meta, expected, table.partition_by, pk))
                continue
            try:
                # One request for at most a byte more than claimed: a larger file is refused unread.
                (raw,) = self.storage.get_ranges(meta.path, [(0, meta.size + 1)])
            except FileNotFoundError:
                raise InvalidInput(
                    f"part {meta.name} of table {table.name!r}: its metadata's path {meta.path!r} names no file "
                    "in storage; write the file before committing it",
                    part=meta.name,
                    table=table.name,
                    field="path",
                ) from None
            except OSError as exc:
                raise storage_error(exc, "get", meta.path, f"part {meta.name}") from None
            wrong = (
                ("size", f"says {meta.size} bytes, the file has {'more' if len(raw) > meta.size else len(raw)}")
                if len(raw) != meta.size
                else file_claims(raw, meta, expected, table.partition_by, pk)
            )
            self._refuse_claim(table, meta, wrong)

    @staticmethod
    def _refuse_claim(table: TableDef, meta: PartMeta, wrong: tuple[str, str] | None) -> None:
        """InvalidInput naming the part, the table and the claim its bytes refute (``wrong``)."""
        if wrong is None:
            return
        field, why = wrong
        where = "inlined content" if meta.inlined else "file"
        raise InvalidInput(
            f"part {meta.name} of table {table.name!r}: its metadata's {field} {why}; refused, nothing "
            f"was committed and the {where} is left as it is (parts.io.format.write_part records what a "
            "part holds)",
            part=meta.name,
            table=table.name,
            field=field,
        )

    def check_inlined(self, table: TableDef, op: StagedOp) -> None:
        """An inlined part (docs/architecture/small-writes.md) is taken only in an insert into a
        table that takes inlined parts, and within its thresholds (the table's ``inline_rows`` and
        ``inline_bytes``, else the replica's); InvalidInput naming the part, the table and the
        setting otherwise, nothing staged. Merges and compactions never inline. A part naming
        ``spilled`` (PartMeta: a flushed part's bytes in its flush's bundle) is never taken."""
        rows, size = table.inline_limits(self.config.inline_rows, self.config.inline_bytes)
        for meta in op.added:
            if meta.spilled is not None:
                raise InvalidInput(
                    f"part {meta.name} of table {table.name!r} refused: its metadata names 'spilled' (where a "
                    "replica's flush stored a removed inlined part's bytes), which only applying that flush sets; "
                    "nothing was committed. Send the part with its bytes inlined, or as a file in storage",
                    part=meta.name,
                    table=table.name,
                    field="spilled",
                )
            if meta.inline is None:
                continue
            setting, why = None, ""
            if op.kind != "insert" or rows == 0:
                setting = "inline_rows"
                why = (
                    f"a {op.kind} takes no inlined part (only an insert does)"
                    if op.kind != "insert"
                    else "the table takes no inlined parts (a keys table, or inline_rows or inline_bytes 0)"
                )
            elif meta.rows > rows:
                setting, why = "inline_rows", f"it holds {meta.rows} rows, inline_rows is {rows}"
            elif meta.size > size:
                setting, why = "inline_bytes", f"it holds {meta.size} bytes, inline_bytes is {size}"
            if setting is not None:
                raise InvalidInput(
                    f"inlined part {meta.name} of table {table.name!r} refused: {why}; nothing was committed. "
                    f"Write it as a file in storage, or raise the table's or the replica's {setting}",
                    part=meta.name,
                    table=table.name,
                    setting=setting,
                )

    def verifies_quickly(self, added: object) -> bool:
        """Whether checking the parts of a ``commit_parts`` or ``stage`` request against their
        files (:meth:`verify_claims`) is quick enough for the RPC I/O thread: local storage and at
        most :data:`QUICK_VERIFY_BYTES` claimed (a file of another size is refused unread)."""
        if not self.storage.is_local or not isinstance(added, list):
            return False
        total = sum(m["size"] for m in added if isinstance(m, dict) and isinstance(m.get("size"), int))
        return total <= QUICK_VERIFY_BYTES

    def set_app_version(self, txn_id: str, app_id: object, version: object) -> None:
        """Record in the transaction that application ``app_id`` reached ``version``
        (docs/rules.md#idempotent-commits): its commit loses with DuplicateCommit if that application
        has a version at or above it committed by then. Set again for the same application in
        one transaction, the last version set counts."""
        app_id, version = check_app_version(app_id, version)
        txn = self.running(txn_id)
        with txn.lock:
            if txn.state != TxnState.RUNNING:
                raise TransactionAborted(f"transaction {txn.id} is {txn.state}: {txn.reason}", id=txn.id)
            txn.apps[app_id] = version

    def add_read(self, txn_id: str, read: object) -> None:
        """Record a read of a serializable transaction (coordinator/core/readsets.py): at commit, if it
        wrote something, a commit after its snapshot that changed what this read returned or
        could have returned fails it. The same read recorded twice counts once."""
        r = Read.from_dict(read)
        txn = self.running(txn_id)
        with txn.lock:
            if txn.state != TxnState.RUNNING:
                raise TransactionAborted(f"transaction {txn.id} is {txn.state}: {txn.reason}", id=txn.id)
            if r not in txn.reads:
                txn.reads.append(r)

    def app_version(self, app_id: object) -> dict:
        """The highest version of ``app_id`` committed, as far as this replica applied the log
        (``{"version": None, "csn": None}`` if none): a lagging replica may answer lower, never
        higher, and a commit is decided against the log's end whatever it answered."""
        app_id, _ = check_app_version(app_id, 0)
        held = self.state.app_version(app_id)
        return {
            "version": None if held is None else held[0],
            "csn": None if held is None else held[1],
            "applied": self.state.applied,
        }

    def visible_parts(
        self, table: str, txn_id: str, pkeys: list[str] | None = None, keep: Keep | None = None
    ) -> tuple[int, list[PartMeta]]:
        """Parts visible to a transaction: at its snapshot, with its own writes (only those
        ``keep`` keeps: a point read's probe, ReplicaState.visible). One begun with
        atomicity "none" reads the latest applied state instead (non-atomic
        transactions read the most recently written data: docs/rules.md#atomicity-and-durability); its snapshot, older, keeps cleanup
        away from every part visible at any later CSN while it runs."""
        txn = self.running(txn_id)
        snapshot = self.state.applied if txn.latest_reads else txn.snapshot
        if self.state.table(table, snapshot) is None:  # as it sees it: dropped since is still there
            self.table(table, None)
        added, removed = txn.own_parts()
        return snapshot, self.state.visible(table, snapshot, txn.id, added, removed, pkeys, keep)

    def removed_any(self, table: str, txn_id: str) -> bool:
        """Whether transaction ``txn_id`` removed a committed part of ``table`` (an overwrite, a
        delete that dropped parts): its view of the table is then not the snapshot's parts plus
        its own, and the snapshot's deletion vectors do not answer for it (a removed part the
        state has forgotten counts as one of ``table``)."""
        _, removed = self.running(txn_id).own_parts()
        records = [self.state.part(n) for n in removed]
        return any(r is None or r.meta.table == table for r in records)
