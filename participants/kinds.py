"""The harness's order of participant kinds: who prepares first, who resumes first, who retires when.

The rule of the original system (SPEC section 1), kept here and not in the core: prepare
runs one stage per kind, ``environment``, ``model``, ``agent``, ``resources``; resume runs
the reverse; retire and forget go callers before callees, ``environment``, then ``agent``,
then ``model`` and ``resources`` together. Commit and restore fan out to everyone at once.

Kinds are the user's (``ckpt_events.vocab.NAME_RULE``), so a kind these rules do not name
(a ``judge``) has a default place: **it prepares after the named kinds** (several such
kinds: sorted by name), so it **resumes before them** (the reverse), and it **retires and
forgets in the last group**, with the callees. The coordinator's prepare has a stage for
every named kind (also one with no members) and one for each other kind it coordinates.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from ckpt_events.vocab import Kind

__all__ = [
    "PREPARE_ORDER",
    "RESUME_ORDER",
    "RETIRE_GROUPS",
    "prepare_order",
    "resume_order",
    "retire_groups",
    "stage_index",
]

#: The named participant kinds in prepare order; resume runs the reverse.
PREPARE_ORDER: Final[tuple[str, ...]] = (Kind.ENVIRONMENT, Kind.MODEL, Kind.AGENT, Kind.RESOURCES)
RESUME_ORDER: Final[tuple[str, ...]] = tuple(reversed(PREPARE_ORDER))
#: Retire and forget go callers before callees, one group at a time.
RETIRE_GROUPS: Final[tuple[tuple[str, ...], ...]] = (
    (Kind.ENVIRONMENT,),
    (Kind.AGENT,),
    (Kind.MODEL, Kind.RESOURCES),
)
_INDEX: Final = {kind: i for i, kind in enumerate(PREPARE_ORDER)}


def _others(kinds: Iterable[str]) -> list[str]:
    """The participant kinds of ``kinds`` the rules do not name, once each, sorted by name."""
    return sorted({str(k) for k in kinds if k not in _INDEX and k != Kind.CONTROLLER})


def prepare_order(kinds: Iterable[str] = ()) -> tuple[str, ...]:
    """The prepare stages: ``PREPARE_ORDER``, then the other kinds of ``kinds`` by name."""
    return (*PREPARE_ORDER, *_others(kinds))


def resume_order(kinds: Iterable[str] = ()) -> tuple[str, ...]:
    """The resume stages: ``prepare_order(kinds)`` reversed (a kind of the user's first)."""
    return tuple(reversed(prepare_order(kinds)))


def retire_groups(kinds: Iterable[str] = ()) -> tuple[tuple[str, ...], ...]:
    """The retire and forget groups: ``RETIRE_GROUPS``, the other kinds of ``kinds`` in the last."""
    *first, last = RETIRE_GROUPS
    return (*first, (*last, *_others(kinds)))


def stage_index(kind: str) -> int:
    """The position of ``kind`` in the prepare order; every kind the rules do not name is last
    (``len(PREPARE_ORDER)``; sort by ``(stage_index(kind), kind)`` for the full order)."""
    return _INDEX.get(kind, len(PREPARE_ORDER))
