"""The hostile-client lane of ``mergetxn chaos``: a client that is buggy or malicious, beside the
honest workloads (docs/surface.md#a-replica-survives-its-clients).

One thread sends, at a random replica each time, what no honest client sends:

* ``junk``: one bad frame on a fresh connection (a million ``[``, a declared length of 4 GiB, a
  frame cut short, bytes that are not JSON, JSON that is not a request, invalid UTF-8), then
  closes it or leaves it open;
* ``idle``: dozens of connections that never send a byte, held for a while;
* ``forged``: parts whose path is another table's committed file, or a part some commit already
  named, staged in a transaction: each must be refused (InvalidInput), and the transaction is
  rolled back (nothing may be deleted that a commit names);
* ``denied`` (a secured cluster only): calls that a reader's or a writer's grants do not allow
  (writes, DDL, another user's kill, ``gc``, user management, a statement in a transaction) and a
  dropped user's login: each must raise PermissionDenied (AuthenticationFailed for the login) and
  change nothing, which :meth:`Hostile.verify` checks after the run (the lane's table still
  empty, no table it tried to create, no retention it tried to set).

On a secured cluster the junk arrives in three ways: raw bytes on the TLS port, frames after the
TLS handshake before any login, and frames after a reader's login.

The lane records what it sent and how each was answered. A forged part that is accepted is a
finding; a replica that stops serving is found by the run itself (the honest workloads' commits,
the probes after each fault, every replica read at one CSN at the end, and the files of every
table checked against the log).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import socket
import ssl
import struct
import threading
from collections import Counter
from collections.abc import Callable

import pyarrow as pa

from coordinator.api.client import Client
from coordinator.core import retries
from coordinator.core.errors import (
    AuthenticationFailed,
    InvalidInput,
    MergetxnError,
    PermissionDenied,
)
from coordinator.wire.rpc import frame
from coordinator.wire.security import Credentials
from parts.io.format import write_part
from parts.model.meta import PartMeta

_HEADER = struct.Struct(">I")
IDLE_CONNECTIONS = 40
IDLE_SECONDS = 3.0
PAUSE = (0.05, 0.5)  # seconds between two attacks
DENIED_WAIT_SECONDS = 8.0  # how long a denied call waits for its replica to accept a login
LANE_TABLE = "hostile_t"  # the lane's own table: no denied write may ever reach it
DENIED_TABLE = "hostile_created"  # a table a reader and a writer try to create
DENIED_RETENTION = 1.0  # what a writer tries to set on other tables
LANE_SCHEMA = pa.schema([("id", pa.int64())])


def junk_frames() -> dict[str, bytes]:
    """What one bad frame may look like (each sent on a fresh connection)."""
    deep = b"[" * 1_000_000
    return {
        "deep-nesting": _HEADER.pack(len(deep)) + deep,
        "4-GiB-length": _HEADER.pack(0xFFFFFFFF) + b"{",
        "cut-short": _HEADER.pack(1000) + b'{"a": "begin"',
        "not-json": _HEADER.pack(9) + b"\x00\x01junk\xff\xfe",
        "not-a-request": _HEADER.pack(9) + b"[1,2,3,4]",
        "bad-utf8": _HEADER.pack(12) + b'{"a":"\xff\xfe"}  ',
        "wrong-types": _HEADER.pack(22) + b'{"a": 7, "b": "begin"}',
        "unknown-action": _HEADER.pack(30) + b'{"a": "rm -rf /", "b": {}}    ',
    }


class Hostile(threading.Thread):
    """The lane: attacks until ``stop`` is set; ``counts`` and ``findings`` after."""

    def __init__(
        self,
        addresses: Callable[[], list[str]],
        stop: threading.Event,
        seed: int,
        timeout: float = 10.0,
        credentials: Credentials | None = None,
    ) -> None:
        """``credentials``: a secured cluster's admin (the lane makes its users and table with them)."""
        super().__init__(name="hostile", daemon=True)
        self.addresses = addresses
        self.stop_event = stop
        self.rng = random.Random(seed)
        self.timeout = timeout
        self.admin = credentials
        self.tls = None if credentials is None else credentials.client_context()
        self.users: dict[str, Credentials] = {}  # role -> the lane's user of that role, once made
        self.counts: Counter[str] = Counter()
        self.findings: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                for attack in self.round():
                    addresses = self.addresses()
                    if addresses:
                        attack(self.rng.choice(addresses))
                    if self.stop_event.wait(self.rng.uniform(*PAUSE)):
                        break
        except BaseException as exc:  # reported by the run: the lane must not die quietly
            self.error = exc

    def round(self) -> list[Callable[[str], None]]:
        """One round of attacks in a random order: every kind comes once a round, so a short run
        under faults still tries each (denied calls, when secured, open the round: they need the
        replica up and a round's idle connections may take seconds)."""
        attacks = [self.junk, self.junk, self.junk, self.idle, self.forged]
        self.rng.shuffle(attacks)
        if self.admin is not None:
            attacks = [self.denied, self.denied] + attacks
        return attacks

    # -- junk frames and idle connections ---------------------------------------------------------
    def _connect(self, address: str, tls: bool = False) -> socket.socket | None:
        host, _, port = address.rpartition(":")
        try:
            sock = socket.create_connection((host, int(port)), timeout=self.timeout)
        except OSError:
            self.counts["connect-failed"] += 1  # the replica is down or cut: the nemesis's doing
            return None
        if not tls or self.tls is None:
            return sock
        try:
            return self.tls.wrap_socket(sock, server_hostname=host)
        except (OSError, ssl.SSLError):
            sock.close()
            self.counts["connect-failed"] += 1
            return None

    def _logged_in(self, address: str) -> socket.socket | None:
        """A TLS connection on which the lane's reader has logged in (None: not now)."""
        reader = self.users.get("reader")
        sock = self._connect(address, tls=True) if reader is not None else None
        if sock is None:
            return None
        try:
            sock.sendall(frame({"a": "auth", "b": reader.auth_request()}))
            header = sock.recv(4)  # the answer's length; its body follows
            if len(header) == 4:
                return sock
        except OSError:
            pass
        sock.close()
        return None

    def junk(self, address: str) -> None:
        kind, data = self.rng.choice(sorted(junk_frames().items()))
        how = "" if self.admin is None else self.rng.choice(["raw", "tls", "logged-in"])
        sock = self._logged_in(address) if how == "logged-in" else self._connect(address, tls=how == "tls")
        if sock is None:
            return
        self.counts[f"junk:{kind}" + (f":{how}" if how else "")] += 1
        try:
            sock.sendall(data)
            if self.rng.random() < 0.5:
                sock.settimeout(1.0)
                sock.recv(1 << 16)  # an error answer or a close; anything else is the replica's choice
        except OSError:
            pass
        finally:
            sock.close()

    def idle(self, address: str) -> None:
        socks: list[socket.socket] = []
        for _ in range(IDLE_CONNECTIONS):
            sock = self._connect(address)
            if sock is None:  # down or paused (a full backlog): the rest would only wait out their timeouts
                break
            socks.append(sock)
        self.counts["idle-connections"] += len(socks)
        self.stop_event.wait(IDLE_SECONDS)
        for s in socks:
            s.close()

    # -- forged parts -------------------------------------------------------------------------------
    def forged(self, address: str) -> None:
        try:
            client = Client(address, timeout=self.timeout, credentials=self.admin)
        except (MergetxnError, OSError):
            self.counts["connect-failed"] += 1
            return
        try:
            tables = sorted(t for t in client.tables() if t != LANE_TABLE)
            if len(tables) < 2:
                return
            victim_table, thief = self.rng.sample(tables, 2)
            self._forge(client, victim_table, thief)
        except (MergetxnError, OSError) as exc:
            self.counts[f"forged-not-tried:{type(exc).__name__}"] += 1  # a fault in the way
        finally:
            client.close()

    def _forge(self, client: Client, victim_table: str, thief: str) -> None:
        tx = client.begin()
        try:
            victims = [PartMeta.from_dict(m) for m in client.call("visible", table=victim_table, id=tx.id)["parts"]]
            if not victims:
                return
            victim = self.rng.choice(victims)
            tdef = client.table(thief)
            attempts = {"committed-part-again": (victim_table, victim)}
            if not tdef.partition_by:  # a part of its own, then pointed at the victim's file
                mine = write_part(
                    client.storage, thief, [], (), pa.Table.from_pylist([], schema=tdef.schema), tx.id, tdef.ddl_version
                )
                attempts["another-tables-file"] = (
                    thief,
                    dataclasses.replace(mine, path=victim.path, size=victim.size, checksum=victim.checksum),
                )
            for kind, (table, meta) in attempts.items():
                self.counts[f"forged:{kind}"] += 1
                try:
                    tx.add_parts(table, [meta])
                except InvalidInput:
                    self.counts[f"forged-refused:{kind}"] += 1
                    continue
                self.findings.append(
                    f"hostile lane: replica {client.address} accepted a forged part ({kind}): "
                    f"{meta.name} of {table!r} at {meta.path!r}"
                )
        finally:
            try:
                tx.rollback()
            except MergetxnError:
                pass

    # -- denied calls (a secured cluster) ------------------------------------------------------------
    def prepare(self, admin: Client) -> None:
        """The lane's table and users (made once; a fault on the way: the next attack tries again)."""
        if LANE_TABLE not in admin.tables():
            admin.create_table(LANE_TABLE, LANE_SCHEMA)
        for role, tables in (("reader", None), ("writer", [LANE_TABLE])):
            if role not in self.users:
                self.users[role] = admin.create_user(f"hostile_{role}_{self.rng.randrange(1 << 30):x}", role, tables)

    def denied(self, address: str) -> None:
        try:  # waits out a restart (a killed replica is back in seconds): a denied call needs it up
            admin = retries.harness_wait(DENIED_WAIT_SECONDS, (MergetxnError, OSError), every=0.25)(
                lambda: Client(address, timeout=self.timeout, credentials=self.admin)
            )
        except (MergetxnError, OSError):
            self.counts["connect-failed"] += 1
            return
        try:
            self.prepare(admin)
            attempts = self.denied_calls(admin)
            kind = self.rng.choice(sorted(attempts))
            role, call = attempts[kind]
            self.try_denied(address, role, kind, call)
        except (MergetxnError, OSError) as exc:
            self.counts[f"denied-not-tried:{type(exc).__name__}"] += 1  # a fault in the way
        finally:
            admin.close()

    def denied_calls(self, admin: Client) -> dict[str, tuple[str, Callable[[Client], object]]]:
        """What each of the lane's users may not do: kind -> (role, call)."""
        others = sorted(t for t in admin.tables() if t != LANE_TABLE) or [LANE_TABLE]
        other = self.rng.choice(others)
        row = pa.table({"id": [self.rng.randrange(1 << 40)]}, schema=LANE_SCHEMA)

        def in_transaction(statement: Callable[[object], object], then_read: bool = False) -> Callable[[Client], None]:
            def call(c: Client) -> None:
                tx = c.begin()
                try:
                    try:
                        statement(tx)
                    finally:
                        if then_read:
                            tx.read(LANE_TABLE)  # the statement failed; the transaction stays usable for reads
                finally:
                    with contextlib.suppress(MergetxnError):  # the statement's outcome is the verdict
                        tx.rollback()

            return call

        def kill_admins(c: Client) -> None:
            tx = admin.begin()
            try:
                c.kill(tx.id)
            finally:
                with contextlib.suppress(MergetxnError):  # the kill is the verdict, whatever its rollback says
                    tx.rollback()

        return {
            "reader-insert": ("reader", in_transaction(lambda tx: tx.insert(LANE_TABLE, row))),
            "reader-insert-then-read": ("reader", in_transaction(lambda tx: tx.insert(LANE_TABLE, row), True)),
            "writer-truncate-other-table": ("writer", in_transaction(lambda tx: tx.truncate(other))),
            "reader-create-table": ("reader", lambda c: c.create_table(DENIED_TABLE, LANE_SCHEMA)),
            "writer-create-table": ("writer", lambda c: c.create_table(DENIED_TABLE, LANE_SCHEMA)),
            "writer-drop-table": ("writer", lambda c: c.drop_table(other)),
            "writer-alter-table": ("writer", lambda c: c.alter_table(other, retention_seconds=DENIED_RETENTION)),
            "writer-kill-admins-transaction": ("writer", kill_admins),
            "reader-gc": ("reader", lambda c: c.gc()),
            "writer-create-user": ("writer", lambda c: c.create_user("hostile_made", "admin")),
            "dropped-user-login": ("dropped", lambda c: c.snapshot()),
        }

    def try_denied(self, address: str, role: str, kind: str, call: Callable[[Client], object]) -> None:
        if role == "dropped":  # a user made and dropped at once: its credentials log in nowhere
            with Client(address, timeout=self.timeout, credentials=self.admin) as admin:
                creds = admin.create_user(f"hostile_gone_{self.rng.randrange(1 << 30):x}", "admin")
                admin.drop_user(creds.user)
        else:
            creds = self.users[role]
        self.counts[f"denied:{kind}"] += 1
        try:
            with Client(address, timeout=self.timeout, credentials=creds) as c:
                call(c)
        except (PermissionDenied, AuthenticationFailed) as exc:
            expected = AuthenticationFailed if role == "dropped" else PermissionDenied
            if isinstance(exc, expected):
                self.counts[f"denied-refused:{kind}"] += 1
                return
            raise
        except (MergetxnError, OSError):  # a fault in the way (a replica killed, cut): verify() still checks
            self.counts[f"denied-interrupted:{kind}"] += 1
            return
        self.findings.append(f"hostile lane: replica {address} let the lane's {role} do what its grants deny ({kind})")

    def verify(self, address: str) -> list[str]:
        """After the run: nothing a denied call asked for happened (a call that failed some other
        way, under a fault, may still not have taken effect)."""
        if self.admin is None:
            return []
        problems: list[str] = []
        with Client(address, timeout=60.0, credentials=self.admin) as admin:
            tables = admin.tables()
            if DENIED_TABLE in tables:
                problems.append(f"hostile lane: table {DENIED_TABLE} exists, though only denied calls created it")
            if LANE_TABLE in tables and admin.read(LANE_TABLE).num_rows:
                problems.append(f"hostile lane: {LANE_TABLE} has rows, though only denied calls wrote to it")
            for t in tables:
                if admin.describe_table(t).get("retention_seconds") == DENIED_RETENTION:
                    problems.append(f"hostile lane: table {t} has the retention a denied alter_table asked for")
            if any(u["name"] == "hostile_made" for u in admin.users()):
                problems.append("hostile lane: user hostile_made exists, though only a denied call made it")
        return problems

    def summary(self) -> dict:
        return {
            "counts": dict(sorted(self.counts.items())),
            "findings": list(self.findings),
            "error": None if self.error is None else f"{type(self.error).__name__}: {self.error}",
        }
