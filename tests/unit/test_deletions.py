"""Deletion vectors of keys tables (coordinator/core/deletions.py): on random histories of
commits (PUT, DELETE and read-lock versions over one or two parts, several versions of a key in
one commit in random ``_seq`` order), truncations (a commit that removes every part) and merges
of random source parts read at a random earlier snapshot, a read of the parts visible at any
snapshot minus their vectors at that snapshot gives exactly the rows the row-by-row fold of the
versions committed up to it gives (tests/support/keys_reference.py), for one- and two-column keys
of common types; also after the deltas below a floor were settled. Plus the cases a merge must
refuse."""

from __future__ import annotations

import datetime as dt
import decimal
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import keys_reference as ref
from support.hypo import deterministic

from coordinator.core.deletions import PartVersions, TargetVectors, decode_rows, derive, encode_rows, whole
from coordinator.core.keytables import COLS, DELETE, LOCK_STRONG, LOCK_WEAK, OP, PUT, SEQ, UPDATE, VER

FAST = deterministic(150)

KEYS = {
    "int64": (pa.int64(), [-3, 0, 1, 2, 7]),
    "string": (pa.string(), ["", "a", "ab", "é"]),
    "float64": (pa.float64(), [-1.5, 0.0, 2.25]),
    "binary": (pa.binary(), [b"", b"\x00", b"\xff"]),
    "date32": (pa.date32(), [dt.date(2020, 1, 1), dt.date(1999, 12, 31)]),
    "decimal": (pa.decimal128(9, 2), [decimal.Decimal("-1.50"), decimal.Decimal("3.25")]),
    "timestamp": (pa.timestamp("us", tz="UTC"), [dt.datetime(2021, 5, 1, tzinfo=dt.UTC)]),
}
KEY_SHAPES = [("int64",), ("string",), ("float64",), ("binary",), ("date32",), ("decimal",), ("timestamp",)]
KEY_SHAPES += [("int64", "string"), ("date32", "int64")]
# The columns a row carries besides its key: a value, and where and when it was written (copied
# by merges, so that every row a read returns names the version it is).
# ``w`` is what an UPDATE does not write: the writer fills it with the key's value (a whole row).
DATA = [("v", pa.int64()), ("src", pa.string()), ("row", pa.int64()), ("ver", pa.int64()), ("seq", pa.int64())]
DATA += [("w", pa.int64())]
WROTE = "v,src,row,ver,seq"  # an UPDATE's _cols
OPS = [PUT, PUT, PUT, UPDATE, UPDATE, DELETE, LOCK_STRONG, LOCK_WEAK]


@dataclass
class History:
    """The parts of one target and when each became visible and stopped being visible."""

    schema: pa.Schema
    primary_key: tuple[str, ...]
    vectors: TargetVectors = field(default_factory=TargetVectors)
    data: dict[str, pa.Table] = field(default_factory=dict)  # part -> rows (hidden columns too)
    born: dict[str, int] = field(default_factory=dict)
    died: dict[str, int] = field(default_factory=dict)
    truncated: list[int] = field(default_factory=list)  # CSNs of commits that removed every part
    csn: int = 0
    floor: int = 0
    lies: bool = False  # UPDATEs may carry a wrong ``w`` (a writer that lies)
    lied: int = 0
    failed: bool = False  # a claim did not hold: the replica would fold from here

    def current(self) -> dict[tuple, dict]:
        """Key -> row, as the fold reads at the last CSN before this one."""
        rows = ref.merge(self.schema, self.primary_key, self._since_cut(self.csn - 1)).to_pylist()
        return {ref.key_of(r, self.primary_key): r for r in rows}

    def _since_cut(self, snapshot: int) -> list[tuple[float, pa.Table]]:
        cut = max([t for t in self.truncated if t <= snapshot], default=0)
        return [(b, self.data[p]) for p, b in self.born.items() if not p.startswith("m") and cut <= b <= snapshot]

    def visible(self, snapshot: int) -> list[str]:
        return [p for p, b in self.born.items() if b <= snapshot and self.died.get(p, snapshot + 1) > snapshot]

    def live(self) -> list[str]:
        return [p for p in self.born if p not in self.died]

    def by_vectors(self, snapshot: int) -> list[tuple]:
        """The read the vectors give: each visible part minus its vector at ``snapshot``."""
        out = []
        for p in self.visible(snapshot):
            keep = np.ones(self.data[p].num_rows, bool)
            keep[self.vectors.dead_at(p, snapshot)] = False
            out += _tuples(self.data[p].filter(pa.array(keep)), self.schema)
        return sorted(out, key=repr)

    def by_fold(self, snapshot: int) -> list[tuple]:
        """The read the row-by-row fold gives over the versions committed up to ``snapshot``
        (the transactions' own parts, merges left out: they never change what a read returns)
        since the last truncation."""
        return sorted(
            _tuples(ref.merge(self.schema, self.primary_key, self._since_cut(snapshot)), self.schema), key=repr
        )


