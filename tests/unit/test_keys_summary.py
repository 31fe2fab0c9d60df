"""Key summaries without per-key Python: the ``mix64`` hash scheme computed over
whole columns (coordinator/core/keytables.py, "key summaries") gives exactly the hashes the
per-key Python gives; a summary names its scheme, one without a name is ``blake2b`` (every part
written before) and is still probed with it; and parts of keys tables are written sorted by key
in row groups that a point read picks by their statistics (parts/io/format.py)."""

from __future__ import annotations

import base64
import dataclasses
import random
import string

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core import keyfold, keytables, mergeplan
from coordinator.core.errors import CorruptMetadata, CorruptPart
from parts.io import format as part_format
from parts.io.storage import Storage
from parts.model.meta import PartMeta


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_letters + "éß€😀 ,;\x00") for _ in range(rng.randint(0, 12)))


KINDS = {
    "int64": (pa.int64(), lambda r: r.randint(-(2**63), 2**63 - 1)),
    "uint64": (pa.uint64(), lambda r: r.randint(0, 2**64 - 1)),
    "int8": (pa.int8(), lambda r: r.randint(-128, 127)),
    "bool": (pa.bool_(), lambda r: r.random() < 0.5),
    "string": (pa.string(), _word),
    "large_string": (pa.large_string(), _word),
    "binary": (pa.binary(), lambda r: r.randbytes(r.randint(0, 9))),
}
COMBOS = [["int64"], ["uint64"], ["int8"], ["bool"], ["string"], ["large_string"], ["binary"], ["string", "int64"]]
COMBOS += [["bool", "int8", "binary"]]


def _table(kinds: list[str], n: int, rng: random.Random) -> pa.Table:
    cols = {f"c{i}": pa.array([KINDS[k][1](rng) for _ in range(n)], KINDS[k][0]) for i, k in enumerate(kinds)}
    return pa.table(cols)


@pytest.mark.parametrize("kinds", COMBOS, ids=["+".join(c) for c in COMBOS])
@pytest.mark.parametrize("seed", range(4))
def test_column_hashes_equal_the_per_key_hash(kinds: list[str], seed: int) -> None:
    rng = random.Random(f"{kinds}-{seed}")
    n = rng.choice([1, 5, 300, 1500])
    data = _table(kinds, n, rng)
    cut = rng.randrange(n)
    # Sliced and chunked columns (offsets into shared buffers) hash as fresh ones do.
    data = pa.concat_tables([data.slice(cut), data.slice(0, cut)])
    pk = data.column_names
    h1, h2 = keytables.column_hashes(data, pk)
    keys = list(zip(*(data.column(c).to_pylist() for c in pk)))
    assert list(zip(h1.to_pylist(), h2.to_pylist())) == [keytables.key_hash_mix64(k) for k in keys]


def test_mix64_is_pinned() -> None:
    # A later version, and every process, probes the bits a part was written with.
    assert keytables.key_hash_mix64((5,)) == (4341469512545408465, 4006667485591903389)
    assert keytables.key_hash_mix64(("x", 5)) == (9416767192624919299, 18268131652604337771)
    assert keytables.key_hash_mix64((True,)) == keytables.key_hash_mix64((1,))  # one column has one type
    assert keytables.key_hash_mix64(("ab",)) != keytables.key_hash_mix64((b"ab\x00",))
    assert keytables.key_hash_mix64((1.5,)) is None  # not a type it hashes: the probe says maybe


@pytest.mark.parametrize("kinds", COMBOS, ids=["+".join(c) for c in COMBOS])
def test_the_column_road_and_the_python_road_write_the_same_summary(kinds: list[str]) -> None:
    rng = random.Random(str(kinds))
    data = _table(kinds, 2000, rng)
    pk = data.column_names
    big = keytables.summarize(data, pk)  # past _VECTOR_ROWS: Arrow kernels
    assert big["hash"] == keytables.HASH_MIX64 and keytables.summary_problem(big) is None
    small = [keytables.summarize(data.slice(i, 400), pk) for i in range(0, 2000, 400)]  # Python
    whole = keytables._summarize_columns(data.slice(0, 400), pk, keytables.BITS_PER_KEY, keytables.MAX_FILTER_BITS)
    assert {k: v for k, v in small[0].items() if k != "exact"} == keytables.bound_summary(whole)
    for key in zip(*(data.column(c).to_pylist() for c in pk)):
        assert keytables.may_hold(big, key) and keytables.may_hold_any(big, {key: keytables.key_hash(key)})
    absent = [k for k in zip(*(_table(kinds, 500, random.Random(9)).column(c).to_pylist() for c in pk))]
    absent = [k for k in absent if k not in set(zip(*(data.column(c).to_pylist() for c in pk)))]
    assert sum(keytables.may_hold(big, k) for k in absent) <= 0.02 * len(absent) + 2


def test_old_summaries_stay_blake2b_and_are_probed_with_it() -> None:
    data = pa.table({"k": pa.array(range(0, 3000, 3), pa.int64())})
    old = keytables.summarize(data, ["k"], scheme=keytables.HASH_BLAKE2B)
    new = keytables.summarize(data, ["k"])
    assert "hash" not in old and keytables.scheme_of(old) == keytables.HASH_BLAKE2B
    assert new["hash"] == keytables.HASH_MIX64 and old["bloom"] != new["bloom"]
    for s in (old, new):
        assert all(keytables.may_hold(s, (k,)) for k in range(0, 3000, 3))
        assert sum(keytables.may_hold(s, (k,)) for k in range(1, 3000, 3)) < 20
        # The callers hash with blake2b once per key; a mix64 part is probed with its own hash.
        hashed = {(k,): keytables.key_hash((k,)) for k in (1, 4, 7)}
        assert not keytables.may_hold_any(s, hashed)
        assert keytables.may_hold_any(s, {**hashed, (9,): keytables.key_hash((9,))})
    assert keytables.summary_problem({**new, "hash": "md5"}) is not None
    assert keytables.summary_problem({k: v for k, v in new.items() if k != "filter"}) is not None
    assert keytables.summary_problem({**new, "filter": {**new["filter"], "bloom": "AAAA"}}) is not None
    # Code from before the schemes ignores "hash" and "filter" and probes "m", "k", "bloom" with
    # blake2b: all ones there, so it never rules out a key a new part holds (a mixed cluster).
    legacy = {k: v for k, v in new.items() if k not in ("hash", "filter")}
    assert keytables.summary_problem(legacy) is None
    assert all(keytables.may_hold(legacy, (k,), keytables.key_hash((k,))) for k in range(0, 3000, 3))
    with pytest.raises(ValueError):
        keytables.summarize(data, ["k"], scheme="md5")
    # A key column mix64 does not hash (a float) keeps blake2b.
    floats = pa.table({"f": pa.array([0.5, 1.5], pa.float64())})
    assert "hash" not in keytables.summarize(floats, ["f"])


