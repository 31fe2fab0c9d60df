"""The RPC protocol table (coordinator/wire/protocol.py): it lists every action
the replica serves and every field the replica reads and the clients send; a request of an
unknown action, with a field missing, of another JSON type or unknown, is InvalidInput naming
the action and the field. Pure: the sources are read, not run (the wire is tested against a real
replica in tests/faults/test_hostile_rpc.py)."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from coordinator.core import grants
from coordinator.core.errors import InvalidInput
from coordinator.wire import protocol
from coordinator.wire.protocol import ACTIONS, check_call, check_request
from coordinator.wire.rpc import PRINCIPAL

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "replicas" / "server.py"
# Fields the server sets on a request for itself after the check (never a peer's).
SERVER_OWN = {"_inflight"}
# Reads of a handler that a request of that action never reaches: (action, field) -> why.
NEVER_READ = {
    ("commit", "op"): "_commit stages through _stage only with 'ops'; _stage reads 'op' without it "
    "(a stage request's one operation)"
}


def handler_nodes() -> dict[str, ast.expr]:
    """replicas/server.py's handlers, ``{action: handler}``, as source nodes: the dicts the
    server's ``*_handlers`` methods return (``self.handlers`` joins them)."""
    tree = ast.parse(SERVER.read_text())
    found: dict[str, ast.expr] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name.endswith("_handlers"):
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Dict):
                    keys, values = ret.value.keys, ret.value.values
                    found.update({k.value: v for k, v in zip(keys, values) if isinstance(k, ast.Constant)})
    if not found:
        raise AssertionError("replicas/server.py has no *_handlers method returning {action: handler}")
    return found


def read_keys(node: ast.AST, names: frozenset[str] = frozenset({"a", "args"})) -> set[str]:
    """The constant keys read from a request dict named ``a``/``args`` under ``node``:
    ``a["k"]``, ``a.get("k")``, ``a.pop("k")``, ``"k" in a``."""
    keys: set[str] = set()
    for n in ast.walk(node):
        if (
            isinstance(n, ast.Subscript)
            and isinstance(n.value, ast.Name)
            and n.value.id in names
            and isinstance(n.slice, ast.Constant)
            and isinstance(n.slice.value, str)
        ):
            keys.add(n.slice.value)
        elif (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr in ("get", "pop")
            and isinstance(n.func.value, ast.Name)
            and n.func.value.id in names
            and n.args
            and isinstance(n.args[0], ast.Constant)
            and isinstance(n.args[0].value, str)
        ):
            keys.add(n.args[0].value)
        elif (
            isinstance(n, ast.Compare)
            and len(n.ops) == 1
            and isinstance(n.ops[0], ast.In)
            and isinstance(n.comparators[0], ast.Name)
            and n.comparators[0].id in names
            and isinstance(n.left, ast.Constant)
            and isinstance(n.left.value, str)
        ):
            keys.add(n.left.value)
    return keys


def methods(path: Path, cls: str | None = None) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(path.read_text())
    found: dict[str, ast.FunctionDef] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and (cls is None or node.name == cls):
            found.update({f.name: f for f in node.body if isinstance(f, ast.FunctionDef)})
    return found


def test_the_table_lists_exactly_the_replicas_actions_and_the_grants_rules() -> None:
    served = set(handler_nodes())
    assert served == set(ACTIONS), served ^ set(ACTIONS)
    assert set(grants.ACTIONS) == set(ACTIONS), set(grants.ACTIONS) ^ set(ACTIONS)