def claims_hold(data: dict[str, pa.Table], vectors: TargetVectors) -> bool:
    """Whether the UPDATE rows ``vectors`` took as whole since the last call are (the replica's
    check, on the parts' rows)."""
    claims = vectors.claims()
    if claims is None:
        return True
    cols = [n for n, _ in DATA]
    nulls = pa.table({n: pa.nulls(1, t) for n, t in DATA})
    updates = pa.concat_tables([data[p].slice(r, 1).select([*cols, COLS]) for p, r in zip(claims.part, claims.row)])
    bases = pa.concat_tables(
        [
            nulls if p is None else data[p].slice(r, 1).select(cols).cast(nulls.schema)
            for p, r in zip(claims.base_part, claims.base_row)
        ]
    )
    return bool(whole(updates.select(cols), bases, updates.column(COLS).to_pylist()).all())


def _tuples(t: pa.Table, schema: pa.Schema) -> list[tuple]:
    return list(zip(*(t.column(c).to_pylist() for c in schema.names))) if t.num_rows else []


@st.composite
def histories(draw: st.DrawFn, lies: bool = False) -> History:
    shape = draw(st.sampled_from(KEY_SHAPES))
    names = tuple(f"k{i}" for i in range(len(shape)))
    fields = [pa.field(n, KEYS[kind][0], nullable=False) for n, kind in zip(names, shape)]
    # bulk: how many keys a write needs to rebuild the index's base (small: both roads taken)
    vectors = TargetVectors(bulk=draw(st.sampled_from([1, 2, 3, 4096])))
    h = History(pa.schema(fields + [pa.field(n, t) for n, t in DATA]), names, vectors, lies=lies)
    pools = [KEYS[kind][1] for kind in shape]
    for _ in range(draw(st.integers(1, 12))):
        if h.failed:
            break
        step = draw(st.sampled_from(["commit", "commit", "commit", "merge", "merge", "truncate", "settle"]))
        h.csn += 1
        if step == "merge":
            _merge(draw, h)
        elif step == "settle":
            h.floor = draw(st.integers(h.floor, h.csn - 1))
            h.vectors.settle(h.floor)
        else:
            _commit(draw, h, pools, truncating=step == "truncate")
    return h


