"""Keys tables (SPEC.md "Keys tables", seed 003): the pure rules, no I/O.

A ``keys`` table has a primary key; each write is a *version* of the rows it names. A part of
such a table holds the key columns, every other column (nullable there: a delete or an update
leaves some unset) and three hidden columns:

* ``_op``: :data:`PUT` (overwrite mode: ``tx.insert``, ``tx.upsert(update=False)``; absent
  columns are null), :data:`UPDATE` (``tx.upsert(update=True)``: only the columns named in
  ``_cols`` change), :data:`DELETE`, or a read lock (``tx.lock_keys``: :data:`LOCK_STRONG`,
  :data:`LOCK_WEAK`), which reads skip;
* ``_seq``: the order of the version within its transaction (later writes win);
* ``_cols``: for an update, the written non-key columns, comma-separated.

A compaction's output part has a fourth, ``_ver``: each row's *version*, the CSN of the commit
that wrote it (a part written by a transaction has none: its rows' version is the part's
creation CSN). Reads fold versions per key (:func:`merge`) in (version, ``_seq``) order; a
transaction's own parts come after everything committed.

Compaction (:func:`fold`) replaces the versions of its source parts by fewer versions that every
read seeing the output folds to the same rows. A folded row keeps the version of the last one it
replaces, so it sorts exactly where that one did: a part written between two sources' commits, or
after the sources but before the compaction committed, keeps its place in the order (the
compaction's own CSN orders nothing). Only versions with no version of another part between them
are folded together (a run); a run of UPDATEs stays an UPDATE (the base may be in a part the
compaction did not read), and a DELETE is dropped only when no older version of its key exists
in any part. Read locks are dropped: a compaction's output is never a key write
(:func:`folded`; replicas/keylocks.py skips it), and the parts it replaced stay in storage while a
transaction whose snapshot precedes them runs (replicas/cleanup.py), so the commit-time key check
still reads them.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from coordinator.errors import InvalidInput

PUT, UPDATE, DELETE = 0, 1, 2
LOCK_STRONG, LOCK_WEAK = 3, 4  # tx.lock_keys: read locks, never rows
LOCK_MODES = {"shared_strong": LOCK_STRONG, "shared_weak": LOCK_WEAK}
OP, SEQ, COLS, VER = "_op", "_seq", "_cols", "_ver"
HIDDEN = (OP, SEQ, COLS, VER)
ATOMICITY = ("full", "none")
OWN = float("inf")  # the order of a transaction's own (uncommitted) parts


def check_definition(name: str, schema: pa.Schema, partition_by: Sequence[str], primary_key: Sequence[str],
                     policy: str, lock_groups: Mapping[str, Sequence[str]] | None,
                     atomicity: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Validate what a ``keys`` table adds to CREATE TABLE (the schema and column names are
    checked before); returns the lock groups as sorted ``(group, columns)`` pairs. Every
    problem is InvalidInput naming it."""
    where = f"create table {name!r}"
    if policy != "keys":
        if lock_groups:
            raise InvalidInput(f"{where}: lock_groups need conflict_policy='keys' (not {policy!r})", table=name)
        if atomicity != "full":
            raise InvalidInput(f"{where}: atomicity={atomicity!r} needs conflict_policy='keys' (not {policy!r})",
                               table=name)
        return ()
    if atomicity not in ATOMICITY:
        raise InvalidInput(f"{where}: atomicity must be 'full' or 'none', not {atomicity!r}", table=name)
    if not primary_key:
        raise InvalidInput(f"{where}: conflict_policy='keys' needs a primary_key", table=name)
    problems = []
    hidden = [c for c in schema.names if c in HIDDEN]
    if hidden:
        problems.append(f"column name(s) {hidden} are reserved in a keys table")
    nullable = [c for c in primary_key if schema.field(c).nullable]
    if nullable:
        problems.append(f"primary key column(s) {nullable} must be declared not null "
                        "(pyarrow.field(..., nullable=False))")
    outside = [c for c in partition_by if c not in primary_key]
    if outside:
        problems.append(f"partition column(s) {outside} must be primary key columns (a key lives in one partition)")
    groups: list[tuple[str, tuple[str, ...]]] = []
    if lock_groups is not None and not isinstance(lock_groups, Mapping):
        problems.append(f"lock_groups must map a group name to column names, not {type(lock_groups).__name__}")
        lock_groups = None
    owner: dict[str, str] = {}
    for group, cols in (lock_groups or {}).items():
        if not isinstance(group, str) or not group.isidentifier():
            problems.append(f"lock group name {group!r} is not an identifier")
            continue
        if isinstance(cols, str) or not isinstance(cols, Iterable):
            problems.append(f"lock group {group!r} must list column names, not {cols!r}")
            continue
        cols = tuple(cols)
        if not cols:
            problems.append(f"lock group {group!r} has no columns")
        for c in cols:
            if c not in schema.names:
                problems.append(f"lock group {group!r}: unknown column {c!r}")
            elif c in primary_key:
                problems.append(f"lock group {group!r}: {c!r} is a primary key column (keys are under every lock)")
            elif c in owner:
                problems.append(f"column {c!r} is in lock groups {owner[c]!r} and {group!r} (at most one)")
            else:
                owner[c] = group
        groups.append((group, cols))
    if problems:
        raise InvalidInput(f"{where}: {'; '.join(problems)}", table=name)
    return tuple(sorted(groups))


