"""When RpcClient.call sends a request again (coordinator/wire/rpc.py): once, on a new connection,
after a failure before anything was sent; after sending, only an IDEMPOTENT action whose
connection closed before it answered. A scripted server answers or hangs up per request."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from coordinator import errors
from coordinator.wire.rpc import IDEMPOTENT, RpcClient, frame, read_frame


class Scripted:
    """Reads one request per connection; hangs up while ``hang_ups`` lasts, then answers."""

    def __init__(self, hang_ups: int) -> None:
        self.hang_ups = hang_ups
        self.requests: list[str] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn, conn.makefile("rb") as rfile:
                try:
                    request = read_frame(rfile)
                except EOFError:
                    continue
                self.requests.append(request["a"])
                if self.hang_ups > 0:
                    self.hang_ups -= 1
                    continue
                conn.sendall(frame({"ok": True, "result": request["a"]}))


@pytest.fixture
def server() -> Iterator[Scripted]:
    s = Scripted(hang_ups=0)
    yield s
    s.sock.close()


def test_an_idempotent_action_is_sent_again_once_after_a_hang_up(server: Scripted) -> None:
    assert "info" in IDEMPOTENT
    server.hang_ups = 1
    assert RpcClient(server.address, 10).call("info", {}) == "info"
    assert server.requests == ["info", "info"]
    server.requests.clear()
    server.hang_ups = 2
    with pytest.raises(errors.ReplicaUnavailable, match="did not answer 'info'"):
        RpcClient(server.address, 10).call("info", {})
    assert server.requests == ["info", "info"]


def test_other_actions_are_never_sent_twice(server: Scripted) -> None:
    assert "commit" not in IDEMPOTENT
    server.hang_ups = 1
    with pytest.raises(errors.ReplicaUnavailable, match="did not answer 'commit'"):
        RpcClient(server.address, 10).call("commit", {})
    assert server.requests == ["commit"]


class _Unsendable:
    def sendall(self, data: bytes) -> None:
        raise BrokenPipeError("broken pipe")

    def close(self) -> None:
        pass


def test_a_failure_before_sending_is_retried_once_on_a_new_connection(
    server: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = RpcClient(server.address, 10)
    real = client._connection
    broken = iter([True])

    def connection():  # the first connection breaks before anything was sent
        if next(broken, False):
            client._local.conn = (_Unsendable(), None)
            return client._local.conn
        return real()

    monkeypatch.setattr(client, "_connection", connection)
    assert client.call("commit", {}) == "commit"
    assert server.requests == ["commit"]

    broken = iter([True, True])
    with pytest.raises(errors.ReplicaUnavailable, match="is unreachable: broken pipe"):
        client.call("commit", {})
    assert server.requests == ["commit"]
