"""Offloaded sends where one of the two writes fails: the producer raises or retries, and no
message in the queue refers to a missing S3 object."""

from __future__ import annotations

import time

import pytest

from messenger import PublishFailed
from messenger.aws import ClientFactory, RequestCounter
from messenger.offload import OffloadPointer
from messenger.provision import Provisioner
from tests.faults import Throttle
from tests.reliability.conftest import drain_all, message_id_of

LARGE = {"pad": "x" * 1100 * 1024}  # 1,100 KiB: above every default threshold, offloaded
SEND_OPERATIONS = {"SendMessage", "SendMessageBatch"}


def referenced_objects(harness, s3) -> dict[str, bool]:
    """message id -> whether its S3 object exists, for every offloaded message in the queue."""
    found = {}
    for raw in drain_all(harness.clients.client("sqs"), harness.queue_url()):
        pointer = OffloadPointer.parse(raw["Body"], raw.get("MessageAttributes"))
        assert pointer is not None
        try:
            s3.head_object(Bucket=pointer.bucket, Key=pointer.key)
            found[message_id_of(raw)] = True
        except s3.exceptions.ClientError:
            found[message_id_of(raw)] = False
    return found


@pytest.mark.timeout(60)
def test_s3_put_succeeds_and_the_send_fails_no_message_refers_to_a_missing_object(
    harness, producer_class, settings, report
):
    # Given a producer (1 s retry budget) that already sent two large messages
    clients = ClientFactory(settings.region)
    producer = producer_class(settings=settings.with_changes(retry_budget_seconds=1.0),
                              clients=clients)
    acknowledged = [producer.push(LARGE), producer.push(LARGE)]
    # When SQS rejects every send (throttled past botocore's retries and the budget) while S3
    # keeps accepting the payloads
    throttle = Throttle(1.0, SEND_OPERATIONS)
    clients.register("before-send", throttle)
    began = time.monotonic()
    with pytest.raises(PublishFailed):  # each within its 1 s budget, botocore's retries included
        producer.push(LARGE)
    result = producer.push_many([LARGE] * 2)
    clients.unregister("before-send", throttle)
    # Then push raised, push_many reported every item as failed, nothing was acknowledged
    assert result.message_ids == [None] * 2
    assert len(result.failures) == 2
    # And every message in the queue is an acknowledged one whose S3 object exists
    s3 = clients.client("s3")
    referenced = referenced_objects(harness, s3)
    assert sorted(referenced) == sorted(acknowledged)
    assert all(referenced.values()), referenced
    bucket = Provisioner(clients, settings).ensure_bucket()
    stored = s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0)
    line = {"test": "s3_ok_send_fails", "acknowledged": len(acknowledged),
            "in_queue": len(referenced), "missing_objects": list(referenced.values()).count(False),
            "failed_pushes": 1 + len(result.failures), "send_attempts_throttled": throttle.injected,
            # Payloads of failed sends stay in S3 until the bucket's lifecycle rule expires them.
            "orphan_objects": stored - len(referenced),
            "seconds": round(time.monotonic() - began, 1)}
    report(line)
    assert line["orphan_objects"] == 3, line


@pytest.mark.timeout(60)
def test_s3_put_fails_nothing_is_sent(harness, producer_class, settings, report):
    # Given a producer whose channel exists, and S3 refusing every PutObject
    clients = ClientFactory(settings.region)
    producer = producer_class(settings=settings.with_changes(retry_budget_seconds=1.0),
                              clients=clients)
    small = producer.push({"n": 1})
    throttle = Throttle(1.0, {"PutObject"})
    clients.register("before-send", throttle)
    counter = RequestCounter().attach(clients)
    # When a large message is pushed (push_many offloads each item the same way)
    with pytest.raises(PublishFailed):
        producer.push(LARGE)
    # Then the push raised and no SQS send was even attempted
    sends = counter.counts["sqs.SendMessage"] + counter.counts["sqs.SendMessageBatch"]
    assert throttle.injected > 0
    assert sends == 0
    queued = [message_id_of(raw) for raw in drain_all(clients.client("sqs"), harness.queue_url())]
    report({"test": "s3_fails", "acknowledged": 1, "in_queue": len(queued),
            "put_attempts_throttled": throttle.injected, "sqs_sends": sends})
    assert queued == [small]