# -- writes ------------------------------------------------------------------------------------
def file_schema(schema: pa.Schema, primary_key: Sequence[str]) -> pa.Schema:
    """The schema of a keys table's part: key columns as declared, the others nullable, then
    the hidden columns."""
    fields = [f if f.name in primary_key else f.with_nullable(True) for f in schema]
    return pa.schema(fields + [pa.field(OP, pa.int8(), False), pa.field(SEQ, pa.int64(), False),
                               pa.field(COLS, pa.string())])


def versions(schema: pa.Schema, primary_key: Sequence[str], table: str, data: pa.Table, op: int,
             seq: int) -> pa.Table:
    """Rows ``data`` written as versions of ``op`` (PUT, UPDATE or DELETE) in a part's layout,
    their ``_seq`` from ``seq`` on in row order. ``data`` holds the key columns and, for PUT and
    UPDATE, any of the others (all under DELETE are ignored but keys); InvalidInput names what
    is wrong (unknown or missing key columns, a null key, wrong types, and for UPDATE an absent
    non-nullable column)."""
    what = {PUT: "write", UPDATE: "update", DELETE: "delete", LOCK_STRONG: "lock", LOCK_WEAK: "lock"}[op]
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if not isinstance(data, pa.Table):
        raise InvalidInput(f"{what} {table!r}: data must be a pyarrow.Table, got {type(data).__name__}", table=table)
    names = data.column_names
    problems = []
    unknown = [n for n in names if n not in schema.names]
    if unknown:
        problems.append(f"unknown column(s) {unknown}")
    missing = [k for k in primary_key if k not in names]
    if missing:
        problems.append(f"missing primary key column(s) {missing}")
    if op in (DELETE, LOCK_STRONG, LOCK_WEAK):
        names = [n for n in names if n in primary_key]
    elif op == UPDATE:
        absent = [f.name for f in schema if f.name not in names and not f.nullable and f.name not in primary_key]
        if absent:
            problems.append(f"update mode leaves non-nullable column(s) {absent} unset: write them too")
    if problems:
        raise InvalidInput(f"{what} {table!r}: {'; '.join(problems)}", table=table)
    for k in primary_key:
        if data.column(k).null_count:
            raise InvalidInput(f"{what} {table!r}: primary key column {k!r} has nulls", table=table)
    from parts.ops import conform  # types and losslessness as every write checks them

    present = pa.schema([schema.field(n) for n in schema.names if n in names])
    data = conform(present, data.select([n for n in present.names]), table, what=what)
    n = data.num_rows
    out = file_schema(schema, primary_key)
    cols = [data.column(f.name) if f.name in present.names else pa.nulls(n, f.type) for f in schema]
    written = ",".join(c for c in present.names if c not in primary_key) if op == UPDATE else None
    cols += [pa.array([op] * n, pa.int8()), pa.array(range(seq, seq + n), pa.int64()),
             pa.array([written] * n, pa.string())]
    return pa.Table.from_arrays(cols, schema=out)


