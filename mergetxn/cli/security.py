"""``mergetxn security``: a secured cluster's credentials (``init``) and its users."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from coordinator.core.errors import InvalidInput
from coordinator.model.users import check_name as check_user_name
from mergetxn.cli.options import json_option, repeatable, replica_option
from mergetxn.cli.output import EXIT_UNAVAILABLE, answer, connected, console, fail, say


@click.group()
def security() -> None:
    """A secured cluster's credentials and users (TLS, users with roles and grants, ZooKeeper ACLs)."""


@security.command("init")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--host",
    "hosts",
    multiple=True,
    default=("127.0.0.1", "localhost"),
    show_default=True,
    metavar="HOST",
    help="An IP address or DNS name clients reach replicas at (repeat for each).",
)
@click.option(
    "--user",
    default="mergetxn",
    show_default=True,
    help="The replicas' identity (their ZooKeeper digest user; no user logs in with it).",
)
@click.option("--admin", default="admin", show_default=True, help="The first admin user's name.")
def security_init(directory: Path, hosts: tuple[str, ...], user: str, admin: str) -> None:
    """Make a private CA, one replica certificate for every --host, the replicas' identity and
    the first admin user in DIRECTORY.

    Writes ca.pem, replica.pem, replica.key and two credentials files (mode 0600):
    credentials.json, the replicas' (`replica start --credentials`; it also logs in to
    ZooKeeper) and admin.json, the admin user's (clients: `--credentials` or
    MERGETXN_CREDENTIALS; `security add-user` makes more users). No secret is printed.
    """
    from coordinator.wire.security import ADMIN_FILE, REPLICA_FILE, make_cluster_credentials

    if (directory / REPLICA_FILE).exists():
        fail(f"{directory / REPLICA_FILE} exists: remove the directory's files to make new credentials")
    make_cluster_credentials(directory, hosts, user, admin=admin)
    out = console()
    out.print(f"credentials for host(s) {', '.join(hosts)} in {directory}:", soft_wrap=True)
    out.print(f"  replicas: mergetxn replica start --credentials {directory / REPLICA_FILE} ...", soft_wrap=True)
    out.print(f"  admin {admin!r}: MERGETXN_CREDENTIALS={directory / ADMIN_FILE} (or --credentials)", soft_wrap=True)


@security.command("add-user")
@click.argument("name")
@click.option(
    "--role",
    type=click.Choice(["admin", "writer", "reader"]),
    required=True,
    help="admin: everything; writer: reads and writes of its tables; reader: reads of its tables.",
)
@repeatable(
    "--table",
    "tables",
    metavar="TABLE",
    help="A table the user has grants on (repeat for each; default: every table, later ones too).",
)
@click.option(
    "--out",
    "out_file",
    default=None,
    metavar="FILE|-",
    help="Where to write the user's credentials file (default: NAME.json beside the CA file of "
    "--credentials; never overwritten). '-': print it on stdout instead (to pipe into a "
    "secret store; the only time a secret is printed).",
)
@replica_option
def security_add_user(name: str, role: str, tables: tuple[str, ...], out_file: str | None, replica: str) -> None:
    """Add user NAME (as an admin: --credentials) and write its credentials file (mode 0600:
    its name, a new secret and the CA file). Hand that file to the user; the cluster keeps only
    a salted hash of the secret, which is printed only with --out -. The name and the file's
    directory are checked first: a user is added only when its file can be written (one whose
    file still fails to be written is dropped again)."""
    check_user_name(name)  # before anything: the name also names the credentials file
    with connected(replica) as client:
        if client.credentials is None:
            fail("security add-user: give an admin's credentials (--credentials or MERGETXN_CREDENTIALS)")
        ca = client.credentials.ca_file
        path = (
            None
            if out_file == "-"
            else Path(out_file)
            if out_file
            else (ca.parent if ca is not None else Path.cwd()) / f"{name}.json"
        )
        if path is not None:
            _check_credentials_path(path)
        creds = client.create_user(name, role, list(tables) or None)
        if path is not None:
            try:
                creds.to_file(path)
            except OSError as exc:
                client.drop_user(name)
                fail(f"{path} cannot be written ({exc.strerror or exc}): user {name!r} was not added", EXIT_UNAVAILABLE)
    grants = ", ".join(tables) if tables else "every table"
    if path is None:
        click.echo(
            json.dumps(
                {
                    "user": creds.user,
                    "secret": creds.secret,
                    **({"ca_file": str(creds.ca_file.resolve())} if creds.ca_file else {}),
                },
                indent=2,
            )
        )
        console(stderr=True).print(f"user {name!r} ({role}, tables: {grants}) added", soft_wrap=True)
        return
    console().print(f"user {name!r} ({role}, tables: {grants}): credentials in {path}", soft_wrap=True)


def _check_credentials_path(path: Path) -> None:
    """Refuse (InvalidInput) a credentials file that exists or whose directory is missing or not writable."""
    if path.exists() or path.is_symlink():
        raise InvalidInput(f"{path} exists: remove it or give --out", path=str(path))
    parent = path.parent
    if not parent.is_dir():
        raise InvalidInput(f"--out {path}: directory {parent} does not exist: create it or give another --out")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InvalidInput(f"--out {path}: directory {parent} is not writable: give another --out")


@security.command("drop-user")
@click.argument("name")
@replica_option
def security_drop_user(name: str, replica: str) -> None:
    """Drop user NAME (as an admin): its credentials are refused from now on, on every replica."""
    answer(replica, lambda client: client.drop_user(name), lambda _: say(f"user {name!r} dropped", soft_wrap=True))


@security.command("users")
@json_option("Print the users as a JSON list.")
@replica_option
def security_users(as_json: bool, replica: str) -> None:
    """List the users (as an admin): name, role and tables."""
    answer(replica, lambda client: client.users(), _show_users, as_json)


def _show_users(users: list[dict]) -> None:
    table = Table("name", "role", "tables")
    for u in users:
        table.add_row(
            escape(u["name"]), u["role"], "every table" if u["tables"] is None else escape(", ".join(u["tables"]))
        )
    console().print(table)
