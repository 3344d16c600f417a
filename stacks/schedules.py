"""Scheduled jobs in CDK: the namespace's Scheduler wiring, and recurring jobs declared in code.

```python
stack.add_schedule(reports, "nightly-report", cron="0 3 * * ? *", timezone="Europe/Berlin",
                   body={"kind": "daily"})
stack.add_schedule(reports, "hourly-sync", rate=Duration.hours(1), body={"kind": "sync"})
```

`ScheduleWiring` (in the platform stack): the schedule group `<namespace->messenger`, the
schedule DLQ `<namespace->messenger-schedules-dlq` and the role `<namespace->messenger-scheduler`
that Scheduler assumes to send producers' one-time jobs (`push(at=...)`), plus the managed policy
`producer_policy` that lets a producer create them (`grant_one_time(grantee)`).

`RecurringJob` (in a channel stack): one `AWS::Scheduler::Schedule` per `add_schedule` line, so a
deploy never doubles a schedule and removing the line removes it. Its universal target sends the
channel's SendMessage (or Publish) request; each firing's job id is
'<name>@<aws.scheduler.scheduled-time>' (`messenger.schedule_spec.RecurringSchedule`), so a
retried firing is the same job. Its role may send to this channel and the schedule DLQ only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_cdk import Aws, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from messenger.channel import (
    SQS_MAX_RETENTION_SECONDS,
    schedule_dlq_name,
    schedule_group_name,
    scheduler_role_name,
)
from messenger.schedule_spec import RecurringSchedule, retry_policy, target_arn
from stacks.channel import Channel
from stacks.nag import acknowledge, acknowledge_wildcard_resource
from stacks.ownership import any_name, ownership_condition, ownership_reason

SCHEDULER_PRINCIPAL = "scheduler.amazonaws.com"
#: What a producer does with its one-time schedules (create; list/get/cancel for the CLI).
PRODUCER_ACTIONS = ("scheduler:CreateSchedule", "scheduler:GetSchedule",
                    "scheduler:DeleteSchedule")
SCHEDULES_REASON = ("one schedule per job, named by its job id at push time, within the "
                    "namespace's own schedule group only (named exactly)")
LIST_SCHEDULES_REASON = ("scheduler:ListSchedules has no resource types in IAM (the Service "
                         "Authorization Reference): '*' is its only resource; it reads "
                         "schedule names")


def _scheduler_role(scope: Construct, id: str, **kwargs: Any) -> iam.Role:
    """A role only Scheduler of this account may assume (confused-deputy guard)."""
    return iam.Role(
        scope, id,
        assumed_by=iam.ServicePrincipal(SCHEDULER_PRINCIPAL, conditions={
            "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}}),
        **kwargs,
    )


class ScheduleWiring(Construct):
    """The schedule group, DLQ and scheduler role of one namespace.

    namespace: physical name prefix. key: the platform CMK (the DLQ's key; the role may use it
    to send to encrypted queues). removal_policy: of the DLQ (default RETAIN: undelivered jobs
    survive a stack deletion). Exposes `.group` (CfnScheduleGroup), `.group_name`, `.dlq`,
    `.role`, `.producer_policy`."""

    def __init__(self, scope: Construct, id: str, *, namespace: str, key: kms.IKey,
                 removal_policy: RemovalPolicy = RemovalPolicy.RETAIN) -> None:
        super().__init__(scope, id)
        self.namespace = namespace
        self.key = key
        self.group_name = schedule_group_name(namespace)
        self.group = scheduler.CfnScheduleGroup(self, "Group", name=self.group_name)
        self.dlq = sqs.Queue(
            self, "DeadLetters", queue_name=schedule_dlq_name(namespace),
            encryption=sqs.QueueEncryption.KMS, encryption_master_key=key,
            enforce_ssl=True, retention_period=Duration.seconds(SQS_MAX_RETENTION_SECONDS),
            removal_policy=removal_policy,
        )
        acknowledge(self.dlq, "AwsSolutions-SQS3",
                    "this queue is itself the dead-letter queue of the namespace's schedules "
                    "(Scheduler's DeadLetterConfig), which cdk-nag cannot see")
        prefix = f"{namespace}-" if namespace else ""
        # Any producer of the namespace schedules jobs on any of its channels, made at deploy
        # or at run time: the namespace's tags decide (`stacks.ownership`), not a name prefix
        # ('shop-*' would match namespace shop-eu's queues; '' has no prefix at all).
        self.queues_arn = any_name("sqs")
        self.topics_arn = any_name("sns")
        self.role = _scheduler_role(self, "Role", role_name=scheduler_role_name(namespace),
                                    description="EventBridge Scheduler sends the namespace's "
                                                "one-time jobs")
        self.role.add_to_principal_policy(iam.PolicyStatement(
            sid="SendToTheNamespacesQueues", actions=["sqs:SendMessage"],
            resources=[self.queues_arn], conditions=ownership_condition(namespace)))
        self.role.add_to_principal_policy(iam.PolicyStatement(
            sid="PublishToTheNamespacesTopics", actions=["sns:Publish"],
            resources=[self.topics_arn], conditions=ownership_condition(namespace)))
        # Undeliverable jobs: Scheduler sends them to the schedule DLQ as this role.
        self.role.add_to_principal_policy(iam.PolicyStatement(
            sid="DeadLetterUndeliverableJobs", actions=["sqs:SendMessage"],
            resources=[self.dlq.queue_arn]))
        key.grant(self.role, "kms:GenerateDataKey", "kms:Decrypt")
        for pattern in (self.queues_arn, self.topics_arn):
            acknowledge_wildcard_resource(self.role, pattern, ownership_reason(namespace))
        self.schedules_arn = (f"arn:{Aws.PARTITION}:scheduler:{Aws.REGION}:{Aws.ACCOUNT_ID}:"
                              f"schedule/{self.group_name}/*")
        self.group_arn = (f"arn:{Aws.PARTITION}:scheduler:{Aws.REGION}:{Aws.ACCOUNT_ID}:"
                          f"schedule-group/{self.group_name}")
        self.producer_policy = iam.ManagedPolicy(
            self, "ProducerPolicy",
            managed_policy_name=f"{prefix}messenger-schedule-producers",
            description="create, read and cancel one-time jobs in the namespace's schedule group",
            statements=self.producer_statements(self.role),
        )
        acknowledge_wildcard_resource(
            self.producer_policy, self.schedules_arn, SCHEDULES_REASON)
        acknowledge_wildcard_resource(self.producer_policy, "*", LIST_SCHEDULES_REASON)

    def producer_statements(self, scheduler_role: iam.IRole) -> list[iam.PolicyStatement]:
        """What a producer needs for one-time jobs sent by `scheduler_role`: create, read and
        cancel them in the group, list them, find the schedule DLQ, pass that role (to
        Scheduler only)."""
        return [
            iam.PolicyStatement(actions=list(PRODUCER_ACTIONS), resources=[self.schedules_arn]),
            # No resource types in IAM: '*' is the only resource it can have.
            iam.PolicyStatement(actions=["scheduler:ListSchedules"], resources=["*"]),
            iam.PolicyStatement(actions=["scheduler:GetScheduleGroup"],
                                resources=[self.group_arn]),
            # A producer (provisioning=verify) finds the schedule DLQ's ARN by its URL.
            iam.PolicyStatement(actions=["sqs:GetQueueUrl"], resources=[self.dlq.queue_arn]),
            iam.PolicyStatement(
                actions=["iam:PassRole"], resources=[scheduler_role.role_arn],
                conditions={"StringEquals": {"iam:PassedToService": SCHEDULER_PRINCIPAL}}),
        ]

    def scheduler_role_for(self, scope: Construct, id: str,
                           channels: Sequence[Channel]) -> iam.Role:
        """A scheduler role of its own for producers that serve only `channels` (the HTTP API):
        it may send to those channels' queues or topics (exact ARNs) and the schedule DLQ, and
        nowhere else. The producer finds it by MESSENGER_SCHEDULER_ROLE_ARN."""
        role = _scheduler_role(scope, id, description="EventBridge Scheduler sends one-time "
                               "jobs to " + ", ".join(c.spec.name for c in channels))
        for channel in channels:
            channel.grant_publish(role, reads_tracking=False)  # Scheduler sends, reads no tag
        # Undeliverable jobs: Scheduler sends them to the DLQ as this role.
        role.add_to_principal_policy(iam.PolicyStatement(
            actions=["sqs:SendMessage"], resources=[self.dlq.queue_arn]))
        self.key.grant(role, "kms:GenerateDataKey", "kms:Decrypt")
        return role

    def grant_one_time(self, grantee: iam.IGrantable,
                       scheduler_role: iam.IRole | None = None) -> None:
        """Let `grantee` (a producer's role) create, read and cancel one-time jobs, sent by the
        namespace's scheduler role, or by `scheduler_role` (`scheduler_role_for`): then the
        grantee may pass only that one."""
        if scheduler_role is None and isinstance(grantee, iam.Role):
            grantee.add_managed_policy(self.producer_policy)
            return
        statements = self.producer_statements(scheduler_role or self.role)
        for statement in statements:
            grantee.grant_principal.add_to_principal_policy(statement)
        principal = grantee.grant_principal
        policy = principal.node.try_find_child("DefaultPolicy") \
            if isinstance(principal, iam.Role) else None
        if policy is not None:
            acknowledge_wildcard_resource(policy, self.schedules_arn, SCHEDULES_REASON)


class RecurringJob(Construct):
    """One recurring job on a channel: an `AWS::Scheduler::Schedule` and its own role.

    channel: where each firing's job goes (the default priority level's queue, or the
    exchange's topic). job: the validated `RecurringSchedule`. wiring: the namespace's
    `ScheduleWiring` (group and DLQ). Exposes `.schedule` (CfnSchedule) and `.role`."""

    def __init__(self, scope: Construct, id: str, *, channel: Channel, job: RecurringSchedule,
                 wiring: ScheduleWiring) -> None:
        super().__init__(scope, id)
        spec = channel.spec
        if channel.exchange is not None:
            kind, destination = "sns", channel.topic_arn_in(self)
        else:
            level = next(level for level in channel.levels
                         if level.spec.priority_level == spec.default_level)
            kind, destination = "sqs", level.queue.queue_url
        self.role = _scheduler_role(
            self, "Role", description=f"EventBridge Scheduler sends {job.name} to {spec.name}")
        channel.grant_publish(self.role, reads_tracking=False)  # Scheduler reads no tag
        # Not the queue's grant_send_messages: it adds wildcard KMS actions; grant_publish
        # gave the key's two actions already.
        self.role.add_to_principal_policy(iam.PolicyStatement(
            actions=["sqs:SendMessage"], resources=[wiring.dlq.queue_arn]))
        group_id = spec.queue if spec.ordered else None
        self.schedule = scheduler.CfnSchedule(
            self, "Schedule",
            name=job.name,
            group_name=wiring.group_name,
            description=f"messenger recurring job {job.name} on {spec.name}",
            schedule_expression=job.expression,
            schedule_expression_timezone=job.timezone,
            flexible_time_window=scheduler.CfnSchedule.FlexibleTimeWindowProperty(mode="OFF"),
            state="ENABLED",
            target=scheduler.CfnSchedule.TargetProperty(
                arn=target_arn(kind),
                role_arn=self.role.role_arn,
                input=job.input(kind, destination, ordered=spec.ordered, group_id=group_id),
                dead_letter_config=scheduler.CfnSchedule.DeadLetterConfigProperty(
                    arn=wiring.dlq.queue_arn),
                retry_policy=scheduler.CfnSchedule.RetryPolicyProperty(
                    maximum_retry_attempts=retry_policy()["MaximumRetryAttempts"],
                    maximum_event_age_in_seconds=retry_policy()["MaximumEventAgeInSeconds"]),
            ),
        )
        if Stack.of(wiring) is Stack.of(self):  # else the DLQ's export orders the stacks
            self.schedule.add_dependency(wiring.group)
