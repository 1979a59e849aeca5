"""``ContextBridge`` (``ckpt_events._context_bridge``): an operation parents on the bridge's current
span and is the bridge's current span while it is open."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_events import ContextBridge, InvalidTypeError, OperationFinished, StepFinished, Telemetry
from ckpt_events.testing import capture_events
from tests.typecheck import mypy_strict


class _StackTracer:
    """Another tracing system's context, as a user would bridge it: a stack of current spans."""

    def __init__(self, root: tuple[int, int, bool] | None = None) -> None:
        self.stack: list[tuple[int, int, bool]] = [] if root is None else [root]

    def current_parent(self) -> tuple[int, int, bool] | None:
        return self.stack[-1] if self.stack else None

    def attach(self, trace_id: int, span_id: int, sampled: bool) -> object:
        self.stack.append((trace_id, span_id, sampled))
        return len(self.stack)

    def detach(self, token: object) -> None:
        assert token == len(self.stack)
        self.stack.pop()


async def test_an_operation_parents_on_the_current_span_and_is_current_inside() -> None:
    """The bridge's current span is the operation's parent; inside the block the operation is
    current (so the app's spans nest under it); its steps still parent on the operation."""
    tracer = _StackTracer(root=(0xABC, 0xDEF, False))
    assert isinstance(tracer, ContextBridge)
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="judge", instance="judge-0", otel_context=tracer)
        with tel.operation("commit", checkpoint_id="c1") as op:
            assert tracer.current_parent() == (0xABC, op.span_id, False)
            with op.step("write"):
                pass
        assert tracer.stack == [(0xABC, 0xDEF, False)]
    [finished] = [e for e in events if isinstance(e, OperationFinished)]
    [step] = [e for e in events if isinstance(e, StepFinished)]
    assert (finished.trace_id, finished.parent_span_id, finished.parent_remote) == (0xABC, 0xDEF, False)
    assert finished.sampled is False
    assert step.parent_span_id == finished.span_id


async def test_the_context_is_restored_when_the_block_raises() -> None:
    """An exception leaving the operation detaches it and is recorded; without a current span
    the operation is a root."""
    tracer = _StackTracer()
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="judge", instance="judge-0", otel_context=tracer)
        with pytest.raises(RuntimeError), tel.operation("restore"):
            assert len(tracer.stack) == 1
            raise RuntimeError("boom")
        assert tracer.stack == []
    [finished] = [e for e in events if isinstance(e, OperationFinished)]
    assert finished.parent_span_id is None and finished.error_type == "RuntimeError"


async def test_a_handle_entered_again_is_attached_once() -> None:
    """An operation entered again inside its own block (or after it ended) is made current
    once: each entry attached it and only the first exit detached, so the ended operation stayed
    the current span after its block and everything after nested under it."""
    tracer = _StackTracer()
    async with capture_events() as (bus, _events):
        tel = Telemetry(bus, kind="judge", instance="judge-0", otel_context=tracer)
        op = tel.operation("commit", checkpoint_id="c1")
        with op:
            with op:
                assert len(tracer.stack) == 1
        assert tracer.stack == []
        with op:  # ended: entering it again does nothing
            assert tracer.stack == []
        assert tracer.stack == []


def test_otel_context_must_be_a_bool_or_a_bridge() -> None:
    """Anything else is refused when the Telemetry is built."""
    with pytest.raises(InvalidTypeError, match="ContextBridge"):
        Telemetry(None, kind="judge", instance="judge-0", otel_context=object())  # type: ignore[arg-type]


class _Raising:
    """A user's bridge whose every call raises."""

    def __init__(self, *failing: str) -> None:
        self.failing = failing

    def current_parent(self) -> tuple[int, int, bool] | None:
        if "current_parent" in self.failing:
            raise RuntimeError("current_parent broke")
        return None

    def attach(self, trace_id: int, span_id: int, sampled: bool) -> object:
        if "attach" in self.failing:
            raise RuntimeError("attach broke")
        return "token"

    def detach(self, token: object) -> None:
        if "detach" in self.failing:
            raise RuntimeError("detach broke")


@pytest.mark.parametrize("failing", ["current_parent", "attach", "detach"])
async def test_a_bridge_that_raises_never_breaks_the_block_nor_loses_the_span(
    failing: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A raising ``attach`` left the operation started and never finished, and its error stopped
    the block; ``current_parent`` and ``detach`` raised into the app too. The block runs, the span
    ends, the failure is logged once."""
    ran = []
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="agent", instance="a0", otel_context=_Raising(failing))
        for _ in range(2):
            with tel.operation("commit", checkpoint_id="c1"):
                ran.append(True)
    assert ran == [True, True]
    assert len([e for e in events if isinstance(e, OperationFinished)]) == 2
    said = [r for r in caplog.records if f"_Raising.{failing}() raised" in r.getMessage()]
    assert len(said) == 1 and said[0].exc_info is not None


def test_a_bridge_with_a_typed_token_is_a_context_bridge_under_mypy_strict(
    tmp_path: Path, mypy_cache: Path
) -> None:
    """A bridge over ``contextvars`` typing its token as ``Token[...]`` (what its ``attach``
    returns) is a ``ContextBridge`` for ``mypy --strict``: ``detach(token: object)`` in the
    protocol refused every narrower parameter, on correct code."""
    errors = mypy_strict(
        """
        from contextvars import ContextVar, Token

        from ckpt_events import Bus, ContextBridge, Telemetry

        Parent = tuple[int, int, bool] | None
        current: ContextVar[Parent] = ContextVar("current", default=None)


        class VarBridge:
            def current_parent(self) -> Parent:
                return current.get()

            def attach(
                self, trace_id: int, span_id: int, sampled: bool, *, tracestate: str | None = None
            ) -> Token[Parent]:
                return current.set((trace_id, span_id, sampled))

            def detach(self, token: Token[Parent]) -> None:
                current.reset(token)


        bridge: ContextBridge = VarBridge()
        Telemetry(Bus(), kind="judge", instance="judge-0", otel_context=VarBridge())
        """,
        tmp_path,
        mypy_cache,
    )
    assert errors == []
