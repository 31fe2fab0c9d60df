"""Every engine reads it (docs/surface.md#reads-history-and-operations):
``client.dataset`` and ``tx.dataset`` as ``pyarrow.dataset.Dataset``s, read by pyarrow, DuckDB and
Polars, against real ZooKeeper and two real replica processes; the guide's engine snippets
(docs/how-to: DuckDB, Polars, pandas) run as written.

``cluster``: nothing in the background (merges and cleanup only when asked), read leases lapsing
after 1 s (so a dataset block that outlives that is kept only by the renewal).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
from support.cluster import make_cluster  # tests/ is on sys.path
from support.waiting import wait_until

from coordinator import LocalCluster
from coordinator.errors import (
    CorruptPart,
    InvalidInput,
    SnapshotUnavailable,
    TableNotFound,
    TransactionAborted,
)
from coordinator.model.catalog import TableDef
from mergetxn.client import Client
from mergetxn.local.zkserver import ZooKeeperServer
from parts.io.dataset import duckdb_view, snapshot_dataset
from parts.io.format import read_part, write_part
from parts.io.storage import Storage

ENGINE_PAGES = [
    Path(__file__).resolve().parents[2] / "docs" / "how-to" / f"{p}.md" for p in ("duckdb", "polars", "pandas")
]
UTC = dt.UTC
# Partitioned by a date and a nullable string; a timestamp, a float, a bool and a string besides.
WIDE = pa.schema(
    [
        pa.field("day", pa.date32()),
        pa.field("region", pa.string()),
        pa.field("id", pa.int64(), nullable=False),
        pa.field("at", pa.timestamp("us", tz="UTC")),
        pa.field("x", pa.float64()),
        pa.field("ok", pa.bool_()),
        pa.field("s", pa.string()),
    ]
)
DAYS = [dt.date(2024, 6, d) for d in (1, 2, 3)]
LEASE_SECONDS = 1  # a read lease not renewed lapses after this


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: ZooKeeperServer) -> Iterator[LocalCluster]:
    with make_cluster(
        tmp_path_factory,
        zk_server,
        "datasets",
        replicas=2,
        settings={
            # inline_rows 0: these tests follow the datasets' file fragments and DuckDB's own Parquet reader (docs/architecture/small-writes.md)
            "inline_rows": 0,
            "merge_interval": 0,
            "gc_interval": 0,
            "read_lease_seconds": LEASE_SECONDS,
        },
    ) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    c = cluster.client(0)
    yield c
    c.close()


def wide_rows(start: int, n: int, day: dt.date, region: str | None) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table(
        {
            "day": [day] * n,
            "region": [region] * n,
            "id": ids,
            "at": [dt.datetime(2024, 6, 1, tzinfo=UTC) + dt.timedelta(seconds=i) for i in ids],
            "x": [i / 4 for i in ids],
            "ok": [i % 2 == 0 for i in ids],
            "s": [None if i % 5 == 0 else f"s{i}" for i in ids],
        },
        schema=WIDE,
    )


def commit(c: Client, table: str, data: pa.Table) -> int:
    with c.transaction() as tx:
        tx.insert(table, data)
    return tx.csn


def ordered(t: pa.Table) -> pa.Table:
    return t.sort_by([(t.schema.names[0], "ascending"), ("id", "ascending")]) if "id" in t.schema.names else t


def same_rows(a: pa.Table, b: pa.Table) -> None:
    """The same columns, types and rows (in any order)."""
    assert a.schema == b.schema
    assert ordered(a).to_pylist() == ordered(b).to_pylist()


def files(cluster: LocalCluster, table: str) -> set[str]:
    root = Path(cluster.storage_url)
    return {str(p.relative_to(root)) for p in (root / table).rglob("*.parquet")}


# -- the rows, the schema, the fragments ----------------------------------------------------------
def test_a_dataset_holds_what_read_returns_at_the_latest_and_an_older_snapshot(client: Client) -> None:
    """Same columns, types and rows as ``client.read``, a null partition value, an overwrite and a
    column added by ``alter_table`` (older parts read it as null) included; an older snapshot its
    own rows and schema."""
    t = "ds_wide"
    client.create_table(t, WIDE, partition_by=["day", "region"], auto_merge=False)
    commit(client, t, pa.concat_tables([wide_rows(0, 5, DAYS[0], "eu"), wide_rows(5, 4, DAYS[1], None)]))
    older = commit(client, t, wide_rows(9, 3, DAYS[2], "us"))
    with client.transaction() as tx:
        tx.overwrite(t, wide_rows(20, 2, DAYS[0], "eu"))
    client.alter_table(t, add_columns=[pa.field("note", pa.string())])
    with client.transaction() as tx:
        tx.insert(t, wide_rows(30, 2, DAYS[1], "eu").append_column("note", pa.array(["a", "b"])))
    for snapshot in (None, older):
        expected = client.read(t, snapshot=snapshot)
        with client.dataset(t, snapshot=snapshot) as d:
            assert isinstance(d, ds.Dataset)
            same_rows(d.to_table(), expected)
    with client.dataset(t) as d:
        assert len(list(d.get_fragments())) == len([p for p in client.parts(t).to_pylist() if p["visible"]]) == 4
        assert d.to_table().column("note").null_count == 9  # the older parts lack it
    with client.dataset(t, as_of=dt.datetime.now(UTC)) as d:
        same_rows(d.to_table(), client.read(t))


def test_a_filter_on_a_partition_column_selects_fewer_fragments(client: Client) -> None:
    """Pruning: each part a fragment with its partition expression, so a filter on a partition
    column selects the fragments of that partition only, and the rows equal a filtered read."""
    t = "ds_prune"
    client.create_table(t, WIDE, partition_by=["day", "region"], auto_merge=False)
    for i, day in enumerate(DAYS):
        for j in range(2):
            commit(client, t, wide_rows(100 * i + 10 * j, 3, day, "eu" if j else None))
    with client.dataset(t) as d:
        assert len(list(d.get_fragments())) == 6
        one_day = pc.field("day") == DAYS[1]
        assert len(list(d.get_fragments(filter=one_day))) == 2
        assert len(list(d.get_fragments(filter=one_day & pc.field("region").is_null()))) == 1
        assert len(list(d.get_fragments(filter=pc.field("day") > DAYS[2]))) == 0
        for f in d.get_fragments():
            assert f.row_groups[0].statistics["id"]["min"] <= f.row_groups[0].statistics["id"]["max"]  # footer stats
        same_rows(d.to_table(filter=one_day), client.read(t, where=one_day))


def test_a_renamed_column_reads_under_its_new_name(client: Client) -> None:
    """Parts written before a rename name the column otherwise: they are upgraded in memory and
    joined to the file fragments; the rows equal ``read`` at both snapshots."""
    t = "ds_rename"
    schema = pa.schema([("p", pa.int64()), ("id", pa.int64()), ("old", pa.string())])
    client.create_table(t, schema, partition_by=["p"], auto_merge=False)
    before = commit(client, t, pa.table({"p": [1, 1, 2], "id": [1, 2, 3], "old": ["a", "b", "c"]}, schema=schema))
    client.alter_table(t, rename_columns={"old": "new"})
    commit(client, t, pa.table({"p": [2], "id": [4], "new": ["d"]}))
    with client.dataset(t) as d:
        assert d.schema.names == ["p", "id", "new"]
        same_rows(d.to_table(), client.read(t))
        assert sorted(d.to_table(filter=pc.field("p") == 2).column("new").to_pylist()) == ["c", "d"]
    with client.dataset(t, snapshot=before) as d:
        same_rows(d.to_table(), client.read(t, snapshot=before))


def test_a_keys_table_gives_one_row_per_key(client: Client) -> None:
    """Keys tables fold: versions of a key in several parts give its latest row, deleted keys none."""
    t = "ds_keys"
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), ("a", pa.string()), ("b", pa.int64())])
    client.create_table(t, schema, primary_key=["k"], conflict_policy="keys", auto_merge=False)
    with client.transaction() as tx:
        tx.insert(t, pa.table({"k": [1, 2, 3], "a": ["x", "y", "z"]}))
    first = tx.csn
    with client.transaction() as tx:
        tx.upsert(t, pa.table({"k": [1], "b": [5]}), update=True)
        tx.delete_keys(t, pa.table({"k": pa.array([2], pa.int64())}))
    with client.dataset(t) as d:
        got = d.to_table()
        same_rows(got, client.read(t))
        assert sorted(got.column("k").to_pylist()) == [1, 3]
        assert got.filter(pc.field("k") == 1).to_pylist() == [{"k": 1, "a": "x", "b": 5}]
    with client.dataset(t, snapshot=first) as d:
        same_rows(d.to_table(), client.read(t, snapshot=first))


def test_a_transactions_dataset_has_its_own_writes_and_not_later_commits(cluster: LocalCluster, client: Client) -> None:
    t = "ds_tx"
    client.create_table(t, WIDE, partition_by=["day", "region"], auto_merge=False)
    commit(client, t, wide_rows(0, 3, DAYS[0], "eu"))
    tx = client.begin()
    tx.insert(t, wide_rows(10, 2, DAYS[1], "eu"))
    tx.delete(t, pc.field("id") == 1)
    with cluster.client(1) as other:
        commit(other, t, wide_rows(50, 4, DAYS[2], "us"))  # after the snapshot: not in its view
    with tx.dataset(t) as d:
        same_rows(d.to_table(), tx.read(t))
        assert sorted(d.to_table().column("id").to_pylist()) == [0, 2, 10, 11]
        con = duckdb.connect()
        con.register("v", d)
        assert con.sql("SELECT count(*) FROM v WHERE day = DATE '2024-06-02'").fetchall() == [(2,)]
    tx.rollback()
    with pytest.raises(TransactionAborted, match="has ended"):
        with tx.dataset(t):
            pass


# -- the snapshot in use --------------------------------------------------------------------------
def test_the_snapshot_is_held_until_the_block_ends(cluster: LocalCluster, client: Client) -> None:
    """On a table with no history window, a major compaction and an overwrite beside the block,
    then cleanup passes, leave every file the dataset names: DuckDB still reads the old rows,
    long after a lease would have lapsed unrenewed (1 s). Once the block ends cleanup takes them."""
    t = "ds_held"
    client.create_table(t, WIDE, partition_by=["day", "region"], retention_seconds=0, auto_merge=False)
    for i in range(3):
        commit(client, t, wide_rows(10 * i, 4, DAYS[0], "eu"))
    expected = client.read(t)
    with client.dataset(t) as d, cluster.client(1) as other:
        opened = time.monotonic()
        names = set(d.files)
        assert len(names) == 3
        client.compact(t, kind="major")
        with client.transaction() as tx:
            tx.overwrite(t, wide_rows(99, 1, DAYS[0], "eu"))
        other.wait_for(tx.csn)

        def past_it() -> bool:  # only the dataset's lease keeps the old snapshot in use now,
            in_use = client.gc(grace_seconds=0)["snapshots_in_use"]  # and only by its renewals
            return (
                all(u["snapshot"] >= tx.csn for u in in_use if u["holder"] == "replica snapshot")
                and time.monotonic() - opened > 3 * LEASE_SECONDS
            )

        wait_until(past_it, what="every replica's snapshot past the overwrite, the lease renewed")
        client.gc(grace_seconds=0)
        assert all(os.path.exists(f) for f in names)
        con = duckdb.connect()
        con.register("held", d)
        assert con.sql("SELECT count(*), sum(id) FROM held").fetchall() == [
            (12, sum(expected.column("id").to_pylist()))
        ]

    def collected() -> bool:
        client.gc(grace_seconds=0)
        return not any(os.path.exists(f) for f in names)

    wait_until(collected, what="the files collected once the block ended")


# -- bad input ------------------------------------------------------------------------------------
def test_bad_input_raises_what_read_raises(client: Client) -> None:
    t = "ds_bad"
    client.create_table(t, WIDE, partition_by=["day", "region"], retention_seconds=0, auto_merge=False)
    old = commit(client, t, wide_rows(0, 2, DAYS[0], "eu"))
    with client.transaction() as tx:
        tx.overwrite(t, wide_rows(5, 1, DAYS[0], "eu"))
    wait_until(
        lambda: [r for r in client.gc(grace_seconds=0)["removed"] if r["table"] == t],
        30,
        "the overwritten part collected",
    )
    cases = [
        ({"table": "ds_no_such_table"}, TableNotFound),
        ({"table": "../etc"}, InvalidInput),
        ({"table": t, "snapshot": "7"}, InvalidInput),
        ({"table": t, "snapshot": True}, InvalidInput),
        ({"table": t, "as_of": dt.datetime(2024, 1, 1)}, InvalidInput),  # naive
        ({"table": t, "snapshot": old}, SnapshotUnavailable),
    ]
    for args, error in cases:
        with pytest.raises(error) as from_read:
            client.read(**args)
        with pytest.raises(error) as from_dataset:
            with client.dataset(**args):
                pytest.fail("a dataset of bad input")
        # the same refusal; argument checks name the call they refused (client.read: / client.dataset:)
        assert str(from_dataset.value).removeprefix("client.dataset: ") == str(from_read.value).removeprefix(
            "client.read: "
        )


def test_a_part_file_unlike_its_commit_is_corrupt_part_naming_it(tmp_path: Path) -> None:
    """Files are checked against the commit's record (present, its size) before an engine sees them."""
    storage = Storage(str(tmp_path))
    tdef = TableDef.new("ds_corrupt", WIDE, ("day", "region"), (), "parts", True, None, "full", None, None, None)
    good = write_part(storage, tdef.name, ["day", "region"], (DAYS[0], "eu"), wide_rows(0, 3, DAYS[0], "eu"), "T1-1-h")
    bad = write_part(storage, tdef.name, ["day", "region"], (DAYS[1], "eu"), wide_rows(5, 3, DAYS[1], "eu"), "T1-1-h")
    same_rows(
        snapshot_dataset(storage, tdef, [good, bad]).to_table(),
        pa.concat_tables([read_part(storage, good), read_part(storage, bad)]),
    )
    assert snapshot_dataset(storage, tdef, []).to_table() == WIDE.empty_table()  # no parts: no rows
    path = storage.arrow_path(bad.path)
    with open(path, "rb") as f:
        raw = f.read()
    with open(path, "wb") as f:
        f.write(raw[: len(raw) // 2])
    with pytest.raises(CorruptPart, match=re.escape(bad.path)):
        snapshot_dataset(storage, tdef, [good, bad])
    os.remove(path)
    with pytest.raises(CorruptPart, match=re.escape(bad.path) + ".* missing"):
        snapshot_dataset(storage, tdef, [good, bad])


# -- engines --------------------------------------------------------------------------------------
def test_duckdb_and_polars_query_it_with_pushdown(client: Client) -> None:
    """DuckDB (registered, SQL with a WHERE on a partition column and an aggregate) and Polars
    (``scan_pyarrow_dataset`` with a filter) answer what pyarrow computes from ``read``."""
    t = "ds_engines"
    client.create_table(t, WIDE, partition_by=["day", "region"], auto_merge=False)
    for i, day in enumerate(DAYS):
        commit(client, t, pa.concat_tables([wide_rows(100 * i, 7, day, "eu"), wide_rows(100 * i + 50, 3, day, "us")]))
    whole = client.read(t)
    want = whole.filter((pc.field("day") == DAYS[1]) & (pc.field("region") == "eu"))
    with client.dataset(t) as d:
        con = duckdb.connect()
        con.register("events", d)
        got = con.sql("SELECT count(*), sum(id), max(x) FROM events WHERE day = DATE '2024-06-02' AND region = 'eu'")
        assert got.fetchall() == [(7, sum(want.column("id").to_pylist()), max(want.column("x").to_pylist()))]
        per_day = con.sql("SELECT day, count(*) FROM events GROUP BY day ORDER BY day").fetchall()
        assert per_day == [(day, 10) for day in DAYS]
        frame = pl.scan_pyarrow_dataset(d).filter((pl.col("day") == DAYS[2]) & (pl.col("ok"))).select("id").collect()
        expected = whole.filter((pc.field("day") == DAYS[2]) & pc.field("ok")).column("id").to_pylist()
        assert sorted(frame["id"].to_list()) == sorted(expected)


def test_duckdb_view_reads_with_duckdbs_own_reader_what_register_reads(client: Client) -> None:
    """``duckdb_view``: the same rows and DuckDB types as ``con.register``, DuckDB's Parquet reader
    running over the local part files (and pruning files by the filter): of a plain table, of
    tables altered since some or all of their parts were written (the added column null there:
    DuckDB alone cannot bind a column no file holds), beside the rows a dataset holds in memory
    (parts written before a rename), and of a keys table whose parts hold no deleted row; a keys
    table with a superseded row is its live rows in memory."""
    plain, altered, lacking, renamed = "ds_view", "ds_view_altered", "ds_view_lacking", "ds_view_renamed"
    keyed, upserted = "ds_view_keys", "ds_view_upserted"
    for t in (plain, altered, lacking, renamed):
        client.create_table(t, WIDE, partition_by=["day", "region"], auto_merge=False)
        for i, day in enumerate(DAYS):
            commit(client, t, wide_rows(10 * i, 4, day, "eu" if i else None))
    for t in (altered, lacking):
        client.alter_table(t, add_columns=[pa.field("note", pa.string())])
    commit(client, altered, wide_rows(90, 2, DAYS[0], "us").append_column("note", pa.array(["n1", "n2"])))
    client.alter_table(renamed, rename_columns={"s": "label"})
    commit(client, renamed, wide_rows(90, 2, DAYS[1], "us").rename_columns([*WIDE.names[:-1], "label"]))
    for t in (keyed, upserted):
        client.create_table(
            t,
            pa.schema([pa.field("k", pa.int64(), nullable=False), ("a", pa.string())]),
            primary_key=["k"],
            conflict_policy="keys",
            auto_merge=False,
        )
        commit(client, t, pa.table({"k": [1, 2], "a": ["x", "y"]}))
    with client.transaction() as tx:
        tx.upsert(upserted, pa.table({"k": [2, 3], "a": ["z", "w"]}))
    query = "SELECT * FROM {} WHERE day = DATE '2024-06-02' ORDER BY id"
    keys_rows = {keyed: [(1, "x"), (2, "y")], upserted: [(1, "x"), (2, "z"), (3, "w")]}
    for t in (plain, altered, lacking, renamed, keyed, upserted):
        with client.dataset(t) as d:
            con = duckdb.connect()
            con.register("arrow", d)
            duckdb_view(con, "native", d)
            assert con.sql("DESCRIBE native").fetchall() == con.sql("DESCRIBE arrow").fetchall()
            plan = "".join(str(row) for row in con.sql("EXPLAIN ANALYZE SELECT * FROM native").fetchall())
            assert ("READ_PARQUET" in plan) == (t != upserted), t
            assert ("ARROW_SCAN" in plan) == (t in (renamed, upserted)), t
            if t in keys_rows:
                assert sorted(con.sql("SELECT * FROM native").fetchall()) == keys_rows[t]
                continue
            assert (
                con.sql(query.format("native")).fetch_arrow_table()
                == con.sql(query.format("arrow")).fetch_arrow_table()
            )
            assert con.sql("SELECT count(*) FROM native").fetchall() == [(client.read(t).num_rows,)]
            if t == plain:
                pruned = "".join(str(row) for row in con.sql("EXPLAIN ANALYZE " + query.format("native")).fetchall())
                assert re.search(r"Scanning Files:\W+1/3", pruned), pruned  # DuckDB's own pruning
    with pytest.raises(InvalidInput, match="view name"):
        duckdb_view(duckdb.connect(), "", ds.dataset(pa.table({"a": [1]})))


def engine_snippets() -> list[tuple[str, str]]:
    """The Python blocks of the guide's engine pages that follow an ``<!-- engine-snippet -->``
    marker, each with the page it is on."""
    found = []
    for page in ENGINE_PAGES:
        text = page.read_text(encoding="utf-8")
        found += [(page.name, s) for s in re.findall(r"<!-- engine-snippet -->\n```python\n(.*?)```", text, flags=re.S)]
    return found


def test_the_guides_engine_snippets_run_as_written(client: Client) -> None:
    """Each engine's snippet in the guide (docs/how-to: DuckDB, Polars, pandas), extracted from it
    (so the docs cannot drift), run on the ``events`` table of its first-table page."""
    snippets = engine_snippets()
    assert len(snippets) == 5, "docs/how-to: the five engine snippets (DuckDB 3, Polars 1, pandas 1)"
    client.create_table("events", pa.schema([("day", pa.string()), ("n", pa.int64())]), partition_by=["day"])
    commit(client, "events", pa.table({"day": ["d1", "d1", "d2"], "n": [1, 2, 4]}))
    space: dict = {"client": client, "pa": pa}
    for i, (page, snippet) in enumerate(snippets):
        if "to_pandas()" in snippet:
            try:
                import pandas  # noqa: F401
            except ImportError:
                snippet = snippet.replace(".to_pandas()", "")  # no pandas here: the Arrow half of it
        exec(compile(snippet, f"docs/how-to/{page}, engine snippet {i + 1}", "exec"), space)
    assert space["per_day"] == space["per_day_native"] == [("d1", 3)]
    assert space["d1"].item() == 3
    assert len(space["frame"]) == 2
    assert space["staged"] == [(7,)]
    assert client.read("events", where=pc.field("day") == "d3").num_rows == 1  # the transaction committed


@pytest.mark.slow
def test_parts_on_s3_read_through_the_fsspec_filesystem() -> None:
    """Storage on an S3 API server (moto's): the dataset reads the parts through s3fs wrapped for
    Arrow, with the storage's credentials, and DuckDB prunes by partition there too."""
    boto3 = pytest.importorskip("boto3")
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        options = {
            "key": "AKIAMERGETXNDATASET1",
            "secret": "ds-secret-0123456789",
            "endpoint_url": f"http://{host}:{port}",
        }
        boto3.client(
            "s3",
            endpoint_url=options["endpoint_url"],
            aws_access_key_id=options["key"],
            aws_secret_access_key=options["secret"],
            region_name="us-east-1",
        ).create_bucket(Bucket="mergetxn-datasets")
        storage = Storage("s3://mergetxn-datasets/warehouse", options)
        tdef = TableDef.new("ds_s3", WIDE, ("day", "region"), (), "parts", True, None, "full", None, None, None)
        metas = [
            write_part(storage, tdef.name, ["day", "region"], (day, "eu"), wide_rows(10 * i, 3, day, "eu"), "T1-1-h")
            for i, day in enumerate(DAYS)
        ]
        d = snapshot_dataset(storage, tdef, metas)
        assert all(f.startswith("mergetxn-datasets/warehouse/ds_s3/") for f in d.files)
        same_rows(d.to_table(), pa.concat_tables([read_part(storage, m) for m in metas]))
        assert len(list(d.get_fragments(filter=pc.field("day") == DAYS[0]))) == 1
        con = duckdb.connect()
        con.register("s3t", d)
        assert con.sql("SELECT count(*) FROM s3t WHERE day = DATE '2024-06-03'").fetchall() == [(3,)]
    finally:
        server.stop()
