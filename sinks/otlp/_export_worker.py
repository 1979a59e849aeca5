"""``ExportWorker``: the export thread both OTLP sinks run, and what they keep about it alike.

One daemon thread per sink; the condition its loop sleeps on (each sink guards its own queue or
totals with it too, so one lock covers a sink's state and these counters); the counters every
OTLP export has (items exported and dropped, requests accepted and failed, retries); the one
warning a failing collector gets; and a stop bounded by a deadline whatever the collector does.
What differs stays in each sink: the span sink's queue with its linger, the metric sink's
interval timer and cumulative totals.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from typing import Final

import anyio.to_thread

from ckpt_events._errors import check_number, shown
from ckpt_events._logs import library_logger, said_in_log
from ckpt_events.sinks.otlp._endpoint import safe_url
from ckpt_events.sinks.otlp._http import MAX_TIMEOUT_S, OtlpHttpSender

__all__ = ["ExportWorker", "timeout_or"]

logger: Final = library_logger("ckpt_events.sinks.otel")


def timeout_or(timeout: float | None, default: float) -> float:
    """A ``shutdown``'s or flush's ``timeout`` (``None``: ``default``), checked before anything
    stops: a real number of seconds, at most ``MAX_TIMEOUT_S`` (a negative one is none left).
    ``shutdown("1")``, ``shutdown(nan)`` or ``shutdown(1e300)`` raised a bare TypeError, ValueError
    or OverflowError half-way through, the export thread sometimes left running."""
    if timeout is None:
        return default
    message = f"timeout must be seconds, at most {MAX_TIMEOUT_S:g}, or None; not {shown(timeout)}"
    return max(check_number(timeout, message, low=-math.inf, high=MAX_TIMEOUT_S), 0.0)


class ExportWorker:
    """One export thread posting through ``sender``, its condition and its counters.

    ``signal`` (``"span"``, ``"metric"``) and ``lost`` (what happens to what was not sent, and
    where it is counted) make the one warning logged at the first failure; ``unit`` names what
    a collector's partial success rejects (``"spans"``, ``"data points"``). Every counter and
    ``closed`` are read and written under ``wake``.
    """

    def __init__(
        self,
        sender: OtlpHttpSender,
        *,
        name: str,
        signal: str,
        lost: str,
        unit: str = "items",
        counted_in: str = "stats()",
        dropped_unit: str | None = None,
    ) -> None:
        self.sender = sender
        self.name = name
        self.wake = threading.Condition()
        self.closed = False  # the loop returns at its next wake-up; the sink takes no more
        self.exported = 0
        self.dropped = 0
        self.exports = 0
        self.failures = 0
        self.retries = 0
        #: Items the collector took the request of but rejected (its partial success); also in
        #: ``dropped`` when the caller counts items.
        self.rejected = 0
        #: How the latest failed export failed ("answered 404", "got no answer", "raised ..."),
        #: for a caller's own one-line message; ``None`` while none has.
        self.last_failure: str | None = None
        self.abandoned = False  # stop gave up on the batch in flight and counted it as dropped
        self._signal = signal
        self._lost = lost
        self._unit = unit
        self._counted_in = counted_in
        self._dropped_unit = unit if dropped_unit is None else dropped_unit
        self._logged_failure = False
        self._thread: threading.Thread | None = None
        self._owner = os.getpid()  # the process whose thread exports
        self._said_forked = False

    def start(self, loop: Callable[[], None]) -> None:
        """Run ``loop`` in the worker thread; it returns once it sees ``closed``."""
        self._owner = os.getpid()
        self._thread = threading.Thread(target=loop, name=self.name, daemon=True)
        self._thread.start()

    def dropped_in_fork(self, items: int) -> bool:
        """In a process forked from the one that started the thread, count ``items`` as dropped,
        warn once and return True; else False. A fork copies no thread: configure() at import
        under ``gunicorn --preload`` queued every worker's spans where nothing sent them (400 of
        400 lost), said only at shutdown as "dropped in all", with no cause. They are not sent
        from here either: the resource (``service.instance.id``) is the parent's, so every
        worker's spans and cumulative metrics would read as one process's."""
        if os.getpid() == self._owner:
            return False
        with self.wake:
            self.dropped += items
            first = not self._said_forked
            self._said_forked = True
        if first:
            logger.warning(
                "OTLP %s export to %s: this process (pid %d) was forked from the one that "
                "configured it (pid %d), whose export thread does not run here; its %s here are "
                "dropped, counted in %s: call "
                "configure() in each process after the fork (instrument() does it in each "
                "worker's lifespan; not at import under gunicorn --preload)",
                self._signal,
                self.sender.shown_url,
                os.getpid(),
                self._owner,
                self._dropped_unit,
                self._counted_in,
            )
        return True

    def is_alive(self) -> bool:
        """Whether the thread runs (a loop that raised has ended)."""
        return self._thread is not None and self._thread.is_alive()

    def send(self, body: bytes, items: int, deadline: float | None) -> bool:
        """Post ``body`` (``items`` exported if accepted, dropped if not or if the answer's
        partial success rejects them) by ``deadline`` at most; count the outcome and log the
        first failure. Returns whether the collector accepted it.

        The export thread's one boundary: a send that raises (``http.client`` refusing a request
        it cannot write, a bug of ours) is a failed export of this batch, logged once; the
        thread goes on. It raised out of the loop before, ending the thread and losing the
        batch in flight from every counter."""
        try:
            result = self.sender.send(body, deadline)
        except Exception as exc:  # telemetry never breaks the application
            self.sender.close()  # the request may be half written: never reuse the connection
            self.count(dropped=items, failed=True)
            # Said cut and redacted: an error's text may quote a payload or a credential.
            self.last_failure = f"raised {said_in_log(exc)}"
            self.log_failure(self.last_failure, exc_info=exc)
            return False
        accepted = result.accepted
        rejected = 0
        if accepted and result.rejected:
            # The collector took the request but rejected part of it (its partial success):
            # those items are lost, not exported (a caller counting no items counts none).
            rejected = min(result.rejected, items) if items else result.rejected
        lost = min(rejected, items) if accepted else items
        self.count(
            exported=items - lost,
            dropped=lost,
            retries=max(result.attempts - 1, 0),
            accepted=accepted,
            failed=not accepted,
            rejected=rejected,
        )
        if rejected:
            # The collector's text quoted: one line, whatever it holds.
            said = f": {shown(result.message)}" if result.message else ""
            unit = self._unit if rejected != 1 else self._unit.removesuffix("s")  # "1 span"
            self.last_failure = f"rejected {rejected} {unit}{said}"
            self.log_failure(f"took the request but rejected {rejected} {unit} (partial success{said})")
        if not accepted and result.unreadable is not None:
            # Something answers there, just not in HTTP(S): "got no answer" sent users looking
            # for a collector that is not listening.
            self.last_failure = result.unreadable
            # A certificate's failure says what to change, not "is that a collector?" (it is one).
            fix = result.fix or "is that an OTLP/HTTP collector's URL?"
            self.log_failure(f"{result.unreadable}; {fix}")
        elif not accepted and result.status is None and result.timed_out:
            # "refused or unreachable" sent users looking for a collector that is not listening,
            # when one listens and does not answer.
            self.last_failure = "got no answer"
            self.log_failure("took the connection but gave no reply in time (last status None)")
        elif not accepted and result.status is None:
            self.last_failure = "got no answer"
            self.log_failure("refused or unreachable (last status None)")
        elif not accepted:
            # What the collector answered, not "refused or unreachable": its reason (quoted: one
            # line, whatever it holds), or where a redirect pointed, never followed.
            answered = f"answered {result.status}"
            if result.location is not None:
                answered += f", a redirect to {shown(safe_url(result.location))}"
                how = f"{answered}, which is not followed: set the endpoint to where it points"
            else:
                answered += f": {shown(result.message)}" if result.message else ""
                how = answered
            self.last_failure = answered
            self.log_failure(how)
        return accepted

    def count(
        self,
        *,
        exported: int = 0,
        dropped: int = 0,
        retries: int = 0,
        accepted: bool = False,
        failed: bool = False,
        rejected: int = 0,
    ) -> None:
        """Add to the counters, unless ``stop`` already counted this batch as dropped."""
        with self.wake:
            if self.abandoned:
                return
            self.exported += exported
            self.dropped += dropped
            self.retries += retries
            self.rejected += rejected
            self.exports += 1 if accepted else 0
            self.failures += 1 if failed else 0

    def log_failure(self, how: str, *, exc_info: BaseException | None = None) -> None:
        """Warn once that an export failed (``how``, with ``exc_info``'s traceback if given);
        later failures only count, so a dead collector cannot flood the log."""
        if self._logged_failure:
            return
        self._logged_failure = True
        logger.warning(
            "OTLP %s export to %s %s; %s, not logged again",
            self._signal,
            self.sender.shown_url,
            how,
            self._lost,
            exc_info=exc_info,
        )

    def say_total(self) -> None:
        """At shutdown, once: what was lost in all, when anything was. The failure warning is
        said at the first failure only, with no count; a queue full and a second outage hours
        later said nothing, so a server's log never told how many spans a run lost."""
        with self.wake:
            dropped, exported = self.dropped, self.exported
            failures, exports, last = self.failures, self.exports, self.last_failure
        if not dropped and not failures:
            return
        parts = []
        if dropped:
            unit = self._dropped_unit if dropped != 1 else self._dropped_unit.removesuffix("s")  # "1 span"
            parts.append(f"{dropped:,} {unit} dropped in all, {exported:,} exported")
        if failures:
            failed = "1 export failed" if failures == 1 else f"{failures:,} exports failed"
            parts.append(f"{failed}, {exports:,} accepted (last: {last})")
        logger.warning(
            "OTLP %s export to %s: %s; counted in %s",
            self._signal,
            self.sender.shown_url,
            "; ".join(parts),
            self._counted_in,
        )

    def request_stop(self) -> None:
        """Mark the worker closed and wake its loop (call it under ``wake`` with what else the
        sink does at that moment, such as dropping its queue)."""
        with self.wake:
            self.closed = True
            self.wake.notify_all()

    def join(self, deadline: float, *, patience: float, slack: float, resume: bool = False) -> bool:
        """Wait for the thread to end after ``request_stop``: ``patience`` (a fraction) of the
        time left to end by itself, then the sender is cancelled (a backoff wait and a request in
        flight end at once) and it gets the rest of the time, at least ``slack`` seconds;
        ``resume`` lets the sender send again after such a cancel (for a last export).
        Returns whether the thread ended."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(max(deadline - time.monotonic(), 0.0) * patience)
        if thread.is_alive():
            self.sender.cancel()
            thread.join(max(deadline - time.monotonic(), slack))
            if resume:
                self.sender.resume()
        return not thread.is_alive()

    def abandon(self, items: int) -> None:
        """Count the ``items`` of a batch whose send outlived the stop as dropped; what the
        thread counts for it later is ignored."""
        with self.wake:
            self.dropped += items
            self.abandoned = True

    async def aclose_with(self, shutdown: Callable[[], None]) -> None:
        """Run the sink's blocking ``shutdown`` in a thread; cancelled (the bus's close deadline),
        the request in flight ends at once."""
        try:
            await anyio.to_thread.run_sync(shutdown, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            self.sender.cancel()
            raise
