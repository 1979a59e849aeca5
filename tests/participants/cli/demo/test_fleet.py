"""``participants.cli.demo.fleet``: one generation's servers, checked to answer as themselves."""

from __future__ import annotations

import pytest

from ckpt_events import Bus, Telemetry
from ckpt_events.participants.cli.demo.fleet import check_members
from ckpt_events.participants.cli.demo.plan import fleet_members
from ckpt_events.participants.controller.coordinator import Coordinator, Member
from ckpt_events.participants.errors import DemoFailed
from ckpt_events.vocab import CONTROLLER_INSTANCE, Kind


async def test_a_started_server_that_discovery_does_not_find_fails_the_run() -> None:
    """A server whose port another program took first (it failed to bind; that program answers 404)
    is dropped by discovery as no participant: the demo refuses to go on without it (before, a
    fleet ran without resources-0 and every check passed)."""
    tel = Telemetry(Bus(), kind=Kind.CONTROLLER, instance=CONTROLLER_INSTANCE)
    started = {instance: f"http://127.0.0.1:{9000 + i}" for i, (_, instance) in enumerate(fleet_members(1))}
    members = [
        Member(instance, Kind(kind), instance, started[instance]) for kind, instance in fleet_members(1)
    ]
    async with Coordinator(members[:-1], token="t", telemetry=tel) as without:
        with pytest.raises(DemoFailed, match=r"resources-0 is not found at http://127\.0\.0\.1:9003"):
            check_members(without, started)
    async with Coordinator(members, token="t", telemetry=tel) as whole:
        check_members(whole, started)
