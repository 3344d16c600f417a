"""One job id, one run (`messenger.jobs.fired`), on both runtimes against the moto server: a job
that carries an id (a dedup push, an HTTP Idempotency-Key's, a firing) runs its handler once
even when SQS holds two copies of it; a plain job costs its consumer no DynamoDB call; a
dead-lettered copy gives its claim back so that a requeue runs; a handler that returns past its
deadline (a controlled clock) is a timeout, not a completion. And the claims' own guards: one
copy never releases another's claim (fired.py), a failed send never releases a newer
producer's dedup claim (dedup.py)."""

from __future__ import annotations

import json
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse

from messenger import ConsumerSettings, Producer, ReceivedMessage
from messenger.aws import ClientFactory
from messenger.channel import dedup_table_name, schedule_group_name
from messenger.consume.lambda_runtime import LambdaConsumerRuntime, LocalEventSource
from messenger.consume.runtime import Runtime
from messenger.jobs.dedup import Claim, DedupStore
from messenger.jobs.fired import JOB_WINDOW_HEADER, FiredElsewhere, JobClaims
from messenger.jobs.schedules import schedule_name
from messenger.message import sendable_attributes
from messenger.operations.requeue import Requeuer
from messenger.settings import Settings
from messenger.tools.scheduler_fire import invoke_target, local_clients
from tests.faults import aws_response, injected
from tests.integration.helpers import drain, queue_url
from tests.integration.test_consumer_runtime import (  # noqa: F401 - fixtures
    Recording,
    Running,
    runtime,
    wait_until,
)

REGION = "us-east-1"


class AppliedThen500:
    """botocore `before-send` hook (on 'before-send.sqs.SendMessage'): the first `times`
    requests are sent to the endpoint for real, unchanged (SQS applies them), and then answered
    with SQS's 500 InternalError instead of SQS's answer, so botocore's retry sends them again:
    the issue's item 6, a send SQS applied that the client saw fail."""

    def __init__(self, times: int = 1) -> None:
        self.left, self.applied = times, 0

    def __call__(self, request: Any, **_: Any) -> AWSResponse | None:
        if self.left <= 0:
            return None
        self.left -= 1
        headers = {name: value.decode() if isinstance(value, bytes) else value
                   for name, value in request.headers.items()}
        body = request.body if isinstance(request.body, bytes) else str(request.body).encode()
        sent = urllib.request.Request(request.url, data=body, headers=headers,
                                      method=request.method)
        with urllib.request.urlopen(sent, timeout=30) as answer:  # noqa: S310 - the endpoint
            answer.read()
            assert answer.status == 200
        self.applied += 1
        payload = (b'{"__type":"com.amazonaws.sqs#InternalError","message":"We encountered an '
                   b'internal error. Please try again."}')
        return aws_response(request.url, 500, {
            "Content-Type": "application/x-amz-json-1.0",
            "x-amzn-query-error": "InternalError;Receiver"}, payload)


class TableRequests:
    """botocore `before-send` hook on DynamoDB: counts the requests naming one table, per
    operation."""

    def __init__(self, table: str) -> None:
        self.table, self.counts = table, Counter[str]()

    def __call__(self, request: Any, event_name: str = "", **_: Any) -> None:
        body = request.body if isinstance(request.body, bytes) else str(request.body).encode()
        if json.loads(body or b"{}").get("TableName") == self.table:
            self.counts[event_name.split(".")[2]] += 1


class Context:
    """A Lambda context with 30 s left."""

    def __init__(self) -> None:
        self.deadline = time.monotonic() + 30

    def get_remaining_time_in_millis(self) -> int:
        return int((self.deadline - time.monotonic()) * 1000)


class IdJobs(Producer):
    channel = "job_ids"
    dedup = True


class PlainJobs(Producer):
    channel = "job_ids"


class IdConsumer(Recording):
    channel = "job_ids"


