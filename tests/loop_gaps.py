"""How long the event loop went without running a 1 ms ticker: the gaps a call on the loop
left, for tests that check a slow start (an export process's) waits off the loop."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

import anyio


@contextlib.asynccontextmanager
async def ticking(warm: float = 0.02) -> AsyncIterator[list[float]]:
    """A 1 ms ticker beside the body: yields the list of its gaps (seconds), counted from
    ``warm`` seconds after it started, and stops it when the body ends."""
    gaps: list[float] = []
    stop = anyio.Event()

    async def ticker() -> None:
        last = time.monotonic()
        while not stop.is_set():
            await anyio.sleep(0.001)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await anyio.sleep(warm)
        gaps.clear()
        try:
            yield gaps
        finally:
            stop.set()
