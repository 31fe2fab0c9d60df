"""Shared pytest fixtures.

Sections are independent; add new fixtures in a section of their own below the existing ones.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

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
# default (tunables read MERGETXN_<NAME>). The retention tests
# (tests/integration/test_retention.py) set the window explicitly, the default included.
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


# =============================================================================================
# Test folders
#
# unit (pure, fast: `./dev test unit`), integration (real ZooKeeper, replica processes, the CLI,
# an S3 server), faults (kills, pauses, cut connections, storage faults, hostile clients), spark
# (anything that starts Spark) and chaos (the `mergetxn chaos` harness). None is a package: each
# folder is on sys.path as tests/ is, so a module imports another's helpers by name wherever
# either lives and whichever subset runs (`from test_log_tail import Node` in faults/,
# `from test_cli import cli_env` in spark/). Module names are therefore unique across folders:
# a duplicate fails the session here, before it can shadow the other.
# =============================================================================================

TEST_FOLDERS = ("unit", "integration", "faults", "spark", "chaos")


def _put_test_folders_on_sys_path() -> None:
    here = Path(__file__).resolve().parent
    seen: dict[str, Path] = {}
    for name in TEST_FOLDERS:
        folder = here / name
        for module in sorted(folder.glob("*.py")):
            if module.stem in seen:
                raise pytest.UsageError(
                    f"two test modules named {module.stem}: {seen[module.stem]} "
                    f"and {module} (test modules are imported by name: rename one)"
                )
            seen[module.stem] = module
        if str(folder) not in sys.path:
            sys.path.append(str(folder))


_put_test_folders_on_sys_path()
