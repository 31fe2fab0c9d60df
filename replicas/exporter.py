"""A replica's Prometheus endpoint: its metrics computed at scrape time from one reading of its
counters (:class:`ReplicaCollector`, in a registry of the replica's own, never the process-global
default one), served when the replica runs with ``--metrics-port`` (:func:`serve`).

The same port answers ``/healthz`` (200 while the process and its RPC loop run) and ``/ready``
(200 while the replica serves and is caught up: see replicas/metrics.py's ``ready_problem``; 503
with the reason otherwise), for supervisors and load balancers; every other path but ``/metrics``
is 404. It is served by a bounded number of threads (:class:`PooledWSGIServer`): idle or slow
peers cost it neither threads nor the answers to the others. What is counted, and how, is
replicas/metrics.py's.
"""

from __future__ import annotations

import io
import logging
import platform
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

if TYPE_CHECKING:  # pragma: no cover
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    from replicas.replica import Replica
from replicas.metrics import ABORT_REASONS, LATENCY_BUCKETS, ZK_STATES, Stats, ready_problem

log = logging.getLogger(__name__)


class ReplicaCollector:
    """The replica's metrics, computed at scrape time from one :class:`Stats` reading (see the
    module docstring)."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica

    def describe(self) -> list:
        return []  # no describe-time collection: the registry would call collect() for it

    def collect(self) -> Iterator[Any]:
        s = self.replica.stats()
        if s.has_committer:
            yield from self._commit_metrics(s)
        yield from self._log_metrics(s)
        yield from self._cleanup_metrics(s)
        yield from self._insert_metrics(s)
        yield from self._session_metrics(s)

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        from prometheus_client.core import CounterMetricFamily

        m = CounterMetricFamily(f"mergetxn_{name}", doc, labels=["replica"])
        m.add_metric([self.replica.host_id], value)
        return m

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        from prometheus_client.core import GaugeMetricFamily

        m = GaugeMetricFamily(f"mergetxn_{name}", doc, labels=["replica"])
        m.add_metric([self.replica.host_id], value)
        return m

    def _commit_metrics(self, s: Stats) -> Iterator[Any]:
        """The committer's: commits, batches, failures, conflicts by kind, commit latency."""
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        host_id = self.replica.host_id
        yield self._counter("commits", "Transactions committed through this replica", s.commits)
        yield self._counter("commit_batches", "Group-commit batches (one ZooKeeper multi each)", s.commit_batches)
        yield self._counter("commit_failures", "Commits that did not commit (conflicts included)", s.commit_failures)
        yield self._counter(
            "local_version_misses",
            "First attempts on locally applied target versions that ZooKeeper refused",
            s.local_version_misses,
        )
        conflicts = CounterMetricFamily(
            "mergetxn_conflicts", "Commits that lost a conflict, by kind", labels=["replica", "kind"]
        )
        for kind, n in sorted(s.conflicts.items()):
            conflicts.add_metric([host_id, kind], n)
        yield conflicts
        buckets, cumulative = [], 0
        for bound, n in zip((*map(str, LATENCY_BUCKETS), "+Inf"), s.latency_counts):
            cumulative += n
            buckets.append((bound, cumulative))
        latency = HistogramMetricFamily(
            "mergetxn_commit_latency_seconds",
            "Time from a commit request reaching the committer to its decision",
            labels=["replica"],
        )
        latency.add_metric([host_id], buckets, s.latency_sum)
        yield latency

    def _log_metrics(self, s: Stats) -> Iterator[Any]:
        """The log's: applied and seen CSNs, entries, lag, running transactions, WAL size."""
        yield self._gauge("applied_csn", "CSN up to which this replica applied the log", s.applied_csn)
        yield self._gauge("log_end_csn", "CSN of the newest log entry this replica saw in ZooKeeper", s.log_end_csn)
        yield self._gauge("log_entries", "Log entries ZooKeeper holds", s.log_entries)
        yield self._gauge("lag_entries", "Log entries not applied here yet", s.lag_entries)
        yield self._gauge(
            "lag_seconds", "Seconds since this replica saw an entry it has not applied yet", s.lag_seconds
        )
        yield self._gauge("running_transactions", "Transactions running on this replica", s.running_transactions)
        yield self._gauge("wal_bytes", "Size of the WAL", s.wal_bytes)
        yield self._counter("wal_syncs", "fsyncs of the WAL (group commit: several commits per fsync)", s.wal_syncs)

    def _cleanup_metrics(self, s: Stats) -> Iterator[Any]:
        """Cleanup passes, merges by outcome, aborted transactions by reason."""
        from prometheus_client.core import CounterMetricFamily

        host_id = self.replica.host_id
        yield self._counter("cleanup_passes", "Cleanup passes run by this replica", s.cleanup_passes)
        yield self._counter("cleanup_failures", "Cleanup passes that failed", s.cleanup_failures)
        yield self._counter("cleanup_files_removed", "Files removed by cleanup passes here", s.cleanup_files_removed)
        merges = CounterMetricFamily(
            "mergetxn_merges", "Background merges run here, by outcome", labels=["replica", "outcome"]
        )
        for outcome, n in sorted(s.merges.items()):
            merges.add_metric([host_id, outcome], n)
        yield merges
        aborted = CounterMetricFamily(
            "mergetxn_transactions_aborted",
            "Transactions that ended aborted here, by reason",
            labels=["replica", "reason"],
        )
        for reason in sorted(set(ABORT_REASONS) | set(s.aborted)):
            aborted.add_metric([host_id, reason], s.aborted.get(reason, 0))
        yield aborted

    def _insert_metrics(self, s: Stats) -> Iterator[Any]:
        """Inserts delayed or refused by their partition's visible parts."""
        held = s.inserts_held
        yield self._counter(
            "inserts_delayed", "Inserts delayed by the visible parts of their partition", held["delayed"]
        )
        yield self._counter("inserts_refused", "Inserts refused with TooManyParts", held["refused"])
        yield self._counter("insert_delay_seconds", "Seconds inserts were delayed in all", held["delay_seconds"])

    def _session_metrics(self, s: Stats) -> Iterator[Any]:
        """The ZooKeeper session's state, the incarnation, readiness and the build."""
        from prometheus_client.core import GaugeMetricFamily

        r = self.replica
        session = GaugeMetricFamily(
            "mergetxn_zookeeper_session_state",
            "1 for the state this replica's ZooKeeper session is in (CONNECTED, SUSPENDED or LOST), 0 for the others",
            labels=["replica", "state"],
        )
        for name in ZK_STATES:
            session.add_metric([r.host_id, name], 1 if s.zk_state == name else 0)
        yield session
        yield self._gauge(
            "zookeeper_session_lost",
            "1 while the session was lost and a new one is not registered yet",
            1 if s.session_lost else 0,
        )
        yield self._gauge(
            "incarnation", "This replica's incarnation (bumped at each start and new session)", s.incarnation
        )
        yield self._gauge("ready", "1 when /ready answers 200", 0 if replica_ready_problem(r, True) else 1)
        info = GaugeMetricFamily(
            "mergetxn_build_info",
            "The mergetxn version this replica runs (always 1)",
            labels=["replica", "version", "python"],
        )
        info.add_metric([r.host_id, _build_version(), platform.python_version()], 1)
        yield info


