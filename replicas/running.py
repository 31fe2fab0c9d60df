"""Running transactions on one replica: their staged operations and how those fold into changes.

A transaction stages operations (:data:`coordinator.model.records.StagedOp`: insert, overwrite, truncate,
delete, update, compact), each with the parts it added and removed. :func:`fold` turns the
operation list into the effect the commit entry carries: parts added and removed per target, and
the operation kinds per target that the conflict rules look at.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from coordinator.core.conflicts import Kind, Summary
from coordinator.core.readsets import Read
from coordinator.core.tabledata import partition_key
from coordinator.core.versions import Tid
from coordinator.model.records import Change, Compact, StagedOp, TxnState
from parts.model.meta import PartMeta


@dataclass
class Effect:
    """The folded result of a transaction's operations."""

    added: dict[str, PartMeta] = field(default_factory=dict)
    removed: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (table, pkey)
    kinds: dict[tuple[str, str], set[Kind]] = field(default_factory=lambda: defaultdict(set))
    whole_tables: set[str] = field(default_factory=set)
    discarded: list[PartMeta] = field(default_factory=list)  # own parts removed again
    # A flush's removed inlined parts -> (bundle path, offset) of their bytes (Compact.spilled)
    spilled: dict[str, tuple[str, int]] = field(default_factory=dict)

    def add_op(self, op: StagedOp, removed_pkeys: dict[str, str]) -> None:
        """Fold one operation in; ``removed_pkeys`` gives the partition of committed parts."""
        for name in op.removed:
            own = self.added.pop(name, None)
            if own is not None:
                self.discarded.append(own)
                self.kinds[(op.table, partition_key(own.partition))].add(op.operation_kind)
            else:
                pkey = removed_pkeys[name]
                self.removed[name] = (op.table, pkey)
                self.kinds[(op.table, pkey)].add(op.operation_kind)
        for meta in op.added:
            self.added[meta.name] = meta
            self.kinds[(op.table, partition_key(meta.partition))].add(op.operation_kind)
        for pkey in op.partitions or ():
            self.kinds[(op.table, pkey)].add(op.operation_kind)
        if op.whole_table:
            self.whole_tables.add(op.table)
        if isinstance(op, Compact):
            self.spilled.update((name, (path, at)) for name, path, at in op.spilled if name in self.removed)

    def removed_in(self, table: str, pkey: str) -> frozenset[str]:
        return frozenset(n for n, tp in self.removed.items() if tp == (table, pkey))

    def summaries(self, tid: str) -> dict[tuple[str, str], Summary]:
        """The effect per target, as the conflict rules and target selection take it."""
        removed: dict[tuple[str, str], set[str]] = defaultdict(set)
        for name, tp in self.removed.items():
            removed[tp].add(name)
        return {tp: Summary(tid, frozenset(kinds), frozenset(removed.get(tp, ()))) for tp, kinds in self.kinds.items()}

    def changes(self) -> list[Change]:
        """Per-target change records for the log entry, deterministic order (the committer
        applies these objects to its own state as they are: no re-parse of its own entry)."""
        added: dict[tuple[str, str], list[PartMeta]] = defaultdict(list)
        for m in sorted(self.added.values(), key=lambda m: m.name):
            added[(m.table, partition_key(m.partition))].append(m)
        out = []
        for (table, pkey), kinds in sorted(self.kinds.items()):
            removed = tuple(sorted(self.removed_in(table, pkey)))
            out.append(
                Change(
                    table,
                    pkey,
                    tuple(sorted(kinds, key=lambda k: k.value)),
                    tuple(added.get((table, pkey), ())),
                    removed,
                    {n: self.spilled[n] for n in removed if n in self.spilled},
                )
            )
        return out


@dataclass
class RunningTxn:
    tid: Tid
    snapshot: int
    started: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)
    ops: list[StagedOp] = field(default_factory=list)
    state: TxnState = TxnState.RUNNING
    reason: str = ""
    csn: int | None = None
    rows: int = 0
    # The smallest per-table limits among the tables it staged into (catalog.effective_limits),
    # each with its table; None: only the replica-wide limit.
    max_seconds: tuple[float, str] | None = None
    max_rows: tuple[int, str] | None = None
    apps: dict[str, int] = field(default_factory=dict)  # app id -> version (tx.set_app_version)
    reads: list[Read] = field(default_factory=list)  # a serializable transaction's (coordinator/core/readsets.py)
    # coordinator/model/atomicity.py: "none" takes no key locks and reads the latest applied state;
    # durability "async" is answered once queued, its outcome kept for client.flush() under ``session``.
    atomicity: str = "full"
    durability: str = "sync"
    session: str | None = None
    owner: str | None = None  # the user that began it (secured clusters: replicas/users.py)
    table_limits: bool = True  # False: only the replica-wide limits bind it (a restore's, begun by an admin)
    lock: threading.Lock = field(default_factory=threading.Lock)
    id: str = field(init=False)  # str(tid), asked for many times per commit

    def __post_init__(self) -> None:
        self.id = str(self.tid)

    @property
    def latest_reads(self) -> bool:
        """Whether its reads see the latest applied state instead of its snapshot (atomicity
        "none": non-atomic transactions read the most recently written data,
        docs/rules.md#atomicity-and-durability)."""
        return self.atomicity == "none"

    @property
    def async_session(self) -> str | None:
        """The client session whose async commits this one is ordered after (None: not async)."""
        return self.session if self.durability == "async" else None

    def own_parts(self) -> tuple[list[PartMeta], set[str]]:
        """Parts this transaction added and still keeps, and committed parts it removed."""
        added: dict[str, PartMeta] = {}
        removed: set[str] = set()
        for op in self.ops:
            for n in op.removed:
                if added.pop(n, None) is None:
                    removed.add(n)
            for m in op.added:
                added[m.name] = m
        return list(added.values()), removed

    def describe(self) -> dict:
        return {
            "id": self.id,
            "tid": list(self.tid),
            "snapshot": self.snapshot,
            "state": self.state,
            "age_seconds": round(time.monotonic() - self.started, 3),
            "started_at": self.started_wall,
            "operations": len(self.ops),
            "rows": self.rows,
            "apps": dict(self.apps),
            "tables": sorted({op.table for op in self.ops}),
            "reason": self.reason,
            "csn": self.csn,
            "atomicity": self.atomicity,
            "durability": self.durability,
            "owner": self.owner,
            "session": self.session,  # the client session holding it (replicas/sessions.py)
        }
