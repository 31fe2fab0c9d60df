"""Keys tables through every statement and read path besides insert/upsert/delete
(docs/rules.md#reads-and-the-fold: reads, ``changes`` and Spark see one row per key): ``changes``,
``scan`` (the command line's read), overwrite, truncate, update, and parts written elsewhere
(``add_parts``/``commit_parts``), against a real ZooKeeper and replicas.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support.cluster import make_cluster

from coordinator.core import keyfold, keytables
from coordinator.errors import ConflictError, InvalidInput
from mergetxn.client import Client
from mergetxn.local.zkserver import ZooKeeperServer
from parts.io.format import write_part

SCHEMA = pa.schema(
    [
        pa.field("p", pa.string(), nullable=False),
        pa.field("k", pa.int64(), nullable=False),
        pa.field("a", pa.string()),
        pa.field("b", pa.int64()),
    ]
)
KEY = ("p", "k")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator:
    with make_cluster(tmp_path_factory, zk_server, "keysops", replicas=2) as c:
        yield c


_n = iter(range(10**6))


def new_table(c: Client, partitioned: bool = True, **kw) -> str:
    name = f"ko{next(_n)}"
    c.create_table(
        name, SCHEMA, partition_by=("p",) if partitioned else (), primary_key=KEY, conflict_policy="keys", **kw
    )
    return name


def rows(*items: tuple) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(("p", "k", "a", "b"), it)) for it in items], schema=SCHEMA)


def as_set(t: pa.Table) -> set[tuple]:
    return {tuple(r.values()) for r in t.to_pylist()}


# ---------------------------------------------------------------------------------------------
# Pure: row changes


def test_row_changes_fold_commits_in_order() -> None:
    def v(data: list[dict], op: int, seq: int) -> pa.Table:
        t = pa.Table.from_pylist(data, schema=pa.schema([SCHEMA.field(n) for n in data[0]]))
        return keytables.versions(SCHEMA, KEY, "t", t, op, seq)

    before = rows(("x", 1, "old", 1), ("x", 2, "two", 2))
    commits = [
        (
            5,
            [
                v([{"p": "x", "k": 1, "b": 10}], keytables.UPDATE, 1),
                v([{"p": "x", "k": 3, "a": "new"}], keytables.PUT, 2),
            ],
        ),
        (
            6,
            [
                v([{"p": "x", "k": 2}], keytables.DELETE, 1),
                v([{"p": "x", "k": 9}], keytables.DELETE, 2),
                v([{"p": "x", "k": 3}], keytables.LOCK_STRONG, 3),
            ],
        ),
        (7, [v([{"p": "x", "k": 1, "a": "old", "b": 10}], keytables.PUT, 1)]),  # same values: nothing
    ]
    got = keyfold.row_changes(SCHEMA, KEY, before, commits).to_pylist()
    assert got == [
        {"p": "x", "k": 1, "a": "old", "b": 1, "_change": "delete", "_csn": 5},
        {"p": "x", "k": 1, "a": "old", "b": 10, "_change": "insert", "_csn": 5},
        {"p": "x", "k": 3, "a": "new", "b": None, "_change": "insert", "_csn": 5},
        {"p": "x", "k": 2, "a": "two", "b": 2, "_change": "delete", "_csn": 6},
    ]


def replay(before: set[tuple], changes: pa.Table) -> set[tuple]:
    out = set(before)
    for r in changes.to_pylist():
        t = (r["p"], r["k"], r["a"], r["b"])
        if r["_change"] == "delete":
            out.remove(t)
        else:
            out.add(t)
    return out


# ---------------------------------------------------------------------------------------------
# Against a cluster


def test_changes_of_a_keys_table_add_up_to_the_reads(cluster) -> None:
    """Replaying ``changes`` over (s0, s] onto the read at s0 gives the read at s, for every s,
    by id and by time; each change row is one key's row before or after a commit."""
    c = cluster.client(0)
    # Its own retention window: the session's 0 s cleanup may forget the history of early
    # snapshots before they are read and replayed (SnapshotUnavailable on a loaded machine).
    name = new_table(c, retention_seconds=3600)
    rng = random.Random(7)
    with c.transaction() as tx:
        tx.insert(name, rows(("x", 1, "a", 1), ("y", 2, "b", 2)))
    snaps = [c.snapshot()]
    for i in range(12):
        with c.transaction() as tx:
            k = rng.randrange(5)
            p = rng.choice("xy")
            op = rng.randrange(4)
            if op == 0:
                tx.insert(name, rows((p, k, f"v{i}", i)))
            elif op == 1:
                tx.upsert(
                    name,
                    pa.table({"p": [p], "k": pa.array([k], pa.int64()), "b": pa.array([i], pa.int64())}),
                    update=True,
                )
            elif op == 2:
                tx.delete_keys(name, pa.table({"p": [p], "k": pa.array([k], pa.int64())}))
            else:
                tx.insert(name, rows((p, k, f"w{i}", None), (p, k + 10, "z", 0)))
        snaps.append(tx.csn)
    reads = {s: as_set(c.read(name, snapshot=s)) for s in snaps}
    for lo in snaps:
        for hi in snaps:
            if hi > lo:
                ch = c.changes(name, lo, hi)
                assert ch.schema.names == [*SCHEMA.names, "_change", "_csn"]
                assert replay(reads[lo], ch) == reads[hi], (lo, hi)
                assert all(lo < x <= hi for x in ch.column("_csn").to_pylist())
    # by time: the whole range equals by id
    full = c.changes(name, snaps[0])
    assert replay(reads[snaps[0]], full) == reads[snaps[-1]]