def _build_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mergetxn")
    except PackageNotFoundError:
        return "unknown"


def replica_ready_problem(r: Replica, serving: bool) -> str | None:
    """:func:`ready_problem` of replica ``r`` now (memory only)."""
    _, lag_seconds = r.log_watch.lag(r.state.applied)
    return ready_problem(
        serving and r.committer is not None,
        str(r.zk.state),
        r.zk_session.lost.is_set(),
        r.pauses.awake(),
        r.state.failure,
        lag_seconds,
        missing=r.missing(),
    )


class _Quiet(WSGIRequestHandler):
    """One request, whose head :class:`PooledWSGIServer` has read already."""

    server: PooledWSGIServer

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # (an open file of the socket would keep it from closing)
        self.rfile = io.BytesIO(self.server.heads.pop(self.request, b""))

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


HTTP_WORKERS = 4  # threads answering the metrics port's requests
HTTP_QUEUE = 64  # complete requests waiting for them; beyond it a request's connection is closed
HTTP_WAITING = 128  # connections whose request has not arrived whole; a newcomer closes the oldest beyond
HTTP_IDLE_SECONDS = 5.0  # a connection whose request has not arrived whole by then is closed
HTTP_SEND_SECONDS = 5.0  # an answer its peer does not read is given up after this
_HEAD_MAX = 16 * 1024  # bytes of a request's line and headers
_ACCEPTS_PER_WAKE = 32  # fewer than HTTP_WAITING: a connection is read before newcomers can push it out


