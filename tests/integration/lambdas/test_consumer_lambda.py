"""The consumer Lambda (lambdas/consumer/handler.py) on real SQS events.

Each test receives messages from the local endpoint as Lambda's event source does, builds the
Lambda event from them (`sqs_event`: camelCase records, ApproximateReceiveCount, eventSourceARN,
awsRegion), invokes the provided handler with a context whose remaining time runs down, then does
what SQS does with the partial batch response (deletes every record not listed as a failure)
and checks what the queues hold afterwards.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from messenger import Consumer, ConsumerSettings, LifecycleHooks, ReceivedMessage, register_hook
from messenger.aws import ClientFactory
from messenger.channel import idempotency_table_name, workers_table_name
from messenger.consume.lambda_runtime import LocalEventSource, sqs_event, sqs_message
from messenger.consume.lifecycle import LifecycleEvent
from messenger.jobs.controls import CancelRequests
from messenger.jobs.status import StatusEvent, StatusStore
from messenger.jobs.tables import ensure_table
from messenger.message import DEAD_LETTER_FAILURE_ATTRIBUTE, DEAD_LETTER_REASON_ATTRIBUTE
from messenger.offload import OffloadPointer
from messenger.produce.producer import Producer
from messenger.settings import Settings
from tests.integration.helpers import drain

REGION = "us-east-1"
ROOT = Path(__file__).resolve().parents[3]
#: What each test's consumer did: (event name, message body or None), across invocations.
RECORD: list[tuple[str, Any]] = []


class FakeContext:
    """The LambdaContext the handler reads: the time left before the function times out."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.function_name = "messenger-consumer"
        self.aws_request_id = "local"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.deadline - time.monotonic()) * 1000))


class Jobs(Consumer):
    """Handles {"n": ...}; fails {"fail": true}; works {"sleep": s} seconds in Python code;
    blocks {"block": s} seconds in C code (no interruption can stop it)."""

    channel = "lambda_jobs"
    max_receives = 3

    def __init__(self) -> None:
        # A short retry delay (the Fargate default is 5 s), the test's own health file.
        super().__init__(runtime=ConsumerSettings(retry_delay=1,
                                                  health_file="/tmp/lambda-test-health.json"))

    def handler(self, message: ReceivedMessage) -> None:
        RECORD.append(("handler", message.body))
        until = time.monotonic() + message.body.get("sleep", 0)
        while time.monotonic() < until:
            time.sleep(0.01)
        time.sleep(message.body.get("block", 0))
        if message.body.get("fail"):
            raise ValueError(f"cannot handle {message.body}")
        RECORD.append(("done", message.body))

    def on_event(self, event: LifecycleEvent) -> None:
        RECORD.append((event.name, event.fields.get("reason")))
        super().on_event(event)

    @register_hook(LifecycleHooks.MSG_PROCESSING_START)
    def starting(self, message: ReceivedMessage) -> None:
        RECORD.append(("start_hook", message.body))

    @register_hook(LifecycleHooks.INITIALIZED)
    def ready(self) -> None:
        RECORD.append(("initialized_hook", None))


class TwoAttempts(Jobs):
    channel = "lambda_two_attempts"
    max_receives = 2


class Quick(Jobs):
    channel = "lambda_quick"
    processing_timeout = 1


class Ordered(Jobs):
    channel = "lambda_ordered"
    ordered = True


class IdempotentJobs(Jobs):
    channel = "lambda_idempotent"
    idempotency_key = staticmethod(lambda message: message.body.get("n"))


class Tracked(Jobs):
    channel = "lambda_tracked"
    track_status = True

    def __init__(self) -> None:
        super().__init__()
        assert self.status is not None
        # Nothing written in the background while the test looks: only the end of the
        # invocation can have written the records (a frozen Lambda runs no background thread).
        self.status.store.flush_interval = 3600


