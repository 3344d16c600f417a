"""Resource cleaner: finds unused platform topics and queues; deletes or reports them.

1. Inventory: every platform-owned topic and queue of the namespace (Tagging API).
2. A topic is active when it published or delivered anything in the past day.
3. A queue subscribed to an active topic is active.
4. For the other queues (and DLQs whose source queue is gone), three days of
   ApproximateNumberOfMessagesVisible, NumberOfMessagesSent, NumberOfMessagesReceived and
   NumberOfEmptyReceives (batched GetMetricData).
5. Sends without receives: no consumers. Receives (or empty polls) without sends: no producers.
   Neither: idle, and the queue's attributes decide, because missing datapoints are not zeros
   (SQS stops reporting a queue after six idle hours): messages in it -> stale; created or
   changed within the three days -> too new to judge; else unused -> deleted.
6. Unused queues are deleted with their subscriptions and their (empty) DLQ; an inactive topic
   is deleted once no remaining queue is subscribed to it.

Never deleted: resources of a CloudFormation stack (reported instead), anything in a dry run.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from messenger.aws import ClientFactory, error_code
from messenger.ops.findings import CleanerReport, Finding
from messenger.ops.inventory import PlatformResource, list_platform_resources
from messenger.ops.metrics import fetch_series, peak, sns_metric, sqs_metric, total
from messenger.ops.report import Notifier, cleaner_message
from messenger.ops.settings import OpsSettings
from messenger.provision import QUEUE_MISSING_CODES, TOPIC_MISSING_CODES

TOPIC_LOOKBACK = timedelta(days=1)
QUEUE_LOOKBACK = timedelta(days=3)
PERIOD_SECONDS = 3600
TOPIC_METRICS = ("NumberOfMessagesPublished", "NumberOfNotificationsDelivered")
QUEUE_METRICS = (
    ("ApproximateNumberOfMessagesVisible", "Maximum"),
    ("NumberOfMessagesSent", "Sum"),
    ("NumberOfMessagesReceived", "Sum"),
    ("NumberOfEmptyReceives", "Sum"),
)
_STATE_ATTRIBUTES = [
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "RedrivePolicy",
]

# Verdicts of a queue.
ACTIVE = "active"
NO_CONSUMERS = "no consumers"
NO_PRODUCERS = "no producers"
IDLE = "idle"
STALE = "stale messages"
TOO_NEW = "too new"
UNUSED = "unused"


@dataclass(frozen=True)
class QueueActivity:
    """Three days of CloudWatch figures; None means no datapoint at all (unknown, not zero)."""

    visible: float | None
    sent: float | None
    received: float | None
    empty_receives: float | None

    @property
    def has_data(self) -> bool:
        values = (self.visible, self.sent, self.received, self.empty_receives)
        return any(v is not None for v in values)


@dataclass(frozen=True)
class QueueState:
    """What GetQueueAttributes says now: messages (visible + in flight + delayed), last change."""

    url: str
    messages: int
    last_changed: datetime
    dlq_arn: str | None = None


def classify_activity(activity: QueueActivity) -> str:
    """ACTIVE, NO_CONSUMERS, NO_PRODUCERS or IDLE (idle: the attributes must decide)."""
    producing = (activity.sent or 0) > 0
    consuming = (activity.received or 0) > 0 or (activity.empty_receives or 0) > 0
    if producing and consuming:
        return ACTIVE
    if producing:
        return NO_CONSUMERS
    if consuming:
        return NO_PRODUCERS
    return IDLE


def judge_idle(state: QueueState, now: datetime, lookback: timedelta = QUEUE_LOOKBACK) -> str:
    """STALE (holds messages), TOO_NEW (created/changed within `lookback`) or UNUSED."""
    if state.messages > 0:
        return STALE
    if now - state.last_changed < lookback:
        return TOO_NEW
    return UNUSED


@dataclass(frozen=True)
class CleanerOutcome:
    report: CleanerReport
    posted: bool

    def summary(self) -> dict[str, Any]:
        r = self.report
        names = {
            "deleted_topics": r.deleted_topics, "deleted_queues": r.deleted_queues,
            "stale": r.stale, "no_producers": r.no_producers, "no_consumers": r.no_consumers,
            "kept_by_stack": r.kept_by_stack, "failed": r.failed,
        }
        return {
            "dry_run": r.dry_run,
            **{key: [f.name for f in found] for key, found in names.items()},
            "posted": self.posted,
        }

    def metrics(self) -> dict[str, int]:
        r = self.report
        deleted = 0 if r.dry_run else len(r.deleted_topics) + len(r.deleted_queues)
        return {
            "ResourcesDeleted": deleted,
            "QueuesFlagged": len(r.stale) + len(r.no_producers) + len(r.no_consumers),
            "CleanupFailures": len(r.failed),
            "SlackPostFailed": int(r.has_findings and not self.posted),
        }


@dataclass
class _Run:
    """Working state of one clean-up."""

    clients: ClientFactory
    dry_run: bool
    now: datetime
    queues: dict[str, PlatformResource]
    subscriptions_by_topic: dict[str, list[dict[str, Any]]]
    subscriptions_by_endpoint: dict[str, list[dict[str, Any]]]
    found: dict[str, list[Finding]] = field(default_factory=lambda: defaultdict(list))
    removed: set[str] = field(default_factory=set)

    @property
    def sqs(self) -> Any:
        return self.clients.client("sqs")

    @property
    def sns(self) -> Any:
        return self.clients.client("sns")

    def state(self, queue: PlatformResource) -> QueueState | None:
        """The queue's current attributes; None when it is gone."""
        account = queue.arn.split(":")[4]
        try:
            url = self.sqs.get_queue_url(QueueName=queue.name, QueueOwnerAWSAccountId=account)
            attributes = self.sqs.get_queue_attributes(
                QueueUrl=url["QueueUrl"], AttributeNames=_STATE_ATTRIBUTES
            )["Attributes"]
        except ClientError as error:
            if error_code(error) in QUEUE_MISSING_CODES:
                return None
            raise
        redrive = json.loads(attributes.get("RedrivePolicy") or "{}")
        changed = max(
            float(attributes.get("CreatedTimestamp", 0)),
            float(attributes.get("LastModifiedTimestamp", 0)),
        )
        return QueueState(
            url=str(url["QueueUrl"]),
            messages=sum(int(attributes.get(name, 0)) for name in _STATE_ATTRIBUTES[:3]),
            last_changed=datetime.fromtimestamp(changed, UTC),
            dlq_arn=redrive.get("deadLetterTargetArn"),
        )

    def unsubscribe(self, subscriptions: list[dict[str, Any]]) -> None:
        for subscription in subscriptions:
            arn = subscription.get("SubscriptionArn", "")
            if arn.startswith("arn:"):  # not 'PendingConfirmation'
                self.sns.unsubscribe(SubscriptionArn=arn)

    def delete_queue(self, queue: PlatformResource, state: QueueState, why: str) -> None:
        """Delete an unused queue, its subscriptions and its empty DLQ (or report them)."""
        if queue.stack:
            self.found["kept_by_stack"].append(Finding(queue.name, why, queue.stack))
            return
        notes = []
        dlq = self.queues.get(state.dlq_arn or "")
        if not self.dry_run:
            self.unsubscribe(self.subscriptions_by_endpoint.get(queue.arn, []))
            self.sqs.delete_queue(QueueUrl=state.url)
        self.removed.add(queue.arn)
        if dlq is not None:
            notes.append(self._delete_dlq(dlq, queue))
        detail = "; ".join([why, *filter(None, notes)])
        self.found["deleted_queues"].append(Finding(queue.name, detail))

    def _delete_dlq(self, dlq: PlatformResource, source: PlatformResource) -> str:
        dlq_state = self.state(dlq)
        if dlq_state is None:
            return ""
        if dlq.channel != source.channel:
            return f"DLQ {dlq.name} kept: it belongs to channel {dlq.channel or '?'}"
        if dlq_state.messages > 0:
            self.found["stale"].append(Finding(
                dlq.name,
                f"{dlq_state.messages} messages; dead-letter queue of unused {source.name}, kept",
            ))
            return f"DLQ {dlq.name} kept: it holds messages"
        if dlq.stack:
            self.found["kept_by_stack"].append(
                Finding(dlq.name, f"empty DLQ of unused {source.name}", dlq.stack)
            )
            return f"DLQ {dlq.name} kept: CloudFormation stack {dlq.stack}"
        if not self.dry_run:
            self.sqs.delete_queue(QueueUrl=dlq_state.url)
        self.removed.add(dlq.arn)
        return f"DLQ {dlq.name} {'would go' if self.dry_run else 'deleted'} too"

    def delete_topic(self, topic: PlatformResource) -> None:
        """Delete an inactive topic once nothing that stays is subscribed to it."""
        subscriptions = self.subscriptions_by_topic.get(topic.arn, [])
        if any(s.get("Endpoint") not in self.removed for s in subscriptions):
            return  # a queue that stays is subscribed: it is reported on its own
        why = f"nothing published or delivered in {TOPIC_LOOKBACK.days} day"
        if topic.stack:
            self.found["kept_by_stack"].append(Finding(topic.name, why, topic.stack))
            return
        if not self.dry_run:
            self.unsubscribe(subscriptions)
            try:
                self.sns.delete_topic(TopicArn=topic.arn)
            except ClientError as error:
                if error_code(error) not in TOPIC_MISSING_CODES:
                    raise
        self.found["deleted_topics"].append(Finding(topic.name, why))


