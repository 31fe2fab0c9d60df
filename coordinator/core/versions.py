"""Transaction ids and commit sequence numbers: pure arithmetic, no I/O.

A CSN comes from a sequential znode ``/log/e-<epoch>/c-<seq>``. ZooKeeper's sequence counter is
a signed 32-bit number, so one parent could hand out only 2**31 numbers. The log is therefore cut
into epochs: once an epoch holds ``epoch_size`` entries it is sealed and the next epoch starts at
sequence 0. The CSN is ``epoch * EPOCH_STRIDE + seq``, a 64-bit number that grows monotonically
across epochs. The stride is 2**31 (larger than any sequence number ZooKeeper can give), so
racing committers that overshoot ``epoch_size`` in an epoch before it is sealed still get CSNs
below every CSN of the next epoch.

A tid is ``(start_csn, local_counter, host_id)``. ``local_counter`` is
``incarnation * COUNTER_STRIDE + n``: the incarnation is bumped in ZooKeeper each time a replica
starts, so counters never repeat across restarts even when the local disk is lost.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from coordinator.core.errors import quote

EPOCH_STRIDE = 2**31
COUNTER_STRIDE = 2**32
DEFAULT_EPOCH_SIZE = 1_000_000
NO_CSN = 0  # the snapshot of an empty log: nothing is visible at it

_HOST_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_TID_RE = re.compile(r"^T(\d+)-(\d+)-([A-Za-z0-9_.-]{1,64})$")
_SEQ_NODE_RE = re.compile(r"^c-(\d{10})$")


class Tid(NamedTuple):
    """Transaction id (docs/rules.md#vocabulary): the snapshot at BEGIN, a per-replica counter, the replica."""

    start_csn: int
    local_counter: int
    host_id: str

    def __str__(self) -> str:
        return f"T{self.start_csn}-{self.local_counter}-{self.host_id}"

    @classmethod
    def parse(cls, text: str) -> Tid:
        """Parse ``str(tid)``; raises ValueError naming the bad text."""
        m = _TID_RE.fullmatch(text or "")
        if not m:
            raise ValueError(f"not a transaction id: {quote(text)} (expected T<start_csn>-<counter>-<host>)")
        return cls(int(m.group(1)), int(m.group(2)), m.group(3))


def check_host_id(host_id: str) -> str:
    """A host id names ZooKeeper nodes (``replicas/<host>``): "." and ".." would name others."""
    if not isinstance(host_id, str) or not _HOST_RE.fullmatch(host_id) or host_id in (".", ".."):
        raise ValueError(
            f"host id {quote(host_id)} must be 1-64 characters of letters, digits, '_', '.', '-' (not '.' or '..')"
        )
    return host_id


def local_counter(incarnation: int, n: int) -> int:
    if not 0 <= n < COUNTER_STRIDE:
        raise OverflowError("local transaction counter exhausted for this incarnation")
    return incarnation * COUNTER_STRIDE + n


def incarnation_of(tid: Tid) -> int:
    """The incarnation of its replica that began ``tid`` (the owner node's version then)."""
    return tid.local_counter // COUNTER_STRIDE


def csn_of(epoch: int, seq: int) -> int:
    """CSN of sequence number ``seq`` in ``epoch``. CSNs start at 1 so that 0 means 'nothing'."""
    if epoch < 0 or not 0 <= seq < EPOCH_STRIDE:
        raise ValueError(f"bad epoch/sequence {epoch}/{seq}")
    return epoch * EPOCH_STRIDE + seq + 1


def split_csn(csn: int) -> tuple[int, int]:
    """Inverse of :func:`csn_of`: ``(epoch, seq)``."""
    if csn < 1:
        raise ValueError(f"CSN {csn} names no log entry")
    return divmod(csn - 1, EPOCH_STRIDE)


def seq_of_node(name: str) -> int:
    """Sequence number of a log znode name such as ``c-0000000042``."""
    m = _SEQ_NODE_RE.fullmatch(name)
    if not m:
        raise ValueError(f"not a log entry node: {quote(name)}")
    return int(m.group(1))


def epoch_full(seq: int, epoch_size: int) -> bool:
    """Whether an entry at ``seq`` fills its epoch, so that the epoch must be sealed."""
    return seq + 1 >= epoch_size
