"""The nemesis: faults at random times, from a seed, on the targets a cluster form supports.

Three lanes inject faults at once, each: pick a kind (among those allowed and supported) and a
target whose resources no other lane holds, inject, hold 0.3-2 s, heal, then measure recovery:
the time until every replica (but those another lane is faulting) commits a tiny probe
transaction into the table ``probe`` (which the checker ignores). Resources keep the
combinations sane: one network fault at a time (``heal()`` undoes all of them), one fault at a
time that touches the ZooKeeper quorum (never two members down, or a member down during a
split), one fault per replica and never every replica at once (clients always have one to fail
over to), one Spark executor at a time.

Kinds are drawn at random, except that a kind injected fewer than :data:`MIN_EACH` times comes
first whenever its resources are free, the least injected first: a short campaign still holds
every kind it asked for, and a kind that shares its resource with another (``s3-errors`` and
``s3-timeouts``) comes at that resource's next turn.
With ``max_faults`` the lanes stop after that many faults (:attr:`Nemesis.finished` is set once
they all ended, healed and measured).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import pyarrow as pa

from coordinator.core import retries
from coordinator.core.errors import InvalidInput
from mergetxn.chaos.history import Fault
from mergetxn.chaos.plan import Plan, doing
from mergetxn.chaos.workloads import PROBE_SCHEMA, Recorder
from mergetxn.client.client import Client

HOLD = (0.3, 2.0)  # seconds a fault stays before it is healed
PAUSE = (0.0, 0.3)  # seconds a lane waits between faults
RECOVERY_LIMIT = 60.0  # a replica that commits no probe in this long after a heal: not recovered
PROBE_TIMEOUT = (
    2.0  # a probe commit takes milliseconds; one stuck on a replica another lane froze must not hold the lane
)
LANES = 3
MIN_EACH = 3  # every kind this many times before the draw is uniform
# Kinds whose fault is over when it is injected: no hold (a killed client is dead, an expiry
# blocks until the session expired and came back, a killed executor is replaced by its worker).
NO_HOLD = frozenset({"kill-client", "expire-session", "kill-executor"})


class ChaosCluster(Protocol):
    """What the nemesis and the run need of a cluster form (hosts.py's clusters and
    run.SingleHostCluster)."""

    hosts: int
    replica_addresses: list[str]

    def supports(self) -> set[str]: ...
    def kill_replica(self, i: int) -> None: ...
    def start_replica(self, i: int) -> Any: ...
    def pause_replica(self, i: int) -> None: ...
    def resume_replica(self, i: int) -> None: ...
    def replica_running(self, i: int) -> bool: ...


# Every kind, in the order the report lists them, with the cluster fault it needs (the names of
# ``supports()``, mergetxn.chaos.hosts.FAULT_KINDS); "kill-client" is the harness's own: any form;
# "kill-executor" needs the Spark workload (the run adds "kill_executor" to what it supports).
NEEDS: dict[str, str | None] = {
    "kill-replica": "kill_replica",
    "pause-replica": "pause_replica",
    "kill-zk": "kill_zk",
    "kill-zk-leader": "kill_zk",
    "isolate": "isolate",
    "partition-majority": "partition",
    "cut-from-zk": "cut_from_zk",
    "bridge": "cut_one_way",
    "slow": "slow|lossy",
    "expire-session": "expire_session",
    "wal-full": "fill_wal_disk",
    "kill-client": None,
    "kill-executor": "kill_executor",
    "s3-errors": "s3_errors",
    "s3-timeouts": "s3_timeouts",  # with S3 storage only: mergetxn.chaos.s3
}
KINDS = list(NEEDS)


# Kinds whose heal (a restart: seconds) runs beside the lane: see Nemesis._heal_in_background.
BACKGROUND_HEAL = frozenset({"kill-zk", "kill-zk-leader", "kill-replica", "kill-executor"})


def can_inject(kind: str, supported: set[str]) -> bool:
    """Whether a form supporting ``supported`` can inject ``kind`` (``a|b``: either will do)."""
    need = NEEDS[kind]
    return need is None or bool(set(need.split("|")) & {s.replace("-", "_") for s in supported})


def choose_kinds(option: str, supported: set[str]) -> tuple[list[str], list[str]]:
    """The kinds ``--nemesis`` asks for (``all``, ``none`` or a comma list) that this form can
    inject, and those ``all`` had to leave out. A kind asked for by name that the form cannot
    inject is an error, not a silent omission."""
    can = [k for k in KINDS if can_inject(k, supported)]
    text = option.strip().lower()
    if text == "none":
        return [], []
    if text == "all":
        return can, [k for k in KINDS if k not in can]
    asked = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in asked if k not in KINDS]
    if unknown:
        raise InvalidInput(f"unknown fault kind(s) {unknown}: choose from {', '.join(KINDS)}, 'all' or 'none'")
    missing = [k for k in asked if k not in can]
    if "kill-executor" in missing:
        raise InvalidInput(
            "fault kind kill-executor kills a Spark executor: it needs the Spark workload "
            "(--workload spark, or --spark)"
        )
    if missing:
        raise InvalidInput(
            f"fault kind(s) {missing} need a cluster form that supports them "
            f"(this one supports {sorted(set(can))}); try --form namespaces"
        )
    return list(dict.fromkeys(asked)), []


class NothingToFault(Exception):
    """Raised by a plan's inject when there was nothing to fault after all (no Spark task ran):
    no fault is recorded or counted."""


class ExecutorFaults(Protocol):
    """The Spark side of the run, for ``kill-executor``."""

    def kill(self, rng: random.Random) -> str:
        """SIGKILL an executor mid-task; returns a detail."""
        ...

    def restore(self) -> None:
        """Return once the killed executor's replacement runs (bounded)."""
        ...


