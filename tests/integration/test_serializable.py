"""Serializable transactions (docs/rules.md#serializable-transactions): ``client.begin(isolation=
"serializable")``, against a real ZooKeeper and real replicas, and the pure rule
(coordinator/core/readsets.py).

Write skew (two transactions each read both rows of an invariant and each write one) fails for
exactly one of them, on one replica and on two, naming the winner; under snapshot isolation the
same skew commits both. A read-only serializable transaction never fails. A read of one partition
is not failed by a commit to another (every policy), nor a predicate read by a commit whose parts
cannot match it by their statistics; a delete's predicate is a read. Concurrency is ordered with
barriers; the race between a decision and its multi with the replica's failpoint.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support.cluster import make_cluster
from support.data import ID_V, id_rows, ids
from support.failpoints import commit_held_at_multi

import coordinator
from coordinator.core.readsets import Read, Shape, Touch, check_isolation, check_reads, read_keys
from coordinator.core.tabledata import encode_expression, partition_key
from coordinator.core.targets import target_key
from coordinator.errors import ConflictError, ConflictKind, InvalidInput, from_dict
from mergetxn.client import Client, Transaction
from mergetxn.local.zkserver import ZooKeeperServer

BANK = pa.schema([("acct", pa.string()), ("bal", pa.int64())])
KV = pa.schema([("p", pa.string()), ("id", pa.int64())])
POLICIES = ["parts", "maxcompute", "append"]


# ---------------------------------------------------------------------------------------------
# Pure: the rule, the targets, the inputs


def _touch(tid: str, csn: int, partition: tuple, lo: int, hi: int, added: bool = True, table: str = "t") -> Touch:
    return Touch(tid, csn, table, f"part-{tid}-{csn}", partition, {"id": (lo, hi)}, added)


def test_rule_partitions_and_statistics() -> None:
    shapes = {"t": Shape(("p",), KV)}
    in_a = Read("t", encode_expression(pc.field("p") == "A", KV))
    low = Read("t", encode_expression(pc.field("id") < 10, KV))
    every = Read("t")
    # Another partition, another table, statistics that rule the predicate out: no conflict.
    assert check_reads("me", [in_a], [_touch("w", 5, ("B",), 0, 9)], shapes) is None
    assert check_reads("me", [every], [_touch("w", 5, ("A",), 0, 9, table="u")], shapes) is None
    assert check_reads("me", [low], [_touch("w", 5, ("A",), 10, 20)], shapes) is None
    # Its own parts never count.
    assert check_reads("me", [every], [_touch("me", 5, ("A",), 0, 9)], shapes) is None
    # A part added or removed that may hold a row read: the first by CSN wins.
    err = check_reads(
        "me", [low, in_a], [_touch("w2", 7, ("B",), 5, 5), _touch("w1", 6, ("A",), 50, 60, added=False)], shapes
    )
    assert isinstance(err, ConflictError) and err.kind is ConflictKind.READ_SET_CHANGED
    assert (err.winner, err.details["table"], err.details["partition"], err.details["csn"]) == ("w1", "t", ["A"], 6)
    assert "removed" in err.message and "serializable" in err.message
    back = from_dict(err.to_dict())
    assert type(back) is ConflictError and back.kind is ConflictKind.READ_SET_CHANGED and back.winner == "w1"
    # A reading of every row is touched by anything on its table; a dropped table (no shape) too.
    assert check_reads("me", [every], [_touch("w", 5, ("Z",), 0, 0)], shapes).winner == "w"
    assert check_reads("me", [Read("gone")], [_touch("d", 9, (), 0, 0, table="gone")], shapes).winner == "d"
    # A predicate that no longer decodes (the table was altered since) is taken as every row.
    altered = {"t": Shape(("p",), KV.append(pa.field("x", pa.int64())))}
    assert check_reads("me", [low], [_touch("w", 5, ("A",), 10, 20)], altered).winner == "w"


def test_read_keys_cover_the_partitions_reached_and_the_table() -> None:
    shapes = {"t": Shape(("p",), KV)}
    pkeys = {"t": {partition_key(("A",)), partition_key(("B",))}}
    in_a = Read("t", encode_expression(pc.field("p") == "A", KV))
    assert read_keys([in_a], pkeys, shapes) == {"t", target_key("t", partition_key(("A",)))}
    assert read_keys([Read("t")], pkeys, shapes) == {"t"} | {target_key("t", pk) for pk in pkeys["t"]}
    assert read_keys([Read("gone")], {}, shapes) == {"gone"}


def test_input_checks() -> None:
    assert check_isolation("snapshot") == "snapshot" and check_isolation("serializable") == "serializable"
    for bad in ("repeatable read", "SERIALIZABLE", None, 1):
        with pytest.raises(InvalidInput, match="isolation"):
            check_isolation(bad)
    assert Read.from_dict(Read("t", "x").to_dict()) == Read("t", "x")
    for bad in (None, {}, {"table": 1}, {"table": "t", "where": 3}):
        with pytest.raises(InvalidInput):
            Read.from_dict(bad)


# ---------------------------------------------------------------------------------------------
# Against replicas


@pytest.fixture(scope="module")
def cluster(zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    with make_cluster(tmp_path_factory, zk_server, "serial", replicas=2) as c:
        yield c


def _bank(client: Client, name: str, policy: str) -> None:
    client.create_table(name, BANK, partition_by=["acct"], conflict_policy=policy)
    with client.transaction() as tx:
        tx.insert(name, pa.table({"acct": ["a", "b"], "bal": [100, 100]}, schema=BANK))


def _withdraw(tx: Transaction, table: str, acct: str) -> None:
    """Read both balances; if their sum allows it, take 150 from ``acct`` (the invariant: the sum
    stays >= 0)."""
    rows = tx.read(table).to_pylist()
    if sum(r["bal"] for r in rows) >= 150:
        tx.update(table, pc.field("acct") == acct, {"bal": pc.field("bal") - 150})


def skew(clients: list[Client], table: str, isolation: str) -> tuple[dict[str, int], dict[str, Exception]]:
    """Two transactions begun at one snapshot, each withdrawing from one account after reading
    both, committed at once (a barrier). Returns the CSNs and the errors by transaction id."""
    txs = [c.begin(isolation=isolation) for c in clients]
    assert len({tx.snapshot for tx in txs}) == 1 or len(clients) == 2  # same snapshot on one replica
    barrier = threading.Barrier(len(txs))
    csns: dict[str, int] = {}
    errors: dict[str, Exception] = {}
    lock = threading.Lock()

    def run(tx: Transaction, acct: str) -> None:
        _withdraw(tx, table, acct)
        barrier.wait()
        try:
            csn = tx.commit()
            with lock:
                csns[tx.id] = csn
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test asserts
            with lock:
                errors[tx.id] = exc

    threads = [threading.Thread(target=run, args=(tx, acct)) for tx, acct in zip(txs, "ab")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return csns, errors


def _balances(client: Client, table: str) -> dict[str, int]:
    return {r["acct"]: r["bal"] for r in client.read(table).to_pylist()}


def _exactly_one_wins(client: Client, table: str, csns: dict[str, int], errors: dict[str, Exception]) -> None:
    assert len(csns) == 1 and len(errors) == 1, (csns, errors)
    (winner,), (err,) = csns, errors.values()
    assert isinstance(err, ConflictError) and err.kind is ConflictKind.READ_SET_CHANGED, err
    assert err.winner == winner and err.details["table"] == table
    client.wait_for(max(csns.values()))
    assert sum(_balances(client, table).values()) == 50  # one withdrawal, never two


@pytest.mark.parametrize("policy", POLICIES)
def test_write_skew_fails_for_exactly_one_on_one_replica(c0: Client, policy: str) -> None:
    for round_ in range(3):
        table = f"skew1_{policy}_{round_}"
        _bank(c0, table, policy)
        csns, errors = skew([c0, c0], table, "serializable")
        _exactly_one_wins(c0, table, csns, errors)


@pytest.mark.parametrize("policy", POLICIES)
def test_write_skew_fails_for_exactly_one_on_two_replicas(c0: Client, c1: Client, policy: str) -> None:
    for round_ in range(3):
        table = f"skew2_{policy}_{round_}"
        _bank(c0, table, policy)
        c1.wait_for(c0.snapshot())
        csns, errors = skew([c0, c1], table, "serializable")
        _exactly_one_wins(c0, table, csns, errors)


def test_snapshot_isolation_lets_the_same_skew_commit_both(c0: Client, c1: Client) -> None:
    _bank(c0, "skew_si", "maxcompute")
    c1.wait_for(c0.snapshot())
    csns, errors = skew([c0, c1], "skew_si", "snapshot")
    assert not errors and len(csns) == 2
    c0.wait_for(max(csns.values()))
    assert _balances(c0, "skew_si") == {"a": -50, "b": -50}  # the invariant broken: write skew


def test_read_only_serializable_never_fails(c0: Client, c1: Client) -> None:
    _bank(c0, "ro", "parts")
    tx = c0.begin(isolation="serializable")
    assert tx.isolation == "serializable" and c0.begin().isolation == "snapshot"
    before = tx.read("ro")
    with c1.transaction() as other:  # everything it read changes
        other.truncate("ro")
        other.insert("ro", pa.table({"acct": ["c"], "bal": [1]}, schema=BANK))
    assert tx.commit() == tx.snapshot
    assert before.num_rows == 2


def _kv(client: Client, name: str, policy: str) -> None:
    client.create_table(name, KV, partition_by=["p"], conflict_policy=policy)
    client.create_table(name + "_out", ID_V)
    with client.transaction() as tx:
        tx.insert(name, pa.table({"p": ["A", "B"], "id": [1, 100]}, schema=KV))


def _insert_kv(client: Client, table: str, p: str, id_: int) -> str:
    with client.transaction() as tx:
        tx.insert(table, pa.table({"p": [p], "id": [id_]}, schema=KV))
    return tx.id


@pytest.mark.parametrize("policy", POLICIES)
def test_a_read_of_one_partition_is_not_failed_by_a_commit_to_another(c0: Client, c1: Client, policy: str) -> None:
    table = f"part_{policy}"
    _kv(c0, table, policy)
    c1.wait_for(c0.snapshot())
    tx = c0.begin(isolation="serializable")
    assert tx.read(table, where=pc.field("p") == "A").num_rows == 1
    tx.insert(table + "_out", id_rows(1))
    _insert_kv(c1, table, "B", 101)  # another partition, on the other replica
    tx.commit()
    # The control: a commit to the partition it read fails it, naming that commit.
    tx = c0.begin(isolation="serializable")
    tx.read(table, where=pc.field("p") == "A")
    tx.insert(table + "_out", id_rows(1, start=5))
    winner = _insert_kv(c1, table, "A", 2)
    with pytest.raises(ConflictError) as info:
        tx.commit()
    assert info.value.kind is ConflictKind.READ_SET_CHANGED and info.value.winner == winner
    assert info.value.details["table"] == table and info.value.details["partition"] == ["A"]


def test_a_predicate_read_is_not_failed_by_parts_that_cannot_match(c0: Client) -> None:
    c0.create_table("pred", ID_V)
    c0.create_table("pred_out", ID_V)
    with c0.transaction() as tx:
        tx.insert("pred", id_rows(10))
    tx = c0.begin(isolation="serializable")
    assert ids(tx.read("pred", where=pc.field("id") < 10)) == list(range(10))
    tx.insert("pred_out", id_rows(1))
    with c0.transaction() as other:
        other.insert("pred", id_rows(10, start=100))  # min id 100: cannot match id < 10
    c0.compact("pred", "major")  # a compaction changes no row
    tx.commit()
    tx = c0.begin(isolation="serializable")
    tx.read("pred", where=pc.field("id") < 10)
    tx.insert("pred_out", id_rows(1, start=1))
    with c0.transaction() as other:
        other.insert("pred", id_rows(1, start=5))
    with pytest.raises(ConflictError) as info:
        tx.commit()
    assert info.value.kind is ConflictKind.READ_SET_CHANGED and info.value.winner == other.id


@pytest.mark.parametrize("isolation", ["snapshot", "serializable"])
def test_a_delete_predicate_is_a_read(c0: Client, isolation: str) -> None:
    table = f"del_{isolation}"
    c0.create_table(table, ID_V)  # parts: an INSERT never conflicts with a DELETE by the policy
    with c0.transaction() as tx:
        tx.insert(table, id_rows(10))
    tx = c0.begin(isolation=isolation)
    assert tx.delete(table, pc.field("id") < 5) == 5
    with c0.transaction() as other:
        other.insert(table, id_rows(1, start=3))  # a row the delete would have deleted
    if isolation == "snapshot":
        tx.commit()
        return
    with pytest.raises(ConflictError) as info:
        tx.commit()
    assert info.value.kind is ConflictKind.READ_SET_CHANGED and info.value.winner == other.id


def test_bad_isolation(c0: Client) -> None:
    for bad in ("repeatable_read", None):
        with pytest.raises(InvalidInput, match="isolation"):
            c0.begin(isolation=bad)
        with pytest.raises(InvalidInput, match="isolation"), c0.transaction(isolation=bad):
            pass


@pytest.fixture(scope="module")
def held_cluster(
    zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[coordinator.LocalCluster, Path]]:
    """Two replicas; replica 0 with failpoints, replica 1 restarted without them (so a commit held
    on replica 0 never holds replica 1's)."""
    points = tmp_path_factory.mktemp("serial_failpoints")
    with make_cluster(
        tmp_path_factory,
        zk_server,
        "serial_held",
        replicas=2,
        settings={"gc_interval": 0, "merge_interval": 0},
        env={"MERGETXN_FAILPOINTS": str(points)},
    ) as c:
        c.stop_replica(1)
        c.start_replica(1)
        yield c, points


@pytest.mark.parametrize("policy", POLICIES)
def test_a_commit_between_the_decision_and_the_multi_is_caught(
    held_cluster: tuple[coordinator.LocalCluster, Path], policy: str
) -> None:
    """Replica 0 decides a serializable commit and is held just before its multi; replica 1 then
    commits an INSERT into the partition it read (under ``parts`` such an INSERT moves no conflict
    target: the table's write counter catches it). Released, the multi misses and the decision,
    made again, fails naming that INSERT."""
    cluster, points = held_cluster
    c0, c1 = cluster.client(0), cluster.client(1)
    table = f"held_{policy}"
    _kv(c0, table, policy)
    c1.wait_for(c0.snapshot())
    tx = c0.begin(isolation="serializable")
    tx.read(table, where=pc.field("p") == "A")
    tx.insert(table + "_out", id_rows(1))
    with commit_held_at_multi(points, tx) as held:
        winner = _insert_kv(c1, table, "A", 2)
    (outcome,) = held.outcome
    assert isinstance(outcome, ConflictError), outcome
    assert outcome.kind is ConflictKind.READ_SET_CHANGED and outcome.winner == winner
