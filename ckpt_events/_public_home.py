"""``publish``: a public class or function named by the public module that re-exports it.

Our public names live in private modules (``ckpt_events._events``) that we move between
releases (0.3.0 moved many). Pickle stores a class by ``__module__`` and ``__qualname__``, so a
user's pickled event named ``ckpt_events._events.OperationFinished`` and failed to load once
the module moved; reprs, tracebacks and ``help()`` showed the private path too. Each private
module publishes its public names under their public home at its end, as trio and anyio do.
This module imports nothing of ours.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

__all__ = ["publish"]


def publish(home: str, *objects: Any) -> None:
    """Give each of ``objects`` (classes and functions defined in the calling private module)
    ``home`` as its ``__module__``: pickles, reprs, tracebacks and ``help()`` name the public
    module, which must re-export each of them under its ``__qualname__``.

    A class's own string annotations (``from __future__ import annotations``) are resolved
    first in its defining module: msgspec and ``typing.get_type_hints`` look them up in the
    namespace of ``__module__``, which the lazy public module does not hold (msgspec's decoder
    of an event raised NameError for ``Operation``). One that does not resolve there (a name
    imported for type checking only) stays a string, as unresolvable as it was.
    """
    for obj in objects:
        if isinstance(obj, type):
            _resolve_own_annotations(obj)
        obj.__module__ = home


def _resolve_own_annotations(cls: type) -> None:
    own = inspect.get_annotations(cls)
    if not any(isinstance(annotation, str) for annotation in own.values()):
        return
    namespace = vars(sys.modules[cls.__module__])
    local = dict(vars(cls))
    for name, annotation in own.items():
        if isinstance(annotation, str):
            try:
                own[name] = eval(annotation, namespace, local)  # our own source's annotation
            except NameError:
                continue
    cls.__annotations__ = own
