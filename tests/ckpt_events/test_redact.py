"""The redaction rule: user attributes matching a redact key lose their string values."""

from __future__ import annotations

import time

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


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            "connect https://svc:hunter2@db.internal/x refused",
            "connect https://[REDACTED]@db.internal/x refused",
        ),
        ("GET /v1?access_token=abc123&page=2: 401", "GET /v1?access_token=[REDACTED]&page=2: 401"),
        ("login failed: password=hunter2 for bob", "login failed: password=[REDACTED] for bob"),
        (
            'bad config {"password": "p w", "user": "bob"}',
            'bad config {"password": "[REDACTED]", "user": "bob"}',
        ),
        ("db-password='s3cret' rejected", "db-password='[REDACTED]' rejected"),
        ("Authorization: Bearer eyJhbGciOi.J9.sig expired", "Authorization: Bearer [REDACTED] expired"),
        ("sent Basic dXNlcjpwYXNz", "sent Basic [REDACTED]"),
        ("SECRET: xyz", "SECRET: [REDACTED]"),
        # a password with an unencoded "@": the host starts after the last one, as URL parsers read it
        ("dial redis://:p@ss@cache:6379/0 failed", "dial redis://[REDACTED]@cache:6379/0 failed"),
        # an escaped quote inside a JSON string does not end the value
        ('body {"password": "a\\"b c", "user": "bob"}', 'body {"password": "[REDACTED]", "user": "bob"}'),
        # camelCase names have words too, as JSON bodies spell them
        (
            '{"accessToken": "abc", "clientSecret": "def"}',
            '{"accessToken": "[REDACTED]", "clientSecret": "[REDACTED]"}',
        ),
        ("apiKey=abc userName=bob", "apiKey=[REDACTED] userName=bob"),
        # a quoted value cut short (a message cut at its bound) is redacted to the end
        ('retry {"token": "abc', 'retry {"token": "[REDACTED]"'),
        # nothing that names a secret: kept whole, for the diagnosis
        ("401: missing or wrong bearer token", "401: missing or wrong bearer token"),
        ("the access token expired; basic checks failed", "the access token expired; basic checks failed"),
        ("digest mismatch after upload", "digest mismatch after upload"),
        # a scheme word in prose, then a credential after the real scheme word
        ("bad bearer token ghp_x1Y2 sent", "bad bearer token [REDACTED] sent"),
        ("Authorization: token ghp_16C7e42F292c6912E7710c838347Ae178B4a", "Authorization: token [REDACTED]"),
        ("timeout at 12:30 after http://host:8080/path", "timeout at 12:30 after http://host:8080/path"),
        ("checkpoint_id=c1 outcome=error: disk full", "checkpoint_id=c1 outcome=error: disk full"),
        ("", ""),
    ],
)
def test_a_message_loses_its_credentials_and_keeps_the_rest(message: str, expected: str) -> None:
    """The default rule on error messages: a URL's user and password, the value of a pair whose
    name (or one of its words) is a key, and a credential after an HTTP auth scheme."""
    redactor = Redactor()
    assert redactor.redact_message(message) == expected
    assert redactor.redact_message(expected) == expected  # redacting again changes nothing


def test_a_messages_rule_follows_the_keys_and_the_mode_and_can_be_off() -> None:
    """The user's keys and match mode decide the pairs too; ``messages=False`` keeps messages
    verbatim; anything but a bool for it is refused in one line."""
    assert Redactor({"ssn"}).redact_message("ssn=123-45 password=x") == "ssn=[REDACTED] password=x"
    assert (
        Redactor(mode="exact").redact_message("access_token=x token=y") == "access_token=x token=[REDACTED]"
    )
    assert Redactor(mode="substring").redact_message("mykeyring=abc") == "mykeyring=[REDACTED]"
    # a URL's userinfo and a bearer token are credentials whatever the keys
    assert (
        Redactor({"ssn"}).redact_message("https://u:p@h Bearer abc")
        == "https://[REDACTED]@h Bearer [REDACTED]"
    )
    verbatim = Redactor(messages=False)
    assert verbatim.redact_message("password=x https://u:p@h") == "password=x https://u:p@h"
    assert verbatim.apply({"user.token": "abc"}) == {"user.token": REDACTED}
    with pytest.raises(InvalidTypeError, match="messages must be True or False"):
        Redactor(messages="no")  # type: ignore[arg-type]


@pytest.mark.parametrize("unit", ["a", "a.", "a1", "x-"])
def test_a_long_message_is_redacted_in_linear_time(unit: str) -> None:
    """A long run of name characters (a base64 or hex blob in an exception, a reply's detail)
    was searched from each of its characters to its end: 30,000 took 14 s in a sink's thread.
    Now each run is read once; the rule's result is the same."""
    redactor = Redactor()
    blob = unit * (20_000 // len(unit))
    started = time.perf_counter()
    assert redactor.redact_message(f"bad {blob}") == f"bad {blob}"
    assert (
        redactor.redact_message(f"https://{blob} 1password={blob}")
        == "https://" + blob + " 1password=" + REDACTED
    )
    assert time.perf_counter() - started < 1.0
