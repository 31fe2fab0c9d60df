"""The pure rules of small writes (docs/architecture/small-writes.md): when a partition's inlined
parts are due for a flush, which thresholds bind a table's inserts, what the write road inlines,
and that an inlined part's content survives a checkpoint (JSON) whole."""

from __future__ import annotations

import dataclasses
import json

import pyarrow as pa
import pytest
from support.builders import change, entry, part, table_def  # tests/ is on sys.path

from coordinator.core import mergeplan
from coordinator.core.conflicts import Kind
from coordinator.errors import CorruptMetadata, CorruptPart, InvalidInput
from coordinator.model.catalog import TableDef
from coordinator.model.records import Change, LogEntry, TxnRecord, op_from_dict
from coordinator.model.znodes import Marks
from parts.io import rewrite
from parts.io.format import encode_part, file_claims, read_part, store_bundle, verify_file
from parts.io.storage import Storage
from parts.io.write import write_data
from parts.model.meta import INLINE_MAX_BYTES, PartMeta
from replicas.state import ReplicaState
from replicas.storage_check import check_tables

SCHEMA = pa.schema([("n", pa.int64()), ("p", pa.string())])


@pytest.mark.parametrize(
    ("inlined", "due"),
    [
        ([], False),
        ([(100, 50.0)], False),  # one young small part
        ([(100, 50.0)] * 3, True),  # the count
        ([(600, 50.0), (500, 50.0)], True),  # the bytes
        ([(100, 39.0)], True),  # the age of the oldest
        ([(100, 41.0), (100, 99.0)], False),
    ],
)
def test_a_flush_is_due_by_count_bytes_or_age(inlined: list[tuple[int, float]], due: bool) -> None:
    assert mergeplan.inline_flush(inlined, parts=3, size=1000, seconds=10.0, now=50.0) is due


def test_inline_limits_take_the_tables_own_over_the_replicas() -> None:
    plain = TableDef.new("t", SCHEMA)
    assert plain.inline_limits(100, 4096) == (100, 4096)
    assert plain.inline_limits(0, 4096) == (0, 0) and plain.inline_limits(100, 0) == (0, 0)
    assert plain.inline_limits(100, 10 * INLINE_MAX_BYTES) == (100, INLINE_MAX_BYTES)
    own = TableDef.new("t", SCHEMA, inline_rows=5, inline_bytes=1000)
    assert own.inline_limits(100, 4096) == (5, 1000)
    assert TableDef.new("t", SCHEMA, inline_rows=0).inline_limits(100, 4096) == (0, 0)
    keys = TableDef.new(
        "k", pa.schema([pa.field("n", pa.int64(), nullable=False)]), primary_key=["n"], conflict_policy="keys"
    )
    assert keys.inline_limits(100, 4096) == (0, 0)
    back = TableDef.from_dict(own.to_dict())
    assert (back.inline_rows, back.inline_bytes) == (5, 1000) and back.same_definition(own)
    assert own.altered(options={"inline_rows": None}).inline_rows is None


@pytest.mark.parametrize(("option", "value"), [("inline_rows", -1), ("inline_bytes", INLINE_MAX_BYTES + 1)])
def test_a_wrong_inline_setting_is_refused(option: str, value: int) -> None:
    with pytest.raises(InvalidInput, match=option):
        TableDef.new("t", SCHEMA, **{option: value})


def test_the_write_road_inlines_within_the_thresholds_only(tmp_path) -> None:  # noqa: ANN001
    storage = Storage(str(tmp_path))
    tdef = TableDef.new("t", SCHEMA, partition_by=["p"])
    data = pa.table({"n": [1, 2, 3], "p": ["a", "a", "b"]})
    metas = write_data(storage, tdef, data, "tx1", inline=(2, 4096))
    assert [m.inlined for m in metas] == [True, True]
    assert not list(tmp_path.rglob("*"))  # nothing written
    for m in metas:
        assert file_claims(m.inline, m, tdef.schema, tdef.partition_by) is None
    assert sorted(pa.concat_tables(read_part(storage, m) for m in metas).column("n").to_pylist()) == [1, 2, 3]
    assert [m.inlined for m in write_data(storage, tdef, data, "tx2", inline=(1, 4096))] == [False, True]
    assert [m.inlined for m in write_data(storage, tdef, data, "tx3", inline=(9, 10))] == [False, False]
    assert [m.inlined for m in write_data(storage, tdef, data, "tx4")] == [False, False]
    assert [m.inlined for m in write_data(storage, tdef, data, "tx5", inline=(0, 0))] == [False, False]


