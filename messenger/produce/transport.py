"""Where a producer's messages go: an SQS queue or an SNS topic, behind one small interface."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from messenger.channel import SNS_MAX_MESSAGE_BYTES, SQS_MAX_MESSAGE_BYTES
from messenger.message import EncodedMessage


@dataclass(frozen=True)
class OutgoingMessage:
    """An encoded message plus its FIFO fields."""

    encoded: EncodedMessage
    group_id: str | None = None
    dedup_id: str | None = None


@dataclass(frozen=True)
class EntryFailure:
    """One failed entry of a batch call: its index in the batch, error code and whose fault."""

    index: int
    code: str
    message: str
    sender_fault: bool


class QueueTarget:
    """Sends to one SQS queue."""

    #: A SendMessageBatch request carries at most 1 MiB in all.
    max_batch_bytes = SQS_MAX_MESSAGE_BYTES

    def __init__(self, sqs: Any, url: str) -> None:
        self.sqs = sqs
        self.url = url

    def send(self, message: OutgoingMessage, delay_seconds: int = 0) -> str:
        """Send one message; `delay_seconds` (0-900, standard queues) hides it that long."""
        delay = {"DelaySeconds": delay_seconds} if delay_seconds else {}
        response = self.sqs.send_message(
            QueueUrl=self.url,
            MessageBody=message.encoded.body,
            MessageAttributes=message.encoded.attributes,
            **_fifo_fields(message),
            **delay,
        )
        return str(response["MessageId"])

    def send_batch(self, messages: list[OutgoingMessage]) -> list[EntryFailure]:
        entries = [
            {
                "Id": str(index),
                "MessageBody": message.encoded.body,
                "MessageAttributes": message.encoded.attributes,
                **_fifo_fields(message),
            }
            for index, message in enumerate(messages)
        ]
        response = self.sqs.send_message_batch(QueueUrl=self.url, Entries=entries)
        return _failures(response)


class TopicTarget:
    """Publishes to one SNS topic."""

    #: A PublishBatch request carries at most 256 KiB in all.
    max_batch_bytes = SNS_MAX_MESSAGE_BYTES

    def __init__(self, sns: Any, arn: str) -> None:
        self.sns = sns
        self.arn = arn

    def send(self, message: OutgoingMessage) -> str:
        response = self.sns.publish(
            TopicArn=self.arn,
            Message=message.encoded.body,
            MessageAttributes=message.encoded.attributes,
            **_fifo_fields(message),
        )
        return str(response["MessageId"])

    def send_batch(self, messages: list[OutgoingMessage]) -> list[EntryFailure]:
        entries = [
            {
                "Id": str(index),
                "Message": message.encoded.body,
                "MessageAttributes": message.encoded.attributes,
                **_fifo_fields(message),
            }
            for index, message in enumerate(messages)
        ]
        response = self.sns.publish_batch(TopicArn=self.arn, PublishBatchRequestEntries=entries)
        return _failures(response)


def _fifo_fields(message: OutgoingMessage) -> dict[str, str]:
    fields = {}
    if message.group_id is not None:
        fields["MessageGroupId"] = message.group_id
    if message.dedup_id is not None:
        fields["MessageDeduplicationId"] = message.dedup_id
    return fields


def _failures(response: dict[str, Any]) -> list[EntryFailure]:
    return [
        EntryFailure(
            index=int(failed["Id"]),
            code=str(failed.get("Code", "")),
            message=str(failed.get("Message", "")),
            sender_fault=bool(failed.get("SenderFault", False)),
        )
        for failed in response.get("Failed", [])
    ]
