"""Client sessions and client defaults (docs/rules.md#client-sessions).

A transaction belongs to its client's session: a client process that dies (SIGKILL) or stands
still (SIGSTOP) has its running transactions aborted on every replica within the replica setting
``client_session_timeout`` (2 s here), with a reason naming it in ``commit_status`` and the
events; a live client idle for longer keeps its transaction (its heartbeat). ``mergetxn status``
names long-running and orphaned transactions with their holders. A commit whose replica died
before answering is resolved by asking another replica, within the ZooKeeper session timeout
(2 s here), not after OUTCOME_WAIT's 15 s. Clients wait 30 s for an ordinary answer by default.

Before this work the transactions of dead clients ran until ``txn_max_seconds`` (an hour), a
commit whose replica died raised OutcomeUnknown after 15 s, and a call waited 10 minutes.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from support.cluster import make_cluster  # tests/ is on sys.path
from support.failpoints import Held
from support.waiting import NotYet, eventually

from coordinator import LocalCluster, connect
from coordinator.errors import InvalidInput, ReplicaUnavailable, TransactionAborted
from mergetxn.cli import cli
from mergetxn.client import client as client_module
from mergetxn.local.zkserver import ZooKeeperServer
from replicas.sessions import Sessions, check_session_id

SCHEMA = pa.schema([("id", pa.int64())])
TIMEOUT = 2.0  # client_session_timeout of the cluster's replicas
ZK_SESSION = 2.0
ROOT = Path(__file__).resolve().parents[2]

# A client process: begins a transaction on the replica at argv[1], writes a row into table
# argv[2], prints the transaction's id, then waits to be killed or stopped.
CLIENT = """
import sys, time
import pyarrow as pa
from coordinator import connect
c = connect(sys.argv[1])
tx = c.begin()
tx.insert(sys.argv[2], pa.table({"id": [1]}))
print(tx.id, flush=True)
while True:
    time.sleep(60)
