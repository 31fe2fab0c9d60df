"""The chaos workloads: client threads that run transactions and record what they observed.

Each client is a thread with its own connection to one replica. It runs one transaction after
another and records each attempt as an :class:`~mergetxn.chaos.history.Op` whose micro-operations
(``mops``) are exactly what the client asked and what it was answered, in order. A client whose
replica cannot be reached moves to the next replica for its next transaction (failover).

Three workloads:

* ``list-append`` over ``la0`` (policy ``parts``) and ``la1`` (policy ``append``), both
  partitioned by ``key`` (so deletes on different keys never conflict and merges work per key):
  a transaction reads keys, appends unique elements and sometimes deletes an element it read.
* ``bank``: ``bank(acct, balance)`` partitioned by ``acct`` under ``parts``: every account is a
  partition of its own, so a transfer conflicts exactly with the transfers that update one of its
  two accounts (both remove that account's part: first committer wins) and transfers on other
  accounts commit beside it. A transfer reads the whole table, so the total is checkable in
  every snapshot it saw; read-only transactions read it too.
* ``keys``: ``kv(k, v, p)``, ``kvg(k, a, b, p)`` and ``kvw(k, v, p)``, keys tables (primary key
  ``(k, p)``, partitioned by ``p = k % 3``, background merges folding versions; ``kvg``'s ``a``
  and ``b`` in lock groups of their own; ``kvw`` written in whole rows only, so that its whole
  reads go by the replicas' deletion vectors): a transaction reads keys (point reads, sometimes
  under a strong read lock, sometimes a whole table, half of those before it writes the table by
  the client's read at its snapshot), writes unique values by key in overwrite or update mode (on
  ``kvg`` one group or both) and deletes keys; some run serializable. Each value column of each key
  is a register (``kv``, ``kvg/a``, ``kvg/b``, ``kvw``), so first committer wins per key and lock group is
  checked as the lost-update rule, writers of different groups must both take effect, and every
  read is checked against the state at its snapshot. A fifth of its transactions write ``kvn``
  instead, a keys table with ``atomicity="none"`` (an ``lww`` table of the history: no locks, the
  later commit wins), most of them with ``durability="async"``: the client flushes now and then,
  and the commits a flush covered must have committed.

Outcomes: ``commit()`` returned -> committed; ``ConflictError`` / ``TransactionAborted`` /
``InvalidInput`` -> aborted; anything after which the client cannot know (``ReplicaUnavailable``,
a socket error, an unknown error) -> ``indeterminate``, resolved after the run with
``commit_status``. A failing statement is followed by a rollback: the op is aborted if the
rollback was answered, indeterminate otherwise.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.core.errors import (
    ConflictError,
    InvalidInput,
    MergetxnError,
    TransactionAborted,
)
from mergetxn.chaos.history import Op, TableKind
from mergetxn.client.client import Client, Transaction

# A chaos client waits at most this long for one answer: the library's default (10 minutes) is
# for long reads, and would let one partitioned connection freeze a client for the whole run.
CLIENT_TIMEOUT = 10.0
DEFINITE = (ConflictError, TransactionAborted, InvalidInput)  # the transaction did not commit
# Errors after which a client tries another replica for its next transaction.
UNREACHABLE = frozenset({"ReplicaUnavailable", "OutcomeUnknown", "OSError", "ConnectionError", "TimeoutError"})
KEYS = 8
LA_SCHEMA = pa.schema([("key", pa.int64()), ("elem", pa.int64())])
BANK_SCHEMA = pa.schema([("acct", pa.int64()), ("balance", pa.int64())])
KV_SCHEMA = pa.schema(
    [pa.field("k", pa.int64(), nullable=False), ("v", pa.int64()), pa.field("p", pa.int64(), nullable=False)]
)
KVG_SCHEMA = pa.schema(
    [
        pa.field("k", pa.int64(), nullable=False),
        ("a", pa.int64()),
        ("b", pa.int64()),
        pa.field("p", pa.int64(), nullable=False),
    ]
)
KV_KEYS = 16
PROBE_SCHEMA = pa.schema([("replica", pa.int64()), ("n", pa.int64())])
ACCOUNTS = 10
INITIAL_BALANCE = 100
KILLED_CLIENT = "kill-client"  # the workload name of killed clients' ops
ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    """What every client shares: the run's clock, op numbers, the element counter, the ops."""

    def __init__(self, t0: float | None = None) -> None:
        self.t0 = time.monotonic() if t0 is None else t0
        self._lock = threading.Lock()
        self._index = itertools.count()
        self._element = itertools.count(1)
        self.ops: list[Op] = []

    def now(self) -> float:
        """Seconds since the run began."""
        return round(time.monotonic() - self.t0, 4)

    def element(self) -> int:
        """An element no other append of this run uses, so a read element names its writer."""
        with self._lock:
            return next(self._element)

    def add(self, **fields: Any) -> Op:
        with self._lock:
            op = Op(index=next(self._index), **fields)
            self.ops.append(op)
        return op

    def ended(self, base: dict[str, Any], mops: list[list[Any]], outcome: str, **more: Any) -> Op:
        """The attempt ``base`` ended now with ``outcome`` after ``mops``; ``more``: its csn,
        error or message."""
        return self.add(**base, end=self.now(), mops=mops, outcome=outcome, **more)

    def not_begun(self, base: dict[str, Any], exc: BaseException, message: str) -> Op:
        """An attempt that failed before it had a transaction (its begin, or the snapshot it
        reads at): aborted, with no tid and no snapshot; ``message`` says what failed."""
        return self.add(
            **base,
            tid=None,
            snapshot=None,
            end=self.now(),
            mops=[],
            outcome="aborted",
            error=type(exc).__name__,
            message=message,
        )


