"""`Producer` (single-consumer channel) and `MultiProducer` (exchange): the public push API.

    class WishListEventProducer(MultiProducer):
        channel = 'wishlist_events_exchange'
        ordered = True

    WishListEventProducer().push(body={...}, routing_key='MOBILE.APPLE')

Each subclass is a thread-safe singleton: `WishListEventProducer()` returns the same object
everywhere in the process. Infrastructure is checked once, at first use.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, ClassVar

from messenger.aws import ClientFactory, call_with_budget, error_code
from messenger.channel import (
    MAX_BATCH_ENTRIES,
    PRIORITY_ATTRIBUTE,
    SNS_MAX_MESSAGE_BYTES,
    SQS_MAX_MESSAGE_BYTES,
    SQS_MAX_RECEIVE_COUNT,
    ChannelSpec,
    default_level,
    queue_name_for,
    topic_name_for,
)
from messenger.errors import (
    ChannelNotFound,
    InvalidChannelSpec,
    InvalidMessage,
    InvalidSettings,
    PayloadTooLarge,
    PublishFailed,
)
from messenger.jobs.dedup import (
    DEFAULT_WINDOW_SECONDS,
    HELD_CODE,
    Claim,
    DedupStore,
    Duplicate,
    Held,
    RecentIds,
    SentMarks,
    check_lease,
    check_window,
)
from messenger.jobs.fired import JOB_WINDOW_HEADER
from messenger.jobs.schedules import Delivery, plan_delivery
from messenger.jobs.status import StatusEvent, StatusRecord, StatusStore, queue_tracking
from messenger.message import (
    MAX_ATTEMPTS_ATTRIBUTE,
    MESSAGE_ID_ATTRIBUTE,
    EncodedMessage,
    Message,
)
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
from messenger.produce.push import PreparedItem, PushedId, PushFailure, PushItem, PushManyResult
from messenger.produce.scheduled import ScheduledSends, check_offload_due, needs_offload
from messenger.produce.transport import EntryFailure, OutgoingMessage, QueueTarget, TopicTarget
from messenger.provision import Provisioner, is_missing_resource
from messenger.schema import SCHEMA_VERSION_ATTRIBUTE, BodySchema
from messenger.settings import Settings
from messenger.tracing import SNS_SYSTEM, SQS_SYSTEM, ProducerTrace

__all__ = ["MultiProducer", "Producer", "PushFailure", "PushItem", "PushManyResult", "PushedId"]

logger = logging.getLogger("messenger.producer")

#: Largest body the offload bucket takes (the AWS extended clients' limit is 2 GB).
MAX_OFFLOADED_BYTES = 2 * 1024**3


class _BaseProducer:
    channel: ClassVar[str] = ""
    ordered: ClassVar[bool] = False
    #: Offload bodies larger than this many bytes (None: the setting, by default the channel
    #: kind's cheapest, `messenger.offload.DEFAULT_THRESHOLDS`: 1 MiB SQS, 256 KiB SNS).
    offload_threshold: ClassVar[int | None] = None
    #: Message group when a push names none. Ordered channel: the FIFO group (None: the
    #: channel name). Standard channel: the fair-queue tenant key (None: no tenant).
    group_id: ClassVar[str | None] = None
    max_payload_bytes: ClassVar[int] = MAX_OFFLOADED_BYTES
    #: Priority levels, highest first (e.g. ('high', 'default', 'low')); () for none.
    priorities: ClassVar[tuple[str, ...]] = ()
    #: Level of a push without one (None: 'default' when a level, else the lowest).
    default_priority: ClassVar[str | None] = None
    #: Record QUEUED (SCHEDULED) in the status table for every message sent. None (default):
    #: as the channel declares (its ChannelSpec's track_status, the tag its queue carries, read
    #: once per process at the first push; an exchange declares nothing: False). True/False:
    #: this producer's own choice (the channel's declaration still decides what a status
    #: answer says of the job's progress).
    track_status: ClassVar[bool | None] = None
    #: Dedup on enqueue: a push whose message_id was sent within `dedup_window` seconds is
    #: not sent and is reported as a duplicate (a conditional DynamoDB claim before the send
    #: and a mark after it, batched in push_many; see `messenger.jobs.dedup`). A push may
    #: override it (`dedup=`).
    dedup: ClassVar[bool] = False
    #: Seconds a pushed id counts as taken (1 to 14 days; default 5 minutes).
    dedup_window: ClassVar[int] = DEFAULT_WINDOW_SECONDS
    #: Seconds a claim not yet marked sent holds off other pushes of its id (a producer that
    #: died between claim and send holds it this long); None: the retry budget + 20 s.
    dedup_lease: ClassVar[float | None] = None
    #: pydantic model(s) of the body (see `messenger.schema`): validated before sending.
    model: ClassVar[Any] = None

    _instances: ClassVar[dict[type, _BaseProducer]] = {}
    _instances_lock: ClassVar[threading.Lock] = threading.Lock()

    def __new__(cls, settings: Settings | None = None, clients: ClientFactory | None = None) -> Any:
        if settings is not None or clients is not None:
            return super().__new__(cls)  # an explicitly configured, unshared instance
        with _BaseProducer._instances_lock:
            instance = _BaseProducer._instances.get(cls)
            if instance is None:
                instance = super().__new__(cls)
                instance._setup(None, None)
                _BaseProducer._instances[cls] = instance
            return instance

    def __init__(
        self, settings: Settings | None = None, clients: ClientFactory | None = None
    ) -> None:
        if settings is not None or clients is not None:
            self._setup(settings, clients)

    @classmethod
    def reset_instances(cls) -> None:
        """Forget the shared instances (e.g. after the environment changed in tests)."""
        with _BaseProducer._instances_lock:
            _BaseProducer._instances.clear()

    def _setup(self, settings: Settings | None, clients: ClientFactory | None) -> None:
        if not self.channel or not isinstance(self.channel, str):
            raise InvalidChannelSpec(f"{type(self).__name__}.channel must name a channel")
        if "." in self.channel:
            raise InvalidChannelSpec(
                f"{type(self).__name__}.channel {self.channel!r}: a producer names a queue or an "
                f"exchange, without '.<queue>' (consumers name 'exchange.queue')"
            )
        self.settings = settings or Settings.from_env()
        self.clients = clients or ClientFactory(self.settings.region)
        self.provisioner = Provisioner(self.clients, self.settings)
        self._lock = threading.Lock()
        self._targets: dict[str | None, QueueTarget | TopicTarget] = {}
        #: Each level's max_receives, once a push gave max_attempts (`_max_receives`).
        self._receives: dict[str | None, int] = {}
        self._store: PayloadStore | None = None
        self.status: StatusStore | None = None
        if self.priorities:
            # Validates the levels with the channel's own rules (names, count, default).
            self._spec(self.channel)
        if self.track_status not in (None, True, False):
            raise InvalidSettings(f"{type(self).__name__}.track_status must be True, False or "
                                  f"None (as the channel declares), got {self.track_status!r}")
        if self.track_status:
            self.status = StatusStore(self.clients, self.settings)
        if not isinstance(self.dedup, bool):
            raise InvalidSettings(f"{type(self).__name__}.dedup must be True or False, got "
                                  f"{self.dedup!r}")
        self.window = check_window(self.dedup_window, f"{type(self).__name__}.dedup_window")
        self.dedup_store = DedupStore(self.clients, self.settings, check_lease(
            self.dedup_lease, self.settings, f"{type(self).__name__}.dedup_lease"))
        #: Ordered channels: deduplication ids sent in SQS's own 5-minute interval.
        self.recent_ids = RecentIds() if self.ordered else None
        self.threshold = self._threshold()
        self.body_schema = BodySchema.of(type(self).__name__, self.model)
        #: W3C headers of the context pushes belong to when no span is current (a Spark
        #: executor's: the driver's); see `messenger.tracing`.
        self.trace_parent: dict[str, str] = {}
        #: Pushes with at=/delay=: DelaySeconds or a one-time schedule (`messenger.jobs.schedules`).
        self.scheduled = ScheduledSends(self.channel, self.clients, self.settings,
                                        self.provisioner, self.status)

    # -- to override ----------------------------------------------------------------------
    def meta_headers(self) -> dict[str, str]:
        """Headers added to every message (e.g. {'locale': current_locale()})."""
        return {}

    # -- channel specifics (subclasses) ---------------------------------------------------
    channel_limit: ClassVar[int]
    #: Exchanges route a level by a message attribute; single queues by the level's queue.
    routes_priority_by_attribute: ClassVar[bool]
    #: `messaging.system` of its spans (`messenger.tracing`).
    messaging_system: ClassVar[str]

    @property
    def destination_name(self) -> str:
        """The queue or topic name its spans name (worked out once: a push asks for it)."""
        raise NotImplementedError

    def _make_target(self, level: str | None) -> QueueTarget | TopicTarget:
        raise NotImplementedError

    # -- public API -----------------------------------------------------------------------
    def push(
        self,
        body: Any,
        routing_key: str | None = None,
        *,
        group_id: str | None = None,
        dedup_id: str | None = None,
        meta_headers: Mapping[str, str] | None = None,
        priority: str | None = None,
        message_id: str | None = None,
        max_attempts: int | None = None,
        dedup: bool | None = None,
        at: datetime | None = None,
        delay: timedelta | float | None = None,
    ) -> PushedId:
        """Send one message; returns its message id (a str; `.duplicate` says whether it was
        a duplicate and not sent). Raises InvalidMessage, PayloadTooLarge, ChannelNotFound
        (verify mode) or PublishFailed (transient errors past the budget).

        group_id: ordered channel: the FIFO group (default: the class's, else the channel name);
        standard channel: the fair-queue tenant key (default: the class's, else none).
        message_id: the caller's own id (1-128 letters, digits, punctuation) instead of a new
        one, so a retry after a crash is recognisable. On an ordered channel the id is derived
        from the deduplication key: a duplicate returns the id of the message it repeats, and a
        deduplication id sent in the last 5 minutes (SQS would drop it) is reported as a
        duplicate. max_attempts: runs the job gets before its consumer dead-letters it, 1 to
        the channel's max_receives (None: the consumer's `max_attempts`); InvalidMessage
        otherwise. dedup: check the id against the dedup window first (None: the producer's
        `dedup`); needs a message_id on a standard channel (without one, every push is new).
        at / delay: run the job at this aware datetime, or after this timedelta (or seconds):
        SQS's DelaySeconds up to 900 s (included) on a standard queue, else a one-time
        EventBridge Scheduler schedule (docs/scheduled-jobs.md); its id is fixed now. At most
        366 days ahead (`schedules.MAX_AHEAD_SECONDS`; InvalidMessage beyond). A job id
        scheduled already is a duplicate (`.duplicate`, `.due` the waiting job's).
        """
        when = plan_delivery(at, delay, ordered=self.ordered,
                             fanout=self.messaging_system == SNS_SYSTEM)
        item = PushItem(body, routing_key, group_id, dedup_id, meta_headers, priority, message_id,
                        max_attempts, dedup)
        trace = self._trace(batch=False)
        if trace is None:
            return self._push(item, None, when)
        with trace.sending(1) as span:
            pushed = self._push(item, trace, when)
            if span is not None:
                span.set_attribute("messenger.duplicate", pushed.duplicate)
            return pushed

    def _push(self, item: PushItem, trace: ProducerTrace | None,
              when: Delivery | None = None) -> PushedId:
        prepared, _ = self._prepare(0, item, trace, when)
        local = self._dedup(prepared, item, set())
        # An id held by another producer's push in flight is waited on, within the budget,
        # until sent there (a duplicate) or given up (ours); never a duplicate unsent.
        verdict = self._claim(local, time.monotonic() + self.settings.retry_budget_seconds) \
            if isinstance(local, str) else local
        if isinstance(verdict, Held):
            raise PublishFailed(verdict.describe())
        if isinstance(verdict, Duplicate):
            logger.info("push to %s: message %s is a duplicate (not sent)", self.channel,
                        prepared.message_id)
            self._record_queued([prepared.message_id], time.time(), StatusEvent.DUPLICATE)
            return PushedId(prepared.message_id, duplicate=True)
        sent_at = time.time()  # SQS accepts it after this: a consumer's RECEIVED comes later
        # One token per push, the same on its retries: a schedule it made is told from another
        # push's (`ScheduleStore.schedule`).
        push = uuid.uuid4().hex if when is not None and when.scheduled else ""
        try:
            sent = self._with_target(
                prepared.level, lambda target: self.scheduled.send(target, prepared, when, push),
                "push")
        except BaseException:
            if verdict is not None:
                self.dedup_store.release(verdict)  # not sent: a retry is not a duplicate
            raise
        sent_id = sent.sent_id
        if verdict is not None:
            self.dedup_store.mark_sent([verdict])
        if sent.duplicate:
            # The job id names one job: its first schedule stands (its due time, its body).
            due = f"due {sent.due:%Y-%m-%d %H:%M:%S} UTC" if sent.due else "fired or cancelled"
            logger.info("push to %s: job %s is scheduled already (%s): this push is a "
                        "duplicate, not scheduled", self.channel, prepared.message_id, due)
            return PushedId(prepared.message_id, duplicate=True, due=sent.due, scheduled=True)
        self._remember([prepared])
        if when is None or not when.scheduled:  # a schedule records SCHEDULED itself
            self._record_queued([prepared.message_id], sent_at)
        if trace is not None:
            trace.sent(sent_id)
        if when is None:
            return PushedId(prepared.message_id)
        return PushedId(prepared.message_id, due=when.due, scheduled=when.scheduled)

    def push_many(self, items: Iterable[PushItem | Any], *, at: datetime | None = None,
                  delay: timedelta | float | None = None) -> PushManyResult:
        """Send many messages in batches of up to 10; items are PushItems or bare bodies.

        Entries that fail transiently are retried within the budget; what still fails (or was
        invalid) is reported in `failures`, never dropped silently: call `raise_for_failures()`
        to turn them into an exception.
        at / delay: every item of the call runs at this time, or after this delay (as `push`'s,
        due at one moment for all). Such items are sent one by one, each as `push` sends it
        (DelaySeconds or a one-time schedule: a schedule holds one job), with per-item failures
        as here. InvalidMessage for a wrong `at`/`delay`, before anything is sent.
        """
        items = [item if isinstance(item, PushItem) else PushItem(item) for item in items]
        when = plan_delivery(at, delay, ordered=self.ordered,
                             fanout=self.messaging_system == SNS_SYSTEM)
        if when is not None:
            return self._push_each(items, when)
        result = PushManyResult(message_ids=[None] * len(items))
        deadline = time.monotonic() + self.settings.retry_budget_seconds
        by_level: dict[str | None, list[PreparedItem]] = {}
        keys: dict[int, str] = {}  # items whose id is claimed before their batch is sent
        taken: set[str] = set()  # deduplication ids of this call (ordered channels)
        trace = self._trace(batch=True)
        for index, item in enumerate(items):
            try:
                prepared, offloaded = self._prepare(index, item, trace)
                verdict = self._dedup(prepared, item, taken)
            except Exception as error:  # one bad item never aborts the others
                result.failures.append(PushFailure(index, _failure_code(error), str(error)))
                continue
            if isinstance(verdict, Duplicate):
                result.duplicates.append(index)
                result.message_ids[index] = prepared.message_id  # the id it repeats
                continue
            if verdict is not None:
                keys[index] = verdict
            result.offloaded += offloaded
            by_level.setdefault(prepared.level, []).append(prepared)
        marks = SentMarks(self.dedup_store)
        held: dict[int, Held] = {}
        for level, entries in by_level.items():
            for batch in self._batches(entries):
                # Claimed batch by batch, so a claim is sent (and marked) well within its lease.
                ready, claims = self._claim_batch(batch, keys, None, result, held)
                self._send_claimed(level, ready, claims, result, trace, marks)
        marks.flush()  # before waiting: a producer racing us may be waiting on these marks
        for level, entries in by_level.items():
            # Held by a producer racing us: wait, within the budget, for each to be sent there
            # (a duplicate) or given up (ours to send); else report it, never drop it.
            for batch in self._batches([entry for entry in entries if entry.index in held]):
                still: dict[int, Held] = {}
                ready, claims = self._claim_batch(batch, keys, deadline, result, still)
                self._send_claimed(level, ready, claims, result, trace, marks)
                result.failures += [PushFailure(index, HELD_CODE, verdict.describe())
                                    for index, verdict in still.items()]
        marks.flush()
        result.duplicates.sort()
        self._remember([p for entries in by_level.values() for p in entries
                        if result.message_ids[p.index] is not None])
        if result.duplicates:
            self._record_queued([i for n, i in enumerate(result.message_ids)
                                 if i is not None and n in set(result.duplicates)],
                                time.time(), StatusEvent.DUPLICATE)
            logger.info("push_many to %s: %d duplicate(s) not sent", self.channel,
                        len(result.duplicates))
        result.failures.sort(key=lambda failure: failure.index)
        if result.failures:
            logger.warning(
                "push_many: %d of %d messages to %s failed",
                len(result.failures),
                len(items),
                self.channel,
            )
        return result

    # -- internals ------------------------------------------------------------------------
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

    def _trace(self, batch: bool) -> ProducerTrace | None:
        """The spans and context of a push (None: tracing is off, `messenger.tracing`)."""
        return ProducerTrace.of(self.settings.tracing, self.messaging_system,
                                self.destination_name, batch, self.trace_parent)

    def _prepare(self, index: int, item: PushItem, trace: ProducerTrace | None = None,
                 when: Delivery | None = None) -> tuple[PreparedItem, int]:
        level = self._level(item.priority)
        headers = merged_headers(self.meta_headers(), item.meta_headers)
        if (self.dedup if item.dedup is None else item.dedup) is True and \
                (item.message_id is not None or self.ordered):
            # A job id: its consumer runs it once within the window (messenger.jobs.fired)
            headers[JOB_WINDOW_HEADER] = str(self.window)
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
            encoded = _with_attribute(encoded, PRIORITY_ATTRIBUTE, "String", level)
        if item.max_attempts is not None:
            check_attempts(item.max_attempts, self._max_receives(level), self.channel)
            encoded = _with_attribute(encoded, MAX_ATTEMPTS_ATTRIBUTE, "Number",
                                      str(item.max_attempts))
        if version is not None:
            encoded = _with_attribute(encoded, SCHEMA_VERSION_ATTRIBUTE, "String", version)
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

    def _dedup(self, prepared: PreparedItem, item: PushItem, taken: set[str]
               ) -> Duplicate | str | None:
        """Whether this push repeats one within the window: a Duplicate (do not send), the key
        to claim in the dedup table before sending (`_claim`), or None (no check applies).

        Ordered channels: a deduplication id sent by this producer in SQS's 5 minutes (or
        earlier in this call) is a duplicate SQS would drop; with dedup on, the table is asked
        too (for other producers), by deduplication id. Standard channels: with dedup on, the
        table is asked by message id, when the push names one."""
        dedup = self.dedup if item.dedup is None else item.dedup
        if not isinstance(dedup, bool):
            raise InvalidMessage(f"dedup must be True, False or None, got {dedup!r}")
        key = prepared.outgoing.dedup_id
        if key is not None:
            if key in taken or (self.recent_ids is not None and self.recent_ids.seen(key)):
                return Duplicate(key, 0.0)
            taken.add(key)
        elif item.message_id is not None:
            key = item.message_id
        if not dedup or key is None:
            return None
        return key

    def _push_each(self, items: list[PushItem], when: Delivery) -> PushManyResult:
        """push_many's items due later: each pushed as `push` does (`_push`), failures per item."""
        result = PushManyResult(message_ids=[None] * len(items))
        for index, item in enumerate(items):
            try:
                pushed = self._push(item, None, when)
            except Exception as error:  # one bad item never aborts the others
                result.failures.append(PushFailure(index, _failure_code(error), str(error)))
                continue
            result.message_ids[index] = str(pushed)
            if pushed.duplicate:
                result.duplicates.append(index)
        return result

    def _claim(self, key: str, wait_until: float | None) -> Claim | Duplicate | Held:
        return self.dedup_store.claim(self.channel, key, self.window, wait_until)

    def _claim_batch(self, batch: list[PreparedItem], keys: dict[int, str],
                     wait_until: float | None, result: PushManyResult, held: dict[int, Held]
                     ) -> tuple[list[PreparedItem], dict[int, Claim]]:
        """The entries of `batch` to send and the claims made for them; duplicates go to
        `result`, ids held by another producer to `held` (wait_until: see DedupStore.claim)."""
        ready: list[PreparedItem] = []
        claims: dict[int, Claim] = {}
        for entry in batch:
            key = keys.get(entry.index)
            if key is None:
                ready.append(entry)
                continue
            try:
                verdict = self._claim(key, wait_until)
            except Exception as error:  # reported per item, never raised
                result.failures.append(PushFailure(entry.index, _failure_code(error), str(error)))
                continue
            if isinstance(verdict, Duplicate):
                result.duplicates.append(entry.index)
                result.message_ids[entry.index] = entry.message_id  # the id it repeats
            elif isinstance(verdict, Held):
                held[entry.index] = verdict
            else:
                claims[entry.index] = verdict
                ready.append(entry)
        return ready, claims

    def _send_claimed(self, level: str | None, ready: list[PreparedItem],
                      claims: dict[int, Claim], result: PushManyResult,
                      trace: ProducerTrace | None, marks: SentMarks) -> None:
        """Send `ready` as one batch, then settle its claims: sent ones to be marked, the
        others released (not sent: a retry is not a duplicate)."""
        if ready:
            self._send_batch(level, ready, result, trace)  # records the batch's QUEUED
        for index, claim in claims.items():
            if result.message_ids[index] is None:
                self.dedup_store.release(claim)
            else:
                marks.add(claim)

    def _remember(self, sent: list[PreparedItem]) -> None:
        if self.recent_ids is not None:
            self.recent_ids.add([p.outgoing.dedup_id for p in sent if p.outgoing.dedup_id])

    def _record_queued(self, message_ids: list[str], sent_at: float,
                       event: StatusEvent = StatusEvent.QUEUED) -> None:
        """Record QUEUED (or `event`) for messages SQS accepted, stamped `sent_at`: when their
        request went out (they may be received before its answer is back, never before it went
        out)."""
        if self.status is None:
            return
        for message_id in message_ids:
            self.status.record(StatusRecord(message_id, event, self.channel, at=sent_at))

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

    def _get_target(self, level: str | None, refresh: bool = False) -> QueueTarget | TopicTarget:
        with self._lock:
            target = self._targets.get(level)
            if target is None or refresh:
                target = self._targets[level] = self._make_target(level)
            return target

    def _with_target(self, level: str | None, action: Any, what: str) -> Any:
        """Run `action(target)` within the retry budget; reprovision once if the target vanished."""
        budget = self.settings.retry_budget_seconds
        target = call_with_budget(
            lambda: self._get_target(level), budget, f"locating channel {self.channel!r}"
        )
        try:
            return call_with_budget(lambda: action(target), budget, f"{what} to {self.channel!r}")
        except Exception as error:
            if not is_missing_resource(error):
                raise
            if self.settings.provisioning != "auto":
                raise ChannelNotFound(
                    f"channel {self.channel!r} disappeared ({error_code(error)}) and "
                    f"provisioning=verify: redeploy it"
                ) from error
            logger.warning("channel %s is missing; reprovisioning it", self.channel)
            target = call_with_budget(
                lambda: self._get_target(level, refresh=True),
                budget,
                f"reprovisioning {self.channel!r}",
            )
            return call_with_budget(lambda: action(target), budget, f"{what} to {self.channel!r}")

    def _batches(self, prepared: list[PreparedItem]) -> Iterable[list[PreparedItem]]:
        batch: list[PreparedItem] = []
        size = 0
        for entry in prepared:
            entry_size = entry.outgoing.encoded.size
            if batch and (
                len(batch) == MAX_BATCH_ENTRIES or size + entry_size > self.channel_limit
            ):
                yield batch
                batch, size = [], 0
            batch.append(entry)
            size += entry_size
        if batch:
            yield batch

    def _send_batch(self, level: str | None, batch: list[PreparedItem], result: PushManyResult,
                    trace: ProducerTrace | None = None) -> None:
        if trace is None:
            return self._send_entries(level, batch, result)
        with trace.sending(len(batch)):
            failed = len(result.failures)
            self._send_entries(level, batch, result)
            trace.batch_sent([entry.index for entry in batch], len(result.failures) - failed)

    def _send_entries(
        self, level: str | None, batch: list[PreparedItem], result: PushManyResult
    ) -> None:
        pending = batch

        def send(target: QueueTarget | TopicTarget) -> list[EntryFailure]:
            return target.send_batch([entry.outgoing for entry in pending])

        deadline = time.monotonic() + self.settings.retry_budget_seconds
        attempt = 0
        while pending:
            sent_at = time.time()
            try:
                failures = self._with_target(level, send, "push_many")
            except Exception as error:  # reported per item, never raised
                # e.g. access denied: report this batch; batches already sent keep their ids.
                for entry in pending:
                    result.failures.append(
                        PushFailure(entry.index, _failure_code(error), str(error))
                    )
                return
            failed = {failure.index: failure for failure in failures}
            retry = []
            accepted = []
            for position, entry in enumerate(pending):
                failure = failed.get(position)
                if failure is None:
                    result.message_ids[entry.index] = entry.message_id
                    accepted.append(entry.message_id)
                elif failure.sender_fault or time.monotonic() >= deadline:
                    result.failures.append(
                        PushFailure(entry.index, failure.code, failure.message)
                    )
                else:
                    retry.append(entry)
            self._record_queued(accepted, sent_at)
            pending = retry
            if pending:
                attempt += 1
                time.sleep(min(2.0, 0.05 * 2**attempt))


def _with_attribute(encoded: EncodedMessage, name: str, kind: str, value: str) -> EncodedMessage:
    attributes = {**encoded.attributes, name: {"DataType": kind, "StringValue": value}}
    return EncodedMessage(encoded.body, attributes)


def _failure_code(error: BaseException) -> str:
    return error_code(error) or type(error).__name__


class Producer(_BaseProducer):
    """Pushes to a single-consumer channel: one SQS queue (created with its DLQ in auto mode)."""

    channel_limit = SQS_MAX_MESSAGE_BYTES
    routes_priority_by_attribute = False
    messaging_system = SQS_SYSTEM

    @functools.cached_property
    def destination_name(self) -> str:
        return queue_name_for(self.channel, self.settings.namespace, self.ordered)

    def _make_target(self, level: str | None) -> QueueTarget:
        spec = self._spec(self.channel)
        if level is not None:
            spec = spec.level_spec(level)
        queue = self.provisioner.find_queue(spec.queue_name)
        if queue is None:
            if self.settings.provisioning != "auto":
                raise ChannelNotFound(
                    self.provisioner.describe_missing(f"queue {spec.queue_name!r}")
                )
            queue = self.provisioner.ensure_channel(spec).queue
        self._follow_channel(queue.url)
        return QueueTarget(self.clients.client("sqs", validate_params=False), queue.url)

    def _follow_channel(self, queue_url: str) -> None:
        """track_status None: record status when the channel declares it (its queue's tag),
        read once (under the target lock, before the first send)."""
        if self.track_status is not None or self.status is not None:
            return
        if queue_tracking(self.clients.client("sqs"), queue_url):
            self.status = StatusStore(self.clients, self.settings)
            self.scheduled.status = self.status

    def _max_receives(self, level: str | None) -> int:
        """The queue's max_receives (its redrive policy's maxReceiveCount), read once per level
        and only for pushes that give `max_attempts`."""
        with self._lock:
            known = self._receives.get(level)
        if known is not None:
            return known
        budget = self.settings.retry_budget_seconds
        target = call_with_budget(
            lambda: self._get_target(level), budget, f"locating channel {self.channel!r}")
        assert isinstance(target, QueueTarget)
        attributes = call_with_budget(
            lambda: target.sqs.get_queue_attributes(
                QueueUrl=target.url, AttributeNames=["RedrivePolicy"]),
            budget, f"reading the redrive policy of {self.channel!r}",
        ).get("Attributes", {})
        redrive = json.loads(attributes.get("RedrivePolicy") or "{}")
        known = int(redrive.get("maxReceiveCount") or SQS_MAX_RECEIVE_COUNT)
        with self._lock:
            self._receives[level] = known
        return known


class MultiProducer(_BaseProducer):
    """Publishes to an exchange: an SNS topic fanned out to its consumers' queues."""

    channel_limit = SNS_MAX_MESSAGE_BYTES
    routes_priority_by_attribute = True
    messaging_system = SNS_SYSTEM

    @functools.cached_property
    def destination_name(self) -> str:
        return topic_name_for(self.channel, self.settings.namespace, self.ordered)

    def _make_target(self, level: str | None) -> TopicTarget:
        arn = self.provisioner.ensure_exchange(self.channel, self.ordered)
        return TopicTarget(self.clients.client("sns", validate_params=False), arn)
