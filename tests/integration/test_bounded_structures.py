"""A month of use, in counts (docs/architecture/bounds.md): with short
windows and merges and cleanup running, thousands of commits from concurrent writers leave every
structure a replica keeps (remembered outcomes, part records, conflict history, the parts added
per target, the local checkpoint, the WAL, the log in ZooKeeper, visible parts) the size of the
windows and the load, far below the number of commits made, and no larger at the end than
after the first thousands. Counts, not times: the windows are 1 and 2 s, the commits take a
minute.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from support.cluster import make_cluster  # tests/ is on sys.path
from support.data import ID_V, id_rows

from mergetxn.local.cluster import LocalCluster
from mergetxn.local.zkserver import four_letter_word

WRITERS = 3
ROUNDS = 6
PER_ROUND = 1000  # commits per round, from all writers
BOUND = 2500  # far below the 6,000 commits: what grows with them fails
RETAIN_ENTRIES, CHECKPOINT_EVERY = 1000, 500
LOG_BOUND = RETAIN_ENTRIES + 4 * CHECKPOINT_EVERY  # an untrimmed log passes it at 3,000 commits
SIZES = ("outcomes", "part_records", "removed_part_records", "conflict_history", "created")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with make_cluster(
        tmp_path_factory,
        None,  # a ZooKeeper of its own: its node count is this cluster's
        "bounded",
        replicas=2,
        settings={
            "retention_seconds": 1,
            "outcome_seconds": 2,
            "merge_interval": 0.2,
            "gc_interval": 0.5,
            "checkpoint_every": CHECKPOINT_EVERY,
            "retain_entries": RETAIN_ENTRIES,
            "local_checkpoint_every": 500,
        },
    ) as c:
        yield c


def insert_round(cluster: LocalCluster, first: int) -> None:
    """``PER_ROUND`` 10-row inserts from ``WRITERS`` clients at once, over both replicas."""
    barrier = threading.Barrier(WRITERS)
    errors: list[BaseException] = []

    def write(k: int) -> None:
        client = cluster.client(k % 2)
        try:
            barrier.wait()
            for i in range(k, PER_ROUND, WRITERS):
                client.insert("t", id_rows(10, (first + i) * 10))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=write, args=(k,)) for k in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def zk_nodes(cluster: LocalCluster) -> tuple[int, int]:
    """ZooKeeper's node count (the server's, this cluster's alone) and the log entries among them."""
    hosts = cluster.zk_address.split("/")[0]
    host, port = hosts.rsplit(":", 1)
    zk = KazooClient(hosts=hosts)
    zk.start(timeout=15)
    try:
        log = f"{cluster.root}/log"
        entries = 0
        for epoch in zk.get_children(log):
            stat = zk.exists(f"{log}/{epoch}")
            entries += 0 if stat is None else stat.numChildren
        mntr = four_letter_word(host, int(port), "mntr")
    finally:
        zk.stop()
        zk.close()
    nodes = next(int(line.split()[1]) for line in mntr.splitlines() if line.startswith("zk_znode_count"))
    return nodes, entries


def dangling_entry_watches(cluster: LocalCluster) -> list[str]:
    """Watched log entries (``wchp``) that do not exist in an epoch that is not the newest: a
    follower waiting for the next entry watches its position; when a checkpoint seals the
    epoch early, that entry is never created, and the watch would stay for the session (kazoo
    sends it again after every reconnect) unless the follower removes it: one per checkpoint,
    a month of them. (A watch on an entry that exists fires when the trim deletes it.)"""
    hosts = cluster.zk_address.split("/")[0]
    host, port = hosts.rsplit(":", 1)
    watched = re.findall(r"^(\S*/log/e-(\d+)/c-\d+)$", four_letter_word(host, int(port), "wchp"), re.M)
    newest = max((int(e) for _, e in watched), default=0)  # a waiting follower watches the open epoch
    zk = KazooClient(hosts=hosts)
    zk.start(timeout=15)
    try:
        return [path for path, e in watched if int(e) < newest and zk.exists(path) is None]
    finally:
        zk.stop()
        zk.close()


def sample(cluster: LocalCluster) -> dict:
    client = cluster.client(0)
    try:
        info = client.call("info")
        parts = client.parts("t").to_pylist()
    finally:
        client.close()
    nodes, entries = zk_nodes(cluster)
    return {
        **{k: info["structures"][k] for k in SIZES},
        "local_checkpoint_bytes": info["log"]["local_checkpoint_bytes"],
        "wal_bytes": info["log"]["wal_bytes"],
        "log_entries": entries,
        "zk_other_nodes": nodes - entries,
        "visible": sum(p["visible"] for p in parts),
    }


@pytest.mark.slow
def test_structures_stay_the_size_of_the_windows_not_of_history(cluster: LocalCluster) -> None:
    c0 = cluster.client(0)
    c0.create_table("t", ID_V)
    c0.close()
    samples = []
    for r in range(ROUNDS):
        insert_round(cluster, r * PER_ROUND)
        samples.append(sample(cluster))
    for s in samples:
        assert all(s[k] <= BOUND for k in SIZES), samples
        # The log in ZooKeeper saws between trims (replicas/checkpoint.py): the newest
        # retain_entries, the sealed epoch that straddles that line, and the open epoch; an epoch
        # holds checkpoint_every entries plus what arrives before a tail round seals it.
        assert s["log_entries"] <= LOG_BOUND, samples
        assert s["visible"] <= 150, samples  # parts_to_delay_insert: merges keep up with three writers
    last = samples[-1]
    # No growth: the last sample is no larger than the first two (1,000 and 2,000 commits) plus
    # noise (part records of one run: 452, 363, 606, 315, 470, 791 with a 1 s window).
    for k in (*SIZES, "local_checkpoint_bytes", "zk_other_nodes"):
        early = max(samples[0][k], samples[1][k])
        assert last[k] <= 1.5 * early + 200, (k, [s[k] for s in samples])
    assert last["wal_bytes"] <= 4 * max(s["wal_bytes"] for s in samples[:2]), samples
    # No watch left on an entry that will never be created (once the followers have looked
    # past a seal that came after this read: within a few of their one-second rounds).
    deadline = time.monotonic() + 10
    while (left := dangling_entry_watches(cluster)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"watches on entries of sealed epochs: {left}"
