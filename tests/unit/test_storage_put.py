"""A fresh file's put fsyncs the file and its directory at once, the directory on a pool thread
(parts/io/storage.py ``_dir_syncs``): a process forked after its parent used that pool must put
files too (its copy of the pool has no threads; it makes its own)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from parts.io.storage import Storage


def test_fresh_puts_are_whole_and_never_overwrite(tmp_path: Path) -> None:
    st = Storage(str(tmp_path / "store"))
    for i in range(20):
        st.put(f"t/p={i % 3}/x{i}.parquet", b"%d" % i * 100, fresh=True)
    assert [st.get(f"t/p={i % 3}/x{i}.parquet") for i in range(20)] == [b"%d" % i * 100 for i in range(20)]
    try:
        st.put("t/p=0/x0.parquet", b"other", fresh=True)
    except Exception as exc:
        assert type(exc).__name__ == "StorageError", exc
    else:
        raise AssertionError("a fresh put overwrote a file")
    assert st.get("t/p=0/x0.parquet") == b"0" * 100


def test_a_forked_child_puts_fresh_files_after_its_parent_did(tmp_path: Path) -> None:
    st = Storage(str(tmp_path / "store"))
    st.put("t/_/a.parquet", b"parent", fresh=True)  # the parent's pool has a thread now
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            st.put("t/_/b.parquet", b"child", fresh=True)
        except BaseException:
            os._exit(1)
        os._exit(0)
    deadline = time.monotonic() + 20
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise AssertionError("the forked child's put hung (waiting for a pool thread that is not in it)")
    assert status == 0
    assert st.get("t/_/b.parquet") == b"child"
