"""The testing page (docs/testing.md): its test files pass when pytest runs them, with only the
installed plugin (and pytest-asyncio's recipe under pytest-asyncio)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

from tests.readme_pages import ROOT, one_block


def test_pytest_plugin_example_passes_under_pytest(tmp_path: Path) -> None:
    """The testing page's test file passes when pytest runs it, with only the installed plugin."""
    (tmp_path / "test_commit.py").write_text(one_block("testing.md", "def test_commit_is_one_span"))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error", "test_commit.py"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


def test_the_module_app_recipe_passes_under_pytest(tmp_path: Path) -> None:
    """The testing page's app made at import is captured under TestClient and under httpx,
    one lifespan run after another (no page showed how: ``instrument()`` runs once per app, and
    ``bus.subscribe`` from TestClient's test thread is refused). Starlette's own warning that
    its TestClient would rather have httpx2 is not ours to fail on."""
    (tmp_path / "test_module_app.py").write_text(one_block("testing.md", "# test_module_app.py"))
    ignore = "ignore:Using `httpx` with `starlette.testclient`"
    # This tree's ckpt_events importable; no plugin the page's file does not use.
    arguments = ["-p", "no:hypothesispytest", "-p", "no:xdist", "-W", ignore, "test_module_app.py"]
    result = _pytest(tmp_path, *arguments, importable=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"\b[23] passed", result.stdout), result.stdout  # httpx's under trio too, if installed


def _pytest(where: Path, *arguments: str, importable: Path | None = None) -> subprocess.CompletedProcess[str]:
    """pytest run in ``where`` on its files, warnings as errors, ``importable`` (default
    ``where``) on the import path."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error", *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=where,
        env={**os.environ, "PYTHONPATH": str(importable or where)},
    )


#: A pytest-asyncio fixture holding an instrumented app's lifespan across its ``yield``.
_LIFESPAN_IN_A_FIXTURE: Final = """
import pytest
import pytest_asyncio

from test_app import make_app


@pytest_asyncio.fixture
async def app(ckpt_capture):
    tel = ckpt_capture.telemetry("judge", "judge-0")
    app = make_app(telemetry=tel, bus=tel.bus)
    async with app.router.lifespan_context(app):
        yield app


@pytest.mark.asyncio
async def test_served(app):
    pass
"""


@pytest.mark.parametrize("mode", ["strict", "auto"])
def test_the_pytest_asyncio_recipe_passes_under_pytest_asyncio(tmp_path: Path, mode: str) -> None:
    """The testing page's pytest-asyncio files pass under pytest-asyncio (strict and auto mode,
    warnings as errors, two xdist workers); a fixture holding the lifespan across its yield
    fails at teardown with our one line (was anyio's "Attempted to exit cancel scope in a
    different task", twice, from our lifespan). Skipped without pytest-asyncio and asgi-lifespan,
    which our suite does not install: pytest-asyncio would run its async tests too."""
    for package in ("pytest_asyncio", "asgi_lifespan", "xdist"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"needs {package} installed (pip install pytest-asyncio asgi-lifespan pytest-xdist)")
    (tmp_path / "test_app.py").write_text(one_block("testing.md", "# test_app.py"))
    (tmp_path / "test_fixture.py").write_text(one_block("testing.md", "# test_fixture.py"))
    options = ["-o", f"asyncio_mode={mode}", "-o", "asyncio_default_fixture_loop_scope=function"]
    result = _pytest(tmp_path, *options, "-n", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout
    (tmp_path / "test_lifespan_fixture.py").write_text(_LIFESPAN_IN_A_FIXTURE)
    result = _pytest(tmp_path, *options, "-n", "0", "test_lifespan_fixture.py")
    assert "1 passed, 1 error" in result.stdout, result.stdout + result.stderr
    assert "ConfigurationError: the instrumented app's lifespan was entered in one task" in result.stdout
    assert "Attempted to exit cancel scope" not in result.stdout
