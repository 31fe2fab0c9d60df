"""Bounded waits for what another thread or process makes true (never a fixed sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

T = TypeVar("T")


class NotYet(Exception):
    """A condition polled by :func:`eventually` does not hold yet."""


def poll(cond: Callable[[], T], timeout: float = 30.0, interval: float = 0.05) -> T:
    """Call ``cond`` until it returns something true or ``timeout`` seconds pass; its last value
    (so ``assert poll(...)`` fails on a timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(interval)
    return cond()


def wait_until(cond: Callable[[], T], timeout: float = 30.0, what: str = "condition", interval: float = 0.1) -> T:
    """:func:`poll`, raising AssertionError naming ``what`` on a timeout."""
    value = poll(cond, timeout, interval)
    if not value:
        raise AssertionError(f"timed out waiting for {what}")
    return value


def eventually(check: Callable[[], T], timeout: float = 30.0, retry_on: tuple[type[BaseException], ...] = ()) -> T:
    """Call ``check`` until it returns without raising :class:`NotYet` (or one of ``retry_on``);
    after ``timeout`` seconds the last such error is raised."""
    for attempt in Retrying(
        retry=retry_if_exception_type((NotYet, *retry_on)),
        stop=stop_after_delay(timeout),
        wait=wait_fixed(0.1),
        reraise=True,
    ):
        with attempt:
            return check()
    raise AssertionError("unreachable")
