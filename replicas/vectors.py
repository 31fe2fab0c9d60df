"""The deletion vectors of this replica's keys tables (docs/architecture/keys-vectors.md; the
rules are pure, in coordinator/core/deletions.py): which rows of each visible part a read at a
snapshot leaves out, so that a whole read of a keys table is a read of its parts minus those
rows, with no fold.

They are derived from the log alone, so every replica has the same: a keys target's vectors are
first derived from the parts visible at the snapshot a read asks for, then followed commit by
commit, in CSN order, from the state's records (the parts each CSN added and removed in the
target), each new part's key columns, ``_op`` and ``_seq`` read once (a small part's from its
record). A merge (its output holds ``_ver``) or an overwrite derives them again at its CSN from
the versions already held. They answer for snapshots from where they were derived on; an older
snapshot, a part they do not know, or a key whose row is an UPDATE that is not whole (the
columns it did not write differ from the row it updated: checked here on the part files, never
believed; ``NeedsFold``) makes :meth:`KeysVectors.dead_rows` answer None, and the reader folds as before.

Memory: the key column, ``_op``, ``_seq`` and ``_ver`` of each live part of the keys targets
read so far (the parts removed by a merge leave with it), and the vectors' key index: bounded by
the live rows, not by history.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from coordinator.core import deletions, keytables
from coordinator.core.deletions import NeedsFold, PartVersions, TargetVectors, derive
from coordinator.core.errors import MergetxnError
from coordinator.core.tabledata import partition_key
from coordinator.core.versions import Tid
from coordinator.model.catalog import TableDef
from parts.io.format import read_part
from parts.io.storage import Storage
from parts.model.meta import PartMeta
from replicas.state import ReplicaState

log = logging.getLogger(__name__)

Rows = np.ndarray


@dataclass
class _Target:
    """One keys target's vectors and the versions they were computed from."""

    table: str
    pkey: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    vectors: TargetVectors | None = None
    done: int = 0  # the vectors follow the log up to this CSN
    versions: dict[str, PartVersions] = field(default_factory=dict)  # of the parts they hold
    # the parts a derive found a fold in: while none of them is removed, it is not tried again
    failed: frozenset[str] = frozenset()
    used: float = field(default_factory=time.monotonic)  # the last read it answered


IDLE_SECONDS = 600.0  # a target no read asked for this long is dropped (derived again if asked)


