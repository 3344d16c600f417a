"""Processing timeouts under load: 1,000 messages whose handler blocks 3 s on a 1 s timeout.

Target: every message timed out and dead-lettered, none deleted as completed; reports how late
after its deadline each message was marked timed out (`timed_out` duration less the timeout) and
how long its forward to the DLQ took after that, as percentiles. Runs against the embedded local
endpoint (or AWS_ENDPOINT_URL if set). Prints JSON.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from messenger.aws import ClientFactory  # noqa: E402
from messenger.consume.consumer import Consumer, ConsumerSettings  # noqa: E402
from messenger.consume.lifecycle import LifecycleEvent  # noqa: E402
from messenger.consume.mailbox import ReceivedMessage  # noqa: E402
from messenger.produce.producer import Producer  # noqa: E402
from messenger.settings import Settings  # noqa: E402
from messenger.tools.local import endpoint_from_env  # noqa: E402

MESSAGES = 1_000
CONCURRENCY = 200
TIMEOUT = 1
BLOCK_SECONDS = 3.0


class BenchProducer(Producer):
    channel = "bench_timeouts"


class BlockingConsumer(Consumer):
    """Blocks in C code (time.sleep) past its timeout; keeps the events it needs, logs none."""

    channel = "bench_timeouts"
    processing_timeout = TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[tuple[str, str | None, float | None, float]] = []
        self._lock = threading.Lock()

    def handler(self, message: ReceivedMessage) -> None:
        time.sleep(BLOCK_SECONDS)

    def on_event(self, event: LifecycleEvent) -> None:
        if event.name in ("timed_out", "dead_lettered", "completed"):
            with self._lock:
                self.events.append((event.name, event.message_id, event.duration,
                                    time.monotonic()))

    def count(self, name: str) -> int:
        with self._lock:
            return sum(1 for event in self.events if event[0] == name)


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    cuts = statistics.quantiles(values, n=100) if len(values) > 1 else values * 99
    return {"median": round(cuts[49], 3), "p90": round(cuts[89], 3),
            "p99": round(cuts[98], 3), "max": round(max(values), 3)}


def measure(settings: Settings) -> dict[str, Any]:
    BenchProducer(settings=settings).push_many(
        {"n": n} for n in range(MESSAGES)).raise_for_failures()
    health = os.path.join(tempfile.mkdtemp(), "health.json")
    consumer = BlockingConsumer(
        settings=settings, clients=ClientFactory(settings.region),
        runtime=ConsumerSettings(concurrency=CONCURRENCY, health_file=health,
                                 shutdown_timeout=60),
    )
    started = time.perf_counter()
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 600
    while consumer.count("dead_lettered") + consumer.count("completed") < MESSAGES \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    elapsed = time.perf_counter() - started
    consumer.request_shutdown()
    thread.join(120)
    timed_out = {m: (d, at) for name, m, d, at in consumer.events if name == "timed_out"}
    forwarded = {m: at for name, m, _, at in consumer.events if name == "dead_lettered"}
    late = [d - TIMEOUT for d, _ in timed_out.values() if d is not None]
    forward = [forwarded[m] - at for m, (_, at) in timed_out.items() if m in forwarded]
    completed = consumer.count("completed")
    return {
        "messages": MESSAGES,
        "concurrency": CONCURRENCY,
        "processing_timeout": TIMEOUT,
        "handler_blocks": BLOCK_SECONDS,
        "timed_out": len(timed_out),
        "dead_lettered": len(forwarded),
        "completed": completed,
        "seconds": round(elapsed, 1),
        "marked_late_seconds": percentiles(late),
        "forward_seconds": percentiles(forward),
        "meets_target": completed == 0 and len(forwarded) == MESSAGES,
    }


def main() -> dict[str, Any]:
    with endpoint_from_env():
        return measure(Settings.from_env(namespace=f"b{uuid.uuid4().hex[:6]}"))


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
