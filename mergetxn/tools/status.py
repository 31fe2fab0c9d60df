"""``mergetxn status``: one look at a whole cluster, and whether it is healthy.

Gathered from three places, each asked with a time limit so that nothing that hangs can hang
the check:

* **ZooKeeper's members** (from the connection string): each is asked ``srvr`` (a four-letter
  command, whitelisted by ``mergetxn zk start``; the only one a secured server answers, over TLS
  checked against the cluster CA) for its mode; a member that does not answer is down.
* **ZooKeeper's data** (read only): the replicas registered under ``<root>/replicas`` and the
  alive node each live one publishes (coordinator/zk/alive.py), the log's end and size, the
  checkpoint node, cleanup's watermark.
* **Every replica's** ``info`` (replicas/replica.py): applied CSN, lag behind the log in entries
  and seconds, the oldest snapshot in use there and its holder, running transactions, WAL and
  checkpoint sizes, the last cleanup pass, its ZooKeeper session.

The report is plain data (:func:`gather`); ``problems`` lists what makes it unhealthy: a
ZooKeeper member down or ZooKeeper unreachable, a ZooKeeper node the replicas need missing (the
fence, the users, the log) or committed entries deleted from the log (coordinator/zk/needed.py;
each replica says so too), a registered replica without an alive node
(down) or one that does not answer, a replica without a ZooKeeper session or stopped at a log
entry it cannot apply (one that does not parse, or one missing below the end of the log: the
message names the node), a replica lagging more than ``max_lag_seconds``, and a part file that a
read may need missing from storage or of another size (``mergetxn check`` reads every file).
"""

from __future__ import annotations

import logging
import re
import ssl
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from coordinator.core.errors import InvalidInput, MergetxnError
from coordinator.core.versions import csn_of

if TYPE_CHECKING:
    from kazoo.client import KazooClient

    from coordinator.model.records import AliveRecord
    from coordinator.model.znodes import Marks
    from coordinator.zk.log import CsnLog

log = logging.getLogger(__name__)


def _members(hosts: str) -> list[tuple[str, int]]:
    """``h1:2181,h2:2181/chroot`` as (host, port) pairs."""
    out = []
    for item in hosts.split("/", 1)[0].split(","):
        item = item.strip()
        if not item:
            continue
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            host, port = item, "2181"
        out.append((host.strip("[]"), int(port)))
    return out


def member_status(host: str, port: int, timeout: float, context: ssl.SSLContext | None = None) -> dict[str, Any]:
    """One ZooKeeper member's ``srvr`` answer: its mode (standalone, leader, follower), or why
    it is down. ``context``: a secured cluster's ZooKeeper answers over TLS only."""
    from mergetxn.local.zkserver import four_letter_word

    out: dict[str, Any] = {"address": f"{host}:{port}", "mode": None, "ok": False}
    try:
        reply = four_letter_word(host, port, "srvr", timeout, context)
    except OSError as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    for key, pattern in (
        ("mode", r"^Mode: (\w+)"),
        ("zxid", r"^Zxid: (\S+)"),
        ("nodes", r"^Node count: (\d+)"),
        ("connections", r"^Connections: (\d+)"),
    ):
        m = re.search(pattern, reply, re.MULTILINE)
        if m:
            out[key] = int(m.group(1)) if m.group(1).isdigit() else m.group(1)
    out["ok"] = out["mode"] is not None
    if not out["ok"]:
        out["error"] = reply.strip().splitlines()[0] if reply.strip() else "no answer to srvr"
    return out


Connect = Callable[[str, float], AbstractContextManager[Any]]


def _client(address: str, timeout: float) -> AbstractContextManager[Any]:
    from mergetxn.client.client import Client

    return Client(address, timeout=timeout)


def replica_info(address: str, timeout: float, connect: Connect = _client) -> dict[str, Any]:
    """A replica's ``info`` within ``timeout``, or ``{"error": ...}``; ``connect(address,
    timeout)`` gives a client as a context manager (the command line's, with its credentials)."""
    try:
        with connect(address, timeout) as client:
            info = client.call("info")
    except MergetxnError as exc:
        log.debug("replica at %s: %s", address, exc.message)
        return {"error": exc.message}
    except OSError as exc:
        log.debug("replica at %s: %r", address, exc)
        return {"error": f"{type(exc).__name__}: {exc}"}
    log.debug(
        "replica %s at %s: applied %s, lag %s", info.get("host_id"), address, info.get("applied_csn"), info.get("lag")
    )
    return info


