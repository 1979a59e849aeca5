"""``participants.server.workers.share``: the operation a frame belongs to, noted for its task."""

from __future__ import annotations

import anyio
import pytest

from ckpt_events import Bus, Telemetry, format_traceparent
from ckpt_events.participants.fastapi import Incoming
from ckpt_events.participants.server.workers.share import current_share, noted
from ckpt_events.testing import capture_events

pytestmark = pytest.mark.anyio

CALLER = format_traceparent(0xABC, 0xDEF)


async def test_inside_noted_the_share_carries_the_operation_s_traceparent_and_id() -> None:
    """With a sink the share's traceparent is the operation span's own, a child of the caller's."""
    async with capture_events() as (bus, _events):
        tel = Telemetry(bus, kind="environment", instance="environment-0")
        trace = Incoming.from_headers(CALLER)
        assert current_share() is None
        with noted(trace.operation(tel, "commit", checkpoint_id="c1"), "c1", trace) as span:
            share = current_share()
            assert share is not None and share.span is span
            assert (share.checkpoint_id, share.incoming) == ("c1", CALLER)
            assert share.traceparent() == format_traceparent(0xABC, span.span_id)
        assert current_share() is None


async def test_without_a_sink_the_share_forwards_the_caller_s_traceparent() -> None:
    """With no sink the operation records nothing and hands on the caller's traceparent, and
    the share forwards it; without a caller's, there is none to forward."""
    async with Bus() as bus:
        tel = Telemetry(bus, kind="environment", instance="environment-0")
        trace = Incoming.from_headers(CALLER)
        with noted(trace.operation(tel, "commit", checkpoint_id="c1"), "c1", trace):
            share = current_share()
            assert share is not None and share.span.traceparent() == CALLER
            assert share.traceparent() == CALLER
        untraced = Incoming.from_headers(None)
        with noted(untraced.operation(tel, "retire"), None, untraced):
            share = current_share()
            assert share is not None and (share.incoming, share.traceparent()) == (None, None)


async def test_a_share_is_reset_when_its_block_raises_and_never_leaks_across_tasks() -> None:
    """The note is the noting task's alone and is undone on error."""
    seen: list[object] = []
    async with capture_events() as (bus, _events):
        tel = Telemetry(bus, kind="environment", instance="environment-0")
        trace = Incoming.from_headers(None)
        with pytest.raises(RuntimeError, match="boom"):
            with noted(trace.operation(tel, "commit"), "c1", trace):
                raise RuntimeError("boom")
        assert current_share() is None

        async def other() -> None:
            await anyio.sleep(0.01)
            seen.append(current_share())

        async with anyio.create_task_group() as tg:
            tg.start_soon(other)  # started before the note: its context is a copy without it
            with noted(trace.operation(tel, "commit"), "c2", trace):
                await anyio.sleep(0.05)
    assert seen == [None]
