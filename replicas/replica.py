"""The replica: follows the log, runs transactions for its clients, serves snapshots.

Threads: the follower (applies the log), the committer (group commit), a reaper (transaction
limits), and the RPC server's workers calling the methods below. Running transactions live in
memory only: if the process dies they are gone, and on restart every part they wrote is removed
because no commit ever named it (the WAL's ``staged`` records say which files to remove).
"""

from __future__ import annotations

import gc
import itertools
import json
import logging
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.retry import KazooRetry

from coordinator.catalog import TableDef
from coordinator.errors import (
    CorruptMetadata,
    InvalidInput,
    ReplicaUnavailable,
    SnapshotUnavailable,
    TableNotFound,
    TransactionAborted,
)
from coordinator.fence import OrphanFence
from coordinator.model import (
    AliveRecord,
    CommitStatus,
    ManifestPointer,
    StagedOp,
    TxnState,
    WalBase,
    WalEntry,
    WalStaged,
    op_from_dict,
)
from coordinator.versions import Tid, check_host_id, local_counter, split_csn
from coordinator.zklog import CsnLog, PollHandler
from parts.format import PartMeta
from parts.ops import partition_key
from parts.storage import Storage
from replicas import checkpoint
from replicas.follower import Follower
from replicas.maintenance import MIN_GRACE, Maintenance
from replicas.settings import ReplicaConfig, tunables
from replicas.state import ReplicaState
from replicas.transactions import RunningTxn
from replicas.wal import Wal

log = logging.getLogger(__name__)

# A client sends a token with each begin; a begin sent again with it (its answer was lost) gets
# the transaction the first one began, for this long after it, among this many recent tokens.
BEGIN_TOKEN_SECONDS = 60.0
BEGIN_TOKENS_MAX = 100_000


