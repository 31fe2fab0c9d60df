"""The replica's network face: JSON actions over :mod:`coordinator.wire.rpc`.

Every action takes a JSON object and answers ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": {"type", "message", "details"}}``, so the client re-raises the same
error class (see :mod:`coordinator.core.errors`). Data never passes through here: clients read and
write part files in storage themselves and exchange part descriptors with the replica.

Every request is checked against the protocol's table (coordinator/wire/protocol.py) first, on
the RPC I/O thread, before the grants and any handler look at it: an unknown action, a missing
field, a field of another JSON type or one the action does not take is answered InvalidInput
naming the action and the field, and the connection goes on.

On a secured replica every request comes from a principal (who its connection authenticated as,
replicas/users.py) and is checked against the grants (coordinator/core/grants.py) before its handler
runs, on the inline path and the worker path alike: a call the user may not make is answered
PermissionDenied and changes nothing. Transactions, leases, client sessions, async commits and
running-transaction lists are the user's own (its name is the owner recorded on them; quotas count
by it): another user's lease or session id is answered as an unknown one (coordinator/core/grants.py,
``acts_for``). ``info`` shows a non-admin how the replica is doing, its own transactions and the
tables it has grants on, never ZooKeeper's address nor the storage URL; clients learn where part
files live from ``storage``.
"""

from __future__ import annotations

import errno
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from coordinator.core import deletions, grants, keytables
from coordinator.core.conflicts import Policy
from coordinator.core.errors import AuthenticationFailed, InvalidInput, MergetxnError, ReplicaUnavailable
from coordinator.core.tabledata import partition_key
from coordinator.model.catalog import ALTERABLE, TableDef
from coordinator.model.records import TxnState, op_from_dict
from coordinator.wire import protocol
from coordinator.wire.rpc import PRINCIPAL, RpcServer, error_reply
from coordinator.wire.security import backup_mac
from coordinator.zk.alive import read_alive
from replicas import failpoints, leases, logs, memory, settings
from replicas.replica import Replica
from replicas.settings import ReplicaConfig
from replicas.storage_check import check_tables
from replicas.users import Users

log = logging.getLogger("replicas.server")  # not __name__: it is __main__ under python -m

T = TypeVar("T")

PEERS_SECONDS = 2.0  # how long the answer to ``peers`` is reused (it reads every alive node)

# Actions that only read what the replica holds in memory: never a wait, never any I/O.
_ANSWERED_AT_ONCE = frozenset({"info", "snapshot", "tables", "transactions", "app_version", "heartbeat", "storage"})

# What ``info`` shows a user other than an admin: how the replica is doing, its own transactions and
# the tables it has grants on; neither ZooKeeper's address and root, nor the storage URL, nor what
# tells of other users' work (lease holders, cleanup's and merges' figures, errors naming paths).
_INFO_FOR_USERS = frozenset(
    {
        "host_id",
        "address",
        "snapshot",
        "applied_csn",
        "zk_state",
        "zk_connected",
        "lag",
        "transactions",
        "tables",
        "secure",
        "txn_max_rows",
        "settings",
    }
)


