"""Queue alarm Lambda over HTTP: moto server for AWS (metrics seeded), a local Slack sink."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from messenger.aws import RequestCounter
from messenger.channel import ChannelSpec, ChannelTags
from messenger.ops import queue_alarm
from messenger.ops.findings import QueueAlarmReport, QueueProblem
from messenger.ops.queue_alarm import AlarmStopped, InvalidEvent, check_queues
from messenger.ops.report import ReportNotDelivered, post_all, queue_alarm_messages
from messenger.ops.slack import SlackNotifier
from messenger.provision import Provisioner
from messenger.tools.webhook_sink import WebhookSink
from tests.faults import FailOnCall, injected

from .conftest import FakeContext, LambdaEnv, load_handler, seed

DEPTH = "ApproximateNumberOfMessagesVisible"
AGE = "ApproximateAgeOfOldestMessage"


def _depth(env: LambdaEnv, queue: str, depth: float, age: float | None = None) -> None:
    now = datetime.now(UTC)
    points = {DEPTH: [(now - timedelta(minutes=10), 1.0), (now - timedelta(minutes=2), depth)]}
    if age is not None:
        points[AGE] = [(now - timedelta(minutes=2), age)]
    seed(env.clients, "AWS/SQS", "QueueName", queue, points)


@pytest.fixture
def invoke(lambda_env: LambdaEnv, monkeypatch: pytest.MonkeyPatch) -> Callable[[Any], Any]:
    """Calls the handler as Lambda would (sharing the test's boto3 clients, to save time)."""
    module = load_handler("queue_alarm", lambda_env, monkeypatch)
    return lambda event: module.handler(event, FakeContext())


@pytest.fixture
def estate(lambda_env: LambdaEnv) -> dict[str, ChannelSpec]:
    """Four channels: a critical one and three plain ones, one of them under its threshold."""
    provisioner = Provisioner(lambda_env.clients, lambda_env.settings)
    ns = lambda_env.settings.namespace
    specs = {
        "payments": ChannelSpec("payments", namespace=ns,
                                tags=ChannelTags(owner="ana", team="pay", alarm_threshold=10,
                                                 critical=True)),
        "orders": ChannelSpec("orders", namespace=ns, tags=ChannelTags(alarm_threshold=50)),
        # the default threshold: 100; its DLQ tolerates 5 dead letters
        "emails": ChannelSpec("emails", namespace=ns, tags=ChannelTags(dlq_alarm_threshold=5)),
        "audit": ChannelSpec("wishlist.audit", namespace=ns, tags=ChannelTags(alarm_threshold=5)),
    }
    for spec in specs.values():
        provisioner.ensure_channel(spec)
    _depth(lambda_env, specs["payments"].queue_name, 11, age=7500)
    _depth(lambda_env, specs["orders"].queue_name, 51)
    _depth(lambda_env, specs["emails"].queue_name, 100)  # not above the threshold
    _depth(lambda_env, specs["audit"].queue_name, 300, age=42)
    _depth(lambda_env, specs["orders"].dlq_name, 60)
    _depth(lambda_env, specs["audit"].dlq_name, 1)  # one dead letter: the DLQ default alarms
    _depth(lambda_env, specs["emails"].dlq_name, 3)  # under its own DLQ threshold
    return specs


def test_source_scope_posts_problem_queues_critical_first(
    estate: dict[str, ChannelSpec], webhook: WebhookSink, invoke: Callable[[Any], Any]
) -> None:
    result = invoke({"scope": "source"})

    names = [estate[k].queue_name for k in ("payments", "audit", "orders")]
    assert result["problems"] == names  # critical first, then the deepest
    assert result["critical"] == [estate["payments"].queue_name]
    assert result["posted"] is True
    assert len(webhook.posts) == 1
    blocks = webhook.posts[0]["blocks"]
    assert blocks[0]["type"] == "header"
    assert "🚨 1 critical queue over threshold" in blocks[0]["text"]["text"]
    digest, *sections = [b["text"]["text"] for b in blocks if b["type"] == "section"]
    assert digest == "*Digest:* *🔴 Critical: 1* · 🟠 Over threshold: 2"
    assert [next(n for n in names if n in s) for s in sections] == names
    assert "critical" in sections[0] and "Depth *11* / threshold 10" in sections[0]
    assert "oldest 2 h 5 min" in sections[0] and "team pay" in sections[0]
    assert f"%2F{names[0]}|console>" in sections[0]
    text = webhook.texts()[0]
    assert estate["emails"].queue_name not in text
    assert estate["orders"].dlq_name not in text


def test_dlq_scope_checks_only_dead_letter_queues(
    estate: dict[str, ChannelSpec], webhook: WebhookSink
) -> None:
    # The handler's own runtime: settings from the environment, the webhook URL read from
    # Secrets Manager through Powertools Parameters.
    result = load_handler("queue_alarm").handler({"scope": "dlq"}, FakeContext())

    # A DLQ's threshold is its own (default 0: any dead letter), never the source's: the audit
    # DLQ with one message alarms although its channel's threshold is 5; the emails DLQ with 3
    # stays under its dlq-alarm-threshold tag of 5.
    assert result["problems"] == [estate["orders"].dlq_name, estate["audit"].dlq_name]
    blocks = webhook.posts[0]["blocks"]
    # The non-critical variant of the message.
    assert blocks[0]["text"]["text"] == "⚠️ 2 dead-letter queues over threshold"
    assert "Depth *1* / threshold 0" in webhook.texts()[0]
    assert estate["emails"].dlq_name not in webhook.texts()[0]
    assert "Dead-letter queues" in blocks[1]["elements"][0]["text"]
    assert estate["payments"].queue_name not in webhook.texts()[0]


def test_no_problem_no_post(
    lambda_env: LambdaEnv, webhook: WebhookSink, invoke: Callable[[Any], Any]
) -> None:
    spec = ChannelSpec("quiet", namespace=lambda_env.settings.namespace)
    Provisioner(lambda_env.clients, lambda_env.settings).ensure_channel(spec)
    _depth(lambda_env, spec.queue_name, 3)

    result = invoke({"scope": "source"})

    assert result == {"scope": "source", "checked": 1, "problems": [], "critical": [],
                      "stopped": None, "not_checked": [], "malformed_threshold_tags": [],
                      "pauses_reapplied": [], "pause_errors": [],
                      "workflows_swept": {"looked": 0, "applied": 0, "released": 0,
                                          "cancelled": 0, "expired": 0, "never_sent": 0},
                      "workflow_error": "", "posted": False}
    assert webhook.requests == 0


@pytest.mark.filterwarnings("ignore:No application metrics")
@pytest.mark.parametrize("event", [{}, {"scope": "all"}, {"scope": None}, []])
def test_bad_event_names_the_field_and_allowed_values(
    invoke: Callable[[Any], Any], event: object
) -> None:
    with pytest.raises(InvalidEvent, match=r"'scope' must be one of 'source', 'dlq'"):
        invoke(event)


def test_failing_webhook_is_retried_then_fails_the_invocation(
    estate: dict[str, ChannelSpec],
    webhook: WebhookSink,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    invoke: Callable[[Any], Any],
) -> None:
    webhook.fail_status = 500

    # A report that does not reach Slack is a failed invocation (the Errors alarm fires)
    with pytest.raises(ReportNotDelivered, match="3 queues over threshold.*in the log"):
        invoke({"scope": "source"})

    assert webhook.requests == 3  # the post and slack_sdk's two retries
    # the full report is in the log first
    done = next(r for r in caplog.records if r.getMessage() == "queue alarm done")
    assert done.posted is False and len(done.report) == 3
    assert {p["queue"] for p in done.report} == set(done.problems)
    failure = next(r for r in caplog.records if r.getMessage() == "Slack webhook post failed")
    assert failure.levelname == "ERROR" and failure.status == 500
    # The run's metrics are still flushed (CloudWatch embedded metric format on stdout).
    emf = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    assert emf and emf[-1]["SlackPostFailed"] == [1.0]


#: What CloudFormation adds to every resource of a stack, cost tags, and more of a team's own.
MANY_TAGS = {
    "aws:cloudformation:stack-name": "shop-prod",
    "aws:cloudformation:logical-id": "OrdersQueue0A1B2C3D",
    "aws:cloudformation:stack-id": "arn:aws:cloudformation:us-east-1:123456789012:stack/shop/x",
    "cost-center": "cc-1234", "environment": "production", "application": "shop",
    **{f"team-tag-{n:02d}": "x" * 40 for n in range(30)},
}


def test_many_queues_cost_few_calls_whatever_their_tags(lambda_env: LambdaEnv) -> None:
    # Given 300 channels (queue and DLQ) whose queues carry the provisioner's tags plus 36 more
    # (a GetResources page ends at 500 tags: listing them by tag would take 24 pages), 150 of
    # the queues holding messages, and a DLQ holding messages too
    ns = lambda_env.settings.namespace
    sqs = lambda_env.clients.client("sqs")
    specs = [ChannelSpec(f"q{n:03d}", namespace=ns) for n in range(300)]

    def create(spec: ChannelSpec) -> None:
        sqs.create_queue(QueueName=spec.queue_name,
                         tags={**spec.resource_tags("queue"), **MANY_TAGS})
        sqs.create_queue(QueueName=spec.dlq_name, tags=spec.resource_tags("dlq"))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, specs))
        list(pool.map(lambda s: _depth(lambda_env, s.queue_name, 500 if s.name == "q123" else 7),
                      specs[:150]))
    _depth(lambda_env, specs[0].dlq_name, 9)
    counter = RequestCounter().attach(lambda_env.clients)
    asked: list[int] = []
    lambda_env.clients.client("resourcegroupstaggingapi").meta.events.register(
        "before-parameter-build.resource-groups-tagging-api.GetResources",
        lambda params, **_: asked.append(len(params.get("ResourceARNList", []))))

    report = check_queues(lambda_env.clients, "source", ns, 100)

    assert report.checked == 300
    assert [p.name for p in report.problems] == [f"{ns}-q123"]
    # 600 queues listed in one call, 600 metric queries in 2 calls, and the tags of the 150
    # source queues holding messages (not the DLQ's) in 2 calls of at most 100 ARNs
    assert counter.counts == {
        "sqs.ListQueues": 1, "cloudwatch.GetMetricData": 2,
        "resource-groups-tagging-api.GetResources": 2,
    }
    assert asked == [100, 50]


