"""Hypothesis strategies for every event type, built from the Structs' own field types."""

from __future__ import annotations

import enum
import types
import typing
from typing import Any, Literal

import msgspec
from hypothesis import strategies as st

from ckpt_events._events import EVENT_TYPES, Event

_NAMES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True)
_SPECIAL: dict[str, st.SearchStrategy[Any]] = {
    "trace_id": st.integers(1, 2**128 - 1),
    "span_id": st.integers(1, 2**64 - 1),
    "parent_span_id": st.none() | st.integers(1, 2**64 - 1),
    "instance": _NAMES,
    "checkpoint_id": st.none() | _NAMES,
    "start_ns": st.integers(0, 2**63 - 1),
    "end_ns": st.integers(0, 2**63 - 1),
    "time_ns": st.integers(0, 2**63 - 1),
    "attributes": st.none()
    | st.dictionaries(
        st.text(max_size=20),
        st.text(max_size=20)
        | st.booleans()
        | st.integers(-(2**63), 2**63 - 1)
        | st.floats(allow_nan=False, allow_infinity=False),
        max_size=4,
    ),
}


def _for_type(tp: Any) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(_for_type(arg) for arg in typing.get_args(tp)))
    if origin is Literal:
        return st.sampled_from(typing.get_args(tp))
    if tp is type(None):
        return st.none()
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(list(tp))
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(0, 2**63 - 1)
    if tp is str:
        return st.text(max_size=40)
    if tp is float:
        return st.floats(0, 1e9, allow_nan=False, allow_infinity=False)
    raise NotImplementedError(f"no strategy for {tp!r}")


def event_strategy(cls: type[Event]) -> st.SearchStrategy[Event]:
    """Any valid instance of event class ``cls``."""
    hints = typing.get_type_hints(cls)
    fields = {
        f.name: _SPECIAL[f.name] if f.name in _SPECIAL else _for_type(hints[f.name])
        for f in msgspec.structs.fields(cls)
    }
    return st.builds(cls, **fields)


any_event: st.SearchStrategy[Event] = st.one_of(*(event_strategy(cls) for cls in EVENT_TYPES))
