"""A replica state as a checkpoint's payload and back: :meth:`StateCheckpoint.export` gives the
plain form replicas/checkpoint.py encodes, :meth:`StateCheckpoint.restore` rebuilds the state
(and every index derived from it) from one."""

from __future__ import annotations

import base64
import gc
from collections import defaultdict, deque
from dataclasses import fields

from coordinator.core import keytables
from coordinator.core.conflicts import Kind, Summary
from coordinator.core.errors import CorruptMetadata
from coordinator.core.keyindex import KeyIndex
from coordinator.core.tabledata import partition_key
from coordinator.model.catalog import TableDef, TableDropped, TableRecord
from parts.model.meta import PartMeta, spill_location
from replicas.applied_state import AppliedState, PartRecord, SortedIndex, keys_at, record_csn
from replicas.memory import no_gc


def _outcomes(
    payload: dict, tid_csn: dict[str, int], fallback: float
) -> tuple[deque[tuple[float, int, tuple[str, ...]]], int]:
    """The outcome window of a checkpoint: (entry time, CSN, tids) per commit in CSN order, and
    its floor. A checkpoint written before it carries no times: its commits count as made at
    ``fallback`` (its newest time version), so the window forgets them from there."""
    times = dict(zip(payload.get("outcome_csns", ()), payload.get("outcome_times", ()), strict=True))
    by_csn: dict[int, list[str]] = defaultdict(list)
    for tid, csn in tid_csn.items():
        by_csn[csn].append(tid)
    window = deque((float(times.get(csn, fallback)), csn, tuple(tids)) for csn, tids in sorted(by_csn.items()))
    return window, int(payload.get("outcome_floor", 0))


# -- checkpoint decoding (ReplicaState.restore): each raises what malformed data raises, which
# restore reports as CorruptMetadata.
def _export_parts(recs: list[tuple[PartMeta, int, str | None, int | None, float | None]]) -> dict:
    """A checkpoint's parts as columns (``payload["parts"]``): the metadata's fields, the stats
    by shape, then each record's creation and removal."""
    names = [f.name for f in fields(PartMeta) if f.name != "stats"]
    metas = [r[0] for r in recs]
    parts: dict = {"fields": names}
    for n in names:
        parts[n] = [getattr(m, n) for m in metas]
    # An inlined part's content (bytes) as base64, as in its JSON metadata; None for the others.
    parts["inline"] = [None if m.inline is None else base64.b64encode(m.inline).decode("ascii") for m in metas]
    shapes: dict[tuple, int] = {}
    shape_col: list[int] = []
    values: list[object] = []
    for m in metas:
        keys = tuple(m.stats)
        shape_col.append(shapes.setdefault(keys, len(shapes)))
        for v in m.stats.values():
            values.extend(v)
    parts["stats_keys"] = [list(k) for k in shapes]
    parts["stats_shape"] = shape_col
    parts["stats_values"] = values
    parts["creation_csn"] = [r[1] for r in recs]
    parts["removal_tid"] = [r[2] for r in recs]
    parts["removal_csn"] = [r[3] for r in recs]
    parts["removal_time"] = [r[4] for r in recs]
    return parts


def _export_history(history: list[tuple[tuple[str, str], list[tuple[int, Summary]]]]) -> dict:
    """A checkpoint's conflict history as columns (``payload["history"]``), operation kinds by set."""
    kind_sets: dict[frozenset, int] = {}
    h: dict = {"keys": [], "key": [], "csn": [], "tid": [], "kinds": [], "removed_at": [], "removed": []}
    for i, (key, events) in enumerate(history):
        h["keys"].append(list(key))
        for csn, s in events:
            if s.removed:
                h["removed_at"].append(len(h["csn"]))
                h["removed"].append(sorted(s.removed))
            h["key"].append(i)
            h["csn"].append(csn)
            h["tid"].append(s.tid)
            h["kinds"].append(kind_sets.setdefault(s.kinds, len(kind_sets)))
    h["kind_sets"] = [sorted(k.value for k in ks) for ks in kind_sets]
    return h


