"""A running transaction's life on its replica: begun (a begin sent again with its token gets the
same one), looked up, limited in time, rows and per user, rolled back, aborted, killed, reaped when
its client session lapses, and retired; the registry's fields (:class:`TxnLifecycle`, the base of
``Transactions`` in replicas/registry.py).

``_txn_lock`` orders begin and retire among writers (lookups need no lock), and is the lock under
which the snapshots in use are computed for the alive node (replicas/leases.py, through
:meth:`TxnLifecycle.begins_held`), so a published value never exceeds the snapshot of a
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
from typing import TYPE_CHECKING, Protocol

from coordinator.core.errors import (
    InvalidInput,
    QuotaExceeded,
    ReplicaUnavailable,
    TransactionAborted,
    TransactionNotFound,
)
from coordinator.core.versions import Tid, local_counter
from coordinator.model.atomicity import FULL, SYNC, check_modes, check_session, mismatch
from coordinator.model.records import (
    CommitStatus,
    StagedOp,
    TxnState,
)
from parts.io.format import delete_part
from parts.model.meta import PartMeta
from replicas.context import ReplicaContext, ReplicaPart
from replicas.metrics import abort_kind
from replicas.running import RunningTxn
from replicas.sessions import Sessions, check_session_id

if TYPE_CHECKING:
    from coordinator.core.grants import Grantee
    from replicas.async_commits import AsyncCommits
    from replicas.wal import Wal
    from replicas.zksession import ZkSession

log = logging.getLogger(__name__)

# A client sends a token with each begin; a begin sent again with it (its answer was lost) gets
# the transaction the first one began, for this long after it, among this many recent tokens.
BEGIN_TOKEN_SECONDS = 60.0
BEGIN_TOKENS_MAX = 100_000


class Committing(Protocol):
    """What the registry needs of the replica's group committer (replicas/committer.py)."""

    def submit(self, txn: RunningTxn) -> int:
        """Commit ``txn``; its CSN once committed."""
        ...

    def submit_async(self, txn: RunningTxn, done: Callable[[int | None, Exception | None], None]) -> None:
        """Queue ``txn``'s commit; ``done(csn, error)`` once it is decided."""
        ...


class TxnLifecycle(ReplicaPart):
    """The registry's fields and the begin, lookup and end of its transactions."""

    def __init__(
        self,
        context: ReplicaContext,
        zk_session: ZkSession,
        async_commits: AsyncCommits,
        ensure_applied: Callable[[], None],
        on_begin: Callable[[RunningTxn], None],
        on_end: Callable[[RunningTxn], None],
        outcome: Callable[[str, bool], CommitStatus],
        committer: Callable[[], Committing | None],
        wal: Callable[[], Wal | None],
    ) -> None:
        """From the context: ``table``, the table lookup (waits for a table created elsewhere);
        ``watermark``, the ``gc`` node (a snapshot is served only at or above it); ``incarnation``,
        this replica's now. ``ensure_applied``: catch up to cleanup's watermark before serving a
        snapshot; ``on_begin``/``on_end``: the history's event hooks; ``outcome``: any transaction's
        outcome (tid, forward); ``committer`` and ``wal``: as they are once the replica started.
        The late-bound ones are callables: those satellites are made after the registry, or at
        start."""
        super().__init__(context)
        self.zk_session, self.table = zk_session, context.table
        self.watermark, self.async_commits, self.incarnation = context.watermark, async_commits, context.incarnation
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
    def committer(self) -> Committing:
        """The replica's group committer (made when it starts)."""
        committer = self._committer()
        assert committer is not None
        return committer

    # -- begin and lookup ------------------------------------------------------------------
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

    def mismatch(self, txn: RunningTxn) -> InvalidInput | None:
        """Why ``txn``'s atomicity and that of a table it writes disagree, if they do
        (coordinator/model/atomicity.py), against the tables as this replica has them now."""
        return mismatch(txn.id, txn.atomicity, list(txn.ops), self.state.tables.get)

    def ready_to_begin(self) -> bool:
        """Whether :meth:`begin` would answer at once (it waits while ZooKeeper is away or the
        cleanup watermark is ahead of this replica)."""
        return self.zk_session.usable() and self.watermark.watermark <= self.state.applied

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
        """Its own staged files are deleted before it reads as aborted: whoever sees the outcome
        (``commit_status``, the client's commit) finds them gone."""
        for op in txn.ops + extra_ops:
            for meta in op.added:
                if not meta.inlined and self._its_own_file(txn, meta):
                    delete_part(self.storage, meta.path)
        txn.state, txn.reason = TxnState.ABORTED, reason
        kind = kind or abort_kind(reason)
        with self._aborted_lock:
            self._aborted[kind] += 1
        log.info("transaction %s aborted (%s): %s", txn.id, kind, reason)
        self._retire(txn)

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

    def finish(self, txn: RunningTxn, state: TxnState, csn: int | None = None, reason: str = "") -> None:
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
            running = [(t, t.session) for t in self.txns.values() if t.state == TxnState.RUNNING]
            held = [(t, (t.owner, session)) for t, session in running if session is not None]
            gone = self.sessions.expired({key for _, key in held}, now)
        for txn, key in held:
            silent = gone.get(key)
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
