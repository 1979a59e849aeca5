"""The redaction rule applied to whole events (user attributes and error messages), for the sinks
that write events as they are (the JSON-lines file, the logging sink) rather than build spans
from them (``_span_attrs``, and the span sinks' status and exception event)."""

from __future__ import annotations

from typing import Any, Final, get_args

import msgspec

from ckpt_events import CheckpointEvent, Redactor

__all__ = ["CARRIERS", "redacted"]

#: The event classes that carry a user's extra ``attributes`` and an exception's text,
#: ``error_message`` (the ``*Finished`` ones): each has both (a test checks), so the loop reads
#: both without asking which (the check per event cost half as much again as the loop).
CARRIERS: Final = frozenset(
    cls for cls in get_args(CheckpointEvent) if {"attributes", "error_message"} <= set(cls.__struct_fields__)
)


def redacted(batch: list[Any], redactor: Redactor) -> list[Any]:
    """``batch`` itself when the rule redacts nothing in it, else a copy in which each event with
    a matching user attribute, or an error message holding a credential
    (``Redactor.redact_message``), is a copy with those redacted: the event the other sinks share
    is left alone."""
    matches = redactor.matches
    messages = redactor.messages
    out = batch
    for index, event in enumerate(batch):
        if event.__class__ not in CARRIERS:
            continue
        attributes = event.attributes
        message = event.error_message if messages else None
        if not attributes and not message:
            continue  # most events: read, nothing built
        if attributes and any(
            [isinstance(value, str) and matches(name) for name, value in attributes.items()]
        ):
            attributes = redactor.apply(attributes)
        else:
            attributes = None
        scrubbed = redactor.redact_message(message) if message else message
        if attributes is None and scrubbed == message:
            continue
        if out is batch:
            out = list(batch)
        changes: dict[str, Any] = {}
        if attributes is not None:
            changes["attributes"] = attributes
        if scrubbed != message:
            changes["error_message"] = scrubbed
        out[index] = msgspec.structs.replace(event, **changes)  # one copy, whatever changed
    return out