def test_only_queues_both_named_and_tagged_in_the_namespace_alarm(
    lambda_env: LambdaEnv,
) -> None:
    # Given, holding messages: a channel whose name ends in '-dlq', a queue tagged for the
    # namespace but named outside its prefix, a queue named in the prefix but not the
    # platform's, one tagged for another namespace, and a DLQ whose channel is gone
    ns = lambda_env.settings.namespace
    sqs = lambda_env.clients.client("sqs")
    odd = ChannelSpec("retry-dlq", namespace=ns)
    Provisioner(lambda_env.clients, lambda_env.settings).ensure_channel(odd)
    outside = ChannelSpec("bus", namespace=ns)
    sqs.create_queue(QueueName=f"shared-{ns}-bus", tags=outside.resource_tags("queue"))
    sqs.create_queue(QueueName=f"{ns}-foreign", tags={"team": "other"})
    other = ChannelSpec("elsewhere", namespace="othernamespace")
    sqs.create_queue(QueueName=f"{ns}-elsewhere", tags=other.resource_tags("queue"))
    orphan = ChannelSpec("gone", namespace=ns)
    sqs.create_queue(QueueName=orphan.dlq_name, tags=orphan.resource_tags("dlq"))
    for name in (odd.queue_name, f"shared-{ns}-bus", f"{ns}-foreign", f"{ns}-elsewhere",
                 orphan.dlq_name):
        _depth(lambda_env, name, 500)

    source = check_queues(lambda_env.clients, "source", ns, 100)
    dlq = check_queues(lambda_env.clients, "dlq", ns, 100)

    # Then the '-dlq' channel's queue alarms as a source queue, the orphaned DLQ as a DLQ, and
    # nothing not both named and tagged in the namespace does
    assert [p.name for p in source.problems] == [odd.queue_name]
    assert [p.name for p in dlq.problems] == [orphan.dlq_name]
    # read: the channel's queue, and the three names that do not tell their role
    assert source.checked == 4
    assert dlq.checked == 4  # its DLQ, and the same three


