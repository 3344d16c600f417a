"""Dollars per message of a payload sent inline or offloaded to S3, by kind of channel, and the
offload threshold that costs least: what `messenger.offload.DEFAULT_THRESHOLDS` holds (a unit
test recomputes it from the price table, so a price change that moves it fails there).

A message's life, billed with `messenger.ops.prices` (list prices, us-east-1):
- inline: its send, billed per started 64 KiB of payload (SQS or SNS), and on the queue the
  consumer's receive, per started 64 KiB too, and its delete (one request);
- offloaded: the pointer's send, receive and delete (one request each), an S3 PUT when it is
  sent and a GET when it is received, and the object's storage until the bucket's lifecycle
  expires it: `messenger.offload.lifecycle_days` of the longest retention (29 days), whatever
  the channel's, as the bucket is made (objects are never deleted on consume: an exchange fans
  one object out to several queues). S3 calls KMS through a bucket key
  (stacks/foundation.py): about no KMS request per object, left out.
Batching divides the per-request part of both paths alike (a batch of 10 small messages is
one request); payloads this large fill a request's chunks either way, so this is per message.
SNS deliveries to SQS queues are free; each subscribed queue's receive and delete is billed
on the queue's side (one queue here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from messenger.channel import (
    SNS_MAX_MESSAGE_BYTES,
    SQS_MAX_MESSAGE_BYTES,
    SQS_MAX_RETENTION_SECONDS,
)
from messenger.offload import lifecycle_days
from messenger.ops.prices import BILLING_CHUNK_BYTES, GB, PRICES, Price, Usage, chunks

#: S3 bills storage per GB-month of 730 hours (AWS's month in its pricing examples).
HOURS_PER_MONTH = 730
#: A pointer message's payload: the JSON pointer and its size attribute (well under 64 KiB).
POINTER_BYTES = 200


@dataclass(frozen=True)
class ChannelKind:
    """A kind of channel: the price key of its sends, of its queue's requests, its maximum."""

    name: str
    send_key: str
    queue_key: str
    max_bytes: int


KINDS = {
    "sqs": ChannelKind("sqs", "sqs.request", "sqs.request", SQS_MAX_MESSAGE_BYTES),
    "sqs_fifo": ChannelKind("sqs_fifo", "sqs.fifo_request", "sqs.fifo_request",
                            SQS_MAX_MESSAGE_BYTES),
    "sns": ChannelKind("sns", "sns.publish", "sqs.request", SNS_MAX_MESSAGE_BYTES),
}


def inline_usage(kind: ChannelKind, size: int) -> Usage:
    """Billed quantities of one message of `size` bytes sent inline, received and deleted."""
    usage = Usage()
    usage.add(kind.send_key, chunks(size))
    usage.add(kind.queue_key, chunks(size) + 1)  # receive (per 64 KiB) and delete
    return usage


def offloaded_usage(kind: ChannelKind, size: int,
                    retention_seconds: int = SQS_MAX_RETENTION_SECONDS) -> Usage:
    """Billed quantities of one message whose `size`-byte body went to S3: the pointer's send,
    receive and delete, the PUT and GET, and the object's storage until it expires."""
    usage = Usage()
    usage.add(kind.send_key, chunks(POINTER_BYTES))
    usage.add(kind.queue_key, chunks(POINTER_BYTES) + 1)
    usage.add("s3.put")
    usage.add("s3.get")
    months = lifecycle_days(retention_seconds) * 24 / HOURS_PER_MONTH
    usage.add("s3.gb_month", size / GB * months)
    return usage


def per_million(usage: Usage, prices: Mapping[str, Price] = PRICES) -> float:
    """Dollars per million messages of `usage` (one message's)."""
    return usage.total_dollars(prices) * 1_000_000


def cheapest_threshold(kind: ChannelKind,
                       retention_seconds: int = SQS_MAX_RETENTION_SECONDS,
                       prices: Mapping[str, Price] = PRICES) -> int:
    """The largest threshold (a multiple of 64 KiB, at most the channel's maximum) below which
    sending inline never costs more than offloading: inline costs step up with each started
    64 KiB and offloading grows with the bytes stored, so each step is compared at its first
    byte (where offloading is cheapest)."""
    threshold = 0
    for step in range(kind.max_bytes // BILLING_CHUNK_BYTES):
        size = step * BILLING_CHUNK_BYTES + 1
        inline = per_million(inline_usage(kind, size), prices)
        if inline > per_million(offloaded_usage(kind, size, retention_seconds), prices):
            break
        threshold = (step + 1) * BILLING_CHUNK_BYTES
    return threshold
