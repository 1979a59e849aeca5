"""Replay a JSON-lines log into sinks or a bus.

This module is also callable as ``replay`` itself: importing it (``from ckpt_events.sinks.replay
import is_rotated``, as ``ckpt-events report`` does) rebinds the package's ``replay``, the
function the docs call as ``ckpt_events.sinks.replay(log, *sinks)``, to this module, and such a
call then failed with "'module' object is not callable", depending on what was imported first.
"""

import sys
import types
from typing import Any

from ckpt_events.sinks.jsonl._replay import ReplayFailure, ReplayResult, is_rotated, replay

__all__ = ["ReplayFailure", "ReplayResult", "is_rotated", "replay"]


class _CallableModule(types.ModuleType):
    """A module that, called, calls its ``replay``: ``ckpt_events.sinks.replay(...)`` works whether
    the package's name holds the function or, once this module is imported, the module."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return replay(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