def consume(consumer: Recording, sqs: Any, url: str, kind: str, done: Callable[[], Any],
            expected: int, clock: Callable[[], float] | None = None) -> None:
    """Run `consumer` on the queue until `done()`: Fargate (its runtime in a thread) or Lambda
    (the queue's `expected` messages in one invocation, as an event source mapping hands
    them). clock: the Lambda runtime's outcome policy's (Fargate: the consumer's
    `runtime_class` sets it)."""
    if kind == "fargate":
        run = Running(consumer)
        try:
            wait_until(done, 30)
        finally:
            run.stop()
        return
    source = LocalEventSource(sqs, url, REGION)
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + 20
    while len(messages) < expected and time.monotonic() < deadline:
        messages += source.receive(10, wait_seconds=1)
    assert len(messages) == expected
    made = LambdaConsumerRuntime(consumer)
    if clock is not None:
        made.outcomes.clock = clock
    source.invoke(made.handle, messages, Context())
    assert done()


def visible(sqs: Any, url: str) -> int:
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(
        attributes["ApproximateNumberOfMessagesNotVisible"])


@pytest.mark.parametrize("kind", ["fargate", "lambda"])
def test_a_send_sqs_applied_but_answered_500_runs_its_job_once(
        settings: Settings, clients: ClientFactory, runtime: ConsumerSettings,  # noqa: F811
        kind: str) -> None:
    # Given a dedup producer whose SendMessage SQS applies but answers with a 500, so that
    # botocore's retry sends the job a second time (a real producer, a real retry)
    producer = IdJobs(settings=settings, clients=clients)
    fault = AppliedThen500()
    with injected(clients, "before-send.sqs.SendMessage", fault):
        job_id = str(producer.push({"n": 1}, message_id="order-1"))
    sqs = clients.client("sqs")
    url = queue_url(sqs, f"{settings.namespace}-job_ids")
    # (the fault did make two copies: SQS holds two messages of the one job id)
    assert fault.applied == 1 and visible(sqs, url) == 2

    # When its consumer receives both copies
    consumer = IdConsumer(settings=settings, clients=clients, runtime=runtime)
    consume(consumer, sqs, url, kind, lambda: consumer.named("completed") and
            consumer.named("duplicate_job"), expected=2)

    # Then the handler ran once; the other copy was deleted unrun, naming the copy that ran
    assert [m.message_id for m in consumer.handled] == [job_id]
    assert consumer.handled[0].meta_headers[JOB_WINDOW_HEADER] == str(IdJobs.dedup_window)
    (repeat,) = consumer.named("duplicate_job")
    assert repeat.message_id == job_id and repeat.fields["claimed_by"]
    assert len(consumer.named("completed")) == 1
    wait_until(lambda: visible(sqs, url) == 0, 15)


@pytest.mark.parametrize("kind", ["fargate", "lambda"])
def test_a_plain_job_costs_its_consumer_no_dynamodb_call_a_job_id_one_write(
        settings: Settings, clients: ClientFactory, runtime: ConsumerSettings,  # noqa: F811
        kind: str) -> None:
    # Given three plain jobs and three jobs with an id in one queue
    plain = PlainJobs(settings=settings, clients=clients).push_many([{"n": n} for n in range(3)])
    with_id = IdJobs(settings=settings, clients=clients)
    ids = [str(with_id.push({"n": n}, message_id=f"job-{n}")) for n in range(3)]
    sqs = clients.client("sqs")
    url = queue_url(sqs, f"{settings.namespace}-job_ids")

    # When a consumer runs them all, its requests to the dedup table counted
    counter = TableRequests(dedup_table_name(settings.namespace))
    consumer_clients = ClientFactory(REGION)
    consumer_clients.register("before-send.dynamodb", counter)
    consumer = IdConsumer(settings=settings, clients=consumer_clients, runtime=runtime)
    consume(consumer, consumer_clients.client("sqs"), url, kind,
            lambda: len(consumer.named("completed")) == 6, expected=6)

    # Then each ran once, and the consumer wrote one claim per job with an id, none for the
    # plain ones (and read the table's description once: the check made at its first claim)
    assert sorted(m.message_id for m in consumer.handled) == sorted(
        [*plain.message_ids, *ids])
    assert counter.counts == {"PutItem": 3, "DescribeTable": 1}


