"""Job results end to end against the moto server: a keep_results consumer (the Fargate runtime
in a thread, the Lambda runtime on real SQS events, a real `messenger consume` process killed
with SIGKILL) writes each final outcome before the delete, and `Producer.result` reads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from messenger import (
    Consumer,
    JobFailed,
    MultiProducer,
    Producer,
    ReceivedMessage,
    Unrecoverable,
)
from messenger.aws import RequestCounter
from messenger.channel import ChannelSpec
from messenger.consume.lambda_runtime import LambdaConsumerRuntime, LocalEventSource
from messenger.consume.lifecycle import LifecycleEvent
from messenger.errors import InvalidChannelSpec, InvalidSettings
from messenger.jobs import fired
from messenger.jobs.controls import CancelRequests
from messenger.jobs.results import (
    INLINE_RESULT_BYTES,
    NOT_SERIALIZABLE,
    FinalOutcome,
    Outcome,
    ResultStore,
)
from messenger.jobs.status import StatusEvent, StatusStore
from messenger.provision import Provisioner
from tests.integration import result_apps, test_consumer_runtime
from tests.integration.lambdas.conftest import FakeContext
from tests.integration.test_consumer_runtime import wait_until

ROOT = Path(__file__).resolve().parents[2]
running = test_consumer_runtime.running
runtime = test_consumer_runtime.runtime
#: Bound of a wait for a job's outcome: a hang, not an expected duration (a busy machine).
WAIT = 60.0
#: The same for a consumer process (on a busy machine its start alone can take 20 s or more).
PROCESS_WAIT = 120.0


class Results(Consumer):
    """Keeps results. Body: {"n": n} → {"doubled": 2n}; {"raise": "unrecoverable"} raises
    Unrecoverable, {"raise": "value"} ValueError; {"big": n} returns n characters; {"set": 1}
    returns a set; {"wait": 1} waits until the test sets `release` (or is cancelled)."""

    channel = "results"
    track_status = True
    keep_results = True
    processing_timeout = 20

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[LifecycleEvent] = []
        self.runs: list[str] = []
        self.release = threading.Event()

    def on_event(self, event: LifecycleEvent) -> None:
        self.events.append(event)
        super().on_event(event)

    def named(self, name: str) -> list[LifecycleEvent]:
        return [event for event in self.events if event.name == name]

    def handler(self, message: ReceivedMessage) -> Any:
        self.runs.append(message.message_id)
        body = message.body
        if body.get("raise") == "unrecoverable":
            raise Unrecoverable(f"bad sku {body.get('sku')}")
        if body.get("raise") == "value":
            raise ValueError("no such sku")
        if "big" in body:
            return "x" * int(body["big"])
        if "set" in body:
            return {1, 2}
        if "wait" in body:
            while not self.release.wait(0.05):
                pass
            return "released"
        return {"doubled": 2 * int(body["n"])}


class QuickResults(Results):
    channel = "results_quick"
    processing_timeout = 1


class ResultsProducer(Producer):
    channel = "results"


@pytest.fixture
def producer(settings, clients) -> ResultsProducer:
    return ResultsProducer(settings=settings, clients=clients)


def start(running, cls: type[Consumer] = Results, **changes: Any) -> Any:
    run = running(cls, retry_delay=0, **changes)
    wait_until(lambda: run.consumer.state is not None
               and run.consumer.state.value in ("LISTENING", "IDLE", "PROCESSING"), WAIT)
    return run


# -- Producer.result on the Fargate runtime ---------------------------------------------------
@pytest.mark.timeout(120)
def test_result_returns_what_the_handler_returned(settings, clients, running, producer):
    # Given a consumer of a channel that keeps results
    run = start(running)
    counter = RequestCounter().attach(clients)
    # When jobs complete
    jobs = [str(job) for job in producer.push_many([{"n": n} for n in range(20)]).message_ids]
    # Then each result is the handler's return value (written before the delete, while the
    # status records are written off the hot path: the timeline has them once they are)
    assert [producer.result(job, timeout=WAIT) for job in jobs] == [
        {"doubled": 2 * n} for n in range(20)]
    run.stop()
    counter.detach(clients)
    # and a result costs one write per job (its UpdateItem; the records' BatchWriteItem aside)
    assert counter.counts["dynamodb.UpdateItem"] == 20
    timeline = StatusStore(run.consumer.clients, settings).timeline(jobs[0])
    assert timeline[-1].event is StatusEvent.COMPLETED


@pytest.mark.timeout(120)
def test_result_raises_job_failed_for_every_dead_letter_reason(settings, clients, running,
                                                               producer):
    run = start(running)
    unrecoverable = producer.push({"raise": "unrecoverable", "sku": "x1"})
    exhausted = producer.push({"raise": "value"}, max_attempts=1)
    # an undecodable body, sent past the producer (it carries a message id)
    assert run.consumer.resources is not None
    clients.client("sqs").send_message(
        QueueUrl=run.consumer.resources.queue.url, MessageBody="{not json",
        MessageAttributes={"message_id": {"DataType": "String", "StringValue": "poison-1"}})
    with pytest.raises(JobFailed) as failed:
        producer.result(unrecoverable, timeout=WAIT)
    assert (failed.value.outcome, failed.value.error_type, failed.value.error) == (
        "dead_lettered", "Unrecoverable", "bad sku x1")
    assert failed.value.reason == "unrecoverable: Unrecoverable: bad sku x1"
    with pytest.raises(JobFailed) as failed:
        producer.result(exhausted, timeout=WAIT)
    assert (failed.value.outcome, failed.value.error_type, failed.value.error) == (
        "dead_lettered", "ValueError", "no such sku")
    assert failed.value.reason == "failed: attempts used up (1 of 1)"
    with pytest.raises(JobFailed) as failed:
        producer.result("poison-1", timeout=WAIT)
    assert failed.value.outcome == "dead_lettered" and failed.value.error_type == ""
    assert failed.value.reason.startswith("undecodable: ")
    run.stop()


@pytest.mark.timeout(120)
def test_a_processing_timeout_is_a_failed_result(settings, clients, running):
    run = start(running, QuickResults)
    producer = type("P", (Producer,), {"channel": QuickResults.channel})(
        settings=settings, clients=clients)
    job = producer.push({"wait": 1})
    with pytest.raises(JobFailed) as failed:
        producer.result(job, timeout=WAIT)
    assert (failed.value.outcome, failed.value.error_type, failed.value.reason) == (
        "dead_lettered", "ProcessingTimeout", "processing_timeout: exceeded 1 s")
    run.consumer.release.set()
    run.stop()


@pytest.mark.timeout(120)
def test_cancelled_jobs_running_or_unrun_raise_job_failed(settings, clients, running, producer):
    run = start(running)
    # Given a job cancelled before any copy claimed it (its job id marked first)
    fired.cancel(clients, settings, "job-unrun", [Results.channel], "alice", time.time() + 60)
    producer.push({"n": 1}, message_id="job-unrun", dedup=True)
    with pytest.raises(JobFailed) as failed:
        producer.result("job-unrun", timeout=WAIT)
    assert failed.value.outcome == "cancelled"
    assert failed.value.reason == "cancelled by alice: deleted unrun"
    # And a running job an operator cancels
    job = producer.push({"wait": 1})
    wait_until(lambda: job in run.consumer.runs, WAIT)
    CancelRequests(clients, settings, Results.channel).request(job, "bob")
    with pytest.raises(JobFailed) as failed:
        producer.result(job, timeout=WAIT)
    assert (failed.value.outcome, failed.value.reason) == ("cancelled", "cancelled by bob")
    assert run.consumer.runs.count("job-unrun") == 0
    run.consumer.release.set()
    run.stop()


@pytest.mark.timeout(120)
def test_an_unfinished_job_times_out_and_reads_back_off(settings, clients, producer, running):
    # Given a channel that keeps results (a consumer made it) and a job nobody runs yet
    run = start(running)
    run.stop()
    job = producer.push({"n": 1})
    # Then timeout=0 reads once, and a longer timeout waits with backoff, never a tight loop
    with pytest.raises(TimeoutError, match=job):
        producer.result(job, timeout=0)
    clock = [0.0]
    waits = producer.result_waits
    waits.clock, waits.sleep, waits.draw = (lambda: clock[0]), \
        (lambda s: clock.__setitem__(0, clock[0] + s)), (lambda: 1.0)
    reads = waits.reads
    with pytest.raises(TimeoutError):
        producer.result(job, timeout=30)
    # reads at 0, 0.1, 0.3, 0.7, 1.5, 3.1 and 6.3 s (waits doubling from 0.1 s), then every
    # 5 s (the longest wait) to 26.3 s, and a last one at the timeout
    assert waits.reads - reads == 12
    assert clock[0] == pytest.approx(30.0)


@pytest.mark.timeout(120)
def test_a_result_larger_than_the_inline_limit_and_one_json_cannot_encode(settings, running,
                                                                          producer):
    run = start(running)
    big = producer.push({"big": INLINE_RESULT_BYTES + 1000})
    odd = producer.push({"set": 1})
    assert producer.result(big, timeout=WAIT) == "x" * (INLINE_RESULT_BYTES + 1000)
    # a value JSON cannot encode: the job completes, without a result, saying why
    assert producer.result(odd, timeout=WAIT) is None
    outcome = ResultStore(run.consumer.clients, settings).get(odd)
    assert outcome is not None and outcome.ok and outcome.error == f"{NOT_SERIALIZABLE}: set"
    run.stop()


@pytest.mark.timeout(120)
def test_a_failed_results_write_leaves_the_job_in_its_queue_and_runs_it_again(
        settings, clients, running, producer):
    # Given the first final-outcome write fails (DynamoDB refuses it)
    from botocore.exceptions import ClientError

    refused: list[str] = []

    def refuse_once(params: dict[str, Any], **_: Any) -> None:
        if params.get("Key", {}).get("sk", {}).get("S") == "~final" and not refused:
            refused.append(params["Key"]["message_id"]["S"])
            raise ClientError({"Error": {"Code": "ValidationException", "Message": "refused"}},
                              "UpdateItem")

    clients.register("provide-client-params.dynamodb.UpdateItem", refuse_once)
    try:
        run = start(running)
        job = producer.push({"n": 5})
        # Then the job is not deleted: it runs again after the backoff, and its result is kept
        assert producer.result(job, timeout=WAIT) == {"doubled": 10}
    finally:
        clients.unregister("provide-client-params.dynamodb.UpdateItem", refuse_once)
    assert refused == [job] and run.consumer.runs.count(job) == 2
    assert [e.fields["outcome"] for e in run.consumer.named("result_record_failed")] == [
        "completed"]
    assert not run.consumer.named("dead_lettered")
    run.stop()


@pytest.mark.timeout(120)
def test_the_consumer_hands_the_outcome_to_what_waits_on_the_job(settings, clients, running,
                                                                 producer):
    # Given something waits on a job before it runs
    store = ResultStore(clients, settings)
    store.ensure_table()
    assert store.add_waiter("job-w", "job#later", 3600) is None
    run = start(running)
    advanced: list[tuple[FinalOutcome, frozenset[str]]] = []
    assert run.consumer.results is not None
    run.consumer.results._advance = lambda outcome, waiters: advanced.append((outcome, waiters))
    # When it completes, the consumer advances the waiter with the outcome
    producer.push({"n": 2}, message_id="job-w")
    assert producer.result("job-w", timeout=WAIT) == {"doubled": 4}
    wait_until(lambda: advanced, WAIT)
    ((outcome, waiters),) = advanced
    assert outcome.outcome is Outcome.COMPLETED and outcome.result == {"doubled": 4}
    assert waiters == frozenset({"job#later"})
    run.stop()


# -- declarations ---------------------------------------------------------------------------
def test_result_refuses_a_channel_that_does_not_keep_results(settings, clients):
    Provisioner(clients, settings).ensure_channel(ChannelSpec(
        name="plain", namespace=settings.namespace, track_status=True))
    plain = type("Plain", (Producer,), {"channel": "plain"})(settings=settings, clients=clients)
    with pytest.raises(InvalidSettings, match="keep_results: channel 'plain' is deployed with "
                                              "keep_results=False"):
        plain.result("some-job", timeout=0)
    exchange = type("Ex", (MultiProducer,), {"channel": "events"})(settings=settings,
                                                                  clients=clients)
    with pytest.raises(InvalidSettings, match="keep_results: .* exchange 'events'"):
        exchange.result("some-job")


def test_keep_results_needs_track_status(settings, clients):
    untracked = type("Untracked", (Results,), {"track_status": False})
    with pytest.raises(InvalidChannelSpec, match="keep_results needs track_status=True"):
        untracked(settings=settings, clients=clients)


def test_a_consumer_disagreeing_with_the_deployed_keep_results_does_not_start(settings,
                                                                              clients):
    # Given the channel deployed without keep_results
    resources = Provisioner(clients, settings).ensure_channel(ChannelSpec(
        name=Results.channel, namespace=settings.namespace, track_status=True))
    consumer = Results(settings=settings.with_changes(provisioning="verify"), clients=clients)
    with pytest.raises(InvalidChannelSpec, match="Results.keep_results is True but channel "
                                                 "'results' is deployed with keep_results=False"):
        consumer.check_tracking(resources)


# -- the Lambda runtime -----------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_the_lambda_runtime_keeps_results_and_failures(settings, clients, producer, tmp_path):
    from messenger import ConsumerSettings

    consumer = Results(settings=settings, clients=clients, runtime=ConsumerSettings(
        health_file=str(tmp_path / "health.json")))
    lambda_runtime = LambdaConsumerRuntime(consumer)
    assert consumer.resources is not None
    source = LocalEventSource(clients.client("sqs"), consumer.resources.queue.url, "us-east-1")
    done = producer.push({"n": 4})
    failed = producer.push({"raise": "unrecoverable", "sku": "l1"})
    messages: list[dict[str, Any]] = []
    wait_until(lambda: messages.extend(source.receive(2 - len(messages))) or len(messages) == 2)
    response = source.invoke(lambda_runtime.handle, messages, FakeContext(30))
    assert response["batchItemFailures"] == []
    assert producer.result(done, timeout=0) == {"doubled": 8}
    with pytest.raises(JobFailed) as raised:
        producer.result(failed, timeout=0)
    assert raised.value.reason == "unrecoverable: Unrecoverable: bad sku l1"


# -- kill -9 after the handler, before the write -------------------------------------------------
def tail(log: Path) -> str:
    """The end of a consumer's log, for a failure's message."""
    return log.read_text()[-3000:] if log.exists() else f"(no {log.name})"


def listening(log: Path) -> bool:
    """Whether a consumer's JSON log says it reached LISTENING (whole lines only)."""
    text = log.read_text() if log.exists() else ""
    lines = text[:text.rfind("\n") + 1].splitlines()
    return any(json.loads(line).get("state") == "LISTENING" for line in lines
               if line.startswith("{"))


