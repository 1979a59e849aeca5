"""Public names imported on first use: a package's ``__getattr__`` and ``__dir__`` from one table.

``ckpt_events``, ``sinks``, ``ckpt_events.sinks.otel`` and ``participants`` list where each public name
lives; ``lazy_attributes`` builds the two module functions from that table, so importing a
package costs a dict until a name is read (``import sinks`` loads no bus, ``--help`` no server
stack). This module imports nothing of ours, and nothing that is not already loaded.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(
    package: str, homes: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose globals are ``namespace``.

    ``homes`` maps each public name to the module that defines it. The first read of a name
    imports its module and stores the name in ``namespace``, so later reads are plain module
    attributes; a name not in ``homes`` is an ``AttributeError`` naming it (``hasattr`` works).
    ``__dir__`` lists the public names, loaded or not.
    """

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *homes})

    return __getattr__, __dir__
