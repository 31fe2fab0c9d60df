"""The errors of mergetxn: the very classes of ``coordinator.core.errors`` (``mergetxn.errors.InvalidInput
is coordinator.core.errors.InvalidInput``), so an ``except`` written against either catches both."""

from __future__ import annotations

from typing import Any

from coordinator.core import errors as _errors
from coordinator.core.errors import *  # noqa: F403  (the public names, each the same object)


def __getattr__(name: str) -> Any:
    return getattr(_errors, name)  # anything else coordinator.core.errors defines, the same object too
