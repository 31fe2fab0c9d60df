"""The RPC server (coordinator/wire/rpc.py): one I/O thread for every connection, answers in request
order per connection whether a request ran inline, on a worker, or was answered later from
another thread; large answers arrive whole; a malformed frame gets a clear error and the
connection is closed; shutdown closes everything. Pure sockets, no replica."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
from support.waiting import wait_until  # tests/ is on sys.path

from coordinator import errors
from coordinator.wire.rpc import RpcClient, RpcServer, frame, read_frame


class Service:
    """``echo`` inline, ``slow`` on a worker (waits for a gate), ``later`` answered from another
    thread after the inline hook returned, ``big`` a reply far larger than a socket buffer."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.loop_threads: set[str] = set()

    def dispatch(self, action: str, args: dict) -> dict:
        if action == "slow":
            assert self.gate.wait(10)
            return {"ok": True, "result": ["slow", args["n"]]}
        if action == "big":
            return {"ok": True, "result": "x" * args["size"]}
        if action == "fail":
            return {"ok": False, "error": errors.InvalidInput("no such thing").to_dict()}
        return {"ok": False, "error": errors.InvalidInput(f"unknown action {action!r}").to_dict()}

    def inline(self, action: str, args: dict, reply) -> bool:
        self.loop_threads.add(threading.current_thread().name)
        if action == "echo":
            reply({"ok": True, "result": ["echo", args["n"]]})
            return True
        if action == "later":
            threading.Timer(0.05, lambda: reply({"ok": True, "result": ["later", args["n"]]})).start()
            return True
        return False


@pytest.fixture
def served():
    svc = Service()
    server = RpcServer("127.0.0.1", 0, svc.dispatch, inline=svc.inline)
    thread = threading.Thread(target=server.serve, name="rpc-io", daemon=True)
    thread.start()
    yield svc, server
    svc.gate.set()
    server.shutdown()
    thread.join(10)
    assert not thread.is_alive()


def raw_connection(server: RpcServer) -> tuple[socket.socket, object]:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return sock, sock.makefile("rb")


def test_pipelined_requests_are_answered_in_order(served) -> None:
    svc, server = served
    sock, rfile = raw_connection(server)
    requests = [("echo", 1), ("slow", 2), ("later", 3), ("echo", 4), ("slow", 5), ("echo", 6)]
    sock.sendall(b"".join(frame({"a": a, "b": {"n": n}}) for a, n in requests))
    svc.gate.set()  # the worker requests finish while inline ones wait their turn behind them
    answers = [read_frame(rfile)["result"] for _ in requests]
    assert answers == [[a, n] for a, n in requests]
    assert svc.loop_threads == {"rpc-io"}  # inline hooks ran on the I/O thread only
    sock.close()


def test_a_slow_request_does_not_hold_up_other_connections(served) -> None:
    svc, server = served
    slow = RpcClient(f"127.0.0.1:{server.port}", 10)
    result: list = []
    t = threading.Thread(target=lambda: result.append(slow.call("slow", {"n": 1})))
    t.start()
    fast = RpcClient(f"127.0.0.1:{server.port}", 10)
    assert [fast.call("echo", {"n": i}) for i in range(50)] == [["echo", i] for i in range(50)]
    assert t.is_alive() and not result  # still waiting for the gate
    svc.gate.set()
    t.join(10)
    assert result == [["slow", 1]]
    slow.close()
    fast.close()


def test_large_answer_arrives_whole(served) -> None:
    _, server = served
    client = RpcClient(f"127.0.0.1:{server.port}", 30)
    size = 24 * 1024 * 1024  # far beyond the socket buffers: sent as the peer reads
    assert len(client.call("big", {"size": size})) == size
    assert client.call("echo", {"n": 7}) == ["echo", 7]  # the connection carries on
    client.close()


def test_errors_come_back_as_their_class(served) -> None:
    _, server = served
    client = RpcClient(f"127.0.0.1:{server.port}", 10)
    with pytest.raises(errors.InvalidInput, match="no such thing"):
        client.call("fail", {})
    assert client.call("echo", {"n": 1}) == ["echo", 1]
    client.close()