def storage_check(address: str, timeout: float, connect: Connect = _client) -> dict[str, Any]:
    """The quick storage check (presence and sizes) of every table through one replica."""
    try:
        with connect(address, timeout) as client:
            return client.call("check", checksums=False)
    except MergetxnError as exc:
        return {"error": exc.message}
    except OSError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def _read_zookeeper(hosts: str, root: str, timeout: float, credentials: Any = None) -> dict[str, Any]:
    """What ZooKeeper holds about the cluster (read only). ``credentials``: a secured cluster's
    (:class:`coordinator.wire.security.Credentials`), whose digest identity its nodes' ACLs require."""
    from coordinator.core.errors import ReplicaUnavailable
    from coordinator.zk.alive import read_alive
    from coordinator.zk.alive import registered as registered_hosts
    from coordinator.zk.log import CsnLog
    from coordinator.zk.needed import find_missing

    try:
        zk = _started(hosts, timeout, credentials)
    except ReplicaUnavailable as exc:
        return {"error": exc.message}
    try:
        layout = CsnLog(zk, root)
        if zk.exists(layout.log_path()) is None:
            return {"error": f"no mergetxn cluster at {hosts} under {layout.root} (no {layout.log_path()})"}
        registered = registered_hosts(zk, layout) if zk.exists(layout.replicas_path()) else []
        alive = read_alive(zk, layout)
        end, entries, epochs = _log_extent(zk, layout)
        tail, _ = layout.read_tail()
        gc = _cleanup_marks(zk, layout)
        return {
            "missing": find_missing(zk, layout, credentials is not None) if registered else [],
            "registered": registered,
            "alive": _alive_view(alive),
            "log": {
                "end_csn": end,
                "entries": entries,
                "epochs": epochs,
                "retained": int(tail.get("retained", 0)) if tail else 0,
                "checkpoint": None if not tail else {k: tail.get(k) for k in ("csn", "path", "time")},
                "cleanup_watermark": None if gc is None else gc.watermark,
                "cleanup_collected": None if gc is None else gc.collected,
            },
        }
    except Exception as exc:  # the session went away meanwhile
        return {"error": f"cannot read ZooKeeper {hosts}: {type(exc).__name__}: {exc}"}
    finally:
        _stop(zk)


def _started(hosts: str, timeout: float, credentials: Any = None) -> KazooClient:
    """A ZooKeeper client connected within ``timeout`` (ReplicaUnavailable if not), with a
    secured cluster's digest identity when given ``credentials``."""
    from kazoo.client import KazooClient
    from kazoo.retry import KazooRetry

    from coordinator.core.errors import ReplicaUnavailable
    from coordinator.wire.security import zk_client_args

    zk = KazooClient(
        hosts=hosts,
        timeout=timeout,
        connection_retry=KazooRetry(max_tries=-1, max_delay=0.5),
        command_retry=KazooRetry(max_tries=2, delay=0.05),
        **zk_client_args(credentials),
    )
    try:
        zk.start(timeout=timeout)
    except Exception as exc:  # kazoo's timeout, or a bad connection string
        _stop(zk)
        raise ReplicaUnavailable(f"cannot connect to ZooKeeper {hosts}: {type(exc).__name__}: {exc}") from None
    return zk


def _stop(zk: KazooClient) -> None:
    try:
        zk.stop()
        zk.close()
    except Exception:  # pragma: no cover - giving up anyway
        pass


def _log_extent(zk: KazooClient, layout: CsnLog) -> tuple[int, int, int]:
    """The log's end CSN (the last one given out), its entries and its epochs, from the epochs' stats."""
    from coordinator.zk.log import given_out

    end, entries, epochs = 0, 0, 0
    for e in layout.epochs():
        stat = zk.exists(layout.epoch_path(e))
        if stat is None:
            continue
        epochs += 1
        entries += stat.numChildren
        if given_out(stat) > 0:  # the last sequence number the epoch gave out
            end = max(end, csn_of(e, given_out(stat) - 1))
    return end, entries, epochs


