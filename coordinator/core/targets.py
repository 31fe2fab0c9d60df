"""Conflict targets: which version nodes a commit reads and checks, from plain data.

A target is a table or one of its partitions; its key (:func:`coordinator.zk.log.target_key`) is
``<table>`` or ``<table>/<quoted partition key>``, and its znode's version is what the commit
multi checks and bumps. The conflict rules (:mod:`coordinator.core.conflicts`) decide against the
commits on a target; these functions decide which targets a commit must see, so that any commit
the rules would look at moves a version the multi checks:

* under ``parts`` only removals conflict: a partition is checked where the transaction removes a
  committed part; an INSERT checks nothing.
* under ``maxcompute`` and ``append`` every partition the transaction touches is checked; a
  whole-table statement (TRUNCATE without partitions) checks the table node and every partition
  that holds live parts, and the table node also moves whenever a partition node is created, so
  that the statement sees partitions that appear after its snapshot.

An application that commits idempotently (``tx.set_app_version``) has a target of its own,
:func:`app_key`: every commit carrying a version of it checks and bumps that node, so commits of
one application are decided in commit order (coordinator/core/conflicts.py, ``check_app_versions``).

Every name a key gives a znode is at most :data:`MAX_NODE_NAME` characters, whatever the user
value under it (a partition value, an application id): a longer one is cut and ends in ``#`` and
the SHA-256 of the whole name (:func:`bounded_name`). A name short enough keeps the form earlier
versions gave it, so the nodes of an existing cluster keep their names; ``#`` is percent-encoded
in every name that is not cut, so a cut name is never another's.

No I/O: the committer (replicas/committer.py) hands in what its state knows. Partition keys are
``coordinator.core.tabledata.partition_key`` strings (``"[]"`` for an unpartitioned table).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import quote

from coordinator.core.conflicts import Policy, Summary
from coordinator.core.errors import InvalidInput

Target = tuple[str, str]  # (table, partition key)
Live = Mapping[str, Mapping[str, Collection[str]]]  # table -> partition key -> its live parts


MAX_NODE_NAME = 255  # characters of one znode name made from a user's value (a file name's bound)
_DIGEST = 64  # hex digits of SHA-256


def bounded_name(name: str) -> str:
    """``name`` itself when at most :data:`MAX_NODE_NAME` characters; else its start (never
    ending inside a ``%XX`` escape), ``#`` and the SHA-256 of the whole ``name``, exactly
    :data:`MAX_NODE_NAME` characters or fewer. ``name`` is percent-encoded ASCII without ``#``."""
    if len(name) <= MAX_NODE_NAME:
        return name
    head = name[: MAX_NODE_NAME - _DIGEST - 1]
    cut = head.find("%", len(head) - 2)
    if cut != -1:
        head = head[:cut]
    return f"{head}#{hashlib.sha256(name.encode('ascii')).hexdigest()}"


# A commit multi is one ZooKeeper request: over jute.maxbuffer (1 MiB by default) the server drops
# the connection instead of answering, and the replica's session with it, again at every retry.
MAX_MULTI_BYTES = 1_000_000
MULTI_ROOM = 64 * 1024  # what a multi holds besides a transaction's targets: owner, fence, epoch, entry pointer
OP_BYTES = 128  # an op's bytes besides its path: header, lengths, version, a created node's ACL


def multi_bytes(names: Iterable[str], prefix: int) -> int:
    """At most the bytes that ops on the nodes ``names`` (target keys, counters, table names)
    add to a commit multi, each path being ``prefix`` characters (root, folder) and its name."""
    return sum(prefix + OP_BYTES + len(n) for n in names)


def too_many_targets(tid: str, count: int, size: int) -> InvalidInput:
    """The refusal of a transaction whose commit multi alone would be over the request bound."""
    return InvalidInput(
        f"transaction {tid} checks {count} conflict targets (partitions of maxcompute or append tables, "
        f"partitions it removes parts from, applications, tables read): its commit request to ZooKeeper "
        f"would take about {size} bytes, more than the {MAX_MULTI_BYTES - MULTI_ROOM} one transaction "
        "may (ZooKeeper refuses a request over 1 MiB); nothing was committed: write fewer partitions "
        "per transaction",
        id=tid,
        targets=count,
        size=size,
        limit=MAX_MULTI_BYTES - MULTI_ROOM,
    )


