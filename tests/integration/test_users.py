"""Users, roles and grants (docs/surface.md#users-roles-and-grants and docs/surface.md#security): a
secured cluster has users with roles and table grants, checked on the replica for every action; the
replicas' own identity (ZooKeeper, replica to replica) is no user's.

The first part checks the pure matrix (coordinator/core/grants.py) against a table written out here from
docs/surface.md#users-roles-and-grants, never derived from the module. The rest drives a
LocalCluster(secure=True): its own ZooKeeper and two replica processes, every call over TLS as one
of the users made here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from kazoo.client import KazooClient
from support.cluster import make_cluster  # tests/ is on sys.path
from support.waiting import poll
from support.zk import assert_no_session

import coordinator
from coordinator import errors
from coordinator.core import grants
from coordinator.core.grants import Grantee, Role
from coordinator.model.users import UserRecord, decode, encode, verify_secret
from coordinator.wire.rpc import RpcClient
from coordinator.wire.security import REPLICA_FILE, Credentials, zk_client_args
from mergetxn.cli import EXIT_AUTH, EXIT_DENIED, cli
from replicas.users import Users

SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.string())])
ROWS = pa.table({"id": [1, 2], "k": ["a", "b"]})

# =============================================================================================
# The matrix, transcribed from docs/surface.md#users-roles-and-grants: which roles may make each
# replica action
# =============================================================================================

R, W, A = "reader", "writer", "admin"
MATRIX_TEXT = """
| action | reader | writer | admin |
|---|---|---|---|
| info | yes | yes | yes |
| tables | yes | yes | yes |
| snapshot | yes | yes | yes |
| wait | yes | yes | yes |
| commit_status | yes | yes | yes |
| app_version | yes | yes | yes |
| transactions | yes | yes | yes |
| flush | yes | yes | yes |
| renew | yes | yes | yes |
| release | yes | yes | yes |
| heartbeat | yes | yes | yes |
| peers | yes | yes | yes |
| storage | yes | yes | yes |
| table | yes | yes | yes |
| describe_table | yes | yes | yes |
| parts | yes | yes | yes |
| changes | yes | yes | yes |
| events | yes | yes | yes |
| visible | yes | yes | yes |
| begin | yes | yes | yes |
| add_read | yes | yes | yes |
| rollback | yes | yes | yes |
| commit | yes | yes | yes |
| stage insert | no | yes | yes |
| stage overwrite | no | yes | yes |
| stage truncate | no | yes | yes |
| stage delete | no | yes | yes |
| stage update | no | yes | yes |
| stage compact | no | yes | yes |
| stage drop_table | no | no | yes |
| set_app_version | no | yes | yes |
| kill | no | yes | yes |
| commit_parts | no | yes | yes |
| compact | no | yes | yes |
| create_table | no | no | yes |
| alter_table | no | no | yes |
| gc | no | no | yes |
| users | no | no | yes |
| create_user | no | no | yes |
| drop_user | no | no | yes |
| backup_mac | no | no | yes |
| check | no | no | yes |
| some_future_action | no | no | yes |
"""


def parse_matrix(text: str) -> dict[str, dict[str, bool]]:
    rows = [line.strip().strip("|").split("|") for line in text.strip().splitlines()[2:]]
    return {
        cells[0].strip(): {role: cells[i + 1].strip() == "yes" for i, role in enumerate((R, W, A))} for cells in rows
    }


MATRIX = parse_matrix(MATRIX_TEXT)
TABLE_ARG = {
    "table": "t",
    "describe_table": "t",
    "parts": "t",
    "changes": "t",
    "events": "t",
    "visible": "t",
    "commit_parts": "t",
    "compact": "t",
    "create_table": "t",
    "alter_table": "t",
    "commit_status": "t",
}
TABLE_FIELD = {"describe_table": "name", "table": "name", "create_table": "name", "alter_table": "name"}


def request(action: str, table: str = "t") -> tuple[str, dict]:
    """The action and the arguments of a request of that row of the matrix, on ``table``."""
    if action.startswith("stage "):
        return "stage", {"id": "x", "ops": [{"op": action.split()[1], "table": table}]}
    args = {TABLE_FIELD.get(action, "table"): table} if action in TABLE_ARG else {}
    return action, args


@pytest.mark.parametrize("action", sorted(MATRIX))
@pytest.mark.parametrize("role", [R, W, A])
def test_each_role_may_make_what_spec_says_and_nothing_else(role: str, action: str) -> None:
    who = Grantee("u", Role(role))
    name, args = request(action)
    if MATRIX[action][role]:
        grants.check(who, name, args)
        return
    with pytest.raises(errors.PermissionDenied) as info:
        grants.check(who, name, args)
    said = info.value.message
    assert "'u'" in said and role in said and (action.split()[-1] in said)
    assert info.value.details["user"] == "u" and info.value.details["action"] == action.split()[-1]
    if action in TABLE_ARG or action.startswith("stage "):
        assert "'t'" in said and info.value.details["table"] == "t"


def test_every_action_of_the_grants_has_a_row_here_and_every_operation_kind_too() -> None:
    rows = {a for a in MATRIX if not a.startswith("stage ")} - {"some_future_action"}
    assert set(grants.ACTIONS) == rows | {"stage"}  # stage: by the kinds of its operations
    assert set(grants.OP_RIGHTS) == {a.split()[1] for a in MATRIX if a.startswith("stage ")}


@pytest.mark.parametrize("action", sorted(a for a in MATRIX if a in TABLE_ARG or a.startswith("stage ")))
@pytest.mark.parametrize("role", [R, W])
def test_table_grants_bound_reads_and_writes(role: str, action: str) -> None:
    granted = Grantee("u", Role(role), frozenset({"t"}))
    name, args = request(action, "other")
    if not MATRIX[action][role]:
        return  # the role alone refuses it (the test above)
    if action == "table":  # a definition (the schema) is any user's to look up, as in PostgreSQL's catalogs
        grants.check(granted, name, args)
        return
    grants.check(granted, *request(action, "t"))
    with pytest.raises(errors.PermissionDenied, match="'other'") as info:
        grants.check(granted, name, args)
    assert info.value.details["table"] == "other"


def test_an_admin_has_every_table_and_events_of_every_table_need_every_table() -> None:
    grants.check(Grantee("a", Role.ADMIN), "stage", {"id": "x", "ops": [{"op": "insert", "table": "any"}]})
    grants.check(Grantee("r", Role.READER), "events", {})  # no table: every table, which it has
    with pytest.raises(errors.PermissionDenied, match="events"):
        grants.check(Grantee("r", Role.READER, frozenset({"t"})), "events", {})
    with pytest.raises(errors.InvalidInput, match="admin has every table"):
        UserRecord.new("a2", "admin", ["t"], "s" * 20)


def test_a_transaction_of_another_user_is_not_yours_to_touch() -> None:
    owners = {"mine": "w", "theirs": "v"}.get
    writer, admin = Grantee("w", Role.WRITER), Grantee("boss", Role.ADMIN)
    for action in ("kill", "rollback", "stage", "commit", "visible", "add_read", "set_app_version"):
        args = {"id": "theirs", "table": "t", "ops": []}
        grants.check(writer, action, {**args, "id": "mine"}, owners)
        grants.check(admin, action, args, owners)  # an admin may touch any
        with pytest.raises(errors.PermissionDenied, match="belongs to another user"):
            grants.check(writer, action, args, owners)
        grants.check(writer, action, {**args, "id": "not-here"}, owners)  # not held here: the action says so itself


def test_a_statement_name_names_a_refusal_and_never_grants_anything() -> None:
    reader, writer = Grantee("r", Role.READER), Grantee("w", Role.WRITER)
    upsert = {"id": "x", "statement": "upsert", "ops": [{"op": "insert", "table": "t"}]}
    with pytest.raises(errors.PermissionDenied, match="may not upsert on table 't'"):
        grants.check(reader, "stage", upsert)
    grants.check(writer, "stage", upsert)
    disguised = {"id": "x", "statement": "insert", "ops": [{"op": "drop_table", "table": "t"}]}
    with pytest.raises(errors.PermissionDenied, match="admins only"):
        grants.check(writer, "stage", disguised)  # the operation decides, whatever it is called
    with pytest.raises(errors.PermissionDenied, match="may not insert"):
        grants.check(reader, "stage", {**upsert, "statement": "<script>"})  # an unknown name is not shown
    parts = {"table": "t", "added": [], "statement": "insert"}  # client.insert's one call
    with pytest.raises(errors.PermissionDenied, match="may not insert on table 't'"):
        grants.check(reader, "commit_parts", parts)
    with pytest.raises(errors.PermissionDenied, match="may not commit_parts on table 't'"):
        grants.check(reader, "commit_parts", {**parts, "statement": "upsert"})  # only insert is shown
    grants.check(writer, "commit_parts", parts)


def test_user_records_keep_a_salted_hash_never_the_secret() -> None:
    one, two = UserRecord.new("u", "reader", None, "x" * 30), UserRecord.new("v", "reader", None, "x" * 30)
    assert one.secret_hash != two.secret_hash  # salted
    assert verify_secret("x" * 30, one.secret_hash) and not verify_secret("y" * 30, one.secret_hash)
    stored = encode({"u": one, "v": two})
    assert b"x" * 30 not in stored and "x" * 30 not in repr(one)
    assert decode(stored, "/n") == {"u": one, "v": two}
    for bad in (b"{", b'{"users": []}', b'{"users": {"u": {"role": "god", "secret": "s"}}}'):
        with pytest.raises(errors.CorruptMetadata, match="/n"):
            decode(bad, "/n")
    for name, role, tables, secret, field in (
        ("", R, None, "s" * 20, "name"),
        ("a/b", R, None, "s" * 20, "name"),
        ("u", "root", None, "s" * 20, "role"),
        ("u", R, "t", "s" * 20, "tables"),
        ("u", R, None, "short", "secret"),
    ):
        with pytest.raises(errors.InvalidInput) as info:
            UserRecord.new(name, role, tables, secret)
        assert info.value.details["field"] == field and "s" * 20 not in info.value.message


# =============================================================================================
# A secured cluster
# =============================================================================================

QUOTA = 6  # user_max_transactions and user_max_read_leases of the module's cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[coordinator.LocalCluster]:
    with make_cluster(
        tmp_path_factory,
        None,
        "users",
        replicas=2,
        secure=True,
        settings={"user_max_transactions": QUOTA, "user_max_read_leases": QUOTA},
        env={"MERGETXN_LOG": "DEBUG,kazoo=DEBUG"},
    ) as c:
        yield c


@pytest.fixture(scope="module")
def admin(cluster: coordinator.LocalCluster) -> Iterator[coordinator.Client]:
    client = cluster.client(0)
    for name in ("t", "other"):
        client.create_table(name, SCHEMA, auto_merge=False)
        with client.transaction() as tx:
            tx.insert(name, ROWS)
    yield client
    client.close()


@pytest.fixture(scope="module")
def made(cluster: coordinator.LocalCluster, admin: coordinator.Client) -> dict[str, Credentials]:
    """One user per role with every table, and a writer and a reader with grants on ``t`` only."""
    return {
        R: cluster.add_user("reader1", R),
        W: cluster.add_user("writer1", W),
        A: cluster.add_user("admin1", A),
        "w_t": cluster.add_user("writer_t", W, ["t"]),
        "r_t": cluster.add_user("reader_t", R, ["t"]),
    }


def connect(cluster: coordinator.LocalCluster, creds: Credentials, i: int = 0) -> coordinator.Client:
    return coordinator.connect(cluster.replica_addresses[i], credentials=creds)


def state(admin: coordinator.Client) -> tuple:
    """What a refused call must leave as it was: the log, the tables, the rows, the users."""
    return (
        admin.snapshot(),
        admin.tables(),
        admin.read("t").num_rows,
        admin.read("other").num_rows,
        [u["name"] for u in admin.users()],
    )


def raw_args(action: str, txn: str | None, table: str = "t") -> tuple[str, dict]:
    """A request of each row of the matrix, as a client library would send it (or near enough:
    an allowed one may still fail on its arguments, never with PermissionDenied)."""
    if action.startswith("stage "):
        kind = action.split()[1]
        op = {"op": kind, "table": table}
        if kind == "compact":
            op["compact_kind"] = "minor"
        if kind in ("delete", "update"):
            op["where"] = "bogus"
        return "stage", {"id": txn, "ops": [op]}
    args: dict = {
        "wait": {"snapshot": 0},
        "commit_status": {"tid": txn or "0-0-r0"},
        "app_version": {"app_id": "app"},
        "flush": {"session": "s", "ack": []},
        "renew": {"lease": "nope"},
        "release": {"lease": "nope"},
        "heartbeat": {"session": "s"},
        "table": {"name": table},
        "describe_table": {"name": table},
        "parts": {"table": table},
        "changes": {"table": table, "start": 0},
        "events": {"table": table},
        "visible": {"table": table},
        "add_read": {"id": txn, "read": {"table": table, "where": None}},
        "rollback": {"id": txn},
        "commit": {"id": txn},
        "set_app_version": {"id": txn, "app_id": "app", "version": 1},
        "kill": {"id": txn},
        "commit_parts": {"table": table, "added": []},
        "compact": {"table": table},
        "create_table": {"name": "made_by_" + table, "schema": "not a schema"},
        "alter_table": {"name": table, "rename_columns": {"nope": "nope2"}},
        "gc": {"grace_seconds": 3600},
        "create_user": {"name": "zz", "role": "nobody", "secret": "s" * 20},
        "drop_user": {"name": "nobody-by-that-name"},
        "backup_mac": {"digest": "0" * 64},
    }.get(action, {})
    return action, args


def test_the_role_matrix_on_the_replica_allows_or_refuses_with_nothing_changed(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, made: dict[str, Credentials]
) -> None:
    for role in (R, W, A):
        rpc = RpcClient(cluster.replica_addresses[0], 30, made[role])
        try:
            for action in sorted(set(MATRIX) - {"some_future_action"}):  # a replica has no such action
                txn = rpc.call("begin", {})["id"]  # its own transaction, for the actions on one
                name, args = raw_args(action, txn)
                before = state(admin)
                try:
                    rpc.call(name, args)
                except errors.PermissionDenied as exc:
                    assert not MATRIX[action][role], f"{role} may {action}: {exc}"
                    assert f"'{made[role].user}'" in exc.message and action.split()[-1] in exc.message
                    assert state(admin) == before, f"{role} {action} changed something"
                    assert txn in {t["id"] for t in admin.transactions()}  # its transaction still runs
                except errors.MergetxnError as exc:
                    assert MATRIX[action][role], f"{role} may not {action}, but got {exc!r}"
                    assert "unknown replica action" not in exc.message  # the matrix names the replica's actions
                else:
                    assert MATRIX[action][role], f"{role} may not {action}, but it was answered"
                try:
                    rpc.call("rollback", {"id": txn})
                except errors.MergetxnError:
                    pass  # ended already (committed, killed)
        finally:
            rpc.close()


def test_per_table_grants(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, made: dict[str, Credentials]
) -> None:
    with connect(cluster, made["w_t"], 1) as w, connect(cluster, made["r_t"]) as r:
        assert w.tables() == ["t"] and r.tables() == ["t"]  # only what they have grants on
        with w.transaction() as tx:
            tx.insert("t", pa.table({"id": [10], "k": ["w"]}))
        assert 10 in r.read("t", snapshot=tx.csn).column("id").to_pylist()
        before = state(admin)
        with pytest.raises(
            errors.PermissionDenied, match=r"user 'writer_t' \(writer\) may not insert on table 'other'"
        ):
            with w.transaction() as tx:
                tx.insert("other", ROWS)
        with pytest.raises(errors.PermissionDenied, match="'reader_t'.*read.*'other'|'reader_t'.*visible.*'other'"):
            r.read("other")
        with pytest.raises(errors.PermissionDenied, match="'other'"):
            r.describe_table("other")
        with pytest.raises(errors.PermissionDenied, match="'other'"):
            w.compact("other")
        assert state(admin) == before


def test_a_grant_names_a_table_and_holds_for_one_made_again_under_its_name(
    cluster: coordinator.LocalCluster, admin: coordinator.Client
) -> None:
    """docs/how-to/secured-cluster.md: a grant is by name, as ClickHouse's."""
    admin.create_table("again_t", SCHEMA)
    creds = cluster.add_user("writer_again", W, ["again_t"])
    try:
        admin.drop_table("again_t")
        other = pa.schema([("id", pa.int64()), ("note", pa.string())])
        admin.create_table("again_t", other)
        with connect(cluster, creds) as w:
            assert w.tables() == ["again_t"]
            w.insert("again_t", pa.table({"id": [1], "note": ["n"]}, schema=other))
            assert w.read("again_t").to_pylist() == [{"id": 1, "note": "n"}]
    finally:
        admin.drop_user("writer_again")
        admin.drop_table("again_t")


