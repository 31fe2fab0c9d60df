"""Keys tables (docs/rules.md#keys-tables): the pure rules, no I/O.

A ``keys`` table has a primary key; each write is a *version* of the rows it names. A part of
such a table holds the key columns, every other column (nullable there: a delete or an update
leaves some unset) and three hidden columns:

* ``_op``: :data:`PUT` (overwrite mode: ``tx.insert``, ``tx.upsert(update=False)``; absent
  columns are null), :data:`UPDATE` (``tx.upsert(update=True)``: only the columns named in
  ``_cols`` change), :data:`DELETE`, or a read lock (``tx.lock_keys``: :data:`LOCK_STRONG`,
  :data:`LOCK_WEAK`), which reads skip;
* ``_seq``: the order of the version within its transaction (later writes win);
* ``_cols``: for an update, the written non-key columns, comma-separated.

A compaction's output part has a fourth, ``_ver``: each row's *version*, the CSN of the commit
that wrote it (a part written by a transaction has none: its rows' version is the part's
creation CSN). Reads fold versions per key (:func:`coordinator.core.keyfold.merge`) in (version,
``_seq``) order; a transaction's own parts come after everything committed.

Compaction (:func:`coordinator.core.keyfold.fold`) replaces the versions of its source parts by fewer
versions that every read seeing the output folds to the same rows. A folded row keeps the version
of the last one it replaces, so it sorts exactly where that one did: a part written between two
sources' commits, or after the sources but before the compaction committed, keeps its place in the
order (the compaction's own CSN orders nothing). Only versions with no version of another part
between them are folded together (a run); a run of UPDATEs stays an UPDATE (the base may be in a
part the compaction did not read), and a DELETE is dropped only when no older version of its key
exists in any part. Read locks are dropped: a compaction's output is never a key write
(:func:`folded`; replicas/keylocks.py skips it), and the parts it replaced stay in storage while a
transaction whose snapshot precedes them runs (replicas/cleanup.py), so the commit-time key check
still reads them.
"""

from __future__ import annotations

import base64
import bisect
import functools
import hashlib
import itertools
import struct
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import pyarrow as pa

from coordinator.core.errors import InvalidInput, quote
from coordinator.core.tabledata import TypeKind, of_kinds

PUT, UPDATE, DELETE = 0, 1, 2
LOCK_STRONG, LOCK_WEAK = 3, 4  # tx.lock_keys: read locks, never rows
LOCK_MODES = {"shared_strong": LOCK_STRONG, "shared_weak": LOCK_WEAK}
OP, SEQ, COLS, VER = "_op", "_seq", "_cols", "_ver"
HIDDEN = (OP, SEQ, COLS, VER)
ATOMICITY = ("full", "none")
OWN = float("inf")  # the order of a transaction's own (uncommitted) parts


