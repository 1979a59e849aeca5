"""``load.cores_apart``: the driver pinned apart from the servers, its affinity given back."""

from __future__ import annotations

import os

import pytest

from ckpt_events.benchmarks.load import cores_apart


def test_cores_apart_pins_the_driver_and_gives_its_affinity_back() -> None:
    before = os.sched_getaffinity(0)
    with pytest.raises(RuntimeError, match="inside"), cores_apart() as cores:
        if len(before) < 2:
            assert cores is None
            assert os.sched_getaffinity(0) == before
        else:
            assert cores is not None
            server, driver = cores
            assert server != driver and {server, driver} <= before
            assert os.sched_getaffinity(0) == {driver}
        raise RuntimeError("inside")  # an error in the block gives the affinity back too
    assert os.sched_getaffinity(0) == before