class Modes(TypedDict, total=False):
    """The arguments of ``Client.begin`` that a transaction sets apart from the defaults."""

    isolation: str
    atomicity: str
    durability: str


class Workload:
    """One workload's tables, their set-up and its transactions."""

    name: str = ""
    tables: dict[str, TableKind] = {}

    def modes(self, rng: random.Random) -> Modes:
        """The next transaction's ``begin`` arguments that differ from the defaults
        (``isolation``, ``atomicity``, ``durability``)."""
        return {}

    def create(self, client: Client) -> dict[str, dict[str, Any]]:
        """Create the tables and insert their initial rows; returns them (history ``initial``)."""
        raise NotImplementedError

    def transaction(self, tx: Transaction, rng: random.Random, mops: list[list[Any]], rec: Recorder) -> None:
        """Run the statements of one transaction, appending each micro-operation to ``mops`` as it
        happens (a write before it is sent: it may take effect even if its answer is lost)."""
        raise NotImplementedError


class ListAppend(Workload):
    name = "list-append"
    tables: dict[str, TableKind] = {"la0": "set", "la1": "set"}
    policies = {"la0": "parts", "la1": "append"}
    # la0's one-row inserts are inlined (the replicas' default), la1's written as part files:
    # one transaction may commit both kinds, and flushes of la0 run beside la1's merges.
    inline_rows = {"la0": None, "la1": 0}

    def create(self, client: Client) -> dict[str, dict[str, Any]]:
        for table, policy in self.policies.items():
            create_table(client, table, LA_SCHEMA, ["key"], policy, inline_rows=self.inline_rows[table])
        return {}

    def transaction(self, tx: Transaction, rng: random.Random, mops: list[list[Any]], rec: Recorder) -> None:
        seen: dict[tuple[str, int], list[int]] = {}
        for _ in range(rng.randint(1, 4)):
            table, key = rng.choice(list(self.tables)), rng.randrange(KEYS)
            roll = rng.random()
            if roll < 0.15 and seen.get((table, key)):
                elem = rng.choice(seen[(table, key)])
                mops.append(["delete", table, str(key), elem])
                tx.delete(table, (pc.field("key") == key) & (pc.field("elem") == elem))
                seen[(table, key)].remove(elem)
            elif roll < 0.55:
                data = tx.read(table, where=pc.field("key") == key)
                elems = sorted(data.column("elem").to_pylist())
                mops.append(["r", table, str(key), elems or None])
                seen[(table, key)] = list(elems)
            else:
                elem = rec.element()
                mops.append(["append", table, str(key), elem])
                tx.insert(table, pa.table({"key": [key], "elem": [elem]}, schema=LA_SCHEMA))


