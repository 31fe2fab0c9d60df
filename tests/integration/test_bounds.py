"""Bounded metadata: column statistics and key summaries stay correct bounds
when long strings are cut to a prefix; error messages quote values only up to a short length;
what one commit adds to the log and the WAL is limited by a replica setting.

The first half is pure and exhaustive: every string over an alphabet of the code points where
UTF-8 changes length or ends (U+007F, U+0080, U+07FF, U+0800, U+D7FF, U+E000, U+FFFF, U+10000,
U+10FFFF), at every length around the cut, is checked against the bounds, in Python's order and
in Arrow's (UTF-8 bytes). The second half runs a real cluster with a 64 MiB string.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from kazoo.client import KazooClient
from support.cluster import make_cluster  # tests/ is on sys.path
from support.zk import kazoo

from coordinator import errors
from coordinator.core import keytables
from coordinator.core import tabledata as ops
from coordinator.core.versions import split_csn
from coordinator.errors import ConflictError, ConflictKind, InvalidInput, MergetxnError
from coordinator.model.records import LogEntry, ManifestPointer, decode_log_node
from coordinator.zk.log import CsnLog
from mergetxn.client import Client, Transaction
from mergetxn.local.cluster import LocalCluster
from mergetxn.local.zkserver import ZooKeeperServer
from parts.io.format import column_stats
from parts.model.meta import PartMeta

# Where UTF-8 changes length, the surrogate gap and the last code point.
EDGES = [
    "\x00",
    "a",
    "\x7f",
    "\x80",
    "\u07ff",
    "\u0800",
    "\ud7ff",
    "\ue000",
    "\uffff",
    "\U00010000",
    "\U0010fffe",
    "\U0010ffff",
]
BYTE_EDGES = [b"\x00", b"a", b"\x7f", b"\xfe", b"\xff"]
LIMIT = 3  # the pure functions take the limit: short strings cover every case


def strings(alphabet: list, max_len: int) -> list:
    empty = alphabet[0][:0]
    return [empty.join(t) for n in range(max_len + 1) for t in itertools.product(alphabet, repeat=n)]


def arrow_le(a: str | bytes, b: str | bytes) -> bool:
    typ = pa.string() if isinstance(a, str) else pa.binary()
    return pc.less_equal(pa.scalar(a, typ), pa.scalar(b, typ)).as_py()


@pytest.mark.parametrize("alphabet", [EDGES, BYTE_EDGES], ids=["str", "bytes"])
def test_bounds_hold_for_every_string_of_the_edge_alphabet(alphabet: list) -> None:
    """lower_bound(v) <= v <= upper_bound(v) (None: no bound), each within LIMIT, and the upper
    bound also lies above every longer value sharing v's cut prefix."""
    values = strings(alphabet, LIMIT + 1)
    for v in values:
        lo, hi = ops.lower_bound(v, LIMIT), ops.upper_bound(v, LIMIT)
        assert len(lo) <= LIMIT or lo == v
        assert lo <= v, (v, lo)
        if len(v) <= LIMIT:
            assert lo == hi == v
            continue
        assert lo == v[:LIMIT]
        if hi is None:
            assert set(v[:LIMIT]) <= {"\U0010ffff", 0xFF}, v
            continue
        assert len(hi) <= LIMIT and v < hi, (v, hi)
        assert all(not (0xD800 <= ord(c) <= 0xDFFF) for c in hi) if isinstance(hi, str) else True
        for tail in alphabet:  # anything longer with the same prefix stays below
            assert v[:LIMIT] + tail * 5 < hi
    sample = random.Random(20).sample(values, 300)
    for v in sample:  # Arrow's order (UTF-8 bytes) agrees with Python's (code points)
        hi = ops.upper_bound(v, LIMIT)
        if isinstance(v, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in v):
            continue  # not valid UTF-8, never an Arrow string
        assert arrow_le(ops.lower_bound(v, LIMIT), v)
        if hi is not None:
            assert arrow_le(v, hi)