def _commit(draw: st.DrawFn, h: History, pools: list[list], truncating: bool) -> None:
    """A transaction's commit of one or two parts; ``truncating``: one that also removes every
    part (an overwrite of the whole target)."""
    removed = h.live() if truncating else []
    if truncating:
        h.truncated.append(h.csn)
    rows = draw(st.lists(st.tuples(*(st.sampled_from(p) for p in pools), st.sampled_from(OPS)), min_size=1, max_size=7))
    seqs = draw(st.permutations(range(len(rows))))
    cut = draw(st.integers(0, len(rows)))
    for i, chunk in enumerate((rows[:cut], rows[cut:])):
        if not chunk:
            continue
        name = f"c{h.csn}p{i}"
        first = 0 if i == 0 else cut
        cols = {k: [r[j] for r in chunk] for j, k in enumerate(h.primary_key)}
        cols |= {
            "v": [draw(st.integers(0, 99)) for _ in chunk],
            "src": [name] * len(chunk),
            "row": list(range(len(chunk))),
            "ver": [h.csn] * len(chunk),
            "seq": list(seqs[first : first + len(chunk)]),
            "w": [draw(st.integers(0, 9)) for _ in chunk],
            OP: [r[-1] for r in chunk],
            SEQ: list(seqs[first : first + len(chunk)]),
            COLS: [WROTE if r[-1] == UPDATE else None for r in chunk],
        }
        schema = h.schema.append(pa.field(OP, pa.int8())).append(pa.field(SEQ, pa.int64()))
        h.data[name] = pa.table(cols, schema=schema.append(pa.field(COLS, pa.string())))
        h.born[name] = h.csn
    _fill_updates(draw, h, [f"c{h.csn}p{i}" for i in (0, 1) if f"c{h.csn}p{i}" in h.data], truncating)
    added = [PartVersions.of(p, h.data[p], h.primary_key) for p in (f"c{h.csn}p0", f"c{h.csn}p1") if p in h.data]
    h.vectors.commit(h.csn, added, removed)
    h.died |= {p: h.csn for p in removed}
    h.failed = not claims_hold(h.data, h.vectors)


def _fill_updates(draw: st.DrawFn, h: History, names: list[str], truncating: bool) -> None:
    """Fill each UPDATE's ``w`` as a writer does (the key's value before it, in ``_seq`` order
    over the commit's versions; null where the key has no row); a lying one adds 1000."""
    current: dict[tuple, dict | None] = {} if truncating else dict(h.current())
    rows = sorted(((r[SEQ], n, i, r) for n in names for i, r in enumerate(h.data[n].to_pylist())), key=lambda t: t[0])
    fills: dict[str, list] = {n: h.data[n].column("w").to_pylist() for n in names}
    for _, n, i, r in rows:
        if r[OP] == UPDATE:
            before = current.get(ref.key_of(r, h.primary_key))
            fills[n][i] = r["w"] = None if before is None else before["w"]
            if h.lies and draw(st.integers(0, 3)) == 0:
                fills[n][i] = r["w"] = (r["w"] or 0) + 1000
                h.lied += 1
        ref.apply_version(current, r, h.schema.names, h.primary_key)
    for n in names:
        i = h.data[n].schema.get_field_index("w")
        h.data[n] = h.data[n].set_column(i, h.data[n].schema.field(i), pa.array(fills[n], pa.int64()))


def _merge(draw: st.DrawFn, h: History) -> None:
    """A merge of live parts read at an earlier snapshot at which they all were visible."""
    snapshot = draw(st.integers(h.floor, h.csn - 1))
    candidates = [p for p in h.live() if h.born[p] <= snapshot]  # commits after the snapshot race the merge
    if not candidates:
        return
    sources = draw(st.lists(st.sampled_from(candidates), unique=True, min_size=1))
    rows = []
    for p in sources:
        keep = np.ones(h.data[p].num_rows, bool)
        keep[h.vectors.dead_at(p, snapshot)] = False
        rows.append(h.data[p].filter(pa.array(keep)).select(h.schema.names))
    out = pa.concat_tables(rows).cast(h.schema)
    out = out.append_column(OP, pa.array([PUT] * out.num_rows, pa.int8()))
    out = out.append_column(SEQ, out.column("seq")).append_column(VER, out.column("ver"))
    out = out.take(pa.array(draw(st.permutations(range(out.num_rows))), pa.int64()))  # any row order
    name = f"m{h.csn}"
    h.vectors.merge(h.csn, PartVersions.of(name, out, h.primary_key), sources, snapshot)
    h.data[name] = out
    h.born[name] = h.csn
    h.died |= {p: h.csn for p in sources}


@FAST
@given(histories())
def test_parts_minus_vectors_read_as_the_fold_at_every_snapshot(h: History) -> None:
    assert not h.failed, "an UPDATE written whole was not taken as whole"
    for snapshot in range(h.floor, h.csn + 1):
        assert h.by_vectors(snapshot) == h.by_fold(snapshot), f"at snapshot {snapshot}"


