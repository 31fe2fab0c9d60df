"""Checkpoints of replica state, and the log tail that they let ZooKeeper forget.

Without this the CSN log grows by one znode per commit for as long as the cluster runs. Here:

* A **checkpoint** is a replica's whole state (:meth:`replicas.state.ReplicaState.export`) at one
  CSN, encoded by :func:`encode` (JSON, part fields as columns, zstd through pyarrow, a CRC) and
  stored at ``_checkpoints/<csn>.ckpt`` in object storage. The znode ``<root>/checkpoint`` names
  the newest one: ``{"csn": C, "path": P, "trimmed_epoch": E, "retained": M}``.
* **Trimming** removes whole *sealed* epochs, never entries of the open one (the follower reads
  the open epoch's child counter to tell "nothing newer" from a gap, and removing children would
  move that counter). So the open epoch is sealed early, once it holds ``checkpoint_every``
  entries; the next epoch starts at sequence 0 and CSNs stay monotonic (coordinator/core/versions.py).
  An epoch goes only when every entry in it is at or below (1) the applied CSN of every live
  replica, (2) the oldest snapshot of every running transaction (both published in
  ``replicas/<host>/alive``) and (3) the checkpoint's CSN. The checkpoint node is updated first,
  then the entries are deleted, so a follower that finds an entry missing always finds a
  checkpoint that covers it (replicas/follower.py loads it and follows the tail from there).
  One replica at a time does this, under the kazoo Lock ``<root>/locks/trim``.
* **Retained**: ``M`` is the last CSN removed from the log (a follower below it loads the
  checkpoint). It does not limit reads: snapshots and ``changes`` are served from the state, whose
  records stay for the tables' retention windows however much of the log is trimmed (what a
  replica still serves is decided in one place, replicas/retention.py).
* **Local snapshots**: every ``local_checkpoint_every`` applied entries a replica writes its state
  to ``<data_dir>/state.ckpt`` (same encoding, atomic rename) and rewrites its WAL as a ``base``
  record plus the entries after it, so a restart loads one file and replays a short tail instead
  of an unbounded WAL.

Everything ZooKeeper holds is then bounded by about ``checkpoint_every`` entries plus what
commits arrive while the slowest live replica catches up, however long the cluster runs.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from coordinator.core import retries
from coordinator.core.errors import CorruptMetadata
from coordinator.core.versions import csn_of
from coordinator.model.records import WalBase, WalEntry, WalRecord, WalStaged
from coordinator.zk.alive import read_alive
from coordinator.zk.log import decode_tail, encode_tail
from replicas import failpoints
from replicas.context import ReplicaContext, ReplicaPart
from replicas.memory import no_gc

if TYPE_CHECKING:  # pragma: no cover
    from kazoo.recipe.lock import Lock

    from replicas.metrics import LogWatch
    from replicas.registry import Transactions
    from replicas.retention import Retention
    from replicas.wal import Wal


log = logging.getLogger(__name__)

MAGIC = b"MERGETXN-CHECKPOINT\n"
FORMAT = 1
CHECKPOINT_DIR = "_checkpoints"
LOCAL_NAME = "state.ckpt"
EMPTY_TAIL = {"csn": 0, "path": "", "trimmed_epoch": -1, "retained": 0}  # before the first checkpoint
KEEP_CHECKPOINTS = 2  # a follower may be reading the previous one while a new one is named
ALIVE_REFRESH_SECONDS = 0.25


# -- encoding ---------------------------------------------------------------------------------


def encode(payload: dict) -> bytes:
    """``MAGIC`` + one JSON header line (format, CSN, sizes, CRC of the body) + zstd(JSON)."""
    raw = json.dumps(payload, separators=(",", ":")).encode()
    body = pa.compress(raw, codec="zstd", asbytes=True)
    header = {
        "format": FORMAT,
        "csn": int(payload["applied"]),
        "raw_size": len(raw),
        "size": len(body),
        "crc32": zlib.crc32(body),
    }
    return MAGIC + json.dumps(header, separators=(",", ":")).encode() + b"\n" + body


def decode(data: bytes, where: str) -> dict:
    """Inverse of :func:`encode`; anything torn, truncated or foreign is CorruptMetadata."""
    if not data.startswith(MAGIC):
        raise CorruptMetadata(f"checkpoint {where} is not a mergetxn checkpoint")
    end = data.find(b"\n", len(MAGIC))
    try:
        header = json.loads(data[len(MAGIC) : end])
        if header.get("format") != FORMAT:
            raise ValueError(f"format {header.get('format')!r}, want {FORMAT}")
        body = memoryview(data)[end + 1 :]
        if len(body) != int(header["size"]) or zlib.crc32(body) != int(header["crc32"]):
            raise ValueError("size or CRC mismatch (torn or altered)")
        raw = pa.decompress(body, decompressed_size=int(header["raw_size"]), codec="zstd", asbytes=True)
        with no_gc():
            payload = json.loads(raw)
        if int(payload["applied"]) != int(header["csn"]):
            raise ValueError("header and body disagree on the CSN")
    except CorruptMetadata:
        raise
    except Exception as exc:  # noqa: BLE001 - every decoding failure means the same thing
        raise CorruptMetadata(f"checkpoint {where} does not parse: {exc}") from exc
    return payload


def storage_path(csn: int) -> str:
    return f"{CHECKPOINT_DIR}/{csn:020d}.ckpt"


def write_local(path: Path, data: bytes) -> None:
    """Atomic and durable: temporary file, fsync, rename, directory fsync."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read_local(path: Path) -> dict | None:
    """The local snapshot's payload; None when there is none or it does not parse (logged: the
    replica then rebuilds from ZooKeeper and the cluster checkpoint instead)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return decode(data, str(path))
    except CorruptMetadata as exc:
        log.error("%s; ignoring it", exc)
        return None


def _write_tail(zk: Any, path: str, tail: dict, version: int) -> None:
    if version < 0:
        zk.retry(zk.create, path, encode_tail(tail))
    else:
        zk.retry(zk.set, path, encode_tail(tail), version=version)


class _Replaced(retries.TryAgain):
    """The checkpoint being loaded was replaced by a newer one (and may be gone)."""


_NEXT_CHECKPOINT = retries.next_checkpoint(on=_Replaced)


# -- the per-replica worker -------------------------------------------------------------------
class LogTail(ReplicaPart):
    """One per replica: publishes what this replica needs, writes its local snapshot, and takes
    its turn (under the cluster lock) at checkpointing and trimming the log."""

    def __init__(
        self,
        context: ReplicaContext,
        transactions: Transactions,
        wal: Wal,
        retention: Retention,
        log_watch: LogWatch,
    ) -> None:
        """``self.watermark``: the context's ``gc`` node (what cleanup collected)."""
        super().__init__(context)
        self.transactions, self.wal, self.watermark, self.retention = transactions, wal, context.watermark, retention
        self.log_watch, self.refresh_alive, self.poke_follower = log_watch, context.refresh_alive, context.poke_follower
        self.local_path = Path(self.config.data_dir) / LOCAL_NAME
        self.tail: dict | None = None  # the checkpoint node, kept current by a watch
        self._local_at = self.state.applied_count
        self._local_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-tail", daemon=True)
        self._lock: Lock | None = None  # the trim lock in ZooKeeper, made at start
        self._quiet_until = 0.0
        self._round_count = self.state.applied_count
        self._round_time = time.monotonic()
        self.rounds = 0
        self.trimmed_epochs = 0
        self.checkpoints_written = 0
        self.checkpoints_loaded = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        from kazoo.recipe.watchers import DataWatch

        DataWatch(self.zk, self.log.tail_path(), self._on_tail)
        self._lock = self.zk.Lock(self.log.trim_lock_path(), identifier=self.host_id)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _on_tail(self, data: bytes | None, _stat: Any) -> bool | None:
        if self._stop.is_set():
            return False
        if data is None:
            self.tail = None
            return None
        try:
            self.tail = decode_tail(data, self.log.tail_path())
        except CorruptMetadata as exc:
            log.error("%s; keeping %r", exc, self.tail)
        return None

    # -- what readers see --------------------------------------------------------------------
    @property
    def retained(self) -> int:
        tail = self.tail
        return int(tail.get("retained", 0)) if tail else 0

    def prune(self) -> int:
        """Forget, in this replica's state, the parts no served snapshot can see any more: those
        removed at or below cleanup's ``collected`` (their files are gone, past their tables'
        retention windows: replicas/retention.py), never at or above a commit still in a window. So the state, its checkpoints and lookups at
        older snapshots stay the size of what is live and retained, however long the history."""
        return self.state.prune(min(self.watermark.collected, self.retention.window_floor()))

    # -- the loop ----------------------------------------------------------------------------
    def _run(self) -> None:
        # The alive node is republished often (cleanup and the trim floor read it; one write per
        # tick at most, only when it changed); the rest runs every tail_check_seconds.
        tick = min(ALIVE_REFRESH_SECONDS, self.config.tail_check_seconds)
        last = time.monotonic()
        while not self._stop.wait(tick):
            try:
                self.refresh_alive()
                if time.monotonic() - last < self.config.tail_check_seconds:
                    continue
                last = time.monotonic()
                failpoints.hit("tail_loop")  # a test holds local checkpoints here (tests/faults/test_inline_faults.py)
                try:  # the log's end, for the lag in info and the metrics (replicas/metrics.py)
                    self.log_watch.observe()
                except Exception as exc:  # connection trouble: a number in a report, next time
                    log.debug("log watch: %r", exc)
                self.prune()
                if self.state.applied_count - self._local_at >= self.local_interval():
                    self.save_local()
                if self._due():
                    self.round()
            except Exception as exc:  # connection trouble, storage hiccup: next time
                log.warning("log tail: %r", exc)

    def _due(self) -> bool:
        """Cheap local test (no ZooKeeper request) for whether a round could do anything."""
        if self.state.failure is not None or time.monotonic() < self._quiet_until:
            return False
        epoch, seq = self.state.position
        if seq >= self.config.checkpoint_every:
            return True  # the open epoch is due to be sealed
        trimmed = int(self.tail["trimmed_epoch"]) if self.tail else -1
        if epoch - 1 <= trimmed:
            return False  # no sealed epoch left to trim
        grown = self.state.applied_count - self._round_count >= max(1, self.config.checkpoint_every // 2)
        return grown or time.monotonic() - self._round_time >= 30 * self.config.tail_check_seconds

    def round(self, blocking: bool = False) -> dict:
        """One checkpoint-and-trim pass if this replica gets the lock; what it did."""
        lock = self._lock
        if lock is None:
            raise RuntimeError("a checkpoint round needs the log tail started (its trim lock)")
        if not lock.acquire(blocking=blocking):
            return {"locked_out": True}
        try:
            self._round_count, self._round_time = self.state.applied_count, time.monotonic()
            return self._round()
        finally:
            lock.release()

    def _round(self) -> dict:
        self.rounds += 1
        out: dict = {"sealed": None, "checkpoint": None, "trimmed": [], "floor": None}
        tail, version = self.log.read_tail()
        trimmed = int(tail["trimmed_epoch"]) if tail else -1
        for e in self.log.epochs():
            if e <= trimmed:  # left over by a round that died while deleting
                self.log.delete_epoch(e)
        current = self.log.current_epoch(refresh=True)
        epoch, seq = self.state.position
        if epoch == current and seq >= self.config.checkpoint_every:
            self.log.seal(current)  # the open epoch is never trimmed: close it early
            out["sealed"] = current
            # Let the follower thread move past the sealed epoch (pull() would wait for its lock
            # as long as the follower is busy applying, i.e. for as long as commits keep coming).
            self.poke_follower()
            self.state.wait_until(lambda: self.state.position[0] > current or self._stop.is_set(), 10.0)
            current = self.log.current_epoch(refresh=True)
        epochs = [e for e in self.log.epochs() if e > trimmed]
        sealed = [e for e in epochs if e < current]
        if not sealed:
            return out
        counts = {}
        for e in epochs:
            stat = self.zk.retry(self.zk.exists, self.log.epoch_path(e))
            counts[e] = 0 if stat is None else stat.numChildren
        floor = self.floor()
        out["floor"] = floor
        limit = min(floor, self.state.applied)
        kept = sum(counts.values())
        to_trim: list[tuple[int, int | None]] = []
        for e in sealed:
            if kept - counts[e] < self.config.retain_entries:
                break  # keep the newest retain_entries entries (a lagging follower need not load a checkpoint)
            seqs = self.log.list_seqs(e)
            last = csn_of(e, seqs[-1]) if seqs else None
            if last is not None and last > limit:
                self._quiet_until = time.monotonic() + 5 * self.config.tail_check_seconds  # a replica lags
                break
            to_trim.append((e, last))
            kept -= counts[e]
        if not to_trim:
            return out
        need = max((last for _, last in to_trim if last is not None), default=0)
        new_tail = dict(tail or EMPTY_TAIL)
        if int(new_tail["csn"]) < need:
            csn, path = self.write_checkpoint()
            new_tail.update(csn=csn, path=path)
            out["checkpoint"] = csn
        new_tail["trimmed_epoch"] = to_trim[-1][0]
        new_tail["retained"] = max(int(new_tail["retained"]), need)
        new_tail["time"] = time.time()
        _write_tail(self.zk, self.log.tail_path(), new_tail, version)  # first: then delete
        self.tail = new_tail
        for e, _ in to_trim:
            self.log.delete_epoch(e)
            self.trimmed_epochs += 1
            out["trimmed"].append(e)
        self._drop_old_checkpoints(str(new_tail["path"]))
        return out

    def floor(self) -> int:
        """Lowest applied CSN or running snapshot over the live replicas, this one included."""
        floor = self.transactions.min_needed()
        for host, rec in read_alive(self.zk, self.log).items():
            if host == self.host_id:
                continue  # this replica: min_needed() above, computed now (replicas that are not alive rebuild from the checkpoint)
            if rec.malformed:
                return 0  # cannot tell what it needs: trim nothing
            oldest = rec.oldest_txn_snapshot
            floor = min(floor, rec.applied if oldest is None else min(rec.applied, oldest))
        return floor

    # -- checkpoints -------------------------------------------------------------------------
    def local_interval(self) -> int:
        """Entries between local snapshots: ``local_checkpoint_every``, or half the removed parts
        the state holds for the retention windows when that is more. A snapshot costs time in
        proportion to the state (export and encoding: seconds at 100,000 records), and a window
        of an hour holds every part a busy hour removed; at a fixed interval the cost per commit
        grew with that history (benchmarks/history_cost.py). The WAL replayed at a restart stays
        shorter than what the snapshot it follows holds."""
        return max(self.config.local_checkpoint_every, self.state.removed_held() // 2)

    def write_checkpoint(self) -> tuple[int, str]:
        """This replica's state, now, as a checkpoint in storage: ``(csn, path)``. When the local
        snapshot is half due, the same encoding is also written locally (one export, not two)."""
        if self.state.failure is not None:
            raise CorruptMetadata(f"not checkpointing a state that stopped at a bad entry: {self.state.failure}")
        with self._local_lock:
            count = self.state.applied_count
            payload = self.state.export()
            data = encode(payload)
            csn = int(payload["applied"])
            path = storage_path(csn)
            self.storage.put(path, data)
            if count - self._local_at >= self.local_interval() // 2:
                self._write_local(count, csn, data)
        self.checkpoints_written += 1
        log.info("checkpoint at CSN %d written to %s", csn, path)
        return csn, path

    def _drop_old_checkpoints(self, current: str) -> None:
        try:
            names = sorted(p for p in self.storage.list(CHECKPOINT_DIR + "/") if p.endswith(".ckpt"))
        except Exception as exc:  # noqa: BLE001 - old files cost only space
            log.warning("could not list %s: %r", CHECKPOINT_DIR, exc)
            return
        keep = set(names[-KEEP_CHECKPOINTS:]) | {current}
        for p in names:
            if p not in keep:
                self.storage.delete(p)

    def load_checkpoint(self, tail: dict) -> None:
        """Replace this replica's state with the checkpoint ``tail`` names (the follower calls
        this, holding its pull lock, when its position was trimmed), then save it locally so the
        WAL never holds entries on both sides of the jump."""
        named = [tail]  # the checkpoint to read: a newer round may replace it meanwhile

        def read() -> tuple[dict, str]:
            path = str(named[-1]["path"])
            try:
                return decode(self.storage.get(path), path), path
            except (OSError, CorruptMetadata) as exc:
                newer, _ = self.log.read_tail()
                if newer is None or newer.get("path") == path:
                    raise CorruptMetadata(
                        f"checkpoint {path} named by {self.log.tail_path()} cannot be read: {exc}"
                    ) from exc
                named.append(newer)
                raise _Replaced(f"checkpoints kept being replaced while loading {newer.get('path')}") from exc

        try:
            payload, path = _NEXT_CHECKPOINT(read)
        except _Replaced as exc:
            raise CorruptMetadata(str(exc)) from None
        self.state.restore(payload, path)
        self.checkpoints_loaded += 1
        self.save_local()

    def save_local(self) -> int:
        """Write ``state.ckpt`` and cut the WAL down to what follows it; returns its CSN."""
        with self._local_lock:
            count = self.state.applied_count
            payload = self.state.export()
            csn = int(payload["applied"])
            self._write_local(count, csn, encode(payload))
            return csn

    def _write_local(self, count: int, csn: int, data: bytes) -> None:
        """``state.ckpt`` := ``data`` (the state at ``csn``, ``count`` entries applied), then the
        WAL cut down to what follows it. Called holding ``_local_lock``."""
        write_local(self.local_path, data)
        running = self.transactions.txns

        def keep(rec: WalRecord) -> bool:
            if isinstance(rec, WalEntry):
                return rec.csn > csn
            return isinstance(rec, WalStaged) and rec.tid in running

        self.wal.compact(keep, head=[WalBase(csn)])
        self._local_at = count
