#!/usr/bin/env python
"""Snapshot lookup as a table grows, checkpoint cost, and replica restart time against WAL length.

Lookup (no ZooKeeper): a ``ReplicaState`` is fed synthetic log entries through ``apply`` (the
code path every replica runs for every entry), one commit per entry, one part per commit, on one
table with 100 partitions, until the table holds 100,000 parts and the history 100,000 commits.
This drives the replica's state directly rather than committing through ZooKeeper: acceptable
for a lookup benchmark (the lookup never touches ZooKeeper), and it reaches 100,000 commits in
seconds. At 1,000, 10,000 and 100,000 commits it times ``ReplicaState.visible``:

* ``latest``: the latest snapshot, whole table (what a plain read asks for);
* ``latest_1p``: the latest snapshot, one partition;
* ``latest_txn``: the latest snapshot as a transaction sees it (own added and removed parts);
* ``old``: a snapshot half-way through the history, whole table (time travel, or a transaction
  whose snapshot fell behind), plain and as a transaction (``old_txn``), and one partition.

Two histories: ``append`` (every part stays visible: the worst case for the latest snapshot) and
``merges`` (every tenth commit is a minor merge replacing up to 9 live parts of a partition by one).
``baseline_*`` is the lookup as it was before this benchmark's changes (kept below verbatim),
timed on the same state for comparison.

Checkpoint: export + encode, decode + restore of the 100,000-part state (replicas/checkpoint.py).

Restart (real ZooKeeper, embedded from the pyspark jars; an in-process ``Replica``): the log of
a fresh cluster gets a table and L insert entries (written to ZooKeeper and, in the follower's own
record format, to the replica's WAL), then ``Replica.start()`` is timed: (a) replaying the whole
WAL, (b) from the local snapshot (``state.ckpt``) with an empty WAL tail, (c) from the local
snapshot plus a WAL tail of ``local_checkpoint_every`` (5,000, the default: the longest tail a
replica keeps). Target: < 3 s at any length.

    .venv/bin/python benchmarks/snapshot_lookup.py [--sizes 1000,10000,100000] \
        [--restart 1000,10000,100000] [--out benchmarks/results/snapshot_lookup.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402

from coordinator.core.tabledata import partition_key  # noqa: E402
from coordinator.core.visibility import is_visible  # noqa: E402
from coordinator.model.catalog import TableDef  # noqa: E402
from coordinator.model.records import LogEntry, WalEntry  # noqa: E402
from parts.model.meta import PartMeta  # noqa: E402
from replicas import checkpoint  # noqa: E402
from replicas.state import ReplicaState  # noqa: E402

TABLE = "t"
PARTITIONS = 100
SCHEMA = pa.schema([("p", pa.int64()), ("x", pa.int64())])


# -- synthetic log -----------------------------------------------------------------------------
def ddl_entry() -> dict:
    tdef = TableDef.new(TABLE, SCHEMA, partition_by=("p",), conflict_policy="parts", auto_merge=False)
    return {"v": 1, "time": 1.7e9, "ddl": [{"create_table": tdef.to_dict()}], "txns": [], "versions": {TABLE: 0}}


def part(i: int, tid: str, p: int) -> dict:
    name = f"{tid}_{i:016x}"
    return {
        "name": name,
        "table": TABLE,
        "partition": [p],
        "path": f"{TABLE}/p={p}/{name}.parquet",
        "rows": 10,
        "size": 4096,
        "checksum": "crc32:0000abcd",
        "stats": {"p": [p, p], "x": [i, i + 9]},
        "creation_tid": tid,
        "created_at": 1.7e9 + i,
    }


class History:
    """Entries 1..n of a synthetic history; ``merges`` makes every tenth commit a minor merge."""

    def __init__(self, merges: bool) -> None:
        self.merges = merges
        self.live: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
        self.i = 0

    def next(self) -> dict:
        self.i += 1
        i = self.i
        csn = i + 1  # CSN 1 is the DDL entry
        tid = f"T{csn - 1}-{i}-r0"
        merge = self.merges and i % 10 == 0
        p = (i // 10) % PARTITIONS if merge else i % PARTITIONS
        meta = part(i, tid, p)
        removed: list[str] = []
        kinds = ["INSERT"]
        if merge and len(self.live[p]) >= 2:
            removed, self.live[p] = self.live[p][-9:], self.live[p][:-9]
            kinds = ["MINOR_COMPACT"]
        self.live[p].append(meta["name"])
        return {
            "v": 1,
            "time": 1.7e9 + i,
            "versions": {f"{TABLE}/%5B{p}%5D": i},
            "txns": [
                {
                    "tid": tid,
                    "time_version": None if removed else 1.7e9 + i,
                    "changes": [
                        {
                            "table": TABLE,
                            "pkey": partition_key((p,)),
                            "kinds": kinds,
                            "added": [meta],
                            "removed": removed,
                        }
                    ],
                }
            ],
        }


def apply_all(state: ReplicaState, entries: Iterable[tuple[int, dict]]) -> None:
    for csn, entry in entries:
        state.apply(csn, 0, csn - 1, LogEntry.from_dict(entry, f"CSN {csn}"))


# -- the lookup as it was before (for comparison), verbatim on the same state --------------------
def baseline_visible(
    st: ReplicaState,
    table: str,
    snapshot: int,
    reader_tid: str | None = None,
    own_added: Iterable[PartMeta] = (),
    own_removed: frozenset[str] | set[str] = frozenset(),
    pkeys: Iterable[str] | None = None,
) -> list[PartMeta]:
    wanted = None if pkeys is None else set(pkeys)
    with st.lock:
        if snapshot >= st.applied:
            live = st.live.get(table, {})
            keys = live.keys() if wanted is None else (wanted & live.keys())
            names = [n for k in keys for n in live[k] if n not in own_removed]
            out = [st.parts[n].meta for n in names]
        else:
            out = []
            for n in st.by_table.get(table, ()):
                rec = st.parts[n]
                if wanted is not None and rec.pkey not in wanted:
                    continue
                removal_tid = reader_tid if n in own_removed else rec.removal_tid
                removal_csn = rec.removal_csn if removal_tid == rec.removal_tid else None
                if is_visible(snapshot, reader_tid, rec.meta.creation_tid, rec.creation_csn, removal_tid, removal_csn):
                    out.append(rec.meta)
    for meta in own_added:
        if meta.table == table and meta.name not in own_removed:
            if wanted is None or partition_key(meta.partition) in wanted:
                out.append(meta)
    out.sort(key=lambda m: m.name)
    return out


def timed(fn: Callable[[], object], budget: float = 1.5, max_reps: int = 300) -> dict:
    """p50 / p99 / mean in milliseconds over as many calls as fit in ``budget`` seconds."""
    fn()  # warm
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < max_reps and (len(samples) < 5 or time.perf_counter() - start < budget):
        t = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t) / 1e6)
    samples.sort()
    return {
        "p50_ms": round(statistics.median(samples), 3),
        "p99_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))], 3),
        "mean_ms": round(statistics.fmean(samples), 3),
        "reps": len(samples),
    }


def lookup_cases(st: ReplicaState) -> dict[str, Callable[[], list]]:
    latest = st.applied
    old = latest // 2
    one = [partition_key((7,))]
    reader = f"T{latest}-999999-r0"
    live_names = st.live_sorted[TABLE].keys()
    own_removed = {live_names[len(live_names) // 2]}
    own_added = [PartMeta.from_dict(part(10**9, reader, 3))]
    old_visible = [m.name for m in st.visible(TABLE, old)]
    old_removed = {old_visible[len(old_visible) // 2]}
    return {
        "latest": lambda: st.visible(TABLE, latest),
        "latest_1p": lambda: st.visible(TABLE, latest, pkeys=one),
        "latest_txn": lambda: st.visible(TABLE, latest, reader, own_added, own_removed),
        "old": lambda: st.visible(TABLE, old),
        "old_txn": lambda: st.visible(TABLE, old, reader, own_added, old_removed),
        "old_1p": lambda: st.visible(TABLE, old, pkeys=one),
        "baseline_latest": lambda: baseline_visible(st, TABLE, latest),
        "baseline_latest_txn": lambda: baseline_visible(st, TABLE, latest, reader, own_added, own_removed),
        "baseline_old": lambda: baseline_visible(st, TABLE, old),
        "baseline_old_txn": lambda: baseline_visible(st, TABLE, old, reader, own_added, old_removed),
    }


def bench_lookup(sizes: list[int], merges: bool) -> list[dict]:
    st = ReplicaState()
    st.apply(1, 0, 0, LogEntry.from_dict(ddl_entry(), "ddl"))
    hist = History(merges)
    out = []
    for n in sizes:
        t0 = time.perf_counter()
        apply_all(st, ((hist.i + 2, hist.next()) for _ in range(n - hist.i)))
        build = time.perf_counter() - t0
        cases = lookup_cases(st)
        for name, fn in cases.items():  # the new lookup answers exactly what the old one did
            if "baseline_" + name in cases:
                assert [m.name for m in fn()] == [m.name for m in cases["baseline_" + name]()], name
        row = {
            "history": "merges" if merges else "append",
            "commits": n,
            "parts": len(st.by_table[TABLE]),
            "live": len(st.live_sorted[TABLE]),
            "visible_old": len(cases["old"]()),
            "apply_s": round(build, 2),
        }
        for name, fn in cases.items():
            row[name] = timed(fn)
        out.append(row)
        print(
            f"  {row['history']:7} {n:>7} commits, {row['parts']:>7} parts ({row['live']} live): "
            f"latest p50 {row['latest']['p50_ms']} ms (was {row['baseline_latest']['p50_ms']}), "
            f"old p50 {row['old']['p50_ms']} ms (was {row['baseline_old']['p50_ms']})",
            flush=True,
        )
    return out


def bench_checkpoint(n: int) -> dict:
    st = ReplicaState()
    st.apply(1, 0, 0, LogEntry.from_dict(ddl_entry(), "ddl"))
    hist = History(False)
    apply_all(st, ((hist.i + 2, hist.next()) for _ in range(n)))
    t0 = time.perf_counter()
    payload = st.export()
    t1 = time.perf_counter()
    data = checkpoint.encode(payload)
    t2 = time.perf_counter()
    back = checkpoint.decode(data, "bench")
    t3 = time.perf_counter()
    fresh = ReplicaState()
    fresh.restore(back, "bench")
    t4 = time.perf_counter()
    assert [m.name for m in fresh.visible(TABLE, fresh.applied)] == [m.name for m in st.visible(TABLE, st.applied)]
    row = {
        "parts": n,
        "export_s": round(t1 - t0, 3),
        "encode_s": round(t2 - t1, 3),
        "decode_s": round(t3 - t2, 3),
        "restore_s": round(t4 - t3, 3),
        "bytes": len(data),
    }
    print(f"  checkpoint of {n} parts: {row}", flush=True)
    return row


# -- restart -----------------------------------------------------------------------------------
def write_log(zk, csn_log, wal, entries: list[tuple[int, dict]]) -> None:
    """The same entries into ZooKeeper (sequential creates, pipelined) and the WAL (the follower's
    record format: what a replica that applied them would have written)."""
    from coordinator.core.versions import split_csn

    pending = []
    for csn, entry in entries:
        epoch, seq = split_csn(csn)
        pending.append(
            (
                seq,
                zk.create_async(
                    f"{csn_log.epoch_path(epoch)}/c-", LogEntry.from_dict(entry, "bench").encode(), sequence=True
                ),
            )
        )
    for seq, a in pending:
        assert a.get().endswith(f"c-{seq:010d}"), "log sequence numbers out of step"
    for i in range(0, len(entries), 2000):
        chunk = entries[i : i + 2000]
        wal.append([WalEntry(c, 0, c - 1, raw=e) for c, e in chunk], sync=False)
    wal.append([], sync=True)


def bench_restart(lengths: list[int], workdir: Path, tail: int = 5000) -> list[dict]:
    from kazoo.client import KazooClient

    from coordinator.zk.log import CsnLog
    from mergetxn.local.zkserver import ZooKeeperServer
    from replicas.replica import Replica, ReplicaConfig
    from replicas.wal import Wal

    server = ZooKeeperServer(workdir / "zookeeper")
    server.start()
    rows = []
    try:
        for n in lengths:
            chroot = f"/bench{uuid.uuid4().hex[:8]}"
            boot = KazooClient(hosts=server.address)
            boot.start(timeout=30)
            boot.ensure_path(chroot)
            boot.stop()
            boot.close()
            zk = KazooClient(hosts=server.address + chroot)
            zk.start(timeout=30)
            csn_log = CsnLog(zk)
            csn_log.ensure_layout()
            data_dir = workdir / f"replica-{n}"
            storage = workdir / f"storage-{n}"
            wal = Wal(data_dir / "wal.log")
            hist = History(False)
            entries = [(1, ddl_entry())] + [(i + 2, hist.next()) for i in range(n)]
            write_log(zk, csn_log, wal, entries)
            wal.close()
            config = ReplicaConfig(
                zk=server.address + chroot,
                storage_url=str(storage),
                host_id="r0",
                data_dir=data_dir,
                checkpoint_every=10**9,
                local_checkpoint_every=10**9,
                tail_check_seconds=3600.0,
            )

            def start() -> tuple[float, Replica]:
                gc.collect()
                t0 = time.perf_counter()
                r = Replica(config)
                r.start()
                return time.perf_counter() - t0, r

            wal_bytes = (data_dir / "wal.log").stat().st_size
            full, r = start()
            assert r.state.applied == n + 1, (r.state.applied, n + 1)
            r.tail.save_local()  # state.ckpt at the last entry; the WAL becomes its base record
            r.stop()
            ckpt_bytes = (data_dir / checkpoint.LOCAL_NAME).stat().st_size
            snap, r = start()
            assert r.state.applied == n + 1
            r.stop()
            wal = Wal(data_dir / "wal.log")
            more = [(n + 2 + i, hist.next()) for i in range(tail)]
            write_log(zk, csn_log, wal, more)
            wal.close()
            snap_tail, r = start()
            assert r.state.applied == n + 1 + tail
            r.stop()
            row = {
                "wal_entries": n,
                "wal_mb": round(wal_bytes / 1e6, 1),
                "restart_full_wal_s": round(full, 2),
                "state_ckpt_mb": round(ckpt_bytes / 1e6, 1),
                "restart_from_snapshot_s": round(snap, 2),
                f"restart_from_snapshot_plus_{tail}_tail_s": round(snap_tail, 2),
            }
            rows.append(row)
            print(f"  restart at {n} WAL entries: {row}", flush=True)
            zk.stop()
            zk.close()
            shutil.rmtree(data_dir, ignore_errors=True)
    finally:
        server.stop()
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--restart", default="1000,10000,100000", help="WAL lengths ('' to skip)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "snapshot_lookup.json"))
    a = ap.parse_args(argv)
    sizes = [int(s) for s in a.sizes.split(",") if s]
    result: dict = {
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": __import__("os").cpu_count(),
        },
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    print("lookup:", flush=True)
    result["lookup"] = bench_lookup(sizes, merges=False) + bench_lookup(sizes, merges=True)
    print("checkpoint:", flush=True)
    result["checkpoint"] = bench_checkpoint(max(sizes))
    if a.restart:
        print("restart:", flush=True)
        with tempfile.TemporaryDirectory() as d:
            result["restart"] = bench_restart([int(s) for s in a.restart.split(",") if s], Path(d))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2))
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()
