"""Queue alarm: platform queues deeper than their alarm threshold, critical ones first.

One function serves two schedules: source queues (`{"scope": "source"}`, every 15 minutes) and
dead-letter queues (`{"scope": "dlq"}`, every 12 hours). Cost per run for N queues: ceil(N/70)
GetResources pages + ceil(2N/500) GetMetricData calls (about 19 calls for 1,000 queues).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from messenger.aws import ClientFactory
from messenger.errors import MessengerError
from messenger.ops.findings import QueueAlarmReport, QueueProblem
from messenger.ops.inventory import PlatformResource, list_platform_resources
from messenger.ops.metrics import MAX_QUERIES_PER_CALL, fetch_series, latest, sqs_metric
from messenger.ops.report import (
    Notifier,
    ReportNotDelivered,
    post_all,
    queue_alarm_messages,
    short_of_time,
)
from messenger.ops.settings import OpsSettings

#: event["scope"] -> the role tag of the queues it checks.
SCOPES: Mapping[str, str] = {"source": "queue", "dlq": "dlq"}
DEPTH_METRIC = "ApproximateNumberOfMessagesVisible"
AGE_METRIC = "ApproximateAgeOfOldestMessage"
#: SQS publishes these every minute (five for basic monitoring) with some delay: the newest
#: datapoint of the last 30 minutes is the current value.
LOOKBACK = timedelta(minutes=30)
PERIOD_SECONDS = 60
#: Queues whose metrics (depth and age) one GetMetricData call reads: 500 queries.
QUEUES_PER_CALL = MAX_QUERIES_PER_CALL // 2
#: The run stops (and reports) when the Lambda has less than this left: time to post and log.
STOP_MARGIN_SECONDS = 45.0

logger = logging.getLogger("messenger.ops.queue_alarm")


class AlarmStopped(MessengerError):
    """The queue alarm stopped before it checked every queue (its report says which)."""


class InvalidEvent(MessengerError, ValueError):
    """A Lambda event does not have the expected shape."""


def parse_scope(event: Any) -> str:
    """The `scope` of a queue-alarm event: 'source' or 'dlq'."""
    scope = event.get("scope") if isinstance(event, Mapping) else None
    if scope not in SCOPES:
        raise InvalidEvent(
            f"event field 'scope' must be one of {', '.join(repr(s) for s in SCOPES)}, "
            f"got {scope!r}"
        )
    return str(scope)


@dataclass(frozen=True)
class QueueAlarmOutcome:
    report: QueueAlarmReport
    posted: bool

    def summary(self) -> dict[str, Any]:
        return {
            "scope": self.report.scope,
            "checked": self.report.checked,
            "problems": [p.name for p in self.report.problems],
            "critical": [p.name for p in self.report.critical],
            "stopped": self.report.stopped,
            "not_checked": list(self.report.not_checked),
            "posted": self.posted,
        }

    def report_log(self) -> list[dict[str, Any]]:
        """Every problem with its figures (for the log)."""
        return [
            {"queue": p.name, "depth": p.depth, "threshold": p.threshold,
             "oldest_age_seconds": p.oldest_age_seconds, "critical": p.critical,
             "owner": p.owner, "team": p.team}
            for p in self.report.problems
        ]

    def metrics(self) -> dict[str, int]:
        return {
            "QueuesChecked": self.report.checked,
            "QueuesOverThreshold": len(self.report.problems),
            "CriticalQueuesOverThreshold": len(self.report.critical),
            "SlackPostFailed": int(self.report.has_news and not self.posted),
            "AlarmStopped": int(self.report.stopped is not None),
        }

    def raise_for_failure(self) -> None:
        """Fail the invocation when the run stopped early, or when there was something to
        report and it was not delivered (after the report was logged and posted)."""
        if self.report.stopped:
            raise AlarmStopped(
                f"queue alarm stopped early: {self.report.stopped} "
                f"({len(self.report.not_checked)} queues not checked, "
                f"{len(self.report.problems)} over threshold; report "
                f"{'posted' if self.posted else 'NOT posted'}, full report in the log)"
            )
        if self.report.problems and not self.posted:
            raise ReportNotDelivered(
                f"the queue alarm ({len(self.report.problems)} queues over threshold: "
                f"{', '.join(p.name for p in self.report.problems[:5])}"
                f"{' …' if len(self.report.problems) > 5 else ''}) could not be posted to "
                f"Slack; it is in the log"
            )


def check_queues(
    clients: ClientFactory,
    scope: str,
    namespace: str,
    default_threshold: int,
    now: datetime | None = None,
    dlq_threshold: int = 0,
    remaining: Callable[[], float] | None = None,
    margin: float = STOP_MARGIN_SECONDS,
) -> QueueAlarmReport:
    """Compare each platform queue of `scope` ('source' or 'dlq') with its alarm threshold.

    A queue is a problem when its newest ApproximateNumberOfMessagesVisible is above its
    `messenger:alarm-threshold` tag (else `default_threshold`); for a DLQ, its
    `messenger:dlq-alarm-threshold` tag (else `dlq_threshold`, default 0: any dead letter
    alarms). No datapoint: not a problem
    (SQS keeps reporting any queue that holds messages).

    remaining: seconds the invocation has left; under `margin`, or on any error (a broken
    connection, a timeout, a refused call), the run stops: the report holds the problems found
    so far, `stopped` says why and `not_checked` names the queues not read.
    """
    now = now or datetime.now(UTC)
    try:
        queues = list_platform_resources(
            clients, namespace, roles=(SCOPES[scope],), resource_types=("sqs",)
        )
    except Exception as error:  # nothing checked: the report says so, the invocation fails
        logger.exception("queue alarm could not list the queues")
        return QueueAlarmReport(scope, namespace, now, 0, stopped=(
            f"{type(error).__name__} while listing the queues: {error}; no queue was checked"))
    problems: list[QueueProblem] = []
    stopped: str | None = None
    checked = 0
    cloudwatch = clients.client("cloudwatch")
    for start in range(0, len(queues), QUEUES_PER_CALL):
        batch = queues[start : start + QUEUES_PER_CALL]
        stopped = short_of_time(remaining, margin)
        if stopped:
            break
        requests = [
            sqs_metric(q.name, metric, "Maximum")
            for q in batch
            for metric in (DEPTH_METRIC, AGE_METRIC)
        ]
        try:
            series = fetch_series(cloudwatch, requests, now - LOOKBACK, now, PERIOD_SECONDS)
        except Exception as error:
            logger.exception("queue alarm stopped reading metrics")
            stopped = (f"{type(error).__name__} while reading the metrics of {batch[0].name} "
                       f"and {len(batch) - 1} more: {error}")
            break
        for index, queue in enumerate(batch):
            depth = latest(series[2 * index])
            threshold = queue.alarm_threshold(default_threshold, dlq_threshold)
            if depth is not None and depth > threshold:
                problems.append(
                    _problem(queue, int(depth), threshold, latest(series[2 * index + 1])))
        checked += len(batch)
    problems.sort(key=lambda p: (not p.critical, -p.depth, p.name))
    return QueueAlarmReport(
        scope, namespace, now, checked, tuple(problems), stopped=stopped,
        not_checked=tuple(q.name for q in queues[checked:]) if stopped else (),
    )


def _problem(
    queue: PlatformResource, depth: int, threshold: int, age: float | None
) -> QueueProblem:
    tags = queue.channel_tags
    return QueueProblem(
        name=queue.name,
        channel=queue.channel,
        depth=depth,
        threshold=threshold,
        oldest_age_seconds=age,
        critical=tags.critical,
        owner=tags.owner,
        team=tags.team,
    )


def run_queue_alarm(
    event: Any,
    clients: ClientFactory,
    settings: OpsSettings,
    notifier: Notifier,
    now: datetime | None = None,
    remaining: Callable[[], float] | None = None,
    log: Any = None,
) -> QueueAlarmOutcome:
    """The Lambda's work: check the event's scope, log the whole report, then post it when a
    queue is over its threshold or the run stopped early. The caller records metrics, then
    calls `raise_for_failure` (stopped early, not posted)."""
    scope = parse_scope(event)
    report = check_queues(
        clients, scope, settings.namespace, settings.default_alarm_threshold, now,
        dlq_threshold=settings.dlq_alarm_threshold, remaining=remaining,
    )
    # logged before posting: a post that hangs until the Lambda's timeout loses nothing
    (log or logger).info("queue alarm report", extra={
        "report": {**QueueAlarmOutcome(report, False).summary(),
                   "details": QueueAlarmOutcome(report, False).report_log()}})
    posted = report.has_news and post_all(
        notifier, queue_alarm_messages(report, settings.critical_mention), remaining, log)
    return QueueAlarmOutcome(report, posted)
