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
        "CLOCK_START_NS",
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
        module = importlib.import_module(home)
        expected = module if home == f"ckpt_events.{name}" else getattr(module, name)
        assert getattr(ckpt_events, name) is expected, name
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
        for extra in ("", "; ckpt_events.vocab.Kind")
    )
    assert bare == "['ckpt_events._lazy']"
    assert "'ckpt_events._vocab'" in named
    assert "'ckpt_events._bus'" not in named


def test_the_vocabulary_is_one_namespace() -> None:
    """``ckpt_events.vocab`` lists every vocabulary name, sorted; the top level keeps what server
    code calls (about fifty names) and no harness rule."""
    import ckpt_events.vocab

    names = ckpt_events.vocab.__all__
    assert names == sorted(names, key=lambda n: (not n.isupper(), n.lower() if n[0].islower() else n))
    for name in names:
        assert hasattr(ckpt_events.vocab, name), name
    assert not set(names) & set(ckpt_events.__all__)
    assert 45 <= len(ckpt_events.__all__) <= 55
    assert ckpt_events.vocab is importlib_module("ckpt_events.vocab")
    for gone in ("PREPARE_ORDER", "RESUME_ORDER", "RETIRE_GROUPS"):
        assert not hasattr(ckpt_events, gone) and not hasattr(ckpt_events.vocab, gone)
    assert not hasattr(ckpt_events.vocab.ErrorCode.STALE_ATTEMPT, "http_status")


def test_moved_names_warn_and_name_their_new_home() -> None:
    """A vocabulary name read from the top level still works for one release, with a
    DeprecationWarning naming ``ckpt_events.vocab``; it is not listed (``__all__``, ``dir``)."""
    import pytest

    from ckpt_events import vocab

    for name in ckpt_events._MOVED:
        with pytest.warns(
            DeprecationWarning, match=rf"ckpt_events\.{name} moved to ckpt_events\.vocab\.{name}"
        ):
            value = getattr(ckpt_events, name)
        assert value is getattr(vocab, name)
        assert name not in ckpt_events.__all__ and name not in dir(ckpt_events)
    with pytest.warns(DeprecationWarning, match="ckpt_events.vocab.Kind"):
        from ckpt_events import Kind  # noqa: F401
    assert set(ckpt_events._MOVED) <= set(vocab.__all__)


def importlib_module(name: str) -> object:
    import importlib

    return importlib.import_module(name)
