"""``lazy_attributes`` (``ckpt_events._lazy``): a package's names imported on first read, from one table."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_events._lazy import lazy_attributes


def _package() -> tuple[dict[str, Any], Any, Any]:
    namespace: dict[str, Any] = {"__name__": "ckpt_events"}
    homes = {"Bus": "ckpt_events._bus", "vocab": "ckpt_events.vocab"}
    getattr_, dir_ = lazy_attributes(
        "ckpt_events", homes, namespace, moved={"MemorySink": "ckpt_events.testing"}
    )
    return namespace, getattr_, dir_


def test_a_name_is_imported_on_first_read_and_then_kept() -> None:
    """The first read imports the home and stores the value; a submodule maps to the module."""
    import ckpt_events._bus
    import ckpt_events.vocab

    namespace, getattr_, _ = _package()
    assert "Bus" not in namespace
    assert getattr_("Bus") is ckpt_events._bus.Bus
    assert namespace["Bus"] is ckpt_events._bus.Bus
    assert getattr_("vocab") is ckpt_events.vocab


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    """A name outside the table raises AttributeError (so hasattr works)."""
    _, getattr_, _ = _package()
    with pytest.raises(AttributeError, match="'ckpt_events' has no attribute 'Nope'"):
        getattr_("Nope")


def test_a_moved_name_warns_on_every_read_and_is_never_stored() -> None:
    """A deprecated name warns with its new home each time and stays out of the namespace."""
    from ckpt_events.testing import MemorySink

    namespace, getattr_, dir_ = _package()
    for _ in range(2):
        with pytest.warns(DeprecationWarning, match="ckpt_events.testing.MemorySink"):
            assert getattr_("MemorySink") is MemorySink
    assert "MemorySink" not in namespace and "MemorySink" not in dir_()


def test_dir_lists_the_public_names_loaded_or_not() -> None:
    """__dir__ is the table's names and what the namespace holds, sorted."""
    _, _, dir_ = _package()
    assert dir_() == ["Bus", "__name__", "vocab"]