class Prober:
    """Commits one-row transactions into ``probe`` on a replica: "does it serve commits?"."""

    def __init__(self, addresses: Callable[[], list[str]]) -> None:
        self.addresses = addresses
        self.clients: dict[int, Client] = {}
        self.n = 0
        self._count = itertools.count(1)

    def probe(self, i: int) -> int:
        """One probe commit on replica ``i``, given up after :data:`PROBE_TIMEOUT` seconds. It
        runs in a thread of its own because a commit whose answer is lost waits for its outcome
        inside the client library (up to 15 s): a stuck probe is abandoned, with its client."""
        address = self.addresses()[i]
        client = self.clients.get(i)
        if client is None or client.address != address:
            client = self.clients[i] = Client(address, timeout=PROBE_TIMEOUT)
        n = self.n = next(self._count)
        result: list[Any] = []

        def commit() -> None:
            try:
                with client.transaction() as tx:
                    tx.insert("probe", pa.table({"replica": [i], "n": [n]}, schema=PROBE_SCHEMA))
                result.append(tx.csn)
            except BaseException as exc:  # handed to the caller
                result.append(exc)

        thread = threading.Thread(target=commit, name=f"probe-r{i}", daemon=True)
        thread.start()
        thread.join(PROBE_TIMEOUT + 0.5)
        if not result or isinstance(result[0], BaseException):
            self.clients.pop(i, None)
            if not result:  # still running: its thread closes nothing, the client is dropped
                raise TimeoutError(f"probe on replica {i} did not finish in {PROBE_TIMEOUT + 0.5:g}s")
            client.close()
            raise result[0]
        return result[0]

    def wait_serving(
        self, replicas: list[int], limit: float = RECOVERY_LIMIT, skip: Callable[[int], bool] = lambda i: False
    ) -> list[int]:
        """Probe each replica until it commits (bounded), all at once; returns those that never
        did. A replica for which ``skip`` turns true meanwhile (another lane is faulting it) is
        not waited for."""

        class _Skipped(Exception):
            pass

        def attempt(i: int) -> None:
            if skip(i):
                raise _Skipped
            self.probe(i)

        failed: list[int] = []

        def wait(i: int) -> None:
            try:
                retries.until_serving(limit, unless=_Skipped)(attempt, i)
            except _Skipped:
                pass
            except Exception:
                failed.append(i)

        threads = [threading.Thread(target=wait, args=(i,), name=f"probe-wait-r{i}", daemon=True) for i in replicas]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sorted(failed)

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.clients.clear()


