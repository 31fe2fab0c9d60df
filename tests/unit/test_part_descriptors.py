"""``PartMeta.from_dict`` (parts/model/meta.py) on hostile descriptors, as a table: every wrong
field refused with the message that names it (the subject, the descriptor's path, included), in
the order the fields are checked, and what ``isinstance`` accepts (subclasses, a tuple for a list,
an int for a float) still accepted. The decoder takes exact JSON types on a short road; these
cases hold that road to the long one's answers."""

from __future__ import annotations

import enum
import math

import pytest

from coordinator.core.errors import CorruptMetadata
from parts.model.meta import PartMeta

GOOD = {
    "name": "20261127T1324-00ff",
    "table": "t",
    "partition": ["x", 1],
    "path": "t/x/20261127T1324-00ff.parquet",
    "rows": 10,
    "size": 1155,
    "checksum": "crc32:0badf00d",
    "stats": {"id": [0, 9], "v": ["a", "j"], "n": None},
    "creation_tid": "T1-1-h",
    "created_at": 1.5,
}
WHERE = "part metadata 't/x/20261127T1324-00ff.parquet': "


class Str(str):
    pass


class Rows(enum.IntEnum):
    TEN = 10


REFUSED = [
    ({"name": 5}, "'name' must be a part name, got 5"),
    ({"name": "-bad"}, "'name' '-bad' is not a valid part name"),
    ({"name": "a/b"}, "'name' 'a/b' is not a valid part name"),
    ({"table": None}, "'table' must be a table name, got None"),
    ({"table": "a/b"}, "table name 'a/b' contains path character(s)"),
    ({"table": "1t"}, "must start with a letter"),
    ({"partition": "x"}, "'partition' must be a list of scalars, got 'x'"),
    ({"partition": [[1]]}, "'partition' must hold only JSON scalars, got [[1]]"),
    ({"partition": [{"a": 1}]}, "'partition' must hold only JSON scalars"),
    ({"path": 1}, "'path' must be a relative path, got 1"),
    ({"path": "/abs/x.parquet"}, "is not a relative .parquet path"),
    ({"path": "t/../x.parquet"}, "is not a relative .parquet path"),
    ({"path": "t/x.json"}, "is not a relative .parquet path"),
    ({"rows": True}, "'rows' must be a non-negative integer, got True"),
    ({"rows": 1.0}, "'rows' must be a non-negative integer, got 1.0"),
    ({"rows": "6"}, "'rows' must be a non-negative integer, got '6'"),
    ({"size": False}, "'size' must be a non-negative integer, got False"),
    ({"rows": -1}, "'rows' and 'size' must be non-negative, got -1, 1155"),
    ({"size": -2}, "'rows' and 'size' must be non-negative, got 10, -2"),
    ({"checksum": "md5:abc"}, "'checksum' 'md5:abc' is not 'crc32:<8 hex digits>'"),
    ({"checksum": b"crc32:0badf00d"}, "'checksum' must be a checksum string"),
    ({"stats": []}, "'stats' must be an object of column -> [min, max], got []"),
    ({"stats": {"id": [1]}}, "stats for column 'id' must be [min, max], got [1]"),
    ({"stats": {"id": [1, 2, 3]}}, "stats for column 'id' must be [min, max]"),
    ({"stats": {"id": [[1], 2]}}, "stats for column 'id' must be [min, max]"),
    ({"stats": {"id": [1, {}]}}, "stats for column 'id' must be [min, max]"),
    ({"stats": {"id": "ab"}}, "stats for column 'id' must be [min, max]"),
    ({"creation_tid": 7}, "'creation_tid' must be a transaction id string, got 7"),
    ({"created_at": None}, "'created_at' must be a number (epoch seconds), got None"),
    ({"created_at": True}, "'created_at' must be a number (epoch seconds), got True"),
    ({"created_at": "1"}, "'created_at' must be a number (epoch seconds)"),
    ({"created_at": math.nan}, "'created_at' must be finite, got nan"),
    ({"created_at": math.inf}, "'created_at' must be finite, got inf"),
    ({"schema_version": -1}, "'schema_version' must be a non-negative integer, got -1"),
    ({"schema_version": True}, "'schema_version' must be a non-negative integer, got True"),
    ({"schema_version": 1.0}, "'schema_version' must be a non-negative integer, got 1.0"),
    ({"key_summary": 5}, "'key_summary'"),
    # the first wrong field in the order they are checked is the one named
    ({"rows": "x", "name": 5}, "'name' must be a part name"),
    ({"stats": 1, "checksum": "x"}, "'checksum' 'x' is not"),
    ({"created_at": None, "creation_tid": None}, "'creation_tid' must be"),
]


@pytest.mark.parametrize(("change", "message"), REFUSED, ids=[str(i) for i in range(len(REFUSED))])
def test_a_wrong_field_is_refused_by_name(change: dict, message: str) -> None:
    with pytest.raises(CorruptMetadata) as info:
        PartMeta.from_dict({**GOOD, **change})
    where = WHERE if "path" not in change else "part metadata "
    assert info.value.message.startswith(where), info.value.message
    assert message in info.value.message, info.value.message


@pytest.mark.parametrize("key", list(GOOD))
def test_a_missing_field_is_named(key: str) -> None:
    with pytest.raises(CorruptMetadata) as info:
        PartMeta.from_dict({k: v for k, v in GOOD.items() if k != key})
    assert info.value.message.endswith(f": missing key {key!r}"), info.value.message


@pytest.mark.parametrize("d", [None, [1, 2], "x", 3])
def test_not_an_object_is_refused(d: object) -> None:
    with pytest.raises(CorruptMetadata, match="must be a JSON object"):
        PartMeta.from_dict(d)


ACCEPTED = [
    ({}, {}),
    ({"partition": ("x", 1)}, {}),
    ({"partition": [None, True, 1.5, "s"]}, {"partition": (None, True, 1.5, "s")}),
    ({"created_at": 2}, {"created_at": 2.0}),
    ({"name": Str("20261127T1324-00ff")}, {}),
    ({"table": Str("t"), "checksum": Str("crc32:0badf00d"), "creation_tid": Str("T1-1-h")}, {}),
    ({"rows": Rows.TEN, "size": Rows.TEN}, {"rows": 10, "size": 10}),
    ({"stats": {"id": (0, 9)}}, {"stats": {"id": (0, 9)}}),
    ({"stats": {"v": ["a" * 100, "b" * 100]}}, {"stats": {"v": ("a" * 64, "b" * 63 + "c")}}),
    ({"schema_version": 3}, {"schema_version": 3}),
]


@pytest.mark.parametrize(("change", "expect"), ACCEPTED, ids=[str(i) for i in range(len(ACCEPTED))])
def test_what_isinstance_accepts_is_accepted(change: dict, expect: dict) -> None:
    meta = PartMeta.from_dict({**GOOD, **change})
    want = {
        "name": GOOD["name"],
        "table": "t",
        "partition": ("x", 1),
        "rows": 10,
        "size": 1155,
        "stats": {"id": (0, 9), "v": ("a", "j"), "n": (None, None)},
        "created_at": 1.5,
        "schema_version": 0,
        **expect,
    }
    for field, value in want.items():
        if field == "stats" and "stats" in change:
            assert {k: meta.stats[k] for k in value} == value
            continue
        assert getattr(meta, field) == value, field
    assert type(meta.partition) is tuple and type(meta.created_at) is float
