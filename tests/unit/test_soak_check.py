"""benchmarks/soak.py --check (in .ci/run): history growth fails it, a bounded structure moving
between levels does not."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import soak  # noqa: E402


def test_a_structure_kept_by_history_grows():
    assert soak.grows([9_000 + 3_000 * i for i in range(8)])  # one entry per commit, 9,000 -> 30,000


def test_a_bounded_structure_moving_between_levels_does_not():
    # part records of a CI run: the window's floor came later for three samples
    assert not soak.grows([3271, 3163, 3188, 3195, 5813, 5743, 5240])
    assert not soak.grows([0, 212903, 212903, 212903, 336517, 336517, 336517])  # the checkpoint, once written
    assert not soak.grows([5000, 5200, 4900, 5100, 5050, 4800, 5300])


def test_a_checkpoint_first_written_late_is_not_growth():
    # a CI run's checkpoint bytes: none written before 18,000 commits, then one of a steady size
    assert not soak.grows([0, 0, 308460, 308460, 308460, 308460, 308460])
    assert not soak.grows([0, 0, 0])
    assert soak.grows([0, 0, 3_000, 6_000, 9_000, 12_000, 15_000])  # growth after the first appearance still fails


def test_storage_counts_what_lies_beyond_the_live_rows() -> None:
    # a 1,000,000-commit run: storage 5 -> 24 MB as the inserts' live rows grew 2 -> 22 MB, while
    # what lay beyond them (removed parts in the window, checkpoints) stayed 2-3 MB
    samples = [
        {
            "storage_bytes": live + 2_500_000,
            "live_bytes": live,
            "zk_nodes": 5_000,
            "removed_held": 2_000,
            "replicas": [{"structures": {}, "checkpoint_bytes": 500_000, "local_checkpoint_bytes": 0}],
        }
        for live in range(2_000_000, 22_000_001, 1_000_000)
    ]
    assert soak.series(samples)["storage_beyond_live"] == [2_500_000] * len(samples)
    assert not soak.check({"samples": samples, "targets": {"visible_per_partition_max": 10}}, 0, 0, 0)
