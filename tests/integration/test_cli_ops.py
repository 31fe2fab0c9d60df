"""The operator's command line: exit codes, --timeout, --json, streamed reads and batched inserts,
logging, the replica config file, ``mergetxn status`` and the replicas' metrics endpoint.

Client commands run in-process through click's CliRunner against a real cluster (ZooKeeper and
replica processes); what a command did is checked through the Python client. Commands whose
process set-up is under test (logging, ``replica start``) run as subprocesses.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from support.cluster import environ, make_cluster  # tests/ is on sys.path
from support.data import sorted_rows
from support.waiting import wait_until

import mergetxn.cli.files as cli_files
from coordinator import LocalCluster
from coordinator.errors import ConflictError, MergetxnError, StorageError
from mergetxn.cli import EXIT_CODES, cli, exit_code
from mergetxn.client import Client, Transaction
from mergetxn.local.zkserver import ZooKeeperServer

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("day", pa.date32())])
D1, D2 = dt.date(2024, 1, 1), dt.date(2024, 1, 2)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator[LocalCluster]:
    """Two replicas serving metrics, on the session's ZooKeeper in a chroot of their own."""
    with make_cluster(
        tmp_path_factory,
        zk_server,
        "cliops",
        replicas=2,
        metrics=True,
        settings={"merge_interval": 0, "gc_interval": 0},
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


def rows(first: int, n: int, day: dt.date = D1) -> pa.Table:
    ids = list(range(first, first + n))
    return pa.table({"id": ids, "name": [f"n{i}" for i in ids], "day": pa.array([day] * n, pa.date32())}, schema=SCHEMA)


def one_error_line(r: Result, code: int, *words: str) -> None:
    assert r.exit_code == code, (r.exit_code, r.output)
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert "Traceback" not in r.output
    for w in words:
        assert w in lines[0], r.output


def table(client: Client, name: str, partitioned: bool = True) -> str:
    client.create_table(name, SCHEMA, partition_by=["day"] if partitioned else [], auto_merge=False)
    return name


# -- version, exit codes, timeouts -------------------------------------------------------------


def test_version_and_exit_codes_in_help() -> None:
    r = CliRunner().invoke(cli, ["--version"])
    assert r.exit_code == 0 and r.output.startswith("mergetxn "), r.output
    r = CliRunner().invoke(cli, ["--help"])
    assert r.exit_code == 0
    for code in EXIT_CODES:
        assert f" {code}  " in r.output, (code, r.output)


def test_exit_code_of_each_error_kind() -> None:
    class AuthenticationFailed(MergetxnError):  # what the security work adds to coordinator.errors
        pass

    from coordinator import errors

    assert exit_code(AuthenticationFailed("no")) == 6
    assert exit_code(ConflictError("lost")) == 4
    assert exit_code(errors.TableNotFound("t")) == 3
    assert exit_code(errors.SnapshotUnavailable("s")) == 3
    assert exit_code(errors.InvalidInput("bad")) == 2
    assert exit_code(errors.OutcomeUnknown("?")) == 5
    assert exit_code(errors.TransactionAborted("killed")) == 7
    assert exit_code(errors.CorruptPart("bits")) == 8
    assert exit_code(MergetxnError("replica action failed")) == 70
    assert exit_code(StorageError("storage put of 'x' failed: No space left on device (ENOSPC)", path="x")) == 5
    assert len(set(EXIT_CODES)) == len(EXIT_CODES)


def test_success_usage_and_not_found(cluster: LocalCluster, client: Client) -> None:
    table(client, "codes")
    assert invoke(cluster, "table", "list").exit_code == 0
    r = invoke(cluster, "read")  # no TABLE: click's usage error
    assert r.exit_code == 2 and "Usage:" in r.output
    one_error_line(invoke(cluster, "read", "codes", "--format", "table", "-o", "x.parquet"), 2, "--format table")
    one_error_line(invoke(cluster, "read", "nope"), 3, "nope")
    one_error_line(invoke(cluster, "read", "codes", "--snapshot", client.snapshot() + 10**6), 3, "snapshot")


def test_conflict_exit_code(
    cluster: LocalCluster, client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An `insert --overwrite` that another overwrite of the same partition beats between its
    begin and its commit loses with exit code 4 and changes nothing."""
    table(client, "contested")
    with client.transaction() as tx:
        tx.insert("contested", rows(1, 2))
    winner_rows = rows(100, 1)
    stage = Transaction.overwrite
    beaten: list[str] = []

    def beaten_first(self: Transaction, *args: object, **kwargs: object) -> int:
        if not beaten:  # the CLI's own overwrite: the winner's (this same method) goes straight through
            beaten.append(self.id)
            with cluster.client(0) as other, other.transaction() as winner:
                winner.overwrite("contested", winner_rows)
        return stage(self, *args, **kwargs)

    monkeypatch.setattr(Transaction, "overwrite", beaten_first)
    pq.write_table(rows(50, 3), tmp_path / "mine.parquet")
    r = invoke(cluster, "insert", "contested", tmp_path / "mine.parquet", "--overwrite")
    one_error_line(r, 4, "lost to")
    monkeypatch.undo()
    assert sorted_rows(client.read("contested")) == sorted_rows(winner_rows)


def test_a_replica_that_never_answers_fails_within_timeout() -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections (the kernel does) and never answers
    address = f"127.0.0.1:{silent.getsockname()[1]}"
    try:
        started = time.monotonic()
        r = CliRunner().invoke(cli, ["snapshot", "--replica", address, "--timeout", "1"])
        one_error_line(r, 5, address)
        r = CliRunner(env={"MERGETXN_TIMEOUT": "1"}).invoke(cli, ["table", "list", "--replica", address])
        one_error_line(r, 5, address)
        r = CliRunner().invoke(cli, ["status", "--replica", address, "--timeout", "1", "--json"])
        assert r.exit_code == 1, r.output
        assert any(address in p for p in json.loads(r.stdout)["problems"])
        assert time.monotonic() - started < 20  # three commands, 1 s each (10 min before)
    finally:
        silent.close()


def test_unexpected_error_is_one_line_and_logged_at_debug(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: Client) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(Client, "snapshot", broken)
    one_error_line(invoke(cluster, "snapshot"), 70, "RuntimeError: boom")
    log_file = tmp_path / "cli.log"
    r = invoke(cluster, "--log-level", "DEBUG", "--log-file", log_file, "snapshot")
    one_error_line(r, 70, "boom")
    text = log_file.read_text()
    assert "Traceback" in text and "RuntimeError: boom" in text
    invoke(cluster, "--log-level", "WARNING", "table", "list")  # leave this process's logging quiet


# -- --json ------------------------------------------------------------------------------------


def test_json_output_of_every_data_command(cluster: LocalCluster, client: Client, tmp_path: Path) -> None:
    r = invoke(
        cluster,
        "table",
        "create",
        "js",
        "--schema",
        "id:int64,name:string,day:date32",
        "--partition-by",
        "day",
        "--no-auto-merge",
        "--json",
    )
    assert r.exit_code == 0, r.output
    created = json.loads(r.stdout)
    # The compaction below counts part files merged (a lone inlined part would be flushed too).
    client.alter_table("js", inline_rows=0)
    assert created["table"] == "js" and created["csn"] == client.table("js").created_csn
    assert "js" in json.loads(invoke(cluster, "table", "list", "--json").stdout)

    pq.write_table(pa.concat_tables([rows(1, 3, D1), rows(4, 2, D2)]), tmp_path / "in.parquet")
    r = invoke(cluster, "insert", "js", tmp_path / "in.parquet", "--json")
    inserted = json.loads(r.stdout)
    assert (inserted["rows"], inserted["parts"]) == (5, 2) and inserted["csn"] == client.snapshot()
    assert json.loads(invoke(cluster, "snapshot", "--json").stdout) == {"snapshot": client.snapshot()}

    listed = [json.loads(line) for line in invoke(cluster, "parts", "js", "--json").stdout.splitlines()]
    assert sorted(p["partition"] for p in listed) == [["2024-01-01"], ["2024-01-02"]]  # values, not JSON text
    assert {p["creation_tid"] for p in listed} == {inserted["tid"]}

    tx = client.begin()
    running = [json.loads(line) for line in invoke(cluster, "txn", "list", "--json").stdout.splitlines()]
    assert tx.id in {t["id"] for t in running}
    killed = json.loads(invoke(cluster, "txn", "kill", tx.id, "--json").stdout)
    assert killed["state"] == "aborted"

    for _ in range(2):
        with client.transaction() as t:
            t.insert("js", rows(10, 1, D1))
    compacted = json.loads(invoke(cluster, "compact", "js", "--json").stdout)
    assert (compacted["merged"], compacted["into"]) == (3, 1) and compacted["csn"] == client.snapshot()
    report = json.loads(invoke(cluster, "gc", "--json", "--grace-seconds", "3600").stdout)
    assert {"removed", "kept", "min_snapshot", "watermark"} <= report.keys()


# -- read --format, insert by batches -----------------------------------------------------------


def test_read_formats_equal_the_table(cluster: LocalCluster, client: Client, tmp_path: Path) -> None:
    table(client, "formats")
    for i in range(3):  # several parts: the output is streamed part by part
        with client.transaction() as tx:
            tx.insert("formats", pa.concat_tables([rows(10 * i, 4, D1), rows(100 + 10 * i, 3, D2)]))
    expected = sorted_rows(client.read("formats"))

    def from_csv(data: bytes) -> pa.Table:
        convert = pcsv.ConvertOptions(column_types={f.name: f.type for f in SCHEMA})
        return pcsv.read_csv(io.BytesIO(data), convert_options=convert)

    def from_json(data: bytes) -> pa.Table:
        objs = [json.loads(line) for line in data.decode().splitlines()]
        for o in objs:
            o["day"] = dt.date.fromisoformat(o["day"])
        return pa.Table.from_pylist(objs, schema=SCHEMA)

    readers = {"csv": from_csv, "json": from_json, "parquet": lambda b: pq.read_table(io.BytesIO(b))}
    for fmt, parse in readers.items():
        r = invoke(cluster, "read", "formats", "--format", fmt)  # to stdout, the summary on stderr
        assert r.exit_code == 0, r.output
        assert sorted_rows(parse(r.stdout_bytes)) == expected, fmt
        assert "wrote 21 rows of formats" in r.stderr
        out = tmp_path / f"out.{'jsonl' if fmt == 'json' else fmt}"
        r = invoke(cluster, "read", "formats", "-o", out)  # the format from the extension
        assert r.exit_code == 0, r.output
        assert f"wrote 21 rows of formats at snapshot {client.snapshot()} to {out}" in r.stdout
        assert sorted_rows(parse(out.read_bytes())) == expected, fmt
    r = invoke(cluster, "read", "formats", "--limit", 5)
    assert r.exit_code == 0 and "21 rows of formats" in r.output and "(showing 5)" in r.output


@pytest.mark.parametrize("kind", ["parquet", "csv"])
def test_insert_by_batches_commits_once(
    kind: str, cluster: LocalCluster, client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = table(client, f"batched_{kind}")
    data = pa.concat_tables([rows(0, 700, D1), rows(700, 350, D2)])
    path = tmp_path / f"big.{kind}"
    if kind == "parquet":
        pq.write_table(data, path, row_group_size=100)
    else:
        pcsv.write_csv(data, path)
        monkeypatch.setattr(cli_files, "CSV_BLOCK_BYTES", 2048)  # many blocks of a few dozen rows
    before = client.snapshot()
    r = invoke(cluster, "insert", name, path, "--batch-rows", 200, "--json")
    assert r.exit_code == 0, r.output
    outcome = json.loads(r.stdout)
    assert outcome["rows"] == 1050 and outcome["parts"] >= 5  # written batch by batch (one batch: 2 parts)
    parts = client.parts(name).to_pylist()
    assert {p["creation_csn"] for p in parts} == {outcome["csn"]}  # one commit
    assert client.snapshot() == before + 1
    assert sorted_rows(client.read(name)) == sorted_rows(data)

    replacement = rows(5000, 450, D1)  # an overwrite by batches replaces D1 once, keeps D2
    pq.write_table(replacement, tmp_path / "d1.parquet", row_group_size=100)
    r = invoke(cluster, "insert", name, tmp_path / "d1.parquet", "--overwrite", "--batch-rows", 100)
    assert r.exit_code == 0, r.output
    assert sorted_rows(client.read(name)) == sorted_rows(pa.concat_tables([replacement, rows(700, 350, D2)]))


def test_an_overwrite_by_batches_replaces_each_partition_of_the_file_once(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    """Batches of an `insert --overwrite` whose partitions straddle them (D1; D1 and D2; D2): the
    file's rows replace what D1 and D2 held, each partition once, D3 is kept, in one commit, and
    the JSON outcome counts a part per partition of each batch."""
    d3 = dt.date(2024, 1, 3)
    name = table(client, "straddle")
    with client.transaction() as tx:
        tx.insert(name, pa.concat_tables([rows(0, 5, D1), rows(10, 5, D2), rows(20, 5, d3)]))
    data = pa.concat_tables([rows(100, 150, D1), rows(300, 150, D2)])  # batches of 100: D1 | D1, D2 | D2 ...
    pq.write_table(data, tmp_path / "straddle.parquet", row_group_size=100)
    before = client.snapshot()
    r = invoke(cluster, "insert", name, tmp_path / "straddle.parquet", "--overwrite", "--batch-rows", 100, "--json")
    assert r.exit_code == 0, r.output
    outcome = json.loads(r.stdout)
    assert (outcome["rows"], outcome["parts"], outcome["overwrite"]) == (300, 4, True)
    assert client.snapshot() == before + 1 and outcome["csn"] == before + 1
    assert sorted_rows(client.read(name)) == sorted_rows(pa.concat_tables([data, rows(20, 5, d3)]))


def test_a_bad_batch_changes_nothing_and_leaves_no_files(
    cluster: LocalCluster, client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = table(client, "badbatch")
    good = "\n".join(f"{i},n{i},2024-01-01" for i in range(300))
    (tmp_path / "bad.csv").write_text(f"id,name,day\n{good}\nnot-a-number,x,2024-01-01\n")
    monkeypatch.setattr(cli_files, "CSV_BLOCK_BYTES", 1024)
    before = client.snapshot()
    r = invoke(cluster, "insert", name, tmp_path / "bad.csv", "--batch-rows", 50)
    one_error_line(r, 2, "bad.csv")
    assert client.snapshot() == before
    storage = Path(cluster.storage_url) / name
    assert not storage.exists() or not [p for p in storage.rglob("*") if p.is_file()]


# -- logging -------------------------------------------------------------------------------------


def cli_run(*args: object, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mergetxn.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})},
    )


def test_log_level_debug_writes_own_lines_not_kazoo(cluster: LocalCluster, tmp_path: Path) -> None:
    log_file = tmp_path / "debug.log"
    p = cli_run("--log-level", "DEBUG", "--log-file", log_file, "status", "--replica", cluster.replica_addresses[0])
    assert p.returncode == 0, p.stdout + p.stderr
    lines = log_file.read_text().splitlines()
    assert any(" mergetxn.tools.status DEBUG replica r0 at " in line for line in lines), lines
    assert not [line for line in lines if " kazoo" in line], lines  # status spoke to ZooKeeper through kazoo
    assert "DEBUG" not in p.stderr  # the file, not stderr

    asked = tmp_path / "kazoo.log"
    p = cli_run(
        "--log-level", "DEBUG,kazoo=DEBUG", "--log-file", asked, "status", "--replica", cluster.replica_addresses[0]
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert [line for line in asked.read_text().splitlines() if " kazoo" in line and " DEBUG " in line]


def test_bad_log_level_is_a_usage_error() -> None:
    r = CliRunner().invoke(cli, ["--log-level", "LOUD", "snapshot", "--replica", "127.0.0.1:1"])
    assert r.exit_code == 2 and "LOUD" in r.output


# -- replica start --config ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_replica_config_file_with_flags_and_environment_over_it(cluster: LocalCluster, tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "replica.toml"
    config.write_text(
        f'zk = "{cluster.zk_address}"\nstorage = "{cluster.storage_url}"\nhost-id = "fromfile"\n'
        f'data_dir = "{tmp_path / "wal"}"\nport = {port}\nmetrics-port = 0\nretain_entries = 77\n'
        'merge_min_parts = 5\ngc_grace_seconds = 33\nroot = "/fromfile"\n'  # its own cluster: status stays clean
    )
    assert tomllib.loads(config.read_text())["port"] == port
    log_file = tmp_path / "replica.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mergetxn.cli",
            "--log-level",
            "DEBUG",
            "--log-file",
            str(log_file),
            "replica",
            "start",
            "--config",
            str(config),
            "--retain-entries",
            "88",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "MERGETXN_GC_GRACE_SECONDS": "42"},
    )
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line.strip())
            if line.startswith("READY "):
                break
        assert lines[-1] == f"READY 127.0.0.1:{port}", lines  # the fixed port from the file
        metrics_url = next(line.split()[1] for line in lines if line.startswith("METRICS "))
        info = Client(f"127.0.0.1:{port}").call("info")
        assert info["host_id"] == "fromfile"
        assert info["settings"]["retain_entries"] == 88  # the flag over the file
        assert info["settings"]["gc_grace_seconds"] == 42.0  # the environment over the file
        assert info["settings"]["merge_min_parts"] == 5  # the file over the default
        assert metrics_url == f"http://{info['metrics_address']}/metrics"
        assert "mergetxn_applied_csn" in urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    finally:
        proc.terminate()
        proc.wait(30)
    lines = log_file.read_text().splitlines()  # the replica's own DEBUG and INFO lines, no kazoo chatter
    assert any(f"replicas.server INFO replica fromfile serving at 127.0.0.1:{port}" in line for line in lines), lines
    assert not [line for line in lines if " kazoo" in line and " DEBUG " in line], lines


def test_replica_config_file_with_an_unknown_setting(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('zk = "h:1"\nretain_entriez = 5\n')
    r = CliRunner().invoke(cli, ["replica", "start", "--config", str(config)])
    assert r.exit_code == 2 and "retain_entriez" in r.output and "retain-entries" in r.output


# -- status ----------------------------------------------------------------------------------------


def status(cluster: LocalCluster, *args: object, replica: int = 0) -> tuple[int, dict]:
    r = invoke(cluster, "status", "--json", *args, replica=replica)
    return r.exit_code, json.loads(r.stdout)


def test_status_of_a_healthy_cluster(cluster: LocalCluster, client: Client) -> None:
    table(client, "healthy")
    with client.transaction() as tx:
        tx.insert("healthy", rows(1, 3))
    held = client.begin()  # a running transaction holding its snapshot
    try:
        code, report = status(cluster)
        assert code == 0 and report["healthy"] and report["problems"] == [], report
        members = report["zookeeper"]["members"]
        assert [m["mode"] for m in members] == ["standalone"]
        assert set(report["replicas"]) == {"r0", "r1"}
        for h, r in report["replicas"].items():
            assert r["state"] == "ok" and r["address"] == cluster.replica_addresses[int(h[1:])]
            assert r["applied_csn"] >= tx.csn and r["lag_seconds"] <= 30
            assert r["metrics_address"]
        assert report["replicas"]["r0"]["running_transactions"] >= 1
        assert report["oldest_snapshot"]["snapshot"] <= held.snapshot
        assert report["log"]["end_csn"] >= tx.csn and report["log"]["entries"] >= 1
        r = invoke(cluster, "status")
        assert r.exit_code == 0 and "healthy" in r.stdout and "standalone" in r.stdout
        by_zk = invoke(cluster, "status", "--zk", cluster.zk_address, "--json")
        assert by_zk.exit_code == 0 and set(json.loads(by_zk.stdout)["replicas"]) == {"r0", "r1"}
    finally:
        held.rollback()


def test_status_names_a_zookeeper_member_that_is_down(cluster: LocalCluster) -> None:
    server, _, chroot = cluster.zk_address.partition("/")
    dead = f"127.0.0.1:{free_port()}"
    r = invoke(cluster, "status", "--zk", f"{server},{dead}/{chroot}", "--json")
    assert r.exit_code == 1, r.output
    report = json.loads(r.stdout)
    assert [p for p in report["problems"] if dead in p and "down" in p], report["problems"]


def test_status_names_a_killed_replica(cluster: LocalCluster) -> None:
    cluster.kill_replica(1)
    try:
        code, report = status(cluster)
        assert code == 1
        assert report["replicas"]["r1"]["state"] in ("unreachable", "down")
        assert [p for p in report["problems"] if "replica r1" in p], report["problems"]
        assert report["replicas"]["r0"]["state"] == "ok"
        r = invoke(cluster, "status")
        assert r.exit_code == 1 and "UNHEALTHY" in r.stdout and "replica r1" in r.stdout
        assert status(cluster, "--ignore-host", "r1")[0] == 0  # retired for good: shown, not unhealthy
    finally:
        cluster.start_replica(1)


def test_status_names_a_lagging_replica(cluster: LocalCluster, client: Client, tmp_path: Path) -> None:
    """r1's follower is held at the follower_apply failpoint (replicas/failpoints.py) while r0
    commits: r1 lags by that entry until it is let go."""
    table(client, "lagging")
    cluster.kill_replica(1)
    failpoints = tmp_path / "failpoints"
    failpoints.mkdir()
    with environ({"MERGETXN_FAILPOINTS": str(failpoints)}):
        cluster.start_replica(1)
    armed = failpoints / "follower_apply"
    try:
        wait_until(
            lambda: status(cluster)[1]["replicas"]["r1"]["applied_csn"] == client.snapshot(),
            60,
            "r1 to catch up after its restart",
        )
        armed.touch()
        with client.transaction() as tx:
            tx.insert("lagging", rows(1, 1))
        wait_until((failpoints / "follower_apply.reached").exists, 30, "r1's follower to hold the entry")

        def seen_behind() -> dict | None:
            r1 = status(cluster, "--max-lag-seconds", 3600)[1]["replicas"]["r1"]
            return r1 if r1["lag_entries"] >= 1 and r1["lag_seconds"] > 0 else None

        r1 = wait_until(seen_behind, 30, "r1's log-tail thread to see the entry it has not applied")
        assert r1["applied_csn"] < tx.csn
        code, report = status(cluster, "--max-lag-seconds", 3600)
        assert code == 0, report["problems"]  # behind, within the threshold
        code, report = status(cluster, "--max-lag-seconds", 0)
        assert code == 1
        assert [p for p in report["problems"] if p.startswith("replica r1 lags")], report["problems"]
        assert not [p for p in report["problems"] if "r0" in p], report["problems"]
    finally:
        armed.unlink(missing_ok=True)
    wait_until(lambda: status(cluster)[0] == 0, 60, "r1 to catch up once let go")
    cluster.kill_replica(1)
    cluster.start_replica(1)  # without failpoints, for the tests after this one


# -- metrics ---------------------------------------------------------------------------------------


def scrape(address: str) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    out = {}
    for line in body.splitlines():
        if line.startswith("mergetxn_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_endpoint_moves_with_commits_and_conflicts(cluster: LocalCluster, client: Client) -> None:
    table(client, "metered")
    with client.transaction() as tx:
        tx.insert("metered", rows(1, 2))
    address = client.call("info")["metrics_address"]
    before = scrape(address)
    label = '{replica="r0"}'
    for i in range(3):
        with client.transaction() as tx:
            tx.insert("metered", rows(10 + i, 1))
    loser = client.begin()
    loser.overwrite("metered", rows(50, 1))
    with client.transaction() as winner:
        winner.overwrite("metered", rows(60, 1))
    with pytest.raises(ConflictError):
        loser.commit()
    held = client.begin()
    try:
        after = scrape(address)
    finally:
        held.rollback()
    assert after[f"mergetxn_commits_total{label}"] - before[f"mergetxn_commits_total{label}"] == 4
    assert (
        after[f"mergetxn_commit_latency_seconds_count{label}"] - before[f"mergetxn_commit_latency_seconds_count{label}"]
        == 4
    )
    kind = 'mergetxn_conflicts_total{kind="PART_REMOVED_TWICE",replica="r0"}'
    assert after[kind] - before[kind] == 1
    assert after[f"mergetxn_commit_failures_total{label}"] - before[f"mergetxn_commit_failures_total{label}"] == 1
    assert after[f"mergetxn_commit_batches_total{label}"] > before[f"mergetxn_commit_batches_total{label}"]
    assert after[f"mergetxn_applied_csn{label}"] == client.snapshot()
    assert after[f"mergetxn_running_transactions{label}"] == 1
    assert f"mergetxn_lag_seconds{label}" in after and f"mergetxn_cleanup_passes_total{label}" in after
    assert 'mergetxn_merges_total{outcome="committed",replica="r0"}' in after
