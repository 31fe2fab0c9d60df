"""What a replica process's memory holds, and giving the C heap's free pages back.

A replica allocates and frees all the time (log entries, part files read at stage time and by
merges, RPC frames), from many threads. glibc keeps what is freed for later allocations, and
over hours the free space scattered between live blocks grows: measured in a sustained load of
10-row inserts (benchmarks/soak.py), the heap held 16 MB in use and 6 MB free after 5,000
commits, 16 MB in use and 49 MB free after 40,000, the resident set growing with the free part
alone. Arrow's pool (mimalloc in pyarrow's wheels) keeps freed pages too: 35 MB resident in its
reserved gigabyte while it held no allocation. :func:`trim` returns both to the system (glibc's
``malloc_trim``, Arrow's ``release_unused``); the replica calls it every :data:`TRIM_SECONDS`
from its reaper thread. Trimming gives back whole free pages only; holes smaller than a page
between live blocks stay, and they grew across glibc's many heaps (8 per core, one taken by each
thread that finds the others busy) as large buffers were carved from them: :func:`tune` keeps a
replica to :data:`ARENAS` heaps and maps every block of :data:`MMAP_THRESHOLD` or more on its
own. :func:`memory` is ``info()["memory"]``; :func:`no_gc` pauses the cyclic collector while a
restore builds many long-lived objects.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

#: glibc's heaps for a replica's threads (``M_ARENA_MAX``; its default is 8 per core), and the size
#: from which a block is mapped on its own and unmapped when freed (``M_MMAP_THRESHOLD``; glibc's
#: default starts there but rises with each large block freed, after which large dict and bytes
#: buffers are carved from the heaps and leave holes as they are resized and freed).
ARENAS = 2
MMAP_THRESHOLD = 128 << 10
_M_MMAP_THRESHOLD, _M_ARENA_MAX = -3, -8

#: Seconds between two trims of the C heap (each walks the heap: about a millisecond per 10 MB free).
TRIM_SECONDS = 30.0


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


@cache
def _libc() -> ctypes.CDLL | None:
    """glibc, with ``mallinfo2`` and ``malloc_trim`` typed; None on another C library."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.mallopt.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def memory() -> dict:
    """The resident set, Python's allocated blocks, the bytes Arrow's pool holds, the threads, and
    the C heap's bytes in use and free (fragmentation shows as free growing while in use stays)."""
    import pyarrow as pa

    pool = pa.default_memory_pool()
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    out = {
        "rss_bytes": rss,
        "python_blocks": sys.getallocatedblocks(),
        "arrow_bytes": pool.bytes_allocated(),
        "arrow_backend": pool.backend_name,
        "threads": threading.active_count(),
    }
    libc = _libc()
    if libc is not None:
        m = libc.mallinfo2()
        out |= {"heap_in_use_bytes": m.uordblks, "heap_free_bytes": m.fordblks, "heap_mmapped_bytes": m.hblkhd}
    return out


def tune() -> None:
    """Set glibc's heaps for a long-running process (:data:`ARENAS`, :data:`MMAP_THRESHOLD`);
    called first thing in a replica's ``main``, before its threads start. Nothing without glibc."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(_M_ARENA_MAX, ARENAS)
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def trim() -> bool:
    """Give the free pages of Arrow's pool and of the C heap (every arena's, not only its top) back
    to the system; whether the C heap gave any back (without glibc only Arrow's pool is trimmed)."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    libc = _libc()
    return bool(libc is not None and libc.malloc_trim(0))


@contextmanager
def no_gc() -> Iterator[None]:
    """Building 100,000s of small containers triggers the cyclic GC over and over (2-4x the
    time); none of them form cycles, so it is held off meanwhile."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
