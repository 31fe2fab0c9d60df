"""CREATE TABLE and ALTER TABLE, as the group committer's thread commits them (one at a time).

A DDL's commit point is one multi (:meth:`coordinator.zk.log.CsnLog.append_ddl`, built like a
data commit's): the table znode created or set at the version the decision read (so every commit
decided on the old definition fails its table check) and the DDL entry. The table znodes are
also what data commits check (replicas/committer.py): :meth:`TableChanges.table_version` is the
version a commit expects, :meth:`TableChanges.catch_up_tables` what it does when one moved.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import NoNodeError
from tenacity import Retrying

from coordinator.core.errors import CorruptMetadata, InvalidInput, MergetxnError, TableNotFound, quote
from coordinator.model.records import LogEntry, ManifestPointer
from coordinator.model.znodes import TABLE_LIVE
from coordinator.zk.log import MAX_INLINE_ENTRY, Multi, table_node_dropped
from replicas.context import ReplicaContext, ReplicaPart

if TYPE_CHECKING:
    from coordinator.model.catalog import TableDef
    from parts.io.storage import Storage
    from replicas.commit_queue import Pending
    from replicas.follower import Follower

log = logging.getLogger(__name__)

_TABLE_NODE = TABLE_LIVE  # a table znode's data while the table exists (coordinator/model/znodes.py, TableNode)


def commit_too_large(what: str, size: int, limit: int, **details: Any) -> InvalidInput:
    """The refusal of a commit whose log record is over the ``max_commit_bytes`` setting."""
    return InvalidInput(
        f"{what} would add {size} bytes of metadata to the log (its part descriptors and statistics), more "
        f"than the replica setting max_commit_bytes ({limit}); nothing was committed: commit fewer parts per "
        "transaction, or raise max_commit_bytes",
        size=size,
        max_commit_bytes=limit,
        **details,
    )


def spilled(storage: Storage, data: bytes, room: int = MAX_INLINE_ENTRY) -> bytes:
    """A log entry's bytes as its znode holds them: itself, or when too large for a znode (or
    for the ``room`` its multi's other ops leave), a pointer to a manifest in storage holding it
    (written durably first)."""
    if len(data) <= min(room, MAX_INLINE_ENTRY):
        return data
    path = f"_manifests/{uuid.uuid4().hex}.json"
    storage.put(path, data)
    return ManifestPointer(path).encode()


class TableChanges(ReplicaPart):
    """The DDL commits of one replica, and the table znode versions data commits check.

    ``retrying``: the committer's retry policy (a DDL is decided again after a version miss);
    ``catch_up`` and ``wait_snapshot``: the context's."""

    def __init__(
        self,
        context: ReplicaContext,
        follower: Follower,
        retrying: Callable[[], Retrying],
    ) -> None:
        super().__init__(context)
        self.follower = follower
        self.retrying, self.catch_up, self.wait_snapshot = retrying, context.catch_up, context.wait_snapshot
        self._drift: dict[str, int] = {}  # table znodes changed outside the log: the version they have

    def create(self, p: Pending, table: TableDef) -> None:
        """CREATE TABLE ``table`` (``p``'s): the table znode created (or, after a drop, set at its version: so the
        commits that checked the dropped table's version fail) and the DDL entry, in one multi."""
        zk, name = self.log.zk, table.name
        try:
            for attempt in self.retrying():
                with attempt:
                    node, stat = self._node(name)
                    if stat is not None and not table_node_dropped(node):
                        raise InvalidInput(f"table {quote(name)} already exists", table=name)
                    tdef = replace(table, ddl_version=0 if stat is None else stat.version + 1)
                    new_target = zk.exists(self.log.target_path(name)) is None
                    entry = LogEntry(time=time.time(), versions={name: 0} if new_target else {}, ddl=(tdef,))
                    multi = Multi(
                        tables={name: (None if stat is None else stat.version, _TABLE_NODE)},
                        targets={name: None} if new_target else {},
                    )
                    csn = self._append(entry, multi)
            self._applied_here(csn, name)
            p.resolve(csn)
        except MergetxnError as exc:
            p.resolve(error=exc)

    def alter(self, p: Pending, alter: tuple[str, Any, Any, Any]) -> None:
        """ALTER TABLE (``alter``, ``p``'s: name, add_columns, rename_columns, options): the new definition, decided on the current one, and the table znode set
        at the version that one holds (a concurrent DDL or drop makes it decide again)."""
        name, add_columns, rename_columns, options = alter
        try:
            for attempt in self.retrying():
                with attempt:
                    node, stat = self._node(name)
                    cur = self.state.tables.get(name)
                    if stat is None or table_node_dropped(node):
                        raise TableNotFound(f"unknown table {quote(name)}", table=name)
                    if cur is None or cur.ddl_version < stat.version:
                        self.catch_up_tables([name])  # a DDL applied elsewhere first, then decide
                        cur = self.state.tables.get(name)
                        if cur is None:
                            raise TableNotFound(f"unknown table {quote(name)}", table=name)
                    new = cur.altered(add_columns, rename_columns, version=stat.version + 1, options=options)
                    entry = LogEntry(time=time.time(), versions={}, ddl=(new,))
                    csn = self._append(entry, Multi(tables={name: (stat.version, _TABLE_NODE)}))
            self._applied_here(csn, name)
            p.resolve(csn)
        except MergetxnError as exc:
            p.resolve(error=exc)

    def _node(self, name: str) -> tuple[bytes | None, Any]:
        try:
            return self.log.zk.get(self.log.table_path(name))
        except NoNodeError:
            return None, None

    def _append(self, entry: LogEntry, multi: Multi) -> int:
        """Commit a DDL: its table node writes (``multi``) and the entry (in a manifest in storage
        when it is too large for a znode: a table of thousands of columns). Returns the CSN."""
        data = entry.encode()
        if len(data) > self.config.max_commit_bytes:
            raise commit_too_large("the definition change", len(data), self.config.max_commit_bytes)
        data = spilled(self.storage, data)
        result = self.log.append_ddl(data, multi)
        self.follower.offer(result.epoch, result.seq, data)
        return result.csn

    def _applied_here(self, csn: int, name: str) -> None:
        try:
            self.wait_snapshot(csn)  # done only once it is applied here
        except CorruptMetadata as exc:
            raise CorruptMetadata(
                f"table {quote(name)} is in the log at CSN {csn} but not applied here, and exists only once "
                f"every entry before it applies: {exc.message}",
                table=name,
                csn=csn,
            ) from exc

    def catch_up_tables(self, names: list[str]) -> None:
        """After a table znode was found past the definition applied here: apply the log up to
        now. A znode still ahead then was changed outside the log (by hand): its version is
        taken as it is, so commits to the table are not refused for ever."""
        self.catch_up()
        for name in names:
            _, stat = self._node(name)
            rec = self.state.record(name)
            if stat is not None and rec is not None and stat.version > rec.ddl_version:
                log.warning(
                    "table znode %s is at version %d, its last DDL in the log at %d: changed outside "
                    "the log; checking that version from now on",
                    name,
                    stat.version,
                    rec.ddl_version,
                )
                self._drift[name] = stat.version

    def table_version(self, name: str) -> int:
        rec = self.state.record(name)
        v = rec.ddl_version if rec is not None else 0
        return max(v, self._drift.get(name, -1))
