"""A keys table's reads (docs/architecture/keys-vectors.md): by deletion vectors when the replica
sends them (a transaction's own versions folded over the live rows they touch), else by the fold
of every version; point reads by the few parts that may hold the keys."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from coordinator.core import deletions, keyfold, keypoint, keytables
from coordinator.core.errors import quote
from coordinator.core.tabledata import check_expression, may_match
from coordinator.model.catalog import TableDef
from mergetxn.client.base import ClientBase
from parts.io import keyscan, rewrite
from parts.io.dataset import snapshot_dataset, table_dataset
from parts.io.format import read_part
from parts.model.meta import PartMeta


class KeysReads(ClientBase):
    """The client's reads of keys tables (a part of :class:`mergetxn.client.reads.Reads`)."""

    def _read_keys(
        self,
        tdef: TableDef,
        metas: list[PartMeta],
        columns: Sequence[str] | None,
        where: pc.Expression | None,
        csns: Mapping[str, int],
        exact: list[tuple] | None = None,
    ) -> pa.Table:
        wanted = None
        # A filter that is only ``key == literal`` terms (keytables.point_keys, exact) keeps
        # exactly the rows of those keys: it parsed as valid and is not applied after the fold,
        # which reads and folds those keys' versions alone (an Arrow plan each costs a point read
        # more than the rest of its client side).
        if exact is None and where is not None:
            exact = keytables.point_keys(where, tdef.schema, tdef.primary_key, exact=True)
        if exact is not None:
            wanted = exact
        elif where is not None:  # after the fold: a newer version may move a row out of (or into) it
            check_expression(where, tdef.schema, f"filter on {quote(tdef.name)}")
            # A filter that fixes the whole key (``k == 5``) matches only rows of those keys, so a
            # part whose key summary cannot hold one of them adds no version the fold would keep.
            wanted = keytables.point_keys(where, tdef.schema, tdef.primary_key)
        if wanted is not None:
            hashed = {k: keytables.key_hash(k) for k in wanted}
            metas = [m for m in metas if keytables.may_hold_any(m.key_summary, hashed)]
        if where is not None and wanted is not None:
            # Only those keys' versions matter (the fold is per key): of each part, only the row
            # groups whose key statistics may hold one (parts are written sorted by key), and of
            # them only those keys' rows, are read and folded.
            versions = self._point_versions(tdef, metas, csns, wanted, columns if exact is not None else None)
            few = keypoint.merge_few(tdef.schema, tdef.primary_key, versions)
            data = few if few is not None else keyfold.merge(tdef.schema, tdef.primary_key, versions)
        else:
            data = self._fold_whole(tdef, metas, csns, columns if where is None else None)
        if where is not None and exact is None and data.num_rows:
            data = data.filter(where)
        return data if columns is None else data.select(list(columns))

    def _read_minus_vectors(
        self,
        tdef: TableDef,
        metas: list[PartMeta],
        columns: Sequence[str] | None,
        vectors: Mapping[str, str],
        where: pc.Expression | None = None,
    ) -> pa.Table:
        """A read of a keys table by deletion vectors (docs/architecture/keys-vectors.md): the
        parts' rows minus those their vectors name, no fold, then ``where``, in key order as a
        fold gives them. Each part's live rows are rows of the table as it is at the snapshot, so
        a filter skips parts whose partition and statistics rule it out, as for a parts table.
        The vectors come from the replica, checked: one for every part, each naming rows the
        part has (else CorruptMetadata)."""
        pk = list(tdef.primary_key)
        wanted = list(tdef.schema.names) if columns is None else list(columns)
        if where is not None:
            check_expression(where, tdef.schema, f"filter on {quote(tdef.name)}")
        need = (wanted + [k for k in pk if k not in wanted]) if where is None else list(tdef.schema.names)
        data, keep = self._parts_less_vectors(tdef, metas, need, vectors, where)
        if data.num_rows == 0:
            return data.select(wanted)
        if where is not None:  # the live rows the filter keeps, in key order
            data = data.filter(pa.array(keep)).filter(where)
            return in_key_order(data, pk).select(wanted)
        if bool(keep.all()):
            return in_key_order(data, pk).select(wanted)
        return data.select(wanted).take(keyfold.live_key_order(data, pk, keep))  # one gather

    def _parts_less_vectors(
        self,
        tdef: TableDef,
        metas: list[PartMeta],
        need: list[str],
        vectors: Mapping[str, str],
        where: pc.Expression | None = None,
    ) -> tuple[pa.Table, np.ndarray]:
        """The ``need`` columns of every part of ``metas`` that ``where`` may match (by its
        partition and statistics), one after the other, and one bool a row: whether it is live
        (no vector names it). The vectors come from the replica, checked: one for every part,
        each naming rows the part has (else CorruptMetadata)."""
        sent = deletions.sent_vectors(tdef.name, vectors, [(m.name, m.rows) for m in metas])
        if where is not None:
            metas = [m for m in metas if part_may_match(tdef, m, where)]
        target = pa.schema([tdef.schema.field(c) for c in need])
        datas = [
            d if d.schema.equals(target, check_metadata=True) else d.cast(target)
            for d in self._columns_of(tdef, metas, need)
        ]
        data = pa.concat_tables(datas) if datas else target.empty_table()
        keep = np.ones(data.num_rows, bool)
        offsets = np.cumsum([0] + [d.num_rows for d in datas])
        for at, m in zip(offsets, metas):
            keep[at + sent[m.name]] = False
        return data, keep

    def _read_own_over_vectors(
        self,
        tdef: TableDef,
        metas: list[PartMeta],
        csns: Mapping[str, int],
        vectors: Mapping[str, str],
        *,
        columns: Sequence[str] | None,
        where: pc.Expression | None,
    ) -> pa.Table:
        """A transaction's read of a keys table by the deletion vectors of its committed parts
        (those with a creation CSN): their live rows with its own parts' versions folded on top
        of the keys they touch (:func:`keyfold.over_live`), then ``where``. No part is skipped by
        its statistics: an own version may move a row into the filter, and it needs its key's
        live row wherever that lies."""
        if where is not None:
            check_expression(where, tdef.schema, f"filter on {quote(tdef.name)}")
        pk = tuple(tdef.primary_key)
        committed = [m for m in metas if m.name in csns]
        data, keep = self._parts_less_vectors(tdef, committed, list(tdef.schema.names), vectors)
        own = [
            keyscan.read_versions(self.storage, m, keyfold.read_plan(tdef.schema, pk, m.stats, True, False), pk)
            for m in metas
            if m.name not in csns
        ]
        order = keyfold.live_key_order(data, pk, keep) if data.num_rows else pa.array([], pa.int64())
        data = keyfold.over_live(tdef.schema, pk, data, keep, order, own)
        if where is not None:
            data = data.filter(where)
        return data if columns is None else data.select(list(columns))

    def _range_minus_vectors(
        self, tdef: TableDef, metas: list[PartMeta], span: tuple[str, Any, Any], dead: Mapping[str, np.ndarray]
    ) -> pa.Table:
        """The live rows of one key range of a scan (``span``: the first key column after the
        partition's, and the range's ends): each part's rows in it less those its vector
        (``dead``, checked) names, under ``tdef``, in key order; no fold."""
        column, lo, hi = span
        pieces = [
            tdef.upgrade(keyscan.read_range(self.storage, m, column, lo, hi, dead[m.name]), m.schema_version)
            for m in metas
        ]
        data = pa.concat_tables(pieces) if pieces else tdef.schema.empty_table()
        return in_key_order(data, list(tdef.primary_key))

    def _columns_of(self, tdef: TableDef, metas: list[PartMeta], need: list[str]) -> list[pa.Table]:
        """The ``need`` columns of each part: only those decoded when every part was written
        for the table's current definition with all of them (its statistics name each column
        of its file), else each part read whole under it."""
        if all(tdef.current(m.schema_version) and all(c in m.stats for c in need) for m in metas):
            return rewrite.read_parts(self.storage, metas, columns=need)
        return [d.select(need) for d in rewrite.read_parts(self.storage, metas, table=tdef, cached=True)]

    def _point_versions(
        self,
        tdef: TableDef,
        metas: list[PartMeta],
        csns: Mapping[str, int],
        wanted: list[tuple],
        values: Sequence[str] | None = None,
    ) -> list[tuple[float, pa.Table]]:
        """``(order, versions of the keys wanted)`` of the parts a point read needs, in the order
        of ``metas`` (``values``: the non-key columns the caller keeps, None all). With plain key
        columns the parts are read newest first (by :func:`keypoint.top_place`) and the rest left
        once every key has a PUT or DELETE later than anything they can hold
        (:func:`keypoint.settled`): the fold of the parts read is the fold of all of them, and a
        filter's false positive older than a key's last write costs nothing."""
        orders = [csns.get(m.name, keytables.OWN) for m in metas]
        plans = self._point_plans(tdef, metas, orders, values)
        layout = keytables.file_schema(tdef.schema, tdef.primary_key)

        def read(i: int) -> pa.Table:
            return self._point_read(tdef, metas[i], (plans[i], layout), wanted)

        if len(metas) < 2 or not keypoint.plain_keys(tdef.schema, tdef.primary_key):
            return [(o, read(i)) for i, o in enumerate(orders)]
        return keypoint.newest_first(orders, [m.stats for m in metas], wanted, tdef.primary_key, read)

    @staticmethod
    def _point_plans(
        tdef: TableDef, metas: list[PartMeta], orders: list[float], values: Sequence[str] | None
    ) -> list[keyfold.ReadPlan]:
        """What a point read decodes of each part (:func:`keyfold.read_plan`, as for a whole read
        of parts that may share keys): the columns kept and those its statistics do not prove
        constant, ``_seq`` only where a key's versions may tie; every column of a part not
        written for the table's current definition, or whose statistics do not name each."""
        pk = tdef.primary_key
        shared = keyfold.shared_orders(orders, [m.stats for m in metas])
        plans = []
        for m, tie in zip(metas, shared):
            plan = keyfold.read_plan(tdef.schema, pk, m.stats, tie, False, values)
            named = plan.columns is not None and all(c in m.stats for c in (*plan.columns, *plan.if_repeated))
            plans.append(plan if named and tdef.current(m.schema_version) else keyfold.ReadPlan(None, (), False))
        return plans

    def _point_read(
        self, tdef: TableDef, meta: PartMeta, how: tuple[keyfold.ReadPlan, pa.Schema], wanted: list[tuple]
    ) -> pa.Table:
        """The versions of the keys ``wanted`` in part ``meta`` decoded by ``how``'s plan, and the
        columns it holds back when a key occurs twice among them, laid out as a read of every
        column (``how``'s layout, ``keytables.file_schema``: :func:`keyfold.laid_out`)."""
        plan, layout = how
        pk = list(tdef.primary_key)
        keys = (pk, wanted)
        if plan.columns is None:
            return read_part(self.storage, meta, keys=keys)
        data = read_part(self.storage, meta, columns=list(plan.columns), keys=keys)
        more = keyfold.also_read(plan, data, pk)
        if more:
            data = read_part(self.storage, meta, columns=[*plan.columns, *more], keys=keys)
        return keyfold.laid_out(layout, plan, data)

    def _fold_whole(
        self, tdef: TableDef, metas: list[PartMeta], csns: Mapping[str, int], columns: Sequence[str] | None
    ) -> pa.Table:
        """Every version of ``metas`` folded (``columns``: the ones the caller keeps, None all).
        Of each part only the columns its statistics do not prove constant are decoded
        (:func:`keyfold.read_plan`), in one thread per core (Arrow decodes without the GIL, but
        each part takes it back a few times: 8 threads on 2 cores decoded benchmarks/keys_bench.py's
        120 parts in more wall time than one thread did, and 2 in less than 8 in every run,
        one part alone: Arrow's own threads), then folded
        (:func:`keyfold.merge`)."""
        pk = tuple(tdef.primary_key)
        orders = [csns.get(m.name, keytables.OWN) for m in metas]
        stats = [m.stats for m in metas]
        shared, alone = keyfold.shared_orders(orders, stats), keyfold.alone(pk[0], stats)
        plans = [keyfold.read_plan(tdef.schema, pk, *how, columns) for how in zip(stats, shared, alone)]
        if len(metas) <= 1:
            datas = [keyscan.read_versions(self.storage, m, p, pk, threads=True) for m, p in zip(metas, plans)]
            return keyfold.merge(tdef.schema, pk, list(zip(orders, datas)))
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1, len(metas))) as pool:
            datas = keyscan.read_all_versions(self.storage, metas, plans, pk, pool)
        return keyfold.merge(tdef.schema, pk, list(zip(orders, datas)))

    def _keys_dataset(self, tdef: TableDef, metas: list[PartMeta], vectors: Mapping[str, str]) -> ds.Dataset:
        """A keys table's live rows by its deletion ``vectors``. When no part holds a deleted row
        and their key ranges do not meet (a merged table, keys loaded in ascending batches), the
        parts themselves, read lazily as a ``parts`` table's files (every row of such a part is
        a row of the table), in key order as every read of a keys table gives its rows (each
        part written sorted by key: :func:`keytables.apart_in_key_order`); otherwise the parts
        minus their vectors, in memory."""
        sent = deletions.sent_vectors(tdef.name, vectors, [(m.name, m.rows) for m in metas])
        if not any(len(rows) for rows in sent.values()):
            order = keytables.apart_in_key_order([m.key_summary for m in metas], tdef.schema, tdef.primary_key)
            if order is not None:
                files = snapshot_dataset(self.storage, tdef, [metas[i] for i in order], cached=True)
                if isinstance(files, ds.FileSystemDataset):  # one child: its fragments in that order
                    return files
        return table_dataset(tdef, self._read_minus_vectors(tdef, metas, None, vectors))


def part_may_match(tdef: TableDef, meta: PartMeta, where: pc.Expression) -> bool:
    """Whether some row of ``meta`` may match ``where``, by its partition and statistics."""
    stats = tdef.stats_at(meta.stats, meta.schema_version)
    return may_match(stats, list(tdef.partition_by), meta.partition, where, tdef.schema)


def in_key_order(data: pa.Table, pk: list[str]) -> pa.Table:
    """``data`` (rows of distinct keys) in key order: as it is when it already is (a merged
    part's rows, written sorted: a table after a major compaction), else taken into it."""
    if keyfold.ascending(data, pk):
        return data
    return data.take(keyfold.live_key_order(data, pk))
