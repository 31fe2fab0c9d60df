"""The client-replica wire protocol: length-prefixed JSON frames over a persistent TCP connection.

Each request is ``{"a": action, "b": args}`` and each answer ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": {"type", "message", "details"}}``. Only metadata crosses it (part
descriptors, snapshots, transaction ids); data goes to storage directly. A call costs about a
sixth of the CPU of a gRPC (Arrow Flight) action in Python, which is what bounds the commit rate
of small transactions on a small machine.

A secured server (``tls`` and ``authenticate``; coordinator/wire/security.py) speaks TLS only and
answers nothing but ``{"a": "auth", "b": {"user", "secret"}}`` until a connection has
authenticated; frames of unauthenticated peers are limited to ``AUTH_FRAME`` bytes. A peer that
does not start a TLS handshake gets one plaintext ``AuthenticationFailed`` frame and is closed,
so a client without credentials learns why. A login's check (a password hash) runs on a small
pool of its own, never on the I/O thread. Unsecured servers behave and cost as before.

A connection is *pending* until its first request (on a secured server: its login) has arrived
whole. Pending connections have a deadline (``Limits.handshake_seconds``) and caps of their own,
below the server's and the address's (:class:`Pending`); a newcomer that finds a cap full closes
the oldest pending connection in its way instead of being refused, so peers that never send a
byte cannot hold the slots that clients sending requests need.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import resource
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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from coordinator.core import errors, jsonwire, retries

if TYPE_CHECKING:
    from coordinator.wire.security import Credentials

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">I")
MAX_FRAME = 256 * 1024 * 1024  # the largest answer a client reads (a replica's requests: Limits.max_frame_bytes)
AUTH_FRAME = 64 * 1024  # the largest frame a peer that has not authenticated may send
_TLS_HANDSHAKE = 0x16  # the first byte of a TLS ClientHello record
_CHUNK = 1 << 18  # one read of a connection: what it may buffer beyond the frame it is sending
_ACCEPTS_PER_WAKE = 64  # a flood of connects does not keep the I/O thread from the others
_TICK = 0.25  # seconds between looks at deadlines (idle, handshake, accept back-off)
ACCEPT_PAUSE = 0.5  # after accept ran out of descriptors: the listener is not polled this long
LOG_EVERY = 10.0  # a kind of refusal is logged at most once in this many seconds (with a count)
FD_RESERVE = 32  # descriptors kept for everything but connections (ZooKeeper, WAL, part files)
LOGIN_BURST = 5  # failed logins a peer address may make at once ...
LOGIN_EVERY = 1.0  # ... and then one every this many seconds
USER_BURST, USER_EVERY = 10, 1.0  # the same for one user name, from every address together
ALL_BURST, ALL_EVERY = 50, 0.1  # and for every login that needs a password hash, together
LOGIN_WORKERS = 2  # threads checking logins (scrypt releases the GIL: at most this many cores)
LOGIN_QUEUE = 64  # logins being checked or waiting for it; more are refused as the replica busy
_MAX_LOGIN_NAME = 256  # characters of a user name a failed login is counted under
_HOLD = "hold"  # _Admission._make_room: admit the connection next round
_MAX_ACTION = 64  # the longest action name a request may carry
_FREE = 64 * 1024  # a partial frame this small is read on even when the buffer budget is spent


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
# requests, over anything the peer sent under that name (None on an unsecured server). It may take
# long (a password hash): it runs on the login pool. ``remembered(args)``, when given, is the cheap
# part, run on the I/O thread first: the principal of a login that verified before, or None.
Authenticate = Callable[[dict], Any]
PRINCIPAL = "_principal"


def error_reply(exc: BaseException) -> dict:
    return {
        "ok": False,
        "error": exc.to_dict() if isinstance(exc, errors.MergetxnError) else errors.MergetxnError(repr(exc)).to_dict(),
    }


@dataclass(frozen=True)
class Limits:
    """What the peers of a server may hold of it (a replica's are its settings of the same names,
    replicas/settings.py): ``max_frame_bytes`` in one request of an authenticated peer,
    ``max_connections`` open at once (fewer if the descriptor limit leaves less room),
    ``max_connections_per_peer`` of those from one address (an IPv6 /64), and ``idle_seconds``
    before a connection without a request in progress is closed (clients reconnect by
    themselves). A connection whose first request (or login) has not arrived within
    ``handshake_seconds`` is closed; at most ``max_pending_connections`` such connections are
    open at once (at most half of ``max_connections``) and ``max_pending_per_peer`` from one
    address (at most half of ``max_connections_per_peer``): see :class:`Pending`."""

    max_frame_bytes: int = 64 * 1024 * 1024
    max_connections: int = 1024
    max_connections_per_peer: int = 256
    idle_seconds: float = 300.0
    handshake_seconds: float = 10.0
    max_pending_connections: int = 256
    max_pending_per_peer: int = 64

    @property
    def pending_cap(self) -> int:
        """Pending connections open at once: ``max_pending_connections``, below the cap of all connections."""
        return max(1, min(self.max_pending_connections, self.max_connections // 2))

    @property
    def pending_per_peer_cap(self) -> int:
        """Pending connections from one address: below the address's cap and the pending one."""
        return max(1, min(self.max_pending_per_peer, self.max_connections_per_peer // 2, self.pending_cap))

    @property
    def max_buffered(self) -> int:
        """The bytes of partial frames all connections may hold together: four of the largest.
        Beyond it a connection with more than 64 KiB of a frame is not read (small requests
        go on) until others complete theirs or are closed for idleness."""
        return 4 * self.max_frame_bytes


def peer_key(host: str) -> str:
    """The address a peer's connections and failed logins are counted under: the host, or
    its /64 for IPv6 (one machine holds a whole /64)."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class Buckets:
    """Failed attempts per key as token buckets: ``burst`` at once, then one every ``every``
    seconds. Pure: time comes in. At most ``max_keys`` keys are remembered (those whose bucket
    is full again are forgotten first, then the oldest)."""

    def __init__(self, burst: int = LOGIN_BURST, every: float = LOGIN_EVERY, max_keys: int = 10_000) -> None:
        self.burst, self.every, self.max_keys = burst, every, max_keys
        self._spent: dict[str, tuple[float, float]] = {}  # key -> (tokens spent, when)

    def _owed(self, key: str, now: float) -> float:
        spent, at = self._spent.get(key, (0.0, now))
        return max(0.0, spent - (now - at) / self.every)

    def wait(self, key: str, now: float) -> float:
        """Seconds until ``key`` may try again (0: now)."""
        over = self._owed(key, now) + 1 - self.burst
        return over * self.every if over > 0 else 0.0

    def failed(self, key: str, now: float) -> None:
        self._spent[key] = (self._owed(key, now) + 1, now)
        if len(self._spent) > self.max_keys:
            self.prune(now)
            while len(self._spent) > self.max_keys:  # still full: forget the oldest
                del self._spent[next(iter(self._spent))]

    def prune(self, now: float) -> None:
        """Forget the keys whose bucket is full again."""
        for key in [k for k in self._spent if self._owed(k, now) == 0]:
            del self._spent[key]


class LoginThrottle:
    """Failed logins, counted three ways: per peer address (:data:`LOGIN_BURST`, then one every
    :data:`LOGIN_EVERY` seconds), per user name from every address together (``USER_*``), and in
    all (``ALL_*``, every login that needs a password hash). A login refused by the first two is
    refused without its secret being looked at (so the check stays constant-time, and a brute
    force from many addresses gets as few guesses at a user as from one); the third guards the
    replica's CPU, so only a login that needs a hash waits for it (one that verified before is
    checked at once). A login counts once its check failed: logins checked at the same moment
    may overdraw a bucket (by at most the :data:`LOGIN_QUEUE` being checked), and then wait the
    longer. Pure: time comes in."""

    def __init__(
        self,
        per_peer: Buckets | None = None,
        per_user: Buckets | None = None,
        in_all: Buckets | None = None,
    ) -> None:
        self.per_peer = per_peer or Buckets(LOGIN_BURST, LOGIN_EVERY)
        self.per_user = per_user or Buckets(USER_BURST, USER_EVERY)
        self.in_all = in_all or Buckets(ALL_BURST, ALL_EVERY, max_keys=1)

    def refusal(self, peer: str, user: str, now: float) -> str:
        """Why a login from ``peer`` naming ``user`` is refused without being looked at ('': it
        is not)."""
        wait = self.per_peer.wait(peer, now)
        if wait > 0:
            return f"too many failed logins from {peer}, try again in {wait:.1f}s"
        wait = self.per_user.wait(user, now)
        if wait > 0:
            return f"too many failed logins as user {user[:80]!r} (from any address), try again in {wait:.1f}s"
        return ""

    def busy(self, now: float) -> str:
        """Why a login that needs a password hash is refused now ('': it is not)."""
        wait = self.in_all.wait("", now)
        if wait > 0:
            return f"too many failed logins in all, try again in {wait:.1f}s"
        return ""

    def failed(self, peer: str, user: str, now: float, hashed: bool = True) -> None:
        """A login refused after its secret was looked at (``hashed``: by a password hash)."""
        self.per_peer.failed(peer, now)
        self.per_user.failed(user, now)
        if hashed:
            self.in_all.failed("", now)

    def prune(self, now: float) -> None:
        for buckets in (self.per_peer, self.per_user):
            buckets.prune(now)


class Pending:
    """The connections that have not completed their first request (their login, on a secured
    server): per peer address, oldest first, each with its deadline and the loop round it was
    accepted in. The server closes them at their deadline, or early to make room for a newcomer
    (:meth:`victim`). Pure: time and rounds come in."""

    def __init__(self) -> None:
        self._of: dict[str, dict[Any, tuple[float, int]]] = {}  # peer -> {conn: (deadline, round)}
        self.count = 0

    def add(self, conn: Any, peer: str, deadline: float, round_: int) -> None:
        self._of.setdefault(peer, {})[conn] = (deadline, round_)
        self.count += 1

    def discard(self, conn: Any, peer: str) -> bool:
        """Forget ``conn`` (it completed its first request, or closed); whether it was pending."""
        conns = self._of.get(peer)
        if conns is None or conns.pop(conn, None) is None:
            return False
        if not conns:
            del self._of[peer]
        self.count -= 1
        return True

    def of(self, peer: str) -> int:
        return len(self._of.get(peer, ()))

    def victim(self, peer: str | None, round_: int) -> Any:
        """The connection to close for a newcomer: the oldest pending one from ``peer`` (None: from
        the address holding the most), if it was accepted before loop round ``round_`` (so it had
        its chance to send); else None (the newcomer is refused)."""
        if peer is not None:
            groups = [self._of[peer]] if peer in self._of else []
        else:
            groups = sorted(self._of.values(), key=len, reverse=True)
        for conns in groups:
            conn, (_, born) = next(iter(conns.items()))
            if born < round_:
                return conn
        return None

    def expired(self, now: float) -> list[Any]:
        """The connections whose deadline has passed."""
        return [c for conns in self._of.values() for c, (deadline, _) in conns.items() if deadline <= now]


class _Rare:
    """A log line per kind of event at most once per ``LOG_EVERY`` seconds, saying how many
    happened since: a flood of refusals must not become a flood of log lines."""

    def __init__(self) -> None:
        self._next: dict[str, float] = {}
        self._count: dict[str, int] = {}

    def __call__(self, kind: str, level: int, message: str, *args: Any, exc_info: bool = False) -> None:
        now = time.monotonic()
        self._count[kind] = self._count.get(kind, 0) + 1
        if now < self._next.get(kind, 0.0):
            return
        n = self._count.pop(kind)
        self._next[kind] = now + LOG_EVERY
        log.log(
            level, message + (f" ({n} times in the last {LOG_EVERY:g}s)" if n > 1 else ""), *args, exc_info=exc_info
        )


class _Conn:
    __slots__ = (
        "sock",
        "peer",
        "inbuf",
        "outbuf",
        "busy",
        "closed",
        "close_after",
        "in_next",
        "authed",
        "max_frame",
        "handshake",
        "tls",
        "events",
        "want_read",
        "last",
        "discard",
        "principal",
    )

    def __init__(self, sock: socket.socket, peer: str, authed: bool, tls: bool, max_frame: int) -> None:
        self.sock = sock
        self.peer = peer  # peer_key of its address
        self.authed = authed  # may send any request (always, on an unsecured server)
        self.max_frame = max_frame if authed else AUTH_FRAME
        self.tls = tls
        self.handshake = tls  # waiting for the first bytes, then for the TLS handshake
        self.inbuf = bytearray()  # at most one frame and one read beyond it (backpressure)
        self.outbuf = bytearray()
        self.busy = False  # a request of this connection is being answered: nothing more is read
        self.closed = False
        self.close_after = False  # close once the outgoing bytes are sent (a malformed request)
        self.in_next = False  # _next is running for it (an answer given inline continues its loop)
        self.principal: Any = None  # who it authenticated as (what authenticate returned)
        self.events = 0  # what the selector watches it for (0: not registered)
        self.want_read = False  # TLS wants to read before it can send the answer
        self.last = time.monotonic()  # bytes last came in or an answer last went out
        self.discard = 0  # bytes of a refused, too large request still to skip


class _Admission:
    """The connections of an :class:`RpcServer` and the limits on them (:class:`Limits`):
    accepting (paused while the process is out of descriptors), the caps on connections per
    address, on all and on those that have not sent their first request yet (the oldest such
    one closed to make room for a newcomer), and that first request's deadline. Used by the
    server's I/O thread only."""

    def __init__(self, server: RpcServer) -> None:
        self.server = server
        self.limits = server.limits
        self.conns: set[_Conn] = set()
        self.pending = Pending()  # connections whose first request (login) has not arrived whole
        self.held: list[tuple[socket.socket, str]] = []  # accepted, admitted next round (_admit)
        self.per_peer: dict[str, int] = {}
        self.cap = self.limits.max_connections
        self.paused_until = 0.0  # accept paused (out of descriptors) until then

    def accept(self) -> None:
        """Admit the connections held back last round, then (unless one still is) new ones. The
        cap is taken from the descriptor limit first (not only at the next tick): a burst of
        connections arriving between two ticks must not take the descriptors the process keeps
        for its WAL, ZooKeeper and the part files a commit reads (FD_RESERVE)."""
        self.measure_room()
        held, self.held = self.held, []
        for sock, peer in held:
            self._admit(sock, peer)
        for _ in range(0 if self.held else _ACCEPTS_PER_WAKE):
            try:
                sock, address = self.server.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._pause_accepting(exc)
                    return
                if exc.errno == errno.ECONNABORTED:  # the peer gave up while queued
                    continue
                self.server.rare("accept", logging.WARNING, "accept failed: %r", exc)
                return
            self._admit(sock, peer_key(str(address[0])))
            if self.held:  # the rest wait in the backlog
                return

    def _admit(self, sock: socket.socket, peer: str) -> None:
        """A new connection in, once there is room; held back to the next round when only
        pending connections accepted in this one are in its way; else turned away."""
        why = self._make_room(peer)
        if why == _HOLD:
            self.held.append((sock, peer))
            return
        if why:
            self._turn_away(sock, peer, why)
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(
            sock, peer, self.server.authenticate is None, self.server.tls is not None, self.limits.max_frame_bytes
        )
        self.conns.add(conn)
        self.per_peer[peer] = self.per_peer.get(peer, 0) + 1
        self.pending.add(conn, peer, time.monotonic() + self.server.handshake_seconds, self.server.rounds)
        self.server.watch(conn, selectors.EVENT_READ)

    def _make_room(self, peer: str) -> str:
        """'' once a new connection from ``peer`` fits, after closing the oldest pending
        connections in its way (:meth:`Pending.victim`); _HOLD when the only ones in its way
        were accepted in this round (they are read first); else why it does not fit."""
        while True:
            why, own = self._over_limit(peer)
            if not why:
                return ""
            victim = self.pending.victim(peer if own else None, self.server.rounds)
            if victim is None:
                return _HOLD if (self.pending.of(peer) if own else self.pending.count) else why
            self.server.rare(
                "evicted", logging.INFO, "closed a pending connection from %s for a new one: %s", victim.peer, why
            )
            self.server.close_connection(victim)

    def _over_limit(self, peer: str) -> tuple[str, bool]:
        """Which cap a new connection from ``peer`` is over ('' when none), and whether it is
        one of the address's own."""
        limits = self.limits
        if self.per_peer.get(peer, 0) >= limits.max_connections_per_peer:
            return f"{limits.max_connections_per_peer} connections from {peer} are open, the limit per address", True
        if self.pending.of(peer) >= limits.pending_per_peer_cap:
            return f"{limits.pending_per_peer_cap} connections from {peer} have not sent a request yet", True
        if len(self.conns) >= self.cap:
            return f"it has {len(self.conns)} connections, its limit", False
        if self.pending.count >= limits.pending_cap:
            return f"{limits.pending_cap} connections have not sent a request yet", False
        return "", False

    def _turn_away(self, sock: socket.socket, peer: str, why: str) -> None:
        """Close a connection over a limit at once; a plaintext peer is told why first."""
        self.server.rare("cap", logging.WARNING, "refused a connection from %s: %s", peer, why)
        try:
            if self.server.tls is None:
                sock.setblocking(False)
                sock.send(
                    frame(
                        {
                            "ok": False,
                            "error": errors.ReplicaUnavailable(
                                f"replica {_local(sock)} refused the connection: {why}"
                            ).to_dict(),
                        }
                    )
                )
        except OSError:
            pass
        sock.close()

    def _pause_accepting(self, exc: OSError) -> None:
        """Out of descriptors: stop polling the listener a while (connections wait in the
        backlog) instead of failing accept in a hot loop."""
        self.server.rare(
            "emfile",
            logging.WARNING,
            "accept failed (%s): not accepting for %gs; %d connections open",
            exc.strerror or exc,
            ACCEPT_PAUSE,
            len(self.conns),
        )
        self.paused_until = time.monotonic() + ACCEPT_PAUSE
        self.server.selector.unregister(self.server.listener)

    def expire_pending(self, now: float) -> None:
        """Close the connections whose first request (login) did not arrive in time."""
        for conn in self.pending.expired(now):
            self.server.rare(
                "handshake",
                logging.INFO,
                "closed a connection from %s: no %s within %gs",
                conn.peer,
                "request" if self.server.authenticate is None else "login",
                self.server.handshake_seconds,
            )
            self.server.close_connection(conn)

    def resume_accepting(self, now: float) -> None:
        """Poll the listener again once the pause after running out of descriptors is over."""
        if self.paused_until and now >= self.paused_until:
            self.paused_until = 0.0
            self.server.selector.register(self.server.listener, selectors.EVENT_READ, "accept")

    def measure_room(self) -> None:
        """The cap on connections from the descriptors the process may still open."""
        self.cap = min(self.limits.max_connections, _descriptor_room(len(self.conns)))

    def forget(self, conn: _Conn) -> None:
        """A connection closed: it no longer counts against any limit."""
        self.conns.discard(conn)
        left = self.per_peer.pop(conn.peer, 1) - 1
        if left > 0:
            self.per_peer[conn.peer] = left
        self.pending.discard(conn, conn.peer)


class _Login:
    """The door of a secured server (TLS, logins) for its :class:`RpcServer`: each new
    connection's TLS handshake, then its first request, which must be a login. Failed logins are
    throttled (:class:`LoginThrottle`) and the secrets checked on a pool of their own; all else
    runs on the server's I/O thread."""

    def __init__(
        self,
        server: RpcServer,
        tls: ssl.SSLContext | None,
        authenticate: Authenticate | None,
        remembered: Authenticate | None,
    ) -> None:
        self.server = server
        self.tls = tls
        self.authenticate = authenticate
        self.remembered = remembered
        self.throttle = LoginThrottle()
        self.checking = 0  # logins on the login pool (being checked or waiting for it)
        self.pool = ThreadPoolExecutor(max_workers=LOGIN_WORKERS, thread_name_prefix="rpc-login")

    def handshake(self, conn: _Conn) -> None:
        """A new connection of a TLS server: refuse a peer that does not start with a TLS
        handshake, else drive the handshake without blocking."""
        sock = conn.sock
        if not isinstance(sock, ssl.SSLSocket):
            try:
                first = sock.recv(1, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.server.close_connection(conn)
                return
            if not first:
                self.server.close_connection(conn)
                return
            if first[0] != _TLS_HANDSHAKE:
                self._refuse_plaintext(conn)
                return
            self.server.selector.unregister(sock)
            conn.events = 0
            try:
                assert self.tls is not None  # conn.tls: this server has a context
                sock = conn.sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except (OSError, ValueError) as exc:
                log.info("TLS: cannot wrap a connection: %r", exc)
                self.server.close_connection(conn)
                return
            self.server.watch(conn, selectors.EVENT_READ)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self.server.watch(conn, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self.server.watch(conn, selectors.EVENT_READ | selectors.EVENT_WRITE)
            return
        except OSError as exc:  # ssl.SSLError included: a bad certificate, a scanner, a reset
            self.server.rare("tls", logging.INFO, "TLS handshake from %s failed: %s", conn.peer, exc)
            self.server.close_connection(conn)
            return
        conn.handshake = False
        self.server.watch(conn, selectors.EVENT_READ)
        if sock.pending():
            self.server.read_from(conn)

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
        self.server.rare("plaintext", logging.INFO, "refused a connection from %s: not TLS", conn.peer)
        self.refuse(conn, f"replica {_local(conn.sock)} requires TLS and credentials")

    def refuse(self, conn: _Conn, why: str, hint: bool = True) -> None:
        """Answer AuthenticationFailed saying ``why`` (with how to give credentials, unless
        ``hint`` is False: the credentials are not what is wrong) and close the connection."""
        conn.busy = True
        conn.close_after = True
        how = (
            ": connect with the cluster's credentials (credentials=Credentials.from_file(path) or the "
            "path of the credentials file, or set MERGETXN_CREDENTIALS to it)"
        )
        self.server.send(
            conn, {"ok": False, "error": errors.AuthenticationFailed(why + (how if hint else "")).to_dict()}
        )

    def login(self, conn: _Conn, request: Any) -> None:
        """The first request of a connection to a secured server: ``auth``, or it is closed.
        Failed logins are throttled (:class:`LoginThrottle`); a login that verified before is
        taken at once (``remembered``), any other is checked on the login pool (:meth:`_check`)."""
        args = request.get("b") if isinstance(request, dict) else None
        if not isinstance(request, dict) or request.get("a") != "auth" or not isinstance(args, dict):
            self.refuse(conn, f"replica {_local(conn.sock)} requires authentication before any request")
            return
        now = time.monotonic()
        user = _login_name(args)
        why = self.throttle.refusal(conn.peer, user, now)
        if why:
            self.server.rare("throttled", logging.WARNING, "refused a login from %s: %s", conn.peer, why)
            self.refuse(conn, f"replica {_local(conn.sock)} refused the login: {why}")
            return
        try:
            principal = self.remembered(args) if self.remembered is not None else None
        except errors.AuthenticationFailed as exc:  # no fault of the client's (the users are missing)
            self.refuse(conn, f"replica {_local(conn.sock)} refused the login: {exc.message}", hint=False)
            return
        if principal:
            self._logged_in(conn, principal, user)
            return
        why = self.throttle.busy(now) or self._overloaded()
        if why:
            self.throttle.failed(conn.peer, user, now, hashed=False)  # its secret was looked at: a guess spent
            self.server.rare("busy", logging.WARNING, "refused a login from %s: %s", conn.peer, why)
            self._busy(conn, f"replica {_local(conn.sock)} refused the login: {why}")
            return
        self.checking += 1
        self.pool.submit(self._check, conn, args, user)

    def _overloaded(self) -> str:
        if self.checking < LOGIN_QUEUE:
            return ""
        return f"{self.checking} logins are being checked, its limit; try again in a moment"

    def _check(self, conn: _Conn, args: dict, user: str) -> None:
        """On the login pool: the password hash, then the answer on the I/O thread."""
        gone = ""
        assert self.authenticate is not None  # only a server with logins checks one
        try:
            principal = self.authenticate(args)
        except errors.AuthenticationFailed as exc:  # no fault of the client's (the users are missing)
            principal, gone = None, exc.message
        except Exception:  # a bug in the check: the login fails, the server goes on
            log.exception("checking a login from %s failed", conn.peer)
            principal = None
        self.server.call_soon(lambda: self._checked(conn, principal, user, gone))

    def _checked(self, conn: _Conn, principal: Any, user: str, gone: str = "") -> None:
        self.checking -= 1
        if principal:
            self._logged_in(conn, principal, user)
            return
        if gone:
            self.refuse(conn, f"replica {_local(conn.sock)} refused the login: {gone}", hint=False)
            return
        self.throttle.failed(conn.peer, user, time.monotonic())
        self.server.rare("login", logging.WARNING, "authentication failed from %s (user %r)", conn.peer, user[:100])
        self.refuse(conn, f"authentication failed at replica {_local(conn.sock)}: wrong user or secret")

    def _logged_in(self, conn: _Conn, principal: Any, user: str) -> None:
        conn.authed = True
        conn.principal = principal
        conn.max_frame = self.server.limits.max_frame_bytes
        self.server.send(conn, {"ok": True, "result": {"user": user}})

    def _busy(self, conn: _Conn, why: str) -> None:
        """Refuse a login for the replica's sake, not the peer's credentials: ReplicaUnavailable."""
        conn.busy = True
        conn.close_after = True
        self.server.send(conn, {"ok": False, "error": errors.ReplicaUnavailable(why).to_dict()})


class RpcServer:
    """One I/O thread serves every connection (epoll); requests run inline when ``inline`` takes
    them, otherwise on a pool of worker threads.

    Commits are what this server is for, and on a small machine they are bounded by the replica's
    CPU under one GIL: a thread per connection spent a large share of it handing the GIL between
    connection threads. Here begin, stage and commit never leave the I/O thread (a commit is handed
    to the group committer, whose callback queues the answer back to this thread); only actions
    that may wait (reads at a snapshot, cleanup, compaction) go to workers. One request per
    connection is answered at a time, in order; while it is, the connection is not read at all
    (bytes that arrive meanwhile wait in the kernel), so a connection buffers at most one frame.

    Whatever a peer sends costs it its own connection at most
    (docs/surface.md#a-replica-survives-its-clients): a frame that does not decode is answered
    and the connection closed, an exception while handling one connection closes that connection, and the limits (:class:`Limits`) bound
    what peers hold. Should the loop itself die, :meth:`serve` raises: the replica process exits
    rather than stay registered without a listener (replicas/server.py).
    """

    def __init__(
        self,
        host: str,
        port: int,
        dispatch: Dispatch,
        inline: Inline | None = None,
        workers: int = 128,
        tls: ssl.SSLContext | None = None,
        authenticate: Authenticate | None = None,
        limits: Limits | None = None,
        remembered: Authenticate | None = None,
    ) -> None:
        self.dispatch = dispatch
        self.inline = inline
        self.tls = tls
        self.authenticate = authenticate
        self.remembered = remembered
        self.limits = limits or Limits()
        self.handshake_seconds = self.limits.handshake_seconds
        self.fault: Callable[[], None] | None = None  # tests: called on each tick of the loop, outside any guard
        # rare, rounds, listener, selector, watch, send, read_from and close_connection are public:
        # the admission (_Admission) and login (_Login) halves of the server work through them.
        self.rare = _Rare()
        self.rounds = 0  # the loop's rounds: a pending connection accepted in this one had no chance to send
        self._buffered = 0  # bytes in every connection's inbuf
        # What one read of a connection lands in (the I/O thread's alone): a recv of _CHUNK would
        # allocate that much per read, for a request of a kilobyte or two.
        self._recv_buf = memoryview(bytearray(_CHUNK))
        self._starved: set[_Conn] = set()  # not read until the buffer budget has room again
        self._next_tick = 0.0
        self.listener = socket.create_server((host, port), backlog=256)
        self.listener.setblocking(False)
        self.server_address = self.listener.getsockname()
        self.selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._calls: deque[Callable[[], None]] = deque()
        self._calls_lock = threading.Lock()
        self._send_lock = threading.Lock()  # a socket is closed, or sent an answer by a thread other than the I/O one
        self._woken = False
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rpc-worker")
        self._admission = _Admission(self)  # connections and their limits
        self._login = _Login(self, tls, authenticate, remembered)  # TLS and logins (secured servers)
        self._stop = threading.Event()
        self._done = threading.Event()
        self._loop_ident: int | None = None

    @property
    def port(self) -> int:
        return self.server_address[1]

    @property
    def connections(self) -> int:
        """Connections open now (accepted and not closed)."""
        return len(self._admission.conns)

    @property
    def buffered(self) -> int:
        """Bytes of requests read and not yet handled, over every connection."""
        return self._buffered

    # -- the I/O thread ----------------------------------------------------------------------
    def serve(self) -> None:
        """Serve until :meth:`shutdown` (run it in a thread of its own). Raises only if the loop
        itself failed (a bug): every connection is closed then, and the caller must not go on
        as if it served (replicas/server.py exits the process)."""
        self._loop_ident = threading.get_ident()
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            self._loop()
        except BaseException:
            log.critical("the RPC loop failed: this server no longer serves", exc_info=True)
            raise
        finally:
            for conn in list(self._admission.conns):
                self.close_connection(conn)
            for sock, _ in self._admission.held:
                sock.close()
            for s in (self.listener, self._wake_r, self._wake_w):
                s.close()
            self.selector.close()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._login.pool.shutdown(wait=False, cancel_futures=True)
            self._done.set()

    serve_forever = serve

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.rounds += 1
            accept = False
            held = self._admission.held
            for key, mask in self.selector.select(0 if held else _TICK):
                if key.data == "accept":
                    accept = True  # after the connections' events: the pending ones read first
                elif key.data == "wake":
                    self._run_calls()
                else:
                    self._serve_conn(key.data, mask)
            if accept or held:
                self._admission.accept()
            now = time.monotonic()
            if now >= self._next_tick:
                self._next_tick = now + _TICK
                self._tick(now)

    def _serve_conn(self, conn: _Conn, mask: int) -> None:
        """One connection's event. Whatever goes wrong here is that connection's end only."""
        if conn.closed:
            return
        try:
            if conn.handshake:
                self._login.handshake(conn)
            elif conn.outbuf:
                self._flush(conn)
            elif mask & selectors.EVENT_READ:
                if conn.busy:  # more bytes while its request is answered: not read until then
                    self.watch(conn, 0)
                else:
                    self.read_from(conn)
        except Exception:
            self.rare(
                "conn-bug",
                logging.ERROR,
                "closed a connection from %s: its request broke the server",
                conn.peer,
                exc_info=True,
            )
            self.close_connection(conn)

    def shutdown(self) -> None:
        self._stop.set()
        self._wake()
        if self._loop_ident is not None:
            self._done.wait(10)
        else:  # never served
            self.listener.close()
            self._pool.shutdown(wait=False)
            self._login.pool.shutdown(wait=False)

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

    def _tick(self, now: float) -> None:
        """Deadlines: the accept back-off, authentication, idleness; the descriptor room."""
        if self.fault is not None:
            self.fault()
        admission = self._admission
        admission.resume_accepting(now)
        if admission.pending.count:
            admission.expire_pending(now)
        idle = self.limits.idle_seconds
        # Idle: no request in progress (or an answer the peer does not read) for idle_seconds.
        for conn in [c for c in admission.conns if (not c.busy or c.outbuf) and now - c.last > idle]:
            if not conn.busy and conn not in self._starved and now - conn.last < 2 * idle and _readable(conn.sock):
                continue  # a request (or the peer's close) arrived since the loop read: read it first (once)
            self.rare("idle", logging.INFO, "closed a connection from %s: idle for %gs", conn.peer, idle)
            self.close_connection(conn)
        admission.measure_room()
        if self._starved and self._buffered <= self.limits.max_buffered:
            starved, self._starved = self._starved, set()
            for conn in starved:
                self.watch(conn)
        self._login.throttle.prune(now)

    def watch(self, conn: _Conn, events: int | None = None) -> None:
        """Have the selector watch ``conn`` for what it waits for: the answer's sending, else
        its next request unless one is in progress (backpressure), else nothing. A connection
        whose request is in progress stays watched for reading until the peer sends more
        (then :meth:`_serve_conn` stops it): a client waiting for its answer costs no
        selector call per request."""
        if conn.closed:
            return
        if events is None:
            if conn.outbuf:
                events = selectors.EVENT_WRITE | (selectors.EVENT_READ if conn.want_read else 0)
            elif conn.busy or conn.close_after:
                if conn.events == selectors.EVENT_READ:
                    return
                events = 0
            else:
                events = selectors.EVENT_READ
                if len(conn.inbuf) > _FREE and self._buffered > self.limits.max_buffered:
                    events = 0  # memory: the others' partial frames hold the budget (see Limits)
                    self._starved.add(conn)
        if events == conn.events:
            return
        if not conn.events:
            self.selector.register(conn.sock, events, conn)
        elif not events:
            self.selector.unregister(conn.sock)
        else:
            self.selector.modify(conn.sock, events, conn)
        conn.events = events

    def close_connection(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._admission.forget(conn)
        self._starved.discard(conn)
        self._buffered -= len(conn.inbuf)
        conn.inbuf = bytearray()
        if conn.events:
            try:
                self.selector.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
        with self._send_lock:  # never while another thread sends an answer on it
            conn.sock.close()

    def read_from(self, conn: _Conn) -> None:
        try:
            data = self._recv_buf[: conn.sock.recv_into(self._recv_buf)].tobytes()
            if conn.tls:
                while cast(ssl.SSLSocket, conn.sock).pending():  # decrypted bytes inside SSL: epoll does not see them
                    data += self._recv_buf[: conn.sock.recv_into(self._recv_buf)].tobytes()
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except OSError:
            self.close_connection(conn)
            return
        if not data:
            self.close_connection(conn)
            return
        conn.last = time.monotonic()
        if conn.discard:  # the rest of a refused request
            skip = min(conn.discard, len(data))
            conn.discard -= skip
            data = data[skip:]
            if not data:
                return
        conn.inbuf += data
        self._buffered += len(data)
        self._next(conn)

    # -- requests -------------------------------------------------------------------------------
    def _next(self, conn: _Conn) -> None:
        """Answer the requests waiting in the connection's buffer, one at a time."""
        if conn.in_next:
            return
        conn.in_next = True
        try:
            self._next_requests(conn)
        finally:
            conn.in_next = False
        self.watch(conn)

    def _next_requests(self, conn: _Conn) -> None:
        while not conn.busy and not conn.closed and not conn.close_after and len(conn.inbuf) >= _HEADER.size:
            (n,) = _HEADER.unpack_from(conn.inbuf)
            if n > conn.max_frame:
                self._too_large(conn, n)
                continue
            if len(conn.inbuf) < _HEADER.size + n:
                return
            body = bytes(conn.inbuf[_HEADER.size : _HEADER.size + n])
            del conn.inbuf[: _HEADER.size + n]
            self._buffered -= _HEADER.size + n
            try:
                request = jsonwire.loads(body)
            except (ValueError, RecursionError, MemoryError) as exc:  # jsonwire raises ValueError only
                self._answer_and_close(conn, f"not JSON: {str(exc)[:200]}")
                return
            conn.busy = True
            self._admission.pending.discard(conn, conn.peer)
            if not conn.authed:
                self._login.login(conn, request)
                continue
            action = request.get("a") if isinstance(request, dict) else None
            args = request.get("b", {}) if isinstance(request, dict) else None
            if not isinstance(action, str) or not isinstance(args, dict) or len(action) > _MAX_ACTION:
                self.send(
                    conn,
                    {
                        "ok": False,
                        "error": errors.InvalidInput(
                            "request must be {a: action (a short string), b: {args}}"
                        ).to_dict(),
                    },
                )
                continue
            self._request(conn, action, args)

    def _too_large(self, conn: _Conn, n: int) -> None:
        """A request over the frame limit: before authentication the connection is closed;
        after, the request is answered InvalidInput naming the limit and its bytes are skipped
        as they come (never buffered), so the connection goes on."""
        self._admission.pending.discard(conn, conn.peer)  # it sent a request, however large
        if not conn.authed:
            self._answer_and_close(conn, f"frame of {n} bytes exceeds the limit of {conn.max_frame}")
            return
        take = min(len(conn.inbuf) - _HEADER.size, n)
        del conn.inbuf[: _HEADER.size + take]
        self._buffered -= _HEADER.size + take
        conn.discard = n - take
        conn.busy = True
        self.send(
            conn,
            {
                "ok": False,
                "error": errors.InvalidInput(
                    f"bad request: a request of {n} bytes exceeds replica {_local(conn.sock)}'s limit of {conn.max_frame} "
                    "bytes (its max_frame_bytes setting)",
                    limit=conn.max_frame,
                ).to_dict(),
            },
        )

    def _answer_and_close(self, conn: _Conn, why: str) -> None:
        if not conn.authed:
            self._login.refuse(conn, f"replica {_local(conn.sock)} refused a request before authentication ({why})")
            return
        conn.busy = True
        conn.close_after = True
        self.send(conn, {"ok": False, "error": errors.InvalidInput(f"bad request: {why}").to_dict()})

    def _request(self, conn: _Conn, action: str, args: dict) -> None:
        args[PRINCIPAL] = conn.principal
        answered = False

        def reply(envelope: dict) -> None:
            nonlocal answered
            if answered:
                return
            answered = True
            if threading.get_ident() == self._loop_ident:
                self.send(conn, envelope)
            else:
                self._send_from_elsewhere(conn, envelope)

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

    def send(self, conn: _Conn, envelope: dict) -> None:
        """On the I/O thread: queue the answer and send what the socket takes now."""
        if conn.closed:
            return
        conn.outbuf += _answer_frame(envelope)
        self._flush(conn)

    def _send_from_elsewhere(self, conn: _Conn, envelope: dict) -> None:
        """An answer given on another thread (the group committer's callback, a worker): sent
        from that thread at once when the connection is plain TCP, and the I/O thread told
        afterwards, to send what the socket did not take and to read the connection's next
        request. Handing the answer itself to the I/O thread cost a wake-up of that thread in
        every commit's answer (0.2-0.6 ms: it waits for the GIL behind the committer and the
        follower; measured with benchmarks/latency_timeline.py).

        Safe because while a request is answered (``busy``) nothing else writes to the socket:
        the I/O thread neither reads it nor has anything to flush (its outbuf is empty until
        this answer), and :meth:`close_connection` closes the socket under ``_send_lock`` (the descriptor
        is never reused under a send). A TLS connection's answer goes through the I/O thread:
        its SSL object is used by that thread only."""
        data = _answer_frame(envelope)
        sent = 0
        if not conn.tls:
            with self._send_lock:
                if not conn.closed:
                    try:
                        sent = conn.sock.send(data)
                    except OSError:  # full, or broken: the I/O thread's flush sends the rest, or closes
                        sent = 0
        rest = data[sent:] if sent else data
        self.call_soon(lambda: self._queue_answer(conn, rest))

    def _queue_answer(self, conn: _Conn, rest: bytes) -> None:
        """On the I/O thread: what of an answer is left to send (maybe nothing), then the
        connection's next request (:meth:`_flush`)."""
        if conn.closed:
            return
        conn.outbuf += rest
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        sent = 0
        try:
            while conn.outbuf:
                n = conn.sock.send(conn.outbuf)
                del conn.outbuf[:n]
                sent += n
        except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError, ssl.SSLWantReadError) as exc:
            if sent:
                conn.last = time.monotonic()
            conn.want_read = isinstance(exc, ssl.SSLWantReadError)
            self.watch(conn)
            return
        except OSError:
            self.close_connection(conn)
            return
        if conn.close_after:
            self.close_connection(conn)
            return
        conn.last = time.monotonic()
        conn.busy = False
        self._next(conn)  # watches it for its next request


def _login_name(args: dict) -> str:
    """The user name a login is counted under (what the peer sent, bounded)."""
    user = args.get("user")
    return user[:_MAX_LOGIN_NAME] if isinstance(user, str) else ""


def _answer_frame(envelope: dict) -> bytes:
    """An answer's frame; an answer that does not encode is still an answer (an error)."""
    try:
        return frame(envelope)
    except Exception as exc:
        return frame(error_reply(errors.MergetxnError(f"the answer could not be encoded: {exc!r}"[:300])))


def _readable(sock: socket.socket) -> bool:
    """Whether bytes (or the peer's close) wait on ``sock`` now: an idle connection whose client
    has just sent a request is not closed under it (a close with unread bytes is a reset, and
    the client cannot tell whether its request was taken)."""
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return False


def _descriptor_room(connections: int) -> int:
    """How many connections the descriptor limit leaves room for: the soft RLIMIT_NOFILE less
    what this process holds besides connections, less FD_RESERVE (accept must never be what
    runs the process out of descriptors for its WAL, ZooKeeper or part files)."""
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        held = len(os.listdir("/proc/self/fd")) - connections
    except (OSError, ValueError):
        return 1 << 30
    if soft == resource.RLIM_INFINITY:
        return 1 << 30
    return max(1, soft - held - FD_RESERVE)


class RpcClient:
    """One connection per calling thread, opened on first use and reopened after a failure.

    With ``credentials`` (coordinator/wire/security.py) each connection is TLS, verified against the
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
            self.drop_connection()
            conn = None
        if conn is None:
            try:
                sock = socket.create_connection(self._endpoint, timeout=min(self._timeout, 10.0))
            except OSError as exc:
                raise errors.ReplicaUnavailable(
                    f"replica {self.address} is unreachable: {exc}", replica=self.address
                ) from None
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
        context, credentials = self._tls, self._credentials
        assert context is not None and credentials is not None  # both or neither (__init__)
        sock.settimeout(min(self._timeout, 10.0))  # the handshake and auth, as for the connect
        try:
            tls = context.wrap_socket(sock, server_hostname=self._endpoint[0])
        except ssl.SSLCertVerificationError as exc:
            sock.close()
            raise errors.AuthenticationFailed(
                f"{where} presented a certificate this client does not accept ({exc.verify_message}): the "
                f"credentials' ca_file must be the CA that signed the replicas' certificate, and the certificate "
                f"must name {self._endpoint[0]!r}"
            ) from None
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError, TimeoutError, ConnectionError) as exc:
            sock.close()
            raise errors.ReplicaUnavailable(f"{where} closed the connection during the TLS handshake: {exc}") from None
        except ssl.SSLError as exc:
            sock.close()
            raise errors.AuthenticationFailed(
                f"{where} did not complete a TLS handshake ({exc.reason or exc}): is it started without "
                "--credentials? A client with credentials talks to replicas only over TLS"
            ) from None
        except OSError as exc:
            sock.close()
            raise errors.ReplicaUnavailable(f"{where} is unreachable: {exc}") from None
        rfile = tls.makefile("rb")
        try:
            tls.sendall(frame({"a": "auth", "b": credentials.auth_request()}))
            reply = read_frame(rfile)
        except (EOFError, OSError, ValueError) as exc:
            tls.close()
            raise errors.ReplicaUnavailable(
                f"{where} did not answer the authentication: {exc or type(exc).__name__}"
            ) from None
        if not reply.get("ok"):
            tls.close()
            raise errors.from_dict(reply.get("error") or {})
        tls.settimeout(self._timeout)
        return tls, rfile

    def drop_connection(self) -> None:
        """Close this thread's connection, if it has one (a thread about to end that called)."""
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
        ``timeout``: for this call's answer instead of the client's (a call that must be quick,
        or one that legitimately takes longer)."""
        try:
            return _RESEND_ONCE(self._attempt, action, frame({"a": action, "b": args}), timeout)
        except _Resend as exc:
            raise errors.ReplicaUnavailable(str(exc), replica=self.address) from None

    def _attempt(self, action: str, payload: bytes, timeout: float | None = None) -> Any:
        sock, rfile = self._connection()
        if timeout is not None:
            sock.settimeout(timeout)
        try:
            return self._exchange(sock, rfile, action, payload)
        finally:
            if timeout is not None and getattr(self._local, "conn", None) is not None:
                sock.settimeout(self._timeout)

    def _exchange(self, sock: socket.socket, rfile: BinaryIO, action: str, payload: bytes) -> Any:
        try:
            sock.sendall(payload)
        except OSError as exc:
            self.drop_connection()
            raise _Resend(f"replica {self.address} is unreachable: {exc}") from None
        try:
            reply = read_frame(rfile)
        except (EOFError, OSError, ValueError) as exc:
            waited = sock.gettimeout() or 0.0
            self.drop_connection()
            message = f"replica {self.address} did not answer {action!r}: {exc or type(exc).__name__}"
            if isinstance(exc, TimeoutError):
                message = (
                    f"replica {self.address} did not answer {action!r} within {waited:g} s: it stopped "
                    "answering (it stands still, is overloaded or is cut off)"
                )
            if isinstance(exc, EOFError) and action in IDEMPOTENT:
                raise _Resend(message) from None
            raise errors.ReplicaUnavailable(message, replica=self.address) from None
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


class _Resend(retries.TryAgain):
    """An attempt of RpcClient.call failed where sending the request again is safe; the message
    is what the caller gets as ReplicaUnavailable if it was the last attempt."""


_RESEND_ONCE = retries.resend_once(on=_Resend)


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
    return _address(sock.getpeername, "a peer")


def _local(sock: socket.socket) -> str:
    return _address(sock.getsockname, "(address unknown)")


def _address(name: Callable[[], Any], unknown: str) -> str:
    """``host:port`` of a socket's end (``name``: its getpeername or getsockname), else ``unknown``."""
    try:
        host, port = name()[:2]
    except (OSError, ValueError):
        return unknown
    return f"{host}:{port}"


# Actions that may be sent again when a connection closed before answering.
IDEMPOTENT = frozenset(
    {
        "info",
        "begin",
        "table",
        "tables",
        "visible",
        "snapshot",
        "wait",
        "transactions",
        "parts",
        "commit_status",
        "describe_table",
        "app_version",
        "set_app_version",
        "add_read",
        "flush",
        "heartbeat",
        "peers",
        "storage",
    }
)
