"""``mergetxn quickstart``: the product on this machine in well under a minute.

It starts the embedded cluster (a real ZooKeeper and three replica processes, local storage),
then runs a workload that shows what mergetxn is for: concurrent writers on several replicas,
a write-write conflict with an error naming the winner, commits that succeed after a concurrent
commit by a metadata-only rebase, a transaction spanning two tables, a snapshot read on another
replica, time travel, and a PySpark job (local Spark) that writes two tables in one transaction
while another client commits beside it. Every step asserts its expected outcome, so the exit
code says whether the product behaved (0) or not (1); whatever it started (the Spark JVM
included) is stopped on the way out.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from coordinator.core.errors import ConflictError, InvalidInput, MergetxnError
from mergetxn.client.client import Client, Transaction
from mergetxn.local.cluster import LocalCluster

REPLICAS = 3
WRITER_COMMITS = 25  # per writer
ROWS_PER_COMMIT = 20
DAY = [dt.date(2024, 6, d) for d in range(1, 10)]
SPARK_DAY = DAY[4]  # the orders partition the Spark job writes (no other step touches it)
SPARK_ORDERS = 400  # rows the Spark job appends to orders
SPARK_EVENTS = 200  # and to events
# "module.Error: message" (or "ValueError: message"): the last line of a Python traceback
PYTHON_ERROR_LINE = re.compile(r"^(?:(?:[A-Za-z_]\w*\.)+[A-Z]\w*|[A-Z]\w*(?:Error|Exception)): ")

ORDERS = pa.schema([("id", pa.int64()), ("day", pa.date32()), ("customer", pa.string()), ("amount", pa.float64())])
EVENTS = pa.schema([("id", pa.int64()), ("source", pa.string()), ("kind", pa.string()), ("value", pa.float64())])


class StepFailed(Exception):
    """A step's outcome was not the one the product promises."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise StepFailed(message)


def csn_of(csn: int | None, what: str) -> int:
    """The CSN of a commit that returns one (every commit here is synchronous)."""
    if csn is None:
        raise StepFailed(f"{what} committed without a CSN")
    return csn


@dataclass
class StepResult:
    name: str
    status: str  # ok | FAILED | skipped
    detail: str
    seconds: float


def orders_rows(first_id: int, n: int, day: dt.date, amount: float = 10.0) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(first_id, first_id + n), pa.int64()),
            "day": pa.array([day] * n, pa.date32()),
            "customer": [f"c{(first_id + i) % 7}" for i in range(n)],
            "amount": pa.array([amount] * n, pa.float64()),
        },
        schema=ORDERS,
    )


def events_rows(first_id: int, n: int, source: str, kind: str = "click") -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(first_id, first_id + n), pa.int64()),
            "source": [source] * n,
            "kind": [kind] * n,
            "value": pa.array([1.0] * n, pa.float64()),
        },
        schema=EVENTS,
    )


def day_filter(day: dt.date) -> pc.Expression:
    return pc.field("day") == pa.scalar(day, pa.date32())


def _quiet_py4j(record: logging.LogRecord) -> bool:
    """Py4J logs a traceback to the root logger when Ctrl-C interrupts a call into the JVM (or
    the JVM goes away mid-call); the quickstart reports the interrupt itself."""
    return not (record.name == "root" and f"{os.sep}py4j{os.sep}" in record.pathname)


