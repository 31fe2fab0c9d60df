"""``mergetxn check --repair``: mend parts whose committed metadata their intact file contradicts.

A part committed with a row count, size, checksum, statistics or key summary that its file does
not bear out (possible before commits were checked against their files: docs/rules.md, "What a
part's metadata is checked against") makes every read of its table fail (CorruptPart) or, with
statistics narrower than its values, makes filtered reads skip its rows. ``mergetxn check`` finds
such parts; the repair rewrites each from its file's rows, as a compaction transaction (the same
rows, a new part whose metadata is taken from the new file; a keys table's versions keep their
order), so every read at a snapshot from then on sees the file's rows. Snapshots before the
repair still name the old part. A part whose file is missing or is not the table's cannot be
mended so: restore the table from a backup (``mergetxn restore``).
"""

from __future__ import annotations

from coordinator.core.conflicts import Policy
from coordinator.core.errors import InvalidInput, quote
from coordinator.model.records import Compact
from mergetxn.client.client import Client
from parts.io import rewrite
from parts.io.format import file_meta, part_content
from parts.model.meta import PartMeta


def repair(client: Client, report: dict) -> list[dict]:
    """Mend the repairable visible parts a ``client.check`` ``report`` found, one compaction
    transaction per table; ``[{"table", "parts", "csn"}]``."""
    done = []
    for t in report["tables"]:
        bad = [p for p in t["problems"] if p.get("repairable") and p["visible"]]
        if bad:
            csn = _repair_table(client, t["table"], bad)
            done.append({"table": t["table"], "parts": [p["part"] for p in bad], "csn": csn})
    return done


def _repair_table(client: Client, table: str, bad: list[dict]) -> int:
    """One transaction: each bad part read under its file's own metadata and rewritten."""
    names = {p["part"] for p in bad}
    with client.transaction() as tx:
        tdef = tx.table(table)
        got = client.call("visible", id=tx.id, table=table)
        visible = [PartMeta.from_dict(m) for m in got["parts"]]
        gone = sorted(names - {m.name for m in visible})
        if gone:
            raise InvalidInput(
                f"repair of {quote(table)}: part(s) {gone} are no longer visible; run mergetxn check again",
                table=table,
            )
        visible = [file_meta(part_content(client.storage, m), m) if m.name in names else m for m in visible]
        truths = [m for m in visible if m.name in names]
        keys = tdef.conflict_policy is Policy.KEYS
        # A keys table's versions keep their order (their parts' CSNs); the other visible parts
        # decide which DELETEs the fold may drop.
        csns = got.get("csns") if keys else None
        result = rewrite.compact(client.storage, tdef, truths, "major", tx.id, csns, visible)
        op = Compact(table, "major", tuple(result.added), tuple(result.removed))
        client.call("stage", id=tx.id, ops=[op.to_dict()])
    assert tx.csn is not None
    return tx.csn
