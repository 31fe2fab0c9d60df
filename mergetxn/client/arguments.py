"""The public API's arguments, checked before a call does anything.

Every public method of :class:`mergetxn.client.client.Client` and ``Transaction`` is wrapped by
:func:`checked_methods`: each argument a caller passed is checked by the rule for its parameter's
name (the same name means the same kind of value across the API: ``table`` is a table name,
``snapshot`` a CSN, ``where`` an expression), so a wrong type or value is ``InvalidInput`` naming
the call, the parameter and the value, never a TypeError or KeyError from deep inside, and
nothing has happened yet. An argument equal to its parameter's default is not checked (defaults
are right by construction). What a rule cannot know (does the table exist, is the expression on
its columns) the call decides after, as before.
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.core.errors import InvalidInput, quote
from coordinator.core.keyranges import MIN_BUDGET

T = TypeVar("T")
MAX_NAME = 1024  # characters of any name the API takes (tables, users, apps, transaction ids)
MAX_INT = (1 << 63) - 1  # CSNs, versions and counts are 64-bit


def _text(v: Any) -> str | None:
    if isinstance(v, str) and 0 < len(v) <= MAX_NAME:
        return None
    return f"a non-empty string of at most {MAX_NAME} characters"


def _count(v: Any) -> str | None:
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_INT:
        return None
    return "an integer from 0 to 2**63-1"


def _seconds(v: Any) -> str | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0:
        return None
    return "a finite number of seconds >= 0"


def _seconds_or_none(v: Any) -> str | None:
    return None if v is None else _seconds(v)  # None: the default (a table's: the replica's)


def _count_or_none(v: Any) -> str | None:
    return None if v is None else _count(v)  # None: the default (a table's: the replica's)


def _bytes_or_none(v: Any) -> str | None:
    if v is None or (isinstance(v, int) and not isinstance(v, bool) and MIN_BUDGET <= v <= MAX_INT):
        return None
    return f"None or a number of bytes from {MIN_BUDGET} to 2**63-1"


def _flag(v: Any) -> str | None:
    return None if isinstance(v, bool) else "True or False"


def _names(v: Any) -> str | None:
    if isinstance(v, (list, tuple)) and all(_text(x) is None for x in v):
        return None
    return "a list of names (strings)"


def _names_or_one(v: Any) -> str | None:
    return None if _text(v) is None else _names(v)


def _mapping(v: Any) -> str | None:
    if isinstance(v, Mapping) and all(isinstance(k, str) for k in v):
        return None
    return "a mapping of names to values"


def _list(v: Any) -> str | None:
    return None if isinstance(v, (list, tuple)) else "a list"


def _time(v: Any) -> str | None:
    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        return None
    return "a timezone-aware datetime"


def _time_or_seconds(v: Any) -> str | None:
    return None if _time(v) is None or _seconds(v) is None else "a timezone-aware datetime or epoch seconds"


def _csn_or_time(v: Any) -> str | None:
    if _count(v) is None or _time(v) is None:
        return None
    return "an integer CSN (by='id') or a timezone-aware datetime (by='time')"


def _expression(v: Any) -> str | None:
    return None if isinstance(v, pc.Expression) else "a pyarrow.compute.Expression"


def _data(v: Any) -> str | None:
    return None if isinstance(v, (pa.Table, pa.RecordBatch)) else "a pyarrow.Table"


def _schema(v: Any) -> str | None:
    return None if isinstance(v, pa.Schema) else "a pyarrow.Schema"


def _fields(v: Any) -> str | None:
    if isinstance(v, (pa.Schema, pa.Field)):
        return None
    if isinstance(v, (list, tuple)) and all(isinstance(f, pa.Field) for f in v):
        return None
    return "a pyarrow.Schema or a list of pyarrow.Field"


def _tid(v: Any) -> str | None:
    if _text(v) is None or (isinstance(v, tuple) and hasattr(v, "host_id")):
        return None
    return "a transaction id (tx.id) or tid"


def _parts(v: Any) -> str | None:
    from parts.model.meta import PartMeta

    if isinstance(v, (list, tuple)) and all(isinstance(m, PartMeta) for m in v):
        return None
    return "a list of PartMeta (parts.model.meta: write_part returns them)"


def _replicas(v: Any) -> str | None:
    if isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 64:
        return None
    return "a number of replicas from 1 to 64"


def _path(v: Any) -> str | None:
    if isinstance(v, str) and 0 < len(v) <= 4096:
        return None
    try:
        import os

        return None if isinstance(v, os.PathLike) and isinstance(os.fspath(v), str) else "a directory path"
    except TypeError:
        return "a directory path"


# By parameter name: what a value of it must be (None: it is). One meaning per name across the API.
RULES: dict[str, Callable[[Any], str | None]] = {
    "name": _text,
    "table": _text,
    "txn_id": _text,
    "app_id": _text,
    "role": _text,
    "kind": _text,
    "op": _text,
    "mode": _text,
    "isolation": _text,
    "atomicity": _text,
    "durability": _text,
    "by": _text,
    "conflict_policy": _text,
    "address": _text,
    "tid": _tid,
    "snapshot": _count,
    "since_csn": _count,
    "version": _count,
    "txn_max_rows": _count,
    "parts_to_delay_insert": _count_or_none,
    "parts_to_throw_insert": _count_or_none,
    "inline_rows": _count_or_none,
    "inline_bytes": _count_or_none,
    "memory_budget": _bytes_or_none,
    "start": _csn_or_time,
    "end": _csn_or_time,
    "as_of": _time_or_seconds,
    "grace_seconds": _seconds_or_none,
    "retention_seconds": _seconds_or_none,
    "txn_max_seconds": _seconds_or_none,
    "update": _flag,
    "compactions": _flag,
    "checksums": _flag,
    "auto_merge": _flag,
    "columns": _names,
    "partition_by": _names,
    "primary_key": _names,
    "removed": _names,
    "tables": _names_or_one,
    "partitions": _list,
    "set": _mapping,
    "apps": _mapping,
    "lock_groups": _mapping,
    "rename_columns": _mapping,
    "where": _expression,
    "data": _data,
    "keys_": _data,
    "schema": _schema,
    "add_columns": _fields,
    "metas": _parts,
    "added": _parts,
    "replicas": _replicas,
    "workdir": _path,
    "i": _count,  # LocalCluster: its replicas, a replica's index
    "zk_address": _text,
    "storage_url": _text,
    "root": _text,
    "epoch_size": _count,
    "session_timeout": _seconds,
    "metrics": _flag,
    "secure": _flag,
    "settings": _mapping,
    "storage_options": _mapping,
}


def check_arguments(what: str, signature: inspect.Signature, args: tuple, kwargs: dict) -> None:
    """InvalidInput for the first argument of a call to ``what`` that breaks its name's rule."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise InvalidInput(f"{what}: {exc}") from None
    for name, value in bound.arguments.items():
        rule = RULES.get(name)
        if rule is None:
            continue
        default = signature.parameters[name].default
        if default is not inspect.Parameter.empty and value is default:
            continue
        wanted = rule(value)
        if wanted is not None:
            raise InvalidInput(
                f"{what}: {name} must be {wanted}, not {quote(value)} ({type(value).__name__})", argument=name
            )