@pytest.fixture(autouse=True)
def root_logging() -> Iterator[None]:
    """The handler configures JSON logging on the root logger, as in Lambda: undone after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


class Lambda:
    """The consumer function of one consumer class, and the queue its event source polls."""

    def __init__(self, cls: type[Consumer], settings: Settings, clients: ClientFactory,
                 monkeypatch: pytest.MonkeyPatch) -> None:
        from lambdas.consumer import handler

        monkeypatch.setenv("MESSENGER_CONSUMER", f"{__name__}:{cls.__name__}")
        monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
        monkeypatch.setenv("MESSENGER_RETRY_BUDGET", "5")
        # As deployed (LambdaConsumer): the channel exists (here the producer made it)
        monkeypatch.setenv("MESSENGER_PROVISIONING", "verify")
        monkeypatch.setenv("MESSENGER_OFFLOAD_THRESHOLD", "2000")
        handler.runtime.cache_clear()
        self.module = handler
        self.cls = cls
        self.settings = settings
        self.sqs = clients.client("sqs")
        self.s3 = clients.client("s3")
        self.producer = type("P", (Producer,), {"channel": cls.channel, "ordered": cls.ordered})(
            settings=settings.with_changes(offload_threshold=2000))
        spec = cls.channel_spec(settings.namespace)
        self.producer.push({"warm": "up"}, group_id="warm" if cls.ordered else None)
        self.queue_url = self.sqs.get_queue_url(QueueName=spec.queue_name)["QueueUrl"]
        self.dlq_url = self.sqs.get_queue_url(QueueName=spec.dlq_name)["QueueUrl"]
        self.source = LocalEventSource(self.sqs, self.queue_url, REGION)
        self.queue_arn = self.source.queue_arn
        drain(self.sqs, self.queue_url)
        RECORD.clear()

    def receive_all(self, expected: int) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        deadline = time.monotonic() + 10
        while len(messages) < expected and time.monotonic() < deadline:
            messages.extend(self.source.receive(expected - len(messages)))
        assert len(messages) == expected, messages
        return messages

    def invoke(self, messages: list[dict[str, Any]], seconds: float = 30.0) -> dict[str, Any]:
        """Invoke the handler on `messages`, then apply the response as SQS does."""
        return dict(self.source.invoke(self.module.handler, messages, FakeContext(seconds)))

    def counts(self) -> tuple[int, int]:
        """(visible, in flight) in the queue."""
        attributes = self.sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
        ])["Attributes"]
        return (int(attributes["ApproximateNumberOfMessages"]),
                int(attributes["ApproximateNumberOfMessagesNotVisible"]))

    def dead_letters(self) -> list[dict[str, Any]]:
        return drain(self.sqs, self.dlq_url)


@pytest.fixture
def function(settings: Settings, clients: ClientFactory, monkeypatch: pytest.MonkeyPatch
             ) -> Callable[[type[Consumer]], Lambda]:
    return lambda cls: Lambda(cls, settings, clients, monkeypatch)


def failures(response: dict[str, Any]) -> list[str]:
    return [item["itemIdentifier"] for item in response["batchItemFailures"]]


def reason(message: dict[str, Any]) -> str:
    return str(message["MessageAttributes"][DEAD_LETTER_REASON_ATTRIBUTE]["StringValue"])


# -- the event shape ------------------------------------------------------------------------------
def test_a_lambda_record_reads_back_as_the_message_sqs_delivered() -> None:
    message = {
        "MessageId": "m1", "ReceiptHandle": "r1", "Body": '{"a": 1}', "MD5OfBody": "x",
        "Attributes": {"ApproximateReceiveCount": "2", "MessageGroupId": "g"},
        "MessageAttributes": {
            "routing_key": {"DataType": "String", "StringValue": "A.B"},
            "blob": {"DataType": "Binary", "BinaryValue": b"\x00\xff"},
        },
    }
    record = sqs_event([message], "arn:aws:sqs:us-east-1:123456789012:q", REGION)["Records"][0]
    # Lambda's shape: camelCase, base64 binaries, the source queue and region
    assert record["messageAttributes"]["blob"] == {
        "stringValue": None, "binaryValue": "AP8=", "stringListValues": [],
        "binaryListValues": [], "dataType": "Binary",
    }
    assert (record["eventSourceARN"], record["awsRegion"]) == (
        "arn:aws:sqs:us-east-1:123456789012:q", REGION)
    assert sqs_message(record) == message


# -- outcomes -------------------------------------------------------------------------------------
def test_handled_messages_are_deleted_by_the_response(function) -> None:
    fn = function(Jobs)
    fn.producer.push_many([{"n": n} for n in range(3)]).raise_for_failures()
    messages = fn.receive_all(3)
    response = fn.invoke(messages)
    assert failures(response) == []
    assert sorted(body["n"] for event, body in RECORD if event == "done") == [0, 1, 2]
    assert [body for event, body in RECORD if event == "start_hook"] == \
        [body for event, body in RECORD if event == "handler"]
    assert ("initialized_hook", None) in RECORD  # the cold start ran the state hooks
    assert fn.counts() == (0, 0)
    assert fn.dead_letters() == []


def test_an_idempotent_consumer_deletes_a_duplicate_without_running_the_handler(
    function,
) -> None:
    # Given an idempotent consumer Lambda keyed on n, which handled n=1 in one invocation
    fn = function(IdempotentJobs)
    # As deployed: the foundation stack made the table (the function runs in verify mode)
    ensure_table(ClientFactory(REGION), fn.settings, idempotency_table_name(fn.settings.namespace),
                 "idempotency", "id")
    fn.producer.push({"n": 1})
    assert failures(fn.invoke(fn.receive_all(1))) == []
    # When n=1 arrives again in the next invocation
    fn.producer.push({"n": 1})
    response = fn.invoke(fn.receive_all(1))
    # Then the handler did not run again and the duplicate is deleted by the response
    assert failures(response) == []
    assert [body for event, body in RECORD if event == "handler"] == [{"n": 1}]
    assert ("duplicate_skipped", None) in RECORD
    assert fn.counts() == (0, 0)


def test_a_failed_message_is_a_batch_item_failure_and_comes_back_after_retry_delay(
    function,
) -> None:
    fn = function(Jobs)
    fn.producer.push_many([{"n": 0}, {"fail": True}, {"n": 2}]).raise_for_failures()
    messages = fn.receive_all(3)
    failing = next(m for m in messages if "fail" in m["Body"])
    response = fn.invoke(messages)
    # Then only the failed message stays, and it is visible again after retry_delay (1 s),
    # long before the 60 s the event source's receive leased it for
    assert failures(response) == [failing["MessageId"]]
    assert ("retried", None) in RECORD
    again = fn.receive_all(1)
    assert again[0]["MessageId"] == failing["MessageId"]
    assert again[0]["Attributes"]["ApproximateReceiveCount"] == "2"
    assert fn.dead_letters() == []


def test_the_receive_that_uses_up_max_receives_dead_letters_with_the_error(function) -> None:
    fn = function(TwoAttempts)
    fn.producer.push({"fail": True, "id": 7})
    first = fn.invoke(fn.receive_all(1))
    assert len(failures(first)) == 1
    second = fn.invoke(fn.receive_all(1))
    # Then the consumer forwards it with the reason (SQS's redrive would give none) and it is
    # no batch item failure: finished, as far as Lambda is concerned
    assert failures(second) == []
    dead = fn.dead_letters()
    assert len(dead) == 1
    assert reason(dead[0]) == "failed: attempts used up (2 of 2)"
    note = json.loads(dead[0]["MessageAttributes"][DEAD_LETTER_FAILURE_ATTRIBUTE]["StringValue"])
    assert (note["error_type"], note["error_message"], note["attempts"]) == (
        "ValueError", "cannot handle {'fail': True, 'id': 7}", 2)
    assert "in handler" in note["traceback"]
    assert fn.counts() == (0, 0)


def test_a_job_pushed_with_max_attempts_1_is_dead_lettered_on_its_first_failure(function) -> None:
    # Given a channel that allows 3 receives, and a job that may run once
    fn = function(Jobs)
    fn.producer.push({"fail": True}, max_attempts=1)
    # When its one run fails
    response = fn.invoke(fn.receive_all(1))
    # Then it is in the DLQ at once, with its cause; nothing is left for another invocation
    assert failures(response) == []
    [dead] = fn.dead_letters()
    assert reason(dead) == "failed: attempts used up (1 of 1)"
    assert fn.counts() == (0, 0)


def test_undecodable_and_missing_payloads_are_dead_lettered_at_once(function) -> None:
    fn = function(Jobs)
    fn.sqs.send_message(QueueUrl=fn.queue_url, MessageBody="not json {")
    fn.producer.push({"blob": "x" * 3000})  # offloaded (threshold 2000)
    messages = fn.receive_all(2)
    offloaded = next(m for m in messages if m["Body"] != "not json {")
    pointer = OffloadPointer.parse(offloaded["Body"], offloaded["MessageAttributes"])
    assert pointer is not None
    fn.s3.delete_object(Bucket=pointer.bucket, Key=pointer.key)
    response = fn.invoke(messages)
    assert failures(response) == []
    reasons = sorted(reason(m) for m in fn.dead_letters())
    assert reasons[0].startswith("payload_missing: offloaded payload s3://")
    assert reasons[1].startswith("undecodable: message body is not JSON")
    assert not [event for event, _ in RECORD if event == "handler"]
    assert fn.counts() == (0, 0)


class JobBody(BaseModel):
    n: int


class TypedJobs(Jobs):
    channel = "lambda_typed"
    model = JobBody

    def handler(self, message: ReceivedMessage) -> None:
        RECORD.append(("handler", message.body))


def test_a_typed_consumer_gets_instances_and_dead_letters_invalid_bodies_at_once(function
                                                                                 ) -> None:
    fn = function(TypedJobs)
    fn.sqs.send_message(QueueUrl=fn.queue_url, MessageBody='{"n": 7}')
    fn.sqs.send_message(QueueUrl=fn.queue_url, MessageBody='{"n": "seven"}')
    response = fn.invoke(fn.receive_all(2))
    assert failures(response) == []
    assert [body for event, body in RECORD if event == "handler"] == [JobBody(n=7)]
    (dead,) = fn.dead_letters()
    assert reason(dead).startswith("invalid: n: Input should be a valid integer")
    assert fn.counts() == (0, 0)


def test_an_offloaded_body_is_read_from_s3(function) -> None:
    fn = function(Jobs)
    big = {"n": 1, "blob": "x" * 3000}
    fn.producer.push(big)
    messages = fn.receive_all(1)
    assert OffloadPointer.parse(messages[0]["Body"], messages[0]["MessageAttributes"])
    assert failures(fn.invoke(messages)) == []
    assert ("done", big) in RECORD


@pytest.mark.parametrize("work", ["sleep", "block"])
def test_a_handler_past_processing_timeout_is_dead_lettered_and_the_batch_goes_on(
    function, work: str,
) -> None:
    fn = function(Quick)
    fn.invoke([])  # the cold start (the channel is resolved) is not what is timed
    fn.producer.push_many([{work: 5}, {"n": 1}]).raise_for_failures()
    messages = fn.receive_all(2)
    began = time.monotonic()
    response = fn.invoke(messages)
    # Then after 1 s (plus 1 s for a handler blocked in C code to give up on it) the message is
    # in the DLQ and the next one runs, on a new handler thread if the first is stuck: the
    # invocation did not wait out the 5 s handler (the margin is for a loaded machine)
    assert time.monotonic() - began < 4.5
    assert failures(response) == []
    assert [reason(m) for m in fn.dead_letters()] == ["processing_timeout: exceeded 1 s"]
    assert ("done", {work: 5}) not in RECORD and ("done", {"n": 1}) in RECORD
    assert (("stuck", None) in RECORD) == (work == "block")


@pytest.mark.timeout(60)
def test_an_ordered_channel_keeps_a_group_behind_its_failed_message(function) -> None:
    fn = function(Ordered)
    for body, group in (({"id": "a1", "fail": True}, "a"), ({"id": "b1"}, "b"),
                        ({"id": "a2"}, "a"), ({"id": "b2"}, "b"), ({"id": "a3"}, "a")):
        fn.producer.push(body, group_id=group)
    messages = fn.receive_all(5)
    by_body = {m["Body"]: m["MessageId"] for m in messages}
    response = fn.invoke(messages)
    # Then a1 failed, a2 and a3 never ran (released), group b went on
    handled = [body["id"] for event, body in RECORD if event == "handler"]
    assert handled == ["a1", "b1", "b2"]
    assert sorted(failures(response)) == sorted(
        by_body[b] for b in by_body if '"a' in b)
    assert [r for e, r in RECORD if e == "released"] == ["group_blocked", "group_blocked"]
    # And the group comes back in order once a1 is visible again
    RECORD.clear()
    again = fn.receive_all(3)
    assert [m["Body"] for m in again] == [
        '{"id":"a1","fail":true}', '{"id":"a2"}', '{"id":"a3"}']
    assert fn.dead_letters() == []


@pytest.mark.timeout(60)
def test_no_message_starts_once_the_invocation_runs_out_of_time(function) -> None:
    fn = function(Jobs)
    fn.invoke([])
    fn.producer.push_many([{"sleep": 1.0, "n": n} for n in range(5)]).raise_for_failures()
    messages = fn.receive_all(5)
    # When the function has 5.5 s left, 3 of which are kept for finishing (FINISH_SECONDS)
    began = time.monotonic()
    response = fn.invoke(messages, seconds=5.5)
    took = time.monotonic() - began
    done = [body["n"] for event, body in RECORD if event == "done"]
    handled = [body["n"] for event, body in RECORD if event == "handler"]
    # Then two messages finish, the third is interrupted at 2.5 s, two never start
    assert len(done) == 2 and len(handled) == 3, RECORD
    assert len([e for e, _ in RECORD if e == "started"]) == 3
    assert took < 3.5
    assert len(failures(response)) == 3
    assert [r for e, r in RECORD if e == "released"] == ["out_of_time"] * 3
    # And those three are back in the queue at once, not after the 60 s lease
    back = fn.receive_all(3)
    assert sorted(m["MessageId"] for m in back) == sorted(failures(response))
    assert fn.dead_letters() == []


def test_status_records_are_written_before_the_invocation_returns(function, settings,
                                                                  clients) -> None:
    StatusStore(clients, settings).ensure_table()
    fn = function(Tracked)
    ok = fn.producer.push({"n": 1})
    failing = fn.producer.push({"fail": True})
    fn.invoke(fn.receive_all(2))
    store = StatusStore(clients, settings)
    assert [r.event for r in store.timeline(ok)] == [
        StatusEvent.RECEIVED, StatusEvent.STARTED, StatusEvent.COMPLETED]
    assert [r.event for r in store.timeline(failing)] == [
        StatusEvent.RECEIVED, StatusEvent.STARTED, StatusEvent.FAILED, StatusEvent.RETRIED]


@pytest.mark.timeout(60)
def test_an_operators_cancel_stops_a_running_handler_and_dead_letters_it(
    function, settings: Settings, clients: ClientFactory,
) -> None:
    # Given a deployed namespace (status and worker registry tables) and a warm function that
    # reads cancel requests every second while a message runs
    StatusStore(clients, settings).ensure_table()
    ensure_table(clients, settings, workers_table_name(settings.namespace), "worker registry",
                 "channel", "worker_id")
    fn = function(Tracked)
    fn.invoke([])
    fn.module.runtime().cancel_interval = 1.0
    job = fn.producer.push({"sleep": 30})
    messages = fn.receive_all(1)
    done: dict[str, Any] = {}
    began = time.monotonic()
    invocation = threading.Thread(target=lambda: done.update(fn.invoke(messages, seconds=60)))
    invocation.start()
    # When an operator cancels the job once its handler runs (the dashboard's and CLI's call)
    deadline = time.monotonic() + 10
    while ("handler", {"sleep": 30}) not in RECORD and time.monotonic() < deadline:
        time.sleep(0.05)
    requests = CancelRequests(clients, settings, Tracked.channel)
    requests.request(job, "alice@example.com")
    invocation.join(20)
    # Then the handler is stopped within about a check interval, never runs to its end, and
    # the message is dead-lettered with who cancelled it (a success: Lambda deletes it)
    assert not invocation.is_alive()
    assert time.monotonic() - began < 10
    assert ("done", {"sleep": 30}) not in RECORD
    assert failures(done) == []
    assert [reason(m) for m in fn.dead_letters()] == ["cancelled by alice@example.com"]
    assert fn.counts() == (0, 0)
    # And the job's timeline ends CANCELLED by the operator; the request is gone
    timeline = StatusStore(clients, settings).timeline(job)
    assert [r.event for r in timeline][-2:] == [StatusEvent.CANCELLED,
                                                StatusEvent.DEAD_LETTERED]
    assert timeline[-2].actor == "alice@example.com"
    assert requests.pending() == {}


def test_a_record_of_another_queue_is_a_batch_item_failure(function) -> None:
    fn = function(Jobs)
    fn.producer.push({"n": 1})
    messages = fn.receive_all(1)
    event = sqs_event(messages, "arn:aws:sqs:us-east-1:123456789012:someone-else", REGION)
    response = fn.module.handler(event, FakeContext(30))
    assert failures(response) == [messages[0]["MessageId"]]
    assert ("unknown_source", None) in RECORD
    assert not [e for e, _ in RECORD if e == "handler"]


def test_a_missing_channel_fails_the_invocation_with_its_name(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, endpoint: str,
) -> None:
    from lambdas.consumer import handler
    from messenger.errors import ChannelNotFound

    monkeypatch.setenv("MESSENGER_CONSUMER", f"{__name__}:Jobs")
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    monkeypatch.setenv("MESSENGER_PROVISIONING", "verify")
    handler.runtime.cache_clear()
    with pytest.raises(ChannelNotFound, match="lambda_jobs"):
        handler.handler({"Records": []}, FakeContext(30))


def test_the_example_consumer_runs_locally_through_the_function(settings: Settings,
                                                                 clients: ClientFactory) -> None:
    # Given receipts on the example channel the CDK app consumes in Lambda
    from examples.wishlist import ReceiptsConsumer

    producer = type("P", (Producer,), {"channel": ReceiptsConsumer.channel})(settings=settings)
    producer.push_many([{"order": n} for n in range(3)]).raise_for_failures()
    # When `examples.invoke_lambda consumer` plays the event source once
    env = {**os.environ, "MESSENGER_NAMESPACE": settings.namespace,
           "POWERTOOLS_TRACE_DISABLED": "true"}
    result = subprocess.run(
        [sys.executable, "-m", "examples.invoke_lambda", "consumer",
         "examples.wishlist:ReceiptsConsumer"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    # Then the batch was handled and deleted
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"received": 3, "response": {"batchItemFailures": []}}
    assert '"event": "completed"' in result.stderr
    sqs = clients.client("sqs")
    url = sqs.get_queue_url(QueueName=ReceiptsConsumer.channel_spec(settings.namespace)
                            .queue_name)["QueueUrl"]
    assert drain(sqs, url) == []


def test_the_consumer_function_continues_the_producers_trace(function) -> None:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, StatusCode

    from tests.otel import in_memory_spans, named

    fn = function(TwoAttempts)
    with in_memory_spans() as exported:
        # Given a message pushed inside a span, offloaded to S3, that fails its first run
        with trace.get_tracer("test").start_as_current_span("upload") as upload:
            fn.producer.push({"fail": True, "blob": "x" * 3000})
        # When the function gets it twice (the second receive uses up its attempts)
        assert len(failures(fn.invoke(fn.receive_all(1)))) == 1
        assert failures(fn.invoke(fn.receive_all(1))) == []
        spans = exported.get_finished_spans()
    # Then both runs are process spans in the producer's trace, children of its send span
    (send,) = named(spans, "send ")
    runs = named(spans, "process ")
    assert len(runs) == 2
    for run in runs:
        assert run.kind is SpanKind.CONSUMER
        assert run.context.trace_id == upload.get_span_context().trace_id
        assert run.parent.span_id == send.context.span_id
        assert run.status.status_code is StatusCode.ERROR
        assert run.attributes["error.type"] == "ValueError"
        assert run.attributes["messaging.destination.name"] == fn.queue_url.rsplit("/", 1)[1]
    assert sorted(r.attributes["messenger.receive_count"] for r in runs) == [1, 2]
    assert len(fn.dead_letters()) == 1


def test_a_body_dead_lettered_before_the_handler_ends_the_producers_trace(function) -> None:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, StatusCode

    from tests.otel import in_memory_spans, named

    fn = function(TypedJobs)
    with in_memory_spans() as exported:
        # Given a traced push of a body the consumer's model refuses (a producer without it)
        with trace.get_tracer("test").start_as_current_span("upload") as upload:
            fn.producer.push({"n": "seven"})
        # When the function gets it (dead-lettered at once, no handler run)
        assert failures(fn.invoke(fn.receive_all(1))) == []
        spans = exported.get_finished_spans()
    # Then the trace ends in a failed process span, child of the send, naming the reason
    (send,) = named(spans, "send ")
    (process,) = named(spans, "process ")
    assert process.kind is SpanKind.CONSUMER
    assert process.context.trace_id == upload.get_span_context().trace_id
    assert process.parent.span_id == send.context.span_id
    assert process.status.status_code is StatusCode.ERROR
    assert process.attributes["error.type"] == "invalid"
    assert [body for event, body in RECORD if event == "handler"] == []
    assert len(fn.dead_letters()) == 1
