"""Recovery for an operator: backups of a table at a CSN, their restore, and a table's history.

**Backup** (``mergetxn backup``): a directory (local, or any fsspec URL such as ``s3://``) with
``parts/<part>.parquet``, a byte-for-byte copy of every part visible at the snapshot, and
``manifest.json`` (written last: a directory without one is an unfinished backup) naming the
table, the CSN, the table's definition then (``TableDef.to_dict``: schema, partitioning, policy,
key, lock groups, limits, retention, column history) and each part with its size, checksum, rows,
partition and creation CSN, and its SHA-256. The snapshot is leased while the files are copied, so
cleanup keeps them; each file is checked against the checksum it was committed with before it is
copied.

**Seal** (secured clusters): the manifest carries ``mac``, an HMAC-SHA256 of the SHA-256 of its
canonical JSON (every field but ``mac``: the definition, the CSN, each part's size, checksum,
SHA-256, rows and creation CSN) under a key derived from the replicas' secret
(coordinator/wire/security.py, ``backup_mac``). Only a replica holds that key: it makes and checks
MACs for admins (the ``backup_mac`` action), so a backup or restore of a secured cluster needs an
admin. A backup of an unsecured cluster carries no MAC: its directory is trusted as it is.

**Restore** (``mergetxn restore``): on a secured cluster the manifest's MAC is checked first (a
manifest without one, or whose MAC does not match, is refused: changed after the backup, or made
by another cluster; ``unverified=True`` restores it anyway), then every file against the manifest
(size and checksum, and the SHA-256 of a sealed one, checked again as each file is read), before
anything changes, so a tampered or truncated backup is refused and changes nothing. The rows at
the backed-up CSN (a keys table's versions folded by their CSNs, as a read does) are then written
as ONE transaction: into a new table created with the backup's definition, or, when the table
exists, in place: a truncate and the inserts in the same commit, so a reader sees the table before
or after, never between. That transaction is begun free of the tables' own limits
(``txn_max_rows``, ``txn_max_seconds``; ``client.begin(table_limits=False)``, an admin's): a
backup restores whatever those limits; the replica-wide limits still bind it.

**History** (``mergetxn history``): the table's commits from the events every replica derives
from the log (kind, rows of the parts added and removed, tid, the replica that ran it), its DDL
(create, alter) from its definition's history, and the aborts this replica remembers (with why).
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import hmac
import itertools
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeGuard

import pyarrow as pa

from coordinator.core import keyfold, keytables
from coordinator.core.conflicts import Policy
from coordinator.core.errors import CorruptMetadata, CorruptPart, InvalidInput, MergetxnError, quote
from coordinator.core.tabledata import partition_key
from coordinator.model.catalog import TableDef
from mergetxn.client.client import Client
from parts.io import rewrite
from parts.io.format import checksum_of, part_content, read_part, verify_file
from parts.io.storage import Storage
from parts.model.meta import PartMeta

FORMAT = "mergetxn-backup/1"
MANIFEST = "manifest.json"
PARTS_DIR = "parts"
MAX_MANIFEST_BYTES = 256 * 1024 * 1024  # a manifest of a million parts fits; a larger file is not ours
HISTORY_LIMIT = 10_000  # the most commits `history` prints

KIND_NAMES = {
    "INSERT": "insert",
    "OVERWRITE": "overwrite",
    "MUTATE": "mutate",
    "MINOR_COMPACT": "compaction (minor)",
    "MAJOR_COMPACT": "compaction (major)",
}


# -- backup ------------------------------------------------------------------------------------
def backup(client: Client, table: str, directory: str, snapshot: int | None = None) -> dict:
    """Copy ``table`` at ``snapshot`` (a CSN; the latest by default) into ``directory``; returns
    the manifest written. Refuses a directory that already holds a backup (InvalidInput)."""
    if inside(client.storage.url, directory):
        raise InvalidInput(
            f"backup directory {quote(directory)} is inside the cluster's storage, where cleanup "
            "collects files no commit names: give a directory outside it"
        )
    dest = _storage(directory, create=True)
    if dest.exists(MANIFEST):
        raise InvalidInput(f"{quote(directory)} already holds a backup ({MANIFEST}); give an empty directory")
    seal = sealer(client)
    if seal is not None:
        seal("0" * 64)  # an admin's call: refused (PermissionDenied) before anything is copied
    with client.pin(table, snapshot) as (tdef, snap, metas, csns):
        entries = []
        for meta in sorted(metas, key=lambda m: m.name):
            raw = part_content(client.storage, meta)
            if len(raw) != meta.size or checksum_of(raw) != meta.checksum:
                raise CorruptPart(
                    f"part {quote(meta.path)} of {quote(table)} is not as committed "
                    f"({verify_file(client.storage, meta)}); run mergetxn check",
                    path=meta.path,
                )
            if meta.spilled is not None:  # flushed since: its bytes travel in its metadata again, as written
                meta = dataclasses.replace(meta, spilled=None, inline=raw)
            if not meta.inlined:  # an inlined part's content travels in its metadata, in the manifest
                dest.put(_part_file(meta.name), raw)
            entries.append(
                {
                    "file": _part_file(meta.name),
                    "size": meta.size,
                    "checksum": meta.checksum,
                    "sha256": hashlib.sha256(raw).hexdigest(),
                    "rows": meta.rows,
                    "partition": partition_key(meta.partition),
                    "csn": csns.get(meta.name),
                    "meta": meta.to_dict(),
                }
            )
    manifest = {
        "format": FORMAT,
        "table": tdef.name,
        "csn": snap,
        "created_at": time.time(),
        "definition": tdef.to_dict(),
        "rows": sum(m.rows for m in metas),
        "bytes": sum(m.size for m in metas),
        "parts": entries,
    }
    if seal is not None:
        manifest["mac"] = seal(manifest_digest(manifest))
    dest.put(MANIFEST, json.dumps(manifest, indent=1, allow_nan=False).encode("utf-8"))
    return manifest


def _part_file(name: str) -> str:
    return f"{PARTS_DIR}/{name}.parquet"


def sealer(client: Client) -> Callable[[str], str] | None:
    """The MAC of a manifest digest, made by the client's replica (a secured cluster's; None for
    an unsecured one, which has no key): coordinator/wire/security.py, ``backup_mac``."""
    if client.credentials is None:
        return None
    return lambda digest: str(client.call("backup_mac", digest=digest)["mac"])


def manifest_digest(manifest: dict) -> str:
    """The SHA-256 (hex) of a manifest's canonical JSON without its ``mac`` (pure)."""
    body = {k: v for k, v in manifest.items() if k != "mac"}
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")
    ).hexdigest()


