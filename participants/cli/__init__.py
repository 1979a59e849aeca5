"""``ckpt-events``, the command line: one module per subcommand, and the fleet launcher.

``main`` parses and dispatches; ``serve``, ``demo``, ``report``, ``replay`` and ``bench`` are
the subcommands; ``fleet`` starts participants in this process or as ``serve`` processes;
``timeline`` renders a checkpoint's breakdown and waterfall. The command line may use every
other part of the package; nothing imports it.
"""

from ckpt_events.participants.cli.main import COMMANDS, main

__all__ = ["COMMANDS", "main"]
