"""The log tail against a real ZooKeeper: the CSN log stays bounded however many commits happen,
a replica that was away longer than the retained log rebuilds from the checkpoint and serves the
same data, a running transaction's snapshot holds trimming back, and a snapshot older than what
is retained gets SnapshotUnavailable naming both numbers.

Replicas run in this process (``Replica`` + ``ReplicaServer``) with tiny thresholds, so thousands
of commits take seconds; commits that only need to exist (not to be read) insert metadata-only
parts straight through the replica API. Trimming rounds are also run explicitly where a test
needs one to have happened (``LogTail.round(blocking=True)``), after the replicas involved
republished what they need (``refresh_alive``): explicit ordering, no sleeps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.compute as pc
import pytest
from kazoo.client import KazooClient
from support.data import ID_V, id_rows  # tests/ is on sys.path
from support.waiting import wait_until

from coordinator.core.versions import split_csn
from coordinator.errors import CorruptMetadata, SnapshotUnavailable
from coordinator.model.records import Insert, LogEntry, WalBase, WalEntry
from mergetxn.client import Client
from parts.io.format import new_part_name
from parts.model.meta import PartMeta
from replicas import checkpoint
from replicas.replica import Replica, ReplicaConfig
from replicas.server import ReplicaServer
from replicas.state import ReplicaState
from replicas.wal import Wal

pytestmark = pytest.mark.zk

SCHEMA = ID_V
ROOT = "/mergetxn"
SMALL = {
    "checkpoint_every": 60,
    "retain_entries": 60,
    "local_checkpoint_every": 150,
    "tail_check_seconds": 0.05,
    "retention_seconds": 0.0,
}  # cleanup collects as soon as nothing in use sees a part


class Node:
    """One replica in this process, served over the real RPC so Clients can use it."""

    def __init__(self, zk: str, storage: str, data_dir: Path, host_id: str, **cfg: object) -> None:
        self.config = ReplicaConfig(
            zk=zk, storage_url=storage, host_id=host_id, data_dir=data_dir, session_timeout=6.0, **cfg
        )
        self.replica: Replica | None = None
        self.server: ReplicaServer | None = None

    def start(self) -> Node:
        self.replica = Replica(self.config)
        self.replica.start()
        self.server = ReplicaServer(self.replica, "127.0.0.1", 0)
        self.replica.set_address(self.server.address)
        threading.Thread(target=self.server.serve, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server = None
        if self.replica is not None:
            self.replica.stop()
            self.replica = None

    @property
    def r(self) -> Replica:
        assert self.replica is not None
        return self.replica

    def client(self) -> Client:
        assert self.server is not None
        return Client(self.server.address)


@pytest.fixture
def cluster(zk_address: str, tmp_path: Path) -> Iterator[Callable[..., list[Node]]]:
    """``make(n, **config)`` -> n started Nodes sharing this test's chroot and storage."""
    nodes: list[Node] = []

    def make(n: int, **cfg: object) -> list[Node]:
        out = []
        for i in range(n):
            node = Node(zk_address, str(tmp_path / "storage"), tmp_path / f"replica-{i}", f"r{i}", **cfg)
            nodes.append(node)
            out.append(node.start())
        return out

    try:
        yield make
    finally:
        for node in nodes:
            node.stop()


@pytest.fixture
def zk(zk_client: KazooClient) -> KazooClient:
    return zk_client


def log_znodes(zk: KazooClient) -> int:
    """Every znode under <root>/log: epoch nodes plus their entries."""
    total = 0
    for e in zk.get_children(f"{ROOT}/log"):
        stat = zk.exists(f"{ROOT}/log/{e}")
        total += 1 + (stat.numChildren if stat else 0)
    return total


def meta_commit(replica: Replica, table: str) -> int:
    """A commit inserting one part whose file is a placeholder byte (nobody reads it). Staged as
    the replica's own part (``written_here``): its metadata is not held against the file, which
    a client's part would be (thousands of these make the log long cheaply)."""
    txn = replica.transactions.begin()
    name = new_part_name(txn.id)
    meta = PartMeta(
        name=name,
        table=table,
        partition=(),
        path=f"{table}/_/{name}.parquet",
        rows=1,
        size=1,
        checksum="crc32:00000000",
        stats={},
        creation_tid=txn.id,
        created_at=time.time(),
    )
    replica.storage.put(meta.path, b"x", durable=False)
    replica.transactions.stage(txn.id, Insert(table, added=(meta,)), written_here=True)
    return replica.transactions.commit(txn.id)