class PooledWSGIServer(WSGIServer):
    """The metrics port's HTTP server. One thread (:meth:`serve_forever`) accepts and reads every
    connection's request line and headers without blocking, bounded in bytes (``_HEAD_MAX``), time
    (``HTTP_IDLE_SECONDS``) and number (``HTTP_WAITING``: a newcomer closes the oldest); a pool of
    ``HTTP_WORKERS`` threads answers complete requests, one per connection (as wsgiref does). A
    flood of idle connections thus holds no thread, and ``/ready`` is answered as soon as its
    request arrives (the pool only ever waits for peers that do not read their answer, at most
    ``HTTP_SEND_SECONDS``)."""

    request_queue_size = 128  # the listen backlog (socketserver's 5 drops connects of a burst for 1 s)

    def __init__(self, address: tuple[str, int], handler: type[WSGIRequestHandler]) -> None:
        super().__init__(address, handler)
        self.socket.setblocking(False)
        self.heads: dict[socket.socket, bytes] = {}  # a complete request's head, for its handler
        self._waiting: dict[socket.socket, tuple[bytearray, float, Any]] = {}  # oldest first
        self._sel = selectors.DefaultSelector()
        self._pool = ThreadPoolExecutor(max_workers=HTTP_WORKERS, thread_name_prefix="metrics-http")
        self._queued = 0  # requests on the pool (answered or waiting)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._done = threading.Event()

    def serve_forever(self, poll_interval: float = 0.25) -> None:
        self._sel.register(self.socket, selectors.EVENT_READ, None)
        try:
            while not self._stop.is_set():
                events = self._sel.select(poll_interval)
                for key, _ in events:  # the connections first: one accepted before is read before newcomers
                    if key.data is not None:
                        self._read(key.fileobj)  # type: ignore[arg-type]
                if any(key.data is None for key, _ in events):
                    self._accept()
                self._expire(time.monotonic())
        finally:
            for sock in list(self._waiting):
                self._drop(sock)
            self._sel.close()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self.server_close()
            self._done.set()

    def shutdown(self) -> None:
        self._stop.set()
        self._done.wait(5)

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_WAKE):
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, say: the oldest waiting one makes room
                if self._waiting:
                    self._drop(next(iter(self._waiting)))
                return
            if len(self._waiting) >= HTTP_WAITING:
                self._drop(next(iter(self._waiting)))
            sock.setblocking(False)
            self._waiting[sock] = (bytearray(), time.monotonic() + HTTP_IDLE_SECONDS, address)
            self._sel.register(sock, selectors.EVENT_READ, address)

    def _read(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if sock not in self._waiting:
            return
        head, _, address = self._waiting[sock]
        head += data
        if not data or len(head) > _HEAD_MAX:
            self._drop(sock)
        elif b"\r\n\r\n" in head or b"\n\n" in head:
            self._sel.unregister(sock)
            del self._waiting[sock]
            self._hand_on(sock, bytes(head), address)

    def _hand_on(self, sock: socket.socket, head: bytes, address: Any) -> None:
        with self._lock:
            full = self._queued >= HTTP_WORKERS + HTTP_QUEUE
            if not full:
                self._queued += 1
        if full:
            self.shutdown_request(sock)
            return
        self.heads[sock] = head
        self._pool.submit(self._answer, sock, address)

    def _answer(self, sock: socket.socket, address: Any) -> None:
        try:
            sock.settimeout(HTTP_SEND_SECONDS)
            self.finish_request(sock, address)
        except Exception as exc:  # noqa: BLE001 - a peer that went away, mostly
            log.debug("metrics port: a request from %s failed: %r", address, exc)
        finally:
            self.heads.pop(sock, None)
            self.shutdown_request(sock)
            with self._lock:
                self._queued -= 1

    def _expire(self, now: float) -> None:
        for sock in [s for s, (_, deadline, _) in self._waiting.items() if deadline <= now]:
            self._drop(sock)

    def _drop(self, sock: socket.socket) -> None:
        self._waiting.pop(sock, None)
        try:
            self._sel.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()


def app(replica: Replica, serving: Callable[[], bool], metrics_app: Callable) -> Callable:
    """The WSGI application of the metrics port: ``/metrics``, ``/healthz``, ``/ready``, else 404."""

    def answer(start_response: Callable, status: str, text: str) -> list[bytes]:
        body = (text + "\n").encode()
        start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))])
        return [body]

    def application(environ: dict, start_response: Callable) -> list[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path == "/healthz":
            if serving():
                return answer(start_response, "200 OK", "ok")
            return answer(start_response, "503 Service Unavailable", "the RPC loop is not running")
        if path == "/ready":
            problem = replica_ready_problem(replica, serving())
            if problem is None:
                return answer(start_response, "200 OK", "ready")
            return answer(start_response, "503 Service Unavailable", f"not ready: {problem}")
        return answer(start_response, "404 Not Found", "not found: try /metrics, /healthz or /ready")

    return application


def serve(replica: Replica, host: str, port: int, serving: Callable[[], bool] = lambda: True) -> tuple[str, Any]:
    """Serve ``replica``'s metrics at ``http://host:port/metrics`` (port 0: a free one) from a
    registry of its own, with the process collector, plus ``/healthz`` and ``/ready``
    (``serving``: whether the RPC loop runs); returns ``(host:port, server)``
    (``server.shutdown()`` stops it)."""
    from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app

    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReplicaCollector(replica))
    ProcessCollector(registry=registry)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
    httpd = make_server(
        host, port, app(replica, serving, make_wsgi_app(registry)), PooledWSGIServer, handler_class=_Quiet
    )
    threading.Thread(target=httpd.serve_forever, name="metrics", daemon=True).start()
    return f"{host}:{httpd.server_port}", httpd
