"""A chaos run's report: what a person reads after a campaign, and the files a CI keeps.

Into the report directory: ``history.jsonl`` (the history, :meth:`History.write`),
``findings.json`` (every finding: kind, message, ops), ``summary.json`` (faults by kind with
their recovery times, transactions by outcome and workload, anomalies by kind) and
``timeline.html``: one self-contained page (inline SVG, no script, no dependency) with a lane
per client and a bar per transaction coloured by its outcome, the faults as translucent bands,
and commits by CSN over time beneath, on one axis in seconds.
"""

from __future__ import annotations

import dataclasses
import html
import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mergetxn.chaos.history import Fault, History, Op

FILES = ("history.jsonl", "findings.json", "summary.json", "timeline.html")
OUTCOME_COLOURS = {"committed": "#2e9e44", "aborted": "#e8a33d", "indeterminate": "#d62728"}
FAULT_COLOURS = {
    "kill-replica": "#d62728",
    "pause-replica": "#9467bd",
    "kill-zk": "#8c564b",
    "kill-zk-leader": "#e377c2",
    "isolate": "#1f77b4",
    "partition-majority": "#17becf",
    "cut-from-zk": "#bcbd22",
    "bridge": "#7f7f7f",
    "slow": "#ff7f0e",
    "expire-session": "#393b79",
    "wal-full": "#637939",
    "kill-client": "#843c39",
    "s3-errors": "#e6550d",
    "s3-timeouts": "#fdae6b",
}
WORKLOAD_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"]
# Errors a transaction meets under faults by design; any other class is worth a look even when
# the checker finds no anomaly (a read failing on a missing part, a corrupt entry...).
EXPECTED_ERRORS = frozenset({"ConflictError", "TransactionAborted", "ReplicaUnavailable", "OutcomeUnknown", "Killed"})


def verdict(findings: list[Any], incomplete: list[str] | None = None, breaches: list[str] | None = None) -> int:
    """The exit code: 0 only when the checker found nothing, the check was whole (every
    replica served again and was read at the end, every kind of fault took effect) and nothing
    was found beside the history (a part file gone, a denied call done)."""
    return 0 if not findings and not incomplete and not breaches else 1


def finding_dict(finding: Any) -> dict[str, Any]:
    """A finding as JSON-able data, whatever class the checker uses for it."""
    if dataclasses.is_dataclass(finding) and not isinstance(finding, type):
        return dataclasses.asdict(finding)
    if isinstance(finding, dict):
        return dict(finding)
    return {
        "kind": getattr(finding, "kind", "?"),
        "message": getattr(finding, "message", str(finding)),
        "ops": list(getattr(finding, "ops", []) or []),
    }


def describe(finding: Any) -> str:
    """One line for a finding: the checker's own wording when it has one."""
    try:
        from mergetxn.chaos.checker import describe as checker_describe

        return checker_describe(finding)
    except ImportError:
        d = finding_dict(finding)
        return f"{d.get('kind')}: {d.get('message')}"


def _anomalies(findings: list[Any]) -> dict[str, int]:
    try:
        from mergetxn.chaos.checker import summary

        return dict(summary(findings))
    except ImportError:
        return dict(Counter(str(finding_dict(f).get("kind")) for f in findings))


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 3)
    return round(statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1], 3)


def recovery(fault: Fault) -> float | None:
    """Seconds from a fault's heal until every replica committed again (None: not measured)."""
    return None if fault.recovered is None else max(0.0, fault.recovered - fault.end)