def _restore_catalog(payload: dict) -> tuple[dict[str, TableDef], dict[str, list[TableRecord]], list[int]]:
    """A checkpoint's tables, its catalog (each table's records) and the CSNs of its DDL."""
    tables = {d["name"]: TableDef.from_dict(d) for d in payload["tables"]}
    catalog: dict[str, list[TableRecord]] = {}
    if "catalog" in payload:
        for d in payload["catalog"]:
            r = TableDropped.from_dict(d["dropped"]) if "dropped" in d else TableDef.from_dict(d["table"])
            catalog.setdefault(r.name, []).append(r)
    else:  # written before tables could be altered or dropped
        catalog = {name: [t] for name, t in tables.items()}
    ddl_csns = sorted({record_csn(r) for records in catalog.values() for r in records})
    return tables, catalog, ddl_csns


def _restore_metas(cols: dict) -> list[PartMeta]:
    """A checkpoint's parts' metadata, from its columns (``payload["parts"]``)."""
    names = list(cols["fields"])
    columns = [cols[n] for n in names]
    ip = names.index("partition")
    columns[ip] = [tuple(p) for p in columns[ip]]
    if "inline" in names:
        ii = names.index("inline")
        columns[ii] = [None if v is None else base64.b64decode(v, validate=True) for v in columns[ii]]
    if "spilled" in names:  # a flushed inlined part's [bundle path, offset] (PartMeta.spilled)
        si = names.index("spilled")
        columns[si] = [None if v is None else spill_location(v, "a checkpoint's part") for v in columns[si]]
    shapes = [tuple(k) for k in cols["stats_keys"]]
    flat = iter(cols["stats_values"])
    pairs = zip(flat, flat)  # (min, max); zip(keys, pairs) takes exactly len(keys) of them
    stats_col = [dict(zip(shapes[s], pairs)) for s in cols["stats_shape"]]
    if next(flat, pairs) is not pairs:
        raise ValueError("stats values do not match their shapes")
    names.append("stats")
    columns.append(stats_col)
    current = [f.name for f in fields(PartMeta)]
    if sorted(names) == sorted(current):
        order = [names.index(n) for n in current]
        return [PartMeta(*(row[i] for i in order)) for row in zip(*columns, strict=True)]
    # written by another version: match by name, new fields take their defaults
    keep = [(i, n) for i, n in enumerate(names) if n in set(current)]
    return [PartMeta(**{n: row[i] for i, n in keep}) for row in zip(*columns, strict=True)]


def _restore_parts(
    metas: list[PartMeta], cols: dict
) -> tuple[dict[str, PartRecord], dict[str, set[str]], dict[str, dict[str, set[str]]], dict[tuple, str]]:
    """A checkpoint's part records, part names by table, live part names by table and partition
    key, and the partition keys computed on the way."""
    parts: dict[str, PartRecord] = {}
    by_table: dict[str, set[str]] = defaultdict(set)
    live: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    pkeys: dict[tuple, str] = {}
    rtimes = cols.get("removal_time") or [None] * len(metas)  # absent: written before retention
    for meta, ccsn, rtid, rcsn, rtime in zip(
        metas, cols["creation_csn"], cols["removal_tid"], cols["removal_csn"], rtimes, strict=True
    ):
        parts[meta.name] = PartRecord(
            meta, int(ccsn), rtid, None if rcsn is None else int(rcsn), None if rtime is None else float(rtime)
        )
        by_table[meta.table].add(meta.name)
        if rcsn is None:
            pk = pkeys.get(meta.partition)
            if pk is None:
                pk = pkeys[meta.partition] = partition_key(meta.partition)
            live[meta.table][pk].add(meta.name)
    return parts, by_table, live, pkeys


