"""messenger.aws.BoundedRetries decides each retry of a client's call, without a network: what is
retried (what botocore's standard mode retries, and messenger's transient errors), how often, and
never past the deadline."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import (
    ConnectionClosedError,
    EndpointConnectionError,
    ParamValidationError,
    ReadTimeoutError,
)

from messenger.aws import MAX_ATTEMPTS, BoundedRetries, client_config


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def answer(status: int, code: str = "") -> tuple[AWSResponse, dict[str, Any]]:
    """botocore's (http response, parsed) pair for an attempt answered `status` with `code`."""
    parsed: dict[str, Any] = {"ResponseMetadata": {"HTTPStatusCode": status}}
    if code:
        parsed["Error"] = {"Code": code, "Message": "..."}
    return AWSResponse("https://sqs.example", status, {}, None), parsed


def retries(deadline: float | None = None, clock: Clock | None = None) -> BoundedRetries:
    # the backoff drawn is its upper bound: the longest botocore's standard mode could choose
    return BoundedRetries(deadline=lambda: deadline, clock=clock or Clock(), draw=lambda high: high)


@pytest.mark.parametrize("status,code", [
    (400, "ThrottlingException"), (400, "Throttling"), (400, "RequestThrottled"),
    (400, "ProvisionedThroughputExceededException"),  # DynamoDB's throttling
    (400, "KMSThrottlingException"), (503, "SlowDown"), (500, "InternalError"),
    (503, ""), (502, ""), (504, "Whatever"), (429, ""), (400, "RequestTimeout"),
])
def test_a_throttled_5xx_or_timed_out_answer_is_retried(status, code):
    assert retries()(attempts=1, response=answer(status, code)) == 1.0


@pytest.mark.parametrize("failure", [
    EndpointConnectionError(endpoint_url="https://sqs.example"),
    ConnectionClosedError(endpoint_url="https://sqs.example"),
    ReadTimeoutError(endpoint_url="https://sqs.example"),
])
def test_a_broken_or_timed_out_attempt_is_retried(failure):
    assert retries()(attempts=1, caught_exception=failure) == 1.0


@pytest.mark.parametrize("status,code", [
    (200, ""), (400, "AWS.SimpleQueueService.NonExistentQueue"), (403, "AccessDenied"),
    (400, "InvalidParameterValue"), (404, "NoSuchKey"),
])
def test_a_success_or_an_error_a_retry_cannot_mend_is_not_retried(status, code):
    # False, not None: the first answer that is not None is botocore's decision
    assert retries()(attempts=1, response=answer(status, code)) is False


def test_an_exception_that_is_not_a_connection_failure_is_not_retried():
    assert retries()(attempts=1, caught_exception=ParamValidationError(report="x")) is False


def test_an_error_the_operation_model_marks_retryable_is_retried():
    # Given an operation whose model has an error shape with the retryable trait
    class Shape:
        name, error_code, metadata = "Busy", "Busy", {"retryable": {"throttling": False}}

    class Operation:
        error_shapes = [Shape()]

    # Then that error is retried, another is not
    assert retries()(attempts=1, response=answer(400, "Busy"), operation=Operation()) == 1.0
    assert retries()(attempts=1, response=answer(400, "Idle"), operation=Operation()) is False


def test_the_backoff_doubles_with_full_jitter_and_stops_at_the_last_attempt():
    handler = retries()
    throttled = answer(400, "Throttling")
    # as botocore's standard mode draws it: up to 1, 2, 4, 8 s before the 2nd to 5th attempt,
    # then no more
    assert [handler(attempts=n, response=throttled) for n in range(1, MAX_ATTEMPTS + 1)] == [
        1.0, 2.0, 4.0, 8.0, False]
    drawn = BoundedRetries(deadline=lambda: None, draw=lambda high: high / 3)
    assert drawn(attempts=3, response=throttled) == pytest.approx(4 / 3)


def test_no_backoff_sleeps_past_the_deadline_and_none_is_made_after_it():
    clock = Clock(100.0)
    handler = retries(deadline=100.3, clock=clock)
    throttled = answer(400, "Throttling")
    # Given 0.3 s left: the 1 s backoff is cut to what is left
    assert handler(attempts=1, response=throttled) == pytest.approx(0.3)
    # When the deadline has passed: no retry at all
    clock.now = 100.3
    assert handler(attempts=1, response=throttled) is False
    clock.now = 250.0
    assert handler(attempts=2, response=throttled) is False


def test_a_client_config_leaves_botocore_one_attempt_per_try():
    # botocore's own retries (a backoff chosen without the deadline) are off: the handler makes
    # them
    config = client_config()
    assert config.retries == {"mode": "standard", "total_max_attempts": 1}


def test_the_factory_handler_answers_first_on_the_clients_retry_event(monkeypatch):
    # Given a factory client, whose retry event also holds botocore's own handler
    from messenger.aws import ClientFactory

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    client = ClientFactory("us-east-1").client("sqs")
    operation = client.meta.service_model.operation_model("ListQueues")
    # When the event is emitted for a throttled attempt, through botocore's public emitter
    answers = client.meta.events.emit(
        "needs-retry.sqs.ListQueues", response=answer(400, "Throttling"), endpoint=None,
        operation=operation, attempts=1, caught_exception=None, request_dict={"context": {}})
    # Then messenger's handler answered first, a backoff of at most 1 s, and botocore's (one
    # attempt per try) did not ask for a retry
    (handler, first), *others = answers
    assert isinstance(handler, BoundedRetries)
    assert isinstance(first, float) and 0 <= first <= 1.0
    assert others and all(value in (None, False) for _, value in others)
