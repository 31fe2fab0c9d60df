"""Outcomes decidable from any replica (docs/rules.md#outcomes; replicas/outcomes.py).

``commit_status(tid)`` must answer on every replica, and once the transaction's own replica is
gone (its ZooKeeper session expired, or it restarted) every replica answers ``committed`` or
``aborted`` for good: the owner, if it comes back, can no longer commit the transaction. Before
this, a replica other than the owner answered "not committed ... ask replica rX whether it still
runs", so a caller whose replica never came back could not learn the outcome.

Tests that restart replica 0 come after the one that needs its failpoints (a restarted replica
does not get them). The sessions here time out after 2 s, so a replica that is killed or frozen is gone within
seconds (the tests wait for it with a deadline, not a sleep).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from support.cluster import make_cluster  # tests/ is on sys.path
from support.failpoints import commit_held_at_multi
from support.waiting import NotYet, eventually
from support.zk import kazoo

from coordinator import LocalCluster
from coordinator.core.versions import Tid, incarnation_of
from coordinator.errors import TransactionAborted
from mergetxn.local.zkserver import ZooKeeperServer

pytestmark = pytest.mark.slow

SCHEMA = pa.schema([("id", pa.int64())])
SESSION = 2.0


@pytest.fixture(scope="module")
def failpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("failpoints")


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer, failpoints: Path
) -> Iterator[LocalCluster]:
    with make_cluster(
        tmp_path_factory,
        zk_server,
        "outcomes",
        replicas=2,
        session_timeout=SESSION,
        settings={"gc_interval": 0, "merge_interval": 0},
        env={"MERGETXN_FAILPOINTS": str(failpoints)},
    ) as c:
        yield c


def status_becomes(cluster: LocalCluster, replica: int, tid: str, want: str, timeout: float = 30.0):
    def check():
        status = cluster.client(replica).commit_status(tid)
        if status.status != want:
            raise NotYet(f"replica {replica} says {status}")
        return status

    return eventually(check, timeout)


def owner_version(cluster: LocalCluster, host: str) -> int:
    with kazoo(cluster.zk_address) as zk:
        return zk.get(f"{cluster.root}/replicas/{host}")[1].version


def restart(cluster: LocalCluster, i: int) -> None:
    cluster.kill_replica(i)
    cluster.start_replica(i)


def test_every_replica_answers_for_a_running_and_a_committed_transaction(cluster: LocalCluster) -> None:
    t = "outcomes_answers"
    c0, c1 = cluster.client(0), cluster.client(1)
    c0.create_table(t, SCHEMA)
    tx = c0.begin()
    tx.insert(t, pa.table({"id": [1]}, schema=SCHEMA))
    assert c1.commit_status(tx.id).status == "running"  # asked of its owner, which is alive
    csn = tx.commit()
    c1.wait_for(csn)
    for c in (c0, c1):
        status = c.commit_status(tx.id)
        assert (status.status, status.csn) == ("committed", csn)


def test_an_owner_that_comes_back_cannot_commit_what_another_replica_decided(
    cluster: LocalCluster, failpoints: Path
) -> None:
    """The owner freezes (SIGSTOP: a GC pause, a frozen VM) just before its commit multi; its
    session expires; another replica decides the transaction: aborted. Then the owner goes on:
    its commit must fail, and the rows never become visible, whatever replica is asked."""
    t = "outcomes_frozen"
    c0 = cluster.client(0)
    c0.create_table(t, SCHEMA)
    tx = c0.begin()
    tx.insert(t, pa.table({"id": [7]}, schema=SCHEMA))
    with commit_held_at_multi(failpoints, tx) as held:
        cluster.pause_replica(0)
        try:
            decided = status_becomes(cluster, 1, tx.id, "aborted")
            assert decided.csn is None
        finally:
            cluster.resume_replica(0)
    outcome = held.outcome
    assert len(outcome) == 1
    assert isinstance(outcome[0], TransactionAborted), f"the owner committed after all: {outcome[0]!r}"
    c1 = cluster.client(1)
    snap = max(cluster.client(0).snapshot(), c1.snapshot())
    for i in (0, 1):
        c = cluster.client(i)
        c.wait_for(snap)
        assert c.read(t).num_rows == 0
        assert c.commit_status(tx.id).status == "aborted"
    # The owner works again, under a new incarnation.
    with c0.transaction() as again:
        again.insert(t, pa.table({"id": [8]}, schema=SCHEMA))
    assert incarnation_of(Tid.parse(again.id)) > incarnation_of(Tid.parse(tx.id))
    assert cluster.client(0).read(t).column("id").to_pylist() == [8]


def test_any_replica_decides_once_the_owner_died(cluster: LocalCluster) -> None:
    t = "outcomes_died"
    c0 = cluster.client(0)
    c0.create_table(t, SCHEMA)
    tx = c0.begin()
    tx.insert(t, pa.table({"id": [1]}, schema=SCHEMA))
    before = owner_version(cluster, "r0")
    assert incarnation_of(Tid.parse(tx.id)) == before
    cluster.kill_replica(0)
    try:
        status = status_becomes(cluster, 1, tx.id, "aborted")  # once r0's session expired
        assert status.csn is None and "never will be" in status.reason, status
        assert owner_version(cluster, "r0") == before + 1  # r1 fenced r0's incarnation
    finally:
        cluster.start_replica(0)
    for i in (0, 1):
        assert cluster.client(i).commit_status(tx.id).status == "aborted"
    assert cluster.client(0).read(t).num_rows == 0


def test_a_restarted_owners_transactions_are_decided_everywhere(cluster: LocalCluster) -> None:
    t = "outcomes_restarted"
    c0 = cluster.client(0)
    c0.create_table(t, SCHEMA)
    tx = c0.begin()
    tx.insert(t, pa.table({"id": [1]}, schema=SCHEMA))
    restart(cluster, 0)  # at once: its old session may still live, its incarnation moved
    for i in (0, 1):
        status = cluster.client(i).commit_status(tx.id)
        assert status.status == "aborted", (i, status)


def test_a_commit_that_cannot_learn_its_outcome_says_how_to_ask(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the replica never answers again, commit() raises OutcomeUnknown naming the
    transaction and how to ask, not the last socket error."""
    from coordinator.errors import OutcomeUnknown, ReplicaUnavailable
    from mergetxn.client import client as client_module

    monkeypatch.setattr(client_module, "OUTCOME_WAIT", 0.3)

    def unreachable():
        raise ReplicaUnavailable("replica 127.0.0.1:1 is unreachable: [Errno 111] Connection refused")

    with pytest.raises(OutcomeUnknown) as info:
        client_module._await_outcome(unreachable, "transaction T5-1-r0", "commit_status('T5-1-r0') on any replica")
    text = str(info.value)
    assert "outcome of transaction T5-1-r0 is being decided" in text
    assert "commit_status('T5-1-r0') on any replica" in text and "Connection refused" in text
    assert isinstance(info.value, ReplicaUnavailable)  # callers that caught it before still do
