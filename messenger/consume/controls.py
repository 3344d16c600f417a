"""The consumer's control watcher: a thread that reads an operator's pause and cancel requests
(`messenger.jobs.controls`) once per heartbeat interval (a third of the lease, at least
`MIN_INTERVAL_SECONDS`).

- Pause: the queue's pause record in the worker registry's table (one Query per interval; it
  survives a deploy), or, where there is no registry, the queue's tag `messenger:paused` (one
  ListQueueTags). A paused
  runtime stops receiving, finishes what it holds, keeps its leases and its registry entry, and
  is PAUSED once it holds nothing; resumed, it polls again.
- Cancel: read only while the runtime holds running messages (one Query per interval then).
  A requested message's deadline is moved to now: the watchdog stops it at its next tick as a
  processing timeout would, and it is dead-lettered with the reason `cancelled by <who>`.

A read that fails is reported (`control_read_failed`) and the last known pause stays in force:
the controls observe and steer, they never stop message processing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from messenger.consume.host import RuntimeHost
from messenger.consume.mailbox import Delivery, Mailbox, Stage
from messenger.errors import ChannelNotFound
from messenger.jobs.controls import CancelRequests, PauseMark, PauseRecords, read_pause

#: The watcher reads at most this often, whatever the lease.
MIN_INTERVAL_SECONDS = 1.0
#: Seconds one control read may take (its own client's read timeout).
READ_TIMEOUT_SECONDS = 2.0


class Controlled(Protocol):
    """What the watcher needs of the runtime (implemented by `Runtime`)."""

    consumer: RuntimeHost
    mailbox: Mailbox
    visibility: int

    def held(self, *stages: Stage) -> list[Delivery]: ...

    def set_paused(self, mark: PauseMark | None) -> None: ...

    def cancel(self, delivery: Delivery, by: str) -> bool: ...


def control_interval(visibility: int) -> float:
    """Seconds between control reads: the heartbeat's (a third of the lease), at least
    MIN_INTERVAL_SECONDS."""
    return max(MIN_INTERVAL_SECONDS, visibility / 3)


class ControlWatcher:
    """Reads one runtime's controls until `stop()`."""

    def __init__(self, runtime: Controlled, sqs: Any, cancels: CancelRequests | None) -> None:
        self.runtime = runtime
        self.sqs = sqs
        self.cancels = cancels
        self.pauses: PauseRecords | None = cancels.pause_records() if cancels else None
        self.queue = runtime.mailbox.queue_url.rstrip("/").rsplit("/", 1)[-1]
        self.interval = control_interval(runtime.visibility)
        self.paused: PauseMark | None = None
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        while True:
            self.check()
            if self._stop.wait(self.interval):
                return

    def check(self) -> None:
        """One read of the pause mark, and of the cancel requests while messages run."""
        consumer = self.runtime.consumer
        try:
            mark = self.read_pause()
        except Exception as error:
            consumer.emit("control_read_failed", fields={
                "control": "pause", "error": f"{type(error).__name__}: {error}"})
        else:
            if mark != self.paused:
                self.paused = mark
                self.runtime.set_paused(mark)
        running = self.runtime.held(Stage.RUNNING)
        if running and self.cancels is not None:
            act_on_cancels(consumer, self.cancels, running, self.runtime.cancel)

    def read_pause(self) -> PauseMark | None:
        """The queue's pause: its record in the registry, else (no registry table) its tag."""
        if self.pauses is not None:
            try:
                return self.pauses.get(self.queue)
            except ChannelNotFound:
                self.pauses = None  # no registry: the tag from now on
        return read_pause(self.sqs, self.runtime.mailbox.queue_url)


def act_on_cancels(consumer: RuntimeHost, cancels: CancelRequests, running: Sequence[Delivery],
                   cancel: Callable[[Delivery, str], bool]) -> None:
    """Read the channel's cancel requests (one Query) and stop each running delivery one names
    (by its job id or SQS MessageId) with `cancel(delivery, who)`; a request acted on is
    deleted. Used by the Fargate watcher and the Lambda runtime alike."""
    try:
        requests = cancels.pending()
    except Exception as error:
        consumer.emit("control_read_failed", fields={
            "control": "cancel", "error": f"{type(error).__name__}: {error}"})
        return
    for delivery in running:
        request = requests.get(delivery.log_id) or requests.get(delivery.sqs_message_id)
        if request is None or not cancel(delivery, request.by):
            continue
        try:
            cancels.done(request)
        except Exception as error:  # it expires by itself (CANCEL_EXPIRY_SECONDS)
            consumer.emit("control_read_failed", fields={
                "control": "cancel_done", "error": f"{type(error).__name__}: {error}"})


def stop_now(delivery: Delivery, by: str) -> bool:
    """Mark a running delivery cancelled by `by`, its deadline now (the watchdog stops it at
    its next tick, as a processing timeout); False when it no longer runs."""
    with delivery.lock:
        if delivery.stage is not Stage.RUNNING:
            return False
        delivery.cancelled_by = by
        delivery.deadline = time.monotonic()
        return True
