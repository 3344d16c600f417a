"""A namespace's one-time schedules in EventBridge Scheduler: create, list, find, cancel.

Every scheduled job of a namespace is a schedule in its group `<namespace->messenger`
(`messenger.channel.schedule_group_name`), named '<channel key>.<job key>'
(`messenger.jobs.schedules.schedule_name`), with `ActionAfterCompletion=DELETE`: a schedule that
still exists has not fired. Scheduler assumes the role `<namespace->messenger-scheduler` to send
it and puts what it could not deliver, after its retries, in `<namespace->messenger-schedules-dlq`.
The CDK app deploys all three; with provisioning=auto a missing one is created at first use.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from botocore.exceptions import ClientError

from messenger.aws import ClientFactory, error_code
from messenger.channel import (
    SQS_MAX_RETENTION_SECONDS,
    TAG_MANAGED,
    TAG_NAMESPACE,
    TAG_ROLE,
    schedule_dlq_name,
    schedule_group_name,
    scheduler_role_name,
)
from messenger.errors import ChannelNotFound, InvalidMessage, MessengerError
from messenger.jobs.schedules import (
    channel_key,
    channel_prefix,
    job_key,
    legacy_job_key,
    parse_at,
    retry_policy,
    schedule_name,
    target_arn,
)
from messenger.jobs.status import StatusEvent, StatusRecord, StatusStore
from messenger.message import MESSAGE_ID_ATTRIBUTE
from messenger.provision import Provisioner
from messenger.settings import Settings

logger = logging.getLogger("messenger.schedules")

#: ListSchedules returns at most 100 schedules a page.
LIST_PAGE_SIZE = 100


class ScheduleNotFound(MessengerError):
    """No scheduled job has this id: it never existed, already fired or was cancelled."""


class ScheduleNameTaken(InvalidMessage):
    """A job's schedule name holds another job (another id or destination): nothing was
    scheduled, and the other job is left alone (a 400 at the HTTP API: give another id)."""


@dataclass(frozen=True)
class ScheduledJob:
    """One job waiting in Scheduler: its id, channel key, schedule and when it is due."""

    job_id: str
    name: str
    group: str
    due: datetime | None
    target: str
    #: The queue URL or topic ARN it is sent to.
    destination: str
    state: str

    @property
    def channel_key(self) -> str:
        return self.name.partition(".")[0]


def job_of(schedule: dict[str, Any]) -> ScheduledJob:
    """The ScheduledJob of a GetSchedule answer (its job id read from the target's input)."""
    target = schedule.get("Target", {})
    try:
        request = json.loads(target.get("Input") or "{}")
    except ValueError:
        request = {}
    attributes = request.get("MessageAttributes") or {}
    job_id = str(attributes.get(MESSAGE_ID_ATTRIBUTE, {}).get("StringValue") or "")
    return ScheduledJob(
        job_id=job_id or schedule["Name"].partition(".")[2],
        name=schedule["Name"],
        group=schedule.get("GroupName", ""),
        due=parse_at(schedule.get("ScheduleExpression", ""),
                     schedule.get("ScheduleExpressionTimezone") or "UTC"),
        target=target.get("Arn", ""),
        destination=str(request.get("QueueUrl") or request.get("TopicArn") or ""),
        state=schedule.get("State", ""),
    )


@dataclass(frozen=True)
class Scheduled:
    """What `ScheduleStore.schedule` did: `created` True, this push made the schedule `arn`;
    False, the job id was scheduled already (another push) and `existing` is that job, which
    stands as it was (its due time, its body): this push is a duplicate, not scheduled."""

    arn: str
    created: bool
    existing: ScheduledJob | None = None


#: Where a schedule's Description carries the push that made it (`ScheduleStore.schedule`).
_PUSH_MARK = "push "


class ScheduleStore:
    """One-time schedules of a namespace (thread-safe). provisioner: for the account, the key and
    auto-provisioning (default: one of its own)."""

    def __init__(self, clients: ClientFactory, settings: Settings,
                 provisioner: Provisioner | None = None) -> None:
        self.clients = clients
        self.settings = settings
        self.provisioner = provisioner or Provisioner(clients, settings)
        self.group = schedule_group_name(settings.namespace)
        self._lock = threading.Lock()
        self._wiring: tuple[str, str] | None = None

    @property
    def scheduler(self) -> Any:
        return self.clients.client("scheduler")

    # -- the group, role and DLQ ----------------------------------------------------------
    def wiring(self) -> tuple[str, str]:
        """(role ARN, DLQ ARN) of the namespace's schedules; the group, role and DLQ are created
        when missing (provisioning=auto) or checked (verify: ChannelNotFound)."""
        with self._lock:
            if self._wiring is None:
                self._ensure_group()
                self._wiring = (self._ensure_role(), self._ensure_dlq())
            return self._wiring

    def _ensure_group(self) -> None:
        try:
            self.scheduler.get_schedule_group(Name=self.group)
            return
        except ClientError as error:
            if error_code(error) != "ResourceNotFoundException":
                raise
        if not self.provisioner.auto:
            raise ChannelNotFound(self.provisioner.describe_missing(
                f"schedule group {self.group!r}"))
        tags = [{"Key": TAG_MANAGED, "Value": "true"}]
        if self.settings.namespace:
            tags.append({"Key": TAG_NAMESPACE, "Value": self.settings.namespace})
        try:
            self.scheduler.create_schedule_group(Name=self.group, Tags=tags)
        except ClientError as error:
            if error_code(error) != "ConflictException":  # another producer made it
                raise

    def _ensure_role(self) -> str:
        if self.settings.scheduler_role_arn:  # deployed for this producer (the HTTP API's)
            return self.settings.scheduler_role_arn
        name = scheduler_role_name(self.settings.namespace)
        arn = f"arn:aws:iam::{self.provisioner.account_id}:role/{name}"
        if not self.provisioner.auto:
            return arn  # deployed by the CDK app; producers may not read IAM
        iam = self.clients.client("iam")
        try:
            iam.get_role(RoleName=name)
            return arn
        except ClientError as error:
            if error_code(error) != "NoSuchEntity":
                raise
        trust = {"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Principal": {"Service": "scheduler.amazonaws.com"},
            "Action": "sts:AssumeRole",
            "Condition": {"StringEquals": {"aws:SourceAccount": self.provisioner.account_id}},
        }]}
        # The namespace's own queues and topics by their tags, as the CDK app's role
        # (stacks/ownership.py): a name prefix is no boundary ('shop-*' matches namespace
        # shop-eu's queues, the default namespace has none); the schedule DLQ by its ARN.
        managed = {f"aws:ResourceTag/{TAG_MANAGED}": "true"}
        ours: dict[str, Any] = (
            {"StringEquals": {**managed,
                              f"aws:ResourceTag/{TAG_NAMESPACE}": self.settings.namespace}}
            if self.settings.namespace else
            {"StringEquals": managed, "Null": {f"aws:ResourceTag/{TAG_NAMESPACE}": "true"}})
        policy = {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": "sqs:SendMessage",
             "Resource": self.provisioner.arn("sqs", "*"), "Condition": ours},
            {"Effect": "Allow", "Action": "sqs:SendMessage",
             "Resource": self.provisioner.arn("sqs", schedule_dlq_name(self.settings.namespace))},
            {"Effect": "Allow", "Action": "sns:Publish",
             "Resource": self.provisioner.arn("sns", "*"), "Condition": ours},
            {"Effect": "Allow", "Action": ["kms:GenerateDataKey", "kms:Decrypt"],
             "Resource": self.provisioner.key_arn()},
        ]}
        try:
            iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust),
                            Tags=[{"Key": TAG_MANAGED, "Value": "true"}])
        except ClientError as error:
            if error_code(error) != "EntityAlreadyExists":
                raise
        iam.put_role_policy(RoleName=name, PolicyName="send-scheduled-jobs",
                            PolicyDocument=json.dumps(policy))
        return arn

    def _ensure_dlq(self) -> str:
        name = schedule_dlq_name(self.settings.namespace)
        found = self.provisioner.find_queue(name)
        if found is not None:
            return found.arn
        if not self.provisioner.auto:
            raise ChannelNotFound(self.provisioner.describe_missing(f"schedule DLQ {name!r}"))
        # Not tagged messenger:managed: the resource cleaner must never take a quiet schedule DLQ
        # for an unused channel queue.
        tags = {TAG_ROLE: "schedule-dlq"}
        if self.settings.namespace:
            tags[TAG_NAMESPACE] = self.settings.namespace
        self.clients.client("sqs").create_queue(
            QueueName=name,
            Attributes={"MessageRetentionPeriod": str(SQS_MAX_RETENTION_SECONDS),
                        "KmsMasterKeyId": self.provisioner.key_arn()},
            tags=tags,
        )
        return self.provisioner.arn("sqs", name)

    # -- one-time schedules ---------------------------------------------------------------
    def create(self, channel: str, job_id: str, due: datetime, kind: str, request: str) -> str:
        """Schedule `request` (the universal target's input, `schedules.target_input`) to be
        sent once at `due`; returns the schedule's ARN. A job id scheduled already keeps its
        first schedule (`schedule` says which happened)."""
        return self.schedule(channel, job_id, due, kind, request).arn

    def schedule(self, channel: str, job_id: str, due: datetime, kind: str, request: str,
                 push: str = "") -> Scheduled:
        """Schedule `request` to be sent once at `due`, unless the job id is scheduled on the
        channel already: then the first schedule stands and this one is not made (`created`
        False, `existing` the waiting job). push: a token of this push (its Description holds
        it), so a CreateSchedule that was applied but answered with an error, then retried,
        is recognised as this push's own schedule, not a duplicate. ScheduleNameTaken when the
        name holds another job (another id, or another destination)."""
        role, dlq = self.wiring()
        name = schedule_name(channel, job_id)
        description = f"messenger job {job_id} on {channel}"
        idempotency: dict[str, str] = {}
        if push:
            description = f"{_PUSH_MARK}{push}: {description}"
            # Scheduler's own idempotency: a retry of this push's request is not a conflict
            # (the Description mark covers an endpoint that does not keep client tokens).
            idempotency["ClientToken"] = push
        try:
            created = self.scheduler.create_schedule(
                **idempotency,
                Name=name,
                GroupName=self.group,
                ScheduleExpression=f"at({due.astimezone(timezone.utc):%Y-%m-%dT%H:%M:%S})",
                ScheduleExpressionTimezone="UTC",
                FlexibleTimeWindow={"Mode": "OFF"},
                ActionAfterCompletion="DELETE",
                Description=description[:512],
                Target={
                    "Arn": target_arn(kind),
                    "RoleArn": role,
                    "Input": request,
                    "DeadLetterConfig": {"Arn": dlq},
                    "RetryPolicy": retry_policy(),
                },
            )
            return Scheduled(str(created["ScheduleArn"]), created=True)
        except ClientError as error:
            if error_code(error) != "ConflictException":
                raise
        try:
            found = self.scheduler.get_schedule(Name=name, GroupName=self.group)
        except ClientError as error:
            if error_code(error) != "ResourceNotFoundException":
                raise
            # It fired (and deleted itself) or was cancelled in between: the job id was taken.
            logger.info("job %s on %s was scheduled already and is gone now (fired or "
                        "cancelled): this push is a duplicate", job_id, channel)
            return Scheduled("", created=False)
        existing = job_of(found)
        ours = json.loads(request)
        destination = str(ours.get("QueueUrl") or ours.get("TopicArn") or "")
        if existing.job_id != job_id or existing.destination != destination:
            raise ScheduleNameTaken(
                f"schedule {name!r} holds job {existing.job_id!r} to {existing.destination}, "
                f"not job {job_id!r} to {destination}: nothing was scheduled (give the job "
                f"another id)")
        arn = str(found["Arn"])
        if push and str(found.get("Description", "")).startswith(f"{_PUSH_MARK}{push}:"):
            return Scheduled(arn, created=True)  # this push's own, its create retried
        logger.info("job %s on %s is scheduled already (due %s): its first schedule stands, "
                    "this push is a duplicate", job_id, channel, existing.due)
        return Scheduled(arn, created=False, existing=existing)

    def _names(self, prefix: str | None = None) -> Iterator[str]:
        paginator = self.scheduler.get_paginator("list_schedules")
        kwargs: dict[str, Any] = {"GroupName": self.group}
        if prefix:
            kwargs["NamePrefix"] = prefix
        try:
            for page in paginator.paginate(**kwargs, PaginationConfig={
                    "PageSize": LIST_PAGE_SIZE}):
                for summary in page.get("Schedules", []):
                    yield str(summary["Name"])
        except ClientError as error:
            if error_code(error) != "ResourceNotFoundException":
                raise  # no group: nothing was ever scheduled in this namespace

    def _get(self, name: str) -> ScheduledJob | None:
        try:
            return job_of(self.scheduler.get_schedule(Name=name, GroupName=self.group))
        except ClientError as error:
            if error_code(error) != "ResourceNotFoundException":
                raise
            return None  # fired (and deleted) or cancelled since it was listed

    def list(self, channel: str) -> list[ScheduledJob]:
        """The channel's jobs still waiting, soonest first (one GetSchedule each: the list
        holds no due times)."""
        jobs = [job for name in self._names(channel_prefix(channel))
                if (job := self._get(name)) is not None]
        far = datetime.max.replace(tzinfo=timezone.utc)
        return sorted(jobs, key=lambda job: (job.due or far, job.name))

    def find(self, job_id: str, channel: str | None = None) -> ScheduledJob | None:
        """The waiting job `job_id` (None: unknown, fired or cancelled). Without its channel,
        the group's names are scanned for it (one page per 100 schedules)."""
        keys = [key for key in (job_key(job_id), legacy_job_key(job_id)) if key is not None]
        if channel is not None:
            names = [f"{channel_key(channel)}.{key}" for key in keys]
        else:
            suffixes = tuple(f".{key}" for key in keys)
            names = [name for name in self._names() if name.endswith(suffixes)]
        for name in names:
            # The name is not the proof: the job id its input carries is (a name made before
            # 'h.' hashes could hold another id's job).
            job = self._get(name)
            if job is not None and job.job_id == job_id:
                return job
        return None

    def cancel(self, job_id: str, channel: str | None = None, actor: str = "") -> ScheduledJob:
        """Cancel the job before it fires: it will not run. ScheduleNotFound when there is no
        such waiting job; TooLate (a ScheduleNotFound) when a firing of it was claimed by a
        consumer first (it runs, or ran). actor: who cancelled it (an operator's name),
        recorded on the job's status timeline (CANCELLED, reason 'cancelled by <who>') when
        the namespace keeps one.

        First the job's claim is taken on every consumer channel its schedule sends to (one
        conditional write, `messenger.jobs.fired.cancel`): a firing that races the cancel (the
        schedule fired and its message is in a queue, or Scheduler sends it while the schedule
        is deleted) finds the claim cancelled and is deleted unrun. Then the schedule is
        deleted."""
        from messenger.jobs import fired

        job = self.find(job_id, channel)
        if job is None:
            claim = fired.claim_of(self.clients, self.settings, channel, job_id) \
                if channel is not None else None
            if isinstance(claim, fired.FiredElsewhere):  # its schedule fired, a consumer took it
                raise TooLate(job_id, claim.claimed_at, claim.sqs_message_id, channel or "")
            raise ScheduleNotFound(
                f"no scheduled job {job_id!r} in schedule group {self.group!r}: unknown, "
                f"already fired or already cancelled")
        by = actor or "unknown"
        channels = self._consumer_channels(job)
        due = job.due.timestamp() if job.due is not None else 0.0
        first = fired.cancel(self.clients, self.settings, job.job_id, channels, by, due)
        if first is not None:
            raise TooLate(job.job_id, first[1].claimed_at, first[1].sqs_message_id, first[0])
        # Final now (it will not run): what waits on it advances. Before the schedule goes, so
        # that a failure here is finished by cancelling again.
        self._settle_cancelled(job, channel, by)
        try:
            self.scheduler.delete_schedule(Name=job.name, GroupName=self.group)
        except ClientError as error:
            if error_code(error) != "ResourceNotFoundException":
                raise  # marked: the job will not run; a cancel again deletes the schedule
            # fired just now: its message is deleted unrun where it arrives (the claim)
        self._record_cancelled(job, channel, actor)
        return job

    def _consumer_channels(self, job: ScheduledJob) -> tuple[str, ...]:
        """The consumer channels a job's schedule sends to, whose claims a cancel takes: its
        queue's channel, or the channel of every queue subscribed to its topic (read from
        their `messenger:channel` tags; a priority level's queue: its channel's)."""
        # in the subscriptions' order, once each
        return tuple(dict.fromkeys(self._queue_channel(url)
                                   for url in self._destination_queues(job)))

    def _destination_queues(self, job: ScheduledJob) -> tuple[str, ...]:
        """The URLs of the queues a job's schedule sends to: its queue, or every queue
        subscribed to its topic (a subscription of a deleted queue receives nothing)."""
        from messenger.provision import QUEUE_MISSING_CODES

        if not job.destination.startswith("arn:"):
            return (job.destination,)
        sns, sqs = self.clients.client("sns"), self.clients.client("sqs")
        urls: dict[str, None] = {}  # (the class's `list` hides the builtin here)
        for page in sns.get_paginator("list_subscriptions_by_topic").paginate(
                TopicArn=job.destination):
            for subscription in page.get("Subscriptions", []):
                if subscription.get("Protocol") != "sqs":
                    continue
                account, name = subscription["Endpoint"].split(":")[4:6]
                try:
                    url = sqs.get_queue_url(QueueName=name,
                                            QueueOwnerAWSAccountId=account)["QueueUrl"]
                except ClientError as error:
                    if error_code(error) not in QUEUE_MISSING_CODES:
                        raise
                    continue
                urls[str(url)] = None
        return tuple(urls)

    def _settle_cancelled(self, job: ScheduledJob, channel: str | None, by: str) -> None:
        """The job's final outcome CANCELLED, with what waits on it advanced
        (`Workflows.settle`), when a queue it goes to keeps results (its channel's
        `messenger:keep-results` tag; the outcome kept as long as that queue's retention)."""
        from messenger.channel import declared_keep_results
        from messenger.jobs.results import FinalOutcome, Outcome
        from messenger.jobs.workflows import Workflows

        sqs = self.clients.client("sqs")
        for url in self._destination_queues(job):
            tags = sqs.list_queue_tags(QueueUrl=url).get("Tags", {})
            if declared_keep_results(tags):
                break
        else:
            return
        retention = int(sqs.get_queue_attributes(
            QueueUrl=url, AttributeNames=["MessageRetentionPeriod"]).get(
            "Attributes", {}).get("MessageRetentionPeriod", SQS_MAX_RETENTION_SECONDS))
        due = f" before it was due ({job.due:%Y-%m-%d %H:%M:%S} UTC)" if job.due else ""
        outcome = FinalOutcome(job.job_id, channel or self._queue_channel(url),
                               Outcome.CANCELLED, time.time(), reason=f"cancelled by {by}{due}")
        Workflows(self.clients, self.settings).settle(outcome, retention)

    def _queue_channel(self, url: str) -> str:
        """The consumer channel of a queue: its tags', else its name without the namespace
        and '.fifo'."""
        from messenger.channel import FIFO_SUFFIX, TAG_CHANNEL, TAG_PRIORITY_CHANNEL

        tags = self.clients.client("sqs").list_queue_tags(QueueUrl=url).get("Tags", {})
        channel = tags.get(TAG_PRIORITY_CHANNEL) or tags.get(TAG_CHANNEL)
        if channel:
            return str(channel)
        name = url.rstrip("/").rsplit("/", 1)[-1].removesuffix(FIFO_SUFFIX)
        prefix = f"{self.settings.namespace}-" if self.settings.namespace else ""
        return name.removeprefix(prefix)

    def _record_cancelled(self, job: ScheduledJob, channel: str | None, actor: str) -> None:
        """CANCELLED on the job's timeline, with who and when (as an operator's requeue or
        delete records itself), when the namespace has a status table. Its channel is the one
        given, else the one its SCHEDULED record names (one Query), else the schedule's."""
        status = StatusStore(self.clients, self.settings)
        if not status.exists():
            return
        if channel is None:
            named = [r.channel for r in status.timeline(job.job_id)]
            channel = named[0] if named else job.channel_key
        due = f" before it was due ({job.due:%Y-%m-%d %H:%M:%S} UTC)" if job.due else ""
        by = actor or "unknown"
        status.record(StatusRecord(job.job_id, StatusEvent.CANCELLED, channel, actor=by,
                                   error=f"cancelled by {by}{due}"))
        status.flush()


class TooLate(ScheduleNotFound):
    """A cancel that came after a consumer claimed a firing of the job (`fired_at`, epoch s):
    the job runs or ran; nothing was cancelled."""

    def __init__(self, job_id: str, fired_at: float, sqs_message_id: str, channel: str
                 ) -> None:
        when = datetime.fromtimestamp(fired_at, timezone.utc)
        super().__init__(f"too late: scheduled job {job_id!r} fired at "
                         f"{when:%Y-%m-%d %H:%M:%S} UTC (taken by SQS message "
                         f"{sqs_message_id} on {channel}); not cancelled")
        self.job_id, self.fired_at, self.channel = job_id, fired_at, channel
