"""The check of storage against the log (``mergetxn check``, ``client.check``, ``mergetxn status``).

Every part a read may still need must be in storage as it was committed: the parts visible at
the latest snapshot, and the removed ones cleanup has not collected (those are what time travel
and ``changes`` within the retention window read; coordinator/zk/watermark.py says which may be
gone). A file that is missing, of another size or (with checksums) of another content makes a
read fail with CorruptPart; this finds it before a reader does, and names each part.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from coordinator.zk.watermark import Marks
from parts.io.format import verify_file
from parts.io.storage import Storage
from replicas.state import ReplicaState


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
) -> dict:
    """``{"snapshot", "tables": [{"table", "parts", "bytes", "problems": [{"part", "path",
    "problem", "visible"}]}], "ok"}`` for each table (checksums read every file; without,
    presence and sizes only). ``refresh``: the ``gc`` node read again, asked when a removed
    part's file is missing: a cleanup pass elsewhere raises the node before it deletes, so a
    part it collected while this check ran is gone by the node read after its file was found
    missing (found by chaos campaigns on S3, where a pass and the final check overlapped)."""
    snapshot = state.applied
    out = []
    for table in tables:
        problems = []
        recs = needed_parts(state, marks, table)
        for rec in recs:
            why = verify_file(storage, rec.meta, checksums)
            if why is not None and rec.removal_csn is not None and refresh is not None:
                marks = refresh()
                if marks.may_be_gone(table, rec.removal_csn, rec.removal_time):
                    continue
            if why is not None:
                problems.append(
                    {
                        "part": rec.meta.name,
                        "path": rec.meta.path,
                        "visible": rec.removal_csn is None,
                        "creation_csn": rec.creation_csn,
                        "problem": f"file {rec.meta.path!r} {why}",
                    }
                )
        out.append({"table": table, "parts": len(recs), "bytes": sum(r.meta.size for r in recs), "problems": problems})
    return {"snapshot": snapshot, "checksums": checksums, "tables": out, "ok": not any(t["problems"] for t in out)}


#: How many of the newest visible parts a starting replica looks for in its storage.
PROBE_PARTS = 8


def startup_probe(state: ReplicaState, storage: Storage, sample: int = PROBE_PARTS) -> str | None:
    """Why ``storage`` cannot be the storage the log describes, or None: it holds none of the
    ``sample`` newest parts visible at the applied snapshot (a wrong ``--storage``; one missing
    file among present ones is a damaged table, for ``check`` and ``status``, not a reason to
    refuse to start). Storage errors propagate (the caller retries them)."""
    recs = state.newest_live(sample)
    if not recs:
        return None
    paths = [r.meta.path for r in recs]
    gone = storage.missing(paths)
    if len(gone) < len(paths):
        return None
    return f"none of the {len(paths)} newest parts the log names is there, e.g. {paths[0]!r}"
