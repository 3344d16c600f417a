"""`make demo`: the whole flow on the embedded local endpoint, with a readable summary.

Every step checks that it did what it claims; the demo exits non-zero if any step did not. On a
terminal it then keeps its endpoint, with the channels and messages the steps left, and a
dashboard on namespace 'demo' up until Enter (`--serve` / `--no-serve` to choose); elsewhere
it stops them and says how to get them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from examples.channels import WISHLIST_EXCHANGE, example_channels, wishlist_channels
from examples.wishlist import OrderReceiptsProducer, OrdersProducer, WishlistEventProducer
from messenger.aws import ClientFactory
from messenger.channel import ChannelSpec, ChannelTags
from messenger.message import DEAD_LETTER_FAILURE_ATTRIBUTE
from messenger.operations.requeue import Requeuer
from messenger.ops.report import render_text
from messenger.produce.producer import Producer, PushItem
from messenger.provision import Provisioner
from messenger.settings import Settings
from messenger.tools.local import start_local_process
from messenger.tools.webhook_sink import WebhookSink

console = Console()
NAMESPACE = "demo"
ROOT = Path(__file__).resolve().parents[1]


class StepFailed(Exception):
    """A demo step did not do what it claims."""


def check(condition: bool, claim: str) -> None:
    if not condition:
        raise StepFailed(claim)


@dataclass
class DemoContext:
    settings: Settings
    clients: ClientFactory
    endpoint_url: str
    env: dict[str, str]
    workdir: Path
    consumers: dict[str, ConsumerProcess] = field(default_factory=dict)


# -- consumer processes --------------------------------------------------------------------
class ConsumerProcess:
    """A real `messenger consume` process and its JSON lifecycle log."""

    def __init__(self, target: str, env: dict[str, str], workdir: Path) -> None:
        self.target = target
        name = target.split(":")[-1]
        self.log_path = workdir / f"{name}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "messenger", "consume", target],
            env={**env, "MESSENGER_HEALTH_FILE": str(workdir / f"{name}.health")},
            stdout=self._log, stderr=subprocess.STDOUT,
        )

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        found = []
        # complete lines only: the consumer may be writing the last one as it is read
        for line in self.log_path.read_text().split("\n")[:-1]:
            if line.startswith("{"):
                event = json.loads(line)
                if name is None or event.get("event") == name:
                    found.append(event)
        return found

    def completed_ids(self) -> list[str]:
        return [e["message_id"] for e in self.events("completed")]

    def wait_for(self, predicate: Callable[[ConsumerProcess], bool], what: str,
                 timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not predicate(self):
            if self.process.poll() is not None:
                raise StepFailed(f"{self.target} exited ({self.process.returncode}) before: "
                                 f"{what}; its last log lines: {self.last_lines()}")
            if time.monotonic() > deadline:
                raise StepFailed(f"{self.target}: {what} did not happen in {timeout:.0f} s; "
                                 f"its last log lines: {self.last_lines()}")
            time.sleep(0.1)

    def last_lines(self, count: int = 5) -> str:
        """What the consumer did last, for a failed check (its log's last lines)."""
        return " | ".join(self.log_path.read_text().splitlines()[-count:])

    def stop(self, timeout: float) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                return None
        self._log.close()
        return self.process.returncode


CONSUMERS = {
    "all_events": "examples.wishlist:AllEventsConsumer",
    "mobile_events": "examples.wishlist:MobileEventsConsumer",
    "apple_events": "examples.wishlist:AppleEventsConsumer",
    "orders": "examples.wishlist:OrdersConsumer",
}
SHUTDOWN_TIMEOUT = 10
#: Longest wait for the dashboard to answer its first request (a start, not a duration).
DASHBOARD_START_SECONDS = 120


# -- steps ---------------------------------------------------------------------------------
def step_provision(ctx: DemoContext) -> str:
    provisioner = Provisioner(ctx.clients, ctx.settings)
    for spec in example_channels(NAMESPACE):
        provisioner.ensure_channel(spec)
    names = [spec.queue_name for spec in example_channels(NAMESPACE)]
    sqs = ctx.clients.client("sqs")
    urls = sqs.list_queues(QueueNamePrefix=f"{NAMESPACE}-").get("QueueUrls", [])
    missing = [name for name in names if not any(url.endswith("/" + name) for url in urls)]
    check(not missing, f"every example queue exists: missing {missing}")
    return f"{len(names)} channels from examples/channels.py (as the CDK app deploys them): " + (
        ", ".join(names))


def step_start_consumers(ctx: DemoContext) -> str:
    env = {**os.environ, **ctx.env, "MESSENGER_SHUTDOWN_TIMEOUT": str(SHUTDOWN_TIMEOUT),
           "MESSENGER_CONCURRENCY": "2", "DEMO_FIX_FILE": str(ctx.workdir / "fix-deployed")}
    for queue, target in CONSUMERS.items():
        ctx.consumers[queue] = ConsumerProcess(target, env, ctx.workdir)
    for consumer in ctx.consumers.values():
        consumer.wait_for(
            lambda c: any(e.get("state") == "LISTENING" for e in c.events("state")),
            "reaching LISTENING", timeout=60,
        )
    return f"{len(ctx.consumers)} `messenger consume` processes listening: " + ", ".join(
        target.split(":")[-1] for target in CONSUMERS.values())


def step_routed_pushes(ctx: DemoContext) -> str:
    keys = ["MOBILE.APPLE", "MOBILE.ANDROID", "WEB.CHROME", "MOBILE.APPLE", "TV.SAMSUNG"]
    producer = WishlistEventProducer(settings=ctx.settings, clients=ctx.clients)
    result = producer.push_many(
        PushItem({"n": n, "sku": f"SKU-{n}"}, key) for n, key in enumerate(keys))
    check(not result.failures, f"every push accepted: failed {result.failures}")
    ids = result.message_ids
    lines = []
    for spec in wishlist_channels(NAMESPACE):
        expected = [ids[n] for n, key in enumerate(keys)
                    if spec.message_filter is None or spec.message_filter.matches(key)]
        consumer = ctx.consumers[spec.queue]
        consumer.wait_for(lambda c, e=expected: set(e) <= set(c.completed_ids()),
                          f"processing {len(expected)} routed events")
        got = [i for i in consumer.completed_ids() if i in ids]
        check(got == expected, f"{spec.queue} processed exactly its events, in order: "
              f"expected {expected}, processed {got}")
        lines.append(f"{spec.queue} {len(got)}")
    return f"{len(keys)} events via {WISHLIST_EXCHANGE} ({', '.join(keys)}); processed: " + (
        ", ".join(lines))


def step_large_message(ctx: DemoContext) -> str:
    producer = OrdersProducer(settings=ctx.settings, clients=ctx.clients)
    message_id = producer.push({"order": 1, "attachment": "x" * 600 * 1024})
    bucket = ctx.settings.bucket_name(Provisioner(ctx.clients, ctx.settings).account_id)
    objects = ctx.clients.client("s3").list_objects_v2(Bucket=bucket)["KeyCount"]
    check(objects >= 1, f"the body was offloaded to S3: {objects} objects in {bucket}")
    ctx.consumers["orders"].wait_for(lambda c: message_id in c.completed_ids(),
                                     "processing the 600 KiB order")
    return (f"600 KiB order sent as an S3 pointer (AWS extended-client format) to s3://{bucket}; "
            "the orders consumer read it back and processed it")


def step_scheduled_job(ctx: DemoContext) -> str:
    producer = WishlistEventProducer(settings=ctx.settings, clients=ctx.clients)
    pushed = time.monotonic()
    # An exchange has no per-message delay: any delay is an EventBridge Scheduler schedule,
    # which the local endpoint fires when due (docs/scheduled-jobs.md).
    message_id = producer.push({"sku": "SKU-LATER"}, "MOBILE.APPLE", delay=timedelta(seconds=3))
    consumer = ctx.consumers["apple_events"]
    check(message_id not in consumer.completed_ids(),
          f"the scheduled job waits: it ran {time.monotonic() - pushed:.1f} s after the push")
    consumer.wait_for(lambda c: message_id in c.completed_ids(), "the scheduled job")
    took = time.monotonic() - pushed
    check(took >= 3, f"the scheduled job ran no earlier than due: it ran {took:.1f} s after "
          "the push")
    return (f"job {message_id[:8]}... scheduled 3 s out on {WISHLIST_EXCHANGE} (a one-time "
            f"Scheduler schedule); apple_events ran it {took:.1f} s after the push")


def step_http_enqueue(ctx: DemoContext) -> str:
    # The job API the CDK app deploys behind API Gateway, served on loopback by the same code
    # (`messenger api`): a plain HTTP POST puts an order on the channel.
    import urllib.request

    from messenger.api.app import JobApi
    from messenger.api.channels import ApiChannel
    from messenger.api.local import LocalApi

    spec = next(spec for spec in example_channels(NAMESPACE) if spec.name == "orders")
    channel = ApiChannel(spec.name, ordered=spec.ordered, priorities=spec.priorities,
                         track_status=spec.track_status)
    with LocalApi(JobApi({"orders": channel}, ctx.settings, ctx.clients)) as api:
        request = urllib.request.Request(
            f"{api.url}/channels/orders/jobs", method="POST",
            data=json.dumps({"body": {"order": 42, "via": "http"}}).encode(),
            headers={"Content-Type": "application/json", "Idempotency-Key": "demo-order-42"})
        with urllib.request.urlopen(request, timeout=30) as response:
            status, location = response.status, response.headers["Location"]
            job_id = json.loads(response.read())["job_id"]
    check(status == 202 and location == f"/jobs/{job_id}",
          f"the POST was accepted (202): {status}, Location {location}, job_id {job_id}")
    ctx.consumers["orders"].wait_for(lambda c: job_id in c.completed_ids(),
                                     "processing the order posted over HTTP")
    return (f"POST /channels/orders/jobs -> {status}, Location {location}; the orders consumer "
            f"processed it")


def step_poison_and_requeue(ctx: DemoContext) -> str:
    orders = ctx.consumers["orders"]
    message_id = OrdersProducer(settings=ctx.settings, clients=ctx.clients).push(
        {"order": 7, "poison": True})
    spec = next(s for s in example_channels(NAMESPACE) if s.name == "orders")
    sqs = ctx.clients.client("sqs")
    dlq_url = sqs.get_queue_url(QueueName=spec.dlq_name)["QueueUrl"]

    def in_dlq() -> int:
        attributes = sqs.get_queue_attributes(
            QueueUrl=dlq_url, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"])

    orders.wait_for(lambda c: len([e for e in c.events("failed")
                                   if e.get("message_id") == message_id]) >= spec.max_receives,
                    f"{spec.max_receives} failed attempts", timeout=60)
    deadline = time.monotonic() + 30
    while in_dlq() < 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    dead = in_dlq()
    check(dead == 1, "after 3 failed attempts the consumer moved the poison order to the DLQ: "
          f"{dead} in {spec.dlq_name}")
    [dead] = sqs.receive_message(QueueUrl=dlq_url, MessageAttributeNames=["All"],
                                 VisibilityTimeout=0)["Messages"]
    failure = json.loads(dead["MessageAttributes"][DEAD_LETTER_FAILURE_ATTRIBUTE]["StringValue"])
    check(failure.get("error_type") == "ValueError" and "Traceback" in failure["traceback"],
          f"its dead letter names the error and carries the traceback: {failure}")
    (ctx.workdir / "fix-deployed").touch()  # the fix is deployed
    report = Requeuer(spec.dlq_name, "orders", settings=ctx.settings, clients=ctx.clients).start()
    check(report.moved == 1, f"the requeuer moved it back: {report.summary()}")
    orders.wait_for(lambda c: message_id in c.completed_ids(), "processing the requeued order")
    return (f"order 7 failed {spec.max_receives}x ({failure['error_type']}: "
            f"{failure['error_message']}) -> {spec.dlq_name}; fix deployed; "
            f"requeued {report.moved} -> processed")


def step_spark(ctx: DemoContext) -> str:
    # The executors' Python workers import the job's module (and messenger) from these paths.
    spark_env = {**os.environ, **ctx.env, "PYSPARK_PYTHON": sys.executable,
                 "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "spark_jobs")])}
    all_events = ctx.consumers["all_events"]
    before = len(all_events.completed_ids())
    done = subprocess.run(
        [sys.executable, "-m", "examples.price_drops_local", "--rows", "400", "--workdir",
         str(ctx.workdir), "--endpoint-url", ctx.endpoint_url, "--namespace", NAMESPACE],
        cwd=ROOT, env=spark_env, capture_output=True, text=True, timeout=300)
    check(done.returncode == 0, f"the Spark job succeeded: {done.stderr[-800:]}")
    report = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    published = int(report["published"])
    check(published > 0 and report["failed"] == 0,
          f"price drops were published, none failed: {report}")
    all_events.wait_for(lambda c: len(c.completed_ids()) >= before + published,
                        f"processing the {published} price-drop events", timeout=120)
    return (f"Spark (local mode) found {published} price drops in 400 wishlist rows and published "
            f"them from its executors to {WISHLIST_EXCHANGE} ({report['requests']} requests); "
            f"all_events processed them all")


def step_lambdas(ctx: DemoContext) -> str:
    # This step sets up what its three posts report, whatever earlier steps did: a channel nobody
    # consumes over its (critical) alarm threshold (the cleaner: sends, no receives), and an
    # invoice a crashed reader left to SQS's redrive in its DLQ. (A DLQ emptied earlier in the
    # same minute may add a row: the alarm reads the minute's maximum, as on AWS.)
    backlog = ChannelSpec("reports", namespace=NAMESPACE,
                          tags=ChannelTags(owner="bi-team", alarm_threshold=5, critical=True))
    crashed = ChannelSpec("invoices", namespace=NAMESPACE, max_receives=1,
                          tags=ChannelTags(owner="billing"))
    for spec in (backlog, crashed):
        Provisioner(ctx.clients, ctx.settings).ensure_channel(spec)

    class ReportsProducer(Producer):
        channel = "reports"

    class InvoicesProducer(Producer):
        channel = "invoices"

    ReportsProducer(settings=ctx.settings, clients=ctx.clients).push_many(
        [{"report": n} for n in range(12)]).raise_for_failures()
    InvoicesProducer(settings=ctx.settings, clients=ctx.clients).push({"invoice": 1})
    # No metric is written here: the local endpoint publishes SQS's own (depth, age, sends...)
    sqs = ctx.clients.client("sqs")
    url = sqs.get_queue_url(QueueName=backlog.queue_name)["QueueUrl"]
    invoices_url = sqs.get_queue_url(QueueName=crashed.queue_name)["QueueUrl"]
    dlq_url = sqs.get_queue_url(QueueName=crashed.dlq_name)["QueueUrl"]

    def depth(queue_url: str) -> int:
        return int(sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=[
            "ApproximateNumberOfMessages"])["Attributes"]["ApproximateNumberOfMessages"])

    # Received once and never deleted (max_receives=1): SQS moves it to the DLQ on the next
    # receive, as it does for a reader that crashes on a message.
    for _ in range(20):
        sqs.receive_message(QueueUrl=invoices_url, MaxNumberOfMessages=1, VisibilityTimeout=0,
                            WaitTimeSeconds=0)
        if depth(dlq_url) >= 1:
            break
    backlog_depth, dead = depth(url), depth(dlq_url)
    check(dead == 1 and backlog_depth == 12,
          f"one invoice dead-lettered by SQS, 12 reports waiting: found {dead} in "
          f"{crashed.dlq_name}, {backlog_depth} in {backlog.queue_name}")
    sink = WebhookSink()
    try:
        ctx.clients.client("secretsmanager").create_secret(
            Name="demo/slack-webhook", SecretString=sink.url)
        env = {**os.environ, **ctx.env, "SLACK_WEBHOOK_SECRET": "demo/slack-webhook",
               "MESSENGER_ALARM_THRESHOLD": "100", "CLEANER_DRY_RUN": "true"}
        texts: dict[str, str] = {}
        for name, event in (("queue_alarm", {"scope": "source"}), ("queue_alarm", {"scope": "dlq"}),
                            ("resource_cleaner", {})):
            before = len(sink.posts)
            done = subprocess.run(
                [sys.executable, "-m", "examples.invoke_lambda", name, json.dumps(event)],
                env=env, capture_output=True, text=True, timeout=120)
            check(done.returncode == 0, f"{name} ran: exit {done.returncode}: "
                  f"{done.stderr[-500:]}")
            posted = [render_text(post) for post in sink.posts[before:]]
            label = event.get("scope", name)
            check(len(posted) == 1, f"{name} ({label}) posted once to Slack: it posted "
                  f"{len(posted)} time(s): " + " | ".join(p.splitlines()[0] for p in posted))
            texts[label] = posted[0]
        alarm, dlq_alarm, cleaner = texts["source"], texts["dlq"], texts["resource_cleaner"]
        check("critical" in alarm and backlog.queue_name in alarm,
              f"the alarm flags the critical backlog {backlog.queue_name}: it posted\n{alarm}")
        dlq_rows = sorted(line.split("*")[1] for line in dlq_alarm.splitlines()
                          if line.startswith(("🟠 *", "🔴 *")))
        orders_dlq = next(s for s in example_channels(NAMESPACE) if s.name == "orders").dlq_name
        check(crashed.dlq_name in dlq_rows and set(dlq_rows) <= {crashed.dlq_name, orders_dlq},
              f"the DLQ alarm flags {crashed.dlq_name} (and at most {orders_dlq}, emptied this "
              f"minute): it flagged {dlq_rows}")
        check("dry run" in cleaner and backlog.queue_name in cleaner,
              f"the cleaner reported {backlog.queue_name} without deleting: it posted\n{cleaner}")
        for post in sink.posts:
            console.print(Panel(render_text(post), title="Slack (local webhook sink)",
                                expand=False))
        # The alarm's inspect command, run as pasted (it names the namespace).
        inspect = next(line.split("inspect: `")[1].split("`")[0]
                       for line in dlq_alarm.splitlines()
                       if f"Channel `{crashed.name}`" in line)
        listed = subprocess.run(
            inspect, shell=True, capture_output=True, text=True, timeout=120,
            env={**env, "PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                                 os.environ.get("PATH", "")])})
        check(listed.returncode == 0 and "1 dead letter" in listed.stdout,
              f"the DLQ alarm's `{inspect}` works as pasted: exit {listed.returncode}: "
              f"{(listed.stdout + listed.stderr)[-600:]}")
        return (f"{len(sink.posts)} Slack posts over HTTP to the local sink: the critical "
                f"backlog of {backlog.queue_name} ({backlog_depth} > 5), the dead letter in "
                f"{crashed.dlq_name}, the cleaner's dry-run report; `{inspect}` as pasted lists "
                "it")
    finally:
        sink.close()


def step_lambda_consumer(ctx: DemoContext) -> str:
    # The receipts channel's consumer runs in Lambda in the CDK app; here the platform's function
    # gets one batch as Lambda's SQS event source would hand it over.
    target = "examples.wishlist:ReceiptsConsumer"
    OrderReceiptsProducer(settings=ctx.settings, clients=ctx.clients).push_many(
        [{"order": n} for n in range(3)]).raise_for_failures()
    done = subprocess.run(
        [sys.executable, "-m", "examples.invoke_lambda", "consumer", target],
        env={**os.environ, **ctx.env}, capture_output=True, text=True, timeout=120)
    check(done.returncode == 0, f"the consumer function ran: {done.stderr[-500:]}")
    result = json.loads(done.stdout)
    check(result["received"] == 3,
          f"the event source handed over the 3 receipts: {result['received']}")
    check(result["response"] == {"batchItemFailures": []},
          f"the partial batch response lists no failure: {result['response']}")
    return (f"3 receipts through the consumer Lambda ({target.split(':')[-1]}, the class "
            f"unchanged): partial batch response {json.dumps(result['response'])}")


def step_cdk_synth(ctx: DemoContext) -> str:
    out = ctx.workdir / "cdk.out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION"] = "1"
    cdk = ROOT / "node_modules" / ".bin" / "cdk"
    check(cdk.exists(), "the pinned CDK CLI is installed (npm install)")
    done = subprocess.run([str(cdk), "synth", "--quiet", "-o", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    check(done.returncode == 0, f"cdk synth passed with cdk-nag: {done.stderr[-800:]}")
    templates = sorted(p.name for p in out.glob("*.template.json"))
    check(bool(templates), f"templates were written: none in {out}")
    return (f"cdk synth: {len(templates)} stacks ({', '.join(templates)}), cdk-nag AwsSolutions: "
            "0 unacknowledged findings")


def step_stop_consumers(ctx: DemoContext) -> str:
    codes = {}
    started = time.monotonic()
    for queue, consumer in ctx.consumers.items():
        codes[queue] = consumer.stop(timeout=SHUTDOWN_TIMEOUT + 10)
    ctx.consumers.clear()
    check(all(code == 0 for code in codes.values()), f"every consumer exited 0 ({codes})")
    return f"SIGTERM: {len(codes)} consumers exited 0 in {time.monotonic() - started:.1f} s"


#: The demo's steps, in order.
STEPS: list[tuple[str, Callable[[DemoContext], str]]] = [
    ("Provision the example channels", step_provision),
    ("Start the consumers as real processes", step_start_consumers),
    ("Routed pushes through the wishlist exchange", step_routed_pushes),
    ("A large message through S3", step_large_message),
    ("A job scheduled a few seconds out", step_scheduled_job),
    ("A job posted over HTTP (the job API)", step_http_enqueue),
    ("A poison message: DLQ, fix, requeue", step_poison_and_requeue),
    ("Spark job publishing price drops", step_spark),
    ("Ops Lambdas: queue alarm and resource cleaner", step_lambdas),
    ("A consumer class in Lambda: one SQS batch", step_lambda_consumer),
    ("cdk synth with cdk-nag", step_cdk_synth),
    ("Graceful shutdown (SIGTERM)", step_stop_consumers),
]


def run(steps: list[tuple[str, Callable[[DemoContext], str]]], serve: bool | None = None,
        until: Callable[[str], None] | None = None) -> int:
    """Run the steps on a local endpoint of their own and print a summary. serve: then keep
    that endpoint, with what the steps made, and a dashboard on the demo's namespace up until
    `until(dashboard_url)` returns (default: until Enter or Ctrl-C); None: serve when run on a
    terminal
    (`make demo`), not in scripts and tests."""
    if serve is None:
        serve = sys.stdin.isatty() and sys.stdout.isatty()
    started = time.monotonic()
    console.rule("[bold]messenger demo")
    server = start_local_process()
    console.print(f"local endpoint: [cyan]{server.url}[/cyan] (moto server on loopback)")
    env = {**server.env(), "MESSENGER_NAMESPACE": NAMESPACE}
    os.environ.update(env)
    workdir = Path(tempfile.mkdtemp(prefix="messenger-demo-"))
    console.print(f"logs: [cyan]{workdir}[/cyan] (each consumer's JSON lines in <Class>.log)",
                  soft_wrap=True)
    ctx = DemoContext(Settings.from_env(), ClientFactory("us-east-1"), server.url, env, workdir)
    results: list[tuple[str, bool, str, float]] = []
    try:
        for title, step in steps:
            step_started = time.monotonic()
            with console.status(f"{title} ..."):
                try:
                    summary, ok = step(ctx), True
                except Exception as error:  # a demo reports every failure and goes on
                    summary, ok = f"{type(error).__name__}: {error}", False
                    if not isinstance(error, StepFailed):
                        console.print(traceback.format_exc(), style="dim")
            took = time.monotonic() - step_started
            results.append((title, ok, summary, took))
            mark = "[green]✓[/green]" if ok else "[red]✗[/red]"
            console.print(f"{mark} [bold]{title}[/bold] ({took:.1f} s)\n   {summary}")
    except BaseException:
        server.stop()
        raise
    finally:
        for consumer in ctx.consumers.values():
            consumer.stop(timeout=SHUTDOWN_TIMEOUT + 10)
    table = Table(title="summary")
    for column in ("step", "result", "seconds"):
        table.add_column(column)
    for title, ok, _, took in results:
        table.add_row(title, "[green]ok[/green]" if ok else "[red]FAILED[/red]", f"{took:.1f}")
    console.print(table)
    failed = sum(1 for _, ok, _, _ in results if not ok)
    console.print(
        f"{len(results) - failed} of {len(results)} steps ok in {time.monotonic() - started:.0f} s"
    )
    if serve:
        serve_until_stopped(ctx, server, until or wait_for_enter)
        return 1 if failed else 0
    server.stop()
    console.print(stopped_hint(), markup=False, soft_wrap=True)
    console.print(f"logs: {workdir}", soft_wrap=True)
    return 1 if failed else 0


def stopped_hint() -> str:
    """What to do to look at the demo's channels, once its endpoint has stopped (a run not on
    a terminal): its state lived in that endpoint's memory, a new endpoint has none of it."""
    return ("The demo's endpoint has stopped, and its channels with it (they lived in its "
            "memory). To browse them in the dashboard, run `make demo` in a terminal (or "
            "`python -m examples.demo --serve`): it keeps the endpoint and a dashboard on "
            f"namespace {NAMESPACE!r} up until you press Enter (docs/dashboard.md).")


def free_port() -> int:
    """A port nothing listens on now, on loopback."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_dashboard(ctx: DemoContext) -> tuple[subprocess.Popen[bytes], str]:
    """`messenger dashboard` on the demo's endpoint and namespace, on a free port: the process
    and its URL, once it answers (its output goes to dashboard.log in the demo's folder)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    with open(ctx.workdir / "dashboard.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "messenger", "dashboard", "--port", str(port)],
            env={**os.environ, **ctx.env}, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + DASHBOARD_START_SECONDS
    while process.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=10):
                return process, url
        except OSError:
            time.sleep(0.2)
    stop_process(process)
    log_text = (ctx.workdir / "dashboard.log").read_text(errors="replace")
    raise StepFailed(f"the dashboard did not start: {log_text[-500:]}")


def stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_enter(url: str) -> None:
    """Until the user presses Enter (or Ctrl-C, or closes the input). Enter, not only Ctrl-C:
    under `make demo` a Ctrl-C also interrupts make, which then reports the demo as failed."""
    try:
        input("Press Enter to stop them. ")
    except (KeyboardInterrupt, EOFError):
        pass


def serve_until_stopped(ctx: DemoContext, server: Any, until: Callable[[str], None]) -> None:
    """Keep the demo's endpoint, with its channels, and a dashboard on them up until
    `until(dashboard_url)` returns; then stop both."""
    exports = " ".join(f"{key}={value}" for key, value in ctx.env.items())
    try:
        dashboard: subprocess.Popen[bytes] | None = None
        try:
            dashboard, url = start_dashboard(ctx)
            where = f"dashboard: {url} (namespace {NAMESPACE!r}; its log: dashboard.log)"
        except (StepFailed, OSError) as error:  # e.g. without the dashboard's extra
            url, where = "", f"no dashboard ({error})"
        console.print(f"The demo's endpoint stays up with its channels until you press Enter.\n"
                      f"  {where}\n  in another shell: export {exports}\n"
                      f"  then e.g. messenger top --once", markup=False, soft_wrap=True)
        console.print(f"logs: {ctx.workdir}", soft_wrap=True)
        until(url)
    except KeyboardInterrupt:  # Ctrl-C before the wait began
        pass
    finally:
        if dashboard is not None:
            stop_process(dashboard)
        server.stop()
    console.print("endpoint and dashboard stopped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.demo", description=__doc__)
    parser.add_argument("--serve", action=argparse.BooleanOptionalAction, default=None,
                        help="after the steps, keep the endpoint and a dashboard on namespace "
                             "'demo' up until Enter (default: when run on a terminal)")
    args = parser.parse_args(argv)
    return run(STEPS, serve=args.serve)


if __name__ == "__main__":
    sys.exit(main())
