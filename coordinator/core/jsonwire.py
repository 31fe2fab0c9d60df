"""JSON for the hot paths (RPC frames, log entries, WAL records) through orjson.

Every commit encodes and decodes several small JSON documents on the replica and in each
client; orjson does it in a fraction of the stdlib's time. The output is plain JSON that the
stdlib reads back. What orjson refuses (integers beyond 64 bits, non-string keys) falls back
to the stdlib encoder, so nothing that encoded before fails now; NaN and infinities are never
written by this project (part statistics leave them out, partition values refuse them).

Input from other processes is bounded in depth here, in one place: orjson refuses nesting deeper
than :data:`MAX_DEPTH` without recursing in Python, and such input never reaches the stdlib
parser (whose recursion a million ``[`` would exhaust: ``RecursionError``, not ``ValueError``).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_SORTED = orjson.OPT_SORT_KEYS
MAX_DEPTH = 1024  # orjson's own limit on nesting (arrays and objects); nothing we write comes near


def dumps(obj: Any, sort_keys: bool = False) -> bytes:
    """Compact JSON as bytes (keys sorted on request, for deterministic log entries)."""
    try:
        return orjson.dumps(obj, option=_SORTED if sort_keys else None)
    except TypeError:
        return json.dumps(obj, separators=(",", ":"), sort_keys=sort_keys).encode()


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON; malformed input (invalid UTF-8 and nesting deeper than :data:`MAX_DEPTH`
    included) raises ValueError (``json.JSONDecodeError``), as the stdlib does, and nothing else."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "depth" in str(exc):
            raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    # The stdlib's reading, for its error message and for what it accepts beyond strict JSON
    # (NaN from files written by the stdlib): a ValueError either way when malformed.
    try:
        return json.loads(bytes(data) if isinstance(data, memoryview) else data)
    except RecursionError:  # deep nesting orjson did not call a depth error: never let it out
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