class Replica:
    def __init__(self, config: ReplicaConfig) -> None:
        check_host_id(config.host_id)
        self.config = config
        self.host_id = config.host_id
        self.storage = Storage(config.storage_url, config.storage_options)
        self.state = ReplicaState()
        self.txns: dict[str, RunningTxn] = {}
        self.finished: dict[str, RunningTxn] = {}
        self._parts_calls: dict[str, int] = {}  # first part name of one-call commits on workers
        self._txn_lock = threading.Lock()
        self._begun: OrderedDict[str, tuple[float, RunningTxn]] = OrderedDict()  # begin token -> txn
        self._counter = itertools.count()
        self._stop = threading.Event()
        self.incarnation = 0
        self.address = ""
        self.zk = KazooClient(
            hosts=config.zk,
            timeout=config.session_timeout,
            connection_retry=KazooRetry(max_tries=-1, max_delay=1.0),
            command_retry=KazooRetry(max_tries=5, delay=0.05, max_delay=1.0),
            handler=PollHandler(),
        )
        self.log = CsnLog(self.zk, config.root, config.epoch_size)
        self.fence = OrphanFence(self.zk, self.log.path("fence"), config.host_id)
        self.wal: Wal | None = None
        self.follower: Follower | None = None
        self.committer = None
        self.maintenance = Maintenance(self)
        self.tail: checkpoint.LogTail | None = None
        self._alive_published: bytes | None = None
        self._session_lost = threading.Event()
        self._connected = threading.Event()  # set while the session is usable (not SUSPENDED/LOST)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
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
        replay = self.state.applied >= base
        if not replay:
            log.error("WAL %s continues a local snapshot at CSN %d that did not load; refetching from "
                      "ZooKeeper (or the cluster checkpoint)", self.wal.path, base)
        with checkpoint.no_gc():  # a long replay builds many long-lived objects (see ReplicaState.restore)
            for rec in records:
                if isinstance(rec, WalEntry) and replay:
                    try:
                        self.state.apply(rec.csn, rec.epoch, rec.seq, rec.log_entry(f"WAL {self.wal.path}"))
                    except CorruptMetadata as exc:
                        # The WAL only caches the log: stop here and fetch the rest from ZooKeeper.
                        log.error("WAL %s: entry record does not apply (%s); refetching from ZooKeeper",
                                  self.wal.path, exc)
                        replay = False
                elif isinstance(rec, WalStaged):
                    staged.setdefault(rec.tid, []).extend(rec.paths)
        gc.freeze()
        self.zk.add_listener(self._on_zk_state)
        self.zk.start(timeout=max(30.0, self.config.session_timeout))
        self.log.ensure_layout()
        self.fence.start()
        self._register()
        self.tail = checkpoint.LogTail(self)
        self.follower = Follower(self.log, self.state, self.wal, self._load_manifest, self.tail.load_checkpoint)
        try:
            self.follower.pull()
        except CorruptMetadata as exc:  # serve what applies; reads needing the rest report it
            log.error("cannot apply the log: %s", exc)
            with self.state.lock:
                self.state.failure = exc
                self.state.applied_cond.notify_all()
        self.follower.start()
        self.tail.start()
        self._remove_uncommitted(staged)
        from replicas.committer import Committer

        self.committer = Committer(self)
        self.committer.start()
        self.maintenance.start()
        threading.Thread(target=self._reaper, name="reaper", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self.maintenance.stop()
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

    def _register(self) -> None:
        """Bump this host's incarnation (tids stay unique across restarts) and say we are alive."""
        node = self.log.path("replicas", self.host_id)
        self.zk.retry(self.zk.ensure_path, node)
        stat = self.zk.retry(self.zk.set, node, json.dumps({"host_id": self.host_id}).encode())
        self.incarnation = stat.version
        self._publish_alive()

    def _alive_data(self) -> bytes:
        """What replicas/<host>/alive says: where we are, and (for trimming the log tail and for
        cleanup) the applied CSN and the oldest snapshot a running transaction here uses."""
        return self.alive_record().encode()

    def alive_record(self) -> AliveRecord:
        oldest, picked, running, overflow = self.maintenance.in_use()  # cleanup: snapshots in use
        with self._txn_lock:
            snaps = [t.snapshot for t in self.txns.values()]
            applied = self.state.applied
        return AliveRecord(address=self.address, incarnation=self.incarnation, applied=applied,
                           oldest_txn_snapshot=min(snaps) if snaps else None, oldest_snapshot=min(oldest, applied),
                           snapshots=tuple(picked), running=tuple(running), running_overflow=overflow)

    def min_needed(self) -> int:
        """The lowest CSN this replica still needs: applied, or an older running snapshot."""
        with self._txn_lock:
            return min([self.state.applied, *(t.snapshot for t in self.txns.values())])

    def refresh_alive(self) -> None:
        """Republish the alive node when what it says changed (the log-tail thread, each tick)."""
        data = self._alive_data()
        if data == self._alive_published:
            return
        try:
            self.zk.retry(self.zk.set, self.log.path("replicas", self.host_id, "alive"), data)
            self._alive_published = data
        except NoNodeError:
            self._publish_alive()

    def _publish_alive(self) -> None:
        node = self.log.path("replicas", self.host_id, "alive")
        data = self._alive_data()
        self._alive_published = data
        try:
            self.zk.retry(self.zk.create, node, data, ephemeral=True)
        except NodeExistsError:
            try:
                self.zk.retry(self.zk.delete, node)
            except NoNodeError:
                pass
            self.zk.retry(self.zk.create, node, data, ephemeral=True)

    def set_address(self, address: str) -> None:
        self.address = address
        self._publish_alive()

    def _on_zk_state(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            self._connected.set()
        else:
            self._connected.clear()
        if state == KazooState.LOST:
            self._session_lost.set()
            reason = f"replica {self.host_id} lost its ZooKeeper session"
            with self._txn_lock:  # only these: a BEGIN after this belongs to the new session
                victims = list(self.txns.values())
            threading.Thread(target=self.abort_all, args=(reason, victims), name="abort-all", daemon=True).start()
        elif state == KazooState.CONNECTED and self._session_lost.is_set():
            self._session_lost.clear()
            threading.Thread(target=self._after_new_session, daemon=True).start()
        if self.follower is not None:
            self.follower.poke()

    def _after_new_session(self) -> None:
        try:
            self._publish_alive()
        except Exception as exc:  # pragma: no cover - retried on the next session event
            log.warning("could not re-register after a new session: %r", exc)

    def _load_manifest(self, pointer: ManifestPointer) -> bytes:
        try:
            return self.storage.get(pointer.path)
        except Exception as exc:
            raise CorruptMetadata(f"manifest {pointer.path} named by the log cannot be read: {exc}") from exc

    def _remove_uncommitted(self, staged: dict[str, list[str]]) -> None:
        """Parts written by transactions that never committed are never visible: delete them."""
        for tid, paths in staged.items():
            if tid in self.state.tid_csn:
                continue
            for p in paths:
                self._delete_file(p)

    def _delete_file(self, relpath: str) -> None:
        try:
            self.storage.delete(relpath)
            if relpath.endswith(".parquet"):
                self.storage.delete(relpath[: -len(".parquet")] + ".json")
        except Exception as exc:
            log.warning("could not delete %s: %r", relpath, exc)

    def _reaper(self) -> None:
        while not self._stop.wait(0.5):
            now = time.monotonic()
            for txn in list(self.txns.values()):
                if txn.state == TxnState.RUNNING and now - txn.started > self.config.txn_max_seconds:
                    self.abort(txn, f"transaction {txn.id} exceeded its time limit of {self.config.txn_max_seconds:g}s")

    # -- snapshots ---------------------------------------------------------------------------
    def snapshot(self) -> int:
        return self.state.applied

    def wait_snapshot(self, csn: int) -> None:
        """Block until ``csn`` is applied here (bounded), or raise a clear error."""
        if not isinstance(csn, int) or isinstance(csn, bool) or csn < 0:
            raise InvalidInput(f"snapshot must be a non-negative integer CSN, not {csn!r}")
        if csn <= self.state.applied:
            return  # a snapshot already applied needs nothing more, even if later entries fail
        if self.state.failure is not None:
            # The log did not apply last time: look again now (an operator may have repaired
            # the node); this raises CorruptMetadata naming the node while it still does not parse.
            self.follower.pull()
            with self.state.lock:
                self.state.failure = None
            if csn <= self.state.applied:
                return
        epoch, seq = split_csn(csn)
        if self.log.fetch(epoch, seq) is None and self._synced_fetch(epoch, seq) is None:
            raise SnapshotUnavailable(
                f"snapshot {csn} is newer than the log (latest applied here: {self.state.applied})",
                snapshot=csn, latest=self.state.applied,
            )
        self.follower.poke()
        if not self.state.wait_applied(csn, self.config.read_wait_seconds) or self.state.applied < csn:
            if self.state.failure is not None:
                raise self.state.failure
            raise ReplicaUnavailable(
                f"replica {self.host_id} did not apply snapshot {csn} within {self.config.read_wait_seconds:g}s "
                f"(applied: {self.state.applied})"
            )

    def _synced_fetch(self, epoch: int, seq: int) -> bytes | None:
        """Fetch an entry after a ``sync``: the ZooKeeper member this session talks to may lag
        the leader (an ensemble), so a commit made through another member can look missing."""
        self.zk.sync(self.log.path("log"))
        return self.log.fetch(epoch, seq)

    def resolve_snapshot(self, snapshot: int | None, as_of: float | None) -> int:
        if snapshot is not None and as_of is not None:
            raise InvalidInput("give either snapshot or as_of, not both")
        if as_of is not None:
            snap = self.state.csn_at_time(float(as_of))
            if self.tail is not None:
                when = datetime.fromtimestamp(float(as_of), UTC).isoformat()
                self.tail.check_snapshot(snap, f"the last data-changing commit at or before as_of {when}")
            return snap
        if snapshot is None:
            return self.state.applied
        if self.tail is not None and isinstance(snapshot, int):
            self.tail.check_snapshot(snapshot)  # reads below the retained log are refused
        self.wait_snapshot(snapshot)
        return snapshot

    # -- tables ------------------------------------------------------------------------------
    def table(self, name: str, snapshot: int | None = None) -> TableDef:
        if not isinstance(name, str):
            raise InvalidInput(f"table name must be a string, not {type(name).__name__}")
        t = self.state.table(name, snapshot)
        if t is None:
            from parts.ops import validate_name

            validate_name("table", name)
            if self.state.table(name) is None and self.zk.exists(self.log.path("tables", name)):
                # Created through another replica and not applied here yet: wait for the follower
                # to apply it, so that a table that exists is never reported unknown. (Not a
                # pull() of our own: that runs for as long as commits keep coming.)
                if self.state.failure is not None:
                    # The log stopped at an entry that does not parse: look again now; this
                    # raises CorruptMetadata naming the node while it still does not parse.
                    self.follower.pull()
                    with self.state.lock:
                        self.state.failure = None
                self.follower.poke()
                with self.state.lock:
                    self.state.applied_cond.wait_for(
                        lambda: self.state.table(name) is not None or self.state.failure is not None,
                        self.config.read_wait_seconds)
                t = self.state.table(name, snapshot)
            if t is None:
                created = self.state.table(name)
                if created is not None:
                    raise TableNotFound(f"table {name!r} does not exist at snapshot {snapshot} "
                                        f"(created at CSN {created.created_csn})", table=name)
                raise TableNotFound(f"unknown table {name!r}", table=name)
        return t

    def create_table(self, tdef: TableDef) -> int:
        return self.committer.create_table(tdef)

    # -- transactions ------------------------------------------------------------------------
    def begin(self, token: str | None = None) -> RunningTxn:
        """A new transaction; with ``token`` (a client's name for this begin), a begin sent again
        with the same token gets the transaction the first one began instead of another."""
        if token is not None and (not isinstance(token, str) or not 0 < len(token) <= 128):
            raise InvalidInput(f"begin token must be a string of 1 to 128 characters, not {token!r}")
        # A short disconnection (a ZooKeeper member failing over) must not fail clients: wait
        # for the session to come back, at most as long as the session could still be alive.
        if not self._connected.wait(self.config.session_timeout) or self._session_lost.is_set():
            raise ReplicaUnavailable(f"replica {self.host_id} is not connected to ZooKeeper")
        self.maintenance.ensure_applied_watermark()  # never a snapshot whose parts cleanup took
        with self._txn_lock:  # with the snapshot: refresh_alive never misses a new transaction's
            now = time.monotonic()
            while self._begun and (len(self._begun) >= BEGIN_TOKENS_MAX
                                   or next(iter(self._begun.values()))[0] < now - BEGIN_TOKEN_SECONDS):
                self._begun.popitem(last=False)
            if token is not None and token in self._begun:
                return self._begun[token][1]
            tid = Tid(self.state.applied, local_counter(self.incarnation, next(self._counter)), self.host_id)
            txn = RunningTxn(tid=tid, snapshot=tid.start_csn)
            self.txns[txn.id] = txn
            if token is not None:
                self._begun[token] = (now, txn)
        self.maintenance.on_begin(txn)
        return txn

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
        if time.monotonic() - txn.started > self.config.txn_max_seconds:
            self.abort(txn, f"transaction {txn.id} exceeded its time limit of {self.config.txn_max_seconds:g}s")
            raise TransactionAborted(txn.reason, id=txn_id)
        return txn

    def stage(self, txn_id: str, op: StagedOp) -> None:
        txn = self.running(txn_id)
        table = self.table(op.table, None)
        own_added, own_removed = txn.own_parts()
        own_names = {m.name for m in own_added}
        visible = None
        for name in op.removed:
            if name in own_names:
                continue
            if visible is None:
                visible = {m.name for m in self.state.visible(op.table, txn.snapshot, txn.id, own_added, own_removed)}
            if name not in visible:
                raise InvalidInput(f"part {name} is not visible to transaction {txn.id} in table {op.table!r}")
        # Cleanup keeps the unreferenced files of a running transaction by the tid in their names;
        # a part named otherwise is kept only while younger than the grace period, so one written
        # long before it is staged could be collected before or after the commit: refuse it.
        old_after = max(self.config.gc_grace_seconds, MIN_GRACE) / 2
        now = time.time()
        for meta in op.added:
            if meta.table != table.name:
                raise InvalidInput(f"part {meta.name} belongs to table {meta.table!r}, not {table.name!r}")
            if now - meta.created_at > old_after and not meta.name.startswith(txn.id + "_"):
                raise InvalidInput(
                    f"part {meta.name} was written {now - meta.created_at:.0f}s ago, more than half the cleanup "
                    f"grace period ({old_after * 2:g}s), and its name does not carry transaction {txn.id}: "
                    "cleanup may take it for an orphan. Commit parts soon after writing them, or name them "
                    "after the transaction that stages them (parts.format.write_part with its id)")
        with txn.lock:
            if txn.state != TxnState.RUNNING:
                raise TransactionAborted(f"transaction {txn.id} is {txn.state}: {txn.reason}", id=txn.id)
            if txn.rows + op.rows > self.config.txn_max_rows:
                reason = (f"transaction {txn.id} exceeded its row limit of {self.config.txn_max_rows} "
                          f"({txn.rows + op.rows} rows staged)")
                self._abort_locked(txn, reason, [op])
                raise TransactionAborted(reason, id=txn.id)
            txn.ops.append(op)
            txn.rows += op.rows
        if op.added:
            self.wal.append([WalStaged(txn.id, tuple(m.path for m in op.added))], sync=False)

    def visible_parts(self, table: str, txn_id: str, pkeys: list[str] | None = None) -> tuple[int, list[PartMeta]]:
        """Parts visible to a transaction: at its snapshot, with its own writes."""
        txn = self.running(txn_id)
        self.table(table, None)
        added, removed = txn.own_parts()
        return txn.snapshot, self.state.visible(table, txn.snapshot, txn.id, added, removed, pkeys)

    def read_parts(self, table: str, snapshot: int | None = None, as_of: float | None = None,
                   pkeys: list[str] | None = None, fresh: bool = False,
                   lease: str = "read") -> tuple[int, list[PartMeta], str | None]:
        """Parts visible at a snapshot (the latest by default), for a read outside a transaction:
        the snapshot is leased (``lease``: "read", "spark" or "none"; see replicas/maintenance.py)
        until the reader releases the lease id returned, or it lapses. SnapshotUnavailable if
        cleanup took a part it needs (``fresh``: read the cleanup watermark from ZooKeeper, not
        the watched copy); nothing stays leased when this fails."""
        if snapshot is None and as_of is None:
            self.table(table)  # catches up first if the table was just created elsewhere
        self.maintenance.ensure_applied_watermark()
        if snapshot is None and as_of is None:
            snap, lease_id = self.maintenance.lease(None, lease)
        else:
            snap, lease_id = self.maintenance.lease(self.resolve_snapshot(snapshot, as_of), lease)
        try:
            self.table(table, snap)
            metas = self.state.visible(table, snap, pkeys=pkeys)
            self.maintenance.check_retained(table, snap, metas, fresh)
        except BaseException:
            if lease_id is not None:
                self.maintenance.release(lease_id)
            raise
        return snap, metas, lease_id

    def commit(self, txn_id: str) -> int:
        txn = self._start_commit(txn_id)
        if not txn.ops:
            self._finish(txn, TxnState.COMMITTED, csn=txn.snapshot)
            return txn.snapshot
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

    def commit_parts(self, args: dict) -> dict:
        """Begin, stage the parts and commit, in one call; ``{"csn", "tid"}``."""
        name = args.pop("_inflight", None)
        try:
            txn = self.begin()
            try:
                op = self.parts_op(txn, args)
                if op.added or op.removed or op.partitions:
                    self.stage(txn.id, op)
                csn = self.commit(txn.id)
            except BaseException as exc:
                self.abort(txn, f"commit_parts failed: {exc}")
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
        return CommitStatus("", "not_committed", None, f"no transaction on replica {self.host_id} staged part {name} of {table!r} "
                          "(the call never reached it, or the replica restarted before committing it)").to_dict()

    def commit_async(self, txn_id: str, done: Callable[[int | None, Exception | None], None]) -> None:
        """:meth:`commit` without waiting: ``done(csn, None)`` or ``done(None, error)`` follows,
        from the committer's thread (or this one). Errors found before queueing are raised."""
        txn = self._start_commit(txn_id)
        if not txn.ops:
            self._finish(txn, TxnState.COMMITTED, csn=txn.snapshot)
            done(txn.snapshot, None)
            return
        self.committer.submit_async(txn, done)

    def _start_commit(self, txn_id: str) -> RunningTxn:
        txn = self.running(txn_id)
        with txn.lock:
            if txn.state != TxnState.RUNNING:
                raise TransactionAborted(f"transaction {txn.id} is {txn.state}: {txn.reason}", id=txn.id)
            txn.state = TxnState.COMMITTING
        return txn

    def ready_to_begin(self) -> bool:
        """Whether :meth:`begin` would answer at once (it waits while ZooKeeper is away or the
        cleanup watermark is ahead of this replica)."""
        return (self._connected.is_set() and not self._session_lost.is_set()
                and self.maintenance.watermark <= self.state.applied)

    def quick_txn(self, txn_id: object) -> RunningTxn | None:
        """The running transaction, if a statement or commit for it can go ahead with no waiting
        and no cleanup (not past its time limit); None otherwise, and the full path decides."""
        txn = self.txns.get(txn_id) if isinstance(txn_id, str) else None
        if txn is None or txn.state != TxnState.RUNNING or time.monotonic() - txn.started > self.config.txn_max_seconds:
            return None
        return txn

    def rollback(self, txn_id: str, reason: str = "rolled back") -> None:
        txn = self.txn(txn_id)
        if txn.state in (TxnState.COMMITTED, TxnState.COMMITTING):
            raise InvalidInput(f"transaction {txn_id} is {txn.state} and cannot be rolled back")
        self.abort(txn, reason)

    def abort(self, txn: RunningTxn, reason: str) -> bool:
        with txn.lock:
            if txn.state != TxnState.RUNNING:
                return False
            self._abort_locked(txn, reason, [])
        return True

    def _abort_locked(self, txn: RunningTxn, reason: str, extra_ops: list[StagedOp]) -> None:
        txn.state, txn.reason = TxnState.ABORTED, reason
        self._retire(txn)
        for op in txn.ops + extra_ops:
            for meta in op.added:
                self._delete_file(meta.path)

    def abort_all(self, reason: str, txns: list[RunningTxn] | None = None) -> None:
        for txn in list(self.txns.values()) if txns is None else txns:
            self.abort(txn, reason)

    def _finish(self, txn: RunningTxn, state: str, csn: int | None = None, reason: str = "") -> None:
        txn.state, txn.csn, txn.reason = state, csn, reason
        self._retire(txn)

    def _retire(self, txn: RunningTxn) -> None:
        with self._txn_lock:
            self.finished[txn.id] = txn  # before the pop: a lock-free txn() always finds it
            self.txns.pop(txn.id, None)
            while len(self.finished) > 10_000:
                self.finished.pop(next(iter(self.finished)))
        self.maintenance.on_end(txn)

    def kill(self, txn_id: str) -> dict:
        txn = self.txn(txn_id)
        self.abort(txn, f"transaction {txn_id} was killed by an operator")
        return txn.describe()

    def transactions(self) -> list[dict]:
        with self._txn_lock:
            return [t.describe() for t in self.txns.values()]

    def commit_status(self, tid: str) -> dict:
        try:
            Tid.parse(tid)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        csn = self.state.tid_csn.get(tid)
        if csn is not None:
            return CommitStatus(tid, "committed", csn, "").to_dict()
        with self._txn_lock:
            txn = self.txns.get(tid) or self.finished.get(tid)
        if txn is not None:
            return CommitStatus(tid, txn.state, txn.csn, txn.reason).to_dict()
        host = Tid.parse(tid).host_id
        if host == self.host_id:
            return CommitStatus(tid, "aborted", None, "not committed; not running on this replica (it ended or the replica restarted)").to_dict()
        return CommitStatus(tid, "not_committed", None, f"not in the log up to CSN {self.state.applied}; ask replica {host} whether it still runs").to_dict()

    # -- introspection -----------------------------------------------------------------------
    def part_records(self, table: str) -> list[dict]:
        self.table(table)
        note = self.maintenance.part_notes()  # why a removed part is still in storage
        with self.state.lock:
            names = sorted(self.state.by_table.get(table, ()))
            latest = self.state.applied
            out = []
            for n in names:
                rec = self.state.parts[n]
                out.append({
                    "name": n,
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
                })
        return out

    def info(self) -> dict:
        return {
            "host_id": self.host_id,
            "address": self.address,
            "storage_url": self.storage.url,
            "zk": self.config.zk,
            "root": self.log.root,
            "snapshot": self.state.applied,
            "epoch_size": self.log.epoch_size,
            "incarnation": self.incarnation,
            "txn_max_rows": self.config.txn_max_rows,
            "tables": sorted(self.state.tables),
            "settings": tunables(self.config),
            "switch_interval": sys.getswitchinterval(),
            "committer": {"commits": self.committer.committed, "batches": self.committer.batches,
                          "local_version_misses": self.committer.local_misses},
        }