class FiredJobsProducer(Producer):
    channel = "fired_jobs"


class FailingOnce(Recording):
    """Fails its first run of each job, then succeeds."""

    channel = "fired_jobs"

    def handler(self, message: ReceivedMessage) -> None:
        super().handler(message)
        if sum(m.message_id == message.message_id for m in self.handled) == 1:
            raise ValueError("first run fails")


def test_a_dead_lettered_fired_job_gives_its_claim_back_so_its_requeue_runs(
        settings: Settings, clients: ClientFactory, endpoint: str,
        runtime: ConsumerSettings) -> None:  # noqa: F811
    # Given a fired job with one attempt whose handler fails: it is dead-lettered
    job_id = FiredJobsProducer(settings=settings, clients=clients).push(
        {"n": 1}, delay=timedelta(hours=1), max_attempts=1)
    schedule = clients.client("scheduler").get_schedule(
        Name=schedule_name("fired_jobs", job_id),
        GroupName=schedule_group_name(settings.namespace))
    invoke_target(local_clients(endpoint), schedule["Target"], schedule["Arn"],
                  datetime.now(UTC))
    sqs = clients.client("sqs")
    url = queue_url(sqs, f"{settings.namespace}-fired_jobs")
    dlq = queue_url(sqs, f"{settings.namespace}-fired_jobs-dlq")
    consumer = FailingOnce(settings=settings, clients=clients, runtime=runtime)
    consume(consumer, sqs, url, "lambda", lambda: consumer.named("dead_lettered"), expected=1)

    # When an operator requeues it (a new SQS message of the same job, as `messenger requeue`
    # sends it back)
    (letter,) = drain(sqs, dlq)
    attributes = {name: value for name, value in
                  sendable_attributes(letter["MessageAttributes"]).items()
                  if not name.startswith("dead_letter")}
    sqs.send_message(QueueUrl=url, MessageBody=letter["Body"], MessageAttributes=attributes)
    consume(consumer, sqs, url, "lambda", lambda: consumer.named("completed"), expected=1)

    # Then the requeued copy ran (the dead-lettered copy had given its claim back): not
    # deleted unrun as a repeat of the first
    assert [m.message_id for m in consumer.handled] == [job_id, job_id]
    assert consumer.named("duplicate_firing") == []


class ClockedRuntime(Runtime):
    """The Fargate runtime whose outcome policy reads deadlines on the test's clock."""

    clock: Callable[[], float] = time.monotonic

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outcomes.clock = type(self).clock


class Shifted:
    """A monotonic clock a handler moves on: the real one plus `shift` seconds."""

    def __init__(self) -> None:
        self.shift = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.shift


@pytest.mark.parametrize("kind", ["fargate", "lambda"])
def test_a_handler_returning_just_past_its_deadline_timed_out_not_completed(
        settings: Settings, clients: ClientFactory, runtime: ConsumerSettings,  # noqa: F811
        kind: str) -> None:
    clock = Shifted()

    class LateJobs(IdConsumer):
        """Its handler returns 1 ms past its processing timeout, on the policy's clock."""

        processing_timeout = 20
        runtime_class = type("Clocked", (ClockedRuntime,), {"clock": clock})

        def handler(self, message: ReceivedMessage) -> None:
            super().handler(message)
            clock.shift = self.processing_timeout + 0.001

    # Given a job whose handler returns 1 ms past its deadline
    PlainJobs(settings=settings, clients=clients).push({"n": 1}, max_attempts=1)
    sqs = clients.client("sqs")
    url = queue_url(sqs, f"{settings.namespace}-job_ids")
    consumer = LateJobs(settings=settings, clients=clients, runtime=runtime)
    # When it runs
    consume(consumer, sqs, url, kind, lambda: consumer.named("dead_lettered"), expected=1,
            clock=clock)

    # Then it timed out: not completed, dead-lettered with the timeout's reason
    assert len(consumer.handled) == 1
    assert consumer.named("completed") == []
    assert consumer.named("timed_out")
    (dead,) = consumer.named("dead_lettered")
    assert dead.fields["reason"] == "processing_timeout: exceeded 20 s"


