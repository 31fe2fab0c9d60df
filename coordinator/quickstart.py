"""``mergetxn quickstart``: the product on this machine in ten to twenty seconds.

It starts the embedded cluster (a real ZooKeeper and three replica processes, local storage),
then runs a workload that shows what mergetxn is for: concurrent writers on several replicas,
a write-write conflict with an error naming the winner, commits that succeed after a concurrent
commit by a metadata-only rebase, a transaction spanning two tables, a snapshot read on another
replica, and time travel. Every step asserts its expected outcome, so the exit code says whether
the product behaved (0) or not (1); whatever it started is stopped on the way out.
"""

from __future__ import annotations

import datetime as dt
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from coordinator.client import Client
from coordinator.cluster import LocalCluster
from coordinator.errors import ConflictError, InvalidInput, MergetxnError

REPLICAS = 3
WRITER_COMMITS = 25  # per writer
ROWS_PER_COMMIT = 20
DAY = [dt.date(2024, 6, d) for d in range(1, 10)]

ORDERS = pa.schema(
    [("id", pa.int64()), ("day", pa.date32()), ("customer", pa.string()), ("amount", pa.float64())]
)
EVENTS = pa.schema(
    [("id", pa.int64()), ("source", pa.string()), ("kind", pa.string()), ("value", pa.float64())]
)


