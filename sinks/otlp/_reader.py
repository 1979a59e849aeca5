"""A collector's OTLP JSON file read as events: the ``file`` exporter's output, one
``ExportTraceServiceRequest`` as JSON per line.

Each span becomes the finished event it was exported from: its name picks the event class and
the operation, step, stage or action (the span tables in ``ckpt_events``), its attributes give
back the event's fields (``Attr`` keys, the ``*_END_ATTRS`` tables) and the rest are the user's
attributes. A step names no participant: it takes its operation's (its parent span), so a step
is held until its operation arrives. A collector exports finished spans only, so nothing is
ever open in such a file.

Bad input is reported per line (counted, the first few shown) and never stops the read: a
line that is not JSON, a span id seen twice, ids of the wrong length, an end before its
start, a time outside ``[0, 2**63)`` ns, an attribute of ours of the wrong type, and, at the
end, steps whose operation (parent) never came.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import msgspec

from ckpt_events import OperationFinished, StageFinished, StepFinished, parse_tracestate
from ckpt_events._public_home import publish
from ckpt_events.sinks._span_attrs import ERROR_TYPE_OTHER, plans_by_name
from ckpt_events.vocab import NAME_RULE, SPAN_PREFIX, Attr, Kind, span_name

__all__ = ["looks_like_otlp", "read_otlp"]

_IS_REMOTE: Final = 0x200
_STATUS_ERROR: Final = 2
#: A time of an event is a Unix ns in ``[0, 2**63)``: an ``int64``, as a collector's.
_TIME_BOUND: Final = 1 << 63
#: Span name -> (event class, the field its name comes from, that field's value): the span
#: exporters' rule (``ckpt_events.sinks._span_attrs``) read backwards.
_PLANS: Final = plans_by_name()
_BY_NAME: Final[dict[str, tuple[type, str, Any]]] = {
    name: (cls, field, member) for name, (cls, field, member, _) in _PLANS.items()
}
_STAGE_PREFIX: Final = span_name("coordinate", "prepare", "")


def _users_span(name: str) -> tuple[type, str, Any] | None:
    """A step or a prepare stage the user named (``gym.checkpoint.upload``,
    ``gym.checkpoint.coordinate.prepare.judge``): the open tables' rule read backwards."""
    cls: type
    if name.startswith(_STAGE_PREFIX):
        rest, cls, field = name[len(_STAGE_PREFIX) :], StageFinished, "stage"
    elif name.startswith(SPAN_PREFIX):
        rest, cls, field = name[len(SPAN_PREFIX) :], StepFinished, "step"
    else:
        return None
    return (cls, field, rest) if NAME_RULE.fullmatch(rest) is not None else None


#: Attribute key -> event field (a worker's index is put on spans beside the plan's pairs).
_FIELDS: Final[dict[str, str]] = {key: field for *_, pairs in _PLANS.values() for field, key in pairs} | {
    Attr.WORKER: "worker"
}


def looks_like_otlp(first_line: bytes) -> bool:
    """Whether a file's first line is an OTLP JSON trace request."""
    return first_line.lstrip().startswith(b"{") and b'"resourceSpans"' in first_line[:200]


def _value(v: dict[str, Any]) -> Any:
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    return None


def _hex(text: Any, digits: int) -> int | None:
    if not isinstance(text, str) or len(text) != digits:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


def read_otlp(path: Path, skip: Any) -> Iterator[tuple[int, Any]]:
    """``(line number, event)`` for every span of the file; ``skip(text)`` is told of each bad
    span or line (one line each)."""
    decode = msgspec.json.Decoder().decode
    seen: set[tuple[int, int]] = set()
    #: Operations seen: span id -> (kind, instance, worker); steps waiting for theirs.
    owners: dict[tuple[int, int], tuple[str, str, int | None]] = {}
    waiting: dict[tuple[int, int], list[tuple[int, dict[str, Any]]]] = {}
    with open(path, "rb") as file:
        for number, raw in enumerate(file, 1):
            if not raw.strip():
                continue
            try:
                request = decode(raw)
                resources = request["resourceSpans"]
            except (msgspec.DecodeError, KeyError, TypeError) as exc:
                skip(f"{path}:{number}: not an OTLP JSON trace request ({exc}); line skipped")
                continue
            for resource in resources or ():
                for scope in resource.get("scopeSpans") or ():
                    for span in scope.get("spans") or ():
                        made = _event_fields(span)
                        if isinstance(made, str):
                            skip(f"{path}:{number}: span {span.get('spanId', '?')!s:.16} skipped: {made}")
                            continue
                        if made is None:
                            continue
                        cls, fields = made
                        key = (fields["trace_id"], fields["span_id"])
                        if key in seen:
                            skip(f"{path}:{number}: span {fields['span_id']:016x} seen twice; skipped")
                            continue
                        seen.add(key)
                        if cls is StepFinished:
                            owner = owners.get((fields["trace_id"], fields["parent_span_id"] or 0))
                            if owner is None:
                                parent = (fields["trace_id"], fields["parent_span_id"] or 0)
                                waiting.setdefault(parent, []).append((number, fields))
                                continue
                            fields["kind"], fields["instance"], fields["worker"] = owner
                        elif cls is not OperationFinished:
                            fields.setdefault("kind", Kind.CONTROLLER.value)
                            fields.setdefault("instance", "controller")
                        # An attribute of ours of the wrong type (``records`` a string) was
                        # msgspec's ValidationError out of the report: the span is skipped.
                        event = _converted(fields, cls)
                        if isinstance(event, str):
                            skip(f"{path}:{number}: span {fields['span_id']:016x} skipped: {event}")
                            continue
                        if cls is OperationFinished:  # an operation skipped names no step's owner
                            owner = (fields["kind"], fields["instance"], fields.get("worker"))
                            owners[key] = owner
                            for at, step in waiting.pop(key, ()):
                                step["kind"], step["instance"], step["worker"] = owner
                                made = _converted(step, StepFinished)
                                if isinstance(made, str):
                                    skip(f"{path}:{at}: span {step['span_id']:016x} skipped: {made}")
                                    continue
                                yield at, made
                        yield number, event
    for steps in waiting.values():
        for at, step in steps:
            skip(f"{path}:{at}: step span {step['span_id']:016x}: its parent operation never came; skipped")


