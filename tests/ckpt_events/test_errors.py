"""The core's error tree: a bad argument is a ValueError for a value and a TypeError for a type."""

from __future__ import annotations

import argparse
import io
from collections.abc import Callable
from typing import Final

import pytest

from ckpt_events import (
    Bus,
    CkptEventsError,
    InvalidArgumentError,
    InvalidTypeError,
    InvalidValueError,
    Telemetry,
)
from ckpt_events._errors import argument_error, check_int, check_number
from ckpt_events.checks import SHOWN_CHARS, shown
from ckpt_events.participants.cli.command import positive_int
from ckpt_events.participants.server.app import create_app
from ckpt_events.sinks.jsonl import JsonLinesSink
from ckpt_events.sinks.otlp._http import OtlpHttpSender
from ckpt_events.testing import EventCapture
from ckpt_events.vocab import resolve_span_groups


def _telemetry(**options: object) -> Telemetry:
    return Telemetry(Bus(), **{"kind": "agent", "instance": "a-0", **options})  # type: ignore[arg-type]


def _listened(call: Callable[[Telemetry], object]) -> Callable[[], object]:
    # With nobody listening, counted events and spans are no-ops that check nothing.
    def run() -> None:
        with EventCapture() as capture:
            call(capture.telemetry("agent", "a-0"))

    return run


def _span_set(tel: Telemetry, **fields: object) -> None:
    with tel.operation("commit", checkpoint_id="c1") as op:
        op.set(**fields)  # type: ignore[arg-type]


WRONG_VALUES: dict[str, Callable[[], object]] = {
    "sample ratio above 1": lambda: _telemetry(sample_ratio=1.5),
    "negative worker": lambda: _telemetry(worker=-1),
    "unsafe instance name": lambda: _telemetry(instance="../x"),
    "negative close timeout": lambda: Bus(close_timeout=-1.0),
    "zero buffer size": lambda: Bus(buffer_size=0),
    "negative blockers": _listened(lambda tel: tel.prepare_not_ready(-1)),
    "negative records on a span": _listened(lambda tel: _span_set(tel, records=-3)),
}

WRONG_TYPES: dict[str, Callable[[], object]] = {
    "sample ratio as a string": lambda: _telemetry(sample_ratio="half"),
    "worker as a bool": lambda: _telemetry(worker=True),
    "instance as bytes": lambda: _telemetry(instance=b"a-0"),
    "bus that is not a Bus": lambda: Telemetry(object(), kind="agent", instance="a-0"),  # type: ignore[arg-type]
    "buffer size as a float": lambda: Bus(buffer_size=1.5),  # type: ignore[arg-type]
    "blockers as a string": _listened(lambda tel: tel.prepare_not_ready("3")),  # type: ignore[arg-type]
    "span group as a number": lambda: resolve_span_groups([7]),  # type: ignore[list-item]
    "clock that is not callable": lambda: _telemetry(clock=5),
}


@pytest.mark.parametrize("call", WRONG_VALUES.values(), ids=WRONG_VALUES.keys())
def test_a_wrong_value_is_a_value_error(call: Callable[[], object]) -> None:
    """Right type, wrong value: InvalidValueError, a ValueError and never a TypeError."""
    with pytest.raises(InvalidValueError) as info:
        call()
    assert isinstance(info.value, ValueError) and not isinstance(info.value, TypeError)


@pytest.mark.parametrize("call", WRONG_TYPES.values(), ids=WRONG_TYPES.keys())
def test_a_wrong_type_is_a_type_error(call: Callable[[], object]) -> None:
    """The wrong type of object: InvalidTypeError, a TypeError and never a ValueError."""
    with pytest.raises(InvalidTypeError) as info:
        call()
    assert isinstance(info.value, TypeError) and not isinstance(info.value, ValueError)


def test_one_root_catches_both() -> None:
    """InvalidArgumentError (a CkptEventsError) is the parent of both children."""
    for child in (InvalidValueError, InvalidTypeError):
        assert issubclass(child, InvalidArgumentError) and issubclass(child, CkptEventsError)


@pytest.mark.parametrize(
    ("value", "expected", "child"),
    [
        (-1, int, InvalidValueError),
        ("1", int, InvalidTypeError),
        (True, int, InvalidTypeError),
        (2.5, (int, float), InvalidValueError),
        (None, (int, float), InvalidTypeError),
    ],
)
def test_argument_error_picks_the_child_by_the_value_s_type(
    value: object, expected: type | tuple[type, ...], child: type[InvalidArgumentError]
) -> None:
    """A combined check's failure is a value error when the value had the expected type (bool never does)."""
    error = argument_error("n must be an int >= 0", value, expected)
    assert type(error) is child and str(error) == "n must be an int >= 0"