@pytest.mark.filterwarnings("ignore:No application metrics")
def test_a_connection_error_mid_run_posts_what_was_checked_and_fails(
    estate: dict[str, ChannelSpec], lambda_env: LambdaEnv, webhook: WebhookSink,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    invoke: Callable[[Any], Any],
) -> None:
    # Given metrics read two queues per GetMetricData call, and the second call's connection
    # breaks (botocore's EndpointConnectionError is not a ClientError)
    monkeypatch.setattr(queue_alarm, "QUEUES_PER_CALL", 2)
    failing = FailOnCall(nth=2)
    with injected(lambda_env.clients, "before-call.cloudwatch.GetMetricData", failing):
        with caplog.at_level(logging.INFO), pytest.raises(
                AlarmStopped, match="2 queues not checked, 1 over threshold; report posted"):
            invoke({"scope": "source"})
    # Then (queues are read in ARN order: audit, emails | orders, payments) the post names the
    # problem found in the first batch and the queues never read
    ns = lambda_env.settings.namespace
    done = next(r for r in caplog.records if r.getMessage() == "queue alarm report")
    assert done.report["problems"] == [f"{ns}-audit"]
    assert done.report["not_checked"] == [f"{ns}-orders", f"{ns}-payments"]
    [text] = webhook.texts()
    assert "Stopped early:* EndpointConnectionError while reading the metrics" in text
    for name in (f"{ns}-audit", f"{ns}-orders", f"{ns}-payments"):
        assert f"{name}*" in text or f"`{name}`" in text


