"""Deletion vectors in one replica in this process (replicas/vectors.py,
docs/architecture/keys-vectors.md): a merge whose sources' keys an upsert supersedes between the
merge's read and its commit (explicit ordering: the merge's ``before_commit``), and the check
(``mergetxn check``) catching vectors a follow got wrong, which the replica then derives again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support.waiting import wait_until

from coordinator.core import keyfold, keytables
from coordinator.core.deletions import PartVersions
from coordinator.core.tabledata import partition_key
from coordinator.model.catalog import TableDef
from coordinator.model.records import DropTable, Insert
from coordinator.model.znodes import Marks
from parts.io.format import read_part, write_part
from parts.model.meta import PartMeta
from replicas import vectors as vectors_module
from replicas.replica import Replica, ReplicaConfig
from replicas.storage_check import check_tables
from replicas.vectors import KeysVectors

pytestmark = pytest.mark.zk

SCHEMA = pa.schema([pa.field("p", pa.int64(), False), pa.field("k", pa.int64(), False), ("a", pa.string())])
PK = ("p", "k")


@pytest.fixture
def replica(zk_address: str, tmp_path: Path) -> Iterator[Replica]:
    r = Replica(
        ReplicaConfig(
            zk=zk_address,
            storage_url=str(tmp_path / "storage"),
            host_id="dv0",
            data_dir=tmp_path / "replica",
            merge_interval=0,
            gc_interval=0,
        )
    )
    r.start()
    try:
        yield r
    finally:
        r.stop()


def keys_table(r: Replica) -> TableDef:
    r.create_table(TableDef.new("dv", SCHEMA, primary_key=PK, conflict_policy="keys", auto_merge=False))
    return r.table("dv")


def commit(r: Replica, keys: list[int], tag: str, op: int = keytables.PUT) -> int:
    """One transaction writing ``op`` versions of ``keys`` (partition 0)."""
    data = pa.table({"p": [0] * len(keys), "k": keys, "a": [f"{tag}{k}" for k in keys]}, schema=SCHEMA)
    if op == keytables.DELETE:
        data = data.select(list(PK))
    txn = r.transactions.begin()
    meta = write_part(r.storage, "dv", [], (), keytables.versions(SCHEMA, PK, "dv", data, op, 0), txn.id)
    r.transactions.stage(txn.id, Insert("dv", added=(meta,)))
    return r.transactions.commit(txn.id)


def by_fold(r: Replica, snapshot: int) -> list[dict]:
    metas = r.state.visible("dv", snapshot)
    csns = r.state.creation_csns(m.name for m in metas)
    folded = keyfold.merge(SCHEMA, PK, [(csns[m.name], read_part(r.storage, m)) for m in metas])
    return sorted(folded.select(SCHEMA.names).to_pylist(), key=lambda row: row["k"])


def by_vectors(r: Replica, tdef: TableDef, snapshot: int, vectors: KeysVectors | None = None) -> list[dict] | None:
    """The parts visible at ``snapshot`` minus the vectors the replica gives for them (None: it
    gives none, the reader would fold)."""
    metas = r.state.visible("dv", snapshot)
    dead = (vectors or r.vectors).dead_rows(tdef, snapshot, metas)
    if dead is None:
        return None
    out = []
    for m in metas:
        rows = read_part(r.storage, m).select(SCHEMA.names)
        keep = np.ones(rows.num_rows, bool)
        keep[dead[m.name]] = False
        out += rows.filter(pa.array(keep)).to_pylist()
    return sorted(out, key=lambda row: row["k"])


def test_a_merge_whose_keys_an_upsert_supersedes_before_it_commits(replica: Replica) -> None:
    """The merge reads its sources at ``m0``; an upsert and a delete of keys in them commit
    after ``m0``, before the merge does (its ``before_commit``). At every snapshot since the
    vectors were first derived, on the replica that followed each commit and on one that
    derives them at the end, the read by vectors is the fold (time travel across the merge
    included): the merge output's rows of the keys superseded meanwhile are dead from its CSN."""
    r = replica
    tdef = keys_table(r)
    csns = [commit(r, list(range(0, 6)), "x")]
    assert by_vectors(r, tdef, csns[-1]) == by_fold(r, csns[-1])  # derived here, followed from now on
    csns.append(commit(r, list(range(3, 9)), "y"))
    sources = [m.name for m in r.state.visible("dv", r.state.applied)]

    def meanwhile() -> None:
        csns.append(commit(r, [4, 7, 20], "z"))
        csns.append(commit(r, [1], "", keytables.DELETE))

    out = r.merges.run_merge(tdef, "major", partition_key(()), sources, before_commit=meanwhile)
    assert out["outcome"] == "committed", out
    csns += [out["csn"], commit(r, [7, 8], "w")]
    merged = next(m for m in r.state.visible("dv", out["csn"]) if keytables.folded(m))
    assert len(r.vectors.dead_rows(tdef, out["csn"], [merged])[merged.name]) == 3  # keys 1, 4, 7
    for s in csns:
        assert by_vectors(r, tdef, s) == by_fold(r, s), f"at {s}"
    assert by_vectors(r, tdef, csns[-1], KeysVectors(r.state, r.storage)) == by_fold(r, csns[-1])


