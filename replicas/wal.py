"""The replica's local write-ahead log.

Records are ``<length:u32><crc32:u32><payload>``, appended and fsynced in batches. On open,
records are read until the first one that is short or fails its checksum: a crash while
appending leaves at most a torn last record, which is dropped (the file is truncated there)
rather than treated as fatal, because the entry it held is still in ZooKeeper's log.
A bad record followed by good ones is not a torn tail but corruption, and is reported. A write
that fails (a full disk) is cut back to where it began, so it never leaves one.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from coordinator.core import jsonwire
from coordinator.core.errors import CorruptMetadata
from coordinator.model.records import WalRecord, wal_record_body, wal_record_from_dict

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">II")
MAX_RECORD = 256 * 1024 * 1024
ROOM_MARGIN = 64 * 1024  # beside a commit's record: the staged records of commits in flight, page rounding


class Wal:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self.compacting = False  # appends wait meanwhile: callers that must not wait look first
        self.dropped_tail = 0
        self.syncs = 0  # fsyncs of appended records (info()'s committer "wal_syncs": commits per fsync)
        self._records = list(self._scan())
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size  # where the next append begins (kept: no fstat per write)

    def _scan(self) -> Iterator[WalRecord]:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        pos = 0
        good_end = 0
        while pos < len(data):
            if pos + _HEADER.size > len(data):
                break
            length, crc = _HEADER.unpack_from(data, pos)
            body = data[pos + _HEADER.size : pos + _HEADER.size + length]
            # A zero length is never written (a record holds JSON): zeros a crash left behind.
            if length == 0 or length > MAX_RECORD or len(body) < length or zlib.crc32(body) != crc:
                end = pos + _HEADER.size + length
                if self._valid_record_follows(data, pos + 1) or (
                    length and end < len(data) and self._valid_record_follows(data, end, window=1)
                ):
                    raise CorruptMetadata(f"WAL {self.path} has a corrupt record at byte {pos} followed by valid ones")
                break
            try:
                record = jsonwire.loads(body)
            except ValueError as exc:
                raise CorruptMetadata(f"WAL {self.path} record at byte {pos} does not parse: {exc}") from exc
            pos += _HEADER.size + length
            good_end = pos
            yield wal_record_from_dict(record, f"WAL {self.path} record at byte {pos - _HEADER.size - length}")
        if good_end < len(data):
            self.dropped_tail = len(data) - good_end
            log.warning("WAL %s: dropping a torn last record (%d bytes)", self.path, self.dropped_tail)
            with open(self.path, "r+b") as fh:
                fh.truncate(good_end)
                fh.flush()
                os.fsync(fh.fileno())

    @staticmethod
    def _valid_record_follows(data: bytes, start: int, window: int = 1 << 16) -> bool:
        """Whether a well-formed record starts anywhere after a bad one (so it was not a tail):
        within ``window`` bytes of ``start`` (the caller also tries where the bad one says it ends)."""
        for pos in range(start, min(len(data) - _HEADER.size, start + window)):
            length, crc = _HEADER.unpack_from(data, pos)
            end = pos + _HEADER.size + length
            if 0 < length <= len(data) - pos - _HEADER.size and zlib.crc32(data[pos + _HEADER.size : end]) == crc:
                return True
        return False

    def records(self) -> list[WalRecord]:
        """The records found when the WAL was opened, in order."""
        return self._records

    def append(self, records: list[WalRecord], sync: bool = True) -> None:
        """Append records; with ``sync`` they are on disk when this returns. Writes are
        serialised, fsyncs are not held under the write lock: an unsynced append (a staged part,
        which must survive a process kill but not a power loss) never waits on an fsync."""
        self._write([wal_record_body(r) for r in records], sync)

    def _write(self, bodies: list[bytes], sync: bool) -> None:
        buf = bytearray()
        for body in bodies:
            buf += _HEADER.pack(len(body), zlib.crc32(body)) + body
        view = memoryview(buf)
        with self._lock:
            start = self._size
            try:
                while view:
                    view = view[os.write(self._fd, view) :]
            except OSError:
                # A full disk (or any failed write) can cut a record short; later appends would
                # follow it and the next open would find a corrupt record followed by valid ones.
                # Cut the file back to where this write began: the records were not written.
                os.ftruncate(self._fd, start)
                raise
            self._size = start + len(buf)
        if sync:
            self.sync()

    def check_room(self, size: int) -> None:
        """Raise ``OSError(ENOSPC)`` unless the WAL's file system has room for a record of
        ``size`` payload bytes and :data:`ROOM_MARGIN` more (a commit checks before its multi:
        an entry in ZooKeeper's log that this replica cannot write to its WAL is not applied
        here, and its commit is not answered, until space is freed)."""
        stat = os.statvfs(self.path.parent)  # not the fd: a compaction may be swapping it
        free = stat.f_bavail * stat.f_frsize
        if free < size + _HEADER.size + ROOM_MARGIN:
            raise OSError(
                errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: {free} bytes free, a {size}-byte record needs more"
            )

    def sync(self) -> None:
        """Make every record appended so far durable (after appends with ``sync=False``)."""
        with self._sync_lock:
            os.fsync(self._fd)
            self.syncs += 1

    def compact(self, keep: Callable[[WalRecord], bool], head: Iterable[WalRecord] = ()) -> int:
        """Rewrite the WAL as ``head`` plus the records ``keep`` accepts (a local state snapshot
        now holds the rest: see replicas/checkpoint.py). Atomic: a new file is written and
        fsynced, then renamed over this one; appends wait meanwhile. Returns records dropped."""
        with self._lock, self._sync_lock:
            self.compacting = True
            try:
                return self._compact(keep, head)
            finally:
                self.compacting = False

    def _compact(self, keep: Callable[[WalRecord], bool], head: Iterable[WalRecord]) -> int:
        kept, dropped = list(head), 0
        for rec in self._scan():
            if keep(rec):
                kept.append(rec)
            else:
                dropped += 1
        tmp = self.path.with_name(self.path.name + ".compact")
        buf = bytearray()
        for r in kept:
            body = wal_record_body(r)
            buf += _HEADER.pack(len(body), zlib.crc32(body)) + body
        with open(tmp, "wb") as fh:
            fh.write(buf)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size
        return dropped

    def close(self) -> None:
        with self._lock, self._sync_lock:
            os.close(self._fd)