class KeysVectors:
    """Vectors of the keys targets whole reads asked for lately."""

    def __init__(self, state: ReplicaState, storage: Storage) -> None:
        self._state, self._storage = state, storage
        self._targets: dict[tuple[str, int, str], _Target] = {}  # by table, its creation CSN, partition
        self._lock = threading.Lock()

    def dead_rows(self, tdef: TableDef, snapshot: int, metas: Sequence[PartMeta]) -> dict[str, Rows] | None:
        """The rows of each of ``metas`` (the committed parts of keys table ``tdef`` visible at
        ``snapshot``) that a read at ``snapshot`` leaves out, or None: the reader folds."""
        out: dict[str, Rows] = {}
        by_target: dict[str, list[PartMeta]] = {}
        for m in metas:
            by_target.setdefault(partition_key(m.partition), []).append(m)
        for pkey, group in by_target.items():
            target = self._target(tdef, pkey)
            with target.lock:
                try:
                    got = self._answer(target, tdef, snapshot, group)
                except (MergetxnError, OSError) as exc:
                    # A part that cannot be read (cleanup took it, it rotted): the reader folds
                    # and meets the same part on its own road, which says what is wrong with it.
                    log.info("deletion vectors of %s: %r; the read folds", tdef.name, exc)
                    target.vectors, got = None, None
            if got is None:
                return None
            out.update(got)
        return out

    def check(self, tdef: TableDef) -> list[tuple[str, str]]:
        """``(part, why)`` for each part of keys table ``tdef`` whose vector, as held, names a row
        the part does not have, or differs from the vector derived afresh from the part files at
        the CSN the vectors follow to (``mergetxn check``). Vectors found wrong are let go: the
        next read derives them again."""
        with self._lock:
            targets = [
                t for (table, made, _), t in self._targets.items() if (table, made) == (tdef.name, tdef.created_csn)
            ]
        problems: list[tuple[str, str]] = []
        for t in targets:
            with t.lock:
                try:
                    found = self._check_target(t, tdef)
                except (MergetxnError, OSError):
                    continue  # a part that cannot be read: the storage check names it
                if found:
                    t.vectors, t.versions = None, {}
                problems += found
        return problems

    def _check_target(self, t: _Target, tdef: TableDef) -> list[tuple[str, str]]:
        held = t.vectors
        recs = [self._state.part(n) for n in t.versions]
        if held is None or any(r is None for r in recs):
            return []
        metas = [r.meta for r in recs if r is not None]
        csns = self._state.creation_csns(m.name for m in metas)
        try:
            fresh: TargetVectors | None = derive(t.done, [(csns[m.name], self._versions(tdef, m)) for m in metas])
        except NeedsFold:
            fresh = None
        found = []
        for m in metas:
            rows = np.unique(held.dead_at(m.name, t.done))
            if len(rows) and int(rows[-1]) >= m.rows:
                found.append((m.name, f"its deletion vector names row {int(rows[-1])} of a part of {m.rows} rows"))
            elif fresh is None or not np.array_equal(rows, np.unique(fresh.dead_at(m.name, t.done))):
                found.append((m.name, f"its deletion vector at {t.done} is not the one its table's part files give"))
        return found

    def _target(self, tdef: TableDef, pkey: str) -> _Target:
        """The target's entry, by the table's incarnation (a table dropped and created again
        under its name, perhaps with other key types, gets vectors of its own); making one first
        lets go of those :meth:`let_go` would."""
        key = (tdef.name, tdef.created_csn, pkey)
        with self._lock:
            target = self._targets.get(key)
            if target is None:
                self._let_go()
                target = self._targets[key] = _Target(tdef.name, pkey)
            target.used = time.monotonic()
            return target

    def let_go(self) -> None:
        """Forget the targets of tables dropped since and those no read asked for in
        ``IDLE_SECONDS`` (the reaper, every half second, and before a new target is made): what
        is held follows the tables read lately, not every table there ever was."""
        with self._lock:
            self._let_go()

    def _let_go(self) -> None:
        if not self._targets:
            return  # nothing held: the state's lock not taken
        now, live = time.monotonic(), self._state.incarnations()
        self._targets = {k: v for k, v in self._targets.items() if k[:2] in live and now - v.used < IDLE_SECONDS}

    def sizes(self) -> dict[str, int]:
        """info()'s structures: the keys targets held, and the parts they hold versions of."""
        with self._lock:
            targets = list(self._targets.values())
        return {"vector_targets": len(targets), "vector_parts": sum(len(t.versions) for t in targets)}

    def _answer(self, t: _Target, tdef: TableDef, snapshot: int, metas: Sequence[PartMeta]) -> dict[str, Rows] | None:
        names = {m.name for m in metas}
        if t.vectors is not None and snapshot < t.vectors.base:
            return None  # older than where they were derived: the reader folds
        if t.vectors is not None and t.done < self._state.pruned:
            t.vectors = None  # not followed for longer than the state keeps what each commit did
        if t.vectors is None:
            if t.failed and t.failed <= names:
                return None  # the fold that stopped them is still visible
            self._derive(t, tdef, snapshot, metas)
        elif snapshot > t.done:
            self._follow(t, tdef, snapshot)
            if t.vectors is not None and t.done < self._state.pruned:
                t.vectors = None  # pruned while followed: derive again on the next read
        v = t.vectors
        if v is None or snapshot < v.base or any(n not in v for n in names):
            return None
        return {m.name: v.dead_at(m.name, snapshot) for m in metas}

    def _derive(self, t: _Target, tdef: TableDef, csn: int, metas: Iterable[PartMeta]) -> None:
        metas = list(metas)
        csns = self._state.creation_csns(m.name for m in metas)
        if len(csns) < len(metas):
            t.vectors = None  # a part forgotten meanwhile: derive on the next read
            return
        t.versions = {m.name: t.versions.get(m.name) or self._versions(tdef, m) for m in metas}
        try:
            vectors = derive(csn, [(csns[m.name], t.versions[m.name]) for m in metas])
            self._check_whole(tdef, vectors)
            t.vectors, t.failed = vectors, frozenset()
        except NeedsFold:
            t.vectors, t.failed = None, frozenset(t.versions)
        t.done = csn

    def _follow(self, t: _Target, tdef: TableDef, upto: int) -> None:
        """Bring the vectors from ``t.done`` up to ``upto`` (at or below the applied CSN), one
        CSN at a time (:meth:`_step`), then let go of what no retained snapshot reads."""
        for csn, added, removed in self._commits(t, tdef, upto):
            if t.vectors is None:
                return
            try:
                self._step(t, t.vectors, tdef, csn, added, removed)
            except NeedsFold:
                t.vectors, t.failed = None, frozenset(t.versions)
                return
            t.done = csn
        t.done = max(t.done, upto)
        if t.vectors is not None:
            self._settle(t, t.vectors, tdef)

    def _step(
        self, t: _Target, v: TargetVectors, tdef: TableDef, csn: int, added: list[PartMeta], removed: set[str]
    ) -> None:
        """One commit at ``csn``: a merge (one folded output of sources the vectors hold) by
        ``TargetVectors.merge`` at the snapshot its transaction read, so snapshots before it keep
        their vectors; a commit of unfolded parts (an overwrite's removals too) by
        ``TargetVectors.commit``; anything else (a folded output that is not a plain merge of
        live rows, such as a minor compaction's, which keeps deletes, or a merge redone on parts
        made after its snapshot) derives them again at ``csn`` from the versions already held."""
        fresh = [self._versions(tdef, m) for m in added]
        kept = {n: x for n, x in t.versions.items() if n not in removed}
        t.versions = {**kept, **{x.name: x for x in fresh}}
        held = all(n in v for n in removed)
        # Parts removed without a merge's output: only a whole target at once (an overwrite)
        # goes by commit; a part taken from beside others could bring an older version back.
        if held and not any(keytables.folded(m) for m in added) and (not removed or not kept):
            v.commit(csn, fresh, removed)
            self._check_whole(tdef, v)
            return
        read_at = _merge_snapshot(added[0]) if held and len(added) == 1 and removed else None
        # A merge redone on the current parts (its sources rewritten meanwhile) keeps its first
        # snapshot in its id but read parts made after it: the merge rule does not hold for it.
        made = self._state.creation_csns(removed)
        if read_at is not None and all(made.get(n, read_at + 1) <= read_at for n in removed):
            try:
                v.merge(csn, fresh[0], sorted(removed), read_at)
                return
            except ValueError as exc:
                log.info("deletion vectors of %s: %s; derived again at %d", tdef.name, exc, csn)
        metas = [r.meta for n in t.versions if (r := self._state.part(n)) is not None]
        self._derive(t, tdef, csn, metas)

    def _settle(self, t: _Target, v: TargetVectors, tdef: TableDef) -> None:
        """Forget the parts no retained snapshot of the table sees (removed at or below the
        floor below which its snapshots are gone, or forgotten by the state), and fold the
        deltas at or below that floor into one per part: what is held is bounded by the live
        parts and the retention window, not by history."""
        floor = self._state.lost_below(tdef.name)
        for name in v.names():
            if name in t.versions:
                continue
            r = self._state.part(name)
            if r is None or (r.removal_csn is not None and r.removal_csn <= floor):
                v.forget(name)
        v.settle(floor)

    def _commits(self, t: _Target, tdef: TableDef, upto: int) -> list[tuple[int, list[PartMeta], set[str]]]:
        """The CSNs in ``(t.done, upto]`` that added or removed parts of this target, in order,
        with what each added and removed."""
        by_csn: dict[int, tuple[list[PartMeta], set[str]]] = {}
        names = list(t.versions)
        for csn, meta in self._state.created_since(tdef.name, t.pkey, t.done):
            if csn <= upto:
                by_csn.setdefault(csn, ([], set()))[0].append(meta)
                names.append(meta.name)  # and perhaps removed again before ``upto``
        for name in names:
            r = self._state.part(name)
            if r is not None and r.removal_csn is not None and t.done < r.removal_csn <= upto:
                by_csn.setdefault(r.removal_csn, ([], set()))[1].add(name)
        return [(csn, *by_csn[csn]) for csn in sorted(by_csn)]

    def _check_whole(self, tdef: TableDef, v: TargetVectors) -> None:
        """Check the UPDATE rows ``v`` took as whole rows since the last check against the rows
        they update, on the part files (``deletions.whole``); NeedsFold when one is not."""
        claims = v.claims()
        if claims is None:
            return
        cols = [c for c in tdef.schema.names if c not in tdef.primary_key]
        read: dict[str, pa.Table] = {}  # a part both updates and bases come from is read once
        updates = self._rows_at(tdef, claims.part, claims.row, [*cols, keytables.COLS], read)
        bases = self._rows_at(tdef, claims.base_part, claims.base_row, [*cols, keytables.COLS], read)
        ok = deletions.whole(updates.select(cols), bases.select(cols), updates.column(keytables.COLS).to_pylist())
        if not bool(ok.all()):
            bad = int(np.flatnonzero(~ok)[0])
            raise NeedsFold(
                f"row {int(claims.row[bad])} of part {claims.part[bad]} updates a row it does not hold whole "
                f"({int((~ok).sum())} such rows)"
            )

    def _rows_at(
        self, tdef: TableDef, names: np.ndarray, rows: Rows, columns: list[str], read: dict[str, pa.Table]
    ) -> pa.Table:
        """Columns ``columns`` of row ``rows[i]`` of part ``names[i]`` (a null row where the name
        is None), in that order; each part read once (``read``: the parts read so far)."""
        schema = pa.schema(
            [
                tdef.schema.field(c).with_nullable(True) if c in tdef.schema.names else pa.field(c, pa.string())
                for c in columns
            ]
        )
        pieces = [pa.table([pa.nulls(1, f.type) for f in schema], schema=schema)]
        index, at = np.zeros(len(rows), np.int64), 1
        for name in {n for n in names.tolist() if n is not None}:
            rec = self._state.part(name)
            if rec is None:
                raise NeedsFold(f"part {name} is gone")
            sel = np.flatnonzero(names == name)
            if name not in read:
                read[name] = read_part(self._storage, rec.meta, columns=columns)
            data = read[name].take(pa.array(rows[sel]))
            pieces.append(data.select(columns).cast(schema))
            index[sel] = at + np.arange(len(sel))
            at += len(sel)
        return pa.concat_tables(pieces).take(pa.array(index))

    def _versions(self, tdef: TableDef, meta: PartMeta) -> PartVersions:
        """A part's key columns, ``_op``, ``_seq`` and (a merge's output) ``_ver``, read once."""
        cols = [*tdef.primary_key, keytables.OP, keytables.SEQ]
        if keytables.folded(meta):
            cols.append(keytables.VER)
        return PartVersions.of(meta.name, read_part(self._storage, meta, columns=cols), tdef.primary_key)


def _merge_snapshot(output: PartMeta) -> int | None:
    """The snapshot a merge's transaction read its sources at (in its id), or None."""
    try:
        return Tid.parse(output.creation_tid).start_csn
    except ValueError:
        return None
