"""`.ci/min-versions` pins every declared dependency at exactly its lower bound in pyproject.toml."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "min-versions"


def _release(version: str) -> tuple[int, ...]:
    """A release number without its trailing zeros: ``0.110`` and ``0.110.0`` are one version."""
    parts = [int(part) for part in version.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def _declared() -> dict[str, str]:
    """The lower bound of each dependency of the core and of every extra but [dev]."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = {name: deps for name, deps in project["optional-dependencies"].items() if name != "dev"}
    bounds: dict[str, str] = {}
    for requirement in [*project["dependencies"], *(dep for deps in extras.values() for dep in deps)]:
        if requirement.startswith("ckpt-events["):
            continue
        name, bound = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", requirement).groups()
        bounds[name.lower()] = bound
    return bounds


def _pinned() -> dict[str, str]:
    """The script's PINS, one ``'name==version'`` a line."""
    (block,) = re.findall(r"^PINS=\((.*?)^\)", SCRIPT.read_text(), re.MULTILINE | re.DOTALL)
    pins = re.findall(r"^\s+'([A-Za-z0-9_.-]+)==([0-9.]+)'$", block, re.MULTILINE)
    assert len(pins) == len(block.strip().splitlines()), block
    return {name.lower(): version for name, version in pins}


def test_the_script_pins_exactly_the_declared_lower_bounds() -> None:
    """Every dependency pyproject.toml declares (but [dev]'s) is pinned at its bound, nothing else."""
    declared, pinned = _declared(), _pinned()
    assert sorted(pinned) == sorted(declared)
    assert {name: _release(v) for name, v in pinned.items()} == {
        name: _release(v) for name, v in declared.items()
    }


def test_the_script_parses_and_is_left_out_of_ci() -> None:
    """bash reads the script; .ci/run does not run it (a second environment, minutes long)."""
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)
    assert "min-versions" not in (ROOT / ".ci" / "run").read_text()
