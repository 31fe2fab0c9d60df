"""The servers, in the foreground: ``zk start`` (an embedded ZooKeeper server or ensemble
member) and ``replica start``; ``replica retire`` for a replica gone for good."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from coordinator.core.errors import InvalidInput, MergetxnError
from mergetxn.cli.options import (
    credentials_option,
    file_option,
    shown,
    timeout_option,
    zookeeper_access,
    zookeeper_location,
)
from mergetxn.cli.output import EXIT_UNAVAILABLE, ask, call_timeout, console, fail, log, redact, say
from replicas.settings import click_options

if TYPE_CHECKING:
    from coordinator.wire.security import Credentials


@contextmanager
def stop_signals() -> Iterator[threading.Event]:
    """An event set on SIGINT/SIGTERM, so foreground servers stop cleanly either way."""
    stop = threading.Event()
    previous = {}

    def handler(signum: int, frame: Any) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, handler)
    try:
        yield stop
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


@click.group()
def zk() -> None:
    """Run an embedded ZooKeeper server."""


@zk.command("start")
@shown(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".mergetxn") / "zookeeper",
    help="Data and log directory (kept across restarts).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Client port of a standalone server (default: a free one).",
)
@click.option(
    "--id",
    "myid",
    type=click.IntRange(1, 255),
    default=None,
    help="Run member N (1-based myid) of the ensemble given by --members instead of a standalone server.",
)
@click.option(
    "--members",
    default=None,
    metavar="H:C:Q:E,...",
    help="Every member of the ensemble in id order, as host:clientPort:quorumPort:electionPort "
    "separated by commas; member --id listens on its own host.",
)
@shown(
    "--tick-ms",
    type=click.IntRange(10, 60000),
    default=200,
    help="ZooKeeper tickTime: sessions may be as short as 2 ticks.",
)
@file_option(
    "--credentials",
    metavar="FILE",
    help="A secured cluster's replica credentials file (mergetxn security init): TLS only on the "
    "client port and between members, sessions only for clients presenting a certificate of the "
    "cluster CA (the replicas'), / under the identity's ACL.",
)
def zk_start(
    directory: Path,
    port: int | None,
    myid: int | None,
    members: str | None,
    tick_ms: int,
    credentials: Path | None,
) -> None:
    """Run a real ZooKeeper server (from the pyspark jars, Java 17) in the foreground: a
    standalone server, or with --id and --members one member of an ensemble.

    Prints READY <host:port> once it serves (a member: once it has joined a quorum); Ctrl-C or
    SIGTERM stops it cleanly.
    """
    from coordinator.wire.security import Credentials

    creds = None if credentials is None else Credentials.from_file(credentials)
    if myid is None and members is None:
        _zk_standalone(directory, port, tick_ms, creds)
        return
    if myid is None or members is None:
        fail("--id and --members go together: give both to run a member of an ensemble")
    if port is not None:
        fail("--port is for a standalone server; a member's client port comes from --members")
    _zk_member(directory, myid, members, tick_ms, creds)


def _zk_standalone(directory: Path, port: int | None, tick_ms: int, creds: Credentials | None = None) -> None:
    from mergetxn.local.zkserver import ZooKeeperServer

    server = ZooKeeperServer(directory, port=port or None, tick_ms=tick_ms, credentials=creds)
    out = console()
    with stop_signals() as stop:
        try:
            address = server.start()
        except (RuntimeError, TimeoutError, OSError) as exc:
            server.stop()
            fail(f"ZooKeeper did not start: {exc}")
        out.print(f"ZooKeeper serving at [bold]{address}[/] (data and logs in {server.workdir})")
        out.print("Ctrl-C stops it.")
        print(f"READY {address}", flush=True)  # the one line a script waits for
        try:
            while not stop.wait(0.5):
                if not server.running:
                    fail(f"ZooKeeper exited unexpectedly; see {server.log_file}")
        finally:
            server.stop()
    out.print("ZooKeeper stopped.")


#: A member's JVM: ZooKeeper holds only metadata here, and a host runs a replica beside it. C1
#: only: a member that restarts (after a crash, a kill by mergetxn chaos) serves again in about
#: half the time on a busy machine, where C2's compiler threads compete with everything else
#: for the cores while the JVM starts; ZooKeeper's work here never needs C2's code.
MEMBER_JVM_FLAGS = ("-Xms16m", "-Xmx192m", "-XX:TieredStopAtLevel=1")


def _zk_member(directory: Path, myid: int, members_text: str, tick_ms: int, creds: Credentials | None = None) -> None:
    """One member of an ensemble, in the foreground until SIGTERM/SIGINT. A member without a
    quorum is not an error (its peers may start later): it waits, and says READY once it
    serves."""
    from mergetxn.local.zkserver import ZooKeeperMember, parse_members

    try:
        members = parse_members(members_text)
    except ValueError as exc:
        fail(f"bad --members: {exc}")
    if myid > len(members):
        fail(f"--id {myid} names no member: --members lists {len(members)}")
    member = ZooKeeperMember(directory, myid, members, tick_ms, jvm_flags=MEMBER_JVM_FLAGS, credentials=creds)
    out = console()
    with stop_signals() as stop:
        try:
            member.start(wait=False)
        except (RuntimeError, OSError) as exc:
            member.stop()
            fail(f"ZooKeeper member {myid} did not start: {exc}")
        out.print(
            f"ZooKeeper member {myid} of {len(members)} started at [bold]{member.address}[/] "
            f"(data and logs in {member.workdir}); waiting for a quorum. Ctrl-C stops it."
        )
        sys.stdout.flush()
        serving = False
        try:
            while not stop.wait(0.2):
                if not member.running:
                    fail(f"ZooKeeper member {myid} exited unexpectedly; see {member.log_file}")
                if not serving and member.mode() is not None:
                    serving = True
                    if creds is not None:  # every member does it (idempotent): / under the identity's ACL
                        from mergetxn.local.zkserver import harden_root

                        harden_root(member.address, creds)
                    print(f"READY {member.address}", flush=True)
        finally:
            member.stop()
    out.print(f"ZooKeeper member {myid} stopped.")


@click.group()
def replica() -> None:
    """Run a replica process."""


def _load_config(ctx: click.Context, param: click.Parameter, path: Path | None) -> Path | None:
    """``--config FILE``: a TOML file of replica settings (names as the flags', with _ or -),
    used as the defaults of the flags; flags and environment variables override it."""
    if path is None:
        return None
    import tomllib

    from replicas.settings import SETTINGS

    try:
        with open(path, "rb") as f:
            values = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}", ctx=ctx, param=param) from None
    by_flag = {s.option[2:]: name for name, s in SETTINGS.items()}
    defaults = {}
    for key, value in values.items():
        name = by_flag.get(key.replace("_", "-"), key.replace("-", "_"))
        if name not in SETTINGS or isinstance(value, (dict, list)):
            known = ", ".join(s.option[2:] for s in SETTINGS.values())
            raise click.BadParameter(f"{path}: unknown replica setting {key!r}; known: {known}", ctx=ctx, param=param)
        defaults[name] = value
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return path


@replica.command("start")
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    is_eager=True,
    expose_value=False,
    callback=_load_config,
    metavar="FILE",
    help='A TOML file of settings (e.g. zk = "h:2181", storage = "s3://b/w", port = 7070); '
    "flags and MERGETXN_* variables override it.",
)
@click_options
def replica_start(**values: Any) -> None:
    """Run a replica in the foreground: follows the CSN log, runs transactions, serves snapshots.

    Prints READY <host:port> once it serves (and METRICS <url> first with --metrics-port);
    Ctrl-C or SIGTERM stops it cleanly, SIGHUP reopens --log-file. Refused (exit 2, nothing
    registered) when a live replica holds --host-id, a port is in use or --storage is not the
    cluster's; exits 5 when ZooKeeper does not answer at --zk within --zk-connect-timeout.
    """
    from coordinator.core.versions import check_host_id
    from replicas.server import run
    from replicas.settings import ReplicaConfig

    host_id = values["host_id"]
    try:
        check_host_id(host_id)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    config = ReplicaConfig(**values)
    console(stderr=True).print(
        f"replica {host_id}: ZooKeeper {redact(config.zk)}, storage {redact(config.storage_url)}, WAL in "
        f"{config.data_dir}",
        soft_wrap=True,
    )
    try:
        run(config)
    except MergetxnError:
        raise
    except Exception as exc:  # e.g. ZooKeeper unreachable: one line, not a traceback
        log.debug("replica failed", exc_info=True)
        fail(f"replica {host_id} failed: {type(exc).__name__}: {exc}", EXIT_UNAVAILABLE)


@replica.command("retire")
@click.argument("host_id", metavar="ID")
@zookeeper_location("Ask this (other) replica where ZooKeeper is")
@credentials_option("its ZooKeeper nodes are the replicas' identity's only.")
@timeout_option
def replica_retire(
    host_id: str, replica: str | None, zk_hosts: str | None, root: str, credentials: Path | None
) -> None:
    """Retire replica ID for good: `status` stops counting it, and no transaction it began can
    commit any more. Refused (exit 2) for an ID that breaks the host-id rule, while it is alive
    (stop it first) or if no replica ID is registered. Starting a replica with that --host-id
    again registers it anew.
    """
    from coordinator.core.versions import check_host_id
    from mergetxn.tools.status import retire

    try:  # before ZooKeeper: an empty id would name the registrations' own node
        check_host_id(host_id)
    except ValueError as exc:
        raise InvalidInput(f"replica retire: {exc}; give the --host-id the replica ran with", host_id=host_id) from None
    creds = zookeeper_access(replica, zk_hosts, credentials)
    if zk_hosts is None:
        assert replica is not None  # zookeeper_access refused neither
        info = ask(replica, lambda client: client.call("info"))
        if "zk" not in info:
            raise click.UsageError(f"replica {replica} tells ZooKeeper's address to admins only: give --zk HOSTS")
        zk_hosts, root = info["zk"], info["root"]
    incarnation = retire(zk_hosts, root, host_id, call_timeout(), creds)
    say(
        f"replica {host_id} retired (its incarnation {incarnation} is fenced); `mergetxn status` no longer counts it",
        soft_wrap=True,
    )
