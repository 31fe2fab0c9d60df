"""The outcome window on real replicas (docs/rules.md#outcomes): with a short
``outcome_seconds``, thousands of commits later ``tid -> csn`` and the local checkpoint hold the
window only; ``commit_status`` of a forgotten transaction says that it is too old to know (never
aborted), one whose part is still recorded answers committed with its CSN, an app version
committed before the trim is still refused as a duplicate, and a replica killed and started
again after the trim recovers with the same reads and answers. Counts, not times: the window is
1 s, the commits take several.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.cluster import make_cluster  # tests/ is on sys.path
from support.data import ID_V, id_rows, ids

from coordinator.core.versions import COUNTER_STRIDE, Tid
from coordinator.errors import DuplicateCommit
from mergetxn.client import Client
from mergetxn.local.cluster import LocalCluster
from mergetxn.local.zkserver import ZooKeeperServer
from replicas.checkpoint import LOCAL_NAME, read_local

WINDOW = 1.0
COMMITS = 2000
BOUND = COMMITS // 2  # the window's commits: far fewer than were made (they take several windows)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator[LocalCluster]:
    with make_cluster(
        tmp_path_factory,
        zk_server,
        "outcomes",
        replicas=2,
        # merges off and thousands of inserts into one partition: no insert backpressure either
        settings={
            "outcome_seconds": WINDOW,
            "local_checkpoint_every": 500,
            "merge_interval": 0,
            "gc_interval": 0,
            "parts_to_delay_insert": 0,
            "parts_to_throw_insert": 0,
        },
    ) as c:
        yield c


def outcomes_of(c: Client) -> dict:
    return c.call("info")["outcomes"]


@pytest.mark.slow
def test_outcomes_beyond_the_window_are_forgotten_and_told_so(cluster: LocalCluster) -> None:
    c0, c1 = cluster.client(0), cluster.client(1)
    c0.create_table("t", ID_V, auto_merge=False)
    # On replica 1, which then restarts (its memory of the transactions that ended there goes):
    # A commits only an app version (no part names it), B an insert (its part stays), D is begun
    # and never ends.
    with c1.transaction() as a:
        a.set_app_version("sink", 1)
    with c1.transaction() as b:
        b.insert("t", id_rows(2, 1))
    d_id = c1.begin().id
    cluster.kill_replica(1)
    cluster.start_replica(1)
    c1 = cluster.client(1)

    last = 0
    for i in range(COMMITS):
        last = c0.insert("t", id_rows(1, 100 + i))
    c1.read("t", snapshot=last)  # (waits until replica 1 applied every commit)
    seen = [outcomes_of(c) for c in (c0, c1)]
    assert all(0 < o["remembered"] <= BOUND and o["floor"] > b.csn for o in seen), seen

    # The local checkpoint carries the window only, with its floor.
    ckpt = read_local(cluster.replica_dir(0) / LOCAL_NAME)
    assert ckpt is not None and 0 < len(ckpt["tids"]) <= BOUND and ckpt["outcome_floor"] > b.csn
    assert max(ckpt["outcome_times"]) - min(ckpt["outcome_times"]) <= WINDOW + 0.5

    for c in (c0, c1):
        forgotten = c.commit_status(a.id)
        assert forgotten.status == "unknown" and forgotten.csn is None, forgotten
        assert "too old to know" in forgotten.reason and "outcome_seconds" in forgotten.reason
        assert (c.commit_status(b.id).status, c.commit_status(b.id).csn) == ("committed", b.csn)
        never = c.commit_status(d_id)
        assert never.status == "unknown", never  # it may have committed below the window: not "aborted"
        # Above the floor the log's silence still tells: a tid replica 1 never began, and one of
        # a host that never registered (no commit of it can ever have happened), are aborted.
        unused = Tid(last, c1.call("info")["incarnation"] * COUNTER_STRIDE + COUNTER_STRIDE - 1, "r1")
        assert c.commit_status(unused).status == "aborted"
        assert c.commit_status(Tid(1, 0, "nosuchhost")).status == "aborted"
    # The app version is state, not an outcome: still refused as a duplicate after the trim.
    with pytest.raises(DuplicateCommit) as e:
        with c1.transaction() as again:
            again.set_app_version("sink", 1)
            again.insert("t", id_rows(1, -1))
    assert (e.value.app_id, e.value.version, e.value.csn) == ("sink", 1, a.csn)
    assert c0.app_version("sink") == 1

    # Killed and started again after the trim: the same reads and answers.
    before = sorted(ids(c0.read("t")))
    assert len(before) == COMMITS + 2 and -1 not in before
    cluster.kill_replica(0)
    cluster.start_replica(0)
    c0 = cluster.client(0)
    assert sorted(ids(c0.read("t"))) == sorted(ids(c1.read("t"))) == before
    assert c0.commit_status(a.id).status == "unknown"
    assert (c0.commit_status(b.id).status, c0.commit_status(b.id).csn) == ("committed", b.csn)
    assert 0 < outcomes_of(c0)["remembered"] <= BOUND
    with pytest.raises(DuplicateCommit):
        with c0.transaction() as again:
            again.set_app_version("sink", 1)
    c0.close()
    c1.close()
