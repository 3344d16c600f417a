"""The consumer's lease keeper: a thread that does nothing but keep held messages invisible.

It extends the lease of the messages this process holds (waiting for a worker, running, past
their timeout until forwarded to the DLQ, completed until SQS confirms their delete) with one
`ChangeMessageVisibilityBatch` per 10, once a third of their lease is gone, waking when the next
renewal is due (at least once a second). A lease that runs out all the same (its renewals kept
failing) is logged as `lease_lapsed` at once: SQS may hand that message out again. It
is the first thread the runtime starts and it does no other work: deletes, dead-lettering, hooks,
`on_event` and status records run elsewhere (its events are handed to the watchdog), and it has
its own SQS client, with its own connections and a read timeout of a third of the lease, so a
throttled delete or a slow endpoint never delays a renewal. Each renewal may retry within the
time its earliest lease has left.

What it cannot do is run while another thread holds the GIL: a C call that never releases it (a
long regular expression, some C extensions) stops every Python thread. A renewal is due when a
third of the lease is gone, so a stall shorter than two thirds of `visibility_timeout` (20 s with
the default 30 s) costs nothing. A longer one is noticed as soon as the thread runs again: it
logs `stalled` with its length, and `lease_lapsed` for each message whose lease ran out meanwhile
(SQS may have handed it to another consumer; raise `visibility_timeout` for such handlers).
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Protocol

from messenger.consume.mailbox import Delivery, EntryError, Mailbox, Stage

#: The keeper wakes when the next renewal is due, at least every MAX_SLEEP_SECONDS (new messages
#: come due a third of a lease after they arrive), never more often than every MIN_SLEEP_SECONDS.
MIN_SLEEP_SECONDS = 0.1
MAX_SLEEP_SECONDS = 1.0
#: A wake-up this much later than planned means the thread could not run: the process stalled.
STALL_SECONDS = 1.0
#: A renewal must answer this long before the lease runs out.
SAFETY_SECONDS = 0.5
#: Shortest budget a renewal gets, however close its lease is to running out.
MIN_BUDGET_SECONDS = 1.0
#: The stages in which a message is leased: every stage but DONE.
LEASED_STAGES = (Stage.QUEUED, Stage.RUNNING, Stage.TIMED_OUT, Stage.DELETING)


class Leased(Protocol):
    """What the lease keeper needs of the runtime (implemented by `Runtime`)."""

    mailbox: Mailbox
    visibility: int

    def held(self, *stages: Stage) -> list[Delivery]: ...


#: An event for the consumer's `emit`: name, message id, fields.
Event = tuple[str, "str | None", "dict[str, Any]"]


def renewal_read_timeout(visibility: int) -> float:
    """Seconds one renewal attempt may wait for its answer: a third of the lease (1-15 s), so
    that a renewal that hangs is retried while the lease still holds."""
    return max(1.0, min(15.0, visibility / 3))


def lease_lapsed(delivery: Delivery, now: float) -> bool:
    """Whether the delivery's lease ran out while it was held, not reported yet (marks it)."""
    with delivery.lock:
        if delivery.lapsed or delivery.lease_until > now:
            return False
        delivery.lapsed = True
        return True


def lapse_event(delivery: Delivery, now: float, visibility: int) -> Event:
    return ("lease_lapsed", delivery.log_id, {
        "lapsed_for": round(now - delivery.lease_until, 3),
        "visibility_timeout": visibility, "receive_count": delivery.receive_count,
    })


class LeaseKeeper:
    """Keeps the leases of one runtime's held messages until `stop()`."""

    def __init__(self, runtime: Leased, sqs: Any | None = None) -> None:
        self.runtime = runtime
        #: The client renewals use (default: the mailboxes' own, e.g. in tests).
        self.sqs = sqs
        #: Events for the watchdog to report (this thread runs no user code).
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.renewals = 0
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        planned = time.monotonic() + MIN_SLEEP_SECONDS
        while not self._stop.wait(max(0.0, planned - time.monotonic())):
            now = time.monotonic()
            try:
                if now - planned > STALL_SECONDS:
                    self.stalled(now - planned, now)
                self.renew(now)
            except Exception as error:  # keep renewing; the watchdog reports it
                self.events.put(("watchdog_error", None, {"error": repr(error)}))
            planned = now + self.sleep_for(now)

    def sleep_for(self, now: float) -> float:
        """Seconds until the next renewal is due (MIN_SLEEP_SECONDS to MAX_SLEEP_SECONDS)."""
        lease = self.runtime.visibility
        held = self.runtime.held(*LEASED_STAGES)
        due = min((d.lease_until - lease * 2 / 3 for d in held), default=now + MAX_SLEEP_SECONDS)
        return min(MAX_SLEEP_SECONDS, max(MIN_SLEEP_SECONDS, due - now))

    def stalled(self, seconds: float, now: float) -> None:
        """The thread could not run for `seconds`: say so, and name every lease that ran out."""
        held = self.runtime.held(*LEASED_STAGES)
        lapsed = [d for d in held if lease_lapsed(d, now)]
        self.events.put(("stalled", None, {
            "seconds": round(seconds, 3), "held": len(held), "leases_lapsed": len(lapsed),
        }))
        for delivery in lapsed:
            self.events.put(lapse_event(delivery, now, self.runtime.visibility))

    def renew(self, now: float) -> None:
        """Extend every held lease of which a third is gone; a message stays leased as long as
        this process holds it (waiting, running, past its timeout until dead-lettered,
        completed until its delete is confirmed). Report the leases that ran out."""
        lease = self.runtime.visibility
        held = self.runtime.held(*LEASED_STAGES)
        for delivery in held:
            if delivery.lease_until <= now and lease_lapsed(delivery, now):
                self.events.put(lapse_event(delivery, now, lease))
        due = [d for d in held if d.lease_until <= now + lease * 2 / 3]
        if not due:
            return
        soonest = min(d.lease_until for d in due)
        budget = max(MIN_BUDGET_SECONDS, soonest - now - SAFETY_SECONDS)
        try:
            errors = self.runtime.mailbox.extend(due, lease, budget=budget, sqs=self.sqs)
        except Exception as error:
            errors = EntryError.of_call(due, error)
        failed = {id(e.delivery) for e in errors}
        for delivery in due:
            if id(delivery) not in failed:
                delivery.lease_until = now + lease
        self.renewals += 1
        for entry in errors:
            if entry.delivery.stage is Stage.DONE:
                continue  # deleted or released meanwhile: nothing left to renew
            self.events.put(("heartbeat_failed", entry.delivery.log_id,
                             {"code": entry.code, "error": entry.message}))

    def drain(self) -> list[Event]:
        """The events since the last call (for the watchdog to emit)."""
        found: list[Event] = []
        while True:
            try:
                found.append(self.events.get_nowait())
            except queue.Empty:
                return found
