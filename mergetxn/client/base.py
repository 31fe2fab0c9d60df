"""What the client's modules share: the two base classes that its parts build on, and the naming
of a transaction's statements.

:class:`mergetxn.client.client.Client` is made of its core (connection, transactions, writes
and outcomes: client.py) and of :class:`Tables` (tables.py), :class:`Reads` (reads.py) and
:class:`Administration` (admin.py); :class:`mergetxn.client.client.Transaction` of its core and of
:class:`TransactionTables`, :class:`TransactionReads` and :class:`KeysStatements` (keys.py). Each
part derives from :class:`ClientBase` or :class:`TransactionBase`, which declare for the type
checker what the core and the other parts define.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.core import retries
from coordinator.model.catalog import TableDef
from coordinator.model.records import StagedOp
from coordinator.wire.rpc import RpcClient
from coordinator.wire.security import Credentials
from parts.io.storage import Storage
from parts.model.meta import PartMeta

T = TypeVar("T")


class ClientBase:
    """What the parts of :class:`mergetxn.client.client.Client` use of each other."""

    address: str
    timeout: float
    storage: Storage
    credentials: Credentials | None
    max_partition_value_bytes: int
    _tables: dict[str, tuple[TableDef, int]]
    _refused: set[str]
    _rpc: RpcClient

    if TYPE_CHECKING:

        def call(self, action: str, **args: Any) -> Any: ...

        def transaction(
            self, isolation: str = ..., atomicity: str = ..., durability: str = ..., table_limits: bool = ...
        ) -> AbstractContextManager[Any]: ...

        def table(self, name: str) -> TableDef: ...

        def _table_at(self, name: str, snapshot: int | None, ddl: int | None) -> TableDef: ...

        def _wait_decided(self, step: Callable[[], T]) -> T: ...


class TransactionBase:
    """What the parts of :class:`mergetxn.client.client.Transaction` use of each other."""

    client: Any  # the Client that began it (typed Any: client.py imports this module)
    id: str
    snapshot: int
    _ddl: int | None
    _seq: int
    _atomicity: str
    _statement: str | None

    if TYPE_CHECKING:

        def _check_open(self) -> None: ...

        def _stage(self, op: StagedOp, written: bool = True) -> None: ...

        def _write(self, tdef: TableDef, data: pa.Table, *args: Any, **kwargs: Any) -> list[PartMeta]: ...

        def _record_read(self, tdef: TableDef, where: pc.Expression | None) -> None: ...

        def table(self, name: str) -> TableDef: ...

        def read(
            self, table: str, columns: Sequence[str] | None = None, where: pc.Expression | None = None
        ) -> pa.Table: ...

        def _visible_csns(
            self, table: str, pkeys: list[tuple] | None = None, hint: Mapping[str, Any] | None = None
        ) -> tuple[list[PartMeta], dict[str, int]]: ...

        def _visible_whole(self, table: str) -> tuple[list[PartMeta], dict[str, int], dict[str, str] | None]: ...

        def _rows(self, tdef: TableDef, metas: list[PartMeta], *args: Any) -> pa.Table: ...

        def _current(self, tdef: TableDef, keys: pa.Table, columns: Sequence[str]) -> pa.Table: ...


class StillCommitting(retries.TryAgain):
    """The replica has not decided yet (a commit or a table's creation in progress)."""


def named(statement: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Name the statement a Transaction method makes in the stage requests it sends, so that a
    refusal (PermissionDenied) names it as the user wrote it: a keys table's upsert, delete_keys
    or lock_keys stages an insert. It only names; the replica checks the operations themselves."""

    def wrap(method: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(method)
        def named(self: TransactionBase, *args: Any, **kwargs: Any) -> T:
            if self._statement is not None:  # called by another statement: that one names it
                return method(self, *args, **kwargs)
            self._statement = statement
            try:
                return method(self, *args, **kwargs)
            finally:
                self._statement = None

        return named

    return wrap
