"""A keys table read by Spark's own Parquet reader, its versions folded in Spark (issue 24 item 2).

``read_table`` (spark/native.py) gives this the part files visible at the snapshot. Spark reads
them all (the table's columns plus ``_op``, ``_seq``, ``_cols`` and a compaction's ``_ver``),
each row's version is its ``_ver`` or else its file's creation CSN (looked up by the file's
name in a map literal), read locks are dropped, and one aggregation per key folds the rest exactly as
:func:`coordinator.core.keyfold.merge` does:

* the row exists when the key's last version (by version, then ``_seq``) is not a DELETE;
* each non-key column takes its value from the key's last version that *sets* it: a PUT or a
  DELETE sets every column (a DELETE to null), an UPDATE only the columns its ``_cols`` names.

Each column is one ``max_by(value, (version, _seq))`` over the rows that set it (the ordering
is null elsewhere, and ``max_by`` skips null orderings). Why not the usual
``row_number() over (partition by key order by version desc, _seq desc) = 1``: that picks one
whole row, and an UPDATE row holds only the columns it wrote (the rest null in the file), so the
latest row alone is wrong whenever it is an UPDATE; the column carried forward from an earlier
PUT needs a per-column pick, which the aggregation makes in the one shuffle by key that a
window takes too. ``mapInArrow`` over key-range partitions calling keyfold would be right as
well, but moves every version through Python workers: the cost this path exists to avoid.

That fold shuffles every version by key and sorts it (``max_by`` over a struct and strings has
no hash aggregation): 5-9x ``spark.read.parquet`` of the folded rows. Most keys need no fold, so
first the driver reads the parts' key columns (footers and key column chunks only) and
:func:`choose_roads` picks the *direct* parts: the biggest ones, each holding every key of it
once and no key of another direct part (a major compaction's output, inserts of new keys). Their
rows are rows of the result as they are (a single version: a PUT or an UPDATE of an absent key,
the unwritten columns null; a DELETE is no row), with no shuffle. The other, *small* parts are
folded as above (a small shuffle) keeping, per column, the version its value comes from, and
broadcast to the direct rows (a left outer broadcast join on the key): per column the later of
the direct row's version (when it sets the column) and the small side's wins, the row's ``_op``
from the later of the two. Keys only small parts hold (the driver knows them) are added from the
small fold. When no part qualifies, or the small side would be bigger than the direct one (or
than a million versions: its fold is broadcast), every version is folded as before.

A filter on the result is pushed by Catalyst below the aggregation when it is on key columns
(grouping columns) and so into the Parquet scan; on other columns it applies after the fold, as
it must (a newer version may move a row out of it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from coordinator.core.errors import CorruptMetadata
from coordinator.core.keytables import COLS, DELETE, LOCK_STRONG, OP, PUT, SEQ, UPDATE, VER
from coordinator.model.catalog import TableDef
from parts.model.meta import PartMeta
from spark.schema import spark_schema

_V = "_mergetxn_v"
_CSN = "_mergetxn_csn"
_WROTE = "_mergetxn_wrote"
_S = "_mergetxn_s_"  # the small side's folded columns, beside the direct rows' own
# Past this many versions the driver does not read the key columns to choose the roads (its
# memory), and every version is folded.
DRIVER_KEYS_MAX = 16_000_000

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
    keys: Sequence[pa.Table], primary_key: Sequence[str], *, candidates: int = 8, small_max: int = 1_000_000
) -> Roads | None:
    """Which parts (their key columns ``keys``, one table a part, lock rows included) can be read
    without a fold: the biggest parts (at most ``candidates``), in order of size, each taken when
    its keys are distinct and none is in a part taken before; the rest are the small side. None
    when the small side would hold more than ``small_max`` versions or more than the direct side:
    then broadcasting its fold costs more than folding everything."""
    order = sorted(range(len(keys)), key=lambda i: -keys[i].num_rows)
    direct: list[int] = []
    taken: pa.Table | None = None
    pk = list(primary_key)
    for i in order[:candidates]:
        t = keys[i].select(pk)
        if t.num_rows == 0 or t.group_by(pk).aggregate([]).num_rows != t.num_rows:
            continue
        if taken is not None and t.join(taken, pk, join_type="left semi").num_rows:
            continue
        direct.append(i)
        taken = t if taken is None else pa.concat_tables([taken, t.cast(taken.schema)])
    small = [i for i in range(len(keys)) if i not in direct]
    n_small = sum(keys[i].num_rows for i in small)
    n_direct = sum(keys[i].num_rows for i in direct)
    if not direct or n_small > small_max or n_small > n_direct:
        return None
    only = None
    if small:
        assert taken is not None
        mine = pa.concat_tables([keys[i].select(pk).cast(taken.schema) for i in small])
        only = mine.group_by(pk).aggregate([]).join(taken, pk, join_type="left anti")
    return Roads(tuple(sorted(direct)), tuple(small), only)


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
    roads = None
    if sum(m.rows for m in metas) <= DRIVER_KEYS_MAX:
        keys = [_key_columns(p, tdef.primary_key) for p in paths]
        roads = choose_roads(keys, tdef.primary_key)
    target = spark_schema(tdef.schema)
    if roads is None:
        log.debug("keys read of %s: every version folded (%d parts)", tdef.name, len(paths))
        folded = _fold(_versions(session, tdef, metas, paths, csns, options), tdef)
        folded = folded.where(_fn().col(OP) != _fn().lit(DELETE))
    else:
        log.debug(
            "keys read of %s: %d parts read as they are, %d folded and broadcast, %d keys of those alone",
            tdef.name,
            len(roads.direct),
            len(roads.small),
            0 if roads.small_only is None else roads.small_only.num_rows,
        )
        folded = _direct_and_small(session, tdef, metas, paths, csns, options, roads)
    return folded.select(*(_fn().col(f.name).cast(f.dataType).alias(f.name) for f in target.fields))


def _fn():
    """pyspark.sql.functions (pyspark is imported only where Spark is used)."""
    from pyspark.sql import functions

    return functions


def _key_columns(path: str, primary_key: Sequence[str]) -> pa.Table:
    """A part file's key columns, read on the driver (footer, then only those column chunks)."""
    import pyarrow.parquet as pq

    local = path.removeprefix("file://")
    return pq.read_table(local, columns=list(primary_key))


