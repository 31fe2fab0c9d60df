"""The Spark workload of ``mergetxn chaos``: jobs through the ``mergetxn`` data source against a
list-append table, each recorded as one :class:`~mergetxn.chaos.history.Op` (workload
``spark``) with its micro-operations in order.

The table (``sp0`` by default): ``key int64, elem int64``, partitioned by ``key`` under the
``parts`` policy, so an INSERT OVERWRITE replaces one key's partition and removes exactly the
parts it saw. Every element comes from the run's shared counter (``rec.element()``), a block per
job, so a read element names the job that wrote it. Jobs, chosen at random:

* ``append``: a DataFrame of ``(key, elem)`` rows over a few keys, ``mode("append")``; mops
  ``["append", table, key, elem]`` per row.
* ``overwrite``: one key's new elements, ``mode("overwrite")``: the data source overwrites the
  partitions present in the DataFrame, so only that key; mop ``["overwrite", table, key,
  [elements]]`` (see :mod:`mergetxn.chaos.history`).
* ``txn``: the driver begins a transaction, reads a key (``tx.read``), runs a Spark append with
  ``option("txn", tx.id)``, sometimes a Spark overwrite of a key in the same transaction,
  sometimes appends or deletes an element from the driver, then commits.
* ``read``: a Spark read of the whole table at a snapshot (``option("snapshot", S)``, S the
  replica's snapshot when the job starts); a read-only op whose csn is its snapshot.
* ``native``: as ``txn``, but Spark's own Parquet writer (``spark.write_table(df, table,
  txn=tx.id)``, an append or an overwrite of one key) instead of the data source.
* ``native-read``: as ``read``, through ``spark.read_table`` (Spark's own Parquet reader).

Rows are made on the executors (:class:`Rows`) from the job's lists, so a task
that runs again makes the same rows; ``delay`` seconds of sleep per task make a job slow enough
to kill an executor in the middle of it, and ``marks`` (a directory) gets a file per task
attempt as it starts, so a fault can wait for running tasks.

What a job commits in: ``append`` and ``overwrite`` jobs commit on their own, in a transaction
that the data source begins when Spark plans the write and commits in a planner process; the
data source's option ``trace_commits`` tells the driver that transaction's id and snapshot
(before any task runs) and its CSN. So every op has its tid, and its snapshot is the snapshot
its INSERT OVERWRITE removed parts at. Outcomes: committed (with the CSN), aborted (the error's
class: a mergetxn error named in Spark's message, else the Python exception's), indeterminate
when the job failed and nobody could say whether its transaction committed (``commit_status``
after the run resolves it, as for the other workloads).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.core import errors
from mergetxn.chaos.history import Op, TableKind
from mergetxn.chaos.workloads import roll_back
from mergetxn.client.client import Client, Transaction

NAME = "spark"
TABLE = "sp0"
SCHEMA = pa.schema([("key", pa.int64()), ("elem", pa.int64())])
DDL = "key long, elem long"
KINDS = ("append", "overwrite", "txn", "read", "native", "native-read")
WEIGHTS = (0.3, 0.15, 0.2, 0.1, 0.15, 0.1)
# A mergetxn error named in a Spark exception's text (Spark wraps what the planner raised).
_ERROR_NAMES = sorted(
    (n for n, c in vars(errors).items() if isinstance(c, type) and issubclass(c, errors.MergetxnError)),
    key=len,
    reverse=True,
)
_ERROR_RE = re.compile(r"\b(" + "|".join(_ERROR_NAMES) + r")\b")
_RAISED_RE = re.compile(r"coordinator\.errors\.(" + "|".join(_ERROR_NAMES) + r"):")  # a traceback's last line
# Errors after which the transaction certainly did not commit.
DEFINITE = {"ConflictError", "TransactionAborted", "InvalidInput", "TableNotFound", "SnapshotUnavailable"}


class Recorder(Protocol):
    """What the workload needs of the run's recorder (``mergetxn.chaos.workloads.Recorder``)."""

    def now(self) -> float: ...

    def element(self) -> int: ...

    def add(self, **fields: Any) -> Op: ...

    def ended(self, base: dict[str, Any], mops: list[list[Any]], outcome: str, **more: Any) -> Op: ...

    def not_begun(self, base: dict[str, Any], exc: BaseException, message: str) -> Op: ...


