"""Pure parts of the ops Lambdas: classification rules, event and settings validation."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from messenger.errors import InvalidSettings
from messenger.ops.cleaner import (
    ACTIVE,
    IDLE,
    NO_CONSUMERS,
    NO_PRODUCERS,
    STALE,
    TOO_NEW,
    UNUSED,
    QueueActivity,
    QueueState,
    classify_activity,
    judge_idle,
)
from messenger.ops.inventory import PlatformResource
from messenger.ops.queue_alarm import InvalidEvent, parse_scope
from messenger.ops.settings import OpsSettings
from messenger.ops.slack import webhook_url_from_secret

NOW = datetime(2026, 11, 21, tzinfo=UTC)


@pytest.mark.parametrize(("activity", "verdict"), [
    (QueueActivity(5, 10, 10, 0), ACTIVE),
    (QueueActivity(0, 10, 0, 0), NO_CONSUMERS),
    (QueueActivity(None, 10, None, None), NO_CONSUMERS),
    (QueueActivity(0, 0, 0, 300), NO_PRODUCERS),   # polled, nothing sent
    (QueueActivity(0, None, 4, None), NO_PRODUCERS),
    (QueueActivity(0, 0, 0, 0), IDLE),
    (QueueActivity(None, None, None, None), IDLE),  # no data at all: the attributes decide
    (QueueActivity(12, 0, 0, 0), IDLE),             # messages sit there: the attributes decide
])
def test_activity_classification(activity: QueueActivity, verdict: str) -> None:
    assert classify_activity(activity) == verdict


def _state(messages: int, age: timedelta) -> QueueState:
    return QueueState(url="u", messages=messages, last_changed=NOW - age)


@pytest.mark.parametrize(("messages", "age", "verdict"), [
    (3, timedelta(days=30), STALE),
    (3, timedelta(hours=1), STALE),         # holding messages is never "unused"
    (0, timedelta(days=2), TOO_NEW),        # created/changed within the 3 days: keep, say nothing
    (0, timedelta(days=3, seconds=1), UNUSED),
])
def test_idle_queue_judged_by_its_attributes(messages: int, age: timedelta, verdict: str) -> None:
    assert judge_idle(_state(messages, age), NOW) == verdict


def test_missing_data_is_not_zero() -> None:
    assert not QueueActivity(None, None, None, None).has_data
    assert QueueActivity(0, None, None, None).has_data


@pytest.mark.parametrize("event", [{}, {"scope": "both"}, {"scope": 1}, None, "source"])
def test_scope_errors_name_field_and_values(event: object) -> None:
    with pytest.raises(InvalidEvent, match=r"event field 'scope' must be one of 'source', 'dlq'"):
        parse_scope(event)


def test_scopes() -> None:
    assert parse_scope({"scope": "source"}) == "source"
    assert parse_scope({"scope": "dlq", "extra": 1}) == "dlq"


def test_settings_from_the_lambda_environment() -> None:
    settings = OpsSettings.from_env({
        "SLACK_WEBHOOK_SECRET": "ops/slack", "MESSENGER_NAMESPACE": "prod",
        "MESSENGER_ALARM_THRESHOLD": "250", "CLEANER_DRY_RUN": "TRUE", "AWS_REGION": "eu-west-1",
        "MESSENGER_DLQ_ALARM_THRESHOLD": "4",
    })
    assert settings == OpsSettings(
        "ops/slack", "prod", default_alarm_threshold=250, dlq_alarm_threshold=4, dry_run=True,
        region="eu-west-1",
    )
    for mention in ("<!here>", "<!channel>", "<!subteam^S0123ABC>", "<@U024BE7LH>"):
        found = OpsSettings.from_env({"SLACK_WEBHOOK_SECRET": "s",
                                      "MESSENGER_CRITICAL_MENTION": mention})
        assert found.critical_mention == mention
    defaults = OpsSettings.from_env({"SLACK_WEBHOOK_SECRET": "s"})
    assert defaults.dry_run is False
    assert defaults.dlq_alarm_threshold == 0  # any dead letter alarms


@pytest.mark.parametrize(("env", "message"), [
    ({}, "SLACK_WEBHOOK_SECRET must name"),
    ({"SLACK_WEBHOOK_SECRET": "s", "CLEANER_DRY_RUN": "yes"},
     "CLEANER_DRY_RUN must be one of true, false, got 'yes'"),
    ({"SLACK_WEBHOOK_SECRET": "s", "MESSENGER_ALARM_THRESHOLD": "many"},
     "MESSENGER_ALARM_THRESHOLD must be a number"),
    ({"SLACK_WEBHOOK_SECRET": "s", "MESSENGER_DLQ_ALARM_THRESHOLD": "-1"},
     "MESSENGER_DLQ_ALARM_THRESHOLD must be a whole number >= 0"),
    ({"SLACK_WEBHOOK_SECRET": "s", "MESSENGER_CRITICAL_MENTION": "@here"},
     r"MESSENGER_CRITICAL_MENTION must be a Slack mention: '<!here>', .* got '@here'"),
])
def test_bad_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidSettings, match=message):
        OpsSettings.from_env(env)


def test_webhook_url_from_plain_or_json_secret() -> None:
    url = "https://hooks.slack.com/services/T/B/X"
    assert webhook_url_from_secret(url + "\n", "s") == url
    assert webhook_url_from_secret(json.dumps({"url": url}), "s") == url
    with pytest.raises(InvalidSettings, match="secret 'ops/slack' .* must hold the webhook URL"):
        webhook_url_from_secret("not a url", "ops/slack")


def test_resource_reads_its_tags() -> None:
    queue = PlatformResource(
        "arn:aws:sqs:us-east-1:123456789012:prod-orders",
        {"messenger:role": "queue", "messenger:alarm-threshold": "40",
         "messenger:critical": "true", "aws:cloudformation:stack-name": "shop"},
    )
    assert (queue.service, queue.name, queue.role, queue.stack) == (
        "sqs", "prod-orders", "queue", "shop"
    )
    assert queue.alarm_threshold(100) == 40 and queue.channel_tags.critical
    topic = PlatformResource("arn:aws:sns:us-east-1:123456789012:prod-events", {})
    assert topic.role == "topic" and topic.alarm_threshold(100) == 100 and topic.stack is None
