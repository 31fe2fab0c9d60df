"""Atomicity and durability of a transaction (docs/rules.md#atomicity-and-durability): the pure
rules.

A keys table is created with ``atomicity="full"`` (the default) or ``"none"``, and a transaction
is begun with one of the two too (``client.begin(atomicity=...)``). Both sides must say it (as
YTsaurus requires), so that the places where non-atomic commits happen are marked in the code,
and the server checks that they agree at commit: :func:`mismatch`. A transaction begun with
``atomicity="none"`` may only write rows by key into tables created with ``atomicity="none"``;
one begun with ``"full"`` may not write rows into such a table (it may still compact or drop it:
those write no rows by key). Anything else is ``InvalidInput`` naming both modes, and the
transaction ends, rolled back.

``durability="async"`` is only for ``atomicity="none"`` (as in YTsaurus, "for non-atomic
transactions only"); ``atomicity="none"`` is only for snapshot isolation (its reads are not one
snapshot, so there is no read set to make serializable): :func:`check_modes`.

No I/O: the registry (replicas/registry.py) hands in the table definitions it holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from coordinator.core.conflicts import Policy
from coordinator.core.errors import InvalidInput, quote
from coordinator.core.readsets import SERIALIZABLE, SNAPSHOT
from coordinator.model.catalog import TableDef
from coordinator.model.records import Compact, DropTable, StagedOp

FULL, NONE = "full", "none"
ATOMICITIES = (FULL, NONE)
SYNC, ASYNC = "sync", "async"
DURABILITIES = (SYNC, ASYNC)
MAX_SESSION = 64  # characters of a client's session id (what client.flush() names)


def check_modes(atomicity: object, durability: object, isolation: str = SNAPSHOT) -> tuple[str, str]:
    """The ``(atomicity, durability)`` a transaction may be begun with, or InvalidInput naming
    the bad value (or the bad combination) and the choices."""
    if not isinstance(atomicity, str) or atomicity not in ATOMICITIES:
        raise InvalidInput(
            f"atomicity must be one of {list(ATOMICITIES)}, not {quote(atomicity)}", atomicity=repr(atomicity)
        )
    if not isinstance(durability, str) or durability not in DURABILITIES:
        raise InvalidInput(
            f"durability must be one of {list(DURABILITIES)}, not {quote(durability)}", durability=repr(durability)
        )
    if durability == ASYNC and atomicity != NONE:
        raise InvalidInput(
            f"durability='async' needs atomicity='none' (not {quote(atomicity)}): only non-atomic "
            "transactions may commit before ZooKeeper holds the commit",
            atomicity=atomicity,
            durability=durability,
        )
    if atomicity == NONE and isolation == SERIALIZABLE:
        raise InvalidInput(
            "atomicity='none' cannot be serializable: its reads see the latest applied state, "
            "not one snapshot (use isolation='snapshot')",
            atomicity=atomicity,
            isolation=isolation,
        )
    return atomicity, durability


def check_session(session: object, durability: str) -> str | None:
    """The client session an async commit is recorded under (client.flush() asks by it)."""
    if session is None and durability == SYNC:
        return None
    if not isinstance(session, str) or not 0 < len(session) <= MAX_SESSION or not session.isprintable():
        raise InvalidInput(
            f"durability={quote(durability)} needs a session: a string of 1 to {MAX_SESSION} printable "
            f"characters naming the client, not {quote(session)}"
        )
    return session


def table_atomicity(tdef: TableDef) -> str:
    """What a table asks of the transactions that write rows into it: a keys table its
    ``atomicity``, every other table ``"full"`` (its commits are atomic)."""
    return tdef.atomicity if tdef.conflict_policy is Policy.KEYS else FULL


def mismatch(
    txn_id: str, atomicity: str, ops: Iterable[StagedOp], table_of: Callable[[str], TableDef | None]
) -> InvalidInput | None:
    """The InvalidInput a transaction begun with ``atomicity`` fails its commit with, given its
    staged ``ops`` and the tables as they are now (``table_of``: None for one that is gone, which
    the commit decides: it lost to the drop), or None when they agree. Compactions and drops
    write no rows by key: a transaction begun with ``"full"`` may do them on any table, one begun
    with ``"none"`` on none."""
    for op in ops:
        tdef = table_of(op.table)
        if tdef is None:
            continue
        if isinstance(op, Compact | DropTable):
            if atomicity == NONE:
                what = "compacts" if isinstance(op, Compact) else "drops"
                return InvalidInput(
                    f"transaction {txn_id} was begun with atomicity='none' and {what} table {quote(op.table)}: such a "
                    f"transaction only writes rows by key into tables whose atomicity is 'none'; do this in a "
                    f"transaction begun with atomicity='full'",
                    id=txn_id,
                    table=op.table,
                    atomicity=atomicity,
                    table_atomicity=table_atomicity(tdef),
                )
            continue
        wanted = table_atomicity(tdef)
        if wanted != atomicity:
            kind = "" if tdef.conflict_policy is Policy.KEYS else f" (a {tdef.conflict_policy.value} table, not keys)"
            return InvalidInput(
                f"transaction {txn_id} was begun with atomicity={quote(atomicity)} but writes table {quote(op.table)}, whose "
                f"atomicity is {quote(wanted)}{kind}: the modes must match (begin it with atomicity={quote(wanted)}); "
                "nothing of it was committed",
                id=txn_id,
                table=op.table,
                atomicity=atomicity,
                table_atomicity=wanted,
            )
    return None
