"""What a ``ckpt-events`` subcommand is, apart from the command line that lists them."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Command", "CommandError"]


class CommandError(Exception):
    """A usage or setup problem, reported as one line on stderr with exit status 2."""


@dataclass(frozen=True)
class Command:
    """One subcommand: ``add_arguments(parser)`` declares it, ``run(args)`` returns the exit status."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
