"""AWS requests per message for `push` and `push_many` over 1,000 messages.

Target: push_many <= 0.11 requests per message.

Runs against the embedded local endpoint (or AWS_ENDPOINT_URL if set); requests are counted with
botocore's 'before-send' event (retries included), so the figures are stable across machines.
Prints JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from messenger.aws import ClientFactory, RequestCounter  # noqa: E402
from messenger.produce.producer import MultiProducer, Producer, PushItem  # noqa: E402
from messenger.settings import Settings  # noqa: E402
from messenger.tools.local import endpoint_from_env  # noqa: E402

MESSAGES = 1_000


class BenchQueueProducer(Producer):
    channel = "bench_orders"


class BenchExchangeProducer(MultiProducer):
    channel = "bench_events"


def measure(producer_class: type, mode: str, settings: Settings) -> dict[str, float]:
    clients = ClientFactory(settings.region)
    counter = RequestCounter().attach(clients)
    producer = producer_class(settings=settings, clients=clients)
    started = time.perf_counter()
    if mode == "push":
        for n in range(MESSAGES):
            producer.push({"n": n, "pad": "x" * 200}, routing_key="BENCH")
    else:
        producer.push_many(PushItem({"n": n, "pad": "x" * 200}, "BENCH") for n in range(MESSAGES))
    elapsed = time.perf_counter() - started
    return {
        "requests": counter.total,
        "requests_per_message": round(counter.total / MESSAGES, 4),
        "messages_per_second": round(MESSAGES / elapsed, 1),
        "by_operation": dict(counter.counts),
    }


def main() -> dict[str, object]:
    with endpoint_from_env():
        results: dict[str, object] = {"messages": MESSAGES}
        for producer_class in (BenchQueueProducer, BenchExchangeProducer):
            for mode in ("push", "push_many"):
                settings = Settings.from_env(namespace=f"b{uuid.uuid4().hex[:6]}")
                key = f"{producer_class.channel}.{mode}"
                results[key] = measure(producer_class, mode, settings)
        results["target_push_many_requests_per_message"] = 0.11
        results["push_many_meets_target"] = all(
            results[f"{c.channel}.push_many"]["requests_per_message"] <= 0.11  # type: ignore[index]
            for c in (BenchQueueProducer, BenchExchangeProducer)
        )
        return results


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