def test_every_field_a_handler_reads_is_in_its_actions_fields() -> None:
    """Per action, what its handler (a lambda, or a method of the server with what it calls of
    the server's own) reads of the request; the Transactions methods handed the whole request
    (commit_parts) and the inline paths too."""
    server = methods(SERVER, "ReplicaServer")

    def reads(node: ast.AST, seen: set[str]) -> set[str]:
        keys = read_keys(node)
        for n in ast.walk(node):  # self._x(a, ...) of the server's own methods
            if (
                isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute)
                and isinstance(n.func.value, ast.Name)
                and n.func.value.id == "self"
                and n.func.attr in server
                and n.func.attr not in seen
                and any(isinstance(x, ast.Name) and x.id == "a" for x in n.args)
            ):
                seen.add(n.func.attr)
                keys |= reads(server[n.func.attr], seen)
        return keys

    for action, node in handler_nodes().items():
        if isinstance(node, ast.Attribute):  # self._method
            node = server[node.attr]
        keys = reads(node, set()) - SERVER_OWN - {f for a, f in NEVER_READ if a == action}
        assert keys <= ACTIONS[action].names, f"{action} reads {keys - ACTIONS[action].names}, not in its fields"
    registry = methods(ROOT / "replicas" / "registry.py")
    parts_keys = set().union(
        *(read_keys(registry[m]) for m in ("commit_parts", "parts_op", "parts_apps", "committed_retry"))
    )
    assert parts_keys - SERVER_OWN <= ACTIONS["commit_parts"].names
    inline = {m: reads(server[m], set()) - SERVER_OWN for m in ("_commit_parts_async", "_commit_async", "_quick_stage")}
    assert inline["_commit_parts_async"] <= ACTIONS["commit_parts"].names
    assert inline["_commit_async"] - {"op"} <= ACTIONS["commit"].names
    assert inline["_quick_stage"] <= ACTIONS["stage"].names
    # What the grants read of a request: the table fields, and id/ops/op/statement of theirs.
    for action, rule in grants.ACTIONS.items():
        if rule.table is not None:
            assert rule.table in ACTIONS[action].names, (action, rule.table)
        if rule.txn:
            assert "id" in ACTIONS[action].names, action
        if rule.ops:
            assert {"ops", "statement"} <= ACTIONS[action].names, action


def client_calls() -> list[tuple[str, int, str, set[str]]]:
    """Every ``x.call("action", field=...)`` of this project's clients: (file, line, action,
    the keyword names given literally)."""
    calls = []
    files = [*(ROOT / "coordinator").rglob("*.py"), *(ROOT / "mergetxn").rglob("*.py"), *(ROOT / "spark").rglob("*.py")]
    for path in files:
        for n in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute)
                and n.func.attr == "call"
                and n.args
                and isinstance(n.args[0], ast.Constant)
                and isinstance(n.args[0].value, str)
            ):
                names = {k.arg for k in n.keywords if k.arg is not None and k.arg != "timeout"}
                if len(n.args) > 1 and isinstance(n.args[1], ast.Dict):  # RpcClient.call(action, {...})
                    names |= {k.value for k in n.args[1].keys if isinstance(k, ast.Constant)}
                calls.append((str(path.relative_to(ROOT)), n.lineno, n.args[0].value, names))
    return calls


def test_every_call_our_clients_make_names_an_action_and_its_fields() -> None:
    calls = client_calls()
    assert len(calls) > 40  # the scan finds them
    for path, line, action, names in calls:
        if action == "auth":
            continue  # the RPC layer's own (coordinator/wire/rpc.py), before any action
        assert action in ACTIONS, f"{path}:{line} calls unknown action {action!r}"
        assert names <= ACTIONS[action].names, f"{path}:{line}: {action} takes no {names - ACTIONS[action].names}"


# -- the checks -------------------------------------------------------------------------------

SAMPLE = {"string": "x", "integer": 3, "number": 2.5, "boolean": True, "array": [], "object": {}, "null": None}
WRONG = {"string": 7, "integer": "7", "number": "7", "boolean": 1, "array": {}, "object": [], "null": 0}


