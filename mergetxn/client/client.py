"""The Python client: transactions against one replica, data read and written in storage directly.

The replica holds the transaction (its snapshot, its staged parts) and decides the commit; the
client does the data work itself (it conforms and partitions rows, writes Parquet parts, reads
and filters visible parts), exactly as a Spark executor would. A part is durable in storage
before the replica hears of it.
"""

from __future__ import annotations

import functools
import math
import os
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Literal, cast

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.core import errors, keytables, retries
from coordinator.core.conflicts import Policy, check_app_version
from coordinator.core.errors import InvalidInput, ReplicaUnavailable, TransactionAborted, quote
from coordinator.core.readsets import SERIALIZABLE, SNAPSHOT, Read, check_isolation
from coordinator.core.tabledata import (
    DEFAULT_PARTITION_VALUE_BYTES,
    PARTITION_VALUE_SETTING,
    assignments,
    check_expression,
    encode_assignments,
    encode_expression,
    partition_key,
)
from coordinator.core.versions import Tid
from coordinator.model.atomicity import ASYNC, FULL, SYNC, check_modes
from coordinator.model.catalog import TableDef
from coordinator.model.records import (
    CommitStatus,
    Compact,
    Insert,
    Mutate,
    Overwrite,
    StagedOp,
    Truncate,
)
from coordinator.wire import protocol, security
from coordinator.wire.rpc import RpcClient
from coordinator.wire.security import Credentials
from mergetxn.client.admin import Administration
from mergetxn.client.arguments import checked, checked_methods
from mergetxn.client.base import StillCommitting, T, named
from mergetxn.client.checks import as_table, partition_values, refuse_outside
from mergetxn.client.heartbeat import Heartbeat
from mergetxn.client.keys import KeysStatements
from mergetxn.client.reads import Reads, TransactionReads
from mergetxn.client.tables import Tables, TransactionTables
from parts.io import rewrite
from parts.io.format import delete_part
from parts.io.storage import Storage
from parts.io.write import write_data
from parts.model.meta import INLINE_MAX_BYTES, PartMeta

CALL_TIMEOUT = 30.0  # seconds an ordinary call waits for its answer (connect(timeout=...))
# Calls whose work legitimately takes longer than an ordinary answer wait at least this long:
# waits for a snapshot or a table (the replica's read_wait_seconds, 30 s), commits (the group
# committer, a ZooKeeper member failing over, a rebase that redoes a mutation), and calls that
# read or rewrite data on the replica (a compaction, a cleanup pass, a check with checksums).
LONG_CALLS: dict[str, float] = {
    "begin": 60.0,
    "table": 60.0,
    "describe_table": 60.0,
    "visible": 60.0,
    "wait": 60.0,
    "stage": 60.0,
    "events": 60.0,
    "flush": 120.0,
    "changes": 300.0,
    "commit": 300.0,
    "commit_parts": 300.0,
    "create_table": 300.0,
    "alter_table": 300.0,
    "compact": 3600.0,
    "gc": 3600.0,
    "check": 3600.0,
}
MAX_TIMEOUT = 86_400.0
CONNECT_TIMEOUT = 10.0  # the first answer (info) of a new client: a port that accepts and never answers
OUTCOME_WAIT = 15.0  # how long a commit whose reply was lost waits for its replica to answer again
OUTCOME_ASK = 3.0  # how long one question about that outcome waits for an answer (any replica)


class _StaleDefinition(retries.TryAgain):
    """A one-call insert was refused: its parts were written for a definition of the table that a
    DDL replaced since the client cached it. ``refusal``: the replica's answer."""

    def __init__(self, refusal: InvalidInput) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


