"""A fault-injecting TCP proxy: the loopback form's network.

Where network namespaces cannot be made, every process of a simulated cluster runs on 127.0.0.1
and the links that faults act on go through a :class:`TcpProxy` each (a replica's connections
to every ZooKeeper member, clients' connections to a replica). The proxy relays bytes between
its listening port and one upstream address and can, on command:

* :meth:`TcpProxy.block`: a partition. ``hang=False`` cuts every live connection and refuses
  new ones (a peer that resets); ``hang=True`` stops relaying and holds new connections without
  answering, as packets lost in a real partition (the peers find out only by their own
  timeouts); :meth:`TcpProxy.unblock` lets held data flow again;
* :attr:`TcpProxy.delay`: seconds added to every chunk each way (a slow link), without
  serialising chunks behind each other's delay;
* :attr:`TcpProxy.loss`: probability that a chunk is late by a retransmission timeout
  (:attr:`TcpProxy.loss_penalty`), holding back what follows it, as TCP over a lossy link;
* :attr:`TcpProxy.drop`: probability that a chunk resets the connection instead.

Subclasses may relay a protocol of their own by overriding :attr:`TcpProxy.relay_class`
(tests/zkproxy.py understands ZooKeeper's framing to cut a connection around one ``multi``).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import socket
import struct
import threading
import time
from typing import Self

log = logging.getLogger(__name__)

CHUNK = 65536


def close_quietly(sock: socket.socket | None, reset: bool = False) -> None:
    """Close ``sock`` (None: nothing), whatever it says: with RST when ``reset`` (as a dropped
    connection looks), else after shutting it down both ways."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class Listening:
    """What both fault proxies are (this TCP one and ``mergetxn.chaos.s3.S3FaultProxy``): a
    socket listening on ``listen_host`` (a free port unless ``listen_port``) in front of
    ``upstream`` (``host:port``), and a thread accepting connections until :meth:`stop`, each
    handed to :meth:`_take`. Used as a context manager, it is started and stopped."""

    def __init__(self, upstream: str, listen_host: str, listen_port: int, name: str) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.name = name
        self._listener = socket.create_server((listen_host, listen_port))
        self.host = listen_host
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name=f"{name}-accept", daemon=True)

    @property
    def address(self) -> str:
        """``host:port`` to give a client in place of the upstream address."""
        return f"{self.host}:{self.port}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening (subclasses end their connections too). Idempotent."""
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._take(client)

    def _take(self, client: socket.socket) -> None:
        """A connection accepted: serve it (or refuse it)."""
        raise NotImplementedError


