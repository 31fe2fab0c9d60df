"""``spark.read_table`` of keys tables: Spark's own Parquet reader reads the
versions and Spark folds them per key (spark/keysfold.py); every read equals ``client.read`` at
the same snapshot: overwrites, update-mode upserts (columns carried forward), deletes, a delete
then an update, read locks, nulls, several partitions, a compaction's output (``_ver``), an old
snapshot, and filters on key and non-key columns. Real Spark, ZooKeeper and
replicas; no data source fallback (a NativeFallback warning fails the test).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support.cluster import make_cluster
from test_spark import new_session  # tests/ is on sys.path

import coordinator
import spark as mspark
from mergetxn.client import Client

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("error::spark.native.NativeFallback")]

SCHEMA = pa.schema(
    [
        pa.field("p", pa.string(), nullable=False),
        pa.field("k", pa.int64(), nullable=False),
        pa.field("a", pa.string()),
        pa.field("b", pa.int64()),
        pa.field("c", pa.float64()),
    ]
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    with make_cluster(tmp_path_factory, None, "nativekeys", replicas=1) as c:
        yield c


@pytest.fixture(scope="module")
def c0(cluster: coordinator.LocalCluster) -> Iterator[Client]:
    c = cluster.client(0)
    yield c
    c.close()


@pytest.fixture(scope="module")
def spark(cluster: coordinator.LocalCluster):
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    session = new_session("mergetxn-native-keys-tests")
    mspark.register(session, replica=cluster.replica_addresses[0])
    # Many tiny part files: pack them into few tasks (each file is otherwise a task of its own).
    session.conf.set("spark.sql.files.openCostInBytes", "4096")
    yield session
    session.stop()


def as_set(t: pa.Table) -> set[tuple]:
    return {tuple(r.values()) for r in t.to_pylist()}


def spark_set(df) -> set[tuple]:  # noqa: ANN001
    return {tuple(r) for r in df.collect()}


def rows(p: str, keys: list[int], tag: str, rng: random.Random) -> pa.Table:
    return pa.table(
        {
            "p": [p] * len(keys),
            "k": pa.array(keys, pa.int64()),
            "a": [None if rng.random() < 0.2 else f"{tag}{k}" for k in keys],
            "b": pa.array([None if rng.random() < 0.2 else rng.randrange(1000) for _ in keys], pa.int64()),
            "c": pa.array([rng.random() for _ in keys], pa.float64()),
        },
        schema=SCHEMA,
    )


def test_read_table_of_keys_tables_equals_client_read(spark, c0: Client) -> None:
    rng = random.Random(24)
    name = "nk_history"
    c0.create_table(name, SCHEMA, partition_by=("p",), primary_key=("p", "k"), conflict_policy="keys", auto_merge=False)
    snaps = []
    for step in range(5):
        with c0.transaction() as tx:
            for p in ("x", "y", "z"):
                keys = rng.sample(range(200), 60)
                what = rng.choice(["insert", "update", "update2", "delete", "lock"])
                if what == "insert":
                    tx.insert(name, rows(p, keys, f"s{step}-", rng))
                elif what == "update":  # only a: b and c carried forward from the row before
                    tx.upsert(name, rows(p, keys, f"u{step}-", rng).select(["p", "k", "a"]), update=True)
                elif what == "update2":
                    tx.upsert(name, rows(p, keys, f"v{step}-", rng).select(["p", "k", "b", "c"]), update=True)
                elif what == "delete":
                    tx.delete_keys(name, pa.table({"p": [p] * len(keys), "k": pa.array(keys, pa.int64())}))
                else:
                    tx.lock_keys(name, pa.table({"p": [p] * len(keys), "k": pa.array(keys, pa.int64())}))
            # The same key twice in one transaction: a delete, then an update of it (a PUT with
            # the other columns null), then a second update (_seq orders them).
            tx.delete_keys(name, pa.table({"p": ["x"], "k": pa.array([500 + step], pa.int64())}))
            tx.upsert(
                name, pa.table({"p": ["x"], "k": pa.array([500 + step], pa.int64()), "a": [f"d{step}"]}), update=True
            )
            tx.upsert(
                name,
                pa.table({"p": ["x"], "k": pa.array([500 + step], pa.int64()), "b": pa.array([step], pa.int64())}),
                update=True,
            )
        snaps.append(tx.csn)
    latest = mspark.read_table(spark, name)
    assert [f.name for f in latest.schema.fields] == SCHEMA.names
    expected = as_set(c0.read(name))
    assert len(expected) > 150
    assert spark_set(latest) == expected
    old = snaps[3]
    assert spark_set(mspark.read_table(spark, name, snapshot=old)) == as_set(c0.read(name, snapshot=old))
    assert as_set(c0.read(name, snapshot=old)) != expected
    # Filters: a partition value prunes parts; a key column and a non-key column filter after
    # the fold (a row whose older version matched is not returned).
    for where, expr in [
        ([("p", "==", "y"), ("k", "<", 50)], (pc.field("p") == "y") & (pc.field("k") < 50)),
        ([("b", ">=", 500)], pc.field("b") >= 500),
    ]:
        assert spark_set(mspark.read_table(spark, name, where=where)) == as_set(c0.read(name, where=expr)), where


def test_read_table_after_a_compaction(spark, c0: Client) -> None:
    rng = random.Random(7)
    name = "nk_compacted"
    c0.create_table(name, SCHEMA, partition_by=("p",), primary_key=("p", "k"), conflict_policy="keys", auto_merge=False)
    for step in range(3):
        with c0.transaction() as tx:
            tx.insert(name, rows("x", rng.sample(range(100), 40), f"s{step}-", rng))
            tx.upsert(
                name, rows("x", rng.sample(range(100), 30), f"u{step}-", rng).select(["p", "k", "a"]), update=True
            )
            tx.delete_keys(name, pa.table({"p": ["x"] * 10, "k": pa.array(rng.sample(range(100), 10), pa.int64())}))
    # A compaction's output carries _ver: the fold orders its rows by it, beside newer parts.
    c0.compact(name, kind="major", partitions=["x"])
    with c0.transaction() as tx:
        tx.upsert(name, rows("x", list(range(0, 200, 3)), "after-", rng).select(["p", "k", "c"]), update=True)
    assert spark_set(mspark.read_table(spark, name)) == as_set(c0.read(name))


def test_read_table_of_an_empty_and_a_deleted_keys_table(spark, c0: Client) -> None:
    name = "nk_empty"
    c0.create_table(name, SCHEMA, primary_key=("p", "k"), conflict_policy="keys")
    assert mspark.read_table(spark, name).count() == 0
    with c0.transaction() as tx:
        tx.insert(name, rows("x", [1, 2], "a", random.Random(1)))
    with c0.transaction() as tx:
        tx.delete_keys(name, pa.table({"p": ["x", "x"], "k": pa.array([1, 2], pa.int64())}))
    assert mspark.read_table(spark, name).count() == 0 == c0.read(name).num_rows


@pytest.fixture
def folding(monkeypatch: pytest.MonkeyPatch) -> None:
    """``read_table`` folds, as from a replica that sends no deletion vectors (one from before
    them, or a key whose last version is an update): the fold's roads are what the test reads."""
    from spark import native

    monkeypatch.setattr(native, "_visible", lambda client, args: client.call("visible", lease="read", **args))


