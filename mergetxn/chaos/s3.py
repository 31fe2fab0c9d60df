"""The S3 variant of a chaos run's shared storage, and the S3 faults of the nemesis.

``mergetxn chaos --storage s3`` keeps the parts in an S3 bucket instead of a directory every host
sees: moto's S3 server runs as a process of its own on one host (in the namespace form inside host
0's namespace, listening on that host's address; in the loopback and single forms on 127.0.0.1),
the harness creates a bucket in it, and every replica is started with ``--storage
s3://<bucket>/warehouse``. Replicas and the harness's clients reach S3 through
:class:`S3FaultProxy`, an HTTP-aware proxy in front of moto that the nemesis uses for two fault
kinds, each healed:

* ``s3-errors``: for the hold, a fraction of S3 requests is answered by the proxy itself with an
  S3 error (``503 SlowDown`` or ``500 InternalError``, S3's XML body) and never reaches moto;
* ``s3-timeouts``: for the hold, a fraction of requests stalls. Each stalled request meets one of
  three fates when the fault heals: forwarded late (a slow S3), its connection reset without it
  ever reaching S3, or forwarded at once with its answer withheld until its connection is reset
  (S3 did the work, the caller never learns it: an object may exist after a failed PUT).

Credentials (a key and secret made up for the run: moto accepts any) and the endpoint reach the
replica processes and the harness's clients through the environment only (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``: see ``parts/io/storage.py``), set in the harness's
own environment while the storage runs and restored when it stops; never on a command line,
never logged. ``AWS_MAX_ATTEMPTS`` is set to :data:`MAX_ATTEMPTS` so that botocore gives up
after one retry, and S3 faults reach mergetxn within a fault's hold instead of being absorbed by
botocore's default five attempts with back-off (s3fs still retries ``SlowDown`` itself).

In the namespace form the proxy listens on the bridge address (where the harness's clients come
from): a replica reaches S3 through it unless its host is isolated, and the proxy reaches moto
over host 0's link, so faults on host 0's network reach S3 as well.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mergetxn.chaos.plan import Plan
from mergetxn.chaos.proxy import Listening, close_quietly

log = logging.getLogger(__name__)

BUCKET = "mergetxn-chaos"
PREFIX = "warehouse"
NAMESPACE_PORT = 9000  # moto's port inside host 0's namespace (its addresses are the run's own)
MAX_ATTEMPTS = 2  # botocore attempts per S3 call (its default is 5)
REGION = "us-east-1"
KINDS = ("s3-errors", "s3-timeouts")
SUPPORTS = frozenset({"s3_errors", "s3_timeouts"})  # the names of ``supports()`` (nemesis.NEEDS)
ERROR_FRACTIONS = (0.3, 0.6, 1.0)
STALL_FRACTIONS = (0.5, 1.0)
EXTRA_HOLD = (1.0, 4.0)  # seconds an S3 fault holds on top of the nemesis's hold
ERRORS = {
    "SlowDown": (503, "Slow Down", "Please reduce your request rate."),
    "InternalError": (500, "Internal Server Error", "We encountered an internal error. Please try again."),
}
STALL_FATES = ("late", "cut-before", "cut-after")
CHUNK = 65536
MAX_HEAD = 64 * 1024


# -- the HTTP-aware fault proxy ---------------------------------------------------------------------


class _Closed(Exception):
    """A peer closed its connection (or the proxy closed it)."""


class _Reader:
    """Buffered reads of HTTP/1.1 framing from a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def _fill(self) -> None:
        try:
            data = self.sock.recv(CHUNK)
        except OSError as exc:
            raise _Closed(str(exc)) from None
        if not data:
            raise _Closed("end of stream")
        self.buf += data

    def head(self) -> bytes | None:
        """The next message head (start line and headers, with the blank line); None when the
        peer closed cleanly between messages."""
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > MAX_HEAD:
                raise _Closed("message head too long")
            try:
                self._fill()
            except _Closed:
                if not self.buf:
                    return None
                raise
        end = self.buf.index(b"\r\n\r\n") + 4
        head = bytes(self.buf[:end])
        del self.buf[:end]
        return head

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if len(self.buf) > MAX_HEAD:
                raise _Closed("line too long")
            self._fill()
        end = self.buf.index(b"\r\n") + 2
        out = bytes(self.buf[:end])
        del self.buf[:end]
        return out

    def copy(self, n: int, out: Callable[[bytes], None]) -> None:
        """Pass exactly ``n`` bytes to ``out``."""
        while n > 0:
            if not self.buf:
                self._fill()
            take = bytes(self.buf[:n])
            del self.buf[: len(take)]
            n -= len(take)
            out(take)

    def copy_to_end(self, out: Callable[[bytes], None]) -> None:
        """Pass everything until the peer closes (a body framed by the end of the connection)."""
        while True:
            if self.buf:
                out(bytes(self.buf))
                self.buf.clear()
            try:
                self._fill()
            except _Closed:
                return