class Relay:
    """One accepted client connection and its upstream twin: bytes relayed both ways, and the
    two sockets closed together (a half-open pair would hide a fault from one side)."""

    def __init__(self, proxy: TcpProxy, client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server: socket.socket | None = None
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        threading.Thread(target=self._run, name=f"{self.proxy.name}-open", daemon=True).start()

    def _run(self) -> None:
        """Connect upstream (not in the accept loop: a slow upstream must not hold it), then
        relay; an unreachable upstream closes the client as a refused connection would."""
        try:
            server = socket.create_connection(self.proxy.upstream, timeout=5)
        except OSError as exc:
            log.debug("%s: upstream %s unreachable: %r", self.proxy.name, self.proxy.upstream, exc)
            self.close()
            return
        server.settimeout(None)
        for s in (self.client, server):
            with contextlib.suppress(OSError):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self.server = server
            closed = self._closed
        if closed:  # cut while connecting
            with contextlib.suppress(OSError):
                server.close()
            return
        self.pumps()

    def pumps(self) -> None:
        """Start the relaying threads (override for a protocol-aware relay)."""
        assert self.server is not None
        for src, dst, direction in (
            (self.client, self.server, "up"),
            (self.server, self.client, "down"),
        ):
            outbox: queue.Queue[tuple[float, bytes] | None] = queue.Queue()
            name = f"{self.proxy.name}-{direction}"
            threading.Thread(target=self._read, args=(src, outbox), name=name, daemon=True).start()
            threading.Thread(target=self._write, args=(dst, outbox), name=name, daemon=True).start()

    def _read(self, src: socket.socket, outbox: queue.Queue[tuple[float, bytes] | None]) -> None:
        """Read chunks and stamp each with the time it may leave (delay, loss)."""
        proxy = self.proxy
        last_due = 0.0
        try:
            while not self._closed:
                proxy.wait_flowing()
                data = src.recv(CHUNK)
                if not data:
                    break
                proxy.wait_flowing()  # what arrived during a partition is held, not delivered
                if proxy.drop and random.random() < proxy.drop:
                    log.info("%s: dropping a connection (drop probability %s)", proxy.name, proxy.drop)
                    self.close(reset=True)
                    return
                due = time.monotonic() + proxy.delay
                if proxy.loss and random.random() < proxy.loss:
                    due += proxy.loss_penalty
                last_due = max(last_due, due)  # TCP delivers in order: nothing overtakes a late chunk
                outbox.put((last_due, data))
        except OSError:
            pass
        outbox.put(None)

    def _write(self, dst: socket.socket, outbox: queue.Queue[tuple[float, bytes] | None]) -> None:
        try:
            while True:
                item = outbox.get()
                if item is None:
                    break
                due, data = item
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                self.proxy.wait_flowing()
                dst.sendall(data)
        except OSError:
            pass
        self.close()

    def close(self, reset: bool = False) -> None:
        """Close both sockets (``reset``: with RST, as a dropped connection looks)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            socks = [self.client, self.server]
        for s in socks:
            close_quietly(s, reset)
        self.proxy.forget(self)


class TcpProxy(Listening):
    """A threaded TCP proxy listening on ``listen_host`` (a free port unless ``listen_port``)
    in front of ``upstream`` (``host:port``). Thread-safe; every fault knob may change while
    connections are open."""

    relay_class: type[Relay] = Relay

    def __init__(
        self, upstream: str, listen_host: str = "127.0.0.1", listen_port: int = 0, name: str = "tcpproxy"
    ) -> None:
        super().__init__(upstream, listen_host, listen_port, name)
        self._relays: set[Relay] = set()
        self._held: list[socket.socket] = []  # accepted during a hanging block
        self._flowing = threading.Event()
        self._flowing.set()
        self._refusing = False
        self.accepted = 0
        #: seconds added to every chunk, each way
        self.delay = 0.0
        #: probability that a chunk is late by :attr:`loss_penalty` (a retransmission)
        self.loss = 0.0
        self.loss_penalty = 0.2
        #: probability that a chunk resets its connection
        self.drop = 0.0

    def stop(self) -> None:
        """Stop listening and close every connection. Idempotent."""
        self._flowing.set()
        super().stop()
        self.drop_all()
        self._release_held(close=True)

    # -- faults --------------------------------------------------------------------------------
    @property
    def blocked(self) -> bool:
        return self._refusing or not self._flowing.is_set()

    def block(self, hang: bool = False) -> None:
        """A partition: ``hang=False`` cuts every connection and refuses new ones (accepted and
        closed at once); ``hang=True`` stops every byte and holds new connections unanswered."""
        if hang:
            self._flowing.clear()
        else:
            self._refusing = True
            self.drop_all()

    def unblock(self) -> None:
        """End a partition: held bytes flow, held connections go upstream, new ones pass."""
        self._refusing = False
        with self._lock:  # with the accept loop's check: no connection is held after this
            self._flowing.set()
        self._release_held(close=False)

    def heal(self) -> None:
        """Undo every fault: unblock, no delay, no loss, no drops."""
        self.delay = self.loss = self.drop = 0.0
        self.unblock()

    def drop_all(self) -> None:
        """Cut every live connection now."""
        with self._lock:
            relays = list(self._relays)
        for r in relays:
            r.close()

    def wait_flowing(self) -> None:
        """Block while a hanging partition lasts (relay threads call it)."""
        while not self._flowing.wait(0.5):
            if self._stopped.is_set():
                return

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._relays)

    # -- internals -----------------------------------------------------------------------------
    def forget(self, relay: Relay) -> None:
        with self._lock:
            self._relays.discard(relay)

    def _release_held(self, close: bool) -> None:
        with self._lock:
            held, self._held = self._held, []
        for client in held:
            if close:
                with contextlib.suppress(OSError):
                    client.close()
            else:
                self._relay(client)

    def _relay(self, client: socket.socket) -> None:
        relay = self.relay_class(self, client)
        with self._lock:
            self._relays.add(relay)
            self.accepted += 1
        relay.start()

    def _take(self, client: socket.socket) -> None:
        if self._refusing:
            client.close()
            return
        with self._lock:
            hold = not self._flowing.is_set()
            if hold:
                self._held.append(client)
        if not hold:
            self._relay(client)
