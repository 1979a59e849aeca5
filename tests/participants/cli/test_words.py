"""Counts in words: one is singular, every other count plural, with thousands separators."""

from __future__ import annotations

import pytest

from ckpt_events.participants.cli.words import counted


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