class ReplicaServer(RpcServer):
    def __init__(self, replica: Replica, host: str = "127.0.0.1", port: int = 0) -> None:
        creds = replica.config.credentials  # secured: TLS, users and grants (coordinator/wire/rpc.py)
        super().__init__(
            host,
            port,
            self.dispatch,
            inline=self._inline,
            tls=None if creds is None else creds.server_context(),
            authenticate=None if replica.users is None else replica.users.authenticate,
            limits=replica.config.limits(),
            remembered=None if replica.users is None else replica.users.remembered,
        )
        self.replica = replica
        self.transactions = replica.transactions
        self.address = f"{host}:{self.port}"
        self._peers_seen: tuple[float, list[str]] | None = None
        self._peers_lock = threading.Lock()
        self._probes = keytables.SummaryProbes()  # parsed key summaries of parts (_may_hold)
        self.handlers = {**self._transaction_handlers(), **self._maintenance_handlers()}

    def _transaction_handlers(self) -> dict[str, Callable[[dict], Any]]:
        """The actions on tables, transactions and commits, by name."""
        replica, txns = self.replica, self.transactions
        return {
            "info": self._info,
            "create_table": self._create_table,
            "table": self._table,
            "alter_table": self._alter_table,
            "describe_table": lambda a: replica.describe_table(a["name"], a.get("snapshot")),
            "tables": self._tables,
            "begin": self._begin,
            "stage": self._stage,
            "visible": self._visible,
            "commit": self._commit,
            "set_app_version": lambda a: txns.set_app_version(a["id"], a["app_id"], a["version"]),
            "app_version": lambda a: txns.app_version(a["app_id"]),
            "add_read": lambda a: txns.add_read(a["id"], a["read"]),
            "flush": self._flush_async,
            "storage": lambda a: {"storage_url": replica.storage.url},
            "rollback": lambda a: txns.rollback(a["id"]),
            "heartbeat": lambda a: txns.heartbeat(a["session"], self._grantee(a)),
            "peers": self._peers,
            "kill": lambda a: txns.kill(a["id"]),
            "snapshot": lambda a: {"snapshot": replica.snapshot()},
            "wait": lambda a: replica.wait_snapshot(a["snapshot"]),
            "transactions": self._transactions,
            "parts": lambda a: replica.part_records(a["table"]),
            "commit_status": lambda a: (
                txns.part_status(a.get("table"), a["part"])
                if "part" in a
                else txns.commit_status(a["tid"], bool(a.get("forwarded")))
            ),
            "commit_parts": lambda a: txns.commit_parts(a, owner=_user(a)),
        }

    def _maintenance_handlers(self) -> dict[str, Callable[[dict], Any]]:
        """The actions of maintenance, the change feed, checks and users, by name."""
        replica = self.replica
        return {
            "compact": self._compact,
            "gc": lambda a: replica.cleanup.gc(a.get("grace_seconds")),
            "changes": lambda a: {
                **replica.changefeed.changes(
                    a["table"],
                    a.get("start"),
                    a.get("end"),
                    a.get("by", "id"),
                    bool(a.get("fresh")),
                    a.get("lease", "read"),
                    a.get("compactions", True) is not False,
                    owner=_user(a),
                ),
                "lease_seconds": leases.READ_LEASE_SECONDS,
            },
            "renew": lambda a: replica.leases.renew(a["lease"], self._grantee(a)),
            "release": lambda a: replica.leases.release(a["lease"], self._grantee(a)),
            "events": lambda a: replica.changefeed.events(a.get("table"), a.get("since_csn")),
            "check": self._check,
            "users": lambda a: self._users().describe(),
            "create_user": lambda a: self._users().create(a["name"], a["role"], a.get("tables"), a["secret"]),
            "drop_user": lambda a: self._users().drop(a["name"]),
            "backup_mac": lambda a: {"mac": backup_mac(self._users().identity, a["digest"])},
        }

    # -- who asks, and whether they may (secured replicas) -------------------------------------
    def _denied(self, action: str, args: dict) -> dict | None:
        """The answer refusing ``action`` to the request's principal, or None when it may go
        ahead (always, on an unsecured replica): see coordinator/core/grants.py."""
        users = self.replica.users
        if users is None:
            return None
        try:
            principal = args.get(PRINCIPAL)
            if principal is None:
                raise AuthenticationFailed(f"replica {self.address} requires authentication")
            grants.check(users.grantee(principal), action, args, self._owner)
        except MergetxnError as exc:
            return {"ok": False, "error": exc.to_dict()}
        return None

    def _owner(self, txn_id: str) -> str | None:
        txn = self.transactions.txns.get(txn_id) or self.transactions.finished.get(txn_id)
        return None if txn is None else txn.owner

    def _grantee(self, a: dict) -> grants.Grantee | None:
        principal = a.get(PRINCIPAL)
        return None if principal is None or self.replica.users is None else self.replica.users.grantee(principal)

    def _users(self) -> Users:
        if self.replica.users is None:
            raise InvalidInput(f"replica {self.address} is not secured: it has no users (start it with --credentials)")
        return self.replica.users

    def _info(self, a: dict) -> dict:
        """The replica's ``info``; a non-admin sees only :data:`_INFO_FOR_USERS` of it, its own
        notable transactions and the tables it has grants on."""
        info, who = self.replica.info(), self._grantee(a)
        if who is None or who.role is grants.Role.ADMIN:
            return info
        shown = {k: v for k, v in info.items() if k in _INFO_FOR_USERS}
        shown["transactions"] = {
            kind: [t for t in rows if t.get("owner") == who.name] for kind, rows in info["transactions"].items()
        }
        shown["tables"] = self._tables(a)
        return shown

    def _transactions(self, a: dict) -> list[dict]:
        """The running transactions: a non-admin's own only."""
        who, listed = self._grantee(a), self.transactions.describe()
        if who is None or who.role is grants.Role.ADMIN:
            return listed
        return [t for t in listed if t.get("owner") == who.name]

    def _peers(self, a: dict) -> dict:
        """The addresses of the other live replicas: where a client asks for the outcome of a
        commit whose replica died before answering (mergetxn/client/heartbeat.py)."""
        with self._peers_lock:
            now = time.monotonic()
            if self._peers_seen is None or now - self._peers_seen[0] > PEERS_SECONDS:
                alive = read_alive(self.replica.zk, self.replica.log)
                self._peers_seen = (
                    now,
                    sorted(r.address for h, r in alive.items() if r.address and h != self.replica.host_id),
                )
            return {"replicas": list(self._peers_seen[1])}

    def _tables(self, a: dict) -> list[str]:
        """The tables: those a user has grants on, when it has grants on some only."""
        who, names = self._grantee(a), sorted(self.replica.state.tables)
        if who is None or who.tables is None or who.role is grants.Role.ADMIN:
            return names
        return [n for n in names if n in who.tables]

    def dispatch(self, action: str, args: dict) -> dict:
        handler = self.handlers.get(action)
        if handler is None:
            return {"ok": False, "error": InvalidInput(f"unknown replica action {action!r}").to_dict()}
        denied = self._denied(action, args)
        if denied is not None:
            return denied
        if action != "info":
            try:  # after standing still, nothing is answered before the session is made sure of
                self.replica.pauses.wait_awake(self.replica.config.read_wait_seconds)
            except MergetxnError as exc:
                return {"ok": False, "error": exc.to_dict()}
        return self._envelope(action, handler, args)

    def _envelope(self, action: str, handler: Callable[[dict], object], args: dict) -> dict:
        try:
            return {"ok": True, "result": handler(args)}
        except MergetxnError as exc:
            return {"ok": False, "error": exc.to_dict()}
        except KeyError as exc:
            return {"ok": False, "error": InvalidInput(f"request lacks field {exc}").to_dict()}
        except Exception as exc:  # report, do not kill the connection's thread
            log.exception("action %s failed", action)
            return {"ok": False, "error": MergetxnError(f"{action} failed on the replica: {exc!r}").to_dict()}

    # -- the commit path on the I/O thread (see coordinator/wire/rpc.py) ---------------------------
    def _inline(self, action: str, args: dict, reply: Callable[[dict], None]) -> bool:
        """begin, stage and commit answered without a worker thread when nothing in them can
        wait; anything else (an unknown table to look up, a transaction past a limit to clean
        up, ZooKeeper away, the replica just back from standing still) takes the ordinary path,
        which handles it the same as always.

        Every request comes here first (coordinator/wire/rpc.py), so this is where each is
        checked against the protocol (coordinator/wire/protocol.py): one that does not match
        it is answered InvalidInput here and reaches neither the grants nor a handler."""
        try:
            protocol.check_request(action, args)
        except InvalidInput as exc:
            reply(error_reply(exc))
            return True
        if not self.replica.pauses.awake():
            return False
        if action in self.handlers:
            denied = self._denied(action, args)
            if denied is not None:
                reply(denied)
                return True
        if action == "begin":
            if not self.transactions.ready_to_begin():
                return False
            reply(self._envelope(action, self._begin, args))
            return True
        if action == "stage":
            if not self._quick_stage(args):
                return False
            reply(self._envelope(action, self._stage_here, args))
            return True
        if action == "visible" and self._quick_point_read(args):
            reply(self._envelope(action, self._visible, args))
            return True
        if action == "commit":
            return self._commit_async(args, reply)
        if action == "commit_parts":
            return self._commit_parts_async(args, reply)
        if action in _ANSWERED_AT_ONCE:
            reply(self.dispatch(action, args))
            return True
        return False

    def _quick_point_read(self, a: dict) -> bool:
        """A point read (``visible`` with ``point_hint``) of a table this replica knows: at the
        latest snapshot without a lease (what a keys-table lookup sends), caught up with
        cleanup's watermark, or a running transaction's (what an update-mode write sends for
        its keys' current values) at a snapshot where the table is, the transaction within its
        limits: nothing in it waits (memory, a lock held briefly and the summary probe), so it
        is answered without the hand-off to a worker (a lookup's wake-up of a second thread)."""
        replica = self.replica
        table = a.get("table")
        if (
            a.get("point_hint") is None
            or a.get("snapshot") is not None
            or a.get("as_of") is not None
            or a.get("fresh")
            or not isinstance(table, str)
            or replica.state.table(table) is None
        ):
            return False
        if a.get("id") is not None:
            txn = self.transactions.quick_txn(a["id"])
            return txn is not None and replica.state.table(table, txn.snapshot) is not None
        return a.get("lease") == "none" and replica.retention.node.watermark <= replica.state.applied

    def _quick_stage(self, a: dict) -> bool:
        txn = self.transactions.quick_txn(a.get("id"))
        if txn is None or self.replica.started_wal.compacting:  # a staged part's WAL record would wait
            return False
        ops = a["ops"] if "ops" in a else [a.get("op")]
        if not isinstance(ops, list):
            return False
        rows = txn.rows
        limit = self.transactions.row_limit(txn)[0]
        for op in ops:
            if not isinstance(op, dict) or not isinstance(op.get("table"), str):
                return False
            tdef = self.replica.state.table(op["table"])
            if tdef is None:
                return False  # maybe created elsewhere and not applied here yet: that path waits
            if tdef.txn_max_rows is not None and txn.table_limits:
                limit = min(limit, tdef.txn_max_rows)
            added = op.get("added") or ()
            if added and not self.transactions.verifies_quickly(added):
                return False  # its files are read to check them: on a worker
            if op.get("op") == "insert" and self._crowded(tdef, added):
                return False  # it may wait (docs/rules.md#too-many-parts): on a worker
            if op.get("op") != "compact" and isinstance(added, list):
                rows += sum(m["rows"] for m in added if isinstance(m, dict) and isinstance(m.get("rows"), int))
        return rows <= limit  # over: the full path aborts and cleans up

    def _crowded(self, tdef: TableDef, added: object) -> bool:
        """Whether an insert of the part descriptors ``added`` into ``tdef`` may be delayed or
        refused (docs/rules.md#too-many-parts): it then goes to a worker, where waiting is fine
        (a descriptor whose partition does not parse too: the worker refuses it)."""
        if not isinstance(added, list):
            return False
        try:
            pkeys = {partition_key(tuple(m["partition"])) for m in added if isinstance(m, dict) and "partition" in m}
        except (InvalidInput, TypeError):
            return True
        return self.transactions.crowded(tdef, pkeys)

    def _commit_async(self, a: dict, reply: Callable[[dict], None]) -> bool:
        txn = self.transactions.quick_txn(a.get("id"))
        if txn is None or (a.get("ops") and not self._quick_stage(a)):
            return False
        if not a.get("ops") and self.transactions.mismatch(txn) is not None:
            return False  # the worker ends it: deleting its files is I/O
        if a.get("ops"):
            staged = self._envelope("stage", self._stage_here, a)
            if not staged["ok"]:
                reply(staged)
                return True

        def done(csn: int | None, error: Exception | None) -> None:
            reply({"ok": True, "result": _committed(csn)} if error is None else error_reply(error))

        try:
            self.transactions.commit_async(a["id"], done)
        except MergetxnError as exc:
            reply(error_reply(exc))
        return True

    def _parts_call_is_quick(self, op: object, added: object, table: object) -> bool:
        """Whether a one-call commit (``op``, its ``added`` parts, ``table``) can be decided on the
        RPC I/O thread: an INSERT of parts that nothing makes wait, in rows or parts."""
        replica, txns = self.replica, self.transactions
        tdef = replica.state.table(table) if isinstance(table, str) else None
        if op != "insert" or not isinstance(added, list) or tdef is None:
            return False
        if replica.started_wal.compacting or not txns.ready_to_begin() or not txns.verifies_quickly(added):
            return False
        rows = sum(m["rows"] for m in added if isinstance(m, dict) and isinstance(m.get("rows"), int))
        return rows <= min(
            replica.config.txn_max_rows, tdef.txn_max_rows or replica.config.txn_max_rows
        ) and not self._crowded(tdef, added)  # an insert that may wait goes to a worker

    def _commit_parts_async(self, a: dict, reply: Callable[[dict], None]) -> bool:
        """A one-call commit of an INSERT of parts: begin, stage and hand to the committer here;
        anything that may wait (an overwrite looks up visible parts) goes to a worker, marked as
        in progress first so that an outcome lookup by part name never misses it."""
        txns = self.transactions
        a.pop("_inflight", None)
        added, table = a.get("added"), a.get("table")
        quick = self._parts_call_is_quick(a.get("op", "insert"), added, table)
        if quick:
            try:  # a retry with other metadata than was committed is refused (InvalidInput)
                retried = txns.committed_retry(a)
            except MergetxnError as exc:
                reply(error_reply(exc))
                return True
            if retried is not None:
                reply({"ok": True, "result": retried})
                return True
        if not quick:
            first = added[0] if isinstance(added, list) and added else None
            if isinstance(first, dict) and isinstance(first.get("name"), str):
                txns.parts_call_started(first["name"])
                a["_inflight"] = first["name"]
            return False
        try:
            txn = txns.begin(owner=_user(a))
        except MergetxnError as exc:
            reply(error_reply(exc))
            return True

        def done(csn: int | None, error: Exception | None) -> None:
            reply({"ok": True, "result": {"csn": csn, "tid": txn.id}} if error is None else error_reply(error))

        try:
            op = txns.parts_op(txn, a)
            if op.added:
                txns.stage(txn.id, op, wait=False)
            txns.parts_apps(txn, a)
            txns.commit_async(txn.id, done)
        except Exception as exc:
            txns.abort(txn, f"commit_parts failed: {exc}")
            reply(error_reply(exc))
        return True

    def _check(self, a: dict) -> dict:
        """The storage check (replicas/storage_check.py) of ``tables`` (every table by default)."""
        tables = a.get("tables")
        if tables is None:
            tables = sorted(self.replica.state.tables)
        if not isinstance(tables, list) or not all(isinstance(t, str) for t in tables):
            raise InvalidInput("check: tables must be a list of table names")
        for t in tables:
            self.replica.table(t)  # TableNotFound names it
        checksums = a.get("checksums", True)
        if not isinstance(checksums, bool):
            raise InvalidInput("check: checksums must be true or false")
        # The gc node read now, not the watched copy: a pass elsewhere may have collected since.
        node = self.replica.cleanup.node
        return check_tables(
            self.replica.state,
            self.replica.storage,
            node.refresh(),
            tables,
            checksums,
            node.refresh,
            self.replica.vectors,
        )

    def _create_table(self, a: dict) -> dict:
        from coordinator.core.tabledata import schema_from_json

        tdef = TableDef.new(
            a["name"],
            schema_from_json(a["schema"]),
            a.get("partition_by", ()),
            a.get("primary_key", ()),
            a.get("conflict_policy", "parts"),
            a.get("auto_merge", True),
            a.get("lock_groups"),
            a.get("atomicity", "full"),
            a.get("txn_max_seconds"),
            a.get("txn_max_rows"),
            a.get("retention_seconds"),
            a.get("parts_to_delay_insert"),
            a.get("parts_to_throw_insert"),
            a.get("inline_rows"),
            a.get("inline_bytes"),
        )
        return {"csn": self.replica.create_table(tdef)}

    def _table(self, a: dict) -> dict:
        """A table's definition at ``snapshot`` (the latest: at what is applied now), with the
        snapshot it holds at (``at``): a client may use it for any snapshot whose last catalog
        change is at or before that."""
        snap = a.get("snapshot")
        if a.get("as_of") is not None:
            snap = self.replica.resolve_snapshot(None, a["as_of"])
        if snap is not None:
            return {**self.replica.table(a["name"], snap).to_dict(), "at": snap}
        self.replica.table(a["name"])  # waits for a table created elsewhere
        at = self.replica.state.applied
        return {**self.replica.table(a["name"], at).to_dict(), "at": at}

    def _alter_table(self, a: dict) -> dict:
        from coordinator.core.tabledata import schema_from_json

        add = a.get("add_columns")
        add_schema = None if add is None else schema_from_json(add)
        renames = a.get("rename_columns")
        options = {k: a[k] for k in ALTERABLE if k in a}
        return {"csn": self.replica.alter_table(a["name"], add_schema, renames, options)}

    def _stage(self, a: dict, wait: bool = True) -> None:
        for op in a["ops"] if "ops" in a else [a["op"]]:
            self.transactions.stage(a["id"], op_from_dict(op), wait=wait)

    def _stage_here(self, a: dict) -> None:
        """:meth:`_stage` on the RPC I/O thread: never a sleep (an insert due a delay was handed to
        a worker by :meth:`_quick_stage`; one whose partition filled up since goes undelayed)."""
        self._stage(a, wait=False)

    def _commit(self, a: dict) -> dict:
        """Stage the operations that came with the commit (deferred inserts), then commit."""
        if a.get("ops"):
            self._stage(a)
        return _committed(self.transactions.commit(a["id"]))

    def _begin(self, a: dict) -> dict:
        txn = self.transactions.begin(
            a.get("token"),
            a.get("atomicity", "full"),
            a.get("durability", "sync"),
            a.get("session"),
            owner=_user(a),
            table_limits=a.get("table_limits") is not False,
        )
        return {
            "id": txn.id,
            "tid": list(txn.tid),
            "snapshot": txn.snapshot,
            "ddl": self.replica.state.last_ddl(txn.snapshot),
            "client_session_timeout": self.replica.config.client_session_timeout,
        }

    def _flush_async(self, a: dict) -> dict:
        """``client.flush()``: wait for the async commits of session ``session`` queued so far
        (replicas/async_commits.py); ``ack`` names the failures the client already reported."""
        session, ack = a["session"], a.get("ack") or []
        if not isinstance(session, str) or not isinstance(ack, list) or not all(isinstance(t, str) for t in ack):
            raise InvalidInput("flush needs 'session' (a string) and 'ack' (a list of transaction ids)")
        return self.replica.async_commits.flush(session, ack, who=self._grantee(a))

    def _visible(self, a: dict) -> dict:
        """A transaction's visible parts, or (no ``id``) a read's at a snapshot, with the id of
        the lease that keeps them until the reader sends ``release`` (see replicas/leases.py)."""
        pkeys = None
        if a.get("partitions") is not None:
            pkeys = [partition_key(tuple(p)) for p in a["partitions"]]
        if a.get("id") is not None:
            keep = None if a.get("point_hint") is None else (lambda metas, at: self._may_hold(a, at, metas))
            snap, metas = self.transactions.visible_parts(a["table"], a["id"], pkeys, keep)
            csns = self._csns(metas)
            return {"snapshot": snap, "parts": _part_dicts(a, metas), **csns, **self._own_vectors(a, snap, metas, csns)}
        snap, metas, lease = self.replica.read_parts(
            a["table"],
            a.get("snapshot"),
            a.get("as_of"),
            pkeys,
            fresh=bool(a.get("fresh")),
            lease=a.get("lease", "read"),
            owner=_user(a),
        )
        metas = self._may_hold(a, snap, metas)
        return {
            "snapshot": snap,
            "parts": _part_dicts(a, metas),
            "lease": lease,
            "lease_seconds": leases.READ_LEASE_SECONDS,
            "ddl": self.replica.state.last_ddl(snap),
            **self._csns(metas),
            **self._vectors(a, snap, metas),
        }

    def _vectors(self, a: dict, snapshot: int, metas: list) -> dict:
        """``vectors`` (asked for by a whole read of a keys table): each part's deletion vector
        at ``snapshot`` (replicas/vectors.py), for every part listed; left out when the
        vectors cannot answer, and the reader folds."""
        if a.get("vectors") is not True or a.get("point_hint") is not None:
            return {}
        tdef = self.replica.state.table(a["table"], snapshot)
        if tdef is None or tdef.conflict_policy is not Policy.KEYS:
            return {}
        dead = self.replica.vectors.dead_rows(tdef, snapshot, metas)
        if dead is None:
            return {}
        return {"vectors": {name: deletions.encode_rows(rows) for name, rows in dead.items()}}

    def _own_vectors(self, a: dict, snapshot: int, metas: list, csns: dict) -> dict:
        """``vectors`` for a transaction's whole read: those of its committed parts at its
        snapshot (its own parts have none: the reader folds their versions over the live rows
        of the keys they touch), when it removed none of the table's committed parts."""
        if a.get("vectors") is not True or self.transactions.removed_any(a["table"], a["id"]):
            return {}
        return self._vectors(a, snapshot, [m for m in metas if m.name in csns["csns"]])

    def _may_hold(self, a: dict, snapshot: int, metas: list) -> list:
        """A keys-table read whose filter fixes whole keys (``point_hint``, coordinator/core/keytables.py)
        gets only the parts whose key summary may hold one of them: the others hold no version
        of those keys, so the fold the reader does is the same without them."""
        if a.get("point_hint") is None:
            return metas
        tdef = self.replica.state.table(a["table"], snapshot)
        if tdef is None or tdef.conflict_policy is not Policy.KEYS:
            return metas
        hashed = keytables.hint_hashes(a["point_hint"], tdef.schema, tdef.primary_key)
        if hashed is None:
            return metas
        return self._probes.may_hold(metas, hashed)

    def _csns(self, metas: list) -> dict:
        """``csns``: the creation CSN of each committed part (a transaction's own parts have
        none), which a keys table's read orders versions by (coordinator/core/keytables.py)."""
        return {"csns": self.replica.state.creation_csns(m.name for m in metas)}

    def _compact(self, a: dict) -> dict:
        from parts.io import rewrite

        replica, txns = self.replica, self.transactions
        table = replica.table(a["table"])
        txn = txns.begin(owner=_user(a))
        try:
            pkeys = None if a.get("partitions") is None else [partition_key(tuple(p)) for p in a["partitions"]]
            _, visible = txns.visible_parts(table.name, txn.id, pkeys=pkeys)
            kind = a.get("kind", "minor")
            csns = self._csns(visible)["csns"]
            result = rewrite.compact(replica.storage, table, visible, kind, txn.id, csns, spill=True)
            partitions = None if pkeys is None else tuple(pkeys)
            op = result.compaction(table.name, kind, partitions, rows=sum(m.rows for m in result.added))
            if op.removed:
                txns.stage(txn.id, op, written_here=True)
            if failpoints.ON and any(m.inlined and m.name in op.removed for m in visible):
                failpoints.hit("flush_before_commit")  # a flush: its file written, not committed
            csn = txns.commit(txn.id)
        except BaseException:
            if txn.state == TxnState.RUNNING:
                txns.abort(txn, "compaction failed")
            raise
        return {"csn": csn, "tid": txn.id, "removed": len(op.removed), "added": len(op.added)}


