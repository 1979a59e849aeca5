"""A participant as a FastAPI app: the control plane, the checkpoint store, the work routes.

``create_app(kind, ...)`` builds one participant around a workload; ``control.ControlPlane``
runs the checkpoint protocol (phases, lease, fencing); ``store`` writes and verifies the
on-disk checkpoint; ``inference`` is the simulated inference worker the model participant
calls. The server uses ``participants.protocol`` and ``participants.workloads``, never the
controller or the command line.
"""

from ckpt_events.participants.server.app import PARTICIPANT_KINDS, create_app
from ckpt_events.participants.server.inference import create_inference_app

__all__ = ["PARTICIPANT_KINDS", "create_app", "create_inference_app"]
