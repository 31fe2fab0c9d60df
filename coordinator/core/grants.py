"""Who may do what on a secured cluster (docs/surface.md#users-roles-and-grants): the matrix, as data.

Every replica action maps to a :class:`Rule`: the :class:`Right` it needs, the request field that
names its table (None: it acts on no table), and whether it acts on a transaction named by the
request's ``id`` (then a non-admin must own it). The ``stage`` and ``commit`` actions carry
operations, each with a table of its own; each operation needs the right of its kind
(:data:`OP_RIGHTS`). An action or operation kind missing from the tables is an admin's only, so
an action added later is closed until it is given a rule here.

Roles hold rights (:data:`ROLE_RIGHTS`): a reader reads, a writer also writes and kills its own
transactions, an admin does everything. A user's ``tables`` (None: every table, those created
later included) bound its reads and writes; an admin has every table. :func:`check` is the one
decision, pure: allowed, or :class:`~coordinator.core.errors.PermissionDenied` naming the user, the
action and the table. replicas/server.py applies it to every request before any handler runs.

Ids a client holds are no capabilities: a client session (its heartbeats, its async commits'
``flush``) and a read lease (``renew``, ``release``) act for the user that made them only, or an
admin (:func:`acts_for`). Another user's id is answered as an unknown id is (the session is not
known, the lease is not renewed or released, the flush finds no commits), so an answer never tells
that an id is in use by someone else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from coordinator.core.errors import PermissionDenied


class Role(StrEnum):
    ADMIN = "admin"
    WRITER = "writer"
    READER = "reader"


class Right(StrEnum):
    READ = "read"  # every user: of the request's table when it names one
    WRITE = "write"  # writers: of the request's table when it names one
    KILL = "kill"  # writers: their own transactions (an admin: any)
    ADMIN = "admin"  # admins only


ROLE_RIGHTS: dict[Role, frozenset[Right]] = {
    Role.READER: frozenset({Right.READ}),
    Role.WRITER: frozenset({Right.READ, Right.WRITE, Right.KILL}),
    Role.ADMIN: frozenset(Right),
}


@dataclass(frozen=True)
class Rule:
    right: Right
    table: str | None = None  # the request field naming the table
    txn: bool = False  # acts on the transaction the request's "id" names: its owner's (or an admin's)
    ops: bool = False  # carries staged operations ("ops", or one "op"), each checked by its kind


_R, _W = Right.READ, Right.WRITE
ACTIONS: dict[str, Rule] = {
    # Connecting, and what any user may see of the replica.
    "info": Rule(_R),
    "tables": Rule(_R),
    "snapshot": Rule(_R),
    "wait": Rule(_R),
    "app_version": Rule(_R),
    "flush": Rule(_R),  # the caller's own session's async commits (acts_for)
    "renew": Rule(_R),  # the caller's own leases (acts_for)
    "release": Rule(_R),
    # Where part files live (the URL, credentials masked): every client reads and writes its parts
    # there itself; ``info`` shows it (and ZooKeeper's address) to admins only (replicas/server.py).
    "storage": Rule(_R),
    "transactions": Rule(_R),  # a non-admin sees its own only (replicas/server.py)
    "heartbeat": Rule(_R),  # the caller's own client session is alive (replicas/sessions.py, acts_for)
    "peers": Rule(_R),  # the other live replicas' addresses (where to ask for an outcome)
    "commit_status": Rule(_R, "table"),  # by tid, or by part with its table
    # A table's definition (its schema: what a statement needs first) any user may look up, as
    # PostgreSQL's catalogs are; what a table holds only a user with a grant on it.
    "table": Rule(_R),
    # Reads of a table.
    "describe_table": Rule(_R, "name"),
    "parts": Rule(_R, "table"),
    "changes": Rule(_R, "table"),
    "events": Rule(_R, "table"),
    "visible": Rule(_R, "table", txn=True),
    # Transactions: a reader begins one to read; its statements are checked one by one.
    "begin": Rule(_R),
    "add_read": Rule(_R, txn=True),
    "rollback": Rule(_R, txn=True),
    "stage": Rule(_R, txn=True, ops=True),
    "commit": Rule(_R, txn=True, ops=True),
    "set_app_version": Rule(_W, txn=True),
    "kill": Rule(Right.KILL, txn=True),
    # Writes outside a transaction.
    "commit_parts": Rule(_W, "table"),
    "compact": Rule(_W, "table"),
    # Admins only.
    "create_table": Rule(Right.ADMIN, "name"),
    "alter_table": Rule(Right.ADMIN, "name"),
    "gc": Rule(Right.ADMIN),
    "users": Rule(Right.ADMIN),
    "create_user": Rule(Right.ADMIN),
    "drop_user": Rule(Right.ADMIN),
    "backup_mac": Rule(Right.ADMIN),  # seals and checks backup manifests (mergetxn/tools/recovery.py)
    "check": Rule(Right.ADMIN),  # reads every file of the tables asked (mergetxn check, status)
}

OP_RIGHTS: dict[str, Right] = {
    "insert": _W,
    "overwrite": _W,
    "truncate": _W,
    "delete": _W,
    "update": _W,
    "compact": _W,
    "drop_table": Right.ADMIN,
}
# What a client may say it is doing in a stage request ("statement"), to have a refusal name it as
# the user wrote it (a keys table's upsert stages an insert); the operations decide the right.
STATEMENTS = frozenset(
    {
        "insert",
        "upsert",
        "overwrite",
        "truncate",
        "delete",
        "delete_keys",
        "update",
        "compact",
        "lock_keys",
        "drop_table",
    }
)
_ADMIN_ONLY = Rule(Right.ADMIN)
_SHOWN = {"visible": "read"}  # an action by the statement a user made (client.read, tx.read, scans)
# Why a right is refused; READ's is also why a writer may not write a table it has no grant on.
_WHY = {
    Right.READ: "the user has no grant on that table",
    Right.WRITE: "writers and admins only",
    Right.KILL: "writers (their own transactions) and admins only",
    Right.ADMIN: "admins only",
}


@dataclass(frozen=True)
class Grantee:
    """Who asks: a user's name, role and tables (None: every table)."""

    name: str
    role: Role
    tables: frozenset[str] | None = None

    def may(self, right: Right, table: str | None) -> bool:
        """Whether this user holds ``right`` on ``table`` (None: on no table in particular)."""
        if right not in ROLE_RIGHTS[self.role]:
            return False
        return self.role is Role.ADMIN or table is None or self.tables is None or table in self.tables


