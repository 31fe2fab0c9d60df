"""The Python client: transactions against one replica, data read and written in storage directly.

The replica holds the transaction (its snapshot, its staged parts) and decides the commit; the
client does the data work itself (it conforms and partitions rows, writes Parquet parts, reads
and filters visible parts), exactly as a Spark executor would. A part is durable in storage
before the replica hears of it.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import os
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Literal, TypeVar, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from coordinator.core import errors, keyfold, keypoint, keyranges, keytables, retries
from coordinator.core.conflicts import Policy, check_app_version
from coordinator.core.errors import InvalidInput, ReplicaUnavailable, TransactionAborted, quote
from coordinator.core.readsets import SERIALIZABLE, SNAPSHOT, Read, check_isolation
from coordinator.core.tabledata import (
    CHANGE_COLUMNS,
    DEFAULT_PARTITION_VALUE_BYTES,
    PARTITION_VALUE_SETTING,
    apply_update,
    assignments,
    check_expression,
    encode_assignments,
    encode_expression,
    json_scalar,
    may_match,
    partition_key,
    schema_to_json,
    split_by_partition,
)
from coordinator.core.versions import Tid
from coordinator.model.atomicity import ASYNC, FULL, NONE, SYNC, check_modes
from coordinator.model.catalog import TableDef, check_option
from coordinator.model.records import (
    CommitStatus,
    Compact,
    DropTable,
    Insert,
    Mutate,
    Overwrite,
    StagedOp,
    Truncate,
)
from coordinator.model.users import check_name as check_user_name
from coordinator.wire import protocol, security
from coordinator.wire.rpc import RpcClient
from coordinator.wire.security import Credentials
from mergetxn.client.arguments import checked, checked_methods
from mergetxn.client.heartbeat import Heartbeat
from parts.io import keyscan, rewrite
from parts.io.dataset import snapshot_dataset, table_dataset
from parts.io.format import delete_part, read_part
from parts.io.storage import Storage
from parts.io.write import write_data
from parts.model.meta import PartMeta

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
T = TypeVar("T")
CONNECT_TIMEOUT = 10.0  # the first answer (info) of a new client: a port that accepts and never answers
OUTCOME_WAIT = 15.0  # how long a commit whose reply was lost waits for its replica to answer again
OUTCOME_ASK = 3.0  # how long one question about that outcome waits for an answer (any replica)


_UNCHANGED = object()  # alter_table: a setting not given stays as it is


class _StillCommitting(retries.TryAgain):
    """The replica has not decided yet (a commit or a table's creation in progress)."""


class _StaleDefinition(retries.TryAgain):
    """A one-call insert was refused: its parts were written for a definition of the table that a
    DDL replaced since the client cached it. ``refusal``: the replica's answer."""

    def __init__(self, refusal: InvalidInput) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


@checked_methods
class Client:
    """A client of one replica (``host:port``). ``credentials``: a secured cluster's
    (a :class:`coordinator.wire.security.Credentials` or the path of its credentials file); by
    default the file named by ``MERGETXN_CREDENTIALS``, if set. ``timeout``: seconds a call waits
    for its answer; ``long_calls``: the actions that wait longer, and their least wait (default
    :data:`LONG_CALLS`; the command line passes ``{}``: its ``--timeout`` bounds every request)."""

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
        self._no_slim = False  # the replica refused ``visible``'s ``slim`` (older code): not sent again
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

    # -- RPC --------------------------------------------------------------------------------
    def call(self, action: str, **args: Any) -> Any:
        """One request; its answer is waited for ``timeout`` seconds, or longer for the calls
        that legitimately take longer (``long_calls``). An action or a field the protocol
        (coordinator/wire/protocol.py) does not know is InvalidInput before anything is sent."""
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

    def close(self) -> None:
        self._heartbeat.close()
        self._rpc.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- tables ------------------------------------------------------------------------------
    def create_table(
        self,
        name: str,
        schema: pa.Schema,
        partition_by: Sequence[str] = (),
        primary_key: Sequence[str] = (),
        conflict_policy: str = "parts",
        auto_merge: bool = True,
        lock_groups: Mapping[str, Sequence[str]] | None = None,
        atomicity: str = "full",
        txn_max_seconds: float | None = None,
        txn_max_rows: int | None = None,
        retention_seconds: float | None = None,
        parts_to_delay_insert: int | None = None,
        parts_to_throw_insert: int | None = None,
    ) -> int:
        """Create a table; returns the CSN at which it exists. If the connection breaks before
        the answer, the replica is asked whether the table exists as asked (and the creation
        sent again if it does not), so the caller is never left not knowing.
        ``conflict_policy="keys"`` (with ``primary_key``, ``lock_groups``, ``atomicity``): a
        keys table (docs/rules.md#keys-tables, coordinator/core/keytables.py). ``txn_max_seconds`` and
        ``txn_max_rows``: limits for the transactions writing this table (the smallest among the
        tables a transaction wrote and the replica's binds it); a keys table defaults to 60 s and
        100,000 rows, others to none (only the replica-wide limits). ``retention_seconds``: how
        long snapshots and ``changes`` of this table stay readable after a commit replaced what
        they saw (docs/rules.md#history-retention; None: the replica-wide default, 3600 s).
        ``parts_to_delay_insert`` and ``parts_to_throw_insert``: an insert into a partition holding
        that many visible parts is delayed, or refused with TooManyParts (docs/rules.md#too-many-parts;
        None: the replica-wide settings of the same names, 150 and 300; 0: never)."""
        tdef = TableDef.new(
            name,
            schema,
            partition_by,
            primary_key,
            conflict_policy,
            auto_merge,
            lock_groups,
            atomicity,
            txn_max_seconds,
            txn_max_rows,
            retention_seconds,
            parts_to_delay_insert,
            parts_to_throw_insert,
        )
        args = {k: v for k, v in tdef.to_dict().items() if k in _CREATE_FIELDS}  # what a CREATE says
        self._tables.pop(name, None)  # a table of this name dropped before: its definition goes
        try:
            return self.call("create_table", **args)["csn"]
        except ReplicaUnavailable:
            pass  # looked up outside the handler: what that raises does not chain to the break
        return self._created_after_break(tdef, args)

    def _created_after_break(self, tdef: TableDef, args: dict[str, Any]) -> int:
        """After a connection broke before ``create_table``'s answer: look the table up (sending
        the creation again while it does not exist) until it is decided; its created CSN, or
        InvalidInput if a table of that name exists with another definition."""

        def look_up() -> TableDef | int:
            try:
                return TableDef.from_dict(self.call("table", name=tdef.name))
            except errors.TableNotFound:
                try:  # never created (or still on its way): ask again; a twin is refused
                    return self.call("create_table", **args)["csn"]
                except InvalidInput as exc:
                    if "already exists" not in exc.message:
                        raise
                    raise _StillCommitting(f"the creation of table {quote(tdef.name)}") from None  # look again

        found = _until_decided(look_up)
        if isinstance(found, int):
            return found
        if not found.same_definition(tdef):
            raise InvalidInput(f"table {quote(tdef.name)} already exists with another definition", table=tdef.name)
        return found.created_csn

    def table(self, name: str) -> TableDef:
        """The table's definition as this client last looked it up (the latest then)."""
        if name not in self._tables:
            return self._table_at(name, None, None)
        return self._tables[name][0]

    def table_at(self, name: str, snapshot: int | None = None, as_of: dt.datetime | float | None = None) -> TableDef:
        """The table's definition at ``snapshot`` (a CSN) or ``as_of`` (a time), else the latest
        now (asked, not cached): the schema that a read there returns."""
        if as_of is not None:
            when = as_of if isinstance(as_of, float | int) else _timestamp(as_of, "as_of")
            d = self.call("table", name=name, as_of=when)
            return TableDef.from_dict(d)
        return self._table_at(name, snapshot, None)

    def _table_at(self, name: str, snapshot: int | None, ddl: int | None) -> TableDef:
        """The definition at ``snapshot`` (None: the latest), whose last catalog change is ``ddl``
        (None: unknown): from the cache when it holds there, else asked."""
        cached = self._tables.get(name)
        if cached is not None and snapshot is not None and ddl is not None:
            tdef, at = cached
            if tdef.csn <= snapshot and ddl <= at:
                return tdef
        d = self.call("table", name=name, **({} if snapshot is None else {"snapshot": snapshot}))
        tdef, at = TableDef.from_dict(d), int(d.get("at") or 0)
        if cached is None or at >= cached[1]:
            self._tables[name] = (tdef, at)
        return tdef

    def describe_table(self, name: str, snapshot: int | None = None) -> dict:
        """The table at ``snapshot`` (the latest by default): ``schema`` (a pyarrow.Schema),
        ``partition_by``, ``primary_key``, ``conflict_policy``, ``auto_merge``, ``created_csn``,
        ``schema_version`` and ``version_csn`` (the CSN of its last ALTER, 0 if none), what it
        holds (``parts``, ``rows``, ``bytes``, ``partitions``), its ``history`` (created,
        altered: CSN each), and the ``retention_seconds``, ``parts_to_delay_insert`` and
        ``parts_to_throw_insert`` in force (its own, else the replica's)."""
        d = self.call("describe_table", name=name, **({} if snapshot is None else {"snapshot": snapshot}))
        d["schema"] = TableDef.from_dict(d).schema
        d["partition_by"], d["primary_key"] = tuple(d["partition_by"]), tuple(d["primary_key"])
        d.setdefault("version_csn", 0)
        d.setdefault("ddl_version", 0)
        d.pop("changes", None)
        return d

    def drop_table(self, name: str) -> int:
        """DROP TABLE as a transaction of its own; returns its CSN. Reads at older snapshots still
        see the table (while retained); its files are collected by cleanup once no snapshot in
        use sees them; a table of the same name may be created afterwards."""
        with self.transaction() as tx:
            tx.drop_table(name)
        assert tx.csn is not None
        self._tables.pop(name, None)
        return tx.csn

    def alter_table(
        self,
        name: str,
        add_columns: pa.Schema | Sequence[pa.Field] | None = None,
        rename_columns: Mapping[str, str] | None = None,
        retention_seconds: float | None | object = _UNCHANGED,
        parts_to_delay_insert: int | None | object = _UNCHANGED,
        parts_to_throw_insert: int | None | object = _UNCHANGED,
    ) -> int:
        """ALTER TABLE: add nullable columns (rows written before read them as null), rename
        columns ({old: new}; rows written before read under the new names) and change the
        table's ``retention_seconds``, ``parts_to_delay_insert`` and ``parts_to_throw_insert``
        (None: back to the replica-wide default). Returns the CSN from which the new definition
        holds. Partition and key columns cannot be renamed; a bad alter is InvalidInput naming the
        problem and changes nothing."""
        given = dict(
            retention_seconds=retention_seconds,
            parts_to_delay_insert=parts_to_delay_insert,
            parts_to_throw_insert=parts_to_throw_insert,
        )
        options = {k: v for k, v in given.items() if v is not _UNCHANGED}
        for option, value in options.items():
            check_option(name, option, value)
        if add_columns is not None and not isinstance(add_columns, pa.Schema):
            if isinstance(add_columns, pa.Field):
                add_columns = [add_columns]
            if not isinstance(add_columns, Sequence) or not all(isinstance(f, pa.Field) for f in add_columns):
                raise InvalidInput(
                    f"alter {quote(name)}: add_columns must be a pyarrow.Schema or a list of "
                    f"pyarrow.Field, not {quote(add_columns)}"
                )
            add_columns = pa.schema(list(add_columns))
        if rename_columns is not None and not isinstance(rename_columns, Mapping):
            raise InvalidInput(f"alter {quote(name)}: rename_columns must map old column names to new ones")
        args: dict[str, Any] = {"name": name}
        if add_columns is not None:
            args["add_columns"] = schema_to_json(add_columns)
        if rename_columns is not None:
            args["rename_columns"] = dict(rename_columns)
        args.update(options)
        csn = self.call("alter_table", **args)["csn"]
        self._tables.pop(name, None)
        return csn

    def tables(self) -> list[str]:
        return self.call("tables")

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
        limits."""
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
        see it yet; after flush() they do."""
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
        """Act inside a transaction opened elsewhere (a Spark driver's ``txn`` option)."""
        try:
            tid = Tid.parse(txn_id)
        except (ValueError, TypeError) as exc:
            raise InvalidInput(f"join: {exc}", id=txn_id) from None
        return Transaction(self, tid, txn_id, tid.start_csn, joined=True)

    @contextmanager
    def transaction(
        self, isolation: str = SNAPSHOT, atomicity: str = FULL, durability: str = SYNC, table_limits: bool = True
    ) -> Iterator[Transaction]:
        """Commits on normal exit, rolls back on an exception; arguments as :meth:`begin`."""
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

    # -- reads -------------------------------------------------------------------------------
    def read(
        self,
        table: str,
        snapshot: int | None = None,
        as_of: dt.datetime | None = None,
        columns: Sequence[str] | None = None,
        where: pc.Expression | None = None,
    ) -> pa.Table:
        """Rows of ``table`` at the latest snapshot, at ``snapshot`` (a CSN), or ``as_of`` a time."""
        cached = self._tables.get(table)
        exact = _exact_keys(cached, where)
        hint = _point_hint(cached, where, exact)
        # A point read at the latest snapshot takes no lease (one round trip, no renewer thread):
        # the parts it lists were visible a moment ago, so the retention window keeps each one
        # ``retention_seconds`` after a commit removes it; past that (a table with no window),
        # a part cleanup took is CorruptPart below, then SnapshotUnavailable, and the read
        # starts over at the new latest snapshot, as a read whose lease lapsed does.
        lease = {"lease": "none"} if hint and snapshot is None and as_of is None else {}
        # Without a filter no key filter is used: the answer comes slim too (a replica from
        # before this ignores slim without a point hint and answers in full).
        r = self._visible_pruned(_visible_args(table, snapshot, as_of), hint, lease, slim=bool(hint) or where is None)
        try:
            with self._leased(r):
                tdef = self._table_at(table, r["snapshot"], r.get("ddl"))
                return self._read_parts(
                    tdef,
                    [PartMeta.from_dict(m) for m in r["parts"]],
                    columns,
                    where,
                    r.get("csns"),
                    exact=exact if cached is not None and cached[0] is tdef else None,  # parsed for this tdef
                )
        except errors.CorruptPart:
            # Cleanup may have taken a part between the listing and the read (a lease that
            # lapsed). Ask again with the watermark read fresh: SnapshotUnavailable then says so;
            # a latest read starts over.
            try:
                self.call("visible", table=table, snapshot=r["snapshot"], fresh=True, lease="none")
            except errors.SnapshotUnavailable:
                if snapshot is None and as_of is None:
                    return self.read(table, columns=columns, where=where)
                raise
            raise

    def _visible_pruned(
        self, args: dict[str, Any], hint: dict[str, Any], lease: dict[str, Any], slim: bool = True
    ) -> dict:
        """``visible`` for a read; ``slim``: the parts come without their key filters, which the
        read does not need (a point read's replica pruned with them; a whole read folds every
        part): keytables.point_summary. A replica from before ``slim`` refuses the field:
        asked again without it."""
        if not slim or self._no_slim:
            return self.call("visible", **args, **hint, **lease)
        try:
            return self.call("visible", **args, **hint, **lease, slim=True)
        except InvalidInput as exc:
            if exc.details.get("field") != "slim":
                raise
            self._no_slim = True
            return self.call("visible", **args, **hint, **lease)

    @contextmanager
    def scan(
        self,
        table: str,
        snapshot: int | None = None,
        as_of: dt.datetime | None = None,
        memory_budget: int | None = None,
    ) -> Iterator[tuple[int, list[PartMeta], Iterator[pa.Table]]]:
        """Read ``table`` at one snapshot part by part, one part in memory at a time (the
        command line streams big tables so): yields ``(snapshot, parts, tables)``, ``tables``
        giving each part's rows in the table's schema. A keys table's versions fold per key, so
        ``tables`` gives its rows (one per key) partition by partition and, within a partition
        bigger than ``memory_budget`` bytes (default 256 MiB) can fold at once, key range by key
        range, each table sorted by key and the ranges in key order (``parts`` then counts
        versions). The snapshot stays leased until the block ends."""
        r = self.call("visible", **_visible_args(table, snapshot, as_of))
        metas = [PartMeta.from_dict(m) for m in r["parts"]]
        budget = keyranges.DEFAULT_BUDGET if memory_budget is None else memory_budget

        def tables(tdef: TableDef) -> Iterator[pa.Table]:
            if tdef.conflict_policy is Policy.KEYS:  # a key lives in one partition: fold each alone
                by_partition: dict[str, list[PartMeta]] = {}
                for meta in metas:
                    by_partition.setdefault(partition_key(meta.partition), []).append(meta)
                for _, group in sorted(by_partition.items()):
                    yield from self._fold_by_range(tdef, group, r.get("csns") or {}, budget)
                return
            for meta in metas:  # a part written for an older schema reads as the table is at the snapshot
                yield rewrite.read_parts(self.storage, [meta], table=tdef)[0]

        with self._leased(r):
            yield r["snapshot"], metas, tables(self._table_at(table, r["snapshot"], r.get("ddl")))

    def _fold_by_range(
        self, tdef: TableDef, metas: list[PartMeta], csns: Mapping[str, int], budget: int
    ) -> Iterator[pa.Table]:
        """One partition's rows folded key range by key range (coordinator/core/keyranges.py), so
        that each range's versions and their fold fit ``budget``: one pass over the parts reads
        their footers (decoded size) and a sample of the first key column, then each range reads
        every part restricted to it. A partition that surely fits is one range, read as ``read``
        reads it."""
        # Partition columns are constant in a partition: ranges cut the first key column after them.
        column = next((k for k in tdef.primary_key if k not in tdef.partition_by), None)
        if column is None or keyranges.surely_fits(sum(m.size for m in metas), budget):
            yield self._read_keys(tdef, metas, None, None, csns)
            return
        total_rows = sum(m.rows for m in metas)
        most = keyranges.ranges_needed(sum(m.size for m in metas) * keyranges.EXPANSION, budget)
        decoded = 0
        samples = []
        for meta in metas:
            with keyscan.opened(self.storage, meta) as pf:
                decoded += keyscan.decoded_bytes(pf)
                samples.append(keyscan.sample_keys(pf, column, keyranges.sample_stride(meta.rows, total_rows, most)))
        count = keyranges.ranges_needed(decoded, budget)
        inner = keyranges.bounds(pa.chunked_array(samples, tdef.schema.field(column).type), count)
        del samples
        for lo, hi in keyranges.spans(inner):
            parts = [
                (csns.get(m.name, keytables.OWN), keyscan.read_range(self.storage, m, column, lo, hi)) for m in metas
            ]
            data = keyfold.merge(tdef.schema, tdef.primary_key, parts)
            del parts
            if data.num_rows:
                yield data

    @contextmanager
    def pin(
        self, table: str, snapshot: int | None = None
    ) -> Iterator[tuple[TableDef, int, list[PartMeta], dict[str, int]]]:
        """The parts of ``table`` visible at ``snapshot`` (the latest by default) as files, for a
        copy of them (``mergetxn backup``): yields ``(definition, snapshot, parts, csns)``,
        ``csns`` each part's creation CSN (what orders a keys table's versions). The snapshot
        stays leased, so cleanup keeps every file, until the block ends."""
        r = self.call("visible", **_visible_args(table, snapshot, None))
        with self._leased(r):
            tdef = self._table_at(table, r["snapshot"], r.get("ddl"))
            metas = [PartMeta.from_dict(m) for m in r["parts"]]
            try:
                csns = {str(k): int(v) for k, v in (r.get("csns") or {}).items()}
            except (AttributeError, TypeError, ValueError):
                raise errors.CorruptMetadata(
                    f"replica {self.address} answered creation CSNs that do not parse"
                ) from None
            yield tdef, r["snapshot"], metas, csns

    @contextmanager
    def dataset(
        self, table: str, snapshot: int | None = None, as_of: dt.datetime | None = None
    ) -> Iterator[ds.Dataset]:
        """``table`` at the latest snapshot, at ``snapshot`` or ``as_of`` as a
        ``pyarrow.dataset.Dataset`` for DuckDB, Polars and other Arrow engines: the rows ``read``
        returns, each part a fragment with its partition expression and footer statistics (a
        filter skips parts unread); a keys table's fold (one row per key) in memory. Engines read
        the files lazily, so the snapshot stays leased (cleanup keeps them) until the block ends."""
        latest = snapshot is None and as_of is None
        for attempt in range(2):
            r = self.call("visible", **_visible_args(table, snapshot, as_of))
            with self._leased(r):
                tdef = self._table_at(table, r["snapshot"], r.get("ddl"))
                try:
                    built = self._dataset(tdef, [PartMeta.from_dict(m) for m in r["parts"]], r.get("csns"))
                except errors.CorruptPart:
                    # As in read: a part taken by cleanup after a lapsed lease is SnapshotUnavailable
                    # (a latest snapshot starts over once); anything else is the file's fault.
                    try:
                        self.call("visible", table=table, snapshot=r["snapshot"], fresh=True, lease="none")
                    except errors.SnapshotUnavailable:
                        if latest and attempt == 0:
                            continue
                        raise
                    raise
                yield built
                return

    def _dataset(self, tdef: TableDef, metas: list[PartMeta], csns: Mapping[str, int] | None) -> ds.Dataset:
        if tdef.conflict_policy is Policy.KEYS:  # versions fold per key: the fold is the dataset
            return table_dataset(tdef, self._read_keys(tdef, metas, None, None, csns or {}))
        return snapshot_dataset(self.storage, tdef, metas)

    @contextmanager
    def _leased(self, answer: dict) -> Iterator[None]:
        """Keep the read lease named in a replica's ``answer`` (``visible``, ``changes``) while
        the files are read, renewing it every third of its lapse time, then release it, also on
        error: once the read has returned its snapshot is no longer in use."""
        lease = answer.get("lease")
        if lease is None:
            yield
            return
        done = threading.Event()

        def renew() -> None:
            try:
                while not done.wait(answer.get("lease_seconds", 30.0) / 3):
                    if not self.call("renew", lease=lease)["renewed"]:
                        return
            except errors.MergetxnError:
                return  # the lease lapses; a part cleanup takes meanwhile is reported by the read
            finally:
                self._rpc.drop_connection()  # this thread's connection, if it opened one

        renewer = threading.Thread(target=renew, name=f"lease-{lease[:8]}", daemon=True)
        renewer.start()
        try:
            yield
        finally:
            done.set()
            try:
                self.call("release", lease=lease)
            except errors.MergetxnError:
                pass  # it lapses on its own

    def _read_parts(
        self,
        tdef: TableDef,
        metas: list[PartMeta],
        columns: Sequence[str] | None,
        where: pc.Expression | None,
        csns: Mapping[str, int] | None = None,
        exact: list[tuple] | None = None,
    ) -> pa.Table:
        """Rows of ``metas`` under ``tdef`` (parts written for an older schema read as it is now).
        A keys table's parts are versions folded to one row per key (:func:`keyfold.merge`), in the
        order of ``csns`` (part name -> creation CSN; a part without one is the reader's own).
        ``exact``: ``keytables.point_keys(where, ..., exact=True)`` under ``tdef``, when the
        caller has it (not parsed again)."""
        table = tdef.name
        if columns is not None:
            missing = [c for c in columns if c not in tdef.schema.names]
            if missing:
                raise InvalidInput(f"table {quote(table)} has no column(s) {quote(missing)}")
        if tdef.conflict_policy is Policy.KEYS:
            return self._read_keys(tdef, metas, columns, where, csns or {}, exact)
        if where is not None:
            check_expression(where, tdef.schema, f"filter on {quote(table)}")
            metas = [
                m
                for m in metas
                if may_match(
                    tdef.stats_at(m.stats, m.schema_version), list(tdef.partition_by), m.partition, where, tdef.schema
                )
            ]
        tables = rewrite.read_parts(self.storage, metas, table=tdef)
        data = pa.concat_tables(tables) if tables else tdef.schema.empty_table()
        if where is not None:
            data = data.filter(where)
        if columns is not None:
            data = data.select(list(columns))
        return data

    def _read_keys(
        self,
        tdef: TableDef,
        metas: list[PartMeta],
        columns: Sequence[str] | None,
        where: pc.Expression | None,
        csns: Mapping[str, int],
        exact: list[tuple] | None = None,
    ) -> pa.Table:
        wanted = None
        # A filter that is only ``key == literal`` terms (keytables.point_keys, exact) keeps
        # exactly the rows of those keys: it parsed as valid and is not applied after the fold,
        # which reads and folds those keys' versions alone (an Arrow plan each costs a point read
        # more than the rest of its client side).
        if exact is None and where is not None:
            exact = keytables.point_keys(where, tdef.schema, tdef.primary_key, exact=True)
        if exact is not None:
            wanted = exact
        elif where is not None:  # after the fold: a newer version may move a row out of (or into) it
            check_expression(where, tdef.schema, f"filter on {quote(tdef.name)}")
            # A filter that fixes the whole key (``k == 5``) matches only rows of those keys, so a
            # part whose key summary cannot hold one of them adds no version the fold would keep.
            wanted = keytables.point_keys(where, tdef.schema, tdef.primary_key)
        if wanted is not None:
            hashed = {k: keytables.key_hash(k) for k in wanted}
            metas = [m for m in metas if keytables.may_hold_any(m.key_summary, hashed)]
        if where is not None and wanted is not None:
            # Only those keys' versions matter (the fold is per key): of each part, only the row
            # groups whose key statistics may hold one (parts are written sorted by key), and of
            # them only those keys' rows, are read and folded.
            versions = self._point_versions(tdef, metas, csns, wanted)
            few = keypoint.merge_few(tdef.schema, tdef.primary_key, versions)
            data = few if few is not None else keyfold.merge(tdef.schema, tdef.primary_key, versions)
        else:
            data = self._fold_whole(tdef, metas, csns, columns if where is None else None)
        if where is not None and exact is None and data.num_rows:
            data = data.filter(where)
        return data if columns is None else data.select(list(columns))

    def _point_versions(
        self, tdef: TableDef, metas: list[PartMeta], csns: Mapping[str, int], wanted: list[tuple]
    ) -> list[tuple[float, pa.Table]]:
        """``(order, versions of the keys wanted)`` of the parts a point read needs, in the order
        of ``metas``. With plain key columns the parts are read newest first (by
        :func:`keypoint.top_place`) and the rest left once every key has a PUT or DELETE later
        than anything they can hold (:func:`keypoint.settled`): the fold of the parts read is
        the fold of all of them, and a filter's false positive older than a key's last write
        costs nothing."""
        keys = (list(tdef.primary_key), wanted)
        orders = [csns.get(m.name, keytables.OWN) for m in metas]
        if len(metas) < 2 or not keypoint.plain_keys(tdef.schema, tdef.primary_key):
            return [(o, read_part(self.storage, m, keys=keys)) for m, o in zip(metas, orders)]
        return keypoint.newest_first(
            orders,
            [m.stats for m in metas],
            wanted,
            tdef.primary_key,
            lambda i: read_part(self.storage, metas[i], keys=keys),
        )

    def _fold_whole(
        self, tdef: TableDef, metas: list[PartMeta], csns: Mapping[str, int], columns: Sequence[str] | None
    ) -> pa.Table:
        """Every version of ``metas`` folded (``columns``: the ones the caller keeps, None all).
        Of each part only the columns its statistics do not prove constant are decoded
        (:func:`keyfold.read_plan`), in one thread per core (Arrow decodes without the GIL, but
        each part takes it back a few times: 8 threads on 2 cores decoded benchmarks/keys_bench.py's
        120 parts in more wall time than one thread did, and 2 in less than 8 in every run,
        one part alone: Arrow's own threads), then folded
        (:func:`keyfold.merge`)."""
        pk = tuple(tdef.primary_key)
        orders = [csns.get(m.name, keytables.OWN) for m in metas]
        stats = [m.stats for m in metas]
        shared, alone = keyfold.shared_orders(orders, stats), keyfold.alone(pk[0], stats)
        plans = [keyfold.read_plan(tdef.schema, pk, *how, columns) for how in zip(stats, shared, alone)]
        if len(metas) <= 1:
            datas = [keyscan.read_versions(self.storage, m, p, pk, threads=True) for m, p in zip(metas, plans)]
            return keyfold.merge(tdef.schema, pk, list(zip(orders, datas)))
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1, len(metas))) as pool:
            datas = keyscan.read_all_versions(self.storage, metas, plans, pk, pool)
        return keyfold.merge(tdef.schema, pk, list(zip(orders, datas)))

    def snapshot(self) -> int:
        """The replica's snapshot version: everything up to it is applied there."""
        return self.call("snapshot")["snapshot"]

    def wait_for(self, snapshot: int) -> None:
        self.call("wait", snapshot=snapshot)

    # -- operations --------------------------------------------------------------------------
    def compact(self, table: str, kind: str = "minor", partitions: Sequence[Any] | None = None) -> int:
        """Compact now, as a transaction of its own; returns its CSN."""
        if kind not in ("minor", "major"):
            raise InvalidInput(f"compaction kind must be 'minor' or 'major', not {quote(kind)}")
        parts = None if partitions is None else [list(p) for p in _partitions(self.table(table), partitions)]
        return self.call("compact", table=table, kind=kind, partitions=parts)["csn"]

    def transactions(self) -> list[dict]:
        return self.call("transactions")

    def kill(self, txn_id: str) -> dict:
        return self.call("kill", id=str(txn_id))

    # -- users (secured clusters; an admin's calls) ------------------------------------------
    def create_user(self, name: str, role: str, tables: Sequence[str] | None = None) -> Credentials:
        """Add a user of role ``"admin"``, ``"writer"`` or ``"reader"`` with grants on ``tables``
        (None: every table, those created later included); returns its credentials (a new
        secret and this client's CA file), what ``coordinator.connect(..., credentials=)``
        takes: keep them (``.to_file(path)``), the cluster keeps only a salted hash. A name
        that breaks the name rule (coordinator/model/users.py) is InvalidInput before anything."""
        check_user_name(name)
        new = security.make_user_credentials(name, None if self.credentials is None else self.credentials.ca_file)
        if tables is not None and not isinstance(tables, str):
            tables = sorted(tables) if isinstance(tables, (set, frozenset)) else list(tables)
        self.call("create_user", name=name, role=role, tables=tables, secret=new.secret)
        return new

    def drop_user(self, name: str) -> None:
        """Remove a user: its credentials are refused from now on (AuthenticationFailed), on
        every replica, also on its connections already open. The last admin is refused
        (InvalidInput naming it), also when two drops of the last two admins race."""
        self.call("drop_user", name=name)

    def users(self) -> list[dict]:
        """Every user: ``name``, ``role``, ``tables`` (None: every table), ``created_at``."""
        return self.call("users")

    def parts(self, table: str) -> pa.Table:
        rows = self.call("parts", table=table)
        schema = pa.schema(
            [
                ("name", pa.string()),
                ("partition", pa.string()),
                ("path", pa.string()),
                ("rows", pa.int64()),
                ("size", pa.int64()),
                ("creation_tid", pa.string()),
                ("creation_csn", pa.int64()),
                ("removal_tid", pa.string()),
                ("removal_csn", pa.int64()),
                ("visible", pa.bool_()),
                ("why_kept", pa.string()),
                ("collected", pa.bool_()),
            ]
        )
        return pa.Table.from_pylist(rows, schema=schema)

    def gc(self, grace_seconds: float | None = None) -> dict:
        """One cleanup pass now (replicas/cleanup.py): ``{"removed": [...], "kept": [...],
        "min_snapshot", "watermark", "snapshots_in_use", ...}``, each file with its reason."""
        args: dict[str, Any] = {}
        if grace_seconds is not None:
            args["grace_seconds"] = grace_seconds
        return self.call("gc", **args)

    def check(self, tables: str | Sequence[str] | None = None, checksums: bool = True) -> dict:
        """Check storage against the log: every part a read may still need (visible at the latest
        snapshot, or removed and kept for the retention window) is present, of the size and (with
        ``checksums``, reading every file) the checksum it was committed with. ``{"snapshot",
        "ok", "tables": [{"table", "parts", "bytes", "problems": [{"part", "path", "problem",
        "visible"}]}]}``; ``tables``: one name, several, or every table (None)."""
        args: dict[str, Any] = {"checksums": bool(checksums)}
        if tables is not None:
            args["tables"] = [tables] if isinstance(tables, str) else list(tables)
        return self.call("check", **args)

    def changes(self, table: str, start: Any, end: Any = None, by: str = "id", compactions: bool = True) -> pa.Table:
        """Rows of the parts added and removed by the commits whose version is in (start, end]:
        CSNs for ``by="id"`` (compactions included), aware datetimes for ``by="time"`` (compaction
        commits have no time version and never appear). The table's columns plus ``_change``
        ("insert" or "delete") and ``_csn``, in commit order, deletes before inserts.
        ``compactions=False`` by id leaves out what by time leaves out, with CSN bounds (a stream
        of changes by time whose offsets are CSNs)."""
        if by not in ("id", "time"):
            raise InvalidInput(f"by must be 'id' or 'time', not {quote(by)}")
        extra = {} if compactions else {"compactions": False}
        if by == "time":
            lo: Any = _timestamp(start, "start")
            hi: Any = None if end is None else _timestamp(end, "end")
        else:
            for what, v in (("start", start), ("end", end)):
                if (v is not None or what == "start") and (isinstance(v, bool) or not isinstance(v, int)):
                    raise InvalidInput(f"changes by id: {what} must be an integer CSN, not {quote(v)}")
            lo, hi = start, end
        r = self.call("changes", table=table, start=lo, end=hi, by=by, **extra)
        # the schema at the end of the range (the latest when it is open, or by time)
        tdef = self._table_at(table, hi if by == "id" and hi is not None else None, None)
        clash = [c for c in CHANGE_COLUMNS if c in tdef.schema.names]
        if clash:  # a table created before the names were reserved
            with self._leased(r):
                raise InvalidInput(
                    f"changes of {quote(table)}: the table has column(s) {clash}, the names changes "
                    "gives its own columns; rename them (alter_table rename_columns)",
                    table=table,
                )
        if tdef.conflict_policy is Policy.KEYS:
            with self._leased(r):
                return self._key_changes(tdef, r)
        metas = [PartMeta.from_dict(p["part"]) for p in r["parts"]]
        try:
            with self._leased(r):
                datas = rewrite.read_parts(self.storage, metas, table=tdef)
        except errors.CorruptPart:  # collected meanwhile?
            self.call("changes", table=table, start=lo, end=hi, by=by, fresh=True, lease="none", **extra)
            raise
        schema = tdef.schema.append(pa.field("_change", pa.string())).append(pa.field("_csn", pa.int64()))
        pieces = []
        for p, data in zip(r["parts"], datas):
            n = data.num_rows
            data = data.append_column(schema.field("_change"), pa.array([p["change"]] * n, pa.string()))
            pieces.append(data.append_column(schema.field("_csn"), pa.array([p["csn"]] * n, pa.int64())))
        return pa.concat_tables(pieces) if pieces else schema.empty_table()

    def _key_changes(self, tdef: TableDef, r: dict) -> pa.Table:
        """``changes`` of a keys table: row changes per key (:func:`keyfold.row_changes`) from the
        versions the commits in the range wrote, folded onto the rows those keys had at the
        snapshot before the first of them (which the answer's lease holds). A compaction's output
        is left out: it writes no new version (:func:`keytables.folded`)."""
        added: dict[int, list[PartMeta]] = {}
        for p in r["parts"]:
            meta = PartMeta.from_dict(p["part"])
            if p["change"] == "insert" and not keytables.folded(meta):
                added.setdefault(p["csn"], []).append(meta)
        if not added:
            return keytables.changes_schema(tdef.schema).empty_table()
        commits = [(csn, [read_part(self.storage, m) for m in metas]) for csn, metas in sorted(added.items())]
        written = pa.concat_tables([t.select(list(tdef.primary_key)) for _, ts in commits for t in ts])
        first = commits[0][0]
        before = self.read(
            tdef.name, snapshot=first - 1, where=keytables.keys_filter(tdef.primary_key, tdef.schema, written)
        )
        return keyfold.row_changes(tdef.schema, tdef.primary_key, before, commits)

    def events(self, table: str | None = None, since_csn: int | None = None) -> pa.Table:
        """The event log (like ClickHouse's transactions_info_log): commit, part_added and
        part_removed from the log, begin, rollback and merge from this replica's bounded ring
        (``user``: who began the transaction, in a secured cluster)."""
        rows = self.call("events", table=table, since_csn=since_csn)
        schema = pa.schema(
            [
                ("time", pa.timestamp("us", tz="UTC")),
                ("event", pa.string()),
                ("table", pa.string()),
                ("tid", pa.string()),
                ("csn", pa.int64()),
                ("snapshot", pa.int64()),
                ("part", pa.string()),
                ("partition", pa.string()),
                ("rows", pa.int64()),
                ("kinds", pa.string()),
                ("outcome", pa.string()),
                ("reason", pa.string()),
                ("host", pa.string()),
                ("user", pa.string()),
            ]
        )
        for row in rows:
            t = row.get("time")
            row["time"] = None if t is None else dt.datetime.fromtimestamp(t, dt.UTC)
        return pa.Table.from_pylist(rows, schema=schema)

    def app_version(self, app_id: str) -> int | None:
        """The highest version of application ``app_id`` committed (``tx.set_app_version``), or
        None. Answered from the replica's memory: after a commit of this client returns, it is
        seen; a commit made through another replica a moment ago may not be yet (a lower answer,
        never a higher one: the commit itself is decided against the whole log)."""
        app_id, _ = check_app_version(app_id, 0)
        return self.call("app_version", app_id=app_id)["version"]

    def commit_status(self, tid: Tid | str) -> CommitStatus:
        """The outcome of transaction ``tid`` (any replica's), decided here when its replica is gone.

        ``.status`` is ``"committed"`` (``.csn`` set), ``"aborted"``, ``"running"`` or
        ``"committing"`` (the last two only while its replica may still decide), or ``"unknown"``:
        it began before the replica's outcome window (the ``outcome_seconds`` setting, default a
        day) and no part record names it, so its outcome is too old to know (never a guess of
        "aborted"). ``.reason`` says why (docs/rules.md#outcomes). InvalidInput: not a tid."""
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
        the rows go by key through a transaction (begin, insert, commit), as ``tx.insert``."""
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
        metas = write_data(self.storage, tdef, _as_table(data, table), by, limit=limit, sidecar=False)
        try:
            args = {"table": table, "op": "insert", "added": [m.to_dict() for m in metas], "statement": "insert"}
            return self._commit_parts(table, metas, args)
        except ReplicaUnavailable:
            raise  # not known to the replica at all, or never answered: cleanup decides after the grace period
        except errors.MergetxnError as exc:
            if exc.details.get("outcome_looked_up"):
                raise  # decided after the connection broke: cleanup takes the files, behind its fence
            for m in metas:  # refused by the replica: no commit names these fresh names
                delete_part(self.storage, m.path)
            seen = exc.details.get("schema_version") if isinstance(exc, InvalidInput) else None
            if isinstance(exc, InvalidInput) and seen is not None and seen != tdef.ddl_version:
                raise _StaleDefinition(exc) from None
            raise

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
        an idempotent commit, as :meth:`Transaction.set_app_version` does."""
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


