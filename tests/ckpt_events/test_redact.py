"""The redaction rule: user attributes matching a redact key lose their string values."""

from __future__ import annotations

import pytest

from ckpt_events import InvalidTypeError, InvalidValueError, Redactor, UnknownNameError
from ckpt_events.vocab import ATTR_PREFIX, REDACTED

OUR_NAMES = [
    ATTR_PREFIX + n
    for n in (
        "id",
        "participant_kind",
        "instance",
        "outcome",
        "phase",
        "blockers",
        "records",
        "bytes",
        "episodes",
        "rollouts",
        "calls",
        "cut_durable_prefix",
        "cut_durable_failure",
        "participants",
        "prepared",
        "stopped_at",
        "in_flight",
        "stop",
        "published",
        "rows",
        "restarts",
        "operation",
        "event",
        "code",
        "disposition",
    )
] + ["outcome"]


@pytest.mark.parametrize("mode", ["exact", "last_segment"])
def test_our_own_attribute_names_are_never_redacted(mode: str) -> None:
    """No attribute name this package writes matches the redact keys."""
    redactor = Redactor(mode=mode)  # type: ignore[arg-type]
    assert [n for n in OUR_NAMES if redactor.matches(n)] == []


def test_substring_mode_would_hit_only_names_we_avoid() -> None:
    """Even substring matching leaves our names alone (we avoid 'key' and 'token')."""
    redactor = Redactor(mode="substring")
    assert [n for n in OUR_NAMES if redactor.matches(n)] == []


def test_apply_redacts_string_values_of_matching_names() -> None:
    """String values under a matching name become [REDACTED]; other values stay."""
    redactor = Redactor()
    out = redactor.apply({"user.token": "abc", "password": "pw", "key": 3, "batch": "x", "Prompt": "hi"})
    assert out == {"user.token": REDACTED, "password": REDACTED, "key": 3, "batch": "x", "Prompt": REDACTED}
    assert Redactor(mode="exact").apply({"user.token": "abc"}) == {"user.token": "abc"}
    assert Redactor(mode="substring").apply({"api_keys": "abc"}) == {"api_keys": REDACTED}


def test_custom_keys_and_bad_mode() -> None:
    """Keys are configurable; an unknown match mode is a clear error."""
    assert Redactor({"ssn"}).matches("person.ssn")
    with pytest.raises(UnknownNameError, match="last_segment"):
        Redactor(mode="fuzzy")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("keys", "error"),
    [
        ("token", InvalidTypeError),  # its letters became the keys: user.token went out in clear
        (b"token", InvalidTypeError),
        ([1], InvalidTypeError),
        (None, InvalidTypeError),
        ([""], InvalidValueError),
    ],
)
def test_keys_that_are_not_names_are_refused(keys: object, error: type[Exception]) -> None:
    """A bare string, a key that is not a str, or an empty key is refused in one line: Redactor("token")
    took t, o, k, e and n as the keys, redacting ``a.t`` and not ``user.token``."""
    with pytest.raises(error, match="keys?"):
        Redactor(keys)  # type: ignore[arg-type]
