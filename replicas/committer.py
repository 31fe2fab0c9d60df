"""Group commit: the commits waiting on one replica share one ZooKeeper multi and one CSN.

One thread takes every commit that is waiting, decides each with the conflict rules against the
commits that happened since its snapshot, and writes all accepted ones in one multi (see
:mod:`coordinator.zk.log`). Two members of a batch never check the same target, so their verdicts
cannot depend on each other: a member that would is held for the next batch. When a checked
target moved between our read and the multi, the whole batch is decided again (tenacity).

When the rules let a later transaction succeed after something committed on its target, the
transaction is rebased: its operations are replayed on the current parts. Inserts and overwrites
replay as metadata; a delete, update or compaction whose input parts are still there keeps the
parts it wrote; only one whose inputs were rewritten meanwhile is redone on the current parts.

If the connection to ZooKeeper drops during the multi, the outcome is looked up in the log
(after a ``sync``) before anybody is answered: the caller learns committed or not, never unknown.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
)
from tenacity import Retrying

from coordinator.core import jsonwire, retries
from coordinator.core.conflicts import (
    COMPACTIONS,
    DATA_CHANGING,
    Policy,
    Summary,
    check,
    check_app_versions,
    fits_beside,
)
from coordinator.core.errors import (
    ConflictError,
    ConflictKind,
    CorruptMetadata,
    InvalidInput,
    MergetxnError,
    TableNotFound,
    TransactionAborted,
    quote,
)
from coordinator.core.readsets import Shape, Touch, check_reads, counter_key
from coordinator.core.readsets import read_keys as read_set_keys
from coordinator.core.tabledata import partition_key
from coordinator.core.targets import (
    Statement,
    app_key,
    checked_keys,
    read_keys,
    whole_table_targets,
)
from coordinator.core.versions import Tid, csn_of, epoch_full, incarnation_of
from coordinator.model.atomicity import NONE
from coordinator.model.catalog import TableDef, TableDropped
from coordinator.model.records import (
    DropTable,
    Insert,
    LogEntry,
    ManifestPointer,
    Overwrite,
    StagedOp,
    Truncate,
    TxnRecord,
    TxnState,
)
from coordinator.model.znodes import TABLE_LIVE, TARGET_BODY, TOMBSTONE
from coordinator.zk.log import (
    MAX_INLINE_ENTRY,
    OwnerFenced,
    TableMoved,
    VersionMoved,
    table_node_dropped,
)
from coordinator.zk.orphan_fence import FenceMoved
from parts.io.format import delete_part
from parts.model.meta import PartMeta, sidecar_path
from replicas import failpoints
from replicas.keylocks import KeyConflicts
from replicas.metrics import CommitStats
from replicas.running import Effect, RunningTxn

if TYPE_CHECKING:
    from coordinator.zk.log import CsnLog
    from coordinator.zk.orphan_fence import OrphanFence
    from parts.io.storage import Storage
    from replicas.follower import Follower
    from replicas.registry import Transactions
    from replicas.settings import ReplicaConfig
    from replicas.state import ReplicaState
    from replicas.zksession import ZkSession

log = logging.getLogger(__name__)

UNKNOWN_OUTCOME = (ConnectionLoss, ConnectionClosedError, OperationTimeoutError, SessionExpiredError)
MAX_BATCH = 512
ASYNC_PER_BATCH = 16  # async commits of one client session in one batch (see Committer._take_batch)
LOCAL_OFF_BATCHES = 64  # after a first attempt on local versions missed: batches that read them from ZooKeeper
RETRY_WAIT = 0.005  # seconds, at most, between attempts of a batch that lost a race
_TABLE_NODE = TABLE_LIVE  # a table znode's data while the table exists (coordinator/model/znodes.py, TableNode)


def commit_too_large(what: str, size: int, limit: int, **details: Any) -> InvalidInput:
    """The refusal of a commit whose log record is over the ``max_commit_bytes`` setting."""
    return InvalidInput(
        f"{what} would add {size} bytes of metadata to the log (its part descriptors and statistics), more "
        f"than the replica setting max_commit_bytes ({limit}); nothing was committed: commit fewer parts per "
        "transaction, or raise max_commit_bytes",
        size=size,
        max_commit_bytes=limit,
        **details,
    )


class NeedKeys(Exception):
    """A member's rebased effect checks targets whose versions were not read: read them too."""


class _Fenced(Exception):
    """The commit multi found this replica's owner node past the batch's incarnation."""

    def __init__(self, incarnation: int, message: str) -> None:
        super().__init__(message)
        self.incarnation = incarnation


class _LocalMiss(VersionMoved):
    """A first attempt on locally applied target versions was refused (another replica committed
    to a target since) or saw the state move while deciding."""


