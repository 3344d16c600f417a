"""Message status by id: lifecycle records in a DynamoDB table, written off the hot path.

Producers, consumers and the requeuer `record()` events; a background thread writes them with
BatchWriteItem (25 items per request) from a bounded buffer. A status-store failure is logged and
counted (`StatusStore.stats`), never a reason to fail or lose a message. Records expire with the
channel's retention (DynamoDB TTL on `expires_at`).

Table `<namespace->messenger-status`: partition key `message_id`, sort key `sk` = '<time>#<event>'.
One item holds one record, or, when several records of one message are written together (a
consumer's RECEIVED, STARTED and COMPLETED usually are), all of them: the first record's key and
`event`, and `records`, the JSON list of every record (`records_of_item` reads both). A job then
costs one item write instead of three, and the writer serializes 5 attributes instead of ~27
(botocore's serializer, not the network, is what slowed a tracked consumer's handlers).
"""

from __future__ import annotations

import atexit
import enum
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from messenger.aws import ClientFactory, error_code
from messenger.channel import (
    DEFAULT_RETENTION_SECONDS,
    TAG_TRACK_STATUS,
    ChannelSpec,
    declared_track_status,
    status_table_name,
    topic_name_for,
)
from messenger.errors import ChannelNotFound
from messenger.jobs.results import is_final_item
from messenger.jobs.tables import ensure_table, table_exists
from messenger.settings import Settings

logger = logging.getLogger("messenger.status")

#: BatchWriteItem takes at most 25 items.
DYNAMODB_MAX_BATCH = 25
#: The end of a FAILED record's traceback that is kept.
MAX_TRACEBACK_CHARS = 4096
#: Records kept in memory at most before new ones are dropped (and counted).
DEFAULT_MAX_BUFFER = 10_000


class StatusEvent(str, enum.Enum):  # not StrEnum (3.11): EMR runs Python 3.9 too
    #: Pushed with `at=`/`delay=` beyond SQS's delay: a one-time schedule, due at `due_at`.
    SCHEDULED = "SCHEDULED"
    QUEUED = "QUEUED"
    #: Pushed again within the dedup window (or SQS's 5 minutes, ordered): not sent.
    DUPLICATE = "DUPLICATE"
    RECEIVED = "RECEIVED"
    STARTED = "STARTED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    RETRIED = "RETRIED"
    TIMED_OUT = "TIMED_OUT"
    DEAD_LETTERED = "DEAD_LETTERED"
    REQUEUED = "REQUEUED"
    #: Deleted from its DLQ by an operator (`actor`): the job will not run.
    DELETED = "DELETED"
    #: Cancelled by an operator (`actor`): a running job stopped (`messenger cancel`), then
    #: dead-lettered; or a scheduled job whose schedule was deleted before it was due
    #: (`messenger schedules cancel`, the dashboard): it never reached SQS, nothing is
    #: dead-lettered.
    CANCELLED = "CANCELLED"

    def __str__(self) -> str:
        return str(self.value)


#: Events after which more of the same message's records follow at once (its handler is
#: running; its failure's RETRIED or DEAD_LETTERED): the writer holds such a message's records up
#: to `flush_interval` so that they share one item with what follows.
UNSETTLED = frozenset({StatusEvent.RECEIVED, StatusEvent.STARTED, StatusEvent.FAILED})


