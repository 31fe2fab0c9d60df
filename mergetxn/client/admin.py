"""Administration: compactions, running transactions, users, parts, cleanup, checks and app versions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from coordinator.core.conflicts import check_app_version
from coordinator.core.errors import InvalidInput, quote
from coordinator.model.users import check_name as check_user_name
from coordinator.wire import security
from coordinator.wire.security import Credentials
from mergetxn.client.base import ClientBase
from mergetxn.client.checks import (
    partition_values,
)


class Administration(ClientBase):
    """The client's administration calls (a part of :class:`mergetxn.client.client.Client`)."""

    # -- operations --------------------------------------------------------------------------
    def compact(self, table: str, kind: str = "minor", partitions: Sequence[Any] | None = None) -> int:
        """Compact now, as a transaction of its own; returns its CSN.

        Raises:
            InvalidInput: ``kind`` is not minor or major, wrong partitions, or no such table.
        """
        if kind not in ("minor", "major"):
            raise InvalidInput(f"compaction kind must be 'minor' or 'major', not {quote(kind)}")
        parts = None if partitions is None else [list(p) for p in partition_values(self.table(table), partitions)]
        return self.call("compact", table=table, kind=kind, partitions=parts)["csn"]

    def transactions(self) -> list[dict]:
        """The transactions running on this replica (id, user, snapshot, age, ...)."""
        return self.call("transactions")

    def kill(self, txn_id: str) -> dict:
        """Abort the running transaction ``txn_id``; returns what the replica did.

        Raises:
            TransactionNotFound: no transaction of that id runs on this replica.
        """
        return self.call("kill", id=str(txn_id))

    # -- users (secured clusters; an admin's calls) ------------------------------------------
    def create_user(self, name: str, role: str, tables: Sequence[str] | None = None) -> Credentials:
        """Add a user of role ``"admin"``, ``"writer"`` or ``"reader"`` with grants on ``tables``
        (None: every table, those created later included); returns its credentials (a new
        secret and this client's CA file), what ``coordinator.connect(..., credentials=)``
        takes: keep them (``.to_file(path)``), the cluster keeps only a salted hash. A name
        that breaks the name rule (coordinator/model/users.py) is InvalidInput before anything.

        Raises:
            InvalidInput: a name that breaks the name rule, an unknown role, or the user exists.
        """
        check_user_name(name)
        new = security.make_user_credentials(name, None if self.credentials is None else self.credentials.ca_file)
        if tables is not None and not isinstance(tables, str):
            tables = sorted(tables) if isinstance(tables, (set, frozenset)) else list(tables)
        self.call("create_user", name=name, role=role, tables=tables, secret=new.secret)
        return new

    def drop_user(self, name: str) -> None:
        """Remove a user: its credentials are refused from now on (AuthenticationFailed), on
        every replica, also on its connections already open. The last admin is refused
        (InvalidInput naming it), also when two drops of the last two admins race.

        Raises:
            InvalidInput: no such user, or the last admin.
        """
        self.call("drop_user", name=name)

    def users(self) -> list[dict]:
        """Every user: ``name``, ``role``, ``tables`` (None: every table), ``created_at``; as
        ZooKeeper holds them when asked, so a user made or dropped through another replica just
        before is listed so."""
        return self.call("users")

    def parts(self, table: str) -> pa.Table:
        """The table's parts, visible and retained, as a ``pyarrow.Table`` (one row per part;
        ``inlined``: a small write's part whose content is in its metadata, with no file at ``path``;
        ``held_bytes``: the content bytes its record holds, 0 once flushed; ``bundle``: where a
        flush moved a removed inlined part's bytes, docs/architecture/small-writes.md).

        Raises:
            TableNotFound: no such table.
        """
        rows = self.call("parts", table=table)
        schema = pa.schema(
            [
                ("name", pa.string()),
                ("partition", pa.string()),
                ("path", pa.string()),
                ("rows", pa.int64()),
                ("size", pa.int64()),
                ("inlined", pa.bool_()),  # its content in its metadata, no file (small writes)
                ("held_bytes", pa.int64()),  # content bytes its record holds (inlined, not flushed)
                ("bundle", pa.string()),  # flushed since: the bundle holding its bytes
                ("creation_tid", pa.string()),
                ("creation_csn", pa.int64()),
                ("removal_tid", pa.string()),
                ("removal_csn", pa.int64()),
                ("visible", pa.bool_()),
                ("why_kept", pa.string()),
                ("collected", pa.bool_()),
            ]
        )
        return pa.Table.from_pylist(rows, schema=schema)

    def gc(self, grace_seconds: float | None = None) -> dict:
        """One cleanup pass now (replicas/cleanup.py): ``{"removed": [...], "kept": [...],
        "min_snapshot", "watermark", "snapshots_in_use", ...}``, each file with its reason.

        Raises:
            InvalidInput: ``grace_seconds`` is not a number of seconds.
        """
        args: dict[str, Any] = {}
        if grace_seconds is not None:
            args["grace_seconds"] = grace_seconds
        return self.call("gc", **args)

    def check(self, tables: str | Sequence[str] | None = None, checksums: bool = True) -> dict:
        """Check storage against the log: every part a read may still need (visible at the latest
        snapshot, or removed and kept for the retention window) is present, of the size and (with
        ``checksums``, reading every file) the checksum it was committed with. ``{"snapshot",
        "ok", "tables": [{"table", "parts", "bytes", "problems": [{"part", "path", "problem",
        "visible"}]}]}``; ``tables``: one name, several, or every table (None).

        Raises:
            TableNotFound: a table named does not exist.
        """
        args: dict[str, Any] = {"checksums": bool(checksums)}
        if tables is not None:
            args["tables"] = [tables] if isinstance(tables, str) else list(tables)
        return self.call("check", **args)

    def app_version(self, app_id: str) -> int | None:
        """The highest version of application ``app_id`` committed (``tx.set_app_version``), or
        None. Answered from the replica's memory: after a commit of this client returns, it is
        seen; a commit made through another replica a moment ago may not be yet (a lower answer,
        never a higher one: the commit itself is decided against the whole log).

        Raises:
            InvalidInput: ``app_id`` is not an application id.
        """
        app_id, _ = check_app_version(app_id, 0)
        return self.call("app_version", app_id=app_id)["version"]
