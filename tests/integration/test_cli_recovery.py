"""Recovery as an operator expects it: ``mergetxn check --all``, ``backup`` and ``restore`` of a
table at a CSN (under a new name or in place, as one transaction; a damaged backup refused),
``history`` and ``changes``.

Commands run in-process through click's CliRunner against a real cluster (ZooKeeper and replica
processes); what a command did is checked through the Python client.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pytest
from click.testing import CliRunner, Result
from support.cli import one_error_line
from support.cluster import environ, make_cluster  # tests/ is on sys.path
from support.data import sorted_rows
from support.waiting import wait_until

from coordinator import LocalCluster
from coordinator.errors import CorruptMetadata, TableNotFound
from coordinator.model.catalog import TableDef
from mergetxn.cli import cli
from mergetxn.client import Client
from mergetxn.local.zkserver import ZooKeeperServer
from mergetxn.tools.recovery import FORMAT, inside, parse_manifest
from parts.io.format import write_part
from parts.io.storage import Storage

SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.string()), ("v", pa.string())])
KEYS = pa.schema([pa.field("k", pa.int64(), nullable=False), ("a", pa.string()), ("b", pa.int64())])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator[LocalCluster]:
    """Two replicas, no background merges or cleanup (nothing commits that a test did not)."""
    with make_cluster(
        # inline_rows 0: these tests follow the backups' part files (docs/architecture/small-writes.md)
        tmp_path_factory,
        zk_server,
        "clirecovery",
        replicas=2,
        settings={"inline_rows": 0, "merge_interval": 0, "gc_interval": 0},
    ) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    cl = cluster.client(0)
    yield cl
    cl.close()


def invoke(cluster: LocalCluster, *args: object, replica: int = 0) -> Result:
    runner = CliRunner(env={"MERGETXN_REPLICA": cluster.replica_addresses[replica]})
    return runner.invoke(cli, [str(a) for a in args], catch_exceptions=False)


def rows(first: int, n: int, day: str = "d1") -> pa.Table:
    ids = list(range(first, first + n))
    return pa.table({"id": ids, "day": [day] * n, "v": [f"v{i}" for i in ids]}, schema=SCHEMA)


def insert(client: Client, table: str, data: pa.Table) -> int:
    with client.transaction() as tx:
        tx.insert(table, data)
    return tx.csn


def busy_table(client: Client, name: str) -> int:
    """A partitioned table with inserts, a delete, an overwrite and an added column; its CSN."""
    client.create_table(name, SCHEMA, partition_by=["day"], retention_seconds=7200)
    insert(client, name, rows(0, 5, "d1"))
    insert(client, name, rows(5, 5, "d2"))
    with client.transaction() as tx:
        tx.delete(name, pc.field("id") == 3)
    client.alter_table(name, add_columns=[pa.field("note", pa.string())])
    with client.transaction() as tx:
        tx.overwrite(name, pa.table({"id": [20, 21], "day": ["d2", "d2"], "v": ["x", "y"], "note": ["n", None]}))
    return insert(client, name, pa.table({"id": [30], "day": ["d3"], "v": ["z"], "note": ["late"]}))


# -- check --all -------------------------------------------------------------------------------
def test_check_all_finds_a_deleted_part_file_in_one_of_several_tables(cluster: LocalCluster, client: Client) -> None:
    metas = {}
    for t in ("ck_a", "ck_b", "ck_c"):
        client.create_table(t, SCHEMA)
        metas[t] = write_part(client.storage, t, [], (), rows(0, 3), f"job-{t}")
        client.commit_parts(t, [metas[t]])
    ok = invoke(cluster, "check", "--all")
    assert ok.exit_code == 0, ok.output
    path = Path(cluster.storage_url) / metas["ck_b"].path
    saved = path.read_bytes()
    path.unlink()
    try:
        r = invoke(cluster, "check", "--all")
        line = one_error_line(r, 8, "ck_b", metas["ck_b"].path, "is missing")
        assert "ck_a" not in line and "ck_c" not in line
        assert "ck_a: 1 parts" in r.output and "ok" in r.output  # every table reported in one summary
        report = json.loads(invoke(cluster, "check", "--all", "--json").stdout)
        bad = {t["table"] for t in report["tables"] if t["problems"]}
        assert bad == {"ck_b"} and {"ck_a", "ck_c"} <= {t["table"] for t in report["tables"]}
        one_error_line(invoke(cluster, "check", "--all", "ck_a"), 2, "--all")
    finally:
        path.write_bytes(saved)
    assert invoke(cluster, "check", "--all").exit_code == 0


# -- backup and restore ------------------------------------------------------------------------
def test_backup_then_restore_under_a_new_name_equals_the_read_at_that_csn(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    csn = busy_table(client, "bk_src")
    later = rows(100, 4, "d1").append_column("note", pa.array(["n"] * 4))
    insert(client, "bk_src", later)  # after the CSN backed up: not in the backup
    r = invoke(cluster, "backup", "bk_src", tmp_path / "b1", "--snapshot", csn, "--json")
    assert r.exit_code == 0, r.output
    manifest = json.loads((tmp_path / "b1" / "manifest.json").read_text())
    assert manifest["csn"] == csn and manifest["table"] == "bk_src"
    assert all((tmp_path / "b1" / p["file"]).stat().st_size == p["size"] for p in manifest["parts"])
    with client.transaction() as tx:  # the original changes on after the backup
        tx.truncate("bk_src", partitions=["d1"])
    expected = client.read("bk_src", snapshot=csn)
    r = invoke(cluster, "restore", tmp_path / "b1", "--as", "bk_copy", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["table"] == "bk_copy" and out["created"] and out["from_csn"] == csn
    got = cluster.client(1).read("bk_copy", snapshot=out["csn"])
    assert got.schema.names == expected.schema.names
    assert sorted_rows(got) == sorted_rows(expected) and got.num_rows == 7
    d, src = client.describe_table("bk_copy"), client.describe_table("bk_src", snapshot=csn)
    for field in ("partition_by", "primary_key", "conflict_policy", "retention_seconds", "auto_merge"):
        assert d[field] == src[field], field
    assert d["schema"].equals(src["schema"])
    data_commits = [e for e in client.events("bk_copy").to_pylist() if e["event"] == "commit"]
    assert [e["csn"] for e in data_commits] == [out["csn"]]  # every row in one transaction


def test_restore_in_place_replaces_the_rows_in_one_transaction(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    client.create_table("ip_t", SCHEMA, partition_by=["day"])
    insert(client, "ip_t", rows(0, 4, "d1"))
    csn = insert(client, "ip_t", rows(4, 4, "d2"))
    assert invoke(cluster, "backup", "ip_t", tmp_path / "b").exit_code == 0
    insert(client, "ip_t", rows(50, 3, "d3"))
    with client.transaction() as tx:
        tx.delete("ip_t", pc.field("id") < 2)
    before = client.read("ip_t")
    r = invoke(cluster, "restore", tmp_path / "b", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["table"] == "ip_t" and not out["created"]
    # one CSN switches from the rows before to the backup's: no snapshot sees anything between
    assert sorted_rows(client.read("ip_t", snapshot=out["csn"] - 1)) == sorted_rows(before)
    assert sorted_rows(client.read("ip_t", snapshot=out["csn"])) == sorted_rows(client.read("ip_t", snapshot=csn))
    commits = [e for e in client.events("ip_t").to_pylist() if e["event"] == "commit" and e["csn"] > csn]
    assert len(commits) == 3 and commits[-1]["csn"] == out["csn"]


def test_a_tampered_or_truncated_backup_is_refused_and_changes_nothing(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    client.create_table("tp_t", SCHEMA)
    insert(client, "tp_t", rows(0, 5))
    insert(client, "tp_t", rows(5, 5))
    assert invoke(cluster, "backup", "tp_t", tmp_path / "b").exit_code == 0
    insert(client, "tp_t", rows(10, 1))
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    victim = tmp_path / "b" / manifest["parts"][0]["file"]
    good = victim.read_bytes()
    snap, before = client.snapshot(), client.read("tp_t")

    def refused(code: int, *words: str) -> None:
        for args in (("--as", "tp_new"), ()):  # a new table, and in place
            one_error_line(invoke(cluster, "restore", tmp_path / "b", *args), code, *words)
        assert client.snapshot() == snap  # nothing committed, no table created
        with pytest.raises(TableNotFound):
            client.describe_table("tp_new")
        assert sorted_rows(client.read("tp_t")) == sorted_rows(before)

    victim.write_bytes(good[:-1] + bytes([good[-1] ^ 0xFF]))  # same size, one byte changed
    refused(8, manifest["parts"][0]["file"], "checksum", "nothing restored")
    victim.write_bytes(good[: len(good) // 2])  # truncated
    refused(8, "bytes")
    victim.unlink()
    refused(8, "is missing")
    victim.write_bytes(good)
    (tmp_path / "b" / "manifest.json").write_text(json.dumps(manifest)[:-10])
    refused(8, "manifest", "not JSON")
    (tmp_path / "b" / "manifest.json").unlink()
    refused(2, "manifest.json is missing")
    one_error_line(invoke(cluster, "restore", tmp_path / "nowhere"), 2, "does not exist")
    assert not (tmp_path / "nowhere").exists()
    one_error_line(invoke(cluster, "backup", "tp_t", tmp_path / "b2", "--snapshot", 10**12), 3)
    inner = Path(cluster.storage_url) / "tp_t" / "backup"  # cleanup would take its files for orphans
    one_error_line(invoke(cluster, "backup", "tp_t", inner), 2, "inside the cluster's storage")
    assert not inner.exists()


def test_keys_table_backup_and_restore(cluster: LocalCluster, client: Client, tmp_path: Path) -> None:
    client.create_table(
        "kv_t", KEYS, primary_key=["k"], conflict_policy="keys", lock_groups={"g": ["b"]}, txn_max_rows=5000
    )
    with client.transaction() as tx:
        tx.insert("kv_t", pa.table({"k": pa.array([1, 2, 3], pa.int64()), "a": ["x", "y", "z"]}))
    with client.transaction() as tx:  # new versions of keys 1 and 2, and key 3 deleted
        tx.upsert("kv_t", pa.table({"k": pa.array([1], pa.int64()), "b": [7]}), update=True)
        tx.insert("kv_t", pa.table({"k": pa.array([2, 4], pa.int64()), "a": ["y2", "w"]}))
        tx.delete_keys("kv_t", pa.table({"k": pa.array([3], pa.int64())}))
    csn = client.snapshot()
    expected = client.read("kv_t", snapshot=csn)
    assert expected.column("k").to_pylist() == [1, 2, 4]
    assert invoke(cluster, "backup", "kv_t", tmp_path / "b", "--snapshot", csn).exit_code == 0
    with client.transaction() as tx:
        tx.insert("kv_t", pa.table({"k": pa.array([1, 9], pa.int64()), "a": ["later", "later"]}))
    r = invoke(cluster, "restore", tmp_path / "b", "--as", "kv_copy", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["rows"] == 3  # rows restored, one per key (not versions)
    copy = client.read("kv_copy")
    assert copy.to_pylist() == expected.to_pylist()
    d = client.describe_table("kv_copy")
    assert d["conflict_policy"] == "keys" and d["primary_key"] == ("k",) and d["lock_groups"] == {"g": ["b"]}
    assert d["txn_max_rows"] == 5000
    r = invoke(cluster, "restore", tmp_path / "b", "--json")  # in place: key 9 goes, key 1 as it was
    assert r.exit_code == 0, r.output
    assert client.read("kv_t").to_pylist() == expected.to_pylist()


def test_backup_to_s3_and_restore_from_it(cluster: LocalCluster, client: Client) -> None:
    boto3 = pytest.importorskip("boto3")
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        env = {
            "AWS_ACCESS_KEY_ID": "AKIARECOVERYTEST",
            "AWS_SECRET_ACCESS_KEY": "recovery-secret",
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        with environ(env):
            boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"]).create_bucket(Bucket="backups")
            client.create_table("s3_t", SCHEMA, partition_by=["day"])
            csn = insert(client, "s3_t", rows(0, 6, "d1"))
            insert(client, "s3_t", rows(6, 2, "d2"))
            assert invoke(cluster, "backup", "s3_t", "s3://backups/s3_t/1", "--snapshot", csn).exit_code == 0
            r = invoke(cluster, "restore", "s3://backups/s3_t/1", "--as", "s3_copy")
            assert r.exit_code == 0, r.output
        assert sorted_rows(client.read("s3_copy")) == sorted_rows(client.read("s3_t", snapshot=csn))
    finally:
        server.stop()


# -- history and changes -----------------------------------------------------------------------
def test_history_lists_commits_with_kinds_rows_and_aborts(cluster: LocalCluster, client: Client) -> None:
    created = client.create_table("hs_t", SCHEMA, auto_merge=False)
    a = insert(client, "hs_t", rows(0, 3))
    b = insert(client, "hs_t", rows(3, 2))
    with client.transaction() as tx:
        tx.delete("hs_t", pc.field("id") == 0)
    c = tx.csn
    with client.transaction() as tx:
        tx.overwrite("hs_t", rows(10, 4))
    d = tx.csn
    tx = client.begin()
    tx.insert("hs_t", rows(99, 1))
    tx.rollback()
    e = client.compact("hs_t", kind="major")
    r = invoke(cluster, "history", "hs_t", "--format", "json")
    assert r.exit_code == 0, r.output
    entries = [json.loads(line) for line in r.stdout.splitlines()]
    by_csn = {x["csn"]: x for x in entries if x["csn"] is not None}
    assert by_csn[created]["kind"] == "create"
    assert (by_csn[a]["kind"], by_csn[a]["rows_added"], by_csn[a]["rows_removed"]) == ("insert", 3, 0)
    assert (by_csn[b]["kind"], by_csn[b]["rows_added"]) == ("insert", 2)
    assert by_csn[c]["kind"] == "mutate" and by_csn[c]["rows_removed"] == 3 and by_csn[c]["rows_added"] == 2
    assert by_csn[d]["kind"] == "overwrite" and by_csn[d]["rows_added"] == 4 and by_csn[d]["rows_removed"] == 4
    assert by_csn[e]["kind"] == "compaction (major)"
    assert all(x["tid"] and x["host"] for x in entries if x["kind"] != "create")
    aborts = [x for x in entries if x["kind"] == "abort"]
    assert [x["tid"] for x in aborts] == [tx.id] and aborts[0]["reason"]
    assert [x["csn"] for x in entries if x["csn"] is not None] == sorted(by_csn)  # oldest first
    last = [
        json.loads(line)
        for line in invoke(cluster, "history", "hs_t", "--format", "json", "--limit", 2).stdout.splitlines()
    ]
    assert [x["csn"] for x in last] == [None, e]  # the abort, then the compaction
    table = invoke(cluster, "history", "hs_t")
    assert table.exit_code == 0 and "overwrite" in table.output and "entries of hs_t" in table.output
    one_error_line(invoke(cluster, "history", "nope"), 3, "nope")
    assert invoke(cluster, "history", "hs_t", "--limit", 0).exit_code == 2  # click: a usage error


def test_changes_cli_equals_client_changes(cluster: LocalCluster, client: Client) -> None:
    client.create_table("ch_t", SCHEMA)
    a = insert(client, "ch_t", rows(0, 3))
    insert(client, "ch_t", rows(3, 2))
    with client.transaction() as tx:
        tx.delete("ch_t", pc.field("id") == 1)
    c = tx.csn
    insert(client, "ch_t", rows(7, 1))
    expected = client.changes("ch_t", a, c)
    r = invoke(cluster, "changes", "ch_t", "--from", a, "--to", c, "--format", "json")
    assert r.exit_code == 0, r.output
    got = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert got == expected.to_pylist() and {x["_change"] for x in got} == {"insert", "delete"}
    r = invoke(cluster, "changes", "ch_t", "--from", a, "--to", c, "--format", "csv")
    csv_rows = pcsv.read_csv(io.BytesIO(r.stdout_bytes.split(b"wrote")[0])).to_pylist()
    assert csv_rows == expected.to_pylist()
    tail = invoke(cluster, "changes", "ch_t", "--from", c, "--format", "json")
    assert [json.loads(x) for x in tail.stdout.splitlines() if x.startswith("{")] == client.changes(
        "ch_t", c
    ).to_pylist()
    shown = invoke(cluster, "changes", "ch_t", "--from", a)
    assert shown.exit_code == 0 and "changed rows of ch_t" in shown.output
    one_error_line(invoke(cluster, "changes", "ch_t", "--from", c, "--to", a), 2, "before start")


def test_a_backup_holds_its_snapshot_while_it_copies(cluster: LocalCluster, client: Client) -> None:
    """What backup copies under: ``Client.pin`` leases the snapshot, so cleanup keeps files that a
    later commit removed (retention 0: nothing else keeps them) until the block ends."""
    client.create_table("pin_t", SCHEMA, retention_seconds=0, auto_merge=False)
    insert(client, "pin_t", rows(0, 3))
    with client.pin("pin_t") as (tdef, snap, metas, csns), cluster.client(1) as other:
        assert tdef.name == "pin_t" and [csns[m.name] for m in metas] == [snap]
        with client.transaction() as tx:
            tx.overwrite("pin_t", rows(10, 2))
        other.wait_for(tx.csn)

        def replicas_past_it() -> bool:  # only the pin keeps the old snapshot in use now
            in_use = client.gc(grace_seconds=0)["snapshots_in_use"]
            return all(u["snapshot"] >= tx.csn for u in in_use if u["holder"] == "replica snapshot")

        wait_until(replicas_past_it, what="every replica's snapshot past the overwrite")
        assert all(client.storage.exists(m.path) for m in metas)  # the copy can still read them

    def collected() -> bool:
        client.gc(grace_seconds=0)
        return not any(client.storage.exists(m.path) for m in metas)

    wait_until(collected, what="the unpinned files collected")


def test_restore_in_place_fills_a_column_added_since_and_refuses_another_kind_of_table(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    client.create_table("ia_t", SCHEMA)
    csn = insert(client, "ia_t", rows(0, 3))
    assert invoke(cluster, "backup", "ia_t", tmp_path / "b").exit_code == 0
    client.alter_table("ia_t", add_columns=[pa.field("note", pa.string())])
    r = invoke(cluster, "restore", tmp_path / "b")
    assert r.exit_code == 0, r.output
    got = client.read("ia_t")
    assert got.column("note").null_count == 3
    assert sorted_rows(got.drop_columns(["note"])) == sorted_rows(client.read("ia_t", snapshot=csn))
    client.drop_table("ia_t")
    client.create_table("ia_t", KEYS, primary_key=["k"], conflict_policy="keys")
    snap = client.snapshot()
    one_error_line(invoke(cluster, "restore", tmp_path / "b"), 2, "not of the backup's kind", "--as")
    assert client.snapshot() == snap
    client.drop_table("ia_t")  # made again with its columns of other types
    client.create_table("ia_t", pa.schema([("id", pa.string()), ("day", pa.string()), ("v", pa.string())]))
    snap = client.snapshot()
    one_error_line(invoke(cluster, "restore", tmp_path / "b"), 2, "has other types than the backup", "--as")
    assert client.snapshot() == snap


# -- pure ----------------------------------------------------------------------------------------
def test_a_directory_inside_storage_is_told_apart() -> None:
    assert inside("/data/st", "/data/st/events/b") and inside("/data/st/", "/data/st")
    assert not inside("/data/st", "/data/st2/b") and not inside("/data/st", "s3://st/b")
    assert inside("s3://bucket/wh", "s3a://bucket/wh/bk") and not inside("s3://bucket/wh", "s3://bucket/wh2")


def test_a_manifest_that_disagrees_with_itself_is_corrupt_metadata(tmp_path: Path) -> None:
    meta = write_part(Storage(str(tmp_path)), "m_t", [], (), rows(0, 2), "job-m")
    tdef = TableDef.new("m_t", SCHEMA, (), (), "parts", True, None, "full", None, None, None)
    entry = {
        "file": f"parts/{meta.name}.parquet",
        "size": meta.size,
        "checksum": meta.checksum,
        "csn": 3,
        "meta": meta.to_dict(),
    }
    good = {"format": FORMAT, "table": "m_t", "csn": 3, "definition": tdef.to_dict(), "parts": [entry]}
    assert parse_manifest(json.dumps(good).encode(), "d").parts[0][0].path == entry["file"]
    for bad in (
        {**good, "format": "x"},
        {**good, "csn": "3"},
        {**good, "table": "other"},
        {**good, "parts": [{**entry, "file": "../../etc/passwd"}]},
        {**good, "parts": [{**entry, "size": 1}]},
        {**good, "parts": [{**entry, "meta": {**entry["meta"], "name": "../x"}}]},
        {**good, "definition": {}},
    ):
        with pytest.raises(CorruptMetadata):
            parse_manifest(json.dumps(bad).encode(), "d")
    with pytest.raises(CorruptMetadata):
        parse_manifest(b"[" * 100_000, "d")
