"""Every retry policy of mergetxn, named, in one place.

A loop that tries something again follows one of the policies below, by name, so that how long,
how often and on what it tries again is stated once and read here: ``for attempt in
retries.storage_probe(): with attempt: ...`` (tenacity's ``Retrying``; ``reraise=True``
everywhere, so the last failure is what the caller sees, never tenacity's ``RetryError``).

A block says "not yet, try again" by raising :class:`TryAgain` (or a subclass, where a caller
must tell two reasons apart); the policies that retry on it say so. Pure: tenacity and the
clock only. kazoo's own ``zk.retry`` (a ZooKeeper call retried over a connection loss, with
kazoo's defaults) is the one retry that lives outside this module: kazoo owns it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    retry_if_exception_type,
    retry_if_not_exception_type,
    retry_if_result,
    stop_after_attempt,
    stop_after_delay,
    stop_never,
    wait_fixed,
    wait_random,
)
from tenacity.stop import stop_base

ExceptionTypes = type[BaseException] | tuple[type[BaseException], ...]


class TryAgain(Exception):
    """Not yet: the block's policy tries it again. The message says what was not ready, and is
    what the caller sees if the policy gives up."""


def _policy(
    *,
    on: ExceptionTypes = TryAgain,
    seconds: float | None = None,
    attempts: int | None = None,
    wait: Callable[[RetryCallState], float] | None = None,
) -> Retrying:
    stop: stop_base = stop_never
    if seconds is not None:
        stop = stop_after_delay(seconds)
    if attempts is not None:
        stop = stop_after_attempt(attempts) if seconds is None else stop_after_attempt(attempts) | stop
    return Retrying(retry=retry_if_exception_type(on), stop=stop, wait=wait or wait_fixed(0), reraise=True)


class _PlainFirst(Retrying):
    """A policy whose first attempt is a plain call, before any of tenacity's state (its
    statistics, a retry state, two ``iter`` rounds: ~10 us, what a point lookup's RPC paid on
    every call, nearly all of which get through); only when that attempt raises one of
    ``first_on`` does the policy run, for the attempts that are left."""

    first_on: ExceptionTypes = ()

    def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except self.first_on:
            pass
        return super().__call__(fn, *args, **kwargs)

    def __iter__(self) -> Any:
        # iterated (``for attempt in policy``) it would make one attempt, the plain one being
        # only in __call__: refused rather than silently one attempt short
        raise TypeError("a resend_once policy is called with the function, not iterated")

    def copy(self, *args: Any, **kwargs: Any) -> _PlainFirst:
        out = super().copy(*args, **kwargs)
        out.first_on = self.first_on
        return out


# -- clients --------------------------------------------------------------------------------------
def resend_once(on: ExceptionTypes) -> Retrying:
    """An RPC whose attempt failed where sending it again is safe: one more attempt, at once.
    The first attempt is a plain call (:class:`_PlainFirst`), the one more through tenacity."""
    policy = _PlainFirst(
        retry=retry_if_exception_type(on), stop=stop_after_attempt(1), wait=wait_fixed(0), reraise=True
    )
    policy.first_on = on
    return policy


def fresh_definition(on: ExceptionTypes) -> Retrying:
    """A one-call write refused because the table definition the client had cached is stale (a
    DDL since): once more, at once, with the definition looked up again."""
    return _policy(on=on, attempts=2)


def outcome(seconds: float, on: ExceptionTypes) -> Retrying:
    """A client waiting for a commit's outcome (its replica deciding, or another replica asked):
    every 0.2 s, for ``seconds``."""
    return _policy(on=on, seconds=seconds, wait=wait_fixed(0.2))


def until_ready(seconds: float, on: ExceptionTypes = TryAgain, every: float = 0.05) -> Retrying:
    """Waiting for a process or a server to come up (a replica's address file, ZooKeeper's
    port): every ``every`` seconds, for ``seconds``."""
    return _policy(on=on, seconds=seconds, wait=wait_fixed(every))


# -- replicas -------------------------------------------------------------------------------------
def storage_probe(seconds: float = 30.0) -> Retrying:
    """A starting replica reading its storage: transient OS errors for ``seconds``, twice a
    second, then the start is refused."""
    return _policy(on=OSError, seconds=seconds, wait=wait_fixed(0.5))


def reregister(stop: threading.Event, log: logging.Logger) -> Retrying:
    """A replica registering again after a new ZooKeeper session: every 0.5 s until it works or
    the replica stops (begins wait meanwhile)."""
    return Retrying(
        retry=retry_if_exception(lambda exc: not stop.is_set()),
        wait=wait_fixed(0.5),
        stop=stop_never,
        reraise=True,
        before_sleep=lambda state: log.warning(
            "could not re-register after a new session: %r", state.outcome.exception() if state.outcome else None
        ),
    )


def host_free(seconds: float) -> Retrying:
    """A starting replica whose host id's alive node has a holder it cannot tell alive or dead:
    every 0.2 s, for ``seconds`` (a session timeout: the node of a dead one vanishes by then)."""
    return _policy(seconds=seconds, wait=wait_fixed(0.2))


def session_check(seconds: float, on: ExceptionTypes) -> Retrying:
    """A replica making sure of its ZooKeeper session after it stood still: every 50 ms."""
    return _policy(on=on, seconds=seconds, wait=wait_fixed(0.05))


COMMIT_ATTEMPTS = 500  # a commit's attempts at most (commit_attempts)


def commit_attempts(
    wait: Callable[[RetryCallState], float], on: ExceptionTypes, made: int = 0, first_wait: float = 0.0
) -> Retrying:
    """A commit multi that lost a race on a version (another commit moved a target first): at
    most 500 attempts or 120 s, each after ``wait`` (jittered by the committer). ``made``: the
    attempts already made before the policy (the committer's first, which costs no tenacity
    state when it gets through, as most do); the first of the rest after ``first_wait`` s."""
    policy = _policy(on=on, attempts=max(1, COMMIT_ATTEMPTS - made), seconds=120.0, wait=wait)
    if first_wait > 0:
        policy.before = lambda state: time.sleep(first_wait) if state.attempt_number == 1 else None
    return policy


def log_lookup(seconds: float = 300.0) -> Retrying:
    """A connection lost during the commit multi: sync and read the log until the outcome is
    known (on any error), 50-300 ms apart, for ``seconds``."""
    return Retrying(stop=stop_after_delay(seconds), wait=wait_random(0.05, 0.3), reraise=True)


def foreign_outcome(seconds: float, on: ExceptionTypes = TryAgain) -> Retrying:
    """Deciding another replica's transaction while its owner fence moves: 10-100 ms apart."""
    return _policy(on=on, seconds=seconds, wait=wait_random(0.01, 0.1))


