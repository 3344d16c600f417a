"""Slack posts within the Lambda's remaining time, against the local webhook sink over HTTP."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import pytest
from slack_sdk.http_retry.builtin_interval_calculators import FixedValueRetryIntervalCalculator

from messenger.ops.slack import SlackNotifier
from messenger.tools.webhook_sink import WebhookSink

MESSAGE = {"text": "🚨 1 critical queue", "blocks": [
    {"type": "section", "text": {"type": "mrkdwn", "text": "*prod-payments* depth 11"}}]}


def lambda_with(seconds: float) -> Callable[[], float]:
    """A Lambda context's remaining time, in seconds, `seconds` from now."""
    deadline = time.monotonic() + seconds
    return lambda: deadline - time.monotonic()


def _undelivered(caplog: pytest.LogCaptureFixture) -> dict:
    record = next(r for r in caplog.records if r.getMessage() == "Slack webhook post failed")
    return json.loads(record.undelivered)


def test_a_429_whose_wait_outlasts_the_lambda_is_not_slept(
    webhook: WebhookSink, caplog: pytest.LogCaptureFixture
) -> None:
    # Given Slack rate-limiting every post with Retry-After 2, and a Lambda with 6 s left,
    # 1 s of it kept back
    webhook.fail_status, webhook.retry_after = 429, 2
    remaining = lambda_with(6.0)
    notifier = SlackNotifier(lambda: webhook.url, remaining=remaining, reserve=1.0)
    # When the report is posted
    with caplog.at_level(logging.WARNING):
        delivered = notifier.post(MESSAGE)
    # Then it retried once (the wait fitted), not a second time (it would not), ended with
    # time to spare, and logged the whole message it could not deliver
    assert delivered is False and webhook.requests == 2
    assert remaining() > 1.0
    assert _undelivered(caplog) == MESSAGE
    assert any("not retried" in r.getMessage() for r in caplog.records)


def test_a_hung_connection_is_retried_within_the_time_left(
    webhook: WebhookSink, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a Slack that reads each post and never answers, a 1 s attempt timeout, 0.2 s
    # between attempts, 3.5 s left
    webhook.hang = True
    remaining = lambda_with(3.5)
    notifier = SlackNotifier(lambda: webhook.url, timeout=1, remaining=remaining, reserve=0.5,
                             retry_interval=FixedValueRetryIntervalCalculator(0.2))
    with caplog.at_level(logging.WARNING):
        delivered = notifier.post(MESSAGE)
    # Then the timed-out attempt was retried, and the post gave up before the Lambda's end
    assert delivered is False and webhook.requests == 2
    assert remaining() > 0.5
    assert _undelivered(caplog) == MESSAGE


def test_a_transient_server_error_is_retried_and_delivered(webhook: WebhookSink) -> None:
    webhook.fail_status, webhook.fail_times = 503, 1
    notifier = SlackNotifier(lambda: webhook.url, remaining=lambda_with(60.0))
    assert notifier.post(MESSAGE) is True
    assert webhook.requests == 2 and webhook.posts == [MESSAGE]


def test_no_time_left_posts_nothing_and_logs_the_message(
    webhook: WebhookSink, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = SlackNotifier(lambda: webhook.url, remaining=lambda_with(4.0))  # reserve 5 s
    with caplog.at_level(logging.ERROR):
        assert notifier.post(MESSAGE) is False
    assert webhook.requests == 0 and _undelivered(caplog) == MESSAGE
