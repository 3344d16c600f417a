"""Dollars per million jobs, all-in: requests counted on the wire x the dated price table.

Every request the producer and the consumers send is billed by `messenger.ops.cost.WireMeter`
(botocore's `before-send` and `after-call` events, retries included) as AWS bills it: SQS and
SNS per started 64 KiB, DynamoDB in write and read units, S3 PUT and GET classes, KMS per call.
The quantities are multiplied by `messenger.ops.prices` (us-east-1 list prices, dated, each with
its AWS page) and scaled to a million jobs. One-off requests (provisioning, a consumer's
startup) are left out: they do not grow with the jobs.

What a consumer process sends whatever its jobs is listed apart (`per_process`), and each
scenario's `at_volume` is its bill without it, what a job costs once a process has handled many:
- its worker registry entry (`messenger.jobs.workers`): a PutItem when it changes, at most every
  CHANGE_WRITE_SECONDS (its counts change while it works) and at least every worker interval,
  the DeleteItem at a clean exit, and the control watcher's Query of the same table
  (`messenger.consume.controls`, once per `control_interval`); per hour of a process, not per job;
- receives that brought no message: here the long poll left open at the exit (the peers, which
  stop inside their last batch, send none), on an idle queue one per 20 s.
The fleet counts the registry's and the control watcher's requests per hour of each task
(REGISTRY_WRITES_PER_SECOND, the busiest case, and the control interval), not per job.

Measured on the local endpoint, each with a handler that does nothing (the platform's own cost):
- plain: `push_many`, one `Consumer` (concurrency 10) draining the backlog.
- job: the same with every job feature on: status tracking (producer and consumer), dedup on
  enqueue (caller ids) and idempotent handlers; `job_features`: each of them alone.
- exchange: `MultiProducer.push_many` to an exchange with 3 filtered queues (a third of the jobs
  to each), one consumer per queue. SNS delivers each job to one queue: deliveries are free on
  SNS's side; each is billed as one SQS request on the queue's (modeled: it is not on the wire).
- offload: 600 KiB bodies through S3 (PUT, GET) and their storage until the bucket's lifecycle
  expires them (`messenger.offload.lifecycle_days` of the default retention: modeled from the
  bytes put). S3 calls KMS with a bucket key (stacks/foundation.py): about none per object.
- peers, as a user writes them, on the same backlog: a boto3 loop (receive 1, delete 1) and
  aws-sqs-consumer (batch_size=10, its cheapest; bench/requirements.txt).

Consumers at 10 and 1,000 jobs/s (`fleet`):
- 1,000 jobs/s: every receive is full (the backlog drains above, `at_volume`: the long poll left
  open at the exit apart; each peer drains as many jobs as messenger's, the warm-up's included,
  so the last, partial batch weighs the same); the producer uses push_many.
- 10 jobs/s: measured with single pushes every 0.1 s for PACED_SECONDS while the consumer runs
  (receives carry what arrived since the last one), for messenger and both peers.
- Fargate (messenger, boto3 loop, aws-sqs-consumer): tasks of 0.25 vCPU and 0.5 GB (the stack's
  default), as many as the consumer's measured CPU per job needs at FARGATE_UTILIZATION, at
  least one; billed per hour whatever their load. Modeled from CPU measured on this machine.
- Lambda (messenger's runtime, Powertools' batch processor): modeled. Lambda's event source
  polls and deletes on the consumer's account: one ReceiveMessage and one DeleteMessageBatch per
  batch; batches of 10 at 1,000 jobs/s and of 1 at 10 jobs/s (no batching window: a poller takes
  what is there). Requests: one per batch; GB-seconds: 256 MB (the stack's default) x the
  per-batch duration measured here (the function's `handle` on 10 and on 1 message, rounded up to
  the millisecond). Idle pollers' empty receives are left out (they are the same for both).

Goal: the job channel costs at most 1.5x the plain channel; the plain channel less than every
peer. Small runs (BENCH_MESSAGES, default 200; BENCH_PACED_SECONDS, default 15): the machine is
shared. Prints JSON.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.consume import CountingConsumer  # noqa: E402
from bench.harness import listening_consumer  # noqa: E402
from messenger.aws import ClientFactory  # noqa: E402
from messenger.channel import (  # noqa: E402
    DEFAULT_RETENTION_SECONDS,
    DEFAULT_VISIBILITY_TIMEOUT,
    ChannelSpec,
    MessageFilter,
    workers_table_name,
)
from messenger.consume.consumer import ConsumerSettings  # noqa: E402
from messenger.consume.controls import control_interval  # noqa: E402
from messenger.jobs.workers import CHANGE_WRITE_SECONDS  # noqa: E402
from messenger.offload import lifecycle_days  # noqa: E402
from messenger.ops.cost import WireMeter  # noqa: E402
from messenger.ops.prices import GB, PRICES_CHECKED, Usage, price_table  # noqa: E402
from messenger.produce.producer import MultiProducer, Producer, PushItem  # noqa: E402
from messenger.provision import Provisioner  # noqa: E402
from messenger.settings import Settings  # noqa: E402
from messenger.tools.local import endpoint_from_env  # noqa: E402

MESSAGES = int(os.environ.get("BENCH_MESSAGES", "200"))
OFFLOAD_MESSAGES = max(10, MESSAGES // 10)
OFFLOAD_BYTES = 600 * 1024
PAD = 200
CONCURRENCY = 10
PACED_RATE = 10
PACED_SECONDS = float(os.environ.get("BENCH_PACED_SECONDS", "15"))
RATES = (10, 1000)
MILLION = 1_000_000
#: Fargate task size: stacks/consumer_service.py's default (cpu 256, memory 512 MiB).
TASK_VCPU, TASK_GB = 0.25, 0.5
#: The CPU share of a task a service runs at before it adds one (modeled).
FARGATE_UTILIZATION = 0.7
#: Lambda memory: stacks/lambda_consumer.py's default (256 MiB).
LAMBDA_GB = 0.25
DAYS_PER_MONTH = 30.4
JOB_GOAL = 1.5
#: A busy consumer process's registry writes per second: its counts change all the time, so its
#: entry is written every CHANGE_WRITE_SECONDS (each under 1 KB: one write unit).
REGISTRY_WRITES_PER_SECOND = 1 / CHANGE_WRITE_SECONDS
#: Its control watcher's Query per second (one item at most: half a read unit, eventually
#: consistent), at the channel's default lease.
CONTROL_READS_PER_SECOND = 1 / control_interval(DEFAULT_VISIBILITY_TIMEOUT)


def body(n: int) -> dict[str, Any]:
    return {"n": n, "pad": "x" * PAD}


# -- metering ---------------------------------------------------------------------------------
def since(meter: WireMeter, mark: tuple[dict[str, float], dict[str, int]]
          ) -> tuple[Usage, dict[str, int]]:
    """What `meter` billed since `mark` (a `marked(meter)`)."""
    usage, requests = mark
    return (Usage({k: v - usage.get(k, 0.0) for k, v in meter.usage.items()
                   if v - usage.get(k, 0.0)}),
            {k: n - requests.get(k, 0) for k, n in meter.requests.items()
             if n - requests.get(k, 0)})


def marked(meter: WireMeter) -> tuple[dict[str, float], dict[str, int]]:
    return dict(meter.usage), dict(meter.requests)


class PerProcess:
    """What a consumer sends whatever its jobs: its worker registry's requests (a second
    `WireMeter` fed only those, told apart by their table) and its receives that brought no
    message (counted from their responses; each one request)."""

    def __init__(self, registry_table: str | None = None) -> None:
        self.registry_table = registry_table
        self.registry = WireMeter()
        self.receives = 0
        self.fed = 0  # receives that brought messages
        self._lock = threading.Lock()
        self._mine = threading.local()  # a call's before-send and after-call share its thread

    def attach(self, register: Callable[[str, Callable[..., Any]], None]) -> PerProcess:
        register("before-send", self._before_send)
        register("after-call", self._after_call)
        return self

    def _before_send(self, request: Any = None, event_name: str = "", **kwargs: Any) -> None:
        self._mine.registry = False
        if event_name.startswith("before-send.sqs.ReceiveMessage"):
            with self._lock:
                self.receives += 1
        elif event_name.startswith("before-send.dynamodb.") and self.registry_table:
            try:
                table = json.loads(getattr(request, "body", b"") or b"{}").get("TableName")
            except (ValueError, AttributeError):
                table = None
            if table == self.registry_table:
                self._mine.registry = True
                self.registry.before_send(request=request, event_name=event_name, **kwargs)

    def _after_call(self, event_name: str = "", parsed: Any = None, **kwargs: Any) -> None:
        if event_name.startswith("after-call.sqs.ReceiveMessage"):
            if (parsed or {}).get("Messages"):
                with self._lock:
                    self.fed += 1
        elif getattr(self._mine, "registry", False):
            self._mine.registry = False
            self.registry.after_call(event_name=event_name, parsed=parsed, **kwargs)

    def found(self) -> dict[str, Any]:
        """usage and requests by operation ('sqs.ReceiveMessage' the receives that brought no
        message, one left open at the exit included)."""
        empty = self.receives - self.fed
        usage = Usage(self.registry.usage).plus([{"sqs.request": empty}] if empty else [])
        requests = dict(self.registry.requests)
        if empty:
            requests["sqs.ReceiveMessage"] = empty
        return {"usage": usage, "requests": requests}


def minus(usage: Usage, other: Usage) -> Usage:
    return Usage({k: v - other.get(k, 0.0) for k, v in usage.items()
                  if v - other.get(k, 0.0) > 1e-12})


def priced(usage_per_million: Usage) -> dict[str, Any]:
    dollars = usage_per_million.dollars()
    return {"total": round(sum(dollars.values()), 4),
            "by_price": {k: round(v, 4) for k, v in dollars.items() if v}}


# -- messenger: produce, then drain -----------------------------------------------------------
def produce(producer: Producer | MultiProducer, items: list[PushItem]) -> tuple[Usage, dict]:
    """push_many `items` with a producer whose factory is metered; what the pushes cost."""
    meter = producer._bench_meter  # type: ignore[attr-defined]
    mark = marked(meter)
    producer.push_many(items).raise_for_failures()
    status = getattr(producer, "status", None)
    if status is not None:
        status.close()  # every QUEUED record written
    return since(meter, mark)


def make_producer(cls: type, settings: Settings, warm: PushItem) -> Any:
    """A producer of `cls` on a metered factory, its one-off checks made by a first push
    (`warm`, consumed like the others but not billed)."""
    clients = ClientFactory(settings.region)
    producer = cls(settings=settings, clients=clients)
    producer.push_many([warm]).raise_for_failures()
    producer._bench_meter = WireMeter().attach(clients)
    return producer


def drain(cls: type[CountingConsumer], settings: Settings, count: int,
          feed: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run a consumer of `cls` until it has handled and deleted `count` messages (`feed`, run
    once it listens, pushes them while it runs); what it billed from LISTENING to its exit,
    its CPU seconds and wall seconds over the same span."""
    clients = ClientFactory(settings.region)
    meter = WireMeter().attach(clients)
    deleted = [0]
    lock = threading.Lock()

    def count_deleted(parsed: Any = None, **_: Any) -> None:
        with lock:
            deleted[0] += len((parsed or {}).get("Successful", []))

    clients.register("after-call.sqs.DeleteMessageBatch", count_deleted)
    consumer, thread = listening_consumer(cls, settings, clients, CONCURRENCY)
    per_process = PerProcess(workers_table_name(settings.namespace)).attach(clients.register)
    mark, cpu, wall = marked(meter), time.process_time(), time.perf_counter()
    if feed is not None:
        feed()
    deadline = time.monotonic() + 300
    while (consumer.handled < count or deleted[0] < count) and time.monotonic() < deadline:
        time.sleep(0.005)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    consumer.request_shutdown()
    thread.join(60)  # the status store flushes: its writes are the jobs'
    usage, requests = since(meter, mark)
    assert consumer.handled >= count, (cls.channel, consumer.handled, count)
    return {"usage": usage, "requests": requests, "cpu_seconds": cpu, "wall_seconds": wall,
            "handled": consumer.handled, "per_process": per_process.found()}


