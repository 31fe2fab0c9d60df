"""The compare-and-swap recipe (coordinator/zkrecipes.py) against a real ZooKeeper server, and
the one user of it here: raising the retained CSN in the checkpoint node."""

from __future__ import annotations

import json
import threading

import pytest
from kazoo.client import KazooClient

from coordinator.checkpoint import raise_retained
from coordinator.errors import CorruptMetadata
from coordinator.zklog import CsnLog
from coordinator.zkrecipes import cas_update


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


def test_raise_retained_only_raises(zk_client: KazooClient) -> None:
    log = CsnLog(zk_client, "/mergetxn")
    zk_client.ensure_path("/mergetxn")
    raise_retained(log, 7)
    tail, _ = log.read_tail()
    assert tail == {"csn": 0, "path": "", "trimmed_epoch": -1, "retained": 7}
    zk_client.set(log.tail_path(), json.dumps({**tail, "csn": 9, "path": "_checkpoints/9.ckpt"}).encode())
    raise_retained(log, 5)
    assert log.read_tail()[0]["retained"] == 7
    raise_retained(log, 12)
    assert log.read_tail()[0] == {"csn": 9, "path": "_checkpoints/9.ckpt", "trimmed_epoch": -1, "retained": 12}
    zk_client.set(log.tail_path(), b"{not json")
    with pytest.raises(CorruptMetadata, match="does not parse"):
        raise_retained(log, 20)
