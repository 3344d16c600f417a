"""AWS requests per message for `push` and `push_many` over 1,000 messages.

Target: push_many <= 0.11 requests per message.

Then the cost of trace context (`messenger.tracing`): with an OpenTelemetry SDK tracer provider
installed (in-memory exporter), the same pushes with MESSENGER_TRACING=off and =on in alternating
rounds: requests per message (tracing adds none) and producer CPU per message. The figures above
are measured first, in a process that has not imported OpenTelemetry (tracing 'auto': off).

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

from bench.harness import in_memory_spans  # noqa: E402
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


TRACING_ROUNDS = 3
TRACING_MESSAGES = 300


def tracing_cost() -> dict[str, object]:
    """Requests and producer CPU per message, tracing off vs on, alternating rounds."""
    exporter = in_memory_spans()
    runs: dict[str, dict[str, list[float]]] = {}
    for _ in range(TRACING_ROUNDS):
        for tracing in ("off", "on"):
            for mode in ("push", "push_many"):
                settings = Settings.from_env(namespace=f"b{uuid.uuid4().hex[:6]}",
                                             tracing=tracing)
                clients = ClientFactory(settings.region)
                producer = BenchQueueProducer(settings=settings, clients=clients)
                producer.push({"warm": "up"})  # the queue is made outside the measure
                counter = RequestCounter().attach(clients)
                cpu = time.process_time()
                if mode == "push":
                    for n in range(TRACING_MESSAGES):
                        producer.push({"n": n, "pad": "x" * 200}, routing_key="BENCH")
                else:
                    producer.push_many(PushItem({"n": n, "pad": "x" * 200}, "BENCH")
                                       for n in range(TRACING_MESSAGES))
                cpu = time.process_time() - cpu
                run = runs.setdefault(f"{mode}.{tracing}", {"requests": [], "cpu": []})
                run["requests"].append(counter.total / TRACING_MESSAGES)
                run["cpu"].append(cpu / TRACING_MESSAGES)
                exporter.clear()
    figures: dict[str, object] = {"messages_per_round": TRACING_MESSAGES,
                                  "rounds": TRACING_ROUNDS}
    for key, run in runs.items():
        figures[key] = {"requests_per_message": round(max(run["requests"]), 4),
                        "cpu_us_per_message": round(1e6 * min(run["cpu"]), 1)}
    for mode in ("push", "push_many"):
        off, on = figures[f"{mode}.off"], figures[f"{mode}.on"]
        figures[f"{mode}.cpu_us_added_by_tracing"] = round(
            on["cpu_us_per_message"] - off["cpu_us_per_message"], 1)  # type: ignore[index]
        figures[f"{mode}.requests_unchanged"] = \
            on["requests_per_message"] == off["requests_per_message"]  # type: ignore[index]
    figures["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return figures


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
        results["load_average"] = [round(x, 2) for x in os.getloadavg()]
        results["tracing"] = tracing_cost()
        return results


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