class Nemesis:
    """Injects faults in ``lanes`` threads until :meth:`stop`; every fault ends healed."""

    def __init__(
        self,
        cluster: ChaosCluster,
        kinds: list[str],
        seed: int,
        rec: Recorder,
        kill_client: Callable[[int, random.Random], str],
        lanes: int = LANES,
        hold: tuple[float, float] = HOLD,
        replica_names: list[str] | None = None,
        executors: ExecutorFaults | None = None,
        max_faults: int | None = None,
        pause: tuple[float, float] = PAUSE,
    ) -> None:
        """``replica_names``: how targets name replica i (its host id), default ``r<i>``;
        ``executors``: the Spark side, for ``kill-executor``; ``max_faults``: stop after that
        many faults (None: until :meth:`stop`); ``pause``: the range of seconds a lane waits
        between two faults."""
        if "kill-executor" in kinds and executors is None:
            raise InvalidInput("fault kind kill-executor needs the Spark workload")
        self.cluster = cluster
        self.executors = executors
        self.max_faults = max_faults
        self.pause = pause
        self.finished = threading.Event()  # every lane ended (max_faults reached, or stopped)
        self._started: dict[str, int] = {}  # faults begun, by kind
        self._lanes_left = lanes if kinds else 0
        self.replica_names = replica_names or [f"r{i}" for i in range(cluster.hosts)]
        self.kinds = list(kinds)
        self.seed = seed
        self.rec = rec
        self.kill_client = kill_client
        self.hold = hold
        self.faults: list[Fault] = []
        self.errors: list[str] = []  # a fault that could not be injected or healed (reported)
        self._stop = threading.Event()
        self._abort = threading.Event()
        self._lock = threading.Lock()
        self._held: dict[int | str, frozenset[str]] = {}  # by lane, and by a restart under way
        self._healers: list[threading.Thread] = []
        self._tokens = itertools.count()
        self._threads = [
            threading.Thread(target=self._lane, args=(n,), name=f"nemesis-{n}", daemon=True)
            for n in range(lanes if kinds else 0)
        ]
        if not self._threads:
            self.finished.set()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self, timeout: float = 120.0, measure: bool = True) -> None:
        """Stop injecting; each lane heals its current fault and (``measure``) its recovery first.
        An interrupted run does not measure: it only heals, then stops the cluster."""
        if not measure:
            self._abort.set()
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
        for t in list(self._healers):
            t.join(timeout)

    # -- choosing -------------------------------------------------------------------------------
    def _addresses(self) -> list[str]:
        return list(self.cluster.replica_addresses)

    def plans(self, kind: str, rng: random.Random) -> list[Plan]:
        """Every way to inject ``kind`` now (one per target), in random order."""
        planners: dict[str, Callable[[random.Random], list[Plan]]] = {
            "kill-replica": self._kill_replica_plans,
            "pause-replica": self._pause_replica_plans,
            "expire-session": self._expire_session_plans,
            "wal-full": self._wal_full_plans,
            "kill-client": self._kill_client_plans,
            "kill-executor": self._kill_executor_plans,
            "kill-zk": self._kill_zk_plans,
            "kill-zk-leader": self._kill_zk_leader_plans,
            "isolate": self._isolate_plans,
            "partition-majority": self._partition_majority_plans,
            "cut-from-zk": self._cut_from_zk_plans,
            "bridge": self._bridge_plans,
            "slow": self._slow_plans,
            "s3-errors": self._s3_plans(kind),
            "s3-timeouts": self._s3_plans(kind),
        }
        out = planners[kind](rng) if kind in planners else []
        rng.shuffle(out)
        return out

    def _host_names(self) -> list[str]:
        host_name = getattr(self.cluster, "host_name", None)
        return [host_name(i) if host_name else f"host{i}" for i in range(self.cluster.hosts)]

    def _replica_plans(
        self,
        kind: str,
        inject: Callable[[int], str],
        heal: Callable[[int], None],
        extra: frozenset[str] = frozenset(),
    ) -> list[Plan]:
        """One plan per replica, holding that replica (and ``extra``)."""
        return [
            Plan(
                kind,
                self.replica_names[i],
                frozenset({f"replica{i}"}) | extra,
                partial(inject, i),
                partial(heal, i),
                i,
            )
            for i in range(self.cluster.hosts)
        ]

    def _kill_replica_plans(self, rng: random.Random) -> list[Plan]:
        c: Any = self.cluster
        return self._replica_plans(
            "kill-replica", lambda i: (c.kill_replica(i), "SIGKILL")[1], lambda i: c.start_replica(i)
        )

    def _pause_replica_plans(self, rng: random.Random) -> list[Plan]:
        c: Any = self.cluster
        return self._replica_plans(
            "pause-replica", lambda i: (c.pause_replica(i), "SIGSTOP")[1], lambda i: c.resume_replica(i)
        )

    def _expire_session_plans(self, rng: random.Random) -> list[Plan]:
        c: Any = self.cluster
        return self._replica_plans(  # the hosts' forms cut the replica from ZooKeeper: a network fault
            "expire-session",
            lambda i: (c.expire_session(i), "session expired and reconnected")[1],
            lambda i: None,
            frozenset({"net"}),
        )

    def _wal_full_plans(self, rng: random.Random) -> list[Plan]:
        c: Any = self.cluster
        return self._replica_plans(
            "wal-full", lambda i: (c.fill_wal_disk(i), "WAL disk full")[1], lambda i: c.free_wal_disk(i)
        )

    def _kill_client_plans(self, rng: random.Random) -> list[Plan]:
        return self._replica_plans("kill-client", lambda i: self.kill_client(i, rng), lambda i: None)

    def _kill_executor_plans(self, rng: random.Random) -> list[Plan]:
        ex = self.executors
        if ex is None:
            return []
        return [Plan("kill-executor", "executor", frozenset({"spark"}), lambda: ex.kill(rng), ex.restore)]

    def _kill_zk_plans(self, rng: random.Random) -> list[Plan]:
        c: Any = self.cluster
        return [
            Plan(
                "kill-zk",
                f"zk@{hname}",
                frozenset({"zk"}),
                doing(c.kill_zk, i, said="SIGKILL"),
                partial(c.start_zk, i),
            )
            for i, hname in enumerate(self._host_names())
        ]

    def _kill_zk_leader_plans(self, rng: random.Random) -> list[Plan]:
        c: Any = self.cluster
        hname = self._host_names()
        member: dict[str, int] = {}

        def kill_leader() -> str:
            leader = c.zk_leader()
            member["i"] = rng.randrange(self.cluster.hosts) if leader is None else leader
            c.kill_zk(member["i"])
            return f"SIGKILL zk@{hname[member['i']]}" + (" (leader)" if leader is not None else " (no leader known)")

        return [
            Plan(
                "kill-zk-leader",
                "zk-leader",
                frozenset({"zk"}),
                kill_leader,
                lambda: c.start_zk(member["i"]) if "i" in member else None,
            )
        ]

    def _isolate_plans(self, rng: random.Random) -> list[Plan]:
        c: Any = self.cluster
        return [
            Plan(
                "isolate",
                hname,
                frozenset({"net", "zk", f"replica{i}"}),
                doing(c.isolate, i, said="host cut from every other host"),
                c.heal,
            )
            for i, hname in enumerate(self._host_names())
        ]

    def _partition_majority_plans(self, rng: random.Random) -> list[Plan]:
        c: Any = self.cluster
        n = self.cluster.hosts
        hname = self._host_names()
        hosts = list(range(n))
        rng.shuffle(hosts)
        minority = hosts[: (n - 1) // 2] or hosts[:1]
        majority = [h for h in hosts if h not in minority]
        groups = [sorted(majority), sorted(minority)]
        label = "|".join(",".join(hname[h] for h in g) for g in groups)
        return [
            Plan(
                "partition-majority",
                label,
                frozenset({"net", "zk"}),
                lambda: (c.partition(groups), f"{label} (majority|minority)")[1],
                c.heal,
            )
        ]

    def _cut_from_zk_plans(self, rng: random.Random) -> list[Plan]:
        c: Any = self.cluster
        return [
            Plan(
                "cut-from-zk",
                self.replica_names[i],
                frozenset({"net", f"replica{i}"}),
                doing(c.cut_from_zk, i, said="replica cut from every ZooKeeper member"),
                c.heal,
            )
            for i in range(self.cluster.hosts)
        ]

    def _bridge_plans(self, rng: random.Random) -> list[Plan]:
        c: Any = self.cluster
        if self.cluster.hosts < 3:
            return []
        hname = self._host_names()
        a, b, m = rng.sample(range(self.cluster.hosts), 3)

        def bridge() -> str:
            if rng.random() < 0.5:  # a and b cannot talk; m reaches both (Jepsen's bridge)
                c.cut_one_way(a, b)
                c.cut_one_way(b, a)
                return f"{hname[a]} and {hname[b]} cut from each other, {hname[m]} bridges"
            c.cut_one_way(a, b)  # asymmetric: a's packets to b and m are dropped, theirs reach a
            c.cut_one_way(a, m)
            return f"{hname[a]} cannot send to {hname[b]} nor {hname[m]} (one way)"

        return [Plan("bridge", hname[a], frozenset({"net", "zk"}), bridge, c.heal)]

    def _slow_plans(self, rng: random.Random) -> list[Plan]:
        c: Any = self.cluster
        delays = "slow" in {s.replace("-", "_") for s in c.supports()}  # else only losses (no netem)
        out = []
        for i, hname in enumerate(self._host_names()):
            delay, loss = rng.choice([50, 100, 200, 300]), rng.choice([0, 1, 5, 10])
            if delays:
                inject = doing(c.slow, i, delay, loss, said=f"{delay} ms delay, {loss}% loss")
            else:
                loss = rng.choice([5, 10, 20, 30])
                inject = doing(c.lossy, i, loss, said=f"{loss}% loss (no delay: no netem here)")
            out.append(Plan("slow", hname, frozenset({"net", "zk"}), inject, c.heal))
        return out

    def _s3_plans(self, kind: str) -> Callable[[random.Random], list[Plan]]:
        def make(rng: random.Random) -> list[Plan]:
            from mergetxn.chaos import s3

            return s3.plans(kind, self.cluster, rng)

        return make

    def _fits(self, plan: Plan, taken: frozenset[str]) -> bool:
        """Whether ``plan`` may start beside the faults holding ``taken``: no resource twice,
        and some replica left unfaulted."""
        if plan.resources & taken:
            return False
        replicas = {r for r in plan.resources | taken if r.startswith("replica")}
        return len(replicas) < self.cluster.hosts or self.cluster.hosts == 1

    def _reserve(self, lane: int, rng: random.Random) -> Plan | None:
        """A fault to inject now (its resources held for ``lane``), None when nothing fits or
        ``max_faults`` were begun. Kinds begun fewer than MIN_EACH times come first, the least
        begun first; once the faults left are no more than the kinds never begun, only those."""
        with self._lock:
            started = dict(self._started)
        wanting = [k for k in self.kinds if started.get(k, 0) < MIN_EACH]
        rng.shuffle(wanting)
        # the least injected first (ties in random order): a kind that shares its resource with
        # another (the two S3 kinds hold "s3") still comes at that resource's next turn
        wanting.sort(key=lambda k: started.get(k, 0))
        draws = wanting + [rng.choice(self.kinds) for _ in range(8)]
        never = [k for k in wanting if not started.get(k)]
        if never and self.max_faults is not None and self.max_faults - sum(started.values()) <= len(never):
            # A short campaign holds every kind it asked for: the rest of the budget waits for the
            # kinds not yet begun (one whose resource another lane holds gets it when it is healed).
            draws = never
        for kind in draws:
            plans = self.plans(kind, rng)
            with self._lock:
                if self.max_faults is not None and sum(self._started.values()) >= self.max_faults:
                    return None
                taken = frozenset().union(*(r for n, r in self._held.items() if n != lane))
                for plan in plans:
                    if self._fits(plan, taken):
                        self._held[lane] = plan.resources
                        self._started[kind] = self._started.get(kind, 0) + 1
                        return plan
        return None

    def _quota_reached(self) -> bool:
        with self._lock:
            return self.max_faults is not None and sum(self._started.values()) >= self.max_faults

    def _release(self, lane: int) -> None:
        with self._lock:
            self._held.pop(lane, None)

    def _held_by_others(self, lane: int, i: int) -> bool:
        """Whether another lane is faulting replica ``i`` (its recovery is that lane's to measure)."""
        with self._lock:
            return any(f"replica{i}" in r for n, r in self._held.items() if n != lane)

    # -- one lane -------------------------------------------------------------------------------
    def _lane(self, lane: int) -> None:
        rng = random.Random(f"{self.seed}-nemesis-{lane}")
        prober = Prober(self._addresses)
        try:
            while not self._stop.is_set():
                plan = self._reserve(lane, rng)
                if plan is None:
                    if self._quota_reached():
                        break
                    self._stop.wait(0.1)
                    continue
                try:
                    self._one(lane, plan, rng, prober)
                finally:
                    self._release(lane)
                self._stop.wait(rng.uniform(*self.pause))
        finally:
            prober.close()
            with self._lock:
                self._lanes_left -= 1
                last = self._lanes_left == 0
            if last:  # the restarts under way end too before the nemesis is finished
                for t in list(self._healers):
                    t.join(RECOVERY_LIMIT)
                self.finished.set()

    def _one(self, lane: int, plan: Plan, rng: random.Random, prober: Prober) -> None:
        start = self.rec.now()
        try:
            detail = plan.inject()
        except NothingToFault:
            with self._lock:
                self._started[plan.kind] -= 1
            return
        except Exception as exc:
            detail = f"inject failed: {brief(exc)}"
            self.errors.append(f"{plan.kind} {plan.target}: {detail}")
        if plan.kind not in NO_HOLD:
            self._stop.wait(rng.uniform(*self.hold))
        end = self.rec.now()
        fault = Fault(plan.kind, plan.target, start, end, str(detail or ""), None)
        # When every replica served again: the lane's probes and, for a restart beside the lane,
        # the restarted replica's; whichever ends last settles fault.recovered (see _settle).
        measures: dict[str, Any] = {}
        background = plan.kind in BACKGROUND_HEAL
        if background:
            self._heal_in_background(plan, fault, measures)
        else:
            try:
                plan.heal()
                healed = self.rec.now() - end
                if healed >= 0.05:
                    fault.detail += f"; healed in {healed:.2f}s"
            except Exception as exc:
                fault.detail += f"; heal failed: {brief(exc)}"
                self.errors.append(f"{plan.kind} {plan.target}: heal failed: {brief(exc)}")
        mine = plan.replica if background else None  # its restart is measured beside the lane
        down = [i for i in range(self.cluster.hosts) if i != mine and not self.cluster.replica_running(i)]
        notes = []
        if down:  # a replica whose restart failed or is under way: the end of the run tries again
            notes.append(f"not probed, not running: {[self.replica_names[i] for i in down]}")
        failed = prober.wait_serving(
            [i for i in range(self.cluster.hosts) if i not in down and i != mine],
            skip=lambda i: self._abort.is_set() or self._held_by_others(lane, i),
        )
        if self._abort.is_set():
            failed, notes = [], [*notes, "recovery not measured (run interrupted)"]
        if failed:
            notes.append(
                f"replica(s) {[self.replica_names[i] for i in failed]} served no commit within {RECOVERY_LIMIT:g}s"
            )
        with self._lock:
            measures["lane"] = None if failed or self._abort.is_set() else self.rec.now()
            fault.detail += "".join(f"; {n}" for n in notes)
            self._settle(fault, measures, background)
            self.faults.append(fault)

    @staticmethod
    def _settle(fault: Fault, measures: dict[str, Any], background: bool) -> None:
        """Set ``fault.recovered`` once both measures are in (called under the lock): the later
        one, or None when either failed (``measures["heal"]`` is None when the restart has
        nothing to measure: a ZooKeeper member, whose clients the lane's probes stand for)."""
        if "lane" not in measures or (background and "heal" not in measures):
            return
        lane, heal = measures["lane"], measures.get("heal")
        fault.recovered = None if lane is None or heal is False else max(lane, heal or lane)

    def _restart(self, plan: Plan) -> list[str]:
        """``plan.heal()``; a replica that fails to start (its storage is down: another lane's S3
        fault) is started again, as a supervisor would, until it starts or RECOVERY_LIMIT
        seconds passed. Returns why the failed starts failed."""
        if plan.replica is None:
            plan.heal()
            return []
        failed: list[str] = []

        def heal() -> None:
            try:
                plan.heal()
            except Exception as exc:
                failed.append(brief(exc, 200))
                raise

        retries.harness_wait(RECOVERY_LIMIT, Exception, 0.5)(heal)
        return failed

    def _heal_in_background(self, plan: Plan, fault: Fault, measures: dict[str, Any]) -> None:
        """Restart a ZooKeeper member or a replica (or wait for a killed Spark executor's
        replacement) in a thread of its own: a restart takes seconds (a JVM, a Python process
        replaying its WAL), and the lane need not wait for it.
        The fault's resources stay held until the restarted process serves (a member: answers as
        part of the quorum; a replica: commits a probe), so nothing touching the quorum, or that
        replica, starts meanwhile; its detail says when it served again."""
        token = f"restart-{next(self._tokens)}"
        with self._lock:
            self._held[token] = plan.resources

        def restart() -> None:
            began = self.rec.now()
            heal: float | bool | None = None
            try:
                retries = self._restart(plan)
                took = self.rec.now() - began
                if plan.kind == "kill-executor":  # recovered once the replacement registered
                    note = f"; its replacement registered with the driver {took:.2f}s later"
                    heal = self.rec.now()
                elif plan.replica is None:
                    note = f"; the member served again {took:.2f}s after its restart began"
                else:
                    note = f"; restarted in {took:.2f}s"
                    if retries:
                        note += f" ({len(retries)} failed start(s) first: {retries[-1]})"
                    if not self._abort.is_set():
                        prober = Prober(self._addresses)
                        try:
                            gone = prober.wait_serving([plan.replica], skip=lambda i: self._abort.is_set())
                        finally:
                            prober.close()
                        if gone:
                            heal = False
                            note += f"; it served no commit within {RECOVERY_LIMIT:g}s"
                        elif not self._abort.is_set():
                            heal = self.rec.now()
                            note += f", committing {heal - began - took:.2f}s later"
            except Exception as exc:
                heal = False
                note = f"; restart failed: {brief(exc)}"
                self.errors.append(f"{plan.kind} {plan.target}: restart failed: {brief(exc)}")
            finally:
                with self._lock:
                    self._held.pop(token, None)
            with self._lock:
                fault.detail += note
                measures["heal"] = heal
                self._settle(fault, measures, True)

        thread = threading.Thread(target=restart, name=f"nemesis-{token}", daemon=True)
        self._healers.append(thread)
        thread.start()


def brief(exc: BaseException, limit: int = 300) -> str:
    """An error in one line: its first line and, when it runs on (a log tail), its last one."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if len(lines) > 1:
        text += f" ... {lines[-1]}"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}"


def wait_all_serving(addresses: Callable[[], list[str]], n: int, limit: float = RECOVERY_LIMIT) -> list[int]:
    """Every replica commits a probe (bounded); returns those that did not."""
    prober = Prober(addresses)
    try:
        return prober.wait_serving(list(range(n)), limit)
    finally:
        prober.close()


def sleep_until(deadline: float, stop: threading.Event | None = None) -> None:
    """Wait until ``time.monotonic()`` reaches ``deadline`` (early if ``stop`` is set)."""
    while (left := deadline - time.monotonic()) > 0:
        if stop is not None and stop.wait(min(left, 0.5)):
            return
        if stop is None:
            time.sleep(min(left, 0.5))
