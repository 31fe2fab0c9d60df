"""``coordinator.errors``: the public name of the error hierarchy (coordinator/core/errors.py)."""

from coordinator.core.errors import *  # noqa: F403
