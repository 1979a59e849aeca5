"""The kind registry: the only list of participant kinds, and a toy row runs end to end from it."""

from __future__ import annotations

import ast
import io
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from rich.console import Console

from ckpt_events import Bus, InvalidArgumentError, Telemetry
from ckpt_events.participants import create_app
from ckpt_events.participants.cli.fleet import local_fleet
from ckpt_events.participants.cli.report.html import html_page
from ckpt_events.participants.cli.report.terminal import render
from ckpt_events.participants.controller.coordinator import Coordinator
from ckpt_events.participants.controller.types import Member
from ckpt_events.participants.kinds import PREPARE_ORDER
from ckpt_events.participants.protocol import EpisodeId
from ckpt_events.participants.workloads.base import Episode, Record, Workload
from ckpt_events.participants.workloads.registry import KINDS, KindRegistry, KindRow
from ckpt_events.testing import capture_events
from ckpt_events.vocab import Kind
from tests.participants.helpers import AUTH, TOKEN

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[3]
REGISTRY = REPO / "participants" / "workloads" / "registry.py"
ORDER = REPO / "participants" / "kinds.py"
KIND_NAMES = frozenset(KINDS.names)
KIND_MEMBERS = frozenset(k.name for k in PREPARE_ORDER)


def _names_kind(node: ast.expr) -> bool:
    """A literal ``"model"`` or an attribute ``Kind.MODEL`` (any participant kind)."""
    if isinstance(node, ast.Constant):
        return node.value in KIND_NAMES
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "Kind"
        and node.attr in KIND_MEMBERS
    )


