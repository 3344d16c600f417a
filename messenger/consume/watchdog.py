"""The consumer's watchdog thread: processing timeouts, delete batches, progress, lease events.

Every 0.25 s, and when the next handler's deadline comes, it
- times out handlers past `processing_timeout`: every message past its deadline is marked timed
  out in one pass (its handler's success no longer counts: a worker whose handler returns late
  finds it timed out, and a worker that sees its own deadline passed first marks it itself),
  the handler thread gets `ProcessingTimeout` raised at its next Python instruction, and its
  worker counts as lost until the thread returns; the messages then go to the DLQ with the
  reason, up to FORWARD_THREADS at a time on threads of their own (many timeouts at once do not
  queue behind each other, nor delay the next tick); a thread still running `stuck_after`
  seconds later (blocked in C code) makes the consumer exit non-zero, so that ECS replaces the
  task;
- releases (visible again at once) the received messages that have waited `prefetch_wait` for
  a worker while every worker was busy (`Runtime.take_overdue`; it also wakes when the next one
  comes due), on a forwarder thread;
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
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from messenger.consume.host import RuntimeHost
from messenger.consume.lease import LeaseKeeper
from messenger.consume.lifecycle import write_held_lines
from messenger.consume.mailbox import DeleteBatcher, Delivery, Mailbox, Stage
from messenger.consume.settings import ConsumerSettings
from messenger.errors import MessengerError
from messenger.tracing import ProcessTrace

#: The watchdog's tick; it also wakes at the next handler's deadline.
TICK_SECONDS = 0.25
#: Timed-out messages forwarded to the DLQ at the same time, at most.
FORWARD_THREADS = 8


class ProcessingTimeout(MessengerError):
    """A handler ran past the consumer's processing_timeout (raised inside the handler thread,
    and out of `Consumer.run` when the message could not be dead-lettered)."""


def interrupt(thread_id: int, exception: type[BaseException] | None) -> None:
    """Raise `exception` in another thread at its next Python instruction (None: cancel)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exception) if exception else None
    )


def run_interruptibly(
    delivery: Delivery, handler: Callable[[Any], Any], message: Any, tracing: str = "off"
) -> tuple[BaseException | None, Any]:
    """Run `handler(message)` for a RUNNING delivery, interruptible by `interrupt`: what it
    raised, or None (also when interrupted, or when its time ran out before: the stage says so),
    and what it returned (None when it raised; a job's result on a keep_results channel).

    An interruption raised after the handler returned is cancelled under the delivery's lock,
    so it never lands in the caller's code. Anything the handler raises is returned, not raised
    (`SystemExit` and `KeyboardInterrupt` included). tracing: the `Settings.tracing` mode; when
    on, the handler runs in a `process` span (`messenger.tracing`), ended as it returns, raises
    or is interrupted."""
    trace = None
    if tracing != "off":
        trace = ProcessTrace.start(tracing, delivery.raw,
                                   delivery.mailbox.queue_url if delivery.mailbox else "",
                                   delivery.log_id)
    if trace is None:
        return _run_interruptibly(delivery, handler, message)
    ended: tuple[BaseException | None, Any] = (None, None)
    try:
        ended = _run_interruptibly(delivery, handler, message)
        return ended
    finally:
        trace.end(ended[0], timed_out=delivery.stage is Stage.TIMED_OUT)


def _run_interruptibly(
    delivery: Delivery, handler: Callable[[Any], Any], message: Any
) -> tuple[BaseException | None, Any]:
    try:
        with delivery.lock:
            if delivery.stage is not Stage.RUNNING:  # timed out in a START hook
                return None, None
            delivery.in_handler = True
        try:
            value = handler(message)
        finally:
            with delivery.lock:
                delivery.in_handler = False
                if delivery.stage is Stage.TIMED_OUT:  # drop an interruption not yet raised
                    interrupt(threading.get_ident(), None)
    except ProcessingTimeout:
        return None, None
    except BaseException as error:
        return error, None
    return None, value


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

    def report_timeout(self, delivery: Delivery) -> None: ...

    def forward_timed_out(self, delivery: Delivery) -> None: ...

    def rescue_receiver(self, now: float) -> bool: ...

    def take_overdue(self, now: float) -> tuple[list[Delivery], float | None]: ...

    def release_overdue(self, deliveries: Sequence[Delivery]) -> None: ...


