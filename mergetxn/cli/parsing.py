"""What a command line's words mean: column types and schemas, times, partition values, lists."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
import pyarrow as pa

from coordinator.core.errors import InvalidInput

if TYPE_CHECKING:
    from mergetxn.client.client import Client

_TYPES: dict[str, Callable[[], pa.DataType]] = {
    "int8": pa.int8,
    "int16": pa.int16,
    "int32": pa.int32,
    "int64": pa.int64,
    "uint8": pa.uint8,
    "uint16": pa.uint16,
    "uint32": pa.uint32,
    "uint64": pa.uint64,
    "int": pa.int64,
    "long": pa.int64,
    "float16": pa.float16,
    "float32": pa.float32,
    "float64": pa.float64,
    "float": pa.float32,
    "double": pa.float64,
    "string": pa.string,
    "utf8": pa.string,
    "str": pa.string,
    "large_string": pa.large_string,
    "binary": pa.binary,
    "large_binary": pa.large_binary,
    "bool": pa.bool_,
    "boolean": pa.bool_,
    "date32": pa.date32,
    "date": pa.date32,
    "date64": pa.date64,
}
_PARAM_TYPE = re.compile(r"^(timestamp|decimal128|decimal|time64|time32)\s*[\[(](.*)[\])]$", re.I)


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets, so ``timestamp[us, UTC]`` stays one item."""
    out: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


def parse_type(text: str) -> pa.DataType:
    """``int64``, ``string``, ``date32``, ``timestamp[us]``, ``timestamp[us, UTC]``,
    ``decimal128(10, 2)``, ``list<int64>``..."""
    t = text.strip()
    if t.lower() in _TYPES:
        return _TYPES[t.lower()]()
    m = _PARAM_TYPE.match(t)
    if m:
        kind, args = m.group(1).lower(), [a.strip() for a in m.group(2).split(",") if a.strip()]
        try:
            if kind == "timestamp" and 1 <= len(args) <= 2:
                return pa.timestamp(args[0].lower(), tz=args[1] if len(args) == 2 else None)
            if kind in ("decimal", "decimal128") and len(args) == 2:
                return pa.decimal128(int(args[0]), int(args[1]))
            if kind in ("time32", "time64") and len(args) == 1:
                return getattr(pa, kind)(args[0].lower())
        except (ValueError, TypeError, pa.ArrowException) as exc:
            raise InvalidInput(f"bad type {text!r}: {exc}") from None
    m = re.match(r"^list\s*<(.*)>$", t, re.I)
    if m:
        return pa.list_(parse_type(m.group(1)))
    known = ", ".join(sorted(_TYPES)) + ", timestamp[unit(, tz)], decimal128(p, s), list<type>"
    raise InvalidInput(f"unknown column type {text.strip()!r}; known types: {known}")


def parse_schema(text: str) -> pa.Schema:
    """``"id:int64,name:string,day:date32"``; append ``!`` or `` not null`` to a type for a
    column that may not hold nulls (``id:int64!``)."""
    fields = []
    for item in _split_top(text):
        item = item.strip()
        if not item:
            continue
        if ":" not in item:
            raise InvalidInput(f"schema item {item!r} must be name:type (e.g. id:int64)")
        name, type_text = (s.strip() for s in item.split(":", 1))
        nullable = True
        if type_text.endswith("!"):
            type_text, nullable = type_text[:-1], False
        elif type_text.lower().endswith(" not null"):
            type_text, nullable = type_text[: -len(" not null")], False
        fields.append(pa.field(name, parse_type(type_text), nullable=nullable))
    if not fields:
        raise InvalidInput("schema is empty; give name:type pairs, e.g. 'id:int64,name:string'")
    return pa.schema(fields)


def parse_as_of(text: str) -> dt.datetime:
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidInput(f"--as-of {text!r} is not an ISO 8601 date-time") from None
    if when.tzinfo is None or when.utcoffset() is None:
        raise InvalidInput(f"--as-of {text!r} has no timezone; add one, e.g. {text.strip()}+00:00 or Z")
    return when


def partition_values(client: Client, table: str, values: tuple[str, ...]) -> list[Any] | None:
    """CLI partition strings as the typed values a table's partition columns hold (integers and
    booleans as such; dates and strings as text, which is how partition values are keyed).
    Several partition columns: a JSON list (``'["2024-01-01", 3]'``) or comma-separated values."""
    if not values:
        return None
    tdef = client.table(table)
    cols = list(tdef.partition_by)
    if not cols:
        raise InvalidInput(f"table {table!r} is not partitioned; --partition does not apply")

    def typed(col: str, raw: Any) -> Any:
        if not isinstance(raw, str):
            return raw
        t = tdef.schema.field(col).type
        try:
            if pa.types.is_integer(t):
                return int(raw)
            if pa.types.is_boolean(t):
                if raw.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(raw)
                return raw.lower() in ("true", "1")
        except ValueError:
            raise InvalidInput(f"partition value {raw!r} does not fit column {col!r} ({t})") from None
        return raw

    out = []
    for v in values:
        if len(cols) == 1:
            out.append(typed(cols[0], v))
            continue
        try:
            items = json.loads(v) if v.strip().startswith("[") else [s.strip() for s in v.split(",")]
        except ValueError:
            raise InvalidInput(f"partition {v!r} is not a JSON list") from None
        if len(items) != len(cols):
            raise InvalidInput(f"partition {v!r} needs {len(cols)} values for columns {cols}")
        out.append(tuple(typed(c, x) for c, x in zip(cols, items)))
    return out


def column_list(options: tuple[str, ...]) -> list[str]:
    """The columns of a repeatable, comma-separated option, in order."""
    return [c.strip() for p in options for c in p.split(",") if c.strip()]


def lock_groups(specs: tuple[str, ...]) -> dict[str, list[str]]:
    """``--lock-group NAME=COL1,COL2`` options as lock groups (a malformed one is a usage error)."""
    groups: dict[str, list[str]] = {}
    for spec in specs:
        gname, sep, cols = spec.partition("=")
        if not sep or not gname.strip():
            raise click.BadParameter(f"{spec!r} is not NAME=COL1,COL2", param_hint="--lock-group")
        groups[gname.strip()] = [c.strip() for c in cols.split(",") if c.strip()]
    return groups
