"""Resource cleaner over HTTP: moto server (metrics seeded in AWS/SQS and AWS/SNS), Slack sink."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aws_lambda_powertools.utilities.parameters.exceptions import GetParameterError
from botocore.exceptions import ClientError

from messenger.channel import ChannelSpec
from messenger.ops.cleaner import run_resource_cleaner
from messenger.ops.inventory import CLOUDFORMATION_STACK_TAG
from messenger.ops.slack import SlackNotifier
from messenger.provision import ChannelResources, Provisioner
from messenger.tools.webhook_sink import WebhookSink

from .conftest import FakeContext, LambdaEnv, load_handler, seed

#: The plain function runs "four days from now": every queue made by the test is old enough
#: to be judged (a queue created or changed within the 3-day window never is).
LATER = timedelta(days=4)


class Estate:
    """Channels of one test's namespace, created as the runtime provisioner creates them."""

    def __init__(self, env: LambdaEnv) -> None:
        self.env = env
        self.provisioner = Provisioner(env.clients, env.settings)
        self.sqs = env.clients.client("sqs")
        self.sns = env.clients.client("sns")

    def channel(self, name: str, namespace: str | None = None) -> ChannelResources:
        ns = self.env.settings.namespace if namespace is None else namespace
        return self.provisioner.ensure_channel(ChannelSpec(name, namespace=ns))

    def queue_metrics(self, queue: str, at: datetime, **values: float) -> None:
        seed(self.env.clients, "AWS/SQS", "QueueName", queue,
             {metric: [(at - timedelta(hours=5), value)] for metric, value in values.items()})

    def topic_metrics(self, topic: str, at: datetime, **values: float) -> None:
        seed(self.env.clients, "AWS/SNS", "TopicName", topic,
             {metric: [(at - timedelta(hours=2), value)] for metric, value in values.items()})

    def queue_exists(self, name: str) -> bool:
        try:
            self.sqs.get_queue_url(QueueName=name)
        except ClientError:
            return False
        return True

    def topic_exists(self, arn: str) -> bool:
        try:
            self.sns.get_topic_attributes(TopicArn=arn)
        except ClientError:
            return False
        return True

    def subscriptions(self) -> list[dict[str, Any]]:
        return list(self.sns.list_subscriptions()["Subscriptions"])


def _run(env: LambdaEnv, webhook: WebhookSink, now: datetime, dry_run: bool = False) -> Any:
    settings = env.ops if not dry_run else type(env.ops)(**{**env.ops.__dict__, "dry_run": True})
    notifier = SlackNotifier(lambda: webhook.url)
    return run_resource_cleaner(env.clients, settings, notifier, now=now)


def test_each_classification_and_the_deletions(lambda_env: LambdaEnv, webhook: WebhookSink) -> None:
    estate = Estate(lambda_env)
    now = datetime.now(UTC) + LATER
    # Given: an unused queue (no data at all, empty, old), and one with explicit zero datapoints
    unused = estate.channel("unused")
    zeros = estate.channel("zeros")
    estate.queue_metrics(zeros.queue.name, now, ApproximateNumberOfMessagesVisible=0,
                         NumberOfMessagesSent=0, NumberOfMessagesReceived=0,
                         NumberOfEmptyReceives=0)
    # an unused queue whose DLQ still holds a message
    failing = estate.channel("failing")
    estate.sqs.send_message(QueueUrl=failing.dlq.url, MessageBody="{}")
    # a queue with messages and no data (SQS stopped reporting it): stale, never deleted
    stale = estate.channel("stale")
    estate.sqs.send_message(QueueUrl=stale.queue.url, MessageBody="{}")
    estate.sqs.send_message(QueueUrl=stale.queue.url, MessageBody="{}")
    # polled but nothing sent / sent but never received / both
    no_producers = estate.channel("noprod")
    estate.queue_metrics(no_producers.queue.name, now, NumberOfMessagesSent=0,
                         NumberOfEmptyReceives=40)
    no_consumers = estate.channel("nocons")
    estate.queue_metrics(no_consumers.queue.name, now, NumberOfMessagesSent=30,
                         NumberOfMessagesReceived=0, NumberOfEmptyReceives=0)
    busy = estate.channel("busy")
    estate.queue_metrics(busy.queue.name, now, NumberOfMessagesSent=10,
                         NumberOfMessagesReceived=10)
    # an inactive topic whose only queue is unused; an active topic with a queue without data
    dead = estate.channel("dead.sink")
    live = estate.channel("live.reader")
    estate.topic_metrics(live.spec.topic_name, now, NumberOfMessagesPublished=5,
                         NumberOfNotificationsDelivered=5)
    # an unused queue, and an unused topic (its unused queue is not), owned by CloudFormation
    # (moto accepts aws: tags from a client; on AWS only CloudFormation sets them)
    legacy = estate.channel("legacy")
    estate.sqs.tag_queue(QueueUrl=legacy.queue.url, Tags={CLOUDFORMATION_STACK_TAG: "shop-prod"})
    stacked = estate.channel("stacked.orphan")
    estate.sns.tag_resource(ResourceArn=stacked.topic_arn,
                            Tags=[{"Key": CLOUDFORMATION_STACK_TAG, "Value": "shop-prod"}])
    # the same unused channel in another namespace
    elsewhere = estate.channel("unused", namespace=lambda_env.settings.namespace + "x")

    # When
    outcome = _run(lambda_env, webhook, now)

    # Then
    summary = outcome.summary()
    assert sorted(summary["deleted_queues"]) == sorted(
        [unused.queue.name, zeros.queue.name, failing.queue.name, dead.queue.name,
         stacked.queue.name]
    )
    assert summary["deleted_topics"] == [dead.spec.topic_name]
    assert sorted(summary["stale"]) == sorted([stale.queue.name, failing.dlq.name])
    assert summary["no_producers"] == [no_producers.queue.name]
    assert summary["no_consumers"] == [no_consumers.queue.name]
    assert sorted(summary["kept_by_stack"]) == sorted([legacy.queue.name, stacked.spec.topic_name])
    assert summary["failed"] == [] and summary["posted"] is True
    # deleted with their DLQs and subscriptions; everything else is still there
    for gone in (unused.queue, unused.dlq, zeros.queue, zeros.dlq, failing.queue, dead.queue,
                 dead.dlq, stacked.queue):
        assert not estate.queue_exists(gone.name), gone.name
    assert not estate.topic_exists(dead.topic_arn)
    assert [s["SubscriptionArn"] for s in estate.subscriptions()] == [live.subscription_arn]
    for kept in (failing.dlq, stale.queue, no_producers.queue, no_consumers.queue, busy.queue,
                 live.queue, legacy.queue, legacy.dlq, elsewhere.queue):
        assert estate.queue_exists(kept.name), kept.name
    assert estate.topic_exists(live.topic_arn) and estate.topic_exists(stacked.topic_arn)
    # the Slack report lists them by category
    [post] = webhook.posts
    sections = [b["text"]["text"] for b in post["blocks"] if b["type"] == "section"]
    deleted_queues = next(s for s in sections if s.startswith("*🗑️ Unused queues deleted (5)*"))
    assert f"`{failing.queue.name}`" in deleted_queues
    assert f"DLQ {unused.dlq.name} deleted too" in deleted_queues
    stale_text = next(s for s in sections if s.startswith("*⏳ Queues with stale messages (2)*"))
    assert "2 messages; no sends or receives in 3 days (no CloudWatch data)" in stale_text
    stack_text = next(s for s in sections if "CloudFormation stack owns them" in s)
    assert f"`{legacy.queue.name}` · stack `shop-prod`" in stack_text


