"""Leases: the lease keeper renews them on its own thread, whatever else the consumer is doing;
a process that cannot run Python (a C call holding the GIL) is detected and reported."""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError

from messenger import ReceivedMessage
from messenger.aws import ClientFactory
from tests.integration.test_consumer_runtime import (  # noqa: F401 - fixtures
    Recording,
    producer_for,
    running,
    runtime,
    wait_until,
)


class Throttle:
    """A botocore `before-call` hook: SQS throttles an operation for `seconds`, from the first
    call after the first one that went through."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.calls = 0
        self.throttled = 0
        self.until: float | None = None
        self._lock = threading.Lock()

    def __call__(self, **_: Any) -> None:
        with self._lock:
            self.calls += 1
            now = time.monotonic()
            if self.until is None:
                self.until = now + self.seconds  # the first call passes
                return
            if now >= self.until:
                return
            self.throttled += 1
        raise ClientError(
            {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"},
             "ResponseMetadata": {"HTTPStatusCode": 400}},
            "DeleteMessageBatch",
        )


class Sleepy(Recording):
    channel = "lease_test"
    visibility_timeout = 2  # only renewals keep a message invisible longer than 2 s

    def handler(self, message: ReceivedMessage) -> None:
        time.sleep(message.body["sleep"])
        super().handler(message)


@pytest.mark.timeout(90)
def test_throttled_deletes_delay_no_lease_and_a_completed_message_stays_leased_until_deleted(
    settings, clients: ClientFactory, running  # noqa: F811
):
    # Given SQS throttling deletes for 6 s (past the consumer's 1 s retry budget, several times)
    # once the first batch went through, on a 2 s lease
    throttle = Throttle(seconds=6)
    producer = producer_for(settings, "lease_test")
    producer.push({"sleep": 0, "n": "first"})
    clients.register("before-call.sqs.DeleteMessageBatch", throttle)
    run = running(Sleepy, {"retry_budget_seconds": 1.0}, concurrency=4, delete_linger=0.1,
                  wait_time_seconds=1)
    wait_until(lambda: run.consumer.handled, timeout=20)
    wait_until(lambda: throttle.calls >= 1)
    # When a quick message (it completes while its delete is throttled) and an 8 s one arrive
    quick, long = producer.push_many(
        [{"sleep": 0, "n": "quick"}, {"sleep": 8, "n": "long"}]).message_ids
    wait_until(lambda: [e for e in run.consumer.named("completed") if e.message_id == quick])
    sqs = clients.client("sqs")
    url = run.consumer.resources.queue.url

    def queue_empty() -> bool:
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        return attributes["ApproximateNumberOfMessages"] == "0" and \
            attributes["ApproximateNumberOfMessagesNotVisible"] == "0"

    # (the long one ends 2 s past the throttle: a redelivery after a lapsed lease shows by then)
    assert throttle.until is not None
    wait_until(lambda: time.monotonic() > throttle.until and queue_empty(), timeout=40)
    run.stop(timeout=30)
    # Then each ran once and was received once: the long one's lease was renewed all along while
    # deletes were throttled, and the quick one's while its delete was retried (a lapse would
    # have had SQS hand it out again, three times ending in the DLQ)
    for message_id in (quick, long):
        assert [m.receive_count for m in run.consumer.handled
                if m.message_id == message_id] == [1]
        assert len([e for e in run.consumer.named("received")
                    if e.message_id == message_id]) == 1
    assert throttle.throttled > 0
    failed = [e for e in run.consumer.named("delete_failed") if e.message_id == quick]
    assert failed and all(e.fields["retry"] for e in failed)
    assert not run.consumer.named("lease_lapsed")
    assert not sqs.receive_message(QueueUrl=run.consumer.resources.dlq.url).get("Messages")


@pytest.mark.timeout(90)
def test_a_handler_holding_the_gil_past_the_lease_is_reported(settings, running):  # noqa: F811
    # A C call made with the GIL held (ctypes.PyDLL keeps it): no Python thread runs meanwhile
    hold_gil = ctypes.PyDLL(None).sleep

    class GilHolder(Sleepy):
        def handler(self, message: ReceivedMessage) -> None:
            if message.receive_count == 1:
                hold_gil(4)  # 4 s without any Python thread running; the lease is 2 s
            Recording.handler(self, message)

    producer = producer_for(settings, "lease_test")
    message_id = producer.push({"sleep": 0, "n": "gil"})
    run = running(GilHolder, concurrency=2, wait_time_seconds=1)
    # (a loaded machine may stall the process for a second or two before the handler does:
    # the GIL holder's stall is the one of 3 s or more)
    stalled = wait_until(lambda: [e for e in run.consumer.named("stalled")
                                  if e.fields["seconds"] >= 3.0], timeout=30)
    lapsed = wait_until(lambda: run.consumer.named("lease_lapsed"), timeout=10)
    wait_until(lambda: run.consumer.handled)
    run.stop(timeout=30)
    # Then the stall is logged with its length, and the message whose lease ran out is named
    # (by the lease keeper when it still runs, else by its worker when it finishes)
    assert stalled[0].fields["seconds"] >= 3.0
    assert lapsed[0].message_id == message_id
    assert lapsed[0].fields["visibility_timeout"] == 2
    assert lapsed[0].level >= 30  # a warning or worse
