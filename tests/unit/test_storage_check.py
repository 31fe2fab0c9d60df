"""The storage check against a cleanup pass that runs while it checks (replicas/storage_check.py).

A pass raises the ``gc`` node, then deletes: a removed part whose file the check finds missing
may have been collected since the check read the node, so the node is read again before the
part is reported (an S3 chaos campaign's final check reported parts a concurrent pass had just
collected as missing, and failed the run)."""

from __future__ import annotations

from pathlib import Path

from support.builders import change, entry, part, table_def, tid  # tests/ is on sys.path

from coordinator.core.conflicts import Kind
from coordinator.model.znodes import Marks
from parts.io.storage import Storage
from replicas.state import ReplicaState
from replicas.storage_check import check_tables

A, B = tid(1), tid(2)


def _state() -> ReplicaState:
    """t: a1 added at CSN 2 (time 2.0), removed by b1's overwrite at CSN 3 (time 3.0)."""
    st = ReplicaState()
    st.apply(1, 0, 0, entry(ddl=[table_def("t")], versions={"t": 0}))
    st.apply(2, 0, 1, entry((A, [change("t", (1,), [Kind.INSERT], added=[part("a1", partition=(1,))])]), time=2.0))
    b1 = part("b1", partition=(1,))
    st.apply(3, 0, 2, entry((B, [change("t", (1,), [Kind.OVERWRITE], added=[b1], removed=["a1"])]), time=3.0))
    return st


def _storage(tmp_path: Path, *names: str) -> Storage:
    (tmp_path / "t").mkdir(exist_ok=True)
    for n in names:
        (tmp_path / "t" / f"{n}.parquet").write_bytes(b"x" * 10)  # the builders' parts have 10 bytes
    return Storage(str(tmp_path))


NEEDED = Marks()  # nothing collected: a1 is still needed
GONE = Marks(watermark=3, collected=0, horizons={"t": 3.0})  # a pass collected what CSN 3 removed


def _problems(result: dict) -> list[str]:
    return [p["part"] for t in result["tables"] for p in t["problems"]]


def test_a_removed_part_collected_while_the_check_ran_is_not_reported(tmp_path: Path) -> None:
    asked: list[int] = []

    def refresh() -> Marks:
        asked.append(1)
        return GONE

    result = check_tables(_state(), _storage(tmp_path, "b1"), NEEDED, ["t"], checksums=False, refresh=refresh)
    assert _problems(result) == [] and result["ok"] and asked == [1]


def test_a_removed_part_still_needed_by_the_node_read_again_is_reported(tmp_path: Path) -> None:
    result = check_tables(_state(), _storage(tmp_path, "b1"), NEEDED, ["t"], checksums=False, refresh=lambda: NEEDED)
    assert _problems(result) == ["a1"] and not result["ok"]


def test_a_visible_part_missing_is_reported_whatever_the_node_says(tmp_path: Path) -> None:
    result = check_tables(_state(), _storage(tmp_path, "a1"), NEEDED, ["t"], checksums=False, refresh=lambda: GONE)
    assert _problems(result) == ["b1"]


def test_without_a_refresh_the_first_reading_decides(tmp_path: Path) -> None:
    assert _problems(check_tables(_state(), _storage(tmp_path, "b1"), NEEDED, ["t"], checksums=False)) == ["a1"]
    assert _problems(check_tables(_state(), _storage(tmp_path, "b1"), GONE, ["t"], checksums=False)) == []
