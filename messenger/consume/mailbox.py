"""What a consumer does to the messages of its queue: decode, delete in batches, extend, release,
retry later, hold back (sent again as a new message with a delay) and forward to the
dead-letter queue. Every call retries transient errors within the
retry budget; batch calls check their per-entry failures.
"""

from __future__ import annotations

import enum
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from messenger.aws import call_with_budget, is_transient
from messenger.channel import MAX_BATCH_ENTRIES, SQS_MAX_MESSAGE_BYTES
from messenger.errors import (
    InvalidBody,
    MessageDecodeError,
    QueueCallFailed,
    RetryBudgetExhausted,
)
from messenger.message import (
    DEAD_LETTER_FAILURE_ATTRIBUTE,
    DEAD_LETTER_REASON_ATTRIBUTE,
    META_HEADERS_ATTRIBUTE,
    EncodedMessage,
    decode_dependencies,
    decode_envelope,
    sendable_attributes,
)
from messenger.offload import OffloadPointer, PayloadStore
from messenger.schema import SCHEMA_VERSION_ATTRIBUTE, BodySchema

#: A delete that failed (throttled past the retry budget, an SQS error) is tried again this long
#: later, while the message's lease is kept.
DELETE_RETRY_SECONDS = 1.0
#: A delete batch waits at most this long once the consumer holds nothing else and its poll
#: is out (`DeleteBatcher.went_idle`): a receive that brings messages answers sooner (SQS: tens of
#: ms), so on a backlog the batch still fills up; at the tail of a drain the deletes go early.
IDLE_DELETE_SECONDS = 0.05
#: After a poll that brought some messages but fewer than it asked for (a trickle: a message now
#: and then), a delete batch waits this long from its first entry (at most the linger) once the
#: consumer holds nothing else: the next messages' deletes usually join it (at 10 msg/s, one
#: batch per 2-3 messages instead of one per message), and a drain's tail waits no longer.
TRICKLE_DELETE_SECONDS = 0.2
#: Longest dead-letter reason kept in the attribute.
MAX_REASON_LENGTH = 1024
#: The system attributes a delivery reads (`Delivery`, `Delivery.decode`); SQS sends only these.
SYSTEM_ATTRIBUTES = ("ApproximateReceiveCount", "SentTimestamp", "MessageGroupId")


#: Meta headers of a job held back by a limit and sent again as a new message (`Mailbox.hold`):
#: the attempts its earlier copies used, how many times it was held back, and when its hold
#: ends (epoch seconds; set when longer than SQS's largest DelaySeconds).
ATTEMPTS_USED_HEADER = "messenger-attempts-used"
HOLDS_HEADER = "messenger-holds"
HELD_UNTIL_HEADER = "messenger-held-until"


@dataclass(frozen=True)
class HeldMarks:
    """What a received message's meta headers say of its earlier holds (`held_marks`)."""

    attempts_used: int = 0
    holds: int = 0
    held_until: float = 0.0


_NO_MARKS = HeldMarks()


def held_marks(raw: dict[str, Any]) -> HeldMarks:
    """A received message's hold marks (none when it was never held back, or they are not
    readable: a message of a producer that never held anything)."""
    value = raw.get("MessageAttributes", {}).get(META_HEADERS_ATTRIBUTE, {}).get("StringValue")
    if not value or HOLDS_HEADER not in value:  # (no JSON parsed for a plain message)
        return _NO_MARKS
    try:
        headers = json.loads(value)
        return HeldMarks(int(headers.get(ATTEMPTS_USED_HEADER, 0)),
                         int(headers.get(HOLDS_HEADER, 0)),
                         float(headers.get(HELD_UNTIL_HEADER, 0)))
    except (ValueError, TypeError, AttributeError):
        return _NO_MARKS


