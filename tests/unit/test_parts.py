"""Part format, storage and Arrow operations: fast tests on local and in-memory storage."""

from __future__ import annotations

import datetime as dt
import json
import os
import pickle

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from coordinator.core import tabledata as ops
from coordinator.errors import CorruptMetadata, CorruptPart, InvalidInput
from parts.io.format import new_part_name, read_meta, read_part, write_part
from parts.io.storage import Storage, is_temp_file
from parts.model.meta import PartMeta

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("day", pa.date32()),
        pa.field("score", pa.float64()),
    ]
)


def sample(n: int = 6) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "name": [f"n{i}" if i % 3 else None for i in range(n)],
            "day": [dt.date(2024, 1, 1 + i % 2) for i in range(n)],
            "score": [float(i) / 2 for i in range(n)],
        },
        schema=SCHEMA,
    )


@pytest.fixture
def storage(tmp_path) -> Storage:
    return Storage(str(tmp_path / "store"))


# --------------------------------------------------------------------------------------------
# Storage


def test_storage_creates_local_directory_and_round_trips(tmp_path):
    root = tmp_path / "a" / "b"
    st = Storage(str(root))
    assert root.is_dir()
    st.put("t/x/one.bin", b"hello")
    assert st.get("t/x/one.bin") == b"hello"
    assert st.exists("t/x/one.bin")
    assert not st.exists("t/x")
    assert st.size("t/x/one.bin") == 5
    assert abs(st.mtime("t/x/one.bin") - os.stat(root / "t/x/one.bin").st_mtime) < 1e-6
    st.put("t/x/one.bin", b"replaced")
    assert st.get("t/x/one.bin") == b"replaced"


def test_file_url_is_local(tmp_path):
    st = Storage(f"file://{tmp_path}/f")
    st.put("a/b", b"1")
    assert (tmp_path / "f" / "a" / "b").read_bytes() == b"1"
    assert st.is_local


def test_list_is_recursive_sorted_files_only(storage):
    for p in ["t/b/2", "t/a/1", "t/a/0", "u/9", "top"]:
        storage.put(p, p.encode())
    assert storage.list() == ["t/a/0", "t/a/1", "t/b/2", "top", "u/9"]
    assert storage.list("t/") == ["t/a/0", "t/a/1", "t/b/2"]
    assert storage.list("t/a") == ["t/a/0", "t/a/1"]
    assert storage.list("nothing/") == []


def test_list_with_mtime_selects_before_it_stats(storage, tmp_path):
    for p in ["t/b/2", "t/a/1", "t/a/0", "u/9", "top"]:
        storage.put(p, p.encode())
    os.utime(tmp_path / "store" / "t" / "a" / "1", (1_000_000, 1_000_000))
    listed = storage.list_with_mtime("t/")
    assert [p for p, _ in listed] == ["t/a/0", "t/a/1", "t/b/2"]
    assert dict(listed)["t/a/1"] == 1_000_000
    assert all(abs(m - storage.mtime(p)) < 1e-6 for p, m in listed)
    asked: list[str] = []
    chosen = storage.list_with_mtime("", lambda p: asked.append(p) or p.endswith("0"))
    assert chosen == [("t/a/0", storage.mtime("t/a/0"))]
    assert sorted(asked) == ["t/a/0", "t/a/1", "t/b/2", "top", "u/9"]
    assert storage.list_with_mtime("t/a") == storage.list_with_mtime("t/a/")
    assert storage.list_with_mtime("nothing/") == []


def test_delete_missing_is_fine_and_get_missing_raises(storage):
    storage.put("x/y", b"1")
    storage.delete("x/y")
    storage.delete("x/y")
    assert not storage.exists("x/y")
    with pytest.raises(FileNotFoundError):
        storage.get("x/y")


def test_put_leaves_no_temp_files_and_fsyncs(storage, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    storage.put("t/p/part.parquet", b"x" * 1000)
    assert len(synced) >= 2, "both the file and its directory must be fsynced"
    for dirpath, _dirs, files in os.walk(storage._root):
        for f in files:
            assert ".tmp-" not in f, f"temporary file left behind: {dirpath}/{f}"
    assert storage.list() == ["t/p/part.parquet"]


def test_put_failure_removes_temp_and_keeps_old_content(storage, monkeypatch):
    storage.put("t/f", b"old")

    def boom(fd):
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="disk on fire"):
        storage.put("t/f", b"new")
    monkeypatch.undo()
    assert storage.get("t/f") == b"old"
    assert storage.list() == ["t/f"]


