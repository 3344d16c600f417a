"""Trace context end to end (`messenger.tracing`), against the moto server over HTTP, with
OpenTelemetry's SDK exporting to memory: the producer's spans, the context in each message,
the consumer's process spans, requeues; and nothing of it when OpenTelemetry is not there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

from messenger import MultiProducer, Producer, PushItem, ReceivedMessage
from messenger.channel import SQS_MAX_MESSAGE_ATTRIBUTES
from messenger.message import META_HEADERS_ATTRIBUTE
from messenger.offload import OffloadPointer
from messenger.operations.requeue import Requeuer
from messenger.provision import Provisioner
from tests.integration.consumer_apps.apps import CHANNEL
from tests.integration.helpers import drain
from tests.integration.test_consumer_process import start  # noqa: F401 - the fixture
from tests.integration.test_consumer_runtime import (  # noqa: F401 - fixtures
    Recording,
    dead_letters,
    running,
    runtime,
    wait_until,
)
from tests.otel import in_memory_spans, named

ROOT = Path(__file__).resolve().parents[2]


class Order(BaseModel):
    schema_version: ClassVar[str] = "2"
    n: int
    blob: str


class OrderEvents(MultiProducer):
    """The fullest envelope an exchange message can carry: priority, schema version, routing key,
    meta headers, max_attempts, and a body offloaded to S3."""

    channel = "traced_events"
    priorities = ("high", "low")
    model = Order
    offload_threshold = 1024


class TracedOrders(Recording):
    """Fails each message's first run; remembers the span current in the handler."""

    channel = "traced_events.orders"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.current: list[Any] = []

    def handler(self, message: ReceivedMessage) -> None:
        from opentelemetry import trace

        super().handler(message)
        self.current.append(trace.get_current_span().get_span_context())
        if len(self.handled) == 1:
            raise RuntimeError("card declined")


def test_one_trace_from_push_through_an_exchange_an_offloaded_body_and_a_requeue(
        settings, clients, running):  # noqa: F811 - the fixture
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, StatusCode

    sqs = clients.client("sqs")
    spec = TracedOrders.channel_spec(settings.namespace)
    Provisioner(clients, settings).ensure_channel(spec)  # subscribed before the publish
    with in_memory_spans() as exported:
        # Given a push inside the caller's span, with every attribute the envelope can use
        with trace.get_tracer("test").start_as_current_span("checkout") as checkout:
            message_id = OrderEvents(settings=settings, clients=clients).push(
                {"n": 1, "blob": "x" * 4000}, "ORDER.CREATED", meta_headers={"locale": "fr"},
                priority="high", max_attempts=1)
        # When its consumer fails it once (max_attempts 1: dead-lettered at once) ...
        run = running(TracedOrders)
        (dead,) = dead_letters(clients, run.consumer, expected=1)
        sqs.change_message_visibility(QueueUrl=run.consumer.resources.dlq.url,
                                      ReceiptHandle=dead["ReceiptHandle"], VisibilityTimeout=0)
        # ... and it is requeued and handled
        report = Requeuer(source_queue=spec.dlq_name, destination_channel=spec.name,
                          settings=settings, clients=clients).start()
        assert (report.moved, report.failed) == (1, 0)
        wait_until(lambda: run.consumer.named("completed"))
        run.stop()
        spans = exported.get_finished_spans()

    # Then the dead-letter copy used all 10 attributes SQS allows (SNS raw delivery, offloaded
    # body, dead-letter reason): the context rides in meta_headers, next to the user's header
    attributes = dead["MessageAttributes"]
    assert len(attributes) == SQS_MAX_MESSAGE_ATTRIBUTES, sorted(attributes)
    assert OffloadPointer.parse(dead["Body"], attributes) is not None
    headers = json.loads(attributes[META_HEADERS_ATTRIBUTE]["StringValue"])
    assert headers["locale"] == "fr" and headers["traceparent"].startswith("00-")
    # And one trace holds the push, both runs of the handler and the requeue
    trace_id = checkout.get_span_context().trace_id
    (send,) = [s for s in named(spans, "send ") if s.kind is SpanKind.PRODUCER
               and s.attributes["messaging.system"] == "aws.sns"]
    assert send.name == f"send {settings.namespace}-traced_events"
    assert send.parent.span_id == checkout.get_span_context().span_id
    assert send.attributes["messaging.operation.type"] == "send"
    assert send.attributes["messenger.message_id"] == message_id
    assert headers["traceparent"].startswith(f"00-{trace_id:032x}-{send.context.span_id:016x}-")
    first, second = sorted(named(spans, "process "), key=lambda s: s.start_time)
    for process in (first, second):
        assert process.name == f"process {spec.queue_name}"
        assert process.kind is SpanKind.CONSUMER
        assert process.context.trace_id == trace_id
        assert process.parent.span_id == send.context.span_id  # the message's creation
        assert [link.context.span_id for link in process.links] == [send.context.span_id]
        assert process.attributes["messaging.system"] == "aws_sqs"
        assert process.attributes["messaging.destination.name"] == spec.queue_name
        assert process.attributes["messaging.operation.type"] == "process"
        assert process.attributes["messenger.message_id"] == message_id
    assert first.status.status_code is StatusCode.ERROR
    assert first.attributes["error.type"] == "RuntimeError"
    assert [e.name for e in first.events] == ["exception"]
    assert second.status.status_code is StatusCode.UNSET
    # The handler ran inside its process span (its own spans are the process span's children)
    assert [c.span_id for c in run.consumer.current] == \
        [first.context.span_id, second.context.span_id]
    (requeue,) = [s for s in named(spans, "send ") if s.attributes.get("messenger.operation")
                  == "requeue"]
    assert requeue.name == f"send {spec.queue_name}"
    assert [link.context.span_id for link in requeue.links] == [send.context.span_id]