class Stage(enum.Enum):
    QUEUED = "queued"  # received, waiting for a worker (only behind its group on ordered channels)
    RUNNING = "running"
    #: The handler returned: its delete is pending or being retried. Still leased (the lease
    #: keeper renews it) until SQS confirms the delete, or the delete fails for good.
    DELETING = "deleting"
    DONE = "done"  # finished: deleted, retried, released or dead-lettered
    TIMED_OUT = "timed_out"  # past its processing timeout, until forwarded to the DLQ


@dataclass(frozen=True, init=False)
class ReceivedMessage:
    """What a handler gets: the decoded message plus what SQS says about this delivery.

    body: the producer's JSON value. meta_headers: string headers. routing_key: or None.
    message_id: the producer's id (the SQS MessageId for foreign messages). receive_count: 1 on
    the first delivery. produced_at: epoch seconds at the producer (0 when unknown).
    sent_at: epoch seconds SQS accepted it. group_id: MessageGroupId (ordered channel: the FIFO
    group; standard channel: the fair-queue tenant key, or None).
    """

    body: Any
    meta_headers: dict[str, str]
    routing_key: str | None
    message_id: str
    receive_count: int
    produced_at: float
    sent_at: float
    group_id: str | None
    sqs_message_id: str
    receipt_handle: str = field(repr=False)

    def __init__(self, body: Any, meta_headers: dict[str, str], routing_key: str | None,
                 message_id: str, receive_count: int, produced_at: float, sent_at: float,
                 group_id: str | None, sqs_message_id: str, receipt_handle: str) -> None:
        # One per message: without the generated frozen __init__'s object.__setattr__ per
        # field (a third of the cost of building it).
        values = self.__dict__
        values["body"] = body
        values["meta_headers"] = meta_headers
        values["routing_key"] = routing_key
        values["message_id"] = message_id
        values["receive_count"] = receive_count
        values["produced_at"] = produced_at
        values["sent_at"] = sent_at
        values["group_id"] = group_id
        values["sqs_message_id"] = sqs_message_id
        values["receipt_handle"] = receipt_handle

    @property
    def lag(self) -> float:
        """Seconds between production (or SQS's acceptance) and now."""
        return time.time() - (self.produced_at or self.sent_at)

    @property
    def dependencies(self) -> dict[str, Any]:
        """Job id → result, `ResultOmitted` or `messenger.JobFailed` of each job this one
        waited on (`push(depends_on=...)`, a group's callback); {} for a job that did not."""
        return decode_dependencies(self.meta_headers)