@checked_methods
class Client(Tables, Reads, Administration):
    """A client of one replica (``host:port``). ``credentials``: a secured cluster's
    (a :class:`coordinator.wire.security.Credentials` or the path of its credentials file); by
    default the file named by ``MERGETXN_CREDENTIALS``, if set. ``timeout``: seconds a call waits
    for its answer; ``long_calls``: the actions that wait longer, and their least wait (default
    :data:`LONG_CALLS`; the command line passes ``{}``: its ``--timeout`` bounds every request).

    Made of its core here (the connection, transactions, writes and outcomes) and of its parts
    by job: :class:`~mergetxn.client.tables.Tables` (definitions and DDL),
    :class:`~mergetxn.client.reads.Reads` (reads, snapshots, changes) and
    :class:`~mergetxn.client.admin.Administration` (compactions, users, parts, cleanup, checks).

    Every call that asks the replica may also raise ``ReplicaUnavailable`` (the replica did not
    answer; the message names the cluster's other live replicas) and, on a secured cluster,
    ``PermissionDenied`` (the user may not make that call; nothing was changed): the sections
    below name what else each method raises.

    Raises:
        InvalidInput: the address, timeout, storage options or long calls are wrong.
        AuthenticationFailed: the replica serves only clients with the cluster's credentials.
        ReplicaUnavailable: the replica did not answer its first call.
    """

    def __init__(
        self,
        address: str,
        storage_options: dict | None = None,
        timeout: float = CALL_TIMEOUT,
        credentials: Credentials | str | os.PathLike | None = None,
        long_calls: Mapping[str, float] | None = None,
    ) -> None:
        if not isinstance(address, str) or ":" not in address:
            raise InvalidInput(f"replica address must be 'host:port', not {quote(address)}")
        _check_connect_args(timeout, storage_options)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT:
            raise InvalidInput(
                f"timeout must be a number of seconds above 0 and at most {MAX_TIMEOUT:g}, not {quote(timeout)}"
            )
        self.address = address
        self.timeout = float(timeout)
        self._long_calls = dict(LONG_CALLS if long_calls is None else _check_long_calls(long_calls))
        self.credentials = security.resolve(credentials)  # who this client logs in as (None: unsecured)
        self._rpc = RpcClient(address, self.timeout, self.credentials)
        # Definitions by name with the snapshot they were looked up at: a transaction at snapshot
        # S uses one when the last catalog change at or before S (begin says it) is not after it.
        self._tables: dict[str, tuple[TableDef, int]] = {}
        # Async commits (durability="async") of this client: the replica records them under this
        # session; flush() accounts for each one made since the last flush (see flush).
        # The session also holds this client's transactions: see mergetxn/client/heartbeat.py.
        self.session = uuid.uuid4().hex
        self._heartbeat = Heartbeat(self._rpc, self.session)
        weakref.finalize(self, self._heartbeat.close)
        self._async_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._unflushed: list[str] = []  # tids of async commits queued since the last flush, in order
        self._async_csn: int | None = None  # the last CSN of an async commit known durable
        self._acks: list[str] = []  # failures flush reported: acknowledged with the next flush
        self._refused: set[str] = set()  # ``visible`` fields the replica refused (older code): not sent again
        connecting = min(CONNECT_TIMEOUT, self.timeout)
        info = self._rpc.call("info", {}, timeout=connecting)  # answered at once by a live replica
        self.host_id: str = info["host_id"]
        # Where part files live: in an admin's (and an unsecured replica's) info; a secured
        # replica tells other users through ``storage`` only (replicas/server.py).
        url = info.get("storage_url") or self._rpc.call("storage", {}, timeout=connecting)["storage_url"]
        self.storage = Storage(url, storage_options)
        self._heartbeat.learn_peers(timeout=connecting)  # named should it stop answering
        # The replica's bound on a partition value, checked here before any file is written (the
        # replica checks it again at stage); a replica that does not say has the default.
        settings = info.get("settings")
        bound = settings.get(PARTITION_VALUE_SETTING) if isinstance(settings, dict) else None
        self.max_partition_value_bytes: int = (
            bound if type(bound) is int and bound > 0 else DEFAULT_PARTITION_VALUE_BYTES
        )
        # The replica's inline thresholds (docs/architecture/small-writes.md; a table's own
        # override them): a replica that does not say them takes no inlined part.
        self.inline_settings: tuple[int, int] = _inline_settings(settings)

    # -- RPC --------------------------------------------------------------------------------
    def call(self, action: str, **args: Any) -> Any:
        """One request; its answer is waited for ``timeout`` seconds, or longer for the calls
        that legitimately take longer (``long_calls``). An action or a field the protocol
        (coordinator/wire/protocol.py) does not know is InvalidInput before anything is sent.

        Raises:
            InvalidInput: an action or a field the protocol does not know; nothing was sent.
        """
        protocol.check_call(action, args)
        try:
            return self._rpc.call(action, args, timeout=max(self.timeout, self._long_calls.get(action, 0.0)))
        except ReplicaUnavailable as exc:
            raise self._elsewhere(exc) from None

    def _elsewhere(self, exc: ReplicaUnavailable) -> ReplicaUnavailable:
        """``exc``, when it says that this client's replica did not answer or could not be
        reached, with the other live replicas' addresses (learnt when the client connected):
        where the caller may go on. Errors the replica answered are left as they are."""
        if type(exc) is not ReplicaUnavailable or exc.details.get("replica") != self.address or "peers" in exc.details:
            return exc
        peers = list(self._heartbeat.peers)
        where = (
            f"the cluster's other replicas, live when this client last asked: {', '.join(peers)} (connect to one of them)"
            if peers
            else "no other live replica is known to this client (mergetxn status --zk HOSTS lists the replicas)"
        )
        return ReplicaUnavailable(f"{exc.message}; {where}", **exc.details, peers=peers)

    def _wait_decided(self, step: Callable[[], T]) -> T:
        """``step`` until the replica answers and raises no ``StillCommitting`` (bounded by
        :data:`OUTCOME_WAIT`), for the parts of the client that wait for a decision."""
        return _until_decided(step)

    def close(self) -> None:
        """Close the connection and stop the session heartbeat."""
        self._heartbeat.close()
        self._rpc.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transactions ------------------------------------------------------------------------
    def begin(
        self,
        isolation: str = SNAPSHOT,
        atomicity: str = FULL,
        durability: str = SYNC,
        detached: bool = False,
        table_limits: bool = True,
    ) -> Transaction:
        """A new transaction at the latest snapshot. ``isolation``: ``"snapshot"`` (the table's
        conflict policy decides) or ``"serializable"`` (besides, a commit after its snapshot that
        changed what its reads returned or could have returned fails it; see
        coordinator/core/readsets.py).

        ``atomicity`` (docs/rules.md#atomicity-and-durability): ``"full"``, or ``"none"`` to write keys
        tables created with ``atomicity="none"`` (and only those; a mismatch either way fails the
        commit with InvalidInput naming both modes, checked at commit). Such a transaction takes
        no locks and never conflicts (the later commit wins per key), and its reads see the latest
        applied state plus its own writes, not its snapshot; snapshot isolation only.
        ``durability="async"`` (only with ``atomicity="none"``): ``commit()`` returns None once the
        replica holds the commit in memory; :meth:`flush` waits until it is durable. See
        coordinator/model/atomicity.py and replicas/async_commits.py.

        The transaction belongs to this client's session, which the client keeps alive while it
        holds it (mergetxn/client/heartbeat.py): once this process dies, stands still or is cut off
        for the replica's ``client_session_timeout``, the replica aborts it. ``detached=True``:
        no session holds it (a Spark job hands its transaction from the process that began it to
        the one that commits it); only its time limit (``txn_max_seconds``) ends it then.

        ``table_limits=False`` (an admin's, PermissionDenied for other users): the tables' own
        ``txn_max_rows``/``txn_max_seconds`` do not bind the transaction, the replica-wide limits
        still do; what ``mergetxn restore`` begins, so that a table's backup restores whatever its
        limits.

        Raises:
            InvalidInput: an unknown isolation, atomicity or durability, or modes that do not go together.
            QuotaExceeded: the user already runs as many transactions as its quota allows.
        """
        isolation = check_isolation(isolation)
        atomicity, durability = check_modes(atomicity, durability, isolation)
        modes = self._begin_modes(atomicity, durability, detached, table_limits)
        # The token makes a begin sent again after a lost answer (rpc.IDEMPOTENT) get the same
        # transaction, instead of leaving the first one running unseen on the replica.
        r = self.call("begin", token=uuid.uuid4().hex, **modes)
        tx = Transaction(
            self,
            Tid(*r["tid"]),
            r["id"],
            r["snapshot"],
            ddl=r.get("ddl"),
            isolation=isolation,
            atomicity=atomicity,
            durability=durability,
        )
        if not detached:
            self._heartbeat.hold(tx, r.get("client_session_timeout"))
        return tx

    def _begin_modes(self, atomicity: str, durability: str, detached: bool, table_limits: bool) -> dict[str, Any]:
        """The arguments of a ``begin`` call beyond its token for these (checked) modes; raises
        InvalidInput for a flag that is not a bool or a detached async transaction."""
        for flag, value in (("detached", detached), ("table_limits", table_limits)):
            if not isinstance(value, bool):
                raise InvalidInput(f"{flag} must be True or False, not {quote(value)}")
        if detached and durability != SYNC:
            raise InvalidInput(
                "a detached transaction cannot have durability='async' (client.flush() follows "
                "async commits by the client's session)"
            )
        modes: dict[str, Any] = {}
        if atomicity != FULL:
            modes["atomicity"] = atomicity
        if durability != SYNC:
            modes["durability"] = durability
        if not detached:
            modes["session"] = self.session
        if not table_limits:
            modes["table_limits"] = False
        return modes

    def flush(self) -> int | None:
        """Wait until every async commit (``durability="async"``) this client made is durable in
        ZooKeeper and applied on its replica; returns the CSN of the last one (None if this
        client never made one that committed). Raises TransactionAborted naming the async
        commits that did not commit (their ids in ``exc.ids``; each failure is reported by one flush), including those
        lost because the replica process died before they were durable: a crash loses at most
        the async commits not flushed, each entirely.

        The replica answers for the commits its process accepted; those it does not know of (it
        restarted since) are asked one by one with commit_status, which decides them once their
        replica is gone. Right after an async commit returned, reads (this client's too) may not
        see it yet; after flush() they do.

        Raises:
            TransactionAborted: an async commit since the last flush did not commit (``ids`` names them).
        """
        with self._flush_lock:
            with self._async_lock:
                unflushed, acks = list(self._unflushed), list(self._acks)
            r = self.call("flush", session=self.session, ack=acks)
            known = min(len(unflushed), int(r["accepted"])) if r.get("complete", True) else 0
            failed = {f["id"]: f for f in r["failed"]}
            csns: list[int] = [] if r["csn"] is None else [int(r["csn"])]
            for tid in unflushed[: len(unflushed) - known]:  # accepted by an earlier process of the replica
                status: CommitStatus = _await_outcome(
                    functools.partial(self.commit_status, tid),
                    f"async commit {tid}",
                    f"commit_status({quote(tid)}) on any replica",
                )
                if status.status == "committed" and status.csn is not None:
                    csns.append(status.csn)
                else:
                    kind = "OutcomeUnknown" if status.status == "unknown" else "TransactionAborted"
                    failed.setdefault(tid, {"id": tid, "type": kind, "message": status.reason or status.status})
            with self._async_lock:
                del self._unflushed[: len(unflushed)]
                self._acks = [f["id"] for f in r["failed"]]
                if self._async_csn is not None:
                    csns.append(self._async_csn)
                self._async_csn = max(csns) if csns else None
                last = self._async_csn
        if failed:
            shown = "; ".join(f"{f['id']}: {f.get('type', 'error')}: {f['message']}" for f in list(failed.values())[:5])
            more = f" (and {len(failed) - 5} more)" if len(failed) > 5 else ""
            raise TransactionAborted(
                f"{len(failed)} async commit(s) of this client did not commit{more}: {shown}",
                ids=list(failed),
                csn=last,
            )
        return last

    def _async_queued(self, tid: str) -> None:
        with self._async_lock:
            self._unflushed.append(tid)

    def join(self, txn_id: str) -> Transaction:
        """Act inside a transaction opened elsewhere (a Spark driver's ``txn`` option).

        Raises:
            TransactionNotFound: no transaction of that id runs on this replica.
        """
        try:
            tid = Tid.parse(txn_id)
        except (ValueError, TypeError) as exc:
            raise InvalidInput(f"join: {exc}", id=txn_id) from None
        return Transaction(self, tid, txn_id, tid.start_csn, joined=True)

    @contextmanager
    def transaction(
        self, isolation: str = SNAPSHOT, atomicity: str = FULL, durability: str = SYNC, table_limits: bool = True
    ) -> Iterator[Transaction]:
        """Commits on normal exit, rolls back on an exception; arguments as :meth:`begin`.

        Raises:
            InvalidInput: as :meth:`begin`.
            ConflictError: the commit on leaving the block lost to a transaction that committed first.
            OutcomeUnknown: the commit's answer was lost and its replica did not answer again in time.
        """
        tx = self.begin(isolation=isolation, atomicity=atomicity, durability=durability, table_limits=table_limits)
        try:
            yield tx
        except BaseException:
            if tx.csn is None and not tx.ended:
                try:
                    tx.rollback()
                except errors.MergetxnError:
                    pass
            raise
        if not tx.ended:
            tx.commit()

    def commit_status(self, tid: Tid | str) -> CommitStatus:
        """The outcome of transaction ``tid`` (any replica's), decided here when its replica is gone.

        ``.status`` is ``"committed"`` (``.csn`` set), ``"aborted"``, ``"running"`` or
        ``"committing"`` (the last two only while its replica may still decide), or ``"unknown"``:
        it began before the replica's outcome window (the ``outcome_seconds`` setting, default a
        day) and no part record names it, so its outcome is too old to know (never a guess of
        "aborted"). ``.reason`` says why (docs/rules.md#outcomes). InvalidInput: not a tid.

        Raises:
            InvalidInput: ``tid`` is not a transaction id.
        """
        r = self.call(
            "commit_status", tid=str(tid if not isinstance(tid, tuple) or isinstance(tid, Tid) else Tid(*tid))
        )
        return CommitStatus.from_dict(r)

    def _status_anywhere(self, tid: str) -> CommitStatus:
        """``commit_status`` from this client's replica or, when it does not answer (it died or
        stands still), from another live replica (learnt beforehand: mergetxn/client/heartbeat.py),
        which decides the outcome once the owner is gone. Each question waits OUTCOME_ASK."""
        try:
            return CommitStatus.from_dict(self._rpc.call("commit_status", {"tid": tid}, timeout=OUTCOME_ASK))
        except ReplicaUnavailable as own:
            for address in self._heartbeat.peers:
                other = RpcClient(address, OUTCOME_ASK, self.credentials)
                try:
                    return CommitStatus.from_dict(other.call("commit_status", {"tid": tid}))
                except ReplicaUnavailable:
                    continue
                finally:
                    other.close()
            raise own

    def insert(self, table: str, data: pa.Table) -> int:
        """INSERT INTO ``table`` as a transaction of its own, in one round trip; returns the CSN.

        The same as ``with client.transaction() as tx: tx.insert(table, data)`` for a writer with
        nothing else to do in the transaction, at a third of the round trips: the rows are
        written to storage as parts, then the replica begins, stages them and commits in one call
        (as :meth:`commit_parts`). Refused (InvalidInput, PermissionDenied, ConflictError, ...), it
        commits nothing and deletes the files it wrote. If the connection breaks, the replica is
        asked, by part name, whether it committed: the caller gets the CSN or TransactionAborted,
        never "unknown" (the files of a call that did not happen are left to cleanup, which
        collects them after the grace period). Written for a definition of the table that a DDL
        replaced since this client looked it up, it looks the table up again and writes once
        more. No rows: nothing is written and the current snapshot is returned. On a keys table
        the rows go by key through a transaction (begin, insert, commit), as ``tx.insert``.

        Raises:
            InvalidInput: the rows do not fit the table (every wrong column named), or no such
                table (TableNotFound); nothing written stays.
            ConflictError: the commit lost to one that committed first; the insert may be retried.
            TooManyParts: a partition it writes holds too many visible parts.
            TransactionAborted: the connection broke and the replica says the commit did not happen.
            StorageError: storage refused a part's write.
        """
        try:
            for attempt in retries.fresh_definition(on=_StaleDefinition):
                with attempt:
                    cached = attempt.retry_state.attempt_number == 1
                    tdef = self.table(table) if cached else self._table_at(table, None, None)
                    try:
                        return self._insert_once(table, data, tdef)
                    except InvalidInput as exc:  # refused by the cached definition: is it still the table's?
                        fresh = self._table_at(table, None, None) if cached else tdef
                        if (fresh.created_csn, fresh.ddl_version) != (tdef.created_csn, tdef.ddl_version):
                            raise _StaleDefinition(exc) from None
                        raise
        except _StaleDefinition as exc:
            raise exc.refusal from None
        raise AssertionError("unreachable: the policy re-raises the last failure")  # pragma: no cover

    def _insert_once(self, table: str, data: Any, tdef: TableDef) -> int:
        """One attempt of :meth:`insert` with the definition ``tdef``."""
        if tdef.conflict_policy is Policy.KEYS:
            with self.transaction() as tx:
                tx.insert(table, data)
            assert tx.csn is not None  # committed on the way out of the block
            return tx.csn
        # Named after no transaction (none exists yet): the replica's commit makes them its own.
        # No sidecars: the commit that follows at once carries the metadata (and nothing reads them).
        by = f"insert-{self.session[:12]}"
        limit = self.max_partition_value_bytes
        inline = tdef.inline_limits(*self.inline_settings)
        metas = write_data(self.storage, tdef, as_table(data, table), by, limit=limit, sidecar=False, inline=inline)
        try:
            args = {"table": table, "op": "insert", "added": [m.to_dict() for m in metas], "statement": "insert"}
            return self._commit_parts(table, metas, args)
        except ReplicaUnavailable:
            raise  # not known to the replica at all, or never answered: cleanup decides after the grace period
        except errors.MergetxnError as exc:
            if exc.details.get("outcome_looked_up"):
                raise  # decided after the connection broke: cleanup takes the files, behind its fence
            for m in metas:  # refused by the replica: no commit names these fresh names
                if not m.inlined:
                    delete_part(self.storage, m.path)
            seen = exc.details.get("schema_version") if isinstance(exc, InvalidInput) else None
            if isinstance(exc, InvalidInput) and seen is not None and seen != tdef.ddl_version:
                raise _StaleDefinition(exc) from None
            if isinstance(exc, InvalidInput) and self.stale_inline_settings(exc, metas):
                raise _StaleDefinition(exc) from None  # written again under the replica's thresholds now
            raise

    def stale_inline_settings(self, exc: errors.MergetxnError, metas: Sequence[PartMeta]) -> bool:
        """Whether ``exc`` refused an inlined part of ``metas`` by a threshold that changed since
        this client learned the replica's (an operator lowered ``inline_rows``, say): then the
        thresholds are learned again, and the caller writes its rows once more under them."""
        if not (isinstance(exc, InvalidInput) and exc.details.get("setting") in ("inline_rows", "inline_bytes")):
            return False
        if not any(m.inlined for m in metas):
            return False
        before = self.inline_settings
        self.inline_settings = _inline_settings(self.call("info").get("settings"))
        return self.inline_settings != before

    def commit_parts(
        self,
        table: str,
        metas: Sequence[PartMeta],
        op: str = "insert",
        partitions: Sequence[Any] | None = None,
        apps: Mapping[str, int] | None = None,
    ) -> int:
        """Commit parts already written to storage as a transaction of their own, in one round
        trip: the replica begins, stages them as one INSERT (or INSERT OVERWRITE of
        ``partitions``, as :meth:`Transaction.add_parts`) and commits. Returns the CSN.

        For a writer with nothing else to do in the transaction (a job that wrote its files, an
        ingester) this is a third of the round trips of begin, add_parts and commit. The parts
        become the transaction's own (their ``creation_tid``). Their names carry no running
        transaction's tid, so nothing keeps cleanup from taking them for orphans: parts written
        (``created_at``) more than half the replica's ``gc_grace_seconds`` ago are refused. A part
        is committed at most once: parts that a commit already named are refused (InvalidInput
        naming the part and its CSN), unless this is that very commit sent again (the same parts,
        all of them), which is answered with its CSN. The files are the caller's: a refused or
        failed commit leaves them (cleanup collects them once older than the grace period if no
        commit names them). If the connection breaks, the replica is asked, by part name, whether
        it committed, so the caller is never left not knowing. ``apps`` (app id -> version) makes it
        an idempotent commit, as :meth:`Transaction.set_app_version` does.

        Raises:
            InvalidInput: a part is not the table's, was committed before, is too old, or ``op``
                is wrong; the files are left.
            ConflictError: an overwrite lost to a commit that came first.
            TooManyParts: a partition it adds to holds too many visible parts.
            TransactionAborted: the connection broke and the replica says the parts were not committed.
        """
        if op not in ("insert", "overwrite"):
            raise InvalidInput(f"commit_parts op must be 'insert' or 'overwrite', not {quote(op)}")
        apps = dict(check_app_version(a, v) for a, v in (apps or {}).items())
        metas = _part_metas(metas, f"commit_parts to {quote(table)}")
        tdef = self.table(table)
        if tdef.conflict_policy is Policy.KEYS and op == "overwrite":
            raise InvalidInput(
                f"commit_parts op='overwrite' on keys table {quote(table)}: the keys to delete are read in "
                "a transaction; use tx.add_parts(..., op='overwrite')",
                table=table,
            )
        _check_own_parts(tdef, metas)
        args: dict[str, Any] = {"table": table, "op": op, "added": [m.to_dict() for m in metas]}
        if op == "overwrite":
            args["partitions"] = [list(p) for p in _overwrite_targets(tdef, metas, partitions)]
        if apps:
            args["apps"] = apps
        return self._commit_parts(table, metas, args)

    def _commit_parts(self, table: str, metas: list[PartMeta], args: dict[str, Any]) -> int:
        """The one call of :meth:`commit_parts` and :meth:`insert`, and its outcome when the
        connection breaks (TransactionAborted with the detail ``outcome_looked_up``)."""
        try:
            return self.call("commit_parts", **args)["csn"]
        except ReplicaUnavailable:
            if not metas:
                raise
            status = _await_outcome(
                lambda: self._part_status(table, metas[0].name),
                f"the commit of part {metas[0].name} of {quote(table)}",
                f"client.commit_status by part ({quote(table)}, {quote(metas[0].name)}) on replica {self.address}",
            )
        if status.status == "committed" and status.csn is not None:
            return status.csn
        _refuse_unknown(status, f"the commit of {len(metas)} part(s) to {quote(table)}")
        raise TransactionAborted(
            f"the commit of {len(metas)} part(s) to {quote(table)} did not happen: {status.reason or status.status}",
            id=status.tid or None,
            outcome_looked_up=True,
        )

    def _part_status(self, table: str, part: str) -> CommitStatus:
        r = self.call("commit_status", table=table, part=part)
        return CommitStatus.from_dict(r)