@FAST
@given(histories(lies=True))
def test_an_update_that_lies_about_what_it_did_not_write_is_caught(h: History) -> None:
    """UPDATEs whose unwritten column is wrong (a writer that lies): while every claim holds,
    reads by vectors are the fold (no lie that matters got through); a claim fails only when a
    lie was told."""
    assert not h.failed or h.lied, "a claim failed although every UPDATE was whole"
    if not h.failed:
        for snapshot in range(h.floor, h.csn + 1):
            assert h.by_vectors(snapshot) == h.by_fold(snapshot), f"at snapshot {snapshot}"


@FAST
@given(histories())
def test_a_part_holds_one_delta_per_commit_above_the_floor(h: History) -> None:
    for p in h.data:
        csns = [c for c, _ in h.vectors.deltas(p)]
        assert csns == sorted(set(csns))
        assert sum(c <= h.floor for c in csns) <= 1


def _part(name: str, keys: list[int], ops: list[int] | None = None) -> PartVersions:
    return PartVersions(name, np.array(keys), np.array(ops or [PUT] * len(keys)), np.arange(len(keys)))


def test_upserts_mark_the_row_they_supersede_at_their_csn() -> None:
    v = TargetVectors()
    assert v.commit(1, [_part("a", [1, 2, 3])]) == {}
    got = v.commit(2, [_part("b", [2, 9])])
    assert {p: r.tolist() for p, r in got.items()} == {"a": [1]}
    got = v.commit(3, [_part("c", [9, 3, 3], [DELETE, PUT, DELETE])])
    assert {p: r.tolist() for p, r in got.items()} == {"a": [2], "b": [1], "c": [0, 1, 2]}
    assert v.dead_at("a", 1).tolist() == [] and v.dead_at("a", 2).tolist() == [1]
    assert v.dead_at("a", 3).tolist() == [1, 2]


def test_a_merge_marks_the_keys_superseded_after_its_snapshot() -> None:
    v = TargetVectors()
    v.commit(1, [_part("a", [1, 2])])
    v.commit(2, [_part("b", [3])])
    v.commit(3, [_part("c", [1])])  # after the merge's snapshot 2: supersedes a's key 1
    got = v.merge(4, PartVersions("m", np.array([3, 2, 1]), np.zeros(3, np.int8), np.arange(3)), ["a", "b"], 2)
    assert {p: r.tolist() for p, r in got.items()} == {"m": [2]}  # key 1, the output's row 2
    v.commit(5, [_part("d", [2])])
    assert v.dead_at("m", 5).tolist() == [1, 2]
    assert v.dead_at("c", 5).tolist() == []


@pytest.mark.parametrize(
    ("keys", "why"),
    [([1, 2, 3], "a key its sources did not hold live"), ([1], "a key left out"), ([1, 1, 2], "a key twice")],
)
def test_a_merge_that_read_something_else_is_refused(keys: list[int], why: str) -> None:
    v = TargetVectors()
    v.commit(1, [_part("a", [1, 2])])
    with pytest.raises(ValueError, match="does not hold exactly"):
        v.merge(2, _part("m", keys), ["a"], 1)
    assert "m" not in v and v.commit(3, [_part("b", [1])])["a"].tolist() == [0], why


def test_a_merge_output_with_a_row_that_is_not_whole_is_refused() -> None:
    """An UPDATE in a merge's output (a run of updates folded onto a base the merge did not
    read) is not a live row whole: refused, so the replica derives the vectors again (and folds)."""
    v = TargetVectors()
    v.commit(1, [_part("a", [1, 2])])
    with pytest.raises(ValueError, match="not whole"):
        v.merge(2, _part("m", [1, 2], [PUT, UPDATE]), ["a"], 1)
    assert "m" not in v and v.dead_at("a", 2).tolist() == []