def test_dry_run_reports_without_deleting(lambda_env: LambdaEnv, webhook: WebhookSink) -> None:
    estate = Estate(lambda_env)
    now = datetime.now(UTC) + LATER
    unused = estate.channel("unused")
    dead = estate.channel("dead.sink")

    outcome = _run(lambda_env, webhook, now, dry_run=True)

    summary = outcome.summary()
    assert summary["dry_run"] is True
    assert sorted(summary["deleted_queues"]) == sorted([unused.queue.name, dead.queue.name])
    assert summary["deleted_topics"] == [dead.spec.topic_name]
    assert outcome.metrics()["ResourcesDeleted"] == 0
    for kept in (unused.queue, unused.dlq, dead.queue, dead.dlq):
        assert estate.queue_exists(kept.name)
    assert estate.topic_exists(dead.topic_arn)
    assert len(estate.subscriptions()) == 1
    header = webhook.posts[0]["blocks"][0]["text"]["text"]
    assert header == "🧹 Resource cleaner · dry run"
    assert "Unused queues would be deleted (dry run) (2)" in webhook.texts()[0]


def test_handler_judges_new_queues_by_their_attributes(
    lambda_env: LambdaEnv, webhook: WebhookSink
) -> None:
    # Given, at the real time: a new empty queue without data, a new queue with messages
    # and no data, and a queue whose messages nobody receives
    estate = Estate(lambda_env)
    young = estate.channel("young")
    stale = estate.channel("stale")
    estate.sqs.send_message(QueueUrl=stale.queue.url, MessageBody="{}")
    no_consumers = estate.channel("nocons")
    estate.queue_metrics(no_consumers.queue.name, datetime.now(UTC), NumberOfMessagesSent=7)

    # When the Lambda runs (its own runtime: settings from the environment, the webhook URL
    # from Secrets Manager)
    summary = load_handler("resource_cleaner").handler({}, FakeContext())

    # Then the new queue is too new to judge: neither deleted nor reported
    assert summary["deleted_queues"] == [] and summary["deleted_topics"] == []
    assert summary["stale"] == [stale.queue.name]
    assert summary["no_consumers"] == [no_consumers.queue.name]
    assert estate.queue_exists(young.queue.name)
    assert young.queue.name not in webhook.texts()[0]
    assert "7 messages sent, none received in 3 days" in webhook.texts()[0]


def test_nothing_to_report_posts_nothing(lambda_env: LambdaEnv, webhook: WebhookSink) -> None:
    estate = Estate(lambda_env)
    busy = estate.channel("busy")
    now = datetime.now(UTC) + LATER
    estate.queue_metrics(busy.queue.name, now, NumberOfMessagesSent=3, NumberOfMessagesReceived=3)

    outcome = _run(lambda_env, webhook, now)

    assert outcome.posted is False and not outcome.report.has_findings
    assert webhook.requests == 0


@pytest.mark.filterwarnings("ignore:No application metrics")
def test_unreachable_secret_stops_before_deleting(
    lambda_env: LambdaEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    estate = Estate(lambda_env)
    unused = estate.channel("unused")
    monkeypatch.setenv("SLACK_WEBHOOK_SECRET", "no/such/secret")

    with pytest.raises(GetParameterError, match="ResourceNotFoundException"):
        load_handler("resource_cleaner").handler({}, FakeContext())

    assert estate.queue_exists(unused.queue.name)