def test_a_saturated_filter_is_all_ones() -> None:
    data = pa.table({"k": pa.array(range(20_000), pa.int64())})
    s = keytables.summarize(data, ["k"], max_bits=4096)
    assert keytables._filter_of(s)[0] == 4096 and keytables._filter_of(s)[2] == b"\xff" * 512
    assert s["lo"] == [0] and s["hi"] == [19_999] and not keytables.may_hold(s, (20_000,))


def test_a_filter_of_a_thousand_keys_lets_few_absent_keys_through() -> None:
    """A point read reads every part whose filter says maybe: at 16 bits a key (0.046% false
    positives) a table in 1,000 parts of 1,000 keys read half a part too many per lookup; at
    24 (0.0017%) one in sixty lookups reads one. 100,000 absent keys inside the part's range,
    fixed: ~46 through at 16 bits, ~2 at 24."""
    rng = random.Random(7)
    held = rng.sample(range(10**9), 1000)
    s = keytables.summarize(pa.table({"k": pa.array(held, pa.int64())}), ["k"])
    assert keytables._filter_of(s)[0] == 1000 * keytables.BITS_PER_KEY
    absent = set(rng.sample(range(min(held), max(held)), 100_000 + 1000)) - set(held)
    through = sum(keytables.may_hold(s, (k,)) for k in sorted(absent)[:100_000])
    assert through <= 10
    assert all(keytables.may_hold(s, (k,)) for k in held)


# ---------------------------------------------------------------------------------------------
# Sorted parts, row groups read by their statistics

SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.string())])


def _versions(keys: list[int], op: int = keytables.PUT, seq: int = 1) -> pa.Table:
    data = pa.table({"k": pa.array(keys, pa.int64()), "v": [f"v{k}" for k in keys]})
    return keytables.versions(SCHEMA, ("k",), "t", data, op, seq)


