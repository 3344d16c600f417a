"""`Requeuer`: move messages from a queue (usually a DLQ) back to a channel (`messenger requeue`
is its command-line view, `messenger.tools.requeue`).

    Requeuer(source_queue='orders-dlq', destination_channel='orders').start()
    Requeuer(source_queue='audit_log-dlq.fifo', destination_channel='wishlist_events',
             destination_type=SubscriberTypes.MultiConsumer).start()

Body and attributes (routing key, meta headers, message id, offload pointer) move unchanged; the
consumer's `dead_letter_reason` is dropped. A message is deleted from the source only after the
destination accepted it: a crash in between leaves at worst a duplicate, never a loss (an ordered
destination drops that duplicate: its deduplication id is the source copy's MessageId).

A destination `exchange.queue` is that consumer's own queue, not the exchange: the exchange's other
consumers do not get a second copy. A destination whose messages would flow back into the source
(the source queue itself, or an exchange the source queue subscribes to) is refused before anything
moves: such a run would never end. A run is done only when the source holds nothing: messages
still in flight there (a killed run's, hidden for `visibility_timeout` seconds) are reported in
`RequeueReport.in_flight`, and `wait_seconds` waits for them to come back and moves them too.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from messenger.aws import ClientFactory, call_with_budget
from messenger.channel import (
    DLQ_SUFFIX,
    FIFO_SUFFIX,
    MAX_BATCH_ENTRIES,
    ROUTING_KEY_ATTRIBUTE,
    ChannelSpec,
    physical_name,
)
from messenger.errors import ChannelNotFound, InvalidSettings, MessageDecodeError
from messenger.jobs.status import StatusEvent, StatusRecord, StatusStore
from messenger.message import (
    DEAD_LETTER_FAILURE_ATTRIBUTE,
    DEAD_LETTER_REASON_ATTRIBUTE,
    MESSAGE_ID_ATTRIBUTE,
    EncodedMessage,
    sendable_attributes,
)
from messenger.offload import OffloadPointer, PayloadStore
from messenger.produce.transport import OutgoingMessage, QueueTarget, TopicTarget
from messenger.provision import Provisioner, QueueRef
from messenger.settings import Settings
from messenger.tracing import SNS_SYSTEM, SQS_SYSTEM, requeue_span

logger = logging.getLogger("messenger.requeue")

#: Seconds a message being moved stays invisible in the source queue.
MOVE_VISIBILITY_TIMEOUT = 60


class SubscriberTypes(enum.Enum):
    """What the destination channel is: one queue, or an exchange fanned out to several."""

    SingleConsumer = "single"
    MultiConsumer = "multi"


@dataclass
class RequeueReport:
    """What a run did (or, in a dry run, would do)."""

    source_queue: str
    destination: str
    dry_run: bool = False
    moved: int = 0
    failed: int = 0
    routing_keys: dict[str, int] = field(default_factory=dict)
    #: Messages left in the source but invisible (in flight or delayed) when the run ended.
    in_flight: int = 0
    #: The run stopped at max_messages.
    stopped_at_max: bool = False

    @property
    def done(self) -> bool:
        """Everything moved: nothing failed and nothing is left in flight in the source."""
        return self.failed == 0 and self.in_flight == 0

    def summary(self) -> str:
        """One line for people: what moved, what failed, and what is left."""
        verb = "would move" if self.dry_run else "moved"
        line = f"{verb} {self.moved} message(s) from {self.source_queue} to {self.destination}"
        if self.failed:
            line += f", {self.failed} failed (still in {self.source_queue})"
        if self.in_flight:
            line += (
                f"; NOT DONE: {self.in_flight} message(s) still in flight in {self.source_queue} "
                f"(a killed run's or another reader's): run again when they are visible again, "
                f"or with --wait"
            )
        return line


class Requeuer:
    """Moves every message of `source_queue` to `destination_channel`.

    source_queue: physical queue name, or a logical one the namespace prefix is added to.
    destination_channel: a queue (SingleConsumer) or an exchange (MultiConsumer), logical name.
    ordered: whether the destination is FIFO (default: the source's FIFO-ness).
    max_messages: stop after this many (None: all). dry_run: report, move nothing.
    progress: called with (done, estimated_total) after each batch.
    wait_seconds: wait up to this long for messages in flight in the source to come back, and
    move them too (0: report them and stop). visibility_timeout: seconds a message being moved
    stays hidden in the source (60); what a killed run hides comes back after it.
    actor: who asked (an operator's name), recorded on each REQUEUED status record.
    """

    def __init__(
        self,
        source_queue: str,
        destination_channel: str,
        destination_type: SubscriberTypes = SubscriberTypes.SingleConsumer,
        ordered: bool | None = None,
        max_messages: int | None = None,
        dry_run: bool = False,
        settings: Settings | None = None,
        clients: ClientFactory | None = None,
        progress: Callable[[int, int], None] | None = None,
        track_status: bool | None = None,
        wait_seconds: float = 0.0,
        visibility_timeout: int = MOVE_VISIBILITY_TIMEOUT,
        actor: str = "",
    ) -> None:
        if not isinstance(destination_type, SubscriberTypes):
            raise InvalidSettings(
                f"destination_type must be one of "
                f"{', '.join(t.name for t in SubscriberTypes)}, got {destination_type!r}"
            )
        if max_messages is not None and max_messages < 1:
            raise InvalidSettings(f"max_messages must be >= 1 or None, got {max_messages}")
        if not 0 <= wait_seconds <= 3600:
            raise InvalidSettings(f"wait_seconds must be 0 to 3600, got {wait_seconds}")
        if not 1 <= visibility_timeout <= 43_200:
            raise InvalidSettings(
                f"visibility_timeout must be 1 to 43200 seconds, got {visibility_timeout}"
            )
        self.wait_seconds = wait_seconds
        self.visibility_timeout = visibility_timeout
        self.settings = settings or Settings.from_env()
        self.clients = clients or ClientFactory(self.settings.region)
        self.provisioner = Provisioner(self.clients, self.settings)
        self.sqs = self.clients.client("sqs")
        self.source = self._find_source(source_queue)
        #: The channel whose DLQ the source is (read at the first job with an id moved).
        self._source_channel: str | None = None
        self.ordered = self.source.name.endswith(FIFO_SUFFIX) if ordered is None else ordered
        self.destination_channel = destination_channel
        self.destination_type = destination_type
        self.max_messages = max_messages
        self.dry_run = dry_run
        self.progress = progress
        self.actor = actor
        # None: record REQUEUED when the namespace has a status table.
        self.status: StatusStore | None = None
        store = StatusStore(self.clients, self.settings)
        if track_status or (track_status is None and store.exists()):
            self.status = store

    def _find_source(self, name: str) -> QueueRef:
        candidates = [name]
        if self.settings.namespace and not name.startswith(f"{self.settings.namespace}-"):
            candidates.append(physical_name(name, self.settings.namespace))
        for candidate in candidates:
            found = self.provisioner.find_queue(candidate)
            if found is not None:
                return found
        raise ChannelNotFound(
            f"source queue {name!r} does not exist (tried {', '.join(candidates)})"
        )

    def _target(self) -> QueueTarget | TopicTarget:
        """The destination; raises InvalidSettings when its messages would flow back into the
        source (the run would move them round forever)."""
        if self.destination_type is SubscriberTypes.MultiConsumer:
            arn = self.provisioner.ensure_exchange(self.destination_channel, self.ordered)
            if self.provisioner.find_subscription(arn, self.source.arn) is not None:
                raise self._loop(f"exchange {self.destination_channel!r} delivers to it")
            return TopicTarget(self.clients.client("sns"), arn)
        name = consumer_queue_name(
            self.destination_channel, self.settings.namespace, self.ordered
        )
        self._check_not_source(name)
        queue = self.provisioner.require_queue(name, f"channel {self.destination_channel!r}")
        return QueueTarget(self.sqs, queue.url)

    def _check_not_source(self, queue_name: str) -> None:
        if queue_name == self.source.name:
            fifo = FIFO_SUFFIX if queue_name.endswith(FIFO_SUFFIX) else ""
            dlq = queue_name.removesuffix(FIFO_SUFFIX) + DLQ_SUFFIX + fifo
            raise self._loop(f"it is the destination's own queue; did you mean its DLQ {dlq}?")

    def _loop(self, why: str) -> InvalidSettings:
        return InvalidSettings(
            f"destination {self.destination_channel!r} would send the messages back into the "
            f"source queue {self.source.name!r}, forever ({why})"
        )

    def estimate(self) -> int:
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=self.source.url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        return int(attributes.get("ApproximateNumberOfMessages", 0))

    def start(self) -> RequeueReport:
        """Move (or count, in a dry run) the messages; returns the report."""
        report = RequeueReport(self.source.name, self.destination_channel, dry_run=self.dry_run)
        if self.dry_run:  # nothing is resolved (or created), but a loop is still refused
            target = None
            if self.destination_type is SubscriberTypes.SingleConsumer:
                self._check_not_source(consumer_queue_name(
                    self.destination_channel, self.settings.namespace, self.ordered))
        else:
            target = self._target()
        total = self.estimate()
        held: list[str] = []  # receipt handles kept invisible during a dry run
        deadline = time.monotonic() + self.wait_seconds
        try:
            while True:
                if self.max_messages is not None and report.moved >= self.max_messages:
                    report.stopped_at_max = True
                    break
                wanted = MAX_BATCH_ENTRIES
                if self.max_messages is not None:
                    wanted = min(wanted, self.max_messages - report.moved)
                messages = self._receive(wanted)
                if not messages:
                    # Empty is not done: a killed run's messages may still be hidden.
                    report.in_flight = max(0, self._invisible() - len(held))
                    if report.in_flight == 0 or self.dry_run or time.monotonic() >= deadline:
                        break
                    time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
                    continue
                for message in messages:
                    key = message.get("MessageAttributes", {}).get(ROUTING_KEY_ATTRIBUTE, {})
                    routing_key = key.get("StringValue", "(none)")
                    report.routing_keys[routing_key] = report.routing_keys.get(routing_key, 0) + 1
                if target is None:
                    held.extend(m["ReceiptHandle"] for m in messages)
                    report.moved += len(messages)
                else:
                    self._move(target, messages, report)
                if self.progress:
                    self.progress(report.moved, max(total, report.moved))
        finally:
            self._release(held)
            if self.status is not None:
                self.status.close()
        logger.info("requeue: %s", report.summary())
        return report

    def move(self, messages: list[dict[str, Any]]) -> RequeueReport:
        """Move these received messages (their receipt handles held) to the destination, each
        deleted from the source only after the destination accepted it (`messenger dlq
        requeue`: chosen dead letters); what failed stays in the source."""
        report = RequeueReport(self.source.name, self.destination_channel)
        target = self._target()
        try:
            for start in range(0, len(messages), MAX_BATCH_ENTRIES):
                self._move(target, messages[start : start + MAX_BATCH_ENTRIES], report)
        finally:
            if self.status is not None:
                self.status.close()
        return report

    def _invisible(self) -> int:
        """Messages in the source that a receive cannot see now (in flight or delayed)."""
        attributes = call_with_budget(
            lambda: self.sqs.get_queue_attributes(
                QueueUrl=self.source.url,
                AttributeNames=[
                    "ApproximateNumberOfMessagesNotVisible",
                    "ApproximateNumberOfMessagesDelayed",
                ],
            )["Attributes"],
            self.settings.retry_budget_seconds,
            f"counting messages in flight in {self.source.name!r}",
        )
        return int(attributes.get("ApproximateNumberOfMessagesNotVisible", 0)) + int(
            attributes.get("ApproximateNumberOfMessagesDelayed", 0)
        )

    def _receive(self, count: int) -> list[dict[str, Any]]:
        response = call_with_budget(
            lambda: self.sqs.receive_message(
                QueueUrl=self.source.url,
                MaxNumberOfMessages=count,
                MessageAttributeNames=["All"],
                MessageSystemAttributeNames=["All"],
                VisibilityTimeout=self.visibility_timeout,
                WaitTimeSeconds=1,
            ),
            self.settings.retry_budget_seconds,
            f"receiving from {self.source.name!r}",
        )
        return list(response.get("Messages", []))

    def _move(
        self,
        target: QueueTarget | TopicTarget,
        messages: list[dict[str, Any]],
        report: RequeueReport,
    ) -> None:
        outgoing = [self._outgoing(message) for message in messages]
        try:
            self._release_claims(messages)
            self._refresh_payloads(messages)
            sent_at = time.time()  # the destination's consumer receives them after this
            with requeue_span(self.settings.tracing, *_traced_as(target), messages):
                failures = call_with_budget(
                    lambda: target.send_batch(outgoing),
                    self.settings.retry_budget_seconds,
                    f"requeue to {self.destination_channel!r}",
                )
        except Exception:
            # Nothing was moved: make the batch visible again in the source at once.
            self._release([m["ReceiptHandle"] for m in messages])
            raise
        failed = {failure.index for failure in failures}
        for failure in failures:
            logger.error("requeue of one message failed: %s %s", failure.code, failure.message)
        sent = [m for i, m in enumerate(messages) if i not in failed]
        report.failed += len(failed)
        report.moved += len(sent)
        if sent:
            self._delete(sent)
            self._record_requeued(sent, sent_at)
        # Failed ones stay in the source, hidden until the visibility timeout ends (released now,
        # this run would take them again at once); the report counts them as in flight.

    def _release_claims(self, messages: list[dict[str, Any]]) -> None:
        """Jobs with an id that SQS's redrive moved here still hold their consumer's claim
        (`messenger.jobs.fired`): given back before they are sent, so the requeue runs them
        instead of being deleted unrun as a repeat. The claims are the source channel's (its
        DLQ's `messenger:channel` tag)."""
        from botocore.exceptions import BotoCoreError, ClientError

        from messenger.channel import TAG_CHANNEL, TAG_PRIORITY_CHANNEL
        from messenger.jobs.fired import received_job_mark, release_dead_copies

        if self.dry_run or not any(received_job_mark(m) is not None for m in messages):
            return
        if self._source_channel is None:
            try:
                tags = self.sqs.list_queue_tags(QueueUrl=self.source.url).get("Tags", {})
            except (ClientError, BotoCoreError) as error:  # untagged: the destination's name
                logger.warning("reading the tags of %s failed: %s", self.source.name, error)
                tags = {}
            self._source_channel = str(tags.get(TAG_PRIORITY_CHANNEL) or tags.get(TAG_CHANNEL)
                                       or self.destination_channel)
        release_dead_copies(self.clients, self.settings, self._source_channel, messages)

    def _refresh_payloads(self, messages: list[dict[str, Any]]) -> None:
        """A requeued message lives 14 more days: so must the payload it points to."""
        store: PayloadStore | None = None
        for message in messages:
            try:
                pointer = OffloadPointer.parse(message["Body"], message.get("MessageAttributes"))
            except MessageDecodeError:
                continue  # the consumer dead-letters it at once; nothing to keep alive
            if pointer is None:
                continue
            if store is None:  # the platform key, as the producer wrote it
                store = PayloadStore(self.clients.client("s3"), "", self.provisioner.key_arn())
            if not store.refresh(pointer):
                logger.warning("requeued message %s points to a payload that is gone: %s",
                               message.get("MessageId"), pointer.key)

    def _outgoing(self, message: dict[str, Any]) -> OutgoingMessage:
        attributes = sendable_attributes(message.get("MessageAttributes", {}))
        attributes.pop(DEAD_LETTER_REASON_ATTRIBUTE, None)
        attributes.pop(DEAD_LETTER_FAILURE_ATTRIBUTE, None)
        # A fair queue's tenant key travels back with the message; FIFO needs a group.
        group_id, dedup_id = message.get("Attributes", {}).get("MessageGroupId"), None
        if self.ordered:
            group_id = group_id or self.destination_channel
            # The DLQ copy's id is unique per copy: a second requeue of a new copy is not deduped.
            dedup_id = message["MessageId"]
        return OutgoingMessage(EncodedMessage(message["Body"], attributes), group_id, dedup_id)

    def _record_requeued(self, messages: list[dict[str, Any]], sent_at: float) -> None:
        """Record REQUEUED stamped `sent_at`, when the send went out: before the destination's
        consumer can receive them, so the timeline reads in order."""
        if self.status is None:
            return
        for message in messages:
            attributes = message.get("MessageAttributes", {})
            message_id = attributes.get(MESSAGE_ID_ATTRIBUTE, {}).get("StringValue")
            self.status.record(
                StatusRecord(message_id or message["MessageId"], StatusEvent.REQUEUED,
                             self.destination_channel, at=sent_at, actor=self.actor)
            )

    def _delete(self, messages: list[dict[str, Any]]) -> None:
        entries = [
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
        ]
        response = call_with_budget(
            lambda: self.sqs.delete_message_batch(QueueUrl=self.source.url, Entries=entries),
            self.settings.retry_budget_seconds,
            f"deleting from {self.source.name!r}",
        )
        for failure in response.get("Failed", []):
            # The message was sent: it stays in the source as a duplicate, never lost.
            logger.warning("could not delete a requeued message: %s", failure.get("Message"))

    def _release(self, handles: list[str]) -> None:
        for start in range(0, len(handles), MAX_BATCH_ENTRIES):
            chunk = handles[start : start + MAX_BATCH_ENTRIES]
            self.sqs.change_message_visibility_batch(
                QueueUrl=self.source.url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": h, "VisibilityTimeout": 0}
                    for i, h in enumerate(chunk)
                ],
            )


def _traced_as(target: QueueTarget | TopicTarget) -> tuple[str, str]:
    """(messaging.system, destination name) of a requeue's span."""
    if isinstance(target, TopicTarget):
        return SNS_SYSTEM, target.arn.rsplit(":", 1)[-1]
    return SQS_SYSTEM, target.url.rstrip("/").rsplit("/", 1)[-1]


def consumer_queue_name(channel: str, namespace: str = "", ordered: bool = False) -> str:
    """The physical queue of a channel: 'orders' is its own queue, 'exchange.queue' that
    consumer's queue (never the exchange: its other consumers must not get a second copy)."""
    return ChannelSpec(name=channel, ordered=ordered, namespace=namespace).queue_name
