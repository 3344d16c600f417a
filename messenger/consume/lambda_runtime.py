"""A `Consumer` subclass run by AWS Lambda on the SQS batches of its event source.

The team's class is the one `messenger consume` runs on Fargate: the same handler, hooks,
status tracking, lifecycle events, offloaded bodies and dead-letter decisions. Lambda polls the
queue; Powertools' batch utility (`BatchProcessor`, or `SqsFifoPartialProcessor` on an ordered
channel) turns each message's outcome into the partial batch response, so only failed messages
return to the queue (the event source must report batch item failures: `LambdaConsumer` sets it).

Per message, the verdict is the Fargate runtime's: both call the one outcome policy
(`messenger.consume.outcome`: decode, the handler under its timeout, completed / duplicate /
retry after a capped backoff / dead letter with reason and traceback). Here a completed or
duplicate message is reported as a success (Lambda deletes it), a dead-lettered one too (the
forward deleted it); a retried one (visible again after its delay) or one whose forward failed
is a batch item failure. A handler's `KeyboardInterrupt` or `SystemExit` is that message's
failure, as on Fargate, never the whole invocation's.
A message's time is also bounded by the invocation's: a handler still running `FINISH_SECONDS`
before the function would time out is interrupted and the message released (visible again at
once, 'released' with reason 'out_of_time'), and once that time has come no further message of
the batch starts: each is released the same way. Released messages are batch item failures;
SQS counts their receive. On an ordered channel a failed message stops the rest of its group
(Powertools' FIFO processor, `skip_group_on_error`); those are released ('group_blocked') so
the group resumes, in order, as soon as the failed message is visible again.

Handlers run one after another on a handler thread while the invocation's thread watches each
message's deadline: a handler blocked in C code past it (no interruption reaches it) is left
behind on its thread ('stuck') and the batch goes on, so the invocation always answers and
Lambda deletes what was handled. Parallelism is the event source's (concurrent invocations, up
to its maximum concurrency).

An operator's cancel of a running job (`messenger cancel`, the dashboard: a request in the
worker registry's table, `messenger.jobs.controls`) reaches a handler here too: while a message
runs, the invocation's thread reads the channel's requests every `CANCEL_CHECK_SECONDS` (one
Query; none for a message that ends sooner), and a requested message's deadline becomes now, so
it is stopped as a processing timeout would stop it: dead-lettered 'cancelled by <who>',
CANCELLED with who on its timeline, the request deleted. The first read of an execution
environment looks the table up (one DescribeTable); without one, nothing more is read there.
"""

from __future__ import annotations

import base64
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypedDict

from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    SqsFifoPartialProcessor,
    process_partial_response,
)
from botocore.exceptions import ClientError

from messenger.aws import call_with_budget, error_code
from messenger.channel import MAX_BATCH_ENTRIES
from messenger.consume import decision
from messenger.consume.consumer import Consumer, load_consumer
from messenger.consume.controls import READ_TIMEOUT_SECONDS as CONTROL_READ_TIMEOUT
from messenger.consume.controls import act_on_cancels, stop_now
from messenger.consume.decision import Action
from messenger.consume.lifecycle import (
    ConsumerState,
    configure_json_logging,
    one_received_line,
)
from messenger.consume.mailbox import Delivery, EntryError, Mailbox, Stage
from messenger.consume.outcome import Outcome, OutcomePolicy
from messenger.consume.watchdog import ProcessingTimeout, interrupt
from messenger.errors import InvalidSettings, MessengerError
from messenger.jobs.controls import CancelRequests
from messenger.offload import PayloadStore
from messenger.provision import Provisioner


class BatchResponse(TypedDict):
    """The partial batch response Lambda's SQS event source reads (ReportBatchItemFailures):
    each failed record as {"itemIdentifier": <its messageId>}."""

    batchItemFailures: list[Any]


