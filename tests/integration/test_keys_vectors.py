"""Whole reads of keys tables by deletion vectors (replicas/vectors.py,
docs/architecture/keys-vectors.md) on a real LocalCluster: at every snapshot of a random history
(inserts, overwrite upserts, deletes by key, read locks, a key written twice in a transaction,
two partitions, minor and major compactions), on a replica that follows the history forward and
on one that derived them at the end, after a restart too, a read by vectors gives exactly what
the fold gives (a client that asks for no vectors folds), with filters and through every engine's
dataset too. And the cases where the replica does
not send vectors (an update-mode version last, a snapshot older than they were derived at) still
read right, by the fold."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from support.cluster import make_cluster
from support.folding import folding

from coordinator.core import keytables
from coordinator.errors import CorruptMetadata
from mergetxn.client import Client
from mergetxn.local.cluster import LocalCluster
from mergetxn.local.zkserver import ZooKeeperServer
from parts.io.dataset import duckdb_view

pytestmark = pytest.mark.zk

KEEP = {"retention_seconds": 3600}  # tables whose older snapshots are read: cleanup keeps their parts
SCHEMA = pa.schema([pa.field("p", pa.int64(), False), pa.field("k", pa.int64(), False), ("v", pa.string())])


@pytest.fixture(scope="module")
def cluster(zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with make_cluster(tmp_path_factory, zk_server, "vectors", replicas=2) as c:
        yield c


def rows(pairs: list[tuple[int, int]], tag: str) -> pa.Table:
    return pa.table(
        {"p": [p for p, _ in pairs], "k": [k for _, k in pairs], "v": [f"{tag}{p}.{k}" for p, k in pairs]},
        schema=SCHEMA,
    )


def by_fold(c: Client, table: str, snapshot: int, where: pc.Expression | None = None) -> list[dict]:
    """The same read folded, by a client of the same replica that asks for no vectors."""
    return folding(Client(c.address, credentials=c.credentials)).read(table, snapshot=snapshot, where=where).to_pylist()


def sent_vectors(c: Client, table: str, snapshot: int | None = None) -> bool:
    args = {} if snapshot is None else {"snapshot": snapshot}
    return "vectors" in c.call("visible", table=table, vectors=True, lease="none", **args)


KINDS = ["insert", "insert", "upsert", "delete", "twice", "lock", "minor", "major"]
Op = tuple[str, list[tuple[int, int]]]


def history(c: Client, table: str, seed: int, commits: int = 30) -> list[int]:
    """A random history of commits on two partitions; the CSN after each."""
    rng = random.Random(seed)
    ops = [
        (rng.choice(KINDS), [(rng.randrange(2), rng.randrange(12)) for _ in range(rng.randint(1, 6))])
        for _ in range(commits)
    ]
    return apply(c, table, ops)


def apply(c: Client, table: str, ops: list[Op]) -> list[int]:
    """Each of ``ops`` (a kind, keys) a commit or a compaction; the CSN after each."""
    csns = []
    for i, (what, pairs) in enumerate(ops):
        keys = sorted(set(pairs))
        if what in ("minor", "major"):
            c.compact(table, kind=what)
        else:
            with c.transaction() as tx:
                if what == "insert":
                    tx.insert(table, rows(keys, f"i{i}-"))
                elif what == "upsert":
                    tx.upsert(table, rows(keys[:3], f"u{i}-"))
                elif what == "delete":
                    tx.delete_keys(table, rows(keys[:2], "").select(["p", "k"]))
                elif what == "twice":
                    tx.insert(table, rows([(0, 1), (1, 2)], f"a{i}-"))
                    tx.delete_keys(table, rows([(0, 1)], "").select(["p", "k"]))
                    tx.upsert(table, rows([(1, 2), (1, 3)], f"b{i}-"))
                else:
                    tx.lock_keys(table, rows(pairs[:2], "").select(["p", "k"]))
                    tx.insert(table, rows([(0, 11)], f"l{i}-"))
        csns.append(c.snapshot())
    return csns


def test_reads_by_vectors_are_the_fold_at_every_snapshot(cluster: LocalCluster) -> None:
    a, b = cluster.client(0), cluster.client(1)
    table = "dv_history"
    a.wait_for(
        a.create_table(table, SCHEMA, primary_key=("p", "k"), partition_by=("p",), conflict_policy="keys", **KEEP)
    )
    first = a.snapshot()
    assert a.read(table).num_rows == 0 and sent_vectors(a, table)  # a derives them here and follows
    csns = history(a, table, seed=7)
    b.wait_for(csns[-1])
    used = 0
    for s in [first, *csns]:
        want = by_fold(a, table, s)
        assert a.read(table, snapshot=s).to_pylist() == want, f"replica 0 at {s}"
        used += sent_vectors(a, table, s)
    assert used == len(csns) + 1, "replica 0 folded a whole read it had vectors for"
    assert b.read(table).to_pylist() == by_fold(b, table, csns[-1]) and sent_vectors(b, table)
    assert [b.read(table, snapshot=s).to_pylist() for s in csns] == [by_fold(b, table, s) for s in csns]
    assert not sent_vectors(b, table, csns[0]), "older than where replica 1 derived them"


def test_a_table_dropped_and_created_again_gets_vectors_of_its_own(cluster: LocalCluster) -> None:
    """A keys table read by vectors, dropped, and created again under its name with a string key:
    whole reads of the new table are by vectors and the fold's (the replica kept the dropped
    table's vectors under the name, and every read of the new one failed comparing int keys with
    str), and a snapshot of the dropped table still reads as its fold."""
    a = cluster.client(0)
    table = "dv_again"
    a.wait_for(a.create_table(table, SCHEMA, primary_key=("p", "k"), conflict_policy="keys", **KEEP))
    for keys, tag in (([(0, 1), (0, 2), (0, 3)], "x"), ([(0, 2)], "y")):
        with a.transaction() as tx:
            tx.upsert(table, rows(keys, tag))
    old = a.snapshot()
    assert a.read(table).num_rows == 3 and sent_vectors(a, table)
    a.drop_table(table)
    strings = pa.schema([pa.field("p", pa.int64(), False), pa.field("k", pa.string(), False), ("v", pa.string())])
    a.wait_for(a.create_table(table, strings, primary_key=("p", "k"), conflict_policy="keys", **KEEP))
    for i in range(3):
        with a.transaction() as tx:
            tx.upsert(table, pa.table({"p": [0, 0], "k": ["2", "b"], "v": [f"n{i}", f"m{i}"]}, schema=strings))
    assert a.read(table).to_pylist() == [{"p": 0, "k": "2", "v": "n2"}, {"p": 0, "k": "b", "v": "m2"}]
    assert a.read(table).to_pylist() == by_fold(a, table, a.snapshot()) and sent_vectors(a, table)
    assert a.read(table, snapshot=old).to_pylist() == by_fold(a, table, old)
    assert [r["v"] for r in a.read(table, snapshot=old).to_pylist()] == ["x0.1", "y0.2", "x0.3"]


def test_followed_over_many_commits_at_once(cluster: LocalCluster) -> None:
    """Reads every few commits: the vectors follow several commits in one go (parts added and
    merged away between two reads among them)."""
    a = cluster.client(0)
    table = "dv_steps"
    a.wait_for(
        a.create_table(table, SCHEMA, primary_key=("p", "k"), partition_by=("p",), conflict_policy="keys", **KEEP)
    )
    assert sent_vectors(a, table)
    csns = history(a, table, seed=3, commits=8)
    csns += history(a, table, seed=5, commits=8)
    for s in csns[3::4]:
        assert a.read(table, snapshot=s).to_pylist() == by_fold(a, table, s), f"at {s}"
    cols = a.read(table, columns=["v", "k"])
    assert cols.to_pylist() == [{"v": r["v"], "k": r["k"]} for r in by_fold(a, table, csns[-1])]


WIDE = pa.schema([pa.field("k", pa.int64(), False), ("v", pa.string()), ("w", pa.int64())])
GROUPS = {"gv": ["v"], "gw": ["w"]}


def wide_table(c: Client, table: str) -> None:
    """A keys table of ``WIDE`` (``v`` and ``w`` in lock groups of their own), keys 1-4 in it."""
    c.wait_for(c.create_table(table, WIDE, primary_key=("k",), conflict_policy="keys", lock_groups=GROUPS, **KEEP))
    with c.transaction() as tx:
        tx.insert(table, pa.table({"k": [1, 2, 3, 4], "v": ["x"] * 4, "w": [10, 20, 30, 40]}, schema=WIDE))


def only(column: str, keys: list[int], values: list[Any]) -> pa.Table:
    """Rows of ``keys`` writing ``column`` alone (update mode keeps the other)."""
    return pa.table({"k": pa.array(keys, pa.int64()), column: pa.array(values, WIDE.field(column).type)})


def test_update_mode_writes_whole_rows_that_read_by_vectors(cluster: LocalCluster) -> None:
    """Update-mode upserts and UPDATE statements write whole rows (the unwritten column's value
    at the transaction's snapshot with its own writes), so the replica takes them as they are:
    every snapshot reads by vectors, as the fold."""
    a = cluster.client(0)
    table = "dv_update_whole"
    wide_table(a, table)
    csns = [a.snapshot()]
    with a.transaction() as tx:
        tx.upsert(table, only("v", [1, 5], ["a", "new"]), update=True)  # 5: no row yet, w null
    csns.append(a.snapshot())
    with a.transaction() as tx:
        tx.upsert(table, only("w", [1], [11]), update=True)
        tx.upsert(table, only("v", [1], ["b"]), update=True)  # on its own write
        tx.delete_keys(table, only("v", [2], ["-"]).select(["k"]))
        tx.upsert(table, only("v", [2], ["again"]), update=True)  # on its own delete: w null
        tx.upsert(table, only("w", [3, 3], [31, 32]), update=True)  # twice in one write
    csns.append(a.snapshot())
    with a.transaction() as tx:
        tx.update(table, pc.field("k") == 4, {"v": "set"})
    csns.append(a.snapshot())
    for s in csns:  # oldest first: vectors answer from the snapshot they were first derived at
        assert sent_vectors(a, table, s), f"at {s}: an update written whole was not read by vectors"
        assert a.read(table, snapshot=s).to_pylist() == by_fold(a, table, s), f"at {s}"
    assert a.read(table).to_pylist() == [
        {"k": 1, "v": "b", "w": 11},
        {"k": 2, "v": "again", "w": None},
        {"k": 3, "v": "x", "w": 32},
        {"k": 4, "v": "set", "w": 40},
        {"k": 5, "v": "new", "w": None},
    ]


def test_concurrent_updates_of_other_lock_groups_both_hold(cluster: LocalCluster) -> None:
    """Two updates of one key's other lock groups from one snapshot both commit; the second's
    row carries the first's column as it was before, so the replica does not take it as whole:
    the read folds (both updates hold) until a major compaction writes the row whole."""
    a = cluster.client(0)
    table = "dv_update_groups"
    wide_table(a, table)
    t1, t2 = a.begin(), a.begin()
    t1.upsert(table, only("v", [1], ["t1"]), update=True)
    t2.upsert(table, only("w", [1], [12]), update=True)
    t1.commit()
    t2.commit()
    want = {"k": 1, "v": "t1", "w": 12}
    assert a.read(table, where=pc.field("k") < 3).to_pylist() == [want, {"k": 2, "v": "x", "w": 20}]
    assert a.read(table).to_pylist() == by_fold(a, table, a.snapshot())
    assert not sent_vectors(a, table), "an update carrying a column from before another's commit was taken as whole"
    a.compact(table, kind="major")
    assert sent_vectors(a, table) and a.read(table).to_pylist()[0] == want


@pytest.mark.parametrize("writer", ["lies", "before whole rows"])
def test_updates_not_written_whole_change_nothing_a_read_returns(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, writer: str
) -> None:
    """A writer that puts other values in the column it did not write (it holds no lock on it),
    or one from before whole rows (nulls there): nothing is believed; reads fold, return the
    column as it was, and read by vectors again once a major compaction wrote the rows whole
    (the conversion of a table written before)."""
    a = cluster.client(0)
    table = f"dv_update_{writer.split()[0]}"
    wide_table(a, table)
    fill = keytables.fill_columns

    def written(versions: pa.Table, current: pa.Table, pk: Any, columns: Any) -> pa.Table:
        if writer != "lies":
            return versions  # the unwritten column null, as writers before whole rows left it
        made = fill(versions, current, pk, columns)
        return made.set_column(made.schema.get_field_index("w"), "w", pa.array([999] * made.num_rows, pa.int64()))

    monkeypatch.setattr(keytables, "fill_columns", written)
    with a.transaction() as tx:
        tx.upsert(table, only("v", [1, 2], ["y", "z"]), update=True)
    monkeypatch.undo()
    want = [{"k": 1, "v": "y", "w": 10}, {"k": 2, "v": "z", "w": 20}]
    assert a.read(table, where=pc.field("k") < 3).to_pylist() == want
    assert a.read(table).to_pylist() == by_fold(a, table, a.snapshot())
    assert not sent_vectors(a, table), "rows not whole were taken as whole"
    a.compact(table, kind="major")
    assert sent_vectors(a, table) and a.read(table).to_pylist()[:2] == want


def test_a_restarted_replica_derives_them_again(cluster: LocalCluster) -> None:
    a = cluster.client(0)
    table = "dv_restart"
    a.wait_for(a.create_table(table, SCHEMA, primary_key=("p", "k"), conflict_policy="keys"))
    csns = history(a, table, seed=11, commits=12)
    cluster.kill_replica(0)
    cluster.start_replica(0)
    a = cluster.client(0)
    a.wait_for(csns[-1])
    assert a.read(table).to_pylist() == by_fold(a, table, csns[-1]) and sent_vectors(a, table)


def test_vectors_that_name_rows_a_part_lacks_are_refused(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = cluster.client(0)
    table = "dv_hostile"
    a.wait_for(a.create_table(table, SCHEMA, primary_key=("p", "k"), conflict_policy="keys"))
    with a.transaction() as tx:
        tx.insert(table, rows([(0, 1)], "x"))
    call = a.call

    def forged(action: str, **args: object) -> dict:
        r = call(action, **args)
        if action == "visible" and "vectors" in r:
            r["vectors"] = {n: "OjAAAAEAAAAAAAEAEAAAAAAAAQA=" for n in r["vectors"]}  # rows 0 and 1 of a 1-row part
        return r

    monkeypatch.setattr(a, "call", forged)
    with pytest.raises(CorruptMetadata, match="row 1 of a part of 1 rows"):
        a.read(table)


FILTERS = [
    pc.field("v") > "l",
    pc.field("p") == 1,
    (pc.field("k") >= 3) & (pc.field("k") < 8),
    pc.field("v").is_null() | (pc.field("k") == 4),
    pc.field("k") == 99,
]


OPS = st.lists(
    st.tuples(
        st.sampled_from(KINDS), st.lists(st.tuples(st.integers(0, 1), st.integers(0, 11)), min_size=1, max_size=6)
    ),
    min_size=1,
    max_size=14,
)
_tables = itertools.count()


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    phases=[Phase.generate],
)
@given(ops=OPS)
def test_every_reader_by_vectors_is_the_fold(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, ops: list[Op]
) -> None:
    """On generated histories (inserts, upserts, deletes, read locks, a key written twice in a
    transaction, minor and major compactions, two partitions), at every snapshot: a read with
    a filter that is not a point read, ``scan``, and the dataset through pyarrow, DuckDB
    (duckdb_view) and Polars give the rows of a client that asks for no vectors (the fold),
    and never fold (the fold is made to fail on this client)."""
    a = cluster.client(0)
    table = f"dv_every{next(_tables)}"
    a.wait_for(
        a.create_table(table, SCHEMA, primary_key=("p", "k"), partition_by=("p",), conflict_policy="keys", **KEEP)
    )
    assert sent_vectors(a, table)
    csns = apply(a, table, ops)

    def no_fold(*args: object, **kwargs: object) -> None:
        raise AssertionError("folded although the replica sent vectors")

    monkeypatch.setattr(a, "_fold_whole", no_fold)
    for s in csns:
        every_reader_is_the_fold(a, table, s)
    monkeypatch.undo()


def every_reader_is_the_fold(a: Client, table: str, s: int) -> None:
    for where in FILTERS:
        assert a.read(table, snapshot=s, where=where).to_pylist() == by_fold(a, table, s, where), (s, where)
    want = by_fold(a, table, s)
    with a.scan(table, snapshot=s) as (_, _, tables):
        assert [row for t in tables for row in t.to_pylist()] == want, f"scan at {s}"
    with a.dataset(table, snapshot=s) as d:
        assert d.to_table().to_pylist() == want, f"dataset at {s}"
        con = duckdb.connect()
        duckdb_view(con, "t", d)
        got = con.execute("SELECT p, k, v FROM t ORDER BY p, k").fetchall()
        assert got == [(r["p"], r["k"], r["v"]) for r in want], f"duckdb at {s}"
        assert pl.scan_pyarrow_dataset(d).sort(["p", "k"]).collect().to_dicts() == want, f"polars at {s}"


def test_a_filter_by_vectors_sees_only_live_rows(cluster: LocalCluster) -> None:
    """A filter that fails on a superseded row's values (a division by its zero) reads as the
    fold reads it: the vectors drop dead rows before the filter looks at any."""
    a = cluster.client(0)
    table = "dv_live_filter"
    schema = pa.schema([pa.field("k", pa.int64(), False), ("a", pa.int64()), ("b", pa.int64())])
    a.wait_for(a.create_table(table, schema, primary_key=("k",), conflict_policy="keys", auto_merge=False))
    with a.transaction() as tx:
        tx.insert(table, pa.table({"k": [1, 2], "a": [1, 4], "b": [0, 2]}, schema=schema))
    with a.transaction() as tx:
        tx.upsert(table, pa.table({"k": [1], "a": [3], "b": [1]}, schema=schema))
    assert sent_vectors(a, table)
    where = (pc.field("a") / pc.field("b")) > 1
    got = a.read(table, where=where).to_pylist()
    assert got == [{"k": 1, "a": 3, "b": 1}, {"k": 2, "a": 4, "b": 2}]
    assert got == by_fold(a, table, a.snapshot(), where)


def test_check_finds_the_followed_vectors_equal_to_those_derived_from_the_files(cluster: LocalCluster) -> None:
    """After a random history (compactions included) followed read by read, ``check`` derives
    the vectors again from the part files and finds each equal to the one followed; the
    checks that catch a follow gone wrong are in test_keys_vectors_replica.py."""
    a = cluster.client(0)
    table = "dv_check"
    a.wait_for(a.create_table(table, SCHEMA, primary_key=("p", "k"), partition_by=("p",), conflict_policy="keys"))
    assert sent_vectors(a, table)
    for seed in range(3):
        csns = history(a, table, seed=31 + seed, commits=10)
        assert a.read(table, snapshot=csns[-1]).to_pylist() == by_fold(a, table, csns[-1])
        result = a.check(table)
        assert result["ok"], result


def vectors_sent_to(c: Client) -> list[bool]:
    """Whether each ``visible`` answer to a transaction's whole read on ``c`` (``id`` and
    ``vectors`` asked) carried vectors."""
    call, seen = c.call, []

    def spy(action: str, **args: Any) -> Any:
        got = call(action, **args)
        if action == "visible" and args.get("id") is not None and args.get("vectors"):
            seen.append("vectors" in got)
        return got

    c.call = spy  # type: ignore[method-assign]
    return seen


TX_STEPS: list[tuple[str, Any]] = [
    ("upsert", rows([(0, 1), (0, 20), (1, 3)], "t-")),  # keys there and a new one
    ("delete", rows([(0, 2), (1, 4)], "").select(["p", "k"])),
    ("update", rows([(0, 1), (1, 5), (1, 21)], "u-")),  # on its own write, a committed row, a new key
    ("lock", rows([(0, 6), (1, 7)], "").select(["p", "k"])),
    ("statement", (pc.field("k") >= 8, {"v": pc.scalar("s")})),
    ("upsert", rows([(0, 2)], "back-")),  # on its own delete
    ("truncate", [1]),
    ("insert", rows([(1, 9), (1, 30)], "n-")),
]


def tx_step(tx: Any, table: str, what: str, arg: Any) -> None:
    if what == "upsert":
        tx.upsert(table, arg)
    elif what == "update":
        tx.upsert(table, arg, update=True)
    elif what == "delete":
        tx.delete_keys(table, arg)
    elif what == "lock":
        tx.lock_keys(table, arg)
    elif what == "statement":
        tx.update(table, arg[0], arg[1])
    elif what == "truncate":
        tx.truncate(table, partitions=arg)
    else:
        tx.insert(table, arg)


def test_a_transaction_reads_by_vectors_with_its_own_versions_over_them(cluster: LocalCluster) -> None:
    """A transaction's whole reads (``read`` with and without a filter or columns, ``dataset``)
    of a keys table go by the vectors of the committed parts at its snapshot, its own versions
    folded over the keys they touch: after each of its writes (upserts, deletes, update-mode
    upserts, read locks, an UPDATE statement, a truncate of a partition, inserts) they give
    what a transaction of a client that asks for no vectors (the fold) reads after the same
    writes."""
    a = cluster.client(0)
    table = "dv_tx_own"
    a.wait_for(
        a.create_table(table, SCHEMA, primary_key=("p", "k"), partition_by=("p",), conflict_policy="keys", **KEEP)
    )
    history(a, table, seed=11, commits=12)
    f = folding(Client(a.address, credentials=a.credentials))
    seen = vectors_sent_to(a)
    mine, theirs = a.begin(), f.begin()
    assert mine.snapshot == theirs.snapshot
    try:
        for what, arg in TX_STEPS:
            tx_step(mine, table, what, arg)
            tx_step(theirs, table, what, arg)
            for where in (None, *FILTERS):
                assert mine.read(table, where=where).to_pylist() == theirs.read(table, where=where).to_pylist(), (
                    what,
                    where,
                )
            assert mine.read(table, columns=["v"]).to_pylist() == theirs.read(table, columns=["v"]).to_pylist()
            with mine.dataset(table) as d, theirs.dataset(table) as e:
                assert d.to_table().to_pylist() == e.to_table().to_pylist(), what
    finally:
        mine.rollback()
        theirs.rollback()
    assert len(seen) >= 8 * len(TX_STEPS) and all(seen), "a transaction's whole read folded where vectors were"


def test_a_transaction_that_removed_committed_parts_folds(cluster: LocalCluster) -> None:
    """A transaction that merged the table's parts (a compaction inside it) sees parts the
    snapshot's vectors do not answer for: its replica sends none and it reads by the fold, right."""
    a = cluster.client(0)
    table = "dv_tx_compact"
    a.wait_for(
        a.create_table(table, SCHEMA, primary_key=("p", "k"), partition_by=("p",), conflict_policy="keys", **KEEP)
    )
    history(a, table, seed=13, commits=10)
    want = a.read(table).to_pylist()
    seen = vectors_sent_to(a)
    with a.transaction() as tx:
        assert tx.read(table).to_pylist() == want and seen[-1]
        tx.compact(table, kind="major")
        tx.upsert(table, rows([(0, 1)], "c-"))
        got = tx.read(table).to_pylist()
        assert not seen[-1], "vectors sent for a view the transaction changed by removing parts"
    assert got == a.read(table).to_pylist()
    assert {"p": 0, "k": 1, "v": "c-0.1"} in got