def _cleanup_marks(zk: KazooClient, layout: CsnLog) -> Marks | None:
    """The cleanup's marks (watermark, collected), or None when there are none or they are unreadable."""
    from kazoo.exceptions import NoNodeError

    from coordinator.core.errors import CorruptMetadata
    from coordinator.model.znodes import Marks

    try:
        gc: Marks | None = Marks.decode(zk.get(layout.gc_path())[0], layout.gc_path())
    except (NoNodeError, CorruptMetadata):
        gc = None
    return gc


def _alive_view(alive: dict[str, AliveRecord]) -> dict[str, dict[str, Any]]:
    """Each live replica's registration as status reports it."""
    return {
        h: {
            "address": r.address,
            "applied": r.applied,
            "oldest_snapshot": r.oldest_snapshot,
            "snapshots": [list(p) for p in r.snapshots],
            "running": len(r.running),
            "running_overflow": r.running_overflow,
            "malformed": r.malformed,
        }
        for h, r in alive.items()
    }


def retire(hosts: str, root: str, host_id: str, timeout: float, credentials: Any = None) -> int:
    """Retire replica ``host_id`` for good (coordinator/zk/alive.py, :func:`~coordinator.zk.alive.retire`):
    refused (InvalidInput) while it is alive or if it was never registered; ReplicaUnavailable
    when ZooKeeper does not answer within ``timeout``. Returns the incarnation it fenced."""
    from coordinator.zk.alive import retire as retire_host
    from coordinator.zk.log import CsnLog

    zk = _started(hosts, timeout, credentials)
    try:
        layout = CsnLog(zk, root)
        if zk.exists(layout.log_path()) is None:
            raise InvalidInput(f"no mergetxn cluster at {hosts} under {layout.root}", root=layout.root)
        return retire_host(zk, layout, host_id)
    finally:
        _stop(zk)


def gather(
    replica: str | None,
    zk_hosts: str | None,
    root: str = "/mergetxn",
    timeout: float = 10.0,
    max_lag_seconds: float = 30.0,
    ignore: tuple[str, ...] = (),
    connect: Connect = _client,
    credentials: Any = None,
    storage: bool = True,
) -> dict[str, Any]:
    """The cluster's status as plain data (see the module docstring): ``healthy`` and
    ``problems`` first, then ``zookeeper``, ``log``, ``replicas`` (by host id), and the
    cluster-wide ``oldest_snapshot``, ``running_transactions`` and ``last_cleanup``.
    ``ignore``: host ids of replicas retired for good (their registration stays in ZooKeeper).
    ``storage``: check that every part file a read may need is in storage, of its size
    (replicas/storage_check.py, through the first replica that answers; no file is read)."""
    problems: list[str] = []
    report: dict[str, Any] = {
        "healthy": False,
        "problems": problems,
        "checked_at": time.time(),
        "max_lag_seconds": max_lag_seconds,
    }
    infos: dict[str, dict] = {}  # by address
    if replica is not None:
        zk_hosts, root = _ask_given_replica(replica, zk_hosts, root, timeout, connect, infos, problems)
    report["zookeeper"] = {"hosts": zk_hosts, "root": root, "members": []}
    found: dict[str, Any] = {}
    if zk_hosts is not None:
        found = _gather_zookeeper(zk_hosts, root, timeout, credentials, report["zookeeper"], problems)
    report["log"] = found.get("log")
    replicas = _replica_rows(found, infos, ignore, timeout, connect)
    _replica_problems(replicas, max_lag_seconds, problems)
    report["replicas"] = replicas
    ok = [r for r in replicas.values() if r["state"] == "ok"]
    report.update(_cluster_wide(ok))
    if ok and storage:
        report["storage"] = storage_check(ok[0]["address"], timeout, connect)
        problems.extend(_storage_problems(report["storage"], ok[0]["host_id"]))
    if replica is None and zk_hosts is None:
        problems.append("nothing to check: give --replica or --zk")
    report["healthy"] = not problems
    return report


