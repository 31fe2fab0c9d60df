"""Small writes under crashes (docs/architecture/small-writes.md): replica processes SIGKILLed at
failpoints (replicas/failpoints.py) around inlined commits and their flush.

* a replica killed after an inlined insert's multi (in the log, not answered): the client's
  commit resolves as committed through the other replica, both replicas (the killed one once
  restarted) read its rows exactly once, and no file was ever written for it;
* a replica killed mid-flush, after the merged file is written and staged but before its commit
  (``flush_before_commit``), or after the flush's multi, before the replica applied it
  (``flush_after_multi``): every snapshot before and after reads the same rows on both replicas,
  nothing lost or duplicated; the orphan merged file is removed when the replica restarts and was
  never visible; a later flush succeeds;
* a follower killed while held behind the log (``follower_apply``) on inlined commits and a flush:
  restarted from its local checkpoint, its WAL and the log, it reads at every CSN (one between
  the inlined commits and the flush included) what the other replica reads.

Each replica runs with a failpoint directory of its own, so a point armed for one never holds the
other; a restarted replica gets its directory again.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pytest
from support.cluster import make_cluster  # tests/ is on sys.path
from support.failpoints import Held, failpoint_dirs, hold, start
from support.waiting import NotYet, eventually, wait_until

from coordinator import LocalCluster
from coordinator.errors import MergetxnError
from mergetxn.client.client import Client
from mergetxn.local.zkserver import ZooKeeperServer
from replicas import checkpoint

pytestmark = pytest.mark.zk

SCHEMA = pa.schema([("n", pa.int64()), ("s", pa.string())])
CHECKPOINT_EVERY = 1  # a local checkpoint at every look at the tail (tail_check_seconds) that finds news


@pytest.fixture(scope="module")
def failpoints(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return failpoint_dirs(tmp_path_factory)


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer, failpoints: list[Path]
) -> Iterator[LocalCluster]:
    with two_replicas(tmp_path_factory, zk_server, "inline_faults", failpoints) as c:
        yield c


@contextmanager
def two_replicas(
    tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer, name: str, failpoints: list[Path]
) -> Iterator[LocalCluster]:
    settings = {
        "merge_interval": 0,  # flushes happen when a test says so (compact)
        "gc_interval": 0,
        "local_checkpoint_every": CHECKPOINT_EVERY,
    }
    with make_cluster(tmp_path_factory, zk_server, name, replicas=2, session_timeout=2.0, settings=settings) as c:
        for i in (0, 1):  # each with its own failpoints
            c.stop_replica(i)
            start(c, failpoints, i)
        yield c


@pytest.fixture
def restore(cluster: LocalCluster, failpoints: list[Path]) -> Iterator[None]:
    """Whatever a test armed or killed, the next finds disarmed and running."""
    yield
    for i in (0, 1):
        for f in failpoints[i].iterdir():
            f.unlink()
        if cluster.replica_pid(i) is None:
            start(cluster, failpoints, i)


def rows(ns: range | list[int]) -> pa.Table:
    ns = list(ns)
    return pa.table({"n": ns, "s": [f"s{n}" for n in ns]}, schema=SCHEMA)


def ns(t: pa.Table) -> list[int]:
    return sorted(t.column("n").to_pylist())  # sorted, duplicates kept: "exactly once" is checked


def files(cluster: LocalCluster, table: str) -> list[Path]:
    """Every Parquet file in storage under ``table``."""
    return sorted((Path(cluster.storage_url) / table).rglob("*.parquet"))


def visible(client: Client, table: str) -> list[dict]:
    return [r for r in client.parts(table).to_pylist() if r["visible"]]


def parts_of(client: Client, table: str) -> list[dict]:
    """Every part record of ``table`` (removed ones included) as the replica has it, without
    ``why_kept``/``collected``: why a removed part is kept (a read lease) is the replica's own."""
    return [{k: v for k, v in r.items() if k not in ("why_kept", "collected")} for r in client.parts(table).to_pylist()]


def recovered(cluster: LocalCluster, i: int) -> dict[str, int]:
    """What replica ``i``'s last start said it recovered from (replicas/replica.py's line)."""
    text = (cluster.replica_dir(i) / "replica.log").read_text(errors="replace")
    found = re.findall(
        r"local snapshot at CSN (\d+), (\d+) WAL records replayed, caught up from ZooKeeper from CSN (\d+) to (\d+)",
        text,
    )
    assert found, "no recovery line in the replica's log"
    local, replayed, pulled_from, pulled_to = map(int, found[-1])
    return {"local": local, "replayed": replayed, "pulled_from": pulled_from, "pulled_to": pulled_to}


def wait_for_peers(c: Client, other: str) -> None:
    def peers() -> list[str]:
        if not c._heartbeat.peers:
            raise NotYet("the client has not learnt the other replicas yet")
        return c._heartbeat.peers

    assert eventually(peers, 10) == [other]


