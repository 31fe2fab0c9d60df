#!/usr/bin/env python
"""The latest figures of every benchmark, as a table and as plots, from the kept result files.

Reads one result file per benchmark in ``benchmarks/results/`` (each the latest run of its
benchmark), then

* writes the table of figures (each a ratio to the peer its benchmark names, with the run's date,
  commit and machine) between the ``<!-- figures -->`` and ``<!-- /figures -->`` markers of
  ``benchmarks/README.md`` and ``docs/benchmarks.md``;
* draws the plots (matplotlib) into ``benchmarks/plots/*.png`` and ``docs/img/benchmarks/*.png``
  (the guide serves ``docs/``).

    .venv/bin/python benchmarks/plots.py            # table and plots
    .venv/bin/python benchmarks/plots.py --table    # print the table only

After a new run of a benchmark, save its JSON over the kept file and update its entry in ``RUNS``
(date, commit, machine), then run this script.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PLOT_DIRS = (ROOT / "benchmarks" / "plots", ROOT / "docs" / "img" / "benchmarks")
TABLE_FILES = (ROOT / "benchmarks" / "README.md", ROOT / "docs" / "benchmarks.md")
MARK_START, MARK_END = "<!-- figures -->", "<!-- /figures -->"

AMD = "2 vCPU AMD EPYC VM"
XEON = "2 vCPU Intel Xeon VM"

Result = dict[str, Any]


@dataclass(frozen=True)
class Run:
    """Where a kept result file came from."""

    script: str  # the command that wrote it (the benchmark and its mode first)
    date: str  # UTC
    commit: str  # the code measured (main at the time of the run)
    machine: str


RUNS: dict[str, Run] = {
    "commit_throughput.json": Run(
        "commit_throughput.py --seconds 4 --warmup 1 --only raw,mergetxn,mergetxn3,ducklake",
        "2026-12-02 14:25",
        "01a1787",
        AMD,
    ),
    "commit_cpu.json": Run("commit_cpu.py --commits 5000", "2026-12-02 14:17", "01a1787", AMD),
    "keys_bench.json": Run("keys_bench.py", "2026-11-24 09:44", "88aeebe", AMD),
    "keys_bench_lookup.json": Run(
        "keys_bench.py --only lookup --lookups 2000, alternated with MERGETXN_CODE at bf1a6b7 (new, old, new, old)",
        "2026-12-04 22:04",
        "592b859",
        AMD,
    ),
    "keys_bench_upsert.json": Run(
        "keys_bench.py --only upsert (and MERGETXN_CODE at bf1a6b7: before; at 9c75f06: the code before this one)",
        "2026-12-04 19:20",
        "93c994b",
        AMD,
    ),
    "keys_bench_read.json": Run(
        "keys_bench.py --only read (and MERGETXN_CODE at ddd0b6a: before)", "2026-12-04 04:37", "385de00", AMD
    ),
    "history_cost.json": Run("history_cost.py", "2026-11-27 20:37", "5581586", AMD),
    "quorum_cost.json": Run("quorum_cost.py --seconds 15", "2026-11-27 21:43", "b4887bb", AMD),
    "security_cost.json": Run("security_cost.py", "2026-11-27 00:47", "45de8f1", AMD),
    "security_cost_commit.json": Run(
        "security_cost.py --only commit --paired-commits 20000 (checked and unchecked inserts alternating)",
        "2026-12-02 14:31",
        "01a1787",
        AMD,
    ),
    "security_brute.json": Run("security_cost.py --only brute --brute-rate 100", "2026-12-02 14:36", "01a1787", AMD),
    "spark_io.json": Run("spark_io.py --repeat 3", "2026-11-24", "1caaebf", AMD),
    "spark_io_keys.json": Run(
        "spark_io.py --only-keys --keys-no-data-source --keys-floor --repeat 6", "2026-12-04 12:43", "c5434b6", AMD
    ),
    "spark_streaming.json": Run("spark_streaming.py --files 5 --repeat 3", "2026-11-24 10:12", "1b34429", AMD),
    "async_commits.json": Run("async_commits.py", "2026-11-24 09:35", "42bf859", AMD),
    "keys_scan.json": Run("keys_scan.py --keys 10000000", "2026-11-27", "a93dfe0", AMD),
    "dataset_read.json": Run("dataset_read.py --rounds 7", "2026-11-27 00:42", "998c4a1", AMD),
    "snapshot_lookup.json": Run("snapshot_lookup.py", "2026-11-21 07:50", "6495fac", AMD),
    "policy_throughput.json": Run("policy_throughput.py", "2026-11-21 12:51", "c539386", AMD),
    "zk_request_cost.json": Run("zk_request_cost.py", "2026-11-27 10:30", "173427f", AMD),
    "latency_timeline.json": Run("latency_timeline.py --case commit_parts", "2026-11-27 18:14", "416eb52", AMD),
}


@dataclass(frozen=True)
class Row:
    """One line of the table: a figure of ours against the peer its benchmark names."""

    file: str
    what: str
    figure: Callable[[Result], str]
    peer: str
    ratio: Callable[[Result], float]
    better: str  # "higher" or "lower": which way the ratio is good


def load(name: str) -> Result:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def rate(r: Result, case: str) -> float:
    return float(r["results"][case]["commits_per_s"])


def best(r: Result, prefix: str, suffix: str) -> float:
    return max(v["commits_per_s"] for k, v in r["results"].items() if k.startswith(prefix) and k.endswith(suffix))


def ct_row(what: str, ours: str, peer: str, theirs: Callable[[Result], float]) -> Row:
    return Row(
        "commit_throughput.json",
        what,
        lambda r: f"{rate(r, ours):,.1f} commits/s",
        peer,
        lambda r: rate(r, ours) / theirs(r),
        "higher",
    )


def median_multi(r: list[Result]) -> float:
    return statistics.median(e["zk_cpu_ms_per_request"] for e in r if e["kind"] == "multi")


def zk_kind(r: list[Result], kind: str) -> float:
    return float(next(e["zk_cpu_ms_per_request"] for e in r if e["kind"] == kind))


def zk_step(r: Result) -> float:
    return float(next(s["step_ms"] for s in r["path"] if s["stage"].startswith("zk.recv.multi")))


def lookup_at(r: Result, commits: int, key: str) -> float:
    entry = next(e for e in r["lookup"] if e["history"] == "append" and e["commits"] == commits)
    return float(entry[key]["p50_ms"])


def brute_side(round_: Result) -> Result:
    """A brute-force round's side of this tree: the last ``--code`` measured (``new`` in older files)."""
    return round_["new"] if "new" in round_ else list(round_.values())[-1]