class Receipts(Producer):
    channel = "traced_receipts"


def test_push_many_gives_each_message_its_own_create_span_and_links_each_batch(
        settings, clients):
    from opentelemetry.trace import SpanKind

    with in_memory_spans() as exported:
        # When twelve messages are pushed at once (two batch requests)
        result = Receipts(settings=settings, clients=clients).push_many(
            [PushItem({"n": n}) for n in range(12)])
        result.raise_for_failures()
        spans = exported.get_finished_spans()
    queue = sqs_url = clients.client("sqs").get_queue_url(
        QueueName=f"{settings.namespace}-traced_receipts")["QueueUrl"]
    received = drain(clients.client("sqs"), sqs_url)
    # Then each message carries the context of its own create span
    creates = named(spans, "create ")
    assert len(creates) == 12 and {s.kind for s in creates} == {SpanKind.PRODUCER}
    by_id = {s.attributes["messenger.message_id"]: s for s in creates}
    for message in received:
        attributes = message["MessageAttributes"]
        headers = json.loads(attributes[META_HEADERS_ATTRIBUTE]["StringValue"])
        span = by_id[attributes["message_id"]["StringValue"]]
        assert headers["traceparent"].split("-")[2] == f"{span.context.span_id:016x}"
    # And each batch request is a send span (CLIENT: the messages were created before) linked
    # to the create spans of its messages
    sends = sorted(named(spans, "send "), key=lambda s: s.start_time)
    assert [s.kind for s in sends] == [SpanKind.CLIENT] * 2
    assert [s.attributes["messaging.batch.message_count"] for s in sends] == [10, 2]
    linked = [link.context.span_id for s in sends for link in s.links]
    assert sorted(linked) == sorted(s.context.span_id for s in creates)
    assert queue  # the queue the messages went to


def test_a_handler_interrupted_at_its_timeout_ends_its_span_as_an_error(
        settings, clients, running):  # noqa: F811 - the fixture
    from opentelemetry.trace import StatusCode

    class Slow(Recording):
        processing_timeout = 1

        def handler(self, message: ReceivedMessage) -> None:
            import time

            super().handler(message)
            until = time.monotonic() + 5
            while time.monotonic() < until:  # Python code: the interruption reaches it
                time.sleep(0.01)

    with in_memory_spans() as exported:
        type("P", (Producer,), {"channel": Slow.channel})(settings=settings).push({"n": 1})
        run = running(Slow)
        dead_letters(clients, run.consumer, expected=1)
        wait_until(lambda: named(exported.get_finished_spans(), "process "))
        run.stop()
        (process,) = named(exported.get_finished_spans(), "process ")
    assert process.status.status_code is StatusCode.ERROR
    assert process.attributes["error.type"] == "processing_timeout"


def test_a_message_dead_lettered_before_its_handler_ends_the_trace_with_an_error_span(
        settings, clients, running):  # noqa: F811 - the fixture
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, StatusCode

    class Receipts(Recording):
        channel = "traced_receipts"

    class Big(Producer):
        channel = "traced_receipts"
        offload_threshold = 1024

    stored: list[tuple[str, str]] = []
    clients.register("before-parameter-build.s3.PutObject",
                     lambda params, **_: stored.append((params["Bucket"], params["Key"])))
    with in_memory_spans() as exported:
        # Given a traced push whose body went to S3, and that object gone (expired, deleted)
        with trace.get_tracer("test").start_as_current_span("upload") as upload:
            Big(settings=settings, clients=clients).push({"blob": "x" * 4000})
        ((bucket, key),) = stored
        clients.client("s3").delete_object(Bucket=bucket, Key=key)
        # When its consumer gets it (dead-lettered at once: no handler can ever read it)
        run = running(Receipts)
        dead_letters(clients, run.consumer, expected=1)
        wait_until(lambda: named(exported.get_finished_spans(), "process "))
        run.stop()
        spans = exported.get_finished_spans()
    # Then the producer's trace ends in a failed process span naming why, and no handler ran
    assert not run.consumer.handled
    (process,) = named(spans, "process ")
    (send,) = [s for s in named(spans, "send ") if s.kind is SpanKind.PRODUCER]
    assert process.kind is SpanKind.CONSUMER
    assert process.context.trace_id == upload.get_span_context().trace_id
    assert process.parent.span_id == send.context.span_id
    assert process.status.status_code is StatusCode.ERROR
    assert process.attributes["error.type"] == "payload_missing"
    assert process.status.description.startswith("payload_missing: ")