def inside(storage_url: str, directory: str) -> bool:
    """Whether ``directory`` is ``storage_url`` or under it (pure but for resolving local links)."""

    def norm(url: str) -> tuple[str, str]:
        if "://" not in url or url.startswith("file://"):
            return "file", os.path.realpath(os.path.expanduser(url.removeprefix("file://")))
        scheme, rest = url.split("://", 1)
        return ("s3" if scheme.lower() in ("s3", "s3a") else scheme.lower()), rest.rstrip("/")

    (s_scheme, s_path), (d_scheme, d_path) = norm(storage_url), norm(directory)
    sep = os.sep if s_scheme == "file" else "/"
    return s_scheme == d_scheme and (d_path == s_path or d_path.startswith(s_path.rstrip(sep) + sep))


def _storage(directory: str, create: bool) -> Storage:
    """The backup directory as storage; a local one that does not exist is refused for a
    restore (opening it must not create it)."""
    if not isinstance(directory, str) or not directory.strip():
        raise InvalidInput("backup directory must be a non-empty path or URL")
    local = "://" not in directory or directory.startswith("file://")
    if local and not create:
        path = directory.removeprefix("file://")
        if not os.path.isdir(path):
            raise InvalidInput(f"backup directory {quote(directory)} does not exist")
    return Storage(directory)