class Bank(Workload):
    name = "bank"
    tables: dict[str, TableKind] = {"bank": "register"}

    def create(self, client: Client) -> dict[str, dict[str, Any]]:
        create_table(client, "bank", BANK_SCHEMA, ["acct"], "parts")
        accts = list(range(ACCOUNTS))
        with client.transaction() as tx:
            tx.insert("bank", pa.table({"acct": accts, "balance": [INITIAL_BALANCE] * ACCOUNTS}, schema=BANK_SCHEMA))
        return {"bank": {str(a): INITIAL_BALANCE for a in accts}}

    def transaction(self, tx: Transaction, rng: random.Random, mops: list[list[Any]], rec: Recorder) -> None:
        balances = register_values(tx.read("bank"), "acct", "balance")
        mops.append(["r", "bank", None, balances])
        if rng.random() < 0.3:
            return  # read-only: the snapshot's total is what it checks
        rich = [a for a, b in balances.items() if isinstance(b, int) and b > 0]
        if not rich or len(balances) < 2:
            return
        src = rng.choice(rich)
        dst = rng.choice([a for a in balances if a != src])
        if not isinstance(balances[dst], int):
            return  # an anomalous read (two rows for one account): the checker reports it
        amount = rng.randint(1, min(balances[src], 20))
        for acct, value in ((src, balances[src] - amount), (dst, balances[dst] + amount)):
            mops.append(["set", "bank", acct, value])
            tx.update("bank", pc.field("acct") == int(acct), {"balance": value})