def test_no_upper_bound_only_when_the_prefix_cannot_grow() -> None:
    assert ops.upper_bound("\U0010ffff" * 70) is None
    assert ops.upper_bound(b"\xff" * 70) is None
    assert ops.upper_bound("\U0010ffff" * 63 + "a" + "zz") == "\U0010ffff" * 63 + "b"
    assert ops.upper_bound("a" * 63 + "\U0010ffff" + "zz") == "a" * 62 + "b"
    assert ops.upper_bound("a" * 63 + "\ud7ff" + "z") == "a" * 63 + "\ue000"  # over the surrogates
    assert ops.upper_bound(b"a" * 63 + b"\xff\x01") == b"a" * 62 + b"b"


def column_values(rng: random.Random, n: int) -> list[str]:
    """Long strings that differ around the cut (STAT_PREFIX), over the edge alphabet."""
    base = "k" * (ops.STAT_PREFIX - 2)
    return [base + "".join(rng.choice(EDGES[1:6] + EDGES[7:]) for _ in range(rng.randint(0, 5))) for _ in range(n)]


def test_column_stats_bound_every_value_and_pruning_never_misses() -> None:
    """The statistics written for a part are a min and max every value lies between (Python
    and Arrow order), at most STAT_PREFIX characters each; and may_match never rules out a part
    that holds a row matching a comparison with any literal."""
    rng = random.Random(7)
    ops_ = {
        "==": pc.equal,
        "!=": pc.not_equal,
        "<": pc.less,
        "<=": pc.less_equal,
        ">": pc.greater,
        ">=": pc.greater_equal,
    }
    schema = pa.schema([("s", pa.string())])
    for trial in range(150):
        values = column_values(rng, rng.randint(1, 4))
        if trial % 10 == 0:
            values = ["\U0010ffff" * 70]  # no upper bound
        data = pa.table({"s": values})
        lo, hi = column_stats(data)["s"]
        assert len(lo) <= ops.STAT_PREFIX and (hi is None or len(hi) <= ops.STAT_PREFIX)
        for v in values:
            assert lo <= v and (hi is None or v <= hi)
            assert arrow_le(lo, v) and (hi is None or arrow_le(v, hi))
        for literal in column_values(rng, 6) + values:
            for op, fn in ops_.items():
                where = fn(pc.field("s"), pc.scalar(literal))
                matching = data.filter(where).num_rows
                if matching:
                    assert ops.may_match({"s": (lo, hi)}, [], (), where, schema), (values, op, literal)


def test_pruning_still_prunes_on_cut_statistics() -> None:
    schema = pa.schema([("s", pa.string())])
    stats = column_stats(pa.table({"s": ["b" * 200, "b" * 100 + "c"]}))
    assert stats["s"] == ("b" * 64, "b" * 63 + "c")
    assert not ops.may_match(stats, [], (), pc.field("s") == "a" * 200, schema)
    assert not ops.may_match(stats, [], (), pc.field("s") > "c", schema)
    assert ops.may_match(stats, [], (), pc.field("s") == "b" * 200, schema)
    assert ops.may_match(stats, [], (), pc.field("s") != "b" * 64, schema)  # min == max is not claimed
    unbounded = column_stats(pa.table({"s": ["\U0010ffff" * 100]}))
    assert unbounded["s"] == ("\U0010ffff" * 64, None)
    assert not ops.may_match(unbounded, [], (), pc.field("s") < "z", schema)  # the min still prunes
    assert ops.may_match(unbounded, [], (), pc.field("s") > "\U0010ffff" * 200, schema)


def test_old_parts_with_long_statistics_decode_bounded() -> None:
    """A part recorded before (or by a client that did not cut them) keeps correct bounds: its
    metadata is bounded as it is decoded, from the log, the WAL, a sidecar or a stage call."""
    long = "m" * 10_000
    meta = PartMeta(
        name="p1",
        table="t",
        partition=(),
        path="t/_/p1.parquet",
        rows=1,
        size=1,
        checksum="crc32:00000000",
        stats={"s": (long, long), "n": (1, 2)},
    )
    back = PartMeta.from_dict(meta.to_dict())
    assert back.stats == {"s": ("m" * 64, "m" * 63 + "n"), "n": (1, 2)}


