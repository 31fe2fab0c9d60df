"""The row-by-row fold of a keys table's versions, as coordinator/core/keytables.py had it before the columnar fold:
kept only as the reference that tests/unit/test_keys_fold.py checks the columnar fold
(coordinator/core/keyfold.py) against. Plain Python over dicts, one version at a time: slow, and easy
to read as the definition of what a read, a compaction and ``changes`` of a keys table give."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from coordinator.core.keytables import (
    COLS,
    DELETE,
    LOCK_STRONG,
    LOCK_WEAK,
    OP,
    PUT,
    SEQ,
    UPDATE,
    VER,
    changes_schema,
    folded_schema,
)

Version = tuple[int, int]  # (version CSN, _seq): a version's place in its key's order


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
        apply_version(current, r, names, primary_key)
    live = [row for _, row in sorted(((k, v) for k, v in current.items() if v is not None), key=_sort_key)]
    return pa.Table.from_pylist(live, schema=schema)


def _sort_key(item: tuple[tuple, dict]) -> tuple:
    return tuple((v is None, v) for v in item[0])


def key_of(row: Mapping[str, Any], primary_key: Sequence[str]) -> tuple:
    return tuple(row[k] for k in primary_key)


def apply_version(
    current: dict[tuple, dict | None], r: Mapping[str, Any], names: Sequence[str], primary_key: Sequence[str]
) -> tuple | None:
    """Fold one version row onto ``current`` (key -> row, None once deleted): PUT replaces the
    row, UPDATE sets the columns it wrote (on no row: the others null), DELETE removes it; the
    step of :func:`merge` and :func:`row_changes`. Returns its key (None for a read lock, which
    changes nothing)."""
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


def fold(
    schema: pa.Schema,
    primary_key: Sequence[str],
    sources: Iterable[tuple[int, pa.Table]],
    others: Mapping[tuple, Sequence[Version]],
) -> pa.Table:
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


def row_changes(
    schema: pa.Schema, primary_key: Sequence[str], before: pa.Table, commits: Iterable[tuple[int, Sequence[pa.Table]]]
) -> pa.Table:
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
