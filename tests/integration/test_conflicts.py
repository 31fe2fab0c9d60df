"""Conflict rules end to end: two replicas, a real ZooKeeper, real parts in local storage.

Each scenario runs two transactions that begin at the same snapshot, stage their work, then commit
in a fixed order (earlier, later): the explicit order replaces any timing. The outcome of the later
commit is checked against the tables of docs/rules.md#conflict-rules (transcribed independently in
tests/unit/test_rules.py and here), and the final rows against a plain-Python model of the jobs: "the
final contents are exactly as if the later job had run after the earlier one committed", or the
earlier job's result alone when the later one fails. A losing transaction must leave nothing: no
part of it recorded or visible, no file of it in storage, no removal by it.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support.cluster import make_cluster  # tests/ is on sys.path
from support.waiting import poll

from coordinator import LocalCluster
from coordinator.errors import ConflictError, ConflictKind
from mergetxn.client import Client, Transaction
from mergetxn.local.zkserver import ZooKeeperServer

pytestmark = pytest.mark.zk

Row = dict[str, int]

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])
PSCHEMA = pa.schema([("p", pa.int64()), ("k", pa.int64()), ("v", pa.int64())])

KINDS = ["OVERWRITE", "INSERT", "MUTATE", "MINOR_COMPACT", "MAJOR_COMPACT"]

# docs/rules.md#policy-maxcompute, verbatim: does the later job succeed?
# rows: earlier, columns: later.
MAXCOMPUTE_TEXT = """
| earlier \\ later | OVERWRITE | INSERT | MUTATE | MINOR_COMPACT | MAJOR_COMPACT |
| OVERWRITE | succeeds, overwrites | fails | fails | fails | fails |
| INSERT | succeeds, overwrites | fails | fails | succeeds | fails |
| MUTATE | succeeds, overwrites | fails | fails | succeeds | fails |
| MINOR_COMPACT | succeeds, overwrites | succeeds | succeeds | fails | succeeds |
| MAJOR_COMPACT | succeeds, overwrites | succeeds | succeeds | fails | fails |
"""
_ROWS = [[c.strip() for c in line.strip("| ").split("|")] for line in MAXCOMPUTE_TEXT.strip().splitlines()]
MAXCOMPUTE_LATER_SUCCEEDS: dict[str, dict[str, bool]] = {
    row[0]: {later: cell.startswith("succeeds") for later, cell in zip(_ROWS[0][1:], row[1:], strict=True)}
    for row in _ROWS[1:]
}
assert sorted(MAXCOMPUTE_LATER_SUCCEEDS) == sorted(KINDS)
assert sum(v for row in MAXCOMPUTE_LATER_SUCCEEDS.values() for v in row.values()) == 12


def append_later_succeeds(earlier: str, later: str) -> bool:
    """docs/rules.md#policy-append: INSERT never fails, OVERWRITE succeeds; MUTATE and compactions
    fail once anything committed to their target since their snapshot (every earlier kind does)."""
    return later in ("INSERT", "OVERWRITE")


# =============================================================================================
# Cluster
# =============================================================================================


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator[LocalCluster]:
    """One LocalCluster with 2 replica processes for the module, on the session's ZooKeeper
    (in a chroot of its own)."""
    with make_cluster(tmp_path_factory, zk_server, "conflicts", replicas=2) as c:
        yield c


@pytest.fixture(scope="module")
def clients(cluster: LocalCluster) -> Iterator[list[Client]]:
    cs = [cluster.client(0), cluster.client(1)]
    yield cs
    for c in cs:
        c.close()


_names = itertools.count()


def table_name(prefix: str) -> str:
    """A fresh table name per scenario (all scenarios share one cluster)."""
    return f"{prefix}_{next(_names)}_{uuid.uuid4().hex[:6]}"


# =============================================================================================
# Jobs and their model
# =============================================================================================


def key(row: Row) -> tuple[int, ...]:
    return tuple(row[c] for c in ("p", "k", "v") if c in row)


def rows_of(t: pa.Table) -> list[tuple[int, ...]]:
    return sorted(key(r) for r in t.to_pylist())


def model_rows(rows: list[Row]) -> list[tuple[int, ...]]:
    return sorted(key(r) for r in rows)


def seed_rows(partitioned: bool) -> list[list[Row]]:
    """Two batches, committed separately, so every partition starts with two parts (work for a
    minor compaction)."""
    batches = [[(1, 10), (2, 20)], [(3, 30), (4, 40)]]
    if not partitioned:
        return [[{"k": k, "v": v} for k, v in b] for b in batches]
    return [[{"p": p, "k": k, "v": v + p} for p in (1, 2) for k, v in b] for b in batches]


@dataclass(frozen=True)
class Job:
    """One transaction's work on a table: how to run it and what it does to the rows.

    ``role`` (earlier/later) picks distinct data so that the final rows tell which job did
    what; ``mutate`` picks DELETE or UPDATE for MUTATE; ``partition`` confines the job to one
    partition of a partitioned table (None: unpartitioned)."""

    kind: str
    role: str
    mutate: str = "delete"
    partition: int | None = None

    def _rows(self, pairs: list[tuple[int, int]]) -> list[Row]:
        if self.partition is None:
            return [{"k": k, "v": v} for k, v in pairs]
        return [{"p": self.partition, "k": k, "v": v} for k, v in pairs]

    def _data(self) -> list[Row]:
        if self.kind == "OVERWRITE":
            return self._rows([(100, 1), (101, 1)] if self.role == "earlier" else [(200, 2)])
        return self._rows([(5, 50)] if self.role == "earlier" else [(6, 60), (7, 70)])

    def _in_partition(self, r: Row) -> bool:
        return self.partition is None or r["p"] == self.partition

    def _predicate(self) -> tuple[Callable[[Row], bool], pc.Expression]:
        """DELETE hits one row of the first seed part (earlier) or of the second (later); UPDATE
        hits one row (earlier) or every row with k >= 2, whatever part it lives in (later)."""
        if self.mutate == "delete":
            k = 1 if self.role == "earlier" else 3
            fn, expr = (lambda r: r["k"] == k), pc.field("k") == k
        elif self.role == "earlier":
            fn, expr = (lambda r: r["k"] == 2), pc.field("k") == 2
        else:
            fn, expr = (lambda r: r["k"] >= 2), pc.field("k") >= 2
        if self.partition is not None:
            p = self.partition
            return (lambda r: r["p"] == p and fn(r)), (pc.field("p") == p) & expr
        return fn, expr

    def _bump(self) -> int:
        return 100 if self.role == "earlier" else 1000

    def run(self, tx: Transaction, table: str, schema: pa.Schema) -> None:
        parts = None if self.partition is None else [self.partition]
        if self.kind == "OVERWRITE":
            tx.overwrite(table, pa.Table.from_pylist(self._data(), schema=schema))
        elif self.kind == "INSERT":
            tx.insert(table, pa.Table.from_pylist(self._data(), schema=schema))
        elif self.kind == "MUTATE":
            _, where = self._predicate()
            if self.mutate == "delete":
                assert tx.delete(table, where) == 1
            else:
                assert tx.update(table, where, {"v": pc.field("v") + self._bump()}) >= 1
        else:
            kind = "minor" if self.kind == "MINOR_COMPACT" else "major"
            replaced = tx.compact(table, kind=kind, partitions=parts)
            assert replaced == 2, f"{kind} compaction should merge the two seed parts, replaced {replaced}"

    def apply(self, rows: list[Row]) -> list[Row]:
        """The job's effect on the rows as they are when it runs (compaction: none)."""
        if self.kind == "OVERWRITE":
            return [r for r in rows if not self._in_partition(r)] + self._data()
        if self.kind == "INSERT":
            return rows + self._data()
        if self.kind == "MUTATE":
            pred, _ = self._predicate()
            if self.mutate == "delete":
                return [r for r in rows if not pred(r)]
            return [dict(r, v=r["v"] + self._bump()) if pred(r) else r for r in rows]
        return list(rows)


