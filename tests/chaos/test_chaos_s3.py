"""``mergetxn chaos --storage s3``: moto's S3 server as a process of its own, the HTTP-aware fault
proxy in front of it, and a short campaign with S3 errors and timeouts.

The proxy tests talk plain S3 (boto3, and mergetxn's own ``Storage``) to moto through the proxy:
the chosen fraction is answered with S3 errors that never reach moto, the rest is forwarded, and
stalled requests meet their fates when the fault heals. The campaign runs the loopback form with
every replica on ``s3://`` and checks the verdict (which includes reading every replica at one CSN
from the bucket: a committed part missing from S3 fails it), the faults, the outcomes, and that
nothing is left running.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")

from botocore.config import Config  # noqa: E402
from botocore.exceptions import (  # noqa: E402
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from mergetxn.chaos import s3 as chaos_s3  # noqa: E402
from mergetxn.chaos.s3 import S3FaultProxy, S3Storage  # noqa: E402

N = 200


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Storage]:
    with chaos_s3.moto_server(tmp_path_factory.mktemp("s3"), seed=7) as st:
        yield st


@pytest.fixture
def proxy(storage: S3Storage) -> Iterator[S3FaultProxy]:
    assert storage.proxy is not None
    storage.proxy.heal()
    yield storage.proxy
    storage.proxy.heal()


def client(storage: S3Storage, retries: int = 1, read_timeout: float = 10.0) -> object:
    opts = storage.storage_options
    return boto3.client(
        "s3",
        endpoint_url=opts["endpoint_url"],
        aws_access_key_id=opts["key"],
        aws_secret_access_key=opts["secret"],
        region_name="us-east-1",
        config=Config(
            retries={"total_max_attempts": retries, "mode": "standard"}, read_timeout=read_timeout, connect_timeout=5
        ),
    )


def test_environment_names_the_proxy_and_is_restored(tmp_path: Path) -> None:
    before = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL")}
    with chaos_s3.moto_server(tmp_path) as st:
        assert st.proxy is not None and os.environ["AWS_ENDPOINT_URL"] == st.proxy.url
        assert os.environ["AWS_SECRET_ACCESS_KEY"] == st.storage_options["secret"]
        assert st.storage_options["secret"] not in repr(st)
        from parts.io.storage import Storage

        parts = Storage(st.url)  # credentials and endpoint from the environment
        parts.put("a/b.bin", b"payload")
        assert st.objects() == ["a/b.bin"]
        assert st.storage_options["secret"] not in repr(parts)
        pid = st.moto_pid
        secret = st.storage_options["secret"]
        assert pid is not None
    assert {k: os.environ.get(k) for k in before} == before
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    log = (tmp_path / "moto.log").read_text()
    assert secret not in log


def test_errors_answer_the_chosen_fraction_and_forward_the_rest(storage: S3Storage, proxy: S3FaultProxy) -> None:
    s3 = client(storage)
    before = proxy.stats()
    proxy.errors(0.5)
    outcomes: dict[str, int] = {}
    for i in range(N):
        try:
            s3.put_object(Bucket=storage.bucket, Key=f"{chaos_s3.PREFIX}/frac/{i}", Body=b"x" * 100)
            outcomes["ok"] = outcomes.get("ok", 0) + 1
        except ClientError as exc:
            code = exc.response["Error"]["Code"]
            assert exc.response["ResponseMetadata"]["HTTPStatusCode"] == chaos_s3.ERRORS[code][0]
            outcomes[code] = outcomes.get(code, 0) + 1
    proxy.heal()
    errors = outcomes.get("SlowDown", 0) + outcomes.get("InternalError", 0)
    assert 0.35 * N < errors < 0.65 * N, outcomes
    assert outcomes.get("SlowDown") and outcomes.get("InternalError"), outcomes
    # what was answered with an error never reached S3, the rest did
    stored = {int(k.rsplit("/", 1)[1]) for k in storage.objects("frac/")}
    assert len(stored) == outcomes["ok"]
    after = proxy.stats()
    assert after["forwarded"] - before.get("forwarded", 0) == outcomes["ok"]
    # healed: everything passes, on the same connections
    for i in range(20):
        s3.get_object(Bucket=storage.bucket, Key=f"{chaos_s3.PREFIX}/frac/{min(stored)}")["Body"].read()


def test_every_kind_of_request_survives_the_proxy(storage: S3Storage, proxy: S3FaultProxy) -> None:
    """HEAD, GET, PUT with 100-continue, listings, DELETE, errors on each: mergetxn's own storage
    layer through the proxy while it answers every other request with an error."""
    from parts.io.storage import Storage

    st = Storage(storage.url + "/kinds", storage.storage_options)
    proxy.errors(1.0)
    with pytest.raises(OSError, match="put"):
        st.put("k/x", b"1")
    with pytest.raises(OSError, match="get"):
        st.get("k/x")
    with pytest.raises(OSError, match="list"):
        st.list("k/")
    proxy.heal()
    st.put("k/x", b"1" * 200_000)
    assert st.get("k/x") == b"1" * 200_000 and st.exists("k/x") and st.list("k/") == ["k/x"]
    assert st.missing(["k/x", "k/y"]) == ["k/y"]
    st.delete("k/x")
    assert not st.exists("k/x")


def test_exists_does_not_answer_false_during_an_s3_outage(storage: S3Storage, proxy: S3FaultProxy) -> None:
    from parts.io.storage import Storage

    st = Storage(storage.url + "/outage", storage.storage_options)
    st.put("k/x", b"1")
    proxy.errors(1.0, ("InternalError",))
    try:
        answers = []
        for _ in range(3):
            try:
                answers.append(st.exists("k/x"))
            except OSError:
                answers.append("error")
            try:
                answers.append(st.missing(["k/x"]))
            except OSError:
                answers.append("error")
    finally:
        proxy.heal()
    assert False not in answers and ["k/x"] not in answers, answers


def test_opening_storage_during_an_s3_outage_is_not_bad_input(storage: S3Storage, proxy: S3FaultProxy) -> None:
    from coordinator.errors import InvalidInput, StorageError
    from parts.io.storage import Storage

    proxy.errors(1.0, ("SlowDown",))
    try:
        with pytest.raises(Exception) as err:
            Storage(storage.url, storage.storage_options)
    finally:
        proxy.heal()
    assert not isinstance(err.value, InvalidInput), err.value
    assert isinstance(err.value, StorageError) and "unreachable" in err.value.message, err.value  # a MergetxnError


def test_stalls_hold_until_healed_then_meet_their_fates(storage: S3Storage, proxy: S3FaultProxy) -> None:
    s3 = client(storage, retries=1, read_timeout=30)
    results: dict[str, str] = {}

    def put(fate: str) -> None:
        try:
            s3.put_object(Bucket=storage.bucket, Key=f"{chaos_s3.PREFIX}/stall/{fate}", Body=b"y" * 10)
            results[fate] = "ok"
        except (ClientError, ConnectionClosedError, EndpointConnectionError, ReadTimeoutError) as exc:
            results[fate] = type(exc).__name__
        except Exception as exc:  # botocore wraps a reset connection in several ways
            results[fate] = type(exc).__name__

    for fate in chaos_s3.STALL_FATES:
        proxy.stall(1.0, (fate,))
        t = threading.Thread(target=put, args=(fate,))
        t.start()
        deadline = time.monotonic() + 5
        while proxy.stalled < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proxy.stalled == 1, f"{fate}: nothing stalled"
        time.sleep(0.3)
        assert fate not in results, f"{fate}: answered while stalled"
        proxy.heal()
        t.join(15)
        assert fate in results
    stored = set(storage.objects("stall/"))
    assert results["late"] == "ok" and "stall/late" in stored
    assert results["cut-before"] != "ok" and "stall/cut-before" not in stored
    # the answer was withheld: S3 did it, the caller was told nothing good
    assert results["cut-after"] != "ok" and "stall/cut-after" in stored


# -- a short campaign ---------------------------------------------------------------------------------

# The run ends after MAX_FAULTS faults, healed and measured, or at SECONDS (then incomplete: a
# failure). Any seed: the nemesis injects the least injected kind first, so the two S3 kinds,
# which hold one resource, take its first two turns (a 30 s run at load once saw only one).
SECONDS = 180
MAX_FAULTS = 5
SEED = 20261196


def _our_processes() -> list[int]:
    """Processes this test process started as a chaos harness that still run (moto's server,
    replicas, ZooKeeper members)."""
    me = str(os.getpid())
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if f"MERGETXN_CHAOS_OWNER=mtx:{me}".encode() in environ.split(b"\0"):
            out.append(int(entry))
    return out


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from mergetxn.chaos.run import run_chaos

    base = tmp_path_factory.mktemp("chaos-s3")
    lines: list[str] = []
    seen: list[dict[str, str]] = []  # the environment the run gave its replicas and clients
    set_env = S3Storage._set_env

    def spy(self: S3Storage) -> None:
        seen.append(dict(self.environment))
        set_env(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(S3Storage, "_set_env", spy)
        result = run_chaos(
            base / "work",
            SECONDS,
            SEED,
            "all",
            "s3-errors,s3-timeouts,kill-replica",
            base / "report",
            form="loopback",
            storage="s3",
            say=lines.append,
            max_faults=MAX_FAULTS,
        )
    result.lines = lines  # type: ignore[attr-defined]
    result.base = base  # type: ignore[attr-defined]
    result.env = seen[0]  # type: ignore[attr-defined]
    yield result


def test_campaign_passes_with_both_s3_faults(campaign: object) -> None:
    r = campaign
    assert r.exit_code == 0, (r.findings, r.incomplete, r.summary)  # type: ignore[attr-defined]
    h = r.history  # type: ignore[attr-defined]
    kinds = {f.kind for f in h.faults}
    assert {"s3-errors", "s3-timeouts"} <= kinds, kinds
    assert all(f.recovered is not None for f in h.faults), [f for f in h.faults if f.recovered is None]
    outcomes = {o.outcome for o in h.ops}
    assert "committed" in outcomes and "indeterminate" not in outcomes
    s = r.summary  # type: ignore[attr-defined]
    assert s["storage"] == "s3" and s["s3"]["requests"] > 0
    assert any(k.startswith("error ") for k in s["s3"]) and any(k.startswith("stall ") for k in s["s3"]), s["s3"]
    report = json.loads((Path(r.report_dir) / "summary.json").read_text())  # type: ignore[attr-defined]
    assert report["storage"] == "s3"


def test_nothing_is_left_running_and_no_secret_written(campaign: object, storage: S3Storage) -> None:
    assert set(_our_processes()) - {storage.moto_pid} == set()  # the proxy tests' server is this module's
    env = campaign.env  # type: ignore[attr-defined]
    assert env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):  # restored
        assert os.environ.get(name) != env[name], name
    secret = env["AWS_SECRET_ACCESS_KEY"]
    files = [p for p in campaign.base.rglob("*") if p.is_file()]  # type: ignore[attr-defined]
    assert any(p.name == "replica.log" for p in files) and any(p.name == "moto.log" for p in files)
    leaks = [str(p) for p in files if secret.encode() in p.read_bytes()]
    assert leaks == [], leaks
    assert not any(secret in line for line in campaign.lines)  # type: ignore[attr-defined]


def test_nemesis_all_includes_the_s3_kinds_only_with_s3() -> None:
    from mergetxn.chaos.nemesis import choose_kinds

    kinds, _ = choose_kinds("all", {"kill_replica"} | S3Storage("/tmp/unused").supports())
    assert {"s3-errors", "s3-timeouts"} <= set(kinds)
    kinds, left_out = choose_kinds("all", {"kill_replica"})
    assert not {"s3-errors", "s3-timeouts"} & set(kinds) and {"s3-errors", "s3-timeouts"} <= set(left_out)
    rng = random.Random(1)
    assert chaos_s3.plans("s3-errors", object(), rng) == []


def test_s3_kinds_by_name_need_s3_storage(tmp_path: Path) -> None:
    from coordinator.errors import InvalidInput
    from mergetxn.chaos.run import run_chaos

    with pytest.raises(InvalidInput, match="--storage s3"):
        run_chaos(tmp_path, 5, 1, "all", "kill-replica,s3-errors", None, form="single")
    chaos_s3.check_kinds("all", "dir")
    chaos_s3.check_kinds("s3-timeouts", "s3")
