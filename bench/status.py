"""Status tracking's cost: the same backlog consumed with `track_status` off and on, in one run.

Target: <= 0.3 extra DynamoDB requests per message (a job's records share one item, 25 items per
BatchWriteItem), and a throughput ratio (on / off) of at least 0.9.

In each of ROUNDS rounds (BENCH_ROUNDS, default 8), pushes MESSAGES / ROUNDS (BENCH_MESSAGES,
default 32,000) to a channel and drains it with tracking off, and the same with a tracked channel
(whose producer records QUEUED), the order of the two alternating from round to round, with the
same consumer settings (concurrency 10; handlers empty, or waiting BENCH_HANDLER_MS), counting
the consumer's requests with botocore's 'before-send' event. Throughput is measured from
LISTENING until every message is handled; the status store is then closed (flushed) before its
requests are counted. `throughput_ratio` is the median of the rounds' ratios (a burst of another
process's load hits one round, not the figure); `pooled_ratio` divides the sides' totals;
`cpu_ratio` is the median ratio of the consumer process's CPU time for the same messages
(off / on): the machine's other load moves it far less. With MESSENGER_STATUS_WRITER=process
the writer is a child process: `cpu_ratio_with_writer` adds its CPU to the consumer's, and its
BatchWriteItem calls are counted by the store (they are not on this process's clients). Each side
also reports the local DynamoDB server's CPU per message and the machine's busy share (median of
rounds, /proc/stat): where every core is busy, the server's work for the status writes takes CPU
from the consumer and the SQS server too, which AWS's DynamoDB would not.

Runs against child-process moto servers (they do not share this process's GIL), DynamoDB on a
server of its own as on AWS, where the status table's writes take no CPU from SQS's answers (on
one moto server each BatchWriteItem held up the consumer's receives and deletes); or against
AWS_ENDPOINT_URL if set. Prints JSON with the machine's load average. The rounds are 4,000
messages each (the local endpoint's SQS index answers a deep queue as fast as an empty one): with
500, a round lasted 0.3 s and its ratio ranged 0.75-1.92 in one run; with 4,000, 0.78-0.93. The
absolute throughput is moto's (and the machine's), so only the ratio means something.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import uuid
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.consume import CountingConsumer  # noqa: E402
from bench.harness import listening_consumer, machine_busy, process_cpu_seconds  # noqa: E402
from messenger.aws import ClientFactory, RequestCounter  # noqa: E402
from messenger.consume.settings import ConsumerSettings  # noqa: E402
from messenger.produce.producer import Producer  # noqa: E402
from messenger.settings import Settings  # noqa: E402
from messenger.tools.local import endpoint_from_env, start_local_process  # noqa: E402

MESSAGES = int(os.environ.get("BENCH_MESSAGES", "32000"))
#: Off and on alternate in rounds of MESSAGES / ROUNDS, so that a change in the machine's load (or
#: moto's speed) during the run hits both sides alike.
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "8"))
CONCURRENCY = 10
TARGET_EXTRA_REQUESTS = 0.3
#: Throughput with status tracking on, at least this share of tracking off (issue 44).
TARGET_RATIO = 0.9
#: BENCH_TASK_CPUS=N: the consumer and its writer process get N cores, as a task of N vCPUs,
#: and the local AWS servers (on AWS, other machines) the rest; 0 (default): all share every
#: core. The measurement the goal means, a consumer CPU-bound on one core with a core to spare
#: for the writer process, is BENCH_TASK_CPUS=2 on a machine of 4 cores or more.
TASK_CPUS = int(os.environ.get("BENCH_TASK_CPUS", "0"))


#: Seconds each handler waits (BENCH_HANDLER_MS; default 0: an empty handler, which leaves the
#: consumer CPU-bound on its own requests, the worst case for the writer's share of the CPU).
HANDLER_SECONDS = float(os.environ.get("BENCH_HANDLER_MS", "0")) / 1000


class WaitingConsumer(CountingConsumer):
    def handler(self, message: Any) -> None:
        if HANDLER_SECONDS:
            time.sleep(HANDLER_SECONDS)
        super().handler(message)


class UntrackedConsumer(WaitingConsumer):
    channel = "bench_status_off"


class TrackedConsumer(WaitingConsumer):
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


def consume(cls: type[CountingConsumer], settings: Settings, count: int,
            dynamodb_pid: int | None = None) -> dict[str, Any]:
    """Drain `count` messages with a fresh consumer; its figures (see `combine`).
    dynamodb_pid: the local DynamoDB server's process, whose CPU is counted too."""
    clients = ClientFactory(settings.region)
    counter = RequestCounter().attach(clients)
    consumer, thread = listening_consumer(cls, settings, clients, CONCURRENCY)
    writer = consumer.status.writer if consumer.status is not None else None
    # the writer process's and the DynamoDB server's CPU over the same span
    others = {"writer": writer.pid if writer is not None else None, "dynamodb": dynamodb_pid}
    before = {name: process_cpu_seconds(pid) for name, pid in others.items() if pid}
    busy = machine_busy()
    started, cpu = time.perf_counter(), time.process_time()
    deadline = time.monotonic() + 600
    while consumer.handled < count and time.monotonic() < deadline:
        time.sleep(0.005)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    after = {name: process_cpu_seconds(others[name]) for name in before}
    busy_after = machine_busy()
    consumer.request_shutdown()
    thread.join(60)  # closes the status store: every record written or counted as failed
    dynamodb = {op: n for op, n in counter.counts.items() if op.startswith("dynamodb.")}
    result: dict[str, Any] = {
        "handled": consumer.handled,
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "requests": counter.total,
        "dynamodb": dynamodb,
    }
    for name, value in after.items():
        if value is not None and before[name] is not None:
            result[f"{name}_cpu_seconds"] = value - before[name]
    if busy is not None and busy_after is not None:
        result["machine_busy"] = (busy_after[0] - busy[0]) / max(1, busy_after[1] - busy[1])
    if consumer.status is not None:
        stats = consumer.status.store.stats
        result["status_records"] = {"recorded": stats.recorded, "written": stats.written,
                                    "failed": stats.failed, "dropped": stats.dropped,
                                    "items": stats.items}
        if writer is not None:
            # its requests are not on this process's clients: the store counts every call
            # (the process's, and this process's after a fail-over)
            dynamodb["dynamodb.BatchWriteItem"] = stats.requests
            result["requests"] += stats.requests - counter.counts.get(
                "dynamodb.BatchWriteItem", 0)
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
        "cpu_ms_per_message": round(sum(r["cpu_seconds"] for r in rounds) / handled * 1000, 4),
        "requests": sum(r["requests"] for r in rounds),
        "dynamodb": dict(sorted(dynamodb.items())),
        "batch_writes": dynamodb["dynamodb.BatchWriteItem"],
        "dynamodb_requests": sum(dynamodb.values()),
    }
    for name in ("writer", "dynamodb"):  # other processes' CPU for the same messages
        spent = [r[f"{name}_cpu_seconds"] for r in rounds if f"{name}_cpu_seconds" in r]
        if spent:
            combined[f"{name}_process_cpu_ms_per_message"] = round(sum(spent) / handled * 1000, 4)
    busy = [r["machine_busy"] for r in rounds if "machine_busy" in r]
    if busy:
        combined["machine_busy_median"] = round(statistics.median(busy), 3)
    if records:
        combined["status_records"] = dict(records)
    return combined


