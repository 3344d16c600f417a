"""Job operations' request cost: the dead-letter workbench on a deep DLQ, and dedup on enqueue.

- dlq: a DLQ of BENCH_DLQ_DEPTH (default 10,000) dead letters; requests `DeadLetterWorkbench.list()`
  makes per dead letter listed (target <= 0.25: one ReceiveMessage and one
  ChangeMessageVisibilityBatch per 10, plus a constant), and the requests of `requeue` of one id.
- dedup: push_many of BENCH_MESSAGES (default 1,000) messages with caller ids, dedup off and on,
  on warmed producers (their one-off table check excluded), and 100 single pushes; extra requests
  per message with dedup on (targets: push_many <= 1.1, a claim each and the sent marks in
  batches of 25; push <= 2, the claim and the mark), none with it off.

Requests are counted with botocore's 'before-send' event. Runs against a child-process local
endpoint (moto with messenger's flat-cost SQS index) or AWS_ENDPOINT_URL if set. Prints JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from messenger.aws import ClientFactory, RequestCounter  # noqa: E402
from messenger.channel import ChannelSpec  # noqa: E402
from messenger.message import (  # noqa: E402
    DEAD_LETTER_FAILURE_ATTRIBUTE,
    DEAD_LETTER_REASON_ATTRIBUTE,
    Message,
)
from messenger.operations.deadletters import DeadLetterWorkbench  # noqa: E402
from messenger.produce.producer import Producer, PushItem  # noqa: E402
from messenger.provision import Provisioner  # noqa: E402
from messenger.settings import Settings  # noqa: E402
from messenger.tools.local import endpoint_from_env  # noqa: E402

DEPTH = int(os.environ.get("BENCH_DLQ_DEPTH", "10000"))
MESSAGES = int(os.environ.get("BENCH_MESSAGES", "1000"))
TARGET_LIST_REQUESTS = 0.25
TARGET_DEDUP_EXTRA_MANY = 1.1
TARGET_DEDUP_EXTRA_PUSH = 2.0
SINGLE_PUSHES = 100
FAILURE = json.dumps({"error_type": "ValueError", "error_message": "card declined",
                      "traceback": "Traceback (most recent call last):\n  ...\nValueError: x\n",
                      "attempts": 3, "at": "2026-11-24T06:00:00Z", "consumer": "bench.Jobs"})


def fill_dlq(clients: ClientFactory, settings: Settings) -> str:
    resources = Provisioner(clients, settings).ensure_channel(
        ChannelSpec("bench_dlq", namespace=settings.namespace))
    sqs = clients.client("sqs")
    for first in range(0, DEPTH, 10):
        entries = []
        for n in range(first, min(first + 10, DEPTH)):
            encoded = Message({"n": n}, message_id=f"job-{n}").encode()
            attributes = {**encoded.attributes,
                          DEAD_LETTER_REASON_ATTRIBUTE: {"DataType": "String",
                                                         "StringValue": "handler failed"},
                          DEAD_LETTER_FAILURE_ATTRIBUTE: {"DataType": "String",
                                                          "StringValue": FAILURE}}
            entries.append({"Id": str(n - first), "MessageBody": encoded.body,
                            "MessageAttributes": attributes})
        sqs.send_message_batch(QueueUrl=resources.dlq.url, Entries=entries)
    return resources.dlq.url


def measure_dlq(settings: Settings) -> dict[str, Any]:
    fill_dlq(ClientFactory(settings.region), settings)
    clients = ClientFactory(settings.region)
    counter = RequestCounter().attach(clients)
    bench = DeadLetterWorkbench("bench_dlq", settings, clients)
    setup = counter.total
    started = time.perf_counter()
    listing = bench.list()
    seconds = time.perf_counter() - started
    listed = len(listing.letters)
    list_requests = counter.total - setup
    counts = dict(counter.counts)
    before = counter.total
    bench.requeue([f"job-{DEPTH // 2}"])
    requeue_requests = counter.total - before
    return {
        "depth": DEPTH,
        "listed": listed,
        "not_seen": listing.not_seen,
        "list_seconds": round(seconds, 2),
        "list_requests": list_requests,
        "requests_per_dead_letter": round(list_requests / max(1, listed), 4),
        "resolve_requests": setup,
        "requests_by_operation": counts,
        "requeue_one_requests": requeue_requests,
        "target_requests_per_dead_letter": TARGET_LIST_REQUESTS,
        "meets_target": listed == DEPTH
        and list_requests / max(1, listed) <= TARGET_LIST_REQUESTS,
    }


def measure_dedup(settings: Settings) -> dict[str, Any]:
    class Off(Producer):
        channel = "bench_dedup"

    class On(Producer):
        channel = "bench_dedup"
        dedup = True

    result: dict[str, Any] = {"messages": MESSAGES}
    for name, cls in (("off", Off), ("on", On)):
        clients = ClientFactory(settings.region)
        producer = cls(settings=settings, clients=clients)
        producer.push({"warm": True}, message_id=f"warm-{name}")  # one-off checks excluded
        counter = RequestCounter().attach(clients)
        tag = uuid.uuid4().hex[:6]
        many = producer.push_many(PushItem({"n": n}, message_id=f"{tag}-{n}")
                                  for n in range(MESSAGES))
        many_requests = counter.total
        many_counts = dict(counter.counts)
        for n in range(SINGLE_PUSHES):
            producer.push({"n": n}, message_id=f"{tag}-single-{n}")
        single_requests = counter.total - many_requests
        result[name] = {
            "push_many_requests_per_message": round(many_requests / MESSAGES, 4),
            "push_requests_per_message": round(single_requests / SINGLE_PUSHES, 4),
            "published": many.published,
            "push_many_requests_by_operation": many_counts,
            "dynamodb_requests": sum(v for k, v in counter.counts.items()
                                     if k.startswith("dynamodb.")),
        }
    off, on = result["off"], result["on"]
    result["extra_requests_per_message_on"] = round(
        on["push_many_requests_per_message"] - off["push_many_requests_per_message"], 4)
    result["extra_requests_per_push_on"] = round(
        on["push_requests_per_message"] - off["push_requests_per_message"], 4)
    result["extra_requests_per_message_off"] = off["dynamodb_requests"] / (MESSAGES
                                                                           + SINGLE_PUSHES)
    result["target_extra_on_push_many"] = TARGET_DEDUP_EXTRA_MANY
    result["target_extra_on_push"] = TARGET_DEDUP_EXTRA_PUSH
    result["meets_target"] = (
        result["extra_requests_per_message_on"] <= TARGET_DEDUP_EXTRA_MANY
        and result["extra_requests_per_push_on"] <= TARGET_DEDUP_EXTRA_PUSH
        and off["dynamodb_requests"] == 0 and on["published"] == off["published"] == MESSAGES)
    return result


def main() -> dict[str, Any]:
    with endpoint_from_env():
        settings = Settings.from_env(namespace=f"b{uuid.uuid4().hex[:6]}")
        return {"dlq": measure_dlq(settings), "dedup": measure_dedup(settings)}


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