def test_a_merge_that_read_its_sources_before_the_vectors_were_derived_is_refused() -> None:
    """Vectors derived at 10 mark a's superseded key 8 dead at 10; a merge of a and b that read
    them at 7 and holds b's key 8 would, by the merge rule, take key 8 for superseded after 7 and
    mark the output's live row dead (a key read as missing: the chaos campaign's si-read). It is
    refused: the caller derives again."""
    v = derive(10, [(1, _part("a", [8, 9])), (5, _part("b", [8]))])
    with pytest.raises(ValueError, match="before the vectors"):
        v.merge(11, PartVersions("m", np.array([8, 9]), np.zeros(2, np.int8), np.arange(2)), ["a", "b"], 7)
    assert "m" not in v


def test_the_index_holds_one_entry_per_live_row() -> None:
    """Deleted keys and the keys of removed parts leave the index when it is rebuilt: its size
    follows the live rows, not the rows ever written."""
    v = TargetVectors(bulk=100)
    v.commit(1, [_part("a", list(range(1000)))])
    v.commit(2, [_part("b", list(range(0, 1000, 2)), [DELETE] * 500)])
    v.commit(3, [_part("c", list(range(5000, 5100)))])  # a bulk write: the base rebuilt
    assert len(v) == 600
    v.commit(4, [_part("d", list(range(9000, 9200)))], removed=["a", "c"])
    assert len(v) == 200
    v.forget("a")
    assert "a" not in v and v.commit(5, [_part("e", [1])]) == {}


# -- from scratch: derive() over parts a fold-world history left -------------------------------


def _fold_merge(draw: st.DrawFn, h: History) -> None:
    """A compaction as the fold world writes it (tests/support/keys_reference.py ``fold``): runs
    of versions folded, each keeping its version in ``_ver``, DELETEs kept while an older version
    of their key is elsewhere, several versions of a key possible."""
    live = h.live()
    if not live:
        return
    sources = draw(st.lists(st.sampled_from(live), unique=True, min_size=1))
    others: dict[tuple, list] = {}
    for p in live:
        if p not in sources:
            for key, vs in ref.row_versions(h.data[p], h.born[p], h.primary_key).items():
                others.setdefault(key, []).extend(vs)
    out = ref.fold(h.schema, h.primary_key, [(h.born[p], h.data[p]) for p in sources], others)
    name = f"m{h.csn}"
    h.data[name], h.born[name] = out, h.csn
    h.died |= {p: h.csn for p in sources}


@st.composite
def fold_histories(draw: st.DrawFn) -> History:
    shape = draw(st.sampled_from(KEY_SHAPES))
    names = tuple(f"k{i}" for i in range(len(shape)))
    fields = [pa.field(n, KEYS[kind][0], nullable=False) for n, kind in zip(names, shape)]
    h = History(pa.schema(fields + [pa.field(n, t) for n, t in DATA]), names)
    pools = [KEYS[kind][1] for kind in shape]
    for _ in range(draw(st.integers(1, 12))):
        h.csn += 1
        if draw(st.integers(0, 2)) == 0:
            _fold_merge(draw, h)
        else:
            _commit(draw, h, pools, truncating=False)
    return h


def _read(h: History, vectors: TargetVectors, snapshot: int) -> list[tuple]:
    out = []
    for p in h.visible(snapshot):
        keep = np.ones(h.data[p].num_rows, bool)
        keep[vectors.dead_at(p, snapshot)] = False
        out += _tuples(h.data[p].filter(pa.array(keep)), h.schema)
    return sorted(out, key=repr)


@FAST
@given(fold_histories(), st.data())
def test_vectors_derived_from_scratch_then_followed_read_as_the_fold(h: History, data: st.DataObject) -> None:
    """At any snapshot of a history whose compactions folded versions (the layout tables have
    today), the vectors derived from the parts visible then, and followed commit by commit
    afterwards, give what the fold of the same parts gives."""
    start = data.draw(st.integers(0, h.csn))
    vectors = derive(start, [(h.born[p], PartVersions.of(p, h.data[p], h.primary_key)) for p in h.visible(start)])
    assert claims_hold(h.data, vectors), "an UPDATE written whole was not taken as whole"
    want = sorted(
        _tuples(ref.merge(h.schema, h.primary_key, [(h.born[p], h.data[p]) for p in h.visible(start)]), h.schema),
        key=repr,
    )
    assert _read(h, vectors, start) == want
    for csn in range(start + 1, h.csn + 1):
        if any(p.startswith("m") and b == csn for p, b in h.born.items()):
            return  # a fold-world compaction: vectors are derived again (the replica does so)
        added = [PartVersions.of(p, h.data[p], h.primary_key) for p, b in h.born.items() if b == csn]
        vectors.commit(csn, added)
        assert claims_hold(h.data, vectors), f"at {csn}: an UPDATE written whole was not taken as whole"
        want = sorted(
            _tuples(ref.merge(h.schema, h.primary_key, [(h.born[p], h.data[p]) for p in h.visible(csn)]), h.schema),
            key=repr,
        )
        assert _read(h, vectors, csn) == want, f"at {csn}, followed from {start}"


