"""The running transactions of one replica: begin, lookup, staging rules, commit, rollback.

A transaction lives in memory only, from ``begin`` (its snapshot is the replica's applied CSN
and its tid is unique across restarts, see :mod:`coordinator.core.versions`) until it commits, rolls
back, is killed or passes a limit (``txn_max_seconds``, ``txn_max_rows``). Staging checks what a
statement removes is visible to the transaction and what it adds is safe from cleanup; the parts
an aborted transaction wrote are deleted at once. Commits go to the replica's group committer
(replicas/committer.py). The one-call commit of parts already in storage (``commit_parts``) and
the outcome lookups (``commit_status``, ``part_status``) are here too.

:class:`Transactions` is composed of its jobs: a transaction's life from begin to its end, with
reaping, over the registry's fields and its lock (replicas/txn_lifecycle.py), the staging rules
(replicas/staging.py), and here the commit and the outcome lookups.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING

from coordinator.core.errors import (
    CorruptMetadata,
    InvalidInput,
    TransactionAborted,
)
from coordinator.core.tabledata import partition_key
from coordinator.model.records import (
    CommitStatus,
    StagedOp,
    TxnState,
    op_from_dict,
)
from parts.model.meta import PartMeta
from replicas.running import RunningTxn
from replicas.staging import Staging, check_partition_bounds, insert_delay

__all__ = ["Transactions", "check_partition_bounds", "insert_delay"]
if TYPE_CHECKING:
    pass


class Transactions(Staging):
    """The transaction registry of one replica (``replica.transactions``): its lifecycle and
    staging rules (the base classes), the commits and the outcome lookups."""

    def committed_retry(self, args: dict) -> dict | None:
        """A one-call commit sent again (its answer was lost): every part it names was committed
        by one transaction, whose parts in that table are exactly these. Answered with that
        commit (``{"csn", "tid"}``) instead of refused; None for anything else."""
        table, added = args.get("table"), args.get("added")
        if not isinstance(table, str) or not isinstance(added, list) or not added:
            return None
        names = {m["name"] for m in added if isinstance(m, dict) and isinstance(m.get("name"), str)}
        found = [self.state.parts.get(n) for n in names]
        recs = [r for r in found if r is not None and r.meta.table == table]
        if len(names) != len(added) or len(recs) != len(found):
            return None
        tids = {r.meta.creation_tid for r in recs}
        csns = {r.creation_csn for r in recs}
        if len(tids) != 1 or len(csns) != 1:
            return None
        tid = next(iter(tids))
        theirs = self.state.created_by(table, tid)
        if theirs != names:
            return None
        csn = next(iter(csns))
        for m, rec in zip(added, (self.state.parts.get(m["name"]) for m in added)):
            assert rec is not None
            differs = _other_metadata(m, rec.meta)
            if differs is not None:
                raise InvalidInput(
                    f"part {rec.meta.name} of table {table!r} was committed at CSN {csn} (by {tid}) with other "
                    f"metadata ({differs}): a retried commit is answered with its CSN only when its metadata "
                    "is what was committed; nothing was changed. Commit the rows again as new parts (a part is "
                    "committed once) if the committed metadata is wrong, or repair it: mergetxn check --repair",
                    part=rec.meta.name,
                    table=table,
                    csn=csn,
                    field=differs,
                )
        return {"csn": csn, "tid": tid}

    def commit(self, txn_id: str) -> int | None:
        """Commit; the CSN, or None for an async commit (queued: client.flush() waits for it)."""
        txn = self._start_commit(txn_id)
        if not txn.ops and not txn.apps:
            self.finish(txn, TxnState.COMMITTED, csn=txn.snapshot)
            return txn.snapshot
        if txn.async_session is not None:
            self.async_commits.accept(txn, self.committer.submit_async)
            return None
        return self.committer.submit(txn)

    # -- one-call commits of parts already in storage (client.commit_parts) -------------------
    def parts_op(self, txn: RunningTxn, args: dict) -> StagedOp:
        """The one statement of a one-call commit: the parts become the transaction's own (their
        ``creation_tid``), and an overwrite removes what the transaction sees in the partitions
        it names (the client cannot know them before the transaction exists)."""
        op = args.get("op", "insert")
        if op not in ("insert", "overwrite"):
            raise InvalidInput(f"commit_parts op must be 'insert' or 'overwrite', not {op!r}")
        table, added = args.get("table"), args.get("added")
        if not isinstance(table, str):
            raise InvalidInput("commit_parts needs 'table', a table name")
        if not isinstance(added, list) or not all(isinstance(m, dict) for m in added):
            raise InvalidInput("commit_parts needs 'added', a list of part descriptors")
        for m in added:
            m["creation_tid"] = txn.id
        d: dict = {"op": op, "table": table, "added": added}
        if op == "overwrite":
            partitions = args.get("partitions")
            if not isinstance(partitions, list) or not all(isinstance(p, list) for p in partitions):
                raise InvalidInput("an overwrite by commit_parts needs 'partitions', a list of partition value lists")
            pkeys = [partition_key(tuple(p)) for p in partitions]
            _, visible = self.visible_parts(table, txn.id, pkeys=pkeys)
            d.update(removed=[m.name for m in visible], partitions=pkeys)
        return op_from_dict(d)

    def parts_apps(self, txn: RunningTxn, args: dict) -> None:
        """The application versions a one-call commit records (``apps``: app id -> version)."""
        apps = args.get("apps") or {}
        if not isinstance(apps, dict):
            raise InvalidInput(f"commit_parts 'apps' must map app ids to versions, not {apps!r}")
        for app_id, version in apps.items():
            self.set_app_version(txn.id, app_id, version)

    def commit_parts(self, args: dict, owner: str | None = None) -> dict:
        """Begin, stage the parts and commit, in one call; ``{"csn", "tid"}``."""
        name = args.pop("_inflight", None)
        try:
            retried = self.committed_retry(args)
            if retried is not None:
                return retried
            txn = self.begin(owner=owner)
            try:
                op = self.parts_op(txn, args)
                if op.added or op.removed or op.partitions:
                    self.stage(txn.id, op)
                self.parts_apps(txn, args)
                csn = self.commit(txn.id)
            except BaseException as exc:
                self.abort(txn, f"commit_parts failed: {exc}", "failed")
                raise
            return {"csn": csn, "tid": txn.id}
        finally:
            if name is not None:
                self.parts_call_ended(name)

    def parts_call_started(self, name: str) -> None:
        """A one-call commit naming part ``name`` was received and waits for a worker: until it
        ends, :meth:`part_status` answers "committing" (its connection may be gone already)."""
        with self._txn_lock:
            self._parts_calls[name] = self._parts_calls.get(name, 0) + 1

    def parts_call_ended(self, name: str) -> None:
        with self._txn_lock:
            left = self._parts_calls.get(name, 0) - 1
            if left > 0:
                self._parts_calls[name] = left
            else:
                self._parts_calls.pop(name, None)

    def part_status(self, table: object, name: object) -> dict:
        """Whether the one-call commit that staged part ``name`` committed: what a client whose
        connection broke during ``commit_parts`` asks (it never learnt the transaction's id)."""
        if not isinstance(table, str) or not isinstance(name, str):
            raise InvalidInput("commit_status by part needs 'table' and 'part' names")
        rec = self.state.parts.get(name)
        if rec is not None and rec.meta.table == table:
            return CommitStatus(rec.meta.creation_tid, "committed", rec.creation_csn, "").to_dict()
        with self._txn_lock:
            if name in self._parts_calls:
                return CommitStatus("", "committing", None, "the call is being answered").to_dict()
            txns = list(self.txns.values()) + list(self.finished.values())
        for txn in txns:
            if any(m.name == name and m.table == table for op in txn.ops for m in op.added):
                return CommitStatus(txn.id, txn.state, txn.csn, txn.reason).to_dict()
        return CommitStatus(
            "",
            TxnState.ABORTED,
            None,
            f"no transaction on replica {self.host_id} staged part {name} of "
            f"{table!r} (the call never reached it, or the replica restarted before committing it)",
        ).to_dict()

    def commit_async(self, txn_id: str, done: Callable[[int | None, Exception | None], None]) -> None:
        """:meth:`commit` without waiting: ``done(csn, None)`` or ``done(None, error)`` follows,
        from the committer's thread (or this one). Errors found before queueing are raised."""
        txn = self._start_commit(txn_id)
        if not txn.ops and not txn.apps:
            self.finish(txn, TxnState.COMMITTED, csn=txn.snapshot)
            done(txn.snapshot, None)
            return
        if txn.async_session is not None:  # answered now: None, queued (replicas/async_commits.py)
            self.async_commits.accept(txn, self.committer.submit_async)
            done(None, None)
            return
        self.committer.submit_async(txn, done)

    def _start_commit(self, txn_id: str) -> RunningTxn:
        txn = self.running(txn_id)
        # The modes of the transaction and of the tables it writes must agree (checked at commit,
        # docs/rules.md#atomicity-and-durability); a mismatch ends it, rolled back, before anything is queued.
        wrong = self.mismatch(txn)
        if wrong is not None:
            self.abort(txn, wrong.message, "invalid")
            raise wrong
        with txn.lock:
            if txn.state != TxnState.RUNNING:
                raise TransactionAborted(f"transaction {txn.id} is {txn.state}: {txn.reason}", id=txn.id)
            txn.state = TxnState.COMMITTING
        return txn

    def quick_txn(self, txn_id: object) -> RunningTxn | None:
        """The running transaction, if a statement or commit for it can go ahead with no waiting
        and no cleanup (not past its time limit); None otherwise, and the full path decides."""
        txn = self.txns.get(txn_id) if isinstance(txn_id, str) else None
        if txn is None or txn.state != TxnState.RUNNING or time.monotonic() - txn.started > self.time_limit(txn)[0]:
            return None
        return txn

    def lookup(self, txn_id: str) -> RunningTxn | None:
        """The transaction ``txn_id``, running or ended lately, or None (under the lock: one that
        is being retired is found in one place or the other)."""
        with self._txn_lock:
            return self.txns.get(txn_id) or self.finished.get(txn_id)

    def describe(self) -> list[dict]:
        """The running transactions, as the ``transactions`` action lists them."""
        with self._txn_lock:
            return [t.describe() for t in self.txns.values()]

    def commit_status(self, tid: str, forwarded: bool = False) -> dict:
        """Any transaction's outcome, decided here when its replica is gone (replicas/outcomes.py)."""
        return self.outcome(tid, not forwarded).to_dict()

    def notable(self) -> dict:
        """Running transactions an operator should look at (``mergetxn status``): long-running
        ones (past a tenth of their time limit) and orphaned ones (their client session silent for
        half the session timeout, or held by no session and older than the session timeout: only
        their time limit ends those), each with its holder."""
        now, timeout = time.monotonic(), self.config.client_session_timeout
        long, orphaned = [], []
        with self._txn_lock:
            txns = [t for t in self.txns.values() if t.state == TxnState.RUNNING]
        for t in txns:
            age = now - t.started
            silent = self.sessions.silent_for((t.owner, t.session), now) if t.session is not None else None
            row = {
                "id": t.id,
                "age_seconds": round(age, 3),
                "owner": t.owner,
                "session": t.session,
                "session_silent_seconds": None if silent is None else round(silent, 3),
            }
            if age > self.time_limit(t)[0] / 10:
                long.append(row)
            if (silent is not None and silent > timeout / 2) or (silent is None and age > timeout):
                orphaned.append(row)
        by_age = lambda r: -r["age_seconds"]  # noqa: E731
        return {"long_running": sorted(long, key=by_age)[:20], "orphaned": sorted(orphaned, key=by_age)[:20]}


def _other_metadata(sent: dict, committed: PartMeta) -> str | None:
    """The first field in which a part descriptor sent again differs from the committed one
    (its ``creation_tid`` is the committing transaction's, set by the replica), or None."""
    try:
        meta = PartMeta.from_dict({**sent, "creation_tid": committed.creation_tid})
    except CorruptMetadata as exc:
        return f"it does not parse: {exc.message}"
    for f in fields(PartMeta):
        if getattr(meta, f.name) != getattr(committed, f.name):
            return f.name
    return None
