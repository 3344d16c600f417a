"""`MessagePreparation`: how a producer turns one push into what goes on the wire.

Checks the item (ids, routing key, priority level, attempts), encodes the message once, derives
an ordered channel's deduplication id and message id, stamps the attributes (priority,
max_attempts, schema version, trace context) and offloads a body above the threshold to S3
(`messenger.offload`). A mixin of `messenger.produce.base.BaseProducer`, whose settings it reads.
"""

from __future__ import annotations

import dataclasses
import threading
from datetime import datetime, timezone
from typing import ClassVar

from messenger.aws import ClientFactory, call_with_budget
from messenger.channel import (
    PRIORITY_ATTRIBUTE,
    SQS_MAX_RECEIVE_COUNT,
    ChannelSpec,
    default_level,
)
from messenger.errors import InvalidMessage, InvalidSettings, PayloadTooLarge
from messenger.jobs.enqueue_dedup import EnqueueDedup
from messenger.jobs.fired import JOB_WINDOW_HEADER
from messenger.jobs.schedules import Delivery
from messenger.message import MAX_ATTEMPTS_ATTRIBUTE, MESSAGE_ID_ATTRIBUTE, EncodedMessage, Message
from messenger.offload import PayloadStore, default_threshold, pointer_attributes
from messenger.produce.checks import (
    check_attempts,
    check_id,
    check_json_text,
    check_text,
    content_dedup_id,
    merged_headers,
    ordered_message_id,
    utf8_text,
)
from messenger.produce.push import PreparedItem, PushItem
from messenger.produce.scheduled import check_offload_due, needs_offload
from messenger.produce.transport import OutgoingMessage
from messenger.provision import Provisioner
from messenger.schema import SCHEMA_VERSION_ATTRIBUTE, BodySchema
from messenger.settings import Settings
from messenger.tracing import SNS_SYSTEM, ProducerTrace