def test_malformed_frame_gets_an_error_and_the_connection_closes(served) -> None:
    _, server = served
    sock, rfile = raw_connection(server)
    sock.sendall(struct.pack(">I", 5) + b"{nope")  # not JSON
    reply = read_frame(rfile)
    assert reply["ok"] is False and "bad request" in reply["error"]["message"]
    assert rfile.read(1) == b""  # closed by the server
    sock.close()
    # the server itself is unaffected
    assert RpcClient(f"127.0.0.1:{server.port}", 10).call("echo", {"n": 2}) == ["echo", 2]


def test_a_frame_over_the_limit_is_answered_and_skipped(served) -> None:
    """A request beyond the frame limit is answered InvalidInput naming the limit, its bytes
    are skipped as they arrive (never buffered), and the connection carries on."""
    _, server = served
    limit = server.limits.max_frame_bytes
    sock, rfile = raw_connection(server)
    sock.sendall(struct.pack(">I", limit + 10))
    reply = read_frame(rfile)
    assert reply["ok"] is False and reply["error"]["type"] == "InvalidInput"
    assert f"limit of {limit} bytes" in reply["error"]["message"]
    sock.sendall(b"x" * (limit + 10) + frame({"a": "echo", "b": {"n": 4}}))
    assert read_frame(rfile)["result"] == ["echo", 4]
    sock.close()


def test_request_of_the_wrong_shape_is_refused_and_the_connection_stays(served) -> None:
    _, server = served
    sock, rfile = raw_connection(server)
    sock.sendall(frame(["not", "an", "object"]) + frame({"a": "echo", "b": {"n": 3}}))
    first = read_frame(rfile)
    assert first["ok"] is False and "request must be" in first["error"]["message"]
    assert read_frame(rfile)["result"] == ["echo", 3]
    sock.close()


def test_shutdown_closes_connections(served) -> None:
    _, server = served
    sock, rfile = raw_connection(server)
    sock.sendall(frame({"a": "echo", "b": {"n": 1}}))
    assert read_frame(rfile)["result"] == ["echo", 1]
    server.shutdown()
    assert rfile.read(1) == b""
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).sendall(b"x" * 10)


def test_connect_to_a_port_that_never_answers_fails_instead_of_hanging(monkeypatch) -> None:
    """A port that accepts and never answers (a stopped process behind a proxy, the wrong
    service): ``connect`` raises ReplicaUnavailable after CONNECT_TIMEOUT, not after the
    600 s call timeout; and a call with its own timeout keeps the connection's for the next."""
    import time

    from mergetxn.client import client

    silent = socket.create_server(("127.0.0.1", 0))
    try:
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        monkeypatch.setattr(client, "CONNECT_TIMEOUT", 0.5)
        started = time.monotonic()
        with pytest.raises(errors.ReplicaUnavailable, match="did not answer 'info'"):
            client.connect(address)
        assert time.monotonic() - started < 30  # the guarantee: no hang of CALL_TIMEOUT (600 s)
    finally:
        silent.close()


def test_a_call_timeout_applies_to_that_call_only(served) -> None:
    service, server = served
    rpc = RpcClient(f"127.0.0.1:{server.port}", timeout=30.0)
    assert rpc.call("echo", {"n": 1}, timeout=0.5) == ["echo", 1]
    sock, _ = rpc._connection()
    assert sock.gettimeout() == 30.0  # the connection keeps the client's timeout for the next call
    with pytest.raises(errors.ReplicaUnavailable, match="did not answer 'slow'"):
        rpc.call("slow", {"n": 2}, timeout=0.2)  # its gate is closed: it cannot answer in time
    service.gate.set()
    assert rpc.call("echo", {"n": 3}) == ["echo", 3]  # a new connection
    rpc.close()


# -- a server survives its clients (docs/surface.md#a-replica-survives-its-clients) -------


def test_a_connection_is_not_read_while_its_request_is_answered(served) -> None:
    """Backpressure: while a request of a connection is in progress, the server reads no more
    of it, so what the peer sends meanwhile stays in the kernel (whose buffers fill and stop
    the sender) instead of piling up in the replica's memory."""
    svc, server = served
    sock, rfile = raw_connection(server)
    sock.sendall(frame({"a": "slow", "b": {"n": 1}}))
    pad = frame({"a": "echo", "b": {"n": 2, "pad": "x" * (1 << 20)}})
    sock.settimeout(3)
    with pytest.raises(TimeoutError):  # 64 MiB do not fit in the kernel's buffers
        sock.sendall(pad * 64)
    svc.gate.set()
    sock.settimeout(10)
    assert read_frame(rfile)["result"] == ["slow", 1]
    sock.close()


