"""The spans in rotel's detailed debug log (``rotel.agent_command(..., debug=True)``, or
``rotel.collector(debug_out=PATH)``), one record each, with the service that sent it: what a
benchmark or a test asks of a real collector."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ReceivedSpan", "received_spans", "settled_text"]

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


def settled_text(out: Path, *, settle_s: float = 1.0, timeout_s: float = 30.0) -> str:
    """The collector's printed output in ``out`` once it has not grown for ``settle_s`` (it prints
    each request as it decodes it), or as it is after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    size = -1
    while time.monotonic() < deadline:
        now = out.stat().st_size if out.exists() else 0
        if now == size:
            break
        size = now
        time.sleep(settle_s)
    return out.read_text(errors="replace")
