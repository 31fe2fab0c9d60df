"""The hostile-client lane of ``mergetxn chaos``: a client that is buggy or malicious, beside the
honest workloads (SPEC.md "A replica survives its clients").

One thread sends, at a random replica each time, what no honest client sends:

* ``junk``: one bad frame on a fresh connection (a million ``[``, a declared length of 4 GiB, a
  frame cut short, bytes that are not JSON, JSON that is not a request, invalid UTF-8), then
  closes it or leaves it open;
* ``idle``: dozens of connections that never send a byte, held for a while;
* ``forged``: parts whose path is another table's committed file, or a part some commit already
  named, staged in a transaction: each must be refused (InvalidInput), and the transaction is
  rolled back (nothing may be deleted that a commit names).

The lane records what it sent and how each was answered. A forged part that is accepted is a
finding; a replica that stops serving is found by the run itself (the honest workloads' commits,
the probes after each fault, every replica read at one CSN at the end, and the files of every
table checked against the log).
"""

from __future__ import annotations

import dataclasses
import random
import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable

import pyarrow as pa

from coordinator.client import Client
from coordinator.errors import InvalidInput, MergetxnError
from parts.format import write_part
from parts.meta import PartMeta

_HEADER = struct.Struct(">I")
IDLE_CONNECTIONS = 40
IDLE_SECONDS = 3.0
PAUSE = (0.05, 0.5)  # seconds between two attacks


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

    def __init__(self, addresses: Callable[[], list[str]], stop: threading.Event, seed: int,
                 timeout: float = 10.0) -> None:
        super().__init__(name="hostile", daemon=True)
        self.addresses = addresses
        self.stop_event = stop
        self.rng = random.Random(seed)
        self.timeout = timeout
        self.counts: Counter[str] = Counter()
        self.findings: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        attacks = [self.junk, self.junk, self.junk, self.idle, self.forged]
        try:
            while not self.stop_event.is_set():
                addresses = self.addresses()
                if addresses:
                    self.rng.choice(attacks)(self.rng.choice(addresses))
                self.stop_event.wait(self.rng.uniform(*PAUSE))
        except BaseException as exc:  # reported by the run: the lane must not die quietly
            self.error = exc

    # -- junk frames and idle connections ---------------------------------------------------------
    def _connect(self, address: str) -> socket.socket | None:
        host, _, port = address.rpartition(":")
        try:
            return socket.create_connection((host, int(port)), timeout=self.timeout)
        except OSError:
            self.counts["connect-failed"] += 1  # the replica is down or cut: the nemesis's doing
            return None

    def junk(self, address: str) -> None:
        kind, data = self.rng.choice(sorted(junk_frames().items()))
        sock = self._connect(address)
        if sock is None:
            return
        self.counts[f"junk:{kind}"] += 1
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
        socks = [s for s in (self._connect(address) for _ in range(IDLE_CONNECTIONS)) if s is not None]
        self.counts["idle-connections"] += len(socks)
        self.stop_event.wait(IDLE_SECONDS)
        for s in socks:
            s.close()

    # -- forged parts -------------------------------------------------------------------------------
    def forged(self, address: str) -> None:
        try:
            client = Client(address, timeout=self.timeout)
        except (MergetxnError, OSError):
            self.counts["connect-failed"] += 1
            return
        try:
            tables = sorted(client.tables())
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
                mine = write_part(client.storage, thief, [], (), pa.Table.from_pylist([], schema=tdef.schema), tx.id,
                                  tdef.ddl_version)
                attempts["another-tables-file"] = (thief, dataclasses.replace(
                    mine, path=victim.path, size=victim.size, checksum=victim.checksum))
            for kind, (table, meta) in attempts.items():
                self.counts[f"forged:{kind}"] += 1
                try:
                    tx.add_parts(table, [meta])
                except InvalidInput:
                    self.counts[f"forged-refused:{kind}"] += 1
                    continue
                self.findings.append(f"hostile lane: replica {client.address} accepted a forged part ({kind}): "
                                     f"{meta.name} of {table!r} at {meta.path!r}")
        finally:
            try:
                tx.rollback()
            except MergetxnError:
                pass

    def summary(self) -> dict:
        return {"counts": dict(sorted(self.counts.items())), "findings": list(self.findings),
                "error": None if self.error is None else f"{type(self.error).__name__}: {self.error}"}

