"""Which parts a transaction sees: the rule of docs/rules.md#visibility (after the ClickHouse RFC).

Pure logic so that it can be checked exhaustively; the replica applies it to its part records.
"""

from __future__ import annotations


def is_visible(
    snapshot: int,
    reader_tid: str | None,
    creation_tid: str,
    creation_csn: int | None,
    removal_tid: str | None,
    removal_csn: int | None,
) -> bool:
    """A part is visible to a reader when the reader created it and did not remove it, or its
    creator committed at a CSN <= snapshot and no transaction committed its removal at a CSN <=
    snapshot, and the reader did not remove it itself.

    ``creation_csn``/``removal_csn`` are None while the transaction that wrote them is still
    running (or never committed). ``reader_tid`` is None for a plain snapshot read.
    """
    if reader_tid is not None and removal_tid == reader_tid:
        return False
    if reader_tid is not None and creation_tid == reader_tid:
        return True
    if creation_csn is None or creation_csn > snapshot:
        return False
    return removal_csn is None or removal_csn > snapshot
