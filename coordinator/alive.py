"""The alive node: each replica's ephemeral ``replicas/<host>/alive`` (an :class:`AliveRecord`).

A replica publishes what it is and what it still needs (address, incarnation, applied CSN, the
snapshots and transactions in use there); cleanup and the log tail read every replica's to keep
what any of them can still see. The node is ephemeral, so a replica whose session ends stops
holding anything back. Publishing writes only when the record changed (the log-tail thread asks
twice a second); a node left by this host's previous session is replaced.
"""

from __future__ import annotations

from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from coordinator.model import AliveRecord
from coordinator.zklog import CsnLog


class AliveNode:
    """This replica's alive node: ``publish`` once registered (and after a new session),
    ``refresh`` as often as wanted."""

    def __init__(self, zk: KazooClient, layout: CsnLog, host_id: str, record: Callable[[], AliveRecord]) -> None:
        self.zk = zk
        self.path = layout.alive_path(host_id)
        self.record = record
        self._published: bytes | None = None

    def publish(self) -> None:
        """Create the node (replacing one left by an earlier session of this host)."""
        data = self.record().encode()
        self._published = data
        try:
            self.zk.retry(self.zk.create, self.path, data, ephemeral=True)
        except NodeExistsError:
            try:
                self.zk.retry(self.zk.delete, self.path)
            except NoNodeError:
                pass
            self.zk.retry(self.zk.create, self.path, data, ephemeral=True)

    def refresh(self) -> None:
        """Write the record if it changed since it was last published."""
        data = self.record().encode()
        if data == self._published:
            return
        try:
            self.zk.retry(self.zk.set, self.path, data)
            self._published = data
        except NoNodeError:
            self.publish()


def read_alive(zk: KazooClient, layout: CsnLog) -> dict[str, AliveRecord]:
    """Every alive replica's record by host (a node that does not parse keeps everything)."""
    out: dict[str, AliveRecord] = {}
    for host in zk.retry(zk.get_children, layout.replicas_path()):
        try:
            data, _ = zk.retry(zk.get, layout.alive_path(host))
        except NoNodeError:
            continue
        out[host] = AliveRecord.decode(data)
    return out