@pytest.mark.parametrize(
    ("value", "error"),
    [(True, InvalidTypeError), (1.0, InvalidTypeError), ("3", InvalidTypeError), (0, InvalidValueError)],
)
def test_check_int_refuses_bools_floats_and_too_small(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="^n must be a positive int$"):
        check_int(value, "n must be a positive int", minimum=1)
    assert check_int(5, "unused", minimum=1) == 5


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (False, InvalidTypeError),
        (None, InvalidTypeError),
        (0, InvalidValueError),
        (61, InvalidValueError),
        (float("nan"), InvalidValueError),
    ],
)
def test_check_number_refuses_bools_out_of_range_and_nan(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="^seconds in"):
        check_number(value, "seconds in (0, 60]", high=60, low_open=True)
    assert check_number(60, "unused", high=60, low_open=True) == 60.0


_HUGE: Final = "x" * 10_000_000


def test_shown_keeps_a_short_value_whole_and_cuts_a_long_one_with_its_size() -> None:
    """``shown`` is ``repr`` for a short value; a long str or bytes keeps its start and end
    (a path's file name) and says its size; an int too long to print says its bits."""
    assert shown("a-0") == "'a-0'" and shown(7) == "7" and shown(None) == "None"
    assert shown("a" * SHOWN_CHARS) == repr("a" * SHOWN_CHARS)
    cut = shown(_HUGE + "/name.txt")
    assert cut.startswith("'xxx") and cut.endswith("x/name.txt' (10,000,009 characters)")
    assert len(cut) < 2 * SHOWN_CHARS
    assert shown(bytearray(500)).endswith("... (500 bytes)") and len(shown(bytearray(500))) < 2 * SHOWN_CHARS
    assert shown(10**5000) == "<an int of 16,610 bits>"  # repr() itself raises past 4,300 digits
    assert shown([1] * 1_000_000) == "[1, 1, 1, 1, ...]"


def test_shown_never_raises_on_a_hostile_value() -> None:
    """A str subclass whose slicing and length raise, an object whose repr raises or is huge."""

    class Hostile(str):
        def __getitem__(self, index: object) -> str:
            raise RuntimeError("no")

        def __len__(self) -> int:
            raise RuntimeError("no")

    class BadRepr:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    class HugeRepr:
        def __repr__(self) -> str:
            return "r" * 1_000_000

    assert shown(Hostile("q" * 1000)).endswith("(1,000 characters)")
    assert "BadRepr" in shown(BadRepr())
    assert len(shown(HugeRepr())) <= 2 * SHOWN_CHARS


def _span_attribute(tel: Telemetry) -> None:
    with tel.operation("commit", checkpoint_id="c1") as op:
        op.set_attribute("note", _HUGE.encode())  # type: ignore[arg-type]


HUGE_VALUES: dict[str, Callable[[], object]] = {
    "a span's records": _listened(lambda tel: _span_set(tel, records=_HUGE)),
    "a span's attribute": _listened(_span_attribute),
    "a participant kind": lambda: Telemetry(Bus(), kind=_HUGE, instance="a-0"),
    "a telemetry's instance": lambda: _telemetry(instance=_HUGE),
    "a bus's close timeout": lambda: Bus(close_timeout=_HUGE),  # type: ignore[arg-type]
    "a span group": lambda: resolve_span_groups(_HUGE),
    "a JSON-lines sink's max_bytes": lambda: JsonLinesSink(io.BytesIO(), max_bytes=_HUGE),  # type: ignore[arg-type]
    "an OTLP endpoint": lambda: OtlpHttpSender(_HUGE, content_type="application/x-protobuf"),
    "a participant app's instance": lambda: create_app("agent", instance=_HUGE, token="t"),
    "a command line's number": lambda: positive_int(_HUGE),
}


@pytest.mark.parametrize("call", HUGE_VALUES.values(), ids=HUGE_VALUES.keys())
def test_an_error_quotes_a_huge_bad_value_cut_with_its_size(call: Callable[[], object]) -> None:
    """A 10 MB bad value makes an error message of a few hundred characters that says its size
    (the whole value was in the message: 10 MB per error, per log line)."""
    with pytest.raises((InvalidArgumentError, CkptEventsError, argparse.ArgumentTypeError)) as info:
        call()
    message = str(info.value)
    assert len(message) < 600, len(message)
    assert "10,000,000 characters" in message or "10,000,000 bytes" in message