def test_fresh_put_creates_the_final_name_only_and_never_overwrites(storage, monkeypatch):
    storage.put("t/p/first.parquet", b"1", fresh=True)  # makes the directories
    created = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a: (created.append(path), real_open(path, *a))[1])
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    storage.put("t/p/part.parquet", b"x" * 100_000, fresh=True)
    monkeypatch.undo()
    assert [os.path.basename(p) for p in created] == ["part.parquet", "p"]  # the file, then its directory
    assert len(synced) == 2, "both the file and its directory must be fsynced"
    assert storage.list() == ["t/p/first.parquet", "t/p/part.parquet"]
    assert storage.get("t/p/part.parquet") == b"x" * 100_000
    with pytest.raises(OSError):
        storage.put("t/p/part.parquet", b"other", fresh=True)
    assert storage.get("t/p/part.parquet") == b"x" * 100_000


def test_fresh_put_failure_removes_the_partial_file(storage, monkeypatch):
    def boom(fd):
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="disk on fire"):
        storage.put("t/p/part.parquet", b"new", fresh=True)
    monkeypatch.undo()
    assert storage.list() == []


def test_temp_file_names_are_recognisable():
    assert is_temp_file("t/_/.x.parquet.tmp-0123456789ab")
    assert not is_temp_file("t/_/x.parquet")


@pytest.mark.parametrize("bad", ["../x", "/abs", "a/../b", "a//b", "a/./b", "a\\b", "a\x00b", ""])
def test_storage_rejects_unsafe_relpaths(storage, bad):
    with pytest.raises(InvalidInput):
        storage.put(bad, b"1")
    with pytest.raises(InvalidInput):
        storage.get(bad)


def test_bad_scheme_is_invalid_input():
    with pytest.raises(InvalidInput, match="nosuchproto"):
        Storage("nosuchproto://bucket/x")


def test_memory_storage_round_trip():
    st = Storage("memory://mergetxn-test-mem")
    st.put("t/a.bin", b"abc")
    st.put("t/sub/b.bin", b"de")
    assert st.get("t/a.bin") == b"abc"
    assert st.list("t/") == ["t/a.bin", "t/sub/b.bin"]
    assert st.size("t/sub/b.bin") == 2
    assert st.exists("t/a.bin") and not st.exists("t/nope")
    st.delete("t/a.bin")
    st.delete("t/a.bin")
    assert st.list() == ["t/sub/b.bin"]
    with pytest.raises(FileNotFoundError):
        st.get("t/a.bin")


def test_repr_hides_credentials_and_pickles(tmp_path):
    st = Storage("memory://mergetxn-test-secret", {"secret_token": "hunter2-very-secret"})
    assert "hunter2" not in repr(st) and "hunter2" not in str(st)
    assert repr(st) == "Storage('memory://mergetxn-test-secret')"
    st2 = pickle.loads(pickle.dumps(Storage(str(tmp_path / "p"))))
    assert st2.url == str(tmp_path / "p")


# --------------------------------------------------------------------------------------------
# Part format


def test_write_read_round_trip(storage):
    data = sample()
    meta = write_part(storage, "events", ["day"], ("2024-01-01",), data, "T5-1-h1")
    assert meta.rows == 6 and meta.table == "events" and meta.partition == ("2024-01-01",)
    assert meta.path == f"events/day=2024-01-01/{meta.name}.parquet"
    assert storage.exists(meta.path) and storage.exists(meta.meta_path)
    assert meta.size == storage.size(meta.path)
    assert meta.checksum.startswith("crc32:")
    out = read_part(storage, meta)
    assert out.equals(data)
    assert out.schema.field("id").nullable is False
    assert read_part(storage, meta, columns=["score", "id"]).column_names == ["score", "id"]
    assert read_meta(storage, meta.meta_path) == meta
    assert meta.stats["id"] == (0, 5)
    assert meta.stats["day"] == ("2024-01-01", "2024-01-02")
    assert meta.stats["name"] == ("n1", "n5")
    json.dumps(meta.to_dict(), allow_nan=False)
    bare = write_part(storage, "events", ["day"], ("2024-01-01",), data, "tx9", sidecar=False)
    assert storage.exists(bare.path) and not storage.exists(bare.meta_path)  # the commit carries it
    assert read_part(storage, bare).equals(data) and bare.stats == meta.stats and bare.size == meta.size


def test_unpartitioned_and_empty_part(storage):
    empty = sample(0)
    meta = write_part(storage, "t", [], (), empty, "T1-1-h")
    assert meta.path.startswith("t/_/") and meta.rows == 0
    assert read_part(storage, meta).num_rows == 0
    assert meta.stats["id"] == (None, None)


