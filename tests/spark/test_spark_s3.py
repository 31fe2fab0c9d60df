"""The `mergetxn` Spark data source on S3: moto's S3 server on 127.0.0.1, reached through s3fs,
with the replicas and the Spark executors each holding their own credentials.

The replicas get credentials and endpoint from environment variables (LocalCluster passes the
environment through; never the command line). Spark executors get them from the data source
options `s3_endpoint`, `s3_key`, `s3_secret`: the Spark JVM of this test process is started
without them. The secret must never appear in a plan, an error, a log or a command line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from support.cluster import make_cluster  # tests/ is on sys.path
from test_spark import (  # tests/ is on sys.path (rootdir-relative test modules)
    DDL,
    SCHEMA,
    as_rows,
    fail_first_attempt,
    frame,
    gc_collects,
    new_session,
    rows,
    visible_parts,
)

import coordinator
from mergetxn.client import Client

pytestmark = pytest.mark.slow

BUCKET = "mergetxn-spark"
PREFIX = "warehouse"
KEY = "AKIAMERGETXNSPARK001"
SECRET = "sp4rk-s3cr3t-Never-Logged-0a9b8c7d"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    boto3 = pytest.importorskip("boto3")
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    boto3.client(
        "s3", endpoint_url=url, aws_access_key_id=KEY, aws_secret_access_key=SECRET, region_name="us-east-1"
    ).create_bucket(Bucket=BUCKET)
    yield url
    server.stop()


@pytest.fixture(scope="module")
def cluster(endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    env = {
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_DEFAULT_REGION": "us-east-1",
    }  # the replica processes inherit these, and only they
    with make_cluster(
        tmp_path_factory,
        None,
        "sparks3",
        replicas=1,
        env=env,
        storage_url=f"s3://{BUCKET}/{PREFIX}",
    ) as c:
        yield c


@pytest.fixture(scope="module")
def s3opts(endpoint: str) -> dict[str, str]:
    """Data source options with the executors' credentials."""
    return {"s3_endpoint": endpoint, "s3_key": KEY, "s3_secret": SECRET}


@pytest.fixture(scope="module")
def c0(cluster: coordinator.LocalCluster, endpoint: str) -> Client:
    return Client(cluster.replica_addresses[0], {"key": KEY, "secret": SECRET, "endpoint_url": endpoint})


@pytest.fixture(scope="module")
def r0(cluster: coordinator.LocalCluster) -> str:
    return cluster.replica_addresses[0]


@pytest.fixture(scope="module")
def spark(cluster: coordinator.LocalCluster):
    import sys

    import test_spark
    from pyspark import cloudpickle

    for module in (sys.modules[__name__], test_spark):
        cloudpickle.register_pickle_by_value(module)
    assert "AWS_SECRET_ACCESS_KEY" not in os.environ  # executors must use the options
    session = new_session("mergetxn-s3-tests")
    yield session
    session.stop()


def s3_objects(endpoint: str, prefix: str) -> dict[str, int]:
    import boto3

    s3 = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET, region_name="us-east-1"
    )
    out: dict[str, int] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for o in page.get("Contents", ()):
            out[o["Key"]] = o["Size"]
    return out


def s3_sidecars(endpoint: str, table: str) -> Callable[[], list[dict]]:
    """A picklable lister of a table's part sidecars on the S3 server (for executors)."""

    def sidecars() -> list[dict]:
        import boto3

        s3 = boto3.client(
            "s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET, region_name="us-east-1"
        )
        out = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{PREFIX}/{table}/"):
            for o in page.get("Contents", ()):
                if o["Key"].endswith(".json"):
                    out.append(json.loads(s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()))
        return out

    return sidecars


def writer(df, replica: str, opts: dict[str, str], mode: str = "append", **options: str):
    w = df.write.format("mergetxn").option("replica", replica).mode(mode)
    for k, v in {**opts, **options}.items():
        w = w.option(k, v)
    return w


def reader(spark, replica: str, opts: dict[str, str], **options: str):
    r = spark.read.format("mergetxn").option("replica", replica)
    for k, v in {**opts, **options}.items():
        r = r.option(k, v)
    return r


# ---------------------------------------------------------------------------------------------


def test_s3_append_overwrite_and_read(spark, c0: Client, r0: str, s3opts: dict, endpoint: str) -> None:
    c0.create_table("s3_events", SCHEMA, partition_by=["k"], auto_merge=False)
    writer(frame(spark, rows(0, 300)), r0, s3opts).save("s3_events")
    writer(frame(spark, rows(300, 60)), r0, s3opts).save("s3_events")
    assert as_rows(c0.read("s3_events")) == sorted(rows(0, 360))
    got = reader(spark, r0, s3opts).load("s3_events")
    assert sorted(tuple(r) for r in got.collect()) == sorted(rows(0, 360))

    new_b = [(5000 + i, "b", 2.0) for i in range(4)]
    writer(frame(spark, new_b), r0, s3opts, mode="overwrite").save("s3_events")
    expected = sorted(new_b + [r for r in rows(0, 360) if r[1] != "b"])
    assert as_rows(c0.read("s3_events")) == expected
    # Every visible part is a whole object on S3, of exactly the size its descriptor records.
    objects = s3_objects(endpoint, f"{PREFIX}/s3_events/")
    for p in visible_parts(c0, "s3_events"):
        assert objects[f"{PREFIX}/{p['path']}"] == p["size"]


