"""Every ZooKeeper node body as a typed record (coordinator/model/znodes.py, coordinator/model/records.py).

Each record round-trips; the bytes earlier versions wrote (literals below, as that code wrote
them) still decode; and a hostile body (truncated, wrong types, missing fields, huge numbers,
non-UTF-8, deep nesting, random bytes) is CorruptMetadata naming the node, bounded, and never
any other exception: node bodies are input from outside the process.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.core.errors import MAX_MESSAGE, CorruptMetadata
from coordinator.core.grants import Role
from coordinator.core.versions import Tid
from coordinator.model.records import (
    AliveRecord,
    LogEntry,
    ManifestPointer,
    TxnRecord,
    decode_log_node,
)
from coordinator.model.users import UserRecord, hash_secret
from coordinator.model.znodes import (
    TABLE_LIVE,
    TARGET_BODY,
    TOMBSTONE,
    ConfigRecord,
    EpochNode,
    FenceRecord,
    Marks,
    OwnerRecord,
    TableNode,
    TailRecord,
    UsersNode,
)

WHERE = "/mergetxn/some/node"


def tid(n: int) -> str:
    return str(Tid(1, n, "r0"))


def user(name: str = "alice", tables: tuple[str, ...] | None = ("events",)) -> UserRecord:
    return UserRecord(
        name,
        Role.WRITER if tables is not None else Role.ADMIN,
        tables,
        hash_secret("s" * 20, salt=b"\0" * 16),
        1764215307.5,
    )


# Every strict decoder: (name, decode(data, where), the keys its body has).
DECODERS: list[tuple[str, Callable[[bytes, str], Any], tuple[str, ...]]] = [
    ("config", ConfigRecord.decode, ("epoch_size",)),
    ("epoch", EpochNode.decode, ()),
    ("table", TableNode.decode, ("table", "dropped")),
    ("owner", OwnerRecord.decode, ("host_id", "fenced_by", "retired_at")),
    ("fence", FenceRecord.decode, ("pending", "by")),
    ("gc", Marks.decode, ("watermark", "collected", "horizons", "legacy", "by", "time")),
    ("tail", TailRecord.decode, ("csn", "path", "trimmed_epoch", "retained", "time")),
    ("users", UsersNode.decode, ("users",)),
    (
        "alive",
        AliveRecord.decode,
        (
            "address",
            "incarnation",
            "applied",
            "min_snapshot",
            "oldest_snapshot",
            "snapshots",
            "running",
            "running_overflow",
        ),
    ),
    ("log", decode_log_node, ("v", "time", "versions", "txns", "ddl", "manifest")),
]
IDS = [name for name, _, _ in DECODERS]


def refused_or_decoded(decode: Callable[[bytes, str], Any], data: Any) -> None:
    """``decode`` either gives a record or refuses with a bounded CorruptMetadata naming the node."""
    try:
        decode(data, WHERE)
    except CorruptMetadata as exc:
        assert WHERE in exc.message
        assert len(exc.message) <= MAX_MESSAGE + 64
        assert len(exc.message) < 2000, exc.message[:3000]


# -- round trips ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "record",
    [
        ConfigRecord(1),
        ConfigRecord(1_000_000),
        EpochNode(False),
        EpochNode(True),
        TableNode(False),
        TableNode(True),
        OwnerRecord(),
        OwnerRecord("r0"),
        OwnerRecord("r1", fenced_by="r0"),
        OwnerRecord("r1", retired_at=1764215307.25),
        FenceRecord(),
        FenceRecord(frozenset({"t/a.parquet", "t/é b.parquet"}), "r0"),
        TailRecord(),
        TailRecord(12, "_checkpoints/12.ckpt", 2, 10, 1764215307.5),
        UsersNode({}),
        UsersNode({"alice": user(), "root": user("root", None)}),
        AliveRecord(
            address="127.0.0.1:7000",
            incarnation=3,
            applied=40,
            oldest_txn_snapshot=31,
            oldest_snapshot=31,
            snapshots=((31, tid(1)), (35, "read")),
            running=(tid(1),),
        ),
    ],
    ids=repr,
)
def test_each_record_round_trips(record: Any) -> None:
    assert type(record).decode(record.encode(), WHERE) == record


def test_marks_round_trip_with_who_and_when_left_out() -> None:
    m = Marks(10, 5, {"t": 100.0, "u": 2.5}, 3)
    assert Marks.decode(m.encode("r0"), WHERE) == m
    assert json.loads(m.encode("r0"))["by"] == "r0"


def test_log_entry_and_pointer_round_trip() -> None:
    entry = LogEntry(time=12.5, versions={"t": 3}, txns=(TxnRecord(tid(4), 12.0, (), {"app": 7}),))
    assert decode_log_node(entry.encode(), WHERE) == entry
    assert decode_log_node(ManifestPointer("_manifests/9.json").encode(), WHERE) == ManifestPointer("_manifests/9.json")


def test_marker_bodies_are_as_every_version_wrote_them() -> None:
    assert TOMBSTONE == b'{"dropped":true}' and TABLE_LIVE == b'{"table":true}'
    assert TableNode.says_dropped(TOMBSTONE) and not TableNode.says_dropped(TABLE_LIVE)
    assert not TableNode.says_dropped(b"garbage") and not TableNode.says_dropped(None)  # the name stays taken
    assert EpochNode(True).encode() == b"sealed" and EpochNode().encode() == b"" == TARGET_BODY


# -- today's bytes decode -----------------------------------------------------------------------
def test_the_config_node_as_written_before() -> None:
    old = json.dumps({"epoch_size": 1000}).encode()  # CsnLog.ensure_layout wrote json.dumps's spaces
    assert old == b'{"epoch_size": 1000}'
    assert ConfigRecord.decode(old, WHERE) == ConfigRecord(1000)
    assert json.loads(ConfigRecord(1000).encode()) == json.loads(old)  # what an older replica reads


@pytest.mark.parametrize(
    "old, want",
    [
        (b'{"host_id": "r0"}', OwnerRecord("r0")),  # replica.py's registration
        (b'{"host_id": "r1", "fenced_by": "r0"}', OwnerRecord("r1", fenced_by="r0")),  # outcomes.py's fence
        (b'{"host_id": "r1", "retired_at": 1764215307.4214}', OwnerRecord("r1", retired_at=1764215307.4214)),  # retire
        (b"", OwnerRecord()),  # ensure_path made it; the replica died before its set
    ],
    ids=["registered", "fenced", "retired", "empty"],
)
def test_the_owner_node_in_every_shape_written_before(old: bytes, want: OwnerRecord) -> None:
    got = OwnerRecord.decode(old, WHERE)
    assert got == want
    assert got.retired == (b"retired_at" in old)
    if old:  # one shape now: the same JSON, compact
        assert json.loads(want.encode()) == json.loads(old)


def test_the_fence_node_bytes_stay() -> None:
    old = b'{"pending":["t/a.parquet","t/b.parquet"],"by":"r0"}'
    rec = FenceRecord.decode(old, WHERE)
    assert rec == FenceRecord(frozenset({"t/a.parquet", "t/b.parquet"}), "r0")
    assert rec.encode() == old
    assert FenceRecord.decode(b"", WHERE) == FenceRecord()
    assert FenceRecord.decode(b'{"pending":[]}', WHERE) == FenceRecord()


def test_the_gc_node_as_written_before() -> None:
    old = b'{"watermark":4,"collected":3,"horizons":{"t":1.5},"legacy":0,"by":"r0","time":1764215307.25}'
    assert Marks.decode(old, WHERE) == Marks(4, 3, {"t": 1.5}, 0)
    legacy = Marks.decode(b'{"watermark": 12, "collected": 12}', WHERE)  # before retention windows
    assert legacy == Marks(12, 12, {}, 12)


def test_the_tail_node_bytes_stay() -> None:
    fields = {
        "csn": 12,
        "path": "_checkpoints/00000000000000000012.ckpt",
        "trimmed_epoch": 2,
        "retained": 10,
        "time": 1764215307.5132,
    }
    old = json.dumps(fields, separators=(",", ":"), sort_keys=True).encode()  # encode_tail before
    rec = TailRecord.decode(old, WHERE)
    assert rec == TailRecord(12, fields["path"], 2, 10, 1764215307.5132)
    assert rec.encode() == old and rec.to_dict() == fields
    first = b'{"csn":0,"path":"","retained":0,"trimmed_epoch":1}'  # no time (test_zk_hardening writes it)
    assert TailRecord.decode(first, WHERE).encode() == first
    later = b'{"csn":1,"path":"p","retained":0,"trimmed_epoch":0,"shards":4}'  # a later version's key: ignored
    assert TailRecord.decode(later, WHERE) == TailRecord(1, "p", 0, 0)


def test_the_users_node_as_written_before() -> None:
    users = {"alice": user(), "root": user("root", None)}
    old = json.dumps({"users": {n: u.to_dict() for n, u in sorted(users.items())}}, sort_keys=True).encode()
    assert b'": "' in old  # json.dumps's spaces
    assert UsersNode.decode(old, WHERE) == UsersNode(users)
    assert json.loads(UsersNode(users).encode()) == json.loads(old)
    assert UsersNode.decode(b"", WHERE) == UsersNode({})


def test_the_alive_node_as_written_before() -> None:
    old = (
        b'{"address":"127.0.0.1:7000","incarnation":3,"applied":40,"min_snapshot":31,"oldest_snapshot":31,'
        b'"snapshots":[[31,"' + tid(1).encode() + b'"]],"running":["' + tid(1).encode() + b'"],'
        b'"running_overflow":false}'
    )
    rec = AliveRecord.decode(old, WHERE)
    assert (rec.address, rec.incarnation, rec.applied, rec.oldest_snapshot, rec.running) == (
        "127.0.0.1:7000",
        3,
        40,
        31,
        (tid(1),),
    )
    assert rec.encode() == old


def test_a_log_entry_as_written_before() -> None:
    old = (
        b'{"time":12.5,"txns":[{"changes":[{"added":[],"kinds":["INSERT"],"pkey":"[]","removed":["p1"],'
        b'"table":"t"}],"tid":"' + tid(4).encode() + b'","time_version":12.0}],"v":1,"versions":{"t":3}}'
    )
    entry = decode_log_node(old, WHERE)
    assert isinstance(entry, LogEntry) and entry.versions == {"t": 3} and entry.txns[0].changes[0].removed == ("p1",)
    assert entry.encode() == old
    assert decode_log_node(b'{"manifest":"_manifests/9.json","v":1}', WHERE) == ManifestPointer("_manifests/9.json")


# -- hostile bodies -------------------------------------------------------------------------------
DEEP = b"[" * 100_000 + b"]" * 100_000
NEAR_LIMIT = b"[" * 1000 + b"]" * 1000  # within the parser's depth limit: taking it apart must not recurse out
HOSTILE = [
    b"{",
    b'{"a":',
    b"\x00\xff\xfe",
    b'{"host_id": "\xff\xfe"}',
    b"null",
    b"[]",
    b"7",
    b'"text"',
    b"true",
    b"NaN",
    b"1e400",
    DEEP,
    NEAR_LIMIT,
    b'{"x":' * 50_000,
    b"{}" * 3,
]


@pytest.mark.parametrize("name, decode, keys", DECODERS, ids=IDS)
@pytest.mark.parametrize("data", HOSTILE, ids=lambda d: repr(d[:12]))
def test_hostile_bodies_are_refused_with_corrupt_metadata_only(
    name: str, decode: Callable, keys: tuple, data: bytes
) -> None:
    with pytest.raises(CorruptMetadata) as info:
        decode(data, WHERE)
    assert WHERE in info.value.message and len(info.value.message) < 2000


# Field values as JSON text (so that nesting near the parser's limit need not be encoded here).
BAD_VALUES: list[bytes] = [
    json.dumps(v).encode()
    for v in (
        None,
        True,
        -1,
        2**64,
        10**30,
        1e308,
        -1e308,
        float("inf"),
        "x" * 100_000,
        "\ud800",
        [],
        [1, "a", None],
        {},
        {"k": [1]},
        12.5,
        "12",
        [[1, 2]],
        [["r0"]],
    )
] + [b"[" * 990 + b"]" * 990, b"9" * 400, b"1e400", b"-0", b'{"' + b"k" * 5000 + b'": 1}']


def body(fields: dict[str, bytes]) -> bytes:
    return b"{" + b",".join(json.dumps(k).encode() + b":" + v for k, v in fields.items()) + b"}"


@pytest.mark.parametrize("name, decode, keys", DECODERS, ids=IDS)
def test_each_field_of_a_wrong_type_or_size_is_refused_or_read(name: str, decode: Callable, keys: tuple) -> None:
    for key in keys:
        for bad in BAD_VALUES:
            refused_or_decoded(decode, body({key: bad}))
            for other in BAD_VALUES[:6] + [b"1", b'"p"']:
                refused_or_decoded(decode, body({k: (bad if k == key else other) for k in keys}))


@pytest.mark.parametrize(
    "data",
    [
        b"{}",
        b'{"epoch_size": 0}',
        b'{"epoch_size": "5"}',
        b'{"epoch_size": 1e400}',
        b'{"epoch_size": true}',
        b'{"epoch_size": 99999999999999999999999999}',
    ],
)
def test_a_bad_config_is_refused(data: bytes) -> None:
    with pytest.raises(CorruptMetadata, match="epoch_size|object"):
        ConfigRecord.decode(data, WHERE)


@pytest.mark.parametrize(
    "decode, data",
    [
        (OwnerRecord.decode, b'{"host_id": 5}'),
        (OwnerRecord.decode, b'{"host_id": "r0", "retired_at": "soon"}'),
        (OwnerRecord.decode, b'{"host_id": "r0", "fenced_by": []}'),
        (OwnerRecord.decode, b'{"host_id": "r0", "retired_at": 1e999}'),
        (FenceRecord.decode, b'{"pending": "t/a"}'),
        (FenceRecord.decode, b'{"pending": [1]}'),
        (TailRecord.decode, b'{"csn": 1, "path": "p", "trimmed_epoch": -2, "retained": 0}'),
        (TailRecord.decode, b'{"csn": "1", "path": "p", "trimmed_epoch": 0, "retained": 0}'),
        (TailRecord.decode, b'{"csn": 1, "trimmed_epoch": 0, "retained": 0}'),
        (TailRecord.decode, b'{"csn": 1, "path": "p", "trimmed_epoch": 0, "retained": 0, "time": "now"}'),
        (TableNode.decode, b'{"table": false}'),
        (EpochNode.decode, b"open"),
        (UsersNode.decode, b'{"users": {"a": {"role": "writer", "secret": "x", "created_at": 1e400}}}'),
        (UsersNode.decode, b'{"users": {"a": {"role": "writer", "secret": "x", "created_at": ' + b"9" * 400 + b"}}}"),
        (UsersNode.decode, b'{"users": {"a": []}}'),
        (UsersNode.decode, b'{"users": {"' + b"n" * 5000 + b'": {}}}'),
        (lambda d, w: decode_log_node(d, w), b'{"v": 1, "time": ' + b"9" * 400 + b"}"),
        (lambda d, w: decode_log_node(d, w), b'{"v": 1, "versions": {"t": 1e400}}'),
        (lambda d, w: AliveRecord.decode(d, w), b'{"running": [' + b"[" * 990 + b"]" * 990 + b"]}"),
        (lambda d, w: AliveRecord.decode(d, w), b'{"incarnation": 1e400}'),
    ],
)
def test_specific_malformed_bodies_are_refused(decode: Callable, data: bytes) -> None:
    with pytest.raises(CorruptMetadata) as info:
        decode(data, WHERE)
    assert WHERE in info.value.message and len(info.value.message) < 2000


def test_an_alive_body_that_does_not_parse_reads_as_malformed_without_a_name() -> None:
    for data in HOSTILE + [b'{"running": [' + b"[" * 990 + b"]" * 990 + b"]}", b'{"incarnation": 1e400}']:
        rec = AliveRecord.decode(data)
        assert rec.malformed and rec.oldest_snapshot == 0 and not rec.knows_running


def test_is_retired_reads_only_a_retired_owner_node() -> None:
    from coordinator.zk.alive import is_retired

    assert is_retired(b'{"host_id": "r1", "retired_at": 1764215307.4}')
    assert not is_retired(b'{"host_id": "r1"}') and not is_retired(b"") and not is_retired(b"\xff[")


# -- random bodies ------------------------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)


@pytest.mark.parametrize("name, decode, keys", DECODERS, ids=IDS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_bodies_are_decoded_or_refused_with_corrupt_metadata(
    name: str, decode: Callable, keys: tuple, data: st.DataObject
) -> None:
    raw = data.draw(st.binary(max_size=200))
    refused_or_decoded(decode, raw)
    if keys:
        fields = data.draw(st.dictionaries(st.sampled_from(keys), json_values, max_size=len(keys)))
        body = json.dumps(fields).encode()
        refused_or_decoded(decode, body)
        cut = data.draw(st.integers(0, len(body)))
        refused_or_decoded(decode, body[:cut])
