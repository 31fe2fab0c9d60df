"""The architecture as a test: no circle of imports between files at module level.

The layer contract itself (which layer may import which) is import-linter's, in pyproject.toml,
and ``./dev test`` checks it before the tests run; this adds what a layers contract cannot see,
a circle among files of one layer. Imports inside functions and under ``TYPE_CHECKING`` are not
module-level and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("coordinator", "mergetxn", "parts", "replicas", "spark")


def module_graph() -> dict[str, set[str]]:
    files = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
            files[name.removesuffix(".__init__")] = f
    graph: dict[str, set[str]] = {}
    for name, f in files.items():
        out: set[str] = set()
        for node in ast.parse(f.read_text()).body:  # module level only
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name in files)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = {f"{node.module}.{a.name}" for a in node.names} & files.keys()
                out.update(subs or ({node.module} & files.keys()))
        graph[name] = out - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state and (found := visit(d)):
                return found
        state[m] = 2
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_module_level_import_cycle() -> None:
    cycle = find_cycle(module_graph())
    assert cycle is None, "module-level import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