def test_s3_txn_option_two_tables_one_csn(spark, c0: Client, r0: str, s3opts: dict) -> None:
    c0.create_table("s3_a", SCHEMA, auto_merge=False)
    c0.create_table("s3_b", SCHEMA, auto_merge=False)
    tx = c0.begin()
    writer(frame(spark, rows(0, 20)), r0, s3opts, txn=tx.id).save("s3_a")
    writer(frame(spark, rows(20, 20)), r0, s3opts, txn=tx.id).save("s3_b")
    assert c0.read("s3_a").num_rows == 0 and c0.read("s3_b").num_rows == 0
    csn = tx.commit()
    assert {p["creation_csn"] for t in ("s3_a", "s3_b") for p in visible_parts(c0, t)} == {csn}
    assert as_rows(c0.read("s3_b")) == sorted(rows(20, 20))


def test_s3_task_retry_exactly_once(spark, c0: Client, r0: str, s3opts: dict, endpoint: str, tmp_path: Path) -> None:
    c0.create_table("s3_retry", SCHEMA, auto_merge=False)
    data = rows(0, 160_000)
    marks = tmp_path / "marks"
    marks.mkdir()
    rdd = spark.sparkContext.parallelize(data, 4).mapPartitionsWithIndex(
        fail_first_attempt(str(marks), s3_sidecars(endpoint, "s3_retry"))
    )
    writer(spark.createDataFrame(rdd, DDL), r0, s3opts, rows_per_part="5000").save("s3_retry")
    seen = json.loads((marks / "seen.json").read_text())
    assert seen, "the failing attempt should have written a part before failing"
    got = c0.read("s3_retry")
    assert sorted(got.column("id").to_pylist()) == [r[0] for r in data]
    visible = {p["name"] for p in visible_parts(c0, "s3_retry")}
    assert not visible & set(seen)
    assert len({p["creation_csn"] for p in visible_parts(c0, "s3_retry")}) == 1

    def orphans() -> set[str]:
        return {
            k
            for k in s3_objects(endpoint, f"{PREFIX}/s3_retry/")
            if k.endswith(".parquet") and k.rsplit("/", 1)[-1][: -len(".parquet")] not in visible
        }

    assert gc_collects(c0, orphans)  # whatever failed attempts left on S3 is collected
    assert c0.read("s3_retry").num_rows == len(data)


def test_s3_old_snapshot_and_pruning(spark, c0: Client, r0: str, s3opts: dict, tmp_path: Path) -> None:
    c0.create_table("s3_prune", SCHEMA, partition_by=["k"], auto_merge=False)
    for lo in (0, 1000):
        with c0.transaction() as tx:
            tx.insert(
                "s3_prune",
                pa.table({"id": list(range(lo, lo + 400)), "k": list("abcd") * 100, "v": [1.0] * 400}, schema=SCHEMA),
            )
    first = min(p["creation_csn"] for p in visible_parts(c0, "s3_prune"))
    trace = tmp_path / "reads.log"

    def parts_read(df) -> tuple[int, int]:
        trace.unlink(missing_ok=True)
        n = df.count()
        return n, len(trace.read_text().splitlines()) if trace.exists() else 0

    def load(**extra: str):
        return reader(spark, r0, s3opts, trace_reads=str(trace), split_bytes="1", **extra).load("s3_prune")

    assert parts_read(load()) == (800, 8)
    assert parts_read(load().filter("k = 'a'")) == (200, 2)
    assert parts_read(load().filter("id < 1000 and k = 'd'")) == (100, 1)
    # An old snapshot stays readable, and exact, while new writes commit on S3.
    hold = c0.begin()  # a snapshot in use: cleanup keeps the files the overwrite removes
    with c0.transaction() as tx:
        tx.overwrite("s3_prune", pa.table({"id": [9], "k": ["a"], "v": [0.0]}, schema=SCHEMA))
    assert parts_read(load(snapshot=str(first))) == (400, 4)
    assert parts_read(load().filter("k = 'a'")) == (1, 1)
    hold.rollback()


def test_s3_credentials_never_logged(
    spark, c0: Client, r0: str, s3opts: dict, cluster, capfd: pytest.CaptureFixture
) -> None:
    c0.create_table("s3_secret", SCHEMA, auto_merge=False)
    writer(frame(spark, rows(0, 30)), r0, s3opts).save("s3_secret")
    df = reader(spark, r0, s3opts).load("s3_secret").filter("id > 3")
    assert df.count() == 26
    plan = df._jdf.queryExecution().toString()
    with pytest.raises(Exception) as ei:  # errors that carry the options still hide the secret
        writer(frame(spark, rows(0, 3)), r0, s3opts).save("s3_no_such_table")
    assert "unknown table 's3_no_such_table'" in str(ei.value)
    with pytest.raises(Exception) as ei2:
        reader(spark, r0, dict(s3opts, s3_endpoint="http://127.0.0.1:1")).load("s3_secret").collect()
    assert "unreachable" in str(ei2.value)
    out, err = capfd.readouterr()
    texts = {"plan": plan, "error": str(ei.value), "error2": str(ei2.value), "stdout": out, "stderr": err}
    for i in range(cluster.n):
        texts[f"replica-{i}.log"] = (cluster.workdir / f"replica-{i}" / "replica.log").read_text(errors="replace")
        pid = cluster.replica_pid(i)
        texts[f"replica-{i} argv"] = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    leaked = [name for name, text in texts.items() if SECRET in text]
    assert not leaked
