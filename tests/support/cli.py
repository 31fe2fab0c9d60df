"""What tests of the command line share: the check that a command failed with one error line."""

from __future__ import annotations

from click.testing import Result


def one_error_line(r: Result, code: int, *words: str) -> str:
    """``r`` exited with ``code`` and said why in exactly one ``error:`` line (no traceback)
    holding each of ``words``; that line."""
    assert r.exit_code == code, (r.exit_code, r.output)
    errs = [line for line in r.output.splitlines() if line.startswith("error: ")]
    assert len(errs) == 1 and "Traceback" not in r.output, r.output
    for w in words:
        assert w in errs[0], r.output
    return errs[0]