# -- reads -------------------------------------------------------------------------------------
def merge(schema: pa.Schema, primary_key: Sequence[str], parts: Iterable[tuple[float, pa.Table]]) -> pa.Table:
    """One row per key from versions: ``parts`` are ``(order, rows in the part layout)``, the
    order a committed part's creation CSN (or :data:`OWN`). For each key the versions are
    folded in (version, ``_seq``) order, a row's version its ``_ver`` (compaction output) or
    else its part's order: PUT replaces the row, UPDATE sets the columns it wrote on the row so
    far (on none: the others null), DELETE removes it. Rows come sorted by key."""
    rows: list[tuple[Any, int, dict]] = []
    for order, data in parts:
        for r in data.to_pylist():
            ver = r.get(VER)
            rows.append((order if ver is None else ver, r[SEQ], r))
    rows.sort(key=lambda t: (t[0], t[1]))
    names = schema.names
    current: dict[tuple, dict | None] = {}
    for _, _, r in rows:
        if r[OP] in (LOCK_STRONG, LOCK_WEAK):
            continue
        key = tuple(r[k] for k in primary_key)
        if r[OP] == DELETE:
            current[key] = None
        elif r[OP] == PUT:
            current[key] = {c: r[c] for c in names}
        else:
            before = current.get(key) or {c: r[c] if c in primary_key else None for c in names}
            current[key] = {**before, **{c: r[c] for c in (r[COLS] or "").split(",") if c}}
    live = [row for _, row in sorted(((k, v) for k, v in current.items() if v is not None), key=_sort_key)]
    return pa.Table.from_pylist(live, schema=schema)


def _sort_key(item: tuple[tuple, dict]) -> tuple:
    return tuple((v is None, v) for v in item[0])


# -- compaction --------------------------------------------------------------------------------
Version = tuple[int, int]  # (version CSN, _seq): a version's place in its key's order


def folded_schema(schema: pa.Schema, primary_key: Sequence[str]) -> pa.Schema:
    """The layout of a compaction's output part: a written part's plus ``_ver``."""
    return file_schema(schema, primary_key).append(pa.field(VER, pa.int64(), False))


def folded(meta: Any) -> bool:
    """Whether a part (its :class:`~parts.meta.PartMeta`) is a compaction's output, told from its
    metadata alone: its column statistics name every column of the file, and only a compaction
    writes ``_ver``. Such a part writes no key (its versions were written, and checked, before)."""
    return VER in meta.stats


def row_versions(data: pa.Table, order: int, primary_key: Sequence[str]) -> dict[tuple, list[Version]]:
    """Key -> the versions (:data:`Version`) of a committed part's rows (``order``: its creation
    CSN), read locks left out: they are no versions reads see. ``data`` needs the key columns,
    ``_op``, ``_seq`` and, for a compaction's output, ``_ver``."""
    out: dict[tuple, list[Version]] = {}
    cols = [data.column(k).to_pylist() for k in primary_key]
    ops, seqs = data.column(OP).to_pylist(), data.column(SEQ).to_pylist()
    vers = data.column(VER).to_pylist() if VER in data.column_names else [None] * data.num_rows
    for i, (op, seq, ver) in enumerate(zip(ops, seqs, vers)):
        if op not in (LOCK_STRONG, LOCK_WEAK):
            out.setdefault(tuple(c[i] for c in cols), []).append((order if ver is None else ver, seq))
    return out


def fold(schema: pa.Schema, primary_key: Sequence[str], sources: Iterable[tuple[int, pa.Table]],
         others: Mapping[tuple, Sequence[Version]]) -> pa.Table:
    """A compaction's output (:func:`folded_schema`, sorted by key then version) from the
    versions of its ``sources`` (``(creation CSN, rows)`` of committed parts) given ``others``:
    key -> the versions of that key in every other part a read may combine with the output (the
    parts visible beside the sources; later ones sort after them all and need not be given).

    Per key, the sources' versions between two versions of ``others`` form a run, folded to one
    version placed where the run's last one was (its ``_ver`` and ``_seq``): a PUT or DELETE
    absorbs what precedes it in the run, later UPDATEs apply onto it (a DELETE followed by
    UPDATEs becomes a PUT with the other columns null, as a read folds them); a run of UPDATEs
    stays one UPDATE of the union of their columns. A run that ends deleted and has no version of
    ``others`` before it is dropped: no older version is left for it to hide. Read locks go."""
    names = list(schema.names)
    by_key: dict[tuple, list[tuple[int, int, dict]]] = {}
    for order, data in sources:
        for r in data.to_pylist():
            if r[OP] in (LOCK_STRONG, LOCK_WEAK):
                continue
            ver = r.get(VER)
            by_key.setdefault(tuple(r[k] for k in primary_key), []).append((order if ver is None else ver, r[SEQ], r))
    out: list[dict] = []
    for key, vs in sorted(by_key.items(), key=_sort_key):
        vs.sort(key=lambda t: (t[0], t[1]))
        theirs = sorted(others.get(key, ()))
        run: list[dict] = []
        for i, (ver, seq, r) in enumerate(vs):
            run.append(r)
            nxt = vs[i + 1] if i + 1 < len(vs) else None
            at = bisect_left(theirs, (ver, seq))
            if nxt is not None and bisect_left(theirs, (nxt[0], nxt[1])) == at:
                continue  # no other version between this one and the next: same run
            row = _fold_run(run, names, primary_key)
            run = []
            if row[OP] == DELETE and at == 0:
                continue
            out.append({**row, SEQ: seq, VER: ver})
    return pa.Table.from_pylist(out, schema=folded_schema(schema, primary_key))


