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
