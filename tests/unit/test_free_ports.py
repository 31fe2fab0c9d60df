"""``free_ports``: distinct ports a server can bind later, outside the kernel's ephemeral range
(where a listener on port 0 or an outgoing connection could take one meanwhile)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from mergetxn.local import zkserver
from mergetxn.local.zkserver import ephemeral_range, free_ports


def test_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    low, high = ephemeral_range()
    ports = free_ports(12)
    assert len(set(ports)) == 12
    assert all(not low <= p <= high for p in ports), (ports, low, high)
    for p in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((zkserver.LOCALHOST, p))


def test_a_port_in_use_is_never_given(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With the range outside the ephemeral one narrowed to two ports, one of them held by a
    listener: the other is given, then the kernel's own picks."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        try:
            held.bind((zkserver.LOCALHOST, 20000))
        except OSError:
            pytest.skip("port 20000 is taken on this machine")
        held.listen()
        f = tmp_path / "range"
        f.write_text("20002\t65535\n")  # outside it: 20000 and 20001 only
        monkeypatch.setattr(zkserver, "EPHEMERAL_RANGE_FILE", f)
        assert ephemeral_range() == (20002, 65535)
        ports = free_ports(3)
        assert 20000 not in ports and len(set(ports)) == 3
        assert 20001 in ports or not _bindable(20001)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((zkserver.LOCALHOST, port))
        except OSError:
            return False
    return True


def test_an_unreadable_range_falls_back_to_linux_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(zkserver, "EPHEMERAL_RANGE_FILE", tmp_path / "missing")
    assert ephemeral_range() == (32768, 60999)
    (tmp_path / "bad").write_text("not numbers")
    monkeypatch.setattr(zkserver, "EPHEMERAL_RANGE_FILE", tmp_path / "bad")
    assert ephemeral_range() == (32768, 60999)