def test_a_refused_statement_leaves_the_transaction_usable(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, made: dict[str, Credentials]
) -> None:
    with connect(cluster, made[R]) as reader, connect(cluster, made["w_t"]) as writer:
        tx = reader.begin()  # a reader begins a transaction to read
        rows = tx.read("t").num_rows
        with pytest.raises(errors.PermissionDenied, match=r"'reader1' \(reader\) may not insert on table 't'"):
            tx.insert("t", ROWS)
        assert tx.read("t").num_rows == rows  # still usable, and nothing of the refused insert
        assert tx.commit() is not None
        tx = writer.begin()
        tx.insert("t", pa.table({"id": [20], "k": ["x"]}))
        with pytest.raises(errors.PermissionDenied, match="'other'"):
            tx.insert("other", ROWS)
        with pytest.raises(errors.PermissionDenied, match="drop_table"):
            tx.drop_table("t")
        csn = tx.commit()
        assert 20 in admin.read("t", snapshot=csn).column("id").to_pylist()
        assert admin.read("other").num_rows == ROWS.num_rows


def test_refusals_on_a_keys_table_name_the_statement_the_user_made(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, made: dict[str, Credentials]
) -> None:
    admin.create_table(
        "kv",
        pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.string())]),
        primary_key=["k"],
        conflict_policy="keys",
    )
    with admin.transaction() as tx:
        tx.upsert("kv", pa.table({"k": [1], "v": ["a"]}))
    keys_ = pa.table({"k": pa.array([1], pa.int64())})
    with connect(cluster, made[R]) as reader:
        tx = reader.begin()
        before = state(admin)
        for statement, call in (
            ("upsert", lambda: tx.upsert("kv", pa.table({"k": [2], "v": ["b"]}))),
            ("delete_keys", lambda: tx.delete_keys("kv", keys_)),
            ("lock_keys", lambda: tx.lock_keys("kv", keys_)),
            ("insert", lambda: tx.insert("kv", pa.table({"k": [3], "v": ["c"]}))),
            ("truncate", lambda: tx.truncate("kv")),
        ):
            with pytest.raises(
                errors.PermissionDenied, match=rf"user 'reader1' \(reader\) may not {statement} on table 'kv'"
            ):
                call()
        assert tx.read("kv").num_rows == 1
        tx.commit()
        assert state(admin) == before and admin.read("kv").num_rows == 1