def brute_worst(r: Result) -> float:
    return max(brute_side(round_)["p50_attack_over_quiet"] for round_ in r["rounds"])


ROWS: list[Row] = [
    ct_row(
        "`client.insert` of 10 rows, 1 writer",
        "mergetxn_insert_call_1w",
        "DuckLake, PostgreSQL catalog (its best variant), 1 writer",
        lambda r: best(r, "ducklake_pg", "_1w"),
    ),
    ct_row(
        "`client.insert` of 10 rows, 4 writers",
        "mergetxn_insert_call_4w",
        "DuckLake, PostgreSQL catalog (best variant), 4 writers",
        lambda r: best(r, "ducklake_pg", "_4w"),
    ),
    ct_row(
        "`client.insert` of 10 rows, 16 writers",
        "mergetxn_insert_call_16w",
        "DuckLake, PostgreSQL catalog (best variant), 4 writers",
        lambda r: best(r, "ducklake_pg", "_4w"),
    ),
    ct_row(
        "`tx.insert` of 10 rows, 4 writers",
        "mergetxn_insert_4w",
        "DuckLake, PostgreSQL catalog (best variant), 4 writers",
        lambda r: best(r, "ducklake_pg", "_4w"),
    ),
    ct_row(
        "`tx.insert` of 10 rows, 4 writers",
        "mergetxn_insert_4w",
        "DuckLake, SQLite catalog (best variant), 4 writers",
        lambda r: best(r, "ducklake_sqlite", "_4w"),
    ),
    ct_row(
        "`commit_parts` (metadata only), 16 clients",
        "mergetxn_commit_parts_16c",
        "raw ZooKeeper sequential creates, 1 thread",
        lambda r: rate(r, "raw_zk_1_thread"),
    ),
    ct_row(
        "`commit_parts` (metadata only), 16 clients",
        "mergetxn_commit_parts_16c",
        "raw ZooKeeper creates, 16 threads pipelined",
        lambda r: rate(r, "raw_zk_16_threads_shared_client"),
    ),
    ct_row(
        "3 replicas, 10-row inserts, 4 writers spread",
        "mergetxn_3r_insert_4w_spread",
        "1 replica, the same",
        lambda r: rate(r, "mergetxn_insert_4w"),
    ),
    ct_row(
        "3 replicas, metadata-only, 16 clients spread",
        "mergetxn_3r_metadata_16c_spread",
        "1 replica, the same",
        lambda r: rate(r, "mergetxn_metadata_16c"),
    ),
    Row(
        "commit_cpu.json",
        "CPU per sequential 10-row `client.insert`, all processes (inlined)",
        lambda r: f"{r['cases']['inlined']['cpu_ms_per_commit']['all']} ms",
        "the same inserts as part files",
        lambda r: (
            r["cases"]["inlined"]["cpu_ms_per_commit"]["all"] / r["cases"]["part_file"]["cpu_ms_per_commit"]["all"]
        ),
        "lower",
    ),
    Row(
        "keys_bench.json",
        "keys table upserts of 10 keys, 4 writers (1M keys)",
        lambda r: f"{r['results']['keys_upsert']['commits_per_s']} commits/s",
        "delta-rs MERGE of the same rows, 4 writers",
        lambda r: r["results"]["keys_upsert"]["commits_per_s"] / r["results"]["deltalake_merge"]["commits_per_s"],
        "higher",
    ),
    Row(
        "keys_bench.json",
        "keys table upserts of 10 keys, 4 writers",
        lambda r: f"{r['results']['keys_upsert']['commits_per_s']} commits/s",
        "`parts` table appends of the same rows",
        lambda r: r["results"]["keys_upsert"]["commits_per_s"] / r["results"]["parts_append"]["commits_per_s"],
        "higher",
    ),
    Row(
        "keys_bench_lookup.json",
        "point lookup, 1M keys over 1,000 parts",
        lambda r: f"p50 {r['results']['lookup']['p50_ms']} ms, {r['results']['lookup']['parts_read_mean']} parts read",
        "the same at `bf1a6b7`, alternated (two pairs: 0.71/0.71, 0.72/0.69 ms)",
        lambda r: r["results"]["lookup"]["p50_ms"] / r["before"]["lookup"]["p50_ms"],
        "lower",
    ),
    Row(
        "keys_bench_upsert.json",
        "keys table upserts in update mode (whole rows: `s` read at write time), 10 keys, 4 writers",
        lambda r: f"{r['results']['keys_update']['commits_per_s']} commits/s",
        "the same at `bf1a6b7` (partial rows), same hour",
        lambda r: r["results"]["keys_update"]["commits_per_s"] / r["before"]["keys_update"]["commits_per_s"],
        "higher",
    ),
    Row(
        "keys_bench_upsert.json",
        "keys table upserts (overwrite mode), 10 keys, 4 writers",
        lambda r: f"{r['results']['keys_upsert']['commits_per_s']} commits/s",
        "the same at `bf1a6b7`, same hour",
        lambda r: r["results"]["keys_upsert"]["commits_per_s"] / r["before"]["keys_upsert"]["commits_per_s"],
        "higher",
    ),
    Row(
        "keys_bench_read.json",
        "whole read of a keys table by deletion vectors, 1M keys in 1.2M versions, 120 parts, auto merge off "
        "(median of 21)",
        lambda r: (
            f"{r['results']['whole_read']['keys_read_median_s']} s (filtered to 1 % of the rows: "
            f"{r['results']['whole_read']['filtered_read']['keys_over_parts']}× the `parts` table's)"
        ),
        "whole read of a `parts` table of the same rows",
        lambda r: r["results"]["whole_read"]["keys_over_parts"],
        "lower",
    ),
    Row(
        "keys_bench_read.json",
        "DuckDB `count(*), sum, max` over `duckdb_view(client.dataset(t))` of that keys table (live rows in memory)",
        lambda r: f"{r['results']['whole_read']['duckdb']['keys_median_s']} s",
        "the same over the `parts` table (DuckDB's own Parquet reader)",
        lambda r: r["results"]["whole_read"]["duckdb"]["keys_over_parts"],
        "lower",
    ),
    Row(
        "keys_bench_read.json",
        "DuckDB as above over the keys table after a major compaction (its part file read by DuckDB; median of 21)",
        lambda r: f"{r['results']['whole_read']['after_compaction']['duckdb']['keys_median_s']} s",
        "the same over the `parts` table, alternated",
        lambda r: r["results"]["whole_read"]["after_compaction"]["duckdb"]["keys_over_parts"],
        "lower",
    ),
    Row(
        "keys_bench_read.json",
        "whole read of the keys table after a major compaction (best of 3)",
        lambda r: f"{r['results']['whole_read']['keys_read_after_compaction_s']} s",
        "whole read of the `parts` table (best of 21)",
        lambda r: (
            r["results"]["whole_read"]["keys_read_after_compaction_s"] / r["results"]["whole_read"]["parts_read_s"]
        ),
        "lower",
    ),
    Row(
        "history_cost.json",
        "10-row insert p50 after 100,000 commits",
        lambda r: f"{r['late']['p50_ms']} ms",
        "the same after 1,100 commits",
        lambda r: r["ratio_p50"],
        "lower",
    ),
    Row(
        "history_cost.json",
        "10-row insert p99 after 100,000 commits",
        lambda r: f"{r['late']['p99_ms']} ms",
        "the same after 1,100 commits",
        lambda r: r["ratio_p99"],
        "lower",
    ),
    Row(
        "quorum_cost.json",
        "inserts on 3 hosts, ZooKeeper ensemble of 3, 1 writer",
        lambda r: f"{r['hosts']['insert_1_writer']['commits_per_s']} commits/s",
        "3 replicas on loopback, 1 ZooKeeper",
        lambda r: r["hosts"]["insert_1_writer"]["commits_per_s"] / r["loopback"]["insert_1_writer"]["commits_per_s"],
        "higher",
    ),
    Row(
        "quorum_cost.json",
        "the same, 6 writers",
        lambda r: f"{r['hosts']['insert_6_writers']['commits_per_s']} commits/s",
        "3 replicas on loopback, 1 ZooKeeper",
        lambda r: r["hosts"]["insert_6_writers"]["commits_per_s"] / r["loopback"]["insert_6_writers"]["commits_per_s"],
        "higher",
    ),
    Row(
        "security_cost.json",
        "secured cluster (TLS, users, ZooKeeper TLS): 4-writer inserts",
        lambda r: f"{best_round(r, 'insert_4_writers', 'secure')} commits/s (best round)",
        "unsecured cluster",
        lambda r: r["ratios"]["insert_4_writers"]["throughput_secure_over_plain"],
        "higher",
    ),
    Row(
        "security_cost.json",
        "secured cluster: `commit_parts`, 16 clients",
        lambda r: f"{best_round(r, 'commit_parts_16_clients', 'secure')} commits/s (best round)",
        "unsecured cluster",
        lambda r: r["ratios"]["commit_parts_16_clients"]["throughput_secure_over_plain"],
        "higher",
    ),
    Row(
        "security_cost.json",
        "secured cluster: CPU per RPC call",
        lambda r: f"{r['rpc_cpu_us_per_call']['secure']} µs",
        "unsecured cluster",
        lambda r: r["ratios"]["rpc_cpu_per_call_secure_over_plain"],
        "lower",
    ),
    Row(
        "security_cost_commit.json",
        "10-row insert p50 (inlined), its part checked at stage (paired: every other insert)",
        lambda r: f"{r['paired'][0]['checked']['p50_ms']} ms",
        "the same inserts unchecked",
        lambda r: r["paired"][0]["p50_checked_over_unchecked"],
        "lower",
    ),
    Row(
        "security_cost_commit.json",
        "10-row insert p50 (a part file), the same",
        lambda r: f"{r['paired'][1]['checked']['p50_ms']} ms",
        "the same inserts unchecked",
        lambda r: r["paired"][1]["p50_checked_over_unchecked"],
        "lower",
    ),
    Row(
        "security_brute.json",
        "a client's call p50 under 100 wrong logins/s from 100 addresses (worst round)",
        lambda r: f"{max(brute_side(x)['attack']['p50_ms'] for x in r['rounds'])} ms",
        "the same client, no attack",
        brute_worst,
        "lower",
    ),
    Row(
        "spark_io.json",
        "`spark.write_table`, 5M rows (wall)",
        lambda r: f"CPU ratio {r['sizes']['5000000']['native_write_cpu_ratio']}",
        "`df.write.parquet`",
        lambda r: r["sizes"]["5000000"]["native_write_ratio"],
        "lower",
    ),
    Row(
        "spark_io.json",
        "`spark.read_table`, 5M rows (wall)",
        lambda r: f"CPU ratio {r['sizes']['5000000']['native_read_cpu_ratio']}",
        "`spark.read.parquet`",
        lambda r: r["sizes"]["5000000"]["native_read_ratio"],
        "lower",
    ),
    Row(
        "spark_io.json",
        "the `mergetxn` data source, write of 5M rows (wall)",
        lambda r: f"CPU ratio {r['sizes']['5000000']['write_cpu_ratio']}",
        "`df.write.parquet`",
        lambda r: r["sizes"]["5000000"]["write_ratio"],
        "lower",
    ),
    Row(
        "spark_io_keys.json",
        "`spark.read_table` of a keys table, 1M keys (CPU)",
        lambda r: f"{r['keys']['cpu']['read_table']} CPU s",
        "`spark.read.parquet` of the folded rows",
        lambda r: r["keys"]["read_table_cpu_ratio"],
        "lower",
    ),
    Row(
        "spark_streaming.json",
        "`spark.write_stream`, 5 files of 1M rows (wall)",
        lambda r: f"CPU ratio {r['summary']['ratio_cpu_native_over_parquet']:.2f}",
        '`writeStream.format("parquet")`',
        lambda r: r["summary"]["ratio_time_native_over_parquet"],
        "lower",
    ),
    Row(
        "spark_streaming.json",
        '`writeStream.format("mergetxn")` (wall)',
        lambda r: f"CPU ratio {r['summary']['ratio_cpu_mergetxn_over_parquet']:.2f}",
        '`writeStream.format("parquet")`',
        lambda r: r["summary"]["ratio_time_mergetxn_over_parquet"],
        "lower",
    ),
    Row(
        "async_commits.json",
        '`tx.commit()` median, `durability="async"`',
        lambda r: f"{r['async']['commit_median_ms']} ms",
        '`durability="sync"`',
        lambda r: r["async"]["commit_median_ms"] / r["sync"]["commit_median_ms"],
        "lower",
    ),
    Row(
        "keys_scan.json",
        "peak RSS of `scan` over 10M keys, default budget",
        lambda r: f"{r['bounded']['peak_rss_mb']:.0f} MB",
        "one fold per partition",
        lambda r: r["bounded"]["peak_rss_mb"] / r["unbounded"]["peak_rss_mb"],
        "lower",
    ),
    Row(
        "dataset_read.json",
        "DuckDB over `duckdb_view(client.dataset(t))`, 10M rows (wall)",
        lambda r: f"CPU ratio {r['all']['ratio_view_cpu']:.2f}",
        "DuckDB `read_parquet` of the same files",
        lambda r: r["all"]["ratio_view"],
        "lower",
    ),
    Row(
        "dataset_read.json",
        "DuckDB over `con.register(client.dataset(t))` (wall)",
        lambda r: f"CPU ratio {r['all']['ratio_cpu']:.2f}",
        "DuckDB `read_parquet` of the same files",
        lambda r: r["all"]["ratio"],
        "lower",
    ),
    Row(
        "snapshot_lookup.json",
        "replica restart, 100,000 WAL entries, from its local snapshot",
        lambda r: f"{r['restart'][-1]['restart_from_snapshot_s']} s",
        "replaying the whole WAL",
        lambda r: r["restart"][-1]["restart_from_snapshot_s"] / r["restart"][-1]["restart_full_wal_s"],
        "lower",
    ),
    Row(
        "snapshot_lookup.json",
        "visible parts at the latest snapshot, 100,000 parts",
        lambda r: f"{lookup_at(r, 100000, 'latest')} ms",
        "the earlier lookup (kept in the script)",
        lambda r: lookup_at(r, 100000, "latest") / lookup_at(r, 100000, "baseline_latest"),
        "lower",
    ),
    Row(
        "policy_throughput.json",
        "`append` policy, metadata-only commits, 16 clients",
        lambda r: f"{rate(r, 'append_metadata_16w')} commits/s",
        "`parts` policy (no checked target)",
        lambda r: rate(r, "append_metadata_16w") / rate(r, "parts_metadata_16w"),
        "higher",
    ),
    Row(
        "policy_throughput.json",
        "`append` policy, 10-row inserts, 4 writers",
        lambda r: f"{rate(r, 'append_insert_4w')} commits/s",
        "`parts` policy",
        lambda r: rate(r, "append_insert_4w") / rate(r, "parts_insert_4w"),
        "higher",
    ),
    Row(
        "zk_request_cost.json",
        "ZooKeeper CPU per commit multi at 110/s (median of passes)",
        lambda r: f"{median_multi(r):.2f} ms",
        "one sequential create",
        lambda r: median_multi(r) / zk_kind(r, "create"),
        "lower",
    ),
    Row(
        "latency_timeline.json",
        "one sequential `commit_parts`, 1 writer, p50",
        lambda r: f"{r['total_p50_ms']} ms",
        "ZooKeeper's multi inside it",
        lambda r: r["total_p50_ms"] / zk_step(r),
        "lower",
    ),
]


