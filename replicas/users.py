"""The users a secured replica serves, kept current from ZooKeeper, and the check of each login.

Two identities log in to a secured replica (coordinator/wire/security.py): the replicas' own (the
ZooKeeper digest identity, which replica-to-replica calls such as a forwarded ``commit_status``
and an operator's ``mergetxn status --credentials <replica file>`` present), and users, whose
records live in one ZooKeeper node (coordinator/model/users.py). The replicas' identity is no user: it
is not listed, cannot be dropped, and may do everything (whoever holds it holds ZooKeeper).

A login (``auth``) costs one scrypt (about 15 ms) the first time a user's secret is checked on a
replica; after that the replica remembers a keyed hash of what verified (per user, for the
record it was checked against), so the next logins with the same credentials cost microseconds,
less than a commit. A wrong secret, or an unknown user, always costs the scrypt. The RPC server
runs that cheap part (:meth:`Users.remembered`) on its I/O thread and the whole check
(:meth:`Users.authenticate`, the scrypt) on a pool of its own (coordinator/wire/rpc.py).

The node is watched: a change made through any replica reaches every replica's copy as soon as
ZooKeeper tells it (the replica that made it applies it at once). A principal (who a connection
authenticated as) is looked up again in that copy on every call: a dropped user's open
connection gets AuthenticationFailed from its next call on, as does a new login with its
credentials; a role or grant changed counts from the next call. A user that a new copy no longer
holds (or holds made again, with other credentials) was dropped: ``on_drop`` is told its name
(the replica aborts its running transactions there, replicas/registry.py), from a thread of its
own, so that the watch's thread never waits on what aborting does (deleting staged files).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from coordinator.core.errors import AuthenticationFailed, CorruptMetadata, InvalidInput, ReplicaUnavailable
from coordinator.core.grants import Grantee, Role
from coordinator.model import users as records
from coordinator.model.users import UserRecord
from coordinator.wire.security import Credentials
from coordinator.zk.recipes import cas_update

log = logging.getLogger(__name__)

_MAX_LOGIN = 256  # characters of a user name or secret in an auth request worth checking


@dataclass(frozen=True)
class Principal:
    """Who a connection authenticated as: a user (with the stamp of the record it logged in
    with: the record's secret hash) or the replicas' identity."""

    name: str
    stamp: str = ""
    replica: bool = False

    def __repr__(self) -> str:
        return f"Principal({self.name!r}{', replica' if self.replica else ''})"


def _login(args: dict) -> tuple[str, str] | None:
    """An ``auth`` request's user and secret, when they are strings worth checking."""
    user, secret = args.get("user"), args.get("secret")
    if not isinstance(user, str) or not isinstance(secret, str) or len(user) > _MAX_LOGIN or len(secret) > _MAX_LOGIN:
        return None
    return user, secret


class Users:
    """``replica.users``: the users of a secured cluster as this replica knows them."""

    def __init__(
        self, zk: Any, path: str, identity: Credentials, on_drop: Callable[[list[str]], None] | None = None
    ) -> None:
        self.zk = zk
        self.path = path
        self.identity = identity
        self.on_drop = on_drop  # told the names of the users each new copy dropped
        self._lock = threading.Lock()
        self._version = -1
        self._users: dict[str, UserRecord] = {}
        self._key = os.urandom(32)  # keys the remembered logins: they mean nothing outside this process
        self._verified: dict[str, bytes] = {}  # user -> keyed hash of (record, secret) that verified
        self.gone = False  # the node was deleted: logins are refused saying so (not "wrong secret")

    # -- the copy ----------------------------------------------------------------------------
    def start(self, bootstrap: UserRecord | None = None) -> None:
        """Create the node if the cluster has none yet (with ``bootstrap``, the admin that
        ``mergetxn security init`` made, when given), read it and watch it."""
        first = {} if bootstrap is None else {bootstrap.name: bootstrap}
        try:
            self.zk.retry(self.zk.create, self.path, records.encode(first))
        except NodeExistsError:
            pass
        self.refresh()
        self.zk.DataWatch(self.path, self._on_change)

    def refresh(self) -> None:
        data, stat = self.zk.retry(self.zk.get, self.path)
        self._remember(stat.version, records.decode(data, self.path))

    def _on_change(self, data: bytes | None, stat: Any) -> None:
        if data is None or stat is None:  # the node is gone: no user logs in until it is back
            with self._lock:
                self._version, self._users, self._verified = -1, {}, {}
                self.gone = True
            return
        self.gone = False
        try:
            self._remember(stat.version, records.decode(data, self.path))
        except CorruptMetadata as exc:
            log.error("%s: keeping the users as they were", exc)

    def _remember(self, version: int, users: dict[str, UserRecord]) -> None:
        with self._lock:
            if version <= self._version:
                return
            held = self._users
            self._version, self._users = version, users
            self._verified = {n: v for n, v in self._verified.items() if n in users}
        dropped = sorted(n for n, r in held.items() if n not in users or users[n].secret_hash != r.secret_hash)
        if dropped and self.on_drop is not None:
            log.info("users dropped: %s", ", ".join(dropped))
            threading.Thread(target=self.on_drop, args=(dropped,), name="users-dropped", daemon=True).start()

    # -- logins and calls --------------------------------------------------------------------
    def remembered(self, args: dict) -> Principal | None:
        """The cheap part of :meth:`authenticate` (microseconds, constant-time compares): the
        replicas' identity, or a user whose same credentials verified before on this replica;
        None when only the whole check (a scrypt) can tell."""
        login = _login(args)
        if login is None:
            return None
        user, secret = login
        ident = self.identity
        if hmac.compare_digest(user.encode(), ident.user.encode()) & hmac.compare_digest(
            secret.encode(), ident.secret.encode()
        ):
            return Principal(ident.user, replica=True)
        if self.gone:
            raise self._gone()
        record = self._users.get(user)
        if record is None:
            return None
        known = self._verified.get(user)
        if known is not None and hmac.compare_digest(known, self._mark(user, record.secret_hash, secret)):
            return Principal(user, record.secret_hash)
        return None

    def authenticate(self, args: dict) -> Principal | None:
        """The principal an ``auth`` request's ``{"user", "secret"}`` names, or None (refused).
        Constant-time compares; an unknown user costs what a known one does (a scrypt: run it off
        the RPC I/O thread). A user that the watch brought while its secret was being checked
        (made through another replica just before this login) is checked once more against its
        record."""
        principal = self.remembered(args)
        login = _login(args)
        if principal is not None or login is None:
            return principal
        user, secret = login
        record = self._users.get(user)
        for _ in range(2):  # a user made (or made again) elsewhere may arrive by the watch meanwhile
            principal = self._check(user, secret, record)
            if principal is not None or self._users.get(user) is record:
                return principal
            record = self._users.get(user)
        return None

    def _mark(self, user: str, stamp: str, secret: str) -> bytes:
        """What a login that verified is remembered as: a hash keyed by this process's key."""
        return hmac.new(
            self._key, b"\0".join((user.encode(), stamp.encode(), secret.encode())), hashlib.sha256
        ).digest()

    def _check(self, user: str, secret: str, record: UserRecord | None) -> Principal | None:
        stamp = record.secret_hash if record is not None else records.decoy()
        if not records.verify_secret(secret, stamp) or record is None:
            return None
        with self._lock:
            if self._users.get(user) is record:
                self._verified[user] = self._mark(user, stamp, secret)
        return Principal(user, stamp)

    def grantee(self, principal: Principal) -> Grantee:
        """Who ``principal`` is now, for the grants (coordinator/core/grants.py); AuthenticationFailed
        once its user was dropped or made again with other credentials."""
        if principal.replica:
            return Grantee(principal.name, Role.ADMIN)
        record = self._users.get(principal.name)
        if record is None and self.gone:
            raise self._gone()
        if record is None or record.secret_hash != principal.stamp:
            raise AuthenticationFailed(
                f"user {principal.name!r} was dropped (or made again with other credentials): "
                "log in with current credentials",
                user=principal.name,
            )
        return record.grantee()

    def _gone(self) -> AuthenticationFailed:
        return AuthenticationFailed(
            f"no user can log in: the users node {self.path} is missing in ZooKeeper (deleted). Restart "
            "one replica with the cluster's credentials (it stores the first admin again), then add the "
            "other users again with mergetxn security add-user",
            node=self.path,
        )

    # -- what an admin changes ---------------------------------------------------------------
    def create(self, name: object, role: object, tables: object, secret: object) -> dict:
        """Add a user (InvalidInput if the name is taken or anything is wrong); its record."""
        new = UserRecord.new(name, role, tables, secret)
        if new.name == self.identity.user:
            raise InvalidInput(f"user name {new.name!r} is the replicas' own identity: choose another", field="name")

        def add(users: dict[str, UserRecord]) -> bool:
            held = users.get(new.name)
            if held is not None and held.secret_hash != new.secret_hash:  # (the same: a retry after a lost answer)
                raise InvalidInput(f"user {new.name!r} exists already: drop it first to make it again", field="name")
            users[new.name] = new
            return held is None

        self._change(add)
        return new.public()

    def drop(self, name: object) -> dict:
        """Remove a user: its credentials are refused from now on, on every replica. The last
        admin is refused (InvalidInput naming it): decided on the node's version, so of two
        drops of the last two admins racing through any replicas one is refused."""
        dropped: list[UserRecord] = []

        def remove(users: dict[str, UserRecord]) -> bool:
            held = users.pop(name, None) if isinstance(name, str) else None
            if held is not None and held.role is Role.ADMIN and not any(u.role is Role.ADMIN for u in users.values()):
                raise InvalidInput(
                    f"user {held.name!r} is the last admin: dropping it would leave nobody to manage "
                    "users or tables; add another admin first (security add-user NAME --role admin)",
                    field="name",
                    user=held.name,
                )
            if held is not None:
                dropped[:] = [held]
            return held is not None

        self._change(remove)
        if not dropped:
            raise InvalidInput(f"no user {str(name)[:80]!r}", field="name")
        return dropped[0].public()

    def describe(self) -> list[dict]:
        """Every user (never a secret or its hash), by name: as ZooKeeper holds them now, so a
        change made through another replica just before is seen (the watch may not have
        brought it yet): none once the node is gone; ReplicaUnavailable when ZooKeeper does not
        answer this replica (not the copy it last had, which may be behind)."""
        try:
            self.zk.retry(self.zk.sync, self.path)
            self.refresh()
        except NoNodeError:
            return []
        except KazooException as exc:
            raise ReplicaUnavailable(
                f"the users cannot be listed as they are now: ZooKeeper does not answer this replica "
                f"({type(exc).__name__}); try again, or through another replica"
            ) from None
        with self._lock:
            return [u.public() for _, u in sorted(self._users.items())]

    def _change(self, change: Callable[[dict[str, UserRecord]], bool]) -> None:
        """Apply ``change(users) -> changed`` to the node atomically (a versioned set: the
        compare-and-swap of coordinator/zk/recipes.py), then to this replica's copy at once."""

        def step(data: bytes | None) -> bytes | None:
            users = records.decode(data, self.path)
            return records.encode(users) if change(users) else None

        cas_update(self.zk, self.path, step)
        self.refresh()
