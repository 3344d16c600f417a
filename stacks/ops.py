"""`OpsFunctions`: the scheduled operations Lambdas (queue alerts, resource cleaner).

- queue alarm, `{"scope": "source"}` every 15 minutes: source queues above their threshold;
- queue alarm, `{"scope": "dlq"}` every 12 hours: dead-letter queues holding messages;
- resource cleaner, `{}` once a day: unused channel resources of the namespace.
Both report to Slack through a webhook URL kept in Secrets Manager (the secret must exist).

The watchers are watched: each function's errors raise a CloudWatch alarm, and a schedule event
that could not be delivered after its retries lands in a dead-letter queue that alarms too; all
alarms go to the `alarm_topic` (subscribe an e-mail, a pager or a chat integration to it).
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Aws, Duration, RemovalPolicy, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from messenger.channel import (
    TAG_MANAGED,
    TAG_NAMESPACE,
    lambda_consumer_prefix,
    workers_table_name,
)
from stacks.bundle import lambda_bundle
from stacks.dashboard_service import PAUSE_RECORDS_PARTITION
from stacks.nag import acknowledge, acknowledge_wildcard_resource
from stacks.ownership import ownership_condition

RUNTIME = lambda_.Runtime.PYTHON_3_11
SOURCE_ALERT_SCHEDULE = events.Schedule.rate(Duration.minutes(15))
DLQ_ALERT_SCHEDULE = events.Schedule.rate(Duration.hours(12))
CLEANER_SCHEDULE = events.Schedule.rate(Duration.days(1))
#: EventBridge retries a failed asynchronous invocation this often, for at most this long, then
#: moves the event to the schedule dead-letter queue.
SCHEDULE_RETRY_ATTEMPTS = 2
SCHEDULE_MAX_EVENT_AGE = Duration.hours(2)
#: What `messenger.ops` calls. The queue alarm lists the namespace's queues by name, reads their
#: depth from CloudWatch and the tags of those holding messages; the cleaner finds queues and
#: topics by tag and deletes the unused ones of the namespace. Tagging, metric, queue listing
#: and account-wide subscription listing APIs have no resource-level permissions.
ALARM_UNSCOPED_ACTIONS = ("sqs:ListQueues", "tag:GetResources", "cloudwatch:GetMetricData",
                          "lambda:ListEventSourceMappings")
#: The queue alarm also puts back what a deploy undid of an operator's pause
#: (`messenger.ops.pauses`): it reads the pause records in the worker registry, re-tags a paused
#: queue of the namespace and disables again the mappings of the namespace's Lambda consumers.
ALARM_QUEUE_ACTIONS = ("sqs:GetQueueUrl", "sqs:GetQueueAttributes", "sqs:ListQueueTags")
#: ... and puts a paused queue's tag back (that tag key only: `PAUSE_TAG`).
ALARM_TAG_ACTIONS = ("sqs:TagQueue",)
#: `messenger.jobs.controls.TAG_PAUSED` (tests/infra check they agree).
PAUSE_TAG = "messenger:paused"
CLEANER_UNSCOPED_ACTIONS = ("tag:GetResources", "cloudwatch:GetMetricData", "sns:ListSubscriptions")
CLEANER_QUEUE_ACTIONS = ("sqs:GetQueueUrl", "sqs:GetQueueAttributes", "sqs:ListQueueTags")
CLEANER_TOPIC_ACTIONS = (
    "sns:GetTopicAttributes", "sns:ListSubscriptionsByTopic", "sns:ListTagsForResource",
)
#: What the cleaner may destroy, only on resources the platform tagged as its own (SQS queues
#: and SNS topics support `aws:ResourceTag` conditions): in every configuration, the default
#: namespace's (no name prefix) included, it can never delete a resource it does not manage.
CLEANER_QUEUE_DELETE_ACTIONS = ("sqs:DeleteQueue",)
CLEANER_TOPIC_DELETE_ACTIONS = ("sns:DeleteTopic",)
#: The Service Authorization Reference lists no resource types and no condition keys for
#: sns:Unsubscribe: a statement naming ARNs or `aws:ResourceTag` never allows it, so it has a
#: statement of its own on "*", limited to this region (`aws:RequestedRegion`, a global key).
#: Safe because it deletes no message and no resource (a channel's subscription is recreated
#: by the provisioner or the stack), and the cleaner calls it only for subscriptions whose
#: queue the tag-guarded sqs:DeleteQueue has just let it delete (DeleteTopic removes a topic's
#: own subscriptions: no Unsubscribe there). See docs/ops-reports.md.
CLEANER_UNSUBSCRIBE_ACTIONS = ("sns:Unsubscribe",)


class OpsFunctions(Construct):
    """The queue-alarm and resource-cleaner functions and their schedules.

    namespace: only resources named `<namespace>-*` are read ('' = every name), and only those
        tagged as the platform's in this namespace are deleted (`ownership_condition`).
    slack_webhook_secret: name of the Secrets Manager secret holding the Slack webhook URL.
    alarm_threshold: default queue depth that raises an alert (MESSENGER_ALARM_THRESHOLD).
    cleaner_dry_run: report what the cleaner would delete without deleting (default True).
    critical_mention: who a critical alarm pings (MESSENGER_CRITICAL_MENTION, e.g. '<!here>').
    key: the platform key; encrypts the alarm topic and the schedule dead-letter queue.
    Outputs: `alarm_topic`, `schedule_dlq`, `error_alarms` (one per function).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        namespace: str,
        slack_webhook_secret: str,
        alarm_threshold: int = 100,
        cleaner_dry_run: bool = True,
        critical_mention: str = "",
        key: kms.IKey,
    ) -> None:
        super().__init__(scope, id)
        self.namespace = namespace
        self._watchers(key)
        self.secret = secretsmanager.Secret.from_secret_name_v2(
            self, "SlackWebhook", slack_webhook_secret
        )
        environment = {
            "SLACK_WEBHOOK_SECRET": slack_webhook_secret,
            "MESSENGER_NAMESPACE": namespace,
            "MESSENGER_PROVISIONING": "verify",
            "MESSENGER_ALARM_THRESHOLD": str(alarm_threshold),
            "CLEANER_DRY_RUN": "true" if cleaner_dry_run else "false",
            "MESSENGER_CRITICAL_MENTION": critical_mention,
        }
        self.queue_alarm = self._function(
            "QueueAlarm", "queue_alarm", environment, timeout=Duration.minutes(2),
            unscoped_actions=ALARM_UNSCOPED_ACTIONS, scoped_actions={"sqs": ALARM_QUEUE_ACTIONS},
        )
        self._grant_pause_reapply(self.queue_alarm, key)
        self.resource_cleaner = self._function(
            "ResourceCleaner", "resource_cleaner", environment, timeout=Duration.minutes(10),
            unscoped_actions=CLEANER_UNSCOPED_ACTIONS,
            scoped_actions={"sqs": CLEANER_QUEUE_ACTIONS, "sns": CLEANER_TOPIC_ACTIONS},
            guarded_actions={
                "sqs": CLEANER_QUEUE_DELETE_ACTIONS, "sns": CLEANER_TOPIC_DELETE_ACTIONS,
            },
        )
        self.source_alerts = self._schedule(
            "SourceQueueAlerts", SOURCE_ALERT_SCHEDULE, self.queue_alarm, {"scope": "source"}
        )
        self.dlq_alerts = self._schedule(
            "DeadLetterAlerts", DLQ_ALERT_SCHEDULE, self.queue_alarm, {"scope": "dlq"}
        )
        self.cleaning = self._schedule("DailyCleanup", CLEANER_SCHEDULE, self.resource_cleaner, {})
        self.error_alarms = [
            self._error_alarm("QueueAlarm", self.queue_alarm),
            self._error_alarm("ResourceCleaner", self.resource_cleaner),
        ]

    def _grant_pause_reapply(self, function: lambda_.Function, key: kms.IKey) -> None:
        """Read the pause records (one Query on the worker registry's table, encrypted with the
        platform key) and disable again the event source mappings of the namespace's Lambda
        consumers; the queue actions are ALARM_QUEUE_ACTIONS."""
        stack = Stack.of(self)
        lambda_arn = f"arn:{Aws.PARTITION}:lambda:{stack.region}:{stack.account}"
        role = function.role
        assert role is not None
        role.add_to_principal_policy(iam.PolicyStatement(
            sid="ReadPauseRecords", actions=["dynamodb:Query"],
            resources=[f"arn:{Aws.PARTITION}:dynamodb:{stack.region}:{stack.account}:table/"
                       f"{workers_table_name(self.namespace)}"],
            conditions={"ForAllValues:StringEquals": {
                "dynamodb:LeadingKeys": [PAUSE_RECORDS_PARTITION]}}))
        role.add_to_principal_policy(iam.PolicyStatement(
            sid="ReapplyLambdaConsumerPauses", actions=["lambda:UpdateEventSourceMapping"],
            resources=[f"{lambda_arn}:event-source-mapping:*"],
            conditions={"ArnLike": {"lambda:FunctionArn": [
                f"{lambda_arn}:function:{lambda_consumer_prefix(self.namespace)}*"]}}))
        role.add_to_principal_policy(iam.PolicyStatement(
            sid="ReapplyPauseTags", actions=list(ALARM_TAG_ACTIONS),
            resources=[self._name_pattern("sqs")],
            conditions={**self.ownership_condition(),
                        "ForAllValues:StringEquals": {"aws:TagKeys": [PAUSE_TAG]}}))
        key.grant_decrypt(role)
        policy = role.node.find_child("DefaultPolicy")
        acknowledge_wildcard_resource(
            policy, f"{lambda_arn}:event-source-mapping:*",
            "A mapping's ARN is its UUID, made at deploy time; the condition (ArnLike "
            "lambda:FunctionArn) limits it to mappings invoking the namespace's consumer "
            "functions, which the queue alarm only disables again while their channel's "
            "pause record says paused.")

    def _watchers(self, key: kms.IKey) -> None:
        account = Stack.of(self).account
        self.alarm_topic = sns.Topic(
            self, "Alarms", display_name="messenger operations alarms", master_key=key,
            enforce_ssl=True,
        )
        self.schedule_dlq = sqs.Queue(
            self, "ScheduleDeadLetters", encryption=sqs.QueueEncryption.KMS,
            encryption_master_key=key,
            enforce_ssl=True, retention_period=Duration.days(14),
            # Holds only schedule events (the next run repeats them): nothing to keep.
            removal_policy=RemovalPolicy.DESTROY,
        )
        acknowledge(
            self.schedule_dlq, "AwsSolutions-SQS3",
            "This queue is itself the dead-letter queue of the ops schedules' EventBridge targets.",
        )
        # CloudWatch publishes alarm notifications to the encrypted topic, EventBridge sends
        # undeliverable events to the encrypted queue: both need the key ("*" = this key).
        for sid, service in (("CloudWatchAlarmsToOpsTopic", "cloudwatch.amazonaws.com"),
                             ("EventBridgeToScheduleDlq", "events.amazonaws.com")):
            key.add_to_resource_policy(iam.PolicyStatement(
                sid=sid, principals=[iam.ServicePrincipal(service)],
                actions=["kms:GenerateDataKey*", "kms:Decrypt"], resources=["*"],
                conditions={"StringEquals": {"aws:SourceAccount": account}},
            ))
        undelivered = cloudwatch.Alarm(
            self, "ScheduleDeadLettersAlarm",
            alarm_description="An ops schedule event could not invoke its Lambda (see the queue "
                              "ScheduleDeadLetters).",
            metric=self.schedule_dlq.metric_approximate_number_of_messages_visible(
                period=Duration.minutes(5), statistic="Maximum"
            ),
            threshold=1, evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        undelivered.add_alarm_action(cloudwatch_actions.SnsAction(self.alarm_topic))

    def _error_alarm(self, id: str, function: lambda_.Function) -> cloudwatch.Alarm:
        """Any error (an exception, a timeout, a failed Slack post) in a 15-minute window."""
        alarm = cloudwatch.Alarm(
            self, f"{id}Errors",
            alarm_description=f"messenger ops Lambda {id} failed: its report may be missing or "
                              "incomplete; read its log.",
            metric=function.metric_errors(period=Duration.minutes(15), statistic="Sum"),
            threshold=1, evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        alarm.add_alarm_action(cloudwatch_actions.SnsAction(self.alarm_topic))
        return alarm

    def _name_pattern(self, service: str) -> str:
        prefix = f"{self.namespace}-" if self.namespace else ""
        return f"arn:{Aws.PARTITION}:{service}:{Aws.REGION}:{Aws.ACCOUNT_ID}:{prefix}*"

    def ownership_condition(self) -> dict[str, dict[str, Any]]:
        """The resource is the platform's, in this namespace: tagged `messenger:managed=true`
        and `messenger:namespace=<ns>`, or, for the default namespace, without that tag
        (`stacks.ownership`)."""
        return ownership_condition(self.namespace)

    def _scope_reason(self) -> str:
        if self.namespace:
            return (f"Channel resources are created by users at any time; every read, tag and "
                    f"delete is limited to the namespace's name prefix '{self.namespace}-' and "
                    f"needs the tags {TAG_MANAGED}=true and {TAG_NAMESPACE}={self.namespace} "
                    f"(aws:ResourceTag conditions): namespace {self.namespace}-eu's resources "
                    f"match the prefix, never the tag.")
        return ("The default namespace has no name prefix, so the pattern covers the account's "
                "queues and topics in this region; reading, tagging and deleting needs the tag "
                f"{TAG_MANAGED}=true and no {TAG_NAMESPACE} tag (aws:ResourceTag conditions): "
                "only the platform's own default-namespace resources.")

    def _function(
        self,
        id: str,
        folder: str,
        environment: dict[str, str],
        *,
        timeout: Duration,
        unscoped_actions: tuple[str, ...],
        scoped_actions: dict[str, tuple[str, ...]] | None = None,
        guarded_actions: dict[str, tuple[str, ...]] | None = None,
    ) -> lambda_.Function:
        """scoped_actions and guarded_actions: per service, on the namespace's name pattern and
        only on resources the platform tagged as its own (`ownership_condition`) alike;
        guarded_actions (the cleaner's deletes) also bring the unsubscribe statement."""
        log_group = logs.LogGroup(
            self, f"{id}Logs", retention=logs.RetentionDays.THREE_MONTHS,
            removal_policy=RemovalPolicy.DESTROY,
        )
        # An explicit role: the default one carries the AWS-managed basic execution policy,
        # which may write to every log group of the account.
        role = iam.Role(
            self, f"{id}Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"messenger ops Lambda {folder}",
        )
        log_group.grant_write(role)
        function = lambda_.Function(
            self,
            id,
            runtime=RUNTIME,
            architecture=lambda_.Architecture.X86_64,
            handler=f"lambdas.{folder}.handler.handler",
            code=lambda_.Code.from_asset(str(lambda_bundle(folder))),
            role=role,
            log_group=log_group,
            memory_size=256,
            timeout=timeout,
            environment={
                **environment,
                "POWERTOOLS_SERVICE_NAME": f"messenger-{folder}",
                "POWERTOOLS_METRICS_NAMESPACE": "messenger",
            },
            tracing=lambda_.Tracing.ACTIVE,
            description=f"messenger operations: {folder.replace('_', ' ')}",
        )
        role.add_to_policy(iam.PolicyStatement(actions=list(unscoped_actions), resources=["*"]))
        for service, actions in [*(scoped_actions or {}).items(),
                                 *(guarded_actions or {}).items()]:
            role.add_to_policy(iam.PolicyStatement(
                actions=list(actions), resources=[self._name_pattern(service)],
                conditions=self.ownership_condition(),
            ))
        if guarded_actions:  # the cleaner: see CLEANER_UNSUBSCRIBE_ACTIONS
            role.add_to_policy(iam.PolicyStatement(
                sid="UnsubscribeFromDeletedQueues", actions=list(CLEANER_UNSUBSCRIBE_ACTIONS),
                resources=["*"], conditions={"StringEquals": {"aws:RequestedRegion": Aws.REGION}},
            ))
        self.secret.grant_read(role)
        policy = role.node.find_child("DefaultPolicy")
        acknowledge(
            policy,
            "AwsSolutions-IAM5[Resource::*]",
            f"{', '.join(unscoped_actions)} and the X-Ray tracing calls support no "
            "resource-level permissions"
            + (", nor does sns:Unsubscribe (no resource types, no condition keys: limited to "
               "this region; called only for subscriptions to queues the tag-guarded "
               "sqs:DeleteQueue just deleted)" if guarded_actions else "")
            + "; every other action is scoped.",
        )
        for service in {**(scoped_actions or {}), **(guarded_actions or {})}:
            acknowledge_wildcard_resource(policy, self._name_pattern(service),
                                          self._scope_reason())
        acknowledge(
            function,
            "AwsSolutions-L1",
            "Pinned to Python 3.11, the version the library, its bundled dependencies and the "
            "tests use; upgraded together with the project's Python.",
        )
        return function

    def _schedule(
        self, id: str, schedule: events.Schedule, function: lambda_.IFunction, payload: dict
    ) -> events.Rule:
        return events.Rule(
            self,
            id,
            schedule=schedule,
            targets=[
                targets.LambdaFunction(
                    function, event=events.RuleTargetInput.from_object(payload),
                    retry_attempts=SCHEDULE_RETRY_ATTEMPTS, max_event_age=SCHEDULE_MAX_EVENT_AGE,
                    dead_letter_queue=self.schedule_dlq,
                )
            ],
        )