class _OutOfDescriptors:
    """A listener whose accept fails with EMFILE (while ``failing``), counting the calls."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener, self.failing, self.calls = listener, True, []

    def accept(self):  # noqa: ANN201
        import errno
        import time

        self.calls.append(time.monotonic())
        if self.failing:
            raise OSError(errno.EMFILE, "Too many open files")
        return self.listener.accept()

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self.listener, name)


def test_accept_out_of_descriptors_backs_off_instead_of_spinning(caplog) -> None:
    """EMFILE on accept: the listener is not polled for ACCEPT_PAUSE (the pending connection
    waits in the backlog), one log line per LOG_EVERY, and it is accepted once descriptors
    are back."""
    import logging

    from coordinator.wire import rpc

    svc = Service()
    server = RpcServer("127.0.0.1", 0, svc.dispatch, inline=svc.inline)
    flaky = server.listener = _OutOfDescriptors(server.listener)
    thread = threading.Thread(target=server.serve, daemon=True)
    caplog.set_level(logging.WARNING, logger="coordinator.wire.rpc")
    thread.start()
    try:
        pending = socket.create_connection(("127.0.0.1", server.port), timeout=10)  # waits in the backlog
        started = len(flaky.calls)
        wait_until(lambda: len(flaky.calls) >= started + 3, 10, "three accept attempts", interval=0.02)
        spread = flaky.calls[-1] - flaky.calls[-3]
        assert spread >= 1.5 * rpc.ACCEPT_PAUSE, spread  # spinning made thousands a second
        assert len([r for r in caplog.records if "accept failed" in r.getMessage()]) == 1
        flaky.failing = False
        pending.sendall(frame({"a": "echo", "b": {"n": 5}}))
        assert read_frame(pending.makefile("rb"))["result"] == ["echo", 5]
        pending.close()
    finally:
        server.shutdown()
        thread.join(10)


def test_a_loop_that_dies_raises_from_serve() -> None:
    """A failure of the loop itself (not of one connection) ends serve() with the exception,
    listener closed: its caller (replicas/server.py) exits the process."""
    svc = Service()
    server = RpcServer("127.0.0.1", 0, svc.dispatch)

    def broken() -> None:
        raise RuntimeError("injected")

    server.fault = broken
    raised: list[BaseException] = []

    def serve() -> None:
        try:
            server.serve()
        except BaseException as exc:  # what the test asserts
            raised.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():
        server.shutdown()
    assert [str(e) for e in raised] == ["injected"]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2)


@pytest.mark.parametrize(
    "failures, after, waits",
    [
        (4, 0.0, False),  # within the burst
        (5, 0.0, True),  # the burst spent
        (5, 0.99, True),
        (5, 1.01, False),  # one token back after LOGIN_EVERY
        (8, 3.5, True),
        (8, 4.01, False),
    ],
)
def test_login_throttle_is_a_token_bucket_per_address(failures: int, after: float, waits: bool) -> None:
    from coordinator.wire.rpc import Buckets

    throttle = Buckets(burst=5, every=1.0)
    for _ in range(failures):
        throttle.failed("10.0.0.1", 100.0)
    assert (throttle.wait("10.0.0.1", 100.0 + after) > 0) is waits
    assert throttle.wait("10.0.0.2", 100.0) == 0  # another address
    throttle.prune(1000.0)
    assert throttle.wait("10.0.0.1", 1000.0) == 0


@pytest.mark.parametrize(
    "host, key",
    [
        ("10.1.2.3", "10.1.2.3"),
        ("::ffff:10.1.2.3", "10.1.2.3"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("fe80::1%eth0", "fe80::/64"),
    ],
)
def test_peers_are_counted_by_address_and_ipv6_by_slash_64(host: str, key: str) -> None:
    from coordinator.wire.rpc import peer_key

    assert peer_key(host) == key


def test_partial_frames_together_stay_within_the_buffer_budget() -> None:
    """Many connections each holding most of a frame: beyond Limits.max_buffered (four
    frames) a connection with more than 64 KiB of a frame is not read until others finish or
    go idle, so memory stays bounded; a small request on another connection is still served."""
    from coordinator.wire.rpc import _CHUNK, _FREE, Limits

    svc = Service()
    limits = Limits(max_frame_bytes=1 << 20)
    server = RpcServer("127.0.0.1", 0, svc.dispatch, inline=svc.inline, limits=limits)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    hogs = []
    try:
        for _ in range(16):  # 16 frames of 1 MiB declared, all but 10 bytes sent
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            sock.sendall(struct.pack(">I", 1 << 20) + b"x" * ((1 << 20) - 10))
            hogs.append(sock)
        wait_until(lambda: server.buffered >= limits.max_buffered, 10, "the budget to be reached", interval=0.01)
        client = RpcClient(f"127.0.0.1:{server.port}", 10)
        assert client.call("echo", {"n": 1}) == ["echo", 1]  # every connection's bytes had their turn
        assert server.buffered <= limits.max_buffered + len(hogs) * (_FREE + _CHUNK), server.buffered
        client.close()
    finally:
        for sock in hogs:
            sock.close()
        server.shutdown()
        thread.join(10)


def test_failed_logins_count_per_user_from_every_address() -> None:
    """A brute force from many addresses gets no more guesses at one user than one address
    would: USER_BURST failures from as many addresses, then every login naming that user is
    refused without being looked at (naming the user), another user's is not."""
    from coordinator.wire.rpc import USER_BURST, USER_EVERY, LoginThrottle

    throttle = LoginThrottle()
    for i in range(USER_BURST):
        assert throttle.refusal(f"10.0.0.{i}", "alice", 100.0) == ""
        throttle.failed(f"10.0.0.{i}", "alice", 100.0)
    why = throttle.refusal("10.9.9.9", "alice", 100.0)
    assert "too many failed logins as user 'alice'" in why and "try again in" in why
    assert throttle.refusal("10.9.9.9", "bob", 100.0) == ""
    assert throttle.refusal("10.9.9.9", "alice", 100.0 + USER_EVERY + 0.01) == ""  # one more, a while later