@dataclass(eq=False)
class Delivery:
    """One received SQS message while this consumer holds it."""

    raw: dict[str, Any]
    received_at: float
    lease_until: float
    stage: Stage = Stage.QUEUED
    started_at: float | None = None
    deadline: float | None = None
    thread_id: int | None = None
    in_handler: bool = False
    #: Its lease ran out while held (the process stalled): reported once.
    lapsed: bool = False
    #: Times it waited here and ran again after its handler's RateLimited (`OutcomePolicy`).
    waits: int = 0
    #: Who cancelled it while it ran (`messenger.consume.controls`): its deadline is then now,
    #: and its timeout is dead-lettered as 'cancelled by <who>'.
    cancelled_by: str | None = None
    message: ReceivedMessage | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: The mailbox (queue) it came from: it is deleted, extended, retried and dead-lettered there.
    mailbox: Mailbox | None = field(default=None, repr=False)
    #: SQS handed it out no earlier than this (monotonic; None: `received_at`). Its 12 hours in
    #: flight count from that moment: a retry delay past them is refused.
    handed_out_after: float | None = None

    # What SQS said about the delivery, read from `raw` once: a message's id and receive count
    # go into each of its events.
    receipt_handle: str = field(init=False, repr=False)
    sqs_message_id: str = field(init=False)
    #: MessageGroupId on ordered channels, else None.
    group_id: str | None = field(init=False)
    #: 1 on the first delivery.
    receive_count: int = field(init=False)
    #: The producer's message id when readable, else the SQS MessageId.
    log_id: str = field(init=False)

    def __post_init__(self) -> None:
        raw = self.raw
        self.receipt_handle = str(raw["ReceiptHandle"])
        self.sqs_message_id = str(raw["MessageId"])
        system = raw.get("Attributes", {})
        self.group_id = system.get("MessageGroupId")
        self.receive_count = int(system.get("ApproximateReceiveCount", "1"))
        value = raw.get("MessageAttributes", {}).get("message_id", {}).get("StringValue")
        self.log_id = str(value or self.sqs_message_id)

    @property
    def attempt(self) -> int:
        """The job's current attempt: SQS's receive count, plus the attempts its earlier copies
        used when it was held back by a limit (a copy's receives start again at 1)."""
        return self.receive_count + held_marks(self.raw).attempts_used

    @property
    def level(self) -> str | None:
        """The priority level it came from (None on a channel without priorities)."""
        return self.mailbox.level if self.mailbox is not None else None

    def running_for(self) -> float | None:
        """Seconds since the handler started, None before."""
        return None if self.started_at is None else time.monotonic() - self.started_at

    def claim(self, expected: Stage, new: Stage) -> bool:
        """Move from `expected` to `new` atomically; False when another thread got there first."""
        with self.lock:
            if self.stage is not expected:
                return False
            self.stage = new
            return True

    def decode(self, store: PayloadStore, budget: float, schema: BodySchema | None = None
               ) -> ReceivedMessage:
        """The handler's message, its body the `schema`'s model instance when given; raises
        MessageDecodeError (InvalidBody when the body does not validate) or PayloadMissing."""
        body = str(self.raw.get("Body", ""))
        attributes = self.raw.get("MessageAttributes", {})
        pointer = OffloadPointer.parse(body, attributes)
        if pointer is not None:
            body = call_with_budget(lambda: store.get(pointer), budget, "reading offloaded payload")
        value, routing_key, meta, message_id, produced_at = decode_envelope(
            body, attributes, fallback_id=self.sqs_message_id)
        if schema is not None:
            version = attributes.get(SCHEMA_VERSION_ATTRIBUTE, {}).get("StringValue")
            value = schema.load(value, routing_key, version)
        sent = float(self.raw.get("Attributes", {}).get("SentTimestamp", "0")) / 1000.0
        return ReceivedMessage(
            body=value,
            meta_headers=meta,
            routing_key=routing_key,
            message_id=message_id,
            receive_count=self.receive_count,
            produced_at=produced_at,
            sent_at=sent,
            group_id=self.group_id,
            sqs_message_id=self.sqs_message_id,
            receipt_handle=self.receipt_handle,
        )


@dataclass(frozen=True)
class EntryError:
    """A batch entry SQS refused. transient: worth trying again (SQS's fault, throttling or a
    spent retry budget; False for the sender's faults, e.g. a receipt handle no longer valid)."""

    delivery: Delivery
    code: str
    message: str
    transient: bool = False

    @classmethod
    def of_call(cls, deliveries: Iterable[Delivery], error: Exception) -> list[EntryError]:
        """Every entry of a batch call that raised `error`."""
        transient = isinstance(error, RetryBudgetExhausted) or is_transient(error)
        return [cls(d, type(error).__name__, str(error), transient) for d in deliveries]


def unreadable_reason(error: BaseException) -> str:
    """The dead-letter reason of a message that can never be handled: `invalid: <field>:
    <error>` (its body does not validate), `undecodable: ...` or `payload_missing: ...`."""
    if isinstance(error, InvalidBody):
        return str(error)
    kind = "undecodable" if isinstance(error, MessageDecodeError) else "payload_missing"
    return f"{kind}: {error}"


def _chunks(items: Sequence[Delivery]) -> Iterable[Sequence[Delivery]]:
    for start in range(0, len(items), MAX_BATCH_ENTRIES):
        yield items[start:start + MAX_BATCH_ENTRIES]


