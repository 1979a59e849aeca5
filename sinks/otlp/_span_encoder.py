"""OTLP trace request bodies written straight from finished events (no SDK objects per span).

``SpanEncoder.protobuf(events)`` writes an ``ExportTraceServiceRequest`` in protobuf wire
format by hand: a span is a few ``bytes`` joins, with the key-value pairs that repeat from
span to span (participant kind, instance, outcome, ids of one checkpoint) encoded once and
cached. ``SpanEncoder.json(events)`` builds the OTLP/JSON mapping (hex ids, 64-bit integers
as strings, enums as numbers) and encodes it with msgspec. Names, attributes, kind, status
and the exception event are those ``SpanSink`` gives the same event, and so is the span's
``trace_state`` (the caller's W3C ``tracestate``, ``span_tracestate``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeAlias

import msgspec

from ckpt_events import InvalidTypeError, Redactor, __version__
from ckpt_events._errors import shown
from ckpt_events._public_home import publish
from ckpt_events.sinks._span_attrs import (
    NAMING_FIELDS,
    AttributeLimits,
    limited_span,
    span_plan,
    span_tracestate,
)
from ckpt_events.sinks._wire_safe import replace_surrogates, scrub_json_span
from ckpt_events.sinks.otlp import _tags as tags
from ckpt_events.sinks.otlp._wire import FIXED64 as _FIXED64
from ckpt_events.sinks.otlp._wire import SMALL_VARINTS as _SMALL_VARINTS
from ckpt_events.sinks.otlp._wire import field as _field
from ckpt_events.sinks.otlp._wire import json_attributes as _json_attributes
from ckpt_events.sinks.otlp._wire import key_value as _key_value
from ckpt_events.sinks.otlp._wire import varint as _varint
from ckpt_events.vocab import Outcome, SpanKind, span_kind_of

__all__ = ["SCOPE_NAME", "SpanEncoder"]

SCOPE_NAME: Final = "ckpt_events"
_ERROR: Final = Outcome.ERROR.value
_KIND: Final = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3}
_STATUS_ERROR: Final = 2
_SAMPLED: Final = 0x01
_HAS_IS_REMOTE: Final = 0x100
_IS_REMOTE: Final = 0x200
_CACHE_LIMIT: Final = 8192
#: Bounds of the encoded pairs: values kept per attribute key, and keys kept (ours are ~20; a
#: user's attributes beyond this many keys are encoded each time).
_PAIRS_PER_KEY: Final = 1024
_PAIR_KEYS: Final = 64

_TIMES: Final = struct.Struct("<BQBQ")  # Span start and end time, fixed64 each
# Span.trace_id, Span.span_id (and Span.parent_span_id), each with its tag and length in front.
_IDS: Final = struct.Struct(">2s16s2sQ")
_IDS_CHILD: Final = struct.Struct(">2s16s2sQ2sQ")
_PARENT: Final = struct.Struct(">2sQ")
_FLAGS: Final = struct.Struct("<I")
_FLAGS_LOCAL: Final = _varint(tags.SPAN_FLAGS) + _FLAGS.pack(_SAMPLED | _HAS_IS_REMOTE)
_FLAGS_REMOTE: Final = _varint(tags.SPAN_FLAGS) + _FLAGS.pack(_SAMPLED | _HAS_IS_REMOTE | _IS_REMOTE)
# Tag and length of the fixed-size id fields, written in front of the ids in every span.
_TRACE_ID: Final = bytes((tags.SPAN_TRACE_ID, 16))
_SPAN_ID: Final = bytes((tags.SPAN_ID, 8))
_PARENT_SPAN_ID: Final = bytes((tags.SPAN_PARENT_SPAN_ID, 8))
_TRACE_STATE: Final = bytes((tags.SPAN_TRACE_STATE,))
_KIND_TAG: Final = bytes((tags.SPAN_KIND,))
_SPAN_TAG: Final = bytes((tags.SCOPE_SPANS_SPANS,))
_EVENT_TIME: Final = bytes((tags.EVENT_TIME,))
_STATUS_CODE: Final = bytes((tags.STATUS_CODE,))
_REQUEST_TAG: Final = bytes((tags.TRACES_REQUEST_RESOURCE_SPANS,))
#: A span's cached plan: its head (Span.name, Span.kind) and, per attribute field in order, the
#: field, its attribute key and that key's encoded pairs by value.
_Plan: TypeAlias = tuple[bytes, tuple[tuple[str, str, dict[object, bytes]], ...]]


class SpanEncoder:
    """Encodes batches of finished events as OTLP trace export requests of one resource."""

    def __init__(
        self,
        resource_attributes: Mapping[str, object],
        redactor: Redactor | None = None,
        limits: AttributeLimits | None = None,
    ) -> None:
        # Checked here, as SpanSink does: any other object made every batch fail to encode,
        # each span dropped as "could not encode a batch".
        if redactor is not None and not isinstance(redactor, Redactor):
            raise InvalidTypeError(f"redactor must be a ckpt_events.Redactor or None, not {shown(redactor)}")
        self.redactor = redactor if redactor is not None else Redactor()
        #: The span attribute limits (the resource's attributes are not limited, as in the spec).
        self.limits = limits if limits is not None else AttributeLimits()
        # No value length limit: a span of our fields alone is written from its plan (see _span).
        self._plan_count = self.limits.count if self.limits.value_length is None else -1
        self.resource_attributes = dict(resource_attributes)
        #: Values left out (an attribute protobuf cannot carry: a lone surrogate, an int
        #: outside int64) or replaced (U+FFFD in a status or exception text); the span stays.
        self.invalid_values = 0
        resource = _field(tags.RESOURCE_SPANS_RESOURCE, b"".join(self._resource_pairs()))
        scope = _field(
            tags.SCOPE_SPANS_SCOPE,
            _field(tags.SCOPE_NAME_FIELD, SCOPE_NAME.encode())
            + _field(tags.SCOPE_VERSION, __version__.encode()),
        )
        self._resource = resource
        self._scope = scope
        # Encoded Span.attributes pairs: per attribute key, by value (exact str and int values).
        self._pairs: dict[str, dict[object, bytes]] = {}
        # Span.trace_state encoded, by the event's tracestate (b"" for one not valid).
        self._states: dict[str, bytes] = {}
        # Per (event class, the value naming its span, parent is remote): its _Plan, or None.
        self._plans: dict[tuple[type, object, bool], _Plan | None] = {}
        self._json_resource = {"attributes": self._json_attributes(self.resource_attributes)}
        self._json_scope = {"name": SCOPE_NAME, "version": __version__}

    # -- protobuf ----------------------------------------------------------------------------

    def protobuf(self, events: Iterable[Any]) -> tuple[bytes, int]:
        """``(request body, spans in it)`` for ``events``; events without a span are skipped."""
        spans = [self._span(event) for event in events]
        count = len(spans) - spans.count(b"")  # an event without a span wrote nothing
        # One join for the whole request (the spans are most of it): the two enclosing
        # messages' tags and lengths are written in front rather than by copying the body.
        scope_spans = len(self._scope) + sum(map(len, spans))
        header = bytes((tags.RESOURCE_SPANS_SCOPE_SPANS,)) + _varint(scope_spans)
        resource_spans = len(self._resource) + len(header) + scope_spans
        spans[:0] = (_REQUEST_TAG, _varint(resource_spans), self._resource, header, self._scope)
        return b"".join(spans), count

    def _resource_pairs(self) -> Iterable[bytes]:
        for key, value in self.resource_attributes.items():
            try:
                yield _field(tags.RESOURCE_ATTRIBUTES, _key_value(key, value))
            except ValueError:
                self.invalid_values += 1

    def _pair(self, key: str, value: object, cache: dict[object, bytes] | None = None) -> bytes:
        """Span.attributes holding one ``KeyValue``, kept in ``cache`` (the key's own) if given."""
        # An enum member goes out as its plain str (all are StrEnums: str() is the value).
        if value.__class__ is not str and isinstance(value, str):
            value = str(value)
        try:
            encoded = _field(tags.SPAN_ATTRIBUTES, _key_value(key, value))
        except ValueError:  # the one value is dropped, as OpenTelemetry's encoder does
            self.invalid_values += 1
            return b""
        # Kept for exact str and int values only: a bool or float equal to a cached int
        # (True == 1 == 1.0) encodes differently, so those are never looked up.
        if cache is not None and (value.__class__ is str or value.__class__ is int):
            if len(cache) >= _PAIRS_PER_KEY:
                cache.clear()
            cache[value] = encoded
        return encoded

    def _plan(self, event: Any) -> _Plan | None:
        """What every span of ``event``'s name, class and parent locality shares (``_plans``)."""
        plan = span_plan(event)
        if plan is None:
            return None
        name, fields = plan
        head = _field(tags.SPAN_NAME, name.encode()) + _KIND_TAG + _varint(_KIND[span_kind_of(event)])
        return head, tuple((field, key, self._pairs.setdefault(key, {})) for field, key in fields)

    def _cache_of(self, key: str) -> dict[object, bytes] | None:
        """The encoded pairs of attribute ``key`` (a user's too, up to ``_PAIR_KEYS`` keys)."""
        cache = self._pairs.get(key)
        if cache is None and len(self._pairs) < _PAIR_KEYS:
            cache = self._pairs[key] = {}
        return cache

    def _span(self, event: Any) -> bytes:
        cls = event.__class__
        naming = NAMING_FIELDS.get(cls)
        if naming is None:
            return b""
        # One lookup for everything a span's name decides: its head (Span.name and Span.kind:
        # all span_kind_of reads, a test checks this over every span name of every class) and
        # its attribute fields, each with its encoded pairs by value.
        cache_key = (cls, getattr(event, naming), event.parent_remote)
        try:
            plan = self._plans[cache_key]
        except KeyError:
            plan = self._plan(event)
            if len(self._plans) >= _CACHE_LIMIT:
                self._plans.clear()
            self._plans[cache_key] = plan
        if plan is None:
            return b""
        head, fields = plan
        flags = _FLAGS_LOCAL
        parent = event.parent_span_id
        state = event.tracestate
        # The ids with their tags in one struct pack (the span ids as big-endian 8 bytes): no
        # bytes concatenation for them.
        trace = event.trace_id.to_bytes(16, "big")
        if state is None and parent is not None:
            parts = [_IDS_CHILD.pack(_TRACE_ID, trace, _SPAN_ID, event.span_id, _PARENT_SPAN_ID, parent)]
        else:
            parts = [_IDS.pack(_TRACE_ID, trace, _SPAN_ID, event.span_id)]
            if state is not None:  # the caller's W3C tracestate, passed on: one encoding per header
                encoded = self._states.get(state) if state.__class__ is str else None
                parts.append(encoded or self._trace_state(event))
            if parent is not None:
                parts.append(_PARENT.pack(_PARENT_SPAN_ID, parent))
        if parent is not None and event.parent_remote:
            flags = _FLAGS_REMOTE
        parts.append(head)
        parts.append(_TIMES.pack(tags.SPAN_START_TIME, event.start_ns, tags.SPAN_END_TIME, event.end_ns))
        # A failed span adds error.type to its plan's fields: built as SpanSink builds it.
        failed = event.outcome == _ERROR
        if event.attributes or event.worker is not None or failed or len(fields) > self._plan_count:
            made = limited_span(event, self.redactor, self.limits)
            if made is not None:
                for key, value in made[1].items():
                    parts.append(self._pair(key, value, self._cache_of(key)))
                if made[2]:
                    parts.append(bytes((tags.SPAN_DROPPED_ATTRIBUTES_COUNT,)) + _varint(made[2]))
        else:
            # Most spans: the plan's fields straight from the event, as span_name_and_attributes
            # puts them (None left out, an enum member as its str), without building the dict:
            # each pair looked up in its key's own cache by value (no tuple key), inline (a method
            # call per attribute costs more than the lookup).
            for field, key, cache in fields:
                value = getattr(event, field)
                if value is None:
                    continue
                cls = value.__class__
                # A bool or float never: True == 1 == 1.0 hash alike and encode differently.
                encoded = cache.get(value) if cls is not bool and cls is not float else None
                parts.append(encoded or self._pair(key, value, cache))
        if failed:
            cut = self.limits.cut
            error_type = self._text(cut(event.error_type or "Exception"))
            message = self._text(cut(self.redactor.redact_message(event.error_message or "")))
            exception = (
                _EVENT_TIME
                + _FIXED64.pack(event.end_ns)
                + _field(tags.EVENT_NAME, b"exception")
                + _field(tags.EVENT_ATTRIBUTES, _key_value("exception.type", error_type))
                + _field(tags.EVENT_ATTRIBUTES, _key_value("exception.message", message))
            )
            parts.append(_field(tags.SPAN_EVENTS, exception))
            description = f"{error_type}: {message}" if message else error_type
            status = _field(tags.STATUS_MESSAGE, description.encode()) + _STATUS_CODE + _varint(_STATUS_ERROR)
            parts.append(_field(tags.SPAN_STATUS, status))
        parts.append(flags)
        span = b"".join(parts)
        size = len(span)
        return _SPAN_TAG + (_SMALL_VARINTS[size] if size < 16384 else _varint(size)) + span

    def _trace_state(self, event: Any) -> bytes:
        """``event``'s Span.trace_state field (``b""`` for a tracestate not valid), kept in ``_states``."""
        state = span_tracestate(event)
        encoded = b"" if state is None else _TRACE_STATE + _varint(len(state)) + state.encode("ascii")
        if event.tracestate.__class__ is str:  # a key of the cache (a hand-built event may hold anything)
            if len(self._states) >= _PAIRS_PER_KEY:
                self._states.clear()
            self._states[event.tracestate] = encoded
        return encoded

    def _text(self, text: str) -> str:
        """``text`` itself, or with U+FFFD for what UTF-8 cannot hold (counted)."""
        if text.isascii():
            return text
        replaced = replace_surrogates(text)
        if replaced != text:
            self.invalid_values += 1
        return replaced

    # -- JSON --------------------------------------------------------------------------------

    def json(self, events: Iterable[Any]) -> tuple[bytes, int]:
        """``(request body, spans in it)`` in OTLP/JSON; events without a span are skipped."""
        spans = [span for span in (self._json_span(event) for event in events) if span is not None]
        request = {
            "resourceSpans": [
                {
                    "resource": self._json_resource,
                    "scopeSpans": [{"scope": self._json_scope, "spans": spans}],
                }
            ]
        }
        try:
            return msgspec.json.encode(request), len(spans)
        except UnicodeEncodeError:
            # A lone surrogate somewhere (msgspec finds it only when encoding): found and
            # dropped span by span, so this one value costs nothing else.
            self.invalid_values += sum(map(scrub_json_span, spans))
            return msgspec.json.encode(request), len(spans)

    def _json_attributes(self, attributes: Mapping[str, object]) -> list[dict[str, Any]]:
        pairs = _json_attributes(attributes)
        self.invalid_values += len(attributes) - len(pairs)
        return pairs

    def _json_span(self, event: Any) -> dict[str, Any] | None:
        made = limited_span(event, self.redactor, self.limits)
        if made is None:
            return None
        name, attributes, dropped = made
        flags = _SAMPLED | _HAS_IS_REMOTE
        span: dict[str, Any] = {
            "traceId": f"{event.trace_id:032x}",
            "spanId": f"{event.span_id:016x}",
        }
        state = span_tracestate(event)
        if state is not None:
            span["traceState"] = state
        parent = event.parent_span_id
        if parent is not None:
            span["parentSpanId"] = f"{parent:016x}"
            if event.parent_remote:
                flags |= _IS_REMOTE
        span["name"] = name
        span["kind"] = _KIND[span_kind_of(event)]
        span["startTimeUnixNano"] = str(event.start_ns)
        span["endTimeUnixNano"] = str(event.end_ns)
        span["attributes"] = self._json_attributes(attributes)
        if dropped:
            span["droppedAttributesCount"] = dropped
        if event.outcome == _ERROR:
            cut = self.limits.cut
            error_type = self._text(cut(event.error_type or "Exception"))
            message = self._text(cut(self.redactor.redact_message(event.error_message or "")))
            span["events"] = [
                {
                    "timeUnixNano": str(event.end_ns),
                    "name": "exception",
                    "attributes": _json_attributes(
                        {"exception.type": error_type, "exception.message": message}
                    ),
                }
            ]
            span["status"] = {
                "code": _STATUS_ERROR,
                "message": f"{error_type}: {message}" if message else error_type,
            }
        span["flags"] = flags
        return span


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.sinks.otlp", SpanEncoder)