def commit_many(nodes: list[Node], table: str, n: int, threads: int = 8) -> int:
    """``n`` metadata-only commits from ``threads`` committers spread over ``nodes``."""
    done, errors, lock = [0], [], threading.Lock()

    def work(k: int) -> None:
        replica = nodes[k % len(nodes)].r
        while True:
            with lock:
                if done[0] >= n or errors:
                    return
                done[0] += 1
            try:
                meta_commit(replica, table)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[:3]
    return done[0]


def settle(nodes: list[Node]) -> dict:
    """Every node caught up with the same log, republished its alive data; then one explicit
    trimming round (from the first node). Returns what the round did."""
    target = max(n.r.state.applied for n in nodes)
    for n in nodes:
        n.r.wait_snapshot(target)
        n.r.refresh_alive()
    return nodes[0].r.tail.round(blocking=True)


def commit_until(nodes: list[Node], table: str, done: Callable[[], bool], what: str, step: int = 100) -> None:
    """Metadata-only commits in steps of ``step``, each step followed by :func:`settle`, until
    ``done()``: group commit makes the number of log entries per commit vary with timing."""
    for _ in range(40):
        if done():
            return
        commit_many(nodes, table, step, threads=4)
        settle(nodes)
    assert done(), f"never reached: {what}"


def tail_of(node: Node) -> dict:
    tail, _ = node.r.log.read_tail()
    return tail or {"csn": 0, "path": "", "trimmed_epoch": -1, "retained": 0}


def part_view(replica: Replica, table: str) -> list[tuple]:
    return [
        (d["name"], d["creation_csn"], d["removal_csn"], d["removal_tid"], d["rows"], d["path"])
        for d in replica.part_records(table)
    ]


def assert_same_parts(a: Replica, b: Replica, table: str) -> None:
    """Both replicas hold the same part records, but for removed ones either has already pruned:
    each forgets them on its own schedule (its cleanup and retention), so they are compared above
    the higher of the two floors, taken after the views (a floor only rises)."""
    views = part_view(a, table), part_view(b, table)
    floor = max(a.state.pruned, b.state.pruned)
    kept = [[v for v in view if v[2] is None or v[2] > floor] for view in views]
    assert kept[0] == kept[1]
    assert len(kept[0]) > 0


