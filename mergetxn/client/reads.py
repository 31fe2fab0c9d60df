"""Reads: rows and datasets at a snapshot, scans by key range, pinned snapshots, changes and events."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from coordinator.core import deletions, errors, keyfold, keyranges, keytables
from coordinator.core.conflicts import Policy
from coordinator.core.errors import InvalidInput, clip, quote
from coordinator.core.tabledata import (
    CHANGE_COLUMNS,
    check_expression,
    partition_key,
)
from coordinator.model.catalog import TableDef
from mergetxn.client.base import TransactionBase
from mergetxn.client.checks import (
    timestamp_of,
)
from mergetxn.client.keyreads import KeysReads, part_may_match
from parts.io import keyscan, rewrite
from parts.io.dataset import snapshot_dataset, table_dataset
from parts.io.format import read_part
from parts.model.meta import PartMeta


def visible_args(table: str, snapshot: int | None, as_of: dt.datetime | None) -> dict[str, Any]:
    """The ``visible`` request of a read at the latest snapshot, ``snapshot`` or ``as_of``;
    InvalidInput for a snapshot that is not an integer or an as_of that is not an aware datetime."""
    args: dict[str, Any] = {"table": table}
    if snapshot is not None:
        if isinstance(snapshot, bool) or not isinstance(snapshot, int):
            raise InvalidInput(f"snapshot must be an integer CSN, not {quote(snapshot)}")
        args["snapshot"] = snapshot
    if as_of is not None:
        args["as_of"] = timestamp_of(as_of, "as_of")
    return args


def _exact_keys(cached: tuple[TableDef, int] | None, where: pc.Expression | None) -> list[tuple] | None:
    """``keytables.point_keys(where, ..., exact=True)`` under the cached definition of a keys
    table (None when there is none, or the filter is not only key equalities): parsed once for
    the hint and, when the definition still holds at the read's snapshot, for the read."""
    if cached is None or where is None or cached[0].conflict_policy is not Policy.KEYS:
        return None
    try:
        return keytables.point_keys(where, cached[0].schema, cached[0].primary_key, exact=True)
    except (InvalidInput, TypeError, ValueError, pa.ArrowException):
        return None


def _point_hint(
    cached: tuple[TableDef, int] | None, where: pc.Expression | None, exact: list[tuple] | None = None
) -> dict[str, Any]:
    """``point_hint`` for the ``visible`` request of a read of a keys table whose filter fixes
    whole keys (``keytables.point_hint``; from ``exact``, its :func:`_exact_keys`, when given),
    from the definition the client has cached: the replica prunes with it only where the table
    at the read's snapshot has the same key columns."""
    if cached is None or where is None or cached[0].conflict_policy is not Policy.KEYS:
        return {}
    try:
        hint = keytables.point_hint(where, cached[0].schema, cached[0].primary_key, found=exact)
    except (InvalidInput, TypeError, ValueError, pa.ArrowException):
        return {}
    return {} if hint is None else {"point_hint": hint}


