"""Keys tables through the Spark data source (docs/rules.md#reads-and-the-fold: Spark sees one row
per key): a write is rows by key in overwrite mode, a read folds versions per partition, the key
conflicts (docs/rules.md#locks) and serializable write skew hold for writes that join a transaction
(option ``txn``), and ``changes`` reads row changes. Real Spark, ZooKeeper and replicas.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support.cluster import make_cluster
from test_spark import frame, new_session, reader, writer

import coordinator
from coordinator.errors import ConflictError

pytestmark = pytest.mark.slow

SCHEMA = pa.schema(
    [
        pa.field("p", pa.string(), nullable=False),
        pa.field("k", pa.int64(), nullable=False),
        pa.field("a", pa.string()),
        pa.field("b", pa.int64()),
    ]
)
DDL = "p string, k bigint, a string, b bigint"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    with make_cluster(tmp_path_factory, None, "sparkkeys", replicas=2) as c:
        yield c


@pytest.fixture(scope="module")
def spark(cluster: coordinator.LocalCluster):
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    session = new_session("mergetxn-keys-tests")
    yield session
    session.stop()


_n = iter(range(10**6))


def new_table(client, **kw) -> str:
    name = f"sk{next(_n)}"
    client.create_table(name, SCHEMA, partition_by=("p",), primary_key=("p", "k"), conflict_policy="keys", **kw)
    return name


def rowset(rows) -> set[tuple]:
    return {(r["p"], r["k"], r["a"], r["b"]) for r in rows}


def test_spark_writes_by_key_and_reads_one_row_per_key(cluster, spark) -> None:
    c = cluster.client(0)
    r0 = cluster.replica_addresses[0]
    name = new_table(c)
    first = [("x", i, f"a{i}", i) for i in range(20)] + [("y", i, "y", i) for i in range(5)]
    writer(frame(spark, first, slices=3, ddl=DDL), r0).save(name)
    # a second write of some keys replaces their rows (overwrite mode: b of the new rows null)
    writer(frame(spark, [("x", i, "new", None) for i in range(0, 20, 2)], ddl=DDL), r0).save(name)
    with c.transaction() as tx:
        tx.delete_keys(name, pa.table({"p": ["y"], "k": pa.array([0], pa.int64())}))
    expected = rowset(c.read(name).to_pylist())
    assert len(expected) == 24 and ("x", 2, "new", None) in expected and ("x", 3, "a3", 3) in expected
    got = reader(spark, r0).load(name)
    assert rowset(r.asDict() for r in got.collect()) == expected
    # a filter on a partition column prunes partitions; one on another column filters after the fold
    assert rowset(r.asDict() for r in got.where("p = 'y'").collect()) == {t for t in expected if t[0] == "y"}
    assert rowset(r.asDict() for r in got.where("a = 'a2'").collect()) == set()  # its newest version says 'new'
    # overwrite mode replaces the partitions written
    writer(frame(spark, [("y", 100, "only", 1)], ddl=DDL), r0, mode="overwrite").save(name)
    after = rowset(c.read(name).to_pylist())
    assert {t for t in after if t[0] == "y"} == {("y", 100, "only", 1)} and len(after) == 21
    # changes through Spark are row changes per key
    ch = reader(spark, r0, changes_from=str(tx.csn)).load(name).collect()
    assert sorted((r["_change"], r["k"]) for r in ch) == sorted(
        [("delete", k) for k in range(1, 5)] + [("insert", 100)]
    )


def test_seed_003_conflict_through_spark_writes(cluster, spark) -> None:
    """A and B start together; A writes k and commits; B's Spark write of k (joined to B)
    must fail at B's commit, naming the key; a different key commits."""
    c0, c1 = cluster.client(0), cluster.client(1)
    name = new_table(c0)
    with c0.transaction() as tx:
        c0_csn = tx.insert(name, pa.Table.from_pylist([{"p": "x", "k": 1, "a": "0", "b": 0}], schema=SCHEMA))
    c1.wait_for(c0.snapshot())
    a, b, other = c0.begin(), c1.begin(), c1.begin()
    a.upsert(name, pa.Table.from_pylist([{"p": "x", "k": 1, "a": "A", "b": 1}], schema=SCHEMA))
    writer(frame(spark, [("x", 1, "B", 2)], ddl=DDL), cluster.replica_addresses[1], txn=b.id).save(name)
    writer(frame(spark, [("x", 2, "other", 3)], ddl=DDL), cluster.replica_addresses[1], txn=other.id).save(name)
    a.commit()
    with pytest.raises(ConflictError) as e:
        b.commit()
    assert "'k': 1" in e.value.message and name in e.value.message and a.id in e.value.message
    other.commit()
    c0.wait_for(other.csn)
    assert rowset(c0.read(name).to_pylist()) == {("x", 1, "A", 1), ("x", 2, "other", 3)}
    assert c0_csn == 1


