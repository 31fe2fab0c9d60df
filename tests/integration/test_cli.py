"""The ``mergetxn`` command line against a real cluster (ZooKeeper + a replica process).

Client commands run in-process through click's CliRunner; the servers (``zk start``,
``replica start``) and ``quickstart`` run as subprocesses, as a user would run them. Every test
checks what the command did to the cluster through the Python client, not only what it printed.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from support.cluster import make_cluster  # tests/ is on sys.path
from support.data import sorted_rows
from support.zk import kazoo

from coordinator import LocalCluster, connect
from coordinator.errors import InvalidInput, TransactionAborted
from mergetxn.cli import cli, parse_schema
from mergetxn.client import Client
from mergetxn.local.zkserver import ZooKeeperServer
from replicas.server import SWITCH_INTERVAL

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = "id:int64,name:string,day:date32"
ARROW_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("day", pa.date32())])
D1, D2 = dt.date(2024, 1, 1), dt.date(2024, 1, 2)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator[LocalCluster]:
    """One replica on the session's ZooKeeper, in a chroot of its own."""
    with make_cluster(tmp_path_factory, zk_server, "cli", replicas=1) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    cl = cluster.client(0)
    yield cl
    cl.close()


@pytest.fixture
def run(cluster: LocalCluster):
    """Run ``mergetxn <args>`` in-process; the replica comes from MERGETXN_REPLICA."""
    runner = CliRunner(env={"MERGETXN_REPLICA": cluster.replica_addresses[0]})

    def invoke(*args: str) -> Result:
        return runner.invoke(cli, [str(a) for a in args], catch_exceptions=False)

    return invoke


def sample(first_id: int, n: int, day: dt.date) -> pa.Table:
    ids = list(range(first_id, first_id + n))
    return pa.table(
        {"id": ids, "name": [f"n{i}" for i in ids], "day": pa.array([day] * n, pa.date32())},
        schema=ARROW_SCHEMA,
    )


def write_csv(path: Path, data: pa.Table) -> Path:
    pcsv.write_csv(data, path)
    return path


def create(run, name: str, *extra: str) -> None:
    r = run("table", "create", name, "--schema", SCHEMA, "--partition-by", "day", *extra)
    assert r.exit_code == 0, r.output
    assert f"created table {name}" in r.output


# -- tables and data -----------------------------------------------------------------------------


def test_create_insert_csv_and_parquet_then_read(run, client: Client, tmp_path: Path) -> None:
    create(run, "people", "--policy", "maxcompute", "--no-auto-merge")
    tdef = client.table("people")
    assert tdef.schema == ARROW_SCHEMA
    assert tdef.partition_by == ("day",)
    assert tdef.conflict_policy.value == "maxcompute" and tdef.auto_merge is False

    csv_rows, pq_rows = sample(1, 3, D1), sample(10, 2, D2)
    r = run("insert", "people", write_csv(tmp_path / "a.csv", csv_rows))
    assert r.exit_code == 0, r.output
    assert "inserted 3 rows into people" in r.output
    csn_csv = int(r.output.split("committed at CSN ")[1].split()[0])
    pq.write_table(pq_rows, tmp_path / "b.parquet")
    r = run("insert", "people", tmp_path / "b.parquet")
    assert r.exit_code == 0, r.output
    assert "inserted 2 rows into people" in r.output
    csn_pq = int(r.output.split("committed at CSN ")[1].split()[0])
    assert csn_pq > csn_csv
    expected = sorted_rows(pa.concat_tables([csv_rows, pq_rows]))
    assert sorted_rows(client.read("people")) == expected
    assert sorted_rows(client.read("people", snapshot=csn_csv)) == sorted_rows(csv_rows)

    r = run("read", "people")
    assert r.exit_code == 0, r.output
    for name in ("n1", "n2", "n3", "n10", "n11"):
        assert name in r.output
    assert "2024-01-02" in r.output
    assert f"5 rows of people at snapshot {client.snapshot()}" in r.output

    out = tmp_path / "out.parquet"
    r = run("read", "people", "--output", out)
    assert r.exit_code == 0, r.output
    assert "wrote 5 rows of people" in r.output
    written = pq.read_table(out)
    assert written.schema == ARROW_SCHEMA
    assert sorted_rows(written) == expected

    r = run("read", "people", "--snapshot", csn_csv, "-o", tmp_path / "old.parquet")
    assert r.exit_code == 0, r.output
    assert sorted_rows(pq.read_table(tmp_path / "old.parquet")) == sorted_rows(csv_rows)

    r = run("read", "people", "--limit", 2)
    assert r.exit_code == 0, r.output
    assert "5 rows of people" in r.output and "(showing 2)" in r.output


