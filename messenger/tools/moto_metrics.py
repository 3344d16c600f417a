"""SQS's and SNS's own CloudWatch metrics, published by the local endpoint (moto has none).

On AWS, SQS publishes per queue (namespace `AWS/SQS`, dimension `QueueName`, 1-minute
datapoints) the gauges ApproximateNumberOfMessagesVisible / NotVisible / Delayed and
ApproximateAgeOfOldestMessage and the counters NumberOfMessagesSent / Received / Deleted and
NumberOfEmptyReceives; SNS per topic (`AWS/SNS`, `TopicName`) NumberOfMessagesPublished and
NumberOfNotificationsDelivered. `apply()` makes moto's server do the same, so the queue alarm,
the resource cleaner and `messenger top` see locally what they see on AWS:

- counters are counted as moto serves the calls (a message SNS delivers to a queue counts as
  sent to it, as on AWS) and written as the sum of their minute, stamped with the minute's start;
- gauges are sampled from the queues once a minute, and again before any CloudWatch read
  (GetMetricData, GetMetricStatistics, ListMetrics) when a queue's counts changed since its
  last sample: a client reads what it just did without waiting for the next minute;
- as SQS does, a queue empty and untouched for six hours is no longer reported.

GetMetricData answers each MetricStat query from its own series (stock moto scans every
datapoint in the window once per query and per period: with the datapoints published here,
reading 500 queues' depth took longer than a client's timeout); the answers are stock moto's,
query by query.

A resource someone wrote metrics for by hand (PutMetricData into AWS/SQS or AWS/SNS, which AWS
refuses: tests and benchmarks simulate history that way) is left to them: nothing is published
for it. Relies on moto 5.2.5's `SQSBackend.send_message/receive_message/delete_message`,
`sns.models.Topic.publish`, `Subscription.publish`, `CloudWatchBackend.put_metric_data/
get_metric_data/get_metric_statistics/list_metrics` and the `sqs_backends`/`cloudwatch_backends`
registries; on another moto `apply()` patches nothing and logs why (`--stock-moto` skips it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from messenger.tools.moto_sqs import MOTO_VERSION

SQS, SNS = "AWS/SQS", "AWS/SNS"
QUEUE_GAUGES = (
    "ApproximateNumberOfMessagesVisible",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
)
AGE = "ApproximateAgeOfOldestMessage"
#: SQS stops reporting a queue after this long without messages or calls.
IDLE_SECONDS = 6 * 3600
#: How often the background thread samples every queue (AWS: one datapoint a minute).
PERIOD_SECONDS = 60

log = logging.getLogger(__name__)
_applied = False
_delivering = threading.local()  # the topic whose subscription is delivering right now


def _minute(now: float) -> float:
    """The start of the minute a datapoint of `now` is stamped with. In a minute's first second
    it is the minute before: moto truncates a query's end to the second and excludes it, so a
    datapoint stamped with the minute that starts this second would be missed by a read now."""
    now -= 1.0
    return now - now % 60


class MetricsPublisher:
    """Counts, samples and writes the metrics of every account and region moto serves."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        #: (account, region, namespace, dimension value, metric, minute) -> count not yet written
        self._counts: dict[tuple[str, str, str, str, str, float], float] = defaultdict(float)
        #: (account, region, queue) -> last time it was touched (counted call)
        self._touched: dict[tuple[str, str, str], float] = {}
        #: (account, region, queue) -> (minute, counts) of its last gauge sample
        self._sampled: dict[tuple[str, str, str], tuple[float, tuple[int, int, int]]] = {}
        #: (namespace, dimension value) written by hand: never published here
        self.hand_written: set[tuple[str, str]] = set()
        #: (namespace, dimension value) published here at least once
        self.published: set[tuple[str, str]] = set()
        self._stock_put: Any = None

    def count(self, account: str, region: str, namespace: str, name: str, metric: str,
              value: float = 1.0) -> None:
        now = time.time()
        with self._lock:
            self._counts[(account, region, namespace, name, metric, _minute(now))] += value
            if namespace == SQS:
                self._touched[(account, region, name)] = now

    def flush(self, account: str | None = None, region: str | None = None) -> None:
        """Write the counts and gauge samples of one account and region (None: all)."""
        from moto.cloudwatch.models import cloudwatch_backends
        from moto.sqs.models import sqs_backends

        now = time.time()
        with self._lock:
            data: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = defaultdict(
                lambda: defaultdict(list))
            for key in [k for k in self._counts if _matches(k, account, region)]:
                acct, reg, namespace, name, metric, minute = key
                data[(acct, reg)][namespace].append(
                    _datum(metric, namespace, name, self._counts.pop(key), minute, "Count"))
            for acct, regions in list(sqs_backends.items()):
                for reg, backend in list(regions.items()):
                    if _matches((acct, reg), account, region):
                        self._sample(acct, reg, backend, now, data[(acct, reg)])
            for (acct, reg), by_namespace in data.items():
                cloudwatch = cloudwatch_backends[acct][reg]
                for namespace, items in by_namespace.items():
                    items = [d for d in items if (namespace, _name(d)) not in self.hand_written]
                    if items:
                        self.published.update((namespace, _name(d)) for d in items)
                        self._stock_put(cloudwatch, namespace, items)
                        for datum in cloudwatch.metric_data[-len(items):]:
                            setattr(datum, "published_locally", True)  # noqa: B010 (moto's)

    def _sample(self, account: str, region: str, backend: Any, now: float,
                out: dict[str, list[dict[str, Any]]]) -> None:
        """One sample of each queue's gauges for this minute, unless it has one already and
        its counts did not change since."""
        minute = _minute(now)
        for name, queue in list(backend.queues.items()):
            key = (account, region, name)
            if (SQS, name) in self.hand_written:
                continue
            counts = (queue.approximate_number_of_messages,
                      queue.approximate_number_of_messages_not_visible,
                      queue.approximate_number_of_messages_delayed)
            touched = max(self._touched.get(key, 0.0), float(queue.created_timestamp))
            if not any(counts) and now - touched > IDLE_SECONDS:
                continue
            last = self._sampled.get(key)
            if last == (minute, counts):
                continue
            self._sampled[key] = (minute, counts)
            for metric, value in zip(QUEUE_GAUGES, counts, strict=True):
                out[SQS].append(_datum(metric, SQS, name, value, minute, "Count"))
            sent = [m.sent_timestamp for m in queue._messages if m.sent_timestamp]
            age = now - min(sent) / 1000 if sent else 0.0
            out[SQS].append(_datum(AGE, SQS, name, max(age, 0.0), minute, "Seconds"))


