"""Bad input and corrupt data: every case gets a clear error of the documented type, naming the
offending thing, and changes nothing (same rows, same parts, same files, no new commit)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support.cluster import make_cluster  # tests/ is on sys.path
from support.data import ID_V, id_rows
from support.waiting import poll
from support.zk import kazoo, repair_log_node

import coordinator
from coordinator.core.versions import csn_of, split_csn
from coordinator.errors import (
    CorruptMetadata,
    CorruptPart,
    InvalidInput,
    MergetxnError,
    SnapshotUnavailable,
    TableNotFound,
    TransactionAborted,
)
from mergetxn.client import Client
from mergetxn.local.zkserver import ZooKeeperServer

pytestmark = pytest.mark.zk

SCHEMA = ID_V
PSCHEMA = pa.schema([("p", pa.int64()), ("id", pa.int64())])


@pytest.fixture(scope="module")
def cluster(zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    with make_cluster(tmp_path_factory, zk_server, "badinput", replicas=2) as c:
        yield c


@pytest.fixture(scope="module")
def cl(cluster: coordinator.LocalCluster) -> Client:
    return cluster.client(0)


def files_under(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()} if root.exists() else {}


@dataclass
class Fingerprint:
    """Everything a bad input must leave as it was."""

    snapshot: int
    tables: list[str]
    rows: dict[str, list[dict]]
    parts: dict[str, list[dict]]
    files: dict[str, int]


def fingerprint(cluster: coordinator.LocalCluster, client: Client, tables: list[str]) -> Fingerprint:
    data = {
        t: sorted(client.read(t).to_pylist(), key=lambda r: json.dumps(r, sort_keys=True, default=str)) for t in tables
    }
    parts = {t: client.parts(t).to_pylist() for t in tables}
    files = {k: v for k, v in files_under(Path(cluster.storage_url)).items() if not k.startswith("_")}
    return Fingerprint(client.snapshot(), sorted(client.tables()), data, parts, files)


@pytest.fixture(scope="module")
def base(cl: Client) -> str:
    """A table with committed rows that every test tries to damage."""
    cl.create_table("base", SCHEMA, auto_merge=False)
    with cl.transaction() as tx:
        tx.insert("base", id_rows(5))
    return "base"


def unchanged(
    cluster: coordinator.LocalCluster,
    client: Client,
    tables: list[str],
    action: Callable[[], object],
    error: type[MergetxnError],
    *names: str,
) -> MergetxnError:
    """Run ``action``; it must raise ``error`` whose message names every one of ``names``, and
    leave the cluster exactly as it was."""
    before = fingerprint(cluster, client, tables)
    with pytest.raises(error) as info:
        action()
    for name in names:
        assert name in str(info.value), f"{name!r} not named in: {info.value}"
    assert fingerprint(cluster, client, tables) == before
    return info.value


# ---------------------------------------------------------------------------------------------
# Names


@pytest.mark.parametrize("bad", ["../x", "a/b", "..", "x\\y", "a:b", ""])
def test_table_name_with_path_characters(cluster: coordinator.LocalCluster, cl: Client, base: str, bad: str) -> None:
    unchanged(cluster, cl, [base], lambda: cl.create_table(bad, SCHEMA), InvalidInput, repr(bad))
    assert not (Path(cluster.storage_url) / "x").exists()
    # The same name is refused, not looked up as a path, everywhere a table is named.
    for action in (lambda: cl.read(bad), lambda: cl.parts(bad), lambda: cl.compact(bad)):
        unchanged(cluster, cl, [base], action, InvalidInput, repr(bad))
    tx = cl.begin()
    try:
        unchanged(cluster, cl, [base], lambda: tx.insert(bad, id_rows(1)), InvalidInput, repr(bad))
    finally:
        tx.rollback()


@pytest.mark.parametrize("bad", ["a/b", "../c", "x y"])
def test_column_name_with_path_characters(cluster: coordinator.LocalCluster, cl: Client, base: str, bad: str) -> None:
    schema = pa.schema([("id", pa.int64()), (bad, pa.string())])
    unchanged(cluster, cl, [base], lambda: cl.create_table("colbad", schema), InvalidInput, repr(bad))
    assert "colbad" not in cl.tables()


def test_create_table_bad_arguments(cluster: coordinator.LocalCluster, cl: Client, base: str) -> None:
    unchanged(
        cluster,
        cl,
        [base],
        lambda: cl.create_table("pol", SCHEMA, conflict_policy="yolo"),
        InvalidInput,
        "'yolo'",
        "conflict_policy",
    )
    unchanged(cluster, cl, [base], lambda: cl.create_table("pol", SCHEMA, partition_by=["nope"]), InvalidInput, "nope")
    unchanged(cluster, cl, [base], lambda: cl.create_table(base, SCHEMA), InvalidInput, repr(base), "exists")
    assert "pol" not in cl.tables()


# ---------------------------------------------------------------------------------------------
# Schemas


def test_insert_schema_mismatch(cluster: coordinator.LocalCluster, cl: Client, base: str) -> None:
    extra = pa.table({"id": [1], "v": ["a"], "surprise": [1.5]})
    mistyped = pa.table({"id": ["not-a-number"], "v": ["a"]})
    cases = [(extra, ["unexpected", "'surprise'"]), (mistyped, ["'id'", "string", "int64"])]
    # A missing column is refused when it is not nullable (a nullable one is filled with null:
    # test_writers.py); both statements, and the transaction stays usable.
    cl.create_table(
        "strict_nn", pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())]), auto_merge=False
    )
    tx = cl.begin()
    try:
        for statement in (tx.insert, tx.overwrite):
            unchanged(
                cluster,
                cl,
                [base, "strict_nn"],
                lambda s=statement: s("strict_nn", pa.table({"v": ["a"]})),
                InvalidInput,
                "'strict_nn'",
                "missing",
                "'id'",
            )
        assert tx.read("strict_nn").num_rows == 0
    finally:
        tx.rollback()
    for data, names in cases:
        tx = cl.begin()
        try:
            unchanged(cluster, cl, [base], lambda d=data: tx.insert(base, d), InvalidInput, repr(base), *names)
            unchanged(cluster, cl, [base], lambda d=data: tx.overwrite(base, d), InvalidInput, repr(base), *names)
            # The transaction is still usable and commits nothing it was refused.
            assert sorted(tx.read(base).column("id").to_pylist()) == list(range(5))
        finally:
            tx.rollback()
    tx = cl.begin()
    try:
        unchanged(cluster, cl, [base], lambda: tx.insert(base, {"id": [1]}), InvalidInput, "pyarrow.Table")
    finally:
        tx.rollback()


# ---------------------------------------------------------------------------------------------
# Unknown tables and columns


def test_unknown_table(cluster: coordinator.LocalCluster, cl: Client, base: str) -> None:
    unchanged(cluster, cl, [base], lambda: cl.read("nosuch"), TableNotFound, "'nosuch'")
    unchanged(cluster, cl, [base], lambda: cl.parts("nosuch"), TableNotFound, "'nosuch'")
    tx = cl.begin()
    try:
        unchanged(cluster, cl, [base], lambda: tx.insert("nosuch", id_rows(1)), TableNotFound, "'nosuch'")
        unchanged(cluster, cl, [base], lambda: tx.read("nosuch"), TableNotFound, "'nosuch'")
        unchanged(cluster, cl, [base], lambda: tx.delete("nosuch", pc.field("id") == 1), TableNotFound, "'nosuch'")
    finally:
        tx.rollback()
    # A table read at a snapshot before it existed is unknown there too.
    created = cl.create_table("later", SCHEMA, auto_merge=False)
    unchanged(cluster, cl, [base], lambda: cl.read("later", snapshot=created - 1), TableNotFound, "'later'")


def test_expression_on_missing_column(cluster: coordinator.LocalCluster, cl: Client, base: str) -> None:
    ghost = pc.field("ghost") > 1
    tx = cl.begin()
    try:
        unchanged(cluster, cl, [base], lambda: tx.delete(base, ghost), InvalidInput, "ghost")
        unchanged(cluster, cl, [base], lambda: tx.update(base, ghost, {"v": "x"}), InvalidInput, "ghost")
        unchanged(
            cluster, cl, [base], lambda: tx.update(base, pc.field("id") == 1, {"ghost": 1}), InvalidInput, "ghost"
        )
        unchanged(
            cluster,
            cl,
            [base],
            lambda: tx.update(base, pc.field("id") == 1, {"v": pc.field("ghost")}),
            InvalidInput,
            "ghost",
        )
        unchanged(cluster, cl, [base], lambda: tx.read(base, where=ghost), InvalidInput, "ghost")
        unchanged(cluster, cl, [base], lambda: tx.read(base, columns=["id", "ghost"]), InvalidInput, "ghost")
        unchanged(cluster, cl, [base], lambda: tx.delete(base, "id > 1"), InvalidInput, "Expression")
        tx.commit()  # nothing was staged
    finally:
        if tx.csn is None:
            tx.rollback()
    unchanged(cluster, cl, [base], lambda: cl.read(base, where=ghost), InvalidInput, "ghost")


# ---------------------------------------------------------------------------------------------
# Snapshots and time


def test_snapshot_newer_than_the_log(cluster: coordinator.LocalCluster, cl: Client, base: str) -> None:
    latest = cl.snapshot()
    epoch, seq = split_csn(latest)
    for future in (latest + 1000, csn_of(epoch + 5, 0)):
        err = unchanged(
            cluster, cl, [base], lambda f=future: cl.read(base, snapshot=f), SnapshotUnavailable, str(future)
        )
        assert "newer" in str(err)
        unchanged(cluster, cl, [base], lambda f=future: cl.wait_for(f), SnapshotUnavailable, str(future))
    unchanged(cluster, cl, [base], lambda: cl.read(base, snapshot=-1), InvalidInput, "-1")
    unchanged(cluster, cl, [base], lambda: cl.read(base, snapshot="5"), InvalidInput, "snapshot")
    unchanged(
        cluster,
        cl,
        [base],
        lambda: cl.read(base, snapshot=latest, as_of=dt.datetime.now(dt.UTC)),
        InvalidInput,
        "snapshot",
        "as_of",
    )


def test_as_of_must_be_timezone_aware(cluster: coordinator.LocalCluster, cl: Client, base: str) -> None:
    naive = dt.datetime.now()
    unchanged(cluster, cl, [base], lambda: cl.read(base, as_of=naive), InvalidInput, "as_of", "timezone")
    unchanged(cluster, cl, [base], lambda: cl.read(base, as_of="2024-01-01"), InvalidInput, "as_of")


def test_partitions_on_unpartitioned_table(cluster: coordinator.LocalCluster, cl: Client, base: str) -> None:
    tx = cl.begin()
    try:
        unchanged(
            cluster,
            cl,
            [base],
            lambda: tx.overwrite(base, id_rows(1), partitions=[1]),
            InvalidInput,
            repr(base),
            "not partitioned",
        )
        unchanged(
            cluster, cl, [base], lambda: tx.truncate(base, partitions=[1]), InvalidInput, repr(base), "not partitioned"
        )
        unchanged(
            cluster, cl, [base], lambda: tx.compact(base, partitions=[1]), InvalidInput, repr(base), "not partitioned"
        )
    finally:
        tx.rollback()
    unchanged(
        cluster, cl, [base], lambda: cl.compact(base, partitions=[1]), InvalidInput, repr(base), "not partitioned"
    )
    # And on a partitioned table: the wrong shape of partition value, or a bare string.
    cl.create_table("parted", PSCHEMA, partition_by=["p"], auto_merge=False)
    tx = cl.begin()
    try:
        unchanged(
            cluster, cl, [base, "parted"], lambda: tx.truncate("parted", partitions=[(1, 2)]), InvalidInput, "(1, 2)"
        )
        unchanged(cluster, cl, [base, "parted"], lambda: tx.truncate("parted", partitions="1"), InvalidInput, "'1'")
        data = pa.table({"p": [1, 2], "id": [1, 2]}, schema=PSCHEMA)
        unchanged(
            cluster, cl, [base, "parted"], lambda: tx.overwrite("parted", data, partitions=[1]), InvalidInput, "outside"
        )
    finally:
        tx.rollback()


# ---------------------------------------------------------------------------------------------
# Corrupt part files


def test_corrupt_part(cluster: coordinator.LocalCluster, cl: Client, base: str) -> None:
    cl.create_table("corrupt", SCHEMA, auto_merge=False, inline_rows=0)  # corrupts the part's file: no inlining
    with cl.transaction() as tx:
        tx.insert("corrupt", id_rows(50))
    (rel,) = cl.parts("corrupt").column("path").to_pylist()
    path = Path(cluster.storage_url) / rel
    raw = bytearray(path.read_bytes())
    mid = len(raw) // 2
    raw[mid : mid + 4] = bytes(b ^ 0xFF for b in raw[mid : mid + 4])  # same size, different bytes
    path.write_bytes(bytes(raw))
    for client in (cl, cluster.client(1)):
        unchanged(cluster, client, [base], lambda c=client: c.read("corrupt"), CorruptPart, rel)
    tx = cl.begin()
    try:
        unchanged(cluster, cl, [base], lambda: tx.read("corrupt"), CorruptPart, rel)
        unchanged(cluster, cl, [base], lambda: tx.delete("corrupt", pc.field("id") == 3), CorruptPart, rel)
    finally:
        tx.rollback()
    # A truncated file is caught as well.
    path.write_bytes(bytes(raw[: len(raw) - 10]))
    unchanged(cluster, cl, [base], lambda: cl.read("corrupt"), CorruptPart, rel)
    # Other tables are unaffected.
    assert cl.read(base).num_rows == 5


# ---------------------------------------------------------------------------------------------
# Transaction limits (a cluster of their own: its limits would disturb the other tests)


@pytest.fixture
def limited(zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    with make_cluster(tmp_path_factory, zk_server, "limits", replicas=1, txn_max_seconds=1, txn_max_rows=100) as c:
        yield c


def test_transaction_limits(limited: coordinator.LocalCluster) -> None:
    cl = limited.client(0)
    cl.create_table("lim", SCHEMA, auto_merge=False)
    storage = Path(limited.storage_url)

    # Rows: 60 fit, 60 more exceed 100; the whole transaction is aborted and its files removed.
    tx = cl.begin()
    tx.insert("lim", id_rows(60))
    before = fingerprint(limited, cl, ["lim"])
    with pytest.raises(TransactionAborted) as info:
        tx.insert("lim", id_rows(60, start=60))
    assert "row limit" in str(info.value) and "100" in str(info.value) and tx.id in str(info.value)
    with pytest.raises(TransactionAborted):
        tx.commit()
    assert cl.read("lim").num_rows == 0
    assert cl.commit_status(tx.tid).status == "aborted"
    assert not [p for p in files_under(storage / "lim")], "aborted transaction left part files"
    assert cl.snapshot() == before.snapshot

    # Time: a transaction older than 1 s is aborted by the replica, even while idle.
    tx = cl.begin()
    tx.insert("lim", id_rows(3))
    assert poll(lambda: cl.commit_status(tx.tid).status == "aborted", timeout=20)
    status = cl.commit_status(tx.tid)
    assert "time limit" in status.reason
    with pytest.raises(TransactionAborted, match="time limit"):
        tx.commit()
    assert cl.read("lim").num_rows == 0
    assert not files_under(storage / "lim")
    assert tx.id not in {t["id"] for t in cl.transactions()}

    # Within the limits all is well.
    with cl.transaction() as ok:
        ok.insert("lim", id_rows(100))
    assert cl.read("lim").num_rows == 100


# ---------------------------------------------------------------------------------------------
# ZooKeeper nodes that do not parse (a cluster of its own: the log stays poisoned)


@pytest.fixture
def poisoned(
    zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[coordinator.LocalCluster, str]]:
    with make_cluster(tmp_path_factory, zk_server, "poisoned", replicas=2) as c:
        yield c, c.zk_address


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\xffnot json{",
        b'{"v": 1, "txns": [{"tid": "T0-0-r9", "changes": [{"table": "g", "pkey": "[]", "kinds": ["bogus"]}]}]}',
        b'{"v": 1, "ddl": [{"create_table": {"name": "evil", "schema": "!!"}}]}',
        b'{"v": 99}',
    ],
    ids=["bytes", "bad-change", "bad-ddl", "bad-version"],
)
def test_garbage_log_entry(poisoned: tuple[coordinator.LocalCluster, str], garbage: bytes) -> None:
    """A log entry that does not parse: replicas report CorruptMetadata naming the znode on every
    read that needs it, apply nothing of it, keep serving what came before, survive a restart,
    and carry on once an operator repairs the node."""
    cluster, address = poisoned
    c0, c1 = cluster.client(0), cluster.client(1)
    c0.create_table("g", SCHEMA, auto_merge=False)
    with c0.transaction() as tx:
        tx.insert("g", id_rows(4))
    good = tx.csn
    c1.wait_for(good)

    with kazoo(address) as zk:
        epochs = sorted(zk.get_children("/mergetxn/log"))
        node = zk.create(f"/mergetxn/log/{epochs[-1]}/c-", garbage, sequence=True)
    epoch, seq = int(epochs[-1][2:]), int(node.rsplit("-", 1)[1])
    bad = csn_of(epoch, seq)
    assert bad > good

    for client in (c0, c1):
        with pytest.raises(CorruptMetadata) as info:
            client.read("g", snapshot=bad)
        assert node in str(info.value), info.value
        with pytest.raises(CorruptMetadata):
            client.wait_for(bad)
        # What came before is still served; nothing of the garbage was applied.
        assert client.snapshot() == good
        assert sorted(client.read("g").column("id").to_pylist()) == [0, 1, 2, 3]
        assert "evil" not in client.tables()
    # A commit cannot go through a log that cannot be applied: it fails clearly.
    with pytest.raises(CorruptMetadata):
        with c0.transaction() as tx:
            tx.insert("g", id_rows(1, start=100))
    assert c0.commit_status(tx.tid).status == "aborted"
    assert sorted(c0.read("g").column("id").to_pylist()) == [0, 1, 2, 3]

    # A restart does not crash on it either (neither from ZooKeeper nor from its own WAL).
    cluster.stop_replica(1)
    cluster.start_replica(1)
    c1 = cluster.client(1)
    assert c1.snapshot() == good
    with pytest.raises(CorruptMetadata) as info:
        c1.read("g", snapshot=bad)
    assert node in str(info.value)
    assert cluster.replica_pid(0) is not None and cluster.replica_pid(1) is not None

    # An operator replaces the node with an empty entry: every replica carries on.
    repair_log_node(address, node)
    for client in (c0, c1):
        client.wait_for(bad)
        assert client.read("g", snapshot=bad).num_rows == 4
    with c1.transaction() as tx:
        tx.insert("g", id_rows(1, start=100))
    assert tx.csn > bad
    assert sorted(c0.read("g", snapshot=tx.csn).column("id").to_pylist()) == [0, 1, 2, 3, 100]


def test_create_table_behind_garbage_entry_fails(poisoned: tuple[coordinator.LocalCluster, str]) -> None:
    """A table created while the log holds an entry that does not parse is not applied anywhere:
    the creation reports CorruptMetadata naming the bad znode (client and command line, exit code
    8: corrupt data), never "created"; looking it up says the same, and it exists once an operator repairs the node."""
    from click.testing import CliRunner

    from mergetxn.cli import cli

    cluster, address = poisoned
    c0 = cluster.client(0)
    c0.create_table("before", SCHEMA, auto_merge=False)
    with kazoo(address) as zk:
        epochs = sorted(zk.get_children("/mergetxn/log"))
        node = zk.create(f"/mergetxn/log/{epochs[-1]}/c-", b"\x00junk", sequence=True)

    with pytest.raises(CorruptMetadata) as info:
        c0.create_table("behind", SCHEMA, auto_merge=False)
    assert node in str(info.value), info.value
    runner = CliRunner(env={"MERGETXN_REPLICA": cluster.replica_addresses[1]})
    result = runner.invoke(
        cli, ["table", "create", "behind_cli", "--schema", "id:int64,v:string"], catch_exceptions=False
    )
    assert result.exit_code == 8, result.output
    assert "created table" not in result.output
    assert node in result.output, result.output
    for i in (0, 1):
        assert not {"behind", "behind_cli"} & set(cluster.client(i).tables())
        with pytest.raises(CorruptMetadata, match=node):  # not "unknown table": it is in the log
            cluster.client(i).table("behind")

    # The creations are in the log: once an operator replaces the bad node with an empty entry,
    # both tables exist on every replica.
    repair_log_node(address, node)
    for i in (0, 1):
        client = cluster.client(i)
        for name in ("behind", "behind_cli"):
            assert client.table(name).schema == SCHEMA  # waited for, as a table created elsewhere


def test_garbage_table_definition_znode(poisoned: tuple[coordinator.LocalCluster, str]) -> None:
    """The definition a replica uses comes from the log's DDL entry; garbage written into the
    ``tables/<name>`` znode afterwards is never parsed into a schema nor applied, and the table
    keeps working (its name stays taken)."""
    cluster, address = poisoned
    c0 = cluster.client(0)
    c0.create_table("tdef", SCHEMA, auto_merge=False)
    with kazoo(address) as zk:
        zk.set("/mergetxn/tables/tdef", b"\x00{garbage")
    for i in (0, 1):
        fresh = cluster.client(i)  # no cached definition
        assert fresh.table("tdef").schema == SCHEMA
        with fresh.transaction() as tx:
            tx.insert("tdef", id_rows(2, start=10 * i))
    cluster.stop_replica(1)
    cluster.start_replica(1)
    c1 = cluster.client(1)
    c1.wait_for(tx.csn)
    assert sorted(c1.read("tdef").column("id").to_pylist()) == [0, 1, 10, 11]
    with pytest.raises(InvalidInput, match="already exists"):
        c1.create_table("tdef", SCHEMA)
