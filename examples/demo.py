"""`make demo`: the whole flow on the embedded local endpoint, with a readable summary.

Every step checks that it did what it claims; the demo exits non-zero if any step did not.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from examples.channels import WISHLIST_EXCHANGE, example_channels, wishlist_channels
from messenger.aws import ClientFactory
from messenger.local import start_local_process
from messenger.message import Message
from messenger.offload import OffloadPointer, PayloadStore
from messenger.producer import MultiProducer, Producer, PushItem
from messenger.provision import Provisioner
from messenger.settings import Settings

console = Console()
NAMESPACE = "demo"


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
    facts: dict[str, Any] = field(default_factory=dict)


class WishlistProducer(MultiProducer):
    channel = WISHLIST_EXCHANGE
    ordered = True


class OrdersProducer(Producer):
    channel = "orders"


def receive_all(
    ctx: DemoContext, queue_name: str, expected: int, timeout: float = 10
) -> list[Message]:
    """Receive and delete messages of a queue until `expected` arrived or the time is up."""
    sqs = ctx.clients.client("sqs")
    url = sqs.get_queue_url(QueueName=queue_name)["QueueUrl"]
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < expected and time.monotonic() < deadline:
        response = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], WaitTimeSeconds=1
        )
        for raw in response.get("Messages", []):
            body = raw["Body"]
            pointer = OffloadPointer.parse(body, raw.get("MessageAttributes"))
            if pointer is not None:
                body = PayloadStore(ctx.clients.client("s3"), pointer.bucket).get(pointer)
            got.append(Message.decode(body, raw.get("MessageAttributes"), raw["MessageId"]))
            sqs.delete_message(QueueUrl=url, ReceiptHandle=raw["ReceiptHandle"])
    return got


# -- steps ---------------------------------------------------------------------------------
def step_provision(ctx: DemoContext) -> str:
    provisioner = Provisioner(ctx.clients, ctx.settings)
    for spec in example_channels(NAMESPACE):
        provisioner.ensure_channel(spec)
    names = [spec.queue_name for spec in example_channels(NAMESPACE)]
    urls = (
        ctx.clients.client("sqs").list_queues(QueueNamePrefix=f"{NAMESPACE}-").get("QueueUrls", [])
    )
    check(
        all(any(url.endswith("/" + name) for url in urls) for name in names),
        "every example queue exists",
    )
    return f"{len(names)} channels from examples/channels.py: " + ", ".join(names)


def step_routed_pushes(ctx: DemoContext) -> str:
    keys = ["MOBILE.APPLE", "MOBILE.ANDROID", "WEB.CHROME", "MOBILE.APPLE", "TV.SAMSUNG"]
    producer = WishlistProducer(settings=ctx.settings, clients=ctx.clients)
    result = producer.push_many(
        PushItem({"n": n, "sku": f"SKU-{n}"}, key) for n, key in enumerate(keys)
    )
    check(not result.failures, "every push accepted")
    lines = []
    for spec in wishlist_channels(NAMESPACE):
        expected = [
            n
            for n, key in enumerate(keys)
            if spec.message_filter is None or spec.message_filter.matches(key)
        ]
        got = receive_all(ctx, spec.queue_name, len(expected))
        check(
            [m.body["n"] for m in got] == expected,
            f"{spec.queue_name} received exactly {expected} in order",
        )
        lines.append(f"{spec.queue}: {[m.routing_key for m in got]}")
    return f"{len(keys)} events through {WISHLIST_EXCHANGE}; " + "; ".join(lines)


def step_large_message(ctx: DemoContext) -> str:
    producer = OrdersProducer(settings=ctx.settings, clients=ctx.clients)
    body = {"order": 1, "attachment": "x" * 600 * 1024}
    producer.push(body)
    [message] = receive_all(ctx, f"{NAMESPACE}-orders", 1)
    check(message.body == body, "the 600 KiB body came back intact")
    bucket = ctx.settings.bucket_name(Provisioner(ctx.clients, ctx.settings).account_id)
    objects = ctx.clients.client("s3").list_objects_v2(Bucket=bucket)["KeyCount"]
    check(objects >= 1, "the body was offloaded to S3")
    return "600 KiB body sent as an S3 pointer (extended-client format) and resolved on receive"


#: The demo's steps, in order. Later steps are appended by the features they show.
STEPS: list[tuple[str, Callable[[DemoContext], str]]] = [
    ("Provision the example channels", step_provision),
    ("Routed pushes through the wishlist exchange", step_routed_pushes),
    ("A large message through S3", step_large_message),
]


def run(steps: list[tuple[str, Callable[[DemoContext], str]]]) -> int:
    started = time.monotonic()
    console.rule("[bold]messenger demo")
    server = start_local_process()
    console.print(f"local endpoint: [cyan]{server.url}[/cyan] (moto server on loopback)")
    env = {**server.env(), "MESSENGER_NAMESPACE": NAMESPACE}
    os.environ.update(env)
    ctx = DemoContext(Settings.from_env(), ClientFactory("us-east-1"), server.url, env)
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
    finally:
        server.stop()
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
    return 1 if failed else 0


def main() -> int:
    return run(STEPS)


if __name__ == "__main__":
    sys.exit(main())
