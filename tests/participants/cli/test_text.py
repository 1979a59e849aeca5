"""Text from a log made inert: every control, format, surrogate and line-separator character shown
as its Python escape, everything else kept; the same text escaped for HTML is well-formed XML."""

from __future__ import annotations

import io
import unicodedata
import xml.etree.ElementTree as ET

import pytest
from rich.console import Console
from rich.text import Text

from ckpt_events.participants.cli.text import escape, escape_html


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2J", "\\x1b[2J"),  # CSI clear screen
        ("\x1b]0;owned\x07", "\\x1b]0;owned\\x07"),  # OSC window title ended by BEL
        ("\x9b31m", "\\x9b31m"),  # the C1 CSI
        ("\x9d8;;http://x\x9c", "\\x9d8;;http://x\\x9c"),  # C1 OSC and ST
        ("\x00\x08\x7f", "\\x00\\x08\\x7f"),  # NUL, backspace, DEL
        ("a\tb\nc\rd", "a\\tb\\nc\\rd"),  # one line, always
        ("abc\u202edef", "abc\\u202edef"),  # right-to-left override
        ("zero\u200bwidth\ufeff\u2066", "zero\\u200bwidth\\ufeff\\u2066"),  # zero-width, BOM, isolate
        ("a\u2028b\u2029c", "a\\u2028b\\u2029c"),  # line and paragraph separators
        ("\ud800", "\\ud800"),  # a lone surrogate (JSON can carry one): would not encode
        ("tag\U000e0041", "tag\\U000e0041"),  # a tag character, invisible
    ],
)
def test_controls_and_format_characters_are_shown(raw: str, shown: str) -> None:
    """Each is shown as its escape, and the text around it is kept."""
    assert escape(raw) == shown


@pytest.mark.parametrize(
    "plain",
    [
        "environment-0",
        "c1-2026-12-02T10:51",
        "Zürich ✓ 検査 🚀",
        "no\u00a0break and\u3000ideographic spaces",  # spaces: shown as they are
        "[bold]markup[/bold] and \\x1b typed out",  # not this function's business
        "",
    ],
)
def test_printable_text_is_kept_as_it_is(plain: str) -> None:
    """Letters, symbols, emoji, spaces, brackets and backslashes come out unchanged."""
    assert escape(plain) == plain


def test_anything_is_shown_as_its_str() -> None:
    """A number, ``None`` or an enum member is shown as ``str()`` makes it."""
    assert (escape(None), escape(3), escape(1.5)) == ("None", "3", "1.5")


def test_no_code_point_gets_through() -> None:
    """Over every code point: the result encodes to UTF-8 and holds no control, format,
    surrogate or separator character, and nothing else is changed."""
    everything = "".join(map(chr, range(0x110000)))
    shown = escape(everything)
    shown.encode()
    assert {unicodedata.category(c) for c in shown} & {"Cc", "Cf", "Cs", "Zl", "Zp"} == set()
    inert = "".join(c for c in everything if unicodedata.category(c) not in {"Cc", "Cf", "Cs", "Zl", "Zp"})
    assert escape(inert) == inert


def test_html_is_escaped_with_quotes_and_is_well_formed_xml() -> None:
    """``escape_html`` escapes ``<``, ``&`` and both quotes, and its controls are shown, so text
    and attributes of an SVG stay well-formed XML."""
    hostile = "\"'><script>&\x1b[2J\x07\x0c\u202e"
    escaped = escape_html(hostile)
    assert escaped == "&quot;&#x27;&gt;&lt;script&gt;&amp;\\x1b[2J\\x07\\x0c\\u202e"
    svg = ET.fromstring(
        f'<svg xmlns="http://www.w3.org/2000/svg" aria-label="{escaped}"><text>{escaped}</text></svg>'
    )
    assert svg[0].text == escape(hostile) == svg.get("aria-label")


def test_rich_shows_an_escaped_text_as_written() -> None:
    """In a ``Text`` (never parsed as markup), the escaped string comes out literally: with colour
    forced, the only escape sequences are rich's own SGR styling."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system="truecolor", width=200)
    console.print(Text(escape("x\x1b]8;;http://x\x1b\\[link=http://evil]lure[/link]"), style="bold"))
    written = out.getvalue()
    assert "\\x1b]8;;http://x\\x1b\\[link=http://evil]lure[/link]" in written
    assert "\x1b]" not in written and written.count("\x1b") == written.count("\x1b[")


def test_escaping_twice_changes_nothing() -> None:
    """What ``escape`` returns is printable, so a message escaped where it was built and again
    where it is printed reads the same."""
    once = escape("c1-\x1b[2J\u202e\n")
    assert escape(once) == once
