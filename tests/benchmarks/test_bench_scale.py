"""bench_scale measures each size in a child process that never imports from the working directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_events.benchmarks.bench_scale import measure_in_child


def test_a_size_is_measured_from_a_directory_holding_modules_named_like_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a directory with a sinks.py and a participants.py that raise on import, the child measures."""
    for name in ("sinks", "participants"):
        (tmp_path / f"{name}.py").write_text(
            f"raise ImportError('the working directory {name}.py was imported')\n"
        )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONSAFEPATH", raising=False)
    figures = measure_in_child(10, 1)
    assert figures["off"]["commit_s"] > 0
    assert figures["events_per_run"] > 0