def check_definition(
    name: str,
    schema: pa.Schema,
    partition_by: Sequence[str],
    primary_key: Sequence[str],
    policy: str,
    lock_groups: Mapping[str, Sequence[str]] | None,
    atomicity: str,
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Validate what a ``keys`` table adds to CREATE TABLE (the schema and column names are
    checked before); returns the lock groups as sorted ``(group, columns)`` pairs. Every
    problem is InvalidInput naming it."""
    where = f"create table {quote(name)}"
    if policy != "keys":
        _check_other_policy(where, name, policy, lock_groups, atomicity)
        return ()
    if atomicity not in ATOMICITY:
        raise InvalidInput(f"{where}: atomicity must be 'full' or 'none', not {quote(atomicity)}", table=name)
    if not primary_key:
        raise InvalidInput(f"{where}: conflict_policy='keys' needs a primary_key", table=name)
    problems = _column_problems(schema, partition_by, primary_key)
    if lock_groups is not None and not isinstance(lock_groups, Mapping):
        problems.append(f"lock_groups must map a group name to column names, not {type(lock_groups).__name__}")
        lock_groups = None
    groups = _lock_groups(schema, primary_key, lock_groups or {}, problems)
    if problems:
        raise InvalidInput(f"{where}: {'; '.join(problems)}", table=name)
    return tuple(sorted(groups))


def _check_other_policy(
    where: str, name: str, policy: str, lock_groups: Mapping[str, Sequence[str]] | None, atomicity: str
) -> None:
    """A table under another conflict policy takes neither lock groups nor a partial atomicity."""
    if lock_groups:
        raise InvalidInput(f"{where}: lock_groups need conflict_policy='keys' (not {quote(policy)})", table=name)
    if atomicity != "full":
        raise InvalidInput(
            f"{where}: atomicity={quote(atomicity)} needs conflict_policy='keys' (not {quote(policy)})", table=name
        )


def _column_problems(schema: pa.Schema, partition_by: Sequence[str], primary_key: Sequence[str]) -> list[str]:
    """What is wrong with a keys table's columns: reserved names, a nullable key column, a
    partition column outside the key."""
    problems = []
    hidden = [c for c in schema.names if c in HIDDEN]
    if hidden:
        problems.append(f"column name(s) {hidden} are reserved in a keys table")
    nullable = [c for c in primary_key if schema.field(c).nullable]
    if nullable:
        problems.append(
            f"primary key column(s) {nullable} must be declared not null (pyarrow.field(..., nullable=False))"
        )
    outside = [c for c in partition_by if c not in primary_key]
    if outside:
        problems.append(f"partition column(s) {outside} must be primary key columns (a key lives in one partition)")
    return problems


def _lock_groups(
    schema: pa.Schema, primary_key: Sequence[str], lock_groups: Mapping[str, Sequence[str]], problems: list[str]
) -> list[tuple[str, tuple[str, ...]]]:
    """The lock groups as ``(group, columns)`` pairs; what is wrong with them is added to
    ``problems`` (a group with a bad name or no list of columns is left out)."""
    groups: list[tuple[str, tuple[str, ...]]] = []
    owner: dict[str, str] = {}
    for group, cols in lock_groups.items():
        if not isinstance(group, str) or not group.isidentifier():
            problems.append(f"lock group name {quote(group)} is not an identifier")
            continue
        if isinstance(cols, str) or not isinstance(cols, Iterable):
            problems.append(f"lock group {quote(group)} must list column names, not {quote(cols)}")
            continue
        columns = tuple(cols)
        if not columns:
            problems.append(f"lock group {quote(group)} has no columns")
        for c in columns:
            problem = _lock_column_problem(schema, primary_key, owner, group, c)
            if problem:
                problems.append(problem)
            else:
                owner[c] = group
        groups.append((group, columns))
    return groups


def _lock_column_problem(
    schema: pa.Schema, primary_key: Sequence[str], owner: Mapping[str, str], group: str, c: str
) -> str | None:
    """What is wrong with column ``c`` in lock group ``group`` (``owner``: the group each column
    already seen is in); None when nothing is."""
    if c not in schema.names:
        return f"lock group {quote(group)}: unknown column {quote(c)}"
    if c in primary_key:
        return f"lock group {quote(group)}: {quote(c)} is a primary key column (keys are under every lock)"
    if c in owner:
        return f"column {quote(c)} is in lock groups {quote(owner[c])} and {quote(group)} (at most one)"
    return None


# -- writes ------------------------------------------------------------------------------------
def file_schema(schema: pa.Schema, primary_key: Sequence[str]) -> pa.Schema:
    """The schema of a keys table's part: key columns as declared, the others nullable, then
    the hidden columns."""
    fields = [f if f.name in primary_key else f.with_nullable(True) for f in schema]
    return pa.schema(
        fields + [pa.field(OP, pa.int8(), False), pa.field(SEQ, pa.int64(), False), pa.field(COLS, pa.string())]
    )


def versions(
    schema: pa.Schema,
    primary_key: Sequence[str],
    table: str,
    data: pa.Table,
    op: int,
    seq: int,
    written: Sequence[str] | None = None,
) -> pa.Table:
    """Rows ``data`` written as versions of ``op`` (PUT, UPDATE or DELETE) in a part's layout,
    their ``_seq`` from ``seq`` on in row order. ``data`` holds the key columns and, for PUT and
    UPDATE, any of the others (all under DELETE are ignored but keys); InvalidInput names what
    is wrong (unknown or missing key columns, a null key, wrong types, and for UPDATE an absent
    non-nullable column). An UPDATE's ``_cols`` names the non-key columns of ``data``, or those
    of ``written`` (``data`` then holds the others' current values: a whole row)."""
    what = {PUT: "write", UPDATE: "update", DELETE: "delete", LOCK_STRONG: "lock", LOCK_WEAK: "lock"}[op]
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if not isinstance(data, pa.Table):
        raise InvalidInput(
            f"{what} {quote(table)}: data must be a pyarrow.Table, got {type(data).__name__}", table=table
        )
    names = data.column_names
    problems = []
    unknown = [n for n in names if n not in schema.names]
    if unknown:
        problems.append(f"unknown column(s) {quote(unknown)}")
    missing = [k for k in primary_key if k not in names]
    if missing:
        problems.append(f"missing primary key column(s) {quote(missing)}")
    if op in (DELETE, LOCK_STRONG, LOCK_WEAK):
        names = [n for n in names if n in primary_key]
    elif op == UPDATE:
        absent = [f.name for f in schema if f.name not in names and not f.nullable and f.name not in primary_key]
        if absent:
            problems.append(f"update mode leaves non-nullable column(s) {absent} unset: write them too")
    if problems:
        raise InvalidInput(f"{what} {quote(table)}: {'; '.join(problems)}", table=table)
    for k in primary_key:
        if data.column(k).null_count:
            raise InvalidInput(f"{what} {quote(table)}: primary key column {quote(k)} has nulls", table=table)
    from coordinator.core.tabledata import (
        conform,  # types and losslessness as every write checks them
    )

    present = pa.schema([schema.field(n) for n in schema.names if n in names])
    data = conform(present, data.select([n for n in present.names]), table, what=what)
    n = data.num_rows
    out = file_schema(schema, primary_key)
    cols = [data.column(f.name) if f.name in present.names else pa.nulls(n, f.type) for f in schema]
    wrote = [c for c in present.names if c not in primary_key and (written is None or c in written)]
    cols += [
        pa.array([op] * n, pa.int8()),
        pa.array(range(seq, seq + n), pa.int64()),
        pa.array([",".join(wrote) if op == UPDATE else None] * n, pa.string()),
    ]
    return pa.Table.from_arrays(cols, schema=out)


def written_columns(versions: pa.Table) -> list[str]:
    """The columns an UPDATE's versions (of one write: one ``_cols``) wrote."""
    text = versions.column(COLS)[0].as_py() if versions.num_rows else None
    return text.split(",") if text else []


def keys_where(primary_key: Sequence[str], schema: pa.Schema, keys: pa.Table, limit: int = 1024) -> Any:
    """A filter of exactly the keys of ``keys`` (key columns) when they are at most ``limit``:
    an OR (a balanced tree) of ``key == value`` terms, which a read serves as a point read;
    else :func:`keys_filter`'s ``isin`` per column (at least those keys)."""
    import pyarrow.compute as pc

    distinct = sorted(set(zip(*[keys.column(k).to_pylist() for k in primary_key])), key=repr)
    if len(distinct) > limit:
        return keys_filter(primary_key, schema, keys)
    terms = [
        functools.reduce(lambda a, b: a & b, [pc.field(c) == v for c, v in zip(primary_key, key)]) for key in distinct
    ]
    while len(terms) > 1:
        terms = [terms[i] | terms[i + 1] if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    return terms[0] if terms else None


def fill_columns(versions: pa.Table, current: pa.Table, primary_key: Sequence[str], columns: Sequence[str]) -> pa.Table:
    """``versions`` with ``columns`` set to the values of the row of ``current`` with the same
    key (null where ``current`` has none): an update-mode write made whole."""
    at = _rows_of_same_key(versions, current, primary_key)
    for c in columns:
        i = versions.schema.get_field_index(c)
        values = current.column(c).take(at).cast(versions.schema.field(i).type)
        versions = versions.set_column(i, versions.schema.field(i), values)
    return versions


def _rows_of_same_key(versions: pa.Table, current: pa.Table, primary_key: Sequence[str]) -> pa.Array | pa.ChunkedArray:
    """For each row of ``versions``, the index of the row of ``current`` (distinct keys) with
    its key, null where none has: by ``index_in`` for one integer, string or binary key column
    (no Acero plan, whose fixed cost is most of a small update's), else by a left outer join."""
    import pyarrow.compute as pc

    if len(primary_key) == 1:
        key = current.schema.field(primary_key[0]).type
        if pa.types.is_integer(key) or pa.types.is_string(key) or pa.types.is_binary(key):
            value_set = current.column(primary_key[0]).combine_chunks()
            return pc.index_in(versions.column(primary_key[0]).cast(key), value_set=value_set)
    n, m = versions.num_rows, current.num_rows
    left = versions.select(list(primary_key)).append_column("__row", pa.array(range(n), pa.int64()))
    right = current.select(list(primary_key)).append_column("__at", pa.array(range(m), pa.int64()))
    return left.join(right, keys=list(primary_key), join_type="left outer").sort_by("__row").column("__at")


# -- compaction (the folds of reads, compaction and changes: coordinator/core/keyfold.py) ------------
def folded_schema(schema: pa.Schema, primary_key: Sequence[str]) -> pa.Schema:
    """The layout of a compaction's output part: a written part's plus ``_ver``."""
    return file_schema(schema, primary_key).append(pa.field(VER, pa.int64(), False))


def folded(meta: Any) -> bool:
    """Whether a part (its :class:`~parts.model.meta.PartMeta`) is a compaction's output, told from its
    metadata alone: its column statistics name every column of the file, and only a compaction
    writes ``_ver``. Such a part writes no key (its versions were written, and checked, before)."""
    return VER in meta.stats


# -- locks -------------------------------------------------------------------------------------
# A lock is a lock group's name or PRIMARY. Writing a key takes the locks of the columns it
# writes: every lock in overwrite mode, the groups of the written columns in update mode (a
# column in no group is under PRIMARY), PRIMARY for a delete. PRIMARY overlaps every lock.
# A read lock (STRONG, WEAK) collides with any write of the key by the other side; a strong one
# committed also makes later writers fail, a weak one leaves nothing (docs/rules.md#locks). Read locks
# never collide with each other.
PRIMARY = "@primary"  # no group is named so (groups are identifiers)
STRONG, WEAK = "@read:strong", "@read:weak"
READS = frozenset({STRONG, WEAK})
KeyLocks = dict[tuple[Any, ...], frozenset[str]]  # key -> the locks written under it


def locks(op: int, written: Iterable[str], lock_groups: Sequence[tuple[str, Sequence[str]]]) -> frozenset[str]:
    """The locks a version of ``op`` takes; ``written``: an update's non-key columns."""
    if op == PUT:
        return frozenset([PRIMARY, *(g for g, _ in lock_groups)])
    if op == DELETE:
        return frozenset([PRIMARY])
    if op == LOCK_STRONG:
        return frozenset([STRONG])
    if op == LOCK_WEAK:
        return frozenset([WEAK])
    group_of = {c: g for g, cols in lock_groups for c in cols}
    return frozenset(group_of.get(c, PRIMARY) for c in written) or frozenset([PRIMARY])


def overlap(a: frozenset[str], b: frozenset[str]) -> bool:
    """Whether two sets of locks on one key collide."""
    return bool(a and b) and (bool(a & b) or PRIMARY in a or PRIMARY in b)


def written_locks(
    data: pa.Table, primary_key: Sequence[str], lock_groups: Sequence[tuple[str, Sequence[str]]]
) -> KeyLocks:
    """Key -> locks for the versions of a part (its key columns, ``_op`` and ``_cols``)."""
    out: dict[tuple[Any, ...], frozenset[str]] = {}
    cache: dict[tuple[int, str | None], frozenset[str]] = {}
    cols = [data.column(k).to_pylist() for k in primary_key]
    for i, (op, written) in enumerate(zip(data.column(OP).to_pylist(), data.column(COLS).to_pylist())):
        held = cache.get((op, written))
        if held is None:
            held = cache[(op, written)] = locks(op, (written or "").split(",") if written else (), lock_groups)
        key = tuple(c[i] for c in cols)
        out[key] = out.get(key, frozenset()) | held
    return out


def collide(mine: frozenset[str], theirs: frozenset[str]) -> bool:
    """Whether a committing transaction holding ``mine`` on a key loses to one that committed
    after its snapshot holding ``theirs`` there."""
    mw, tw = mine - READS, theirs - READS
    return overlap(mw, tw) or (bool(mw) and STRONG in theirs) or (bool(tw) and bool(mine & READS))


def first_collision(mine: KeyLocks, theirs: KeyLocks) -> tuple[Any, ...] | None:
    """A key (the least) on which ``mine`` collides with ``theirs`` (:func:`collide`), or None."""
    both = [k for k in mine.keys() & theirs.keys() if collide(mine[k], theirs[k])]
    return min(both, key=lambda k: tuple((v is None, v) for v in k)) if both else None


def why(mine: frozenset[str], theirs: frozenset[str]) -> str:
    """How two lock sets on a key collide (:func:`collide`), for the loser's message."""
    mw, tw = mine - READS, theirs - READS
    if overlap(mw, tw):
        return "wrote it under an overlapping lock"
    if mw and STRONG in theirs:
        return "held a strong read lock on it"
    return "wrote it while this transaction held a read lock on it"


# -- changes -----------------------------------------------------------------------------------
def changes_schema(schema: pa.Schema) -> pa.Schema:
    return schema.append(pa.field("_change", pa.string())).append(pa.field("_csn", pa.int64()))


def keys_filter(primary_key: Sequence[str], schema: pa.Schema, rows: pa.Table) -> Any:
    """A filter matching (at least) the keys of ``rows``: ``isin`` per key column."""
    import pyarrow.compute as pc

    expr = None
    for k in primary_key:
        values = pa.array(sorted(set(rows.column(k).to_pylist()), key=lambda v: (v is None, v)), schema.field(k).type)
        term = pc.field(k).isin(values)
        expr = term if expr is None else expr & term
    return expr


# -- key summaries: which keys a part may hold, without reading it ------------------------------
# A keys-table part records, in its metadata (PartMeta.key_summary), the least and greatest key
# it holds (when every key column is an int, a string or a bool: JSON scalars that order as
# Arrow orders them) and a Bloom filter over its keys. The filter is fixed and documented, so
# that every process, now and later, probes what another wrote:
#
# * a key (a tuple of Python values, one per primary key column, as ``to_pylist`` gives them)
#   is encoded by :func:`encode_key`: per value a one-byte type tag, a 4-byte big-endian length
#   and the payload (ints in decimal, strings in UTF-8, floats as IEEE big-endian with -0.0 as
#   0.0, other types as their ``repr``);
# * h1, h2 = the two little-endian unsigned 64-bit halves of blake2b (16-byte digest) of that,
#   h2 forced odd; the filter of ``m`` bits sets bit ``(h1 + i*h2) mod m`` for i < ``k``
#   (bit b is bit ``b % 8`` of byte ``b // 8``). Never Python's ``hash()``: it is salted per
#   process.
#
# That is hash scheme ``"blake2b"`` (:data:`HASH_BLAKE2B`), a summary with no ``"hash"`` field
# (every part written before the ``mix64`` scheme). It costs a Python call per key, 10 s of a 1M-row
# compaction, so a part whose key columns are all ints, bools, strings or binaries is now
# summarized with scheme ``"mix64"`` (:data:`HASH_MIX64`, the summary says ``"hash": "mix64"``),
# computed over whole columns with Arrow kernels (:func:`column_hashes`), with the same bits
# from (h1, h2), that filter under ``"filter"`` (see :data:`_LEGACY_ONES`); a probe hashes the
# key with the scheme of the part it probes. All arithmetic
# is modulo 2**64; ``mix(z)`` is splitmix64's finalizer (z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
# z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31); G = 0x9E3779B97F4A7C15:
#
# * a value's hash: an int (or bool as 0/1) v: ``mix(v mod 2**64 ^ T_INT)``; a string (UTF-8)
#   or binary of bytes b_0..b_{n-1}: ``mix((S + n*G) ^ T_BYTES)``, S the sum of
#   ``mix((b_j | j << 8) + G)``;
# * a key's: h = G, then per value ``h = mix(h*G + value hash)``; h1 = ``mix(h ^ T_H1)``,
#   h2 = ``mix(h ^ T_H2) | 1``.
#
# ``m`` is BITS_PER_KEY bits per distinct key (at least MIN_FILTER_BITS, at most
# MAX_FILTER_BITS, a multiple of 8) and k = HASHES: about 0.0017% false positives in theory up to
# MAX_FILTER_BITS / BITS_PER_KEY (21,845) keys per part, more beyond (a bigger part is still pruned by
# its range), more in practice for small filters (see MIN_FILTER_BITS). A filter never says "absent"
# for a key the part holds; "present" is only a maybe, so every user verifies candidates.
# (16 bits a key until 2026-11-28: 0.046%, so a point read of a table in 1,000 parts read about
# half a part too many, each a Parquet footer and row group decoded for nothing. A probe reads
# ``m`` and ``k`` from the summary: parts written with either size are probed alike.)
BITS_PER_KEY = 24
HASHES = 11
MAX_FILTER_BITS = 1 << 19  # 64 KiB: a log entry carries it
# A small part's filter is MIN_FILTER_BITS: measured ~0.1 % false positives for a 10-key commit
# (the probe sequences h1 + i*h2 of 256 bits overlap far more than independent bits would; 0.006 %
# at 1,000 keys, 0.0025 % at 5,000: tests of 20,000 absent keys, 2026-12-03). Such parts list their
# versions (EXACT_ROWS), which point reads and the conflict check prune by exactly.
MIN_FILTER_BITS = 256
EXACT_ROWS = 64  # a part of at most this many versions lists them in its summary
_OPS = (PUT, UPDATE, DELETE, LOCK_STRONG, LOCK_WEAK)
_ORDERED = (bool, int, str)


HASH_BLAKE2B, HASH_MIX64 = "blake2b", "mix64"
HASH_SCHEMES = (HASH_BLAKE2B, HASH_MIX64)
_M64 = (1 << 64) - 1
_MIX1, _MIX2, _G = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0x9E3779B97F4A7C15
_T_INT, _T_BYTES, _T_H1, _T_H2 = 0x1D8E4E27C47D124F, 0x5851F42D4C957F2D, 0x2545F4914F6CDD1D, 0x6A09E667F3BCC909
_VECTOR_ROWS = 512  # below this many rows a summary is computed in Python (fewer kernel calls)
_SATURATED = 6  # a mix64 filter with HASHES * rows >= this * m bits is written all ones


def scheme_of(summary: Mapping[str, Any]) -> str:
    """The hash scheme a key summary's filter was built with (none named: the first one)."""
    scheme: str = summary.get("hash", HASH_BLAKE2B)
    return scheme


MIX64_KINDS: tuple[TypeKind, ...] = (
    pa.types.is_integer,
    pa.types.is_boolean,
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_binary,
    pa.types.is_large_binary,
)  # the types of key columns HASH_MIX64 hashes


def mix64_type(t: pa.DataType) -> bool:
    """Whether :data:`HASH_MIX64` hashes key columns of type ``t``."""
    return of_kinds(t, MIX64_KINDS)


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * _MIX1) & _M64
    z = ((z ^ (z >> 27)) * _MIX2) & _M64
    return z ^ (z >> 31)


def _mix64_value(v: Any) -> int | None:
    """A value's ``mix64`` hash (see above); None for a type the scheme does not hash."""
    if isinstance(v, (bool, int)):
        return _mix((int(v) & _M64) ^ _T_INT)
    if isinstance(v, str):
        v = v.encode("utf-8")
    if isinstance(v, bytes):
        total = sum(_mix(((b | j << 8) + _G) & _M64) for j, b in enumerate(v)) & _M64
        return _mix(((total + len(v) * _G) & _M64) ^ _T_BYTES)
    return None


def key_hash_mix64(key: tuple[Any, ...]) -> tuple[int, int] | None:
    """``(h1, h2)`` of a key under :data:`HASH_MIX64`; None when a value is of a type it does not
    hash (no part hashed with it can hold such a key's column type: a probe then says maybe).

    Cached by the key and its values' types: keys equal across types (``(0, 1)``,
    ``(0.0, 1.0)``, ``(False, True)``) are one entry of a plain cache, where a float key's None
    was answered for the int key after it (a part write then failed: "has a value the mix64
    scheme does not hash")."""
    return _key_hash_mix64(key, tuple(map(type, key)))


@functools.lru_cache(maxsize=1 << 14)
def _key_hash_mix64(key: tuple[Any, ...], _types: tuple[type, ...]) -> tuple[int, int] | None:
    h = _G
    for v in key:
        c = _mix64_value(v)
        if c is None:
            return None
        h = _mix((h * _G + c) & _M64)
    return _mix(h ^ _T_H1), _mix(h ^ _T_H2) | 1


def _u64(x: int) -> pa.Scalar:
    return pa.scalar(x, pa.uint64())


def _mix_array(z: Any) -> Any:
    import pyarrow.compute as pc

    z = pc.multiply(pc.bit_wise_xor(z, pc.shift_right(z, _u64(30))), _u64(_MIX1))
    z = pc.multiply(pc.bit_wise_xor(z, pc.shift_right(z, _u64(27))), _u64(_MIX2))
    return pc.bit_wise_xor(z, pc.shift_right(z, _u64(31)))


def _column_mix64(col: Any) -> Any:
    """Each value's ``mix64`` hash, over the whole column (no nulls: key columns have none)."""
    import pyarrow.compute as pc

    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    t = col.type
    if pa.types.is_boolean(t) or pa.types.is_integer(t):
        ints = col.cast(pa.uint8()) if pa.types.is_boolean(t) else col
        return _mix_array(
            pc.bit_wise_xor(ints.cast(pa.int64(), safe=False).cast(pa.uint64(), safe=False), _u64(_T_INT))
        )
    arr = col.cast(pa.large_binary())
    n = len(arr)
    lens = pc.binary_length(arr).cast(pa.int64())
    ends = pc.cumulative_sum(lens)
    total = ends[n - 1].as_py() if n else 0
    if total == 0:
        sums = pa.repeat(_u64(0), n)
    else:
        _, offsets, values = arr.buffers()
        offs = pa.Array.from_buffers(pa.int64(), n + 1, [None, offsets], offset=arr.offset)
        raw = pa.Array.from_buffers(pa.uint8(), offs[n].as_py(), [None, values])
        lists = pa.LargeListArray.from_arrays(offs, raw)
        starts = pc.subtract(ends, lens)
        flat = pc.list_flatten(lists).cast(pa.uint64())
        at = pc.subtract(_arange(total), pc.take(starts, pc.list_parent_indices(lists)))
        contrib = _mix_array(pc.add(pc.bit_wise_or(flat, pc.shift_left(at.cast(pa.uint64()), _u64(8))), _u64(_G)))
        running = pa.concat_arrays([pa.array([0], pa.uint64()), pc.cumulative_sum(contrib)])
        sums = pc.subtract(pc.take(running, ends), pc.take(running, starts))
    with_len = pc.add(sums, pc.multiply(lens.cast(pa.uint64()), _u64(_G)))
    return _mix_array(pc.bit_wise_xor(with_len, _u64(_T_BYTES)))


def _arange(n: int) -> Any:
    import pyarrow.compute as pc

    return pc.subtract(pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), n)), 1)