@pytest.mark.timeout(400)
def test_a_consumer_killed_after_its_handler_and_before_the_write_runs_the_job_again(
        settings, clients, tmp_path):
    # Given a real consumer process that dies (SIGKILL) as it is about to write an outcome
    ledger = tmp_path / "ledger"
    env = {**os.environ, **settings.as_env(), "RESULTS_LEDGER": str(ledger),
           "MESSENGER_HEALTH_FILE": str(tmp_path / "health.json"), "PYTHONUNBUFFERED": "1",
           "MESSENGER_SHUTDOWN_TIMEOUT": "10"}
    producer = type("P", (Producer,), {"channel": result_apps.CHANNEL})(settings=settings,
                                                                        clients=clients)
    target = f"{result_apps.__name__}:{result_apps.DoublingConsumer.__name__}"
    logs = []

    def consume(log: str, **extra: str) -> subprocess.Popen[bytes]:
        out = open(tmp_path / log, "w")  # noqa: SIM115 - closed below
        logs.append(out)
        return subprocess.Popen([sys.executable, "-m", "messenger", "consume", target],
                                cwd=ROOT, env={**env, **extra}, stdout=out,
                                stderr=subprocess.STDOUT)

    doomed = consume("doomed.log", RESULTS_KILL_BEFORE_FINISH="1")
    try:
        # (the consumer provisions the channel, tagged keep_results, before the first push: a
        # producer that made the queue first would have tagged it with its own spec's False)
        wait_until(lambda: listening(tmp_path / "doomed.log"), PROCESS_WAIT)
        job = producer.push({"n": 7})
        assert doomed.wait(timeout=PROCESS_WAIT) == -9, tail(tmp_path / "doomed.log")
        # Then the handler ran and nothing of its outcome was written
        assert ledger.read_text().split() == [job]
        store = ResultStore(clients, settings)
        assert store.get(job) is None
        # When another consumer starts, the message comes back after its lease: run again, kept
        survivor = consume("survivor.log")
        try:
            try:
                assert producer.result(job, timeout=PROCESS_WAIT) == {"doubled": 14}
            except TimeoutError:
                raise AssertionError(tail(tmp_path / "survivor.log")) from None
            assert ledger.read_text().split() == [job, job]
        finally:
            survivor.terminate()
            survivor.wait(timeout=30)
    finally:
        if doomed.poll() is None:
            doomed.kill()
        for out in logs:
            out.close()
    events = [json.loads(line) for line in (tmp_path / "survivor.log").read_text().splitlines()
              if line.startswith("{")]
    assert any(e.get("event") == "completed" and e.get("message_id") == job for e in events)
