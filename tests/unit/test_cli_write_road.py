"""The command line writes through the client, never beside it.

``mergetxn insert`` once had a copy of the client's write path (it conformed, split by partition,
wrote part files with ``parts.io``, staged them with ``add_parts`` and deleted them itself on a
failure). It now stages each batch of its file with the transaction's own statements
(``tx.insert``, ``tx.upsert``, ``tx.overwrite``), so the client's one write road is the only one.
This reads every module of the command line with ``ast`` and fails if one of them reaches the
part files or stages parts of its own again.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: What only the client's write road may call: writing, staging and deleting part files.
WRITE_ROAD = {"write_part", "delete_part", "add_parts", "commit_parts"}


def cli_modules() -> list[Path]:
    package = ROOT / "mergetxn" / "cli"
    return sorted(package.rglob("*.py")) if package.is_dir() else [ROOT / "mergetxn" / "cli.py"]


def reaches(path: Path) -> list[str]:
    """The part-file modules ``path`` imports and the write-road names it calls or imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("parts.io"):
                found.append(f"from {node.module} import ...")
            found += [f"import {a.name}" for a in node.names if a.name in WRITE_ROAD]
        elif isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.startswith("parts.io")]
        elif isinstance(node, ast.Attribute) and node.attr in WRITE_ROAD:
            found.append(f".{node.attr}")
        elif isinstance(node, ast.Name) and node.id in WRITE_ROAD:
            found.append(node.id)
    return found


def test_the_command_line_writes_through_the_client() -> None:
    modules = cli_modules()
    assert modules and all(m.exists() for m in modules)
    found = {str(m.relative_to(ROOT)): r for m in modules if (r := reaches(m))}
    assert not found, f"the command line writes parts beside the client: {found}"


def test_the_check_sees_a_copy(tmp_path: Path) -> None:
    """The check can fail: a module that writes its own parts is found."""
    probe = tmp_path / "copy.py"
    probe.write_text("from parts.io.format import write_part\n\ndef add(tx, meta):\n    tx.add_parts('t', [meta])\n")
    assert sorted(reaches(probe)) == [".add_parts", "from parts.io.format import ...", "import write_part"]