@pytest.mark.parametrize("road", ["size", "file", "size, in chunks"])
def test_read_table_by_deletion_vectors(
    spark, c0: Client, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, road: str
) -> None:
    """Inserts, deletes and update-mode upserts, large and small parts, two partitions: ``read_table`` reads the
    parts minus their vectors (no fold), rows as client.read's, at an older snapshot and at the
    latest; the dead rows named by one integer of file size and row index (``size``: the parts'
    sizes differ) and by file name and row index (``file``: as when two parts have one size),
    given to Spark as arrays of positions in one Arrow chunk or in chunks of at most 3."""
    from spark import native

    if road.endswith("in chunks"):
        monkeypatch.setattr(native, "_LIST_VALUES", 3)

    shifts: list[int | None] = []
    real = native.row_key_shift

    def shift(sizes: list[int], rows: list[int], dead: list) -> int | None:
        shifts.append(real(sizes, rows, dead) if road.startswith("size") else None)
        return shifts[-1]

    monkeypatch.setattr(native, "row_key_shift", shift)
    caplog.set_level("DEBUG", logger="spark.keysfold")
    rng = random.Random(5)
    name = f"nk_vectors_{road.split(',')[0]}_{len(road)}"
    c0.create_table(
        name,
        SCHEMA,
        partition_by=("p",),
        primary_key=("p", "k"),
        conflict_policy="keys",
        auto_merge=False,
        inline_rows=50,
    )
    snaps = []
    for step in range(6):
        with c0.transaction() as tx:
            tx.insert(name, rows(rng.choice("xy"), rng.sample(range(300), 120 if step < 3 else 5), f"s{step}-", rng))
            tx.delete_keys(name, keys_of(rng.choice("xy"), rng.sample(range(300), 7)))
        snaps.append(c0.snapshot())
    with c0.transaction() as tx:  # update mode: whole rows (b and c read at write time)
        tx.upsert(name, rows("x", rng.sample(range(300), 40), "upd-", rng).select(["p", "k", "a"]), update=True)
    with c0.transaction() as tx:  # rows of a small part superseded
        tx.insert(name, rows("z", [1, 2, 3], "small-", rng))
    with c0.transaction() as tx:
        tx.insert(name, rows("z", [1], "again-", rng))
        tx.delete_keys(name, keys_of("z", [2]))
    snaps.append(c0.snapshot())
    for s in (snaps[2], snaps[-1]):  # derived at the first, followed to the second
        got, want = mspark.read_table(spark, name, snapshot=s), c0.read(name, snapshot=s)
        assert spark_set(got) == as_set(want) and got.count() == want.num_rows, s  # no dead row kept
    assert not [r for r in caplog.records if r.name == "spark.keysfold"], "read_table folded"
    assert "vectors" in c0.call("visible", table=name, vectors=True, lease="none")
    assert len(shifts) == 2 and all((s is not None) == road.startswith("size") for s in shifts), shifts


