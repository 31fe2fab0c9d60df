"""The client's package (mergetxn/client/): its older names are aliases, its classes are split
along their jobs, and every writer turns data into parts through the one write road."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("coordinator", "parts", "replicas", "spark", "mergetxn")

# Who may call parts.io.format.write_part, and why: everything else writes through
# parts.io.write.write_data (conform, split by partition, write, key summaries).
WRITE_PART_CALLERS: dict[str, str] = {
    "parts/io/write.py": "the write road itself",
    "parts/io/rewrite.py": "merges and compactions: the one part a group of stored parts of one partition folds "
    "into (its rows already the table's; a split by partition would regroup them for nothing)",
    "mergetxn/chaos/hostile.py": "the chaos harness forges an empty part, which the write road never writes",
}


def _write_part_callers() -> set[str]:
    found = set()
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.Call):
                    fn = node.func
                    name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else None
                    if name == "write_part":
                        found.add(str(f.relative_to(ROOT)))
    return found


def test_every_writer_uses_the_one_write_road() -> None:
    callers = _write_part_callers()
    assert callers - WRITE_PART_CALLERS.keys() == set()
    assert set(WRITE_PART_CALLERS) <= callers, "an allowed caller no longer calls write_part: remove it"


def test_the_older_module_names_are_the_same_modules() -> None:
    for name in ("client", "arguments", "heartbeat"):
        old = importlib.import_module(f"coordinator.api.{name}")
        assert old is importlib.import_module(f"mergetxn.client.{name}"), name
    import coordinator
    import coordinator.client
    import mergetxn
    import mergetxn.client
    from mergetxn.client import client

    for name in ("Client", "Transaction", "CommitStatus", "connect"):
        obj = getattr(client, name)
        assert getattr(coordinator.client, name) is obj and getattr(mergetxn.client, name) is obj
        assert getattr(coordinator, name) is obj and getattr(mergetxn, name) is obj


def test_no_class_of_the_client_is_over_600_lines() -> None:
    sizes = {
        f"{f.name}:{node.name}": node.end_lineno - node.lineno + 1
        for f in (ROOT / "mergetxn" / "client").glob("*.py")
        for node in ast.walk(ast.parse(f.read_text()))
        if isinstance(node, ast.ClassDef) and node.end_lineno is not None
    }
    assert sizes and max(sizes.values()) <= 600, {k: v for k, v in sizes.items() if v > 600}


def test_the_client_keeps_its_public_methods_checked() -> None:
    """Methods that the client's parts define are checked as the core's are (labelled by the
    class the caller uses: ``client.read``, ``transaction.upsert``)."""
    from mergetxn.client.client import Client, Transaction

    for cls, names in ((Client, ("read", "create_table", "compact", "insert")), (Transaction, ("read", "upsert"))):
        for name in names:
            assert hasattr(vars(cls)[name], "__wrapped__"), f"{cls.__name__}.{name} is not checked"
