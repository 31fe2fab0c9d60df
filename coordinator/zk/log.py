"""The CSN log and the commit point in ZooKeeper.

Znode layout under the cluster root (``/mergetxn`` by default; each node's body is one typed
record, encoded and decoded in coordinator/model/znodes.py)::

    config                     {"epoch_size": N}: written once, when the cluster is first used
    log/e-<epoch>              one parent per epoch; data version 0 = open, >= 1 = sealed
    log/e-<epoch>/c-<seq>      one entry per commit: JSON (or a pointer to a manifest in storage)
    tables/<table>             one per table name: its data version is bumped by every DDL on the name
                               (create again after a drop, alter, drop), and checked by every commit
                               that writes the table; data: a small marker, TOMBSTONE once dropped
                               (the definitions are in the log's DDL entries)
    targets/<table>            table-level version: bumped when a partition node is created and
                               by whole-table operations that must see every partition
    targets/<table>/<pkey>     partition-level version, bumped by every commit whose conflict
                               rules need to see the commits on that partition
    targets/@app:<id>          an application of idempotent commits (coordinator/core/targets.py,
                               app_key): bumped by every commit that records a version of it
    targets/<table>@writes     the table's write counter (coordinator/core/readsets.py): bumped with no
                               version check by every commit that writes a ``parts`` table or drops
                               a table, checked by a serializable commit that read the table; not a
                               conflict target (no entry records its version)
    replicas/<host>            per-replica node (the owner node); its data version is the replica's
                               incarnation, bumped when it starts or gets a new session, and by
                               another replica that decides the transactions of a replica gone
    replicas/<host>/alive      ephemeral: address, applied CSN and oldest snapshot in use there
    fence                      the orphan fence (coordinator/zk/orphan_fence.py): files cleanup condemned
                               and has not confirmed deleted; every commit multi checks its version
    gc                         cleanup's watermark (replicas/cleanup.py); gc/lock: one pass at a time
    leaders/<table>            kazoo Lock: the one replica that merges a table (replicas/merges.py)
    locks/trim                 kazoo Lock: the one replica that checkpoints and trims
    checkpoint                 the log tail (replicas/checkpoint.py): {"csn": C, "path": P,
                               "trimmed_epoch": E, "retained": M}: the state up to CSN C is in
                               the checkpoint file P in storage; epochs <= E may be gone (whole
                               sealed epochs only, all their entries <= C); snapshots < M are
                               no longer served

The commit point is one multi: ``check(replicas/<host>, version=incarnation)`` (the committing
replica's owner node: see replicas/outcomes.py), ``check(fence, version=f)`` (coordinator/zk/orphan_fence.py),
``set_data(target, version=v)`` (or ``create``) for each target
the conflict rules check, the write counters a serializable commit checks and those the commit
bumps, ``check(log/e-<epoch>, version=0)`` so that nothing is appended to a
sealed epoch, and ``create(log/e-<epoch>/c-, sequence=True)`` carrying the entry. Either all of it
happens or none. A version miss means another commit touched a checked target after we read its
version: the caller re-reads, re-decides with the conflict rules, and tries again (the kazoo
counter recipe's loop, at a larger scale).

Every entry records the new version of each target it bumped, so a replica that has applied the
entry that set a target to version ``v`` has seen every commit that touched it up to ``v``.
"""

from __future__ import annotations

import logging
import select
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import BadVersionError, NoAuthError, NodeExistsError, NoNodeError
from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.protocol.paths import normpath
from kazoo.protocol.serialization import CheckVersion, Create, SetData
from kazoo.security import OPEN_ACL_UNSAFE

from coordinator.core.errors import CorruptMetadata
from coordinator.core.versions import DEFAULT_EPOCH_SIZE, csn_of, epoch_full, seq_of_node
from coordinator.model.znodes import TARGET_BODY, ConfigRecord, EpochNode, TableNode, TailRecord
from coordinator.zk.orphan_fence import FenceMoved
from coordinator.zk.recipes import remove_data_watch