class Keys(Workload):
    """Two keys tables: ``kv`` (one value column under the primary lock) and ``kvg`` (columns
    ``a`` and ``b`` in lock groups of their own). Each value column of each key is a register of
    the history: ``kv``, ``kvg/a`` and ``kvg/b`` (:func:`register_table`)."""

    name = "keys"
    tables: dict[str, TableKind] = {
        "kv": "register",
        "kvg/a": "register",
        "kvg/b": "register",
        "kvw": "register",
        "kvn": "lww",
    }
    # table -> column -> register
    columns = {"kv": {"v": "kv"}, "kvg": {"a": "kvg/a", "b": "kvg/b"}, "kvw": {"v": "kvw"}}
    schemas = {"kv": KV_SCHEMA, "kvg": KVG_SCHEMA, "kvw": KV_SCHEMA}
    keys = {"kv": KV_KEYS, "kvg": 4, "kvw": KV_KEYS, "kvn": 8}  # few rows in kvg: writers of its two groups overlap
    none = 0.2  # the share of transactions with atomicity "none" (on kvn), most of them async
    serializable = 0.2  # the share of transactions run serializable (they must hold SI too)

    def create(self, client: Client) -> dict[str, dict[str, Any]]:
        def keys_table(name: str, schema: pa.Schema, **more: Any) -> None:
            pk = ["k", "p"]
            client.create_table(
                name, schema, partition_by=["p"], primary_key=pk, conflict_policy="keys", auto_merge=True, **more
            )

        keys_table("kv", KV_SCHEMA)
        keys_table("kvw", KV_SCHEMA)
        keys_table("kvn", KV_SCHEMA, atomicity="none")
        keys_table("kvg", KVG_SCHEMA, lock_groups={"ga": ["a"], "gb": ["b"]})
        return {}

    def modes(self, rng: random.Random) -> Modes:
        roll = rng.random()
        if roll < self.none:
            return Modes(atomicity="none", durability="async") if rng.random() < 0.6 else Modes(atomicity="none")
        return Modes(isolation="serializable") if roll < self.none + self.serializable else Modes()

    def transaction(self, tx: Transaction, rng: random.Random, mops: list[list[Any]], rec: Recorder) -> None:
        if tx.atomicity == "none":
            return self._last_writer_wins(tx, rng, mops, rec)
        wrote: set[str] = set()  # the tables this transaction wrote so far
        for _ in range(rng.randint(1, 4)):
            table = rng.choice(["kv", "kvg", "kvw"])
            columns, schema = self.columns[table], self.schemas[table]
            key, roll = rng.randrange(self.keys[table]), rng.random()
            if roll < 0.1:
                data = self._whole_read(tx, table, wrote, rng)
                mops.extend(["r", reg, None, register_values(data, "k", c)] for c, reg in columns.items())
            elif roll < 0.45:
                if rng.random() < 0.25:  # a strong read lock: a later writer from an older snapshot fails
                    tx.lock_keys(table, kv_key(key))
                data = tx.read(table, where=pc.field("k") == key)
                mops.extend(
                    ["r", reg, str(key), register_values(data, "k", c).get(str(key))] for c, reg in columns.items()
                )
            elif roll < 0.9:
                # Some columns (kvg: one group, or both) in update mode (only their groups' locks)
                # or overwrite mode (every lock; the columns left out become null).
                written = [c for c in columns if rng.random() < 0.6] or [rng.choice(list(columns))]
                update = table != "kvw" and rng.random() < 0.5  # kvw: whole rows only
                row: dict[str, list[int]] = {"k": [key], "p": [key % 3]}
                for c in columns:
                    if c in written:
                        row[c] = [rec.element()]
                        mops.append(["set", columns[c], str(key), row[c][0]])
                    elif not update:
                        mops.append(["set", columns[c], str(key), None])
                tx.upsert(table, pa.table(row, schema=pa.schema([schema.field(c) for c in row])), update=update)
                wrote.add(table)
            else:
                mops.extend(["set", reg, str(key), None] for reg in columns.values())
                tx.delete_keys(table, kv_key(key))
                wrote.add(table)

    @staticmethod
    def _whole_read(tx: Transaction, table: str, wrote: set[str], rng: random.Random) -> pa.Table:
        """A read of the whole ``table`` in ``tx``: half the time, when the transaction has not
        written it and records no reads (snapshot isolation), the client's own read at the
        transaction's snapshot, which is the same rows read by the replica's deletion vectors
        (replicas/vectors.py), else the transaction's read: the same vectors at its snapshot,
        its own versions folded over the keys they touch (keyfold.over_live)."""
        if table not in wrote and tx.isolation == "snapshot" and rng.random() < 0.5:
            return tx.client.read(table, snapshot=tx.snapshot)
        return tx.read(table)

    def _last_writer_wins(self, tx: Transaction, rng: random.Random, mops: list[list[Any]], rec: Recorder) -> None:
        """On ``kvn`` (atomicity "none"): reads of the latest state, writes of several keys
        (a commit is whole or absent, never torn), deletes."""
        for _ in range(rng.randint(1, 4)):
            key, roll = rng.randrange(self.keys["kvn"]), rng.random()
            if roll < 0.1:
                mops.append(["r", "kvn", None, register_values(tx.read("kvn"), "k", "v")])
            elif roll < 0.35:
                got = register_values(tx.read("kvn", where=pc.field("k") == key), "k", "v")
                mops.append(["r", "kvn", str(key), got.get(str(key))])
            elif roll < 0.9:
                keys_ = sorted(set(rng.sample(range(self.keys["kvn"]), rng.randint(1, 3))))
                values = [rec.element() for _ in keys_]
                mops.extend(["set", "kvn", str(k), v] for k, v in zip(keys_, values))
                tx.upsert(
                    "kvn",
                    pa.table({"k": keys_, "v": values, "p": [k % 3 for k in keys_]}, schema=KV_SCHEMA),
                    update=rng.random() < 0.3,
                )
            else:
                mops.append(["set", "kvn", str(key), None])
                tx.delete_keys("kvn", kv_key(key))