def test_changes_of_a_keys_table_show_one_row_per_key_per_commit(cluster) -> None:
    c = cluster.client(0)
    name = new_table(c)
    with c.transaction() as tx:
        tx.insert(name, rows(("x", 1, "a", 1)))
    s0 = tx.csn
    with c.transaction() as tx:  # three versions of one key in one commit: one change pair
        tx.insert(name, rows(("x", 1, "b", 2)))
        tx.upsert(
            name, pa.table({"p": ["x"], "k": pa.array([1], pa.int64()), "b": pa.array([3], pa.int64())}), update=True
        )
        tx.lock_keys(name, pa.table({"p": ["x"], "k": pa.array([1], pa.int64())}), mode="shared_weak")
    got = c.changes(name, s0).to_pylist()
    assert [(r["_change"], r["a"], r["b"], r["_csn"]) for r in got] == [
        ("delete", "a", 1, tx.csn),
        ("insert", "b", 3, tx.csn),
    ]


def test_scan_and_cli_read_fold_versions(cluster, tmp_path) -> None:
    from click.testing import CliRunner

    from mergetxn.cli import cli

    c = cluster.client(0)
    name = new_table(c)
    with c.transaction() as tx:
        tx.insert(name, rows(("x", 1, "a", 1), ("y", 2, "b", 2), ("y", 3, "c", 3)))
    with c.transaction() as tx:
        tx.insert(name, rows(("x", 1, "A", 10)))
        tx.delete_keys(name, pa.table({"p": ["y"], "k": pa.array([3], pa.int64())}))
    expected = as_set(c.read(name))
    assert expected == {("x", 1, "A", 10), ("y", 2, "b", 2)}
    with c.scan(name) as (snap, metas, tables):
        got = list(tables)
    assert len(got) == 2 and set().union(*(as_set(t) for t in got)) == expected  # one table per partition
    out = tmp_path / "out.parquet"
    r = CliRunner(env={"MERGETXN_REPLICA": cluster.replica_addresses[0]}).invoke(
        cli, ["read", name, "--output", str(out)]
    )
    assert r.exit_code == 0, r.output
    import pyarrow.parquet as pq

    assert as_set(pq.read_table(out)) == expected
    assert "wrote 2 rows" in r.output


