"""Parts on an S3 API server (moto's, run as a real HTTP server in this process): the same
round trip as local storage through s3fs, and no credential ever shows in repr or errors."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from coordinator.errors import CorruptPart, InvalidInput
from parts.io.format import read_meta, read_part, write_part
from parts.io.storage import Storage

pytestmark = pytest.mark.slow

BUCKET = "mergetxn-parts"
KEY = "AKIAMERGETXNTEST0001"
SECRET = "s3cr3t-Do-Not-Leak-9f8e7d6c5b4a"


@pytest.fixture(scope="module")
def endpoint():
    boto3 = pytest.importorskip("boto3")
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    s3 = boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )
    s3.create_bucket(Bucket=BUCKET)
    yield url
    server.stop()


@pytest.fixture
def options(endpoint):
    return {"key": KEY, "secret": SECRET, "endpoint_url": endpoint}


@pytest.fixture
def s3(endpoint):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )


def assert_no_secret(text: str) -> None:
    assert SECRET not in text
    assert SECRET[:12] not in text


def test_write_read_list_delete_round_trip(options, s3, request):
    prefix = f"rt-{request.node.name}"
    st = Storage(f"s3://{BUCKET}/{prefix}", options)
    data = pa.table({"id": [1, 2, 3], "k": ["a", "b", "a"]})
    meta = write_part(st, "events", ["k"], ("a",), data.slice(0, 1), "T1-1-h")
    meta2 = write_part(st, "events", [], (), data, "T1-1-h")
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"])
    assert keys == sorted(f"{prefix}/{p}" for p in [meta.path, meta.meta_path, meta2.path, meta2.meta_path])
    assert st.list() == sorted([meta.path, meta.meta_path, meta2.path, meta2.meta_path])
    assert st.list("events/k=a/") == sorted([meta.path, meta.meta_path])
    assert read_part(st, meta).equals(data.slice(0, 1))
    assert read_part(st, meta2, columns=["k"]).column("k").to_pylist() == ["a", "b", "a"]
    assert read_meta(st, meta2.meta_path) == meta2
    assert st.exists(meta.path) and not st.exists("events/k=a")
    assert st.size(meta.path) == meta.size
    assert st.mtime(meta.path) > 1e9
    # The listing's LastModified, no HEAD request per object; ``want`` filters before.
    listed = dict(st.list_with_mtime("events/", lambda p: p.endswith(".parquet")))
    assert set(listed) == {meta.path, meta2.path}
    assert all(abs(m - st.mtime(p)) < 1.0 for p, m in listed.items())
    for p in [meta.path, meta.meta_path]:
        st.delete(p)
    st.delete(meta.path)
    assert st.list() == sorted([meta2.path, meta2.meta_path])
    assert not st.exists(meta.path)
    with pytest.raises(FileNotFoundError):
        st.get(meta.path)
    with pytest.raises(CorruptPart, match="missing") as err:
        read_part(st, meta)
    assert meta.path in str(err.value)


def test_corrupt_object_is_detected(options, s3):
    st = Storage(f"s3://{BUCKET}/corrupt", options)
    meta = write_part(st, "t", [], (), pa.table({"x": list(range(100))}), "T1-1-h")
    body = bytearray(s3.get_object(Bucket=BUCKET, Key=f"corrupt/{meta.path}")["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3.put_object(Bucket=BUCKET, Key=f"corrupt/{meta.path}", Body=bytes(body))
    with pytest.raises(CorruptPart, match="checksum") as err:
        read_part(st, meta)
    assert meta.path in str(err.value)


def test_pickled_storage_works(options):
    st = Storage(f"s3://{BUCKET}/pickled", options)
    st.put("a/b", b"payload")
    again = pickle.loads(pickle.dumps(st))
    assert again.get("a/b") == b"payload"
    assert repr(again) == f"Storage('s3://{BUCKET}/pickled')"


def test_credentials_from_environment(endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("MERGETXN_S3_ENDPOINT", endpoint)
    st = Storage(f"s3://{BUCKET}/env")
    st.put("x", b"1")
    assert st.get("x") == b"1"
    assert_no_secret(repr(st))


def test_repr_and_errors_never_show_the_secret(options, endpoint):
    st = Storage(f"s3://{BUCKET}/quiet", options)
    assert repr(st) == str(st) == f"Storage('s3://{BUCKET}/quiet')"
    assert st.url == f"s3://{BUCKET}/quiet"
    assert_no_secret(repr(st))
    with pytest.raises(FileNotFoundError) as missing:
        st.get("nope/nothing")
    assert_no_secret(str(missing.value))
    with pytest.raises(InvalidInput, match="no-such-bucket") as no_bucket:
        Storage("s3://no-such-bucket/x", options)
    assert_no_secret(str(no_bucket.value))
    leaky_endpoint = f"http://user:{SECRET}@127.0.0.1:1"
    with pytest.raises(InvalidInput, match="unreachable") as unreachable:
        Storage(f"s3://{BUCKET}/x", {**options, "endpoint_url": leaky_endpoint})
    assert_no_secret(str(unreachable.value))
    with pytest.raises(InvalidInput) as bad_url:
        Storage(f"s3://{BUCKET}/x", {**options, "endpoint_url": "not a url"})
    assert_no_secret(str(bad_url.value))
    with pytest.raises(InvalidInput) as bad_option:
        Storage(f"s3://{BUCKET}/x", {**options, "client_kwargs": {"aws_secret_access_key": 1}})
    assert_no_secret(str(bad_option.value))
