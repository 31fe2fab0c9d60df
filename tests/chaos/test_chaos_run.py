"""``mergetxn chaos`` end to end on the single-host form, and its verdict on a damaged history.

One campaign (about 40 s of workload under replica kills, pauses and killed clients) runs
through the command line as a user runs it; the tests read what it wrote: the report files, the
history (committed, aborted and resolved ops, faults, every replica's final contents), and its
exit code. The checker's failure path is driven through the same command with a history whose
one read was damaged (``--check-history``), so no cluster is faked for it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from mergetxn.chaos.history import History
from mergetxn.chaos.hostile import INLINED
from mergetxn.chaos.run import PIDS_FILE, conclude, workdir_lock, writes
from mergetxn.cli import cli

pytestmark = pytest.mark.slow

SECONDS = 40  # long enough that every kind of keys write commits under the hostile lane's load too
SEED = 20240611
FILES = {"history.jsonl", "findings.json", "summary.json", "timeline.html"}


@dataclass
class Campaign:
    exit_code: int
    output: str
    report: Path
    history: History


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Campaign]:
    base = tmp_path_factory.mktemp("chaos")
    report = base / "report"
    result = CliRunner().invoke(
        cli,
        [
            "chaos",
            "--seconds",
            str(SECONDS),
            "--seed",
            str(SEED),
            "--form",
            "single",
            "--workload",
            "all",
            "--nemesis",
            "kill-replica,pause-replica,kill-client",
            "--workdir",
            str(base / "work"),
            "--report",
            str(report),
        ],
    )
    history = History.read(report / "history.jsonl") if (report / "history.jsonl").exists() else None
    assert history is not None, f"no history written; exit {result.exit_code}\n{result.output}\n{result.exception!r}"
    yield Campaign(result.exit_code, result.output, report, history)


def test_campaign_passes_and_writes_its_report(campaign: Campaign) -> None:
    assert campaign.exit_code == 0, campaign.output
    assert FILES <= {p.name for p in campaign.report.iterdir()}
    assert json.loads((campaign.report / "findings.json").read_text()) == []
    summary = json.loads((campaign.report / "summary.json").read_text())
    assert summary["seed"] == SEED and summary["findings"] == 0
    assert summary["ops"]["total"] == len(campaign.history.ops)
    page = (campaign.report / "timeline.html").read_text()
    assert "<svg" in page and "seconds since the run began" in page and "no anomaly found" in page
    assert "no anomaly found" in campaign.output and f"seed {SEED}" in campaign.output


def test_the_hostile_lane_ran_and_nothing_it_sent_got_through(campaign: Campaign) -> None:
    """The hostile-client lane (junk frames, idle connections, forged parts, lying descriptors,
    forged inlined parts) ran beside the workloads by default; every forged part was refused,
    every kind of forged inlined part was tried, and every replica kept serving (the campaign
    passed, every replica read at one CSN, every part file checked, the lane's table empty)."""
    hostile = json.loads((campaign.report / "summary.json").read_text())["hostile"]
    assert hostile["findings"] == [] and hostile["error"] is None
    counts = hostile["counts"]
    assert sum(n for k, n in counts.items() if k.startswith("junk:")) > 0
    forged = sum(n for k, n in counts.items() if k.startswith("forged:"))
    assert forged == sum(n for k, n in counts.items() if k.startswith("forged-refused:"))
    assert_refused_or_interrupted(counts, ("lie:", "huge-partition:", "inlined:"))
    # every kind of forged inlined part tried and refused (a kind a fault cut short goes to another replica)
    assert all(counts.get(f"refused:inlined:{kind}", 0) > 0 for kind in INLINED), counts
    assert counts.get("flood-connections", 0) > 0, counts


def test_small_writes_were_inlined_beside_files_and_flushed(campaign: Campaign) -> None:
    """la0's one-row inserts were inlined and flushed into files while the faults ran (inlined
    parts removed within the window); la1's, its table having inlining off, were files only;
    the campaign passed with both in its transactions."""
    small = json.loads((campaign.report / "summary.json").read_text())["small_writes"]
    assert small["la0"]["inlined_removed"] > 0 and small["la0"]["files"] > 0, small
    assert small["la1"]["inlined_visible"] == small["la1"]["inlined_removed"] == 0 and small["la1"]["files"] > 0, small


def assert_refused_or_interrupted(counts: dict[str, int], prefixes: tuple[str, ...]) -> None:
    """Each attack of these kinds was tried, and each try was refused or cut short by a fault;
    one accepted is a finding, which the lane reports (and the caller asserts there is none)."""
    tried = {k: n for k, n in counts.items() if k.startswith(prefixes)}
    assert tried and sum(counts.get(f"refused:{k}", 0) for k in tried) > 0, counts
    for k, n in tried.items():
        cut = sum(m for c, m in counts.items() if c.startswith(f"interrupted:{k}:"))
        assert counts.get(f"refused:{k}", 0) + cut == n, (k, counts)


def test_history_holds_every_outcome_and_the_faults(campaign: Campaign) -> None:
    h = campaign.history
    outcomes = {o.outcome for o in h.ops}
    assert {"committed", "aborted"} <= outcomes
    assert "indeterminate" not in outcomes, [o for o in h.ops if o.outcome == "indeterminate"]
    assert {o.workload for o in h.ops} >= {"list-append", "bank", "keys"}
    assert any(o.error == "ConflictError" for o in h.ops)  # transfers on one account collide
    keys = [o for o in h.ops if o.workload == "keys"]
    # first committer wins per key: writers of one key collide, and the key names the loser's cause
    assert any(o.error == "ConflictError" and "kv" in (o.message or "") for o in keys)
    assert {m[0] for o in keys if o.outcome == "committed" for m in o.mops} == {"r", "set"}
    assert any(m[0] == "set" and m[3] is None for o in keys if o.outcome == "committed" for m in o.mops)
    # lock groups: writes of one group alone (update mode) of kvg committed for both groups
    singles = [
        {m[1] for m in o.mops if m[0] == "set" and m[1].startswith("kvg/")} for o in keys if o.outcome == "committed"
    ]
    assert {"kvg/a"} in singles and {"kvg/b"} in singles
    # atomicity "none": sync and async commits; async ones acknowledged by a flush, all resolved
    lww = [o for o in keys if o.atomicity == "none"]
    assert {o.durability for o in lww if o.outcome == "committed"} == {"sync", "async"}
    assert any(o.flushed and o.outcome == "committed" and o.resolved for o in lww)
    kinds = {f.kind for f in h.faults}
    assert kinds == {"kill-replica", "pause-replica", "kill-client"}, kinds
    assert all(f.recovered is not None for f in h.faults), [f for f in h.faults if f.recovered is None]
    killed = [o for o in h.ops if o.workload == "kill-client" and o.tid]
    assert killed and all(o.resolved and o.outcome == "aborted" for o in killed), killed
    assert all(o.mops and o.mops[0][0] == "append" for o in killed)
    # every op with a tid names it once; every mop is of the documented shape
    tids = [o.tid for o in h.ops if o.tid]
    assert len(tids) == len(set(tids))
    assert all(m[0] in {"r", "append", "delete", "set"} and len(m) == 4 for o in h.ops for m in o.mops)


def test_replicas_end_identical_and_the_bank_total_holds(campaign: Campaign) -> None:
    finals = campaign.history.finals
    assert len(finals) == 3
    assert len({f.csn for f in finals}) == 1
    assert all(f.tables == finals[0].tables for f in finals)
    assert sum(finals[0].tables["bank"].values()) == 10 * 100
    committed = [o for o in campaign.history.ops if o.outcome == "committed" and o.tid and writes(o)]
    for f in finals:  # every replica knows every committed writer at its CSN
        assert all(f.statuses[o.tid] == ["committed", o.csn] for o in committed)


def _damaged(history: History) -> tuple[History, int]:
    """The history with one element dropped from one committed read that returned two or more."""
    data = [dict(r) for r in history.records()]
    for rec in data:
        if rec["type"] == "op" and rec["outcome"] == "committed" and rec["workload"] == "list-append":
            for m in rec["mops"]:
                if m[0] == "r" and m[3] and len(m[3]) >= 2:
                    m[3] = m[3][1:]
                    return History.from_records(data), rec["index"]
    raise AssertionError("no committed read of two or more elements to damage")


def test_a_damaged_history_fails_the_check(campaign: Campaign, tmp_path: Path) -> None:
    damaged, index = _damaged(campaign.history)
    result = conclude(damaged, None)
    assert result.findings and result.exit_code == 1
    assert any(index in (getattr(f, "ops", None) or []) for f in result.findings), result.findings
    path = tmp_path / "damaged.jsonl"
    damaged.write(path)
    report = tmp_path / "report"
    out = CliRunner().invoke(cli, ["chaos", "--check-history", str(path), "--report", str(report)])
    assert out.exit_code == 1, out.output
    assert "finding" in out.output
    assert FILES <= {p.name for p in report.iterdir()}
    assert json.loads((report / "findings.json").read_text())


def _key_writers(history: History) -> list[tuple[int, int]]:
    """Pairs of committed keys ops (earlier, later by csn) that set one key, the later one
    beginning after the earlier one committed (so first committer wins let both through)."""
    setters: dict[str, list] = {}
    for o in sorted(history.ops, key=lambda o: o.csn or 0):
        if o.workload == "keys" and o.outcome == "committed" and o.atomicity == "full":
            for k in {(m[1], m[2]) for m in o.mops if m[0] == "set"}:
                setters.setdefault(k, []).append(o)
    return [
        (a.index, b.index)
        for ops in setters.values()
        for a, b in zip(ops, ops[1:])
        if a.csn < b.csn and b.snapshot >= a.csn
    ]


def test_damaged_keys_histories_fail_the_check(campaign: Campaign) -> None:
    """The keys workload's guarantees are checked, not assumed: a committed point read given
    another value, a key's second writer moved to a snapshot before the first one's commit
    (two overlapping writers of one key both committed), an async commit acknowledged by a flush
    that did not commit, and a serializable writer moved to a snapshot before a write of a key it
    read (its read set changed), are each found."""
    data = [dict(r) for r in campaign.history.records()]
    ops = {r["index"]: r for r in data if r["type"] == "op"}
    read = next(
        r
        for r in ops.values()
        if r["workload"] == "keys"
        and r["outcome"] == "committed"
        and any(m[0] == "r" and m[2] is not None and m[3] is not None for m in r["mops"])
    )
    mop = next(m for m in read["mops"] if m[0] == "r" and m[2] is not None and m[3] is not None)
    saved, mop[3] = mop[3], mop[3] + 10**9  # a value nobody wrote
    found = conclude(History.from_records(data), None).findings
    assert any(f.kind == "si-read" and read["index"] in f.ops for f in found), found
    mop[3] = saved
    first, second = _key_writers(campaign.history)[0]
    saved, ops[second]["snapshot"] = ops[second]["snapshot"], ops[first]["csn"] - 1
    found = conclude(History.from_records(data), None).findings
    assert any(f.kind == "lost-update" and {first, second} <= set(f.ops) for f in found), found
    ops[second]["snapshot"] = saved
    # A flushed async commit that did not commit.
    flushed = next(
        r
        for r in ops.values()
        if r["flushed"] and r["outcome"] == "committed" and any(m[0] == "set" for m in r["mops"])
    )
    flushed["outcome"], flushed["csn"] = "aborted", None
    found = conclude(History.from_records(data), None).findings
    assert any(f.kind == "lost-commit" and f.ops == (flushed["index"],) and "flush" in f.message for f in found), found
    data = [dict(r) for r in campaign.history.records()]  # undamaged again
    ops = {r["index"]: r for r in data if r["type"] == "op"}
    # A serializable writer that read a key: moved to a snapshot before that key's last writer.
    reader, writer = _serializable_read_after_write(campaign.history)
    ops[reader]["snapshot"] = ops[writer]["csn"] - 1
    found = conclude(History.from_records(data), None).findings
    assert any(f.kind == "read-set-changed" and f.ops == (reader, writer) for f in found), found


def _serializable_read_after_write(history: History) -> tuple[int, int]:
    """A committed serializable keys op with writes and a point read of a key, and the last
    committed op that set that key before the reader's snapshot."""
    committed = [o for o in history.ops if o.workload == "keys" and o.outcome == "committed"]
    for o in committed:
        if o.isolation != "serializable" or o.csn <= o.snapshot:
            continue
        for m in o.mops:
            if m[0] == "r" and m[2] is not None:
                before = [
                    w
                    for w in committed
                    if w.csn <= o.snapshot and w.csn > 0 and any(x[0] == "set" and x[1:3] == m[1:3] for x in w.mops)
                ]
                if before:
                    return o.index, max(before, key=lambda w: w.csn).index
    raise AssertionError("no committed serializable keys op read a key written before its snapshot")


def test_fault_kinds_the_form_cannot_inject_are_refused(tmp_path: Path) -> None:
    out = CliRunner().invoke(
        cli,
        [
            "chaos",
            "--seconds",
            "5",
            "--form",
            "single",
            "--nemesis",
            "isolate",
            "--workdir",
            str(tmp_path / "work"),
            "--report",
            str(tmp_path / "report"),
        ],
    )
    assert out.exit_code == 2
    assert "isolate" in out.output and "namespaces" in out.output


def test_cleanup_stops_what_a_killed_run_left(tmp_path: Path) -> None:
    """A harness killed with SIGKILL leaves its replica processes (sessions of their own);
    ``--cleanup`` finds them by the pid file in the run's directory, and only those naming it."""
    cluster_dir = tmp_path / "work" / "cluster"
    cluster_dir.mkdir(parents=True)
    mine = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", str(cluster_dir)], start_new_session=True
    )
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        (cluster_dir / PIDS_FILE).write_text(json.dumps([mine.pid, stranger.pid]))
        out = CliRunner().invoke(cli, ["chaos", "--cleanup", "--workdir", str(tmp_path / "work")])
        assert out.exit_code == 0, out.output
        assert f"killed pid {mine.pid}" in out.output and str(stranger.pid) not in out.output
        assert mine.wait(10) == -signal.SIGKILL
        assert stranger.poll() is None
        assert not cluster_dir.exists()
    finally:
        for p in (mine, stranger):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_second_run_in_the_same_workdir_is_refused_and_removes_nothing(tmp_path: Path) -> None:
    """A run (or ``--cleanup``) removes an earlier run's cluster from its directory: a second run
    started there while the first runs would destroy it. The first holds the directory; the
    second is refused (exit code 2, naming the holder and --workdir) and touches nothing."""
    work = tmp_path / "work"
    kept = work / "cluster" / "a-running-campaign's-file"
    kept.parent.mkdir(parents=True)
    kept.write_text("x")
    with workdir_lock(work):
        for args in (["--cleanup"], ["--form", "single", "--seconds", "1", "--nemesis", "none"]):
            # another process, as a second campaign would be (the lock is the directory's, not the thread's)
            run = subprocess.run(
                [sys.executable, "-c", "from mergetxn.cli import main; main()", "chaos", "--workdir", str(work), *args],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert run.returncode == 2, run.stdout + run.stderr
            assert f"another chaos run (pid {os.getpid()})" in run.stderr + run.stdout
            assert "--workdir" in run.stderr + run.stdout
            assert kept.exists()
    out = CliRunner().invoke(cli, ["chaos", "--cleanup", "--workdir", str(work)])
    assert out.exit_code == 0, out.output
    assert not kept.exists()


def test_a_secured_campaign_refuses_every_denied_call(tmp_path: Path) -> None:
    """``--secure``: TLS, users and grants; every client logs in as the admin, and the hostile lane
    adds calls that a reader's or a writer's grants deny (and a dropped user's login): each was
    refused, nothing they asked for happened, and the run found nothing."""
    report = tmp_path / "report"
    result = CliRunner().invoke(
        cli,
        [
            "chaos",
            "--secure",
            "--seconds",
            "20",
            "--seed",
            "7",
            "--form",
            "single",
            "--workload",
            "list-append",
            "--nemesis",
            "kill-replica,pause-replica",
            "--workdir",
            str(tmp_path / "work"),
            "--report",
            str(report),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "starting the secured single cluster" in result.output
    hostile = json.loads((report / "summary.json").read_text())["hostile"]
    assert hostile["findings"] == [] and hostile["error"] is None
    counts = hostile["counts"]
    denied = {k.split(":", 1)[1]: n for k, n in counts.items() if k.startswith("denied:")}
    refused = sum(n for k, n in counts.items() if k.startswith("denied-refused:"))
    assert sum(denied.values()) > 0 and refused > 0, counts
    # each refused, or cut short by a fault (a killed replica); what those asked for is checked after the run
    assert all(
        counts.get(f"denied-refused:{kind}", 0) + counts.get(f"denied-interrupted:{kind}", 0) == n
        for kind, n in denied.items()
    ), counts
    # another user's session and lease ids: each use refused
    ids = {k.split(":", 1)[1]: n for k, n in counts.items() if k.startswith("others-ids:")}
    assert ids, counts
    assert all(
        counts.get(f"others-ids-refused:{kind}", 0)
        + sum(m for c, m in counts.items() if c.startswith(f"others-ids-interrupted:{kind}:"))
        == n
        for kind, n in ids.items()
    ), counts


def test_a_secured_campaign_has_no_spark_workload(tmp_path: Path) -> None:
    out = CliRunner().invoke(
        cli,
        [
            "chaos",
            "--secure",
            "--spark",
            "--seconds",
            "5",
            "--form",
            "single",
            "--workdir",
            str(tmp_path / "work"),
            "--report",
            str(tmp_path / "report"),
        ],
    )
    assert out.exit_code == 2 and "Spark" in out.output
