"""The client-replica wire protocol: length-prefixed JSON frames over a persistent TCP connection.

Each request is ``{"a": action, "b": args}`` and each answer ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": {"type", "message", "details"}}``. Only metadata crosses it (part
descriptors, snapshots, transaction ids); data goes to storage directly. A call costs about a
sixth of the CPU of a gRPC (Arrow Flight) action in Python, which is what bounds the commit rate
of small transactions on a small machine.
"""

from __future__ import annotations

import logging
import select
import socket
import socketserver
import struct
import threading
from collections.abc import Callable
from typing import Any, BinaryIO

from coordinator import errors, jsonwire

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">I")
MAX_FRAME = 256 * 1024 * 1024


def _read_exact(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) < n:
        raise EOFError("connection closed")
    return data


def read_frame(f: BinaryIO) -> Any:
    (n,) = _HEADER.unpack(_read_exact(f, _HEADER.size))
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes exceeds the limit")
    return jsonwire.loads(_read_exact(f, n))


def frame(obj: Any) -> bytes:
    body = jsonwire.dumps(obj)
    return _HEADER.pack(len(body)) + body


Dispatch = Callable[[str, dict], dict]


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        dispatch: Dispatch = self.server.dispatch  # type: ignore[attr-defined]
        while True:
            try:
                request = read_frame(self.rfile)
            except (EOFError, ConnectionError, OSError):
                return
            except ValueError as exc:
                self.wfile.write(frame({"ok": False, "error": errors.InvalidInput(f"bad request: {exc}").to_dict()}))
                return
            if not isinstance(request, dict) or not isinstance(request.get("b", {}), dict):
                reply = {"ok": False, "error": errors.InvalidInput("request must be {a: action, b: {args}}").to_dict()}
            else:
                reply = dispatch(str(request.get("a")), request.get("b") or {})
            try:
                self.wfile.write(frame(reply))
                self.wfile.flush()
            except (ConnectionError, OSError):
                return


class RpcServer(socketserver.ThreadingTCPServer):
    """A thread per client connection; ``dispatch(action, args)`` returns the reply envelope."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str, port: int, dispatch: Dispatch) -> None:
        self.dispatch = dispatch
        super().__init__((host, port), _Handler)

    @property
    def port(self) -> int:
        return self.server_address[1]

    def serve(self) -> None:
        """Serve until :meth:`shutdown` (run it in a thread of its own)."""
        self.serve_forever()

    def shutdown(self) -> None:
        super().shutdown()
        self.server_close()


class RpcClient:
    """One connection per calling thread, opened on first use and reopened after a failure."""

    def __init__(self, address: str, timeout: float) -> None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise errors.InvalidInput(f"replica address must be 'host:port', not {address!r}")
        self.address = address
        self._endpoint = (host, int(port))
        self._timeout = timeout
        self._local = threading.local()
        self._all: list[socket.socket] = []
        self._lock = threading.Lock()

    def _connection(self) -> tuple[socket.socket, BinaryIO]:
        conn = getattr(self._local, "conn", None)
        if conn is not None and not _alive(conn[0]):
            self._drop()
            conn = None
        if conn is None:
            try:
                sock = socket.create_connection(self._endpoint, timeout=min(self._timeout, 10.0))
            except OSError as exc:
                raise errors.ReplicaUnavailable(f"replica {self.address} is unreachable: {exc}") from None
            sock.settimeout(self._timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = (sock, sock.makefile("rb"))
            self._local.conn = conn
            with self._lock:
                self._all.append(sock)
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            try:
                conn[0].close()
            except OSError:
                pass

    def call(self, action: str, args: dict) -> Any:
        """One request/answer. A failure before anything was sent is retried once on a new
        connection (a replica restarted since the last call); a failure after sending is
        ReplicaUnavailable, because the action may or may not have happened."""
        payload = frame({"a": action, "b": args})
        for attempt in (0, 1):
            sock, rfile = self._connection()
            try:
                sock.sendall(payload)
            except OSError as exc:
                self._drop()
                if attempt == 0:
                    continue
                raise errors.ReplicaUnavailable(f"replica {self.address} is unreachable: {exc}") from None
            try:
                reply = read_frame(rfile)
            except (EOFError, OSError, ValueError) as exc:
                self._drop()
                if attempt == 0 and isinstance(exc, EOFError) and action in IDEMPOTENT:
                    continue
                raise errors.ReplicaUnavailable(
                    f"replica {self.address} did not answer {action!r}: {exc or type(exc).__name__}"
                ) from None
            if not reply.get("ok"):
                raise errors.from_dict(reply.get("error") or {})
            return reply.get("result")
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            for s in self._all:
                try:
                    s.close()
                except OSError:
                    pass
            self._all.clear()
        self._local = threading.local()


def _alive(sock: socket.socket) -> bool:
    """Whether an idle connection is still open (a restarted replica closed the old ones)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return not readable or sock.recv(1, socket.MSG_PEEK) != b""
    except (OSError, ValueError):
        return False


# Actions that may be sent again when a connection closed before answering.
IDEMPOTENT = frozenset({
    "info", "begin", "table", "tables", "visible", "snapshot", "wait", "transactions", "parts", "commit_status",
})
