"""``demo --watch``: the ``watch`` view of the demo's own fleet in place of its progress bars.

Each generation is watched as ``ckpt-events watch`` would watch it: its participants'
``GET /status`` once a second, plus open work from two places, the demo's own bus (what the
controller and in-process servers emit, subscribed as a sink) and the JSON-lines logs its
``--processes`` servers and worker processes write. On a terminal the view redraws in place;
piped, it prints one plain snapshot per interval. With ``--fault`` (and no
``$CKPT_EVENTS_STALL_AFTER``) work open past ``FAULT_STALL_AFTER_S`` is stalled: the view marks
it and a ``StallWatch`` on the demo's bus warns and counts it, within the faults' short deadline.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

import anyio
from rich.console import Console

from ckpt_events import Event
from ckpt_events.participants.cli.watch.command import show
from ckpt_events.participants.cli.watch.follow import LogFollower
from ckpt_events.participants.cli.watch.sources import VIEW_EVENTS, status_client
from ckpt_events.participants.cli.watch.view import FleetView
from ckpt_events.sinks.stall_watch import ENV_STALL_AFTER

if TYPE_CHECKING:
    from ckpt_events.participants.controller.collection import Collection, CollectionSummary

__all__ = ["FAULT_STALL_AFTER_S", "DemoWatch", "stall_environ", "view_stall_after"]

#: With ``--fault``: open work is stalled after this long. The faults' prepare deadline is 2 s and
#: StallWatch looks once a second, so a stall of the deadline is warned about at 0.5-1.5 s.
FAULT_STALL_AFTER_S: Final = 0.5
#: Without a fault or ``$CKPT_EVENTS_STALL_AFTER``: as ``watch``'s own default.
_STALL_AFTER_S: Final = 30.0
#: Events kept for the view between refreshes; a checkpoint has a few dozen operations.
_PENDING: Final = 65_536
#: The per-poll deadline, as ``watch --timeout``'s default.
_POLL_TIMEOUT_S: Final = 0.8


def stall_environ(fault: str | None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``$CKPT_EVENTS_STALL_AFTER`` as ``demo --watch`` runs with it, for ``configure()`` and the
    servers: the user's own, else ``FAULT_STALL_AFTER_S`` with a fault, else nothing."""
    env = os.environ if environ is None else environ
    if raw := env.get(ENV_STALL_AFTER, "").strip():
        return {ENV_STALL_AFTER: raw}  # configure() checks it, and refuses a bad one in one line
    return {ENV_STALL_AFTER: f"{FAULT_STALL_AFTER_S:g}"} if fault is not None else {}


def view_stall_after(stall_env: Mapping[str, str]) -> float:
    """The view's threshold for ``stall_environ``'s answer (once ``configure()`` accepted it)."""
    return float(stall_env.get(ENV_STALL_AFTER, _STALL_AFTER_S))


class DemoWatch:
    """A bus sink keeping what the view shows of the demo's own events, and the source the view
    reads them from, with the logs in ``logs`` (the processes' and workers' JSON lines)."""

    interests: Final = VIEW_EVENTS

    def __init__(self, logs: Path, *, stall_after: float, token: str) -> None:
        self.stall_after = stall_after
        self.token = token
        self._pending: collections.deque[Event] = collections.deque(maxlen=_PENDING)
        self._logs = LogFollower([str(logs)])

    def handle(self, batch: list[Event]) -> None:
        self._pending.extend(batch)

    async def aclose(self) -> None:
        """Close the followed logs' files (the bus awaits it once, after the last batch)."""
        self._logs.close()

    @property
    def notes(self) -> Mapping[str, str]:
        return self._logs.notes

    def read(self) -> list[Event]:
        events = list(self._pending)
        self._pending.clear()
        return events + self._logs.read()

    async def run(
        self, collection: Collection, urls: Mapping[str, str], console: Console, label: str, total: int
    ) -> CollectionSummary:
        """Run ``collection`` with the view of ``urls`` on ``console`` until it ends; its summary."""
        view = FleetView(list(urls.values()), stall_after=self.stall_after)
        summaries: list[CollectionSummary] = []
        done = anyio.Event()
        started = time.monotonic()

        async def run() -> None:
            try:
                summaries.append(await collection.run())
            finally:
                done.set()

        def title() -> str:
            finished = collection.progress()["done"]
            return f"{label}: {finished}/{total} rollouts, {time.monotonic() - started:.1f} s"

        headers = {"authorization": f"Bearer {self.token}"}
        async with (
            status_client(view.urls, headers=headers, timeout=_POLL_TIMEOUT_S) as client,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(run)
            await show(view, client, self, console, timeout=_POLL_TIMEOUT_S, until=done, title=title)
        return summaries[0]
