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
    public -= {"annotations"}
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
