"""Who wrote which key on one keys target since the conflict history's floor: the index that lets
the key conflict check (replicas/keylocks.py) look up the keys a transaction writes instead of
probing the key summary of every part committed since its snapshot (docs/rules.md#locks).

A part's keys are known without a read when its summary lists its versions (``"exact"``: a
commit of at most ``keytables.EXACT_ROWS`` versions, coordinator/core/keytables.py); such a part
is indexed under each of its keys. A part whose summary does not list them (a large commit, or
one written before summaries) is kept aside, "loose": the check probes those as before. A
compaction's output writes no key and is not indexed at all (``keytables.folded``).

The index only names candidates: the check verifies each against the part's exact locks, as
the per-part check does, so an entry never makes a conflict that did not happen; and every part
that may hold a written key is a candidate, so none is missed. Candidates come in commit order
(CSN, then the order the parts were added), the order the per-part check visits them in.

Memory: one entry per listed key of each indexed part committed after the floor (at most
``EXACT_ROWS`` per part) plus one per loose part: bounded by the conflict history's retention,
as the state's index of parts by creation CSN is, and pruned with it (:meth:`KeyIndex.prune`).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

Entry = tuple[int, int, str]  # (creation CSN, order added, part name)


def listed_keys(summary: Mapping[str, Any] | None) -> tuple[int, list[tuple[Any, ...]]] | None:
    """``(key columns, distinct keys)`` a part's summary lists its versions of, in first-seen
    order; None when it lists none or its rows disagree on the number of key columns (the check
    then probes the part as before)."""
    rows = None if summary is None else summary.get("exact")
    if rows is None:
        return None
    widths = {len(r) - 2 for r in rows}
    if len(widths) > 1:
        return None
    width = widths.pop() if widths else 0
    return width, list(dict.fromkeys(tuple(r[:-2]) for r in rows))


class KeyIndex:
    """The keys written on one keys target by the parts committed after the prune floor."""

    def __init__(self) -> None:
        self._order = 0  # parts added so far: orders parts of one CSN as they were added
        self._by_key: dict[tuple[Any, ...], list[Entry]] = {}  # key -> the indexed parts that list it, in commit order
        # (entry, key columns, keys), for pruning
        self._listed: deque[tuple[Entry, int, list[tuple[Any, ...]]]] = deque()
        self._widths: dict[int, int] = {}  # key columns -> indexed parts listing that many
        self._loose: list[Entry] = []  # parts whose keys are not listed, in commit order

    def __len__(self) -> int:
        """Entries held (keys of listed parts, and loose parts): what its memory grows with."""
        return sum(len(k) for _, _, k in self._listed) + len(self._loose)

    def add(self, csn: int, name: str, summary: Mapping[str, Any] | None, folded: bool) -> None:
        """Index a part committed at ``csn`` (parts come in commit order; ``folded``: a
        compaction's output, which writes no key)."""
        self._order += 1
        if folded:
            return
        entry = (csn, self._order, name)
        got = listed_keys(summary)
        if got is None:
            self._loose.append(entry)
            return
        width, keys = got
        if not keys:
            return  # lists no version: writes no key
        for key in keys:
            self._by_key.setdefault(key, []).append(entry)
        self._listed.append((entry, width, keys))
        self._widths[width] = self._widths.get(width, 0) + 1

    def prune(self, floor: int) -> None:
        """Forget the parts committed at or below ``floor`` (no check looks at them any more)."""
        while self._listed and self._listed[0][0][0] <= floor:
            _, width, keys = self._listed.popleft()
            for key in keys:
                entries = self._by_key.get(key)
                if entries is None:
                    continue  # a later part of the same prune's range wrote it too: gone already
                i = bisect.bisect_right(entries, floor, key=_csn)
                if i == len(entries):
                    del self._by_key[key]
                else:
                    del entries[:i]
            left = self._widths[width] - 1
            if left:
                self._widths[width] = left
            else:
                del self._widths[width]
        del self._loose[: bisect.bisect_right(self._loose, floor, key=_csn)]

    def empty(self) -> bool:
        return not self._listed and not self._loose

    def candidates(
        self, snapshot: int, keys: Iterable[tuple[Any, ...]], width: int
    ) -> list[tuple[int, str, bool]] | None:
        """``(creation CSN, name, listed)`` of the parts committed after ``snapshot`` that may
        write one of ``keys`` (a table of ``width`` key columns), in commit order: those that
        list one of them (``listed``) and every loose one (not: the caller probes its filter).
        None when a listed part has another number of key columns than the table (the check
        then probes every part, as the file's keys would be read for it)."""
        if any(w != width for w in self._widths):
            return None
        found: dict[Entry, bool] = {}
        by_key = self._by_key
        for key in keys:
            entries = by_key.get(key)
            if entries:
                for e in entries[bisect.bisect_right(entries, snapshot, key=_csn) :]:
                    found[e] = True
        for e in self._loose[bisect.bisect_right(self._loose, snapshot, key=_csn) :]:
            found[e] = False
        return [(csn, name, found[(csn, order, name)]) for csn, order, name in sorted(found)]


def _csn(e: Entry) -> int:
    return e[0]
