"""The report as a PNG: the HTML page rendered by a headless Chromium (Debian's ``chromium``,
or Chrome), the one dependency that draws it exactly as a browser shows it.

No Python package renders SVG and HTML text faithfully without a browser engine, so
without Chromium ``write_png`` refuses in one line naming what to install, rather than
writing something else under a ``.png`` name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

from ckpt_events import Event
from ckpt_events.participants.cli.report.html import html_page
from ckpt_events.participants.errors import CommandError

if TYPE_CHECKING:
    from ckpt_events.participants.cli.report.overview import Whole

__all__ = ["BROWSERS", "browser_command", "find_browser", "screenshot", "write_png"]

#: Executables tried in order, then ``$CKPT_EVENTS_CHROMIUM`` first if set.
BROWSERS: Final = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
_PNG_MAGIC: Final = b"\x89PNG\r\n\x1a\n"
_TIMEOUT_S: Final = 60.0
#: How long killed browser processes get to be reaped (SIGKILL: at once, in practice).
_REAP_S: Final = 5.0


def find_browser() -> str | None:
    """The path of a headless-capable Chromium, or ``None``."""
    preferred = os.environ.get("CKPT_EVENTS_CHROMIUM")
    for name in ((preferred,) if preferred else ()) + BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def browser_command(browser: str, *args: str) -> list[str]:
    """A headless run of ``browser``: no sandbox when root (Chromium refuses otherwise), no GPU."""
    sandbox = ["--no-sandbox"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    return [browser, "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run", *sandbox, *args]


def screenshot(
    page: Path,
    out: Path,
    *,
    width: int,
    height: int,
    browser: str | None = None,
    timeout_s: float = _TIMEOUT_S,
) -> None:
    """Render the HTML file ``page`` at ``width`` x ``height`` CSS pixels into the PNG ``out``;
    ``CommandError`` (one line) without a browser, when it drew nothing, or when it had not
    finished within ``timeout_s`` (it is killed)."""
    browser = browser or find_browser()
    if browser is None:
        raise CommandError(
            "cannot write a PNG: no Chromium found (install Debian's 'chromium' package, or write .html/.svg)"
        )
    with tempfile.TemporaryDirectory(prefix="ckpt-chromium-") as profile:
        command = browser_command(
            browser,
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            f"--screenshot={out}",
            page.resolve().as_uri(),
        )
        # Its own process group: past the deadline (or on Ctrl-C, which its own session does
        # not get) the browser and every process it started are killed at once; killing the
        # browser alone left its children writing into the profile while it was removed
        # ("Directory not empty", a traceback).
        with subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        ) as browsing:
            try:
                _, stderr = browsing.communicate(timeout=timeout_s)
            except BaseException as exc:  # as subprocess.run does: kill, then re-raise
                with contextlib.suppress(ProcessLookupError):  # all of it ended just now
                    os.killpg(browsing.pid, signal.SIGKILL)
                browsing.communicate(timeout=_REAP_S)
                if isinstance(exc, subprocess.TimeoutExpired):
                    raise CommandError(
                        f"cannot write a PNG: {Path(browser).name} had not drawn {page.name} after "
                        f"{timeout_s:g} s and was stopped (check that it runs headless here, or write .html)"
                    ) from None
                raise
    if not out.is_file() or out.read_bytes()[:8] != _PNG_MAGIC:
        last = (stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise CommandError(f"cannot write a PNG: {Path(browser).name} exited {browsing.returncode}: {last}")


def write_png(
    path: Path,
    events: Sequence[Event],
    *,
    title: str,
    width: int = 1600,
    tallies: Mapping[str, Counter[str]] | None = None,
    whole: Whole | None = None,
) -> None:
    """The report page of ``events`` as a PNG at ``width`` px, as tall as the page needs."""
    page_html = html_page(events, title=title, tallies=tallies, whole=whole)
    # Height from the content: rows of both waterfalls plus the table; generous, never cut.
    rows = page_html.count('class="span"') + page_html.count("<tr>")
    height = min(16000, 500 + rows * 30 * width // 1350)
    with tempfile.TemporaryDirectory(prefix="ckpt-report-") as tmp:
        page = Path(tmp) / "report.html"
        page.write_text(page_html)
        screenshot(page, path, width=width, height=height)