def _fold_run(run: list[dict], names: list[str], primary_key: Sequence[str]) -> dict:
    """One version equivalent to applying ``run`` in order onto any row (or none)."""
    op: int | None = None
    row: dict[str, Any] = {}
    written: list[str] = []
    for r in run:
        if r[OP] == PUT:
            op, row = PUT, {c: r[c] for c in names}
        elif r[OP] == DELETE:
            op, row = DELETE, {c: r[c] if c in primary_key else None for c in names}
        else:
            cols = [c for c in (r[COLS] or "").split(",") if c]
            if op is None or op == UPDATE:
                op = UPDATE
                written += [c for c in cols if c not in written]
                row = {**(row or {c: r[c] if c in primary_key else None for c in names}), **{c: r[c] for c in cols}}
            else:
                base = row if op == PUT else {c: r[c] if c in primary_key else None for c in names}
                op, row = PUT, {**base, **{c: r[c] for c in cols}}
    cols_text = ",".join(c for c in names if c in written) if op == UPDATE else None
    return {**row, OP: op, COLS: cols_text}


# -- locks -------------------------------------------------------------------------------------
# A lock is a lock group's name or PRIMARY. Writing a key takes the locks of the columns it
# writes: every lock in overwrite mode, the groups of the written columns in update mode (a
# column in no group is under PRIMARY), PRIMARY for a delete. PRIMARY overlaps every lock.
# A read lock (STRONG, WEAK) collides with any write of the key by the other side; a strong one
# committed also makes later writers fail, a weak one leaves nothing (seed 003). Read locks
# never collide with each other.
PRIMARY = "@primary"  # no group is named so (groups are identifiers)
STRONG, WEAK = "@read:strong", "@read:weak"
READS = frozenset({STRONG, WEAK})
KeyLocks = dict[tuple, frozenset[str]]  # key -> the locks written under it


def locks(op: int, written: Iterable[str], lock_groups: Sequence[tuple[str, Sequence[str]]]) -> frozenset[str]:
    """The locks a version of ``op`` takes; ``written``: an update's non-key columns."""
    if op == PUT:
        return frozenset([PRIMARY, *(g for g, _ in lock_groups)])
    if op == DELETE:
        return frozenset([PRIMARY])
    if op == LOCK_STRONG:
        return frozenset([STRONG])
    if op == LOCK_WEAK:
        return frozenset([WEAK])
    group_of = {c: g for g, cols in lock_groups for c in cols}
    return frozenset(group_of.get(c, PRIMARY) for c in written) or frozenset([PRIMARY])


def overlap(a: frozenset[str], b: frozenset[str]) -> bool:
    """Whether two sets of locks on one key collide."""
    return bool(a and b) and (bool(a & b) or PRIMARY in a or PRIMARY in b)


def written_locks(data: pa.Table, primary_key: Sequence[str],
                  lock_groups: Sequence[tuple[str, Sequence[str]]]) -> KeyLocks:
    """Key -> locks for the versions of a part (its key columns, ``_op`` and ``_cols``)."""
    out: dict[tuple, frozenset[str]] = {}
    cache: dict[tuple[int, str | None], frozenset[str]] = {}
    cols = [data.column(k).to_pylist() for k in primary_key]
    for i, (op, written) in enumerate(zip(data.column(OP).to_pylist(), data.column(COLS).to_pylist())):
        held = cache.get((op, written))
        if held is None:
            held = cache[(op, written)] = locks(op, (written or "").split(",") if written else (), lock_groups)
        key = tuple(c[i] for c in cols)
        out[key] = out.get(key, frozenset()) | held
    return out