# ---------------------------------------------------------------------------------------------


def test_a_replica_killed_after_an_inlined_commits_multi(
    cluster: LocalCluster, failpoints: list[Path], restore: None
) -> None:
    t = "inl_killed_after_multi"
    c0, c1 = cluster.client(0), cluster.client(1)
    c0.create_table(t, SCHEMA, auto_merge=False)
    before = c0.insert(t, rows(range(3)))  # inlined
    c1.wait_for(before)
    wait_for_peers(c0, cluster.replica_addresses[1])
    tx = c0.begin()
    tx.insert(t, rows(range(10, 15)))
    held = Held(failpoints[0], "after_commit_multi", tx.commit)
    cluster.kill_replica(0)
    outcome = held.outcome(30)
    assert isinstance(outcome, int) and outcome > before, outcome  # resolved through r1: committed
    status = c1.commit_status(tx.id)
    assert (status.status, status.csn) == ("committed", outcome), status
    want = [0, 1, 2, 10, 11, 12, 13, 14]
    c1.wait_for(outcome)
    assert ns(c1.read(t)) == want
    assert ns(c1.read(t, snapshot=before)) == [0, 1, 2]
    (failpoints[0] / "after_commit_multi").unlink()
    start(cluster, failpoints, 0)
    c0 = cluster.client(0)
    c0.wait_for(outcome)
    assert c0.commit_status(tx.id).csn == outcome
    for c in (c0, c1):
        assert ns(c.read(t, snapshot=outcome)) == want
        assert ns(c.read(t)) == want
        assert ns(c.read(t, snapshot=before)) == [0, 1, 2]
        assert [p["inlined"] for p in visible(c, t)] == [True, True]
    assert files(cluster, t) == []  # never a file, for either commit
    assert not list((Path(cluster.storage_url) / t).rglob("*.json"))


@pytest.mark.parametrize("by", ["compact", "merge_round"])
@pytest.mark.parametrize("where", ["flush_before_commit", "flush_after_multi"])
def test_a_replica_killed_mid_flush(
    cluster: LocalCluster, failpoints: list[Path], restore: None, where: str, by: str
) -> None:
    """The flush is run by ``compact`` on r0, or by r0's background merge round (r0 restarted with
    merge rounds and ``inline_flush_parts`` 3; r1 runs none): killed at ``where``, r0 restarts
    without merge rounds."""
    t = f"inl_mid_{where}_{by}"
    c0, c1 = cluster.client(0), cluster.client(1)
    c0.create_table(t, SCHEMA, auto_merge=False)
    history: list[tuple[int, list[int]]] = []
    have: list[int] = []
    for k in range(3):
        have += list(range(10 * k, 10 * k + 4))
        history.append((c0.insert(t, rows(range(10 * k, 10 * k + 4))), sorted(have)))
    assert files(cluster, t) == []
    c1.wait_for(history[-1][0])
    if by == "compact":
        held: Held | None = Held(failpoints[0], where, lambda: cluster.client(0).compact(t))
    else:
        held = None
        flushing_round(cluster, failpoints, where)
    (merged,) = files(cluster, t)  # written (and staged) before its commit, in both cases
    if where == "flush_before_commit":
        assert c1.snapshot() == history[-1][0]  # nothing in the log
        assert all(p["inlined"] for p in visible(c1, t))
    cluster.kill_replica(0)
    if held is not None:
        outcome = held.outcome(30)
        assert isinstance(outcome, MergetxnError), outcome  # the caller was not answered
    (failpoints[0] / where).unlink()
    start(cluster, failpoints, 0)
    c0 = cluster.client(0)
    last = c1.snapshot()
    c0.wait_for(last)
    if where == "flush_before_commit":
        assert last == history[-1][0]  # the flush never committed
        assert not merged.exists()  # its file removed at restart (the transaction never committed)
        assert all(p["inlined"] for p in visible(c0, t))
    else:
        assert last > history[-1][0]  # the flush is in the log: applied by both from there
        history.append((last, sorted(have)))
        for c in (c0, c1):
            (part,) = visible(c, t)
            assert not part["inlined"] and Path(part["path"]).name == merged.name
    for c in (c0, c1):
        for csn, want in history:
            assert ns(c.read(t, snapshot=csn)) == want, (csn, c)
    assert parts_of(c0, t) == parts_of(c1, t)
    later_flush(c0, c1, t, history, have)
    assert c0.check(t)["ok"]


def later_flush(c0: Client, c1: Client, t: str, history: list[tuple[int, list[int]]], have: list[int]) -> None:
    """An inlined insert on r1, then a flush on r0: it succeeds and every snapshot (``history``:
    CSN, rows) keeps its rows on both replicas."""
    have = [*have, 100, 101]
    history.append((c1.insert(t, rows([100, 101])), sorted(have)))
    c0.wait_for(history[-1][0])  # r0 flushes what it has applied
    flushed = c0.compact(t)
    assert flushed > history[-1][0]
    history.append((flushed, sorted(have)))
    c1.wait_for(flushed)
    for c in (c0, c1):
        assert [p["inlined"] for p in visible(c, t)] == [False]
        for csn, want in history:
            assert ns(c.read(t, snapshot=csn)) == want, (csn, c)