def _ask_given_replica(
    replica: str,
    zk_hosts: str | None,
    root: str,
    timeout: float,
    connect: Connect,
    infos: dict[str, dict],
    problems: list[str],
) -> tuple[str | None, str]:
    """Ask the replica named on the command line first (into ``infos``); returns the ZooKeeper
    hosts and root to read: the given ones, else those the replica's info names."""
    first = replica_info(replica, timeout, connect)
    infos[replica] = first
    if "error" in first:
        problems.append(f"replica at {replica} does not answer: {first['error']}")
    elif zk_hosts is None:
        return first.get("zk"), first.get("root", root)  # an admin's info only names them
    return zk_hosts, root


def _gather_zookeeper(
    zk_hosts: str, root: str, timeout: float, credentials: Any, zookeeper: dict[str, Any], problems: list[str]
) -> dict[str, Any]:
    """Every ZooKeeper member's state (into ``zookeeper["members"]``) and what the cluster's
    nodes say (returned), asked at once; their troubles appended to ``problems``."""
    from coordinator.wire.security import zk_tls_context

    members = _members(zk_hosts)
    with ThreadPoolExecutor(max_workers=max(1, len(members) + 1)) as pool:
        # Secured: TLS only, presenting the replica certificate (ZooKeeper serves its holders only).
        context = None if credentials is None else zk_tls_context(credentials)
        states = [pool.submit(member_status, h, p, min(timeout, 5.0), context) for h, p in members]
        read = pool.submit(_read_zookeeper, zk_hosts, root, timeout, credentials)
        zookeeper["members"] = [f.result() for f in states]
        found: dict[str, Any] = read.result()
    for m in zookeeper["members"]:
        if not m["ok"]:
            problems.append(f"ZooKeeper member {m['address']} is down: {m.get('error', 'no mode')}")
    if "error" in found:
        problems.append(found["error"])
    problems.extend(found.get("missing", ()))  # needed nodes gone, holes in the log
    return found


def _replica_rows(
    found: dict[str, Any], infos: dict[str, dict], ignore: tuple[str, ...], timeout: float, connect: Connect
) -> dict[str, dict]:
    """One row per replica, by host id: every registered or alive one (asked at once), then a
    replica asked directly that the ZooKeeper read does not (yet) name."""
    alive: dict[str, dict] = found.get("alive", {})
    hosts = sorted(set(found.get("registered", ())) | set(alive))
    addresses = {h: alive[h]["address"] for h in hosts if h in alive and alive[h]["address"]}
    with ThreadPoolExecutor(max_workers=max(1, len(addresses))) as pool:
        ask = _in_callers_context(replica_info)
        asked = {a: pool.submit(ask, a, timeout, connect) for a in addresses.values() if a not in infos}
        infos.update({a: f.result() for a, f in asked.items()})
    replicas: dict[str, dict] = {}
    for h in hosts:
        info = infos.get(addresses.get(h, ""), {}) if h in addresses else {}
        replicas[h] = _replica_row(h, addresses.get(h), h in alive, h in ignore, info)
    for address, info in infos.items():  # --replica not (yet) registered in the ZooKeeper read
        if "error" not in info and info["host_id"] not in replicas:
            replicas[info["host_id"]] = {
                "host_id": info["host_id"],
                "address": address,
                "alive": None,
                "ignored": info["host_id"] in ignore,
                "state": "ok",
                **_from_info(info),
            }
    return replicas


def _replica_row(h: str, address: str | None, alive: bool, ignored: bool, info: dict) -> dict[str, Any]:
    """A registered replica's row: down (no alive node), unreachable, or ok with its info."""
    row: dict[str, Any] = {"host_id": h, "address": address, "alive": alive, "ignored": ignored}
    if not alive:
        row["state"] = "down"
        row["error"] = (
            "registered, but no alive node (stopped, or its ZooKeeper session expired; retire it for good with `mergetxn replica retire`)"
        )
    elif "error" in info:
        row["state"] = "unreachable"
        row["error"] = info["error"]
    else:
        row.update(_from_info(info))
        row["state"] = "ok"
    return row


