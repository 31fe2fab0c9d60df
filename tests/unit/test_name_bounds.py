"""Pure checks of the bounds on user values that become names (docs/rules.md#partition-values):
a partition value's size and its refusal, the replica's check of what a statement stages, the
bounded znode names of conflict targets and applications (short names keep the form earlier
versions gave them), and the user name rule. No I/O.
"""

from __future__ import annotations

import json
import random
from urllib.parse import quote

import pyarrow as pa
import pytest
from kazoo.protocol.serialization import CheckVersion, Create, SetData, Transaction
from kazoo.security import make_digest_acl
from support.builders import part, staged, table_def  # tests/ is on sys.path

from coordinator.core import tabledata as ops
from coordinator.core.targets import (
    APP_PREFIX,
    MAX_MULTI_BYTES,
    MAX_NODE_NAME,
    MULTI_ROOM,
    app_key,
    bounded_name,
    multi_bytes,
    target_key,
    too_many_targets,
)
from coordinator.errors import InvalidInput
from coordinator.model.users import MAX_NAME, check_name
from replicas.registry import check_partition_bounds
from replicas.settings import SETTINGS, check_setting

# =============================================================================================
# Node names


def old_target_key(table: str, pkey: str) -> str:
    """What earlier versions named a partition's target: the percent-encoded key, unbounded."""
    return f"{table}/{quote(pkey, safe='')}"


def old_app_key(app_id: str) -> str:
    safe = all(c.isascii() and (c.isalnum() or c in "_-") for c in app_id)
    return APP_PREFIX + (app_id if safe else quote(app_id, safe="").replace(".", "%2E").replace("~", "%7E"))


VALUES = ["a", "é", "\U0010ffff", "%", "#", "/", "~", ".", '"', "\\", " ", "x"]


def sample_values(n: int, seed: int = 33) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(VALUES) for _ in range(rng.randint(0, 300))) for _ in range(n)]


def test_short_names_are_kept_and_long_ones_cut_to_the_bound() -> None:
    """Every name of at most MAX_NODE_NAME characters is itself; a longer one is at most
    MAX_NODE_NAME, ends in '#' and the SHA-256 of the whole name, and its head never ends inside
    a %XX escape."""
    for n in range(MAX_NODE_NAME - 3, MAX_NODE_NAME + 4):
        for fill in ("a", "%C3%A9"):
            name = (fill * n)[:n]
            got = bounded_name(name)
            if n <= MAX_NODE_NAME:
                assert got == name
                continue
            head, digest = got.rsplit("#", 1)
            assert len(got) <= MAX_NODE_NAME and len(digest) == 64
            assert name.startswith(head) and "%" not in head[-2:]
    assert bounded_name("x" * 10**6) == bounded_name("x" * 10**6)
    assert bounded_name("x" * 10**6) != bounded_name("x" * 10**6 + "y")  # same head, other digest


def test_partition_targets_keep_their_old_names_when_short_and_are_bounded_otherwise() -> None:
    """A partition key whose encoded form fits keeps the node name earlier versions gave it (an
    existing cluster's nodes are found again); a longer one is bounded; names are one per key."""
    seen: dict[str, str] = {}
    for value in sample_values(400) + ["h" * 400_000, "é" * 400_000]:
        pkey = ops.partition_key((value, 7))
        key = target_key("t", pkey)
        node = key.split("/", 1)[1]
        old = old_target_key("t", pkey)
        if len(old) - len("t/") <= MAX_NODE_NAME:
            assert key == old and "#" not in node  # an uncut name never has '#': quote encodes it
        else:
            assert len(node) <= MAX_NODE_NAME and "#" in node
        assert seen.setdefault(key, pkey) == pkey, "two partitions share a node"
    assert target_key("t", None) == "t"


def test_app_keys_keep_their_old_names_when_short_and_are_bounded_otherwise() -> None:
    for app_id in ["job-1", "spark_stream_q", "a.b", "é" * 10, "ü" * 256, "x" * 256, "~" * 200]:
        key = app_key(app_id)
        old = old_app_key(app_id)
        assert key == old if len(old) <= MAX_NODE_NAME else (len(key) <= MAX_NODE_NAME and key.startswith(APP_PREFIX))
    assert app_key("ü" * 256) != app_key("ü" * 255 + "v")


