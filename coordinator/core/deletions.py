"""Deletion vectors of a keys table (SPEC.md "Keys tables by deletion vectors"): which rows of
which parts later versions superseded, as of each CSN. Pure: arrays in, row positions out.

Every replica computes them the same way, at apply and in log order, from the parts' own
columns (never from what a writer says of them: SPEC.md "Nothing a writer claims is believed"),
one :class:`TargetVectors` per keys target (a table's partition: a key lives in one):

* a commit's versions of one key are ordered by ``_seq``; the last is the key's row unless it is
  a DELETE; every other row the commit wrote (its earlier versions, its DELETEs, its read locks)
  is dead from birth: in its own part's vector at the commit's CSN;
* the key's row before the commit, in whatever part holds it, is dead at the commit's CSN;
* a merge of source parts read at snapshot ``m0`` and committed at ``M`` writes the rows of its
  sources that are live at ``m0``, once each; the output's rows whose keys a commit in
  ``(m0, M]`` superseded in a source are dead at ``M``; the sources leave the index, their
  vectors stay for the snapshots that still see them, until :meth:`TargetVectors.forget`.

A part's vector at snapshot ``s`` is the union of its deltas at CSNs at or before ``s``
(:meth:`TargetVectors.dead_at`). Deltas at or below a floor (the oldest snapshot a reader may
take) fold into one (:meth:`TargetVectors.settle`), so a part holds at most one delta per commit
that touched it inside the retention window.

Rows are whole rows: a read of a part minus its vector is the table's rows from that part, with
no fold. An update-mode version (UPDATE) is written whole (the columns it did not write hold the
key's values at its writer's snapshot), but that is the writer's claim: a key whose row is an
UPDATE is claimed with every UPDATE it builds on (:class:`Claims`), and the vectors answer only
once the caller has read those rows and found each equal to the row it updates in every column
it did not write (:func:`whole`); one that is not (a concurrent update of another lock group, a
writer that lied, a writer from before whole rows) leaves the target to the fold.

The index keeps, per live part, only the keys of its rows that were live at birth, sorted (one
numpy array and the rows beside it: 12 to 16 bytes per key for numeric keys), and a mask of its
rows dead now; finding the row a new version supersedes is one binary search per part whose key
range meets the commit's keys.
"""

from __future__ import annotations

import array
import base64
import binascii
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap

from coordinator.core.errors import CorruptMetadata, quote
from coordinator.core.keytables import DELETE, LOCK_STRONG, LOCK_WEAK, OP, PUT, SEQ, UPDATE, VER

Rows = np.ndarray  # sorted, distinct row positions (int64)
_NO_ROWS: Rows = np.empty(0, np.int64)


def encode_rows(rows: Rows) -> str:
    """Row positions as text for the wire: a portable roaring bitmap, base64."""
    bitmap = BitMap(array.array("I", np.asarray(rows, np.uint32).tobytes()))
    return base64.b64encode(bitmap.serialize()).decode("ascii")


def decode_rows(text: object, rows: int) -> Rows:
    """The row positions :func:`encode_rows` wrote, checked against a part of ``rows`` rows:
    ValueError naming what is wrong when it is not a bitmap of positions below ``rows``."""
    if not isinstance(text, str) or len(text) > 8 * rows + 64:
        raise ValueError(f"a deletion vector must be a base64 string of at most {8 * rows + 64} characters")
    try:
        bitmap = BitMap.deserialize(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"a deletion vector does not decode: {exc}") from None
    out = np.frombuffer(bitmap.to_array(), np.uint32).astype(np.int64)
    if len(out) and int(out[-1]) >= rows:
        raise ValueError(f"a deletion vector names row {int(out[-1])} of a part of {rows} rows")
    return out


def sent_vectors(table: str, vectors: object, parts: Sequence[tuple[str, int]]) -> dict[str, Rows]:
    """The deletion vectors a replica sent for ``parts`` (``(name, rows)`` each) of ``table``,
    decoded and checked: one for every part, each naming rows the part has; anything else is
    CorruptMetadata naming what is wrong."""
    try:
        if not isinstance(vectors, dict):
            raise ValueError("the vectors are not a mapping of part names")
        return {name: decode_rows(vectors[name], rows) for name, rows in parts}
    except KeyError as exc:
        raise CorruptMetadata(f"the replica's deletion vectors of {quote(table)} lack part {exc}") from None
    except ValueError as exc:
        raise CorruptMetadata(f"the replica's deletion vectors of {quote(table)}: {exc}") from None


