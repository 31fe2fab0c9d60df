"""The code stays readable: no function of the product over 60 lines.

The group committer was once one 210-line attempt; its jobs now live apart (the queue and its
thread, the lost-answer resolution, the DDL commits, the pure batch composition, the one multi
builder), and every other long function was split along its jobs the same way. This measures
every function of every module of the product with ``ast`` (its first line to its last, its
docstring included) so that none grows back.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("coordinator", "parts", "replicas", "spark", "mergetxn")
PRODUCT = sorted(
    str(f.relative_to(ROOT)) for pkg in PACKAGES for f in (ROOT / pkg).rglob("*.py") if "__pycache__" not in f.parts
) + ["pyspark_mergetxn.py"]
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


def test_no_function_of_the_product_over_60_lines() -> None:
    over = {
        f"{module}:{name}": n
        for module in PRODUCT
        for name, n in lengths((ROOT / module).read_text()).items()
        if n > MAX_LINES
    }
    assert len(PRODUCT) > 100, "the list of modules is stale"
    assert not over, f"functions over {MAX_LINES} lines: {over}"


def test_the_measure_counts_lines() -> None:
    """The measure can fail: a 61-line function is found, a nested one named by its parent."""
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    found = lengths(f"class C:\n    def f(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n")
    assert found == {"C.f": 61}
    assert lengths("def g():\n    def h():\n        pass\n")["g.h"] == 2
