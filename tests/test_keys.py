"""Keys tables (SPEC.md "Keys tables", seed 003 YTsaurus dynamic tables), against a real
ZooKeeper and real replicas where a commit is involved; the rules themselves are pure
(coordinator/keys.py) and tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest
from support.cluster import make_cluster

from coordinator.catalog import TableDef
from coordinator.client import Client
from coordinator.conflicts import Policy
from coordinator.errors import InvalidInput
from mergetxn.zkserver import ZooKeeperServer

SCHEMA = pa.schema([
    pa.field("k", pa.int64(), nullable=False),
    pa.field("a", pa.string()),
    pa.field("b", pa.int64()),
    pa.field("c", pa.float64()),
])


def keys_def(**kw) -> TableDef:
    args = {"name": "t", "schema": SCHEMA, "primary_key": ("k",), "conflict_policy": "keys"} | kw
    return TableDef.new(**args)


# ---------------------------------------------------------------------------------------------
# Pure: create_table validation and the definition's round trip


def test_definition_round_trips_with_lock_groups_and_atomicity() -> None:
    t = keys_def(lock_groups={"g2": ["c"], "g1": ["a", "b"]}, atomicity="none")
    assert t.conflict_policy is Policy.KEYS and not t.auto_merge
    assert t.lock_groups == (("g1", ("a", "b")), ("g2", ("c",)))
    back = TableDef.from_dict(t.to_dict())
    assert back == t and back.same_definition(t)
    assert not keys_def().same_definition(t)
    # A plain table's serialised form is unchanged (no new fields).
    assert set(TableDef.new("p", SCHEMA).to_dict()) == {"name", "schema", "partition_by", "primary_key",
                                                         "conflict_policy", "auto_merge", "created_csn"}


BAD = [
    ({"primary_key": ()}, "needs a primary_key"),
    ({"schema": pa.schema([pa.field("k", pa.int64()), pa.field("a", pa.string())])}, "declared not null"),
    ({"partition_by": ("a",)}, "partition column(s) ['a'] must be primary key columns"),
    ({"lock_groups": {"g": ["k"]}}, "'k' is a primary key column"),
    ({"lock_groups": {"g": ["a"], "h": ["a", "b"]}}, "column 'a' is in lock groups 'g' and 'h'"),
    ({"lock_groups": {"g": ["nope"]}}, "unknown column 'nope'"),
    ({"lock_groups": {"g": []}}, "lock group 'g' has no columns"),
    ({"lock_groups": {"g": "a"}}, "must list column names"),
    ({"lock_groups": ["a"]}, "lock_groups must map"),
    ({"atomicity": "some"}, "atomicity must be 'full' or 'none'"),
    ({"conflict_policy": "parts", "lock_groups": {"g": ["a"]}}, "lock_groups need conflict_policy='keys'"),
    ({"conflict_policy": "parts", "atomicity": "none"}, "needs conflict_policy='keys'"),
    ({"schema": SCHEMA.append(pa.field("_op", pa.int8()))}, "reserved in a keys table"),
]


@pytest.mark.parametrize(("kw", "says"), BAD, ids=[s for _, s in BAD])
def test_bad_definitions_name_the_problem(kw: dict, says: str) -> None:
    with pytest.raises(InvalidInput) as e:
        keys_def(**kw)
    assert says in e.value.message


def test_keys_tables_refuse_schema_changes_for_now() -> None:
    with pytest.raises(InvalidInput, match="not supported yet"):
        keys_def().altered(add_columns=[pa.field("d", pa.int64())])


# ---------------------------------------------------------------------------------------------
# Against a cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator:
    with make_cluster(tmp_path_factory, zk_server, "keys", replicas=2) as c:
        yield c


@pytest.fixture
def clients(cluster) -> Iterator[tuple[Client, Client]]:
    a, b = (cluster.client(i) for i in range(2))
    try:
        yield a, b
    finally:
        a.close()
        b.close()


_n = iter(range(10**6))


def new_table(c: Client, **kw) -> str:
    name = f"kt{next(_n)}"
    c.create_table(name, SCHEMA, primary_key=("k",), conflict_policy="keys", **kw)
    return name


def test_create_table_is_stored_and_seen_by_every_replica(clients) -> None:
    a, b = clients
    name = new_table(a, lock_groups={"g": ["a", "b"]})
    csn = a.snapshot()
    b.wait_for(csn)
    t = b.table(name)
    assert t.conflict_policy is Policy.KEYS and t.primary_key == ("k",) and t.lock_groups == (("g", ("a", "b")),)
    # Creating it again as asked is idempotent; with other lock groups it is another definition.
    with pytest.raises(InvalidInput, match="already exists"):
        a.create_table(name, SCHEMA, primary_key=("k",), conflict_policy="keys", lock_groups={"g": ["a"]})
    with pytest.raises(InvalidInput, match="needs a primary_key"):
        a.create_table("nokey", SCHEMA, conflict_policy="keys")