# =============================================================================================
# Helpers
# =============================================================================================


def create_seeded(clients: list[Client], name: str, policy: str, partitioned: bool = False) -> tuple[int, list[Row]]:
    """Create ``name`` and commit the two seed batches; both replicas have applied them.
    Returns the seed CSN and the seed rows."""
    c = clients[0]
    schema = PSCHEMA if partitioned else SCHEMA
    c.create_table(
        name,
        schema,
        partition_by=("p",) if partitioned else (),
        conflict_policy=policy,
        auto_merge=False,
    )
    rows: list[Row] = []
    csn = 0
    for batch in seed_rows(partitioned):
        with c.transaction() as tx:
            tx.insert(name, pa.Table.from_pylist(batch, schema=schema))
        csn = tx.csn
        rows += batch
    for cl in clients:
        cl.wait_for(csn)
    return csn, rows


def begin_pair(clients: list[Client], reps: tuple[int, int], seed_csn: int) -> tuple[Transaction, Transaction]:
    """Two transactions at the same snapshot, the seed CSN (nothing else commits meanwhile)."""
    a, b = clients[reps[0]].begin(), clients[reps[1]].begin()
    assert a.snapshot == b.snapshot == seed_csn
    return a, b


def assert_contents(clients: list[Client], table: str, csn: int, expected: list[Row]) -> None:
    """Every replica serves ``expected`` at the latest snapshot once it has applied ``csn``."""
    for c in clients:
        c.wait_for(csn)
        assert rows_of(c.read(table)) == model_rows(expected), f"replica {c.host_id}"