class StepFailed(Exception):
    """A step's outcome was not the one the product promises."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise StepFailed(message)


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
        c0.create_table(
            "orders", ORDERS, partition_by=["day"], conflict_policy="maxcompute", auto_merge=False
        )
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
        plan = [(i, "orders", DAY[i]) for i in range(REPLICAS)] + [
            (i, "events", f"r{i}") for i in range(REPLICAS)
        ]
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
                    csns[w].append(tx.csn)
                spans[w] = (start, time.perf_counter())
                client.close()
            except Exception as exc:  # reported below; the step then fails
                barrier.abort()
                errors.append(f"writer {w} ({table} on r{i}): {type(exc).__name__}: {exc}")

        threads = [
            threading.Thread(target=writer, args=(w,), daemon=True) for w in range(len(plan))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        expect(not errors, "; ".join(errors))
        commits = sum(len(x) for x in csns)
        elapsed = max(e for _, e in spans) - min(s for s, _ in spans)
        distinct = len({c for x in csns for c in x})
        for w, x in enumerate(csns):
            expect(
                x == sorted(x) and len(set(x)) == len(x), f"writer {w} saw CSNs go backwards: {x}"
            )
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
        shared = (
            f"; group commit put them in {distinct} ZooKeeper multis (distinct CSNs)"
            if distinct < commits
            else ""
        )
        self.say(
            f"{commits} transactions committed in {elapsed:.2f}s = [bold]{rate:.0f} "
            f"commits/s[/]{shared}"
        )
        self.say(
            f"read on r0 at CSN {self.writer_csn}: orders {orders.num_rows} rows, events "
            f"{events.num_rows} rows"
        )
        return f"{commits} commits, {rate:.0f} commits/s, no row lost"

    def conflict(self) -> str:
        d1 = DAY[0]
        before = self.c(0).read("orders", where=day_filter(d1))
        n, base = before.num_rows, pc.sum(before["amount"]).as_py()
        a, b = self.c(0).begin(), self.c(1).begin()
        self.say(f"A = {a.id} on r0 and B = {b.id} on r1 both UPDATE orders partition {d1}")
        a.update("orders", day_filter(d1), {"amount": pc.field("amount") + 1.0})
        b.update("orders", day_filter(d1), {"amount": pc.field("amount") + 100.0})
        csn_a = a.commit()
        try:
            b.commit()
        except ConflictError as exc:
            self.say(f"A committed at CSN {csn_a}; B's commit fails:")
            self.out.print(f"    [yellow]ConflictError: {escape(str(exc))}[/]", soft_wrap=True)
            expect(
                exc.winner == a.id, f"the error names {exc.winner} as the winner, expected {a.id}"
            )
        else:
            raise StepFailed("B's UPDATE of the same partition committed; it should have lost to A")
        after = self.c(0).read("orders", where=day_filter(d1))
        expect(
            pc.sum(after["amount"]).as_py() == base + n * 1.0,
            "after the conflict the partition does not hold exactly A's update (B left something "
            "behind?)",
        )
        # The error says retrying the whole transaction is safe: do it.
        with self.c(1).transaction() as retry:
            retry.update("orders", day_filter(d1), {"amount": pc.field("amount") + 100.0})
        final = self.c(1).read("orders", where=day_filter(d1))
        expect(
            pc.sum(final["amount"]).as_py() == base + n * 101.0,
            "the retried UPDATE did not apply exactly once",
        )
        self.say(
            f"B retried as a new transaction: committed at CSN {retry.csn}; amounts now +1 (A) "
            "and +100 (B)"
        )
        return f"B lost to A ({a.id}, named in the error); retry committed at CSN {retry.csn}"

    def rebase_maxcompute(self) -> str:
        d2 = DAY[1]
        c0, c1, c2 = self.c(0), self.c(1), self.c(2)
        rows_before = c0.read("orders", where=day_filter(d2)).num_rows
        tx = c1.begin()
        tx.insert("orders", orders_rows(5_000_000, ROWS_PER_COMMIT, d2))
        self.say(
            f"T = {tx.id} on r1 INSERTs {ROWS_PER_COMMIT} rows into orders {d2} (snapshot "
            f"{tx.snapshot})"
        )
        csn_compact = c2.compact("orders", kind="minor", partitions=[d2.isoformat()])
        merged = [r for r in c2.parts("orders").to_pylist() if r["removal_csn"] == csn_compact]
        expect(
            csn_compact > tx.snapshot and len(merged) >= 2,
            f"the compaction on r2 did not merge parts of {d2} (CSN {csn_compact}, {len(merged)} "
            "parts)",
        )
        self.say(
            f"meanwhile r2 compacts that partition: {len(merged)} parts merged at CSN {csn_compact}"
        )
        files = self.storage_files()
        csn = tx.commit()
        expect(self.storage_files() == files, "the rebased INSERT rewrote data files at commit")
        mine = [r for r in c1.parts("orders").to_pylist() if r["creation_tid"] == tx.id]
        expect(
            bool(mine) and all(r["creation_csn"] == csn and r["visible"] for r in mine),
            f"T's parts are not all visible at its CSN {csn}: {mine}",
        )
        expect(
            all(r["path"] in files for r in mine),
            "T's committed parts are not the files it wrote before commit",
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
        return (
            f"INSERT rebased past compaction CSN {csn_compact}, committed at CSN {csn}, "
            "no data rewritten"
        )

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
        self.say(
            "meanwhile r1 and r2 commit INSERTs into events at CSN "
            + ", ".join(str(t.csn) for t in inserted)
        )
        files = self.storage_files()
        csn = comp.commit()
        expect(self.storage_files() == files, "the compaction's commit wrote data files")
        c0.wait_for(max(t.csn for t in inserted))
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
        csn = tx.commit()
        self.multi_csn = csn
        for table in ("orders", "events"):
            mine = [r for r in c0.parts(table).to_pylist() if r["creation_tid"] == tx.id]
            expect(
                bool(mine) and all(r["creation_csn"] == csn for r in mine),
                f"{table}: the transaction's parts do not all carry CSN {csn}",
            )
        before_o = c0.read("orders", snapshot=tx.snapshot, where=day_filter(DAY[8])).num_rows
        before_e = c0.read(
            "events", snapshot=tx.snapshot, where=pc.field("source") == "checkout"
        ).num_rows
        at_o = c0.read("orders", snapshot=csn, where=day_filter(DAY[8])).num_rows
        at_e = c0.read("events", snapshot=csn, where=pc.field("source") == "checkout").num_rows
        expect(
            (before_o, before_e, at_o, at_e) == (0, 0, 10, 10),
            f"expected 0/0 rows before and 10/10 at CSN {csn}, got {before_o}/{before_e} and "
            f"{at_o}/{at_e}",
        )
        self.say(f"one transaction {tx.id} on r0 inserts 10 rows into orders and 10 into events")
        self.say(
            f"both appear at [bold]CSN {csn}[/] (one ZooKeeper multi); at snapshot {tx.snapshot} "
            "neither does"
        )
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
        self.say(
            f"the commit at CSN {csn} happened on r0; r2 reads at that CSN (waiting until it has "
            "applied it):"
        )
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
            f"orders at CSN {self.writer_csn} has {old.num_rows} rows, expected "
            f"{self.writer_orders_rows}",
        )
        expect(
            as_of.num_rows == self.writer_orders_rows,
            f"orders as of {self.writer_time} has {as_of.num_rows} rows, expected "
            f"{self.writer_orders_rows}",
        )
        expect(now.num_rows == want_now, f"orders now has {now.num_rows} rows, expected {want_now}")
        old_amount = pc.sum(old.filter(day_filter(DAY[0]))["amount"]).as_py()
        now_amount = pc.sum(now.filter(day_filter(DAY[0]))["amount"]).as_py()
        expect(
            old_amount == self.writer_d1_amount and now_amount != old_amount,
            "the old snapshot does not show the amounts from before the UPDATEs",
        )
        when = self.writer_time.astimezone().strftime("%H:%M:%S.%f")[:-3]
        self.say(
            f"orders at CSN {self.writer_csn}: {old.num_rows} rows; as of {when}: "
            f"{as_of.num_rows} rows; "
            f"now: {now.num_rows} rows"
        )
        self.say(
            f"partition {DAY[0]} amount total then {old_amount:g}, now {now_amount:g} "
            "(before/after the UPDATEs)"
        )
        return f"{old.num_rows} rows at CSN {self.writer_csn} and as of {when}, {now.num_rows} now"

    def close(self) -> None:
        for cl in self.clients:
            try:
                cl.close()
            except Exception:
                pass


def _check_workdir(workdir: Path) -> None:
    if workdir.exists() and (not workdir.is_dir() or any(workdir.iterdir())):
        raise InvalidInput(
            f"workdir {workdir} is not an empty directory; quickstart needs a fresh one"
        )


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


def run(workdir: Path | None, keep: bool, out: Console) -> int:
    """Run the quickstart; 0 when every step behaved, 1 when one did not, 130 on Ctrl-C."""
    started = time.perf_counter()
    if workdir is not None:
        workdir = Path(workdir).resolve()
        _check_workdir(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        base, temporary = workdir, False
    else:
        base, temporary = Path(tempfile.mkdtemp(prefix="mergetxn-quickstart-")), True

    restore = None
    if threading.current_thread() is threading.main_thread():

        def on_term(signum, frame):
            raise KeyboardInterrupt

        restore = signal.signal(signal.SIGTERM, on_term)

    cluster = LocalCluster(base, replicas=REPLICAS)
    work = Workload(cluster, out)
    steps: list[tuple[str, Callable[[], str]]] = [
        ("create tables", work.create_tables),
        ("concurrent writers", work.concurrent_writers),
        ("conflict", work.conflict),
        ("rebased retry (maxcompute)", work.rebase_maxcompute),
        ("rebased retry (parts)", work.rebase_parts),
        ("multi-table commit", work.multi_table),
        ("snapshot read on r2", work.snapshot_read),
        ("time travel", work.time_travel),
    ]
    results: list[StepResult] = []
    code = 0
    current, t0 = "start cluster", time.perf_counter()
    try:
        out.rule("[bold]mergetxn quickstart[/]")
        out.print(f"starting ZooKeeper and {REPLICAS} replicas in {base} ...")
        t0 = time.perf_counter()
        try:
            cluster.start()
        except Exception as exc:
            results.append(
                StepResult(
                    "start cluster",
                    "FAILED",
                    f"{type(exc).__name__}: {exc}",
                    time.perf_counter() - t0,
                )
            )
            raise StepFailed(str(exc)) from None
        detail = f"ZooKeeper {cluster.zk_address}; replicas {', '.join(cluster.replica_addresses)}"
        results.append(StepResult("start cluster", "ok", detail, time.perf_counter() - t0))
        out.print(f"    {detail}; storage {cluster.storage_url}", soft_wrap=True)
        for n, (name, fn) in enumerate(steps, 1):
            out.print(f"\n[bold cyan]{n}. {name}[/]")
            current, t0 = name, time.perf_counter()
            try:
                detail = fn()
            except (StepFailed, MergetxnError, AssertionError) as exc:
                kind = "" if isinstance(exc, StepFailed) else f"{type(exc).__name__}: "
                results.append(StepResult(name, "FAILED", f"{kind}{exc}", time.perf_counter() - t0))
                out.print(f"    [bold red]FAILED: {escape(kind + str(exc))}[/]", soft_wrap=True)
                code = 1
                break
            results.append(StepResult(name, "ok", detail, time.perf_counter() - t0))
    except StepFailed:
        code = 1
    except KeyboardInterrupt:
        out.print("\n[yellow]interrupted: stopping the cluster[/]")
        results.append(StepResult(current, "interrupted", "", time.perf_counter() - t0))
        code = 130
    except Exception as exc:  # an unexpected error is a failed quickstart, reported in one line
        results.append(
            StepResult("unexpected error", "FAILED", f"{type(exc).__name__}: {exc}", 0.0)
        )
        code = 1
    finally:
        work.close()
        t0 = time.perf_counter()
        try:
            cluster.stop()
        finally:
            if restore is not None:
                signal.signal(signal.SIGTERM, restore)
        stop_seconds = time.perf_counter() - t0
        if temporary and not keep:
            shutil.rmtree(base, ignore_errors=True)
    done = {r.name for r in results}
    for name, _ in steps:
        if name not in done:
            results.append(StepResult(name, "skipped", "", 0.0))
    results.append(StepResult("stop cluster", "ok", "ZooKeeper and replicas stopped", stop_seconds))
    total = time.perf_counter() - started
    out.print()
    out.print(_summary(results))
    where = f"; files kept in {base}" if (keep or not temporary) else ""
    if code == 0:
        out.print(
            f"[bold green]all {len(steps)} steps behaved as expected[/] in {total:.1f}s{where}"
        )
    elif code == 130:
        out.print(f"[yellow]quickstart interrupted after {total:.1f}s[/]{where}")
    else:
        out.print(f"[bold red]quickstart FAILED[/] after {total:.1f}s{where}")
    return code