class MessagePreparation:
    """Turns a `PushItem` into a `PreparedItem` (see the module doc)."""

    # What it reads of the producer (`BaseProducer` defines them).
    channel: ClassVar[str]
    ordered: ClassVar[bool]
    offload_threshold: ClassVar[int | None]
    group_id: ClassVar[str | None]
    max_payload_bytes: ClassVar[int]
    priorities: ClassVar[tuple[str, ...]]
    default_priority: ClassVar[str | None]
    track_status: ClassVar[bool | None]
    channel_limit: ClassVar[int]
    routes_priority_by_attribute: ClassVar[bool]
    messaging_system: ClassVar[str]
    settings: Settings
    clients: ClientFactory
    provisioner: Provisioner
    body_schema: BodySchema | None
    threshold: int
    dedup_flow: EnqueueDedup
    _lock: threading.Lock
    _store: PayloadStore | None

    def meta_headers(self) -> dict[str, str]:
        """Headers added to every message (e.g. {'locale': current_locale()})."""
        return {}

    def _threshold(self) -> int:
        threshold = self.offload_threshold or self.settings.offload_threshold
        if threshold is None:
            return default_threshold(self.messaging_system == SNS_SYSTEM, self.ordered)
        if threshold > self.channel_limit:
            if self.offload_threshold is not None:
                raise InvalidSettings(
                    f"{type(self).__name__}.offload_threshold is {threshold} bytes; channel "
                    f"{self.channel!r} carries at most {self.channel_limit}"
                )
            threshold = self.channel_limit
        return threshold

    def _spec(self, channel: str) -> ChannelSpec:
        return ChannelSpec(
            name=channel,
            ordered=self.ordered,
            namespace=self.settings.namespace,
            priorities=tuple(self.priorities),
            default_priority=self.default_priority,
            track_status=bool(self.track_status),
        )

    def _level(self, priority: str | None) -> str | None:
        """The priority level of a push; InvalidMessage naming the levels for an unknown one."""
        if not self.priorities:
            if priority is not None:
                raise InvalidMessage(
                    f"priority {priority!r} given, but channel {self.channel!r} declares no "
                    f"priorities"
                )
            return None
        if priority is None:
            return default_level(tuple(self.priorities), self.default_priority)
        if priority not in self.priorities:
            raise InvalidMessage(
                f"priority {priority!r} is not one of {', '.join(self.priorities)}"
            )
        return priority

    def _prepare(self, index: int, item: PushItem, trace: ProducerTrace | None = None,
                 when: Delivery | None = None) -> tuple[PreparedItem, int]:
        level = self._level(item.priority)
        headers = merged_headers(self.meta_headers(), item.meta_headers)
        if self.dedup_flow.wanted(item.dedup) is True and \
                (item.message_id is not None or self.ordered):
            # A job id: its consumer runs it once within the window (messenger.jobs.fired)
            headers[JOB_WINDOW_HEADER] = str(self.dedup_flow.window)
        if isinstance(item.routing_key, str):
            check_text("routing_key", item.routing_key)
        if item.message_id is not None:
            check_id("message_id", item.message_id)
        group_id, dedup_id = self._fifo_fields(item)
        body, version = item.body, None
        if self.body_schema is not None:
            body, version = self.body_schema.dump(item.body, item.routing_key)
        message = Message(body=body, routing_key=item.routing_key, meta_headers=headers)
        if item.message_id is not None:
            message = dataclasses.replace(message, message_id=item.message_id)
        encoded = message.encode()
        # Encoded once: the size decision, the dedup id and the S3 object all use these bytes.
        body_utf8 = utf8_text("body", encoded.body)
        message_id = message.message_id
        if group_id is not None and self.ordered:
            # Ordered: an explicit dedup key (dedup_id, else the caller's message id) or the
            # content's own; the message id follows from it, so a duplicate shows as one.
            dedup_id = dedup_id or item.message_id or content_dedup_id(
                group_id, item.routing_key, headers, body_utf8, level
            )
            if item.message_id is None:
                message_id = ordered_message_id(self.channel, dedup_id)
                attributes = {
                    **encoded.attributes,
                    MESSAGE_ID_ATTRIBUTE: {"DataType": "String", "StringValue": message_id},
                }
                encoded = EncodedMessage(encoded.body, attributes)
        if level is not None and self.routes_priority_by_attribute:
            encoded = with_attribute(encoded, PRIORITY_ATTRIBUTE, "String", level)
        if item.max_attempts is not None:
            check_attempts(item.max_attempts, self._max_receives(level), self.channel)
            encoded = with_attribute(encoded, MAX_ATTEMPTS_ATTRIBUTE, "Number",
                                     str(item.max_attempts))
        if version is not None:
            encoded = with_attribute(encoded, SCHEMA_VERSION_ATTRIBUTE, "String", version)
        if trace is not None:  # in meta_headers: every attribute slot may be taken
            encoded = trace.stamp(index, message_id, encoded)
        encoded = EncodedMessage(encoded.body, encoded.attributes, body_size=len(body_utf8))
        offloaded = 0
        if len(body_utf8) > self.max_payload_bytes:  # inline too: the threshold may pass it
            raise PayloadTooLarge(
                f"message body is {len(body_utf8)} bytes; the largest offloadable body is "
                f"{self.max_payload_bytes} bytes"
            )
        due = when.due if when is not None and when.scheduled else None
        if encoded.size > self.threshold or (due is not None and needs_offload(
                "sns" if self.messaging_system == SNS_SYSTEM else "sqs",
                OutgoingMessage(encoded, group_id, dedup_id), due)):
            # The body goes to S3 (any valid Unicode), only the pointer to SQS: the characters
            # SQS refuses are looked for in what goes there, never in a body it does not carry.
            # A scheduled one also when its schedule's input (the body escaped once more)
            # would be too large for Scheduler, and only when the object outlives its due
            # time: a refused push uploads nothing.
            if due is not None:
                check_offload_due(due, datetime.now(timezone.utc))
            encoded = self._offload(encoded, body_utf8)
            offloaded = 1
        else:
            check_json_text("body", encoded.body)
        outgoing = OutgoingMessage(encoded, group_id, dedup_id)
        return PreparedItem(index, outgoing, message_id, level), offloaded

    def _max_receives(self, level: str | None) -> int:
        """The highest `max_attempts` of a push: an exchange's queues each have their own
        max_receives (each consumer caps the attempts at its own), so SQS's largest."""
        return SQS_MAX_RECEIVE_COUNT

    def _fifo_fields(self, item: PushItem) -> tuple[str | None, str | None]:
        """(MessageGroupId, MessageDeduplicationId) of an item. On a standard channel the group
        is the fair-queue tenant key (SQS, 2025): optional, never an order; dedup ids are FIFO's."""
        if item.dedup_id is not None:
            if not self.ordered:
                raise InvalidMessage(
                    f"dedup_id applies to ordered channels only; {self.channel!r} is not "
                    f"ordered (group_id on a standard channel is a fair-queue tenant key)"
                )
            check_id("dedup_id", item.dedup_id)
        if item.group_id is not None:
            check_id("group_id", item.group_id)
            return item.group_id, item.dedup_id
        return self.group_id or (self.channel if self.ordered else None), item.dedup_id

    def _offload(self, encoded: EncodedMessage, body_utf8: bytes) -> EncodedMessage:
        """The pointer message of `encoded`, its body (`body_utf8`) put in the offload bucket."""
        body_size = len(body_utf8)
        if body_size > self.max_payload_bytes:
            raise PayloadTooLarge(
                f"message body is {body_size} bytes; the largest offloadable body is "
                f"{self.max_payload_bytes} bytes"
            )
        store = self._payload_store()
        pointer = call_with_budget(
            lambda: store.put(body_utf8), self.settings.retry_budget_seconds, "offload to S3"
        )
        attributes = {**encoded.attributes, **pointer_attributes(body_size)}
        offloaded = EncodedMessage(body=pointer.encode(), attributes=attributes)
        if offloaded.size > self.channel_limit:
            raise PayloadTooLarge(
                f"message attributes alone are {offloaded.size} bytes; channel {self.channel!r} "
                f"carries at most {self.channel_limit}"
            )
        return offloaded

    def _payload_store(self) -> PayloadStore:
        with self._lock:
            if self._store is None:
                bucket = self.provisioner.ensure_bucket()
                self._store = PayloadStore(
                    self.clients.client("s3"), bucket, self.provisioner.key_arn()
                )
            return self._store


def with_attribute(encoded: EncodedMessage, name: str, kind: str, value: str) -> EncodedMessage:
    """`encoded` with one more message attribute."""
    attributes = {**encoded.attributes, name: {"DataType": kind, "StringValue": value}}
    return EncodedMessage(encoded.body, attributes)
