"""What an operator meets at the edges of the surface: a replica started where no ZooKeeper
answers (nothing listening, or a port that accepts and never answers), a client whose replica
stopped answering, and the command line's output piped into ``head``.

Each failure ends within a bound and names what to do: the ZooKeeper address and ``--zk``; the
replica that stopped answering and the other live replicas; and ``| head`` ends quietly."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from support.cluster import make_cluster  # tests/ is on sys.path
from test_cli import ROOT, cli_argv, cli_env

from coordinator import LocalCluster
from coordinator.errors import ReplicaUnavailable
from mergetxn.client import Client
from mergetxn.local.zkserver import ZooKeeperServer

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])
BOUND = 15.0  # seconds: the default zk_connect_timeout (10 s) and a process's start


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator[LocalCluster]:
    with make_cluster(tmp_path_factory, zk_server, "edges", replicas=3) as c:
        yield c


# -- a replica without ZooKeeper ------------------------------------------------------------------


def closed_port() -> int:
    """A port nothing listens on (bound for a moment, then closed)."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def start_without_zk(argv: list[str], zk: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=cli_env(), cwd=ROOT, timeout=120)
    return done, time.monotonic() - started


def error_line(stderr: str) -> str:
    """The process's last ``error:`` line (a log line of a thread still stopping may follow it)."""
    errors = [line for line in stderr.strip().splitlines() if line.startswith("error: ")]
    assert errors, stderr
    return errors[-1]


def replica_args(zk: str, tmp_path: Path) -> list[str]:
    return ["--zk", zk, "--storage", tmp_path / "s", "--host-id", "lonely", "--data-dir", tmp_path / "d"]


def test_replica_start_without_zookeeper_fails_fast_naming_it(tmp_path: Path) -> None:
    zk = f"127.0.0.1:{closed_port()}"
    done, took = start_without_zk(cli_argv("replica", "start", *replica_args(zk, tmp_path)), zk)
    assert done.returncode == 5, done.stderr  # unavailable, as the command line maps errors
    assert took < BOUND, (took, done.stderr)
    last = error_line(done.stderr)
    assert zk in last and "--zk" in last and "zk_connect_timeout" in last, last
    assert "Traceback" not in done.stderr and "KazooTimeoutError" not in done.stderr


def test_replica_on_a_silent_port_fails_fast_naming_it(tmp_path: Path) -> None:
    """A port that accepts and never answers (the kernel completes the connections of a listening
    socket nobody serves): ``python -m replicas.server``, what LocalCluster runs, gives up at
    zk_connect_timeout with the address and --zk too."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        zk = f"127.0.0.1:{silent.getsockname()[1]}"
        argv = [sys.executable, "-m", "replicas.server", *map(str, replica_args(zk, tmp_path))]
        done, took = start_without_zk(argv, zk)
    assert done.returncode == 5, done.stderr
    assert took < BOUND, (took, done.stderr)
    last = error_line(done.stderr)
    assert zk in last and "--zk" in last and "did not answer within 10 s" in last, last


# -- a replica that stopped answering ---------------------------------------------------------------


def test_a_call_to_a_paused_replica_names_it_and_the_others(cluster: LocalCluster) -> None:
    addresses = cluster.replica_addresses
    client = Client(addresses[0], timeout=2.0, long_calls={})
    try:
        client.create_table("paused_calls", SCHEMA)
        cluster.pause_replica(0)
        try:
            started = time.monotonic()
            with pytest.raises(ReplicaUnavailable) as caught:
                client.read("paused_calls")
            took = time.monotonic() - started
        finally:
            cluster.resume_replica(0)
    finally:
        client.close()
    message = caught.value.message
    assert took < 2.0 * 2 + 1, took  # the call's timeout (a request sent again once at most)
    assert f"replica {addresses[0]} did not answer" in message and "stopped answering" in message, message
    assert addresses[1] in message and addresses[2] in message, message
    assert sorted(caught.value.details["peers"]) == sorted(addresses[1:])


# -- output piped into head ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_table(cluster: LocalCluster) -> str:
    """A table whose every output outgrows a pipe's buffer (64 KiB): the command is still
    writing when ``head`` has gone."""
    with cluster.client(0) as client:
        client.create_table("piped", SCHEMA)
        n = 40_000
        for _ in range(3):  # three commits: history and parts have lines to print too
            data = pa.table({"id": list(range(n)), "name": [f"name-{i:08d}" for i in range(n)]}, schema=SCHEMA)
            client.insert("piped", data)
    return "piped"


@pytest.mark.parametrize("reader", ["head -1", "head -c 0"])  # the second has gone before anything is written
@pytest.mark.parametrize(
    "args",
    [
        ["read", "piped", "--format", "csv"],
        ["read", "piped", "--format", "json"],
        ["read", "piped", "--limit", "5000"],
        ["history", "piped"],
        ["parts", "piped"],
    ],
    ids=["read-csv", "read-json", "read-table", "history", "parts"],
)
def test_output_piped_into_head_ends_quietly(
    cluster: LocalCluster, big_table: str, args: list[str], reader: str
) -> None:
    argv = " ".join(cli_argv(*args, "--replica", cluster.replica_addresses[0]))
    done = subprocess.run(
        f"set -o pipefail; {argv} | {reader} >/dev/null",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "error" not in done.stderr.lower() and "Broken pipe" not in done.stderr, done.stderr