def _part_dicts(a: dict, metas: list) -> list[dict]:
    """The parts of a ``visible`` answer; ``slim`` (a point read's, which the replica pruned with
    its ``point_hint``, or a whole read's, which folds every part): each key summary without its
    filter (keytables.point_summary; 1,000 parts' filters made a whole read's answer 3 MB)."""
    if not a.get("slim"):
        return [m.to_dict() for m in metas]
    out = []
    for m in metas:
        d = m.to_dict()
        if m.key_summary is not None:
            d["key_summary"] = keytables.point_summary(m.key_summary)
        out.append(d)
    return out


def _user(a: dict) -> str | None:
    """The name of the user a request comes from (None on an unsecured replica)."""
    principal = a.get(PRINCIPAL)
    return None if principal is None else principal.name


def _committed(csn: int | None) -> dict:
    """A commit's answer: its CSN, or (None) that it was queued as an async commit."""
    return {"csn": csn} if csn is not None else {"csn": None, "queued": True}


# The RPC I/O thread, the committer and kazoo's thread hand the GIL to each other at every system
# call; a shorter switch interval than the default 5 ms keeps their wake-up latency down, while a
# very short one (0.5 ms) costs more in forced switches than it gains (measured with
# benchmarks/commit_throughput.py: 2 ms gave the most commits per second).
SWITCH_INTERVAL = 0.002


