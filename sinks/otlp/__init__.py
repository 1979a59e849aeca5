"""Our own OTLP/HTTP export: span and metric sinks, their protobuf encoders, the wire helpers
and the HTTP sender. The public sinks are re-exported by ``ckpt_events.sinks.otel``."""
