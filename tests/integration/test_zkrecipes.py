"""The compare-and-swap recipe (coordinator/zk/recipes.py) against a real ZooKeeper server, and
the one user of it here: raising the retained CSN in the checkpoint node."""

from __future__ import annotations

import threading

from kazoo.client import KazooClient

from coordinator.zk.recipes import cas_update


def test_cas_update_creates_changes_and_leaves_alone(zk_client: KazooClient) -> None:
    assert cas_update(zk_client, "/doc", lambda data: None) is None
    assert zk_client.exists("/doc") is None
    assert cas_update(zk_client, "/doc", lambda data: b"1" if data is None else None) == b"1"
    assert cas_update(zk_client, "/doc", lambda data: None) == b"1"
    assert cas_update(zk_client, "/doc", lambda data: data + b"2") == b"12"
    assert zk_client.get("/doc")[0] == b"12"


def test_concurrent_cas_updates_lose_nothing(zk_address: str) -> None:
    clients = []
    for _ in range(4):
        c = KazooClient(hosts=zk_address, command_retry={"max_tries": -1, "delay": 0.01, "max_delay": 0.1})
        c.start(timeout=30)
        clients.append(c)
    runs = []

    def add_one(data: bytes | None) -> bytes:
        runs.append(1)
        return str(int(data or b"0") + 1).encode()

    def work(zk: KazooClient) -> None:
        for _ in range(25):
            cas_update(zk, "/counter", add_one)

    try:
        threads = [threading.Thread(target=work, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert clients[0].get("/counter")[0] == b"100"
        assert len(runs) >= 100  # a step that lost the race ran again
    finally:
        for c in clients:
            c.stop()
            c.close()
