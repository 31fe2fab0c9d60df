"""A replica's life as an operator sees it: a host id is one live process's, a start that fails
leaves nothing registered, a replica is retired for good, and a replica restarted after a crash
(its old session's alive node still there) is not taken for a live holder.

``mergetxn replica start`` and ``replica retire`` run as subprocesses (the process set-up is what
is under test); the cluster's replicas are LocalCluster's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from kazoo.client import KazooClient
from support.cluster import make_cluster  # tests/ is on sys.path

from coordinator import LocalCluster
from coordinator.zk.log import CsnLog
from mergetxn.cli import cli
from mergetxn.client import Client
from mergetxn.local.zkserver import ZooKeeperServer

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = pa.schema([("id", pa.int64())])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator[LocalCluster]:
    with make_cluster(
        # inline_rows 0: these tests follow the storage probe at start, which looks for part files (docs/architecture/small-writes.md)
        tmp_path_factory,
        zk_server,
        "lifecycle",
        replicas=2,
        settings={"inline_rows": 0, "merge_interval": 0, "gc_interval": 0},
    ) as c:
        c.client(0).create_table("life", SCHEMA)
        yield c


def cli_run(*args: object, timeout: float = 90) -> subprocess.CompletedProcess:
    """``mergetxn ARGS`` in a process of its own; a start that wrongly serves runs until the
    timeout, and the test then fails on TimeoutExpired (the process is killed)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mergetxn.cli", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")},
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"mergetxn {' '.join(map(str, args))} still ran after {timeout}s: {out}{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def start_args(
    cluster: LocalCluster, host_id: str, data_dir: Path, port: int = 0, storage: str | None = None
) -> list[object]:
    return [
        "replica",
        "start",
        "--zk",
        cluster.zk_address,
        "--root",
        cluster.root,
        "--storage",
        storage or cluster.storage_url,
        "--host-id",
        host_id,
        "--data-dir",
        data_dir,
        "--port",
        port,
        "--session-timeout",
        4,
    ]


def status(cluster: LocalCluster) -> tuple[int, dict]:
    r = CliRunner(env={"MERGETXN_REPLICA": cluster.replica_addresses[0]}).invoke(
        cli, ["status", "--json", "--no-storage-check"], catch_exceptions=False
    )
    return r.exit_code, json.loads(r.stdout)


def registration(cluster: LocalCluster, host_id: str) -> tuple[bytes | None, bool]:
    """The registration node's data (None if absent) and whether an alive node exists."""
    zk = KazooClient(hosts=cluster.zk_address)
    zk.start(timeout=30)
    try:
        layout = CsnLog(zk, cluster.root)
        node = zk.exists(layout.replica_path(host_id))
        data = zk.get(layout.replica_path(host_id))[0] if node else None
        return data, zk.exists(layout.alive_path(host_id)) is not None
    finally:
        zk.stop()
        zk.close()


def commit_one(client: Client, n: int) -> int:
    with client.transaction() as tx:
        tx.insert("life", pa.table({"id": [n]}, schema=SCHEMA))
    return tx.csn


def test_a_host_id_held_by_a_live_replica_is_refused(cluster: LocalCluster, tmp_path: Path) -> None:
    """docs/surface.md#command-line: a second `replica start --host-id r0` exits non-zero naming
    the host id and the live replica's address, and r0 is untouched (same incarnation, commits)."""
    before = cluster.client(0).call("info")["incarnation"]
    p = cli_run(*start_args(cluster, "r0", tmp_path / "dup"))
    assert p.returncode == 2, p.stdout + p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "'r0'" in errors[0] and cluster.replica_addresses[0] in errors[0], p.stderr
    assert "READY" not in p.stdout
    assert not (tmp_path / "dup" / "wal.log").exists()  # it stopped before touching a WAL
    info = cluster.client(0).call("info")
    assert info["incarnation"] == before  # never fenced by the refused process
    csn = commit_one(cluster.client(0), 1)
    assert cluster.client(1).read("life", snapshot=csn).num_rows >= 1
    assert status(cluster)[0] == 0


