"""Replica failpoints (replicas/failpoints.py) in tests: a directory of its own per replica, a
replica started with it, a point armed and held, a call held at a point, and a commit held at
``before_commit_multi``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mergetxn.local.cluster import LocalCluster
from support.cluster import environ
from support.waiting import wait_until


@dataclass
class HeldCommit:
    """What ``tx.commit()`` came to: its CSN or the exception it raised (once released)."""

    outcome: list[object] = field(default_factory=list)


@contextmanager
def commit_held_at_multi(failpoints: Path, tx) -> Iterator[HeldCommit]:
    """Commit ``tx`` in a thread and return once the replica decided the commit, verified its
    files and stands just before its multi; on the way out the failpoint is released and the
    commit's outcome collected (a replica paused inside must be resumed before that)."""
    armed = failpoints / "before_commit_multi"
    reached = failpoints / "before_commit_multi.reached"
    reached.unlink(missing_ok=True)
    armed.touch()
    held = HeldCommit()

    def commit() -> None:
        try:
            held.outcome.append(tx.commit())
        except Exception as exc:  # the outcome is what the test asserts
            held.outcome.append(exc)

    committer = threading.Thread(target=commit)
    committer.start()
    try:
        wait_until(reached.exists, 30, "the commit to reach its multi", interval=0.01)
        yield held
    finally:
        armed.unlink(missing_ok=True)
        committer.join(90)


def failpoint_dirs(tmp_path_factory: pytest.TempPathFactory, name: str = "inline_failpoints") -> list[Path]:
    """A failpoint directory for each of two replicas (``r0``, ``r1``)."""
    base = tmp_path_factory.mktemp(name)
    dirs = [base / "r0", base / "r1"]
    for d in dirs:
        d.mkdir()
    return dirs


def start(cluster: LocalCluster, failpoints: list[Path], i: int) -> None:
    """Start replica ``i`` with its own failpoint directory."""
    with environ({"MERGETXN_FAILPOINTS": str(failpoints[i]), "MERGETXN_LOG": "INFO"}):
        cluster.start_replica(i)


def hold(failpoints: Path, name: str) -> Path:
    """Arm failpoint ``name`` and return (its armed file) once a thread holds there."""
    (failpoints / f"{name}.reached").unlink(missing_ok=True)
    armed = failpoints / name
    armed.touch()
    wait_until((failpoints / f"{name}.reached").exists, 30, f"the replica to reach {name}", interval=0.01)
    return armed


class Held:
    """``call()`` in a thread, held by a replica at failpoint ``name`` of ``failpoints`` (armed
    here; the constructor returns once the replica reached it)."""

    def __init__(self, failpoints: Path, name: str, call: Callable[[], object]) -> None:
        self.armed = failpoints / name
        (failpoints / f"{name}.reached").unlink(missing_ok=True)
        self.armed.touch()
        self._result: list[object] = []
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()
        wait_until((failpoints / f"{name}.reached").exists, 30, f"the replica to reach {name}", interval=0.01)

    def _run(self, call: Callable[[], object]) -> None:
        try:
            self._result.append(call())
        except Exception as exc:  # the outcome is what the test asserts
            self._result.append(exc)

    def outcome(self, timeout: float) -> object:
        self._thread.join(timeout)
        assert self._result, f"the call was not decided within {timeout}s"
        return self._result[0]
