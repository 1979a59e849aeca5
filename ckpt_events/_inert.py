"""Text made inert for a terminal: ``escape(text)``, the one rule for what a string from a user,
a log or a peer may put on a terminal (or in a log line a terminal shows).

An instance name, a checkpoint id, a participant's refusal or a collector's reply is someone
else's text: on a terminal it must not clear the screen, set the window title, write a
hyperlink or colour what follows. Control, format, surrogate and line-separator characters are
shown as their Python escapes; every other character is kept.
"""

from __future__ import annotations

import unicodedata
from typing import Final

from ckpt_events._public_home import publish

__all__ = ["escape"]

#: Categories of character shown as an escape: C0, DEL and C1 controls (ESC, the C1 CSI 0x9b and
#: OSC 0x9d among them), format characters (bidi overrides, zero-width ones), lone surrogates
#: (which would not even encode to UTF-8), and the line and paragraph separators.
_SHOWN: Final = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_NAMED: Final = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _shown(char: str) -> str:
    if char.isprintable() or unicodedata.category(char) not in _SHOWN:
        return char  # printable, or a space or private-use or unassigned character: inert
    code = ord(char)
    named = _NAMED.get(char)
    if named is not None:
        return named
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def escape(text: object) -> str:
    """``str(text)`` with every control, format, surrogate and line-separator character shown as
    its Python escape (``\\x1b``, ``\\x9b``, ``\\u202e``, ``\\n``); every other character kept.
    The result holds no byte a terminal obeys, and is one line."""
    plain = str(text)
    if plain.isprintable():  # the common case: one C-level scan, no copy
        return plain
    return "".join(_shown(char) for char in plain)


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.checks", escape)