def _decided_once(commit: Callable[..., T]) -> Callable[..., T]:
    """Make ``commit`` decide once whatever the threads: callers after the first (concurrent or
    later) wait for its decision and get the same answer, its CSN or the error it raised, never
    a TransactionAborted for a transaction that committed."""

    @functools.wraps(commit)
    def once(self: Transaction) -> T:
        with self._commit_lock:
            if self._commit_error is not None:
                raise self._commit_error
            try:
                return commit(self)
            except errors.MergetxnError as exc:
                if self._ended and self.csn is None:
                    self._commit_error = exc
                raise

    return once


@checked_methods
class Transaction(TransactionTables, TransactionReads, KeysStatements):
    """A transaction on one replica. Statements write their parts at once; the commit is atomic.

    Made of its core here (statements, commit, rollback) and of its parts by job:
    :class:`~mergetxn.client.tables.TransactionTables`, :class:`~mergetxn.client.reads.TransactionReads`
    and :class:`~mergetxn.client.keys.KeysStatements`. Each module calls only the client's
    private helpers that it defines itself (privacy is the module's: docs/architecture/index.md):
    here ``_async_queued``, ``_status_anywhere`` and ``_heartbeat``; the reads' ``_read_parts``
    and ``_dataset`` from reads.py, ``_table_at`` from tables.py.

    Every statement and the commit may also raise ``ReplicaUnavailable`` (the replica did not
    answer; the message names the cluster's other live replicas) and, on a secured cluster,
    ``PermissionDenied`` (the user may not make that statement: only the statement failed, the
    transaction stays usable): the sections below name what else each method raises."""

    def __init__(
        self,
        client: Client,
        tid: Tid,
        txn_id: str,
        snapshot: int,
        joined: bool = False,
        ddl: int | None = None,
        isolation: str = SNAPSHOT,
        atomicity: str = FULL,
        durability: str = SYNC,
    ) -> None:
        """Made by :meth:`Client.begin` (with the modes it began with) or :meth:`Client.join` (a
        joined transaction's modes are its replica's to know)."""
        self.client = client
        self._ddl = ddl  # the last catalog change at or before the snapshot (None: unknown)
        self.tid = tid
        self.id = txn_id
        self.snapshot = snapshot
        self.csn: int | None = None
        self.joined = joined
        self._ended = False
        self._isolation, self._atomicity, self._durability = isolation, atomicity, durability
        self._queued = False  # an async commit was accepted (queued) by the replica
        self._seq = 0  # the last _seq of a keys-table version it wrote (coordinator/core/keytables.py)
        self._statement: str | None = None  # the statement being made (see named)
        self._commit_lock = threading.Lock()  # see _decided_once
        self._commit_error: errors.MergetxnError | None = None

    @property
    def ended(self) -> bool:
        """Whether this client ended it (committed, rolled back, or found it ended)."""
        return self._ended

    @property
    def isolation(self) -> str:
        """``"snapshot"`` or ``"serializable"`` (``client.begin(isolation=...)``)."""
        return self._isolation

    @property
    def atomicity(self) -> str:
        """``"full"`` or ``"none"`` (``client.begin(atomicity=...)``)."""
        return self._atomicity

    @property
    def durability(self) -> str:
        """``"sync"`` or ``"async"`` (``client.begin(durability=...)``)."""
        return self._durability

    def _record_read(self, tdef: TableDef, where: pc.Expression | None) -> None:
        """A serializable transaction's read, recorded on its replica for the commit to check."""
        if self._isolation != SERIALIZABLE:
            return
        encoded = None if where is None else encode_expression(where, tdef.schema)
        self.client.call("add_read", id=self.id, read=Read(tdef.name, encoded).to_dict())

    def __repr__(self) -> str:
        return f"Transaction({self.id}, snapshot={self.snapshot}, csn={self.csn})"

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._ended:
            return
        if exc_type is None:
            self.commit()
        else:
            try:
                self.rollback()
            except errors.MergetxnError:
                pass

    def _end(self) -> None:
        self._ended = True
        self.client._heartbeat.release(self)  # its session need not be kept alive for it any more

    def _check_open(self) -> None:
        if self._ended:
            raise TransactionAborted(f"transaction {self.id} has ended", id=self.id)

    def _stage(self, op: StagedOp, written: bool = True) -> None:
        self._send("stage", [op], written)

    def _send(self, action: str, ops: list[StagedOp], written: bool = True) -> Any:
        """``written``: the parts of ``ops`` are files this call wrote for this transaction (not
        parts handed to it); a refusal deletes those, and only those no commit names."""
        named = {} if self._statement is None else {"statement": self._statement}
        try:
            return self.client.call(action, id=self.id, ops=[op.to_dict() for op in ops], **named)
        except ReplicaUnavailable:
            raise  # the replica may hold them already: cleanup decides once it is known
        except errors.MergetxnError:
            if written:
                for op in ops:
                    for m in op.added:
                        if m.name.startswith(self.id + "_") and not m.inlined:  # its own: no commit names it
                            delete_part(self.client.storage, m.path)
            raise

    def _write(
        self,
        tdef: TableDef,
        data: pa.Table,
        what: str = "insert into",
        before_write: Callable[[list[tuple]], None] | None = None,
    ) -> list[PartMeta]:
        """``data`` written as this transaction's parts (parts/io/write.py: conformed, or a keys
        table's versions, split by partition under the replica's bound); an insert's small
        parts inlined (docs/architecture/small-writes.md)."""
        limit = self.client.max_partition_value_bytes
        inline = tdef.inline_limits(*self.client.inline_settings) if what == "insert into" else None
        return write_data(
            self.client.storage, tdef, data, self.id, what=what, limit=limit, before_write=before_write, inline=inline
        )

    # -- statements -------------------------------------------------------------------------
    @named("insert")
    def insert(self, table: str, data: pa.Table) -> int:
        """INSERT INTO; returns the number of rows. On a keys table: rows by key in overwrite
        mode (:meth:`upsert` with ``update=False``).

        Raises:
            InvalidInput: the rows do not fit the table (every wrong column named), or no such table (TableNotFound).
            TooManyParts: a partition it writes holds too many visible parts; the transaction stays usable.
            TransactionAborted: the transaction has ended.
            StorageError: storage refused a part's write.
        """
        self._check_open()
        tdef = self.table(table)
        if tdef.conflict_policy is Policy.KEYS:
            return self._write_versions(tdef, data, keytables.PUT)
        data = as_table(data, table)
        parts = self._write(tdef, data)
        if parts:
            try:
                self._stage(Insert(table, tuple(parts)))
            except InvalidInput as exc:  # nothing staged: written again under the replica's thresholds now
                if not self.client.stale_inline_settings(exc, parts):
                    raise
                self._stage(Insert(table, tuple(self._write(tdef, data))))
        return data.num_rows

    @named("overwrite")
    def overwrite(self, table: str, data: pa.Table, partitions: Sequence[Any] | None = None) -> int:
        """INSERT OVERWRITE: replaces the given partitions, or those present in ``data`` (the
        whole table when it is not partitioned).

        Raises:
            InvalidInput: rows outside the ``partitions`` given, rows that do not fit the table, or no such table.
            TransactionAborted: the transaction has ended.
            StorageError: storage refused a part's write.
        """
        self._check_open()
        tdef = self.table(table)
        if tdef.conflict_policy is Policy.KEYS:
            return self._overwrite_keys(tdef, data, partitions)
        targets: list[tuple] = []
        removed: list[str] = []

        def replacing(present: list[tuple]) -> None:  # after the data's checks, before any file is written
            nonlocal targets, removed
            if partitions is not None:
                targets = partition_values(tdef, partitions)
                refuse_outside(table, present, targets)
            else:
                targets = present if tdef.partition_by else [()]
            removed = [m.name for m in self._visible(table, targets)] if targets else []

        data = as_table(data, table)
        parts = self._write(tdef, data, what="overwrite", before_write=replacing)
        self._stage(Overwrite(table, tuple(parts), tuple(removed), tuple(partition_key(p) for p in targets)))
        return data.num_rows

    @named("truncate")
    def truncate(self, table: str, partitions: Sequence[Any] | None = None) -> int:
        """TRUNCATE the table or some partitions; returns the number of parts removed (on a keys
        table: the number of keys deleted, each by a delete version).

        Raises:
            InvalidInput: partitions given for an unpartitioned table, values of the wrong type, or no such table.
            TransactionAborted: the transaction has ended.
        """
        self._check_open()
        tdef = self.table(table)
        targets = None if partitions is None else partition_values(tdef, partitions)
        if tdef.conflict_policy is Policy.KEYS:
            return self._delete_all_keys(tdef, targets)
        removed = [m.name for m in self._visible(table, targets)]
        self._stage(
            Truncate(table, tuple(removed), None if targets is None else tuple(partition_key(p) for p in targets))
        )
        return len(removed)

    @named("delete")
    def delete(self, table: str, where: pc.Expression) -> int:
        """DELETE WHERE ``where``; returns the number of rows deleted. On a keys table it
        deletes by key the rows that match at this transaction's snapshot, with its own writes.

        Raises:
            InvalidInput: ``where`` is not an expression over the table's columns, or no such table.
            TransactionAborted: the transaction has ended.
            CorruptPart: a part it rewrites does not match what was recorded.
        """
        self._check_open()
        tdef = self.table(table)
        _check_predicate(where, tdef, "delete")
        self._record_read(tdef, where)
        if tdef.conflict_policy is Policy.KEYS:
            return self._write_versions(tdef, self.read(table, list(tdef.primary_key), where), keytables.DELETE)
        result = rewrite.delete(self.client.storage, tdef, self._visible(table), where, self.id)
        self._stage(
            Mutate(
                "delete",
                tdef.name,
                encode_expression(where, tdef.schema),
                tuple(result.added),
                tuple(result.removed),
                _rewrite_targets(tdef, None),
            )
        )
        return result.affected_rows

    @named("update")
    def update(self, table: str, where: pc.Expression, set: Mapping[str, Any]) -> int:  # noqa: A002
        """UPDATE SET ``set`` WHERE ``where``; returns the number of rows updated.

        Raises:
            InvalidInput: ``where`` or ``set`` does not fit the table's columns and types, or no such table.
            TransactionAborted: the transaction has ended.
            CorruptPart: a part it rewrites does not match what was recorded.
        """
        self._check_open()
        tdef = self.table(table)
        _check_predicate(where, tdef, "update")
        assigns = assignments(dict(set), tdef.schema)
        if tdef.conflict_policy is Policy.KEYS:
            return self._update_keys(tdef, where, assigns)
        self._record_read(tdef, where)
        result = rewrite.update(self.client.storage, tdef, self._visible(table), where, assigns, self.id)
        self._stage(
            Mutate(
                "update",
                tdef.name,
                encode_expression(where, tdef.schema),
                tuple(result.added),
                tuple(result.removed),
                _rewrite_targets(tdef, None),
                assignments=encode_assignments(assigns, tdef.schema),
            )
        )
        return result.affected_rows

    @named("compact")
    def compact(self, table: str, kind: str = "minor", partitions: Sequence[Any] | None = None) -> int:
        """Stage a compaction in this transaction; returns the number of parts it replaces.

        Raises:
            InvalidInput: ``kind`` is not minor or major, wrong partitions, or no such table.
            TransactionAborted: the transaction has ended.
        """
        self._check_open()
        if kind not in ("minor", "major"):
            raise InvalidInput(f"compaction kind must be 'minor' or 'major', not {quote(kind)}")
        tdef = self.table(table)
        targets = None if partitions is None else partition_values(tdef, partitions)
        visible, csns = self._visible_csns(table, targets)
        result = rewrite.compact(self.client.storage, tdef, visible, kind, self.id, csns)
        pkeys = None if targets is None else tuple(partition_key(p) for p in targets)
        compaction = cast(Literal["minor", "major"], kind)  # checked above
        self._stage(
            Compact(tdef.name, compaction, tuple(result.added), tuple(result.removed), _rewrite_targets(tdef, pkeys))
        )
        return len(result.removed)

    def add_parts(
        self, table: str, metas: Sequence[PartMeta], op: str = "insert", partitions: Sequence[Any] | None = None
    ) -> int:
        """Stage parts already written to storage (by Spark executors) as one INSERT or INSERT
        OVERWRITE; the overwrite replaces ``partitions``, or those the parts are in (the whole
        table when it is not partitioned). Returns the rows added. The files are the caller's:
        a refused call leaves them (cleanup collects them once older than the grace period if no
        commit names them; a rolled-back transaction's replica deletes those named after it). A part written more than half the replica's
        ``gc_grace_seconds`` ago must be named after this transaction (``write_part(..., tx.id)``,
        as Spark's executors do): cleanup keeps a running transaction's files by that name.

        Raises:
            InvalidInput: a part is not the table's, not this transaction's, or committed before; the files are left.
            TooManyParts: a partition it adds to holds too many visible parts.
            TransactionAborted: the transaction has ended.
        """
        self._check_open()
        if op not in ("insert", "overwrite"):
            raise InvalidInput(f"add_parts op must be 'insert' or 'overwrite', not {quote(op)}")
        metas = _part_metas(metas, f"add_parts to {quote(table)}")
        tdef = self.table(table)
        _check_own_parts(tdef, metas)
        if tdef.conflict_policy is Policy.KEYS and op == "overwrite":
            targets = _overwrite_targets(tdef, metas, partitions)
            self._delete_all_keys(tdef, None if not tdef.partition_by else targets)
            op = "insert"  # the versions written after the deletes replace them
        if op == "insert":
            if metas:
                self._stage(Insert(table, tuple(metas)), written=False)
            return sum(m.rows for m in metas)
        targets = _overwrite_targets(tdef, metas, partitions)
        if not targets:
            return 0
        removed = [m.name for m in self._visible(table, targets)]
        self._stage(
            Overwrite(table, tuple(metas), tuple(removed), tuple(partition_key(p) for p in targets)), written=False
        )
        return sum(m.rows for m in metas)

    def add_rewrite(
        self,
        table: str,
        kind: str,
        added: Sequence[PartMeta],
        removed: Sequence[str],
        where: pc.Expression,
        set: Mapping[str, Any] | None = None,
    ) -> None:  # noqa: A002
        """Stage a DELETE or UPDATE whose copy-on-write rewrite was done elsewhere (Spark
        executors): ``removed`` parts replaced by ``added``. ``where``/``set`` travel with it so
        the replica can redo it if a rebase finds its inputs rewritten.

        Raises:
            InvalidInput: a keys table, parts not visible to it, or a wrong kind.
            TransactionAborted: the transaction has ended.
        """
        self._check_open()
        if kind not in ("delete", "update"):
            raise InvalidInput(f"add_rewrite kind must be 'delete' or 'update', not {quote(kind)}")
        tdef = _not_keys(self.table(table), "add_rewrite")
        _check_predicate(where, tdef, kind)
        assigns = None
        if kind == "update":
            assigns = encode_assignments(assignments(dict(set or {}), tdef.schema), tdef.schema)
        self._stage(
            Mutate(
                cast(Literal["delete", "update"], kind),  # checked above
                tdef.name,
                encode_expression(where, tdef.schema),
                tuple(added),
                tuple(removed),
                _rewrite_targets(tdef, None),
                assignments=assigns,
            ),
            written=False,
        )

    def set_app_version(self, app_id: str, version: int) -> None:
        """Record in this commit that application ``app_id`` reached ``version`` (an integer >= 0):
        an exactly-once sink's batch id. The commit then fails with
        :class:`~coordinator.core.errors.DuplicateCommit`, making nothing visible, if a version of
        ``app_id`` at or above it was committed before it (by any replica); otherwise
        ``client.app_version(app_id)`` answers ``version`` from its CSN on. Several applications
        may be set in one transaction; set again for the same one, the last version counts.
        A transaction with nothing else in it commits (a sink's empty batch).

        Raises:
            InvalidInput: an app id or a version that is not allowed.
            TransactionAborted: the transaction has ended.
        """
        self._check_open()
        app_id, version = check_app_version(app_id, version)
        self.client.call("set_app_version", id=self.id, app_id=app_id, version=version)

    # -- ending -------------------------------------------------------------------------------
    @_decided_once
    def commit(self) -> int | None:
        """Commit atomically; returns the CSN (the snapshot for a transaction that wrote nothing).
        Called again after it committed, it returns the same CSN (a retrying caller must not
        write twice). Begun with ``durability="async"``: returns None once the replica holds
        the commit in memory, before ZooKeeper does (``client.flush()`` waits for it; a replica
        crash before then loses it entirely); ``csn`` stays None (``commit_status(tx.id)`` tells
        it later).

        Raises:
            ConflictError: a transaction that committed first won; retrying the whole transaction is safe.
            DuplicateCommit: its application version was already committed; nothing was made visible.
            TransactionAborted: it can no longer commit (rolled back, killed, past its limits,
                its replica's session lost).
            OutcomeUnknown: the answer was lost and the replica did not answer again in time;
                ``commit_status`` tells the outcome.
        """
        if self.csn is not None:
            return None if self._durability == ASYNC else self.csn
        if self._queued:
            return None
        self._check_open()
        try:
            r = self.client.call("commit", id=self.id)
            if r.get("queued"):
                self._queued = True
                self.client._async_queued(self.id)
            else:
                self.csn = r["csn"]
        except ReplicaUnavailable:
            # Whether it was queued is not known: wait for its outcome as a sync commit would.
            # Committed, it was queued: flush counts it among the replica's (see Client.flush).
            self.csn = self._outcome()
            if self._durability == ASYNC:
                self.client._async_queued(self.id)
        finally:
            self._end()
        return None if self._durability == ASYNC else self.csn

    def _outcome(self) -> int:
        """The connection broke after the commit was sent: ask the replica (once it answers
        again) whether it committed, instead of leaving the caller not knowing."""
        what, how = f"transaction {self.id}", f"commit_status({quote(self.id)}) on any replica"
        status = _await_outcome(lambda: self.client._status_anywhere(self.id), what, how)
        if status.status == "running":
            # The commit never reached the replica (the connection broke before it was read):
            # end the transaction there, so that "did not commit" stays true.
            try:
                self.client.call("rollback", id=self.id)
            except InvalidInput:  # it is committing or committed after all
                status = _await_outcome(lambda: self.client.commit_status(self.id), what, how)
            else:
                status = CommitStatus(self.id, "aborted", None, "the commit request never reached the replica")
        if status.status == "committed" and status.csn is not None:
            return status.csn
        _refuse_unknown(status, f"transaction {self.id}")
        raise TransactionAborted(f"transaction {self.id} did not commit: {status.reason or status.status}", id=self.id)

    def rollback(self) -> None:
        """Roll back; nothing it staged becomes visible. InvalidInput after it committed."""
        if self.csn is not None:
            raise InvalidInput(
                f"transaction {self.id} committed at CSN {self.csn} and cannot be rolled back", id=self.id, csn=self.csn
            )
        if self._ended:
            return
        self._end()
        self.client.call("rollback", id=self.id)


