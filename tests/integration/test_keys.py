"""Keys tables (docs/rules.md#keys-tables, after YTsaurus dynamic tables), against a real
ZooKeeper and real replicas where a commit is involved; the rules themselves are pure
(coordinator/core/keytables.py) and tested without a cluster.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support.cluster import make_cluster

from coordinator.core import keyfold, keytables
from coordinator.core.conflicts import Policy
from coordinator.errors import ConflictError, ConflictKind, InvalidInput
from coordinator.model.catalog import TableDef
from mergetxn.client import Client
from mergetxn.local.zkserver import ZooKeeperServer

SCHEMA = pa.schema(
    [
        pa.field("k", pa.int64(), nullable=False),
        pa.field("a", pa.string()),
        pa.field("b", pa.int64()),
        pa.field("c", pa.float64()),
    ]
)


def keys_def(**kw) -> TableDef:
    args = {"name": "t", "schema": SCHEMA, "primary_key": ("k",), "conflict_policy": "keys"} | kw
    return TableDef.new(**args)


# ---------------------------------------------------------------------------------------------
# Pure: create_table validation and the definition's round trip


def test_definition_round_trips_with_lock_groups_and_atomicity() -> None:
    t = keys_def(lock_groups={"g2": ["c"], "g1": ["a", "b"]}, atomicity="none")
    assert t.conflict_policy is Policy.KEYS and t.auto_merge and not keys_def(auto_merge=False).auto_merge
    assert t.lock_groups == (("g1", ("a", "b")), ("g2", ("c",)))
    back = TableDef.from_dict(t.to_dict())
    assert back == t and back.same_definition(t)
    assert not keys_def().same_definition(t)
    # A plain table's serialised form is unchanged (no new fields).
    assert set(TableDef.new("p", SCHEMA).to_dict()) == {
        "name",
        "schema",
        "partition_by",
        "primary_key",
        "conflict_policy",
        "auto_merge",
        "created_csn",
    }


BAD = [
    ({"primary_key": ()}, "needs a primary_key"),
    ({"schema": pa.schema([pa.field("k", pa.int64()), pa.field("a", pa.string())])}, "declared not null"),
    ({"partition_by": ("a",)}, "partition column(s) ['a'] must be primary key columns"),
    ({"lock_groups": {"g": ["k"]}}, "'k' is a primary key column"),
    ({"lock_groups": {"g": ["a"], "h": ["a", "b"]}}, "column 'a' is in lock groups 'g' and 'h'"),
    ({"lock_groups": {"g": ["nope"]}}, "unknown column 'nope'"),
    ({"lock_groups": {"g": []}}, "lock group 'g' has no columns"),
    ({"lock_groups": {"g": "a"}}, "must list column names"),
    ({"lock_groups": ["a"]}, "lock_groups must map"),
    ({"atomicity": "some"}, "atomicity must be 'full' or 'none'"),
    ({"conflict_policy": "parts", "lock_groups": {"g": ["a"]}}, "lock_groups need conflict_policy='keys'"),
    ({"conflict_policy": "parts", "atomicity": "none"}, "needs conflict_policy='keys'"),
    ({"schema": SCHEMA.append(pa.field("_op", pa.int8()))}, "reserved in a keys table"),
]


@pytest.mark.parametrize(("kw", "says"), BAD, ids=[s for _, s in BAD])
def test_bad_definitions_name_the_problem(kw: dict, says: str) -> None:
    with pytest.raises(InvalidInput) as e:
        keys_def(**kw)
    assert says in e.value.message


def test_keys_tables_refuse_schema_changes_for_now() -> None:
    with pytest.raises(InvalidInput, match="not supported yet"):
        keys_def().altered(add_columns=[pa.field("d", pa.int64())])


# ---------------------------------------------------------------------------------------------
# Against a cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator:
    with make_cluster(tmp_path_factory, zk_server, "keys", replicas=2) as c:
        yield c


@pytest.fixture
def clients(cluster) -> Iterator[tuple[Client, Client]]:
    a, b = (cluster.client(i) for i in range(2))
    try:
        yield a, b
    finally:
        a.close()
        b.close()


_n = iter(range(10**6))


def new_table(c: Client, **kw) -> str:
    name = f"kt{next(_n)}"
    c.create_table(name, SCHEMA, primary_key=("k",), conflict_policy="keys", **kw)
    return name


def test_create_table_is_stored_and_seen_by_every_replica(clients) -> None:
    a, b = clients
    name = new_table(a, lock_groups={"g": ["a", "b"]})
    csn = a.snapshot()
    b.wait_for(csn)
    t = b.table(name)
    assert t.conflict_policy is Policy.KEYS and t.primary_key == ("k",) and t.lock_groups == (("g", ("a", "b")),)
    # Creating it again as asked is idempotent; with other lock groups it is another definition.
    with pytest.raises(InvalidInput, match="already exists"):
        a.create_table(name, SCHEMA, primary_key=("k",), conflict_policy="keys", lock_groups={"g": ["a"]})
    with pytest.raises(InvalidInput, match="needs a primary_key"):
        a.create_table("nokey", SCHEMA, conflict_policy="keys")


# ---------------------------------------------------------------------------------------------
# Pure: versions and the fold on read


def put(rows: list[dict], seq: int = 1, op: int = keytables.PUT) -> pa.Table:
    data = pa.Table.from_pylist(rows, schema=pa.schema([SCHEMA.field(n) for n in SCHEMA.names if n in rows[0]]))
    return keytables.versions(SCHEMA, ("k",), "t", data, op, seq)


def test_versions_layout_and_input_checks() -> None:
    v = put([{"k": 1, "a": "x"}, {"k": 2, "b": 5}][:1], seq=7)
    assert v.schema == keytables.file_schema(SCHEMA, ("k",))
    assert v.to_pylist() == [{"k": 1, "a": "x", "b": None, "c": None, "_op": 0, "_seq": 7, "_cols": None}]
    u = put([{"k": 1, "b": 3}], op=keytables.UPDATE)
    assert u.column("_cols").to_pylist() == ["b"]
    d = keytables.versions(
        SCHEMA, ("k",), "t", pa.table({"k": pa.array([3], pa.int64()), "a": ["ignored"]}), keytables.DELETE, 1
    )
    assert d.to_pylist()[0] | {"_seq": 0} == {
        "k": 3,
        "a": None,
        "b": None,
        "c": None,
        "_op": 2,
        "_seq": 0,
        "_cols": None,
    }
    for data, says in [
        (pa.table({"a": ["x"]}), "missing primary key column(s) ['k']"),
        (pa.table({"k": [1], "zz": [1]}), "unknown column(s) ['zz']"),
        (pa.table({"k": pa.array([None, 1], pa.int64())}), "primary key column 'k' has nulls"),
        (pa.table({"k": [1], "b": ["not a number"]}), "column 'b'"),
    ]:
        with pytest.raises(InvalidInput, match=re.escape(says)):
            keytables.versions(SCHEMA, ("k",), "t", data, keytables.PUT, 1)
    strict = SCHEMA.set(3, pa.field("c", pa.float64(), nullable=False))
    with pytest.raises(InvalidInput, match=re.escape("leaves non-nullable column(s) ['c'] unset")):
        keytables.versions(strict, ("k",), "t", pa.table({"k": [1], "a": ["x"]}), keytables.UPDATE, 1)


def rows_of(t: pa.Table) -> list[dict]:
    return t.to_pylist()


def test_merge_latest_version_per_key_by_csn_then_seq() -> None:
    first = put([{"k": 1, "a": "old", "b": 1}, {"k": 2, "a": "two", "b": 2}])
    second = put([{"k": 1, "a": "new"}])  # overwrite mode: b becomes null
    # Parts given out of order: the fold goes by creation CSN, not by the list's order.
    got = keyfold.merge(SCHEMA, ("k",), [(20, second), (10, first)])
    assert rows_of(got) == [{"k": 1, "a": "new", "b": None, "c": None}, {"k": 2, "a": "two", "b": 2, "c": None}]
    # At a snapshot before the second commit (its part not visible): the first version.
    assert rows_of(keyfold.merge(SCHEMA, ("k",), [(10, first)]))[0] == {"k": 1, "a": "old", "b": 1, "c": None}
    # Within one part (one transaction) a later row of the same key wins.
    dup = put([{"k": 5, "a": "x"}, {"k": 5, "a": "y"}])
    assert rows_of(keyfold.merge(SCHEMA, ("k",), [(3, dup)])) == [{"k": 5, "a": "y", "b": None, "c": None}]


def test_merge_update_mode_keeps_absent_columns_and_delete_removes() -> None:
    base = put([{"k": 1, "a": "a0", "b": 1, "c": 1.5}, {"k": 2, "a": "b0", "b": 2, "c": 2.5}])
    upd = put([{"k": 1, "b": 10}], op=keytables.UPDATE)
    new = put([{"k": 3, "c": 9.0}], seq=2, op=keytables.UPDATE)  # no row yet: the others null
    dele = keytables.versions(SCHEMA, ("k",), "t", pa.table({"k": pa.array([2], pa.int64())}), keytables.DELETE, 1)
    got = rows_of(keyfold.merge(SCHEMA, ("k",), [(1, base), (2, upd), (2, new), (3, dele)]))
    assert got == [{"k": 1, "a": "a0", "b": 10, "c": 1.5}, {"k": 3, "a": None, "b": None, "c": 9.0}]
    # Delete then re-insert: the key is back with only the new values; own writes (OWN) come last.
    again = put([{"k": 2, "a": "back"}], seq=2)
    own_delete = keytables.versions(
        SCHEMA, ("k",), "t", pa.table({"k": pa.array([1], pa.int64())}), keytables.DELETE, 1
    )
    got = rows_of(
        keyfold.merge(SCHEMA, ("k",), [(keytables.OWN, own_delete), (keytables.OWN, again), (1, base), (3, dele)])
    )
    assert got == [{"k": 2, "a": "back", "b": None, "c": None}]
    assert keyfold.merge(SCHEMA, ("k",), []).schema == SCHEMA


def test_merge_on_a_composite_key_sorts_by_key() -> None:
    schema = pa.schema([pa.field("p", pa.string(), False), pa.field("k", pa.int64(), False), pa.field("v", pa.int64())])
    rows = pa.table({"p": ["b", "a", "a"], "k": [1, 2, 1], "v": [1, 2, 3]}, schema=schema)
    v = keytables.versions(schema, ("p", "k"), "t", rows, keytables.PUT, 1)
    got = keyfold.merge(schema, ("p", "k"), [(1, v)])
    assert [(r["p"], r["k"]) for r in got.to_pylist()] == [("a", 1), ("a", 2), ("b", 1)]


# ---------------------------------------------------------------------------------------------
# Writes and reads by key against the cluster


def kt(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=pa.schema([SCHEMA.field(n) for n in SCHEMA.names if n in rows[0]]))


def test_overwrite_and_update_mode_contents(clients) -> None:
    a, _ = clients
    name = new_table(a)
    with a.transaction() as tx:
        tx.insert(name, kt([{"k": 1, "a": "x", "b": 1, "c": 1.0}, {"k": 2, "a": "y", "b": 2, "c": 2.0}]))
    with a.transaction() as tx:
        tx.upsert(name, kt([{"k": 1, "a": "x2"}]))  # overwrite mode: b, c null
        tx.upsert(name, kt([{"k": 2, "b": 20}]), update=True)  # update mode: a, c kept
    assert rows_of(a.read(name)) == [{"k": 1, "a": "x2", "b": None, "c": None}, {"k": 2, "a": "y", "b": 20, "c": 2.0}]
    assert rows_of(a.read(name, columns=["k", "b"], where=pc.field("b") > 5)) == [{"k": 2, "b": 20}]
    with a.transaction() as tx, pytest.raises(InvalidInput, match="needs a keys table"):
        a.create_table(f"plain{name}", SCHEMA)
        tx.upsert(f"plain{name}", kt([{"k": 1}]))


def test_reads_one_row_per_key_at_old_and_new_snapshots_and_with_own_writes(clients) -> None:
    a, b = clients
    name = new_table(a)
    with a.transaction() as tx:
        tx.insert(name, kt([{"k": 1, "a": "v1"}, {"k": 2, "a": "v1"}]))
    s1 = tx.csn
    with a.transaction() as tx:
        tx.insert(name, kt([{"k": 1, "a": "v2"}]))
        tx.delete_keys(name, pa.table({"k": pa.array([2], pa.int64())}))
        # Inside: its own writes over the snapshot, one row per key.
        assert rows_of(tx.read(name, columns=["k", "a"])) == [{"k": 1, "a": "v2"}]
    s2 = tx.csn
    b.wait_for(s2)
    for c in (a, b):
        assert rows_of(c.read(name, snapshot=s1, columns=["k", "a"])) == [{"k": 1, "a": "v1"}, {"k": 2, "a": "v1"}]
        assert rows_of(c.read(name, snapshot=s2, columns=["k", "a"])) == [{"k": 1, "a": "v2"}]
    # A transaction that began before s2 still reads s1's rows.


def test_delete_where_then_reinsert(clients) -> None:
    a, _ = clients
    name = new_table(a)
    with a.transaction() as tx:
        tx.insert(name, kt([{"k": i, "b": i} for i in range(6)]))
    with a.transaction() as tx:
        assert tx.delete(name, pc.field("b") >= 3) == 3
        assert rows_of(tx.read(name, columns=["k"])) == [{"k": 0}, {"k": 1}, {"k": 2}]
    assert a.read(name).num_rows == 3
    with a.transaction() as tx:
        tx.insert(name, kt([{"k": 4, "a": "again"}]))
    assert rows_of(a.read(name, where=pc.field("k") == 4)) == [{"k": 4, "a": "again", "b": None, "c": None}]


# ---------------------------------------------------------------------------------------------
# Pure: locks


GROUPS = (("g1", ("a", "b")), ("g2", ("c",)))


def test_locks_taken_per_mode() -> None:
    P = keytables.PRIMARY
    assert keytables.locks(keytables.PUT, (), GROUPS) == {P, "g1", "g2"}
    assert keytables.locks(keytables.DELETE, (), GROUPS) == {P}
    assert keytables.locks(keytables.UPDATE, ("a",), GROUPS) == {"g1"}
    assert keytables.locks(keytables.UPDATE, ("b", "c"), GROUPS) == {"g1", "g2"}
    assert keytables.locks(keytables.UPDATE, ("a",), ()) == {P}  # a column in no group is under the primary lock
    assert keytables.locks(keytables.UPDATE, (), GROUPS) == {P}  # keys only: the row itself


def test_lock_overlap() -> None:
    P = keytables.PRIMARY
    g1, g2, p = frozenset({"g1"}), frozenset({"g2"}), frozenset({P})
    assert not keytables.overlap(g1, g2) and keytables.overlap(g1, g1)
    assert keytables.overlap(p, g1) and keytables.overlap(g2, p) and keytables.overlap(p, p)
    assert not keytables.overlap(frozenset(), p)


def test_written_locks_and_first_collision() -> None:
    schema = SCHEMA
    upd = keytables.versions(
        schema, ("k",), "t", pa.table({"k": pa.array([1, 2], pa.int64()), "c": [1.0, 2.0]}), keytables.UPDATE, 1
    )
    mine = keytables.written_locks(upd, ("k",), GROUPS)
    assert mine == {(1,): {"g2"}, (2,): {"g2"}}
    theirs = keytables.written_locks(put([{"k": 2, "a": "x"}], op=keytables.UPDATE), ("k",), GROUPS)
    assert keytables.first_collision(mine, theirs) is None  # other group, same key
    theirs = keytables.written_locks(put([{"k": 3}, {"k": 2}]), ("k",), GROUPS)  # overwrite: every lock
    assert keytables.first_collision(mine, theirs) == (2,)
    assert keytables.first_collision(mine, keytables.written_locks(put([{"k": 9}]), ("k",), GROUPS)) is None


# ---------------------------------------------------------------------------------------------
# Key-level conflicts at commit, first committer wins


def one(k: int, **cols) -> pa.Table:
    return kt([{"k": k, **cols}])


def test_later_writer_of_a_key_loses_even_after_the_winner_is_done(clients) -> None:
    a, b = clients
    name = new_table(a)
    ta, tb = a.begin(), a.begin()  # A and B begin together
    ta.insert(name, one(7, a="A"))
    ta.commit()
    tb.insert(name, one(7, a="B"))
    with pytest.raises(ConflictError) as e:
        tb.commit()
    err = e.value
    assert err.kind is ConflictKind.KEY_WRITTEN and err.winner == ta.id
    assert err.details["table"] == name and err.details["key"] == [7]
    assert ta.id in err.message and name in err.message and "'k': 7" in err.message
    assert rows_of(a.read(name, columns=["k", "a"])) == [{"k": 7, "a": "A"}]
    # Began after A committed (its snapshot holds A's commit): no conflict.
    b.wait_for(ta.csn)
    with b.transaction() as tx:
        tx.insert(name, one(7, a="C"))
    a.wait_for(tx.csn)
    # A delete is a write of the key too.
    tc, td = a.begin(), a.begin()
    tc.delete_keys(name, pa.table({"k": pa.array([7], pa.int64())}))
    tc.commit()
    td.upsert(name, one(7, b=1), update=True)
    with pytest.raises(ConflictError, match="lost to"):
        td.commit()


def test_different_keys_never_conflict_in_one_part_or_partition(clients) -> None:
    a, _ = clients
    schema = pa.schema([pa.field("p", pa.string(), False), pa.field("k", pa.int64(), False), pa.field("v", pa.int64())])
    name = f"ktp{next(_n)}"
    a.create_table(name, schema, partition_by=("p",), primary_key=("p", "k"), conflict_policy="keys")
    with a.transaction() as tx:
        tx.insert(name, pa.table({"p": ["x", "x", "y"], "k": [1, 2, 1], "v": [0, 0, 0]}, schema=schema))
    t1, t2 = a.begin(), a.begin()
    t1.insert(name, pa.table({"p": ["x"], "k": [1], "v": [1]}, schema=schema))
    t2.insert(name, pa.table({"p": ["x", "y"], "k": [2, 1], "v": [2, 2]}, schema=schema))
    t1.commit()
    t2.commit()
    assert [(r["p"], r["k"], r["v"]) for r in a.read(name).to_pylist()] == [("x", 1, 1), ("x", 2, 2), ("y", 1, 2)]
    # The same key in the same partition then conflicts.
    t3, t4 = a.begin(), a.begin()
    t3.insert(name, pa.table({"p": ["y"], "k": [1], "v": [3]}, schema=schema))
    t4.insert(name, pa.table({"p": ["y"], "k": [1], "v": [4]}, schema=schema))
    t3.commit()
    with pytest.raises(ConflictError):
        t4.commit()


def test_lock_groups(clients) -> None:
    a, b = clients
    name = new_table(a, lock_groups={"g1": ["a", "b"], "g2": ["c"]})
    with a.transaction() as tx:
        tx.insert(name, one(1, a="a0", b=0, c=0.0))
    b.wait_for(tx.csn)  # B's snapshots hold the row: only the writers below overlap
    # Different groups of the same row, update mode: both commit, both columns kept.
    t1, t2 = a.begin(), b.begin()
    t1.upsert(name, one(1, a="a1"), update=True)
    t2.upsert(name, one(1, c=2.0), update=True)
    t1.commit()
    t2.commit()
    a.wait_for(t2.csn)
    assert rows_of(a.read(name)) == [{"k": 1, "a": "a1", "b": 0, "c": 2.0}]
    cases = [  # (first, second, conflicts)
        (
            lambda t: t.upsert(name, one(1, a="x"), update=True),
            lambda t: t.upsert(name, one(1, b=9), update=True),
            True,
        ),
        (
            lambda t: t.delete_keys(name, one(1).select(["k"])),
            lambda t: t.upsert(name, one(1, c=9.0), update=True),
            True,
        ),
        (lambda t: t.upsert(name, one(1, c=1.0), update=True), lambda t: t.insert(name, one(1, a="o")), True),
        (
            lambda t: t.upsert(name, one(1, c=1.0), update=True),
            lambda t: t.upsert(name, one(1, a="u"), update=True),
            False,
        ),
    ]
    for first, second, conflicts in cases:
        b.wait_for(a.snapshot())
        t1, t2 = a.begin(), b.begin()
        first(t1)
        second(t2)
        t1.commit()
        if conflicts:
            with pytest.raises(ConflictError) as e:
                t2.commit()
            assert e.value.kind is ConflictKind.KEY_WRITTEN and e.value.winner == t1.id
        else:
            t2.commit()


@pytest.mark.parametrize("same_key", [True, False], ids=["same key", "different keys"])
@pytest.mark.parametrize("replicas", [(0, 1), (0, 0)], ids=["two replicas", "one replica"])
def test_racing_writers(cluster, clients, same_key: bool, replicas: tuple[int, int]) -> None:
    a, _ = clients
    name = new_table(a)
    conns = [cluster.client(i) for i in replicas]
    try:
        for round_ in range(8):
            barrier = threading.Barrier(2)
            results: list[object] = [None, None]

            def writer(i: int) -> None:
                c = conns[i]
                tx = c.begin()
                tx.insert(name, one(round_ if same_key else 100 * round_ + i, a=f"w{i}"))
                barrier.wait()
                try:
                    results[i] = tx.commit()
                except ConflictError as exc:
                    results[i] = exc

            threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            lost = [r for r in results if isinstance(r, ConflictError)]
            if same_key:
                assert len(lost) == 1, results
                assert lost[0].kind is ConflictKind.KEY_WRITTEN
            else:
                assert not lost, results
        snap = max(r for r in results if isinstance(r, int))
        a.wait_for(snap)
        assert a.read(name).num_rows == (8 if same_key else 16)
    finally:
        for c in conns:
            c.close()


# ---------------------------------------------------------------------------------------------
# Read locks (tx.lock_keys)


def test_read_lock_collisions() -> None:
    P, S, W = keytables.PRIMARY, keytables.STRONG, keytables.WEAK
    w, g = frozenset({P, "g1"}), frozenset({"g1"})
    assert keytables.locks(keytables.LOCK_STRONG, (), GROUPS) == {S} and keytables.locks(
        keytables.LOCK_WEAK, (), GROUPS
    ) == {W}
    # A writer loses to a committed strong lock, not to a weak one.
    assert keytables.collide(w, frozenset({S})) and keytables.collide(g, frozenset({S}))
    assert not keytables.collide(w, frozenset({W}))
    # A reader (either mode) loses to a committed write.
    assert keytables.collide(frozenset({S}), g) and keytables.collide(frozenset({W}), w)
    # Read locks never collide with each other.
    for a in (S, W):
        for b in (S, W):
            assert not keytables.collide(frozenset({a}), frozenset({b}))
    # A transaction that read-locked a key and wrote another group of it: the read lock sees the write.
    assert keytables.collide(frozenset({S, "g2"}), frozenset({"g1"}))
    assert "strong read lock" in keytables.why(w, frozenset({S}))
    # Lock rows are never rows.
    lock = keytables.versions(SCHEMA, ("k",), "t", pa.table({"k": pa.array([1], pa.int64())}), keytables.LOCK_STRONG, 5)
    assert keyfold.merge(SCHEMA, ("k",), [(1, put([{"k": 1, "a": "x"}])), (2, lock)]).num_rows == 1
    assert keyfold.merge(SCHEMA, ("k",), [(2, lock)]).num_rows == 0


@pytest.mark.parametrize("mode", ["shared_strong", "shared_weak"])
def test_lock_keys(clients, mode: str) -> None:
    a, _ = clients
    name = new_table(a)
    with a.transaction() as tx:
        tx.insert(name, one(1, a="v"))
    k1 = pa.table({"k": pa.array([1], pa.int64())})
    # The locker commits first: a writer from an older snapshot fails only after a strong lock.
    locker, writer = a.begin(), a.begin()
    assert locker.lock_keys(name, k1, mode=mode) == 1
    writer.upsert(name, one(1, b=2), update=True)
    locker.commit()
    if mode == "shared_strong":
        with pytest.raises(ConflictError) as e:
            writer.commit()
        assert e.value.winner == locker.id and "strong read lock" in e.value.message
    else:
        writer.commit()
    # The writer commits first: the locker fails in either mode.
    locker, writer = a.begin(), a.begin()
    locker.lock_keys(name, k1, mode=mode)
    writer.insert(name, one(1, a="w"))
    writer.commit()
    with pytest.raises(ConflictError) as e:
        locker.commit()
    assert e.value.kind is ConflictKind.KEY_WRITTEN and e.value.winner == writer.id
    # Two lockers of one key both commit; other keys are free; lock rows are never read.
    t1, t2, t3 = a.begin(), a.begin(), a.begin()
    t1.lock_keys(name, k1, mode=mode)
    t2.lock_keys(name, k1, mode="shared_strong")
    t3.insert(name, one(2, a="other"))
    for t in (t1, t2, t3):
        t.commit()
    assert rows_of(a.read(name, columns=["k", "a"])) == [{"k": 1, "a": "w"}, {"k": 2, "a": "other"}]
    with a.transaction() as tx, pytest.raises(InvalidInput, match="lock_keys mode"):
        tx.lock_keys(name, k1, mode="exclusive")
