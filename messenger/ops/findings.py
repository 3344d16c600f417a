"""What the operations Lambdas found: the report types that the checks fill and `report` renders."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class QueueProblem:
    """A queue over its threshold. oldest_age_seconds: None when CloudWatch has no datapoint."""

    name: str
    channel: str
    depth: int
    threshold: int
    oldest_age_seconds: float | None
    critical: bool
    owner: str = ""
    team: str = ""
    #: The queue's ARN (its console link in the report); '' when unknown.
    arn: str = ""
    #: "paused by <who> at <time>" when an operator paused the channel's consumers
    #: (`messenger pause`: the depth is expected to grow), else "".
    paused: str = ""


@dataclass(frozen=True)
class QueueAlarmReport:
    """What one run found: `problems` critical first, then deepest first."""

    scope: str
    namespace: str
    checked_at: datetime
    checked: int
    problems: tuple[QueueProblem, ...] = field(default_factory=tuple)
    #: Why the run stopped before checking every queue (an error, the Lambda's time), or None.
    stopped: str | None = None
    #: Queues whose depth was not read because the run stopped first.
    not_checked: tuple[str, ...] = ()
    #: Threshold tags that are not a whole number >= 0 (the default applied instead):
    #: (queue, tag, value, threshold used).
    bad_tags: tuple[tuple[str, str, str, int], ...] = ()
    #: What a deploy had undone of an operator's pause and the run put back (a tag, a Lambda
    #: mapping re-enabled), and what it could not (`messenger.ops.pauses`): one line each.
    pauses_reapplied: tuple[str, ...] = ()
    pause_errors: tuple[str, ...] = ()
    #: What the run's workflow sweep did (`messenger.ops.workflow_sweep`: counts by name), and
    #: its error ('' when none).
    workflows_swept: tuple[tuple[str, int], ...] = ()
    workflow_error: str = ""

    @property
    def critical(self) -> tuple[QueueProblem, ...]:
        return tuple(p for p in self.problems if p.critical)

    @property
    def has_news(self) -> bool:
        """Something to post: a queue over its threshold, a malformed threshold tag, a pause
        put back (or not), or a run that stopped early."""
        return bool(self.problems or self.bad_tags or self.pauses_reapplied
                    or self.pause_errors) or self.stopped is not None



@dataclass(frozen=True)
class Finding:
    """One reported resource: its name, why, and the CloudFormation stack that owns it (if any)."""

    name: str
    detail: str
    stack: str | None = None
    #: 'team <t> · owner <o>' from the resource's tags ('' when untagged): reports group by it.
    owner: str = ""


@dataclass(frozen=True)
class CleanerReport:
    """What one run did (or, in a dry run, would do)."""

    namespace: str
    dry_run: bool
    checked_at: datetime
    topics_checked: int
    queues_checked: int
    deleted_topics: tuple[Finding, ...] = ()
    deleted_queues: tuple[Finding, ...] = ()
    stale: tuple[Finding, ...] = ()
    no_producers: tuple[Finding, ...] = ()
    no_consumers: tuple[Finding, ...] = ()
    kept_by_stack: tuple[Finding, ...] = ()
    failed: tuple[Finding, ...] = ()
    #: Inactive topics not deleted because a queue that stays is subscribed to them.
    kept_topics: tuple[Finding, ...] = ()
    #: Unused, tagged for the namespace but named outside its '<namespace>-' prefix: not deleted.
    kept_outside_prefix: tuple[Finding, ...] = ()
    #: Why the run stopped before judging everything (an error, the Lambda's time), or None.
    stopped: str | None = None
    #: What the run did not get to, when it stopped early.
    not_checked: tuple[Finding, ...] = ()
    #: Unused resources judged deletable but not deleted: the run stopped first, or the plan
    #: could not be posted.
    not_deleted: tuple[Finding, ...] = ()
    #: Queues actually deleted, DLQs included (none in a dry run).
    queues_removed: int = 0
    #: True for the plan posted before deleting: deleted_* are what is about to be deleted.
    planned: bool = False

    @property
    def has_findings(self) -> bool:
        return bool(self.stopped) or any(
            (self.deleted_topics, self.deleted_queues, self.stale, self.no_producers,
             self.no_consumers, self.kept_by_stack, self.failed, self.kept_topics,
             self.kept_outside_prefix, self.not_deleted)
        )