log = logging.getLogger(__name__)

MAX_INLINE_ENTRY = 900_000  # znodes are limited to about 1 MB


class VersionMoved(Exception):
    """A checked target changed, or the epoch was sealed, between read and multi: retry."""


class TableMoved(VersionMoved):
    """A table znode a commit checks (or sets, for a DDL) moved: a DDL on it happened since the
    definition the commit was decided on. ``tables`` names them."""

    def __init__(self, message: str, tables: list[str]) -> None:
        super().__init__(message)
        self.tables = tables


def table_node_dropped(data: bytes | None) -> bool:
    """Whether a ``tables/<name>`` znode's data says the table was dropped (anything else,
    garbage included, reads as a table that exists: its name stays taken)."""
    return TableNode.says_dropped(data)


class OwnerFenced(Exception):
    """The owner node moved past the incarnation the commit was made under: this replica
    restarted, re-registered after a lost session, or another replica decided its transactions
    (replicas/outcomes.py). The multi did not happen and must not be retried."""


@dataclass(frozen=True)
class Multi:
    """What a commit multi checks and writes besides its entry (see :meth:`CsnLog.commit`).

    ``owner``: the owner node's path and the incarnation it must hold; ``fence``: the orphan
    fence's version; ``tables``: per table node (version, data): data None checks it at the
    version, else sets it (version None: creates it); ``targets``: per target its expected
    version (None: create it); ``counters``: write counters checked at a version, then those
    bumped whatever their version."""

    owner: tuple[str, int] | None = None
    fence: int | None = None
    tables: Mapping[str, tuple[int | None, bytes | None]] = field(default_factory=dict)
    targets: Mapping[str, int | None] = field(default_factory=dict)
    counters: tuple[Mapping[str, int], Iterable[str]] = ({}, ())


@dataclass(frozen=True)
class CommitResult:
    csn: int
    epoch: int
    seq: int
    versions: dict[str, int]


