"""The nemesis of ``mergetxn chaos`` on a fake cluster (no processes): its lanes keep the
combinations it promises (never every replica faulted at once, one fault on the ZooKeeper quorum
at a time, one network fault at a time), every kind comes early, and ``max_faults`` ends it after
exactly that many faults. Recovery probes are skipped (they need real replicas)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from mergetxn.chaos import nemesis as nem
from mergetxn.chaos.nemesis import KINDS, MIN_EACH, Nemesis, choose_kinds
from mergetxn.chaos.workloads import Recorder

SUPPORTED = {
    "kill_replica",
    "pause_replica",
    "kill_zk",
    "isolate",
    "partition",
    "cut_from_zk",
    "cut_one_way",
    "lossy",
    "expire_session",
    "fill_wal_disk",
}


class FakeCluster:
    """Three hosts; every fault only bookkeeping, checked against the nemesis's promises."""

    hosts = 3
    replica_addresses = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.replicas: dict[int, str] = {}  # replica -> what faults it now
        self.zk_down: set[int] = set()
        self.net: str | None = None
        self.violations: list[str] = []
        self.most_replicas = 0

    def supports(self) -> set[str]:
        return set(SUPPORTED)

    def _fault_replica(self, i: int, what: str) -> None:
        with self.lock:
            if i in self.replicas:
                self.violations.append(f"{what} on r{i} while {self.replicas[i]}")
            self.replicas[i] = what
            self.most_replicas = max(self.most_replicas, len(self.replicas))
            if len(self.replicas) == self.hosts:
                self.violations.append(f"every replica faulted at once: {self.replicas}")
        time.sleep(0.002)

    def _heal_replica(self, i: int) -> None:
        with self.lock:
            self.replicas.pop(i, None)

    def _net(self, what: str, zk: bool = True) -> None:
        with self.lock:
            if self.net is not None:
                self.violations.append(f"{what} while {self.net}")
            if zk and self.zk_down:
                self.violations.append(f"{what} while ZooKeeper member(s) {self.zk_down} down")
            self.net = what

    kill_replica = lambda self, i: self._fault_replica(i, "killed")  # noqa: E731
    start_replica = lambda self, i: self._heal_replica(i)  # noqa: E731
    pause_replica = lambda self, i: self._fault_replica(i, "paused")  # noqa: E731
    resume_replica = lambda self, i: self._heal_replica(i)  # noqa: E731
    fill_wal_disk = lambda self, i: self._fault_replica(i, "WAL full")  # noqa: E731
    free_wal_disk = lambda self, i: self._heal_replica(i)  # noqa: E731

    def replica_running(self, i: int) -> bool:
        return True

    def expire_session(self, i: int) -> None:
        self._net(f"expire r{i}", zk=False)
        self._fault_replica(i, "expiring")
        self._heal_replica(i)
        self.heal()

    def kill_zk(self, i: int) -> None:
        with self.lock:
            if self.zk_down:
                self.violations.append(f"member {i} killed while {self.zk_down} down")
            if self.net is not None and not self.net.startswith(("cut", "expire")):
                self.violations.append(f"member {i} killed during {self.net}")
            self.zk_down.add(i)

    def start_zk(self, i: int) -> None:
        time.sleep(0.05)  # a restart takes a while: the quorum stays held meanwhile
        with self.lock:
            self.zk_down.discard(i)

    def zk_leader(self) -> int:
        return 0

    def isolate(self, i: int) -> None:
        self._net(f"isolate h{i}")
        self._fault_replica(i, "isolated")

    def partition(self, groups: list[list[int]]) -> None:
        self._net(f"partition {groups}")

    def cut_one_way(self, a: int, b: int) -> None:
        with self.lock:
            if self.net is None or not self.net.startswith("bridge"):
                if self.net is not None:
                    self.violations.append(f"bridge while {self.net}")
                if self.zk_down:
                    self.violations.append(f"bridge while ZooKeeper member(s) {self.zk_down} down")
                self.net = "bridge"

    def cut_from_zk(self, i: int) -> None:
        self._net(f"cut r{i}", zk=False)
        self._fault_replica(i, "cut from ZooKeeper")

    def lossy(self, i: int, pct: float) -> None:
        self._net(f"lossy h{i}")

    def heal(self) -> None:
        with self.lock:
            if self.net and self.net.startswith(("isolate", "cut")):
                self.replicas = {r: w for r, w in self.replicas.items() if w not in ("isolated", "cut from ZooKeeper")}
            self.net = None


