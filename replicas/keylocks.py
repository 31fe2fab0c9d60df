"""Key-level conflicts of keys tables at commit (docs/rules.md#locks; the rules are pure, in
coordinator/core/keytables.py).

A transaction that writes or read-locks a keys table loses with ``ConflictError`` (kind
``KEY_WRITTEN``) when, for a key it writes, a transaction that committed after its snapshot wrote
that key under an overlapping lock or held a strong read lock on it, or, for a key it
read-locked, such a transaction wrote it (``keytables.collide``).

The parts to verify are looked up by the keys written, not found by probing every part committed
since the snapshot: the state indexes each keys target's parts by the keys their summaries list
(``ReplicaState.key_writers``, coordinator/core/keyindex.py: a small commit, at most
``keytables.EXACT_ROWS`` versions, lists them), so the check costs what the keys written cost,
whatever the number of commits in between. The parts that list no keys (large commits) are
probed as before: a part whose key summary (``PartMeta.key_summary``: key range and Bloom filter,
coordinator/core/keytables.py) cannot hold any key the committer writes or locks is skipped
unopened. Every candidate is verified exactly: its keys and locks come from the summary's exact
versions (``keytables.exact_locks``), else are read from the file (key columns and the hidden
``_op``/``_cols`` only), cached by part name (parts never change). So neither an index entry
nor a filter's false positive ever makes a conflict; the committer's own parts are found the
same way. A target the state does not index (its parts applied while it was no keys table) is
checked part by part since the snapshot (``ReplicaState.created_since``), as the index would.

Atomic across replicas: a keys table is not ``parts``, so every commit on it checks and bumps
its target node (the partition's; :mod:`coordinator.core.targets`), and the committer decides against
the state at the versions it read: a commit of another replica in between moves the version and
the multi misses, and the batch is decided again. Within one batch, members share a keys target
only when they have no key in common there (:meth:`KeyConflicts.shares_target`, from the keys
:meth:`KeyConflicts.check` just read for each): a member with a key in common waits for the next
batch, which decides it against the first one's commit. So writers of different keys share one
multi (group commit), as appends to a ``parts`` table do.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping

from coordinator.core import batching, keytables
from coordinator.core.conflicts import Policy, Summary
from coordinator.core.errors import ConflictError, ConflictKind, quote
from coordinator.core.tabledata import partition_key
from coordinator.model.catalog import TableDef
from parts.io.format import read_part
from parts.model.meta import PartMeta

CACHE_PARTS = 4096
PLANNED = 4096  # members whose keys are remembered for batching (a batch is far smaller)


class KeyConflicts:
    def __init__(self, state, storage, table_of: Callable[[str], TableDef]) -> None:
        self.state = state
        self.storage = storage
        self.table_of = table_of
        self._cache: dict[str, keytables.KeyLocks] = {}
        # tid -> (table, partition key) -> the keys it writes or locks there, as its last check
        # found them: what shares_target compares members of one batch by.
        self._planned: OrderedDict[str, dict[tuple[str, str], frozenset[tuple]]] = OrderedDict()
        self.reads = 0  # parts read from storage (their keys and locks), for tests and benchmarks
        self.skipped = 0  # parts committed since a snapshot that their summary ruled out unread
        self.looked_up = 0  # targets checked through the state's key index (not part by part)

    def _locks(self, tdef: TableDef, meta: PartMeta) -> keytables.KeyLocks:
        if keytables.folded(meta):
            return {}  # a compaction's output writes no key (coordinator/core/keytables.py, "Compaction")
        got = self._cache.get(meta.name)
        if got is None:
            got = keytables.exact_locks(meta.key_summary, len(tdef.primary_key), tdef.lock_groups)
        if got is None:
            data = read_part(self.storage, meta, [*tdef.primary_key, keytables.OP, keytables.COLS])
            self.reads += 1
            got = keytables.written_locks(data, tdef.primary_key, tdef.lock_groups)
            if len(self._cache) >= CACHE_PARTS:
                self._cache.clear()
            self._cache[meta.name] = got
        return got

    def check(self, tid: str, snapshot: int, added: Mapping[str, PartMeta], policies: Mapping[str, Policy]) -> None:
        """Raise ConflictError if a part ``tid`` adds to a keys table collides with a part that
        another transaction committed there after ``snapshot`` (the earliest such commit)."""
        mine: dict[tuple[str, str], list[PartMeta]] = {}
        for meta in added.values():
            if policies.get(meta.table) is Policy.KEYS:
                mine.setdefault((meta.table, partition_key(meta.partition)), []).append(meta)
        planned: dict[tuple[str, str], frozenset[tuple]] = {}
        self._planned[tid] = planned
        self._planned.move_to_end(tid)
        while len(self._planned) > PLANNED:
            self._planned.popitem(last=False)
        for (table, pkey), metas in sorted(mine.items()):
            tdef = self.table_of(table)
            written: keytables.KeyLocks = {}
            for m in metas:
                for k, held in self._locks(tdef, m).items():
                    written[k] = written.get(k, frozenset()) | held
            planned[(table, pkey)] = frozenset(written)
            for csn, winner, meta in self._candidates(tdef, pkey, snapshot, tid, written):
                theirs = self._locks(tdef, meta)
                key = keytables.first_collision(written, theirs)
                if key is not None:
                    shown = dict(zip(tdef.primary_key, key))
                    raise ConflictError(
                        f"transaction {tid} lost to {winner} on table {table!r} key {quote(shown)}: {winner} "
                        f"{keytables.why(written[key], theirs[key])} (committed at CSN {csn}, after this transaction's "
                        f"snapshot {snapshot})",
                        winner=winner,
                        kind=str(ConflictKind.KEY_WRITTEN),
                        table=table,
                        key=list(key),
                        csn=csn,
                    )

    def _candidates(
        self, tdef: TableDef, pkey: str, snapshot: int, tid: str, written: keytables.KeyLocks
    ) -> list[tuple[int, str, PartMeta]]:
        """``(CSN, creator, meta)`` of the parts of other transactions committed on the target
        after ``snapshot`` that may write a key of ``written``, in commit order: looked up by key
        in the state's index, the parts that list no keys probed by their filters."""
        found = self.state.key_writers(tdef.name, pkey, snapshot, written, len(tdef.primary_key))
        if found is None:
            found = [(csn, meta, False) for csn, meta in self.state.created_since(tdef.name, pkey, snapshot)]
        else:
            self.looked_up += 1
        out = []
        hashed: dict[tuple, tuple[int, int]] | None = None
        mixed = None
        for csn, meta, listed in found:
            if meta.creation_tid == tid:
                continue
            if not listed:
                if hashed is None:
                    hashed = {k: keytables.key_hash(k) for k in written}
                    mixed = keytables.mixed_hashes(written)  # once, not per part probed
                if not keytables.may_hold_any(meta.key_summary, hashed, mixed):
                    self.skipped += 1
                    continue
            out.append((csn, meta.creation_tid, meta))
        return out

    def planned(self, tid: str) -> Mapping[tuple[str, str], frozenset[tuple]] | None:
        """The keys ``tid`` writes or locks per keys target, as its last check found them (None:
        not checked, as a transaction of atomicity "none"): what the committer compares the
        members of one batch by (coordinator/core/batching.py, shares_keys)."""
        return self._planned.get(tid)

    def shares_target(
        self,
        policies: Mapping[str, Policy],
        targets: Mapping[tuple[str, str], Summary],
        in_batch: Mapping[tuple[str, str], list[Summary]],
    ) -> bool:
        """Whether a member (``targets``: its summaries per target) must wait for the next batch
        because it has a key in common with a member already accepted into the batch on a keys
        target they both write (or the keys of either are not known here)."""
        mine = self.planned(next(iter(targets.values())).tid) if targets else None
        return batching.shares_keys(policies, targets, mine, in_batch, self.planned)
