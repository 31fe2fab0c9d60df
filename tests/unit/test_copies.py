"""The code folders do not copy themselves: the pairs of repeated blocks stay counted.

``duplicates`` (the developers' tool: pairs of places sharing six or more lines, the same or of
the same shape) is run over the tree; the pairs with both places in the code folders are counted
and must be exactly :data:`MAX_PAIRS`, the ones docs/architecture/index.md lists under
"Deliberate likenesses" with their reasons. More fails (share the code instead, or list the new
pair there with its reason and raise the bound in review); fewer fails too (lower the bound and
strike the pair from the list), so the count cannot regrow. Where the tool is not installed the
test is skipped, saying so.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("coordinator", "parts", "replicas", "spark", "mergetxn")
MAX_PAIRS = 10
ROW = re.compile(r"^D\d+ (\S+?):\d+-\d+ ~ (\S+?):\d+-\d+")


def code_pairs(report: str) -> list[str]:
    """The rows of a ``duplicates`` report whose two places are both in the code folders."""
    rows = []
    for line in report.splitlines():
        m = ROW.match(line)
        if m and all(path.split("/", 1)[0] in PACKAGES for path in m.groups()):
            rows.append(line)
    return rows


def test_the_pairs_in_the_code_folders_are_counted() -> None:
    tool = shutil.which("duplicates")
    if tool is None:
        pytest.skip("the duplicates tool is not installed here")
    out = subprocess.run(
        [tool, "--repo", str(ROOT), "--most", "200", "--seconds", "120"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    ).stdout
    if any(line.startswith("incomplete:") for line in out.splitlines()):
        pytest.skip(f"duplicates did not read the whole tree: {out.splitlines()[-1]}")
    assert not re.search(r"^\(\+\d+ more pairs\)", out, re.M), "more than 200 pairs: the count would be cut"
    rows = code_pairs(out)
    listing = "\n  ".join(rows)
    assert len(rows) <= MAX_PAIRS, f"{len(rows)} pairs in the code folders, over {MAX_PAIRS}:\n  {listing}"
    assert len(rows) == MAX_PAIRS, (
        f"{len(rows)} pairs left: lower MAX_PAIRS from {MAX_PAIRS} to {len(rows)} and strike the gone ones "
        f"from docs/architecture/index.md:\n  {listing}"
    )


def test_only_pairs_inside_the_code_folders_count() -> None:
    report = (
        "3 pairs of places (9 files read)\n"
        "D1 replicas/a.py:1-9 ~ parts/b.py:4-12\n"
        "D2 replicas/a.py:1-9 ~ tests/unit/t.py:4-12 shape\n"
        "D3 mergetxn/cli/x.py:1-6 ~ mergetxn/cli/y.py:2-7 shape boilerplate (+1 more run)\n"
    )
    assert [r.split()[0] for r in code_pairs(report)] == ["D1", "D3"]