def test_a_start_on_a_port_in_use_leaves_nothing_registered(cluster: LocalCluster, tmp_path: Path) -> None:
    port = int(cluster.replica_addresses[0].rsplit(":", 1)[1])
    p = cli_run(*start_args(cluster, "busy", tmp_path / "busy", port=port))
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"{port}" in p.stderr and "in use" in p.stderr, p.stderr
    assert registration(cluster, "busy") == (None, False)
    code, report = status(cluster)
    assert code == 0 and "busy" not in report["replicas"], report["problems"]


def test_a_start_on_the_wrong_storage_leaves_nothing_registered(cluster: LocalCluster, tmp_path: Path) -> None:
    commit_one(cluster.client(0), 2)  # the log names parts; the other storage has none of them
    wrong = tmp_path / "elsewhere"
    wrong.mkdir()
    p = cli_run(*start_args(cluster, "lost", tmp_path / "lost", storage=str(wrong)))
    assert p.returncode == 2, p.stdout + p.stderr
    assert "READY" not in p.stdout and "storage" in p.stderr and str(wrong) in p.stderr, p.stderr
    assert registration(cluster, "lost") == (None, False)
    code, report = status(cluster)
    assert code == 0 and "lost" not in report["replicas"], report["problems"]


def test_retire_is_refused_while_alive_and_then_removes_the_replica(cluster: LocalCluster, tmp_path: Path) -> None:
    d = tmp_path / "extra"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mergetxn.cli", *map(str, start_args(cluster, "extra", d))],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        ready = proc.stdout.readline()
        assert ready.startswith("READY "), ready
        address = ready.split()[1]
        refused = cli_run("replica", "retire", "extra", "--zk", cluster.zk_address, "--root", cluster.root)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "alive" in refused.stderr and address in refused.stderr, refused.stderr
        assert Client(address).call("info")["host_id"] == "extra"  # untouched
        assert status(cluster)[1]["replicas"]["extra"]["state"] == "ok"
    finally:
        proc.terminate()
        proc.wait(30)
    code, report = status(cluster)
    assert code == 1 and report["replicas"]["extra"]["state"] == "down", report  # stopped, still registered
    r = cli_run("replica", "retire", "extra", "--replica", cluster.replica_addresses[1])
    assert r.returncode == 0 and "retired" in r.stdout, r.stdout + r.stderr
    code, report = status(cluster)
    assert code == 0 and "extra" not in report["replicas"], report["problems"]
    unknown = cli_run("replica", "retire", "nosuch", "--zk", cluster.zk_address, "--root", cluster.root)
    assert unknown.returncode == 2 and "nosuch" in unknown.stderr, unknown.stderr


def test_a_replica_restarted_after_a_crash_is_not_refused(cluster: LocalCluster) -> None:
    """SIGKILL leaves r1's alive node until its session expires (10 s); the restart on the same
    port finds it, sees its own address in it and starts at once, with a new incarnation."""
    before = cluster.client(1).call("info")["incarnation"]
    cluster.kill_replica(1)
    assert registration(cluster, "r1")[1]  # the dead process's node is still there
    cluster.start_replica(1)
    assert cluster.client(1).call("info")["incarnation"] > before
    csn = commit_one(cluster.client(1), 3)
    assert cluster.client(0).read("life", snapshot=csn).num_rows >= 1


def test_a_port_bound_by_nobody_is_not_a_live_holder() -> None:
    from coordinator.model.records import AliveRecord
    from coordinator.zk.alive import holder

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = f"127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: connections are refused
        assert holder(AliveRecord(address=free), "127.0.0.1:1") is None
        assert holder(AliveRecord(address="127.0.0.1:9"), "127.0.0.1:9") is None  # our own port
        assert holder(AliveRecord(address=""), "127.0.0.1:9") == "unknown"
        with socket.create_server(("127.0.0.1", 0)) as live:
            addr = f"127.0.0.1:{live.getsockname()[1]}"
            assert holder(AliveRecord(address=addr), "127.0.0.1:1") == addr
