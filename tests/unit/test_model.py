"""coordinator/model/records.py: each contract encodes and decodes in one place, round trips whole, and
anything malformed is CorruptMetadata naming where it came from (never half decoded).

Pure: no ZooKeeper, no storage. The WAL's framing (lengths, checksums, torn records) is
tests/unit/test_wal.py's; the conflict kinds on the wire are tests/unit/test_rules.py's."""

from __future__ import annotations

import pytest
from support.builders import change, entry, part, table_def, tid  # tests/ is on sys.path

from coordinator.core import jsonwire
from coordinator.core.conflicts import Kind
from coordinator.errors import CorruptMetadata
from coordinator.model.records import (
    AliveRecord,
    CommitStatus,
    LogEntry,
    ManifestPointer,
    TxnState,
    WalBase,
    WalEntry,
    WalStaged,
    decode_log_node,
    wal_record_body,
    wal_record_from_dict,
)

WHERE = "/mergetxn/log/e-0000000000/c-0000000007"


def sample_entry() -> LogEntry:
    a, b = tid(1), tid(2, host="r1")
    return entry(
        (a, [change("t", (1,), [Kind.INSERT], added=[part("p1", partition=(1,), creator=a)])]),
        (
            b,
            [
                change(
                    "t",
                    (2,),
                    [Kind.OVERWRITE, Kind.MUTATE],
                    added=[part("p2", partition=(2,), creator=b)],
                    removed=["p0"],
                )
            ],
        ),
        versions={"t/[2]": 3, "t": 1},
        ddl=[table_def("u")],
        time=12.5,
    )


# -- the log --------------------------------------------------------------------------------------
def test_log_entry_round_trips_whole() -> None:
    e = sample_entry()
    back = decode_log_node(e.encode(), WHERE)
    assert back == e
    assert back.encode() == e.encode()  # one encoding: sorted keys


def test_log_entry_without_ddl_has_no_ddl_key() -> None:
    e = entry((tid(1), [change("t", (), [Kind.INSERT])]))
    assert "ddl" not in e.to_dict()
    assert decode_log_node(e.encode(), WHERE) == e


def test_compaction_has_no_time_version() -> None:
    e = entry((tid(1), [change("t", (), [Kind.MINOR_COMPACT])]), time_version=None)
    assert decode_log_node(e.encode(), WHERE).txns[0].time_version is None


def test_manifest_pointer_round_trips() -> None:
    pointer = ManifestPointer("_manifests/e-0/c-7.json")
    assert decode_log_node(pointer.encode(), WHERE) == pointer


@pytest.mark.parametrize(
    "data,says",
    [
        (b"\x00\xffnot json{", "is not valid JSON"),
        (b"[1, 2]", "no supported format version"),
        (b'{"txns": []}', "no supported format version"),
        (b'{"v": 99, "txns": []}', "no supported format version"),
        (b'{"v": 1, "manifest": 7}', "names a manifest that is not a path"),
        (b'{"v": 1, "txns": [{"tid": "nonsense", "changes": []}]}', "is malformed"),
        (
            b'{"v": 1, "txns": [{"tid": "T1-0-r0", "changes": [{"table": "t", "pkey": "[]", "kinds": ["bogus"]}]}]}',
            "is malformed",
        ),
        (b'{"v": 1, "txns": [{"tid": "T1-0-r0", "changes": [{"table": "t", "kinds": []}]}]}', "is malformed"),
        (
            b'{"v": 1, "txns": [{"tid": "T1-0-r0", "changes": [{"table": "t", "pkey": "[]", "kinds": [],'
            b' "added": [{"name": "x"}]}]}]}',
            "is malformed",
        ),
        (b'{"v": 1, "versions": {"t": "three"}}', "is malformed"),
        (b'{"v": 1, "versions": []}', "is malformed"),
        (b'{"v": 1, "ddl": [{"create_table": {"name": "evil", "schema": "!!"}}]}', "is malformed"),
        (b'{"v": 1, "ddl": [{"drop_table": "t"}]}', "is malformed"),
    ],
    ids=[
        "bytes",
        "list",
        "no-version",
        "version-99",
        "manifest-not-path",
        "bad-tid",
        "bad-kind",
        "no-pkey",
        "bad-part",
        "bad-version-value",
        "versions-not-dict",
        "bad-schema",
        "unknown-ddl",
    ],
)
def test_a_log_node_that_does_not_parse_is_corrupt_metadata_naming_it(data: bytes, says: str) -> None:
    with pytest.raises(CorruptMetadata) as info:
        decode_log_node(data, WHERE)
    assert f"log entry {WHERE} " in str(info.value)
    assert says in str(info.value)


# -- the WAL --------------------------------------------------------------------------------------
def wal_round_trip(rec: object) -> object:
    return wal_record_from_dict(jsonwire.loads(wal_record_body(rec)), "wal.log@0")


