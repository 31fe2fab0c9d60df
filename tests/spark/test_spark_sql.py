"""Spark SQL on the data source (docs/surface.md#spark): tables in the session catalog
(``CREATE TABLE t USING mergetxn OPTIONS (path ..., replica ...)``), temporary views, SELECT,
INSERT INTO and INSERT OVERWRITE (the partitions present in the data), a table pinned at a
snapshot; and ``register`` refusing a session whose workers cannot import mergetxn.

Spark 4.1 gives a catalog table's data source no options on SELECT and INSERT (only the schema
the catalog kept): before the fix every SELECT failed with "no table name"."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from support.cluster import make_cluster  # tests/ is on sys.path
from test_spark import new_session

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("day", pa.string()), ("v", pa.float64())])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server) -> Iterator:  # noqa: ANN001
    with make_cluster(tmp_path_factory, zk_server, "spark-sql", replicas=1) as c:
        yield c


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    from pyspark.sql import SparkSession

    # The catalog's warehouse (a static setting: given before the session exists) in tmp, not the cwd.
    SparkSession.builder.config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("warehouse")))
    session = new_session("mergetxn-sql")
    yield session
    session.stop()


def ids(rows: list) -> list[int]:
    return sorted(r["id"] for r in rows)


def test_a_catalog_table_selects_inserts_and_overwrites(cluster, spark) -> None:  # noqa: ANN001
    client = cluster.client(0)
    client.create_table("events", SCHEMA, partition_by=["day"])
    with client.transaction() as tx:
        tx.insert("events", pa.table({"id": [1, 2], "day": ["d1", "d2"], "v": [0.5, 1.5]}, schema=SCHEMA))
    address = cluster.replica_addresses[0]
    spark.sql(f"CREATE TABLE ev USING mergetxn OPTIONS (path 'events', replica '{address}')")
    assert ids(spark.sql("SELECT * FROM ev").collect()) == [1, 2]
    assert spark.sql("SELECT count(*) AS n FROM ev WHERE day = 'd2'").collect()[0]["n"] == 1

    spark.sql("INSERT INTO ev VALUES (3, 'd1', 2.5), (4, 'd3', 3.5)")
    assert sorted(client.read("events")["id"].to_pylist()) == [1, 2, 3, 4]
    spark.sql("INSERT OVERWRITE ev VALUES (5, 'd1', 4.5)")  # the partitions in the data: d1 only
    assert sorted(client.read("events")["id"].to_pylist()) == [2, 4, 5]
    assert ids(spark.sql("SELECT id FROM ev").collect()) == [2, 4, 5]
    # nothing secret or catalog-internal in what the table's columns carry
    meta = spark.table("ev").schema.fields[0].metadata
    assert "provider" not in str(meta) and "owner" not in str(meta)


def test_a_catalog_table_pinned_at_a_snapshot_reads_it(cluster, spark) -> None:  # noqa: ANN001
    client = cluster.client(0)
    client.create_table("pinned", SCHEMA)
    with client.transaction() as tx:
        tx.insert("pinned", pa.table({"id": [1], "day": ["d1"], "v": [0.5]}, schema=SCHEMA))
    first = tx.csn
    with client.transaction() as tx:
        tx.insert("pinned", pa.table({"id": [2], "day": ["d1"], "v": [0.5]}, schema=SCHEMA))
    address = cluster.replica_addresses[0]
    spark.sql(
        f"CREATE TABLE pinned_then USING mergetxn OPTIONS (path 'pinned', replica '{address}', snapshot '{first}')"
    )
    assert ids(spark.sql("SELECT * FROM pinned_then").collect()) == [1]
    spark.sql("INSERT INTO pinned_then VALUES (3, 'd2', 1.0)")  # writes go to the table as it is now
    assert sorted(client.read("pinned")["id"].to_pylist()) == [1, 2, 3]


def test_a_temporary_view_selects_inserts_and_overwrites(cluster, spark) -> None:  # noqa: ANN001
    client = cluster.client(0)
    client.create_table("viewed", SCHEMA, partition_by=["day"])
    address = cluster.replica_addresses[0]
    spark.sql(f"CREATE TEMPORARY VIEW vw USING mergetxn OPTIONS (path 'viewed', replica '{address}')")
    spark.sql("INSERT INTO vw VALUES (1, 'd1', 0.5), (2, 'd2', 1.5)")
    spark.sql("INSERT OVERWRITE vw VALUES (3, 'd2', 2.5)")
    assert ids(spark.sql("SELECT * FROM vw").collect()) == [1, 3]
    assert sorted(client.read("viewed")["id"].to_pylist()) == [1, 3]


def test_register_says_how_to_point_the_workers_at_mergetxn(tmp_path: Path) -> None:
    """A driver on the venv's interpreter, PYSPARK_PYTHON unset, and a PATH whose python3 has no
    mergetxn: register() refuses, naming PYSPARK_PYTHON and the interpreter to give it."""
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").symlink_to("/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable)
    if Path(os.path.realpath(bare / "python3")) == Path(os.path.realpath(sys.executable)):
        pytest.skip("no other python3 on this machine")
    code = (
        "from pyspark.sql import SparkSession\n"
        "import spark as s, coordinator.errors as e\n"
        "session = SparkSession.builder.master('local[1]').config('spark.ui.enabled','false').getOrCreate()\n"
        "try:\n    s.register(session)\nexcept e.InvalidInput as exc:\n    print('REFUSED', exc)\n"
        "else:\n    print('REGISTERED')\n"
        "session.stop()\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env["PATH"] = f"{bare}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert "REFUSED" in out.stdout, out.stdout + out.stderr[-2000:]
    assert "PYSPARK_PYTHON" in out.stdout and sys.executable in out.stdout


def refusal(run) -> str:  # noqa: ANN001 - a callable that fails in Spark
    """The text of the error ``run()`` ends with (Spark wraps the data source's in its own)."""
    with pytest.raises(Exception) as caught:  # noqa: PT011 - Spark's wrapper classes vary
        run()
    return str(caught.value)


def test_an_unknown_option_is_refused_naming_the_known_ones(cluster, spark) -> None:  # noqa: ANN001
    """A misspelt ``snapshott`` used to be ignored: the read silently saw the latest data."""
    client = cluster.client(0)
    client.create_table("typos", SCHEMA)
    with client.transaction() as tx:
        tx.insert("typos", pa.table({"id": [1], "day": ["d1"], "v": [0.5]}, schema=SCHEMA))
    address = cluster.replica_addresses[0]
    reader = spark.read.format("mergetxn").option("replica", address).option("Snapshott", str(tx.csn))
    text = refusal(lambda: reader.load("typos").collect())
    assert "unknown option 'snapshott'" in text and "snapshot" in text.split("the options are:")[1]
    text = refusal(
        lambda: spark.sql(
            f"CREATE TABLE typo_t USING mergetxn OPTIONS (path 'typos', replica '{address}', snapshott '1')"
        )
    )
    assert "unknown option 'snapshott'" in text
    assert not spark.catalog.tableExists("typo_t")
    writer = spark.createDataFrame([(2, "d1", 1.0)], "id BIGINT, day STRING, v DOUBLE").write.format("mergetxn")
    text = refusal(lambda: writer.option("replica", address).option("rows_per_prat", "5").mode("append").save("typos"))
    assert "unknown option 'rows_per_prat'" in text
    assert client.read("typos")["id"].to_pylist() == [1]  # nothing written


def test_create_table_with_columns_is_refused_in_sql_words(cluster, spark) -> None:  # noqa: ANN001
    """Spark consults no data source for a CREATE TABLE with a column list (and keeps no options):
    its first SELECT or INSERT is refused, saying how to create the table instead (it used to fail
    with "no table name; give it to load()/save()")."""
    client = cluster.client(0)
    client.create_table("typed", SCHEMA)
    address = cluster.replica_addresses[0]
    spark.sql(
        f"CREATE TABLE typed_t (id BIGINT, day STRING, v DOUBLE) USING mergetxn OPTIONS (path 'typed', replica '{address}')"
    )
    for statement in ("SELECT * FROM typed_t", "INSERT INTO typed_t VALUES (1, 'd1', 0.5)"):
        text = refusal(lambda: spark.sql(statement).collect())  # noqa: B023 - called at once
        assert "column list" in text and "DROP TABLE" in text and "USING mergetxn OPTIONS (path" in text, text
    assert client.read("typed").num_rows == 0


def test_create_table_as_select_is_refused_saying_what_to_do(cluster, spark) -> None:  # noqa: ANN001
    client = cluster.client(0)
    address = cluster.replica_addresses[0]
    text = refusal(
        lambda: spark.sql(
            f"CREATE TABLE made_t USING mergetxn OPTIONS (path 'made', replica '{address}') AS SELECT 1L AS id"
        )
    )
    assert "AS SELECT" in text and "client.create_table" in text and "INSERT INTO" in text, text
    assert "made" not in client.tables()
    assert not spark.catalog.tableExists("made_t")