def _restore_history(h: dict) -> dict[tuple[str, str], list[tuple[int, Summary]]]:
    """A checkpoint's conflict history (``payload["history"]``), by (table, partition key)."""
    keys = [(str(t), str(pk)) for t, pk in h["keys"]]
    kind_sets = [frozenset(Kind(k) for k in ks) for ks in h["kind_sets"]]
    removed = dict(zip(h["removed_at"], h["removed"], strict=True))
    none: frozenset[str] = frozenset()
    history: dict[tuple[str, str], list[tuple[int, Summary]]] = defaultdict(list)
    for i, (k, csn, tid, ks) in enumerate(zip(h["key"], h["csn"], h["tid"], h["kinds"], strict=True)):
        r = removed.get(i)
        history[keys[k]].append((csn, Summary(tid, kind_sets[ks], none if r is None else frozenset(r))))
    return history


def _restore_lost(
    payload: dict, catalog: dict[str, list[TableRecord]], pruned: int
) -> tuple[dict[str, int], dict[str, int]]:
    """Up to which CSN each table's parts and conflict history may be incomplete."""
    if "lost" in payload:
        lost = {str(k): int(v) for k, v in payload["lost"].items()}
        lost_history = {str(k): int(v) for k, v in payload.get("lost_history", {}).items()}
    else:  # written before: everything below its floor may be incomplete
        lost = {name: pruned for name in catalog}
        lost_history = dict(lost)
    return lost, lost_history


def _restore_key_index(
    parts: dict[str, PartRecord], pkeys: dict[tuple, str], pruned: int, catalog: dict[str, list[TableRecord]]
) -> tuple[dict[tuple[str, str], list[tuple[int, str]]], dict[tuple[str, str], KeyIndex]]:
    """The parts created above ``pruned`` by (table, partition key), in CSN order, and the key
    index of those a keys table holds."""
    created: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    for n, r in parts.items():
        if r.creation_csn > pruned:
            pk = pkeys.get(r.meta.partition)
            if pk is None:
                pk = pkeys[r.meta.partition] = partition_key(r.meta.partition)
            created[(r.meta.table, pk)].append((r.creation_csn, n))
    key_index: dict[tuple[str, str], KeyIndex] = {}
    for (table, pk), added in created.items():
        added.sort()
        records = catalog.get(table, [])
        for csn, n in added:
            if keys_at(records, csn):
                meta = parts[n].meta
                key_index.setdefault((table, pk), KeyIndex()).add(csn, n, meta.key_summary, keytables.folded(meta))
    return created, key_index


