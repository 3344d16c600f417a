"""Bounded prefetch against the moto server over HTTP: a message fetched ahead for a worker that
does not free up is released after `prefetch_wait` and another consumer takes it; a pool busy
with long handlers fetches nothing; shutdown releases the messages waiting for a worker at once;
on a backlog from a far endpoint, receives go out side by side (one at a time without prefetch),
and one answering after shutdown gives its messages back. Handler durations are controlled by
the tests (gates, fixed sleeps), never timed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from messenger import Consumer, ConsumerSettings, ReceivedMessage, Settings
from messenger.aws import ClientFactory
from messenger.consume import prefetch
from tests.integration.test_consumer_runtime import (
    Recording,
    Running,
    producer_for,
    wait_until,
)


@pytest.fixture
def start(settings: Settings, clients: ClientFactory, tmp_path: Path
          ) -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def run(cls: type[Consumer], name: str, **changes: Any) -> Running:
        runtime = ConsumerSettings(health_file=str(tmp_path / f"{name}.json"),
                                   shutdown_timeout=10)
        run = Running(cls(settings=settings, clients=clients, runtime=replace(runtime,
                                                                              **changes)))
        started.append(run)
        return run

    yield run
    for run in started:
        if run.thread.is_alive():
            run.consumer.request_shutdown()
            run.thread.join(20)


@pytest.fixture
def unhurried(monkeypatch: pytest.MonkeyPatch) -> None:
    """A running message stays expected to end for 30 s past its time (not 1 s): these tests
    need the consumer to fetch ahead for its blocked worker, and a stall of the test process
    longer than LATE_SECONDS (1.4 s seen on a loaded CI machine) would rightly make it count
    that worker as late and fetch nothing. The lateness rule itself is unit tested."""
    monkeypatch.setattr(prefetch, "LATE_SECONDS", 30.0)


class Gated(Recording):
    """Handles {"n": n}: "warm" messages take `warm_seconds` (what the consumer learns to
    expect), "gated" ones block until the test opens `gate`, others return at once."""

    warm_seconds = 0.2

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.gated_started = threading.Event()

    def handler(self, message: ReceivedMessage) -> None:
        kind = message.body.get("kind")
        if kind == "warm":
            time.sleep(self.warm_seconds)
        elif kind == "gated":
            self.gated_at = time.time()
            self.gated_started.set()
            assert self.gate.wait(30)
        super().handler(message)

    def ids(self, event: str) -> list[str]:
        return [e.message_id for e in self.named(event) if e.message_id]

    def history(self) -> str:
        """Every event so far, a line each (what a failed assertion shows)."""
        return "\n".join(f"{e.at % 100:.3f} {e.name} {e.message_id} {e.fields}"
                         for e in self.events)


def wait_until_or_false(condition: Callable[[], Any], timeout: float) -> Any:
    try:
        return wait_until(condition, timeout)
    except AssertionError:
        return False


class Fast(Recording):
    def ids(self) -> list[str]:
        return [m.message_id for m in self.handled]


def warmed_up(start: Callable[..., Running], settings: Settings, cls: type[Gated],
              warm: int, **changes: Any) -> Running:
    """A consumer of one worker that has handled `warm` warm messages (it knows its round trip
    and its time per message), now running a gated one."""
    producer = producer_for(settings, cls.channel)
    run = start(cls, "a", concurrency=1, **changes)
    producer.push_many({"kind": "warm"} for _ in range(warm)).raise_for_failures()
    wait_until(lambda: len(run.consumer.handled) >= warm, timeout=30)
    producer.push({"kind": "gated"})
    assert run.consumer.gated_started.wait(15)
    return run


@pytest.mark.timeout(90)
def test_a_message_fetched_for_a_worker_that_stays_busy_is_released_for_another_consumer(
    settings, clients, start, unhurried
):
    class Slow(Gated):
        channel = "prefetch_release_test"

    class Other(Fast):
        channel = "prefetch_release_test"

    # Given a consumer of one worker that expects 0.2 s per message, whose message now blocks
    a = warmed_up(start, settings, Slow, warm=4)
    # When messages arrive meanwhile
    producer = producer_for(settings, Slow.channel)
    sent = [producer.push({"kind": "after", "n": n}) for n in range(3)]
    # Then it fetched one for its worker, expected to free up, and once that waited 0.5 s it
    # gave it back (visible at once: the lease is 30 s) instead of holding it behind the
    # blocked handler
    def expired() -> list[Any]:
        return [e for e in a.consumer.named("released") if e.fields["reason"] ==
                "prefetch_expired"]

    assert wait_until_or_false(expired, timeout=15), a.consumer.history()
    # and another consumer gets every message while the first is still blocked
    b = start(Other, "b", concurrency=2)
    wait_until(lambda: sorted(b.consumer.ids()) == sorted(sent), timeout=20)
    assert not a.consumer.gate.is_set()
    # (one release, or up to one per receive in flight: on a loaded machine a slow answer let
    # a second receive go out for the same worker, as on a backlog, and each message fetched
    # was given back the same way)
    released = a.consumer.named("released")
    assert 1 <= len(released) <= 3, a.consumer.history()
    for event in released:
        assert event.fields["ok"] and event.fields["reason"] == "prefetch_expired"
        assert event.message_id in sent
        [again] = [m for m in b.consumer.handled if m.message_id == event.message_id]
        assert again.receive_count == 2
    a.consumer.gate.set()
    wait_until(lambda: len(a.consumer.handled) == 5)
    a.stop()
    b.stop()
    # Nothing was lost or run twice; the first consumer ran none of the later messages
    assert not set(a.consumer.ids("started")) & set(sent)
    assert not a.consumer.named("failed") and not b.consumer.named("failed")


@pytest.mark.timeout(90)
def test_a_pool_busy_with_long_handlers_leaves_new_messages_to_another_consumer(
    settings, clients, start
):
    class Long(Gated):
        channel = "prefetch_busy_test"
        warm_seconds = 3.0

    class Other(Fast):
        channel = "prefetch_busy_test"

    # Given a consumer of one worker that expects 3 s per message, running a message that
    # blocks, and another consumer on the same queue
    a = warmed_up(start, settings, Long, warm=1)
    b = start(Other, "b", concurrency=2)
    wait_until(lambda: b.consumer.named("state"))
    # When messages arrive while its worker is busy (before it is expected to free up)
    producer = producer_for(settings, Long.channel)
    sent = [producer.push({"kind": "after", "n": n}) for n in range(5)]
    # Then the other consumer handles them all, and the busy one received none of them before
    # its worker was expected to free up (3 s after the gated message started, less the lead:
    # at most half of prefetch_wait). Where the other one takes longer than that (a loaded
    # machine), the busy one may then fetch for its worker and, that worker still blocked,
    # give the message back: the previous test's case, not a failure of this one.
    wait_until(lambda: sorted(b.consumer.ids()) == sorted(sent), timeout=20)
    expected_free = a.consumer.gated_at + Long.warm_seconds - 1.0
    early = [e.message_id for e in a.consumer.named("received")
             if e.message_id in sent and e.at < expected_free]
    assert not early, a.consumer.history()
    assert len(a.consumer.ids("received")) >= 2  # the warm message and the gated one
    a.consumer.gate.set()
    a.stop()
    b.stop()


@pytest.mark.timeout(90)
def test_shutdown_releases_a_message_waiting_for_a_busy_worker_at_once(
    settings, clients, start, unhurried
):
    class Busy(Gated):
        channel = "prefetch_shutdown_test"

    # Given a consumer of one worker running a message that blocks, with a message it fetched
    # ahead for that worker waiting (the bound is 5 s: it does not run out here)
    a = warmed_up(start, settings, Busy, warm=4, prefetch_wait=5.0)
    producer = producer_for(settings, Busy.channel)
    waiting = producer.push({"kind": "after"})
    wait_until(lambda: waiting in a.consumer.ids("received"), timeout=15)
    # When it is asked to stop, its handler still blocked
    a.consumer.request_shutdown()
    # Then the waiting message is visible again at once (its lease is 30 s), not once the
    # handler returns
    assert a.consumer.resources is not None
    sqs = clients.client("sqs")
    got = wait_until(lambda: sqs.receive_message(
        QueueUrl=a.consumer.resources.queue.url, MaxNumberOfMessages=1, WaitTimeSeconds=1,
        MessageAttributeNames=["All"]).get("Messages"), timeout=8)
    assert got[0]["MessageAttributes"]["message_id"]["StringValue"] == waiting
    assert not a.consumer.gate.is_set()
    [released] = wait_until(lambda: a.consumer.named("released"))
    assert released.message_id == waiting and released.fields["reason"] == "shutdown"
    # and the running handler still finishes within the shutdown timeout
    a.consumer.gate.set()
    a.stop()
    assert waiting not in a.consumer.ids("started")


class ReceiveGate:
    """Botocore hooks on the consumer's clients: count its receives in flight (the most at
    once); with `delay`, hold every receive that long before it is sent (a far endpoint);
    once armed, hold the next receive sent beside the receiver (on a `messenger-receive`
    thread) before it is sent until `release`."""

    def __init__(self, clients: ClientFactory, delay: float = 0.0) -> None:
        self.lock = threading.Lock()
        self.delay = delay
        self.in_flight = 0
        self.most = 0
        self.armed = False
        self.holding = threading.Event()
        self._released = threading.Event()
        clients.register("before-call.sqs.ReceiveMessage", self._began)
        clients.register("after-call.sqs.ReceiveMessage", self._ended)
        clients.register("after-call-error.sqs.ReceiveMessage", self._ended)
        clients.register("before-send.sqs.ReceiveMessage", self._before_send)

    def _began(self, **_: Any) -> None:
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)

    def _ended(self, **_: Any) -> None:
        with self.lock:
            self.in_flight -= 1

    def _before_send(self, **_: Any) -> None:
        beside = threading.current_thread().name == "messenger-receive"
        with self.lock:
            hold = self.armed and beside
            self.armed = self.armed and not hold
        if hold:
            self.holding.set()
            assert self._released.wait(60)
        time.sleep(self.delay)

    def release(self) -> None:
        self._released.set()


class Steady(Recording):
    """Handles every message in 20 ms (a handler waiting on a network call)."""

    def handler(self, message: ReceivedMessage) -> None:
        time.sleep(0.02)
        super().handler(message)


def drained_far_away(settings: Settings, clients: ClientFactory,
                     start: Callable[..., Running], channel: str,
                     prefetch_wait: float) -> ReceiveGate:
    """A consumer of 10 workers of 20 ms messages (500 msg/s) that drains a backlog of 200,
    each of its receives 60 ms from the queue (one receive brings 10 messages a round trip:
    ~170 msg/s); returns once every message is handled exactly once, none failed nor released,
    none left, and the consumer stopped."""
    cls = type("Drain", (Steady,), {"channel": channel})
    producer = producer_for(settings, channel)
    sent = [producer.push({"n": n}) for n in range(200)]
    gate = ReceiveGate(clients, delay=0.06)
    run = start(cls, "a", concurrency=10, prefetch_wait=prefetch_wait)
    wait_until(lambda: len(run.consumer.handled) >= len(sent), timeout=90)
    run.stop()
    assert sorted(m.message_id for m in run.consumer.handled) == sorted(sent)
    assert not run.consumer.named("failed") and not run.consumer.named("released")
    assert run.consumer.resources is not None
    attributes = clients.client("sqs").get_queue_attributes(
        QueueUrl=run.consumer.resources.queue.url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])
    assert all(value == "0" for value in attributes["Attributes"].values())
    return gate


@pytest.mark.timeout(150)
def test_receives_go_out_side_by_side_on_a_backlog_one_round_trip_cannot_keep_up_with(
        settings, clients, start):
    # Given a consumer prefetching on a backlog (the bound is 5 s, so that a stall of this
    # loaded test process does not pause it) whose workers get through more than one receive
    # brings a round trip
    gate = drained_far_away(settings, clients, start, "prefetch_beside_test", prefetch_wait=5.0)
    # Then receives went out while others were in flight, never more than the cap
    assert 2 <= gate.most <= prefetch.MAX_RECEIVES_IN_FLIGHT


@pytest.mark.timeout(150)
def test_without_prefetch_one_receive_is_in_flight_at_a_time(settings, clients, start):
    # Given the same consumer and backlog with prefetch off
    gate = drained_far_away(settings, clients, start, "prefetch_one_receive_test",
                            prefetch_wait=0)
    # Then no receive went out while another was in flight
    assert gate.most == 1


def held_beside_on_a_backlog(settings: Settings, clients: ClientFactory,
                             start: Callable[..., Running], channel: str
                             ) -> tuple[Running, ReceiveGate, list[str]]:
    """A consumer of 10 workers prefetching on a backlog of 200 messages that, once it has
    handled 30 (it knows its round trip and its time per message), has its next receive beside
    the receiver held before it is sent; returns with that receive held."""
    cls = type("Drain", (Steady,), {"channel": channel})
    gate = ReceiveGate(clients)
    producer = producer_for(settings, channel)
    sent = [producer.push({"n": n}) for n in range(200)]
    run = start(cls, "a", concurrency=10, prefetch_wait=5.0)
    wait_until(lambda: len(run.consumer.handled) >= 30, timeout=60)
    gate.armed = True
    assert gate.holding.wait(30)
    return run, gate, sent


@pytest.mark.timeout(120)
def test_a_receive_beside_the_receiver_that_answers_after_shutdown_gives_its_messages_back(
    settings, clients, start
):
    # Given a consumer prefetching on a backlog, one of whose receives beside the receiver is
    # held before it is sent
    run, gate, sent = held_beside_on_a_backlog(settings, clients, start,
                                               "prefetch_beside_shutdown_test")
    # When the consumer has shut down, and only then that receive reaches the queue, which
    # has new messages
    run.stop()
    wait_until(lambda: gate.in_flight == 1, timeout=30)  # the others have answered
    handled = {m.message_id for m in run.consumer.handled}
    received = len(run.consumer.named("received"))
    released = len(run.consumer.named("released"))
    late = [producer_for(settings, "prefetch_beside_shutdown_test").push({"late": n})
            for n in range(3)]
    gate.release()
    wait_until(lambda: gate.in_flight == 0, timeout=30)
    # Then the messages it got (a backlog's, the new ones, or those given back at shutdown a
    # moment before) are given back at once (their lease is 30 s), never received into the
    # consumer nor handled
    def given_back() -> list[Any]:
        return [e for e in run.consumer.named("released")[released:]
                if e.fields["reason"] == "shutdown"]

    assert wait_until_or_false(given_back, timeout=10), run.consumer.named("released")
    assert len(run.consumer.named("received")) == received
    assert {m.message_id for m in run.consumer.handled} == handled
    # and every message not handled is visible (the other receives in flight at shutdown gave
    # theirs back too)
    assert run.consumer.resources is not None
    url = run.consumer.resources.queue.url
    expected = {"ApproximateNumberOfMessages": str(len(sent) + len(late) - len(handled)),
                "ApproximateNumberOfMessagesNotVisible": "0"}

    def counts() -> dict[str, str]:
        return dict(clients.client("sqs").get_queue_attributes(
            QueueUrl=url, AttributeNames=list(expected))["Attributes"])

    assert wait_until_or_false(lambda: counts() == expected, timeout=10), counts()


class LongPolls:
    """Botocore hooks on the consumer's clients: the receives in flight that are long polls
    (WaitTimeSeconds > 0), and the most of them at once."""

    def __init__(self, clients: ClientFactory) -> None:
        self.lock = threading.Lock()
        self.waits: dict[int, int] = {}  # thread id -> WaitTimeSeconds of its receive
        self.most = 0
        clients.register("before-parameter-build.sqs.ReceiveMessage", self._began)
        clients.register("after-call.sqs.ReceiveMessage", self._ended)
        clients.register("after-call-error.sqs.ReceiveMessage", self._ended)

    def _began(self, params: dict[str, Any], **_: Any) -> None:
        with self.lock:
            self.waits[threading.get_ident()] = int(params.get("WaitTimeSeconds", 0))
            self.most = max(self.most, self.in_flight())

    def _ended(self, **_: Any) -> None:
        with self.lock:
            self.waits.pop(threading.get_ident(), None)

    def in_flight(self) -> int:
        return sum(1 for wait in self.waits.values() if wait > 0)


@pytest.mark.timeout(90)
def test_a_queue_run_dry_has_one_long_poll_waiting_on_it(settings, clients, start):
    # Given a consumer of one worker of 20 ms messages, prefetching, whose every poll came back
    # with the one message it asked for (each counts as full)
    cls = type("Single", (Steady,), {"channel": "prefetch_dry_test"})
    polls = LongPolls(clients)
    producer = producer_for(settings, cls.channel)
    run = start(cls, "a", concurrency=1, prefetch_wait=5.0)
    for n in range(1, 6):
        producer.push({"n": n})
        wait_until(lambda count=n: len(run.consumer.handled) >= count, timeout=30)
    # When the queue has run dry
    time.sleep(1.0)
    # Then one long poll waits on it, never several side by side (a consumer killed now would
    # leave them there, each to take a message for nobody when its lease lapses)
    assert polls.in_flight() == 1
    assert polls.most == 1
    run.stop()
