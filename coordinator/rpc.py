"""The client-replica wire protocol: length-prefixed JSON frames over a persistent TCP connection.

Each request is ``{"a": action, "b": args}`` and each answer ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": {"type", "message", "details"}}``. Only metadata crosses it (part
descriptors, snapshots, transaction ids); data goes to storage directly. A call costs about a
sixth of the CPU of a gRPC (Arrow Flight) action in Python, which is what bounds the commit rate
of small transactions on a small machine.

A secured server (``tls`` and ``authenticate``; coordinator/security.py) speaks TLS only and
answers nothing but ``{"a": "auth", "b": {"user", "secret"}}`` until a connection has
authenticated; frames of unauthenticated peers are limited to ``AUTH_FRAME`` bytes. A peer that
does not start a TLS handshake gets one plaintext ``AuthenticationFailed`` frame and is closed,
so a client without credentials learns why. Unsecured servers behave and cost as before.
"""

from __future__ import annotations

import logging
import select
import selectors
import socket
import ssl
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, BinaryIO

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt

from coordinator import errors, jsonwire

if TYPE_CHECKING:
    from coordinator.security import Credentials

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">I")
MAX_FRAME = 256 * 1024 * 1024
AUTH_FRAME = 64 * 1024  # the largest frame a peer that has not authenticated may send
AUTH_SECONDS = 10.0  # a connection that has not authenticated by then is closed
_TLS_HANDSHAKE = 0x16  # the first byte of a TLS ClientHello record


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
# ``authenticate(args)``: who the arguments of an ``auth`` request name (a principal), or None
# (refused). The principal is kept on the connection and set as ``args[PRINCIPAL]`` of each of its
# requests, over anything the peer sent under that name (None on an unsecured server).
Authenticate = Callable[[dict], Any]
PRINCIPAL = "_principal"


def error_reply(exc: BaseException) -> dict:
    return {"ok": False, "error": exc.to_dict() if isinstance(exc, errors.MergetxnError)
            else errors.MergetxnError(repr(exc)).to_dict()}


