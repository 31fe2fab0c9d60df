"""Bounded partition values and node names (docs/rules.md#partition-values): a partition value
longer than the replica setting ``max_partition_value_bytes`` is refused (by the client before it
writes a file, and by the replica at stage) with InvalidInput naming the column and the limit, at
once, while every other writer on the replica goes on; every ZooKeeper node name made from a user
value (a partition, an application id) stays within ``MAX_NODE_NAME`` characters; a user name that
breaks the name rule is refused by that rule before anything else.

Against a real ZooKeeper and replica processes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner
from kazoo.client import KazooClient
from support.cluster import make_cluster  # tests/ is on sys.path
from support.zk import kazoo

import coordinator
from coordinator.errors import ConflictError, InvalidInput
from mergetxn.cli import cli
from mergetxn.client import Client
from mergetxn.local.cluster import LocalCluster
from mergetxn.local.zkserver import ZooKeeperServer

SCHEMA = pa.schema([("p", pa.string()), ("v", pa.int64())])
LIMIT = 1024  # the default of max_partition_value_bytes
MAX_NODE_NAME = 255  # coordinator/core/targets.py's bound on a node name made from a user value
HUGE = "é" * 400_000  # the finding's value: a 3.2 MB conflict-target node name (8 characters each) before


@pytest.fixture(scope="module")
def cluster(zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with make_cluster(tmp_path_factory, zk_server, "partbounds", replicas=1, settings={"merge_interval": 0}) as c:
        yield c


@pytest.fixture(scope="module")
def zk(cluster: LocalCluster) -> Iterator[KazooClient]:
    with kazoo(cluster.zk_address) as client:
        yield client


@pytest.fixture(scope="module")
def tables(c0: Client) -> None:
    c0.create_table("mc", SCHEMA, partition_by=("p",), conflict_policy="maxcompute", auto_merge=False)
    c0.create_table("pp", SCHEMA, partition_by=("p",), auto_merge=False)
    c0.create_table("other", SCHEMA, auto_merge=False)


def hostile(cluster: LocalCluster) -> Client:
    """A client that skips its own check, as a writer of another version or a hand-made request
    would: only the replica stands between its value and ZooKeeper."""
    c = coordinator.connect(cluster.replica_addresses[0], timeout=15)
    c.max_partition_value_bytes = 10**9
    return c


def files(cluster: LocalCluster, table: str) -> set[Path]:
    root = Path(cluster.storage_url) / table
    return {p for p in root.rglob("*") if p.is_file()} if root.exists() else set()


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def node_names(zk: KazooClient, path: str) -> Iterator[str]:
    for child in zk.get_children(path):
        yield child
        yield from node_names(zk, f"{path}/{child}")


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds ``fn`` took and what it returned or raised."""
    start = time.monotonic()
    try:
        out: Any = fn()
    except Exception as exc:  # noqa: BLE001 - the caller asserts on it
        out = exc
    return time.monotonic() - start, out


