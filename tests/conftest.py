"""Shared pytest fixtures.

Sections are independent; add new fixtures in a section of their own below the existing ones.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from support.zk import kazoo, new_chroot  # tests/ is on sys.path

from mergetxn.local.zkserver import ZooKeeperServer

# =============================================================================================
# History retention
#
# The replica-wide default is an hour (docs/rules.md#history-retention). The suites written before
# retention windows existed assert that cleanup deletes a removed part once no snapshot in use
# sees it: that is `retention_seconds=0`, which every replica this session starts takes as its
# default (tunables read MERGETXN_<NAME>). The retention tests (tests/test_retention.py) set the
# window explicitly, the default included.
# =============================================================================================

os.environ.setdefault("MERGETXN_RETENTION_SECONDS", "0")

# =============================================================================================
# ZooKeeper
#
# One real ZooKeeper server (from the pyspark jars, Java 17) per test session; every test that
# asks for `zk_address` gets its own chroot on it, so tests never see each other's znodes and
# need no cleanup. Tests that need to stop, kill or restart ZooKeeper start their own
# ZooKeeperServer / ZooKeeperEnsemble in tmp_path instead of touching the shared one.
# Tests using these fixtures are marked `zk` automatically (`-m "not zk"` skips them).
# =============================================================================================

ZK_FIXTURES = frozenset({"zk_server", "zk_address", "zk_client"})


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """The session's embedded ZooKeeper server (standalone, 127.0.0.1, 200 ms tick).

    Do not stop or kill it from a test: start your own ZooKeeperServer for that."""
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zk_address(zk_server: ZooKeeperServer) -> str:
    """A kazoo hosts string confined to a fresh chroot: ``127.0.0.1:port/t<hex>``.

    The chroot node exists (kazoo does not create it, and every operation under a missing
    chroot fails with NoNodeError)."""
    return new_chroot(zk_server)


@pytest.fixture
def zk_client(zk_address: str) -> Iterator[KazooClient]:
    """A started kazoo client inside this test's chroot (see ``zk_address``)."""
    with kazoo(zk_address) as client:
        yield client


def _mark_zk_tests(items: list[pytest.Item]) -> None:
    for item in items:
        if ZK_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.zk)


# =============================================================================================
# Hooks (each section registers what it needs here)
# =============================================================================================


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _mark_zk_tests(items)


# =============================================================================================
# Clients of a module's cluster
#
# A test module that defines a module-scoped `cluster` fixture (a LocalCluster, usually from
# support.cluster.make_cluster) gets `c0` and `c1`, clients of its replicas 0 and 1, for the
# module. A module that needs other clients (credentials, a timeout) defines its own.
# =============================================================================================


@pytest.fixture(scope="module")
def c0(cluster):  # noqa: ANN001 - the requesting module's LocalCluster
    return cluster.client(0)


@pytest.fixture(scope="module")
def c1(cluster):  # noqa: ANN001
    return cluster.client(1)
