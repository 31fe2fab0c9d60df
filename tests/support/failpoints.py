"""A commit held at the replica's ``before_commit_multi`` failpoint (replicas/failpoints.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

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