def test_overwrite_truncate_update_on_keys_tables(cluster) -> None:
    c = cluster.client(0)
    name = new_table(c)
    with c.transaction() as tx:
        tx.insert(name, rows(("x", 1, "a", 1), ("x", 2, "b", 2), ("y", 3, "c", 3)))
    with c.transaction() as tx:  # overwrite partition x: key 2 goes, key 1 replaced, key 4 new
        assert tx.overwrite(name, rows(("x", 1, "A", None), ("x", 4, "d", 4))) == 2
        assert as_set(tx.read(name)) == {("x", 1, "A", None), ("x", 4, "d", 4), ("y", 3, "c", 3)}
    assert as_set(c.read(name)) == {("x", 1, "A", None), ("x", 4, "d", 4), ("y", 3, "c", 3)}
    with c.transaction() as tx:
        assert tx.update(name, pc.field("k") >= 3, {"b": pc.field("b") + 100, "a": "u"}) == 2
    assert as_set(c.read(name)) == {("x", 1, "A", None), ("x", 4, "u", 104), ("y", 3, "u", 103)}
    with c.transaction() as tx, pytest.raises(InvalidInput, match="cannot set primary key"):
        tx.update(name, pc.field("k") == 1, {"k": 5})
    with c.transaction() as tx:
        assert tx.truncate(name, partitions=["x"]) == 2
    assert as_set(c.read(name)) == {("y", 3, "u", 103)}
    with c.transaction() as tx:
        assert tx.truncate(name) == 1
    assert c.read(name).num_rows == 0
    with c.transaction() as tx, pytest.raises(InvalidInput, match="outside the partitions given"):
        tx.overwrite(name, rows(("x", 1, "a", 1)), partitions=["y"])


def test_update_takes_only_the_written_columns_locks(cluster) -> None:
    """tx.update on a keys table writes update-mode versions: a concurrent writer of another
    lock group of the same row commits too; one of the same group loses."""
    a, b = cluster.client(0), cluster.client(1)
    name = new_table(a, lock_groups={"ga": ["a"], "gb": ["b"]})
    with a.transaction() as tx:
        tx.insert(name, rows(("x", 1, "a", 1)))
    b.wait_for(tx.csn)
    t1, t2, t3 = a.begin(), b.begin(), b.begin()
    t1.update(name, pc.field("k") == 1, {"a": "new"})
    t2.update(name, pc.field("k") == 1, {"b": 5})
    t3.update(name, pc.field("k") == 1, {"a": "other"})
    t1.commit()
    t2.commit()
    with pytest.raises(ConflictError, match="key"):
        t3.commit()
    a.wait_for(t2.csn)
    assert as_set(a.read(name)) == {("x", 1, "new", 5)}


def test_parts_written_elsewhere_must_be_versions(cluster) -> None:
    c = cluster.client(0)
    name = new_table(c, partitioned=False)
    tdef = c.table(name)
    with c.transaction() as tx:
        tx.insert(name, rows(("x", 1, "a", 1), ("x", 2, "b", 2)))
    v = keytables.versions(tdef.schema, KEY, name, rows(("x", 1, "new", 5)), keytables.PUT, 1)
    meta = write_part(c.storage, name, [], (), v, "spark-job", tdef.ddl_version)
    c.commit_parts(name, [meta])
    assert as_set(c.read(name)) == {("x", 1, "new", 5), ("x", 2, "b", 2)}
    plain = write_part(c.storage, name, [], (), rows(("x", 3, "c", 3)), "spark-job", tdef.ddl_version)
    before = c.snapshot()
    with pytest.raises(InvalidInput, match="hold rows, not versions"):
        c.commit_parts(name, [plain])
    assert c.snapshot() == before
    with pytest.raises(InvalidInput, match="op='overwrite'"):
        c.commit_parts(name, [meta], op="overwrite")
    v2 = keytables.versions(tdef.schema, KEY, name, rows(("x", 7, "only", 7)), keytables.PUT, 1)
    with c.transaction() as tx:
        tx.add_parts(name, [write_part(c.storage, name, [], (), v2, tx.id, tdef.ddl_version)], op="overwrite")
    assert as_set(c.read(name)) == {("x", 7, "only", 7)}