def valid(action: str) -> dict:
    spec = ACTIONS[action]
    args = {n: SAMPLE[f.types[0]] for n, f in spec.fields.items() if f.required}
    if spec.either:
        args[spec.either[0]] = SAMPLE[spec.fields[spec.either[0]].types[0]]
    return args


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_a_request_of_the_right_shape_passes_and_every_field_of_the_wrong_type_is_named(action: str) -> None:
    spec = ACTIONS[action]
    check_request(action, valid(action))
    check_request(action, {**valid(action), PRINCIPAL: object()})  # the RPC layer's field
    full = {n: SAMPLE[f.types[-1]] for n, f in spec.fields.items()}
    check_request(action, full)
    check_call(action, full)
    for name, f in spec.fields.items():
        wrong = next(v for t, v in WRONG.items() if type(v) not in spec.allowed[name] and t not in f.types)
        with pytest.raises(InvalidInput, match=f"{action}: field '{name}' must be") as err:
            check_request(action, {**valid(action), name: wrong})
        assert err.value.details["field"] == name
        check_call(action, {**valid(action), name: wrong})  # the client checks names only
    for name in spec.required:
        args = valid(action)
        del args[name]
        for check in (check_request, check_call):
            with pytest.raises(InvalidInput, match=f"{action}: the request lacks field '{name}'") as err:
                check(action, args)
            assert err.value.details == {"action": action, "field": name, "expected": spec.fields[name].expected}
    for check in (check_request, check_call):
        with pytest.raises(InvalidInput, match=f"{action}: unknown field 'colour'"):
            check(action, {**valid(action), "colour": "red"})


def test_the_examples_of_the_issue() -> None:
    with pytest.raises(InvalidInput, match="begin: field 'token' must be a string or null, not integer 7"):
        check_request("begin", {"token": 7})
    with pytest.raises(InvalidInput, match="commit: field 'id' must be a string, not integer 5"):
        check_request("commit", {"id": 5})
    with pytest.raises(InvalidInput, match=r"create_table: field 'name' must be a string, not array \['t'\]"):
        check_request("create_table", {"name": ["t"], "schema": "s"})
    with pytest.raises(InvalidInput, match="rollback: the request lacks field 'id'"):
        check_request("rollback", {})
    with pytest.raises(InvalidInput, match="unknown replica action 'no_such_action'"):
        check_request("no_such_action", {})
    with pytest.raises(InvalidInput, match="unknown replica action 'no_such_action'"):
        check_call("no_such_action", {})
    with pytest.raises(InvalidInput, match="stage: the request needs field 'ops' or 'op'"):
        check_request("stage", {"id": "T1-1-r0"})
    with pytest.raises(InvalidInput, match="commit_status: the request needs field 'tid' or 'part'"):
        check_request("commit_status", {})
    # A server's own field is no peer's to send.
    with pytest.raises(InvalidInput, match="unknown field '_inflight'"):
        check_request("commit_parts", {"table": "t", "added": [], "_inflight": "p"})


def test_json_types_are_told_apart_exactly() -> None:
    check_request("wait", {"snapshot": 2**70})  # a big integer is an integer
    for not_an_integer in (True, 3.0, None, "3"):
        with pytest.raises(InvalidInput, match="wait: field 'snapshot' must be an integer"):
            check_request("wait", {"snapshot": not_an_integer})
    for number in (1, 1.5, math.inf, math.nan):  # the replica's handlers judge the value
        check_request("gc", {"grace_seconds": number})
    with pytest.raises(InvalidInput, match="gc: field 'grace_seconds' must be a number or null, not boolean"):
        check_request("gc", {"grace_seconds": False})
    with pytest.raises(InvalidInput, match="check: field 'checksums' must be true or false, not integer 1"):
        check_request("check", {"checksums": 1})
    check_request("begin", {"token": None, "session": None})


def test_messages_stay_short_whatever_a_peer_sends() -> None:
    huge = "x" * 1_000_000
    for action, args in [
        ("begin", {"token": [huge] * 1000}),
        ("begin", {huge: 1}),
        (huge, {}),
        ("info", {"k" * 10_000: huge}),
        ("commit", {"id": {huge: huge}}),
    ]:
        with pytest.raises(InvalidInput) as err:
            check_request(action, args)
        assert len(err.value.message) < 700, err.value.message
        assert len(str(err.value.to_dict())) < 1500


def test_the_table_is_well_formed() -> None:
    for action, spec in ACTIONS.items():
        assert action.isidentifier() and len(action) <= 64
        for name, f in spec.fields.items():
            assert name.isidentifier() and not name.startswith("_"), (action, name)
            assert f.types and set(f.types) <= set(protocol.JSON_TYPES), (action, name)
        assert not (protocol.LAYER_FIELDS & spec.names)
    with pytest.raises(ValueError):
        protocol.Field(("text",))
