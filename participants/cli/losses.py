"""What the sinks of ``serve`` (and of each of its workers) lost while it ran, said once it stops."""

from __future__ import annotations

import contextlib
from typing import Any

from ckpt_events.participants.cli.text import escape, say

__all__ = ["SinkLosses"]


class SinkLosses:
    """What the sinks of a process's buses lost, said in one line per sink once it has stopped
    (``who``: ``"worker 1: "`` in a ``serve --workers`` worker).

    A sink's failures (a log on a full disk) are logged once, its drops not at all: counted in
    ``bus.stats()``, which dies with the process. A server stopped after its log's disk filled
    said nothing of the 170 events it had lost since the first failure."""

    def __init__(self, who: str = "") -> None:
        self.who = who
        self.buses: list[Any] = []  # the bus of each lifespan run
        self._said = False

    def say(self) -> None:
        """Print the lines on stderr, once (before uvicorn raises the signal it stopped on again)."""
        if not self._said:
            self._said = True
            for line in self.lines():
                # stderr's reader gone (``2>&1 | head``): nowhere to say it, and the stop goes on.
                with contextlib.suppress(OSError):
                    say(line)  # one write: a server and its workers share stderr

    def lines(self) -> list[str]:
        """One line per sink that lost events: how many of how many, and why."""
        said = []
        for bus in self.buses:
            for stats in bus.stats().sinks:
                lost = stats.failed + stats.dropped + stats.abandoned + stats.pending
                if not lost:
                    continue
                how = ", ".join(
                    f"{count} {what}"
                    for count, what in (
                        (stats.failed, "in batches it failed"),
                        (stats.dropped, "dropped, its buffer full"),
                        (stats.abandoned + stats.pending, "abandoned at the close deadline"),
                    )
                    if count
                )
                why = f"first error {escape(stats.error)}; " if stats.error else ""
                name = escape(repr(stats.name))
                said.append(
                    f"ckpt-events serve: {self.who}sink {name} lost {lost} of {stats.emitted} "
                    f"events: {why}{how}"
                )
        return said
