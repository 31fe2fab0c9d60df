"""Errors that say what happened: each case below, and a walk of the
public API with wrong types and values for every argument, each call refused with a
``MergetxnError`` (never a bare TypeError, ValueError, KeyError or AttributeError) and nothing
changed. Real replicas and ZooKeeper; the CLI through CliRunner."""

from __future__ import annotations

import inspect
import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from click.testing import CliRunner
from support.cluster import make_cluster  # tests/ is on sys.path
from support.data import ID_V, id_rows

import coordinator
from coordinator import LocalCluster
from coordinator.errors import InvalidInput, MergetxnError, TableNotFound, TransactionNotFound
from mergetxn.cli import cli
from mergetxn.client import Client, Transaction
from mergetxn.local.zkserver import ZooKeeperServer

PARTED = pa.schema([pa.field("id", pa.int64(), nullable=False), ("p", pa.string())])
KEYED = pa.schema([pa.field("k", pa.int64(), nullable=False), ("a", pa.string())])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator[LocalCluster]:
    with make_cluster(
        tmp_path_factory, zk_server, "truths", replicas=1, settings={"merge_interval": 0, "gc_interval": 0}
    ) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    cl = cluster.client(0)
    yield cl
    cl.close()


# -- the cases the issue names ------------------------------------------------------------------


