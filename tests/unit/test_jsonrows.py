"""``mergetxn read --format json``'s vectorised writer (mergetxn/tools/jsonrows.py) against what the
row-by-row writer it replaced printed: ``json.dumps(row, default=json_value)`` per row. Pure."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import random

import pyarrow as pa
import pytest

from mergetxn.tools.jsonrows import lines, stream, table_lines


def reference(t: pa.Table) -> str:
    from mergetxn.tools.jsonrows import json_value

    return "".join(json.dumps(r, default=json_value) + "\n" for r in t.to_pylist())


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b and type(a) is type(b)


def parsed_equal(text: str, expected: str) -> None:
    got, want = text.splitlines(), expected.splitlines()
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert same(json.loads(g), json.loads(w)), (g, w)


def test_every_type_prints_as_the_row_writer_did() -> None:
    t = pa.table(
        {
            "i": pa.array([1, None, -3, 2**62], pa.int64()),
            "u8": pa.array([0, 255, None, 7], pa.uint8()),
            "f": [1.0, float("nan"), 0.1, -0.0],
            "big": [1e20, 1e-7, None, 123456.789],
            "f32": pa.array([0.1, None, float("inf"), float("-inf")], pa.float32()),
            "b": [True, None, False, True],
            "s": ['a"b\\c\n', None, "tab\there", "ok\r\b\f/"],
            "d": pa.array([dt.date(2024, 1, 1), None, dt.date(1999, 12, 31), dt.date(1, 1, 1)]),
            "ts": pa.array([dt.datetime(2024, 1, 1, 12, 0, 0, 123), None, dt.datetime(2024, 1, 1), None]),
            "tz": pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.UTC), None, None, None], pa.timestamp("us", "UTC")),
            "bin": [b"ab", None, b"", b"\x00"],
            "l": [[1, 2], None, [], [3]],
            "dec": pa.array([decimal.Decimal("1.5"), None, decimal.Decimal("2"), None], pa.decimal128(5, 1)),
            "dict": pa.array(["x", "y", "x", None]).dictionary_encode(),
        }
    )
    parsed_equal(bytes(lines(t)).decode(), reference(t))


def test_floats_parse_back_to_the_same_double() -> None:
    """Arrow and Python pick scientific notation at other magnitudes; the digits are the
    shortest that round-trip in both, so every value parses back exactly (sign of zero too)."""
    rng = random.Random(1)
    values = [rng.choice([1, -1]) * rng.random() * 10 ** rng.randint(-30, 30) for _ in range(20_000)]
    values += [1e16, 1e15, 5e-324, 1.7976931348623157e308, 0.0, -0.0, 100.0, 1e22, 1e-7]
    back = [json.loads(line)["f"] for line in bytes(lines(pa.table({"f": values}))).decode().splitlines()]
    assert all(
        type(b) is float and b == v and math.copysign(1, b) == math.copysign(1, v)
        for b, v in zip(back, values, strict=True)
    )


def test_control_characters_and_unicode_parse_the_same() -> None:
    rng = random.Random(7)
    alphabet = [chr(c) for c in range(0, 40)] + ['"', "\\", "é", "€", "\u2028", "😀", "a"]
    values = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12))) for _ in range(2000)]
    values[5] = None
    t = pa.table({"s": values, "n": list(range(2000))})
    parsed_equal(bytes(lines(t)).decode(), reference(t))


def test_empty_shapes_and_batches() -> None:
    assert bytes(lines(pa.table({"a": pa.array([], pa.int64())}))) == b""
    assert bytes(lines(pa.table({"a": [1, 2]}).select([]))) == b"{}\n{}\n"
    t = pa.concat_tables([pa.table({"a": list(range(100_000)), "s": ["x"] * 100_000})] * 2)  # two chunks
    out = b"".join(bytes(c) for c in table_lines(t))
    assert out.count(b"\n") == 200_000 and out.startswith(b'{"a": 0, "s": "x"}\n')
    assert out.endswith(b'{"a": 99999, "s": "x"}\n')


@pytest.mark.parametrize("ty", [pa.int32(), pa.float64(), pa.string(), pa.date32(), pa.bool_()])
def test_all_null_columns(ty: pa.DataType) -> None:
    t = pa.table({"c": pa.nulls(3, ty)})
    assert bytes(lines(t)).decode() == reference(t)


def test_stream_keeps_the_order_of_tables_and_batches() -> None:
    tables = [pa.table({"a": list(range(s, s + n))}) for s, n in ((0, 70_000), (70_000, 5), (70_005, 200_000))]
    out = list(stream(iter(tables), workers=2))
    assert sum(n for _, n in out) == 270_005
    text = b"".join(bytes(c) for c, _ in out)
    assert text == b"".join(f'{{"a": {i}}}\n'.encode() for i in range(270_005))
