"""What starts a collection's checkpoints besides its own plan: SIGUSR1 and SIGTERM, and a timer."""

from __future__ import annotations

import signal
from collections.abc import Awaitable
from typing import Protocol

import anyio

__all__ = ["Checkpointer", "every", "on_signals"]


class Checkpointer(Protocol):
    """Checkpoint (logging a failure, and with ``stop`` stopping the collection either way)."""

    def __call__(self, why: str, *, stop: bool = False) -> Awaitable[None]: ...


async def on_signals(checkpoint: Checkpointer) -> None:
    """SIGUSR1 checkpoints; SIGTERM checkpoints and stops."""
    with anyio.open_signal_receiver(signal.SIGUSR1, signal.SIGTERM) as received:
        async for signum in received:
            await checkpoint(f"on signal {signum}", stop=signum == signal.SIGTERM)


async def every(seconds: float, checkpoint: Checkpointer) -> None:
    """Checkpoint every ``seconds``, for as long as the caller's task group runs."""
    while True:
        await anyio.sleep(seconds)
        await checkpoint("on the timer")
