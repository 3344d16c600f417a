"""W3C trace context on messages, with OpenTelemetry when a process uses it (optional).

A message carries its creation context as the W3C `traceparent` (and `tracestate`) headers,
written with OpenTelemetry's own propagator (`opentelemetry.propagate.inject`) into the
message's `meta_headers` attribute: the envelope may already use all 10 message attributes
SQS takes (`messenger.message`), so the context shares that slot instead of adding an 11th.
It rides through SNS (raw delivery), offloading (the attributes stay on the pointer), a
consumer's dead-letter copy and `messenger requeue` unchanged.

Spans follow OpenTelemetry's messaging semantic conventions:
- `push`: one `send <destination>` span (PRODUCER); its context is the message's.
- `push_many`: a `create <destination>` span (PRODUCER) per message, whose context the
  message carries, and a `send <destination>` span (CLIENT) per batch request, linked to
  the messages' create spans (a batch holds messages of many traces).
- a consumer (Fargate or Lambda): a `process <queue>` span (CONSUMER) per message around its
  handler, the child of the message's creation context and linked to it (the conventions ask
  for the link; the parent puts producer and handler in one trace), ended when the handler
  returns, raises or is interrupted at its timeout (error status, `error.type`).
- `messenger requeue` (and `dlq requeue`): a `send <queue>` span (PRODUCER) per batch, linked
  to each message's context; the messages keep their creation context, so each is processed
  again in its original trace.

When it is on (`Settings.tracing`, MESSENGER_TRACING):
- 'auto' (default): when the process has imported `opentelemetry.trace` already and set a
  tracer provider (an SDK's, not the API's default proxy). A process that never imported
  OpenTelemetry pays a dictionary lookup per push and per message; nothing is imported.
- 'on': always (imports opentelemetry-api; without a provider the context is only passed on).
- 'off': never.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from messenger.errors import InvalidSettings
from messenger.message import META_HEADERS_ATTRIBUTE, EncodedMessage

#: `messaging.system` values of the conventions.
SQS_SYSTEM = "aws_sqs"
SNS_SYSTEM = "aws.sns"
INSTRUMENTATION_NAME = "messenger"


class _Otel:
    """The OpenTelemetry API modules, imported once tracing is on."""

    def __init__(self) -> None:
        self.trace = importlib.import_module("opentelemetry.trace")
        self.propagate = importlib.import_module("opentelemetry.propagate")
        self.context = importlib.import_module("opentelemetry.context")
        self._last: tuple[Any, Any] = (None, None)  # (provider, its tracer)

    def tracer(self) -> Any:
        """messenger's tracer of the current global provider."""
        provider = self.trace.get_tracer_provider()
        last, tracer = self._last
        if provider is not last:
            tracer = provider.get_tracer(INSTRUMENTATION_NAME)
            self._last = (provider, tracer)
        return tracer


_otel: _Otel | None = None


def otel(mode: str) -> _Otel | None:
    """The OpenTelemetry API when tracing is on in `mode` (see the module doc), else None."""
    global _otel
    if mode == "off":
        return None
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        if mode != "on":
            return None
        try:
            importlib.import_module("opentelemetry.trace")
        except ImportError:
            raise InvalidSettings(
                "tracing (MESSENGER_TRACING) is 'on' but opentelemetry-api is not installed: "
                "pip install 'messenger[tracing]'") from None
    elif mode == "auto":
        provider = trace.get_tracer_provider()
        if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
            return None
    if _otel is None:
        _otel = _Otel()
    return _otel


def with_headers(encoded: EncodedMessage, headers: Mapping[str, str]) -> EncodedMessage:
    """`encoded` with `headers` added to its meta headers (replacing ones of the same name)."""
    if not headers:
        return encoded
    current = encoded.attributes.get(META_HEADERS_ATTRIBUTE)
    merged = json.loads(current["StringValue"]) if current else {}
    merged.update(headers)
    attributes = {**encoded.attributes, META_HEADERS_ATTRIBUTE: {
        "DataType": "String", "StringValue": json.dumps(merged, sort_keys=True)}}
    return EncodedMessage(encoded.body, attributes)


def received_headers(raw: Mapping[str, Any]) -> dict[str, str]:
    """The string meta headers of a received SQS message ({} when absent or unreadable; a
    header whose value is not a string is left out: a message without a readable context is
    processed in a new trace, whatever a sender wrote there)."""
    entry = raw.get("MessageAttributes", {}).get(META_HEADERS_ATTRIBUTE)
    if not entry:
        return {}
    try:
        headers = json.loads(entry.get("StringValue", ""))
    except (ValueError, TypeError, RecursionError):
        return {}
    if not isinstance(headers, dict):
        return {}
    return {name: value for name, value in headers.items() if isinstance(value, str)}


