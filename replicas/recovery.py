"""A replica's start from its local files: the WAL replayed over the local checkpoint, the first
pull from ZooKeeper, the storage checked against what the log names, the files of transactions
that never committed removed, and the secured root checked."""

from __future__ import annotations

import gc
import logging
import time
from pathlib import Path

from coordinator.core import retries
from coordinator.core.errors import (
    CorruptMetadata,
    InvalidInput,
    MergetxnError,
    ReplicaUnavailable,
)
from coordinator.core.grants import Role
from coordinator.model.records import (
    ManifestPointer,
    WalBase,
    WalEntry,
    WalStaged,
)
from coordinator.model.users import UserRecord
from parts.io.format import delete_part
from replicas import checkpoint
from replicas.follower import Follower
from replicas.replica_fields import ReplicaFields
from replicas.storage_check import startup_probe
from replicas.wal import Wal

log = logging.getLogger(__name__)


class LocalRecovery(ReplicaFields):
    """The recovery steps of ``Replica.start``."""

    def _first_pull(self, follower: Follower) -> None:
        """Catch up from ZooKeeper once: a log this replica cannot apply is served as far as it
        applies; a manifest naming other storage stops the start."""
        try:
            follower.pull()
        except CorruptMetadata as exc:  # serve what applies; reads needing the rest report it
            if exc.details.get("manifest"):
                raise self._wrong_storage(str(exc)) from None
            log.error("cannot apply the log: %s", exc)
            self.state.set_failure(exc)
        failure = self.state.failure
        if isinstance(failure, MergetxnError) and failure.details.get("manifest"):
            raise self._wrong_storage(str(failure))

    def _recover_local(self) -> tuple[dict[str, list[str]], int, int]:
        """Open the WAL and load the local snapshot plus the WAL's entries; returns the staged
        parts by transaction (deleted once known uncommitted), the records replayed and the
        local snapshot's CSN."""
        data_dir = Path(self.config.data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        self.wal = Wal(data_dir / "wal.log")
        staged: dict[str, list[str]] = {}
        # A compacted WAL starts with {"base": C}: its entries continue the local snapshot at C.
        records = self.wal.records()
        base = records[0].csn if records and isinstance(records[0], WalBase) else 0
        local = checkpoint.read_local(data_dir / checkpoint.LOCAL_NAME)
        if local is not None:
            try:
                self.state.restore(local, str(data_dir / checkpoint.LOCAL_NAME))
            except CorruptMetadata as exc:
                log.error("%s; rebuilding from ZooKeeper", exc)
        local_csn = self.state.applied
        replay = self.state.applied >= base
        if not replay:
            log.error(
                "WAL %s continues a local snapshot at CSN %d that did not load; refetching from "
                "ZooKeeper (or the cluster checkpoint)",
                self.wal.path,
                base,
            )
        replayed = 0
        with checkpoint.no_gc():  # a long replay builds many long-lived objects (see ReplicaState.restore)
            for rec in records:
                if isinstance(rec, WalEntry) and replay:
                    try:
                        self.state.apply(rec.csn, rec.epoch, rec.seq, rec.log_entry(f"WAL {self.wal.path}"))
                        replayed += 1
                    except CorruptMetadata as exc:
                        # The WAL only caches the log: stop here and fetch the rest from ZooKeeper.
                        log.error(
                            "WAL %s: entry record does not apply (%s); refetching from ZooKeeper", self.wal.path, exc
                        )
                        replay = False
                elif isinstance(rec, WalStaged):
                    staged.setdefault(rec.tid, []).extend(rec.paths)
        gc.freeze()
        return staged, replayed, local_csn

    def _check_storage(self) -> None:
        """Refuse to serve on storage that holds none of the newest parts the log names (a wrong
        ``--storage``); transient storage errors are retried for a while, then refuse too."""
        try:
            for attempt in retries.storage_probe():
                with attempt:
                    problem = startup_probe(self.state, self.storage)
        except OSError as exc:
            raise ReplicaUnavailable(
                f"replica {self.host_id} cannot read its storage {self.storage.url}: {exc}", storage=self.storage.url
            ) from None
        if problem is not None:
            raise self._wrong_storage(problem)

    def _wrong_storage(self, problem: str) -> InvalidInput:
        return InvalidInput(
            f"replica {self.host_id}: storage {self.storage.url} does not hold what the log names "
            f"({problem}); is --storage the cluster's storage?",
            storage=self.storage.url,
        )

    def _check_root_acl(self) -> None:
        """A secured replica on a root that anyone may read or write (created by an unsecured
        cluster: ZooKeeper ACLs are set when a node is created, never inherited) says so."""
        if self.config.credentials is None:
            return
        acls, _ = self.zk.retry(self.zk.get_acls, self.log.root)
        if any(acl.id.scheme not in ("digest", "x509") for acl in acls):
            log.error(
                "the ZooKeeper root %s is open to others (ACL %s): it was created without credentials. "
                "Secure it with setAcl -R %s digest:<user>:<digest>:cdrwa (zkCli), or use a new root",
                self.log.root,
                [f"{a.id.scheme}:{a.id.id}" for a in acls],
                self.log.root,
            )

    def _first_admin(self) -> UserRecord | None:
        """The admin user ``mergetxn security init`` made (in the replicas' credentials file):
        stored by the first replica that starts on a root without users."""
        creds = self.config.credentials
        admin = None if creds is None else creds.admin
        return None if admin is None else UserRecord(admin[0], Role.ADMIN, None, admin[1], time.time())

    def _load_manifest(self, pointer: ManifestPointer) -> bytes:
        try:
            return self.storage.get(pointer.path)
        except Exception as exc:
            raise CorruptMetadata(
                f"manifest {pointer.path} named by the log cannot be read: {exc}", manifest=pointer.path
            ) from exc

    def _remove_uncommitted(self, staged: dict[str, list[str]]) -> int:
        """Parts written by transactions that never committed are never visible: delete them
        (returns how many files). A transaction whose outcome is forgotten here (it began below
        the outcome window) may have committed: its files are left to cleanup's orphan pass,
        which deletes only files that no part record names."""
        removed = 0
        for tid, paths in staged.items():
            if self.state.forgotten(tid) or self.state.commit_csn(tid) is not None:
                continue
            for p in paths:
                delete_part(self.storage, p)
                removed += 1
        return removed
