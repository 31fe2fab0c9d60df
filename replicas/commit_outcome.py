"""The lost answer of a commit multi: did it happen? Looked up before anybody is answered.

When the connection to ZooKeeper drops during the commit multi, the multi may or may not have
happened. The group committer (replicas/committer.py) never answers "unknown": once connected
again, it ``sync``s the log, pulls it to its end and looks for the batch's first transaction
there. Found: committed at that CSN; not found: the multi did not happen (decide again), unless
the session was lost, which fences this replica's incarnation: then it never will.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    OperationTimeoutError,
    SessionExpiredError,
)

from coordinator.core import retries
from coordinator.core.errors import OutcomeUnknown, TransactionAborted

if TYPE_CHECKING:
    from coordinator.zk.log import CsnLog
    from replicas.follower import Follower
    from replicas.state import ReplicaState
    from replicas.zksession import ZkSession

log = logging.getLogger(__name__)

# What kazoo raises when a request's outcome is unknown (the connection went during it).
UNKNOWN_OUTCOME = (ConnectionLoss, ConnectionClosedError, OperationTimeoutError, SessionExpiredError)


class LostAnswers:
    """Resolves the outcome of a commit multi whose answer the connection lost."""

    def __init__(self, log: CsnLog, follower: Follower, state: ReplicaState, zk_session: ZkSession) -> None:
        self.log, self.follower, self.state, self.zk_session = log, follower, state, zk_session

    def resolve(self, tid: str, exc: Exception) -> int | None:
        """After a lost connection: did our multi commit? Answer only once we know: the CSN of
        ``tid`` (the batch's first member), None when the multi did not happen; TransactionAborted
        when it did not and the session is lost (it never will)."""
        log.warning("connection lost during commit multi (%r); looking up %s in the log", exc, tid)
        zk = self.log.zk
        with self.state.outcomes_kept():  # the window forgets nothing until the answer is found
            for attempt in retries.log_lookup():
                with attempt:
                    if not zk.connected:
                        raise ConnectionLoss("waiting for ZooKeeper")
                    zk.sync(self.log.log_path())
                    self.follower.pull()
            csn = self.state.commit_csn(tid)
        if csn is None and self.state.forgotten(tid):
            # Began below the outcome window and found neither there nor in a part record: the
            # multi may have happened, so "it did not" would be a guess (and a retry a second
            # commit). Not found in the log is not told either way.
            raise OutcomeUnknown(
                f"the outcome of the commit of {tid} cannot be told: it began below this replica's "
                f"outcome window (outcome_seconds), whose older commits are forgotten; ask commit_status({tid})",
                id=tid,
            )
        if csn is None and self.zk_session.lost.is_set():
            raise TransactionAborted(f"replica lost its ZooKeeper session; {tid} did not commit")
        return csn