def test_an_inlined_part_round_trips_through_its_json_and_a_checkpoint() -> None:
    meta, raw = encode_part("t", ["p"], (1,), pa.table({"n": [7], "p": [1]}), "A")
    inl = dataclasses.replace(meta, inline=raw)
    assert PartMeta.from_dict(json.loads(json.dumps(inl.to_dict()))) == inl
    st = ReplicaState()
    st.apply(1, 0, 0, entry(ddl=[table_def("t")], versions={"t": 0}))
    st.apply(2, 0, 1, entry(("A", [change("t", (1,), [Kind.INSERT], added=[inl, part("x", partition=(1,))])])))
    payload = json.loads(json.dumps(st.export()))  # a checkpoint is JSON: the bytes go as base64
    back = ReplicaState()
    back.restore(payload, "mem")
    got = {m.name: m for m in back.visible("t", 2)}
    assert got[inl.name].inline == raw and got["x"].inline is None


@pytest.mark.parametrize("checksums", [True, False])
def test_check_verifies_an_inlined_part_from_its_bytes_and_never_looks_for_its_file(tmp_path, checksums) -> None:  # noqa: ANN001
    meta, raw = encode_part("t", ["p"], (1,), pa.table({"id": [7], "p": [1]}), "A")
    good = dataclasses.replace(meta, name="good", path="t/p=1/good.parquet", inline=raw)
    rotted = bytearray(raw)
    rotted[len(raw) // 2] ^= 0xFF  # the same size, another checksum
    bad = dataclasses.replace(meta, name="bad", path="t/p=1/bad.parquet", inline=bytes(rotted))
    st = ReplicaState()
    st.apply(1, 0, 0, entry(ddl=[table_def("t")], versions={"t": 0}))
    st.apply(2, 0, 1, entry(("A", [change("t", (1,), [Kind.INSERT], added=[good, bad])])))
    result = check_tables(st, Storage(str(tmp_path)), Marks(), ["t"], checksums=checksums, refresh=Marks)
    problems = [p for t in result["tables"] for p in t["problems"]]
    assert [p["part"] for p in problems] == ["bad"] and not result["ok"]
    assert "checksum" in problems[0]["problem"] and "missing" not in problems[0]["problem"]


def test_a_cached_inlined_part_is_read_again_only_from_the_same_bytes(tmp_path) -> None:  # noqa: ANN001
    """Reads through ``read_parts(cached=True)`` take an inlined part decoded before only when
    its bytes now are the ones decoded: rotted bytes under the same claims are refused as
    ``read_part`` refuses them, and a lie about the rows is refused every time."""
    storage = Storage(str(tmp_path))
    tdef = TableDef.new("t", SCHEMA)
    meta, raw = encode_part("t", [], (), pa.table({"n": [1, 2], "p": ["a", "b"]}), "A")
    good = dataclasses.replace(meta, inline=raw)
    first = rewrite.read_parts(storage, [good], table=tdef, cached=True)[0]
    assert rewrite.read_parts(storage, [good], table=tdef, cached=True)[0] is first  # decoded once
    rotted = bytearray(raw)
    rotted[len(raw) // 2] ^= 0xFF
    for forged in (dataclasses.replace(good, inline=bytes(rotted)), dataclasses.replace(good, rows=3)):
        for _ in range(2):
            with pytest.raises(CorruptPart):
                rewrite.read_parts(storage, [forged], table=tdef, cached=True)
    assert rewrite.read_parts(storage, [good], table=tdef, cached=True)[0].equals(first)


def test_joined_keeps_the_parts_order_and_makes_inlined_runs_one_chunk(tmp_path) -> None:  # noqa: ANN001
    storage = Storage(str(tmp_path))
    tdef = TableDef.new("t", SCHEMA)
    metas = []
    for i in range(7):
        data = pa.table({"n": [2 * i, 2 * i + 1], "p": ["a", "b"]})
        metas.append(write_data(storage, tdef, data, f"tx{i}", inline=None if i == 3 else (10, 4096))[0])
    assert [m.inlined for m in metas] == [True, True, True, False, True, True, True]
    got = rewrite.joined(metas, rewrite.read_parts(storage, metas, table=tdef, cached=True), tdef.schema)
    assert got.column("n").to_pylist() == list(range(14))
    assert got.column("n").num_chunks == 3  # three inlined parts, the file, three inlined parts
    assert rewrite.joined([], [], tdef.schema).equals(tdef.schema.empty_table())


# -- a flush's removed inlined parts: their bytes in the flush's bundle (PartMeta.spilled) ---------
def spilled_meta() -> tuple[PartMeta, bytes]:
    meta, raw = encode_part("t", ["p"], (1,), pa.table({"n": [7, 8], "p": [1, 1]}), "A")
    return dataclasses.replace(meta, spilled=("t/p=1/B_00000000000000aa.inlined", 1234)), raw


def test_a_spilled_part_round_trips_through_its_json() -> None:
    meta, _ = spilled_meta()
    d = json.loads(json.dumps(meta.to_dict()))
    assert d["spilled"] == ["t/p=1/B_00000000000000aa.inlined", 1234] and "inline" not in d
    back = PartMeta.from_dict(d)
    assert back == meta and back.spilled == meta.spilled and back.inline is None and back.inlined
    plain = dataclasses.replace(meta, spilled=None)
    assert "spilled" not in plain.to_dict() and PartMeta.from_dict(plain.to_dict()).spilled is None


@pytest.mark.parametrize(
    "spilled",
    [
        "t/x.inlined",  # not a pair
        ["t/x.inlined"],
        ["t/x.inlined", 1, 2],
        ["/abs/x.inlined", 0],  # absolute
        ["t/../x.inlined", 0],  # leads out
        ["t/x.parquet", 0],  # not a bundle
        ["", 0],
        ["t/" + "a" * 1100 + ".inlined", 0],  # unbounded
        [7, 0],
        ["t/x.inlined", -1],  # negative
        ["t/x.inlined", 1.5],
        ["t/x.inlined", True],
        ["t/x.inlined", "3"],
        ["t/x.inlined", 1 << 41],  # past any bundle
        ["other/x.inlined", 0],  # another table's
    ],
)
def test_a_wrong_spilled_location_is_refused(spilled: object) -> None:
    meta, _ = spilled_meta()
    d = {**meta.to_dict(), "spilled": spilled}
    with pytest.raises(CorruptMetadata, match="'spilled'"):
        PartMeta.from_dict(d)


def test_spilled_and_inline_together_are_refused() -> None:
    meta, raw = spilled_meta()
    d = {**dataclasses.replace(meta, spilled=None, inline=raw).to_dict(), "spilled": ["t/x.inlined", 0]}
    with pytest.raises(CorruptMetadata, match="'spilled' and 'inline'"):
        PartMeta.from_dict(d)


def test_a_flush_entry_spills_its_removed_inlined_parts_and_a_checkpoint_keeps_them_small(tmp_path) -> None:  # noqa: ANN001
    """Applying a flush's change drops the removed inlined parts' bytes from their records and
    keeps where the bundle holds them; the read goes there (a range of the bundle), a checkpoint
    carries the location, and a cut bundle is CorruptPart like a cut file."""
    storage = Storage(str(tmp_path))
    metas = []
    for i in range(3):
        m, raw = encode_part("t", ["p"], (1,), pa.table({"n": [i, 10 + i], "p": [1, 1]}), f"A{i}")
        metas.append(dataclasses.replace(m, inline=raw))
    merged = part("m", partition=(1,))
    where = store_bundle(storage, merged, metas)
    assert [where[m.name][1] for m in metas] == [0, metas[0].size, metas[0].size + metas[1].size]
    st = ReplicaState()
    st.apply(1, 0, 0, entry(ddl=[table_def("t")], versions={"t": 0}))
    st.apply(2, 0, 1, entry(("A", [change("t", (1,), [Kind.INSERT], added=metas)])))
    flush = Change("t", '["1"]', (Kind.MINOR_COMPACT,), (merged,), tuple(m.name for m in metas), where)
    wire = LogEntry.from_dict(
        json.loads(LogEntry(1.0, {"t": 2}, (TxnRecord("T2-1-r0", None, (flush,)),)).encode()), "t"
    )
    assert wire.txns[0].changes[0].spilled == where
    st.apply(3, 0, 2, wire)
    for m in metas:
        rec = st.parts[m.name].meta
        assert rec.inline is None and rec.spilled == where[m.name] and len(json.dumps(rec.to_dict())) < 700
        assert read_part(storage, rec).equals(read_part(storage, m)) and verify_file(storage, rec) is None
    back = ReplicaState()
    back.restore(json.loads(json.dumps(st.export())), "mem")
    assert {n: r.meta for n, r in back.parts.items()} == {n: r.meta for n, r in st.parts.items()}
    bundle = tmp_path / "t" / "m.inlined"
    bundle.write_bytes(bundle.read_bytes()[:-5])  # the last part cut short
    with pytest.raises(CorruptPart, match="bytes"):
        read_part(storage, back.parts[metas[-1].name].meta)
    bundle.unlink()
    with pytest.raises(CorruptPart, match="missing"):
        read_part(storage, back.parts[metas[0].name].meta)
    assert "missing" in (verify_file(storage, back.parts[metas[0].name].meta) or "")


@pytest.mark.parametrize(
    "spilled",
    [
        ["t/x.inlined", 0],
        {"other": ["t/x.inlined", 0]},
        {"a": ["t/x.parquet", 0]},
        {"a": ["t/x.inlined", -3]},
        {"a": ["u/x.inlined", 0]},
    ],
)
def test_a_change_with_a_wrong_spilled_map_is_corrupt(spilled: object) -> None:
    d = {"table": "t", "pkey": "[]", "kinds": ["MINOR_COMPACT"], "added": [], "removed": ["a"], "spilled": spilled}
    with pytest.raises(CorruptMetadata):
        Change.from_dict(d)


def test_a_client_compaction_cannot_name_spilled_parts() -> None:
    with pytest.raises(InvalidInput, match="spilled"):
        op_from_dict(
            {"op": "compact", "table": "t", "compact_kind": "minor", "removed": ["a"], "spilled": [["a", "x", 0]]}
        )


def test_read_parts_keeps_its_reader_threads_and_a_forked_child_makes_its_own(tmp_path) -> None:  # noqa: ANN001
    """``read_parts`` reads through one pool per process (threads started once, not at every
    read), keeps the parts' order, and in a forked child (whose copy of the pool has no threads)
    reads through a pool of its own instead of waiting forever."""
    import multiprocessing
    import threading

    from parts.io.format import write_part

    storage = Storage(str(tmp_path))
    metas = [write_part(storage, "t", [], (), pa.table({"n": [i]}), "A") for i in range(6)]

    def readers() -> set[int]:
        return {t.ident or 0 for t in threading.enumerate() if t.name.startswith("mergetxn-read")}

    assert [d["n"][0].as_py() for d in rewrite.read_parts(storage, metas)] == list(range(6))
    before = readers()
    for _ in range(20):
        assert [d["n"][0].as_py() for d in rewrite.read_parts(storage, metas[::-1])] == list(range(5, -1, -1))
    assert before and before <= readers()  # the threads of the first read still serve (a pool per read let them go)
    assert len(readers()) <= rewrite.READ_THREADS
    child = multiprocessing.get_context("fork").Process(target=_read_in_child, args=(str(tmp_path), metas))
    child.start()
    child.join(60)
    assert child.exitcode == 0, "a forked child could not read through the pool"


def _read_in_child(root: str, metas: list[PartMeta]) -> None:
    got = [d["n"][0].as_py() for d in rewrite.read_parts(Storage(root), metas)]
    raise SystemExit(0 if got == list(range(6)) else 1)
