"""One worker of a multi-worker server: its share of the episodes, reached over frames.

``run_worker`` connects to the coordinator's socket, says ``hello`` (its index), takes the
server's state (admission, retired marks: a worker that joins late gets every mark) and
then answers the coordinator's messages with its own ``Workload`` until the socket ends.
Its share of a checkpoint (``closed``: prepare, ``export``: commit, ``install``: restore,
``retire``) runs as a child span of the coordinator's operation span: the frame carries the
coordinator's traceparent, and the worker's ``Telemetry`` names the worker (``worker=index``).
"""

from __future__ import annotations

import os
from typing import Any, Final

import anyio
import msgspec

from ckpt_events import Operation, OperationSpan
from participants.protocol import EpisodeId
from participants.server.routes import episode_view
from participants.server.workers.channel import FrameChannel, UnknownKind
from participants.server.workers.frames import DEFAULT_MAX_FRAME, Message
from participants.workloads.base import Episode, Workload

__all__ = ["INLINE_KINDS", "WorkerHost", "run_worker"]

#: Kinds a worker handles in arrival order (quick, and their order matters).
INLINE_KINDS: Final = frozenset(
    {"start", "get", "close_admission", "open_admission", "export", "stop", "install", "mark", "forget"}
)
_REPORT_WAIT_CAP: Final = 0.5


def _episode_id(body: Any) -> EpisodeId:
    return EpisodeId(str(body["rollout_id"]), int(body["attempt"]))


class WorkerHost:
    """Answers the coordinator's messages with ``workload`` (worker ``index`` of the server)."""

    def __init__(self, workload: Workload[Any, Any], index: int) -> None:
        self.workload = workload
        self.index = index
        self._records = msgspec.json.Decoder(workload.record_type)
        self._encoder = msgspec.json.Encoder()

    def apply_state(self, state: Any) -> None:
        """The server's state from the coordinator's ``hello`` reply."""
        for rollout_id, attempt in dict(state.get("marks", {})).items():
            self.workload.fence.mark(EpisodeId(rollout_id, int(attempt)))
        if state.get("admission_open", True):
            self.workload.open_admission()
        else:
            self.workload.close_admission()

    def _view(self, episode: Episode[Any]) -> dict[str, Any]:
        return {**episode_view(self.workload, episode), "worker": self.index}

    def _share(self, operation: Operation, body: Any, message: Message) -> OperationSpan:
        """This worker's share of a coordinator operation: a child of it (the frame's traceparent)."""
        cid = body.get("checkpoint_id")
        return self.workload.tel.operation(
            operation, checkpoint_id=None if cid is None else str(cid), traceparent=message.traceparent
        )

    def _report(self) -> Any:
        return msgspec.to_builtins(self.workload.report())

    async def handle(self, message: Message) -> Any:
        body = message.body if message.body is not None else {}
        kind = message.kind
        wl = self.workload
        if kind == "start":
            episode = wl.start(_episode_id(body), int(body["steps"]))
            return {"capture_key": episode.key, "boundary": episode.boundary}
        if kind == "advance":
            try:
                episode = await wl.advance(_episode_id(body))
            except LookupError:
                return None
            return {"boundary": episode.boundary, "done": episode.done}
        if kind == "get":
            found = wl.get(str(body["key"]))
            return None if found is None else self._view(found)

        if kind == "close_admission":
            wl.close_admission()
            return None
        if kind == "open_admission":
            wl.open_admission()
            return None
        if kind == "closed":
            cid = str(body["checkpoint_id"])
            with wl.tel.operation(
                Operation.PREPARE, checkpoint_id=cid, traceparent=message.traceparent
            ) as op:
                await wl.on_admission_closed(op, cid, float(body["deadline_ts"]))
                report = wl.report()
                op.set(blockers=report.blocker_count)
            return msgspec.to_builtins(report)
        if kind == "report":
            if not wl.report().ready:
                await wl.wait_changed(min(float(body.get("wait", 0.0)), _REPORT_WAIT_CAP))
            return self._report()
        if kind == "export":
            scope = body.get("scope")
            ids = None if scope is None else [EpisodeId(r, int(a)) for r, a in scope]
            with self._share(Operation.COMMIT, body, message) as op, op.step("export") as step:
                records = await wl.export(ids)
                keys = [r.episode_id.capture_key for r in records]
                lines = [self._encoder.encode(r) for r in records]
                step.set(records=len(lines))
                op.set(records=len(lines), bytes=sum(map(len, lines)))
            return {"lines": lines, "extras": wl.commit_extras(keys)}
        if kind == "stop":
            wl.stop([str(k) for k in body["keys"]])
            return None
        if kind == "install":
            with self._share(Operation.RESTORE, body, message) as op, op.step("install") as step:
                records = [self._records.decode(line) for line in body["lines"]]
                states = [wl.check_record(r) for r in records]
                wl.close_admission()
                step.set(records=len(records))
                op.set(records=len(records))
                return await wl.install(records, states)
        if kind == "retire":
            with self._share(Operation.RETIRE, body, message):
                return await wl.retire([EpisodeId(r, int(a)) for r, a in body["episode_ids"]])
        if kind == "mark":
            wl.fence.mark(_episode_id(body))
            return None
        if kind == "forget":
            wl.fence.forget(str(body["rollout_id"]))
            return None
        raise UnknownKind(kind)


async def run_worker(
    socket_path: str, index: int, workload: Workload[Any, Any], *, max_frame: int = DEFAULT_MAX_FRAME
) -> None:
    """Serve as worker ``index`` until the coordinator's socket ends."""
    host = WorkerHost(workload, index)
    stream = await anyio.connect_unix(socket_path)
    channel = FrameChannel(
        stream, host.handle, name=f"worker {index}", inline=INLINE_KINDS, max_frame=max_frame
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(channel.run)
        try:
            state = await channel.request("hello", {"index": index, "pid": os.getpid()}, timeout=10.0)
            host.apply_state(state)
            await channel.wait_closed()
        finally:
            tg.cancel_scope.cancel()
            await workload.aclose()
