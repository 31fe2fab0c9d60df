"""Staged operations (coordinator/model/records.py): one type per statement, one decoder.

Pure: no ZooKeeper, no storage. Each kind survives the wire (``to_dict``, JSON, ``op_from_dict``)
unchanged, carries the conflict rules' operation kind by its type, and anything malformed is
InvalidInput naming the field that is wrong.
"""

from __future__ import annotations

import pytest

from coordinator.core import jsonwire
from coordinator.core.conflicts import Kind
from coordinator.errors import CorruptMetadata, InvalidInput
from coordinator.model.records import (
    Compact,
    Insert,
    Mutate,
    Overwrite,
    StagedOp,
    Truncate,
    op_from_dict,
)
from parts.model.meta import PartMeta


def meta(name: str, rows: int = 3, partition: tuple = (1,)) -> PartMeta:
    return PartMeta(
        name=name,
        table="t",
        partition=partition,
        path=f"t/p=1/{name}.parquet",
        rows=rows,
        size=10,
        checksum="crc32:0badf00d",
        stats={"id": (0, 9), "v": (None, None)},
        creation_tid="1-2-h",
        created_at=1700000000.5,
    )


A, B = meta("1-2-h_a"), meta("1-2-h_b", rows=4)

OPS: list[StagedOp] = [
    Insert("t", (A, B)),
    Insert("t"),
    Overwrite("t", (A,), ("old1", "old2"), ("[1]", "[2]")),
    Overwrite("t", (), (), ()),
    Truncate("t", ("old1",), ("[1]",)),
    Truncate("t", ("old1", "old2")),
    Mutate("delete", "t", "c3Vic3RyYWl0", (A,), ("old1",), None),
    Mutate("delete", "t", "c3Vic3RyYWl0", (), ("old1",), ("[]",)),
    Mutate("update", "t", "c3Vic3RyYWl0", (A,), ("old1",), ("[1]",), assignments="eyJ2IjoxfQ=="),
    Compact("t", "minor", (A,), ("old1", "old2"), ("[1]",)),
    Compact("t", "major", (A,), ("old1", "old2")),
]


@pytest.mark.parametrize("op", OPS, ids=lambda op: f"{op.kind}-{len(op.added)}-{op.partitions}")
def test_each_kind_round_trips_over_the_wire(op: StagedOp) -> None:
    d = op.to_dict()
    assert d["op"] == op.kind and d["table"] == "t"
    assert op_from_dict(d) == op
    back = op_from_dict(jsonwire.loads(jsonwire.dumps(d)))
    assert back == op and type(back) is type(op)


def test_the_conflict_kind_comes_from_the_type() -> None:
    kinds = {
        Insert("t"): Kind.INSERT,
        Overwrite("t"): Kind.OVERWRITE,
        Truncate("t"): Kind.OVERWRITE,
        Mutate("delete", "t", "w"): Kind.MUTATE,
        Mutate("update", "t", "w", assignments="a"): Kind.MUTATE,
        Compact("t", "minor"): Kind.MINOR_COMPACT,
        Compact("t", "major"): Kind.MAJOR_COMPACT,
    }
    for op, kind in kinds.items():
        assert op.operation_kind is kind, op


def test_what_a_statement_cannot_have_reads_as_empty() -> None:
    ins = Insert("t", (A, B))
    assert (ins.removed, ins.partitions, ins.whole_table, ins.rows) == ((), None, False, 7)
    tr = Truncate("t", ("x",))
    assert (tr.added, tr.rows, tr.whole_table) == ((), 0, True)
    assert Truncate("t", ("x",), ("[1]",)).whole_table is False
    assert Truncate("t").to_dict()["whole_table"] is True
    assert Mutate("update", "t", "w", (A, B), assignments="a").rows == 7
    # A compaction adds no data: it counts no rows unless told to (client.compact's replica path).
    assert Compact("t", "minor", (A, B)).rows == 0
    assert Compact("t", "minor", (A, B), rows=7).rows == 7


