"""What a replica's parts need to know of its ZooKeeper session: whether it is usable now, and
whether the replica stops.

The replica's connection listener sets these (replicas/replica.py, ``_on_zk_state``); the
transaction registry, the committer, the pause guard, the metrics and the maintenance threads
read them, constructed with this object rather than with the whole replica.
"""

from __future__ import annotations

import threading


class ZkSession:
    """The replica's ZooKeeper session as its satellites see it (``replica.zk_session``)."""

    def __init__(self) -> None:
        self.connected = threading.Event()  # set while the session is usable (not SUSPENDED/LOST)
        self.lost = threading.Event()  # from a LOST session until the new one is registered
        self.stop = threading.Event()  # the replica is stopping: its threads end

    def usable(self) -> bool:
        """Connected, on a session that was not lost (or is registered again since)."""
        return self.connected.is_set() and not self.lost.is_set()

    def wait_usable(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for a connection; whether the session is usable then (False
        at once while a lost session is not registered again)."""
        return self.connected.wait(timeout) and not self.lost.is_set()
