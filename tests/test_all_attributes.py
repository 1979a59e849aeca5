"""The public surface: __all__ is sorted, complete and importable."""

from __future__ import annotations

import ckpt_events
import ckpt_events.testing


def test_all_is_sorted_and_importable() -> None:
    """Every name in __all__ exists; the list is sorted (constants first) and has no duplicates."""
    names = ckpt_events.__all__
    assert len(names) == len(set(names))
    assert names == sorted(names, key=lambda n: (not n.isupper(), n.lower() if n[0].islower() else n))
    for name in names:
        assert hasattr(ckpt_events, name), name


def test_no_public_name_is_left_out() -> None:
    """Every public attribute of the package that is not a module is listed in __all__."""
    public = {
        n for n, v in vars(ckpt_events).items() if not n.startswith("_") and type(v).__name__ != "module"
    }
    # The __future__ feature and the qualifier of the private _HOMES table are not API.
    public -= {"annotations", "Final"}
    assert public <= set(ckpt_events.__all__)


def test_testing_helpers_are_exported() -> None:
    """The testing helpers are part of the surface."""
    assert set(ckpt_events.testing.__all__) == {
        "EventCapture",
        "MemorySink",
        "SequentialIds",
        "TickingClock",
        "capture_events",
    }
    for name in ckpt_events.testing.__all__:
        assert hasattr(ckpt_events.testing, name), name


def test_every_lazy_name_is_its_home_module_s_object() -> None:
    """The lazy table lists exactly __all__; each name is the very object of the module it names."""
    import importlib

    assert sorted(ckpt_events._HOMES) == sorted(ckpt_events.__all__)
    for name, home in ckpt_events._HOMES.items():
        assert getattr(ckpt_events, name) is getattr(importlib.import_module(home), name), name
    assert set(ckpt_events.__all__) <= set(dir(ckpt_events))
    assert not hasattr(ckpt_events, "no_such_name")


def test_importing_the_core_loads_none_of_its_modules() -> None:
    """A bare ``import ckpt_events`` loads only the lazy-name helper; a name loads its module then."""
    import subprocess
    import sys

    probe = "import sys, ckpt_events{}; print(sorted(m for m in sys.modules if m.startswith('ckpt_events.')))"
    bare, named = (
        subprocess.run(
            [sys.executable, "-P", "-c", probe.format(extra)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()
        for extra in ("", "; ckpt_events.Kind")
    )
    assert bare == "['ckpt_events._lazy']"
    assert "'ckpt_events._vocab'" in named
    assert "'ckpt_events._bus'" not in named