@pytest.fixture(autouse=True)
def no_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nem.Prober, "wait_serving", lambda self, replicas, limit=0, skip=None: [])


def run(
    kinds: list[str],
    max_faults: int | None = None,
    seconds: float = 5.0,
    lanes: int = 3,
    hold: tuple[float, float] = (0.0, 0.01),
) -> tuple[FakeCluster, Nemesis]:
    cluster = FakeCluster()
    n = Nemesis(
        cluster,
        kinds,
        7,
        Recorder(),
        lambda i, rng: f"client on r{i} killed",
        lanes=lanes,
        hold=hold,
        max_faults=max_faults,
    )
    n.start()
    n.finished.wait(seconds)
    n.stop(10)
    return cluster, n


def test_max_faults_ends_the_nemesis_after_exactly_that_many_with_every_kind() -> None:
    kinds, _ = choose_kinds("all", SUPPORTED)
    # every kind but those that need a Spark workload or S3 storage, which this fake has neither of
    assert set(kinds) == set(KINDS) - {"kill-executor", "s3-errors", "s3-timeouts"}
    cluster, n = run(kinds, max_faults=len(kinds) * MIN_EACH + 20, seconds=60)
    assert n.finished.is_set()
    assert len(n.faults) == len(kinds) * MIN_EACH + 20, len(n.faults)
    counts = Counter(f.kind for f in n.faults)
    assert all(counts[k] >= MIN_EACH for k in kinds), counts
    assert cluster.violations == [], cluster.violations[:5]
    assert not n.errors, n.errors


def test_lanes_never_fault_every_replica_at_once() -> None:
    cluster, n = run(["kill-replica", "pause-replica", "wal-full"], seconds=3.0, lanes=5, hold=(0.02, 0.05))
    assert len(n.faults) > 20
    assert cluster.violations == [], cluster.violations[:5]
    assert cluster.most_replicas == 2  # five lanes fault two replicas at once, never three
    assert not n.errors, n.errors


def test_kill_executor_needs_the_spark_workload() -> None:
    from coordinator.errors import InvalidInput

    with pytest.raises(InvalidInput, match="Spark workload"):
        choose_kinds("kill-executor", SUPPORTED)
    assert "kill-executor" in choose_kinds("all", SUPPORTED | {"kill_executor"})[0]
    with pytest.raises(InvalidInput, match="Spark workload"):
        Nemesis(FakeCluster(), ["kill-executor"], 1, Recorder(), lambda i, rng: "")


def test_a_kind_sharing_its_resource_comes_at_that_resources_next_turn() -> None:
    """Two kinds that hold one resource (here the network; the two S3 kinds hold ``s3``): the one
    not injected yet is next, whatever the seed, so a short campaign holds both (a CI run at load
    injected ``s3-timeouts`` and then never ``s3-errors`` in 30 s)."""
    for seed in range(20):
        n = Nemesis(FakeCluster(), ["isolate", "slow", "kill-replica"], seed, Recorder(), lambda i, rng: "")
        rng = __import__("random").Random(seed)
        net = []
        for _ in range(4):
            plan = n._reserve(0, rng)
            assert plan is not None
            if plan.kind in ("isolate", "slow"):
                net.append(plan.kind)
            n._release(0)
            if len(net) == 2:
                break
        assert sorted(net) == ["isolate", "slow"], (seed, net)


def test_the_last_faults_of_a_short_campaign_wait_for_the_kinds_not_yet_begun() -> None:
    """The budget's end is kept for the kinds never injected: with the network held by one lane
    (``isolate``), another lane does not spend the last fault on a kind begun already, but waits
    for ``slow``, which gets it once the network is healed (the CI campaign with the two S3 kinds
    once ended on ``kill-replica`` while ``s3-timeouts`` held S3, ``s3-errors`` never begun)."""
    for seed in range(20):
        n = Nemesis(
            FakeCluster(), ["isolate", "slow", "kill-replica"], seed, Recorder(), lambda i, rng: "", max_faults=3
        )
        rng = __import__("random").Random(seed)
        n._started.update({"isolate": 1, "kill-replica": 1})  # begun: lane 1 holds the network
        n._held[1] = frozenset({"net"})
        assert n._reserve(0, rng) is None, seed  # kill-replica again would leave slow out
        n._release(1)
        plan = n._reserve(0, rng)
        assert plan is not None and plan.kind == "slow", (seed, plan)