def _claimed(v: TargetVectors) -> list[tuple]:
    c = v.claims()
    return [] if c is None else list(zip(c.part.tolist(), c.row.tolist(), c.base_part.tolist(), c.base_row.tolist()))


def test_an_update_is_claimed_beside_the_row_it_updates() -> None:
    v = derive(3, [(1, _part("a", [1, 2])), (2, _part("b", [2], [UPDATE]))])
    assert _claimed(v) == [("b", 0, "a", 1)] and v.dead_at("a", 3).tolist() == [1]
    assert _claimed(v) == []  # each claim is handed over once
    v = derive(2, [(1, _part("a", [1, 2])), (2, _part("b", [2], [UPDATE])), (2, _part("c", [2]))])
    assert _claimed(v) == []  # the UPDATE is superseded by a PUT: nothing builds on it
    v.commit(3, [_part("d", [1, 1, 2, 5], [UPDATE, UPDATE, DELETE, UPDATE])])
    # key 1: two UPDATEs, the first on a's row, the second on the first; key 5 had no row
    assert sorted(_claimed(v), key=repr) == [("d", 0, "a", 0), ("d", 1, "d", 0), ("d", 3, None, -1)]
    v.commit(4, [_part("e", [2], [UPDATE])])
    assert _claimed(v) == [("e", 0, None, -1)]  # key 2 was deleted at 3
    with pytest.raises(KeyError):
        v.dead_at("a", 1)  # below the snapshot it was derived at


@pytest.mark.parametrize(
    ("update", "base", "ok"),
    [
        ({"v": 1, "w": 5}, {"v": 0, "w": 5}, True),
        ({"v": 1, "w": 6}, {"v": 0, "w": 5}, False),
        ({"v": 1, "w": None}, {"v": None, "w": None}, True),
        ({"v": 1, "w": 5}, {"v": None, "w": None}, False),
        ({"v": 1, "w": float("nan")}, {"v": 0, "w": float("nan")}, False),
    ],
)
def test_whole_compares_the_columns_an_update_did_not_write(update: dict, base: dict, ok: bool) -> None:
    schema = pa.schema([("v", pa.int64()), ("w", pa.float64())])
    got = whole(pa.Table.from_pylist([update], schema), pa.Table.from_pylist([base], schema), ["v"])
    assert got.tolist() == [ok]
    assert whole(pa.Table.from_pylist([update], schema), pa.Table.from_pylist([base], schema), ["v,w"]).tolist() == [
        True
    ]


@pytest.mark.parametrize("rows", [[], [0], [1, 5, 9], list(range(0, 70_000, 3))])
def test_rows_cross_the_wire_as_they_were(rows: list[int]) -> None:
    n = (rows[-1] + 1) if rows else 0
    assert decode_rows(encode_rows(np.array(rows, np.int64)), n).tolist() == rows


@pytest.mark.parametrize(
    ("text", "rows", "why"),
    [
        (encode_rows(np.array([0, 3])), 3, "names row 3 of a part of 3 rows"),
        ("!!", 5, "does not decode"),
        ("AAAA", 5, "does not decode"),
        (7, 5, "must be a base64 string"),
        ("A" * 200, 5, "must be a base64 string of at most 104"),
    ],
)
def test_a_vector_that_is_not_one_is_refused(text: object, rows: int, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        decode_rows(text, rows)
