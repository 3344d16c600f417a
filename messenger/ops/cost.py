"""What messaging costs in dollars: requests metered on the wire, or a channel's CloudWatch
metrics, multiplied by the price table (`messenger.ops.prices`).

    meter = WireMeter().attach(clients)        # every request the factory's clients send
    ...                                        # push, consume
    meter.usage.total_dollars()                # billed quantities x list prices

    costs = channel_costs(clients, settings)   # each channel's last day and last 30 days
    costs = channel_costs(clients, settings, "orders")

The meter bills each request as AWS does: SQS and SNS per started 64 KiB of the request's bytes
(a received message's bytes for ReceiveMessage), DynamoDB in write units (1 KB) and read units
(4 KB; half for an eventually consistent read), S3 PUT-class and GET-class requests, KMS
per request. The request's bytes include its envelope (JSON or form encoding), so a payload
just under a 64 KiB or 1 KB boundary can count one chunk or unit more than AWS bills.

CloudWatch has no per-queue count of SQS *requests*, only of messages (sent, received, deleted)
and of empty receives. `channel_costs` therefore gives a range: `low` bills every send, receive
and delete as a batch of 10 messages, `high` bills each message its own request; empty receives
are exact. Each is multiplied by the chunks of the average message (SentMessageSize, where
CloudWatch has it). SNS publishes likewise (Publish or PublishBatch). Not in CloudWatch, hence
not in the range: ChangeMessageVisibility (lease renewals, retries), the consumer's status,
idempotency and dedup writes, offloaded bodies in S3, KMS calls.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from messenger.aws import ClientFactory
from messenger.channel import FIFO_SUFFIX, TAG_CHANNEL, TAG_PRIORITY_CHANNEL, ChannelSpec
from messenger.errors import ChannelNotFound
from messenger.ops.inventory import PlatformResource, list_platform_resources
from messenger.ops.metrics import fetch_series, sns_metric, sqs_metric, total
from messenger.ops.prices import (
    PRICES,
    READ_UNIT_BYTES,
    WRITE_UNIT_BYTES,
    Price,
    Usage,
    chunks,
)
from messenger.settings import Settings

#: Messages per SendMessageBatch, ReceiveMessage, DeleteMessageBatch and PublishBatch at most.
BATCH = 10

_S3_PUT_CLASS = frozenset({"PutObject", "CopyObject", "PostObject", "ListObjects",
                           "ListObjectsV2", "CreateMultipartUpload", "UploadPart",
                           "CompleteMultipartUpload", "ListBuckets", "PutObjectTagging"})
_S3_FREE = frozenset({"DeleteObject", "DeleteObjects", "AbortMultipartUpload"})
_DYNAMODB_WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem"})
_DYNAMODB_READS = frozenset({"GetItem", "Query", "Scan", "BatchGetItem", "TransactGetItems"})
_FREE_CONTROL = frozenset({"DescribeTable", "CreateTable", "DescribeTimeToLive",
                           "UpdateTimeToLive", "ListTables", "TagResource", "ListTagsOfResource"})


#: Where `WireMeter.remember_params` leaves a call's billed parameters in its context.
_PARAMS_KEY = "messenger_billed_params"
_BILLED_PARAMS = ("QueueUrl", "ConsistentRead")


class WireMeter:
    """Bills every request a ClientFactory's clients (or a plain boto3 client) send.

    A botocore `before-send` handler (each attempt, retries included) and an `after-call`
    handler (the response's size, for receives and DynamoDB reads). `usage` holds the billed
    quantities; `requests` the requests per 'service.Operation'; `s3_bytes_put` the bytes of
    PutObject bodies (what stays stored until the bucket's lifecycle expires it).
    """

    def __init__(self) -> None:
        self.usage = Usage()
        self.requests: dict[str, int] = {}
        self.s3_bytes_put = 0
        self._lock = threading.Lock()

    def attach(self, factory: ClientFactory) -> WireMeter:
        factory.register("before-parameter-build", self.remember_params)
        factory.register("before-send", self.before_send)
        factory.register("after-call", self.after_call)
        return self

    def attach_client(self, client: Any) -> WireMeter:
        """Meter one boto3 client made elsewhere (a peer's own)."""
        client.meta.events.register("before-parameter-build", self.remember_params)
        client.meta.events.register("before-send", self.before_send)
        client.meta.events.register("after-call", self.after_call)
        return self

    @staticmethod
    def remember_params(params: Any = None, context: Any = None, **_: Any) -> None:
        """What `after_call` bills by (a receive's queue, a read's consistency): botocore's
        after-call event carries the call's context, not its parameters."""
        if isinstance(context, dict) and isinstance(params, dict):
            context[_PARAMS_KEY] = {name: params[name] for name in _BILLED_PARAMS
                                    if name in params}

    def before_send(self, request: Any = None, event_name: str = "", **_: Any) -> None:
        service, operation = event_name.split(".")[1:3]
        body = _body_bytes(request)
        with self._lock:
            key = f"{service}.{operation}"
            self.requests[key] = self.requests.get(key, 0) + 1
            self._bill_request(service, operation, body, request)

    def _bill_request(self, service: str, operation: str, body: bytes, request: Any) -> None:
        usage = self.usage
        if service == "sqs":
            fifo = _queue_url(body).endswith(FIFO_SUFFIX)
            # a receive's chunks beyond the first are billed from its response (after_call)
            usage.add("sqs.fifo_request" if fifo else "sqs.request",
                      1 if operation == "ReceiveMessage" else chunks(len(body)))
        elif service == "sns":
            if operation in ("Publish", "PublishBatch"):
                usage.add("sns.publish", chunks(len(body)))
        elif service == "kms":
            usage.add("kms.request")
        elif service == "s3":
            if operation in _S3_PUT_CLASS:
                usage.add("s3.put")
                if operation in ("PutObject", "UploadPart"):
                    self.s3_bytes_put += _content_length(request, body)
            elif operation not in _S3_FREE:
                usage.add("s3.get")
        elif service == "dynamodb":
            if operation in _DYNAMODB_WRITES:
                usage.add("dynamodb.write_unit", _units(len(body), WRITE_UNIT_BYTES))
            elif operation in ("BatchWriteItem", "TransactWriteItems"):
                usage.add("dynamodb.write_unit", _batch_write_units(operation, body))
        elif service == "lambda" and operation == "Invoke":
            usage.add("lambda.request")

    def after_call(self, http_response: Any = None, context: Any = None,
                   event_name: str = "", **_: Any) -> None:
        service, operation = event_name.split(".")[1:3]
        params = context.get(_PARAMS_KEY) if isinstance(context, dict) else None
        if not ((service == "sqs" and operation == "ReceiveMessage")
                or (service == "dynamodb" and operation in _DYNAMODB_READS)):
            return  # never touch another response's body: S3's is a stream its caller reads
        size = len(getattr(http_response, "content", b"") or b"")
        with self._lock:
            if service == "sqs" and size:
                fifo = FIFO_SUFFIX in str((params or {}).get("QueueUrl", ""))
                extra = chunks(size) - 1
                if extra:
                    self.usage.add("sqs.fifo_request" if fifo else "sqs.request", extra)
            elif service == "dynamodb":
                consistent = bool((params or {}).get("ConsistentRead"))
                units = _units(size, READ_UNIT_BYTES)
                self.usage.add("dynamodb.read_unit",
                               units * (1.0 if consistent else 0.5)
                               * (2 if operation == "TransactGetItems" else 1))

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())


def _body_bytes(request: Any) -> bytes:
    body = getattr(request, "body", b"") or b""
    if isinstance(body, str):
        return body.encode()
    if isinstance(body, bytes | bytearray):
        return bytes(body)
    return b""  # a stream (S3 uploads): its size is in the headers


def _queue_url(body: bytes) -> str:
    """The QueueUrl of an SQS request (JSON protocol; '' when there is none)."""
    try:
        document = json.loads(body or b"{}")
    except ValueError:
        return ""
    return str(document.get("QueueUrl", "")) if isinstance(document, dict) else ""


def _content_length(request: Any, body: bytes) -> int:
    headers = getattr(request, "headers", {}) or {}
    try:
        return int(headers.get("Content-Length") or len(body))
    except (TypeError, ValueError):
        return len(body)


def _units(size: int, unit_bytes: int) -> int:
    return max(1, math.ceil(size / unit_bytes))


def _batch_write_units(operation: str, body: bytes) -> float:
    """Write units of a BatchWriteItem (per item) or TransactWriteItems (twice per item)."""
    try:
        document = json.loads(body or b"{}")
    except ValueError:
        return 1
    if operation == "BatchWriteItem":
        items = [item for requests in document.get("RequestItems", {}).values()
                 for item in requests]
        return sum(_units(len(json.dumps(item)), WRITE_UNIT_BYTES) for item in items) or 1
    return 2 * sum(_units(len(json.dumps(item)), WRITE_UNIT_BYTES)
                   for item in document.get("TransactItems", [])) or 2


# -- a deployed system's cost, from CloudWatch -------------------------------------------------
#: SQS metrics summed per queue (CloudWatch counts messages, and empty receives).
SQS_COUNTERS = ("NumberOfMessagesSent", "NumberOfMessagesReceived", "NumberOfMessagesDeleted",
                "NumberOfEmptyReceives")
SNS_COUNTERS = ("NumberOfMessagesPublished", "NumberOfNotificationsDelivered")
DAY = timedelta(days=1)
MONTH = timedelta(days=30)


@dataclass(frozen=True)
class Estimate:
    """A window's billed requests and dollars, as a range (see the module's docstring)."""

    requests_low: float
    requests_high: float
    dollars_low: float
    dollars_high: float
    #: the metrics summed over the window, by queue or topic and metric name
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class ChannelCost:
    """One channel (or an exchange's topic) and what its queues and topic cost.

    channel: the name its tags give it; kind: 'queue', 'exchange' (the topic) or 'priority';
    owner/team: its ownership tags; resources: the physical queue and topic names priced.
    """

    channel: str
    kind: str
    owner: str
    team: str
    resources: tuple[str, ...]
    day: Estimate
    month: Estimate


def channel_costs(clients: ClientFactory, settings: Settings, channel: str | None = None,
                  now: datetime | None = None) -> list[ChannelCost]:
    """The last day's and the last 30 days' cost of each channel of the namespace (or of
    `channel`: a channel, a prioritized channel's name, or an exchange, which prices its topic
    and every queue subscribed to it), from CloudWatch and the price table; the most expensive
    month first. ChannelNotFound when `channel` names nothing the platform owns.

    Two GetMetricData calls per 500 series, one Resource Groups Tagging query per 100 resources.
    """
    resources = list_platform_resources(clients, settings.namespace,
                                        roles=("queue", "dlq", "topic"))
    groups = _group(resources)
    if channel is not None:
        groups = {key: group for key, group in groups.items()
                  if key == channel or _exchange_of(key) == channel}
        if not groups:
            raise ChannelNotFound(
                f"no channel {channel!r} in namespace {settings.namespace or '(none)'!r} (no "
                f"platform-owned queue or topic tagged with it)")
    end = (now or datetime.now(UTC)).replace(second=0, microsecond=0) + timedelta(minutes=1)
    month = _window_sums(clients, groups, end - MONTH, end)
    day = _window_sums(clients, groups, end - DAY, end)
    costs = []
    for name, members in groups.items():
        tags = next((r.channel_tags for r in members if r.channel_tags.owner), None) \
            or members[0].channel_tags
        kind = "exchange" if all(r.role == "topic" for r in members) else (
            "priority" if any(r.tags.get(TAG_PRIORITY_CHANNEL) for r in members) else "queue")
        costs.append(ChannelCost(
            channel=name, kind=kind, owner=tags.owner, team=tags.team,
            resources=tuple(r.name for r in members),
            day=estimate(members, day), month=estimate(members, month)))
    return sorted(costs, key=lambda c: (-c.month.dollars_high, c.channel))


def _group(resources: Sequence[PlatformResource]) -> dict[str, list[PlatformResource]]:
    """Resources by the channel their tags name (a priority level's under its channel)."""
    groups: dict[str, list[PlatformResource]] = {}
    for resource in resources:
        name = (resource.tags.get(TAG_PRIORITY_CHANNEL) or resource.tags.get(TAG_CHANNEL)
                or resource.name)
        groups.setdefault(name, []).append(resource)
    return groups


def _exchange_of(channel: str) -> str | None:
    """The exchange of 'exchange.queue' (the spec's own rule), None for a single queue."""
    try:
        return ChannelSpec(channel).exchange
    except Exception:  # a name the spec refuses is no exchange's
        return None


def _window_sums(clients: ClientFactory, groups: dict[str, list[PlatformResource]],
                 start: datetime, end: datetime) -> dict[str, dict[str, float]]:
    """Each resource's counters summed over the window, and its average message size."""
    requests, keys = [], []
    for members in groups.values():
        for resource in members:
            if resource.service == "sqs":
                requests += [sqs_metric(resource.name, m, "Sum") for m in SQS_COUNTERS]
                requests.append(sqs_metric(resource.name, "SentMessageSize", "Average"))
                keys += [(resource.name, m) for m in (*SQS_COUNTERS, "SentMessageSize")]
            else:
                requests += [sns_metric(resource.name, m, "Sum") for m in SNS_COUNTERS]
                keys += [(resource.name, m) for m in SNS_COUNTERS]
    period = max(60, int((end - start).total_seconds()) // 60 * 60)
    sums: dict[str, dict[str, float]] = {}
    for (name, metric), values in zip(keys, fetch_series(
            clients.client("cloudwatch"), requests, start, end, period), strict=True):
        value = (max(values) if values else None) if metric == "SentMessageSize" \
            else total(values)
        if value is not None:
            sums.setdefault(name, {})[metric] = value
    return sums


def estimate(members: Sequence[PlatformResource], sums: dict[str, dict[str, float]],
             prices: dict[str, Price] | None = None) -> Estimate:
    """The requests and dollars of a channel's resources from their summed metrics."""
    table = PRICES if prices is None else prices
    low, high = Usage(), Usage()
    seen: dict[str, dict[str, float]] = {}
    for resource in members:
        metrics = sums.get(resource.name, {})
        if metrics:
            seen[resource.name] = metrics
        if resource.service == "sqs":
            key = "sqs.fifo_request" if resource.name.endswith(FIFO_SUFFIX) else "sqs.request"
            per_message = chunks(int(metrics.get("SentMessageSize", 0)))
            messages = sum(metrics.get(m, 0.0) for m in SQS_COUNTERS[:3])
            empty = metrics.get("NumberOfEmptyReceives", 0.0)
            low.add(key, empty + per_message * sum(
                math.ceil(metrics.get(m, 0.0) / BATCH) for m in SQS_COUNTERS[:3]))
            high.add(key, empty + per_message * messages)
        else:
            published = metrics.get("NumberOfMessagesPublished", 0.0)
            low.add("sns.publish", math.ceil(published / BATCH))
            high.add("sns.publish", published)
            delivered = metrics.get("NumberOfNotificationsDelivered", 0.0)
            low.add("sns.delivery_sqs", delivered)
            high.add("sns.delivery_sqs", delivered)
    return Estimate(
        requests_low=sum(v for k, v in low.items() if k != "sns.delivery_sqs"),
        requests_high=sum(v for k, v in high.items() if k != "sns.delivery_sqs"),
        dollars_low=low.total_dollars(table), dollars_high=high.total_dollars(table),
        metrics=seen)
