"""Priority channels, consumer side, against the moto server: weighted and strict polling, each
level's messages handled in their own queue and DLQ, and no long poll on an empty level while
another level has messages."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest

from messenger import Consumer, MultiProducer, Producer, ReceivedMessage
from messenger.aws import ClientFactory
from messenger.consume.lifecycle import LifecycleEvent
from messenger.message import DEAD_LETTER_REASON_ATTRIBUTE
from messenger.produce.producer import PushItem
from messenger.settings import Settings
from tests.integration import test_consumer_runtime
from tests.integration.helpers import drain
from tests.integration.test_consumer_runtime import wait_until

LEVELS = ("high", "default", "low")

# The consumer-runtime tests' fixtures: `running(cls, **ConsumerSettings changes)`.
running = test_consumer_runtime.running
runtime = test_consumer_runtime.runtime


class JobsProducer(Producer):
    channel = "jobs"
    priorities = LEVELS


class Jobs(Consumer):
    """Records the level of each message it handles, in order."""

    channel = "jobs"
    priorities = LEVELS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.order: list[str] = []
        self.events: list[LifecycleEvent] = []
        self.lock = threading.Lock()

    def on_event(self, event: LifecycleEvent) -> None:
        self.events.append(event)
        super().on_event(event)

    def handler(self, message: ReceivedMessage) -> None:
        with self.lock:
            self.order.append(message.body["level"])


def backlog(settings: Settings, per_level: int) -> None:
    items = [PushItem({"level": level, "n": n}, priority=level)
             for n in range(per_level) for level in LEVELS]
    JobsProducer(settings=settings).push_many(items).raise_for_failures()


def depths(clients: ClientFactory, consumer: Consumer) -> dict[str, int]:
    """Visible + in-flight messages of every level's queue and DLQ."""
    sqs = clients.client("sqs")
    assert consumer.resources is not None
    found = {}
    for level in consumer.resources.levels:
        for queue in (level.queue, level.dlq):
            attributes = sqs.get_queue_attributes(QueueUrl=queue.url, AttributeNames=[
                "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])
            found[queue.name] = sum(int(v) for v in attributes["Attributes"].values())
    return found


@pytest.mark.timeout(60)
def test_weighted_polling_follows_the_weights_and_starves_no_level(settings, clients, running):
    class Weighted(Jobs):
        priority_weights = {"high": 6, "default": 3, "low": 1}

    # Given a backlog of 30 in every level and one worker (one message per poll)
    backlog(settings, 30)
    run = running(Weighted, concurrency=1)
    wait_until(lambda: len(run.consumer.order) >= 90, timeout=40)
    run.stop()
    order = run.consumer.order
    # Then the first 30 follow 6:3:1 (18, 9, 3) within a tolerance, and every level is served
    # within the first 10
    first = Counter(order[:30])
    for level, expected in (("high", 18), ("default", 9), ("low", 3)):
        assert abs(first[level] - expected) <= 2, (level, first, order[:30])
    assert set(order[:10]) == set(LEVELS), order[:10]
    # And every message was handled once and deleted from its own level's queue
    assert Counter(order) == {level: 30 for level in LEVELS}
    wait_until(lambda: not any(depths(clients, run.consumer).values()), timeout=10)


@pytest.mark.timeout(60)
def test_strict_polling_serves_the_highest_non_empty_level_first(settings, running):
    class Strict(Jobs):
        priority_mode = "strict"

    backlog(settings, 5)
    run = running(Strict, concurrency=1)
    wait_until(lambda: len(run.consumer.order) >= 15, timeout=30)
    run.stop()
    assert run.consumer.order == ["high"] * 5 + ["default"] * 5 + ["low"] * 5


@pytest.mark.timeout(60)
def test_an_empty_level_never_holds_up_a_busy_one_with_a_long_poll(settings, clients, running):
    # Given messages only in the lowest level and the default 20 s long poll
    JobsProducer(settings=settings).push_many(
        PushItem({"level": "low", "n": n}, priority="low") for n in range(12)
    ).raise_for_failures()
    polls: list[tuple[float, str, int]] = []  # (time, level, WaitTimeSeconds)

    def note(params: dict[str, Any], **_: Any) -> None:
        polls.append((time.time(), params["QueueUrl"].rsplit("-", 1)[-1],
                      params["WaitTimeSeconds"]))

    clients.register("provide-client-params.sqs.ReceiveMessage", note)
    run = running(Jobs, concurrency=2)
    # Then they are all handled quickly (one 20 s poll of an empty level would exceed this)
    wait_until(lambda: len(run.consumer.order) >= 12, timeout=15)
    run.stop()
    received = [e for e in run.consumer.events if e.name == "received"]
    assert [e.fields["priority"] for e in received] == ["low"] * 12
    # No long poll began while low had messages; the empty levels were not polled for each
    # batch (they are skipped for a second after coming back empty)
    busy = [(level, wait) for at, level, wait in polls if at < received[-1].at]
    assert all(wait == 0 for _, wait in busy), busy
    per_level = Counter(level for level, _ in busy)
    assert per_level["low"] >= 6 and per_level["high"] + per_level["default"] <= per_level["low"], \
        per_level


@pytest.mark.timeout(60)
def test_each_level_retries_and_dead_letters_in_its_own_queues(settings, clients, running):
    class Flaky(Jobs):
        attempts: Counter[str] = Counter()

        def handler(self, message: ReceivedMessage) -> None:
            Flaky.attempts[message.message_id] += 1
            if Flaky.attempts[message.message_id] == 1:
                raise RuntimeError("first attempt fails")
            super().handler(message)

    producer = JobsProducer(settings=settings)
    producer.push({"level": "low"}, priority="low")
    producer.push({"level": "high"}, priority="high")
    run = running(Flaky, concurrency=2, retry_delay=1)
    wait_until(lambda: run.consumer.resources)
    resources = {r.spec.priority_level: r for r in run.consumer.resources.levels}
    sqs = clients.client("sqs")
    sqs.send_message(QueueUrl=resources["high"].queue.url, MessageBody="not json {")
    # The failing messages came back on their own queues and were handled on the second try
    wait_until(lambda: sorted(run.consumer.order) == ["high", "low"], timeout=20)
    # The undecodable one went to the high level's DLQ
    dead = wait_until(lambda: drain(sqs, resources["high"].dlq.url), timeout=10)
    run.stop()
    assert [m["Body"] for m in dead] == ["not json {"]
    assert dead[0]["MessageAttributes"][DEAD_LETTER_REASON_ATTRIBUTE]["StringValue"] \
        .startswith("undecodable")
    assert not any(depths(clients, run.consumer).values())
    assert len([e for e in run.consumer.events if e.name == "retried"]) == 2


@pytest.mark.timeout(60)
def test_an_exchange_consumer_gets_every_level_through_the_filter_policies(settings, running):
    class EventsProducer(MultiProducer):
        channel = "events"
        priorities = LEVELS

    class EventJobs(Jobs):
        channel = "events.jobs"
        priority_mode = "strict"

    run = running(EventJobs, concurrency=1)
    wait_until(lambda: run.consumer.resources)
    producer = EventsProducer(settings=settings)
    producer.push({"level": "low"}, priority="low")
    producer.push({"level": "default"})  # no priority: the default level
    producer.push({"level": "high"}, priority="high")
    wait_until(lambda: len(run.consumer.order) >= 3, timeout=30)
    run.stop()
    assert sorted(run.consumer.order) == ["default", "high", "low"]
    levels = {e.message_id: e.fields["priority"] for e in run.consumer.events
              if e.name == "received"}
    assert sorted(levels.values()) == ["default", "high", "low"]


@pytest.mark.timeout(60)
def test_messages_a_long_poll_returns_after_shutdown_are_given_back_at_once(
        settings, clients, running):
    # Given an idle consumer long-polling one of its (empty) levels
    long_polls: list[str] = []

    def note(params: dict[str, Any], **_: Any) -> None:
        if params["WaitTimeSeconds"] > 0:
            long_polls.append(params["QueueUrl"])

    clients.register("provide-client-params.sqs.ReceiveMessage", note)
    run = running(Jobs, concurrency=1)
    wait_until(lambda: long_polls)
    time.sleep(0.2)  # the request is on its way
    # When it shuts down (boto3 cannot cancel the outstanding poll) and messages then arrive
    run.stop()
    JobsProducer(settings=settings).push_many(
        PushItem({"level": level}, priority=level) for level in LEVELS).raise_for_failures()
    # Then the one the orphaned poll got is released in its own level's queue, not held for the
    # 30 s lease
    released = wait_until(lambda: [e for e in run.consumer.events if e.name == "released"])
    assert released[0].fields == {"reason": "shutdown", "ok": True}
    sqs = clients.client("sqs")
    visible = {
        level.spec.priority_level: int(sqs.get_queue_attributes(
            QueueUrl=level.queue.url, AttributeNames=["ApproximateNumberOfMessages"],
        )["Attributes"]["ApproximateNumberOfMessages"])
        for level in run.consumer.resources.levels
    }
    assert visible == {level: 1 for level in LEVELS}
    assert run.consumer.order == []
