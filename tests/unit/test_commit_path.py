"""The commit path stays readable: no function of it over 60 lines (issue 23).

The group committer was once one 210-line attempt; its jobs now live apart (the queue and its
thread, the lost-answer resolution, the DDL commits, the pure batch composition, the one multi
builder). This measures every function of those modules with ``ast`` (its first line to its
last, its docstring included) so that none grows back.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMIT_PATH = [
    "replicas/committer.py",
    "replicas/commit_queue.py",
    "replicas/commit_outcome.py",
    "replicas/table_changes.py",
    "coordinator/core/batching.py",
    "coordinator/zk/log.py",
]
MAX_LINES = 60


def lengths(source: str) -> dict[str, int]:
    """Each function's (qualified by its class, if any) length in lines."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                assert child.end_lineno is not None
                out[prefix + child.name] = child.end_lineno - child.lineno + 1
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(source), "")
    return out


@pytest.mark.parametrize("module", COMMIT_PATH)
def test_no_function_of_the_commit_path_over_60_lines(module: str) -> None:
    found = lengths((ROOT / module).read_text())
    assert found, f"{module} has no functions: the list is stale"
    over = {name: n for name, n in found.items() if n > MAX_LINES}
    assert not over, f"{module}: functions over {MAX_LINES} lines: {over}"


def test_the_measure_counts_lines() -> None:
    """The measure can fail: a 61-line function is found, a nested one named by its parent."""
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    found = lengths(f"class C:\n    def f(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n")
    assert found == {"C.f": 61}
    assert lengths("def g():\n    def h():\n        pass\n")["g.h"] == 2
