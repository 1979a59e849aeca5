"""Episodes, states and records are ``gc=False``: proof that none of them can close a cycle.

An object the collector does not track must never be part of a reference cycle (the cycle
would leak). These types are built only of scalars, strings, lists and dicts of those and other
``gc=False`` Structs, so no path leads from one back to itself: checked on the declared
types, and on real instances after work, export, a records file round trip and install.
"""

from __future__ import annotations

import gc
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest

from ckpt_events import Telemetry
from ckpt_events.participants.protocol import EpisodeId
from ckpt_events.participants.workloads import (
    AgentWorkload,
    EnvironmentWorkload,
    Episode,
    ModelWorkload,
    ResourcesWorkload,
    Workload,
)
from ckpt_events.participants.workloads.agent import AgentState
from ckpt_events.participants.workloads.environment import EnvironmentState
from ckpt_events.participants.workloads.generation_cut import Continuation
from ckpt_events.participants.workloads.model import CallRow, GenerationCutRecord, ModelRecord, ModelState
from ckpt_events.participants.workloads.resources import ResourcesState

_SCALARS = (mi.StrType, mi.IntType, mi.FloatType, mi.BoolType, mi.NoneType, mi.BytesType, mi.LiteralType)
_ATOMS = (str, int, float, bool, bytes, type(None))
KINDS = {
    "environment": (EnvironmentWorkload, EnvironmentState),
    "agent": (AgentWorkload, AgentState),
    "resources": (ResourcesWorkload, ResourcesState),
    "model": (ModelWorkload, ModelState),
}


def type_problems(t: mi.Type, where: str, seen: set[type] | None = None) -> list[str]:
    """Why values of ``t`` could reach an object that might lead back (empty: they cannot)."""
    seen = set() if seen is None else seen
    if isinstance(t, _SCALARS):
        return []
    if isinstance(t, mi.ListType):
        return type_problems(t.item_type, f"{where}[]", seen)
    if isinstance(t, mi.DictType):
        return type_problems(t.key_type, f"{where}{{}}", seen) + type_problems(
            t.value_type, f"{where}[]", seen
        )
    if isinstance(t, mi.UnionType):
        return [p for u in t.types for p in type_problems(u, where, seen)]
    if isinstance(t, mi.StructType):
        cls = getattr(t.cls, "__origin__", t.cls)  # Episode[State] is Episode
        if t.cls in seen:
            return []
        seen.add(t.cls)
        problems = [] if cls.__struct_config__.gc is False else [f"{where}: {cls.__name__} is tracked"]
        for field in t.fields:
            problems += type_problems(field.type, f"{where}.{field.name}", seen)
        return problems
    return [f"{where}: {type(t).__name__} may hold anything"]


def instance_problems(root: object) -> list[str]:
    """Walk every object reachable from ``root``: each is an atom, a list or an untracked
    ``gc=False`` Struct, and no path returns to an object already on it."""
    problems: list[str] = []

    def walk(obj: object, path: list[int], where: str) -> None:
        if isinstance(obj, _ATOMS):
            return
        if id(obj) in path:
            problems.append(f"{where}: a cycle")
            return
        if isinstance(obj, list):
            children: list[tuple[str, Any]] = [(f"{where}[{i}]", v) for i, v in enumerate(obj)]
        elif isinstance(obj, dict):
            children = [(f"{where}{{}}", k) for k in obj] + [(f"{where}[{k!r}]", v) for k, v in obj.items()]
        elif isinstance(obj, msgspec.Struct):
            if gc.is_tracked(obj) or type(obj).__struct_config__.gc is not False:
                problems.append(f"{where}: {type(obj).__name__} is tracked")
            children = [(f"{where}.{f}", getattr(obj, f)) for f in obj.__struct_fields__]
        else:
            problems.append(f"{where}: a {type(obj).__name__}")
            return
        for child_where, child in children:
            walk(child, [*path, id(obj)], child_where)

    walk(root, [], type(root).__name__)
    return problems


class Tracked(msgspec.Struct):
    items: list[str]


class Loose(msgspec.Struct, gc=False):
    anything: list[Any]
    nested: Tracked


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_declared_types_hold_nothing_that_could_lead_back(kind):
    """The kind's record, state and episode types are gc=False all the way down."""
    workload, state = KINDS[kind]
    for t in (workload.record_type, state, Episode[state], EpisodeId):  # type: ignore[valid-type]
        assert type_problems(mi.type_info(t), t.__name__) == []


def test_the_type_check_catches_what_could_lead_back():
    """A tracked Struct, or a field that may hold anything, is reported."""
    problems = type_problems(mi.type_info(Loose), "Loose")
    assert problems == ["Loose.anything[]: AnyType may hold anything", "Loose.nested: Tracked is tracked"]


def test_the_instance_walk_catches_a_cycle_and_a_stranger():
    """A history list that holds itself, or an object of another kind, is reported."""
    state = AgentState(session_key="s", history=[])
    state.history.append(state.history)  # type: ignore[arg-type]
    assert instance_problems(state) == ["AgentState.history[0]: a cycle"]
    state = AgentState(session_key="s", history=[object()])  # type: ignore[list-item]
    assert instance_problems(state) == ["AgentState.history[0]: a object"]


def _model_record(rollout: str) -> ModelRecord:
    continuation = Continuation(staging_key="k", prefix_token_count=3, prefix_digest="d" * 64)
    cut = GenerationCutRecord(
        model_call_id=f"{rollout}-call1", request_digest="e" * 64, continuation=continuation
    )
    rows = [CallRow(call=0, tokens=16, digest="f" * 64)]
    return ModelRecord(episode_id=EpisodeId(rollout), boundary=1, steps=4, rows=rows, generation_cuts=[cut])


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_live_exported_decoded_and_installed_objects_are_untracked(kind):
    """After real work, export, a JSON round trip and install, nothing reachable is tracked
    (but lists) and nothing leads back."""
    workload_type, _ = KINDS[kind]
    options = {"model": {}, "environment": {"step_seconds": 0}, "agent": {"turn_seconds": 0}}
    source: Workload[Any, Any] = workload_type(
        Telemetry(None, kind=kind, instance="x"), **options.get(kind, {"request_seconds": 0})
    )
    ids = [EpisodeId(f"r{i}") for i in range(3)]
    for episode_id in ids:
        source.start(episode_id, 4)
        if kind != "model":  # the model's work needs an inference worker; its record is built below
            await source.advance(episode_id)
            await source.advance(episode_id)
    records = await source.export(ids) if kind != "model" else [_model_record(i.rollout_id) for i in ids]
    decoded = [msgspec.json.decode(msgspec.json.encode(r), type=source.record_type) for r in records]
    target: Workload[Any, Any] = workload_type(Telemetry(None, kind=kind, instance="y"))
    await target.install(decoded, [target.check_record(r) for r in decoded])
    objects = [*source.episodes.values(), *records, *decoded, *target.episodes.values()]
    assert len(objects) == 12
    for obj in objects:
        assert not gc.is_tracked(obj)
        assert instance_problems(obj) == []
