"""One table of cases, run against both runtimes (Fargate's `messenger consume` runtime and the
Lambda runtime), on the moto server: the same message gets the same verdict in each
(`messenger.consume.outcome` decides it once for both)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from messenger import Consumer, ConsumerSettings, ReceivedMessage
from messenger.aws import ClientFactory
from messenger.consume.failures import MAX_RETRY_DELAY_SECONDS, RetryPolicy
from messenger.consume.lambda_runtime import LambdaConsumerRuntime, LocalEventSource
from messenger.consume.lifecycle import LifecycleEvent
from messenger.message import DEAD_LETTER_REASON_ATTRIBUTE, META_HEADERS_ATTRIBUTE
from messenger.settings import Settings
from tests.integration.helpers import drain
from tests.integration.test_consumer_runtime import Running, producer_for, wait_until

REGION = "us-east-1"
#: The events that end a message's run here (its verdict).
VERDICT_EVENTS = ("completed", "duplicate_skipped", "retried", "dead_lettered",
                  "duplicate_in_progress", "dead_letter_failed", "retry_failed")


class FullDelays(RetryPolicy):
    """Each delay at the top of its jitter range: the table can name the exact delay."""

    def delay(self, attempt: int, draw: Callable[[], float] = lambda: 1.0) -> int:
        return super().delay(attempt, draw=lambda: 1.0)


class TableJobs(Consumer):
    """Handles {"n": ...}; {"fail": true} raises ValueError, {"interrupt": true} raises
    KeyboardInterrupt, {"exit": true} SystemExit. Retry delay 30 s, doubling."""

    channel = "outcome_table"
    max_receives = 5
    retry_delay = 30
    visibility_timeout = 30

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[LifecycleEvent] = []
        self.handled: list[Any] = []

    @property
    def retry_policy(self) -> RetryPolicy:
        base = super().retry_policy
        return FullDelays(base.max_receives, base.max_attempts, base.retry_delay,
                          base.retry_backoff, base.max_retry_delay)

    def on_event(self, event: LifecycleEvent) -> None:
        self.events.append(event)
        super().on_event(event)

    def handler(self, message: ReceivedMessage) -> None:
        self.handled.append(message.body)
        body = message.body if isinstance(message.body, dict) else {}
        if body.get("fail"):
            raise ValueError("cannot handle it")
        if body.get("interrupt"):
            raise KeyboardInterrupt
        if body.get("exit"):
            raise SystemExit(3)


class HalfDayJobs(TableJobs):
    """Retries wait 12 hours: more than SQS lets a message stay in flight since its receive."""

    retry_delay = MAX_RETRY_DELAY_SECONDS
    max_retry_delay = MAX_RETRY_DELAY_SECONDS


@dataclass(frozen=True)
class Case:
    """A message, and the verdict every runtime must give it."""

    body: Any = None
    raw_body: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    push: dict[str, Any] = field(default_factory=dict)
    #: Receives of the message before the runtime's (consumers that died mid-run).
    earlier_receives: int = 0
    consumer: type[TableJobs] = TableJobs
    tracing: str = "off"
    #: Seconds between the receive and the Lambda invocation (Lambda's batching window).
    batching_window: float = 0.0
    # the verdict
    event: str = "completed"
    reason: str | None = None
    delay: int | None = None
    delay_at_least: int | None = None
    failed_as: str | None = None
    handler_runs: int = 1


CASES = {
    "completed": Case(body={"n": 1}),
    "failed, retried after its backoff": Case(
        body={"fail": True}, event="retried", delay=30, failed_as="ValueError"),
    "second failure, twice the delay": Case(
        body={"fail": True}, earlier_receives=1, event="retried", delay=60,
        failed_as="ValueError"),
    "a retry delay over 12 hours is capped within SQS's 12 hours in flight": Case(
        body={"fail": True}, consumer=HalfDayJobs, event="retried", batching_window=2.0,
        delay_at_least=MAX_RETRY_DELAY_SECONDS - 60, failed_as="ValueError"),
    "last attempt failed: dead-lettered with its cause": Case(
        body={"fail": True}, push={"max_attempts": 1}, event="dead_lettered",
        reason="failed: attempts used up (1 of 1)", failed_as="ValueError"),
    "KeyboardInterrupt is that message's failure": Case(
        body={"interrupt": True}, event="retried", delay=30, failed_as="KeyboardInterrupt"),
    "SystemExit is that message's failure": Case(
        body={"exit": True}, event="retried", delay=30, failed_as="SystemExit"),
    "undecodable: dead-lettered at once": Case(
        raw_body="not json {", event="dead_lettered",
        reason="undecodable: message body is not JSON", handler_runs=0),
    "attempts used up by a consumer that stopped: dead-lettered, not run again": Case(
        body={"n": 2}, push={"max_attempts": 1}, earlier_receives=1, event="dead_lettered",
        reason=("attempts_exhausted: received 2 times, 1 attempt allowed (a consumer "
                "stopped during its last attempt)"),
        handler_runs=0),
    "a non-string traceparent never stops a traced consumer": Case(
        raw_body='{"n": 3}', tracing="on", event="dead_lettered",
        attributes={META_HEADERS_ATTRIBUTE: {"DataType": "String",
                                             "StringValue": '{"traceparent": 123}'}},
        reason="undecodable: message attributes are malformed", handler_runs=0),
}


class Harness:
    """Sends a case's message and runs one runtime on it until its verdict."""

    def __init__(self, settings: Settings, clients: ClientFactory, tmp_path: Any) -> None:
        self.settings, self.clients = settings, clients
        self.runtime_settings = ConsumerSettings(health_file=str(tmp_path / "health.json"),
                                                 shutdown_timeout=10)
        self.sqs = clients.client("sqs")
        self.stops: list[Running] = []

    def send(self, case: Case) -> tuple[str, str]:
        """The case's message in its queue, received `earlier_receives` times already."""
        spec = case.consumer.channel_spec(self.settings.namespace)
        producer = producer_for(self.settings, case.consumer.channel)
        producer.push({"warm": "up"})  # provisions the channel
        url = self.sqs.get_queue_url(QueueName=spec.queue_name)["QueueUrl"]
        dlq = self.sqs.get_queue_url(QueueName=spec.dlq_name)["QueueUrl"]
        drain(self.sqs, url)
        if case.raw_body is not None:
            self.sqs.send_message(QueueUrl=url, MessageBody=case.raw_body,
                                  MessageAttributes=case.attributes)
        else:
            producer.push(case.body, **case.push)
        for _ in range(case.earlier_receives):
            got = self.sqs.receive_message(QueueUrl=url, VisibilityTimeout=0,
                                           WaitTimeSeconds=5).get("Messages", [])
            assert len(got) == 1
        return url, dlq

    def consumer(self, case: Case) -> TableJobs:
        return case.consumer(settings=self.settings.with_changes(tracing=case.tracing),
                             clients=self.clients, runtime=self.runtime_settings)

    def fargate(self, case: Case) -> TableJobs:
        consumer = self.consumer(case)
        run = Running(consumer)
        self.stops.append(run)
        wait_until(lambda: [e for e in consumer.events if e.name in VERDICT_EVENTS], 20)
        run.stop()
        return consumer

    def lambda_(self, case: Case, url: str) -> TableJobs:
        consumer = self.consumer(case)
        runtime = LambdaConsumerRuntime(consumer)
        source = LocalEventSource(self.sqs, url, REGION)
        messages = source.receive(10, wait_seconds=5)
        assert len(messages) == 1
        time.sleep(case.batching_window)  # received now, invoked later (its 12 hours run)

        class Context:
            deadline = time.monotonic() + 30

            def get_remaining_time_in_millis(self) -> int:
                return int((self.deadline - time.monotonic()) * 1000)

        source.invoke(runtime.handle, messages, Context())
        return consumer