def test_key_summaries_bound_long_keys_and_still_hold_them() -> None:
    pk = ("a", "b")
    rows = [("x" * 500, "y" * 500), ("x" * 500, "y" * 499 + "z"), ("short", "k")]
    data = pa.table(
        {
            "a": [r[0] for r in rows],
            "b": [r[1] for r in rows],
            keytables.OP: pa.array([keytables.PUT] * 3, pa.int8()),
            keytables.SEQ: pa.array([0, 1, 2], pa.int64()),
            keytables.COLS: pa.array([None] * 3, pa.string()),
        }
    )
    s = keytables.summarize(data, pk)
    assert "exact" not in s  # a long key is never listed: the conflict check reads the part
    assert len(repr(s["lo"]) + repr(s["hi"])) < 400
    for r in rows:
        assert keytables.may_hold(s, r) and keytables.may_hold_any(s, {r: keytables.key_hash(r)})
    assert not keytables.may_hold(s, ("z" * 500, "a"))
    short = keytables.summarize(data.slice(2), pk)
    assert short["exact"] == [["short", "k", keytables.PUT, None]] and short["lo"] == ["short", "k"]
    none = keytables.summarize(data.set_column(0, "a", pa.array(["\U0010ffff" * 70] * 3)), pk)
    assert none["lo"] is None and none["hi"] is None
    assert keytables.summary_problem(none) is None


# ---------------------------------------------------------------------------------------------
# Messages


def test_quote_cuts_long_values_and_names_their_length() -> None:
    assert errors.quote("abc") == "'abc'"
    q = errors.quote("x" * 1_000_000)
    assert len(q) < 300 and "1000000 characters" in q and q.startswith("'xxx")
    assert "1000000 bytes" in errors.quote(b"\x00" * 1_000_000)
    assert len(errors.quote(["y" * 10_000] * 1000)) < 300
    assert len(errors.clip("z" * 10_000)) < 300


def test_error_messages_and_details_are_bounded() -> None:
    exc = MergetxnError("m" * 10_000_000, value="v" * 10_000_000, many=["w" * 1000] * 100_000)
    d = exc.to_dict()
    assert len(d["message"]) <= errors.MAX_MESSAGE + 100 and "10000000 characters" in d["message"]
    assert errors.from_dict(d).message == d["message"]  # cut once, not again on the client
    assert len(repr(d["details"])) < 2_000_000
    schema = pa.schema([("s", pa.string())])
    with pytest.raises(InvalidInput) as info:
        ops.check_expression(pc.field("nosuch") == "q" * 1_000_000, schema, "filter on 't'")
    assert len(info.value.message) < 1000 and "nosuch" in info.value.message
    with pytest.raises(InvalidInput) as info:
        ops.assignments({"s": "q" * 1_000_000 + "\x00"}, pa.schema([("s", pa.int64())]))
    assert len(info.value.message) < 1000


# ---------------------------------------------------------------------------------------------
# A real cluster: a 64 MiB string, long keys, long read sets, the commit size limit

BIG = "m" * (64 * 1024 * 1024)  # the value: one row of it made a 128 MiB sidecar
SV = pa.schema([("id", pa.int64()), ("s", pa.string())])
KEYED = pa.schema([pa.field("k", pa.string(), nullable=False), ("v", pa.int64())])
LIMIT_BYTES = 64 * 1024  # max_commit_bytes here: its minimum, so that a commit of 300 parts is over