def test_logins_that_need_a_hash_are_bounded_in_all() -> None:
    """Failed logins of many users from many addresses: once ALL_BURST needed a hash, a login
    that needs one is refused until the bucket refills (busy), while the per-address and
    per-user checks still let a remembered login through; a failure without a hash (a guess
    refused for being busy) counts against its address and user only."""
    from coordinator.wire.rpc import ALL_BURST, ALL_EVERY, LoginThrottle

    throttle = LoginThrottle()
    for i in range(ALL_BURST):
        assert throttle.busy(50.0) == ""
        throttle.failed(f"10.0.{i}.1", f"user{i}", 50.0)
    assert "too many failed logins in all" in throttle.busy(50.0)
    assert throttle.refusal("10.1.1.1", "carol", 50.0) == ""  # carol's remembered login may pass
    for _ in range(5):
        throttle.failed("10.1.1.1", "carol", 50.0, hashed=False)
    assert "from 10.1.1.1" in throttle.refusal("10.1.1.1", "carol", 50.0)
    assert throttle.busy(50.0 + ALL_EVERY + 0.001) == ""


def test_pending_connections_give_way_oldest_first_never_one_without_its_chance() -> None:
    """Whom a newcomer closes: the oldest pending connection of its own address, or of the
    address holding most; never one accepted in the current loop round (it has not been read
    yet); deadlines pass by themselves."""
    from coordinator.wire.rpc import Pending

    pending = Pending()
    for i in range(3):
        pending.add(f"a{i}", "10.0.0.1", deadline=10.0 + i, round_=1)
    pending.add("b0", "10.0.0.2", deadline=5.0, round_=1)
    pending.add("b1", "10.0.0.2", deadline=20.0, round_=2)
    assert pending.count == 5 and pending.of("10.0.0.1") == 3
    assert pending.victim("10.0.0.2", 2) == "b0"
    assert pending.victim(None, 2) == "a0"  # 10.0.0.1 holds the most
    assert pending.victim("10.0.0.3", 2) is None  # none of its own
    assert pending.discard("b0", "10.0.0.2") and not pending.discard("b0", "10.0.0.2")
    assert pending.victim("10.0.0.2", 2) is None  # b1 came in this round
    assert pending.victim("10.0.0.2", 3) == "b1"
    assert sorted(pending.expired(11.0)) == ["a0", "a1"]