def test_a_refused_one_call_insert_names_insert_and_leaves_no_files(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, made: dict[str, Credentials]
) -> None:
    """client.insert is refused like tx.insert (naming the statement, not the one call that
    carries it), commits nothing and deletes the files it wrote; a writer's commits."""
    root = Path(cluster.storage_url) / "t"
    files = set(root.rglob("*"))
    before = state(admin)
    rows = pa.table({"id": [40], "k": ["k"]})
    with connect(cluster, made[R]) as reader:
        with pytest.raises(errors.PermissionDenied, match=r"user 'reader1' \(reader\) may not insert on table 't'"):
            reader.insert("t", rows)
    assert state(admin) == before and set(root.rglob("*")) == files
    with connect(cluster, made["w_t"]) as writer:
        csn = writer.insert("t", rows)
    assert admin.read("t", snapshot=csn).num_rows == before[2] + 1


def test_a_writer_kills_its_own_transactions_only(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, made: dict[str, Credentials]
) -> None:
    with connect(cluster, made[W]) as w1, connect(cluster, made["w_t"]) as w2, connect(cluster, made[R]) as r:
        theirs = w1.begin()
        theirs.insert("t", pa.table({"id": [30], "k": ["k"]}))
        for who in (w2, r):
            with pytest.raises(errors.PermissionDenied, match=f"{theirs.id} belongs to another user|kill"):
                who.kill(theirs.id)
            with pytest.raises(errors.PermissionDenied, match="belongs to another user"):
                who.call("rollback", id=theirs.id)
        listed = {t["id"]: t["owner"] for t in w2.transactions()}
        assert theirs.id not in listed  # a non-admin sees its own only
        assert {t["id"]: t["owner"] for t in admin.transactions()}[theirs.id] == "writer1"
        theirs.commit()  # untouched by the refused kills
        own = w2.begin()
        assert w2.kill(own.id)["id"] == own.id
        mine = r.begin()
        with pytest.raises(errors.PermissionDenied, match="kill"):
            r.kill(mine.id)  # a reader kills nothing, but ends its own transaction
        mine.rollback()
        other = w1.begin()
        admin.kill(other.id)  # an admin kills any
        with pytest.raises(errors.TransactionAborted):
            other.commit()