def consumer_class(channel: str, **features: Any) -> type[CountingConsumer]:
    return type(f"Bench_{channel.replace('.', '_')}", (CountingConsumer,),
                {"channel": channel, **features})


def scenario(jobs: int, produced: tuple[Usage, dict], drained: list[dict[str, Any]],
             extra: Usage | None = None, note: str = "") -> dict[str, Any]:
    """A scenario's figures: requests per job by operation and dollars per million jobs (the
    producer's bill over the `jobs` it pushed, the consumers' over the messages they handled)."""
    handled = sum(d["handled"] for d in drained)
    usage = produced[0].scaled(1 / jobs).plus(
        [d["usage"].scaled(1 / handled) for d in drained] + [(extra or Usage()).scaled(1 / jobs)])
    requests: dict[str, float] = {op: n / jobs for op, n in produced[1].items()}
    for d in drained:
        for op, n in d["requests"].items():
            requests[op] = requests.get(op, 0) + n / handled
    fixed_usage = Usage().plus([d["per_process"]["usage"] for d in drained]).scaled(1 / handled)
    fixed: dict[str, int] = {}
    for d in drained:
        for op, n in d["per_process"]["requests"].items():
            fixed[op] = fixed.get(op, 0) + n
    steady = {op: n - fixed.get(op, 0) / handled for op, n in requests.items()}
    found = {"jobs": jobs,
             "requests_per_job": round(sum(requests.values()), 4),
             "by_operation_per_job": {k: round(v, 4) for k, v in sorted(requests.items())},
             "dollars_per_million": priced(usage.scaled(MILLION)),
             "per_process": {"requests": dict(sorted(fixed.items())), "processes": len(drained)},
             "at_volume": {
                 "requests_per_job": round(sum(steady.values()), 4),
                 "by_operation_per_job": {k: round(v, 4) for k, v in sorted(steady.items())
                                          if round(v, 4)},
                 "dollars_per_million": priced(minus(usage, fixed_usage).scaled(MILLION))},
             "consumer_cpu_us_per_job": round(
                 1e6 * sum(d["cpu_seconds"] for d in drained) / handled, 1)}
    if note:
        found["note"] = note
    return found