def target_key(table: str, pkey: str | None) -> str:
    """Key of a conflict target (its znode is ``targets/<key>``): the table (``pkey`` None) or
    one of its partitions, whose node name is the percent-encoded key, bounded
    (:func:`bounded_name`)."""
    if pkey is None:
        return table
    return f"{table}/{bounded_name(quote(pkey, safe=''))}"


APP_PREFIX = "@app:"  # no table name starts so (coordinator.core.tabledata: names are identifiers)


def app_key(app_id: str) -> str:
    """Key of an application's target (``targets/@app:<id>``): the id with every character but
    ASCII letters, digits, ``_`` and ``-`` percent-encoded (UTF-8), so any id is one znode name,
    bounded (:func:`bounded_name`)."""
    safe = all(c.isascii() and (c.isalnum() or c in "_-") for c in app_id)
    return bounded_name(
        APP_PREFIX + (app_id if safe else quote(app_id, safe="").replace(".", "%2E").replace("~", "%7E"))
    )


@dataclass(frozen=True)
class Statement:
    """What one staged statement touches, before a transaction's statements are folded."""

    table: str
    added: Collection[str] = ()  # partitions of the parts it adds
    removed: Collection[str] = ()  # partitions of the committed parts it removes (known ones)
    partitions: Collection[str] = ()  # partitions it names (overwrite, truncate, compact)
    whole_table: bool = False


def live_partitions(live: Live, table: str) -> set[str]:
    """Partitions of ``table`` that hold at least one live part."""
    return {pkey for pkey, names in live.get(table, {}).items() if names}


def _whole_table_keys(table: str, live: Live) -> set[str]:
    return {table} | {target_key(table, pkey) for pkey in live_partitions(live, table)}


def read_keys(policies: Mapping[str, Policy | str], statements: Iterable[Statement], live: Live) -> set[str]:
    """Targets whose versions a transaction's first commit attempt reads, from its statements
    as staged: what it will check (:func:`checked_keys`) as far as that is known before the
    fold, plus the table node of every ``maxcompute``/``append`` table it touches (a commit
    that creates a partition node bumps it too)."""
    keys: set[str] = set()
    for st in statements:
        if Policy(policies[st.table]) is Policy.PARTS:
            keys.update(target_key(st.table, pkey) for pkey in st.removed)
            continue
        keys.add(st.table)
        for pkeys in (st.added, st.removed, st.partitions):
            keys.update(target_key(st.table, pkey) for pkey in pkeys)
        if st.whole_table:
            keys |= _whole_table_keys(st.table, live)
    return keys


def checked_keys(
    policies: Mapping[str, Policy | str],
    effect: Mapping[Target, Summary],
    whole_tables: Iterable[str],
    live: Live,
) -> set[str]:
    """Targets the commit multi checks and bumps for a transaction's folded effect (its kinds
    and removed parts per target) and the tables it acts on as a whole."""
    keys: set[str] = set()
    for (table, pkey), summary in effect.items():
        if Policy(policies[table]) is Policy.PARTS and not summary.removed:
            continue
        keys.add(target_key(table, pkey))
    for table in whole_tables:
        if Policy(policies[table]) is not Policy.PARTS:
            keys |= _whole_table_keys(table, live)
    return keys


def whole_table_targets(
    policies: Mapping[str, Policy | str], whole_tables: Iterable[str], known: Iterable[Target]
) -> set[Target]:
    """Of the ``known`` targets (every partition with a commit history), those whose commits
    since the snapshot make a whole-table statement replay on the current parts: all partitions
    of its table under ``maxcompute`` and ``append``, none under ``parts`` (it removes only what
    it saw)."""
    tables = {t for t in whole_tables if Policy(policies[t]) is not Policy.PARTS}
    return {(t, pkey) for t, pkey in known if t in tables} if tables else set()