def test_pending_caps_stay_below_the_caps_of_all_connections() -> None:
    from coordinator.wire.rpc import Limits

    assert (Limits().pending_cap, Limits().pending_per_peer_cap) == (256, 64)
    small = Limits(
        max_connections=10, max_connections_per_peer=20, max_pending_connections=256, max_pending_per_peer=64
    )
    assert (small.pending_cap, small.pending_per_peer_cap) == (5, 5)
    assert Limits(max_connections_per_peer=8).pending_per_peer_cap == 4
    assert Limits(max_connections=1, max_connections_per_peer=1).pending_per_peer_cap == 1  # never 0


def test_silent_connections_give_way_to_a_client_from_their_own_address() -> None:
    """Limits.max_connections_per_peer 8: more silent connections from this address than that, then a
    client's call is answered at once (the oldest silent ones closed for it); a silent
    connection is closed after handshake_seconds."""
    from coordinator.wire.rpc import Limits

    svc = Service()
    limits = Limits(max_connections_per_peer=8, handshake_seconds=1.0)
    server = RpcServer("127.0.0.1", 0, svc.dispatch, inline=svc.inline, limits=limits)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    silent = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(20)]
    try:
        client = RpcClient(f"127.0.0.1:{server.port}", 10)
        assert client.call("echo", {"n": 1}) == ["echo", 1]
        while silent[-1].recv(1 << 16):  # closed at its deadline (or for a newcomer: after a refusal)
            pass
        assert client.call("echo", {"n": 2}) == ["echo", 2]  # a connection that sent a request stays
        client.close()
    finally:
        for sock in silent:
            sock.close()
        server.shutdown()
        thread.join(10)


class SlowLogins:
    """``authenticate``: ``ok`` at once, ``slow`` once the gate opens (a password hash)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.threads: set[str] = set()

    def __call__(self, args: dict) -> str | None:
        self.threads.add(threading.current_thread().name)
        if args.get("user") == "slow":
            assert self.gate.wait(20)
            return None
        return "ok" if args.get("user") == "ok" else None


def login(port: int, user: str) -> tuple[socket.socket, object]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(frame({"a": "auth", "b": {"user": user, "secret": "s"}}))
    return sock, sock.makefile("rb")


def test_logins_are_checked_off_the_io_thread_and_their_queue_is_bounded() -> None:
    """A login whose check takes long (scrypt) holds no other connection up: while LOGIN_QUEUE
    of them wait, an authenticated connection's calls are answered at once, and one more login
    is refused as ReplicaUnavailable saying why; the checks ran on the login pool."""
    from coordinator.wire.rpc import LOGIN_QUEUE

    svc, logins = Service(), SlowLogins()
    server = RpcServer("127.0.0.1", 0, svc.dispatch, inline=svc.inline, authenticate=logins)
    thread = threading.Thread(target=server.serve, name="rpc-io", daemon=True)
    thread.start()
    waiting = []
    try:
        sock, rfile = login(server.port, "ok")
        assert read_frame(rfile)["ok"] is True
        for _ in range(LOGIN_QUEUE):
            waiting.append(login(server.port, "slow")[0])
        for n in range(3):
            started = time.monotonic()
            sock.sendall(frame({"a": "echo", "b": {"n": n}}))
            assert read_frame(rfile)["result"] == ["echo", n]
            assert time.monotonic() - started < 1.0
        extra, extra_file = login(server.port, "slow")
        reply = read_frame(extra_file)
        assert (
            reply["error"]["type"] == "ReplicaUnavailable" and "logins are being checked" in reply["error"]["message"]
        )
        extra.close()
        logins.gate.set()
        assert read_frame(waiting[0].makefile("rb"))["error"]["type"] == "AuthenticationFailed"
        assert logins.threads and all(t.startswith("rpc-login") for t in logins.threads), logins.threads
        sock.close()
    finally:
        logins.gate.set()
        for s in waiting:
            s.close()
        server.shutdown()
        thread.join(10)
