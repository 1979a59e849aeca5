"""``LoggingSink``: checkpoint events as stdlib ``logging`` records, with W3C hex ids.

Each event becomes one record whose message names the event, and whose ``extra`` carries
``trace_id`` (32 lowercase hex digits) and ``span_id`` (16) where the event has them, as
OpenTelemetry's logging integration spells them, plus ``ckpt_event`` (the event itself), so
structlog, Logfire or an OTel logging handler take them as they are. Where the records already
have a ``trace_id`` or ``span_id`` (a ``LogRecord`` factory of the app's that sets them: logging
refuses to overwrite one, and every batch failed), ours go as ``ckpt_trace_id`` and
``ckpt_span_id`` instead, said once in a warning.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from ckpt_events import BaseSink, InvalidTypeError, Redactor
from ckpt_events._errors import check_int, shown
from ckpt_events._public_home import publish
from ckpt_events.sinks._redacted import redacted

__all__ = ["LoggingSink"]

DEFAULT_LOGGER: Final = "ckpt_events.events"
_ID_KEYS: Final = ("trace_id", "span_id")


class LoggingSink(BaseSink):
    """A bus sink that logs every event to ``logger`` (default ``ckpt_events.events``) at ``level``.

    Wants nothing when the logger would drop ``level`` at subscribe time, so emit sites stay off.
    ``redactor`` (default: ``ckpt_events.Redactor()``) applies to the user-supplied attributes of
    the ``ckpt_event`` a record carries, as the span sinks apply it.
    """

    def __init__(
        self,
        logger: logging.Logger | None = None,
        level: int = logging.INFO,
        *,
        redactor: Redactor | None = None,
    ) -> None:
        if redactor is not None and not isinstance(redactor, Redactor):
            raise InvalidTypeError(f"redactor must be a ckpt_events.Redactor or None, not {shown(redactor)}")
        self.redactor = redactor if redactor is not None else Redactor()
        if logger is not None and not isinstance(logger, logging.Logger):
            raise InvalidTypeError(f"logger must be a logging.Logger or None, not {shown(logger)}")
        check_int(level, f"level must be a logging level int, not {shown(level)}", minimum=0)
        self.logger = logger if logger is not None else logging.getLogger(DEFAULT_LOGGER)
        self.level = level
        #: The names the ids go under: ``trace_id``/``span_id``, or ``ckpt_``-prefixed once a
        #: record turned out to hold those names already.
        self._keys = _ID_KEYS

    @property
    def interests(self) -> tuple[type[Any], ...] | None:  # type: ignore[override]  # BaseSink has a plain attribute
        """Every event, or none while the logger would drop ``level``: read when subscribed, so
        logging configured after the sink was built (and before it is subscribed) counts."""
        return None if self.logger.isEnabledFor(self.level) else ()

    def handle(self, batch: list[Any]) -> None:
        """Log each event as one record."""
        log = self.logger.log
        level = self.level
        for event in redacted(batch, self.redactor):
            extra: dict[str, Any] = {"ckpt_event": event}
            trace_id = getattr(event, "trace_id", None)
            if trace_id is not None:
                trace_key, span_key = self._keys
                extra[trace_key] = f"{trace_id:032x}"
                extra[span_key] = f"{event.span_id:016x}"
            try:
                log(level, "%s %s/%s", type(event).__name__, event.kind, event.instance, extra=extra)
            except KeyError:  # "Attempt to overwrite 'trace_id' in LogRecord"
                if trace_id is None or self._keys != _ID_KEYS:
                    raise
                self._keys = ("ckpt_trace_id", "ckpt_span_id")
                logging.getLogger("ckpt_events").warning(
                    "LoggingSink: the log records already have a trace_id or span_id (a LogRecord "
                    "factory of the app's, say); the events' ids go as ckpt_trace_id and ckpt_span_id"
                )
                extra["ckpt_trace_id"] = extra.pop("trace_id")
                extra["ckpt_span_id"] = extra.pop("span_id")
                log(level, "%s %s/%s", type(event).__name__, event.kind, event.instance, extra=extra)


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.sinks", LoggingSink)
