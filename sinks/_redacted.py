"""The redaction rule applied to whole events, for the sinks that write events as they are (the
JSON-lines file, the logging sink) rather than build spans from them (``_span_attrs``)."""

from __future__ import annotations

from typing import Any, Final, get_args

import msgspec

from ckpt_events import CheckpointEvent, Redactor

__all__ = ["redacted"]

#: The event classes that carry a user's extra ``attributes`` (the ``*Finished`` ones).
_WITH_ATTRIBUTES: Final = frozenset(
    cls for cls in get_args(CheckpointEvent) if "attributes" in cls.__struct_fields__
)


def redacted(batch: list[Any], redactor: Redactor) -> list[Any]:
    """``batch`` itself when the rule redacts nothing in it, else a copy in which each event with
    a matching user attribute is a copy with those values redacted (``Redactor.apply``): the
    event the other sinks share is left alone."""
    matches = redactor.matches
    out = batch
    for index, event in enumerate(batch):
        if event.__class__ not in _WITH_ATTRIBUTES:
            continue
        attributes = event.attributes
        if not attributes or not any(
            [isinstance(value, str) and matches(name) for name, value in attributes.items()]
        ):
            continue
        if out is batch:
            out = list(batch)
        out[index] = msgspec.structs.replace(event, attributes=redactor.apply(attributes))
    return out