def test_quotas_on_running_transactions_and_read_leases(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, made: dict[str, Credentials]
) -> None:
    q = cluster.add_user("quota_user", W)
    with connect(cluster, q) as c, connect(cluster, made[W]) as other:
        txns = [c.begin() for _ in range(QUOTA)]
        with pytest.raises(errors.QuotaExceeded) as info:
            c.begin()
        assert isinstance(info.value, errors.PermissionDenied)
        for said in ("'quota_user'", "user_max_transactions", str(QUOTA)):
            assert said in info.value.message
        assert other.begin().rollback() is None  # another user is not held back
        txns[0].rollback()
        c.begin().rollback()
        for t in txns[1:]:
            t.rollback()
        leases = [c.call("visible", table="t")["lease"] for _ in range(QUOTA)]
        with pytest.raises(errors.QuotaExceeded, match=f"'quota_user'.*user_max_read_leases={QUOTA}"):
            c.read("t")
        assert other.read("t").num_rows > 0
        c.call("release", lease=leases[0])
        assert c.read("t").num_rows > 0  # a read's lease ends with it
        for lease in leases[1:]:
            c.call("release", lease=lease)


def test_a_dropped_user_is_refused_on_every_replica(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, made: dict[str, Credentials]
) -> None:
    gone = cluster.add_user("short_lived", W)
    on0, on1 = connect(cluster, gone, 0), connect(cluster, gone, 1)
    try:
        assert on0.read("t").num_rows > 0 and on1.snapshot() >= 0
        admin.drop_user("short_lived")
        assert "short_lived" not in [u["name"] for u in admin.users()]
        with pytest.raises(errors.AuthenticationFailed, match="short_lived"):
            on0.snapshot()  # an open connection: refused from its next call on
        with pytest.raises(errors.AuthenticationFailed):
            connect(cluster, gone, 0)  # a new login, on the replica that dropped it: at once

        def refused(call) -> bool:
            try:
                call()
            except errors.AuthenticationFailed:
                return True
            return False

        # The other replica learns it from its watch on the users node.
        assert poll(lambda: refused(on1.snapshot), timeout=10)
        assert refused(lambda: connect(cluster, gone, 1))
        again = cluster.add_user("short_lived", R)  # the same name again: the old credentials stay refused
        assert refused(on1.snapshot) and refused(lambda: connect(cluster, gone, 0))
        with connect(cluster, again, 1) as back:
            assert back.tables()
    finally:
        on0.close()
        on1.close()
        admin.drop_user("short_lived")