class Mailbox:
    """The SQS calls of one consumer on its queue and DLQ.

    level: the priority level whose queue this is (None without priorities). A delivery that
    carries another mailbox (another level's) is always acted on in that mailbox's queue.
    """

    def __init__(
        self, sqs: Any, queue_url: str, dlq_url: str, ordered: bool, budget: float,
        level: str | None = None,
    ) -> None:
        self.sqs = sqs
        self.queue_url = queue_url
        self.dlq_url = dlq_url
        self.ordered = ordered
        self.budget = budget
        self.level = level

    def _home(self, delivery: Delivery) -> Mailbox:
        return delivery.mailbox if delivery.mailbox is not None else self

    def _by_home(self, deliveries: Sequence[Delivery]) -> dict[Mailbox, list[Delivery]]:
        groups: dict[Mailbox, list[Delivery]] = {}
        for delivery in deliveries:
            groups.setdefault(self._home(delivery), []).append(delivery)
        return groups

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        return call_with_budget(call, self.budget, what, error=QueueCallFailed)

    def receive(self, count: int, wait_seconds: int, visibility: int) -> list[dict[str, Any]]:
        response = self.sqs.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=count,
            WaitTimeSeconds=wait_seconds,
            VisibilityTimeout=visibility,
            MessageAttributeNames=["All"],  # all: the DLQ gets them unchanged
            MessageSystemAttributeNames=list(SYSTEM_ATTRIBUTES),
        )
        return list(response.get("Messages", []))

    def _batch(
        self, what: str, operation: str, deliveries: Sequence[Delivery], *,
        budget: float | None = None, sqs: Any | None = None, **entry: Any
    ) -> list[EntryError]:
        """One batch call per 10 deliveries of one queue; returns the entries SQS refused.
        budget: seconds to retry within (default: the retry budget); sqs: another client."""
        errors: list[EntryError] = []
        for home, group in self._by_home(deliveries).items():
            call = getattr(sqs or home.sqs, operation)
            for chunk in _chunks(group):
                entries = [
                    {"Id": str(i), "ReceiptHandle": d.receipt_handle, **entry}
                    for i, d in enumerate(chunk)
                ]
                response = call_with_budget(
                    partial(call, QueueUrl=home.queue_url, Entries=entries),
                    home.budget if budget is None else budget, what, error=QueueCallFailed,
                )
                errors.extend(_entry_errors(chunk, response))
        return errors

    def _visibility_batch(
        self, deliveries: Sequence[Delivery], seconds: int, *,
        budget: float | None = None, sqs: Any | None = None,
    ) -> list[EntryError]:
        return self._batch(
            "ChangeMessageVisibilityBatch", "change_message_visibility_batch", deliveries,
            budget=budget, sqs=sqs, VisibilityTimeout=seconds,
        )

    def extend(
        self, deliveries: Sequence[Delivery], seconds: int, *,
        budget: float | None = None, sqs: Any | None = None,
    ) -> list[EntryError]:
        """Heartbeat: keep the messages invisible for `seconds` more, retrying within `budget`
        seconds (default: the retry budget), through `sqs` (default: this mailbox's client)."""
        return self._visibility_batch(deliveries, seconds, budget=budget, sqs=sqs)

    def release(self, deliveries: Sequence[Delivery]) -> list[EntryError]:
        """Make the messages visible again now (not started, or abandoned at shutdown)."""
        return self._visibility_batch(deliveries, 0)

    def retry_later(self, delivery: Delivery, seconds: int) -> None:
        """Make a failed message visible again after `seconds` (SQS counts the receive)."""
        home = self._home(delivery)
        home._call(
            "ChangeMessageVisibility",
            lambda: home.sqs.change_message_visibility(
                QueueUrl=home.queue_url, ReceiptHandle=delivery.receipt_handle,
                VisibilityTimeout=seconds,
            ),
        )

    def delete_batch(self, deliveries: Sequence[Delivery]) -> list[EntryError]:
        return self._batch("DeleteMessageBatch", "delete_message_batch", deliveries)

    def hold(self, delivery: Delivery, seconds: int, marks: HeldMarks) -> None:
        """Send a job held back by a limit again as a new message, visible after `seconds`
        (at most 900: longer, its `held_until` mark holds it again), its meta headers carrying
        `marks` (the attempts it used: SQS's receive count of the copy starts again at 1, so
        holds never move it toward the DLQ). The caller deletes the delivery afterwards (send
        first: a crash in between leaves two copies, never none). Body (an offload pointer
        stays a pointer), attributes and a fair queue's tenant key travel unchanged. Standard
        queues only: on a FIFO queue the copy would go behind the rest of its group."""
        home = self._home(delivery)
        attributes = sendable_attributes(delivery.raw.get("MessageAttributes", {}))
        entry = attributes.get(META_HEADERS_ATTRIBUTE, {}).get("StringValue")
        try:
            headers = json.loads(entry) if entry else {}
        except ValueError:
            headers = {}
        if not isinstance(headers, dict):
            headers = {}
        headers[ATTEMPTS_USED_HEADER] = str(marks.attempts_used)
        headers[HOLDS_HEADER] = str(marks.holds)
        if marks.held_until:
            headers[HELD_UNTIL_HEADER] = f"{marks.held_until:.3f}"
        else:
            headers.pop(HELD_UNTIL_HEADER, None)
        attributes[META_HEADERS_ATTRIBUTE] = {
            "DataType": "String", "StringValue": json.dumps(headers, separators=(",", ":"))}
        tenant = {"MessageGroupId": delivery.group_id} if delivery.group_id else {}
        home._call(
            "SendMessage (held back)",
            lambda: home.sqs.send_message(
                QueueUrl=home.queue_url, MessageBody=str(delivery.raw.get("Body", "")),
                MessageAttributes=attributes, DelaySeconds=max(0, min(seconds, 900)), **tenant,
            ),
        )

    def dead_letter(self, delivery: Delivery, reason: str, note: str | None = None) -> None:
        """Forward to the DLQ with the reason (and `note`, the JSON of what failed, see
        `messenger.consume.failures`), then delete from the queue.

        Forward first: a crash in between leaves a duplicate in the DLQ, never a loss. The raw
        body (an offload pointer stays a pointer) and the attributes travel unchanged. A
        delivery of another mailbox goes to that mailbox's DLQ (its priority level's).
        """
        home = self._home(delivery)
        if home is not self:
            home.dead_letter(delivery, reason, note)
            return
        attributes = sendable_attributes(delivery.raw.get("MessageAttributes", {}))
        attributes[DEAD_LETTER_REASON_ATTRIBUTE] = {
            "DataType": "String", "StringValue": reason[:MAX_REASON_LENGTH],
        }
        body = str(delivery.raw.get("Body", ""))
        if note is not None:
            attributes[DEAD_LETTER_FAILURE_ATTRIBUTE] = {"DataType": "String", "StringValue": note}
            if EncodedMessage(body, attributes).size > SQS_MAX_MESSAGE_BYTES:
                # A body at SQS's size limit: the traceback gives way, never the message.
                trimmed = {**json.loads(note), "traceback": "(left out: SQS's size limit)"}
                attributes[DEAD_LETTER_FAILURE_ATTRIBUTE]["StringValue"] = json.dumps(trimmed)
        fifo: dict[str, str] = {}
        if self.ordered:
            fifo = {
                "MessageGroupId": delivery.group_id or "dead-letter",
                "MessageDeduplicationId": f"dl-{delivery.sqs_message_id}"[:128],
            }
        elif delivery.group_id:  # a fair queue's tenant key stays with the message
            fifo = {"MessageGroupId": delivery.group_id}
        self._call(
            "SendMessage to the DLQ",
            lambda: self.sqs.send_message(
                QueueUrl=self.dlq_url, MessageBody=body,
                MessageAttributes=attributes, **fifo,
            ),
        )
        self._call(
            "DeleteMessage",
            lambda: self.sqs.delete_message(
                QueueUrl=self.queue_url, ReceiptHandle=delivery.receipt_handle
            ),
        )