@pytest.fixture
def groups_read(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The row groups each point read decodes (both a ranged read and a whole-file one pick
    them with ``groups_holding``)."""
    seen: list[list[int]] = []
    real = part_format.groups_holding

    def counting(*a, **kw):
        got = real(*a, **kw)
        seen.append(got)
        return got

    monkeypatch.setattr(part_format, "groups_holding", counting)
    return seen


def test_a_point_read_decodes_only_the_row_groups_that_can_hold_the_key(tmp_path, groups_read) -> None:
    storage = Storage(str(tmp_path))
    rng = random.Random(1)
    keys = rng.sample(range(1_000_000), 50_000)
    meta = part_format.write_part(storage, "t", [], (), _versions(keys), "tx1", primary_key=("k",))
    whole = part_format.read_part(storage, meta)
    assert whole.column("k").to_pylist() == sorted(keys)  # written sorted by key
    groups = pq.ParquetFile(str(tmp_path / meta.path)).metadata.num_row_groups
    assert groups == -(-50_000 // part_format.KEYS_ROW_GROUP_ROWS) == 7
    for key in [*rng.sample(keys, 20), -1, 2_000_000]:
        got = part_format.read_part(storage, meta, keys=(["k"], [(key,)]))
        assert got.equals(whole.filter(pc.field("k") == key)), key
        assert len(groups_read[-1]) <= 1  # of 7
    two = sorted(keys)[:: len(keys) - 1]  # the least and the greatest: the first and last group
    got = part_format.read_part(storage, meta, keys=(["k"], [(k,) for k in two]))
    assert groups_read[-1] == [0, groups - 1] and got.column("k").to_pylist() == two


def test_an_old_unsorted_part_still_reads_correctly(tmp_path, groups_read) -> None:
    # Written the old way: rows in write order, one row group, a blake2b summary.
    storage = Storage(str(tmp_path))
    rng = random.Random(2)
    keys = rng.sample(range(100_000), 20_000)
    data = _versions(keys)
    sink = pa.BufferOutputStream()
    pq.write_table(data, sink, compression="zstd", write_statistics=True)
    raw = sink.getvalue().to_pybytes()
    meta = PartMeta(
        name="old",
        table="t",
        partition=(),
        path="t/old.parquet",
        rows=data.num_rows,
        size=len(raw),
        checksum=part_format.checksum_of(raw),
        stats=part_format.column_stats(data),
        creation_tid="tx0",
        created_at=0.0,
        key_summary=keytables.summarize(data, ["k"], scheme=keytables.HASH_BLAKE2B),
    )
    storage.put(meta.path, raw)
    meta = PartMeta.from_dict(meta.to_dict())
    assert "hash" not in meta.key_summary
    for key in rng.sample(keys, 10):
        assert keytables.may_hold(meta.key_summary, (key,))
        got = part_format.read_part(storage, meta, keys=(["k"], [(key,)]))
        assert got.equals(data.filter(pc.field("k") == key)) and groups_read[-1] == [0]
    got = part_format.read_part(storage, meta, keys=(["k"], [(-5,)]))
    assert got.num_rows == 0 and groups_read[-1] == []  # outside its range: nothing decoded
    # Folded with a new sorted part, old and new give what the fold of whole parts gives.
    new = part_format.write_part(storage, "t", [], (), _versions(keys[:500], seq=9), "tx1", primary_key=("k",))
    both = [(1, part_format.read_part(storage, meta)), (2, part_format.read_part(storage, new))]
    key = keys[7]
    point = [(o, part_format.read_part(storage, m, keys=(["k"], [(key,)]))) for o, m in ((1, meta), (2, new))]
    want = keyfold.merge(SCHEMA, ("k",), both).filter(pc.field("k") == key)
    assert keyfold.merge(SCHEMA, ("k",), point).equals(want) and want.num_rows == 1


class _CountingStorage(Storage):
    """Real local storage that records what is fetched (whole files, ranges)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.whole: list[str] = []
        self.ranges: list[tuple[int, int]] = []

    def get(self, relpath: str) -> bytes:
        self.whole.append(relpath)
        return super().get(relpath)

    def get_ranges(self, relpath: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        self.ranges.extend(ranges)
        return super().get_ranges(relpath, ranges)


def test_a_point_read_fetches_only_the_footer_and_the_row_groups_it_decodes(tmp_path, groups_read) -> None:
    storage = _CountingStorage(str(tmp_path))
    rng = random.Random(4)
    keys = rng.sample(range(1_000_000), 60_000)
    meta = part_format.write_part(storage, "t", [], (), _versions(keys), "tx1", primary_key=("k",))
    meta = PartMeta.from_dict(meta.to_dict())  # as a commit carries it
    ranges = meta.key_summary["ranges"]
    assert len(ranges["groups"]) == pq.ParquetFile(str(tmp_path / meta.path)).metadata.num_row_groups == 8
    whole = part_format.read_part(storage, meta)
    decoded: set[int] = set()
    for i, key in enumerate([*rng.sample(keys, 10), -1]):
        storage.whole.clear()
        storage.ranges.clear()
        got = part_format.read_part(storage, meta, keys=(["k"], [(key,)]))
        assert got.equals(whole.filter(pc.field("k") == key)), key
        assert storage.whole == []  # never the whole file
        fetched = sum(n for _, n in storage.ranges)
        # The footer once and each group once: parts never change, a decoded group is kept.
        group = [ranges["groups"][g][1] for g in groups_read[-1] if g not in decoded]
        decoded.update(groups_read[-1])
        tail = ranges["tail"][0] if i == 0 else 0
        assert fetched == sum(group) + tail and fetched < meta.size / 4, (key, fetched, meta.size)
    assert 0 < len(decoded) < 8


def _flip(path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))


def _tampered(meta: PartMeta, **ranges) -> PartMeta:
    return PartMeta.from_dict({**meta.to_dict(), "key_summary": {**meta.key_summary, "ranges": ranges}})


# What happens to the file or its recorded ranges -> a point read of a key in row group 1 raises CorruptPart.
RANGED_DAMAGE = {
    "a byte of the footer": lambda m, p: (_flip(p, m.size - 30), m)[1],
    "a byte of the row group read": lambda m, p: (_flip(p, m.key_summary["ranges"]["groups"][1][0] + 50), m)[1],
    "the file truncated": lambda m, p: (p.write_bytes(p.read_bytes()[:-100]), m)[1],
    "the file missing": lambda m, p: (p.unlink(), m)[1],
    "another part's bytes": lambda m, p: (p.write_bytes(p.with_name("other.parquet").read_bytes()), m)[1],
    "a recorded group crc changed": lambda m, p: _tampered(
        m,
        tail=m.key_summary["ranges"]["tail"],
        groups=[[a, n, (c + 1) if i == 1 else c] for i, (a, n, c) in enumerate(m.key_summary["ranges"]["groups"])],
    ),
    "a recorded group range elsewhere": lambda m, p: _tampered(
        m,
        tail=m.key_summary["ranges"]["tail"],
        groups=[[a + 7, n, c] for a, n, c in m.key_summary["ranges"]["groups"]],
    ),
    "a tail longer than the file": lambda m, p: _tampered(
        m, tail=[m.size + 1, m.key_summary["ranges"]["tail"][1]], groups=m.key_summary["ranges"]["groups"]
    ),
    "fewer groups recorded than the file has": lambda m, p: _tampered(
        m, tail=m.key_summary["ranges"]["tail"], groups=m.key_summary["ranges"]["groups"][:-1]
    ),
}


@pytest.mark.parametrize("damage", list(RANGED_DAMAGE))
def test_a_ranged_point_read_refuses_bytes_not_as_written(tmp_path, damage: str) -> None:
    storage = Storage(str(tmp_path))
    keys = list(range(0, 60_000, 2))
    meta = part_format.write_part(storage, "t", [], (), _versions(keys), f"tx_{len(damage)}", primary_key=("k",))
    other = part_format.write_part(storage, "t", [], (), _versions([k + 1 for k in keys]), "tx_o", primary_key=("k",))
    path = tmp_path / meta.path
    (tmp_path / other.path).rename(path.with_name("other.parquet"))
    key = keys[part_format.KEYS_ROW_GROUP_ROWS + 3]  # in row group 1
    meta = RANGED_DAMAGE[damage](meta, path)
    with pytest.raises(CorruptPart):
        part_format.read_part(storage, meta, keys=(["k"], [(key,)]))


# The same damage to a part of one row group (a lookup's usual part: a commit's), read with no
# footer cached: its tail and group come in one request (format._read_one_group).
ONE_GROUP_DAMAGE = {
    **{k: f for k, f in RANGED_DAMAGE.items() if "group" not in k},
    "a byte of the row group read": lambda m, p: (_flip(p, m.key_summary["ranges"]["groups"][0][0] + 50), m)[1],
    "a recorded group crc changed": lambda m, p: _tampered(
        m, tail=m.key_summary["ranges"]["tail"], groups=[[a, n, c + 1] for a, n, c in m.key_summary["ranges"]["groups"]]
    ),
    "a recorded group range elsewhere": lambda m, p: _tampered(
        m, tail=m.key_summary["ranges"]["tail"], groups=[[a + 7, n, c] for a, n, c in m.key_summary["ranges"]["groups"]]
    ),
    "a recorded group past the end": lambda m, p: _tampered(
        m,
        tail=m.key_summary["ranges"]["tail"],
        groups=[[a, n + m.size, c] for a, n, c in m.key_summary["ranges"]["groups"]],
    ),
    "a recorded group shorter than its pages": lambda m, p: _tampered(
        m, tail=m.key_summary["ranges"]["tail"], groups=[[a, n - 1, c] for a, n, c in m.key_summary["ranges"]["groups"]]
    ),
    "no group recorded": lambda m, p: _tampered(m, tail=m.key_summary["ranges"]["tail"], groups=[]),
}


@pytest.mark.parametrize("damage", list(ONE_GROUP_DAMAGE))
def test_a_ranged_point_read_of_one_group_refuses_bytes_not_as_written(tmp_path, damage: str) -> None:
    storage = Storage(str(tmp_path))
    keys = list(range(0, 2000, 2))
    meta = part_format.write_part(storage, "t", [], (), _versions(keys), f"tx1_{len(damage)}", primary_key=("k",))
    other = part_format.write_part(storage, "t", [], (), _versions([k + 1 for k in keys]), "tx1_o", primary_key=("k",))
    assert len(meta.key_summary["ranges"]["groups"]) == 1
    path = tmp_path / meta.path
    (tmp_path / other.path).rename(path.with_name("other.parquet"))
    meta = ONE_GROUP_DAMAGE[damage](meta, path)
    with pytest.raises(CorruptPart):
        part_format.read_part(storage, meta, keys=(["k"], [(keys[3],)]))


def test_a_point_read_of_one_group_fetches_tail_and_group_at_once_then_nothing(tmp_path) -> None:
    # Then the footer and the decoded group are kept (format._FOOTERS, format._GROUPS).
    storage = _CountingStorage(str(tmp_path))
    keys = random.Random(5).sample(range(100_000), 1000)
    meta = PartMeta.from_dict(
        part_format.write_part(storage, "t", [], (), _versions(keys), "tx_one", primary_key=("k",)).to_dict()
    )
    (group,) = meta.key_summary["ranges"]["groups"]
    whole = part_format.read_part(storage, meta)
    for i, key in enumerate([keys[0], keys[500], -1, keys[999]]):
        storage.ranges.clear()
        got = part_format.read_part(storage, meta, keys=(["k"], [(key,)]))
        assert got.equals(whole.filter(pc.field("k") == key)) and got.num_rows == (key != -1)
        tail = [(meta.size - meta.key_summary["ranges"]["tail"][0], meta.key_summary["ranges"]["tail"][0])]
        assert storage.ranges == ([*tail, (group[0], group[1])] if i == 0 else [])


@pytest.mark.parametrize(
    "ranges",
    [
        "x",
        {"tail": [11, 5], "groups": []},
        {"tail": [100], "groups": []},
        {"tail": [100, -1], "groups": []},
        {"tail": [100, True], "groups": []},
        {"tail": [100, 5]},
        {"tail": [100, 5], "groups": [[1, 2]]},
        {"tail": [100, 5], "groups": [[1, 2, "3"]]},
        {"tail": [100, 5], "groups": [[1, 2, 3]] * (keytables.MAX_RANGE_GROUPS + 1)},
    ],
)
def test_hostile_ranges_in_a_summary_are_corrupt_metadata(ranges) -> None:
    summary = {**keytables.summarize(_versions([1, 2, 3]), ["k"]), "ranges": ranges}
    assert keytables.summary_problem(summary) is not None
    d = {
        "name": "p",
        "table": "t",
        "partition": [],
        "path": "t/_/p.parquet",
        "rows": 3,
        "size": 200,
        "checksum": "crc32:00000000",
        "stats": {},
        "creation_tid": "tx",
        "created_at": 0.0,
        "key_summary": summary,
    }
    with pytest.raises(CorruptMetadata):
        PartMeta.from_dict(d)


def test_the_fold_of_sorted_parts_equals_the_fold_in_write_order() -> None:
    # Each part sorted by key is not in (version, _seq) order as a whole; the fold still orders
    # each key's versions by version then _seq.
    rng = random.Random(3)
    parts = []
    for order in range(1, 8):
        keys = [rng.randrange(50) for _ in range(40)]  # repeats: later _seq wins within a part
        ops = [rng.choice([keytables.PUT, keytables.DELETE]) for _ in keys]
        pieces = [_versions([k], op, seq=i + 1) for i, (k, op) in enumerate(zip(keys, ops))]
        parts.append((order, pa.concat_tables(pieces)))
    in_order = keyfold.merge(SCHEMA, ("k",), parts)
    by_key = [(o, part_format._sorted_by_key(t, ("k",))) for o, t in parts]
    assert keyfold.merge(SCHEMA, ("k",), by_key).equals(in_order)
    shuffled = [(o, t.take(pa.array(rng.sample(range(t.num_rows), t.num_rows)))) for o, t in parts]
    assert keyfold.merge(SCHEMA, ("k",), shuffled).equals(in_order)


# ---------------------------------------------------------------------------------------------
# Merges of a keys table's big parts by size tier (the versions a read folds stay bounded)

S = 100  # merge_small_bytes


@pytest.mark.parametrize(
    ("sizes", "min_parts", "max_parts", "want"),
    [
        ([], 4, 64, []),
        ([10, 20, 30, 40, 50], 4, 64, []),  # small parts: the minor merge's
        ([100, 150, 399], 4, 64, []),  # three in tier 0 (100..399): fewer than 4
        ([100, 150, 399, 250], 4, 64, [0, 1, 2, 3]),
        ([100, 10, 150, 400, 399, 250], 4, 64, [0, 2, 4, 5]),  # 400 is tier 1; small left alone
        ([100, 150, 399, 250, 300], 4, 2, [0, 1]),  # at most max_parts, the oldest
        ([100, 150, 399, 250, 300], 4, 1, [0, 1]),  # a merge takes two at least
        ([400, 1599, 800, 1000, 150], 4, 64, [0, 1, 2, 3]),  # tier 1 full, tier 0 not
        ([1600, 6399, 3000, 100, 399, 250, 120, 6000], 4, 64, [3, 4, 5, 6]),  # the lowest full tier first
        ([1600, 6399, 3000, 6000], 4, 64, [0, 1, 2, 3]),
        ([100, 150, 399, 250], 4, 64, [0, 1, 2, 3]),
        ([100, 199, 150], 2, 64, [0, 1, 2]),  # tiers of x2: 100..199
        ([100, 200], 2, 64, []),  # 200 is tier 1
    ],
)
def test_tiered_merge(sizes: list[int], min_parts: int, max_parts: int, want: list[int]) -> None:
    assert mergeplan.tiered_merge(sizes, S, min_parts, max_parts) == want


def test_tiered_merges_keep_the_parts_a_read_folds_logarithmic() -> None:
    # Endless 10-byte upserts with minor merges of 4 small parts, then tiers: parts stay few.
    parts: list[int] = []
    most = 0
    for _ in range(5000):
        parts.append(10)
        while True:
            pick = mergeplan.small_merge(parts, S, 4, 64) or mergeplan.tiered_merge(parts, S, 4, 64)
            if not pick:
                break
            merged = sum(parts[i] for i in pick)
            parts = [s for i, s in enumerate(parts) if i not in set(pick)] + [merged]
        most = max(most, len(parts))
    assert sum(parts) == 50_000 and most <= 3 + 3 * 5  # 3 small + 3 per tier up to 100 * 4**4


def _meta(name: str, summary: dict | None) -> PartMeta:
    return PartMeta(
        name=name,
        table="t",
        partition=(),
        path=f"t/_/{name}.parquet",
        rows=1,
        size=200,
        checksum=f"crc32:{name}",
        stats={},
        creation_tid="tx",
        created_at=0.0,
        key_summary=summary,
    )


@pytest.mark.parametrize("kinds", COMBOS, ids=["+".join(c) for c in COMBOS])
def test_summary_probes_keep_exactly_the_parts_may_hold_any_keeps(kinds: list[str]) -> None:
    # The replica's cached probe of every visible part against may_hold_any, the reference: parts
    # of both schemes, ranges, saturated and legacy all-ones filters, none at all; each probe
    # twice (parsed, then from the cache).
    rng = random.Random(f"probes-{kinds}")
    data = _table(kinds, 3000, rng)
    pk = data.column_names
    metas = []
    for i in range(40):
        piece = data.slice(rng.randrange(2900), rng.choice([1, 20, 100]))
        if rng.random() < 0.5:  # as a part's versions: one of at most EXACT_ROWS lists them
            piece = _as_puts(piece)
        scheme = rng.choice([keytables.HASH_MIX64, keytables.HASH_BLAKE2B])
        metas.append(_meta(f"p{i}", keytables.summarize(piece, pk, scheme=scheme)))
    metas += [_meta("none", None), _meta("slim", keytables.point_summary(metas[0].key_summary))]
    keys = list(zip(*(data.column(c).to_pylist() for c in pk)))
    probes = keytables.SummaryProbes(size=16)  # smaller than the parts: entries age out and come back
    for _ in range(2):
        for n in (1, 1, 1, 3):
            wanted = rng.sample(keys, n) + [k for k in _table(kinds, 2, rng).to_pylist() for k in [tuple(k.values())]]
            hashed = {k: keytables.key_hash(k) for k in wanted}
            want = [m for m in metas if keytables.may_hold_any(m.key_summary, hashed)]
            assert probes.may_hold(metas, hashed) == want
    assert len(probes) == 16
    # A name seen before with another checksum (another part's file) is parsed again, not reused.
    full = _meta("p0", keytables.summarize(data.slice(0, 500), pk))
    other = dataclasses.replace(full, checksum="crc32:other", key_summary=keytables.summarize(data.slice(500, 5), pk))
    for wanted in keys[:520]:
        hashed = {wanted: keytables.key_hash(wanted)}
        for meta in (full, other, full):
            assert probes.may_hold([meta], hashed) == [
                m for m in [meta] if keytables.may_hold_any(m.key_summary, hashed)
            ]


def _as_puts(keys: pa.Table) -> pa.Table:
    """Key columns as a keys table's part holds them: each row a PUT (a summary of at most
    EXACT_ROWS such rows lists them)."""
    n = keys.num_rows
    ops = pa.array([keytables.PUT] * n, pa.int8())
    return keys.append_column(keytables.OP, ops).append_column(keytables.COLS, pa.nulls(n, pa.string()))


def _filter_only(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "exact"}


def test_a_part_that_lists_its_versions_is_probed_by_them() -> None:
    """A small part's summary lists its versions (``exact``, checked against its file when it
    was staged): a probe keeps the part for exactly the keys it holds. Its 256-bit filter alone
    says "maybe" for about 0.1 % of the keys it does not hold; such keys are found and probed,
    by may_hold_any, by a laid-out set of parts and by a set with the part not laid out yet."""
    held = random.Random(3).sample(range(10**6), 10)
    summary = keytables.summarize(_as_puts(pa.table({"k": pa.array(held, pa.int64())})), ["k"])
    assert summary["filter"]["m"] == keytables.MIN_FILTER_BITS and len(summary["exact"]) == 10
    absent = [k for k in range(min(held), max(held), 37) if k not in held]  # inside its key range
    hashed = {(k,): keytables.key_hash((k,)) for k in absent}
    false = [k for k in hashed if keytables.may_hold_any(_filter_only(summary), {k: hashed[k]})]
    assert 2 <= len(false) <= len(absent) // 100  # the filter's false positives among the absent keys
    part = _meta("small", summary)
    big = [
        _meta(f"big{i}", keytables.summarize(pa.table({"k": pa.array(range(i, 3000, 7), pa.int64())}), ["k"]))
        for i in range(7)
    ]
    probes = keytables.SummaryProbes()
    for k in false:
        assert not keytables.may_hold_any(summary, {k: hashed[k]}), k
        assert probes.may_hold([part, *big], {k: hashed[k]}) == []  # laid out
    probes.may_hold(big, {false[0]: hashed[false[0]]})  # a layout of the others: the part is fresh beside it
    assert probes.may_hold([*big, part], {false[0]: hashed[false[0]]}) == []
    for key in held:
        want = {(key,): keytables.key_hash((key,))}
        assert keytables.may_hold_any(summary, want)
        assert probes.may_hold([part, *big], want) == [part]
        assert probes.may_hold([*big, part], {**want, false[1]: hashed[false[1]]}) == [part]
    # A summary whose versions are not of one width (a malformed one) is probed by its filter.
    odd = {**summary, "exact": [*summary["exact"][:9], [*summary["exact"][9], 0]]}
    assert keytables.exact_keys(odd) is None
    assert keytables.may_hold_any(odd, {false[0]: hashed[false[0]]})


def test_parsed_summaries_are_bounded_by_their_listed_keys_too() -> None:
    """The parsed summaries a replica keeps count a small part's listed keys with its filter
    bits against their byte bound (a 10-key part's 32 bytes of filter would let 300 such
    entries under 10 kB, each holding 10 keys): old entries go first, answers stay right."""
    rng = random.Random(9)
    metas = [
        _meta(
            f"p{i}",
            keytables.summarize(_as_puts(pa.table({"k": pa.array(rng.sample(range(10**6), 10), pa.int64())})), ["k"]),
        )
        for i in range(300)
    ]
    probes = keytables.SummaryProbes(max_bytes=10_000)
    for meta in metas[::7]:  # the whole set laid out (each summary parsed), probed for a key of one
        key = (meta.key_summary["exact"][0][0],)
        assert probes.may_hold(metas, {key: keytables.key_hash(key)}) == [meta]
    assert len(probes) <= 10_000 // (10 * 100)


def test_summary_probes_of_many_parts_keep_exactly_what_may_hold_any_keeps() -> None:
    # Enough parts that a key's first bits leave many rows, then few (rows_with slices a bit
    # across every filter, then tests the last bits in the rows left): present and absent keys.
    rng = random.Random(11)
    metas, held = [], []
    for i in range(300):
        keys = rng.sample(range(10**6), 50)
        held += keys[:2]
        metas.append(_meta(f"p{i}", keytables.summarize(pa.table({"k": pa.array(keys, pa.int64())}), ["k"])))
    probes = keytables.SummaryProbes()
    for key in held[:150] + [rng.randrange(10**6) for _ in range(150)]:
        hashed = {(key,): keytables.key_hash((key,))}
        assert probes.may_hold(metas, hashed) == [m for m in metas if keytables.may_hold_any(m.key_summary, hashed)]


_VALUES = st.one_of(
    st.integers(-5, 5),
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.sampled_from(["", "a", "b", "é"]),
    st.sampled_from([b"", b"a"]),
    st.sampled_from([0.5, -0.0, float("nan")]),
)


@st.composite
def _odd_summary(draw: st.DrawFn) -> dict | None:
    """A key summary as a replica may hold one: either scheme, a filter of any valid shape (one
    byte up, 1 to 64 hashes, bits at random, all ones, all zeros), a key range of any types (or
    none), or no summary at all."""
    if draw(st.integers(0, 9)) == 0:
        return None
    m = 8 * draw(st.sampled_from([1, 2, 3, 32, 200]))
    fill = draw(st.sampled_from(["random", "ones", "zeros", "dense"]))
    rng = random.Random(draw(st.integers(0, 2**32)))
    raw = {
        "random": rng.randbytes(m // 8),
        "ones": b"\xff" * (m // 8),
        "zeros": bytes(m // 8),
        "dense": bytes(rng.choice([0xFF, 0xFE, 0x7F, 0xBF]) for _ in range(m // 8)),
    }[fill]
    f = {"m": m, "k": draw(st.sampled_from([1, 2, 11, 64])), "bloom": base64.b64encode(raw).decode("ascii")}
    width = draw(st.integers(1, 2))
    lo = hi = None
    if draw(st.booleans()):
        lo, hi = sorted([draw(st.lists(_VALUES, min_size=width, max_size=width)) for _ in range(2)], key=repr)
    if draw(st.booleans()):
        return {"lo": lo, "hi": hi, **f}
    legacy = {"m": 8, "k": 1, "bloom": base64.b64encode(b"\xff").decode("ascii")}
    return {"lo": lo, "hi": hi, **legacy, "hash": keytables.HASH_MIX64, "filter": f}


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    st.lists(_odd_summary(), min_size=0, max_size=30),
    st.lists(st.lists(_VALUES, min_size=1, max_size=2).map(tuple), min_size=1, max_size=4, unique_by=repr),
    st.randoms(use_true_random=False),
)
def test_the_laid_out_probe_keeps_exactly_what_may_hold_any_keeps(summaries, keys, rng) -> None:
    """SummaryProbes (the filters of a visible set side by side, probed a shape at a time) keeps
    exactly the parts may_hold_any keeps, in their order, on summaries of every odd shape and
    keys of every type (some the mix64 scheme does not hash, some that do not compare with a
    range): on the set, on the set seen again, on a part of it and on it reordered, with a
    few parts not laid out and with many; with a
    cache smaller than the parts and than the sets; and a name seen again with another
    checksum is parsed again."""
    metas = [_meta(f"p{i}", s) for i, s in enumerate(summaries)]
    probes = keytables.SummaryProbes(size=7, layouts=2)
    hashed = {k: keytables.key_hash(k) for k in keys}
    shuffled = metas[:]
    rng.shuffle(shuffled)
    # parts not laid out beside laid-out ones (a commit since): a few, then more than a few
    few = [_meta(f"q{i}", s) for i, s in enumerate(summaries[:3])]
    many = [_meta(f"r{i}", s) for i, s in enumerate(summaries * 2)]
    for seen in (metas, metas, metas[: len(metas) // 2], shuffled, metas, metas[1:] + few, few + metas + many, metas):
        want = [m for m in seen if keytables.may_hold_any(m.key_summary, hashed)]
        assert probes.may_hold(seen, hashed) == want
    if metas:
        other = dataclasses.replace(metas[0], checksum="crc32:other", key_summary=summaries[-1])
        want = [m for m in [other] if keytables.may_hold_any(m.key_summary, hashed)]
        assert probes.may_hold([other], hashed) == want


def test_summary_probes_say_maybe_for_a_key_mix64_does_not_hash() -> None:
    mixed = keytables.summarize(pa.table({"k": pa.array(range(100), pa.int64())}), ["k"])
    meta = _meta("p", mixed)
    hashed = {(1.5,): keytables.key_hash((1.5,))}
    assert (
        keytables.SummaryProbes().may_hold([meta], hashed)
        == [meta]
        == [m for m in [meta] if keytables.may_hold_any(m.key_summary, hashed)]
    )


def test_a_point_summary_keeps_the_range_and_ranges_and_prunes_nothing() -> None:
    data = _versions(list(range(0, 3000, 3)))
    full = {**keytables.summarize(data, ["k"]), "ranges": {"tail": [100, 5], "groups": [[4, 50, 7]]}}
    slim = keytables.point_summary(full)
    assert keytables.summary_problem(slim) is None
    assert slim["lo"] == full["lo"] and slim["hi"] == full["hi"] and slim["ranges"] == full["ranges"]
    assert "filter" not in slim and "exact" not in slim and len(str(slim)) < 200 < len(str(full))
    assert all(keytables.may_hold(slim, (k,)) for k in range(0, 2998))  # no filter: maybe
    assert not keytables.may_hold(slim, (5000,))  # the key range still prunes
    assert keytables.point_summary(None) is None
    assert "ranges" not in keytables.point_summary({k: v for k, v in full.items() if k != "ranges"})


def test_ranges_of_many_groups_check_as_one_group_does() -> None:
    good = {"tail": [100, 5], "groups": [[i * 10, 10, i] for i in range(200)]}
    assert keytables.ranges_problem(good) is None
    for bad in ([1, 2, -1], [1, 2, True], [1, 2, 2**70], (1, 2, 3), [1, 2], [1, 2, 3, 4], [1, 2, 3.0]):
        groups = [*good["groups"][:100], bad, *good["groups"][100:]]
        assert keytables.ranges_problem({"tail": [100, 5], "groups": groups}) is not None, bad


@pytest.mark.parametrize(
    "where",
    [
        pc.field("k") == 5,
        (pc.field("k") == 1) | (pc.field("k") == 2),
        (pc.field("k") == 1) & (pc.field("v") == "x"),  # not exact: parsed by point_hint itself
        pc.field("v") == "x",
    ],
)
def test_a_point_hint_from_the_exact_keys_is_the_hint_parsed_again(where) -> None:
    exact = keytables.point_keys(where, SCHEMA, ["k"], exact=True)
    assert keytables.point_hint(where, SCHEMA, ["k"], found=exact) == keytables.point_hint(where, SCHEMA, ["k"])


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.one_of(st.integers(), st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, True, 5.0, "5", None])))
def test_a_hint_of_one_int64_key_is_cast_as_any_other(v) -> None:
    """hint_hashes takes an int64 key's int without a cast (its short road): exactly the keys the
    cast gives, and None for a value the column cannot hold exactly (an int past 64 bits too,
    which made the replica's handler fail before)."""
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False)])
    got = keytables.hint_hashes({"key_columns": ["k"], "keys": [[v]]}, schema, ("k",))
    try:
        cast = pa.scalar(v).cast(pa.int64(), safe=True).as_py()
        exact = cast == v and type(cast) is type(v)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        exact = False
    assert got == ({(v,): keytables.key_hash((v,))} if exact else None)


def test_a_key_equal_to_one_of_another_type_is_hashed_for_its_own_type() -> None:
    """(0.0, 1.0) == (0, 1) == (False, True): the mix64 hash cache keeps them apart, so a float
    key's None (a type the scheme does not hash) is never the int key's answer, and a summary of
    int keys built after it works (it raised "has a value the mix64 scheme does not hash")."""
    assert keytables.key_hash_mix64((0.0, 1.0)) is None
    hashed = keytables.key_hash_mix64((0, 1))
    assert hashed is not None
    assert keytables.key_hash_mix64((False, True)) == hashed  # bools hash as the ints they are
    assert keytables.key_hash_mix64((0, 1)) == hashed


class _Named:
    """A part as :func:`keytables.align` sees one: a name, equal only to itself."""

    def __init__(self, name: str) -> None:
        self.name = name


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(
    st.lists(st.integers(0, 400), max_size=300, unique=True),
    st.lists(st.tuples(st.sampled_from(["keep", "drop", "replace"]), st.integers(0, 3)), max_size=300),
    st.lists(st.integers(0, 400), max_size=20),
    st.booleans(),
)
def test_align_places_every_part_of_the_new_list_or_names_it_fresh(
    names: list[int], fates: list[tuple[str, int]], added: list[int], shuffle: bool
) -> None:
    # A laid-out list and the one a later lookup lists: parts kept (the same objects), dropped,
    # replaced by another object of the same name, added; in name order, or not at all. Every
    # part of the new list is either in a run across from the very object it is, or fresh; a
    # part of the old one maps to where it is in the new one, or nowhere.
    old = [_Named(f"{n:04d}") for n in sorted(names)]
    new: list[_Named] = []
    for i, part in enumerate(old):
        fate = fates[i][0] if i < len(fates) else "keep"
        if fate != "drop":
            new.append(part if fate == "keep" else _Named(part.name))
    new += [_Named(f"{n:04d}x") for n in added]
    new.sort(key=lambda p: p.name)
    if shuffle:
        random.Random(len(new)).shuffle(new)
    got = keytables.align(old, new, limit=len(new) + len(old))
    assert got is not None
    placed = {}
    for at, to, n in got.runs:
        for k in range(n):
            assert new[to + k] is old[at + k]
            placed[to + k] = at + k
    assert sorted([*placed, *got.fresh]) == list(range(len(new)))  # each once
    where = {id(p): i for i, p in enumerate(new)}
    for i, part in enumerate(old):
        want = placed.get(where[id(part)]) == i if id(part) in where else False
        assert (got.new_position(i) == where[id(part)]) if want else got.new_position(i) is None
    if not shuffle:  # in name order: only what changed is fresh
        assert len(got.fresh) == sum(1 for p in new if all(p is not q for q in old))
    changed = sum(1 for p in new if all(p is not q for q in old))
    assert keytables.align(old, new, limit=max(0, changed - 1)) is None or changed == 0 or shuffle


def test_summary_probes_of_a_grown_list_keep_what_may_hold_any_keeps() -> None:
    # Lookups of a visible set that changes between them (parts added, removed, replaced by
    # merges): each probe aligns the list with a layout before it, or lays it out again; the
    # answer is always the reference's.
    rng = random.Random(5)
    pool = [rng.sample(range(10**6), rng.choice([10, 10, 10, 500])) for _ in range(400)]
    metas = [
        _meta(f"p{i:04d}", keytables.summarize(_as_puts(pa.table({"k": pa.array(keys, pa.int64())})), ["k"]))
        for i, keys in enumerate(pool)
    ]
    probes = keytables.SummaryProbes()
    live = sorted(metas[:200], key=lambda m: m.name)
    for step in range(120):
        add = metas[200 + step : 201 + step + (step % 3 == 0) * 40]  # now and then many at once
        gone = set(rng.sample(range(len(live)), min(len(live), rng.choice([0, 0, 1, 30]))))
        live = sorted([m for i, m in enumerate(live) if i not in gone] + add, key=lambda m: m.name)
        keys = [(rng.choice(rng.choice(pool)),) for _ in range(rng.choice([1, 10]))]
        hashed = {k: keytables.key_hash(k) for k in keys}
        extra = [metas[rng.randrange(400)] for _ in range(rng.choice([0, 2]))]  # a transaction's own
        want = [m for m in live + extra if keytables.may_hold_any(m.key_summary, hashed)]
        assert probes.may_hold(live + extra, hashed) == want, step


def test_summary_probes_of_a_set_growing_each_lookup_lay_out_few_parts_per_lookup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Update-mode writes with no merge between: each point read lists the parts of the one
    # before and the part its commit added. The parts committed since the set was laid out go
    # through layouts of their own (kept), so the set is not laid out again every few dozen
    # lookups: measured 90 parts laid out per lookup when they were laid out apart at every
    # lookup and the set again once they were an eighth of it over the keys, 18 now.
    rng = random.Random(11)
    metas = [
        _meta(f"p{i:05d}", keytables.summarize(_as_puts(pa.table({"k": pa.array(keys, pa.int64())})), ["k"]))
        for i, keys in enumerate(rng.sample(range(10**6), 10) for _ in range(2_300))
    ]
    laid = []
    build = keytables._Layout.build.__func__  # type: ignore[attr-defined]

    def counted(cls: type, parts: list, items: dict, parse: object) -> object:
        laid.append(len(parts))
        return build(cls, parts, items, parse)

    monkeypatch.setattr(keytables._Layout, "build", classmethod(counted))
    probes = keytables.SummaryProbes()
    live = metas[:2_000]
    for step in range(300):
        live = [*live, metas[2_000 + step]]
        hashed = {k: keytables.key_hash(k) for k in [(rng.randrange(10**6),) for _ in range(9)] + [(step,)]}
        want = [m for m in live if keytables.may_hold_any(m.key_summary, hashed)]
        assert probes.may_hold(live, hashed) == want, step
    per_lookup = (sum(laid) - 2_001) / 300  # the first lookup lays out the set once
    assert per_lookup < 30, f"{per_lookup:.1f} parts laid out per lookup"


def test_summary_probes_of_many_tables_probed_in_turn_keep_each_tables_layouts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Point reads of five tables in turn, each set growing a part per lookup: each table's
    # layouts are found whatever their place among the kept ones (with only the last four
    # tried, every lookup laid its table's whole set out again: 400 parts per lookup here).
    rng = random.Random(12)

    def table_parts(table: str) -> list[PartMeta]:
        return [
            dataclasses.replace(
                _meta(
                    f"{table}{i:05d}", keytables.summarize(_as_puts(pa.table({"k": pa.array(keys, pa.int64())})), ["k"])
                ),
                table=table,
            )
            for i, keys in enumerate(rng.sample(range(10**6), 10) for _ in range(500))
        ]

    tables = {t: table_parts(t) for t in "abcde"}
    laid = []
    build = keytables._Layout.build.__func__  # type: ignore[attr-defined]

    def counted(cls: type, parts: list, items: dict, parse: object) -> object:
        laid.append(len(parts))
        return build(cls, parts, items, parse)

    monkeypatch.setattr(keytables._Layout, "build", classmethod(counted))
    probes = keytables.SummaryProbes()
    for step in range(80):
        for parts in tables.values():
            live = parts[: 400 + step]
            hashed = {k: keytables.key_hash(k) for k in [(rng.randrange(10**6),) for _ in range(9)] + [(step,)]}
            want = [m for m in live if keytables.may_hold_any(m.key_summary, hashed)]
            assert probes.may_hold(live, hashed) == want, step
    per_lookup = (sum(laid) - 5 * 400) / (5 * 80)  # each table's set laid out once first
    assert per_lookup < 60, f"{per_lookup:.1f} parts laid out per lookup"


_KEY_VALUES = {
    "int": st.integers(-(2**63), 2**63 - 1),
    "str": st.text(alphabet=st.sampled_from("ab\u00e9\u4e2d\U0001f600z"), max_size=300),  # long ones are bounded
}


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    kinds=st.lists(st.sampled_from(sorted(_KEY_VALUES)), min_size=1, max_size=2),
    data=st.data(),
)
def test_parts_apart_in_key_order_give_their_rows_in_key_order(kinds: list[str], data: st.DataObject) -> None:
    """``apart_in_key_order``: parts (each sorted by key, as the keys writer writes them) put in
    the order it gives read, one after another, in Arrow's key order; a set of distinct keys cut
    into contiguous runs is always ordered (shuffled), and overlapping runs never."""
    pk = [f"k{i}" for i in range(len(kinds))]
    schema = pa.schema([pa.field(c, pa.int64() if kind == "int" else pa.string(), False) for c, kind in zip(pk, kinds)])
    keys = data.draw(st.lists(st.tuples(*(_KEY_VALUES[k] for k in kinds)), min_size=1, max_size=40, unique=True))
    table = pa.table({c: [k[i] for k in keys] for i, c in enumerate(pk)}, schema=schema)
    table = table.take(pc.sort_indices(table, sort_keys=[(c, "ascending") for c in pk]))
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, table.num_rows - 1)), max_size=5)) | {0, table.num_rows})
    runs = [table.slice(a, b - a) for a, b in zip(cuts, cuts[1:]) if b > a]
    overlap = data.draw(st.booleans()) and len(runs) > 1
    if overlap:  # the last run also takes the first run's first key
        runs[-1] = pa.concat_tables([runs[0].slice(0, 1), runs[-1]])
    shuffled = data.draw(st.permutations(runs))
    summaries = [{**keytables.summarize(r, pk), "ranges": {"groups": []}} for r in shuffled]
    order = keytables.apart_in_key_order(summaries, schema, pk)
    if overlap:
        assert order is None
        return
    assert order is not None
    assert pa.concat_tables([shuffled[i] for i in order]).equals(table)
    del summaries[-1]["ranges"]
    assert keytables.apart_in_key_order(summaries, schema, pk) is None  # written before parts were sorted


