"""A keys table read by Spark's own Parquet reader, its versions folded in Spark.

``read_table`` (spark/native.py) gives this the part files visible at the snapshot. Spark reads
them all (the table's columns plus ``_op``, ``_seq``, ``_cols`` and a compaction's ``_ver``),
each row's version is its ``_ver`` or else its file's creation CSN (looked up by the file's
name in a map literal), read locks are dropped, and the versions are folded exactly as
:func:`coordinator.core.keyfold.merge` does:

* the row exists when the key's last version (by version, then ``_seq``) is not a DELETE;
* each non-key column takes its value from the key's last version that *sets* it: a PUT or a
  DELETE sets every column (a DELETE to null), an UPDATE only the columns its ``_cols`` names.

The fold of a set of versions is one aggregation per key: each column is one
``max_by(value, (version, _seq))`` over the rows that set it (the ordering is null elsewhere,
and ``max_by`` skips null orderings). Why not the usual ``row_number() over (partition by key
order by version desc, _seq desc) = 1``: that picks one whole row, and an UPDATE row holds only
the columns it wrote (the rest null in the file), so the latest row alone is wrong whenever it
is an UPDATE. ``mapInArrow`` over key ranges calling keyfold would be right as well, but moves
every version through Python workers: the cost this path exists to avoid.

That aggregation costs a shuffle and a sort of every version, several times a plain scan, so it
is taken only where it must be. The driver reads the parts' key columns (footers and those
column chunks, page checksums verified) and picks the *direct* parts (:func:`choose_roads`):
the biggest that each hold a key at most once and share no key, e.g. a major compaction's
output per partition or inserts of new keys. Their rows need no fold; only the other, *small*
parts are folded (in one task, so with no shuffle either, up to :data:`SMALL_ONE_TASK`
versions), and that fold is broadcast to the direct rows (no shuffle of them). Two ways
to merge the two, chosen from the parts' metadata alone (:func:`overlay`):

* **overlay**: every small version is later than every direct one (their CSNs and the ``_ver``
  statistics say so: the usual shape, upserts after the bulk). Then a key's small fold wins
  wherever it sets a column or holds the last op, and the direct rows need no version, no file
  name and, when their ``_op`` statistics say they are all PUTs, no hidden column at all: the
  scan reads the table's columns and each is one ``CASE`` after the join.
* **by version**: otherwise each direct row carries its version and each column takes the later
  of the row's and the small fold's.

Keys only small parts hold (the driver knows them from the key columns) come from the small
fold alone. No part qualifies, or the small side is the bigger: every version is folded.

A filter on the result is pushed by Catalyst below the aggregation when it is on key columns
(grouping columns) and so into the Parquet scan; on other columns it applies after the fold, as
it must (a newer version may move a row out of it).

The expressions are written as SQL text (``selectExpr``, ``expr``): each Python column object
is a py4j round trip, and building the per-column expressions of a wide table that way cost
over a thousand calls per read.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.core.errors import CorruptMetadata, CorruptPart
from coordinator.core.keytables import COLS, DELETE, LOCK_STRONG, OP, PUT, SEQ, UPDATE, VER
from coordinator.model.catalog import TableDef
from parts.model.meta import PartMeta
from spark.schema import spark_schema

_V = "_mergetxn_v"
_WROTE = "_mergetxn_wrote"
_SET = "_mergetxn_set_"  # the small fold: whether one of its versions sets the column
_S = "_mergetxn_s_"  # the small side's folded columns, beside the direct rows' own
# Past this many versions the driver does not read the key columns to choose the roads (its
# memory), and every version is folded.
DRIVER_KEYS_MAX = 16_000_000
# Up to this many small versions their fold runs in one task (no shuffle stage).
SMALL_ONE_TASK = 250_000
_ANY_OP = (PUT, LOCK_STRONG + 1)  # what a part without _op statistics may hold

log = logging.getLogger(__name__)


def versions_schema(tdef: TableDef):
    """What Spark reads from a keys table's part files: the table's columns, then the hidden ones
    (``_ver`` is in a compaction's output only; Spark reads it as null from the others)."""
    from pyspark.sql.types import ByteType, LongType, StringType, StructField, StructType

    fields = list(spark_schema(tdef.schema).fields)
    fields += [
        StructField(OP, ByteType(), True),
        StructField(SEQ, LongType(), True),
        StructField(COLS, StringType(), True),
        StructField(VER, LongType(), True),
    ]
    return StructType(fields)


@dataclass(frozen=True)
class Roads:
    """How :func:`read_folded` reads a keys table (chosen by :func:`choose_roads` on the driver).

    ``direct``: indexes of parts whose rows are read as they are, with no shuffle: together
    they hold each key at most once. ``small``: the other parts, folded by key in Spark (a small
    shuffle) and broadcast to the direct rows. ``small_only``: the keys of ``small`` that no
    direct part holds (their folded rows are rows of the result by themselves)."""

    direct: tuple[int, ...]
    small: tuple[int, ...]
    small_only: pa.Table | None


def choose_roads(
    keys: Sequence[pa.Table],
    primary_key: Sequence[str],
    *,
    candidates: int = 8,
    small_max: int = 1_000_000,
    allowed: Collection[int] | None = None,
) -> Roads | None:
    """Which parts (their key columns ``keys``, one table a part, read locks left out) can be
    read without a fold: the biggest parts (at most ``candidates``), in order of size, each
    taken when its keys are distinct and none is in a part taken before; the rest are the small
    side. None when the small side would hold more than ``small_max`` versions or more than the
    direct side: then broadcasting its fold costs more than folding everything. ``allowed``:
    the parts that may be direct (default: all).

    One stable sort of every part's keys, the candidates first in order of size, answers it
    all: in a run of equal keys the parts come in that order, so the pairs of parts at distance
    1, 2, ... within runs are exactly the pairs that share a key (a part paired with itself holds
    a key twice), and a run with no taken part is a key only small parts hold."""
    pk = list(primary_key)
    ranked = sorted((i for i in range(len(keys)) if allowed is None or i in allowed), key=lambda i: -keys[i].num_rows)
    cands = [i for i in ranked[:candidates] if keys[i].num_rows]
    if not cands:
        return None
    order = cands + [i for i in range(len(keys)) if i not in cands]  # a part's rank: its place here
    first = keys[order[0]].select(pk)
    every = pa.concat_tables([keys[i].select(pk).cast(first.schema) for i in order])
    n = every.num_rows
    part = pa.concat_arrays([pa.nulls(keys[i].num_rows, pa.int32()).fill_null(r) for r, i in enumerate(order)])
    at = pc.sort_indices(every.column(0) if len(pk) == 1 else every, sort_keys=[(k, "ascending") for k in pk])
    cols = [every.column(k).take(at).combine_chunks() for k in pk]
    same = _same_as_previous(cols, n)
    part = part.take(at)
    pairs: set[tuple[int, int]] = set()
    chain, d = same, 1
    while pc.any(chain).as_py():
        if d > _MAX_RUN:
            return None  # a key in that many versions: fold everything
        codes = pc.add(pc.multiply(_shift(part, d).cast(pa.int64()), len(order)), part.cast(pa.int64()))
        pairs.update(divmod(v, len(order)) for v in pc.unique(codes.filter(chain)).to_pylist())
        d += 1
        chain = pc.and_(chain, _shift(same, d - 1))
    taken: list[int] = []
    for r in range(len(cands)):
        if (r, r) not in pairs and not any((t, r) in pairs for t in taken):
            taken.append(r)
    direct = sorted(order[r] for r in taken)
    small = [i for i in range(len(keys)) if i not in direct]
    n_small = sum(keys[i].num_rows for i in small)
    n_direct = sum(keys[i].num_rows for i in direct)
    if not direct or n_small > small_max or n_small > n_direct:
        return None
    if not small:
        return Roads(tuple(direct), (), None)
    return Roads(tuple(direct), tuple(small), _keys_of_small_only(pk, cols, same, part, taken))


def _same_as_previous(cols: Sequence[pa.Array], n: int) -> pa.Array:
    """For each of the ``n`` sorted keys (one array a key column): whether it equals the one
    before (False for the first)."""
    same = None
    for c in cols:
        eq = pc.equal(c.slice(1), c.slice(0, n - 1))
        same = eq if same is None else pc.and_(same, eq)
    return pa.concat_arrays([pa.array([False]), same])


def _keys_of_small_only(
    pk: Sequence[str], cols: Sequence[pa.Array], same: pa.Array, part: pa.Array, taken: Sequence[int]
) -> pa.Table:
    """The keys (sorted ``cols``, runs of equal keys marked by ``same``, each row's part rank in
    ``part``) that no taken part holds: a table of the ``pk`` columns."""
    n = len(part)
    mine = pc.is_in(part, value_set=pa.array(taken, pa.int32())).cast(pa.int64())
    starts = pc.indices_nonzero(pc.invert(same)).cast(pa.int64())
    ends = pa.concat_arrays([pc.subtract(starts.slice(1), 1), pa.array([n - 1], pa.int64())])
    upto = pc.cumulative_sum(mine)
    held = pc.add(pc.subtract(upto.take(ends), upto.take(starts)), mine.take(starts))
    alone = starts.filter(pc.equal(held, 0))
    return pa.table({k: c.take(alone) for k, c in zip(pk, cols)})


_MAX_RUN = 64  # versions of one key (in sorted order) that choose_roads follows before it gives up


def _shift(a: pa.Array, d: int) -> pa.Array:
    """``a`` moved ``d`` places later (the first ``d`` are zero / false)."""
    fill = pa.nulls(d, a.type).fill_null(False if pa.types.is_boolean(a.type) else 0)
    return pa.concat_arrays([fill, a.slice(0, len(a) - d)])


def op_range(meta: PartMeta) -> tuple[int, int]:
    """The least and greatest ``_op`` a part may hold, from its statistics (all, without them)."""
    lo, hi = meta.stats.get(OP) or (None, None)
    if isinstance(lo, int) and isinstance(hi, int) and not isinstance(lo, bool) and not isinstance(hi, bool):
        return lo, hi
    return _ANY_OP


def version_range(meta: PartMeta, csn: int) -> tuple[int, int] | None:
    """The least and greatest version of a part's rows: its creation CSN, or for a compaction's
    output (``_ver``) its statistics; None when they do not say."""
    if VER not in meta.stats:
        return csn, csn
    lo, hi = meta.stats[VER] or (None, None)
    if isinstance(lo, int) and isinstance(hi, int) and not isinstance(lo, bool) and not isinstance(hi, bool):
        return lo, hi
    return None


def overlay(direct: Sequence[tuple[int, int] | None], small: Sequence[tuple[int, int] | None]) -> bool:
    """Whether every small part's version range (:func:`version_range`) lies after every direct
    part's: then a key's small fold holds its last versions, whatever the ``_seq``."""
    if not small or any(r is None for r in direct) or any(r is None for r in small):
        return False
    return max(r[1] for r in direct if r is not None) < min(r[0] for r in small if r is not None)


def overlaid(ranges: Sequence[tuple[int, int] | None], direct: Sequence[int]) -> list[int]:
    """The direct parts (indexes into ``ranges``, each part's :func:`version_range`) that stay
    direct when every direct part whose versions reach those of a part outside them moves to
    the small side (repeated: a moved part's versions count then): what the overlay road can
    keep when a few parts written beside the small ones (the same transaction, or later) were
    taken as direct."""
    keep = [i for i in direct if ranges[i] is not None]
    while True:
        rest = [r for i, r in enumerate(ranges) if i not in keep]
        if any(r is None for r in rest):
            return []
        cut = min((r[0] for r in rest if r is not None), default=None)
        if cut is None:
            return keep
        fewer = [i for i in keep if ranges[i][1] < cut]  # type: ignore[index]
        if fewer == keep:
            return keep
        keep = fewer


def _sides(ranges: Sequence[tuple[int, int] | None], roads: Roads) -> tuple[list, list]:
    return [ranges[i] for i in roads.direct], [ranges[i] for i in roads.small]


def read_folded(
    session: Any,
    tdef: TableDef,
    metas: Sequence[PartMeta],
    paths: Sequence[str],
    csns: Mapping[str, int],
    options: Mapping[str, str],
):
    """One row per key of the parts ``metas`` (files at ``paths``; ``csns``: part name ->
    creation CSN) as a DataFrame in the table's schema, read and folded by Spark: when
    :func:`choose_roads` finds big parts that need no fold, only the small side is folded (and
    broadcast); otherwise every version is folded (one shuffle by key)."""
    if not paths:
        return session.createDataFrame([], spark_schema(tdef.schema))
    missing = [m.name for m in metas if m.name not in csns]
    if missing:
        raise CorruptMetadata(f"mergetxn: the replica gave no creation CSN for part(s) {missing[:3]}")
    side = _Side(session, tdef, options)
    roads = None
    if sum(m.rows for m in metas) <= DRIVER_KEYS_MAX:
        keys = [_key_columns(m, p, tdef.primary_key) for m, p in zip(metas, paths)]
        rows = [i for i, k in enumerate(keys) if k.num_rows]  # a part of read locks alone is not read
        if not rows:
            return session.createDataFrame([], spark_schema(tdef.schema))
        metas, paths, keys = [metas[i] for i in rows], [paths[i] for i in rows], [keys[i] for i in rows]
        roads = choose_roads(keys, tdef.primary_key)
        ranges = [version_range(m, int(csns[m.name])) for m in metas]
        if roads is not None and roads.small and not overlay(*_sides(ranges, roads)):
            older = overlaid(ranges, roads.direct)
            if older and len(older) < len(roads.direct):  # the direct parts older than every small one
                fewer = choose_roads(keys, tdef.primary_key, allowed=older)
                if fewer is not None and overlay(*_sides(ranges, fewer)):
                    roads = fewer
    if roads is None:
        log.debug("keys read of %s: every version folded (%d parts)", tdef.name, len(paths))
        folded = side.fold(side.versions(metas, paths, csns)).where(f"{OP} != {DELETE}")
    else:
        on_top = overlay(*_sides(ranges, roads))
        log.debug(
            "keys read of %s: %d parts read as they are, %d folded and broadcast (%s), %d keys of those alone",
            tdef.name,
            len(roads.direct),
            len(roads.small),
            "overlay" if on_top else "by version",
            0 if roads.small_only is None else roads.small_only.num_rows,
        )
        folded = side.direct_and_small(metas, paths, csns, roads, bool(on_top))
    return side.table_columns(folded)


def _key_columns(meta: PartMeta, path: str, primary_key: Sequence[str]) -> pa.Table:
    """A part file's key columns, read on the driver (footer, then only those column chunks,
    their page checksums verified), read locks left out (Spark drops those rows too)."""
    import pyarrow.parquet as pq

    locks = op_range(meta)[1] >= LOCK_STRONG
    columns = list(primary_key) + ([OP] if locks else [])
    try:
        t = pq.read_table(path.removeprefix("file://"), columns=columns, page_checksum_verification=True)
    except (pa.ArrowException, OSError) as exc:
        raise CorruptPart(
            f"part {meta.path!r} of {meta.table!r}: its key columns cannot be read: {exc}", path=meta.path
        ) from None
    if locks:
        t = t.filter(pc.less(t.column(OP), LOCK_STRONG)).select(list(primary_key))
    return t


def q(name: str) -> str:
    """A column name quoted for Spark SQL."""
    return "`" + name.replace("`", "``") + "`"


def _lit(text: str) -> str:
    """A Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class _Side:
    """The DataFrames of one read (SQL text for the expressions, see the module docstring)."""

    def __init__(self, session: Any, tdef: TableDef, options: Mapping[str, str]) -> None:
        self.session, self.tdef, self.options = session, tdef, options
        self.pk = list(tdef.primary_key)
        self.others = [c for c in tdef.schema.names if c not in tdef.primary_key]

    def _reader(self):
        reader = self.session.read.schema(versions_schema(self.tdef))
        for k, v in self.options.items():
            reader = reader.option(k, v)
        return reader

    def versions(self, metas: Sequence[PartMeta], paths: Sequence[str], csns: Mapping[str, int]):
        """The versions of the parts, read by Spark: the table's columns, ``_op``, the version
        ``(_ver or the part's creation CSN, _seq)`` and the columns an UPDATE wrote; read locks
        dropped."""
        # A part's creation CSN by its file name (part names are unique): a map literal, no join.
        by_name = ", ".join(f"{_lit(p.rsplit('/', 1)[-1])}, {int(csns[m.name])}" for m, p in zip(metas, paths))
        csn = f"CAST(element_at(map({by_name}), _metadata.file_name) AS BIGINT)"
        return (
            self._reader()
            .parquet(*paths)
            .where(f"{OP} < {LOCK_STRONG}")
            .selectExpr(
                *(q(c) for c in self.tdef.schema.names),
                OP,
                f"named_struct('v', coalesce({VER}, {csn}), 's', {SEQ}) AS {_V}",
                f"split(coalesce({COLS}, ''), ',') AS {_WROTE}",
            )
        )

    @staticmethod
    def sets(c: str, wrote: str = _WROTE) -> str:
        """Whether a version row sets column ``c``: a PUT or a DELETE sets every column, an
        UPDATE the ones it wrote."""
        return f"({OP} = {PUT} OR {OP} = {DELETE} OR ({OP} = {UPDATE} AND array_contains({wrote}, {_lit(c)})))"

    @staticmethod
    def value(c: str) -> str:
        """What a version row sets column ``c`` to (a DELETE: null)."""
        return f"CASE WHEN {OP} = {DELETE} THEN NULL ELSE {q(c)} END"

    def fold(self, versions: Any, orderings: bool = False, flags: bool = False):
        """One row per key of ``versions``: ``_op`` of the last version and each non-key column
        from the last version that sets it. With ``orderings``, also the key's last version
        (``_V``) and, per column, the version its value comes from (``_V + name``); with
        ``flags``, per column whether a version sets it (``_SET + name``)."""
        from pyspark.sql import functions as F

        aggs = [f"max_by({OP}, {_V}) AS {OP}"]
        if orderings:
            aggs.append(f"max({_V}) AS {_V}")
        for c in self.others:
            at = f"CASE WHEN {self.sets(c)} THEN {_V} END"
            aggs.append(f"max_by({self.value(c)}, {at}) AS {q(c)}")
            if orderings:
                aggs.append(f"max({at}) AS {q(_V + c)}")
            if flags:
                aggs.append(f"bool_or({self.sets(c)}) AS {q(_SET + c)}")
        return versions.groupBy(*self.pk).agg(*(F.expr(a) for a in aggs))

    def direct_and_small(
        self, metas: Sequence[PartMeta], paths: Sequence[str], csns: Mapping[str, int], roads: Roads, on_top: bool
    ):
        """The rows of the direct parts, each merged with its key's folded versions from the small
        parts when there are some (a broadcast join: the direct parts are never shuffled), plus the
        folded rows of keys that only the small parts hold."""
        from pyspark.sql import functions as F

        def pick(idx: Sequence[int]) -> tuple[list[PartMeta], list[str]]:
            return [metas[i] for i in idx], [paths[i] for i in idx]

        ops = [op_range(metas[i]) for i in roads.direct]
        locks = max(hi for _, hi in ops) >= LOCK_STRONG
        puts = all(hi == PUT for _, hi in ops)  # every direct row a PUT: no _op, no _cols
        if not roads.small or on_top:
            direct = self._reader().parquet(*pick(roads.direct)[1])
            if locks:
                direct = direct.where(f"{OP} < {LOCK_STRONG}")
        else:
            direct = self.versions(*pick(roads.direct), csns)
        if not roads.small:
            if not puts:
                direct = direct.where(f"{OP} != {DELETE}").selectExpr(
                    *(q(c) for c in self.pk), *(self._own(c, puts) + f" AS {q(c)}" for c in self.others)
                )
            return direct
        small_versions = self.versions(*pick(roads.small), csns)
        if sum(metas[i].rows for i in roads.small) <= SMALL_ONE_TASK:
            small_versions = small_versions.coalesce(1)  # one task folds them: no shuffle
        small = self.fold(small_versions, orderings=not on_top, flags=on_top)
        theirs = small.selectExpr(
            *(q(c) for c in self.pk), *(f"{q(c)} AS {q(_S + c)}" for c in small.columns if c not in self.pk)
        )
        both = direct.join(F.broadcast(theirs), on=self.pk, how="left_outer")
        s = lambda c: q(_S + c)  # noqa: E731
        if on_top:
            cols = [f"CASE WHEN {s(_SET + c)} THEN {s(c)} ELSE {self._own(c, puts)} END AS {q(c)}" for c in self.others]
            alive = f"{s(OP)} IS NULL OR {s(OP)} != {DELETE}" if puts else f"coalesce({s(OP)}, {OP}) != {DELETE}"
        else:
            newer = lambda v: f"({v} IS NOT NULL AND {v} > {_V})"  # noqa: E731 - a small side's version after mine
            cols = [
                f"CASE WHEN {newer(s(_V + c))} OR (NOT {self.sets(c)} AND {s(_V + c)} IS NOT NULL) THEN {s(c)} "
                f"WHEN {self.sets(c)} THEN {self.value(c)} END AS {q(c)}"
                for c in self.others
            ]
            alive = f"CASE WHEN {newer(s(_V))} THEN {s(OP)} ELSE {OP} END != {DELETE}"
        merged = both.where(alive).selectExpr(*(q(c) for c in self.pk), *cols)
        if roads.small_only is None or roads.small_only.num_rows == 0:
            return merged
        from pyspark.sql.types import StructType

        key_schema = StructType([f for f in spark_schema(self.tdef.schema).fields if f.name in self.pk])
        alone = self.session.createDataFrame(roads.small_only.select(self.pk), schema=key_schema)
        extra = small.join(F.broadcast(alone), on=self.pk, how="left_semi").where(f"{OP} != {DELETE}")
        return merged.unionByName(extra.selectExpr(*(q(c) for c in self.tdef.schema.names)))

    def _own(self, c: str, puts: bool) -> str:
        """A direct row's value of ``c`` when no later version sets it: its own when it sets it
        (a PUT, an UPDATE that wrote it; a DELETE to null), else null."""
        if puts:
            return q(c)
        return (
            f"CASE WHEN {OP} = {PUT} THEN {q(c)} "
            f"WHEN {OP} = {UPDATE} AND array_contains(split({COLS}, ','), {_lit(c)}) THEN {q(c)} END"
        )

    def table_columns(self, df: Any):
        """``df``'s table columns in the table's order and types."""
        target = spark_schema(self.tdef.schema)
        have = {f.name: f.dataType for f in df.schema.fields}
        return df.selectExpr(
            *(
                q(f.name)
                if have.get(f.name) == f.dataType
                else f"CAST({q(f.name)} AS {f.dataType.simpleString()}) AS {q(f.name)}"
                for f in target.fields
            )
        )
