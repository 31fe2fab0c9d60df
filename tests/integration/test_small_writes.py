"""Small writes without files (docs/architecture/small-writes.md): an insert of at most
``inline_rows`` rows and ``inline_bytes`` of Parquet commits its part inside its log entry.

Against real ZooKeeper and replica processes: such an insert writes no file in storage and reads
back at every snapshot on every replica, through ``read`` (with and without a filter), datasets,
DuckDB and Polars; the thresholds' edges (rows, bytes, 0 = off) write a file; a forged inlined
part is refused with InvalidInput naming it, and nothing is committed; a flush (a merge of the
inlined parts, by count in the background or by ``compact``) keeps every snapshot's rows (the
background one leaves the removed records without their bytes, in its bundle); a
flush racing inserts loses and duplicates nothing; backup and restore, ``check`` and a replica
restarted from its checkpoint and WAL all see the inlined rows.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from click.testing import CliRunner
from support.cluster import make_cluster  # tests/ is on sys.path
from support.engines import engines, ns

import coordinator
from coordinator.errors import ConflictError, InvalidInput
from mergetxn.cli import cli
from mergetxn.client.client import Client
from mergetxn.tools import recovery
from parts.io.format import encode_part
from parts.model.meta import PartMeta

pytestmark = pytest.mark.zk

SCHEMA = pa.schema([("n", pa.int64()), ("s", pa.string()), ("p", pa.string())])
INLINE_ROWS = 50
INLINE_BYTES = 8 * 1024


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:  # noqa: ANN001
    settings = {
        "inline_rows": INLINE_ROWS,
        "inline_bytes": INLINE_BYTES,
        "merge_interval": 0,  # flushes here happen when a test says so (compact, run_merge)
        "local_checkpoint_every": 8,  # a restarted replica loads a local checkpoint and a WAL tail
    }
    with make_cluster(tmp_path_factory, zk_server, "inline", replicas=2, settings=settings) as c:
        yield c


def rows(ns: range | list[int], p: str = "a") -> pa.Table:
    ns = list(ns)
    return pa.table({"n": ns, "s": [f"s{n}" for n in ns], "p": [p] * len(ns)}, schema=SCHEMA)


def files(cluster: coordinator.LocalCluster, table: str) -> list[Path]:
    """Every Parquet file in storage under ``table``."""
    return sorted((Path(cluster.storage_url) / table).rglob("*.parquet"))


def inlined(client: Client, table: str) -> list[bool]:
    """Whether each visible part of ``table`` is inlined."""
    listing = client.parts(table).to_pylist()
    return [r["inlined"] for r in listing if r["visible"]]


def test_small_inserts_write_no_file_and_read_everywhere_at_every_snapshot(
    cluster: coordinator.LocalCluster, c0: Client, c1: Client
) -> None:
    t = "inl_reads"
    c0.create_table(t, SCHEMA, partition_by=["p"])
    expected: list[tuple[int, list[int]]] = []
    have: list[int] = []
    for i in range(3):
        csn = c0.insert(t, rows(range(10 * i, 10 * i + 5), p="ab"[i % 2]))
        have += list(range(10 * i, 10 * i + 5))
        expected.append((csn, sorted(have)))
    with c0.transaction() as tx:
        tx.insert(t, rows([100, 101]))
    assert tx.csn is not None
    have += [100, 101]
    expected.append((tx.csn, sorted(have)))
    assert files(cluster, t) == []  # no file, no sidecar
    assert not list((Path(cluster.storage_url) / t).rglob("*.json"))
    assert inlined(c0, t) == [True] * 4
    for client in (c0, c1):
        for csn, want in expected:
            assert ns(client.read(t, snapshot=csn)) == want
            got = client.read(t, snapshot=csn, where=pc.field("n") >= 20)
            assert ns(got) == [n for n in want if n >= 20]
            assert ns(client.read(t, snapshot=csn, where=pc.field("p") == "b")) == [n for n in want if 10 <= n < 15]
            assert engines(client, t, csn) == (want, want, want)
    changes = c1.changes(t, 0, expected[-1][0])
    assert sorted(changes.column("n").to_pylist()) == have
    assert set(changes.column("_change").to_pylist()) == {"insert"}


def test_threshold_edges_rows_bytes_and_off(cluster: coordinator.LocalCluster, c0: Client) -> None:
    t = "inl_edges"
    c0.create_table(t, SCHEMA)
    c0.insert(t, rows(range(INLINE_ROWS)))  # at the row bound: inlined
    assert files(cluster, t) == []
    c0.insert(t, rows(range(INLINE_ROWS + 1)))  # one row past it: a file
    assert len(files(cluster, t)) == 1
    big = pa.table({"n": [1], "s": ["x" * (INLINE_BYTES + 1)], "p": ["a"]}, schema=SCHEMA)
    c0.insert(t, big)  # one row past the byte bound: a file
    assert len(files(cluster, t)) == 2
    assert sorted(inlined(c0, t)) == [False, False, True]
    off = "inl_off"
    c0.create_table(off, SCHEMA, inline_rows=0)
    c0.insert(off, rows(range(3)))
    assert len(files(cluster, off)) == 1 and inlined(c0, off) == [False]
    c0.alter_table(off, inline_rows=None)  # back to the replica's setting
    c0.insert(off, rows(range(3)))
    assert len(files(cluster, off)) == 1 and sorted(inlined(c0, off)) == [False, True]
    assert ns(c0.read(off)) == [0, 0, 1, 1, 2, 2]


def test_the_cli_sets_and_describes_a_tables_thresholds(cluster: coordinator.LocalCluster, c0: Client) -> None:
    runner = CliRunner(env={"MERGETXN_REPLICA": cluster.replica_addresses[0]})

    def cli_run(*args: str) -> str:
        r = runner.invoke(cli, list(args), catch_exceptions=False)
        assert r.exit_code == 0, r.output
        return r.output

    cli_run("table", "create", "inl_cli", "--schema", "n:int64,s:string,p:string", "--inline-rows", "2")
    c0.insert("inl_cli", rows(range(3)))  # past the table's 2 rows: a file
    c0.insert("inl_cli", rows(range(2)))
    assert sorted(inlined(c0, "inl_cli")) == [False, True]
    described = " ".join(cli_run("table", "describe", "inl_cli").split())
    assert f"at most 2 rows and {INLINE_BYTES} Parquet bytes" in described and "1 inlined parts now" in described


def forged(client: Client, table: str, data: pa.Table, **changes: object) -> PartMeta:
    meta, raw = encode_part(table, [], (), data, "forger")
    return dataclasses.replace(meta, inline=raw, **changes)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"rows": 4}, "rows"),
        ({"checksum": "crc32:00000000"}, "checksum"),
        ({"stats": {"n": (1, 2)}}, "stats.n"),
    ],
)
def test_a_forged_inlined_part_is_refused_and_nothing_committed(
    cluster: coordinator.LocalCluster, c0: Client, change: dict, field: str
) -> None:
    t = "inl_forged_" + field.replace(".", "_")
    c0.create_table(t, pa.schema([("n", pa.int64()), ("s", pa.string())]))
    data = pa.table({"n": [1, 2, 3], "s": ["a", "b", "c"]})
    before = c0.read(t)
    with pytest.raises(InvalidInput) as caught:
        c0.commit_parts(t, [forged(c0, t, data, **change)])
    assert caught.value.details.get("field") == field and caught.value.details.get("table") == t
    assert "part " in caught.value.message
    assert c0.read(t).equals(before) and c0.parts(t).num_rows == 0


def test_an_inlined_part_past_the_tables_setting_or_in_an_overwrite_is_refused(c0: Client) -> None:
    t = "inl_forged_big"
    schema = pa.schema([("n", pa.int64()), ("s", pa.string())])
    c0.create_table(t, schema, inline_rows=5)
    data = pa.table({"n": list(range(6)), "s": ["a"] * 6})
    with pytest.raises(InvalidInput) as caught:
        c0.commit_parts(t, [forged(c0, t, data)])
    assert caught.value.details.get("setting") == "inline_rows" and caught.value.details.get("table") == t
    small = pa.table({"n": [1], "s": ["a"]})
    with pytest.raises(InvalidInput) as caught:
        c0.commit_parts(t, [forged(c0, t, small)], op="overwrite")
    assert caught.value.details.get("setting") == "inline_rows"
    keys = "inl_forged_keys"
    c0.create_table(
        keys,
        pa.schema([pa.field("n", pa.int64(), nullable=False), ("s", pa.string())]),
        primary_key=["n"],
        conflict_policy="keys",
    )
    c0.insert(keys, small)  # a keys table's insert is never inlined
    assert inlined(c0, keys) == [False]
    assert c0.parts(t).num_rows == 0


def test_a_retried_commit_of_an_inlined_part_gets_its_csn(c0: Client) -> None:
    t = "inl_retry"
    c0.create_table(t, pa.schema([("n", pa.int64()), ("s", pa.string())]))
    meta = forged(c0, t, pa.table({"n": [1], "s": ["a"]}))
    csn = c0.commit_parts(t, [meta])
    assert c0.commit_parts(t, [meta]) == csn
    assert c0.read(t).num_rows == 1


def snapshots(client: Client, table: str, csns: list[int]) -> list[list[int]]:
    return [ns(client.read(table, snapshot=c)) for c in csns]


def test_compact_flushes_and_every_snapshot_reads_the_same(
    cluster: coordinator.LocalCluster, c0: Client, c1: Client
) -> None:
    t = "inl_compact"
    c0.create_table(t, SCHEMA, partition_by=["p"])
    csns = [c0.insert(t, rows(range(3 * i, 3 * i + 3), p="ab"[i % 2])) for i in range(6)]
    assert files(cluster, t) == [] and inlined(c0, t) == [True] * 6
    before = snapshots(c0, t, csns)
    at = c0.compact(t)
    assert not any(inlined(c0, t)) and len(inlined(c0, t)) == 2  # one part in storage per partition
    assert len(files(cluster, t)) == 2
    for client in (c0, c1):
        assert snapshots(client, t, csns) == before  # pinned before the flush: the same rows
        assert ns(client.read(t, snapshot=at)) == before[-1] == ns(client.read(t))
        assert engines(client, t, at) == (before[-1],) * 3
        assert engines(client, t, csns[-1]) == (before[-1],) * 3


def test_a_background_flush_by_count_keeps_the_rows(zk_server, tmp_path_factory: pytest.TempPathFactory) -> None:  # noqa: ANN001
    """A replica's background merges flush a partition once it holds ``inline_flush_parts``
    inlined parts (not before: the age and size bounds are far off), into a part in storage."""
    settings = {
        "inline_rows": INLINE_ROWS,
        "inline_flush_parts": 4,
        "inline_flush_seconds": 3600,
        "merge_interval": 0.1,
        "merge_min_parts": 1000,  # no ordinary minor merge: what merges here is the flush
        "major_idle_seconds": 3600,
    }
    with make_cluster(tmp_path_factory, zk_server, "inline_count", replicas=1, settings=settings) as cluster:
        c = cluster.client(0)
        t = "inl_count"
        c.create_table(t, SCHEMA)
        csns = [c.insert(t, rows([i])) for i in range(3)]
        before = snapshots(c, t, csns)
        csns.append(c.insert(t, rows([3])))  # the fourth: the flush is due
        before.append(ns(c.read(t, snapshot=csns[-1])))
        deadline = time.monotonic() + 30
        while any(inlined(c, t)) and time.monotonic() < deadline:
            time.sleep(0.05)  # waits for the condition, not for an ordering
        assert inlined(c, t) == [False] and len(files(cluster, t)) == 1
        flushed = max(r["creation_csn"] for r in c.parts(t).to_pylist())
        assert flushed > csns[-1]
        assert snapshots(c, t, csns) == before and ns(c.read(t, snapshot=flushed)) == before[-1] == [0, 1, 2, 3]
        assert engines(c, t, flushed) == (before[-1],) * 3
        # The merge round's flush left the removed records without their bytes: in its bundle.
        removed = [r for r in c.parts(t).to_pylist() if not r["visible"]]
        assert len(removed) == 4 and all(r["held_bytes"] == 0 and r["bundle"] for r in removed)
        assert (Path(cluster.storage_url) / removed[0]["bundle"]).is_file()


def test_a_flush_racing_inserts_loses_and_duplicates_nothing(c0: Client, c1: Client) -> None:
    t = "inl_race"
    c0.create_table(t, SCHEMA)
    c0.insert(t, rows(range(5)))
    writers, per_writer = 3, 8
    start = threading.Barrier(writers + 1)
    failures: list[BaseException] = []
    csns: list[int] = []

    def write(w: int) -> None:
        try:
            client = c0 if w % 2 else c1
            start.wait()
            for i in range(per_writer):
                csns.append(client.insert(t, rows([1000 * (w + 1) + i])))
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    def flush() -> None:
        start.wait()
        for _ in range(4):
            try:
                c0.compact(t)
            except ConflictError:
                pass

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    threads.append(threading.Thread(target=flush))
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not failures
    want = sorted([*range(5), *(1000 * (w + 1) + i for w in range(writers) for i in range(per_writer))])
    last = max(csns)  # each replica read where it has applied every insert
    assert ns(c0.read(t, snapshot=last)) == want and ns(c1.read(t, snapshot=last)) == want
    at = c0.compact(t)
    assert ns(c1.read(t, snapshot=at)) == want and not any(inlined(c0, t))


def test_backup_and_restore_of_inlined_rows(cluster: coordinator.LocalCluster, c0: Client, tmp_path: Path) -> None:
    t = "inl_backup"
    c0.create_table(t, SCHEMA)
    c0.insert(t, rows(range(4)))
    c0.insert(t, rows(range(100, 100 + INLINE_ROWS + 1)))  # a file beside the inlined part
    assert sorted(inlined(c0, t)) == [False, True]
    manifest = recovery.backup(c0, t, str(tmp_path / "b"))
    assert len(list((tmp_path / "b").rglob("*.parquet"))) == 1  # the inlined part travels in the manifest
    assert sum(1 for e in manifest["parts"] if "inline" in e["meta"]) == 1
    out = recovery.restore(c0, str(tmp_path / "b"), as_name="inl_restored")
    assert ns(c0.read("inl_restored")) == ns(c0.read(t)) and out["rows"] == 4 + INLINE_ROWS + 1


def test_check_passes_on_inlined_parts(c0: Client) -> None:
    t = "inl_check"
    c0.create_table(t, SCHEMA)
    c0.insert(t, rows(range(3)))
    for checksums in (True, False):
        report = c0.check(t, checksums=checksums)
        assert report["ok"], report
        assert report["tables"][0]["parts"] == 1


def inlined_table(c: Client, t: str, n: int = 4) -> tuple[int, list[int]]:
    """``t`` holding ``n`` inlined parts of one row each: (the last insert's CSN, the rows)."""
    c.create_table(t, SCHEMA)
    csn = 0
    for i in range(n):
        csn = c.insert(t, rows([i]))
    assert inlined(c, t) == [True] * n
    return csn, list(range(n))


def test_a_flush_against_a_truncate_in_either_order(cluster: coordinator.LocalCluster, c0: Client, c1: Client) -> None:
    """Explicit order: one statement staged, the other committed, then the first's commit."""
    t = "inl_vs_truncate"
    before, want = inlined_table(c0, t)
    c1.wait_for(before)  # else r1's truncate may begin before the inserts, see none of them and win
    truncate = c1.begin()
    truncate.truncate(t)
    flushed = c0.compact(t)  # commits first: the truncate staged against the inlined parts loses
    with pytest.raises(ConflictError):
        truncate.commit()
    assert ns(c1.read(t, snapshot=flushed)) == want and ns(c1.read(t, snapshot=before)) == want
    assert not any(inlined(c0, t))

    t2 = "inl_vs_truncate2"
    before, want = inlined_table(c0, t2)
    c1.wait_for(before)
    flush = c0.begin()
    flush.compact(t2, "minor")
    with c1.transaction() as tx:
        tx.truncate(t2)
    with pytest.raises(ConflictError):  # its sources were removed by the truncate
        flush.commit()
    assert ns(c0.read(t2, snapshot=tx.csn)) == [] and ns(c0.read(t2, snapshot=before)) == want
    assert files(cluster, t2) == []


def test_two_flushes_on_two_replicas_one_wins(c0: Client, c1: Client) -> None:
    t = "inl_two_flushes"
    before, want = inlined_table(c0, t)
    c1.wait_for(before)  # else r1's flush may begin before the inserts and have nothing to flush
    first, second = c0.begin(), c1.begin()
    first.compact(t, "minor")
    second.compact(t, "minor")
    first.commit()
    with pytest.raises(ConflictError):
        second.commit()
    assert first.csn is not None
    for c in (c0, c1):
        assert ns(c.read(t, snapshot=first.csn)) == want and ns(c.read(t, snapshot=before)) == want
    assert [r["inlined"] for r in c0.parts(t).to_pylist() if r["visible"]] == [False]


def test_a_flush_across_an_added_column_keeps_every_row(c0: Client, c1: Client) -> None:
    t = "inl_vs_ddl"
    before, want = inlined_table(c0, t)
    flush = c0.begin()
    flush.compact(t, "minor")
    altered = c1.alter_table(t, add_columns=[pa.field("extra", pa.int64())])
    try:
        flush.commit()
    except (ConflictError, InvalidInput):
        pass  # refused across the DDL: the inlined parts stay, a later flush takes them
    at = c0.compact(t)
    got = c1.read(t, snapshot=at)
    assert ns(got) == want and got.column("extra").null_count == len(want)
    assert ns(c1.read(t, snapshot=before)) == want and ns(c1.read(t, snapshot=altered)) == want
    assert not any(inlined(c0, t))


def test_a_restarted_replica_reads_inlined_rows(cluster: coordinator.LocalCluster, c0: Client) -> None:
    """Runs last: replica 1 comes back on another port (the module's ``c1`` is not used after)."""
    t = "inl_restart"
    c0.create_table(t, SCHEMA)
    for i in range(12):  # past local_checkpoint_every: a local checkpoint and a WAL tail after it
        c0.insert(t, rows([i]))
    cluster.stop_replica(1)
    last = c0.insert(t, rows([12]))  # applied by replica 1 from the log once it is back
    cluster.start_replica(1)
    c = cluster.client(1)
    assert ns(c.read(t, snapshot=last)) == list(range(13))
    assert engines(c, t, last) == (list(range(13)),) * 3


def test_a_client_whose_thresholds_went_stale_writes_a_file(
    zk_server, tmp_path_factory: pytest.TempPathFactory
) -> None:  # noqa: ANN001
    """A replica restarted with inlining off refuses the inlined part of a client that learned
    the old thresholds: ``client.insert`` and ``tx.insert`` learn them again and write a file,
    once, and the rows commit (no error for the caller, nothing twice)."""
    with make_cluster(tmp_path_factory, zk_server, "inline_stale", replicas=1, settings={"inline_rows": 10}) as cluster:
        c = cluster.client(0)
        c.create_table("stale", SCHEMA, auto_merge=False)
        c.insert("stale", rows([1]))
        assert inlined(c, "stale") == [True] and c.inline_settings[0] == 10
        cluster.settings["inline_rows"] = 0
        cluster.stop_replica(0)
        cluster.start_replica(0)
        c.insert("stale", rows([2]))
        with c.transaction() as tx:
            tx.insert("stale", rows([3]))
        assert c.inline_settings == (0, 0)
        assert sorted(inlined(c, "stale")) == [False, False, True] and len(files(cluster, "stale")) == 2
        assert ns(c.read("stale")) == [1, 2, 3]
        c.close()
