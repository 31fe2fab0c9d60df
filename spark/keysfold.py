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

A filter on the result is pushed by Catalyst below the aggregation when it is on key columns
(grouping columns) and so into the Parquet scan; on other columns it applies after the fold, as
it must (a newer version may move a row out of it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from coordinator.core.errors import CorruptMetadata
from coordinator.core.keytables import COLS, DELETE, LOCK_STRONG, OP, PUT, SEQ, UPDATE, VER
from coordinator.model.catalog import TableDef
from parts.model.meta import PartMeta
from spark.schema import spark_schema

_V = "_mergetxn_v"
_CSN = "_mergetxn_csn"
_WROTE = "_mergetxn_wrote"


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


def read_folded(
    session: Any,
    tdef: TableDef,
    metas: Sequence[PartMeta],
    paths: Sequence[str],
    csns: Mapping[str, int],
    options: Mapping[str, str],
):
    """One row per key of the parts ``metas`` (files at ``paths``; ``csns``: part name ->
    creation CSN) as a DataFrame in the table's schema, read and folded by Spark."""
    from pyspark.sql import functions as F

    if not paths:
        return session.createDataFrame([], spark_schema(tdef.schema))
    reader = session.read.schema(versions_schema(tdef))
    for k, v in options.items():
        reader = reader.option(k, v)
    missing = [m.name for m in metas if m.name not in csns]
    if missing:
        raise CorruptMetadata(f"mergetxn: the replica gave no creation CSN for part(s) {missing[:3]}")
    # A part's creation CSN by its file name (part names are unique): a map literal, no join.
    by_name = F.create_map(*(F.lit(x) for m, p in zip(metas, paths) for x in (p.rsplit("/", 1)[-1], int(csns[m.name]))))
    versions = (
        reader.parquet(*paths)
        .where(F.col(OP) < F.lit(LOCK_STRONG))
        .withColumn(_CSN, F.element_at(by_name, F.col("_metadata.file_name")).cast("long"))
    )
    at = F.struct(F.coalesce(F.col(VER), F.col(_CSN)).alias("v"), F.col(SEQ).alias("s"))
    versions = versions.select(
        *tdef.schema.names,
        F.col(OP),
        at.alias(_V),
        F.split(F.coalesce(F.col(COLS), F.lit("")), ",").alias(_WROTE),
    )
    op = F.col(OP)
    resets = (op == F.lit(PUT)) | (op == F.lit(DELETE))
    aggs = [F.max_by(op, F.col(_V)).alias(OP)]
    for c in tdef.schema.names:
        if c in tdef.primary_key:
            continue
        sets = resets | ((op == F.lit(UPDATE)) & F.array_contains(F.col(_WROTE), c))
        value = F.when(op == F.lit(DELETE), F.lit(None)).otherwise(F.col(c))
        aggs.append(F.max_by(value, F.when(sets, F.col(_V))).alias(c))
    folded = versions.groupBy(*tdef.primary_key).agg(*aggs).where(F.col(OP) != F.lit(DELETE))
    target = spark_schema(tdef.schema)
    return folded.select(*(F.col(f.name).cast(f.dataType).alias(f.name) for f in target.fields))
