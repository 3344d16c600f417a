"""The consumer's watchdog thread: processing timeouts, delete batches, progress, lease events.

Every 0.25 s it
- times out handlers past `processing_timeout`: the message goes to the DLQ with the reason, the
  handler thread gets `ProcessingTimeout` raised at its next Python instruction, and its worker
  counts as lost until the thread returns; a thread still running `stuck_after` seconds later
  (blocked in C code) makes the consumer exit non-zero, so that ECS replaces the task;
- replaces a receiver still running a fast-looking poll's messages itself after
  `runtime.RESCUE_SECONDS` (`Runtime.rescue_receiver`: workers take the rest of the poll);
- restarts the PROCESSING clock of the health file when messages finished since the last tick
  (delete batches go out on the delete batcher's own thread);
- writes the log lines held (`JsonLinesHandler.hold_seconds`) that are due before its next tick;
- reports the lease keeper's events (`messenger.consume.lease`, its own thread, which renews
  leases and does nothing else: none of the work here can delay a renewal).
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Protocol

from messenger.consume.host import RuntimeHost
from messenger.consume.lease import LeaseKeeper
from messenger.consume.lifecycle import LifecycleHooks, write_held_lines
from messenger.consume.mailbox import DeleteBatcher, Delivery, Mailbox, Stage
from messenger.consume.settings import ConsumerSettings
from messenger.errors import MessengerError

#: Processing timeouts are enforced within this long.
TICK_SECONDS = 0.25


class ProcessingTimeout(MessengerError):
    """A handler ran past the consumer's processing_timeout (raised inside the handler thread,
    and out of `Consumer.run` when the message could not be dead-lettered)."""


def interrupt(thread_id: int, exception: type[BaseException] | None) -> None:
    """Raise `exception` in another thread at its next Python instruction (None: cancel)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exception) if exception else None
    )


class Watched(Protocol):
    """What the watchdog needs of the runtime it watches (implemented by `Runtime`)."""

    consumer: RuntimeHost
    config: ConsumerSettings
    mailbox: Mailbox
    deleter: DeleteBatcher
    leases: LeaseKeeper
    visibility: int
    stopping: threading.Event

    @property
    def progress(self) -> int: ...

    def held(self, *stages: Stage) -> list[Delivery]: ...

    def fail(self, error: BaseException) -> None: ...

    def mark_stuck(self, thread_id: int, since: float) -> None: ...

    def stuck_since(self) -> list[float]: ...

    def dead_letter(self, delivery: Delivery, reason: str, expected: Stage) -> bool: ...

    def rescue_receiver(self, now: float) -> bool: ...


class Watchdog:
    """Watches one runtime's held messages until `stop()`."""

    def __init__(self, runtime: Watched) -> None:
        self.runtime = runtime
        self.consumer = runtime.consumer
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        written_progress = 0
        while not self._stop.wait(TICK_SECONDS):
            try:
                now = time.monotonic()
                self.report_lease_events()
                self.time_out(now)
                self.check_stuck(now)
                # CPU optimisations' safety nets: a receiver stuck running a poll inline is
                # replaced, a deferred deleter wake is given
                self.runtime.rescue_receiver(now)
                self.runtime.deleter.wake_if_due()
                progress = self.runtime.progress
                if progress != written_progress:
                    written_progress = progress
                    self.consumer.touch_health()
                self.consumer.flush_health()
                write_held_lines(TICK_SECONDS)
            except Exception as error:  # keep watching; the error is logged
                self.consumer.emit("watchdog_error", fields={"error": repr(error)})

    def time_out(self, now: float) -> None:
        for delivery in self.runtime.held(Stage.RUNNING):
            with delivery.lock:
                if delivery.stage is not Stage.RUNNING or delivery.deadline is None:
                    continue
                if now < delivery.deadline:
                    continue
                delivery.stage = Stage.TIMED_OUT
                if delivery.in_handler and delivery.thread_id is not None:
                    interrupt(delivery.thread_id, ProcessingTimeout)
                    self.runtime.mark_stuck(delivery.thread_id, now)
            timeout = self.consumer.processing_timeout
            self.consumer.emit(
                "timed_out", delivery.log_id, duration=delivery.running_for(),
                fields={"processing_timeout": timeout, "receive_count": delivery.receive_count},
            )
            self.consumer.run_hooks(LifecycleHooks.ON_PROCESSING_TIMEOUT, delivery.message)
            reason = f"processing_timeout: exceeded {timeout:g} s"
            self.runtime.dead_letter(delivery, reason, Stage.TIMED_OUT)

    def report_lease_events(self) -> None:
        for name, message_id, fields in self.runtime.leases.drain():
            self.consumer.emit(name, message_id, fields=fields)

    def check_stuck(self, now: float) -> None:
        limit = self.runtime.config.stuck_after
        stuck = [since for since in self.runtime.stuck_since() if now - since > limit]
        if stuck and not self.runtime.stopping.is_set():
            self.runtime.fail(ProcessingTimeout(
                f"a handler thread is still running {limit:g} s after its processing timeout; "
                f"exiting so the task is replaced"
            ))
