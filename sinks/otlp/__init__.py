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

from ckpt_events.sinks.otlp._reader import looks_like_otlp, read_otlp
from ckpt_events.sinks.otlp._span_encoder import SpanEncoder

__all__ = ["SpanEncoder", "looks_like_otlp", "read_otlp"]
