"""Operator mistakes that must not stick, on a secured cluster (docs/surface.md#users-roles-and-grants,
docs/surface.md#backup-and-restore): the last admin cannot be dropped (also by two drops racing
through two replicas), ``replica retire`` refuses a malformed id before ZooKeeper, ``security
add-user`` adds no user whose credentials file cannot be written, a keys table of 150,000 keys
restores whatever its ``txn_max_rows``, and a backup whose part and checksums were forged is
refused by its MAC.

A LocalCluster(secure=True) of two replica processes and its own ZooKeeper; commands run
in-process through click's CliRunner, as the admin of ``security init`` (admin.json).
"""

from __future__ import annotations

import hashlib
import json
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from click.testing import CliRunner, Result
from kazoo.client import KazooClient
from support.cli import one_error_line
from support.cluster import make_cluster  # tests/ is on sys.path
from support.data import sorted_rows

import coordinator
from coordinator import errors
from coordinator.wire.security import ADMIN_FILE, REPLICA_FILE, Credentials, zk_client_args
from mergetxn.cli import EXIT_CORRUPT, EXIT_DENIED, EXIT_USAGE, cli
from parts.io.format import checksum_of, write_part
from parts.io.storage import Storage

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])
KEYS = pa.schema([pa.field("k", pa.int64(), nullable=False), ("a", pa.string())])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    with make_cluster(
        # inline_rows 0: these tests follow the backups' part files (docs/architecture/small-writes.md)
        tmp_path_factory,
        None,
        "opsmistakes",
        replicas=2,
        secure=True,
        settings={"inline_rows": 0, "merge_interval": 0, "gc_interval": 0},
    ) as c:
        yield c


@pytest.fixture
def admin(cluster: coordinator.LocalCluster) -> Iterator[coordinator.Client]:
    with cluster.client(0) as client:
        yield client


def replicas_identity(cluster: coordinator.LocalCluster) -> Credentials:
    """What an operator holding the replicas' credentials file logs in with (no user)."""
    return Credentials.from_file(cluster.workdir / "security" / REPLICA_FILE).client()


def invoke(cluster: coordinator.LocalCluster, *args: object, credentials: Path | None = None) -> Result:
    env = {
        "MERGETXN_REPLICA": cluster.replica_addresses[0],
        "MERGETXN_CREDENTIALS": str(credentials or cluster.workdir / "security" / ADMIN_FILE),
    }
    return CliRunner(env=env).invoke(cli, [str(a) for a in args], catch_exceptions=False)


def admins(client: coordinator.Client) -> list[str]:
    return sorted(u["name"] for u in client.users() if u["role"] == "admin")


# -- the last admin ------------------------------------------------------------------------------
def test_the_last_admin_cannot_be_dropped(cluster: coordinator.LocalCluster, admin: coordinator.Client) -> None:
    cluster.add_user("ops_writer", "writer")  # other roles do not count as admins
    assert admins(admin) == ["admin"]
    with pytest.raises(errors.InvalidInput, match="'admin' is the last admin"):
        admin.drop_user("admin")
    one_error_line(invoke(cluster, "security", "drop-user", "admin"), EXIT_USAGE, "'admin'", "last admin")
    with coordinator.connect(cluster.replica_addresses[1], credentials=replicas_identity(cluster)) as operator:
        with pytest.raises(errors.InvalidInput, match="last admin"):  # not even the replicas' identity
            operator.drop_user("admin")
    assert admins(admin) == ["admin"]
    assert invoke(cluster, "security", "users").exit_code == 0  # the admin still logs in


