"""The offload threshold in dollars: messenger's default per kind of channel, before and after,
beside AWS's `amazon-sqs-extended-client` (PyPI), which offloads above 256 KiB.

Two parts, printed as JSON:

- `model`: dollars per million messages of 64 KiB, 256 KiB, 300 KiB, 512 KiB and 1 MiB on each
  kind of channel (SQS standard, SQS FIFO, SNS to one queue), from the price table alone
  (`messenger.ops.payload_cost`): a message's send and its queue's receive per started 64 KiB,
  its delete; an offloaded one's pointer (send, receive, delete), S3 PUT and GET and 29 days of
  storage (the bucket's lifecycle). `before` offloads above 256 KiB (the old default, and the
  extended clients'), `after` above `messenger.offload.DEFAULT_THRESHOLDS`; `threshold` is what
  `cheapest_threshold` picks, and `saving` the difference per million.
- `measured`: on the local endpoint (moto server in a child process), MESSAGES messages of each
  size sent, received and deleted on a standard queue, three ways: messenger's `Producer` with its
  default threshold (after), the same at 256 KiB (before), and the extended client (its default,
  256 KiB, in a child process of its own: importing it replaces `boto3.session.Session`). Every
  request is billed on the wire by `messenger.ops.cost.WireMeter` (SQS per started 64 KiB of the
  request, and of the response for a receive; S3 PUT and GET), plus the storage of the bytes
  put for 29 days (the extended client's objects kept as ours: its default
  `delete_payload_from_s3=False`), scaled to a million messages. The wire carries a request's
  envelope too, so a body just under a 64 KiB boundary can bill one chunk more than the model.
  "1 MiB" bodies are 1 MiB less 2 KiB (a message, body and attributes, is at most 1 MiB).

    python bench/threshold.py [--messages 10]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from messenger.offload import DEFAULT_THRESHOLDS, LIFECYCLE_MARGIN_DAYS  # noqa: E402
from messenger.ops.payload_cost import (  # noqa: E402
    HOURS_PER_MONTH,
    KINDS,
    cheapest_threshold,
    inline_usage,
    offloaded_usage,
    per_million,
)
from messenger.ops.prices import GB, PRICES_CHECKED, Usage  # noqa: E402

KIB = 1024
EXTENDED_CLIENT_THRESHOLD = 256 * KIB
SIZES = {"64 KiB": 64 * KIB, "256 KiB": 256 * KIB, "300 KiB": 300 * KIB, "512 KiB": 512 * KIB,
         "1 MiB": 1024 * KIB}
#: Bodies measured on the wire: a little under each size (the message's attributes and the
#: JSON around the padding fit in the same chunks), and 1 MiB less 2 KiB.
BODY_SLACK = 2 * KIB
STORED_DAYS = 2 * 14 + LIFECYCLE_MARGIN_DAYS  # messenger.offload.lifecycle_days(14 days)


def model() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, kind in KINDS.items():
        rows = {}
        for label, size in SIZES.items():
            offloaded = per_million(offloaded_usage(kind, size))
            # Above the channel's maximum only the offloaded form exists (SNS past 256 KiB).
            inline = per_million(inline_usage(kind, size)) if size <= kind.max_bytes else None
            before = offloaded if size > EXTENDED_CLIENT_THRESHOLD or inline is None else inline
            after = offloaded if size > DEFAULT_THRESHOLDS[name] or inline is None else inline
            rows[label] = {"inline": None if inline is None else round(inline, 2),
                           "offloaded": round(offloaded, 2), "before": round(before, 2),
                           "after": round(after, 2), "saving": round(before - after, 2)}
        found[name] = {"threshold": cheapest_threshold(kind),
                       "default": DEFAULT_THRESHOLDS[name], "max_bytes": kind.max_bytes,
                       "dollars_per_million": rows}
    return found


def body_of(size: int) -> str:
    return json.dumps({"pad": "x" * (size - BODY_SLACK)})


def stored(bytes_put: int) -> Usage:
    return Usage({"s3.gb_month": bytes_put / GB * STORED_DAYS * 24 / HOURS_PER_MONTH})


def receive_all(sqs: Any, url: str, messages: int, check: Any) -> None:
    """Receive (10 per call) and delete (in batches) `messages` messages, `check` on each."""
    received = 0
    while received < messages:
        batch = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                    MessageAttributeNames=["All"],
                                    WaitTimeSeconds=1).get("Messages", [])
        for message in batch:
            check(message)
        if batch:
            sqs.delete_message_batch(QueueUrl=url, Entries=[
                {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(batch)])
        received += len(batch)


def billed(meter: Any, messages: int) -> dict[str, Any]:
    """Dollars per million messages of what `meter` saw for `messages`, storage included."""
    usage = meter.usage.plus([stored(meter.s3_bytes_put)])
    return {"dollars_per_million": round(usage.scaled(1_000_000 / messages).total_dollars(), 2),
            "offloaded": meter.requests.get("s3.PutObject", 0), "requests": meter.requests}


def messenger_side(threshold: int | None, messages: int) -> dict[str, Any]:
    """Send, receive and delete `messages` bodies of each size with messenger's producer."""
    from messenger.aws import ClientFactory
    from messenger.offload import OffloadPointer, PayloadStore
    from messenger.ops.cost import WireMeter
    from messenger.produce.producer import Producer
    from messenger.settings import Settings

    settings = Settings.from_env(offload_threshold=threshold)
    results = {}
    for label, size in SIZES.items():
        channel = f"thr_{uuid.uuid4().hex[:8]}"
        clients = ClientFactory(settings.region)
        producer = type("P", (Producer,), {"channel": channel})(settings=settings,
                                                                clients=clients)
        producer.push({"warm": "up"})  # provisions the queue and the bucket: not billed
        sqs = clients.client("sqs")
        url = sqs.get_queue_url(QueueName=producer.destination_name)["QueueUrl"]
        sqs.delete_message(QueueUrl=url, ReceiptHandle=sqs.receive_message(
            QueueUrl=url, WaitTimeSeconds=1)["Messages"][0]["ReceiptHandle"])
        meter = WireMeter().attach(clients)
        body = json.loads(body_of(size))
        for _ in range(messages):
            producer.push(body)
        s3 = clients.client("s3")

        def check(message: dict[str, Any], body: Any = body, s3: Any = s3) -> None:
            pointer = OffloadPointer.parse(message["Body"], message["MessageAttributes"])
            text = message["Body"] if pointer is None else PayloadStore(
                s3, pointer.bucket).get(pointer)
            assert json.loads(text) == body

        receive_all(sqs, url, messages, check)
        results[label] = billed(meter, messages)
    return results


