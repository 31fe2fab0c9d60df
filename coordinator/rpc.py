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
import selectors
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt

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
Reply = Callable[[dict], None]
# ``inline(action, args, reply)``: True when it took the request (``reply`` is then called once,
# from any thread); False to have ``dispatch`` run it on a worker thread. Runs on the I/O thread,
# so it must never block: it takes only what it can answer (or hand on) at once.
Inline = Callable[[str, dict, Reply], bool]


def error_reply(exc: BaseException) -> dict:
    return {"ok": False, "error": exc.to_dict() if isinstance(exc, errors.MergetxnError)
            else errors.MergetxnError(repr(exc)).to_dict()}


class _Conn:
    __slots__ = ("sock", "inbuf", "outbuf", "busy", "closed", "close_after", "in_next")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.busy = False  # a request of this connection is being answered
        self.closed = False
        self.close_after = False  # close once the outgoing bytes are sent (a malformed request)
        self.in_next = False  # _next is running for it (an answer given inline continues its loop)


class RpcServer:
    """One I/O thread serves every connection (epoll); requests run inline when ``inline`` takes
    them, otherwise on a pool of worker threads.

    Commits are what this server is for, and on a small machine they are bounded by the replica's
    CPU under one GIL: a thread per connection spent a large share of it handing the GIL between
    connection threads. Here begin, stage and commit never leave the I/O thread (a commit is handed
    to the group committer, whose callback queues the answer back to this thread); only actions
    that may wait (reads at a snapshot, cleanup, compaction) go to workers. One request per
    connection is answered at a time, in order; bytes that arrive meanwhile wait in its buffer.
    """

    def __init__(self, host: str, port: int, dispatch: Dispatch, inline: Inline | None = None,
                 workers: int = 128) -> None:
        self.dispatch = dispatch
        self.inline = inline
        self._listener = socket.create_server((host, port), backlog=256)
        self._listener.setblocking(False)
        self.server_address = self._listener.getsockname()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._calls: deque[Callable[[], None]] = deque()
        self._calls_lock = threading.Lock()
        self._woken = False
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rpc-worker")
        self._conns: set[_Conn] = set()
        self._stop = threading.Event()
        self._done = threading.Event()
        self._loop_ident: int | None = None

    @property
    def port(self) -> int:
        return self.server_address[1]

    # -- the I/O thread ----------------------------------------------------------------------
    def serve(self) -> None:
        """Serve until :meth:`shutdown` (run it in a thread of its own)."""
        self._loop_ident = threading.get_ident()
        self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self._stop.is_set():
                for key, mask in self._sel.select(0.5):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        self._run_calls()
                    else:
                        conn: _Conn = key.data
                        if mask & selectors.EVENT_WRITE:
                            self._flush(conn)
                        if mask & selectors.EVENT_READ and not conn.closed:
                            self._read(conn)
        finally:
            for conn in list(self._conns):
                self._close(conn)
            for s in (self._listener, self._wake_r, self._wake_w):
                s.close()
            self._sel.close()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._done.set()

    serve_forever = serve

    def shutdown(self) -> None:
        self._stop.set()
        self._wake()
        if self._loop_ident is not None:
            self._done.wait(10)
        else:  # never served
            self._listener.close()
            self._pool.shutdown(wait=False)

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the I/O thread (from any thread)."""
        with self._calls_lock:
            self._calls.append(fn)
            wake, self._woken = not self._woken, True
        if wake:
            self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # already awake (the pipe is full) or shut down

    def _run_calls(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass
        with self._calls_lock:
            calls, self._calls = self._calls, deque()
            self._woken = False
        for fn in calls:
            try:
                fn()
            except Exception:
                log.exception("RPC I/O callback failed")

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, say: keep serving the others
                log.warning("accept failed: %r", exc)
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock)
            self._conns.add(conn)
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _close(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._conns.discard(conn)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(1 << 18)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if not data:
            self._close(conn)
            return
        conn.inbuf += data
        self._next(conn)

    def _next(self, conn: _Conn) -> None:
        """Answer the requests waiting in the connection's buffer, one at a time."""
        if conn.in_next:
            return
        conn.in_next = True
        try:
            self._next_requests(conn)
        finally:
            conn.in_next = False

    def _next_requests(self, conn: _Conn) -> None:
        while not conn.busy and not conn.closed and not conn.close_after and len(conn.inbuf) >= _HEADER.size:
            (n,) = _HEADER.unpack_from(conn.inbuf)
            if n > MAX_FRAME:
                self._answer_and_close(conn, f"frame of {n} bytes exceeds the limit")
                return
            if len(conn.inbuf) < _HEADER.size + n:
                return
            body = bytes(conn.inbuf[_HEADER.size:_HEADER.size + n])
            del conn.inbuf[:_HEADER.size + n]
            try:
                request = jsonwire.loads(body)
            except ValueError as exc:
                self._answer_and_close(conn, str(exc))
                return
            conn.busy = True
            if not isinstance(request, dict) or not isinstance(request.get("b", {}), dict):
                self._send(conn, {"ok": False, "error": errors.InvalidInput(
                    "request must be {a: action, b: {args}}").to_dict()})
                continue
            self._request(conn, str(request.get("a")), request.get("b") or {})

    def _answer_and_close(self, conn: _Conn, why: str) -> None:
        conn.busy = True
        conn.close_after = True
        self._send(conn, {"ok": False, "error": errors.InvalidInput(f"bad request: {why}").to_dict()})

    def _request(self, conn: _Conn, action: str, args: dict) -> None:
        answered = False

        def reply(envelope: dict) -> None:
            nonlocal answered
            if answered:
                return
            answered = True
            if threading.get_ident() == self._loop_ident:
                self._send(conn, envelope)
            else:
                self.call_soon(lambda: self._send(conn, envelope))

        if self.inline is not None:
            try:
                if self.inline(action, args, reply):
                    return
            except Exception as exc:  # a bug in a fast path must not take the I/O thread down
                log.exception("inline action %s failed", action)
                reply(error_reply(exc))
                return
        self._pool.submit(self._work, action, args, reply)

    def _work(self, action: str, args: dict, reply: Reply) -> None:
        try:
            envelope = self.dispatch(action, args)
        except BaseException as exc:  # dispatch answers errors itself; this is a last resort
            envelope = error_reply(exc)
        reply(envelope)

    def _send(self, conn: _Conn, envelope: dict) -> None:
        """On the I/O thread: queue the answer and send what the socket takes now."""
        if conn.closed:
            return
        conn.outbuf += frame(envelope)
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            while conn.outbuf:
                n = conn.sock.send(conn.outbuf)
                del conn.outbuf[:n]
        except (BlockingIOError, InterruptedError):
            self._sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
            return
        except OSError:
            self._close(conn)
            return
        if conn.close_after:
            self._close(conn)
            return
        if self._sel.get_key(conn.sock).events & selectors.EVENT_WRITE:
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
        conn.busy = False
        self._next(conn)


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
        ReplicaUnavailable, because the action may or may not have happened, except that an
        action in IDEMPOTENT whose connection closed before it answered is sent once more."""
        try:
            return _RESEND_ONCE(self._attempt, action, frame({"a": action, "b": args}))
        except _Resend as exc:
            raise errors.ReplicaUnavailable(str(exc)) from None

    def _attempt(self, action: str, payload: bytes) -> Any:
        sock, rfile = self._connection()
        try:
            sock.sendall(payload)
        except OSError as exc:
            self._drop()
            raise _Resend(f"replica {self.address} is unreachable: {exc}") from None
        try:
            reply = read_frame(rfile)
        except (EOFError, OSError, ValueError) as exc:
            self._drop()
            message = f"replica {self.address} did not answer {action!r}: {exc or type(exc).__name__}"
            if isinstance(exc, EOFError) and action in IDEMPOTENT:
                raise _Resend(message) from None
            raise errors.ReplicaUnavailable(message) from None
        if not reply.get("ok"):
            raise errors.from_dict(reply.get("error") or {})
        return reply.get("result")

    def close(self) -> None:
        with self._lock:
            for s in self._all:
                try:
                    s.close()
                except OSError:
                    pass
            self._all.clear()
        self._local = threading.local()


class _Resend(Exception):
    """An attempt of RpcClient.call failed where sending the request again is safe; the message
    is what the caller gets as ReplicaUnavailable if it was the last attempt."""


# The resend policy of RpcClient.call: a second attempt, at once, after a _Resend.
_RESEND_ONCE = Retrying(retry=retry_if_exception_type(_Resend), stop=stop_after_attempt(2), reraise=True)


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
    "describe_table",
})
