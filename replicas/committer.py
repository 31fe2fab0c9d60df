"""Group commit: the commits waiting on one replica share one ZooKeeper multi and one CSN.

One thread (replicas/commit_queue.py) takes every commit that is waiting; the committer decides
each with the conflict rules against the commits that happened since its snapshot, and writes
all accepted ones in one multi (see :mod:`coordinator.zk.log`). Two members of a batch never
check the same target, so their verdicts cannot depend on each other: a member that would is held
for the next batch. Which members share the multi, and what it expects, is decided from typed
summaries of the members by :mod:`coordinator.core.batching` (pure); here is the planning of each
member against the state, and the I/O around it. When a checked target moved between our read
and the multi, the whole batch is decided again (tenacity). CREATE and ALTER TABLE go through the
same queue, one at a time (replicas/table_changes.py).

When the rules let a later transaction succeed after something committed on its target, the
transaction is rebased: its operations are replayed on the current parts. Inserts and overwrites
replay as metadata; a delete, update or compaction whose input parts are still there keeps the
parts it wrote; only one whose inputs were rewritten meanwhile is redone on the current parts.

If the connection to ZooKeeper drops during the multi, the outcome is looked up in the log
(after a ``sync``) before anybody is answered (replicas/commit_outcome.py): the caller learns
committed or not, never unknown.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tenacity import Retrying

from coordinator.core import batching, jsonwire, retries
from coordinator.core.batching import Composition, Member
from coordinator.core.conflicts import (
    check_app_versions,
)
from coordinator.core.errors import (
    ConflictError,
    MergetxnError,
    StorageError,
    TransactionAborted,
    quote,
    storage_error,
)
from coordinator.core.targets import (
    MAX_MULTI_BYTES,
    MULTI_ROOM,
    app_key,
    multi_bytes,
    too_many_targets,
)
from coordinator.core.versions import incarnation_of
from coordinator.model.catalog import TableDef, TableDropped
from coordinator.model.records import (
    Compact,
    DropTable,
    LogEntry,
    TxnRecord,
    TxnState,
)
from coordinator.model.znodes import TOMBSTONE
from coordinator.zk.log import (
    CommitResult,
    OwnerFenced,
    TableMoved,
    VersionMoved,
)
from coordinator.zk.orphan_fence import FenceMoved
from parts.io.format import delete_part
from parts.model.meta import bundle_path, sidecar_path
from replicas import failpoints
from replicas.commit_outcome import UNKNOWN_OUTCOME, LostAnswers
from replicas.commit_queue import ASYNC_PER_BATCH, MAX_BATCH, CommitQueue, Pending
from replicas.commit_rules import CommitRules, Plan
from replicas.context import ReplicaContext, ReplicaPart
from replicas.keylocks import KeyConflicts
from replicas.metrics import CommitStats
from replicas.running import RunningTxn
from replicas.table_changes import TableChanges, commit_too_large, spilled

if TYPE_CHECKING:
    from replicas.follower import Follower
    from replicas.registry import Transactions
    from replicas.zksession import ZkSession

log = logging.getLogger(__name__)

__all__ = ["ASYNC_PER_BATCH", "MAX_BATCH", "UNKNOWN_OUTCOME", "Committer", "NeedKeys", "Pending", "commit_too_large"]

LOCAL_OFF_BATCHES = 64  # after a first attempt on local versions missed: batches that read them from ZooKeeper
RETRY_WAIT = 0.005  # seconds, at most, between attempts of a batch that lost a race


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
class _Reading:
    """What an attempt read before deciding its members: the checked targets' versions (from
    ZooKeeper, or as applied here when ``local``), the write counters of the tables read, the
    applied CSN and table versions before any decision, the incarnation every member must hold,
    and the orphan fence (version and condemned files) the staged files are verified against."""

    local: bool
    versions: dict[str, int | None]
    read_counters: dict[str, int]
    applied_before: int
    table_versions: dict[str, int]
    incarnation: int
    fence: int
    condemned: frozenset[str]


@dataclass
class _Batch:
    """An attempt's accepted members with their plans, and what their multi writes."""

    accepted: list[tuple[Pending, Plan, Member]]
    deferred: list[Pending]
    expected: dict[str, int | None] = field(default_factory=dict)
    tables: dict[str, tuple[int, bytes | None]] = field(default_factory=dict)
    entry: LogEntry | None = None  # None: nothing to write (members too large were failed)
    encoded: bytes = b""
    counters_checked: dict[str, int] = field(default_factory=dict)
    writing: set[str] = field(default_factory=set)
    dropping: set[str] = field(default_factory=set)


