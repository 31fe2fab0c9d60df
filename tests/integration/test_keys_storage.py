"""Storage of keys-table versions that stays fast: the per-part key summary
(key range and Bloom filter, coordinator/core/keytables.py "key summaries"), the state's index of parts by
creation CSN per target, the key conflict check that skips parts unread, and point reads that
read only the parts that may hold the key. Pure parts first, then against a cluster.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
import string
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from support.builders import change, entry, tid
from support.cluster import make_cluster

import mergetxn.client.keyreads as client_module  # where the client reads keys tables' parts (read_part)
from coordinator.core import keytables
from coordinator.core.conflicts import Kind, Policy
from coordinator.core.tabledata import partition_key
from coordinator.errors import ConflictError, CorruptMetadata, InvalidInput
from coordinator.model.catalog import TableDef
from mergetxn.client import Client
from mergetxn.local.zkserver import ZooKeeperServer
from parts.io import format as part_format
from parts.io import keyscan
from parts.io.format import write_part
from parts.io.storage import Storage
from parts.model.meta import PartMeta
from replicas import checkpoint
from replicas.keylocks import KeyConflicts
from replicas.state import ReplicaState

SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("a", pa.string()), pa.field("b", pa.int64())])


# ---------------------------------------------------------------------------------------------
# Pure: the filter and the summary


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_letters + "éß€😀 ,;\x00") for _ in range(rng.randint(0, 12)))


KEY_KINDS = {
    "int": (pa.schema([pa.field("k", pa.int64(), False)]), lambda r: (r.randint(-(2**63), 2**63 - 1),)),
    "small_int": (pa.schema([pa.field("k", pa.int32(), False)]), lambda r: (r.randint(-1000, 1000),)),
    "string": (pa.schema([pa.field("k", pa.string(), False)]), lambda r: (_word(r),)),
    "str_int": (
        pa.schema([pa.field("s", pa.string(), False), pa.field("i", pa.int64(), False)]),
        lambda r: (_word(r), r.randint(-50, 50)),
    ),
    "bool_int": (
        pa.schema([pa.field("b", pa.bool_(), False), pa.field("i", pa.int16(), False)]),
        lambda r: (r.random() < 0.5, r.randint(-300, 300)),
    ),
    "float": (
        pa.schema([pa.field("f", pa.float64(), False)]),
        lambda r: (r.choice([0.0, -0.0, r.uniform(-1e9, 1e9)]),),
    ),
    "date_bytes": (
        pa.schema([pa.field("d", pa.date32(), False), pa.field("y", pa.binary(), False)]),
        lambda r: (dt.date(2000, 1, 1) + dt.timedelta(days=r.randint(0, 9000)), r.randbytes(r.randint(0, 6))),
    ),
}


@pytest.mark.parametrize("kind", sorted(KEY_KINDS))
@pytest.mark.parametrize("seed", range(5))
def test_filter_never_says_absent_for_a_key_the_part_holds(kind: str, seed: int) -> None:
    schema, gen = KEY_KINDS[kind]
    rng = random.Random(f"{kind}-{seed}")
    held = [gen(rng) for _ in range(rng.choice([1, 7, 300, 2000]))]
    data = pa.Table.from_pylist([dict(zip(schema.names, k)) for k in held], schema=schema)
    summary = keytables.summarize(data, schema.names)
    assert keytables.summary_problem(summary) is None
    # Every key the part holds, as the data reads back (to_pylist), is a maybe.
    for key in zip(*(data.column(n).to_pylist() for n in schema.names)):
        assert keytables.may_hold(summary, key)
        assert keytables.may_hold(summary, key, keytables.key_hash(key))
        assert keytables.may_hold_any(summary, {key: keytables.key_hash(key)})
    # And the filter does rule out most keys it does not hold (about 0.002% false positives),
    # one key at a time or many at once alike.
    absent = {gen(rng) for _ in range(2000)} - set(held)
    maybe = [k for k in absent if keytables.may_hold(summary, k)]
    assert len(maybe) <= 0.01 * len(absent) + 2
    assert [k for k in absent if keytables.may_hold_any(summary, {k: keytables.key_hash(k)})] == maybe


def test_the_hash_is_fixed_and_not_pythons() -> None:
    # Pinned values: another process (any PYTHONHASHSEED) and a later version probe the same bits.
    assert keytables.encode_key((5, "x")) == b"i\x00\x00\x00\x015s\x00\x00\x00\x01x"
    assert keytables.key_hash((5,)) == keytables.key_hash([5])
    assert keytables.key_hash((0.0,)) == keytables.key_hash((-0.0,))  # Arrow compares them equal
    assert keytables.key_hash((1,)) != keytables.key_hash((True,)) and keytables.key_hash(("1",)) != keytables.key_hash(
        (1,)
    )
    h1, h2 = keytables.key_hash((5,))
    assert h2 % 2 == 1 and 0 <= h1 < 2**64
    data = pa.table({"k": pa.array([1, 2, 3], pa.int64())})
    assert keytables.summarize(data, ["k"]) == keytables.summarize(data, ["k"])
    assert keytables.summarize(data, ["k"])["lo"] == [1] and keytables.summarize(data, ["k"])["hi"] == [3]


def test_the_range_rules_out_without_the_filter() -> None:
    data = pa.table({"k": pa.array(range(100, 200), pa.int64())})
    full = {**keytables.summarize(data, ["k"]), "bloom": keytables.base64.b64encode(b"\xff" * 8).decode(), "m": 64}
    assert (
        keytables.may_hold(full, (150,))
        and not keytables.may_hold(full, (99,))
        and not keytables.may_hold(full, (200,))
    )


def test_filter_size_is_bounded() -> None:
    data = pa.table({"k": pa.array(range(10_000), pa.int64())})
    s = keytables.summarize(data, ["k"], max_bits=4096)
    m, _, bits = keytables._filter_of(s)  # the filter of the summary's hash scheme
    assert m == 4096 and len(bits) == 512
    assert all(keytables.may_hold(s, (k,)) for k in range(10_000))
    assert (
        keytables._filter_of(keytables.summarize(data.slice(0, 0), ["k"]))[0] == keytables.MIN_FILTER_BITS
    )  # an empty part still has a (tiny) filter


# ---------------------------------------------------------------------------------------------
# Pure: which keys a filter fixes

PK2 = pa.schema([pa.field("p", pa.string(), False), pa.field("k", pa.int32(), False), pa.field("v", pa.int64())])
K, P, V = pc.field("k"), pc.field("p"), pc.field("v")

POINTS = [
    (SCHEMA, ("k",), K == 5, [(5,)]),
    (SCHEMA, ("k",), (K == 5) & (pc.field("a") == "x"), [(5,)]),
    (SCHEMA, ("k",), (K == 5) | (K == 2), [(2,), (5,)]),
    (SCHEMA, ("k",), (K == 5) & (K == 6), []),  # matches nothing: no part is needed
    (SCHEMA, ("k",), K > 5, None),
    (SCHEMA, ("k",), (K == 5) | (pc.field("b") == 1), None),
    (SCHEMA, ("k",), K == 5.5, None),  # not a value of the column: no pruning, the filter decides
    (SCHEMA, ("k",), pc.field("b") == 5, None),
    (PK2, ("p", "k"), (P == "x") & (K == 3), [("x", 3)]),
    (PK2, ("p", "k"), K == 3, None),  # one key column free
    (PK2, ("p", "k"), ((P == "x") | (P == "y")) & (K == 1) & (V > 0), [("x", 1), ("y", 1)]),
    (SCHEMA, ("k",), K.isin([5, 2, 5]), [(2,), (5,)]),  # a value set: read from its typed values
    (SCHEMA, ("k",), K.isin(list(range(40))), [(i,) for i in range(40)]),  # past the 20 its text shows
    (SCHEMA, ("k",), K.isin([]), []),
    (SCHEMA, ("k",), K.isin([1, None]), None),
    (SCHEMA, ("k",), pc.field("b").isin([1, 2]), None),
    (PK2, ("p", "k"), K.isin([1, 2]), None),
    (
        pa.schema([pa.field("s", pa.string(), False)]),
        ("s",),
        pc.field("s").isin(['a") or (s == "b', "c"]),
        [('a") or (s == "b',), ("c",)],
    ),
]


@pytest.mark.parametrize(("schema", "pk", "where", "want"), POINTS, ids=[str(w) for _, _, w, _ in POINTS])
def test_point_keys(schema: pa.Schema, pk: tuple, where: pc.Expression, want: list | None) -> None:
    assert keytables.point_keys(where, schema, pk) == want


# ---------------------------------------------------------------------------------------------
# Pure: metadata, the log entry and the checkpoint carry the summary


def summarized_part(storage: Storage, table: str, rows: list[int], creator: str, partition: tuple = ()) -> PartMeta:
    data = keytables.versions(SCHEMA, ("k",), table, pa.table({"k": pa.array(rows, pa.int64())}), keytables.PUT, 1)
    return write_part(storage, table, ["k"] if partition else [], partition, data, creator, primary_key=("k",))


def test_summary_round_trips_and_is_validated(tmp_path) -> None:
    meta = summarized_part(Storage(str(tmp_path)), "t", [3, 1, 2], tid(1))
    assert meta.key_summary is not None and meta.key_summary["lo"] == [1] and meta.key_summary["hi"] == [3]
    assert PartMeta.from_dict(meta.to_dict()) == meta
    old = {k: v for k, v in meta.to_dict().items() if k != "key_summary"}  # written before summaries
    assert PartMeta.from_dict(old).key_summary is None
    assert keytables.may_hold(None, (99,))  # a part without one is never pruned
    for bad, says in [
        ({**meta.key_summary, "m": 12}, "'m'"),
        ({**meta.key_summary, "bloom": "!!"}, "base64"),
        ({**meta.key_summary, "bloom": "AAAA"}, "bits"),
        ({**meta.key_summary, "lo": None}, "both"),
        ({**meta.key_summary, "exact": [[1, 9, None]]}, "exact"),
        ("x", "object"),
    ]:
        with pytest.raises(CorruptMetadata, match=says):
            PartMeta.from_dict({**meta.to_dict(), "key_summary": bad})


def _state_with(parts: list[tuple[int, PartMeta]]) -> ReplicaState:
    st = ReplicaState()
    for i, (csn, meta) in enumerate(parts):
        st.apply(csn, 0, i, entry((meta.creation_tid, [change(meta.table, meta.partition, (Kind.INSERT,), [meta])])))
    return st


def test_summary_and_index_survive_a_checkpoint(tmp_path) -> None:
    storage = Storage(str(tmp_path))
    metas = [summarized_part(storage, "t", [i, i + 10], tid(i)) for i in range(1, 6)]
    st = _state_with([(10 * i, m) for i, m in enumerate(metas, 1)])
    back = ReplicaState()
    back.restore(checkpoint.decode(checkpoint.encode(st.export()), "test"), "test")
    assert [m for _, m in back.created_since("t", "[]", 0)] == metas
    assert back.created_since("t", "[]", 25) == st.created_since("t", "[]", 25)
    assert [c for c, _ in back.created_since("t", "[]", 25)] == [30, 40, 50]
    # A checkpoint written before summaries existed (no such column) restores with none.
    payload = st.export()
    payload["parts"]["fields"].remove("key_summary")
    del payload["parts"]["key_summary"]
    old = ReplicaState()
    old.restore(payload, "old")
    assert [m.key_summary for _, m in old.created_since("t", "[]", 0)] == [None] * 5


def test_created_since_index_matches_a_scan_and_prunes(tmp_path) -> None:
    storage = Storage(str(tmp_path))
    rng = random.Random(1)
    parts = []
    for csn in range(1, 60):
        table = rng.choice(["t", "u"])
        parts.append((csn, summarized_part(storage, table, [csn], tid(csn), partition=(rng.randint(0, 2),))))
    st = _state_with(parts)
    for snapshot in (0, 17, 58, 59):
        for table in ("t", "u"):
            for p in range(3):
                pkey = partition_key((p,))
                scan = sorted(
                    (r.creation_csn, r.meta.name)
                    for r in st.parts.values()
                    if r.creation_csn > snapshot and r.meta.table == table and r.pkey == pkey
                )
                assert [(c, m.name) for c, m in st.created_since(table, pkey, snapshot)] == scan
    st.prune(30)
    assert all(c > 30 for added in st.created.values() for c, _ in added)


# ---------------------------------------------------------------------------------------------
# The key conflict check, in process against real part files


def _checker(storage: Storage, st: ReplicaState) -> KeyConflicts:
    tdef = TableDef.new("t", SCHEMA, primary_key=("k",), conflict_policy="keys")
    return KeyConflicts(st, storage, lambda name: tdef)


def test_conflict_check_reads_only_candidate_parts(tmp_path) -> None:
    storage = Storage(str(tmp_path))
    rng = random.Random(7)
    # Parts too big to list their versions in the summary: the filter decides, candidates are read.
    theirs = [summarized_part(storage, "t", rng.sample(range(100_000), 100), tid(i, host="r1")) for i in range(40)]
    assert all("exact" not in m.key_summary for m in theirs)
    st = _state_with([(i + 2, m) for i, m in enumerate(theirs)])
    taken: set[tuple] = set()
    for m in theirs:
        taken.update(keytables.written_locks(_read(storage, m), ("k",), ()).keys())
    free = [k for k in range(100_000) if (k,) not in taken][:200]
    mine = summarized_part(storage, "t", free, tid(99))  # 200 keys: read too
    check = _checker(storage, st)
    check.check(tid(99), 1, {mine.name: mine}, {"t": Policy.KEYS})  # no conflict: different keys
    hashed = {(k,): keytables.key_hash((k,)) for k in free}
    candidates = sum(keytables.may_hold_any(m.key_summary, hashed) for m in theirs)
    assert check.reads == 1 + candidates and check.skipped == 40 - candidates
    assert candidates < 10  # the filters ruled out most of the 40 (about 0.002% per key and part)
    # A key one of them wrote is a candidate there, read, verified, and conflicts.
    clash = summarized_part(storage, "t", [free[0], sorted(taken)[5][0]], tid(98))
    with pytest.raises(ConflictError, match="lost to") as e:
        (c2 := _checker(storage, st)).check(tid(98), 1, {clash.name: clash}, {"t": Policy.KEYS})
    assert e.value.details["key"] == [sorted(taken)[5][0]] and c2.reads >= 1
    # At a snapshot past every one of them there is nothing to look at (a small part of its
    # own is known from its summary: no read at all).
    late = _checker(storage, st)
    late.check(tid(98), 100, {clash.name: clash}, {"t": Policy.KEYS})
    assert late.reads == 0 and late.skipped == 0


def test_small_commits_are_checked_from_their_summaries_alone(tmp_path) -> None:
    storage = Storage(str(tmp_path))
    rng = random.Random(5)
    theirs = [summarized_part(storage, "t", rng.sample(range(1000), 10), tid(i, host="r1")) for i in range(30)]
    st = _state_with([(i + 2, m) for i, m in enumerate(theirs)])
    written = {k for m in theirs for k, *_ in m.key_summary["exact"]}
    mine = summarized_part(storage, "t", [k for k in range(1000) if k not in written][:10], tid(99))
    check = _checker(storage, st)
    check.check(tid(99), 1, {mine.name: mine}, {"t": Policy.KEYS})
    assert check.reads == 0
    clash = summarized_part(storage, "t", [min(written)], tid(98))
    with pytest.raises(ConflictError):
        _checker(storage, st).check(tid(98), 1, {clash.name: clash}, {"t": Policy.KEYS})


def test_exact_versions_give_the_locks_the_file_gives(tmp_path) -> None:
    storage = Storage(str(tmp_path))
    groups = (("g1", ("a",)), ("g2", ("b",)))
    rng = random.Random(11)
    for _ in range(20):
        parts = []
        for seq, op in enumerate(
            rng.sample(
                [keytables.PUT, keytables.UPDATE, keytables.DELETE, keytables.LOCK_STRONG, keytables.LOCK_WEAK], 3
            )
        ):
            ks = pa.array(rng.sample(range(30), 5), pa.int64())
            cols = {
                "k": ks,
                **({"a": pa.array(["x"] * 5)} if rng.random() < 0.5 else {}),
                **({"b": pa.array([1] * 5, pa.int64())} if rng.random() < 0.5 or op == keytables.UPDATE else {}),
            }
            parts.append(keytables.versions(SCHEMA, ("k",), "t", pa.table(cols), op, seq * 10 + 1))
        data = pa.concat_tables(parts)
        meta = write_part(storage, "t", [], (), data, tid(1), primary_key=("k",))
        assert keytables.exact_locks(meta.key_summary, 1, groups) == keytables.written_locks(
            _read(storage, meta), ("k",), groups
        )
    big = write_part(
        storage,
        "t",
        [],
        (),
        keytables.versions(SCHEMA, ("k",), "t", pa.table({"k": pa.array(range(65), pa.int64())}), keytables.PUT, 1),
        tid(1),
        primary_key=("k",),
    )
    assert keytables.exact_locks(big.key_summary, 1, groups) is None  # past EXACT_ROWS: read it


def _read(storage: Storage, meta: PartMeta) -> pa.Table:
    from parts.io.format import read_part

    return read_part(storage, meta)


def test_a_filter_false_positive_never_makes_a_conflict(tmp_path) -> None:
    storage = Storage(str(tmp_path))
    winner = summarized_part(storage, "t", [1, 2, 3], tid(1, host="r1"))
    # Every bit set, no range: the filter says "maybe" for every key (a forced false positive).
    saturated = dataclasses.replace(
        winner,
        key_summary={
            "lo": None,
            "hi": None,
            "m": 64,
            "k": keytables.HASHES,
            "bloom": keytables.base64.b64encode(b"\xff" * 8).decode(),
        },
    )
    assert keytables.may_hold(saturated.key_summary, (4,))
    st = _state_with([(5, saturated)])
    mine = summarized_part(storage, "t", [4, 5], tid(2))
    check = _checker(storage, st)
    check.check(tid(2), 1, {mine.name: mine}, {"t": Policy.KEYS})  # read and verified: no conflict
    assert check.reads == 1 and check.skipped == 0


# ---------------------------------------------------------------------------------------------
# The indexed check (coordinator/core/keyindex.py) decides exactly as the per-part check

GROUPS = {"g1": ["a"], "g2": ["b"]}
KEYS_DEF = TableDef.new("t", SCHEMA, primary_key=("k",), conflict_policy="keys", lock_groups=GROUPS)
_OPS = [keytables.PUT, keytables.UPDATE, keytables.DELETE, keytables.LOCK_STRONG, keytables.LOCK_WEAK]
_version = st.tuples(
    st.sampled_from(_OPS),
    st.sampled_from([(), ("a",), ("b",), ("a", "b")]),
    st.lists(st.integers(0, 11), min_size=1, max_size=4, unique=True),
)
# A part: small (lists its versions), big (past EXACT_ROWS: probed and read) or a compaction's output.
_part = st.tuples(
    st.sampled_from(["small", "small", "small", "big", "folded"]), st.lists(_version, min_size=1, max_size=3)
)
# No shrinking: every example writes part files, and shrinking one took minutes; a failure
# prints its (unshrunk) history.
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)
_history = st.lists(st.lists(_part, min_size=1, max_size=2), min_size=1, max_size=10)


def _written(storage: Storage, kind: str, versions: list, creator: str) -> PartMeta:
    tables = []
    if kind == "big":  # keys no transaction here writes, past the listed size
        pad = pa.table({"k": pa.array(range(1000, 1000 + keytables.EXACT_ROWS), pa.int64())})
        tables.append(keytables.versions(SCHEMA, ("k",), "t", pad, keytables.PUT, 0))
    for seq, (op, cols, ks) in enumerate(versions, 1):
        data: dict = {"k": pa.array(ks, pa.int64())}
        if op in (keytables.PUT, keytables.UPDATE):
            if "a" in cols or op == keytables.UPDATE and not cols:
                data["a"] = pa.array(["x"] * len(ks))
            if "b" in cols:
                data["b"] = pa.array([1] * len(ks), pa.int64())
        tables.append(keytables.versions(SCHEMA, ("k",), "t", pa.table(data), op, seq))
    meta = write_part(
        storage, "t", [], (), pa.concat_tables(tables, promote_options="default"), creator, primary_key=("k",)
    )
    if kind == "folded":  # marked as a compaction's output (its stats name _ver): writes no key
        meta = dataclasses.replace(meta, stats={**meta.stats, keytables.VER: (0, 0)})
    return meta


def _decision(st_: ReplicaState, storage: Storage, mine: PartMeta, snapshot: int) -> tuple[object, int]:
    check = KeyConflicts(st_, storage, lambda name: KEYS_DEF)
    try:
        check.check(tid(999), snapshot, {mine.name: mine}, {"t": Policy.KEYS})
    except ConflictError as e:
        return (str(e), e.details), check.looked_up
    return None, check.looked_up


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture], phases=NO_SHRINK)
@given(history=_history, mine=st.lists(_version, min_size=1, max_size=3), data=st.data())
def test_indexed_check_decides_as_the_per_part_check(tmp_path, history: list, mine: list, data: st.DataObject) -> None:
    storage = Storage(str(tmp_path / "s"))
    indexed, per_part = ReplicaState(), ReplicaState()
    indexed.apply(1, 0, 0, entry(ddl=[KEYS_DEF]))  # a keys table: its parts are indexed by key
    n = 0
    for csn, commit in enumerate(history, 2):
        txns = []
        for kind, versions in commit:
            n += 1
            meta = _written(storage, kind, versions, tid(n, host="r1"))
            txns.append((meta.creation_tid, [change("t", (), (Kind.INSERT,), [meta])]))
        for s_ in (indexed, per_part):  # per_part knows no table: it probes every part since the snapshot
            s_.apply(csn, 0, csn, entry(*txns))
    last = len(history) + 1
    my_part = _written(storage, "small" if data.draw(st.booleans()) else "big", mine, tid(999))
    for snapshot in sorted(set(data.draw(st.lists(st.integers(1, last), min_size=1, max_size=3)))):
        got, looked_up = _decision(indexed, storage, my_part, snapshot)
        assert (got, looked_up) == (_decision(per_part, storage, my_part, snapshot)[0], 1)
    # Pruned below a snapshot, and rebuilt from a checkpoint: the same decisions.
    floor = data.draw(st.integers(1, last))
    for s_ in (indexed, per_part):
        s_.prune(floor)
    # (A restored state orders the parts of one CSN by name, not as they were applied: compared
    # with the per-part check of a restored state, as the winner named may differ.)
    back, per_part_back = ReplicaState(), ReplicaState()
    back.restore(checkpoint.decode(checkpoint.encode(indexed.export()), "test"), "test")
    per_part_back.restore(checkpoint.decode(checkpoint.encode(per_part.export()), "test"), "test")
    for snapshot in range(floor, last + 1):
        assert _decision(indexed, storage, my_part, snapshot)[0] == _decision(per_part, storage, my_part, snapshot)[0]
        want = _decision(per_part_back, storage, my_part, snapshot)
        assert want[1] == 0 and _decision(back, storage, my_part, snapshot)[0] == want[0]


def test_the_index_is_pruned_with_the_history_and_rebuilt_on_restore(tmp_path) -> None:
    storage = Storage(str(tmp_path))
    st_ = ReplicaState()
    st_.apply(1, 0, 0, entry(ddl=[KEYS_DEF]))
    for csn in range(2, 12):
        meta = summarized_part(storage, "t", [csn, csn + 100], tid(csn, host="r1"))
        st_.apply(csn, 0, csn, entry((meta.creation_tid, [change("t", (), (Kind.INSERT,), [meta])])))
    assert len(st_.key_index[("t", "[]")]) == 20
    assert [(c, m.name, listed) for c, m, listed in st_.key_writers("t", "[]", 4, [(5,), (9,), (50,)], 1)] == [
        (c, m.name, True) for c, m in st_.created_since("t", "[]", 4) if c in (5, 9)
    ]
    back = ReplicaState()
    back.restore(checkpoint.decode(checkpoint.encode(st_.export()), "test"), "test")
    assert back.key_writers("t", "[]", 0, [(5,)], 1) == st_.key_writers("t", "[]", 0, [(5,)], 1)
    st_.prune(6)
    assert len(st_.key_index[("t", "[]")]) == 10 and st_.key_writers("t", "[]", 0, [(5,)], 1) == []
    st_.prune(11)
    assert ("t", "[]") not in st_.key_index and st_.key_writers("t", "[]", 0, [(5,)], 1) is None
    # A table that is no keys table is not indexed: its check (if any) probes part by part.
    assert ReplicaState().key_writers("t", "[]", 0, [(5,)], 1) is None


# ---------------------------------------------------------------------------------------------
# Point reads against a cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator:
    with make_cluster(tmp_path_factory, zk_server, "keys-storage", replicas=1) as c:
        yield c


@pytest.fixture
def client(cluster) -> Iterator[Client]:
    c = cluster.client(0)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Paths of the parts the client reads (a point read of a keys table goes through
    read_part, a whole read through keyscan.read_versions, or by deletion vectors through
    Client._columns_of)."""
    seen: list[str] = []
    real, real_versions, real_columns = client_module.read_part, keyscan.read_versions, Client._columns_of

    def columns_of(self, tdef, metas, *a, **kw):
        seen.extend(m.path for m in metas)
        return real_columns(self, tdef, metas, *a, **kw)

    def read_part(storage, meta, *a, **kw):
        seen.append(meta.path)
        return real(storage, meta, *a, **kw)

    def read_versions(storage, meta, *a, **kw):
        seen.append(meta.path)
        return real_versions(storage, meta, *a, **kw)

    monkeypatch.setattr(client_module, "read_part", read_part)
    monkeypatch.setattr(keyscan, "read_versions", read_versions)
    monkeypatch.setattr(Client, "_columns_of", columns_of)
    return seen


