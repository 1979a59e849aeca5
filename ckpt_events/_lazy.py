"""Public names imported on first use: a package's ``__getattr__`` and ``__dir__`` from one table.

``ckpt_events``, ``sinks``, ``ckpt_events.sinks.otel`` and ``participants`` list where each public name
lives; ``lazy_attributes`` builds the two module functions from that table, so importing a
package costs a dict until a name is read (``import sinks`` loads no bus, ``--help`` no server
stack). This module imports nothing of ours, and nothing that is not already loaded.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Final

__all__ = ["EXTRAS", "lazy_attributes", "needs_extra"]

#: The top-level packages an extra brings, and that extra: a public name whose module misses
#: one says which install brings it (it was a bare "No module named 'starlette'").
EXTRAS: Final = {
    "opentelemetry": "otel",
    "fastapi": "server",
    "starlette": "server",
    "uvicorn": "server",
    "httpx": "server",
    "prometheus_client": "prometheus",
    "rich": "cli",
}


def needs_extra(exc: ModuleNotFoundError, what: str) -> ModuleNotFoundError | None:
    """A ``ModuleNotFoundError`` (still one, so ``except ImportError`` holds) saying that ``what``
    needs the missing package and which extra installs it; ``None`` when ``exc`` names no
    package of an extra (a module of ours, or one of theirs missing its own dependency)."""
    top = (exc.name or "").partition(".")[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return None
    return ModuleNotFoundError(
        f"{what} needs {top!r}, which is not installed: pip install 'ckpt-events[{extra}]'", name=exc.name
    )


def lazy_attributes(
    package: str,
    homes: Mapping[str, str],
    namespace: dict[str, Any],
    *,
    moved: Mapping[str, str] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose globals are ``namespace``.

    ``homes`` maps each public name to the module that defines it (a submodule of
    ``package`` maps its own name to itself: the module is the value). The first read of a
    name imports its module and stores the name in ``namespace``, so later reads are plain
    module attributes; a name not in ``homes`` is an ``AttributeError`` naming it (``hasattr``
    works). ``moved`` maps deprecated names to their new public home: each read warns
    (``DeprecationWarning`` naming the new home) and is never stored, so every use warns.
    ``__dir__`` lists the public names, loaded or not (not the moved ones), the public
    submodules imported so far and the module's dunders; not the table, ``Final``,
    ``annotations`` or a private submodule (tab completion offered ``_HOMES`` and
    ``_file_lock`` beside the API).
    """

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            new_home = moved.get(name) if moved is not None else None
            if new_home is None:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            warnings.warn(
                f"{package}.{name} moved to {new_home}.{name}; import it from there "
                f"(the old name goes away in the next release)",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(importlib.import_module(new_home), name)
        try:
            module = importlib.import_module(home)
        except ModuleNotFoundError as exc:
            said = needs_extra(exc, f"{package}.{name}")
            if said is None:
                raise
            raise said from exc
        value = module if home == f"{package}.{name}" else getattr(module, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*homes, *(name for name in namespace if _listed(package, name, namespace[name]))})

    return __getattr__, __dir__


def _listed(package: str, name: str, value: object) -> bool:
    """Whether ``dir()`` of ``package`` lists ``name``, beside its table: a dunder, or a public
    submodule already imported (``ckpt_events.sinks`` once ``import ckpt_events.sinks`` ran)."""
    if name.startswith("__"):
        return True
    return not name.startswith("_") and getattr(value, "__name__", None) == f"{package}.{name}"
