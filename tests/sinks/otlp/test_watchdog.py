"""RequestWatchdog: a request still armed at its deadline is expired, on one kept thread."""

from __future__ import annotations

import threading
import time

import pytest

from ckpt_events.sinks.otlp import _watchdog
from ckpt_events.sinks.otlp._watchdog import RequestWatchdog


def _recorder() -> tuple[list[str], threading.Event, RequestWatchdog[str]]:
    expired: list[str] = []
    done = threading.Event()

    def expire(target: str) -> None:
        expired.append(target)
        done.set()

    return expired, done, RequestWatchdog(expire, "test-watchdog")


def test_an_armed_request_expires_at_its_deadline() -> None:
    """A request still armed when its budget runs out is expired, once, not before."""
    expired, done, watchdog = _recorder()
    started = time.monotonic()
    watchdog.arm(0.1, "slow")
    assert done.wait(5)
    assert time.monotonic() - started >= 0.1
    time.sleep(0.1)
    assert expired == ["slow"]


def test_a_disarmed_request_never_expires() -> None:
    """Requests that end in time are never expired, one after another on the same thread."""
    expired, _, watchdog = _recorder()
    for n in range(50):
        watchdog.arm(0.05, f"r{n}")
        watchdog.disarm()
    time.sleep(0.15)
    assert expired == []


def test_a_nearer_deadline_wakes_the_sleeping_thread() -> None:
    """After a long budget, a short one still expires on time (the thread sleeps less)."""
    expired, done, watchdog = _recorder()
    watchdog.arm(30.0, "long")
    watchdog.disarm()
    started = time.monotonic()
    watchdog.arm(0.05, "short")
    assert done.wait(5)
    assert time.monotonic() - started < 5
    assert expired == ["short"]


def test_the_thread_ends_when_idle_and_starts_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """No thread is kept for an unused sender; the next request is watched by a new one."""
    monkeypatch.setattr(_watchdog, "IDLE_EXIT", 0.05)
    expired, done, watchdog = _recorder()
    watchdog.arm(1.0, "first")
    watchdog.disarm()
    deadline = time.monotonic() + 5
    while watchdog._thread is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert watchdog._thread is None
    watchdog.arm(0.05, "second")
    assert done.wait(5)
    assert expired == ["second"]


def test_stop_ends_the_idle_thread_at_once_and_arm_starts_it_again() -> None:
    """After ``stop`` no watchdog thread is left (it waited out IDLE_EXIT, 30 s, before); a later
    request is watched again."""
    before = set(threading.enumerate())
    expired, done, watchdog = _recorder()
    watchdog.arm(5.0, "quick")
    watchdog.disarm()
    assert [t.name for t in set(threading.enumerate()) - before] == ["test-watchdog"]
    started = time.monotonic()
    watchdog.stop()
    assert time.monotonic() - started < 1.0
    assert set(threading.enumerate()) - before == set()
    watchdog.arm(0.05, "late")
    assert done.wait(5)
    assert expired == ["late"]
    watchdog.stop()
