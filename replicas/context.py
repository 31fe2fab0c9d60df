"""What every part of one replica works on, made once and handed to each part.

A replica's parts (the transaction registry, leases, cleanup, the committer and its table
changes, the log tail, outcomes, retention, the change feed, the log watch, the pause guard) read
the same things: the replica's settings, its in-memory state, its
storage, its ZooKeeper client and the CSN log over it, the two nodes the replica shares among its
parts (the ``gc`` watermark and the orphan fence), and a few calls on the replica itself (catch
up, wait for a snapshot, a table's definition, its incarnation now, poke the follower, its alive
record). :class:`ReplicaContext` holds them; a part that is a :class:`ReplicaPart` takes the
context first and its own dependencies after, and keeps the first five and the host id under the
names every part uses (``self.state``, ``self.config``, ...). ``replicas/replica.py`` makes the
context once, in ``Replica.__init__``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from kazoo.client import KazooClient

    from coordinator.model.catalog import TableDef
    from coordinator.model.records import AliveRecord
    from coordinator.zk.log import CsnLog
    from coordinator.zk.orphan_fence import OrphanFence
    from coordinator.zk.watermark import Watermark
    from parts.io.storage import Storage
    from replicas.settings import ReplicaConfig
    from replicas.state import ReplicaState


@dataclass(frozen=True)
class ReplicaContext:
    """One replica's settings, state, storage, ZooKeeper client, CSN log, shared nodes and calls.

    ``watermark``: the ``gc`` node (cleanup raises it, retention and the log tail read it);
    ``fence``: the orphan fence; ``catch_up``: apply the log to its end; ``wait_snapshot``: wait
    until a CSN is applied here; ``table``: a table's definition now; ``incarnation``: the
    replica's, now (it changes with each new session); ``poke_follower``: make the follower look
    at the log now; ``alive_record``: what the replica would publish in its alive node now;
    ``refresh_alive``: republish it when it changed."""

    config: ReplicaConfig
    state: ReplicaState
    storage: Storage
    zk: KazooClient
    log: CsnLog
    watermark: Watermark
    fence: OrphanFence
    catch_up: Callable[[], None]
    wait_snapshot: Callable[..., Any]
    table: Callable[..., TableDef]
    incarnation: Callable[[], int]
    poke_follower: Callable[[], None]
    alive_record: Callable[[], AliveRecord]
    refresh_alive: Callable[[], None]

    @property
    def host_id(self) -> str:
        """The replica's host id (its settings')."""
        return self.config.host_id


class ReplicaPart:
    """A part of one replica: the context's fields kept under their own names."""

    def __init__(self, context: ReplicaContext) -> None:
        self.context = context
        self.config, self.state, self.storage = context.config, context.state, context.storage
        self.zk, self.log, self.host_id = context.zk, context.log, context.host_id
