"""Errors a mergetxn user can catch.

Every error crosses the replica RPC as ``{"type": <class name>, "message": ..., "details": {...}}``
and is rebuilt on the client side from this module, so the class a caller catches is the same
whether the failure happened in the client library or inside a replica process.
"""

from __future__ import annotations

import reprlib
from enum import StrEnum
from typing import Any

QUOTE_LIMIT = 200  # characters of a value an error message quotes (quote)
MAX_MESSAGE = 4096  # characters of a whole message: a backstop for text no call site cut
MAX_DETAILS = 1 << 20  # characters of an error's details, about (a flush's failed ids fit)
_REPR = reprlib.Repr()  # repr of nested values without building the whole text
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, QUOTE_LIMIT, QUOTE_LIMIT
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 20


def clip(text: Any, limit: int = QUOTE_LIMIT) -> str:
    """``text`` (made a string) cut to ``limit`` characters, ending in ``... (N characters)``
    when cut: what a message may hold of an expression, a key or a reason from outside."""
    text = text if isinstance(text, str) else str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` for a message, at most about ``limit`` characters: a long string or bytes
    shows its start and its length, a container its first items (the value may come from a
    client: a message must not grow with it)."""
    if isinstance(value, (str, bytes)) and len(value) > limit:
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:limit]!r}... ({len(value)} {unit})"
    return clip(_REPR.repr(value), limit)


def _bounded(details: dict[str, Any]) -> dict[str, Any]:
    """``details`` with strings clipped, containers cut after a few levels and everything cut
    once about ``MAX_DETAILS`` characters were given (``to_dict``: what crosses the wire)."""
    budget = [MAX_DETAILS]

    def walk(value: Any, depth: int) -> Any:
        if isinstance(value, dict) and depth < 3:
            out: dict[str, Any] = {}
            for i, (k, v) in enumerate(value.items()):
                if budget[0] <= 0:
                    out["..."] = f"{len(value) - i} more"
                    break
                out[clip(k)] = walk(v, depth + 1)
            return out
        if isinstance(value, (list, tuple, set, frozenset)) and depth < 3:
            items: list[Any] = []
            for i, v in enumerate(value):
                if budget[0] <= 0:
                    items.append(f"... ({len(value) - i} more)")
                    break
                items.append(walk(v, depth + 1))
            return items
        if isinstance(value, str):
            value = clip(value, 1000)
        elif not isinstance(value, (int, float, bool, type(None))):
            value = quote(value)
        budget[0] -= len(value) if isinstance(value, str) else 8
        return value

    bounded: dict[str, Any] = walk(details, 0)  # a dict walks to a dict
    return bounded


class ConflictKind(StrEnum):
    """Which rule a :class:`ConflictError` came from (it travels as ``details["kind"]``)."""

    PART_REMOVED_TWICE = "PART_REMOVED_TWICE"  # parts: both transactions removed the same part
    TARGET_CHANGED = "TARGET_CHANGED"  # maxcompute/append: what committed to the target since the snapshot forbids it
    SOURCES_REMOVED = "SOURCES_REMOVED"  # parts: a compaction's source parts were removed meanwhile
    KEY_WRITTEN = "KEY_WRITTEN"  # keys: a key it writes was written since under an overlapping lock
    READ_SET_CHANGED = "READ_SET_CHANGED"  # serializable: what it read changed since (reserved)
    TABLE_DROPPED = "TABLE_DROPPED"  # the table it writes was dropped (or dropped and created again) since


class MergetxnError(Exception):
    """Base of every mergetxn error."""

    def __init__(self, message: str, **details: Any) -> None:
        if (
            isinstance(message, str) and len(message) > MAX_MESSAGE + 64
        ):  # (a message cut once, rebuilt by from_dict, stays as it is)
            message = clip(message, MAX_MESSAGE)
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        return {"type": type(self).__name__, "message": self.message, "details": _bounded(self.details)}


class ConflictError(MergetxnError):
    """A serialization error: a transaction that committed first won; retrying the whole
    transaction is safe. ``winner`` names the transaction it lost to, ``kind`` which conflict
    it was (a :class:`ConflictKind`; None when the replica did not say)."""

    @property
    def winner(self) -> str | None:
        return self.details.get("winner")

    @property
    def kind(self) -> ConflictKind | None:
        kind = self.details.get("kind")
        if not isinstance(kind, str):
            return None
        try:
            return ConflictKind(kind)
        except ValueError:
            return None


class TransactionAborted(MergetxnError):
    """The transaction can no longer commit (rolled back, killed, past its limits, or its
    replica lost its ZooKeeper session). ``ids``: the transactions it is about (the one that
    failed; for ``client.flush()``, every async commit that did not commit)."""

    @property
    def ids(self) -> list[str]:
        ids = self.details.get("ids")
        if isinstance(ids, list):
            return list(ids)
        one = self.details.get("id")
        return [one] if isinstance(one, str) else []


class DuplicateCommit(TransactionAborted):
    """An idempotent commit found its application version already committed
    (``tx.set_app_version``): the transaction made nothing visible and was rolled back. ``app_id``
    and ``version`` are what it carried; ``csn`` is the commit that holds that application's
    version (``committed_version``) at or above it."""

    @property
    def app_id(self) -> str | None:
        return self.details.get("app_id")

    @property
    def version(self) -> int | None:
        return self.details.get("version")

    @property
    def csn(self) -> int | None:
        return self.details.get("csn")


class InvalidInput(MergetxnError):
    """Bad names, schemas, expressions or arguments; nothing was changed."""


class TableNotFound(InvalidInput):
    """The table does not exist (at the snapshot in question)."""


class TransactionNotFound(InvalidInput):
    """No transaction of that id runs on, or recently ended on, the replica asked (it may run on
    another replica: its id names it). Nothing was changed."""


class SnapshotUnavailable(InvalidInput):
    """The snapshot asked for is newer than the log or older than what is retained."""


class CorruptPart(MergetxnError):
    """A part file does not match the checksum recorded when it was committed."""


class CorruptMetadata(MergetxnError):
    """A ZooKeeper node, WAL record or manifest holds data that does not parse."""


class StorageError(MergetxnError, OSError):
    """Storage refused a write or a read (disk full, read-only, permission denied, the object
    store erred): ``details`` carry the ``path``, the OS ``reason`` and its ``errno`` name. What
    the failing statement would have done did not happen. Also an :class:`OSError`, so code that
    handled the raw error keeps working."""

    def __init__(self, message: str, **details: Any) -> None:
        MergetxnError.__init__(self, message, **details)

    def __str__(self) -> str:
        return self.message


class ReplicaUnavailable(MergetxnError):
    """The replica could not be reached, or timed out waiting for the log."""


class OutcomeUnknown(ReplicaUnavailable):
    """A commit was sent and its answer lost, and its replica did not answer again in time: the
    outcome is being decided. ``commit_status`` on any replica answers ``committed`` or
    ``aborted`` once the replica decides, or once it is gone (docs/rules.md#outcomes)."""


class AuthenticationFailed(MergetxnError):
    """The replica refused this connection: it serves only clients that come over TLS with the
    cluster's credentials. Pass ``credentials=`` (a ``coordinator.wire.security.Credentials`` or the
    path of the cluster's credentials file) or set ``MERGETXN_CREDENTIALS`` to that file.
    Nothing was changed. Never retried: the same credentials fail the same way."""


class PermissionDenied(MergetxnError):
    """The user this connection authenticated as may not make this call: its role or its table
    grants do not allow it (docs/surface.md#users-roles-and-grants). The message names the user,
    the action and the table (``details``: ``user``, ``role``, ``action``, ``table``). Nothing was
    changed; in a transaction only the statement failed, and the transaction stays usable."""


class QuotaExceeded(PermissionDenied):
    """The user holds as many running transactions (or read leases) on this replica as its quota
    allows (``details``: ``quota``, the replica setting; ``value``, its limit; ``user``). Nothing
    was changed: end one (commit, roll back, finish the read) and ask again."""


class TooManyParts(MergetxnError):
    """An insert was refused: a partition it writes holds ``parts_to_throw_insert`` visible parts
    or more (docs/rules.md#too-many-parts; ``details``: ``table``, ``partition``, ``parts``, the
    count, and the thresholds with where each comes from). Nothing was changed (in a transaction
    only the statement failed: the transaction stays usable): insert again once merges (or a
    ``compact``) brought the partition's parts down, or raise the table's threshold."""


_BY_NAME = {
    cls.__name__: cls
    for cls in (
        MergetxnError,
        ConflictError,
        TransactionAborted,
        DuplicateCommit,
        InvalidInput,
        TableNotFound,
        TransactionNotFound,
        SnapshotUnavailable,
        CorruptPart,
        CorruptMetadata,
        StorageError,
        ReplicaUnavailable,
        OutcomeUnknown,
        AuthenticationFailed,
        PermissionDenied,
        QuotaExceeded,
        TooManyParts,
    )
}


def storage_error(exc: OSError, op: str, path: str, where: str = "") -> StorageError:
    """A :class:`StorageError` for an OSError of ``op`` (put, get, delete) on ``path``: the OS
    reason, its errno name and what to do about it."""
    import errno as _errno

    if isinstance(exc, StorageError):
        return exc
    code = exc.errno
    name = _errno.errorcode.get(code, "") if isinstance(code, int) else ""
    reason = exc.strerror or str(exc) or type(exc).__name__
    advice = {
        "ENOSPC": "the disk is full: free space (or collect garbage: mergetxn gc) and try again",
        "EDQUOT": "the disk quota is exhausted: free space and try again",
        "EROFS": "the file system is read-only: remount it writable and try again",
        "EACCES": "permission denied: give the process write access to the storage directory",
        "EPERM": "operation not permitted: give the process write access to the storage directory",
    }.get(name, "check the storage and try again")
    label = f"{reason} ({name})" if name else reason
    return StorageError(
        f"storage {op} of {path!r}{' in ' + where if where else ''} failed: {label}; {advice}",
        path=path,
        op=op,
        reason=reason,
        errno=name or None,
    )


def from_dict(payload: dict[str, Any]) -> MergetxnError:
    """Rebuild an error sent by a replica; unknown types become the base class."""
    cls = _BY_NAME.get(payload.get("type", ""), MergetxnError)
    return cls(payload.get("message", "unknown error"), **(payload.get("details") or {}))


# Every class's public home is ``coordinator.errors`` (the public surface; coordinator/errors.py
# re-exports this module): tracebacks and pickles name it there.
for _cls in list(globals().values()):
    if isinstance(_cls, type) and issubclass(_cls, BaseException) and _cls.__module__ == __name__:
        _cls.__module__ = "coordinator.errors"
del _cls
