"""A producer's pushes with `at=` / `delay=`: sent now, with SQS's DelaySeconds, or scheduled.

`messenger.jobs.schedules.plan_delivery` decides which; this module sends the prepared message
accordingly. A schedule's target input is the message's own SendMessage (Publish) request, so
what fires is what the push would have sent: body or offload pointer, every attribute, the FIFO
group and deduplication id, the priority level's queue; its meta headers gain one,
`SCHEDULED_HEADER` (the due time), by which the consumer knows a firing (`messenger.jobs.fired`).
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

from messenger.aws import ClientFactory
from messenger.channel import SQS_MAX_RETENTION_SECONDS
from messenger.errors import InvalidMessage, PayloadTooLarge
from messenger.jobs.schedule_store import ScheduleStore
from messenger.jobs.schedules import SCHEDULED_HEADER, Delivery, target_input
from messenger.jobs.status import StatusEvent, StatusRecord, StatusStore
from messenger.message import EncodedMessage
from messenger.offload import (
    EXTENDED_SIZE_ATTRIBUTE,
    LIFECYCLE_HOPS,
    lifecycle_days,
)
from messenger.produce.push import PreparedItem
from messenger.produce.transport import QueueTarget, TopicTarget
from messenger.provision import Provisioner
from messenger.settings import Settings
from messenger.tracing import with_headers

#: The largest input Scheduler takes for a target (its quota: 256 KB); a larger message must
#: be offloaded (a lower `offload_threshold`).
SCHEDULER_MAX_INPUT_BYTES = 262_144


def offload_deadline(put_at: datetime) -> datetime:
    """The latest due time of a job whose body was offloaded at `put_at`: the bucket's lifecycle
    expires the object `lifecycle_days` later, and the message must still find it through a
    queue's and a DLQ's full retention after it fires."""
    expires = put_at + timedelta(days=lifecycle_days(SQS_MAX_RETENTION_SECONDS))
    return expires - timedelta(seconds=LIFECYCLE_HOPS * SQS_MAX_RETENTION_SECONDS)


def check_offload_horizon(encoded: EncodedMessage, due: datetime, now: datetime) -> None:
    """InvalidMessage naming both dates when an offloaded body would expire before the job,
    once due, has lived out its queue's and DLQ's retention."""
    if EXTENDED_SIZE_ATTRIBUTE not in encoded.attributes:
        return
    latest = offload_deadline(now)
    if due > latest:
        expires = now + timedelta(days=lifecycle_days(SQS_MAX_RETENTION_SECONDS))
        raise InvalidMessage(
            f"the job is due {due:%Y-%m-%d %H:%M:%S} UTC, but its body is offloaded to S3 and "
            f"expires {expires:%Y-%m-%d} (the bucket's lifecycle), which must leave a queue's "
            f"and a DLQ's 14-day retention after it fires: an offloaded job may be due by "
            f"{latest:%Y-%m-%d %H:%M:%S} UTC at the latest; push it nearer the time, or make "
            f"the body smaller than the offload threshold"
        )


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
        self._lock = threading.Lock()

    @property
    def store(self) -> ScheduleStore:
        with self._lock:
            if self._store is None:
                self._store = ScheduleStore(self.clients, self.settings, self.provisioner)
            return self._store

    def send(self, target: QueueTarget | TopicTarget, prepared: PreparedItem,
             when: Delivery | None) -> str:
        """Send now (`when` None), with DelaySeconds, or as a one-time schedule; returns the
        SQS/SNS message id, or the schedule's ARN."""
        if when is None:
            return target.send(prepared.outgoing)
        if when.delay_seconds is not None:
            assert isinstance(target, QueueTarget)  # planned only for standard queues
            return target.send(prepared.outgoing, delay_seconds=when.delay_seconds)
        now = datetime.now(timezone.utc)
        outgoing = prepared.outgoing
        check_offload_horizon(outgoing.encoded, when.due, now)
        if isinstance(target, QueueTarget):
            kind, destination = "sqs", target.url
        else:
            kind, destination = "sns", target.arn
        # Marked as fired by the scheduler: its consumer claims the job once (a retried firing
        # is one job, `messenger.jobs.fired`).
        encoded = with_headers(outgoing.encoded, {
            SCHEDULED_HEADER: when.due.strftime("%Y-%m-%dT%H:%M:%SZ")})
        request = target_input(kind, destination, encoded.body, encoded.attributes,
                               outgoing.group_id, outgoing.dedup_id)
        size = len(request.encode("utf-8"))
        if size > SCHEDULER_MAX_INPUT_BYTES:
            raise PayloadTooLarge(
                f"a scheduled message's request is {size} bytes; Scheduler takes at most "
                f"{SCHEDULER_MAX_INPUT_BYTES}: lower the producer's offload_threshold so the "
                f"body goes to S3")
        arn = self.store.create(self.channel, prepared.message_id, when.due, kind, request)
        if self.status is not None:
            self.status.record(StatusRecord(prepared.message_id, StatusEvent.SCHEDULED,
                                            self.channel, at=now.timestamp(),
                                            due_at=when.due.timestamp()))
        return arn
