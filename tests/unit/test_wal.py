"""The replica's local WAL (replicas/wal.py): records survive reopening; a torn last record
(a crash while appending) is dropped and the file truncated to the last good record; a bad
record followed by good ones is corruption, reported as CorruptMetadata, never silently skipped."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from coordinator.errors import CorruptMetadata
from coordinator.model.records import WalEntry
from replicas.wal import Wal

HEADER = struct.Struct(">II")


def records(n: int, start: int = 0) -> list[WalEntry]:
    return [WalEntry(i, 0, i - 1, raw={"v": 1, "txns": [], "pad": "x" * (i % 7)}) for i in range(start, start + n)]


def keys(recs: list) -> list[tuple]:
    """What a WAL entry record holds (``raw`` is the entry as written or as read back)."""
    return [(r.csn, r.epoch, r.seq, r.raw) for r in recs]


def offsets(path: Path) -> list[int]:
    """Byte offset where each record starts, and the end of the file."""
    data = path.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        out.append(pos)
        length, _ = HEADER.unpack_from(data, pos)
        pos += HEADER.size + length
    out.append(pos)
    return out


def write(path: Path, recs: list[WalEntry], batches: int = 1) -> None:
    wal = Wal(path)
    step = max(1, len(recs) // batches)
    for i in range(0, len(recs), step):
        wal.append(recs[i : i + step])
    wal.close()


def test_append_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "d" / "wal.log"
    wal = Wal(path)
    assert wal.records() == [] and wal.dropped_tail == 0
    wal.append(records(3))
    wal.append(records(2, start=3), sync=False)
    wal.append([])
    wal.close()
    again = Wal(path)
    assert keys(again.records()) == keys(records(5))
    assert again.dropped_tail == 0
    again.append(records(1, start=5))
    again.close()
    assert keys(Wal(path).records()) == keys(records(6))


def test_sync_after_unsynced_appends_and_after_a_compaction(tmp_path: Path) -> None:
    """The follower appends what it read unsynced and calls ``sync`` once it applied it; a
    compaction in between swaps the file, and ``sync`` then makes the new one durable."""
    path = tmp_path / "wal.log"
    wal = Wal(path)
    wal.append(records(3), sync=False)
    wal.sync()
    wal.compact(lambda r: r.csn >= 1)
    wal.append(records(2, start=3), sync=False)
    wal.sync()
    wal.close()
    assert keys(Wal(path).records()) == keys(records(4, start=1))


@pytest.mark.parametrize("cut", [1, 3, 7, 8, 9, -1])
def test_torn_tail_is_dropped_and_file_truncated(tmp_path: Path, cut: int) -> None:
    """Cut the last record anywhere: inside its header (1-7 bytes kept), right after it (8), a
    byte into its body, or one byte short of complete (-1)."""
    path = tmp_path / "wal.log"
    write(path, records(4), batches=4)
    offs = offsets(path)
    last_start, end = offs[-2], offs[-1]
    keep = end - 1 if cut == -1 else last_start + cut
    with open(path, "r+b") as fh:
        fh.truncate(keep)
    wal = Wal(path)
    assert keys(wal.records()) == keys(records(3))
    assert wal.dropped_tail == keep - last_start
    assert path.stat().st_size == last_start  # truncated to the last good record
    # Appending after the truncation yields a clean log.
    wal.append(records(1, start=10))
    wal.close()
    reopened = Wal(path)
    assert keys(reopened.records()) == keys(records(3) + records(1, start=10))
    assert reopened.dropped_tail == 0


def test_torn_tail_with_garbage_bytes(tmp_path: Path) -> None:
    """A last record whose bytes are garbage (a header promising more than is there, or a
    checksum that does not match) is a torn tail too."""
    path = tmp_path / "wal.log"
    write(path, records(2))
    good = path.stat().st_size
    with open(path, "ab") as fh:
        fh.write(HEADER.pack(1_000_000, 0) + b"partial")
    assert keys(Wal(path).records()) == keys(records(2))
    assert path.stat().st_size == good
    body = b'{"csn": 99}'
    with open(path, "ab") as fh:
        fh.write(HEADER.pack(len(body), zlib.crc32(body) ^ 1) + body)
    wal = Wal(path)
    assert keys(wal.records()) == keys(records(2)) and wal.dropped_tail == HEADER.size + len(body)
    assert path.stat().st_size == good


def test_corrupt_middle_record_raises(tmp_path: Path) -> None:
    path = tmp_path / "wal.log"
    write(path, records(5), batches=5)
    offs = offsets(path)
    before = path.read_bytes()
    data = bytearray(before)
    data[offs[2] + HEADER.size + 3] ^= 0x55  # a body byte of the third record
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptMetadata) as info:
        Wal(path)
    assert str(path) in str(info.value)
    assert f"byte {offs[2]}" in str(info.value)
    assert path.read_bytes() == bytes(data)  # nothing truncated: the good records after it stay


def test_corrupt_length_in_middle_raises(tmp_path: Path) -> None:
    path = tmp_path / "wal.log"
    write(path, records(4), batches=4)
    offs = offsets(path)
    data = bytearray(path.read_bytes())
    struct.pack_into(">I", data, offs[1], 0xFFFFFFF0)  # an absurd length in record 2's header
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptMetadata, match="corrupt record"):
        Wal(path)


def test_record_that_is_not_json_raises(tmp_path: Path) -> None:
    """A record with a valid checksum whose payload does not parse was written so: corruption."""
    path = tmp_path / "wal.log"
    write(path, records(1))
    body = b"\xff{not json"
    with open(path, "ab") as fh:
        fh.write(HEADER.pack(len(body), zlib.crc32(body)) + body)
    with pytest.raises(CorruptMetadata, match="does not parse"):
        Wal(path)


def test_zero_filled_tail_is_torn(tmp_path: Path) -> None:
    """After a crash a file system may show the appended length with zeros for data: a
    zero-length record is never written, so the zeros are a torn tail, not a fatal record."""
    path = tmp_path / "wal.log"
    write(path, records(3))
    good = path.stat().st_size
    with open(path, "ab") as fh:
        fh.write(b"\0" * 4096)
    wal = Wal(path)
    assert keys(wal.records()) == keys(records(3))
    assert wal.dropped_tail == 4096
    assert path.stat().st_size == good


def test_corrupt_large_record_in_middle_raises(tmp_path: Path) -> None:
    """A corrupt record larger than any scan window, followed by good records, is still reported
    as corruption (the good records after it must not be truncated away as a 'tail')."""
    path = tmp_path / "wal.log"
    big = WalEntry(1, 0, 0, raw={"pad": "y" * 200_000})
    wal = Wal(path)
    wal.append(records(1))
    wal.append([big])
    wal.append(records(2, start=5))
    wal.close()
    offs = offsets(path)
    data = bytearray(path.read_bytes())
    data[offs[1] + HEADER.size + 100] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptMetadata, match="followed by valid"):
        Wal(path)
    assert path.read_bytes() == bytes(data)


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 64 KiB tmpfs: a real full disk (needs root, as the chaos harness's WAL fault does)."""
    import subprocess

    mount = tmp_path / "tiny"
    mount.mkdir()
    if (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True).returncode
        != 0
    ):
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_write_that_fills_the_disk_leaves_no_torn_record(tiny_disk: Path) -> None:
    """Found by `mergetxn chaos` (the wal-full fault): a write cut short by a full disk left a
    torn record, later appends followed it, and the next start refused the WAL ("corrupt record
    ... followed by valid ones"). The failed write is now cut back; the WAL stays usable."""
    path = tiny_disk / "wal.log"
    wal = Wal(path)
    written: list[WalEntry] = []
    big = [WalEntry(i, 0, i - 1, raw={"v": 1, "txns": [], "pad": "y" * 3000}) for i in range(1, 200)]
    with pytest.raises(OSError):
        for rec in big:
            wal.append([rec])
            written.append(rec)
    assert written, "nothing fit on the disk"
    assert path.stat().st_size == offsets(path)[-1]  # the file ends where its last whole record does
    wal.close()
    again = Wal(path)
    assert keys(again.records()) == keys(written) and again.dropped_tail == 0
    # Once there is room again, appends go on after the last whole record.
    data = path.read_bytes()
    path.write_bytes(data[: offsets(path)[-2]])  # make room: drop the last record
    again.close()
    third = Wal(path)
    third.append(records(1, start=500))
    third.close()
    assert keys(Wal(path).records()) == keys(written[:-1] + records(1, start=500))