@functools.partial(checked, "connect")
def connect(
    address: str,
    storage_options: dict | None = None,
    credentials: Credentials | str | os.PathLike | None = None,
    timeout: float = CALL_TIMEOUT,
) -> Client:
    """A client of the replica at ``host:port``; ``credentials`` for a secured cluster
    (``cluster.credentials``, or the path of its credentials file; default: the file named by
    ``MERGETXN_CREDENTIALS``). Without valid ones a secured replica raises AuthenticationFailed.

    Raises:
        InvalidInput: the address, timeout or storage options are wrong.
        AuthenticationFailed: the replica serves only clients with the cluster's credentials.
        ReplicaUnavailable: no replica answered at ``address``.
    """
    return Client(address, storage_options, timeout, credentials)


# The fields of a table's definition (TableDef.to_dict) that a CREATE sends; the rest the log decides.


def _inline_settings(settings: Any) -> tuple[int, int]:
    """``(inline_rows, inline_bytes)`` of a replica's ``info`` settings; ``(0, 0)`` (never
    inline) when it does not say them or says them wrong."""
    if not isinstance(settings, dict):
        return 0, 0
    rows, size = settings.get("inline_rows"), settings.get("inline_bytes")
    if type(rows) is not int or type(size) is not int or rows <= 0 or size <= 0:
        return 0, 0
    return rows, min(size, INLINE_MAX_BYTES)


