"""What starts a collection's checkpoints (``participants.controller.triggers``): a timer, SIGUSR1
and SIGTERM."""

from __future__ import annotations

import os
import signal

import anyio

from ckpt_events.participants.controller.triggers import every, on_signals


class _Calls:
    """A ``Checkpointer`` that records why it was called and whether to stop."""

    def __init__(self, wanted: int) -> None:
        self.calls: list[tuple[str, bool]] = []
        self.wanted = wanted
        self.enough = anyio.Event()

    async def __call__(self, why: str, *, stop: bool = False) -> None:
        self.calls.append((why, stop))
        if len(self.calls) >= self.wanted:
            self.enough.set()


async def test_the_timer_checkpoints_every_interval() -> None:
    """every() calls the checkpointer once per interval, saying it was the timer."""
    calls = _Calls(wanted=3)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(every, 0.01, calls)
            await calls.enough.wait()
            tg.cancel_scope.cancel()
    assert calls.calls[:3] == [("on the timer", False)] * 3


async def test_sigusr1_checkpoints_and_sigterm_also_stops() -> None:
    """A real SIGUSR1 to this process checkpoints; SIGTERM checkpoints with stop=True."""
    calls = _Calls(wanted=2)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            signals = (signal.SIGUSR1, signal.SIGTERM)
            before = [signal.getsignal(s) for s in signals]
            tg.start_soon(on_signals, calls)
            # Signal only once the receiver is installed: the default action ends the process.
            while any(signal.getsignal(s) == b for s, b in zip(signals, before, strict=True)):
                await anyio.sleep(0.001)
            os.kill(os.getpid(), signal.SIGUSR1)
            while not calls.calls:
                await anyio.sleep(0.001)
            os.kill(os.getpid(), signal.SIGTERM)
            await calls.enough.wait()
            tg.cancel_scope.cancel()
    assert calls.calls == [
        (f"on signal {signal.SIGUSR1}", False),
        (f"on signal {signal.SIGTERM}", True),
    ]