def test_parts_apart_in_key_order_only_for_keys_json_orders_as_arrow_does() -> None:
    one = pa.table({"k": pa.array([1.5], pa.float64())})
    s = {**keytables.summarize(one, ["k"]), "ranges": {"groups": []}}
    assert keytables.apart_in_key_order([s], one.schema, ["k"]) is None
    ints = pa.table({"k": [3, 4]})
    s = {**keytables.summarize(ints, ["k"]), "ranges": {"groups": []}}
    assert keytables.apart_in_key_order([s, s], ints.schema, ["k"]) is None  # the same range twice meets
    assert keytables.apart_in_key_order([], ints.schema, ["k"]) == []


def test_a_decoded_row_group_is_kept_by_its_columns_and_only_checked_bytes_are_decoded(tmp_path) -> None:
    """Point reads keep the row groups they decode (``format._GROUPS``, by part, checksum, group
    and columns): a group read before answers again as decoded, also once its bytes in storage
    rot; a group not read before is fetched and checked against its crc32 first (CorruptPart),
    and another choice of columns is a group of its own; the kept groups are bounded by their
    decoded bytes, the least recently used going first."""
    storage = Storage(str(tmp_path))
    keys = list(range(0, 120_000, 2))
    meta = PartMeta.from_dict(
        part_format.write_part(storage, "t", [], (), _versions(keys), "tx_kept", primary_key=("k",)).to_dict()
    )
    whole = part_format.read_part(storage, meta)
    in_group = [keys[g * part_format.KEYS_ROW_GROUP_ROWS + 5] for g in range(3)]
    for key in in_group[:2]:
        got = part_format.read_part(storage, meta, columns=["k", "v"], keys=(["k"], [(key,)]))
        assert got.equals(whole.select(["k", "v"]).filter(pc.field("k") == key))
    for g in (1, 2):  # rot a byte of groups 1 and 2
        _flip(tmp_path / meta.path, meta.key_summary["ranges"]["groups"][g][0] + 50)
    key = in_group[1]
    got = part_format.read_part(storage, meta, columns=["k", "v"], keys=(["k"], [(key,)]))
    assert got.equals(whole.select(["k", "v"]).filter(pc.field("k") == key))  # kept: decoded from checked bytes
    with pytest.raises(CorruptPart, match="row group 2 is not as written"):
        part_format.read_part(storage, meta, columns=["k", "v"], keys=(["k"], [(in_group[2],)]))
    with pytest.raises(CorruptPart, match="row group 1 is not as written"):  # other columns: not kept
        part_format.read_part(storage, meta, keys=(["k"], [(key,)]))
    with pytest.raises(CorruptPart):  # a failed group is not kept either
        part_format.read_part(storage, meta, columns=["k", "v"], keys=(["k"], [(in_group[2],)]))
    kept = part_format._Cache(3000)  # what _GROUPS is, smaller: ten groups of 500 bytes
    for i in range(10):
        kept.put(i, i, 500)
    assert len(kept) == 6 and kept.get(3) is None and kept.get(4) == 4 and kept.get(9) == 9