def side_by_side(cluster: LocalCluster, **calls: Callable[[], Any]) -> dict[str, tuple[float, Any]]:
    """Run ``calls`` and, from another user's client, an insert of one row into table ``other``,
    released together by a barrier; each one's seconds and result (or error) by name, the
    insert's as ``"other"``. Every call has 60 s to return."""
    good = coordinator.connect(cluster.replica_addresses[0], timeout=15)
    calls = {**calls, "other": lambda: good.insert("other", pa.table({"p": ["a"], "v": [2]}, schema=SCHEMA))}
    barrier = threading.Barrier(len(calls))
    out: dict[str, tuple[float, Any]] = {}

    def run(name: str, fn: Callable[[], Any]) -> None:
        barrier.wait()
        out[name] = timed(fn)

    threads = [threading.Thread(target=run, args=item) for item in calls.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    good.close()
    assert set(out) == set(calls), f"still waiting after 60 s: {sorted(set(calls) - set(out))}"
    return out


def refused_for(exc: object, column: str = "p") -> None:
    assert isinstance(exc, InvalidInput), exc
    assert exc.details["column"] == column and exc.details["limit"] == LIMIT, exc.details
    assert "max_partition_value_bytes" in exc.message and f"{LIMIT} bytes" in exc.message


def test_a_huge_partition_value_is_refused_at_stage_and_another_table_goes_on(
    cluster: LocalCluster, zk: KazooClient, c0: Client, tables: None
) -> None:
    """The finding: a 400,000-character partition value on a maxcompute table, sent past the
    client's check, is refused by the replica at stage in well under a second, naming the
    column and the limit; another user's insert into another table on that replica, started at
    the same moment, commits in under a second; nothing of the refused one is visible or left."""
    before = files(cluster, "mc")
    bad = hostile(cluster)
    rows = pa.table({"p": [HUGE], "v": [1]}, schema=SCHEMA)
    out = side_by_side(cluster, huge=lambda: bad.insert("mc", rows))
    bad.close()
    huge_seconds, huge = out["huge"]
    other_seconds, other = out["other"]
    refused_for(huge)
    assert huge_seconds < 1.0, huge_seconds
    assert isinstance(other, int), other
    assert other_seconds < 1.0, other_seconds
    assert c0.read("mc").num_rows == 0 and c0.read("other").num_rows >= 1
    assert files(cluster, "mc") == before  # the refused call's files deleted
    longest = max(len(n) for n in node_names(zk, "/mergetxn"))
    assert longest <= MAX_NODE_NAME


def test_the_client_refuses_before_writing_a_file(cluster: LocalCluster, c0: Client, tables: None) -> None:
    """The client's own check: the same value is refused before any file is written, every
    write road (insert, a transaction's insert and overwrite) alike, in well under a second."""
    rows = pa.table({"p": ["ok", HUGE], "v": [1, 2]}, schema=SCHEMA)
    before = files(cluster, "mc")
    seconds, exc = timed(lambda: c0.insert("mc", rows))
    refused_for(exc)
    assert seconds < 1.0, seconds
    tx = c0.begin()
    try:
        for write in (tx.insert, tx.overwrite):
            with pytest.raises(InvalidInput) as info:
                write("mc", rows)
            refused_for(info.value)
    finally:
        tx.rollback()
    assert files(cluster, "mc") == before


def test_a_megabyte_value_on_a_parts_table_is_refused_and_the_wal_stays_small(
    cluster: LocalCluster, c0: Client, tables: None
) -> None:
    """The finding: a 1 MB partition value committed on a ``parts`` table and made a 10.6 MB WAL.
    Now it is refused at stage and the WAL does not grow by it; a value at the limit commits."""
    wal = Path(cluster.workdir) / "replica-0"
    grown = dir_bytes(wal)
    bad = hostile(cluster)
    try:
        with pytest.raises(InvalidInput) as info:
            bad.insert("pp", pa.table({"p": ["m" * 1_000_000], "v": [1]}, schema=SCHEMA))
        refused_for(info.value)
        with pytest.raises(InvalidInput) as info:  # a multi-byte value counts its UTF-8 bytes
            bad.insert("pp", pa.table({"p": ["é" * (LIMIT // 2 + 1)], "v": [1]}, schema=SCHEMA))
        refused_for(info.value)
    finally:
        bad.close()
    assert dir_bytes(wal) - grown < 64 * 1024
    at_limit = "é" * (LIMIT // 2)
    c0.insert("pp", pa.table({"p": [at_limit], "v": [3]}, schema=SCHEMA))
    assert c0.read("pp").to_pylist() == [{"p": at_limit, "v": 3}]


def test_partition_names_in_overwrite_and_truncate_are_bounded_too(
    cluster: LocalCluster, c0: Client, tables: None
) -> None:
    """A partition named by a TRUNCATE (no file, no row) is checked as well, at the replica."""
    with pytest.raises(InvalidInput) as info:
        with c0.transaction() as tx:
            tx.truncate("mc", partitions=[(HUGE,)])
    refused_for(info.value)


def test_long_values_under_the_limit_get_bounded_nodes_that_still_conflict(
    cluster: LocalCluster, zk: KazooClient, c0: Client, tables: None
) -> None:
    """A legal partition value whose encoded key is far past a node name's bound (512 'é', 4,000
    characters percent-encoded) and a 256-character application id get node names of at most
    MAX_NODE_NAME characters; two overlapping maxcompute INSERTs on that partition still
    conflict (both name one node), and the application's versions still order its commits."""
    value = "é" * (LIMIT // 2)
    rows = pa.table({"p": [value], "v": [1]}, schema=SCHEMA)
    first, second = c0.begin(), c0.begin()
    first.insert("mc", rows)
    second.insert("mc", rows)
    first.commit()
    with pytest.raises(ConflictError):
        second.commit()
    app = "ü" * 256
    with c0.transaction() as tx:
        tx.insert("other", pa.table({"p": ["b"], "v": [5]}, schema=SCHEMA))
        tx.set_app_version(app, 7)
    assert c0.app_version(app) == 7
    with pytest.raises(coordinator.errors.DuplicateCommit):
        with c0.transaction() as tx:
            tx.insert("other", pa.table({"p": ["c"], "v": [6]}, schema=SCHEMA))
            tx.set_app_version(app, 7)
    names = list(node_names(zk, "/mergetxn/targets"))
    assert any("#" in n for n in names)  # the long ones were cut and hashed
    assert max(len(n) for n in names) <= MAX_NODE_NAME


def test_a_commit_with_more_targets_than_one_zookeeper_request_holds_is_refused(
    cluster: LocalCluster, c0: Client, tables: None
) -> None:
    """Legal values, too many of them: a TRUNCATE naming 4,000 partitions of 1 KiB values on a
    maxcompute table would make a commit multi of about 1.3 MB, over ZooKeeper's 1 MiB request
    bound (the server dropped the replica's connection at each retry, two minutes long). It is
    refused with InvalidInput naming the number of targets before anything is sent, and an
    insert into another table beside it commits."""
    names = [("é" * (LIMIT // 2 - 3)) + f"{i:05d}" for i in range(4000)]
    tx = c0.begin()
    tx.truncate("mc", partitions=[(n,) for n in names])
    out = side_by_side(cluster, many=tx.commit)
    many_seconds, many = out["many"]
    assert isinstance(many, InvalidInput), many
    assert many.details["targets"] >= 4000 and "fewer partitions" in many.message
    assert many_seconds < 10, many_seconds
    assert isinstance(out["other"][1], int), out["other"]
    assert out["other"][0] < 10, out["other"]
    assert c0.commit_status(tx.id).status == "aborted"


def test_a_host_id_of_dots_names_no_node(cluster: LocalCluster, c0: Client) -> None:
    """A tid's host id becomes a node name (replicas/<host>) when another replica decides its
    outcome: '.' and '..' are none (ZooKeeper refuses such a path), so a tid naming one is
    InvalidInput like any malformed tid, and the replica answers the next call."""
    for host in ("..", "."):
        with pytest.raises(InvalidInput, match="transaction id"):
            c0.commit_status(f"T1-1-{host}")
    assert c0.snapshot() >= 0


# =============================================================================================
# User names: the rule first


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with make_cluster(tmp_path_factory, None, "usernames", replicas=1, secure=True) as c:
        yield c


def test_a_300_character_user_name_is_refused_by_the_name_rule(secure: LocalCluster, tmp_path: Path) -> None:
    """``client.create_user``, ``cluster.add_user`` and ``mergetxn security add-user`` refuse a
    300-character name with InvalidInput naming the rule (64 characters), not OSError; no user
    and no file is made."""
    name = "u" * 300
    admin_file = str(secure.workdir / "security" / "admin.json")
    made = CliRunner().invoke(
        cli,
        ["security", "add-user", name, "--role", "writer"]
        + ["--replica", secure.replica_addresses[0], "--credentials", admin_file],
    )
    assert not isinstance(made.exception, OSError), made.exception
    assert made.exit_code != 0 and "1 to 64" in made.output, made.output
    with secure.client(0) as admin:
        with pytest.raises(InvalidInput, match="1 to 64") as info:
            admin.create_user(name, "writer")
        assert info.value.details["limit"] == 64
        with pytest.raises(InvalidInput, match="1 to 64"):
            secure.add_user(name, "reader")
        assert name not in {u["name"] for u in admin.users()}
    assert not list((secure.workdir / "security").glob("u*.json"))
