"""The consumer runtime's workers (`Working`, a part of `messenger.consume.runtime.Runtime`)
and their work queue (`WorkQueue`): a worker takes a chain (a message; a group's messages on an
ordered channel), runs each message through the outcome policy (`messenger.consume.outcome`),
queues a completed one for its delete, releases the rest of an ordered group the decision holds
back (`messenger.consume.decision.after_step`), and lets the receiver know when a worker frees
up. A timed-out message is forwarded here too (on the watchdog's forwarder thread)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from messenger.consume import decision
from messenger.consume.decision import Action
from messenger.consume.lease import lapse_event, lease_lapsed
from messenger.consume.mailbox import Delivery, EntryError, Stage
from messenger.consume.outcome import Outcome
from messenger.consume.parts import RuntimeParts
from messenger.consume.watchdog import ProcessingTimeout

#: Weight of the newest chain in the running average of a chain's wall time.
CHAIN_TIME_WEIGHT = 0.2


class Working(RuntimeParts):
    """The workers' side of the runtime (module doc)."""

    def _worker_loop(self) -> None:
        while (chain := self._work.take()) is not None:
            self._run_taken(chain)

    def _run_taken(self, chain: list[Delivery]) -> None:
        """Run a chain taken from the work queue (on a worker's or the receiver's thread)."""
        began = time.monotonic()
        try:
            self._run_chain(chain)
            took = time.monotonic() - began
            self._recent_chains.append(took)
            average = self._chain_seconds  # workers race here: a lost update only skews it
            self._chain_seconds = took if average is None else \
                average + CHAIN_TIME_WEIGHT * (took - average)
        except ProcessingTimeout:
            pass  # a late interruption of a handler already timed out and dead-lettered
        finally:
            # The watchdog marks a thread stuck while it runs a handler (under the message's
            # lock, which the handler's thread takes on its way out): no lock needed to see it.
            if self._stuck:
                with self._cond:
                    returned = self._stuck.pop(threading.get_ident(), None) is not None
                    if returned:  # a timed-out handler's thread is a worker again
                        self._cond.notify_all()
                if returned:
                    self.refresh_state()

    def _run_chain(self, chain: list[Delivery]) -> None:
        for position, delivery in enumerate(chain):
            if self.stopping.is_set():
                self._release([d for d in chain[position:] if d.claim(Stage.QUEUED, Stage.DONE)],
                              reason="shutdown")
                return
            ok = self._process(delivery)
            then = decision.after_step(self.consumer.ordered, ok, len(chain) - position - 1)
            if then.action is Action.RELEASE_REST:  # the group's order: the rest waits
                rest = [d for d in chain[position + 1:] if d.claim(Stage.QUEUED, Stage.DONE)]
                self._release(rest, reason=then.reason)
                return

    def _process(self, delivery: Delivery) -> bool:
        """Run one message (`OutcomePolicy.run`); True when it is finished for good (deleted or
        dead-lettered)."""
        with delivery.lock:
            if delivery.stage is not Stage.QUEUED:
                return False
            delivery.stage = Stage.RUNNING
            delivery.started_at = time.monotonic()
            delivery.deadline = decision.deadline(delivery.started_at,
                                                  self.consumer.processing_timeout)
            delivery.thread_id = threading.get_ident()
        verdict = self.outcomes.run(delivery, self.mailbox.budget)
        self._check_lease(delivery)
        if verdict is Outcome.TIMED_OUT:  # returned past its deadline before the tick saw it
            self.watchdog.timed_out(delivery)
            return False
        if verdict is Outcome.TAKEN:  # timed out meanwhile: the watchdog dead-letters it
            return False
        if verdict.deletes:
            with self._lock:
                self._deleting[delivery.receipt_handle] = delivery
            self.deleter.add(delivery)
        self._finish(delivery, progress=verdict is not Outcome.KEPT)
        return verdict.finished

    def _check_lease(self, delivery: Delivery) -> None:
        """Report a lease that ran out while the message ran (the process stalled, e.g. a C call
        held the GIL): SQS may have handed the message to another consumer meanwhile."""
        now = time.monotonic()
        # The lease keeper only ever moves lease_until forward: a lease still running needs
        # no lock to tell.
        if delivery.lease_until <= now and lease_lapsed(delivery, now):
            name, message_id, fields = lapse_event(delivery, now, self.visibility)
            self.consumer.emit(name, message_id, fields=fields)

    def report_timeout(self, delivery: Delivery) -> None:
        """The watchdog marked the message timed out: its 'timed_out' event."""
        self.outcomes.report_timeout(delivery)

    def forward_timed_out(self, delivery: Delivery) -> None:
        """Forward a timed-out message to the DLQ (on the watchdog's forwarder thread)."""
        self.outcomes.forward_timed_out(delivery)
        self._finish(delivery)

    def _finish(self, delivery: Delivery, progress: bool = False) -> None:
        with self._lock:
            self._held.pop(delivery.receipt_handle, None)
            if progress:
                self._progress += 1
            # Wake the receiver (and a shutdown) only when that lets it move on: a first free
            # worker, a full poll's worth, nothing held. Its waits are short and it counts free
            # workers itself, so it need not wake for each message a busy worker finishes.
            free = self.free_slots()
            idle = not self._held and not self._stuck
            if free == 1 or free >= min(10, self.config.concurrency) or idle or \
                    self.stopping.is_set():
                self._cond.notify_all()
        if idle:  # no other message to batch the pending deletes with until the next poll's
            self.deleter.went_idle(self._last_poll_dry, self._last_poll_trickle)
        if idle or self.stopping.is_set():  # else the state stays PROCESSING
            self.refresh_state()

    def _release(self, deliveries: Sequence[Delivery], reason: str) -> None:
        if not deliveries:
            return
        try:
            errors = self.mailbox.release(deliveries)
        except Exception as error:
            errors = [EntryError(d, type(error).__name__, str(error)) for d in deliveries]
        failed = {id(e.delivery) for e in errors}
        for delivery in deliveries:
            self.consumer.emit(
                "released", delivery.log_id,
                fields={"reason": reason, "ok": id(delivery) not in failed},
            )
        with self._cond:
            for delivery in deliveries:
                self._held.pop(delivery.receipt_handle, None)
            self._cond.notify_all()
        self.refresh_state()

    def _delete_failed(self, failed: EntryError) -> bool:
        """A delete SQS refused or that failed: True to try it again (a transient failure; the
        lease keeper keeps the message leased meanwhile), False to give it up (SQS refused it
        for good: the receipt handle is no longer valid, the message may come back)."""
        delivery = failed.delivery
        retry = failed.transient
        self.consumer.emit(
            "delete_failed", delivery.log_id,
            fields={"code": failed.code, "error": failed.message, "retry": retry},
        )
        if not retry:
            self._deleted([delivery])
        return retry

    def _deleted(self, deliveries: Sequence[Delivery]) -> None:
        """Deletes SQS confirmed (or gave up): the messages are no longer leased."""
        with self._lock:
            for delivery in deliveries:
                delivery.stage = Stage.DONE
                self._deleting.pop(delivery.receipt_handle, None)
