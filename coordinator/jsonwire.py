"""JSON for the hot paths (RPC frames, log entries, WAL records) through orjson.

Every commit encodes and decodes several small JSON documents on the replica and in each
client; orjson does it in a fraction of the stdlib's time. The output is plain JSON that the
stdlib reads back. What orjson refuses (integers beyond 64 bits, non-string keys) falls back
to the stdlib encoder, so nothing that encoded before fails now; NaN and infinities are never
written by this project (part statistics leave them out, partition values refuse them).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_SORTED = orjson.OPT_SORT_KEYS


def dumps(obj: Any, sort_keys: bool = False) -> bytes:
    """Compact JSON as bytes (keys sorted on request, for deterministic log entries)."""
    try:
        return orjson.dumps(obj, option=_SORTED if sort_keys else None)
    except TypeError:
        return json.dumps(obj, separators=(",", ":"), sort_keys=sort_keys).encode()


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON; malformed input raises ValueError (``json.JSONDecodeError``), as the stdlib does."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        # The stdlib's reading, for its error message and for what it accepts beyond strict
        # JSON (NaN from files written by the stdlib): a ValueError either way when malformed.
        return json.loads(data)
