"""Whole reads of keys tables by deletion vectors (replicas/vectors.py,
docs/architecture/keys-vectors.md) on a real LocalCluster: at every snapshot of a random history
(inserts, overwrite upserts, deletes by key, read locks, a key written twice in a transaction,
two partitions, minor and major compactions), on a replica that follows the history forward and
on one that derived them at the end, after a restart too, a read by vectors gives exactly what
the fold gives (a read with an always-true filter folds). And the cases where the replica does
not send vectors (an update-mode version last, a snapshot older than they were derived at) still
read right, by the fold."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support.cluster import make_cluster

from coordinator.errors import CorruptMetadata
from mergetxn.client import Client
from mergetxn.local.cluster import LocalCluster
from mergetxn.local.zkserver import ZooKeeperServer

pytestmark = pytest.mark.zk

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


def by_fold(c: Client, table: str, snapshot: int) -> list[dict]:
    """The same read folded: a filter makes the reader fold (the vectors serve whole reads)."""
    return c.read(table, snapshot=snapshot, where=pc.field("k").is_valid()).to_pylist()


def sent_vectors(c: Client, table: str, snapshot: int | None = None) -> bool:
    args = {} if snapshot is None else {"snapshot": snapshot}
    return "vectors" in c.call("visible", table=table, vectors=True, lease="none", **args)


def history(c: Client, table: str, seed: int, commits: int = 30) -> list[int]:
    """A random history of commits on two partitions; the CSN after each."""
    rng = random.Random(seed)
    csns = []
    for i in range(commits):
        keys = lambda n: [(rng.randrange(2), rng.randrange(12)) for _ in range(n)]  # noqa: E731
        what = rng.choice(["insert", "insert", "upsert", "delete", "twice", "lock", "minor", "major"])
        if what in ("minor", "major"):
            c.compact(table, kind=what)
        else:
            with c.transaction() as tx:
                if what == "insert":
                    tx.insert(table, rows(sorted(set(keys(rng.randint(1, 6)))), f"i{i}-"))
                elif what == "upsert":
                    tx.upsert(table, rows(sorted(set(keys(3))), f"u{i}-"))
                elif what == "delete":
                    tx.delete_keys(table, rows(sorted(set(keys(2))), "").select(["p", "k"]))
                elif what == "twice":
                    tx.insert(table, rows([(0, 1), (1, 2)], f"a{i}-"))
                    tx.delete_keys(table, rows([(0, 1)], "").select(["p", "k"]))
                    tx.upsert(table, rows([(1, 2), (1, 3)], f"b{i}-"))
                else:
                    tx.lock_keys(table, rows(keys(2), "").select(["p", "k"]))
                    tx.insert(table, rows([(0, 11)], f"l{i}-"))
        csns.append(c.snapshot())
    return csns


def test_reads_by_vectors_are_the_fold_at_every_snapshot(cluster: LocalCluster) -> None:
    a, b = cluster.client(0), cluster.client(1)
    table = "dv_history"
    a.wait_for(a.create_table(table, SCHEMA, primary_key=("p", "k"), partition_by=("p",), conflict_policy="keys"))
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


def test_followed_over_many_commits_at_once(cluster: LocalCluster) -> None:
    """Reads every few commits: the vectors follow several commits in one go (parts added and
    merged away between two reads among them)."""
    a = cluster.client(0)
    table = "dv_steps"
    a.wait_for(a.create_table(table, SCHEMA, primary_key=("p", "k"), partition_by=("p",), conflict_policy="keys"))
    assert sent_vectors(a, table)
    csns = history(a, table, seed=3, commits=8)
    csns += history(a, table, seed=5, commits=8)
    for s in csns[3::4]:
        assert a.read(table, snapshot=s).to_pylist() == by_fold(a, table, s), f"at {s}"
    cols = a.read(table, columns=["v", "k"])
    assert cols.to_pylist() == [{"v": r["v"], "k": r["k"]} for r in by_fold(a, table, csns[-1])]


def test_an_update_mode_version_reads_by_the_fold_until_a_major_compaction(cluster: LocalCluster) -> None:
    a = cluster.client(0)
    table = "dv_update"
    a.wait_for(a.create_table(table, SCHEMA, primary_key=("p", "k"), conflict_policy="keys"))
    with a.transaction() as tx:
        tx.insert(table, rows([(0, 1), (0, 2)], "x"))
    assert sent_vectors(a, table)
    with a.transaction() as tx:
        tx.upsert(
            table,
            pa.table({"p": [0], "k": [2]}, schema=SCHEMA.remove(2)).append_column("v", pa.array(["y"])),
            update=True,
        )
    assert not sent_vectors(a, table), "a key whose last version is an update has a folded row"
    assert a.read(table).to_pylist() == [{"p": 0, "k": 1, "v": "x0.1"}, {"p": 0, "k": 2, "v": "y"}]
    a.compact(table, kind="major")
    assert sent_vectors(a, table)
    assert a.read(table).to_pylist() == [{"p": 0, "k": 1, "v": "x0.1"}, {"p": 0, "k": 2, "v": "y"}]


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
