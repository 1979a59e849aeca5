"""The HTML report in a real browser (headless Chromium), and the PNG written by extension."""

from __future__ import annotations

import html
import re
import subprocess
from pathlib import Path

import pytest

from ckpt_events.participants.cli.report.files import write_report
from ckpt_events.participants.cli.report.html import html_page
from ckpt_events.participants.cli.report.model import finished_spans
from ckpt_events.participants.cli.report.png import browser_command, find_browser, screenshot
from tests.participants.cli.report_events import checkpoint_and_restore as emit

BROWSER = find_browser()
needs_browser = pytest.mark.skipif(
    BROWSER is None, reason="no headless Chromium on PATH (Debian: apt-get install chromium)"
)
PNG = b"\x89PNG\r\n\x1a\n"


def _dom(page: Path, profile: Path) -> str:
    assert BROWSER is not None
    command = browser_command(BROWSER, f"--user-data-dir={profile}", "--dump-dom", page.as_uri())
    run = subprocess.run(command, capture_output=True, timeout=60, check=True)
    return run.stdout.decode()


@needs_browser
async def test_page_in_chromium_shows_every_span_and_the_restore(tmp_path: Path) -> None:
    """After its script ran, the DOM holds every span of the log with its duration, both waterfalls,
    the attribution lines and the participant table; screenshots at 1000 and 1600 px render."""
    events = await emit()
    page = tmp_path / "report.html"
    page.write_text(html_page(events, title="browser test"))
    assert re.search(r"\b(src|href)=|@import|url\(", page.read_text()) is None  # nothing to fetch
    dom = _dom(page, tmp_path / "profile")
    spans = finished_spans(events)
    assert re.search(rf'data-ready="{len(spans)}"', dom), "the page's script did not run over every span"
    for e in spans:
        ms = (e.end_ns - e.start_ns) / 1e6
        assert re.search(rf'data-span-id="{e.span_id:016x}" data-ms="{ms:.2f}"', dom), e
        assert f"{ms:.1f} ms" in dom
    assert '<section id="checkpoint">' in dom and '<section id="restore">' in dom
    restore = dom[dom.index('<section id="restore">') :]
    assert "collection.restore" in restore and "coordinate.restore" in restore and "read" in restore
    assert html.unescape(dom).count("ms unattributed") == 2 and 'id="participants"' in dom
    for width in (1000, 1600):
        shot = tmp_path / f"report-{width}.png"
        screenshot(page, shot, width=width, height=1800)
        assert shot.read_bytes()[:8] == PNG and shot.stat().st_size > 20_000


@needs_browser
async def test_png_by_extension_is_a_rendered_png(tmp_path: Path) -> None:
    """A .png report is a real PNG, and says which browser drew it."""
    events = await emit()
    said = write_report(tmp_path / "report.png", events, title="png")
    assert (tmp_path / "report.png").read_bytes()[:8] == PNG and "headless chromium" in said.lower()