def register_table(name: str) -> tuple[str, str | None]:
    """A history table name as (table, value column): ``kvg/a`` is column ``a`` of table ``kvg``;
    a plain name is its table's second column (the first is the key)."""
    table, _, column = name.partition("/")
    return table, column or None


def kv_key(key: int) -> pa.Table:
    """The full primary key of ``kv`` or ``kvg`` for ``key`` (the partition column is part of it)."""
    return pa.table({"k": [key], "p": [key % 3]}, schema=pa.schema([KV_SCHEMA.field("k"), KV_SCHEMA.field("p")]))


WORKLOADS: dict[str, type[Workload]] = {"list-append": ListAppend, "bank": Bank, "keys": Keys}


def workloads_for(name: str) -> list[Workload]:
    """``list-append``, ``bank``, ``keys`` or ``all``."""
    if name == "all":
        return [cls() for cls in WORKLOADS.values()]
    if name not in WORKLOADS:
        raise InvalidInput(f"unknown workload {name!r}: choose from {', '.join([*WORKLOADS, 'all'])}")
    return [WORKLOADS[name]()]


def create_table(
    client: Client, name: str, schema: pa.Schema, partition_by: list[str], policy: str, inline_rows: int | None = None
) -> None:
    client.create_table(
        name, schema, partition_by=partition_by, conflict_policy=policy, auto_merge=True, inline_rows=inline_rows
    )


def set_values(data: pa.Table, key: str = "key", elem: str = "elem") -> dict[str, list[int]]:
    """A ``set`` table's rows as key -> sorted elements (duplicates kept: they are anomalies)."""
    out: dict[str, list[int]] = {}
    for k, e in zip(data.column(key).to_pylist(), data.column(elem).to_pylist()):
        out.setdefault(str(k), []).append(e)
    return {k: sorted(v) for k, v in sorted(out.items(), key=lambda kv: int(kv[0]))}


def register_values(data: pa.Table, key: str, value: str) -> dict[str, Any]:
    """A ``register`` table's rows as key -> value; a null value is no value (a keys table's
    column that a write left out). A key with several rows (an anomaly that a dict would hide)
    gets the sorted list of its values, which never equals an integer."""
    out: dict[str, list[Any]] = {}
    for k, v in zip(data.column(key).to_pylist(), data.column(value).to_pylist()):
        out.setdefault(str(k), []).append(v)
    return {
        k: (v[0] if len(v) == 1 else sorted(v, key=lambda x: (x is None, x or 0)))
        for k, v in sorted(out.items(), key=lambda kv: int(kv[0]))
        if v != [None]
    }


def connect(address: str) -> Client:
    """A client with the chaos timeout (see :data:`CLIENT_TIMEOUT`)."""
    return Client(address, timeout=CLIENT_TIMEOUT)


# -- one transaction ------------------------------------------------------------------------------


def run_transaction(
    client: Client, replica: int, process: int, workload: Workload, rng: random.Random, rec: Recorder
) -> Op:
    """Begin, run the workload's statements, commit; record the attempt with its outcome."""
    start = rec.now()
    mops: list[list[Any]] = []
    base = {"process": process, "replica": replica, "workload": workload.name, "start": start}
    modes = workload.modes(rng)
    base |= modes
    try:
        tx = client.begin(**modes)
    except Exception as exc:  # nothing was staged: this attempt cannot commit anything
        return rec.not_begun(base, exc, f"begin failed: {_message(exc)}")
    base |= {"tid": tx.id, "snapshot": tx.snapshot}
    try:
        workload.transaction(tx, rng, mops, rec)
    except Exception as exc:
        outcome, note = roll_back(tx)
        return rec.ended(base, mops, outcome, error=type(exc).__name__, message=f"{_message(exc)}; {note}")
    try:
        csn = tx.commit()
    except DEFINITE as exc:
        return rec.ended(base, mops, "aborted", error=type(exc).__name__, message=_message(exc))
    except Exception as exc:  # the client cannot know: resolved after the run
        return rec.ended(base, mops, "indeterminate", error=type(exc).__name__, message=_message(exc))
    if csn is None:  # durability "async": queued on the replica; a flush or commit_status tells
        return rec.ended(base, mops, "indeterminate", message="async commit queued")
    return rec.ended(base, mops, "committed", csn=csn)