def plain(settings: Settings) -> tuple[dict[str, Any], dict[str, Any]]:
    producer = make_producer(type("P", (Producer,), {"channel": "d_plain"}), settings,
                             PushItem(body(-1)))
    produced = produce(producer, [PushItem(body(n)) for n in range(MESSAGES)])
    drained = drain(consumer_class("d_plain"), settings, MESSAGES + 1)
    return scenario(MESSAGES, produced, [drained]), {"produced": produced, "drained": drained}


#: The job features, each as the producer's and the consumer's class attributes.
JOB_FEATURES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "status": ({"track_status": True}, {"track_status": True}),
    "dedup": ({"dedup": True}, {}),
    "idempotent": ({}, {"idempotent": True}),
}


def job(settings: Settings, features: tuple[str, ...] = tuple(JOB_FEATURES)) -> dict[str, Any]:
    """A job channel with `features` on (default: every one), callers' ids on every job."""
    channel = f"d_job_{'_'.join(features)}"
    producing = {k: v for f in features for k, v in JOB_FEATURES[f][0].items()}
    consuming = {k: v for f in features for k, v in JOB_FEATURES[f][1].items()}
    producer = make_producer(type("P", (Producer,), {"channel": channel, **producing}), settings,
                             PushItem(body(-1), message_id=f"warm-{uuid.uuid4().hex}"))
    tag = uuid.uuid4().hex[:8]
    produced = produce(producer, [PushItem(body(n), message_id=f"{tag}-{n}")
                                  for n in range(MESSAGES)])
    drained = drain(consumer_class(channel, **consuming), settings, MESSAGES + 1)
    return scenario(MESSAGES, produced, [drained], note=", ".join(features) + " on")