def test_wal_entry_round_trips_and_validates_when_replayed() -> None:
    e = sample_entry()
    for written in (
        WalEntry(9, 0, 8, entry=e),
        WalEntry(9, 0, 8, entry=e, raw=e.encode()),
        WalEntry(9, 0, 8, raw=e.to_dict()),
    ):
        back = wal_round_trip(written)
        assert isinstance(back, WalEntry) and (back.csn, back.epoch, back.seq) == (9, 0, 8)
        assert back.entry is None and isinstance(back.raw, dict)  # decoded JSON, not yet validated
        assert back.log_entry("wal.log") == e


def test_wal_entry_that_does_not_validate_names_the_wal_and_csn() -> None:
    back = wal_round_trip(WalEntry(9, 0, 8, raw={"v": 1, "txns": [{"tid": "nonsense"}]}))
    with pytest.raises(CorruptMetadata, match=r"log entry wal\.log \(CSN 9\) is malformed"):
        back.log_entry("wal.log")


def test_wal_staged_and_base_round_trip() -> None:
    staged = WalStaged(tid(3), ("t/a.parquet", "t/a.json"))
    assert wal_round_trip(staged) == staged
    assert wal_round_trip(WalStaged(tid(3), ())) == WalStaged(tid(3), ())
    assert wal_round_trip(WalBase(41)) == WalBase(41)


@pytest.mark.parametrize(
    "d,says",
    [
        ({"nothing": 1}, "record of no known kind"),
        ([1, 2], "record of no known kind"),
        ({"entry": {}, "csn": "x", "epoch": 0, "seq": 0}, "record is malformed"),
        ({"entry": {}, "epoch": 0, "seq": 0}, "record is malformed"),
        ({"base": "soon"}, "record is malformed"),
        ({"staged": "T1-0-r0", "paths": 5}, "record is malformed"),
    ],
)
def test_a_wal_record_of_no_known_kind_or_malformed_names_where(d: object, says: str) -> None:
    with pytest.raises(CorruptMetadata, match=f"^wal.log@12: {says}"):
        wal_record_from_dict(d, "wal.log@12")


# -- the alive node -------------------------------------------------------------------------------
def test_alive_record_round_trips() -> None:
    rec = AliveRecord(
        address="127.0.0.1:7000",
        incarnation=3,
        applied=40,
        oldest_txn_snapshot=31,
        oldest_snapshot=31,
        snapshots=((31, tid(1)), (35, "read")),
        running=(tid(1),),
    )
    back = AliveRecord.decode(rec.encode())
    assert back == rec
    assert back.knows_running


def test_alive_record_oldest_snapshot_is_the_lowest_need() -> None:
    """Whatever the node says its oldest snapshot is, nothing above what it applied or what its
    oldest transaction reads counts as that."""

    def decoded(**d: object) -> AliveRecord:
        return AliveRecord.decode(jsonwire.dumps({"running": [], **d}))

    assert decoded(applied=40, oldest_snapshot=50, min_snapshot=45).oldest_snapshot == 40
    assert decoded(applied=40, oldest_snapshot=50, min_snapshot=30).oldest_snapshot == 30
    assert decoded(applied=40, oldest_snapshot=20).oldest_snapshot == 20
    assert decoded(applied=40, oldest_snapshot=True, min_snapshot="7").oldest_snapshot == 40  # not CSNs
    assert decoded().oldest_snapshot == 0


@pytest.mark.parametrize(
    "data",
    [
        b"\x00\xff",
        b"not json",
        b"[1, 2]",
        b"7",
        b'{"incarnation": "third"}',
        b'{"snapshots": [[1]]}',
        b'{"snapshots": 5}',
    ],
    ids=["bytes", "text", "list", "number", "bad-incarnation", "short-snapshot", "snapshots-not-list"],
)
def test_a_malformed_alive_node_keeps_everything(data: bytes) -> None:
    rec = AliveRecord.decode(data)
    assert rec.malformed
    assert rec.oldest_snapshot == 0
    assert not rec.knows_running


def test_an_alive_node_without_running_does_not_know_its_running() -> None:
    rec = AliveRecord.decode(jsonwire.dumps({"applied": 9, "oldest_snapshot": 9}))
    assert not rec.malformed and rec.oldest_snapshot == 9
    assert rec.running_overflow and not rec.knows_running
    overflow = AliveRecord.decode(AliveRecord(applied=9, oldest_snapshot=9, running_overflow=True).encode())
    assert not overflow.knows_running


# -- outcomes -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "status",
    [
        CommitStatus(tid(1), TxnState.COMMITTED, 17),
        CommitStatus(tid(2), TxnState.ABORTED, None, "time limit of 1 s exceeded"),
        CommitStatus(tid(3), TxnState.RUNNING),
        CommitStatus(tid(4), "aborted"),
    ],
)
def test_commit_status_round_trips(status: CommitStatus) -> None:
    wire = jsonwire.loads(jsonwire.dumps(status.to_dict()))
    back = CommitStatus.from_dict(wire)
    assert back == status
    assert back.status == str(status.status)
