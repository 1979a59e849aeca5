"""The spans in rotel's detailed debug log (``agent_command(..., debug=True)``), one record each,
with the service that sent it: what a test asks of a real collector."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ReceivedSpan", "received_spans"]

_ATTRIBUTE = "     -> "


@dataclass
class ReceivedSpan:
    """One span as the collector printed it: its service, ids, name, status and attributes (values
    as printed, ``Str(x)`` as ``x``, others as ``Int(3)``, ``Bool(true)``)."""

    service: str
    name: str = ""
    trace_id: str = ""
    span_id: str = ""
    parent_id: str = ""
    status: str = ""
    attributes: dict[str, str] = field(default_factory=dict)


def _value(printed: str) -> str:
    return printed[4:-1] if printed.startswith("Str(") and printed.endswith(")") else printed


def received_spans(text: str) -> list[ReceivedSpan]:
    """Every span in ``text``, in the order printed."""
    spans: list[ReceivedSpan] = []
    service = ""
    span: ReceivedSpan | None = None
    for line in text.splitlines():
        if line.startswith("ResourceSpans #") or line.startswith("ResourceMetrics #"):
            span = None  # a new resource: its attributes are the resource's until a span starts
            service = ""
            continue
        if line.startswith("Span #"):
            span = ReceivedSpan(service)
            spans.append(span)
            continue
        if line.startswith(_ATTRIBUTE):
            key, _, value = line[len(_ATTRIBUTE) :].partition(": ")
            if span is None:
                if key == "service.name":
                    service = _value(value)
            else:
                span.attributes[key] = _value(value)
            continue
        if span is None:
            continue
        key, colon, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if not colon:
            continue
        if key == "Name":
            span.name = value
        elif key == "Trace ID":
            span.trace_id = value
        elif key == "ID":
            span.span_id = value
        elif key == "Parent ID":
            span.parent_id = value
        elif key == "Status code":
            span.status = value
    return spans
