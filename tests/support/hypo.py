"""Hypothesis settings for property tests that run in CI."""

from __future__ import annotations

from hypothesis import HealthCheck, settings


def deterministic(max_examples: int) -> settings:
    """The same examples on every run (no example database, a fixed derivation) and no
    per-example deadline: a CI failure reproduces on any machine, a loaded one does not flake."""
    return settings(
        derandomize=True,
        database=None,
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