def clean_resources(
    clients: ClientFactory, namespace: str, dry_run: bool, now: datetime | None = None
) -> CleanerReport:
    """Classify every platform topic and queue of `namespace`; delete the unused ones
    (unless `dry_run` or owned by a CloudFormation stack) and report the rest."""
    now = now or datetime.now(UTC)
    inventory = list_platform_resources(clients, namespace)
    topics = [r for r in inventory if r.service == "sns"]
    queues = {r.arn: r for r in inventory if r.service == "sqs"}
    by_topic, by_endpoint = _subscriptions(clients)
    run = _Run(clients, dry_run, now, queues, by_topic, by_endpoint)
    cloudwatch = clients.client("cloudwatch")

    topic_series = fetch_series(
        cloudwatch,
        [sns_metric(t.name, metric, "Sum") for t in topics for metric in TOPIC_METRICS],
        now - TOPIC_LOOKBACK, now, PERIOD_SECONDS,
    )
    width = len(TOPIC_METRICS)
    active_topics = {
        t.arn for i, t in enumerate(topics)
        if any((total(topic_series[i * width + k]) or 0) > 0 for k in range(width))
    }
    fed = {
        s.get("Endpoint") for arn in active_topics for s in by_topic.get(arn, [])
    }
    # DLQs are judged with their source queue, unless that queue is gone (an orphan DLQ).
    sources = {q.channel for q in queues.values() if q.role == "queue"}
    subjects = [
        q for q in queues.values()
        if (q.role == "queue" or q.channel not in sources) and q.arn not in fed
    ]
    queue_series = fetch_series(
        cloudwatch,
        [sqs_metric(q.name, metric, stat) for q in subjects for metric, stat in QUEUE_METRICS],
        now - QUEUE_LOOKBACK, now, PERIOD_SECONDS,
    )
    for i, queue in enumerate(subjects):
        visible, sent, received, empty = queue_series[i * 4 : i * 4 + 4]
        activity = QueueActivity(peak(visible), total(sent), total(received), total(empty))
        try:
            _judge_queue(run, queue, activity)
        except ClientError as error:
            run.found["failed"].append(Finding(queue.name, f"{error_code(error)}: {error}"))
    for topic in topics:
        if topic.arn not in active_topics:
            try:
                run.delete_topic(topic)
            except ClientError as error:
                run.found["failed"].append(Finding(topic.name, f"{error_code(error)}: {error}"))
    return CleanerReport(
        namespace=namespace, dry_run=dry_run, checked_at=now,
        topics_checked=len(topics), queues_checked=len(queues),
        **{key: tuple(found) for key, found in run.found.items()},
    )