def test_read_as_of_a_time(run, client: Client) -> None:
    create(run, "clock")
    with client.transaction() as tx:
        tx.insert("clock", sample(1, 4, D1))
    between = dt.datetime.now(dt.UTC)
    with client.transaction() as tx:
        tx.insert("clock", sample(5, 6, D1))
    r = run("read", "clock", "--as-of", between.isoformat())
    assert r.exit_code == 0, r.output
    assert "4 rows of clock as of" in r.output
    r = run("read", "clock", "--as-of", between.replace(tzinfo=None).isoformat())
    assert r.exit_code == 2
    assert "error:" in r.output and "timezone" in r.output


def test_insert_overwrite(run, client: Client, tmp_path: Path) -> None:
    create(run, "ow")
    with client.transaction() as tx:
        tx.insert("ow", pa.concat_tables([sample(1, 3, D1), sample(4, 3, D2)]))
    r = run("insert", "ow", write_csv(tmp_path / "ow.csv", sample(100, 1, D1)), "--overwrite")
    assert r.exit_code == 0, r.output
    assert sorted_rows(client.read("ow")) == sorted_rows(pa.concat_tables([sample(100, 1, D1), sample(4, 3, D2)]))


def test_parts_lists_versions(run, client: Client) -> None:
    create(run, "partlist")
    with client.transaction() as tx:
        tx.insert("partlist", pa.concat_tables([sample(1, 2, D1), sample(3, 1, D2)]))
    expected = client.parts("partlist").to_pylist()
    assert len(expected) == 2
    r = run("parts", "partlist")
    assert r.exit_code == 0, r.output
    for head in (
        "name",
        "partition",
        "rows",
        "creation_tid",
        "creation_csn",
        "removal_csn",
        "visible",
    ):
        assert head in r.output
    for p in expected:
        assert p["name"] in r.output
    assert tx.id in r.output and str(tx.csn) in r.output
    assert "2 parts of partlist, 2 visible, 3 visible rows" in r.output
    r = run("parts", "partlist", "--json")
    assert r.exit_code == 0, r.output
    got = [json.loads(line) for line in r.output.splitlines()]
    assert {(p["name"], p["creation_tid"], p["creation_csn"], p["visible"]) for p in got} == {
        (p["name"], tx.id, tx.csn, True) for p in expected
    }


def test_compact(run, client: Client) -> None:
    create(run, "squash", "--no-auto-merge")
    for i in range(3):
        with client.transaction() as tx:
            tx.insert("squash", sample(10 * i, 2, D1))
        with client.transaction() as tx:
            tx.insert("squash", sample(100 + 10 * i, 2, D2))
    before = sorted_rows(client.read("squash"))
    r = run("compact", "squash", "--partition", "2024-01-01")
    assert r.exit_code == 0, r.output
    assert "3 parts merged into 1" in r.output
    visible = [p for p in client.parts("squash").to_pylist() if p["visible"]]
    by_day = sorted(p["partition"] for p in visible)
    assert by_day == ['["2024-01-01"]', '["2024-01-02"]', '["2024-01-02"]', '["2024-01-02"]']
    r = run("compact", "squash", "--kind", "major")
    assert r.exit_code == 0, r.output
    assert len([p for p in client.parts("squash").to_pylist() if p["visible"]]) == 2
    assert sorted_rows(client.read("squash")) == before


# -- transactions ------------------------------------------------------------------------------