def assert_left_nothing(clients: list[Client], table: str, loser: Transaction) -> None:
    """A losing transaction: none of its parts recorded or visible, nothing removed by it, none
    of its files left in storage, and its status says it did not commit."""
    for c in clients:
        parts = c.parts(table).to_pylist()
        assert not [p for p in parts if p["creation_tid"] == loser.id and p["visible"]]
        assert not [p for p in parts if p["creation_tid"] == loser.id]
        assert not [p for p in parts if p["removal_tid"] == loser.id]
    files = clients[0].storage.list(f"{table}/")
    assert not [f for f in files if PurePosixPath(f).name.startswith(f"{loser.id}_")], files
    owner = next(c for c in clients if c.host_id == loser.tid.host_id)
    status = owner.commit_status(loser.id)
    assert status.status == "aborted" and status.csn is None, status
    assert loser.csn is None


def assert_files_are_recorded(clients: list[Client], table: str, tx: Transaction) -> None:
    """A committed transaction leaves exactly the part files its commit records (an inlined
    part's none): outputs it superseded (its own parts removed again, a rewrite redone at rebase) are deleted."""
    files = {
        f
        for f in clients[0].storage.list(f"{table}/")
        if f.endswith(".parquet") and PurePosixPath(f).name.startswith(f"{tx.id}_")
    }
    # An inlined part (a small insert: docs/architecture/small-writes.md) records no file: none
    # may be found at its path either.
    recorded = {
        p["path"] for p in clients[0].parts(table).to_pylist() if p["creation_tid"] == tx.id and not p["inlined"]
    }
    assert files == recorded


def run_pair(
    clients: list[Client],
    policy: str,
    earlier: Job,
    later: Job,
    later_succeeds: bool,
    reps: tuple[int, int],
    partitioned: bool = False,
) -> None:
    """The core scenario: same snapshot, both stage, earlier commits, later commits."""
    table = table_name(policy[:2])
    schema = PSCHEMA if partitioned else SCHEMA
    seed_csn, seed = create_seeded(clients, table, policy, partitioned)
    tx_e, tx_l = begin_pair(clients, reps, seed_csn)
    # the time-travel reads below need these snapshots kept: cleanup protects snapshots in use,
    # and a plain read pins nothing, so running transactions hold them until the end
    pins = [clients[reps[0]].begin()]
    assert pins[0].snapshot == seed_csn
    earlier.run(tx_e, table, schema)
    later.run(tx_l, table, schema)
    e_csn = tx_e.commit()
    pins.append(clients[reps[0]].begin())
    assert pins[1].snapshot == e_csn
    after_earlier = earlier.apply(seed)
    if later_succeeds:
        l_csn = tx_l.commit()
        assert l_csn > e_csn
        final, expected = l_csn, later.apply(after_earlier)
        clients[0].wait_for(l_csn)
        assert_files_are_recorded(clients, table, tx_l)
    else:
        with pytest.raises(ConflictError) as info:
            tx_l.commit()
        assert info.value.winner == tx_e.id, info.value.message
        assert info.value.kind is ConflictKind.TARGET_CHANGED, info.value.details
        final, expected = e_csn, after_earlier
        assert_left_nothing(clients, table, tx_l)
    assert_contents(clients, table, final, expected)
    # time travel: the earlier job's commit alone, and the seed before it
    for c in clients:
        assert rows_of(c.read(table, snapshot=e_csn)) == model_rows(after_earlier)
        assert rows_of(c.read(table, snapshot=seed_csn)) == model_rows(seed)
    # the winner's own parts are recorded at its CSN
    parts = clients[1].parts(table).to_pylist()
    assert all(p["creation_csn"] == e_csn for p in parts if p["creation_tid"] == tx_e.id)
    assert_files_are_recorded(clients, table, tx_e)
    for pin in pins:
        pin.rollback()


def cells() -> list:
    """The 25 (earlier, later) cells; a cell with MUTATE runs once with DELETE and once with
    UPDATE on each side, so both copy-on-write mutations get rebased."""
    out = []
    for e, lat in itertools.product(KINDS, KINDS):
        variants = [("delete", "update"), ("update", "delete")] if "MUTATE" in (e, lat) else [("delete", "delete")]
        for em, lm in variants:
            suffix = f"-{em}-{lm}" if "MUTATE" in (e, lat) else ""
            out.append(pytest.param(e, lat, em, lm, id=f"{e}-then-{lat}{suffix}"))
    return out


# =============================================================================================
# maxcompute: 25 cells on one unpartitioned table, the two jobs on different replicas
# =============================================================================================


@pytest.mark.parametrize(("earlier", "later", "e_mut", "l_mut"), cells())
def test_maxcompute_cell(clients: list[Client], earlier: str, later: str, e_mut: str, l_mut: str) -> None:
    run_pair(
        clients,
        "maxcompute",
        Job(earlier, "earlier", e_mut),
        Job(later, "later", l_mut),
        MAXCOMPUTE_LATER_SUCCEEDS[earlier][later],
        reps=(0, 1),
    )