def column_hashes(data: pa.Table, primary_key: Sequence[str]) -> tuple[Any, Any]:
    """``(h1, h2)`` under :data:`HASH_MIX64` of every row's key, as two uint64 arrays: the same
    numbers :func:`key_hash_mix64` gives per key, in a fixed number of kernels per column."""
    import pyarrow.compute as pc

    h: Any = pa.repeat(_u64(_G), data.num_rows)
    for k in primary_key:
        h = _mix_array(pc.add(pc.multiply(h, _u64(_G)), _column_mix64(data.column(k))))
    return _mix_array(pc.bit_wise_xor(h, _u64(_T_H1))), pc.bit_wise_or(
        _mix_array(pc.bit_wise_xor(h, _u64(_T_H2))), _u64(1)
    )


def encode_key(key: Sequence[Any]) -> bytes:
    """The bytes a key is hashed from (see above); equal keys of one table give equal bytes."""
    out = bytearray()
    for v in key:
        if isinstance(v, bool):
            tag, body = b"b", b"\x01" if v else b"\x00"
        elif isinstance(v, int):
            tag, body = b"i", str(v).encode()
        elif isinstance(v, str):
            tag, body = b"s", v.encode("utf-8")
        elif isinstance(v, bytes):
            tag, body = b"y", v
        elif isinstance(v, float):
            tag, body = b"f", struct.pack(">d", v + 0.0 if v == 0 else v)
        else:
            tag, body = b"r", f"{type(v).__name__}:{v!r}".encode()
        out += tag + len(body).to_bytes(4, "big") + body
    return bytes(out)


def key_hash(key: Sequence[Any]) -> tuple[int, int]:
    """``(h1, h2)`` of a key under :data:`HASH_BLAKE2B` (see above): computed once per key,
    probed against many filters (a part hashed otherwise is probed with :func:`key_hash_mix64`)."""
    d = hashlib.blake2b(encode_key(key), digest_size=16).digest()
    return int.from_bytes(d[:8], "little"), int.from_bytes(d[8:], "little") | 1