@dataclass(frozen=True)
class StatusRecord:
    """One lifecycle event of one message."""

    message_id: str
    event: StatusEvent
    channel: str
    at: float = field(default_factory=time.time)
    consumer_id: str = ""
    receive_count: int = 0
    duration: float | None = None
    error_class: str = ""
    error: str = ""
    #: FAILED: the end of the handler's traceback (at most ~4 KiB).
    traceback: str = ""
    #: SCHEDULED: when the job is due (epoch seconds).
    due_at: float | None = None
    #: Who did an operator's action (REQUEUED, DELETED from the dashboard or the CLI).
    actor: str = ""

    @property
    def sort_key(self) -> str:
        """'<time>#<event>': a message's records in time order."""
        return f"{self.at:017.6f}#{self.event.value}"

    def item(self, retention_seconds: int) -> dict[str, Any]:
        item: dict[str, Any] = {
            "message_id": {"S": self.message_id},
            "sk": {"S": self.sort_key},
            "event": {"S": self.event.value},
            "at": {"N": repr(self.at)},
            "channel": {"S": self.channel},
            "receive_count": {"N": str(self.receive_count)},
            "expires_at": {"N": str(int(self.at + retention_seconds))},
        }
        if self.consumer_id:
            item["consumer_id"] = {"S": self.consumer_id}
        if self.duration is not None:
            item["duration"] = {"N": str(round(Decimal(self.duration), 6))}
        if self.error_class:
            item["error_class"] = {"S": self.error_class}
        if self.error:
            item["error"] = {"S": self.error[:1000]}
        if self.traceback:
            item["traceback"] = {"S": self.traceback[-MAX_TRACEBACK_CHARS:]}
        if self.actor:
            item["actor"] = {"S": self.actor[:256]}
        if self.due_at is not None:
            item["due_at"] = {"N": repr(self.due_at)}
            # A scheduled job's records outlive its wait as well as the retention after it.
            item["expires_at"] = {"N": str(int(max(self.at, self.due_at) + retention_seconds))}
        return item

    def compact(self) -> dict[str, Any]:
        """The record's fields without its message id, defaults left out (for `records`)."""
        fields: dict[str, Any] = {"event": self.event.value, "at": self.at,
                                  "channel": self.channel}
        for name, value, default in (
            ("consumer_id", self.consumer_id, ""), ("receive_count", self.receive_count, 0),
            ("duration", self.duration, None), ("error_class", self.error_class, ""),
            ("error", self.error[:1000], ""),
            ("traceback", self.traceback[-MAX_TRACEBACK_CHARS:], ""),
            ("due_at", self.due_at, None), ("actor", self.actor[:256], ""),
        ):
            if value != default:
                fields[name] = value
        return fields

    @classmethod
    def from_compact(cls, message_id: str, fields: dict[str, Any]) -> StatusRecord:
        return cls(message_id=message_id, **{**fields, "event": StatusEvent(fields["event"])})

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> StatusRecord:
        return cls(
            message_id=item["message_id"]["S"],
            event=StatusEvent(item["event"]["S"]),
            channel=item["channel"]["S"],
            at=float(item["at"]["N"]),
            consumer_id=item.get("consumer_id", {}).get("S", ""),
            receive_count=int(item.get("receive_count", {}).get("N", 0)),
            duration=float(item["duration"]["N"]) if "duration" in item else None,
            error_class=item.get("error_class", {}).get("S", ""),
            error=item.get("error", {}).get("S", ""),
            traceback=item.get("traceback", {}).get("S", ""),
            due_at=float(item["due_at"]["N"]) if "due_at" in item else None,
            actor=item.get("actor", {}).get("S", ""),
        )


def status_items(records: list[StatusRecord], retention_seconds: int) -> list[dict[str, Any]]:
    """The items that store `records`: one per message, in the order of its first record (see
    the module doc); a message with one record gets a plain item."""
    by_message: dict[str, list[StatusRecord]] = {}
    for record in records:
        by_message.setdefault(record.message_id, []).append(record)
    items = []
    for message_id, group in by_message.items():
        first = group[0]
        if len(group) == 1:
            items.append(first.item(retention_seconds))
            continue
        # as `item`: a scheduled job's records outlive its wait too
        expires = max(int(max(r.at, r.due_at or 0.0) + retention_seconds) for r in group)
        items.append({
            "message_id": {"S": message_id},
            "sk": {"S": first.sort_key},
            "event": {"S": first.event.value},
            "records": {"S": json.dumps([r.compact() for r in group], separators=(",", ":"))},
            "expires_at": {"N": str(expires)},
        })
    return items


def records_of_item(item: dict[str, Any]) -> list[StatusRecord]:
    """The records an item stores (one, or a message's records written together)."""
    if "records" not in item:
        return [StatusRecord.from_item(item)]
    message_id = item["message_id"]["S"]
    return [StatusRecord.from_compact(message_id, fields)
            for fields in json.loads(item["records"]["S"])]


