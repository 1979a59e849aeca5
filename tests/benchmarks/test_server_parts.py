"""server_parts: every sink set gets its row, measured (rotel present) or saying why (absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_events.benchmarks import rotel, server_parts


def _rows(result: dict[str, object]) -> dict[str, object]:
    rows = result["rows"]
    assert isinstance(rows, list)
    return {what: value for what, value, _, _ in rows}


def test_without_rotel_the_otlp_rows_say_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No collector: the OTLP and every-sink rows stay, with the reason; the others are measured."""
    monkeypatch.setenv(rotel.ENV_BINARY, str(tmp_path / "no-rotel-agent"))
    rows = _rows(server_parts.run(rounds=1, requests=320))
    why = rotel.why_missing()
    skipped = {what for what in rows if why in what}
    assert len(skipped) == 4 and all(rows[what] is None for what in skipped)
    assert len(rows) == len(server_parts.VARIANTS)
    measured = [value for what, value in rows.items() if what not in skipped]
    assert all(isinstance(value, float) for value in measured)


@pytest.mark.skipif(rotel.agent_binary() is None, reason="needs the rotel collector (pip install rotel)")
def test_with_rotel_every_set_is_measured_and_the_export_runs_on_its_thread() -> None:
    """Each sink set's row is a number; the span export's CPU is counted on its own thread."""
    result = server_parts.run(rounds=1, requests=3_200)
    rows = _rows(result)
    assert len(rows) == len(server_parts.VARIANTS) + 1  # and the export process's own CPU
    assert all(isinstance(value, float) for value in rows.values())
    assert rows["us CPU per request in the export process (all_export_process)"] > 0
    per = result["per_round_us"]
    assert isinstance(per, dict)
    # The span sink's encoding and sending happen off the loop: that thread did some work.
    assert per["otlp_spans"][0][1] > 0
