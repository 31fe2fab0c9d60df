"""Per-table transaction limits (docs/rules.md#transaction-limits):
``txn_max_seconds`` and ``txn_max_rows`` in a table's definition; a transaction is bound by the
smallest among the tables it wrote and the replica's. Pure tests of the validation and of the
choice of limit, then against real replicas."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from support.cluster import make_cluster
from support.data import ID_V, id_rows
from support.waiting import wait_until

import coordinator
from coordinator.errors import InvalidInput, TransactionAborted
from coordinator.model.catalog import (
    KEYS_TXN_MAX_ROWS,
    KEYS_TXN_MAX_SECONDS,
    TableDef,
    effective_limits,
)
from mergetxn.client import Client
from mergetxn.local.zkserver import ZooKeeperServer

KEYED = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("v", pa.string())])


# ---------------------------------------------------------------------------------------------
# Pure


def test_definition_round_trip_and_old_definitions_unchanged() -> None:
    plain = TableDef.new("p", ID_V)
    assert "txn_max_seconds" not in plain.to_dict() and "txn_max_rows" not in plain.to_dict()
    t = TableDef.new("t", ID_V, txn_max_seconds=2.5, txn_max_rows=10)
    back = TableDef.from_dict(t.to_dict())
    assert (back.txn_max_seconds, back.txn_max_rows) == (2.5, 10)
    assert back.same_definition(t) and not plain.same_definition(TableDef.new("p", ID_V, txn_max_rows=5))


def test_keys_tables_get_the_seed_defaults() -> None:
    t = TableDef.new("k", KEYED, primary_key=("k",), conflict_policy="keys")
    assert (t.txn_max_seconds, t.txn_max_rows) == (KEYS_TXN_MAX_SECONDS, KEYS_TXN_MAX_ROWS) == (60.0, 100_000)
    t = TableDef.new("k", KEYED, primary_key=("k",), conflict_policy="keys", txn_max_rows=7)
    assert (t.txn_max_seconds, t.txn_max_rows) == (60.0, 7)
    assert TableDef.new("p", ID_V).txn_max_seconds is None


@pytest.mark.parametrize(
    "kw",
    [
        {"txn_max_seconds": 0},
        {"txn_max_seconds": -1},
        {"txn_max_seconds": "5"},
        {"txn_max_seconds": True},
        {"txn_max_seconds": float("nan")},
        {"txn_max_seconds": float("inf")},
        {"txn_max_rows": 0},
        {"txn_max_rows": 1.5},
        {"txn_max_rows": -3},
        {"txn_max_rows": True},
    ],
)
def test_bad_limits_are_invalid_input_naming_the_value(kw: dict) -> None:
    ((key, value),) = kw.items()
    with pytest.raises(InvalidInput, match=key) as exc:
        TableDef.new("t", ID_V, **kw)
    assert repr(value) in exc.value.message


def test_effective_limits_take_the_smallest() -> None:
    a = TableDef.new("a", ID_V, txn_max_seconds=5, txn_max_rows=100)
    b = TableDef.new("b", ID_V, txn_max_seconds=9, txn_max_rows=10)
    c = TableDef.new("c", ID_V)
    assert effective_limits([a, b, c], 3600, 1000) == (5.0, "a", 10, "b")
    assert effective_limits([c], 3600, 1000) == (3600, None, 1000, None)
    assert effective_limits([a], 1.0, 50) == (1.0, None, 50, None)


# ---------------------------------------------------------------------------------------------
# Against a cluster


@pytest.fixture(scope="module")
def cluster(zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    with make_cluster(tmp_path_factory, zk_server, "limits", replicas=2, settings={"gc_grace_seconds": 3600}) as c:
        yield c


def part_files(cluster: coordinator.LocalCluster, table: str) -> set[str]:
    root = Path(cluster.storage_url) / table
    return {str(p.relative_to(root)) for p in root.rglob("*.parquet")} if root.exists() else set()


@pytest.mark.zk
def test_past_the_row_limit_aborts_and_leaves_nothing(cluster, c0: Client) -> None:
    c0.create_table("rowlim", ID_V, auto_merge=False, txn_max_rows=5)
    with c0.transaction() as first:
        first.insert("rowlim", id_rows(3))
    files, parts = part_files(cluster, "rowlim"), c0.describe_table("rowlim")["parts"]
    tx = c0.begin()
    tx.insert("rowlim", id_rows(2))
    with pytest.raises(TransactionAborted, match=r"txn_max_rows.*'rowlim'.*\b5\b"):
        tx.insert("rowlim", id_rows(4))
    assert c0.commit_status(tx.id).status == "aborted"
    assert c0.read("rowlim").num_rows == 3 and c0.describe_table("rowlim")["parts"] == parts
    wait_until(lambda: part_files(cluster, "rowlim") == files, timeout=10, what="the aborted parts deleted")


def test_a_compaction_is_not_held_to_the_row_limit(cluster, c0: Client) -> None:
    """A compaction rewrites rows without changing them: a table of more rows than its
    txn_max_rows still compacts (client.compact and tx.compact)."""
    c0.create_table("rowlimc", ID_V, auto_merge=False, txn_max_rows=5)
    for i in range(3):
        with c0.transaction() as tx:
            tx.insert("rowlimc", id_rows(4))
    c0.compact("rowlimc", kind="major")
    assert c0.read("rowlimc").num_rows == 12
    assert sum(p["visible"] for p in c0.parts("rowlimc").to_pylist()) == 1
    with c0.transaction() as tx:
        tx.insert("rowlimc", id_rows(4))
    with c0.transaction() as tx:
        tx.compact("rowlimc", kind="major")
        tx.insert("rowlimc", id_rows(1))
    assert c0.read("rowlimc").num_rows == 17


@pytest.mark.zk
def test_past_the_time_limit_the_sweeper_aborts(cluster, c0: Client, c1: Client) -> None:
    c0.create_table("timelim", ID_V, auto_merge=False, txn_max_seconds=0.5)
    files = part_files(cluster, "timelim")
    tx = c0.begin()
    tx.insert("timelim", id_rows(2))
    status = wait_until(
        lambda: (s := c0.commit_status(tx.id)).status == "aborted" and s,
        timeout=10,
        what="the sweeper aborting the transaction",
    )
    assert "txn_max_seconds" in status.reason and "'timelim'" in status.reason and "0.5s" in status.reason
    with pytest.raises(TransactionAborted, match="timelim"):
        tx.commit()
    assert c1.read("timelim").num_rows == 0
    wait_until(lambda: part_files(cluster, "timelim") == files, timeout=10, what="the aborted parts deleted")


@pytest.mark.zk
def test_two_tables_the_smaller_limit_binds(cluster, c0: Client) -> None:
    c0.create_table("big", ID_V, txn_max_rows=100)
    c0.create_table("small", ID_V, txn_max_rows=4)
    tx = c0.begin()
    tx.insert("big", id_rows(3))
    with pytest.raises(TransactionAborted, match=r"'small', 4 "):
        tx.insert("small", id_rows(2))  # 5 rows in all, past the smaller limit
    assert c0.read("big").num_rows == 0 and c0.read("small").num_rows == 0
    with c0.transaction() as ok:  # under both
        ok.insert("big", id_rows(2))
        ok.insert("small", id_rows(2))
    assert c0.read("small").num_rows == 2


@pytest.mark.zk
def test_describe_and_keys_defaults(cluster, c0: Client, c1: Client) -> None:
    c0.create_table("kd", KEYED, primary_key=["k"], conflict_policy="keys")
    d = c0.describe_table("kd")
    assert (d["txn_max_seconds"], d["txn_max_rows"]) == (60.0, 100_000)
    c0.create_table("pd", ID_V, txn_max_seconds=30)
    d = c0.describe_table("pd")
    assert d["txn_max_seconds"] == 30.0 and "txn_max_rows" not in d
    with pytest.raises(InvalidInput, match="-2"):
        c0.create_table("bad", ID_V, txn_max_rows=-2)


# ---------------------------------------------------------------------------------------------
# The command line


@pytest.mark.zk
def test_cli_create_keys_table_and_describe(cluster, c0: Client) -> None:
    import json

    from click.testing import CliRunner

    from mergetxn.cli import cli as main

    runner, addr = CliRunner(), cluster.replica_addresses[0]
    r = runner.invoke(
        main,
        [
            "table",
            "create",
            "clikeys",
            "--replica",
            addr,
            "--schema",
            "k:int64!,a:string,b:int64",
            "--policy",
            "keys",
            "--primary-key",
            "k",
            "--lock-group",
            "ga=a",
            "--lock-group",
            "gb=b",
            "--atomicity",
            "none",
            "--txn-max-rows",
            "50",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["policy"] == "keys" and out["lock_groups"] == {"ga": ["a"], "gb": ["b"]} and out["txn_max_rows"] == 50
    r = runner.invoke(main, ["table", "describe", "clikeys", "--replica", addr, "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert (d["primary_key"], d["lock_groups"], d["atomicity"]) == (["k"], {"ga": ["a"], "gb": ["b"]}, "none")
    assert (d["txn_max_seconds"], d["txn_max_rows"]) == (60.0, 50)
    r = runner.invoke(main, ["table", "describe", "clikeys", "--replica", addr])
    assert r.exit_code == 0 and "ga=a" in r.output and "atomicity none" in r.output and "50 rows" in r.output
    # a parts table: no limits of its own
    r = runner.invoke(
        main, ["table", "create", "cliparts", "--replica", addr, "--schema", "id:int64", "--txn-max-seconds", "2.5"]
    )
    assert r.exit_code == 0, r.output
    d = json.loads(runner.invoke(main, ["table", "describe", "cliparts", "--replica", addr, "--json"]).output)
    assert (d["txn_max_seconds"], d["txn_max_rows"], d["lock_groups"], d["atomicity"]) == (2.5, None, {}, "full")
    # bad values: a usage error naming them
    r = runner.invoke(
        main, ["table", "create", "clibad", "--replica", addr, "--schema", "id:int64", "--txn-max-rows", "0"]
    )
    assert r.exit_code == 2 and "txn_max_rows" in r.output
    r = runner.invoke(
        main,
        [
            "table",
            "create",
            "clibad",
            "--replica",
            addr,
            "--schema",
            "k:int64!",
            "--policy",
            "keys",
            "--primary-key",
            "k",
            "--lock-group",
            "nocols",
        ],
    )
    assert r.exit_code == 2 and "--lock-group" in r.output
