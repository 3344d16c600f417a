"""What several benchmark scripts set up the same way (imported by them, not run)."""

from __future__ import annotations

from typing import Any


def in_memory_spans() -> Any:
    """Make OpenTelemetry's SDK the process's tracer provider, its spans kept in memory (the
    provider a traced process would set, minus an exporter's network); return the exporter
    (`get_finished_spans`, `clear`)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


def json_log_to_file() -> Any:
    """Log as a deployed consumer does (messenger's JSON event log), into a new temporary file
    instead of stderr (a container's stderr, without the terminal's cost); return the open file
    (its `.name` to count or remove the lines)."""
    import logging
    import tempfile

    from messenger.consume.lifecycle import configure_json_logging

    log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)
    configure_json_logging()
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(log)
    return log


def backlog(namespace: str, channel: str, messages: int, pad: int = 0) -> str:
    """A fresh queue (messenger's channel, with its DLQ) holding `messages` messages pushed by
    messenger, each {"n": n} plus `pad` characters; its URL."""
    from messenger.aws import ClientFactory
    from messenger.channel import queue_name_for
    from messenger.produce.producer import Producer
    from messenger.settings import Settings

    producer = type("Backlog", (Producer,), {"channel": channel})(
        settings=Settings.from_env(namespace=namespace))
    bodies = ({"n": n, "pad": "x" * pad} if pad else {"n": n} for n in range(messages))
    producer.push_many(bodies).raise_for_failures()
    sqs = ClientFactory("us-east-1").client("sqs")
    return str(sqs.get_queue_url(QueueName=queue_name_for(channel, namespace))["QueueUrl"])


def listening_consumer(cls: type, settings: Any, clients: Any,
                       concurrency: int) -> tuple[Any, Any]:
    """A consumer of `cls` (its health file in a new temporary folder; other settings from the
    environment, MESSENGER_CONCURRENCY excepted) running `run` on a daemon
    thread, returned once it listens (LISTENING: provisioning and start-up are behind it), with
    that thread: stop it with `request_shutdown()` and join the thread."""
    import os
    import tempfile
    import threading
    import time

    from messenger.consume.consumer import ConsumerSettings, ConsumerState

    health = os.path.join(tempfile.mkdtemp(), "health.json")
    # the environment's other settings apply (MESSENGER_STATUS_WRITER, ...), as in a deployment
    runtime = ConsumerSettings.from_env(concurrency=concurrency, health_file=health)
    consumer = cls(settings=settings, clients=clients, runtime=runtime)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    while consumer.state in (None, ConsumerState.INITIALIZING, ConsumerState.INITIALIZED):
        time.sleep(0.001)
    return consumer, thread


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) process `pid` has used so far; None where /proc is not."""
    import os

    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> tuple[int, int] | None:
    """(busy, total) clock ticks of every CPU since boot (/proc/stat), None without it: the
    busy share of a span is the difference of two readings' busy over their total's."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(t) for t in stat.readline().split()[1:]]
    except OSError:
        return None
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)  # idle, iowait
