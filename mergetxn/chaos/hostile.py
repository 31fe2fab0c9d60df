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
* ``lies``: a part written honestly whose descriptor then lies about its file (a checksum of
  zeros, a row too many, a size 4 KiB too large, statistics that miss the file's values):
  each must be refused (InvalidInput) before it is staged (docs/rules.md, nothing a writer
  claims is believed);
* ``inlined``: forged inlined parts (small writes, docs/architecture/small-writes.md), encoded
  as an insert encodes them, whose descriptor lies about their rows, checksum or statistics (a
  min/max that misses the part's value), one row past the table's ``inline_rows``, or one staged
  by an overwrite: each must be refused (InvalidInput) against its own bytes and settings, and
  the lane's partitioned table stays empty; every kind is tried each round (those a fault kept
  from an answer, at each other replica once);
* ``huge-partition``: an insert whose partition value is 400,000 characters long, through the
  client and as a hand-made descriptor: each must be refused (InvalidInput), and the lane's
  partitioned table stays empty;
* ``flood``: more connections that never send a byte than the per-address cap, from the lane's
  own address, then a legitimate call from that address, which must be served (a plaintext
  replica that turns it away by its cap is a finding);
* ``denied`` (a secured cluster only): calls that a reader's or a writer's grants do not allow
  (writes, DDL, another user's kill, ``gc``, user management, a statement in a transaction) and a
  dropped user's login: each must raise PermissionDenied (AuthenticationFailed for the login) and
  change nothing, which :meth:`Hostile.verify` checks after the run (the lane's table still
  empty, no table it tried to create, no retention it tried to set);
* ``others-ids`` (a secured cluster only): the lane's reader sends the writer's session id
  (``heartbeat``, while its transaction runs) and read lease id (``renew``, ``release``): each must be refused.

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
import functools
import random
import socket
import ssl
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pyarrow as pa

from coordinator.core import retries
from coordinator.core.errors import (
    AuthenticationFailed,
    InvalidInput,
    MergetxnError,
    PermissionDenied,
)
from coordinator.model.catalog import TableDef
from coordinator.wire.rpc import frame
from coordinator.wire.security import Credentials
from mergetxn.client.client import Client, Transaction
from parts.io.format import new_part_name, write_part
from parts.io.write import write_data
from parts.model.meta import INLINE_MAX_BYTES, PartMeta

_HEADER = struct.Struct(">I")
IDLE_CONNECTIONS = 40
IDLE_SECONDS = 3.0
PAUSE = (0.05, 0.5)  # seconds between two attacks
DENIED_WAIT_SECONDS = 8.0  # how long a denied call waits for its replica to accept a login
LANE_TABLE = "hostile_t"  # the lane's own table: no denied write may ever reach it
DENIED_TABLE = "hostile_created"  # a table a reader and a writer try to create
DENIED_RETENTION = 1.0  # what a writer tries to set on other tables
LANE_SCHEMA = pa.schema([("id", pa.int64())])
PARTITIONED_TABLE = "hostile_p"  # the lane's partitioned table: no lie and no huge value may reach it
PARTITIONED_SCHEMA = pa.schema([("p", pa.string()), ("n", pa.int64())])
HUGE_PARTITION = 400_000  # characters of the huge partition value
FLOOD_CONNECTIONS = 300  # idle connections of a flood: above the per-address cap of 256
LIES = ("checksum", "rows", "size", "stats")
# Forged inlined parts: lies their own bytes refute, one row past the table's inline_rows, an
# honest one in an overwrite (only an insert takes inlined parts).
INLINED = ("rows", "checksum", "stats", "over-threshold", "overwrite")
LANE_INLINE = (8, 16 * 1024)  # the partitioned table's inline_rows and inline_bytes


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
        attacks: list[Callable[[str], None]] = [
            self.junk,
            self.junk,
            self.junk,
            self.idle,
            self.forged,
            self.lies,
            self.inlined,
            self.huge_partition,
            self.flood,
        ]
        self.rng.shuffle(attacks)
        if self.admin is not None:
            attacks = [self.denied, self.denied, self.others_ids] + attacks
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
        if sock is None or reader is None:
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
                try:
                    tx.add_parts(table, [meta])
                except InvalidInput:
                    self.counts[f"forged:{kind}"] += 1
                    self.counts[f"forged-refused:{kind}"] += 1
                    continue
                # (any other error, a fault's, leaves it untried: counted by forged(), as is the rest)
                self.counts[f"forged:{kind}"] += 1
                self.findings.append(
                    f"hostile lane: replica {client.address} accepted a forged part ({kind}): "
                    f"{meta.name} of {table!r} at {meta.path!r}"
                )
        finally:
            try:
                tx.rollback()
            except MergetxnError:
                pass

    # -- lying descriptors and huge partition values ---------------------------------------------
    def _lane_client(self, address: str) -> Client | None:
        """A client (the admin's on a secured cluster) with the lane's partitioned table made."""
        try:
            client = Client(address, timeout=self.timeout, credentials=self.admin)
        except (MergetxnError, OSError):
            self.counts["connect-failed"] += 1
            return None
        try:
            if PARTITIONED_TABLE not in client.tables():
                rows, size = LANE_INLINE
                client.create_table(
                    PARTITIONED_TABLE, PARTITIONED_SCHEMA, partition_by=["p"], inline_rows=rows, inline_bytes=size
                )
        except (MergetxnError, OSError) as exc:
            self.counts[f"lane-table-not-made:{type(exc).__name__}"] += 1
            client.close()
            return None
        return client

    def lies(self, address: str) -> None:
        client = self._lane_client(address)
        if client is None:
            return
        kind = self.rng.choice(LIES)
        with self._lane_transaction(client, "lie") as tx:
            if tx is None:
                return
            row = pa.table({"p": ["x"], "n": [7]}, schema=PARTITIONED_SCHEMA)
            tdef = client.table(PARTITIONED_TABLE)
            (honest,) = write_data(client.storage, tdef, row, tx.id)
            self._refused(f"lie:{kind}", lambda: tx.add_parts(PARTITIONED_TABLE, [lie(honest, kind)]), client)

    @contextlib.contextmanager
    def _lane_transaction(self, client: Client, what: str) -> Iterator[Transaction | None]:
        """A transaction of ``client`` (None when a fault kept it from beginning), rolled back
        after the block, then the client closed; a fault in the way (MergetxnError, OSError) ends
        the block, counted ``{what}-not-tried``."""
        try:
            try:
                tx = client.begin()
            except (MergetxnError, OSError) as exc:
                self.counts[f"{what}-not-tried:{type(exc).__name__}"] += 1  # a fault before it began
                yield None
                return
            try:
                yield tx
            except (MergetxnError, OSError) as exc:
                self.counts[f"{what}-not-tried:{type(exc).__name__}"] += 1  # a fault in the way
            finally:
                with contextlib.suppress(MergetxnError, OSError):
                    tx.rollback()
        finally:
            client.close()

    def inlined(self, address: str) -> None:
        """Every forged inlined part (:data:`INLINED`) tried at ``address``; those a fault kept
        from an answer there, at each other replica once (:meth:`_until_tried`)."""
        left = list(INLINED)

        def attempt(at: str) -> bool:
            nonlocal left
            left = self._inlined_at(at, left)
            return not left

        self._until_tried(address, attempt)

    def _until_tried(self, address: str, attempt: Callable[[str], bool]) -> None:
        """``attempt`` at ``address``, then, while a fault keeps it from being tried (it returns
        False), at each other replica once: a short run under kills and pauses still tries it."""
        others = [a for a in self.addresses() if a != address]
        self.rng.shuffle(others)
        for at in [address, *others]:
            if attempt(at) or self.stop_event.is_set():
                return

    def _inlined_at(self, address: str, kinds: list[str]) -> list[str]:
        """Each of ``kinds`` staged at ``address`` in one transaction, rolled back after; returns
        the kinds a fault kept from an answer (the first interrupted one and those after it)."""
        client = self._lane_client(address)
        if client is None:
            return kinds
        left = list(kinds)
        with self._lane_transaction(client, "inlined") as tx:
            if tx is None:
                return left
            tdef = client.table(PARTITIONED_TABLE)
            limits = tdef.inline_limits(*client.inline_settings)
            while left:
                meta, op = forged_inlined(client, tdef, limits, tx.id, left[0])
                stage = functools.partial(tx.add_parts, PARTITIONED_TABLE, [meta], op=op)
                if not self._refused(f"inlined:{left[0]}", stage, client):
                    break
                left.pop(0)
        return left

    def huge_partition(self, address: str) -> None:
        client = self._lane_client(address)
        if client is None:
            return
        value = "x" * HUGE_PARTITION
        try:
            if self.rng.random() < 0.5:
                data = pa.table({"p": [value], "n": [1]}, schema=PARTITIONED_SCHEMA)
                self._refused("huge-partition:insert", lambda: client.insert(PARTITIONED_TABLE, data), client)
                return
            tx = client.begin()
            try:
                meta = huge_descriptor(PARTITIONED_TABLE, value, tx.id, client.table(PARTITIONED_TABLE).ddl_version)
                self._refused("huge-partition:descriptor", lambda: tx.add_parts(PARTITIONED_TABLE, [meta]), client)
            finally:
                with contextlib.suppress(MergetxnError):
                    tx.rollback()
        except (MergetxnError, OSError) as exc:
            self.counts[f"huge-partition-not-tried:{type(exc).__name__}"] += 1
        finally:
            client.close()

    def _refused(self, kind: str, call: Callable[[], object], client: Client) -> bool:
        """``call`` must raise InvalidInput; anything accepted is a finding, a fault is counted.
        False: a fault kept it from an answer."""
        self.counts[kind] += 1
        try:
            call()
        except InvalidInput:
            self.counts[f"refused:{kind}"] += 1
            return True
        except (MergetxnError, OSError) as exc:  # a fault in the way
            self.counts[f"interrupted:{kind}:{type(exc).__name__}"] += 1
            return False
        self.findings.append(f"hostile lane: replica {client.address} accepted what it must refuse ({kind})")
        return True

    # -- a flood of connections that never send a byte -------------------------------------------
    def flood(self, address: str) -> None:
        socks: list[socket.socket] = []
        try:
            for _ in range(FLOOD_CONNECTIONS):
                sock = self._connect(address)
                if sock is None:
                    break
                socks.append(sock)
            self.counts["flood-connections"] += len(socks)
            try:
                with Client(address, timeout=self.timeout, credentials=self.admin) as c:
                    c.snapshot()
                self.counts["flood-served"] += 1
            except (MergetxnError, OSError) as exc:
                if "refused the connection" in str(exc):  # turned away by a cap the flood holds
                    self.findings.append(
                        f"hostile lane: replica {address} refused a legitimate client during a flood: {exc}"
                    )
                else:
                    self.counts[f"flood-interrupted:{type(exc).__name__}"] += 1
        finally:
            for s in socks:
                s.close()

    # -- another user's ids (a secured cluster) ----------------------------------------------------
    def others_ids(self, address: str) -> None:
        """Tried at ``address``, then at each other replica once while a fault keeps it from
        being tried (:meth:`_until_tried`)."""
        self._until_tried(address, self._others_ids_at)

    def _others_ids_at(self, address: str) -> bool:
        """One try of another user's ids at ``address``; False when a fault kept it from being tried."""
        if "writer" not in self.users or "reader" not in self.users:
            try:  # made by the first denied call, unless a fault was in its way
                with Client(address, timeout=self.timeout, credentials=self.admin) as admin:
                    self.prepare(admin)
            except (MergetxnError, OSError) as exc:
                self.counts[f"others-ids-not-tried:{type(exc).__name__}"] += 1
                return False
        writer, reader = self.users["writer"], self.users["reader"]
        kind = self.rng.choice(["heartbeat", "renew", "release"])
        try:
            with Client(address, timeout=self.timeout, credentials=writer) as w:
                tx = w.begin()
                lease = w.call("visible", table=LANE_TABLE).get("lease") if kind in ("renew", "release") else None
                try:
                    args = {"session": w.session} if lease is None else {"lease": lease}
                    if kind in ("renew", "release") and lease is None:
                        return True  # no lease to try with: nothing to learn here
                    with Client(address, timeout=self.timeout, credentials=reader) as r:
                        self._denied_id(address, kind, lambda: r.call(kind, **args))
                finally:
                    with contextlib.suppress(MergetxnError):
                        tx.rollback()
                    if lease is not None:
                        with contextlib.suppress(MergetxnError):
                            w.call("release", lease=lease)
        except (MergetxnError, OSError) as exc:
            self.counts[f"others-ids-not-tried:{type(exc).__name__}"] += 1
            return False
        return True

    def _denied_id(self, address: str, kind: str, call: Callable[[], object]) -> None:
        """Another user's id is answered as an unknown one (docs/surface.md, users and grants):
        nothing kept alive, renewed, released or reported; an answer that acts on it is a finding."""
        self.counts[f"others-ids:{kind}"] += 1
        try:
            answer = call()
        except PermissionDenied:
            self.counts[f"others-ids-refused:{kind}"] += 1
            return
        except (MergetxnError, OSError) as exc:
            self.counts[f"others-ids-interrupted:{kind}:{type(exc).__name__}"] += 1
            return
        if not acted_on(kind, answer):
            self.counts[f"others-ids-refused:{kind}"] += 1
            return
        self.findings.append(
            f"hostile lane: replica {address} let the lane's reader use the writer's id ({kind}): {answer!r}"
        )

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

        def in_transaction(
            statement: Callable[[Transaction], object], then_read: bool = False
        ) -> Callable[[Client], None]:
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
        problems: list[str] = []
        with Client(address, timeout=60.0, credentials=self.admin) as admin:
            tables = admin.tables()
            if PARTITIONED_TABLE in tables and admin.read(PARTITIONED_TABLE).num_rows:
                problems.append(f"hostile lane: {PARTITIONED_TABLE} has rows, though only refused writes went to it")
            if self.admin is None:
                return problems
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


def acted_on(kind: str, answer: object) -> bool:
    """Whether a replica's answer to ``kind`` (heartbeat, flush, renew, release) acted on the id it
    was sent: a session known, a lease renewed or released, a flush that found commits."""
    if not isinstance(answer, dict):
        return True
    if kind == "heartbeat":
        return bool(answer.get("known"))
    if kind == "flush":
        return answer.get("csn") is not None or bool(answer.get("accepted")) or bool(answer.get("failed"))
    return bool(answer.get("renewed" if kind == "renew" else "released"))


def lie(meta: PartMeta, kind: str) -> PartMeta:
    """An honest part's descriptor made to lie about its file (or inlined bytes) in one field (a
    row too many: an inlined part stays within its table's ``inline_rows``, so its bytes refute it)."""
    if kind == "checksum":
        return dataclasses.replace(meta, checksum="crc32:00000000")
    if kind == "rows":
        return dataclasses.replace(meta, rows=meta.rows + 1)
    if kind == "size":
        return dataclasses.replace(meta, size=meta.size + 4096)
    return dataclasses.replace(meta, stats={**meta.stats, "n": (150, 150)})


def forged_inlined(
    client: Client, tdef: TableDef, limits: tuple[int, int], txn_id: str, kind: str
) -> tuple[PartMeta, str]:
    """A forged inlined part of ``kind`` (:data:`INLINED`) for ``tdef`` (the lane's partitioned
    table, whose inline thresholds are ``limits``) and the op that stages it. Its rows are encoded
    by the insert's road (``write_data``), told to inline whatever it writes (nothing is stored);
    then its descriptor lies (:func:`lie`), or it holds one row past ``inline_rows``
    (``over-threshold``), or it is honest and goes into an overwrite."""
    rows = limits[0] + 1 if kind == "over-threshold" else 1
    data = pa.table({"p": ["x"] * rows, "n": list(range(7, 7 + rows))}, schema=PARTITIONED_SCHEMA)
    (meta,) = write_data(client.storage, tdef, data, txn_id, inline=(rows, INLINE_MAX_BYTES))
    assert meta.inlined, meta  # at most a few hundred bytes
    return (lie(meta, kind) if kind in LIES else meta), "overwrite" if kind == "overwrite" else "insert"


def huge_descriptor(table: str, value: str, txn_id: str, ddl_version: int) -> PartMeta:
    """A descriptor of a part in partition ``value`` (no file is written: its path alone would
    be too long for a file system), sent as is: the replica must refuse it unread."""
    name = new_part_name(txn_id)
    return PartMeta(
        name=name,
        table=table,
        partition=(value,),
        path=f"{table}/p={value}/{name}.parquet",
        rows=1,
        size=512,
        checksum="crc32:00000000",
        stats={},
        creation_tid=txn_id,
        created_at=time.time(),
        schema_version=ddl_version,
    )
