"""Queue alarm: platform queues deeper than their alarm threshold, critical ones first.

One function serves two schedules: source queues (`{"scope": "source"}`, every 15 minutes) and
dead-letter queues (`{"scope": "dlq"}`, every 12 hours). Cost per run for N channels (N queues
and N DLQs), M of the scope's queues holding messages: ceil(2N/1000) ListQueues + ceil(N/250)
GetMetricData + ceil(M/100) GetResources calls, whatever the tags per queue (7 calls for 1,000
channels with 100 queues holding messages; at most 16 when every one of them does).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from messenger.aws import ClientFactory
from messenger.channel import (
    TAG_ALARM_THRESHOLD,
    TAG_DLQ_ALARM_THRESHOLD,
    TAG_MANAGED,
    TAG_NAMESPACE,
)
from messenger.errors import MessengerError
from messenger.jobs.controls import TAG_PAUSED, PauseMark
from messenger.ops.findings import QueueAlarmReport, QueueProblem
from messenger.ops.inventory import (
    PlatformResource,
    list_queue_urls,
    queue_arn,
    role_by_name,
    tags_by_arn,
)
from messenger.ops.metrics import MAX_QUERIES_PER_CALL, fetch_series, latest, sqs_metric
from messenger.ops.pauses import reapply_pauses
from messenger.ops.report import (
    Notifier,
    ReportNotDelivered,
    post_all,
    queue_alarm_messages,
    short_of_time,
)
from messenger.ops.settings import OpsSettings
from messenger.ops.workflow_sweep import sweep_workflows
from messenger.settings import Settings

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


class PauseNotReapplied(MessengerError):
    """A pause that a deploy undid could not be put back: that channel may be consuming."""


class WorkflowSweepFailed(MessengerError):
    """The workflow sweep failed (held jobs and groups wait for the next run's)."""


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
            "malformed_threshold_tags": [
                f"{queue}: {tag}={value!r}" for queue, tag, value, _ in self.report.bad_tags],
            "pauses_reapplied": list(self.report.pauses_reapplied),
            "pause_errors": list(self.report.pause_errors),
            "workflows_swept": dict(self.report.workflows_swept),
            "workflow_error": self.report.workflow_error,
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
            "MalformedThresholdTags": len(self.report.bad_tags),
            "PausesReapplied": len(self.report.pauses_reapplied),
            "PauseErrors": len(self.report.pause_errors),
            "WorkflowItemsSwept": dict(self.report.workflows_swept).get("looked", 0),
            "WorkflowSweepFailed": int(bool(self.report.workflow_error)),
        }

    def raise_for_failure(self) -> None:
        """Fail the invocation when the run stopped early, when a pause could not be put back
        (a paused channel may be consuming), or when there was something to report and it was
        not delivered (after the report was logged and posted)."""
        if self.report.stopped:
            raise AlarmStopped(
                f"queue alarm stopped early: {self.report.stopped} "
                f"({len(self.report.not_checked)} queues not checked, "
                f"{len(self.report.problems)} over threshold; report "
                f"{'posted' if self.posted else 'NOT posted'}, full report in the log)"
            )
        if self.report.pause_errors:
            raise PauseNotReapplied(
                f"the queue alarm could not put back {len(self.report.pause_errors)} "
                f"pause(s) a deploy undid: {self.report.pause_errors[0]}"
                f"{' …' if len(self.report.pause_errors) > 1 else ''} (report "
                f"{'posted' if self.posted else 'NOT posted'}, full report in the log)"
            )
        if self.report.workflow_error:
            raise WorkflowSweepFailed(
                f"the queue alarm's workflow sweep failed: {self.report.workflow_error} "
                f"(queue report {'posted' if self.posted else 'not needed or NOT posted'}; "
                f"the next run sweeps again)")
        if self.report.pauses_reapplied and not self.posted:
            raise ReportNotDelivered(
                f"the queue alarm put back {len(self.report.pauses_reapplied)} pause(s) a "
                f"deploy undid and could not post that to Slack; it is in the log"
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
    alarms). No datapoint: not a problem (SQS keeps reporting any queue that holds messages).
    A threshold tag that is not a whole number >= 0 ('abc', '-5', '1e3') is reported
    (`bad_tags`, logged, posted) and the default applies; only the tags of queues holding
    messages are read, so such a tag shows once its queue holds messages.

    The cost does not depend on how many tags the queues carry: the queues named
    `<namespace>-*` are listed (ListQueues, 1,000 per call; '' lists every queue), their depth
    and age read (GetMetricData, 250 queues per call), and only the queues holding messages
    have their tags read (GetResources by ARN, 100 per call), which decide whether a queue is
    the platform's, of this namespace and of this scope (a queue's and its `-dlq`'s names
    already tell the two roles apart, so the other role's queues are not read). `checked`
    counts the queues read: named in the namespace and, by name, of this scope or unknown.

    remaining: seconds the invocation has left; under `margin`, or on any error (a broken
    connection, a timeout, a refused call), the run stops: the report holds the problems found
    so far, `stopped` says why and `not_checked` names the queues not judged.
    """
    now = now or datetime.now(UTC)
    role = SCOPES[scope]
    try:
        urls = list_queue_urls(clients, f"{namespace}-" if namespace else "")
    except Exception as error:  # nothing checked: the report says so, the invocation fails
        logger.exception("queue alarm could not list the queues")
        return QueueAlarmReport(scope, namespace, now, 0, stopped=(
            f"{type(error).__name__} while listing the queues: {error}; no queue was checked"))
    by_name = {url.rstrip("/").rsplit("/", 1)[-1]: url for url in urls}
    queues = sorted(name for name, seen in role_by_name(by_name).items() if seen in (role, None))
    scan = _DepthScan(clients.client("cloudwatch"), now, remaining, margin)
    scan.read(queues)
    not_judged = queues[scan.done :]
    holding = sorted(scan.depths)  # the queues read that hold messages: their tags decide
    arns = {name: queue_arn(by_name[name], clients.region) for name in holding}
    tags = scan.read_tags(clients, list(arns.values())) if holding else {}
    problems: list[QueueProblem] = []
    bad_tags: list[tuple[str, str, str, int]] = []
    if tags is None:
        not_judged = holding + not_judged
    else:
        for name in holding:
            queue = PlatformResource(arn=arns[name], tags=tags.get(arns[name], {}))
            if not _ours(queue, namespace, role):
                continue
            depth, age = scan.depths[name]
            threshold = queue.alarm_threshold(default_threshold, dlq_threshold)
            tag = TAG_DLQ_ALARM_THRESHOLD if role == "dlq" else TAG_ALARM_THRESHOLD
            value = queue.tags.get(tag)
            if value is not None and not (value.isascii() and value.isdigit()):
                bad_tags.append((name, tag, value, threshold))
                logger.warning("malformed threshold tag: the default applies",
                               extra={"queue": name, "tag": tag, "value": value})
            if depth > threshold:
                problems.append(_problem(queue, int(depth), threshold, age))
    problems.sort(key=lambda p: (not p.critical, -p.depth, p.name))
    return QueueAlarmReport(
        scope, namespace, now, len(queues) - len(not_judged), tuple(problems),
        stopped=scan.stopped, not_checked=tuple(not_judged) if scan.stopped else (),
        bad_tags=tuple(bad_tags),
    )


class _DepthScan:
    """Reads queue depths (then tags) until done, an error or the margin; `stopped` says why."""

    def __init__(self, cloudwatch: Any, now: datetime,
                 remaining: Callable[[], float] | None, margin: float) -> None:
        self.cloudwatch, self.now, self.remaining, self.margin = cloudwatch, now, remaining, margin
        #: name -> (depth, age of the oldest message) of the queues read that hold messages
        self.depths: dict[str, tuple[float, float | None]] = {}
        self.done = 0  # queues read (a prefix of the list)
        self.stopped: str | None = None
        self.out_of_time = False

    def read(self, queues: list[str]) -> None:
        for start in range(0, len(queues), QUEUES_PER_CALL):
            if self._late():
                return
            batch = queues[start : start + QUEUES_PER_CALL]
            requests = [sqs_metric(name, metric, "Maximum") for name in batch
                        for metric in (DEPTH_METRIC, AGE_METRIC)]
            try:
                series = fetch_series(self.cloudwatch, requests, self.now - LOOKBACK, self.now,
                                      PERIOD_SECONDS)
            except Exception as error:
                logger.exception("queue alarm stopped reading metrics")
                self.stopped = (f"{type(error).__name__} while reading the metrics of "
                                f"{batch[0]} and {len(batch) - 1} more: {error}")
                return
            for index, name in enumerate(batch):
                depth = latest(series[2 * index])
                if depth is not None and depth > 0:
                    self.depths[name] = (depth, latest(series[2 * index + 1]))
            self.done += len(batch)

    def read_tags(self, clients: ClientFactory,
                  arns: list[str]) -> dict[str, dict[str, str]] | None:
        """The tags of `arns` (even after a failed metric read: what was read is judged), or
        None when out of time or on an error."""
        if self.out_of_time or self._late():
            return None
        try:
            return tags_by_arn(clients, arns)
        except Exception as error:
            logger.exception("queue alarm could not read the tags of its queues")
            why = (f"{type(error).__name__} while reading the tags of the {len(arns)} "
                   f"queues holding messages: {error}")
            self.stopped = f"{self.stopped}; then {why}" if self.stopped else why
            return None

    def _late(self) -> bool:
        late = short_of_time(self.remaining, self.margin)
        if late:
            self.stopped = self.stopped or late
            self.out_of_time = True
        return bool(late)


def _ours(queue: PlatformResource, namespace: str, role: str) -> bool:
    """Tagged as the platform's queue of `role` in `namespace` (none: no namespace tag)."""
    return (queue.tags.get(TAG_MANAGED) == "true" and queue.role == role
            and queue.tags.get(TAG_NAMESPACE, "") == namespace)


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
        arn=queue.arn,
        paused=str(mark) if (mark := PauseMark.parse(queue.tags.get(TAG_PAUSED))) else "",
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
    if scope == "source":  # every 15 minutes: put back what a deploy undid of a pause
        reapplied = reapply_pauses(clients, Settings.from_env(namespace=settings.namespace))
        report = replace(report, pauses_reapplied=tuple(reapplied.repaired),
                         pause_errors=tuple(reapplied.errors))
        # ... and finish what crashes left of the workflows (held jobs, groups)
        swept = sweep_workflows(clients, Settings.from_env(namespace=settings.namespace))
        report = replace(report, workflows_swept=tuple(swept.counts.items()),
                         workflow_error=swept.error)
    # logged before posting: a post that hangs until the Lambda's timeout loses nothing
    (log or logger).info("queue alarm report", extra={
        "report": {**QueueAlarmOutcome(report, False).summary(),
                   "details": QueueAlarmOutcome(report, False).report_log()}})
    posted = report.has_news and post_all(
        notifier, queue_alarm_messages(report, settings.critical_mention), remaining, log)
    return QueueAlarmOutcome(report, posted)
