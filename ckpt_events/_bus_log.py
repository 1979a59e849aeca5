"""The bus's one logger: its own records, its subscriptions' and their sinks' watch.

One ``LibraryLogger`` for them all: a handler of the user's that raises is said on stderr once
(``LibraryLogger`` tells it once per logger), not once per module that logs for the bus.
"""

from __future__ import annotations

from typing import Final

from ckpt_events._logs import library_logger

__all__ = ["logger"]

logger: Final = library_logger("ckpt_events")