EXTENDED_SIDE = textwrap.dedent('''
    import json, sys, uuid
    import boto3
    import sqs_extended_client  # replaces boto3.session.Session in this process
    sys.path.insert(0, sys.argv[3])
    from messenger.ops.cost import WireMeter
    from bench.threshold import SIZES, billed, body_of, receive_all

    messages = int(sys.argv[1])
    bucket = sys.argv[2]
    session = boto3.session.Session(region_name="us-east-1")
    session.client("s3").create_bucket(Bucket=bucket)
    results = {}
    for label, size in SIZES.items():
        sqs = session.client("sqs")
        sqs.large_payload_support = bucket
        url = sqs.create_queue(QueueName=f"thr-ext-{uuid.uuid4().hex[:8]}")["QueueUrl"]
        meter = WireMeter().attach_client(sqs).attach_client(sqs.s3_client)
        body = body_of(size)
        for _ in range(messages):
            sqs.send_message(QueueUrl=url, MessageBody=body)
        def check(message, body=body):
            assert message["Body"] == body

        receive_all(sqs, url, messages, check)
        results[label] = billed(meter, messages)
    print(json.dumps(results))
''')


def extended_client_side(messages: int) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", EXTENDED_SIDE, str(messages),
         f"thr-ext-{uuid.uuid4().hex[:8]}", str(ROOT)],
        capture_output=True, text=True, env={**os.environ}, timeout=600, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"extended client side failed: {result.stderr[-2000:]}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def measure(messages: int) -> dict[str, Any]:
    after = messenger_side(None, messages)
    before = messenger_side(EXTENDED_CLIENT_THRESHOLD, messages)
    extended = extended_client_side(messages)
    return {label: {"messenger_after": after[label], "messenger_before": before[label],
                    "extended_client": extended[label]} for label in SIZES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=10)
    args = parser.parse_args()
    from messenger.tools.local import endpoint_from_env

    with endpoint_from_env():
        measured = measure(args.messages)
    print(json.dumps({"prices_checked": PRICES_CHECKED.isoformat(), "model": model(),
                      "measured": measured, "messages_per_size": args.messages}, indent=2))


if __name__ == "__main__":
    main()
