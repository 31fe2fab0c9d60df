"""Table definitions: what the log's DDL entries carry and what clients conform data to."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from coordinator.conflicts import Policy
from coordinator.errors import CorruptMetadata, InvalidInput
from parts.ops import schema_from_json, schema_to_json, validate_name, validate_schema


@dataclass(frozen=True)
class TableDef:
    name: str
    schema: pa.Schema
    partition_by: tuple[str, ...] = ()
    primary_key: tuple[str, ...] = ()
    conflict_policy: Policy = Policy.PARTS
    auto_merge: bool = True
    created_csn: int = 0

    @classmethod
    def new(
        cls,
        name: str,
        schema: pa.Schema,
        partition_by=(),
        primary_key=(),
        conflict_policy: str = "parts",
        auto_merge: bool = True,
    ) -> TableDef:
        """Validate a CREATE TABLE request; every problem is InvalidInput naming it."""
        validate_name("table", name)
        if not isinstance(schema, pa.Schema):
            raise InvalidInput(f"schema of table {name!r} must be a pyarrow.Schema, not {type(schema).__name__}")
        if isinstance(partition_by, str) or isinstance(primary_key, str):
            raise InvalidInput("partition_by and primary_key take a sequence of column names, not a string")
        partition_by, primary_key = tuple(partition_by), tuple(primary_key)
        validate_schema(schema, list(partition_by), list(primary_key))
        try:
            policy = Policy(conflict_policy)
        except ValueError:
            choices = ", ".join(p.value for p in Policy)
            raise InvalidInput(f"unknown conflict_policy {conflict_policy!r}; choose one of {choices}") from None
        if not isinstance(auto_merge, bool):
            raise InvalidInput("auto_merge must be True or False")
        return cls(name, schema, partition_by, primary_key, policy, auto_merge)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "schema": schema_to_json(self.schema),
            "partition_by": list(self.partition_by),
            "primary_key": list(self.primary_key),
            "conflict_policy": self.conflict_policy.value,
            "auto_merge": self.auto_merge,
            "created_csn": self.created_csn,
        }

    @classmethod
    def from_dict(cls, d: dict) -> TableDef:
        try:
            return cls(
                name=str(d["name"]),
                schema=schema_from_json(d["schema"]),
                partition_by=tuple(d.get("partition_by") or ()),
                primary_key=tuple(d.get("primary_key") or ()),
                conflict_policy=Policy(d.get("conflict_policy", "parts")),
                auto_merge=bool(d.get("auto_merge", True)),
                created_csn=int(d.get("created_csn") or 0),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptMetadata(f"table definition does not parse: {exc!r}") from exc

    def with_csn(self, csn: int) -> TableDef:
        return TableDef(self.name, self.schema, self.partition_by, self.primary_key,
                        self.conflict_policy, self.auto_merge, csn)
