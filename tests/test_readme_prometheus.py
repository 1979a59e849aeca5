"""The Prometheus names table of docs/prometheus.md is the generated one."""

from __future__ import annotations

from tests.readme_prometheus import PAGE, names_table, readme_block


def test_prometheus_names_table_matches_the_code() -> None:
    """The page's table is what tests/readme_prometheus.py generates."""
    assert readme_block(PAGE.read_text()) == names_table(), "run: python -m tests.readme_prometheus"