class Watchdog:
    """Watches one runtime's held messages until `stop()`."""

    def __init__(self, runtime: Watched) -> None:
        self.runtime = runtime
        self.consumer = runtime.consumer
        self._stop = threading.Event()
        #: Forwards timed-out messages to the DLQ (threads start on first use).
        self._forwarder = ThreadPoolExecutor(FORWARD_THREADS, thread_name_prefix="messenger-dlq")

    def stop(self) -> None:
        """Stop ticking (the runtime has waited for the forwards under way)."""
        self._stop.set()
        self._forwarder.shutdown(wait=False)

    def next_wait(self, now: float, release_due: float | None = None) -> float:
        """Seconds until the next tick: TICK_SECONDS, or less when a deadline (or a waiting
        message's `prefetch_wait`, `release_due`) comes sooner."""
        deadlines = [d.deadline for d in self.runtime.held(Stage.RUNNING)
                     if d.deadline is not None]
        if release_due is not None:
            deadlines.append(release_due)
        soonest = min(deadlines, default=now + TICK_SECONDS)
        return min(TICK_SECONDS, max(0.0, soonest - now))

    def run(self) -> None:
        written_progress = 0
        wait = TICK_SECONDS
        while not self._stop.wait(wait):
            try:
                now = time.monotonic()
                self.report_lease_events()
                self.time_out(now)
                release_due = self.release_overdue(now)
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
                self.consumer.beat()
                write_held_lines(TICK_SECONDS)
                wait = self.next_wait(time.monotonic(), release_due)
            except Exception as error:  # keep watching; the error is logged
                self.consumer.emit("watchdog_error", fields={"error": repr(error)})
                wait = TICK_SECONDS

    def time_out(self, now: float) -> None:
        """Mark every handler past its deadline timed out, then have them dead-lettered."""
        expired = [d for d in self.runtime.held(Stage.RUNNING) if self.expire(d, now)]
        for delivery in expired:
            self.timed_out(delivery)

    def expire(self, delivery: Delivery, now: float) -> bool:
        """Mark a running message past its deadline as timed out (interrupting its handler if
        it still runs); False when it is not running or not past its deadline."""
        with delivery.lock:
            if delivery.stage is not Stage.RUNNING or delivery.deadline is None \
                    or now < delivery.deadline:
                return False
            delivery.stage = Stage.TIMED_OUT
            if delivery.in_handler and delivery.thread_id is not None:
                interrupt(delivery.thread_id, ProcessingTimeout)
                self.runtime.mark_stuck(delivery.thread_id, now)
        return True

    def timed_out(self, delivery: Delivery) -> None:
        """Report a message `expire` marked, and forward it to the DLQ on a forwarder thread
        (its lease is kept until then)."""
        self.runtime.report_timeout(delivery)
        try:
            self._forwarder.submit(self._forward, delivery)
        except RuntimeError:  # shut down already: forward it here
            self._forward(delivery)

    def _forward(self, delivery: Delivery) -> None:
        try:
            self.runtime.forward_timed_out(delivery)
        except Exception as error:  # a bug: the message stays held until shutdown releases it
            self.consumer.emit("watchdog_error", delivery.log_id, fields={"error": repr(error)})

    def release_overdue(self, now: float) -> float | None:
        """Release the messages that waited `prefetch_wait` for a worker (on a forwarder
        thread: a slow endpoint never delays the tick); when the next one comes due."""
        overdue, due = self.runtime.take_overdue(now)
        if overdue:
            try:
                self._forwarder.submit(self.runtime.release_overdue, overdue)
            except RuntimeError:  # shut down already: release them here
                self.runtime.release_overdue(overdue)
        return due

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