@contextlib.contextmanager
def _deferred_interrupts() -> Iterator[Callable[[], None]]:
    """SIGINT and SIGTERM during the block are held back and raised (as KeyboardInterrupt) when
    it ends; the handlers in place before it are put back. Yields ``rearm``, which holds them
    back again after code in the block installed a handler of its own."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    held: list[int] = []
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def rearm() -> None:
        for sig, before in saved.items():
            # An ignored signal (SIGINT of a background job) stays ignored.
            ignored = before is signal.SIG_IGN
            signal.signal(sig, signal.SIG_IGN if ignored else lambda n, frame: held.append(n))

    rearm()
    try:
        yield rearm
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    if held:
        raise KeyboardInterrupt


class LocalSpark:
    """A local SparkSession (``local[2]``) for the Spark step. Its JVM writes its log to
    ``spark.log`` in the quickstart's directory instead of the terminal, and :meth:`stop` ends
    the session *and* the JVM it launched."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.log_path = base / "spark.log"
        self.session: Any = None
        self._gateway: Any = None  # the Py4J gateway whose JVM we launched (None: not ours)
        self._log: Any = None

    def start(self) -> Any:
        # Python workers must run this interpreter (the venv, where mergetxn is installed).
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        from pyspark import SparkConf, SparkContext
        from pyspark.java_gateway import launch_gateway
        from pyspark.sql import SparkSession

        import spark as mergetxn_spark

        scratch = self.base / "spark"
        scratch.mkdir(parents=True, exist_ok=True)
        conf = (
            SparkConf()
            .setMaster("local[2]")
            .setAppName("mergetxn-quickstart")
            .set("spark.ui.enabled", "false")
            .set("spark.pyspark.python", sys.executable)
            .set("spark.sql.shuffle.partitions", "2")
            .set("spark.driver.memory", "1g")
            .set("spark.local.dir", str(scratch))
            .set("spark.sql.warehouse.dir", str(scratch / "warehouse"))
        )
        logging.getLogger().addFilter(_quiet_py4j)
        with _deferred_interrupts() as rearm:
            # Ctrl-C (or SIGTERM) while the JVM starts takes effect once it is up: interrupted
            # earlier, pyspark would leave behind a JVM that nothing can stop.
            gateway = None
            if SparkContext._gateway is None:  # launch the JVM ourselves, its output to a file
                self._log = open(self.log_path, "ab")
                gateway = launch_gateway(conf, popen_kwargs={"stdout": self._log, "stderr": subprocess.STDOUT})
                self._gateway = gateway
            sc = SparkContext(conf=conf, gateway=gateway)
            # SparkContext installed a SIGINT handler that calls into the JVM (and breaks when
            # that interrupts another call into it). Hold signals back again; at the end of the
            # block the quickstart's handlers return, so Ctrl-C is a plain KeyboardInterrupt
            # and everything is stopped as in the other steps.
            rearm()
            sc.setLogLevel("ERROR")
            self.session = SparkSession(sc)
        mergetxn_spark.register(self.session)
        return self.session

    def log_tail(self, lines: int = 12) -> list[str]:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        return [ln for ln in text.splitlines() if ln.strip()][-lines:]

    def stop(self) -> None:
        """Stop the session and the JVM we launched; safe to call twice or after a failed start."""
        try:
            if self.session is not None:
                self.session.stop()
        except Exception:
            pass
        finally:
            self.session = None
            self._stop_jvm()
            if self._log is not None:
                self._log.close()
                self._log = None
            logging.getLogger().removeFilter(_quiet_py4j)

    def _stop_jvm(self) -> None:
        gateway, self._gateway = self._gateway, None
        if gateway is None:
            return
        from pyspark import SparkContext

        try:
            gateway.shutdown()
        except Exception:
            pass
        proc = getattr(gateway, "proc", None)
        if proc is not None:
            # Spark's gateway JVM exits when its stdin closes (the same as when Python exits).
            try:
                proc.stdin.close()
                proc.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                pass
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        if SparkContext._gateway is gateway:
            SparkContext._gateway = None
            SparkContext._jvm = None


