"""The replica's RPC actions and their fields, as one table both sides check against.

A request is ``{"a": action, "b": fields}`` (coordinator/wire/rpc.py). :data:`ACTIONS` lists
every action a replica serves (replicas/server.py maps each one to its handler) with each field
it reads: its JSON type(s), and whether it must be there. Which fields name a table or a
transaction for the grants is coordinator/core/grants.py's; what a value means (a known
atomicity, a CSN that is not negative, a part descriptor that parses) stays the handler's.

* The replica checks every request with :func:`check_request` before anything else looks at it
  (the grants, the handler): an unknown action, a missing field, a field of another JSON type or
  a field the action does not take is answered InvalidInput naming the action and the field and
  what it takes, and the connection goes on. Cheap on purpose (a dict lookup per field and an
  exact type test): it runs on the RPC I/O thread for every commit.
* The client checks its own calls with :func:`check_call` before sending: an action or a field
  name this table does not know is a bug in the calling code, raised as InvalidInput at once
  rather than sent. Names only (a dict lookup and a set difference): values are the replica's to
  check, nested ones (operations, part descriptors, reads) by coordinator/model.

Unknown fields are refused rather than ignored: a misspelt optional field (``snapshots``) would
otherwise be a silently different request. Every field a client of this project sends (the
client library, Spark, the tools, replicas asking each other) is in the table.

Besides the request's own fields the RPC layer sets :data:`LAYER_FIELDS` on the server side
(the connection's principal, over anything a peer sent under that name); they are never checked
here. A field the server sets for its own use after the check (replicas/server.py's
``_inflight``) is in no action's fields, so a peer cannot send it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from coordinator.core.errors import InvalidInput, clip, quote
from coordinator.wire.rpc import PRINCIPAL

# JSON types by name, as Python gives them back from coordinator/core/jsonwire.py. Checked by
# exact type: a JSON true is bool, never an integer; a number may be written 3 or 3.0.
STRING, INTEGER, NUMBER, BOOLEAN, ARRAY, OBJECT, NULL = (
    "string",
    "integer",
    "number",
    "boolean",
    "array",
    "object",
    "null",
)
_PY: dict[str, tuple[type, ...]] = {
    STRING: (str,),
    INTEGER: (int,),
    NUMBER: (int, float),
    BOOLEAN: (bool,),
    ARRAY: (list,),
    OBJECT: (dict,),
    NULL: (type(None),),
}
JSON_TYPES = tuple(_PY)
_NAMES: dict[type, str] = {
    str: STRING,
    int: INTEGER,
    float: NUMBER,
    bool: BOOLEAN,
    list: ARRAY,
    dict: OBJECT,
    type(None): NULL,
}

# What the RPC layer adds to every request on the server side: the principal the connection
# authenticated as (None on an unsecured replica; coordinator/wire/rpc.py, replicas/users.py).
LAYER_FIELDS = frozenset({PRINCIPAL})


@dataclass(frozen=True)
class Field:
    """One field of a request: its JSON ``types`` (names above) and whether it must be there."""

    types: tuple[str, ...]
    required: bool = False
    doc: str = ""

    def __post_init__(self) -> None:
        unknown = [t for t in self.types if t not in _PY]
        if not self.types or unknown:
            raise ValueError(f"a field's types are among {sorted(_PY)}, not {self.types!r}")

    @property
    def expected(self) -> str:
        """What a value must be, for a message: ``a string or null``."""
        words = [_ARTICLE[t] for t in self.types]
        return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


_ARTICLE = {
    STRING: "a string",
    INTEGER: "an integer",
    NUMBER: "a number",
    BOOLEAN: "true or false",
    ARRAY: "an array",
    OBJECT: "an object",
    NULL: "null",
}


@dataclass(frozen=True)
class Action:
    """One action: its fields by name, and ``either``: names of which at least one must be there."""

    fields: Mapping[str, Field]
    either: tuple[str, ...] = ()
    doc: str = ""
    # Derived once, for the checks: field -> the Python types its values may have.
    allowed: Mapping[str, frozenset[type]] = field(init=False, repr=False, compare=False)
    required: tuple[str, ...] = field(init=False, repr=False, compare=False)
    names: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "allowed", {n: frozenset(t for name in f.types for t in _PY[name]) for n, f in self.fields.items()}
        )
        object.__setattr__(self, "required", tuple(n for n, f in self.fields.items() if f.required))
        object.__setattr__(self, "names", frozenset(self.fields))
        if not set(self.either) <= self.names:
            raise ValueError(f"either names fields the action does not take: {self.either!r}")


def _f(*types: str, required: bool = False, doc: str = "") -> Field:
    return Field(types, required, doc)


def _req(*types: str, doc: str = "") -> Field:
    return Field(types, True, doc)


_NO_FIELDS: dict[str, Field] = {}
_TID = _req(STRING, doc="a transaction's id (str(Tid))")
_SNAPSHOT = _f(INTEGER, NULL, doc="a CSN (null: the latest)")
_AS_OF = _f(NUMBER, NULL, doc="a Unix timestamp (seconds)")
_TABLE = _req(STRING, doc="a table name")
_LEASE = _f(STRING, doc='a read lease\'s holder: "read", "spark" or "none" (replicas/leases.py)')

ACTIONS: dict[str, Action] = {
    # -- the replica and its catalog ------------------------------------------------------------
    "info": Action(_NO_FIELDS, doc="the replica's state (a non-admin: its own transactions and tables only)"),
    "storage": Action(_NO_FIELDS, doc="where part files live: the storage URL, credentials masked"),
    "peers": Action(_NO_FIELDS, doc="the other live replicas' addresses"),
    "snapshot": Action(_NO_FIELDS, doc="the latest applied CSN"),
    "wait": Action({"snapshot": _req(INTEGER, doc="a CSN to wait for")}),
    "tables": Action(_NO_FIELDS),
    "transactions": Action(_NO_FIELDS, doc="the running transactions (a non-admin's own)"),
    "create_table": Action(
        {
            "name": _TABLE,
            "schema": _req(STRING, doc="schema_to_json of the table's schema"),
            "partition_by": _f(ARRAY),
            "primary_key": _f(ARRAY),
            "conflict_policy": _f(STRING),
            "auto_merge": _f(BOOLEAN),
            "lock_groups": _f(OBJECT, NULL),
            "atomicity": _f(STRING),
            "txn_max_seconds": _f(NUMBER, NULL),
            "txn_max_rows": _f(INTEGER, NULL),
            "retention_seconds": _f(NUMBER, NULL),
            "parts_to_delay_insert": _f(INTEGER, NULL),
            "parts_to_throw_insert": _f(INTEGER, NULL),
            "inline_rows": _f(INTEGER, NULL),
            "inline_bytes": _f(INTEGER, NULL),
        }
    ),
    "table": Action({"name": _TABLE, "snapshot": _SNAPSHOT, "as_of": _AS_OF}),
    "describe_table": Action({"name": _TABLE, "snapshot": _SNAPSHOT}),
    "alter_table": Action(
        {
            "name": _TABLE,
            "add_columns": _f(STRING, NULL, doc="schema_to_json of the columns to add"),
            "rename_columns": _f(OBJECT, NULL, doc="old name -> new name"),
            "retention_seconds": _f(NUMBER, NULL, doc="null: back to the replica-wide default"),
            "parts_to_delay_insert": _f(INTEGER, NULL, doc="null: back to the replica-wide default"),
            "parts_to_throw_insert": _f(INTEGER, NULL, doc="null: back to the replica-wide default"),
            "inline_rows": _f(INTEGER, NULL, doc="null: back to the replica-wide default"),
            "inline_bytes": _f(INTEGER, NULL, doc="null: back to the replica-wide default"),
        }
    ),
    "parts": Action({"table": _TABLE}),
    # -- transactions -----------------------------------------------------------------------------
    "begin": Action(
        {
            "token": _f(STRING, NULL, doc="the client's name for this begin (a begin sent again gets the same one)"),
            "atomicity": _f(STRING),
            "durability": _f(STRING),
            "session": _f(STRING, NULL, doc="the client session holding it (null: detached)"),
            "table_limits": _f(
                BOOLEAN, doc="false: the tables' txn_max_rows/txn_max_seconds do not bind it (a restore; admins)"
            ),
        }
    ),
    "stage": Action(
        {
            "id": _TID,
            "ops": _f(ARRAY, doc="staged operations (coordinator/model/records.py op_from_dict)"),
            "op": _f(OBJECT, doc="one staged operation (instead of ops)"),
            "statement": _f(STRING, doc="the statement the user made, for a refusal's message (grants.STATEMENTS)"),
        },
        either=("ops", "op"),
    ),
    "commit": Action(
        {
            "id": _TID,
            "ops": _f(ARRAY, NULL, doc="operations staged with the commit"),
            "statement": _f(STRING),
        }
    ),
    "rollback": Action({"id": _TID}),
    "kill": Action({"id": _TID}),
    "visible": Action(
        {
            "table": _TABLE,
            "id": _f(STRING, NULL, doc="a transaction's id: its visible parts"),
            "snapshot": _SNAPSHOT,
            "as_of": _AS_OF,
            "partitions": _f(ARRAY, NULL, doc="partition value lists"),
            "fresh": _f(BOOLEAN),
            "lease": _LEASE,
            "point_hint": _f(OBJECT, NULL, doc="coordinator/core/keytables.py point_hint"),
            "slim": _f(
                BOOLEAN, doc="key summaries without their filter (keytables.point_summary): a point or whole read"
            ),
            "vectors": _f(BOOLEAN, doc="a keys table's whole read: each part's deletion vector (replicas/vectors.py)"),
        }
    ),
    "add_read": Action({"id": _TID, "read": _req(OBJECT, doc="coordinator/core/readsets.py Read.to_dict")}),
    "set_app_version": Action({"id": _TID, "app_id": _req(STRING), "version": _req(INTEGER)}),
    "app_version": Action({"app_id": _req(STRING)}),
    "flush": Action({"session": _req(STRING), "ack": _f(ARRAY, NULL, doc="transaction ids of failures reported")}),
    "heartbeat": Action({"session": _req(STRING)}),
    "commit_status": Action(
        {
            "tid": _f(STRING, doc="a transaction's id"),
            "forwarded": _f(BOOLEAN, doc="asked by another replica: answer from here, never ask on"),
            "table": _f(STRING),
            "part": _f(STRING, doc="a part a one-call commit staged (with its table)"),
        },
        either=("tid", "part"),
    ),
    "commit_parts": Action(
        {
            "table": _TABLE,
            "op": _f(STRING, doc='"insert" or "overwrite"'),
            "added": _req(ARRAY, doc="part descriptors (PartMeta.to_dict)"),
            "partitions": _f(ARRAY, NULL, doc="an overwrite's partition value lists"),
            "apps": _f(OBJECT, NULL, doc="app id -> version"),
            "statement": _f(STRING, doc='"insert" from client.insert: a refusal names that statement'),
        }
    ),
    # -- reads outside a transaction, history ------------------------------------------------------
    "changes": Action(
        {
            "table": _TABLE,
            "start": _f(NUMBER, NULL, doc="a CSN (by id) or a timestamp (by time)"),
            "end": _f(NUMBER, NULL),
            "by": _f(STRING, doc='"id" or "time"'),
            "fresh": _f(BOOLEAN),
            "lease": _LEASE,
            "compactions": _f(BOOLEAN),
        }
    ),
    "renew": Action({"lease": _req(STRING, doc="a lease id")}),
    "release": Action({"lease": _req(STRING, doc="a lease id")}),
    "events": Action({"table": _f(STRING, NULL), "since_csn": _f(INTEGER, NULL)}),
    # -- maintenance and users ---------------------------------------------------------------------
    "compact": Action({"table": _TABLE, "kind": _f(STRING), "partitions": _f(ARRAY, NULL)}),
    "gc": Action({"grace_seconds": _f(NUMBER, NULL)}),
    "check": Action({"tables": _f(ARRAY, NULL, doc="table names (null: every table)"), "checksums": _f(BOOLEAN)}),
    "users": Action(_NO_FIELDS),
    "create_user": Action(
        {"name": _req(STRING), "role": _req(STRING), "tables": _f(ARRAY, NULL), "secret": _req(STRING)}
    ),
    "drop_user": Action({"name": _req(STRING)}),
    "backup_mac": Action({"digest": _req(STRING, doc="a backup manifest's SHA-256, 64 hex digits")}),
}


def json_type(value: Any) -> str:
    """The JSON type name of a decoded value (``a set`` and the like for what JSON has not)."""
    return _NAMES.get(type(value)) or type(value).__name__


def _shown(value: Any) -> str:
    """A value as JSON would spell it, with its type, for a message (bounded)."""
    if value is None:
        return "null"
    if type(value) is bool:
        return f"boolean {'true' if value else 'false'}"
    return f"{json_type(value)} {quote(value, 80)}"


def _unknown_action(action: Any) -> InvalidInput:
    return InvalidInput(f"unknown replica action {quote(action, 64)}", action=clip(action, 64))


def check_request(action: str, args: dict) -> None:
    """The replica's check of a request as decoded: InvalidInput naming the action and the field
    (and what it takes) for an unknown action, a missing field, a field of another JSON type or
    one the action does not take. Fields the RPC layer sets (:data:`LAYER_FIELDS`) pass."""
    spec = ACTIONS.get(action)
    if spec is None:
        raise _unknown_action(action)
    allowed = spec.allowed
    for name, value in args.items():
        types = allowed.get(name)
        if types is None:
            if name in LAYER_FIELDS:
                continue
            raise InvalidInput(
                f"{action}: unknown field {quote(name, 64)} (it takes {_takes(spec)})",
                action=action,
                field=clip(name, 64),
            )
        if type(value) not in types:
            want = spec.fields[name].expected
            raise InvalidInput(
                f"{action}: field {name!r} must be {want}, not {_shown(value)}",
                action=action,
                field=name,
                expected=want,
            )
    for name in spec.required:
        if name not in args:
            raise _missing(action, spec, name)
    if spec.either and not any(name in args for name in spec.either):
        raise InvalidInput(
            f"{action}: the request needs field {' or '.join(map(repr, spec.either))}",
            action=action,
            field=spec.either[0],
        )


def check_call(action: str, args: Mapping[str, Any]) -> None:
    """The client's check of its own call before sending (names only: values are the replica's
    to check): InvalidInput naming the action for an action, a field it does not take or a
    missing field, as the replica would answer."""
    spec = ACTIONS.get(action)
    if spec is None:
        raise _unknown_action(action)
    unknown = args.keys() - spec.names
    if unknown:
        name = min(unknown, key=str)
        raise InvalidInput(
            f"{action}: unknown field {quote(name, 64)} (it takes {_takes(spec)})", action=action, field=clip(name, 64)
        )
    for name in spec.required:
        if name not in args:
            raise _missing(action, spec, name)


def _missing(action: str, spec: Action, name: str) -> InvalidInput:
    want = spec.fields[name].expected
    return InvalidInput(
        f"{action}: the request lacks field {name!r} ({want})", action=action, field=name, expected=want
    )


def _takes(spec: Action) -> str:
    return ", ".join(sorted(spec.fields)) or "no fields"
