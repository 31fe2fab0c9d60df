"""Reading a keys table's parts by key range (the rules: coordinator/core/keyranges.py).

A part is opened once per range it is read for, its file checked as :func:`read_part` checks
it (size and checksum, then Parquet), and only its rows whose first key column lies in the range
are kept, batch by batch: a row group whose footer statistics rule the range out is not decoded.
What stays in memory while a range is read is one part's file, one batch of it and the range's
versions so far.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from coordinator.core import keyfold, keyranges
from coordinator.core.errors import CorruptPart, clip, quote
from parts.io.format import verified_bytes
from parts.io.storage import Storage
from parts.model.meta import PartMeta

BATCH_ROWS = 16 * 1024


@contextmanager
def opened(storage: Storage, meta: PartMeta) -> Iterator[pq.ParquetFile]:
    """The part's file as a ``ParquetFile``, once its size and checksum match its metadata."""
    raw = verified_bytes(storage, meta)
    try:
        pf = pq.ParquetFile(pa.BufferReader(raw))
        if pf.metadata.num_rows != meta.rows:
            raise CorruptPart(
                f"part {quote(meta.path)} has {pf.metadata.num_rows} rows, {meta.rows} were written", path=meta.path
            )
        yield pf
    except (pa.ArrowException, OSError) as exc:
        raise CorruptPart(f"part {quote(meta.path)} does not parse as Parquet: {clip(exc)}", path=meta.path) from None
    finally:
        del raw


def read_versions(
    storage: Storage,
    meta: PartMeta,
    plan: keyfold.ReadPlan,
    primary_key: tuple[str, ...],
    threads: bool = False,
    repeats: bool = True,
) -> pa.Table:
    """A part's versions for a whole read (``client.read``), decoding only the columns ``plan``
    names (:func:`keyfold.read_plan`: what its statistics do not prove constant), and those that
    order a key's versions when the plan asks for them or a key occurs twice in the part;
    completed to what :func:`keyfold.merge` takes. ``threads``: Arrow's own threads decode (a
    part read alone). ``repeats=False``: the columns held back are not decoded even when a key
    repeats; the caller tells which parts need them (:func:`keyfold.repeating`) and reads those
    again."""
    with opened(storage, meta) as pf:
        if plan.columns is None:
            return pf.read(use_threads=threads)
        have = pf.schema_arrow.names
        data = pf.read(columns=[c for c in plan.columns if c in have], use_threads=threads)
        more = [c for c in keyfold.also_read(plan, data, primary_key) if c in have] if repeats else []
        if more:
            for c, col in zip(more, pf.read(columns=more, use_threads=threads).columns):
                data = data.append_column(pf.schema_arrow.field(c), col)
    return keyfold.completed(plan, data)


def read_all_versions(
    storage: Storage,
    metas: Sequence[PartMeta],
    plans: Sequence[keyfold.ReadPlan],
    primary_key: tuple[str, ...],
    pool: Executor,
) -> list[pa.Table]:
    """:func:`read_versions` of each part (``plans``: theirs, in order) in ``pool``'s threads.
    Whether a key occurs twice in a part, which then decodes the columns its plan holds back, is
    told once all are decoded, for all of them at once (:func:`keyfold.repeating`: ~4 ms of CPU
    less than part by part over benchmarks/keys_bench.py's 120 parts), and only those parts are read again."""
    datas = list(
        pool.map(lambda mp: read_versions(storage, mp[0], mp[1], primary_key, repeats=False), zip(metas, plans))
    )
    keys = [d.column(primary_key[0]) if p.columns is not None else None for d, p in zip(datas, plans)]
    again = keyfold.repeating(plans, keys)
    for i, data in zip(again, pool.map(lambda i: read_versions(storage, metas[i], plans[i], primary_key), again)):
        datas[i] = data
    return datas


def decoded_bytes(pf: pq.ParquetFile) -> int:
    """The part's uncompressed size by its footer: about what its rows take decoded."""
    md = pf.metadata
    return sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))


def sample_keys(pf: pq.ParquetFile, column: str, stride: int) -> pa.Array:
    """Every ``stride``-th value of the part's ``column``, one row group at a time."""
    pieces = []
    for i in range(pf.metadata.num_row_groups):
        col = pf.read_row_group(i, columns=[column]).column(0)
        pieces.append(col.take(pa.array(range(0, len(col), stride), pa.int64())).combine_chunks())
    return pa.concat_arrays(pieces) if pieces else pa.array([], pf.schema_arrow.field(column).type)


def read_range(
    storage: Storage, meta: PartMeta, column: str, lo: Any, hi: Any, dead: np.ndarray | None = None
) -> pa.Table:
    """The part's rows whose ``column`` lies in ``[lo, hi)`` (None: open), all its columns;
    with ``dead`` (row numbers of the part: its deletion vector), those rows left out."""
    with opened(storage, meta) as pf:
        if lo is None and hi is None and dead is None:
            return pf.read()
        md = pf.metadata
        at = pf.schema_arrow.get_field_index(column)
        starts = np.cumsum([0] + [md.row_group(i).num_rows for i in range(md.num_row_groups)])
        pieces = []
        for i in range(md.num_row_groups):
            stats = md.row_group(i).column(at).statistics if at >= 0 else None
            lo_g, hi_g = (stats.min, stats.max) if stats is not None and stats.has_min_max else (None, None)
            if not keyranges.may_overlap(lo_g, hi_g, lo, hi):
                continue
            row = int(starts[i])
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[i]):
                mask = keyranges.kept(batch.column(column), lo, hi, row, dead)
                pieces.append(batch if mask is None else batch.filter(mask))
                row += batch.num_rows
        return pa.Table.from_batches(pieces, schema=pf.schema_arrow)
