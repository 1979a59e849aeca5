"""What ``ckpt-events demo`` is asked to run: its options, its checkpoints and its injected fault.

``--checkpoints N`` spreads N checkpoints over generation 1 (the last one stops it and is
restored); ``--fault`` sets ``CKPT_EVENTS_FAULT`` (``ckpt_events.participants.faults``) for the generation
it hits, with a short deadline and lease so the failure shows in seconds.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ckpt_events.participants.faults import FAULT_ENV

__all__ = [
    "ABORTING_FAULTS",
    "FAULTS",
    "DemoOptions",
    "async_fault_environ",
    "check_options",
    "checkpoint_thresholds",
    "fault_environ",
    "stop_after",
]


@dataclass
class DemoOptions:
    """What ``ckpt-events demo`` runs; the defaults finish in well under a minute on 2 cores."""

    rollouts: int = 1000
    steps: int = 2
    concurrency: int = 16
    checkpoint_at: float = 0.4
    processes: bool = False
    #: Worker processes per participant in generation 1 and (if set) in the restored generation 2.
    workers: int = 1
    restore_workers: int | None = None
    workdir: Path | None = None
    jsonl: Path | None = None
    report: Path | None = None
    otlp_endpoint: str | None = None
    #: Checkpoints generation 1 takes, spread over its rollouts, the last one stopping it
    #: (``None``: 1, or 2 with a fault that aborts one).
    checkpoints: int | None = None
    #: One of ``FAULT_MODES``: injected for real through ``CKPT_EVENTS_FAULT`` (see ``faults``).
    fault: str | None = None
    #: Show the ``watch`` view of the fleet during each generation instead of progress bars.
    watch: bool = False

    def checkpoint_count(self) -> int:
        return self.checkpoints or (2 if self.fault in ABORTING_FAULTS else 1)


#: What each ``--fault`` injects (``CKPT_EVENTS_FAULT``), on which participant.
FAULTS: Final = {
    "stall": "stall:environment-0",
    "lease": "lease:3",
    "slow-restore": "slow-restore:model-0:0.05",
}
#: Faults that abort the checkpoint they hit (the first one).
ABORTING_FAULTS: Final = ("stall", "lease")
#: With a fault: the prepare deadline and the participants' lease grace, short so the failure
#: shows in seconds (the lease expires 2.5 s after prepare; the ``lease`` fault stalls 3 s).
FAULT_DEADLINE_S: Final = 2.0
FAULT_LEASE_GRACE_S: Final = 0.5
#: Work calls wait this long whatever the deadline (a stalled step is held through a prepare).
WORK_TIMEOUT_S: Final = 30.0


def check_options(opts: DemoOptions) -> str | None:
    """Why ``opts`` cannot run, in one line, or ``None``."""
    if opts.fault is not None and opts.fault not in FAULTS:
        return f"--fault {opts.fault!r} is not one of {', '.join(FAULTS)}"
    count = opts.checkpoint_count()
    if opts.fault in ABORTING_FAULTS and count < 2:
        return (
            f"--fault {opts.fault} aborts the first checkpoint: use --checkpoints 2 or more "
            "so a later one publishes and is restored"
        )
    if count > 1 and stop_after(opts) < count:
        return (
            f"--checkpoints {count} needs at least {count} rollouts done before the last checkpoint "
            f"({stop_after(opts)} are): raise --rollouts or --checkpoint-at"
        )
    return None


def checkpoint_thresholds(opts: DemoOptions) -> list[int]:
    """After how many finished rollouts generation 1 checkpoints, before its last (stopping) one."""
    count, last = opts.checkpoint_count(), stop_after(opts)
    return [last * i // count for i in range(1, count)]


def stop_after(opts: DemoOptions) -> int:
    """How many rollouts generation 1 finishes before its checkpoint: at least one stays in flight."""
    return min(int(opts.checkpoint_at * opts.rollouts), opts.rollouts - 1)


@contextlib.contextmanager
def fault_environ(value: str | None) -> Iterator[None]:
    """``$CKPT_EVENTS_FAULT`` set to ``value`` (``None``: unset) for a block (the servers started
    in it and their processes read it), then as it was."""
    before = os.environ.get(FAULT_ENV)
    if value is None:
        os.environ.pop(FAULT_ENV, None)
    else:
        os.environ[FAULT_ENV] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(FAULT_ENV, None)
        else:
            os.environ[FAULT_ENV] = before


@contextlib.asynccontextmanager
async def async_fault_environ(value: str | None) -> AsyncIterator[None]:
    with fault_environ(value):
        yield