def best_round(r: Result, case: str, side: str) -> float:
    return max(x[case][side]["commits_per_s"] for x in r["rounds"])


def times(value: float) -> str:
    """A ratio as the table prints it: three significant figures at most."""
    return f"{value:.3g}×"


def name(run: Run) -> str:
    """The benchmark and its mode: the command up to its first option other than ``--only``."""
    words = run.script.split()
    keep = words[:3] if len(words) > 2 and words[1] == "--only" else words[:1]
    return "`" + " ".join(keep) + "`"


def table() -> str:
    """The table of the latest figures, in Markdown."""
    cache: dict[str, Result] = {}
    lines = [
        "| benchmark | measure | figure | peer | ours / peer | better | run (UTC) | commit | machine |",
        "|---|---|---|---|---:|---|---|---|---|",
    ]
    for row in ROWS:
        result = cache.setdefault(row.file, load(row.file))
        run = RUNS[row.file]
        bench = name(run)
        lines.append(
            f"| {bench} | {row.what} | {row.figure(result)} | {row.peer} | {times(row.ratio(result))} | {row.better} "
            f"| {run.date} | `{run.commit}` | {run.machine} |"
        )
    lines.append(soak_row(load("soak.json")))
    return "\n".join(lines)


def soak_row(r: Result) -> str:
    """The soak's row: its last sample against its base one, as medians of five samples around each."""
    t, last = r["targets"], r["samples"][-1]
    figure = f"{last['rate']} commits/s, {last['p99_ms']} ms, {last['replicas'][0]['rss'] >> 20} MB"
    ratios = " / ".join(f"{t[k + '_band']:.3g}" for k in ("rate", "p99", "rss", "checkpoint"))
    return (
        f"| `soak.py` | Soak, {last['commits']:,} commits, {r['replicas']} replica(s): rate / p99 / RSS / checkpoint "
        f"at the end (medians of 5 samples) | {figure} | its {t['base_commits']:,}-commit sample | {ratios} "
        f"| rate higher, the others lower | {r['time'][:16]} | `{r['commit']}` | this machine (see below) |"
    )


