"""The queue snapshot behind `messenger top` and the dashboard's overview, and the requeue of a
whole channel's DLQs.

    rows = snapshot(clients, settings)                 # every queue of the namespace
    rows = channel_dlq_rows(clients, settings, 'jobs') # the rows of 'jobs' that have a DLQ
    reports = requeue_rows(clients, settings, rows)    # each DLQ back to its own queue

Per queue: visible, in flight, delayed, DLQ depth (from queue attributes), age of the oldest
message, messages/min in and out, consumer processes registered and alive (the worker registry),
and whether consumers received in the last `WINDOW_MINUTES` minutes (from CloudWatch; None when
CloudWatch has no datapoint). A row's channel and level come from the queue's tags
(`messenger.operations.queues`), so a worker counts on its own channel's rows only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from messenger.aws import ClientFactory
from messenger.channel import FIFO_SUFFIX
from messenger.errors import ChannelNotFound
from messenger.jobs.workers import list_workers
from messenger.operations.queues import (
    ChannelQueue,
    channel_queues,
    dead_letter_queue,
    platform_queues,
)
from messenger.operations.requeue import Requeuer, RequeueReport, SubscriberTypes
from messenger.ops.metrics import fetch_series, latest, sqs_metric, total
from messenger.settings import Settings

#: Window of the rate and consumer columns.
WINDOW_MINUTES = 5


@dataclass(frozen=True)
class ChannelRow:
    """One queue of the snapshot.

    channel: the channel as its users name it (a prioritized channel's name on each level's
    row); level: the priority level (None without priorities); queue_channel: the name of the
    queue's own spec ('jobs-high'), where a requeue of its DLQ goes; queue: the physical name.
    """

    channel: str
    queue: str
    visible: int
    in_flight: int
    delayed: int
    dlq: str | None
    dlq_depth: int | None
    oldest_age_seconds: float | None
    in_per_minute: float | None
    out_per_minute: float | None
    consumers_active: bool | None
    critical: bool
    #: Consumer processes registered for the channel and not lost (`messenger workers`).
    workers: int = 0
    level: str | None = None
    queue_channel: str = ""
    #: "paused by <who> at <time>" while an operator paused the channel's consumers, else "".
    paused: str = ""


def snapshot(clients: ClientFactory, settings: Settings,
             channel: str | None = None) -> list[ChannelRow]:
    """The rows of every queue of the namespace (or of `channel`'s queues only), critical
    first, then the deepest backlog: one tag query, one GetQueueAttributes per queue and DLQ,
    one GetMetricData, one Scan of the worker registry."""
    queues = (platform_queues(clients, settings) if channel is None
              else channel_queues(clients, settings, channel))
    now = time.time()
    alive = [w.channel for w in list_workers(clients, settings) if not w.lost(now)]
    sqs = clients.client("sqs")
    end = datetime.now(UTC)
    start = end - timedelta(minutes=WINDOW_MINUTES)
    requests = []
    for queue in queues:
        requests += [
            sqs_metric(queue.queue, "ApproximateAgeOfOldestMessage", "Maximum"),
            sqs_metric(queue.queue, "NumberOfMessagesSent", "Sum"),
            sqs_metric(queue.queue, "NumberOfMessagesDeleted", "Sum"),
            sqs_metric(queue.queue, "NumberOfMessagesReceived", "Sum"),
            sqs_metric(queue.queue, "NumberOfEmptyReceives", "Sum"),
        ]
    series = fetch_series(clients.client("cloudwatch"), requests, start, end, 60) if queues else []
    rows = [_row(sqs, queue, series[i * 5 : i * 5 + 5], alive) for i, queue in enumerate(queues)]
    return sorted(rows, key=lambda r: (not r.critical, -(r.dlq_depth or 0) - r.visible, r.queue))


def _row(sqs: Any, queue: ChannelQueue, series: list[Any], alive: list[str]) -> ChannelRow:
    age, sent, deleted, received, empty = series
    attributes = _attributes(sqs, queue.queue)
    # The queue names its DLQ in its redrive policy (priority levels included).
    dlq_name = dead_letter_queue(attributes)
    dlq_depth = _attributes(sqs, dlq_name).get("ApproximateNumberOfMessages") if dlq_name else None
    receives = [v for v in (total(received), total(empty)) if v is not None]
    return ChannelRow(
        channel=queue.channel,
        queue=queue.queue,
        visible=int(attributes.get("ApproximateNumberOfMessages", 0)),
        in_flight=int(attributes.get("ApproximateNumberOfMessagesNotVisible", 0)),
        delayed=int(attributes.get("ApproximateNumberOfMessagesDelayed", 0)),
        dlq=dlq_name,
        dlq_depth=None if dlq_depth is None else int(dlq_depth),
        oldest_age_seconds=latest(age),
        in_per_minute=_rate(total(sent)),
        out_per_minute=_rate(total(deleted)),
        consumers_active=(sum(receives) > 0) if receives else None,
        critical=queue.critical,
        # A prioritized channel's consumer registers under the channel's name and consumes
        # every level's queue.
        workers=alive.count(queue.channel),
        level=queue.level,
        queue_channel=queue.queue_channel,
        paused=str(queue.paused) if queue.paused else "",
    )


def _attributes(sqs: Any, name: str) -> dict[str, str]:
    try:
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        return dict(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"])
    except sqs.exceptions.QueueDoesNotExist:
        return {}


def _rate(count: float | None) -> float | None:
    return None if count is None else round(count / WINDOW_MINUTES, 1)


def channel_dlq_rows(clients: ClientFactory, settings: Settings, channel: str) -> list[ChannelRow]:
    """The rows of `channel` that have a DLQ (every level's for a prioritized channel's name;
    `channel_queues` says what a name selects); ChannelNotFound when there is none."""
    try:
        rows = [r for r in snapshot(clients, settings, channel) if r.dlq is not None]
    except ChannelNotFound:
        rows = []
    if not rows:
        raise ChannelNotFound(f"no channel {channel!r} with a DLQ in namespace "
                              f"{settings.namespace or '(none)'!r}")
    return rows


def requeue_rows(clients: ClientFactory, settings: Settings,
                 rows: list[ChannelRow], actor: str = "") -> list[RequeueReport]:
    """Move each row's DLQ back to its own queue (delete only after the queue accepted a
    message); one report per DLQ, as it really happened. actor: who asked (recorded on each
    REQUEUED status record)."""
    reports = []
    for row in rows:
        assert row.dlq is not None
        reports.append(Requeuer(
            source_queue=row.dlq,
            destination_channel=row.queue_channel or row.channel,
            destination_type=SubscriberTypes.SingleConsumer,
            ordered=row.queue.endswith(FIFO_SUFFIX),
            settings=settings,
            clients=clients,
            actor=actor,
        ).start())
    return reports