def test_txn_list_and_kill(run, client: Client) -> None:
    create(run, "killme")
    tx = client.begin()
    tx.insert("killme", sample(1, 7, D1))
    r = run("txn", "list")
    assert r.exit_code == 0, r.output
    assert tx.id in r.output and "running" in r.output
    r = run("txn", "list", "--json")
    listed = {t["id"]: t for t in map(json.loads, r.output.splitlines())}
    assert listed[tx.id]["rows"] == 7 and listed[tx.id]["snapshot"] == tx.snapshot

    r = run("txn", "kill", tx.id)
    assert r.exit_code == 0, r.output
    assert f"transaction {tx.id}: aborted" in r.output
    with pytest.raises(TransactionAborted):
        tx.commit()
    assert client.read("killme").num_rows == 0
    r = run("txn", "list", "--json")
    assert tx.id not in r.output


def test_snapshot(run, client: Client) -> None:
    create(run, "snap")
    with client.transaction() as tx:
        tx.insert("snap", sample(1, 1, D1))
    r = run("snapshot")
    assert r.exit_code == 0, r.output
    assert int(r.output.strip()) == client.snapshot() >= tx.csn


# -- bad input ---------------------------------------------------------------------------------


def assert_clean_error(r: Result, *words: str, code: int = 2) -> None:
    """Exit code ``code`` (2: invalid input), one 'error:' line naming what was wrong, no traceback."""
    assert r.exit_code == code, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert "Traceback" not in r.output
    for w in words:
        assert w in lines[0], r.output


def test_unknown_table(run, client: Client, tmp_path: Path) -> None:
    before = client.snapshot()
    assert_clean_error(run("read", "no_such_table"), "no_such_table", code=3)
    assert_clean_error(run("parts", "no_such_table"), "no_such_table", code=3)
    csv = write_csv(tmp_path / "x.csv", sample(1, 1, D1))
    assert_clean_error(run("insert", "no_such_table", csv), "no_such_table", code=3)
    assert_clean_error(run("compact", "no_such_table"), "no_such_table", code=3)
    assert client.snapshot() == before


def test_bad_input_changes_nothing(run, client: Client, tmp_path: Path) -> None:
    create(run, "strict")
    before = client.snapshot()
    wrong = pa.table({"id": [1], "nickname": ["x"], "day": pa.array([D1], pa.date32())})
    assert_clean_error(run("insert", "strict", write_csv(tmp_path / "w.csv", wrong)), "nickname")
    (tmp_path / "data.txt").write_text("id\n1\n")
    assert_clean_error(run("insert", "strict", tmp_path / "data.txt"), "data.txt")
    assert_clean_error(run("table", "create", "a/b", "--schema", "id:int64"), "a/b")
    assert_clean_error(run("table", "create", "t2", "--schema", "id:int65"), "int65")
    assert_clean_error(run("table", "create", "strict", "--schema", SCHEMA), "strict", "exists")
    assert_clean_error(run("read", "strict", "--snapshot", before + 10**6), "snapshot", code=3)
    assert_clean_error(
        run("txn", "kill", "T1-999-nohost"), "T1-999-nohost", code=3
    )  # TransactionNotFound: nothing was aborted
    assert client.snapshot() == before
    assert client.read("strict").num_rows == 0
    assert "t2" not in client.tables()


def test_unreachable_replica(cluster: LocalCluster) -> None:
    r = CliRunner().invoke(cli, ["snapshot", "--replica", "127.0.0.1:1"])
    assert_clean_error(r, "127.0.0.1:1", code=5)


def test_gc(run) -> None:
    r = run("gc")
    if hasattr(Client, "gc"):
        assert r.exit_code == 0, r.output
    else:
        assert_clean_error(r, "not available yet")


def test_parse_schema() -> None:
    s = parse_schema("id:int64!, ts:timestamp[us, UTC], amount:decimal128(10, 2), tags:list<string>")
    assert s == pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("amount", pa.decimal128(10, 2)),
            ("tags", pa.list_(pa.string())),
        ]
    )
    with pytest.raises(InvalidInput, match="name:type"):
        parse_schema("id")