def _creation_context(api: _Otel, raw: Mapping[str, Any]) -> Any:
    """The context a received message was created in; None (a new trace) when its headers
    hold none the propagator can read. Never raises: anyone who can send to a queue writes
    these headers."""
    try:
        return api.propagate.extract(received_headers(raw))
    except Exception:
        return None


def current_headers(mode: str) -> dict[str, str]:
    """The W3C headers of the current context ({} when tracing is off or nothing is current):
    to hand a context to another process (a Spark executor)."""
    api = otel(mode)
    carrier: dict[str, str] = {}
    if api is not None:
        api.propagate.inject(carrier)
    return carrier


def _messaging(system: str, destination: str, operation: str, kind: str,
               **more: Any) -> dict[str, Any]:
    attributes = {"messaging.system": system, "messaging.destination.name": destination,
                  "messaging.operation.name": operation, "messaging.operation.type": kind}
    attributes.update({k.replace("__", "."): v for k, v in more.items() if v is not None})
    return attributes


def _failed(span: Any, api: _Otel, error: BaseException | str) -> None:
    """Mark `span` failed: by an exception (its type), or by a reason `kind: details` (its
    kind; a low-cardinality `error.type`, the whole reason in the status)."""
    kind = error.split(":", 1)[0] if isinstance(error, str) else type(error).__name__
    if isinstance(error, BaseException):
        span.record_exception(error)
    span.set_attribute("error.type", kind)
    span.set_status(api.trace.Status(api.trace.StatusCode.ERROR, f"{kind}: {error}"[:200]))


class ProducerTrace:
    """The spans of one `push` or `push_many`, and the context each message carries.

    parent: W3C headers of the context the spans belong to when no span is current (a Spark
    executor's pushes: the driver's context); without OpenTelemetry (`api` None) those headers
    are what each message carries."""

    def __init__(self, api: _Otel | None, system: str, destination: str, batch: bool,
                 parent: Mapping[str, str] | None = None) -> None:
        self.api = api
        self.system = system
        self.destination = destination
        self.batch = batch
        self.parent_headers = dict(parent or {})
        self.parent = None
        if api is not None and self.parent_headers and \
                not api.trace.get_current_span().get_span_context().is_valid:
            self.parent = api.propagate.extract(self.parent_headers)
        #: push_many: each item's create-span context, by index (the batch spans link to them).
        self.created: dict[int, Any] = {}

    @classmethod
    def of(cls, mode: str, system: str, destination: str, batch: bool,
           parent: Mapping[str, str] | None = None) -> ProducerTrace | None:
        """The trace of a push, or None when there is nothing to do (off, no parent given)."""
        api = otel(mode)
        if api is None and not parent:
            return None
        return cls(api, system, destination, batch, parent)

    @contextmanager
    def sending(self, count: int) -> Iterator[Any]:
        """The `send` span of one push or of one batch request (`batch_sent` links it to its
        messages' create spans), current while it runs; an exception out of it is recorded.
        Yields None without OpenTelemetry."""
        if self.api is None:
            yield None
            return
        kind = self.api.trace.SpanKind
        with self.api.tracer().start_as_current_span(
                f"send {self.destination}", context=self.parent,
                kind=kind.CLIENT if self.batch else kind.PRODUCER,
                attributes=_messaging(self.system, self.destination, "send", "send",
                                      messaging__batch__message_count=count if self.batch
                                      else None),
                record_exception=False, set_status_on_exception=False) as span:
            try:
                yield span
            except BaseException as error:
                _failed(span, self.api, error)
                raise

    def stamp(self, index: int, message_id: str, encoded: EncodedMessage) -> EncodedMessage:
        """`encoded` carrying its creation context: the current send span's (push), a new
        create span's (push_many), or the parent headers without OpenTelemetry."""
        api = self.api
        if api is None:
            return with_headers(encoded, self.parent_headers)
        carrier: dict[str, str] = {}
        if not self.batch:
            api.trace.get_current_span().set_attribute("messenger.message_id", message_id)
            api.propagate.inject(carrier)
            return with_headers(encoded, carrier)
        span = api.tracer().start_span(
            f"create {self.destination}", context=self.parent,
            kind=api.trace.SpanKind.PRODUCER,
            attributes=_messaging(self.system, self.destination, "create", "create",
                                  messenger__message_id=message_id))
        api.propagate.inject(carrier, context=api.trace.set_span_in_context(span))
        span.end()
        self.created[index] = span.get_span_context()
        return with_headers(encoded, carrier)

    def batch_sent(self, indexes: Sequence[int], failed: int) -> None:
        """The current batch request went out: link its span to the create spans of its
        messages (`indexes`); `failed` entries (not sent in the end) make it an error."""
        api = self.api
        if api is None:
            return
        span = api.trace.get_current_span()
        for index in indexes:
            created = self.created.pop(index, None)
            if created is not None:
                span.add_link(created)
        if failed:
            _failed(span, api, f"{failed} of {len(indexes)} entries failed")

    def sent(self, messaging_id: str) -> None:
        """The single push went out: its message id as SQS or SNS gave it."""
        if self.api is not None:
            self.api.trace.get_current_span().set_attribute("messaging.message.id", messaging_id)


