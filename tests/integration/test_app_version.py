"""Idempotent commits (docs/rules.md#idempotent-commits): ``tx.set_app_version(app_id, version)``
and ``client.app_version(app_id)``, against a real ZooKeeper and real replicas.

A commit carrying an application's version at or below the committed one makes nothing visible
and raises DuplicateCommit naming the app, the version and the CSN that holds it; of two racing
commits with the same version, on two replicas or in one replica's batch, exactly one wins. The
versions are state: a replica restarted after SIGKILL, and one rebuilt from a checkpoint after
the log was trimmed, still know them. Concurrency is ordered with barriers and failpoints.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.cluster import make_cluster
from support.data import ID_V, id_rows, ids
from support.waiting import wait_until
from test_log_tail import SMALL, Node, commit_until, settle, tail_of

import coordinator
from coordinator.core.conflicts import MAX_APP_VERSION, check_app_version, check_app_versions
from coordinator.core.targets import app_key
from coordinator.errors import DuplicateCommit, InvalidInput, TransactionAborted, from_dict
from coordinator.model.records import LogEntry, TxnRecord
from mergetxn.client import Client
from mergetxn.local.zkserver import ZooKeeperServer
from replicas import failpoints
from replicas.state import ReplicaState

SCHEMA = ID_V
BAD_APP_IDS = ["", 7, None, "x" * 257, "tab\there", "new\nline"]
BAD_VERSIONS = [-1, 1.5, True, "3", None, MAX_APP_VERSION + 1]


# ---------------------------------------------------------------------------------------------
# Pure: the rule, the input checks, the target key, the entry and the state


def test_rule_at_or_below_the_committed_version_is_a_duplicate() -> None:
    committed = {"a": (5, 40), "b": (0, 12)}
    assert check_app_versions("t1", {"a": 6}, committed) is None
    assert check_app_versions("t1", {"new": 0}, committed) is None
    assert check_app_versions("t1", {}, committed) is None
    for version in (5, 4, 0):
        dup = check_app_versions("t1", {"a": version}, committed)
        assert isinstance(dup, DuplicateCommit) and isinstance(dup, TransactionAborted)
        assert (dup.app_id, dup.version, dup.csn) == ("a", version, 40)
        assert "'a'" in dup.message and f"version {version}" in dup.message and "CSN 40" in dup.message
    # Several apps: any one at or below its committed version fails the whole transaction.
    dup = check_app_versions("t1", {"a": 9, "b": 0}, committed)
    assert (dup.app_id, dup.version, dup.csn) == ("b", 0, 12)
    # It crosses the RPC as the same class with the same details.
    back = from_dict(dup.to_dict())
    assert type(back) is DuplicateCommit and (back.app_id, back.version, back.csn) == ("b", 0, 12)


def test_input_checks() -> None:
    assert check_app_version("sink-1", 0) == ("sink-1", 0)
    assert check_app_version("ünïcode / app.1", MAX_APP_VERSION) == ("ünïcode / app.1", MAX_APP_VERSION)
    for bad in BAD_APP_IDS:
        with pytest.raises(InvalidInput, match="app_id"):
            check_app_version(bad, 1)
    for bad in BAD_VERSIONS:
        with pytest.raises(InvalidInput, match="version") as e:
            check_app_version("a", bad)
        assert e.value.details["app_id"] == "a"


def test_app_key_is_one_znode_name_per_id() -> None:
    ids_ = ["a", "A", "a.b", "a/b", "a%2Fb", ".", "..", "~", "x y", "ü", "a_b-c"]
    keys = [app_key(i) for i in ids_]
    assert len(set(keys)) == len(ids_)
    for k in keys:
        name = k.split(":", 1)[1]
        assert "/" not in k and name not in (".", "..") and k.startswith("@app:")
    assert app_key("sink_1-a") == "@app:sink_1-a"


def test_entry_and_state_carry_app_versions() -> None:
    rec = TxnRecord("T0-1-r0", None, (), {"a": 3, "b": 0})
    entry = LogEntry(time=1.0, versions={app_key("a"): 0, app_key("b"): 0}, txns=(rec,))
    back = LogEntry.from_dict(entry.to_dict(), "mem")
    assert back.txns[0].apps == {"a": 3, "b": 0}
    assert "apps" not in TxnRecord("T0-1-r0", None, ()).to_dict()  # the format without apps is unchanged
    with pytest.raises(Exception, match="malformed"):
        LogEntry.from_dict({**entry.to_dict(), "txns": [{**rec.to_dict(), "apps": {"a": -1}}]}, "mem")

    st = ReplicaState()
    st.apply(1, 0, 0, entry)
    st.apply(2, 0, 1, LogEntry(time=2.0, versions={app_key("a"): 1}, txns=(TxnRecord("T1-1-r0", None, (), {"a": 4}),)))
    assert st.app_version("a") == (4, 2) and st.app_version("b") == (0, 1) and st.app_version("c") is None
    st.prune(2)  # state, not history: pruning keeps it
    again = ReplicaState()
    again.restore(st.export(), "mem")
    assert again.apps == st.apps == {"a": (4, 2), "b": (0, 1)}


def test_spark_options() -> None:
    """The Spark data source's options app_id/app_version (a write without txn), checked before
    any task runs (the write itself: tests/spark/test_spark.py)."""
    from spark.datasource import settings

    base = {"path": "t", "replica": "h:1"}
    assert settings({**base, "app_id": "s", "app_version": "4"}, write=True).app == ("s", 4)
    assert settings(base, write=True).app is None
    for bad, match in (
        ({"app_id": "s"}, "together"),
        ({"app_version": "1"}, "together"),
        ({"app_id": "s", "app_version": "-1"}, "app_version"),
        ({"app_id": "s", "app_version": "x"}, "app_version"),
        ({"app_id": "", "app_version": "1"}, "app_id"),
        ({"app_id": "s", "app_version": "1", "txn": "T1-1-r0"}, "txn"),
    ):
        with pytest.raises(InvalidInput, match=match):
            settings({**base, **bad}, write=True)
    with pytest.raises(InvalidInput, match="writes"):
        settings({**base, "app_id": "s", "app_version": "1"})


# ---------------------------------------------------------------------------------------------
# One cluster of two replica processes for the module (tests use distinct app ids and tables)


@pytest.fixture(scope="module")
def cluster(zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    with make_cluster(tmp_path_factory, zk_server, "appver", replicas=2) as c:
        yield c


def files_of(cluster: coordinator.LocalCluster, tid: str) -> list[Path]:
    """Files in storage written by transaction ``tid`` (part names carry it)."""
    stem = tid.replace(":", "_")
    return [p for p in Path(cluster.storage_url).rglob("*") if p.is_file() and stem in p.name]


def test_set_and_read_back(c0: Client, c1: Client) -> None:
    c0.create_table("av_basic", SCHEMA)
    assert c0.app_version("basic") is None
    with c0.transaction() as tx:
        tx.insert("av_basic", id_rows(3))
        tx.set_app_version("basic", 0)
    assert c0.app_version("basic") == 0  # read your writes
    c1.wait_for(tx.csn)
    assert c1.app_version("basic") == 0
    assert c0.commit_status(tx.tid).status == "committed"
    # A higher version wins, on the other replica too; set twice in one transaction: the last counts.
    with c1.transaction() as tx2:
        tx2.insert("av_basic", id_rows(1, start=10))
        tx2.set_app_version("basic", 2)
        tx2.set_app_version("basic", 7)
    assert c1.app_version("basic") == 7
    c0.wait_for(tx2.csn)
    assert c0.app_version("basic") == 7
    assert ids(c0.read("av_basic")) == [0, 1, 2, 10]


def test_duplicate_makes_nothing_visible(cluster: coordinator.LocalCluster, c0: Client, c1: Client) -> None:
    c0.create_table("av_dup", SCHEMA, inline_rows=0)  # follows the losers' part files: no inlining
    with c0.transaction() as tx:
        tx.insert("av_dup", id_rows(2))
        tx.set_app_version("dup", 5)
    holder = tx.csn
    rows, parts = ids(c0.read("av_dup")), c0.parts("av_dup").to_pylist()
    for client, version in ((c0, 5), (c1, 4), (c0, 0)):
        loser = client.begin()
        loser.insert("av_dup", id_rows(4, start=100))
        loser.set_app_version("dup", version)
        assert files_of(cluster, loser.id)  # its part was written
        with pytest.raises(DuplicateCommit) as e:
            loser.commit()
        assert isinstance(e.value, TransactionAborted)
        assert (e.value.app_id, e.value.version, e.value.csn) == ("dup", version, holder)
        for word in ("'dup'", f"version {version}", f"CSN {holder}"):
            assert word in str(e.value)
        assert loser.csn is None
        assert client.commit_status(loser.tid).status == "aborted"
        assert ids(c0.read("av_dup")) == rows and c0.parts("av_dup").to_pylist() == parts
        assert files_of(cluster, loser.id) == []  # rolled back: its files deleted
    assert c0.app_version("dup") == 5 and c1.app_version("dup") == 5
    # The next version commits.
    with c1.transaction() as tx:
        tx.insert("av_dup", id_rows(1, start=50))
        tx.set_app_version("dup", 6)
    assert c1.app_version("dup") == 6 and 50 in ids(c1.read("av_dup"))


def test_version_alone_is_a_commit(c0: Client, c1: Client) -> None:
    """A sink's empty batch: a transaction with only set_app_version commits (a CSN of its own)
    and is refused as a duplicate like any other."""
    tx = c0.begin()
    tx.set_app_version("empty", 1)
    csn = tx.commit()
    assert csn > tx.snapshot
    assert c0.app_version("empty") == 1
    tx = c1.begin()
    tx.set_app_version("empty", 1)
    with pytest.raises(DuplicateCommit) as e:
        tx.commit()
    assert e.value.csn == csn
    # A transaction with nothing at all still commits at its snapshot, without a log entry.
    with c0.transaction() as nothing:
        pass
    assert nothing.csn == nothing.snapshot


def test_apps_are_independent(c0: Client) -> None:
    with c0.transaction() as tx:
        tx.set_app_version("ind-a", 3)
        tx.set_app_version("ind-b", 7)
    with c0.transaction() as tx:
        tx.set_app_version("ind-a", 4)
    assert (c0.app_version("ind-a"), c0.app_version("ind-b")) == (4, 7)
    # One app a duplicate fails the whole transaction, the other app's version included.
    tx = c0.begin()
    tx.set_app_version("ind-b", 8)
    tx.set_app_version("ind-a", 4)
    with pytest.raises(DuplicateCommit) as e:
        tx.commit()
    assert e.value.app_id == "ind-a"
    assert (c0.app_version("ind-a"), c0.app_version("ind-b")) == (4, 7)


def test_commit_parts_with_app_version(cluster: coordinator.LocalCluster, c0: Client) -> None:
    """The one-call commit takes ``apps`` too; a duplicate makes nothing visible and leaves the
    files it was handed to their writer (no commit names them: cleanup collects them later)."""
    from parts.io.format import write_part

    c0.create_table("av_parts", SCHEMA)
    meta = write_part(c0.storage, "av_parts", [], (), id_rows(2), "writer-1")
    csn = c0.commit_parts("av_parts", [meta], apps={"parts-sink": 1})
    assert c0.app_version("parts-sink") == 1
    meta2 = write_part(c0.storage, "av_parts", [], (), id_rows(2, start=20), "writer-2")
    with pytest.raises(DuplicateCommit) as e:
        c0.commit_parts("av_parts", [meta2], apps={"parts-sink": 1})
    assert e.value.csn == csn
    assert ids(c0.read("av_parts")) == [0, 1]
    assert (Path(cluster.storage_url) / meta2.path).exists()  # the caller's file
    assert meta2.name not in c0.parts("av_parts").column("name").to_pylist()


def race(clients: list[Client], table: str, app: str, version: int) -> tuple[list[int], list[Exception]]:
    """Every client begins a transaction writing one row and carrying ``app`` at ``version``;
    all commit at once (a barrier). Returns the CSNs and the errors."""
    barrier = threading.Barrier(len(clients))
    csns: list[int] = []
    errors: list[Exception] = []
    lock = threading.Lock()

    def run(k: int, client: Client) -> None:
        tx = client.begin()
        tx.insert(table, id_rows(1, start=version * 1000 + k))
        tx.set_app_version(app, version)
        barrier.wait()
        try:
            csn = tx.commit()
            with lock:
                csns.append(csn)
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test asserts
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=run, args=(k, c)) for k, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return csns, errors


def check_one_winner(csns: list[int], errors: list[Exception], version: int, app: str, n: int) -> None:
    assert len(csns) == 1, (csns, errors)
    assert len(errors) == n - 1 and all(isinstance(e, DuplicateCommit) for e in errors), errors
    assert all((e.app_id, e.version, e.csn) == (app, version, csns[0]) for e in errors)


def test_racing_commits_on_two_replicas_one_wins(c0: Client, c1: Client) -> None:
    c0.create_table("av_race", SCHEMA)
    for version in range(20):
        csns, errors = race([c0, c1], "av_race", "race", version)
        check_one_winner(csns, errors, version, "race", 2)
        c0.wait_for(csns[0])
        c1.wait_for(csns[0])
        assert c0.app_version("race") == c1.app_version("race") == version
    rows = ids(c0.read("av_race"))
    assert len(rows) == 20 and sorted({r // 1000 for r in rows}) == list(range(20))


def test_racing_commits_on_one_replica_one_wins(cluster: coordinator.LocalCluster) -> None:
    """Many connections to one replica commit the same version at once (they share batches)."""
    clients = [cluster.client(0) for _ in range(6)]
    clients[0].create_table("av_batch", SCHEMA)
    for version in range(5):
        csns, errors = race(clients, "av_batch", "batch", version)
        check_one_winner(csns, errors, version, "batch", len(clients))
    assert len(ids(clients[0].read("av_batch"))) == 5


def test_bad_input(c0: Client) -> None:
    with c0.transaction() as tx:
        for bad in BAD_APP_IDS:
            with pytest.raises(InvalidInput, match="app_id"):
                tx.set_app_version(bad, 1)
        for bad in BAD_VERSIONS:
            with pytest.raises(InvalidInput, match="version"):
                tx.set_app_version("bad-input", bad)
        tx.set_app_version("bad-input", 1)  # the transaction goes on
    assert c0.app_version("bad-input") == 1
    with pytest.raises(InvalidInput, match="app_id"):
        c0.app_version("")
    # The replica checks what comes over the wire, too.
    tx = c0.begin()
    with pytest.raises(InvalidInput, match="version"):
        c0.call("set_app_version", id=tx.id, app_id="bad-input", version=-3)
    with pytest.raises(InvalidInput, match="app_id"):
        c0.call("set_app_version", id=tx.id, app_id=["x"], version=3)
    with pytest.raises(InvalidInput, match="apps"):
        c0.call("commit_parts", table="av_basic", added=[], apps=[1])
    tx.rollback()


def test_versions_survive_sigkill(cluster: coordinator.LocalCluster, c0: Client) -> None:
    c1 = cluster.client(1)
    with c1.transaction() as tx:
        tx.set_app_version("killed", 11)
    c0.wait_for(tx.csn)
    cluster.kill_replica(1)
    with c0.transaction() as tx2:  # committed while replica 1 is down
        tx2.set_app_version("killed-while-down", 2)
    cluster.start_replica(1)
    back = cluster.client(1)
    back.wait_for(tx2.csn)
    assert back.app_version("killed") == 11 and back.app_version("killed-while-down") == 2
    t = back.begin()
    t.set_app_version("killed", 11)
    with pytest.raises(DuplicateCommit) as e:
        t.commit()
    assert e.value.csn == tx.csn


# ---------------------------------------------------------------------------------------------
# In-process replicas: a batch held at its multi; a replica rebuilt from a checkpoint


@pytest.fixture
def nodes(zk_address: str, tmp_path: Path) -> Iterator[Callable[..., list[Node]]]:
    started: list[Node] = []

    def make(n: int, **cfg: object) -> list[Node]:
        out = []
        for i in range(n):
            node = Node(zk_address, str(tmp_path / "storage"), tmp_path / f"replica-{i}", f"r{i}", **cfg)
            started.append(node)
            out.append(node.start())
        return out

    try:
        yield make
    finally:
        for node in started:
            node.stop()


def test_same_version_in_one_batch(nodes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The committer held at its multi while six commits of one app version queue up behind it:
    they are decided in one batch; one is accepted, the others wait for the next batch and lose
    to it with DuplicateCommit."""
    (r0,) = nodes(1)
    c = r0.client()
    c.create_table("av_held", SCHEMA)
    points = tmp_path / "failpoints"
    points.mkdir()
    monkeypatch.setattr(failpoints, "_DIR", str(points))
    blocker = c.begin()
    blocker.set_app_version("other", 1)
    armed, reached = points / "before_commit_multi", points / "before_commit_multi.reached"
    armed.touch()
    first = threading.Thread(target=blocker.commit)
    first.start()
    wait_until(reached.exists, 30, "the first commit to reach its multi", interval=0.01)
    txs = []
    for k in range(6):
        tx = r0.client().begin()
        tx.insert("av_held", id_rows(1, start=k))
        tx.set_app_version("held", 3)
        txs.append(tx)
    outcomes: list[object] = []
    lock = threading.Lock()

    def commit(tx) -> None:
        try:
            result: object = tx.commit()
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test asserts
            result = exc
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=commit, args=(tx,)) for tx in txs]
    for t in threads:
        t.start()
    wait_until(lambda: len(r0.r.committer._queue) == len(txs), 30, "every commit to queue", interval=0.01)
    armed.unlink()
    first.join(30)
    for t in threads:
        t.join(60)
    csns = [o for o in outcomes if isinstance(o, int)]
    errors = [o for o in outcomes if not isinstance(o, int)]
    check_one_winner(csns, errors, 3, "held", len(txs))
    assert len(ids(c.read("av_held"))) == 1 and c.app_version("held") == 3


