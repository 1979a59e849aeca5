"""``ckpt_events.checks``: the library's one rule for int and number arguments, public for sinks."""

from __future__ import annotations

import math

import pytest

from ckpt_events import InvalidArgumentError, InvalidTypeError, InvalidValueError
from ckpt_events.checks import check_int, check_number


@pytest.mark.parametrize(
    ("value", "child", "builtin"),
    [(True, InvalidTypeError, TypeError), (2.0, InvalidTypeError, TypeError)]
    + [("3", InvalidTypeError, TypeError), (0, InvalidValueError, ValueError)]
    + [(-1, InvalidValueError, ValueError)],
)
def test_check_int_says_the_callers_message_with_the_right_child(
    value: object, child: type[InvalidArgumentError], builtin: type[Exception]
) -> None:
    """A bool or a float is the wrong type, an int below the minimum the wrong value; both are
    the library's errors and the builtin a caller may already catch; the message is the caller's."""
    message = f"every must be an int >= 1, not {value!r}"
    with pytest.raises(child, match="every must be an int") as raised:
        check_int(value, message, minimum=1)
    assert isinstance(raised.value, InvalidArgumentError) and isinstance(raised.value, builtin)
    assert str(raised.value) == message


def test_check_number_bounds_and_nan() -> None:
    """A number in range comes back as a float; NaN and out-of-range values are refused by value,
    a bool by type; ``low_open`` leaves the low end out."""
    assert check_number(2, "x", high=2) == 2.0 and type(check_number(2, "x", high=2)) is float
    for bad in (math.nan, -0.1, 2.5):
        with pytest.raises(InvalidValueError, match="x in"):
            check_number(bad, "x in [0, 2]", high=2)
    with pytest.raises(InvalidTypeError):
        check_number(False, "x")
    with pytest.raises(InvalidValueError):
        check_number(0, "x", low_open=True)


def test_the_library_checks_its_own_arguments_with_this_pair() -> None:
    """The sinks' and the bus's own checks are these functions (one rule, not a copy)."""
    from ckpt_events import _errors

    assert check_int is _errors.check_int and check_number is _errors.check_number


def test_said_in_log_and_fit_for_log_are_public_for_sinks_and_the_harness() -> None:
    """The library's own way to say a caught exception in a log line, public: one line, cut and
    redacted (``said_in_log``), and a record's ``exc_info`` fitted alike (``fit_for_log``)."""
    from ckpt_events.checks import fit_for_log, said_in_log

    error = ValueError("POST https://user:pw@host.example/v1 failed:\n" + "x" * 1_000_000)
    said = said_in_log(error)
    assert said.startswith("ValueError: POST https://[REDACTED]@host.example/v1 failed: xxx")
    assert "\n" not in said and len(said) < 400
    fitted = fit_for_log(error)
    assert type(fitted).__name__ == "ValueError" and fitted.__traceback__ is error.__traceback__
    assert "pw@" not in str(fitted) and len(str(fitted)) < 2100
    short = KeyError("k")
    assert fit_for_log(short) is short