# ---------------------------------------------------------------------------------------------
def test_checkpoint_roundtrip_and_corruption(tmp_path: Path) -> None:
    """Pure: export -> encode -> decode -> restore gives the same state; a torn or altered
    checkpoint is CorruptMetadata, never a half-loaded state."""
    from coordinator.model.catalog import TableDef

    st = ReplicaState()
    tdef = TableDef.new("t", SCHEMA, partition_by=("v",))
    st.apply(1, 0, 0, LogEntry(time=1.0, versions={"t": 0}, ddl=(tdef,)))
    names = []
    for i in range(1, 40):
        tid = f"T{i}-{i}-r0"
        name = f"{tid}_{i:016x}"
        names.append(name)
        meta = {
            "name": name,
            "table": "t",
            "partition": [f"p{i % 3}"],
            "path": f"t/x/{name}.parquet",
            "rows": i,
            "size": 10,
            "checksum": "crc32:0000abcd",
            "stats": {"id": [i, i + 1], "v": [None, None]},
            "creation_tid": tid,
            "created_at": 1.5 + i,
        }
        removed = [names[i - 5]] if i % 4 == 0 else []
        st.apply(
            i + 1,
            0,
            i,
            LogEntry.from_dict(
                {
                    "v": 1,
                    "time": 2.0 + i,
                    "versions": {"t": i},
                    "txns": [
                        {
                            "tid": tid,
                            "time_version": None if i % 7 == 0 else 2.0 + i,
                            "changes": [
                                {
                                    "table": "t",
                                    "pkey": f'["p{i % 3}"]',
                                    "kinds": ["INSERT"] + (["MUTATE"] if removed else []),
                                    "added": [meta],
                                    "removed": removed,
                                }
                            ],
                        }
                    ],
                },
                "test",
            ),
        )
    data = checkpoint.encode(st.export())
    back = ReplicaState()
    back.restore(checkpoint.decode(data, "mem"), "mem")
    assert back.export() == st.export()
    for snap in (5, 20, st.applied):
        assert back.visible("t", snap) == st.visible("t", snap)
    assert back.winners("t", '["p1"]', 10) == st.winners("t", '["p1"]', 10)
    assert back.csn_at_time(20.5) == st.csn_at_time(20.5)
    with pytest.raises(CorruptMetadata, match="does not parse"):
        checkpoint.decode(data[:-10], "torn")
    altered = bytearray(data)
    altered[-3] ^= 0xFF
    with pytest.raises(CorruptMetadata, match="does not parse"):
        checkpoint.decode(bytes(altered), "altered")
    with pytest.raises(CorruptMetadata, match="not a mergetxn checkpoint"):
        checkpoint.decode(b"garbage", "foreign")
    path = tmp_path / "state.ckpt"
    path.write_bytes(data[: len(data) // 2])
    assert checkpoint.read_local(path) is None  # ignored (logged): the replica rebuilds instead


def test_log_stays_bounded_over_thousands_of_commits(cluster, zk: KazooClient) -> None:
    """3 replicas, 3,000 commits from 8 concurrent committers: ZooKeeper never holds more than
    about checkpoint_every + retain_entries log nodes (plus commits that land during a round),
    epochs really were trimmed and checkpointed, and every replica ends with the same parts."""
    nodes = cluster(3, **SMALL)
    c = nodes[0].client()
    created = c.create_table("bounded", SCHEMA, auto_merge=False)
    # Every replica knows the table before the load starts: a transaction begun on a replica
    # still at CSN 0 rightly holds the trim back for as long as it runs (and one did, for
    # seconds, while its replica caught up under the load), which is not what this measures.
    for node in nodes:
        node.r.wait_snapshot(created)
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(log_znodes(zk))
            stop.wait(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        n = commit_many(nodes, "bounded", 3000)
    finally:
        stop.set()
        sampler.join()
    assert n == 3000
    settle(nodes)
    # An epoch holds checkpoint_every entries plus what lands before the seal; retain_entries
    # more stay; the slack covers commits racing a round (8 committers in one busy process).
    bound = SMALL["checkpoint_every"] + SMALL["retain_entries"] + 400
    assert max(samples) <= bound, f"log grew to {max(samples)} znodes (bound {bound}); samples {samples}"
    assert log_znodes(zk) <= bound
    tail, _ = nodes[0].r.log.read_tail()
    assert tail is not None and tail["trimmed_epoch"] >= 5
    assert zk.exists(f"{ROOT}/{tail['path'].rsplit('/', 1)[0]}") is None  # the file is in storage, not ZooKeeper
    assert nodes[0].r.storage.exists(tail["path"])
    assert len([p for p in nodes[0].r.storage.list("_checkpoints/")]) <= checkpoint.KEEP_CHECKPOINTS + 1
    views = [part_view(nd.r, "bounded") for nd in nodes]
    assert len(views[0]) == 3000 and views[0] == views[1] == views[2]
    # Local snapshots kept every WAL short: it starts at a base record (the snapshot's CSN) and
    # holds about local_checkpoint_every entries at most, not 3,000.
    for i, nd in enumerate(nodes):
        copy = nd.config.data_dir / "wal.copy"  # a copy: opening a WAL may truncate it
        copy.write_bytes((nd.config.data_dir / "wal.log").read_bytes())
        w = Wal(copy)
        records = w.records()
        w.close()
        entries = [r for r in records if isinstance(r, WalEntry)]
        assert isinstance(records[0], WalBase), f"replica {i}: WAL not compacted"
        assert len(entries) <= SMALL["local_checkpoint_every"] + 200, (i, len(entries))
        assert (nd.config.data_dir / checkpoint.LOCAL_NAME).exists()


def test_replica_back_after_the_tail_moved_rebuilds_from_checkpoint(cluster, zk: KazooClient) -> None:
    """r1 stops; r0 commits real data (inserts, a delete, an overwrite) and enough more that the
    log is trimmed past r1's position. r1 restarts, loads the checkpoint, follows the tail and
    serves exactly what r0 serves: rows, part records, and snapshots at and after the retained
    point; a replica whose data directory was lost does the same."""
    r0, r1 = cluster(2, **SMALL)
    c0 = r0.client()
    # inline_rows 0: the test's own delete and overwrite must not race a background flush
    c0.create_table("kept", SCHEMA, auto_merge=False, inline_rows=0)
    c0.create_table("kept_filler", SCHEMA, auto_merge=False, inline_rows=0)
    for k in range(10):
        with c0.transaction() as tx:
            tx.insert("kept", id_rows(5, start=10 * k))
    with c0.transaction() as tx:
        tx.delete("kept", pc.field("id") < 7)
    r1.r.wait_snapshot(r0.r.state.applied)
    r1_position = r1.r.state.position
    r1.stop()

    for k in range(10, 200):
        with c0.transaction() as tx:
            tx.insert("kept", id_rows(2, start=10 * k))
        if k == 120:
            with c0.transaction() as tx:
                tx.overwrite("kept", id_rows(3, start=5000))
    settle([r0])
    commit_until([r0], "kept_filler", lambda: tail_of(r0)["trimmed_epoch"] >= r1_position[0], "a trim past r1")
    tail = tail_of(r0)
    assert zk.exists(r0.r.log.epoch_path(r1_position[0])) is None  # r1's next entry is gone

    r1.start()
    assert r1.r.tail.checkpoints_loaded == 1
    latest = r0.r.state.applied
    r1.r.wait_snapshot(latest)
    c1 = r1.client()
    assert c1.read("kept").sort_by("id").equals(c0.read("kept").sort_by("id"))
    assert_same_parts(r1.r, r0.r, "kept")
    oldest = int(tail["retained"])
    for snap in sorted({oldest, (oldest + latest) // 2, latest}):
        assert c1.read("kept", snapshot=snap).sort_by("id").equals(c0.read("kept", snapshot=snap).sort_by("id"))
    # r1 commits on top of the rebuilt state, and r0 sees it.
    with c1.transaction() as tx:
        tx.insert("kept", id_rows(1, start=99_999))
    r0.r.wait_snapshot(tx.csn)
    assert 99_999 in c0.read("kept").column("id").to_pylist()
    # Its WAL now continues the checkpoint (no entries from before the jump).
    r1.stop()
    r1.start()
    assert r1.r.tail.checkpoints_loaded == 0  # restarted from its local snapshot + WAL
    assert_same_parts(r1.r, r0.r, "kept")

    # A replica with no data directory at all joins after the trim: the same.
    (r2,) = [Node(r0.config.zk, r0.config.storage_url, r0.config.data_dir.parent / "replica-new", "r9", **SMALL)]
    try:
        r2.start()
        r2.r.wait_snapshot(r0.r.state.applied)
        assert r2.r.tail.checkpoints_loaded == 1
        assert_same_parts(r2.r, r0.r, "kept")
        assert r2.client().read("kept").sort_by("id").equals(c0.read("kept").sort_by("id"))
    finally:
        r2.stop()


def test_running_transaction_holds_back_the_trim(cluster, zk: KazooClient) -> None:
    """A transaction open on r1 at snapshot S: however many commits follow and however many
    rounds run, nothing after S is trimmed (retained stays <= S, the first entry after S is
    still in ZooKeeper although the log grew far past its usual bound), its reads and its
    commit work; once it ends, rounds trim past S and the log shrinks back."""
    r0, r1 = cluster(2, **SMALL)
    bound = SMALL["checkpoint_every"] + SMALL["retain_entries"] + 10
    c1 = r1.client()
    c1.create_table("held", SCHEMA, auto_merge=False)
    c1.create_table("held_filler", SCHEMA, auto_merge=False)
    commit_until([r0], "held_filler", lambda: tail_of(r0)["trimmed_epoch"] >= 0, "a first trim")
    with c1.transaction() as tx:
        tx.insert("held", id_rows(4))
    tx_old = c1.begin()
    snap = tx_old.snapshot
    r1.r.refresh_alive()
    first_after = meta_commit(r0.r, "held_filler")
    commit_until([r0, r1], "held_filler", lambda: log_znodes(zk) > 3 * bound, "a log held back by the snapshot")
    tail = tail_of(r0)
    assert int(tail["retained"]) <= snap, f"trimmed past the running snapshot {snap}: {tail}"
    assert zk.exists(r0.r.log.entry_path(*split_csn(first_after))) is not None, "the entry after S was trimmed"
    assert sorted(tx_old.read("held").column("id").to_pylist()) == [0, 1, 2, 3]
    tx_old.insert("held", id_rows(1, start=77))
    csn = tx_old.commit()
    assert csn > snap
    r1.r.refresh_alive()
    commit_until(
        [r0, r1],
        "held_filler",
        lambda: int(tail_of(r0)["retained"]) > snap and log_znodes(zk) < 3 * bound,
        "a trim past the ended transaction's snapshot",
    )
    assert zk.exists(r0.r.log.entry_path(*split_csn(first_after))) is None


def replaced_then_trimmed(r0: Node, replace: Callable) -> tuple:
    """Table ``old``: 3 rows at CSN ``first`` (time ``early``), then ``replace(tx)`` removes them;
    filler commits until the log is trimmed past ``first``; a cleanup pass. ``(client, first, early)``."""
    c = r0.client()
    c.create_table("old", SCHEMA, auto_merge=False)
    c.create_table("old_filler", SCHEMA, auto_merge=False)
    with c.transaction() as tx:
        tx.insert("old", id_rows(3))
    first = tx.csn
    early = datetime.now(UTC)
    with c.transaction() as tx:
        replace(tx)
    commit_until([r0], "old_filler", lambda: int(tail_of(r0)["retained"]) > first, "a trim past the first commit")
    c.gc()
    return c, first, early


def test_trimmed_log_keeps_snapshots_in_the_retention_window(cluster) -> None:
    """Trimming the log does not cut time travel (docs/rules.md#history-retention): snapshots are
    served from the state, which keeps every record in the window; a read at a snapshot whose
    entry is no longer in ZooKeeper, and time travel to before it, return what they returned."""
    (r0,) = cluster(1, **{**SMALL, "retention_seconds": 3600.0})
    c, first, early = replaced_then_trimmed(r0, lambda tx: tx.truncate("old"))
    assert c.read("old", snapshot=first).num_rows == 3
    assert c.read("old", as_of=early).num_rows == 3
    assert c.read("old").num_rows == 0


def test_beyond_the_window_a_trimmed_snapshot_is_refused(cluster) -> None:
    """With retention_seconds=0, once cleanup collected what a snapshot saw and the state forgot
    it, a read there and time travel to before it get SnapshotUnavailable naming the snapshot, the
    oldest one served and the table's retention; the latest snapshot still reads."""
    (r0,) = cluster(1, **SMALL)
    c, first, early = replaced_then_trimmed(r0, lambda tx: tx.overwrite("old", id_rows(2)))
    r0.r.tail.prune()
    oldest = r0.r.state.lost_below("old")  # the overwrite's removal: what the state forgot of 'old'
    assert oldest > first
    with pytest.raises(SnapshotUnavailable) as exc:
        c.read("old", snapshot=first)
    assert f"snapshot {first} is older than what is retained (oldest: {oldest})" in str(exc.value)
    assert "retention_seconds" in str(exc.value)
    with pytest.raises(SnapshotUnavailable, match=f"older than what is retained \\(oldest: {oldest}\\)"):
        c.read("old", as_of=early)
    assert c.read("old").num_rows == 2


def test_restart_with_a_damaged_local_snapshot_rebuilds(cluster) -> None:
    """The WAL was compacted behind a local snapshot; the snapshot file is then damaged. The
    replica must not replay the WAL tail onto an empty state (that would skip every entry the
    snapshot held): it ignores both and rebuilds from the cluster checkpoint and the log."""
    (r0,) = cluster(1, **SMALL)
    c = r0.client()
    c.create_table("damaged", SCHEMA, auto_merge=False)
    with c.transaction() as tx:
        tx.insert("damaged", id_rows(3))
    commit_until([r0], "damaged", lambda: tail_of(r0)["trimmed_epoch"] >= 1, "a trim")
    r0.r.tail.save_local()
    meta_commit(r0.r, "damaged")  # an entry in the WAL after the snapshot
    before = part_view(r0.r, "damaged")
    r0.stop()
    local = r0.config.data_dir / checkpoint.LOCAL_NAME
    data = local.read_bytes()
    local.write_bytes(data[: len(data) // 3])
    r0.start()
    assert r0.r.tail.checkpoints_loaded == 1
    assert part_view(r0.r, "damaged") == before


def test_state_forgets_what_no_served_snapshot_sees(cluster) -> None:
    """Overwrites remove parts; once cleanup collected them and the log is trimmed past their
    removal, every replica forgets their records (the state does not grow with history), while
    reads at every retained snapshot, changes from the retained point and a restart from the
    checkpoint still give the same rows; older reads and changes are refused."""
    nodes = cluster(2, **SMALL, gc_interval=0, merge_interval=0)
    c = nodes[0].client()
    c.create_table("churn", SCHEMA, auto_merge=False)
    c.create_table("churn_filler", SCHEMA, auto_merge=False)
    csns = []
    for i in range(30):  # every overwrite removes the part the one before wrote
        with c.transaction() as tx:
            tx.overwrite("churn", id_rows(3, start=10 * i))
        csns.append(tx.csn)
    first = csns[0]
    commit_until(
        nodes, "churn_filler", lambda: int(tail_of(nodes[0])["retained"]) > csns[-2], "a trim past the overwrites"
    )
    c.gc(grace_seconds=0)  # collects the removed parts (nothing reads them)
    for n in nodes:  # each replica learns the collected CSN and the retained log by watches
        n.r.wait_snapshot(max(m.r.state.applied for m in nodes))
        wait_until(
            lambda n=n: n.r.tail.prune() >= 0 and n.r.state.pruned >= csns[-2],
            30,
            f"replica {n.r.host_id} to forget what cleanup collected",
        )
    for n in nodes:
        churn = [r for r in n.r.state.parts.values() if r.meta.table == "churn"]
        assert len(churn) == 1, (n.r.host_id, len(churn))  # the 29 removed ones are forgotten
    latest = sorted(nodes[1].client().read("churn").column("id").to_pylist())
    assert latest == list(range(290, 293))
    oldest = max(n.r.tail.retained for n in nodes)
    assert sorted(c.read("churn", snapshot=max(oldest, csns[-1])).column("id").to_pylist()) == latest
    with pytest.raises(SnapshotUnavailable, match="older than what is retained"):
        c.read("churn", snapshot=first)
    with pytest.raises(SnapshotUnavailable, match="older than what is retained"):
        c.changes("churn", first)
    assert c.changes("churn", oldest).num_rows == 0  # nothing touched it since
    nodes[1].stop()
    back = Node(
        nodes[1].config.zk,
        nodes[1].config.storage_url,
        nodes[1].config.data_dir,
        "r1",
        **SMALL,
        gc_interval=0,
        merge_interval=0,
    ).start()
    try:
        assert sorted(back.client().read("churn").column("id").to_pylist()) == latest
        back.r.tail.prune()  # its WAL replayed what it had forgotten; the log tail forgets it again
        assert len([r for r in back.r.state.parts.values() if r.meta.table == "churn"]) == 1
    finally:
        back.stop()


def test_catch_up_sees_other_replicas_commits_beyond_a_local_commit_in_flight(cluster) -> None:
    """Cleanup's orphan fence needs every commit made before the fence moved to be applied when
    it decides. A pull stops where this replica's own commit is in flight (it hands its entry over
    itself), so entries of other replicas beyond it used to be left out: catch_up now waits until
    the newest entry ZooKeeper holds is applied."""
    a, b = cluster(2, **SMALL, gc_interval=0, merge_interval=0)
    b.client().create_table("inflight", SCHEMA, auto_merge=False)
    a.r.wait_snapshot(b.r.state.applied)
    a.r.follower._idle.clear()  # as during a local commit multi on replica a
    seen: list[int] = []
    try:
        csn = meta_commit(b.r, "inflight")  # another replica's commit, in ZooKeeper now
        caller = threading.Thread(target=lambda: (a.r.catch_up(), seen.append(a.r.state.applied)))
        caller.start()
        caller.join(0.5)  # a catch_up that does not wait has long returned by now
    finally:
        a.r.follower._idle.set()  # the local commit handed its entry over
    caller.join(30)
    assert seen and seen[0] >= csn, f"catch_up returned at CSN {seen} before applying {csn}"
