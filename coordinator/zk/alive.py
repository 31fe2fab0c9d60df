"""The alive node: each replica's ephemeral ``replicas/<host>/alive`` (an :class:`AliveRecord`).

A replica publishes what it is and what it still needs (address, incarnation, applied CSN, the
snapshots and transactions in use there); cleanup and the log tail read every replica's to keep
what any of them can still see. The node is ephemeral, so a replica whose session ends stops
holding anything back. Publishing writes only when the record changed (the log-tail thread asks
twice a second); a node left by this host's previous session is replaced, but a replica starts
only after :func:`check_host_free` found no live process holding it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from coordinator.core import retries
from coordinator.core.errors import CorruptMetadata, InvalidInput
from coordinator.model.records import AliveRecord
from coordinator.model.znodes import OwnerRecord
from coordinator.zk.log import CsnLog


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
        out[host] = AliveRecord.decode(data)  # (one that does not parse: malformed, keeps everything)
    return out


# -- a host id's registration: claimed at start, retired by an operator ------------------------
#
# ``replicas/<host>`` is the registration (its version is the host's incarnation, so it is never
# deleted: a host id coming back must not reuse tids); its data says ``retired_at`` once an
# operator retired it (``mergetxn replica retire``), and registering again clears that.


def reachable(address: str, timeout: float = 2.0) -> bool:
    """Whether something accepts TCP connections at ``host:port`` (a replica that holds its
    port; a stopped one's kernel still accepts, and counts as alive)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return False
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def holder(record: AliveRecord, own_address: str, probe: Callable[[str], bool] = reachable) -> str | None:
    """The address of the live process that holds an alive node with ``record``, or None when the
    node is stale: left by a process that died before its session expired (its address is the
    port this process now holds, or nothing answers there). A record without an address (a
    replica still starting, or malformed) counts as held by an unknown process: ``"unknown"``."""
    if not record.address or record.malformed:
        return "unknown"
    if record.address == own_address:
        return None
    return record.address if probe(record.address) else None


def check_host_free(
    zk: KazooClient,
    layout: CsnLog,
    host_id: str,
    own_address: str,
    wait: float,
    probe: Callable[[str], bool] = reachable,
) -> None:
    """Refuse (InvalidInput naming the host id and the other process's address) to start as
    ``host_id`` while a live process holds its alive node. A stale node (see :func:`holder`) is
    left for :meth:`AliveNode.publish` to replace; one whose holder is unknown is given ``wait``
    seconds (a session timeout) to vanish."""
    path = layout.alive_path(host_id)

    def held_by(other: str) -> InvalidInput:
        return InvalidInput(
            f"host id {host_id!r} is held by a live replica at {other}: a second replica with the same "
            "--host-id would fence it and fail every commit through either. Stop that one first, or choose "
            "another --host-id",
            host_id=host_id,
            address=other,
        )

    try:
        for attempt in retries.host_free(wait):
            with attempt:
                try:
                    data, _ = zk.retry(zk.get, path)
                except NoNodeError:
                    return
                other = holder(AliveRecord.decode(data), own_address, probe)
                if other is None:
                    return
                if other != "unknown":
                    raise held_by(other)
                raise retries.TryAgain("its holder is unknown")
    except retries.TryAgain:
        raise held_by("unknown") from None


def is_retired(data: bytes, where: str = "replicas/<host>") -> bool:
    """Whether a registration node's data says its replica was retired for good (a body that
    does not parse does not say so)."""
    try:
        return OwnerRecord.decode(data, where).retired
    except CorruptMetadata:
        return False


def registered(zk: KazooClient, layout: CsnLog) -> list[str]:
    """The host ids registered and not retired, sorted."""
    out = []
    for host in zk.retry(zk.get_children, layout.replicas_path()):
        try:
            data, _ = zk.retry(zk.get, layout.replica_path(host))
        except NoNodeError:
            continue
        if not is_retired(data, layout.replica_path(host)):
            out.append(host)
    return sorted(out)


def retire(zk: KazooClient, layout: CsnLog, host_id: str) -> int:
    """Retire replica ``host_id`` for good: ``status`` stops counting it, and its incarnation is
    fenced (bumped), so no transaction it began can commit. Refused (InvalidInput) for a host id
    never registered and while its alive node exists. Returns the fenced incarnation."""
    node = layout.replica_path(host_id)
    try:
        data, stat = zk.retry(zk.get, node)
    except NoNodeError:
        raise InvalidInput(f"no replica {host_id!r} is registered under {layout.root}", host_id=host_id) from None
    try:
        alive, _ = zk.retry(zk.get, layout.alive_path(host_id))
    except NoNodeError:
        alive = None
    if alive is not None:
        address = AliveRecord.decode(alive).address or "an address not published yet"
        raise InvalidInput(
            f"replica {host_id!r} is alive (serving at {address}): stop it before retiring it",
            host_id=host_id,
            address=address,
        )
    record = OwnerRecord(host_id, retired_at=time.time())
    try:
        zk.retry(zk.set, node, record.encode(), version=stat.version)
    except BadVersionError:
        raise InvalidInput(
            f"replica {host_id!r} registered again while it was being retired: stop it, then retire it again",
            host_id=host_id,
        ) from None
    return stat.version
