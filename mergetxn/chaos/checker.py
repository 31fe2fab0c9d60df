"""The checker of ``mergetxn chaos``: what a history proves about the isolation and durability we
promise, as pure code (no I/O, no clock, deterministic) so that hand-made histories test it.

Every commit has a CSN and every transaction a snapshot CSN, so snapshot isolation is checked
exactly, not searched for as in Elle: the state at snapshot S is the initial contents plus the
writes of the committed ops with ``csn <= S``, applied in CSN order (ops sharing a CSN were one
group commit and are applied together). The states are computed once, as a sorted list, and every
read is compared against ``state_at(snapshot)`` plus the op's own earlier writes.

A read that differs from that state is reported once per cause: an element or value that only an
op that did not commit wrote is ``aborted-read`` (G1a), one that a committed op overwrote or
deleted within itself is ``intermediate-read`` (G1b), and any other difference (a missing
committed element, one from a later commit, a stale value) is ``si-read``. Element values are
unique across a run, so ``(table, key, element)`` names its writer.

An ``overwrite`` micro-operation (a Spark job's INSERT OVERWRITE of one key's partition) removes
what its op saw: when the op is applied at its csn it becomes the deletes of the key's elements
in the state at its snapshot (plus its own earlier writes) and the appends of its new elements
(:attr:`Model.effects`), so elements committed by others after its snapshot stay, and two
overlapping overwrites that both removed an element are a lost update like two deletes of it.
Within the op itself (its own later reads) it simply replaces the key.

An ``lww`` table (written by ``atomicity="none"`` transactions: no locks, the later CSN wins)
has no lost-update rule, and its reads see the latest state the replica applied, not the
snapshot: a value read there must be the key's value at the snapshot or one a commit after it
wrote (or the op's own write); G1a and G1b hold as everywhere. An async commit
(``durability="async"``) is acknowledged by the flush that covered it (``flushed``): it must
then commit, and one client's async commits on one replica commit in the order it made them.

An op run with ``isolation="serializable"`` is checked against its read set as well: once it
commits with writes, no op committed between its snapshot and its csn may have written a key it
read (any key of a table it read whole). Ops of one group commit (one csn) are left out: the
group has a serial order in which the reader comes first.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from mergetxn.chaos.history import History, Op

KINDS: dict[str, str] = {
    "si-read": "a read differs from the initial contents plus the commits with csn <= its "
    "snapshot plus the op's own earlier writes (missing, stale or future data)",
    "aborted-read": "G1a: a read returns an element or value that only an op that did not "
    "commit (aborted or indeterminate) wrote on that key",
    "intermediate-read": "G1b: a read returns an element a committed op appended then deleted "
    "(or overwrote), or a register value a committed op set then overwrote, within the op",
    "lost-update": "two committed ops with overlapping lifetimes (the later one's snapshot < "
    "the earlier one's csn, or the same csn) both set a register key or both delete an element "
    "(an overwrite deletes the elements of the key it saw)",
    "lost-commit": "an acknowledged commit that a replica's commit_status contradicts, an async "
    "commit that a flush acknowledged but that did not commit, or a final state that differs from "
    "the expected state at its csn",
    "read-set-changed": "a committed serializable op that wrote something read a key (or a whole "
    "table) that another op, committed after its snapshot and before its csn, wrote: what its reads "
    "returned or could have returned changed before it committed (write skew)",
    "async-order": "two async commits of one client on one replica committed in the other order "
    "than the client made them",
    "divergence": "replicas' finals at different csns, finals at one csn that differ, or a "
    "final behind an acknowledged commit",
    "tid-reused": "two ops with the same tid",
    "unresolved": "an op still indeterminate, or committed without a csn (it cannot be placed)",
    "invariant": "a bank table's total differs from its initial total in a whole-table read "
    "(taken before the op wrote that table) or in a final",
    "aborted-visible": "a final contains an element or value that only an op that did not commit wrote",
}

INITIAL = -1  # the "writer" of the initial contents, always committed

State = dict[str, dict[str, Any]]  # table -> key -> frozenset of elements | register value


@dataclass(frozen=True)
class Finding:
    """One anomaly: its kind (a key of ``KINDS``), a message naming what was seen against what
    was expected, and the indexes of the ops involved."""

    kind: str
    message: str
    ops: tuple[int, ...] = ()


def describe(finding: Finding) -> str:
    """One line for a person: kind, message and the ops to look up in the history."""
    ops = f" [ops {', '.join(map(str, finding.ops))}]" if finding.ops else ""
    return f"{finding.kind}: {finding.message}{ops}"


def summary(findings: Iterable[Finding]) -> dict[str, int]:
    """Count by kind, every kind listed (zero included) so a report shows what was checked."""
    counts = Counter(f.kind for f in findings)
    return {kind: counts[kind] for kind in KINDS} | dict(counts)


def _order(values: Iterable[Any]) -> list[Any]:
    """Sorted for stable messages even if a workload mixes element types."""
    return sorted(values, key=lambda v: (type(v).__name__, v))


def _show(kind: str, value: Any) -> str:
    """A value in a message; an empty set key has no row."""
    return "no row" if value is None else str(_order(value)) if kind == "set" else repr(value)


def _frozen(x: Any) -> Any:
    """Hashable form of a value, so a malformed read (a list where an int belongs) is reported
    rather than crashing the checker."""
    return tuple(_frozen(v) for v in x) if isinstance(x, list | tuple) else x


def _elements(raw: Any) -> list[Any]:
    """The elements of a set read, as a list (duplicates kept: they are a finding)."""
    items = raw if isinstance(raw, list | tuple | set | frozenset) else [raw]
    return [_frozen(x) for x in items] if raw is not None else []


def _norm(kind: str, value: Any) -> Any:
    """A read or stored value in model form: a set key is a frozenset, and an empty set is the
    same as no row (``None``), because deleting every element leaves nothing to read."""
    return (frozenset(_elements(value)) or None) if kind == "set" else _frozen(value)


def _write(table: dict[str, Any], verb: str, key: str, x: Any) -> None:
    """Apply one write micro-operation to a table of the model (mutates ``table``)."""
    if verb == "overwrite":  # from the op's own view of the key: a replacement
        x = frozenset(_elements(x))
    elif verb != "set":
        x = _frozen(x)
        old = table.get(key, frozenset())
        x = old | {x} if verb == "append" else old - {x}
    else:
        x = _frozen(x)
    if x is None or x == frozenset():
        table.pop(key, None)
    else:
        table[key] = x


class Model:
    """Everything the rules share, computed once: table kinds, which ops committed, the states
    by CSN, what each committed op did to them (``effects``: its mops with every ``overwrite``
    turned into deletes of what it saw and appends), and who wrote each ``(table, key, element
    or value)`` (``kept``: still there at the end of that op, i.e. not an intermediate write)."""

    def __init__(self, history: History) -> None:
        self.history = history
        self.ops = history.ops
        self.kinds: dict[str, str] = dict(history.header.tables)
        self.committed = {INITIAL} | {o.index for o in self.ops if o.outcome == "committed" and o.csn is not None}
        self.writers: dict[tuple[str, str, Any], list[tuple[int, bool]]] = defaultdict(list)
        initial = list(self._initial_mops(history.header.initial))
        self._index_writes(INITIAL, initial)
        for o in self.ops:
            self._index_writes(o.index, o.mops)
        groups: dict[int, list[Op]] = defaultdict(list)
        for o in self.ops:
            if o.index in self.committed:
                groups[o.committed_at].append(o)
        self.csns = sorted(groups)
        self.groups = [sorted(groups[c], key=lambda o: o.index) for c in self.csns]
        self.states = [self.apply({}, initial)]
        self.effects: dict[int, list[list[Any]]] = {}
        for group in self.groups:
            for o in group:
                self.effects[o.index] = self._effect(o)
            self.states.append(self.apply(self.states[-1], (x for o in group for x in self.effects[o.index])))

    def kind(self, table: str) -> str:
        return self.kinds.get(table, "register")

    def _effect(self, o: Op) -> list[list[Any]]:
        """Op ``o``'s mops as applied at its csn: each ``overwrite`` becomes the deletes of the
        key's elements in the op's view (the state at its snapshot plus its own earlier writes)
        and the appends of its elements. Called in csn order, so the snapshot's state is built
        (an op without a snapshot, or a malformed one at or after its csn, sees the state just
        before its commit)."""
        if not any(m[0] == "overwrite" for m in o.mops):
            return o.mops
        built = len(self.states) - 1
        at = built if o.snapshot is None else min(bisect_right(self.csns, o.snapshot), built)
        view, out = self.states[at], []
        for m in o.mops:
            if m[0] == "overwrite":
                t, k = m[1], str(m[2])
                out += [["delete", t, k, x] for x in _order(view.get(t, {}).get(k) or ())]
                out += [["append", t, k, x] for x in _elements(m[3])]
            else:
                out.append(m)
            view = self.apply(view, [m])
        return out

    def _initial_mops(self, initial: dict[str, dict[str, Any]]) -> Iterator[list[Any]]:
        """The initial contents as writes, to go through the same code as commits."""
        for t, keys in initial.items():
            for k, v in keys.items():
                if self.kind(t) == "set":
                    yield from (["append", t, k, x] for x in _elements(v))
                else:
                    yield ["set", t, k, v]

    def _index_writes(self, index: int, mops: list[list[Any]]) -> None:
        """Record op ``index`` as a writer of each element or value it wrote, and whether that
        write was still there when the op ended."""
        last: dict[tuple[str, str], Any] = {}  # register key -> the op's final value
        gone: set[tuple[str, str, Any]] = set()  # elements the op deleted after appending
        added: dict[tuple[str, str], list[Any]] = defaultdict(list)  # set key -> the op's elements
        written = []
        for verb, t, k, x in (m for m in mops if m[0] != "r"):
            k = str(k)
            if verb == "overwrite":  # its earlier elements on the key are gone, these written
                self.kinds.setdefault(t, "set")
                gone.update((t, k, y) for y in added.pop((t, k), []))
                for y in _elements(x):
                    written.append((t, k, y))
                    added[(t, k)].append(y)
                    gone.discard((t, k, y))
                continue
            x = _frozen(x)
            if verb == "append":
                self.kinds.setdefault(t, "set")
                written.append((t, k, x))
                added[(t, k)].append(x)
                gone.discard((t, k, x))
            elif verb == "delete":
                gone.add((t, k, x))
            elif verb == "set":
                written.append((t, k, x))
                last[(t, k)] = x
        for t, k, x in dict.fromkeys(written):
            kept = (t, k, x) not in gone if self.kind(t) == "set" else last.get((t, k)) == x
            self.writers[(t, k, x)].append((index, kept))

    @staticmethod
    def apply(state: State, mops: Iterable[list[Any]]) -> State:
        """The state after the writes among ``mops``; copies only the tables they touch."""
        new, copied = dict(state), set()
        for verb, t, k, x in (m for m in mops if m[0] != "r"):
            if t not in copied:
                new[t] = dict(new.get(t, {}))
                copied.add(t)
            _write(new[t], verb, str(k), x)
        return new

    def state_at(self, csn: int) -> State:
        """The state a snapshot at ``csn`` must see: commits with csn <= ``csn``."""
        return self.states[bisect_right(self.csns, csn)]

    def cause(self, t: str, k: str, x: Any) -> str:
        """Why an unexpected element or register value was seen: committed data at another time
        (si-read), an intermediate write of a committed op (G1b), or only uncommitted writes
        (G1a). A value nobody wrote is si-read."""
        ws = self.writers.get((t, k, x), [])
        if any(i in self.committed and kept for i, kept in ws):
            return "si-read"
        if any(i in self.committed for i, _ in ws):
            return "intermediate-read"
        return "aborted-read" if ws else "si-read"

    def wrote(self, t: str, k: str, xs: Iterable[Any]) -> tuple[int, ...]:
        """The ops that wrote any of ``xs`` on that key, to point a person at them."""
        return tuple(sorted({i for x in xs for i, _ in self.writers.get((t, k, x), []) if i >= 0}))

    def diff(
        self, t: str, want: dict[str, Any], got: dict[str, Any], keys: Iterable[str]
    ) -> Iterator[tuple[str, str, Any, Any, list[Any]]]:
        """``(key, cause, expected, seen, elements)`` for each way a read (or a final) of
        ``keys`` differs from the model: unexpected elements or values by ``cause``; missing
        elements, duplicates in a read and a missing register value are si-read."""
        kind = self.kind(t)
        for key in keys:
            w, raw = want.get(key), got.get(key)
            g = _norm(kind, raw)
            if kind != "set":
                if g != w:
                    yield key, "si-read" if g is None else self.cause(t, key, g), w, g, [g]
                continue
            have, seen = g or frozenset(), _elements(raw)
            if g == w and len(seen) == len(have):
                continue  # the common case, kept linear: keys can hold thousands of elements
            out: dict[str, list[Any]] = defaultdict(list)
            for x in _order(have - (w or frozenset())):
                out[self.cause(t, key, x)].append(x)
            out["si-read"] += _order((w or frozenset()) - have)
            out["si-read"] += _order(x for x, n in Counter(seen).items() if n > 1)
            yield from ((key, cause, w, g, xs) for cause, xs in out.items() if xs)


def _op_name(o: Op) -> str:
    return f"op {o.index} (tid {o.tid}, process {o.process}, replica {o.replica})"


def _message(cause: str, where: str, kind: str, want: Any, got: Any, xs: list[Any]) -> str:
    if cause == "aborted-read":
        return f"{where} holds {_order(xs)}, written only by ops that did not commit"
    if cause == "intermediate-read":
        return f"{where} holds {_order(xs)}, intermediate writes of committed ops"
    return f"{where}: expected {_show(kind, want)}, got {_show(kind, got)}"


def _keyed(table: Any) -> dict[str, Any]:
    """A whole-table read or final table with string keys (a malformed one reads as empty)."""
    return {str(k): v for k, v in table.items()} if isinstance(table, dict) else {}


def _reads(m: Model) -> Iterator[Finding]:
    """si-read, aborted-read and intermediate-read: every read of every op with a snapshot,
    whatever its outcome (an aborted op's reads were served all the same)."""
    later = _later_values(m)
    for o in m.ops:
        if o.snapshot is None:
            continue
        own = m.state_at(o.snapshot)  # plus the op's own writes so far
        written: set[tuple[str, str]] = set()
        for pos, (verb, t, k, x) in enumerate(o.mops):
            if verb != "r":
                own = m.apply(own, [o.mops[pos]])
                written.add((t, str(k)))
                continue
            want = own.get(t, {})
            got = _keyed(x) if k is None else {str(k): x}
            keys = sorted(set(want) | set(got)) if k is None else [str(k)]
            for key, cause, w, g, xs in m.diff(t, want, got, keys):
                if (
                    cause == "si-read"
                    and m.kind(t) == "lww"
                    and (t, key) not in written
                    and g in later(t, key, o.snapshot)
                ):
                    continue  # the latest applied state: at the snapshot or after it
                where = f"{_op_name(o)} read {t}[{key!r}] (mop {pos}) at snapshot {o.snapshot}"
                msg = _message(cause, where, m.kind(t), w, g, xs)
                yield Finding(cause, msg, (o.index, *m.wrote(t, key, xs)))


def _later_values(m: Model) -> Callable[[str, str, int], set[Any]]:
    """``later(t, key, snapshot)``: the values an ``lww`` key may be read with by an op whose
    snapshot is ``snapshot`` (its value then, or one a commit after it wrote; ``None``: no row)."""
    csns: dict[tuple[str, str], list[int]] = defaultdict(list)  # in csn order
    values: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for group in m.groups:
        for o in group:
            for verb, t, k, x in m.effects[o.index]:
                if verb == "set" and m.kind(t) == "lww":
                    csns[(t, str(k))].append(o.committed_at)
                    values[(t, str(k))].append(_frozen(x))

    def later(t: str, key: str, snapshot: int) -> set[Any]:
        after = values.get((t, key), [])[bisect_right(csns.get((t, key), []), snapshot) :]
        return {m.state_at(snapshot).get(t, {}).get(key), *after}

    return later


def _lost_updates(m: Model) -> Iterator[Finding]:
    """Two committed ops that overlap (B's snapshot < A's csn <= B's csn, or one group commit)
    writing the same register key or deleting the same element (an overwrite deletes what it
    saw): one of them did not see the other's write, which snapshot isolation's
    first-committer-wins forbids (and the ``parts`` policy's "two removals of one part")."""
    touched: dict[tuple[str, str, Any], list[Op]] = defaultdict(list)
    for group in m.groups:  # so each list is in csn order
        for o in group:
            targets = {
                (t, str(k), _frozen(x) if v == "delete" else None)
                for v, t, k, x in m.effects[o.index]
                if v in ("set", "delete") and m.kind(t) != "lww"  # lww: the later commit wins
            }
            for target in sorted(targets, key=repr):
                touched[target].append(o)
    for (t, k, x), ops in touched.items():
        csns = [o.committed_at for o in ops]
        for b in ops:
            lo = b.committed_at - 1 if b.snapshot is None else b.snapshot
            for a in ops[bisect_right(csns, lo) : bisect_right(csns, b.committed_at)]:
                if a.committed_at < b.committed_at or a.index < b.index:
                    what = f"set {t}[{k!r}]" if x is None else f"delete {x!r} from {t}[{k!r}]"
                    msg = f"op {a.index} (csn {a.csn}) and op {b.index} (snapshot {b.snapshot}, "
                    msg += f"csn {b.csn}) overlap and both {what}"
                    yield Finding("lost-update", msg, (a.index, b.index))


def _read_sets(m: Model) -> Iterator[Finding]:
    """read-set-changed: a committed serializable writer whose reads another commit between its
    snapshot and its csn changed (docs/rules.md#serializable-transactions)."""
    by_key: dict[tuple[str, str], list[Op]] = defaultdict(list)
    by_table: dict[str, list[Op]] = defaultdict(list)
    for group in m.groups:  # so each list is in csn order
        for o in group:
            keys = {(t, str(k)) for v, t, k, _ in m.effects[o.index] if v != "r"}  # its writes
            for key in sorted(keys):
                by_key[key].append(o)
            for t in sorted({t for t, _ in keys}):
                by_table[t].append(o)
    key_csns = {k: [w.committed_at for w in ws] for k, ws in by_key.items()}
    table_csns = {t: [w.committed_at for w in ws] for t, ws in by_table.items()}
    for o in m.ops:
        if (
            o.isolation != "serializable"
            or o.index not in m.committed
            or o.snapshot is None
            or o.csn is None
            or o.csn <= o.snapshot
        ):
            continue  # a serializable op that wrote nothing commits at its snapshot: always fine
        seen: set[int] = set()
        for pos, (verb, t, k, _) in enumerate(o.mops):
            if verb != "r":
                continue
            writers = by_table[t] if k is None else by_key[(t, str(k))]
            csns = table_csns.get(t, []) if k is None else key_csns.get((t, str(k)), [])
            for w in writers[bisect_right(csns, o.snapshot) : bisect_right(csns, o.csn - 1)]:
                if w.index != o.index and w.index not in seen:
                    seen.add(w.index)
                    what = f"{t}[{k!r}]" if k is not None else f"table {t}"
                    msg = (
                        f"serializable op {o.index} read {what} (mop {pos}) at snapshot {o.snapshot} and "
                        f"committed at csn {o.csn}, but op {w.index} wrote it at csn {w.csn} in between"
                    )
                    yield Finding("read-set-changed", msg, (o.index, w.index))


def _async_commits(m: Model) -> Iterator[Finding]:
    """A flush acknowledged these async commits: each must have committed (lost-commit); and a
    client's async commits on one replica take CSNs in the order it made them (async-order)."""
    last: dict[tuple[int, int], Op] = {}
    for o in sorted(m.ops, key=lambda o: o.index):  # a client's ops in the order it made them
        if o.durability != "async" or all(x[0] == "r" for x in o.mops):
            continue  # one that wrote nothing has nothing to lose or order (no log entry)
        if o.flushed and o.index not in m.committed:
            yield Finding(
                "lost-commit",
                f"{_op_name(o)}: a flush acknowledged this async commit, but it "
                f"is {o.outcome} ({o.resolved or o.message})",
                (o.index,),
            )
        if o.index in m.committed:
            before = last.get((o.process, o.replica))
            if before is not None and before.committed_at > o.committed_at:  # one csn: one group, applied in op order
                yield Finding(
                    "async-order",
                    f"{_op_name(before)} committed at csn {before.csn}, "
                    f"after {_op_name(o)} (made later) at csn {o.csn}",
                    (before.index, o.index),
                )
            last[(o.process, o.replica)] = o


def _statuses(m: Model) -> Iterator[Finding]:
    """An acknowledged commit must be confirmed, with its csn, by every replica asked. A commit
    that wrote nothing is not in the log (its csn is its snapshot), so no replica can confirm it."""
    for o in m.ops:
        if o.index not in m.committed or o.tid is None or all(x[0] == "r" for x in o.mops):
            continue
        for f in m.history.finals:
            st = f.statuses.get(o.tid)
            if st is None:
                continue
            status, csn = (st, None) if isinstance(st, str) else (list(st) + [None, None])[:2]
            if status != "committed" or csn != o.csn:
                msg = f"{_op_name(o)} was acknowledged committed at csn {o.csn} but "
                msg += f"replica {f.replica} answers {status} (csn {csn})"
                yield Finding("lost-commit", msg, (o.index,))


def _finals(m: Model) -> Iterator[Finding]:
    """Each final against the expected state at its csn (lost-commit, aborted-visible), and the
    finals against each other and against the acknowledged commits (divergence)."""
    finals = m.history.finals
    seen: list[State] = []  # each final in model form
    for f in finals:
        want = m.state_at(f.csn)
        seen.append({})
        for t in sorted(set(m.kinds) | set(want) | set(f.tables)):
            w, got = want.get(t, {}), _keyed(f.tables.get(t))
            seen[-1][t] = {k: _norm(m.kind(t), v) for k, v in got.items()}
            for key, cause, wv, g, xs in m.diff(t, w, got, sorted(set(w) | set(got))):
                where = f"replica {f.replica}'s final at csn {f.csn}: {t}[{key!r}]"
                kind = "aborted-visible" if cause == "aborted-read" else "lost-commit"
                ops = m.wrote(t, key, [*xs, wv])
                yield Finding(kind, _message(cause, where, m.kind(t), wv, g, xs), ops)
    if len({f.csn for f in finals}) > 1:
        where = ", ".join(f"replica {f.replica} at {f.csn}" for f in finals)
        yield Finding("divergence", f"the finals were read at different csns: {where}")
    for i, f in enumerate(finals):
        for j, e in [(j, e) for j, e in enumerate(finals[:i]) if e.csn == f.csn]:
            a, b = seen[j], seen[i]
            diff = [
                f"{t}[{k!r}]"
                for t in sorted(set(a) | set(b))
                for k in sorted(set(a.get(t, {})) | set(b.get(t, {})))
                if a.get(t, {}).get(k) != b.get(t, {}).get(k)
            ]
            if diff:
                msg = f"replicas {e.replica} and {f.replica} differ at csn {f.csn}: "
                yield Finding("divergence", msg + ", ".join(diff))
    for f in finals:
        ahead = [o for o in m.ops if o.index in m.committed and o.committed_at > f.csn]
        if ahead:
            top = max(ahead, key=lambda o: o.committed_at)
            msg = f"replica {f.replica}'s final at csn {f.csn} is behind {len(ahead)} "
            msg += f"acknowledged commits up to csn {top.csn} (op {top.index})"
            yield Finding("divergence", msg, tuple(o.index for o in ahead))


def _outcomes(m: Model) -> Iterator[Finding]:
    """unresolved: we promise no caller is left not knowing its outcome (and a commit without a
    csn cannot be placed). tid-reused: it would make commit_status answers ambiguous."""
    by_tid: dict[str, list[int]] = defaultdict(list)
    for o in m.ops:
        if o.tid is not None:
            by_tid[o.tid].append(o.index)
        if o.outcome == "indeterminate" or (o.outcome == "committed" and o.csn is None):
            yield Finding("unresolved", f"{_op_name(o)} is {o.outcome}, csn {o.csn}", (o.index,))
    for tid, ops in by_tid.items():
        if len(ops) > 1:
            yield Finding("tid-reused", f"tid {tid} names ops {ops}", tuple(ops))


def _total(table: Any) -> int | float:
    """The sum of a bank table's balances (anything else in it makes the sum differ)."""
    values = _keyed(table).values() if table else ()
    return sum(v if isinstance(v, int | float) else float("nan") for v in values if v is not None)


def _invariant(m: Model) -> Iterator[Finding]:
    """Bank transfers move money, so every snapshot of a bank table sums to the initial total.
    A whole-table read after the op's own write to that table is mid-transfer: not checked."""
    h = m.history
    for t, kind in h.header.tables.items():
        if kind != "register" or not (h.header.workload == "bank" or t.startswith("bank")):
            continue
        total = _total(h.header.initial.get(t))
        for o in (o for o in m.ops if o.snapshot is not None):
            for pos, (verb, tt, k, x) in enumerate(o.mops):
                if tt == t and verb != "r":
                    break
                if tt == t and k is None and _total(x) != total:
                    msg = f"{_op_name(o)} read {t} (mop {pos}) at snapshot {o.snapshot}: "
                    yield Finding("invariant", f"{msg}sum {_total(x)}, not {total}", (o.index,))
        for f in h.finals:
            if _total(f.tables.get(t)) != total:
                msg = f"replica {f.replica}'s final at csn {f.csn}: {t} sums to "
                yield Finding("invariant", f"{msg}{_total(f.tables.get(t))}, not {total}")


Rule = Callable[[Model], Iterator[Finding]]
RULES: tuple[Rule, ...] = (_outcomes, _reads, _lost_updates, _read_sets, _async_commits, _statuses, _finals, _invariant)


def check(history: History) -> list[Finding]:
    """Every finding of every rule, in rule order, each rule in op order."""
    m = Model(history)
    return [finding for rule in RULES for finding in rule(m)]
