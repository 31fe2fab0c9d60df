"""ZooKeeper for tests: a corner of the session's server of one's own, and kazoo clients that
are always closed."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from mergetxn.local.zkserver import ZooKeeperServer

EMPTY_LOG_ENTRY = json.dumps({"v": 1, "txns": [], "versions": {}}).encode()
"""What an operator writes over a log znode that was never a commit (docs/architecture/outcomes-recovery.md)."""


@contextmanager
def kazoo(hosts: str, timeout: float = 10.0) -> Iterator[KazooClient]:
    """A started kazoo client on ``hosts``, stopped and closed on the way out."""
    client = KazooClient(hosts=hosts, timeout=timeout)
    client.start(timeout=30)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def assert_no_session(hosts: str, **kwargs: object) -> None:
    """A kazoo client on ``hosts`` with ``kwargs`` (TLS arguments, an identity) gets no session: a
    secured ZooKeeper completes no handshake without a certificate of the cluster CA."""
    client = KazooClient(hosts=hosts, timeout=3, connection_retry={"max_tries": 1}, **kwargs)
    try:
        client.start(timeout=5)
    except KazooTimeoutError:
        return
    finally:
        client.stop()
        client.close()
    raise AssertionError(f"ZooKeeper {hosts} opened a session to a client with {sorted(kwargs)}")


def make_chroot(zk_server: ZooKeeperServer, prefix: str = "t") -> str:
    """A fresh chroot path (the node exists: kazoo does not create it, and every operation under
    a missing chroot fails with NoNodeError), so clusters never see each other's znodes."""
    chroot = f"/{prefix}{uuid.uuid4().hex}"
    with kazoo(zk_server.address) as zk:
        zk.ensure_path(chroot)
    return chroot


def new_chroot(zk_server: ZooKeeperServer, prefix: str = "t") -> str:
    """A kazoo hosts string confined to a fresh chroot: ``127.0.0.1:port/<prefix><hex>``."""
    return zk_server.address + make_chroot(zk_server, prefix)


def repair_log_node(hosts: str, node: str) -> None:
    """Do what an operator does to a log znode that was never a commit: replace its data with an
    empty entry."""
    with kazoo(hosts) as zk:
        zk.set(node, EMPTY_LOG_ENTRY)