# -- the manifest, read back -------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Backup:
    """A backup directory's manifest, validated: what restore needs, nothing else."""

    table: str
    csn: int
    definition: TableDef
    parts: tuple[tuple[PartMeta, int | None], ...]  # each part, its path in the backup, and its CSN
    digest: str = ""  # manifest_digest of the manifest
    mac: str | None = None  # its seal (secured clusters)
    sha256: dict[str, str] = dataclasses.field(default_factory=dict)  # part path -> SHA-256 (hex)


class _Sealed(Storage):
    """A backup directory whose files are checked against the SHA-256 its manifest names at
    every read: a file changed after the manifest was checked is refused when it is read."""

    def __init__(self, url: str, sha256: dict[str, str]) -> None:
        super().__init__(url)
        self._sha256 = sha256

    def get(self, relpath: str) -> bytes:
        raw = super().get(relpath)
        want = self._sha256.get(relpath)
        if want is not None and not hmac.compare_digest(hashlib.sha256(raw).hexdigest(), want):
            raise CorruptPart(f"backup file {quote(relpath)} does not match the SHA-256 of its manifest", path=relpath)
        return raw


def load(directory: str, seal: Callable[[str], str] | None = None, unverified: bool = False) -> tuple[Storage, Backup]:
    """Read and validate ``directory``'s manifest, check its MAC with ``seal`` (a secured
    cluster's: :func:`sealer`; skipped with ``unverified``), then check every file it names
    (size, checksum, and SHA-256 when the manifest has them) before anything is restored:
    CorruptMetadata for a manifest that does not parse or does not match its MAC, InvalidInput
    for one without a MAC, CorruptPart naming each file that is missing or differs."""
    src = _storage(directory, create=False)
    if not src.exists(MANIFEST):
        raise InvalidInput(
            f"{quote(directory)} holds no backup ({MANIFEST} is missing: not a backup, or one that did not finish)"
        )
    size = src.size(MANIFEST)
    if size > MAX_MANIFEST_BYTES:
        raise CorruptMetadata(f"backup manifest {quote(directory)} is {size} bytes, over {MAX_MANIFEST_BYTES}")
    b = parse_manifest(src.get(MANIFEST), directory)
    if seal is not None and not unverified:
        check_seal(b, seal, directory)
    plain, src = src, _Sealed(directory, b.sha256) if b.sha256 else src
    problems = []
    for meta, _ in b.parts:
        try:
            why = verify_file(src, meta, checksum=True)
        except CorruptPart:  # (what is wrong in the size or checksum, if anything, says more)
            why = verify_file(plain, meta, checksum=True) or "does not match the SHA-256 of the manifest"
        if why is not None:
            problems.append(f"{meta.path} {why}")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise CorruptPart(
            f"backup {quote(directory)} is damaged, nothing restored: {'; '.join(problems[:5])}{more}",
            problems=problems[:100],
        )
    return src, b


