"""A Spark publish carries the driver's trace context to its messages: `PartitionPublisher`
(what each executor task runs) called directly, against the moto server, without Spark's JVM."""

from __future__ import annotations

import json

from pyspark.sql import Row

from messenger import Producer
from messenger.message import META_HEADERS_ATTRIBUTE
from messenger.spark import COUNTERS, ExecutorSettings, PartitionPublisher, RowMapping
from tests.integration.helpers import drain
from tests.otel import in_memory_spans, named


class Counter:
    def __init__(self) -> None:
        self.value = 0

    def add(self, value: int) -> None:
        self.value += value


class Exports(Producer):
    channel = "traced_exports"


DRIVER = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


def _publish(settings, endpoint: str, rows: list[Row]) -> None:
    task = PartitionPublisher(Exports, ExecutorSettings(settings, endpoint),
                              RowMapping(None, None, None, None),
                              {name: Counter() for name in COUNTERS}, trace_parent=DRIVER)
    assert list(task(0, iter(rows))) == []  # no failed row


def test_an_executor_without_opentelemetry_passes_the_drivers_context_on(
        settings, clients, endpoint):
    # Given the driver's context shipped with the task, and an executor that does not trace
    _publish(settings, endpoint, [Row(n=n) for n in range(3)])
    # Then every message carries the driver's traceparent: its consumer's spans join that trace
    received = drain(clients.client("sqs"), clients.client("sqs").get_queue_url(
        QueueName=f"{settings.namespace}-traced_exports")["QueueUrl"])
    assert len(received) == 3
    for message in received:
        headers = json.loads(message["MessageAttributes"][META_HEADERS_ATTRIBUTE]["StringValue"])
        assert headers == DRIVER


def test_an_executor_that_traces_makes_its_spans_children_of_the_drivers(
        settings, clients, endpoint):
    with in_memory_spans() as exported:
        _publish(settings, endpoint, [Row(n=n) for n in range(3)])
        spans = exported.get_finished_spans()
    creates = named(spans, "create ")
    assert len(creates) == 3
    for span in creates:
        assert span.context.trace_id == int(DRIVER["traceparent"].split("-")[1], 16)
        assert span.parent.span_id == int(DRIVER["traceparent"].split("-")[2], 16)


def test_publish_ships_the_drivers_current_context():
    # What `publish` hands each task: the W3C headers of the driver's current span, or nothing
    from opentelemetry import trace

    from messenger.tracing import current_headers

    assert current_headers("auto") == {}  # no tracer provider: nothing to ship
    with in_memory_spans():
        with trace.get_tracer("test").start_as_current_span("nightly export") as export:
            shipped = current_headers("auto")
        assert current_headers("off") == {}
    context = export.get_span_context()
    assert shipped["traceparent"].split("-")[1:3] == \
        [f"{context.trace_id:032x}", f"{context.span_id:016x}"]
