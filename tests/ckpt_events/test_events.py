"""Typed events: the union decodes every event type back from JSON."""

from __future__ import annotations

import io
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_events import CheckpointEvent, Event, OperationFinished, Refused
from ckpt_events._events import EVENT_TYPES, FINISHED_TYPES, POINT_TYPES, STARTED_TYPES
from ckpt_events.vocab import ErrorCode, Kind, Operation, Outcome
from tests.ckpt_events.strategies import any_event, event_strategy

_decoder = msgspec.json.Decoder(CheckpointEvent)


@settings(max_examples=300, deadline=None)
@given(any_event)
def test_every_event_round_trips_through_json(event: Event) -> None:
    """Any event encodes to one JSON line and decodes to an equal event of the same class."""
    line = msgspec.json.encode(event)
    assert b"\n" not in line
    back = _decoder.decode(line)
    assert type(back) is type(event)
    assert back == event


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.__name__)
def test_each_event_type_has_a_unique_tag(cls: type[Event]) -> None:
    """Every concrete event class is tagged, and tags are unique snake_case names."""
    tags = [msgspec.inspect.type_info(c).tag for c in EVENT_TYPES]  # type: ignore[attr-defined]
    tag = msgspec.inspect.type_info(cls).tag  # type: ignore[attr-defined]
    assert tags.count(tag) == 1
    assert tag == tag.lower() and " " not in tag


def test_union_partitions_into_started_finished_and_points() -> None:
    """Every event type is exactly one of: span start, span finish, counted point."""
    groups = set(STARTED_TYPES) | set(FINISHED_TYPES) | set(POINT_TYPES)
    assert groups == set(EVENT_TYPES)
    assert len(STARTED_TYPES) + len(FINISHED_TYPES) + len(POINT_TYPES) == len(EVENT_TYPES)


def test_decoding_gives_enum_members_and_full_width_ids() -> None:
    """A decoded event carries enum members and keeps 128-bit trace ids exactly."""
    event = OperationFinished(
        kind=Kind.MODEL,
        instance="m0",
        trace_id=2**128 - 1,
        span_id=2**64 - 1,
        start_ns=1,
        end_ns=2,
        operation=Operation.COMMIT,
        records=3,
    )
    back = _decoder.decode(msgspec.json.encode(event))
    assert isinstance(back, OperationFinished)
    assert back.kind == Kind.MODEL and back.operation is Operation.COMMIT
    assert back.outcome is Outcome.OK
    assert back.trace_id == 2**128 - 1


def test_unknown_tag_and_bad_values_are_rejected() -> None:
    """A line with an unknown type or an out-of-vocabulary value fails to decode."""
    with pytest.raises(msgspec.ValidationError):
        _decoder.decode(b'{"type": "nope", "kind": "model", "instance": "m"}')
    good = msgspec.json.encode(
        Refused(kind=Kind.AGENT, instance="a", time_ns=1, code=ErrorCode.STALE_ATTEMPT)
    )
    with pytest.raises(msgspec.ValidationError, match="code"):
        _decoder.decode(good.replace(b"stale_attempt", b"not_a_code"))


def test_events_are_frozen() -> None:
    """Events are immutable once emitted."""
    event = Refused(kind=Kind.AGENT, instance="a", time_ns=1, code=ErrorCode.STALE_ATTEMPT)
    with pytest.raises(AttributeError):
        event.code = ErrorCode.UNAUTHORIZED  # type: ignore[misc]


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.__name__)
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_strategies_cover_every_type(cls: type[Event], data: st.DataObject) -> None:
    """Each event class round-trips on its own too, so no type hides behind the union's draw."""
    event = data.draw(event_strategy(cls))
    assert type(event) is cls
    assert _decoder.decode(msgspec.json.encode(event)) == event


@settings(max_examples=200, deadline=None)
@given(any_event)
def test_a_short_events_repr_is_msgspecs(event: Event) -> None:
    """An event whose values are short reprs as msgspec's own repr does, character for character."""
    assert repr(event) == msgspec.Struct.__repr__(event)


def _failed_with(message: str, attributes: Any) -> OperationFinished:
    """A failed commit carrying ``message`` and ``attributes`` (the repr tests' big values)."""
    return OperationFinished(
        kind=Kind.MODEL,
        instance="m0",
        trace_id=1,
        span_id=2,
        start_ns=3,
        end_ns=4,
        operation=Operation.COMMIT,
        outcome=Outcome.ERROR,
        error_message=message,
        attributes=attributes,
    )


def test_an_events_repr_is_bounded_and_says_what_was_cut() -> None:
    """A 1 MB attribute and a 1 MB error message made a repr of 2,000,000+ characters (in a log
    line, a traceback); each is cut with the count of what was cut, while equality, encoding
    and the data stay whole."""
    from ckpt_events._frozen_attrs import FrozenAttributes

    big = "x" * 1_000_000
    event = _failed_with(big, FrozenAttributes({"blob": big, **{f"k{i}": i for i in range(1000)}}))
    text = repr(event)
    assert len(text) < 2500, len(text)
    assert text.startswith("OperationFinished(kind=<Kind.MODEL: 'model'>, instance='m0', trace_id=1, ")
    assert f"error_message='{'x' * 200}'...(+999800 chars)" in text
    assert "attributes={'blob': 'xxx" in text and " chars)" in text
    line = msgspec.json.encode(event)
    assert len(line) > 2_000_000  # the data itself is whole
    back = _decoder.decode(line)
    assert back == event and back.error_message == big
    assert msgspec.structs.asdict(back)["attributes"]["blob"] == big


@settings(max_examples=200, deadline=None)
@given(any_event)
def test_a_short_events_rich_repr_is_msgspecs(event: Event) -> None:
    """An event whose values are short yields to rich exactly the fields msgspec yields."""
    assert list(event.__rich_repr__()) == list(msgspec.Struct.__rich_repr__(event))


def test_an_events_rich_repr_is_bounded_as_its_repr() -> None:
    """A 2 MB attribute and a 2 MB error message printed with rich came out whole (4,000,536
    characters); rich now shows each value cut as ``repr`` cuts it."""
    from rich.console import Console
    from rich.pretty import pretty_repr

    big = "x" * 2_000_000
    event = _failed_with(big, {"blob": big, "n": 1})
    text = pretty_repr(event)
    assert len(text) < 2500, len(text)
    assert f"error_message='{'x' * 200}'...(+1999800 chars)" in text
    assert "attributes={'blob': 'xxx" in text and "'n': 1}" in text
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(event)
    assert len(console.export_text()) < 2500
    short = OperationFinished(
        **{**msgspec.structs.asdict(event), "error_message": "e", "attributes": {"n": 1}}
    )
    assert "error_message='e'" in pretty_repr(short) and "attributes={'n': 1}" in pretty_repr(short)