def test_partition_dir_encodes_values(storage):
    meta = write_part(storage, "t", ["k", "b", "n"], ("a/b c%..", True, None), pa.table({"x": [1]}), "T1-1-h")
    assert meta.path.startswith("t/k=a%2Fb%20c%25../b=true/n=__HIVE_DEFAULT_PARTITION__/")
    assert read_meta(storage, meta.meta_path).partition == ("a/b c%..", True, None)
    assert len(ops.partition_dir(["k"], ("x" * 1000,))) < 200


def test_stats_for_special_columns(storage):
    data = pa.table(
        {
            "f": [1.0, float("nan")],
            "ts": pa.array([dt.datetime(2024, 1, 1, 5), dt.datetime(2024, 1, 2)], pa.timestamp("us", "UTC")),
            "bin": [b"a", b"b"],
            "allnull": pa.array([None, None], pa.int32()),
        }
    )
    meta = write_part(storage, "t", [], (), data, "T1-1-h")
    assert "f" not in meta.stats
    assert "bin" not in meta.stats
    assert meta.stats["allnull"] == (None, None)
    assert meta.stats["ts"] == (
        "2024-01-01T05:00:00.000000+00:00",
        "2024-01-02T00:00:00.000000+00:00",
    )


STATS_CASES = {  # column -> values: the small (Python) and large (pyarrow.compute) paths agree
    "int": pa.array([3, -7, None, 12, 0], pa.int64()),
    "int8": pa.array([None, None, 1, -128, 127], pa.int8()),
    "uint": pa.array([2**64 - 1, 0, 5, None, 1], pa.uint64()),
    "float": pa.array([0.5, -1.25, None, 3.0, -0.0]),
    "inf": pa.array([1.0, float("inf"), None, 0.0, 2.0]),
    "neginf": pa.array([1.0, float("-inf"), 2.0, None, 0.0]),
    "nan": pa.array([1.0, None, float("nan"), 0.0, 2.0]),
    "float32": pa.array([1.5, -2.5, None, 0.0, 7.0], pa.float32()),
    "str": pa.array(["b", "", "a\u00ff", "\U0010ffff", "\u007f"]),
    "edges": pa.array(["\ud7ff", "\ue000", "\uffff", "\U00010000", "\u0800"]),
    "long": pa.array(["m" * 300, "m" * 299 + "n", None, "a" * 100, "z" * 70]),
    "large": pa.array(["x", "y", None, "xx", "w"], pa.large_string()),
    "date": pa.array([dt.date(2024, 1, 2), None, dt.date(1970, 1, 1), dt.date(9999, 12, 31), dt.date(2000, 2, 29)]),
    "date64": pa.array([dt.date(2024, 1, 2), None, dt.date(1970, 1, 1), dt.date(2001, 1, 1), None], pa.date64()),
    "bool": pa.array([True, None, False, True, True]),
    "true": pa.array([True, None, True, None, True]),
    "allnull": pa.array([None] * 5, pa.float64()),
    "ts": pa.array([dt.datetime(2024, 1, 1, 5), None, dt.datetime(2023, 1, 2), None, None], pa.timestamp("us", "UTC")),
    "bin": pa.array([b"a", b"b", None, b"", b"z"]),
}


