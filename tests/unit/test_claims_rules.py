"""The pure rules that hold a part's claimed metadata against its file:
statistics must cover the file's values, partition values must be every row's, the columns must
be the table's, a key summary must hold every key, and a retried commit must carry the metadata
that was committed. The integration side is tests/integration/test_part_claims.py."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest

from coordinator.core import keytables
from parts.io.format import (
    _parquet_bytes,
    checksum_of,
    claims_problem,
    column_stats,
    file_claims,
    file_meta,
    partition_problem,
    schema_problem,
    stat_problem,
)
from parts.model.meta import PartMeta
from replicas.registry import _other_metadata


@pytest.mark.parametrize(
    ("claimed", "truth", "ok"),
    [
        ((0, 9), (0, 9), True),
        ((-5, 100), (0, 9), True),  # wider: less pruning, no lie
        ((150, 150), (7, 7), False),  # the finding: n == 7 pruned away
        ((1, 9), (0, 9), False),
        ((0, 8), (0, 9), False),
        ((0, None), (0, 9), True),  # no upper bound
        ((None, 9), (0, 9), True),  # no lower bound
        ((None, None), (None, None), True),
        ((None, None), (0, 9), False),  # "every value null" for a file with values
        ((3, 4), (None, None), True),  # every value null: any range covers them
        ((0.0, 9.5), (0, 9), True),  # numbers compare across int and float
        (("a", "z"), ("b", "c"), True),
        (("c", "z"), ("b", "c"), False),
        (("a", "z"), (0, 9), False),  # another kind of value than the column's
        ((False, True), (False, True), True),
        ((0, 1), (False, True), False),  # a number for a bool
        (("a", "b"), ("a", None), False),  # the file's max has no bound: a bounded claim is narrower
        ((1, 2), None, False),  # the file's values have no order (NaN)
    ],
)
def test_a_claimed_range_must_cover_the_files_values(claimed: tuple, truth: tuple | None, ok: bool) -> None:
    assert (stat_problem(claimed, truth) is None) is ok


def meta(**kw: object) -> PartMeta:
    base = PartMeta("p1", "t", (), "t/_/p1.parquet", 1, 10, "crc32:00000000", {"n": (1, 1)}, "T1-1-r0", 1.0)
    return dataclasses.replace(base, **kw)


def test_a_statistic_of_a_column_the_file_lacks_is_named() -> None:
    assert claims_problem(meta(), {"n": (1, 1)}, ["n"]) is None
    assert claims_problem(meta(stats={"x": (1, 1)}), {}, ["n"]) == ("stats.x", "names a column the file does not have")
    field, why = claims_problem(meta(stats={"n": (150, 150)}), {"n": (7, 7)}, ["n"])  # type: ignore[misc]
    assert field == "stats.n" and "150" in why and "7" in why


def test_every_row_must_be_in_the_claimed_partition() -> None:
    assert partition_problem(["d"], ("x",), {"d": ("x", "x")}) is None
    assert partition_problem(["d"], (None,), {"d": (None, None)}) is None
    assert partition_problem(["d"], ("x",), {"d": ("x", "y")})[0] == "partition.d"  # type: ignore[index]
    assert partition_problem(["d"], ("x",), {"d": ("y", "y")})[0] == "partition.d"  # type: ignore[index]
    assert partition_problem(["d"], (None,), {"d": ("x", "x")})[0] == "partition.d"  # type: ignore[index]
    long = "v" * 200  # statistics hold a bounded prefix of a long value: compared so
    from coordinator.core.tabledata import bound_range

    assert partition_problem(["d"], (long,), {"d": bound_range(long, long)}) is None


def test_a_files_columns_must_be_the_tables() -> None:
    table = pa.schema([pa.field("n", pa.int64(), nullable=False), ("s", pa.large_string()), ("t", pa.timestamp("us"))])
    assert schema_problem(table, table) is None
    spark_like = pa.schema([("n", pa.int64()), ("s", pa.string()), ("t", pa.timestamp("us"))])
    assert schema_problem(spark_like, table) is None  # string for large_string reads the same
    assert schema_problem(pa.schema([("n", pa.int64())]), table) is None  # nullable ones may be absent
    assert "lacks the non-nullable column 'n'" in schema_problem(pa.schema([("s", pa.string())]), table)  # type: ignore[operator]
    assert "'x'" in schema_problem(pa.schema([("n", pa.int64()), ("x", pa.int8())]), table)  # type: ignore[operator]
    assert "is string in the file" in schema_problem(pa.schema([("n", pa.string())]), table)  # type: ignore[operator]
    zoned = pa.schema([("n", pa.int64()), ("t", pa.timestamp("us", tz="UTC"))])
    assert "timestamp" in schema_problem(zoned, table)  # type: ignore[operator]


def test_a_key_summary_must_hold_every_key() -> None:
    data = keytables.versions(
        pa.schema([("k", pa.int64()), ("v", pa.string())]),
        ["k"],
        "t",
        pa.table({"k": [1, 2, 3], "v": ["a", "b", "c"]}),
        keytables.PUT,
        0,
    )
    honest = keytables.summarize(data, ["k"])
    assert keytables.summary_gap(honest, data, ["k"]) is None
    assert "key range" in keytables.summary_gap({**honest, "lo": [2]}, data, ["k"])  # type: ignore[operator]
    other = keytables.summarize(data.slice(0, 1), ["k"])  # a filter built for key 1 alone
    assert "Bloom filter" in keytables.summary_gap({**other, "lo": [1], "hi": [3]}, data, ["k"])  # type: ignore[operator]
    wrong_exact = {**honest, "exact": [[1, keytables.DELETE, None]]}
    assert "'exact'" in keytables.summary_gap(wrong_exact, data, ["k"])  # type: ignore[operator]
    bigger = keytables.versions(
        pa.schema([("k", pa.int64())]), ["k"], "t", pa.table({"k": list(range(5000))}), keytables.PUT, 0
    )
    big = keytables.summarize(bigger, ["k"])
    assert keytables.summary_gap(big, bigger, ["k"]) is None  # checked in Arrow kernels
    small_filter = keytables.summarize(bigger.slice(0, 600), ["k"])
    assert "Bloom filter" in keytables.summary_gap({**small_filter, "lo": [0], "hi": [4999]}, bigger, ["k"])  # type: ignore[operator]


def file_and_meta(data: pa.Table) -> tuple[bytes, PartMeta]:
    raw = _parquet_bytes(data, None)
    return raw, meta(rows=data.num_rows, size=len(raw), checksum=checksum_of(raw), stats=column_stats(data))


def test_file_claims_names_the_first_field_a_file_refutes() -> None:
    data = pa.table({"n": [7, 8], "f": [0.5, float("nan")]})
    raw, m = file_and_meta(data)
    assert "f" not in m.stats  # a column with NaN has no statistics
    assert file_claims(raw, m, data.schema) is None
    for change, field in (
        ({"size": m.size + 4096}, "size"),
        ({"checksum": "crc32:00000000"}, "checksum"),
        ({"rows": 999}, "rows"),
        ({"stats": {**m.stats, "n": (150, 150)}}, "stats.n"),
        ({"stats": {**m.stats, "f": (0.5, 0.5)}}, "stats.f"),  # one value claimed: `f != 0.5` would skip the NaN
        ({"stats": {**m.stats, "f": (0.6, 1.0)}}, "stats.f"),
    ):
        got = file_claims(raw, dataclasses.replace(m, **change), data.schema)
        assert got is not None and got[0] == field, (change, got)
    # A range of several values prunes no NaN row (only != matches NaN, and it prunes one value).
    for decoded in (False, True):  # at stage (the footer) and in mergetxn check (decoded) alike
        ranged = dataclasses.replace(m, stats={**m.stats, "f": (0.0, 1.0)})
        assert file_claims(raw, ranged, data.schema, decoded=decoded) is None
        one = dataclasses.replace(m, stats={**m.stats, "f": (0.5, 0.5)})
        assert file_claims(raw, one, data.schema, decoded=decoded)[0] == "stats.f"  # type: ignore[index]
    nan = pa.table({"f": [float("nan")]})
    raw_nan, m_nan = file_and_meta(nan)
    for decoded in (False, True):  # a column of NaN alone has no order to claim
        claim = dataclasses.replace(m_nan, stats={"f": (0.0, 1.0)})
        assert file_claims(raw_nan, claim, nan.schema, decoded=decoded)[0] == "stats.f"  # type: ignore[index]
    assert file_claims(b"x" * m.size, dataclasses.replace(m, checksum=checksum_of(b"x" * m.size)))[0] == "file"  # type: ignore[index]
    assert file_claims(raw, m, pa.schema([("n", pa.int32())]))[0] == "schema"  # type: ignore[index]


def test_large_files_are_checked_from_the_footer_and_their_floats_decoded() -> None:
    n = 5000
    data = pa.table(
        {"n": pa.array(range(n), pa.int64()), "s": [f"v{i:05}" for i in range(n)], "f": [i / 2 for i in range(n)]}
    )
    raw, m = file_and_meta(data)
    assert file_claims(raw, m, data.schema) is None
    got = file_claims(raw, dataclasses.replace(m, stats={**m.stats, "s": ("v00001", "v04999")}), data.schema)
    assert got is not None and got[0] == "stats.s"
    got = file_claims(raw, dataclasses.replace(m, stats={**m.stats, "f": (0.0, 100.0)}), data.schema)
    assert got is not None and got[0] == "stats.f"


def test_file_meta_takes_every_claim_from_the_file() -> None:
    data = pa.table({"n": [7]})
    raw, m = file_and_meta(data)
    lie = dataclasses.replace(m, rows=5, stats={"n": (150, 150)}, key_summary={"lo": [1]})
    truth = file_meta(raw, lie)
    assert (truth.rows, truth.size, truth.checksum, truth.stats, truth.key_summary) == (
        1,
        m.size,
        m.checksum,
        {"n": (7, 7)},
        None,
    )
    assert file_claims(raw, truth, data.schema) is None


def test_a_retry_must_carry_the_committed_metadata() -> None:
    committed = meta(creation_tid="T5-1-r0")
    sent = {**committed.to_dict(), "creation_tid": "anything"}  # the replica sets creation_tid
    assert _other_metadata(sent, committed) is None
    assert _other_metadata({**sent, "rows": 2}, committed) == "rows"
    assert _other_metadata({**sent, "stats": {"n": [0, 5]}}, committed) == "stats"
    assert _other_metadata({**sent, "checksum": "nope"}, committed).startswith("it does not parse")  # type: ignore[union-attr]


def test_nulls_in_a_not_null_column_are_refused() -> None:
    table = pa.schema([pa.field("n", pa.int64(), nullable=False), ("s", pa.string())])
    loose = pa.table({"n": pa.array([1, None]), "s": ["a", None]})
    raw, m = file_and_meta(loose)
    got = file_claims(raw, m, table)
    assert got is not None and got[0] == "schema" and "NOT NULL" in got[1] and "1 null" in got[1]
    ok = pa.table({"n": [1, 2], "s": ["a", None]})
    raw, m = file_and_meta(ok)
    assert file_claims(raw, m, table) is None
