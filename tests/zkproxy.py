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
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
from dataclasses import dataclass, field

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


class _Connection:
    """One client connection and its upstream twin; two pump threads, cut together."""

    def __init__(self, proxy: ZkProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = server
        self._doomed: dict[
            int, Fault
        ] = {}  # xid of a forwarded multi -> fault waiting for its reply
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        for target, name in ((self._client_to_server, "c2s"), (self._server_to_client, "s2c")):
            threading.Thread(target=target, name=f"zkproxy-{name}", daemon=True).start()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for s in (self.client, self.server):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self.proxy._forget(self)

    def _client_to_server(self) -> None:
        try:
            _send_packet(self.server, _read_packet(self.client))  # ConnectRequest: no header
            while True:
                body = _read_packet(self.client)
                if len(body) >= _REQ_HEADER.size:
                    xid, op = _REQ_HEADER.unpack_from(body)
                    if op == MULTI:
                        fault = self.proxy._on_multi()
                        if fault is not None and fault.kind == "instead":
                            fault.xid = xid
                            log.info(
                                "zkproxy: dropping the connection instead of multi xid=%d", xid
                            )
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
        try:
            _send_packet(self.client, _read_packet(self.server))  # ConnectResponse
            while True:
                body = _read_packet(self.server)
                if len(body) >= 4:
                    (xid,) = _LEN.unpack_from(body)
                    with self._lock:
                        fault = self._doomed.pop(xid, None)
                    if fault is not None:
                        log.info(
                            "zkproxy: multi xid=%d done on the server; dropping its reply", xid
                        )
                        fault.fired.set()
                        return
                _send_packet(self.client, body)
        except _Closed:
            pass
        finally:
            self.close()


class ZkProxy:
    """A threaded TCP proxy on 127.0.0.1 in front of ``upstream`` (``host:port``)."""

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._conns: set[_Connection] = set()
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._blocked = threading.Event()
        self._stopped = threading.Event()
        self.multis_seen = 0
        self.accepted = 0
        self._thread = threading.Thread(
            target=self._accept_loop, name="zkproxy-accept", daemon=True
        )

    @property
    def address(self) -> str:
        """``127.0.0.1:port``: give it to kazoo instead of the server's address."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> ZkProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        try:
            self._listener.close()
        except OSError:
            pass
        self.drop_all()

    def __enter__(self) -> ZkProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

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

    def block(self) -> None:
        """Partition: cut every connection and refuse (accept and close) new ones."""
        self._blocked.set()
        self.drop_all()

    def unblock(self) -> None:
        self._blocked.clear()

    def drop_all(self) -> None:
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            c.close()

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._conns)

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

    def _forget(self, conn: _Connection) -> None:
        with self._lock:
            self._conns.discard(conn)

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._blocked.is_set():
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError as exc:
                log.info("zkproxy: upstream %s unreachable: %r", self.upstream, exc)
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(self, client, server)
            with self._lock:
                self._conns.add(conn)
                self.accepted += 1
            conn.start()
