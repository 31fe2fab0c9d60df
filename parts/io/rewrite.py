"""Copy-on-write rewrites of parts: DELETE, UPDATE and compaction.

Shared by the client library (which runs a statement at the transaction's snapshot) and the
replica (which redoes it on the current parts when a rebase finds its inputs rewritten), so both
produce the same result. Each function reads only the parts that can hold matching rows, writes
replacements, and says which parts it replaced.
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal, cast

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.core import keyfold, keytables
from coordinator.core.tabledata import (
    apply_delete,
    apply_update,
    decode_assignments,
    decode_expression,
    may_match,
)
from coordinator.model.catalog import TableDef
from coordinator.model.records import Compact, Mutate
from parts.io.format import held_inlined, read_inlined, read_part, store_bundle, write_part
from parts.io.storage import Storage
from parts.io.write import write_data
from parts.model.meta import PartMeta

SMALL_PART_BYTES = 32 * 1024 * 1024
JOINED_CHUNK_BYTES = 64 * 1024 * 1024  # rows of inlined parts made one chunk (joined)


@dataclass
class Rewrite:
    added: list[PartMeta] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    affected_rows: int = 0
    # A flush's removed inlined parts: name -> (bundle path, offset) of their bytes, stored beside
    # the part they were merged into (compact with ``spill``; PartMeta.spilled).
    spilled: dict[str, tuple[str, int]] = field(default_factory=dict)

    def located(self) -> tuple[tuple[str, str, int], ...]:
        """``spilled`` as a Compact op carries it: (part name, bundle path, offset), by name."""
        return tuple((name, path, offset) for name, (path, offset) in sorted(self.spilled.items()))

    def compaction(
        self, table: str, kind: Literal["minor", "major"], partitions: tuple[str, ...] | None, rows: int = 0
    ) -> Compact:
        """This compaction's result as the op a replica stages, a flush's bundle locations included."""
        added, removed = tuple(self.added), tuple(self.removed)
        return Compact(table, kind, added, removed, partitions, rows, spilled=self.located())


READ_THREADS = 8  # parts read at once by one process (latency-bound on an object store)
_readers: tuple[int, ThreadPoolExecutor] | None = None
_readers_lock = threading.Lock()


def _reader_pool() -> ThreadPoolExecutor:
    """This process's pool of part readers, made at first use and kept: a pool made per call
    started its threads anew at every read (a whole read of 120 parts: 50-57 against 44-47 ms
    with the threads kept, medians on a 2-vCPU machine). A forked child, whose copy of the pool
    has no threads, makes its own. Nothing a reader runs reads through the pool again, so reads
    sharing it wait only for each other's turn."""
    global _readers
    with _readers_lock:
        if _readers is None or _readers[0] != os.getpid():
            _readers = (os.getpid(), ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="mergetxn-read"))
        return _readers[1]


def read_parts(
    storage: Storage,
    parts: list[PartMeta],
    columns: list[str] | None = None,
    table: TableDef | None = None,
    cached: bool = False,
) -> list[pa.Table]:
    """Read several parts at once (the process's reader threads overlap the reads and decodes:
    :func:`_reader_pool`); order is kept. With
    ``table``, each part is read under that definition (columns renamed or added since it was
    written: :meth:`TableDef.upgrade`). ``cached`` (a client's reads, which read the same
    unflushed inlined parts again and again, docs/architecture/small-writes.md): inlined parts
    through :func:`read_inlined`, decoded once per process; those decoded before are taken in
    the calling thread, without the pool."""
    whole = columns if table is None else None

    def under(p: PartMeta, data: pa.Table) -> pa.Table:
        if table is None:
            return data
        data = table.upgrade(data, p.schema_version)
        return data if columns is None else data.select(list(columns))

    def one(i: int) -> pa.Table:
        p = parts[i]
        return under(p, read_inlined(storage, p) if cached and whole is None else read_part(storage, p, whole))

    out: list[pa.Table | None] = [None] * len(parts)
    if cached and whole is None:
        for i, p in enumerate(parts):
            held = held_inlined(p)
            if held is not None:
                out[i] = under(p, held)
    todo = [i for i, data in enumerate(out) if data is None]
    if len(todo) <= 1:
        for i in todo:
            out[i] = one(i)
    else:
        for i, data in zip(todo, _reader_pool().map(one, todo)):
            out[i] = data
    return cast(list[pa.Table], out)


def joined(parts: Sequence[PartMeta], tables: Sequence[pa.Table], schema: pa.Schema) -> pa.Table:
    """``tables``, the rows of ``parts`` (:func:`read_parts`' answer, all of ``schema``), as one
    table, in their order; each run of consecutive inlined parts in few chunks (thousands of
    10-row parts would otherwise be as many chunks, which every filter, select and scan after
    them pays for one by one)."""
    pieces: list[pa.Table] = []
    run: list[pa.Table] = []
    for meta, data in zip(parts, tables):
        if meta.inlined:
            run.append(data)
            continue
        pieces.extend(_chunked(run))
        run = []
        pieces.append(data)
    pieces.extend(_chunked(run))
    return pa.concat_tables(pieces) if pieces else schema.empty_table()


