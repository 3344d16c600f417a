"""A producer's pushes with `at=` / `delay=`: sent now, with SQS's DelaySeconds, or scheduled.

`messenger.jobs.schedules.plan_delivery` decides which; this module sends the prepared message
accordingly. A schedule's target input is the message's own SendMessage (Publish) request, so
what fires is what the push would have sent: body or offload pointer, every attribute, the FIFO
group and deduplication id, the priority level's queue; its meta headers gain one,
`SCHEDULED_HEADER` (the due time), by which the consumer knows a firing (`messenger.jobs.fired`).

Whether a scheduled body goes to S3 is decided on the schedule's input as Scheduler gets it
(`needs_offload`: the body escaped once more inside the request), and an offloaded job's due
time is checked before its body is uploaded (`check_offload_due`). A tracked job's SCHEDULED
record is written (one PutItem) before its CreateSchedule, and removed when the schedule is not
made (refused, or the job id was scheduled already): the timeline never gains a SCHEDULED after
the job fired, and never one for a schedule that does not exist.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from messenger.aws import ClientFactory
from messenger.channel import SQS_MAX_RETENTION_SECONDS
from messenger.errors import InvalidMessage, PayloadTooLarge
from messenger.jobs.schedule_store import Scheduled, ScheduleStore
from messenger.jobs.schedules import SCHEDULED_HEADER, Delivery, target_input
from messenger.jobs.status import StatusEvent, StatusRecord, StatusStore
from messenger.message import EncodedMessage
from messenger.offload import (
    EXTENDED_SIZE_ATTRIBUTE,
    LIFECYCLE_HOPS,
    lifecycle_days,
)
from messenger.produce.push import PreparedItem
from messenger.produce.transport import OutgoingMessage, QueueTarget, TopicTarget
from messenger.provision import Provisioner
from messenger.settings import Settings
from messenger.tracing import with_headers

logger = logging.getLogger("messenger.producer")

#: The largest input Scheduler takes for a target (its quota: 256 KB; CreateSchedule's
#: `Target.Input` has a minimum of 1 and no maximum in the API's model): a scheduled message
#: whose request would be larger has its body offloaded (`needs_offload`).
SCHEDULER_MAX_INPUT_BYTES = 262_144
#: What a schedule's input holds beside the message (`needs_offload` measures it without the
#: destination, not known yet): the queue URL or topic ARN (an SNS topic name is at most 256
#: characters; a queue URL well under it), with room to spare.
DESTINATION_ALLOWANCE_BYTES = 1024


def offload_deadline(put_at: datetime) -> datetime:
    """The latest due time of a job whose body was offloaded at `put_at`: the bucket's lifecycle
    expires the object `lifecycle_days` later, and the message must still find it through a
    queue's and a DLQ's full retention after it fires."""
    expires = put_at + timedelta(days=lifecycle_days(SQS_MAX_RETENTION_SECONDS))
    return expires - timedelta(seconds=LIFECYCLE_HOPS * SQS_MAX_RETENTION_SECONDS)


def check_offload_horizon(encoded: EncodedMessage, due: datetime, now: datetime) -> None:
    """InvalidMessage naming both dates when an offloaded body would expire before the job,
    once due, has lived out its queue's and DLQ's retention."""
    if EXTENDED_SIZE_ATTRIBUTE in encoded.attributes:
        check_offload_due(due, now)


def check_offload_due(due: datetime, now: datetime) -> None:
    """`check_offload_horizon` for a body about to be offloaded at `now`: called before it is
    uploaded, so a refused push leaves no object behind."""
    latest = offload_deadline(now)
    if due > latest:
        expires = now + timedelta(days=lifecycle_days(SQS_MAX_RETENTION_SECONDS))
        raise InvalidMessage(
            f"the job is due {due:%Y-%m-%d %H:%M:%S} UTC, but its body is offloaded to S3 and "
            f"expires {expires:%Y-%m-%d} (the bucket's lifecycle), which must leave a queue's "
            f"and a DLQ's 14-day retention after it fires: an offloaded job may be due by "
            f"{latest:%Y-%m-%d %H:%M:%S} UTC at the latest; push it nearer the time, or make "
            f"the body smaller than the offload threshold and its schedule's input (the body "
            f"escaped again) at most {SCHEDULER_MAX_INPUT_BYTES} bytes"
        )


def scheduled_encoding(encoded: EncodedMessage, due: datetime) -> EncodedMessage:
    """The message a schedule sends: marked as fired by the scheduler (its consumer claims the
    job once: a retried firing is one job, `messenger.jobs.fired`)."""
    return with_headers(encoded, {SCHEDULED_HEADER: due.strftime("%Y-%m-%dT%H:%M:%SZ")})


def scheduled_request(kind: str, destination: str, outgoing: OutgoingMessage,
                      due: datetime) -> str:
    """The schedule's input: the message's SendMessage (kind 'sqs') or Publish ('sns') request."""
    encoded = scheduled_encoding(outgoing.encoded, due)
    return target_input(kind, destination, encoded.body, encoded.attributes,
                        outgoing.group_id, outgoing.dedup_id)


def needs_offload(kind: str, outgoing: OutgoingMessage, due: datetime) -> bool:
    """Whether a message scheduled at `due` must have its body offloaded: its schedule's input
    (the body escaped again inside the request's JSON, the attributes, any destination) would
    exceed Scheduler's `SCHEDULER_MAX_INPUT_BYTES`. A body of 70,000 '"' is 140 KB once encoded
    and 280 KB inside the request."""
    request = scheduled_request(kind, "", outgoing, due)
    return len(request.encode("utf-8")) + DESTINATION_ALLOWANCE_BYTES > SCHEDULER_MAX_INPUT_BYTES


@dataclass(frozen=True)
class Sent:
    """What `ScheduledSends.send` did: the SQS/SNS message id or the schedule's ARN (`sent_id`);
    for a schedule whose job id was scheduled already, `duplicate` and the waiting job's due
    time (`due`; None when it fired or was cancelled in between)."""

    sent_id: str
    duplicate: bool = False
    due: datetime | None = None


class ScheduledSends:
    """Sends a producer's planned pushes; the schedule store is made at the first schedule."""

    def __init__(self, channel: str, clients: ClientFactory, settings: Settings,
                 provisioner: Provisioner, status: StatusStore | None) -> None:
        self.channel = channel
        self.clients = clients
        self.settings = settings
        self.provisioner = provisioner
        self.status = status
        self._store: ScheduleStore | None = None
        self._status_table = False
        self._lock = threading.Lock()

    @property
    def store(self) -> ScheduleStore:
        with self._lock:
            if self._store is None:
                self._store = ScheduleStore(self.clients, self.settings, self.provisioner)
            return self._store

    def send(self, target: QueueTarget | TopicTarget, prepared: PreparedItem,
             when: Delivery | None, push: str = "") -> Sent:
        """Send now (`when` None), with DelaySeconds, or as a one-time schedule (push: a token
        of this push, the same on its retries: `ScheduleStore.schedule`)."""
        if when is None:
            return Sent(target.send(prepared.outgoing))
        if when.delay_seconds is not None:
            assert isinstance(target, QueueTarget)  # planned only for standard queues
            return Sent(target.send(prepared.outgoing, delay_seconds=when.delay_seconds))
        now = datetime.now(timezone.utc)
        outgoing = prepared.outgoing
        check_offload_horizon(outgoing.encoded, when.due, now)
        if isinstance(target, QueueTarget):
            kind, destination = "sqs", target.url
        else:
            kind, destination = "sns", target.arn
        request = scheduled_request(kind, destination, outgoing, when.due)
        size = len(request.encode("utf-8"))
        if size > SCHEDULER_MAX_INPUT_BYTES:
            raise PayloadTooLarge(
                f"a scheduled message's request is {size} bytes; Scheduler takes at most "
                f"{SCHEDULER_MAX_INPUT_BYTES}, and its body is offloaded already: its "
                f"attributes and headers are too large")
        record = StatusRecord(prepared.message_id, StatusEvent.SCHEDULED, self.channel,
                              at=now.timestamp(), due_at=when.due.timestamp())
        written = self._write_now(record)  # before the schedule exists: never after it fired
        try:
            scheduled: Scheduled = self.store.schedule(
                self.channel, prepared.message_id, when.due, kind, request, push)
        except BaseException:
            if written:
                self._unwrite(record)  # no schedule: no SCHEDULED
            raise
        if scheduled.created:
            return Sent(scheduled.arn)
        if written:
            self._unwrite(record)
        existing = scheduled.existing
        due = existing.due if existing is not None else None
        if self.status is not None:
            self.status.record(StatusRecord(prepared.message_id, StatusEvent.DUPLICATE,
                                            self.channel))
        return Sent(scheduled.arn, duplicate=True, due=due)

    # -- the SCHEDULED record, written at once ------------------------------------------------
    def _status_item_key(self, record: StatusRecord) -> dict[str, Any]:
        return {"message_id": {"S": record.message_id}, "sk": {"S": record.sort_key}}

    def _write_now(self, record: StatusRecord) -> bool:
        """Write `record` with one PutItem now (not through the buffered writer, which might
        write it after the job fired); False when there is no status or it failed (logged:
        status is never a reason to fail a push, and a record that failed now is not written
        later)."""
        status = self.status
        if status is None:
            return False
        try:
            if not self._status_table:
                status.ensure_table()
                self._status_table = True
            self.clients.client("dynamodb").put_item(
                TableName=status.table, Item=record.item(status.retention_seconds))
            return True
        except Exception as error:  # noqa: BLE001 - status never fails a push
            status.stats.failed += 1
            logger.warning("status store: SCHEDULED of job %s not written: %s",
                           record.message_id, error)
            return False

    def _unwrite(self, record: StatusRecord) -> None:
        status = self.status
        assert status is not None
        try:
            self.clients.client("dynamodb").delete_item(
                TableName=status.table, Key=self._status_item_key(record))
        except Exception as error:  # noqa: BLE001 - status never fails a push
            logger.warning("status store: SCHEDULED of job %s, not scheduled by this push, "
                           "could not be removed: %s", record.message_id, error)
