"""Ids are no capabilities (docs/surface.md#users-roles-and-grants): on a secured cluster a client
session (its heartbeats, its async commits' flush) and a read lease (renew, release) act for the
user that made them, or an admin; another user's id is answered as an unknown id is. ``info``
shows a non-admin neither ZooKeeper's address nor the storage URL nor another table, while its
reads and writes work as before. Dropping a user aborts its running transactions on every replica,
``commit_status`` saying why.

The first part checks the pure decisions (coordinator/core/grants.py, replicas/sessions.py); the
rest drives a LocalCluster(secure=True) with its own ZooKeeper and two replica processes whose
``client_session_timeout`` is short, every call over TLS as one of the users made here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from support.cluster import make_cluster  # tests/ is on sys.path
from support.waiting import poll

import coordinator
from coordinator.core.grants import Grantee, Role, acts_for
from coordinator.wire.rpc import RpcClient
from coordinator.wire.security import Credentials
from mergetxn.cli import cli
from replicas.sessions import Sessions

pytestmark = pytest.mark.zk

SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.string())])
KEYS = pa.schema([pa.field("id", pa.int64(), nullable=False), ("k", pa.string())])
ROWS = pa.table({"id": [1, 2], "k": ["a", "b"]})
TIMEOUT = 2.0  # client_session_timeout of the cluster's replicas
HIDDEN = "not_for_alice_table"  # a table alice has no grant on: its name must not reach her

ALICE, BOB = Grantee("alice", Role.WRITER), Grantee("bob", Role.READER, frozenset({"t"}))
ADMIN = Grantee("root", Role.ADMIN)


# =============================================================================================
# The pure decisions
# =============================================================================================


def test_an_id_acts_for_its_own_user_or_an_admin_only() -> None:
    assert acts_for(ALICE, "alice") and acts_for(ADMIN, "alice") and acts_for(ADMIN, None)
    assert not acts_for(BOB, "alice") and not acts_for(ALICE, None)
    assert acts_for(None, "alice") and acts_for(None, None)  # an unsecured replica (or the replica itself)


def test_a_session_id_is_each_users_own_name() -> None:
    """Two users' sessions of one id are two sessions: one user's heartbeat keeps its own alive
    and never the other's; an admin's keeps every session of that id alive."""
    s = Sessions(2.0)
    s.began(("alice", "x"), 0.0)
    assert not s.heard("x", 1.0, BOB)  # answered as an unknown id
    s.began(("bob", "x"), 1.0)
    assert s.heard("x", 1.5, BOB)  # bob's own
    assert s.expired({("alice", "x"), ("bob", "x")}, 2.4) == {("alice", "x"): pytest.approx(2.4)}
    assert s.heard("x", 2.5, ADMIN)
    assert s.silent_for(("alice", "x"), 2.5) == 0.0 and s.silent_for(("bob", "x"), 2.5) == 0.0


# =============================================================================================
# A secured cluster
# =============================================================================================


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    with make_cluster(
        tmp_path_factory, None, "user_ids", replicas=2, secure=True, settings={"client_session_timeout": TIMEOUT}
    ) as c:
        yield c


@pytest.fixture(scope="module")
def admin(cluster: coordinator.LocalCluster) -> Iterator[coordinator.Client]:
    client = cluster.client(0)
    client.create_table("t", SCHEMA, auto_merge=False)
    client.create_table(HIDDEN, SCHEMA, auto_merge=False)
    client.create_table("k", KEYS, primary_key=("id",), conflict_policy="keys", atomicity="none")
    yield client
    client.close()


@pytest.fixture(scope="module")
def users(cluster: coordinator.LocalCluster, admin: coordinator.Client) -> dict[str, Credentials]:
    """alice: a writer with grants on ``t`` and ``k``; bob: a writer of every table."""
    return {"alice": cluster.add_user("alice", "writer", ["t", "k"]), "bob": cluster.add_user("bob", "writer")}


def rpc(cluster: coordinator.LocalCluster, creds: Credentials | None, i: int = 0) -> RpcClient:
    return RpcClient(cluster.replica_addresses[i], 30, creds)


def status(client: RpcClient, tid: str) -> dict:
    return client.call("commit_status", {"tid": tid})


def test_another_users_heartbeats_keep_no_session_alive_and_an_admins_do(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, users: dict[str, Credentials]
) -> None:
    """alice's client stops beating (it died, say): its transaction is aborted after the session
    timeout although bob heartbeats its session id all along, from a transaction of his own under
    that same id too; the admin's heartbeats keep another of her sessions alive, until they stop."""
    a, b, root = rpc(cluster, users["alice"]), rpc(cluster, users["bob"]), rpc(cluster, cluster.credentials)
    try:
        abandoned = a.call("begin", {"session": "alice-session"})["id"]
        kept = a.call("begin", {"session": "alice-kept"})["id"]
        bobs = b.call("begin", {"session": "alice-session"})["id"]  # his own, under her id
        unknown = b.call("heartbeat", {"session": "no-such-session"})
        assert b.call("heartbeat", {"session": "alice-kept"}) == unknown  # hers: as an unknown id
        started = time.monotonic()
        while time.monotonic() - started < 2 * TIMEOUT or status(root, abandoned)["status"] == "running":
            assert time.monotonic() - started < 5 * TIMEOUT, "alice's abandoned transaction still runs"
            assert b.call("heartbeat", {"session": "alice-session"})["known"] is True  # his own session
            assert root.call("heartbeat", {"session": "alice-kept"})["known"] is True
            time.sleep(TIMEOUT / 5)  # the pace of a client's heartbeats (a third of the timeout, or faster)
        gone = status(root, abandoned)
        assert gone["status"] == "aborted" and "alice-session" in gone["reason"], gone
        assert "client_session_timeout" in gone["reason"]
        assert status(root, bobs)["status"] == "running"  # bob's heartbeats kept his own
        assert status(root, kept)["status"] == "running"  # the admin's kept hers
        assert poll(lambda: status(root, kept)["status"] == "aborted", timeout=5 * TIMEOUT)  # no one beats now
        b.call("rollback", {"id": bobs})
    finally:
        for c in (a, b, root):
            c.close()


