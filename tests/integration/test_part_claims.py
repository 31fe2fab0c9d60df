"""Nothing a writer claims about a part is believed.

A part's metadata (rows, size, checksum, columns, statistics, partition, key summary) is held
against its file when it is staged: a disagreement refuses ``commit_parts``/``add_parts`` with
InvalidInput naming the part and the field, nothing is committed, reads go on and the caller's
file stays. A retried ``commit_parts`` gets its CSN back only with the metadata that was
committed. ``mergetxn check`` finds a part whose metadata its file contradicts (one committed
before commits were checked, planted here by rewriting its log entry as an operator holding the
replicas' ZooKeeper identity could) and ``check --repair`` mends it.

All against real ZooKeeper and replica processes.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from click.testing import CliRunner, Result
from kazoo.client import KazooClient
from support.cluster import make_cluster  # tests/ is on sys.path

import coordinator
from coordinator.core import jsonwire
from coordinator.core.versions import split_csn
from coordinator.errors import CorruptPart, InvalidInput
from coordinator.zk.log import CsnLog
from mergetxn.cli import cli
from mergetxn.client.client import Client
from parts.io.format import write_part
from parts.model.meta import PartMeta

pytestmark = pytest.mark.zk

SCHEMA = pa.schema([("n", pa.int64()), ("s", pa.string())])
KEYS = pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.string())])
EXIT_CORRUPT = 8


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:  # noqa: ANN001
    with make_cluster(tmp_path_factory, zk_server, "claims", replicas=2) as c:
        yield c


def rows(*ns: int) -> pa.Table:
    return pa.table({"n": list(ns), "s": [f"s{n}" for n in ns]}, schema=SCHEMA)


def part(client: Client, table: str, data: pa.Table, partition_by: list[str] | None = None) -> PartMeta:
    partition = tuple(data.column(c)[0].as_py() for c in partition_by or [])
    return write_part(client.storage, table, partition_by or [], partition, data, "writer")


def file_of(client: Client, meta: PartMeta) -> Path:
    return Path(client.storage.url) / meta.path


def refused(call: object, meta: PartMeta, field: str) -> InvalidInput:
    with pytest.raises(InvalidInput) as info:
        call()  # type: ignore[operator]
    exc = info.value
    assert exc.details.get("part") == meta.name and exc.details.get("field") == field, exc.message
    assert meta.name in exc.message and field in exc.message
    return exc


FORGED = {
    "checksum": lambda m: {"checksum": "crc32:00000000"},
    "rows": lambda m: {"rows": 999},
    "size": lambda m: {"size": m.size + 4096},
}


@pytest.mark.parametrize("field", sorted(FORGED))
def test_forged_checksum_rows_or_size_is_refused_and_changes_nothing(
    cluster: coordinator.LocalCluster, c0: Client, c1: Client, field: str
) -> None:
    table = f"forged_{field}"
    c0.create_table(table, SCHEMA, auto_merge=False)
    c0.commit_parts(table, [part(c0, table, rows(1, 2))])
    before = c0.snapshot()
    meta = part(c0, table, rows(3))
    forged = dataclasses.replace(meta, **FORGED[field](meta))
    refused(lambda: c0.commit_parts(table, [forged]), meta, field)
    with c0.transaction() as tx:
        refused(lambda: tx.add_parts(table, [forged]), meta, field)
    assert c0.snapshot() == before or c0.parts(table).num_rows == 1  # the empty transaction commits nothing
    assert c0.parts(table).num_rows == 1
    assert file_of(c0, meta).exists()  # the caller's file is left
    c1.wait_for(c0.snapshot())
    for c in (c0, c1):
        assert sorted(c.read(table).column("n").to_pylist()) == [1, 2]
    assert c0.commit_parts(table, [meta]) > before  # the same file with its true metadata commits
    assert sorted(c1.read(table, snapshot=c0.snapshot()).column("n").to_pylist()) == [1, 2, 3]


def test_a_missing_file_is_refused(c0: Client) -> None:
    c0.create_table("claims_missing", SCHEMA, auto_merge=False)
    meta = part(c0, "claims_missing", rows(1))
    file_of(c0, meta).unlink()
    refused(lambda: c0.commit_parts("claims_missing", [meta]), meta, "path")


def test_lying_statistics_are_refused_and_wider_ones_still_find_the_row(c0: Client) -> None:
    table = "lying_stats"
    c0.create_table(table, SCHEMA, auto_merge=False)
    meta = part(c0, table, rows(7))
    lie = dataclasses.replace(meta, stats={**meta.stats, "n": (150, 150)})
    refused(lambda: c0.commit_parts(table, [lie]), meta, "stats.n")
    every_null = dataclasses.replace(meta, stats={**meta.stats, "s": (None, None)})
    refused(lambda: c0.commit_parts(table, [every_null]), meta, "stats.s")
    no_column = dataclasses.replace(meta, stats={**meta.stats, "nope": (1, 2)})
    refused(lambda: c0.commit_parts(table, [no_column]), meta, "stats.nope")
    assert c0.parts(table).num_rows == 0
    wider = dataclasses.replace(meta, stats={**meta.stats, "n": (0, 1000)})  # less pruning, no lie
    c0.commit_parts(table, [wider])
    assert c0.read(table, where=pc.field("n") == 7).column("n").to_pylist() == [7]


def test_a_partition_the_rows_are_not_in_is_refused(c0: Client) -> None:
    table = "lying_partition"
    c0.create_table(table, SCHEMA, partition_by=["s"], auto_merge=False)
    data = rows(4)
    honest = part(c0, table, data, ["s"])
    # The same rows in the file of another partition, named for it: the layout checks pass.
    other = write_part(c0.storage, table, ["s"], ("s9",), data, "writer")
    refused(lambda: c0.commit_parts(table, [other]), other, "partition.s")
    c0.commit_parts(table, [honest])
    assert c0.read(table, where=pc.field("s") == "s4").column("n").to_pylist() == [4]


def test_a_file_with_other_columns_is_refused(c0: Client) -> None:
    table = "claims_schema"
    c0.create_table(table, SCHEMA, auto_merge=False)
    wrong_type = pa.table({"n": pa.array(["7"]), "s": ["x"]})
    extra = pa.table({"n": [1], "s": ["x"], "secret": [1]})
    for data in (wrong_type, extra):
        meta = write_part(c0.storage, table, [], (), data, "writer")
        refused(lambda m=meta: c0.commit_parts(table, [m]), meta, "schema")
    assert c0.read(table).num_rows == 0


def test_a_key_summary_that_hides_a_key_is_refused(c0: Client) -> None:
    from coordinator.core import keytables

    table = "lying_keys"
    c0.create_table(table, KEYS, primary_key=["k"], conflict_policy="keys", auto_merge=False)
    with c0.transaction() as tx:
        tx.insert(table, pa.table({"k": [1], "v": ["old"]}, schema=KEYS))
    data = keytables.versions(KEYS, ["k"], table, pa.table({"k": [1, 2, 3], "v": ["a", "b", "c"]}), keytables.PUT, 0)
    meta = write_part(c0.storage, table, [], (), data, "writer", primary_key=["k"])
    assert meta.key_summary is not None
    narrow = {**meta.key_summary, "lo": [2], "hi": [3]}  # key 1 hidden from point reads and conflicts
    empty = {**keytables.summarize(data.slice(0, 0), ["k"]), "ranges": meta.key_summary["ranges"]}
    for summary in (narrow, empty):
        forged = dataclasses.replace(meta, key_summary=summary)
        with c0.transaction() as tx:
            refused(lambda f=forged: tx.add_parts(table, [f]), meta, "key_summary")
    with c0.transaction() as tx:
        tx.add_parts(table, [meta])
    got = c0.read(table)
    assert dict(zip(got.column("k").to_pylist(), got.column("v").to_pylist())) == {1: "a", 2: "b", 3: "c"}


def test_a_retry_is_answered_only_with_the_metadata_committed(c0: Client) -> None:
    table = "claims_retry"
    c0.create_table(table, SCHEMA, auto_merge=False)
    meta = part(c0, table, rows(5, 6))
    csn = c0.commit_parts(table, [meta])
    assert c0.commit_parts(table, [meta]) == csn  # the answer was lost: the same commit, the same CSN
    other = dataclasses.replace(meta, stats={**meta.stats, "n": (0, 100)})  # true, but not what was committed
    with pytest.raises(InvalidInput, match="other metadata") as info:
        c0.commit_parts(table, [other])
    assert info.value.details.get("part") == meta.name and info.value.details.get("field") == "stats"
    assert c0.commit_parts(table, [meta]) == csn
    assert sorted(c0.read(table).column("n").to_pylist()) == [5, 6]


# -- mergetxn check and --repair on parts committed with lying metadata ---------------------------
def invoke(cluster: coordinator.LocalCluster, *args: str) -> Result:
    runner = CliRunner(env={"MERGETXN_REPLICA": cluster.replica_addresses[0]})
    return runner.invoke(cli, list(args), catch_exceptions=False)


def plant(cluster: coordinator.LocalCluster, csn: int, name: str, change: dict) -> None:
    """Rewrite the log entry of ``csn`` so that part ``name``'s metadata says ``change``: what a
    commit from before the stage-time checks could have recorded."""
    zk = KazooClient(hosts=cluster.zk_address)
    zk.start()
    try:
        node = CsnLog(zk, cluster.root).entry_path(*split_csn(csn))
        data, _ = zk.get(node)
        entry = jsonwire.loads(data)
        found = 0
        for txn in entry["txns"]:
            for ch in txn["changes"]:
                for m in ch["added"]:
                    if m["name"] == name:
                        m.update(change)
                        found += 1
        assert found == 1, entry
        zk.set(node, jsonwire.dumps(entry, sort_keys=True))
    finally:
        zk.stop()
        zk.close()


@pytest.fixture
def lone(zk_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:  # noqa: ANN001
    with make_cluster(tmp_path_factory, zk_server, "claims_planted", replicas=1) as c:
        yield c


@pytest.mark.slow
def test_check_finds_rows_and_statistics_lies_and_repair_mends_them(lone: coordinator.LocalCluster) -> None:
    c = lone.client(0)
    c.create_table("planted", SCHEMA, auto_merge=False)
    c.commit_parts("planted", [part(c, "planted", rows(1, 2))])
    few, seven = part(c, "planted", rows(3)), part(c, "planted", rows(7))
    csn_few = c.commit_parts("planted", [few])
    csn_seven = c.commit_parts("planted", [seven])
    c.close()
    lone.stop_replica(0)
    shutil.rmtree(lone.workdir / "replica-0")  # it reads the whole log again, as rewritten below
    plant(lone, csn_few, few.name, {"rows": 5})
    plant(lone, csn_seven, seven.name, {"stats": {**{k: list(v) for k, v in seven.stats.items()}, "n": [150, 150]}})
    lone.start_replica(0)
    c = lone.client(0)
    c.wait_for(csn_seven)
    with pytest.raises(CorruptPart):  # what such metadata does to every read
        c.read("planted")

    r = invoke(lone, "check", "planted")
    assert r.exit_code == EXIT_CORRUPT, r.output
    assert few.name in r.output and seven.name in r.output and "--repair" in r.output
    report = json.loads(invoke(lone, "check", "planted", "--json").stdout)
    fields = {p["part"]: (p["field"], p["repairable"]) for t in report["tables"] for p in t["problems"]}
    assert fields == {few.name: ("rows", True), seven.name: ("stats.n", True)}

    r = invoke(lone, "check", "planted", "--repair")
    assert r.exit_code == 0, r.output
    assert "repaired planted: 2 part(s)" in r.output
    assert sorted(c.read("planted").column("n").to_pylist()) == [1, 2, 3, 7]
    assert c.read("planted", where=pc.field("n") == 7).column("n").to_pylist() == [7]
    # The replaced parts stay for the snapshots before the repair (time travel there still fails on
    # them) until cleanup collects them: check names them, no longer visible, and says so.
    r = invoke(lone, "check", "planted")
    assert r.exit_code == EXIT_CORRUPT and "no longer visible" in " ".join(r.output.split()), r.output
    report = json.loads(invoke(lone, "check", "planted", "--json").stdout)
    left = {p["part"]: p["visible"] for t in report["tables"] for p in t["problems"]}
    assert left == {few.name: False, seven.name: False}
    c.close()


@pytest.mark.slow
def test_repair_of_a_keys_table_part_keeps_its_versions_order(lone: coordinator.LocalCluster) -> None:
    c = lone.client(0)
    c.create_table("planted_keys", KEYS, primary_key=["k"], conflict_policy="keys", auto_merge=False)
    with c.transaction() as tx:
        tx.insert("planted_keys", pa.table({"k": [1, 2], "v": ["old", "old"]}, schema=KEYS))
    with c.transaction() as tx:
        tx.upsert("planted_keys", pa.table({"k": [1], "v": ["new"]}, schema=KEYS))
    lied = next(p for p in c.call("visible", table="planted_keys", lease="none")["parts"] if p["rows"] == 1)
    csn = tx.csn
    c.close()
    lone.stop_replica(0)
    shutil.rmtree(lone.workdir / "replica-0")
    plant(lone, csn, lied["name"], {"rows": 3})
    lone.start_replica(0)
    c = lone.client(0)
    c.wait_for(csn)
    with pytest.raises(CorruptPart):
        c.read("planted_keys")
    r = invoke(lone, "check", "planted_keys", "--repair")
    assert r.exit_code == 0, r.output
    got = c.read("planted_keys")
    assert dict(zip(got.column("k").to_pylist(), got.column("v").to_pylist())) == {1: "new", 2: "old"}
    c.close()
