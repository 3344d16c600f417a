"""Resource cleaner over HTTP: moto server (metrics seeded in AWS/SQS and AWS/SNS), Slack sink."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aws_lambda_powertools.utilities.parameters.exceptions import GetParameterError
from botocore.exceptions import ClientError
from slack_sdk.http_retry.builtin_interval_calculators import FixedValueRetryIntervalCalculator

from messenger.channel import ChannelSpec
from messenger.errors import InvalidSettings
from messenger.ops.cleaner import CleanerStopped, CleanupFailed, run_resource_cleaner
from messenger.ops.inventory import CLOUDFORMATION_STACK_TAG
from messenger.ops.report import ReportNotDelivered
from messenger.ops.slack import SlackNotifier
from messenger.provision import ChannelResources, Provisioner
from messenger.tools.webhook_sink import WebhookSink
from tests.faults import AccessDenied, FailOnCall, injected

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
    # Slack got the plan (every category) before the first deletion, then what was done
    plan, done = webhook.posts
    sections = [b["text"]["text"] for b in plan["blocks"] if b["type"] == "section"]
    assert plan["blocks"][0]["text"]["text"] == (
        "🧹 Resource cleaner · deleting now: 5 queues, 1 topic")
    to_delete = next(s for s in sections if s.startswith("*🗑️ Unused queues to delete now (5)*"))
    assert f"DLQ {unused.dlq.name} too" in to_delete
    stale_text = next(s for s in sections if s.startswith("*⏳ Queues with stale messages (2)*"))
    assert "2 messages; no sends or receives in 3 days (no CloudWatch data)" in stale_text
    stack_text = next(s for s in sections if "CloudFormation stack owns them" in s)
    assert f"`{legacy.queue.name}` · stack `shop-prod`" in stack_text
    sections = [b["text"]["text"] for b in done["blocks"] if b["type"] == "section"]
    assert done["blocks"][0]["text"]["text"] == "🧹 Resource cleaner · deletions done"
    deleted_queues = next(s for s in sections if s.startswith("*🗑️ Unused queues deleted (5)*"))
    assert f"`{failing.queue.name}`" in deleted_queues
    assert f"DLQ {unused.dlq.name} deleted too" in deleted_queues
    assert not any("stale" in s for s in sections)  # said in the plan


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
    # Given, at the real time: a new empty queue, a new queue sent one message (the local
    # endpoint publishes that send to CloudWatch, as SQS does) and a queue whose messages
    # nobody receives (its metrics written by hand)
    estate = Estate(lambda_env)
    young = estate.channel("young")
    sent_once = estate.channel("sentonce")
    estate.sqs.send_message(QueueUrl=sent_once.queue.url, MessageBody="{}")
    no_consumers = estate.channel("nocons")
    estate.queue_metrics(no_consumers.queue.name, datetime.now(UTC), NumberOfMessagesSent=7)

    # When the Lambda runs (its own runtime: settings from the environment, the webhook URL
    # from Secrets Manager)
    summary = load_handler("resource_cleaner").handler({}, FakeContext())

    # Then the new queue is too new to judge: neither deleted nor reported; the queue sent a
    # message nobody received is reported from its published metrics, not as "no sends"
    assert summary["deleted_queues"] == [] and summary["deleted_topics"] == []
    assert sorted(summary["no_consumers"]) == sorted(
        [no_consumers.queue.name, sent_once.queue.name])
    assert estate.queue_exists(young.queue.name)
    assert young.queue.name not in webhook.texts()[0]
    assert "7 messages sent, none received in 3 days" in webhook.texts()[0]
    assert "1 message sent, none received in 3 days" in webhook.texts()[0]


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


def _run_with(env: LambdaEnv, webhook: WebhookSink, now: datetime, **kwargs: Any) -> Any:
    return run_resource_cleaner(env.clients, env.ops, SlackNotifier(lambda: webhook.url),
                                now=now, **kwargs)


def test_a_connection_error_mid_run_stops_reports_everything_done_and_fails(
    lambda_env: LambdaEnv, webhook: WebhookSink, caplog: pytest.LogCaptureFixture
) -> None:
    # Given five unused channels (each: queue + DLQ, 2 DeleteQueue calls, queue first)
    estate = Estate(lambda_env)
    now = datetime.now(UTC) + LATER
    channels = [estate.channel(f"gone{n}") for n in range(5)]
    # When the 4th DeleteQueue (the second DLQ) fails with a connection error (no ClientError)
    failing = FailOnCall(nth=4)
    with injected(lambda_env.clients, "before-call.sqs.DeleteQueue", failing):
        with caplog.at_level(logging.INFO, logger="messenger.ops.cleaner"):
            outcome = _run_with(lambda_env, webhook, now)
    # Then the run stopped there, and its report names what was deleted and what was not
    report = outcome.report
    second_dlq = channels[1].dlq.name
    assert report.stopped and report.stopped.startswith(
        f"EndpointConnectionError while deleting {second_dlq}")
    assert [f.name for f in report.deleted_queues] == [channels[0].queue.name,
                                                       channels[1].queue.name]
    assert report.queues_removed == 3 and outcome.metrics()["ResourcesDeleted"] == 3
    # the DLQ being deleted when it broke is named, with the queue it was left by
    [broken] = report.failed
    assert broken.name == second_dlq and "may or may not be deleted" in broken.detail
    assert f"its queue {channels[1].queue.name} was deleted" in broken.detail
    assert sorted(f.name for f in report.not_deleted) == sorted(
        n for c in channels[2:] for n in (c.queue.name, c.dlq.name))
    assert report.not_checked == ()
    gone = [n for c in channels for n in (c.queue.name, c.dlq.name) if not estate.queue_exists(n)]
    assert sorted(gone) == sorted([channels[0].queue.name, channels[0].dlq.name,
                                   channels[1].queue.name])
    # every deletion was logged by name as it happened
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("deleted ")]
    assert logged == [f"deleted queue {channels[0].queue.name}",
                      f"deleted dead-letter queue {channels[0].dlq.name}",
                      f"deleted queue {channels[1].queue.name}"]
    # the plan, then the outcome were posted (saying it stopped); the invocation fails
    plan, done = webhook.texts()
    assert channels[4].queue.name in plan
    assert outcome.posted and "stopped early" in done and second_dlq in done
    with pytest.raises(CleanerStopped, match="0 resources not checked, 6 not deleted"):
        outcome.raise_for_failure()


def test_a_lambda_running_out_of_time_stops_before_the_next_deletion(
    lambda_env: LambdaEnv, webhook: WebhookSink
) -> None:
    estate = Estate(lambda_env)
    now = datetime.now(UTC) + LATER
    channels = [estate.channel(f"late{n}") for n in range(3)]
    # Given a Lambda whose time drops under the 60 s margin once the first channel (queue and
    # DLQ) is deleted: 3 queues judged, the plan posted, 2 deletions, then 50 s left
    left = iter([70.0] * 6)

    outcome = _run_with(lambda_env, webhook, now, remaining=lambda: next(left, 50.0))

    report = outcome.report
    assert report.stopped == "less than 60 s of the Lambda's time left"
    assert [f.name for f in report.deleted_queues] == [channels[0].queue.name]
    assert [f.name for f in report.not_deleted] == [
        n for c in channels[1:] for n in (c.queue.name, c.dlq.name)]
    assert estate.queue_exists(channels[1].queue.name)
    assert outcome.posted


def test_time_running_out_while_judging_deletes_nothing(
    lambda_env: LambdaEnv, webhook: WebhookSink
) -> None:
    estate = Estate(lambda_env)
    now = datetime.now(UTC) + LATER
    channels = [estate.channel(f"slow{n}") for n in range(2)]
    left = iter([70.0])  # the first queue is judged; then 50 s left

    outcome = _run_with(lambda_env, webhook, now, remaining=lambda: next(left, 50.0))

    report = outcome.report
    assert report.stopped == "less than 60 s of the Lambda's time left; nothing was deleted"
    assert report.deleted_queues == () and report.queues_removed == 0
    assert [f.name for f in report.not_deleted] == [channels[0].queue.name,
                                                    channels[0].dlq.name]
    assert [f.name for f in report.not_checked] == [channels[1].queue.name]
    assert all(estate.queue_exists(n) for c in channels for n in (c.queue.name, c.dlq.name))
    # the header says what is true: what was judged, and that nothing listed was deleted
    [post] = webhook.posts
    assert "3 of 4 topics and queues judged" in post["blocks"][1]["elements"][0]["text"]


@pytest.mark.filterwarnings("ignore:No application metrics")
def test_a_refused_delete_fails_the_invocation_after_reporting(
    lambda_env: LambdaEnv, webhook: WebhookSink, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given two unused channels, and an IAM policy that refuses deleting one of the queues
    estate = Estate(lambda_env)
    locked, free = estate.channel("locked"), estate.channel("free")
    refuse = AccessDenied(locked.queue.name)
    module = load_handler("resource_cleaner", lambda_env, monkeypatch)
    monkeypatch.setattr(module, "run_resource_cleaner",
                        lambda *a, **k: run_resource_cleaner(*a, **k, now=datetime.now(UTC)
                                                             + LATER))
    # When the Lambda runs
    with injected(lambda_env.clients, "before-send.sqs.DeleteQueue", refuse), \
            caplog.at_level(logging.INFO), pytest.raises(CleanupFailed, match=locked.queue.name):
        module.handler({}, FakeContext())
    # Then the other channel is gone, the refused queue and its DLQ stay, the report (posted
    # and logged) names both; the invocation failed, so the Errors alarm pages
    assert refuse.refused == 1
    assert not estate.queue_exists(free.queue.name) and not estate.queue_exists(free.dlq.name)
    assert estate.queue_exists(locked.queue.name) and estate.queue_exists(locked.dlq.name)
    done = next(r for r in caplog.records if r.getMessage() == "resource cleaner report")
    assert done.report["failed"] == [locked.queue.name]
    detail = done.report["details"][locked.queue.name]
    assert detail.startswith("not deleted: AccessDenied") and locked.dlq.name in detail
    assert "Could not clean" in webhook.texts()[-1] and locked.queue.name in webhook.texts()[-1]


def test_a_dlq_whose_delete_fails_after_its_queue_is_named_and_deleted_next_run(
    lambda_env: LambdaEnv, webhook: WebhookSink
) -> None:
    # Given an unused channel whose DLQ cannot be deleted (its queue can)
    estate = Estate(lambda_env)
    now = datetime.now(UTC) + LATER
    channel = estate.channel("halfway")
    refuse = AccessDenied(channel.dlq.name)
    with injected(lambda_env.clients, "before-send.sqs.DeleteQueue", refuse):
        first = _run_with(lambda_env, webhook, now)
    # Then the orphaned DLQ is named, in the report and in Slack, and the run fails
    assert not estate.queue_exists(channel.queue.name) and estate.queue_exists(channel.dlq.name)
    [orphan] = first.report.failed
    assert orphan.name == channel.dlq.name and "orphaned" in orphan.detail
    assert f"DLQ {channel.dlq.name} NOT deleted" in first.report.deleted_queues[0].detail
    assert channel.dlq.name in webhook.texts()[-1]
    with pytest.raises(CleanupFailed, match=channel.dlq.name):
        first.raise_for_failure()
    # When the next run finds it without its queue, it deletes it
    second = _run_with(lambda_env, webhook, now)
    assert [f.name for f in second.report.deleted_queues] == [channel.dlq.name]
    assert not estate.queue_exists(channel.dlq.name)


def test_a_queue_gone_before_the_run_leaves_its_dlq_named_and_deleted(
    lambda_env: LambdaEnv, webhook: WebhookSink
) -> None:
    # Given an unused channel whose queue vanishes after the inventory read its tags
    estate = Estate(lambda_env)
    now = datetime.now(UTC) + LATER
    channel = estate.channel("vanishing")

    def vanish(**_: Any) -> None:  # the queue is deleted by someone else before it is judged
        if estate.queue_exists(channel.queue.name):
            estate.sqs.delete_queue(QueueUrl=channel.queue.url)

    with injected(lambda_env.clients, "before-call.cloudwatch.GetMetricData", vanish):
        outcome = _run_with(lambda_env, webhook, now)
    # Then its DLQ is deleted in its place, and named
    [row] = outcome.report.deleted_queues
    assert row.name == channel.dlq.name and "already gone" in row.detail
    assert not estate.queue_exists(channel.dlq.name)
    assert channel.dlq.name in webhook.texts()[-1]


@pytest.mark.filterwarnings("ignore:No application metrics")
def test_a_report_slack_refuses_fails_the_invocation_after_logging_it(
    lambda_env: LambdaEnv, webhook: WebhookSink, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    estate = Estate(lambda_env)
    stale = estate.channel("stale")
    estate.sqs.send_message(QueueUrl=stale.queue.url, MessageBody="{}")
    webhook.fail_status = 500
    module = load_handler("resource_cleaner", lambda_env, monkeypatch)

    with caplog.at_level(logging.INFO), pytest.raises(ReportNotDelivered,
                                                      match="could not be posted"):
        module.handler({}, FakeContext())

    report = next(r for r in caplog.records if r.getMessage() == "resource cleaner report")
    # (one message sent and never received: SQS's published metrics say so)
    assert report.report["no_consumers"] == [stale.queue.name]
    assert report.report["posted"] is False
    assert report.report["details"][stale.queue.name].startswith("1 message sent")


@pytest.mark.filterwarnings("ignore:No application metrics")
def test_a_malformed_secret_fails_even_with_nothing_to_report(
    lambda_env: LambdaEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    lambda_env.clients.client("secretsmanager").create_secret(
        Name="messenger/not-a-url", SecretString="hooks.slack.com/services/x")
    monkeypatch.setenv("SLACK_WEBHOOK_SECRET", "messenger/not-a-url")

    with pytest.raises(InvalidSettings, match="must hold the webhook URL"):
        load_handler("resource_cleaner").handler({}, FakeContext())


def test_a_subscriber_abandoned_on_a_busy_exchange_is_reported(
    lambda_env: LambdaEnv, webhook: WebhookSink
) -> None:
    # Given an active exchange with two subscribers: one consumed, one nobody reads any more,
    # and a third whose filter matched nothing (idle: active through its topic)
    estate = Estate(lambda_env)
    now = datetime.now(UTC) + LATER
    read = estate.channel("orders.billing")
    abandoned = estate.channel("orders.legacy_audit")
    idle = estate.channel("orders.rare_events")
    estate.topic_metrics(read.spec.topic_name, now, NumberOfMessagesPublished=50,
                         NumberOfNotificationsDelivered=150)
    estate.queue_metrics(read.queue.name, now, NumberOfMessagesSent=50,
                         NumberOfMessagesReceived=50)
    estate.queue_metrics(abandoned.queue.name, now, NumberOfMessagesSent=50,
                         NumberOfMessagesReceived=0)

    outcome = _run_with(lambda_env, webhook, now)

    summary = outcome.summary()
    assert summary["no_consumers"] == [abandoned.queue.name]
    assert summary["deleted_queues"] == [] and summary["deleted_topics"] == []
    assert estate.queue_exists(idle.queue.name)
    [text] = webhook.texts()
    assert "50 messages delivered by its active exchange, none received in 3 days" in text


def test_a_queue_tagged_for_the_namespace_but_named_outside_it_is_never_deleted(
    lambda_env: LambdaEnv, webhook: WebhookSink
) -> None:
    # Given an unused queue carrying this namespace's platform tags, named 'shared-bus-*'
    estate = Estate(lambda_env)
    now = datetime.now(UTC) + LATER
    spec = ChannelSpec("shared_bus", namespace=lambda_env.settings.namespace)
    estate.sqs.create_queue(QueueName="shared-bus-events", tags=spec.resource_tags("queue"))
    unused = estate.channel("unused")

    outcome = _run_with(lambda_env, webhook, now)

    # Then only the queue both its tags and its name place in the namespace is deleted
    summary = outcome.summary()
    assert summary["deleted_queues"] == [unused.queue.name]
    assert summary["kept_outside_prefix"] == ["shared-bus-events"]
    assert estate.queue_exists("shared-bus-events")
    assert "named outside the namespace's prefix" in webhook.texts()[0]


def test_a_connection_error_before_judging_deletes_nothing_and_names_everything(
    lambda_env: LambdaEnv, webhook: WebhookSink
) -> None:
    # Given two unused channels, and CloudWatch unreachable (a connection error, not ClientError)
    estate = Estate(lambda_env)
    now = datetime.now(UTC) + LATER
    channels = [estate.channel(f"early{n}") for n in range(2)]
    failing = FailOnCall(nth=1)
    with injected(lambda_env.clients, "before-call.cloudwatch.GetMetricData", failing):
        outcome = _run_with(lambda_env, webhook, now)
    # Then nothing is deleted, every resource is named as not checked, the report is posted
    report = outcome.report
    assert report.stopped and report.stopped.startswith(
        "EndpointConnectionError before judging anything")
    names = [n for c in channels for n in (c.queue.name, c.dlq.name)]
    assert sorted(f.name for f in report.not_checked) == sorted(names)
    assert all(estate.queue_exists(n) for n in names)
    assert outcome.posted and all(n in webhook.texts()[0] for n in names)
    with pytest.raises(CleanerStopped, match="4 resources not checked, 0 not deleted; report "
                                             "posted"):
        outcome.raise_for_failure()


def test_a_slack_webhook_that_never_answers_fails_the_run_after_logging(
    lambda_env: LambdaEnv, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a webhook endpoint that accepts connections and never answers (a hung Slack)
    from tests.faults import Blackhole

    estate = Estate(lambda_env)
    stale = estate.channel("stale_hung")
    estate.sqs.send_message(QueueUrl=stale.queue.url, MessageBody="{}")
    hung = Blackhole()
    try:
        notifier = SlackNotifier(lambda: f"{hung.url}/services/T/B/X", timeout=1)
        with caplog.at_level(logging.INFO):
            outcome = run_resource_cleaner(lambda_env.clients, lambda_env.ops, notifier,
                                           now=datetime.now(UTC) + LATER)
    finally:
        hung.close()
    # Then the report is in the log, the post counts as failed and the invocation fails
    logged = next(r for r in caplog.records if r.getMessage() == "resource cleaner report")
    assert logged.report["stale"] == [stale.queue.name]
    assert outcome.posted is False and outcome.metrics()["SlackPostFailed"] == 1
    with pytest.raises(ReportNotDelivered, match="could not be posted"):
        outcome.raise_for_failure()


@pytest.mark.parametrize("slack", ["500", "429", "hang"])
def test_nothing_is_deleted_when_the_plan_cannot_be_posted(
    lambda_env: LambdaEnv, webhook: WebhookSink, caplog: pytest.LogCaptureFixture, slack: str
) -> None:
    # Given unused channels, and a Slack that fails (500), rate-limits (429, Retry-After 100:
    # longer than the Lambda has) or hangs, with a Lambda of 75 s left
    estate = Estate(lambda_env)
    now = datetime.now(UTC) + LATER
    channels = [estate.channel(f"unseen{n}") for n in range(3)]
    webhook.fail_status = {"500": 500, "429": 429}.get(slack)
    webhook.retry_after, webhook.hang = 100, slack == "hang"
    context = FakeContext(75.0)
    remaining = lambda: context.get_remaining_time_in_millis() / 1000  # noqa: E731
    # (1 s per attempt, 0.1 s between attempts: the default backoff's 0.5-3 s waits would
    # only add time, the attempts are what is tested)
    notifier = SlackNotifier(lambda: webhook.url, timeout=1, remaining=remaining,
                             retry_interval=FixedValueRetryIntervalCalculator(0.1))
    # When the cleaner runs
    with caplog.at_level(logging.INFO):
        outcome = run_resource_cleaner(lambda_env.clients, lambda_env.ops, notifier, now=now,
                                       remaining=remaining)
    # Then nothing was deleted, the plan and the report are in the log, and the run fails,
    # in time
    assert all(estate.queue_exists(n) for c in channels for n in (c.queue.name, c.dlq.name))
    report = outcome.report
    assert report.stopped == "the plan could not be posted to Slack; nothing was deleted"
    assert report.deleted_queues == () and len(report.not_deleted) == 6
    plan = next(r for r in caplog.records if r.getMessage() == "resource cleaner plan")
    assert sorted(plan.report["deleted_queues"]) == sorted(c.queue.name for c in channels)
    assert any(r.getMessage() == "Slack webhook post failed" and channels[0].queue.name
               in r.undelivered for r in caplog.records)
    assert remaining() > 55  # two posts tried (plan, report), within seconds
    with pytest.raises(CleanerStopped, match="6 not deleted"):
        outcome.raise_for_failure()
