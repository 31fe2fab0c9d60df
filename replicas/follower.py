"""Following the CSN log: fetch entries in CSN order, write them to the WAL, apply them.

Entries are fetched by their exact path (``e-<epoch>/c-<seq>``), so catching up costs one read
per entry and never a listing of the whole epoch. The next entry is awaited with a one-shot
``exists`` watch; the committer of this replica hands over the entries it wrote itself, so a
local commit is applied without a read. A listing is needed only in rare cases: the epoch was
sealed, or the parent's child counter shows that a sequence number was skipped.

The log's tail is trimmed (replicas/checkpoint.py): whole sealed epochs are removed once a
checkpoint in storage holds the state they built. Before skipping anything (a gap, the end of an
epoch, a missing epoch) the follower checks the checkpoint node; when its position lies in a
trimmed epoch it loads the checkpoint instead (``load_checkpoint``), then follows the tail.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from coordinator.core.errors import CorruptMetadata
from coordinator.core.versions import csn_of
from coordinator.model.records import LogEntry, ManifestPointer, WalEntry, decode_log_node
from coordinator.zk.log import CsnLog, given_out
from replicas import failpoints
from replicas.state import ReplicaState
from replicas.wal import Wal

log = logging.getLogger(__name__)


BATCH = 256
TRIMMED = (-1, -1)  # _next_position: the position lies in a trimmed epoch (restore a checkpoint)


class HandOver(Protocol):
    """How the committer hands its own log entry to the follower (:meth:`Follower.local_commit`)."""

    def __call__(
        self, epoch: int, seq: int, data: bytes, own: tuple[LogEntry, bytes] | None = None, sync: bool = True
    ) -> None: ...


class Follower:
    def __init__(
        self,
        csn_log: CsnLog,
        state: ReplicaState,
        wal: Wal,
        load_manifest: Callable[[ManifestPointer], bytes],
        load_checkpoint: Callable[[dict], None] | None = None,
    ) -> None:
        self.log, self.state, self.wal = csn_log, state, wal
        self.load_manifest, self.load_checkpoint = load_manifest, load_checkpoint
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._offers: dict[tuple[int, int], bytes] = {}
        self._offer_lock = threading.Lock()
        self._pull_lock = threading.Lock()
        # An exists-watch is armed on the next position and has not fired: ((epoch, seq), pokes
        # when it was armed). While it holds, that entry does not exist yet and ZooKeeper need not
        # be asked again; any poke (the watch firing, a session event, a reader) voids it.
        self._pokes = 0
        self._armed: tuple[tuple[int, int], int] | None = None
        # Positions with an exists-watch armed by this follower: one in an epoch behind the
        # position was never created (the epoch was sealed first) and is removed (a leak else).
        self._watching: set[tuple[int, int]] = set()
        self._after_own = False  # the last batch ended with an entry this replica committed
        self._idle = threading.Event()  # cleared while a local commit multi is in flight
        self._idle.set()
        self._thread = threading.Thread(target=self._run, name="follower", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():  # a start that failed may never have started it
            self._thread.join(timeout=5)

    def poke(self, *_: object) -> None:
        self._pokes += 1
        self._wake.set()

    def offer(self, epoch: int, seq: int, data: bytes) -> None:
        """An entry this replica just committed: apply it without reading it back."""
        with self._offer_lock:
            self._offers[(epoch, seq)] = data
        self._wake.set()

    @contextmanager
    def local_commit(self) -> Iterator[HandOver]:
        """Around a local commit multi: the follower thread holds off meanwhile (the watch on
        the entry fires before the multi returns), so that the committer hands its own entry
        over instead of the follower reading it back from ZooKeeper. Yields the hand-over."""
        self._idle.clear()
        try:
            yield self._hand_over
        finally:
            self._idle.set()
            self._wake.set()  # look past it (re-arm the watch) if no other commit follows

    def _hand_over(
        self, epoch: int, seq: int, data: bytes, own: tuple[LogEntry, bytes] | None = None, sync: bool = True
    ) -> None:
        if not self.apply_own(epoch, seq, data, own, sync=sync):
            self.offer(epoch, seq, data)

    def decode(self, data: bytes, where: str) -> tuple[LogEntry, bytes]:
        """A log znode's data as the entry and its full encoding (a manifest's, if it points to
        one); CorruptMetadata naming ``where`` if it does not decode whole."""
        node = decode_log_node(data, where)
        if isinstance(node, LogEntry):
            return node, data
        raw = self.load_manifest(node)
        entry = decode_log_node(raw, node.path)
        if not isinstance(entry, LogEntry):
            raise CorruptMetadata(f"manifest {node.path} named by {where} points to another manifest")
        return entry, raw

    def apply_own(
        self,
        epoch: int,
        seq: int,
        data: bytes,
        own: tuple[LogEntry, bytes] | None = None,
        timeout: float = 5.0,
        sync: bool = True,
    ) -> bool:
        """Apply an entry this replica just committed, in the caller's thread, when it is the
        next one here (WAL first, as for any entry). Saves the committer a hand-over to the
        follower thread, and with ``own`` (the entry as the committer built it) the decoding
        of its own entry. False when it could not: the caller then offers it and waits.
        ``sync`` False: the WAL record is written, and fsynced by the caller later (the
        committer answers first: docs/guarantees.md, "Read your writes")."""
        if not self._pull_lock.acquire(timeout=timeout):
            return False
        try:
            if self.state.position > (epoch, seq):
                return True  # the follower got there first (it read the entry from ZooKeeper)
            if self.state.position != (epoch, seq):
                return False  # earlier entries are not applied yet: the follower fetches them
            csn = csn_of(epoch, seq)
            # As in a pull: decoded (refused whole) before the WAL sees it.
            entry, raw = own if own is not None else self.decode(data, self.log.entry_path(epoch, seq))
            self.wal.append([WalEntry(csn, epoch, seq, entry, raw)], sync=sync)
            self.state.apply(csn, epoch, seq, entry)
            self._after_own = True
            return True
        except Exception as exc:  # leave it to the follower thread, which retries
            log.warning("could not apply own entry %d/%d in place: %r", epoch, seq, exc)
            return False
        finally:
            self._pull_lock.release()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._idle.wait(0.25)  # a local commit in flight: let it hand its entry over
            failpoints.hit("follower_loop")  # a test holds this thread (not a caller's pull) here
            try:
                progressed = self._pull()
            except CorruptMetadata as exc:
                log.error("cannot apply the log: %s", exc)
                self.state.set_failure(exc)
                self._stop.wait(2.0)
                continue
            except Exception as exc:  # connection trouble: wait for the session to come back
                log.debug("follower: %r", exc)
                self._stop.wait(0.2)
                continue
            if not progressed:
                if not self._wake.wait(1.0):
                    self._armed = None  # periodic full check (an epoch sealed elsewhere, a gap)
                self._wake.clear()

    def pull(self) -> bool:
        """Apply every entry available now; True if anything was applied.

        A caller (outcome lookup after a lost connection, start-up) wants what ZooKeeper holds
        now, not what an earlier watch implied: the poke voids any armed watch first."""
        self._pokes += 1
        return self._pull()

    def _pull(self) -> bool:
        progressed = False
        try:
            with self._pull_lock:
                while True:
                    batch = self._fetch_batch()
                    if not batch:
                        self._forget_passed_watches()
                        return progressed
                    failpoints.hit("follower_apply")  # a test holds this replica behind the log here
                    # Written before it is applied (a process killed after the apply has it), made
                    # durable once applied: a committer here waiting for this entry's versions, or a
                    # reader for its snapshot, does not wait for the fsync (one per pull; one per batch before).
                    self.wal.append([WalEntry(c, e, s, en, raw) for c, e, s, en, raw in batch], sync=False)
                    progressed = True
                    for csn, epoch, seq, entry, _ in batch:
                        self.state.apply(csn, epoch, seq, entry)
                    if self.state.failure is not None:
                        self.state.clear_failure()
        finally:
            if progressed:
                self.wal.sync()  # outside the lock: an own entry's apply (apply_own) need not wait

    def _watch_next(self, epoch: int, seq: int) -> bool:
        """:meth:`CsnLog.watch_next`, remembering the position while the watch is armed."""
        if self.log.watch_next(epoch, seq, self.poke):
            return True
        self._watching.add((epoch, seq))
        return False

    def _forget_passed_watches(self) -> None:
        """Remove the watches armed in epochs behind the position: their entries will never be
        created (a watch on an entry that was created fired and is gone already)."""
        position = self.state.position
        for pos in [p for p in self._watching if p < position]:
            self._watching.discard(pos)
            if pos[0] < position[0]:
                self.log.forget_watch(*pos)

    def _fetch_batch(self) -> list[tuple[int, int, int, LogEntry, bytes]]:
        epoch, seq = self.state.position
        out: list[tuple[int, int, int, LogEntry, bytes]] = []
        own = False
        while len(out) < BATCH:
            data, ahead = self._take_offer(epoch, seq)
            if data is not None:
                own = True
            elif not ahead and self._stop_before_read(epoch, seq, own):
                break
            if data is None:
                data = self.log.fetch(epoch, seq)
            if data is None:
                moved = self._past_missing(epoch, seq, out)
                if moved is None:
                    break
                epoch, seq = moved
                continue
            where = self.log.entry_path(epoch, seq)
            try:
                entry, raw = self.decode(data, where)  # refuse it whole, before the WAL sees it
            except CorruptMetadata:
                if out:
                    break  # apply the good entries before it; the next batch reports it
                raise
            out.append((csn_of(epoch, seq), epoch, seq, entry, raw))
            seq += 1
        return out

    def _take_offer(self, epoch: int, seq: int) -> tuple[bytes | None, bool]:
        """The entry a local commit offered for ``(epoch, seq)`` (None if none), forgetting the
        offers below it, and whether later ones wait (entries up to them exist)."""
        with self._offer_lock:
            data = self._offers.pop((epoch, seq), None)
            for k in [k for k in self._offers if k < (epoch, seq)]:
                del self._offers[k]
            ahead = bool(self._offers)  # later local commits: entries up to them exist
        return data, ahead

    def _stop_before_read(self, epoch: int, seq: int, own: bool) -> bool:
        """Whether the batch ends before reading ``(epoch, seq)`` (no offer there nor after it)."""
        if own:
            self._after_own = True  # apply our own commit first, look further afterwards
            return True
        if not self._idle.is_set():
            return True  # a local commit is in flight: it hands its entry over (or offers it)
        if seq < self.log.epoch_size and self._armed == ((epoch, seq), self._pokes):
            return True  # the watch on this position has not fired: nothing new
        if self._after_own and seq < self.log.epoch_size:
            # Right after our own commit the next entry is rarely there: arm the watch
            # directly (one request) instead of a read, an epoch stat and then the watch.
            self._after_own = False
            pokes = self._pokes
            if not self._watch_next(epoch, seq):
                self._armed = ((epoch, seq), pokes)
                return True
        return False

    def _past_missing(self, epoch: int, seq: int, out: list) -> tuple[int, int] | None:
        """Where to read next when ``(epoch, seq)`` is missing, or None to end the batch (what
        it has, ``out``, is applied first)."""
        nxt = self._next_position(epoch, seq, bool(out))
        if nxt is None:
            return None
        if nxt == TRIMMED:
            if out:
                return None  # apply what we fetched before the entries went
            self._restore_from_tail()
            return self.state.position
        if nxt[0] != epoch:
            if out:
                return None  # apply what we have before moving to the next epoch
            self.state.advance_epoch(epoch)
        return nxt

    def _restore_from_tail(self) -> None:
        """Our position is in a trimmed epoch: take the state from the checkpoint (which covers
        every trimmed entry) unless everything trimmed is applied here already."""
        tail, _ = self.log.read_tail()
        if tail is None:
            raise CorruptMetadata(
                f"log entries at {self.state.position} are missing and {self.log.tail_path()} names no checkpoint"
            )
        if self.state.applied < int(tail["csn"]):
            if self.load_checkpoint is None:
                raise CorruptMetadata(
                    f"log trimmed past CSN {self.state.applied} and this follower cannot load checkpoints"
                )
            log.warning(
                "position %s is below the retained log: loading checkpoint %s (CSN %s)",
                self.state.position,
                tail["path"],
                tail["csn"],
            )
            self.load_checkpoint(tail)
        self.state.advance_epoch(int(tail["trimmed_epoch"]))

    def _next_position(self, epoch: int, seq: int, have_some: bool) -> tuple[int, int] | None:
        """Where the log continues after a missing ``(epoch, seq)``, or None to wait.

        Sequence numbers are dense: ZooKeeper numbers an epoch's children in creation order,
        only commits create them, a failed multi gives out no number, and nothing deletes an
        entry of an epoch the tail has not trimmed. So a missing entry whose number its epoch
        gave out (:func:`given_out`), or below a later entry, was deleted: CorruptMetadata
        naming it, never a skip (a skipped commit would be applied by some replicas and not
        by others, silently)."""
        # The data watch fires when the epoch is sealed (or trimmed): look past its end then.
        stat = self.log.zk.exists(self.log.epoch_path(epoch), watch=self.poke)
        sealed = stat is not None and stat.version >= 1
        end = -1 if stat is None else given_out(stat)  # the number the next entry of the epoch gets
        if not sealed and stat is not None and end <= seq:
            if not have_some:
                pokes = self._pokes
                if self._watch_next(epoch, seq):
                    return (epoch, seq)
                self._armed = ((epoch, seq), pokes)
            return None
        if not sealed and stat is not None and self.log.zk.exists(self.log.entry_path(epoch, seq)) is not None:
            return (epoch, seq)  # created since our read: no need to list the whole epoch
        later = [s for s in self.log.list_seqs(epoch) if s >= seq]
        if later and later[0] == seq:
            return (epoch, seq)  # created after our read (and its epoch sealed since): read it again
        if (later or sealed or stat is None) and epoch <= self.log.trimmed_epoch():
            return TRIMMED  # never skip entries that were trimmed: the checkpoint has them
        if later or seq < end:
            why = (
                f"{self.log.entry_path(epoch, later[0])} exists"
                if later
                else f"{self.log.epoch_path(epoch)} gave out numbers up to {end - 1}"
            )
            raise CorruptMetadata(missing_entry(self.log.entry_path(epoch, seq), why))
        if sealed:
            return (epoch + 1, 0)
        if stat is None and any(e > epoch for e in self.log.epochs()):
            raise CorruptMetadata(
                f"log epoch {self.log.epoch_path(epoch)} is missing below the end of the log "
                f"(later epochs exist and the log tail has not trimmed it): its entries were "
                f'deleted; never skipped, see docs/architecture/outcomes-recovery.md, "A log entry '
                f'that does not parse"'
            )
        return None


def missing_entry(node: str, why: str) -> str:
    """The message of a log entry gone from below the end of the log."""
    return (
        f"log entry {node} is missing below the end of the log ({why}) and the log tail has not trimmed "
        f"it: it was deleted; never skipped, see docs/architecture/outcomes-recovery.md, "
        f'"A log entry that does not parse"'
    )
