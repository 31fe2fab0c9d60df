"""What an operator's tooling reads off a replica: the metrics port's ``/healthz``, ``/ready`` and
``/metrics`` (process, build, ZooKeeper-session and abort-reason metrics), INFO log lines for
commits, aborts and kills, and a log file that ``logrotate`` plus SIGHUP rotates without taking
the replica down.

Replica 1 is restarted with what a test needs in its environment (failpoints, a log file), as in
tests/integration/test_cli_ops.py; each test leaves it running.
"""

from __future__ import annotations

import os
import re
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from support.cluster import environ, make_cluster  # tests/ is on sys.path
from support.waiting import wait_until

from coordinator import LocalCluster
from coordinator.errors import TransactionAborted
from mergetxn.client import Client
from mergetxn.local.zkserver import ZooKeeperServer

SCHEMA = pa.schema([("id", pa.int64())])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator[LocalCluster]:
    with make_cluster(
        tmp_path_factory,
        zk_server,
        "health",
        replicas=2,
        metrics=True,
        settings={"merge_interval": 0, "gc_interval": 0},
    ) as c:
        c.client(0).create_table("h", SCHEMA)
        yield c


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def base(cluster: LocalCluster, i: int) -> str:
    return f"http://{cluster.client(i).call('info')['metrics_address']}"


def commit_one(client: Client, n: int) -> int:
    with client.transaction() as tx:
        tx.insert("h", pa.table({"id": [n]}, schema=SCHEMA))
    return tx.csn


def restart(cluster: LocalCluster, i: int, env: dict[str, str]) -> None:
    cluster.stop_replica(i)
    with environ(env):
        cluster.start_replica(i)


def test_health_paths_and_the_metrics_named(cluster: LocalCluster) -> None:
    client = cluster.client(0)
    tx = client.begin()
    tx.rollback()
    killed = client.begin()
    client.kill(killed.id)
    with pytest.raises(TransactionAborted):
        killed.commit()
    url = base(cluster, 0)
    assert get(f"{url}/healthz") == (200, "ok\n")
    assert get(f"{url}/ready") == (200, "ready\n")
    code, body = get(f"{url}/no/such/path")
    assert code == 404 and "/ready" in body
    code, metrics = get(f"{url}/metrics")
    assert code == 200
    for name in (
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "mergetxn_build_info{",
        "mergetxn_ready{",
        "mergetxn_incarnation{",
    ):
        assert name in metrics, name
    assert re.search(r'mergetxn_zookeeper_session_state\{replica="r0",state="CONNECTED"\} 1\.0', metrics)
    assert re.search(r'mergetxn_zookeeper_session_state\{replica="r0",state="LOST"\} 0\.0', metrics)
    for reason in ("killed", "rolled_back"):
        m = re.search(rf'mergetxn_transactions_aborted_total\{{reason="{reason}",replica="r0"\}} (\S+)', metrics)
        assert m and float(m.group(1)) >= 1, (reason, metrics)
    assert 'mergetxn_transactions_aborted_total{reason="conflict",replica="r0"}' in metrics  # 0, but named


def test_ready_is_503_while_a_replica_catches_up(cluster: LocalCluster, tmp_path: Path) -> None:
    """r1's follower is held at the follower_apply failpoint while r0 commits: /ready says 503
    (with why) until it is let go, /healthz stays 200 (the process serves), r0 stays ready."""
    failpoints = tmp_path / "failpoints"
    failpoints.mkdir()
    restart(cluster, 1, {"MERGETXN_FAILPOINTS": str(failpoints)})
    url = base(cluster, 1)
    wait_until(lambda: get(f"{url}/ready")[0] == 200, 60, "r1 ready after its restart")
    armed = failpoints / "follower_apply"
    armed.touch()
    try:
        csn = commit_one(cluster.client(0), 1)
        wait_until((failpoints / "follower_apply.reached").exists, 30, "r1's follower to hold the entry")
        code, body = wait_until(lambda: (r := get(f"{url}/ready"))[0] == 503 and r, 30, "r1's /ready to say 503")
        assert "catching up" in body, body
        assert get(f"{url}/healthz")[0] == 200
        assert get(f"{base(cluster, 0)}/ready")[0] == 200
        assert re.search(r'mergetxn_ready\{replica="r1"\} 0\.0', get(f"{url}/metrics")[1])
    finally:
        armed.unlink(missing_ok=True)
    wait_until(lambda: get(f"{url}/ready")[0] == 200, 30, "r1 ready once caught up")
    assert cluster.client(1).read("h", snapshot=csn).num_rows >= 1


