"""The retry budget bounds botocore's own retries of throttled responses, against moto.

A throttled call used to be retried by botocore (standard mode: 4 attempts, backoff of up to
1 + 2 + 4 s) whatever the budget: a throttled consumer ran past its budget, its shutdown cap,
its Lambda's remaining time. Faults come through botocore's event hooks (tests/faults.py), so
botocore parses and retries them as real throttled responses. Nothing here measures wall time:
the tests count the attempts started once the deadline had passed and add up the sleeps asked
for, which a deadline-bound retry loop keeps within the budget on any machine.
"""

from __future__ import annotations

import time
from typing import Any

import boto3
import botocore.endpoint
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from messenger import PublishFailed
from messenger.aws import ClientFactory, call_with_budget, error_code, retry_deadline
from tests.faults import Throttle, injected


class Attempts:
    """botocore `before-send` hook: counts the requests of the calls, and those started once the
    current call's retry deadline (`messenger.aws.retry_deadline`) had passed."""

    def __init__(self) -> None:
        self.total = self.past_deadline = 0

    def __call__(self, **_: Any) -> None:
        deadline = retry_deadline()
        self.total += 1
        self.past_deadline += deadline is not None and time.monotonic() >= deadline


class Sleeps:
    """Stands in for `time` in botocore.endpoint: records the backoff botocore sleeps before
    each retry (the delay its `needs-retry` handlers answered), then sleeps it."""

    def __init__(self) -> None:
        self.requested: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        self.requested.append(seconds)
        time.sleep(seconds)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> Sleeps:
    recorded = Sleeps()
    monkeypatch.setattr(botocore.endpoint, "time", recorded)
    return recorded


def counted(clients: ClientFactory) -> Attempts:
    attempts = Attempts()
    clients.register("before-send.sqs", attempts)
    return attempts


def test_a_throttled_call_inside_a_budget_stops_retrying_at_the_budget(clients, sleeps):
    sqs = clients.client("sqs")
    attempts = counted(clients)
    budget_sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        budget_sleeps.append(seconds)
        time.sleep(seconds)

    # Given SQS throttling every request for longer than a 0.3 s retry budget
    with injected(clients, "before-send.sqs", Throttle(1.0)):
        # When a call is made within that budget
        with pytest.raises(PublishFailed, match="retry budget") as failed:
            call_with_budget(sqs.list_queues, 0.3, "ListQueues", sleep=sleep)
    # Then it fails with the throttling error botocore raised
    assert error_code(failed.value.__cause__) == "Throttling"
    # and at most one attempt started once the budget was spent (botocore used to go on with
    # its 4 attempts per call), so the call ends within the budget plus one attempt
    assert attempts.total >= 1 and attempts.past_deadline <= 1, vars(attempts)
    # and no backoff slept past the budget: botocore's and the budget's own sleeps, each capped
    # at the time left, add up to no more than the budget (botocore's alone: up to 1 + 2 + 4 s)
    assert sum(sleeps.requested) + sum(budget_sleeps) <= 0.3 + 1e-9, (sleeps.requested,
                                                                     budget_sleeps)


@pytest.mark.parametrize("fast", ["1", "0"], ids=["wrapped-handler", "plain-botocore"])
def test_a_throttled_call_outside_a_budget_stops_retrying_at_the_call_budget(
    endpoint, sleeps, monkeypatch, fast
):
    # Given a factory whose calls have 0.3 s to retry (what a CLI or a Lambda gets), on the
    # fast paths (botocore's retry handler wrapped) or plain botocore (a first hook only)
    monkeypatch.setenv("MESSENGER_FAST_BOTOCORE", fast)
    clients = ClientFactory("us-east-1", call_budget=0.3)
    assert clients.fast_paths.on is (fast == "1")
    sqs = clients.client("sqs")
    attempts = counted(clients)
    # When SQS throttles every request of a call made outside any budget
    with injected(clients, "before-send.sqs", Throttle(1.0)):
        with pytest.raises(ClientError) as failed:
            sqs.list_queues()
    # Then botocore stops retrying once the call budget is spent: at most one attempt after it
    assert error_code(failed.value) == "Throttling"
    assert attempts.past_deadline <= 1, vars(attempts)
    assert failed.value.response["ResponseMetadata"]["RetryAttempts"] == attempts.total - 1
    if fast == "1":
        # and (botocore's handler wrapped) its backoff never sleeps past the call budget
        assert sum(sleeps.requested) <= 0.3 + 1e-9, sleeps.requested


def test_a_call_past_its_deadline_raises_the_error_botocore_raises_when_it_does_not_retry(
    endpoint,
):
    # Given a factory's client whose calls have no time to retry, and boto3's own client that
    # makes one attempt only
    clients = ClientFactory("us-east-1", call_budget=0)
    ours = clients.client("sqs")
    plain = boto3.client("sqs", region_name="us-east-1",
                         config=Config(retries={"mode": "standard", "total_max_attempts": 1}))
    throttle = Throttle(1.0)
    plain.meta.events.register("before-send.sqs", throttle)
    # When both are throttled
    with injected(clients, "before-send.sqs", throttle):
        with pytest.raises(ClientError) as stopped:
            ours.get_queue_url(QueueName="nowhere")
    with pytest.raises(ClientError) as botocores:
        plain.get_queue_url(QueueName="nowhere")
    # Then the caller sees botocore's own error for that response: class, code, operation,
    # metadata (no retry made), but for botocore's note that the attempts allowed ran out
    # (they did not: the deadline passed), which also adds "(reached max retries: ...)" to
    # its message
    ours_error, plain_error = stopped.value, botocores.value
    assert type(ours_error) is type(plain_error)
    assert ours_error.operation_name == plain_error.operation_name == "GetQueueUrl"
    assert ours_error.response["Error"] == plain_error.response["Error"]
    assert ours_error.response["ResponseMetadata"]["RetryAttempts"] == 0
    plain_metadata = dict(plain_error.response["ResponseMetadata"])
    assert plain_metadata.pop("MaxAttemptsReached") is True
    assert ours_error.response["ResponseMetadata"] == plain_metadata
    unnoted = type(plain_error)(dict(plain_error.response, ResponseMetadata=plain_metadata),
                                "GetQueueUrl")
    assert str(ours_error) == str(unnoted)
    assert throttle.injected == 2


def test_a_call_throttled_before_its_budget_is_spent_is_retried_by_botocore(clients, sleeps):
    sqs = clients.client("sqs")
    url = sqs.create_queue(QueueName="retried")["QueueUrl"]
    attempts = counted(clients)
    budget_sleeps: list[float] = []
    # Given SQS throttling the next two requests, well within a 30 s budget
    with injected(clients, "before-send.sqs", Throttle(1.0, times=2)):
        # When a call is made within the budget
        answer = call_with_budget(lambda: sqs.get_queue_url(QueueName="retried"), 30,
                                  "GetQueueUrl", sleep=budget_sleeps.append)
    # Then botocore retried it twice, with its own backoff, and it succeeded
    assert answer["QueueUrl"] == url
    assert answer["ResponseMetadata"]["RetryAttempts"] == 2
    assert attempts.total == 3 and attempts.past_deadline == 0
    assert len(sleeps.requested) == 2 and budget_sleeps == []
