"""Numbers in words: one is singular, every other count plural, with thousands separators; a rate
in the unit that shows it; a long text cut at a word."""

from __future__ import annotations

import pytest

from ckpt_events.participants.cli.words import clipped, counted, milliseconds, rate


@pytest.mark.parametrize(
    ("count", "noun", "plural", "words"),
    [
        (1, "rollout", None, "1 rollout"),
        (0, "rollout", None, "0 rollouts"),
        (2, "export request", None, "2 export requests"),
        (12_345, "span", None, "12,345 spans"),
        (1, "checkpoint or restore", "checkpoints and restores", "1 checkpoint or restore"),
        (3, "checkpoint or restore", "checkpoints and restores", "3 checkpoints and restores"),
    ],
)
def test_counted(count: int, noun: str, plural: str | None, words: str) -> None:
    """The noun agrees with the count."""
    assert counted(count, noun, plural) == words


@pytest.mark.parametrize(
    ("nbytes", "seconds", "words"),
    [
        (3_744, 0.0029, "1.29 MB/s"),
        (2_106, 6.2, "340 B/s"),  # it said "0.00 MB/s"
        (3, 10.0, "0.30 B/s"),
        (999_600, 1.0, "1.00 MB/s"),  # never "1000 kB/s"
        (0, 1.0, "0 B/s"),
        (5e9, 2.0, "2.50 GB/s"),
    ],
)
def test_rate_is_never_zero_for_some_bytes(nbytes: float, seconds: float, words: str) -> None:
    """Three significant digits in the unit that shows them."""
    assert rate(nbytes, seconds) == words


def test_clipped_cuts_at_a_word() -> None:
    """A long message is cut at its last word that fits, with an ellipsis, and on one line."""
    text = "checkpoint c1 not prepared:\n stopped at stage environment with 1 blocker"
    assert clipped(text, 200) == "checkpoint c1 not prepared: stopped at stage environment with 1 blocker"
    assert clipped(text, 48) == "checkpoint c1 not prepared: stopped at stage…"
    assert clipped(text, 31) == "checkpoint c1 not prepared…"
    # A long token (a URL) is cut after a separator, not inside a name.
    assert clipped("agent-0 at http://127.0.0.1:41571/ng-control/v1/checkpoint/prepare", 40) == (
        "agent-0 at http://127.0.0.1:41571/…"
    )


def test_clipped_cuts_a_long_token_with_no_separator_where_it_must() -> None:
    """A message of one 1,024-character token (a hash, base64) keeps what fits of it: it was cut
    before the token, "ValueError: xxx…" said as "ValueError…"."""
    assert clipped("ValueError: " + "x" * 1024, 80) == "ValueError: " + "x" * 67 + "…"
    # A word shorter than half of ``most`` is still never cut inside.
    assert clipped("ValueError: " + "x" * 30 + " " + "y" * 39, 80) == "ValueError: " + "x" * 30 + "…"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (12.34, "12.3 ms"),
        (0.056, "0.056 ms"),
        (0.0081, "0.0081 ms"),
        (0.09996, "0.10 ms"),  # rounded to its two digits first: was "0.100 ms", three of them
        (0.99996, "1.0 ms"),  # was "1.00 ms"
        (0.0, "0 ms"),
    ],
)
def test_milliseconds_under_one_keep_two_significant_digits(value: float, words: str) -> None:
    assert milliseconds(value) == words