def test_versions_survive_a_checkpoint_rebuild(nodes) -> None:
    """r1 is away while r0 commits app versions and enough more that the log is trimmed past
    r1's position: r1, and a replica with no data directory, rebuild from the checkpoint and
    know every version (and refuse a duplicate of one only the checkpoint holds)."""
    r0, r1 = nodes(2, **SMALL)
    c0 = r0.client()
    c0.create_table("av_filler", SCHEMA, auto_merge=False)
    r1.r.wait_snapshot(r0.r.state.applied)
    r1_position = r1.r.state.position
    r1.stop()
    with c0.transaction() as tx:
        tx.set_app_version("ckpt-a", 41)
        tx.set_app_version("ckpt-b", 0)
    held = tx.csn
    settle([r0])
    commit_until([r0], "av_filler", lambda: tail_of(r0)["trimmed_epoch"] >= r1_position[0], "a trim past r1")
    assert tail_of(r0)["csn"] > held
    r1.start()
    assert r1.r.tail.checkpoints_loaded == 1
    r1.r.wait_snapshot(r0.r.state.applied)
    c1 = r1.client()
    assert (c1.app_version("ckpt-a"), c1.app_version("ckpt-b")) == (41, 0)
    t = c1.begin()
    t.set_app_version("ckpt-a", 41)
    with pytest.raises(DuplicateCommit) as e:
        t.commit()
    assert e.value.csn == held
    fresh = Node(r0.config.zk, r0.config.storage_url, r0.config.data_dir.parent / "replica-new", "r9", **SMALL)
    try:
        fresh.start()
        fresh.r.wait_snapshot(r0.r.state.applied)
        assert fresh.r.tail.checkpoints_loaded == 1
        assert fresh.client().app_version("ckpt-a") == 41
    finally:
        fresh.stop()
