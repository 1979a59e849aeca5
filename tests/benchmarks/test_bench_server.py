"""bench_server without a collector: the OTLP, every-sink and SDK rows stay, saying why and how."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_events.benchmarks import bench_server, rotel
from ckpt_events.benchmarks.spread import Ratio


@pytest.mark.slow
def test_rows_that_need_rotel_say_why_without_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No rotel-agent: every variant that needs it keeps a row with the reason; the rest are measured."""
    absent = tmp_path / "no-rotel-agent"
    monkeypatch.setenv(rotel.ENV_BINARY, str(absent))
    result = bench_server.run(quick=True)
    why = rotel.why_missing()
    assert str(absent) in why and "pip install rotel" in why
    assert result["skipped"] == {"otlp": why, "all": why, "sdk": why}
    rows = {what: value for what, value, _, _ in result["rows"]}
    skipped = [what for what in rows if why in what]
    # The OTLP, every-sink and SDK rows, and each of ours against the SDK's.
    assert len(skipped) == 5
    assert all(rows[what] is None for what in skipped)
    measured = rows["server CPU/request: ckpt-events, no sink / uninstrumented"]
    assert isinstance(measured, Ratio) and measured.rounds == result["rounds"]
