"""A flush's removed inlined parts keep no bytes in the replicas' state (docs/architecture/small-writes.md,
"Bounds"): the flush stores them in a bundle beside the part it wrote, and applying its entry
leaves each removed record the bundle's path and offset instead of its bytes.

Against real ZooKeeper and replica processes: after a flush the removed records hold no bytes on
either replica, and every snapshot before it reads the same rows (``read``, datasets, DuckDB,
Polars, ``changes``, backup) on both, after a restart from the local snapshot and the WAL and
after loading a cluster checkpoint; cleanup keeps the bundle while its part is recorded (the
orphan pass too) and deletes it with that part; a rotted or missing bundle fails a read before
the flush as a rotted or missing part file does; a client's part naming a bundle is refused.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from support.cluster import make_cluster  # tests/ is on sys.path
from support.engines import engines, ns
from support.waiting import wait_until

import coordinator
from coordinator.errors import CorruptPart, InvalidInput, SnapshotUnavailable
from mergetxn.client.client import Client
from mergetxn.tools import recovery
from parts.io.format import encode_part, write_part
from parts.io.storage import Storage
from parts.model.meta import bundle_path
from replicas import checkpoint
from replicas.state import ReplicaState

pytestmark = pytest.mark.zk

SCHEMA = pa.schema([("n", pa.int64()), ("s", pa.string()), ("p", pa.string())])
CHECKPOINT_EVERY = 10


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:  # noqa: ANN001
    settings = {
        "inline_rows": 50,
        "inline_bytes": 8 * 1024,
        "merge_interval": 0,  # flushes happen when a test says so (compact)
        "gc_interval": 0,  # cleanup passes too
        "local_checkpoint_every": 8,
        "checkpoint_every": CHECKPOINT_EVERY,  # cluster checkpoints, and the log trimmed behind them
        "retain_entries": 0,
        "tail_check_seconds": 0.1,
    }
    with make_cluster(tmp_path_factory, zk_server, "spilled", replicas=2, settings=settings) as c:
        yield c


def rows(ns: range | list[int], p: str = "a") -> pa.Table:
    ns = list(ns)
    return pa.table({"n": ns, "s": [f"s{n}" for n in ns], "p": [p] * len(ns)}, schema=SCHEMA)


def listing(client: Client, table: str) -> list[dict]:
    return client.parts(table).to_pylist()


def flushed(client: Client, table: str) -> list[dict]:
    """The removed inlined parts' records of ``table``."""
    return [r for r in listing(client, table) if r["inlined"] and not r["visible"]]


def reads(client: Client, table: str, csns: list[int]) -> list[list[int]]:
    """``table``'s rows at each of ``csns`` through ``read``, a dataset, DuckDB and Polars."""
    out = []
    for csn in csns:
        by_arrow, by_duck, by_polars = engines(client, table, csn)
        by_read = ns(client.read(table, snapshot=csn))
        assert by_read == by_arrow == by_duck == by_polars, (csn, by_read, by_arrow, by_duck, by_polars)
        out.append(by_read)
    return out


def inlined_then_flushed(c: Client, table: str, n: int = 6, **options: object) -> tuple[list[int], int]:
    """``table`` with ``n`` inlined inserts over two partitions, then flushed by ``compact``: the
    inserts' CSNs and the flush's."""
    c.create_table(table, SCHEMA, partition_by=["p"], **options)
    csns = [c.insert(table, rows(range(3 * i, 3 * i + 3), p="ab"[i % 2])) for i in range(n)]
    assert all(r["inlined"] and r["held_bytes"] > 0 for r in listing(c, table))
    return csns, c.compact(table)


def assert_spilled(client: Client, table: str, n: int, storage: Path) -> set[str]:
    """``table``'s ``n`` flushed parts hold no bytes on ``client``'s replica, each names the bundle
    of a part the flush wrote, and those bundles are in storage; returns their paths."""
    recs = flushed(client, table)
    assert len(recs) == n and all(r["held_bytes"] == 0 for r in recs), recs
    merged = {r["path"] for r in listing(client, table) if r["visible"] and not r["inlined"]}
    bundles = {r["bundle"] for r in recs}
    assert bundles == {bundle_path(p) for p in merged}, (bundles, merged)
    assert all((storage / b).is_file() for b in bundles)
    return bundles


def test_flushed_records_hold_no_bytes_and_every_snapshot_reads_the_same(
    cluster: coordinator.LocalCluster, c0: Client, c1: Client, tmp_path: Path
) -> None:
    t = "sp_reads"
    c0.create_table(t, SCHEMA, partition_by=["p"])
    csns = [c0.insert(t, rows(range(3 * i, 3 * i + 3), p="ab"[i % 2])) for i in range(6)]
    before = reads(c0, t, csns)
    changed = sorted(c0.changes(t, 0, csns[-1]).column("n").to_pylist())
    at = c0.compact(t)
    storage = Path(cluster.storage_url)
    for c in (c0, c1):
        c.wait_for(at)
        assert len(assert_spilled(c, t, 6, storage)) == 2  # one part, and its bundle, per partition
        assert reads(c, t, csns) == before
        assert sorted(c.changes(t, 0, csns[-1]).column("n").to_pylist()) == changed
    recovery.backup(c1, t, str(tmp_path / "b"), snapshot=csns[-1])  # the bytes travel inlined again
    out = recovery.restore(c0, str(tmp_path / "b"), as_name="sp_restored")
    assert ns(c0.read("sp_restored")) == before[-1] and out["rows"] == len(before[-1])
    assert c0.check(t)["ok"]