# =============================================================================================
# append: the same 25 cells
# =============================================================================================


@pytest.mark.parametrize(("earlier", "later", "e_mut", "l_mut"), cells())
def test_append_cell(clients: list[Client], earlier: str, later: str, e_mut: str, l_mut: str) -> None:
    run_pair(
        clients,
        "append",
        Job(earlier, "earlier", e_mut),
        Job(later, "later", l_mut),
        append_later_succeeds(earlier, later),
        reps=(1, 0),
    )


@pytest.mark.parametrize("later", ["MUTATE", "MINOR_COMPACT", "MAJOR_COMPACT"])
def test_append_rewrite_succeeds_when_target_untouched(clients: list[Client], later: str) -> None:
    """`append`: a MUTATE or compaction fails only if something committed to *its* target; a
    commit to another table in between does not count."""
    table, other = table_name("ap"), table_name("ap")
    seed_csn, seed = create_seeded(clients, table, "append")
    _, other_seed = create_seeded(clients, other, "append")
    tx_e, tx_l = begin_pair(clients, (0, 1), clients[1].snapshot())
    ins = Job("INSERT", "earlier")
    ins.run(tx_e, other, SCHEMA)
    job = Job(later, "later", "update")
    job.run(tx_l, table, SCHEMA)
    e_csn = tx_e.commit()
    l_csn = tx_l.commit()
    assert l_csn > e_csn
    assert_contents(clients, table, l_csn, job.apply(seed))
    assert_contents(clients, other, l_csn, ins.apply(other_seed))


# =============================================================================================
# Different partitions never conflict, whatever the policy and kinds
# =============================================================================================


@pytest.mark.parametrize("policy", ["maxcompute", "append", "parts"])
@pytest.mark.parametrize(("earlier", "later", "e_mut", "l_mut"), cells())
def test_different_partitions_never_conflict(
    clients: list[Client], policy: str, earlier: str, later: str, e_mut: str, l_mut: str
) -> None:
    """Partition 1 for the earlier job, partition 2 for the later one: both succeed, and the
    rows are both jobs' effects (both jobs on one replica here)."""
    run_pair(
        clients,
        policy,
        Job(earlier, "earlier", e_mut, partition=1),
        Job(later, "later", l_mut, partition=2),
        True,
        reps=(1, 1),
        partitioned=True,
    )


# =============================================================================================
# parts (docs/rules.md#policy-parts)
# =============================================================================================


@pytest.mark.parametrize("reps", [(0, 1), (1, 1)])
def test_parts_two_deletes_of_one_part(clients: list[Client], reps: tuple[int, int]) -> None:
    """Both deletes rewrite the first seed part (k=1 and k=2 live in it): the later loses."""
    table = table_name("pa")
    seed_csn, seed = create_seeded(clients, table, "parts")
    tx_e, tx_l = begin_pair(clients, reps, seed_csn)
    assert tx_e.delete(table, pc.field("k") == 1) == 1
    assert tx_l.delete(table, pc.field("k") == 2) == 1
    e_csn = tx_e.commit()
    with pytest.raises(ConflictError) as info:
        tx_l.commit()
    assert info.value.winner == tx_e.id
    assert info.value.kind is ConflictKind.PART_REMOVED_TWICE, info.value.details
    assert_left_nothing(clients, table, tx_l)
    assert_contents(clients, table, e_csn, [r for r in seed if r["k"] != 1])


def test_parts_deletes_of_different_parts_both_commit(clients: list[Client]) -> None:
    table = table_name("pa")
    seed_csn, seed = create_seeded(clients, table, "parts")
    tx_e, tx_l = begin_pair(clients, (0, 1), seed_csn)
    assert tx_e.delete(table, pc.field("k") == 1) == 1
    assert tx_l.delete(table, pc.field("k") == 3) == 1
    tx_e.commit()
    csn = tx_l.commit()
    assert_contents(clients, table, csn, [r for r in seed if r["k"] not in (1, 3)])


@pytest.mark.parametrize("first", ["insert", "overwrite"])
@pytest.mark.parametrize("op", ["overwrite", "truncate"])
def test_parts_overwrite_keeps_concurrent_insert(clients: list[Client], first: str, op: str) -> None:
    """An OVERWRITE/TRUNCATE removes only the parts it saw: a part a concurrent INSERT committed
    survives, whichever of the two commits first."""
    table = table_name("pa")
    seed_csn, _ = create_seeded(clients, table, "parts")
    tx_o, tx_i = begin_pair(clients, (0, 1), seed_csn)
    new = [{"k": 100, "v": 1}]
    inserted = [{"k": 6, "v": 60}]
    if op == "overwrite":
        tx_o.overwrite(table, pa.Table.from_pylist(new, schema=SCHEMA))
    else:
        assert tx_o.truncate(table) == 2
        new = []
    tx_i.insert(table, pa.Table.from_pylist(inserted, schema=SCHEMA))
    order = [tx_i, tx_o] if first == "insert" else [tx_o, tx_i]
    csns = [tx.commit() for tx in order]
    assert csns[0] < csns[1]
    assert_contents(clients, table, csns[1], new + inserted)


