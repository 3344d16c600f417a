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
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from messenger.errors import PayloadMissing

POINTER_CLASS = "software.amazon.payloadoffloading.PayloadS3Pointer"
#: The size attribute of the current extended clients, and the legacy one still accepted on read.
EXTENDED_SIZE_ATTRIBUTE = "ExtendedPayloadSize"
LEGACY_SIZE_ATTRIBUTE = "SQSLargePayloadSize"
#: Days an offloaded object outlives the 14-day maximum retention before it expires.
LIFECYCLE_MARGIN_DAYS = 1
OFFLOAD_PREFIX = "payloads/"


@dataclass(frozen=True)
class OffloadPointer:
    """Where an offloaded body lives."""

    bucket: str
    key: str

    def encode(self) -> str:
        return json.dumps([POINTER_CLASS, {"s3BucketName": self.bucket, "s3Key": self.key}])

    @classmethod
    def parse(cls, body: str, attributes: Mapping[str, Any] | None) -> OffloadPointer | None:
        """The pointer in a received message, or None when the message carries its body inline."""
        attrs = attributes or {}
        if EXTENDED_SIZE_ATTRIBUTE not in attrs and LEGACY_SIZE_ATTRIBUTE not in attrs:
            return None
        try:
            kind, target = json.loads(body)
            if kind != POINTER_CLASS:
                return None
            return cls(bucket=str(target["s3BucketName"]), key=str(target["s3Key"]))
        except (ValueError, TypeError, KeyError):
            return None


def lifecycle_days(retention_seconds: int) -> int:
    """Days after which offloaded objects expire: retention rounded up plus the margin."""
    return -(-retention_seconds // 86_400) + LIFECYCLE_MARGIN_DAYS


class PayloadStore:
    """Puts and gets offloaded bodies in one bucket, encrypted with the platform key (SSE-KMS)."""

    def __init__(self, s3: Any, bucket: str, kms_key: str = "") -> None:
        self.s3 = s3
        self.bucket = bucket
        self.kms_key = kms_key

    def put(self, body: str) -> OffloadPointer:
        key = f"{OFFLOAD_PREFIX}{uuid.uuid4()}"
        extra: dict[str, str] = {"ServerSideEncryption": "aws:kms"}
        if self.kms_key:
            extra["SSEKMSKeyId"] = self.kms_key
        self.s3.put_object(
            Bucket=self.bucket,
            Key=key,
            Body=body.encode("utf-8"),
            ContentType="application/json",
            **extra,
        )
        return OffloadPointer(bucket=self.bucket, key=key)

    def get(self, pointer: OffloadPointer) -> str:
        try:
            response = self.s3.get_object(Bucket=pointer.bucket, Key=pointer.key)
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "NoSuchBucket", "404"):
                raise PayloadMissing(
                    f"offloaded payload s3://{pointer.bucket}/{pointer.key} does not exist ({code})"
                ) from None
            raise
        return str(response["Body"].read().decode("utf-8"))


def pointer_attributes(size: int) -> dict[str, dict[str, str]]:
    return {EXTENDED_SIZE_ATTRIBUTE: {"DataType": "Number", "StringValue": str(size)}}