def _is_hex256(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def check_seal(b: Backup, seal: Callable[[str], str], where: str) -> None:
    """Refuse a manifest that carries no MAC or whose MAC is not the cluster's for its content."""
    if b.mac is None:
        raise InvalidInput(
            f"backup {quote(where)} carries no MAC (made on an unsecured cluster, or its MAC was removed): "
            "a secured cluster restores only the backups it sealed; nothing restored. If no one else "
            "could have written that directory, restore it with --unverified",
            directory=where,
        )
    if not hmac.compare_digest(seal(b.digest), b.mac):
        raise CorruptMetadata(
            f"backup {quote(where)} does not match its MAC: its manifest was changed after the backup, "
            "or another cluster made it; nothing restored",
            directory=where,
        )


def parse_manifest(raw: bytes, where: str) -> Backup:
    """A manifest's bytes as a :class:`Backup` (pure); CorruptMetadata names what is wrong."""
    try:
        d = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CorruptMetadata(f"backup manifest in {quote(where)} is not JSON: {exc}") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise CorruptMetadata(f"backup manifest in {quote(where)} is not a {FORMAT} manifest")
    table, csn, definition, entries = d.get("table"), d.get("csn"), d.get("definition"), d.get("parts")
    if not isinstance(table, str) or not isinstance(csn, int) or isinstance(csn, bool) or csn < 0:
        raise CorruptMetadata(f"backup manifest in {quote(where)}: table or csn missing or of the wrong type")
    if not isinstance(definition, dict) or not isinstance(entries, list):
        raise CorruptMetadata(f"backup manifest in {quote(where)}: definition or parts missing")
    try:
        tdef = TableDef.from_dict(definition)
    except (MergetxnError, KeyError, TypeError, ValueError) as exc:
        raise CorruptMetadata(
            f"backup manifest in {quote(where)}: the table definition does not parse: {exc}"
        ) from None
    if tdef.name != table:
        raise CorruptMetadata(
            f"backup manifest in {quote(where)} names table {quote(table)} and defines {quote(tdef.name)}"
        )
    mac = d.get("mac")
    if mac is not None and not _is_hex256(mac):
        raise CorruptMetadata(f"backup manifest in {quote(where)}: mac must be 64 lowercase hex digits")
    parts, sha256 = [], {}
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise CorruptMetadata(f"backup manifest in {quote(where)}: part {i} is not an object")
        meta = PartMeta.from_dict(e.get("meta"))
        part_csn = e.get("csn")
        if part_csn is not None and (not isinstance(part_csn, int) or isinstance(part_csn, bool)):
            raise CorruptMetadata(f"backup manifest in {quote(where)}: part {quote(meta.name)} has a bad csn")
        if (
            e.get("file") != _part_file(meta.name)
            or e.get("size") != meta.size
            or e.get("checksum") != meta.checksum
            or meta.table != table
        ):
            raise CorruptMetadata(f"backup manifest in {quote(where)}: part {quote(meta.name)} disagrees with itself")
        digest = e.get("sha256")
        if digest is not None or mac is not None:
            if not _is_hex256(digest):
                raise CorruptMetadata(f"backup manifest in {quote(where)}: part {quote(meta.name)} has no SHA-256")
            sha256[_part_file(meta.name)] = digest
        parts.append((dataclasses.replace(meta, path=_part_file(meta.name)), part_csn))
    return Backup(table, csn, tdef, tuple(parts), manifest_digest(d), mac, sha256)


# -- restore -----------------------------------------------------------------------------------
def restore(client: Client, directory: str, as_name: str | None = None, unverified: bool = False) -> dict:
    """Restore the backup in ``directory`` as one transaction: into a new table (``as_name``, or
    the backed-up name when no such table exists) created with the backup's definition, or in
    place when the table exists (its rows replaced in one commit), whatever the tables' own
    ``txn_max_rows``/``txn_max_seconds``. Returns ``{"table", "csn", "from_csn", "rows",
    "created"}``. A damaged backup, and on a secured cluster one whose MAC is missing or does not
    match (unless ``unverified``), is refused before anything changes."""
    src, b = load(directory, sealer(client), unverified)
    target = b.table if as_name is None else as_name
    exists = target in client.tables()
    if as_name is not None and exists:
        raise InvalidInput(f"table {quote(target)} already exists; restore in place without --as, or pick a new name")
    if exists:
        current = client.table_at(target)
        _same_kind(current, b.definition)
        written = 0
        with client.transaction(atomicity=current.atomicity, table_limits=False) as tx:
            tx.truncate(target)
            for data in _rows(src, b):
                tx.insert(target, in_place(data, current.schema, target))
                written += data.num_rows
        return {"table": target, "csn": tx.csn, "from_csn": b.csn, "rows": written, "created": False}
    d = b.definition
    client.create_table(
        target,
        d.schema,
        partition_by=d.partition_by,
        primary_key=d.primary_key,
        conflict_policy=d.conflict_policy.value,
        auto_merge=d.auto_merge,
        lock_groups=dict(d.lock_groups) or None,
        atomicity=d.atomicity,
        txn_max_seconds=d.txn_max_seconds,
        txn_max_rows=d.txn_max_rows,
        retention_seconds=d.retention_seconds,
    )
    written = 0
    try:
        with client.transaction(atomicity=d.atomicity, table_limits=False) as tx:
            for data in _rows(src, b):
                tx.insert(target, data)
                written += data.num_rows
    except BaseException:
        try:  # the table was made for this restore: leave nothing half done
            client.drop_table(target)
        except MergetxnError:
            pass
        raise
    return {"table": target, "csn": tx.csn, "from_csn": b.csn, "rows": written, "created": True}


def _same_kind(current: TableDef, backed_up: TableDef) -> None:
    """InvalidInput, before anything changes, unless the table restored in place is of the
    backup's kind (policy and key) and holds its columns with their types."""
    mine = (current.conflict_policy is Policy.KEYS, current.primary_key)
    theirs = (backed_up.conflict_policy is Policy.KEYS, backed_up.primary_key)
    if mine != theirs:
        raise InvalidInput(
            f"restore in place: table {quote(current.name)} (policy {current.conflict_policy.value}, "
            f"key {list(current.primary_key)}) is not of the backup's kind (policy "
            f"{backed_up.conflict_policy.value}, key {list(backed_up.primary_key)}); "
            "restore it under a new name (--as)",
            table=current.name,
        )
    types = {f.name: f.type for f in current.schema}
    other = [
        f"{f.name} ({f.type} in the backup, {types[f.name]} in the table)"
        for f in backed_up.schema
        if f.name in types and types[f.name] != f.type
    ]
    if other:
        raise InvalidInput(
            f"restore in place: table {quote(current.name)} has other types than the backup for column(s) "
            f"{', '.join(other)} (dropped and made again since?); restore it under a new name (--as)",
            table=current.name,
        )


def _rows(src: Storage, b: Backup) -> Iterator[pa.Table]:
    """The backup's rows at its CSN, one part (a keys table: one partition, folded) at a time."""
    tdef = b.definition
    if tdef.conflict_policy is not Policy.KEYS:
        for meta, _ in b.parts:
            yield rewrite.read_parts(src, [meta], table=tdef)[0]
        return
    by_partition: dict[str, list[tuple[PartMeta, int | None]]] = {}
    for meta, csn in b.parts:
        by_partition.setdefault(meta.partition_key, []).append((meta, csn))
    for _, group in sorted(by_partition.items()):
        versions = [(keytables.OWN if csn is None else csn, read_part(src, meta)) for meta, csn in group]
        yield keyfold.merge(tdef.schema, tdef.primary_key, versions)


def in_place(data: pa.Table, schema: pa.Schema, table: str) -> pa.Table:
    """``data``, refused when it holds a column the table no longer has (pure): restored in
    place, the backup's rows go through the one write road (``tx.insert``:
    parts/io/write.py), which fills a column the table gained since the backup with nulls and
    refuses a missing non-nullable one."""
    extra = [n for n in data.column_names if n not in schema.names]
    if extra:
        raise InvalidInput(
            f"restore in place: table {quote(table)} has no column(s) {quote(extra)} of the backup; "
            "restore it under a new name (--as)",
            table=table,
        )
    return data


# -- history -----------------------------------------------------------------------------------
def history(client: Client, table: str, limit: int = 50) -> list[dict]:
    """The last ``limit`` entries of ``table``'s history, oldest first: commits (``csn``,
    ``time``, ``kind``, ``rows_added``, ``rows_removed``, ``tid``, ``host``, ``user``: who began it,
    in a secured cluster, as long as the asked replica remembers its begin), its DDL and the
    aborts this replica remembers (``kind`` "abort", ``reason``)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= HISTORY_LIMIT:
        raise InvalidInput(f"limit must be an integer from 1 to {HISTORY_LIMIT}, not {quote(limit)}")
    described = client.describe_table(table)
    ddl = described.get("history") or []
    # Ask for the recent commits only (a long history is many events): a window of CSNs below the
    # snapshot, widened until it holds ``limit`` entries or reaches the start.
    span = 4 * limit
    while True:
        since = max(0, described["snapshot"] - span)
        entries = summarize(
            client.events(table, since_csn=since or None).to_pylist(), [h for h in ddl if h["csn"] > since]
        )
        if since == 0 or len(entries) >= limit:
            return entries[-limit:]
        span *= 4


def summarize(events: list[dict], ddl: list[dict]) -> list[dict]:
    """History entries from ``client.events`` rows and ``describe_table``'s ``history`` (pure)."""
    commits: dict[tuple[Any, Any], dict] = {}  # (CSN, tid) -> the commit's entry
    out: list[dict] = []
    users = {e.get("tid"): e.get("user") for e in events if e["event"] == "begin" and e.get("user")}
    for e in events:
        key = (e.get("csn"), e.get("tid"))
        if e["event"] == "commit":
            commits[key] = entry = _commit_entry(e, users.get(e["tid"]))
            out.append(entry)
        elif e["event"] == "part_removed" and key in commits:
            commits[key]["rows_removed"] += e.get("rows") or 0
        elif e["event"] == "rollback":
            out.append(_abort_entry(e))
    out.extend(_ddl_entry(h) for h in ddl)

    # An abort has no CSN: it goes after the last commit made before it (by time).
    timed = sorted((c["time"], c["csn"]) for c in commits.values() if c["time"] is not None)
    times, highest = [t for t, _ in timed], list(itertools.accumulate((csn for _, csn in timed), max))

    def order(entry: dict) -> tuple:
        if entry["csn"] is not None:
            return (entry["csn"], 0 if entry["kind"] in ("create", "alter") else 1)
        i = bisect.bisect_right(times, entry["time"]) if entry["time"] is not None else 0
        return (highest[i - 1] if i else 0, 2)

    return sorted(out, key=order)


def _commit_entry(e: dict, user: str | None) -> dict:
    """The history entry of a ``commit`` event (rows removed are added as its parts' removals come)."""
    kinds = [k for k in (e.get("kinds") or "").split(",") if k]
    return {
        "csn": e["csn"],
        "time": e.get("time"),
        "kind": ", ".join(KIND_NAMES.get(k, k.lower()) for k in kinds) or "empty",
        "rows_added": e.get("rows") or 0,
        "rows_removed": 0,
        "tid": e["tid"],
        "host": e.get("host"),
        "user": user,
        "reason": None,
    }


def _abort_entry(e: dict) -> dict:
    """The history entry of a ``rollback`` event."""
    return {
        "csn": None,
        "time": e.get("time"),
        "kind": "abort",
        "rows_added": 0,
        "rows_removed": 0,
        "tid": e.get("tid"),
        "host": e.get("host"),
        "user": e.get("user"),
        "reason": e.get("reason"),
    }


def _ddl_entry(h: dict) -> dict:
    """The history entry of a table's creation or alteration (from ``describe_table``'s ``history``)."""
    return {
        "csn": h["csn"],
        "time": None,
        "kind": "create" if h.get("what") == "created" else "alter",
        "rows_added": 0,
        "rows_removed": 0,
        "tid": None,
        "host": None,
        "user": None,
        "reason": None,
    }