class _Conn:
    __slots__ = ("sock", "inbuf", "outbuf", "busy", "closed", "close_after", "in_next", "authed", "max_frame",
                 "handshake", "tls", "principal")

    def __init__(self, sock: socket.socket, authed: bool = True, tls: bool = False) -> None:
        self.sock = sock
        self.authed = authed  # may send any request (always, on an unsecured server)
        self.max_frame = MAX_FRAME if authed else AUTH_FRAME
        self.tls = tls
        self.handshake = tls  # waiting for the first bytes, then for the TLS handshake
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.busy = False  # a request of this connection is being answered
        self.closed = False
        self.close_after = False  # close once the outgoing bytes are sent (a malformed request)
        self.in_next = False  # _next is running for it (an answer given inline continues its loop)
        self.principal: Any = None  # who it authenticated as (what authenticate returned)


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
                 workers: int = 128, tls: ssl.SSLContext | None = None,
                 authenticate: Authenticate | None = None) -> None:
        self.dispatch = dispatch
        self.inline = inline
        self.tls = tls
        self.authenticate = authenticate
        self.auth_seconds = AUTH_SECONDS
        self._unauthenticated: dict[_Conn, float] = {}  # connection -> when it is closed unless it authenticated
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
                        if conn.handshake:
                            self._handshake(conn)
                            continue
                        if mask & selectors.EVENT_WRITE:
                            self._flush(conn)
                        if mask & selectors.EVENT_READ and not conn.closed:
                            self._read(conn)
                if self._unauthenticated:
                    self._expire_unauthenticated()
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
            conn = _Conn(sock, self.authenticate is None, self.tls is not None)
            self._conns.add(conn)
            if not conn.authed:
                self._unauthenticated[conn] = time.monotonic() + self.auth_seconds
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _close(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._conns.discard(conn)
        self._unauthenticated.pop(conn, None)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(1 << 18)
            if conn.tls:
                while conn.sock.pending():  # decrypted bytes inside SSL: epoll does not see them
                    data += conn.sock.recv(1 << 18)
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except OSError:
            self._close(conn)
            return
        if not data:
            self._close(conn)
            return
        conn.inbuf += data
        self._next(conn)

    # -- TLS and authentication (secured servers only) -----------------------------------------
    def _handshake(self, conn: _Conn) -> None:
        """A new connection of a TLS server: refuse a peer that does not start with a TLS
        handshake, else drive the handshake without blocking."""
        sock = conn.sock
        if not isinstance(sock, ssl.SSLSocket):
            try:
                first = sock.recv(1, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._close(conn)
                return
            if not first:
                self._close(conn)
                return
            if first[0] != _TLS_HANDSHAKE:
                self._refuse_plaintext(conn)
                return
            self._sel.unregister(sock)
            try:
                sock = conn.sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except (OSError, ValueError) as exc:
                log.info("TLS: cannot wrap a connection: %r", exc)
                conn.closed = True
                self._conns.discard(conn)
                self._unauthenticated.pop(conn, None)
                sock.close()
                return
            self._sel.register(sock, selectors.EVENT_READ, conn)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._sel.modify(sock, selectors.EVENT_READ, conn)
            return
        except ssl.SSLWantWriteError:
            self._sel.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
            return
        except OSError as exc:  # ssl.SSLError included: a bad certificate, a scanner, a reset
            log.info("TLS handshake from %s failed: %s", _peer(sock), exc)
            self._close(conn)
            return
        conn.handshake = False
        self._sel.modify(sock, selectors.EVENT_READ, conn)
        if sock.pending():
            self._read(conn)

    def _expire_unauthenticated(self) -> None:
        """Close the connections that did not authenticate in time (they hold descriptors)."""
        now = time.monotonic()
        for conn in [c for c, deadline in self._unauthenticated.items() if deadline <= now]:
            log.info("closed a connection from %s: no authentication within %gs", _peer(conn.sock), self.auth_seconds)
            self._close(conn)

    def _refuse_plaintext(self, conn: _Conn) -> None:
        """One plaintext AuthenticationFailed frame, then close (after reading what the peer sent,
        so the close is a FIN the peer reads the answer before, not a reset)."""
        try:
            for _ in range(16):
                if not conn.sock.recv(1 << 16):
                    break
        except OSError:
            pass
        conn.handshake = False
        log.info("refused a connection from %s: not TLS", _peer(conn.sock))
        self._refuse(conn, f"replica {_local(conn.sock)} requires TLS and credentials")

    def _refuse(self, conn: _Conn, why: str) -> None:
        conn.busy = True
        conn.close_after = True
        self._send(conn, {"ok": False, "error": errors.AuthenticationFailed(
            f"{why}: connect with the cluster's credentials (credentials=Credentials.from_file(path) or the "
            f"path of the credentials file, or set MERGETXN_CREDENTIALS to it)").to_dict()})

    def _authenticate(self, conn: _Conn, request: Any) -> None:
        """The first request of a connection to a secured server: ``auth``, or it is closed."""
        args = request.get("b") if isinstance(request, dict) else None
        if not isinstance(request, dict) or request.get("a") != "auth" or not isinstance(args, dict):
            self._refuse(conn, f"replica {_local(conn.sock)} requires authentication before any request")
            return
        principal = self.authenticate(args)
        if not principal:
            log.warning("authentication failed from %s (user %r)", _peer(conn.sock), str(args.get("user"))[:100])
            self._refuse(conn, f"authentication failed at replica {_local(conn.sock)}: wrong user or secret")
            return
        conn.authed = True
        conn.principal = principal
        conn.max_frame = MAX_FRAME
        self._unauthenticated.pop(conn, None)
        self._send(conn, {"ok": True, "result": {"user": args.get("user")}})

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
            if n > conn.max_frame:
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
            if not conn.authed:
                self._authenticate(conn, request)
                continue
            if not isinstance(request, dict) or not isinstance(request.get("b", {}), dict):
                self._send(conn, {"ok": False, "error": errors.InvalidInput(
                    "request must be {a: action, b: {args}}").to_dict()})
                continue
            self._request(conn, str(request.get("a")), request.get("b") or {})

    def _answer_and_close(self, conn: _Conn, why: str) -> None:
        if not conn.authed:
            self._refuse(conn, f"replica {_local(conn.sock)} refused a request before authentication ({why})")
            return
        conn.busy = True
        conn.close_after = True
        self._send(conn, {"ok": False, "error": errors.InvalidInput(f"bad request: {why}").to_dict()})

    def _request(self, conn: _Conn, action: str, args: dict) -> None:
        args[PRINCIPAL] = conn.principal
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
        except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
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
    """One connection per calling thread, opened on first use and reopened after a failure.

    With ``credentials`` (coordinator/security.py) each connection is TLS, verified against the
    credentials' CA, and begins with an ``auth`` request; a refusal is AuthenticationFailed,
    never retried."""

    def __init__(self, address: str, timeout: float, credentials: Credentials | None = None) -> None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise errors.InvalidInput(f"replica address must be 'host:port', not {address!r}")
        self.address = address
        self._endpoint = (host, int(port))
        self._timeout = timeout
        self._credentials = credentials
        self._tls = None if credentials is None else credentials.client_context()
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
            conn = (sock, sock.makefile("rb")) if self._tls is None else self._secure(sock)
            self._local.conn = conn
            with self._lock:
                self._all.append(conn[0])
        return conn

    def _secure(self, sock: socket.socket) -> tuple[ssl.SSLSocket, BinaryIO]:
        """TLS over ``sock``, then ``auth``: the connection as :meth:`_connection` keeps it."""
        where = f"replica {self.address}"
        sock.settimeout(min(self._timeout, 10.0))  # the handshake and auth, as for the connect
        try:
            tls = self._tls.wrap_socket(sock, server_hostname=self._endpoint[0])
        except ssl.SSLCertVerificationError as exc:
            sock.close()
            raise errors.AuthenticationFailed(
                f"{where} presented a certificate this client does not accept ({exc.verify_message}): the "
                f"credentials' ca_file must be the CA that signed the replicas' certificate, and the certificate "
                f"must name {self._endpoint[0]!r}") from None
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError, TimeoutError, ConnectionError) as exc:
            sock.close()
            raise errors.ReplicaUnavailable(f"{where} closed the connection during the TLS handshake: {exc}") from None
        except ssl.SSLError as exc:
            sock.close()
            raise errors.AuthenticationFailed(
                f"{where} did not complete a TLS handshake ({exc.reason or exc}): is it started without "
                "--credentials? A client with credentials talks to replicas only over TLS") from None
        except OSError as exc:
            sock.close()
            raise errors.ReplicaUnavailable(f"{where} is unreachable: {exc}") from None
        rfile = tls.makefile("rb")
        try:
            tls.sendall(frame({"a": "auth", "b": self._credentials.auth_request()}))
            reply = read_frame(rfile)
        except (EOFError, OSError, ValueError) as exc:
            tls.close()
            raise errors.ReplicaUnavailable(f"{where} did not answer the authentication: "
                                            f"{exc or type(exc).__name__}") from None
        if not reply.get("ok"):
            tls.close()
            raise errors.from_dict(reply.get("error") or {})
        tls.settimeout(self._timeout)
        return tls, rfile

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            try:
                conn[0].close()
            except OSError:
                pass

    def call(self, action: str, args: dict, timeout: float | None = None) -> Any:
        """One request/answer. A failure before anything was sent is retried once on a new
        connection (a replica restarted since the last call); a failure after sending is
        ReplicaUnavailable, because the action may or may not have happened, except that an
        action in IDEMPOTENT whose connection closed before it answered is sent once more.
        ``timeout``: for this call's answer instead of the client's (a call that must be quick)."""
        try:
            return _RESEND_ONCE(self._attempt, action, frame({"a": action, "b": args}), timeout)
        except _Resend as exc:
            raise errors.ReplicaUnavailable(str(exc)) from None

    def _attempt(self, action: str, payload: bytes, timeout: float | None = None) -> Any:
        sock, rfile = self._connection()
        if timeout is not None:
            sock.settimeout(min(timeout, self._timeout))
        try:
            return self._exchange(sock, rfile, action, payload)
        finally:
            if timeout is not None and getattr(self._local, "conn", None) is not None:
                sock.settimeout(self._timeout)

    def _exchange(self, sock: socket.socket, rfile: BinaryIO, action: str, payload: bytes) -> Any:
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
    """Whether an idle connection is still open (a restarted replica closed the old ones). An
    idle TLS connection has nothing to read (replicas send no session tickets) but a close."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if readable and isinstance(sock, ssl.SSLSocket):
            return False
        return not readable or sock.recv(1, socket.MSG_PEEK) != b""
    except (OSError, ValueError):
        return False


def _peer(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except (OSError, ValueError):
        return "a peer"
    return f"{host}:{port}"


def _local(sock: socket.socket) -> str:
    try:
        host, port = sock.getsockname()[:2]
    except (OSError, ValueError):
        return "(address unknown)"
    return f"{host}:{port}"


# Actions that may be sent again when a connection closed before answering.
IDEMPOTENT = frozenset({
    "info", "begin", "table", "tables", "visible", "snapshot", "wait", "transactions", "parts", "commit_status",
    "describe_table", "app_version", "set_app_version", "add_read", "flush",
})