def test_serializable_read_of_a_keys_table_sees_overwrites_with_other_values() -> None:
    """Pure: a later version of a key whose values no longer match a read's predicate still
    changes what the read returned (the row it matched is gone): only key statistics prune."""
    from coordinator.core.readsets import Read, Shape, Touch, may_touch
    from coordinator.core.tabledata import encode_expression

    read = Read("t", encode_expression(pc.field("a") == "on", SCHEMA))
    touch = Touch("tid", 5, "t", "part", ("x",), {"a": ("off", "off"), "k": (1, 1), "p": ("x", "x")})
    assert not may_touch(read, touch, Shape(("p",), SCHEMA))  # a parts table: the stats rule it out
    assert may_touch(read, touch, Shape(("p",), SCHEMA, KEY))
    by_key = Read("t", encode_expression(pc.field("k") == 2, SCHEMA))
    assert not may_touch(by_key, touch, Shape(("p",), SCHEMA, KEY))  # key stats still prune


def test_write_skew_on_a_keys_table_is_prevented_under_serializable(cluster) -> None:
    a, b = cluster.client(0), cluster.client(1)
    name = new_table(a)
    with a.transaction() as tx:
        tx.insert(name, rows(("x", 1, "on", 1), ("x", 2, "on", 1)))
    b.wait_for(tx.csn)
    t1, t2 = a.begin(isolation="serializable"), b.begin(isolation="serializable")
    for t in (t1, t2):
        assert t.read(name, where=pc.field("a") == "on").num_rows == 2
    t1.upsert(name, rows(("x", 1, "off", 0)))
    t2.upsert(name, rows(("x", 2, "off", 0)))
    t1.commit()
    with pytest.raises(ConflictError, match="READ_SET_CHANGED|read"):
        t2.commit()


def test_changes_leave_compactions_out(cluster) -> None:
    """A compaction of a keys table writes no new version: ``changes`` over a range with one
    shows only the writers' row changes, and still adds up to the reads."""
    c = cluster.client(0)
    name = new_table(c, auto_merge=False)
    with c.transaction() as tx:
        tx.insert(name, rows(("x", 1, "a", 1), ("x", 2, "b", 2)))
    s0 = tx.csn
    with c.transaction() as tx:
        tx.insert(name, rows(("x", 1, "A", 10)))
    c.compact(name, kind="major")
    with c.transaction() as tx:
        tx.delete_keys(name, pa.table({"p": ["x"], "k": pa.array([2], pa.int64())}))
    ch = c.changes(name, s0)
    assert [(r["_change"], r["k"], r["a"]) for r in ch.to_pylist()] == [
        ("delete", 1, "a"),
        ("insert", 1, "A"),
        ("delete", 2, "b"),
    ]
    assert replay(as_set(c.read(name, snapshot=s0)), ch) == as_set(c.read(name))


def test_changes_ignore_a_compaction_that_committed_after_a_newer_write(cluster) -> None:
    """A compaction staged before a writer commits and committed after it holds an older
    version of the writer's key (ordered by its ``_ver``): were its output a write, ``changes``
    would show the row going back."""
    c = cluster.client(0)
    name = new_table(c, auto_merge=False)
    with c.transaction() as tx:
        tx.insert(name, rows(("x", 1, "a", 1)))
    with c.transaction() as tx:
        tx.insert(name, rows(("x", 2, "b", 2)))
    s0 = tx.csn
    comp = c.begin()
    assert comp.compact(name, kind="major") == 2
    with c.transaction() as w:
        w.insert(name, rows(("x", 1, "new", 5)))
    comp.commit()
    assert comp.csn > w.csn
    assert as_set(c.read(name)) == {("x", 1, "new", 5), ("x", 2, "b", 2)}
    ch = c.changes(name, s0)
    assert [(r["_change"], r["a"], r["_csn"]) for r in ch.to_pylist()] == [
        ("delete", "a", w.csn),
        ("insert", "new", w.csn),
    ]
