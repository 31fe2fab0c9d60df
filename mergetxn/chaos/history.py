"""What a chaos run saw: every transaction attempt, every fault, and the final state of each replica.

The history is the only thing the checker reads, so it holds exactly what a client observed and
nothing the harness inferred. It is written as JSON lines (``history.jsonl``): one header line,
then one line per operation and per fault in the order they ended, then one line per replica's
final read.

A transaction is a list of micro-operations in the order the client ran them (Elle's shape):

* ``["r", table, key, value]``: a read of one key; ``value`` is what the read returned (a sorted
  list of elements for a ``set`` table, an integer for a ``register`` table, ``None`` when the
  key had no row);
* ``["r", table, None, {key: value, ...}]``: a read of the whole table (keys with no row absent);
* ``["append", table, key, element]``: add a unique element to a ``set`` table's key;
* ``["delete", table, key, element]``: remove an element from a ``set`` table's key;
* ``["overwrite", table, key, [elements]]``: replace a ``set`` table's key (its partition) with
  ``elements``, under the ``parts`` policy's meaning: the elements of that key visible at the
  op's snapshot (with the op's own earlier writes) are removed and ``elements`` added; elements
  that other ops committed there after the snapshot stay (an INSERT OVERWRITE removes the parts
  it saw, not parts committed after it began);
* ``["set", table, key, value]``: a ``register`` table's key now holds ``value``. An ``lww``
  table is a register table written only by transactions with ``atomicity="none"``: no locks,
  the later commit wins per key, and reads see the latest state the replica applied.

Keys are strings in JSON (a table's keys are whatever the workload uses, compared as strings).
Element values are unique across the whole run (the workload draws them from one counter), so a
read element names the transaction that wrote it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Outcome = Literal["committed", "aborted", "indeterminate"]
TableKind = Literal["set", "register", "lww"]


@dataclass
class Op:
    """One transaction attempt by one client.

    ``outcome``: ``committed`` (``csn`` known), ``aborted`` (``error`` names the exception class),
    or ``indeterminate`` (the client could not learn it; ``resolved`` says how it was learnt later,
    with ``commit_status``, and then ``outcome`` is updated; one left ``indeterminate`` is a
    finding). ``snapshot`` is the transaction's snapshot CSN (``None`` if ``begin`` failed).
    ``start`` and ``end`` are seconds since the run began.
    """

    index: int
    process: int
    replica: int
    workload: str
    tid: str | None
    snapshot: int | None
    start: float
    end: float
    mops: list[list[Any]]
    outcome: Outcome
    csn: int | None = None
    error: str | None = None
    message: str = ""
    resolved: str | None = None
    isolation: str = "snapshot"  # or "serializable": its read set is checked too
    atomicity: str = "full"  # or "none": no locks, the later commit wins, reads of the latest state
    durability: str = "sync"  # or "async": commit() returned None; ``flushed`` once a flush covered it
    flushed: bool = False
    type: Literal["op"] = field(default="op", init=False)

    @property
    def committed_at(self) -> int:
        """The csn of a committed op (the checker reads it only of those); ValueError otherwise."""
        if self.csn is None:
            raise ValueError(f"op {self.index} has no csn: it is {self.outcome}")
        return self.csn


@dataclass
class Fault:
    """One injected fault: what, on which target (a host, a replica, a ZooKeeper member, a
    client), from ``start`` until it was healed at ``end`` (seconds since the run began), and
    ``recovered``: when every replica served commits again afterwards (``None``: not measured)."""

    kind: str
    target: str
    start: float
    end: float
    detail: str = ""
    recovered: float | None = None
    type: Literal["fault"] = field(default="fault", init=False)


@dataclass
class Final:
    """What replica ``replica`` returned after the run, healed: every table read at the same
    ``csn``, and ``statuses``: its ``commit_status`` answer (``[status, csn]``) for every tid the
    history names."""

    replica: int
    csn: int
    tables: dict[str, dict[str, Any]]
    statuses: dict[str, list[Any]] = field(default_factory=dict)
    type: Literal["final"] = field(default="final", init=False)


@dataclass
class Header:
    """The run's parameters and the tables: their kind and their contents before the first
    operation (``initial``: table -> key -> value; keys absent hold no row)."""

    seed: int
    workload: str
    nemesis: str
    tables: dict[str, TableKind]
    initial: dict[str, dict[str, Any]] = field(default_factory=dict)
    started: str = ""  # wall-clock time of the run's start, ISO 8601
    form: str = ""  # "namespaces" or "loopback"
    type: Literal["header"] = field(default="header", init=False)


@dataclass
class History:
    header: Header
    ops: list[Op] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    finals: list[Final] = field(default_factory=list)

    def records(self) -> Iterator[dict]:
        yield asdict(self.header)
        timed: list[Op | Fault] = [*self.ops, *self.faults]
        for rec in sorted(timed, key=lambda r: r.end):
            yield asdict(rec)
        for final in self.finals:
            yield asdict(final)

    def write(self, path: Path) -> None:
        with open(path, "w") as f:
            for rec in self.records():
                f.write(json.dumps(rec, sort_keys=True) + "\n")

    @classmethod
    def from_records(cls, records: Iterable[dict]) -> History:
        kinds: dict[str, type[Header | Op | Fault | Final]] = {
            "header": Header,
            "op": Op,
            "fault": Fault,
            "final": Final,
        }
        header: Header | None = None
        ops: list[Op] = []
        faults: list[Fault] = []
        finals: list[Final] = []
        for rec in records:
            rec = dict(rec)
            obj = kinds[rec.pop("type")](**rec)
            if isinstance(obj, Header):
                header = obj
            elif isinstance(obj, Op):
                ops.append(obj)
            elif isinstance(obj, Fault):
                faults.append(obj)
            else:
                finals.append(obj)
        if header is None:
            raise ValueError("a history starts with a header record")
        return cls(header, ops, faults, finals)

    @classmethod
    def read(cls, path: Path) -> History:
        with open(path) as f:
            return cls.from_records(json.loads(line) for line in f if line.strip())