def roads_of(caplog: pytest.LogCaptureFixture) -> str:
    """The road :func:`spark.keysfold.read_folded` logged for the last read."""
    said = [r.getMessage() for r in caplog.records if r.name == "spark.keysfold"]
    assert said, "read_folded logged no road"
    return said[-1]


def keys_of(p: str, keys: list[int]) -> pa.Table:
    return pa.table({"p": [p] * len(keys), "k": pa.array(keys, pa.int64())})


def test_a_big_compacted_part_plus_small_upserts(
    spark, c0: Client, caplog: pytest.LogCaptureFixture, folding: None
) -> None:
    """The common shape: a big part per partition (a major compaction's output) and small parts
    after it. The big parts are read as they are (no shuffle); the small ones are folded and
    broadcast to them: updates (carried forward both ways), overwrites, deletes, a delete then
    an update, locks, keys only in small parts (new keys, an update of a missing key, a key
    deleted in one), partitions; at the latest and an older snapshot, with filters."""
    caplog.set_level("DEBUG", logger="spark.keysfold")
    rng = random.Random(2411)
    name = "nk_big_small"
    c0.create_table(name, SCHEMA, partition_by=("p",), primary_key=("p", "k"), conflict_policy="keys", auto_merge=False)
    for step in range(3):
        with c0.transaction() as tx:
            for p in ("x", "y"):
                tx.insert(name, rows(p, rng.sample(range(3000), 800), f"s{step}-", rng))
    c0.compact(name, kind="major")
    snaps = []
    for step in range(4):
        with c0.transaction() as tx:
            for p in ("x", "y"):
                tx.upsert(
                    name, rows(p, rng.sample(range(3200), 40), f"u{step}-", rng).select(["p", "k", "a"]), update=True
                )
                tx.upsert(name, rows(p, rng.sample(range(3200), 30), f"w{step}-", rng))  # overwrite mode
                tx.delete_keys(name, keys_of(p, rng.sample(range(3200), 20)))
                tx.lock_keys(name, keys_of(p, rng.sample(range(3200), 10)))
            tx.delete_keys(name, keys_of("x", [5000 + step, 7]))
            tx.upsert(name, pa.table({"p": ["x"], "k": pa.array([5000 + step], pa.int64()), "a": ["du"]}), update=True)
            tx.upsert(name, pa.table({"p": ["y"], "k": pa.array([6000 + step], pa.int64()), "b": [step]}), update=True)
        snaps.append(tx.csn)
    expected = as_set(c0.read(name))
    assert len(expected) > 3000
    assert spark_set(mspark.read_table(spark, name)) == expected
    assert "2 parts read as they are" in roads_of(caplog), roads_of(caplog)
    old = snaps[1]
    assert spark_set(mspark.read_table(spark, name, snapshot=old)) == as_set(c0.read(name, snapshot=old))
    assert "read as they are" in roads_of(caplog)
    for where, expr in [
        ([("p", "==", "y"), ("k", "<", 900)], (pc.field("p") == "y") & (pc.field("k") < 900)),
        ([("b", ">=", 500)], pc.field("b") >= 500),
        ([("a", "==", "du")], pc.field("a") == "du"),
    ]:
        assert spark_set(mspark.read_table(spark, name, where=where)) == as_set(c0.read(name, where=expr)), where