def run(config: ReplicaConfig, ready_file: Path | None = None) -> None:
    """A replica process: what ``python -m replicas.server`` and ``mergetxn replica start`` run.
    Sets this process's GIL switch interval and logging (replicas/logs.py: ``MERGETXN_LOG`` and
    ``MERGETXN_LOG_FILE``, unless the command line set it up already), then :func:`serve`."""
    sys.setswitchinterval(SWITCH_INTERVAL)
    if not logs.configured():
        logs.configure()
    serve(config, ready_file)


def serve(config: ReplicaConfig, ready_file: Path | None = None) -> None:
    """Run a replica until SIGTERM/SIGINT; print ``READY <address>`` once it serves (and first
    ``METRICS <url>`` when it serves metrics, ``--metrics-port``). Its ports are bound before it
    registers, so a port in use fails the start with nothing registered; SIGHUP reopens the log
    file (replicas/logs.py), for logrotate."""
    replica = Replica(config)
    server = _bind(lambda: ReplicaServer(replica, config.host, config.port), "--port", config.host, config.port)
    rpc = threading.Thread(target=_serve_or_exit, args=(server,), name="rpc", daemon=True)
    metrics_server = _start_replica(replica, server, rpc)
    if replica.metrics_address:
        print(f"METRICS http://{replica.metrics_address}/metrics", flush=True)
    stop, hup = _signal_events(config.host_id)
    if failpoints.enabled():  # a test breaks the loop here (tests/faults/test_hostile_rpc.py)
        server.fault = _loop_fault
    rpc.start()
    if ready_file is not None:
        tmp = Path(str(ready_file) + ".tmp")
        tmp.write_text(server.address)
        os.replace(tmp, ready_file)
    log.info(
        "replica %s serving at %s%s",
        config.host_id,
        server.address,
        f", metrics at http://{replica.metrics_address}/metrics" if replica.metrics_address else "",
    )
    print(f"READY {server.address}", flush=True)
    # A bare wait() never wakes for a signal that the kernel delivered to another thread
    # (Python runs handlers only on the main thread, between bytecodes): poll instead.
    while not stop.wait(0.2):
        if hup.is_set():
            hup.clear()
            logs.reopen()
    server.shutdown()
    if metrics_server is not None:
        metrics_server.shutdown()
    replica.stop()