def _matches(key: tuple[Any, ...], account: str | None, region: str | None) -> bool:
    return (account is None or key[0] == account) and (region is None or key[1] == region)


def _series(name: str, dimensions: Any) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A series' key as moto matches it: metric name and the set of dimensions."""
    return name, tuple(sorted(dimensions))


def _name(datum: dict[str, Any]) -> str:
    return str(datum["Dimensions"][0]["Value"])


def _datum(metric: str, namespace: str, name: str, value: float, minute: float,
           unit: str) -> dict[str, Any]:
    dimension = "QueueName" if namespace == SQS else "TopicName"
    return {"MetricName": metric, "Dimensions": [{"Name": dimension, "Value": name}],
            "Timestamp": datetime.fromtimestamp(minute, UTC).replace(tzinfo=None),  # as moto keeps
            "Value": float(value),
            "Unit": unit}


PUBLISHER = MetricsPublisher()


def apply(publisher: MetricsPublisher = PUBLISHER) -> bool:
    """Patch moto (in this process) to publish the metrics, and start the minute sampler;
    False (and a log line) on a moto other than the one this was written against."""
    global _applied
    if _applied:
        return True
    import moto

    if moto.__version__ != MOTO_VERSION:
        log.warning("moto %s is not %s: the local endpoint publishes no SQS/SNS metrics",
                    moto.__version__, MOTO_VERSION)
        return False
    from moto.cloudwatch.models import CloudWatchBackend
    from moto.sns import models as sns
    from moto.sqs.models import SQSBackend

    send, receive, delete = (SQSBackend.send_message, SQSBackend.receive_message,
                             SQSBackend.delete_message)
    publisher._stock_put = stock_put = CloudWatchBackend.put_metric_data

    def send_message(self: Any, queue_name: str, *args: Any, **kwargs: Any) -> Any:
        message = send(self, queue_name, *args, **kwargs)
        publisher.count(self.account_id, self.region_name, SQS, queue_name,
                        "NumberOfMessagesSent")
        topic = getattr(_delivering, "topic", None)
        if topic is not None:
            account, region, name = topic
            publisher.count(account, region, SNS, name, "NumberOfNotificationsDelivered")
        return message

    def receive_message(self: Any, queue_name: str, *args: Any, **kwargs: Any) -> Any:
        messages = receive(self, queue_name, *args, **kwargs)
        metric, value = (("NumberOfMessagesReceived", len(messages)) if messages
                         else ("NumberOfEmptyReceives", 1))
        publisher.count(self.account_id, self.region_name, SQS, queue_name, metric, value)
        return messages

    def delete_message(self: Any, queue_name: str, *args: Any, **kwargs: Any) -> None:
        delete(self, queue_name, *args, **kwargs)
        publisher.count(self.account_id, self.region_name, SQS, queue_name,
                        "NumberOfMessagesDeleted")

    topic_publish, subscription_publish = sns.Topic.publish, sns.Subscription.publish

    def publish_topic(self: Any, *args: Any, **kwargs: Any) -> Any:
        publisher.count(self.account_id, self.sns_backend.region_name, SNS, self.name,
                        "NumberOfMessagesPublished")
        return topic_publish(self, *args, **kwargs)

    def publish_subscription(self: Any, *args: Any, **kwargs: Any) -> Any:
        topic = self.topic
        _delivering.topic = (topic.account_id, topic.sns_backend.region_name, topic.name)
        try:
            return subscription_publish(self, *args, **kwargs)
        finally:
            _delivering.topic = None

    def put_metric_data(self: Any, namespace: str, metric_data: list[dict[str, Any]]) -> None:
        names: set[tuple[str, str]] = set()
        if namespace in (SQS, SNS):
            names = {(namespace, d.get("Value")) for item in metric_data
                     for d in item.get("Dimensions") or []
                     if d.get("Name") in ("QueueName", "TopicName")}
        with publisher._lock:  # reads swap `metric_data`: a put waits for them
            published = names & publisher.published - publisher.hand_written
            publisher.hand_written.update(names)
            if published:  # what was published for them already gives way too
                self.metric_data = [
                    d for d in self.metric_data
                    if not (getattr(d, "published_locally", False)
                            and (d.namespace, d.dimensions[0].value) in published)]
            stock_put(self, namespace, metric_data)

    stock_get = CloudWatchBackend.get_metric_data

    def get_metric_data(self: Any, queries: list[dict[str, Any]], *args: Any,
                        **kwargs: Any) -> Any:
        if not all("MetricStat" in q and q["MetricStat"]["Metric"].get("Dimensions")
                   for q in queries):
            return stock_get(self, queries, *args, **kwargs)  # expressions: every series
        with publisher._lock:  # puts wait: `metric_data` is swapped below
            everything = self.metric_data
            by_series: dict[Any, list[Any]] = defaultdict(list)
            for datum in everything:
                by_series[_series(datum.name, ((d.name, d.value) for d in datum.dimensions))
                          ].append(datum)
            results: list[Any] = []
            try:
                for query in queries:
                    metric = query["MetricStat"]["Metric"]
                    self.metric_data = by_series.get(_series(metric["MetricName"], (
                        (d["Name"], d["Value"]) for d in metric["Dimensions"])), [])
                    results += stock_get(self, [query], *args, **kwargs)
            finally:
                self.metric_data = everything
        return results

    def flushing(read: Any) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            publisher.flush(self.account_id, self.region_name)
            return read(self, *args, **kwargs)
        return wrapper

    SQSBackend.send_message = send_message  # type: ignore[method-assign]
    SQSBackend.receive_message = receive_message  # type: ignore[method-assign]
    SQSBackend.delete_message = delete_message  # type: ignore[method-assign]
    sns.Topic.publish = publish_topic  # type: ignore[method-assign]
    sns.Subscription.publish = publish_subscription  # type: ignore[method-assign]
    CloudWatchBackend.put_metric_data = put_metric_data  # type: ignore[method-assign]
    CloudWatchBackend.get_metric_data = get_metric_data  # type: ignore[method-assign]
    for name in ("get_metric_data", "get_metric_statistics", "list_metrics"):
        setattr(CloudWatchBackend, name, flushing(getattr(CloudWatchBackend, name)))
    threading.Thread(target=_every_minute, args=(publisher,), daemon=True,
                     name="messenger-metrics").start()
    _applied = True
    return True


def _every_minute(publisher: MetricsPublisher) -> None:
    while True:
        time.sleep(PERIOD_SECONDS - time.time() % PERIOD_SECONDS + 1)
        try:
            publisher.flush()
        except Exception:  # a queue deleted mid-sample, a reset: the next minute samples again
            log.exception("local metrics: a minute's sample failed")