def test_every_command_has_help() -> None:
    runner = CliRunner()
    commands = [
        [],
        ["zk", "start"],
        ["replica", "start"],
        ["table", "create"],
        ["table", "list"],
        ["insert"],
        ["read"],
        ["parts"],
        ["compact"],
        ["gc"],
        ["snapshot"],
        ["status"],
        ["txn", "list"],
        ["txn", "kill"],
        ["quickstart"],
    ]
    for args in commands:
        r = runner.invoke(cli, [*args, "--help"])
        assert r.exit_code == 0, (args, r.output)
        assert "Usage: " in r.output and "--help" in r.output


def test_replica_start_refuses_a_bad_setting() -> None:
    r = CliRunner().invoke(
        cli,
        [
            "replica",
            "start",
            "--zk",
            "127.0.0.1:1",
            "--storage",
            "/tmp/x",
            "--host-id",
            "r9",
            "--data-dir",
            "/tmp/x",
            "--retain-entries",
            "-1",
        ],
    )
    assert r.exit_code == 2 and "--retain-entries" in r.output and "x>=0" in r.output


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--id", "1", "--members", "10.0.0.1:2181:2888"], "bad --members: member '10.0.0.1:2181:2888'"),
        (["--id", "1", "--members", "h1:2181:2888:x,h2:2181:2888:3888"], "bad --members: member 'h1:2181:2888:x'"),
        (["--id", "1", "--members", "h1:2181:2888:3888,,h2:1:2:3"], "bad --members"),
        (["--id", "1", "--members", "h1:2181:2888:99999"], "outside 1..65535"),
        (["--id", "1", "--members", "h1:2181:2888:3888,h1:2181:2889:3889"], "both use h1:2181"),
        (["--id", "4", "--members", "h1:1:2:3,h2:1:2:3,h3:1:2:3"], "--id 4 names no member"),
        (["--id", "1"], "--id and --members go together"),
        (["--members", "h1:1:2:3"], "--id and --members go together"),
        (["--id", "1", "--members", "h1:1:2:3", "--port", "5"], "--port is for a standalone server"),
    ],
)
def test_zk_start_member_refuses_bad_arguments(args: list[str], expected: str, tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["zk", "start", "--dir", str(tmp_path / "zk"), *args])
    assert r.exit_code == 2, r.output
    assert expected in r.output
    assert not (tmp_path / "zk").exists()  # nothing started, nothing written


def test_replica_server_refuses_a_bad_setting(capsys: pytest.CaptureFixture[str]) -> None:
    from replicas.server import main

    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "--zk",
                "127.0.0.1:1",
                "--storage",
                "/tmp/x",
                "--host-id",
                "r9",
                "--data-dir",
                "/tmp/x",
                "--retain-entries",
                "-1",
            ]
        )
    assert exit_.value.code == 2
    assert "replica setting retain_entries must be at least 0" in capsys.readouterr().err


# -- servers, as subprocesses -------------------------------------------------------------------


def cli_argv(*args: str) -> list[str]:
    exe = ROOT / ".venv" / "bin" / "mergetxn"
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "mergetxn.cli"]
    return [*base, *map(str, args)]


def cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def wait_for_line(proc: subprocess.Popen, marker: str, timeout: float = 90.0) -> str:
    """Read stdout until a line holds ``marker``; a watchdog kills a process that never says it."""
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            if marker in line:
                return line
    finally:
        timer.cancel()
    raise AssertionError(f"process ended (rc={proc.wait()}) without printing {marker!r}")


