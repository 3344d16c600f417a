"""Messages a consumer cannot process all end in the DLQ with a reason, the consumer keeps
running, and the requeuer brings them back."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from messenger.channel import physical_name
from messenger.message import DEAD_LETTER_FAILURE_ATTRIBUTE, DEAD_LETTER_REASON_ATTRIBUTE
from messenger.operations.requeue import Requeuer
from messenger.provision import Provisioner
from tests.reliability.apps import CHANNEL, TimeoutLedgerConsumer
from tests.reliability.conftest import drain_all, message_id_of

EACH = 3  # messages of each kind


def dlq_depth(sqs, url: str) -> int:
    attributes = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"])


def peek(sqs, url: str, expected: int) -> dict[str, dict]:
    """The queue's messages by message id, left in place (hidden 1 s while read, then made
    visible again at once; one whose second ran out meanwhile is visible already)."""
    seen: dict[str, dict] = {}
    for _ in range(expected + 2):
        response = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=1, WaitTimeSeconds=0,
            MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"])
        for raw in response.get("Messages", []):
            seen[message_id_of(raw)] = raw
        if len(seen) >= expected:
            break
    handles = [raw["ReceiptHandle"] for raw in seen.values()]
    for first in range(0, len(handles), 10):
        sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
            {"Id": str(n), "ReceiptHandle": handle, "VisibilityTimeout": 0}
            for n, handle in enumerate(handles[first : first + 10])])
    return seen


@pytest.mark.timeout(180)
def test_poison_non_json_missing_payload_and_timeout_all_reach_the_dlq_with_a_reason(
    harness, producer_class, settings, clients, report
):
    sqs, s3 = clients.client("sqs"), clients.client("s3")
    producer = producer_class(settings=settings)
    # Given, in one queue: poison messages (the handler always raises)...
    kinds = {"poison": producer.push_many([{"poison": True}] * EACH).message_ids}
    # ... bodies that are not JSON (sent by a foreign client, with a message id)...
    url = harness.queue_url()
    kinds["non_json"] = []
    for n in range(EACH):
        message_id = uuid.uuid4().hex
        sqs.send_message(QueueUrl=url, MessageBody=f"<order id={n}>not json", MessageAttributes={
            "message_id": {"DataType": "String", "StringValue": message_id}})
        kinds["non_json"].append(message_id)
    # ... offloaded bodies whose S3 object is gone...
    large = producer_class(settings=settings.with_changes(offload_threshold=1024))
    kinds["payload_missing"] = large.push_many([{"pad": "x" * 2048}] * EACH).message_ids
    bucket = Provisioner(clients, settings).ensure_bucket()
    objects = s3.list_objects_v2(Bucket=bucket).get("Contents", [])
    assert len(objects) == EACH
    for found in objects:
        s3.delete_object(Bucket=bucket, Key=found["Key"])
    # ... handlers that run past the 1 s processing timeout, and normal messages
    kinds["processing_timeout"] = producer.push_many([{"sleep": 2.5}] * EACH).message_ids
    normal = producer.push_many({"n": n} for n in range(5)).message_ids
    bad = {message_id: kind for kind, ids in kinds.items() for message_id in ids}
    assert None not in bad and None not in normal and len(bad) == 4 * EACH

    # When a consumer (max_receives 3, retry delay 1 s) works through them
    began = time.monotonic()
    consumer = harness.start("TimeoutLedgerConsumer", MESSENGER_CONCURRENCY="4")
    dlq_url = harness.queue_url(dlq=True)
    deadline = time.monotonic() + 60
    while dlq_depth(sqs, dlq_url) < len(bad) and time.monotonic() < deadline:
        time.sleep(0.3)
    harness.wait_processed(normal, timeout=20)

    # Then it is still running and processes a normal message pushed afterwards
    assert consumer.process.poll() is None
    after = producer.push({"n": "after"})
    harness.wait_processed([after], timeout=20)
    assert after in harness.processed()
    assert consumer.terminate() == 0

    # And every bad message is in the DLQ with its reason
    dead = peek(sqs, dlq_url, len(bad))
    assert set(dead) == set(bad)
    reasons = {
        message_id: raw.get("MessageAttributes", {}).get(DEAD_LETTER_REASON_ATTRIBUTE, {})
        .get("StringValue", "") for message_id, raw in dead.items()
    }
    expected_prefix = {"non_json": "undecodable: message body is not JSON",
                       "payload_missing": "payload_missing: offloaded payload s3://",
                       "processing_timeout": "processing_timeout: exceeded 1 s"}
    for message_id, kind in bad.items():
        if kind in expected_prefix:
            assert reasons[message_id].startswith(expected_prefix[kind]), reasons[message_id]
            # a verdict other than a handler's failure: when and who, no error fields
            note = json.loads(dead[message_id]["MessageAttributes"]
                              [DEAD_LETTER_FAILURE_ATTRIBUTE]["StringValue"])
            assert set(note) == {"attempts", "at", "consumer"} and note["attempts"] >= 1, note
    # Poison ones ran max_receives times; the consumer forwarded each on its last attempt with
    # its error and traceback (SQS's redrive is only the safety net for consumers that die).
    attempts = [json.loads(line) for line in harness.lines("attempts")]
    allowed = TimeoutLedgerConsumer.max_receives
    for message_id in kinds["poison"]:
        assert reasons[message_id] == f"failed: attempts used up ({allowed} of {allowed})"
        counts = sorted(a["receive_count"] for a in attempts if a["message_id"] == message_id)
        assert counts == list(range(1, allowed + 1)), counts
        note = json.loads(dead[message_id]["MessageAttributes"][DEAD_LETTER_FAILURE_ATTRIBUTE]
                          ["StringValue"])
        assert note["error_type"] and "Traceback" in note["traceback"], note
    assert not set(bad) & set(harness.processed())

    # When the requeuer moves the DLQ back to the channel
    moved = Requeuer(physical_name(f"{CHANNEL}-dlq", settings.namespace), CHANNEL,
                     settings=settings, clients=clients).start()
    # Then all of them are back in the source queue, without the consumer's reason
    back = drain_all(sqs, url)
    assert moved.moved == len(bad) and moved.failed == 0
    assert sorted(message_id_of(raw) for raw in back) == sorted(bad), (
        sorted(str(bad.get(message_id_of(raw))) for raw in back))
    assert all(not {DEAD_LETTER_REASON_ATTRIBUTE, DEAD_LETTER_FAILURE_ATTRIBUTE}
               & set(raw.get("MessageAttributes", {})) for raw in back)
    assert drain_all(sqs, dlq_url) == []
    ledger = harness.collect([*bad, *normal, after])
    ledger.in_queue = [message_id_of(raw) for raw in back]
    ledger.in_dlq = list(dead)
    by_kind: dict[str, list[str]] = {}
    for message_id, kind in bad.items():
        by_kind.setdefault(kind, []).append(reasons[message_id].split(":")[0])
    line = ledger.report("dead_letters", dead_lettered=len(dead), requeued=moved.moved,
                         reasons=by_kind, seconds=round(time.monotonic() - began, 1))
    report(line)
    assert ledger.lost == set(), line
