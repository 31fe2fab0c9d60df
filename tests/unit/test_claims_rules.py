"""The pure rules that hold a part's claimed metadata against its file:
statistics must cover the file's values, partition values must be every row's, the columns must
be the table's, a key summary must hold every key, and a retried commit must carry the metadata
that was committed. The integration side is tests/integration/test_part_claims.py."""

from __future__ import annotations

import dataclasses
from typing import Any
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core import keytables
from parts.io import format as fmt
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


# -- the footer's physical statistics (parts.io.format._plain_leaves) --------------------------------
_PLAIN_TYPES = {
    "i8": (pa.int8(), st.integers(-128, 127)),
    "i32": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "i64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "u32": (pa.uint32(), st.integers(0, 2**32 - 1)),  # physical values: two's complement, not taken
    "u64": (pa.uint64(), st.integers(0, 2**64 - 1)),
    "f32": (pa.float32(), st.floats(width=32)),
    "f64": (pa.float64(), st.floats()),
    "b": (pa.bool_(), st.booleans()),
    "s": (pa.string(), st.text(max_size=6)),
    "ls": (pa.large_string(), st.text(max_size=6)),
}


@st.composite
def _plain_tables(draw: st.DrawFn) -> tuple[pa.Table, int]:
    rows = draw(st.integers(1, 12))
    names = draw(st.lists(st.sampled_from(sorted(_PLAIN_TYPES)), min_size=1, max_size=4, unique=True))
    cols = {}
    for name in names:
        t, values = _PLAIN_TYPES[name]
        cols[name] = pa.array(draw(st.lists(st.none() | values, min_size=rows, max_size=rows)), t)
    return pa.table(cols), draw(st.integers(1, rows))


@settings(max_examples=150, deadline=None)
@given(_plain_tables(), st.randoms(use_true_random=False))
def test_physical_footer_statistics_say_what_the_logical_ones_say(case: tuple[pa.Table, int], rnd: Any) -> None:
    """The cheap reading of a file's footer statistics (physical values, for the columns whose
    Parquet types are pyarrow's own for the table's) finds every column's [min, max] as the
    logical reading does, so file_claims accepts and refuses the same claims either way."""
    data, group_rows = case
    raw = _parquet_bytes(data, group_rows)
    pf = fmt._Footer(raw)
    plain = fmt._plain_leaves(pf.metadata, fmt._table_schema(data.schema))
    names = data.column_names
    assert plain is not None and set(plain) == {n for n in names if not n.startswith("u")}
    exact = rnd.sample(names, rnd.randint(0, len(names)))
    fast = fmt.file_stats(pf, names, exact=exact, plain=plain)
    assert fast == fmt.file_stats(pf, names, exact=exact), (fast, exact)
    honest = column_stats(data)
    claims = [honest]  # and each column claimed as one value (its least), or as its range upside down
    claims += [{**honest, c: (lo, lo)} for c, (lo, hi) in honest.items() if lo is not None]
    claims += [{**honest, c: (hi, lo)} for c, (lo, hi) in honest.items() if lo != hi]
    for stats in claims:
        m = meta(rows=data.num_rows, size=len(raw), checksum=checksum_of(raw), stats=stats)
        got = file_claims(raw, m, data.schema)
        with mock.patch.object(fmt, "_plain_leaves", return_value=None):
            assert got == file_claims(raw, m, data.schema), stats
    assert (
        file_claims(raw, meta(rows=data.num_rows, size=len(raw), checksum=checksum_of(raw), stats=honest), data.schema)
        is None
    )


def test_physical_statistics_are_read_only_from_parquet_columns_pyarrow_writes_for_the_table() -> None:
    """An unsigned column's physical statistics are its values' two's complement: a file of
    uint64 (which reads as the table's int64) has its footer read as logical values, and a claim of
    the negative number its physical bytes spell is refused; so is one of another writer's types,
    and a float16 column's (2 bytes each) is read as its logical values."""
    table = pa.schema([("n", pa.int64())])
    unsigned = pa.table({"n": pa.array([2**63 + 5], pa.uint64())})
    raw = _parquet_bytes(unsigned, None)
    assert fmt._plain_leaves(fmt._Footer(raw).metadata, fmt._table_schema(table)) is None
    forged = meta(rows=1, size=len(raw), checksum=checksum_of(raw), stats={"n": (-(2**63) + 5, -(2**63) + 5)})
    got = file_claims(raw, forged, table)
    assert got is not None and got[0] == "stats.n"
    narrow = pa.table({"n": pa.array([3, 9], pa.int32())})  # another engine's int32 for the table's int64
    raw = _parquet_bytes(narrow, None)
    assert fmt._plain_leaves(fmt._Footer(raw).metadata, fmt._table_schema(table)) is None
    assert file_claims(raw, meta(rows=2, size=len(raw), checksum=checksum_of(raw), stats={"n": (3, 9)}), table) is None
    got = file_claims(raw, meta(rows=2, size=len(raw), checksum=checksum_of(raw), stats={"n": (4, 9)}), table)
    assert got is not None and got[0] == "stats.n"
    half = pa.table({"h": pa.array(np.array([0.5, 1.5], dtype=np.float16))})  # its physical values: 2 bytes
    raw = _parquet_bytes(half, None)
    assert fmt._plain_leaves(fmt._Footer(raw).metadata, fmt._table_schema(half.schema)) == {}
    for stats, ok in (({"h": (0.5, 1.5)}, True), ({"h": (0.5, 1.0)}, False)):
        m = meta(rows=2, size=len(raw), checksum=checksum_of(raw), stats=stats)
        assert (file_claims(raw, m, half.schema) is None) is ok


def test_a_string_column_that_is_not_utf8_is_refused() -> None:
    """A forged file whose string column (and its footer statistics) holds bytes that are not
    UTF-8 is refused as a file that does not decode, not with an exception from the check."""
    data = pa.table({"s": pa.array([b"a\xff", b"b"], pa.binary()).view(pa.string())})
    raw = _parquet_bytes(data, None)
    m = meta(rows=2, size=len(raw), checksum=checksum_of(raw), stats={"s": ("a", "c")})
    for decoded in (False, True):
        got = file_claims(raw, m, pa.schema([("s", pa.string())]), decoded=decoded)
        assert got is not None and got[0] == "file", got
