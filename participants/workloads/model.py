"""The policy model participant: generation calls streamed from an inference worker.

A call in flight when admission closes is *held*: it completes upstream, but its response
is delivered (and the boundary moved) only after resume, so held calls never block a
prepare. One generation-cut round at admission close stages the prefixes of the calls in
flight; each ends ``durable_prefix`` or ``durable_failure``, a failed round fails them all,
and a cut never blocks the checkpoint. After a restore, a cut call continues from its
staged prefix when the worker still has it (else it regenerates; tokens are deterministic).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import anyio
import msgspec

from ckpt_events import InvalidArgumentError, OperationSpan, Telemetry
from ckpt_events.participants.errors import (
    MalformedRequest,
    ParticipantCallError,
    WorkError,
    check_int,
    shown,
)
from ckpt_events.participants.protocol import EpisodeId, decode, encode
from ckpt_events.participants.replies import never_connected, read_reply
from ckpt_events.participants.workloads.base import Episode, Record, Workload
from ckpt_events.vocab import Disposition, Kind

if TYPE_CHECKING:
    import httpx

from ckpt_events.participants.workloads.generation_cut import (
    CUT_PATH,
    ActivePrefix,
    Continuation,
    CutInventory,
    CutReceipt,
    GenerateRequest,
    inventory_digest,
    receipt_problem,
)
from ckpt_events.participants.workloads.records import invalid_record

__all__ = ["CallRow", "GenerationCutRecord", "ModelRecord", "ModelState", "ModelWorkload"]

_MIN_CUT_TIMEOUT: Final = 0.05


_MAX_INFERENCE_CONNECTIONS: Final = 128
_INFERENCE_TIMEOUT: Final = 60.0


class CallRow(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, gc=False):
    """A token-free ledger row of one delivered generation call."""

    call: int
    tokens: int
    digest: str


class GenerationCutRecord(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, gc=False):
    """The cut of the call in flight at the checkpoint; ``continuation`` None for a failure."""

    model_call_id: str
    request_digest: str
    continuation: Continuation | None = None


class ModelRecord(Record, kw_only=True):
    rows: list[CallRow]
    generation_cuts: list[GenerationCutRecord]


class ModelState(msgspec.Struct, kw_only=True, gc=False):
    """A live model episode: its delivered calls, where a cut call continues, tokens reused."""

    rows: list[CallRow]
    continuation: Continuation | None = None
    resumed_prefix_tokens: int = 0


class _Call:
    __slots__ = ("admitted_at", "episode", "model_call_id", "prompt", "ticket_id")

    def __init__(self, ticket_id: int, episode: Episode[ModelState], model_call_id: str, prompt: str) -> None:
        self.ticket_id = ticket_id
        self.episode = episode
        self.model_call_id = model_call_id
        self.prompt = prompt
        self.admitted_at = time.time()


def _request_digest(prompt: str, max_tokens: int) -> str:
    return hashlib.sha256(encode({"max_tokens": max_tokens, "prompt": prompt})).hexdigest()


class ModelWorkload(Workload[ModelState, ModelRecord]):
    """Each unit of work is one generation call of ``max_tokens`` tokens."""

    kind = Kind.MODEL
    record_type = ModelRecord

    def __init__(
        self,
        tel: Telemetry,
        *,
        inference_url: str | None = None,
        inference_token: str | None = None,
        max_tokens: int = 16,
        inference_transport: httpx.AsyncBaseTransport | None = None,
        **options: Any,
    ) -> None:
        super().__init__(tel, **options)
        # httpx is imported here, not at module level: the kind registry imports every workload,
        # and `ckpt-events --help` (which reads the registry) must not load the HTTP stack.
        import httpx

        #: What a failed call to the inference worker raises (httpx's root, bound once).
        self._http_error: type[Exception] = httpx.HTTPError
        self.inference_url = inference_url
        self.max_tokens = max_tokens
        headers = {"authorization": f"Bearer {inference_token}"} if inference_token else {}
        self._client = (
            None
            if inference_url is None
            else httpx.AsyncClient(
                base_url=inference_url,
                headers=headers,
                transport=inference_transport,
                # Every in-flight generation holds a connection: httpx's default pool (100,
                # 5 s wait) turned load above 100 concurrent calls into 502s.
                limits=httpx.Limits(max_connections=_MAX_INFERENCE_CONNECTIONS),
                timeout=httpx.Timeout(_INFERENCE_TIMEOUT, pool=_INFERENCE_TIMEOUT),
            )
        )
        self._tickets = 0
        self._inflight: dict[int, _Call] = {}
        self._cuts: dict[str, GenerationCutRecord] = {}
        self._cut_counts = {"cut": 0, "cut_failed": 0}

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    def initial_state(self, episode_id: EpisodeId, steps: int) -> ModelState:
        return ModelState(rows=[])

    def blocking(self, episode: Episode[ModelState]) -> bool:
        # Our responses are delivered in one piece: nothing is ever mid-delivery, so only
        # held or undelivered calls exist, and those never block.
        return False

    async def work(self, episode: Episode[ModelState]) -> None:
        if self._client is None:
            raise WorkError("the model participant has no inference_url")
        self._tickets += 1
        call = _Call(
            self._tickets,
            episode,
            f"{episode.episode_id.rollout_id}-call{episode.boundary}",
            f"{episode.episode_id.rollout_id}:turn{episode.boundary}",
        )
        state = episode.state
        request = GenerateRequest(
            ticket_id=call.ticket_id,
            rollout_id=episode.episode_id.rollout_id,
            model_call_id=call.model_call_id,
            prompt=call.prompt,
            max_tokens=self.max_tokens,
            resume_from=state.continuation,
        )
        self._inflight[call.ticket_id] = call
        tokens: list[str] = []
        resumed = 0
        try:
            async with self._client.stream("POST", "/generate", content=encode(request)) as reply:
                if reply.status_code != 200:
                    raise WorkError(f"inference worker answered {reply.status_code}")
                # Read whole, within the bound: its lines were read as they came, unbounded (a
                # line without end took 972 MB in 6 s, endless token lines 392 MB).
                body = await read_reply(str(reply.url), reply)
            for line in body.decode("utf-8", "replace").splitlines():
                if not line:
                    continue
                item = _stream_item(line)
                if "token" in item:
                    tokens.append(item["token"])
                elif item.get("done"):
                    resumed = item.get("resumed_prefix", 0)
        except ParticipantCallError as exc:
            raise WorkError(f"inference worker {self.inference_url}: {exc.detail}") from None
        except self._http_error as exc:
            # It answered, then stopped: not "unreachable", which sends the operator to its URL.
            said = "unreachable" if never_connected(exc) else "no whole reply"
            raise WorkError(f"inference worker {self.inference_url} {said}: {exc}") from None
        finally:
            del self._inflight[call.ticket_id]
        if not self.admission_open:
            # Held: delivered after resume; a held call never blocks the checkpoint.
            episode.status = "held"
            self._notify()
            await self.wait_reopened()
        state.rows.append(
            CallRow(
                call=episode.boundary,
                tokens=len(tokens),
                digest=hashlib.sha256(" ".join(tokens).encode()).hexdigest(),
            )
        )
        state.continuation = None
        state.resumed_prefix_tokens += resumed

    async def on_admission_closed(self, op: OperationSpan, checkpoint_id: str, deadline_ts: float) -> None:
        calls = sorted(self._inflight.values(), key=lambda c: c.ticket_id)
        self._cuts = {}
        with op.step("generation_cut") as step:
            receipt = await self._cut_round(checkpoint_id, calls, deadline_ts, op) if calls else None
            acks = {} if receipt is None else {a.ticket_id: a for a in receipt.prefixes}
            durable = 0
            failed = 0
            for call in calls:
                ack = acks.get(call.ticket_id)
                continuation = None
                if ack is not None and ack.disposition is Disposition.DURABLE_PREFIX:
                    assert ack.prefix_token_count is not None and ack.prefix_digest is not None
                    continuation = Continuation(
                        staging_key=ack.staging_keys[0],
                        prefix_token_count=ack.prefix_token_count,
                        prefix_digest=ack.prefix_digest,
                    )
                    durable += 1
                else:
                    failed += 1
                self._cuts[call.episode.key] = GenerationCutRecord(
                    model_call_id=call.model_call_id,
                    request_digest=_request_digest(call.prompt, self.max_tokens),
                    continuation=continuation,
                )
            step.set(calls=len(calls), cut_durable_prefix=durable, cut_durable_failure=failed)
        self._cut_counts = {"cut": durable, "cut_failed": failed}
        if durable:
            self.tel.generation_cut(Disposition.DURABLE_PREFIX, durable, checkpoint_id=checkpoint_id)
        if failed:
            self.tel.generation_cut(Disposition.DURABLE_FAILURE, failed, checkpoint_id=checkpoint_id)

    async def _cut_round(
        self, checkpoint_id: str, calls: list[_Call], deadline_ts: float, op: OperationSpan
    ) -> CutReceipt | None:
        """One round with our backend; None (every call ``durable_failure``) if it fails in any way."""
        if self._client is None:
            return None
        prefixes = [
            ActivePrefix(
                ticket_id=c.ticket_id,
                rollout_id=c.episode.episode_id.rollout_id,
                attempt=c.episode.episode_id.attempt,
                model_call_id=c.model_call_id,
                admitted_at=c.admitted_at,
            )
            for c in calls
        ]
        server = self.tel.instance
        inventory = CutInventory(
            checkpoint_id=checkpoint_id,
            server_name=server,
            active_prefixes=prefixes,
            inventory_digest=inventory_digest(checkpoint_id, server, prefixes),
        )
        # Half the time left, so a slow worker still leaves the prepare time to answer.
        timeout = max((deadline_ts - time.time()) / 2, _MIN_CUT_TIMEOUT)
        try:
            with anyio.fail_after(timeout):
                # The worker joins the checkpoint's trace through the prepare span.
                traceparent = op.traceparent()
                headers = {} if traceparent is None else {"traceparent": traceparent}
                tracestate = op.tracestate()
                if tracestate is not None:
                    headers["tracestate"] = tracestate
                async with self._client.stream(
                    "POST", CUT_PATH, content=encode(inventory), headers=headers
                ) as reply:
                    if reply.status_code != 200:
                        return None
                    # Bounded: read whole, a 300 MB receipt took 605 MB of the participant.
                    body = await read_reply(str(reply.url), reply)
            receipt = decode(body, CutReceipt)
        except (self._http_error, TimeoutError, MalformedRequest, ParticipantCallError):
            return None
        return None if receipt_problem(inventory, receipt) is not None else receipt

    def counts(self) -> dict[str, int]:
        held = self.episodes.count("held")
        return {"inflight": len(self._inflight), "held": held, **self._cut_counts, "cut_skipped": 0}

    def to_record(self, episode: Episode[ModelState]) -> ModelRecord:
        cut = self._cuts.get(episode.key)
        return ModelRecord(
            episode_id=episode.episode_id,
            boundary=episode.boundary,
            steps=episode.steps,
            rows=list(episode.state.rows),
            generation_cuts=[] if cut is None else [cut],
        )

    def commit_extras(self, keys: Sequence[str]) -> dict[str, Any]:
        chosen = set(keys)  # once, not once per cut
        staging = [
            c.continuation.staging_key
            for k, c in self._cuts.items()
            if k in chosen and c.continuation is not None
        ]
        return {"staging_keys": sorted(staging)}

    def from_record(self, record: ModelRecord) -> ModelState:
        if len(record.rows) != record.boundary or len(record.generation_cuts) > 1:
            raise invalid_record(record, "rows or cuts do not match boundary")
        cut = record.generation_cuts[0] if record.generation_cuts else None
        return ModelState(rows=list(record.rows), continuation=None if cut is None else cut.continuation)

    def describe(self, episode: Episode[ModelState]) -> dict[str, Any]:
        state = episode.state
        return {
            "calls": len(state.rows),
            "rows": [msgspec.to_builtins(r) for r in state.rows],
            "continuation": msgspec.to_builtins(state.continuation),
            "resumed_prefix_tokens": state.resumed_prefix_tokens,
        }


def _stream_item(line: str) -> dict[str, Any]:
    """One line of the worker's stream; anything malformed is a ``WorkError`` (502)."""
    try:
        item = msgspec.json.decode(line)
    except msgspec.MsgspecError:
        raise WorkError(f"inference worker sent a malformed line: {line[:80]!r}") from None
    if not isinstance(item, dict):
        raise WorkError(f"inference worker sent a line that is not an object: {line[:80]!r}")
    if "token" in item and not isinstance(item["token"], str):
        raise WorkError("inference worker sent a token that is not a string")
    resumed = item.get("resumed_prefix", 0)
    try:
        check_int(resumed, "resumed_prefix must be an int >= 0")
    except InvalidArgumentError:  # the worker's line, not our caller's argument: upstream's fault
        raise WorkError(f"inference worker sent resumed_prefix {shown(resumed)}") from None
    return item
