"""What happens to a received message: carried out here once, for the Fargate runtime
(`messenger.consume.runtime`) and the Lambda runtime (`messenger.consume.lambda_runtime`).

Each verdict is decided by `messenger.consume.decision` (pure: facts in, a `decision.Verdict`
out, table-tested without AWS); `OutcomePolicy` gathers the facts (the delivery, the handler's
result or exception, the consumer's settings, the clock), asks it, and carries the verdict out
(the SQS calls, events, hooks, claims). The runtimes keep transport and threading (receiving,
workers, leases, deletes, the batch response, watching deadlines); each calls
`OutcomePolicy.run` on a RUNNING delivery and acts on the `Outcome` it returns (dramatiq's
`Retries` middleware is the model: one retry policy for every broker). In order:
1. Attempts already used up (SQS's receive count is past the message's attempts: a consumer
   stopped, or was killed, during its last attempt, before any verdict): dead-lettered at once,
   'attempts_exhausted: ...', without running the handler again.
2. Decode (an offloaded body is read from S3 within the retry budget): an unreadable or invalid
   body, or a payload gone, is dead-lettered at once with its reason; S3 unreachable is a retry.
3. A job that carries an id (the scheduler fired it: `SCHEDULED_HEADER`; pushed with dedup on,
   an HTTP Idempotency-Key's among them: `JOB_WINDOW_HEADER`) is claimed once per job id
   (`messenger.jobs.fired`), outside the processing timeout: claimed by another copy of it (a
   retried firing, a send botocore retried) → deleted unrun, DUPLICATE ('duplicate_firing',
   'duplicate_job'); cancelled (`messenger schedules cancel` marked it first) → deleted unrun,
   CANCELLED ('cancelled_unrun', CANCELLED on a tracked job's timeline); the table unavailable
   past the retry budget → retried after the backoff delay. A claimed copy that is
   dead-lettered gives its claim back, so a requeue of it runs. A plain job makes no call.
4. An idempotent consumer's key is claimed (`IdempotencyGuard.begin`) outside the handler's
   processing timeout: done already → DUPLICATE; running elsewhere → visible again when that
   run's claim expires; the table unavailable past the retry budget → retried after the backoff
   delay (not the handler's failure, never a dead letter).
3a. Limits (`messenger.consume.limits`, a channel with a rate limit): the gate waits for the
   job's start time, or the job is held back (HELD: sent again as a new message with a delay,
   the attempts it used carried in its meta headers, then deleted: no attempt used, never a
   step toward the DLQ; on an ordered channel it waits in the consumer instead). A handler
   raising `messenger.RateLimited(retry_after)` is held back the same way (a short wait runs it
   again here), and pauses this process's jobs of the channel for `retry_after`.
5. START hooks, the handler under its processing timeout (anything it raises is its failure,
   `SystemExit` and `KeyboardInterrupt` included), END hooks. A handler returning past its
   deadline timed out (TIMED_OUT: the runtime reports and forwards it, `report_timeout`,
   `forward_timed_out`, its reason `processing_timeout: exceeded N s`).
6. The claim is settled, outside the timeout too: COMPLETED after a handler that returned (a
   store that still fails then is logged, `idempotency_record_failed`, and the message is
   deleted all the same: it was processed, a requeue would run it twice), deleted after one
   that failed.
7. The verdict: COMPLETED; or the failure reported ('failed', ON_ERROR hooks) and, when it
   is final (`messenger.Unrecoverable`, one of the consumer's `final_errors`), dead-lettered at
   once ('unrecoverable: <type>: <message>'); on its last attempt, dead-lettered with its cause
   (`failed: attempts used up (n of m)` and the failure note), else made visible again after
   its backoff delay, capped so that it stays within SQS's 12 hours in flight.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from messenger.consume import decision
from messenger.consume.decision import Action, Facts, Rules
from messenger.consume.failures import HandlerFailure, failure_note
from messenger.consume.host import RuntimeHost
from messenger.consume.lifecycle import LifecycleHooks
from messenger.consume.mailbox import (
    Delivery,
    HeldMarks,
    Mailbox,
    ReceivedMessage,
    Stage,
    held_marks,
    unreadable_reason,
)
from messenger.consume.watchdog import ProcessingTimeout, run_interruptibly
from messenger.errors import MessageDecodeError, PayloadMissing, RateLimited
from messenger.jobs.fired import Cancelled, job_mark, received_job_mark
from messenger.jobs.results import FinalOutcome
from messenger.jobs.results import Outcome as FinalState
from messenger.offload import PayloadStore
from messenger.tracing import ProcessTrace

if TYPE_CHECKING:  # loaded by the consumers that use them (status, idempotency), not by all
    from messenger.consume.idempotency import InProgressElsewhere
    from messenger.jobs.status import StatusEvent


class Outcome(enum.Enum):
    """What became of a message (`OutcomePolicy.run`)."""

    COMPLETED = "completed"  # the handler returned: delete it
    DUPLICATE = "duplicate"  # done within the idempotency window already: delete it
    RETRY = "retry"  # back in its queue after a delay (failed, its key busy, store unavailable)
    DEAD_LETTERED = "dead_lettered"  # forwarded to the DLQ and deleted from its queue
    KEPT = "kept"  # the DLQ forward failed: still in its queue, back when its lease ends
    TIMED_OUT = "timed_out"  # past its deadline, marked here: report and forward it
    TAKEN = "taken"  # another thread gave the verdict (the deadline watcher): nothing to do
    CANCELLED = "cancelled"  # its job was cancelled before any copy claimed it: delete it unrun
    HELD = "held"  # held back by a limit: sent again with a delay as a new message: delete it

    @property
    def deletes(self) -> bool:
        """The runtime deletes the message (Fargate's delete batch, Lambda's response)."""
        return self in (Outcome.COMPLETED, Outcome.DUPLICATE, Outcome.CANCELLED, Outcome.HELD)

    @property
    def finished(self) -> bool:
        """Gone from its queue for good (deleted or dead-lettered)."""
        return self in (Outcome.COMPLETED, Outcome.DUPLICATE, Outcome.CANCELLED,
                        Outcome.DEAD_LETTERED, Outcome.HELD)


#: Times a job waits in its consumer and runs again after its handler's RateLimited before it
#: is held back in its queue instead.
MAX_WAITS_HERE = 10
#: Stops the consumer with an error (Fargate's `Runtime.fail`): a dead letter it cannot forward.
StopConsumer = Callable[[BaseException], None]


class OutcomePolicy:
    """Decides and carries out what happens to each message of one consumer (module doc).

    consumer: the consumer. store: reads offloaded payloads. done_stage: the stage of a message
    to delete (Fargate: Stage.DELETING, leased until SQS confirms; Lambda: Stage.DONE).
    stop: stops the consumer (Fargate's; None: no consumer to stop, Lambda) when a dead letter
    other than a failed handler's cannot be forwarded (`decision.on_forward_failed`); the
    outcome is KEPT either way.
    clock: the monotonic clock deadlines are read on (the runtimes': `time.monotonic`; tests
    move one of their own).
    """

    def __init__(self, consumer: RuntimeHost, store: PayloadStore,
                 done_stage: Stage = Stage.DONE, stop: StopConsumer | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.consumer = consumer
        self.store = store
        self.done_stage = done_stage
        self.stop = stop
        self.clock = clock
        self._rules: Rules | None = None

    @property
    def rules(self) -> Rules:
        """The consumer's settings the decision reads (`decision.Rules`), read at the first
        message (class attributes and the runtime's settings: fixed by then)."""
        rules = self._rules
        if rules is None:
            rules = self._rules = Rules.of(self.consumer, can_stop=self.stop is not None)
        return rules

    def facts(self, delivery: Delivery) -> Facts:
        """The decision's facts of a delivery (`decision.Facts`), now."""
        handed_out = delivery.handed_out_after
        held = time.monotonic() - (delivery.received_at if handed_out is None else handed_out)
        until = held_marks(delivery.raw).held_until
        return Facts(delivery.attempt, delivery.raw.get("MessageAttributes", {}), held,
                     delivery.cancelled_by, until - time.time() if until else 0.0)

    # -- one message -------------------------------------------------------------------------
    def run(self, delivery: Delivery, budget: float, limit: float | None = None) -> Outcome:
        """Run one RUNNING delivery (its deadline set) to its verdict, on the handler's thread.

        budget: seconds for reading an offloaded body. limit: monotonic time no deadline goes
        past (Lambda: the invocation's; None: none), also while the idempotency store is
        called (its calls do not count against the processing timeout)."""
        consumer = self.consumer
        consumer.emit("started", delivery.log_id, fields={"receive_count": delivery.receive_count})
        first = decision.on_receive(self.facts(delivery), self.rules, self.clock())
        if first.action is Action.DEAD_LETTER:
            return self._unprocessable(delivery, first.reason)
        if first.action is Action.HOLD:
            return self._send_back(delivery, first.delay, first.reason)
        try:
            message = delivery.decode(self.store, budget, consumer.body_schema)
        except (MessageDecodeError, PayloadMissing) as bad:  # never readable: the DLQ at once
            return self._unprocessable(delivery, decision.on_unreadable(unreadable_reason(bad))
                                       .reason)
        except ProcessingTimeout:
            raise
        except Exception as unreadable:  # S3 unreachable past the budget: try again later
            return self._failed(delivery, None, unreadable)
        delivery.message = message
        consumer.check_delay(message)
        held = self._admit(delivery, message, limit)
        if held is not None:
            return held
        repeat = self._claim_job(delivery, message, limit)
        if repeat is not None:
            return repeat
        guard = consumer.idempotency
        key: str | None = None
        if guard is not None:
            from messenger.consume.idempotency import (
                AlreadyDone,
                InProgressElsewhere,
                StoreUnavailable,
            )

            self._set_deadline(delivery, limit)
            try:
                key = guard.begin(message)
            except AlreadyDone:
                return self._delete(delivery, "duplicate_skipped", Outcome.DUPLICATE)
            except InProgressElsewhere as busy:
                return self._busy(delivery, busy)
            except StoreUnavailable as error:
                return self._retry(delivery, error=error)
            except Exception as error:  # no key: the handler's failure, as if it had raised it
                return self._failed(delivery, message, error)
            if not self._set_deadline(delivery, decision.deadline(
                    time.monotonic(), consumer.processing_timeout, limit)):
                self._settle(key, delivery, ProcessingTimeout())
                return Outcome.TAKEN
        consumer.run_hooks(LifecycleHooks.MSG_PROCESSING_START, message)
        raised, value = run_interruptibly(delivery, consumer.handler, message,
                                          consumer.settings.tracing)
        consumer.run_hooks(LifecycleHooks.MSG_PROCESSING_END, message)
        verdict = self._past_deadline(
            delivery, limit if key is not None or consumer.results is not None else None)
        unkept = None  # the result's write failed: not deleted, run again after the backoff
        if verdict is None and raised is None:
            unkept = self._keep(delivery, FinalOutcome.completed(
                delivery.log_id, self._channel, value))
        if key is not None:
            self._settle(key, delivery, (raised or unkept) if verdict is None
                         else ProcessingTimeout())
        if verdict is not None:
            return verdict
        if isinstance(raised, RateLimited):
            return self._rate_limited(delivery, raised, budget, limit)
        if raised is not None:
            return self._failed(delivery, message, raised)
        if unkept is not None:
            return self._retry(delivery, error=unkept)
        return self._delete(delivery, "completed", Outcome.COMPLETED)

    def attempts(self, delivery: Delivery) -> int:
        """How many attempts the message gets (`RetryPolicy.attempts`)."""
        return self.rules.retry.attempts(delivery.raw.get("MessageAttributes", {}))

    # -- the timeout path (the runtime's deadline watcher marked it TIMED_OUT) ---------------
    def report_timeout(self, delivery: Delivery) -> None:
        """Its 'timed_out' event; 'cancelled' (with who) when an operator cancelled it."""
        if delivery.cancelled_by is not None:
            self.consumer.emit("cancelled", delivery.log_id, duration=delivery.running_for(),
                               fields={"by": delivery.cancelled_by,
                                       "receive_count": delivery.receive_count})
            return
        self.consumer.emit("timed_out", delivery.log_id, duration=delivery.running_for(), fields={
            "processing_timeout": self.consumer.processing_timeout,
            "receive_count": delivery.receive_count})

    def at_deadline(self, delivery: Delivery, limit: float | None = None) -> decision.Verdict:
        """What a message whose deadline came gets (`decision.on_deadline`): the DLQ
        (its processing timeout, or 'cancelled by <who>'), or released when the invocation's
        end (`limit`) came first."""
        return decision.on_deadline(self.facts(delivery), self.rules, delivery.deadline, limit)

    def forward_timed_out(self, delivery: Delivery) -> Outcome:
        """ON_PROCESSING_TIMEOUT hooks, then the DLQ with the reason (DEAD_LETTERED or KEPT):
        the timeout's, or 'cancelled by <who>' when an operator cancelled it."""
        self.consumer.run_hooks(LifecycleHooks.ON_PROCESSING_TIMEOUT, delivery.message)
        return self._forward(delivery, self.at_deadline(delivery).reason)

    # -- verdicts ----------------------------------------------------------------------------
    @staticmethod
    def _set_deadline(delivery: Delivery, deadline: float | None) -> bool:
        """Move a running message's deadline; False when it timed out meanwhile."""
        with delivery.lock:
            if delivery.stage is not Stage.RUNNING:
                return False
            delivery.deadline = deadline
            return True

    def _past_deadline(self, delivery: Delivery, then: float | None) -> Outcome | None:
        """After the handler: TIMED_OUT when it returned past its deadline (marked here), TAKEN
        when the deadline watcher marked it first, else None (its deadline becomes `then`: the
        idempotency store's calls come next)."""
        with delivery.lock:
            if delivery.stage is not Stage.RUNNING:
                return Outcome.TAKEN
            if delivery.deadline is not None and self.clock() >= delivery.deadline:
                delivery.stage = Stage.TIMED_OUT
                return Outcome.TIMED_OUT
            delivery.deadline = then
            return None

    def _claim_job(self, delivery: Delivery, message: ReceivedMessage, limit: float | None
                   ) -> Outcome | None:
        """Claim a job that carries an id for this copy (`messenger.jobs.fired`): None to run it
        (a plain job, or ours), else the verdict of a repeat (DUPLICATE), of a cancelled job
        (CANCELLED), of a table that failed (RETRY) or TAKEN (timed out meanwhile). The
        claim's calls do not count against the processing timeout (as the idempotency store's
        do not)."""
        claims = self.consumer.firings
        mark = job_mark(message.meta_headers, message.message_id) if claims is not None \
            else None
        if claims is None or mark is None:
            return None
        from messenger.jobs.status import StatusEvent  # a marked job's: loaded when one comes
        self._set_deadline(delivery, limit)
        try:
            other = claims.claim(mark.job_id, delivery.sqs_message_id, mark.window)
        except Exception as error:  # neither run unclaimed nor dropped: tried again later
            return self._retry(delivery, error=error)
        if isinstance(other, Cancelled):
            unkept = self._keep(delivery, FinalOutcome(
                delivery.log_id, self._channel, FinalState.CANCELLED, time.time(),
                reason=decision.cancelled_reason(other.by or "unknown") + ": deleted unrun"))
            if unkept is not None:
                return self._retry(delivery, error=unkept)
            if not delivery.claim(Stage.RUNNING, self.done_stage):
                return Outcome.TAKEN
            self._note_firing(delivery, message, StatusEvent.CANCELLED, time.time(),
                              decision.cancelled_reason(other.by or "unknown") + ": deleted unrun",
                              actor=other.by or "unknown")
            self.consumer.emit("cancelled_unrun", delivery.log_id,
                               duration=delivery.running_for(), fields={
                                   "receive_count": delivery.receive_count, "by": other.by,
                                   "cancelled_at": other.at})
            return Outcome.CANCELLED
        if other is not None:
            if not delivery.claim(Stage.RUNNING, self.done_stage):
                return Outcome.TAKEN
            what = "a retried firing" if mark.fired else "another copy of the job"
            self._note_firing(delivery, message, StatusEvent.DUPLICATE, time.time(),
                              f"{what}: SQS message {other.sqs_message_id} runs it",
                              actor="scheduler" if mark.fired else "consumer")
            self.consumer.emit("duplicate_firing" if mark.fired else "duplicate_job",
                               delivery.log_id, duration=delivery.running_for(), fields={
                                   "receive_count": delivery.receive_count,
                                   "claimed_by": other.sqs_message_id,
                                   "claimed_at": other.claimed_at})
            return Outcome.DUPLICATE
        if mark.fired and delivery.receive_count == 1:  # Scheduler sent it: nothing says QUEUED
            sent = delivery.raw.get("Attributes", {}).get("SentTimestamp")
            self._note_firing(delivery, message, StatusEvent.QUEUED,
                              float(sent) / 1000.0 if sent else time.time())
        if not self._set_deadline(delivery, decision.deadline(
                time.monotonic(), self.consumer.processing_timeout, limit)):
            return Outcome.TAKEN
        return None

    def _note_firing(self, delivery: Delivery, message: ReceivedMessage, event: StatusEvent,
                     at: float, note: str = "", actor: str = "scheduler") -> None:
        """A tracked channel's record of a job that carries an id: a fired job's QUEUED by
        'scheduler' at the time SQS took it from Scheduler (SentTimestamp; it sorts before
        RECEIVED), a repeat's DUPLICATE ('scheduler' for a retried firing, 'consumer' for
        another copy of a pushed job), a cancelled job's CANCELLED, by who cancelled it.
        Written by the status store's writer; a failure there is only logged."""
        tracker, claims = self.consumer.status, self.consumer.firings
        if tracker is None or claims is None:
            return
        from messenger.jobs.status import StatusRecord
        tracker.record(StatusRecord(
            message.message_id, event, claims.channel, at=at,
            consumer_id=tracker.consumer_id, receive_count=delivery.receive_count,
            error=note, actor=actor))

    def _settle(self, key: str, delivery: Delivery, error: BaseException | None) -> None:
        """Record the idempotent handler's end: COMPLETED, or its claim deleted (`error`)."""
        guard = self.consumer.idempotency
        assert guard is not None
        try:
            if error is None:
                guard.complete(key)
            else:
                guard.abandon(key, error)
        except Exception as failed:
            # Completed: deleted all the same (it was processed; its key stays IN_PROGRESS
            # until the claim expires). Failed: the retry waits for the claim to expire.
            self.consumer.emit("idempotency_record_failed", delivery.log_id, fields={
                "completed": error is None, "error": f"{type(failed).__name__}: {failed}"})

    def _delete(self, delivery: Delivery, event: str, verdict: Outcome) -> Outcome:
        if not delivery.claim(Stage.RUNNING, self.done_stage):
            return Outcome.TAKEN
        self.consumer.emit(event, delivery.log_id, duration=delivery.running_for(),
                           fields={"receive_count": delivery.receive_count})
        return verdict

    def _busy(self, delivery: Delivery, busy: InProgressElsewhere) -> Outcome:
        """Its key runs elsewhere: visible again when that run's claim expires (neither failed
        nor dead-lettered)."""
        if not delivery.claim(Stage.RUNNING, Stage.DONE):
            return Outcome.TAKEN
        fields: dict[str, Any] = {"retry_after": busy.retry_after,
                                  "receive_count": delivery.receive_count}
        try:
            self._mailbox(delivery).retry_later(delivery, busy.retry_after)
        except Exception as failed:  # its lease runs out instead: redelivered a bit later
            fields["error"] = str(failed)
        self.consumer.emit("duplicate_in_progress", delivery.log_id, fields=fields)
        return Outcome.RETRY

    def _failed(self, delivery: Delivery, message: ReceivedMessage | None,
                error: BaseException) -> Outcome:
        """A failed run: reported with its cause ('failed', `final` when no retry can fix it),
        then as `decision.on_result` rules: dead-lettered (a final failure, or its last
        attempt), else visible again after its backoff delay."""
        if not delivery.claim(Stage.RUNNING, Stage.DONE):
            return Outcome.TAKEN
        failure = HandlerFailure.of(error)
        rules = self.rules
        facts = self.facts(delivery)
        verdict = decision.on_result(facts, rules, error)
        attempts = rules.attempts(facts)
        fields: dict[str, Any] = {**failure.fields(), "receive_count": delivery.receive_count,
                                  "max_attempts": attempts}
        if verdict.final:
            fields["final"] = True
        self.consumer.emit("failed", delivery.log_id, duration=delivery.running_for(),
                           fields=fields)
        self.consumer.run_hooks(LifecycleHooks.ON_ERROR, message, error)
        if verdict.action is Action.DEAD_LETTER:
            return self._forward(delivery, verdict.reason, failure)
        return self._retry(delivery, attempts=attempts, delay=verdict.delay)

    def _retry(self, delivery: Delivery, attempts: int | None = None,
               error: BaseException | None = None, delay: int | None = None) -> Outcome:
        """Visible again after `delay` (None: the backoff delay, `decision.retry_delay`);
        `error`: not the handler's (the idempotency store), reported on the 'retried' event."""
        if error is not None and not delivery.claim(Stage.RUNNING, Stage.DONE):
            return Outcome.TAKEN
        if delay is None:
            delay = decision.retry_delay(self.facts(delivery), self.rules)
        fields: dict[str, Any] = {"delay": delay, "receive_count": delivery.receive_count,
                                  "max_attempts": attempts or self.attempts(delivery)}
        if error is not None:
            fields["error"] = f"{type(error).__name__}: {error}"
        try:
            self._mailbox(delivery).retry_later(delivery, delay)
            self.consumer.emit("retried", delivery.log_id, fields=fields)
        except Exception as failed:  # its lease runs out instead: redelivered a bit later
            self.consumer.emit("retry_failed", delivery.log_id, fields={"error": str(failed)})
        return Outcome.RETRY

    def _unprocessable(self, delivery: Delivery, reason: str) -> Outcome:
        """Dead-lettered before any handler ran; its trace ends in a failed `process` span."""
        if not delivery.claim(Stage.RUNNING, Stage.DONE):
            return Outcome.TAKEN
        mailbox = self._mailbox(delivery)
        ProcessTrace.unprocessable(self.consumer.settings.tracing, delivery.raw,
                                   mailbox.queue_url, delivery.log_id, reason)
        return self._forward(delivery, reason)

    def _forward(self, delivery: Delivery, reason: str,
                 failure: HandlerFailure | None = None) -> Outcome:
        """To the DLQ with the reason and a note of what failed (`failure_note`), then deleted
        (claimed already)."""
        from messenger.consume.tracking import consumer_id

        if self._keep(delivery, self._dead_letter_outcome(delivery, reason, failure)) \
                is not None:  # not forwarded: the DLQ would hold a job with no outcome
            return self._retry(delivery)
        try:
            self._mailbox(delivery).dead_letter(
                delivery, reason, failure_note(delivery.receive_count, consumer_id(), failure))
        except Exception as error:
            self.consumer.emit("dead_letter_failed", delivery.log_id, fields={
                "reason": reason, "error": f"{type(error).__name__}: {error}"})
            then = decision.on_forward_failed(self.rules, failure is not None, reason, error,
                                              timed_out=delivery.stage is Stage.TIMED_OUT)
            if then.action is Action.STOP_CONSUMER and self.stop is not None:
                self.stop(ProcessingTimeout(then.reason) if delivery.stage is Stage.TIMED_OUT
                          else error)
            return Outcome.KEPT
        self.consumer.emit("dead_lettered", delivery.log_id, duration=delivery.running_for(),
                           fields={"reason": reason, "receive_count": delivery.receive_count})
        self._release_firing(delivery)
        return Outcome.DEAD_LETTERED

    # -- results (keep_results) --------------------------------------------------------------
    @property
    def _channel(self) -> str:
        results = self.consumer.results
        return results.channel if results is not None else ""

    def _keep(self, delivery: Delivery, outcome: FinalOutcome) -> BaseException | None:
        """Record a final outcome before the message leaves its queue, on a channel that keeps
        results (`messenger.consume.results`): None when written (or nothing to write), else
        the store's error, reported ('result_record_failed')."""
        results = self.consumer.results
        if results is None:
            return None
        try:
            results.keep(outcome)
        except Exception as error:
            self.consumer.emit("result_record_failed", delivery.log_id, fields={
                "outcome": outcome.outcome.value, "receive_count": delivery.receive_count,
                "error": f"{type(error).__name__}: {error}"})
            return error
        return None

    def _dead_letter_outcome(self, delivery: Delivery, reason: str,
                             failure: HandlerFailure | None) -> FinalOutcome:
        """The final outcome of a message about to be dead-lettered with `reason`: CANCELLED
        when an operator cancelled it running, else DEAD_LETTERED with what failed."""
        by = delivery.cancelled_by
        if by is not None and reason == decision.cancelled_reason(by):
            return FinalOutcome(delivery.log_id, self._channel, FinalState.CANCELLED,
                                time.time(), reason=reason)
        error_type, error = "", ""
        if failure is not None:
            error_type, error = failure.error_type, failure.error_message
        elif delivery.stage is Stage.TIMED_OUT:
            error_type = ProcessingTimeout.__name__
        return FinalOutcome(delivery.log_id, self._channel, FinalState.DEAD_LETTERED,
                            time.time(), error_type=error_type, error=error, reason=reason)

    # -- held back by a limit (messenger.consume.limits) -------------------------------------
    def _admit(self, delivery: Delivery, message: ReceivedMessage, limit: float | None
               ) -> Outcome | None:
        """The limit gate (a channel with limits): None once the job may start (after a wait
        here, not counted against its processing timeout), else HELD (or TAKEN)."""
        gate = self.consumer.limits
        if gate is None:
            return None
        self._set_deadline(delivery, limit)
        try:
            units = max(1, int(self.consumer.weight(message)))
        except Exception as error:  # a weight that fails is 1: the job still runs
            self.consumer.emit("weight_failed", delivery.log_id, fields={
                "error": f"{type(error).__name__}: {error}"})
            units = 1
        marks = held_marks(delivery.raw)
        delay = gate.admit(delivery.group_id, units,
                           None if limit is None else limit - self.clock(),
                           self.consumer.ordered, marks.holds,
                           alive=lambda: delivery.stage is Stage.RUNNING, job=delivery.log_id)
        if delay:
            return self._send_back(delivery, delay, decision.LIMITED, marks)
        if not self._set_deadline(delivery, decision.deadline(
                time.monotonic(), self.consumer.processing_timeout, limit)):
            return Outcome.TAKEN
        return None

    def _rate_limited(self, delivery: Delivery, error: RateLimited, budget: float,
                      limit: float | None) -> Outcome:
        """The handler said the upstream is saturated: not a failure (`decision.on_result`:
        HOLD). The process's jobs of the channel pause for `retry_after`; this one waits here
        and runs again when that is short (`decision.on_limited`), else is held back."""
        gate = self.consumer.limits
        if gate is not None:
            gate.rate_limited(error.retry_after)
        verdict = decision.on_result(self.facts(delivery), self.rules, error)
        marks = held_marks(delivery.raw)
        room = None if limit is None else limit - self.clock()
        then = decision.on_limited(error.retry_after, room, self.consumer.ordered, marks.holds)
        if then.action is Action.RUN and delivery.waits < MAX_WAITS_HERE:
            if not self._set_deadline(delivery, limit):
                return Outcome.TAKEN
            self.consumer.emit("held", delivery.log_id, fields={
                "reason": verdict.reason, "wait": error.retry_after, "in_consumer": True,
                "receive_count": delivery.receive_count})
            delivery.waits += 1
            time.sleep(error.retry_after)
            if not self._set_deadline(delivery, decision.deadline(
                    time.monotonic(), self.consumer.processing_timeout, limit)):
                return Outcome.TAKEN
            return self.run(delivery, budget, limit)
        delay = max(verdict.delay, then.delay) if then.action is Action.HOLD else verdict.delay
        return self._send_back(delivery, delay, verdict.reason, marks)

    def _send_back(self, delivery: Delivery, delay: int, reason: str,
                   marks: HeldMarks | None = None) -> Outcome:
        """Hold a job back for `delay` seconds without using an attempt: sent again as a new
        message carrying the attempts it used (`Mailbox.hold`), its own claim of its job id
        given back, then deleted (HELD). An ordered channel's job (a copy would go behind its
        group), or one whose send failed, is visible again after the delay instead (RETRY:
        SQS counts that receive)."""
        marks = marks or held_marks(delivery.raw)
        fields: dict[str, Any] = {"reason": reason, "delay": delay,
                                  "receive_count": delivery.receive_count,
                                  "attempt": delivery.attempt, "holds": marks.holds + 1}
        if not self.consumer.ordered:
            until = time.time() + delay if delay > decision.MAX_HOLD_DELAY_SECONDS else 0.0
            try:
                self._mailbox(delivery).hold(delivery, delay, HeldMarks(
                    delivery.attempt - 1, marks.holds + 1, until))
            except Exception as error:
                fields["error"] = f"{type(error).__name__}: {error}"
            else:
                if not delivery.claim(Stage.RUNNING, self.done_stage):
                    return Outcome.TAKEN  # (a duplicate at worst: the copy is sent)
                self._release_firing(delivery)
                self.consumer.emit("held", delivery.log_id, fields=fields)
                return Outcome.HELD
        if not delivery.claim(Stage.RUNNING, Stage.DONE):
            return Outcome.TAKEN
        fields["counted"] = True  # this receive counts toward max_receives
        try:
            self._mailbox(delivery).retry_later(
                delivery, min(delay, decision.MAX_HOLD_DELAY_SECONDS))
            self.consumer.emit("held", delivery.log_id, fields=fields)
        except Exception as failed:  # its lease runs out instead: redelivered a bit later
            self.consumer.emit("retry_failed", delivery.log_id, fields={"error": str(failed)})
        return Outcome.RETRY

    def _release_firing(self, delivery: Delivery) -> None:
        """A dead-lettered copy of a job that carries an id gives its claim back (only its
        own): a requeue of the job is then a run of its own, not a repeat."""
        claims = self.consumer.firings
        mark = received_job_mark(delivery.raw) if claims is not None else None
        if claims is not None and mark is not None:
            claims.release(mark.job_id, delivery.sqs_message_id)

    @staticmethod
    def _mailbox(delivery: Delivery) -> Mailbox:
        assert delivery.mailbox is not None, "a delivery knows its mailbox"
        return delivery.mailbox
