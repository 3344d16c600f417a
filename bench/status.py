"""Status tracking's cost: the same backlog consumed with `track_status` off and on, in one run.

Target: <= 0.3 extra DynamoDB requests per message (records are batched, 25 per BatchWriteItem),
and a throughput ratio (on / off) close to 1.

In each of 4 rounds, pushes MESSAGES / 4 (BENCH_MESSAGES, default 1,000) to a channel and drains it
with tracking off, then the same with a tracked channel (whose producer records QUEUED), with the
same consumer settings (concurrency 10), counting the consumer's requests with botocore's
'before-send' event. Throughput is measured from LISTENING until every message is handled; the
status store is then closed (flushed) before its requests are counted. Runs against a child-process
moto server (it does not share this process's GIL) or AWS_ENDPOINT_URL if set. Prints JSON.
moto's ReceiveMessage slows down on big queues (about 1 s per poll at 1,000 messages), hence the
rounds; the absolute throughput is moto's (and the machine's), so only the ratio means something.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.consume import CountingConsumer  # noqa: E402
from messenger.aws import ClientFactory, RequestCounter  # noqa: E402
from messenger.consume.consumer import ConsumerSettings, ConsumerState  # noqa: E402
from messenger.produce.producer import Producer  # noqa: E402
from messenger.settings import Settings  # noqa: E402
from messenger.tools.local import endpoint_from_env  # noqa: E402

MESSAGES = int(os.environ.get("BENCH_MESSAGES", "1000"))
#: Off and on alternate in rounds of MESSAGES / ROUNDS, so that a change in the machine's load (or
#: moto's speed) during the run hits both sides alike.
ROUNDS = 4
CONCURRENCY = 10
TARGET_EXTRA_REQUESTS = 0.3


class UntrackedConsumer(CountingConsumer):
    channel = "bench_status_off"


class TrackedConsumer(CountingConsumer):
    channel = "bench_status_on"
    track_status = True


class UntrackedProducer(Producer):
    channel = "bench_status_off"


class TrackedProducer(Producer):
    channel = "bench_status_on"
    track_status = True


def push(cls: type[Producer], settings: Settings, count: int) -> dict[str, int]:
    clients = ClientFactory(settings.region)
    counter = RequestCounter().attach(clients)
    producer = cls(settings=settings, clients=clients)
    producer.push_many({"n": n} for n in range(count)).raise_for_failures()
    if producer.status is not None:
        producer.status.close()
    return {op: n for op, n in counter.counts.items() if op.startswith("dynamodb.")}


def consume(cls: type[CountingConsumer], settings: Settings, count: int) -> dict[str, Any]:
    """Drain `count` messages with a fresh consumer; its figures (see `combine`)."""
    clients = ClientFactory(settings.region)
    counter = RequestCounter().attach(clients)
    health = os.path.join(tempfile.mkdtemp(), "health.json")
    consumer = cls(settings=settings, clients=clients,
                   runtime=ConsumerSettings(concurrency=CONCURRENCY, health_file=health))
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    while consumer.state in (None, ConsumerState.INITIALIZING, ConsumerState.INITIALIZED):
        time.sleep(0.001)
    started = time.perf_counter()
    deadline = time.monotonic() + 600
    while consumer.handled < count and time.monotonic() < deadline:
        time.sleep(0.005)
    elapsed = time.perf_counter() - started
    consumer.request_shutdown()
    thread.join(60)  # closes the status store: every record written or counted as failed
    dynamodb = {op: n for op, n in counter.counts.items() if op.startswith("dynamodb.")}
    result: dict[str, Any] = {
        "handled": consumer.handled,
        "seconds": elapsed,
        "requests": counter.total,
        "dynamodb": dynamodb,
    }
    if consumer.status is not None:
        stats = consumer.status.store.stats
        result["status_records"] = {"recorded": stats.recorded, "written": stats.written,
                                    "failed": stats.failed, "dropped": stats.dropped}
    return result


def combine(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's figures over all rounds."""
    handled = sum(r["handled"] for r in rounds)
    seconds = sum(r["seconds"] for r in rounds)
    dynamodb: Counter[str] = Counter()
    records: Counter[str] = Counter()
    for r in rounds:
        dynamodb.update(r["dynamodb"])
        records.update(r.get("status_records", {}))
    combined: dict[str, Any] = {
        "handled": handled,
        "seconds": round(seconds, 2),
        "messages_per_second": round(handled / seconds, 1),
        "requests": sum(r["requests"] for r in rounds),
        "dynamodb": dict(sorted(dynamodb.items())),
        "batch_writes": dynamodb["dynamodb.BatchWriteItem"],
        "dynamodb_requests": sum(dynamodb.values()),
    }
    if records:
        combined["status_records"] = dict(records)
    return combined


def measure(settings: Settings) -> dict[str, Any]:
    # One backlog at a time (moto's ReceiveMessage slows down with the messages it holds), off and
    # on alternating.
    size = MESSAGES // ROUNDS
    off_rounds, on_rounds = [], []
    producer_dynamodb: Counter[str] = Counter()
    for _ in range(ROUNDS):
        push(UntrackedProducer, settings, size)
        off_rounds.append(consume(UntrackedConsumer, settings, size))
        producer_dynamodb.update(push(TrackedProducer, settings, size))
        on_rounds.append(consume(TrackedConsumer, settings, size))
    off, on = combine(off_rounds), combine(on_rounds)
    total = size * ROUNDS
    per_message = on["dynamodb_requests"] / total
    producer_per_message = producer_dynamodb["dynamodb.BatchWriteItem"] / total
    ratio = on["messages_per_second"] / off["messages_per_second"]
    return {
        "messages": total,
        "rounds": ROUNDS,
        "concurrency": CONCURRENCY,
        "throughput_ratio": round(ratio, 3),
        "dynamodb_requests_per_message": round(per_message, 4),
        "batch_writes_per_message": round(on["batch_writes"] / total, 4),
        "producer_batch_writes_per_message": round(producer_per_message, 4),
        "extra_sqs_requests_per_message": round((on["requests"] - on["dynamodb_requests"]
                                                 - off["requests"]) / total, 4),
        "tracking_off": off,
        "tracking_on": on,
        "producer_dynamodb": dict(sorted(producer_dynamodb.items())),
        "note": "absolute rates are the local moto server's; compare the ratio",
        "target_extra_requests_per_message": TARGET_EXTRA_REQUESTS,
        "meets_target": per_message <= TARGET_EXTRA_REQUESTS
        and on["handled"] == off["handled"] == total
        and on.get("status_records", {}).get("written") == on.get("status_records", {})
        .get("recorded"),
    }


def main() -> dict[str, Any]:
    with endpoint_from_env():
        return measure(Settings.from_env(namespace=f"b{uuid.uuid4().hex[:6]}"))


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