def _start_replica(replica: Replica, server: ReplicaServer, rpc: threading.Thread) -> Any:
    """Bind the metrics port (when asked), then start the replica at the server's address; the
    metrics server, or None. A start that fails shuts down what was bound and stops the replica."""
    config = replica.config
    metrics_server = None
    try:
        port = config.metrics_port
        if port is not None:
            from replicas import exporter

            replica.metrics_address, metrics_server = _bind(
                lambda: exporter.serve(replica, config.host, port, rpc.is_alive),
                "--metrics-port",
                config.host,
                port,
            )
        replica.set_address(server.address)
        replica.start()
    except BaseException:
        server.shutdown()
        if metrics_server is not None:
            metrics_server.shutdown()
        replica.stop()
        raise
    return metrics_server


def _signal_events(host_id: str) -> tuple[threading.Event, threading.Event]:
    """SIGTERM and SIGINT set the first event (stop), SIGHUP the second (reopen the log file)."""
    stop = threading.Event()

    def on_signal(signum, frame):
        log.info("replica %s got %s: shutting down", host_id, signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    hup = threading.Event()  # reopened by the loop below, not in the handler (it may interrupt a log line)
    signal.signal(signal.SIGHUP, lambda signum, frame: hup.set())
    return stop, hup


def _bind(make: Callable[[], T], flag: str, host: str, port: int) -> T:
    """``make()`` (a server binding ``host:port``), with a port in use refused as InvalidInput."""
    try:
        return make()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise InvalidInput(f"{flag} {port}: {host}:{port} is in use by another process", port=port) from None
        raise


# The exit status of a replica whose RPC loop died (a bug): its supervisor restarts it.
EXIT_RPC_DIED = 70
# ZooKeeper did not answer the start: mergetxn's exit code for "unavailable" (mergetxn/cli/output.py).
EXIT_UNAVAILABLE = 5


def _serve_or_exit(server: ReplicaServer) -> None:
    """Serve; should the loop die, end the process: a replica that stays registered while it
    no longer listens is worse than one that is gone (clients and peers move on from that)."""
    try:
        server.serve_forever()
    except BaseException:
        log.critical(
            "the RPC loop of replica %s died: exiting with status %d so that it is restarted",
            server.address,
            EXIT_RPC_DIED,
        )
        logging.shutdown()
        os._exit(EXIT_RPC_DIED)


def _loop_fault() -> None:
    if failpoints.armed("rpc_loop_dies"):
        raise RuntimeError("failpoint rpc_loop_dies")


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m replicas.server")
    settings.add_arguments(p)
    p.add_argument("--ready-file", default=None)
    a = p.parse_args(argv)
    faulthandler.enable()  # a crash in native code (a signal) leaves every thread's stack on stderr, the replica's log
    memory.tune()  # glibc's heaps for months of use (replicas/memory.py), before any thread starts
    try:
        config = settings.from_arguments(a)
    except InvalidInput as exc:  # protected mode, say: one line, exit status 2
        p.error(exc.message)
    try:
        run(config, Path(a.ready_file) if a.ready_file else None)
    except InvalidInput as exc:  # a host id held, a port in use, the wrong storage: one line, status 2
        log.error("replica %s did not start: %s", config.host_id, exc.message)
        p.exit(2, f"error: {exc.message}\n")
    except ReplicaUnavailable as exc:  # ZooKeeper not there: one line, status 5 (as mergetxn's)
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # its connection thread's retries: not after our line
        log.error("replica %s did not start: %s", config.host_id, exc.message)
        p.exit(EXIT_UNAVAILABLE, f"error: {exc.message}\n")


if __name__ == "__main__":
    main()