def next_checkpoint(on: ExceptionTypes = TryAgain) -> Retrying:
    """Loading the checkpoint while another replica replaces it: the newer one, at most twice."""
    return _policy(on=on, attempts=3)


# -- the chaos harness (mergetxn/chaos): it hurts the cluster it drives, and waits that out ----------
def harness_wait(seconds: float, on: ExceptionTypes = TryAgain, every: float = 0.1) -> Retrying:
    """The chaos harness waiting for the cluster it hurts to reach a state (a process up or gone,
    a namespace empty, a client connected through a restart, the final check's reads at one
    snapshot): on ``on`` (anything else propagates at once), every ``every`` s, for ``seconds``."""
    return _policy(on=on, seconds=seconds, wait=wait_fixed(every))


def until_serving(seconds: float, unless: ExceptionTypes) -> Retrying:
    """A replica the nemesis hurt, probed until it serves again: on any error but ``unless`` (the
    prober gave up on that replica, which ends the wait), every 0.1 s, for ``seconds``."""
    return Retrying(
        retry=retry_if_not_exception_type(unless),
        stop=stop_after_delay(seconds),
        wait=wait_fixed(0.1),
        reraise=True,
    )


def until_true(seconds: float, every: float = 0.01) -> Retrying:
    """Polling a check that answers True or False (every thread of a stopped process is
    stopped): every ``every`` s; once ``seconds`` passed the answer is False, not an error."""
    return Retrying(
        retry=retry_if_result(lambda ok: not ok),
        stop=stop_after_delay(seconds),
        wait=wait_fixed(every),
        retry_error_callback=lambda state: False,
    )


def harness_connect(on: ExceptionTypes) -> Retrying:
    """The harness's own ZooKeeper client starting while members are killed or cut (a busy
    machine can take a first connection past its timeout): 3 attempts, 1 s apart."""
    return _policy(on=on, attempts=3, wait=wait_fixed(1.0))