# -- executor side ------------------------------------------------------------------------------


class Rows:
    """The function of a write job's tasks (``mapPartitionsWithIndex`` over row numbers; no
    pandas needed, which ``mapInArrow`` would want on the driver): row ``i`` is ``(keys[i],
    elems[i])``; each task attempt touches a file ``<tag>-<pid>-<partition>-<attempt>`` in
    ``marks`` as it starts (``tag`` names the job: Python workers and partition numbers are
    reused by the next job), then sleeps ``delay`` seconds."""

    def __init__(
        self, keys: list[int], elems: list[int], delay: float = 0.0, marks: str | None = None, tag: str = "job"
    ) -> None:
        self.keys, self.elems, self.delay, self.marks, self.tag = keys, elems, delay, marks, tag

    def __call__(self, index: int, ids: Iterator[int]) -> Iterator[tuple[int, int]]:
        if self.marks:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            attempt = ctx.attemptNumber() if ctx else 0
            Path(self.marks, f"{self.tag}-{os.getpid()}-{index}-{attempt}").touch()
        if self.delay:
            time.sleep(self.delay)
        for i in ids:
            yield self.keys[i], self.elems[i]


# -- the driver ---------------------------------------------------------------------------------


def _named(text: str) -> re.Match | None:
    """Where Spark's text of a Python exception names the mergetxn error raised: the
    traceback's ``coordinator.core.errors.X: message`` line, else the first name of one."""
    return _RAISED_RE.search(text) or _ERROR_RE.search(text)


def error_name(exc: BaseException) -> str:
    """The mergetxn error a failed job names (Spark wraps the planner's exception in its own),
    else the exception's class."""
    m = _named(str(exc))
    return m.group(1) if m else type(exc).__name__


def _message(exc: BaseException) -> str:
    text = str(exc)
    m = _named(text)
    return (text[m.start() :] if m else text).strip()[:1000]


