"""A channel's history from CloudWatch: messages in and out, failed attempts, dead letters and
the age of the oldest message, over the last hour, day or week.

    history = channel_history(clients, settings, 'orders', 'day')
    history.series['in'].points        # [(epoch seconds, messages), ...] oldest first

SQS publishes per queue, per minute (`AWS/SQS`, the local endpoint too:
`messenger.tools.moto_metrics`). A channel's series add up its queues (every priority level's),
the age is the oldest of them. One GetMetricData call per 500 series (a channel of 3 levels
reads 18 series), after one GetQueueUrl and GetQueueAttributes per queue (its DLQ, from its
redrive policy). A bucket without datapoints is missing, not zero: CloudWatch has nothing for
it (no traffic on an idle queue, or a queue older metrics do not know).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from messenger.aws import ClientFactory
from messenger.errors import InvalidSettings
from messenger.operations.queues import channel_queues, dead_letter_queue
from messenger.ops.metrics import MAX_QUERIES_PER_CALL, MetricRequest, sqs_metric
from messenger.settings import Settings

#: Window name -> (length, seconds per datapoint): at most 168 points per chart.
WINDOWS: dict[str, tuple[timedelta, int]] = {
    "hour": (timedelta(hours=1), 60),
    "day": (timedelta(days=1), 900),
    "week": (timedelta(days=7), 3600),
}


@dataclass(frozen=True)
class SeriesSpec:
    """One chart: which SQS metric, on the queues or their DLQs, and how queues combine."""

    key: str
    title: str
    unit: str
    metric: str
    stat: str
    on_dlq: bool = False
    combine: Callable[[list[float]], float] = sum


#: What a channel's history shows, in order.
SERIES = (
    SeriesSpec("in", "messages in", "messages", "NumberOfMessagesSent", "Sum"),
    SeriesSpec("out", "messages out (done)", "messages", "NumberOfMessagesDeleted", "Sum"),
    SeriesSpec("received", "receives (attempts, retries included)", "receives",
               "NumberOfMessagesReceived", "Sum"),
    SeriesSpec("dead_lettered", "dead-lettered", "messages", "NumberOfMessagesSent", "Sum",
               on_dlq=True),
    SeriesSpec("dlq_depth", "dead letters waiting", "messages",
               "ApproximateNumberOfMessagesVisible", "Maximum", on_dlq=True, combine=sum),
    SeriesSpec("oldest_age", "age of the oldest message", "seconds",
               "ApproximateAgeOfOldestMessage", "Maximum", combine=max),
)


@dataclass
class Series:
    spec: SeriesSpec
    #: (epoch seconds, value), oldest first; a bucket CloudWatch has nothing for is absent.
    points: list[tuple[float, float]] = field(default_factory=list)

    @property
    def total(self) -> float | None:
        return sum(v for _, v in self.points) if self.points else None

    @property
    def peak(self) -> float | None:
        return max(v for _, v in self.points) if self.points else None


@dataclass
class ChannelHistory:
    channel: str
    window: str
    start: float
    end: float
    period: int
    queues: list[str]
    series: dict[str, Series]
    requests: int = 0


def channel_history(clients: ClientFactory, settings: Settings, channel: str,
                    window: str = "hour", now: datetime | None = None) -> ChannelHistory:
    """The channel's series over `window` ('hour', 'day' or 'week'); ChannelNotFound when the
    namespace has no such channel."""
    if window not in WINDOWS:
        raise InvalidSettings(f"window is one of {', '.join(WINDOWS)}, got {window!r}")
    length, period = WINDOWS[window]
    queues = channel_queues(clients, settings, channel)
    dlqs = _dead_letter_queues(clients, [q.queue for q in queues])
    end = (now or datetime.now(UTC)).replace(second=0, microsecond=0) + timedelta(minutes=1)
    start = end - length
    requests: list[tuple[SeriesSpec, MetricRequest]] = []
    for spec in SERIES:
        for queue in queues:
            name = dlqs[queue.queue] if spec.on_dlq else queue.queue
            if name:
                requests.append((spec, sqs_metric(name, spec.metric, spec.stat)))
    by_key: dict[str, dict[float, list[float]]] = {spec.key: {} for spec in SERIES}
    cloudwatch = clients.client("cloudwatch")
    calls = 0
    for offset in range(0, len(requests), MAX_QUERIES_PER_CALL):
        chunk = requests[offset: offset + MAX_QUERIES_PER_CALL]
        queries = [r.query(f"m{offset + i}", period) for i, (_, r) in enumerate(chunk)]
        token = ""
        while True:
            kwargs: dict[str, Any] = {"MetricDataQueries": queries, "StartTime": start,
                                      "EndTime": end, "ScanBy": "TimestampAscending"}
            if token:
                kwargs["NextToken"] = token
            response = cloudwatch.get_metric_data(**kwargs)
            calls += 1
            for result in response.get("MetricDataResults", []):
                spec = requests[int(result["Id"][1:])][0]
                buckets = by_key[spec.key]
                for stamp, value in zip(result.get("Timestamps", []), result.get("Values", []),
                                        strict=False):
                    buckets.setdefault(stamp.timestamp(), []).append(float(value))
            token = response.get("NextToken") or ""
            if not token:
                break
    series = {spec.key: Series(spec, sorted((at, spec.combine(values))
                                            for at, values in by_key[spec.key].items()))
              for spec in SERIES}
    return ChannelHistory(channel, window, start.timestamp(), end.timestamp(), period,
                          [q.queue for q in queues], series, calls)


def _dead_letter_queues(clients: ClientFactory, queues: list[str]) -> dict[str, str | None]:
    """Each queue's DLQ, as its redrive policy names it (None: it has none)."""
    sqs = clients.client("sqs")
    found: dict[str, str | None] = {}
    for name in queues:
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])
        found[name] = dead_letter_queue(attributes.get("Attributes", {}))
    return found