@dataclass
class Pending:
    txn: RunningTxn | None = None
    table: TableDef | None = None  # CREATE TABLE
    # ALTER TABLE: name, add_columns, rename_columns, retention (None: unchanged; else a 1-tuple)
    alter: tuple[str, Any, Any, Any] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    csn: int | None = None
    error: Exception | None = None
    key_hints: set[str] = field(default_factory=set)
    extra_files: list[PartMeta] = field(default_factory=list)
    files_verified_at: int | None = None  # the fence version after which its staged files were seen
    queued: float = field(default_factory=time.monotonic)  # the commit latency metric starts here

    callback: Callable[[int | None, Exception | None], None] | None = None

    @property
    def ddl(self) -> bool:
        return self.table is not None or self.alter is not None

    def resolve(self, csn: int | None = None, error: Exception | None = None) -> None:
        self.csn, self.error = csn, error
        self.done.set()
        if self.callback is not None:
            try:
                self.callback(csn, error)
            except Exception:  # the answer could not be queued: never break the committer
                log.exception("commit callback failed")


@dataclass
class Plan:
    effect: Effect
    checked: set[str]


class Committer:
    """The group committer of one replica: batches commits into one ZooKeeper multi each."""

    def __init__(
        self,
        state: ReplicaState,
        log: CsnLog,
        config: ReplicaConfig,
        storage: Storage,
        follower: Follower,
        zk_session: ZkSession,
        transactions: Transactions,
        fence: OrphanFence,
        table: Callable[[str], TableDef],
        catch_up: Callable[[], None],
        wait_snapshot: Callable[..., Any],
        incarnation: Callable[[], int],
        fenced: Callable[[int], None],
    ) -> None:
        """``table``: a table's definition now; ``catch_up``: apply the log to its end;
        ``wait_snapshot``: wait until a snapshot is applied here; ``incarnation``: this replica's
        now; ``fenced``: told when the owner node says another incarnation took over."""
        self.state, self.log, self.config, self.storage, self.follower = state, log, config, storage, follower
        self.host_id = config.host_id
        self.zk_session, self.transactions, self.fence = zk_session, transactions, fence
        self.table, self.catch_up, self.wait_snapshot = table, catch_up, wait_snapshot
        self.incarnation, self.fenced = incarnation, fenced
        self._queue: deque[Pending] = deque()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="committer", daemon=True)
        self.batches = 0
        self.committed = 0
        self.local_misses = 0  # first attempts on locally applied target versions that ZooKeeper refused
        self.stats = CommitStats()  # written by this thread only (replicas/metrics.py)
        self._local_off_until = 0  # batch count before which first attempts read versions from ZooKeeper
        self._drift: dict[str, int] = {}  # table znodes changed outside the log: the version they have
        self._counters: set[str] = set()  # write counters known to exist (coordinator/core/readsets.py)
        self.key_conflicts = KeyConflicts(self.state, storage, table)  # keys tables

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._thread.join(timeout=5)

    # -- entry points ------------------------------------------------------------------------
    def submit(self, txn: RunningTxn) -> int:
        p = self._enqueue(Pending(txn=txn))
        if p.error is not None:
            raise p.error
        return p.csn

    def submit_async(self, txn: RunningTxn, done: Callable[[int | None, Exception | None], None]) -> None:
        """Queue a commit; ``done(csn, error)`` is called once it is decided (the RPC server
        answers from it without a thread waiting per commit)."""
        with self._cond:
            self._queue.append(Pending(txn=txn, callback=done))
            self._cond.notify()

    def create_table(self, tdef: TableDef) -> int:
        p = self._enqueue(Pending(table=tdef))
        if p.error is not None:
            raise p.error
        return p.csn

    def alter_table(self, name: str, add_columns: Any, rename_columns: Any, retention: Any = None) -> int:
        p = self._enqueue(Pending(alter=(name, add_columns, rename_columns, retention)))
        if p.error is not None:
            raise p.error
        return p.csn

    def _enqueue(self, p: Pending) -> Pending:
        with self._cond:
            self._queue.append(p)
            self._cond.notify()
        p.done.wait()
        return p

    # -- the loop --------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                while not self._queue and not self._stop.is_set():
                    self._cond.wait(0.5)
                if self._stop.is_set():
                    break
                batch = self._take_batch()
            try:
                if batch[0].table is not None:
                    self._create_table(batch[0])
                elif batch[0].alter is not None:
                    self._alter_table(batch[0])
                else:
                    deferred = self._commit_batch(batch)
                    if deferred:
                        with self._cond:
                            self._queue.extendleft(reversed(deferred))
            except Exception as exc:  # never leave a caller waiting
                log.exception("commit batch failed")
                for p in batch:
                    if not p.done.is_set():
                        self._fail(
                            p,
                            exc
                            if isinstance(exc, MergetxnError)
                            else TransactionAborted(f"commit failed: {quote(exc)}"),
                        )
        for p in list(self._queue):
            self._fail(p, TransactionAborted("replica is shutting down"))

    def _take_batch(self) -> list[Pending]:
        """The next batch, taken from the queue under its lock: a DDL alone, else up to
        MAX_BATCH commits in queue order, at most ASYNC_PER_BATCH of them async commits of one
        client session. A client's backlog of async commits to one keys target commits one per
        batch anyway (two writes of a key never share a CSN); the cap keeps the rest of it from
        being looked at, and deferred, in every batch. Those left keep their order at the head."""
        if self._queue[0].ddl:
            return [self._queue.popleft()]
        batch: list[Pending] = []
        later: list[Pending] = []
        taken: dict[str, int] = {}
        while self._queue and not self._queue[0].ddl and len(batch) < MAX_BATCH and len(later) < MAX_BATCH:
            p = self._queue.popleft()
            session = p.txn.async_session if p.txn is not None else None
            if session is not None:
                if taken.get(session, 0) >= ASYNC_PER_BATCH:
                    later.append(p)
                    continue
                taken[session] = taken.get(session, 0) + 1
            batch.append(p)
        self._queue.extendleft(reversed(later))
        return batch

    def _retrying(self, after_local_miss: bool = False) -> Retrying:
        """The one retry policy of a commit: a batch (or a table creation) is decided again after
        a version miss or when it needs more target versions, up to 500 times or 2 minutes, with a
        short random wait (none after a refused first attempt on local versions: it reads them
        from ZooKeeper next, which is wait enough)."""

        def wait(retry_state) -> float:
            exc = retry_state.outcome.exception()
            return 0.0 if after_local_miss and isinstance(exc, _LocalMiss) else random.uniform(0, RETRY_WAIT)

        return retries.commit_attempts(wait, on=(VersionMoved, NeedKeys))

    # -- DDL ---------------------------------------------------------------------------------
    def _create_table(self, p: Pending) -> None:
        """CREATE TABLE: the table znode created (or, after a drop, set at its version: so the
        commits that checked the dropped table's version fail) and the DDL entry, in one multi."""
        zk, name = self.log.zk, p.table.name
        try:
            for attempt in self._retrying():
                with attempt:
                    node, stat = self._table_node(name)
                    if stat is not None and not table_node_dropped(node):
                        raise InvalidInput(f"table {quote(name)} already exists", table=name)
                    tdef = replace(p.table, ddl_version=0 if stat is None else stat.version + 1)
                    new_target = zk.exists(self.log.target_path(name)) is None
                    entry = LogEntry(time=time.time(), versions={name: 0} if new_target else {}, ddl=(tdef,))
                    t = zk.transaction()
                    if stat is None:
                        t.create(self.log.table_path(name), _TABLE_NODE)
                    else:
                        t.set_data(self.log.table_path(name), _TABLE_NODE, version=stat.version)
                    if new_target:
                        t.create(self.log.target_path(name), TARGET_BODY)
                    csn = self._log_ddl(t, entry)
            self._applied_here(csn, name)
            p.resolve(csn)
        except MergetxnError as exc:
            p.resolve(error=exc)

    def _alter_table(self, p: Pending) -> None:
        """ALTER TABLE: the new definition, decided on the current one, and the table znode set
        at the version that one holds (a concurrent DDL or drop makes it decide again)."""
        name, add_columns, rename_columns, retention = p.alter
        zk = self.log.zk
        try:
            for attempt in self._retrying():
                with attempt:
                    node, stat = self._table_node(name)
                    cur = self.state.tables.get(name)
                    if stat is None or table_node_dropped(node):
                        raise TableNotFound(f"unknown table {quote(name)}", table=name)
                    if cur is None or cur.ddl_version < stat.version:
                        self._catch_up_tables([name])  # a DDL applied elsewhere first, then decide
                        cur = self.state.tables.get(name)
                        if cur is None:
                            raise TableNotFound(f"unknown table {quote(name)}", table=name)
                    new = cur.altered(add_columns, rename_columns, version=stat.version + 1, retention=retention)
                    entry = LogEntry(time=time.time(), versions={}, ddl=(new,))
                    t = zk.transaction()
                    t.set_data(self.log.table_path(name), _TABLE_NODE, version=stat.version)
                    csn = self._log_ddl(t, entry)
            self._applied_here(csn, name)
            p.resolve(csn)
        except MergetxnError as exc:
            p.resolve(error=exc)

    def _table_node(self, name: str) -> tuple[bytes | None, Any]:
        try:
            return self.log.zk.get(self.log.table_path(name))
        except NoNodeError:
            return None, None

    def _spilled(self, data: bytes) -> bytes:
        """A log entry's bytes as its znode holds them: itself, or when too large for a znode, a
        pointer to a manifest in storage holding it (written durably first)."""
        if len(data) <= MAX_INLINE_ENTRY:
            return data
        path = f"_manifests/{uuid.uuid4().hex}.json"
        self.storage.put(path, data)
        return ManifestPointer(path).encode()

    def _log_ddl(self, t: Any, entry: LogEntry) -> int:
        """Finish a DDL multi ``t``: the epoch check and the entry (in a manifest in storage when it
        is too large for a znode: a table of thousands of columns). Returns the CSN."""
        data = entry.encode()
        if len(data) > self.config.max_commit_bytes:
            raise commit_too_large("the definition change", len(data), self.config.max_commit_bytes)
        data = self._spilled(data)
        epoch = self.log.current_epoch()
        t.check(self.log.epoch_path(epoch), 0)
        t.create(f"{self.log.epoch_path(epoch)}/c-", data, sequence=True)
        results = t.commit()
        if any(isinstance(r, Exception) for r in results):
            self.log.current_epoch(refresh=True)
            raise VersionMoved(str(results))
        seq = int(results[-1].rsplit("-", 1)[1])
        if epoch_full(seq, self.log.epoch_size):
            self.log.seal(epoch)
        self.follower.offer(epoch, seq, data)
        return csn_of(epoch, seq)

    def _applied_here(self, csn: int, name: str) -> None:
        try:
            self.wait_snapshot(csn)  # done only once it is applied here
        except CorruptMetadata as exc:
            raise CorruptMetadata(
                f"table {quote(name)} is in the log at CSN {csn} but not applied here, and exists only once "
                f"every entry before it applies: {exc.message}",
                table=name,
                csn=csn,
            ) from exc

    def _catch_up_tables(self, names: list[str]) -> None:
        """After a table znode was found past the definition applied here: apply the log up to
        now. A znode still ahead then was changed outside the log (by hand): its version is
        taken as it is, so commits to the table are not refused for ever."""
        self.catch_up()
        for name in names:
            _, stat = self._table_node(name)
            rec = self.state.record(name)
            if stat is not None and rec is not None and stat.version > rec.ddl_version:
                log.warning(
                    "table znode %s is at version %d, its last DDL in the log at %d: changed outside "
                    "the log; checking that version from now on",
                    name,
                    stat.version,
                    rec.ddl_version,
                )
                self._drift[name] = stat.version

    def _table_version(self, name: str) -> int:
        rec = self.state.record(name)
        v = rec.ddl_version if rec is not None else 0
        return max(v, self._drift.get(name, -1))

    # -- transactions ------------------------------------------------------------------------
    def _commit_batch(self, batch: list[Pending]) -> list[Pending]:
        deferred: list[Pending] = []

        def attempt_once(local: bool = False) -> None:
            nonlocal deferred
            live = [p for p in batch if not p.done.is_set()]
            deferred = []
            if not live:
                return
            deferred = self._attempt(live, local)

        # The first attempt decides on the target versions this replica has applied (no round
        # trip) unless a recent one was refused; later attempts read them from ZooKeeper.
        local_first = self.batches >= self._local_off_until
        try:
            for attempt in self._retrying(after_local_miss=True):
                with attempt:
                    first = attempt.retry_state.attempt_number == 1
                    try:
                        attempt_once(local_first and first)
                    except _LocalMiss:
                        if local_first and first:
                            # Another replica committed to a target since this one applied it:
                            # read the versions from ZooKeeper for a while (others write too).
                            self.local_misses += 1
                            self._local_off_until = self.batches + LOCAL_OFF_BATCHES
                        raise
        except (VersionMoved, NeedKeys) as exc:
            for p in batch:
                if not p.done.is_set():
                    self._fail(p, TransactionAborted(f"commit could not get through contention: {exc}"))
        except _Fenced as exc:
            # Another replica decided these transactions (aborted) while this one looked gone:
            # the multi did not happen and never will under that incarnation.
            for p in batch:
                if not p.done.is_set():
                    self._fail(
                        p,
                        TransactionAborted(
                            f"transaction {p.txn.id} did not commit: replica {self.host_id}'s incarnation "
                            f"{exc.incarnation} was fenced by another replica while this one looked gone ({exc})",
                            id=p.txn.id,
                        ),
                    )
            self.fenced(exc.incarnation)
        return [p for p in deferred if not p.done.is_set()]

    def _attempt(self, members: list[Pending], local: bool = False) -> list[Pending]:
        """Decide every member, commit the accepted ones in one multi; return the deferred.

        ``local``: take the checked targets' versions from the state this replica has applied
        instead of reading them from ZooKeeper (a round trip saved per batch). The multi's
        version checks still refuse the commit if another replica committed to one of them
        since (``_LocalMiss``); the state must not change while the batch is decided, which the
        applied CSN, read before and checked under the state lock after, tells."""
        wanted: set[str] = set()
        for p in members:
            wanted |= self._initial_keys(p) | p.key_hints | self._read_keys(p)
        read_counters: dict[str, int] = {}
        if any(self._serializable(p) for p in members):
            read_counters = self._read_counters(members)  # then catch up: every write before is seen
            self._catch_up_for_reads()
        applied_before = self.state.applied
        # The table versions before any decision: a DDL applied while the batch is decided then
        # makes the multi's table checks fail instead of letting a stale decision through.
        table_versions = {t: self._table_version(t) for p in members for t in {op.table for op in p.txn.ops}}
        incarnation = self.incarnation()  # the owner node's version every member must hold
        fence, condemned = self.fence.current()  # read before the files are verified
        if local:
            versions: dict[str, int | None] = {k: self.state.versions.get(k) for k in wanted}
        else:
            try:
                versions = self.log.read_versions(sorted(wanted)) if wanted else {}
            except UNKNOWN_OUTCOME as exc:  # nothing written yet: wait for the session, go round again
                self.zk_session.connected.wait(self.config.session_timeout)
                raise VersionMoved(f"ZooKeeper connection lost while reading target versions: {quote(exc)}") from exc
            if versions:
                self.follower.poke()
            if versions and not self.state.wait_versions(versions, self.config.read_wait_seconds):
                raise VersionMoved("this replica did not catch up with the targets' versions in time")
        if self.state.failure is not None:
            raise self.state.failure

        accepted: list[tuple[Pending, Plan]] = []
        counters_checked: dict[str, int] = {}
        taken: set[str] = set()
        dropping: set[str] = set()  # tables a member of the batch drops
        writing: set[str] = set()  # tables the other members write
        deferred: list[Pending] = []
        in_batch: dict[tuple[str, str], list[Summary]] = defaultdict(list)  # target -> accepted members
        held: set[str] = set()  # client sessions with an async commit deferred in this attempt
        for p in members:
            # One client's async commits get CSNs in the order it made them: once one of them
            # waits for the next batch, so do its later ones (replicas/async_commits.py).
            if deferred and deferred[-1].txn.async_session is not None:
                held.add(deferred[-1].txn.async_session)
            if p.txn.async_session in held:
                deferred.append(p)
                continue
            try:
                if incarnation_of(Tid.parse(p.txn.id)) != incarnation:
                    raise TransactionAborted(
                        f"transaction {p.txn.id} was begun by an earlier incarnation of replica {self.host_id} "
                        "(its ZooKeeper session expired since): it can no longer commit",
                        id=p.txn.id,
                    )
                plan = self._plan(p)
                self._verify_files(p, plan, fence, condemned)
                duplicate = check_app_versions(p.txn.id, p.txn.apps, self.state.apps)
                if duplicate is not None:
                    raise duplicate
                self._check_reads(p)
            except MergetxnError as exc:
                self._fail(p, exc)
                continue
            app_keys = {app_key(a) for a in p.txn.apps}
            reading = self._read_keys(p)
            keys = set(plan.checked) | app_keys | reading
            if local:
                for k in keys - versions.keys():
                    versions[k] = self.state.versions.get(k)
            missing = {k for k in keys if k not in versions}
            if missing:
                p.key_hints |= missing
                deferred.append(p)
                continue
            if reading and (reading & taken or {r.table for r in p.txn.reads} & (writing | dropping)):
                # What a serializable member read is written by a member accepted before it: the
                # next batch decides it against their commit.
                deferred.append(p)
                continue
            if keys & taken and (app_keys & taken or not self._fits_beside(p.txn, plan.effect, in_batch)):
                # An application's versions are decided one commit at a time: the next batch
                # decides this one against the commit of the member that took its app key.
                deferred.append(p)
                continue
            drops = {op.table for op in p.txn.ops if isinstance(op, DropTable)}
            writes = {op.table for op in p.txn.ops} - drops
            if drops & (dropping | writing) or writes & dropping:
                deferred.append(p)  # a drop goes alone with its table: the next batch decides the rest
                continue
            dropping |= drops
            writing |= writes
            taken |= keys
            if reading:
                counters_checked.update(
                    {counter_key(r.table): read_counters[counter_key(r.table)] for r in p.txn.reads}
                )
            accepted.append((p, plan))
            for (table, pkey), kinds in plan.effect.kinds.items():
                in_batch[(table, pkey)].append(Summary(p.txn.id, frozenset(kinds), plan.effect.removed_in(table, pkey)))
        if not accepted:
            if deferred and len(deferred) == len(members):
                raise NeedKeys("re-reading target versions")
            return deferred

        expected = {k: versions[k] for k in taken}
        for k, v in list(expected.items()):
            table, pkey = k.split("/", 1)[0], ("/" in k)
            if pkey and v is None:  # a new partition node: the table-level version moves too
                if local and table not in versions:
                    versions[table] = self.state.versions.get(table)
                expected[table] = versions.get(table)
                if table not in versions:
                    for p, _ in accepted:
                        p.key_hints.add(table)
                    raise NeedKeys(f"table-level version of {table}")
        if local and expected:
            with self.state.lock:  # no entry is half applied while this holds
                if self.state.applied != applied_before:
                    raise _LocalMiss("entries were applied while the batch was decided: deciding again")
        # Every table written is checked at the version of the definition it was decided on, and
        # a dropped one set past it: no commit decided before a DDL on its table happens after it.
        tables: dict[str, tuple[int, bytes | None]] = {t: (table_versions[t], None) for t in writing}
        ddl = []
        for p, _ in accepted:
            for op in p.txn.ops:
                if isinstance(op, DropTable):
                    v = table_versions[op.table]
                    tables[op.table] = (v, TOMBSTONE)
                    ddl.append(TableDropped(op.table, p.txn.id, v + 1))
        now = time.time()
        txns = []
        for p, plan in accepted:
            data_change = any(k in DATA_CHANGING for ks in plan.effect.kinds.values() for k in ks) or any(
                isinstance(op, DropTable) for op in p.txn.ops
            )
            txns.append(
                TxnRecord(p.txn.id, now if data_change else None, tuple(plan.effect.changes()), dict(p.txn.apps))
            )
        entry = LogEntry(
            time=now,
            versions={k: (0 if v is None else v + 1) for k, v in expected.items()},
            txns=tuple(txns),
            ddl=tuple(ddl),
        )
        own = (entry, entry.encode())  # this replica applies its own commit from these
        if len(own[1]) > self.config.max_commit_bytes:
            too_large = self._too_large(accepted, txns)
            if too_large:  # fail those, decide the others again (nothing was written yet)
                return deferred + [p for p, _ in accepted if p not in too_large]
        data = own[1]
        data = self._spilled(data)

        counters = (counters_checked, self._counters_bumped(writing, dropping))
        failpoints.hit("before_commit_multi")
        try:
            with self.follower.local_commit() as hand_over:
                try:
                    result = self.log.commit(
                        data,
                        expected,
                        fence,
                        owner=(self.log.replica_path(self.host_id), incarnation),
                        tables=tables,
                        counters=counters,
                    )
                except TableMoved as exc:
                    self._catch_up_tables(exc.tables)  # then decide again on the definitions as they are
                    raise
                except OwnerFenced as exc:
                    raise _Fenced(incarnation, str(exc)) from exc
                except FenceMoved as exc:
                    self.fence.refresh()  # then every staged file is verified again
                    raise VersionMoved(str(exc)) from exc
                except VersionMoved as exc:
                    if local and expected:
                        raise _LocalMiss(str(exc)) from exc
                    raise
                hand_over(result.epoch, result.seq, data, own)  # WAL + apply, here if it can
        except UNKNOWN_OUTCOME as exc:
            csn = self._resolve_outcome(accepted[0][0].txn.id, exc)
            if csn is None:
                raise VersionMoved("the commit multi did not happen; trying again") from exc
        else:
            csn = result.csn
        failpoints.hit("after_commit_multi")  # in the log, not yet answered (tests/faults/test_sessions.py)
        self.state.wait_applied(csn, self.config.read_wait_seconds)
        self.batches += 1
        log.info(
            "committed a batch of %d transaction(s) at CSN %d: %s%s",
            len(accepted),
            csn,
            ", ".join(p.txn.id if p.txn is not None else "?" for p, _ in accepted[:5]),
            ", ..." if len(accepted) > 5 else "",
        )
        now = time.monotonic()
        for p, plan in accepted:
            self.committed += 1
            self.stats.observe(now - p.queued)
            self.transactions.finish(p.txn, TxnState.COMMITTED, csn=csn)
            for meta in plan.effect.discarded + p.extra_files:
                if meta.name not in plan.effect.added:
                    delete_part(self.storage, meta.path)
            p.resolve(csn)
        return deferred

    def _verify_files(self, p: Pending, plan: Plan, fence: int, condemned: frozenset[str]) -> None:
        """Refuse a member whose staged files cleanup condemned or deleted as orphans (a replica
        that stalled between staging and committing). Checked against fence version ``fence``,
        which the multi checks too: see coordinator/zk/orphan_fence.py for why that closes the race."""
        staged = [m for op in p.txn.ops for m in op.added if m.name in plan.effect.added]
        if not staged:
            return
        for m in staged:
            if m.path in condemned or sidecar_path(m.path) in condemned:
                raise TransactionAborted(
                    f"transaction {p.txn.id} cannot commit: cleanup took its part {m.name} ({m.path}) for an "
                    "orphan (the transaction looked abandoned: its replica stalled longer than the grace "
                    "period); nothing of it was committed",
                    id=p.txn.id,
                    part=m.name,
                )
        if p.files_verified_at == fence:
            return
        gone = self.storage.missing([m.path for m in staged])
        if gone:
            raise TransactionAborted(
                f"transaction {p.txn.id} cannot commit: its part file {gone[0]} is gone from storage "
                "(collected by cleanup as an orphan, or deleted by hand); nothing of it was committed",
                id=p.txn.id,
                path=gone[0],
            )
        p.files_verified_at = fence

    def _resolve_outcome(self, tid: str, exc: Exception) -> int | None:
        """After a lost connection: did our multi commit? Answer only once we know."""
        log.warning("connection lost during commit multi (%r); looking up %s in the log", exc, tid)
        zk = self.log.zk
        for attempt in retries.log_lookup():
            with attempt:
                if not zk.connected:
                    raise ConnectionLoss("waiting for ZooKeeper")
                zk.sync(self.log.log_path())
                self.follower.pull()
        csn = self.state.tid_csn.get(tid)
        if csn is None and self.zk_session.lost.is_set():
            raise TransactionAborted(f"replica lost its ZooKeeper session; {tid} did not commit")
        return csn

    def _too_large(self, accepted: list[tuple[Pending, Plan]], txns: list[TxnRecord]) -> list[Pending]:
        """Fail the members whose record in the entry is over ``max_commit_bytes`` (what one
        commit adds to the log and to every WAL) with InvalidInput naming the setting; return
        them. A batch of members each under the limit commits whatever its total."""
        limit = self.config.max_commit_bytes
        failed = []
        for (p, _), rec in zip(accepted, txns):
            size = len(jsonwire.dumps(rec.to_dict()))
            if size > limit:
                self._fail(p, commit_too_large(f"transaction {p.txn.id}", size, limit, id=p.txn.id))
                failed.append(p)
        return failed

    def _fail(self, p: Pending, exc: Exception) -> None:
        self.stats.failure(
            exc.details.get("kind") if isinstance(exc, ConflictError) else None, conflict=isinstance(exc, ConflictError)
        )
        if p.txn is not None:
            with p.txn.lock:
                p.txn.state = TxnState.RUNNING  # let abort() clean it up
            self.transactions.abort(p.txn, str(exc), "conflict" if isinstance(exc, ConflictError) else "failed")
            for meta in p.extra_files:
                delete_part(self.storage, meta.path)
        p.resolve(error=exc)

    # -- deciding ----------------------------------------------------------------------------
    def _policy(self, table: str) -> Policy:
        t = self.state.tables.get(table)
        if t is None and isinstance(self.state.record(table), TableDropped):
            # dropped: the member loses to the drop (_plan); until then, the last definition's
            return next(
                (r.conflict_policy for r in reversed(self.state.catalog.get(table, [])) if isinstance(r, TableDef)),
                Policy.PARTS,
            )
        return (t or self.table(table)).conflict_policy

    def _policies(self, tables) -> dict[str, Policy]:
        return {t: self._policy(t) for t in tables}

    def _initial_keys(self, p: Pending) -> set[str]:
        parts = self.state.parts
        statements = [
            Statement(
                op.table,
                added=[partition_key(m.partition) for m in op.added],
                removed=[rec.pkey for rec in map(parts.get, op.removed) if rec is not None],
                partitions=op.partitions or (),
                whole_table=op.whole_table,
            )
            for op in p.txn.ops
        ]
        keys = read_keys(self._policies({op.table for op in p.txn.ops}), statements, self.state.live)
        return keys | {app_key(a) for a in p.txn.apps}

    def _pkeys_of(self, txn: RunningTxn, names: list[str], own: dict[str, PartMeta]) -> dict[str, str]:
        out = {}
        for n in names:
            if n in own:
                out[n] = partition_key(own[n].partition)
                continue
            rec = self.state.parts.get(n)
            if rec is None:
                raise InvalidInput(f"transaction {txn.id} removes unknown part {n}")
            out[n] = rec.pkey
        return out

    def _fold(self, txn: RunningTxn, ops: list[StagedOp]) -> Effect:
        eff = Effect()
        for op in ops:
            eff.add_op(op, self._pkeys_of(txn, op.removed, eff.added))
        return eff

    def _plan(self, p: Pending) -> Plan:
        txn = p.txn
        for table in sorted({op.table for op in txn.ops}):
            self._check_not_dropped(txn, table)
        eff = self._fold(txn, txn.ops)
        if self._verdicts(txn, eff):
            eff = self._replay(p)
            self._verdicts(txn, eff)
        if txn.atomicity != NONE:  # atomicity "none" takes no locks: the later commit wins per key
            self.key_conflicts.check(
                txn.id, txn.snapshot, eff.added, self._policies({m.table for m in eff.added.values()})
            )
        return Plan(eff, self._checked_keys(eff))

    def _check_not_dropped(self, txn: RunningTxn, table: str) -> None:
        """A transaction writing (or dropping) a table that was dropped after its snapshot loses to
        the drop, whether or not a table of that name was created again since."""
        drop = self.state.dropped_since(table, txn.snapshot)
        if drop is None and self.state.tables.get(table) is None:
            rec = self.state.record(table)
            drop = rec if isinstance(rec, TableDropped) else None
        if drop is not None:
            raise ConflictError(
                f"transaction {txn.id} lost to {drop.tid} on table {quote(table)}: the table was dropped at CSN "
                f"{drop.csn} (after this transaction's snapshot {txn.snapshot})",
                winner=drop.tid,
                kind=str(ConflictKind.TABLE_DROPPED),
                table=table,
                csn=drop.csn,
            )

    def _verdicts(self, txn: RunningTxn, eff: Effect) -> bool:
        """Apply the conflict rules to every target; raise on a loss; True if a rebase is needed."""
        rebase = False
        summaries = eff.summaries(txn.id)
        policies = self._policies({t for t, _ in summaries} | eff.whole_tables)
        for (table, pkey), later in sorted(summaries.items()):
            winners = self.state.winners(table, pkey, txn.snapshot)
            v = check(policies[table], later, winners)
            if not v.ok:
                where = f"table {quote(table)}" + (f" partition {pkey}" if pkey != "[]" else "")
                raise ConflictError(
                    f"transaction {txn.id} lost to {v.winner} on {where}: {v.reason}",
                    winner=v.winner,
                    kind=str(v.kind),
                    table=table,
                    partition=pkey,
                )
            rebase |= v.rebase
        if rebase or not eff.whole_tables:
            return rebase
        targets = whole_table_targets(policies, eff.whole_tables, list(self.state.conflict_history))
        return any(self.state.winners(t, pk, txn.snapshot) for t, pk in targets)

    def _fits_beside(self, txn: RunningTxn, eff: Effect, in_batch: dict[tuple[str, str], list[Summary]]) -> bool:
        """Whether a member whose checked targets members already accepted into this batch also
        touch may share their multi (:func:`coordinator.core.conflicts.fits_beside`)."""
        summaries = eff.summaries(txn.id)
        policies = self._policies({t for t, _ in summaries} | eff.whole_tables)
        if self.key_conflicts.shares_target(policies, summaries, in_batch):
            return False  # keys: a key in common is decided against the committed state, in the next batch
        return fits_beside(policies, summaries, eff.whole_tables, in_batch)

    # -- serializable transactions (coordinator/core/readsets.py) ------------------------------------
    @staticmethod
    def _serializable(p: Pending) -> bool:
        """A member whose read set is checked: it read something and writes something."""
        return p.txn is not None and bool(p.txn.reads) and bool(p.txn.ops)

    def _catch_up_for_reads(self) -> None:
        """Apply the log up to its end before deciding read sets: a ``parts`` INSERT committed by
        another replica moves no target node, so only the log itself shows it."""
        try:
            self.catch_up()
        except MergetxnError as exc:
            raise VersionMoved(f"could not catch up with the log to decide a read set: {exc}") from exc

    def _read_counters(self, members: list[Pending]) -> dict[str, int]:
        """The write counters of every table a serializable member read, as ZooKeeper has them."""
        keys = {counter_key(r.table) for p in members if self._serializable(p) for r in p.txn.reads}
        try:
            found = self.log.ensure_counters(keys)
        except UNKNOWN_OUTCOME as exc:
            raise VersionMoved(f"ZooKeeper connection lost while reading write counters: {quote(exc)}") from exc
        self._counters |= keys
        return found

    def _counters_bumped(self, writing: set[str], dropping: set[str]) -> set[str]:
        """The write counters a batch bumps: of every ``parts`` table written (their INSERTs move
        no target) and every table dropped; created first where this replica never saw them."""
        keys = {counter_key(t) for t in writing if self._policy(t) is Policy.PARTS}
        keys |= {counter_key(t) for t in dropping}
        if keys - self._counters:
            try:
                self.log.ensure_counters(keys - self._counters)
            except UNKNOWN_OUTCOME as exc:
                raise VersionMoved(f"ZooKeeper connection lost while creating write counters: {quote(exc)}") from exc
            self._counters |= keys
        return keys

    def _shapes(self, tables) -> dict[str, Shape]:
        out = {}
        for t in tables:
            tdef = self.state.tables.get(t)
            if tdef is not None:
                out[t] = Shape(
                    tuple(tdef.partition_by),
                    tdef.schema,
                    tuple(tdef.primary_key) if tdef.conflict_policy is Policy.KEYS else None,
                )
        return out

    def _known_pkeys(self, table: str) -> set[str]:
        return self.state.partition_keys(table)

    def _read_keys(self, p: Pending) -> set[str]:
        """Targets a serializable member checks and bumps for its reads (readsets.read_keys)."""
        if not self._serializable(p):
            return set()
        tables = {r.table for r in p.txn.reads}
        return read_set_keys(p.txn.reads, {t: self._known_pkeys(t) for t in tables}, self._shapes(tables))

    def _check_reads(self, p: Pending) -> None:
        """Fail a serializable member whose read set a commit after its snapshot changed: every
        part of a table it read added or removed since, except by compactions (they change no
        row), decided by readsets.check_reads."""
        if not self._serializable(p):
            return
        txn = p.txn
        tables = {r.table for r in txn.reads}
        touched: list[Touch] = []
        with self.state.lock:
            compacted, changed = set(), set()  # tids that only compacted these tables, and others
            for (t, _), events in self.state.conflict_history.items():
                if t in tables:
                    for csn, s in events:
                        if csn > txn.snapshot:
                            (compacted if s.kinds <= COMPACTIONS else changed).add(s.tid)
            compactions = compacted - changed
            for t in tables:
                for name in self.state.by_table.get(t, ()):
                    rec = self.state.parts.get(name)
                    if rec is None:
                        continue
                    m = rec.meta
                    if rec.creation_csn > txn.snapshot and m.creation_tid not in compactions:
                        touched.append(Touch(m.creation_tid, rec.creation_csn, t, name, m.partition, m.stats, True))
                    if (
                        rec.removal_csn is not None
                        and rec.removal_csn > txn.snapshot
                        and rec.removal_tid not in compactions
                    ):
                        touched.append(Touch(rec.removal_tid, rec.removal_csn, t, name, m.partition, m.stats, False))
        lost = check_reads(txn.id, txn.reads, touched, self._shapes(tables))
        if lost is not None:
            raise lost

    def _checked_keys(self, eff: Effect) -> set[str]:
        summaries = eff.summaries("")
        policies = self._policies({t for t, _ in summaries} | eff.whole_tables)
        return checked_keys(policies, summaries, eff.whole_tables, self.state.live)

    def _replay(self, p: Pending) -> Effect:
        """Re-apply the transaction's operations on the parts as they are now."""
        from parts.io import rewrite

        txn = p.txn
        eff = Effect()
        for op in txn.ops:
            tdef = self.table(op.table)
            if tdef.conflict_policy is Policy.PARTS or isinstance(op, Insert):
                eff.add_op(op, self._pkeys_of(txn, op.removed, eff.added))
                continue
            pkeys = None if op.whole_table else op.partitions
            own_removed = set(eff.removed) | {m.name for m in eff.discarded}
            current = self.state.visible(
                op.table, self.state.applied, txn.id, list(eff.added.values()), own_removed, pkeys
            )
            if isinstance(op, Overwrite | Truncate):
                new_added = {m.name for m in op.added}
                op = replace(op, removed=tuple(m.name for m in current if m.name not in new_added))
            elif not set(op.removed) <= {m.name for m in current}:
                p.extra_files.extend(op.added)  # the staged output is superseded: delete it too
                csns = self.state.creation_csns(m.name for m in current)  # a keys table's compaction orders by them
                op = rewrite.redo(self.storage, tdef, op, current, txn.id, csns)
                p.extra_files.extend(op.added)
            eff.add_op(op, self._pkeys_of(txn, op.removed, eff.added))
        return eff
