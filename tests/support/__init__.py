"""What several test modules share: a cluster per module (:mod:`support.cluster`), ZooKeeper
corners and clients (:mod:`support.zk`), tables to write and read back (:mod:`support.data`),
bounded waits (:mod:`support.waiting`), and pure values (parts, changes, log entries, staged
operations) for unit tests (:mod:`support.builders`).

``tests/`` is on ``sys.path`` (pytest puts the rootdir conftest's folder there), so test modules
import these as ``from support.cluster import make_cluster``. Fixtures that every module may
ask for by name live in ``tests/conftest.py``; a fixture whose parameters belong to one module
stays in that module, as a one-line use of these helpers.
"""
