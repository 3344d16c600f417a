"""The Lambda consumer runtime's cost per message: AWS requests the function makes per outcome,
and its CPU per message over Powertools' bare batch processor on the same events.

Receives batches of 10 from a channel on the local endpoint as Lambda's event source would (those
receives are the event source's, not counted), builds the Lambda event (`sqs_event`), runs
`LambdaConsumerRuntime.handle` with lifecycle events logged as JSON lines (to /dev/null), applies
the partial batch response as SQS does (not counted), and counts the function's own requests with
botocore's 'before-send' event, per outcome: handled (Lambda deletes it: no request of the
function's), failed (ChangeMessageVisibility: retried after retry_delay), undecodable
(SendMessage to the DLQ + DeleteMessage). CPU: process time of `handle` per handled message, and
of `process_partial_response` with a record handler that only decodes the JSON body. Runs against
a child-process moto server or AWS_ENDPOINT_URL if set. Prints JSON.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from aws_lambda_powertools.utilities.batch import (  # noqa: E402
    BatchProcessor,
    EventType,
    process_partial_response,
)

from messenger.aws import ClientFactory, RequestCounter  # noqa: E402
from messenger.consume.consumer import Consumer, ConsumerSettings  # noqa: E402
from messenger.consume.lambda_runtime import LambdaConsumerRuntime, LocalEventSource  # noqa: E402,E501
from messenger.consume.lifecycle import JsonLinesHandler  # noqa: E402
from messenger.consume.mailbox import ReceivedMessage  # noqa: E402
from messenger.produce.producer import Producer  # noqa: E402
from messenger.settings import Settings  # noqa: E402
from messenger.tools.local import endpoint_from_env  # noqa: E402

MESSAGES = int(os.environ.get("BENCH_MESSAGES", "300"))
BATCH = 10


class BenchConsumer(Consumer):
    channel = "bench_lambda"
    max_receives = 5

    def handler(self, message: ReceivedMessage) -> None:
        if message.body.get("fail"):
            raise ValueError("failing on purpose")


class BenchProducer(Producer):
    channel = "bench_lambda"


class Context:
    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def bare_handler(record: Any) -> Any:
    """The least a record handler does: decode the body (an undecodable one is not an error)."""
    try:
        return json.loads(record.body)
    except ValueError:
        return None


def run(runtime: LambdaConsumerRuntime, counter: RequestCounter, source: LocalEventSource,
        count: int) -> dict[str, Any]:
    """Feed `count` messages to the function in batches; its requests and CPU."""
    before = dict(counter.counts)
    cpu = {"runtime": 0.0, "bare": 0.0}

    def timed(event: dict[str, Any], context: Any) -> Any:
        started = time.process_time()
        process_partial_response(event, bare_handler,
                                 BatchProcessor(EventType.SQS, raise_on_entire_batch_failure=False))
        cpu["bare"] += time.process_time() - started
        started = time.process_time()
        response = runtime.handle(event, context)
        cpu["runtime"] += time.process_time() - started
        return response

    seen = 0
    while seen < count:
        messages = source.receive(BATCH)
        if not messages:
            break
        seen += len(messages)
        source.invoke(timed, messages, Context())
    requests = {op: n - before.get(op, 0) for op, n in counter.counts.items()
                if n - before.get(op, 0)}
    return {
        "messages": seen,
        "function_requests": dict(sorted(requests.items())),
        "function_requests_per_message": round(sum(requests.values()) / max(seen, 1), 3),
        "cpu_us_per_message": round(cpu["runtime"] / max(seen, 1) * 1e6, 1),
        "bare_powertools_cpu_us_per_message": round(cpu["bare"] / max(seen, 1) * 1e6, 1),
    }


def measure(settings: Settings) -> dict[str, Any]:
    logging.basicConfig(level=logging.INFO, force=True,
                        handlers=[JsonLinesHandler(open(os.devnull, "w"))])  # noqa: SIM115
    clients = ClientFactory(settings.region)
    producer = BenchProducer(settings=settings, clients=clients)
    producer.push({"warm": "up"})
    health = os.path.join(tempfile.mkdtemp(), "health.json")
    consumer = BenchConsumer(settings=settings, clients=ClientFactory(settings.region),
                             runtime=ConsumerSettings(retry_delay=60, health_file=health))
    cold = time.perf_counter()
    runtime = LambdaConsumerRuntime(consumer)
    cold = time.perf_counter() - cold
    counter = RequestCounter().attach(consumer.clients)
    sqs = clients.client("sqs")
    queue_url = sqs.get_queue_url(QueueName=consumer.spec.queue_name)["QueueUrl"]
    source = LocalEventSource(sqs, queue_url, settings.region, visibility=120)
    results: dict[str, Any] = {"messages_per_outcome": MESSAGES, "batch_size": BATCH,
                               "cold_start_seconds (local endpoint)": round(cold, 3)}
    outcomes = {
        "handled": lambda: producer.push_many({"n": n} for n in range(MESSAGES)),
        "failed": lambda: producer.push_many({"fail": True} for _ in range(MESSAGES)),
    }
    for name, send in outcomes.items():
        send().raise_for_failures()
        results[name] = run(runtime, counter, source, MESSAGES + 1)
    for start in range(0, MESSAGES, BATCH):
        sqs.send_message_batch(QueueUrl=queue_url, Entries=[
            {"Id": str(i), "MessageBody": "not json {"}
            for i in range(min(BATCH, MESSAGES - start))])
    results["undecodable"] = run(runtime, counter, source, MESSAGES)
    results["note"] = ("handled messages are deleted by Lambda from the response (no request of "
                       "the function's); CPU is this machine's, compare with the bare processor")
    return results


def main() -> dict[str, Any]:
    with endpoint_from_env():
        return measure(Settings.from_env(namespace=f"b{uuid.uuid4().hex[:6]}"))


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