def test_a_lambda_running_out_of_time_stops_reading_and_reports(
    estate: dict[str, ChannelSpec], lambda_env: LambdaEnv, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given metrics read two queues per call and time running short before the second call
    monkeypatch.setattr(queue_alarm, "QUEUES_PER_CALL", 2)
    left = iter([60.0, 30.0])

    report = check_queues(lambda_env.clients, "source", lambda_env.settings.namespace, 100,
                          remaining=lambda: next(left))

    # Then no call follows: the two queues read hold messages but their tags (thresholds,
    # ownership) were not read, so none of the four is judged, and the report says so
    ns = lambda_env.settings.namespace
    assert report.stopped == "less than 45 s of the Lambda's time left"
    assert report.checked == 0
    assert report.not_checked == (f"{ns}-audit", f"{ns}-emails", f"{ns}-orders",
                                  f"{ns}-payments")
    assert report.problems == ()


def test_time_running_short_before_the_tags_judges_nothing_it_cannot(
    estate: dict[str, ChannelSpec], lambda_env: LambdaEnv,
) -> None:
    left = iter([60.0, 30.0])  # enough for the one metric call, not for the tags

    report = check_queues(lambda_env.clients, "dlq", lambda_env.settings.namespace, 100,
                          remaining=lambda: next(left))

    ns = lambda_env.settings.namespace
    assert report.stopped == "less than 45 s of the Lambda's time left"
    assert report.not_checked == (f"{ns}-audit-dlq", f"{ns}-emails-dlq", f"{ns}-orders-dlq")
    assert report.checked == 1  # the payments DLQ: empty, nothing to judge


@pytest.mark.filterwarnings("ignore:No application metrics")
def test_an_unreachable_tagging_api_is_reported_and_fails(
    estate: dict[str, ChannelSpec], lambda_env: LambdaEnv, webhook: WebhookSink,
    invoke: Callable[[Any], Any],
) -> None:
    failing = FailOnCall(nth=1)
    tagging = "before-call.resource-groups-tagging-api.GetResources"
    with injected(lambda_env.clients, tagging, failing), pytest.raises(
            AlarmStopped, match="3 queues not checked, 0 over threshold"):
        invoke({"scope": "dlq"})
    [post] = webhook.posts
    assert post["blocks"][0]["text"]["text"].startswith("⛔ Queue alarm stopped early")
    text = webhook.texts()[0]
    assert "EndpointConnectionError while reading the tags of the 3 queues holding" in text
    for spec in (estate["audit"], estate["emails"], estate["orders"]):
        assert spec.dlq_name in text


@pytest.mark.filterwarnings("ignore:No application metrics")
def test_queues_that_cannot_be_listed_are_reported_and_fail(
    estate: dict[str, ChannelSpec], lambda_env: LambdaEnv, webhook: WebhookSink,
    invoke: Callable[[Any], Any],
) -> None:
    with injected(lambda_env.clients, "before-call.sqs.ListQueues", FailOnCall(nth=1)), \
            pytest.raises(AlarmStopped, match="0 queues not checked, 0 over threshold"):
        invoke({"scope": "source"})
    [post] = webhook.posts
    assert post["blocks"][0]["text"]["text"].startswith("⛔ Queue alarm stopped early")
    assert "while listing the queues" in webhook.texts()[0]
    assert "no queue was checked" in webhook.texts()[0]


def test_posting_stops_before_the_lambda_runs_out_of_time(webhook: WebhookSink) -> None:
    # Given a report of three posts and a Lambda whose time falls under the post budget
    problems = tuple(QueueProblem(f"q{n}", f"q{n}", 500, 10, 60.0, False) for n in range(120))
    messages = queue_alarm_messages(QueueAlarmReport("source", "", datetime.now(UTC), 120,
                                                     problems))
    left = iter([100.0, 60.0, 3.0])

    delivered = post_all(SlackNotifier(lambda: webhook.url), messages, lambda: next(left))

    # Then the parts posted while time allowed arrived; the run counts as not delivered
    assert len(messages) == 3 and delivered is False
    assert [p["blocks"][0]["text"]["text"][-13:] for p in webhook.posts] == ["· part 1 of 3",
                                                                             "· part 2 of 3"]


def test_without_a_namespace_every_queue_is_read_and_only_unnamespaced_ones_alarm(
    lambda_env: LambdaEnv,
) -> None:
    sqs = lambda_env.clients.client("sqs")
    plain = ChannelSpec("plain")
    namespaced = ChannelSpec("plain", namespace=lambda_env.settings.namespace)
    for spec in (plain, namespaced):
        sqs.create_queue(QueueName=spec.queue_name, tags=spec.resource_tags("queue"))
        sqs.create_queue(QueueName=spec.dlq_name, tags=spec.resource_tags("dlq"))
        _depth(lambda_env, spec.queue_name, 500)

    report = check_queues(lambda_env.clients, "source", "", 100)

    assert report.checked == 2  # both source queues are read (no prefix narrows the list)
    assert [p.name for p in report.problems] == ["plain"]


def test_the_local_endpoint_publishes_what_the_alarm_reads(
    lambda_env: LambdaEnv, webhook: WebhookSink, invoke: Callable[[Any], Any]
) -> None:
    # Given a critical channel over its threshold, its messages sent, nothing written to
    # CloudWatch by hand: `messenger local` publishes SQS's own metrics
    spec = ChannelSpec("ledger", namespace=lambda_env.settings.namespace,
                       tags=ChannelTags(alarm_threshold=2, critical=True))
    channel = Provisioner(lambda_env.clients, lambda_env.settings).ensure_channel(spec)
    sqs = lambda_env.clients.client("sqs")
    sqs.send_message_batch(QueueUrl=channel.queue.url, Entries=[
        {"Id": str(n), "MessageBody": "{}"} for n in range(3)])

    result = invoke({"scope": "source"})

    # Then the alarm finds it through ApproximateNumberOfMessagesVisible, as on AWS
    assert result["critical"] == [spec.queue_name] and result["posted"] is True
    assert "Depth *3* / threshold 2" in webhook.texts()[0]


@pytest.mark.parametrize("value", ["abc", "-5", "1e3"])
def test_a_malformed_threshold_tag_is_reported_not_silently_replaced(
    lambda_env: LambdaEnv, webhook: WebhookSink, invoke: Callable[[Any], Any], value: str
) -> None:
    # Given a queue holding 3 messages whose threshold tag is not a whole number >= 0
    spec = ChannelSpec("tagged", namespace=lambda_env.settings.namespace)
    channel = Provisioner(lambda_env.clients, lambda_env.settings).ensure_channel(spec)
    sqs = lambda_env.clients.client("sqs")
    sqs.tag_queue(QueueUrl=channel.queue.url, Tags={"messenger:alarm-threshold": value})
    sqs.send_message_batch(QueueUrl=channel.queue.url, Entries=[
        {"Id": str(n), "MessageBody": "{}"} for n in range(3)])

    result = invoke({"scope": "source"})

    # Then the default (100) applies, and the post and the summary name the tag
    assert result["problems"] == []
    assert result["malformed_threshold_tags"] == [
        f"{spec.queue_name}: messenger:alarm-threshold={value!r}"]
    assert f"messenger:alarm-threshold=`{value}` is not a whole number" in webhook.texts()[0]
