"""``mergetxn table``: create, describe, alter, drop and list tables."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape

from coordinator.core.errors import InvalidInput
from mergetxn.cli.options import F, json_option, repeatable, replica_option, shown
from mergetxn.cli.output import answer, console, rows_table, say
from mergetxn.cli.parsing import column_list, lock_groups, parse_schema
from parts.model.meta import INLINE_MAX_BYTES

if TYPE_CHECKING:
    from mergetxn.client.client import Client


@click.group()
def table() -> None:
    """Create, describe, alter, drop and list tables."""


# The table's own limits ``table create`` sets (``Client.create_table``'s keywords of the same
# names; None: the replicas' setting): the keyword, its option's type and help.
_LIMITS: tuple[tuple[str, click.ParamType | type, str], ...] = (
    ("txn_max_seconds", float, "Abort a transaction writing this table after this many seconds (keys tables: 60)."),
    ("txn_max_rows", int, "Abort a transaction staging more rows than this (keys tables: 100000)."),
    (
        "retention_seconds",
        float,
        "Keep snapshots and changes of this table readable this long after a commit replaced what "
        "they saw (default: the replicas' retention_seconds, 3600).",
    ),
    (
        "parts_to_delay_insert",
        click.IntRange(min=0),
        "Delay inserts into a partition holding this many visible parts (0: never; default: the replicas' setting, 150).",
    ),
    (
        "parts_to_throw_insert",
        click.IntRange(min=0),
        "Refuse inserts into a partition holding this many visible parts (0: never; default: the replicas' setting, 300).",
    ),
    (
        "inline_rows",
        click.IntRange(min=0),
        "Commit an insert of at most this many rows per partition without a file, its rows in the log entry "
        "(0: never; default: the replicas' setting, 100).",
    ),
    (
        "inline_bytes",
        click.IntRange(min=0, max=INLINE_MAX_BYTES),
        "The most Parquet bytes of such an insert's part (0: never; default: the replicas' setting, 16384).",
    ),
)


def _limit_options(f: F) -> F:
    """An option ``--NAME`` (default None) for each of :data:`_LIMITS`, listed in its order."""
    for name, kind, text in reversed(_LIMITS):
        f = click.option("--" + name.replace("_", "-"), type=kind, default=None, help=text)(f)
    return f


@table.command("create")
@click.argument("name")
@click.option(
    "--schema",
    "schema_text",
    required=True,
    metavar="COLS",
    help='Columns as name:type pairs, e.g. "id:int64,name:string,day:date32" (append ! for NOT NULL).',
)
@repeatable("--partition-by", metavar="COL", help="Partition column (repeat for several; a comma list also works).")
@repeatable("--primary-key", metavar="COL", help="Primary key column (repeatable; a comma list also works).")
@shown(
    "--policy",
    type=click.Choice(["parts", "maxcompute", "append", "keys"]),
    default="parts",
    help="Conflict policy for concurrent writers (keys: a keys table, needs --primary-key).",
)
@repeatable(
    "--lock-group",
    "lock_group",
    metavar="NAME=COL1,COL2",
    help="Keys tables: a lock group and its columns (repeatable).",
)
@shown(
    "--atomicity",
    type=click.Choice(["full", "none"]),
    default="full",
    help="Keys tables: full (transactions) or none (each write on its own).",
)
@_limit_options
@click.option("--no-auto-merge", is_flag=True, help="Keep background merges away from this table.")
@json_option("Print the outcome as one JSON object.")
@replica_option
def table_create(
    name: str,
    schema_text: str,
    partition_by: tuple[str, ...],
    primary_key: tuple[str, ...],
    policy: str,
    lock_group: tuple[str, ...],
    atomicity: str,
    no_auto_merge: bool,
    as_json: bool,
    replica: str,
    **given: Any,
) -> None:
    """Create table NAME."""
    schema = parse_schema(schema_text)
    shape: dict[str, Any] = {"partition_by": column_list(partition_by), "primary_key": column_list(primary_key)}
    groups = lock_groups(lock_group)
    limits: dict[str, Any] = {name: given[name] for name, _, _ in _LIMITS}  # in the table's order

    def create(client: Client) -> int:
        return client.create_table(
            name,
            schema,
            conflict_policy=policy,
            auto_merge=not no_auto_merge,
            lock_groups=groups or None,
            atomicity=atomicity,
            **shape,
            **limits,
        )

    def show(csn: int) -> None:
        extra = f", partitioned by {', '.join(shape['partition_by'])}" if shape["partition_by"] else ""
        say(f"created table [bold]{escape(name)}[/] (policy {policy}{extra}) at CSN {csn}")

    def described(csn: int) -> dict[str, Any]:
        return {"table": name, "csn": csn, "policy": policy, **shape, "lock_groups": groups, "atomicity": atomicity}

    answer(replica, create, show, as_json, data=lambda csn: described(csn) | limits)


@table.command("drop")
@click.argument("name")
@json_option("Print the result as JSON.")
@replica_option
def table_drop(name: str, as_json: bool, replica: str) -> None:
    """Drop table NAME (a transaction: reads at older snapshots still see it; cleanup collects
    its files once no snapshot in use does)."""
    answer(
        replica,
        lambda client: client.drop_table(name),
        lambda csn: say(f"dropped table [bold]{escape(name)}[/] at CSN {csn}"),
        as_json,
        data=lambda csn: {"table": name, "csn": csn},
    )


def _describe_json(d: dict) -> dict:
    """``client.describe_table`` as JSON: the schema as its columns."""
    out = {k: v for k, v in d.items() if k != "schema"}
    out["columns"] = [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in d["schema"]]
    out["partition_by"], out["primary_key"] = list(d["partition_by"]), list(d["primary_key"])
    out.setdefault("lock_groups", {})
    out.setdefault("atomicity", "full")
    out.setdefault("txn_max_seconds", None)
    out.setdefault("txn_max_rows", None)
    return out


@table.command("describe")
@click.argument("name")
@click.option("--snapshot", type=int, default=None, help="Describe it at this CSN (default: the latest).")
@json_option("Print the description as JSON.")
@replica_option
def table_describe(name: str, snapshot: int | None, as_json: bool, replica: str) -> None:
    """Show table NAME: columns, partitioning, key, policy, creation CSN, schema version, parts and rows."""
    answer(replica, lambda client: _describe_json(client.describe_table(name, snapshot=snapshot)), _show, as_json)


def _show(d: dict) -> None:
    """A table's description for a terminal."""
    out = console()
    out.print(rows_table(d["columns"], ["name", "type", "nullable"], title=f"table {d['name']}"))
    out.print(
        f"partition by: {', '.join(d['partition_by']) or '-'}; primary key: {', '.join(d['primary_key']) or '-'}; "
        f"policy {d['conflict_policy']}; auto merge {'on' if d['auto_merge'] else 'off'}"
    )
    if d["conflict_policy"] == "keys":
        groups = "; ".join(f"{g}={','.join(cols)}" for g, cols in d["lock_groups"].items()) or "-"
        out.print(f"lock groups: {escape(groups)}; atomicity {d['atomicity']}")
    limits = [
        f"{d['txn_max_seconds']:g}s" if d["txn_max_seconds"] is not None else None,
        f"{d['txn_max_rows']} rows" if d["txn_max_rows"] is not None else None,
    ]
    out.print("transaction limits: " + (", ".join(x for x in limits if x) or "the replica's only"))
    if d.get("retention_seconds") is not None:
        out.print(
            f"history retention: {d['retention_seconds']:g}s"
            + (" (the replicas' default)" if d.get("retention_default") else " (the table's own)")
        )
    if d.get("parts_to_throw_insert") is not None:
        out.print(
            f"too many parts: inserts delayed from {d['parts_to_delay_insert']} and refused from "
            f"{d['parts_to_throw_insert']} visible parts in a partition (0: never)"
        )
    if d.get("inline_rows") is not None:
        out.print(
            f"small writes: an insert of at most {d['inline_rows']} rows and {d['inline_bytes']} Parquet bytes "
            f"per partition commits without a file (0: never); {d.get('inlined_parts', 0)} inlined parts now"
        )
    out.print(
        f"created at CSN {d['created_csn']}; schema version {d['schema_version']}"
        + (f" (altered at CSN {d['version_csn']})" if d.get("version_csn") else "")
        + f"; at snapshot {d['snapshot']}: {d['parts']} parts, {d['rows']} rows in {d['partitions']} partitions"
    )


