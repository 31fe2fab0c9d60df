"""What a replica says about itself: ``info`` (the ``info`` action, ``mergetxn status``), its
counters as one :class:`~replicas.metrics.Stats` reading (``stats``, also what the Prometheus
endpoint reads, replicas/exporter.py), and the ZooKeeper nodes it misses. Memory only."""

from __future__ import annotations

import sys

from replicas.memory import memory
from replicas.metrics import Stats
from replicas.replica_fields import ReplicaFields
from replicas.settings import tunables


class ReplicaInfo(ReplicaFields):
    """``info``, ``stats`` and ``missing`` of ``Replica``."""

    def missing(self) -> list[str]:
        """ZooKeeper nodes this replica needs that are gone, and the log's holes as last seen:
        a sentence each, naming the node and what to do (memory only: ``/ready``, ``info``)."""
        return self.needed.missing() + self.log_watch.holes()

    def info(self) -> dict:
        """What this replica is and how it is doing (the ``info`` action, ``mergetxn status``).
        Answered on the RPC I/O thread: memory only, no ZooKeeper or storage request (the log's
        end and the file sizes are what the log-tail thread last saw: replicas/metrics.py)."""
        s = self.stats()
        oldest, picked, _, _ = self.leases.in_use()
        holder = next((h for snap, h in picked if snap == oldest), "replica snapshot")
        last_gc = self.cleanup.last_gc_report
        return {
            "host_id": self.host_id,
            "address": self.address,
            "metrics_address": self.metrics_address,
            "storage_url": self.storage.url,
            "zk": self.config.zk,
            "zk_state": s.zk_state,
            "zk_connected": self.zk_session.connected.is_set(),
            "root": self.log.root,
            "snapshot": s.applied_csn,
            "applied_csn": s.applied_csn,
            "log_failure": None if self.state.failure is None else str(self.state.failure),
            "missing": self.missing(),  # needed ZooKeeper nodes gone, holes in the log
            "log": self._info_log(s),
            "lag": {"entries": s.lag_entries, "seconds": round(s.lag_seconds, 3)},
            "oldest_snapshot": {"snapshot": oldest, "holder": holder},
            "running_transactions": s.running_transactions,
            "outcomes": self.state.outcome_counts(),  # the outcome window (outcome_seconds)
            "structures": self._info_structures(),  # entries each structure holds (docs/architecture/bounds.md)
            "memory": memory(),  # resident set, Python blocks, Arrow's pool, the C heap
            "transactions": self.transactions.notable(),  # long-running and orphaned, with holders
            "cleanup": self._info_cleanup(s, last_gc),
            "merges": s.merges,
            "epoch_size": self.log.epoch_size,
            "incarnation": s.incarnation,
            "pauses": self.pauses.pauses,  # times it stood still long enough to make sure of its session
            "txn_max_rows": self.config.txn_max_rows,
            "tables": sorted(self.state.tables),
            "settings": tunables(self.config),
            "switch_interval": sys.getswitchinterval(),
            "secure": self.config.credentials is not None,  # TLS, users and grants, ZooKeeper ACLs
            "committer": self._info_committer(s),
            "aborted": s.aborted,  # by reason, as the metric mergetxn_transactions_aborted_total
            "inserts": s.inserts_held,  # delayed and refused by the parts per partition (too many parts)
            "async_commits": self.async_commits.describe(),
        }

    def _info_log(self, s: Stats) -> dict:
        """info()'s "log": the log's end and entries, epochs, WAL and checkpoint sizes."""
        watch = self.log_watch
        return {
            "end_csn": s.log_end_csn,
            "entries": s.log_entries,
            "epochs": watch.epochs,
            "observed_at": watch.observed_at,
            "retained": self.tail.retained if self.tail else 0,
            "wal_bytes": s.wal_bytes,
            "local_checkpoint_bytes": watch.local_checkpoint_bytes,
            "checkpoint": watch.checkpoint,
        }

    def _info_structures(self) -> dict:
        """info()'s "structures": entries each structure holds (docs/architecture/bounds.md)."""
        return {
            **self.state.sizes(),
            **self.vectors.sizes(),
            "events": self.changefeed.ring_size(),
            "finished_transactions": len(self.transactions.finished),
        }

    def _info_cleanup(self, s: Stats, last_gc: dict | None) -> dict:
        """info()'s "cleanup": passes, failures, files removed, the last pass in short."""
        return {
            "passes": s.cleanup_passes,
            "failures": s.cleanup_failures,
            "files_removed": s.cleanup_files_removed,
            "last_at": self.cleanup.last_gc_at,
            "last_error": self.cleanup.last_gc_error,
            "watermark": self.watermark.watermark,
            "last": None
            if last_gc is None
            else {
                k: (len(v) if isinstance(v, list) else v)
                for k, v in last_gc.items()
                if k in ("removed", "kept", "min_snapshot", "watermark", "young_orphans", "seconds")
            },
        }

    def _info_committer(self, s: Stats) -> dict | None:
        """info()'s "committer": commits, batches and conflicts; None on a replica without one."""
        if not s.has_committer:
            return None
        return {
            "commits": s.commits,
            "batches": s.commit_batches,  # one ZooKeeper multi each
            "wal_syncs": s.wal_syncs,  # fsyncs of the WAL (commits, staged parts, applied entries)
            "local_version_misses": s.local_version_misses,
            "failed": s.commit_failures,
            "conflicts": {k: n for k, n in s.conflicts.items() if n},
        }

    def stats(self) -> Stats:
        """The replica's counters now (memory only: answered on the RPC I/O thread and at scrape
        time alike)."""
        c = self.committer
        applied = self.state.applied
        lag_entries, lag_seconds = self.log_watch.lag(applied)
        return Stats(
            commits=c.committed if c else 0,
            commit_batches=c.batches if c else 0,
            commit_failures=c.stats.failed if c else 0,
            local_version_misses=c.local_misses if c else 0,
            conflicts=dict(c.stats.conflicts.copy()) if c else {},  # a copy: a new kind may come
            latency_counts=tuple(c.stats.latency_counts) if c else (),
            latency_sum=c.stats.latency_sum if c else 0.0,
            has_committer=c is not None,
            applied_csn=applied,
            log_end_csn=self.log_watch.end,
            log_entries=self.log_watch.entries,
            lag_entries=lag_entries,
            lag_seconds=lag_seconds,
            running_transactions=len(self.transactions.txns),
            wal_bytes=self.log_watch.wal_bytes,
            wal_syncs=self.wal.syncs if self.wal is not None else 0,
            cleanup_passes=self.cleanup.passes,
            cleanup_failures=self.cleanup.failures,
            cleanup_files_removed=self.cleanup.files_removed,
            merges=dict(self.merges.outcomes.copy()),
            aborted=dict(self.transactions.abort_counts()),
            inserts_held=self.transactions.held_back(),
            zk_state=str(self.zk.state),
            session_lost=self.zk_session.lost.is_set(),
            incarnation=self.incarnation,
        )
