"""Outcomes decidable from any replica (docs/rules.md#outcomes).

A transaction commits only through the commit multi of the replica that began it (its owner),
and that multi checks the owner node ``replicas/<host>`` at the version the owner registered
with: its incarnation, which every tid carries (coordinator/core/versions.py). So the owner node is a
fence, as ClickHouse checks its session in the same multi:

* while the owner node still holds the tid's incarnation and the owner is alive (its ephemeral
  alive node exists), only the owner can decide: ask it;
* once the owner node moved past that incarnation (the owner restarted, or re-registered after
  its session expired), no multi of the tid can happen any more: whatever the log holds after a
  catch-up is final;
* when the owner is gone (no alive node: its session expired or it stopped) but its node still
  holds the tid's incarnation, this replica bumps the owner node by compare-and-swap (fencing
  that incarnation) and then reads the log: committed with its CSN, or aborted for good. An owner
  that comes back finds its incarnation moved and cannot commit the transaction any more.

"Aborted" is never remembered: it is what the log's silence means once the owner can no longer
commit, and the silence means it only above the outcome window's floor (``outcome_seconds``,
replicas/state.py). A transaction that began below the floor may have committed at a CSN whose
outcome was forgotten: unless a part record it added or removed still names it (then
``committed`` with that CSN) or its owner still holds it (running, or among its last ended),
the answer is ``unknown``, with a reason saying that it is older than the window.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kazoo.exceptions import BadVersionError, NoNodeError
from kazoo.retry import RetryFailedError

from coordinator.core import retries
from coordinator.core.errors import InvalidInput, MergetxnError, ReplicaUnavailable
from coordinator.core.versions import Tid, incarnation_of
from coordinator.model.records import AliveRecord, CommitStatus, TxnState
from coordinator.model.znodes import OwnerRecord
from coordinator.wire.rpc import RpcClient
from replicas.commit_outcome import UNKNOWN_OUTCOME
from replicas.context import ReplicaContext, ReplicaPart

if TYPE_CHECKING:
    from replicas.registry import Transactions

log = logging.getLogger(__name__)

ASK_OWNER_SECONDS = 3.0  # how long a forwarded question waits for the owner's answer
DECIDE_SECONDS = 30.0  # how long deciding retries while the owner node keeps moving
# ZooKeeper away while deciding (a connection lost, a session expired, kazoo's retries spent): it
# was a bare MergetxnError "commit_status failed on the replica: ConnectionLoss()", seen in the
# secure chaos campaign while a ZooKeeper node was killed.
ZK_AWAY = (*UNKNOWN_OUTCOME, RetryFailedError)


class _Moved(retries.TryAgain):
    """The owner node moved while this replica was fencing it: look again."""


class Outcomes(ReplicaPart):
    """``commit_status`` for a transaction of any replica."""

    def __init__(
        self,
        context: ReplicaContext,
        transactions: Transactions,
    ) -> None:
        """The settings' ``credentials`` are for asking another replica (secured)."""
        super().__init__(context)
        self.transactions, self.incarnation, self.catch_up = transactions, context.incarnation, context.catch_up
        self.credentials = context.config.credentials

    def status(self, tid_text: str, forward: bool = True) -> CommitStatus:
        """The outcome of ``tid_text``. ``forward``: ask the owner when only it can decide (a
        forwarded question is not forwarded again)."""
        try:
            tid = Tid.parse(tid_text)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        tid_text = str(tid)
        committed = self._committed(tid_text)
        if committed is not None:
            return committed
        try:
            if tid.host_id == self.host_id:
                return self._own(tid, tid_text)
            for attempt in retries.foreign_outcome(DECIDE_SECONDS, on=_Moved):
                with attempt:
                    return self._foreign(tid, tid_text, forward)
        except ZK_AWAY as exc:  # the question is asked again as it is: here later, or elsewhere
            raise ReplicaUnavailable(
                f"replica {self.host_id} lost ZooKeeper while deciding the outcome of {tid_text} "
                f"({type(exc).__name__}); ask again, or another replica",
                id=tid_text,
            ) from None
        raise AssertionError("unreachable")

    def _committed(self, tid_text: str) -> CommitStatus | None:
        csn = self.state.commit_csn(tid_text)
        return None if csn is None else CommitStatus(tid_text, TxnState.COMMITTED, csn, "")

    def _not_committed(self, tid_text: str, why: str) -> CommitStatus:
        """``aborted`` for a transaction not in the log, when the log's silence tells (it began
        at or above the outcome window's floor); ``unknown`` when it may have committed below."""
        if not self.state.forgotten(tid_text):
            return CommitStatus(tid_text, TxnState.ABORTED, None, why)
        state = self.state
        return CommitStatus(
            tid_text,
            TxnState.UNKNOWN,
            None,
            f"too old to know: it began at CSN {Tid.parse(tid_text).start_csn}, below the outcome window of "
            f"replica {self.host_id}, which remembers only the commits above CSN {state.outcome_floor} "
            f"(outcome_seconds={state.outcome_seconds:g}); no part record names it",
        )

    def _own(self, tid: Tid, tid_text: str) -> CommitStatus:
        txn = self.transactions.lookup(tid_text)
        if txn is not None:
            return CommitStatus(tid_text, txn.state, txn.csn, txn.reason)
        if incarnation_of(tid) > self.incarnation():
            return CommitStatus(
                tid_text,
                TxnState.ABORTED,
                None,
                f"no such transaction: replica {tid.host_id} is at incarnation {self.incarnation()}",
            )
        return self._not_committed(
            tid_text,
            "not committed; not running on this replica (it ended, or "
            "the replica restarted; a transaction that wrote nothing leaves no trace once it ended)",
        )

    def _final(self, tid_text: str, why: str, never: bool = False) -> CommitStatus:
        """The owner can no longer commit ``tid_text``: the log after a catch-up is the answer.
        ``never``: no commit of it can ever have happened, forgotten or not."""
        self.catch_up()
        committed = self._committed(tid_text)
        if committed is not None:
            return committed
        return CommitStatus(tid_text, TxnState.ABORTED, None, why) if never else self._not_committed(tid_text, why)

    def _foreign(self, tid: Tid, tid_text: str, forward: bool) -> CommitStatus:
        zk, layout = self.zk, self.log
        owner_path = layout.replica_path(tid.host_id)
        incarnation = incarnation_of(tid)
        zk.retry(zk.sync, owner_path)
        stat = zk.retry(zk.exists, owner_path)
        if stat is None:
            # (every commit multi checks that node, which is never deleted)
            return self._final(tid_text, f"not committed: no replica {tid.host_id} ever registered", never=True)
        if stat.version > incarnation:
            return self._final(
                tid_text,
                f"not committed, and it never will be: replica {tid.host_id} restarted "
                f"or was fenced since it began the transaction (one that wrote nothing "
                f"committed at its snapshot without a log entry)",
            )
        if stat.version < incarnation:
            return CommitStatus(
                tid_text,
                TxnState.ABORTED,
                None,
                f"no such transaction: replica {tid.host_id} has not reached incarnation {incarnation}",
            )
        try:
            data, _ = zk.retry(zk.get, layout.alive_path(tid.host_id))
        except NoNodeError:
            data = None
        if data is None:
            # The owner is gone: fence its incarnation, then the log decides.
            fenced = OwnerRecord(tid.host_id, fenced_by=self.host_id).encode()
            try:
                zk.retry(zk.set, owner_path, fenced, version=stat.version)
            except (BadVersionError, NoNodeError):
                raise _Moved() from None
            log.warning(
                "replica %s is gone: fenced its incarnation %d to decide %s", tid.host_id, incarnation, tid_text
            )
            return self._final(
                tid_text,
                f"not committed, and it never will be: replica {tid.host_id} was gone "
                f"(no live ZooKeeper session); replica {self.host_id} fenced it",
            )
        if not forward:
            return CommitStatus(tid_text, TxnState.RUNNING, None, f"replica {tid.host_id} is alive and decides it")
        return self._ask_owner(tid, tid_text, AliveRecord.decode(data))

    def _ask_owner(self, tid: Tid, tid_text: str, alive: AliveRecord) -> CommitStatus:
        """The owner is alive and only it can decide: ask it."""
        pending = (
            f"replica {tid.host_id} (at {alive.address or 'no address yet'}) is alive in ZooKeeper and decides "
            f"this transaction, but did not answer"
        )
        if not alive.address:
            return CommitStatus(tid_text, TxnState.COMMITTING, None, pending)
        client = RpcClient(alive.address, ASK_OWNER_SECONDS, self.credentials)
        try:
            answer = CommitStatus.from_dict(client.call("commit_status", {"tid": tid_text, "forwarded": True}))
        except (ReplicaUnavailable, MergetxnError, OSError) as exc:
            return CommitStatus(
                tid_text,
                TxnState.COMMITTING,
                None,
                f"{pending} ({exc}); ask again: once it answers or its session expires, any replica decides",
            )
        finally:
            client.close()
        return self._committed(tid_text) or answer
