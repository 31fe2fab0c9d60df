"""The RPC server (coordinator/rpc.py): one I/O thread for every connection, answers in request
order per connection whether a request ran inline, on a worker, or was answered later from
another thread; large answers arrive whole; a malformed frame gets a clear error and the
connection is closed; shutdown closes everything. Pure sockets, no replica."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from coordinator import errors
from coordinator.rpc import RpcClient, RpcServer, frame, read_frame


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
    limit = server.limits.max_frame
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

    from coordinator import client

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