@pytest.fixture
def harness(settings: Settings, clients: ClientFactory, tmp_path: Any) -> Iterator[Harness]:
    made = Harness(settings, clients, tmp_path)
    yield made
    for run in made.stops:
        if run.thread.is_alive():
            run.consumer.request_shutdown()
            run.thread.join(20)


@pytest.mark.parametrize("runtime", ["fargate", "lambda"])
@pytest.mark.parametrize("name", list(CASES))
def test_both_runtimes_give_the_same_verdict(harness: Harness, runtime: str, name: str) -> None:
    case = CASES[name]
    # Given the case's message in the queue
    url, dlq = harness.send(case)
    # When the runtime gets it once
    consumer = harness.fargate(case) if runtime == "fargate" else harness.lambda_(case, url)
    # Then its verdict is the table's
    names = [e.name for e in consumer.events]
    assert "fatal" not in names, consumer.events
    [verdict] = [e for e in consumer.events if e.name in VERDICT_EVENTS]
    assert verdict.name == case.event, consumer.events
    assert len(consumer.handled) == case.handler_runs
    if case.reason is not None:
        assert str(verdict.fields["reason"]).startswith(case.reason)
        [dead] = drain(harness.sqs, dlq)
        attribute = dead["MessageAttributes"][DEAD_LETTER_REASON_ATTRIBUTE]["StringValue"]
        assert attribute.startswith(case.reason)
    if case.delay is not None:
        # (on a loaded machine the Fargate runtime may give a fetched message back unrun when
        # no worker took it within prefetch_wait; received again, it is one receive further on,
        # and the backoff, counted in receives, doubles once per such release)
        released = [e for e in consumer.events if e.name == "released"]
        assert verdict.fields["delay"] == case.delay * 2 ** len(released), consumer.events
    if case.delay_at_least is not None:
        # (capped: SQS refuses a visibility past 12 hours since the receive)
        assert case.delay_at_least <= verdict.fields["delay"] < MAX_RETRY_DELAY_SECONDS
        assert "retry_failed" not in names
    failed = [e for e in consumer.events if e.name == "failed"]
    assert [e.fields["error_class"] for e in failed] == \
        ([case.failed_as] if case.failed_as else [])
    if case.event == "retried":
        # And it is back in its queue, invisible for the delay
        attributes = harness.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
            "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
        assert attributes["ApproximateNumberOfMessagesNotVisible"] == "1"

