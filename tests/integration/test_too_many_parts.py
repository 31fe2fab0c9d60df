"""Visible parts per partition bounded by backpressure (docs/rules.md#too-many-parts),
against a real replica with low thresholds (delay at 5, refuse at 10): counts, not times.

A writer past ``parts_to_throw_insert`` gets TooManyParts naming the table, the partition, the
count and the settings, and nothing is lost; past ``parts_to_delay_insert`` the replica counts
delayed inserts; a table's own thresholds override the replica's; what does not add parts to a
partition (compactions, deletes, updates, overwrites, a truncate with its inserts) and a
restore's transaction are never held back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support.cluster import make_cluster
from support.data import ID_V, id_rows

import coordinator
from coordinator.errors import TooManyParts
from mergetxn.client import Client
from mergetxn.local.zkserver import ZooKeeperServer

DELAY, THROW = 5, 10
SETTINGS = {
    "parts_to_delay_insert": DELAY,
    "parts_to_throw_insert": THROW,
    "max_delay_to_insert": 0.05,
    "merge_interval": 0,
    "gc_grace_seconds": 3600,
}
PV = pa.schema([("p", pa.string()), ("id", pa.int64())])


@pytest.fixture(scope="module")
def cluster(zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    with make_cluster(tmp_path_factory, zk_server, "pressure", replicas=1, settings=SETTINGS) as c:
        yield c


def part_files(cluster: coordinator.LocalCluster, table: str) -> int:
    root = Path(cluster.storage_url) / table
    return sum(1 for _ in root.rglob("*.parquet")) if root.exists() else 0


def visible(c: Client, table: str) -> int:
    return sum(c.parts(table).column("visible").to_pylist())


def held(c: Client) -> dict:
    return c.call("info")["inserts"]


def fill(c: Client, table: str, n: int, start: int = 0) -> None:
    for i in range(n):
        c.insert(table, id_rows(2, start=start + 2 * i))


@pytest.mark.zk
def test_past_the_refusal_threshold_the_writer_is_refused_and_nothing_is_lost(cluster, c0: Client) -> None:
    c0.create_table("crowd", ID_V, auto_merge=False)
    before = held(c0)
    fill(c0, "crowd", THROW)
    after = held(c0)
    # The inserts made at 5..9 visible parts were delayed, the five before were not.
    assert after["delayed"] - before["delayed"] == THROW - DELAY and after["refused"] == before["refused"]
    files = part_files(cluster, "crowd")
    with pytest.raises(TooManyParts) as exc:
        c0.insert("crowd", id_rows(2, start=1000))
    message = exc.value.message
    for text in ("'crowd'", "holds 10 visible parts", "parts_to_throw_insert=10", "parts_to_delay_insert=5", "[]"):
        assert text in message, message
    assert exc.value.details["parts"] == THROW and exc.value.details["table"] == "crowd"
    assert held(c0)["refused"] == before["refused"] + 1
    # In a transaction only the statement fails: the transaction stays usable, its part deleted.
    with c0.transaction() as tx:
        with pytest.raises(TooManyParts):
            tx.insert("crowd", id_rows(2, start=2000))
        assert tx.read("crowd").num_rows == 2 * THROW
    # Nothing lost, nothing added: every committed row, no refused one, no file left behind.
    assert sorted(c0.read("crowd").column("id").to_pylist()) == list(range(2 * THROW))
    assert visible(c0, "crowd") == THROW and part_files(cluster, "crowd") == files
    c0.compact("crowd", kind="major")
    assert visible(c0, "crowd") == 1
    c0.insert("crowd", id_rows(2, start=3000))
    assert c0.read("crowd").num_rows == 2 * THROW + 2


@pytest.mark.zk
def test_the_count_is_per_partition(c0: Client) -> None:
    c0.create_table("parted", PV, partition_by=["p"], auto_merge=False)
    for i in range(THROW):
        c0.insert("parted", pa.table({"p": ["a"], "id": [i]}, schema=PV))
    with pytest.raises(TooManyParts, match=r"\['a'\].*'parted'") as exc:
        c0.insert("parted", pa.table({"p": ["a", "b"], "id": [98, 99]}, schema=PV))
    assert exc.value.details["partition"] == ["a"]
    c0.insert("parted", pa.table({"p": ["b"], "id": [99]}, schema=PV))  # another partition: free
    assert c0.read("parted").num_rows == THROW + 1


@pytest.mark.zk
def test_a_tables_own_thresholds_override_the_replicas(c0: Client) -> None:
    c0.create_table("strict", ID_V, auto_merge=False, parts_to_delay_insert=0, parts_to_throw_insert=3)
    d = c0.describe_table("strict")
    assert (d["parts_to_delay_insert"], d["parts_to_throw_insert"]) == (0, 3)
    before = held(c0)["delayed"]
    fill(c0, "strict", 3)
    with pytest.raises(TooManyParts, match=r"parts_to_throw_insert=3 \(the table's own"):
        c0.insert("strict", id_rows(1, start=100))
    c0.create_table("free", ID_V, auto_merge=False, parts_to_delay_insert=0, parts_to_throw_insert=0)
    fill(c0, "free", THROW + 2)
    assert visible(c0, "free") == THROW + 2 and held(c0)["delayed"] == before  # neither delayed nor refused
    d = c0.describe_table("free")
    assert (d["parts_to_delay_insert"], d["parts_to_throw_insert"]) == (0, 0)
    c0.alter_table("free", parts_to_throw_insert=None, parts_to_delay_insert=None)  # back to the replica's
    d = c0.describe_table("free")
    assert (d["parts_to_delay_insert"], d["parts_to_throw_insert"]) == (DELAY, THROW)
    with pytest.raises(TooManyParts, match=r"holds 12 visible parts.*setting of replica"):
        c0.insert("free", id_rows(1, start=100))
    c0.alter_table("strict", parts_to_throw_insert=20)
    c0.insert("strict", id_rows(1, start=100))
    assert visible(c0, "strict") == 4


@pytest.mark.zk
def test_what_does_not_add_parts_is_never_held_back(c0: Client) -> None:
    c0.create_table("full", ID_V, auto_merge=False)
    fill(c0, "full", THROW)
    with pytest.raises(TooManyParts):
        c0.insert("full", id_rows(1, start=500))
    before = held(c0)
    with c0.transaction() as tx:
        tx.delete("full", pc.field("id") == 0)
    with c0.transaction() as tx:
        tx.update("full", pc.field("id") == 2, {"v": "changed"})
    with c0.transaction() as tx:
        tx.compact("full", kind="minor")
    fill(c0, "full", THROW - visible(c0, "full"), start=100)
    assert visible(c0, "full") == THROW
    # A truncate and its inserts in one transaction: the partition it leaves holds only those.
    with c0.transaction() as tx:
        tx.truncate("full")
        tx.insert("full", id_rows(2, start=700))
    assert visible(c0, "full") == 1
    fill(c0, "full", THROW - 1, start=200)
    with c0.transaction() as tx:
        tx.overwrite("full", id_rows(3, start=800))
    assert c0.read("full").column("id").to_pylist() == [800, 801, 802]
    fill(c0, "full", THROW - 1, start=300)
    with c0.transaction(table_limits=False) as tx:  # a restore's: free of the tables' limits
        tx.insert("full", id_rows(1, start=900))
    assert visible(c0, "full") == THROW + 1
    c0.compact("full", kind="major")
    assert visible(c0, "full") == 1 and held(c0)["refused"] == before["refused"]


@pytest.mark.zk
def test_the_command_line_sets_shows_and_exits_5_on_the_refusal(cluster, c0: Client, tmp_path: Path) -> None:
    import pyarrow.parquet as pq
    from click.testing import CliRunner
    from support.cli import one_error_line

    from mergetxn.cli import cli

    runner = CliRunner(env={"MERGETXN_REPLICA": cluster.replica_addresses[0]})

    def run(*args: object):  # noqa: ANN202 - click's Result
        return runner.invoke(cli, [str(a) for a in args], catch_exceptions=False)

    r = run(
        "table", "create", "viacli", "--schema", "id:int64,v:string", "--no-auto-merge", "--parts-to-throw-insert", 2
    )
    assert r.exit_code == 0, r.output
    r = run("table", "describe", "viacli")
    assert "inserts delayed from 5 and refused from 2 visible parts" in r.output, r.output
    pq.write_table(id_rows(2), tmp_path / "rows.parquet")
    for _ in range(2):
        assert run("insert", "viacli", tmp_path / "rows.parquet").exit_code == 0
    one_error_line(run("insert", "viacli", tmp_path / "rows.parquet"), 5, "too many parts", "'viacli'", "holds 2")
    assert visible(c0, "viacli") == 2
