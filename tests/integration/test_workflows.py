"""Dependencies and groups end to end against the moto server: consumers of channels that keep
results (the Fargate runtime in a thread) run the members and dependencies; every final outcome
advances a group and a dependent; a job on one channel waits on jobs of another."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from pydantic import BaseModel

from messenger import Consumer, JobFailed, Producer, ReceivedMessage, Unrecoverable
from messenger.errors import InvalidMessage, InvalidSettings
from messenger.jobs.controls import CancelRequests
from messenger.jobs.results import FinalOutcome, Outcome, ResultStore
from messenger.jobs.status import StatusEvent, StatusStore
from messenger.jobs.workflows import State, Workflows
from messenger.produce.push import PushItem
from tests.integration import test_consumer_runtime
from tests.integration.lambdas.conftest import FakeContext
from tests.integration.test_consumer_runtime import wait_until

running = test_consumer_runtime.running
runtime = test_consumer_runtime.runtime
#: Bound of a wait for a job: a hang, not an expected duration (a busy machine).
WAIT = 60.0


class Steps(Consumer):
    """Keeps results. Body {"n": n} → {"doubled": 2n}; {"raise": "value"} raises ValueError,
    {"raise": "unrecoverable"} Unrecoverable; {"wait": 1} waits until the test sets `release`
    (past the 2 s processing timeout, or until cancelled). Each run is kept in `runs`."""

    channel = "steps"
    track_status = True
    keep_results = True
    processing_timeout = 2

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runs: list[ReceivedMessage] = []
        self.release = threading.Event()

    def handler(self, message: ReceivedMessage) -> Any:
        self.runs.append(message)
        body = message.body
        if body.get("raise") == "unrecoverable":
            raise Unrecoverable("bad sku")
        if body.get("raise") == "value":
            raise ValueError("no such sku")
        if "wait" in body:
            while not self.release.wait(0.05):
                pass
            return "released"
        if "report" in body:
            return sorted(message.dependencies)
        return {"doubled": 2 * int(body["n"])}

    def run_of(self, job_id: str) -> ReceivedMessage | None:
        return next((m for m in self.runs if m.message_id == job_id), None)


class Patient(Steps):
    """The same channel with a long processing timeout (a cancel comes first)."""

    processing_timeout = 30


class Reports(Steps):
    channel = "reports"


def start(running, cls: type[Consumer] = Steps) -> Any:
    run = running(cls, retry_delay=0)
    wait_until(lambda: run.consumer.state is not None
               and run.consumer.state.value in ("LISTENING", "IDLE", "PROCESSING"), WAIT)
    return run


def producer_of(settings, clients, channel: str) -> Producer:
    return type(f"To_{channel}", (Producer,), {"channel": channel})(settings=settings,
                                                                     clients=clients)


# Each final outcome a member and a dependency can reach, as the member's PushItem.
OUTCOMES = {
    "completed": PushItem({"n": 1}),
    "attempts_used_up": PushItem({"raise": "value"}, max_attempts=1),
    "processing_timeout": PushItem({"wait": 1}),
    "unrecoverable": PushItem({"raise": "unrecoverable"}),
    "cancelled_running": PushItem({"wait": 1}),
    "deleted_by_an_operator": None,  # never run: an operator deletes it from the DLQ
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", sorted(OUTCOMES))
def test_each_final_outcome_advances_a_group_and_a_dependent(how, settings, clients, running):
    # Given a consumer of a channel that keeps results
    cls = Patient if how == "cancelled_running" else Steps
    run = start(running, cls)
    consumer: Steps = run.consumer
    producer = producer_of(settings, clients, Steps.channel)
    item = OUTCOMES[how] or PushItem({"n": 0})
    if how == "deleted_by_an_operator":
        run.stop()  # nothing runs the member: it sits until the operator deletes it
    # And a group whose first member reaches the outcome, with a callback
    group = producer.group([item, PushItem({"n": 2})], then=PushItem({"report": 1}))
    member = group.member_ids[0]
    # And two jobs waiting on that member: one runs anyway, one is cancelled by a failure
    runs_anyway = producer.push({"report": 1}, depends_on=[member], on_dependency_failure="run")
    cancels = producer.push({"n": 3}, depends_on=[member])
    # When the member reaches its outcome
    if how == "cancelled_running":
        wait_until(lambda: consumer.run_of(member), WAIT)
        CancelRequests(clients, settings, Steps.channel).request(member, "bob")
    if how == "deleted_by_an_operator":
        Workflows(clients, settings).settle(FinalOutcome(
            member, Steps.channel, Outcome.DELETED, time.time(), reason="deleted by carol"),
            3600)
        run = start(running, cls)
        consumer = run.consumer
    # Then the group's callback runs once, with every member's result or failure
    callback = wait_until(lambda: consumer.run_of(group.then_id), WAIT)
    deps = callback.dependencies
    assert sorted(deps) == sorted(group.member_ids)
    assert deps[group.member_ids[1]] == {"doubled": 4}
    expected = {"completed": "completed", "attempts_used_up": "dead_lettered",
                "processing_timeout": "dead_lettered", "unrecoverable": "dead_lettered",
                "cancelled_running": "cancelled", "deleted_by_an_operator": "deleted"}[how]
    if expected == "completed":
        assert deps[member] == {"doubled": 2}
    else:
        assert isinstance(deps[member], JobFailed) and deps[member].outcome == expected
    # And the dependent that runs anyway runs with the same outcome
    dependent = wait_until(lambda: consumer.run_of(runs_anyway), WAIT)
    assert type(dependent.dependencies[member]) is type(deps[member])
    # And the other runs only when the member completed; else it is cancelled naming it
    results = ResultStore(clients, settings)
    outcome = wait_until(lambda: results.get(cancels), WAIT)
    if expected == "completed":
        assert outcome.ok and outcome.result == {"doubled": 6}
    else:
        assert outcome.outcome is Outcome.CANCELLED and f"dependency {member}" in outcome.reason
        assert consumer.run_of(cancels) is None
    progress = Workflows(clients, settings).group(group.group_id)
    assert progress.state is State.RELEASED and progress.finished == 2
    assert [m.message_id for m in consumer.runs].count(group.then_id) == 1
    consumer.release.set()
    run.stop()


@pytest.mark.timeout(120)
def test_an_undecodable_dependency_advances_its_dependent(settings, clients, running):
    run = start(running)
    producer = producer_of(settings, clients, Steps.channel)
    # Given a job waiting on a message whose body is not JSON (sent past the producer)
    waiting = producer.push({"report": 1}, depends_on=["poison-1"], on_dependency_failure="run")
    clients.client("sqs").send_message(
        QueueUrl=run.consumer.resources.queue.url, MessageBody="{not json",
        MessageAttributes={"message_id": {"DataType": "String", "StringValue": "poison-1"}})
    # Then the waiting job runs with the dead letter's failure
    dependent = wait_until(lambda: run.consumer.run_of(waiting), WAIT)
    failure = dependent.dependencies["poison-1"]
    assert isinstance(failure, JobFailed) and failure.outcome == "dead_lettered"
    assert failure.reason.startswith("undecodable")
    run.stop()


@pytest.mark.timeout(120)
def test_depends_on_jobs_of_another_channel(settings, clients, running):
    # Given consumers of two channels that keep results
    steps, reports = start(running), start(running, Reports)
    fetch = producer_of(settings, clients, Steps.channel)
    report = producer_of(settings, clients, Reports.channel)
    # When a report waits on two fetches of the other channel
    first, second = fetch.push({"n": 5}), fetch.push({"n": 6})
    job = report.push({"report": 1}, depends_on=[first, second])
    # Then it runs on its own channel after both, with their results
    ran = wait_until(lambda: reports.consumer.run_of(job), WAIT)
    assert ran.dependencies == {first: {"doubled": 10}, second: {"doubled": 12}}
    assert report.result(job, timeout=WAIT) == sorted([first, second])
    assert steps.consumer.run_of(job) is None
    flows = Workflows(clients, settings)
    assert [d.job_id for d in flows.dependents_of(first)] == [job]
    assert flows.dependencies_of(job).state is State.RELEASED
    # And its timeline starts when it was released (QUEUED, written by its releaser)
    events = wait_until(lambda: [r.event for r in StatusStore(clients, settings).timeline(job)
                                 if r.event is StatusEvent.QUEUED], WAIT)
    assert events == [StatusEvent.QUEUED]
    # And a job pushed to wait on jobs already final is sent at once
    again = report.push({"report": 1}, depends_on=[first])
    assert wait_until(lambda: reports.consumer.run_of(again), WAIT).dependencies == {
        first: {"doubled": 10}}
    steps.stop()
    reports.stop()


@pytest.mark.timeout(120)
def test_a_held_job_id_pushed_twice_is_a_duplicate_and_bad_arguments_name_their_field(
        settings, clients, running):
    run = start(running)
    producer = producer_of(settings, clients, Steps.channel)
    first = producer.push({"n": 1}, depends_on=["later"], message_id="held-1")
    again = producer.push({"n": 1}, depends_on=["later"], message_id="held-1")
    assert not first.duplicate and again.duplicate
    for kwargs, field in (({"depends_on": []}, "depends_on"),
                          ({"depends_on": "a"}, "depends_on"),
                          ({"depends_on": ["a b"]}, "depends_on"),
                          ({"depends_on": ["a"], "on_dependency_failure": "skip"},
                           "on_dependency_failure"),
                          ({"depends_on": ["a"], "delay": 5}, "depends_on")):
        with pytest.raises(InvalidMessage, match=field):
            producer.push({"n": 1}, **kwargs)
    with pytest.raises(InvalidMessage, match="items"):
        producer.group([])
    run.stop()


@pytest.mark.timeout(120)
def test_a_group_needs_a_channel_that_keeps_results(settings, clients):
    plain = producer_of(settings, clients, "plain")
    plain.push({"n": 1})  # the channel exists, without keep_results
    with pytest.raises(InvalidSettings, match="keep_results"):
        plain.group([{"n": 1}], then={"n": 2})


@pytest.mark.timeout(120)
def test_the_lambda_runtime_advances_a_dependent(settings, clients, tmp_path):
    from messenger import ConsumerSettings
    from messenger.consume.lambda_runtime import LambdaConsumerRuntime, LocalEventSource

    consumer = Steps(settings=settings, clients=clients, runtime=ConsumerSettings(
        health_file=str(tmp_path / "health.json")))
    lambda_runtime = LambdaConsumerRuntime(consumer)
    assert consumer.resources is not None
    source = LocalEventSource(clients.client("sqs"), consumer.resources.queue.url, "us-east-1")
    producer = producer_of(settings, clients, Steps.channel)
    # Given a job waiting on another, and an invocation that runs the other
    first = producer.push({"n": 8})
    waiting = producer.push({"report": 1}, depends_on=[first])
    batch = wait_until(lambda: source.receive(1), WAIT)
    assert source.invoke(lambda_runtime.handle, batch, FakeContext(30)) == {
        "batchItemFailures": []}
    # Then the waiting job is in the queue, and the next invocation runs it with the result
    batch = wait_until(lambda: source.receive(1), WAIT)
    source.invoke(lambda_runtime.handle, batch, FakeContext(30))
    ran = consumer.run_of(waiting)
    assert ran is not None and ran.dependencies == {first: {"doubled": 16}}
    assert producer.result(waiting, timeout=0) == [first]


class Order(BaseModel):
    n: int


class TypedSteps(Consumer):
    """A channel whose bodies must be an Order: any other is poison (dead-lettered unread)."""

    channel = "typed_steps"
    track_status = True
    keep_results = True
    model = Order

    def handler(self, message: ReceivedMessage) -> Any:
        return {"doubled": 2 * message.body.n}


@pytest.mark.timeout(180)
def test_a_poison_member_advances_its_group_and_a_dependent(settings, clients, running):
    # Given a channel that reads Orders, and the callback's channel
    typed, steps = start(running, TypedSteps), start(running)
    members = producer_of(settings, clients, TypedSteps.channel)
    reports = producer_of(settings, clients, Steps.channel)
    # When a group's first member is not an Order (sent past the model: a bare producer)
    group = members.group([{"n": "not a number"}, {"n": 2}], then={"report": 1},
                          then_to=reports)
    member = group.member_ids[0]
    waiting = reports.push({"report": 1}, depends_on=[member], on_dependency_failure="run")
    # Then the callback and the dependent run on their channel with its failure
    for job in (group.then_id, waiting):
        ran = wait_until(lambda job=job: steps.consumer.run_of(job), WAIT)
        failure = ran.dependencies[member]
        assert isinstance(failure, JobFailed) and failure.outcome == "dead_lettered"
        assert "invalid" in failure.reason
    assert wait_until(lambda: steps.consumer.run_of(group.then_id)).dependencies[
        group.member_ids[1]] == {"doubled": 4}
    typed.stop()
    steps.stop()


def test_a_held_job_expires_after_its_queues_retention(settings, clients):
    from messenger.channel import ChannelSpec
    from messenger.jobs.workflows import SWEEP_GRACE_SECONDS
    from messenger.provision import Provisioner

    # Given a channel whose queue keeps messages an hour, and a job waiting on one never run
    Provisioner(clients, settings).ensure_channel(ChannelSpec(
        name="short", namespace=settings.namespace, track_status=True, keep_results=True,
        retention_seconds=3600))
    ResultStore(clients, settings).ensure_table()
    short = producer_of(settings, clients, "short")
    job = short.push({"n": 1}, depends_on=["never-pushed"])
    flows = Workflows(clients, settings)
    # When the sweeper comes by within the retention, it waits; after it, the job expires
    assert flows.sweep(time.time() + SWEEP_GRACE_SECONDS + 1).expired == 0
    assert flows.sweep(time.time() + 3601).expired == 1
    outcome = ResultStore(clients, settings).get(job)
    assert outcome.outcome is Outcome.EXPIRED
    assert outcome.reason == ("dependencies never-pushed did not finish within the channel's "
                              "retention (3600 s)")


def test_a_held_job_on_an_exchange_is_published_to_its_queues(settings, clients):
    from messenger import MultiProducer
    from messenger.channel import ChannelSpec
    from messenger.provision import Provisioner
    from tests.integration.helpers import decode, drain

    # Given an exchange with one consumer queue, and a job published there once 'a' is final
    queue = Provisioner(clients, settings).ensure_channel(
        ChannelSpec("held_events.audit", namespace=settings.namespace)).queue
    ResultStore(clients, settings).ensure_table()
    events = type("Events", (MultiProducer,), {"channel": "held_events"})(
        settings=settings, clients=clients)
    job = events.push({"event": 1}, routing_key="audit.x", depends_on=["a"])
    assert drain(clients.client("sqs"), queue.url) == []
    # When 'a' completes
    Workflows(clients, settings).settle(FinalOutcome.completed("a", "work", 7), 3600)
    # Then the exchange's queue receives the job, its routing key and dependencies with it
    [raw] = wait_until(lambda: drain(clients.client("sqs"), queue.url), WAIT)
    message = decode(raw)
    assert (message.message_id, message.routing_key, message.body) == (
        job, "audit.x", {"event": 1})
    assert message.dependencies == {"a": 7}


def test_a_held_job_too_large_for_its_item_waits_in_the_offload_bucket(settings, clients):
    from messenger.channel import ChannelSpec
    from messenger.jobs.workflows import HELD_INLINE_BYTES
    from messenger.provision import Provisioner
    from tests.integration.helpers import decode, drain

    queue = Provisioner(clients, settings).ensure_channel(ChannelSpec(
        name="big_held", namespace=settings.namespace, track_status=True,
        keep_results=True)).queue
    ResultStore(clients, settings).ensure_table()
    producer = producer_of(settings, clients, "big_held")
    # Given a body larger than a workflows item holds (but inline on SQS)
    body = {"rows": "r" * (HELD_INLINE_BYTES + 10_000)}
    job = producer.push(body, depends_on=["a"])
    Workflows(clients, settings).settle(FinalOutcome.completed("a", "work", 1), 3600)
    # Then it is sent as a pointer to its body, which reads back whole
    [raw] = wait_until(lambda: drain(clients.client("sqs"), queue.url), WAIT)
    assert len(raw["Body"]) < 1000
    message = decode(raw, clients.client("s3"))
    assert (message.message_id, message.body, message.dependencies) == (job, body, {"a": 1})