def test_parts_that_share_no_key_need_no_fold(
    spark, c0: Client, caplog: pytest.LogCaptureFixture, folding: None
) -> None:
    """Inserts of disjoint keys (each part holding each of its keys once) are read with no fold
    and no shuffle; a part holding a key twice (the same key twice in one insert) or a key of
    another big part is not read as it is, and the rows stay those of client.read."""
    caplog.set_level("DEBUG", logger="spark.keysfold")
    rng = random.Random(31)
    name = "nk_disjoint"
    c0.create_table(name, SCHEMA, partition_by=("p",), primary_key=("p", "k"), conflict_policy="keys", auto_merge=False)
    order = rng.sample(range(4000), 4000)
    for step in range(4):
        with c0.transaction() as tx:
            tx.insert(name, rows("x", order[step * 1000 : (step + 1) * 1000], f"s{step}-", rng))
    assert spark_set(mspark.read_table(spark, name)) == as_set(c0.read(name))
    assert "4 parts read as they are, 0 folded" in roads_of(caplog), roads_of(caplog)
    # A small update-mode upsert of existing keys and of new ones, and a delete: folded and broadcast.
    with c0.transaction() as tx:
        tx.upsert(name, rows("x", rng.sample(range(4200), 50), "u-", rng).select(["p", "k", "b"]), update=True)
        tx.delete_keys(name, keys_of("x", rng.sample(range(4000), 30)))
    assert spark_set(mspark.read_table(spark, name)) == as_set(c0.read(name))
    assert "4 parts read as they are, 2 folded" in roads_of(caplog), roads_of(caplog)
    # The biggest part now holds one key twice (the later write wins) and keys of the other big
    # parts: it is not read as it is but folded with the small ones.
    twice = order[:1500] + [order[0]]
    with c0.transaction() as tx:
        tx.insert(name, rows("x", twice, "t-", rng))
    assert spark_set(mspark.read_table(spark, name)) == as_set(c0.read(name))
    assert "4 parts read as they are, 3 folded" in roads_of(caplog), roads_of(caplog)


