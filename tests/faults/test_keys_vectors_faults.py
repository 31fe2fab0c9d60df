"""Deletion vectors of keys tables (replicas/vectors.py, docs/architecture/keys-vectors.md) under
replica crashes, at failpoints (replicas/failpoints.py):

* a replica killed after an upsert's multi (in the log, not yet applied or answered), its vectors
  following the table: the commit resolves through the other replica, which reads it by vectors;
  the killed replica, restarted, derives its vectors again and reads every snapshot (before the
  commit and at it) by vectors as the fold reads it, as the other replica does;
* a follower held behind the log (``follower_apply``) while upserts, deletes and a major
  compaction commit, then killed: restarted, it reads every one of those snapshots by vectors as
  the fold and as the replica that followed them one commit at a time.

The fold is what a client that asks for no vectors reads (the reference on the same replica).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pytest
from support.cluster import make_cluster  # tests/ is on sys.path
from support.failpoints import Held, failpoint_dirs, start
from support.folding import folding
from support.waiting import wait_until

from mergetxn.client import Client
from mergetxn.local.zkserver import ZooKeeperServer

pytestmark = pytest.mark.zk

SCHEMA = pa.schema([pa.field("p", pa.int64(), False), pa.field("k", pa.int64(), False), ("v", pa.string())])


@contextmanager
def two_replicas(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer, name: str) -> Iterator[Any]:
    """Two replicas, each with a failpoint directory of its own; no merge or cleanup rounds."""
    failpoints = failpoint_dirs(tmp_path_factory, f"{name}_failpoints")
    settings = {"merge_interval": 0, "gc_interval": 0}
    with make_cluster(tmp_path_factory, zk_server, name, replicas=2, session_timeout=2.0, settings=settings) as c:
        for i in (0, 1):
            c.stop_replica(i)
            start(c, failpoints, i)
        yield c, failpoints


def keys_table(c: Client, table: str) -> None:
    c.wait_for(
        c.create_table(
            table,
            SCHEMA,
            primary_key=("p", "k"),
            partition_by=("p",),
            conflict_policy="keys",
            auto_merge=False,
            retention_seconds=3600,  # every snapshot of the test stays readable
        )
    )


def rows(pairs: list[tuple[int, int]], tag: str) -> pa.Table:
    return pa.table(
        {"p": [p for p, _ in pairs], "k": [k for _, k in pairs], "v": [f"{tag}{p}.{k}" for p, k in pairs]},
        schema=SCHEMA,
    )


def keys(pairs: list[tuple[int, int]]) -> pa.Table:
    return rows(pairs, "").select(["p", "k"])


def sent_vectors(c: Client, table: str, snapshot: int) -> bool:
    return "vectors" in c.call("visible", table=table, snapshot=snapshot, vectors=True, lease="none")


def reads_by_vectors_as_the_fold(c: Client, table: str, csns: list[int]) -> list[list[dict]]:
    """``c``'s whole read at each of ``csns`` (oldest first: the vectors are derived at the first
    and followed from there), each by vectors and equal to the fold's."""
    fold = folding(Client(c.address, credentials=c.credentials))
    got = []
    for s in csns:
        assert sent_vectors(c, table, s), f"no vectors at {s}"
        rows_ = c.read(table, snapshot=s).to_pylist()
        assert rows_ == fold.read(table, snapshot=s).to_pylist(), f"at {s}"
        got.append(rows_)
    fold.close()
    return got


def upserts(c: Client, table: str, first: int, n: int) -> list[int]:
    """``n`` commits of upserts and deletes over a few keys in two partitions; the CSN of each."""
    csns = []
    for i in range(first, first + n):
        with c.transaction() as tx:
            tx.upsert(table, rows([(i % 2, i % 5), (1, 7), (0, 10 + i)], f"u{i}-"))
            if i % 3 == 0:
                tx.delete_keys(table, keys([((i + 1) % 2, (i + 2) % 5)]))
        csns.append(c.snapshot())
    return csns


def test_a_replica_killed_after_an_upserts_multi_reads_it_by_vectors_once_restarted(
    tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer
) -> None:
    with two_replicas(tmp_path_factory, zk_server, "dv_killed_multi") as (cluster, failpoints):
        c0, c1 = cluster.client(0), cluster.client(1)
        table = "dvf_multi"
        keys_table(c0, table)
        csns = upserts(c0, table, 0, 6)
        c1.wait_for(csns[-1])
        reads_by_vectors_as_the_fold(c0, table, csns)  # r0's vectors follow the table from here
        reads_by_vectors_as_the_fold(c1, table, csns)
        tx = c0.begin()
        tx.upsert(table, rows([(0, 0), (1, 1), (0, 42)], "last-"))
        tx.delete_keys(table, keys([(1, 7)]))
        held = Held(failpoints[0], "after_commit_multi", tx.commit)
        cluster.kill_replica(0)
        outcome = held.outcome(30)
        assert isinstance(outcome, int) and outcome > csns[-1], outcome  # resolved through r1: committed
        c1.wait_for(outcome)
        want = reads_by_vectors_as_the_fold(c1, table, [*csns, outcome])
        last = {(r["p"], r["k"]): r["v"] for r in want[-1]}
        assert last[(0, 42)] == "last-0.42" and (1, 7) not in last
        (failpoints[0] / "after_commit_multi").unlink()
        start(cluster, failpoints, 0)
        c0 = cluster.client(0)
        c0.wait_for(outcome)
        assert reads_by_vectors_as_the_fold(c0, table, [*csns, outcome]) == want


def test_a_follower_killed_behind_upserts_and_a_compaction_reads_them_by_vectors(
    tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer
) -> None:
    with two_replicas(tmp_path_factory, zk_server, "dv_follower_behind") as (cluster, failpoints):
        c0, c1 = cluster.client(0), cluster.client(1)
        table = "dvf_behind"
        keys_table(c0, table)
        csns = upserts(c0, table, 0, 4)
        c1.wait_for(csns[-1])
        reads_by_vectors_as_the_fold(c1, table, csns[-1:])  # r1 derived its vectors here
        reads_by_vectors_as_the_fold(c0, table, csns)  # r0 follows each commit from the first
        applied = csns[-1]
        (failpoints[1] / "follower_apply.reached").unlink(missing_ok=True)
        armed = failpoints[1] / "follower_apply"
        armed.touch()
        behind = upserts(c0, table, 4, 3)
        wait_until((failpoints[1] / "follower_apply.reached").exists, 30, "r1's follower to hold", interval=0.01)
        behind.append(c0.compact(table, kind="major"))
        behind += upserts(c0, table, 7, 3)
        assert c1.snapshot() == applied  # r1 stood still all along
        cluster.kill_replica(1)
        armed.unlink()
        start(cluster, failpoints, 1)
        c1 = cluster.client(1)
        c1.wait_for(behind[-1])
        every = [*csns, *behind]
        want = reads_by_vectors_as_the_fold(c0, table, every)
        assert reads_by_vectors_as_the_fold(c1, table, every) == want