def test_info_lines_and_sighup_reopens_the_log_file(cluster: LocalCluster, tmp_path: Path) -> None:
    log_file = tmp_path / "r1.log"
    restart(cluster, 1, {"MERGETXN_LOG": "INFO", "MERGETXN_LOG_FILE": str(log_file)})
    try:
        client = cluster.client(1)
        csn = commit_one(client, 2)
        tx = client.begin()
        tx.rollback()
        killed = client.begin()
        client.kill(killed.id)
        text = wait_until(lambda: (t := log_file.read_text()) and killed.id in t and t, 30, "the kill's line")
        assert "recovered in" in text and "replica r1 serving at" in text
        assert re.search(rf"committed a batch of 1 transaction\(s\) at CSN {csn}: ", text), text
        assert f"transaction {tx.id} aborted (rolled_back)" in text
        assert f"transaction {killed.id} aborted (killed)" in text and "killed by an operator" in text
        assert "secret" not in text.lower() and "password" not in text.lower()

        rotated = tmp_path / "r1.log.1"
        os.replace(log_file, rotated)  # what logrotate does, then:
        os.kill(cluster.replica_pid(1), signal.SIGHUP)
        wait_until(log_file.exists, 30, "a new log file at the original path")
        after = commit_one(client, 3)
        wait_until(lambda: f"at CSN {after}: " in log_file.read_text(), 30, "the next commit's line in the new file")
        assert cluster.replica_pid(1) is not None  # SIGHUP did not end it
        assert f"at CSN {after}: " not in rotated.read_text() and f"at CSN {csn}: " in rotated.read_text()
    finally:
        cluster.stop_replica(1)
    text = log_file.read_text()
    assert "replica r1 got SIGTERM: shutting down" in text and "replica r1 stopped" in text
    cluster.start_replica(1)


def _metric(text: str, name: str, reason: str | None = None) -> float:
    labels = (f'reason="{reason}",' if reason else "") + 'replica="r0"'
    m = re.search(rf"^{re.escape(name)}\{{{labels}\}} (\S+)$", text, re.M)
    assert m is not None, f"{name}{{{labels}}} not in /metrics"
    return float(m.group(1))


def test_info_and_the_metrics_report_one_reading(cluster: LocalCluster) -> None:
    """``info`` and ``/metrics`` count from one stats snapshot (replicas/metrics.py ``Stats``): with
    the replica quiet, each counter both report is the same number, the abort reasons included."""
    client = cluster.client(0)
    commit_one(client, 900)
    tx = client.begin()
    tx.rollback()
    info = client.call("info")
    status, text = get(base(cluster, 0) + "/metrics")
    assert status == 200
    assert _metric(text, "mergetxn_commits_total") == info["committer"]["commits"] > 0
    assert _metric(text, "mergetxn_commit_batches_total") == info["committer"]["batches"]
    assert _metric(text, "mergetxn_applied_csn") == info["applied_csn"]
    assert _metric(text, "mergetxn_running_transactions") == info["running_transactions"]
    assert _metric(text, "mergetxn_cleanup_passes_total") == info["cleanup"]["passes"]
    assert info["aborted"]["rolled_back"] >= 1
    assert _metric(text, "mergetxn_transactions_aborted_total", "rolled_back") == info["aborted"]["rolled_back"]
