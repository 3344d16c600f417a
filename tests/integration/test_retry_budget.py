"""The retry budget holds on any botocore: a call ends within its budget plus one attempt.

A throttled call used to be retried by botocore (standard mode: 4 attempts, backoff of up to
1 + 2 + 4 s) whatever the budget: a throttled consumer ran past its budget, its shutdown cap,
its Lambda's remaining time. Only botocore 1.44.5 with messenger's replacement of its retry
handler held it (0.9-1.1 s inside a 0.3 s budget otherwise). Now every client makes one attempt
per try and `messenger.aws.BoundedRetries`, a handler of botocore's public `needs-retry` event,
makes the retries. `make test-other-botocore` runs this file on another botocore version.

Two kinds of throttling: a local HTTP endpoint that answers every request with a throttling
error (the wire), and botocore's `before-send` hooks on moto (tests/faults.py) for calls that
need a real endpoint behind the faults.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from botocore.exceptions import ClientError

from messenger import Producer, PublishFailed
from messenger.aws import (
    MAX_ATTEMPTS,
    ClientFactory,
    RequestCounter,
    call_with_budget,
    error_code,
)
from tests.faults import Throttle, injected

#: Allowance over the budget for the last attempt and a loaded machine (an attempt against a
#: loopback endpoint takes milliseconds, but with every core busy a process waited up to a
#: second for one: 2.06 s in a 1 s budget; botocore's unbounded backoff took 0.6-4 s more).
#: The precise check is `Sleeps.past`: no backoff sleeps past the deadline.
MARGIN = 1.0
#: How late a sleep may be asked for after its length was computed from the time left (a
#: loaded machine deschedules the thread in between: with every core busy a 0.26 s sleep
#: ended past the deadline by more than the 1 ms allowed before);
#: botocore's own backoff, which ignores the deadline, overshot it by far more.
SCHEDULING_SLACK = 0.1

#: What the throttling endpoint answers: (status, error code, body's content type).
ANSWERS = {
    "throttled": (400, "ThrottlingException"),
    "unavailable": (503, "ServiceUnavailable"),
}


class ThrottlingEndpoint:
    """A local HTTP endpoint that answers every request (SQS's JSON protocol) with `answer`
    (a key of ANSWERS); `requests` counts them."""

    def __init__(self, answer: str) -> None:
        status, code = ANSWERS[answer]
        body = (f'{{"__type":"com.amazonaws.sqs#{code}","message":"Rate exceeded"}}').encode()
        owner = self
        self.requests = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner.requests += 1
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.0")
                self.send_header("x-amzn-query-error", f"{code};Sender")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(params=sorted(ANSWERS))
def throttling(request: pytest.FixtureRequest) -> Iterator[ThrottlingEndpoint]:
    server = ThrottlingEndpoint(request.param)
    yield server
    server.close()


def warmed_up(clients: ClientFactory, endpoint: ThrottlingEndpoint) -> Any:
    """The factory's SQS client after one call (a first call also loads botocore's endpoint
    rules and credentials: tenths of a second on a busy machine, a budget's worth), with the
    endpoint's count set back to 0."""
    sqs = clients.client("sqs")
    with pytest.raises(PublishFailed):  # a budget of 0: one attempt
        call_with_budget(sqs.list_queues, 0, "warm-up")
    endpoint.requests = 0
    return sqs


class Sleeps:
    """Stands in for `time.sleep` (botocore's backoff before a retry is one) on the test's
    thread: records when each sleep was asked for and how long, then sleeps."""

    def __init__(self) -> None:
        self.asked: list[tuple[float, float]] = []
        self.thread = threading.get_ident()
        self.real: Callable[[float], None] = time.sleep

    def __call__(self, seconds: float) -> None:
        if threading.get_ident() == self.thread:
            self.asked.append((time.monotonic(), seconds))
        self.real(seconds)

    def past(self, deadline: float) -> list[tuple[float, float]]:
        """The sleeps that would end after `deadline` (SCHEDULING_SLACK allowed)."""
        return [(at, s) for at, s in self.asked if at + s > deadline + SCHEDULING_SLACK]


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> Sleeps:
    recorded = Sleeps()
    monkeypatch.setattr(time, "sleep", recorded)
    return recorded


@pytest.mark.parametrize("budget", [0.3, 1.0])
def test_a_call_inside_a_budget_against_an_endpoint_that_throttles_every_call_ends_in_it(
    throttling, sleeps, budget
):
    # Given an endpoint that throttles every request (400 ThrottlingException, or 503)
    sqs = warmed_up(ClientFactory("us-east-1", endpoint_url=throttling.url), throttling)
    # When a call is made within a retry budget
    started = time.monotonic()
    deadline = started + budget
    with pytest.raises(PublishFailed, match="retry budget") as failed:
        call_with_budget(sqs.list_queues, budget, "ListQueues", sleep=sleeps)
    elapsed = time.monotonic() - started
    # Then it fails with the endpoint's error, within the budget plus one attempt (botocore's
    # own backoff alone: up to 1 + 2 + 4 s)
    assert error_code(failed.value.__cause__) in {code for _, code in ANSWERS.values()}
    assert elapsed < budget + MARGIN, elapsed
    # and it was retried, but no backoff (botocore's or the budget's) slept past the deadline
    assert throttling.requests >= 2 and sleeps.asked
    assert sleeps.past(deadline) == [], (deadline, sleeps.asked)


@pytest.mark.parametrize("budget", [0.3, 1.0])
def test_a_call_outside_a_budget_against_an_endpoint_that_throttles_every_call_ends_in_its_own(
    throttling, sleeps, budget
):
    # Given a factory whose calls have `budget` seconds to retry (what a CLI or a Lambda gets)
    clients = ClientFactory("us-east-1", endpoint_url=throttling.url, call_budget=budget)
    sqs = warmed_up(clients, throttling)
    # When a call made outside any budget meets an endpoint that throttles every request
    started = time.monotonic()
    with pytest.raises(ClientError) as failed:
        sqs.list_queues()
    elapsed = time.monotonic() - started
    # Then it ends within its call budget plus one attempt, with botocore's own error for the
    # last response, which counts the retries made
    assert elapsed < budget + MARGIN, elapsed
    assert error_code(failed.value) in {code for _, code in ANSWERS.values()}
    retries = failed.value.response["ResponseMetadata"]["RetryAttempts"]
    assert retries == throttling.requests - 1 >= 1
    # and no backoff slept past the call's deadline
    assert sleeps.past(started + budget) == [], sleeps.asked


class BudgetedProducer(Producer):
    channel = "budgeted"


@pytest.mark.timeout(60)
def test_a_push_with_a_2_s_budget_throttled_on_every_call_gives_up_within_it(
    settings, sleeps
):
    # Given a provisioned channel whose every SQS request is then throttled, and a 2 s budget
    # (room for a retry even where a loaded machine makes the first attempt slow)
    clients = ClientFactory("us-east-1")
    producer = BudgetedProducer(settings=settings.with_changes(retry_budget_seconds=2),
                                clients=clients)
    # (one push first: the client, its endpoint rules and the queue's URL are then ready, so
    # the throttled push's budget goes to its attempts even on a loaded machine)
    producer.push({"n": 0})
    sends = RequestCounter().attach(clients)
    with injected(clients, "before-send.sqs", Throttle(1.0)):
        # When a message is pushed
        started = time.monotonic()
        with pytest.raises(PublishFailed, match="retry budget"):
            producer.push({"n": 1})
        elapsed = time.monotonic() - started
    # Then the push gives up within the budget plus one attempt, having retried, and no backoff
    # slept past the deadline (plain botocore's did: a 1 s budget took 1.8 s on 1.44.5 and up
    # to 4.7 s on 1.44.8)
    assert elapsed < 2 + MARGIN, elapsed
    assert sends.total >= 2
    assert sleeps.past(started + 2) == [], sleeps.asked


def test_a_call_throttled_before_its_budget_is_spent_is_retried(clients, sleeps):
    sqs = clients.client("sqs")
    url = sqs.create_queue(QueueName="retried")["QueueUrl"]
    sends = RequestCounter().attach(clients)
    budget_sleeps: list[float] = []
    # Given SQS throttling the next two requests, well within a 30 s budget
    with injected(clients, "before-send.sqs", Throttle(1.0, times=2)):
        # When a call is made within the budget
        answer = call_with_budget(lambda: sqs.get_queue_url(QueueName="retried"), 30,
                                  "GetQueueUrl", sleep=budget_sleeps.append)
    # Then the client retried it twice, with its own backoff, and it succeeded: the budget's
    # loop had nothing to do
    assert answer["QueueUrl"] == url
    assert answer["ResponseMetadata"]["RetryAttempts"] == 2
    assert sends.total == 3
    assert len(sleeps.asked) == 2 and budget_sleeps == []


def test_a_call_is_attempted_at_most_max_attempts_times_without_a_deadline(endpoint, sleeps):
    # Given a client whose calls have all the time they want (its backoffs recorded, not
    # slept: up to 1 + 2 + 4 + 8 s), and SQS throttling every request
    sleeps.real = lambda seconds: None
    clients = ClientFactory("us-east-1", call_budget=60)
    sqs = clients.client("sqs")
    sends = RequestCounter().attach(clients)
    with injected(clients, "before-send.sqs", Throttle(1.0)):
        # When a call is made
        with pytest.raises(ClientError) as failed:
            sqs.list_queues()
    # Then it is tried MAX_ATTEMPTS times (5, as botocore made with max_attempts=4 before), and
    # fails with the last throttled answer
    assert sends.total == MAX_ATTEMPTS == 5
    assert failed.value.response["ResponseMetadata"]["RetryAttempts"] == 4
    assert error_code(failed.value) == "Throttling"
    assert len(sleeps.asked) == 4


def test_an_error_not_worth_retrying_is_raised_at_once(clients, sleeps):
    sqs = clients.client("sqs")
    sends = RequestCounter().attach(clients)
    # When a call fails in a way a retry cannot mend (the queue does not exist)
    with pytest.raises(ClientError) as failed:
        sqs.get_queue_url(QueueName="nowhere")
    # Then it was attempted once, and no backoff was slept
    assert "NonExistentQueue" in error_code(failed.value) or "QueueDoesNotExist" in error_code(
        failed.value)
    assert sends.total == 1 and sleeps.asked == []
