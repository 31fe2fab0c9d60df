"""The code stays readable: no function of the product over 60 lines, no class over 600.

The group committer was once one 210-line attempt; its jobs now live apart (the queue and its
thread, the lost-answer resolution, the DDL commits, the pure batch composition, the one multi
builder), and every other long function was split along its jobs the same way. This measures
every function of every module of the product with ``ast`` (its first line to its last, its
docstring included) so that none grows back; and every class the same way, so that no class
gathers every job of its part again (``ReplicaState``, ``Transactions``, ``Replica`` and the
``Committer`` were split along their jobs into modules named after them).
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
MAX_CLASS_LINES = 600


def spans(source: str, kind: type[ast.AST] | tuple[type[ast.AST], ...]) -> dict[str, int]:
    """Each definition of ``kind``'s length in lines, named by the functions and classes it
    stands in (``C.f``, ``g.h``): one walk for functions and for classes."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if isinstance(child, kind):
                    assert child.end_lineno is not None
                    out[prefix + child.name] = child.end_lineno - child.lineno + 1
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(source), "")
    return out


def lengths(source: str) -> dict[str, int]:
    """Each function's (qualified by its class, if any) length in lines."""
    return spans(source, (ast.FunctionDef, ast.AsyncFunctionDef))


def class_lengths(source: str) -> dict[str, int]:
    """Each class's (qualified by its enclosing class, if any) length in lines."""
    return spans(source, ast.ClassDef)


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


def test_no_class_of_the_product_over_600_lines() -> None:
    over = {
        f"{module}:{name}": n
        for module in PRODUCT
        for name, n in class_lengths((ROOT / module).read_text()).items()
        if n > MAX_CLASS_LINES
    }
    assert not over, f"classes over {MAX_CLASS_LINES} lines (split them along their jobs): {over}"


def test_the_class_measure_counts_lines() -> None:
    """A 601-line class is found, a nested one named by its parent."""
    body = "\n".join(f"    x{i} = {i}" for i in range(600))
    assert class_lengths(f"class C:\n{body}\n") == {"C": 601}
    assert class_lengths("class A:\n    class B:\n        pass\n") == {"A": 3, "A.B": 2}
