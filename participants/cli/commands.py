"""The subcommands of ``ckpt-events``, in the order ``--help`` lists them.

To add a subcommand, write a module with a ``Command`` and append it to ``COMMANDS``. Importing
this module imports every command's module: ``main`` does it inside its guard, so a Ctrl-C that
lands in these imports is its one line, not a traceback.
"""

from __future__ import annotations

from ckpt_events.participants.cli.bench import BENCH
from ckpt_events.participants.cli.command import Command
from ckpt_events.participants.cli.demo.command import DEMO
from ckpt_events.participants.cli.ops import OPS
from ckpt_events.participants.cli.replay import REPLAY
from ckpt_events.participants.cli.report.command import REPORT
from ckpt_events.participants.cli.report.diff import DIFF
from ckpt_events.participants.cli.serve import SERVE
from ckpt_events.participants.cli.watch.command import WATCH

__all__ = ["COMMANDS"]

COMMANDS: list[Command] = [
    SERVE,
    DEMO,
    REPORT,
    REPLAY,
    DIFF,
    BENCH,
    OPS,
    WATCH,
]
