"""Writers after a change: a write lacking nullable columns of the table (added
by ``alter_table``) fills them with null in every write path, while absent non-nullable or
partition columns and extra columns are still refused; and ``mergetxn insert`` writes keys tables
by key, as ``client.upsert`` does. Real replicas, real ZooKeeper; the CLI through CliRunner."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from support.cluster import make_cluster  # tests/ is on sys.path

from coordinator import LocalCluster
from coordinator.errors import InvalidInput
from mergetxn.cli import cli
from mergetxn.client import Client
from mergetxn.local.zkserver import ZooKeeperServer
from parts.io.format import write_part

BASE = pa.schema([pa.field("id", pa.int64(), nullable=False), ("p", pa.string()), ("v", pa.string())])
NOTE = pa.field("note", pa.string())
KEYED = pa.schema([pa.field("k", pa.int64(), nullable=False), ("a", pa.string())])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator[LocalCluster]:
    with make_cluster(
        tmp_path_factory, zk_server, "writers", replicas=1, settings={"merge_interval": 0, "gc_interval": 0}
    ) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    cl = cluster.client(0)
    yield cl
    cl.close()


def invoke(cluster: LocalCluster, *args: object) -> Result:
    runner = CliRunner(env={"MERGETXN_REPLICA": cluster.replica_addresses[0]})
    return runner.invoke(cli, [str(a) for a in args], catch_exceptions=False)


def old_rows(first: int, n: int) -> pa.Table:
    """Rows as a producer written before the alter makes them: no ``note``."""
    ids = list(range(first, first + n))
    return pa.table({"id": ids, "p": ["a"] * n, "v": [f"v{i}" for i in ids]}, schema=BASE)


def by_id(client: Client, table: str) -> list[dict]:
    return sorted(client.read(table).to_pylist(), key=lambda r: r["id"])


def altered(client: Client, name: str) -> str:
    client.create_table(name, BASE, partition_by=["p"], auto_merge=False)
    client.alter_table(name, add_columns=[NOTE])
    return name


def test_client_writes_lacking_an_added_nullable_column_fill_null(client: Client) -> None:
    t = altered(client, "w_client")
    with client.transaction() as tx:
        tx.insert(t, old_rows(0, 2))
        assert tx.read(t).column("note").to_pylist() == [None, None]  # its own writes, conformed
    assert by_id(client, t) == [
        {"id": 0, "p": "a", "v": "v0", "note": None},
        {"id": 1, "p": "a", "v": "v1", "note": None},
    ]
    with client.transaction() as tx:
        tx.overwrite(t, old_rows(5, 1))
    assert by_id(client, t) == [{"id": 5, "p": "a", "v": "v5", "note": None}]


def test_a_committed_part_file_lacking_a_nullable_column_reads_null(client: Client) -> None:
    """A part a writer made itself (``write_part`` + ``commit_parts``, as Spark's native writer
    commits its files) without the added column: reads give null there, as for parts written
    before the alter."""
    t = altered(client, "w_parts")
    tdef = client.table(t)
    meta = write_part(client.storage, t, ["p"], ("a",), old_rows(0, 2), "job-1", tdef.ddl_version)
    client.commit_parts(t, [meta])
    assert by_id(client, t) == [
        {"id": 0, "p": "a", "v": "v0", "note": None},
        {"id": 1, "p": "a", "v": "v1", "note": None},
    ]


def test_absent_required_and_extra_columns_are_still_refused(client: Client) -> None:
    t = altered(client, "w_refused")
    before = client.snapshot()
    tx = client.begin()
    with pytest.raises(InvalidInput, match=r"missing column\(s\) \['id'\]"):  # not nullable
        tx.insert(t, pa.table({"p": ["a"], "v": ["x"]}))
    with pytest.raises(InvalidInput, match=r"missing column\(s\) \['p'\]"):  # the partition column
        tx.insert(t, pa.table({"id": [1], "v": ["x"]}))
    with pytest.raises(InvalidInput, match=r"unexpected column\(s\) \['zz'\]"):
        tx.insert(t, old_rows(0, 1).append_column("zz", pa.array([1])))
    tx.rollback()
    assert client.read(t).num_rows == 0 and client.snapshot() == before


def test_keys_table_put_fills_null_and_update_mode_keeps(client: Client) -> None:
    # keys tables cannot be altered yet: a nullable column the writes lack stands for an added one
    client.create_table("w_keys", KEYED.append(NOTE), primary_key=["k"], conflict_policy="keys")
    with client.transaction() as tx:
        tx.insert("w_keys", pa.table({"k": [1, 2], "a": ["x", "y"]}, schema=KEYED))
    assert client.read("w_keys").column("note").to_pylist() == [None, None]
    with client.transaction() as tx:
        tx.upsert("w_keys", pa.table({"k": [1], "a": ["x2"], "note": ["n"]}))
    with client.transaction() as tx:
        tx.upsert("w_keys", pa.table({"k": [1], "a": ["x3"]}, schema=KEYED), update=True)  # note kept
        tx.upsert("w_keys", pa.table({"k": [2], "a": ["y2"]}, schema=KEYED))  # overwrite mode: note null
    assert client.read("w_keys").to_pylist() == [{"k": 1, "a": "x3", "note": "n"}, {"k": 2, "a": "y2", "note": None}]


def test_cli_insert_csv_and_parquet_lacking_an_added_column(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    t = altered(client, "w_cli")
    pcsv.write_csv(old_rows(0, 2), tmp_path / "old.csv")
    pq.write_table(old_rows(10, 1), tmp_path / "old.parquet")
    for f in ("old.csv", "old.parquet"):
        r = invoke(cluster, "insert", t, tmp_path / f)
        assert r.exit_code == 0, r.output
    assert [(r["id"], r["note"]) for r in by_id(client, t)] == [(0, None), (1, None), (10, None)]


def test_cli_insert_of_a_file_without_rows_commits_nothing(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    t = altered(client, "w_empty")
    (tmp_path / "header.csv").write_text("id,p,v\n")
    before = client.snapshot()
    r = invoke(cluster, "insert", t, tmp_path / "header.csv")
    assert r.exit_code == 0, r.output
    assert "nothing inserted" in r.output and "nothing committed" in r.output and "CSN" not in r.output
    assert client.snapshot() == before
    r = invoke(cluster, "insert", t, tmp_path / "header.csv", "--json")
    assert '"csn": null' in r.output and client.snapshot() == before


def test_cli_insert_into_a_keys_table_writes_by_key(cluster: LocalCluster, client: Client, tmp_path: Path) -> None:
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), ("a", pa.string()), ("b", pa.int64())])
    client.create_table("w_cli_keys", schema, primary_key=["k"], conflict_policy="keys")
    pq.write_table(pa.table({"k": [1, 2], "a": ["x", "y"], "b": [10, 20]}, schema=schema), tmp_path / "all.parquet")
    r = invoke(cluster, "insert", "w_cli_keys", tmp_path / "all.parquet")
    assert r.exit_code == 0, r.output
    # overwrite by key: key 1's row replaced, the absent column null; key 2 untouched
    pcsv.write_csv(pa.table({"k": [1], "a": ["x2"]}), tmp_path / "put.csv")
    assert invoke(cluster, "insert", "w_cli_keys", tmp_path / "put.csv").exit_code == 0
    assert client.read("w_cli_keys").to_pylist() == [{"k": 1, "a": "x2", "b": None}, {"k": 2, "a": "y", "b": 20}]
    # --update: absent columns keep their values
    pcsv.write_csv(pa.table({"k": [2], "a": ["y2"]}), tmp_path / "upd.csv")
    r = invoke(cluster, "insert", "w_cli_keys", tmp_path / "upd.csv", "--update")
    assert r.exit_code == 0 and "updated by key 1 rows" in r.output, r.output
    assert client.read("w_cli_keys").to_pylist() == [{"k": 1, "a": "x2", "b": None}, {"k": 2, "a": "y2", "b": 20}]
    r = invoke(cluster, "insert", "w_cli_keys", tmp_path / "upd.csv", "--overwrite")
    assert r.exit_code == 2 and "keys table" in r.output, r.output
    pq.write_table(old_rows(0, 1), tmp_path / "rows.parquet")
    altered(client, "w_cli_plain")
    r = invoke(cluster, "insert", "w_cli_plain", tmp_path / "rows.parquet", "--update")
    assert r.exit_code == 2 and "not a keys table" in r.output, r.output
    assert client.read("w_cli_keys").to_pylist() == [{"k": 1, "a": "x2", "b": None}, {"k": 2, "a": "y2", "b": 20}]
    assert client.read("w_cli_plain").num_rows == 0
