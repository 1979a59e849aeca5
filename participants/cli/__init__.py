"""``ckpt-events``, the command line, in rooms.

``main`` parses and dispatches (``commands.COMMANDS``); ``command`` is what a subcommand is. Three rooms
hold the big commands: ``report`` (reading every process's logs, the model of a checkpoint, the
run overview, trends, ``diff`` and the renderers: terminal, HTML, Perfetto, PNG), ``demo`` and
``watch``. The small commands are one module each: ``serve`` (with ``worker_process``, a worker
it starts), ``replay``, ``ops``, ``bench`` and ``bench_app``; ``fleet`` starts participants in
this process or as ``serve`` processes, for the demo and the tests. The command line may use every
other part of the package; nothing imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ckpt_events.participants.cli.main import main

if TYPE_CHECKING:
    from ckpt_events.participants.cli.commands import COMMANDS

__all__ = ["COMMANDS", "main"]


def __getattr__(name: str) -> Any:
    # The ``ckpt-events`` script imports this package first: the commands' modules wait for
    # ``main``, which catches a Ctrl-C in them.
    if name == "COMMANDS":
        from ckpt_events.participants.cli.commands import COMMANDS

        return COMMANDS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