class Workload:
    """The quickstart's steps; each returns a one-line result or raises :class:`StepFailed`."""

    def __init__(self, cluster: LocalCluster, out: Console) -> None:
        self.cluster = cluster
        self.out = out
        self.clients: list[Client] = []
        self.writer_csn = 0  # the CSN after the concurrent writers
        self.writer_time: dt.datetime | None = None
        self.writer_orders_rows = 0
        self.writer_d1_amount = 0.0
        self.multi_csn = 0
        self.spark: LocalSpark | None = None

    def say(self, text: str) -> None:
        self.out.print(f"    {text}", soft_wrap=True)

    def storage_files(self) -> set[str]:
        """Every Parquet file in storage (relative paths): a commit that rewrites data adds some."""
        root = Path(self.cluster.storage_url)
        return {str(p.relative_to(root)) for p in root.rglob("*.parquet")}

    def c(self, i: int) -> Client:
        return self.clients[i]

    # -- steps --------------------------------------------------------------------------------
    def create_tables(self) -> str:
        self.clients = [self.cluster.client(i) for i in range(REPLICAS)]
        c0 = self.c(0)
        c0.create_table("orders", ORDERS, partition_by=["day"], conflict_policy="maxcompute", auto_merge=False)
        csn = c0.create_table("events", EVENTS, conflict_policy="parts", auto_merge=False)
        self.say(
            "orders: partitioned by day, conflict policy [bold]maxcompute[/] "
            "(a later INSERT into a partition another job changed fails)"
        )
        self.say("events: not partitioned, conflict policy [bold]parts[/] (INSERTs never conflict)")
        for cl in self.clients:
            cl.wait_for(csn)
            expect(
                set(cl.tables()) >= {"orders", "events"},
                f"replica {cl.host_id} does not see both tables",
            )
        return f"orders (maxcompute, by day) and events (parts), created at CSN {csn}"

    def concurrent_writers(self) -> str:
        # (replica, table, day or source): two writers per replica. Orders writers each own a
        # partition (under maxcompute two INSERTs into one partition conflict); events writers
        # share the table (under parts INSERTs never conflict).
        plan: list[tuple[int, str, Any]] = [(i, "orders", DAY[i]) for i in range(REPLICAS)]
        plan += [(i, "events", f"r{i}") for i in range(REPLICAS)]
        csns, spans = self._run_writers(plan)
        commits = sum(len(x) for x in csns)
        elapsed = max(e for _, e in spans) - min(s for s, _ in spans)
        distinct = len({c for x in csns for c in x})
        for w, x in enumerate(csns):
            expect(x == sorted(x) and len(set(x)) == len(x), f"writer {w} saw CSNs go backwards: {x}")
        self.writer_csn = max(c for x in csns for c in x)
        self.writer_time = dt.datetime.now(dt.UTC)
        c0 = self.c(0)
        c0.wait_for(self.writer_csn)
        orders = c0.read("orders", snapshot=self.writer_csn)
        events = c0.read("events", snapshot=self.writer_csn)
        want = REPLICAS * WRITER_COMMITS * ROWS_PER_COMMIT
        expect(
            orders.num_rows == want,
            f"orders has {orders.num_rows} rows after the writers, expected {want}",
        )
        expect(
            events.num_rows == want,
            f"events has {events.num_rows} rows after the writers, expected {want}",
        )
        self.writer_orders_rows = orders.num_rows
        self.writer_d1_amount = pc.sum(orders.filter(day_filter(DAY[0]))["amount"]).as_py()
        rate = commits / elapsed if elapsed > 0 else float("inf")
        self.say(
            f"{len(plan)} writers, one on orders and one on events per replica (r0, r1, r2), "
            "started together by a barrier"
        )
        shared = f"; group commit put them in {distinct} ZooKeeper multis (distinct CSNs)" if distinct < commits else ""
        self.say(f"{commits} transactions committed in {elapsed:.2f}s = [bold]{rate:.0f} commits/s[/]{shared}")
        self.say(f"read on r0 at CSN {self.writer_csn}: orders {orders.num_rows} rows, events {events.num_rows} rows")
        return f"{commits} commits, {rate:.0f} commits/s, no row lost"

    def _run_writers(self, plan: list[tuple[int, str, Any]]) -> tuple[list[list[int]], list[tuple[float, float]]]:
        """The writers of ``plan`` (replica, table, day or source), started together by a barrier:
        each one's CSNs in commit order and its (start, end) time; any writer's error fails the step."""
        barrier = threading.Barrier(len(plan))
        csns: list[list[int]] = [[] for _ in plan]
        spans: list[tuple[float, float]] = [(0.0, 0.0)] * len(plan)
        errors: list[str] = []

        def writer(w: int) -> None:
            i, table, key = plan[w]
            try:
                client = Client(self.cluster.replica_addresses[i])
                barrier.wait(timeout=60)
                start = time.perf_counter()
                for k in range(WRITER_COMMITS):
                    first = w * 1_000_000 + k * ROWS_PER_COMMIT
                    data = (
                        orders_rows(first, ROWS_PER_COMMIT, key)
                        if table == "orders"
                        else events_rows(first, ROWS_PER_COMMIT, key)
                    )
                    with client.transaction() as tx:
                        tx.insert(table, data)
                    csns[w].append(csn_of(tx.csn, f"writer {w}"))
                spans[w] = (start, time.perf_counter())
                client.close()
            except Exception as exc:  # reported below; the step then fails
                barrier.abort()
                errors.append(f"writer {w} ({table} on r{i}): {type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(len(plan))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        expect(not errors, "; ".join(errors))
        return csns, spans

    def conflict(self) -> str:
        d1 = DAY[0]
        before = self.c(0).read("orders", where=day_filter(d1))
        n, base = before.num_rows, pc.sum(before["amount"]).as_py()
        a, b = self.c(0).begin(), self.c(1).begin()
        self.say(f"A = {a.id} on r0 and B = {b.id} on r1 both UPDATE orders partition {d1}")
        a.update("orders", day_filter(d1), {"amount": pc.field("amount") + 1.0})
        b.update("orders", day_filter(d1), {"amount": pc.field("amount") + 100.0})
        exc = self._b_loses_to_a(a, b, "B's UPDATE of the same partition committed; it should have lost to A")
        expect(exc.winner == a.id, f"the error names {exc.winner} as the winner, expected {a.id}")
        after = self.c(0).read("orders", where=day_filter(d1))
        expect(
            pc.sum(after["amount"]).as_py() == base + n * 1.0,
            "after the conflict the partition does not hold exactly A's update (B left something behind?)",
        )
        # The error says retrying the whole transaction is safe: do it.
        with self.c(1).transaction() as retry:
            retry.update("orders", day_filter(d1), {"amount": pc.field("amount") + 100.0})
        final = self.c(1).read("orders", where=day_filter(d1))
        expect(
            pc.sum(final["amount"]).as_py() == base + n * 101.0,
            "the retried UPDATE did not apply exactly once",
        )
        self.say(f"B retried as a new transaction: committed at CSN {retry.csn}; amounts now +1 (A) and +100 (B)")
        return f"B lost to A ({a.id}, named in the error); retry committed at CSN {retry.csn}"

    def rebase_maxcompute(self) -> str:
        d2 = DAY[1]
        c0, c1, c2 = self.c(0), self.c(1), self.c(2)
        rows_before = c0.read("orders", where=day_filter(d2)).num_rows
        tx = c1.begin()
        tx.insert("orders", orders_rows(5_000_000, ROWS_PER_COMMIT, d2))
        self.say(f"T = {tx.id} on r1 INSERTs {ROWS_PER_COMMIT} rows into orders {d2} (snapshot {tx.snapshot})")
        csn_compact = c2.compact("orders", kind="minor", partitions=[d2.isoformat()])
        merged = [r for r in c2.parts("orders").to_pylist() if r["removal_csn"] == csn_compact]
        expect(
            csn_compact > tx.snapshot and len(merged) >= 2,
            f"the compaction on r2 did not merge parts of {d2} (CSN {csn_compact}, {len(merged)} parts)",
        )
        self.say(f"meanwhile r2 compacts that partition: {len(merged)} parts merged at CSN {csn_compact}")
        files = self.storage_files()
        csn = tx.commit()
        expect(self.storage_files() == files, "the rebased INSERT rewrote data files at commit")
        mine = [r for r in c1.parts("orders").to_pylist() if r["creation_tid"] == tx.id]
        expect(
            bool(mine) and all(r["creation_csn"] == csn and r["visible"] for r in mine),
            f"T's parts are not all visible at its CSN {csn}: {mine}",
        )
        expect(
            all(r["inlined"] or r["path"] in files for r in mine),  # a small insert's part is inlined: no file
            "T's committed parts are not the files it wrote before commit (or parts inlined in its commit)",
        )
        rows_after = c1.read("orders", where=day_filter(d2)).num_rows
        expect(
            rows_after == rows_before + ROWS_PER_COMMIT,
            f"orders {d2} has {rows_after} rows, expected {rows_before + ROWS_PER_COMMIT}",
        )
        self.say(
            f"T commits at CSN {csn}: INSERT after MINOR_COMPACT succeeds under maxcompute, "
            f"rebased on metadata only (its {len(mine)} part file(s) kept, 0 files written at commit)"
        )
        return f"INSERT rebased past compaction CSN {csn_compact}, committed at CSN {csn}, no data rewritten"

    def rebase_parts(self) -> str:
        c0, c1, c2 = self.c(0), self.c(1), self.c(2)
        rows_before = c0.read("events").num_rows
        comp = c0.begin()
        replaced = comp.compact("events", kind="minor")
        expect(replaced >= 2, f"the compaction found only {replaced} part(s) to merge")
        self.say(f"K = {comp.id} on r0 stages a compaction of events ({replaced} parts -> 1)")
        inserted = []
        for i, cl in ((1, c1), (2, c2)):
            with cl.transaction() as tx:
                tx.insert(
                    "events",
                    events_rows(6_000_000 + i * 1000, ROWS_PER_COMMIT, f"late-r{i}", "late"),
                )
            inserted.append(tx)
        self.say("meanwhile r1 and r2 commit INSERTs into events at CSN " + ", ".join(str(t.csn) for t in inserted))
        files = self.storage_files()
        csn = comp.commit()
        expect(self.storage_files() == files, "the compaction's commit wrote data files")
        c0.wait_for(max(csn_of(t.csn, f"insert {t.id}") for t in inserted))
        recs = c0.parts("events").to_pylist()
        removed = [r for r in recs if r["removal_csn"] == csn]
        expect(
            len(removed) == replaced,
            f"the compaction removed {len(removed)} parts, expected {replaced}",
        )
        expect(
            all(r["creation_csn"] <= comp.snapshot for r in removed),
            "the compaction removed a part it never saw",
        )
        late = [r for r in recs if r["creation_tid"] in {t.id for t in inserted}]
        expect(
            bool(late) and all(r["visible"] for r in late),
            "a concurrent INSERT's part was lost by the compaction",
        )
        rows_after = c0.read("events").num_rows
        expect(
            rows_after == rows_before + 2 * ROWS_PER_COMMIT,
            f"events has {rows_after} rows, expected {rows_before + 2 * ROWS_PER_COMMIT}",
        )
        self.say(
            f"K commits at CSN {csn}: under parts it removes only what it saw, the 2 new parts "
            f"stay visible; {rows_after} rows, none lost or doubled; 0 files written at commit"
        )
        return f"compaction committed at CSN {csn} beside 2 concurrent INSERTs, nothing lost"

    def multi_table(self) -> str:
        c0 = self.c(0)
        tx = c0.begin()
        tx.insert("orders", orders_rows(7_000_000, 10, DAY[8]))
        tx.insert("events", events_rows(7_000_000, 10, "checkout", "order"))
        csn = csn_of(tx.commit(), "the multi-table transaction")
        self.multi_csn = csn
        for table in ("orders", "events"):
            mine = [r for r in c0.parts(table).to_pylist() if r["creation_tid"] == tx.id]
            expect(
                bool(mine) and all(r["creation_csn"] == csn for r in mine),
                f"{table}: the transaction's parts do not all carry CSN {csn}",
            )
        before_o = c0.read("orders", snapshot=tx.snapshot, where=day_filter(DAY[8])).num_rows
        before_e = c0.read("events", snapshot=tx.snapshot, where=pc.field("source") == "checkout").num_rows
        at_o = c0.read("orders", snapshot=csn, where=day_filter(DAY[8])).num_rows
        at_e = c0.read("events", snapshot=csn, where=pc.field("source") == "checkout").num_rows
        expect(
            (before_o, before_e, at_o, at_e) == (0, 0, 10, 10),
            f"expected 0/0 rows before and 10/10 at CSN {csn}, got {before_o}/{before_e} and {at_o}/{at_e}",
        )
        self.say(f"one transaction {tx.id} on r0 inserts 10 rows into orders and 10 into events")
        self.say(f"both appear at [bold]CSN {csn}[/] (one ZooKeeper multi); at snapshot {tx.snapshot} neither does")
        return f"orders +10 and events +10 visible together at CSN {csn}"

    def snapshot_read(self) -> str:
        csn, c0, c2 = self.multi_csn, self.c(0), self.c(2)
        counts = []
        for table in ("orders", "events"):
            here = c0.read(table, snapshot=csn).sort_by("id")
            there = c2.read(table, snapshot=csn).sort_by("id")
            expect(there.equals(here), f"{table} at CSN {csn} differs between r2 and r0")
            counts.append(f"{table} {there.num_rows} rows")
        expect(c2.snapshot() >= csn, f"r2's snapshot is behind CSN {csn} after serving it")
        self.say(f"the commit at CSN {csn} happened on r0; r2 reads at that CSN (waiting until it has applied it):")
        self.say(f"{', '.join(counts)}, row for row the same as on r0")
        return f"r2 read CSN {csn} committed on r0: identical ({', '.join(counts)})"

    def time_travel(self) -> str:
        c1 = self.c(1)
        old = c1.read("orders", snapshot=self.writer_csn)
        as_of = c1.read("orders", as_of=self.writer_time)
        now = c1.read("orders")
        want_now = self.writer_orders_rows + ROWS_PER_COMMIT + 10
        expect(
            old.num_rows == self.writer_orders_rows,
            f"orders at CSN {self.writer_csn} has {old.num_rows} rows, expected {self.writer_orders_rows}",
        )
        expect(
            as_of.num_rows == self.writer_orders_rows,
            f"orders as of {self.writer_time} has {as_of.num_rows} rows, expected {self.writer_orders_rows}",
        )
        expect(now.num_rows == want_now, f"orders now has {now.num_rows} rows, expected {want_now}")
        old_amount = pc.sum(old.filter(day_filter(DAY[0]))["amount"]).as_py()
        now_amount = pc.sum(now.filter(day_filter(DAY[0]))["amount"]).as_py()
        expect(
            old_amount == self.writer_d1_amount and now_amount != old_amount,
            "the old snapshot does not show the amounts from before the UPDATEs",
        )
        assert self.writer_time is not None  # set by the concurrent writers' step, which comes first
        when = self.writer_time.astimezone().strftime("%H:%M:%S.%f")[:-3]
        self.say(
            f"orders at CSN {self.writer_csn}: {old.num_rows} rows; as of {when}: "
            f"{as_of.num_rows} rows; "
            f"now: {now.num_rows} rows"
        )
        self.say(f"partition {DAY[0]} amount total then {old_amount:g}, now {now_amount:g} (before/after the UPDATEs)")
        return f"{old.num_rows} rows at CSN {self.writer_csn} and as of {when}, {now.num_rows} now"

    def keys_table(self) -> str:
        """Keys tables (docs/rules.md#keys-tables): first committer wins per key, the error names the key; lock
        groups let writers of different columns of one row both commit."""
        c0, c1 = self.c(0), self.c(1)
        self._customers(c0, c1)
        self._first_committer_wins(c0, c1)
        # Different lock groups of the same row: both commit, both changes are there.
        m, p = c0.begin(), c1.begin()
        m.upsert("customers", pa.table({"customer": pa.array([2], pa.int64()), "balance": [175.0]}), update=True)
        p.upsert(
            "customers",
            pa.table({"customer": pa.array([2], pa.int64()), "name": ["Ada"], "segment": ["gold"]}),
            update=True,
        )
        m.commit()
        c0.wait_for(csn_of(p.commit(), "the second transaction"))
        row = c0.read("customers", where=pc.field("customer") == 2).to_pylist()
        expect(
            row == [{"customer": 2, "name": "Ada", "balance": 175.0, "segment": "gold"}],
            f"customer 2 should hold both writers' columns, holds {row}",
        )
        self.say(
            f"writers of balance (money) and of name, segment (profile) of customer 2 both committed "
            f"(CSNs {m.csn}, {p.csn}): {row[0]}"
        )
        return "B lost to A on customer 1 (the error names the key); two lock groups of customer 2 both committed"

    def _customers(self, c0: Client, c1: Client) -> None:
        """The customers keys table, with lock groups money and profile, and three customers."""
        schema = pa.schema(
            [
                pa.field("customer", pa.int64(), nullable=False),
                ("name", pa.string()),
                ("balance", pa.float64()),
                ("segment", pa.string()),
            ]
        )
        csn = c0.create_table(
            "customers",
            schema,
            primary_key=["customer"],
            conflict_policy="keys",
            lock_groups={"money": ["balance"], "profile": ["name", "segment"]},
        )
        with c0.transaction() as tx:
            tx.insert(
                "customers",
                pa.Table.from_pylist(
                    [{"customer": i, "name": f"c{i}", "balance": 100.0, "segment": "new"} for i in range(1, 4)],
                    schema=schema,
                ),
            )
        c1.wait_for(csn_of(tx.csn, "the transaction"))
        self.say(
            f"customers: primary key customer, conflict policy [bold]keys[/] (CSN {csn}), lock groups "
            "money = balance and profile = name, segment"
        )

    def _first_committer_wins(self, c0: Client, c1: Client) -> None:
        """A on r0 and B on r1 upsert customer 1: A commits, B's commit fails naming A and the key."""
        a, b = c0.begin(), c1.begin()
        self.say(f"A = {a.id} on r0 and B = {b.id} on r1 both upsert customer 1")
        a.upsert("customers", pa.table({"customer": pa.array([1], pa.int64()), "balance": [150.0]}), update=True)
        b.upsert("customers", pa.table({"customer": pa.array([1], pa.int64()), "balance": [10.0]}), update=True)
        exc = self._b_loses_to_a(a, b, "B's upsert of customer 1 committed; it should have lost to A")
        expect(
            exc.winner == a.id and "'customer': 1" in exc.message,
            f"the error should name the winner {a.id} and the key customer 1: {exc.message}",
        )

    def _b_loses_to_a(self, a: Transaction, b: Transaction, if_not: str) -> ConflictError:
        """A commits, then B's commit fails with the ConflictError shown and returned (StepFailed
        with ``if_not`` if B commits)."""
        csn_a = a.commit()
        try:
            b.commit()
        except ConflictError as exc:
            self.say(f"A committed at CSN {csn_a}; B's commit fails:")
            self.out.print(f"    [yellow]ConflictError: {escape(str(exc))}[/]", soft_wrap=True)
            return exc
        raise StepFailed(if_not)

    def spark_job(self) -> str:
        started = time.perf_counter()
        self.spark = LocalSpark(self.cluster.workdir)
        try:
            session = self.spark.start()
        except Exception as exc:
            raise StepFailed(self._spark_error("Spark did not start", exc)) from None
        try:
            return self._spark_job(session, started)
        except (StepFailed, MergetxnError):
            raise
        except Exception as exc:  # a Spark/Py4J error: one line here, Spark's log tail above
            raise StepFailed(self._spark_error("the Spark job failed", exc)) from None

    def _spark_job(self, session: Any, started: float) -> str:
        c0 = self.c(0)
        boot = time.perf_counter() - started
        self.say(
            f"local Spark (local[2]) started in {boot:.1f}s; the data source talks to the "
            "replicas, Spark's own log goes to spark.log in the quickstart directory"
        )
        tx = c0.begin()
        try:
            beside_csn = self._spark_writes(session, tx)
            self._spark_read_while_open(session, beside_csn)
            csn = csn_of(tx.commit(), "the Spark transaction")
        finally:
            if tx.csn is None:
                try:
                    tx.rollback()
                except Exception:
                    pass
        self._spark_read_committed(session, tx.id, csn, beside_csn)
        if self.spark is not None:
            self.spark.stop()
        took = time.perf_counter() - started
        self.say(f"Spark stopped; the step took {took:.1f}s (Spark start-up {boot:.1f}s)")
        return (
            f"Spark rows (orders +{SPARK_ORDERS}, events +{SPARK_EVENTS}) visible together at "
            f"CSN {csn}, none at {csn - 1}; r1 committed beside at CSN {beside_csn}; {took:.1f}s"
        )

    def _spark_counts(self, session: Any, snapshot: int | None) -> dict[str, int]:
        """One Spark job over both tables on r2: the Spark job's rows and the other client's."""
        from pyspark.sql import functions as F

        from spark.native import read_table

        r2 = self.cluster.replica_addresses[2]

        def load(table: str, where: list | None = None):
            # Spark's own Parquet reader over the parts visible at the snapshot (spark/native.py).
            return read_table(session, table, snapshot=snapshot, replica=r2, where=where)

        orders = load("orders", where=[("day", "==", SPARK_DAY)]).select(  # skips the other days' parts
            F.lit("orders").alias("what")
        )
        events = load("events", where=[("source", "in", ["spark", "beside-r1"])]).select(
            F.concat(F.lit("events/"), F.col("source")).alias("what")
        )
        got = {"orders": 0, "events/spark": 0, "events/beside-r1": 0}
        for row in orders.unionByName(events).groupBy("what").count().collect():
            got[row["what"]] = row["count"]
        return got

    def _spark_writes(self, session: Any, tx: Any) -> int:
        """A Spark job appends to both tables in ``tx`` (Spark's own Parquet writer); between its
        two writes another client on r1 commits events rows on its own: that commit's CSN."""
        from pyspark.sql import functions as F

        from spark.native import write_table

        c1, r0 = self.c(1), self.cluster.replica_addresses[0]
        self.say(
            f"the driver opens T = {tx.id} on r0 (snapshot {tx.snapshot}); a Spark job "
            "appends to both tables with spark.write_table(txn=T): Spark's own Parquet writer"
        )
        orders_df = session.range(8_000_000, 8_000_000 + SPARK_ORDERS, numPartitions=2).select(
            F.col("id"),
            F.lit(SPARK_DAY).alias("day"),
            F.concat(F.lit("c"), (F.col("id") % 7).cast("string")).alias("customer"),
            ((F.col("id") % 100) / 4).cast("double").alias("amount"),
        )
        events_df = session.range(8_000_000, 8_000_000 + SPARK_EVENTS, numPartitions=2).select(
            F.col("id"),
            F.lit("spark").alias("source"),
            F.when(F.col("id") % 2 == 0, "view").otherwise("click").alias("kind"),
            F.lit(1.0).alias("value"),
        )

        def save(df, table: str) -> None:
            # Spark's own Parquet writer; the files join T as parts (None: T commits them).
            expect(write_table(df, table, txn=tx, replica=r0) is None, f"write_table into T returned a CSN for {table}")

        save(orders_df, "orders")
        # Beside it, another client on another replica commits on its own.
        with c1.transaction() as beside:
            beside.insert("events", events_rows(8_100_000, ROWS_PER_COMMIT, "beside-r1", "beside"))
        save(events_df, "events")
        self.say(
            f"Spark staged {SPARK_ORDERS} rows into orders {SPARK_DAY} and {SPARK_EVENTS} into "
            f"events; between the two writes r1 committed {ROWS_PER_COMMIT} events rows at "
            f"CSN {beside.csn} (policy parts: no conflict)"
        )
        return csn_of(beside.csn, "the transaction beside")

    def _spark_read_while_open(self, session: Any, beside_csn: int) -> None:
        """A Spark read on r2 at the latest snapshot, T still open: none of T's rows, all of r1's."""
        self.c(2).wait_for(beside_csn)
        before = self._spark_counts(session, None)
        expect(
            before["orders"] == 0 and before["events/spark"] == 0,
            f"a Spark read at the latest snapshot sees uncommitted Spark rows: {before}",
        )
        expect(
            before["events/beside-r1"] == ROWS_PER_COMMIT,
            f"a Spark read at the latest snapshot misses r1's committed rows: {before}",
        )
        self.say(
            "a Spark read on r2 at the latest snapshot, T still open: orders 0, events 0 of "
            f"Spark's rows; r1's {ROWS_PER_COMMIT} rows are there"
        )

    def _spark_read_committed(self, session: Any, tid: str, csn: int, beside_csn: int) -> None:
        """T (``tid``) committed at ``csn``, after r1: its parts carry that CSN, and Spark reads
        see all of its rows at ``csn`` and none one CSN before (r1's rows in both)."""
        c0 = self.c(0)
        expect(csn > beside_csn, f"T committed at CSN {csn}, not after r1's CSN {beside_csn}")
        for table in ("orders", "events"):
            mine = [r for r in c0.parts(table).to_pylist() if r["creation_tid"] == tid]
            expect(
                bool(mine) and all(r["creation_csn"] == csn for r in mine),
                f"{table}: the Spark job's parts do not all carry CSN {csn}",
            )
        at = self._spark_counts(session, csn)
        prior = self._spark_counts(session, csn - 1)
        want_at = {
            "orders": SPARK_ORDERS,
            "events/spark": SPARK_EVENTS,
            "events/beside-r1": ROWS_PER_COMMIT,
        }
        want_prior = {"orders": 0, "events/spark": 0, "events/beside-r1": ROWS_PER_COMMIT}
        expect(at == want_at, f"Spark read at CSN {csn}: {at}, expected {want_at}")
        expect(prior == want_prior, f"Spark read at CSN {csn - 1}: {prior}, expected {want_prior}")
        self.say(
            f"T commits at [bold]CSN {csn}[/]; Spark reads on r2 with read_table(snapshot=...): at {csn} "
            f"orders {at['orders']} + events {at['events/spark']}, at {csn - 1} 0 + 0 "
            "(both or neither; r1's rows in both)"
        )

    def _spark_error(self, what: str, exc: BaseException) -> str:
        """One line for a Spark error: the Python exception at the bottom of the traceback that
        Spark wraps into its message when there is one (the data source's own error), else the
        message's first line. The tail of Spark's log is printed above it."""
        for line in self.spark.log_tail() if self.spark else []:
            self.out.print(f"    [dim]spark.log: {escape(line)}[/]", soft_wrap=True)
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        causes = [ln for ln in lines if PYTHON_ERROR_LINE.match(ln)]
        return f"{what}: {type(exc).__name__}: {causes[-1] if causes else (lines or [''])[0]}"

    def close(self) -> None:
        if self.spark is not None:
            self.spark.stop()
        for cl in self.clients:
            try:
                cl.close()
            except Exception:
                pass


def _check_workdir(workdir: Path) -> None:
    if workdir.exists() and (not workdir.is_dir() or any(workdir.iterdir())):
        raise InvalidInput(f"workdir {workdir} is not an empty directory; quickstart needs a fresh one")


def _summary(results: list[StepResult]) -> Table:
    table = Table(title="quickstart summary", title_justify="left")
    table.add_column("step")
    table.add_column("result", overflow="fold")
    table.add_column("time", justify="right")
    for r in results:
        style = {"ok": "green", "FAILED": "bold red"}.get(r.status, "dim")
        mark = {"ok": "ok", "FAILED": "FAILED"}.get(r.status, r.status)
        table.add_row(r.name, f"[{style}]{mark}[/] {escape(r.detail)}", f"{r.seconds:.2f}s")
    return table


@dataclass
class _Progress:
    """The steps' results so far, and the step under way (named when interrupted)."""

    results: list[StepResult] = field(default_factory=list)
    current: str = "start cluster"
    t0: float = field(default_factory=time.perf_counter)

    def begin(self, name: str) -> None:
        self.current, self.t0 = name, time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


def run(workdir: Path | None, keep: bool, out: Console) -> int:
    """Run the quickstart; 0 when every step behaved, 1 when one did not, 130 on Ctrl-C."""
    started = time.perf_counter()
    base, temporary = _base_dir(workdir)
    restore = _interrupt_on_sigterm()
    # A partition's inlined parts (each writer's 25 small inserts) stay unflushed until the
    # compaction steps merge them: with the default 16, a merge round that came after the 25th
    # insert flushed all of them into one part and left the compaction nothing to merge.
    cluster = LocalCluster(base, replicas=REPLICAS, settings={"inline_flush_parts": 4 * WRITER_COMMITS})
    work = Workload(cluster, out)
    steps = _steps(work)
    progress = _Progress()
    try:
        code = _run_steps(cluster, steps, progress, base, out)
    except StepFailed:
        code = 1
    except KeyboardInterrupt:
        out.print("\n[yellow]interrupted: stopping the cluster[/]")
        progress.results.append(StepResult(progress.current, "interrupted", "", progress.elapsed()))
        code = 130
    except Exception as exc:  # an unexpected error is a failed quickstart, reported in one line
        progress.results.append(StepResult("unexpected error", "FAILED", f"{type(exc).__name__}: {exc}", 0.0))
        code = 1
    finally:
        work.close()
        stop_seconds = _stop(cluster, restore)
        if temporary and not keep:
            shutil.rmtree(base, ignore_errors=True)
    results = _with_skipped(progress.results, steps)
    results.append(StepResult("stop cluster", "ok", "ZooKeeper and replicas stopped", stop_seconds))
    where = f"; files kept in {base}" if (keep or not temporary) else ""
    _print_outcome(out, results, code, len(steps), time.perf_counter() - started, where)
    return code


def _base_dir(workdir: Path | None) -> tuple[Path, bool]:
    """The directory the cluster lives in (the given one, checked and made, or a temporary
    one) and whether it is temporary."""
    if workdir is None:
        return Path(tempfile.mkdtemp(prefix="mergetxn-quickstart-")), True
    workdir = Path(workdir).resolve()
    _check_workdir(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir, False


def _interrupt_on_sigterm() -> Any:
    """SIGTERM interrupts as Ctrl-C does (main thread only); returns the handler to restore, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def on_term(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, on_term)


def _steps(work: Workload) -> list[tuple[str, Callable[[], str]]]:
    return [
        ("create tables", work.create_tables),
        ("concurrent writers", work.concurrent_writers),
        ("conflict", work.conflict),
        ("rebased retry (maxcompute)", work.rebase_maxcompute),
        ("rebased retry (parts)", work.rebase_parts),
        ("multi-table commit", work.multi_table),
        ("snapshot read on r2", work.snapshot_read),
        ("time travel", work.time_travel),
        ("keys table: first committer wins per key", work.keys_table),
        ("Spark job: two tables, one txn", work.spark_job),
    ]


def _run_steps(
    cluster: LocalCluster, steps: list[tuple[str, Callable[[], str]]], progress: _Progress, base: Path, out: Console
) -> int:
    """Start the cluster, then each step until one fails: 0 when all behaved, else 1."""
    out.rule("[bold]mergetxn quickstart[/]")
    out.print(f"starting ZooKeeper and {REPLICAS} replicas in {base} ...")
    _start_cluster(cluster, progress, out)
    for n, (name, fn) in enumerate(steps, 1):
        out.print(f"\n[bold cyan]{n}. {name}[/]")
        progress.begin(name)
        try:
            detail = fn()
        except (StepFailed, MergetxnError, AssertionError) as exc:
            kind = "" if isinstance(exc, StepFailed) else f"{type(exc).__name__}: "
            progress.results.append(StepResult(name, "FAILED", f"{kind}{exc}", progress.elapsed()))
            out.print(f"    [bold red]FAILED: {escape(kind + str(exc))}[/]", soft_wrap=True)
            return 1
        progress.results.append(StepResult(name, "ok", detail, progress.elapsed()))
    return 0


def _start_cluster(cluster: LocalCluster, progress: _Progress, out: Console) -> None:
    progress.begin("start cluster")
    try:
        cluster.start()
    except Exception as exc:
        progress.results.append(
            StepResult("start cluster", "FAILED", f"{type(exc).__name__}: {exc}", progress.elapsed())
        )
        raise StepFailed(str(exc)) from None
    detail = f"ZooKeeper {cluster.zk_address}; replicas {', '.join(cluster.replica_addresses)}"
    progress.results.append(StepResult("start cluster", "ok", detail, progress.elapsed()))
    out.print(f"    {detail}; storage {cluster.storage_url}", soft_wrap=True)


def _stop(cluster: LocalCluster, restore: Any) -> float:
    """Stop the cluster (then put the SIGTERM handler back); returns how long stopping took."""
    t0 = time.perf_counter()
    try:
        cluster.stop()
    finally:
        if restore is not None:
            signal.signal(signal.SIGTERM, restore)
    return time.perf_counter() - t0


def _with_skipped(results: list[StepResult], steps: list[tuple[str, Callable[[], str]]]) -> list[StepResult]:
    """``results`` and a skipped row for every step that did not run."""
    done = {r.name for r in results}
    return results + [StepResult(name, "skipped", "", 0.0) for name, _ in steps if name not in done]


def _print_outcome(out: Console, results: list[StepResult], code: int, steps: int, total: float, where: str) -> None:
    out.print()
    out.print(_summary(results))
    if code == 0:
        out.print(f"[bold green]all {steps} steps behaved as expected[/] in {total:.1f}s{where}")
    elif code == 130:
        out.print(f"[yellow]quickstart interrupted after {total:.1f}s[/]{where}")
    else:
        out.print(f"[bold red]quickstart FAILED[/] after {total:.1f}s{where}")
