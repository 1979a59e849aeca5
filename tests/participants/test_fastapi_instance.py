"""``instrument(app, instance=<callable>)``: the instance named in the process that serves, at
each start of the lifespan (``gunicorn --preload`` imports the app in its master, where a name
built at import named every worker after the master's pid)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable

import httpx
import pytest
from fastapi import FastAPI, Request

from ckpt_events import Bus, ConfigurationError, InvalidTypeError, InvalidValueError, OperationFinished
from ckpt_events.participants.fastapi import instrument, operation, telemetry
from ckpt_events.testing import MemorySink


def _app(sink: MemorySink, instance: Callable[[], object]) -> FastAPI:
    """An app with one commit route, its instance named by ``instance`` and ``sink`` its sink."""
    app = FastAPI()
    instrument(app, kind="judge", instance=instance, configure_sinks=lambda bus: bus.subscribe(sink))  # type: ignore[arg-type]

    @app.post("/commit")
    async def commit(request: Request) -> dict[str, str]:
        with operation(request, "commit", checkpoint_id="c1"):
            pass
        return {"instance": telemetry(request).instance}

    return app


async def _commit(app: FastAPI) -> str:
    """One commit served in one run of ``app``'s lifespan: the instance that answered."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://judge") as client:
            reply = await client.post("/commit")
    assert reply.status_code == 200
    return str(reply.json()["instance"])


async def test_the_callable_names_each_run_of_the_lifespan_as_it_starts() -> None:
    """Called at each start of the lifespan, never at ``instrument()``: the first run's operations
    carry its first name, the second run's its second (it was refused, ``instance must be ...``)."""
    names = (f"judge-{n}" for n in itertools.count())
    sink = MemorySink()
    app = _app(sink, lambda: next(names))
    assert telemetry(app).instance == "named-at-lifespan-start" and not telemetry(app).enabled
    assert [await _commit(app), await _commit(app)] == ["judge-0", "judge-1"]
    assert [event.instance for event in sink.of_type(OperationFinished)] == ["judge-0", "judge-1"]


@pytest.mark.parametrize(
    ("returned", "said"),
    [
        (5, "returned 5: instance must be 1-128 characters"),
        ("judge 0", "returned 'judge 0': instance must be 1-128 characters"),
        ("", "returned '': instance must be"),
    ],
)
async def test_a_returned_non_name_fails_the_startup_saying_so(returned: object, said: str) -> None:
    """What the callable returns gets the check a string ``instance=`` gets, the error naming the
    callable; the next run calls it again (a fixed callable starts)."""
    sink = MemorySink()
    answers = iter([returned, "judge-0"])
    app = _app(sink, lambda: next(answers))
    with pytest.raises(ConfigurationError, match=r"instance=<function .*<lambda>.*> ") as raised:
        await _commit(app)
    assert said in str(raised.value)
    assert await _commit(app) == "judge-0"
    assert [event.instance for event in sink.of_type(OperationFinished)] == ["judge-0"]


async def test_a_callable_that_raises_fails_the_startup_naming_it() -> None:
    """What the callable raises is the cause, chained, of one ``ConfigurationError`` saying so."""

    def worker_name() -> str:
        raise KeyError("WORKER_ID")

    app = _app(MemorySink(), worker_name)
    with pytest.raises(ConfigurationError) as raised:
        await _commit(app)
    assert "instance=<function " in str(raised.value) and "worker_name" in str(raised.value)
    assert "raised KeyError: 'WORKER_ID' at the lifespan's start" in str(raised.value)
    assert isinstance(raised.value.__cause__, KeyError)


def test_what_cannot_name_is_refused_at_instrument() -> None:
    """Neither a name nor a callable, a callable needing an argument, or a callable with ``bus=``
    (a bus built beforehand, one Telemetry for it) fail at ``instrument()``, changing nothing."""
    for instance, error, said in [
        (7, InvalidTypeError, "instance must be a name (1-128 characters"),
        (lambda worker: f"judge-{worker}", InvalidTypeError, "is called with no argument"),
    ]:
        app = FastAPI()
        with pytest.raises(error, match=re.escape(said)):
            instrument(app, kind="judge", instance=instance)  # type: ignore[arg-type]
        assert not hasattr(app.state, "ckpt_events")
    with pytest.raises(InvalidValueError, match="with bus=, pass the instance's name as a string"):
        instrument(FastAPI(), kind="judge", instance=lambda: "judge-0", bus=Bus())