def test_users_are_listed_and_the_replicas_identity_is_none_of_them(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, made: dict[str, Credentials]
) -> None:
    listed = {u["name"]: u for u in admin.users()}
    assert listed["admin"]["role"] == "admin" and listed["admin"]["tables"] is None
    assert listed["writer_t"]["role"] == "writer" and listed["writer_t"]["tables"] == ["t"]
    replicas = Credentials.from_file(cluster.workdir / "security" / REPLICA_FILE)
    assert replicas.user not in listed
    with pytest.raises(errors.InvalidInput, match="replicas' own identity"):
        admin.create_user(replicas.user, R)
    with pytest.raises(errors.InvalidInput, match="exists already"):
        admin.create_user("writer_t", W)
    with pytest.raises(errors.PermissionDenied, match="users"):
        with connect(cluster, made[W]) as w:
            w.users()
    with connect(cluster, made[A]) as second_admin:  # an admin made by an admin does what admins do
        second_admin.create_table("by_admin1", SCHEMA)
        assert "by_admin1" in second_admin.tables()


def test_the_listing_reads_the_users_as_zookeeper_holds_them_not_as_a_watch_last_brought(
    zk_client: KazooClient,
) -> None:
    """A user made or dropped through another replica is listed so at once: the copy a replica's
    watch keeps may lag behind (here it never catches up), so the listing reads the node."""
    identity = Credentials("replicas", "r" * 32)
    elsewhere = Users(zk_client, "/users", identity)
    elsewhere.start()
    here = Users(zk_client, "/users", identity)
    here.refresh()  # this replica's copy, and no watch to bring it the changes made elsewhere
    elsewhere.create("admin_a", A, None, "a" * 32)
    elsewhere.create("admin_b", A, None, "b" * 32)
    assert [u["name"] for u in here.describe()] == ["admin_a", "admin_b"]
    elsewhere.drop("admin_a")
    assert [u["name"] for u in here.describe()] == ["admin_b"]


