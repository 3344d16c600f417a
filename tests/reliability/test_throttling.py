"""30 % of the SQS calls throttled, on the producer and in the consumer process: nothing lost."""

from __future__ import annotations

import json
import time

import pytest

from messenger.aws import ClientFactory
from tests.faults import Throttle
from tests.reliability.apps import SQS_OPERATIONS

RATE = 0.3
MESSAGES = 100


@pytest.mark.timeout(180)
def test_30_percent_throttling_on_send_receive_delete_loses_nothing(
    harness, producer_class, settings, report
):
    # Given a producer and a consumer process whose SQS calls are throttled 30 % of the time
    clients = ClientFactory(settings.region)
    producer = producer_class(settings=settings, clients=clients)
    producer.push_many([])  # provisioning is not what this test throttles
    throttle = Throttle(RATE, set(SQS_OPERATIONS))
    clients.register("before-send", throttle)
    began = time.monotonic()
    consumer = harness.start(MESSENGER_CONCURRENCY="10", RELIABILITY_THROTTLE=str(RATE))
    # When 100 messages go through (botocore's retries and the retry budget absorb the errors)
    acknowledged, failures = [], []
    for first in range(0, MESSAGES, 50):
        result = producer.push_many({"n": n} for n in range(first, first + 50))
        acknowledged += [i for i in result.message_ids if i is not None]
        failures += result.failures
    harness.wait_processed(acknowledged, timeout=120)
    assert consumer.terminate() == 0
    # Then every acknowledged message was processed or is still queued
    ledger = harness.collect(acknowledged)
    consumer_faults = [json.loads(line) for line in harness.lines("faults")]
    line = ledger.report(
        "throttling", rate=RATE, producer_throttled=throttle.injected,
        producer_passed=throttle.passed,
        consumer_throttled=sum(f["injected"] for f in consumer_faults),
        consumer_passed=sum(f["passed"] for f in consumer_faults),
        seconds=round(time.monotonic() - began, 1),
    )
    report(line)
    assert not failures, failures[:3]
    assert len(acknowledged) == MESSAGES
    assert ledger.lost == set(), line
    # (the faults really happened, on both sides)
    assert throttle.injected > 0 and line["consumer_throttled"] > 0, line
    events = [e.get("event") for e in consumer.events()]
    assert "fatal" not in events
