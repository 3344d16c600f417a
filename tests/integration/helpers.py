"""Small helpers for integration tests: read what a queue holds, over HTTP, like a consumer."""

from __future__ import annotations

from typing import Any

from messenger.message import Message
from messenger.offload import OffloadPointer, PayloadStore


def drain(sqs: Any, queue_url: str, limit: int = 10_000) -> list[dict[str, Any]]:
    """Receive and delete every message of a queue; returns the raw messages in receive order."""
    received: list[dict[str, Any]] = []
    empty_polls = 0
    while len(received) < limit and empty_polls < 2:
        response = sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
            WaitTimeSeconds=0,
        )
        messages = response.get("Messages", [])
        if not messages:
            empty_polls += 1
            continue
        empty_polls = 0
        received.extend(messages)
        sqs.delete_message_batch(
            QueueUrl=queue_url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ],
        )
    return received


def decode(raw: dict[str, Any], s3: Any = None) -> Message:
    """Decode a raw received message, fetching an offloaded body from S3."""
    attributes = raw.get("MessageAttributes", {})
    body = raw["Body"]
    pointer = OffloadPointer.parse(body, attributes)
    if pointer is not None:
        body = PayloadStore(s3, pointer.bucket).get(pointer)
    return Message.decode(body, attributes, fallback_id=raw["MessageId"])


def queue_url(sqs: Any, name: str) -> str:
    return str(sqs.get_queue_url(QueueName=name)["QueueUrl"])
