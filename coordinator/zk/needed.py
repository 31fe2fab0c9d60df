"""The nodes a replica cannot work without, and what to say when one is gone.

ZooKeeper nodes only the replicas' identity may delete can still go: an operator's mistake (a
``deleteall`` in zkCli), or, before a secured ZooKeeper required a certificate of the cluster
CA, anyone's ``deleteContainer`` (ZooKeeper 3.9.4 checks no ACL for it). Each missing node
breaks something that would otherwise fail with a message about something else, so replicas
watch them (:class:`NeededNodes`: ``/ready``, ``info``, the replica's log, the login refusal)
and ``mergetxn status`` looks at them (:func:`find_missing`), both naming the node, what it
breaks and what to do:

* ``<root>/fence`` (the orphan fence, coordinator/zk/orphan_fence.py): every commit checks its
  version, so every commit fails while it is gone. A replica's start makes it again (empty).
* ``<root>/users`` (a secured cluster's users, replicas/users.py): no user can log in while it is
  gone (the replicas' identity still can). A replica's start stores the first admin again (from
  the replicas' credentials file); the other users must be added again.
* ``<root>/log`` and the committed entries in it (coordinator/zk/log.py): a deleted entry is a
  hole no replica skips (replicas/follower.py); one that has not applied it stops there.
"""

from __future__ import annotations

import logging
import threading
from functools import partial

from kazoo.client import KazooClient

from coordinator.zk.log import CsnLog, given_out
from coordinator.zk.orphan_fence import FENCE, missing_message

log = logging.getLogger(__name__)


def needed_paths(layout: CsnLog, secured: bool) -> dict[str, str]:
    """The watched nodes of a cluster: path -> what is said when it is missing."""
    out = {
        layout.fence_path(): FENCE,
        layout.log_path(): (
            "the log of every commit: no commit can be made or read; restore the tables from their "
            "backups (mergetxn restore) on a new root"
        ),
    }
    if secured:
        out[layout.users_path()] = (
            "the users: no user can log in (the replicas' identity still can); restart one replica "
            "with the cluster's credentials (its start stores the first admin again, from the "
            "replicas' credentials file), then add the other users again (mergetxn security add-user)"
        )
    return out


def hole_message(epoch_path: str, lost: int) -> str:
    return (
        f"log epoch {epoch_path} lost {lost} committed entr{'y' if lost == 1 else 'ies'} (deleted from "
        "ZooKeeper): replicas that applied them keep them, one that has not stops at the first hole; "
        "restore the tables from their backups (mergetxn restore) to start new replicas"
    )


def log_holes(zk: KazooClient, layout: CsnLog) -> list[str]:
    """What every log epoch still in ZooKeeper lost: entries it gave out that are gone (an epoch
    is trimmed whole, never entry by entry, so any difference is a deletion)."""
    try:
        trimmed = layout.trimmed_epoch()
    except Exception:  # noqa: BLE001 - a checkpoint node that does not parse is reported elsewhere
        trimmed = -1
    out = []
    for epoch in layout.epochs():
        stat = zk.exists(layout.epoch_path(epoch))
        if stat is None or epoch <= trimmed:
            continue
        lost = given_out(stat) - stat.numChildren
        if lost > 0:
            out.append(hole_message(layout.epoch_path(epoch), lost))
    return out


def find_missing(zk: KazooClient, layout: CsnLog, secured: bool) -> list[str]:
    """Every needed node missing now, and every hole in the log (``mergetxn status``)."""
    out = [missing_message(p, what) for p, what in needed_paths(layout, secured).items() if zk.exists(p) is None]
    if zk.exists(layout.log_path()) is not None:
        out += log_holes(zk, layout)
    return out


class NeededNodes:
    """A replica's watch on its needed nodes (:func:`needed_paths`): :meth:`missing` says which
    are gone now (memory only: ``/ready`` and ``info`` read it), and each going and coming back
    is logged."""

    def __init__(self, zk: KazooClient, layout: CsnLog, secured: bool) -> None:
        self.zk = zk
        self.paths = needed_paths(layout, secured)
        self._missing: dict[str, str] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        """Watch every needed node (after the replica's start made those it makes)."""
        for path in self.paths:
            self.zk.DataWatch(path, partial(self._on_change, path))

    def _on_change(self, path: str, data: bytes | None, stat: object) -> None:
        with self._lock:
            was = path in self._missing
            if stat is None:
                self._missing[path] = missing_message(path, self.paths[path])
            else:
                self._missing.pop(path, None)
        if stat is None and not was:
            log.error("%s", missing_message(path, self.paths[path]))
        elif stat is not None and was:
            log.warning("ZooKeeper node %s is back", path)

    def missing(self) -> list[str]:
        """What is missing now, one sentence per node."""
        with self._lock:
            return list(self._missing.values())

    def is_missing(self, path: str) -> bool:
        return path in self._missing