def _entry_errors(chunk: Sequence[Delivery], response: dict[str, Any]) -> list[EntryError]:
    return [
        EntryError(
            chunk[int(failed["Id"])], str(failed.get("Code", "")), str(failed.get("Message", "")),
            transient=not failed.get("SenderFault", False),
        )
        for failed in response.get("Failed", [])
    ]


class DeleteBatcher:
    """Collects finished messages and deletes them with DeleteMessageBatch.

    A batch goes out when it holds 10 entries, or when its oldest entry has waited `linger`
    seconds, or on `flush()` (shutdown; an ordered channel before each poll), or early at the
    tail of a drain (`went_idle`: the runtime holds no other message, so no entry can join
    before its next poll brings some; waiting out the linger would only delay the last
    deletes; after a trickle of messages, the next one's delete usually joins within
    TRICKLE_DELETE_SECONDS). Once `start()`ed,
    batches go out on the batcher's own thread: a worker that finishes a message never waits
    for a delete, and a throttled delete delays nothing else. Entries SQS deleted are reported
    through `on_deleted`, entries it refused (or a call that failed) through `on_failure`; when
    that returns True the entry is tried again DELETE_RETRY_SECONDS later, by the thread (the
    runtime keeps its lease meanwhile), else it is dropped. `close()` tries them once more.

    The thread is woken by a batch's first entry (to start its linger) and by a full batch.
    Inside `deferred_wakes` (the receiver running a poll's messages back to back, ~1 ms) a first
    entry's wake waits for the end of it, or for `wake_if_due` (the watchdog, every tick): one
    wake per batch instead of two on a busy queue, each costing both threads CPU.
    """

    def __init__(
        self, mailbox: Mailbox, linger: float, on_failure: Callable[[EntryError], bool | None],
        on_deleted: Callable[[Sequence[Delivery]], None] | None = None,
        idle: Callable[[], bool] | None = None,
    ) -> None:
        """idle: whether the runtime holds no message now (checked when a `went_idle` wait
        ends; None: taken as idle)."""
        self.mailbox = mailbox
        self.linger = linger
        self.on_failure = on_failure
        self.on_deleted = on_deleted
        self.idle = idle
        #: When the pending entries are due because the runtime went idle (None: not idle).
        self._idle_due: float | None = None
        #: Entries whose delete failed and is tried again: (when, delivery), oldest first.
        self._retrying: list[tuple[float, Delivery]] = []
        self._lock = threading.RLock()  # `_cond`'s: `add` takes it directly (cheaper)
        self._cond = threading.Condition(self._lock)
        self._send_lock = threading.Lock()
        self._pending: list[Delivery] = []
        self._oldest = 0.0
        self._thread: threading.Thread | None = None
        self._closed = False
        self._deferring = 0  # `deferred_wakes` under way
        self._wake_due = False  # a first entry came in meanwhile: its wake is still owed

    def start(
        self, guard: Callable[[Callable[[], None]], Callable[[], None]] | None = None
    ) -> None:
        """Send batches from a thread of the batcher's own (without it, `add` sends a full
        batch itself and the rest waits for `flush`); `guard` wraps the thread's loop."""
        target = self._run if guard is None else guard(self._run)
        self._thread = threading.Thread(target=target, name="messenger-deleter", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread, then send what is pending."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        with self._cond:
            self._pending.extend(d for _, d in self._retrying)
            self._retrying.clear()
        self.flush()

    def add(self, delivery: Delivery) -> None:
        with self._lock:
            pending = self._pending
            if not pending:
                self._oldest = time.monotonic()
            pending.append(delivery)
            full = len(pending) >= MAX_BATCH_ENTRIES
            if full or len(pending) == 1:
                if full or not self._deferring:
                    self._wake_due = False
                    self._cond.notify_all()
                else:
                    self._wake_due = True
        if full and self._thread is None:
            self.flush()

    @contextmanager
    def deferred_wakes(self) -> Iterator[None]:
        """Entries added meanwhile wake the thread only for a full batch; a first entry's wake
        is given at the end (its linger still counts from when it came in).

        CPU optimisation: the plain path wakes the deleter at a batch's first entry (`add`
        outside this block); each wake costs both threads a GIL hand-over."""
        with self._lock:
            self._deferring += 1
        try:
            yield
        finally:
            with self._lock:
                self._deferring -= 1
                self.wake_if_due()

    def wake_if_due(self) -> None:
        """Give a first entry's deferred wake now (a deferral that lasts: a receiver's message
        turned out slow); the watchdog calls this every tick."""
        with self._lock:
            if self._wake_due:
                self._wake_due = False
                self._cond.notify_all()

    def went_idle(self, dry: bool, trickle: bool = False) -> None:
        """The runtime holds no message besides those pending here. After a poll that brought
        nothing (`dry`: the queue ran dry) the pending entries go out now; after one that
        brought fewer messages than it asked for (`trickle`), TRICKLE_DELETE_SECONDS (at most
        the linger) after the first of them; else (a full poll) after IDLE_DELETE_SECONDS. Past
        `trickle`'s and the full poll's wait they go out if the runtime still holds nothing
        (`idle`): else the next messages came in meanwhile, and the batch keeps filling up."""
        with self._lock:
            if not self._pending:
                return
            now = time.monotonic()
            if dry:
                self._idle_due = now
            elif trickle:
                self._idle_due = self._oldest + min(self.linger, TRICKLE_DELETE_SECONDS)
            else:
                self._idle_due = now + IDLE_DELETE_SECONDS
            self._wake_due = False
            self._cond.notify_all()
        if self._thread is None and dry:
            self.flush()

    def _wait(self, now: float) -> float:
        """Seconds until the pending batch is due (under `_cond`): its linger, or sooner when
        the runtime went idle (`went_idle`) and still is."""
        wait = self._oldest + self.linger - now
        due = self._idle_due
        if due is None:
            return wait
        if due > now:
            return min(wait, due - now)
        self._idle_due = None
        return 0.0 if self.idle is None or self.idle() else wait

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._pending) + len(self._retrying)

    def _retry_due(self) -> float | None:
        """Move the retries that are due into the pending batch (under `_cond`); seconds until
        the next one is due (None: no retry waits)."""
        now = time.monotonic()
        while self._retrying and self._retrying[0][0] <= now:
            if not self._pending:
                self._oldest = now
            self._pending.append(self._retrying.pop(0)[1])
        return self._retrying[0][0] - now if self._retrying else None

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    next_retry = self._retry_due()
                    if not self._pending:
                        self._cond.wait(next_retry)
                        continue
                    wait = self._wait(time.monotonic())
                    if wait <= 0 or len(self._pending) >= MAX_BATCH_ENTRIES:
                        break
                    self._cond.wait(wait)
            self.flush(full_only=wait > 0)

    def flush(self, full_only: bool = False) -> None:
        """Send the pending entries (`full_only`: only full batches of 10)."""
        with self._send_lock:
            while True:
                with self._cond:
                    if full_only and len(self._pending) < MAX_BATCH_ENTRIES:
                        return
                    batch = self._pending[:MAX_BATCH_ENTRIES]
                    del self._pending[:MAX_BATCH_ENTRIES]
                    if self._pending:
                        self._oldest = time.monotonic()
                    else:
                        self._idle_due = None  # the next batch's own idle moment counts
                if not batch:
                    return
                try:
                    errors = self.mailbox.delete_batch(batch)
                except Exception as error:  # the budget is spent: report, maybe retry
                    errors = EntryError.of_call(batch, error)
                refused = {id(e.delivery) for e in errors}
                if self.on_deleted is not None and len(refused) < len(batch):
                    self.on_deleted([d for d in batch if id(d) not in refused])
                for failed in errors:
                    if self.on_failure(failed):
                        with self._cond:
                            self._retrying.append(
                                (time.monotonic() + DELETE_RETRY_SECONDS, failed.delivery))
                            self._cond.notify_all()  # the thread waits for the retry