def _kind_lists(path: Path, root: Path = REPO) -> list[str]:
    """``file:line`` of every literal tuple, list, set or dict naming two or more kinds anywhere
    inside it (so a tuple of ``(kind, instance)`` pairs counts, as does a dict keyed by kind)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict):
            if sum(isinstance(n, ast.expr) and _names_kind(n) for n in ast.walk(node)) >= 2:
                found.add((node.lineno, f"{path.relative_to(root)}:{node.lineno}"))
    return [where for _, where in sorted(found)]


def test_the_registry_is_the_only_list_of_kinds() -> None:
    """No tuple, list, set or dict in participants/ or benchmarks/ names two kinds, but the registry
    (what runs each kind) and the order rule (``participants/kinds.py``: the controller's, which
    imports no workload, so it cannot derive from the registry's rows)."""
    sources = sorted((REPO / "participants").rglob("*.py")) + sorted((REPO / "benchmarks").rglob("*.py"))
    assert REGISTRY in sources and ORDER in sources and len(sources) > 50
    assert len(_kind_lists(REGISTRY)) == 1  # the scan sees the one table: the registry's rows
    assert len(_kind_lists(ORDER)) == 3  # PREPARE_ORDER, RETIRE_GROUPS and its last group
    offenders = [where for path in sources if path not in (REGISTRY, ORDER) for where in _kind_lists(path)]
    assert offenders == [], f"kinds listed outside participants/workloads/registry.py: {offenders}"


def test_the_scan_finds_a_kind_list(tmp_path: Path) -> None:
    """The scan is not blind: a members tuple of pairs and a dict keyed by kind are both reported."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        'M = (\n    ("environment", "environment-0"),\n    ("model", "m"),\n)\n'
        "C = {Kind.AGENT: 1, Kind.MODEL: 2}\n"
        'N = ("environment", "instance")\n'
    )
    assert _kind_lists(probe, tmp_path) == ["probe.py:1", "probe.py:5"]


def test_rows_are_in_the_coordinators_stage_order() -> None:
    """The registry's order is the prepare order the coordinator (and the core) use."""
    assert tuple(row.kind for row in KINDS) == PREPARE_ORDER
    assert KINDS.members() == tuple((k.value, f"{k.value}-0") for k in PREPARE_ORDER)
    assert [row.kind for row in KINDS if row.uses_inference] == [Kind.MODEL]


def test_registry_refuses_unknown_and_duplicate_kinds() -> None:
    """An unknown kind names the known ones; two rows of one kind are refused."""
    with pytest.raises(
        InvalidArgumentError, match="kind must be one of environment, model, agent, resources"
    ):
        KINDS["controller"]
    with pytest.raises(InvalidArgumentError, match="kind must be one of .*, not 'judge'"):
        KINDS["judge"]  # a valid kind, not one of the registry's
    row = KINDS["agent"]
    with pytest.raises(InvalidArgumentError, match="'agent' has two rows"):
        KindRegistry([row, row])
    with pytest.raises(InvalidArgumentError, match="kind must be one of"):
        create_app("controller", instance="c-0", token=TOKEN)


class ToyRecord(Record, kw_only=True):
    """A toy episode's saved state: how many beeps so far."""

    beeps: int


class ToyState(msgspec.Struct, kw_only=True):
    beeps: int


class ToyWorkload(Workload[ToyState, ToyRecord]):
    """A kind that only counts its steps, served under the resources slot."""

    kind = Kind.RESOURCES
    record_type = ToyRecord

    def initial_state(self, episode_id: EpisodeId, steps: int) -> ToyState:
        return ToyState(beeps=0)

    async def work(self, episode: Episode[ToyState]) -> None:
        episode.state.beeps += 1

    def to_record(self, episode: Episode[ToyState]) -> ToyRecord:
        return ToyRecord(
            episode_id=episode.episode_id,
            boundary=episode.boundary,
            steps=episode.steps,
            beeps=episode.state.beeps,
        )

    def from_record(self, record: ToyRecord) -> ToyState:
        return ToyState(beeps=record.beeps)

    def describe(self, episode: Episode[ToyState]) -> dict[str, Any]:
        return {"beeps": episode.state.beeps}


TOY_COLOUR = "#ff00aa"
TOY = KindRegistry([KindRow(Kind.RESOURCES, ToyWorkload, instance="toy-0", colour=TOY_COLOUR)])


async def test_a_toy_row_is_served_checkpointed_and_drawn(tmp_path: Path) -> None:
    """A registry with a toy row: the fleet serves its workload, a checkpoint commits its records,
    and both reports draw it in the row's colour."""
    async with capture_events() as (bus, events):
        async with local_fleet(token=TOKEN, bus=bus, kinds=TOY, checkpoint_root=tmp_path) as urls:
            assert list(urls) == ["toy-0"]  # the members came from the toy registry
            async with httpx.AsyncClient(base_url=urls["toy-0"], headers=AUTH) as client:
                for rollout in ("r1", "r2"):
                    reply = await client.post("/work/start", json={"rollout_id": rollout, "steps": 3})
                    assert reply.status_code == 200, reply.text
                    assert (
                        await client.post("/work/advance", json={"rollout_id": rollout})
                    ).status_code == 200
                assert (await client.get("/work/r1")).json()["state"] == {"beeps": 1}
                tel = Telemetry(bus, kind="controller", instance="coordination")
                member = Member(name="toy-0", kind=Kind.RESOURCES, instance="toy-0", url=urls["toy-0"])
                async with Coordinator([member], token=TOKEN, telemetry=tel) as coordinator:
                    _, commits = await coordinator.checkpoint(
                        "toy-1", str(tmp_path / "ckpt"), deadline_ts=time.time() + 30
                    )
    assert commits["toy-0"].manifest.record_count == 2
    saved = [p for p in (tmp_path / "ckpt").rglob("*") if p.is_file()]
    assert any(b'"beeps":1' in p.read_bytes() for p in saved)
    out = io.StringIO()
    render(Console(file=out, width=160, force_terminal=True, color_system="truecolor"), events, kinds=TOY)
    assert "38;2;255;0;170" in out.getvalue() and "toy-0" in out.getvalue()
    page = html_page(events, title="toy", kinds=TOY)
    assert f'fill="{TOY_COLOUR}"' in page and "toy-0" in page
    assert KINDS["resources"].colour not in page  # the default row's colour is not used


def test_a_toy_app_runs_the_rows_workload() -> None:
    """``create_app(kinds=...)`` runs the row's workload; the default registry does not know it."""
    app = create_app("resources", instance="toy-0", token=TOKEN, bus=Bus(), kinds=TOY)
    assert type(app.state.workload) is ToyWorkload
    assert (
        type(create_app("resources", instance="r-0", token=TOKEN, bus=Bus()).state.workload)
        is not ToyWorkload
    )


class _NoHooks(Workload[ToyState, ToyRecord]):
    """A user's workload that fills in none of the hooks."""

    kind = "judge"


class _CoordinatorsKind(ToyWorkload):
    """A user's workload named as the coordinator."""

    kind = Kind.CONTROLLER


@pytest.mark.parametrize(
    ("kind", "workload", "fragment"),
    [
        # Was served: /status said kind 'controller', and discovery refused it only later.
        (Kind.CONTROLLER, _CoordinatorsKind, "kind 'controller' is the coordinator's: name"),
        # Was served with spans of kind 'critic' and a /status (so a stage) of kind 'resources'.
        (
            "critic",
            ToyWorkload,
            "the critic row's workload ToyWorkload serves kind 'resources': set kind = 'critic'",
        ),
        # Was served; every work call and commit then failed with a bare NotImplementedError.
        ("judge", _NoHooks, "does not define initial_state, work, to_record, from_record, record_type"),
        # Was a TypeError ("'str' object is not callable") at create_app.
        ("judge", "ToyWorkload", "the judge row's workload must be a Workload class, not 'ToyWorkload'"),
    ],
)
def test_a_row_that_cannot_be_served_is_refused_where_it_is_made(
    kind: str, workload: Any, fragment: str
) -> None:
    """A row of the coordinator's kind, of a workload serving another kind, or of a workload
    missing its hooks is refused when it is built, in one line naming the fix."""
    with pytest.raises(InvalidArgumentError, match=fragment):
        KindRow(kind, workload, instance="x-0", colour=TOY_COLOUR)