def flushing_round(cluster: LocalCluster, failpoints: list[Path], where: str) -> None:
    """Restart r0 with merge rounds that flush a partition's 3 inlined parts (the test's table
    is the only one holding that many) and return once its flush holds at ``where``."""
    (failpoints[0] / f"{where}.reached").unlink(missing_ok=True)
    (failpoints[0] / where).touch()
    cluster.stop_replica(0)
    saved = cluster.settings
    cluster.settings = {**saved, "merge_interval": 0.1, "inline_flush_parts": 3, "inline_flush_seconds": 3600}
    try:
        start(cluster, failpoints, 0)
    finally:
        cluster.settings = saved  # restarted later without merge rounds
    wait_until((failpoints[0] / f"{where}.reached").exists, 30, f"r0's merge round to reach {where}", interval=0.01)


def test_a_follower_killed_behind_inlined_commits_and_a_flush_catches_up(
    tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer
) -> None:
    """r1 has a local checkpoint at ``checkpointed``, its WAL holds the entries after it up to
    ``applied`` (its tail thread, which writes local checkpoints, is held at ``tail_loop``), and it
    is held at ``follower_apply`` while r0 commits inlined inserts, a flush and another inlined
    insert; SIGKILLed and restarted, it loads the checkpoint, replays the WAL, pulls the rest.

    On a cluster of its own: a replica writes its local checkpoint once ``local_checkpoint_every``
    entries, or half the removed parts it holds when more, were applied since the last, and the
    other tests' flushes leave removed parts behind."""
    failpoints = failpoint_dirs(tmp_path_factory)
    with two_replicas(tmp_path_factory, zk_server, "inline_behind", failpoints) as cluster:
        follower_behind(cluster, failpoints)


def follower_behind(cluster: LocalCluster, failpoints: list[Path]) -> None:
    t = "inl_follower_behind"
    c0, c1 = cluster.client(0), cluster.client(1)
    c0.create_table(t, SCHEMA, auto_merge=False)
    have: list[int] = []
    csns: list[int] = []

    def insert(start: int) -> None:
        have.extend(range(start, start + 3))
        csns.append(c0.insert(t, rows(range(start, start + 3))))

    insert(0)
    c1.wait_for(csns[-1])
    checkpointed = csns[-1]
    eventually(lambda: local_checkpoint(cluster, 1) == checkpointed or _not_yet("r1's local checkpoint"), 30)
    tail = hold(failpoints[1], "tail_loop")  # r1's tail thread: no local checkpoint from here on
    insert(10)
    insert(20)
    c1.wait_for(csns[-1])
    applied = csns[-1]  # r1's WAL holds the entries after its checkpoint up to here
    (failpoints[1] / "follower_apply.reached").unlink(missing_ok=True)
    armed = failpoints[1] / "follower_apply"
    armed.touch()
    for k in range(3):  # r1 is held at the first of these, behind the log
        insert(100 + 10 * k)
    wait_until((failpoints[1] / "follower_apply.reached").exists, 30, "r1's follower to hold", interval=0.01)
    between = csns[-1]  # inlined commits, not flushed yet
    flush = c0.compact(t)
    csns.append(flush)
    insert(200)  # inlined again, after the flush
    assert c1.snapshot() == applied  # r1 stood still all along
    cluster.kill_replica(1)
    armed.unlink()
    tail.unlink()
    start(cluster, failpoints, 1)
    c1 = cluster.client(1)
    c1.wait_for(csns[-1])
    came = recovered(cluster, 1)
    assert came["local"] == checkpointed and came["replayed"] == applied - checkpointed, came
    assert came["pulled_from"] == applied and came["pulled_to"] >= between, came
    for csn in csns:
        assert ns(c1.read(t, snapshot=csn)) == ns(c0.read(t, snapshot=csn)), csn
    assert ns(c1.read(t, snapshot=between)) == sorted(have[:-3])
    assert ns(c1.read(t)) == sorted(have)
    assert parts_of(c1, t) == parts_of(c0, t)
    assert [p["inlined"] for p in visible(c1, t)] == [False, True]  # the flushed file and one inlined part


def local_checkpoint(cluster: LocalCluster, i: int) -> int | None:
    """The CSN of replica ``i``'s local checkpoint (replicas/checkpoint.py), if it has one."""
    payload = checkpoint.read_local(cluster.replica_dir(i) / checkpoint.LOCAL_NAME)
    return None if payload is None else int(payload["applied"])


def _not_yet(what: str) -> bool:
    raise NotYet(what)