@dataclass
class _Head:
    raw: bytes
    start: str
    headers: dict[str, str]  # lower-cased names; the last value wins

    @classmethod
    def parse(cls, raw: bytes) -> _Head:
        lines = raw.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        return cls(raw, lines[0], headers)

    def chunked(self) -> bool:
        return "chunked" in self.headers.get("transfer-encoding", "").lower()

    def length(self) -> int | None:
        value = self.headers.get("content-length")
        try:
            return int(value) if value is not None else None
        except ValueError:
            raise _Closed(f"bad Content-Length {value!r}") from None

    def closes(self) -> bool:
        return self.headers.get("connection", "").lower() == "close"


def _copy_body(
    reader: _Reader,
    head: _Head,
    out: Callable[[bytes], None],
    *,
    response: bool = False,
    method: str = "",
    status: int = 0,
) -> bool:
    """Pass a message's body from ``reader`` to ``out``; returns False when the body ran to the
    end of the connection (so the connection cannot carry another message)."""
    if response and (method == "HEAD" or 100 <= status < 200 or status in (204, 304)):
        return True
    if head.chunked():
        while True:
            line = reader.line()
            out(line)
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, then the blank line
                    trailer = reader.line()
                    out(trailer)
                    if trailer == b"\r\n":
                        return True
            reader.copy(size + 2, out)
    length = head.length()
    if length is not None:
        reader.copy(length, out)
        return True
    if response:
        reader.copy_to_end(out)
        return False
    return True  # a request without a length has no body


