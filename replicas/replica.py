"""The replica: follows the log, runs transactions for its clients, serves snapshots.

This module wires a replica together and runs its life: start and stop, the ZooKeeper session,
the alive node, snapshots and tables. Its jobs are its parts, each in a module of its own name:
``transactions`` (replicas/registry.py: running transactions and the staging rules), ``leases``
(replicas/leases.py: snapshots in use), ``cleanup`` (replicas/cleanup.py), ``merges``
(replicas/merges.py), ``changefeed`` (replicas/changefeed.py: incremental reads and events), and the
follower, committer and log tail. The class's own jobs are in modules beside it: the snapshot and
table reads (replicas/snapshots.py), the recovery from local files (replicas/recovery.py) and
``info`` with the counters (replicas/replica_info.py), over the fields all of them read
(replicas/replica_fields.py).

Threads: the follower (applies the log), the committer (group commit), the log tail, a reaper
(transaction limits), the maintenance thread (merges and cleanup), and the RPC server's workers.
Running transactions live in memory only: if the process dies they are gone, and on restart every
part they wrote is removed because no commit ever named it (the WAL's ``staged`` records say
which files to remove).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NoAuthError
from kazoo.retry import KazooRetry

from coordinator.core import retries
from coordinator.core.errors import (
    InvalidInput,
)
from coordinator.core.versions import Tid, check_host_id, incarnation_of
from coordinator.model.records import (
    AliveRecord,
)
from coordinator.model.znodes import OwnerRecord
from coordinator.wire.security import zk_client_args
from coordinator.zk.alive import AliveNode, check_host_free
from coordinator.zk.log import CsnLog, PollHandler
from coordinator.zk.needed import NeededNodes
from coordinator.zk.orphan_fence import OrphanFence
from coordinator.zk.watermark import Watermark
from parts.io.storage import Storage
from replicas import checkpoint
from replicas.async_commits import AsyncCommits
from replicas.changefeed import ChangeFeed
from replicas.cleanup import Cleanup
from replicas.context import ReplicaContext
from replicas.follower import Follower
from replicas.leases import Leases
from replicas.memory import TRIM_SECONDS, trim
from replicas.merges import BUSY_SECONDS, Merges
from replicas.metrics import LogWatch
from replicas.outcomes import Outcomes
from replicas.pauses import PauseGuard
from replicas.recovery import LocalRecovery
from replicas.registry import Transactions
from replicas.replica_info import ReplicaInfo
from replicas.retention import Retention
from replicas.settings import ReplicaConfig
from replicas.snapshots import SnapshotReads
from replicas.state import ReplicaState
from replicas.users import Users
from replicas.vectors import KeysVectors
from replicas.wal import Wal
from replicas.zksession import ZkSession, connect_zk

log = logging.getLogger(__name__)

STOP_DRAIN_SECONDS = 10.0  # a graceful stop commits the async commits it accepted, waiting at most this

# A client sends a token with each begin; a begin sent again with it (its answer was lost) gets
# the transaction the first one began, for this long after it, among this many recent tokens.


class Replica(SnapshotReads, ReplicaInfo, LocalRecovery):
    """One replica: made here with its parts, started and stopped, its ZooKeeper session and alive
    node; its reads, introspection and local recovery are the jobs it inherits."""

    def __init__(self, config: ReplicaConfig) -> None:
        check_host_id(config.host_id)
        self.config = config
        self.host_id = config.host_id
        self.storage = Storage(config.storage_url, config.storage_options)
        self.state = ReplicaState(config.outcome_seconds)
        self.vectors = KeysVectors(self.state, self.storage)  # keys tables' deletion vectors, for whole reads
        self.zk_session = ZkSession()  # connected, lost, stopping: what the satellites look at
        self.incarnation = 0
        self.address = ""
        self.zk = self._make_zk()
        self.log = CsnLog(self.zk, config.root, config.epoch_size)
        self.users = self._make_users()
        self.fence = OrphanFence(self.zk, self.log.fence_path(), config.host_id)
        self.needed = NeededNodes(
            self.zk, self.log, config.credentials is not None
        )  # the fence, users and log, watched
        self.wal: Wal | None = None
        self.follower: Follower | None = None
        self.committer = None
        self.async_commits = AsyncCommits()  # durability="async": answered once queued, flushed by session
        self.watermark = Watermark(self.zk, self.log.gc_path(), self.host_id)  # the gc node: cleanup and retention
        self.context = self._make_context()  # what every part reads
        self.transactions = self._make_transactions()
        self.leases = Leases(self.context, self.transactions)
        self.retention = self._make_retention()
        self.cleanup = self._make_cleanup()
        self.merges = self._make_merges()
        self.tail: checkpoint.LogTail | None = None
        self.log_watch = self._make_log_watch()
        self.metrics_address: str | None = None  # host:port of the Prometheus endpoint, when it runs
        self.changefeed = ChangeFeed(self.context, self.retention, self.leases)
        self.outcomes = self._make_outcomes()
        self.pauses = PauseGuard(self.context, self.zk_session)
        self.alive = AliveNode(self.zk, self.log, config.host_id, self.alive_record)
        self._aborting: threading.Thread | None = None  # aborts the transactions of a lost session
        self._register_lock = threading.Lock()

    # -- construction: one function per subsystem ---------------------------------------------
    def _make_zk(self) -> KazooClient:
        """The ZooKeeper client; secured, under the replicas' identity and ACLs."""
        creds = self.config.credentials
        if creds is not None:
            # The replicas' identity in ZooKeeper: every node this replica creates (kazoo's
            # default_acl: creates, ensure_path's parents, multis and recipes alike) may be read
            # and written by that identity only. kazoo logs its auth packet at DEBUG: redact it.
            for name in ("kazoo.client", "kazoo.protocol.connection"):
                logging.getLogger(name).addFilter(creds.redactor())
        return KazooClient(
            hosts=self.config.zk,
            timeout=self.config.session_timeout,
            connection_retry=KazooRetry(max_tries=-1, max_delay=1.0),
            command_retry=KazooRetry(max_tries=5, delay=0.05, max_delay=1.0),
            handler=PollHandler(),
            default_acl=None if creds is None else creds.zk_acl(),
            **zk_client_args(creds),  # secured: TLS with the replica certificate (x509), and the digest identity
        )

    def _make_context(self) -> ReplicaContext:
        """What every part of this replica reads: its fields, shared nodes and calls on it."""
        return ReplicaContext(
            config=self.config,
            state=self.state,
            storage=self.storage,
            zk=self.zk,
            log=self.log,
            watermark=self.watermark,
            fence=self.fence,
            catch_up=self.catch_up,
            wait_snapshot=self.wait_snapshot,
            table=self.table,
            incarnation=lambda: self.incarnation,
            poke_follower=lambda: None if self.follower is None else self.follower.poke(),
            alive_record=self.alive_record,
            refresh_alive=self.refresh_alive,
        )

    def _make_users(self) -> Users | None:
        """A secured replica's users (replicas/users.py): who may log in, and with which grants; a
        dropped user's running transactions here are aborted."""
        creds = self.config.credentials
        return (
            None
            if creds is None
            else Users(self.zk, self.log.users_path(), creds, lambda names: self.transactions.users_dropped(names))
        )

    def _make_transactions(self) -> Transactions:
        """The running transactions: begin, operations, commit requests, aborts."""
        return Transactions(
            self.context,
            self.zk_session,
            self.async_commits,
            lambda: self.retention.ensure_applied(),
            lambda txn: self.changefeed.on_begin(txn),
            lambda txn: self.changefeed.on_end(txn),
            lambda tid, forward: self.outcomes.status(tid, forward=forward),
            lambda: self.committer,
            lambda: self.wal,
        )

    def _make_retention(self) -> Retention:
        """Each table's retention window and the horizons it keeps."""
        return Retention(self.context)

    def _make_cleanup(self) -> Cleanup:
        """Cleanup passes: removed parts and orphans deleted once nothing can read them."""
        return Cleanup(self.context, self.retention, self.transactions)

    def _make_merges(self) -> Merges:
        """Background merges of each partition's visible parts."""
        return Merges(
            self.state,
            self.config,
            self.storage,
            self.zk,
            self.log,
            self.host_id,
            self.transactions,
            self.table,
            self.catch_up,
            lambda event, **fields: self.changefeed.record(event, **fields),
            self.zk_session.stop,
        )

    def _make_log_watch(self) -> LogWatch:
        """The log's state as the metrics and status read it."""
        return LogWatch(
            self.context,
            lambda: None if self.wal is None else self.wal.path,
            lambda: None if self.tail is None else self.tail.tail,
        )

    def _make_outcomes(self) -> Outcomes:
        """Transactions' outcomes, answered here or forwarded to their replica."""
        return Outcomes(self.context, self.transactions)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Recover and join: claim the host id (refused while a live process holds it), replay
        the WAL, catch up from ZooKeeper, check that storage holds what the log names, and only
        then register (a new incarnation and the alive node): a start that fails before that
        leaves nothing registered. The caller binds its ports and sets ``address`` first."""
        began = time.monotonic()
        self._connect()
        # Before the WAL is opened: a second process with this host id (and maybe this data
        # directory) must not touch the live one's files or registration.
        check_host_free(self.zk, self.log, self.host_id, self.address, self.config.session_timeout)
        staged, replayed, local_csn = self._recover_local()
        self._check_root_acl()
        if self.users is not None:
            self.users.start(self._first_admin())
        self.fence.start()
        self.needed.start()
        self.tail = self._make_tail()
        self.follower = Follower(self.log, self.state, self.started_wal, self._load_manifest, self.tail.load_checkpoint)
        from_wal = self.state.applied
        self._first_pull(self.follower)
        self._check_storage()
        self._register()
        self.follower.start()
        self.tail.start()
        removed = self._remove_uncommitted(staged)
        self._start_committer(self.follower)
        self._start_maintenance()
        log.info(
            "replica %s recovered in %.1fs: local snapshot at CSN %d, %d WAL records replayed, caught up from "
            "ZooKeeper from CSN %d to %d, %d files of uncommitted transactions removed, incarnation %d",
            self.host_id,
            time.monotonic() - began,
            local_csn,
            replayed,
            from_wal,
            self.state.applied,
            removed,
            self.incarnation,
        )

    def _connect(self) -> None:
        """Connect to ZooKeeper and make sure the log's layout exists (refused under a secured
        cluster's ACLs without its credentials)."""
        self.zk.add_listener(self._on_zk_state)
        connect_zk(self.zk, self.config.zk, self.config.zk_connect_timeout)
        try:
            self.log.ensure_layout()
        except NoAuthError:
            raise InvalidInput(
                f"ZooKeeper refused access to {self.log.root}: it is under the ACLs of a secured cluster. Start "
                f"the replica with that cluster's credentials (--credentials FILE or MERGETXN_CREDENTIALS)"
            ) from None

    def _make_tail(self) -> checkpoint.LogTail:
        """The log's tail: checkpoints written and loaded, the log trimmed below them."""
        return checkpoint.LogTail(self.context, self.transactions, self.started_wal, self.retention, self.log_watch)

    def _start_committer(self, follower: Follower) -> None:
        """The committer (ZooKeeper's multis for this replica's commits), started."""
        from replicas.committer import Committer

        self.committer = Committer(self.context, follower, self.zk_session, self.transactions, self.fenced)
        self.committer.start()

    def _start_maintenance(self) -> None:
        """Cleanup and merges, their threads, the reaper and the pause guard, in that order."""
        self.cleanup.start()
        self.merges.start()
        # Merges and cleanup each have a thread: a cleanup pass deleting thousands of removed
        # parts held the merges of the thread they shared, and visible parts piled up meanwhile
        # (benchmarks/soak.py).
        merges, cleanup = self.config.merge_interval, self.config.gc_interval
        threading.Thread(
            target=self._maintain,
            args=(self.merges.background_round, merges and min(merges, BUSY_SECONDS)),
            name="merges",
            daemon=True,
        ).start()
        threading.Thread(
            target=self._maintain, args=(self.cleanup.background_pass, min(cleanup, 1.0)), name="cleanup", daemon=True
        ).start()
        threading.Thread(target=self._reaper, name="reaper", daemon=True).start()
        self.pauses.start()

    def stop(self) -> None:
        """Stop cleanly (also after a start that failed): drain async commits, stop the
        threads, end the session (the alive node goes with it) and close the WAL."""
        log.info(
            "replica %s stopping at CSN %d (%d running transactions end with it)",
            self.host_id,
            self.state.applied,
            len(self.transactions.txns),
        )
        if self.committer is not None and not self.async_commits.drain(STOP_DRAIN_SECONDS):
            log.warning("stopping with async commits still queued: they are lost (their clients' flush says so)")
        self.zk_session.stop.set()
        if self.tail is not None:
            self.tail.stop()
        if self.committer is not None:
            self.committer.stop()
        if self.follower is not None:
            self.follower.stop()
        try:
            self.zk.stop()
            self.zk.close()
        except Exception:  # pragma: no cover - shutting down anyway
            pass
        if self.wal is not None:
            self.wal.close()
        log.info("replica %s stopped", self.host_id)

    def _register(self) -> None:
        """Bump this host's incarnation and say we are alive. Tids carry the incarnation (unique
        across restarts), and every commit multi checks it (replicas/outcomes.py): transactions
        of an earlier incarnation can never commit after this."""
        node = self.log.replica_path(self.host_id)
        self.zk.retry(self.zk.ensure_path, node)
        stat = self.zk.retry(self.zk.set, node, OwnerRecord(self.host_id).encode())
        self.incarnation = stat.version
        self.alive.publish()

    def fenced(self, incarnation: int) -> None:
        """A commit multi found the owner node past ``incarnation``: another replica decided this
        one's transactions while it looked gone (its alive node was missing). Abort what runs
        under that incarnation and register a new one (once: a later call sees it moved)."""
        with self._register_lock:
            if self.incarnation != incarnation:
                return
            log.warning(
                "replica %s: incarnation %d was fenced by another replica; aborting its transactions and "
                "registering again",
                self.host_id,
                incarnation,
            )
            self._abort_incarnation(
                incarnation,
                f"replica {self.host_id}'s incarnation {incarnation} was fenced by "
                "another replica that decided its transactions (aborted) while it looked gone",
            )
            self._register()

    def _abort_incarnation(self, incarnation: int, reason: str) -> None:
        victims = [t for t in self.transactions.running_now() if incarnation_of(Tid.parse(t.id)) <= incarnation]
        self.transactions.abort_all(reason, victims, "fenced")

    def alive_record(self) -> AliveRecord:
        oldest, picked, running, overflow = self.leases.in_use()  # cleanup: snapshots in use
        with self.transactions.begins_held() as txns:
            snaps = [t.snapshot for t in txns.values()]
            applied = self.state.applied
        return AliveRecord(
            address=self.address,
            incarnation=self.incarnation,
            applied=applied,
            oldest_txn_snapshot=min(snaps) if snaps else None,
            oldest_snapshot=min(oldest, applied),
            snapshots=tuple(picked),
            running=tuple(running),
            running_overflow=overflow,
        )

    def refresh_alive(self) -> None:
        """Republish the alive node when what it says changed (the log-tail thread, each tick)."""
        self.exit_if_zookeeper_loop_died()
        self.alive.refresh()

    def exit_if_zookeeper_loop_died(self) -> None:
        """kazoo's connection thread can die of an exception it does not handle (``RuntimeError:
        xids do not match`` after a read timed out under faults, found by mergetxn chaos): the
        client then never connects again and the replica would stay up, registered and deaf. Like
        a dead RPC loop, that ends the process (status 70) so that a supervisor restarts it."""
        connection = getattr(self.zk, "_connection", None)
        stopped = getattr(connection, "connection_stopped", None)
        if stopped is None or not stopped.is_set() or self.zk._stopped.is_set() or self.zk_session.stop.is_set():
            return
        log.critical(
            "replica %s: the ZooKeeper client's connection loop died and will not reconnect; exiting "
            "(status 70) so that a supervisor restarts the replica",
            self.host_id,
        )
        logging.shutdown()
        os._exit(70)

    def set_address(self, address: str) -> None:
        """Where this replica serves (set before :meth:`start`; republished if it changes)."""
        changed = address != self.address
        self.address = address
        if changed and self.incarnation:
            self.alive.publish()

    def _on_zk_state(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            self.zk_session.connected.set()
        else:
            self.zk_session.connected.clear()
        if state == KazooState.LOST:
            self.zk_session.lost.set()
            reason = f"replica {self.host_id} lost its ZooKeeper session"
            victims = self.transactions.running_now()  # only these: a BEGIN after this belongs to the new session
            if not self.zk_session.stop.is_set():  # not the end of a clean stop
                log.warning("%s: aborting its %d running transactions", reason, len(victims))
            self._aborting = threading.Thread(
                target=self.transactions.abort_all,
                args=(reason, victims, "session_lost"),
                name="abort-all",
                daemon=True,
            )
            self._aborting.start()
        elif state == KazooState.CONNECTED and self.zk_session.lost.is_set():
            threading.Thread(target=self._after_new_session, daemon=True).start()
        if self.follower is not None:
            self.follower.poke()

    def _after_new_session(self) -> None:
        """A new session after an expired one: register a new incarnation (the transactions of
        the old one were aborted, and another replica may have decided them meanwhile) before
        beginning anything again. Retried until it works or the replica stops: begins wait."""
        for attempt in retries.reregister(self.zk_session.stop, log):
            with attempt:
                with self._register_lock:
                    self._register()
        # The lost session's transactions must be aborted before this replica counts as back
        # (the pause guard opens its gate on that): a read of one of them served from memory
        # would list parts that cleanup elsewhere took meanwhile (CorruptPart; CI, under load).
        aborting = self._aborting
        if aborting is not None:
            aborting.join()
        self.zk_session.lost.clear()

    def _reaper(self) -> None:
        """Transactions past their time aborted and idle or dropped tables' deletion vectors let go
        (every 0.5 s), the C heap trimmed (replicas/memory.py)."""
        trimmed = time.monotonic()
        while not self.zk_session.stop.wait(0.5):
            self.transactions.reap()
            self.vectors.let_go()
            if time.monotonic() - trimmed >= TRIM_SECONDS:
                trim()
                trimmed = time.monotonic()

    def _maintain(self, turn: Callable[[float], None], tick: float) -> None:
        """A maintenance thread: ``turn`` (merges: replicas/merges.py, or cleanup:
        replicas/cleanup.py, each keeping its own interval) every ``tick`` seconds (0: never)."""
        if tick <= 0:
            return
        while not self.zk_session.stop.wait(tick):
            if not self.zk_session.connected.is_set():
                continue
            try:
                turn(time.monotonic())
            except Exception as exc:  # keep going: the next round tries again
                log.warning("maintenance round failed: %r", exc)
