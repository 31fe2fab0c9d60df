"""``scan`` of a keys table in bounded memory: a table whose whole-partition
fold needs many times a small ``memory_budget`` is scanned key range by key range in a fresh
process, whose Arrow memory peak is measured (``pyarrow.default_memory_pool().max_memory()``),
and gives the rows ``read`` gives, sorted by key within each partition. The same scan with a
budget that lets each partition fold at once shows the peak the budget avoids (so the bound can
fail). Against a real ZooKeeper and replicas.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.cluster import make_cluster
from support.folding import folding

from coordinator.errors import InvalidInput
from mergetxn.local.zkserver import ZooKeeperServer

SCHEMA = pa.schema(
    [
        pa.field("p", pa.string(), nullable=False),
        pa.field("k", pa.int64(), nullable=False),
        pa.field("a", pa.string()),
        pa.field("b", pa.int64()),
    ]
)
KEYS = 80_000  # per partition
BUDGET = 2 << 20

# Run in a fresh process: scan with a budget, write every table as it comes, report the peak.
SCANNER = """
import json, sys
import pyarrow as pa, pyarrow.parquet as pq
import coordinator
address, table, budget, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
client = coordinator.connect(address)
pool = pa.default_memory_pool()
tables = 0
with client.scan(table, memory_budget=budget) as (snap, metas, parts):
    schema = client.table_at(table, snap).schema
    base = pool.bytes_allocated()
    with pq.ParquetWriter(out, schema) as w:
        for t in parts:
            w.write_table(t)
            tables += 1
            del t
print(json.dumps({"peak": pool.max_memory() - base, "tables": tables, "snapshot": snap}))
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator:
    with make_cluster(tmp_path_factory, zk_server, "keysscan", replicas=1) as c:
        yield c


def _rows(p: str, keys: range, tag: str) -> pa.Table:
    n = len(keys)
    return pa.table(
        {
            "p": pa.array([p] * n),
            "k": pa.array(keys, pa.int64()),
            "a": pa.array([f"{tag}-{k}" if k % 7 else None for k in keys]),
            "b": pa.array([k * 3 for k in keys], pa.int64()),
        },
        schema=SCHEMA,
    )


def _scan(cluster, name: str, budget: int, out: Path) -> dict:  # noqa: ANN001
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, "-c", SCANNER, cluster.replica_addresses[0], name, str(budget), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _sorted(t: pa.Table) -> pa.Table:
    return t.sort_by([("p", "ascending"), ("k", "ascending")])


def test_scan_folds_in_bounded_memory(cluster, tmp_path: Path) -> None:  # noqa: ANN001
    c = cluster.client(0)
    name = "scan_bounded"
    c.create_table(name, SCHEMA, partition_by=("p",), primary_key=("p", "k"), conflict_policy="keys", auto_merge=False)
    # Keys written in scattered order over several commits (so every range reads every part,
    # and no part alone is big: a part's row group decodes whole, see parts/io/keyscan.py).
    for p in ("x", "y"):
        for i in range(4):
            with c.transaction() as tx:
                tx.insert(name, _rows(p, range(KEYS - 1 - i, -1, -4), "v1"))
        for i in range(2):
            with c.transaction() as tx:
                tx.insert(name, _rows(p, range(i * 2, KEYS, 4), "v2"))  # overwrite half
        with c.transaction() as tx:
            tx.upsert(name, _rows(p, range(1, KEYS, 10), "u").select(["p", "k", "a"]), update=True)  # b carried
        with c.transaction() as tx:
            tx.delete_keys(name, pa.table({"p": [p] * (KEYS // 5), "k": pa.array(range(0, KEYS, 5), pa.int64())}))
            tx.lock_keys(name, pa.table({"p": [p] * 99, "k": pa.array(range(3, 300, 3), pa.int64())}))
    expected = _sorted(c.read(name))
    assert 0 < expected.num_rows < 2 * KEYS

    small = _scan(cluster, name, BUDGET, tmp_path / "small.parquet")
    got = pq.read_table(tmp_path / "small.parquet")
    assert got.equals(_sorted(got)), "ranges come in key order"
    assert _sorted(got).equals(expected)
    assert small["tables"] > 8, small  # the budget split each partition into ranges

    whole = _scan(cluster, name, 1 << 40, tmp_path / "whole.parquet")
    assert whole["tables"] == 2  # one fold per partition
    assert _sorted(pq.read_table(tmp_path / "whole.parquet")).equals(expected)
    # The budget bounds what the scan holds (a range's versions, their fold, one batch); a
    # partition's fold at once is several times more.
    assert small["peak"] <= 3 * BUDGET, small
    assert whole["peak"] >= 4 * small["peak"], (small, whole)


def test_scan_budget_is_checked(cluster) -> None:  # noqa: ANN001
    c = cluster.client(0)
    for bad in (0, -1, 1.5, "big", True):
        with pytest.raises(InvalidInput, match="memory_budget"):
            with c.scan("scan_bounded", memory_budget=bad):
                pass


def test_scan_by_range_reads_by_vectors_as_the_fold(cluster, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """A partition scanned key range by key range reads each range's rows minus the parts'
    deletion vectors, with no fold (the fold made to fail), and gives what a client that asks
    for no vectors scans (the fold by range) and what ``read`` gives, in key order, at the
    latest snapshot and at one before the last writes."""
    from coordinator.core import keyfold

    c = cluster.client(0)
    name = "scan_vectors"
    c.create_table(
        name,
        SCHEMA,
        partition_by=("p",),
        primary_key=("p", "k"),
        conflict_policy="keys",
        auto_merge=False,
        retention_seconds=3600,
    )
    n = 30_000  # parts of 10,000 rows: two row groups each (KEYS_ROW_GROUP_ROWS)
    for p in ("x", "y"):
        for i in range(3):
            with c.transaction() as tx:
                tx.insert(name, _rows(p, range(n - 1 - i, -1, -3), "v1"))
        with c.transaction() as tx:
            tx.upsert(name, _rows(p, range(0, n, 4), "v2"))
    before = c.snapshot()
    # the replica derives the vectors here and follows the writes after: both snapshots read by them
    assert "vectors" in c.call("visible", table=name, vectors=True, lease="none")
    for p in ("x", "y"):
        with c.transaction() as tx:
            tx.upsert(name, _rows(p, range(1, n, 10), "u").select(["p", "k", "a"]), update=True)  # b carried
        with c.transaction() as tx:
            tx.delete_keys(name, pa.table({"p": [p] * (n // 5), "k": pa.array(range(0, n, 5), pa.int64())}))
            tx.lock_keys(name, pa.table({"p": [p] * 19, "k": pa.array(range(3, 60, 3), pa.int64())}))
    assert "vectors" in c.call("visible", table=name, snapshot=before, vectors=True, lease="none")
    fold = folding(cluster.client(0))
    for snapshot in (before, None):
        want = [t.to_pylist() for t in _scanned(fold, name, snapshot)]
        assert len(want) > 4, "the budget split each partition into ranges"
        with monkeypatch.context() as m:
            m.setattr(keyfold, "merge", lambda *a, **k: pytest.fail("a range was folded although vectors were sent"))
            got = [t.to_pylist() for t in _scanned(c, name, snapshot)]
        assert got == want, snapshot
        flat = [r for t in got for r in t]
        assert flat == c.read(name, snapshot=snapshot).to_pylist()


def _scanned(c, name: str, snapshot: int | None) -> list[pa.Table]:  # noqa: ANN001
    with c.scan(name, snapshot=snapshot, memory_budget=1 << 20) as (_, _, tables):
        return list(tables)