def test_write_skew_through_spark_is_prevented_under_serializable(cluster, spark) -> None:
    """Two serializable transactions each read both rows of an invariant (through Spark's
    ``txn``-joined read is not available, so through tx.read) and each write one row through a
    Spark write joined to it: exactly one commits."""
    c0, c1 = cluster.client(0), cluster.client(1)
    name = new_table(c0)
    with c0.transaction() as tx:
        tx.insert(
            name,
            pa.Table.from_pylist(
                [{"p": "x", "k": 1, "a": "on", "b": 1}, {"p": "x", "k": 2, "a": "on", "b": 1}], schema=SCHEMA
            ),
        )
    c1.wait_for(tx.csn)
    t1, t2 = c0.begin(isolation="serializable"), c1.begin(isolation="serializable")
    for t in (t1, t2):
        assert t.read(name, where=pc.field("a") == "on").num_rows == 2
    writer(frame(spark, [("x", 1, "off", 0)], ddl=DDL), cluster.replica_addresses[0], txn=t1.id).save(name)
    writer(frame(spark, [("x", 2, "off", 0)], ddl=DDL), cluster.replica_addresses[1], txn=t2.id).save(name)
    outcomes = []
    for t in (t1, t2):
        try:
            t.commit()
            outcomes.append("committed")
        except ConflictError:
            outcomes.append("failed")
    assert sorted(outcomes) == ["committed", "failed"]
    c0.wait_for(c1.snapshot())
    assert sorted(r["a"] for r in c0.read(name).to_pylist()) == ["off", "on"]


def test_the_data_source_reads_a_keys_table_by_deletion_vectors(cluster, spark) -> None:
    """Inserts, upserts (in update mode too), deletes and locks over two partitions: the data source reads the parts
    minus their deletion vectors, one task per part (``split_bytes`` 1; the fold plans one per
    table partition), pruning parts by their statistics too, and gives the fold's rows at an
    older and the latest snapshot, with and without filters pushed."""
    c = cluster.client(0)
    r0 = cluster.replica_addresses[0]
    name = new_table(c, auto_merge=False)
    csns = []
    for step in range(6):
        with c.transaction() as tx:
            keys = list(range(step * 3, step * 3 + 12))
            tx.upsert(
                name,
                pa.table(
                    {"p": ["x" if k % 3 else "y" for k in keys], "k": keys, "a": [f"s{step}"] * 12, "b": keys},
                    schema=SCHEMA,
                ),
            )
            if step == 4:  # update mode: whole rows (b read at write time)
                tx.upsert(
                    name, pa.table({"p": ["x", "y"], "k": pa.array([2, 3], pa.int64()), "a": ["u", "v"]}), update=True
                )
            if step % 2:
                tx.delete_keys(name, pa.table({"p": ["x"], "k": pa.array([step * 3 + 1], pa.int64())}))
                tx.lock_keys(name, pa.table({"p": ["y"], "k": pa.array([0], pa.int64())}))
        csns.append(tx.csn)
    folding = cluster.client(0)
    call = folding.call
    folding.call = lambda action, **args: call(action, **{k: v for k, v in args.items() if k != "vectors"})
    for snap in (csns[2], csns[-1]):
        want = rowset(folding.read(name, snapshot=snap).to_pylist())
        df = reader(spark, r0, snapshot=str(snap), split_bytes="1").load(name)
        parts = len(c.call("visible", table=name, snapshot=snap, lease="none")["parts"])
        assert df.rdd.getNumPartitions() == parts > 2, "one read task per part: no fold"
        assert rowset(r.asDict() for r in df.collect()) == want, snap
        for where, keep in (("a = 's1'", lambda t: t[2] == "s1"), ("k >= 12", lambda t: t[1] >= 12)):
            assert rowset(r.asDict() for r in df.where(where).collect()) == {t for t in want if keep(t)}, where