def test_two_drops_racing_through_two_replicas_leave_one_admin(
    cluster: coordinator.LocalCluster, admin: coordinator.Client
) -> None:
    second = cluster.add_user("admin_b", "admin")
    assert admins(admin) == ["admin", "admin_b"]
    operators = [
        coordinator.connect(cluster.replica_addresses[i], credentials=replicas_identity(cluster)) for i in range(2)
    ]
    barrier = threading.Barrier(2)
    outcomes: dict[str, BaseException | None] = {}

    def drop(i: int, name: str) -> None:
        barrier.wait()
        try:
            operators[i].drop_user(name)
            outcomes[name] = None
        except errors.MergetxnError as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=drop, args=(i, n)) for i, n in enumerate(("admin", "admin_b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        refused = {n: e for n, e in outcomes.items() if e is not None}
        assert len(outcomes) == 2 and len(refused) == 1, outcomes
        ((name, exc),) = refused.items()
        assert isinstance(exc, errors.InvalidInput) and f"{name!r} is the last admin" in exc.message
        with operators[0] as check:
            assert [u["name"] for u in check.users() if u["role"] == "admin"] == [name]
    finally:  # the module's admin comes back with its own credentials
        with coordinator.connect(cluster.replica_addresses[0], credentials=replicas_identity(cluster)) as op:
            kept = {u["name"] for u in op.users()}
            for creds in (cluster.credentials, second):
                if creds.user not in kept:
                    op.call("create_user", name=creds.user, role="admin", tables=None, secret=creds.secret)
            op.drop_user("admin_b")
        operators[1].close()


# -- replica retire ------------------------------------------------------------------------------
def test_retire_refuses_an_empty_or_malformed_id_and_writes_nothing(cluster: coordinator.LocalCluster) -> None:
    ident = Credentials.from_file(cluster.workdir / "security" / REPLICA_FILE)
    zk = KazooClient(hosts=cluster.zk_address, **zk_client_args(ident))
    zk.start(timeout=30)
    try:
        node = f"{cluster.root}/replicas"
        before = (zk.get(node)[0], sorted(zk.get_children(node)))
        for bad in ("", "a/b", "..", ".", "x" * 65, "r 1"):
            r = invoke(
                cluster,
                "replica",
                "retire",
                bad,
                "--zk",
                cluster.zk_address,
                "--root",
                cluster.root,
                "--credentials",
                cluster.workdir / "security" / REPLICA_FILE,
            )
            one_error_line(r, EXIT_USAGE, "host id", "--host-id")
            assert (zk.get(node)[0], sorted(zk.get_children(node))) == before
    finally:
        zk.stop()
        zk.close()


# -- security add-user ---------------------------------------------------------------------------
def test_add_user_writes_nothing_unless_its_credentials_file_can_be_written(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, tmp_path: Path
) -> None:
    def users() -> list[str]:
        return sorted(u["name"] for u in admin.users())

    before = users()
    r = invoke(cluster, "security", "add-user", "ghost", "--role", "reader", "--out", "/proc/x.json")
    assert r.exit_code != 0 and "/proc/x.json" in r.output and "Traceback" not in r.output, r.output
    r = invoke(cluster, "security", "add-user", "ghost", "--role", "reader", "--out", tmp_path / "nodir" / "g.json")
    one_error_line(r, EXIT_USAGE, "does not exist")
    taken = tmp_path / "taken.json"
    taken.write_text("{}")
    one_error_line(
        invoke(cluster, "security", "add-user", "ghost", "--role", "reader", "--out", taken), EXIT_USAGE, "exists"
    )
    one_error_line(
        invoke(cluster, "security", "add-user", "g" * 300, "--role", "reader", "--out", tmp_path / "long.json"),
        EXIT_USAGE,
        "user name",
    )
    assert users() == before and not (tmp_path / "long.json").exists()
    made = invoke(cluster, "security", "add-user", "ghost", "--role", "reader", "--out", tmp_path / "ghost.json")
    assert made.exit_code == 0, made.output
    assert "ghost" in users()
    admin.drop_user("ghost")


# -- backup and restore --------------------------------------------------------------------------
@pytest.mark.slow
def test_a_keys_table_of_150000_keys_restores_new_and_in_place(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, tmp_path: Path
) -> None:
    admin.create_table("big", KEYS, primary_key=["k"], conflict_policy="keys", auto_merge=False)
    assert admin.describe_table("big")["txn_max_rows"] == 100_000
    for first in (0, 75_000):  # each insert within the table's limit
        keys = pa.array(range(first, first + 75_000), pa.int64())
        with admin.transaction() as tx:
            tx.insert("big", pa.table({"k": keys, "a": pc.cast(keys, pa.string())}))
    expected = sorted_rows(admin.read("big"))
    assert len(expected) == 150_000
    assert invoke(cluster, "backup", "big", tmp_path / "b").exit_code == 0
    r = invoke(cluster, "restore", tmp_path / "b", "--as", "big_copy", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["rows"] == 150_000
    assert sorted_rows(admin.read("big_copy")) == expected
    assert admin.describe_table("big_copy")["txn_max_rows"] == 100_000  # the backup's definition
    with admin.transaction() as tx:
        tx.delete_keys("big", pa.table({"k": pa.array(range(10), pa.int64())}))
    r = invoke(cluster, "restore", tmp_path / "b", "--json")  # in place
    assert r.exit_code == 0, r.output
    assert sorted_rows(admin.read("big")) == expected
    assert admin.describe_table("big")["txn_max_rows"] == 100_000


def forge(backup: Path, storage: Storage, tmp_path: Path) -> None:
    """Replace the backup's first part by a part of other rows and fix every checksum, size and
    SHA-256 that the manifest names for it (what someone who can write the directory can do)."""
    manifest = json.loads((backup / "manifest.json").read_text())
    entry = manifest["parts"][0]
    fake = write_part(
        Storage(str(tmp_path / "forge")), "fg", [], (), pa.table({"id": [666], "v": ["forged"]}, SCHEMA), "x"
    )
    raw = (tmp_path / "forge" / fake.path).read_bytes()
    (backup / entry["file"]).write_bytes(raw)
    entry["size"] = entry["meta"]["size"] = len(raw)
    entry["checksum"] = entry["meta"]["checksum"] = checksum_of(raw)
    entry["sha256"] = hashlib.sha256(raw).hexdigest()
    (backup / "manifest.json").write_text(json.dumps(manifest, indent=1))


def test_a_sealed_backup_of_a_partitioned_table_restores(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, tmp_path: Path
) -> None:
    schema = pa.schema([("id", pa.int64()), ("day", pa.date32()), ("x", pa.float64()), ("s", pa.string())])
    admin.create_table("sealed_p", schema, partition_by=["day"], auto_merge=False)
    data = pa.table(
        {
            "id": [1, 2, 3],
            "day": pa.array([0, 19000, 20000], pa.date32()),
            "x": [0.1, 1e300, -2.5],
            "s": ["é", '"q"', None],
        },
        schema,
    )
    with admin.transaction() as tx:
        tx.insert("sealed_p", data)
    assert invoke(cluster, "backup", "sealed_p", tmp_path / "b").exit_code == 0
    assert "mac" in json.loads((tmp_path / "b" / "manifest.json").read_text())
    r = invoke(cluster, "restore", tmp_path / "b", "--as", "sealed_p2")
    assert r.exit_code == 0, r.output
    assert sorted_rows(admin.read("sealed_p2")) == sorted_rows(data)


def same_crc32(raw: bytes, changed_at: int, fixed_at: int) -> bytes:
    """Other bytes of the same size and crc32 as ``raw`` (crc32 is linear: the 32 bits at
    ``fixed_at`` are solved for, after the byte at ``changed_at`` was changed)."""
    forged = bytearray(raw)
    forged[changed_at] ^= 0xFF
    want = zlib.crc32(raw) ^ zlib.crc32(bytes(forged))
    rows = []  # (what flipping one bit does to the crc32, which bit), reduced to echelon form
    for bit in range(32):
        flipped = bytearray(forged)
        flipped[fixed_at + bit // 8] ^= 1 << (bit % 8)
        rows.append((zlib.crc32(bytes(flipped)) ^ zlib.crc32(bytes(forged)), 1 << bit))
    basis: list[tuple[int, int]] = []
    for effect, bits in rows:
        for b_effect, b_bits in basis:
            if effect ^ b_effect < effect:
                effect, bits = effect ^ b_effect, bits ^ b_bits
        if effect:
            basis.append((effect, bits))
            basis.sort(reverse=True)
    flip = 0
    for b_effect, b_bits in basis:
        if want ^ b_effect < want:
            want, flip = want ^ b_effect, flip ^ b_bits
    assert want == 0
    for bit in range(32):
        if flip >> bit & 1:
            forged[fixed_at + bit // 8] ^= 1 << (bit % 8)
    assert zlib.crc32(bytes(forged)) == zlib.crc32(raw) and bytes(forged) != raw
    return bytes(forged)


def backed_up(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, table: str, rows: pa.Table, directory: Path
) -> Path:
    """``table`` made with ``rows`` in one commit and backed up into ``directory`` (returned)."""
    admin.create_table(table, SCHEMA, auto_merge=False)
    with admin.transaction() as tx:
        tx.insert(table, rows)
    assert invoke(cluster, "backup", table, directory).exit_code == 0
    return directory


def test_a_part_of_the_same_size_and_crc32_is_refused_by_its_sha256(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, tmp_path: Path
) -> None:
    b = backed_up(cluster, admin, "crc_t", pa.table({"id": [1, 2], "v": ["a", "b"]}, SCHEMA), tmp_path / "b")
    entry = json.loads((b / "manifest.json").read_text())["parts"][0]
    raw = (b / entry["file"]).read_bytes()
    (b / entry["file"]).write_bytes(same_crc32(raw, len(raw) // 2, len(raw) // 2 + 8))
    snap = admin.snapshot()
    one_error_line(invoke(cluster, "restore", b, "--as", "crc_new"), EXIT_CORRUPT, "SHA-256", "nothing restored")
    assert admin.snapshot() == snap and "crc_new" not in admin.tables()


def test_a_forged_backup_is_refused_by_its_mac_and_changes_nothing(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, tmp_path: Path
) -> None:
    b = backed_up(cluster, admin, "fg", pa.table({"id": [1], "v": ["real"]}, SCHEMA), tmp_path / "b")
    assert len(json.loads((b / "manifest.json").read_text())["mac"]) == 64
    forge(b, admin.storage, tmp_path)
    snap, before = admin.snapshot(), admin.read("fg")
    for args in (("--as", "fg_new"), ()):  # a new table, and in place
        one_error_line(invoke(cluster, "restore", b, *args), EXIT_CORRUPT, "does not match its MAC", "nothing restored")
    assert admin.snapshot() == snap and "fg_new" not in admin.tables()
    assert admin.read("fg").to_pylist() == before.to_pylist() == [{"id": 1, "v": "real"}]
    manifest = json.loads((b / "manifest.json").read_text())
    del manifest["mac"]  # a seal taken off is no better
    (b / "manifest.json").write_text(json.dumps(manifest))
    one_error_line(invoke(cluster, "restore", b), EXIT_USAGE, "carries no MAC", "--unverified")
    assert admin.snapshot() == snap
    reader = tmp_path / "reader.json"
    cluster.add_user("ops_reader", "reader").to_file(reader)
    one_error_line(invoke(cluster, "backup", "fg", tmp_path / "b2", credentials=reader), EXIT_DENIED, "ops_reader")
    assert not (tmp_path / "b2" / "manifest.json").exists()
    with coordinator.connect(cluster.replica_addresses[0], credentials=cluster.add_user("ops_w", "writer")) as w:
        with pytest.raises(errors.PermissionDenied, match="free of the tables' limits"):  # an admin's only
            w.begin(table_limits=False)


def test_a_mac_or_sha256_that_is_not_hex_is_corrupt_metadata(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, tmp_path: Path
) -> None:
    b = backed_up(cluster, admin, "hex_t", pa.table({"id": [1], "v": ["a"]}, SCHEMA), tmp_path / "b")
    good = json.loads((b / "manifest.json").read_text())
    for field, bad in (("mac", "é" * 64), ("mac", 7), ("sha256", "Z" * 64), ("sha256", None)):
        manifest = json.loads(json.dumps(good))
        (manifest if field == "mac" else manifest["parts"][0])[field] = bad
        (b / "manifest.json").write_text(json.dumps(manifest))
        one_error_line(invoke(cluster, "restore", b, "--as", "hex_new"), EXIT_CORRUPT, "manifest")
    assert "hex_new" not in admin.tables()