def wait_local_snapshot(cluster: coordinator.LocalCluster, c: Client, i: int, csn: int) -> dict:
    """Commit to another table until replica ``i``'s local snapshot holds CSN ``csn``; its payload."""
    path = cluster.replica_dir(i) / checkpoint.LOCAL_NAME

    def held() -> dict | None:
        payload = checkpoint.read_local(path)
        if payload is not None and int(payload["applied"]) >= csn:
            return payload
        c.insert("sp_filler", rows([0]))
        return None

    return wait_until(held, 60, f"replica {i}'s local snapshot to hold CSN {csn}")


def spilled_in(payload: dict, path: str) -> ReplicaState:
    """The state a checkpoint payload restores (what a replica loading it holds)."""
    st = ReplicaState()
    st.restore(payload, path)
    return st


def test_a_restart_from_the_local_snapshot_and_wal_keeps_them_small(
    cluster: coordinator.LocalCluster, c0: Client
) -> None:
    t = "sp_restart"
    c0.create_table("sp_filler", SCHEMA) if "sp_filler" not in c0.tables() else None
    csns, at = inlined_then_flushed(c0, t)
    before = reads(c0, t, csns)
    payload = wait_local_snapshot(cluster, c0, 1, at)  # r1's local snapshot holds the flush
    st = spilled_in(payload, "local")
    names = {r["name"] for r in flushed(c0, t)}
    assert all(st.parts[n].meta.inline is None and st.parts[n].meta.spilled is not None for n in names)
    cluster.stop_replica(1)
    last = c0.insert(t, rows([100]))  # r1 applies it from the log once back
    cluster.start_replica(1)
    c = cluster.client(1)
    c.wait_for(last)
    assert_spilled(c, t, 6, Path(cluster.storage_url))
    assert reads(c, t, csns) == before and ns(c.read(t, snapshot=last)) == sorted([*before[-1], 100])
    c.close()


def newest_checkpoint(storage: Storage) -> tuple[int, str]:
    names = sorted(p for p in storage.list(checkpoint.CHECKPOINT_DIR + "/") if p.endswith(".ckpt"))
    if not names:
        return 0, ""
    return int(checkpoint.decode(storage.get(names[-1]), names[-1])["applied"]), names[-1]


def test_a_replica_loading_a_cluster_checkpoint_keeps_them_small(cluster: coordinator.LocalCluster, c0: Client) -> None:
    """r1 is stopped while r0 commits past the retained log (``retain_entries`` 0): back, it loads
    the cluster checkpoint, which holds the flush."""
    t = "sp_checkpoint"
    c0.create_table("sp_filler", SCHEMA) if "sp_filler" not in c0.tables() else None
    csns, at = inlined_then_flushed(c0, t)
    before = reads(c0, t, csns)
    cluster.stop_replica(1)
    stopped_at = c0.snapshot()  # r1 applied no more than r0 had
    storage = Storage(cluster.storage_url)

    def trimmed() -> bool:
        # The log trimmed past r1's position, by a round before the last (whose epochs are
        # deleted by now): a checkpoint's CSN alone is r0's applied CSN when it was written,
        # which says nothing of how far the log was trimmed (not past r1 while its alive node
        # still counted in the floor: then r1 came back by the log, loading no checkpoint).
        if c0.call("info")["log"]["retained"] > max(at, stopped_at) + CHECKPOINT_EVERY:
            return True
        c0.insert("sp_filler", rows([0]))
        return False

    wait_until(trimmed, 90, "the log trimmed past the stopped replica")
    csn, path = newest_checkpoint(storage)
    st = spilled_in(checkpoint.decode(storage.get(path), path), path)
    names = {r["name"] for r in flushed(c0, t)}
    assert len(names) == 6
    assert all(st.parts[n].meta.inline is None and st.parts[n].meta.spilled is not None for n in names)
    log = cluster.replica_dir(1) / "replica.log"
    loads = log.read_text(errors="replace").count("is below the retained log: loading checkpoint")
    cluster.start_replica(1)
    c = cluster.client(1)
    c.wait_for(csn)
    assert log.read_text(errors="replace").count("is below the retained log: loading checkpoint") == loads + 1
    assert_spilled(c, t, 6, Path(cluster.storage_url))
    assert reads(c, t, csns) == before
    c.close()