def summarize(
    data: pa.Table,
    primary_key: Sequence[str],
    bits_per_key: int = BITS_PER_KEY,
    max_bits: int = MAX_FILTER_BITS,
    exact_rows: int = EXACT_ROWS,
    scheme: str | None = None,
) -> dict[str, Any]:
    """The key summary of a part's rows (JSON-ready, what PartMeta.key_summary holds):
    ``{"lo": key|None, "hi": key|None, "m": bits, "k": hashes, "bloom": base64}``, or for the
    ``mix64`` scheme ``"hash": "mix64"`` with that filter under ``"filter"`` and an all-ones
    byte as ``m``/``k``/``bloom`` (what older code probes: :data:`_LEGACY_ONES`); plus, for a part of at most ``exact_rows`` versions
    whose keys are ints, strings or bools, ``"exact"``: each version's ``[*key, _op, _cols]``
    (a small commit's key set in its change set, so the conflict check needs no read of it at
    all; :func:`exact_locks`). ``scheme``: the filter's hash (default ``mix64`` when every key
    column has a type it hashes, else ``blake2b``); a large part's is computed over whole
    columns, with no Python per key."""
    if scheme is None:
        mix = bool(primary_key) and all(mix64_type(data.schema.field(k).type) for k in primary_key)
        scheme = HASH_MIX64 if mix else HASH_BLAKE2B
    if scheme not in HASH_SCHEMES:
        raise ValueError(f"unknown key hash scheme {scheme!r}")
    if scheme == HASH_MIX64 and data.num_rows > max(exact_rows, _VECTOR_ROWS):
        return bound_summary(_summarize_columns(data, primary_key, bits_per_key, max_bits))
    cols = [data.column(k).to_pylist() for k in primary_key]
    distinct = set(zip(*cols)) if cols else set()
    exact = None
    if (
        data.num_rows <= exact_rows
        and OP in data.column_names
        and COLS in data.column_names
        and all(isinstance(v, _ORDERED) and not _long(v) for key in distinct for v in key)
    ):
        exact = [
            [*key, op, written]
            for key, op, written in zip(
                zip(*cols) if cols else (), data.column(OP).to_pylist(), data.column(COLS).to_pylist()
            )
        ]
    m = _filter_bits(len(distinct) if scheme == HASH_BLAKE2B else data.num_rows, bits_per_key, max_bits)
    bits = bytearray(m // 8)
    saturated = scheme == HASH_MIX64 and data.num_rows * HASHES >= _SATURATED * m
    if saturated:
        bits = bytearray(b"\xff" * (m // 8))  # as _summarize_columns does
    for key in () if saturated else distinct:
        hashed = key_hash(key) if scheme == HASH_BLAKE2B else key_hash_mix64(key)
        if hashed is None:
            raise ValueError(f"key {key!r} has a value the {scheme} scheme does not hash")
        h1, h2 = hashed
        for i in range(HASHES):
            b = (h1 + i * h2) % m
            bits[b >> 3] |= 1 << (b & 7)
    lo = hi = None
    if distinct and all(isinstance(v, _ORDERED) for v in next(iter(distinct))):
        lo, hi = list(min(distinct)), list(max(distinct))
    out = _with_filter(scheme, lo, hi, m, base64.b64encode(bytes(bits)).decode("ascii"))
    if exact is not None:
        out["exact"] = exact
    return bound_summary(out)


def _filter_bits(distinct: int, bits_per_key: int, max_bits: int) -> int:
    m = min(max_bits, max(MIN_FILTER_BITS, distinct * bits_per_key))
    return m + -m % 8


def _summarize_columns(data: pa.Table, primary_key: Sequence[str], bits_per_key: int, max_bits: int) -> dict[str, Any]:
    """:func:`summarize` of a ``mix64`` part in Arrow kernels: the rows' key hashes, the bits they
    set, the least and greatest key (column by column); no ``exact`` (too many rows)."""
    import pyarrow.compute as pc

    m = _filter_bits(data.num_rows, bits_per_key, max_bits)  # rows for keys, as the Python road
    if data.num_rows * HASHES >= _SATURATED * m:
        # All but ~e**-6 (0.25%) of the bits would be set, so the filter would rule out under 3%
        # of absent keys: all ones (always correct, a filter only needs the bits of the keys it
        # holds set; the key range still prunes) costs no hashing at all.
        packed = b"\xff" * (m // 8)
    else:
        h1, h2 = column_hashes(data, primary_key)
        mu = _u64(m)
        a = pc.subtract(h1, pc.multiply(pc.divide(h1, mu), mu))
        step = pc.subtract(h2, pc.multiply(pc.divide(h2, mu), mu))
        at = [a]
        for _ in range(HASHES - 1):
            a = pc.add(a, step)
            a = pc.if_else(pc.greater_equal(a, mu), pc.subtract(a, mu), a)
            at.append(a)
        bits = pc.is_in(_arange(m), value_set=pa.concat_arrays(at).cast(pa.int64()))
        packed = bits.buffers()[1].to_pybytes()[: m // 8]
    lo = hi = None
    types = [data.schema.field(k).type for k in primary_key]
    if data.num_rows and all(
        pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
        for t in types
    ):
        lo, hi = _least(data, primary_key, "min"), _least(data, primary_key, "max")
    return _with_filter(HASH_MIX64, lo, hi, m, base64.b64encode(packed).decode("ascii"))


# What code from before the schemes finds in a mix64 summary's "m", "k" and "bloom" (it ignores
# "hash" and would probe with blake2b): one byte of ones, so it says "maybe" for every key and
# prunes by the key range alone. The mix64 filter itself is under "filter", which it never reads:
# an older replica or client in the cluster never rules out a key a new part holds.
_LEGACY_ONES = {"m": 8, "k": 1, "bloom": base64.b64encode(b"\xff").decode("ascii")}


def _with_filter(scheme: str, lo: list[Any] | None, hi: list[Any] | None, m: int, bloom: str) -> dict[str, Any]:
    if scheme == HASH_BLAKE2B:
        return {"lo": lo, "hi": hi, "m": m, "k": HASHES, "bloom": bloom}
    return {"lo": lo, "hi": hi, **_LEGACY_ONES, "hash": scheme, "filter": {"m": m, "k": HASHES, "bloom": bloom}}


def _filter_of(summary: Mapping[str, Any]) -> tuple[int, int, bytes]:
    """``(m, k, bits)`` of the Bloom filter a summary's scheme probes."""
    f = summary if scheme_of(summary) == HASH_BLAKE2B else summary["filter"]
    return f["m"], f["k"], _bits(f["bloom"])


def _least(data: pa.Table, primary_key: Sequence[str], which: str) -> list[Any]:
    """The least (``min``) or greatest (``max``) key of ``data`` in tuple order, column by column."""
    import pyarrow.compute as pc

    out = []
    for k in primary_key:
        col = data.column(k)
        v = pc.min_max(col)[which]
        out.append(v.as_py())
        data = data.filter(pc.equal(col, v))
    return out


def _long(v: Any) -> bool:
    from coordinator.core.tabledata import STAT_PREFIX

    return isinstance(v, str) and len(v) > STAT_PREFIX


def _bound_key(key: list[Any], upper: bool) -> list[Any] | None:
    """A key range end with its first long string cut (``coordinator.core.tabledata.lower_bound`` /
    ``upper_bound``) and the columns after it dropped: a shorter key orders before every key
    it is a prefix of, and a cut string already orders strictly before (after) the original, so
    the result still bounds every key of the part. None when no upper bound exists."""
    from coordinator.core.tabledata import lower_bound, upper_bound

    for i, v in enumerate(key):
        if _long(v):
            cut = upper_bound(v) if upper else lower_bound(v)
            return None if cut is None else [*key[:i], cut]
    return key


def bound_summary(s: dict[str, Any]) -> dict[str, Any]:
    """A key summary whose size does not grow with its keys' lengths: ``lo`` and ``hi`` bounded
    (:func:`_bound_key`; both None when ``hi`` has no bound: the Bloom filter still prunes) and
    ``exact`` left out when a key in it is long (the conflict check then reads the part). ``s``
    itself when nothing in it is long; ranges and ``exact`` written before stay as they were
    only when short, so old parts keep correct (if less sharp) summaries."""
    lo, hi, exact = s.get("lo"), s.get("hi"), s.get("exact")
    long_end = any(isinstance(end, list) and any(_long(v) for v in end) for end in (lo, hi))
    long_exact = isinstance(exact, list) and any(isinstance(r, list) and any(_long(v) for v in r[:-2]) for r in exact)
    if not (long_end or long_exact):
        return s
    out = dict(s)
    if long_exact:
        del out["exact"]
    if long_end and isinstance(lo, list) and isinstance(hi, list):
        lo, hi = _bound_key(lo, upper=False), _bound_key(hi, upper=True)
        out["lo"], out["hi"] = (lo, hi) if hi is not None else (None, None)
    return out


def summary_gap(summary: Mapping[str, Any], data: pa.Table, primary_key: Sequence[str]) -> str | None:
    """Why a part's key summary does not hold every key of its file's rows ``data`` (its key
    columns, with ``_op`` and ``_cols`` when the summary lists ``exact`` versions), or None: the
    key range must contain each key, the Bloom filter must have each key's bits set, and the
    exact versions must be the file's. A summary a writer made up could otherwise hide a key
    from point reads and from the key conflict check. A large part hashed with ``mix64`` is
    checked in Arrow kernels, with no Python per key."""
    if not data.num_rows:
        return None
    mix = scheme_of(summary) != HASH_BLAKE2B
    vector = mix and data.num_rows > _VECTOR_ROWS and all(mix64_type(data.schema.field(k).type) for k in primary_key)
    keys = None if vector else set(zip(*(data.column(k).to_pylist() for k in primary_key)))
    lo, hi = summary.get("lo"), summary.get("hi")
    if lo is not None and hi is not None:
        try:
            low, high = (
                (tuple(_least(data, primary_key, "min")), tuple(_least(data, primary_key, "max")))
                if keys is None
                else (min(keys), max(keys))
            )
            inside = tuple(lo) <= low and high <= tuple(hi)
        except TypeError:
            inside = False
        if not inside:
            return f"key range [{quote(lo)}, {quote(hi)}] does not contain every key of the file"
    m, k, bits = _filter_of(summary)
    if keys is None:
        if not _filter_holds_columns(data, primary_key, m, k, bits):
            return "Bloom filter does not hold every key of the file"
    else:
        for key in keys:
            hashed = key_hash_mix64(key) if mix else key_hash(key)
            if hashed is None:
                return f"hash scheme {scheme_of(summary)!r} does not hash key {quote(list(key))}"
            h1, h2 = hashed
            if any(not bits[b >> 3] >> (b & 7) & 1 for b in ((h1 + i * h2) % m for i in range(k))):
                return f"Bloom filter does not hold key {quote(list(key))} of the file"
    return _exact_gap(summary.get("exact"), data, primary_key)


def _filter_holds_columns(data: pa.Table, primary_key: Sequence[str], m: int, k: int, bits: bytes) -> bool:
    """Whether a ``mix64`` filter of ``m`` bits and ``k`` hashes has every row's key's bits set."""
    import pyarrow.compute as pc

    if bits == b"\xff" * len(bits):
        return True
    have = pa.BooleanArray.from_buffers(pa.bool_(), m, [None, pa.py_buffer(bits)])
    h1, h2 = column_hashes(data, primary_key)
    mu = _u64(m)
    a = pc.subtract(h1, pc.multiply(pc.divide(h1, mu), mu))
    step = pc.subtract(h2, pc.multiply(pc.divide(h2, mu), mu))
    for i in range(k):
        if i:
            a = pc.add(a, step)
            a = pc.if_else(pc.greater_equal(a, mu), pc.subtract(a, mu), a)
        if not pc.all(pc.take(have, a.cast(pa.int64()))).as_py():
            return False
    return True


def _exact_gap(exact: Any, data: pa.Table, primary_key: Sequence[str]) -> str | None:
    """Why a summary's ``exact`` versions are not the file's (None: they are, or none are listed)."""
    if exact is None:
        return None
    if OP not in data.column_names or COLS not in data.column_names:
        return "'exact' lists versions, the file has no _op/_cols columns"
    cols = [data.column(k).to_pylist() for k in primary_key]
    truth = Counter(
        (*key, op, written)
        for key, op, written in zip(zip(*cols), data.column(OP).to_pylist(), data.column(COLS).to_pylist())
    )
    if Counter(tuple(r) for r in exact) != truth:
        return "'exact' does not list the file's versions"
    return None


def exact_locks(
    summary: Mapping[str, Any] | None, key_columns: int, lock_groups: Sequence[tuple[str, Sequence[str]]]
) -> KeyLocks | None:
    """Key -> locks of a part from its summary's ``"exact"`` versions, as :func:`written_locks`
    gives them from the file; None when it has none (or they do not fit ``key_columns``)."""
    rows = None if summary is None else summary.get("exact")
    if rows is None or any(len(r) != key_columns + 2 for r in rows):
        return None
    out: dict[tuple[Any, ...], frozenset[str]] = {}
    for r in rows:
        key, op, written = tuple(r[:key_columns]), r[key_columns], r[key_columns + 1]
        held = locks(op, written.split(",") if written else (), lock_groups)
        out[key] = out.get(key, frozenset()) | held
    return out


def _filter_problem(s: Mapping[str, Any]) -> str | None:
    m, k, bloom = s.get("m"), s.get("k"), s.get("bloom")
    if not (isinstance(m, int) and not isinstance(m, bool) and m > 0 and m % 8 == 0):
        return f"'m' must be a positive multiple of 8, got {quote(m)}"
    if not (isinstance(k, int) and not isinstance(k, bool) and 0 < k <= 64):
        return f"'k' must be an integer in 1..64, got {quote(k)}"
    if not isinstance(bloom, str):
        return "'bloom' must be a base64 string"
    try:
        raw = _bits(bloom)
    except ValueError:
        return "'bloom' is not base64"
    if len(raw) * 8 != m:
        return f"'bloom' holds {len(raw) * 8} bits, 'm' says {m}"
    return None


MAX_RANGE_GROUPS = 1 << 16  # row groups a summary's "ranges" may list (a 256 MiB part has a few thousand)


_BIG = 1 << 62


def _natural(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _BIG


def ranges_problem(r: Any) -> str | None:
    """What is wrong with a summary's ``ranges`` (the file's byte ranges and their crc32, written
    with the part: ``{"tail": [length, crc], "groups": [[offset, length, crc], ...]}``, which let
    a point read fetch and verify the footer and a row group instead of the whole file), or None."""
    if not isinstance(r, dict):
        return f"'ranges' must be an object, got {type(r).__name__}"
    tail, groups = r.get("tail"), r.get("groups")
    if not (isinstance(tail, list) and len(tail) == 2 and all(_natural(v) for v in tail) and tail[0] >= 12):
        return "'ranges': 'tail' must be [length >= 12, crc32]"
    if not (isinstance(groups, list) and len(groups) <= MAX_RANGE_GROUPS):
        return f"'ranges': 'groups' must be a list of at most {MAX_RANGE_GROUPS} [offset, length, crc32]"
    if not groups:
        return None
    # Loops in C (map, set, min, max): every commit, part list and point read's answer carries
    # these, and a big part has hundreds.
    if set(map(type, groups)) != {list} or set(map(len, groups)) != {3}:
        return "'ranges': 'groups' must list [offset, length, crc32] of natural numbers"
    flat = list(itertools.chain.from_iterable(groups))
    if set(map(type, flat)) != {int} or min(flat) < 0 or max(flat) >= _BIG:
        return "'ranges': 'groups' must list [offset, length, crc32] of natural numbers"
    return None


def summary_problem(s: Any) -> str | None:
    """What is wrong with a key summary read from metadata, or None."""
    if not isinstance(s, dict):
        return f"must be an object, got {type(s).__name__}"
    if "ranges" in s:
        problem = ranges_problem(s["ranges"])
        if problem is not None:
            return problem
    problem = _filter_problem(s)
    if problem is not None:
        return problem
    if s.get("hash", HASH_BLAKE2B) not in HASH_SCHEMES:
        return f"'hash' must be one of {list(HASH_SCHEMES)}, got {quote(s.get('hash'))}"
    if s.get("hash", HASH_BLAKE2B) != HASH_BLAKE2B:
        f = s.get("filter")
        if not isinstance(f, dict):
            return f"'filter' must be an object for hash {quote(s.get('hash'))}"
        problem = _filter_problem(f)
        if problem is not None:
            return f"'filter': {problem}"
    for end in ("lo", "hi"):
        v = s.get(end)
        if v is not None and not (isinstance(v, list) and all(isinstance(x, _ORDERED) for x in v)):
            return f"{quote(end)} must be a list of ints, strings or bools, got {quote(v)}"
    if (s.get("lo") is None) != (s.get("hi") is None):
        return "'lo' and 'hi' must be both set or both null"
    exact = s.get("exact")
    if exact is not None and not (
        isinstance(exact, list)
        and all(
            isinstance(r, list)
            and len(r) >= 3
            and all(isinstance(v, _ORDERED) for v in r[:-2])
            and isinstance(r[-2], int)
            and not isinstance(r[-2], bool)
            and r[-2] in _OPS
            and (r[-1] is None or isinstance(r[-1], str))
            for r in exact
        )
    ):
        return "'exact' must list [*key, op, columns] versions"
    return None


@functools.lru_cache(maxsize=1 << 16)
def _bits(bloom: str) -> bytes:
    return base64.b64decode(bloom, validate=True)


def may_hold(summary: Mapping[str, Any] | None, key: Sequence[Any], hashed: tuple[int, int] | None = None) -> bool:
    """False only when a part with this summary holds no version of ``key`` (no summary:
    True). ``hashed``: :func:`key_hash` of the key, when the caller probes many parts."""
    if summary is None:
        return True
    lo: Any = summary.get("lo")
    hi: Any = summary.get("hi")
    if lo is not None:
        t = tuple(key)
        try:
            if t < tuple(lo) or t > tuple(hi):
                return False
        except TypeError:  # a key of other types than the part's: let the filter say
            pass
    if scheme_of(summary) == HASH_BLAKE2B:
        h1, h2 = hashed if hashed is not None else key_hash(key)
    else:
        got = key_hash_mix64(tuple(key))
        if got is None:
            return True
        h1, h2 = got
    m, k, bits = _filter_of(summary)
    for i in range(k):
        b = (h1 + i * h2) % m
        if not bits[b >> 3] >> (b & 7) & 1:
            return False
    return True


def mixed_hashes(keys: Iterable[tuple[Any, ...]]) -> dict[tuple[Any, ...], tuple[int, int]] | None:
    """``key -> key_hash_mix64(key)`` for probing many ``mix64`` parts with the same keys (None
    when a key has a value the scheme does not hash)."""
    out = {}
    for key in keys:
        got = key_hash_mix64(key)
        if got is None:
            return None
        out[key] = got
    return out


def _outside(key: tuple[Any, ...], lo: tuple[Any, ...] | None, hi: tuple[Any, ...] | None) -> bool:
    """Whether ``key`` lies outside a summary's key range (no range, or keys that do not
    compare with its bounds: maybe inside, the filter decides)."""
    if lo is None or hi is None:
        return False
    try:
        return bool(key < lo or key > hi)
    except TypeError:
        return False


def exact_keys(summary: Mapping[str, Any]) -> tuple[int, frozenset[tuple[Any, ...]]] | None:
    """``(key columns, keys)`` of a small part's summary that lists its versions (``"exact"``,
    checked against the file when the part was staged: :func:`summary_gap`), or None. A probe
    of such a part by its keys has no false positive, where its filter, 256 bits for a 10-key
    commit, said "maybe" for about 0.1 % of the keys it does not hold (measured: a 10-key
    update-mode write's point read of a table with 1,000 such parts got 19 parts, 10 useful)."""
    rows = summary.get("exact")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, list) and len(r) > 2 for r in rows):
        return None
    width = len(rows[0]) - 2
    if any(len(r) != width + 2 for r in rows):
        return None
    try:
        return width, frozenset(tuple(r[:width]) for r in rows)
    except TypeError:  # a value that does not hash: the filter decides
        return None


def _lists_any(exact: tuple[int, frozenset[tuple[Any, ...]]], keys: Iterable[tuple[Any, ...]]) -> bool:
    """Whether a part's listed versions (:func:`exact_keys`) hold one of ``keys``; True for a
    key of another width than theirs (not theirs to rule out: the filter's maybe stands)."""
    width, listed = exact
    return any(len(key) != width or key in listed for key in keys)


def may_hold_any(
    summary: Mapping[str, Any] | None,
    hashed: Mapping[tuple[Any, ...], tuple[int, int]],
    mixed: Mapping[tuple[Any, ...], tuple[int, int]] | None = None,
) -> bool:
    """Whether a part with this summary may hold a version of any of the keys (``key ->
    key_hash(key)``): :func:`may_hold` for each, in one loop (the conflict check probes every
    part committed since a snapshot with every key it writes). A part hashed with ``mix64`` is
    probed with :func:`key_hash_mix64` of the keys instead (``mixed``: the same keys'
    :func:`mixed_hashes`, computed once by a caller that probes many parts). A part whose
    summary lists its versions (:func:`exact_keys`) holds none of the keys it does not list."""
    if summary is None:
        return True
    exact = exact_keys(summary)
    if exact is not None and not _lists_any(exact, hashed):
        return False  # else its filter holds each key listed (checked at staging), and says so
    if scheme_of(summary) != HASH_BLAKE2B:
        if mixed is None:
            mixed = mixed_hashes(hashed)
            if mixed is None:
                return True
        hashed = mixed
    lo: Any = summary.get("lo")
    hi: Any = summary.get("hi")
    if lo is not None:
        lo, hi = tuple(lo), tuple(hi)
    m, k, bits = _filter_of(summary)
    for key, (h1, h2) in hashed.items():
        if _outside(key, lo, hi):
            continue
        a, b = h1 % m, h2 % m
        for _ in range(k):
            if not bits[a >> 3] >> (a & 7) & 1:
                break
            a = (a + b) % m
        else:
            return True
    return False


class SummaryProbes:
    """Key summaries of parts, parsed once and laid out for probing many parts at once, for a
    replica that prunes every visible part of a keys table with a point read's keys
    (replicas/server.py ``_may_hold``): what :func:`may_hold_any` keeps, at a cost that barely
    grows with the parts.

    A part is immutable, so its range, filter bits and scheme, parsed at its first probe, serve
    every later one (entries keyed by part name and checked against its checksum; bounded by
    count and filter bytes, the first parsed go first). A visible set of parts (its part
    metadata in order, compared by value: a replica lists the same objects while nothing
    changes, so a set seen before is found by identity) gets a *layout*: per filter shape (scheme, bits, hash count) the
    filters of its parts side by side, row after row, in one ``bytes``. A key's bit ``b`` of
    every part of a shape is then one strided slice of that buffer (``rows[b >> 3::stride]``),
    turned into 0/1 bytes by a ``translate`` table and into an int; the AND of the key's
    ``k`` ints marks the parts whose filter holds all its bits: a few C calls per key and shape
    instead of a dict look-up and a loop per part. Only those parts (and parts with no filter
    to go by: all ones) are tested against their key range, in Python. Layouts are kept for a
    few visible sets (LRU, bounded by count and bytes, each tagged with its table): the next
    lookup of an unchanged set reuses its layout; a commit, a compaction, a cleanup or a DDL
    changes the set: a set held by a layout of its table but for a few parts probes that layout
    (keeping only the parts of the set) and the few as a set of their own, and gets a layout of
    its own once the parts not laid out are more than an eighth of it. Any thread: entries and
    layouts are immutable once built, the maps are changed under a lock."""

    SIZE = 1 << 15  # parts parsed
    BYTES = 256 << 20  # their filter bits and listed keys, at most
    LAYOUTS = 64  # visible sets laid out (a table's set and the parts since, for many tables)
    LAYOUT_BYTES = 128 << 20  # their filter bits, at most

    def __init__(
        self, size: int = SIZE, max_bytes: int = BYTES, layouts: int = LAYOUTS, layout_bytes: int = LAYOUT_BYTES
    ) -> None:
        self.size, self.max_bytes = size, max_bytes
        self.max_layouts, self.layout_bytes = layouts, layout_bytes
        self._lock = threading.Lock()
        # part name -> (checksum, (lo, hi), (mix, m, k), bits | None, exact_keys | None)
        self._items: dict[str, tuple[Any, ...]] = {}
        self._bytes = 0
        self._layouts: list[_Layout] = []  # the last used first
        self._layout_total = 0

    def __len__(self) -> int:
        return len(self._items)

    def _parse(self, name: str, checksum: str, summary: Mapping[str, Any]) -> tuple[Any, ...]:
        lo: Any = summary.get("lo")
        hi: Any = summary.get("hi")
        f = summary if scheme_of(summary) == HASH_BLAKE2B else summary["filter"]
        m, k = f["m"], f["k"]
        raw = base64.b64decode(f["bloom"], validate=True)
        bits = None if raw.count(0xFF) == len(raw) else raw  # all ones: every key may be there, the range prunes
        got = (
            checksum,
            (None, None) if lo is None else (tuple(lo), tuple(hi)),
            (scheme_of(summary) != HASH_BLAKE2B, m, k),
            bits,
            exact_keys(summary),
        )
        with self._lock:
            old = self._items.pop(name, None)
            if old is not None:
                self._bytes -= _held_bytes(old)
            self._items[name] = got
            self._bytes += _held_bytes(got)
            while len(self._items) > self.size or (self._bytes > self.max_bytes and len(self._items) > 1):
                self._bytes -= _held_bytes(self._items.pop(next(iter(self._items))))
        return got

    def _layout(self, metas: list[Any]) -> tuple[_Layout, Alignment | None]:
        """A layout for ``metas``, with None when it is theirs (in their order); else one laid
        out before that holds all but a few of them, with how ``metas`` lie against it
        (:func:`align`: the few it does not hold are probed as a list of their own, through
        these same layouts): a commit adds a part or two to the set the next read lists, which
        is laid out again only once more than an eighth of it (or :data:`_FEW_FRESH` parts) is
        not in the last layouts, or as many of the layout's are not in it. A list of at most
        _FEW_FRESH parts (the few of a bigger one, a transaction's own, parts removed since its
        snapshot) is laid out apart and not kept."""
        # A replica lists the same PartMeta objects while nothing changes: the list compares
        # equal item by item by identity, so a visible set seen before costs no hashing.
        with self._lock:
            for i, layout in enumerate(self._layouts):
                if len(layout.metas) == len(metas) and layout.metas == metas:
                    self._layouts.insert(0, self._layouts.pop(i))
                    return layout, None
            covering = list(self._layouts)
        if len(metas) <= _FEW_FRESH:
            return _Layout.build(metas, self._items, self._parse), None
        limit = max(_FEW_FRESH, len(metas) // 8)
        table = _table_of(metas)
        for layout in covering:
            # Another table's set, or more parts added or gone than that: not tried (the layouts
            # of many tables probed in turn are kept and found whatever their place in the list).
            if layout.table != table or abs(len(layout.metas) - len(metas)) > limit:
                continue
            aligned = align(layout.metas, metas, limit)
            if aligned is not None:
                with self._lock:  # the last used first: a set's covering layout stays near the front
                    if layout in self._layouts:
                        self._layouts.remove(layout)
                        self._layouts.insert(0, layout)
                return layout, aligned
        layout = _Layout.build(metas, self._items, self._parse)
        with self._lock:
            if layout.nbytes <= self.layout_bytes:
                self._layouts.insert(0, layout)
                self._layout_total += layout.nbytes
            while len(self._layouts) > self.max_layouts or self._layout_total > self.layout_bytes:
                self._layout_total -= self._layouts.pop().nbytes
        return layout, None

    def may_hold(self, metas: Iterable[Any], hashed: Mapping[tuple[Any, ...], tuple[int, int]]) -> list[Any]:
        """The parts of ``metas`` (``name``, ``checksum``, ``key_summary``) whose summary may
        hold one of the keys (``key -> key_hash(key)``, :func:`hint_hashes`): what
        :func:`may_hold_any` keeps, in their order."""
        metas = list(metas)
        if not metas:
            return []
        return [metas[i] for i in sorted(self._kept(metas, _Keys(hashed)))]

    def _kept(self, metas: list[Any], keys: _Keys) -> Iterable[int]:
        """The positions in ``metas`` of the parts that may hold one of the keys: the kept of a
        covering layout where they are in ``metas``, and those of the parts it does not hold,
        a list found the same way (the parts committed since the set was laid out, a few more
        each commit: their own layout, kept, covers them but for the newest, so a set of
        thousands of small parts is not laid out again every few dozen commits; measured: 21 %
        of the replica's busy time under update-mode writes at 8,400 parts)."""
        layout, aligned = self._layout(metas)
        kept = self._probe(layout, keys)
        if aligned is None:
            return kept
        held = [i for k in kept if (i := aligned.new_position(k)) is not None]
        fresh = aligned.fresh
        if fresh:
            held += [fresh[k] for k in self._kept([metas[i] for i in fresh], keys)]
        return held

    @staticmethod
    def _probe(layout: _Layout, keys: _Keys) -> set[int]:
        """The positions in ``layout`` of the parts that may hold one of the keys."""
        hashed = keys.hashed
        mixed = keys.mixed if layout.has_mix else None
        kept = set(layout.always)
        for width, listed in layout.listed.items():
            if all(len(key) == width for key in hashed):
                for key in hashed:
                    kept.update(listed.holding(key))
            else:  # a key of another width: not theirs to rule out (as _lists_any)
                kept.update(listed.positions)
        for shape, group in layout.groups.items():
            mix, m, k = shape
            hashes = mixed if mix else hashed
            if hashes is None:  # a key the scheme does not hash: maybe, for every part of it
                kept.update(group.positions)
                continue
            for key, h in hashes.items():
                for row in group.rows_with(h, m, k):
                    at = group.positions[row]
                    if at not in kept and not _outside(key, *layout.ranges[at]):
                        kept.add(at)
        for at, mix in layout.by_range:
            if at in kept:
                continue
            if (mix and mixed is None) or any(not _outside(key, *layout.ranges[at]) for key in hashed):
                kept.add(at)  # a key mix64 does not hash: maybe, whatever the range (as may_hold_any)
        exact = layout.exact  # a part that lists its versions holds exactly those keys
        return {at for at in kept if (own := exact[at]) is None or _lists_any(own, hashed)}


class _Keys:
    """A point read's keys as :class:`SummaryProbes` probes them: ``hashed`` (``key ->
    key_hash(key)``) and their ``mix64`` hashes, computed once for every layout a probe walks."""

    def __init__(self, hashed: Mapping[tuple[Any, ...], tuple[int, int]]) -> None:
        self.hashed = hashed

    @functools.cached_property
    def mixed(self) -> dict[tuple[Any, ...], tuple[int, int]] | None:
        """``mixed_hashes`` of the keys (None: a key the scheme does not hash)."""
        return mixed_hashes(self.hashed)


class Alignment(NamedTuple):
    """How a list of parts lies against a laid-out one (:func:`align`): ``runs``, ``(old
    position, new position, length)`` of the stretches the two share, in order, and ``fresh``:
    the positions in the new list of every part outside them."""

    runs: list[tuple[int, int, int]]
    fresh: list[int]

    def new_position(self, old: int) -> int | None:
        """Where the old list's part at ``old`` is in the new one (None: not there)."""
        i = bisect.bisect_right(self.runs, old, key=lambda run: run[0]) - 1
        if i < 0:
            return None
        at, to, n = self.runs[i]
        return to + old - at if old < at + n else None


_RUN = 64  # parts compared at once by :func:`_shared_run`, doubled while they match


def align(old: list[Any], new: list[Any], limit: int) -> Alignment | None:
    """How ``new`` lies against ``old`` (two lists of parts in name order, sharing their
    objects: a visible set and the one laid out a few commits before), found by comparing
    stretches of the two lists (``==`` of slices: identity first, in C) and stepping by name
    only where they differ: a few dozen comparisons for thousands of parts and a few changes,
    where hashing every part's ``id`` cost more than the probe (1.4 ms at 7,800 parts,
    measured). A part of ``new`` is in a run only when it equals the part across from it, so
    the answer is right whatever the order; the order only keeps it short. None when more than
    ``limit`` parts of either list are outside the runs (lay out again)."""
    runs: list[tuple[int, int, int]] = []
    fresh: list[int] = []
    i = j = gone = 0
    while i < len(new) and j < len(old):
        k = _shared_run(old, j, new, i)
        if k:
            runs.append((j, i, k))
            i, j = i + k, j + k
            continue
        a, b = new[i].name, old[j].name
        if a <= b:  # a part added (or another one under the same name): fresh
            fresh.append(i)
            i += 1
        if a >= b:  # a part gone
            j += 1
            gone += 1
        if len(fresh) > limit or gone > limit:
            return None
    fresh.extend(range(i, len(new)))
    return Alignment(runs, fresh) if len(fresh) <= limit else None


def _shared_run(old: list[Any], j: int, new: list[Any], i: int) -> int:
    """How many parts from ``old[j]`` and ``new[i]`` on are equal, pair by pair: slices
    compared whole, doubling while they match, then halved down to the first that differs."""
    n = min(len(old) - j, len(new) - i)
    if (
        n and old[j] is not new[i] and old[j] != new[i]
    ):  # stepping past unrelated parts (another table's layout) stays cheap
        return 0
    k, step = 0, _RUN
    while k < n:
        b = min(step, n - k)
        if old[j + k : j + k + b] == new[i + k : i + k + b]:
            k, step = k + b, step * 2
            continue
        lo, hi = 0, b  # the first lo pairs match, the first hi do not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if old[j + k : j + k + mid] == new[i + k : i + k + mid]:
                lo = mid
            else:
                hi = mid
        return k + lo
    return k


_EXACT_KEY_BYTES = 120  # what a listed key holds in memory, about (its tuple, its value, a set slot)


def _held_bytes(item: tuple[Any, ...]) -> int:
    """What a parsed summary (``SummaryProbes._items``) holds: its filter bits and listed keys."""
    bits, exact = item[3], item[4]
    return (0 if bits is None else len(bits)) + (0 if exact is None else _EXACT_KEY_BYTES * len(exact[1]))


_ONE_IF = [bytes(1 if x & (1 << b) else 0 for x in range(256)) for b in range(8)]  # byte -> 0/1 by bit b
# Rows left, per bit still to test, at or below which :meth:`_Group.rows_with` tests a key's
# remaining bits in those rows alone (a list comprehension per bit) instead of a strided slice of
# every part's filter per bit: at 1,000 parts of 24-bit filters it slices 5 of the 11 bits (the
# probe 15 us against 25 in a loop, 24 against 46 with the buffer out of cache; 4 or 8 here: no better).
_FEW_ROWS = 2
# A visible set that is a laid-out one but for a few parts (a commit since, a transaction's own
# parts) probes that layout and the few as a set of their own rather than lay out the set again
# (~3 ms at 1,000 parts, measured: the update-mode write's read of its keys' current values paid
# it once per commit), up to an eighth of the set; at most _FEW_FRESH are laid out apart (not
# kept). Every kept layout of the set's table whose size allows it is tried, the last used first.
_FEW_FRESH = 16


def _table_of(metas: list[Any]) -> Any:
    """The table of a visible set (its first part's ``table``; None for parts without one)."""
    return getattr(metas[0], "table", None) if metas else None


class _Group:
    """The filters of one shape in a layout: ``bits``, each part's ``m / 8`` bytes one after
    the other; ``positions``: each row's place in the visible set."""

    __slots__ = ("bits", "positions", "stride")

    def __init__(self, stride: int) -> None:
        self.stride = stride
        self.bits: Any = []
        self.positions: list[int] = []

    def rows_with(self, hashed: tuple[int, int], m: int, k: int) -> Iterable[int]:
        """The rows whose filter has every bit of a key's ``(h1, h2)``: the AND over its first
        bits of one 0/1 byte per row (a strided slice through ``translate``, read as ints), and
        once few rows are left (:data:`_FEW_ROWS` per bit to go) the rest of its bits looked up
        in those rows alone: each strided slice touches a byte of every part's filter, a
        thousand cache lines of a 3 MB buffer at the bench's 1,000 parts."""
        n, bits, stride = len(self.positions), self.bits, self.stride
        acc = -1
        a, b = hashed[0] % m, hashed[1] % m
        left = k
        while left:
            acc &= int.from_bytes(bits[a >> 3 :: stride].translate(_ONE_IF[a & 7]), "little")
            if not acc:
                return ()
            a = (a + b) % m
            left -= 1
            if left and acc.bit_count() <= _FEW_ROWS * left:
                break
        marks = acc.to_bytes(n, "little")
        out, at = [], marks.find(1)
        while at >= 0:
            out.append(at)
            at = marks.find(1, at + 1)
        for _ in range(left):
            byte, bit = a >> 3, 1 << (a & 7)
            out = [r for r in out if bits[r * stride + byte] & bit]
            a = (a + b) % m
        return out


class _Layout:
    """A visible set laid out for :class:`SummaryProbes`: ``groups`` by filter shape, ``ranges``
    (each part's key range, ``(None, None)`` for none), ``always`` (parts with no summary: kept),
    ``by_range`` (parts whose filter is all ones: their range decides), ``exact`` (each part's
    listed versions, :func:`exact_keys`, or None: what decides among the parts a filter keeps)
    and ``listed``: the parts that list their versions, by key (per key width, with all their
    positions), looked up instead of probed: a small part's 256-bit filter costs a strided slice
    per bit like a big one's, and a table of thousands of small parts (update-mode commits with
    no merge between) spent most of a point read's probe there (measured: 16 % of the replica's
    busy time, 6,000 parts)."""

    __slots__ = ("always", "by_range", "exact", "groups", "has_mix", "listed", "metas", "nbytes", "ranges", "table")

    def __init__(self, metas: list[Any]) -> None:
        self.metas = metas
        self.table = _table_of(metas)
        self.groups: dict[tuple[bool, int, int], _Group] = {}
        self.ranges: list[tuple[Any, Any]] = []
        self.always: list[int] = []
        self.by_range: list[tuple[int, bool]] = []
        self.exact: list[tuple[int, frozenset[tuple[Any, ...]]] | None] = []
        self.listed: dict[int, _Listed] = {}
        self.has_mix = False
        self.nbytes = 0

    @classmethod
    def build(cls, metas: list[Any], items: Mapping[str, tuple[Any, ...]], parse: Any) -> _Layout:
        """The layout of ``metas``, from the parsed summaries ``items`` (``parse(name,
        checksum, summary)`` for a part not there, or there with another checksum): one short
        loop, as a changed set (a commit between two lookups) is laid out again."""
        out = cls(list(metas))
        groups, always, by_range = out.groups, out.always, out.by_range
        add_range, add_exact = out.ranges.append, out.exact.append
        no_range = (None, None)
        for at, meta in enumerate(metas):
            summary = meta.key_summary
            if summary is None:
                add_range(no_range)
                add_exact(None)
                always.append(at)
                continue
            got = items.get(meta.name)
            if got is None or got[0] != meta.checksum:
                got = parse(meta.name, meta.checksum, summary)
            _, bounds, shape, bits, exact = got
            add_range(bounds)
            add_exact(exact)
            if exact is not None:
                out.add_listed(at, exact)
                continue
            if bits is None:
                by_range.append((at, shape[0]))
                continue
            group = groups.get(shape)
            if group is None:
                group = groups[shape] = _Group(shape[1] // 8)
            group.bits.append(bits)
            group.positions.append(at)
        for group in out.groups.values():
            group.bits = b"".join(group.bits)
            out.nbytes += len(group.bits)
        out.nbytes += _EXACT_KEY_BYTES * sum(len(listed.last) for listed in out.listed.values())
        out.has_mix = any(mix for mix, _, _ in groups) or any(mix for _, mix in by_range)
        return out

    def add_listed(self, at: int, exact: tuple[int, frozenset[tuple[Any, ...]]]) -> None:
        """Index the part at ``at`` by the keys it lists (:func:`exact_keys`)."""
        width, keys = exact
        listed = self.listed.get(width)
        if listed is None:
            listed = self.listed[width] = _Listed()
        listed.add(at, keys)


class _Listed:
    """The parts of one key width in a layout that list their versions, by key: ``last`` the
    position of the last part listing a key (filled by C calls: a layout of thousands of small
    parts is built again every few dozen commits, and a loop per key cost 13 us a part),
    ``more`` every position of a key listed by more than one part (a key written again
    between merges), ``positions`` all the parts'."""

    __slots__ = ("last", "more", "positions")

    def __init__(self) -> None:
        self.last: dict[tuple[Any, ...], int] = {}
        self.more: dict[tuple[Any, ...], list[int]] = {}
        self.positions: list[int] = []

    def add(self, at: int, keys: frozenset[tuple[Any, ...]]) -> None:
        self.positions.append(at)
        last = self.last
        if not last.keys().isdisjoint(keys):  # a key written again between merges (no set built else)
            for key in last.keys() & keys:
                self.more.setdefault(key, [last[key]]).append(at)
        last.update(dict.fromkeys(keys, at))

    def holding(self, key: tuple[Any, ...]) -> Iterable[int]:
        """The positions of the parts that list ``key``."""
        more = self.more.get(key)
        if more is not None:
            return more
        at = self.last.get(key)
        return () if at is None else (at,)


def apart_in_key_order(
    summaries: Sequence[Mapping[str, Any] | None], schema: pa.Schema, primary_key: Sequence[str]
) -> list[int] | None:
    """The order (indices into ``summaries``, parts' key summaries) in which parts whose rows
    are each in key order give all their rows in key order, one part after another: by their
    least key, when their key ranges do not meet. None when that cannot be known: a part with no
    byte ``ranges`` (written before parts were sorted by key, or not by this writer's code) or
    no key range, a key column not of an integer or string type (JSON's order of other values
    is not Arrow's; a string's is, code point order being UTF-8's byte order), or two ranges
    that meet. A bounded range (:func:`bound_summary`) only widens, so this stays safe."""
    if not all(of_kinds(schema.field(k).type, _ORDERED_KINDS) for k in primary_key):
        return None
    spans = []
    for i, s in enumerate(summaries):
        if not isinstance(s, Mapping) or "ranges" not in s:
            return None
        lo, hi = s.get("lo"), s.get("hi")
        if not (_plain_key(lo, primary_key) and _plain_key(hi, primary_key)):
            return None
        spans.append((tuple(lo), tuple(hi), i))  # type: ignore[arg-type]
    spans.sort()
    if any(not a[1] < b[0] for a, b in zip(spans, spans[1:])):
        return None
    return [i for _, _, i in spans]


_ORDERED_KINDS = (pa.types.is_integer, pa.types.is_string, pa.types.is_large_string)


def _plain_key(key: Any, primary_key: Sequence[str]) -> bool:
    return (
        isinstance(key, list)
        and len(key) == len(primary_key)
        and all(isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)) for v in key)
    )


def point_summary(summary: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A key summary slimmed for a point read's answer (``visible`` with ``slim``): the replica
    has already pruned with the filter, so the reader needs only the key range and the byte
    ``ranges`` it reads by; the filter, up to 64 KiB of bits, becomes one byte of ones (a
    filter that says "maybe" for every key, which :func:`summary_problem` accepts and every
    probe reads as such) and ``exact`` goes."""
    if summary is None:
        return None
    out: dict[str, Any] = {"lo": summary.get("lo"), "hi": summary.get("hi"), **_LEGACY_ONES}
    if "ranges" in summary:
        out["ranges"] = summary["ranges"]
    return out


def point_keys(
    where: Any, schema: pa.Schema, primary_key: Sequence[str], limit: int = 1024, exact: bool = False
) -> list[tuple[Any, ...]] | None:
    """The keys a filter can match, when it fixes every primary key column by equality (an AND
    of ``column == literal`` terms, maybe with other terms, or an OR of such): ``k == 5``,
    ``(a == 1) & (b == "x")``, ``(k == 1) | (k == 2)``. None when it does not (or when in
    doubt, or past ``limit`` keys): then every part may hold a match. The literals are cast to
    the key columns' types (as the comparison does), so the keys are what the part data holds.
    ``exact``: only when the filter says nothing else (every term is ``key column == literal``,
    the key columns ints, strings, bools or binary): then it keeps exactly the rows whose key is one of those, so a
    point read needs neither to check the expression again nor to apply it after the fold."""
    from coordinator.core.tabledata import (  # the pruning parser: one reading of filters
        UNSUPPORTED,
        compile_filter,
    )

    if where is None:
        return None
    tree = compile_filter(where, schema)
    if tree is UNSUPPORTED:
        return None
    pk = set(primary_key)
    found = _assignments(tree, schema, pk, limit, exact)
    if found is None or len(found) > limit or any(len(a) != len(pk) for a in found):
        return None
    return sorted({tuple(a[c] for c in primary_key) for a in found}, key=lambda k: tuple((v is None, v) for v in k))


def _assignments(
    node: tuple[Any, ...], schema: pa.Schema, pk: set[str], limit: int, exact: bool
) -> list[dict[str, Any]] | None:
    """Alternatives of a compiled filter ``node`` (see ``point_keys``), each fixing some key
    columns; None: not understood."""
    if node[0] == "in":  # one alternative per value
        out: list[dict[str, Any]] = []
        for v in node[2]:
            alternative = _term_assignment(("cmp", node[1], "==", v, False), schema, pk, exact)
            if alternative is None:
                return None
            out += alternative
        return out
    if node[0] not in ("and", "or"):
        return _term_assignment(node, schema, pk, exact)
    left, right = _assignments(node[1], schema, pk, limit, exact), _assignments(node[2], schema, pk, limit, exact)
    if left is None or right is None:
        return None
    if node[0] == "or":
        return left + right
    out = []
    for a in left:
        for b in right:
            if all(a[c] == b[c] for c in a.keys() & b.keys()):
                out.append({**a, **b})
    return out if len(out) <= limit else None


def _term_assignment(
    node: tuple[Any, ...], schema: pa.Schema, pk: set[str], exact: bool
) -> list[dict[str, Any]] | None:
    """The key column one comparison term fixes, as one alternative; ``[{}]`` when it fixes none
    (it only narrows further); None: not understood."""
    _, (kind, ref), op, value, _flipped = node
    name = schema.names[int(ref)] if kind == "path" and int(ref) < len(schema) else ref
    if op != "==" or name not in pk:
        return None if exact else [{}]  # no constraint on the key (it only narrows further)
    t = schema.field(name).type
    if exact and not mix64_type(t):
        return None  # floats (-0.0 == 0.0, NaN), times: left to the expression
    if type(value) is int and -(2**63) <= value < 2**63 and t == pa.int64():
        return [{name: value}]  # an int64 key's int: the cast below gives it back as is
    try:
        cast = pa.scalar(value).cast(t, safe=True).as_py()
    except (pa.ArrowException, TypeError, ValueError):
        return None
    if cast != value or type(cast) is not type(value):
        return None  # not a lossless cast: leave it to the filter after the fold
    return [{name: cast}]


def point_hint(
    where: Any, schema: pa.Schema, primary_key: Sequence[str], found: list[tuple[Any, ...]] | None = None
) -> dict[str, Any] | None:
    """What a reader sends with its ``visible`` request when ``where`` fixes whole keys
    (:func:`point_keys`), so the replica lists only the parts that may hold them:
    ``{"key_columns": [...], "keys": [[...], ...]}``; None when it does not (or the values are
    not JSON scalars). ``found``: ``point_keys(where, ..., exact=True)``, when the caller has it
    (those keys are what ``point_keys`` finds too: a filter of key equalities alone)."""
    if found is None:
        found = point_keys(where, schema, primary_key)
    if found is None or not all(isinstance(v, _ORDERED + (float,)) for k in found for v in k):
        return None
    return {"key_columns": list(primary_key), "keys": [list(k) for k in found]}


def hint_hashes(
    hint: Any, schema: pa.Schema, primary_key: Sequence[str]
) -> dict[tuple[Any, ...], tuple[int, int]] | None:
    """The keys of a reader's :func:`point_hint` as the table at the read's snapshot holds them
    (``key -> key_hash``), or None to prune nothing: the hint was made for other key columns (a
    definition the reader had cached), or a value is not exactly one of the column's. Each
    value is cast to its column's type and must come back unchanged, so the keys are exactly
    those the reader's filter can match."""
    if hint is None:
        return None
    if not (
        isinstance(hint, dict)
        and isinstance(hint.get("key_columns"), list)
        and isinstance(hint.get("keys"), list)
        and all(isinstance(k, list) for k in hint["keys"])
    ):
        raise InvalidInput(f"a point hint must be {{'key_columns': [...], 'keys': [[...], ...]}}, not {quote(hint)}")
    if hint["key_columns"] != list(primary_key) or not primary_key:
        return None
    out = {}
    types = [schema.field(c).type for c in primary_key]
    for key in hint["keys"]:
        if len(key) != len(primary_key):
            return None
        if len(key) == 1 and type(key[0]) is int and types[0] == pa.int64() and -(2**63) <= key[0] < 2**63:
            out[(key[0],)] = key_hash((key[0],))  # an int64 key: exactly one of the column's (no cast)
            continue
        try:
            cast = tuple(pa.scalar(v).cast(t, safe=True).as_py() for v, t in zip(key, types))
        except (pa.ArrowException, TypeError, ValueError, OverflowError):  # an int past 64 bits: OverflowError
            return None
        if cast != tuple(key) or any(type(a) is not type(b) for a, b in zip(cast, key)):
            return None
        out[cast] = key_hash(cast)
    return out


def rows_of_keys(data: pa.Table, primary_key: Sequence[str], wanted: Sequence[tuple[Any, ...]]) -> pa.Table:
    """The rows of ``data`` whose key is one of ``wanted``: a boolean mask from ``equal`` or ``is_in`` for a
    one-column key (no Acero plan, whose fixed cost a point read would pay per part), else
    :func:`key_filter`."""
    import pyarrow.compute as pc

    if len(primary_key) != 1:
        return data.filter(key_filter(data.schema, primary_key, wanted))
    k = primary_key[0]
    col = data.column(k)
    if len(wanted) == 1:  # a lookup of one key: a comparison, no hash set built (a third of the time)
        return data.filter(pc.equal(col, pa.scalar(wanted[0][0], col.type)))
    return data.filter(pc.is_in(col, value_set=pa.array([key[0] for key in wanted], col.type)))


def key_filter(schema: pa.Schema, primary_key: Sequence[str], wanted: Sequence[tuple[Any, ...]]) -> Any:
    """A filter expression keeping the rows of the keys ``wanted`` (none if empty)."""
    import pyarrow.compute as pc

    if len(primary_key) == 1:
        k = primary_key[0]
        return pc.field(k).isin(pa.array([key[0] for key in wanted], schema.field(k).type))
    expr = pc.scalar(False)
    for key in wanted:
        term = pc.scalar(True)
        for c, v in zip(primary_key, key):
            term = term & (pc.field(c) == v)
        expr = expr | term
    return expr
