"""The replica: follows the log, runs transactions for its clients, serves snapshots.

This module wires a replica together and runs its life: start and stop, the ZooKeeper session,
the alive node, snapshots and tables. Its jobs are its parts, each in a module of its own name:
``transactions`` (replicas/registry.py: running transactions and the staging rules), ``leases``
(replicas/leases.py: snapshots in use), ``cleanup`` (replicas/cleanup.py), ``merges``
(replicas/merges.py), ``changefeed`` (replicas/changefeed.py: incremental reads and events), and the
follower, committer and log tail.

Threads: the follower (applies the log), the committer (group commit), the log tail, a reaper
(transaction limits), the maintenance thread (merges and cleanup), and the RPC server's workers.
Running transactions live in memory only: if the process dies they are gone, and on restart every
part they wrote is removed because no commit ever named it (the WAL's ``staged`` records say
which files to remove).
"""

from __future__ import annotations

import errno
import gc
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.retry import KazooRetry

from coordinator.core import retries
from coordinator.core.errors import (
    CorruptMetadata,
    InvalidInput,
    ReplicaUnavailable,
    SnapshotUnavailable,
    TableNotFound,
    quote,
)
from coordinator.core.grants import Role
from coordinator.core.versions import Tid, check_host_id, incarnation_of, split_csn
from coordinator.model.catalog import PARTS_OPTIONS, TableDef, TableDropped
from coordinator.model.records import (
    AliveRecord,
    ManifestPointer,
    WalBase,
    WalEntry,
    WalStaged,
)
from coordinator.model.users import UserRecord
from coordinator.model.znodes import OwnerRecord
from coordinator.wire.security import zk_client_args
from coordinator.zk.alive import AliveNode, check_host_free
from coordinator.zk.log import CsnLog, PollHandler, table_node_dropped
from coordinator.zk.needed import NeededNodes
from coordinator.zk.orphan_fence import OrphanFence
from coordinator.zk.watermark import Watermark
from parts.io.format import delete_part
from parts.io.storage import Storage
from parts.model.meta import PartMeta
from replicas import checkpoint
from replicas.async_commits import AsyncCommits
from replicas.changefeed import ChangeFeed
from replicas.cleanup import Cleanup
from replicas.follower import Follower
from replicas.leases import Leases
from replicas.memory import TRIM_SECONDS, memory, trim
from replicas.merges import BUSY_SECONDS, Merges
from replicas.metrics import LogWatch, Stats, read_stats
from replicas.outcomes import Outcomes
from replicas.pauses import PauseGuard
from replicas.registry import Transactions
from replicas.retention import Retention
from replicas.settings import ReplicaConfig, tunables
from replicas.state import ReplicaState
from replicas.storage_check import startup_probe
from replicas.users import Users
from replicas.wal import Wal
from replicas.zksession import ZkSession, connect_zk

log = logging.getLogger(__name__)

STOP_DRAIN_SECONDS = 10.0  # a graceful stop commits the async commits it accepted, waiting at most this

# A client sends a token with each begin; a begin sent again with it (its answer was lost) gets
# the transaction the first one began, for this long after it, among this many recent tokens.


