"""OpenTelemetry's SDK with an in-memory exporter, as the process's tracer provider for one
test: messenger's 'auto' tracing is on while it is installed, off again after."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def in_memory_spans() -> Iterator[Any]:
    """Install an SDK tracer provider exporting to memory; yields the InMemorySpanExporter."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.util._once import Once

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        # The API takes a global provider once per process: undo it as OpenTelemetry's own
        # test utilities do (opentelemetry.test.globals_test.reset_trace_globals), so the
        # tests after this one run untraced.
        trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
        trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]


def named(spans: Any, prefix: str) -> list[Any]:
    """The finished spans whose name starts with `prefix` ('send ', 'process ', ...)."""
    return [span for span in spans if span.name.startswith(prefix)]