def test_the_listing_without_zookeeper_is_refused_and_without_the_node_is_empty(zk_address: str) -> None:
    """Not the copy a replica last had: ReplicaUnavailable when its ZooKeeper client does not
    answer (here: closed), no user once the node is gone."""
    identity = Credentials("replicas", "r" * 32)
    zk = KazooClient(hosts=zk_address)
    zk.start(timeout=30)
    users = Users(zk, "/users", identity)
    users.start()
    users.create("admin_a", A, None, "a" * 32)
    assert [u["name"] for u in users.describe()] == ["admin_a"]
    zk.delete("/users")
    assert users.describe() == []
    zk.stop()
    zk.close()
    with pytest.raises(errors.ReplicaUnavailable, match="ZooKeeper does not answer"):
        users.describe()


def test_nothing_a_user_holds_logs_in_to_zookeeper(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, made: dict[str, Credentials]
) -> None:
    root = cluster.root
    for creds in (cluster.credentials, made[W], made[R]):
        data = (
            json.loads(Path(cluster.workdir / "security" / "admin.json").read_text())
            if creds is cluster.credentials
            else None
        )
        assert data is None or set(data) == {"user", "secret", "ca_file"}  # nothing else to log in with
        assert creds.cert_file is None and creds.key_file is None
        with pytest.raises(errors.InvalidInput, match="replicas only"):
            creds.zk_auth()
        # What a user holds, tried as a ZooKeeper identity anyway (over the TLS-only client port,
        # tests/integration/test_zk_hardening.py): without a certificate of the cluster CA no
        # session is opened, whatever identity it gives.
        assert_no_session(
            cluster.zk_address,
            use_ssl=True,
            ca=str(creds.ca_file),
            check_hostname=True,
            auth_data=[("digest", f"{creds.user}:{creds.secret}")],
        )
    zk = KazooClient(
        hosts=cluster.zk_address,
        timeout=10,
        **zk_client_args(Credentials.from_file(cluster.workdir / "security" / REPLICA_FILE)),
    )
    zk.start(timeout=30)
    try:
        assert zk.exists(f"{root}/fence") is not None and zk.exists(f"{root}/users") is not None
    finally:
        zk.stop()
        zk.close()


