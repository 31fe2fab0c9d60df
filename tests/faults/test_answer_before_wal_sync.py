"""A commit is answered once its entry is durable in ZooKeeper and applied on the replica, before
the replica fsyncs the WAL record of that entry (replicas/committer.py ``_sync_wal``;
docs/guarantees.md, "Read your writes"). The WAL only caches the log: a replica that loses what it
had not fsynced (a power loss; here SIGKILL, then the WAL cut back to where it was before the
commit) restarts with the commit applied from ZooKeeper, its part file kept and readable, and the
commit's outcome known."""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from support.cluster import make_cluster  # tests/ is on sys.path
from support.data import ID_V
from support.waiting import NotYet, eventually

from mergetxn.local.cluster import LocalCluster
from mergetxn.local.zkserver import ZooKeeperServer

pytestmark = pytest.mark.zk

POINT = "before_own_wal_sync"


@pytest.fixture
def failpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("failpoints")


@pytest.fixture  # one per case: a replica the test restarts runs without failpoints
def cluster(
    tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer, failpoints: Path
) -> Iterator[LocalCluster]:
    with make_cluster(
        tmp_path_factory,
        zk_server,
        "wal_sync",
        replicas=1,
        settings={"gc_interval": 0, "merge_interval": 0},
        env={"MERGETXN_FAILPOINTS": str(failpoints)},
    ) as c:
        yield c


def _reached(path: Path) -> bool:
    if not path.exists():
        raise NotYet(f"{path.name} not there yet")
    return True


def _records(wal: Path, start: int) -> list[tuple[int, bytes]]:
    """The WAL's records from byte ``start``: (where each ends, its payload)."""
    data = wal.read_bytes()
    out = []
    while start < len(data):
        length, _ = struct.unpack_from(">II", data, start)
        start += 8 + length
        out.append((start, data[start - length : start]))
    return out


@pytest.mark.parametrize("kept", ["nothing", "the staged part's record"])
def test_an_answered_commit_whose_wal_record_was_lost_is_recovered_from_the_log(
    cluster: LocalCluster, failpoints: Path, kept: str
) -> None:
    """``kept``: what of the commit's WAL records the crash left: none of them, or the record
    of the staged part (whose transaction the restart would roll back, deleting the part file,
    if it did not learn from the log that it committed) without the entry's."""
    c = cluster.client(0)
    table = "t_nothing" if kept == "nothing" else "t_staged"
    c.create_table(table, ID_V, inline_rows=0)  # a part file and its staged record: an inlined insert has no file
    first = c.insert(table, pa.table({"id": [1], "v": ["a"]}, schema=ID_V))
    wal = cluster.replica_dir(0) / "wal.log"
    # The committer holds after answering, before the WAL fsync, from the next commit on: the
    # insert above was answered before its own fsync, which may not have passed the point yet.
    # Armed by a rename: a file written in place exists empty for a moment, and the first
    # insert's committer passing the point then held there (no number: hold at any CSN), so the
    # second insert was never answered (a CI run at load, 2026-11-28).
    (failpoints / f".{POINT}.tmp").write_text(str(first + 1))
    os.replace(failpoints / f".{POINT}.tmp", failpoints / POINT)
    before = wal.stat().st_size
    answers: list[object] = []

    def insert() -> None:
        try:
            answers.append(c.insert(table, pa.table({"id": [2], "v": ["b"]}, schema=ID_V)))
        except Exception as exc:  # what the test asserts
            answers.append(exc)

    t = threading.Thread(target=insert, daemon=True)
    t.start()
    try:
        eventually(lambda: _reached(failpoints / f"{POINT}.reached"), 30)
        t.join(30)
        assert answers and isinstance(answers[0], int), answers  # answered while the fsync is held
        csn = answers[0]
        part = max(c.parts(table).to_pylist(), key=lambda r: r["creation_csn"])
        assert part["creation_csn"] == csn, part
        cluster.kill_replica(0)
    finally:  # never leave the (module's) replica held
        (failpoints / POINT).unlink(missing_ok=True)
        (failpoints / f"{POINT}.reached").unlink(missing_ok=True)
    # What a power loss may leave of what was written since the last fsync: the staged part's
    # record and the entry's, in that order.
    written = _records(wal, before)
    kinds = [b"staged" if body.startswith(b'{"staged"') else body[:6] for _, body in written]
    assert kinds == [b"staged", b'{"csn"'], kinds
    assert part["path"].encode() in written[0][1]
    with open(wal, "r+b") as fh:
        fh.truncate(before if kept == "nothing" else written[0][0])
        os.fsync(fh.fileno())
    cluster.start_replica(0)
    c2 = cluster.client(0)
    assert c2.snapshot() >= csn
    assert sorted(c2.read(table).column("id").to_pylist()) == [1, 2]  # the part file was kept
    assert c2.commit_status(part["creation_tid"]).csn == csn
    assert c2.check([table])["ok"] is True