class _Plan:
    """What :func:`check_arguments` works out from a signature, once per function: the
    parameters by position and by name, and the ruled ones in order. A call whose arguments
    bind plainly (no more positionals than the function takes, keywords it has, none given
    twice, every required one there) is checked from these in a few dict look-ups; any other
    call goes through ``signature.bind``, which words the refusal (a lookup's argument check
    cost a fifth of a millisecond through ``bind``)."""

    __slots__ = ("names", "positional", "required", "ruled", "signature", "what")

    def __init__(self, what: str, signature: inspect.Signature) -> None:
        self.what, self.signature = what, signature
        params = list(signature.parameters.values())
        plain = all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params)
        # None: a function with *args, **kwargs or positional-only parameters: always bound
        self.positional: tuple[str, ...] | None = (
            tuple(p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD) if plain else None
        )
        self.names = frozenset(p.name for p in params)
        self.required = tuple(p.name for p in params if p.default is inspect.Parameter.empty)
        self.ruled = tuple((p.name, RULES[p.name], p.default) for p in params if p.name in RULES)

    def check(self, args: tuple, kwargs: dict) -> None:
        """InvalidInput for the first argument that breaks its name's rule (as
        :func:`check_arguments`)."""
        positional = self.positional
        if positional is None or len(args) > len(positional):
            check_arguments(self.what, self.signature, args, kwargs)
            return
        given = dict(zip(positional, args))
        for name, value in kwargs.items():
            if name not in self.names or name in given:
                check_arguments(self.what, self.signature, args, kwargs)
                return
            given[name] = value
        for name in self.required:
            if name not in given:
                check_arguments(self.what, self.signature, args, kwargs)
                return
        for name, rule, default in self.ruled:
            if name not in given:
                continue
            value = given[name]
            if default is not inspect.Parameter.empty and value is default:
                continue
            wanted = rule(value)
            if wanted is not None:
                raise InvalidInput(
                    f"{self.what}: {name} must be {wanted}, not {quote(value)} ({type(value).__name__})",
                    argument=name,
                )


def checked(what: str, fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` with its arguments checked first (:func:`check_arguments`, through a
    :class:`_Plan` of its signature)."""
    check = _Plan(what, inspect.signature(fn)).check

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> T:
        check(args, kwargs)
        return fn(*args, **kwargs)

    return call


def checked_methods(cls: type[T]) -> type[T]:
    """Class decorator: every public method of ``cls`` (inherited ones included) whose parameters have rules is
    :func:`checked` (``self`` is bound like any argument and has no rule)."""
    for attr in dir(cls):  # its own and those of the classes it is made of (mergetxn/client/base.py)
        fn = inspect.getattr_static(cls, attr)
        if attr.startswith("_") or not inspect.isfunction(fn):
            continue
        params = inspect.signature(fn).parameters
        if any(p in RULES for p in params):
            setattr(cls, attr, checked(f"{cls.__name__.lower()}.{attr}", fn))
    return cls
