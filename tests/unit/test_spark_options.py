"""The data source's option names (spark/options.py): an unknown one is refused naming the
known ones, whatever its case, while Spark's own keys pass; and every name the data source reads
anywhere is a known one (an option added to a reader but not to ``OPTIONS`` would be refused)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from coordinator.errors import InvalidInput
from spark.options import OPTIONS, SPARK_OPTIONS, settings

SPARK = Path(__file__).resolve().parents[2] / "spark"
READ = re.compile(r"""\b(?:option|int_option|time_option)\(\s*\w+,\s*["']([A-Za-z_]+)["']""")


def test_every_option_read_is_known() -> None:
    read = {m.group(1).lower() for f in SPARK.glob("*.py") for m in READ.finditer(f.read_text())}
    assert {"path", "replica", "snapshot", "txn", "failpoints"} <= read  # the pattern finds them
    assert read <= OPTIONS | SPARK_OPTIONS, read - OPTIONS - SPARK_OPTIONS


@pytest.mark.parametrize("name", ["snapshott", "Snapshott", "rows_per_prat", "header"])
def test_an_unknown_option_is_refused_naming_the_known_ones(name: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        settings({"path": "t", "replica": "h:1", name: "1"})
    assert f"unknown option {name.lower()!r}" in caught.value.message
    assert "snapshot, split_bytes" in caught.value.message  # the known ones, sorted


def test_spark_keys_pass() -> None:
    """What Spark puts among the options itself (probed: a CREATE TABLE's catalog keys and its
    options again as option.<name>, a stream's checkpoint, load()'s paths)."""
    given = {
        "path": "t",
        "replica": "h:1",
        "snapshot": "3",
        "location": "t",
        "provider": "mergetxn",
        "owner": "someone",
        "option.snapshot": "3",
        "checkpointlocation": "/tmp/c",
        "paths": "[]",
    }
    assert settings(given).snapshot == 3
