"""What OTLP cannot carry, and what goes out instead: OpenTelemetry's rule, one value at a time.

Protobuf strings are UTF-8, so a ``str`` holding a lone surrogate (``"x\\ud800"``) cannot be
written, and an ``int64`` holds neither ``2**63`` nor ``-2**63 - 1``. OpenTelemetry's encoder
drops such an attribute (``_encode_attributes`` skips the pair protobuf refuses) and keeps the
span; so do our encoders, and they count each value dropped. Text that is not an attribute
(a span's status message, an exception's type and message) keeps its readable part: each
surrogate becomes U+FFFD.
"""

from __future__ import annotations

import re
from typing import Any, Final

__all__ = ["INT64_MAX", "INT64_MIN", "replace_surrogates", "scrub_json_span"]

INT64_MIN: Final = -(1 << 63)
INT64_MAX: Final = (1 << 63) - 1
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def replace_surrogates(text: str) -> str:
    """``text`` with each surrogate code point (not encodable as UTF-8) replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def _encodable(text: object) -> bool:
    return not isinstance(text, str) or _SURROGATE.search(text) is None


def _scrub_attributes(attributes: list[dict[str, Any]]) -> int:
    kept = [
        pair
        for pair in attributes
        if _encodable(pair["key"]) and _encodable(pair["value"].get("stringValue"))
    ]
    dropped = len(attributes) - len(kept)
    attributes[:] = kept
    return dropped


def scrub_json_span(span: dict[str, Any]) -> int:
    """Make one OTLP/JSON span (as ``SpanEncoder`` builds it) encodable in place; values changed.

    Attributes with a surrogate in their key or string value are dropped; the name, the
    status message and the exception event's attributes keep their text with U+FFFD.
    """
    changed = _scrub_attributes(span.get("attributes", []))
    for key in ("name",):
        if not _encodable(span[key]):
            span[key] = replace_surrogates(span[key])
            changed += 1
    status = span.get("status")
    if status is not None and not _encodable(status.get("message")):
        status["message"] = replace_surrogates(status["message"])
        changed += 1
    for event in span.get("events", []):
        for pair in event["attributes"]:
            text = pair["value"].get("stringValue")
            if not _encodable(text):
                pair["value"]["stringValue"] = replace_surrogates(text)
                changed += 1
    return changed