def shifted(r: Replica, tdef: TableDef, meta: PartMeta) -> PartVersions:
    """A part's versions as a follow gone wrong would take them: every key moved by 1,000."""
    data = read_part(r.storage, meta, columns=[*PK, keytables.OP, keytables.SEQ])
    return PartVersions.of(meta.name, data.set_column(1, "k", pc.add(data.column("k"), 1000)), PK)


def test_check_finds_vectors_a_follow_got_wrong(replica: Replica, monkeypatch: pytest.MonkeyPatch) -> None:
    """An upsert the vectors followed with the wrong keys leaves the rows it superseded live: the
    check, deriving them again from the files, names the older part's vector; the replica lets
    them go and the next read derives them right."""
    r = replica
    tdef = keys_table(r)
    commit(r, list(range(0, 6)), "x")
    assert by_vectors(r, tdef, r.state.applied) == by_fold(r, r.state.applied)
    assert check_tables(r.state, r.storage, Marks(), ["dv"], vectors=r.vectors)["ok"]
    with monkeypatch.context() as patched:
        patched.setattr(r.vectors, "_versions", lambda tdef, meta: shifted(r, tdef, meta))
        last = commit(r, [2, 3], "y")
        assert by_vectors(r, tdef, last) != by_fold(r, last)  # what the check is for
    older = next(m.name for m in r.state.visible("dv", last) if m.rows == 6)
    found = check_tables(r.state, r.storage, Marks(), ["dv"], vectors=r.vectors)
    problems = [p for t in found["tables"] for p in t["problems"]]
    assert [(p["part"], p["field"], p["repairable"]) for p in problems] == [(older, "vectors", False)], problems
    assert "not the one its table's part files give" in problems[0]["problem"]
    assert by_vectors(r, tdef, last) == by_fold(r, last)
    assert check_tables(r.state, r.storage, Marks(), ["dv"], vectors=r.vectors)["ok"]


def test_check_finds_a_vector_naming_rows_past_a_parts_end(replica: Replica, monkeypatch: pytest.MonkeyPatch) -> None:
    """Versions of a part taken twice over (each row doubled, the copies older by ``_seq``)
    make a follow mark rows its part does not have: the check names them."""
    r = replica
    tdef = keys_table(r)
    commit(r, list(range(0, 4)), "x")
    assert by_vectors(r, tdef, r.state.applied) is not None
    real = r.vectors._versions

    def doubled(tdef: TableDef, meta: PartMeta) -> PartVersions:
        v = real(tdef, meta)
        return PartVersions(
            v.name, np.concatenate([v.keys, v.keys]), np.tile(v.ops, 2), np.concatenate([v.seqs, v.seqs - 10])
        )

    monkeypatch.setattr(r.vectors, "_versions", doubled)
    commit(r, [1, 2], "y")
    r.vectors.dead_rows(tdef, r.state.applied, r.state.visible("dv", r.state.applied))  # followed (wrongly)
    monkeypatch.undo()
    problems = [
        p for t in check_tables(r.state, r.storage, Marks(), ["dv"], vectors=r.vectors)["tables"] for p in t["problems"]
    ]
    assert [p["field"] for p in problems] == ["vectors"] and "of a part of 2 rows" in problems[0]["problem"], problems