@pytest.mark.parametrize("rows", [0, 1, 2, 5])
def test_small_parts_stats_equal_the_compute_path(rows):
    """A part of at most SMALL_STATS_ROWS rows gets its statistics in Python; the same rows
    repeated past that bound (same min and max) go through pyarrow.compute: both agree."""
    from parts.io.format import SMALL_STATS_ROWS, column_stats

    small = pa.table({k: v.slice(0, rows) for k, v in STATS_CASES.items()})
    large = pa.concat_tables([small] * (SMALL_STATS_ROWS // max(1, rows) + 1))
    assert rows == 0 or large.num_rows > SMALL_STATS_ROWS
    got, want = column_stats(small), column_stats(large if rows else small)
    assert got == want
    assert [type(v) for pair in got.values() for v in pair] == [type(v) for pair in want.values() for v in pair]
    if rows == 5:
        assert "nan" not in got and "inf" not in got and "bin" not in got
        assert got["int"] == (-7, 12) and got["str"] == ("", "\U0010ffff") and got["allnull"] == (None, None)


def test_new_part_name_unique_and_safe(storage):
    names = {new_part_name("T1-2-host/../x y") for _ in range(1000)}
    assert len(names) == 1000
    for n in names:
        assert n.startswith("T1-2-host_")
        assert all(c.isalnum() or c in "_.-" for c in n), n
    storage.put(f"t/_/{n}.parquet", b"1")
    assert storage.list() == [f"t/_/{n}.parquet"]


def _flip_byte(storage, path, offset):
    raw = bytearray(storage.get(path))
    raw[offset] ^= 0x01
    storage.put(path, bytes(raw))


@pytest.mark.parametrize("offset", [0, 100, -1])
def test_corrupted_byte_is_corrupt_part(storage, offset):
    meta = write_part(storage, "t", [], (), sample(), "T1-1-h")
    _flip_byte(storage, meta.path, offset)
    with pytest.raises(CorruptPart, match="checksum") as err:
        read_part(storage, meta)
    assert meta.path in str(err.value)


def test_truncated_part_is_corrupt(storage):
    meta = write_part(storage, "t", [], (), sample(), "T1-1-h")
    storage.put(meta.path, storage.get(meta.path)[:-10])
    with pytest.raises(CorruptPart, match="bytes") as err:
        read_part(storage, meta)
    assert meta.path in str(err.value)


def test_deleted_part_is_corrupt(storage):
    meta = write_part(storage, "t", [], (), sample(), "T1-1-h")
    storage.delete(meta.path)
    with pytest.raises(CorruptPart, match="missing") as err:
        read_part(storage, meta)
    assert meta.path in str(err.value)


def test_unparseable_file_with_matching_checksum_is_corrupt(storage):
    meta = write_part(storage, "t", [], (), sample(), "T1-1-h")
    garbage = b"not parquet at all" * 10
    storage.put(meta.path, garbage)
    from parts.io.format import checksum_of

    forged = PartMeta(**{**meta.__dict__, "size": len(garbage), "checksum": checksum_of(garbage)})
    with pytest.raises(CorruptPart, match="Parquet") as err:
        read_part(storage, forged)
    assert meta.path in str(err.value)


def test_read_unknown_column_is_invalid_input(storage):
    meta = write_part(storage, "t", [], (), sample(), "T1-1-h")
    with pytest.raises(InvalidInput, match="nope"):
        read_part(storage, meta, columns=["nope"])


def test_meta_from_dict_validates(storage):
    meta = write_part(storage, "t", [], (), sample(), "T1-1-h")
    good = meta.to_dict()
    assert PartMeta.from_dict(good) == meta
    for key, value, needle in [
        ("rows", "6", "'rows'"),
        ("rows", True, "'rows'"),
        ("size", -1, "non-negative"),
        ("checksum", "md5:abc", "'checksum'"),
        ("partition", "x", "'partition'"),
        ("path", "../etc/passwd.parquet", "'path'"),
        ("table", "a/b", "path character"),
        ("stats", {"id": [1]}, "'id'"),
        ("created_at", None, "'created_at'"),
    ]:
        with pytest.raises(CorruptMetadata, match=needle):
            PartMeta.from_dict({**good, key: value})
    for key in good:
        with pytest.raises(CorruptMetadata, match=repr(key)):
            PartMeta.from_dict({k: v for k, v in good.items() if k != key})
    with pytest.raises(CorruptMetadata):
        PartMeta.from_dict([1, 2])


def test_read_meta_garbage_and_mismatch(storage):
    meta = write_part(storage, "t", [], (), sample(), "T1-1-h")
    storage.put(meta.meta_path, b"{not json")
    with pytest.raises(CorruptMetadata, match="not JSON"):
        read_meta(storage, meta.meta_path)
    storage.put("t/_/other.json", json.dumps(meta.to_dict()).encode())
    with pytest.raises(CorruptMetadata, match="another file"):
        read_meta(storage, "t/_/other.json")


# --------------------------------------------------------------------------------------------
# Names and schemas


@pytest.mark.parametrize(
    "name,reason",
    [
        ("a/b", "'/'"),
        ("..", "'..'"),
        ("a\\b", "'\\\\\\\\'"),
        ("c:d", "':'"),
        ("a\x00", "NUL"),
        ("a b", "whitespace"),
        ("", "empty"),
        ("1abc", "start with"),
        ("x" * 129, "longer"),
        ("é", "start with"),
        ("a-b", "invalid character"),
    ],
)
def test_validate_name_rejects_with_reason(name, reason):
    with pytest.raises(InvalidInput, match=reason) as err:
        ops.validate_name("table", name)
    assert err.value.message.startswith(f"table name {name!r}")


def test_validate_name_accepts():
    for ok in ["a", "_x", "Events_2024", "x" * 128]:
        assert ops.validate_name("column", ok) == ok


def test_schema_json_round_trip_and_garbage():
    text = ops.schema_to_json(SCHEMA.with_metadata({"k": "v"}))
    back = ops.schema_from_json(text)
    assert back.equals(SCHEMA.with_metadata({"k": "v"}), check_metadata=True)
    for garbage in ["", "!!!", "aGVsbG8=", 42]:
        with pytest.raises(CorruptMetadata):
            ops.schema_from_json(garbage)


def test_validate_schema():
    ops.validate_schema(SCHEMA, ["day"], ["id"])
    with pytest.raises(InvalidInput, match="zz"):
        ops.validate_schema(SCHEMA, ["zz"], [])
    with pytest.raises(InvalidInput, match="pk"):
        ops.validate_schema(SCHEMA, [], ["pk"])
    with pytest.raises(InvalidInput, match="score"):
        ops.validate_schema(SCHEMA, ["score"], [])
    with pytest.raises(InvalidInput, match="duplicate"):
        ops.validate_schema(pa.schema([("a", pa.int8()), ("a", pa.int8())]), [], [])
    with pytest.raises(InvalidInput, match="path character"):
        ops.validate_schema(pa.schema([("a/b", pa.int8())]), [], [])
    with pytest.raises(InvalidInput):
        ops.validate_schema(pa.schema([]), [], [])


# --------------------------------------------------------------------------------------------
# conform


def test_conform_reorders_and_casts_safely():
    data = pa.table(
        {
            "score": pa.array([1.5], pa.float32()),
            "day": [dt.date(2024, 1, 1)],
            "name": pa.array(["x"], pa.large_string()),
            "id": pa.array([7], pa.int32()),
        }
    )
    out = ops.conform(SCHEMA, data, "events")
    assert out.schema.equals(SCHEMA)
    assert out.to_pylist() == [{"id": 7, "name": "x", "day": dt.date(2024, 1, 1), "score": 1.5}]


def test_conform_fills_absent_nullable_columns_and_refuses_absent_required_ones():
    """Writers after an alter_table: a nullable column the data lacks is typed nulls; a
    non-nullable one, or a required one (partition or key), is refused by name."""
    out = ops.conform(SCHEMA, pa.table({"score": [2.5], "id": [3]}), "events")
    assert out.schema.equals(SCHEMA)
    assert out.to_pylist() == [{"id": 3, "name": None, "day": None, "score": 2.5}]
    empty = ops.conform(SCHEMA, pa.table({"id": pa.array([], pa.int64())}), "events")
    assert empty.num_rows == 0 and empty.schema.equals(SCHEMA)
    with pytest.raises(InvalidInput, match=r"missing column\(s\) \['id'\]"):
        ops.conform(SCHEMA, pa.table({"name": ["x"]}), "events")
    with pytest.raises(InvalidInput, match=r"missing column\(s\) \['day'\]"):
        ops.conform(SCHEMA, pa.table({"id": [1]}), "events", required=["day"])
    with pytest.raises(InvalidInput, match=r"unexpected column\(s\) \['zz'\]"):
        ops.conform(SCHEMA, pa.table({"id": [1], "zz": [1]}), "events")


def test_conform_names_every_offending_column():
    data = pa.table({"id": ["1"], "name": ["x"], "foo": [1], "score": [1.0]})
    with pytest.raises(InvalidInput) as err:
        ops.conform(SCHEMA, data, "events", required=("day",))  # 'day' as a partition column
    msg = err.value.message
    assert msg.startswith("insert into 'events':")
    assert "missing column(s) ['day']" in msg
    assert "unexpected column(s) ['foo']" in msg
    assert "column 'id' is string, table has int64" in msg


def test_conform_rejects_lossy_casts_and_nulls_in_non_nullable():
    base = sample(2)
    lossy = base.set_column(0, "id", pa.array([1.0, 2.0]))
    with pytest.raises(InvalidInput, match="column 'id' is double, table has int64"):
        ops.conform(SCHEMA, lossy, "events")
    nulls = base.set_column(0, "id", pa.array([1, None], pa.int64()))
    with pytest.raises(InvalidInput, match="'id' is not nullable"):
        ops.conform(SCHEMA, nulls, "events")
    with pytest.raises(InvalidInput, match="pyarrow.Table"):
        ops.conform(SCHEMA, {"id": [1]}, "events")


# --------------------------------------------------------------------------------------------
# Partitions


def test_split_by_partition_multiple_keys_and_nulls():
    data = pa.table(
        {
            "k": ["a", "b", None, "a", None, "b", "a"],
            "d": [
                dt.date(2024, 1, 1),
                dt.date(2024, 1, 1),
                None,
                dt.date(2024, 1, 2),
                None,
                dt.date(2024, 1, 1),
                dt.date(2024, 1, 1),
            ],
            "v": list(range(7)),
        }
    )
    groups = ops.split_by_partition(data, ["k", "d"])
    got = {p: t.column("v").to_pylist() for p, t in groups}
    assert got == {
        ("a", "2024-01-01"): [0, 6],
        ("b", "2024-01-01"): [1, 5],
        (None, None): [2, 4],
        ("a", "2024-01-02"): [3],
    }
    assert [p for p, _ in groups][0] == ("a", "2024-01-01")
    assert sum(t.num_rows for _, t in groups) == data.num_rows
    for p, t in groups:
        assert t.schema.equals(data.schema)
        json.dumps(p)


def test_split_unpartitioned_and_empty():
    data = sample()
    [(p, t)] = ops.split_by_partition(data, [])
    assert p == () and t.equals(data)
    assert ops.split_by_partition(sample(0), ["day"]) == []
    assert ops.split_by_partition(sample(0), []) == []


def test_split_bool_and_int_keys():
    data = pa.table({"b": [True, False, True, None], "i": [1, 1, 2, 1]})
    got = {p: t.num_rows for p, t in ops.split_by_partition(data, ["b", "i"])}
    assert got == {(True, 1): 1, (False, 1): 1, (True, 2): 1, (None, 1): 1}


def test_partition_key_round_trip():
    for p in [(), ("a",), (1, None, True, "x/y")]:
        key = ops.partition_key(p)
        assert ops.partition_from_key(key) == p
    assert ops.partition_key((dt.date(2024, 1, 1),)) == '["2024-01-01"]'
    with pytest.raises(CorruptMetadata):
        ops.partition_from_key("{")
    with pytest.raises(CorruptMetadata):
        ops.partition_from_key('{"a": 1}')


# --------------------------------------------------------------------------------------------
# Expressions, delete, update


def test_check_expression_names_missing_columns():
    ops.check_expression(pc.field("id") > 3, SCHEMA, "delete from 'events'")
    with pytest.raises(InvalidInput, match=r"missing column\(s\) \['zz', 'yy'\]") as err:
        ops.check_expression((pc.field("zz") > 1) & (pc.field("yy") < "x"), SCHEMA, "delete from 'events'")
    assert err.value.message.startswith("delete from 'events'")
    with pytest.raises(InvalidInput, match="bool"):
        ops.check_expression(pc.field("id") + 1, SCHEMA, "delete")
    with pytest.raises(InvalidInput):
        ops.check_expression(pc.field("name") > 1, SCHEMA, "delete")
    with pytest.raises(InvalidInput, match="Expression"):
        ops.check_expression("id > 3", SCHEMA, "delete")


def test_expression_encode_decode_round_trip():
    data = sample(10)
    exprs = [
        (pc.field("id") > 3) & (pc.field("name") != "n4"),
        pc.field("day") == dt.date(2024, 1, 2),
        pc.field("name").is_null() | (pc.field("score") * 2 >= 7),
        pc.field("id").isin([1, 5, 9]),
    ]
    for e in exprs:
        text = ops.encode_expression(e, SCHEMA)
        assert isinstance(text, str)
        back = ops.decode_expression(text, SCHEMA)
        assert data.filter(back).equals(data.filter(e)), str(e)
    with pytest.raises(CorruptMetadata):
        ops.decode_expression("not base64!", SCHEMA)
    with pytest.raises(CorruptMetadata, match="bound to columns"):
        ops.decode_expression(ops.encode_expression(pc.field("id") > 1, SCHEMA), pa.schema([("id", pa.int64())]))
    with pytest.raises(InvalidInput, match="zz"):
        ops.encode_expression(pc.field("zz") > 1, SCHEMA)


def test_apply_delete_keeps_null_predicate_rows():
    data = pa.table({"a": [1, 2, None, 4], "b": ["x", "y", "z", "w"]})
    kept, n = ops.apply_delete(data, pc.field("a") > 1)
    assert n == 2
    assert kept.column("b").to_pylist() == ["x", "z"]
    kept, n = ops.apply_delete(data, pc.field("a") > 100)
    assert n == 0 and kept.equals(data)
    kept, n = ops.apply_delete(data, pc.scalar(True))
    assert n == 4 and kept.num_rows == 0 and kept.schema.equals(data.schema)


def test_apply_update_uses_old_values_and_keeps_schema():
    data = pa.table({"a": pa.array([1, 2, None, 4], pa.int32()), "b": [10, 20, 30, 40]})
    assigns = ops.assignments({"a": pc.field("b"), "b": pc.field("a") * 100}, data.schema)
    out, n = ops.apply_update(data, pc.field("a") >= 2, assigns)
    assert n == 2
    assert out.schema.equals(data.schema)
    assert out.to_pydict() == {"a": [1, 20, None, 40], "b": [10, 200, 30, 400]}


def test_apply_update_scalar_and_encoded_assignments():
    schema = pa.schema([("a", pa.int64()), ("s", pa.string()), ("d", pa.date32())])
    data = pa.table({"a": [1, 2, 3], "s": ["x", None, "z"], "d": [dt.date(2024, 1, 1)] * 3}, schema=schema)
    assigns = ops.assignments({"s": "new", "d": dt.date(2025, 5, 5), "a": None}, schema)
    where = pc.field("s").is_null() | (pc.field("a") == 3)
    shipped = ops.decode_assignments(ops.encode_assignments(assigns, schema), schema)
    where2 = ops.decode_expression(ops.encode_expression(where, schema), schema)
    for a, w in [(assigns, where), (shipped, where2)]:
        out, n = ops.apply_update(data, w, a)
        assert n == 2
        assert out.to_pydict() == {
            "a": [1, None, None],
            "s": ["x", "new", "new"],
            "d": [dt.date(2024, 1, 1), dt.date(2025, 5, 5), dt.date(2025, 5, 5)],
        }


def test_assignments_reject_bad_input():
    with pytest.raises(InvalidInput, match="unknown column"):
        ops.assignments({"nope": 1}, SCHEMA)
    with pytest.raises(InvalidInput, match="'score'"):
        ops.assignments({"score": "not a number"}, SCHEMA)
    with pytest.raises(InvalidInput, match="not nullable"):
        ops.assignments({"id": None}, SCHEMA)
    with pytest.raises(InvalidInput, match="zz"):
        ops.assignments({"score": pc.field("zz") + 1}, SCHEMA)
    with pytest.raises(InvalidInput):
        ops.assignments({}, SCHEMA)


def test_update_to_null_in_non_nullable_column_rejected():
    schema = pa.schema([pa.field("a", pa.int64(), nullable=False), ("b", pa.int64())])
    data = pa.table({"a": [1, 2, 3], "b": [None, 5, 6]}, schema=schema)
    with pytest.raises(InvalidInput, match="not nullable"):
        ops.apply_update(data, pc.field("a") == 1, {"a": pc.field("b")})
    out, n = ops.apply_update(data, pc.field("a") == 2, {"a": pc.field("b")})
    assert n == 1 and out.column("a").to_pylist() == [1, 5, 3]


def test_update_evaluates_set_only_on_matching_rows():
    schema = pa.schema([("s", pa.string()), ("n", pa.int64())])
    data = pa.table({"s": ["1", "x", "3"], "n": [0, 0, 0]}, schema=schema)
    out, n = ops.apply_update(data, pc.field("s") != "x", {"n": pc.field("s").cast(pa.int64())})
    assert n == 2 and out.column("n").to_pylist() == [1, 0, 3]


# --------------------------------------------------------------------------------------------
# Pruning


STATS = {
    "id": (10, 20),
    "name": ("k", "m"),
    "day": ("2024-01-05", "2024-01-09"),
    "score": (1.0, 2.0),
}


@pytest.mark.parametrize(
    "where,expected",
    [
        (pc.field("id") > 20, False),
        (pc.field("id") >= 20, True),
        (pc.field("id") < 10, False),
        (pc.field("id") <= 10, True),
        (pc.field("id") == 5, False),
        (pc.field("id") == 15, True),
        (pc.field("id") != 15, True),
        ((pc.field("id") == 15) & (pc.field("name") == "z"), False),
        ((pc.field("id") == 5) | (pc.field("name") == "l"), True),
        ((pc.field("id") == 5) | (pc.field("name") == "z"), False),
        (pc.field("day") < dt.date(2024, 1, 5), False),
        (pc.field("day") <= dt.date(2024, 1, 5), True),
        (pc.field("score") > 2.5, False),
        (pc.field("id").isin([1, 2]), False),  # a value set: a part may hold one of its values
        (pc.field("id").isin([1, 15]), True),
        (pc.field("id").isin(list(range(0, 10))), False),  # more than 8 values: their range
        (pc.field("id").isin(list(range(0, 100, 9))), True),
        (pc.field("id").isin([]), False),  # an empty set: no row matches
        (pc.field("name").isin(["a", 'z") or (id > 5']), False),
        (pc.field("name").isin(["l"]), True),
        (pc.field("score").isin([5.0, float("nan")]), True),  # NaN: left to the filter
        (pc.field("day").isin([dt.date(2024, 1, 1)]), False),
        (pc.field("id").isin([1, None]), True),  # a null in the set: left to the filter
        (pc.field("id").isin([1, 2]) & (pc.field("id") == 3), True),  # inside AND/OR: not parsed
        (~(pc.field("id") < 30), True),
        (pc.field("name").is_null(), True),
        (pc.field("id") + 1 > 100, True),
        (pc.field("name") == 'a") and (id > 5', False),
        (pc.field("name") == 'l") or (id > 5', True),
    ],
)
def test_may_match(where, expected):
    assert ops.may_match(STATS, [], (), where) is expected
    assert ops.may_match(STATS, [], (), where, schema=SCHEMA) is expected


def test_may_match_decoded_expressions_need_schema():
    where = ops.decode_expression(ops.encode_expression(pc.field("id") > 20, SCHEMA), SCHEMA)
    assert ops.may_match(STATS, [], (), where, schema=SCHEMA) is False
    assert ops.may_match(STATS, [], (), where) is True
    inside = ops.decode_expression(ops.encode_expression(pc.field("id") > 15, SCHEMA), SCHEMA)
    assert ops.may_match(STATS, [], (), inside, schema=SCHEMA) is True


def test_may_match_partitions_nulls_and_unknowns():
    assert ops.may_match({}, ["day"], ("2024-01-01",), pc.field("day") == dt.date(2024, 1, 2)) is False
    assert ops.may_match({}, ["day"], ("2024-01-01",), pc.field("day") == dt.date(2024, 1, 1)) is True
    assert ops.may_match({}, ["k"], (None,), pc.field("k") == "x") is False
    assert ops.may_match({"id": (None, None)}, [], (), pc.field("id") == 1) is False
    assert ops.may_match({}, [], (), pc.field("id") == 1) is True
    assert ops.may_match(STATS, [], (), None) is True
    ts_stats = {"ts": ("2024-01-01T00:00:00.000000", "2024-01-02T00:00:00.000000")}
    assert ops.may_match(ts_stats, [], (), pc.field("ts") > dt.datetime(2030, 1, 1)) is True
    assert ops.may_match(ts_stats, [], (), pc.field("ts") == dt.date(2024, 1, 1)) is True
    assert ops.may_match(ts_stats, [], (), pc.field("ts") < "2000") is True
    assert ops.may_match({"id": (10, 20)}, [], (), pc.field("id") == 2.0**60) is True


def test_may_match_agrees_with_data(storage):
    """Pruning never drops a part that has a matching row."""
    data = sample(20)
    meta = write_part(storage, "t", [], (), data, "T1-1-h")
    for lit in range(-2, 23):
        for where in [
            pc.field("id") == lit,
            pc.field("id") > lit,
            pc.field("id") <= lit,
            pc.field("score") < lit / 2,
        ]:
            if data.filter(where).num_rows:
                assert ops.may_match(meta.stats, [], (), where, schema=SCHEMA), str(where)


def test_a_value_set_serialized_otherwise_is_left_to_the_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    """tabledata._is_in reads a value set from Arrow's own serialized form of the expression:
    when that form is not what it expects (another Arrow), the filter is not understood, so no
    part is ruled out and no read fails."""
    where = pc.field("id").isin([1, 2])
    assert not ops.may_match(STATS, [], (), where)
    forms: list = [pa.py_buffer(b"not arrow"), b"bytes", None]
    for meta in ({"call": "is_in"}, {"call": "is_in", "field_ref": "id", "options": "0", "end": "is_in"}):
        odd = pa.BufferOutputStream()  # other keys; the right keys over a column of no value set
        with pa.ipc.new_file(odd, pa.schema([("x", pa.int64())], metadata=meta)) as w:
            w.write_table(pa.table({"x": [1]}))
        forms.append(odd.getvalue())
    for form in forms:
        monkeypatch.setattr(ops, "_last_compiled", (None, None, ops.UNSUPPORTED))
        monkeypatch.setattr(ops, "_serialized", lambda where, f=form: f)
        assert ops.may_match(STATS, [], (), pc.field("id").isin([1, 2])) is True, form