@pytest.fixture(scope="module")
def cluster(zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with make_cluster(
        tmp_path_factory,
        zk_server,
        "bounds",
        replicas=2,
        settings={"max_commit_bytes": LIMIT_BYTES, "merge_interval": 0},
    ) as c:
        yield c


@pytest.fixture(scope="module")
def zk(cluster: LocalCluster) -> Iterator[KazooClient]:
    with kazoo(cluster.zk_address) as client:
        yield client


def entry_bytes(cluster: LocalCluster, zk: KazooClient, csn: int) -> tuple[bytes, LogEntry]:
    """The log entry of ``csn`` as stored (its manifest's bytes when it went to one) and decoded."""
    data, _ = zk.get(CsnLog(zk).entry_path(*split_csn(csn)))
    node = decode_log_node(data, str(csn))
    if isinstance(node, ManifestPointer):
        data = (Path(cluster.storage_url) / node.path).read_bytes()
        node = decode_log_node(data, node.path)
    return data, node


def added_parts(entry: LogEntry) -> list[PartMeta]:
    return [m for t in entry.txns for c in t.changes for m in c.added]


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_64_mib_string_leaves_small_metadata_everywhere(
    cluster: LocalCluster, zk: KazooClient, c0: Client, c1: Client
) -> None:
    """One row with a 64 MiB string: its sidecar, its log entry, the WAL growth on each replica,
    the replicas' memory and an error message quoting it all stay small; reads and min/max
    pruning on that column still return exactly the right rows."""
    c0.create_table("big", SV, auto_merge=False, inline_rows=0)  # reads the sidecar beside the file: no inlining
    c1.wait_for(c0.snapshot())
    wals = [dir_bytes(Path(cluster.workdir) / f"replica-{i}") for i in range(2)]
    rss = [rss_bytes(cluster.replica_pid(i)) for i in range(2)]
    with c0.transaction() as tx:
        tx.insert("big", pa.table({"id": [1], "s": [BIG]}, schema=SV))
    big_csn = tx.csn
    with c0.transaction() as tx:
        tx.insert("big", pa.table({"id": [2, 3], "s": ["a", "zz"]}, schema=SV))
    c1.wait_for(tx.csn)

    data, entry = entry_bytes(cluster, zk, big_csn)
    assert len(data) < 16 * 1024, len(data)
    (meta,) = added_parts(entry)
    assert meta.stats["s"] == ("m" * ops.STAT_PREFIX, "m" * (ops.STAT_PREFIX - 1) + "n")
    sidecar = Path(cluster.storage_url) / meta.meta_path
    assert sidecar.stat().st_size < 8 * 1024
    assert not list((Path(cluster.storage_url) / "_manifests").glob("*"))  # no manifest needed
    for i in range(2):
        assert dir_bytes(Path(cluster.workdir) / f"replica-{i}") - wals[i] < 256 * 1024
        assert rss_bytes(cluster.replica_pid(i)) - rss[i] < 128 * 1024 * 1024

    def ids_where(where: pc.Expression) -> list[int]:
        return sorted(c1.read("big", where=where).column("id").to_pylist())

    assert ids_where(pc.field("s") == BIG) == [1]  # (each step with a 64 MiB literal takes seconds)
    assert ids_where(pc.field("s") > "m") == [1, 3]
    assert ids_where(pc.field("s") < "m" * 100) == [2]
    assert ids_where(pc.field("s") >= "m" * 64) == [1, 3]
    assert ids_where(pc.field("s") != "a") == [1, 3]
    schema = c0.describe_table("big")["schema"]
    assert not ops.may_match(meta.stats, [], (), pc.field("s") == "a", schema)  # still pruned
    assert not ops.may_match(meta.stats, [], (), pc.field("s") > "n", schema)

    with pytest.raises(InvalidInput) as info:
        c0.read("big", where=pc.field("nosuch") == BIG)
    assert len(info.value.message) < 1000 and "nosuch" in info.value.message
    assert len(str(info.value.to_dict())) < 4000
    with pytest.raises(InvalidInput) as info:
        with c0.transaction() as tx:
            tx.update("big", pc.field("id") == 1, {"id": BIG})
    assert len(info.value.message) < 1000


def test_point_lookup_and_key_conflicts_on_long_string_keys(
    cluster: LocalCluster, zk: KazooClient, c0: Client, c1: Client
) -> None:
    """Keys longer than the statistics keep: a point read still finds exactly its row (the key
    summary's range is cut, never wrong), a second writer of the same long key still loses, a
    writer of another long key with the same 64-character prefix does not, and the key summary
    in the log stays small."""
    c0.create_table("longkeys", KEYED, primary_key=("k",), conflict_policy="keys", auto_merge=False)
    prefix = "p" * 5000
    keys_ = [prefix + "a", prefix + "b", prefix + "c", "short"]
    with c0.transaction() as tx:
        tx.insert("longkeys", pa.table({"k": keys_, "v": [0, 1, 2, 3]}, schema=KEYED))
    _, entry = entry_bytes(cluster, zk, tx.csn)
    (meta,) = added_parts(entry)
    assert len(json.dumps(meta.to_dict())) < 4096
    c1.wait_for(tx.csn)
    for i, k in enumerate(keys_):
        assert c1.read("longkeys", where=pc.field("k") == k).to_pylist() == [{"k": k, "v": i}]
    assert c1.read("longkeys", where=pc.field("k") == prefix + "z").num_rows == 0

    a, b, other = c0.begin(), c1.begin(), c1.begin()
    a.insert("longkeys", pa.table({"k": [prefix + "b"], "v": [10]}, schema=KEYED))
    b.insert("longkeys", pa.table({"k": [prefix + "b"], "v": [20]}, schema=KEYED))
    other.insert("longkeys", pa.table({"k": [prefix + "d"], "v": [30]}, schema=KEYED))
    won = a.commit()
    c1.wait_for(won)
    with pytest.raises(ConflictError) as info:
        b.commit()
    assert info.value.kind is ConflictKind.KEY_WRITTEN and len(info.value.message) < 2000
    other.commit()
    assert c1.read("longkeys", where=pc.field("k") == prefix + "b").to_pylist() == [{"k": prefix + "b", "v": 10}]


def test_serializable_read_sets_with_long_strings(
    cluster: LocalCluster, zk: KazooClient, c0: Client, c1: Client
) -> None:
    """A serializable read of a long value still loses to a commit that adds a row with it (the
    cut statistics still bound it), and not to one whose values differ within the prefix kept."""
    # Measures metadata without part content: an inlined part carries its bytes (bounded by
    # inline_bytes instead, docs/architecture/small-writes.md), so no inlining here.
    c0.create_table("skew", SV, auto_merge=False, inline_rows=0)
    long_a, long_b = "a" * 3000, "b" * 3000
    for rows in ([1], [2]):
        with c0.transaction() as tx:
            tx.insert("skew", pa.table({"id": rows, "s": ["seed"]}, schema=SV))
    c1.wait_for(tx.csn)

    def reader(value: str) -> Transaction:
        tx = c1.begin(isolation="serializable")
        tx.read("skew", where=pc.field("s") == value)
        tx.insert("skew", pa.table({"id": [100], "s": ["mine"]}, schema=SV))
        return tx

    loses, keeps = reader(long_a + "x"), reader(long_b)
    with c0.transaction() as tx:
        tx.insert("skew", pa.table({"id": [3], "s": [long_a + "y"]}, schema=SV))
    _, entry = entry_bytes(cluster, zk, tx.csn)
    assert len(json.dumps(added_parts(entry)[0].to_dict())) < 4096
    c1.wait_for(tx.csn)
    with pytest.raises(ConflictError) as info:
        loses.commit()
    assert info.value.kind is ConflictKind.READ_SET_CHANGED
    keeps.commit()


def test_a_commit_over_max_commit_bytes_is_refused_and_changes_nothing(
    cluster: LocalCluster, c0: Client, c1: Client
) -> None:
    """What one commit adds to the log (and every WAL) is bounded by the replica setting
    max_commit_bytes: a transaction over it fails with InvalidInput naming the setting, leaves
    nothing visible; one under it commits."""
    c0.create_table("wide", SV, partition_by=("id",), auto_merge=False)
    before = c0.snapshot()
    with pytest.raises(InvalidInput, match="max_commit_bytes") as info:
        with c0.transaction() as tx:
            tx.insert("wide", pa.table({"id": list(range(300)), "s": ["x"] * 300}, schema=SV))
    assert info.value.details["max_commit_bytes"] == LIMIT_BYTES
    assert info.value.details["size"] > LIMIT_BYTES
    assert c0.read("wide").num_rows == 0 and c0.snapshot() == before
    with c0.transaction() as tx:
        tx.insert("wide", pa.table({"id": list(range(20)), "s": ["x"] * 20}, schema=SV))
    c1.wait_for(tx.csn)
    assert c1.read("wide").num_rows == 20
