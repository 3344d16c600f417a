"""Resource cleaner: finds unused platform topics and queues; deletes or reports them.

1. Inventory: every platform-owned topic and queue of the namespace (Tagging API).
2. A topic is active when it published or delivered anything in the past day.
3. For every queue (and DLQs whose source queue is gone), three days of
   ApproximateNumberOfMessagesVisible, NumberOfMessagesSent, NumberOfMessagesReceived and
   NumberOfEmptyReceives (batched GetMetricData).
4. Sends without receives: no consumers (on a queue subscribed to a busy exchange, sends are
   SNS's deliveries: an abandoned subscriber). Receives (or empty polls) without sends: no
   producers. Neither: idle. An idle queue subscribed to an active topic is active; otherwise the
   queue's attributes decide, because missing datapoints are not zeros (SQS stops reporting a
   queue after six idle hours): messages in it -> stale; created or changed within the three days
   -> too new to judge; else unused -> deleted.
5. Unused queues are deleted with their subscriptions and their (empty) DLQ; an inactive topic
   is deleted once no remaining queue is subscribed to it (else it is reported as kept).

Everything is judged before anything is deleted: the plan is logged and posted first (the
`confirm` callback), and nothing is deleted when it cannot be posted. Never deleted: resources
of a CloudFormation stack (reported instead), anything in a dry run. Every deletion is logged
by name as it happens; a refused one (AccessDenied...) is reported under `failed`, naming what
it leaves behind, and fails the invocation at the end. Any error that is not about one resource
(a broken connection, a timeout, anything unexpected), or the Lambda's remaining time falling
under `STOP_MARGIN_SECONDS`, stops the run (while judging: nothing is deleted): the report says
why and names what was not checked and not deleted, is posted and logged, and then the
invocation fails (`CleanerOutcome.raise_for_failure`).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from messenger.aws import ClientFactory, error_code
from messenger.errors import MessengerError
from messenger.ops.findings import CleanerReport, Finding
from messenger.ops.inventory import PlatformResource, list_platform_resources
from messenger.ops.metrics import fetch_series, peak, sns_metric, sqs_metric, total
from messenger.ops.report import (
    Notifier,
    ReportNotDelivered,
    cleaner_messages,
    counted,
    owner_label,
    post_all,
    short_of_time,
)
from messenger.ops.settings import OpsSettings
from messenger.provision import QUEUE_MISSING_CODES, TOPIC_MISSING_CODES

logger = logging.getLogger("messenger.ops.cleaner")

#: The run stops (and reports) when the Lambda has less than this left: time to post and log.
STOP_MARGIN_SECONDS = 60.0
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


class CleanerStopped(MessengerError):
    """The clean-up stopped before it judged everything (its report says what it did)."""


class CleanupFailed(MessengerError):
    """A deletion failed (AccessDenied, ...): the run fails so that the Errors alarm pages."""


@dataclass(frozen=True)
class CleanerOutcome:
    report: CleanerReport
    posted: bool

    def summary(self) -> dict[str, Any]:
        r = self.report
        names = {
            "deleted_topics": r.deleted_topics, "deleted_queues": r.deleted_queues,
            "stale": r.stale, "no_producers": r.no_producers, "no_consumers": r.no_consumers,
            "kept_by_stack": r.kept_by_stack, "kept_topics": r.kept_topics,
            "kept_outside_prefix": r.kept_outside_prefix, "failed": r.failed,
            "not_checked": r.not_checked, "not_deleted": r.not_deleted,
        }
        return {
            "dry_run": r.dry_run,
            "stopped": r.stopped,
            **{key: [f.name for f in found] for key, found in names.items()},
            "posted": self.posted,
        }

    def report_log(self) -> dict[str, Any]:
        """The whole report, every finding with its detail (for the log)."""
        r = self.report
        return {
            **self.summary(),
            "details": {
                f.name: f.detail for group in (
                    r.failed, r.not_checked, r.deleted_topics, r.deleted_queues, r.stale,
                    r.no_producers, r.no_consumers, r.kept_by_stack, r.kept_topics,
                    r.kept_outside_prefix, r.not_deleted)
                for f in group
            },
        }

    def metrics(self) -> dict[str, int]:
        r = self.report
        return {
            "ResourcesDeleted": 0 if r.dry_run else len(r.deleted_topics) + r.queues_removed,
            "QueuesFlagged": len(r.stale) + len(r.no_producers) + len(r.no_consumers),
            "CleanupFailures": len(r.failed) + int(r.stopped is not None),
            "SlackPostFailed": int(r.has_findings and not self.posted),
        }

    def raise_for_failure(self) -> None:
        """Fail the invocation (after the report was posted and logged) when the run stopped
        early, a deletion failed or its report could not be delivered: the function's Errors
        alarm then pages the ops alarm topic."""
        posted = f"report {'posted' if self.posted else 'NOT posted'}, full report in the log"
        if self.report.stopped:
            raise CleanerStopped(
                f"resource cleaner stopped early: {self.report.stopped} "
                f"({len(self.report.not_checked)} resources not checked, "
                f"{len(self.report.not_deleted)} not deleted; {posted})"
            )
        if self.report.failed:
            names = [f.name for f in self.report.failed]
            raise CleanupFailed(
                f"resource cleaner could not clean {counted(len(names), 'resource')}: "
                f"{', '.join(names[:5])}{' …' if len(names) > 5 else ''} ({posted})"
            )
        if self.report.has_findings and not self.posted:
            raise ReportNotDelivered(
                "the resource cleaner's report could not be posted to Slack; it is in the log"
            )


class _Stop(Exception):
    """Internal: stop the run with this reason."""


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
    namespace: str = ""
    #: Seconds the invocation has left (None: no limit, e.g. outside Lambda).
    remaining: Callable[[], float] | None = None
    margin: float = STOP_MARGIN_SECONDS
    #: Where deletions are logged as they happen (the Lambda's Powertools Logger).
    log: Any = logger
    unsubscribed: set[str] = field(default_factory=set)
    queues_removed: int = 0
    #: What the judging found deletable, in the order it is deleted (a queue before its DLQ).
    plan: list[_Deletion] = field(default_factory=list)
    #: The deletion being done (when an unexpected error stops the run).
    current: _Deletion | None = None

    def owns(self, resource: PlatformResource) -> bool:
        """Both the tags (the inventory's filter) and the name place it in the namespace, whose
        resources are named '<namespace>-...' (the prefix the cleaner's IAM policy allows).
        Without a namespace the tags alone decide (no namespace tag)."""
        if self.namespace:
            return resource.name.startswith(f"{self.namespace}-")
        return True

    def check_time(self) -> None:
        reason = short_of_time(self.remaining, self.margin)
        if reason:
            raise _Stop(reason)

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
            if arn.startswith("arn:") and arn not in self.unsubscribed:  # not pending
                self.sns.unsubscribe(SubscriptionArn=arn)
                self.unsubscribed.add(arn)
                self.log.info("unsubscribed", extra={"subscription": arn})

    def delete_queue(self, queue: PlatformResource, state: QueueState, why: str) -> None:
        """Plan the deletion of an unused queue, its subscriptions and its empty DLQ (or report
        why they stay)."""
        if queue.stack:
            self.found["kept_by_stack"].append(finding(queue, why, queue.stack))
            return
        if not self.owns(queue):
            self.found["kept_outside_prefix"].append(finding(queue, why))
            return
        entry = _Deletion(queue, "queue", why, state.url,
                          self.subscriptions_by_endpoint.get(queue.arn, []))
        self.plan.append(entry)
        self.removed.add(queue.arn)
        dlq = self.queues.get(state.dlq_arn or "")
        if dlq is not None:
            note = self._plan_dlq(dlq, queue)
            if note:
                entry.notes.append(note)

    def _plan_dlq(self, dlq: PlatformResource, source: PlatformResource,
                  source_gone: bool = False) -> str:
        """Plan the deletion of the DLQ of an unused (or vanished) queue; else why it stays."""
        dlq_state = self.state(dlq)
        if dlq_state is None:
            return ""
        if dlq.channel != source.channel:
            return f"DLQ {dlq.name} kept: it belongs to channel {dlq.channel or '?'}"
        of = f"dead-letter queue of {source.name}" + (
            ", which was already gone (deleted meanwhile)" if source_gone else ", unused")
        if dlq_state.messages > 0:
            self.found["stale"].append(finding(
                dlq, f"{counted(dlq_state.messages, 'message')}; {of}, kept"))
            return f"DLQ {dlq.name} kept: it holds messages"
        if dlq.stack:
            self.found["kept_by_stack"].append(finding(dlq, f"empty {of}", dlq.stack))
            return f"DLQ {dlq.name} kept: CloudFormation stack {dlq.stack}"
        if not self.owns(dlq):
            self.found["kept_outside_prefix"].append(finding(dlq, f"empty {of}"))
            return f"DLQ {dlq.name} kept: named outside the namespace's prefix"
        self.plan.append(_Deletion(dlq, "dlq", f"empty {of}", dlq_state.url,
                                   source=None if source_gone else source))
        self.removed.add(dlq.arn)
        return ""

    def delete_topic(self, topic: PlatformResource) -> None:
        """Plan the deletion of an inactive topic once nothing that stays is subscribed to it."""
        subscriptions = self.subscriptions_by_topic.get(topic.arn, [])
        why = f"nothing published or delivered in {TOPIC_LOOKBACK.days} day"
        staying = sorted({str(s.get("Endpoint", "")).rsplit(":", 1)[-1] for s in subscriptions
                          if s.get("Endpoint") not in self.removed})
        if staying:
            self.found["kept_topics"].append(finding(
                topic, f"{why}; subscribed: {', '.join(staying)}"))
            return
        if topic.stack:
            self.found["kept_by_stack"].append(finding(topic, why, topic.stack))
            return
        if not self.owns(topic):
            self.found["kept_outside_prefix"].append(finding(topic, why))
            return
        self.plan.append(_Deletion(topic, "topic", why, subscriptions=subscriptions))

    def execute(self) -> None:
        """Delete what the plan holds, in order (a queue before its DLQ), each logged by name as
        it goes; a refused deletion is listed under `failed` with what it leaves behind."""
        refused: set[str] = set()
        for entry in list(self.plan):
            self.check_time()
            self.current = entry
            source = entry.source
            if source is not None and source.arn in refused:
                self.plan.remove(entry)  # its queue stays: so does it (said in the queue's row)
                continue
            try:
                gone = self._delete(entry)
            except ClientError as error:
                refused.add(entry.resource.arn)
                self.found["failed"].append(finding(
                    entry.resource, f"not deleted: {error_code(error)}: {error}"
                    + _left_behind(entry, self.plan)))
                self._note_on_source(entry, f"DLQ {entry.resource.name} NOT deleted (listed "
                                            f"under could not clean)")
            else:
                self._done(entry, "already gone" if gone else "")
            self.plan.remove(entry)
        self.current = None

    def _delete(self, entry: _Deletion) -> bool:
        """Delete one planned resource; True when someone else deleted it first.

        A topic goes with DeleteTopic alone (which deletes its subscriptions). A queue is
        deleted first and only then unsubscribed from the topics that fed it: sns:Unsubscribe
        cannot be limited by tag or name in IAM, so the cleaner only unsubscribes what points
        at a queue that the tag-guarded sqs:DeleteQueue has just let it delete (or that is gone).
        """
        if self.dry_run:
            return False
        name = entry.resource.name
        if entry.kind == "topic":
            try:
                self.sns.delete_topic(TopicArn=entry.resource.arn)
            except ClientError as error:
                if error_code(error) not in TOPIC_MISSING_CODES:
                    raise
                return True
            self.log.info(f"deleted topic {name}", extra={"topic": entry.resource.arn})
            return False
        gone = False
        try:
            self.sqs.delete_queue(QueueUrl=entry.url)
        except ClientError as error:
            if error_code(error) not in QUEUE_MISSING_CODES:
                raise
            gone = True
        else:
            self.queues_removed += 1
            what = "dead-letter queue" if entry.kind == "dlq" else "queue"
            self.log.info(f"deleted {what} {name}", extra={"queue": name, "url": entry.url})
        self.unsubscribe(entry.subscriptions)
        return gone

    def _done(self, entry: _Deletion, note: str) -> None:
        detail = "; ".join([entry.why, *entry.notes, *filter(None, [note])])
        if entry.kind == "topic":
            self.found["deleted_topics"].append(finding(entry.resource, detail))
        elif entry.source is not None:  # the DLQ of a queue listed already: a note in its row
            self._note_on_source(entry, f"DLQ {entry.resource.name} "
                                        f"{'would go' if self.dry_run else 'deleted'} too")
        else:
            self.found["deleted_queues"].append(finding(entry.resource, detail))

    def _note_on_source(self, entry: _Deletion, note: str) -> None:
        rows = self.found["deleted_queues"]
        for index, row in enumerate(rows):
            if entry.source is not None and row.name == entry.source.name:
                rows[index] = Finding(row.name, f"{row.detail}; {note}", row.stack, row.owner)

    def planned_report_rows(self) -> tuple[list[Finding], list[Finding]]:
        """(topics, queues) the plan deletes, as report rows (a DLQ in its queue's row)."""
        topics, queues = [], []
        for entry in self.plan:
            if entry.kind == "topic":
                topics.append(finding(entry.resource, entry.why))
            elif entry.source is None:
                dlqs = [d.resource.name for d in self.plan if d.source is entry.resource]
                queues.append(finding(entry.resource, "; ".join(
                    [entry.why, *entry.notes, *(f"DLQ {d} too" for d in dlqs)])))
        return topics, queues


@dataclass
class _Deletion:
    """One planned deletion: a queue (and the subscriptions to it), a DLQ (after its `source`
    queue; None: the DLQ stands alone) or a topic (and its subscriptions)."""

    resource: PlatformResource
    kind: str
    why: str
    url: str = ""
    subscriptions: list[dict[str, Any]] = field(default_factory=list)
    source: PlatformResource | None = None
    notes: list[str] = field(default_factory=list)


def _left_behind(entry: _Deletion, plan: list[_Deletion]) -> str:
    """What a refused deletion leaves: a DLQ without its queue, a queue keeping its DLQ."""
    if entry.kind == "dlq" and entry.source is not None:
        return (f"; its queue {entry.source.name} was deleted: this dead-letter queue is "
                f"orphaned, and the next run deletes it")
    dlqs = [d.resource.name for d in plan if d.source is entry.resource]
    return f"; its DLQ {', '.join(dlqs)} kept with it" if dlqs else ""


def finding(resource: PlatformResource, detail: str, stack: str | None = None) -> Finding:
    """A finding about `resource`, with its owner and team from its tags."""
    tags = resource.channel_tags
    owner = owner_label(tags.team, tags.owner)
    return Finding(resource.name, detail, stack, owner)


def clean_resources(
    clients: ClientFactory, namespace: str, dry_run: bool, now: datetime | None = None,
    remaining: Callable[[], float] | None = None, margin: float = STOP_MARGIN_SECONDS,
    log: Any = None, confirm: Callable[[CleanerReport], bool] | None = None,
) -> CleanerReport:
    """Classify every platform topic and queue of `namespace`; delete the unused ones
    (unless `dry_run` or owned by a CloudFormation stack) and report the rest.

    Two steps: everything is judged first (nothing deleted), then the deletions are done.
    confirm: called with the plan (a report whose deleted_* are about to be deleted) before
    the first deletion; when it returns False (the plan could not be posted) nothing is
    deleted and the run stops. remaining: seconds the invocation has left (a Lambda context's,
    in seconds); the run stops with what it did so far when it falls under `margin`, or on any
    error that is not about one resource (`CleanerReport.stopped`, `not_checked`,
    `not_deleted`)."""
    now = now or datetime.now(UTC)
    inventory: list[PlatformResource] = []
    try:  # nothing is deleted before this is read: a failure here stops with nothing done
        inventory = list_platform_resources(clients, namespace)
        topics = [r for r in inventory if r.service == "sns"]
        queues = {r.arn: r for r in inventory if r.service == "sqs"}
        by_topic, by_endpoint = _subscriptions(clients)
        run = _Run(clients, dry_run, now, queues, by_topic, by_endpoint, namespace=namespace,
                   remaining=remaining, margin=margin, log=log or logger)
        (active_topics, fed, subjects, queue_series) = _read_activity(
            clients, now, topics, queues, by_topic)
    except Exception as error:
        reason = str(error) if isinstance(error, _Stop) else (
            f"{type(error).__name__} before judging anything: {error}")
        (log or logger).exception(f"resource cleaner stopped: {reason}")
        return CleanerReport(
            namespace=namespace, dry_run=dry_run, checked_at=now,
            topics_checked=sum(r.service == "sns" for r in inventory),
            queues_checked=sum(r.service == "sqs" for r in inventory),
            stopped=f"{reason}; nothing was deleted" if inventory else
            f"{reason}; no resource was listed, nothing was deleted",
            not_checked=tuple(finding(r, "not judged: the run stopped first")
                              for r in inventory),
        )
    inactive = [t for t in topics if t.arn not in active_topics]
    pending: list[PlatformResource] = [*subjects, *inactive]
    stopped = _judge_all(run, subjects, inactive, queue_series, fed, pending)
    if stopped:
        stopped += "; nothing was deleted"
    elif run.plan and not dry_run and confirm is not None:
        topics_planned, queues_planned = run.planned_report_rows()
        plan = _report(run, topics, queues, [], None, deleted_topics=topics_planned,
                       deleted_queues=queues_planned, planned=True)
        if not confirm(plan):
            stopped = "the plan could not be posted to Slack; nothing was deleted"
    if not stopped:
        stopped = _execute(run)
    # what the plan still holds was not deleted (the run stopped, or the plan was not posted)
    not_deleted = [finding(d.resource, f"{d.why}; not deleted: the run stopped first")
                   for d in run.plan]
    return _report(run, topics, queues, pending, stopped, not_deleted=not_deleted)


def _judge_all(run: _Run, subjects: list[PlatformResource], inactive: list[PlatformResource],
               queue_series: list[list[float]], fed: set[Any],
               pending: list[PlatformResource]) -> str | None:
    """Judge every queue, then every inactive topic, filling the run's findings and plan (no
    deletion); `pending` keeps what was not judged. Why the run stopped, or None."""
    doing = "starting"
    current: PlatformResource | None = None
    try:
        for i, queue in enumerate(subjects):
            run.check_time()
            doing, current = f"judging queue {queue.name}", queue
            visible, sent, received, empty = queue_series[i * 4 : i * 4 + 4]
            activity = QueueActivity(peak(visible), total(sent), total(received), total(empty))
            try:
                _judge_queue(run, queue, activity, fed_by_active_topic=queue.arn in fed)
            except ClientError as error:
                run.found["failed"].append(finding(queue, f"{error_code(error)}: {error}"))
            pending.remove(queue)
        for topic in inactive:
            run.check_time()
            doing, current = f"judging topic {topic.name}", topic
            run.delete_topic(topic)
            pending.remove(topic)
    except _Stop as stop:
        return str(stop)
    except Exception as error:  # a broken connection, a timeout, a bug: stop and report
        stopped = f"{type(error).__name__} while {doing}: {error}"
        run.log.exception(f"resource cleaner stopped: {stopped}")
        if current is not None and current in pending:
            pending.remove(current)
            run.found["failed"].append(finding(
                current, f"{type(error).__name__}: {error}; the run stopped here"))
        return stopped
    return None


def _execute(run: _Run) -> str | None:
    """Do the plan; why it stopped (the Lambda's time, an unexpected error), or None."""
    try:
        run.execute()
    except _Stop as stop:
        return str(stop)
    except Exception as error:  # a broken connection, a timeout, a bug: stop and report
        entry = run.current
        stopped = f"{type(error).__name__} while deleting"
        if entry is not None:
            stopped += f" {entry.resource.name}"
            run.plan.remove(entry)
            run.found["failed"].append(finding(
                entry.resource, f"{type(error).__name__}: {error}; the run stopped here: "
                                f"it may or may not be deleted" + _left_behind(entry, run.plan)))
        stopped += f": {error}"
        run.log.exception(f"resource cleaner stopped: {stopped}")
        return stopped
    return None


def _report(run: _Run, topics: list[PlatformResource], queues: dict[str, PlatformResource],
            pending: list[PlatformResource], stopped: str | None, **fields: Any) -> CleanerReport:
    found: dict[str, Any] = {key: tuple(rows) for key, rows in run.found.items()}
    found.update({key: tuple(rows) for key, rows in fields.items() if key != "planned"})
    return CleanerReport(
        namespace=run.namespace, dry_run=run.dry_run, checked_at=run.now,
        topics_checked=len(topics), queues_checked=len(queues),
        stopped=stopped, queues_removed=run.queues_removed, planned=bool(fields.get("planned")),
        not_checked=tuple(
            finding(r, "not judged: the run stopped first" + _with_dlq(r, queues))
            for r in pending) if stopped else (),
        **found,
    )


def _with_dlq(resource: PlatformResource, queues: dict[str, PlatformResource]) -> str:
    """' (nor its DLQ x)' for a source queue: its DLQ is judged with it, so not either."""
    if resource.role != "queue":
        return ""
    dlqs = [q.name for q in queues.values() if q.role == "dlq" and q.channel == resource.channel]
    return f" (nor its DLQ {', '.join(dlqs)})" if dlqs else ""


def _read_activity(
    clients: ClientFactory, now: datetime, topics: list[PlatformResource],
    queues: dict[str, PlatformResource], by_topic: dict[str, list[Any]],
) -> tuple[set[str], set[Any], list[PlatformResource], list[list[float]]]:
    """Active topics, the endpoints they feed, the queues to judge and their metrics."""
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
        q for q in queues.values() if q.role == "queue" or q.channel not in sources
    ]
    queue_series = fetch_series(
        cloudwatch,
        [sqs_metric(q.name, metric, stat) for q in subjects for metric, stat in QUEUE_METRICS],
        now - QUEUE_LOOKBACK, now, PERIOD_SECONDS,
    )
    return active_topics, fed, subjects, queue_series


def _judge_queue(
    run: _Run, queue: PlatformResource, activity: QueueActivity, fed_by_active_topic: bool
) -> None:
    days = QUEUE_LOOKBACK.days
    verdict = classify_activity(activity)
    if verdict == NO_CONSUMERS:
        source = "delivered by its active exchange" if fed_by_active_topic else "sent"
        run.found["no_consumers"].append(finding(
            queue,
            f"{counted(activity.sent or 0, 'message')} {source}, none received in {days} days"))
        return
    if verdict == NO_PRODUCERS:
        polls = (activity.received or 0) + (activity.empty_receives or 0)
        run.found["no_producers"].append(finding(
            queue,
            f"nothing sent in {days} days; consumers still polling ({polls:,.0f} receives)",
        ))
        return
    if verdict == ACTIVE or fed_by_active_topic:
        return  # an idle subscriber of a busy exchange: its topic's filter matched nothing
    state = run.state(queue)
    if state is None:
        _orphaned_dlq(run, queue)
        return
    verdict = judge_idle(state, run.now)
    quiet = f"no sends or receives in {days} days" + (
        "" if activity.has_data else " (no CloudWatch data)"
    )
    if verdict == STALE:
        run.found["stale"].append(finding(queue, f"{counted(state.messages, 'message')}; {quiet}"))
    elif verdict == UNUSED:
        run.delete_queue(queue, state, f"empty; {quiet}")


def _orphaned_dlq(run: _Run, queue: PlatformResource) -> None:
    """The queue was deleted by someone else between the inventory and now: its channel's DLQ
    is judged in its place, and named (else it would be orphaned, and unnamed, until the next
    run)."""
    if queue.role != "queue":
        return
    for dlq in run.queues.values():
        if dlq.role == "dlq" and dlq.channel == queue.channel and dlq.arn not in run.removed:
            run._plan_dlq(dlq, queue, source_gone=True)


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
    remaining: Callable[[], float] | None = None,
    log: Any = None,
) -> CleanerOutcome:
    """The Lambda's work: make sure the report can be posted, judge everything, log and post
    the plan before deleting anything (nothing is deleted when it cannot be posted), delete,
    then log and post what was done. The caller records metrics, then calls
    `raise_for_failure` (stopped early, a deletion failed, not posted)."""
    notifier.prepare()  # never delete anything that could then not be reported
    log = log or logger
    plan_posted = False

    def confirm(plan: CleanerReport) -> bool:
        nonlocal plan_posted
        log.info("resource cleaner plan", extra={"report": CleanerOutcome(plan, False)
                                                  .report_log()})
        plan_posted = post_all(notifier, cleaner_messages(plan), remaining, log)
        return plan_posted

    report = clean_resources(clients, settings.namespace, settings.dry_run, now,
                             remaining=remaining, log=log, confirm=confirm)
    log.info("resource cleaner report", extra={"report": CleanerOutcome(report, False)
                                                .report_log()})
    if not report.has_findings:
        return CleanerOutcome(report, False)
    # after a posted plan, the outcome post says what was done (the rest was in the plan)
    posted = post_all(notifier, cleaner_messages(report, outcome_only=plan_posted),
                      remaining, log)
    return CleanerOutcome(report, posted)
