"""Errors of the right kind: each failure reaches the caller as the mergetxn
class that says what happened, naming what was wrong, and changes nothing.

Storage faults are real: a tiny tmpfs that fills up, remounted read-only (needs root, as the
chaos harness's WAL fault does; skipped otherwise)."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support.cluster import make_cluster  # tests/ is on sys.path
from support.data import ID_V, id_rows, ids

import coordinator
from coordinator.errors import (
    DuplicateCommit,
    InvalidInput,
    ReplicaUnavailable,
    SnapshotUnavailable,
    StorageError,
    TransactionAborted,
)
from mergetxn.client import Client
from mergetxn.local.cluster import LocalCluster
from mergetxn.local.zkserver import ZooKeeperServer

pytestmark = pytest.mark.zk


@pytest.fixture(scope="module")
def cluster(zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    with make_cluster(tmp_path_factory, zk_server, "errors", replicas=1) as c:
        yield c


@pytest.fixture(scope="module")
def cl(cluster: coordinator.LocalCluster) -> Client:
    return cluster.client(0)


# ---------------------------------------------------------------------------------------------
# Ending a transaction twice


def test_commit_again_returns_the_same_csn(cl: Client) -> None:
    cl.create_table("twice", ID_V, auto_merge=False)
    tx = cl.begin()
    tx.insert("twice", id_rows(3))
    csn = tx.commit()
    assert tx.commit() == csn  # a retrying caller learns it committed, and writes nothing twice
    assert ids(cl.read("twice")) == [0, 1, 2]
    assert cl.snapshot() == csn


def test_rollback_after_commit_is_refused(cl: Client) -> None:
    cl.create_table("rb_after", ID_V, auto_merge=False)
    tx = cl.begin()
    tx.insert("rb_after", id_rows(2))
    csn = tx.commit()
    with pytest.raises(InvalidInput, match=f"committed at CSN {csn}"):
        tx.rollback()
    assert ids(cl.read("rb_after")) == [0, 1]
    # a rolled-back transaction may be rolled back again: nothing to refuse
    tx2 = cl.begin()
    tx2.rollback()
    tx2.rollback()


# ---------------------------------------------------------------------------------------------
# Transaction ids that do not parse


@pytest.mark.parametrize("bad", ["garbage", "", "T1-2"])
def test_bad_transaction_ids_are_invalid_input(cl: Client, bad: str) -> None:
    with pytest.raises(InvalidInput, match=repr(bad)):
        cl.join(bad)
    with pytest.raises(InvalidInput, match=repr(bad)):
        cl.kill(bad)
    with pytest.raises(InvalidInput, match=repr(bad)):
        cl.commit_status(bad)


# ---------------------------------------------------------------------------------------------
# Times in the future


def test_as_of_in_the_future_is_refused(cl: Client) -> None:
    cl.create_table("future", ID_V, auto_merge=False)
    with cl.transaction() as tx:
        tx.insert("future", id_rows(2))
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    with pytest.raises(SnapshotUnavailable, match="in the future"):
        cl.read("future", as_of=later)
    with pytest.raises(SnapshotUnavailable, match="end .* in the future"):
        cl.changes("future", dt.datetime.now(dt.UTC) - dt.timedelta(hours=1), later, by="time")
    with pytest.raises(SnapshotUnavailable, match="start .* in the future"):
        cl.changes("future", later, by="time")
    # the present still reads
    assert ids(cl.read("future", as_of=dt.datetime.now(dt.UTC))) == [0, 1]


# ---------------------------------------------------------------------------------------------
# Partition values of the wrong type


def test_partition_value_of_the_wrong_type(cl: Client) -> None:
    schema = pa.schema([("region", pa.string()), ("id", pa.int64())])
    cl.create_table("by_region", schema, partition_by=["region"], auto_merge=False)
    with cl.transaction() as tx:
        tx.insert("by_region", pa.table({"region": ["5", "eu"], "id": [1, 2]}, schema=schema))
    before = cl.parts("by_region").to_pylist()
    tx = cl.begin()
    for statement in (
        lambda: tx.truncate("by_region", partitions=[5]),
        lambda: tx.overwrite("by_region", schema.empty_table(), partitions=[5]),
        lambda: tx.compact("by_region", partitions=[5]),
    ):
        with pytest.raises(InvalidInput, match=r"5 .*'region'.*string"):
            statement()
    tx.rollback()
    with pytest.raises(InvalidInput, match=r"'region'.*string"):
        cl.compact("by_region", partitions=[5])
    assert cl.parts("by_region").to_pylist() == before
    # the right type still works
    with cl.transaction() as tx:
        assert tx.truncate("by_region", partitions=["5"]) == 1
    assert cl.read("by_region").column("region").to_pylist() == ["eu"]


# ---------------------------------------------------------------------------------------------
# Storage faults: a real tmpfs that fills up or goes read-only


def _mount(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("cannot mount a tmpfs here (not root)")


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` to the last byte."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


@pytest.fixture(scope="module")
def small_disk(
    tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer
) -> Iterator[tuple[LocalCluster, Path]]:
    """A cluster whose storage is an 8 MB tmpfs."""
    mount = tmp_path_factory.mktemp("smalldisk") / "storage"
    _mount(mount, "8m")
    try:
        with make_cluster(tmp_path_factory, zk_server, "smalldisk", replicas=1, storage_url=str(mount)) as c:
            yield c, mount
    finally:
        _umount(mount)


def test_storage_full_is_a_storage_error(small_disk: tuple[LocalCluster, Path]) -> None:
    cluster, mount = small_disk
    cl = cluster.client(0)
    cl.create_table("full", ID_V, auto_merge=False)
    with cl.transaction() as tx:
        tx.insert("full", id_rows(3))
    parts_before = cl.parts("full").to_pylist()
    filler = _fill(mount)
    try:
        tx = cl.begin()
        with pytest.raises(StorageError) as info:
            tx.insert("full", id_rows(1000, start=10))
        err = info.value
        assert isinstance(err, OSError)  # code that handled the raw error still does
        assert err.details["errno"] == "ENOSPC" and "full/" in err.details["path"]
        assert "No space left on device" in err.message and "free space" in err.message
        tx.rollback()
    finally:
        filler.unlink()
    # compaction on the replica: the same class across the RPC, with the path
    with cl.transaction() as tx:
        tx.insert("full", id_rows(1, start=7))
    filler = _fill(mount)
    try:
        with pytest.raises(StorageError) as info:
            cl.compact("full", kind="major")
        assert info.value.details["errno"] == "ENOSPC" and info.value.details["path"].startswith("full/")
    finally:
        filler.unlink()
    names = {p["name"] for p in cl.parts("full").to_pylist() if p["visible"]}
    assert {p["name"] for p in parts_before} <= names
    assert 0 in ids(cl.read("full"))


def test_read_only_storage_is_a_storage_error(small_disk: tuple[LocalCluster, Path]) -> None:
    cluster, mount = small_disk
    cl = cluster.client(0)
    cl.create_table("ro", ID_V, auto_merge=False, inline_rows=0)  # a file to write: an inlined insert has none
    assert subprocess.run(["mount", "-o", "remount,ro", str(mount)]).returncode == 0
    try:
        tx = cl.begin()
        with pytest.raises(StorageError) as info:
            tx.insert("ro", id_rows(3))
        assert info.value.details["errno"] == "EROFS"
        assert "read-only" in info.value.message.lower()
        tx.rollback()
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(mount)], check=True)
    assert cl.read("ro").num_rows == 0


@contextmanager
def _wal_on_tmpfs(tmp_path: Path, zk_server: ZooKeeperServer, name: str, replicas: int = 1) -> Iterator[LocalCluster]:
    """A started cluster whose replica 0 keeps its directory (its WAL) on a 4 MiB tmpfs."""
    from support.zk import new_chroot

    cluster = LocalCluster(
        tmp_path / "c", replicas=replicas, zk_address=new_chroot(zk_server, name), storage_url=str(tmp_path / "storage")
    )
    replica_dir = tmp_path / "c" / "replica-0"
    _mount(replica_dir, "4m")
    try:
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.stop()
    finally:
        _umount(replica_dir)


def test_full_wal_disk_rolls_back_with_a_clear_error(tmp_path: Path, zk_server: ZooKeeperServer) -> None:
    """The replica's WAL disk fills up while a transaction stages parts: the transaction is
    rolled back, its files deleted, and the caller is told so (it was a bare MergetxnError
    "stage failed on the replica: OSError(28, ...)")."""
    with _wal_on_tmpfs(tmp_path, zk_server, "walfull") as cluster:
        replica_dir = tmp_path / "c" / "replica-0"
        cl = cluster.client(0)
        cl.create_table("walfull", ID_V, auto_merge=False, inline_rows=0)  # staged files, recorded in the WAL
        tx = cl.begin()
        filler = _fill(replica_dir)
        try:
            with pytest.raises(StorageError, match="WAL") as info:
                for n in range(200):  # the WAL's last page takes a few records still
                    tx.insert("walfull", id_rows(5, start=10 * n))
            assert info.value.details["rolled_back"] is True
            assert "rolled back" in info.value.message and "No space left on device" in info.value.message
            with pytest.raises(TransactionAborted):
                tx.commit()
        finally:
            filler.unlink()
        assert cl.commit_status(tx.id).status == "aborted"
        assert [p for p in (tmp_path / "storage").rglob("*.parquet") if "walfull" in str(p)] == []
        with cl.transaction() as tx2:  # with room again, the next one commits
            tx2.insert("walfull", id_rows(2))
        assert ids(cl.read("walfull")) == [0, 1]


def test_a_commit_whose_wal_record_has_no_room_is_refused_before_its_multi(
    tmp_path: Path, zk_server: ZooKeeperServer
) -> None:
    """A transaction whose staged record still fits the WAL's last page but whose commit entry
    (an inlined insert: its rows in the entry) has no room there is refused with StorageError
    before its multi, nothing committed, and answered at once; it used to enter the log, fail
    to be applied on its replica (ENOSPC) and leave its commit unanswered until space was freed
    (the namespace cluster's full-WAL test timed out after 300 s so). With room again, the next
    one commits."""
    with _wal_on_tmpfs(tmp_path, zk_server, "walroom") as cluster:
        replica_dir = tmp_path / "c" / "replica-0"
        cl = cluster.client(0)
        cl.create_table("walroom", ID_V, auto_merge=False)  # small inserts are inlined: entries hold their rows
        before = cl.snapshot()
        tx = cl.begin()
        tx.insert("walroom", id_rows(1))  # staged: its WAL record written while there is room
        filler = _fill(replica_dir)
        try:
            with pytest.raises(StorageError, match="did not commit") as info:
                tx.commit()
            assert "No space left on device" in info.value.message and info.value.details["errno"] == "ENOSPC"
            assert cl.commit_status(tx.id).status == "aborted"
            assert cl.snapshot() == before and cl.read("walroom").num_rows == 0  # nothing in the log
        finally:
            filler.unlink()
        with cl.transaction() as tx2:
            tx2.insert("walroom", id_rows(2))
        assert ids(cl.read("walroom")) == [0, 1]


def test_commit_status_on_a_replica_whose_wal_is_full_is_replica_unavailable(
    tmp_path: Path, zk_server: ZooKeeperServer
) -> None:
    """A replica that must apply the log to decide an outcome (the owner is gone) but cannot write
    its WAL says it is unavailable, so a client asks another replica (it was a bare MergetxnError
    "commit_status failed on the replica: OSError(28, ...)", seen in chaos campaigns); with room
    again it decides."""
    with _wal_on_tmpfs(tmp_path, zk_server, "walfull2", replicas=2) as cluster:
        replica_dir = tmp_path / "c" / "replica-0"
        cl0, cl1 = cluster.client(0), cluster.client(1)
        cl1.create_table("walfull2", ID_V, auto_merge=False)
        cl0.read("walfull2", snapshot=cl1.snapshot())  # r0 has applied the table (waits for it)
        filler = _fill(replica_dir)
        try:
            tx = cl1.begin()
            for n in range(40):  # an entry of 40 parts: larger than what the WAL's last page holds
                tx.insert("walfull2", id_rows(1, start=n))
            csn = tx.commit()
            cluster.stop_replica(1)  # the owner is gone: r0 must apply the log to decide
            with pytest.raises(ReplicaUnavailable, match="cannot apply the log") as info:
                cl0.commit_status(tx.id)
            assert info.value.details["errno"] == "ENOSPC"
            assert "No space left on device" in info.value.message and "another replica" in info.value.message
        finally:
            filler.unlink()
        status = cl0.commit_status(tx.id)
        assert (status.status, status.csn) == ("committed", csn)
        assert ids(cl0.read("walfull2")) == list(range(40))


def test_transaction_aborted_names_its_transactions() -> None:
    assert TransactionAborted("x", ids=["a", "b"]).ids == ["a", "b"]  # a flush: every failed commit
    assert TransactionAborted("x", id="T1-2-r1").ids == ["T1-2-r1"]
    assert TransactionAborted("x").ids == [] and DuplicateCommit("x", id="t").ids == ["t"]


def test_commit_status_while_the_replica_has_lost_zookeeper_is_replica_unavailable(zk_server: ZooKeeperServer) -> None:
    """Deciding another replica's transaction asks ZooKeeper; with the connection gone that was a
    bare MergetxnError "commit_status failed on the replica: ConnectionLoss()" (seen in the secure
    chaos campaign while a ZooKeeper node was killed), which a client does not take to another
    replica. It is ReplicaUnavailable naming the transaction: the question can be asked again."""
    from types import SimpleNamespace

    from kazoo.client import KazooClient

    from coordinator.zk.log import CsnLog
    from replicas.context import ReplicaContext
    from replicas.outcomes import Outcomes
    from replicas.state import ReplicaState

    zk = KazooClient(hosts=zk_server.address)
    zk.start(timeout=10)
    zk.stop()  # the connection gone, as a replica's is while ZooKeeper is away
    zk.close()
    none: Any = None
    context = ReplicaContext(
        config=SimpleNamespace(host_id="r0", credentials=None),  # type: ignore[arg-type]
        state=ReplicaState(),
        storage=none,
        zk=zk,
        log=CsnLog(zk, "/lost-zk"),
        watermark=none,
        fence=none,
        catch_up=lambda: None,
        wait_snapshot=none,
        table=none,
        incarnation=lambda: 1,
        poke_follower=lambda: None,
        alive_record=none,
        refresh_alive=lambda: None,
    )
    foreign = "T5-1-r9"  # another replica's: its owner node is looked up in ZooKeeper
    with pytest.raises(ReplicaUnavailable, match="lost ZooKeeper while deciding the outcome of T5-1-r9") as info:
        Outcomes(context, none).status(foreign)
    assert info.value.details["id"] == foreign
