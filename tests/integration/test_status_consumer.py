"""Message status by id, consumer side, against the moto server: one timeline from the producer's
QUEUED to the consumer's last event; a dead status store loses nothing; the log is the same
whether tracking is on or off."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from messenger import Consumer, Producer, ReceivedMessage
from messenger.aws import ClientFactory
from messenger.jobs.status import StatusEvent, StatusStore
from tests.integration import test_consumer_runtime
from tests.integration.test_consumer_runtime import wait_until

E = StatusEvent

# The consumer-runtime tests' fixtures: `running(cls, **ConsumerSettings changes)`.
running = test_consumer_runtime.running
runtime = test_consumer_runtime.runtime


class TrackedProducer(Producer):
    channel = "tracked"
    track_status = True


class Tracked(Consumer):
    channel = "tracked"
    track_status = True
    processing_timeout = 1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.done: list[str] = []
        self.attempts: dict[str, int] = {}

    def handler(self, message: ReceivedMessage) -> None:
        kind = message.body["kind"]
        self.attempts[kind] = self.attempts.get(kind, 0) + 1
        if kind == "flaky" and self.attempts[kind] == 1:
            raise ValueError("not yet")
        if kind == "slow":
            end = time.monotonic() + 10
            while time.monotonic() < end:
                pass  # pure Python: the timeout interrupts it
        self.done.append(kind)


@pytest.mark.timeout(60)
def test_timelines_run_from_queued_to_the_last_consumer_event(settings, clients, running):
    # The table exists first (the CDK stack's, in the cloud): moto's CreateTable is not atomic, so
    # the producer's and the consumer's concurrent creations could replace each other's table.
    StatusStore(clients, settings).ensure_table()
    producer = TrackedProducer(settings=settings, clients=clients)
    ids = {kind: producer.push({"kind": kind}) for kind in ("ok", "flaky", "slow")}
    run = running(Tracked, concurrency=3, retry_delay=1)
    wait_until(lambda: sorted(run.consumer.done) == ["flaky", "ok"], timeout=20)
    # ok: 3 events, flaky: 7, slow: 4 (it times out after 1 s)
    wait_until(lambda: run.consumer.status.store.stats.recorded == 14, timeout=10)
    run.stop()  # closes (flushes) the consumer's status store
    assert producer.status is not None
    producer.status.close()
    store = StatusStore(clients, settings)
    timelines = {kind: store.timeline(message_id) for kind, message_id in ids.items()}
    events = {kind: [r.event for r in records] for kind, records in timelines.items()}
    assert events["ok"] == [E.QUEUED, E.RECEIVED, E.STARTED, E.COMPLETED]
    assert events["flaky"] == [E.QUEUED, E.RECEIVED, E.STARTED, E.FAILED, E.RETRIED,
                               E.RECEIVED, E.STARTED, E.COMPLETED]
    assert events["slow"] == [E.QUEUED, E.RECEIVED, E.STARTED, E.TIMED_OUT, E.DEAD_LETTERED]
    consumer_id = run.consumer.status.consumer_id
    flaky = timelines["flaky"]
    assert {r.consumer_id for r in flaky[1:]} == {consumer_id} and flaky[0].consumer_id == ""
    assert [r.receive_count for r in flaky[1:]] == [1, 1, 1, 1, 2, 2, 2]
    assert (flaky[3].error_class, flaky[3].error) == ("ValueError", "not yet")
    assert flaky[-1].duration is not None and flaky[-1].duration >= 0
    assert {r.channel for records in timelines.values() for r in records} == {"tracked"}
    slow = timelines["slow"]
    assert slow[3].error_class == "ProcessingTimeout" and slow[3].duration >= 1
    assert slow[4].error.startswith("processing_timeout")


@pytest.mark.timeout(60)
def test_a_dead_status_store_neither_fails_nor_loses_a_message(settings, clients, running):
    producer = TrackedProducer(settings=settings, clients=clients)
    for n in range(3):
        producer.push({"kind": "ok", "n": n})

    class DeadStore(Tracked):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            assert self.status is not None
            # (each call gives up retrying after 1 s, not the factory's default 20 s: within
            # the 10 s shutdown every record is tried and counted, on a loaded machine too)
            self.status.store = StatusStore(ClientFactory(
                "us-east-1", endpoint_url="http://127.0.0.1:9", call_budget=1.0), settings)

    run = running(DeadStore, concurrency=3)
    wait_until(lambda: len(run.consumer.done) == 3, timeout=30)
    run.stop()
    stats = run.consumer.status.store.stats
    # RECEIVED, STARTED, COMPLETED of each message: counted as failed, nothing raised
    assert stats.written == 0 and stats.failed == stats.recorded == 3 * 3
    queue = run.consumer.resources.queue.url
    attributes = clients.client("sqs").get_queue_attributes(QueueUrl=queue, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    assert attributes == {"ApproximateNumberOfMessages": "0",
                          "ApproximateNumberOfMessagesNotVisible": "0"}


@pytest.mark.timeout(60)
def test_the_log_is_the_same_with_tracking_on_and_off(settings, clients, running, caplog):
    class UntrackedProducer(Producer):
        channel = "untracked"

    class Untracked(Tracked):
        channel = "untracked"
        track_status = False

    def handle_one(cls: type[Consumer], producer: type[Producer]) -> list[tuple[str, list[str]]]:
        producer(settings=settings, clients=clients).push({"kind": "flaky"})
        run = running(cls, concurrency=1, retry_delay=1)
        wait_until(lambda: run.consumer.done, timeout=20)
        run.stop()
        records = [r for r in caplog.records if r.name == "messenger.consumer.events"
                   and r.event_fields["channel"] == cls.channel]  # type: ignore[attr-defined]
        return [(r.getMessage(), sorted(r.event_fields)) for r in records]  # type: ignore[attr-defined]

    caplog.set_level(logging.INFO, logger="messenger.consumer.events")
    on = handle_one(Tracked, TrackedProducer)
    off = handle_one(Untracked, UntrackedProducer)
    assert on == off
    names = [name for name, _ in on]
    assert names.count("failed") == 1 and names.count("completed") == 1


class Quick(Consumer):
    channel = "tracked"
    track_status = True

    def handler(self, message: ReceivedMessage) -> None:
        pass


@pytest.mark.timeout(60)
def test_push_many_stamps_each_batch_when_it_is_sent_and_timelines_read_in_order(
    settings, clients, running
):
    StatusStore(clients, settings).ensure_table()
    run = running(Quick, concurrency=4, wait_time_seconds=1)
    producer = TrackedProducer(settings=settings, clients=clients)
    wait_until(lambda: run.consumer.state is not None and run.consumer.state.value == "IDLE")
    # Given SQS taking 1.5 s to accept every batch after the first (throttled, far away)
    batches = []

    def slow_batches(**_: Any) -> None:
        batches.append(1)
        if len(batches) > 1:
            time.sleep(1.5)

    clients.register("before-call.sqs.SendMessageBatch", slow_batches)
    # When 30 messages go out in one push_many (3 batches), the first ones consumed meanwhile
    result = producer.push_many([{"kind": "ok", "n": n} for n in range(30)])
    clients.unregister("before-call.sqs.SendMessageBatch", slow_batches)
    ids = [i for i in result.message_ids if i is not None]
    assert len(ids) == 30
    wait_until(lambda: run.consumer.status.store.stats.recorded >= 90, timeout=20)
    run.stop()
    producer.status.close()
    # Then every timeline reads QUEUED, RECEIVED, STARTED, COMPLETED, oldest first
    store = StatusStore(clients, settings)
    for message_id in ids:
        records = store.timeline(message_id)
        assert [r.event for r in records] == [E.QUEUED, E.RECEIVED, E.STARTED, E.COMPLETED], \
            message_id
        assert [r.at for r in records] == sorted(r.at for r in records)


@pytest.mark.timeout(60)
def test_requeued_is_stamped_before_the_destination_receives_it(settings, clients, running):
    from messenger.operations.requeue import Requeuer
    from tests.integration.helpers import drain

    StatusStore(clients, settings).ensure_table()
    producer = TrackedProducer(settings=settings, clients=clients)
    message_id = producer.push({"kind": "ok"})
    producer.status.close()
    # Given the message in its DLQ, and the channel's consumer running
    run = running(Quick, concurrency=2, wait_time_seconds=1)
    wait_until(lambda: run.consumer.resources)
    sqs = clients.client("sqs")
    queue, dlq = run.consumer.resources.queue, run.consumer.resources.dlq
    run.consumer.request_shutdown()
    run.thread.join(20)
    for raw in drain(sqs, queue.url):
        sqs.send_message(QueueUrl=dlq.url, MessageBody=raw["Body"],
                         MessageAttributes=raw["MessageAttributes"])
    run = running(Quick, concurrency=2, wait_time_seconds=1)
    wait_until(lambda: run.consumer.state is not None and run.consumer.state.value == "IDLE")

    # When the requeuer's delete from the DLQ is slow (the consumer has it by then)
    def slow_delete(params: dict[str, Any], **_: Any) -> None:
        if params.get("QueueUrl") == dlq.url:
            time.sleep(1.5)

    clients.register("before-call.sqs.DeleteMessageBatch", slow_delete)
    Requeuer(dlq.name, "tracked", settings=settings, clients=clients).start()
    clients.unregister("before-call.sqs.DeleteMessageBatch", slow_delete)
    wait_until(lambda: run.consumer.status.store.stats.recorded >= 3, timeout=20)
    run.stop()
    # Then the timeline reads in the order things happened
    events = [r.event for r in StatusStore(clients, settings).timeline(message_id)]
    assert events == [E.QUEUED, E.REQUEUED, E.RECEIVED, E.STARTED, E.COMPLETED]