def test_zk_start_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        cli_argv("zk", "start", "--dir", tmp_path / "zk"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=cli_env(),
        cwd=ROOT,
    )
    try:
        line = wait_for_line(proc, "ZooKeeper serving at")
        address = line.split("serving at ")[1].split()[0]
        assert wait_for_line(proc, "READY").split() == ["READY", address]  # the line a script waits for
        with kazoo(address) as zk:
            zk.ensure_path("/cli-probe")
            assert zk.exists("/cli-probe")
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=60)[0]
        assert proc.returncode == 0, rest
        assert "ZooKeeper stopped" in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_replica_start_joins_the_cluster(cluster: LocalCluster, client: Client, tmp_path: Path) -> None:
    create_csn = client.create_table("joined", ARROW_SCHEMA, partition_by=["day"])
    with client.transaction() as tx:
        tx.insert("joined", sample(1, 5, D1))
    proc = subprocess.Popen(
        cli_argv(
            "replica",
            "start",
            "--zk",
            cluster.zk_address,
            "--storage",
            cluster.storage_url,
            "--host-id",
            "clireplica",
            "--data-dir",
            tmp_path / "r",
            "--txn-max-seconds",
            60,
            "--retain-entries",
            123,
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**cli_env(), "MERGETXN_GC_GRACE_SECONDS": "42"},
        cwd=ROOT,
    )
    try:
        address = wait_for_line(proc, "READY").split()[1]
        info = connect(address).call("info")
        settings = info["settings"]
        assert (settings["retain_entries"], settings["gc_grace_seconds"]) == (123, 42.0)
        assert info["switch_interval"] == pytest.approx(SWITCH_INTERVAL)  # the same process set-up as replicas.server
        r = CliRunner().invoke(cli, ["read", "joined", "--snapshot", tx.csn, "--replica", address])
        assert r.exit_code == 0, r.output
        assert "5 rows of joined" in r.output
        assert create_csn < tx.csn
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        assert proc.returncode == 0
        assert time.monotonic() - started < 30
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- quickstart --------------------------------------------------------------------------------


@pytest.mark.slow
def test_quickstart_end_to_end(tmp_path: Path) -> None:
    workdir = tmp_path / "qs"
    proc = subprocess.run(  # the timeout catches a hang; its speed is benchmarks' business
        cli_argv("quickstart", "--workdir", workdir),
        capture_output=True,
        text=True,
        env={**cli_env(), "COLUMNS": "200"},
        cwd=ROOT,
        timeout=400,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for key in (
        "concurrent writers",
        "commits/s",
        "ConflictError",
        "lost to",
        "rebased on",
        "multi-table commit",
        "snapshot read on r2",
        "time travel",
        "keys table: first committer wins per key",
        "key {'customer': 1}",
        "two lock groups of customer 2 both committed",
        "Spark job: two tables, one txn",
        "Spark reads on r2 with read_table(snapshot=...)",
        "quickstart summary",
        "all 10 steps behaved as expected",
    ):
        assert key in out, f"{key!r} missing from:\n{out}"
    assert "FAILED" not in out
    # Everything it started is stopped: no process still runs from its workdir (the Spark JVM's
    # command line names it too, through spark.local.dir).
    ps = subprocess.run(["ps", "axww", "-o", "args"], capture_output=True, text=True).stdout
    assert str(workdir) not in ps


def test_quickstart_refuses_a_used_workdir(tmp_path: Path) -> None:
    (tmp_path / "something").write_text("mine")
    r = CliRunner().invoke(cli, ["quickstart", "--workdir", str(tmp_path)])
    assert_clean_error(r, str(tmp_path), "not an empty directory")
    assert [p.name for p in tmp_path.iterdir()] == ["something"]


@pytest.mark.slow
def test_quickstart_reports_a_wrong_outcome(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step whose outcome is wrong fails the run (exit code 1) with its message, later steps
    are skipped, and the cluster is still stopped."""
    from rich.console import Console

    from mergetxn.tools import quickstart

    def wrong(self: quickstart.Workload) -> str:
        raise quickstart.StepFailed("B's UPDATE committed; it should have lost to A")

    monkeypatch.setattr(quickstart.Workload, "conflict", wrong)
    out = Console(record=True, width=200)
    code = quickstart.run(tmp_path / "qs", keep=False, out=out)
    text = out.export_text()
    assert code == 1, text
    assert "B's UPDATE committed; it should have lost to A" in text
    assert "quickstart FAILED" in text
    summary = text.split("quickstart summary")[1]
    assert "skipped" in summary.split("time travel")[1].splitlines()[0]
    assert "skipped" in summary.split("Spark job")[1].splitlines()[0]
    ps = subprocess.run(["ps", "axww", "-o", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path / "qs") not in ps
