"""The running transactions of one replica: begin, lookup, staging rules, commit, rollback.

A transaction lives in memory only, from ``begin`` (its snapshot is the replica's applied CSN
and its tid is unique across restarts, see :mod:`coordinator.core.versions`) until it commits, rolls
back, is killed or passes a limit (``txn_max_seconds``, ``txn_max_rows``). Staging checks what a
statement removes is visible to the transaction and what it adds is safe from cleanup; the parts
an aborted transaction wrote are deleted at once. Commits go to the replica's group committer
(replicas/committer.py). The one-call commit of parts already in storage (``commit_parts``) and
the outcome lookups (``commit_status``, ``part_status``) are here too.

``_txn_lock`` orders begin and retire among writers (lookups need no lock), and is the lock under
which the snapshots in use are computed for the alive node (replicas/leases.py, through
:meth:`Transactions.begins_held`), so a published value never exceeds the snapshot of a
transaction that began.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import fields
from typing import TYPE_CHECKING

from coordinator.core.conflicts import check_app_version
from coordinator.core.errors import (
    CorruptMetadata,
    InvalidInput,
    QuotaExceeded,
    ReplicaUnavailable,
    StorageError,
    TooManyParts,
    TransactionAborted,
    TransactionNotFound,
    quote,
    storage_error,
)
from coordinator.core.readsets import Read
from coordinator.core.tabledata import check_partition_values, partition_from_key, partition_key
from coordinator.core.versions import Tid, local_counter
from coordinator.model.atomicity import FULL, SYNC, check_modes, check_session, mismatch
from coordinator.model.catalog import Policy, TableDef
from coordinator.model.records import (
    CommitStatus,
    Compact,
    DropTable,
    Insert,
    StagedOp,
    TxnState,
    WalStaged,
    op_from_dict,
)
from parts.io.format import delete_part, file_claims, part_path, part_schema
from parts.model.meta import PartMeta
from replicas.cleanup import MIN_GRACE
from replicas.metrics import abort_kind
from replicas.running import RunningTxn
from replicas.sessions import Sessions, check_session_id

if TYPE_CHECKING:
    from coordinator.core.grants import Grantee
    from coordinator.zk.watermark import Watermark
    from parts.io.storage import Storage
    from replicas.async_commits import AsyncCommits
    from replicas.committer import Committer
    from replicas.settings import ReplicaConfig
    from replicas.state import ReplicaState
    from replicas.wal import Wal
    from replicas.zksession import ZkSession

log = logging.getLogger(__name__)

# A client sends a token with each begin; a begin sent again with it (its answer was lost) gets
# the transaction the first one began, for this long after it, among this many recent tokens.
BEGIN_TOKEN_SECONDS = 60.0
BEGIN_TOKENS_MAX = 100_000
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


class Transactions:
    """The transaction registry of one replica (``replica.transactions``)."""

    def __init__(
        self,
        config: ReplicaConfig,
        state: ReplicaState,
        storage: Storage,
        zk_session: ZkSession,
        table: Callable[..., TableDef],
        watermark: Watermark,
        async_commits: AsyncCommits,
        incarnation: Callable[[], int],
        ensure_applied: Callable[[], None],
        on_begin: Callable[[RunningTxn], None],
        on_end: Callable[[RunningTxn], None],
        outcome: Callable[[str, bool], CommitStatus],
        committer: Callable[[], Committer | None],
        wal: Callable[[], Wal | None],
    ) -> None:
        """``table``: the table lookup (waits for a table created elsewhere); ``watermark``: the
        ``gc`` node (a snapshot is served only at or above it); ``incarnation``: this replica's
        now; ``ensure_applied``: catch up to cleanup's watermark before serving a snapshot;
        ``on_begin``/``on_end``: the history's event hooks; ``outcome``: any transaction's
        outcome (tid, forward); ``committer`` and ``wal``: as they are once the replica started.
        The late-bound ones are callables: those satellites are made after the registry, or at
        start."""
        self.config, self.state, self.storage, self.zk_session, self.table = config, state, storage, zk_session, table
        self.host_id = config.host_id
        self.watermark, self.async_commits, self.incarnation = watermark, async_commits, incarnation
        self.ensure_applied, self.on_begin, self.on_end, self.outcome = ensure_applied, on_begin, on_end, outcome
        self._committer, self._wal = committer, wal
        self.txns: dict[str, RunningTxn] = {}
        self.finished: dict[str, RunningTxn] = {}
        self._parts_calls: dict[str, int] = {}  # first part name of one-call commits on workers
        self._txn_lock = threading.Lock()
        self._begun: OrderedDict[str, tuple[float, RunningTxn]] = OrderedDict()  # begin token -> txn
        self._counter = itertools.count()
        self.sessions = Sessions(self.config.client_session_timeout)  # replicas/sessions.py
        self._aborted: Counter[str] = Counter()  # ended aborted, by reason kind (replicas/metrics.py)
        self._aborted_lock = threading.Lock()
        # Inserts held back by the parts per partition (docs/rules.md#too-many-parts), counted
        # under the same lock: "delayed" and "refused", and the seconds waited ("delay_seconds").
        self._held_back: Counter[str] = Counter()
        self._delay_seconds = 0.0

    @property
    def wal(self) -> Wal:
        """The replica's WAL (opened when it starts), where staged parts are recorded."""
        wal = self._wal()
        assert wal is not None
        return wal

    @property
    def committer(self) -> Committer:
        """The replica's group committer (made when it starts)."""
        committer = self._committer()
        assert committer is not None
        return committer

    # -- begin, lookup, staging, commit ------------------------------------------------------
    def begin(
        self,
        token: str | None = None,
        atomicity: object = FULL,
        durability: object = SYNC,
        session: object = None,
        owner: str | None = None,
        table_limits: bool = True,
    ) -> RunningTxn:
        """A new transaction; with ``token`` (a client's name for this begin), a begin sent again
        with the same token gets the transaction the first one began instead of another.
        ``atomicity``/``durability`` (coordinator/model/atomicity.py; ``session`` names the client
        whose ``flush`` waits for an async commit). ``owner``: the user beginning it (secured
        clusters), who may hold at most ``user_max_transactions`` running ones here.
        ``table_limits=False``: the tables' own limits do not bind it, the replica's still do (a restore's)."""
        if token is not None and (not isinstance(token, str) or not 0 < len(token) <= 128):
            raise InvalidInput(f"begin token must be a string of 1 to 128 characters, not {token!r}")
        atomicity, durability = check_modes(atomicity, durability)
        session = check_session(session, durability)
        if session is not None:  # a sync transaction's session holds it (replicas/sessions.py)
            session = check_session_id(session)
        # A short disconnection (a ZooKeeper member failing over) must not fail clients: wait
        # for the session to come back, at most as long as the session could still be alive.
        if not self.zk_session.wait_usable(self.config.session_timeout):
            raise ReplicaUnavailable(f"replica {self.host_id} is not connected to ZooKeeper")
        self.ensure_applied()  # never a snapshot whose parts cleanup took
        with self._txn_lock:  # with the snapshot: refresh_alive never misses a new transaction's
            now = time.monotonic()
            while self._begun and (
                len(self._begun) >= BEGIN_TOKENS_MAX or next(iter(self._begun.values()))[0] < now - BEGIN_TOKEN_SECONDS
            ):
                self._begun.popitem(last=False)
            if token is not None and owner is not None:
                token = f"{owner}\0{token}"  # a token names a begin of its own user only
            if token is not None and token in self._begun:
                return self._begun[token][1]
            if owner is not None:
                self._check_quota(owner)
            tid = Tid(self.state.applied, local_counter(self.incarnation(), next(self._counter)), self.host_id)
            txn = RunningTxn(
                tid=tid,
                snapshot=tid.start_csn,
                atomicity=atomicity,
                durability=durability,
                session=session,
                owner=owner,
                table_limits=table_limits,
            )
            self.txns[txn.id] = txn
            if session is not None:
                self.sessions.began((owner, session), now)
            if token is not None:
                self._begun[token] = (now, txn)
        self.on_begin(txn)
        return txn

    def _check_quota(self, owner: str) -> None:
        """QuotaExceeded when ``owner`` holds ``user_max_transactions`` running transactions here
        (called under the transaction lock, so that concurrent begins cannot both pass)."""
        limit = self.config.user_max_transactions
        if sum(1 for t in self.txns.values() if t.owner == owner) >= limit:
            raise QuotaExceeded(
                f"user {owner!r} holds {limit} running transactions on replica {self.host_id}, its quota "
                f"(user_max_transactions={limit}): commit or roll back one first",
                user=owner,
                quota="user_max_transactions",
                value=limit,
            )

    def txn(self, txn_id: str) -> RunningTxn:
        # Lookups need no lock (each is atomic); the lock orders begin and retire among writers.
        txn = self.txns.get(txn_id) or self.finished.get(txn_id)
        if txn is None:
            raise TransactionAborted(f"transaction {txn_id} is not running on replica {self.host_id}", id=txn_id)
        return txn

    def running(self, txn_id: str) -> RunningTxn:
        txn = self.txn(txn_id)
        if txn.state != TxnState.RUNNING:
            raise TransactionAborted(
                f"transaction {txn_id} is {txn.state}" + (f": {txn.reason}" if txn.reason else ""), id=txn_id
            )
        if time.monotonic() - txn.started > self.time_limit(txn)[0]:
            self.abort(txn, self.time_reason(txn))
            raise TransactionAborted(txn.reason, id=txn_id)
        return txn

    def time_limit(self, txn: RunningTxn) -> tuple[float, str | None]:
        """The time limit binding ``txn``: the smallest among its tables' and the replica's."""
        if txn.max_seconds is not None and txn.max_seconds[0] < self.config.txn_max_seconds:
            return txn.max_seconds
        return self.config.txn_max_seconds, None

    def row_limit(self, txn: RunningTxn) -> tuple[int, str | None]:
        if txn.max_rows is not None and txn.max_rows[0] < self.config.txn_max_rows:
            return txn.max_rows
        return self.config.txn_max_rows, None

    def time_reason(self, txn: RunningTxn) -> str:
        seconds, table = self.time_limit(txn)
        if table is None:
            return f"transaction {txn.id} exceeded its time limit of {seconds:g}s"
        return f"transaction {txn.id} exceeded the time limit (txn_max_seconds) of table {table!r}, {seconds:g}s"

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
        delete them, so a failure rolls the transaction back (StorageError)."""
        try:
            self.wal.append([WalStaged(txn.id, tuple(m.path for m in op.added))], sync=False)
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
            if wrong is not None:
                field, why = wrong
                raise InvalidInput(
                    f"part {meta.name} of table {table.name!r}: its metadata's {field} {why}; refused, nothing "
                    "was committed and the file is left in place (parts.io.format.write_part records what a "
                    "file holds)",
                    part=meta.name,
                    table=table.name,
                    field=field,
                )

    def verifies_quickly(self, added: object) -> bool:
        """Whether checking the parts of a ``commit_parts`` or ``stage`` request against their
        files (:meth:`verify_claims`) is quick enough for the RPC I/O thread: local storage and at
        most :data:`QUICK_VERIFY_BYTES` claimed (a file of another size is refused unread)."""
        if not self.storage.is_local or not isinstance(added, list):
            return False
        total = sum(m["size"] for m in added if isinstance(m, dict) and isinstance(m.get("size"), int))
        return total <= QUICK_VERIFY_BYTES

    def committed_retry(self, args: dict) -> dict | None:
        """A one-call commit sent again (its answer was lost): every part it names was committed
        by one transaction, whose parts in that table are exactly these. Answered with that
        commit (``{"csn", "tid"}``) instead of refused; None for anything else."""
        table, added = args.get("table"), args.get("added")
        if not isinstance(table, str) or not isinstance(added, list) or not added:
            return None
        names = {m["name"] for m in added if isinstance(m, dict) and isinstance(m.get("name"), str)}
        recs = [self.state.parts.get(n) for n in names]
        if len(names) != len(added) or any(r is None or r.meta.table != table for r in recs):
            return None
        tids = {r.meta.creation_tid for r in recs}
        csns = {r.creation_csn for r in recs}
        if len(tids) != 1 or len(csns) != 1:
            return None
        tid = next(iter(tids))
        theirs = self.state.created_by(table, tid)
        if theirs != names:
            return None
        csn = next(iter(csns))
        for m, rec in zip(added, (self.state.parts.get(m["name"]) for m in added)):
            assert rec is not None
            differs = _other_metadata(m, rec.meta)
            if differs is not None:
                raise InvalidInput(
                    f"part {rec.meta.name} of table {table!r} was committed at CSN {csn} (by {tid}) with other "
                    f"metadata ({differs}): a retried commit is answered with its CSN only when its metadata "
                    "is what was committed; nothing was changed. Commit the rows again as new parts (a part is "
                    "committed once) if the committed metadata is wrong, or repair it: mergetxn check --repair",
                    part=rec.meta.name,
                    table=table,
                    csn=csn,
                    field=differs,
                )
        return {"csn": csn, "tid": tid}

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

    def visible_parts(self, table: str, txn_id: str, pkeys: list[str] | None = None) -> tuple[int, list[PartMeta]]:
        """Parts visible to a transaction: at its snapshot, with its own writes. One begun with
        atomicity "none" reads the latest applied state instead (non-atomic
        transactions read the most recently written data: docs/rules.md#atomicity-and-durability); its snapshot, older, keeps cleanup
        away from every part visible at any later CSN while it runs."""
        txn = self.running(txn_id)
        snapshot = self.state.applied if txn.latest_reads else txn.snapshot
        if self.state.table(table, snapshot) is None:  # as it sees it: dropped since is still there
            self.table(table, None)
        added, removed = txn.own_parts()
        return snapshot, self.state.visible(table, snapshot, txn.id, added, removed, pkeys)

    def commit(self, txn_id: str) -> int | None:
        """Commit; the CSN, or None for an async commit (queued: client.flush() waits for it)."""
        txn = self._start_commit(txn_id)
        if not txn.ops and not txn.apps:
            self.finish(txn, TxnState.COMMITTED, csn=txn.snapshot)
            return txn.snapshot
        if txn.async_session is not None:
            self.async_commits.accept(txn, self.committer.submit_async)
            return None
        return self.committer.submit(txn)

    # -- one-call commits of parts already in storage (client.commit_parts) -------------------
    def parts_op(self, txn: RunningTxn, args: dict) -> StagedOp:
        """The one statement of a one-call commit: the parts become the transaction's own (their
        ``creation_tid``), and an overwrite removes what the transaction sees in the partitions
        it names (the client cannot know them before the transaction exists)."""
        op = args.get("op", "insert")
        if op not in ("insert", "overwrite"):
            raise InvalidInput(f"commit_parts op must be 'insert' or 'overwrite', not {op!r}")
        table, added = args.get("table"), args.get("added")
        if not isinstance(table, str):
            raise InvalidInput("commit_parts needs 'table', a table name")
        if not isinstance(added, list) or not all(isinstance(m, dict) for m in added):
            raise InvalidInput("commit_parts needs 'added', a list of part descriptors")
        for m in added:
            m["creation_tid"] = txn.id
        d: dict = {"op": op, "table": table, "added": added}
        if op == "overwrite":
            partitions = args.get("partitions")
            if not isinstance(partitions, list) or not all(isinstance(p, list) for p in partitions):
                raise InvalidInput("an overwrite by commit_parts needs 'partitions', a list of partition value lists")
            pkeys = [partition_key(tuple(p)) for p in partitions]
            _, visible = self.visible_parts(table, txn.id, pkeys=pkeys)
            d.update(removed=[m.name for m in visible], partitions=pkeys)
        return op_from_dict(d)

    def parts_apps(self, txn: RunningTxn, args: dict) -> None:
        """The application versions a one-call commit records (``apps``: app id -> version)."""
        apps = args.get("apps") or {}
        if not isinstance(apps, dict):
            raise InvalidInput(f"commit_parts 'apps' must map app ids to versions, not {apps!r}")
        for app_id, version in apps.items():
            self.set_app_version(txn.id, app_id, version)

    def commit_parts(self, args: dict, owner: str | None = None) -> dict:
        """Begin, stage the parts and commit, in one call; ``{"csn", "tid"}``."""
        name = args.pop("_inflight", None)
        try:
            retried = self.committed_retry(args)
            if retried is not None:
                return retried
            txn = self.begin(owner=owner)
            try:
                op = self.parts_op(txn, args)
                if op.added or op.removed or op.partitions:
                    self.stage(txn.id, op)
                self.parts_apps(txn, args)
                csn = self.commit(txn.id)
            except BaseException as exc:
                self.abort(txn, f"commit_parts failed: {exc}", "failed")
                raise
            return {"csn": csn, "tid": txn.id}
        finally:
            if name is not None:
                self.parts_call_ended(name)

    def parts_call_started(self, name: str) -> None:
        """A one-call commit naming part ``name`` was received and waits for a worker: until it
        ends, :meth:`part_status` answers "committing" (its connection may be gone already)."""
        with self._txn_lock:
            self._parts_calls[name] = self._parts_calls.get(name, 0) + 1

    def parts_call_ended(self, name: str) -> None:
        with self._txn_lock:
            left = self._parts_calls.get(name, 0) - 1
            if left > 0:
                self._parts_calls[name] = left
            else:
                self._parts_calls.pop(name, None)

    def part_status(self, table: str, name: str) -> dict:
        """Whether the one-call commit that staged part ``name`` committed: what a client whose
        connection broke during ``commit_parts`` asks (it never learnt the transaction's id)."""
        if not isinstance(table, str) or not isinstance(name, str):
            raise InvalidInput("commit_status by part needs 'table' and 'part' names")
        rec = self.state.parts.get(name)
        if rec is not None and rec.meta.table == table:
            return CommitStatus(rec.meta.creation_tid, "committed", rec.creation_csn, "").to_dict()
        with self._txn_lock:
            if name in self._parts_calls:
                return CommitStatus("", "committing", None, "the call is being answered").to_dict()
            txns = list(self.txns.values()) + list(self.finished.values())
        for txn in txns:
            if any(m.name == name and m.table == table for op in txn.ops for m in op.added):
                return CommitStatus(txn.id, txn.state, txn.csn, txn.reason).to_dict()
        return CommitStatus(
            "",
            TxnState.ABORTED,
            None,
            f"no transaction on replica {self.host_id} staged part {name} of "
            f"{table!r} (the call never reached it, or the replica restarted before committing it)",
        ).to_dict()

    def commit_async(self, txn_id: str, done: Callable[[int | None, Exception | None], None]) -> None:
        """:meth:`commit` without waiting: ``done(csn, None)`` or ``done(None, error)`` follows,
        from the committer's thread (or this one). Errors found before queueing are raised."""
        txn = self._start_commit(txn_id)
        if not txn.ops and not txn.apps:
            self.finish(txn, TxnState.COMMITTED, csn=txn.snapshot)
            done(txn.snapshot, None)
            return
        if txn.async_session is not None:  # answered now: None, queued (replicas/async_commits.py)
            self.async_commits.accept(txn, self.committer.submit_async)
            done(None, None)
            return
        self.committer.submit_async(txn, done)

    def _start_commit(self, txn_id: str) -> RunningTxn:
        txn = self.running(txn_id)
        # The modes of the transaction and of the tables it writes must agree (checked at commit,
        # docs/rules.md#atomicity-and-durability); a mismatch ends it, rolled back, before anything is queued.
        wrong = self.mismatch(txn)
        if wrong is not None:
            self.abort(txn, wrong.message, "invalid")
            raise wrong
        with txn.lock:
            if txn.state != TxnState.RUNNING:
                raise TransactionAborted(f"transaction {txn.id} is {txn.state}: {txn.reason}", id=txn.id)
            txn.state = TxnState.COMMITTING
        return txn

    def mismatch(self, txn: RunningTxn) -> InvalidInput | None:
        """Why ``txn``'s atomicity and that of a table it writes disagree, if they do
        (coordinator/model/atomicity.py), against the tables as this replica has them now."""
        return mismatch(txn.id, txn.atomicity, list(txn.ops), self.state.tables.get)

    def ready_to_begin(self) -> bool:
        """Whether :meth:`begin` would answer at once (it waits while ZooKeeper is away or the
        cleanup watermark is ahead of this replica)."""
        return self.zk_session.usable() and self.watermark.watermark <= self.state.applied

    def quick_txn(self, txn_id: object) -> RunningTxn | None:
        """The running transaction, if a statement or commit for it can go ahead with no waiting
        and no cleanup (not past its time limit); None otherwise, and the full path decides."""
        txn = self.txns.get(txn_id) if isinstance(txn_id, str) else None
        if txn is None or txn.state != TxnState.RUNNING or time.monotonic() - txn.started > self.time_limit(txn)[0]:
            return None
        return txn

    # -- the end of a transaction ------------------------------------------------------------
    def rollback(self, txn_id: str, reason: str = "rolled back") -> None:
        txn = self.txn(txn_id)
        if txn.state in (TxnState.COMMITTED, TxnState.COMMITTING):
            raise InvalidInput(f"transaction {txn_id} is {txn.state} and cannot be rolled back")
        self.abort(txn, reason, "rolled_back")

    def abort(self, txn: RunningTxn, reason: str, kind: str | None = None) -> bool:
        """Abort ``txn`` if it runs; ``kind``: why, as the metrics count it (one of
        replicas/metrics.py's ABORT_REASONS; by default read from ``reason``)."""
        with txn.lock:
            if txn.state != TxnState.RUNNING:
                return False
            self._abort_locked(txn, reason, [], kind)
        return True

    def commit_failed(self, txn: RunningTxn, reason: str, kind: str) -> None:
        """The committer refused ``txn``'s commit or could not get it through: it ends aborted like
        a running one (abort() leaves a COMMITTING transaction alone), its own staged files
        deleted."""
        with txn.lock:
            if txn.state in (TxnState.RUNNING, TxnState.COMMITTING):
                self._abort_locked(txn, reason, [], kind)

    def _abort_locked(self, txn: RunningTxn, reason: str, extra_ops: list[StagedOp], kind: str | None = None) -> None:
        txn.state, txn.reason = TxnState.ABORTED, reason
        kind = kind or abort_kind(reason)
        with self._aborted_lock:
            self._aborted[kind] += 1
        log.info("transaction %s aborted (%s): %s", txn.id, kind, reason)
        self._retire(txn)
        for op in txn.ops + extra_ops:
            for meta in op.added:
                if self._its_own_file(txn, meta):
                    delete_part(self.storage, meta.path)

    def _its_own_file(self, txn: RunningTxn, meta: PartMeta) -> bool:
        """Whether an aborted transaction's staged part is a file it wrote and nothing names: its
        name carries the transaction's id (what its client and Spark executors write), and no
        commit named it. Parts handed to it under other names (``commit_parts``, ``add_parts`` of
        files written earlier) are their writer's: cleanup collects them as orphans after the grace
        period if no commit names them."""
        if not meta.name.startswith(txn.id + "_"):
            return False
        return self.state.parts.get(meta.name) is None

    def abort_all(self, reason: str, txns: list[RunningTxn] | None = None, kind: str | None = None) -> None:
        for txn in list(self.txns.values()) if txns is None else txns:
            self.abort(txn, reason, kind)

    def abort_counts(self) -> dict[str, int]:
        """Transactions that ended aborted here, by reason kind (the metrics read it)."""
        with self._aborted_lock:
            return dict(self._aborted)

    def finish(self, txn: RunningTxn, state: str, csn: int | None = None, reason: str = "") -> None:
        """``txn`` ended ``state`` (the committer: committed at ``csn``); it is running no more."""
        txn.state, txn.csn, txn.reason = state, csn, reason
        self._retire(txn)

    def _retire(self, txn: RunningTxn) -> None:
        with self._txn_lock:
            self.finished[txn.id] = txn  # before the pop: a lock-free txn() always finds it
            self.txns.pop(txn.id, None)
            while len(self.finished) > 10_000:
                self.finished.pop(next(iter(self.finished)))
        self.on_end(txn)

    def kill(self, txn_id: str) -> dict:
        try:
            Tid.parse(txn_id)
        except ValueError as exc:
            raise InvalidInput(f"kill: {exc}", id=txn_id) from None
        txn = self.txns.get(txn_id) or self.finished.get(txn_id)
        if txn is None:  # not "aborted": nothing was (exit 3, not 7)
            raise TransactionNotFound(
                f"kill: no transaction {txn_id} runs on replica {self.host_id} (nor ended "
                "there recently; a transaction runs on the replica its id names)",
                id=txn_id,
            )
        self.abort(txn, f"transaction {txn_id} was killed by an operator", "killed")  # logs it at INFO
        return txn.describe()

    @contextmanager
    def begins_held(self) -> Iterator[dict[str, RunningTxn]]:
        """Hold off begins and retirements while the body runs, and give the running
        transactions (to read, not to change). What is read of the applied CSN under it is never
        past the snapshot of a transaction that begins after: the snapshots in use are computed
        so (replicas/leases.py, the alive record)."""
        with self._txn_lock:
            yield self.txns

    def running_now(self) -> list[RunningTxn]:
        """The running transactions now (a copy taken under the transaction lock)."""
        with self._txn_lock:
            return list(self.txns.values())

    def lookup(self, txn_id: str) -> RunningTxn | None:
        """The transaction ``txn_id``, running or ended lately, or None (under the lock: one that
        is being retired is found in one place or the other)."""
        with self._txn_lock:
            return self.txns.get(txn_id) or self.finished.get(txn_id)

    def describe(self) -> list[dict]:
        """The running transactions, as the ``transactions`` action lists them."""
        with self._txn_lock:
            return [t.describe() for t in self.txns.values()]

    def commit_status(self, tid: str, forwarded: bool = False) -> dict:
        """Any transaction's outcome, decided here when its replica is gone (replicas/outcomes.py)."""
        return self.outcome(tid, not forwarded).to_dict()

    def min_needed(self) -> int:
        """The lowest CSN this replica still needs: applied, or an older running snapshot."""
        with self._txn_lock:
            return min([self.state.applied, *(t.snapshot for t in self.txns.values())])

    def reap(self) -> None:
        """Abort the running transactions past their time limit, and those whose client session
        went silent (the replica's reaper thread, replicas/sessions.py)."""
        now = time.monotonic()
        for txn in list(self.txns.values()):
            if txn.state == TxnState.RUNNING and now - txn.started > self.time_limit(txn)[0]:
                self.abort(txn, self.time_reason(txn))
        with self._txn_lock:  # with begin: a session that began a transaction is never forgotten
            running = [t for t in self.txns.values() if t.state == TxnState.RUNNING and t.session is not None]
            gone = self.sessions.expired({(t.owner, t.session) for t in running}, now)
        for txn in running:
            silent = gone.get((txn.owner, txn.session))
            if silent is not None:
                self.abort(txn, self.session_reason(txn, silent), "client_session_timeout")

    def session_reason(self, txn: RunningTxn, silent: float) -> str:
        timeout = self.config.client_session_timeout
        return (
            f"transaction {txn.id} was aborted: its client session {txn.session} was not heard from for "
            f"{silent:.1f}s, more than the session timeout (client_session_timeout={timeout:g}s): the client "
            "process died, stood still or lost its connection"
        )

    def heartbeat(self, session: object, who: Grantee | None = None) -> dict:
        """A client's session is alive: its running transactions here stay. ``who``: the caller
        (None on an unsecured replica); another user's session of that id is not its to keep
        alive, and is answered as an unknown one (replicas/sessions.py)."""
        session = check_session_id(session)
        known = self.sessions.heard(session, time.monotonic(), who)
        return {"known": known, "client_session_timeout": self.config.client_session_timeout}

    def users_dropped(self, names: Iterable[str]) -> None:
        """Users were dropped (replicas/users.py): their running transactions here are aborted, each
        with a reason naming its user (what ``commit_status`` and the events say)."""
        gone = set(names)
        for txn in self.running_now():
            if txn.owner in gone:
                self.abort(txn, f"transaction {txn.id} was aborted: user {txn.owner!r} was dropped", "killed")

    def notable(self) -> dict:
        """Running transactions an operator should look at (``mergetxn status``): long-running
        ones (past a tenth of their time limit) and orphaned ones (their client session silent for
        half the session timeout, or held by no session and older than the session timeout: only
        their time limit ends those), each with its holder."""
        now, timeout = time.monotonic(), self.config.client_session_timeout
        long, orphaned = [], []
        with self._txn_lock:
            txns = [t for t in self.txns.values() if t.state == TxnState.RUNNING]
        for t in txns:
            age = now - t.started
            silent = self.sessions.silent_for((t.owner, t.session), now) if t.session is not None else None
            row = {
                "id": t.id,
                "age_seconds": round(age, 3),
                "owner": t.owner,
                "session": t.session,
                "session_silent_seconds": None if silent is None else round(silent, 3),
            }
            if age > self.time_limit(t)[0] / 10:
                long.append(row)
            if (silent is not None and silent > timeout / 2) or (silent is None and age > timeout):
                orphaned.append(row)
        by_age = lambda r: -r["age_seconds"]  # noqa: E731
        return {"long_running": sorted(long, key=by_age)[:20], "orphaned": sorted(orphaned, key=by_age)[:20]}


def _other_metadata(sent: dict, committed: PartMeta) -> str | None:
    """The first field in which a part descriptor sent again differs from the committed one
    (its ``creation_tid`` is the committing transaction's, set by the replica), or None."""
    try:
        meta = PartMeta.from_dict({**sent, "creation_tid": committed.creation_tid})
    except CorruptMetadata as exc:
        return f"it does not parse: {exc.message}"
    for f in fields(PartMeta):
        if getattr(meta, f.name) != getattr(committed, f.name):
            return f.name
    return None