def test_point_reads_read_only_parts_that_may_hold_the_key_and_equal_the_fold(client: Client, counted) -> None:
    name = "ks_point"  # no background merges: the count of parts read is the point
    client.create_table(name, SCHEMA, primary_key=("k",), conflict_policy="keys", auto_merge=False)
    rng = random.Random(3)
    for i in range(30):  # 30 parts: puts, updates and deletes of keys in 0..99
        with client.transaction() as tx:
            ks = rng.sample(range(100), 5)
            if i % 3 == 2:
                tx.upsert(
                    name, pa.table({"k": pa.array(ks, pa.int64()), "b": pa.array([i] * 5, pa.int64())}), update=True
                )
            else:
                tx.insert(name, pa.table({"k": pa.array(ks, pa.int64()), "a": [f"v{i}"] * 5}))
            if i % 4 == 3:
                tx.delete_keys(name, pa.table({"k": pa.array(rng.sample(range(100), 2), pa.int64())}))
    counted.clear()
    everything = client.read(name)
    assert len(set(counted)) >= 30
    for key in [*range(100), 1000, -1]:
        counted.clear()
        got = client.read(name, where=K == key)
        assert got.equals(everything.filter(K == key)), key
        assert len(counted) < 12, (key, len(counted))  # of 30+: the ones that may hold it
    counted.clear()
    both = client.read(name, where=(K == 3) | (K == 4))
    assert both.equals(everything.filter((K == 3) | (K == 4))) and len(counted) < 20
    for values in ([3, 4], [5, 1000], [], list(range(0, 100, 4))):  # a value set is a point read too
        counted.clear()
        got = client.read(name, where=K.isin(values))
        assert got.equals(everything.filter(K.isin(values))), values
        assert len(counted) < (12 if len(values) < 3 else 30), (values, len(counted))
    # In a transaction, with its own writes (its own part carries a summary too).
    with client.transaction() as tx:
        tx.upsert(name, pa.table({"k": pa.array([7], pa.int64()), "b": pa.array([-7], pa.int64())}), update=True)
        counted.clear()
        mine = tx.read(name, where=K == 7)
        assert len(counted) < 12
        counted.clear()
        assert tx.read(name, where=K.isin([7])).equals(mine) and len(counted) < 12
        assert mine.equals(tx.read(name).filter(K == 7)) and mine.column("b").to_pylist() == [-7]
        metas, _ = tx._visible_csns(name)
        assert metas and all(m.key_summary is not None for m in metas)
    # Not a point filter: every part is read.
    everything = client.read(name)
    counted.clear()
    assert client.read(name, where=K < 50).equals(everything.filter(K < 50))
    assert len(counted) >= 30