def test_user_secrets_appear_in_no_log_error_listing_or_zookeeper_node(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, made: dict[str, Credentials]
) -> None:
    mine = cluster.add_user("secretive", R)
    wrong = Credentials("secretive", "W" * 40, mine.ca_file)
    with pytest.raises(errors.AuthenticationFailed) as info:
        connect(cluster, wrong)
    secrets = [c.secret for c in (*made.values(), mine, wrong, cluster.credentials)]
    shown = [str(info.value), repr(info.value), json.dumps(admin.users()), repr(mine), str(mine), repr(made)]
    replicas = Credentials.from_file(cluster.workdir / "security" / REPLICA_FILE)
    zk = KazooClient(hosts=cluster.zk_address, timeout=10, **zk_client_args(replicas))
    zk.start(timeout=30)
    try:
        node = zk.get(f"{cluster.root}/users")[0].decode()
    finally:
        zk.stop()
        zk.close()
    assert "scrypt$" in node and "secretive" in node
    logs = [(cluster.workdir / f"replica-{i}" / "replica.log").read_text(errors="replace") for i in range(cluster.n)]
    for secret in secrets:
        for text in shown + logs + [node]:
            assert secret not in text


def test_cli_add_user_users_drop_user_and_the_exit_code_of_a_refusal(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, tmp_path: Path
) -> None:
    runner = CliRunner()
    admin_file = str(cluster.workdir / "security" / "admin.json")
    common = ["--replica", cluster.replica_addresses[0], "--credentials", admin_file]
    out_file = tmp_path / "cli_w.json"
    made = runner.invoke(
        cli,
        ["security", "add-user", "cli_w", "--role", "writer", "--table", "t", "--out", str(out_file), *common],
        env={"MERGETXN_CREDENTIALS": ""},
    )
    assert made.exit_code == 0, made.output
    assert out_file.stat().st_mode & 0o777 == 0o600 and str(out_file) in made.output
    creds = Credentials.from_file(out_file)
    assert creds.user == "cli_w" and creds.secret not in made.output
    listed = runner.invoke(cli, ["security", "users", "--json", *common])
    assert listed.exit_code == 0, listed.output
    assert {"name": "cli_w", "role": "writer", "tables": ["t"]}.items() <= next(
        u for u in json.loads(listed.output) if u["name"] == "cli_w"
    ).items()
    as_writer = ["--replica", cluster.replica_addresses[0], "--credentials", str(out_file)]
    denied = runner.invoke(cli, ["gc", *as_writer])
    assert denied.exit_code == EXIT_DENIED and "cli_w" in denied.output and "gc" in denied.output
    assert runner.invoke(cli, ["snapshot", *as_writer]).exit_code == 0
    dropped = runner.invoke(cli, ["security", "drop-user", "cli_w", *common])
    assert dropped.exit_code == 0, dropped.output
    assert runner.invoke(cli, ["snapshot", *as_writer]).exit_code == EXIT_AUTH
    again = runner.invoke(cli, ["security", "add-user", "cli_w2", "--role", "reader", "--out", str(out_file), *common])
    assert again.exit_code != 0 and "exists" in again.output  # never overwrites a credentials file
    printed = CliRunner().invoke(cli, ["security", "add-user", "cli_r", "--role", "reader", "--out", "-", *common])
    assert printed.exit_code == 0, printed.output
    shown = json.loads(printed.stdout)
    assert shown["user"] == "cli_r" and Path(shown["ca_file"]).is_file()
    piped = tmp_path / "piped.json"
    piped.write_text(printed.stdout)
    piped.chmod(0o600)
    with coordinator.connect(cluster.replica_addresses[1], credentials=piped) as c:
        assert "t" in c.tables()


