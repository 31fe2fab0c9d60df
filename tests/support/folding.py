"""A client that reads keys tables by the fold: it never asks for deletion vectors, as a client
from before them (the reference every read by vectors is compared with)."""

from __future__ import annotations

from typing import Any

from mergetxn.client import Client


def folding(c: Client) -> Client:
    """``c`` never asking for deletion vectors, as a client from before them: it folds."""
    call = c.call

    def no_vectors(action: str, **args: Any) -> Any:
        args.pop("vectors", None)
        return call(action, **args)

    c.call = no_vectors  # type: ignore[method-assign]
    return c
