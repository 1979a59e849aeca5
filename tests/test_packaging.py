"""The wheel a user installs: one top-level name (``ckpt_events``), and it works beside their own
``sinks``, ``participants`` and ``benchmarks`` packages.

The wheel is built from this checkout (offline, with the dev extra's setuptools), installed with
``pip --target`` into a folder of its own, and run from a user project that holds packages with
our old top-level names, each raising on import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = ("sinks", "participants", "benchmarks")

#: A user's first program: the library only (bus, emitter, JSON-lines sink, the log read back).
LIBRARY = """
import anyio
import ckpt_events, ckpt_events.sinks
from ckpt_events import Bus, Telemetry
from ckpt_events.sinks import JsonLinesSink, read_events

async def main():
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink("events.jsonl"))
        tel = Telemetry(bus, kind="environment", instance="env-0")
        with tel.operation("commit", checkpoint_id="c1") as op:
            with op.step("write"):
                pass
            op.set(records=3)
    events = list(read_events("events.jsonl"))
    print(len(events), ckpt_events.__file__, ckpt_events.sinks.__file__)

anyio.run(main)
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built and installed into a target folder of its own."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("ckpt_events-*.whl")
    target = out / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return target


def test_the_wheel_holds_one_top_level_package(installed: Path) -> None:
    """site-packages gets ``ckpt_events`` and its dist-info, nothing else; the rooms are inside it."""
    top = {p.name for p in installed.iterdir()} - {"bin"}
    (dist_info,) = (name for name in top if name.endswith(".dist-info"))
    assert top == {"ckpt_events", dist_info}
    package = installed / "ckpt_events"
    for room in HOSTILE:
        assert (package / room / "__init__.py").is_file() and not (package / room).is_symlink(), room
    assert (package / "sinks" / "ops" / "rules.yml").is_file()
    assert (package / "participants" / "py.typed").is_file()
    entry_points = (installed / dist_info / "entry_points.txt").read_text()
    assert "ckpt-events = ckpt_events.participants.cli.main:main" in entry_points
    assert "ckpt_events.sinks.pytest_plugin" in entry_points


def _user_project(folder: Path) -> Path:
    """A project of the user's with its own packages named as our old top-level ones."""
    for name in HOSTILE:
        (folder / name).mkdir()
        (folder / name / "__init__.py").write_text(
            f"raise ImportError('the user project\\'s {name} was imported')\n"
        )
    return folder


def _run(installed: Path, cwd: Path, code: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CKPT_EVENTS_", "PYTHONSAFE"))}
    env["PYTHONPATH"] = str(installed)
    # ``-c`` puts the working directory first on sys.path, before the installed wheel: the worst case.
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_the_library_report_and_demo_run_beside_the_users_own_packages(
    installed: Path, tmp_path: Path
) -> None:
    """From a directory holding its own sinks/, participants/ and benchmarks/, the installed wheel's
    library, ``report`` and ``demo`` run, and what they import is the wheel's."""
    project = _user_project(tmp_path)
    library = _run(installed, project, LIBRARY)
    assert library.returncode == 0, library.stderr[-2000:]
    count, core, sinks = library.stdout.split()
    assert int(count) == 4  # operation and step, started and finished
    assert Path(core).is_relative_to(installed) and Path(sinks).is_relative_to(installed)

    cli = (
        "import sys; from ckpt_events.participants.cli.main import main; raise SystemExit(main(sys.argv[1:]))"
    )
    argv = "['report', 'events.jsonl', '--report', 'run.perfetto.json']"
    report = _run(installed, project, f"import sys; sys.argv[1:] = {argv}\n{cli}")
    assert report.returncode == 0, report.stderr[-2000:]
    assert "the user project" not in report.stderr and "environment/env-0" in report.stdout
    assert json.loads((project / "run.perfetto.json").read_text())

    demo = _run(
        installed, project, f"import sys; sys.argv[1:] = ['demo', '--rollouts', '2', '--workdir', 'w']\n{cli}"
    )
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert "Traceback" not in demo.stderr and "the user project" not in demo.stderr
    assert "ok no rollout ran twice" in demo.stdout