def test_an_unsecured_cluster_has_no_users_and_allows_everything(
    tmp_path_factory: pytest.TempPathFactory, zk_server: object
) -> None:
    with make_cluster(tmp_path_factory, zk_server, "open", replicas=1) as c, c.client(0) as client:
        assert c.credentials is None
        with pytest.raises(errors.InvalidInput, match="only a secured cluster"):
            c.add_user("u", R)
        with pytest.raises(errors.InvalidInput, match="not secured"):
            client.users()
        client.create_table("t", SCHEMA)
        tx = client.begin()
        tx.insert("t", ROWS)
        client.kill(tx.id)
        assert client.gc() is not None


def test_info_shows_a_non_admin_only_its_own_notable_transactions(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, made: dict[str, Credentials]
) -> None:
    """``info`` lists long-running transactions with their user and client session (what
    ``mergetxn status`` shows): a writer sees its own there, not another user's; an admin sees all."""
    admin.create_table("notable", SCHEMA, txn_max_seconds=20)  # long-running after a tenth of that
    with connect(cluster, made[W]) as w:
        theirs, mine = admin.begin(), w.begin()
        theirs.insert("notable", ROWS)
        mine.insert("notable", ROWS)

        def listed(client: coordinator.Client) -> set[str]:
            return {t["id"] for t in client.call("info")["transactions"]["long_running"]}

        assert poll(lambda: {theirs.id, mine.id} <= listed(admin), timeout=10), listed(admin)
        assert listed(w) == {mine.id}
        mine.rollback()
        theirs.rollback()


def test_history_names_the_user_who_committed_and_who_aborted(
    cluster: coordinator.LocalCluster, admin: coordinator.Client, made: dict[str, Credentials]
) -> None:
    """``mergetxn history`` says who: a writer's commit and its rolled-back transaction carry its
    name (from the replica's begin and rollback events), the admin's commit the admin's."""
    from mergetxn.tools.recovery import history

    admin.create_table("who", SCHEMA)
    writer = connect(cluster, made[W])
    with writer.transaction() as tx:
        tx.insert("who", pa.table({"id": [1], "k": ["a"]}))
    tx2 = writer.begin()
    tx2.insert("who", pa.table({"id": [2], "k": ["b"]}))
    tx2.rollback()
    with admin.transaction() as tx3:
        tx3.insert("who", pa.table({"id": [3], "k": ["c"]}))
    by_tid = {e["tid"]: e for e in history(admin, "who")}
    assert by_tid[str(tx.tid)]["user"] == made[W].user and by_tid[str(tx.tid)]["kind"] == "insert"
    assert by_tid[str(tx2.tid)]["user"] == made[W].user and by_tid[str(tx2.tid)]["kind"] == "abort"
    assert by_tid[str(tx3.tid)]["user"] == cluster.credentials.user