def test_members_with_different_keys_share_a_batch_and_a_key_in_common_waits(tmp_path) -> None:
    from coordinator.core.conflicts import Summary

    storage = Storage(str(tmp_path))
    check = _checker(storage, ReplicaState())
    a, b, c = (summarized_part(storage, "t", ks, tid(i)) for i, ks in ((1, [1, 2]), (2, [3, 4]), (3, [4, 5])))
    for i, m in ((1, a), (2, b), (3, c)):
        check.check(tid(i), 0, {m.name: m}, {"t": Policy.KEYS})
    policies = {"t": Policy.KEYS}
    target = ("t", "[]")

    def member(i: int) -> dict:
        return {target: Summary(tid(i), frozenset({Kind.INSERT}))}

    in_batch = {target: [member(1)[target]]}
    assert not check.shares_target(policies, member(2), in_batch)  # keys 3, 4 beside 1, 2
    in_batch[target].append(member(2)[target])
    assert check.shares_target(policies, member(3), in_batch)  # key 4 in common with member 2
    assert check.shares_target(policies, member(9), in_batch)  # keys unknown: wait
    assert not check.shares_target({"t": Policy.PARTS}, member(3), in_batch)


def test_point_hint_is_exact_or_ignored() -> None:
    hint = keytables.point_hint(K == 5, SCHEMA, ("k",))
    assert hint == {"key_columns": ["k"], "keys": [[5]]}
    assert keytables.hint_hashes(hint, SCHEMA, ("k",)) == {(5,): keytables.key_hash((5,))}
    # Made from a definition the reader had cached that is not the table's at the snapshot: ignored.
    as_string = pa.schema([pa.field("k", pa.string(), False)])
    assert keytables.hint_hashes(hint, as_string, ("k",)) is None
    assert keytables.hint_hashes(hint, PK2, ("p", "k")) is None
    assert keytables.hint_hashes({"key_columns": ["k"], "keys": [[5.5]]}, SCHEMA, ("k",)) is None
    assert (
        keytables.hint_hashes(
            {"key_columns": ["k"], "keys": [[2**40]]}, pa.schema([pa.field("k", pa.int32(), False)]), ("k",)
        )
        is None
    )
    with pytest.raises(InvalidInput, match="point hint"):
        keytables.hint_hashes({"keys": 5}, SCHEMA, ("k",))
    assert keytables.point_hint(K > 5, SCHEMA, ("k",)) is None