@table.command("alter")
@click.argument("name")
@repeatable(
    "--add-column",
    "add",
    metavar="NAME:TYPE",
    help="Add a nullable column (repeatable; rows written before read it as null).",
)
@repeatable("--rename-column", "rename", metavar="OLD=NEW", help="Rename a column (repeatable).")
@click.option(
    "--retention-seconds",
    "retention",
    default=None,
    metavar="SECONDS|default",
    help="The table's history retention in seconds, or 'default' for the replicas' retention_seconds.",
)
@json_option("Print the new description as JSON.")
@replica_option
def table_alter(
    name: str, add: tuple[str, ...], rename: tuple[str, ...], retention: str | None, as_json: bool, replica: str
) -> None:
    """Alter table NAME: add nullable columns, rename columns, change its history retention."""
    adds = parse_schema(",".join(add)) if add else None
    renames = {}
    for item in rename:
        if "=" not in item:
            raise InvalidInput(f"--rename-column {item!r} must be OLD=NEW")
        old, new = (x.strip() for x in item.split("=", 1))
        renames[old] = new
    extra = {} if retention is None else {"retention_seconds": _retention(retention)}

    def alter(client: Client) -> dict:
        csn = client.alter_table(name, add_columns=adds, rename_columns=renames or None, **extra)
        return {**_describe_json(client.describe_table(name)), "csn": csn}

    def show(d: dict) -> None:
        columns = ", ".join(c["name"] + " " + c["type"] for c in d["columns"])
        say(f"altered table [bold]{escape(name)}[/] at CSN {d['csn']}: columns {columns}")

    answer(replica, alter, show, as_json)


def _retention(text: str) -> float | None:
    """``--retention-seconds``: seconds, or None for ``default`` (the replicas' setting)."""
    if text.strip().lower() == "default":
        return None
    try:
        return float(text)
    except ValueError:
        raise InvalidInput(
            f"--retention-seconds {text!r} must be a number of seconds or 'default'", retention_seconds=text[:100]
        ) from None


@table.command("list")
@json_option("Print the names as one JSON list.")
@replica_option
def table_list(as_json: bool, replica: str) -> None:
    """List the tables."""
    answer(
        replica,
        lambda client: client.tables(),
        lambda names: click.echo("".join(f"{n}\n" for n in names), nl=False),
        as_json,
    )
