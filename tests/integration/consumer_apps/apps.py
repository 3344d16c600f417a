"""Consumers run as real processes by tests/integration/test_consumer_process.py.

Each handler appends one JSON line per start and per end to the file named by
$CONSUMER_TEST_RECORD, so a test can see what ran, in which process, and how often.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from messenger import Consumer, ReceivedMessage

CHANNEL = "consumer_test"


def record(event: str, message: ReceivedMessage, **extra: Any) -> None:
    line = {
        "event": event, "body": message.body, "message_id": message.message_id,
        "receive_count": message.receive_count, "pid": os.getpid(), "time": time.time(), **extra,
    }
    with open(os.environ["CONSUMER_TEST_RECORD"], "a") as out:
        out.write(json.dumps(line) + "\n")


class SleepyConsumer(Consumer):
    """Sleeps body['sleep'] seconds; a 2 s lease that only the heartbeat keeps alive."""

    channel = CHANNEL
    visibility_timeout = 2
    processing_timeout = 40

    def handler(self, message: ReceivedMessage) -> None:
        record("start", message)
        time.sleep(float(message.body["sleep"]))
        record("end", message)


class TimeoutConsumer(SleepyConsumer):
    """Like SleepyConsumer, with a 2 s processing timeout."""

    processing_timeout = 2


class StuckConsumer(Consumer):
    """A handler that never returns and cannot be interrupted (blocked on a lock)."""

    channel = CHANNEL
    visibility_timeout = 2
    processing_timeout = 2

    def handler(self, message: ReceivedMessage) -> None:
        record("start", message)
        threading.Event().wait()


class IdempotentConsumer(Consumer):
    """Idempotent; with $CONSUMER_TEST_DIE_BEFORE_DELETE set, the process dies (os._exit, no
    cleanup, like kill -9) when it first tries to delete a message: after its handler completed
    and its idempotency record was saved, before SQS heard of it."""

    channel = CHANNEL
    visibility_timeout = 2
    processing_timeout = 10
    idempotent = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        marker = os.environ.get("CONSUMER_TEST_DIE_BEFORE_DELETE")
        if marker and not os.path.exists(marker):
            def die(**_: Any) -> None:
                open(marker, "w").close()
                os._exit(9)

            for operation in ("DeleteMessage", "DeleteMessageBatch"):
                self.clients.register(f"before-call.sqs.{operation}", die)

    def handler(self, message: ReceivedMessage) -> None:
        record("end", message)


class TracedConsumer(Consumer):
    """Sets up OpenTelemetry's SDK as an application would (spans as JSON lines in the file
    named by $CONSUMER_TEST_SPANS), and pushes each body on to the channel 'consumer_test_next'
    from its handler."""

    channel = CHANNEL

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

        out = open(os.environ["CONSUMER_TEST_SPANS"], "a")  # noqa: SIM115 - the process's
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(
            out=out, formatter=lambda span: span.to_json(indent=None) + "\n")))
        trace.set_tracer_provider(provider)
        super().__init__(*args, **kwargs)

    def handler(self, message: ReceivedMessage) -> None:
        from messenger import Producer

        type("Next", (Producer,), {"channel": "consumer_test_next"})().push(message.body)
        record("end", message)
