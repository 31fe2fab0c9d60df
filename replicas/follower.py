"""Following the CSN log: fetch entries in CSN order, write them to the WAL, apply them.

Entries are fetched by their exact path (``e-<epoch>/c-<seq>``), so catching up costs one read
per entry and never a listing of the whole epoch. The next entry is awaited with a one-shot
``exists`` watch; the committer of this replica hands over the entries it wrote itself, so a
local commit is applied without a read. A listing is needed only in rare cases: the epoch was
sealed, or the parent's child counter shows that a sequence number was skipped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from coordinator.errors import CorruptMetadata
from coordinator.versions import csn_of
from coordinator.zklog import CsnLog, decode_entry
from replicas.state import ReplicaState
from replicas.wal import Wal

log = logging.getLogger(__name__)

BATCH = 256


class Follower:
    def __init__(
        self,
        csn_log: CsnLog,
        state: ReplicaState,
        wal: Wal,
        load_manifest: Callable[[dict], dict],
    ) -> None:
        self.log = csn_log
        self.state = state
        self.wal = wal
        self.load_manifest = load_manifest
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._offers: dict[tuple[int, int], bytes] = {}
        self._offer_lock = threading.Lock()
        self._pull_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="follower", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

    def poke(self, *_: object) -> None:
        self._wake.set()

    def offer(self, epoch: int, seq: int, data: bytes) -> None:
        """An entry this replica just committed: apply it without reading it back."""
        with self._offer_lock:
            self._offers[(epoch, seq)] = data
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                progressed = self.pull()
            except CorruptMetadata as exc:
                log.error("cannot apply the log: %s", exc)
                with self.state.lock:
                    self.state.failure = exc
                    self.state.applied_cond.notify_all()
                self._stop.wait(2.0)
                continue
            except Exception as exc:  # connection trouble: wait for the session to come back
                log.debug("follower: %r", exc)
                self._stop.wait(0.2)
                continue
            if not progressed:
                self._wake.wait(1.0)
                self._wake.clear()

    def pull(self) -> bool:
        """Apply every entry available now; True if anything was applied."""
        with self._pull_lock:
            progressed = False
            while True:
                batch = self._fetch_batch()
                if not batch:
                    return progressed
                self.wal.append([{"csn": c, "epoch": e, "seq": s, "entry": en} for c, e, s, en in batch])
                for csn, epoch, seq, entry in batch:
                    self.state.apply(csn, epoch, seq, entry)
                progressed = True
                if self.state.failure is not None:
                    with self.state.lock:
                        self.state.failure = None

    def _fetch_batch(self) -> list[tuple[int, int, int, dict]]:
        epoch, seq = self.state.position
        out = []
        while len(out) < BATCH:
            with self._offer_lock:
                data = self._offers.pop((epoch, seq), None)
                for k in [k for k in self._offers if k < (epoch, seq)]:
                    del self._offers[k]
            if data is None:
                data = self.log.fetch(epoch, seq)
            if data is None:
                nxt = self._next_position(epoch, seq, bool(out))
                if nxt is None:
                    break
                if nxt[0] != epoch:
                    if out:
                        break  # apply what we have before moving to the next epoch
                    self.state.advance_epoch(epoch)
                epoch, seq = nxt
                continue
            where = self.log.entry_path(epoch, seq)
            entry = decode_entry(data, where)
            if "manifest" in entry:
                entry = self.load_manifest(entry)
            out.append((csn_of(epoch, seq), epoch, seq, entry))
            seq += 1
        return out

    def _next_position(self, epoch: int, seq: int, have_some: bool) -> tuple[int, int] | None:
        """Where the log continues after a missing ``(epoch, seq)``, or None to wait."""
        stat = self.log.zk.exists(self.log.epoch_path(epoch))
        sealed = stat is not None and stat.version >= 1
        if not sealed and stat is not None and stat.cversion <= seq:
            if not have_some:
                if self.log.watch_next(epoch, seq, self.poke):
                    return (epoch, seq)
            return None
        later = [s for s in self.log.list_seqs(epoch) if s >= seq]
        if later:
            return (epoch, later[0])
        if sealed:
            return (epoch + 1, 0)
        return None
