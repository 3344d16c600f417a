"""AWS requests per message for a consumer draining a 1,000-message backlog with concurrency 10.

Target: <= 0.25 requests per message (receive-one/delete-one consumers make >= 2).

Pushes the backlog with `push_many`, then runs a consumer with a trivial handler until every
message is handled and deleted. Requests of the consumer (provisioning included) are counted
with botocore's 'before-send' event, retries included. Runs against the embedded local endpoint
(or AWS_ENDPOINT_URL if set). Prints JSON.

Then the cost of trace context (`messenger.tracing`) on the consumer: with an OpenTelemetry SDK
tracer provider installed (in-memory exporter), the same drain with MESSENGER_TRACING=off and
=on in alternating rounds: requests per message (tracing adds none) and the consumer process's
CPU per message. The figure above is measured first, before OpenTelemetry is imported.
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

from bench.harness import in_memory_spans  # noqa: E402
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
    cpu = time.process_time()
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 300
    while consumer.handled < MESSAGES and time.monotonic() < deadline:
        time.sleep(0.01)
    consumer.request_shutdown()
    thread.join(60)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
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
        "cpu_us_per_message": round(1e6 * cpu / MESSAGES, 1),
        "by_operation": dict(sorted(counter.counts.items())),
        "target_requests_per_message": TARGET,
        "meets_target": counter.total / MESSAGES <= TARGET and left == 0,
    }


TRACING_ROUNDS = 2


def tracing_cost() -> dict[str, Any]:
    """Consumer requests and CPU per message, tracing off vs on, alternating rounds."""
    exporter = in_memory_spans()
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for _ in range(TRACING_ROUNDS):
        for tracing in ("off", "on"):
            settings = Settings.from_env(namespace=f"b{uuid.uuid4().hex[:6]}", tracing=tracing)
            runs[tracing].append(measure(settings))
            runs[tracing][-1]["process_spans"] = sum(
                1 for span in exporter.get_finished_spans() if span.name.startswith("process "))
            exporter.clear()
    figures: dict[str, Any] = {"rounds": TRACING_ROUNDS}
    for tracing, measured in runs.items():
        figures[tracing] = {
            "requests_per_message": [m["requests_per_message"] for m in measured],
            "cpu_us_per_message": min(m["cpu_us_per_message"] for m in measured),
            "process_spans": [m["process_spans"] for m in measured],
        }
    figures["cpu_us_added_by_tracing"] = round(
        figures["on"]["cpu_us_per_message"] - figures["off"]["cpu_us_per_message"], 1)
    figures["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return figures


def main() -> dict[str, Any]:
    with endpoint_from_env():
        result = measure(Settings.from_env(namespace=f"b{uuid.uuid4().hex[:6]}"))
        result["load_average"] = [round(x, 2) for x in os.getloadavg()]
        if os.environ.get("BENCH_TRACING", "1") != "0":
            result["tracing"] = tracing_cost()
        return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
