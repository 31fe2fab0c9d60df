"""Snapshots in use on one replica: read leases, and what the alive node says about them.

Each replica publishes in its ephemeral node ``replicas/<host>/alive`` the oldest snapshot it
still serves: the snapshots of its running transactions, of its read leases, and its own snapshot
version when nothing older is in use. A lease pins the snapshot of a read outside a transaction
from the moment the replica answers the part list: a plain read's lease (holder "read") until its
client has read the files and releases it, or lapses :data:`READ_LEASE_SECONDS` after it was taken
or last renewed (a client that died mid-read); a Spark job's (holder "spark") from planning until
it lapses ``read_lease_seconds`` later, since Spark tells a reader nothing when the job ends. The
log-tail thread refreshes the node (every half second, only when the values changed). A ``begin``
reads the snapshot and registers the transaction under the same lock (the transaction registry's,
replicas/registry.py) as the publisher computes the value, so a published value never exceeds a
snapshot in use. Cleanup (replicas/cleanup.py) reads these values from every alive replica.

A lease acts for the user that took it (its ``owner``; None on an unsecured replica) or an admin
(coordinator/core/grants.py, ``acts_for``): another user's ``renew`` or ``release`` of its id is
answered as for a lease that is gone (not renewed, not released) and changes nothing.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coordinator.core.errors import InvalidInput, QuotaExceeded, quote
from coordinator.core.grants import Grantee, acts_for
from replicas.context import ReplicaContext, ReplicaPart

if TYPE_CHECKING:
    from replicas.registry import Transactions

RUNNING_MIN_AGE = 1.0  # running transactions at least this old are published by id
MAX_PUBLISHED_RUNNING = 1000  # beyond this a replica publishes "running_overflow" instead
MAX_PUBLISHED_SNAPSHOTS = 16
READ_LEASE_SECONDS = 30.0  # a plain read's lease lapses this long after it was taken or renewed
LEASE_HOLDERS = ("read", "spark")


@dataclass
class Lease:
    snapshot: int
    holder: str  # "read" (a plain read, released when its client has read the files) or "spark"
    lapse: float
    expiry: float  # time.monotonic()
    owner: str | None = None  # the user that took it (secured clusters): renews and releases it, and its quota


class Leases(ReplicaPart):
    """The read leases of one replica and its snapshots in use (``replica.leases``)."""

    def __init__(self, context: ReplicaContext, transactions: Transactions) -> None:
        super().__init__(context)
        self.transactions = transactions  # its lock orders leases with begins (Transactions.begins_held)
        self._leases: dict[str, Lease] = {}  # lease id -> lease

    def lease(self, snapshot: int | None, holder: str = "read", owner: str | None = None) -> tuple[int, str | None]:
        """Pin a read's snapshot until :meth:`release` or until the lease lapses (see the module
        docstring); None means the latest, read under the transaction lock so that the publisher
        never publishes past it. Returns the snapshot and the lease id (None: no lease, for
        ``holder`` "none" or a Spark lease with ``read_lease_seconds`` 0). ``owner``: the user
        taking it, who may hold at most ``user_max_read_leases`` here (else QuotaExceeded)."""
        if holder not in LEASE_HOLDERS + ("none",):
            raise InvalidInput(f"lease must be one of {list(LEASE_HOLDERS + ('none',))}, not {quote(holder)}")
        lapse = READ_LEASE_SECONDS if holder == "read" else self.config.read_lease_seconds if holder == "spark" else 0
        with self.transactions.begins_held():
            snap = self.state.applied if snapshot is None else snapshot
            if lapse <= 0:
                return snap, None
            now = time.monotonic()
            if owner is not None:
                self._check_quota(owner, now)
            lease_id = uuid.uuid4().hex
            self._leases[lease_id] = Lease(snap, holder, lapse, now + lapse, owner)
        return snap, lease_id

    def _check_quota(self, owner: str, now: float) -> None:
        limit = self.config.user_max_read_leases
        if sum(1 for lease in self._leases.values() if lease.owner == owner and lease.expiry > now) >= limit:
            raise QuotaExceeded(
                f"user {owner!r} holds {limit} read leases on replica {self.config.host_id}, its quota "
                f"(user_max_read_leases={limit}): finish (release) a read first, or wait until one lapses",
                user=owner,
                quota="user_max_read_leases",
                value=limit,
            )

    def renew(self, lease_id: str, who: Grantee | None = None) -> dict:
        """Extend a lease by its lapse time; ``renewed`` is False once it has lapsed or ended
        (cleanup may have taken its parts since), or when ``who`` (None: an unsecured replica's
        caller) may not act for it."""
        now = time.monotonic()
        with self.transactions.begins_held():
            lease = self._leases.get(_lease_id(lease_id))
            if lease is None or lease.expiry <= now or not acts_for(who, lease.owner):
                return {"renewed": False}
            lease.expiry = now + lease.lapse
        return {"renewed": True, "seconds": lease.lapse}

    def release(self, lease_id: str, who: Grantee | None = None) -> dict:
        """End a lease: its snapshot is no longer in use (for it). ``who``: as for :meth:`renew`."""
        lease_id = _lease_id(lease_id)
        with self.transactions.begins_held():
            lease = self._leases.get(lease_id)
            if lease is None or not acts_for(who, lease.owner):
                return {"released": False}
            del self._leases[lease_id]
            return {"released": True}

    def in_use(self) -> tuple[int, list[tuple[int, str]], list[str], bool]:
        """(oldest snapshot, up to 16 oldest (snapshot, holder) pairs, ids of running transactions
        old enough to publish, overflow). Called with no lock held; takes the transaction lock."""
        now = time.monotonic()
        with self.transactions.begins_held() as running:
            applied = self.state.applied
            txns = list(running.values())
            for lease_id in [k for k, lease in self._leases.items() if lease.expiry <= now]:
                del self._leases[lease_id]
            leases = [(lease.snapshot, lease.holder) for lease in self._leases.values()]
        holders = sorted([(t.snapshot, t.id) for t in txns] + leases)
        oldest = min([applied] + [s for s, _ in holders])
        published = sorted(t.id for t in txns if now - t.started >= RUNNING_MIN_AGE)
        overflow = len(published) > MAX_PUBLISHED_RUNNING
        picked: list[tuple[int, str]] = []
        seen: set[int] = set()
        for s, h in holders:  # the oldest holder of each distinct snapshot
            if s not in seen:
                seen.add(s)
                picked.append((s, h))
            if len(picked) >= MAX_PUBLISHED_SNAPSHOTS:
                break
        return oldest, picked, ([] if overflow else published), overflow


def _lease_id(lease_id: Any) -> str:
    if not isinstance(lease_id, str):
        raise InvalidInput(f"lease must be a lease id (a string), not {quote(lease_id)}")
    return lease_id