def test_commit_from_two_threads_gives_both_the_same_csn(client: Client) -> None:
    """The loser of a race to commit one transaction is told the truth: the CSN it committed at
    (before: TransactionAborted for a transaction that had committed)."""
    client.create_table("two_threads", ID_V, auto_merge=False)
    for round_ in range(5):
        tx = client.begin()
        tx.insert("two_threads", id_rows(1, start=round_))
        barrier = threading.Barrier(2)
        answers: list[Any] = [None, None]

        def commit(i: int, tx: Transaction = tx) -> None:
            barrier.wait()
            try:
                answers[i] = tx.commit()
            except Exception as exc:  # noqa: BLE001 - the assertion names it
                answers[i] = exc

        threads = [threading.Thread(target=commit, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert answers[0] == answers[1] == tx.csn and isinstance(tx.csn, int), answers
        assert client.commit_status(tx.id).status == "committed"
    assert client.read("two_threads").num_rows == 5


def test_a_second_commit_after_a_failed_one_raises_the_same_error(client: Client) -> None:
    client.create_table("fail_twice", ID_V, auto_merge=False)
    tx = client.begin()
    tx.insert("fail_twice", id_rows(1))
    client.kill(tx.id)
    with pytest.raises(MergetxnError) as first:
        tx.commit()
    with pytest.raises(type(first.value)) as second:
        tx.commit()
    assert second.value.message == first.value.message


def test_txn_kill_of_an_id_not_running_is_not_found(cluster: LocalCluster, client: Client) -> None:
    runner = CliRunner(env={"MERGETXN_REPLICA": cluster.replica_addresses[0]})
    ghost = "T1-4294967999-r0"
    with pytest.raises(TransactionNotFound, match="no transaction"):
        client.kill(ghost)
    r = runner.invoke(cli, ["txn", "kill", ghost])
    assert r.exit_code == 3 and r.output.startswith("error: ") and "no transaction" in r.output, r.output
    tx = client.begin()
    tx.rollback()  # ended: the kill says so, and succeeds (nothing to abort)
    r = runner.invoke(cli, ["txn", "kill", tx.id])
    assert r.exit_code == 0 and "aborted" in r.output, r.output


def test_a_malformed_part_descriptor_from_a_caller_is_invalid_input(client: Client) -> None:
    client.create_table("bad_meta", ID_V, auto_merge=False)
    before = client.snapshot()
    with pytest.raises(InvalidInput, match="PartMeta"):
        client.commit_parts("bad_meta", ["notapart"])
    with pytest.raises(InvalidInput, match="PartMeta"):
        client.commit_parts("bad_meta", "notapart")
    tx = client.begin()
    with pytest.raises(InvalidInput, match="PartMeta"):
        tx.add_parts("bad_meta", [{"name": "x"}])
    # straight over the wire, as another client library would send it: not CorruptMetadata (exit 8)
    with pytest.raises(InvalidInput, match="part metadata"):
        client.call("stage", id=tx.id, ops=[{"op": "insert", "table": "bad_meta", "added": [{"name": 5}]}])
    with pytest.raises(InvalidInput, match="part metadata"):
        client.call("commit_parts", table="bad_meta", op="insert", added=[{"path": "../x"}])
    tx.rollback()
    assert client.snapshot() == before


@pytest.mark.parametrize("timeout", [-1, 0, math.nan, math.inf, "10", None, True])
def test_connect_with_a_bad_timeout_is_invalid_input(cluster: LocalCluster, timeout: Any) -> None:
    with pytest.raises(InvalidInput, match="timeout"):
        coordinator.connect(cluster.replica_addresses[0], timeout=timeout)


def test_change_columns_are_reserved_names(client: Client) -> None:
    """``changes`` adds ``_change`` and ``_csn``: a table cannot have them (before: KeyError)."""
    for name in ("_change", "_csn"):
        with pytest.raises(InvalidInput, match="reserved"):
            client.create_table(f"res{name}", pa.schema([("id", pa.int64()), (name, pa.string())]))
    client.create_table("res_alter", ID_V, auto_merge=False)
    before = client.describe_table("res_alter")["schema"]
    with pytest.raises(InvalidInput, match="reserved"):
        client.alter_table("res_alter", add_columns=[pa.field("_change", pa.string())])
    with pytest.raises(InvalidInput, match="reserved"):
        client.alter_table("res_alter", rename_columns={"v": "_csn"})
    assert client.describe_table("res_alter")["schema"] == before
    assert client.changes("res_alter", 0).schema.names == ["id", "v", "_change", "_csn"]


# -- the walk ------------------------------------------------------------------------------------

BAD: list[Any] = [None, 7, "x", -1, math.nan, 10**30, [1], {"a": 1}, b"x"]

# Values that are right for a parameter (its default None, ...): not called with them.
FINE: dict[str, list[Any]] = {
    "partitions": [None],
    "snapshot": [None],
    "as_of": [None],
    "columns": [None],
    "where": [None],
    "end": [None],
    "since_csn": [None],
    "grace_seconds": [None],
    "tables": [None],
    "apps": [None],
    "lock_groups": [None],
    "txn_max_seconds": [None],
    "txn_max_rows": [None],
    "memory_budget": [None],
    "retention_seconds": [None],
    "storage_options": [None],
    "credentials": [None],
    "set": [],
    "add_columns": [None],
    "rename_columns": [None],
    "zk_address": [None],
    "storage_url": [None],
    "epoch_size": [None],
    "settings": [None],
    # right for this call alone: a new table may be called 'x' (and dropped); app 'a' at version 1
    "create_table.name": ["x"],
    "drop_table.name": ["x"],
    "commit_parts.apps": [{"a": 1}],
    "LocalCluster.workdir": ["x"],
    "LocalCluster.replicas": [7],
    "table_at.snapshot": [7],
    "gc.grace_seconds": [7, 10**30],
    "events.table": [None],
    "events.since_csn": [7],
    "app_version.app_id": ["x"],
    "tx.set_app_version.app_id": ["x"],
    "tx.set_app_version.version": [7],
    "wait_for.snapshot": [7],
    "changes.start": [7],
    # partitions of an INSERT: only an overwrite reads them (documented), so any list passes
    "commit_parts.partitions": [[1]],
    "tx.add_parts.partitions": [[1]],
}


def _state(client: Client) -> tuple:
    return (client.snapshot(), sorted(client.tables()), sorted(t["id"] for t in client.transactions()))


def _calls(
    client: Client, tmp: Path, cluster: LocalCluster
) -> Iterator[tuple[str, Callable[..., Any], dict[str, Any]]]:
    """(what, function, valid arguments) for every public call; the walk changes one argument at
    a time. Generated names keep an accidental success from meeting the next call."""
    count = iter(range(10**6))
    rows = pa.table({"id": [1], "p": ["a"]}, schema=PARTED)
    keys = pa.table({"k": [1], "a": ["x"]}, schema=KEYED)
    where = pc.field("id") == 1
    yield "connect", coordinator.connect, {"address": client.address}
    yield "LocalCluster", LocalCluster, {"workdir": tmp / "lc", "replicas": 1}
    for method in ("client", "kill_replica", "start_replica", "pause_replica", "replica_pid"):
        yield f"cluster.{method}", getattr(cluster, method), {"i": 0}
    yield "cluster.add_user", cluster.add_user, {"name": "walker", "role": "reader", "tables": None}
    yield "create_table", client.create_table, {"name": lambda: f"walk_new{next(count)}", "schema": PARTED}
    for name in ("table", "describe_table", "drop_table", "parts"):
        yield name, getattr(client, name), {"name" if name != "parts" else "table": "walk_t"}
    yield "table_at", client.table_at, {"name": "walk_t", "snapshot": None, "as_of": None}
    yield "alter_table", client.alter_table, {"name": "walk_t", "add_columns": [pa.field("n", pa.int64())]}
    yield "begin", client.begin, {}
    yield (
        "transaction",
        lambda **kw: client.transaction(**kw).__enter__(),
        {"isolation": "snapshot", "atomicity": "full", "durability": "sync"},
    )
    yield "join", client.join, {"txn_id": "T1-4294967299-r0"}
    yield "read", client.read, {"table": "walk_t", "snapshot": None, "as_of": None, "columns": None, "where": None}

    def scan(**kw: Any) -> None:
        with client.scan(**kw):
            pass

    yield "scan", scan, {"table": "walk_t", "snapshot": None, "as_of": None, "memory_budget": None}
    yield "wait_for", client.wait_for, {"snapshot": 0}
    yield "compact", client.compact, {"table": "walk_t", "kind": "minor", "partitions": None}
    yield "kill", client.kill, {"txn_id": "T1-4294967299-r0"}
    yield "gc", client.gc, {"grace_seconds": None}
    yield "check", client.check, {"tables": None, "checksums": True}
    yield "changes", client.changes, {"table": "walk_t", "start": 0, "end": None, "by": "id", "compactions": True}
    yield "events", client.events, {"table": "walk_t", "since_csn": None}
    yield "app_version", client.app_version, {"app_id": "walk_app"}
    yield "commit_status", client.commit_status, {"tid": "T1-4294967299-r0"}
    yield (
        "commit_parts",
        client.commit_parts,
        {"table": "walk_t", "metas": [], "op": "insert", "partitions": None, "apps": None},
    )
    yield "create_user", client.create_user, {"name": "walker", "role": "reader", "tables": None}
    yield "drop_user", client.drop_user, {"name": "walker"}

    def in_tx(method: str) -> Callable[..., Any]:
        def run(**kw: Any) -> Any:
            tx = client.begin()
            try:
                return getattr(tx, method)(**kw)
            finally:
                tx.rollback()

        return run

    for method, args in (
        ("insert", {"table": "walk_t", "data": rows}),
        ("overwrite", {"table": "walk_t", "data": rows, "partitions": None}),
        ("truncate", {"table": "walk_t", "partitions": None}),
        ("delete", {"table": "walk_t", "where": where}),
        ("update", {"table": "walk_t", "where": where, "set": {"p": "b"}}),
        ("read", {"table": "walk_t", "columns": None, "where": None}),
        ("compact", {"table": "walk_t", "kind": "minor", "partitions": None}),
        ("add_parts", {"table": "walk_t", "metas": [], "op": "insert", "partitions": None}),
        ("add_rewrite", {"table": "walk_t", "kind": "delete", "added": [], "removed": [], "where": where}),
        ("set_app_version", {"app_id": "walk_app", "version": 1}),
        ("table", {"name": "walk_t"}),
        ("drop_table", {"table": "walk_t"}),
        ("upsert", {"table": "walk_k", "data": keys, "update": False}),
        ("delete_keys", {"table": "walk_k", "keys_": keys.select(["k"])}),
        ("lock_keys", {"table": "walk_k", "keys_": keys.select(["k"]), "mode": "shared_strong"}),
    ):
        yield f"tx.{method}", in_tx(method), args


def test_the_public_api_refuses_wrong_arguments_with_its_own_errors(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    client.create_table("walk_t", PARTED, partition_by=["p"], auto_merge=False)
    client.create_table("walk_k", KEYED, primary_key=["k"], conflict_policy="keys")
    bare: list[str] = []  # a non-MergetxnError escaped
    accepted: list[str] = []  # a wrong argument went through
    changed: list[str] = []  # something changed anyway
    calls = 0
    for what, fn, valid in _calls(client, tmp_path, cluster):
        for param in valid:
            for bad in BAD:
                fine = FINE.get(param, []) + FINE.get(f"{what}.{param}", [])
                if any(bad is v or (bad == v and type(bad) is type(v)) for v in fine):
                    continue
                args = {k: (v() if callable(v) else v) for k, v in valid.items()}
                args[param] = bad
                before = _state(client)
                label = f"{what}({param}={bad!r})"
                calls += 1
                try:
                    fn(**args)
                except MergetxnError:
                    pass
                except Exception as exc:  # noqa: BLE001 - what the walk is for
                    bare.append(f"{label}: {type(exc).__name__}: {str(exc)[:120]}")
                else:
                    accepted.append(label)
                if _state(client) != before:
                    changed.append(label)
    assert calls > 300
    assert not bare, "\n".join(bare)
    assert not changed, "\n".join(changed)
    assert not accepted, "\n".join(accepted)
    with pytest.raises(TableNotFound):
        client.read("walk_new0")  # no create_table went through
    assert inspect.isclass(MergetxnError)