def _judge_queue(run: _Run, queue: PlatformResource, activity: QueueActivity) -> None:
    days = QUEUE_LOOKBACK.days
    verdict = classify_activity(activity)
    if verdict == NO_CONSUMERS:
        run.found["no_consumers"].append(
            Finding(queue.name, f"{activity.sent:,.0f} messages sent, none received in {days} days")
        )
        return
    if verdict == NO_PRODUCERS:
        polls = (activity.received or 0) + (activity.empty_receives or 0)
        run.found["no_producers"].append(Finding(
            queue.name,
            f"nothing sent in {days} days; consumers still polling ({polls:,.0f} receives)",
        ))
        return
    if verdict == ACTIVE:
        return
    state = run.state(queue)
    if state is None:
        return  # deleted meanwhile
    verdict = judge_idle(state, run.now)
    quiet = f"no sends or receives in {days} days" + (
        "" if activity.has_data else " (no CloudWatch data)"
    )
    if verdict == STALE:
        run.found["stale"].append(Finding(queue.name, f"{state.messages} messages; {quiet}"))
    elif verdict == UNUSED:
        run.delete_queue(queue, state, f"empty; {quiet}")


def _subscriptions(clients: ClientFactory) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    by_topic: dict[str, list[Any]] = defaultdict(list)
    by_endpoint: dict[str, list[Any]] = defaultdict(list)
    for page in clients.client("sns").get_paginator("list_subscriptions").paginate():
        for subscription in page.get("Subscriptions", []):
            by_topic[subscription["TopicArn"]].append(subscription)
            by_endpoint[subscription.get("Endpoint", "")].append(subscription)
    return by_topic, by_endpoint


def run_resource_cleaner(
    clients: ClientFactory,
    settings: OpsSettings,
    notifier: Notifier,
    now: datetime | None = None,
) -> CleanerOutcome:
    """The Lambda's work: make sure the report can be posted, clean, post the report."""
    notifier.prepare()  # never delete anything that could then not be reported
    report = clean_resources(clients, settings.namespace, settings.dry_run, now)
    posted = report.has_findings and notifier.post(cleaner_message(report))
    return CleanerOutcome(report, posted)
