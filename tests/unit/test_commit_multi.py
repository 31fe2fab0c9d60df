"""The commit multi's requests (coordinator/zk/log.py ``CsnLog.multi``) are built without kazoo's
per-op path normalisation: they must equal, op for op, what kazoo's own ``TransactionRequest``
methods build from the same paths, with and without a chroot and a default ACL. Real
``KazooClient`` objects, never connected (building a request sends nothing)."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient
from kazoo.security import make_digest_acl

from coordinator.core.readsets import counter_key
from coordinator.core.targets import app_key, target_key
from coordinator.model.znodes import TARGET_BODY
from coordinator.zk.log import CsnLog, Multi

ENTRY = b'{"entry": 1}'


def through_kazoo(log: CsnLog, m: Multi, epoch: int) -> list:
    """The same multi built through kazoo's public per-op methods (each normalises its path)."""
    t = log.zk.transaction()
    if m.owner is not None:
        t.check(m.owner[0], m.owner[1])
    if m.fence is not None:
        t.check(log.fence_path(), m.fence)
    for name, (version, data) in sorted(m.tables.items()):
        if data is None:
            t.check(log.table_path(name), version)
        elif version is None:
            t.create(log.table_path(name), data)
        else:
            t.set_data(log.table_path(name), data, version=version)
    for key, version in sorted(m.targets.items()):
        if version is None:
            t.create(log.target_path(key), TARGET_BODY)
        else:
            t.set_data(log.target_path(key), TARGET_BODY, version=version)
    for key, version in sorted(m.counters[0].items()):
        t.check(log.target_path(key), version)
    for key in sorted(set(m.counters[1])):
        t.set_data(log.target_path(key), TARGET_BODY, version=-1)
    t.check(log.epoch_path(epoch), 0)
    t.create(f"{log.epoch_path(epoch)}/c-", ENTRY, sequence=True)
    return t.operations


MULTIS = [
    # a data commit: owner, fence, a table check, targets created and bumped, counters
    Multi(
        owner=("/mergetxn/replicas/r-0", 3),
        fence=7,
        tables={"orders": (4, None), "b_t": (0, None)},
        targets={
            target_key("orders", '["2026-11-27",3]'): 5,
            target_key("orders", '["a b/c..%"]'): None,
            "orders": 9,
            app_key("app/with spaces"): None,
        },
        counters=({counter_key("b_t"): 2}, [counter_key("orders"), counter_key("orders")]),
    ),
    # DDL: a table node created, another set, a target created
    Multi(tables={"new_t": (None, b"{}"), "old_t": (2, b'{"v":2}')}, targets={"new_t": None}),
    # the least: no owner, no fence, nothing but the entry
    Multi(),
]


@pytest.mark.parametrize("hosts", ["127.0.0.1:1", "127.0.0.1:1/chroot/deeper", "127.0.0.1:1/one/"])
@pytest.mark.parametrize("root", ["/mergetxn", "/mergetxn/", "tenant_a", "/a//b/"])
@pytest.mark.parametrize("acl", [None, [make_digest_acl("u", "p", all=True)]])
@pytest.mark.parametrize("m", MULTIS)
def test_the_multi_equals_kazoos_own_requests(hosts: str, root: str, acl: list | None, m: Multi) -> None:
    zk = KazooClient(hosts=hosts, default_acl=acl)
    log = CsnLog(zk, root=root)
    built = log.multi(m, 12, ENTRY).operations
    assert built == through_kazoo(log, m, 12)
    assert len(built) >= 2 and built[-1].flags == 2  # the entry is a sequential node


def test_a_log_without_a_client_still_names_its_paths() -> None:
    """The chaos harness builds one for its paths alone (mergetxn/chaos/hosts.py)."""
    log = CsnLog(None, "/mergetxn/")  # type: ignore[arg-type]
    assert log.alive_path("r1") == "/mergetxn/replicas/r1/alive"
    assert log.target_path("t@writes") == "/mergetxn/targets/t@writes"