@pytest.mark.parametrize("first", ["insert", "compaction"])
@pytest.mark.parametrize("kind", ["minor", "major"])
def test_parts_compaction_beside_new_inserts(clients: list[Client], first: str, kind: str) -> None:
    """A compaction whose sources are intact commits even though new parts arrived; the new
    part stays, the sources go, the rows are unchanged by the compaction."""
    table = table_name("pa")
    seed_csn, seed = create_seeded(clients, table, "parts")
    tx_c, tx_i = begin_pair(clients, (1, 0), seed_csn)
    assert tx_c.compact(table, kind=kind) == 2
    inserted = [{"k": 6, "v": 60}, {"k": 7, "v": 70}]
    tx_i.insert(table, pa.Table.from_pylist(inserted, schema=SCHEMA))
    order = [tx_i, tx_c] if first == "insert" else [tx_c, tx_i]
    csns = [tx.commit() for tx in order]
    assert_contents(clients, table, csns[1], seed + inserted)
    parts = clients[0].parts(table).to_pylist()
    visible = [p for p in parts if p["visible"]]
    assert sorted(p["creation_tid"] for p in visible) == sorted([tx_c.id, tx_i.id])
    seeds = [p for p in parts if p["creation_csn"] <= seed_csn]
    assert len(seeds) == 2 and all(p["removal_tid"] == tx_c.id and not p["visible"] for p in seeds)


@pytest.mark.parametrize("earlier", ["delete", "update", "overwrite", "truncate", "minor", "major"])
@pytest.mark.parametrize("kind", ["minor", "major"])
def test_parts_compaction_with_removed_source_fails(clients: list[Client], earlier: str, kind: str) -> None:
    """A compaction whose source parts were removed meanwhile fails, naming the remover."""
    table = table_name("pa")
    seed_csn, seed = create_seeded(clients, table, "parts")
    tx_e, tx_c = begin_pair(clients, (0, 1), seed_csn)
    expected = list(seed)
    if earlier == "delete":
        tx_e.delete(table, pc.field("k") == 1)
        expected = [r for r in seed if r["k"] != 1]
    elif earlier == "update":
        tx_e.update(table, pc.field("k") == 4, {"v": 44})
        expected = [dict(r, v=44) if r["k"] == 4 else r for r in seed]
    elif earlier == "overwrite":
        expected = [{"k": 100, "v": 1}]
        tx_e.overwrite(table, pa.Table.from_pylist(expected, schema=SCHEMA))
    elif earlier == "truncate":
        tx_e.truncate(table)
        expected = []
    else:
        tx_e.compact(table, kind=earlier)
    assert tx_c.compact(table, kind=kind) == 2
    e_csn = tx_e.commit()
    with pytest.raises(ConflictError) as info:
        tx_c.commit()
    assert info.value.winner == tx_e.id
    assert info.value.kind is ConflictKind.SOURCES_REMOVED, info.value.details
    assert_left_nothing(clients, table, tx_c)
    assert_contents(clients, table, e_csn, expected)