def write_table(text: str) -> None:
    """Put the table between the markers of each page that shows it."""
    for path in TABLE_FILES:
        page = path.read_text(encoding="utf-8")
        pattern = re.compile(re.escape(MARK_START) + ".*?" + re.escape(MARK_END), re.S)
        if not pattern.search(page):
            raise SystemExit(f"{path}: no {MARK_START} ... {MARK_END} markers to put the table between; add them")
        page = pattern.sub(lambda _: f"{MARK_START}\n{text}\n{MARK_END}", page)
        path.write_text(page, encoding="utf-8")


def save(fig: plt.Figure, name: str) -> None:
    for folder in PLOT_DIRS:
        folder.mkdir(parents=True, exist_ok=True)
        fig.savefig(folder / name, dpi=100, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)


def shorten(label: str, width: int = 100) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"


def plot_ratios() -> None:
    cache: dict[str, Result] = {}
    labels = [shorten(f"{r.what} / {r.peer}") for r in ROWS]
    values = [r.ratio(cache.setdefault(r.file, load(r.file))) for r in ROWS]
    good = [(v >= 1) == (r.better == "higher") for v, r in zip(values, ROWS, strict=True)]
    fig, ax = plt.subplots(figsize=(11, 0.32 * len(ROWS) + 1))
    ax.barh(range(len(ROWS)), values, color=["tab:green" if g else "tab:orange" for g in good])
    ax.set_yticks(range(len(ROWS)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("ours / peer (log scale; green: the better side of 1)")
    ax.set_title("Latest figure of each benchmark against its peer")
    save(fig, "ratios.png")


def plot_commit_throughput() -> None:
    r = load("commit_throughput.json")["results"]
    names = sorted(r, key=lambda k: r[k]["commits_per_s"])
    colours = {"raw": "tab:gray", "mergetxn": "tab:blue", "ducklake": "tab:orange"}
    fig, ax = plt.subplots(figsize=(9, 0.3 * len(names) + 1))
    ax.barh(names, [r[n]["commits_per_s"] for n in names], color=[colours[n.split("_")[0]] for n in names])
    ax.set_xscale("log")
    ax.set_xlabel("commits/s (log scale)")
    run = RUNS["commit_throughput.json"]
    ax.set_title(f"commit_throughput.py, {run.date} UTC, {run.commit}: mergetxn, raw ZooKeeper, DuckLake")
    ax.tick_params(axis="y", labelsize=8)
    save(fig, "commit_throughput.png")


def plot_commit_timeline() -> None:
    steps = load("latency_timeline.json")["path"]
    fig, ax = plt.subplots(figsize=(9, 0.3 * len(steps) + 1))
    starts = [s["at_ms"] - s["step_ms"] for s in steps]
    ax.barh([s["what"] for s in steps], [s["step_ms"] for s in steps], left=starts, color="tab:blue")
    ax.invert_yaxis()
    ax.set_xlabel("ms since the writer's call (median step per commit)")
    ax.set_title("One sequential commit_parts: where its time goes")
    ax.tick_params(axis="y", labelsize=7)
    save(fig, "commit_timeline.png")


def plot_history() -> None:
    r = load("history_cost.json")
    trace = r["parts_while_growing"]["trace"]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot([t for t, _, _ in trace], [v for _, v, _ in trace], marker=".", label="visible parts")
    ax.set_xlabel("seconds while 4 writers grew the history to 100,000 commits")
    ax.set_ylabel("visible parts")
    ax.set_title(f"history_cost.py: p50 {r['ratio_p50']}×, p99 {r['ratio_p99']}× of the early sample")
    save(fig, "history_cost.png")


def plot_snapshot_lookup() -> None:
    r = load("snapshot_lookup.json")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    for history in ("append", "merges"):
        rows = [e for e in r["lookup"] if e["history"] == history]
        for key in ("latest", "old"):
            left.plot(
                [e["commits"] for e in rows], [e[key]["p50_ms"] for e in rows], marker="o", label=f"{history}, {key}"
            )
    left.set(
        xscale="log", yscale="log", xlabel="commits (one part each)", ylabel="p50 ms", title="visible parts lookup"
    )
    left.legend(fontsize=7)
    entries = [e["wal_entries"] for e in r["restart"]]
    right.plot(entries, [e["restart_full_wal_s"] for e in r["restart"]], marker="o", label="whole WAL replayed")
    right.plot(entries, [e["restart_from_snapshot_s"] for e in r["restart"]], marker="o", label="from the snapshot")
    right.set(xscale="log", xlabel="WAL entries", ylabel="seconds", title="replica restart")
    right.legend(fontsize=7)
    save(fig, "snapshot_lookup.png")


def plot_keys_scan() -> None:
    r = load("keys_scan.json")
    sides = ("bounded", "unbounded")
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar([0, 1], [r[s]["arrow_peak_mb"] for s in sides], width=0.4, label="Arrow peak MB")
    ax.bar([0.4, 1.4], [r[s]["peak_rss_mb"] for s in sides], width=0.4, label="peak RSS MB")
    ax.set_xticks([0.2, 1.2], ["scan, 256 MiB budget", "one fold per partition"])
    ax.set_title("keys_scan.py: 10,000,000 keys")
    ax.legend()
    save(fig, "keys_scan.png")


PLOTS = (plot_ratios, plot_commit_throughput, plot_commit_timeline, plot_history, plot_snapshot_lookup, plot_keys_scan)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", action="store_true", help="print the table of figures and stop")
    args = ap.parse_args()
    text = table()
    if args.table:
        print(text)
        return
    write_table(text)
    for plot in PLOTS:
        plot()


if __name__ == "__main__":
    main()