@dataclass
class _Pending:
    """A message's buffered records (StatusStore): when the first was recorded, whether the
    last is settled (not in UNSETTLED), the records in the order they were recorded."""

    first_at: float
    settled: bool
    records: list[StatusRecord]


@dataclass
class StatusStats:
    recorded: int = 0
    written: int = 0
    dropped: int = 0
    failed: int = 0
    requests: int = 0
    #: Items put (a message's records written together share one: see the module doc).
    items: int = 0
    #: CPU seconds the writer process has used so far (`messenger.jobs.status_writer`; 0.0
    #: when the store writes from a thread of its own process).
    writer_cpu_seconds: float = 0.0


class StatusStore:
    """Buffered, asynchronous writer and reader of status records.

    retention_seconds: record lifetime (TTL). flush_interval: seconds between background
    flushes (0.5). max_buffer: records held at most; beyond, new records are dropped and counted.
    """

    def __init__(
        self,
        clients: ClientFactory,
        settings: Settings,
        retention_seconds: int = DEFAULT_RETENTION_SECONDS,
        flush_interval: float = 0.5,
        max_buffer: int = DEFAULT_MAX_BUFFER,
    ) -> None:
        self.clients = clients
        self.settings = settings
        self.table = status_table_name(settings.namespace)
        self.retention_seconds = retention_seconds
        self.flush_interval = flush_interval
        self.stats = StatusStats()
        #: message id -> _Pending (its buffered records), in the order of their first records:
        #: a request takes whole messages, so taking one costs the records it takes, not the
        #: buffer's (a buffer that grew while DynamoDB was slow drains as fast as a short one)
        self._pending: dict[str, _Pending] = {}
        self._buffered = 0  # records in _pending
        self._settled = 0  # messages in _pending whose last event is not UNSETTLED
        self._writing = 0  # records of the request in flight
        self.max_buffer = max_buffer
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._ready = False
        self._thread: threading.Thread | None = None

    # -- table ----------------------------------------------------------------------------
    def ensure_table(self) -> None:
        """Create the table with TTL (auto) or check that it exists (verify)."""
        ensure_table(self.clients, self.settings, self.table, "status", "message_id", "sk")

    def prepare(self, check_table: bool = True) -> None:
        """Ensure the table (unless `check_table` is False: done elsewhere) and make the
        writer's client now (a consumer's start-up), so that the first write does not load
        botocore's DynamoDB model beside running handlers."""
        if check_table:
            self.ensure_table()
        self._writer_client()
        self._ready = True

    def _writer_client(self) -> Any:
        # Items are built here from checked records: botocore's parameter check is skipped.
        return self.clients.client("dynamodb", validate_params=False)

    # -- writing --------------------------------------------------------------------------
    def record(self, record: StatusRecord) -> None:
        """Queue a record for writing; never blocks on the network, never raises."""
        with self._lock:
            self.stats.recorded += 1
            if self._buffered >= self.max_buffer:
                self.stats.dropped += 1
                return
            self._buffered += 1
            entry = self._pending.get(record.message_id)
            settled = record.event not in UNSETTLED
            if entry is None:
                self._pending[record.message_id] = _Pending(record.at, settled, [record])
                self._settled += settled
            else:
                self._settled += settled - entry.settled
                entry.settled = settled
                entry.records.append(record)
            full = self._settled >= DYNAMODB_MAX_BATCH
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="messenger-status", daemon=True
                )
                self._thread.start()
                # A process that ends without close() still writes what it recorded.
                atexit.register(self.close)
        if full:
            self._wake.set()

    def _run(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            self.flush(full_batches_only=True)
        self.flush()  # the final flush, within the time close() waits

    def flush(self, full_batches_only: bool = False) -> None:
        """Write what is buffered, 25 messages' records per request. With `full_batches_only`,
        only full requests of settled messages (see UNSETTLED) go out, and what else is
        `flush_interval` old: requests carry 25 items whenever traffic allows, and a job's
        records one item when it ends within that interval."""
        while True:
            with self._lock:
                if not self._pending:
                    return
                cutoff = time.time() - self.flush_interval if full_batches_only else None
                if (
                    cutoff is not None
                    and self._settled < DYNAMODB_MAX_BATCH
                    and next(iter(self._pending.values())).first_at > cutoff
                ):
                    return
                batch = self._take(DYNAMODB_MAX_BATCH, cutoff)
                if not batch:
                    return
                self._writing = len(batch)
            try:
                self._write(batch)
            finally:
                self._writing = 0

    def _take(self, messages: int, cutoff: float | None) -> list[StatusRecord]:
        """Remove and return every buffered record of the first `messages` messages that are
        settled or whose first record is older than `cutoff` (None: of any message)."""
        chosen: list[str] = []
        batch: list[StatusRecord] = []
        for message_id, entry in self._pending.items():
            if len(chosen) == messages:
                break
            if entry.settled or cutoff is None or entry.first_at <= cutoff:
                chosen.append(message_id)
                batch.extend(entry.records)
                self._settled -= entry.settled
        for message_id in chosen:
            del self._pending[message_id]
        self._buffered -= len(batch)
        return batch

    def _write(self, batch: list[StatusRecord]) -> None:
        try:
            if not self._ready:
                self.ensure_table()
                self._ready = True
            dynamodb = self._writer_client()
            items = status_items(batch, self.retention_seconds)
            requests = [{"PutRequest": {"Item": item}} for item in items]
            for attempt in range(3):
                self.stats.requests += 1
                response = dynamodb.batch_write_item(RequestItems={self.table: requests})
                requests = response.get("UnprocessedItems", {}).get(self.table, [])
                if not requests:
                    break
                time.sleep(0.05 * 2**attempt)
            self.stats.items += len(items) - len(requests)
            unwritten = {r["PutRequest"]["Item"]["message_id"]["S"] for r in requests}
            lost = sum(1 for r in batch if r.message_id in unwritten)
            self.stats.written += len(batch) - lost
            self.stats.failed += lost
        except (ClientError, BotoCoreError, ChannelNotFound) as error:
            self.stats.failed += len(batch)
            logger.warning("status store: %d record(s) not written: %s", len(batch), error)

    def close(self, timeout: float | None = None) -> None:
        """Stop the background writer after it wrote what is buffered, waiting at most `timeout`
        seconds (None: until it is done; a consumer passes what its shutdown cap leaves). What
        is still unwritten then is logged (the writer keeps counting it while the process
        lives). Also run at interpreter exit for a store that recorded anything."""
        atexit.unregister(self.close)
        self._closed.set()
        self._wake.set()
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            self.flush()
            return
        thread.join(timeout=None if timeout is None else max(0.0, timeout))
        if thread.is_alive():
            with self._lock:
                left = self._buffered + self._writing
            logger.warning("status store: the final flush did not end within %.1f s; %d "
                           "record(s) not written yet", timeout, left)

    # -- reading --------------------------------------------------------------------------
    def timeline(self, message_id: str) -> list[StatusRecord]:
        """Every record of a message, oldest first (its final outcome's item, on a channel that
        keeps results, is not a record: `messenger.jobs.results` reads it)."""
        dynamodb = self.clients.client("dynamodb")
        paginator = dynamodb.get_paginator("query")
        records: list[StatusRecord] = []
        try:
            for page in paginator.paginate(
                TableName=self.table,
                KeyConditionExpression="message_id = :id",
                ExpressionAttributeValues={":id": {"S": message_id}},
            ):
                for item in page.get("Items", []):
                    if not is_final_item(item):  # the outcome's (`jobs.results`): no record
                        records.extend(records_of_item(item))
        except ClientError as error:
            if error_code(error) != "ResourceNotFoundException":
                raise
            raise ChannelNotFound(
                f"status table {self.table!r} does not exist: no channel in namespace "
                f"{self.settings.namespace or '(none)'!r} has track_status on"
            ) from None
        # Oldest first; records stamped in the same instant in lifecycle order.
        order = {event: position for position, event in enumerate(StatusEvent)}
        return sorted(records, key=lambda r: (r.at, order[r.event]))

    def exists(self) -> bool:
        return table_exists(self.clients, self.table)


# -- whether a channel's progress is recorded ------------------------------------------------
#: Events only a consumer that tracks status records: a timeline with one was tracked.
CONSUMER_EVENTS = frozenset({
    StatusEvent.RECEIVED, StatusEvent.STARTED, StatusEvent.COMPLETED, StatusEvent.FAILED,
    StatusEvent.RETRIED, StatusEvent.TIMED_OUT, StatusEvent.DEAD_LETTERED,
})
#: Events after which a job's state does not change by itself (it ran, or will never run).
FINAL_EVENTS = frozenset({StatusEvent.COMPLETED, StatusEvent.DELETED, StatusEvent.CANCELLED})
#: Events that say a consumer holds the job now (received, its handler running): a job whose
#: last record is one of them is running, and an operator may cancel it (`running_channel`).
RUNNING_EVENTS = frozenset({StatusEvent.RECEIVED, StatusEvent.STARTED})
#: Seconds a process trusts a channel's declaration it read (`TrackingDeclarations`).
DECLARATION_TTL_SECONDS = 60.0


def running_channel(records: list[StatusRecord]) -> str:
    """The channel a job runs on when its timeline (time order) ends with one of
    RUNNING_EVENTS, else '' (never ran, or it ended, failed, waits for a retry or was
    dead-lettered). The dashboard offers its Cancel button by this."""
    last = records[-1] if records else None
    return last.channel if last is not None and last.event in RUNNING_EVENTS else ""


def queue_tracking(sqs: Any, queue_url: str,
                   declared: Callable[[Mapping[str, str]], bool | None] = declared_track_status
                   ) -> bool | None:
    """The `track_status` a queue declares for its channel (its TAG_TRACK_STATUS tag): True,
    False, or None when it carries none or its tags cannot be read (sqs:ListQueueTags not
    allowed, the queue gone): a status store failure is never a reason to fail. declared: the
    declaration read from the tags (`channel.declared_keep_results`: its `keep_results`)."""
    try:
        tags = sqs.list_queue_tags(QueueUrl=queue_url).get("Tags") or {}
    except (ClientError, BotoCoreError) as error:
        logger.info("declarations of %s not readable: %s", queue_url, error)
        return None
    return declared(tags)


class TrackingDeclarations:
    """Reads whether channels are tracked from the channels themselves: the TAG_TRACK_STATUS
    tag their queues carry, written from `ChannelSpec.track_status` by whoever made them (the CDK
    constructs, a consumer's provisioning in auto mode). Each queue's answer is kept `ttl`
    seconds. Used by the HTTP API's status route; any reader of job status may use it. With
    `declared=declared_keep_results` it reads whether channels keep results (TAG_KEEP_RESULTS)
    the same way (`Producer.result`)."""

    def __init__(self, clients: ClientFactory, settings: Settings,
                 ttl: float = DECLARATION_TTL_SECONDS,
                 declared: Callable[[Mapping[str, str]], bool | None] = declared_track_status
                 ) -> None:
        self.clients = clients
        self.settings = settings
        self.ttl = ttl
        #: Reads the declaration from a queue's tags (`declared_keep_results`: keep_results).
        self.declared = declared
        self._known: dict[str, tuple[float, bool | None]] = {}
        self._lock = threading.Lock()

    def of_queue(self, name: str) -> bool | None:
        """The declaration of the queue called `name` (None: missing, untagged, unreadable)."""
        now = time.monotonic()
        with self._lock:
            known = self._known.get(name)
        if known is not None and now - known[0] < self.ttl:
            return known[1]
        sqs = self.clients.client("sqs")
        try:
            url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        except (ClientError, BotoCoreError) as error:
            logger.info("track_status of queue %s not readable: %s", name, error)
            declared = None
        else:
            declared = queue_tracking(sqs, str(url), self.declared)
        with self._lock:
            self._known[name] = (now, declared)
        return declared

    def of_channel(self, spec: ChannelSpec) -> bool | None:
        """A channel's declaration: its queue's (a prioritized channel: True when every level's
        queue says True, False when every one says False, else None)."""
        answers = {self.of_queue(level.queue_name) for level in spec.level_specs()}
        return answers.pop() if len(answers) == 1 else None

    def of_exchange(self, exchange: str, ordered: bool = False) -> dict[str, bool | None]:
        """The declaration of each queue subscribed to an exchange's topic, by queue name ({}
        when the topic is missing or its subscriptions cannot be read)."""
        from messenger.provision import Provisioner  # not at import: EMR loads this module

        provisioner = Provisioner(self.clients, self.settings)
        try:
            arn = provisioner.find_topic(topic_name_for(exchange, self.settings.namespace,
                                                        ordered))
            if arn is None:
                return {}
            paginator = self.clients.client("sns").get_paginator("list_subscriptions_by_topic")
            queues = [str(subscription["Endpoint"]).rsplit(":", 1)[-1]
                      for page in paginator.paginate(TopicArn=arn)
                      for subscription in page.get("Subscriptions", [])
                      if subscription.get("Protocol") == "sqs"]
        except (ClientError, BotoCoreError) as error:
            logger.info("subscriptions of exchange %s not readable: %s", exchange, error)
            return {}
        return {queue: self.of_queue(queue) for queue in queues}


def progress_answer(records: list[StatusRecord], declared: bool | None,
                    channel: str) -> dict[str, Any]:
    """What a status answer says of its last record: `tracked` (the channel's declaration;
    when it declares nothing, True if a tracking consumer recorded this job, else None),
    `current` (whether the last record is the job's state now: the channel records progress,
    or the job reached a final state) and, when it is not current, `note`, one line saying why.
    A job on a channel whose consumers do not record progress shows its last known record
    (QUEUED, say) marked as such, never as its current state."""
    last = records[-1]
    tracked = declared
    if tracked is None and any(r.event in CONSUMER_EVENTS for r in records):
        tracked = True
    current = tracked is True or last.event in FINAL_EVENTS
    answer: dict[str, Any] = {"tracked": tracked, "current": current}
    if current:
        return answer
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(last.at))
    if tracked is False:
        why = (f"progress not recorded: channel {channel!r} does not track status (its "
               f"ChannelSpec has track_status=False: its consumers record nothing)")
    else:
        why = (f"progress may not be recorded: channel {channel!r} does not declare whether "
               f"it tracks status (its queue has no {TAG_TRACK_STATUS} tag, or it cannot be "
               f"read)")
    answer["note"] = (f"{why}; {last.event.value} at {stamp} is the last recorded state, not "
                      f"necessarily the job's current one")
    return answer