def test_the_replica_lists_only_parts_that_may_hold_a_hinted_key(client: Client) -> None:
    name = "ks_hint"
    client.create_table(name, SCHEMA, primary_key=("k",), conflict_policy="keys", auto_merge=False)
    for i in range(20):
        with client.transaction() as tx:
            tx.insert(name, pa.table({"k": pa.array(range(i * 10, i * 10 + 10), pa.int64())}))
    every = client.call("visible", table=name, lease="none")["parts"]
    hinted = client.call("visible", table=name, lease="none", point_hint={"key_columns": ["k"], "keys": [[42]]})
    assert len(every) == 20 and len(hinted["parts"]) == 1 and set(hinted["csns"]) == {hinted["parts"][0]["name"]}
    stale = client.call("visible", table=name, lease="none", point_hint={"key_columns": ["x"], "keys": [[42]]})
    assert len(stale["parts"]) == 20
    with client.transaction() as tx:
        tx.insert(name, pa.table({"k": pa.array([42], pa.int64()), "a": ["mine"]}))
        own = client.call("visible", table=name, id=tx.id, point_hint={"key_columns": ["k"], "keys": [[42]]})
        assert len(own["parts"]) == 2  # the committed one and its own
        assert tx.read(name, where=K == 42).column("a").to_pylist() == ["mine"]
    assert client.read(name, where=K == 42).column("a").to_pylist() == ["mine"]


