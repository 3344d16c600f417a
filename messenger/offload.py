"""Large payloads in S3, in the AWS extended-client pointer format.

A message whose encoded size exceeds the threshold is sent with the body
`["software.amazon.payloadoffloading.PayloadS3Pointer", {"s3BucketName": B, "s3Key": K}]`
and the Number attribute `ExtendedPayloadSize` (the original body's size), exactly as AWS's
Amazon SQS Extended Client Library (Java, Python) writes it, so either side can read the other's
messages. Objects are never deleted on consume (an exchange fans one object out to several
queues); the bucket's lifecycle rule expires them after the retention period plus a margin.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from messenger.channel import SNS_MAX_MESSAGE_BYTES, SQS_MAX_MESSAGE_BYTES
from messenger.errors import MessageDecodeError, PayloadMissing

POINTER_CLASS = "software.amazon.payloadoffloading.PayloadS3Pointer"
#: What older Java clients, and AWS's Python client with use_legacy_attribute=True, write.
LEGACY_POINTER_CLASS = "com.amazon.sqs.javamessaging.MessageS3Pointer"
POINTER_CLASSES = frozenset({POINTER_CLASS, LEGACY_POINTER_CLASS})
#: S3 bucket names: 3-63 lowercase letters, digits, '.' and '-', starting and ending alphanumeric.
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
#: The size attribute of the current extended clients, and the legacy one still accepted on read.
EXTENDED_SIZE_ATTRIBUTE = "ExtendedPayloadSize"
LEGACY_SIZE_ATTRIBUTE = "SQSLargePayloadSize"
#: Days an offloaded object outlives the messages pointing at it before it expires.
LIFECYCLE_MARGIN_DAYS = 1
#: Lifetimes a payload must cover: the message's in its queue, then its dead-letter copy's (SQS
#: resets the enqueue time of a message moved to a FIFO dead-letter queue). `messenger requeue`
#: refreshes the payload of every message it moves (`PayloadStore.refresh`), so a requeued
#: message starts with a full lifetime again, however often it is requeued.
LIFECYCLE_HOPS = 2
OFFLOAD_PREFIX = "payloads/"
#: Where large job results live (`messenger.jobs.results`): under OFFLOAD_PREFIX, so that the
#: bucket's lifecycle rule expires them as it does bodies (after more than the retention their
#: status records keep).
RESULTS_PREFIX = f"{OFFLOAD_PREFIX}results/"
#: The default offload threshold (encoded bytes) of each kind of channel: the one that costs
#: least in dollars (`messenger.ops.payload_cost.cheapest_threshold`, from the price table; a
#: unit test recomputes these). SQS bills a message per started 64 KiB, sent and received, and
#: an offloaded body costs a PUT, a GET and 29 days of storage: inline is cheaper up to SQS's
#: 1 MiB maximum, standard and FIFO. SNS takes at most 256 KiB: offloaded above that.
#: The AWS extended clients offload above 256 KiB; they read our inline messages as any other
#: and our pointers as theirs (same format), and we read theirs.
DEFAULT_THRESHOLDS = {
    "sqs": SQS_MAX_MESSAGE_BYTES,
    "sqs_fifo": SQS_MAX_MESSAGE_BYTES,
    "sns": SNS_MAX_MESSAGE_BYTES,
}


def default_threshold(fanout: bool, ordered: bool) -> int:
    """The default offload threshold of a channel: an exchange (SNS topic, FIFO or not), or a
    queue (SQS standard or FIFO)."""
    if fanout:
        return DEFAULT_THRESHOLDS["sns"]
    return DEFAULT_THRESHOLDS["sqs_fifo" if ordered else "sqs"]


@dataclass(frozen=True)
class OffloadPointer:
    """Where an offloaded body lives."""

    bucket: str
    key: str

    def encode(self) -> str:
        return json.dumps([POINTER_CLASS, {"s3BucketName": self.bucket, "s3Key": self.key}])

    @classmethod
    def parse(cls, body: str, attributes: Mapping[str, Any] | None) -> OffloadPointer | None:
        """The pointer in a received message, or None when the message carries its body inline.

        A message with a size attribute (`ExtendedPayloadSize` or the legacy
        `SQSLargePayloadSize`) must carry a pointer of either class (current or legacy) with a
        valid bucket name and a key; anything else raises MessageDecodeError (permanent: the
        consumer dead-letters it at once), so a malformed pointer never reaches a handler."""
        attrs = attributes or {}
        if EXTENDED_SIZE_ATTRIBUTE not in attrs and LEGACY_SIZE_ATTRIBUTE not in attrs:
            return None
        try:
            kind, target = json.loads(body)
        except (ValueError, TypeError, RecursionError):
            raise MessageDecodeError(
                "message has an offloaded-payload size attribute but its body is not a "
                "[class, {s3BucketName, s3Key}] pointer"
            ) from None
        if kind not in POINTER_CLASSES or not isinstance(target, dict):
            raise MessageDecodeError(
                f"offloaded-payload pointer class {kind!r} is not one of "
                f"{', '.join(sorted(POINTER_CLASSES))}"
            )
        bucket, key = target.get("s3BucketName"), target.get("s3Key")
        if not isinstance(bucket, str) or not _BUCKET_NAME.match(bucket):
            raise MessageDecodeError(f"offloaded-payload pointer has an invalid bucket {bucket!r}")
        if not isinstance(key, str) or not key:
            raise MessageDecodeError(f"offloaded-payload pointer has no s3Key ({target!r})")
        return cls(bucket=bucket, key=key)


def lifecycle_days(retention_seconds: int) -> int:
    """Days after which offloaded objects expire: retention rounded up, once for the queue and
    once for the dead-letter queue, plus the margin (29 for the 14-day maximum)."""
    return LIFECYCLE_HOPS * -(-retention_seconds // 86_400) + LIFECYCLE_MARGIN_DAYS


class PayloadStore:
    """Puts and gets offloaded bodies in one bucket, encrypted with the platform key (SSE-KMS)."""

    def __init__(self, s3: Any, bucket: str, kms_key: str = "") -> None:
        """s3: the S3 client, or a function that makes it, called on first use (a consumer
        whose messages are never offloaded then never makes one: a Lambda's cold start)."""
        self._s3 = s3
        self.bucket = bucket
        self.kms_key = kms_key

    @property
    def s3(self) -> Any:
        if callable(self._s3) and not hasattr(self._s3, "meta"):  # a factory, not a client
            self._s3 = self._s3()
        return self._s3

    def put(self, body: str | bytes, prefix: str = OFFLOAD_PREFIX) -> OffloadPointer:
        """Store `body` (text, or its UTF-8 bytes) under a new key (after `prefix`: bodies'
        OFFLOAD_PREFIX, results' RESULTS_PREFIX); its pointer."""
        key = f"{prefix}{uuid.uuid4()}"
        extra: dict[str, str] = {"ServerSideEncryption": "aws:kms"}
        if self.kms_key:
            extra["SSEKMSKeyId"] = self.kms_key
        self.s3.put_object(
            Bucket=self.bucket,
            Key=key,
            Body=body if isinstance(body, bytes) else body.encode("utf-8"),
            ContentType="application/json",
            **extra,
        )
        return OffloadPointer(bucket=self.bucket, key=key)

    def get(self, pointer: OffloadPointer) -> str:
        """The body as text (UnicodeDecodeError when it is not UTF-8)."""
        return self.get_bytes(pointer).decode("utf-8")

    def get_bytes(self, pointer: OffloadPointer) -> bytes:
        """The body as stored; PayloadMissing when the object is gone."""
        try:
            response = self.s3.get_object(Bucket=pointer.bucket, Key=pointer.key)
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "NoSuchBucket", "404"):
                raise PayloadMissing(
                    f"offloaded payload s3://{pointer.bucket}/{pointer.key} does not exist ({code})"
                ) from None
            raise
        return bytes(response["Body"].read())

    def refresh(self, pointer: OffloadPointer) -> bool:
        """Restart the payload's lifecycle clock (a copy onto itself: S3 expires objects by
        creation date); False when it is already gone. For a message that starts a new life in
        a queue, such as a requeued one."""
        extra: dict[str, str] = {"ServerSideEncryption": "aws:kms"}
        if self.kms_key:
            extra["SSEKMSKeyId"] = self.kms_key
        try:
            self.s3.copy_object(
                Bucket=pointer.bucket, Key=pointer.key, MetadataDirective="REPLACE",
                CopySource={"Bucket": pointer.bucket, "Key": pointer.key},
                ContentType="application/json", **extra,
            )
        except ClientError as error:
            if error.response.get("Error", {}).get("Code", "") in ("NoSuchKey", "404"):
                return False
            raise
        return True


def pointer_attributes(size: int) -> dict[str, dict[str, str]]:
    return {EXTENDED_SIZE_ATTRIBUTE: {"DataType": "Number", "StringValue": str(size)}}