def _converted(fields: dict[str, Any], cls: type) -> Any:
    """The event of ``fields``, or why it is not one: a field of the wrong type, or a time
    outside ``[0, 2**63)`` (what the JSON-lines reader refuses too)."""
    for name, value in fields.items():
        if name.endswith("_ns") and isinstance(value, int) and not 0 <= value < _TIME_BOUND:
            return f"Expected `int` >= 0 and < 2**63 (Unix ns), got {value} - at `$.{name}`"
    try:
        return msgspec.convert(fields, cls)
    except msgspec.ValidationError as exc:
        return str(exc)


def _event_fields(span: dict[str, Any]) -> tuple[type, dict[str, Any]] | str | None:
    """The event class and fields of a span of ours, why it is bad, or ``None`` for another's."""
    name = span.get("name", "")
    found = _BY_NAME.get(name) or (_users_span(name) if isinstance(name, str) else None)
    if found is None:
        return None  # a span not of ours: the collector may carry others
    cls, field, value = found
    trace_id = _hex(span.get("traceId"), 32)
    span_id = _hex(span.get("spanId"), 16)
    if trace_id is None or span_id is None:
        return "trace id must be 32 hex digits and span id 16"
    parent_text = span.get("parentSpanId") or None
    parent = None if parent_text is None else _hex(parent_text, 16)
    if parent_text is not None and parent is None:
        return "parent span id must be 16 hex digits"
    try:
        start, end = int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"])
    except (KeyError, ValueError, TypeError) as exc:
        return f"no start or end time ({exc})"
    if end < start:
        return "its end is before its start"
    fields: dict[str, Any] = {
        field: str(value),
        "trace_id": trace_id,
        "span_id": span_id,
        "start_ns": start,
        "end_ns": end,
        "parent_span_id": parent,
        "parent_remote": bool(int(span.get("flags", 0)) & _IS_REMOTE),
        # The caller's W3C tracestate our exporters put on the span; a malformed one is dropped.
        "tracestate": parse_tracestate(span.get("traceState")),
    }
    extra: dict[str, Any] = {}
    for pair in span.get("attributes") or ():
        key, got = pair.get("key"), _value(pair.get("value") or {})
        if key in _FIELDS:
            fields[_FIELDS[key]] = got
        elif key is not None:
            # An event's attribute is a bool, int, float or str: an array or a key-value list
            # (valid OTLP) is kept as its JSON text, not the reason to skip the span.
            scalar = isinstance(got, bool | int | float | str)
            extra[key] = got if scalar else msgspec.json.encode(pair.get("value")).decode()
    status = span.get("status") or {}
    if status.get("code") == _STATUS_ERROR:
        fields["outcome"] = "error"
        for event in span.get("events") or ():
            if event.get("name") == "exception":
                attrs = {p.get("key"): _value(p.get("value") or {}) for p in event.get("attributes") or ()}
                fields["error_type"] = attrs.get("exception.type")
                fields["error_message"] = attrs.get("exception.message") or None
        _take_error_type(fields, extra)
    if extra:
        fields["attributes"] = extra
    return cls, fields


def _take_error_type(fields: dict[str, Any], extra: dict[str, Any]) -> None:
    """A failed span's ``error.type``, which our exporters derive from its error, taken out of
    the user's attributes: the error's type when no exception event said it; kept as the
    user's own when it says another (a user may set one of their own)."""
    error_type = extra.get(Attr.ERROR_TYPE)
    if error_type == ERROR_TYPE_OTHER:  # the fallback of an event without a type: it names none
        del extra[Attr.ERROR_TYPE]
    elif isinstance(error_type, str) and fields.get("error_type") in (None, error_type):
        fields["error_type"] = error_type
        del extra[Attr.ERROR_TYPE]


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.sinks.otlp", looks_like_otlp, read_otlp)