class CsnLog:
    """ZooKeeper side of commits: allocation of CSNs, version checks, epochs, entry reads."""

    def __init__(self, zk: KazooClient, root: str = "/mergetxn", epoch_size: int | None = None) -> None:
        self.zk = zk
        self.root = normpath("/" + (root.strip("/") or "mergetxn"))
        self._requested_epoch_size = epoch_size
        self.epoch_size = epoch_size or DEFAULT_EPOCH_SIZE
        self._epoch: int | None = None
        self._lock = threading.Lock()

    # -- paths ---------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def epoch_path(self, epoch: int) -> str:
        return self.path("log", f"e-{epoch:010d}")

    def entry_path(self, epoch: int, seq: int) -> str:
        return f"{self.epoch_path(epoch)}/c-{seq:010d}"

    def target_path(self, key: str) -> str:
        return self.path("targets", key)

    def tail_path(self) -> str:
        return self.path("checkpoint")

    def log_path(self) -> str:
        return self.path("log")

    def table_path(self, table: str) -> str:
        return self.path("tables", table)

    def replicas_path(self) -> str:
        return self.path("replicas")

    def replica_path(self, host: str) -> str:
        return self.path("replicas", host)

    def alive_path(self, host: str) -> str:
        return self.path("replicas", host, "alive")

    def gc_path(self) -> str:
        return self.path("gc")

    def gc_lock_path(self) -> str:
        return self.path("gc", "lock")

    def fence_path(self) -> str:
        return self.path("fence")

    def users_path(self) -> str:
        """A secured cluster's users (coordinator/model/users.py), under the replicas' ACL."""
        return self.path("users")

    def leaders_path(self, table: str | None = None) -> str:
        return self.path("leaders") if table is None else self.path("leaders", table)

    def trim_lock_path(self) -> str:
        return self.path("locks", "trim")

    # -- the log tail (written by replicas/checkpoint.py) -----------------------------------
    def read_tail(self, watch: Callable[..., object] | None = None) -> tuple[dict | None, int]:
        """The checkpoint node's data (None before the first checkpoint) and its version."""
        try:
            data, stat = self.zk.retry(self.zk.get, self.tail_path(), watch=watch)
        except NoNodeError:
            if watch is not None:
                self.zk.retry(self.zk.exists, self.tail_path(), watch=watch)
            return None, -1
        return decode_tail(data, self.tail_path()), stat.version

    def trimmed_epoch(self) -> int:
        """Epochs up to this one may have been removed from ZooKeeper (-1: none)."""
        tail, _ = self.read_tail()
        return -1 if tail is None else int(tail["trimmed_epoch"])

    def delete_epoch(self, epoch: int) -> int:
        """Remove a sealed epoch and its entries (pipelined deletes); returns entries removed."""
        stat = self.zk.retry(self.zk.exists, self.epoch_path(epoch))
        if stat is None:
            return 0
        if stat.version < 1:
            raise ValueError(f"epoch {epoch} is open: only sealed epochs are trimmed")
        names = self.zk.retry(self.zk.get_children, self.epoch_path(epoch))
        pending = [self.zk.delete_async(f"{self.epoch_path(epoch)}/{n}") for n in names]
        removed = 0
        for a in pending:
            try:
                a.get()
                removed += 1
            except NoNodeError:
                pass
        try:
            self.zk.retry(self.zk.delete, self.epoch_path(epoch))
        except NoNodeError:
            pass
        return removed

    # -- layout --------------------------------------------------------------------------
    def ensure_layout(self) -> None:
        """Create the root layout once; read the cluster's epoch size (first writer decides)."""
        for p in ("log", "tables", "targets", "replicas"):
            self.zk.retry(self.zk.ensure_path, self.path(p))
        try:
            self.zk.retry(self.zk.create, self.path("config"), ConfigRecord(self.epoch_size).encode())
        except NodeExistsError:
            pass
        data, _ = self.zk.retry(self.zk.get, self.path("config"))
        self.epoch_size = ConfigRecord.decode(data, self.path("config")).epoch_size
        if not self.epochs():  # a trimmed log has no e-0 any more: never recreate it (open)
            try:
                self.zk.retry(self.zk.create, self.epoch_path(0), EpochNode().encode())
            except NodeExistsError:
                pass

    def epochs(self) -> list[int]:
        names = self.zk.retry(self.zk.get_children, self.path("log"))
        out = []
        for n in names:
            if n.startswith("e-") and n[2:].isdigit():
                out.append(int(n[2:]))
        return sorted(out)

    def current_epoch(self, refresh: bool = False) -> int:
        with self._lock:
            if self._epoch is None or refresh:
                epochs = self.epochs()
                self._epoch = epochs[-1] if epochs else 0
            return self._epoch

    def seal(self, epoch: int) -> None:
        """Close ``epoch`` and open the next one, atomically; a no-op if someone else did."""
        t = self.zk.transaction()
        t.set_data(self.epoch_path(epoch), EpochNode(sealed=True).encode(), version=0)
        t.create(self.epoch_path(epoch + 1), EpochNode().encode())
        results = t.commit()
        if any(isinstance(r, Exception) for r in results):
            log.debug("epoch %d already sealed: %s", epoch, results)
        self.current_epoch(refresh=True)

    # -- versions --------------------------------------------------------------------------
    def read_versions(self, keys: Iterable[str]) -> dict[str, int | None]:
        """Current data version of each target node (None where it does not exist yet)."""
        keys = list(keys)
        asyncs = [(k, self.zk.exists_async(self.target_path(k))) for k in keys]
        out: dict[str, int | None] = {}
        for k, a in asyncs:
            stat = a.get()
            out[k] = None if stat is None else stat.version
        return out

    def ensure_counters(self, keys: Iterable[str]) -> dict[str, int]:
        """Current version of each counter node (see :meth:`commit`), creating the missing ones."""
        out: dict[str, int] = {}
        for k in sorted(set(keys)):
            path = self.target_path(k)
            stat = self.zk.exists(path)
            if stat is None:
                try:
                    self.zk.create(path, TARGET_BODY)
                except NodeExistsError:
                    pass
                stat = self.zk.exists(path)
            if stat is None:
                raise VersionMoved(f"counter node {path} vanished")
            out[k] = stat.version
        return out

    # -- the commit point ----------------------------------------------------------------------
    def commit(
        self,
        entry: bytes,
        expected: dict[str, int | None],
        fence: int | None = None,
        owner: tuple[str, int] | None = None,
        tables: dict[str, tuple[int, bytes | None]] | None = None,
        counters: tuple[Mapping[str, int], Iterable[str]] = ({}, ()),
    ) -> CommitResult:
        """One multi: check the owner node at the committing replica's incarnation (``owner``:
        path and version; see replicas/outcomes.py), check the orphan fence at version ``fence``
        (coordinator/zk/orphan_fence.py), bump every target at its expected version and append the entry.
        ``counters``: nodes checked at a version (a serializable commit's read tables), then nodes
        bumped whatever their version (tables written); see coordinator/core/readsets.py and
        :meth:`ensure_counters`. They are not conflict targets: no entry records their versions.

        Raises OwnerFenced when the owner node moved (the transactions can never commit under
        that incarnation), FenceMoved when the fence moved (re-verify the files, retry), VersionMoved when a
        target or the epoch moved (retry after re-deciding); kazoo's ConnectionLoss/SessionExpired
        propagate: the outcome is then unknown and the caller must look for its entry in the log
        before answering anybody.
        """
        epoch = self.current_epoch()
        multi = Multi(owner, fence, tables or {}, expected, counters)
        table_ops = sorted(multi.tables.items())
        t = self.multi(multi, epoch, entry)
        results = t.commit()
        if any(isinstance(r, Exception) for r in results):
            self._refused(results, owner, fence, table_ops)
        created = results[-1]
        seq = seq_of_node(created.rsplit("/", 1)[1])
        if epoch_full(seq, self.epoch_size):
            self.seal(epoch)
        versions = {k: (0 if v is None else v + 1) for k, v in expected.items()}
        return CommitResult(csn_of(epoch, seq), epoch, seq, versions)

    def _refused(
        self,
        results: list,
        owner: tuple[str, int] | None,
        fence: int | None,
        table_ops: list[tuple[str, tuple[int | None, bytes | None]]],
    ) -> None:
        """Raise what a failed commit multi means, read from its results in the order
        :meth:`multi` built it (see :meth:`commit`)."""
        failures = [r for r in results if isinstance(r, Exception)]
        real = [r for r in failures if isinstance(r, (BadVersionError, NodeExistsError, NoNodeError))]
        if not real:
            raise failures[0]
        first = 0
        if owner is not None:
            if isinstance(results[0], (BadVersionError, NoNodeError)):
                raise OwnerFenced(f"owner node {owner[0]} moved past version {owner[1]}")
            first = 1
        if fence is not None:
            if isinstance(results[first], (BadVersionError, NoNodeError)):
                raise FenceMoved(f"the orphan fence moved past version {fence}")
            first += 1
        moved = [
            name
            for (name, _), r in zip(table_ops, results[first : first + len(table_ops)])
            if isinstance(r, (BadVersionError, NoNodeError))
        ]
        if moved:
            raise TableMoved(f"a DDL changed table(s) {moved} since the commit was decided", moved)
        # The epoch check is the op just before the create; a miss there means sealed.
        if isinstance(results[-2], (BadVersionError, NoNodeError)):
            self.current_epoch(refresh=True)
        raise VersionMoved(str(real[0]))

    def multi(self, m: Multi, epoch: int, entry: bytes) -> TransactionRequest:
        """The one builder of a commit multi, data commits' and DDL's alike, in this order: the
        owner check, the fence check, the table nodes (sorted by name), the targets, the write
        counters checked then bumped, the epoch check and the entry (a sequential node under
        ``epoch``). :meth:`commit` reads the failures by that order.

        The requests are kazoo's own (``kazoo.protocol.serialization``), put on the transaction's
        public ``operations`` list with the paths as kazoo would send them: this log's paths are
        its normalised root and segments that are identifiers or percent-encoded keys
        (coordinator/core/targets.py), so the ``normpath`` that kazoo's ``check``/``set_data``/
        ``create`` run per op (about a third of a commit's ``CsnLog.commit``) has nothing to do;
        the owner path, a replica id's, is normalised once. tests/unit/test_commit_multi.py pins
        that the requests equal those kazoo's methods build."""
        t = self.zk.transaction()
        ops = t.operations
        sent = self.zk.chroot or ""  # what kazoo puts in front of every path it sends (normalised by kazoo)
        acl = self.zk.default_acl or OPEN_ACL_UNSAFE
        if m.owner is not None:
            ops.append(CheckVersion(sent + normpath(m.owner[0]), m.owner[1]))
        if m.fence is not None:
            ops.append(CheckVersion(sent + self.fence_path(), m.fence))
        tables = sent + self.path("tables", "")
        for name, (version, data) in sorted(m.tables.items()):  # a DDL sets or creates it, a write checks it
            if data is None:
                ops.append(CheckVersion(tables + name, version))
            elif version is None:
                ops.append(Create(tables + name, data, acl, 0))
            else:
                ops.append(SetData(tables + name, data, version))
        targets = sent + self.path("targets", "")
        for key, target_version in sorted(m.targets.items()):
            if target_version is None:
                ops.append(Create(targets + key, TARGET_BODY, acl, 0))
            else:
                ops.append(SetData(targets + key, TARGET_BODY, target_version))
        for key, counter_version in sorted(m.counters[0].items()):  # checked before this multi bumps any
            ops.append(CheckVersion(targets + key, counter_version))
        for key in sorted(set(m.counters[1])):
            ops.append(SetData(targets + key, TARGET_BODY, -1))
        epoch_path = sent + self.epoch_path(epoch)
        ops.append(CheckVersion(epoch_path, 0))
        ops.append(Create(epoch_path + "/c-", entry, acl, 2))  # 2: kazoo's flag of a sequential node
        return t

    def append_ddl(self, entry: bytes, m: Multi) -> CommitResult:
        """The commit point of a DDL: ``m`` (its table node and new target) and the entry in one
        multi (:meth:`multi`). Any failure is VersionMoved (decide again), with the epoch re-read."""
        epoch = self.current_epoch()
        results = self.multi(m, epoch, entry).commit()
        if any(isinstance(r, Exception) for r in results):
            self.current_epoch(refresh=True)
            raise VersionMoved(str(results))
        seq = int(results[-1].rsplit("-", 1)[1])
        if epoch_full(seq, self.epoch_size):
            self.seal(epoch)
        versions = {k: (0 if v is None else v + 1) for k, v in m.targets.items()}
        return CommitResult(csn_of(epoch, seq), epoch, seq, versions)

    # -- reading the log -------------------------------------------------------------------
    def fetch(self, epoch: int, seq: int) -> bytes | None:
        """An entry's data, None when the node does not exist; CorruptMetadata naming the node
        when it exists but this identity may not read it (its ACL was changed): the follower
        stops there rather than treating it as absent."""
        path = self.entry_path(epoch, seq)
        try:
            data, _ = self.zk.retry(self.zk.get, path)
            return data
        except NoNodeError:
            return None
        except NoAuthError:
            raise CorruptMetadata(
                f"log entry {path} cannot be read with this replica's identity (NoAuth: its "
                f"ACL was changed); never skipped"
            ) from None

    def last_csn(self) -> int:
        """CSN of the newest entry in the log now (0 if none): the last of the newest epoch that
        holds any (a freshly opened epoch is empty). Call after a ``sync`` to see the leader's."""
        for epoch in reversed(self.epochs()[-2:]):
            seqs = self.list_seqs(epoch)
            if seqs:
                return csn_of(epoch, seqs[-1])
        return 0

    def list_seqs(self, epoch: int) -> list[int]:
        try:
            names = self.zk.retry(self.zk.get_children, self.epoch_path(epoch))
        except NoNodeError:
            return []
        try:
            return sorted(seq_of_node(n) for n in names if n.startswith("c-"))
        except ValueError as exc:  # a child no commit made: the log was written by hand
            raise CorruptMetadata(
                f"log epoch {self.epoch_path(epoch)} has a child that is no log entry: {exc}"
            ) from None

    def watch_next(self, epoch: int, seq: int, callback: Callable[..., object]) -> bool:
        """Set a one-shot watch for the creation of the next entry; True if it already exists."""
        return self.zk.exists(self.entry_path(epoch, seq), watch=callback) is not None

    def forget_watch(self, epoch: int, seq: int) -> bool:
        """Remove the watch :meth:`watch_next` set on an entry that was never created (its
        epoch was sealed first), at the server and in kazoo; False if none was held."""
        return remove_data_watch(self.zk, self.entry_path(epoch, seq))


