"""The replica's settings, declared once: :class:`ReplicaConfig`.

Each field that a command line may set carries a :class:`Setting` (help, range, command-line flag,
whether it is *tunable*). Everything else is derived from these declarations:

* the options of ``python -m replicas.server`` (:func:`add_arguments`, :func:`from_arguments`) and
  of ``mergetxn replica start`` (:func:`click_options`), with the same names, defaults and ranges;
* the tunable settings (merges, cleanup, the log tail) also take their command-line defaults from
  ``MERGETXN_<NAME>`` environment variables, are what ``LocalCluster(settings={...})`` accepts
  (:func:`check_setting`) and what a replica's ``info`` reports;
* the command line that :class:`coordinator.LocalCluster` gives a replica process
  (:func:`command_line`).

Fields without a :class:`Setting` are set only by code: ``storage_options`` (credentials for s3fs,
never on a command line), ``read_wait_seconds``, and ``credentials``: the replicas' identity
(coordinator/wire/security.py), read from the file named by the ``credentials_file`` setting
(``--credentials FILE`` or ``MERGETXN_CREDENTIALS``); a secret never goes on a command line.
``insecure`` is the one flag without a value (``--insecure``, both command lines): without it, a
replica without credentials refuses a non-loopback ``host`` (protected mode, :func:`is_loopback`).
"""

from __future__ import annotations

import ipaddress
import math
import os
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from coordinator.core.errors import InvalidInput
from coordinator.core.tabledata import DEFAULT_PARTITION_VALUE_BYTES
from coordinator.wire.rpc import AUTH_FRAME, MAX_FRAME, Limits
from coordinator.wire.security import ENV_CREDENTIALS, Credentials
from parts.model.meta import INLINE_MAX_BYTES

# The least grace of unreferenced files, in seconds (replicas/cleanup.py): covers the publication
# lag of running transactions (see leases.RUNNING_MIN_AGE).
MIN_GRACE = 5.0


@dataclass(frozen=True)
class Setting:
    """How one :class:`ReplicaConfig` field is set from outside the process."""

    name: str
    type: type  # int, float, str or Path (``int | None`` fields: int, None allowed)
    default: Any  # dataclasses.MISSING: required
    help: str  # a phrase: lower-case start unless a name, no final stop
    minimum: float | None = None
    maximum: float | None = None
    above: bool = False  # the minimum itself is out of range
    tunable: bool = False
    flag: str = ""  # the command-line name without dashes, when it differs from the field name
    metavar: str | None = None
    envvar: str = ""  # the environment variable giving the default, when not MERGETXN_<NAME> of a tunable
    file: bool = False  # a Path setting naming a file, not a directory

    @property
    def option(self) -> str:
        return "--" + (self.flag or self.name).replace("_", "-")

    @property
    def env(self) -> str | None:
        return self.envvar or ("MERGETXN_" + self.name.upper() if self.tunable else None)

    @property
    def required(self) -> bool:
        return self.default is MISSING

    def range_text(self) -> str:
        if self.maximum is not None:
            return f"from {self.minimum} to {self.maximum}"
        return f"{'more than' if self.above else 'at least'} {self.minimum}"

    def check(self, value: Any) -> Any:
        """``value`` (or its text) as this setting's type, or InvalidInput naming what is wrong."""
        if (value is None or value == "") and self.default is None:
            return None
        if self.type is Path:
            return Path(value)
        if self.type is str:
            if not isinstance(value, str):
                raise InvalidInput(f"replica setting {self.name} must be a string, not {value!r}")
            return value
        try:
            if isinstance(value, bool) or (self.type is int and isinstance(value, float) and not value.is_integer()):
                raise ValueError
            v = self.type(value)
        except (TypeError, ValueError):
            raise InvalidInput(
                f"replica setting {self.name} must be {'an integer' if self.type is int else 'a number'}, not {value!r}"
            ) from None
        low = self.minimum is not None and (v < self.minimum or (self.above and v == self.minimum))
        high = self.maximum is not None and v > self.maximum
        if not math.isfinite(v) or low or high:
            raise InvalidInput(f"replica setting {self.name} must be {self.range_text()}, not {value!r}")
        return v