def acts_for(who: Grantee | None, owner: str | None) -> bool:
    """Whether ``who`` (None: the caller of an unsecured replica, or the replica itself) may act
    on a client session, a read lease or async commits that user ``owner`` made: its own, or
    anyone's for an admin."""
    return who is None or who.role is Role.ADMIN or owner == who.name


def check(
    who: Grantee, action: str, args: Mapping[str, Any], owner_of: Callable[[str], str | None] = lambda txn_id: None
) -> None:
    """Allow ``action`` with ``args`` for ``who``, or raise PermissionDenied (nothing happened).
    ``owner_of(id)``: the user that began the transaction ``id`` names, None when this replica
    does not hold it (the action itself then fails as it would for anyone)."""
    rule = ACTIONS.get(action, _ADMIN_ONLY)
    action = _SHOWN.get(action, action)
    if action == "commit_parts" and args.get("statement") == "insert":
        action = "insert"  # client.insert: a refusal names the statement the user made
    table = args.get(rule.table) if rule.table is not None else None
    if action == "events" and table is None and who.tables is not None and who.role is not Role.ADMIN:
        _deny(who, action, None, Right.READ, "it names no table and the user has grants on some tables only")
    _need(who, action, rule.right, table)
    if action == "begin" and args.get("table_limits") is False:  # a restore's transaction
        _need(who, "begin a transaction free of the tables' limits", Right.ADMIN, None)
    if rule.ops:
        ops = args.get("ops") if "ops" in args else [args.get("op")] if "op" in args else []
        for op in ops if isinstance(ops, list) else []:
            kind = op.get("op") if isinstance(op, dict) else None
            op_table = op.get("table") if isinstance(op, dict) else None
            right = OP_RIGHTS.get(kind, Right.ADMIN) if isinstance(kind, str) else Right.ADMIN
            named = args.get("statement")
            shown = named if named in STATEMENTS else kind if isinstance(kind, str) else action
            _need(who, shown, right, op_table)
    if rule.txn and who.role is not Role.ADMIN and isinstance(args.get("id"), str):
        owner = owner_of(args["id"])
        if owner is not None and owner != who.name:
            _deny(
                who,
                action,
                table if isinstance(table, str) else None,
                rule.right,
                f"transaction {args['id']} belongs to another user",
            )


def _need(who: Grantee, action: str, right: Right, table: object) -> None:
    table = table if isinstance(table, str) else None
    if not who.may(right, table):
        _deny(who, action, table, right, None if right not in ROLE_RIGHTS[who.role] else _WHY[Right.READ])


def _deny(who: Grantee, action: str, table: str | None, right: Right, why: str | None = None) -> None:
    on = f" on table {table!r}" if table is not None else ""
    raise PermissionDenied(
        f"user {who.name!r} ({who.role}) may not {action}{on}: {why or _WHY[right]}",
        user=who.name,
        role=str(who.role),
        action=action,
        table=table,
    )
