"""Our own OTLP/HTTP export: span and metric sinks, their protobuf encoders, the wire helpers
and the HTTP sender. The public sinks are re-exported by ``ckpt_events.sinks.otel``.

Public here, for code that ships or reads spans itself (the report and the benchmarks use them):

* ``SpanEncoder``: OTLP trace request bodies (protobuf or JSON) written straight from finished
  events, exactly as ``OtlpSpanSink`` sends them.
* ``read_otlp(path, skip)``: a collector's OTLP JSON file (the ``file`` exporter's output) read
  back as the finished events its spans were exported from; ``looks_like_otlp(first_line)``
  tells such a file from a JSON-lines log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ckpt_events._lazy import lazy_attributes

if TYPE_CHECKING:
    from ckpt_events.sinks.otlp._reader import looks_like_otlp, read_otlp
    from ckpt_events.sinks.otlp._span_encoder import SpanEncoder

__all__ = ["SpanEncoder", "looks_like_otlp", "read_otlp"]

# On first use: `configure()` validates an OTLP endpoint with `otlp._endpoint`, and importing
# this package for it loaded the encoders and the reader too (16 ms, with nothing exported).
_HOMES: Final = {
    "SpanEncoder": "ckpt_events.sinks.otlp._span_encoder",
    "looks_like_otlp": "ckpt_events.sinks.otlp._reader",
    "read_otlp": "ckpt_events.sinks.otlp._reader",
}

# Hidden from type checkers, which read the imports above: a module __getattr__ made every
# misspelt name (`from ckpt_events import Bsu`) an Any that mypy --strict let through.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_attributes(__name__, _HOMES, globals())
del TYPE_CHECKING, lazy_attributes
