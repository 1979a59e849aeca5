"""The ``participants`` package: its names are imported on first use, so importing it stays light."""

from __future__ import annotations

import subprocess
import sys

import ckpt_events.participants.controller
import ckpt_events.participants.server
from ckpt_events import participants

#: Third-party stacks only a server or a controller needs (and the command's ``--help`` does not).
HEAVY = ("fastapi", "starlette", "uvicorn", "httpx", "opentelemetry")


def _loaded_after(code: str) -> set[str]:
    probe = f"import sys\n{code}\nprint(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    run = subprocess.run(
        [sys.executable, "-P", "-c", probe], check=True, capture_output=True, text=True, timeout=60
    )
    return set(run.stdout.split()) & set(HEAVY)


def test_importing_the_package_loads_no_server_stack():
    """``import participants`` (and the command line's parser) loads neither FastAPI nor httpx."""
    assert _loaded_after("from ckpt_events import participants") == set()
    assert (
        _loaded_after("from ckpt_events.participants.cli.main import build_parser; build_parser()") == set()
    )


def test_a_name_loads_its_home_on_first_use():
    """Asking for ``create_app`` imports the server stack then, not before."""
    assert "fastapi" in _loaded_after("from ckpt_events.participants import create_app")


def test_every_public_name_is_its_home_module_s_object():
    """Each name in ``__all__`` resolves to the very object of the module it lives in, and dir() lists it."""
    homes = {
        "PARTICIPANT_KINDS": ckpt_events.participants.server,
        "Collection": ckpt_events.participants.controller,
        "Coordinator": ckpt_events.participants.controller,
        "create_app": ckpt_events.participants.server,
        "create_inference_app": ckpt_events.participants.server,
    }
    assert sorted(homes) == sorted(participants.__all__)
    for name, home in homes.items():
        assert getattr(participants, name) is getattr(home, name)
    assert set(participants.__all__) <= set(dir(participants))


def test_an_unknown_name_is_an_attribute_error():
    """A name the package does not have raises AttributeError naming it (so hasattr works)."""
    assert not hasattr(participants, "no_such_name")