def measure(settings: Settings, dynamodb_pid: int | None = None) -> dict[str, Any]:
    # One backlog at a time (moto's ReceiveMessage slows down with the messages it holds), off and
    # on alternating.
    size = MESSAGES // ROUNDS
    off_rounds, on_rounds = [], []
    producer_dynamodb: Counter[str] = Counter()
    for number in range(ROUNDS):
        push(UntrackedProducer, settings, size)
        producer_dynamodb.update(push(TrackedProducer, settings, size))
        sides = [(UntrackedConsumer, off_rounds), (TrackedConsumer, on_rounds)]
        for cls, rounds in sides if number % 2 == 0 else reversed(sides):
            rounds.append(consume(cls, settings, size, dynamodb_pid))
    off, on = combine(off_rounds), combine(on_rounds)
    total = size * ROUNDS
    per_message = on["dynamodb_requests"] / total
    producer_per_message = producer_dynamodb["dynamodb.BatchWriteItem"] / total
    # the same messages each side: on's throughput / off's is off's seconds / on's
    ratios = [f["seconds"] / o["seconds"] for f, o in zip(off_rounds, on_rounds, strict=True)]
    ratio = statistics.median(ratios)
    # the consumer process's CPU (its threads; moto runs in other processes) for the same work:
    # what the throughput ratio tends to when the machine's other load leaves it a whole core
    cpu_ratios = [f["cpu_seconds"] / o["cpu_seconds"]
                  for f, o in zip(off_rounds, on_rounds, strict=True)]
    # the same with the writer process's CPU added to the consumer's (its status writing)
    writer_ratios = [f["cpu_seconds"] / (o["cpu_seconds"] + o.get("writer_cpu_seconds", 0.0))
                     for f, o in zip(off_rounds, on_rounds, strict=True)]
    return {
        "messages": total,
        "rounds": ROUNDS,
        "concurrency": CONCURRENCY,
        "handler_ms": HANDLER_SECONDS * 1000,
        "throughput_ratio": round(ratio, 3),
        "round_ratios": [round(r, 3) for r in ratios],
        "pooled_ratio": round(on["messages_per_second"] / off["messages_per_second"], 3),
        "cpu_ratio": round(statistics.median(cpu_ratios), 3),
        "cpu_ratio_with_writer": round(statistics.median(writer_ratios), 3),
        "status_writer": ConsumerSettings.from_env().status_writer,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "dynamodb_requests_per_message": round(per_message, 4),
        "batch_writes_per_message": round(on["batch_writes"] / total, 4),
        # DynamoDB writes per job, the consumer's: items put (a job's records written together
        # share one; each item under 1 KB is one write request unit on demand) and records
        "items_written_per_message": round(on.get("status_records", {}).get("items", 0) / total,
                                           4),
        "records_per_message": round(on.get("status_records", {}).get("recorded", 0) / total, 4),
        "producer_batch_writes_per_message": round(producer_per_message, 4),
        "extra_sqs_requests_per_message": round((on["requests"] - on["dynamodb_requests"]
                                                 - off["requests"]) / total, 4),
        "tracking_off": off,
        "tracking_on": on,
        "producer_dynamodb": dict(sorted(producer_dynamodb.items())),
        "note": "absolute rates are the local moto server's; compare the ratio",
        "target_extra_requests_per_message": TARGET_EXTRA_REQUESTS,
        "target_throughput_ratio": TARGET_RATIO,
        "meets_target": per_message <= TARGET_EXTRA_REQUESTS and ratio >= TARGET_RATIO
        and on["handled"] == off["handled"] == total
        and on.get("status_records", {}).get("written") == on.get("status_records", {})
        .get("recorded"),
    }


def main() -> dict[str, Any]:
    cores = sorted(os.sched_getaffinity(0))
    pinned = bool(TASK_CPUS) and len(cores) > TASK_CPUS and not os.environ.get("AWS_ENDPOINT_URL")
    if pinned:  # the local AWS servers, started next, inherit the cores the task leaves
        os.sched_setaffinity(0, cores[TASK_CPUS:])
    with endpoint_from_env() as local:
        dynamodb = start_local_process() if local else None
        if pinned:  # a task of TASK_CPUS vCPUs: the consumers and their writer processes
            os.sched_setaffinity(0, cores[:TASK_CPUS])
        if dynamodb is not None:
            os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = dynamodb.url
        try:
            result = measure(Settings.from_env(namespace=f"b{uuid.uuid4().hex[:6]}"),
                             dynamodb.process.pid if dynamodb is not None else None)
            result["task_cpus"] = TASK_CPUS if pinned else None
            return result
        finally:
            if dynamodb is not None:
                dynamodb.stop()
                del os.environ["AWS_ENDPOINT_URL_DYNAMODB"]


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