def _chunked(run: list[pa.Table]) -> list[pa.Table]:
    """The tables of ``run`` (inlined parts' rows) as tables of one chunk each of about
    :data:`JOINED_CHUNK_BYTES` (one when they hold less); a group that holds over twice as much
    (a part's dictionary-encoded values, say) stays as it is, in its chunks."""
    if len(run) <= 1:
        return run
    together = pa.concat_tables(run)
    groups = -(-together.get_total_buffer_size() // JOINED_CHUNK_BYTES)
    if groups <= 1:
        return [together.combine_chunks()]
    out = []
    for at in range(0, len(run), -(-len(run) // groups)):
        group = pa.concat_tables(run[at : at + -(-len(run) // groups)])
        out.append(group if group.get_total_buffer_size() > 2 * JOINED_CHUNK_BYTES else group.combine_chunks())
    return out


def _rewrite(
    storage: Storage,
    table,
    parts: list[PartMeta],
    where: pc.Expression,
    tid: str,
    change: Callable[[pa.Table], tuple[pa.Table, int]],
) -> Rewrite:
    candidates = [
        p
        for p in parts
        if may_match(
            table.stats_at(p.stats, p.schema_version), list(table.partition_by), p.partition, where, table.schema
        )
    ]
    out = Rewrite()
    for meta, data in zip(candidates, read_parts(storage, candidates, table=table)):
        new, n = change(data)
        if n == 0:
            continue
        out.removed.append(meta.name)
        out.affected_rows += n
        out.added.extend(write_data(storage, table, new, tid))
    return out


def delete(storage: Storage, table, parts: list[PartMeta], where: pc.Expression, tid: str) -> Rewrite:
    return _rewrite(storage, table, parts, where, tid, lambda d: apply_delete(d, where))


def update(
    storage: Storage,
    table,
    parts: list[PartMeta],
    where: pc.Expression,
    assignments: dict[str, pc.Expression],
    tid: str,
) -> Rewrite:
    return _rewrite(storage, table, parts, where, tid, lambda d: apply_update(d, where, assignments))


def choose_sources(parts: list[PartMeta], kind: str, small_bytes: int = SMALL_PART_BYTES) -> list[list[PartMeta]]:
    """Groups of parts to merge, one group per partition: minor merges the small parts of a
    partition (two or more, or any with an inlined part: a flush, docs/architecture/small-writes.md),
    major rewrites every part of a partition. What they write is a part in storage, never inlined."""
    by_partition: dict[tuple, list[PartMeta]] = defaultdict(list)
    for p in parts:
        by_partition[tuple(p.partition)].append(p)
    groups = []
    for _, group in sorted(by_partition.items(), key=lambda kv: str(kv[0])):
        group = sorted(group, key=lambda m: m.name)
        if kind == "minor":
            small = [p for p in group if p.size < small_bytes]
            if len(small) >= 2 or any(p.inlined for p in small):  # an inlined part alone is flushed too
                groups.append(small)
        elif group:
            groups.append(group)
    return groups


def compact(
    storage: Storage,
    table,
    parts: list[PartMeta],
    kind: str,
    tid: str,
    csns: Mapping[str, int] | None = None,
    visible: list[PartMeta] | None = None,
    spill: bool = False,
) -> Rewrite:
    """Merge parts per partition; rows are kept as they are (a layout change, no data change).
    ``spill`` (a replica's own merges: docs/architecture/small-writes.md, "Bounds"): the inlined
    parts merged are also stored as a bundle beside the part written (:func:`store_bundle`) and
    ``spilled`` says where, for the log entry.

    A keys table's parts are versions: they are folded (:func:`_compact_keys`), which needs
    ``csns`` (part name -> creation CSN of each committed part; parts without one, a
    transaction's own, are left alone) and ``visible``, every part visible beside ``parts`` in
    their partitions (default: ``parts``), whose versions decide what may be folded together."""
    from coordinator.core.conflicts import Policy
    from coordinator.core.errors import InvalidInput

    if kind not in ("minor", "major"):
        raise InvalidInput(f"compaction kind must be 'minor' or 'major', not {kind!r}")
    if table.conflict_policy is Policy.KEYS:
        if csns is None:
            raise ValueError("compacting a keys table needs the creation CSNs of its parts")
        committed = [p for p in parts if p.name in csns]
        return _compact_keys(
            storage, table, choose_sources(committed, kind), parts if visible is None else visible, csns, tid, spill
        )
    out = Rewrite()
    for group in choose_sources(parts, kind):
        tables = read_parts(storage, group, table=table)
        merged = pa.concat_tables(tables) if tables else pa.Table.from_pylist([], schema=table.schema)
        _replace_group(out, storage, table, group, merged, tid, spill=spill)
    return out


def _replace_group(
    out: Rewrite,
    storage: Storage,
    table: TableDef,
    group: list[PartMeta],
    merged: pa.Table,
    tid: str,
    primary_key: Sequence[str] = (),
    spill: bool = False,
) -> None:
    """``group``'s parts compacted into one holding ``merged`` (none when it is empty); with
    ``spill``, the group's inlined parts' bytes stored in that part's bundle too."""
    out.removed.extend(m.name for m in group)
    out.affected_rows += merged.num_rows
    if merged.num_rows:
        partition = tuple(group[0].partition)
        part = write_part(
            storage, table.name, list(table.partition_by), partition, merged, tid, table.ddl_version, primary_key
        )
        out.added.append(part)
        if spill:
            out.spilled.update(store_bundle(storage, part, group))


def _versions_of(meta: PartMeta, csns: Mapping[str, int]) -> tuple[int, int]:
    """The least and greatest version a keys-table part holds, from its metadata."""
    if keytables.folded(meta):
        lo, hi = meta.stats[keytables.VER]
        return int(lo), int(hi)
    return csns[meta.name], csns[meta.name]


def _may_share_keys(meta: PartMeta, group: list[PartMeta], primary_key: tuple[str, ...]) -> bool:
    """False when a key column's min/max statistics show ``meta`` holds no key of ``group``."""
    for col in primary_key:
        ranges = [r for r in (m.stats.get(col) for m in [meta, *group]) if r is not None and r[0] is not None]
        if len(ranges) <= len(group):  # a part without the column's statistics
            continue
        try:
            lo, hi = min(r[0] for r in ranges[1:]), max(r[1] for r in ranges[1:])
            if ranges[0][1] < lo or ranges[0][0] > hi:
                return False
        except TypeError:
            continue
    return True


def _compact_keys(
    storage: Storage,
    table,
    groups: list[list[PartMeta]],
    visible: list[PartMeta],
    csns: Mapping[str, int],
    tid: str,
    spill: bool = False,
) -> Rewrite:
    """Fold each group's versions into one part (:func:`coordinator.core.keyfold.fold`). The versions of
    the other visible parts of the partition that precede the group's last version (and may hold
    its keys, by their statistics) are read, key columns only: they split the folding into runs
    and keep DELETEs that still hide an older version."""
    pk = tuple(table.primary_key)
    out = Rewrite()
    for group in groups:
        names = {m.name for m in group}
        hi = max(_versions_of(m, csns)[1] for m in group)
        # Committed parts, and a transaction's own compaction output (its rows keep their versions).
        others = [
            m
            for m in visible
            if m.name not in names
            and (m.name in csns or keytables.folded(m))
            and tuple(m.partition) == tuple(group[0].partition)
            and _versions_of(m, csns)[0] <= hi
            and _may_share_keys(m, group, pk)
        ]
        columns = [*pk, keytables.OP, keytables.SEQ]
        seen = [
            keyfold.version_rows(
                read_part(storage, m, columns + ([keytables.VER] if keytables.folded(m) else [])),
                csns.get(m.name, 0),
                pk,
            )
            for m in others
        ]
        datas = read_parts(storage, group)
        merged = keyfold.fold(
            table.schema,
            pk,
            [(csns[m.name], d) for m, d in zip(group, datas)],
            pa.concat_tables(seen) if seen else None,
        )
        _replace_group(out, storage, table, group, merged, tid, pk, spill)  # its key summary: point reads prune it
    return out


def redo(
    storage: Storage,
    table,
    op: Mutate | Compact,
    current: list[PartMeta],
    tid: str,
    csns: Mapping[str, int] | None = None,
) -> Mutate | Compact:
    """Run a staged DELETE, UPDATE or compaction again on ``current`` parts (``csns``: their
    creation CSNs, which a keys table's compaction needs); returns the op with the new
    added/removed parts (its earlier output is superseded). Only a replica redoes an op: a
    compaction's flushed inlined parts are spilled (``Compact.spilled``)."""
    from dataclasses import replace

    if isinstance(op, Compact):  # redone by the replica: its own write, a flush's bundle beside it
        result = compact(storage, table, current, op.compact_kind, tid, csns, spill=True)
        return replace(op, added=tuple(result.added), removed=tuple(result.removed), spilled=result.located())
    where = decode_expression(op.where, table.schema)
    if op.kind == "delete":
        result = delete(storage, table, current, where, tid)
    else:
        # an update without assignments: "" is no JSON, so CorruptMetadata as for None before
        assignments = decode_assignments(op.assignments or "", table.schema)
        result = update(storage, table, current, where, assignments, tid)
    return replace(op, added=tuple(result.added), removed=tuple(result.removed))