def error_response(code: str, method: str, resource: str = "", close: bool = False) -> bytes:
    """An S3 error answer (status line, headers, S3's XML body) for ``code`` (:data:`ERRORS`)."""
    status, reason, message = ERRORS[code]
    request_id = uuid.uuid4().hex[:16].upper()
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message><Resource>{_xml(resource)}</Resource>"
        f"<RequestId>{request_id}</RequestId></Error>"
    ).encode()
    headers = [
        f"HTTP/1.1 {status} {reason}",
        "Content-Type: application/xml",
        f"Content-Length: {0 if method == 'HEAD' else len(body)}",
        f"x-amz-request-id: {request_id}",
        f"Connection: {'close' if close else 'keep-alive'}",
    ]
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + (b"" if method == "HEAD" else body)


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class _Conn:
    """One client connection and its upstream twin, served one request at a time (S3 clients do
    not pipeline: a client sends its next request only after the whole previous answer)."""

    def __init__(self, proxy: S3FaultProxy, client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream: socket.socket | None = None
        self.up_reader: _Reader | None = None
        self.closed = threading.Event()
        self.lock = threading.Lock()

    def serve(self) -> None:
        reader = _Reader(self.client)
        try:
            while not self.closed.is_set():
                raw = reader.head()
                if raw is None:
                    return
                if not self._one(reader, _Head.parse(raw)):
                    return
        except (_Closed, OSError, ValueError) as exc:
            log.debug("%s: connection ends: %s", self.proxy.name, exc)
        finally:
            self.close()

    def _one(self, reader: _Reader, req: _Head) -> bool:
        """Serve one request; False when the connection must end after it."""
        parts = req.start.split(" ")
        method = parts[0].upper()
        resource = parts[1].split("?", 1)[0] if len(parts) > 1 else ""
        expect = req.headers.get("expect", "").lower() == "100-continue"
        fate = self.proxy.decide(method)
        if fate in ERRORS:
            if expect:  # the client waits for 100 Continue before its body: never send it
                self._send(error_response(fate, method, resource, close=True))
                return False
            _copy_body(reader, req, lambda b: None)  # read and dropped: S3 never sees it
            self._send(error_response(fate, method, resource, close=req.closes()))
            return not req.closes()
        if fate == "cut-before":
            self.proxy.hold_until_healed(self)
            self.close(reset=True)
            return False
        if fate == "late":
            self.proxy.hold_until_healed(self)
            if self.closed.is_set():
                return False
        return self._forward(reader, req, method, withhold=fate == "cut-after")

    def _forward(self, reader: _Reader, req: _Head, method: str, withhold: bool) -> bool:
        up = self._upstream()
        up.sendall(req.raw)
        assert self.up_reader is not None
        pending: list[bytes] = []
        deliver: Callable[[bytes], None] = pending.append if withhold else self._send
        if req.headers.get("expect", "").lower() == "100-continue":
            interim = _Head.parse(self.up_reader.head() or b"")
            if _status(interim) != 100:  # a final answer at once: the body is never sent
                self._answer(interim, method, deliver)
                if withhold:
                    self._withhold()
                return False
            self._send(interim.raw)
        _copy_body(reader, req, up.sendall)
        while True:
            res = _Head.parse(self.up_reader.head() or b"")
            status = _status(res)
            if 100 <= status < 200:
                deliver(res.raw)
                continue
            break
        keep = self._answer(res, method, deliver)
        self.proxy.count("forwarded")
        if withhold:
            self._withhold()
            return False
        return keep and not req.closes()

    def _answer(self, res: _Head, method: str, deliver: Callable[[bytes], None]) -> bool:
        assert self.up_reader is not None
        deliver(res.raw)
        complete = _copy_body(self.up_reader, res, deliver, response=True, method=method, status=_status(res))
        if not complete or res.closes():
            self._close_upstream()
            return False
        return True

    def _withhold(self) -> None:
        """The answer stays with the proxy: hold until healed, then reset the connection."""
        self.proxy.hold_until_healed(self)
        self.close(reset=True)

    def _upstream(self) -> socket.socket:
        if self.upstream is None:
            self.upstream = socket.create_connection(self.proxy.upstream, timeout=30)
            self.upstream.settimeout(None)
            self.up_reader = _Reader(self.upstream)
        return self.upstream

    def _close_upstream(self) -> None:
        up, self.upstream, self.up_reader = self.upstream, None, None
        if up is not None:
            with contextlib.suppress(OSError):
                up.close()

    def _send(self, data: bytes) -> None:
        self.client.sendall(data)

    def close(self, reset: bool = False) -> None:
        with self.lock:
            if self.closed.is_set():
                return
            self.closed.set()
        close_quietly(self.client, reset)
        close_quietly(self.upstream)  # S3's own end: never reset
        self.proxy.forget(self)


def _status(head: _Head) -> int:
    try:
        return int(head.start.split(" ")[1])
    except (IndexError, ValueError):
        raise _Closed(f"bad status line {head.start!r}") from None


class S3FaultProxy(Listening):
    """A threaded HTTP/1.1 proxy in front of an S3 endpoint (``host:port``) that can answer
    requests with S3 errors itself and stall others (see the module doc). Thread-safe: the
    faults may change while requests are under way. ``seed`` makes its choices repeatable for
    one sequence of requests."""

    def __init__(
        self,
        upstream: str,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        name: str = "s3proxy",
        seed: int | None = None,
    ) -> None:
        super().__init__(upstream, listen_host, listen_port, name)
        self._rng = random.Random(seed)
        self._conns: set[_Conn] = set()
        self._healed = threading.Event()
        self._healed.set()
        self.error_fraction = 0.0
        self.error_codes: tuple[str, ...] = tuple(ERRORS)
        self.stall_fraction = 0.0
        self.stall_fates: tuple[str, ...] = STALL_FATES
        self.counts: Counter[str] = Counter()

    @property
    def url(self) -> str:
        """The endpoint URL to give S3 clients in place of the upstream's."""
        return f"http://{self.address}"

    def stop(self) -> None:
        """Stop listening, release every stalled request and close every connection."""
        self._healed.set()
        super().stop()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            c.close(reset=True)

    # -- faults -------------------------------------------------------------------------------
    def errors(self, fraction: float, codes: tuple[str, ...] | None = None) -> None:
        """From now on answer ``fraction`` of the requests with an S3 error among ``codes``
        (default: every one of :data:`ERRORS`, chosen at random per request)."""
        if not 0 <= fraction <= 1:
            raise ValueError(f"fraction must be between 0 and 1, not {fraction!r}")
        unknown = set(codes or ()) - set(ERRORS)
        if unknown:
            raise ValueError(f"unknown S3 error code(s) {sorted(unknown)}: choose from {sorted(ERRORS)}")
        self.error_codes = tuple(codes or ERRORS)
        self.error_fraction = fraction

    def stall(self, fraction: float, fates: tuple[str, ...] | None = None) -> None:
        """From now on stall ``fraction`` of the requests until :meth:`heal`, each with one of
        ``fates`` (default: every one of :data:`STALL_FATES`, chosen at random per request)."""
        if not 0 <= fraction <= 1:
            raise ValueError(f"fraction must be between 0 and 1, not {fraction!r}")
        unknown = set(fates or ()) - set(STALL_FATES)
        if unknown:
            raise ValueError(f"unknown stall fate(s) {sorted(unknown)}: choose from {list(STALL_FATES)}")
        with self._lock:
            self.stall_fates = tuple(fates or STALL_FATES)
            self.stall_fraction = fraction
            if fraction > 0:
                self._healed.clear()

    def heal(self) -> None:
        """No more errors or stalls; every stalled request meets its fate now."""
        with self._lock:
            self.error_fraction = 0.0
            self.stall_fraction = 0.0
            self._healed.set()

    @property
    def stalled(self) -> int:
        """Requests stalled right now."""
        with self._lock:
            return self.counts["stalled-now"]

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {k: v for k, v in sorted(self.counts.items()) if k != "stalled-now"}

    # -- internals ----------------------------------------------------------------------------
    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] += n

    def decide(self, method: str) -> str:
        """``forward``, an error code, or a stall fate, for the next request."""
        with self._lock:
            self.counts["requests"] += 1
            if self.error_fraction and self._rng.random() < self.error_fraction:
                code = self._rng.choice(self.error_codes)
                self.counts[f"error {code}"] += 1
                return code
            if self.stall_fraction and self._rng.random() < self.stall_fraction:
                fate = self._rng.choice(self.stall_fates)
                self.counts[f"stall {fate}"] += 1
                return fate
        return "forward"

    def hold_until_healed(self, conn: _Conn) -> None:
        self.count("stalled-now")
        try:
            while not self._healed.wait(0.2):
                if self._stopped.is_set() or conn.closed.is_set():
                    return
        finally:
            self.count("stalled-now", -1)

    def forget(self, conn: _Conn) -> None:
        with self._lock:
            self._conns.discard(conn)

    def _take(self, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(self, client)
        with self._lock:
            self._conns.add(conn)
        threading.Thread(target=conn.serve, name=f"{self.name}-conn", daemon=True).start()


# -- moto's server, the bucket, the environment -----------------------------------------------------


def _owner_env() -> dict[str, str]:
    """The marker by which ``hosts.cleanup`` finds a process whose harness is gone."""
    from mergetxn.chaos.hosts import ENV_OWNER, PREFIX

    return {ENV_OWNER: f"{PREFIX}:{os.getpid()}"}


class S3Storage:
    """A run's S3 storage: moto's server as a process of its own, a bucket, the fault proxy in
    front of it and the AWS environment. As a cluster service (``cluster.services``), it is
    started once the hosts' network exists and before the replicas, and stopped after them."""

    def __init__(self, workdir: str | os.PathLike, bucket: str = BUCKET, seed: int | None = None) -> None:
        self.workdir = Path(workdir).resolve()
        self.bucket = bucket
        self.url = f"s3://{bucket}/{PREFIX}"
        self.seed = seed
        self.proxy: S3FaultProxy | None = None
        self._moto: subprocess.Popen[bytes] | None = None
        self._moto_address = ""
        self._saved_env: dict[str, str | None] | None = None
        self._key = "AKIA" + secrets.token_hex(8).upper()
        self._secret = secrets.token_urlsafe(30)
        self._stats: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"S3Storage({self.url!r}, moto {self._moto_address or 'not started'})"

    # -- as a cluster service -----------------------------------------------------------------
    def attach(self, cluster: Any) -> None:
        """Make this the storage of ``cluster`` (created with ``storage_url=self.url``): started
        with it, stopped with it, and found there by the nemesis (``cluster.s3``)."""
        cluster.services.append(self)
        cluster.s3 = self

    def start(self, cluster: Any = None) -> None:
        """Start moto on ``cluster``'s host 0 (127.0.0.1 without namespaces), create the bucket,
        start the proxy and set the environment. On failure what was started is stopped."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        namespace = getattr(cluster, "form", "") == "namespace"
        try:
            if namespace:
                from mergetxn.chaos.hosts import BRIDGE_ADDRESS

                host, port = cluster.host_address(0), NAMESPACE_PORT
                prefix = cluster.exec_prefix(0)
                listen = BRIDGE_ADDRESS
            else:
                from mergetxn.local.zkserver import free_ports

                host, port, prefix, listen = "127.0.0.1", free_ports(1)[0], [], "127.0.0.1"
            self._start_moto(prefix, host, port)
            self._create_bucket()
            self.proxy = S3FaultProxy(self._moto_address, listen, name="mtx-s3proxy", seed=self.seed).start()
            self._set_env()
            log.info("S3 storage %s: moto at %s, reached through %s", self.url, self._moto_address, self.proxy.address)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the proxy and moto (its objects go with it) and restore the environment.
        Idempotent."""
        if self.proxy is not None:
            self._stats = self.proxy.stats()
            self.proxy.stop()
            self.proxy = None
        if self._moto is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._moto.pid, signal.SIGKILL)
            self._moto.wait()
            self._moto = None
        self._restore_env()

    def _start_moto(self, prefix: list[str], host: str, port: int) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(_owner_env())
        argv = [*prefix, sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)]
        with open(self.workdir / "moto.log", "ab") as out:
            self._moto = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        self._moto_address = f"{host}:{port}"
        deadline = time.monotonic() + 60
        while True:
            if self._moto.poll() is not None:
                tail = (self.workdir / "moto.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"moto's S3 server exited with {self._moto.returncode}:\n{tail}")
            try:
                socket.create_connection((host, port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"moto's S3 server at {host}:{port} did not listen in 60 s") from None
                time.sleep(0.1)

    def _client(self, endpoint: str) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=self._key,
            aws_secret_access_key=self._secret,
            region_name=REGION,
        )

    def _create_bucket(self) -> None:
        s3 = self._client(f"http://{self._moto_address}")
        deadline = time.monotonic() + 30
        while True:
            try:
                s3.create_bucket(Bucket=self.bucket)
                return
            except Exception as exc:  # moto still starting its routes
                if time.monotonic() > deadline:
                    raise RuntimeError(f"could not create bucket {self.bucket}: {type(exc).__name__}") from None
                time.sleep(0.2)

    @property
    def environment(self) -> dict[str, str]:
        """The variables replicas and clients find S3 by (holds the secret: never print it)."""
        assert self.proxy is not None, "not started"
        return {
            "AWS_ACCESS_KEY_ID": self._key,
            "AWS_SECRET_ACCESS_KEY": self._secret,
            "AWS_ENDPOINT_URL": self.proxy.url,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_MAX_ATTEMPTS": str(MAX_ATTEMPTS),
        }

    @property
    def storage_options(self) -> dict[str, str]:
        """The same as ``Storage`` options (for ``coordinator.connect(address, storage_options=...)``)."""
        assert self.proxy is not None, "not started"
        return {"key": self._key, "secret": self._secret, "endpoint_url": self.proxy.url}

    def _set_env(self) -> None:
        """Replicas are spawned with the harness's environment and clients without storage
        options read it: set ours for as long as the storage runs."""
        if self._saved_env is None:
            self._saved_env = {k: os.environ.get(k) for k in self.environment}
        os.environ.update(self.environment)

    def _restore_env(self) -> None:
        saved, self._saved_env = self._saved_env, None
        for k, v in (saved or {}).items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def objects(self, prefix: str = "") -> list[str]:
        """Keys in the bucket under the warehouse (read from moto directly, not through the
        proxy): for checks after a run."""
        s3 = self._client(f"http://{self._moto_address}")
        keys, token = [], None
        while True:
            kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": f"{PREFIX}/{prefix}"}
            if token:
                kw["ContinuationToken"] = token
            page = s3.list_objects_v2(**kw)
            keys += [o["Key"][len(PREFIX) + 1 :] for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return keys
            token = page["NextContinuationToken"]

    @property
    def moto_pid(self) -> int | None:
        return self._moto.pid if self._moto is not None and self._moto.poll() is None else None

    # -- faults -------------------------------------------------------------------------------
    def supports(self) -> set[str]:
        return set(SUPPORTS)

    def heal(self) -> None:
        if self.proxy is not None:
            self.proxy.heal()

    def stats(self) -> dict[str, int]:
        """Requests through the proxy, by what it did with them."""
        return self.proxy.stats() if self.proxy is not None else dict(self._stats)

    def inject(self, kind: str, rng: random.Random) -> str:
        """Start a fault of ``kind`` (:data:`KINDS`) and hold it :data:`EXTRA_HOLD` seconds (the
        nemesis holds it some more, then calls :meth:`heal`); returns its detail."""
        assert self.proxy is not None, "not started"
        extra = rng.uniform(*EXTRA_HOLD)
        if kind == "s3-errors":
            fraction = rng.choice(ERROR_FRACTIONS)
            self.proxy.errors(fraction)
            detail = f"{fraction:.0%} of S3 requests answered 503 SlowDown / 500 InternalError"
        elif kind == "s3-timeouts":
            fraction = rng.choice(STALL_FRACTIONS)
            self.proxy.stall(fraction)
            detail = (
                f"{fraction:.0%} of S3 requests stalled until healed, then forwarded late, reset unsent "
                "or reset with their answer withheld"
            )
        else:
            raise ValueError(f"not an S3 fault kind: {kind!r}")
        before = self.proxy.stats()
        time.sleep(extra)
        after = self.proxy.stats()
        hit = sum(after.get(k, 0) - before.get(k, 0) for k in after if k.startswith(("error", "stall")))
        seen = after.get("requests", 0) - before.get("requests", 0)
        return f"{detail}; {hit} of {seen} requests hit in its first {extra:.1f}s"


def plans(kind: str, cluster: Any, rng: random.Random) -> list[Plan]:
    """The nemesis's plans for an S3 fault ``kind`` on ``cluster`` (none without S3 storage):
    one target, the S3 server; one S3 fault at a time (resource ``s3``)."""
    s3: S3Storage | None = getattr(cluster, "s3", None)
    if s3 is None or kind not in KINDS:
        return []
    return [Plan(kind, "s3", frozenset({"s3"}), lambda: s3.inject(kind, rng), s3.heal)]


def check_kinds(option: str, storage: str) -> None:
    """An S3 fault kind asked for by name needs ``--storage s3`` (``all`` just leaves it out)."""
    from coordinator.core.errors import InvalidInput

    asked = {k.strip() for k in option.lower().split(",")}
    named = sorted(asked & set(KINDS))
    if named and storage != "s3":
        raise InvalidInput(f"fault kind(s) {named} need S3 storage: add --storage s3")


@contextlib.contextmanager
def moto_server(workdir: str | os.PathLike, seed: int | None = None) -> Iterator[S3Storage]:
    """An :class:`S3Storage` on 127.0.0.1 without a cluster (tests, trying the proxy by hand)."""
    storage = S3Storage(workdir, seed=seed)
    storage.start()
    try:
        yield storage
    finally:
        storage.stop()


__all__ = [
    "BUCKET",
    "ERRORS",
    "KINDS",
    "S3FaultProxy",
    "S3Storage",
    "check_kinds",
    "error_response",
    "moto_server",
    "plans",
]
