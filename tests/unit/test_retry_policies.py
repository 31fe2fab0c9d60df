"""Every tenacity retry of production code is a named policy of coordinator/core/retries.py
(item 4: one idiom per concern, stated once).

This scans the production packages' source (the AST) and fails on a module other than
retries.py that imports from tenacity anything but its types (``Retrying``, ``RetryCallState``,
``AttemptManager``, for annotations), imports ``tenacity`` itself, or calls ``Retrying(...)``:
how long, how often and on what a loop tries again is then read in one module, by name.
kazoo's ``zk.retry`` is kazoo's own (see retries.py's docstring).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from tenacity import wait_fixed

from coordinator.core import retries

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("coordinator", "parts", "replicas", "spark", "mergetxn")
POLICIES = "coordinator/core/retries.py"
TYPES = {"Retrying", "RetryCallState", "AttemptManager"}


def inline_retries(path: Path) -> list[tuple[int, str]]:
    """(line, what) of each retry set up outside the named policies."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tenacity":
            found.extend(
                (node.lineno, f"from {node.module} import {a.name}") for a in node.names if a.name not in TYPES
            )
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, f"import {a.name}") for a in node.names if a.name.split(".")[0] == "tenacity")
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name == "Retrying":
                found.append((node.lineno, ast.unparse(f) + "(...)"))
    return sorted(found)


def test_every_retry_is_a_named_policy() -> None:
    bad = [
        f"{f.relative_to(ROOT).as_posix()}:{line}: {what}"
        for pkg in PACKAGES
        for f in sorted((ROOT / pkg).rglob("*.py"))
        if f.relative_to(ROOT).as_posix() != POLICIES
        for line, what in inline_retries(f)
    ]
    assert not bad, "retries set up outside coordinator/core/retries.py (name a policy there):\n  " + "\n  ".join(bad)


def test_the_scan_finds_inline_retries(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text(
        "import tenacity\n"
        "from tenacity import Retrying, stop_after_delay\n"  # the type is fine, a setting is not
        "from coordinator.core import retries\n"
        "def f(g):\n"
        "    retries.harness_wait(1.0)(g)\n"  # a named policy: fine
        "    return Retrying(stop=stop_after_delay(1))(g), tenacity.Retrying()\n"
    )
    assert inline_retries(f) == [
        (1, "import tenacity"),
        (2, "from tenacity import stop_after_delay"),
        (6, "Retrying(...)"),
        (6, "tenacity.Retrying(...)"),
    ]


# -- the chaos harness's policies ----------------------------------------------------------------
class Flaky:
    """Raises each of ``errors`` once, in turn, then answers ``answer``; counts its calls."""

    def __init__(self, *errors: BaseException, answer: object = "ok") -> None:
        self.errors, self.answer, self.calls = list(errors), answer, 0

    def __call__(self) -> object:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.answer


def test_harness_wait_retries_its_errors_only() -> None:
    ok = Flaky(retries.TryAgain("a"), retries.TryAgain("b"))
    assert retries.harness_wait(5.0, every=0)(ok) == "ok" and ok.calls == 3
    other = Flaky(ValueError("not retried"))
    with pytest.raises(ValueError):
        retries.harness_wait(5.0, every=0)(other)
    assert other.calls == 1
    never = Flaky(*[OSError("down")] * 1000)
    with pytest.raises(OSError):  # the last failure itself, never tenacity's RetryError
        retries.harness_wait(0.05, OSError, every=0.01)(never)


def test_until_serving_stops_at_once_on_unless() -> None:
    skipped = Flaky(OSError("down"), KeyError("skip"))
    with pytest.raises(KeyError):
        retries.until_serving(5.0, unless=KeyError)(skipped)
    assert skipped.calls == 2


def test_until_true_answers_false_once_out_of_time() -> None:
    assert retries.until_true(0.05, 0.01)(lambda: False) is False
    assert retries.until_true(5.0, 0)(Flaky(answer=True)) is True


def test_harness_connect_tries_three_times() -> None:
    down = Flaky(*[TimeoutError("slow")] * 5)
    with pytest.raises(TimeoutError):
        retries.harness_connect(TimeoutError).copy(wait=wait_fixed(0))(down)  # not 1 s apart in a unit test
    assert down.calls == 3


def test_host_free_tries_again_until_out_of_time() -> None:
    unknown = Flaky(*[retries.TryAgain("holder unknown")] * 2)
    assert retries.host_free(5.0).copy(wait=wait_fixed(0))(unknown) == "ok" and unknown.calls == 3
    with pytest.raises(retries.TryAgain):
        retries.host_free(0)(Flaky(retries.TryAgain("holder unknown")))


# -- the committer's policy: its first attempt is made outside it ---------------------------------
@pytest.mark.parametrize(("made", "calls"), [(0, retries.COMMIT_ATTEMPTS), (1, retries.COMMIT_ATTEMPTS - 1), (498, 2)])
def test_commit_attempts_make_the_rest_of_the_500(made: int, calls: int) -> None:
    f = Flaky(*[ValueError(i) for i in range(retries.COMMIT_ATTEMPTS + 1)])
    with pytest.raises(ValueError) as err:
        for attempt in retries.commit_attempts(lambda _: 0.0, on=ValueError, made=made):
            with attempt:
                f()
    assert f.calls == calls
    assert err.value.args == (calls - 1,)  # the last failure, not tenacity's RetryError


@pytest.mark.parametrize(("first_wait", "hooked"), [(0.0, False), (0.001, True)])
def test_commit_attempts_wait_before_the_first_only_when_asked(first_wait: float, hooked: bool) -> None:
    policy = retries.commit_attempts(lambda _: 0.0, on=ValueError, made=1, first_wait=first_wait)
    plain = retries.commit_attempts(lambda _: 0.0, on=ValueError)
    assert (policy.before is not plain.before) is hooked  # tenacity's do-nothing hook otherwise
    f = Flaky(ValueError(0), answer="ok")
    assert policy(f) == "ok" and f.calls == 2


# -- an RPC's resend: two attempts, the first a plain call ------------------------------------------
def test_resend_once_makes_two_attempts_and_no_tenacity_state_for_a_first_that_gets_through() -> None:
    policy = retries.resend_once(on=retries.TryAgain)
    ok = Flaky()
    assert policy(ok) == "ok" and ok.calls == 1
    assert policy.statistics == {}  # tenacity never began: the first attempt was a plain call
    once = Flaky(retries.TryAgain("a"))
    assert policy(once) == "ok" and once.calls == 2
    twice = Flaky(retries.TryAgain("a"), retries.TryAgain("b"))
    with pytest.raises(retries.TryAgain, match="b"):  # the last failure itself, not RetryError
        policy(twice)
    assert twice.calls == 2
    other = Flaky(ValueError("not retried"))
    with pytest.raises(ValueError):
        policy(other)
    assert other.calls == 1
    copied = Flaky(retries.TryAgain("a"), retries.TryAgain("b"))
    with pytest.raises(retries.TryAgain, match="b"):
        policy.copy()(copied)  # a copy makes the same two attempts
    assert copied.calls == 2


def test_resend_once_refuses_to_be_iterated_rather_than_make_one_attempt() -> None:
    policy = retries.resend_once(on=retries.TryAgain)
    with pytest.raises(TypeError, match="called with the function"):
        for _ in policy:
            pass