class Committer(CommitRules, ReplicaPart):
    """The group committer of one replica: batches commits into one ZooKeeper multi each."""

    def __init__(
        self,
        context: ReplicaContext,
        follower: Follower,
        zk_session: ZkSession,
        transactions: Transactions,
        fenced: Callable[[int], None],
    ) -> None:
        """``fenced``: told when the owner node says another incarnation took over; the fence,
        ``table``, ``catch_up``, ``wait_snapshot`` and ``incarnation`` are the context's."""
        ReplicaPart.__init__(self, context)
        self.follower = follower
        state, log, storage = context.state, context.log, context.storage
        self.zk_session, self.transactions, self.fence = zk_session, transactions, context.fence
        self.table, self.catch_up, self.wait_snapshot = context.table, context.catch_up, context.wait_snapshot
        self.incarnation, self.fenced = context.incarnation, fenced
        self.queue = CommitQueue(self._handle, self._fail)
        self._queue, self._thread = self.queue.items, self.queue.thread  # as tests look at them
        self.answers = LostAnswers(log, follower, state, zk_session)
        self.ddl = TableChanges(context, follower, self._retrying)
        self.batches = 0
        self.committed = 0
        self.local_misses = 0  # first attempts on locally applied target versions that ZooKeeper refused
        self.stats = CommitStats()  # written by this thread only (replicas/metrics.py)
        self._local_off_until = 0  # batch count before which first attempts read versions from ZooKeeper
        self._counters: set[str] = set()  # write counters known to exist (coordinator/core/readsets.py)
        self.key_conflicts = KeyConflicts(self.state, storage, context.table)  # keys tables
        self._node_prefix = len(log.zk.chroot or "") + len(log.path("targets", ""))  # of a multi op's path

    def start(self) -> None:
        self.queue.start()

    def stop(self) -> None:
        self.queue.stop()

    # -- entry points ------------------------------------------------------------------------
    def submit(self, txn: RunningTxn) -> int:
        return self.queue.wait(Pending(txn=txn))

    def submit_async(self, txn: RunningTxn, done: Callable[[int | None, Exception | None], None]) -> None:
        """Queue a commit; ``done(csn, error)`` is called once it is decided (the RPC server
        answers from it without a thread waiting per commit)."""
        self.queue.put(Pending(txn=txn, callback=done))

    def create_table(self, tdef: TableDef) -> int:
        return self.queue.wait(Pending(table=tdef))

    def alter_table(self, name: str, add_columns: Any, rename_columns: Any, options: Any = None) -> int:
        return self.queue.wait(Pending(alter=(name, add_columns, rename_columns, options)))

    def _handle(self, batch: list[Pending]) -> list[Pending]:
        """Decide and write one batch the queue took; return the members deferred."""
        first = batch[0]
        if first.table is not None:
            self.ddl.create(first, first.table)
        elif first.alter is not None:
            self.ddl.alter(first, first.alter)
        else:
            return self._commit_batch(batch)
        return []

    def _retrying(self, made: int = 0, first_wait: float = 0.0) -> Retrying:
        """The one retry policy of a commit: a batch (or a table creation) is decided again after
        a version miss or when it needs more target versions, up to 500 times (``made`` of them
        already, outside the policy) or 2 minutes, with a short random wait (``first_wait``
        before its first attempt: none after a refused first attempt on local versions, which
        reads them from ZooKeeper next, wait enough)."""
        return retries.commit_attempts(
            lambda _: random.uniform(0, RETRY_WAIT), on=(VersionMoved, NeedKeys), made=made, first_wait=first_wait
        )

    # -- transactions ------------------------------------------------------------------------
    def _commit_batch(self, batch: list[Pending]) -> list[Pending]:
        """Decide and commit a batch, again while it loses races; fail its members if it cannot
        get through. Returns those deferred to the next batch.

        The first attempt is made outside the retry policy: most batches get through on it, and
        the policy's bookkeeping (tenacity's state per attempt) was a tenth of the committer's
        CPU per commit (measured with benchmarks/commit_throughput.py --profile). It decides on the
        target versions this replica has applied (no round trip) unless a recent one was
        refused; later attempts read them from ZooKeeper."""
        deferred: list[Pending] = []
        local_first = self.batches >= self._local_off_until
        try:
            try:
                deferred = self._try(batch, local_first)
            except (VersionMoved, NeedKeys) as exc:
                local_miss = local_first and isinstance(exc, _LocalMiss)
                first_wait = 0.0 if local_miss else random.uniform(0, RETRY_WAIT)
                for attempt in self._retrying(made=1, first_wait=first_wait):
                    with attempt:
                        deferred = self._try(batch, False)
        except (VersionMoved, NeedKeys) as exc:
            why = f"commit could not get through contention: {exc}"
            self._fail_rest(batch, lambda p: TransactionAborted(why))
        except StorageError as exc:  # no room for the entry in the WAL: nothing was committed
            log.warning("%s", exc)
            refused = exc
            self._fail_rest(batch, lambda p: refused)
        except _Fenced as exc:
            # Another replica decided these transactions (aborted) while this one looked gone:
            # the multi did not happen and never will under that incarnation.
            incarnation, why = exc.incarnation, str(exc)
            self._fail_rest(
                batch,
                lambda p: TransactionAborted(
                    f"transaction {p.committing.id} did not commit: replica {self.host_id}'s incarnation "
                    f"{incarnation} was fenced by another replica while this one looked gone ({why})",
                    id=p.committing.id,
                ),
            )
            self.fenced(incarnation)
        return [p for p in deferred if not p.done.is_set()]

    def _try(self, batch: list[Pending], local: bool) -> list[Pending]:
        """One attempt on the members of ``batch`` not decided yet; the deferred."""
        live = [p for p in batch if not p.done.is_set()]
        return self._attempt_noting_misses(live, local) if live else []

    def _attempt_noting_misses(self, members: list[Pending], local: bool) -> list[Pending]:
        try:
            return self._attempt(members, local)
        except _LocalMiss:
            if local:
                # Another replica committed to a target since this one applied it: read the
                # versions from ZooKeeper for a while (others write too).
                self.local_misses += 1
                self._local_off_until = self.batches + LOCAL_OFF_BATCHES
            raise

    def _fail_rest(self, batch: list[Pending], error: Callable[[Pending], Exception]) -> None:
        for p in batch:
            if not p.done.is_set():
                self._fail(p, error(p))

    def _attempt(self, members: list[Pending], local: bool = False) -> list[Pending]:
        """Decide every member, commit the accepted ones in one multi; return the deferred.

        ``local``: take the checked targets' versions from the state this replica has applied
        instead of reading them from ZooKeeper (a round trip saved per batch). The multi's
        version checks still refuse the commit if another replica committed to one of them
        since (``_LocalMiss``); the state must not change while the batch is decided, which the
        applied CSN, read before and checked under the state lock after, tells."""
        r = self._read(members, local)
        plans: dict[int, Plan] = {}
        c = batching.compose(
            members,
            lambda p: p.committing.async_session,
            lambda p: self._summarize(p, r, plans),
            r.versions,
            r.read_counters,
            self.state.versions.get if local else None,
            lambda p, missing: p.key_hints.update(missing),
        )
        deferred = [p for p, _ in c.deferred]
        if not c.accepted:
            if c.stalled:
                raise NeedKeys("re-reading target versions")
            return deferred
        b = self._prepare(c, plans, r, deferred)
        if b.entry is None:
            return b.deferred
        csn = self._write(b, r, b.entry)
        self._finish(b, csn)
        self._sync_wal(csn)
        return deferred

    def _read(self, members: list[Pending], local: bool) -> _Reading:
        """Everything an attempt reads before deciding (see :class:`_Reading`)."""
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
        table_versions = {t: self.ddl.table_version(t) for p in members for t in {op.table for op in p.committing.ops}}
        incarnation = self.incarnation()  # the owner node's version every member must hold
        fence, condemned = self.fence.current()  # read before the files are verified
        versions = self._target_versions(wanted, local)
        if self.state.failure is not None:
            raise self.state.failure
        return _Reading(local, versions, read_counters, applied_before, table_versions, incarnation, fence, condemned)

    def _target_versions(self, wanted: set[str], local: bool) -> dict[str, int | None]:
        """The versions of the targets ``wanted``: as applied here (``local``), or read from
        ZooKeeper, once this replica applied up to them."""
        if local:
            return {k: self.state.versions.get(k) for k in wanted}
        try:
            versions = self.log.read_versions(sorted(wanted)) if wanted else {}
        except UNKNOWN_OUTCOME as exc:  # nothing written yet: wait for the session, go round again
            self.zk_session.connected.wait(self.config.session_timeout)
            raise VersionMoved(f"ZooKeeper connection lost while reading target versions: {quote(exc)}") from exc
        if versions:
            self.follower.poke()
        if versions and not self.state.wait_versions(versions, self.config.read_wait_seconds):
            raise VersionMoved("this replica did not catch up with the targets' versions in time")
        return versions

    def _summarize(self, p: Pending, r: _Reading, plans: dict[int, Plan]) -> Member | None:
        """Plan a member against the state and summarise it for batching; None (and the member
        failed) when it cannot commit."""
        try:
            if incarnation_of(p.committing.tid) != r.incarnation:  # (its Tid as begun: not parsed again)
                raise TransactionAborted(
                    f"transaction {p.committing.id} was begun by an earlier incarnation of replica {self.host_id} "
                    "(its ZooKeeper session expired since): it can no longer commit",
                    id=p.committing.id,
                )
            plan = self._plan(p)
            self._verify_files(p, plan, r.fence, r.condemned)
            duplicate = check_app_versions(p.committing.id, p.committing.apps, self.state.apps)
            if duplicate is not None:
                raise duplicate
            self._check_reads(p)
        except MergetxnError as exc:
            self._fail(p, exc)
            return None
        member = self._member(p, plan)
        size = multi_bytes([*member.keys, *member.writes], self._node_prefix)
        if size > MAX_MULTI_BYTES - MULTI_ROOM:  # alone over ZooKeeper's request bound: never sent
            self._fail(p, too_many_targets(p.committing.id, len(member.keys), size))
            return None
        plans[id(p)] = plan
        return member

    def _member(self, p: Pending, plan: Plan) -> Member:
        """The typed summary of a planned member (:class:`coordinator.core.batching.Member`)."""
        txn, eff = p.committing, plan.effect
        drops = tuple(op.table for op in txn.ops if isinstance(op, DropTable))
        return Member(
            txn.id,
            checked=frozenset(plan.checked),
            app_keys=frozenset(app_key(a) for a in txn.apps),
            reading=frozenset(self._read_keys(p)),
            read_tables=frozenset(r.table for r in txn.reads),
            writes=frozenset({op.table for op in txn.ops} - set(drops)),
            drops=drops,
            targets=plan.summaries,
            whole_tables=frozenset(eff.whole_tables),
            policies=plan.policies,
            keys_written=self.key_conflicts.planned(txn.id),
            async_session=txn.async_session,
        )

    def _prepare(self, c: Composition[Pending], plans: dict[int, Plan], r: _Reading, deferred: list[Pending]) -> _Batch:
        """The multi of the accepted members: the versions it expects, its table checks and drop
        tombstones, and its entry. ``entry`` None: members too large were failed, and the batch
        is decided again without them (``deferred``: all but those)."""
        accepted = [(p, plans[id(p)], m) for p, m in c.accepted]
        expected = self._expected(c, r, accepted)
        tables, drops = batching.table_writes([m for _, _, m in accepted], c.writing, r.table_versions)
        now = time.time()
        txns = [
            TxnRecord(
                p.committing.id, now if m.data_change else None, tuple(plan.effect.changes()), dict(p.committing.apps)
            )
            for p, plan, m in accepted
        ]
        entry = LogEntry(
            time=now,
            versions=batching.new_versions(expected),
            txns=tuple(txns),
            ddl=tuple(TableDropped(t, tid, v) for t, tid, v in drops),
        )
        encoded = entry.encode()  # this replica applies its own commit from these
        if len(encoded) > self.config.max_commit_bytes:
            too_large = self._too_large([p for p, _, _ in accepted], txns)
            if too_large:  # fail those, decide the others again (nothing was written yet)
                rest = deferred + [p for p, _, _ in accepted if all(p is not q for q in too_large)]
                return _Batch([], rest)
        written = {t: (v, TOMBSTONE if dropped else None) for t, (v, dropped) in tables.items()}
        return _Batch(accepted, deferred, expected, written, entry, encoded, c.counters_checked, c.writing, c.dropping)

    def _expected(
        self, c: Composition[Pending], r: _Reading, accepted: list[tuple[Pending, Plan, Member]]
    ) -> dict[str, int | None]:
        """The versions the multi expects of the targets taken (batching.expected_versions);
        NeedKeys when a table-level version was not read, and local: the state did not move."""
        local = self.state.versions.get if r.local else None
        expected, table = batching.expected_versions(c.taken, r.versions, local)
        if table is not None:
            for p, _, _ in accepted:
                p.key_hints.add(table)
            raise NeedKeys(f"table-level version of {table}")
        if r.local and expected and not self.state.unchanged_since(r.applied_before):
            raise _LocalMiss("entries were applied while the batch was decided: deciding again")
        return expected

    def _write(self, b: _Batch, r: _Reading, entry: LogEntry) -> int:
        """The commit multi of batch ``b`` (its log ``entry``), handed over to this replica's follower; its CSN, once
        known even if the connection was lost during it (replicas/commit_outcome.py)."""
        counters = (b.counters_checked, self._counters_bumped(b.writing, b.dropping))
        ops = multi_bytes([*b.expected, *b.tables, *counters[0], *counters[1]], self._node_prefix)
        data = spilled(self.storage, b.encoded, MAX_MULTI_BYTES - MULTI_ROOM // 2 - ops)
        self._check_wal_room(b, max(len(data), len(b.encoded)))
        failpoints.hit("before_commit_multi")
        try:
            with self.follower.local_commit() as hand_over:
                result = self._multi(data, b, r, counters)
                if failpoints.ON and self._flushes(b):  # a flush in the log, not applied here yet
                    failpoints.hit("flush_after_multi")  # (tests/faults/test_inline_faults.py)
                # WAL (written, fsynced once answered: _sync_wal) + apply, here if it can
                hand_over(result.epoch, result.seq, data, (entry, b.encoded), sync=False)
        except TableMoved as exc:
            # Caught up only once out of local_commit: inside it the follower holds off (and so
            # does this catch-up's own pull), so another replica's DDL not applied yet was waited
            # for until read_wait_seconds ran out (tests/faults/test_follower_hold.py).
            self.ddl.catch_up_tables(exc.tables)  # then decide again on the definitions as they are
            raise
        except UNKNOWN_OUTCOME as exc:
            csn = self.answers.resolve(b.accepted[0][0].committing.id, exc)
            if csn is None:
                raise VersionMoved("the commit multi did not happen; trying again") from exc
            return csn
        return result.csn

    def _check_wal_room(self, b: _Batch, size: int) -> None:
        """Refuse batch ``b`` with StorageError, nothing committed, when this replica's WAL has
        no room for its entry's record: committed, the entry could not be applied here, nor
        its commit answered, until space is freed."""
        wal = self.follower.wal
        try:
            wal.check_room(size)
        except OSError as exc:
            err = storage_error(exc, "append", str(wal.path), f"the WAL of replica {self.host_id}")
            ids = ", ".join(p.committing.id for p, _, _ in b.accepted)
            raise StorageError(
                f"transaction(s) {ids} did not commit: replica {self.host_id}'s WAL disk has no room for the "
                f"commit's record; free space there. {err.message}",
                **err.details,
            ) from None

    def _flushes(self, b: _Batch) -> bool:
        """Whether batch ``b`` merges inlined parts (a flush of small writes); for failpoints."""
        parts = self.state.parts
        return any(
            isinstance(op, Compact) and any(n in parts and parts[n].meta.inlined for n in op.removed)
            for p, _, _ in b.accepted
            for op in p.committing.ops
        )

    def _multi(self, data: bytes, b: _Batch, r: _Reading, counters: tuple[dict[str, int], set[str]]) -> CommitResult:
        """:meth:`CsnLog.commit` of the batch, its refusals turned into what the retry loop does
        next: decide again (after catching up on the tables, :meth:`_write`, or re-verifying the
        files), or stop (fenced)."""
        try:
            return self.log.commit(
                data,
                b.expected,
                r.fence,
                owner=(self.log.replica_path(self.host_id), r.incarnation),
                tables=b.tables,
                counters=counters,
            )
        except OwnerFenced as exc:
            raise _Fenced(r.incarnation, str(exc)) from exc
        except FenceMoved as exc:
            self.fence.refresh()  # then every staged file is verified again
            raise VersionMoved(str(exc)) from exc
        except VersionMoved as exc:
            if r.local and b.expected:
                raise _LocalMiss(str(exc)) from exc
            raise

    def _finish(self, b: _Batch, csn: int) -> None:
        """Answer the members of a committed batch, once it is applied here; delete the files
        their plans staged and no longer need."""
        failpoints.hit("after_commit_multi")  # in the log, not yet answered (tests/faults/test_sessions.py)
        self.state.wait_applied(csn, self.config.read_wait_seconds)
        self.batches += 1
        if log.isEnabledFor(logging.INFO):  # the names joined only for a line that is written
            log.info(
                "committed a batch of %d transaction(s) at CSN %d: %s%s",
                len(b.accepted),
                csn,
                ", ".join(p.txn.id if p.txn is not None else "?" for p, _, _ in b.accepted[:5]),
                ", ..." if len(b.accepted) > 5 else "",
            )
        now = time.monotonic()
        for p, plan, _ in b.accepted:
            self.committed += 1
            self.stats.observe(now - p.queued)
            self.transactions.finish(p.committing, TxnState.COMMITTED, csn=csn)
            for meta in plan.effect.discarded + p.extra_files:
                if meta.name not in plan.effect.added and not meta.inlined:
                    delete_part(self.storage, meta.path)
            p.resolve(csn)

    def _sync_wal(self, csn: int) -> None:
        """Fsync the WAL record of the batch's own entry (CSN ``csn``), written unsynced and
        answered already: the entry is durable in ZooKeeper's log, and a replica that restarts
        applies the log up to its end before it serves anything, so what the WAL lost in a
        crash is fetched again (docs/guarantees.md, "Read your writes"). Fsynced before the
        next batch is decided all the same, so the WAL never lags more than one entry of its
        own. The fsync overlaps the answer's way to the client and the client's next request."""
        failpoints.hit(
            "before_own_wal_sync", csn
        )  # answered, not fsynced (tests/faults/test_answer_before_wal_sync.py)
        try:
            self.follower.wal.sync()
        except OSError as exc:  # the WAL only caches the log: a restart fetches the entry again
            log.warning("fsync of the WAL after committing CSN %d failed: %r", csn, exc)

    def _verify_files(self, p: Pending, plan: Plan, fence: int, condemned: frozenset[str]) -> None:
        """Refuse a member whose staged files cleanup condemned or deleted as orphans (a replica
        that stalled between staging and committing). Checked against fence version ``fence``,
        which the multi checks too: see coordinator/zk/orphan_fence.py for why that closes the race."""
        staged = [  # an inlined part has no file: its content is in the entry itself
            m for op in p.committing.ops for m in op.added if m.name in plan.effect.added and not m.inlined
        ]
        if not staged:
            return
        for m in staged:
            if m.path in condemned or sidecar_path(m.path) in condemned or bundle_path(m.path) in condemned:
                raise TransactionAborted(
                    f"transaction {p.committing.id} cannot commit: cleanup took its part {m.name} ({m.path}) for an "
                    "orphan (the transaction looked abandoned: its replica stalled longer than the grace "
                    "period); nothing of it was committed",
                    id=p.committing.id,
                    part=m.name,
                )
        if p.files_verified_at == fence:
            return
        bundles = {path for op in p.committing.ops if isinstance(op, Compact) for _, path, _ in op.spilled}
        gone = self.storage.missing([m.path for m in staged] + sorted(bundles))  # a flush's bundle too
        if gone:
            raise TransactionAborted(
                f"transaction {p.committing.id} cannot commit: its part file {gone[0]} is gone from storage "
                "(collected by cleanup as an orphan, or deleted by hand); nothing of it was committed",
                id=p.committing.id,
                path=gone[0],
            )
        p.files_verified_at = fence

    def _too_large(self, accepted: list[Pending], txns: list[TxnRecord]) -> list[Pending]:
        """Fail the members whose record in the entry is over ``max_commit_bytes`` (what one
        commit adds to the log and to every WAL) with InvalidInput naming the setting; return
        them. A batch of members each under the limit commits whatever its total."""
        limit = self.config.max_commit_bytes
        sizes = [len(jsonwire.dumps(rec.to_dict())) for rec in txns]
        failed = []
        for i in batching.oversized(sizes, limit):
            p = accepted[i]
            self._fail(p, commit_too_large(f"transaction {p.committing.id}", sizes[i], limit, id=p.committing.id))
            failed.append(p)
        return failed

    def _fail(self, p: Pending, exc: Exception) -> None:
        self.stats.failure(
            exc.details.get("kind") if isinstance(exc, ConflictError) else None, conflict=isinstance(exc, ConflictError)
        )
        if p.txn is not None:
            self.transactions.commit_failed(p.txn, str(exc), "conflict" if isinstance(exc, ConflictError) else "failed")
            for meta in p.extra_files:
                delete_part(self.storage, meta.path)
        p.resolve(error=exc)