def _events(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def set_values(data: pa.Table) -> dict[str, list[int]]:
    """Rows as key -> sorted elements (duplicates kept: they are findings)."""
    out: dict[str, list[int]] = {}
    for k, e in zip(data.column("key").to_pylist(), data.column("elem").to_pylist()):
        out.setdefault(str(k), []).append(e)
    return {k: sorted(v) for k, v in sorted(out.items(), key=lambda kv: int(kv[0]))}


class SparkWorkload:
    """The Spark jobs over one table; one instance per run, shared by the job threads."""

    name = NAME

    def __init__(
        self,
        workdir: str | os.PathLike,
        table: str = TABLE,
        keys: int = 4,
        rows: tuple[int, int] = (4, 24),
        partitions: int = 4,
        delay: float = 0.0,
        marks: str | os.PathLike | None = None,
        weights: Sequence[float] = WEIGHTS,
        auto_merge: bool = True,
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.table = table
        self.keys = keys
        self.rows = rows
        self.partitions = partitions
        self.delay = delay
        self.marks = None if marks is None else str(marks)
        self.weights = tuple(weights)
        self.auto_merge = auto_merge
        self._jobs = itertools.count()
        self._lock = threading.Lock()

    @property
    def tables(self) -> dict[str, TableKind]:
        return {self.table: "set"}

    def create(self, client: Client) -> dict[str, dict[str, Any]]:
        """Create the table (empty); the history's ``initial``."""
        client.create_table(
            self.table, SCHEMA, partition_by=["key"], conflict_policy="parts", auto_merge=self.auto_merge
        )
        return {}

    def _job_number(self) -> int:
        with self._lock:
            return next(self._jobs)

    def _trace(self) -> Path:
        return self.workdir / f"job{self._job_number()}.jsonl"

    def _frame(self, session: Any, keys: list[int], elems: list[int]) -> Any:
        parts = max(1, min(self.partitions, len(elems)))
        rdd = session.sparkContext.parallelize(range(len(elems)), parts)
        rows = Rows(keys, elems, self.delay, self.marks, tag=f"w{self._job_number()}")
        return session.createDataFrame(rdd.mapPartitionsWithIndex(rows), DDL)

    def _writer(self, df: Any, address: str, mode: str, **options: str) -> Any:
        w = df.write.format("mergetxn").option("replica", address).mode(mode)
        for k, v in options.items():
            w = w.option(k, v)
        return w

    # -- one job --------------------------------------------------------------------------------
    def job(
        self,
        session: Any,
        client: Client,
        replica: int,
        process: int,
        rng: random.Random,
        rec: Recorder,
        kind: str | None = None,
    ) -> Op:
        """Run one job (``kind``, else one at random by ``weights``) through ``client``'s replica
        and record it."""
        kind = kind or rng.choices(KINDS, self.weights)[0]
        base = {"process": process, "replica": replica, "workload": NAME, "start": rec.now()}
        if kind in ("read", "native-read"):
            return self._read(session, client, base, rec, native=kind == "native-read")
        if kind in ("txn", "native"):
            return self._txn(
                session, client, base, rng, rec, self._native_statements if kind == "native" else self._txn_statements
            )
        if kind == "overwrite":
            key = rng.randrange(self.keys)
            elems = [rec.element() for _ in range(rng.randint(1, 3))]
            keys = [key] * len(elems)
            mops: list[list[Any]] = [["overwrite", self.table, str(key), elems]]
        elif kind == "append":
            n = rng.randint(*self.rows)
            chosen = rng.sample(range(self.keys), rng.randint(1, self.keys))
            elems = [rec.element() for _ in range(n)]
            keys = [rng.choice(chosen) for _ in range(n)]
            mops = [["append", self.table, str(k), e] for k, e in zip(keys, elems)]
        else:
            raise ValueError(f"unknown Spark job kind {kind!r}: one of {KINDS}")
        return self._own(
            session, client, base, rec, mops, keys, elems, "overwrite" if kind == "overwrite" else "append"
        )

    def _own(
        self,
        session: Any,
        client: Client,
        base: dict,
        rec: Recorder,
        mops: list[list[Any]],
        keys: list[int],
        elems: list[int],
        mode: str,
    ) -> Op:
        """A job that commits on its own; its transaction from the data source's trace."""
        trace = self._trace()
        error: BaseException | None = None
        try:
            self._writer(self._frame(session, keys, elems), client.address, mode, trace_commits=str(trace)).save(
                self.table
            )
        except Exception as exc:  # Py4J / Spark wrap whatever happened
            error = exc
        events = _events(trace)
        began = next((e for e in events if e["event"] == "begin"), None)
        done = next((e for e in events if e["event"] == "committed"), None)
        if began is None:  # the write never began a transaction: nothing of it can commit
            return rec.add(
                **base,
                tid=None,
                snapshot=None,
                end=rec.now(),
                mops=mops,
                outcome="aborted",
                error=error_name(error) if error else "NoTransaction",
                message=_message(error) if error else "the job began no transaction",
            )
        base |= {"tid": began["txn"], "snapshot": began["snapshot"]}
        if done is not None:
            return rec.ended(base, mops, "committed", csn=done["csn"])
        name = error_name(error) if error else "NoOutcome"
        message = _message(error) if error else "the job returned without a committed trace"
        # The job failed (or its trace lost the commit): ask the replica what became of it.
        return self._resolve(client, base, rec, mops, began["txn"], name, message)

    def _resolve(
        self, client: Client, base: dict, rec: Recorder, mops: list[list[Any]], tid: str, name: str, message: str
    ) -> Op:
        """A job whose trace shows no commit of ``tid``: recorded as ``commit_status`` tells
        (indeterminate when that fails or is not final); ``name`` and ``message`` say why it was asked."""
        try:
            status = client.commit_status(tid)
        except Exception as exc:
            return rec.ended(
                base,
                mops,
                "indeterminate",
                error=name,
                message=f"{message}; commit_status failed: {type(exc).__name__}",
            )
        if status.status == "committed":
            return rec.ended(
                base,
                mops,
                "committed",
                csn=status.csn,
                message=f"{message}; commit_status: committed",
            )
        if status.status == "aborted":
            return rec.ended(base, mops, "aborted", error=name, message=message)
        return rec.ended(
            base,
            mops,
            "indeterminate",
            error=name,
            message=f"{message}; commit_status: {status.status}",
        )

    def _read(self, session: Any, client: Client, base: dict, rec: Recorder, native: bool = False) -> Op:
        """A Spark read of the whole table at the replica's current snapshot: through the data
        source, or ``native``ly (``spark.read_table``)."""
        from spark.native import read_table

        try:
            snapshot = client.snapshot()
        except Exception as exc:
            return rec.not_begun(base, exc, f"snapshot failed: {exc}"[:500])
        base |= {"tid": None, "snapshot": snapshot}
        try:
            if native:
                df = read_table(session, self.table, snapshot=snapshot, replica=client.address)
            else:
                df = (
                    session.read.format("mergetxn")
                    .option("replica", client.address)
                    .option("snapshot", str(snapshot))
                    .load(self.table)
                )
            rows = [(r["key"], r["elem"]) for r in df.collect()]
        except Exception as exc:
            return rec.ended(base, [], "aborted", error=error_name(exc), message=_message(exc))
        data = pa.table({"key": [k for k, _ in rows], "elem": [e for _, e in rows]}, schema=SCHEMA)
        mops = [["r", self.table, None, set_values(data)]]
        return rec.ended(base, mops, "committed", csn=snapshot)

    def _txn(
        self,
        session: Any,
        client: Client,
        base: dict,
        rng: random.Random,
        rec: Recorder,
        statements: Callable[..., None],
    ) -> Op:
        """Spark writes inside a transaction the driver opened (``statements``), beside the
        driver's own."""
        mops: list[list[Any]] = []
        try:
            tx = client.begin()
        except Exception as exc:
            return rec.not_begun(base, exc, f"begin failed: {exc}"[:500])
        base |= {"tid": tx.id, "snapshot": tx.snapshot}
        try:
            statements(session, client, tx, rng, rec, mops)
        except Exception as exc:
            outcome, note = roll_back(tx)
            return rec.ended(base, mops, outcome, error=error_name(exc), message=f"{_message(exc)}; {note}")
        try:
            csn = tx.commit()
        except Exception as exc:
            outcome = "aborted" if error_name(exc) in DEFINITE else "indeterminate"
            return rec.ended(base, mops, outcome, error=error_name(exc), message=_message(exc))
        return rec.ended(base, mops, "committed", csn=csn)

    def _read_key(self, tx: Transaction, rng: random.Random, mops: list[list[Any]]) -> tuple[int, list[int]]:
        """The driver's read of one key in the transaction (recorded): the key, its elements."""
        key = rng.randrange(self.keys)
        seen = sorted(tx.read(self.table, where=pc.field("key") == key).column("elem").to_pylist())
        mops.append(["r", self.table, str(key), seen or None])
        return key, seen

    def _txn_statements(
        self, session: Any, client: Client, tx: Transaction, rng: random.Random, rec: Recorder, mops: list[list[Any]]
    ) -> None:
        key, seen = self._read_key(tx, rng, mops)
        n = rng.randint(1, max(1, self.rows[1] // 2))
        elems = [rec.element() for _ in range(n)]
        keys = [rng.randrange(self.keys) for _ in range(n)]
        mops += [["append", self.table, str(k), e] for k, e in zip(keys, elems)]
        self._writer(self._frame(session, keys, elems), client.address, "append", txn=tx.id).save(self.table)
        roll = rng.random()
        if roll < 0.3:
            other = rng.randrange(self.keys)
            new = [rec.element() for _ in range(rng.randint(1, 2))]
            mops.append(["overwrite", self.table, str(other), new])
            self._writer(self._frame(session, [other] * len(new), new), client.address, "overwrite", txn=tx.id).save(
                self.table
            )
        elif roll < 0.6 and seen:
            gone = rng.choice(seen)
            mops.append(["delete", self.table, str(key), gone])
            tx.delete(self.table, (pc.field("key") == key) & (pc.field("elem") == gone))
        else:
            e = rec.element()
            mops.append(["append", self.table, str(key), e])
            tx.insert(self.table, pa.table({"key": [key], "elem": [e]}, schema=SCHEMA))

    def _native_statements(
        self, session: Any, client: Client, tx: Transaction, rng: random.Random, rec: Recorder, mops: list[list[Any]]
    ) -> None:
        """A read of a key, then Spark's own Parquet writer into the transaction: an append over
        a few keys, or an overwrite of one key's partition."""
        from spark.native import write_table

        key, seen = self._read_key(tx, rng, mops)
        if rng.random() < 0.3:
            new = [rec.element() for _ in range(rng.randint(1, 3))]
            mops.append(["overwrite", self.table, str(key), new])
            write_table(
                self._frame(session, [key] * len(new), new), self.table, "overwrite", txn=tx.id, replica=client.address
            )
            return
        n = rng.randint(1, max(1, self.rows[1] // 2))
        elems = [rec.element() for _ in range(n)]
        keys = [rng.randrange(self.keys) for _ in range(n)]
        mops += [["append", self.table, str(k), e] for k, e in zip(keys, elems)]
        write_table(self._frame(session, keys, elems), self.table, "append", txn=tx.id, replica=client.address)


class SparkWorker(threading.Thread):
    """One job thread: jobs one after another on one session until told to stop, moving to the
    next replica when its replica cannot be reached (a SparkSession runs jobs from several
    threads at once)."""

    def __init__(
        self,
        process: int,
        home: int,
        addresses: Callable[[], list[str]],
        workload: SparkWorkload,
        session: Any,
        rec: Recorder,
        stop: threading.Event,
        seed: int,
        timeout: float = 10.0,
    ) -> None:
        super().__init__(name=f"chaos-spark-{process}", daemon=True)
        self.process, self.replica, self.addresses = process, home, addresses
        self.workload, self.session, self.rec, self.stop_event = workload, session, rec, stop
        self.rng = random.Random(seed)
        self.timeout = timeout
        self.clients: dict[int, Client] = {}
        self.failovers = 0
        self.error: BaseException | None = None

    def _client(self, i: int) -> Client:
        client, address = self.clients.get(i), self.addresses()[i]
        if client is None or client.address != address:
            if client is not None:
                client.close()
            client = self.clients[i] = Client(address, timeout=self.timeout)
        return client

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                try:
                    client = self._client(self.replica)
                except (errors.MergetxnError, OSError):
                    self._fail_over()
                    continue
                op = self.workload.job(self.session, client, self.replica, self.process, self.rng, self.rec)
                if op.error in ("ReplicaUnavailable", "OutcomeUnknown", "OSError", "ConnectionError"):
                    self._fail_over()
        except BaseException as exc:  # the runner reports it; the history stays what it is
            self.error = exc
        finally:
            for client in self.clients.values():
                client.close()

    def _fail_over(self) -> None:
        self.replica = (self.replica + 1) % len(self.addresses())
        self.failovers += 1
        self.stop_event.wait(0.2)