def exchange(settings: Settings) -> dict[str, Any]:
    keys = ("A", "B", "C")
    for key in keys:
        Provisioner(ClientFactory(settings.region), settings).ensure_channel(ChannelSpec(
            f"d_x.q{key.lower()}", namespace=settings.namespace,
            message_filter=MessageFilter("exact", [key])))
    producer = make_producer(type("P", (MultiProducer,), {"channel": "d_x"}), settings,
                             PushItem(body(-1), "A"))
    produced = produce(producer, [PushItem(body(n), keys[n % 3]) for n in range(MESSAGES)])
    drained = []
    for n, key in enumerate(keys):
        share = len(range(n, MESSAGES, 3)) + (1 if key == "A" else 0)
        drained.append(drain(consumer_class(f"d_x.q{key.lower()}"), settings, share))
    # each delivery by SNS to a queue: free on SNS's side, one SQS request on the queue's
    deliveries = Usage({"sqs.request": MESSAGES, "sns.delivery_sqs": MESSAGES})
    return scenario(MESSAGES, produced, drained, deliveries,
                    note="3 filtered queues, each job delivered to one; SNS deliveries billed as "
                         "one SQS request each (modeled)")


def offload(settings: Settings) -> dict[str, Any]:
    pad = "y" * OFFLOAD_BYTES
    # The offload path at the extended clients' 256 KiB threshold (a queue's default is 1 MiB,
    # which would send these bodies inline: bench/threshold.py compares the two in dollars).
    settings = settings.with_changes(offload_threshold=256 * 1024)
    producer = make_producer(type("P", (Producer,), {"channel": "d_big"}), settings,
                             PushItem({"n": -1, "pad": pad}))
    meter = producer._bench_meter
    produced = produce(producer, [PushItem({"n": n, "pad": pad})
                                  for n in range(OFFLOAD_MESSAGES)])
    drained = drain(consumer_class("d_big"), settings, OFFLOAD_MESSAGES + 1)
    days = lifecycle_days(DEFAULT_RETENTION_SECONDS)
    stored = Usage({"s3.gb_month": meter.s3_bytes_put / GB * days / DAYS_PER_MONTH})
    found = scenario(OFFLOAD_MESSAGES, produced, [drained], stored,
                     note=f"600 KiB bodies in S3, kept {days} days (the bucket's lifecycle; "
                          f"storage modeled from the bytes put)")
    found["stored_days"] = days
    return found


