"""Checkpoint participants and their controller, as FastAPI apps and clients.

The package has four rooms, and imports flow one way::

    fastapi             any FastAPI app instrumented in one call (``instrument``, ``operation``)
    protocol            wire types of the control plane (requests, replies, error codes)
      <- workloads/     the simulated work of each kind and what it saves
        <- server/      a participant as a FastAPI app (built with ``fastapi``): control plane,
                        store, inference worker
      <- controller/    client, coordinator, rollout collection, run directory
    cli/                the ``ckpt-events`` command: uses all of the above; nothing imports it

``create_app(kind, instance=..., token=...)`` builds a participant; ``create_inference_app``
the simulated inference worker the model participant calls; ``Coordinator`` drives their
checkpoints and ``Collection`` runs rollouts on them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from ckpt_events.participants.controller import Collection, Coordinator
    from ckpt_events.participants.server import PARTICIPANT_KINDS, create_app, create_inference_app

__all__ = ["PARTICIPANT_KINDS", "Collection", "Coordinator", "create_app", "create_inference_app"]

#: Where each public name lives. Imported on first use, so ``import participants`` (and every
#: submodule import, such as the command line's) loads neither FastAPI nor httpx until asked.
_HOMES: Final = {
    "PARTICIPANT_KINDS": "ckpt_events.participants.server",
    "Collection": "ckpt_events.participants.controller",
    "Coordinator": "ckpt_events.participants.controller",
    "create_app": "ckpt_events.participants.server",
    "create_inference_app": "ckpt_events.participants.server",
}

#: The top-level packages the server extra installs.
_SERVER_EXTRA: Final = frozenset({"fastapi", "starlette", "uvicorn", "httpx", "sniffio"})


def _getattr(name: str) -> Any:
    """Import a public name's home on first use (PEP 562); later reads are plain attributes."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(home)
    except ModuleNotFoundError as exc:
        # Without the server extra this was a bare "No module named 'fastapi'", naming no install.
        missing = (exc.name or "").partition(".")[0]
        if missing not in _SERVER_EXTRA:
            raise
        raise ModuleNotFoundError(
            f"{__name__}.{name} needs {missing!r}, which is not installed: pip install 'ckpt-events[server]'",
            name=exc.name,
        ) from exc
    value = getattr(module, name)
    globals()[name] = value
    return value


def _dir() -> list[str]:
    # The public names, the public submodules imported so far (``fastapi``) and the dunders:
    # not ``_HOMES``, ``importlib`` or ``Final``, which tab completion offered.
    shown = {n for n in globals() if n.startswith("__")}
    for name, value in globals().items():
        if not name.startswith("_") and getattr(value, "__name__", None) == f"{__name__}.{name}":
            shown.add(name)
    return sorted({*shown, *_HOMES})


# Hidden from type checkers, which read the imports above: a module __getattr__ made every
# misspelt name (`participants.create_ap`) an Any that mypy --strict let through.
if not TYPE_CHECKING:
    __getattr__, __dir__ = _getattr, _dir
