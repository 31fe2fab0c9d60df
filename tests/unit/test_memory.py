"""replicas/memory.py: what ``info()["memory"]`` reports, and that a trim gives freed pages back."""

from __future__ import annotations

import pytest

from replicas import memory


def _rss() -> int:
    return memory.memory()["rss_bytes"]


def test_memory_reports_the_process_and_its_allocators():
    m = memory.memory()
    assert m["rss_bytes"] > 0 and m["python_blocks"] > 0 and m["threads"] >= 1
    assert m["arrow_bytes"] >= 0 and isinstance(m["arrow_backend"], str)
    if memory._libc() is not None:
        assert m["heap_in_use_bytes"] > 0 and m["heap_free_bytes"] >= 0


@pytest.mark.skipif(memory._libc() is None, reason="malloc_trim is glibc's")
def test_trim_gives_the_free_pages_between_live_blocks_back():
    """Freed blocks between live ones stay resident until trimmed (what grew a replica's RSS)."""
    memory.trim()
    blocks = [bytearray(20_000) for _ in range(5_000)]  # 100 MB in the C heap (under mmap's threshold)
    del blocks[::2]  # 50 MB freed between the 50 MB still live: no top of the heap to shrink
    before = _rss()
    assert memory.trim() is True
    assert before - _rss() > 20 << 20
    assert len(blocks) == 2_500  # still live: only free pages went
