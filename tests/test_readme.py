"""The README's runnable example runs, and its test command is exactly what CI runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_custom_sink_example_runs() -> None:
    """The custom-sink example in the README runs as written and prints its alert."""
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    runnable = [b for b in blocks if "anyio.run(main)" in b]
    assert len(runnable) == 1
    result = subprocess.run(
        [sys.executable, "-c", runnable[0]], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "ALERT resources/resources-0 refused a request: stale_attempt" in result.stdout


def test_ci_runs_exactly_the_readme_test_command() -> None:
    """.ci/run contains the README's test command verbatim."""
    commands = re.findall(r"```bash\n(.*?)\n```", README, flags=re.S)
    test_command = next(c for c in commands if "pytest" in c)
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci
