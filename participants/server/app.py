"""``create_app``: one participant kind as a FastAPI app, with its bus from the lifespan."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from fastapi import FastAPI

from ckpt_events import Bus, InvalidTypeError, InvalidValueError, Telemetry
from ckpt_events.participants.errors import check_int, check_number, shown
from ckpt_events.participants.faults import NO_FAULTS, FaultPlan, hold_one_step
from ckpt_events.participants.server.builder import build_app
from ckpt_events.participants.server.control import ControlPlane
from ckpt_events.participants.server.limits import DEFAULT_MAX_BODY_BYTES
from ckpt_events.participants.server.routes import work_router
from ckpt_events.participants.server.store_files import DEFAULT_CHECKPOINT_ROOT, RECORDS_MAX_BYTES
from ckpt_events.participants.server.work import LocalWork
from ckpt_events.participants.workloads.base import Workload
from ckpt_events.participants.workloads.fence import DEFAULT_MAX_RETIRED, DEFAULT_RETIRED_SECONDS
from ckpt_events.participants.workloads.registry import KINDS, KindRegistry, check_registry
from ckpt_events.vocab import SAFE_NAME

__all__ = ["PARTICIPANT_KINDS", "create_app", "make_workload"]

#: The kinds ``create_app`` accepts by default (``KINDS``), in prepare order.
PARTICIPANT_KINDS: Final = KINDS.names


def make_workload(
    kind: str, tel: Telemetry, *, kinds: KindRegistry = KINDS, **options: Any
) -> Workload[Any, Any]:
    """A workload of participant ``kind`` (a row of ``kinds``) on ``tel`` (what a worker process runs)."""
    return check_registry(kinds)[kind].workload(tel, **options)


def create_app(
    kind: str,
    *,
    instance: str,
    token: str,
    bus: Bus | None = None,
    configure_sinks: Callable[[Bus], Any] | None = None,
    lease_grace_seconds: float = 600.0,
    inference_url: str | None = None,
    inference_token: str | None = None,
    sample_ratio: float = 1.0,
    otel_context: bool = False,
    workers: int = 1,
    worker_command: Callable[[int], Any] | None = None,
    worker_factory: Callable[[int], Workload[Any, Any]] | None = None,
    checkpoint_root: str | os.PathLike[str] = DEFAULT_CHECKPOINT_ROOT,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_records_bytes: int = RECORDS_MAX_BYTES,
    max_retired_marks: int = DEFAULT_MAX_RETIRED,
    retired_mark_seconds: float = DEFAULT_RETIRED_SECONDS,
    kinds: KindRegistry = KINDS,
    worker_host: str = "127.0.0.1",
    on_workers_spent: Callable[[str], None] | None = None,
    faults: FaultPlan = NO_FAULTS,
    **workload_options: Any,
) -> FastAPI:
    """A participant of ``kind``: one of ``kinds`` (by default ``KINDS``: environment, model,
    agent or resources), running that row's workload.

    With ``bus`` the app uses it as is (the caller started it). Without, the app's lifespan
    creates a ``Bus``, enters it, calls ``configure_sinks(bus)`` (its result's ``aclose()``,
    if any, is awaited at shutdown) and closes both at shutdown. The lifespan also runs the
    lease watcher; run it (uvicorn does; in tests ``app.router.lifespan_context(app)``).
    Without the lifespan an expired lease is still noticed at the next control call.
    ``inference_url``/``inference_token`` are for kinds whose row ``uses_inference`` (the
    model); other kinds ignore them.
    ``workload_options`` go to the kind's workload (e.g. ``step_seconds``).
    ``token`` guards both the control plane and the work API. Requests' ``checkpoint_dir``
    must lie under ``checkpoint_root`` (fixed here; relative to the working directory when
    relative, by default ``./ckpt-events-checkpoints``). Request bodies over ``max_body_bytes``
    are refused with 413, records files over ``max_records_bytes`` are not read.
    Retired marks (the fence that refuses a retired attempt as ``stale_attempt``) are kept at
    most ``max_retired_marks`` (the oldest go first; default 100,000: keep it above the
    largest restore, which marks every rollout it installs) and at most
    ``retired_mark_seconds`` after their rollout was last retired (default 3600; ``math.inf``:
    no limit); ``GET /status`` shows their count and the newest 100 (``RetiredAttempts``).
    ``sample_ratio`` and ``otel_context`` go to the participant's ``Telemetry``
    (``otel_context``: operations join the current OpenTelemetry span, e.g. FastAPI
    instrumentation's SERVER span). With ``workers`` > 1 the episodes live in worker processes
    started by ``worker_command(index)`` (or tasks made by ``worker_factory(index)``): see
    ``ckpt_events.participants.server.workers``; each worker process also serves its sessions' work
    calls on its own port, bound on ``worker_host``; a spent restart budget is a blocker of
    every later prepare, and calls ``on_workers_spent(why)`` (see ``create_worker_app``).
    ``faults`` is what is injected (``ckpt_events.participants.faults``; ``NO_FAULTS``: nothing):
    the app and its worker tasks take it as is, worker processes read their own at start-up.
    """
    row = check_registry(kinds)[kind]
    participant_kind = row.kind
    _check_arguments(instance, token, max_body_bytes, max_records_bytes, lease_grace_seconds)
    own_bus = bus is None
    the_bus = Bus() if bus is None else bus
    tel = Telemetry(
        the_bus,
        kind=participant_kind,
        instance=instance,
        sample_ratio=sample_ratio,
        otel_context=otel_context,
    )
    if row.uses_inference:
        workload_options = {
            "inference_url": inference_url,
            "inference_token": inference_token,
            **workload_options,
        }
    workload = row.workload(tel, **workload_options)
    workload.fence.retain(max_marks=max_retired_marks, max_age_seconds=retired_mark_seconds)
    hold_one_step(workload, instance, faults)  # only with a stall:<instance> fault
    if workers != 1:
        from ckpt_events.participants.server.workers.app import create_worker_app

        app = create_worker_app(
            workload,
            token=token,
            workers=workers,
            own_bus=own_bus,
            configure_sinks=configure_sinks,
            lease_grace_seconds=lease_grace_seconds,
            worker_command=worker_command,
            worker_factory=worker_factory,
            checkpoint_root=Path(checkpoint_root).absolute(),
            max_records_bytes=max_records_bytes,
            max_body_bytes=max_body_bytes,
            worker_host=worker_host,
            on_workers_spent=on_workers_spent,
            faults=faults,
        )
        # The whole server's marks live in the pool's own fence, made by create_worker_app.
        app.state.workload.fence.retain(max_marks=max_retired_marks, max_age_seconds=retired_mark_seconds)
        return app
    plane: ControlPlane[Any] = ControlPlane(
        tel,
        workload,
        lease_grace_seconds=float(lease_grace_seconds),
        checkpoint_root=Path(checkpoint_root).absolute(),
        max_records_bytes=max_records_bytes,
        faults=faults,
    )
    return build_app(
        title=f"ckpt-events {participant_kind} participant {instance}",
        tel=tel,
        plane=plane,
        work=workload,
        work_router=work_router(LocalWork(workload), token),
        token=token,
        max_body_bytes=max_body_bytes,
        bus=the_bus,
        own_bus=own_bus,
        configure_sinks=configure_sinks,
    )


def _check_arguments(
    instance: object,
    token: object,
    max_body_bytes: object,
    max_records_bytes: object,
    lease_grace_seconds: object,
) -> None:
    """``create_app``'s checks of what it is given, each a precise error."""
    if not isinstance(instance, str):
        raise InvalidTypeError(f"instance {shown(instance)} is not 1-128 characters of [A-Za-z0-9._-]")
    if SAFE_NAME.fullmatch(instance) is None:
        raise InvalidValueError(f"instance {shown(instance)} is not 1-128 characters of [A-Za-z0-9._-]")
    if not isinstance(token, str):
        raise InvalidTypeError("a participant needs a non-empty control token")
    if not token:
        raise InvalidValueError("a participant needs a non-empty control token")
    if not (token.isascii() and token.isprintable()) or token != token.strip():
        raise InvalidValueError("the control token must be printable ASCII without surrounding spaces")
    for name, bound in (("max_body_bytes", max_body_bytes), ("max_records_bytes", max_records_bytes)):
        check_int(bound, f"{name} must be a positive int, not {shown(bound)}", minimum=1)
    # Finite too: at most the largest float.
    grace = f"lease_grace_seconds must be > 0, not {shown(lease_grace_seconds)}"
    check_number(lease_grace_seconds, grace, low_open=True, high=sys.float_info.max)