"""


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
        "sessions",
        replicas=2,
        session_timeout=ZK_SESSION,
        settings={"client_session_timeout": TIMEOUT, "gc_interval": 0, "merge_interval": 0},
        env={"MERGETXN_FAILPOINTS": str(failpoints)},
    ) as c:
        yield c


def client_process(cluster: LocalCluster, table: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-c", CLIENT, cluster.replica_addresses[0], table],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    line = proc.stdout.readline().strip()
    assert line, proc.stderr.read()
    return proc, line


def aborted_everywhere(cluster: LocalCluster, tid: str, within: float) -> float:
    """Seconds until every replica answers ``aborted`` for ``tid`` (at most ``within``)."""
    start = time.monotonic()

    def check() -> None:
        for i in (0, 1):
            status = cluster.client(i).commit_status(tid)
            if status.status != "aborted":
                raise NotYet(f"replica {i}: {status}")

    eventually(check, within)
    return time.monotonic() - start


def assert_session_reason(cluster: LocalCluster, table: str, tid: str) -> None:
    for i in (0, 1):
        status = cluster.client(i).commit_status(tid)
        assert status.status == "aborted" and "client_session_timeout" in status.reason, (i, status)
    events = cluster.client(0).events(table).to_pylist()
    rollback = [e for e in events if e["event"] == "rollback" and e["tid"] == tid]
    assert rollback and "client_session_timeout" in rollback[0]["reason"], events


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_a_gone_clients_transaction_is_aborted_on_every_replica(cluster: LocalCluster, how: str) -> None:
    table = f"sessions_gone_{how.lower()}"
    cluster.client(0).create_table(table, SCHEMA)
    proc, tid = client_process(cluster, table)
    try:
        assert cluster.client(1).commit_status(tid).status == "running"
        proc.send_signal(getattr(signal, how))
        took = aborted_everywhere(cluster, tid, within=TIMEOUT + 8)
        assert took < TIMEOUT + 3, took
    finally:
        proc.kill()
        proc.wait()
    assert_session_reason(cluster, table, tid)
    later = cluster.client(0).join(tid)
    with pytest.raises(TransactionAborted, match="client_session_timeout"):
        later.insert(table, pa.table({"id": [2]}, schema=SCHEMA))
    assert cluster.client(0).read(table).num_rows == 0


def test_a_live_idle_client_keeps_its_transaction(cluster: LocalCluster) -> None:
    """Idle three session timeouts (its heartbeat thread beats meanwhile), then it commits.
    A detached transaction is held by no session, so it is not aborted either."""
    table = "sessions_idle"
    c = cluster.client(0)
    c.create_table(table, SCHEMA)
    tx = c.begin()
    tx.insert(table, pa.table({"id": [1]}, schema=SCHEMA))
    detached = c.begin(detached=True)
    time.sleep(3 * TIMEOUT)  # the point is the passing of time: nothing to wait for
    assert c.commit_status(tx.id).status == "running"
    assert tx.commit() > 0
    assert detached.commit() == detached.snapshot
    assert c.read(table).num_rows == 1


def test_status_names_long_running_and_orphaned_transactions_with_their_holders(cluster: LocalCluster) -> None:
    table = "sessions_status"
    c = cluster.client(0)
    c.create_table(table, SCHEMA, txn_max_seconds=20)  # long-running after a tenth of that
    tx = c.begin()
    tx.insert(table, pa.table({"id": [1]}, schema=SCHEMA))
    orphan = c.begin(detached=True)

    def listed() -> dict:
        r = CliRunner(env={"MERGETXN_REPLICA": cluster.replica_addresses[0]}).invoke(
            cli, ["status", "--json", "--no-storage-check"], catch_exceptions=False
        )
        report = json.loads(r.stdout)["transactions"]
        if tx.id not in {t["id"] for t in report["long_running"]} or orphan.id not in {
            t["id"] for t in report["orphaned"]
        }:
            raise NotYet(report)
        return report

    report = eventually(listed, 15)
    held = next(t for t in report["long_running"] if t["id"] == tx.id)
    assert held["session"] == c.session and held["host"] == "r0", held
    lost = next(t for t in report["orphaned"] if t["id"] == orphan.id)
    assert lost["session"] is None, lost
    r = CliRunner(env={"MERGETXN_REPLICA": cluster.replica_addresses[0]}).invoke(
        cli, ["status", "--no-storage-check"], catch_exceptions=False
    )
    assert f"long-running transaction {tx.id} on r0" in r.output and c.session in r.output, r.output
    assert f"orphaned transaction {orphan.id} on r0" in r.output, r.output
    tx.rollback()
    orphan.rollback()


def test_heartbeat_and_begin_refuse_a_bad_session(cluster: LocalCluster) -> None:
    c = cluster.client(0)
    for bad in (None, "", "x" * 65, 7, "a\nb"):
        with pytest.raises(InvalidInput, match="session"):
            c.call("heartbeat", session=bad)
    with pytest.raises(InvalidInput, match="session"):
        c.call("begin", session=["not", "a", "string"])
    assert c.call("heartbeat", session="nobody")["known"] is False  # remembered only while it holds some


@pytest.mark.parametrize(("where", "owner"), [("before_commit_multi", 0), ("after_commit_multi", 1)])
def test_a_commit_whose_replica_died_is_resolved_by_another(
    cluster: LocalCluster, failpoints: Path, where: str, owner: int
) -> None:
    """The owner is SIGKILLed while it holds the commit just before its multi (not in the log:
    aborted) or just after it (in the log: committed); the client asks the other replica and
    knows within seconds, instead of raising OutcomeUnknown after 15 s. (Each case kills another
    replica: a restarted one runs without failpoints.)"""
    table = f"sessions_died_{where}"
    c, other = cluster.client(owner), cluster.client(1 - owner)
    c.create_table(table, SCHEMA)
    other.table(table)
    tx = c.begin()
    tx.insert(table, pa.table({"id": [5]}, schema=SCHEMA))

    def peers() -> list[str]:
        if not c._heartbeat.peers:
            raise NotYet("the client has not learnt the other replicas yet")
        return c._heartbeat.peers

    assert eventually(peers, 10) == [cluster.replica_addresses[1 - owner]]
    held = Held(failpoints, where, tx.commit)
    try:
        start = time.monotonic()
        cluster.kill_replica(owner)
        outcome = held.outcome(20)
        took = time.monotonic() - start
    finally:
        (failpoints / where).unlink(missing_ok=True)
        cluster.start_replica(owner)
    assert took < client_module.OUTCOME_WAIT - 5, took
    if where == "before_commit_multi":
        assert isinstance(outcome, TransactionAborted), outcome
        assert other.read(table).num_rows == 0
    else:
        assert isinstance(outcome, int), outcome
        other.wait_for(outcome)
        assert other.read(table).column("id").to_pylist() == [5]


def test_a_call_to_a_stopped_replica_gives_up_after_the_clients_timeout(cluster: LocalCluster) -> None:
    c = connect(cluster.replica_addresses[1], timeout=1.5)
    assert inspect.signature(connect).parameters["timeout"].default == client_module.CALL_TIMEOUT == 30.0
    cluster.pause_replica(1)
    try:
        start = time.monotonic()
        with pytest.raises(ReplicaUnavailable):
            c.snapshot()
        assert time.monotonic() - start < 5
    finally:
        cluster.resume_replica(1)
    eventually(lambda: c.snapshot(), 30, retry_on=(ReplicaUnavailable,))


def test_long_calls_get_their_own_allowance() -> None:
    for action in ("commit", "commit_parts", "compact", "gc", "check", "changes", "visible"):
        assert client_module.LONG_CALLS[action] > client_module.CALL_TIMEOUT, action
    assert "snapshot" not in client_module.LONG_CALLS and "commit_status" not in client_module.LONG_CALLS


@pytest.mark.parametrize("bad", [-1, 0, float("nan"), "10", True, 10**9])
def test_a_bad_timeout_is_refused(bad: object) -> None:
    with pytest.raises(InvalidInput, match="timeout"):
        connect("127.0.0.1:1", timeout=bad)


# -- the replica's bookkeeping, pure ---------------------------------------------------------------


A, B = (None, "a"), (None, "b")  # sessions of an unsecured replica: no user


def test_sessions_expire_after_the_timeout_and_are_forgotten_when_they_hold_nothing() -> None:
    s = Sessions(2.0)
    s.began(A, 0.0)
    s.began(B, 0.0)
    assert s.expired({A, B}, 0.5) == {}
    assert s.heard("a", 1.0) and not s.heard("nobody", 1.0)
    assert s.expired({A, B}, 1.5) == {}
    assert s.expired({A, B}, 2.4) == {B: pytest.approx(2.4)}
    assert s.silent_for(A, 2.4) == pytest.approx(1.4)
    assert s.expired({A}, 2.6) == {}  # b holds nothing any more: forgotten
    assert not s.heard("b", 2.7)


def test_sessions_survive_the_replica_standing_still() -> None:
    """A gap in the checks longer than half the timeout: the replica itself stood still, so no
    client could be heard; nobody is expired for it."""
    s = Sessions(2.0)
    s.began(A, 0.0)
    assert s.expired({A}, 0.5) == {}
    assert s.expired({A}, 30.0) == {}
    for now in (30.4, 31.2, 32.0):
        assert s.expired({A}, now) == {}
    assert s.expired({A}, 32.3) == {A: pytest.approx(2.3)}


@pytest.mark.parametrize("bad", [None, "", "x" * 65, 3, "a\tb"])
def test_a_session_id_is_bounded(bad: object) -> None:
    with pytest.raises(InvalidInput):
        check_session_id(bad)


def test_the_command_line_bounds_every_request_by_its_timeout(cluster: LocalCluster) -> None:
    """``mergetxn`` promises that --timeout bounds each request: its client has no long-call
    allowances (a commit to a stopped replica fails within it), while a library client has them."""
    from mergetxn.cli import connected

    with connected(cluster.replica_addresses[0], 5.0) as cli_client:
        assert cli_client._long_calls == {}
    assert cluster.client(0)._long_calls == client_module.LONG_CALLS
    with pytest.raises(InvalidInput, match="long_calls"):
        client_module.Client(cluster.replica_addresses[0], long_calls={"commit": -1})
