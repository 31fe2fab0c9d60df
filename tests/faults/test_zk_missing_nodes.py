"""A replica whose ZooKeeper nodes went says so.

The fence, the users and the log's entries can be deleted by whoever holds the replicas'
identity (an operator's mistake; before the secured ZooKeeper required a certificate of the
cluster CA, anyone's ACL-less deleteContainer). Each replica watches them: ``/ready`` answers 503
naming the node and what to do, ``mergetxn status`` lists it, the replica logs it, and a login
while the users are missing is refused saying so (never "wrong user or secret"). A replica's
start makes the fence and the users (the first admin) again.

A secured cluster of two replicas with its own ZooKeeper; the deletions are made with the
replicas' identity, as an operator's zkCli would.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pyarrow as pa
import pytest
from click.testing import CliRunner
from kazoo.client import KazooClient
from support.cluster import make_cluster  # tests/ is on sys.path
from support.waiting import wait_until

import coordinator
from coordinator.core.versions import split_csn
from coordinator.errors import AuthenticationFailed, CorruptMetadata
from coordinator.wire.security import REPLICA_FILE, Credentials, zk_client_args
from coordinator.zk.log import CsnLog
from mergetxn.cli import cli
from mergetxn.client import Client

pytestmark = [pytest.mark.zk, pytest.mark.slow]

SCHEMA = pa.schema([("id", pa.int64())])
EXIT_UNHEALTHY = 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    with make_cluster(tmp_path_factory, None, "zkmissing", replicas=2, secure=True, metrics=True) as c:
        c.client(0).create_table("t", SCHEMA)
        yield c


def replica_file(cluster: coordinator.LocalCluster) -> str:
    return str(cluster.workdir / "security" / REPLICA_FILE)


def zookeeper(cluster: coordinator.LocalCluster) -> KazooClient:
    zk = KazooClient(
        hosts=cluster.zk_address, timeout=10, **zk_client_args(Credentials.from_file(replica_file(cluster)))
    )
    zk.start(timeout=15)
    return zk


def delete(cluster: coordinator.LocalCluster, path: str) -> None:
    zk = zookeeper(cluster)
    try:
        zk.delete(path)
    finally:
        zk.stop()
        zk.close()


def ready(address: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{address}/ready", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def status(cluster: coordinator.LocalCluster) -> tuple[int, str]:
    result = CliRunner().invoke(
        cli,
        ["status", "--replica", cluster.replica_addresses[0], "--credentials", replica_file(cluster)],
        env={"MERGETXN_CREDENTIALS": ""},
    )
    return result.exit_code, " ".join(result.output.split())


def metrics_addresses(cluster: coordinator.LocalCluster) -> list[str]:
    replica = Credentials.from_file(replica_file(cluster)).client()  # logs in while users are missing
    out = []
    for address in cluster.replica_addresses:
        with Client(address, credentials=replica) as c:
            out.append(c.call("info")["metrics_address"])
    return out


def delete_and_wait_not_ready(cluster: coordinator.LocalCluster, path: str) -> list[str]:
    """Delete ``path`` with the replicas' identity; every replica's ``/ready`` body once it
    answers 503."""
    addresses = metrics_addresses(cluster)
    delete(cluster, path)
    return [wait_until(lambda a=a: (r := ready(a))[0] == 503 and r, 30, f"{a}/ready to say 503")[1] for a in addresses]


def restart_and_wait_ready(cluster: coordinator.LocalCluster, i: int) -> None:
    """Restart replica ``i`` (its start makes the fence and the first admin again) and wait until
    every replica's ``/ready`` answers 200."""
    cluster.stop_replica(i)
    cluster.start_replica(i)
    for address in metrics_addresses(cluster):
        wait_until(lambda a=address: ready(a)[0] == 200, 30, f"{address}/ready to say 200 again")


def insert(cluster: coordinator.LocalCluster, n: int) -> int:
    with cluster.client(0).transaction() as tx:
        tx.insert("t", pa.table({"id": [n]}, schema=SCHEMA))
    return tx.csn


def test_missing_users_are_named_by_ready_status_the_log_and_the_login(cluster: coordinator.LocalCluster) -> None:
    users = CsnLog(None, cluster.root).users_path()  # type: ignore[arg-type]
    opened = cluster.client(0)  # logged in before: its next call is refused saying why, too
    opened.tables()
    for body in delete_and_wait_not_ready(cluster, users):
        assert users in body and "missing" in body and "add-user" in body, body
    with pytest.raises(AuthenticationFailed) as refused:
        cluster.client(1).call("info")
    assert users in refused.value.message and "missing" in refused.value.message
    assert "wrong user or secret" not in refused.value.message
    with pytest.raises(AuthenticationFailed, match="users node .* is missing"):
        opened.tables()
    opened.close()
    code, flat = status(cluster)
    assert code == EXIT_UNHEALTHY and users in flat and "missing" in flat
    log = (cluster.replica_dir(0) / "replica.log").read_text(errors="replace")
    assert users in log and "is missing" in log

    restart_and_wait_ready(cluster, 1)
    assert cluster.client(0).call("info")["missing"] == []
    assert insert(cluster, 1) > 0


def test_a_missing_fence_is_named_and_a_restart_makes_it_again(cluster: coordinator.LocalCluster) -> None:
    fence = CsnLog(None, cluster.root).fence_path()  # type: ignore[arg-type]
    for body in delete_and_wait_not_ready(cluster, fence):
        assert fence in body and "every commit fails" in body and "restart one replica" in body, body
    assert any(fence in m for m in cluster.client(1).call("info")["missing"])
    with pytest.raises(CorruptMetadata, match="every commit fails") as failed:  # not kazoo's NoNodeError()
        insert(cluster, 99)
    assert fence in failed.value.message
    code, flat = status(cluster)
    assert code == EXIT_UNHEALTHY and fence in flat
    restart_and_wait_ready(cluster, 1)
    assert insert(cluster, 2) > 0
    code, flat = status(cluster)
    assert code == 0, flat


def test_a_deleted_log_entry_is_named_by_every_replica_and_status(cluster: coordinator.LocalCluster) -> None:
    """Runs last: the hole stays (a committed entry is never made again). Both replicas applied
    the entry before it went, so each keeps serving it, and each still says the log lost it."""
    csns = [insert(cluster, n) for n in (10, 11, 12)]
    epoch, _ = split_csn(csns[1])
    layout = CsnLog(None, cluster.root)  # type: ignore[arg-type]
    for body in delete_and_wait_not_ready(cluster, layout.entry_path(*split_csn(csns[1]))):
        assert layout.epoch_path(epoch) in body and "lost 1 committed entry" in body, body
    code, flat = status(cluster)
    assert code == EXIT_UNHEALTHY and f"log epoch {layout.epoch_path(epoch)} lost 1 committed entry" in flat
    assert sorted(cluster.client(1).read("t", snapshot=csns[-1]).column("id").to_pylist())[-3:] == [10, 11, 12]
