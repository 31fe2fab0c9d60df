"""A fault-injecting TCP proxy in front of a real ZooKeeper server, for fault tests.

It relays ZooKeeper's client protocol between 127.0.0.1:<port> and the server, and understands
just enough of the framing to cut a connection at a chosen point:

* every packet is a 4-byte big-endian length followed by that many bytes;
* the first packet each way is the ConnectRequest / ConnectResponse (no request header);
* every later client packet starts with ``xid:int32, type:int32`` (multi is type 14), and every
  server packet starts with ``xid:int32, zxid:int64, err:int32``; a reply carries the xid of its
  request (watch events use -1, pings -2).

Faults (each armed fault hits exactly one multi, of whichever connection sends one next):

* :meth:`ZkProxy.drop_after_next_multi`: forward the multi, then cut the connection when its reply
  comes back, without relaying it: the multi happened on the server but the client never hears.
* :meth:`ZkProxy.drop_instead_of_next_multi`: cut the connection instead of forwarding the multi:
  the multi never happened.
* :meth:`ZkProxy.block` / :meth:`ZkProxy.unblock`: a network partition: live connections are
  cut and new ones are closed at once, so the client's session expires on the server if the
  partition outlasts its timeout.

A :class:`Fault` says whether (and when) it fired, so a test can assert the fault it meant to
inject really happened, instead of passing on a run where it did not.

The listening, connection bookkeeping and partitions are :class:`mergetxn.chaos.proxy.TcpProxy`'s
(the chaos harness's general proxy); this module adds only ZooKeeper's framing.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
from dataclasses import dataclass, field

from mergetxn.chaos.proxy import Relay, TcpProxy

log = logging.getLogger(__name__)

MULTI = 14
_LEN = struct.Struct(">i")
_REQ_HEADER = struct.Struct(">ii")
MAX_PACKET = 64 * 1024 * 1024


@dataclass
class Fault:
    """One armed fault: ``kind`` is 'after' or 'instead'; ``fired`` is set once it struck."""

    kind: str
    fired: threading.Event = field(default_factory=threading.Event)
    xid: int | None = None  # of the multi it struck


class _Closed(Exception):
    pass


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except OSError as exc:
            raise _Closed(str(exc)) from None
        if not chunk:
            raise _Closed("EOF")
        buf += chunk
    return bytes(buf)


def _read_packet(sock: socket.socket) -> bytes:
    (length,) = _LEN.unpack(_recv_exact(sock, 4))
    if not 0 <= length <= MAX_PACKET:
        raise _Closed(f"bad packet length {length}")
    return _recv_exact(sock, length)


def _send_packet(sock: socket.socket, body: bytes) -> None:
    try:
        sock.sendall(_LEN.pack(len(body)) + body)
    except OSError as exc:
        raise _Closed(str(exc)) from None


class _ZkRelay(Relay):
    """One client connection relayed packet by packet, so a fault can strike around a multi."""

    def __init__(self, proxy: ZkProxy, client: socket.socket) -> None:
        super().__init__(proxy, client)
        self.zk = proxy
        # xid of a forwarded multi -> the fault waiting for its reply
        self._doomed: dict[int, Fault] = {}

    def pumps(self) -> None:
        for target, name in ((self._client_to_server, "c2s"), (self._server_to_client, "s2c")):
            threading.Thread(target=target, name=f"zkproxy-{name}", daemon=True).start()

    def _client_to_server(self) -> None:
        assert self.server is not None
        try:
            _send_packet(self.server, _read_packet(self.client))  # ConnectRequest: no header
            while True:
                body = _read_packet(self.client)
                if len(body) >= _REQ_HEADER.size:
                    xid, op = _REQ_HEADER.unpack_from(body)
                    if op == MULTI:
                        fault = self.zk._on_multi()
                        if fault is not None and fault.kind == "instead":
                            fault.xid = xid
                            log.info("zkproxy: dropping the connection instead of multi xid=%d", xid)
                            fault.fired.set()
                            return
                        if fault is not None:
                            fault.xid = xid
                            with self._lock:
                                self._doomed[xid] = fault
                _send_packet(self.server, body)
        except _Closed:
            pass
        finally:
            self.close()

    def _server_to_client(self) -> None:
        assert self.server is not None
        try:
            _send_packet(self.client, _read_packet(self.server))  # ConnectResponse
            while True:
                body = _read_packet(self.server)
                if len(body) >= 4:
                    (xid,) = _LEN.unpack_from(body)
                    with self._lock:
                        fault = self._doomed.pop(xid, None)
                    if fault is not None:
                        log.info("zkproxy: multi xid=%d done on the server; dropping its reply", xid)
                        fault.fired.set()
                        return
                _send_packet(self.client, body)
        except _Closed:
            pass
        finally:
            self.close()


class ZkProxy(TcpProxy):
    """A threaded TCP proxy on 127.0.0.1 in front of ``upstream`` (``host:port``)."""

    relay_class = _ZkRelay

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream, name="zkproxy")
        self._faults: list[Fault] = []
        self.multis_seen = 0

    def start(self) -> ZkProxy:
        super().start()
        return self

    def __enter__(self) -> ZkProxy:
        return self.start()

    # -- faults --------------------------------------------------------------------------------
    def drop_after_next_multi(self) -> Fault:
        """The next multi reaches the server; the connection is cut before its reply is relayed."""
        return self._arm("after")

    def drop_instead_of_next_multi(self) -> Fault:
        """The connection is cut in place of forwarding the next multi: it never happens."""
        return self._arm("instead")

    def disarm(self) -> None:
        with self._lock:
            self._faults.clear()

    # block() / unblock() / drop_all() / connections: TcpProxy's (block cuts live connections
    # and refuses new ones at once).

    # -- internals -----------------------------------------------------------------------------
    def _arm(self, kind: str) -> Fault:
        fault = Fault(kind)
        with self._lock:
            self._faults.append(fault)
        return fault

    def _on_multi(self) -> Fault | None:
        """Count a multi passing through and hand it the oldest armed fault, if any."""
        with self._lock:
            self.multis_seen += 1
            return self._faults.pop(0) if self._faults else None
