"""The backpressure on inserts, pure (docs/rules.md#too-many-parts): the delay curve and the
refusal of replicas/registry.py's ``insert_delay``, and the tables' two options."""

from __future__ import annotations

import pytest
from support.builders import change, entry, part, table_def, tid
from support.data import ID_V

from coordinator.core.conflicts import Kind
from coordinator.errors import InvalidInput, MergetxnError, TooManyParts
from coordinator.model.catalog import TableDef
from replicas.registry import insert_delay
from replicas.settings import check_setting
from replicas.state import ReplicaState


def test_no_delay_below_the_threshold_and_a_refusal_at_the_second() -> None:
    assert [insert_delay(n, 5, 10, 1.0) for n in range(5)] == [0.0] * 5
    assert insert_delay(10, 5, 10, 1.0) is None and insert_delay(500, 5, 10, 1.0) is None
    assert insert_delay(9, 5, 10, 1.0) == pytest.approx(1.0)  # the longest just below the refusal


def test_the_delay_grows_towards_the_refusal_bounded_by_the_longest() -> None:
    delays = [insert_delay(n, 150, 300, 1.0) for n in range(150, 300)]
    assert all(d is not None for d in delays)
    assert delays == sorted(delays) and len(set(delays)) == len(delays)
    assert delays[0] == pytest.approx(1000 ** (1 / 150) / 1000)  # about a millisecond (ClickHouse's curve)
    assert delays[-1] == pytest.approx(1.0) and max(delays) <= 1.0  # type: ignore[type-var]
    assert insert_delay(299, 150, 300, 0.2) == pytest.approx(0.2)


def test_zero_turns_each_threshold_off() -> None:
    assert insert_delay(10_000, 0, 0, 1.0) == 0.0
    assert insert_delay(10_000, 5, 0, 1.0) == pytest.approx(1.0)  # delayed, never refused
    assert insert_delay(7, 5, 0, 1.0) == pytest.approx(1000 ** (3 / 5) / 1000)
    assert insert_delay(9, 0, 10, 1.0) == 0.0 and insert_delay(10, 0, 10, 1.0) is None
    assert insert_delay(9, 5, 10, 0.0) == 0.0  # no longest delay: refused, never delayed


def test_a_delay_threshold_at_or_past_the_refusal_never_delays() -> None:
    assert [insert_delay(n, 10, 10, 1.0) for n in (9, 10)] == [0.0, None]
    assert [insert_delay(n, 20, 10, 1.0) for n in (9, 10, 25)] == [0.0, None, None]


def test_the_table_options_round_trip_and_alter() -> None:
    t = TableDef.new("t", ID_V, parts_to_delay_insert=5, parts_to_throw_insert=0)
    back = TableDef.from_dict(t.to_dict())
    assert (back.parts_to_delay_insert, back.parts_to_throw_insert) == (5, 0) and back.same_definition(t)
    plain = TableDef.new("p", ID_V)
    assert "parts_to_delay_insert" not in plain.to_dict() and not plain.same_definition(
        TableDef.new("p", ID_V, parts_to_throw_insert=7)
    )
    altered = t.altered(options={"parts_to_throw_insert": 12, "parts_to_delay_insert": None})
    assert (altered.parts_to_delay_insert, altered.parts_to_throw_insert) == (None, 12)
    assert altered.ddl_version == t.ddl_version + 1 and altered.schema == t.schema


@pytest.mark.parametrize("option", ["parts_to_delay_insert", "parts_to_throw_insert"])
@pytest.mark.parametrize("value", [-1, 1.5, "10", True])
def test_bad_options_are_invalid_input_naming_them(option: str, value: object) -> None:
    with pytest.raises(InvalidInput, match=option):
        TableDef.new("t", ID_V, **{option: value})
    with pytest.raises(InvalidInput, match=option):
        TableDef.new("t", ID_V).altered(options={option: value})


def test_the_replica_settings_take_counts_and_a_bounded_delay() -> None:
    assert check_setting("parts_to_delay_insert", "0") == 0 and check_setting("parts_to_throw_insert", 3000) == 3000
    assert check_setting("max_delay_to_insert", 0.5) == 0.5
    for name, value in (("parts_to_throw_insert", -1), ("max_delay_to_insert", 61), ("parts_to_delay_insert", 1.5)):
        with pytest.raises(InvalidInput, match=name):
            check_setting(name, value)


def test_the_refusal_crosses_the_wire_and_exits_as_unavailable() -> None:
    from coordinator.core.errors import from_dict
    from mergetxn.cli import EXIT_UNAVAILABLE, exit_code

    sent = TooManyParts("too many parts", table="t", parts=10, parts_to_throw_insert=10)
    back = from_dict(sent.to_dict())
    assert type(back) is TooManyParts and back.details["parts"] == 10
    assert isinstance(back, MergetxnError) and not isinstance(back, InvalidInput)
    assert exit_code(back) == EXIT_UNAVAILABLE == 5


def test_the_count_is_the_partitions_visible_parts_looked_up_not_scanned() -> None:
    """``ReplicaState.live_count``: what the backpressure asks on every insert into a crowded
    table, kept by the log's apply (a lookup and a set's size), asking creates nothing."""
    a, b = tid(1), tid(2)
    st = ReplicaState()
    st.apply(1, 0, 0, entry(ddl=[table_def("t")], versions={"t": 0}))
    added = [part(f"a{i}", partition=(1,), creator=a) for i in range(3)] + [part("x", partition=(2,), creator=a)]
    st.apply(2, 0, 1, entry((a, [change("t", (1,), [Kind.INSERT], added=added)]), time=2.0))
    assert [st.live_count("t", k) for k in ("[1]", "[2]", "[3]")] == [3, 1, 0]
    assert st.live_count("u", "[1]") == 0 and "u" not in st.live and "[3]" not in st.live["t"]
    merged = change("t", (1,), [Kind.MINOR_COMPACT], added=[part("m", partition=(1,), creator=b)], removed=["a0", "a1"])
    st.apply(3, 0, 2, entry((b, [merged]), time=3.0, time_version=None))
    assert st.live_count("t", "[1]") == 2
