"""Helpers for tests that need their own corner of the session's ZooKeeper."""

from __future__ import annotations

import uuid

from kazoo.client import KazooClient

from coordinator.zkserver import ZooKeeperServer


def make_chroot(zk_server: ZooKeeperServer, prefix: str = "t") -> str:
    """A fresh chroot path (the node exists), so clusters never see each other's znodes."""
    chroot = f"/{prefix}{uuid.uuid4().hex}"
    zk = KazooClient(hosts=zk_server.address)
    zk.start(timeout=30)
    try:
        zk.ensure_path(chroot)
    finally:
        zk.stop()
        zk.close()
    return chroot


def new_chroot(zk_server: ZooKeeperServer, prefix: str = "t") -> str:
    """A kazoo hosts string confined to a fresh chroot."""
    return zk_server.address + make_chroot(zk_server, prefix)