def test_a_merge_redone_on_parts_newer_than_its_snapshot(replica: Replica) -> None:
    """A merge whose source another merge rewrote meanwhile is redone on the current parts (its
    transaction id still names its first snapshot): among its sources is then a part made after
    that snapshot, holding a newer version of a key an older source holds. Every snapshot still
    reads by vectors as the fold (found by the chaos campaign: the merge rule, applied at the id's
    snapshot, marked that newer version dead)."""
    r = replica
    tdef = keys_table(r)
    csns = [commit(r, list(range(0, 6)), "x")]
    assert by_vectors(r, tdef, csns[-1]) == by_fold(r, csns[-1])
    csns.append(commit(r, list(range(6, 9)), "y"))
    assert by_vectors(r, tdef, csns[-1]) == by_fold(r, csns[-1])
    pkey = partition_key(())
    sources = [m.name for m in r.state.visible("dv", r.state.applied)]

    def meanwhile() -> None:
        csns.append(commit(r, [4], "z"))
        assert by_vectors(r, tdef, csns[-1]) == by_fold(r, csns[-1])
        visible = r.state.visible("dv", r.state.applied)
        made = r.state.creation_csns(m.name for m in visible)
        newer = [m for m in visible if made[m.name] > csns[0]]  # y's part and z's (z supersedes x's 4)
        other = r.merges.run_merge(tdef, "major", pkey, [m.name for m in newer])
        assert other["outcome"] == "committed", other
        csns.append(other["csn"])

    out = r.merges.run_merge(tdef, "major", pkey, sources, before_commit=meanwhile)
    assert out["outcome"] == "committed", out
    csns.append(out["csn"])
    assert [row["a"] for row in by_fold(r, out["csn"]) if row["k"] == 4] == ["z4"]
    for s in csns:
        assert by_vectors(r, tdef, s) == by_fold(r, s), f"at {s}"


def test_vectors_first_derived_while_a_merge_is_under_way(replica: Replica) -> None:
    """A merge reads its sources (key 3 superseded in the older one) at ``m0``; before it
    commits, a read derives the vectors for the first time, at a later snapshot (every dead row
    marked dead there). The merge then commits: the merge rule cannot tell at ``m0`` which rows
    were already dead, so the replica derives again, and every snapshot from the derive on
    reads as the fold (before the fix the merged row of key 3 was taken for superseded after
    ``m0`` and read as missing: the chaos campaign's si-read)."""
    r = replica
    tdef = keys_table(r)
    commit(r, list(range(0, 6)), "x")
    commit(r, [3, 4], "y")
    sources = [m.name for m in r.state.visible("dv", r.state.applied)]
    csns: list[int] = []

    def meanwhile() -> None:
        csns.append(commit(r, [20], "z"))  # a commit after m0 that touches no source key
        assert by_vectors(r, tdef, csns[-1]) == by_fold(r, csns[-1])  # first derived here

    out = r.merges.run_merge(tdef, "major", partition_key(()), sources, before_commit=meanwhile)
    assert out["outcome"] == "committed", out
    csns += [out["csn"], commit(r, [5], "w")]
    for s in csns:
        assert by_vectors(r, tdef, s) == by_fold(r, s), f"at {s}"
    assert {row["k"] for row in by_vectors(r, tdef, csns[-1]) or []} == {0, 1, 2, 3, 4, 5, 20}


def test_vectors_of_dropped_and_idle_tables_are_let_go(replica: Replica, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a replica holds follows the keys tables read lately (docs/architecture/bounds.md):
    the reaper lets go of the vectors no read asked for in ``IDLE_SECONDS`` and of a dropped
    table's, with no new target made; info() reports what is held."""
    r = replica
    tdef = keys_table(r)
    commit(r, [1, 2, 3], "x")
    commit(r, [2], "y")
    assert by_vectors(r, tdef, r.state.applied) == by_fold(r, r.state.applied)
    assert r.info()["structures"]["vector_targets"] == 1
    assert r.info()["structures"]["vector_parts"] == 2
    monkeypatch.setattr(vectors_module, "IDLE_SECONDS", 0.0)
    wait_until(lambda: r.info()["structures"]["vector_targets"] == 0, what="the idle table's vectors let go")
    assert r.info()["structures"]["vector_parts"] == 0
    monkeypatch.undo()
    commit(r, [5], "z")
    assert by_vectors(r, tdef, r.state.applied) == by_fold(r, r.state.applied)  # derived again
    assert r.info()["structures"]["vector_targets"] == 1
    txn = r.transactions.begin()
    r.transactions.stage(txn.id, DropTable("dv"))
    r.transactions.commit(txn.id)
    wait_until(lambda: r.info()["structures"]["vector_targets"] == 0, what="the dropped table's vectors let go")
