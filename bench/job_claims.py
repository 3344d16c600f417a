"""One job id, one run: what the job-id claim costs a consumer (`messenger.jobs.fired`).

Consumer-side AWS requests per job, counted with botocore's 'before-send' event on the
consumer's own clients (`RequestCounter`), for three rounds of BENCH_JOBS jobs each, every round
run to its last completion by the Fargate runtime (`Consumer.run` in a thread) on a fresh
queue:

- plain: jobs without an id (no mark: the consumer makes no claim);
- job_id_claim_on: jobs pushed with dedup on and a message id (each carries
  `messenger-job-window`: its consumer claims the id, one conditional PutItem);
- job_id_claim_off: the same kind of jobs, the consumer's claims switched off
  (`consumer.firings = None`), what a consumer cost before the claim covered them.

The requests a consumer makes whatever it runs (long polls while idle, the worker registry's
heartbeat, control reads) depend on how long a round lasts; the claim's own cost is the
difference of the two job-id rounds' DynamoDB writes. Priced with `messenger.ops.prices`
(us-east-1 list prices): an SQS request per 64 KiB chunk (the bodies are small: one each), a
DynamoDB write request unit per PutItem/DeleteItem of an item under 1 KB, a read unit per
GetItem/Query; control-plane calls (DescribeTable, GetQueueUrl, ...) are not billed per request.
Runs against a child-process moto server (or AWS_ENDPOINT_URL if set). Prints JSON. Goal: at
most one DynamoDB write per job with an id, none for a plain job.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from messenger import Consumer, ConsumerSettings, Producer, ReceivedMessage  # noqa: E402
from messenger.aws import ClientFactory, RequestCounter  # noqa: E402
from messenger.channel import dedup_table_name  # noqa: E402
from messenger.consume.lifecycle import LifecycleEvent  # noqa: E402
from messenger.ops.prices import PRICES, PRICES_CHECKED, Usage  # noqa: E402
from messenger.settings import Settings  # noqa: E402
from messenger.tools.local import endpoint_from_env  # noqa: E402

JOBS = int(os.environ.get("BENCH_JOBS", "300"))
#: How each counted operation is billed (others: control plane, not billed per request).
BILLED = {
    "sqs": "sqs.request",
    "dynamodb.PutItem": "dynamodb.write_unit", "dynamodb.DeleteItem": "dynamodb.write_unit",
    "dynamodb.UpdateItem": "dynamodb.write_unit",
    "dynamodb.BatchWriteItem": "dynamodb.write_unit",
    "dynamodb.GetItem": "dynamodb.read_unit", "dynamodb.Query": "dynamodb.read_unit",
}
UNBILLED_SQS = {"GetQueueUrl", "GetQueueAttributes", "CreateQueue", "SetQueueAttributes",
                "TagQueue", "ListQueueTags"}


class TableRequests:
    """botocore `before-send` hook on DynamoDB: the requests naming one table, per operation."""

    def __init__(self, table: str) -> None:
        self.table = table
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, request: Any, event_name: str = "", **_: Any) -> None:
        body = request.body if isinstance(request.body, bytes) else str(request.body).encode()
        if json.loads(body or b"{}").get("TableName") == self.table:
            operation = event_name.split(".")[2]
            with self._lock:
                self.counts[operation] = self.counts.get(operation, 0) + 1


class Counted(Consumer):
    """Does nothing with a job; `done` is set at its `expected`-th completion."""

    visibility_timeout = 30

    def __init__(self, *args: Any, expected: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.expected, self.completed = expected, 0
        self.done = threading.Event()

    def handler(self, message: ReceivedMessage) -> None:
        pass

    def on_event(self, event: LifecycleEvent) -> None:
        if event.name == "completed":
            self.completed += 1
            if self.completed >= self.expected:
                self.done.set()


def round_(settings: Settings, name: str, with_id: bool, claiming: bool) -> dict[str, Any]:
    channel = f"bench_claims_{name}"
    producer_class = type("BenchProducer", (Producer,), {"channel": channel, "dedup": with_id})
    consumer_class = type("BenchConsumer", (Counted,), {"channel": channel})
    producer = producer_class(settings=settings, clients=ClientFactory(settings.region))
    if with_id:
        for n in range(JOBS):
            producer.push({"n": n}, message_id=f"{name}-{n}")
    else:
        for first in range(0, JOBS, 10):
            producer.push_many([{"n": n} for n in range(first, min(JOBS, first + 10))])
    clients = ClientFactory(settings.region)
    counter = RequestCounter().attach(clients)
    claims = TableRequests(dedup_table_name(settings.namespace))
    clients.register("before-send.dynamodb", claims)
    consumer = consumer_class(settings=settings, clients=clients, expected=JOBS,
                              runtime=ConsumerSettings(health_file=f"/tmp/{uuid.uuid4().hex}",
                                                       shutdown_timeout=10))
    if not claiming:
        consumer.firings = None
    started = time.monotonic()
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    if not consumer.done.wait(300):
        raise RuntimeError(f"{name}: {consumer.completed} of {JOBS} jobs completed in 300 s")
    seconds = time.monotonic() - started
    consumer.request_shutdown()
    thread.join(60)
    counts = dict(sorted(counter.counts.items()))
    usage = Usage()
    for operation, count in counts.items():
        service, _, action = operation.partition(".")
        key = BILLED.get(operation) or (BILLED.get(service) if service == "sqs" and
                                        action not in UNBILLED_SQS else None)
        if key is not None:
            usage.add(key, count)
    dynamodb_writes = sum(count for operation, count in counts.items()
                          if BILLED.get(operation) == "dynamodb.write_unit")
    return {
        "jobs": JOBS, "seconds": round(seconds, 2),
        "requests_per_job": {op: round(n / JOBS, 4) for op, n in counts.items()},
        "requests_per_job_total": round(sum(counts.values()) / JOBS, 4),
        "dynamodb_writes_per_job": round(dynamodb_writes / JOBS, 4),
        "dedup_table_requests_per_job": {op: round(n / JOBS, 4)
                                         for op, n in sorted(claims.counts.items())},
        "dollars_per_million_jobs": round(usage.total_dollars() * 1_000_000 / JOBS, 4),
    }


def main() -> None:
    with endpoint_from_env():
        settings = Settings.from_env(namespace=f"bench{uuid.uuid4().hex[:6]}")
        rounds = {
            "plain": round_(settings, "plain", with_id=False, claiming=True),
            "job_id_claim_on": round_(settings, "on", with_id=True, claiming=True),
            "job_id_claim_off": round_(settings, "off", with_id=True, claiming=False),
        }
    on, off = rounds["job_id_claim_on"], rounds["job_id_claim_off"]
    claim_writes = on["dedup_table_requests_per_job"].get("PutItem", 0.0)
    plain_writes = rounds["plain"]["dedup_table_requests_per_job"].get("PutItem", 0.0)
    print(json.dumps({
        "bench": "job_claims", "jobs_per_round": JOBS,
        "prices_checked": PRICES_CHECKED.isoformat(),
        "rounds": rounds,
        "claim_dynamodb_writes_per_job": claim_writes,
        "claim_dollars_per_million_jobs": round(
            claim_writes * 1_000_000 * PRICES["dynamodb.write_unit"].per_unit, 4),
        "plain_dynamodb_claim_writes_per_job": plain_writes,
        "goal": "<= 1 DynamoDB write per job with an id, 0 per plain job",
        "ok": claim_writes <= 1.0 and plain_writes == 0.0 and
        not off["dedup_table_requests_per_job"],
    }, indent=2))


if __name__ == "__main__":
    main()
