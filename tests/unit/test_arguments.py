"""The public API's argument check (mergetxn/client/arguments.py): the plan worked out once per
function (``_Plan``) refuses and accepts exactly what ``check_arguments`` (``signature.bind``)
does, with the same message and details, for plain calls and for every call that falls back to
``bind`` (too many positionals, unknown or repeated keywords, a missing argument, functions
with ``*args``, ``**kwargs``, positional-only or keyword-only parameters)."""

from __future__ import annotations

import datetime as dt
import inspect
from collections.abc import Callable
from typing import Any

import pyarrow.compute as pc
import pytest

from coordinator.core.errors import InvalidInput
from mergetxn.client import arguments
from mergetxn.client.client import Client, Transaction

SELF = object()
WHERE = pc.field("k") == 5


def _star(self: Any, table: str, *rest: Any, snapshot: int | None = None) -> None: ...


def _kw(self: Any, table: str, **more: Any) -> None: ...


def _only(table: str, /, snapshot: int | None = None) -> None: ...


def _keyword_only(self: Any, table: str, *, where: Any = None, columns: Any = None) -> None: ...


def _default_checked(self: Any, table: str = "t", snapshot: int = 3) -> None: ...


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "client.read": Client.read.__wrapped__,  # type: ignore[attr-defined]
    "client.scan": Client.scan.__wrapped__,  # type: ignore[attr-defined]
    "client.create_table": Client.create_table.__wrapped__,  # type: ignore[attr-defined]
    "transaction.read": Transaction.read.__wrapped__,  # type: ignore[attr-defined]
    "star": _star,
    "kw": _kw,
    "only": _only,
    "keyword_only": _keyword_only,
    "default_checked": _default_checked,
}

CASES: list[tuple[str, tuple, dict]] = [
    ("client.read", (SELF, "kv"), {}),
    ("client.read", (SELF, "kv"), {"where": WHERE}),
    ("client.read", (SELF, "kv", None, None, None, WHERE), {}),
    ("client.read", (SELF, "kv", 7), {"columns": ["k"]}),
    ("client.read", (SELF, ""), {}),
    ("client.read", (SELF, 5), {}),
    ("client.read", (SELF, "x" * 2000), {}),
    ("client.read", (SELF,), {}),
    ("client.read", (), {}),
    ("client.read", (SELF, "kv", 1, None, None, None, None), {}),
    ("client.read", (SELF, "kv"), {"table": "x"}),
    ("client.read", (SELF,), {"table": "kv"}),
    ("client.read", (SELF, "kv"), {"bogus": 1}),
    ("client.read", (SELF, "kv"), {"snapshot": -1}),
    ("client.read", (SELF, "kv"), {"snapshot": True}),
    ("client.read", (SELF, "kv"), {"snapshot": 2**63}),
    ("client.read", (SELF, "kv"), {"snapshot": None}),
    ("client.read", (SELF, "kv"), {"as_of": dt.datetime(2026, 1, 1)}),
    ("client.read", (SELF, "kv"), {"as_of": dt.datetime(2026, 1, 1, tzinfo=dt.UTC)}),
    ("client.read", (SELF, "kv"), {"columns": "k"}),
    ("client.read", (SELF, "kv"), {"columns": ("k", 3)}),
    ("client.read", (SELF, "kv"), {"where": 5}),
    ("client.read", (SELF, ""), {"where": 5}),  # the first ruled parameter is the one named
    ("client.read", (SELF, "kv"), {"where": 5, "snapshot": "x"}),
    ("client.scan", (SELF, "kv"), {"memory_budget": 1}),
    ("client.scan", (SELF, "kv"), {"memory_budget": 1 << 30}),
    ("client.create_table", (SELF, "t", None), {}),
    ("client.create_table", (SELF, "t"), {}),
    ("client.create_table", (SELF, "t", None), {"primary_key": "k", "auto_merge": 1}),
    ("transaction.read", (SELF, "kv"), {"where": WHERE}),
    ("transaction.read", (SELF, "kv", ["k"], 3), {}),
    ("star", (SELF, "kv", 1, 2), {"snapshot": 1}),
    ("star", (SELF, 3, 1, 2), {}),
    ("star", (SELF, "kv"), {"snapshot": "x"}),
    ("kw", (SELF, "kv"), {"snapshot": -3, "other": 1}),
    ("kw", (SELF, ""), {}),
    ("only", ("kv",), {"snapshot": 1}),
    ("only", ("",), {}),
    ("only", (), {"table": "kv"}),
    ("keyword_only", (SELF, "kv"), {"where": 3}),
    ("keyword_only", (SELF, "kv", WHERE), {}),
    ("keyword_only", (SELF, "kv"), {"columns": ["a"], "where": WHERE}),
    ("default_checked", (SELF,), {}),
    ("default_checked", (SELF, "t", 3), {}),
    ("default_checked", (SELF,), {"snapshot": -1}),
    ("default_checked", (SELF,), {"table": ""}),
]


def _outcome(check: Callable[[], None]) -> tuple[str, dict] | None:
    try:
        check()
    except InvalidInput as exc:
        return exc.message, exc.details
    return None


@pytest.mark.parametrize(("what", "args", "kwargs"), CASES)
def test_the_plan_answers_as_bind(what: str, args: tuple, kwargs: dict) -> None:
    fn = FUNCTIONS[what]
    signature = inspect.signature(fn)
    expected = _outcome(lambda: arguments.check_arguments(what, signature, args, kwargs))
    got = _outcome(lambda: arguments._Plan(what, signature).check(args, kwargs))
    assert got == expected


def test_the_cases_refuse_and_accept() -> None:
    """The table holds calls of both outcomes, and refusals through ``bind`` and through a rule
    (a comparison of two checks that never refuse would prove nothing)."""
    outcomes = [
        _outcome(lambda: arguments.check_arguments(w, inspect.signature(FUNCTIONS[w]), a, k)) for w, a, k in CASES
    ]
    refused = [o for o in outcomes if o is not None]
    assert len(refused) >= 15 and len(outcomes) - len(refused) >= 10
    assert any("must be" in m for m, _ in refused)
    assert any("argument" in m and "must be" not in m for m, _ in refused)  # bind's TypeError worded


def test_wrapped_public_methods_refuse_before_running() -> None:
    """A checked method refuses a wrong argument with InvalidInput before its body runs."""
    with pytest.raises(InvalidInput, match="client.read: snapshot must be"):
        Client.read(SELF, "kv", snapshot=-1)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="client.read: .*argument"):
        Client.read(SELF, "kv", nonsense=1)  # type: ignore[call-arg]