def test_another_users_lease_is_neither_renewed_nor_released(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, users: dict[str, Credentials]
) -> None:
    a, b, root = rpc(cluster, users["alice"]), rpc(cluster, users["bob"]), rpc(cluster, cluster.credentials)
    try:
        lease = a.call("visible", {"table": "t"})["lease"]
        assert lease
        gone = "0" * len(lease)
        assert b.call("renew", {"lease": lease}) == b.call("renew", {"lease": gone}) == {"renewed": False}
        assert b.call("release", {"lease": lease}) == b.call("release", {"lease": gone}) == {"released": False}
        assert a.call("renew", {"lease": lease})["renewed"] is True  # still held: bob's release did nothing
        assert root.call("renew", {"lease": lease})["renewed"] is True  # an admin may
        assert root.call("release", {"lease": lease}) == {"released": True}
        assert a.call("renew", {"lease": lease}) == {"renewed": False}
    finally:
        for c in (a, b, root):
            c.close()


def test_another_users_flush_finds_none_of_the_async_commits_of_a_session(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, users: dict[str, Credentials]
) -> None:
    """bob's flush of alice's session id is answered as the flush of a session that made no async
    commit (nothing of hers is waited for, shown or acknowledged); an admin's finds hers."""
    b, root = rpc(cluster, users["bob"]), rpc(cluster, cluster.credentials)
    try:
        with coordinator.connect(cluster.replica_addresses[0], credentials=users["alice"]) as a:
            tx = a.begin(atomicity="none", durability="async")
            tx.insert("k", pa.table({"id": [7], "k": ["async"]}, schema=KEYS))
            assert tx.commit() is None  # queued
            unknown = b.call("flush", {"session": "no-such-session", "ack": []})
            assert unknown["accepted"] == 0
            assert b.call("flush", {"session": a.session, "ack": []}) == unknown
            by_admin = root.call("flush", {"session": a.session, "ack": []})
            assert by_admin["accepted"] == 1 and by_admin["csn"] is not None
            assert a.flush() == by_admin["csn"]
    finally:
        b.close()
        root.close()


def test_info_shows_a_non_admin_neither_zookeeper_nor_storage_nor_other_tables(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, users: dict[str, Credentials], tmp_path: Path
) -> None:
    """alice's ``info`` (and ``mergetxn status`` as alice) names no ZooKeeper address, no storage URL
    and no table she has no grant on, while her inserts and reads work; the admin's names them."""
    full = admin.call("info")
    assert full["zk"] and full["storage_url"] and HIDDEN in full["tables"]
    secrets = [cluster.zk_address, full["zk"], full["storage_url"], cluster.storage_url, HIDDEN]
    with coordinator.connect(cluster.replica_addresses[1], credentials=users["alice"]) as a:
        info = a.call("info")
        shown = json.dumps(info)
        for hidden in secrets:
            assert hidden not in shown, hidden
        assert sorted(info["tables"]) == ["k", "t"] and info["host_id"]
        assert "zk" not in info and "root" not in info and "storage_url" not in info
        a.insert("t", ROWS)
        with a.transaction() as tx:
            tx.insert("t", pa.table({"id": [3], "k": ["c"]}))
            assert tx.read("t").num_rows >= 3
        assert a.read("t").num_rows >= 3 and a.storage.url == full["storage_url"]
    creds_file = users["alice"].to_file(tmp_path / "alice.json")
    out = CliRunner().invoke(
        cli, ["status", "--replica", cluster.replica_addresses[0], "--credentials", str(creds_file), "--json"]
    )
    assert out.exception is None or isinstance(out.exception, SystemExit), out.output
    for hidden in secrets:
        assert hidden not in out.output, hidden


def test_dropping_a_user_aborts_its_running_transactions_on_every_replica(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, users: dict[str, Credentials]
) -> None:
    """carol holds a transaction on each replica (one held by her client's session, one detached,
    as a Spark job's is): the admin drops her through replica 0, and both end aborted, the reason
    naming her and the drop, whichever replica is asked."""
    carol = cluster.add_user("carol", "writer", ["t"])
    on0 = coordinator.connect(cluster.replica_addresses[0], credentials=carol)
    on1 = coordinator.connect(cluster.replica_addresses[1], credentials=carol)
    asks = [rpc(cluster, cluster.credentials, 0), rpc(cluster, cluster.credentials, 1)]
    try:
        held, detached = on0.begin(), on1.begin(detached=True)
        held.insert("t", ROWS)
        detached.insert("t", ROWS)
        admin.drop_user("carol")
        for tx in (held, detached):
            for ask in asks:
                assert poll(lambda ask=ask, tx=tx: status(ask, tx.id)["status"] != "running", timeout=3 * TIMEOUT)
                said = status(ask, tx.id)
                assert said["status"] == "aborted", said
                assert "user 'carol' was dropped" in said["reason"], said
    finally:
        for c in (on0, on1, *asks):
            c.close()
