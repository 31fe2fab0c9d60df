"""A fault-injecting TCP proxy in front of a replica's RPC port, for tests of lost answers.

It relays the replica protocol (coordinator/wire/rpc.py: a 4-byte big-endian length, then a JSON
object ``{"a": action, "b": args}``; answers are framed the same way) and can cut one
connection at a chosen point of one action:

* :meth:`RpcProxy.drop_reply_of`: forward the next request of that action, then cut the
  connection when its answer comes back, without relaying it: the replica acted, the client
  never hears.
* :meth:`RpcProxy.drop_request_of`: cut the connection instead of forwarding the request: the
  replica never hears of it.

Each returns a ``threading.Event`` set when the fault fired, so a test can assert it happened.
"""

from __future__ import annotations

import json
import socket
import struct
import threading

_LEN = struct.Struct(">I")


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _read_frame(sock: socket.socket) -> bytes:
    header = _recv_exact(sock, _LEN.size)
    return header + _recv_exact(sock, _LEN.unpack(header)[0])


class RpcProxy:
    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.rpartition(":")
        self._upstream = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._armed: tuple[str, str, threading.Event] | None = None  # (kind, action, fired)
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def drop_reply_of(self, action: str) -> threading.Event:
        return self._arm("reply", action)

    def drop_request_of(self, action: str) -> threading.Event:
        return self._arm("request", action)

    def _arm(self, kind: str, action: str) -> threading.Event:
        fired = threading.Event()
        with self._lock:
            self._armed = (kind, action, fired)
        return fired

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for s in self._socks:
                try:
                    s.close()
                except OSError:
                    pass

    def __enter__(self) -> RpcProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._upstream)
            with self._lock:
                self._socks += [client, server]
            cut: list[threading.Event] = []  # not empty: the next answer here is dropped
            threading.Thread(target=self._up, args=(client, server, cut), daemon=True).start()
            threading.Thread(target=self._down, args=(client, server, cut), daemon=True).start()

    def _take(self, action: str) -> tuple[str, threading.Event] | None:
        with self._lock:
            if self._armed is not None and self._armed[1] == action:
                kind, _, fired = self._armed
                self._armed = None
                return kind, fired
        return None

    def _up(self, client: socket.socket, server: socket.socket, cut: list[threading.Event]) -> None:
        try:
            while True:
                frame = _read_frame(client)
                hit = self._take(str(json.loads(frame[_LEN.size :]).get("a")))
                if hit is not None and hit[0] == "request":
                    hit[1].set()
                    break
                if hit is not None:
                    cut.append(hit[1])  # before forwarding: the answer cannot overtake it
                server.sendall(frame)
        except (EOFError, OSError):
            pass
        _close(client, server)

    def _down(self, client: socket.socket, server: socket.socket, cut: list[threading.Event]) -> None:
        try:
            while True:
                frame = _read_frame(server)
                if cut:
                    cut[0].set()
                    break
                client.sendall(frame)
        except (EOFError, OSError):
            pass
        _close(client, server)


def _close(*socks: socket.socket) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            s.close()
        except OSError:
            pass
