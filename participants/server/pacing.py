"""How often a waiting prepare computes readiness: the control plane's wait at N = 1, and each
worker's answer to the server's ``Report`` rounds at N > 1.

Readiness is computed again no sooner than ``PACE_FACTOR`` times what the last computation
took, after it (so it costs at most ~1/11 of a core), and never more than ``PACE_MAX``
seconds later: readiness is answered at most that late. Unpaced, it ran on every episode
change: 100,000 episodes finishing over 20 s cost 1,962 reports (8.8 ms each), 91 % of a core
beside the workload's 33 %, and held the loop up to 229 ms; a worker answering the server's
rounds back to back spent 62-68 % of its loop on them at 20,000-50,000 changing episodes.
"""

from __future__ import annotations

import time
from typing import Final

from ckpt_events.participants.protocol import PrepareReport
from ckpt_events.participants.workloads.checkpointable import ControlledWorkload

__all__ = ["PACE_FACTOR", "PACE_MAX", "timed_report"]

PACE_FACTOR: Final = 10.0
PACE_MAX: Final = 0.2


def timed_report(workload: ControlledWorkload) -> tuple[PrepareReport, float]:
    """``workload``'s readiness now, and the earliest ``perf_counter`` to compute it again."""
    began = time.perf_counter()
    report = workload.report()
    done = time.perf_counter()
    return report, done + min((done - began) * PACE_FACTOR, PACE_MAX)
