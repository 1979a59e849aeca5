"""What the ``demo --instances`` tests read of a demo: its output, its checks."""

from __future__ import annotations

import pytest

from ckpt_events.participants.cli.main import main


def demo_text(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """``ckpt-events demo ARGV``'s output (it must succeed), runs of white space as one space."""
    capsys.readouterr()
    assert main(["demo", *argv]) == 0
    return " ".join(capsys.readouterr().out.split())


def checks(text: str) -> list[str]:
    """The demo's checks that passed, each from its ``ok``."""
    return [c.strip() for c in text.split(" ok ")[1:]]