def test_overlay_of_newer_small_parts_on_parts_of_every_op(
    spark, c0: Client, caplog: pytest.LogCaptureFixture, folding: None
) -> None:
    """The overlay road: the small parts are all newer than the direct ones (their CSNs say so),
    so the direct rows need no version. The direct parts here hold every kind of row: PUTs, and
    in another part UPDATEs of keys never written, DELETEs and read locks (a key held there only
    by a lock, then written by a small part, is a row of the result). The small parts: updates
    of each column set, overwrites, deletes, a delete then an update, new keys, locks, nulls.
    Equal to client.read at each snapshot (no small part yet: the direct parts alone, their
    deletes and updates applied per row), with filters."""
    caplog.set_level("DEBUG", logger="spark.keysfold")
    rng = random.Random(5)
    name = "nk_overlay"
    c0.create_table(name, SCHEMA, primary_key=("p", "k"), conflict_policy="keys", auto_merge=False)
    with c0.transaction() as tx:
        tx.insert(name, rows("x", list(range(1000)), "s-", rng))
    with c0.transaction() as tx:
        tx.upsert(name, rows("x", list(range(1000, 1800)), "u-", rng).select(["p", "k", "a"]), update=True)
        tx.delete_keys(name, keys_of("x", list(range(2000, 2100))))
        tx.lock_keys(name, keys_of("x", list(range(3000, 3010))))
    before = tx.csn
    assert spark_set(mspark.read_table(spark, name, snapshot=before)) == as_set(c0.read(name, snapshot=before))
    assert "0 folded" in roads_of(caplog), roads_of(caplog)
    snaps = []
    for step in range(3):
        with c0.transaction() as tx:
            tx.upsert(
                name, rows("x", rng.sample(range(1800), 60), f"a{step}-", rng).select(["p", "k", "b"]), update=True
            )
            tx.upsert(name, rows("x", rng.sample(range(1800), 30) + [3000 + step, 2000 + step], f"w{step}-", rng))
            tx.delete_keys(name, keys_of("x", rng.sample(range(1800), 20) + [5000]))
            tx.upsert(name, pa.table({"p": ["x"], "k": pa.array([2050 + step], pa.int64()), "c": [0.5]}), update=True)
            tx.upsert(
                name, rows("x", [5000 + step, 5001 + step], f"n{step}-", rng).select(["p", "k", "a"]), update=True
            )
            tx.lock_keys(name, keys_of("x", rng.sample(range(1800), 10) + [3005]))
        snaps.append(tx.csn)
    expected = as_set(c0.read(name))
    assert spark_set(mspark.read_table(spark, name)) == expected
    assert "(overlay)" in roads_of(caplog) and "keys of those alone" in roads_of(caplog), roads_of(caplog)
    assert {r for r in expected if r[1] in (3000, 2001, 2050, 5003)} and not {r for r in expected if r[1] == 3005}
    old = snaps[0]
    assert spark_set(mspark.read_table(spark, name, snapshot=old)) == as_set(c0.read(name, snapshot=old))
    assert "(overlay)" in roads_of(caplog), roads_of(caplog)
    for where, expr in [
        ([("k", ">=", 1500)], pc.field("k") >= 1500),
        ([("b", "<", 300)], pc.field("b") < 300),
        ([("c", ">", 0.5)], pc.field("c") > 0.5),
    ]:
        assert spark_set(mspark.read_table(spark, name, where=where)) == as_set(c0.read(name, where=expr)), where


def test_direct_parts_newer_than_small_ones_merge_by_version(
    spark, c0: Client, caplog: pytest.LogCaptureFixture, folding: None
) -> None:
    """The by-version road: a big insert committed after a small upsert, holding some of its keys,
    is read as it is and must win over it for those keys (and the small upsert over the older big
    part): each direct row and column takes the later of its own version and the small fold's."""
    caplog.set_level("DEBUG", logger="spark.keysfold")
    rng = random.Random(77)
    name = "nk_by_version"
    c0.create_table(name, SCHEMA, primary_key=("p", "k"), conflict_policy="keys", auto_merge=False)
    with c0.transaction() as tx:
        tx.insert(name, rows("x", list(range(1000)), "s-", rng))
    with c0.transaction() as tx:
        tx.upsert(name, rows("x", rng.sample(range(1000), 100), "u-", rng).select(["p", "k", "a"]), update=True)
        tx.upsert(name, rows("x", list(range(5000, 5020)), "n-", rng).select(["p", "k", "b"]), update=True)
        tx.delete_keys(name, keys_of("x", rng.sample(range(1000), 20)))
        tx.upsert(name, rows("x", rng.sample(range(1000), 20), "w-", rng))
    small = tx.csn
    with c0.transaction() as tx:
        tx.insert(name, rows("x", list(range(1000, 3000)) + list(range(5000, 5010)), "t-", rng))
    assert spark_set(mspark.read_table(spark, name)) == as_set(c0.read(name))
    said = roads_of(caplog)
    assert "2 parts read as they are" in said and "(by version), 10 keys of those alone" in said, said
    assert spark_set(mspark.read_table(spark, name, snapshot=small)) == as_set(c0.read(name, snapshot=small))
    assert "(overlay)" in roads_of(caplog), roads_of(caplog)
