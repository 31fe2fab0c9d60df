r"""Arrow tables as JSON lines, built column by column with Arrow compute.

``mergetxn read --format json`` streams millions of rows; turning each row into a Python dict
and each dict into text cost ~15x what the CSV writer costs. Here every column of common types
(integers, floats, booleans, strings, dates) becomes an array of JSON texts in a few vectorised
passes, the columns are joined row-wise into ``{"a": 1, "b": "x"}\n`` lines, and the lines go
out as the bytes of one buffer. Other types (timestamps, decimals, binary, nested) are encoded
value by value as before, one column at a time. The text is what ``json.dumps(row, default=
json_value)`` gives, parsed: the same keys, order, separators and values (non-ASCII characters
stay UTF-8 instead of ``\u`` escapes; NaN and infinities as Python's json writes them).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import struct
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

BATCH_ROWS = 65_536  # rows joined at a time: the lines of one batch are one buffer
_ESCAPES = (
    ("\\", "\\\\"),
    ('"', '\\"'),
    ("\n", "\\n"),
    ("\r", "\\r"),
    ("\t", "\\t"),
    ("\b", "\\b"),
    ("\f", "\\f"),
    # line breaks to str.splitlines: escaped as json.dumps does, so that a line stays one line
    ("\x85", "\\u0085"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)
_OTHER_CONTROL = "[\\x00-\\x07\\x0b\\x0e-\\x1f]"  # escaped as \\u00XX: rare, done value by value
_SPECIAL_BYTES = re.compile(rb'[\\"\x00-\x1f]|\xc2\x85|\xe2\x80[\xa8\xa9]')  # _SPECIAL in UTF-8
_PLAIN_BYTES = bytes(b for b in range(256) if b >= 0x20 and b not in b'"\\\x85\xa8\xa9')  # translate deletes these
_SPECIAL = '[\\\\"\\x00-\\x1f\\x{85}\\x{2028}\\x{2029}]'  # what _ESCAPES (or _OTHER_CONTROL) changes


def json_value(value: Any) -> Any:
    """JSON for what ``json`` does not know: dates and times as ISO 8601, bytes as hex,
    durations as seconds, the rest (decimals) as strings."""
    if isinstance(value, (dt.date, dt.datetime, dt.time)):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return str(value)


def _lit(text: str) -> pa.Scalar:
    return pa.scalar(text, pa.large_string())


_EMPTY, _QUOTE = _lit(""), _lit('"')


def _one_by_one(col: pa.Array) -> pa.Array:
    return pa.array(
        [None if v is None else json.dumps(v, default=json_value) for v in col.to_pylist()], pa.large_string()
    )


def _quoted(s: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise(_QUOTE, s, _QUOTE, _EMPTY)


def _patch(s: pa.Array, mask: pa.Array, fix: Any) -> pa.Array:
    """``s`` with the rows of ``mask`` replaced by ``fix`` of those rows alone (most rows need
    no fix: they are not copied through the fixing passes)."""
    if not pc.any(mask).as_py():
        return s
    return pc.replace_with_mask(s, mask, fix(s.filter(mask)))


def _escape(s: pa.Array) -> pa.Array:
    for raw, escaped in _ESCAPES:
        s = pc.replace_substring(s, raw, escaped)
    return s


def _any_special(s: pa.Array) -> bool:
    """Whether any value may need escaping: one scan of the values' bytes (a superset when the
    array is a slice), so that text without quotes, backslashes or control characters, the
    common case, takes no per-value pass at all."""
    data = s.buffers()[2]
    if data is None:
        return False
    raw = data.to_pybytes()
    if not raw.translate(None, _PLAIN_BYTES):  # no byte that could start or be part of one
        return False
    return _SPECIAL_BYTES.search(raw) is not None


def _string(col: pa.Array) -> pa.Array:
    """Raw text, to be quoted: escaped where a value needs it."""
    s = col.cast(pa.large_string())
    if _any_special(s):
        s = _patch(s, pc.fill_null(pc.match_substring_regex(s, _SPECIAL), False), _escape)
    return s


def _float(col: pa.Array) -> pa.Array:
    f = col.cast(pa.float64())  # a float32's value as Python sees it (its double)
    s = f.cast(pa.large_string())
    # Python writes 1e-07 where Arrow writes 1e-7, and 1.0 where Arrow writes 1
    exp = pc.fill_null(pc.match_substring(s, "e"), False)
    s = _patch(s, exp, lambda x: pc.replace_substring_regex(x, "e([+-])([0-9])$", "e\\10\\2"))
    whole = pc.and_(pc.equal(f, pc.floor(f)), pc.invert(exp))
    s = _patch(s, pc.fill_null(whole, False), lambda x: pc.binary_join_element_wise(x, _lit(".0"), _EMPTY))
    if pc.all(pc.fill_null(pc.is_finite(f), True)).as_py():
        return s
    s = pc.if_else(pc.fill_null(pc.is_nan(f), False), _lit("NaN"), s)
    s = pc.if_else(pc.fill_null(pc.equal(f, float("inf")), False), _lit("Infinity"), s)
    return pc.if_else(pc.fill_null(pc.equal(f, float("-inf")), False), _lit("-Infinity"), s)


def encode_column(col: pa.Array) -> tuple[pa.Array, bool]:
    """Each value of ``col`` as JSON text (``null`` for a null), a large_string array, and
    whether the caller must still put each in quotes (a string or date column without nulls:
    the quotes then go into the text between columns, saving a pass)."""
    t = col.type
    if pa.types.is_dictionary(t):
        return encode_column(col.dictionary_decode())
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        odd = pc.fill_null(pc.match_substring_regex(col, _OTHER_CONTROL), False) if _any_special(col) else None
        if (
            odd is not None and pc.any(odd).as_py()
        ):  # rare: those values by json.dumps, the rest escaped and quoted here
            s = pc.replace_with_mask(_quoted(_string(col)), odd, _one_by_one(col.filter(odd)))
            return pc.fill_null(s, _lit("null")), False
        s = _string(col)
    elif pa.types.is_date(t):
        s = col.cast(pa.date32()).cast(pa.large_string())
    else:
        if pa.types.is_integer(t):
            s = col.cast(pa.large_string())
        elif pa.types.is_boolean(t):
            s = pc.if_else(col, _lit("true"), _lit("false"))
        elif pa.types.is_floating(t):
            s = _float(col)
        else:
            s = _one_by_one(col)
        return (pc.fill_null(s, _lit("null")) if col.null_count else s), False
    if col.null_count == 0:
        return s, True
    return pc.fill_null(_quoted(s), _lit("null")), False


def lines(data: pa.Table | pa.RecordBatch) -> bytes | memoryview:
    """The rows of ``data`` as JSON lines (each ending in a newline)."""
    if data.num_rows == 0:
        return b""
    if data.num_columns == 0:
        return b"{}\n" * data.num_rows
    pieces: list[Any] = []
    text = ""  # literal text between two columns' values
    for i, name in enumerate(data.schema.names):
        col = data.column(i)
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        values, quote = encode_column(col)
        text += ("{" if i == 0 else ", ") + json.dumps(name) + ": " + ('"' if quote else "")
        pieces += [_lit(text), values]
        text = '"' if quote else ""
    pieces.append(_lit(text + "}\n"))
    joined = pc.binary_join_element_wise(*pieces, _EMPTY)
    _, offsets, values = joined.buffers()
    (start,) = struct.unpack_from("<q", offsets, 8 * joined.offset)
    (end,) = struct.unpack_from("<q", offsets, 8 * (joined.offset + len(joined)))
    return memoryview(values)[start:end]


def table_lines(data: pa.Table) -> Iterator[bytes | memoryview]:
    """:func:`lines` of ``data`` by batches of at most :data:`BATCH_ROWS` rows."""
    for batch in data.to_batches(max_chunksize=BATCH_ROWS):
        yield lines(batch)


def stream(tables: Iterable[pa.Table], workers: int = 2) -> Iterator[tuple[bytes | memoryview, int]]:
    """``(lines, rows)`` of each batch of ``tables``, in order, encoded by ``workers`` threads
    (Arrow's kernels release the GIL) while the next tables are read: at most ``2 * workers``
    batches are held at once."""
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="jsonrows") as pool:
        pending: deque[tuple[Future, int]] = deque()
        try:
            for data in tables:
                for batch in data.to_batches(max_chunksize=BATCH_ROWS):
                    pending.append((pool.submit(lines, batch), batch.num_rows))
                    while len(pending) > 2 * workers:
                        future, n = pending.popleft()
                        yield future.result(), n
            while pending:
                future, n = pending.popleft()
                yield future.result(), n
        finally:
            for future, _ in pending:
                future.cancel()
