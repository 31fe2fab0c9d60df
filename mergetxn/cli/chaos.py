"""``mergetxn chaos``: workloads under injected faults, and the history checked
(mergetxn/chaos does the work)."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.markup import escape

from coordinator.core.errors import MergetxnError
from mergetxn.cli.options import directory_option, file_option, shown
from mergetxn.cli.output import console, fail, print_error

if TYPE_CHECKING:
    from mergetxn.chaos.run import Result


@click.command(short_help="Run workloads under injected faults and check the history.")
@shown(
    "--seconds",
    type=click.FloatRange(min=1),
    default=60.0,
    help="How long the workloads and the nemesis run at most (setup and checking come on top).",
)
@click.option(
    "--faults",
    "max_faults",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Stop injecting after N faults: the run ends once they are healed and measured, or at "
    "--seconds; fewer than N by then fails the run (exit code 1). For a CI campaign of a "
    "known size, e.g. --faults 200 --seconds 300.",
)
@click.option(
    "--seed", type=int, default=None, help="Seed of the nemesis and the workloads (default: random, printed)."
)
@shown(
    "--workload",
    type=click.Choice(["list-append", "bank", "keys", "spark", "all"]),
    default="all",
    help="'all' is list-append, bank and keys; 'spark' runs Spark jobs (append, overwrite, jobs joining a "
    "driver transaction, reads) through the data source on a Spark standalone cluster (a master "
    "and a worker per other host, executors on other hosts than the driver).",
)
@click.option(
    "--spark",
    is_flag=True,
    help="Add the Spark workload to the others. Spark is heavy (a master, two workers, two "
    "executors and the driver: six JVMs more, about 40 s to start): on a small machine it "
    "slows every other client, so it is left out unless asked for.",
)
@click.option(
    "--nemesis",
    default="all",
    show_default=True,
    metavar="KINDS",
    help="Fault kinds, comma separated (kill-replica, pause-replica, kill-zk, kill-zk-leader, isolate, "
    "partition-majority, cut-from-zk, bridge, slow, expire-session, wal-full, kill-client; "
    "s3-errors, s3-timeouts with --storage s3; kill-executor: a Spark executor SIGKILLed mid-task, "
    "with the Spark workload only), 'all' (every kind this form and workload support) or 'none'.",
)
@click.option(
    "--lanes",
    type=click.IntRange(min=1),
    default=None,
    help="Faults the nemesis may have under way at once (each lane waits for the recovery of its "
    "last one). Default 3, or 1 with the Spark workload, whose jobs take tens of seconds on a "
    "small machine and with three lanes nearly all meet a killed or cut replica.",
)
@click.option(
    "--pause",
    type=click.FloatRange(min=0, max=3600),
    default=None,
    metavar="SECONDS",
    help="A lane waits a random time up to this long between two faults. Default 0.3, or 10 with "
    "the Spark workload (same reason).",
)
@shown(
    "--report",
    "report_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("chaos-report"),
    help="Directory for history.jsonl, findings.json, summary.json and timeline.html.",
)
@shown("--clients-per-replica", type=click.IntRange(min=1), default=2, help="Clients per replica and workload.")
@shown(
    "--form",
    type=click.Choice(["auto", "namespaces", "loopback", "single"]),
    default="auto",
    help="Simulated hosts in network namespaces (needs root), on loopback, "
    "or a single host (one ZooKeeper, replica signal faults only).",
)
@directory_option(
    "--workdir",
    help="Directory for the cluster's data and logs (default: mergetxn-chaos in the temp dir).",
)
@shown(
    "--storage",
    type=click.Choice(["dir", "s3"]),
    default="dir",
    help="Where the parts are: a directory every host sees, or a bucket on moto's S3 server on host 0 "
    "(behind a fault proxy: the s3-errors and s3-timeouts faults).",
)
@shown(
    "--hostile/--no-hostile",
    type=bool,
    default=True,
    help="Run the hostile-client lane beside the workloads: junk frames, idle connections and forged "
    "parts sent to random replicas (a forged part accepted, or a part file lost, is a finding).",
)
@shown(
    "--secure/--no-secure",
    type=bool,
    default=False,
    help="A secured cluster: TLS to the replicas and a TLS-only ZooKeeper ensemble under the replicas' "
    "identity, every client logged in as the admin; the hostile lane also makes calls a reader's "
    "and a writer's grants deny (each must be refused and change nothing). Not with --spark.",
)
@click.option(
    "--cleanup",
    "cleanup_only",
    is_flag=True,
    help="Only remove what an earlier run left (processes, namespaces, its directory) and exit.",
)
@file_option(
    "--check-history",
    help="Check a saved history.jsonl and write its report, without running anything.",
)
def chaos(
    seconds: float,
    seed: int | None,
    report_dir: Path,
    workdir: Path | None,
    cleanup_only: bool,
    check_history: Path | None,
    **options: Any,
) -> None:
    """Start a cluster, run transactions on every replica while a nemesis kills, pauses, cuts
    and slows its processes, heal, resolve every unknown outcome, read every replica at one CSN,
    and check the history for isolation anomalies, lost commits, divergent replicas and
    unresolved outcomes. Exit code 0 only when nothing was found, 1 when something was
    (each finding printed), 2 when the run could not be set up."""
    import tempfile

    from mergetxn.chaos import report
    from mergetxn.chaos.run import conclude, history_from

    out = console()
    logging.getLogger("kazoo").setLevel(logging.ERROR)  # the nemesis's own ZooKeeper clients see every fault
    workdir = workdir or Path(tempfile.gettempdir()) / "mergetxn-chaos"
    if cleanup_only:
        _chaos_cleanup(workdir, out)
        return
    if check_history is not None:
        result = conclude(history_from(check_history), report_dir)
    else:  # the other options (workload, nemesis, spark, ...) are run_chaos's, by the same names
        result = _chaos_run(out, seed, workdir, seconds, report_dir=report_dir, **options)
    report.print_summary(result.summary, result.findings, out)
    out.print(f"report: {escape(str(report_dir))}/ ({', '.join(report.FILES)})")
    raise SystemExit(result.exit_code)


def _chaos_cleanup(workdir: Path, out: Console) -> None:
    """``chaos --cleanup``: remove what an earlier run left in ``workdir`` and say what was removed."""
    from mergetxn.chaos.run import cleanup

    try:
        done = cleanup(workdir)
    except RuntimeError as exc:  # another run holds the directory
        fail(str(exc))
    out.print("\n".join(escape(d) for d in done) if done else "nothing to clean up")


def _chaos_run(out: Console, seed: int | None, workdir: Path, seconds: float, **options: Any) -> Result:
    """One chaos campaign (``run_chaos`` with ``options``) under ``seed`` (a random one, printed, if
    none), its progress printed dim; SIGTERM stops it as Ctrl-C does (healed, cluster stopped,
    exit 130); a run that cannot be set up or finished fails."""
    import random

    from mergetxn.chaos.run import run_chaos

    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    out.print(f"seed {seed} (rerun with --seed {seed})")

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # SIGTERM stops the run as Ctrl-C does: healed, cluster stopped

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        result = run_chaos(workdir, seconds, seed, say=lambda text: out.print(escape(text), style="dim"), **options)
    except KeyboardInterrupt:
        print_error("interrupted; the cluster was stopped")
        raise SystemExit(130) from None
    except (MergetxnError, OSError, RuntimeError, TimeoutError) as exc:
        fail(f"the chaos run could not be set up or finished: {type(exc).__name__}: {exc}")
    finally:
        signal.signal(signal.SIGTERM, previous)
    return result