EXACT = [
    (SCHEMA, ("k",), K == 5, [(5,)]),
    (SCHEMA, ("k",), (K == 5) | (K == 2), [(2,), (5,)]),
    (SCHEMA, ("k",), (K == 5) & (K == 6), []),
    (SCHEMA, ("k",), (K == 5) & (pc.field("a") == "x"), None),  # says more than the key: applied after the fold
    (SCHEMA, ("k",), K > 5, None),
    (SCHEMA, ("k",), K == 5.5, None),
    (PK2, ("p", "k"), (P == "x") & (K == 3), [("x", 3)]),
    (PK2, ("p", "k"), ((P == "x") | (P == "y")) & (K == 1), [("x", 1), ("y", 1)]),
    (PK2, ("p", "k"), ((P == "x") | (P == "y")) & (K == 1) & (V > 0), None),
    (pa.schema([pa.field("f", pa.float64(), False)]), ("f",), pc.field("f") == 0.0, None),  # -0.0 == 0.0
    (pa.schema([pa.field("d", pa.date32(), False)]), ("d",), pc.field("d") == dt.date(2020, 1, 1), None),
    (SCHEMA, ("k",), K.isin([7, 3]), [(3,), (7,)]),
    (pa.schema([pa.field("f", pa.float64(), False)]), ("f",), pc.field("f").isin([0.0]), None),
]


