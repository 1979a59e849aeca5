"""Shared pytest setup: async tests run on anyio's asyncio backend (``anyio_mode = "auto"``)."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