class Replica:
    def __init__(self, config: ReplicaConfig) -> None:
        check_host_id(config.host_id)
        self.config = config
        self.host_id = config.host_id
        self.storage = Storage(config.storage_url, config.storage_options)
        self.state = ReplicaState(config.outcome_seconds)
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
        self.transactions = self._make_transactions()
        self.leases = Leases(self.state, config, self.transactions)
        self.retention = self._make_retention()
        self.cleanup = self._make_cleanup()
        self.merges = self._make_merges()
        self.tail: checkpoint.LogTail | None = None
        self.log_watch = self._make_log_watch()
        self.metrics_address: str | None = None  # host:port of the Prometheus endpoint, when it runs
        self.changefeed = ChangeFeed(
            self.state, self.host_id, self.table, self.wait_snapshot, self.retention, self.leases
        )
        self.outcomes = self._make_outcomes()
        self.pauses = PauseGuard(
            self.zk, self.log, self.host_id, config.session_timeout, self.zk_session, self.catch_up
        )
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
            self.config,
            self.state,
            self.storage,
            self.zk_session,
            self.table,
            self.watermark,
            self.async_commits,
            lambda: self.incarnation,
            lambda: self.retention.ensure_applied(),
            lambda txn: self.changefeed.on_begin(txn),
            lambda txn: self.changefeed.on_end(txn),
            lambda tid, forward: self.outcomes.status(tid, forward=forward),
            lambda: self.committer,
            lambda: self.wal,
        )

    def _make_retention(self) -> Retention:
        """Each table's retention window and the horizons it keeps."""
        return Retention(
            self.state,
            self.config,
            self.host_id,
            self.watermark,
            lambda: None if self.follower is None else self.follower.poke(),
        )

    def _make_cleanup(self) -> Cleanup:
        """Cleanup passes: removed parts and orphans deleted once nothing can read them."""
        return Cleanup(
            self.state,
            self.config,
            self.storage,
            self.zk,
            self.log,
            self.host_id,
            self.watermark,
            self.fence,
            self.retention,
            self.transactions,
            self.alive_record,
            self.catch_up,
        )

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
            self.zk,
            self.log,
            self.state,
            self.storage,
            self.config.data_dir,
            lambda: None if self.wal is None else self.wal.path,
            lambda: None if self.tail is None else self.tail.tail,
        )

    def _make_outcomes(self) -> Outcomes:
        """Transactions' outcomes, answered here or forwarded to their replica."""
        return Outcomes(
            self.state,
            self.transactions,
            self.zk,
            self.log,
            self.host_id,
            self.config.credentials,
            lambda: self.incarnation,
            self.catch_up,
        )

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
        self.follower = Follower(self.log, self.state, self.wal, self._load_manifest, self.tail.load_checkpoint)
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
        return checkpoint.LogTail(
            self.state,
            self.log,
            self.zk,
            self.storage,
            self.config,
            self.transactions,
            self.wal,
            self.watermark,
            self.retention,
            self.log_watch,
            self.refresh_alive,
            lambda: None if self.follower is None else self.follower.poke(),
        )

    def _first_pull(self, follower: Follower) -> None:
        """Catch up from ZooKeeper once: a log this replica cannot apply is served as far as it
        applies; a manifest naming other storage stops the start."""
        try:
            follower.pull()
        except CorruptMetadata as exc:  # serve what applies; reads needing the rest report it
            if exc.details.get("manifest"):
                raise self._wrong_storage(str(exc)) from None
            log.error("cannot apply the log: %s", exc)
            self.state.set_failure(exc)
        if self.state.failure is not None and self.state.failure.details.get("manifest"):
            raise self._wrong_storage(str(self.state.failure))

    def _start_committer(self, follower: Follower) -> None:
        """The committer (ZooKeeper's multis for this replica's commits), started."""
        from replicas.committer import Committer

        self.committer = Committer(
            self.state,
            self.log,
            self.config,
            self.storage,
            follower,
            self.zk_session,
            self.transactions,
            self.fence,
            self.table,
            self.catch_up,
            self.wait_snapshot,
            lambda: self.incarnation,
            self.fenced,
        )
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

    def _recover_local(self) -> tuple[dict[str, list[str]], int, int]:
        """Open the WAL and load the local snapshot plus the WAL's entries; returns the staged
        parts by transaction (deleted once known uncommitted), the records replayed and the
        local snapshot's CSN."""
        data_dir = Path(self.config.data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        self.wal = Wal(data_dir / "wal.log")
        staged: dict[str, list[str]] = {}
        # A compacted WAL starts with {"base": C}: its entries continue the local snapshot at C.
        records = self.wal.records()
        base = records[0].csn if records and isinstance(records[0], WalBase) else 0
        local = checkpoint.read_local(data_dir / checkpoint.LOCAL_NAME)
        if local is not None:
            try:
                self.state.restore(local, str(data_dir / checkpoint.LOCAL_NAME))
            except CorruptMetadata as exc:
                log.error("%s; rebuilding from ZooKeeper", exc)
        local_csn = self.state.applied
        replay = self.state.applied >= base
        if not replay:
            log.error(
                "WAL %s continues a local snapshot at CSN %d that did not load; refetching from "
                "ZooKeeper (or the cluster checkpoint)",
                self.wal.path,
                base,
            )
        replayed = 0
        with checkpoint.no_gc():  # a long replay builds many long-lived objects (see ReplicaState.restore)
            for rec in records:
                if isinstance(rec, WalEntry) and replay:
                    try:
                        self.state.apply(rec.csn, rec.epoch, rec.seq, rec.log_entry(f"WAL {self.wal.path}"))
                        replayed += 1
                    except CorruptMetadata as exc:
                        # The WAL only caches the log: stop here and fetch the rest from ZooKeeper.
                        log.error(
                            "WAL %s: entry record does not apply (%s); refetching from ZooKeeper", self.wal.path, exc
                        )
                        replay = False
                elif isinstance(rec, WalStaged):
                    staged.setdefault(rec.tid, []).extend(rec.paths)
        gc.freeze()
        return staged, replayed, local_csn

    def _check_storage(self) -> None:
        """Refuse to serve on storage that holds none of the newest parts the log names (a wrong
        ``--storage``); transient storage errors are retried for a while, then refuse too."""
        try:
            for attempt in retries.storage_probe():
                with attempt:
                    problem = startup_probe(self.state, self.storage)
        except OSError as exc:
            raise ReplicaUnavailable(
                f"replica {self.host_id} cannot read its storage {self.storage.url}: {exc}", storage=self.storage.url
            ) from None
        if problem is not None:
            raise self._wrong_storage(problem)

    def _wrong_storage(self, problem: str) -> InvalidInput:
        return InvalidInput(
            f"replica {self.host_id}: storage {self.storage.url} does not hold what the log names "
            f"({problem}); is --storage the cluster's storage?",
            storage=self.storage.url,
        )

    def _check_root_acl(self) -> None:
        """A secured replica on a root that anyone may read or write (created by an unsecured
        cluster: ZooKeeper ACLs are set when a node is created, never inherited) says so."""
        if self.config.credentials is None:
            return
        acls, _ = self.zk.retry(self.zk.get_acls, self.log.root)
        if any(acl.id.scheme not in ("digest", "x509") for acl in acls):
            log.error(
                "the ZooKeeper root %s is open to others (ACL %s): it was created without credentials. "
                "Secure it with setAcl -R %s digest:<user>:<digest>:cdrwa (zkCli), or use a new root",
                self.log.root,
                [f"{a.id.scheme}:{a.id.id}" for a in acls],
                self.log.root,
            )

    def _first_admin(self) -> UserRecord | None:
        """The admin user ``mergetxn security init`` made (in the replicas' credentials file):
        stored by the first replica that starts on a root without users."""
        admin = self.config.credentials.admin
        return None if admin is None else UserRecord(admin[0], Role.ADMIN, None, admin[1], time.time())

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

    def missing(self) -> list[str]:
        """ZooKeeper nodes this replica needs that are gone, and the log's holes as last seen:
        a sentence each, naming the node and what to do (memory only: ``/ready``, ``info``)."""
        return self.needed.missing() + self.log_watch.holes()

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

    def _load_manifest(self, pointer: ManifestPointer) -> bytes:
        try:
            return self.storage.get(pointer.path)
        except Exception as exc:
            raise CorruptMetadata(
                f"manifest {pointer.path} named by the log cannot be read: {exc}", manifest=pointer.path
            ) from exc

    def _remove_uncommitted(self, staged: dict[str, list[str]]) -> int:
        """Parts written by transactions that never committed are never visible: delete them
        (returns how many files). A transaction whose outcome is forgotten here (it began below
        the outcome window) may have committed: its files are left to cleanup's orphan pass,
        which deletes only files that no part record names."""
        removed = 0
        for tid, paths in staged.items():
            if self.state.forgotten(tid) or self.state.commit_csn(tid) is not None:
                continue
            for p in paths:
                delete_part(self.storage, p)
                removed += 1
        return removed

    def _reaper(self) -> None:
        """Transactions past their time aborted (every 0.5 s), the C heap trimmed (replicas/memory.py)."""
        trimmed = time.monotonic()
        while not self.zk_session.stop.wait(0.5):
            self.transactions.reap()
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
            self.follower.pull()
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
        self.follower.poke()
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
            self.follower.pull()
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
                    self.follower.pull()
                    self.state.clear_failure()
                self.follower.poke()
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
        return self.committer.create_table(tdef)

    def alter_table(self, name: str, add_columns: object, rename_columns: object, options: object = None) -> int:
        """ALTER TABLE; ``options``: new values of the table's options (catalog.ALTERABLE)."""
        self.table(name)  # TableNotFound first, as every statement says it
        return self.committer.alter_table(name, add_columns, rename_columns, options)

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
                    "creation_tid": rec.meta.creation_tid,
                    "creation_csn": rec.creation_csn,
                    "removal_tid": rec.removal_tid,
                    "removal_csn": rec.removal_csn,
                    "visible": rec.removal_csn is None or rec.removal_csn > latest,
                    **dict(zip(("why_kept", "collected"), note(rec))),
                }
            )
        return out

    def info(self) -> dict:
        """What this replica is and how it is doing (the ``info`` action, ``mergetxn status``).
        Answered on the RPC I/O thread: memory only, no ZooKeeper or storage request (the log's
        end and the file sizes are what the log-tail thread last saw: replicas/metrics.py)."""
        s = read_stats(self)
        oldest, picked, _, _ = self.leases.in_use()
        holder = next((h for snap, h in picked if snap == oldest), "replica snapshot")
        last_gc = self.cleanup.last_gc_report
        return {
            "host_id": self.host_id,
            "address": self.address,
            "metrics_address": self.metrics_address,
            "storage_url": self.storage.url,
            "zk": self.config.zk,
            "zk_state": s.zk_state,
            "zk_connected": self.zk_session.connected.is_set(),
            "root": self.log.root,
            "snapshot": s.applied_csn,
            "applied_csn": s.applied_csn,
            "log_failure": None if self.state.failure is None else str(self.state.failure),
            "missing": self.missing(),  # needed ZooKeeper nodes gone, holes in the log
            "log": self._info_log(s),
            "lag": {"entries": s.lag_entries, "seconds": round(s.lag_seconds, 3)},
            "oldest_snapshot": {"snapshot": oldest, "holder": holder},
            "running_transactions": s.running_transactions,
            "outcomes": self.state.outcome_counts(),  # the outcome window (outcome_seconds)
            "structures": self._info_structures(),  # entries each structure holds (docs/architecture/bounds.md)
            "memory": memory(),  # resident set, Python blocks, Arrow's pool, the C heap
            "transactions": self.transactions.notable(),  # long-running and orphaned, with holders
            "cleanup": self._info_cleanup(s, last_gc),
            "merges": s.merges,
            "epoch_size": self.log.epoch_size,
            "incarnation": s.incarnation,
            "pauses": self.pauses.pauses,  # times it stood still long enough to make sure of its session
            "txn_max_rows": self.config.txn_max_rows,
            "tables": sorted(self.state.tables),
            "settings": tunables(self.config),
            "switch_interval": sys.getswitchinterval(),
            "secure": self.config.credentials is not None,  # TLS, users and grants, ZooKeeper ACLs
            "committer": self._info_committer(s),
            "aborted": s.aborted,  # by reason, as the metric mergetxn_transactions_aborted_total
            "inserts": s.inserts_held,  # delayed and refused by the parts per partition (too many parts)
            "async_commits": self.async_commits.describe(),
        }

    def _info_log(self, s: Stats) -> dict:
        """info()'s "log": the log's end and entries, epochs, WAL and checkpoint sizes."""
        watch = self.log_watch
        return {
            "end_csn": s.log_end_csn,
            "entries": s.log_entries,
            "epochs": watch.epochs,
            "observed_at": watch.observed_at,
            "retained": self.tail.retained if self.tail else 0,
            "wal_bytes": s.wal_bytes,
            "local_checkpoint_bytes": watch.local_checkpoint_bytes,
            "checkpoint": watch.checkpoint,
        }

    def _info_structures(self) -> dict:
        """info()'s "structures": entries each structure holds (docs/architecture/bounds.md)."""
        return {
            **self.state.sizes(),
            "events": self.changefeed.ring_size(),
            "finished_transactions": len(self.transactions.finished),
        }

    def _info_cleanup(self, s: Stats, last_gc: dict | None) -> dict:
        """info()'s "cleanup": passes, failures, files removed, the last pass in short."""
        return {
            "passes": s.cleanup_passes,
            "failures": s.cleanup_failures,
            "files_removed": s.cleanup_files_removed,
            "last_at": self.cleanup.last_gc_at,
            "last_error": self.cleanup.last_gc_error,
            "watermark": self.cleanup.watermark,
            "last": None
            if last_gc is None
            else {
                k: (len(v) if isinstance(v, list) else v)
                for k, v in last_gc.items()
                if k in ("removed", "kept", "min_snapshot", "watermark", "young_orphans", "seconds")
            },
        }

    def _info_committer(self, s: Stats) -> dict | None:
        """info()'s "committer": commits, batches and conflicts; None on a replica without one."""
        if not s.has_committer:
            return None
        return {
            "commits": s.commits,
            "batches": s.commit_batches,
            "local_version_misses": s.local_version_misses,
            "failed": s.commit_failures,
            "conflicts": {k: n for k, n in s.conflicts.items() if n},
        }
