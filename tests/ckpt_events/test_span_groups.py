"""Span groups: presets, opt-in checkpoint, spec parsing, unknown names."""

from __future__ import annotations

import pytest

from ckpt_events import InvalidArgumentError, UnknownNameError
from ckpt_events.vocab import SPAN_GROUP_PRESETS, SPAN_GROUPS, resolve_span_groups


def test_default_leaves_checkpoint_out_and_the_spec_turns_it_on() -> None:
    """checkpoint is opt-in: "default" lacks it, "default,checkpoint" has it."""
    assert "checkpoint" not in resolve_span_groups("default")
    assert "checkpoint" in resolve_span_groups("default,checkpoint")
    assert resolve_span_groups("default,checkpoint") == SPAN_GROUP_PRESETS["default"] | {"checkpoint"}


def test_spec_is_case_insensitive_trimmed_and_mixes_presets() -> None:
    """Whitespace and case do not matter; empty entries are skipped; all is everything."""
    assert resolve_span_groups("  Default , CHECKPOINT ,, ") == resolve_span_groups("default,checkpoint")
    assert resolve_span_groups("all") == SPAN_GROUPS
    assert resolve_span_groups(["checkpoint"]) == {"checkpoint"}
    assert resolve_span_groups(None) == frozenset() == resolve_span_groups("")


def test_unknown_names_list_the_valid_ones() -> None:
    """An unknown group is a clear error listing presets and groups."""
    with pytest.raises(UnknownNameError, match="checkpont") as info:
        resolve_span_groups("default,checkpont")
    assert "checkpoint" in str(info.value) and "default" in str(info.value)
    with pytest.raises(InvalidArgumentError):
        resolve_span_groups(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        resolve_span_groups([1])  # type: ignore[list-item]