@pytest.mark.parametrize("policy", ["parts", "append"])
def test_concurrent_inserts_never_conflict(clients: list[Client], policy: str) -> None:
    """Six INSERTs from one snapshot on both replicas, committed at once (a barrier lines them
    up, so group commit batches some): every one commits and every row is there."""
    table = table_name(policy[:2])
    seed_csn, seed = create_seeded(clients, table, policy)
    txs = [clients[i % 2].begin() for i in range(6)]
    assert {tx.snapshot for tx in txs} == {seed_csn}
    batches = [[{"k": 1000 + 10 * i + j, "v": i} for j in range(3)] for i in range(6)]
    for tx, b in zip(txs, batches):
        tx.insert(table, pa.Table.from_pylist(b, schema=SCHEMA))
    barrier = threading.Barrier(len(txs))
    results: dict[int, int | BaseException] = {}

    def commit(i: int) -> None:
        barrier.wait()
        try:
            results[i] = txs[i].commit()
        except BaseException as exc:  # reported below
            results[i] = exc

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(len(txs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(isinstance(results.get(i), int) for i in range(len(txs))), results
    assert_contents(clients, table, max(results.values()), seed + [r for b in batches for r in b])


# =============================================================================================
# Multi-statement, multi-table atomicity
# =============================================================================================


@pytest.mark.parametrize("rep", [0, 1])
def test_multi_table_commit_is_one_csn(clients: list[Client], rep: int) -> None:
    """INSERT into two tables and DELETE from one: everything appears at the commit's CSN on
    every replica, nothing of it at CSN-1."""
    x, y = table_name("mx"), table_name("my")
    _, seed_x = create_seeded(clients, x, "parts")
    seed_csn, seed_y = create_seeded(clients, y, "maxcompute")
    new_x, new_y = [{"k": 8, "v": 80}], [{"k": 9, "v": 90}, {"k": 10, "v": 100}]
    pin = clients[rep].begin()  # keeps CSN-1 readable below: a plain read pins nothing
    with clients[rep].transaction() as tx:
        assert tx.snapshot == seed_csn
        tx.insert(x, pa.Table.from_pylist(new_x, schema=SCHEMA))
        tx.insert(y, pa.Table.from_pylist(new_y, schema=SCHEMA))
        assert tx.delete(x, pc.field("k") == 2) == 1
        # the transaction reads its own writes before it commits
        assert rows_of(tx.read(x)) == model_rows([r for r in seed_x if r["k"] != 2] + new_x)
    csn = tx.csn
    assert csn is not None and csn > seed_csn
    want_x = [r for r in seed_x if r["k"] != 2] + new_x
    for c in clients:
        c.wait_for(csn)
        assert rows_of(c.read(x, snapshot=csn)) == model_rows(want_x)
        assert rows_of(c.read(y, snapshot=csn)) == model_rows(seed_y + new_y)
        assert rows_of(c.read(x, snapshot=csn - 1)) == model_rows(seed_x)
        assert rows_of(c.read(y, snapshot=csn - 1)) == model_rows(seed_y)
        if c is clients[-1]:
            pin.rollback()
        for t in (x, y):
            parts = c.parts(t).to_pylist()
            mine = [p for p in parts if p["creation_tid"] == tx.id]
            assert mine and all(p["creation_csn"] == csn for p in mine)
            assert all(p["removal_csn"] == csn for p in parts if p["removal_tid"] == tx.id)
        assert c.commit_status(tx.id).csn == csn


@pytest.mark.parametrize("loss_on", ["maxcompute", "parts"])
def test_multi_table_loser_leaves_nothing(clients: list[Client], loss_on: str) -> None:
    """A transaction writing two tables that loses a conflict on one of them changes neither:
    its inserts into the other table never become visible."""
    x, y = table_name("lx"), table_name("ly")
    _, seed_x = create_seeded(clients, x, "parts")
    seed_csn, seed_y = create_seeded(clients, y, loss_on)
    tx_e, tx_l = begin_pair(clients, (0, 1), seed_csn)
    # earlier: rewrites the part of y that holds k=1 and k=2
    assert tx_e.update(y, pc.field("k") == 1, {"v": 11}) == 1
    # later: two inserts into x, an insert into y, then a delete in y of the same part
    tx_l.insert(x, pa.Table.from_pylist([{"k": 50, "v": 5}], schema=SCHEMA))
    tx_l.insert(x, pa.Table.from_pylist([{"k": 51, "v": 5}], schema=SCHEMA))
    tx_l.insert(y, pa.Table.from_pylist([{"k": 52, "v": 5}], schema=SCHEMA))
    assert tx_l.delete(y, pc.field("k") == 2) == 1
    e_csn = tx_e.commit()
    with pytest.raises(ConflictError) as info:
        tx_l.commit()
    assert info.value.winner == tx_e.id
    assert_left_nothing(clients, x, tx_l)
    assert_left_nothing(clients, y, tx_l)
    assert_contents(clients, x, e_csn, seed_x)
    assert_contents(clients, y, e_csn, [dict(r, v=11) if r["k"] == 1 else r for r in seed_y])


@pytest.mark.parametrize("policy", ["parts", "maxcompute", "append"])
def test_multi_statement_folding(clients: list[Client], policy: str) -> None:
    """Statements act on the transaction's own earlier writes: INSERT, UPDATE of own and
    committed rows, DELETE of an own row. The commit carries only the net effect, and the files
    of parts it wrote and removed again are gone."""
    table = table_name("ms")
    seed_csn, seed = create_seeded(clients, table, policy)
    pin = clients[1].begin()  # keeps the seed readable below: a plain read pins nothing
    with clients[1].transaction() as tx:
        tx.insert(table, pa.Table.from_pylist([{"k": 20, "v": 1}, {"k": 21, "v": 1}], schema=SCHEMA))
        assert tx.update(table, (pc.field("k") == 20) | (pc.field("k") == 4), {"v": 7}) == 2
        assert tx.delete(table, pc.field("k") == 21) == 1
        tx.insert(table, pa.Table.from_pylist([{"k": 22, "v": 2}], schema=SCHEMA))
        assert tx.delete(table, pc.field("k") == 22) == 1
    want = [dict(r, v=7) if r["k"] == 4 else r for r in seed] + [{"k": 20, "v": 7}]
    assert_contents(clients, table, tx.csn, want)
    assert rows_of(clients[0].read(table, snapshot=tx.csn - 1)) == model_rows(seed)
    pin.rollback()
    assert_files_are_recorded(clients, table, tx)
    assert seed_csn < tx.csn


def test_maxcompute_rebase_of_several_statements(clients: list[Client]) -> None:
    """A later transaction with UPDATE then DELETE (the DELETE rewriting the UPDATE's own
    output) after an earlier compaction merged their inputs: both are redone on the merged part,
    in order, as if they had run after the compaction."""
    table = table_name("mc")
    seed_csn, seed = create_seeded(clients, table, "maxcompute")
    tx_e, tx_l = begin_pair(clients, (1, 0), seed_csn)
    assert tx_e.compact(table, kind="minor") == 2
    assert tx_l.update(table, pc.field("k") >= 2, {"v": pc.field("v") + 1000}) == 3
    assert tx_l.delete(table, pc.field("v") == 1030) == 1
    tx_l.insert(table, pa.Table.from_pylist([{"k": 9, "v": 9}], schema=SCHEMA))
    tx_e.commit()
    csn = tx_l.commit()
    want = [{"k": 1, "v": 10}, {"k": 2, "v": 1020}, {"k": 4, "v": 1040}, {"k": 9, "v": 9}]
    assert_contents(clients, table, csn, want)
    assert_files_are_recorded(clients, table, tx_l)


@pytest.mark.parametrize(
    ("policy", "kinds", "outcome"),
    [
        # maxcompute: L loses to the first commit it conflicts with, in commit order
        ("maxcompute", ("MINOR_COMPACT", "INSERT", "MUTATE"), 1),
        ("maxcompute", ("INSERT", "OVERWRITE", "MAJOR_COMPACT"), 0),
        # ... and is rebased over several commits when it conflicts with none
        ("maxcompute", ("MINOR_COMPACT", "MUTATE", "OVERWRITE"), None),
        ("maxcompute", ("MAJOR_COMPACT", "INSERT", "OVERWRITE"), None),
        ("append", ("OVERWRITE", "INSERT", "INSERT"), None),
        ("append", ("MUTATE", "OVERWRITE", "INSERT"), None),
        ("append", ("MAJOR_COMPACT", "INSERT", "MUTATE"), 0),
        ("append", ("INSERT", "INSERT", "MINOR_COMPACT"), 0),
    ],
)
def test_three_transactions(
    clients: list[Client], policy: str, kinds: tuple[str, str, str], outcome: int | None
) -> None:
    """E1, E2, L from one snapshot commit in that order. E2 is decided against E1 by the table
    (each scenario picks an E2 that succeeds); L then against both: ``outcome`` is the index of
    the winner L must name, or None when L succeeds after being rebased over E1 and E2."""
    table = table_name(policy[:2])
    seed_csn, seed = create_seeded(clients, table, policy)
    roles = ["earlier", "middle", "later"]
    jobs = [Job(k, r, "update" if r != "later" else "delete") for k, r in zip(kinds, roles)]
    txs = [clients[i % 2].begin() for i in range(3)]
    assert {tx.snapshot for tx in txs} == {seed_csn}
    for job, tx in zip(jobs, txs):
        job.run(tx, table, SCHEMA)
    rows = seed
    csns = []
    for job, tx in zip(jobs[:2], txs[:2]):
        csns.append(tx.commit())
        rows = job.apply(rows)
    if outcome is None:
        csn = txs[2].commit()
        assert csn > csns[1]
        assert_contents(clients, table, csn, jobs[2].apply(rows))
        assert_files_are_recorded(clients, table, txs[2])
    else:
        with pytest.raises(ConflictError) as info:
            txs[2].commit()
        assert info.value.winner == txs[outcome].id
        assert_left_nothing(clients, table, txs[2])
        assert_contents(clients, table, csns[1], rows)


@pytest.mark.parametrize("order", ["insert-then-truncate", "truncate-then-insert"])
def test_maxcompute_whole_table_truncate(clients: list[Client], order: str) -> None:
    """A TRUNCATE of a whole partitioned table is an OVERWRITE of every partition: committed
    after an INSERT it succeeds and removes the inserted rows too (as if it ran after); committed
    before one into an existing partition, the INSERT fails."""
    table = table_name("mc")
    seed_csn, seed = create_seeded(clients, table, "maxcompute", partitioned=True)
    tx_t, tx_i = begin_pair(clients, (0, 1), seed_csn)
    assert tx_t.truncate(table) == 4
    tx_i.insert(table, pa.Table.from_pylist([{"p": 2, "k": 9, "v": 9}], schema=PSCHEMA))
    if order == "insert-then-truncate":
        tx_i.commit()
        csn = tx_t.commit()
        assert_contents(clients, table, csn, [])
        parts = clients[1].parts(table).to_pylist()
        assert parts and not [p for p in parts if p["visible"]]
        assert all(p["removal_tid"] == tx_t.id for p in parts)
    else:
        csn = tx_t.commit()
        with pytest.raises(ConflictError) as info:
            tx_i.commit()
        assert info.value.winner == tx_t.id
        assert_left_nothing(clients, table, tx_i)
        assert_contents(clients, table, csn, [])


# ---------------------------------------------------------------------------------------------
# A replica one step behind another (two replicas in this process, one follower held back)


@pytest.fixture
def two_replicas(zk_address: str, tmp_path) -> Iterator[tuple]:
    """Replicas A and B in this process on one ZooKeeper root and storage, without background
    merges or cleanup."""
    from replicas.replica import Replica, ReplicaConfig

    started = []
    try:
        for host in ("ra", "rb"):
            r = Replica(
                ReplicaConfig(
                    zk=zk_address,
                    storage_url=str(tmp_path / "storage"),
                    host_id=host,
                    data_dir=tmp_path / host,
                    merge_interval=0,
                    gc_interval=0,
                )
            )
            r.start()
            started.append(r)
        yield tuple(started)
    finally:
        for r in reversed(started):
            r.stop()


def hold_follower(replica) -> threading.Event:
    """Until the returned event is set, the replica's follower applies nothing."""
    gate = threading.Event()
    pull = replica.follower._pull
    replica.follower._pull = lambda: gate.wait(60) and pull()
    return gate


@pytest.mark.parametrize("policy,later_wins", [("maxcompute", False), ("append", True)])
def test_stale_local_versions_never_let_a_conflict_through(two_replicas: tuple, policy: str, later_wins: bool) -> None:
    """Replica B decides its batch on the target versions it has applied, without a ZooKeeper
    read; here it has not applied A's INSERT yet (its follower is held back). The multi's version
    check refuses that first attempt; B reads the versions, waits for A's commit to be applied,
    and decides again: under ``maxcompute`` its INSERT loses to A's, under ``append`` it commits
    after it. Either way as if B had seen A's commit from the start."""
    from coordinator.model.catalog import TableDef
    from coordinator.model.records import Insert
    from parts.io.format import write_part

    schema = pa.schema([("id", pa.int64())])
    a, b = two_replicas
    b.state.wait_applied(a.create_table(TableDef.new("stale", schema, conflict_policy=policy)), 30)
    ta, tb = a.transactions.begin(), b.transactions.begin()
    for r, t, v in ((a, ta, 1), (b, tb, 2)):
        r.transactions.stage(
            t.id,
            Insert(
                "stale", added=(write_part(r.storage, "stale", [], (), pa.table({"id": [v]}, schema=schema), t.id),)
            ),
        )
    gate = hold_follower(b)
    csn_a = a.transactions.commit(ta.id)
    outcome: list[object] = []
    committing = threading.Thread(target=lambda: outcome.append(_outcome_of(lambda: b.transactions.commit(tb.id))))
    committing.start()
    assert poll(lambda: b.committer.local_misses == 1, interval=0.01), "B's first attempt was not refused"
    assert b.info()["committer"]["local_version_misses"] == 1
    gate.set()
    committing.join(60)
    if later_wins:
        assert isinstance(outcome[0], int) and outcome[0] > csn_a, outcome
    else:
        assert isinstance(outcome[0], ConflictError) and outcome[0].winner == ta.id, outcome
    final = max(csn_a, outcome[0] if isinstance(outcome[0], int) else 0)
    for r in (a, b):
        r.state.wait_applied(final, 30)
        got = sorted(m.name for m in r.state.visible("stale", final))
        assert len(got) == (2 if later_wins else 1)


def test_a_table_created_elsewhere_is_waited_for_not_reported_unknown(two_replicas: tuple) -> None:
    """Replica B is asked about a table that A created and B has not applied yet (its follower
    held back): B waits for its follower to apply the creation and answers with the table."""
    from coordinator.model.catalog import TableDef

    a, b = two_replicas
    gate = hold_follower(b)
    a.create_table(TableDef.new("elsewhere", pa.schema([("id", pa.int64())])))
    assert b.state.table("elsewhere") is None
    answer: list[object] = []
    asking = threading.Thread(target=lambda: answer.append(_outcome_of(lambda: b.table("elsewhere"))))
    asking.start()
    gate.set()
    asking.join(60)
    assert isinstance(answer[0], TableDef) and answer[0].name == "elsewhere", answer


def _outcome_of(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except Exception as exc:  # the test asserts on it
        return exc