def test_the_encoding_with_every_key_still_decodes() -> None:
    """Before the union, every operation went out with all keys, empty where they did not apply."""
    full = {
        "op": "insert",
        "table": "t",
        "added": [A.to_dict()],
        "removed": [],
        "partitions": None,
        "whole_table": False,
        "where": None,
        "assignments": None,
        "compact_kind": None,
    }
    assert op_from_dict(full) == Insert("t", (A,))
    assert op_from_dict({**full, "op": "truncate", "added": [], "removed": ["x"], "whole_table": True}) == Truncate(
        "t", ("x",)
    )
    assert op_from_dict({**full, "op": "compact", "compact_kind": "major", "partitions": ["[1]"]}) == Compact(
        "t", "major", (A,), (), ("[1]",)
    )
    assert op_from_dict({**full, "op": "delete", "where": "w"}) == Mutate("delete", "t", "w", (A,))
    # What the client always sent for an insert: just these keys.
    assert op_from_dict({"op": "insert", "table": "t", "added": [A.to_dict()]}) == Insert("t", (A,))
    assert op_from_dict({"op": "insert", "table": "t", "added": None}) == Insert("t")


BAD = [
    (["insert"], "must be an object"),
    ({"table": "t"}, "'op'"),
    ({"op": "merge", "table": "t"}, "unknown operation 'merge'"),
    ({"op": "insert"}, "'table'"),
    ({"op": "insert", "table": 7}, "'table'"),
    ({"op": "insert", "table": "t", "added": A.to_dict()}, "'added'"),
    ({"op": "insert", "table": "t", "removed": ["x"]}, "'removed' is not a field of insert"),
    ({"op": "insert", "table": "t", "whole_table": True}, "'whole_table' is not a field of insert"),
    ({"op": "insert", "table": "t", "where": "w"}, "'where' is not a field of insert"),
    ({"op": "insert", "table": "t", "colour": "red"}, "unknown field 'colour'"),
    ({"op": "overwrite", "table": "t", "removed": []}, "'partitions'"),
    ({"op": "overwrite", "table": "t", "partitions": ["[1]"], "removed": "x"}, "'removed'"),
    ({"op": "overwrite", "table": "t", "partitions": ["[1]"], "removed": [1]}, "'removed'"),
    ({"op": "overwrite", "table": "t", "partitions": "[1]"}, "'partitions'"),
    ({"op": "overwrite", "table": "t", "partitions": [[1]]}, "'partitions'"),
    ({"op": "truncate", "table": "t", "partitions": ["[1]"], "whole_table": True}, "'whole_table'"),
    ({"op": "truncate", "table": "t", "partitions": None, "whole_table": False}, "'whole_table'"),
    ({"op": "truncate", "table": "t", "whole_table": "yes"}, "'whole_table'"),
    ({"op": "truncate", "table": "t", "added": [A.to_dict()]}, "'added' is not a field of truncate"),
    ({"op": "delete", "table": "t"}, "'where'"),
    ({"op": "delete", "table": "t", "where": 5}, "'where'"),
    ({"op": "delete", "table": "t", "where": "w", "assignments": "a"}, "'assignments' is not a field of delete"),
    ({"op": "update", "table": "t", "where": "w"}, "'assignments'"),
    ({"op": "compact", "table": "t"}, "'compact_kind'"),
    ({"op": "compact", "table": "t", "compact_kind": "medium"}, "'compact_kind'"),
    ({"op": "compact", "table": "t", "compact_kind": "minor", "where": "w"}, "'where' is not a field of compact"),
]


@pytest.mark.parametrize(("d", "needle"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_is_invalid_input_naming_the_field(d: object, needle: str) -> None:
    with pytest.raises(InvalidInput) as info:
        op_from_dict(d)
    assert needle in info.value.message, info.value.message


def test_a_bad_part_descriptor_from_a_caller_is_invalid_input() -> None:
    """The part descriptors keep their own decoder (parts/model/meta.py), whose CorruptMetadata is for
    what the log and storage hold; a staged operation comes from a caller, so there it is bad
    input (exit 2, not 8)."""
    bad = {**A.to_dict(), "checksum": "md5:x"}
    with pytest.raises(CorruptMetadata, match="checksum"):
        PartMeta.from_dict(bad)
    with pytest.raises(InvalidInput, match="insert: part metadata .*checksum"):
        op_from_dict({"op": "insert", "table": "t", "added": [bad]})


def test_operations_are_frozen() -> None:
    op = Insert("t", (A,))
    with pytest.raises(AttributeError):
        op.table = "u"  # type: ignore[misc]