def roll_back(tx: Transaction) -> tuple[str, str]:
    """Roll back after a failed statement: aborted once the replica answered, else indeterminate."""
    try:
        tx.rollback()
    except DEFINITE as exc:  # already ended there (aborted by the replica, or unknown to it)
        return "aborted", f"rollback answered {type(exc).__name__}"
    except Exception as exc:
        return "indeterminate", f"rollback failed: {type(exc).__name__}"
    return "aborted", "rolled back"


def _message(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return text[:500]


# -- clients --------------------------------------------------------------------------------------


class Worker(threading.Thread):
    """One client: transactions one after another until told to stop, failing over to the next
    replica for its next transaction when its replica cannot be reached."""

    def __init__(
        self,
        process: int,
        home: int,
        addresses: Callable[[], list[str]],
        workload: Workload,
        rec: Recorder,
        stop: threading.Event,
        seed: int,
    ) -> None:
        super().__init__(name=f"chaos-client-{process}", daemon=True)
        self.process, self.replica, self.addresses, self.workload = process, home, addresses, workload
        self.rec, self.stop_event, self.rng = rec, stop, random.Random(seed)
        self.clients: dict[int, Client] = {}
        self.unflushed: dict[int, list[Op]] = {}  # replica -> its client's async commits no flush covered
        self.failovers = 0

    def _client(self, i: int) -> Client:
        client = self.clients.get(i)
        address = self.addresses()[i]
        if client is None or client.address != address:
            if client is not None:
                client.close()
                self.unflushed.pop(i, None)  # left to commit_status after the run
            client = self.clients[i] = connect(address)
        return client

    def _flush(self, client: Client, i: int) -> None:
        """``client.flush()``: the async commits it covered are acknowledged (``flushed``: they
        must commit), those it names failed are aborted. An error that says nothing leaves them
        to the next flush (the client keeps them) or to commit_status after the run."""
        pending = self.unflushed.get(i, [])
        try:
            client.flush()
        except TransactionAborted as exc:
            if "ids" not in exc.details:
                return  # not a flush's answer naming its failures: nothing learnt
            failed = set(exc.ids)
            for op in pending:
                if op.tid in failed:
                    op.outcome, op.error = "aborted", "TransactionAborted"
                    op.message += f"; flush: {_message(exc)}"
                else:
                    op.flushed = True
        except Exception:
            return
        else:
            for op in pending:
                op.flushed = True
        pending.clear()

    def _fail_over(self) -> None:
        self.replica = (self.replica + 1) % len(self.addresses())
        self.failovers += 1

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                try:
                    client = self._client(self.replica)
                except (MergetxnError, OSError):
                    self._fail_over()
                    self.stop_event.wait(0.05)
                    continue
                op = run_transaction(client, self.replica, self.process, self.workload, self.rng, self.rec)
                if op.durability == "async" and op.outcome == "indeterminate" and op.error is None:
                    self.unflushed.setdefault(self.replica, []).append(op)
                if self.unflushed.get(self.replica) and self.rng.random() < 0.3:
                    self._flush(client, self.replica)
                if op.error in UNREACHABLE or (op.tid is None and op.error):
                    self._fail_over()
                    self.stop_event.wait(0.05)
        finally:
            for client in self.clients.values():
                client.close()


# -- a client killed between writing its parts and committing ----------------------------------

_KILLED_CLIENT_CODE = r"""# mergetxn chaos: a client killed between writing its parts and committing
import json, sys
import pyarrow as pa
from mergetxn.client.client import Client
print(json.dumps({"ready": True}), flush=True)
job = json.loads(sys.stdin.readline() or "null")
if job is None:
    sys.exit(0)
address, key, elems = job["address"], job["key"], job["elems"]
try:
    client = Client(address, timeout=10.0)
    tx = client.begin()
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)[:300]}), flush=True)
    sys.exit(3)
print(json.dumps({"tid": tx.id, "snapshot": tx.snapshot}), flush=True)
tx.insert("la0", pa.table({"key": [key] * len(elems), "elem": elems},
                          schema=pa.schema([("key", pa.int64()), ("elem", pa.int64())])))
print(json.dumps({"inserted": len(elems)}), flush=True)
sys.stdin.read()  # waits here until SIGKILLed
"""


@dataclass
class KilledClient:
    op: Op | None
    detail: str


class KillClients:
    """Clients run as child processes that begin, insert elements into ``la0`` and are SIGKILLed
    once their insert returned, never committing or rolling back: a client process killed between
    writing its parts and committing. One child is kept started ahead (Python and pyarrow take a
    second to import), so the fault itself is short. Their ops are recorded as indeterminate;
    after the run ``commit_status`` must say they did not commit (a transaction still running is
    killed there first), and none of their elements may ever be read."""

    def __init__(self, rec: Recorder, process: int) -> None:
        self.rec = rec
        self.process = process
        self._next: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        return subprocess.Popen(
            [sys.executable, "-c", _KILLED_CLIENT_CODE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )

    def prepare(self) -> None:
        """Start the first child ahead."""
        with self._lock:
            if self._next is None:
                self._next = self._spawn()

    def _take(self) -> subprocess.Popen[bytes]:
        with self._lock:
            proc, self._next = self._next, self._spawn()
        return proc if proc is not None and proc.poll() is None else self._spawn()

    def close(self) -> None:
        with self._lock:
            proc, self._next = self._next, None
        if proc is not None:
            _kill(proc)

    def kill_one(self, address: str, replica: int, rng: random.Random, timeout: float = 20.0) -> KilledClient:
        rec = self.rec
        key = rng.randrange(KEYS)
        elems = [rec.element() for _ in range(rng.randint(1, 3))]
        start = rec.now()
        proc = self._take()
        lines: list[dict] = []
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write((json.dumps({"address": address, "key": key, "elems": elems}) + "\n").encode())
            proc.stdin.flush()
            _read_until(proc, lines, time.monotonic() + timeout, lambda m: "inserted" in m or "error" in m)
        except OSError:
            pass
        finally:
            _kill(proc)
        began = next((m for m in lines if "tid" in m), None)
        inserted = any("inserted" in m for m in lines)
        base = {"process": self.process, "replica": replica, "workload": KILLED_CLIENT, "start": start}
        if began is None:
            error = next(
                (m for m in lines if "error" in m), {"error": "Killed", "message": "killed before begin answered"}
            )
            op = rec.add(
                **base,
                tid=None,
                snapshot=None,
                end=rec.now(),
                mops=[],
                outcome="aborted",
                error=error["error"],
                message=f"begin failed: {error.get('message', '')}",
            )
            return KilledClient(op, f"begin on replica #{replica} failed ({error['error']})")
        mops: list[list[Any]] = [["append", "la0", str(key), e] for e in elems]
        when = "after its insert returned" if inserted else "before its insert returned"
        op = rec.add(
            **base,
            tid=began["tid"],
            snapshot=began["snapshot"],
            end=rec.now(),
            mops=mops,
            outcome="indeterminate",
            error="Killed",
            message=f"client SIGKILLed {when}",
        )
        return KilledClient(op, f"{began['tid']} SIGKILLed {when} (elements {elems})")


def _read_until(
    proc: subprocess.Popen[bytes], lines: list[dict], deadline: float, done: Callable[[dict], bool]
) -> None:
    """Collect the child's JSON lines until one satisfies ``done``, it exits, or the deadline."""
    assert proc.stdout is not None
    buf = b""
    while time.monotonic() < deadline and not any(done(m) for m in lines):
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if not ready:
            if proc.poll() is not None:
                return
            continue
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                lines.append(json.loads(line))
            except ValueError:
                pass


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass
