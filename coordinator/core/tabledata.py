"""Pure Arrow transformations shared by the client library and the replicas.

Nothing here touches storage, ZooKeeper or transactions: names and schemas are validated,
incoming data is conformed to a table's schema, rows are split into partitions, and delete and
update predicates are checked, shipped (as Substrait) and applied. A replica that redoes a
mutation at commit time calls the same functions the client did, so both agree on the result.
"""

from __future__ import annotations

import base64
import binascii
import datetime as _dt
import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import quote as url_quote

import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc

from coordinator.core.errors import CorruptMetadata, InvalidInput, clip, quote

# What evaluating a user expression against a schema raises when it does not fit.
_EXPRESSION_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowIndexError)
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_PATH_CHARS = (("/", "'/'"), ("..", "'..'"), ("\\", "'\\\\'"), (":", "':'"), ("\x00", "NUL"))
NULL_PARTITION_DIR = "__HIVE_DEFAULT_PARTITION__"
_MAX_DIR_VALUE = 120


def validate_name(kind: str, name: str) -> str:
    """Return ``name`` if it is a safe table/column name; names become paths and znode names."""
    if not isinstance(name, str):
        raise InvalidInput(f"{kind} name {quote(name)} must be a string, not {type(name).__name__}", name=repr(name))
    if _NAME_RE.match(name):
        return name
    found = [label for ch, label in _PATH_CHARS if ch in name]
    if any(c.isspace() for c in name):
        found.append("whitespace")
    if found:
        reason = f"contains path character(s) {', '.join(found)}"
    elif name == "":
        reason = "is empty"
    elif len(name) > 128:
        reason = f"is longer than 128 characters ({len(name)})"
    elif not (name[0].isascii() and (name[0].isalpha() or name[0] == "_")):
        reason = "must start with a letter or '_'"
    else:
        bad = sorted({c for c in name if not (c.isascii() and (c.isalnum() or c == "_"))})
        reason = f"contains invalid character(s) {quote(bad)}"
    raise InvalidInput(f"{kind} name {quote(name)} {reason}; allowed: ^[A-Za-z_][A-Za-z0-9_]{{0,127}}$", name=name)


# ---------------------------------------------------------------------------------------------
# Schemas


def schema_to_json(schema: pa.Schema) -> str:
    """Base64 of the Arrow IPC schema: exact (types, nullability, metadata) and JSON-safe."""
    if not isinstance(schema, pa.Schema):
        raise InvalidInput(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def schema_from_json(text: str) -> pa.Schema:
    """Inverse of :func:`schema_to_json`; CorruptMetadata when ``text`` is not one."""
    if not isinstance(text, str):
        raise CorruptMetadata(f"serialized schema must be a string, got {type(text).__name__}")
    try:
        raw = base64.b64decode(text.strip(), validate=True)
        return pa.ipc.read_schema(pa.py_buffer(raw))
    except (binascii.Error, ValueError, pa.ArrowException) as exc:
        raise CorruptMetadata(f"serialized schema does not parse: {type(exc).__name__}: {exc}") from None


TypeKind = Callable[[pa.DataType], bool]  # one of pyarrow.types' is_... checks

PARTITION_KINDS: tuple[TypeKind, ...] = (
    pa.types.is_integer,
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_date,
    pa.types.is_boolean,
)  # the types a partition column may have


def of_kinds(t: pa.DataType, kinds: Iterable[TypeKind]) -> bool:
    """Whether type ``t`` is of one of ``kinds`` (a list of the types some job takes)."""
    return any(bool(kind(t)) for kind in kinds)


CHANGE_COLUMNS = ("_change", "_csn")  # what changes() adds to a table's columns: no table may have them


def validate_schema(schema: pa.Schema, partition_by: list[str], primary_key: list[str]) -> None:
    """Reject schemas a table cannot have, naming each problem."""
    if not isinstance(schema, pa.Schema):
        raise InvalidInput(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
    if len(schema) == 0:
        raise InvalidInput("schema has no columns")
    names = schema.names  # a new list at every access: once (a table may have thousands of columns)
    for name in names:
        validate_name("column", name)
    dups = sorted(n for n, k in Counter(names).items() if k > 1)
    if dups:
        raise InvalidInput(f"schema has duplicate column(s) {dups}")
    known = set(names)
    reserved = [n for n in CHANGE_COLUMNS if n in known]
    if reserved:
        raise InvalidInput(
            f"column name(s) {reserved} are reserved: incremental reads (changes) add them to a table's columns"
        )
    for kind, cols in (("partition", partition_by), ("primary key", primary_key)):
        if isinstance(cols, str) or not all(isinstance(c, str) for c in cols):
            raise InvalidInput(f"{kind} columns must be a list of column names, got {quote(cols)}")
        missing = [c for c in cols if c not in known]
        if missing:
            raise InvalidInput(f"{kind} column(s) {quote(missing)} not in schema (columns: {clip(schema.names)})")
        again = sorted({c for c in cols if list(cols).count(c) > 1})
        if again:
            raise InvalidInput(f"{kind} column(s) {again} listed more than once")
    bad = [f"{c} ({schema.field(c).type})" for c in partition_by if not of_kinds(schema.field(c).type, PARTITION_KINDS)]
    if bad:
        raise InvalidInput(f"partition column(s) {bad} must be of an integer, string, date or bool type")


# ---------------------------------------------------------------------------------------------
# Conforming data to a table


_STRINGS = ("string", "large_string", "string_view")
_BINARIES = ("binary", "large_binary", "binary_view")
_TS_UNITS = {"s": 0, "ms": 1, "us": 2, "ns": 3}


def _lossless(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether every value of ``src`` converts to ``dst`` without loss of meaning."""
    if src.equals(dst) or pa.types.is_null(src):
        return True
    if pa.types.is_dictionary(src):
        return _lossless(src.value_type, dst)
    if str(src) in _STRINGS and str(dst) in _STRINGS:
        return True
    if str(src) in _BINARIES and str(dst) in _BINARIES:
        return True
    if pa.types.is_integer(src) and pa.types.is_integer(dst):
        if pa.types.is_signed_integer(src):
            return bool(pa.types.is_signed_integer(dst) and dst.bit_width >= src.bit_width)
        return bool(
            dst.bit_width > src.bit_width or (pa.types.is_unsigned_integer(dst) and dst.bit_width == src.bit_width)
        )
    if pa.types.is_integer(src) and pa.types.is_floating(dst):
        return bool(src.bit_width <= {16: 8, 32: 16, 64: 32}[dst.bit_width])
    if pa.types.is_floating(src) and pa.types.is_floating(dst):
        return bool(dst.bit_width >= src.bit_width)
    if pa.types.is_date32(src) and pa.types.is_date64(dst):
        return True
    if pa.types.is_timestamp(src) and pa.types.is_timestamp(dst):
        return src.tz == dst.tz and _TS_UNITS[dst.unit] >= _TS_UNITS[src.unit]
    if (pa.types.is_list(src) or pa.types.is_large_list(src)) and (
        pa.types.is_list(dst) or pa.types.is_large_list(dst)
    ):
        return _lossless(src.value_type, dst.value_type)
    return False


def conform(
    schema: pa.Schema,
    data: pa.Table,
    table: str,
    *,
    what: str = "insert into",
    required: Sequence[str] = (),
) -> pa.Table:
    """Return ``data`` with exactly the table's columns, order and types, or raise InvalidInput
    listing every offending column, so a client learns all that is wrong at once.

    A nullable column that ``data`` lacks is filled with typed nulls (as ``INSERT ... BY NAME``
    does), so that producers written before an ``alter_table`` added it keep working; absent
    non-nullable columns, and absent ``required`` ones (partition and key columns: they decide
    where a row lives), are refused."""
    prefix = f"{what} {quote(table)}"
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if not isinstance(data, pa.Table):
        raise InvalidInput(f"{prefix}: data must be a pyarrow.Table, got {type(data).__name__}", table=table)
    if data.schema.equals(schema, check_metadata=True) and not any(
        not f.nullable and c.null_count for f, c in zip(schema, data.columns)
    ):
        return data  # already the table's columns, order and types, nulls only where allowed
    problems = _shape_problems(schema, data, required)
    if problems:
        raise InvalidInput(f"{prefix}: {'; '.join(problems)}", table=table)
    columns = _conformed_columns(schema, data, problems)
    if problems:
        raise InvalidInput(f"{prefix}: {'; '.join(problems)}", table=table)
    return pa.Table.from_arrays(columns, schema=schema)


def _shape_problems(schema: pa.Schema, data: pa.Table, required: Sequence[str]) -> list[str]:
    """What keeps ``data``'s columns from being the table's (``conform``): duplicate, missing,
    unexpected columns, and types that do not convert without loss."""
    names = data.column_names
    problems: list[str] = []
    dups = sorted(n for n, k in Counter(names).items() if k > 1)
    if dups:
        problems.append(f"duplicate column(s) {quote(dups)}")
    have, want = set(names), schema.names
    wanted = set(want)
    needed = set(required)
    missing = [f.name for f in schema if f.name not in have and (not f.nullable or f.name in needed)]
    extra = [n for n in names if n not in wanted]
    if missing:
        problems.append(f"missing column(s) {quote(missing)}")
    if extra:
        problems.append(f"unexpected column(s) {quote(extra)}")
    dup_set = set(dups)
    for field in schema:
        if field.name not in have or field.name in dup_set:
            continue
        src = data.schema.field(field.name).type
        if not _lossless(src, field.type):
            problems.append(f"column {quote(field.name)} is {src}, table has {field.type}")
    return problems


def _conformed_columns(schema: pa.Schema, data: pa.Table, problems: list[str]) -> list[pa.Array | pa.ChunkedArray]:
    """``data``'s columns cast to the table's types in its order, typed nulls for the nullable
    ones it lacks; what cannot be converted, and nulls in a not-null column, go to ``problems``."""
    have = set(data.column_names)
    columns: list[pa.Array | pa.ChunkedArray] = []
    for field in schema:
        if field.name not in have:
            columns.append(pa.nulls(data.num_rows, field.type))
            continue
        col = data.column(field.name)
        if not col.type.equals(field.type):
            try:
                col = col.cast(field.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                problems.append(f"column {quote(field.name)} cannot be converted to {field.type}: {clip(exc)}")
                continue
        if not field.nullable and col.null_count:
            problems.append(f"column {quote(field.name)} is not nullable but has {col.null_count} null(s)")
        columns.append(col)
    return columns


# ---------------------------------------------------------------------------------------------
# Partitions


def json_scalar(value: Any) -> Any:
    """A partition value or statistic as a JSON-safe scalar (dates and times as ISO strings)."""
    if isinstance(value, (_dt.date, _dt.datetime, _dt.time)):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidInput(f"value {quote(value)} is not a finite number")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise InvalidInput(f"value {quote(value)} of type {type(value).__name__} cannot be a partition value")


# A partition value is bounded (docs/rules.md#partition-values): it travels in every part's
# metadata (each log entry, WAL record, checkpoint) and names a conflict target. A partition is a
# date, a region, a tenant: ClickHouse's partition ids and Hive's directory names are short,
# S3 keys end at 1024 bytes. 1 KiB per value keeps every such value and refuses the mistakes
# (a message body, a JSON document) that would otherwise be copied into every record.
DEFAULT_PARTITION_VALUE_BYTES = 1024
PARTITION_VALUE_SETTING = "max_partition_value_bytes"  # the replica setting (replicas/settings.py)


def partition_value_bytes(value: Any) -> int:
    """A partition value's size as its bound counts it: a string's UTF-8 bytes, any other
    scalar's text (an integer's digits, a date's ISO form); null is 0."""
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    return len(str(json_scalar(value)))


def partition_too_long(table: str, column: str, size: int, limit: int, value: Any) -> InvalidInput:
    """The refusal of a partition value over ``limit`` bytes, naming the column and the limit."""
    return InvalidInput(
        f"partition column {quote(column)} of table {quote(table)}: a value of {size} bytes "
        f"({quote(value, 40)}) is longer than the limit of {limit} bytes (replica setting "
        f"{PARTITION_VALUE_SETTING}); partition by a shorter value (a date, a region, a hash of it)",
        table=table,
        column=column,
        limit=limit,
        bytes=size,
    )


def check_partition_values(table: str, partition_by: Sequence[str], partition: Sequence[Any], limit: int) -> None:
    """InvalidInput (:func:`partition_too_long`) when a value of ``partition`` is over ``limit`` bytes."""
    for column, value in zip(partition_by, partition):
        size = partition_value_bytes(value)
        if size > limit:
            raise partition_too_long(table, column, size, limit, value)


def check_partition_columns(data: pa.Table, partition_by: Sequence[str], limit: int, table: str) -> None:
    """:func:`check_partition_values` over every row of ``data`` at once (vectorised: a string
    column's longest value; other partition types are never longer than 64 bytes)."""
    for column in partition_by:
        col = data.column(column)
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        if str(col.type) not in _STRINGS or data.num_rows == 0:
            continue
        lengths = pc.binary_length(col)
        longest = pc.max(lengths).as_py()
        if longest is not None and longest > limit:
            value = col[pc.index(lengths, longest).as_py()].as_py()
            raise partition_too_long(table, column, longest, limit, value)


def split_by_partition(
    data: pa.Table, partition_by: list[str], limit: int | None = None, table: str = ""
) -> list[tuple[tuple[Any, ...], pa.Table]]:
    """Group rows by their partition values (vectorised; groups in order of first appearance,
    rows in their original order). Null is a partition value of its own. ``limit``: refuse a
    value over that many bytes first (:func:`check_partition_columns`, naming ``table``)."""
    if data.num_rows == 0:
        return []
    if not partition_by:
        return [((), data)]
    missing = [c for c in partition_by if c not in data.column_names]
    if missing:
        raise InvalidInput(f"partition column(s) {quote(missing)} not in data")
    if limit is not None:
        check_partition_columns(data, partition_by, limit, table)
    index_col = "__mergetxn_row__"
    keys = pa.table(
        {f"k{i}": data.column(c) for i, c in enumerate(partition_by)}
        | {index_col: pa.array(range(data.num_rows), pa.int64())}
    )
    key_names = [f"k{i}" for i in range(len(partition_by))]
    grouped = keys.group_by(key_names, use_threads=False).aggregate([(index_col, "list")])
    lists = grouped.column(f"{index_col}_list")
    values = [grouped.column(k).to_pylist() for k in key_names]
    out = []
    for g in range(grouped.num_rows):
        partition = tuple(json_scalar(v[g]) for v in values)
        indices = lists[g].values
        part = data if len(indices) == data.num_rows else data.take(indices)
        out.append((partition, part))
    return out


def partition_key(partition: tuple[Any, ...]) -> str:
    """Canonical compact JSON of a partition tuple: equal partitions give equal keys."""
    if not partition and isinstance(partition, (tuple, list)):
        return "[]"  # every part of an unpartitioned table: the commit path asks several times
    try:
        return json.dumps(
            [json_scalar(v) for v in partition],
            separators=(",", ":"),
            ensure_ascii=True,
            allow_nan=False,
        )
    except TypeError:
        raise InvalidInput(f"partition {quote(partition)} must be a tuple of scalars") from None


def partition_from_key(key: str) -> tuple[Any, ...]:
    """Inverse of :func:`partition_key`; CorruptMetadata for anything else."""
    try:
        values = json.loads(key)
    except (TypeError, ValueError) as exc:
        raise CorruptMetadata(f"partition key {quote(key)} is not JSON: {clip(exc)}") from None
    if not isinstance(values, list) or not all(v is None or isinstance(v, (bool, int, float, str)) for v in values):
        raise CorruptMetadata(f"partition key {quote(key)} is not a JSON list of scalars")
    return tuple(values)


def _dir_value(value: Any) -> str:
    if value is None:
        return NULL_PARTITION_DIR
    if isinstance(value, bool):
        text = "true" if value else "false"
    else:
        text = str(json_scalar(value))
    encoded = url_quote(text, safe="")
    if len(encoded) > _MAX_DIR_VALUE:
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
        encoded = f"{encoded[: _MAX_DIR_VALUE - 17].rstrip('%0123456789ABCDEF')}~{digest}"
    return encoded


def partition_dir(partition_by: list[str], partition: tuple[Any, ...]) -> str:
    """Hive-style ``col=value/...`` (values percent-encoded) or ``_`` when unpartitioned.
    Only a grouping for humans and tools; the part's metadata holds the exact values."""
    if len(partition_by) != len(partition):
        raise InvalidInput(f"partition {quote(partition)} does not match partition columns {list(partition_by)}")
    if not partition_by:
        return "_"
    return "/".join(f"{validate_name('column', c)}={_dir_value(v)}" for c, v in zip(partition_by, partition))


# ---------------------------------------------------------------------------------------------
# Expressions


_MISSING_FIELD_RE = re.compile(r"No match for FieldRef\.Name\((.*?)\) in ")


def _empty(schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist([], schema=schema)


def _missing_fields(expr: pc.Expression, schema: pa.Schema) -> list[str]:
    """Names ``expr`` refers to that ``schema`` lacks: bind against a schema that gains each
    missing field (typed null) until binding stops failing on a missing field."""
    missing: list[str] = []
    scratch = schema
    for _ in range(64):
        try:
            acero.Declaration.from_sequence(
                [
                    acero.Declaration("table_source", acero.TableSourceNodeOptions(_empty(scratch))),
                    acero.Declaration("project", acero.ProjectNodeOptions([expr], ["x"])),
                ]
            ).to_table(use_threads=False)
            break
        except pa.ArrowInvalid as exc:
            m = _MISSING_FIELD_RE.search(str(exc))
            if not m or m.group(1) in missing:
                break
            missing.append(m.group(1))
            scratch = scratch.append(pa.field(m.group(1), pa.null()))
        except pa.ArrowException:
            break
    return missing


def check_expression(expr: pc.Expression, schema: pa.Schema, what: str) -> None:
    """Raise InvalidInput unless ``expr`` is a boolean expression over ``schema``'s columns."""
    if not isinstance(expr, pc.Expression):
        raise InvalidInput(f"{what}: expected a pyarrow.compute.Expression, got {type(expr).__name__}")
    try:
        _empty(schema).filter(expr)
    except _EXPRESSION_ERRORS as exc:
        missing = _missing_fields(expr, schema)
        if missing:
            raise InvalidInput(
                f"{what}: expression {clip(expr)} refers to missing column(s) {quote(missing)} "
                f"(columns: {clip(schema.names)})",
                missing=missing,
            ) from None
        raise InvalidInput(f"{what}: invalid expression {clip(expr)}: {clip(exc)}") from None


def _evaluate(data: pa.Table, exprs: list[pc.Expression]) -> list[pa.ChunkedArray]:
    """Evaluate expressions row by row over ``data``, keeping row order."""
    names = [f"e{i}" for i in range(len(exprs))]
    out = acero.Declaration.from_sequence(
        [
            acero.Declaration("table_source", acero.TableSourceNodeOptions(data)),
            acero.Declaration("project", acero.ProjectNodeOptions(exprs, names)),
        ]
    ).to_table(use_threads=False)
    return [out.column(n) for n in names]


def _translate(what: str, exc: Exception) -> InvalidInput:
    return InvalidInput(f"{what}: {type(exc).__name__}: {clip(exc)}")


def encode_expression(expr: pc.Expression, schema: pa.Schema) -> str:
    """Base64 Substrait of ``expr`` bound to ``schema``: what a replica needs to redo it."""
    if not isinstance(expr, pc.Expression):
        raise InvalidInput(f"expected a pyarrow.compute.Expression, got {type(expr).__name__}")
    try:
        raw = expr.to_substrait(schema)
    except pa.ArrowException as exc:
        missing = _missing_fields(expr, schema)
        if missing:
            raise InvalidInput(
                f"expression {clip(expr)} refers to missing column(s) {quote(missing)}", missing=missing
            ) from None
        raise _translate(f"expression {clip(expr)} cannot be serialized", exc) from None
    return base64.b64encode(bytes(raw)).decode("ascii")


def decode_expression(text: str, schema: pa.Schema) -> pc.Expression:
    """Inverse of :func:`encode_expression`; CorruptMetadata when ``text`` is not one or was
    encoded for columns other than ``schema``'s (field references are positional)."""
    import pyarrow.substrait as pas

    if not isinstance(text, str):
        raise CorruptMetadata(f"encoded expression must be a string, got {type(text).__name__}")
    try:
        raw = base64.b64decode(text, validate=True)
        bound = pas.deserialize_expressions(pa.py_buffer(raw))
    except (binascii.Error, ValueError, pa.ArrowException) as exc:
        raise CorruptMetadata(f"encoded expression does not parse: {type(exc).__name__}: {clip(exc)}") from None
    if len(bound.expressions) != 1:
        raise CorruptMetadata(f"encoded expression holds {len(bound.expressions)} expressions, expected 1")
    enc = bound.schema
    if enc.names != schema.names or not all(a.type.equals(b.type) for a, b in zip(enc, schema)):
        raise CorruptMetadata(f"encoded expression was bound to columns {enc.names}, table has {schema.names}")
    return next(iter(bound.expressions.values()))


def assignments(set_map: dict[str, object], schema: pa.Schema) -> dict[str, pc.Expression]:
    """Turn an UPDATE's ``set`` into expressions typed for their columns, checking each now so a
    bad assignment fails before anything is written."""
    if not isinstance(set_map, dict) or not set_map:
        raise InvalidInput(f"update set must be a non-empty dict of column -> value, got {quote(set_map)}")
    unknown = [c for c in set_map if c not in schema.names]
    if unknown:
        raise InvalidInput(
            f"update set: unknown column(s) {quote(unknown)} (columns: {clip(schema.names)})", missing=unknown
        )
    out: dict[str, pc.Expression] = {}
    for col, value in set_map.items():
        field = schema.field(col)
        if isinstance(value, pc.Expression):
            try:
                (result,) = _evaluate(_empty(schema), [value])
                if not _lossless(result.type, field.type) and not result.type.equals(field.type):
                    pa.array([], result.type).cast(field.type, safe=True)
            except _EXPRESSION_ERRORS as exc:
                missing = _missing_fields(value, schema)
                if missing:
                    raise InvalidInput(
                        f"update set {quote(col)}: expression refers to missing column(s) {quote(missing)}"
                    ) from None
                raise _translate(f"update set {quote(col)}: invalid expression {clip(value)}", exc) from None
            out[col] = value
            continue
        try:
            scalar = value.cast(field.type) if isinstance(value, pa.Scalar) else pa.scalar(value, type=field.type)
        except (
            pa.ArrowInvalid,
            pa.ArrowTypeError,
            pa.ArrowNotImplementedError,
            TypeError,
            ValueError,
            OverflowError,
        ) as exc:
            raise InvalidInput(
                f"update set {quote(col)}: value {quote(value)} does not fit column type {field.type}: {clip(exc)}"
            ) from None
        if not scalar.is_valid and not field.nullable:
            raise InvalidInput(f"update set {quote(col)}: column is not nullable")
        out[col] = pc.scalar(scalar)
    return out


def encode_assignments(assigns: dict[str, pc.Expression], schema: pa.Schema) -> str:
    """JSON object column -> encoded expression."""
    return json.dumps({c: encode_expression(e, schema) for c, e in assigns.items()}, separators=(",", ":"))


def decode_assignments(text: str, schema: pa.Schema) -> dict[str, pc.Expression]:
    """Inverse of :func:`encode_assignments`."""
    try:
        raw = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise CorruptMetadata(f"encoded assignments are not JSON: {clip(exc)}") from None
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise CorruptMetadata("encoded assignments must be a JSON object of column -> string")
    unknown = [c for c in raw if c not in schema.names]
    if unknown:
        raise CorruptMetadata(f"encoded assignments name unknown column(s) {quote(unknown)}")
    return {c: decode_expression(v, schema) for c, v in raw.items()}


def _match_mask(data: pa.Table, where: pc.Expression) -> pa.ChunkedArray:
    """True where ``where`` is true; null counts as no match (SQL semantics)."""
    (mask,) = _evaluate(data, [where])
    if not pa.types.is_boolean(mask.type):
        raise InvalidInput(f"predicate {clip(where)} is {mask.type}, not boolean")
    return pc.fill_null(mask, False)


def apply_delete(data: pa.Table, where: pc.Expression) -> tuple[pa.Table, int]:
    """Rows that survive ``DELETE WHERE where`` and how many were deleted."""
    try:
        mask = _match_mask(data, where)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise _translate(f"delete predicate {clip(where)}", exc) from None
    deleted = pc.sum(mask).as_py() or 0
    if deleted == 0:
        return data, 0
    return data.filter(pc.invert(mask)), deleted


def apply_update(data: pa.Table, where: pc.Expression, assignments: dict[str, pc.Expression]) -> tuple[pa.Table, int]:
    """Rows after ``UPDATE SET assignments WHERE where`` and how many rows matched. New values
    are computed from the old values of the matching rows only (as SQL does), schema unchanged."""
    unknown = [c for c in assignments if c not in data.column_names]
    if unknown:
        raise InvalidInput(f"update set: unknown column(s) {quote(unknown)}")
    cols = list(assignments)
    try:
        mask = _match_mask(data, where)
        updated = pc.sum(mask).as_py() or 0
        if updated == 0:
            return data, 0
        new_values = _evaluate(data.filter(mask), [assignments[c] for c in cols])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise _translate(f"update where {clip(where)}", exc) from None
    flat_mask = mask.combine_chunks()
    columns = {}
    for col, values in zip(cols, new_values):
        field = data.schema.field(col)
        try:
            values = values.cast(field.type, safe=True) if not values.type.equals(field.type) else values
            merged = pc.replace_with_mask(data.column(col).combine_chunks(), flat_mask, values.combine_chunks())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise _translate(f"update set {quote(col)}", exc) from None
        if not field.nullable and merged.null_count:
            raise InvalidInput(f"update set {quote(col)}: column is not nullable but the new value is null")
        columns[col] = merged
    arrays = [columns.get(name, data.column(name)) for name in data.column_names]
    return pa.Table.from_arrays(arrays, schema=data.schema), updated


# ---------------------------------------------------------------------------------------------
# Statistics bounds


# Column statistics keep at most this many characters (strings) or bytes (binaries) of a min or
# max: a part's metadata travels in every log entry, WAL record, checkpoint and sidecar, so one
# long value must not make it long (Iceberg keeps 16 characters, Parquet's column index 64
# bytes, Delta 32 characters). 64 keeps UUIDs, ISO times, paths and composite ids exact, so
# pruning and the key summaries' exact key lists (coordinator/core/keytables.py) lose nothing on them.
STAT_PREFIX = 64
_MAX_CODE_POINT = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)  # never in UTF-8 (so never in an Arrow string): skipped


def lower_bound(value: Any, limit: int = STAT_PREFIX) -> Any:
    """A min statistic bounded to ``limit`` characters (bytes): its prefix, which orders at or
    before it. Other values are returned as they are."""
    if isinstance(value, (str, bytes)) and len(value) > limit:
        return value[:limit]
    return value


def upper_bound(value: Any, limit: int = STAT_PREFIX) -> Any:
    """A max statistic bounded to ``limit`` characters (bytes): the value itself when short
    enough, else its prefix with the last character (byte) that can grow incremented and what
    follows dropped (as Parquet and Iceberg do), which orders after every value with that prefix.
    None when there is no such bound (the prefix is all U+10FFFF, or all 0xFF): no upper bound.
    Strings order by code point, which is the UTF-8 byte order Arrow compares in; the surrogate
    code points, absent from UTF-8, are stepped over."""
    if not isinstance(value, (str, bytes)) or len(value) <= limit:
        return value
    prefix = value[:limit]
    if isinstance(prefix, bytes):
        for i in range(len(prefix) - 1, -1, -1):
            if prefix[i] < 0xFF:
                return prefix[:i] + bytes([prefix[i] + 1])
        return None
    for i in range(len(prefix) - 1, -1, -1):
        code = ord(prefix[i]) + 1
        if code <= _MAX_CODE_POINT:
            if _SURROGATES[0] <= code <= _SURROGATES[1]:
                code = _SURROGATES[1] + 1
            return prefix[:i] + chr(code)
    return None


def bound_range(lo: Any, hi: Any, limit: int = STAT_PREFIX) -> tuple[Any, Any]:
    """``(lower_bound(lo), upper_bound(hi))``; for a long ``hi`` with no upper bound the pair
    is ``(lo', None)``: values from ``lo'`` up, without end (:func:`may_match` reads it so)."""
    return lower_bound(lo, limit), upper_bound(hi, limit)


def bound_stats(stats: dict[str, Any], limit: int = STAT_PREFIX) -> dict[str, Any]:
    """Column statistics with every min and max bounded (:func:`bound_range`); ``stats`` itself
    when nothing in it is longer than ``limit`` (the usual case, checked without copying)."""
    cut = (str, bytes)
    for rng in stats.values():  # inlined: every decoded part's metadata comes through here
        if rng is None:
            continue
        lo, hi = rng
        if (isinstance(lo, cut) and len(lo) > limit) or (isinstance(hi, cut) and len(hi) > limit):
            break
    else:
        return stats
    return {col: rng if rng is None else bound_range(rng[0], rng[1], limit) for col, rng in stats.items()}


# ---------------------------------------------------------------------------------------------
# Pruning


_CMP = {
    "==": pc.equal,
    "!=": pc.not_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}
_FLIP = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_TOKEN_RE = re.compile(
    r"""\s*(?:
      (?P<lp>\() | (?P<rp>\)) |
      (?P<op>==|!=|<=|>=|<|>) |
      (?P<kw>and|or)(?![A-Za-z0-9_]) |
      FieldPath\((?P<path>\d+)\) |
      (?P<str>"[^"\\]*(?:\\.[^"\\]*)*") |  # unrolled: linear and fast on a long literal
      (?P<date>\d{4}-\d{2}-\d{2})(?![\d:.\sT]\d) |
      (?P<num>-?(?:\d+\.?\d*(?:e[+-]?\d+)?|inf|nan)) |
      (?P<bool>true|false)(?![A-Za-z0-9_]) |
      (?P<name>[A-Za-z_][A-Za-z0-9_]*)
    )""",
    re.VERBOSE,
)


class _Unsupported(Exception):
    pass


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if not m or m.end() == pos:
            raise _Unsupported(text[pos:])
        kind = m.lastgroup
        assert kind is not None
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _parse(tokens: list[tuple[str, str]], i: int) -> tuple[tuple[Any, ...], int]:
    """``(A and B)``, ``(A or B)``, ``(x op literal)``, ``(literal op x)``; nothing else."""
    if tokens[i][0] != "lp":
        raise _Unsupported(tokens[i])
    if tokens[i + 1][0] == "lp":
        left, j = _parse(tokens, i + 1)
        kind, kw = tokens[j]
        if kind != "kw":
            raise _Unsupported(kw)
        right, j = _parse(tokens, j + 1)
        if tokens[j][0] != "rp":
            raise _Unsupported(tokens[j])
        return (kw, left, right), j + 1
    a, op, b, close = tokens[i + 1 : i + 5]
    if op[0] != "op" or close[0] != "rp":
        raise _Unsupported(op)
    if a[0] in ("name", "path"):
        return ("cmp", a, op[1], _literal(b), False), i + 5
    if b[0] in ("name", "path"):
        return ("cmp", b, _FLIP[op[1]], _literal(a), True), i + 5
    raise _Unsupported(a)


def _literal(tok: tuple[str, str]) -> Any:
    kind, text = tok
    if kind == "str":
        return json.loads(text)
    if kind == "date":
        return _dt.date.fromisoformat(text)
    if kind == "bool":
        return text == "true"
    if kind == "num":
        if re.fullmatch(r"-?\d+", text):
            return int(text)
        value = float(text)
        if not math.isfinite(value):
            raise _Unsupported(text)
        return value
    raise _Unsupported(tok)


def _rebuild(node: tuple[Any, ...]) -> pc.Expression:
    if node[0] in ("and", "or"):
        left, right = _rebuild(node[1]), _rebuild(node[2])
        return (left & right) if node[0] == "and" else (left | right)
    _, (kind, ref), op, value, flipped = node
    field = pc.field(int(ref)) if kind == "path" else pc.field(ref)
    scalar = pc.scalar(value)
    if flipped:
        return _CMP[_FLIP[op]](scalar, field)
    return _CMP[op](field, scalar)


_ISO_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_ISO_PREFIX_RE = re.compile(r"^\d{4}-\d{2}-\d{2}")
_EXACT_FLOAT = 2**53


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _comparable(value: Any, lo: Any, hi: Any, typ: pa.DataType | None) -> tuple[Any, Any, Any] | None:
    """Literal and bounds as Python values that order exactly as Arrow orders them, or None when
    that cannot be guaranteed (e.g. timestamps, whose ISO text does not compare like instants)."""
    if typ is not None and not (
        pa.types.is_integer(typ)
        or pa.types.is_floating(typ)
        or pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_date(typ)
        or pa.types.is_boolean(typ)
    ):
        return None
    trio = (value, lo, hi)
    if all(isinstance(v, bool) for v in trio):
        return trio
    if all(_is_number(v) for v in trio):
        mixed = len({type(v) for v in trio}) > 1
        if mixed and any(abs(v) > _EXACT_FLOAT for v in trio):
            return None
        return trio
    if isinstance(value, _dt.date) and not isinstance(value, _dt.datetime):
        bounds_are_dates = all(isinstance(b, str) and _ISO_DATE_RE.match(b) for b in (lo, hi))
        if bounds_are_dates and (typ is None or pa.types.is_date(typ)):
            return (value.isoformat(), lo, hi)
        return None
    if all(isinstance(v, str) for v in trio):
        if typ is not None:
            return trio if (pa.types.is_string(typ) or pa.types.is_large_string(typ)) else None
        if any(_ISO_PREFIX_RE.match(v) for v in trio):
            return None
        return trio
    return None


def _may(node: tuple[Any, ...], ranges: dict[str, tuple[Any, Any] | None], schema: pa.Schema | None) -> bool:
    if node[0] == "and":
        return _may(node[1], ranges, schema) and _may(node[2], ranges, schema)
    if node[0] == "or":
        return _may(node[1], ranges, schema) or _may(node[2], ranges, schema)
    if node[0] == "in":  # a part may hold a row of one of the values; in doubt, it may
        terms = _in_terms(node)
        return terms is None or any(_may(term, ranges, schema) for term in terms)
    return _term_may(node, ranges, schema)


def _in_terms(node: tuple[Any, ...], most: int = 8) -> list[tuple[Any, ...]] | None:
    """What a part's statistics can rule out of an ``("in", column, values)`` node: the terms
    ``column == v``, one per value, when they are at most ``most``, else the range ``column >=
    least and column <= greatest``; None when the values do not order."""
    _, ref, values = node
    if len(values) <= most:
        return [("cmp", ref, "==", v, False) for v in values]
    try:
        lo, hi = min(values), max(values)
    except TypeError:
        return None
    return [("and", ("cmp", ref, ">=", lo, False), ("cmp", ref, "<=", hi, False))]


def _term_may(node: tuple[Any, ...], ranges: dict[str, tuple[Any, Any] | None], schema: pa.Schema | None) -> bool:
    """Whether a part whose columns span ``ranges`` may hold a row matching one comparison term
    (True when in doubt: the column or its type unknown, values not comparable)."""
    _, (kind, ref), op, value, _flipped = node
    if kind == "path":
        if schema is None or int(ref) >= len(schema):
            return True
        ref = schema.names[int(ref)]
    if ref not in ranges:
        return True
    rng = ranges[ref]
    if rng is None:
        return False
    typ = None
    if schema is not None:
        if schema.get_field_index(ref) < 0:
            return True
        typ = schema.field(ref).type
    unbounded = rng[1] is None  # a truncated max with no upper bound: values from lo up
    trio = _comparable(value, rng[0], rng[0] if unbounded else rng[1], typ)
    if trio is None:
        return True
    value, lo, hi = trio
    return _range_may(op, value, lo, hi, unbounded)


def _range_may(op: str, value: Any, lo: Any, hi: Any, unbounded: bool) -> bool:
    """Whether a value in ``[lo, hi]`` (``unbounded``: from ``lo`` up) may compare with
    ``value`` by ``op`` (``op`` taken as ``>=`` when none of the others)."""
    if unbounded:
        return lo < value if op == "<" else lo <= value if op in ("==", "<=") else True
    if op == "==":
        return bool(lo <= value <= hi)
    if op == "!=":
        return not (lo == hi == value)
    if op == "<":
        return bool(lo < value)
    if op == "<=":
        return bool(lo <= value)
    if op == ">":
        return bool(hi > value)
    return bool(hi >= value)


IN_MAX_VALUES = 4096  # a longer value set is left to the filter (no pruning, no point read)


def _is_in(where: pc.Expression) -> tuple[Any, ...]:
    """``column.isin(values)`` (``pc.field(name).isin(values)``, nulls in neither) as ``("in",
    ("name", column), values)``. The values come from the expression's own serialized form (an
    Arrow IPC file whose one row holds the value set as a typed list; the text of the expression
    cuts a set of more than 20 values short), and the expression rebuilt from them must equal
    ``where``; anything else raises _Unsupported."""
    serialized = _serialized(where)
    if not isinstance(serialized, pa.Buffer):
        raise _Unsupported("is_in")
    table = pa.ipc.open_file(serialized).read_all()
    meta = table.schema.metadata or {}
    name = meta.get(b"field_ref", b"").decode("utf-8")
    if set(meta) != {b"call", b"field_ref", b"options", b"end"} or not name or table.num_rows != 1:
        raise _Unsupported("is_in")
    options = table.column(int(meta[b"options"])).combine_chunks()
    values = options.field("value_set")[0].values
    if len(values) > IN_MAX_VALUES or values.null_count:
        raise _Unsupported("is_in")
    if pa.types.is_floating(values.type) and not pc.all(pc.is_finite(values)).as_py():
        raise _Unsupported("is_in")  # NaN and infinities: as in a comparison, left to the filter
    if not pc.field(name).isin(values).equals(where):
        raise _Unsupported("is_in")
    return ("in", ("name", name), values.to_pylist())


def _serialized(where: pc.Expression) -> Any:
    """Arrow's own serialized form of an expression (what pickling it carries)."""
    return where.__reduce__()[1][0]


def _same(rebuilt: pc.Expression, where: pc.Expression, schema: pa.Schema | None) -> bool:
    """Whether the parsed tree is exactly ``where`` (so the textual parse was not fooled).
    Decoded expressions are bound to kernels, so compare them after the same Substrait trip."""
    if rebuilt.equals(where):
        return True
    if schema is None:
        return False
    return bool(decode_expression(encode_expression(rebuilt, schema), schema).equals(where))


UNSUPPORTED = ("unsupported",)
_last_compiled: tuple[Any, Any, tuple[Any, ...]] = (None, None, UNSUPPORTED)


def compile_filter(where: pc.Expression, schema: pa.Schema | None) -> tuple[Any, ...]:
    """The comparison tree of ``where``, or ``UNSUPPORTED``. The last result is kept so pruning
    many parts with one predicate parses it once."""
    global _last_compiled
    last_where, last_schema, last_tree = _last_compiled
    if last_where is where and last_schema is schema:
        return last_tree
    try:
        text = str(where)
        if text.startswith("is_in("):
            tree = _is_in(where)
        else:
            tokens = _tokens(text)
            tree, end = _parse(tokens, 0)
            if end != len(tokens) or not _same(_rebuild(tree), where, schema):
                tree = UNSUPPORTED
    except (
        _Unsupported,
        IndexError,
        KeyError,
        AttributeError,  # an is_in serialized otherwise than _is_in reads it
        ValueError,
        TypeError,
        pa.ArrowException,
        InvalidInput,
        CorruptMetadata,
    ):
        tree = UNSUPPORTED
    _last_compiled = (where, schema, tree)
    return tree


def may_match(
    stats: dict[str, Any],
    partition_by: list[str],
    partition: tuple[Any, ...],
    where: pc.Expression | None,
    schema: pa.Schema | None = None,
) -> bool:
    """False only when no row of a part with these statistics and partition values can satisfy
    ``where``. Understands AND/OR of comparisons between a column and a literal; anything else
    (or any doubt) is True. ``schema`` resolves positional references (decoded expressions)
    and lets comparisons use the column types. Statistics are bounds, not values (long strings
    are cut: :func:`bound_range`); ``(min, None)`` is a range without an upper bound."""
    if where is None:
        return True
    tree = compile_filter(where, schema)
    if tree is UNSUPPORTED:
        return True
    ranges: dict[str, tuple[Any, Any] | None] = {}
    for col, rng in (stats or {}).items():
        if rng is None or (isinstance(rng, (list, tuple)) and len(rng) == 2 and rng[0] is None and rng[1] is None):
            ranges[col] = None
        elif isinstance(rng, (list, tuple)) and len(rng) == 2 and rng[0] is not None:
            ranges[col] = (rng[0], rng[1])  # rng[1] None: no upper bound (upper_bound)
    for col, value in zip(partition_by or (), partition or ()):
        ranges[col] = None if value is None else (value, value)
    return _may(tree, ranges, schema)
