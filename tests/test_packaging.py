"""The wheel a user installs: one top-level name (``ckpt_events``), and it works beside their own
``sinks``, ``participants`` and ``benchmarks`` packages.

The wheel is built from this checkout (offline, with the dev extra's setuptools), installed with
``pip --target`` into a folder of its own, and run from a user project that holds packages with
our old top-level names, each raising on import.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
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


#: A user's file typed against the install: strict mypy sees ``Telemetry.operation``'s real type.
TYPED = """
from ckpt_events import Bus, Telemetry

telemetry = Telemetry(Bus(), kind="environment", instance="env-0")
reveal_type(telemetry.operation)
"""


@pytest.mark.parametrize("mode", ["default", "strict"])
def test_an_editable_install_types_as_the_readme_says(tmp_path: Path, mode: str) -> None:
    """README, "Type-checking your code against a clone": mypy on a file in another folder finds
    no ``ckpt_events`` through ``pip install -e .``'s import hook, and does with
    ``editable_mode=strict``."""
    source = tmp_path / "clone"
    skipped = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".*cache")
    shutil.copytree(ROOT, source, symlinks=True, ignore=skipped)
    # The build runs offline with this interpreter's setuptools, nothing else of its site-packages.
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("setuptools", "_distutils_hack", "pkg_resources"):
        found = importlib.util.find_spec(name)
        if found is not None and found.origin is not None:
            (tools / name).symlink_to(Path(found.origin).parent)
    # Its metadata too: setuptools finds its own commands (``dist_info``) by its entry points.
    setuptools = importlib.metadata.distribution("setuptools")
    (metadata,) = [f for f in setuptools.files or () if f.parts[1:] == ("METADATA",)]
    dist_info = Path(str(setuptools.locate_file(metadata))).parent
    (tools / dist_info.name).symlink_to(dist_info)
    # A venv without pip, installed into by this interpreter's pip (``pip --python``): the same
    # install, without the 5-7 s ``ensurepip`` spends putting a pip into each venv.
    venv = tmp_path / "venv"
    make_venv = [sys.executable, "-m", "venv", "--without-pip", str(venv)]
    subprocess.run(make_venv, check=True, capture_output=True, timeout=120)
    python = venv / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
    install += ["--no-index", "--no-build-isolation", "-e", str(source)]
    if mode == "strict":
        install += ["--config-settings", "editable_mode=strict"]
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(tools)}
    subprocess.run(install, check=True, capture_output=True, timeout=300, env=env)
    user = tmp_path / "user"
    user.mkdir()
    (user / "app.py").write_text(TYPED)
    mypy = [sys.executable, "-m", "mypy", "--strict", "--no-error-summary"]
    mypy += ["--python-executable", str(python)]
    result = subprocess.run(
        [*mypy, "--cache-dir", str(user / ".mypy_cache"), "app.py"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=user,
        env={k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")},
    )
    if mode == "default":
        assert "[import-not-found]" in result.stdout, result.stdout
        assert 'Revealed type is "Any"' in result.stdout, result.stdout
    else:
        assert result.returncode == 0, result.stdout + result.stderr
        assert "-> ckpt_events._span_handles.OperationSpan" in result.stdout, result.stdout