BLOCKER = textwrap.dedent("""
    import importlib.abc, sys

    class NoOpenTelemetry(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, NoOpenTelemetry())
""")


def _run(script: str, settings, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **settings.as_env(), **env}
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("installed", [False, True])
def test_without_a_tracer_provider_nothing_is_imported_and_nothing_added(
        settings, clients, installed: bool):
    # Given a process where OpenTelemetry cannot be imported (or is installed but unused)
    script = ("" if installed else BLOCKER) + textwrap.dedent("""
        import os, sys, tempfile, threading
        from messenger import Consumer, ConsumerSettings, Producer, PushItem

        class Plain(Producer):
            channel = "untraced"

        class Consumed(Producer):
            channel = "untraced_consumed"

        handled = threading.Event()

        class Handler(Consumer):
            channel = "untraced_consumed"

            def handler(self, message):
                handled.set()

        Plain().push({"n": 0}, meta_headers={"locale": "fr"})
        Plain().push_many([PushItem({"n": 1}), PushItem({"n": 2})]).raise_for_failures()
        # The consumer side too: a message received and handled
        Consumed().push({"n": 3})
        consumer = Handler(runtime=ConsumerSettings(
            health_file=os.path.join(tempfile.mkdtemp(), "health.json"), shutdown_timeout=5))
        running = threading.Thread(target=consumer.run, daemon=True)
        running.start()
        assert handled.wait(30)
        consumer.request_shutdown()
        running.join(30)
        print(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"))
    """)
    done = _run(script, settings)
    assert done.returncode == 0, done.stderr
    # Then no OpenTelemetry module was loaded, and the messages carry exactly what they did
    assert done.stdout.strip().splitlines()[-1] == "[]"
    received = drain(clients.client("sqs"), clients.client("sqs").get_queue_url(
        QueueName=f"{settings.namespace}-untraced")["QueueUrl"])
    assert len(received) == 3
    for message in received:
        attributes = message["MessageAttributes"]
        assert set(attributes) <= {"message_id", "produced_at", META_HEADERS_ATTRIBUTE}
        if META_HEADERS_ATTRIBUTE in attributes:
            assert json.loads(attributes[META_HEADERS_ATTRIBUTE]["StringValue"]) == \
                {"locale": "fr"}


def test_tracing_on_without_opentelemetry_fails_with_one_line_naming_the_setting(settings):
    done = _run(BLOCKER + textwrap.dedent("""
        from messenger import Producer

        class Plain(Producer):
            channel = "untraced"

        Plain().push({"n": 0})
    """), settings, MESSENGER_TRACING="on")
    assert done.returncode == 1
    assert "InvalidSettings: tracing (MESSENGER_TRACING) is 'on' but opentelemetry-api is not " \
        "installed" in done.stderr


def test_a_consumer_process_continues_the_trace_and_its_own_pushes_join_it(
        settings, clients, start, tmp_path):  # noqa: F811 - the fixture
    from opentelemetry import trace

    spans_file = tmp_path / "spans.jsonl"
    with in_memory_spans() as exported:
        # Given a message pushed inside a request's span
        with trace.get_tracer("test").start_as_current_span("request") as request:
            type("P", (Producer,), {"channel": CHANNEL})(settings=settings).push({"n": 1})
        (send,) = named(exported.get_finished_spans(), "send ")
    # When a `messenger consume` process that traces handles it (and pushes on)
    process = start("TracedConsumer", CONSUMER_TEST_SPANS=str(spans_file))
    process.wait_for_event("completed")
    process.stop()
    spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
    # Then its process span is the child of the send span, in the request's trace ...
    trace_id = f"0x{request.get_span_context().trace_id:032x}"
    (handled,) = [s for s in spans if s["name"].startswith("process ")]
    assert handled["context"]["trace_id"] == trace_id
    assert handled["parent_id"] == f"0x{send.context.span_id:016x}"
    assert handled["kind"] == "SpanKind.CONSUMER"
    # ... and the handler's own push is a child of the process span, its message carrying it on
    (pushed,) = [s for s in spans if s["name"].startswith("send ")]
    assert pushed["parent_id"] == handled["context"]["span_id"]
    (forwarded,) = drain(clients.client("sqs"), clients.client("sqs").get_queue_url(
        QueueName=f"{settings.namespace}-consumer_test_next")["QueueUrl"])
    headers = json.loads(forwarded["MessageAttributes"][META_HEADERS_ATTRIBUTE]["StringValue"])
    assert headers["traceparent"].split("-")[1:3] == \
        [trace_id[2:], pushed["context"]["span_id"][2:]]