class ProcessTrace:
    """A consumer's `process` span around one message's handler, current on the handler's
    thread while it runs (spans the handler makes, pushes included, are its children)."""

    def __init__(self, api: _Otel, span: Any, token: Any) -> None:
        self.api = api
        self.span = span
        self.token = token

    @classmethod
    def start(cls, mode: str, raw: Mapping[str, Any], queue_url: str,
              message_id: str) -> ProcessTrace | None:
        """Start the span of `raw` (an SQS message from the queue at `queue_url`); None when
        tracing is off (then nothing else is worked out: this runs for every message)."""
        api = otel(mode)
        if api is None:
            return None
        queue = queue_url.rsplit("/", 1)[-1]
        creation = _creation_context(api, raw)
        producer = api.trace.get_current_span(creation).get_span_context() \
            if creation is not None else api.trace.INVALID_SPAN_CONTEXT
        system = raw.get("Attributes", {})
        span = api.tracer().start_span(
            f"process {queue}", context=creation, kind=api.trace.SpanKind.CONSUMER,
            links=[api.trace.Link(producer)] if producer.is_valid else None,
            attributes=_messaging(
                SQS_SYSTEM, queue, "process", "process",
                messaging__message__id=str(raw.get("MessageId", "")),
                messenger__message_id=message_id,
                messaging__message__body__size=len(str(raw.get("Body", "")).encode()),
                messenger__receive_count=int(system.get("ApproximateReceiveCount", "1")),
                messenger__group_id=system.get("MessageGroupId")))
        token = api.context.attach(api.trace.set_span_in_context(span))
        return cls(api, span, token)

    @classmethod
    def unprocessable(cls, mode: str, raw: Mapping[str, Any], queue_url: str, message_id: str,
                      reason: str) -> None:
        """The `process` span of a message dead-lettered before any handler ran (an unreadable
        or invalid body, a missing payload): started and ended at once, an error whose
        `error.type` is the reason's kind (`undecodable`, `payload_missing`, `invalid`), so the
        producer's trace shows where its message ended."""
        trace = cls.start(mode, raw, queue_url, message_id)
        if trace is not None:
            trace.end(reason, timed_out=False)

    def end(self, error: BaseException | str | None, timed_out: bool) -> None:
        """The handler returned (`error`: what it raised), was interrupted (`timed_out`), or
        never ran (`error`: the dead-letter reason, `kind: details`)."""
        try:
            if timed_out:
                _failed(self.span, self.api, "processing_timeout")
            elif error is not None:
                _failed(self.span, self.api, error)
        finally:
            self.api.context.detach(self.token)
            self.span.end()


@contextmanager
def requeue_span(mode: str, system: str, destination: str,
                 messages: Sequence[Mapping[str, Any]]) -> Iterator[None]:
    """The `send` span of one requeue batch, linked to each message's creation context (the
    messages keep it: their processing stays in their original traces)."""
    api = otel(mode)
    if api is None:
        yield
        return
    links = []
    for raw in messages:
        creation = _creation_context(api, raw)
        if creation is None:
            continue
        found = api.trace.get_current_span(creation).get_span_context()
        if found.is_valid:
            links.append(api.trace.Link(found))
    with api.tracer().start_as_current_span(
            f"send {destination}", kind=api.trace.SpanKind.PRODUCER, links=links,
            attributes=_messaging(system, destination, "send", "send",
                                  messaging__batch__message_count=len(messages),
                                  messenger__operation="requeue")):
        yield