def _versions(session: Any, tdef: TableDef, metas: Sequence[PartMeta], paths: Sequence[str], csns, options):
    """The versions of the parts, read by Spark: the table's columns, ``_op``, the version
    ``(_ver or the part's creation CSN, _seq)`` and the columns an UPDATE wrote; read locks dropped."""
    f = _fn()
    reader = session.read.schema(versions_schema(tdef))
    for k, v in options.items():
        reader = reader.option(k, v)
    # A part's creation CSN by its file name (part names are unique): a map literal, no join.
    by_name = f.create_map(*(f.lit(x) for m, p in zip(metas, paths) for x in (p.rsplit("/", 1)[-1], int(csns[m.name]))))
    versions = (
        reader.parquet(*paths)
        .where(f.col(OP) < f.lit(LOCK_STRONG))
        .withColumn(_CSN, f.element_at(by_name, f.col("_metadata.file_name")).cast("long"))
    )
    at = f.struct(f.coalesce(f.col(VER), f.col(_CSN)).alias("v"), f.col(SEQ).alias("s"))
    return versions.select(
        *tdef.schema.names,
        f.col(OP),
        at.alias(_V),
        f.split(f.coalesce(f.col(COLS), f.lit("")), ",").alias(_WROTE),
    )


def _sets(c: str):
    """Whether a version row sets column ``c``: a PUT or a DELETE sets every column, an UPDATE
    the ones it wrote."""
    f = _fn()
    op = f.col(OP)
    return (op == f.lit(PUT)) | (op == f.lit(DELETE)) | ((op == f.lit(UPDATE)) & f.array_contains(f.col(_WROTE), c))


def _value(c: str):
    """What a version row sets column ``c`` to (a DELETE: null)."""
    f = _fn()
    return f.when(f.col(OP) == f.lit(DELETE), f.lit(None)).otherwise(f.col(c))


def _fold(versions: Any, tdef: TableDef, orderings: bool = False):
    """One row per key of ``versions``: ``_op`` of the last version and each non-key column
    from the last version that sets it (``max_by`` over the rows that do; the ordering is null
    elsewhere and ``max_by`` skips null orderings). With ``orderings``, also the key's last
    version (``_V``) and, per column, the version its value comes from (``_V + name``)."""
    f = _fn()
    aggs = [f.max_by(f.col(OP), f.col(_V)).alias(OP)]
    if orderings:
        aggs.append(f.max(f.col(_V)).alias(_V))
    for c in tdef.schema.names:
        if c in tdef.primary_key:
            continue
        at = f.when(_sets(c), f.col(_V))
        aggs.append(f.max_by(_value(c), at).alias(c))
        if orderings:
            aggs.append(f.max(at).alias(_V + c))
    return versions.groupBy(*tdef.primary_key).agg(*aggs)


def _direct_and_small(session: Any, tdef: TableDef, metas, paths, csns, options, roads: Roads):
    """The rows of the direct parts, each merged with its key's folded versions from the small
    parts when there are some (a broadcast join: the direct parts are never shuffled), plus the
    folded rows of keys that only the small parts hold."""
    f = _fn()
    pick = lambda idx: ([metas[i] for i in idx], [paths[i] for i in idx])  # noqa: E731
    direct = _versions(session, tdef, *pick(roads.direct), csns, options)
    pk = list(tdef.primary_key)
    others = [c for c in tdef.schema.names if c not in tdef.primary_key]
    if not roads.small:
        return direct.where(f.col(OP) != f.lit(DELETE)).select(*tdef.schema.names)
    small = _fold(_versions(session, tdef, *pick(roads.small), csns, options), tdef, orderings=True)
    theirs = small.select(*pk, *(f.col(c).alias(_S + c) for c in small.columns if c not in pk))
    both = direct.join(f.broadcast(theirs), on=pk, how="left_outer")
    mine_v = f.col(_V)
    newer = lambda v: f.col(v).isNotNull() & (f.col(v) > mine_v)  # noqa: E731 - a small side's version after mine
    cols = [f.when(newer(_S + _V), f.col(_S + OP)).otherwise(f.col(OP)).alias(OP)]
    for c in others:
        theirs_win = newer(_S + _V + c) | (~_sets(c) & f.col(_S + _V + c).isNotNull())
        cols.append(f.when(theirs_win, f.col(_S + c)).when(_sets(c), _value(c)).alias(c))
    merged = both.select(*pk, *cols).where(f.col(OP) != f.lit(DELETE)).select(*tdef.schema.names)
    if roads.small_only is None or roads.small_only.num_rows == 0:
        return merged
    from pyspark.sql.types import StructType

    key_schema = StructType([f_ for f_ in spark_schema(tdef.schema).fields if f_.name in pk])
    alone = session.createDataFrame(roads.small_only.select(pk), schema=key_schema)
    extra = small.join(f.broadcast(alone), on=pk, how="left_semi").where(f.col(OP) != f.lit(DELETE))
    return merged.unionByName(extra.select(*tdef.schema.names))
