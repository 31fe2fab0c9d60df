"""A fault the nemesis chose: its kind, target, the resources it holds, and how to inject and
heal it. The nemesis (nemesis.py) makes these for every kind, and s3.py for the S3 faults."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Plan:
    """One fault chosen: its kind, target, what it holds, and how to inject and heal it."""

    kind: str
    target: str
    resources: frozenset[str]
    inject: Callable[[], str]  # returns a detail
    heal: Callable[[], None]
    replica: int | None = None  # the replica it faults, if one


def doing(act: Callable[..., object], *args: Any, said: str) -> Callable[[], str]:
    """An ``inject`` that calls ``act(*args)`` and returns ``said``, its detail."""

    def inject() -> str:
        act(*args)
        return said

    return inject
