"""A LocalCluster (replica processes) for a test module, from one factory.

Each module keeps its own ``cluster`` fixture, scoped and parametrised as that module needs
(replicas, settings, limits, environment), as a one-line use of :func:`make_cluster`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import pytest

from mergetxn.local.cluster import LocalCluster
from mergetxn.local.zkserver import ZooKeeperServer
from support.zk import new_chroot


@contextmanager
def environ(env: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``env`` set, restored as it was on the way out."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def make_cluster(
    tmp_path_factory: pytest.TempPathFactory,
    zk: ZooKeeperServer | str | None,
    name: str,
    replicas: int = 2,
    env: Mapping[str, str] | None = None,
    **kwargs: object,
) -> Iterator[LocalCluster]:
    """A started LocalCluster of ``replicas`` replica processes in a fresh temporary directory
    named after ``name``; stopped on the way out.

    ``zk``: the session's server (the cluster gets a chroot of its own, named after ``name``),
    a kazoo hosts string to use as it is, or None for a ZooKeeper of the cluster's own.
    ``env``: set while the replica processes start (they inherit it), and only then: a replica
    restarted later by a test does not get it. ``kwargs`` go to LocalCluster (settings, limits,
    epoch_size, session_timeout, root, storage_url)."""
    address = new_chroot(zk, name) if isinstance(zk, ZooKeeperServer) else zk
    cluster = LocalCluster(tmp_path_factory.mktemp(name), replicas=replicas, zk_address=address, **kwargs)
    with environ(env or {}):
        cluster.start()  # stops what it started if it fails
    try:
        yield cluster
    finally:
        cluster.stop()