def given_out(stat: object) -> int:
    """How many sequence numbers an epoch node has given out (its children are numbered from 0
    in creation order): the children created under it. ZooKeeper counts creations and deletions
    of children in ``cversion`` and keeps ``numChildren``, so creations = (cversion +
    numChildren) / 2; a failed multi changes neither (tests/integration/test_zk_hardening.py)."""
    return (stat.cversion + stat.numChildren) // 2  # type: ignore[attr-defined]


def encode_tail(tail: dict) -> bytes:
    """The checkpoint node's data from its fields (see replicas/checkpoint.py; the body is a
    :class:`~coordinator.model.znodes.TailRecord`)."""
    return TailRecord.from_dict(tail, "the checkpoint node being written").encode()


def decode_tail(data: bytes, where: str) -> dict:
    """The checkpoint node's fields (:meth:`TailRecord.to_dict`); anything malformed is
    CorruptMetadata naming the znode."""
    return TailRecord.decode(data, where).to_dict()


class PollHandler(SequentialThreadingHandler):
    """kazoo's threading handler with a one-syscall ``select``.

    kazoo's connection thread selects before every read and write of its socket; the stock
    handler builds and closes an epoll selector each time (four system calls and their Python
    around them), which made kazoo's thread the largest CPU user of a replica under commit
    load. ``select.poll`` has no descriptor limit either, and needs one call.
    """

    def select(self, rlist: list, wlist: list, xlist: list, timeout: float | None = None) -> tuple:
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be non-negative")
        poller = select.poll()
        objs: dict[int, list] = {}
        masks: dict[int, int] = {}
        for objects, mask in ((rlist, select.POLLIN | select.POLLPRI), (wlist, select.POLLOUT)):
            for obj in objects:
                fd = obj if isinstance(obj, int) else obj.fileno()
                if fd < 0:
                    raise ValueError("Invalid event mask or fd")
                objs.setdefault(fd, []).append(obj)
                masks[fd] = masks.get(fd, 0) | mask
        for fd, mask in masks.items():
            poller.register(fd, mask)
        ready = poller.poll(None if timeout is None else timeout * 1000.0)
        readable, writable = [], []
        for fd, ev in ready:
            if ev & select.POLLNVAL:
                raise ValueError("Invalid event mask or fd")
            # As the selectors module does: an error or hang-up wakes readers and writers.
            for obj in objs[fd]:
                if obj in rlist and ev & ~select.POLLOUT:
                    readable.append(obj)
                if obj in wlist and ev & ~(select.POLLIN | select.POLLPRI):
                    writable.append(obj)
        return readable, writable, []