def summarize(history: History, findings: list[Any], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The numbers ``summary.json`` holds and the printed summary shows."""
    ops = history.ops
    by_outcome = Counter(o.outcome for o in ops)
    by_workload: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for o in ops:
        by_workload[o.workload][o.outcome] += 1
    errors = Counter(o.error for o in ops if o.outcome == "aborted" and o.error)
    resolved = Counter(o.outcome for o in ops if o.resolved)
    # A full WAL disk and an S3 outage are storage faults by design: their StorageErrors are expected.
    storage_faults = {"wal-full", "s3-errors", "s3-timeouts"} & set(history.header.nemesis.split(","))
    expected = EXPECTED_ERRORS | ({"StorageError"} if storage_faults else set())
    unexpected = Counter(o.error for o in ops if o.error and o.error not in expected)
    faults: dict[str, dict[str, Any]] = {}
    for kind in sorted({f.kind for f in history.faults}):
        of_kind = [f for f in history.faults if f.kind == kind]
        times = [r for f in of_kind if (r := recovery(f)) is not None]
        faults[kind] = {
            "count": len(of_kind),
            "recovery_p50": _pct(times, 50),
            "recovery_max": round(max(times), 3) if times else None,
            "unrecovered": sum(1 for f in of_kind if f.recovered is None),
            "held_mean": round(statistics.fmean(f.end - f.start for f in of_kind), 3),
        }
    commits = [o.csn for o in ops if o.outcome == "committed" and o.csn is not None]
    h = history.header
    return {
        "seed": h.seed,
        "form": h.form,
        "workload": h.workload,
        "nemesis": h.nemesis,
        "started": h.started,
        "duration": round(max([0.0, *(o.end for o in ops), *(f.end for f in history.faults)]), 3),
        "ops": {
            "total": len(ops),
            "by_outcome": dict(by_outcome),
            "by_workload": {w: dict(c) for w, c in sorted(by_workload.items())},
            "aborted_by_error": dict(errors.most_common()),
            "resolved": dict(resolved),
            "unresolved": by_outcome.get("indeterminate", 0),
            "unexpected_errors": dict(unexpected.most_common()),
            "unexpected_examples": {
                e: next({"index": o.index, "message": o.message[:300]} for o in ops if o.error == e) for e in unexpected
            },
            "max_csn": max(commits, default=None),
        },
        "faults": {"total": len(history.faults), "by_kind": faults},
        "anomalies": _anomalies(findings),
        "findings": len(findings),
        "replicas": len(history.finals),
        **(extra or {}),
    }


def write_report(history: History, findings: list[Any], summary: dict[str, Any], directory: Path) -> None:
    """The four report files (see the module doc)."""
    directory.mkdir(parents=True, exist_ok=True)
    history.write(directory / "history.jsonl")
    (directory / "findings.json").write_text(json.dumps([finding_dict(f) for f in findings], indent=1, default=str))
    (directory / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    (directory / "timeline.html").write_text(timeline_html(history, findings, summary.get("incomplete")))


def print_summary(summary: dict[str, Any], findings: list[Any], out: Console, limit: int = 30) -> None:
    """Faults by kind (count, recovery p50/max), transactions by outcome and workload, anomalies."""
    s = summary
    out.print(
        f"[bold]chaos run[/] seed {s['seed']}, form {escape(str(s['form']))}, workload "
        f"{escape(str(s['workload']))}, {s['duration']:.1f}s"
    )
    out.print(_faults_table(s))
    out.print(_transactions_table(s))
    _print_errors(s, out)
    for problem in s.get("problems") or []:
        out.print(f"[yellow]harness: {escape(problem)}[/]")
    for reason in s.get("incomplete") or []:
        out.print(f"[bold red]check incomplete: {escape(reason)}[/]", soft_wrap=True)
    for breach in s.get("breaches") or []:
        out.print(f"[bold red]found: {escape(breach)}[/]", soft_wrap=True)
    _print_findings(s, findings, out, limit)


def _faults_table(s: dict[str, Any]) -> Table:
    """Faults by kind: count, mean time held, recovery p50/max, how many never recovered."""
    ft = Table(title=f"faults ({s['faults']['total']})", title_justify="left")
    for col in ("kind", "count", "held mean s", "recovery p50 s", "recovery max s", "unrecovered"):
        ft.add_column(col, justify="left" if col == "kind" else "right")
    for kind, f in s["faults"]["by_kind"].items():
        ft.add_row(
            kind,
            str(f["count"]),
            f"{f['held_mean']:.2f}",
            _num(f["recovery_p50"]),
            _num(f["recovery_max"]),
            str(f["unrecovered"]),
        )
    return ft


def _transactions_table(s: dict[str, Any]) -> Table:
    """Transactions by workload and outcome, with a bold line for all of them."""
    ot = Table(title=f"transactions ({s['ops']['total']})", title_justify="left")
    outcomes = ["committed", "aborted", "indeterminate"]
    for col in ("workload", *outcomes):
        ot.add_column(col, justify="left" if col == "workload" else "right")
    for w, c in s["ops"]["by_workload"].items():
        ot.add_row(w, *(str(c.get(k, 0)) for k in outcomes))
    ot.add_row("[bold]all[/]", *(f"[bold]{s['ops']['by_outcome'].get(k, 0)}[/]" for k in outcomes))
    return ot


def _print_errors(s: dict[str, Any], out: Console) -> None:
    """Aborts by error, unexpected errors with an example each, and the indeterminate resolved later."""
    if s["ops"]["aborted_by_error"]:
        out.print("aborted by error: " + ", ".join(f"{k} {v}" for k, v in s["ops"]["aborted_by_error"].items()))
    for error, n in s["ops"].get("unexpected_errors", {}).items():
        example = s["ops"].get("unexpected_examples", {}).get(error)
        out.print(
            f"[yellow]unexpected error {escape(error)} in {n} transaction(s)"
            + (f", e.g. op {example['index']}: {escape(example['message'])}" if example else "")
            + "[/]",
            soft_wrap=True,
        )
    if s["ops"]["resolved"]:
        out.print(
            "indeterminate, resolved by commit_status: "
            + ", ".join(f"{k} {v}" for k, v in s["ops"]["resolved"].items())
        )


def _print_findings(s: dict[str, Any], findings: list[Any], out: Console, limit: int) -> None:
    """The verdict line and the first ``limit`` findings."""
    if not findings:
        out.print(
            "[bold green]no anomaly found[/]"
            if not s.get("incomplete") and not s.get("breaches")
            else "no anomaly found in the history"
        )
        return
    out.print(
        f"[bold red]{len(findings)} finding(s):[/] " + ", ".join(f"{k} {v}" for k, v in s["anomalies"].items() if v)
    )
    for f in findings[:limit]:
        out.print(f"  [red]{escape(describe(f))}[/]", soft_wrap=True)
    if len(findings) > limit:
        out.print(f"  ... and {len(findings) - limit} more in findings.json")


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


# -- the timeline -----------------------------------------------------------------------------------


def _nice_step(span: float, target: int = 12) -> float:
    raw = max(span / target, 1e-9)
    for step in (0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600):
        if step >= raw:
            return float(step)
    return 3600.0 * (raw // 3600 + 1)


def _op_title(o: Op) -> str:
    mops = " ".join(json.dumps(m, separators=(",", ":")) for m in o.mops)
    if len(mops) > 300:
        mops = mops[:300] + "..."
    lines = [
        f"op {o.index} client {o.process} on replica #{o.replica} ({o.workload}) {o.start:.2f}-{o.end:.2f}s",
        f"{o.tid or 'no tid'} snapshot {o.snapshot}",
        f"{o.outcome}" + (f" at CSN {o.csn}" if o.csn is not None else "") + (f" ({o.error})" if o.error else ""),
        mops,
    ]
    if o.resolved:
        lines.append(f"resolved: {o.resolved}")
    if o.message:
        lines.append(o.message[:300])
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class _Frame:
    """Where the timeline's parts sit: the plot's left edge and width, the fault labels' rows,
    the client lanes, the time axis and the CSN panel beneath, on one scale of seconds."""

    end: float
    top: int
    lanes_h: int
    axis_y: int
    csn_top: int
    left: int = 130
    right: int = 20
    width: int = 1500
    lane_h: int = 12
    lane_gap: int = 3
    label_h: int = 13
    csn_h: int = 170

    @property
    def plot_w(self) -> int:
        return self.width - self.left - self.right

    @property
    def height(self) -> int:
        return self.csn_top + self.csn_h + 40

    def x(self, t: float) -> float:
        return self.left + self.plot_w * max(0.0, t) / self.end


def _frame(end: float, label_rows: int, lanes: int) -> _Frame:
    """The frame for ``label_rows`` rows of fault labels and ``lanes`` client lanes up to ``end``."""
    top = 20 + max(1, label_rows) * _Frame.label_h
    lanes_h = lanes * (_Frame.lane_h + _Frame.lane_gap)
    axis_y = top + lanes_h + 4
    return _Frame(end=end, top=top, lanes_h=lanes_h, axis_y=axis_y, csn_top=axis_y + 40)


def _place_fault_labels(faults: list[Fault], end: float) -> tuple[list[tuple[Fault, int]], int]:
    """Each fault with the row of its label, so overlapping faults stay legible; and the rows."""
    plot_w = _Frame.width - _Frame.left - _Frame.right
    label_rows: list[float] = []
    placed: list[tuple[Fault, int]] = []
    for f in sorted(faults, key=lambda f: f.start):
        label_w = (len(f.kind) + len(f.target) + 1) * 6.2 * end / plot_w
        row = next((r for r, last in enumerate(label_rows) if last <= f.start), None)
        if row is None:
            row = len(label_rows)
            label_rows.append(0.0)
        label_rows[row] = f.start + label_w
        placed.append((f, row))
    return placed, len(label_rows)


def _svg_open(fr: _Frame) -> list[str]:
    """The svg element and the hatching pattern recoveries are drawn with."""
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{fr.width}" height="{fr.height}" '
        f'font-family="sans-serif" font-size="11">',
        '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#888" '
        'stroke-width="1.5" stroke-opacity="0.35"/></pattern></defs>',
    ]


def _svg_grid(fr: _Frame) -> list[str]:
    """The grid lines, the time axis and its labels."""
    svg: list[str] = []
    step = _nice_step(fr.end)
    t = 0.0
    while t <= fr.end + 1e-9:
        gx = fr.x(t)
        svg.append(f'<line x1="{gx:.1f}" y1="{fr.top - 4}" x2="{gx:.1f}" y2="{fr.csn_top + fr.csn_h}" stroke="#eee"/>')
        svg.append(f'<text x="{gx:.1f}" y="{fr.axis_y + 14}" text-anchor="middle" fill="#444">{t:g}</text>')
        t += step
    svg.append(
        f'<text x="{fr.left + fr.plot_w / 2:.0f}" y="{fr.axis_y + 30}" text-anchor="middle" fill="#222">'
        "seconds since the run began</text>"
    )
    svg.append(f'<line x1="{fr.left}" y1="{fr.axis_y}" x2="{fr.left + fr.plot_w}" y2="{fr.axis_y}" stroke="#444"/>')
    return svg


def _svg_faults(fr: _Frame, placed: list[tuple[Fault, int]]) -> list[str]:
    """Fault bands (behind the bars), their recovery as hatching, labels above."""
    esc = html.escape
    svg: list[str] = []
    for f, row in placed:
        colour = FAULT_COLOURS.get(f.kind, "#999")
        x0, x1 = fr.x(f.start), max(fr.x(f.end), fr.x(f.start) + 1.5)
        title = esc(
            f"{f.kind} {f.target} {f.start:.2f}-{f.end:.2f}s: {f.detail}"
            + (f"; recovered after {f.recovered - f.end:.2f}s" if f.recovered is not None else "; not recovered")
        )
        svg.append(
            f"<g><title>{title}</title>"
            f'<rect x="{x0:.1f}" y="{fr.top - 2}" width="{x1 - x0:.1f}" height="{fr.lanes_h + 4}" fill="{colour}" '
            f'fill-opacity="0.16"/>'
            f'<rect x="{x0:.1f}" y="{fr.csn_top}" width="{x1 - x0:.1f}" height="{fr.csn_h}" fill="{colour}" '
            f'fill-opacity="0.10"/>'
        )
        if f.recovered is not None and f.recovered > f.end:
            svg.append(
                f'<rect x="{x1:.1f}" y="{fr.top - 2}" width="{max(0.5, fr.x(f.recovered) - x1):.1f}" '
                f'height="{fr.lanes_h + 4}" fill="url(#hatch)"/>'
            )
        ly = 16 + row * fr.label_h
        svg.append(
            f'<line x1="{x0:.1f}" y1="{ly + 2}" x2="{x0:.1f}" y2="{fr.top - 2}" stroke="{colour}" '
            f'stroke-opacity="0.6"/><text x="{x0 + 2:.1f}" y="{ly}" fill="{colour}">'
            f"{esc(f.kind)} {esc(f.target)}</text></g>"
        )
    return svg


def _svg_lanes(fr: _Frame, ops: list[Op], lanes: list[int]) -> list[str]:
    """A lane per client, named, and a bar per transaction coloured by its outcome."""
    esc = html.escape
    svg: list[str] = []
    workload_of: dict[int, str] = {}
    for o in ops:
        workload_of.setdefault(o.process, o.workload)
    for n, p in enumerate(lanes):
        y = fr.top + n * (fr.lane_h + fr.lane_gap)
        name = "killed clients" if workload_of.get(p) == "kill-client" else f"client {p} ({workload_of.get(p, '')})"
        svg.append(f'<text x="{fr.left - 6}" y="{y + fr.lane_h - 2}" text-anchor="end" fill="#333">{esc(name)}</text>')
    row_of = {p: n for n, p in enumerate(lanes)}
    for o in ops:
        y = fr.top + row_of[o.process] * (fr.lane_h + fr.lane_gap)
        x0 = fr.x(o.start)
        w = max(1.0, fr.x(o.end) - x0)
        stroke = ' stroke="#d62728" stroke-width="1.5"' if o.resolved else ""
        svg.append(
            f'<rect x="{x0:.1f}" y="{y}" width="{w:.1f}" height="{fr.lane_h}" '
            f'fill="{OUTCOME_COLOURS.get(o.outcome, "#999")}"{stroke}><title>{esc(_op_title(o))}</title></rect>'
        )
    return svg


def _svg_commits(fr: _Frame, ops: list[Op]) -> tuple[list[str], dict[str, str]]:
    """The lower panel: each commit by CSN over time, coloured by workload; and those colours."""
    esc = html.escape
    commits = [o for o in ops if o.outcome == "committed" and o.csn is not None]
    left, csn_top, csn_h = fr.left, fr.csn_top, fr.csn_h
    svg = [f'<rect x="{left}" y="{csn_top}" width="{fr.plot_w}" height="{csn_h}" fill="none" stroke="#999"/>']
    if not commits:
        return svg, {}
    # By rank: a new epoch makes CSNs jump by 2**31, which would flatten a linear scale.
    order = sorted({o.csn for o in commits if o.csn is not None})
    rank = {c: n for n, c in enumerate(order)}
    span = max(1, len(order) - 1)
    y = lambda c: csn_top + csn_h - 4 - (csn_h - 8) * rank[c] / span  # noqa: E731
    for c in dict.fromkeys([order[0], order[len(order) // 2], order[-1]]):
        svg.append(f'<text x="{left - 6}" y="{y(c) + 4:.1f}" text-anchor="end" fill="#666">{c}</text>')
    svg.append(f'<text x="{left}" y="{csn_top - 5}" fill="#333">CSN of each commit</text>')
    wl = sorted({o.workload for o in commits})
    colour = {w: WORKLOAD_COLOURS[i % len(WORKLOAD_COLOURS)] for i, w in enumerate(wl)}
    for o in commits:
        svg.append(
            f'<circle cx="{fr.x(o.end):.1f}" cy="{y(o.csn):.1f}" r="1.8" fill="{colour[o.workload]}">'
            f"<title>CSN {o.csn}: op {o.index} ({esc(o.workload)}) on replica #{o.replica}</title></circle>"
        )
    return svg, colour


def _legends(faults: list[Fault], colour: dict[str, str]) -> tuple[str, str, str]:
    """The keys for transactions (by outcome), faults (by kind) and commits (by workload)."""
    esc = html.escape
    legend = "".join(
        f'<span class="key"><i style="background:{c}"></i>{esc(k)}</span>' for k, c in OUTCOME_COLOURS.items()
    )
    legend += (
        '<span class="key"><i style="background:#2e9e44;outline:2px solid #d62728"></i>'
        "indeterminate, resolved later (fill: the outcome learnt)</span>"
    )
    kinds = sorted({f.kind for f in faults})
    fault_legend = "".join(
        f'<span class="key"><i style="background:{FAULT_COLOURS.get(k, "#999")};opacity:.5"></i>{esc(k)}</span>'
        for k in kinds
    )
    fault_legend += (
        '<span class="key"><i style="background:repeating-linear-gradient(45deg,#bbb 0 2px,#fff 2px 5px)">'
        "</i>until every replica committed again</span>"
        if kinds
        else ""
    )
    wl_legend = "".join(
        f'<span class="key"><i style="background:{c};border-radius:50%"></i>{esc(w)}</span>' for w, c in colour.items()
    )
    return legend, fault_legend, wl_legend


def _verdict_html(findings: list[Any], incomplete: list[str] | None) -> str:
    """Why the check is incomplete, if it is, and the findings (the first 50) or that there are none."""
    esc = html.escape
    verdict_html = "".join(f'<p class="bad">check incomplete: {esc(r)}</p>' for r in incomplete or [])
    verdict_html += (
        '<p class="ok">no anomaly found</p>'
        if not findings
        else f'<p class="bad">{len(findings)} finding(s)</p><ul>'
        + "".join(f"<li>{esc(describe(f))}</li>" for f in findings[:50])
        + "</ul>"
    )
    return verdict_html


def timeline_html(history: History, findings: list[Any] | None = None, incomplete: list[str] | None = None) -> str:
    """The timeline page (see the module doc)."""
    findings = findings or []
    ops, faults = history.ops, history.faults
    end = max([1.0, *(o.end for o in ops), *(f.recovered or f.end for f in faults)])
    lanes = sorted({o.process for o in ops})
    placed, label_rows = _place_fault_labels(faults, end)
    fr = _frame(end, label_rows, len(lanes))
    commits, colour = _svg_commits(fr, ops)
    svg = [*_svg_open(fr), *_svg_grid(fr), *_svg_faults(fr, placed), *_svg_lanes(fr, ops, lanes), *commits, "</svg>"]
    legend, fault_legend, wl_legend = _legends(faults, colour)
    verdict_html = _verdict_html(findings, incomplete)
    esc = html.escape
    h = history.header
    counts = Counter(o.outcome for o in ops)
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>mergetxn chaos: seed {h.seed}</title>
<style>
body {{ font-family: sans-serif; margin: 16px; color: #222; }}
.key {{ margin-right: 14px; white-space: nowrap; font-size: 13px; }}
.key i {{ display: inline-block; width: 14px; height: 10px; margin-right: 4px; vertical-align: middle; }}
.ok {{ color: #2e9e44; font-weight: bold; }} .bad {{ color: #d62728; font-weight: bold; }}
.meta {{ color: #555; }} svg {{ border: 1px solid #ddd; }}
</style></head><body>
<h2>mergetxn chaos run, seed {h.seed}</h2>
<p class="meta">form {esc(h.form)}, workload {esc(h.workload)}, started {esc(h.started)};
{len(ops)} transactions ({counts.get("committed", 0)} committed, {counts.get("aborted", 0)} aborted,
{counts.get("indeterminate", 0)} unresolved), {len(faults)} faults; hover a bar or a band for details.</p>
{verdict_html}
<p>transactions: {legend}</p>
<p>faults: {fault_legend or "none"}</p>
<p>commits by CSN (lower panel, in commit order; a new epoch makes CSNs jump): {wl_legend or "none"}</p>
{"".join(svg)}
</body></html>
"""
