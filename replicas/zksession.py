"""What a replica's parts need to know of its ZooKeeper session: whether it is usable now, and
whether the replica stops.

The replica's connection listener sets these (replicas/replica.py, ``_on_zk_state``); the
transaction registry, the committer, the pause guard, the metrics and the maintenance threads
read them, constructed with this object rather than with the whole replica.
:func:`connect_zk` opens the session at a replica's start, within a bound.
"""

from __future__ import annotations

import logging
import threading

from kazoo.client import KazooClient

from coordinator.core.errors import ReplicaUnavailable

log = logging.getLogger(__name__)


class ZkSession:
    """The replica's ZooKeeper session as its satellites see it (``replica.zk_session``)."""

    def __init__(self) -> None:
        self.connected = threading.Event()  # set while the session is usable (not SUSPENDED/LOST)
        self.lost = threading.Event()  # from a LOST session until the new one is registered
        self.stop = threading.Event()  # the replica is stopping: its threads end

    def usable(self) -> bool:
        """Connected, on a session that was not lost (or is registered again since)."""
        return self.connected.is_set() and not self.lost.is_set()

    def wait_usable(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for a connection; whether the session is usable then (False
        at once while a lost session is not registered again)."""
        return self.connected.wait(timeout) and not self.lost.is_set()


def connect_zk(zk: KazooClient, hosts: str, timeout: float) -> None:
    """Start ``zk``'s session on ZooKeeper at ``hosts``, waiting ``timeout`` seconds (the
    ``zk_connect_timeout`` setting) at most. Nothing listening there, or a port that accepts and
    never answers, is ReplicaUnavailable naming the address and what to do, at ``timeout``:
    ``zk`` is stopped off this thread (kazoo's own ``start`` waits for its connection thread,
    which may sit in a read of a silent port for the whole session timeout)."""
    if zk.start_async().wait(timeout):
        return
    threading.Thread(target=_stop_quietly, args=(zk,), name="zk-stop", daemon=True).start()
    raise ReplicaUnavailable(
        f"ZooKeeper at {hosts} did not answer within {timeout:g} s (zk_connect_timeout): start ZooKeeper "
        f"there (mergetxn zk start) or give the address of a running one with --zk HOST:PORT[,HOST:PORT...]",
        zk=hosts,
    )


def _stop_quietly(zk: KazooClient) -> None:
    try:
        zk.stop()
    except Exception as exc:  # noqa: BLE001 - the start failed already; this is its cleanup
        log.debug("stopping the ZooKeeper client after a failed start: %r", exc)