class StateCheckpoint(AppliedState):
    """Export to, and restore from, the checkpoint payload."""

    # -- checkpoints (replicas/checkpoint.py encodes these) ------------------------------------
    def export(self) -> dict:
        """Everything the log has built here, as plain JSON-ready data at one CSN (``applied``).

        Only references are taken under the lock (parts' metadata is immutable), so applying
        and serving pause for a few milliseconds even at 100,000 parts; the columns are built
        after. Everything is flat columns (nested JSON decodes ten times slower): part fields as
        columns following PartMeta's fields (a field added there is carried along), stats as a
        flat value list shaped by a small table of key lists, history events as columns."""
        with no_gc():
            return self._export()

    def _export(self) -> dict:
        with self.lock:
            applied, position = self.applied, self.position
            recs = [(r.meta, r.creation_csn, r.removal_tid, r.removal_csn, r.removal_time) for r in self.parts.values()]
            tables = [t.to_dict() for t in self.tables.values()]
            catalog = [
                {"dropped": r.to_dict()} if isinstance(r, TableDropped) else {"table": r.to_dict()}
                for records in self.catalog.values()
                for r in records
            ]
            pruned, lost, lost_history = self.pruned, dict(self.lost), dict(self.lost_history)
            tids, tid_csns = list(self.tid_csn), list(self.tid_csn.values())
            outcome_csns = [csn for _, csn, _ in self.outcomes]
            outcome_times = [t for t, _, _ in self.outcomes]
            outcome_floor = self.outcome_floor
            history = [(k, list(v)) for k, v in self.conflict_history.items()]
            versions = dict(self.versions)
            apps = {app_id: list(held) for app_id, held in self.apps.items()}
            time_csns, time_values = list(self.time_csns), list(self.time_values)
            time_trimmed = self.time_trimmed
        parts = _export_parts(recs)
        h = _export_history(history)
        return {
            "applied": applied,
            "position": list(position),
            "tables": tables,
            "catalog": catalog,
            "parts": parts,
            "tids": tids,
            "tid_csns": tid_csns,
            "outcome_csns": outcome_csns,
            "outcome_times": outcome_times,
            "outcome_floor": outcome_floor,
            "history": h,
            "versions": versions,
            "apps": apps,
            "time_csns": time_csns,
            "time_values": time_values,
            "time_trimmed": time_trimmed,
            "pruned": pruned,
            "lost": lost,
            "lost_history": lost_history,
        }

    def restore(self, payload: dict, where: str) -> None:
        """Replace everything here with an :meth:`export` payload (a checkpoint). Malformed
        data is CorruptMetadata naming ``where``; the state is untouched then."""
        with no_gc():
            self._restore(payload, where)
        # Hundreds of thousands of long-lived objects: keep the cyclic GC from walking them on
        # every full collection (replaying a WAL tail after this ran 5x slower without it).
        gc.freeze()

    def _restore(self, payload: dict, where: str) -> None:
        try:
            tables, catalog, ddl_csns = _restore_catalog(payload)
            cols = payload["parts"]
            metas = _restore_metas(cols)
            parts, by_table, live, pkeys = _restore_parts(metas, cols)
            live_sorted = {
                table: SortedIndex((n, parts[n].meta) for names_ in by_pkey.values() for n in names_)
                for table, by_pkey in live.items()
            }
            live_created = {
                table: SortedIndex(
                    ((parts[n].creation_csn, n), parts[n].meta) for names_ in by_pkey.values() for n in names_
                )
                for table, by_pkey in live.items()
            }
            all_sorted = {table: SortedIndex((n, parts[n]) for n in names_) for table, names_ in by_table.items()}
            tid_csn = {str(t): int(c) for t, c in zip(payload["tids"], payload["tid_csns"], strict=True)}
            history = _restore_history(payload["history"])
            versions = {str(k): int(v) for k, v in payload["versions"].items()}
            apps = {str(k): (int(v), int(c)) for k, (v, c) in payload.get("apps", {}).items()}
            time_csns = [int(c) for c in payload["time_csns"]]
            time_values = [float(v) for v in payload["time_values"]]
            time_trimmed = int(payload.get("time_trimmed", 0))
            outcomes, outcome_floor = _outcomes(payload, tid_csn, max(time_values, default=0.0))
            applied = int(payload["applied"])
            position = (int(payload["position"][0]), int(payload["position"][1]))
            pruned = int(payload.get("pruned", 0))
            lost, lost_history = _restore_lost(payload, catalog, pruned)
            removals = deque(sorted((r.removal_csn, n) for n, r in parts.items() if r.removal_csn is not None))
            created, key_index = _restore_key_index(parts, pkeys, pruned, catalog)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise CorruptMetadata(f"checkpoint {where} is malformed: {exc!r}") from exc
        with self.lock:
            self.tables, self.parts, self.by_table, self.live = tables, parts, by_table, live
            self.catalog, self.ddl_csns = catalog, ddl_csns
            self.live_sorted, self.tid_csn, self.conflict_history, self.versions = (
                live_sorted,
                tid_csn,
                history,
                versions,
            )
            self.apps = apps
            self.outcomes, self.outcome_floor = outcomes, outcome_floor
            self.all_sorted, self.live_created = all_sorted, live_created
            self.time_csns, self.time_values, self.time_trimmed = time_csns, time_values, time_trimmed
            self.applied, self.position = applied, position
            self.pruned, self.removals, self.lost, self.lost_history = pruned, removals, lost, lost_history
            self.created, self.key_index = created, key_index
            self.failure = None
            self.applied_cond.notify_all()