class Reads(KeysReads):
    """The client's reads (a part of :class:`mergetxn.client.client.Client`)."""

    # -- reads -------------------------------------------------------------------------------
    def read(
        self,
        table: str,
        snapshot: int | None = None,
        as_of: dt.datetime | None = None,
        columns: Sequence[str] | None = None,
        where: pc.Expression | None = None,
    ) -> pa.Table:
        """Rows of ``table`` at the latest snapshot, at ``snapshot`` (a CSN), or ``as_of`` a time.

        Raises:
            InvalidInput: wrong columns or filter, no such table (TableNotFound), or a snapshot
                not retained (SnapshotUnavailable).
            CorruptPart: a part file does not match its checksum.
        """
        cached = self._tables.get(table)
        exact = _exact_keys(cached, where)
        hint = _point_hint(cached, where, exact)
        # A point read at the latest snapshot takes no lease (one round trip, no renewer thread):
        # the parts it lists were visible a moment ago, so the retention window keeps each one
        # ``retention_seconds`` after a commit removes it; past that (a table with no window),
        # a part cleanup took is CorruptPart below, then SnapshotUnavailable, and the read
        # starts over at the new latest snapshot, as a read whose lease lapsed does.
        lease = {"lease": "none"} if hint and snapshot is None and as_of is None else {}
        # Without a filter no key filter is used: the answer comes slim too (a replica from
        # before this ignores slim without a point hint and answers in full). A read of a keys
        # table that is not a point read goes by deletion vectors, when the replica has them.
        whole = not hint and where is None
        r = self._visible_pruned(
            visible_args(table, snapshot, as_of), hint, lease, slim=bool(hint) or whole, vectors=not hint
        )
        try:
            with self._leased(r):
                tdef = self._table_at(table, r["snapshot"], r.get("ddl"))
                return self._read_parts(
                    tdef,
                    [PartMeta.from_dict(m) for m in r["parts"]],
                    columns,
                    where,
                    r.get("csns"),
                    exact=exact if cached is not None and cached[0] is tdef else None,  # parsed for this tdef
                    vectors=r.get("vectors"),
                )
        except errors.CorruptPart:
            # Cleanup may have taken a part between the listing and the read (a lease that
            # lapsed). Ask again with the watermark read fresh: SnapshotUnavailable then says so;
            # a latest read starts over.
            try:
                self.call("visible", table=table, snapshot=r["snapshot"], fresh=True, lease="none")
            except errors.SnapshotUnavailable:
                if snapshot is None and as_of is None:
                    return self.read(table, columns=columns, where=where)
                raise
            raise

    def _visible_pruned(
        self,
        args: dict[str, Any],
        hint: dict[str, Any],
        lease: dict[str, Any],
        slim: bool = True,
        vectors: bool = False,
    ) -> dict:
        """``visible`` for a read; ``slim``: the parts come without their key filters, which the
        read does not need (a point read's replica pruned with them; a whole read folds every
        part): keytables.point_summary; ``vectors``: a keys table's parts come with their
        deletion vectors (replicas/vectors.py). A replica from before either refuses the field:
        asked again without it, and never again."""
        extra = {f: True for f, wanted in (("slim", slim), ("vectors", vectors)) if wanted and f not in self._refused}
        while True:
            try:
                return self.call("visible", **args, **hint, **lease, **extra)
            except InvalidInput as exc:
                field = exc.details.get("field")
                if field not in extra:
                    raise
                self._refused.add(field)
                del extra[field]

    @contextmanager
    def scan(
        self,
        table: str,
        snapshot: int | None = None,
        as_of: dt.datetime | None = None,
        memory_budget: int | None = None,
    ) -> Iterator[tuple[int, list[PartMeta], Iterator[pa.Table]]]:
        """Read ``table`` at one snapshot part by part, one part in memory at a time (the
        command line streams big tables so): yields ``(snapshot, parts, tables)``, ``tables``
        giving each part's rows in the table's schema. A keys table's rows (one per key: its
        parts less their deletion vectors, or its versions folded) come partition by partition
        and, within a partition bigger than ``memory_budget`` bytes (default 256 MiB) can read
        at once, key range by key range, each table sorted by key and the ranges in key order
        (``parts`` then counts versions). The snapshot stays leased until the block ends.

        Raises:
            InvalidInput: a wrong key range or filter, not a keys table, or no such table.
            CorruptPart: a part file read does not match its checksum.
        """
        # slim: no key filter is used (a scan folds or reads by vectors every part it lists)
        r = self._visible_pruned(visible_args(table, snapshot, as_of), {}, {}, slim=True, vectors=True)
        metas = [PartMeta.from_dict(m) for m in r["parts"]]
        budget = keyranges.DEFAULT_BUDGET if memory_budget is None else memory_budget

        def tables(tdef: TableDef) -> Iterator[pa.Table]:
            if tdef.conflict_policy is Policy.KEYS:  # a key lives in one partition: each alone
                by_partition: dict[str, list[PartMeta]] = {}
                for meta in metas:
                    by_partition.setdefault(partition_key(meta.partition), []).append(meta)
                for _, group in sorted(by_partition.items()):
                    yield from self._keys_by_range(tdef, group, r.get("csns") or {}, budget, r.get("vectors"))
                return
            for meta in metas:  # a part written for an older schema reads as the table is at the snapshot
                yield rewrite.read_parts(self.storage, [meta], table=tdef, cached=True)[0]

        with self._leased(r):
            yield r["snapshot"], metas, tables(self._table_at(table, r["snapshot"], r.get("ddl")))

    def _keys_by_range(
        self,
        tdef: TableDef,
        metas: list[PartMeta],
        csns: Mapping[str, int],
        budget: int,
        vectors: Mapping[str, str] | None = None,
    ) -> Iterator[pa.Table]:
        """One partition's rows folded key range by key range (coordinator/core/keyranges.py), so
        that each range's versions and their fold fit ``budget``: one pass over the parts reads
        their footers (decoded size) and a sample of the first key column, then each range reads
        every part restricted to it, minus the deletion ``vectors`` when the replica sent them
        (no fold), else folded. A partition that surely fits is one range, read as ``read``
        reads it."""
        # Partition columns are constant in a partition: ranges cut the first key column after them.
        column = next((k for k in tdef.primary_key if k not in tdef.partition_by), None)
        if column is None or keyranges.surely_fits(sum(m.size for m in metas), budget):
            if vectors is not None:
                yield self._read_minus_vectors(tdef, metas, None, vectors)
            else:
                yield self._read_keys(tdef, metas, None, None, csns)
            return
        total_rows = sum(m.rows for m in metas)
        most = keyranges.ranges_needed(sum(m.size for m in metas) * keyranges.EXPANSION, budget)
        decoded = 0
        samples = []
        for meta in metas:
            with keyscan.opened(self.storage, meta) as pf:
                decoded += keyscan.decoded_bytes(pf)
                samples.append(keyscan.sample_keys(pf, column, keyranges.sample_stride(meta.rows, total_rows, most)))
        count = keyranges.ranges_needed(decoded, budget)
        inner = keyranges.bounds(pa.chunked_array(samples, tdef.schema.field(column).type), count)
        del samples
        sent = (
            None if vectors is None else deletions.sent_vectors(tdef.name, vectors, [(m.name, m.rows) for m in metas])
        )
        for lo, hi in keyranges.spans(inner):
            if sent is not None:
                data = self._range_minus_vectors(tdef, metas, (column, lo, hi), sent)
            else:
                parts = [
                    (csns.get(m.name, keytables.OWN), keyscan.read_range(self.storage, m, column, lo, hi))
                    for m in metas
                ]
                data = keyfold.merge(tdef.schema, tdef.primary_key, parts)
                del parts
            if data.num_rows:
                yield data

    @contextmanager
    def pin(
        self, table: str, snapshot: int | None = None
    ) -> Iterator[tuple[TableDef, int, list[PartMeta], dict[str, int]]]:
        """The parts of ``table`` visible at ``snapshot`` (the latest by default) as files, for a
        copy of them (``mergetxn backup``): yields ``(definition, snapshot, parts, csns)``,
        ``csns`` each part's creation CSN (what orders a keys table's versions). The snapshot
        stays leased, so cleanup keeps every file, until the block ends.

        Raises:
            SnapshotUnavailable: the snapshot is no longer retained.
            QuotaExceeded: the user holds as many read leases as its quota allows.
        """
        r = self.call("visible", **visible_args(table, snapshot, None))
        with self._leased(r):
            tdef = self._table_at(table, r["snapshot"], r.get("ddl"))
            metas = [PartMeta.from_dict(m) for m in r["parts"]]
            try:
                csns = {str(k): int(v) for k, v in (r.get("csns") or {}).items()}
            except (AttributeError, TypeError, ValueError):
                raise errors.CorruptMetadata(
                    f"replica {self.address} answered creation CSNs that do not parse"
                ) from None
            yield tdef, r["snapshot"], metas, csns

    @contextmanager
    def dataset(
        self, table: str, snapshot: int | None = None, as_of: dt.datetime | None = None
    ) -> Iterator[ds.Dataset]:
        """``table`` at the latest snapshot, at ``snapshot`` or ``as_of`` as a
        ``pyarrow.dataset.Dataset`` for DuckDB, Polars and other Arrow engines: the rows ``read``
        returns, each part a fragment with its partition expression and footer statistics (a
        filter skips parts unread); a keys table's live rows (one per key) in memory, its parts minus
        their deletion vectors or, without them, the fold. Engines read
        the files lazily, so the snapshot stays leased (cleanup keeps them) until the block ends.

        Raises:
            InvalidInput: no such table (TableNotFound), or a snapshot not retained (SnapshotUnavailable).
        """
        latest = snapshot is None and as_of is None
        for attempt in range(2):
            # slim: a dataset uses no key filter (a keys table's is read by vectors or folded whole)
            r = self._visible_pruned(visible_args(table, snapshot, as_of), {}, {}, slim=True, vectors=True)
            with self._leased(r):
                tdef = self._table_at(table, r["snapshot"], r.get("ddl"))
                try:
                    metas = [PartMeta.from_dict(m) for m in r["parts"]]
                    built = self._dataset(tdef, metas, r.get("csns"), r.get("vectors"))
                except errors.CorruptPart:
                    # As in read: a part taken by cleanup after a lapsed lease is SnapshotUnavailable
                    # (a latest snapshot starts over once); anything else is the file's fault.
                    try:
                        self.call("visible", table=table, snapshot=r["snapshot"], fresh=True, lease="none")
                    except errors.SnapshotUnavailable:
                        if latest and attempt == 0:
                            continue
                        raise
                    raise
                yield built
                return

    def snapshot(self) -> int:
        """The replica's snapshot version: everything up to it is applied there."""
        return self.call("snapshot")["snapshot"]

    def wait_for(self, snapshot: int) -> None:
        """Return once this client's replica has applied ``snapshot`` (a CSN).

        Raises:
            InvalidInput: ``snapshot`` is not a CSN.
            ReplicaUnavailable: the replica did not apply it in time.
        """
        self.call("wait", snapshot=snapshot)

    def changes(self, table: str, start: Any, end: Any = None, by: str = "id", compactions: bool = True) -> pa.Table:
        """Rows of the parts added and removed by the commits whose version is in (start, end]:
        CSNs for ``by="id"`` (compactions included), aware datetimes for ``by="time"`` (compaction
        commits have no time version and never appear). The table's columns plus ``_change``
        ("insert" or "delete") and ``_csn``, in commit order, deletes before inserts.
        ``compactions=False`` by id leaves out what by time leaves out, with CSN bounds (a stream
        of changes by time whose offsets are CSNs).

        Raises:
            InvalidInput: a wrong range or ``by``, or no such table.
            SnapshotUnavailable: the range starts before what is retained.
        """
        if by not in ("id", "time"):
            raise InvalidInput(f"by must be 'id' or 'time', not {quote(by)}")
        extra = {} if compactions else {"compactions": False}
        if by == "time":
            lo: Any = timestamp_of(start, "start")
            hi: Any = None if end is None else timestamp_of(end, "end")
        else:
            for what, v in (("start", start), ("end", end)):
                if (v is not None or what == "start") and (isinstance(v, bool) or not isinstance(v, int)):
                    raise InvalidInput(f"changes by id: {what} must be an integer CSN, not {quote(v)}")
            lo, hi = start, end
        r = self.call("changes", table=table, start=lo, end=hi, by=by, **extra)
        # the schema at the end of the range (the latest when it is open, or by time)
        tdef = self._table_at(table, hi if by == "id" and hi is not None else None, None)
        drops = self._check_drops(tdef, r)
        clash = [c for c in CHANGE_COLUMNS if c in tdef.schema.names]
        if clash:  # a table created before the names were reserved
            with self._leased(r):
                raise InvalidInput(
                    f"changes of {quote(table)}: the table has column(s) {clash}, the names changes "
                    "gives its own columns; rename them (alter_table rename_columns)",
                    table=table,
                )
        if tdef.conflict_policy is Policy.KEYS:
            with self._leased(r):
                return self._key_changes(tdef, r, drops)
        metas = [PartMeta.from_dict(p["part"]) for p in r["parts"]]
        try:
            with self._leased(r):
                datas = rewrite.read_parts(self.storage, metas, table=tdef, cached=True)
        except errors.CorruptPart:  # collected meanwhile?
            self.call("changes", table=table, start=lo, end=hi, by=by, fresh=True, lease="none", **extra)
            raise
        schema = tdef.schema.append(pa.field("_change", pa.string())).append(pa.field("_csn", pa.int64()))
        pieces = []
        for p, data in zip(r["parts"], datas):
            n = data.num_rows
            data = data.append_column(schema.field("_change"), pa.array([p["change"]] * n, pa.string()))
            pieces.append(data.append_column(schema.field("_csn"), pa.array([p["csn"]] * n, pa.int64())))
        return pa.concat_tables(pieces) if pieces else schema.empty_table()

    def _drops(self, r: dict) -> list[int]:
        """The CSNs of the drops a ``changes`` answer names in its range (CorruptMetadata if they
        are not CSNs; none from a replica that does not name them)."""
        dropped = r.get("dropped") or []
        if not isinstance(dropped, list) or not all(type(d) is int and d > 0 for d in dropped):
            raise errors.CorruptMetadata(f"replica {self.address} answered drops that are not CSNs: {clip(dropped)}")
        return dropped

    def _check_drops(self, tdef: TableDef, r: dict) -> list[int]:
        """InvalidInput, the answer's lease let go, when the range of ``changes`` answer ``r``
        reaches back past a drop of the table into one of its name with another definition:
        their rows are not one table's (the same definition: a drop deletes every row). The
        drops' CSNs."""
        try:
            shapes = [(d, _shape(self._table_at(tdef.name, d - 1, None))) for d in self._drops(r)]
        except BaseException:
            with self._leased(r):
                raise
        for dropped, shape in shapes:
            if shape != _shape(tdef):
                with self._leased(r):
                    raise InvalidInput(
                        f"changes of {quote(tdef.name)}: the range reaches back past its drop at CSN {dropped} into "
                        "a table of the same name with another definition; ask for the changes from that CSN on, "
                        "or up to the one before it",
                        table=tdef.name,
                        dropped=dropped,
                    )
        return [d for d, _ in shapes]

    def _key_changes(self, tdef: TableDef, r: dict, drops: list[int]) -> pa.Table:
        """``changes`` of a keys table: row changes per key (:func:`keyfold.row_changes`) from the
        versions the commits in the range wrote, folded onto the rows those keys had at the
        snapshot before the first of them (which the answer's lease holds). A compaction's output
        is left out: it writes no new version (:func:`keytables.folded`)."""
        added: dict[int, list[PartMeta]] = {}
        for p in r["parts"]:
            meta = PartMeta.from_dict(p["part"])
            if p["change"] == "insert" and not keytables.folded(meta):
                added.setdefault(p["csn"], []).append(meta)
        versions = {csn: [read_part(self.storage, m) for m in metas] for csn, metas in added.items()}
        for dropped in drops:  # a drop deletes every row the table had
            live = self.read(tdef.name, dropped - 1, columns=list(tdef.primary_key))
            if live.num_rows:
                pk, delete = tdef.primary_key, keytables.DELETE
                versions[dropped] = [keytables.versions(tdef.schema, pk, tdef.name, live, delete, 0)]
        if not versions:
            return keytables.changes_schema(tdef.schema).empty_table()
        commits = sorted(versions.items())
        written = pa.concat_tables([t.select(list(tdef.primary_key)) for _, ts in commits for t in ts])
        first = commits[0][0]
        before = self.read(
            tdef.name, snapshot=first - 1, where=keytables.keys_filter(tdef.primary_key, tdef.schema, written)
        )
        return keyfold.row_changes(tdef.schema, tdef.primary_key, before, commits)

    def events(self, table: str | None = None, since_csn: int | None = None) -> pa.Table:
        """The event log (like ClickHouse's transactions_info_log): commit, part_added and
        part_removed from the log, begin, rollback and merge from this replica's bounded ring
        (``user``: who began the transaction, in a secured cluster).

        Raises:
            InvalidInput: ``since_csn`` is not a CSN.
        """
        rows = self.call("events", table=table, since_csn=since_csn)
        schema = pa.schema(
            [
                ("time", pa.timestamp("us", tz="UTC")),
                ("event", pa.string()),
                ("table", pa.string()),
                ("tid", pa.string()),
                ("csn", pa.int64()),
                ("snapshot", pa.int64()),
                ("part", pa.string()),
                ("partition", pa.string()),
                ("rows", pa.int64()),
                ("kinds", pa.string()),
                ("outcome", pa.string()),
                ("reason", pa.string()),
                ("host", pa.string()),
                ("user", pa.string()),
            ]
        )
        for row in rows:
            t = row.get("time")
            row["time"] = None if t is None else dt.datetime.fromtimestamp(t, dt.UTC)
        return pa.Table.from_pylist(rows, schema=schema)

    def _dataset(
        self,
        tdef: TableDef,
        metas: list[PartMeta],
        csns: Mapping[str, int] | None,
        vectors: Mapping[str, str] | None = None,
    ) -> ds.Dataset:
        """The dataset of ``metas``; a keys table's live rows (one per key) in memory: its parts
        minus their deletion ``vectors`` when the replica sent them, else the fold."""
        if tdef.conflict_policy is Policy.KEYS:
            if vectors is not None and all(m.name in (csns or {}) for m in metas):
                return self._keys_dataset(tdef, metas, vectors)
            # a transaction's own parts among them, or no vectors: the rows read, in memory
            return table_dataset(tdef, self._read_parts(tdef, metas, None, None, csns, vectors=vectors))
        return snapshot_dataset(self.storage, tdef, metas, cached=True)

    @contextmanager
    def _leased(self, answer: dict) -> Iterator[None]:
        """Keep the read lease named in a replica's ``answer`` (``visible``, ``changes``) while
        the files are read, renewing it every third of its lapse time, then release it, also on
        error: once the read has returned its snapshot is no longer in use."""
        lease = answer.get("lease")
        if lease is None:
            yield
            return
        done = threading.Event()

        def renew() -> None:
            try:
                while not done.wait(answer.get("lease_seconds", 30.0) / 3):
                    if not self.call("renew", lease=lease)["renewed"]:
                        return
            except errors.MergetxnError:
                return  # the lease lapses; a part cleanup takes meanwhile is reported by the read
            finally:
                self._rpc.drop_connection()  # this thread's connection, if it opened one

        renewer = threading.Thread(target=renew, name=f"lease-{lease[:8]}", daemon=True)
        renewer.start()
        try:
            yield
        finally:
            done.set()
            try:
                self.call("release", lease=lease)
            except errors.MergetxnError:
                pass  # it lapses on its own

    def _read_parts(
        self,
        tdef: TableDef,
        metas: list[PartMeta],
        columns: Sequence[str] | None,
        where: pc.Expression | None,
        csns: Mapping[str, int] | None = None,
        exact: list[tuple] | None = None,
        vectors: Mapping[str, str] | None = None,
    ) -> pa.Table:
        """Rows of ``metas`` under ``tdef`` (parts written for an older schema read as it is now).
        A keys table's parts are versions folded to one row per key (:func:`keyfold.merge`), in the
        order of ``csns`` (part name -> creation CSN; a part without one is the reader's own),
        or, for a whole read the replica sent ``vectors`` for, its parts minus their deletion
        vectors. ``exact``: ``keytables.point_keys(where, ..., exact=True)`` under ``tdef``,
        when the caller has it (not parsed again)."""
        table = tdef.name
        if columns is not None:
            missing = [c for c in columns if c not in tdef.schema.names]
            if missing:
                raise InvalidInput(f"table {quote(table)} has no column(s) {quote(missing)}")
        if tdef.conflict_policy is Policy.KEYS:
            if vectors is not None and any(m.name not in (csns or {}) for m in metas):
                return self._read_own_over_vectors(tdef, metas, csns or {}, vectors, columns=columns, where=where)
            if vectors is not None:
                return self._read_minus_vectors(tdef, metas, columns, vectors, where)
            return self._read_keys(tdef, metas, columns, where, csns or {}, exact)
        if where is not None:
            check_expression(where, tdef.schema, f"filter on {quote(table)}")
            metas = [m for m in metas if part_may_match(tdef, m, where)]
        data = rewrite.joined(metas, rewrite.read_parts(self.storage, metas, table=tdef, cached=True), tdef.schema)
        if where is not None:
            data = data.filter(where)
        if columns is not None:
            data = data.select(list(columns))
        return data