@pytest.mark.parametrize(("schema", "pk", "where", "want"), EXACT, ids=[str(w) for _, _, w, _ in EXACT])
def test_exact_point_keys(schema: pa.Schema, pk: tuple, where: pc.Expression, want: list | None) -> None:
    """A filter of key equalities alone (a point read neither re-checks nor re-applies it)."""
    assert keytables.point_keys(where, schema, pk, exact=True) == want


def test_a_latest_point_read_takes_no_lease_and_starts_over_when_cleanup_took_its_part(
    tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the part list and the read of a latest point read, a major compaction and a cleanup
    pass (no history window) delete the part it listed: no lease kept it, so the pass takes it,
    and the read finds it missing (CorruptPart), learns the snapshot is gone and reads again at
    the latest, returning the compacted row. A read at a given snapshot still leases it."""
    name = "ks_nolease"
    settings = {"merge_interval": 0, "gc_interval": 0, "retention_seconds": 0}
    with make_cluster(tmp_path_factory, zk_server, "keys-nolease", replicas=1, settings=settings) as c:
        client = c.client(0)
        client.create_table(name, SCHEMA, primary_key=("k",), conflict_policy="keys", auto_merge=False)
        for i in range(2):
            with client.transaction() as tx:
                tx.upsert(name, pa.table({"k": pa.array([5, 6 + i], pa.int64()), "a": [f"v{i}", "w"]}))
        assert client.read(name, where=K == 5).column("a").to_pylist() == ["v1"]  # caches the definition
        old = {r["path"] for r in client.parts(name).to_pylist() if r["visible"]}
        real, calls, removed = client_module.read_part, [], []

        def racing(storage, meta, *a, **kw):
            calls.append(meta.path)
            if len(calls) == 1:  # the first part the read opens: gone by now
                client.compact(name, kind="major")
                removed.extend(r["path"] for r in client.gc()["removed"] if r["table"] == name)
            return real(storage, meta, *a, **kw)

        monkeypatch.setattr(client_module, "read_part", racing)
        # The row group the read above decoded is kept and would answer without the file.
        monkeypatch.setattr(part_format, "_GROUPS", part_format._Cache(64 << 20))
        got = client.read(name, where=K == 5)
        assert got.column("k").to_pylist() == [5] and got.column("a").to_pylist() == ["v1"]
        assert calls[0] in old and set(removed) == old  # the pass took the listed parts: no lease held them
        assert calls[-1] not in old  # read again: the compacted part
        monkeypatch.setattr(client_module, "read_part", real)
        leased = client.call("visible", table=name, snapshot=client.snapshot())
        assert leased["lease"]  # a read at a given snapshot leases it as before
        client.call("release", lease=leased["lease"])
        client.close()


def test_a_point_read_gets_no_small_part_whose_filter_alone_says_maybe(client: Client) -> None:
    """A small commit's part lists its versions in its key summary (checked against its file
    at staging): the replica prunes a point read's parts by them, so a key its 256-bit filter
    says "maybe" for (about 0.1 % of the keys in its range) does not send the reader to it (a
    10-key update-mode write of a table with 1,000 such parts read 19 parts, 10 of use)."""
    name = "ks_exact_probe"
    client.create_table(name, SCHEMA, primary_key=("k",), conflict_policy="keys", auto_merge=False)
    held = random.Random(5).sample(range(10**6), 10)
    with client.transaction() as tx:
        tx.upsert(name, pa.table({"k": pa.array(held, pa.int64()), "a": ["x"] * 10}))
    (part,) = client.call("visible", table=name, lease="none")["parts"]
    summary = {k: v for k, v in part["key_summary"].items() if k != "exact"}
    assert len(part["key_summary"]["exact"]) == 10
    absent = [k for k in range(min(held), max(held), 53) if k not in held]
    false = [k for k in absent if keytables.may_hold_any(summary, {(k,): keytables.key_hash((k,))})]
    assert false, "no key the filter alone keeps the part for"
    for k in false[:5]:
        got = client.call("visible", table=name, point_hint={"key_columns": ["k"], "keys": [[k]]}, lease="none")
        assert got["parts"] == [], k
        assert client.read(name, where=K == k).num_rows == 0
    for k in held[:3]:
        got = client.call("visible", table=name, point_hint={"key_columns": ["k"], "keys": [[k]]}, lease="none")
        assert [p["name"] for p in got["parts"]] == [part["name"]]
        assert client.read(name, where=K == k).column("k").to_pylist() == [k]


def test_point_reads_answer_right_through_compaction_cleanup_and_ddl(
    tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer
) -> None:
    """The replica keeps parsed key summaries by part (keytables.SummaryProbes) and answers a
    point read's ``visible`` with slim summaries: point reads between upserts, a major
    compaction (and at the snapshot before it, whose set of parts the replica laid out
    before), a cleanup pass that deletes the replaced parts, an ALTER TABLE, and a drop and
    re-create of the table under the same name answer what a whole read folds to."""
    name = "ks_probes"
    settings = {"merge_interval": 0, "gc_interval": 0, "retention_seconds": 0}
    rng = random.Random(7)
    with make_cluster(tmp_path_factory, zk_server, "keys-probes", replicas=1, settings=settings) as c:
        client = c.client(0)

        def check(keys: list[int], snapshot: int | None = None) -> None:
            whole = {r["k"]: r for r in client.read(name, snapshot=snapshot).to_pylist()}
            for k in keys:
                got = client.read(name, snapshot=snapshot, where=K == k).to_pylist()
                assert got == ([whole[k]] if k in whole else []), k

        def upserts(rounds: int, value: str) -> None:
            for i in range(rounds):
                with client.transaction() as tx:
                    ks = rng.sample(range(400), 40)
                    tx.upsert(name, pa.table({"k": pa.array(ks, pa.int64()), "a": [f"{value}{i}"] * 40}))
                    tx.delete_keys(name, pa.table({"k": pa.array(rng.sample(range(400), 3), pa.int64())}))

        client.create_table(name, SCHEMA, primary_key=("k",), conflict_policy="keys", auto_merge=False)
        upserts(6, "x")
        probe = list(range(0, 400, 7)) + [-1, 400]
        check(probe)
        slim = client.call(
            "visible", table=name, point_hint={"key_columns": ["k"], "keys": [[7]]}, slim=True, lease="none"
        )
        full = client.call("visible", table=name, point_hint={"key_columns": ["k"], "keys": [[7]]}, lease="none")
        assert [p["name"] for p in slim["parts"]] == [p["name"] for p in full["parts"]]
        assert all("filter" not in p["key_summary"] and "ranges" in p["key_summary"] for p in slim["parts"])
        # A whole read's answer comes slim too (no point hint: every part, no filters).
        whole_slim = client.call("visible", table=name, slim=True, lease="none")
        whole_full = client.call("visible", table=name, lease="none")
        assert [p["name"] for p in whole_slim["parts"]] == [p["name"] for p in whole_full["parts"]]
        assert all("filter" not in p["key_summary"] for p in whole_slim["parts"])
        assert all("filter" in p["key_summary"] for p in whole_full["parts"])
        before = {r["path"] for r in client.parts(name).to_pylist() if r["visible"]}
        old_snapshot = client.snapshot()
        check(probe)  # the replica's layout of this set of parts, probed again
        client.compact(name, kind="major")
        check(probe)
        check(probe, old_snapshot)  # the set before the compaction, at its snapshot: the same answers
        check(probe)
        removed = {r["path"] for r in client.gc()["removed"] if r["table"] == name}
        assert removed == before  # the parts the cache saw are gone from storage
        check(probe)
        upserts(3, "y")
        client.alter_table(name, retention_seconds=60.0)  # keys tables take no schema change yet
        with client.transaction() as tx:
            tx.upsert(name, pa.table({"k": pa.array([7, 14], pa.int64()), "a": ["z", "z"], "b": [1, 2]}))
        check(probe)
        client.drop_table(name)
        client.create_table(name, SCHEMA, primary_key=("k",), conflict_policy="keys", auto_merge=False)
        upserts(2, "w")
        check(probe)
        client.close()


def test_point_reads_decode_what_their_parts_statistics_leave_open_and_equal_the_fold(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A point read decodes of each part only the columns it keeps and those the part's
    statistics do not prove constant (``_op`` of a PUT-only part, ``_cols`` of an UPDATE-free
    one, ``_seq`` where no version of a key may tie: keyfold.read_plan), and ``_seq`` after
    all where a key it looks up occurs twice in the part; its answers equal the whole read's
    over PUTs, update-mode upserts, deletes, a minor compaction's ``_ver``, two statements of
    one commit on the same keys (tied orders) and a key written twice by one statement."""
    name = "ks_point_plans"
    client.create_table(name, SCHEMA, primary_key=("k",), conflict_policy="keys", auto_merge=False)
    rng = random.Random(11)

    def rows(ks: list[int], tag: str) -> pa.Table:
        return pa.table({"k": pa.array(ks, pa.int64()), "a": [f"{tag}{k}" for k in ks], "b": list(range(len(ks)))})

    for i in range(6):
        with client.transaction() as tx:
            tx.upsert(name, rows(rng.sample(range(60), 20), f"p{i}-"))
    client.compact(name, kind="minor")
    with client.transaction() as tx:
        tx.upsert(name, pa.table({"k": pa.array(range(0, 60, 6), pa.int64()), "b": [-1] * 10}), update=True)
        tx.delete_keys(name, pa.table({"k": pa.array([1, 2, 3], pa.int64())}))
    with client.transaction() as tx:  # two parts at one CSN: their versions of 4..8 tie on order
        tx.upsert(name, rows(list(range(4, 9)), "t1-"))
        tx.upsert(name, rows(list(range(6, 12)), "t2-"))
    with client.transaction() as tx:  # one statement writes key 30 twice: the later row wins
        tx.upsert(name, pa.table({"k": pa.array([30, 31, 30], pa.int64()), "a": ["x", "y", "z"], "b": [1, 2, 3]}))
    decoded: list[list[str] | None] = []
    real = client_module.read_part

    def recording(storage, meta, columns=None, keys=None):
        decoded.append(columns)
        return real(storage, meta, columns=columns, keys=keys)

    monkeypatch.setattr(client_module, "read_part", recording)
    everything = client.read(name)
    assert everything.filter(K == 30).column("a").to_pylist() == ["z"]
    for key in [*range(62), -1]:
        for columns in (None, ["k", "a"], ["b"]):
            got = client.read(name, where=K == key, columns=columns)
            want = everything.filter(K == key)
            assert got.equals(want if columns is None else want.select(columns)), (key, columns)
    assert client.read(name, where=K.isin([5, 7, 30]), columns=["a"]).equals(
        everything.filter(K.isin([5, 7, 30])).select(["a"])
    )
    plain = [c for c in decoded if c is not None]
    assert plain and any(keytables.SEQ not in c and keytables.OP not in c for c in plain)  # PUT-only, no ties
    assert any(c == ["k", "b"] for c in plain)  # a column the reader does not keep is not decoded
    assert any(keytables.SEQ in c for c in plain)  # tied orders, ``_ver`` or key 30 twice
    # In a transaction: its own parts tie (order OWN), one of them writes a key twice.
    with client.transaction() as tx:
        tx.upsert(name, pa.table({"k": pa.array([40, 40], pa.int64()), "a": ["m", "n"]}))
        tx.upsert(name, pa.table({"k": pa.array([40, 41], pa.int64()), "b": [9, 9]}), update=True)
        mine = tx.read(name)
        for key in (40, 41, 42, 30):
            assert tx.read(name, where=K == key, columns=["a", "b"]).equals(mine.filter(K == key).select(["a", "b"]))
        assert mine.filter(K == 40).to_pylist() == [{"k": 40, "a": "n", "b": 9}]
