"""AWS requests per message for a consumer draining a 1,000-message backlog with concurrency 10.

Target: <= 0.25 requests per message (receive-one/delete-one consumers make >= 2).

Pushes the backlog with `push_many`, then runs a consumer with a trivial handler until every
message is handled and deleted. Requests of the consumer (provisioning included) are counted
with botocore's 'before-send' event, retries included. Runs against the embedded local endpoint
(or AWS_ENDPOINT_URL if set). Prints JSON.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from messenger.aws import ClientFactory, RequestCounter  # noqa: E402
from messenger.consume.consumer import Consumer, ConsumerSettings  # noqa: E402
from messenger.consume.mailbox import ReceivedMessage  # noqa: E402
from messenger.produce.producer import Producer  # noqa: E402
from messenger.settings import Settings  # noqa: E402
from messenger.tools.local import endpoint_from_env  # noqa: E402

MESSAGES = 1_000
CONCURRENCY = 10
TARGET = 0.25


class BenchProducer(Producer):
    channel = "bench_backlog"


class CountingConsumer(Consumer):
    """Counts what it handles; logs nothing (thousands of log lines would measure the terminal,
    and status tracking records events without the log)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handled = 0
        self._lock = threading.Lock()

    def handler(self, message: ReceivedMessage) -> None:
        with self._lock:
            self.handled += 1

    def on_event(self, event: Any) -> None:
        pass


class BenchConsumer(CountingConsumer):
    channel = "bench_backlog"


def measure(settings: Settings) -> dict[str, Any]:
    result = BenchProducer(settings=settings).push_many({"n": n} for n in range(MESSAGES))
    result.raise_for_failures()
    clients = ClientFactory(settings.region)
    counter = RequestCounter().attach(clients)
    health = os.path.join(tempfile.mkdtemp(), "health.json")
    consumer = BenchConsumer(
        settings=settings, clients=clients,
        runtime=ConsumerSettings(concurrency=CONCURRENCY, health_file=health),
    )
    started = time.perf_counter()
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 300
    while consumer.handled < MESSAGES and time.monotonic() < deadline:
        time.sleep(0.01)
    consumer.request_shutdown()
    thread.join(60)
    elapsed = time.perf_counter() - started
    assert consumer.resources is not None
    attributes = clients.client("sqs").get_queue_attributes(
        QueueUrl=consumer.resources.queue.url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    counter.detach(clients)
    left = sum(int(value) for value in attributes.values())
    return {
        "messages": MESSAGES,
        "concurrency": CONCURRENCY,
        "handled": consumer.handled,
        "left_in_queue": left,
        "requests": counter.total,
        "requests_per_message": round(counter.total / MESSAGES, 4),
        "messages_per_second": round(consumer.handled / elapsed, 1),
        "by_operation": dict(sorted(counter.counts.items())),
        "target_requests_per_message": TARGET,
        "meets_target": counter.total / MESSAGES <= TARGET and left == 0,
    }


def main() -> dict[str, Any]:
    with endpoint_from_env():
        return measure(Settings.from_env(namespace=f"b{uuid.uuid4().hex[:6]}"))


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
