"""What a replica is made of: the fields every one of its jobs reads (replicas/replica.py makes
them; replicas/snapshots.py, replicas/recovery.py and replicas/replica_info.py are jobs of the
same object and see them through this declaration)."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from coordinator.core.errors import ReplicaUnavailable

T = TypeVar("T")

if TYPE_CHECKING:
    from kazoo.client import KazooClient

    from coordinator.zk.alive import AliveNode
    from coordinator.zk.log import CsnLog
    from coordinator.zk.needed import NeededNodes
    from coordinator.zk.orphan_fence import OrphanFence
    from coordinator.zk.watermark import Watermark
    from parts.io.storage import Storage
    from replicas.async_commits import AsyncCommits
    from replicas.changefeed import ChangeFeed
    from replicas.checkpoint import LogTail
    from replicas.cleanup import Cleanup
    from replicas.committer import Committer
    from replicas.follower import Follower
    from replicas.leases import Leases
    from replicas.merges import Merges
    from replicas.metrics import LogWatch
    from replicas.outcomes import Outcomes
    from replicas.pauses import PauseGuard
    from replicas.registry import Transactions
    from replicas.retention import Retention
    from replicas.settings import ReplicaConfig
    from replicas.state import ReplicaState
    from replicas.users import Users
    from replicas.vectors import KeysVectors
    from replicas.wal import Wal
    from replicas.zksession import ZkSession


class ReplicaFields:
    """The replica's fields, declared once for its jobs (set by ``Replica.__init__`` and ``start``)."""

    config: ReplicaConfig
    host_id: str
    storage: Storage
    state: ReplicaState
    zk_session: ZkSession
    incarnation: int
    address: str
    zk: KazooClient
    log: CsnLog
    users: Users | None
    fence: OrphanFence
    needed: NeededNodes
    wal: Wal | None
    follower: Follower | None
    committer: Committer | None
    async_commits: AsyncCommits
    watermark: Watermark
    transactions: Transactions
    leases: Leases
    retention: Retention
    cleanup: Cleanup
    merges: Merges
    tail: LogTail | None
    log_watch: LogWatch
    metrics_address: str | None
    changefeed: ChangeFeed
    vectors: KeysVectors
    outcomes: Outcomes
    pauses: PauseGuard
    alive: AliveNode

    @property
    def started_follower(self) -> Follower:
        """The follower, made when the replica starts (ReplicaUnavailable before)."""
        return self._started(self.follower, "it follows no log yet")

    @property
    def started_committer(self) -> Committer:
        """The committer, made when the replica starts (ReplicaUnavailable before)."""
        return self._started(self.committer, "it commits nothing yet")

    @property
    def started_wal(self) -> Wal:
        """The WAL, opened when the replica starts (ReplicaUnavailable before)."""
        return self._started(self.wal, "its WAL is not open")

    def _started(self, made: T | None, missing: str) -> T:
        """``made`` (a part the replica makes when it starts); ReplicaUnavailable saying what is
        ``missing`` while it is None."""
        if made is None:
            raise ReplicaUnavailable(f"replica {self.host_id} has not started: {missing}")
        return made
