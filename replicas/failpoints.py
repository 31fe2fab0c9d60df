"""Failpoints: named places in the replica where a fault test can hold a thread.

A test that must stop a replica at an exact point (between deciding a commit and its multi, say)
cannot get there with signals alone. Failpoints are off unless the replica process runs with
``MERGETXN_FAILPOINTS`` naming a directory; then a test arms point ``name`` by creating the file
``<dir>/<name>``, and the first thread that reaches it creates ``<dir>/<name>.reached`` and waits
until the test removes ``<dir>/<name>``. Disabled, :func:`hit` costs one global lookup.
"""

from __future__ import annotations

import os
import time

_DIR = os.environ.get("MERGETXN_FAILPOINTS") or None
# Whether failpoints are on: a place that must look at its arguments to know whether its point
# applies (a merge that flushes inlined parts, say) tests this first, so that disabled it costs
# one lookup as :func:`hit` does: ``if failpoints.ON and flushes(...): failpoints.hit(...)``.
ON = _DIR is not None


def hit(name: str, at: int | None = None) -> None:
    """Hold here while failpoint ``name`` is armed (see the module docstring). With ``at`` (a
    CSN, say) and a number written in the armed file, hold only from that number on: a test
    that arms a point after a call returned can leave that call's own late passage alone."""
    if _DIR is None:
        return
    armed = os.path.join(_DIR, name)
    if not os.path.exists(armed):
        return
    if at is not None:
        try:
            with open(armed) as fh:
                text = fh.read().strip()
        except OSError:
            return
        if text.isdigit() and at < int(text):
            return
    with open(armed + ".reached", "w"):
        pass
    while os.path.exists(armed):  # the test decides when to go on: poll its signal
        time.sleep(0.01)


def enabled() -> bool:
    """Whether failpoints are on in this process (``MERGETXN_FAILPOINTS``)."""
    return _DIR is not None


def armed(name: str) -> bool:
    """Whether failpoint ``name`` is armed now: for a place that fails instead of holding."""
    return _DIR is not None and os.path.exists(os.path.join(_DIR, name))
