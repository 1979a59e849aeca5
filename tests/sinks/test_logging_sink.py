"""LoggingSink: events as stdlib logging records carrying hex trace and span ids."""

from __future__ import annotations

import logging

import pytest

from ckpt_events import Bus, Telemetry
from ckpt_events.sinks import LoggingSink
from ckpt_events.vocab import REDACTED


async def test_records_carry_hex_ids(caplog: pytest.LogCaptureFixture) -> None:
    """Each event is a record; span events carry trace_id (32 hex) and span_id (16 hex)."""
    caplog.set_level(logging.INFO, logger="ckpt_events.events")
    async with Bus() as bus:
        bus.subscribe(LoggingSink())
        tel = Telemetry(bus, kind="agent", instance="a0")
        with tel.operation("resume") as op:
            pass
        tel.refused("unauthorized")
    records = [r for r in caplog.records if r.name == "ckpt_events.events"]
    names = [r.getMessage().split()[0] for r in records]
    assert names == ["OperationStarted", "OperationFinished", "Refused"]
    finished = records[1]
    assert finished.trace_id == f"{op.trace_id:032x}"  # type: ignore[attr-defined]
    assert finished.span_id == f"{op.span_id:016x}"  # type: ignore[attr-defined]
    assert not hasattr(records[2], "trace_id")


async def test_a_silenced_logger_keeps_sites_off() -> None:
    """A logger that would drop the level wants no events, so Telemetry stays disabled."""
    logger = logging.getLogger("test.silenced")
    logger.setLevel(logging.ERROR)
    async with Bus() as bus:
        bus.subscribe(LoggingSink(logger))
        assert not Telemetry(bus, kind="agent", instance="a0").enabled


async def test_the_level_is_read_when_subscribed(caplog: pytest.LogCaptureFixture) -> None:
    """Logging set up after the sink is built and before it is subscribed counts, as documented."""
    logger = logging.getLogger("test.configured_later")
    logger.setLevel(logging.ERROR)
    sink = LoggingSink(logger)
    logger.setLevel(logging.INFO)
    caplog.set_level(logging.INFO, logger="test.configured_later")
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="agent", instance="a0")
        assert tel.enabled
        tel.refused("unauthorized")
    assert [r.getMessage() for r in caplog.records if r.name == "test.configured_later"] == [
        "Refused agent/a0"
    ]


async def test_records_that_already_have_a_trace_id_get_ours_under_other_names(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An app whose LogRecord factory sets ``trace_id``/``span_id`` (its own tracer's) made
    logging refuse every record of ours ("Attempt to overwrite 'trace_id'"): each batch failed
    and was counted, nothing logged. Ours go as ``ckpt_trace_id``/``ckpt_span_id``, said once."""
    made = logging.getLogRecordFactory()

    def with_ids(*args: object, **kwargs: object) -> logging.LogRecord:
        record = made(*args, **kwargs)
        record.trace_id = "app-trace"
        record.span_id = "app-span"
        return record

    caplog.set_level(logging.INFO, logger="ckpt_events.events")
    logging.setLogRecordFactory(with_ids)
    try:
        async with Bus() as bus:
            bus.subscribe(LoggingSink())
            tel = Telemetry(bus, kind="agent", instance="a0")
            for _ in range(2):
                with tel.operation("resume") as op:
                    pass
            tel.refused("unauthorized")
            await bus.flush()
            assert [s.failed for s in bus.stats().sinks] == [0]
    finally:
        logging.setLogRecordFactory(made)
    records = [r for r in caplog.records if r.name == "ckpt_events.events"]
    assert [r.getMessage().split()[0] for r in records] == [
        "OperationStarted",
        "OperationFinished",
        "OperationStarted",
        "OperationFinished",
        "Refused",
    ]
    last = records[3]
    assert last.trace_id == "app-trace"  # type: ignore[attr-defined]
    assert last.ckpt_trace_id == f"{op.trace_id:032x}"  # type: ignore[attr-defined]
    assert last.ckpt_span_id == f"{op.span_id:016x}"  # type: ignore[attr-defined]
    said = [r for r in caplog.records if "ckpt_trace_id" in r.getMessage()]
    assert len(said) == 1


async def test_the_event_a_record_carries_is_redacted(caplog: pytest.LogCaptureFixture) -> None:
    """The ``ckpt_event`` a record carries (what a JSON formatter dumps) has the user attributes the
    rule matches redacted, as the span sinks export them; it carried the secret in clear."""
    caplog.set_level(logging.INFO, logger="ckpt_events.events")
    async with Bus() as bus:
        bus.subscribe(LoggingSink())
        tel = Telemetry(bus, kind="agent", instance="a0")
        with tel.operation("resume") as op:
            op.set_attribute("user.password", "hunter2")
            op.set_attribute("user.rows", "12")
    [finished] = [r for r in caplog.records if r.getMessage().startswith("OperationFinished")]
    assert finished.ckpt_event.attributes == {"user.password": REDACTED, "user.rows": "12"}  # type: ignore[attr-defined]
    assert finished.ckpt_event.span_id == op.span_id  # type: ignore[attr-defined]