def render_timeline(message_id: str, records: list[StatusRecord],
                    progress: dict[str, Any] | None = None) -> str:
    """The text `messenger status <id>` prints; `progress` (`describe_progress`): a last
    record that is not the job's current state is followed by a note saying so."""
    if not records:
        return f"no status records for message {message_id}"
    lines = [f"message {message_id}"]
    start = records[0].at
    queued = 0
    for r in records:
        millis = int(r.at % 1 * 1000)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.at)) + f".{millis:03d}Z"
        extra = []
        if r.consumer_id:
            extra.append(f"consumer={r.consumer_id}")
        if r.receive_count:
            extra.append(f"receive={r.receive_count}")
        if r.duration is not None:
            extra.append(f"duration={r.duration:.3f}s")
        if r.actor:
            extra.append(f"by={r.actor}")
        if r.due_at is not None:
            extra.append("due=" + time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(r.due_at)))
        if r.error_class:
            extra.append(f"error={r.error_class}: {r.error}")
        elif r.error:  # DEAD_LETTERED: why
            extra.append(f"reason={r.error}")
        if r.event is StatusEvent.QUEUED:
            queued += 1
            if queued > 1:
                # Same id pushed again: on an ordered channel (id derived from the content or the
                # caller's key) within 5 minutes SQS drops it as a duplicate.
                extra.append("pushed again under the same id (duplicate)")
        lines.append(
            f"  {stamp} +{r.at - start:8.3f}s  {r.event.value:<13} {r.channel}  {' '.join(extra)}"
        )
    last_trace = next((r.traceback for r in reversed(records) if r.traceback), "")
    if last_trace:
        lines.append("last failure's traceback:")
        lines.extend(f"    {line}" for line in last_trace.rstrip("\n").splitlines())
    if progress and progress.get("note"):
        lines.append(f"note: {progress['note']}")
    return "\n".join(lines)