def test_a_rotted_or_missing_bundle_fails_a_read_as_a_part_file_does(
    cluster: coordinator.LocalCluster, c0: Client
) -> None:
    t = "sp_rotted"
    csns, _ = inlined_then_flushed(c0, t, n=2)
    a_file = "sp_rotted_file"  # a part in storage, the comparison
    c0.create_table(a_file, SCHEMA)
    c0.commit_parts(a_file, [write_part(c0.storage, a_file, [], (), rows(range(3)), "T1-1-rzz")])
    file_path = Path(cluster.storage_url) / listing(c0, a_file)[0]["path"]
    (rec,) = [r for r in flushed(c0, t) if r["partition"] == '["a"]']
    bundle = Path(cluster.storage_url) / rec["bundle"]
    for path in (bundle, file_path):
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0xFF  # the same size, another checksum
        path.write_bytes(bytes(raw))
    with pytest.raises(CorruptPart, match="checksum") as rotted:
        c0.read(t, snapshot=csns[0])
    with pytest.raises(CorruptPart, match="checksum") as rotted_file:
        c0.read(a_file)
    assert type(rotted.value) is type(rotted_file.value)
    bundle.unlink()
    file_path.unlink()
    with pytest.raises(CorruptPart, match="missing") as missing:
        c0.read(t, snapshot=csns[0])
    with pytest.raises(CorruptPart, match="missing") as missing_file:
        c0.read(a_file)
    assert type(missing.value) is type(missing_file.value)


def test_a_client_part_naming_a_bundle_is_refused_and_nothing_committed(c0: Client) -> None:
    t = "sp_forged"
    c0.create_table(t, SCHEMA)
    stored = write_part(c0.storage, t, [], (), rows(range(3)), "T1-1-rzz")
    meta, _ = encode_part(t, [], (), rows(range(2)), "T1-2-rzz")
    at = (bundle_path(stored.path), 0)
    for part in (dataclasses.replace(stored, spilled=at), dataclasses.replace(meta, spilled=at)):
        with pytest.raises(InvalidInput) as caught:
            c0.commit_parts(t, [part])
        assert caught.value.details.get("field") == "spilled" and caught.value.details.get("table") == t
        tx = c0.begin()
        with pytest.raises(InvalidInput, match="spilled"):
            tx.add_parts(t, [part])
        tx.rollback()
    assert c0.parts(t).num_rows == 0 and c0.read(t).num_rows == 0


def test_cleanup_deletes_a_bundle_once_no_read_may_take_from_it_and_never_before(
    cluster: coordinator.LocalCluster, c0: Client
) -> None:
    """The orphan pass keeps a bundle its part's record names (however old) and deletes one no
    commit names; a pass deletes the bundle once the window of the parts its flush removed
    passed (they were all removed at the flush's CSN: reads before it are refused by then) and
    never before, while its part stays live and readable; the part's own removal takes
    whatever is left of it."""
    t = "sp_cleanup"
    csns, at = inlined_then_flushed(c0, t, n=3, retention_seconds=1)
    root = Path(cluster.storage_url)
    (bundle,) = [b for b in assert_spilled(c0, t, 3, root) if "p=a" in b]
    (merged,) = [r["path"] for r in listing(c0, t) if r["visible"] and bundle_path(r["path"]) == bundle]
    orphan = root / Path(bundle).parent / "T1-7-rzz_00000000000000ab.inlined"  # a flush that never committed
    orphan.write_bytes(b"x" * 10)
    old = time.time() - 3600
    for path in (orphan, root / bundle):
        os.utime(path, (old, old))  # past the grace period
    c1 = cluster.client(1)
    c1.wait_for(at)
    holds = [r["name"] for r in flushed(c0, t) if r["bundle"] == bundle]
    assert len(holds) == 2  # partition a's two inlined parts

    def pass_deletes_it() -> bool:
        report = c0.gc(grace_seconds=0)
        assert merged not in {r["path"] for r in report["removed"]}
        if (root / bundle).is_file():
            return False
        # Gone: every record naming it, on every replica, is past its window, and a read before
        # the flush is refused as older than retained, never answered from a missing bundle.
        for c in (c0, c1):
            assert all(r["collected"] for r in listing(c, t) if r["bundle"] == bundle)
        with pytest.raises(SnapshotUnavailable):
            c0.read(t, snapshot=csns[0])
        return True

    first = c0.gc(grace_seconds=0)
    assert str(orphan.relative_to(root)) in {r["path"] for r in first["removed"]} and not orphan.exists()
    wait_until(pass_deletes_it, 30, "the flushed parts' 1 s window to pass")
    assert (root / merged).is_file() and ns(c0.read(t)) == ns(c0.read(t, snapshot=at))
    with c0.transaction() as tx:
        tx.truncate(t)  # the merged part's removal: its file, sidecar and any bundle go after its window
    wait_until(lambda: merged in {r["path"] for r in c0.gc()["removed"]}, 30, "the merged part's window to pass")
    assert not (root / merged).exists() and not list((root / t).rglob("*.inlined"))
    c1.close()
