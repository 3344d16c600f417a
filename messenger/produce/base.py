"""`BaseProducer`: what `Producer` (a queue) and `MultiProducer` (an exchange) share: the
class settings, the shared instance per class, and the two push flows, `push` and `push_many`.

Each flow takes its items through three parts, each in a module of its own:
- `messenger.produce.preparation.MessagePreparation`: checks, encodes, offloads (a PushItem
  becomes a PreparedItem);
- `messenger.jobs.enqueue_dedup.EnqueueDedup`: dedup on enqueue, a claim before the send and a
  mark (or a release) after it;
- `messenger.produce.sending.ChannelSending`: the channel's targets, batches and QUEUED records.
A push with `at=`/`delay=` is sent by `messenger.produce.scheduled.ScheduledSends`.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, ClassVar

from messenger.aws import ClientFactory
from messenger.errors import InvalidChannelSpec, InvalidMessage, InvalidSettings
from messenger.jobs.dedup import (
    DEFAULT_WINDOW_SECONDS,
    HELD_CODE,
    Claim,
    DedupStore,
    Duplicate,
    Held,
    SentMarks,
    check_lease,
    check_window,
)
from messenger.jobs.enqueue_dedup import EnqueueDedup
from messenger.jobs.results import ResultStore
from messenger.jobs.schedules import Delivery, plan_delivery
from messenger.jobs.status import StatusEvent, StatusStore
from messenger.offload import PayloadStore
from messenger.produce.preparation import MessagePreparation
from messenger.produce.push import PreparedItem, PushedId, PushFailure, PushItem, PushManyResult
from messenger.produce.results import ResultWaits
from messenger.produce.scheduled import ScheduledSends
from messenger.produce.sending import ChannelSending, failure_code
from messenger.produce.transport import QueueTarget, TopicTarget
from messenger.produce.waiting import WaitingJobs
from messenger.provision import Provisioner
from messenger.schema import BodySchema
from messenger.settings import Settings
from messenger.tracing import SNS_SYSTEM, ProducerTrace

logger = logging.getLogger("messenger.producer")

#: Largest body the offload bucket takes (the AWS extended clients' limit is 2 GB).
MAX_OFFLOADED_BYTES = 2 * 1024**3


class BaseProducer(MessagePreparation, ChannelSending, WaitingJobs):
    """The base of `Producer` and `MultiProducer` (subclass those, in
    `messenger.produce.producer`); see the module doc for its parts."""

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

    _instances: ClassVar[dict[type, BaseProducer]] = {}
    _instances_lock: ClassVar[threading.Lock] = threading.Lock()

    def __new__(cls, settings: Settings | None = None, clients: ClientFactory | None = None) -> Any:
        if settings is not None or clients is not None:
            return super().__new__(cls)  # an explicitly configured, unshared instance
        with BaseProducer._instances_lock:
            instance = BaseProducer._instances.get(cls)
            if instance is None:
                instance = super().__new__(cls)
                instance._setup(None, None)
                BaseProducer._instances[cls] = instance
            return instance

    def __init__(
        self, settings: Settings | None = None, clients: ClientFactory | None = None
    ) -> None:
        if settings is not None or clients is not None:
            self._setup(settings, clients)

    @classmethod
    def reset_instances(cls) -> None:
        """Forget the shared instances (e.g. after the environment changed in tests)."""
        with BaseProducer._instances_lock:
            BaseProducer._instances.clear()

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
        window = check_window(self.dedup_window, f"{type(self).__name__}.dedup_window")
        self.dedup_store = DedupStore(self.clients, self.settings, check_lease(
            self.dedup_lease, self.settings, f"{type(self).__name__}.dedup_lease"))
        #: Dedup on enqueue: the claim before a send, the mark after it (`EnqueueDedup`).
        self.dedup_flow = EnqueueDedup(self.dedup_store, self.channel, window, self.dedup,
                                       self.ordered, self.settings.retry_budget_seconds)
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
        depends_on: Iterable[str] | None = None,
        on_dependency_failure: str = "cancel",
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
        depends_on: job ids (1-100, on channels that keep results) this job waits for: it is
        held out of its queue until each reached a final outcome, then sent with
        `message.dependencies` (each one's result or failure); a job id held already is a
        duplicate (docs/workflows.md). on_dependency_failure: 'cancel' (default: a dependency
        that did not complete cancels the job, its outcome CANCELLED naming that job) or
        'run' (it runs anyway, the failure in its dependencies).
        """
        when = plan_delivery(at, delay, ordered=self.ordered,
                             fanout=self.messaging_system == SNS_SYSTEM)
        item = PushItem(body, routing_key, group_id, dedup_id, meta_headers, priority, message_id,
                        max_attempts, dedup)
        if depends_on is not None:
            if when is not None:
                raise InvalidMessage("depends_on: a job that waits on others is sent when they "
                                     "are final; it takes no at/delay")
            return self._hold(item, depends_on, on_dependency_failure)
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
        verdict = self.dedup_flow.claim_for_push(self.dedup_flow.key(
            prepared.outgoing.dedup_id, item.message_id, item.dedup, set()))
        if isinstance(verdict, Duplicate):
            logger.info("push to %s: message %s is a duplicate (not sent)", self.channel,
                        prepared.message_id)
            self._record_queued([prepared.message_id], time.time(), StatusEvent.DUPLICATE)
            return PushedId(prepared.message_id, duplicate=True)
        sent_at = time.time()  # SQS accepts it after this: a consumer's RECEIVED comes later
        # One token per push, the same on its retries: a schedule it made is told from another
        # push's (`ScheduleStore.schedule`).
        push = uuid.uuid4().hex if when is not None and when.scheduled else ""
        with self.dedup_flow.sending(verdict):  # marked sent, or given back if it raises
            sent = self._with_target(
                prepared.level, lambda target: self.scheduled.send(target, prepared, when, push),
                "push")
        sent_id = sent.sent_id
        if sent.duplicate:
            # The job id names one job: its first schedule stands (its due time, its body).
            due = f"due {sent.due:%Y-%m-%d %H:%M:%S} UTC" if sent.due else "fired or cancelled"
            logger.info("push to %s: job %s is scheduled already (%s): this push is a "
                        "duplicate, not scheduled", self.channel, prepared.message_id, due)
            return PushedId(prepared.message_id, duplicate=True, due=sent.due, scheduled=True)
        self.dedup_flow.remember([prepared.outgoing.dedup_id])
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
                verdict = self.dedup_flow.key(prepared.outgoing.dedup_id, item.message_id,
                                               item.dedup, taken)
            except Exception as error:  # one bad item never aborts the others
                result.failures.append(PushFailure(index, failure_code(error), str(error)))
                continue
            if isinstance(verdict, Duplicate):
                result.duplicates.append(index)
                result.message_ids[index] = prepared.message_id  # the id it repeats
                continue
            if verdict is not None:
                keys[index] = verdict
            result.offloaded += offloaded
            by_level.setdefault(prepared.level, []).append(prepared)
        marks = self.dedup_flow.marks()
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
        self.dedup_flow.remember([p.outgoing.dedup_id for entries in by_level.values()
                                  for p in entries if result.message_ids[p.index] is not None])
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

    def result(self, job_id: str, timeout: float | None = None) -> Any:
        """The result of a job pushed to a channel that keeps results (`keep_results`): what
        its handler returned (JSON), once it completed. Raises `messenger.JobFailed` (its
        outcome, error type, error, reason) when it was dead-lettered, cancelled, deleted from
        its DLQ or expired; TimeoutError when it has no final outcome within `timeout` seconds
        (None: wait for ever; 0: one read); InvalidSettings naming keep_results when the
        channel does not declare it. The reads back off from 0.1 s to 5 s (`result_waits`)."""
        self._check_keeps_results()
        return self.result_waits.result(job_id, timeout)

    @functools.cached_property
    def result_waits(self) -> ResultWaits:
        """How `result` reads (`messenger.produce.results.ResultWaits`: tests may swap its
        clock and sleep)."""
        return ResultWaits(ResultStore(self.clients, self.settings))

    def _check_keeps_results(self) -> None:
        """InvalidSettings unless the channel declares keep_results (its queue's tag)."""
        raise NotImplementedError

    # -- internals ------------------------------------------------------------------------
    def _trace(self, batch: bool) -> ProducerTrace | None:
        """The spans and context of a push (None: tracing is off, `messenger.tracing`)."""
        return ProducerTrace.of(self.settings.tracing, self.messaging_system,
                                self.destination_name, batch, self.trace_parent)

    def _push_each(self, items: list[PushItem], when: Delivery) -> PushManyResult:
        """push_many's items due later: each pushed as `push` does (`_push`), failures per item."""
        result = PushManyResult(message_ids=[None] * len(items))
        for index, item in enumerate(items):
            try:
                pushed = self._push(item, None, when)
            except Exception as error:  # one bad item never aborts the others
                result.failures.append(PushFailure(index, failure_code(error), str(error)))
                continue
            result.message_ids[index] = str(pushed)
            if pushed.duplicate:
                result.duplicates.append(index)
        return result

    def _claim_batch(self, batch: list[PreparedItem], keys: dict[int, str],
                     wait_until: float | None, result: PushManyResult, held: dict[int, Held]
                     ) -> tuple[list[PreparedItem], dict[int, Claim]]:
        """The entries of `batch` to send and the claims made for them; duplicates go to
        `result`, ids held by another producer to `held` (wait_until: see DedupStore.claim)."""
        found = self.dedup_flow.claim_batch(
            [(entry.index, keys.get(entry.index)) for entry in batch], wait_until)
        by_index = {entry.index: entry for entry in batch}
        for index, error in found.errors.items():
            result.failures.append(PushFailure(index, failure_code(error), str(error)))
        for index in found.duplicates:
            result.duplicates.append(index)
            result.message_ids[index] = by_index[index].message_id  # the id it repeats
        held.update(found.held)
        return [by_index[index] for index in found.ready], found.claims

    def _send_claimed(self, level: str | None, ready: list[PreparedItem],
                      claims: dict[int, Claim], result: PushManyResult,
                      trace: ProducerTrace | None, marks: SentMarks) -> None:
        """Send `ready` as one batch, then settle its claims: sent ones to be marked, the
        others released (not sent: a retry is not a duplicate)."""
        if ready:
            self._send_batch(level, ready, result, trace)  # records the batch's QUEUED
        sent = {index for index in claims if result.message_ids[index] is not None}
        self.dedup_flow.settle(claims, sent, marks)
