"""Shared pytest setup: async tests run on anyio's asyncio backend."""

from __future__ import annotations

import inspect

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # anyio's plugin has no auto mode: mark every coroutine test so it runs on the loop.
    for item in items:
        if isinstance(item, pytest.Function) and inspect.iscoroutinefunction(item.obj):
            item.add_marker(pytest.mark.anyio)