def test_the_multi_estimate_bounds_what_kazoo_sends() -> None:
    """multi_bytes is at least the bytes kazoo serialises for the same ops (creates with a digest
    ACL, sets, checks) on bounded names, so a multi within MAX_MULTI_BYTES is within ZooKeeper's
    1 MiB; a transaction over its share is refused naming the count of targets."""
    prefix = "/some/chroot/mergetxn/targets/"
    names = [target_key("t", ops.partition_key(("é" * 500 + str(i),))) for i in range(50)]
    acl = [make_digest_acl("mergetxn-replica", "s" * 43, all=True)]
    for op in (
        lambda path: Create(path, b"", acl, 0),
        lambda path: SetData(path, b"", 7),
        lambda path: CheckVersion(path, 7),
    ):
        sent = len(Transaction([op(prefix + n) for n in names]).serialize())
        assert multi_bytes(names, len(prefix)) >= sent
    exc = too_many_targets("T1-2-r0", 4000, 1_700_000)
    assert exc.details["targets"] == 4000 and exc.details["limit"] == MAX_MULTI_BYTES - MULTI_ROOM
    assert "fewer partitions" in exc.message


# =============================================================================================
# Partition values


def test_a_value_counts_its_utf8_bytes_or_its_text() -> None:
    assert ops.partition_value_bytes("é" * 10) == 20
    assert ops.partition_value_bytes("\U0010ffff") == 4
    assert ops.partition_value_bytes(None) == 0
    assert ops.partition_value_bytes(12345) == 5
    assert ops.partition_value_bytes(True) == 4


def test_check_partition_values_names_the_column_and_the_limit() -> None:
    ops.check_partition_values("t", ["a", "b"], ("x" * 64, 1), 64)
    with pytest.raises(InvalidInput) as info:
        ops.check_partition_values("t", ["a", "b"], (1, "é" * 33), 64)
    assert info.value.details == {"table": "t", "column": "b", "limit": 64, "bytes": 66}
    assert "'b'" in info.value.message and "64 bytes" in info.value.message
    assert len(info.value.message) < 400


@pytest.mark.parametrize(
    "typ", [pa.string(), pa.large_string(), pa.dictionary(pa.int32(), pa.string())], ids=["str", "large", "dict"]
)
def test_split_by_partition_refuses_a_long_value_before_grouping(typ: pa.DataType) -> None:
    data = pa.table({"p": pa.array(["a", None, "é" * 600, "b"]).cast(typ), "v": [1, 2, 3, 4]})
    assert len(ops.split_by_partition(data, ["p"])) == 4  # no limit: the replica's own rewrites
    assert len(ops.split_by_partition(data, ["p"], 1200, "t")) == 4  # 1,200 bytes: at the limit
    with pytest.raises(InvalidInput) as info:
        ops.split_by_partition(data, ["p"], 1199, "t")
    assert info.value.details["column"] == "p" and info.value.details["bytes"] == 1200


def test_the_replica_checks_what_a_statement_adds_and_names() -> None:
    """check_partition_bounds: a part added in a partition over the limit, or a partition named
    by a TRUNCATE, OVERWRITE or compaction, is refused; short keys pass unparsed; a malformed
    long key is InvalidInput, not CorruptMetadata."""
    t = table_def()
    ok, long = ("x" * 100,), ("x" * 101,)
    check_partition_bounds(t, staged("insert", added=[part("a", partition=ok)]), 100)
    with pytest.raises(InvalidInput, match="'p'"):
        check_partition_bounds(t, staged("insert", added=[part("a", partition=ok), part("b", partition=long)]), 100)
    for op in ("truncate", "overwrite", "compact"):
        check_partition_bounds(t, staged(op, partitions=[ops.partition_key(("x" * 96,))]), 100)
        with pytest.raises(InvalidInput) as info:
            check_partition_bounds(t, staged(op, partitions=[ops.partition_key(long)]), 100)
        assert info.value.details["limit"] == 100
    with pytest.raises(InvalidInput, match="not JSON"):
        check_partition_bounds(t, staged("truncate", partitions=["[" * 200]), 100)
    check_partition_bounds(t, staged("truncate", whole_table=True), 100)
    check_partition_bounds(t, staged("truncate", partitions=[json.dumps(["é" * 20])]), 100)  # 120 chars, 40 bytes


def test_the_setting_has_a_sane_default_and_range() -> None:
    assert SETTINGS["max_partition_value_bytes"].default == ops.DEFAULT_PARTITION_VALUE_BYTES == 1024
    assert check_setting("max_partition_value_bytes", 4096) == 4096
    for bad in (63, 64 * 1024 + 1, "x", 1.5):
        with pytest.raises(InvalidInput, match="max_partition_value_bytes"):
            check_setting("max_partition_value_bytes", bad)


# =============================================================================================
# User names


def test_the_user_name_rule_bounds_the_length() -> None:
    assert check_name("u" * MAX_NAME) == "u" * MAX_NAME
    for bad in ("u" * (MAX_NAME + 1), "u" * 300, "", ".u", "a/b", "a b", None, 7):
        with pytest.raises(InvalidInput, match=f"1 to {MAX_NAME}") as info:
            check_name(bad)
        assert info.value.details == {"field": "name", "limit": MAX_NAME}
        assert len(info.value.message) < 300