def _setting(default: Any = MISSING, help: str = "", **spec: Any) -> Any:
    return field(default=default, metadata={"setting": {"help": help, **spec}})


@dataclass(frozen=True, kw_only=True)
class ReplicaConfig:
    zk: str = _setting(help="ZooKeeper connection string (host:port[,host:port...][/chroot])", metavar="HOSTS")
    storage_url: str = _setting(help="part storage: a local path or s3://bucket/prefix", flag="storage", metavar="URL")
    host_id: str = _setting(help="this replica's stable id (letters, digits, _ . -)")
    data_dir: Path = _setting(help="local directory for the WAL")
    port: int = _setting(0, "port (0: a free one)", minimum=0, maximum=65535)
    host: str = _setting("127.0.0.1", "interface to listen on")
    metrics_port: int | None = _setting(
        None,
        "port of the Prometheus metrics endpoint on the same interface (0: a free one; default: no endpoint)",
        minimum=0,
        maximum=65535,
    )
    root: str = _setting("/mergetxn", "ZooKeeper root node")
    epoch_size: int | None = _setting(
        None, "CSNs per epoch before a new epoch starts (default: the maximum)", minimum=1
    )
    txn_max_seconds: float = _setting(3600.0, "a transaction running longer is aborted", minimum=0, above=True)
    txn_max_rows: int = _setting(100_000_000, "a transaction staging more rows is aborted", minimum=1)
    session_timeout: float = _setting(10.0, "ZooKeeper session timeout in seconds", minimum=1)
    zk_connect_timeout: float = _setting(
        10.0,
        "seconds a starting replica waits for ZooKeeper to answer before it gives up (ZooKeeper not "
        "running, or a wrong --zk)",
        minimum=0,
        maximum=3600,
        above=True,
        tunable=True,
    )
    # Tunable: client sessions (replicas/sessions.py).
    client_session_timeout: float = _setting(
        30.0,
        "seconds a client session may go unheard (no heartbeat: its process died, stood still or was cut "
        "off) before its running transactions are aborted",
        minimum=1,
        maximum=3600,
        tunable=True,
    )
    credentials_file: Path | None = _setting(
        None,
        "the replicas' credentials file (mergetxn security init's credentials.json): TLS, users and "
        "grants for clients, ACLs in ZooKeeper",
        flag="credentials",
        metavar="FILE",
        envvar=ENV_CREDENTIALS,
        file=True,
    )
    storage_options: dict | None = field(default=None, repr=False)
    credentials: Credentials | None = field(default=None, repr=False, compare=False)  # from credentials_file
    read_wait_seconds: float = 30.0  # how long a read or commit waits for this replica to apply a CSN
    # Tunable: quotas per user of a secured cluster (replicas/registry.py, replicas/leases.py).
    user_max_transactions: int = _setting(
        1000, "running transactions one user may hold on this replica (secured clusters)", minimum=1, tunable=True
    )
    user_max_read_leases: int = _setting(
        1000, "read leases one user may hold on this replica (secured clusters)", minimum=1, tunable=True
    )
    # Tunable: background merges and cleanup (replicas/merges.py, replicas/cleanup.py).
    merge_interval: float = _setting(
        1.0, "seconds between looks for background merges (0: never)", minimum=0, tunable=True
    )
    merge_min_parts: int = _setting(
        8, "a partition with this many small parts gets a minor merge", minimum=2, tunable=True
    )
    merge_max_parts: int = _setting(64, "at most this many parts go into one merge", minimum=2, tunable=True)
    merge_small_bytes: int = _setting(32 * 1024 * 1024, "parts smaller than this are small", minimum=0, tunable=True)
    major_min_parts: int = _setting(
        2, "an idle partition with this many parts gets a major merge", minimum=2, tunable=True
    )
    major_idle_seconds: float = _setting(
        600.0, "a partition is idle when its newest part is this old", minimum=0, tunable=True
    )
    major_max_bytes: int = _setting(
        256 * 1024 * 1024, "no major merge of a partition larger than this", minimum=0, tunable=True
    )
    gc_interval: float = _setting(
        10.0,
        "seconds between background cleanup passes, or a quarter of the shortest retention window above 0 "
        "when that is shorter, at least 1 (0: never)",
        minimum=0,
        tunable=True,
    )
    gc_grace_seconds: float = _setting(60.0, "unreferenced files younger than this are kept", minimum=0, tunable=True)
    retention_seconds: float = _setting(
        3600.0,
        "removed parts are kept this many seconds after the commit that removed them, so snapshots "
        "and changes within that window stay readable (a table's own retention_seconds overrides it)",
        minimum=0,
        tunable=True,
    )
    # Tunable: backpressure on inserts (replicas/registry.py; docs/rules.md#too-many-parts).
    parts_to_delay_insert: int = _setting(
        150,
        "an insert into a partition holding this many visible parts or more is delayed, longer the closer "
        "the count is to parts_to_throw_insert, at most max_delay_to_insert (0: never; a table's own "
        "parts_to_delay_insert overrides it)",
        minimum=0,
        tunable=True,
    )
    parts_to_throw_insert: int = _setting(
        300,
        "an insert into a partition holding this many visible parts or more is refused with TooManyParts "
        "(0: never; a table's own parts_to_throw_insert overrides it)",
        minimum=0,
        tunable=True,
    )
    max_delay_to_insert: float = _setting(
        1.0,
        "the longest delay of one insert, in seconds (0: inserts are never delayed)",
        minimum=0,
        maximum=60,
        tunable=True,
    )
    # Tunable: small writes without files (parts/io/write.py; docs/architecture/small-writes.md).
    inline_rows: int = _setting(
        100,
        "an insert of at most this many rows per partition whose Parquet is at most inline_bytes travels in "
        "its commit's log entry, without a part file (0: never; a table's own inline_rows overrides it)",
        minimum=0,
        tunable=True,
    )
    inline_bytes: int = _setting(
        16 * 1024,
        "the largest Parquet encoding of an inlined part, in bytes (0: never; a table's own inline_bytes overrides it)",
        minimum=0,
        maximum=INLINE_MAX_BYTES,
        tunable=True,
    )
    inline_flush_parts: int = _setting(
        16,
        "a partition holding this many inlined parts gets them flushed into a part in storage by a merge",
        minimum=1,
        maximum=1000,
        tunable=True,
    )
    inline_flush_bytes: int = _setting(
        1024 * 1024,
        "a partition whose inlined parts hold this many bytes gets them flushed into a part in storage",
        minimum=INLINE_MAX_BYTES,
        maximum=64 * 1024 * 1024,
        tunable=True,
    )
    inline_flush_seconds: float = _setting(
        30.0,
        "a partition whose oldest inlined part is this many seconds old gets its inlined parts flushed",
        minimum=0,
        above=True,
        maximum=86400,
        tunable=True,
    )
    read_lease_seconds: float = _setting(
        300.0,
        "a Spark job's read keeps its snapshot in use this long (a plain read, until it ends)",
        minimum=0,
        tunable=True,
    )
    # Tunable: how long outcomes are remembered (replicas/state.py, tid_csn; replicas/outcomes.py).
    outcome_seconds: float = _setting(
        86400.0,
        "a committed transaction's CSN is remembered this many seconds after its commit; commit_status of an "
        "older one answers unknown (too old to know) unless a part it added or removed is still recorded",
        minimum=1,
        tunable=True,
    )
    # Tunable: the log tail (replicas/checkpoint.py).
    retain_entries: int = _setting(
        5000,
        "the newest log entries kept in ZooKeeper (a replica that fell behind them loads a checkpoint; "
        "what reads may see is retention_seconds')",
        minimum=0,
        tunable=True,
    )
    checkpoint_every: int = _setting(
        1000, "seal the open epoch, checkpoint and trim once it holds this many entries", minimum=1, tunable=True
    )
    local_checkpoint_every: int = _setting(
        5000, "write the local state snapshot and compact the WAL every this many entries", minimum=1, tunable=True
    )
    tail_check_seconds: float = _setting(1.0, "seconds between looks at the log tail", minimum=0.05, tunable=True)
    # Tunable: the metadata one commit adds to the log, every WAL and every replica's memory
    # (replicas/committer.py refuses a larger one with InvalidInput; docs/guarantees.md).
    max_commit_bytes: int = _setting(
        64 * 1024 * 1024,
        "a transaction (or DDL) whose log entry record is larger is refused at commit",
        minimum=64 * 1024,
        tunable=True,
    )
    # Tunable: a partition value's bound (coordinator/core/tabledata.py; replicas/registry.py refuses a
    # longer one at stage, clients before they write a file; docs/rules.md#partition-values).
    max_partition_value_bytes: int = _setting(
        DEFAULT_PARTITION_VALUE_BYTES,
        "the longest partition value a write may have, in bytes (a string's UTF-8); a longer one is "
        "refused with an error naming the column and this limit",
        minimum=64,
        maximum=64 * 1024,
        tunable=True,
    )
    # Tunable: what clients may hold of the replica (coordinator/wire/rpc.py, Limits).
    max_frame_bytes: int = _setting(
        64 * 1024 * 1024,
        "the largest request an authenticated client may send, in bytes (a larger one is "
        "refused with an error naming this limit)",
        minimum=AUTH_FRAME,
        maximum=MAX_FRAME,
        tunable=True,
    )
    max_connections: int = _setting(
        1024,
        "client connections open at once (fewer if the descriptor limit leaves less room); more are closed at once",
        minimum=1,
        tunable=True,
    )
    max_connections_per_peer: int = _setting(
        256, "client connections open at once from one address (an IPv6 /64)", minimum=1, tunable=True
    )
    idle_seconds: float = _setting(
        300.0,
        "a client connection without a request in progress this long is closed (clients reconnect by themselves)",
        minimum=0,
        above=True,
        tunable=True,
    )
    handshake_seconds: float = _setting(
        10.0,
        "a client connection whose first request (on a secured replica: its login) has not arrived "
        "whole this long after it connected is closed",
        minimum=0,
        above=True,
        maximum=3600,
        tunable=True,
    )
    max_pending_connections: int = _setting(
        256,
        "client connections open at once whose first request (login) has not arrived yet (at most half of "
        "max_connections); when full, a new connection closes the oldest of the address holding most",
        minimum=1,
        tunable=True,
    )
    max_pending_per_peer: int = _setting(
        64,
        "the same from one address (at most half of max_connections_per_peer); when full, a new "
        "connection from it closes its oldest",
        minimum=1,
        tunable=True,
    )
    # Not a Setting (a flag without a value): serve unsecured on a non-loopback --host anyway.
    insecure: bool = False

    def __post_init__(self) -> None:
        if self.credentials is None and self.credentials_file is not None:
            object.__setattr__(self, "credentials", Credentials.from_file(self.credentials_file))
        c = self.credentials
        if c is not None and (c.cert_file is None or c.ca_file is None):
            raise InvalidInput(
                f"credentials file {self.credentials_file or ''}: a replica needs ca_file, cert_file "
                "and key_file (the replicas' file from mergetxn security init, not the clients')"
            )
        if c is None and not self.insecure and not is_loopback(self.host):
            raise InvalidInput(
                f"refusing to serve without TLS or authentication on {self.host or 'every interface'!r} (protected "
                "mode): anyone who reaches that address could read, write and drop every table. Start it with "
                "--credentials FILE (mergetxn security init), or listen on a loopback address (--host 127.0.0.1), "
                "or pass --insecure if this network is trusted"
            )

    def limits(self) -> Limits:
        """What clients may hold of this replica (coordinator/wire/rpc.py): each field of
        :class:`Limits` is the setting of its name."""
        return Limits(**{f.name: getattr(self, f.name) for f in fields(Limits)})


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` serves this machine only: ``localhost`` or a loopback
    address. Any other name counts as routable (it is not resolved: a name may change)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


INSECURE_HELP = (
    "serve without --credentials on a non-loopback --host (protected mode refuses that "
    "otherwise): only on a network where every peer is trusted"
)


def _settings() -> dict[str, Setting]:
    hints = typing.get_type_hints(ReplicaConfig)
    out = {}
    for f in fields(ReplicaConfig):
        if "setting" in f.metadata:
            typ = next(t for t in typing.get_args(hints[f.name]) or (hints[f.name],) if t is not type(None))
            out[f.name] = Setting(name=f.name, type=typ, default=f.default, **f.metadata["setting"])
    return out


SETTINGS: dict[str, Setting] = _settings()
TUNABLE: tuple[str, ...] = tuple(name for name, s in SETTINGS.items() if s.tunable)


def check_setting(name: str, value: Any) -> Any:
    """The value of tunable setting ``name`` as its type, or InvalidInput naming what is wrong."""
    if name not in TUNABLE:
        raise InvalidInput(f"unknown replica setting {name!r}; known: {', '.join(TUNABLE)}")
    return SETTINGS[name].check(value)


def tunables(config: ReplicaConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in TUNABLE}


def command_line(values: Mapping[str, Any]) -> list[str]:
    """Options of ``python -m replicas.server`` for setting ``values`` (None: left out)."""
    argv: list[str] = []
    for name, value in values.items():
        if value is not None:
            argv += [SETTINGS[name].option, str(value)]
    return argv


def add_arguments(parser: Any) -> None:
    """An argparse option per setting (``python -m replicas.server``)."""
    import argparse

    def parse(s: Setting) -> Callable[[str], Any]:
        def convert(text: str) -> Any:
            try:
                return s.check(text)
            except InvalidInput as exc:
                raise argparse.ArgumentTypeError(exc.message) from None

        return convert

    for s in SETTINGS.values():
        if s.required:
            parser.add_argument(s.option, dest=s.name, type=parse(s), required=True, metavar=s.metavar, help=s.help)
            continue
        default = os.environ.get(s.env, s.default) if s.env else s.default
        parser.add_argument(
            s.option,
            dest=s.name,
            type=parse(s),
            default=default,
            metavar=s.metavar,
            help=f"{s.help} (default {s.default}{f'; env {s.env}' if s.env else ''})",
        )
    parser.add_argument("--insecure", action="store_true", help=INSECURE_HELP)


def from_arguments(args: Any) -> ReplicaConfig:
    return ReplicaConfig(**{name: getattr(args, name) for name in SETTINGS}, insecure=bool(args.insecure))


def _whole(bound: float | None) -> int | None:
    """An integer setting's bound as click's IntRange takes it."""
    return None if bound is None else int(bound)


def click_options(command: Callable) -> Callable:
    """A click option per setting (``mergetxn replica start``), each passed by its field name."""
    import click

    command = click.option(
        "--insecure", "insecure", is_flag=True, default=False, help=INSECURE_HELP[0].upper() + INSECURE_HELP[1:] + "."
    )(command)
    for s in reversed(SETTINGS.values()):
        if s.type is int:
            kind: Any = click.IntRange(min=_whole(s.minimum), max=_whole(s.maximum), min_open=s.above)
        elif s.type is float:
            kind = click.FloatRange(min=s.minimum, max=s.maximum, min_open=s.above)
        elif s.type is Path:
            kind = click.Path(file_okay=s.file, dir_okay=not s.file, path_type=Path)
        else:
            kind = None
        text = s.help[0].upper() + s.help[1:] + (f" (env {s.env})." if s.env else ".")
        default = None if s.required else s.default
        command = click.option(
            s.option,
            s.name,
            type=kind,
            required=s.required,
            default=default,
            envvar=s.env,
            show_default=default is not None,
            metavar=s.metavar,
            help=text,
        )(command)
    return command