def _named(statement: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Name the statement a Transaction method makes in the stage requests it sends, so that a
    refusal (PermissionDenied) names it as the user wrote it: a keys table's upsert, delete_keys
    or lock_keys stages an insert. It only names; the replica checks the operations themselves."""

    def wrap(method: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(method)
        def named(self: Transaction, *args: Any, **kwargs: Any) -> T:
            if self._statement is not None:  # called by another statement: that one names it
                return method(self, *args, **kwargs)
            self._statement = statement
            try:
                return method(self, *args, **kwargs)
            finally:
                self._statement = None

        return named

    return wrap


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
class Transaction:
    """A transaction on one replica. Statements write their parts at once; the commit is atomic.

    It calls its client's private helpers (``_table_at``, ``_read_parts``, ``_dataset``,
    ``_async_queued``, ``_status_anywhere``, ``_heartbeat``): privacy is the module's
    (docs/architecture/index.md), and those are the client's internals, not its public surface."""

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
        self._statement: str | None = None  # the statement being made (see _named)
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
                        if m.name.startswith(self.id + "_"):  # this transaction's own: no commit names it
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
        table's versions, split by partition under the replica's bound)."""
        limit = self.client.max_partition_value_bytes
        return write_data(self.client.storage, tdef, data, self.id, what=what, limit=limit, before_write=before_write)

    def table(self, name: str) -> TableDef:
        """The table's definition as this transaction sees it (at its snapshot; the latest for
        a table created since)."""
        try:
            return self.client._table_at(name, self.snapshot, self._ddl)
        except errors.TableNotFound:
            latest = self.client._table_at(name, None, None)
            if latest.created_csn <= self.snapshot:
                raise
            return latest  # created after the snapshot: a transaction may write it

    def _visible_csns(
        self, table: str, pkeys: list[tuple] | None = None, hint: Mapping[str, Any] | None = None
    ) -> tuple[list[PartMeta], dict[str, int]]:
        """The parts visible to this transaction (in ``pkeys``, when given; only those that may
        hold the keys of a point read's ``hint``) and the creation CSN of each committed one
        (its own parts have none)."""
        args: dict[str, Any] = {"table": table, "id": self.id, **(hint or {})}
        if pkeys is not None:
            args["partitions"] = [list(p) for p in pkeys]
        r = self.client.call("visible", **args)
        return [PartMeta.from_dict(m) for m in r["parts"]], r.get("csns") or {}

    def _visible(self, table: str, pkeys: list[tuple] | None = None) -> list[PartMeta]:
        return self._visible_csns(table, pkeys)[0]

    # -- statements -------------------------------------------------------------------------
    @_named("insert")
    def insert(self, table: str, data: pa.Table) -> int:
        """INSERT INTO; returns the number of rows. On a keys table: rows by key in overwrite
        mode (:meth:`upsert` with ``update=False``)."""
        self._check_open()
        tdef = self.table(table)
        if tdef.conflict_policy is Policy.KEYS:
            return self._write_versions(tdef, data, keytables.PUT)
        data = _as_table(data, table)
        parts = self._write(tdef, data)
        if parts:
            self._stage(Insert(table, tuple(parts)))
        return data.num_rows

    @_named("upsert")
    def upsert(self, table: str, data: pa.Table, update: bool = False) -> int:
        """Write rows by key into a keys table; returns the number of rows. ``update=False``
        (overwrite mode): a row replaces any earlier row with its key, columns absent from
        ``data`` null. ``update=True``: absent columns keep the values they had (a key with no
        row yet gets nulls there); every non-nullable column must be written."""
        self._check_open()
        tdef = _keys_table(self.table(table), "upsert")
        return self._write_versions(tdef, data, keytables.UPDATE if update else keytables.PUT)

    @_named("delete_keys")
    def delete_keys(self, table: str, keys_: pa.Table) -> int:
        """Delete the rows of a keys table with these keys (a pyarrow.Table of the key columns;
        keys without a row are fine); returns the number of keys given."""
        self._check_open()
        tdef = _keys_table(self.table(table), "delete_keys")
        return self._write_versions(tdef, keys_, keytables.DELETE)

    @_named("lock_keys")
    def lock_keys(self, table: str, keys_: pa.Table, mode: str = "shared_strong") -> int:
        """Read-lock keys of a keys table (a pyarrow.Table of the key columns) until the commit:
        it then fails with ConflictError if a transaction that committed after this one's
        snapshot wrote one of them. ``"shared_strong"`` also makes a transaction that writes
        one of them and commits after this one, from an older snapshot, fail;
        ``"shared_weak"`` leaves nothing behind. Read locks never conflict with each other.
        Returns the number of keys given."""
        self._check_open()
        tdef = _keys_table(self.table(table), "lock_keys")
        if self._atomicity == NONE:
            raise InvalidInput(
                f"lock_keys on {quote(table)}: transaction {self.id} was begun with atomicity='none', "
                "which takes no locks (its commits never conflict); lock keys in a transaction begun "
                "with atomicity='full' on a table whose atomicity is 'full'",
                table=table,
                id=self.id,
            )
        if mode not in keytables.LOCK_MODES:
            raise InvalidInput(
                f"lock_keys mode must be one of {sorted(keytables.LOCK_MODES)}, not {quote(mode)}", table=table
            )
        return self._write_versions(tdef, keys_, keytables.LOCK_MODES[mode])

    def _write_versions(self, tdef: TableDef, data: Any, op: int) -> int:
        return self._stage_versions(
            tdef, keytables.versions(tdef.schema, tdef.primary_key, tdef.name, _as_table(data, tdef.name), op, 1)
        )

    def _stage_versions(self, tdef: TableDef, versions: pa.Table) -> int:
        """Number ``versions`` after this transaction's earlier ones (``_seq``: later writes win)
        and stage them as parts; returns how many."""
        n = versions.num_rows
        i = versions.schema.get_field_index(keytables.SEQ)
        versions = versions.set_column(
            i, versions.schema.field(i), pa.array(range(self._seq + 1, self._seq + 1 + n), pa.int64())
        )
        self._seq += n
        parts = self._write(tdef, versions)
        if parts:
            self._stage(Insert(tdef.name, tuple(parts)))
        return versions.num_rows

    @_named("overwrite")
    def overwrite(self, table: str, data: pa.Table, partitions: Sequence[Any] | None = None) -> int:
        """INSERT OVERWRITE: replaces the given partitions, or those present in ``data`` (the
        whole table when it is not partitioned)."""
        self._check_open()
        tdef = self.table(table)
        if tdef.conflict_policy is Policy.KEYS:
            return self._overwrite_keys(tdef, data, partitions)
        targets: list[tuple] = []
        removed: list[str] = []

        def replacing(present: list[tuple]) -> None:  # after the data's checks, before any file is written
            nonlocal targets, removed
            if partitions is not None:
                targets = _partitions(tdef, partitions)
                outside = [p for p in present if p not in targets]
                if outside:
                    raise InvalidInput(
                        f"overwrite of {quote(table)}: data has rows in partition(s) {quote(outside)} "
                        f"outside the partitions given {targets}"
                    )
            else:
                targets = present if tdef.partition_by else [()]
            removed = [m.name for m in self._visible(table, targets)] if targets else []

        data = _as_table(data, table)
        parts = self._write(tdef, data, what="overwrite", before_write=replacing)
        self._stage(Overwrite(table, tuple(parts), tuple(removed), tuple(partition_key(p) for p in targets)))
        return data.num_rows

    def _overwrite_keys(self, tdef: TableDef, data: Any, partitions: Sequence[Any] | None) -> int:
        """INSERT OVERWRITE of a keys table: every key the target partitions hold at this
        transaction's snapshot (with its own writes) is deleted, then ``data`` written in
        overwrite mode; a key in both ends with the new row."""
        data = _as_table(data, tdef.name)
        versions = keytables.versions(
            tdef.schema, tdef.primary_key, tdef.name, data, keytables.PUT, 1
        )  # its problems first
        present = [p for p, _ in split_by_partition(data.select(list(tdef.partition_by)), list(tdef.partition_by))]
        targets: list[tuple] | None
        if partitions is not None:
            targets = _partitions(tdef, partitions)
            outside = [p for p in present if p not in targets]
            if outside:
                raise InvalidInput(
                    f"overwrite of {quote(tdef.name)}: data has rows in partition(s) {quote(outside)} "
                    f"outside the partitions given {targets}"
                )
        else:
            targets = present if tdef.partition_by else None
        self._delete_all_keys(tdef, targets)
        return self._stage_versions(tdef, versions)

    def _delete_all_keys(self, tdef: TableDef, targets: list[tuple] | None) -> int:
        """Delete every key of ``targets`` (partitions; None: the whole table) that a read here
        returns; the read is part of a serializable transaction's read set."""
        if targets == []:
            return 0
        where = None if targets is None else _in_partitions(tdef, targets)
        self._record_read(tdef, where)
        metas, csns = self._visible_csns(tdef.name)
        live = self.client._read_parts(tdef, metas, list(tdef.primary_key), where, csns)
        return self._write_versions(tdef, live, keytables.DELETE) if live.num_rows else 0

    @_named("truncate")
    def truncate(self, table: str, partitions: Sequence[Any] | None = None) -> int:
        """TRUNCATE the table or some partitions; returns the number of parts removed (on a keys
        table: the number of keys deleted, each by a delete version)."""
        self._check_open()
        tdef = self.table(table)
        targets = None if partitions is None else _partitions(tdef, partitions)
        if tdef.conflict_policy is Policy.KEYS:
            return self._delete_all_keys(tdef, targets)
        removed = [m.name for m in self._visible(table, targets)]
        self._stage(
            Truncate(table, tuple(removed), None if targets is None else tuple(partition_key(p) for p in targets))
        )
        return len(removed)

    @_named("delete")
    def delete(self, table: str, where: pc.Expression) -> int:
        """DELETE WHERE ``where``; returns the number of rows deleted. On a keys table it
        deletes by key the rows that match at this transaction's snapshot, with its own writes."""
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

    @_named("update")
    def update(self, table: str, where: pc.Expression, set: Mapping[str, Any]) -> int:  # noqa: A002
        """UPDATE SET ``set`` WHERE ``where``; returns the number of rows updated."""
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

    def _update_keys(self, tdef: TableDef, where: pc.Expression, assigns: dict[str, pc.Expression]) -> int:
        """UPDATE of a keys table: the rows matching at this transaction's snapshot (with its own
        writes) get update-mode versions of the assigned columns (so only their lock groups are
        taken)."""
        fixed = [c for c in assigns if c in tdef.primary_key]
        if fixed:
            raise InvalidInput(
                f"update of keys table {quote(tdef.name)} cannot set primary key column(s) {fixed} "
                "(delete the row and insert it under the new key)",
                table=tdef.name,
            )
        matched = self.read(tdef.name, where=where)  # recorded in the read set
        if not matched.num_rows:
            return 0
        updated, _ = apply_update(matched, where, assigns)
        return self._write_versions(tdef, updated.select([*tdef.primary_key, *assigns]), keytables.UPDATE)

    @_named("compact")
    def compact(self, table: str, kind: str = "minor", partitions: Sequence[Any] | None = None) -> int:
        """Stage a compaction in this transaction; returns the number of parts it replaces."""
        self._check_open()
        if kind not in ("minor", "major"):
            raise InvalidInput(f"compaction kind must be 'minor' or 'major', not {quote(kind)}")
        tdef = self.table(table)
        targets = None if partitions is None else _partitions(tdef, partitions)
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
        as Spark's executors do): cleanup keeps a running transaction's files by that name."""
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
        the replica can redo it if a rebase finds its inputs rewritten."""
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
        A transaction with nothing else in it commits (a sink's empty batch)."""
        self._check_open()
        app_id, version = check_app_version(app_id, version)
        self.client.call("set_app_version", id=self.id, app_id=app_id, version=version)

    def read(self, table: str, columns: Sequence[str] | None = None, where: pc.Expression | None = None) -> pa.Table:
        """Rows at this transaction's snapshot, with its own writes; begun with
        ``atomicity="none"``: the latest state its replica applied at the time of the read,
        with its own writes (non-atomic transactions read the latest data:
        docs/rules.md#atomicity-and-durability)."""
        self._check_open()
        tdef = self.table(table)
        metas, csns = self._visible_csns(table, hint=_point_hint((tdef, 0), where))
        self._record_read(tdef, where)
        return self.client._read_parts(tdef, metas, columns, where, csns)

    @contextmanager
    def dataset(self, table: str) -> Iterator[ds.Dataset]:
        """This transaction's view of ``table`` (its snapshot plus its own writes) as a
        ``pyarrow.dataset.Dataset``, as ``client.dataset`` gives one; a serializable transaction
        records it as a read of the whole table. The running transaction keeps its snapshot (and
        its own files) in use, so no lease is taken; use it before the transaction ends."""
        self._check_open()
        tdef = self.table(table)
        metas, csns = self._visible_csns(table)
        self._record_read(tdef, None)
        yield self.client._dataset(tdef, metas, csns)

    @_named("drop_table")
    def drop_table(self, table: str) -> None:
        """DROP TABLE in this transaction: at its CSN the table stops existing (its parts are
        removed then, whoever committed them); a transaction that wrote the table and commits
        after it fails with ConflictError naming the drop. It cannot also write the table."""
        self._check_open()
        self.table(table)
        self._stage(DropTable(table))

    # -- ending -------------------------------------------------------------------------------
    @_decided_once
    def commit(self) -> int | None:
        """Commit atomically; returns the CSN (the snapshot for a transaction that wrote nothing).
        Called again after it committed, it returns the same CSN (a retrying caller must not
        write twice). Begun with ``durability="async"``: returns None once the replica holds
        the commit in memory, before ZooKeeper does (``client.flush()`` waits for it; a replica
        crash before then loses it entirely); ``csn`` stays None (``commit_status(tx.id)`` tells
        it later)."""
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
    ``MERGETXN_CREDENTIALS``). Without valid ones a secured replica raises AuthenticationFailed."""
    return Client(address, storage_options, timeout, credentials)


# The fields of a table's definition (TableDef.to_dict) that a CREATE sends; the rest the log decides.
_CREATE_FIELDS = frozenset(
    {
        "name",
        "schema",
        "partition_by",
        "primary_key",
        "conflict_policy",
        "auto_merge",
        "lock_groups",
        "atomicity",
        "txn_max_seconds",
        "txn_max_rows",
        "retention_seconds",
        "parts_to_delay_insert",
        "parts_to_throw_insert",
    }
)


def _check_connect_args(timeout: Any, storage_options: Any) -> None:
    """``connect``'s own arguments, refused as InvalidInput before any socket is opened."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise InvalidInput(f"timeout must be a positive finite number of seconds, not {quote(timeout)}")
    if storage_options is not None and (
        not isinstance(storage_options, Mapping) or not all(isinstance(k, str) for k in storage_options)
    ):
        raise InvalidInput(f"storage_options must be a mapping of option names to values, not {quote(storage_options)}")


def _visible_args(table: str, snapshot: int | None, as_of: dt.datetime | None) -> dict[str, Any]:
    """The ``visible`` request of a read at the latest snapshot, ``snapshot`` or ``as_of``."""
    args: dict[str, Any] = {"table": table}
    if snapshot is not None:
        if isinstance(snapshot, bool) or not isinstance(snapshot, int):
            raise InvalidInput(f"snapshot must be an integer CSN, not {quote(snapshot)}")
        args["snapshot"] = snapshot
    if as_of is not None:
        args["as_of"] = _timestamp(as_of, "as_of")
    return args


def _exact_keys(cached: tuple[TableDef, int] | None, where: pc.Expression | None) -> list[tuple] | None:
    """``keytables.point_keys(where, ..., exact=True)`` under the cached definition of a keys
    table (None when there is none, or the filter is not only key equalities): parsed once for
    the hint and, when the definition still holds at the read's snapshot, for the read."""
    if cached is None or where is None or cached[0].conflict_policy is not Policy.KEYS:
        return None
    try:
        return keytables.point_keys(where, cached[0].schema, cached[0].primary_key, exact=True)
    except (InvalidInput, TypeError, ValueError, pa.ArrowException):
        return None


def _point_hint(
    cached: tuple[TableDef, int] | None, where: pc.Expression | None, exact: list[tuple] | None = None
) -> dict[str, Any]:
    """``point_hint`` for the ``visible`` request of a read of a keys table whose filter fixes
    whole keys (``keytables.point_hint``; from ``exact``, its :func:`_exact_keys`, when given),
    from the definition the client has cached: the replica prunes with it only where the table
    at the read's snapshot has the same key columns."""
    if cached is None or where is None or cached[0].conflict_policy is not Policy.KEYS:
        return {}
    try:
        hint = keytables.point_hint(where, cached[0].schema, cached[0].primary_key, found=exact)
    except (InvalidInput, TypeError, ValueError, pa.ArrowException):
        return {}
    return {} if hint is None else {"point_hint": hint}


def _keys_table(tdef: TableDef, what: str) -> TableDef:
    if tdef.conflict_policy is not Policy.KEYS:
        raise InvalidInput(
            f"{what} needs a keys table; {quote(tdef.name)} has conflict_policy {quote(tdef.conflict_policy.value)}",
            table=tdef.name,
        )
    return tdef


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


def _as_table(data: Any, table: str) -> pa.Table:
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if not isinstance(data, pa.Table):
        raise InvalidInput(f"data for {quote(table)} must be a pyarrow.Table, not {type(data).__name__}")
    return data


def _until_decided(step: Callable[[], T]) -> T:
    """``step`` until the replica answers and raises no ``_StillCommitting`` (bounded)."""
    try:
        for attempt in retries.outcome(OUTCOME_WAIT, on=(ReplicaUnavailable, _StillCommitting)):
            with attempt:
                return step()
    except _StillCommitting as exc:
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
            raise _StillCommitting(f"the commit of {status.tid or 'the parts'}")
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
        targets = _partitions(tdef, partitions)
        outside = [p for p in present if p not in targets]
        if outside:
            raise InvalidInput(
                f"overwrite of {quote(tdef.name)}: parts in partition(s) {quote(outside)} "
                f"outside the partitions given {targets}"
            )
        return targets
    return present if tdef.partition_by else [()]


def _in_partitions(tdef: TableDef, targets: Sequence[tuple]) -> pc.Expression:
    """A filter matching the rows of the partitions ``targets`` (values of ``partition_by``)."""
    expr = None
    for values in targets:
        term = None
        for col, v in zip(tdef.partition_by, values):
            eq = pc.field(col) == pa.scalar(v, tdef.schema.field(col).type)
            term = eq if term is None else term & eq
        expr = term if expr is None else expr | term
    return expr if expr is not None else pc.scalar(True)


def _rewrite_targets(tdef: TableDef, pkeys: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """The partitions a rewrite (DELETE, UPDATE, compaction) names: those given, else (None) the
    ones its parts are in; an unpartitioned table's one target always."""
    if pkeys is None and not tdef.partition_by:
        return (partition_key(()),)
    return pkeys


def _partitions(tdef: TableDef, partitions: Sequence[Any]) -> list[tuple]:
    if not tdef.partition_by:
        raise InvalidInput(f"table {quote(tdef.name)} is not partitioned; partitions must be None")
    if isinstance(partitions, (str, bytes)) or not isinstance(partitions, Sequence):
        raise InvalidInput(f"partitions must be a list of partition values, not {quote(partitions)}")
    out = []
    for p in partitions:
        values = tuple(p) if isinstance(p, (tuple, list)) else (p,)
        if len(values) != len(tdef.partition_by):
            raise InvalidInput(f"partition {quote(p)} does not match partition columns {list(tdef.partition_by)}")
        for col, v in zip(tdef.partition_by, values):
            _check_partition_value(tdef, col, v)
        out.append(tuple(json_scalar(v) for v in values))
    return out


def _check_partition_value(tdef: TableDef, column: str, value: Any) -> None:
    """A partition value given by the caller (truncate, overwrite, compact ``partitions=``) must
    be of its column's type: a value of another type names no partition, and the statement would
    silently do nothing."""
    if value is None:
        return
    t = tdef.schema.field(column).type
    if pa.types.is_boolean(t):
        ok = isinstance(value, bool)
    elif pa.types.is_integer(t):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        ok = isinstance(value, str)
    elif pa.types.is_date(t):
        ok = isinstance(value, dt.date) and not isinstance(value, dt.datetime)
        if isinstance(value, str):
            try:
                dt.date.fromisoformat(value)
                ok = True
            except ValueError:
                ok = False
    else:
        ok = True
    if not ok:
        raise InvalidInput(
            f"partition value {quote(value)} ({type(value).__name__}) does not match partition column "
            f"{quote(column)} of table {quote(tdef.name)}, which is {t}",
            table=tdef.name,
            column=column,
            value=repr(value),
        )


def _check_predicate(where: Any, tdef: TableDef, what: str) -> None:
    if not isinstance(where, pc.Expression):
        raise InvalidInput(
            f"{what} on {quote(tdef.name)}: where must be a pyarrow.compute.Expression, not {type(where).__name__}"
        )
    check_expression(where, tdef.schema, f"{what} on {quote(tdef.name)}")


def _timestamp(when: Any, what: str) -> float:
    if not isinstance(when, dt.datetime) or when.tzinfo is None or when.utcoffset() is None:
        raise InvalidInput(f"{what} must be a timezone-aware datetime, not {quote(when)}")
    return when.timestamp()


def _refuse_unknown(status: CommitStatus, what: str) -> None:
    """An outcome older than the replicas remember (``"unknown"``: docs/rules.md#outcomes) is
    OutcomeUnknown, never taken for an abort."""
    if status.status == "unknown":
        raise errors.OutcomeUnknown(
            f"{what}: its outcome is older than the replicas remember: {status.reason or status.status}",
            id=status.tid or None,
        )