#: Seconds of an invocation kept for what follows the last handler: dead-letter forwards,
#: releases, the status records and the response. No message starts later than this before
#: the function's timeout, and a handler still running then is interrupted.
FINISH_SECONDS = 3.0
#: Seconds an interrupted handler gets to return before it is left behind on its thread (one
#: blocked in C code cannot be interrupted): at most a third of FINISH_SECONDS.
STUCK_GRACE_SECONDS = 1.0
#: Seconds between reads of the channel's cancel requests while a message runs (one Query
#: each): an operator's cancel stops a handler within about this, as a Fargate consumer's
#: heartbeat does.
CANCEL_CHECK_SECONDS = 5.0
#: The environment variable naming the consumer class ('package.module:Class').
CONSUMER_VARIABLE = "MESSENGER_CONSUMER"
#: `_Batch._expire`: the message's deadline moved on (the idempotency store's time).
_NOT_YET = "not_yet"


class MessageNotFinished(MessengerError):
    """A message stays in its queue (failed, released or not started): a batch item failure."""


# -- the event shape ------------------------------------------------------------------------------
def sqs_message(record: Mapping[str, Any]) -> dict[str, Any]:
    """A Lambda SQS event record as the ReceiveMessage message it was (what `Delivery` reads).

    Lambda writes attribute values in camelCase, binary ones base64-encoded; SendMessage wants
    bytes (a message forwarded to the DLQ keeps its attributes unchanged)."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in (record.get("messageAttributes") or {}).items():
        entry: dict[str, Any] = {"DataType": value["dataType"]}
        if value.get("stringValue") is not None:
            entry["StringValue"] = value["stringValue"]
        if value.get("binaryValue") is not None:
            entry["BinaryValue"] = base64.b64decode(value["binaryValue"])
        attributes[name] = entry
    return {
        "MessageId": record["messageId"],
        "ReceiptHandle": record["receiptHandle"],
        "Body": record.get("body", ""),
        "Attributes": dict(record.get("attributes") or {}),
        "MessageAttributes": attributes,
        "MD5OfBody": record.get("md5OfBody", ""),
    }


#: Seconds SQS's timestamps and this host's clock may differ by (counted against the message).
CLOCK_SKEW_SECONDS = 2.0


def seconds_since_receive(record: Mapping[str, Any], visibility_timeout: float) -> float:
    """At least how long ago Lambda's poller received the record (never less than it was).

    Lambda receives first and invokes later (a batching window of up to 5 minutes, invocations
    retried when throttled), and SQS counts its 12 hours in flight from the receive: a retry
    delay computed from the invocation's start could ask for more than SQS allows, and the
    ChangeMessageVisibility fails. The record does not say when this receive happened; two
    bounds do: its first receive (ApproximateFirstReceiveTimestamp, epoch ms; this receive's
    own on a first delivery), and the visibility timeout (a record still ours was received
    less than that long ago). The tighter of the two, with the clock skew added."""
    by_timeout = float(visibility_timeout)
    first = (record.get("attributes") or {}).get("ApproximateFirstReceiveTimestamp")
    try:
        by_first = time.time() - int(str(first)) / 1000 + CLOCK_SKEW_SECONDS
    except (TypeError, ValueError):
        return by_timeout
    return max(0.0, min(by_timeout, by_first))


def sqs_event(
    messages: Sequence[Mapping[str, Any]], queue_arn: str, region: str
) -> dict[str, Any]:
    """The Lambda event of received messages (ReceiveMessage's shape, attributes included),
    as Lambda's SQS event source builds it: to run the handler locally on real messages."""
    records = []
    for message in messages:
        attributes = {}
        for name, value in (message.get("MessageAttributes") or {}).items():
            binary = value.get("BinaryValue")
            attributes[name] = {
                "stringValue": value.get("StringValue"),
                "binaryValue": base64.b64encode(binary).decode() if binary is not None else None,
                "stringListValues": [], "binaryListValues": [], "dataType": value["DataType"],
            }
        records.append({
            "messageId": message["MessageId"],
            "receiptHandle": message["ReceiptHandle"],
            "body": message["Body"],
            "attributes": dict(message.get("Attributes") or {}),
            "messageAttributes": attributes,
            "md5OfBody": message.get("MD5OfBody", ""),
            "eventSource": "aws:sqs",
            "eventSourceARN": queue_arn,
            "awsRegion": region,
        })
    return {"Records": records}


def queue_name_of(arn: str) -> str:
    return arn.rsplit(":", 1)[-1]


class LocalEventSource:
    """Lambda's SQS event source played locally on one queue: receive a batch (all attributes,
    as the event source does), invoke a handler with its event, then do what SQS does with the
    partial batch response: delete every message not listed as a failure.

    sqs: an SQS client. queue_url: the queue polled. region: the records' awsRegion.
    visibility: the lease of a received batch, seconds (default 60; the queue's own on AWS).
    """

    def __init__(self, sqs: Any, queue_url: str, region: str, visibility: int = 60) -> None:
        self.sqs = sqs
        self.queue_url = queue_url
        self.region = region
        self.visibility = visibility
        self.queue_arn = str(sqs.get_queue_attributes(
            QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"])

    def receive(self, count: int = 10, wait_seconds: int = 1) -> list[dict[str, Any]]:
        """One poll for at most `count` messages."""
        response = self.sqs.receive_message(
            QueueUrl=self.queue_url, MaxNumberOfMessages=count, WaitTimeSeconds=wait_seconds,
            VisibilityTimeout=self.visibility, MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
        )
        return list(response.get("Messages", []))

    def invoke(
        self, handler: Callable[[dict[str, Any], Any], Mapping[str, Any]],
        messages: Sequence[Mapping[str, Any]], context: Any,
    ) -> Mapping[str, Any]:
        """`handler(event, context)` on `messages`, its response applied to the queue."""
        response = handler(sqs_event(messages, self.queue_arn, self.region), context)
        failed = {item["itemIdentifier"] for item in response.get("batchItemFailures", [])}
        done = [m for m in messages if m["MessageId"] not in failed]
        for start in range(0, len(done), MAX_BATCH_ENTRIES):
            chunk = done[start:start + MAX_BATCH_ENTRIES]
            self.sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(chunk)
            ])
        return response


# -- the runtime --------------------------------------------------------------------------------
class LambdaConsumerRuntime:
    """One consumer in one Lambda execution environment: the channel is resolved once (cold
    start: INITIALIZING → INITIALIZED, with their hooks), then `handle` runs each invocation
    (PROCESSING, then IDLE).

    consumer: the consumer instance. finish_seconds: see FINISH_SECONDS (>= 0).
    cancel_interval: seconds between reads of cancel requests while a message runs (default
    CANCEL_CHECK_SECONDS, > 0; None: never read).
    """

    def __init__(self, consumer: Consumer, finish_seconds: float = FINISH_SECONDS,
                 cancel_interval: float | None = CANCEL_CHECK_SECONDS) -> None:
        if not finish_seconds >= 0:
            raise InvalidSettings(f"finish_seconds must be >= 0, got {finish_seconds!r}")
        if cancel_interval is not None and not cancel_interval > 0:
            raise InvalidSettings(f"cancel_interval must be > 0, got {cancel_interval!r}")
        self.consumer = consumer
        self.finish_seconds = finish_seconds
        self.cancel_interval = cancel_interval
        #: The channel's cancel requests; looked up at the first read (None: not yet).
        self._cancels: CancelRequests | None = None
        self._cancels_known: bool | None = None
        consumer.transition(ConsumerState.INITIALIZING)
        provisioner = Provisioner(consumer.clients, consumer.settings)
        consumer.resources = call_with_budget(
            lambda: provisioner.ensure_channel(consumer.spec),
            consumer.settings.retry_budget_seconds, f"resolving channel {consumer.spec.name!r}",
        )
        if consumer.status is not None:
            consumer.status.start()
        if consumer.idempotency is not None:  # a missing table fails the cold start
            consumer.idempotency.ensure()
        consumer.start_limits(consumer.resources)  # (a channel with limits: its gate)
        # the Fargate runtime's own, on the client that resolved the channel
        default, poller = consumer.mailboxes(consumer.resources, consumer.clients.client("sqs"))
        boxes = list(poller.by_level.values()) if poller is not None else [default]
        for box in boxes:
            # An SQS call after the last handler (a forward, the releases) must end before the
            # function does: its retries stop within FINISH_SECONDS.
            box.budget = min(box.budget, max(1.0, finish_seconds))
        #: The channel's mailboxes by queue name (each priority level has its queue).
        self.mailboxes: dict[str, Mailbox] = {
            box.queue_url.rstrip("/").rsplit("/", 1)[-1]: box for box in boxes
        }
        self.store = PayloadStore(lambda: consumer.clients.client("s3"), "")
        #: What happens to each message (shared with the Fargate runtime).
        self.outcomes = OutcomePolicy(consumer, self.store)
        self._handlers: ThreadPoolExecutor | None = None
        consumer.transition(ConsumerState.INITIALIZED)

    def handler_thread(self) -> ThreadPoolExecutor:
        """The thread handlers run on (made at first use, kept across invocations)."""
        if self._handlers is None:
            self._handlers = ThreadPoolExecutor(1, thread_name_prefix="messenger-handler")
        return self._handlers

    def cancel_requests(self) -> CancelRequests | None:
        """The channel's cancel requests when the worker registry's table exists (looked up at
        the first call of the execution environment: one DescribeTable); None without it."""
        if self._cancels_known is None:
            consumer = self.consumer
            dynamodb = consumer.clients.client("dynamodb", read_timeout=CONTROL_READ_TIMEOUT)
            cancels = CancelRequests(consumer.clients, consumer.settings, consumer.spec.name,
                                     dynamodb=dynamodb)
            try:
                dynamodb.describe_table(TableName=cancels.table)
            except ClientError as error:
                if error_code(error) != "ResourceNotFoundException":
                    raise
                self._cancels_known = False
            else:
                self._cancels, self._cancels_known = cancels, True
        return self._cancels

    def abandon_handler_thread(self) -> None:
        """Leave a handler blocked past its deadline on its thread; the next gets a new one."""
        if self._handlers is not None:
            self._handlers.shutdown(wait=False)
            self._handlers = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LambdaConsumerRuntime:
        """The runtime of the class named by MESSENGER_CONSUMER, with JSON lifecycle logs."""
        env = os.environ if environ is None else environ
        target = env.get(CONSUMER_VARIABLE, "")
        if not target:
            raise InvalidSettings(
                f"{CONSUMER_VARIABLE} must name the consumer class ('package.module:Class')"
            )
        configure_json_logging()
        return cls(load_consumer(target)())

    def handle(self, event: dict[str, Any], context: Any) -> BatchResponse:
        """Run one SQS batch; the partial batch response lists what stays in the queue."""
        return _Batch(self, context).run(event)


class _Batch:
    """One invocation: its records, its deadline and what it releases at the end."""

    def __init__(self, runtime: LambdaConsumerRuntime, context: Any) -> None:
        self.runtime = runtime
        self.consumer = runtime.consumer
        remaining = context.get_remaining_time_in_millis() / 1000.0
        #: Monotonic time after which no message starts and a running handler is interrupted.
        self.deadline = time.monotonic() + remaining - runtime.finish_seconds
        self.seen: set[str] = set()
        self.releases: list[tuple[Delivery, str]] = []

    def run(self, event: dict[str, Any]) -> BatchResponse:
        consumer = self.consumer
        records = event.get("Records") or []
        if not records:  # (Lambda sends none; Powertools refuses an empty batch)
            return {"batchItemFailures": []}
        deliveries = [self.delivery(record) for record in records]
        with one_received_line():
            for delivery in deliveries:
                if delivery is not None:
                    fields: dict[str, Any] = {
                        "receive_count": delivery.receive_count, "group_id": delivery.group_id,
                    }
                    if delivery.level is not None:
                        fields["priority"] = delivery.level
                    consumer.emit("received", delivery.log_id, fields=fields)
        processor: BatchProcessor
        if consumer.ordered:
            processor = SqsFifoPartialProcessor(skip_group_on_error=True)
        else:
            processor = BatchProcessor(EventType.SQS)
        # Every outcome is in the response, also when every message failed: the function's
        # Errors metric then means the function itself failed (crash, timeout, bad setup).
        processor.raise_on_entire_batch_failure = False
        by_id = {d.sqs_message_id: d for d in deliveries if d is not None}
        if consumer.limits is not None:  # its records run one after another: units for each
            consumer.limits.runs_at_once(len(by_id))
        consumer.transition(ConsumerState.PROCESSING)
        try:
            response = process_partial_response(
                event=event, record_handler=lambda record: self.handle_record(by_id, record),
                processor=processor,
            )
        finally:
            self.finish(processor, by_id)
            consumer.transition(ConsumerState.IDLE)
        return response

    def delivery(self, record: dict[str, Any]) -> Delivery | None:
        """The record as a delivery of its queue's mailbox (None: not one of the channel's)."""
        mailbox = self.runtime.mailboxes.get(queue_name_of(str(record.get("eventSourceARN", ""))))
        if mailbox is None:
            return None
        now = time.monotonic()
        held = seconds_since_receive(record, self.consumer.visibility_timeout)
        return Delivery(sqs_message(record), now, now + self.consumer.visibility_timeout,
                        mailbox=mailbox, handed_out_after=now - held)

    # -- one record -------------------------------------------------------------------------
    def handle_record(self, by_id: dict[str, Delivery], record: Any) -> None:
        """Powertools' record handler: returns when the message is finished for good (Lambda
        deletes it), raises MessageNotFinished when it stays in the queue."""
        delivery = by_id.get(record.message_id)
        self.seen.add(record.message_id)
        if delivery is None:
            source = record.raw_event.get("eventSourceARN")
            self.consumer.emit("unknown_source", record.message_id, fields={
                "event_source_arn": source, "queues": sorted(self.runtime.mailboxes),
            })
            raise MessageNotFinished(f"{source} is not a queue of channel "
                                     f"{self.consumer.spec.name!r}")
        outcomes = self.runtime.outcomes
        first = decision.on_receive(outcomes.facts(delivery), outcomes.rules, time.monotonic(),
                                    self.deadline)
        if first.action is Action.RELEASE:
            self.release(delivery, first.reason)
            raise MessageNotFinished("the invocation's time ran out before it started")
        if not self.process(delivery):
            raise MessageNotFinished("not finished: see its lifecycle events")

    def process(self, delivery: Delivery) -> bool:
        """Run one message (`OutcomePolicy.run`); True when it is finished for good (handled or
        dead-lettered).

        The handler runs on the runtime's handler thread while this (the invocation's) thread
        watches its deadline: at the deadline the handler is interrupted; one blocked in C code
        that does not return within STUCK_GRACE_SECONDS is left behind on its thread (a new one
        takes the next message), so the invocation still answers in time."""
        with delivery.lock:
            delivery.stage = Stage.RUNNING
            delivery.started_at = time.monotonic()
            delivery.deadline = decision.deadline(delivery.started_at,
                                                  self.consumer.processing_timeout, self.deadline)
        running = self.runtime.handler_thread().submit(self._run_guarded, delivery)
        interval = self.runtime.cancel_interval
        next_check = None if interval is None else delivery.started_at + interval
        while True:
            with delivery.lock:  # (the policy moves it while the idempotency store is called)
                due = self.deadline if delivery.deadline is None else delivery.deadline
            # A read of cancel requests may take CONTROL_READ_TIMEOUT: none that could delay
            # the deadline's interruption.
            checking = next_check is not None and next_check < due - CONTROL_READ_TIMEOUT
            wake = next_check if checking and next_check is not None else due
            try:
                verdict = running.result(timeout=max(0.0, wake - time.monotonic()))
                break
            except FutureTimeout:
                pass
            if checking and interval is not None:
                self._read_cancels(delivery)
                next_check = time.monotonic() + interval
                continue
            cut = self._expire(delivery)
            if cut is _NOT_YET:
                continue
            try:
                verdict = running.result(timeout=min(STUCK_GRACE_SECONDS,
                                                     self.runtime.finish_seconds / 3))
            except FutureTimeout:
                self.runtime.abandon_handler_thread()
                self.consumer.emit("stuck", delivery.log_id, fields={"cut": cut})
                if cut is None:  # its handler had returned; a retry or forward is under way
                    return False
                verdict = Outcome.TAKEN
            break
        if verdict is Outcome.TIMED_OUT or verdict is Outcome.TAKEN:
            return self._timed_out(delivery)
        return verdict.finished

    def _run_guarded(self, delivery: Delivery) -> Outcome:
        with delivery.lock:
            delivery.thread_id = threading.get_ident()
        mailbox = delivery.mailbox
        assert mailbox is not None
        budget = max(0.1, min(mailbox.budget, self.deadline - time.monotonic()))
        try:
            return self.runtime.outcomes.run(delivery, budget, limit=self.deadline)
        except ProcessingTimeout:  # an interruption that arrived as the handler returned
            return Outcome.TAKEN

    def _read_cancels(self, delivery: Delivery) -> None:
        """One read of the channel's cancel requests while `delivery` runs: a request naming it
        moves its deadline to now (`stop_now`), and it is stopped as a processing timeout."""
        consumer = self.consumer
        try:
            cancels = self.runtime.cancel_requests()
        except Exception as error:  # looked up again at the next read
            consumer.emit("control_read_failed", fields={
                "control": "cancel", "error": f"{type(error).__name__}: {error}"})
            return
        if cancels is not None:
            act_on_cancels(consumer, cancels, [delivery], self._cancel)

    def _cancel(self, delivery: Delivery, by: str) -> bool:
        if not stop_now(delivery, by):
            return False
        self.consumer.emit("cancel_requested", delivery.log_id, fields={"by": by})
        return True

    def _cut_of(self, delivery: Delivery) -> str:
        """Why its deadline came (the 'stuck' event's `cut`): an operator's cancel, the
        invocation's end (OUT_OF_TIME) or its processing timeout (`decision.on_deadline`)."""
        if delivery.cancelled_by is not None:
            return "cancelled"
        verdict = self.runtime.outcomes.at_deadline(delivery, self.deadline)
        return verdict.reason if verdict.action is Action.RELEASE else "processing_timeout"

    def _expire(self, delivery: Delivery) -> str | None:
        """The message's deadline came: interrupt its handler; returns why (`_cut_of`), None
        when it had finished meanwhile, _NOT_YET when its deadline moved on."""
        with delivery.lock:
            if delivery.stage is not Stage.RUNNING:
                return None
            outcomes = self.runtime.outcomes
            if decision.on_deadline(outcomes.facts(delivery), outcomes.rules, delivery.deadline,
                                    self.deadline, now=time.monotonic()).action is Action.RUN:
                return _NOT_YET
            delivery.stage = Stage.TIMED_OUT
            if delivery.in_handler and delivery.thread_id is not None:
                interrupt(delivery.thread_id, ProcessingTimeout)
            return self._cut_of(delivery)

    def _timed_out(self, delivery: Delivery) -> bool:
        """Its deadline came: past processing_timeout or cancelled → the DLQ, as on Fargate;
        cut short by the invocation's end → released, to run again in another invocation."""
        if delivery.stage is not Stage.TIMED_OUT:  # the policy gave its verdict meanwhile
            return False
        delivery.stage = Stage.DONE
        outcomes = self.runtime.outcomes
        verdict = outcomes.at_deadline(delivery, self.deadline)
        if verdict.action is Action.RELEASE:  # out of time: runs in another invocation
            self.release(delivery, verdict.reason)
            return False
        outcomes.report_timeout(delivery)
        return outcomes.forward_timed_out(delivery).finished

    def release(self, delivery: Delivery, reason: str) -> None:
        """Give the message back at the end of the invocation (visible again at once)."""
        delivery.stage = Stage.DONE
        self.releases.append((delivery, reason))

    # -- the end ----------------------------------------------------------------------------
    def finish(self, processor: BatchProcessor, by_id: dict[str, Delivery]) -> None:
        """Release what did not run (a group blocked behind a failure, the time ran out) in
        one batch call per queue, then write the status records held."""
        unseen = [by_id[message_id] for message_id in (
            str(getattr(record, "message_id", "")) for record in processor.fail_messages)
            if message_id not in self.seen and message_id in by_id]
        # (short-circuited by the FIFO processor after a message not finished for good)
        then = decision.after_step(self.consumer.ordered, False, len(unseen))
        if then.action is Action.RELEASE_REST:
            for delivery in unseen:
                self.release(delivery, then.reason)
        if self.releases:
            deliveries = [delivery for delivery, _ in self.releases]
            box = deliveries[0].mailbox
            assert box is not None
            try:
                errors = box.release(deliveries)
            except Exception as error:  # visible again when their leases end instead
                errors = [EntryError(d, type(error).__name__, str(error)) for d in deliveries]
            failed = {id(e.delivery) for e in errors}
            for delivery, reason in self.releases:
                self.consumer.emit("released", delivery.log_id, fields={
                    "reason": reason, "ok": id(delivery) not in failed,
                })
        status = self.consumer.status
        if status is not None:  # a frozen execution environment writes nothing
            try:
                status.store.flush()
            except Exception as error:
                self.consumer.emit("status_flush_failed", fields={"error": str(error)})