def test_one_copy_never_releases_another_copys_claim(settings: Settings,
                                                     clients: ClientFactory) -> None:
    # Given a job claimed by copy A
    claims = JobClaims(clients, settings, "job_ids")
    assert claims.claim("job-7", "copy-a", 300) is None
    # When copy B (a repeat, dead-lettered) gives "its" claim back
    claims.release("job-7", "copy-b")
    # Then A's claim stands: a third copy is still a repeat of A
    other = claims.claim("job-7", "copy-c", 300)
    assert isinstance(other, FiredElsewhere) and other.sqs_message_id == "copy-a"
    # And A's own release frees it
    claims.release("job-7", "copy-a")
    assert claims.claim("job-7", "copy-c", 300) is None


def test_a_failed_sends_release_never_deletes_a_newer_producers_claim(
        settings: Settings, clients: ClientFactory) -> None:
    # Given producer 1's claim, whose lease passes while its send is still failing
    first = DedupStore(clients, settings, lease_seconds=0.05)
    mine = first.claim("job_ids", "order-9", 300)
    assert isinstance(mine, Claim)
    lease_over = mine.claimed_at + first.lease_seconds
    wait_until(lambda: time.time() > lease_over, 5)
    # And producer 2, after the lease, takes the id over
    second = DedupStore(clients, settings)
    newer = second.claim("job_ids", "order-9", 300)
    assert isinstance(newer, Claim) and newer.token != mine.token

    # When producer 1's send fails and it gives its claim back
    first.release(mine)

    # Then producer 2's claim is still there, its own
    item = clients.client("dynamodb").get_item(
        TableName=second.table, Key={"dedup_key": {"S": newer.key}},
        ConsistentRead=True).get("Item")
    assert item is not None and item["token"]["S"] == newer.token


def test_a_job_sqs_moved_to_its_dlq_after_its_consumer_died_runs_when_requeued(
        settings: Settings, clients: ClientFactory, runtime: ConsumerSettings) -> None:  # noqa: F811
    # Given a job with an id whose consumer claimed it and died during each of its attempts
    # (received 3 times, never deleted: SQS's redrive moves it to the DLQ at the 4th receive,
    # keeping its SQS message id; no consumer gave its claim back)
    IdJobs(settings=settings, clients=clients).push({"n": 5}, message_id="order-5")
    sqs = clients.client("sqs")
    url = queue_url(sqs, f"{settings.namespace}-job_ids")
    claims = JobClaims(clients, settings, "job_ids")
    for _ in range(3):
        (copy,) = wait_until(lambda: sqs.receive_message(
            QueueUrl=url, VisibilityTimeout=0, WaitTimeSeconds=1).get("Messages"), 15)
        assert claims.claim("order-5", copy["MessageId"], 300) is None
    dlq = queue_url(sqs, f"{settings.namespace}-job_ids-dlq")
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages", []) == []
    wait_until(lambda: visible(sqs, dlq) == 1, 15)

    # When an operator requeues it
    report = Requeuer(source_queue="job_ids-dlq", destination_channel="job_ids",
                      settings=settings, clients=clients).start()
    assert (report.moved, report.failed) == (1, 0)

    # Then its consumer runs it: the requeue gave the dead copy's claim back first
    consumer = IdConsumer(settings=settings, clients=clients, runtime=runtime)
    consume(consumer, sqs, url, "lambda", lambda: consumer.named("completed"), expected=1)
    assert [m.message_id for m in consumer.handled] == ["order-5"]
    assert consumer.named("duplicate_job") == []