def collide(mine: frozenset[str], theirs: frozenset[str]) -> bool:
    """Whether a committing transaction holding ``mine`` on a key loses to one that committed
    after its snapshot holding ``theirs`` there."""
    mw, tw = mine - READS, theirs - READS
    return overlap(mw, tw) or (bool(mw) and STRONG in theirs) or (bool(tw) and bool(mine & READS))


def first_collision(mine: KeyLocks, theirs: KeyLocks) -> tuple | None:
    """A key (the least) on which ``mine`` collides with ``theirs`` (:func:`collide`), or None."""
    both = [k for k in mine.keys() & theirs.keys() if collide(mine[k], theirs[k])]
    return min(both, key=lambda k: tuple((v is None, v) for v in k)) if both else None


def why(mine: frozenset[str], theirs: frozenset[str]) -> str:
    """How two lock sets on a key collide (:func:`collide`), for the loser's message."""
    mw, tw = mine - READS, theirs - READS
    if overlap(mw, tw):
        return "wrote it under an overlapping lock"
    if mw and STRONG in theirs:
        return "held a strong read lock on it"
    return "wrote it while this transaction held a read lock on it"


# -- changes -----------------------------------------------------------------------------------
def key_of(row: Mapping[str, Any], primary_key: Sequence[str]) -> tuple:
    return tuple(row[k] for k in primary_key)


def apply_version(current: dict[tuple, dict | None], r: Mapping[str, Any], names: Sequence[str],
                  primary_key: Sequence[str]) -> tuple | None:
    """Fold one version row onto ``current`` (key -> row, None once deleted) as :func:`merge`
    does; returns its key (None for a read lock, which changes nothing)."""
    if r[OP] in (LOCK_STRONG, LOCK_WEAK):
        return None
    key = key_of(r, primary_key)
    if r[OP] == DELETE:
        current[key] = None
    elif r[OP] == PUT:
        current[key] = {c: r[c] for c in names}
    else:
        before = current.get(key) or {c: r[c] if c in primary_key else None for c in names}
        current[key] = {**before, **{c: r[c] for c in (r[COLS] or "").split(",") if c}}
    return key


def changes_schema(schema: pa.Schema) -> pa.Schema:
    return schema.append(pa.field("_change", pa.string())).append(pa.field("_csn", pa.int64()))


def row_changes(schema: pa.Schema, primary_key: Sequence[str], before: pa.Table,
                commits: Iterable[tuple[int, Sequence[pa.Table]]]) -> pa.Table:
    """The row changes of a keys table, one commit after the other: for each key a commit wrote
    whose row it changed, a ``delete`` of the row it had (if any) and an ``insert`` of the row
    it has after (if any), deletes first, keys sorted, with ``_csn``. ``before``: the rows (at
    least those of the keys written) at the snapshot before the first commit; ``commits``:
    ``(csn, version tables)`` in CSN order. A rewrite of a row to the same values, a read lock
    and a delete of a missing key change nothing and show nothing, so what the rows of ``changes``
    add up to is always what a read at the end returns."""
    names = schema.names
    current: dict[tuple, dict | None] = {key_of(r, primary_key): r for r in before.to_pylist()}
    out: list[dict] = []
    for csn, parts in commits:
        rows = sorted((r for t in parts for r in t.to_pylist()), key=lambda r: r[SEQ])
        old: dict[tuple, dict | None] = {}
        for r in rows:
            key = key_of(r, primary_key)
            if key not in old:
                old[key] = current.get(key)
            apply_version(current, r, names, primary_key)
        deletes, inserts = [], []
        for key in sorted(old, key=lambda k: tuple((v is None, v) for v in k)):
            was, now = old[key], current.get(key)
            if was == now:
                continue
            if was is not None:
                deletes.append({**was, "_change": "delete", "_csn": csn})
            if now is not None:
                inserts.append({**now, "_change": "insert", "_csn": csn})
        out += deletes + inserts
    return pa.Table.from_pylist(out, schema=changes_schema(schema))


def keys_filter(primary_key: Sequence[str], schema: pa.Schema, rows: pa.Table) -> Any:
    """A filter matching (at least) the keys of ``rows``: ``isin`` per key column."""
    import pyarrow.compute as pc

    expr = None
    for k in primary_key:
        values = pa.array(sorted(set(rows.column(k).to_pylist()), key=lambda v: (v is None, v)),
                          schema.field(k).type)
        term = pc.field(k).isin(values)
        expr = term if expr is None else expr & term
    return expr