def _check_connect_args(timeout: Any, storage_options: Any) -> None:
    """``connect``'s own arguments, refused as InvalidInput before any socket is opened."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise InvalidInput(f"timeout must be a positive finite number of seconds, not {quote(timeout)}")
    if storage_options is not None and (
        not isinstance(storage_options, Mapping) or not all(isinstance(k, str) for k in storage_options)
    ):
        raise InvalidInput(f"storage_options must be a mapping of option names to values, not {quote(storage_options)}")


def _not_keys(tdef: TableDef, what: str) -> TableDef:
    if tdef.conflict_policy is Policy.KEYS:
        raise InvalidInput(f"{what} on keys table {quote(tdef.name)} is not supported yet", table=tdef.name)
    return tdef


def _check_long_calls(long_calls: object) -> Mapping[str, float]:
    """``Client(long_calls=...)``: action names to seconds in (0, MAX_TIMEOUT], or InvalidInput."""
    if not isinstance(long_calls, Mapping) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= MAX_TIMEOUT
        for k, v in long_calls.items()
    ):
        raise InvalidInput(
            f"long_calls must map action names to seconds above 0 and at most {MAX_TIMEOUT:g}, not {quote(long_calls)}"
        )
    return long_calls


def _until_decided(step: Callable[[], T]) -> T:
    """``step`` until the replica answers and raises no ``StillCommitting`` (bounded)."""
    try:
        for attempt in retries.outcome(OUTCOME_WAIT, on=(ReplicaUnavailable, StillCommitting)):
            with attempt:
                return step()
    except StillCommitting as exc:
        raise ReplicaUnavailable(
            f"{exc.args[0]} was still in progress after {OUTCOME_WAIT:g}s (ZooKeeper "
            "away?); commit_status tells its outcome once the replica decides it"
        ) from None
    raise AssertionError("unreachable")


def _await_outcome(lookup: Callable[[], CommitStatus], what: str, how: str) -> CommitStatus:
    """Ask until the replica answers and the commit is no longer in progress. ``what`` names
    the commit, ``how`` how to ask later: said by the OutcomeUnknown raised on giving up."""

    def decided() -> CommitStatus:
        status = lookup()
        if status.status == "committing":
            raise StillCommitting(f"the commit of {status.tid or 'the parts'}")
        return status

    try:
        return _until_decided(decided)
    except ReplicaUnavailable as exc:
        raise errors.OutcomeUnknown(
            f"the outcome of {what} is being decided: its replica did not answer within {OUTCOME_WAIT:g}s "
            f"({exc.message}). {how} answers committed (with the CSN) or aborted once the replica decides, or "
            "once it is gone (its ZooKeeper session expired or it restarted): any replica can then decide it"
        ) from None


def _part_metas(metas: Any, what: str) -> list[PartMeta]:
    """``metas`` as a list of PartMeta, or InvalidInput naming what else it holds (a caller's
    argument: a name, a dict or a path is not a part descriptor)."""
    if isinstance(metas, (str, bytes, Mapping)) or not isinstance(metas, (Sequence, set, frozenset, Iterator)):
        raise InvalidInput(f"{what}: parts must be a list of PartMeta (parts.model.meta), not {quote(metas)}")
    out = list(metas)
    bad = [m for m in out if not isinstance(m, PartMeta)]
    if bad:
        raise InvalidInput(
            f"{what}: parts must be PartMeta (parts.model.meta: write_part returns them), "
            f"not {quote(bad[0])} ({type(bad[0]).__name__})"
        )
    return out


def _check_own_parts(tdef: TableDef, metas: list[PartMeta]) -> None:
    strangers = [m.name for m in metas if m.table != tdef.name]
    if strangers:
        raise InvalidInput(f"part(s) {strangers[:5]} do not belong to table {quote(tdef.name)}")
    if tdef.conflict_policy is Policy.KEYS:
        rows = [m.name for m in metas if keytables.OP not in m.stats]
        if rows:
            raise InvalidInput(
                f"part(s) {rows[:5]} of keys table {quote(tdef.name)} hold rows, not versions: write them "
                "with coordinator.core.keytables.versions (as tx.insert/upsert do)",
                table=tdef.name,
            )


def _overwrite_targets(tdef: TableDef, metas: list[PartMeta], partitions: Sequence[Any] | None) -> list[tuple]:
    """The partitions an overwrite of ``metas`` replaces: those given (every part must be in
    one), else those the parts are in, else the whole table when it is not partitioned."""
    present = list(dict.fromkeys(tuple(m.partition) for m in metas))
    if partitions is not None:
        targets = partition_values(tdef, partitions)
        outside = [p for p in present if p not in targets]
        if outside:
            raise InvalidInput(
                f"overwrite of {quote(tdef.name)}: parts in partition(s) {quote(outside)} "
                f"outside the partitions given {targets}"
            )
        return targets
    return present if tdef.partition_by else [()]


def _rewrite_targets(tdef: TableDef, pkeys: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """The partitions a rewrite (DELETE, UPDATE, compaction) names: those given, else (None) the
    ones its parts are in; an unpartitioned table's one target always."""
    if pkeys is None and not tdef.partition_by:
        return (partition_key(()),)
    return pkeys


def _check_predicate(where: Any, tdef: TableDef, what: str) -> None:
    if not isinstance(where, pc.Expression):
        raise InvalidInput(
            f"{what} on {quote(tdef.name)}: where must be a pyarrow.compute.Expression, not {type(where).__name__}"
        )
    check_expression(where, tdef.schema, f"{what} on {quote(tdef.name)}")


def _refuse_unknown(status: CommitStatus, what: str) -> None:
    """An outcome older than the replicas remember (``"unknown"``: docs/rules.md#outcomes) is
    OutcomeUnknown, never taken for an abort."""
    if status.status == "unknown":
        raise errors.OutcomeUnknown(
            f"{what}: its outcome is older than the replicas remember: {status.reason or status.status}",
            id=status.tid or None,
        )