class TransactionReads(TransactionBase):
    """A transaction's reads at its snapshot with its own writes (a part of :class:`Transaction`)."""

    def _visible_csns(
        self, table: str, pkeys: list[tuple] | None = None, hint: Mapping[str, Any] | None = None
    ) -> tuple[list[PartMeta], dict[str, int]]:
        """The parts visible to this transaction (in ``pkeys``, when given; only those that may
        hold the keys of a point read's ``hint``) and the creation CSN of each committed one
        (its own parts have none)."""
        args: dict[str, Any] = {"table": table, "id": self.id, **(hint or {})}
        if hint:
            args["slim"] = True  # pruned by the replica: the summaries come without their filters
        if pkeys is not None:
            args["partitions"] = [list(p) for p in pkeys]
        r = self.client.call("visible", **args)
        return [PartMeta.from_dict(m) for m in r["parts"]], r.get("csns") or {}

    def _visible_whole(self, table: str) -> tuple[list[PartMeta], dict[str, int], dict[str, str] | None]:
        """What :meth:`_visible_csns` gives for a whole read, with the deletion vectors of a keys
        table's committed parts at this transaction's snapshot when its replica has them (None:
        the read folds; a replica from before vectors refuses the field and is asked without)."""
        try:
            r = self.client.call("visible", table=table, id=self.id, vectors=True)
        except InvalidInput as exc:
            if exc.details.get("field") != "vectors":
                raise
            r = self.client.call("visible", table=table, id=self.id)
        return [PartMeta.from_dict(m) for m in r["parts"]], r.get("csns") or {}, r.get("vectors")

    def _visible(self, table: str, pkeys: list[tuple] | None = None) -> list[PartMeta]:
        return self._visible_csns(table, pkeys)[0]

    def read(self, table: str, columns: Sequence[str] | None = None, where: pc.Expression | None = None) -> pa.Table:
        """Rows at this transaction's snapshot, with its own writes; begun with
        ``atomicity="none"``: the latest state its replica applied at the time of the read,
        with its own writes (non-atomic transactions read the latest data:
        docs/rules.md#atomicity-and-durability).

        Raises:
            InvalidInput: wrong columns or filter, or no such table.
            TransactionAborted: the transaction has ended.
            CorruptPart: a part file does not match its checksum.
        """
        self._check_open()
        tdef = self.table(table)
        hint = _point_hint((tdef, 0), where)
        vectors = None
        if hint:
            metas, csns = self._visible_csns(table, hint=hint)
        else:
            metas, csns, vectors = self._visible_whole(table)
        self._record_read(tdef, where)
        return self._rows(tdef, metas, csns, columns, where, vectors)

    def _rows(
        self,
        tdef: TableDef,
        metas: list[PartMeta],
        csns: Mapping[str, int],
        columns: Sequence[str] | None,
        where: pc.Expression | None,
        vectors: Mapping[str, str] | None = None,
    ) -> pa.Table:
        """The rows of ``metas`` (listed by :meth:`_visible_csns`, with ``vectors`` by
        :meth:`_visible_whole`) as this transaction reads them."""
        return self.client._read_parts(tdef, metas, columns, where, csns, vectors=vectors)

    def _current(self, tdef: TableDef, keys: pa.Table, columns: Sequence[str]) -> pa.Table:
        """The rows of keys table ``tdef`` with the keys of ``keys`` (its key columns and
        ``columns``) at this transaction's snapshot with its own writes, not recorded as a read
        (what an update-mode write keeps in the columns it does not write: the conflict rules
        look at the columns it writes, as before)."""
        where = keytables.keys_where(tdef.primary_key, tdef.schema, keys)
        metas, csns = self._visible_csns(tdef.name, hint=_point_hint((tdef, 0), where))
        return self._rows(tdef, metas, csns, [*tdef.primary_key, *columns], where)

    @contextmanager
    def dataset(self, table: str) -> Iterator[ds.Dataset]:
        """This transaction's view of ``table`` (its snapshot plus its own writes) as a
        ``pyarrow.dataset.Dataset``, as ``client.dataset`` gives one; a serializable transaction
        records it as a read of the whole table. The running transaction keeps its snapshot (and
        its own files) in use, so no lease is taken; use it before the transaction ends.

        Raises:
            TableNotFound: no such table at its snapshot.
            TransactionAborted: the transaction has ended.
        """
        self._check_open()
        tdef = self.table(table)
        metas, csns, vectors = self._visible_whole(table)
        self._record_read(tdef, None)
        yield self.client._dataset(tdef, metas, csns, vectors)


def _shape(tdef: TableDef) -> tuple:
    """What rows of two tables of one name must share to be told as one table's changes."""
    return (tdef.schema, tdef.primary_key, tdef.partition_by, tdef.conflict_policy)
