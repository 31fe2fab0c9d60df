"""The check of storage against the log (``mergetxn check``, ``client.check``, ``mergetxn status``).

Every part a read may still need must be in storage as it was committed: the parts visible at
the latest snapshot, and the removed ones cleanup has not collected (those are what time travel
and ``changes`` within the retention window read; coordinator/zk/watermark.py says which may be
gone). A file that is missing, of another size or (with checksums) of another content makes a
read fail with CorruptPart; this finds it before a reader does, and names each part. With
checksums, each file is also held against the rest of what the log says of it (rows, columns,
statistics, partition, key summary: parts.io.format.file_claims), so a part committed with
metadata its file contradicts (before commits were checked so) is found too: a wrong row count
fails every read, a statistic narrower than the file's values makes filtered reads skip rows.
Each problem says whether ``mergetxn check --repair`` can mend it (``repairable``: the file is
intact and only its metadata is wrong) or the table needs ``mergetxn restore`` from a backup.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from coordinator.core.keytables import folded
from coordinator.model.catalog import Policy
from coordinator.zk.watermark import Marks
from parts.io.format import file_claims, part_content, part_schema, verify_file
from parts.io.storage import Storage
from replicas.state import PartRecord, ReplicaState
from replicas.vectors import KeysVectors

# What ``mergetxn check --repair`` mends: metadata that its intact file contradicts (the part is
# rewritten from its file's rows, as a compaction, under metadata taken from the new file).
REPAIRABLE = ("size", "checksum", "rows", "stats", "key_summary")


def needed_parts(state: ReplicaState, marks: Marks, table: str) -> list:
    """The part records of ``table`` whose files a read may still need, by name."""
    recs = state.part_records(table)
    return sorted(
        (r for r in recs if not marks.may_be_gone(table, r.removal_csn, r.removal_time)), key=lambda r: r.meta.name
    )


def check_tables(
    state: ReplicaState,
    storage: Storage,
    marks: Marks,
    tables: Iterable[str],
    checksums: bool = True,
    refresh: Callable[[], Marks] | None = None,
    vectors: KeysVectors | None = None,
) -> dict:
    """``{"snapshot", "tables": [{"table", "parts", "bytes", "problems": [{"part", "path",
    "problem", "visible"}]}], "ok"}`` for each table (checksums read every file; without,
    presence and sizes only). ``refresh``: the ``gc`` node read again, asked when a removed
    part's file is missing: a cleanup pass elsewhere raises the node before it deletes, so a
    part it collected while this check ran is gone by the node read after its file was found
    missing (found by chaos campaigns on S3, where a pass and the final check overlapped).
    With checksums, a keys table's deletion ``vectors`` held by the replica are checked too
    (:meth:`KeysVectors.check`)."""
    snapshot = state.applied
    out = []
    for table in tables:
        problems = []
        recs = needed_parts(state, marks, table)
        for rec in recs:
            found = part_problem(state, storage, rec, checksums)
            if found is not None and rec.removal_csn is not None and refresh is not None:
                marks = refresh()
                if marks.may_be_gone(table, rec.removal_csn, rec.removal_time):
                    continue
            if found is not None:
                field, why = found
                problems.append(
                    {
                        "part": rec.meta.name,
                        "path": rec.meta.path,
                        "visible": rec.removal_csn is None,
                        "creation_csn": rec.creation_csn,
                        "field": field,
                        "repairable": field.split(".")[0] in REPAIRABLE,
                        "problem": why,
                    }
                )
        if checksums and vectors is not None:
            problems += _vector_problems(state, vectors, table)
        out.append({"table": table, "parts": len(recs), "bytes": sum(r.meta.size for r in recs), "problems": problems})
    return {"snapshot": snapshot, "checksums": checksums, "tables": out, "ok": not any(t["problems"] for t in out)}


def _vector_problems(state: ReplicaState, vectors: KeysVectors, table: str) -> list[dict]:
    """The problems :meth:`KeysVectors.check` finds in ``table``'s deletion vectors (not
    repairable: the vectors are let go and derived again from the files on the next read)."""
    tdef = state.table(table)
    if tdef is None or tdef.conflict_policy is not Policy.KEYS:
        return []
    out = []
    for name, why in vectors.check(tdef):
        rec = state.part(name)
        out.append(
            {
                "part": name,
                "path": rec.meta.path if rec is not None else None,
                "visible": rec is not None and rec.removal_csn is None,
                "creation_csn": rec.creation_csn if rec is not None else None,
                "field": "vectors",
                "repairable": False,
                "problem": f"part {name!r}: {why}",
            }
        )
    return out


def part_problem(state: ReplicaState, storage: Storage, rec: PartRecord, checksums: bool) -> tuple[str, str] | None:
    """``(field, why)`` when a committed part's file is missing or differs from what the log says
    of it (without ``checksums``: its presence and size only), else None."""
    meta = rec.meta
    # An inlined part (docs/architecture/small-writes.md) has no file: its content, in its
    # metadata, is checked alike (and always whole: it is at hand).
    what = f"inlined part {meta.name!r}" if meta.inlined else f"file {meta.path!r}"
    if not checksums and not meta.inlined:
        why = verify_file(storage, meta, checksum=False)
        return None if why is None else ("file", f"{what} {why}")
    try:
        raw = part_content(storage, meta)
    except FileNotFoundError:
        return "file", f"{what} is missing"
    tdef = state.table(meta.table, rec.creation_csn) or state.table(meta.table)
    if tdef is None:
        wrong = file_claims(raw, meta, decoded=True)
        return None if wrong is None else (wrong[0], f"{what}: its metadata's {wrong[0]} {wrong[1]}")
    pk = tdef.primary_key if tdef.conflict_policy is Policy.KEYS else ()
    expected = part_schema(tdef.schema, pk, folded(meta))
    wrong = file_claims(raw, meta, expected, tdef.partition_by, pk, decoded=True)
    return None if wrong is None else (wrong[0], f"{what}: its metadata's {wrong[0]} {wrong[1]}")


#: How many of the newest visible parts a starting replica looks for in its storage.
PROBE_PARTS = 8


def startup_probe(state: ReplicaState, storage: Storage, sample: int = PROBE_PARTS) -> str | None:
    """Why ``storage`` cannot be the storage the log describes, or None: it holds none of the
    ``sample`` newest parts visible at the applied snapshot (a wrong ``--storage``; one missing
    file among present ones is a damaged table, for ``check`` and ``status``, not a reason to
    refuse to start). Storage errors propagate (the caller retries them)."""
    recs = state.newest_live(sample)  # parts in storage: inlined parts have no file
    if not recs:
        return None
    paths = [r.meta.path for r in recs]
    gone = storage.missing(paths)
    if len(gone) < len(paths):
        return None
    return f"none of the {len(paths)} newest parts the log names is there, e.g. {paths[0]!r}"
