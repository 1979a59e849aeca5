"""The documentation pages (README.md and docs/*.md) as tests read them: their fenced blocks,
their links and headings, and a fresh interpreter to run an example in.

Used by ``tests/test_readme.py`` (the front page) and ``tests/test_docs.py`` (every page).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: Every page, the README first; a page's name is its path from the repository root.
PAGES: tuple[Path, ...] = (README, *sorted(DOCS.glob("*.md")))
#: The fence languages a page may use: python runs, bash is checked, text is program output.
LANGUAGES = frozenset({"python", "bash", "text"})

_FENCE = re.compile(r"^```(\S*)\n(.*?)^```$", flags=re.S | re.M)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_INLINE_CODE = re.compile(r"`[^`\n]*`")


class Block(NamedTuple):
    """One fenced block: its page, its number among the page's blocks, language and text."""

    page: Path
    index: int
    language: str
    code: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.language}:{self.index}"


def name_of(page: Path) -> str:
    """``README.md`` or ``docs/<page>.md``."""
    return str(page.relative_to(ROOT))


def blocks(page: Path, language: str | None = None) -> list[Block]:
    """The page's fenced blocks, in order (only ``language``'s when given)."""
    found = [
        Block(page, index, match.group(1), match.group(2))
        for index, match in enumerate(_FENCE.finditer(page.read_text()))
    ]
    return [b for b in found if language is None or b.language == language]


def all_blocks(language: str | None = None) -> list[Block]:
    """Every page's blocks (of ``language``)."""
    return [block for page in PAGES for block in blocks(page, language)]


def prose(page: Path) -> str:
    """The page without its fenced blocks and inline code (where links and headings live)."""
    return _INLINE_CODE.sub("", _FENCE.sub("", page.read_text()))


def links(page: Path) -> list[str]:
    """The targets of the page's Markdown links (images left out)."""
    return _LINK.findall(prose(page))


def slug(heading: str) -> str:
    """The anchor a forge (GitHub, Gitea, GitLab) gives a heading: lower case, punctuation
    but ``-`` and ``_`` dropped, spaces turned into ``-``."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of the page's headings (a repeated one also as ``-1``, ``-2``...)."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in _FENCE.sub("", page.read_text()).splitlines():
        match = re.match(r"#{1,6} (.+)", line)
        if match is None:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        found.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return found


def one_block(page: str, marker: str) -> str:
    """The one python block of ``docs/page`` holding ``marker``."""
    (block,) = [b.code for b in blocks(DOCS / page, "python") if marker in b.code]
    return block


def run_python(code: str, cwd: Path, *, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter in ``cwd``, without our or OpenTelemetry's variables,
    deprecations as errors (an example never uses a name on its way out)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CKPT_EVENTS_"))}
    clean["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
        env={**clean, **env},
    )