# -- peers ------------------------------------------------------------------------------------
def peer_queue(settings: Settings, channel: str) -> str:
    return Provisioner(ClientFactory(settings.region), settings).ensure_channel(
        ChannelSpec(channel, namespace=settings.namespace)).queue.url


def boto3_loop(queue_url: str, count: int, feed: Callable[[], None] | None = None
               ) -> dict[str, Any]:
    """A user's boto3 loop: receive 1 (long poll), handle, delete 1."""
    import boto3

    sqs = boto3.session.Session(region_name="us-east-1").client("sqs")
    meter = WireMeter().attach_client(sqs)
    per_process = PerProcess().attach(sqs.meta.events.register)
    handled = 0
    cpu, wall = time.process_time(), time.perf_counter()
    feeder = _start(feed)
    while handled < count:
        for message in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=1,
                                           WaitTimeSeconds=20).get("Messages", []):
            json.loads(message["Body"])
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
            handled += 1
    _join(feeder)
    return {"usage": meter.usage, "requests": meter.requests, "handled": handled,
            "cpu_seconds": time.process_time() - cpu, "wall_seconds": time.perf_counter() - wall,
            "per_process": per_process.found()}


def aws_sqs_consumer(queue_url: str, count: int, feed: Callable[[], None] | None = None
                     ) -> dict[str, Any]:
    """aws-sqs-consumer with batch_size=10 (its cheapest) and a 20 s long poll."""
    import boto3
    from aws_sqs_consumer import Consumer

    sqs = boto3.session.Session(region_name="us-east-1").client("sqs")
    meter = WireMeter().attach_client(sqs)
    per_process = PerProcess().attach(sqs.meta.events.register)
    handled = [0]

    class Drain(Consumer):
        def handle_message_batch(self, batch: list[Any]) -> None:
            handled[0] += len(batch)
            if handled[0] >= count:
                self.stop()

    consumer = Drain(queue_url=queue_url, sqs_client=sqs, batch_size=10, wait_time_seconds=20,
                     region="us-east-1")
    cpu, wall = time.process_time(), time.perf_counter()
    feeder = _start(feed)
    consumer.start()
    _join(feeder)
    return {"usage": meter.usage, "requests": meter.requests, "handled": handled[0],
            "cpu_seconds": time.process_time() - cpu, "wall_seconds": time.perf_counter() - wall,
            "per_process": per_process.found()}


