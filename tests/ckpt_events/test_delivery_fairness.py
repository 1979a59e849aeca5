"""A synchronous sink that emits from ``handle`` cannot keep the event loop to itself: its
delivery yields to the loop at least once a batch while its buffer refills."""

from __future__ import annotations

from typing import Any

import anyio

from ckpt_events import Bus, Refused, Telemetry

STORM = 100_000


class _ReEmit:
    """Emits one event for every event it is handed, until ``budget`` are spent."""

    interests = (Refused,)

    def __init__(self, tel: Telemetry) -> None:
        self.tel = tel
        self.budget = STORM
        self.seen = 0

    def handle(self, batch: list[Any]) -> None:
        self.seen += len(batch)
        for _ in batch:
            if self.budget <= 0:
                return
            self.budget -= 1
            self.tel.refused("stale_checkpoint", checkpoint_id="c1")


async def test_a_re_emitting_sink_lets_other_tasks_run() -> None:
    """100,000 events re-emitted 1:1 in batches of 1,024: a ticker task gets the loop between
    batches (before: not once until the storm was over; with no budget, never again).

    No batch interval: the loop-turn path is what is tested (paced, each batch waits 10 ms)."""
    ticks_during_storm = 0
    async with Bus(batch_size=1024, batch_interval=0) as bus:
        tel = Telemetry(bus, kind="agent", instance="agent-0")
        sink = _ReEmit(tel)
        bus.subscribe(sink)

        async def ticker() -> None:
            nonlocal ticks_during_storm
            for _ in range(1_000_000):  # bounded: ends with the storm
                await anyio.lowlevel.checkpoint()
                if sink.budget <= 0:
                    return
                if sink.seen:
                    ticks_during_storm += 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            tel.refused("stale_checkpoint", checkpoint_id="c1")
        await bus.flush()
    assert sink.seen == STORM + 1
    assert ticks_during_storm >= STORM // 1024 // 2, ticks_during_storm


class _Counting:
    interests = (Refused,)

    def __init__(self) -> None:
        self.count = 0

    def handle(self, batch: list[Any]) -> None:
        self.count += len(batch)


async def test_a_cheap_sink_drains_a_flood_as_fast_as_it_comes() -> None:
    """An emitter of 8,192 events a loop turn and a sink that takes 4,096 a batch, cheaply: the
    sink takes the whole backlog each turn, so its buffer (65,536) never fills. Yielding to the
    loop after every batch of a backlog let the emitter outrun it: 137,856 of 400,000 dropped."""
    sink = _Counting()
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="resources", instance="r0")
        for _ in range(50):
            for _ in range(8_192):
                tel.refused("stale_checkpoint", checkpoint_id="c1")
            await anyio.sleep(0)
        await bus.flush()
        (stats,) = bus.stats().sinks
    assert (sink.count, stats.dropped) == (50 * 8_192, 0)