def _replica_problems(replicas: dict[str, dict], max_lag_seconds: float, problems: list[str]) -> None:
    """Append to ``problems`` what is wrong with each replica not ignored, in host-id order (a
    replica's ``missing`` not repeated when ``problems`` already says it)."""
    for h, row in sorted(replicas.items()):
        if row["ignored"]:
            continue
        if row["state"] != "ok":
            problems.append(
                f"replica {h}{' at ' + row['address'] if row.get('address') else ''} is {row['state']}: {row['error']}"
            )
            continue
        if not row["zk_connected"]:
            problems.append(f"replica {h} has no usable ZooKeeper session ({row['zk_state']})")
        if row["log_failure"]:
            problems.append(f"replica {h} stopped applying the log: {row['log_failure']}")
        problems.extend(f"replica {h} says: {m}" for m in row["missing"] if m not in problems)
        if row["lag_seconds"] > max_lag_seconds:
            problems.append(
                f"replica {h} lags {row['lag_seconds']:.1f}s ({row['lag_entries']} entries) behind "
                f"the log, more than {max_lag_seconds:g}s"
            )


def _cluster_wide(ok: list[dict]) -> dict[str, Any]:
    """The cluster-wide part of the report, from the replicas that answered."""
    oldest = min(ok, key=lambda r: r["oldest_snapshot"]["snapshot"], default=None)
    cleaned = [r for r in ok if r["cleanup"]["last_at"] is not None]
    last = max(cleaned, key=lambda r: r["cleanup"]["last_at"], default=None)
    return {
        "oldest_snapshot": None if oldest is None else {**oldest["oldest_snapshot"], "host": oldest["host_id"]},
        "running_transactions": sum(r["running_transactions"] for r in ok),
        "transactions": {
            kind: sorted(
                ({**t, "host": r["host_id"]} for r in ok for t in r["transactions"][kind]),
                key=lambda t: -t["age_seconds"],
            )
            for kind in ("long_running", "orphaned")
        },
        "last_cleanup": None if last is None else {"host": last["host_id"], **last["cleanup"]},
    }


def _storage_problems(checked: dict[str, Any], through: str) -> list[str]:
    """What the storage check (made through replica ``through``) found, ten parts a table at most."""
    problems = []
    if "error" in checked:
        problems.append(f"storage check through replica {through} failed: {checked['error']}")
    for t in checked.get("tables", ()):
        for p in t["problems"][:10]:
            problems.append(
                f"table {t['table']!r}: part {p['part']}: {p['problem']} (reads of it fail; "
                f"mergetxn check {t['table']} lists every one)"
            )
    return problems


def _in_callers_context(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run with the caller's click context pushed: the command line's ``connect`` takes
    the credentials (``--credentials``) from it, and click keeps contexts per thread, so the
    pool's threads would connect without them (every replica but the first "unreachable")."""
    import click
    from click.globals import pop_context, push_context

    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return fn

    def run(*args: Any) -> Any:
        push_context(ctx)
        try:
            return fn(*args)
        finally:
            pop_context()

    return run


def _from_info(info: dict) -> dict[str, Any]:
    log = info.get("log") or {}
    return {
        "applied_csn": info.get("applied_csn", info.get("snapshot")),
        "lag_entries": (info.get("lag") or {}).get("entries", 0),
        "lag_seconds": (info.get("lag") or {}).get("seconds", 0.0),
        "running_transactions": info.get("running_transactions", 0),
        "oldest_snapshot": info.get("oldest_snapshot") or {"snapshot": info.get("snapshot"), "holder": "?"},
        "wal_bytes": log.get("wal_bytes"),
        "local_checkpoint_bytes": log.get("local_checkpoint_bytes"),
        "log_end_seen": log.get("end_csn"),
        "cleanup": info.get("cleanup") or {"last_at": None},
        "merges": info.get("merges"),
        "zk_state": info.get("zk_state"),
        "zk_connected": info.get("zk_connected", True),
        "log_failure": info.get("log_failure"),
        "missing": info.get("missing") or [],  # ZooKeeper nodes it needs that are gone
        "metrics_address": info.get("metrics_address"),
        "committer": info.get("committer"),
        # Long-running and orphaned transactions with their holders (replicas/registry.py notable).
        "transactions": info.get("transactions") or {"long_running": [], "orphaned": []},
    }