def _start(feed: Callable[[], None] | None) -> threading.Thread | None:
    if feed is None:
        return None
    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    return thread


def _join(thread: threading.Thread | None) -> None:
    if thread is not None:
        thread.join(120)


def backlog(settings: Settings, channel: str, count: int) -> str:
    url = peer_queue(settings, channel)
    producer = type("P", (Producer,), {"channel": channel})(settings=settings)
    producer.push_many([PushItem(body(n)) for n in range(count)]).raise_for_failures()
    return url


def paced_feed(settings: Settings, channel: str, jobs: int) -> tuple[Callable[[], None], list]:
    """A feed pushing `jobs` single messages at PACED_RATE a second; its producer's bill."""
    producer = make_producer(type("P", (Producer,), {"channel": channel}), settings,
                             PushItem(body(-1)))
    bills: list[tuple[Usage, dict]] = []

    def feed() -> None:
        meter = producer._bench_meter
        mark = marked(meter)
        start = time.monotonic()
        for n in range(jobs):
            time.sleep(max(0.0, start + n / PACED_RATE - time.monotonic()))
            producer.push(body(n))
        bills.append(since(meter, mark))

    return feed, bills


# -- Lambda: per-batch duration ---------------------------------------------------------------
def lambda_durations(settings: Settings) -> dict[str, Any]:
    """Wall seconds per invocation of messenger's Lambda runtime and of Powertools' batch
    processor (a record handler decoding the JSON body), on batches of 10 and of 1."""
    import logging

    from aws_lambda_powertools.utilities.batch import (
        BatchProcessor,
        EventType,
        process_partial_response,
    )

    from messenger.consume.lambda_runtime import (
        LambdaConsumerRuntime,
        LocalEventSource,
        sqs_event,
    )
    from messenger.consume.lifecycle import JsonLinesHandler

    logging.basicConfig(level=logging.INFO, force=True,
                        handlers=[JsonLinesHandler(open(os.devnull, "w"))])  # noqa: SIM115

    class Context:
        def get_remaining_time_in_millis(self) -> int:
            return 60_000

    consumer_cls = type("L", (CountingConsumer,), {"channel": "d_lambda"})
    consumer = consumer_cls(settings=settings, clients=ClientFactory(settings.region),
                            runtime=ConsumerSettings(health_file=os.path.join(
                                tempfile.mkdtemp(), "health.json")))
    runtime = LambdaConsumerRuntime(consumer)
    sqs = ClientFactory(settings.region).client("sqs")
    url = sqs.get_queue_url(QueueName=consumer.spec.queue_name)["QueueUrl"]
    source = LocalEventSource(sqs, url, settings.region, visibility=120)
    producer = type("P", (Producer,), {"channel": "d_lambda"})(settings=settings)

    def bare(record: Any) -> Any:
        return json.loads(record.body)

    def powertools(event: dict[str, Any], context: Any) -> Any:
        return process_partial_response(event, bare, BatchProcessor(
            EventType.SQS, raise_on_entire_batch_failure=False))

    found: dict[str, Any] = {}
    for size in (10, 1):
        batches = max(5, MESSAGES // (10 * size))
        timings: dict[str, list[float]] = {"messenger": [], "powertools": []}
        for _ in range(batches):
            producer.push_many([PushItem(body(n)) for n in range(size)]).raise_for_failures()
            messages = []
            while len(messages) < size:
                messages += source.receive(size - len(messages))
            # the same event to both; the event source's deletes are not the function's time
            event = sqs_event(messages, source.queue_arn, source.region)
            started = time.perf_counter()
            powertools(event, Context())
            timings["powertools"].append(time.perf_counter() - started)
            started = time.perf_counter()
            runtime.handle(event, Context())
            timings["messenger"].append(time.perf_counter() - started)
            sqs.delete_message_batch(QueueUrl=url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                for i, m in enumerate(messages)])
        for name, values in timings.items():
            values.sort()
            found[f"{name}.batch_{size}_ms_median"] = round(1000 * values[len(values) // 2], 3)
    return found


# -- the fleet: consumers at 10 and 1,000 jobs/s ----------------------------------------------
def fargate_tasks(cpu_seconds_per_job: float, rate: float) -> int:
    """Enough 0.25 vCPU tasks for the CPU, at least one."""
    return max(1, math.ceil(rate * cpu_seconds_per_job / (TASK_VCPU * FARGATE_UTILIZATION)))


def fargate(cpu_seconds_per_job: float, rate: float) -> Usage:
    """Fargate task-hours per million jobs."""
    tasks = fargate_tasks(cpu_seconds_per_job, rate)
    hours = MILLION / rate / 3600
    return Usage({"fargate.vcpu_hour": tasks * TASK_VCPU * hours,
                  "fargate.gb_hour": tasks * TASK_GB * hours})


def registry(cpu_seconds_per_job: float, rate: float) -> Usage:
    """Messenger's tasks' worker registry writes and control reads per million jobs (per hour
    of each task, not per job: `PerProcess`)."""
    seconds = fargate_tasks(cpu_seconds_per_job, rate) * MILLION / rate
    return Usage({"dynamodb.write_unit": seconds * REGISTRY_WRITES_PER_SECOND,
                  "dynamodb.read_unit": seconds * CONTROL_READS_PER_SECOND * 0.5})


def lambda_consumer(batch_seconds: float, batch: int) -> Usage:
    """Lambda and its event source per million jobs in batches of `batch`."""
    invocations = MILLION / batch
    billed = math.ceil(batch_seconds * 1000) / 1000
    return Usage({"lambda.request": invocations,
                  "lambda.gb_second": invocations * billed * LAMBDA_GB,
                  "sqs.request": 2 * invocations})  # a receive and a delete batch each


def fleet(settings: Settings, plain_run: dict[str, Any], durations: dict[str, Any]
          ) -> dict[str, Any]:
    """Dollars per million jobs of each consumer option at 10 and 1,000 jobs/s."""
    producers = {1000: plain_run["produced"][0].scaled(1 / MESSAGES)}
    drains: dict[str, dict[int, dict[str, Any]]] = {"messenger": {}, "boto3_loop": {},
                                                     "aws_sqs_consumer": {}}
    # as many jobs for each (messenger's warm-up push included): the same last, partial batch
    drains["messenger"][1000] = plain_run["drained"] | {"jobs": MESSAGES + 1}
    url = backlog(settings, "d_loop", MESSAGES + 1)
    drains["boto3_loop"][1000] = boto3_loop(url, MESSAGES + 1) | {"jobs": MESSAGES + 1}
    url = backlog(settings, "d_peer", MESSAGES + 1)
    drains["aws_sqs_consumer"][1000] = aws_sqs_consumer(url, MESSAGES + 1) | {
        "jobs": MESSAGES + 1}

    jobs = int(PACED_RATE * PACED_SECONDS)
    paced_bills: list[Usage] = []
    for name in drains:
        channel = f"d_paced_{name}"
        feed, bills = paced_feed(settings, channel, jobs)
        if name == "messenger":
            drains[name][10] = drain(consumer_class(channel), settings, jobs, feed)
        else:
            url = peer_queue(settings, channel)
            run = boto3_loop if name == "boto3_loop" else aws_sqs_consumer
            drains[name][10] = run(url, jobs, feed)
        drains[name][10]["jobs"] = jobs
        paced_bills.append(bills[0][0])
    producers[10] = paced_bills[0].scaled(1 / jobs)

    options: dict[str, Any] = {}
    for name, by_rate in drains.items():
        for rate in RATES:
            run = by_rate[rate]
            fixed = run["per_process"]
            per_job = minus(run["usage"], fixed["usage"]).scaled(1 / run["jobs"])
            cpu = run["cpu_seconds"] / run["jobs"]
            usage = producers[rate].plus([per_job]).scaled(MILLION).plus([fargate(cpu, rate)])
            if name == "messenger":
                usage = usage.plus([registry(cpu, rate)])
            requests = {op: n - fixed["requests"].get(op, 0) for op, n in run["requests"].items()}
            options[f"{name}.fargate.{rate}_per_s"] = {
                "dollars_per_million": priced(usage),
                "consumer_requests_per_job": round(sum(requests.values()) / run["jobs"], 4),
                "consumer_by_operation_per_job": {
                    op: round(n / run["jobs"], 4) for op, n in sorted(requests.items()) if n},
                "per_process_requests": fixed["requests"],
                "consumer_cpu_us_per_job": round(1e6 * cpu, 1),
                "tasks": fargate_tasks(cpu, rate),
                "measured": "requests and CPU (this machine); task count modeled; messenger's "
                            "registry and control requests modeled per task-hour"}
    for name in ("messenger", "powertools"):
        for rate, batch in ((10, 1), (1000, 10)):
            seconds = durations[f"{name}.batch_{batch}_ms_median"] / 1000
            usage = producers[rate].scaled(MILLION).plus([lambda_consumer(seconds, batch)])
            options[f"{name}.lambda.{rate}_per_s"] = {
                "dollars_per_million": priced(usage),
                "batch": batch, "billed_ms_per_batch": math.ceil(seconds * 1000),
                "measured": "duration per batch (this machine); batches, event source and "
                            "billing modeled"}
    return options


#: Each peer option and messenger's option it is compared with (the same runtime).
PEER_OPTIONS = {"boto3_loop.fargate": "messenger.fargate",
                "aws_sqs_consumer.fargate": "messenger.fargate",
                "powertools.lambda": "messenger.lambda"}


def versus_peers(plain: dict[str, Any], peers: dict[str, Any], fleet_figures: dict[str, Any]
                 ) -> dict[str, dict[str, Any]]:
    """Messenger's plain channel against each peer, dollars per million jobs (mine, theirs):
    on the backlog (`at_volume`: per-process requests apart), and at each rate on the same
    runtime; `cheaper` when mine is less."""
    pairs = {f"{name}.backlog": (plain["at_volume"]["dollars_per_million"]["total"],
                                 p["at_volume"]["dollars_per_million"]["total"])
             for name, p in peers.items()}
    for peer, ours in PEER_OPTIONS.items():
        for rate in RATES:
            pairs[f"{peer}.{rate}_per_s"] = (
                fleet_figures[f"{ours}.{rate}_per_s"]["dollars_per_million"]["total"],
                fleet_figures[f"{peer}.{rate}_per_s"]["dollars_per_million"]["total"])
    return {key: {"messenger": mine, "peer": theirs, "cheaper": mine < theirs,
                  "same": mine == theirs} for key, (mine, theirs) in pairs.items()}


def main() -> dict[str, Any]:
    with endpoint_from_env():
        settings = Settings.from_env(namespace=f"d{uuid.uuid4().hex[:6]}")
        load = [os.getloadavg()[0]]
        results: dict[str, Any] = {"jobs_per_scenario": MESSAGES,
                                   "prices_checked": PRICES_CHECKED.isoformat(),
                                   "region": "us-east-1"}
        plain_figures, plain_run = plain(settings)
        results["plain"] = plain_figures
        results["job"] = job(settings)
        results["job_features"] = {name: job(settings, (name,)) for name in JOB_FEATURES}
        results["exchange"] = exchange(settings)
        results["offload_600k"] = offload(settings)
        peers = {}
        for name, run in (("boto3_loop", boto3_loop), ("aws_sqs_consumer", aws_sqs_consumer)):
            produced = produce(make_producer(type("P", (Producer,), {"channel": f"d_{name}"}),
                                             settings, PushItem(body(-1))),
                               [PushItem(body(n)) for n in range(MESSAGES)])
            peers[name] = scenario(MESSAGES, produced, [run(
                peer_queue(settings, f"d_{name}"), MESSAGES + 1)])
        results["peers"] = peers
        durations = lambda_durations(settings)
        results["lambda_durations"] = durations
        results["fleet"] = fleet(settings, plain_run, durations)
        load.append(os.getloadavg()[0])

        plain_total = results["plain"]["dollars_per_million"]["total"]
        job_total = results["job"]["dollars_per_million"]["total"]
        results["job_over_plain"] = round(job_total / plain_total, 3)
        results["job_goal"] = JOB_GOAL
        results["job_meets_goal"] = job_total <= JOB_GOAL * plain_total
        results["plain_versus_peers"] = versus_peers(results["plain"], peers, results["fleet"])
        results["plain_meets_goal"] = all(v["cheaper"]
                                          for v in results["plain_versus_peers"].values())
        results["load_average"] = {"start": round(load[0], 2), "end": round(load[-1], 2)}
        results["price_table"] = price_table()
        return results


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