def key_array(columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """A part's key per row, comparable across parts: the column itself for a one-column key
    (numeric keys stay numeric), tuples of the columns' values otherwise."""
    if len(columns) == 1:
        return np.asarray(columns[0].to_numpy(zero_copy_only=False))
    values = [c.to_pylist() for c in columns]
    return np.fromiter(zip(*values), dtype=object, count=len(values[0]) if values else 0)


@dataclass(frozen=True)
class PartVersions:
    """What the vectors read of a part: per row, its key, ``_op`` and ``_seq``."""

    name: str
    keys: np.ndarray
    ops: np.ndarray
    seqs: np.ndarray
    vers: np.ndarray | None = None  # a merge's output: each row's version (its ``_ver``)

    def __post_init__(self) -> None:
        if not len(self.keys) == len(self.ops) == len(self.seqs) == len(self.keys if self.vers is None else self.vers):
            raise ValueError(f"part {self.name}: keys, ops, seqs and versions differ in length")

    @classmethod
    def of(cls, name: str, data: pa.Table, primary_key: Sequence[str]) -> PartVersions:
        """From a part's key columns, ``_op``, ``_seq`` and ``_ver`` (each optional: every row a
        PUT, in row order, of the part's own version)."""
        n, names = data.num_rows, data.column_names
        ops = data.column(OP).to_numpy() if OP in names else np.zeros(n, np.int8)
        seqs = data.column(SEQ).to_numpy() if SEQ in names else np.arange(n)
        vers = data.column(VER).to_numpy() if VER in names else None
        return cls(name, key_array([data.column(k) for k in primary_key]), ops, seqs, vers)


@dataclass
class _Part:
    """One part as the vectors know it."""

    id: int
    name: str
    keys: np.ndarray  # the key of each row
    dead: np.ndarray  # bool per row: dead now
    deltas: list[tuple[int, Rows]] = field(default_factory=list)  # (csn, rows dead from then), in CSN order
    live: bool = True  # still in the index (not removed by a merge or an overwrite)

    def mark(self, csn: int, rows: Rows) -> Rows:
        """Rows dead from ``csn`` on; returns those not dead before."""
        rows = rows[~self.dead[rows]]
        if len(rows):
            self.dead[rows] = True
            if self.deltas and self.deltas[-1][0] == csn:
                self.deltas[-1] = (csn, np.union1d(self.deltas[-1][1], rows))
            else:
                self.deltas.append((csn, np.unique(rows)))
        return rows

    def dead_up_to(self, snapshot: int) -> np.ndarray:
        dead = np.zeros(len(self.keys), bool)
        for csn, rows in self.deltas:
            if csn <= snapshot:
                dead[rows] = True
        return dead


_GONE = (-1, -1)


class _Index:
    """Key -> (part id, row) of the key's live row: a sorted base and a dict of the changes since
    it was last rebuilt. A lookup is one binary search over the base and one dict probe per key;
    a write of many keys (a load, a merge) rebuilds the base at once, a few go to the dict."""

    def __init__(self, bulk: int) -> None:
        self.bulk = bulk  # a write of this many keys rebuilds the base
        self.keys: np.ndarray | None = None
        self.parts = np.empty(0, np.int64)
        self.rows = np.empty(0, np.int64)
        self.over: dict[object, tuple[int, int]] = {}

    def __len__(self) -> int:
        return (0 if self.keys is None else len(self.keys)) + len(self.over)

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, Rows]:
        """(part id, row) of each of ``keys`` (sorted), -1 where it has none."""
        parts, rows = np.full(len(keys), -1, np.int64), np.full(len(keys), -1, np.int64)
        if self.keys is not None and len(self.keys) and len(keys):
            idx = np.searchsorted(self.keys, keys)
            inside = idx < len(self.keys)
            hit = np.zeros(len(keys), bool)
            hit[inside] = self.keys[idx[inside]] == keys[inside]
            parts[hit], rows[hit] = self.parts[idx[hit]], self.rows[idx[hit]]
        if self.over:
            for i, k in enumerate(keys.tolist()):
                got = self.over.get(k)
                if got is not None:
                    parts[i], rows[i] = got
        return parts, rows

    def point(self, keys: np.ndarray, parts: np.ndarray, rows: Rows, stale: set[int]) -> None:
        """Point ``keys`` (sorted, distinct) at (part, row); a part id of -1 drops the key.
        ``stale``: parts removed whole (an overwrite) whose entries a rebuild drops; emptied
        then."""
        if len(keys) >= self.bulk or self.keys is None:
            self._rebuild(keys, parts, rows, stale)
            return
        for k, p, r in zip(keys.tolist(), parts.tolist(), rows.tolist()):
            self.over[k] = (p, r)
        if len(self.over) > max(self.bulk * 16, len(self.keys) // 4):
            self._rebuild(keys[:0], parts[:0], rows[:0], stale)

    def _rebuild(self, keys: np.ndarray, parts: np.ndarray, rows: Rows, stale: set[int]) -> None:
        """The base again: the dict's changes, then ``keys`` (the last of a key wins), merged
        into the base by binary search (no sort of the base); dropped keys and the entries of
        ``stale`` parts are left out."""
        ck = np.concatenate([_like(list(self.over), keys), keys])
        over = np.array(list(self.over.values()), np.int64).reshape(-1, 2)
        cp, cr = np.concatenate([over[:, 0], parts]), np.concatenate([over[:, 1], rows])
        order = _sorted_order(ck)
        ck, cp, cr = ck[order], cp[order], cr[order]
        last = np.ones(len(ck), bool)
        if len(ck) > 1:
            last[:-1] = ck[1:] != ck[:-1]
        ck, cp, cr = ck[last], cp[last], cr[last]
        base, bp, br = (self.keys, self.parts, self.rows) if self.keys is not None else (ck[:0], cp[:0], cr[:0])
        keep = np.ones(len(base), bool)
        if len(base) and len(ck):
            idx = np.searchsorted(base, ck)
            inside = idx < len(base)
            hit = np.zeros(len(ck), bool)
            hit[inside] = base[idx[inside]] == ck[inside]
            keep[idx[hit]] = False
        gone = np.array(sorted(stale), np.int64)
        if len(gone):
            keep &= ~np.isin(bp, gone)
        base, bp, br = base[keep], bp[keep], br[keep]
        add = (cp >= 0) & ~np.isin(cp, gone)
        at = np.searchsorted(base, ck[add])
        self.keys, self.parts, self.rows = (
            np.insert(base, at, ck[add]),
            np.insert(bp, at, cp[add]),
            np.insert(br, at, cr[add]),
        )
        self.over = {}
        stale.clear()


def _like(values: list[object], like: np.ndarray) -> np.ndarray:
    """``values`` (Python scalars or tuples from ``tolist``) as an array of ``like``'s dtype."""
    if like.dtype == object:
        return np.fromiter(values, dtype=object, count=len(values))
    return np.array(values, dtype=like.dtype)


class NeedsFold(ValueError):
    """A live row is not whole: an UPDATE whose columns it did not write differ from the row it
    updates (:func:`whole`), so the key's row is the fold of its versions, which a vector cannot
    express."""


@dataclass(frozen=True)
class Claims:
    """UPDATE rows the vectors hold as whole rows, each beside the row it updates: the part and
    row of each (``part``, ``row``) and of its base (``base_part`` None: the key had no row, or
    was deleted, so the columns the UPDATE did not write must be null). They are whole rows only
    if :func:`whole` says so of every one: the caller reads them and checks."""

    part: np.ndarray  # object: part names
    row: Rows
    base_part: np.ndarray  # object: part names or None
    base_row: Rows


class TargetVectors:
    """The deletion vectors of one keys target, updated commit by commit in log order; they
    answer for snapshots at or above ``base`` (below it: :meth:`dead_at` raises KeyError)."""

    def __init__(self, bulk: int = 4096, base: int = 0) -> None:
        self.base = base
        self._parts: dict[str, _Part] = {}
        self._by_id: dict[int, _Part] = {}
        self._next_id = 0
        self._index = _Index(bulk)
        self._stale: set[int] = set()  # parts an overwrite removed, until the index drops their entries
        self._claims: list[Claims] = []  # UPDATE rows taken as whole rows, until the caller checks them

    def __contains__(self, name: object) -> bool:
        return name in self._parts

    def names(self) -> list[str]:
        """The parts held (live or removed, until forgotten)."""
        return list(self._parts)

    def __len__(self) -> int:
        """Entries in the key index (one per live row, plus changes not yet folded in)."""
        return len(self._index)

    def commit(self, csn: int, added: Sequence[PartVersions], removed: Iterable[str] = ()) -> dict[str, Rows]:
        """Apply a transaction's commit at ``csn``: the parts it removed leave the index first
        (an overwrite), then its parts' versions supersede the rows of their keys. Returns, per
        part, the rows newly dead at ``csn``."""
        for name in removed:
            self._parts[name].live = False
            self._stale.add(self._parts[name].id)
        return self._take(csn, [(csn, v) for v in added])

    def claims(self) -> Claims | None:
        """The UPDATE rows taken as live whole rows since the last call (each with the row it
        updates), for the caller to check against the part files (:func:`whole`); until it has,
        the vectors are not to answer. None when there are none."""
        taken, self._claims = self._claims, []
        if not taken:
            return None
        cat = [np.concatenate([getattr(c, f) for c in taken]) for f in ("part", "row", "base_part", "base_row")]
        return Claims(*cat)

    def load(self, parts: Sequence[tuple[int, PartVersions]]) -> None:
        """Fill empty vectors with ``parts`` (each with its creation CSN), dead rows marked at
        ``base``: :func:`derive`."""
        if self._parts:
            raise ValueError("vectors are loaded once, empty")
        self._take(self.base, parts)

    def _take(self, csn: int, parts: Sequence[tuple[int, PartVersions]]) -> dict[str, Rows]:
        """Add ``parts`` (each with its version: a commit's CSN, or each part's own when vectors
        are loaded) at ``csn``: per key the last version by (version, ``_seq``) is its row unless
        a DELETE; the row it supersedes elsewhere and every other version die at ``csn``. Returns
        the rows newly dead per part. A key whose row is an UPDATE is taken as whole, and
        claimed (:meth:`claims`) with every UPDATE it builds on."""
        if not parts:
            return {}
        keys, ops, part_of, row_of = _versions(parts)
        winners, dead_born = _winners(keys, ops)
        self._claim(keys, ops, [v.name for _, v in parts], part_of, row_of)
        out: dict[str, Rows] = {}
        self._supersede(csn, keys[winners], out)
        ids = np.array([self._add(v.name, v.keys).id for _, v in parts], np.int64)
        for i, (_, version) in enumerate(parts):
            born = row_of[dead_born[part_of[dead_born] == i]]
            _note(out, version.name, self._parts[version.name].mark(csn, born))
        target = np.where(ops[winners] == DELETE, -1, ids[part_of[winners]])
        self._index.point(keys[winners], target, row_of[winners], self._stale)
        return out

    def _claim(self, keys: np.ndarray, ops: np.ndarray, names: list[str], part_of: np.ndarray, row_of: Rows) -> None:
        """Claim the UPDATEs a key's row is built on (:func:`_chains`), each beside its base: the
        version before it here, else the key's live row in the index (none: no base)."""
        chain, prev = _chains(keys, ops)
        if not len(chain):
            return
        named = np.array(names, dtype=object)
        base_part = np.full(len(chain), None, dtype=object)
        base_row = np.full(len(chain), -1, np.int64)
        here = prev >= 0
        put = here & (ops[np.maximum(prev, 0)] != DELETE)
        base_part[put], base_row[put] = named[part_of[prev[put]]], row_of[prev[put]]
        first = np.flatnonzero(~here)
        pids, rows = self._index.lookup(keys[chain[first]])
        for i, pid, row in zip(first.tolist(), pids.tolist(), rows.tolist()):
            part = self._by_id.get(pid)
            if part is not None and part.live:
                base_part[i], base_row[i] = part.name, row
        self._claims.append(Claims(named[part_of[chain]], row_of[chain], base_part, base_row))

    def merge(self, csn: int, output: PartVersions, sources: Sequence[str], snapshot: int) -> dict[str, Rows]:
        """Apply a merge committed at ``csn`` whose ``output`` holds, once each, the rows of
        ``sources`` live at ``snapshot``, every source made at or before ``snapshot`` (the
        caller's to know: a merge redone on parts made later is not one, and is derived). Returns the output's rows dead at ``csn`` (their keys
        were superseded in a source after ``snapshot``). ValueError when the output's keys are
        not exactly the sources' live keys at ``snapshot`` (the merge read something else), or
        when a row of it is not a whole row (an UPDATE folded onto a base it did not read), or
        when ``snapshot`` is below ``base`` (what was dead at it is not known)."""
        if bool(np.any(output.ops != PUT)):
            raise ValueError(f"merge output {output.name} holds rows that are not whole (not PUT)")
        if snapshot < self.base:
            # Derived at ``base``: every row dead then is marked dead at ``base``, so which of
            # them were dead at ``snapshot`` is not known here (the merge rule would take a
            # key superseded before ``snapshot`` for one superseded after it, and mark the
            # output's live row of that key dead: found by the chaos campaign as missing rows).
            raise ValueError(
                f"merge output {output.name} read its sources at {snapshot}, before the vectors' {self.base}"
            )
        olds = [self._parts[s] for s in sources]
        expected = _sorted_unique(_joined([p.keys[~p.dead_up_to(snapshot)] for p in olds], output.keys))
        order = _sorted_order(output.keys)
        got = output.keys[order]
        if len(got) != len(expected) or not bool(np.all(got == expected)):
            raise ValueError(f"merge output {output.name} does not hold exactly its sources' rows at {snapshot}")
        gone = _sorted_unique(_joined([p.keys[p.dead & ~p.dead_up_to(snapshot)] for p in olds], output.keys))
        for p in olds:
            p.live = False
        part = self._add(output.name, output.keys)
        superseded = np.isin(got, gone) if len(gone) else np.zeros(len(got), bool)
        out: dict[str, Rows] = {}
        _note(out, output.name, part.mark(csn, order[superseded].astype(np.int64)))
        alive = ~superseded
        self._index.point(got[alive], np.full(int(alive.sum()), part.id, np.int64), order[alive], self._stale)
        return out

    def dead_at(self, name: str, snapshot: int) -> Rows:
        """The rows of part ``name`` a read at ``snapshot`` leaves out (sorted). KeyError for
        a snapshot below ``base`` or a part not known."""
        if snapshot < self.base:
            raise KeyError(f"no vectors below {self.base}")
        deltas = [rows for csn, rows in self._parts[name].deltas if csn <= snapshot]
        if not deltas:
            return _NO_ROWS
        return deltas[0] if len(deltas) == 1 else np.unique(np.concatenate(deltas))

    def settle(self, floor: int) -> None:
        """Fold each part's deltas at or below ``floor`` into one (no read takes an older snapshot)."""
        for part in self._parts.values():
            old = [(c, r) for c, r in part.deltas if c <= floor]
            if len(old) > 1:
                merged = (old[-1][0], np.unique(np.concatenate([r for _, r in old])))
                part.deltas = [merged] + part.deltas[len(old) :]

    def forget(self, name: str) -> None:
        """Drop a part no snapshot sees any more (cleanup collected it)."""
        part = self._parts.pop(name, None)
        if part is not None:
            del self._by_id[part.id]

    def deltas(self, name: str) -> list[tuple[int, Rows]]:
        """Part ``name``'s deltas, in CSN order."""
        return list(self._parts[name].deltas)

    def _add(self, name: str, keys: np.ndarray) -> _Part:
        if name in self._parts:
            raise ValueError(f"part {name} is already known to the deletion vectors")
        part = self._parts[name] = _Part(self._next_id, name, keys, np.zeros(len(keys), bool))
        self._by_id[part.id] = part
        self._next_id += 1
        return part

    def _supersede(self, csn: int, keys: np.ndarray, out: dict[str, Rows]) -> None:
        """Mark dead at ``csn`` the live rows of ``keys`` (sorted, distinct)."""
        parts, rows = self._index.lookup(keys)
        for pid in np.unique(parts[parts >= 0]).tolist():
            part = self._by_id.get(pid)
            if part is not None and part.live:
                _note(out, part.name, part.mark(csn, rows[parts == pid]))


def derive(csn: int, parts: Sequence[tuple[int, PartVersions]], bulk: int = 4096) -> TargetVectors:
    """The vectors of a target at ``csn``, from scratch: ``parts`` are the parts visible then,
    each with its creation CSN. A row's version is its ``_ver`` (a merge's output) or its part's
    CSN; a key's versions are ordered by (version, ``_seq``), read locks left out, and the last
    is the key's row unless it is a DELETE. Every other row is dead at ``csn``; the vectors
    answer for ``csn`` and later. A key whose row is an UPDATE is claimed (:meth:`TargetVectors.claims`)."""
    vectors = TargetVectors(bulk, base=csn)
    vectors.load(parts)
    return vectors


def _note(out: dict[str, Rows], name: str, rows: Rows) -> None:
    if len(rows):
        out[name] = np.union1d(out[name], rows) if name in out else np.sort(rows)


def _versions(parts: Sequence[tuple[int, PartVersions]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rows of ``parts`` (each with its version), all together, sorted by (key, version,
    ``_seq``), a row's version its ``_ver`` if it has one: (keys, ops, which part, which row)."""
    keys = np.concatenate([v.keys for _, v in parts])
    ops = np.concatenate([v.ops for _, v in parts]).astype(np.int8)
    seqs = np.concatenate([v.seqs for _, v in parts]).astype(np.int64)
    vers = np.concatenate([np.full(len(v.keys), c, np.int64) if v.vers is None else v.vers for c, v in parts])
    part_of = np.concatenate([np.full(len(v.keys), i, np.int64) for i, (_, v) in enumerate(parts)])
    row_of = np.concatenate([np.arange(len(v.keys), dtype=np.int64) for _, v in parts])
    order = np.lexsort((seqs, vers))
    order = order[_sorted_order(keys[order])]
    return keys[order], ops[order], part_of[order], row_of[order]


def _winners(keys: np.ndarray, ops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Over rows sorted by (key, ``_seq``): the index of each key's last version, and of every
    row dead from birth (earlier versions, read locks; a DELETE that wins is returned with the
    winners, which it is, and here too)."""
    lock = (ops == LOCK_STRONG) | (ops == LOCK_WEAK)
    versions = np.flatnonzero(~lock)
    vkeys = keys[versions]
    last = np.ones(len(versions), bool)
    if len(versions) > 1:
        last[:-1] = vkeys[1:] != vkeys[:-1]
    winners = versions[last]
    dead = np.concatenate([versions[~last], np.flatnonzero(lock), winners[ops[winners] == DELETE]])
    return winners, dead


def _chains(keys: np.ndarray, ops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Over rows sorted by (key, version, ``_seq``): the UPDATEs after each key's last PUT or
    DELETE (so the key's row is built on them: its last version is one of them), and each one's
    previous version here (-1: none, the first of its key)."""
    versions = np.flatnonzero((ops != LOCK_STRONG) & (ops != LOCK_WEAK))
    if not len(versions) or not bool(np.any(ops[versions] == UPDATE)):
        return versions[:0], versions[:0]
    vkeys, vops = keys[versions], ops[versions]
    start = np.ones(len(versions), bool)
    start[1:] = vkeys[1:] != vkeys[:-1]
    group = np.cumsum(start) - 1
    pos = np.arange(len(versions))
    reset = np.full(int(group[-1]) + 1, -1, np.int64)
    np.maximum.at(reset, group[vops != UPDATE], pos[vops != UPDATE])
    chain = (vops == UPDATE) & (pos > reset[group])
    prev = np.where(start, -1, pos - 1)[chain]
    return versions[chain], np.where(prev >= 0, versions[np.maximum(prev, 0)], -1)


def whole(updates: pa.Table, bases: pa.Table, written: Sequence[str | None]) -> np.ndarray:
    """Whether each UPDATE row is a whole row: in every column of ``bases`` its ``written``
    (its ``_cols``: the columns it wrote, comma-separated) does not name, it holds its base's
    value (``bases``, aligned with ``updates``: a null row where the key had none). Nulls match
    nulls; a NaN matches nothing (such a row is folded, never guessed)."""
    ok = np.ones(updates.num_rows, bool)
    text = np.array(["" if w is None else w for w in written], dtype=object)
    for cols in set(text.tolist()):
        sel = pa.array(np.flatnonzero(text == cols))
        wrote = set(cols.split(","))
        for name in bases.column_names:
            if name not in wrote:
                ok[sel.to_numpy()] &= _same(updates.column(name).take(sel), bases.column(name).take(sel))
    return ok


def _same(a: pa.ChunkedArray, b: pa.ChunkedArray) -> np.ndarray:
    try:
        eq = pc.fill_null(pc.equal(a, b), False)
        return np.asarray(pc.or_(eq, pc.and_(pc.is_null(a), pc.is_null(b))).to_numpy(zero_copy_only=False), bool)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        return np.array([x == y for x, y in zip(a.to_pylist(), b.to_pylist())], bool)


def _sorted_order(keys: np.ndarray) -> np.ndarray:
    return np.argsort(keys, kind="stable")


def _joined(arrays: list[np.ndarray], like: np.ndarray) -> np.ndarray:
    return np.concatenate(arrays) if arrays else like[:0]


def _sorted_unique(keys: np.ndarray) -> np.ndarray:
    keys = keys[_sorted_order(keys)]
    if len(keys) > 1:
        keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]
    return keys
