"""kill -9 and SIGTERM of consumer processes while messages flow: nothing is lost."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from messenger import Producer

#: The random moments of the kills are drawn from this seed (RELIABILITY_SEED to vary them).
SEED = int(os.environ.get("RELIABILITY_SEED") or 7)


class Feeder(threading.Thread):
    """Pushes `total` messages in push_many batches, logging every message id the producer
    acknowledged. Backpressure keeps at most `backlog` unprocessed messages in the queue:
    moto's SQS calls cost time in proportion to the queue's depth."""

    def __init__(self, producer: Producer, total: int, processed: Callable[[], set[str]],
                 backlog: int = 60, batch: int = 30) -> None:
        super().__init__(daemon=True)
        self.producer, self.total, self.processed = producer, total, processed
        self.backlog, self.batch = backlog, batch
        self.acknowledged: list[str] = []
        self.failures: list[Any] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            self._feed()
        except BaseException as error:  # reported by the test, not lost in a thread
            self.error = error
            raise

    def _feed(self) -> None:
        for first in range(0, self.total, self.batch):
            while not self.stop.is_set() and \
                    len(set(self.acknowledged) - self.processed()) + self.batch > self.backlog:
                time.sleep(0.1)
            if self.stop.is_set():
                return
            count = min(self.batch, self.total - first)
            result = self.producer.push_many(
                {"n": n} for n in range(first, first + count))
            self.acknowledged.extend(i for i in result.message_ids if i is not None)
            self.failures.extend(result.failures)


@pytest.mark.timeout(300)
def test_kill_9_ten_times_during_2000_messages_loses_nothing(
    harness, producer_class, settings, report
):
    # Given two consumer processes (two ECS tasks) and a producer feeding 2,000 messages
    rng = random.Random(SEED)
    total, kills = 2000, 10
    producer = producer_class(settings=settings)
    producer.push_many([])  # provisions the channel before the consumers race for it

    def processed() -> set[str]:
        return set(harness.processed())

    feeder = Feeder(producer, total, processed)
    began = time.monotonic()
    consumers = [harness.start(MESSENGER_CONCURRENCY="10") for _ in range(2)]
    feeder.start()
    # When one of them is killed -9 at 10 random moments (random progress points)
    kill_at = sorted(rng.sample(range(100, total - 100), kills))
    killed = []
    for progress in kill_at:
        while len(processed()) < progress and feeder.is_alive():
            time.sleep(0.05)
        time.sleep(rng.uniform(0, 0.5))
        slot = rng.randrange(len(consumers))
        consumers[slot].process.send_signal(signal.SIGKILL)
        consumers[slot].process.wait(timeout=10)
        killed.append({"at": len(processed()), "slot": slot})
        consumers[slot] = harness.start(MESSENGER_CONCURRENCY="10")
    feeder.join(timeout=240)
    feeder.stop.set()
    harness.wait_processed(feeder.acknowledged, timeout=60)
    for consumer in consumers:
        assert consumer.terminate() == 0
    # Then every acknowledged message was processed or is still queued (or dead-lettered)
    ledger = harness.collect(feeder.acknowledged)
    line = ledger.report("kill_9", kills=len(killed), kill_points=[k["at"] for k in killed],
                         seed=SEED, seconds=round(time.monotonic() - began, 1))
    report(line)
    assert feeder.error is None and not feeder.failures, (feeder.error, feeder.failures[:3])
    assert len(feeder.acknowledged) == total
    assert len(killed) == kills
    assert ledger.lost == set(), line


@pytest.mark.timeout(180)
def test_sigterm_mid_message_completes_in_flight_work_loses_and_duplicates_nothing(
    harness, producer_class, settings, report
):
    # Given 80 messages of 0.2 s each and a consumer with a 5 s shutdown timeout
    rng = random.Random(SEED)
    shutdown_timeout = 5.0
    producer = producer_class(settings=settings)
    result = producer.push_many({"sleep": 0.2, "n": n} for n in range(80))
    result.raise_for_failures()
    acknowledged = [i for i in result.message_ids if i is not None]
    stops = []
    began = time.monotonic()
    # When it gets SIGTERM at 3 random moments, in the middle of messages, and is restarted
    for progress in sorted(rng.sample(range(10, 60), 3)):
        consumer = harness.start(MESSENGER_CONCURRENCY="4",
                                 MESSENGER_SHUTDOWN_TIMEOUT=str(shutdown_timeout))
        while len(harness.processed()) < progress and consumer.process.poll() is None:
            time.sleep(0.02)
        consumer.wait_for(lambda e: e.get("event") == "started")
        time.sleep(rng.uniform(0, 0.2))
        stopped_at, signalled = time.monotonic(), time.time()
        consumer.process.send_signal(signal.SIGTERM)
        code = consumer.process.wait(timeout=shutdown_timeout + 10)
        took = time.monotonic() - stopped_at
        # Then each stop exits 0 within the shutdown timeout, every handler it started completed
        events = consumer.events()
        # (a run that ended while its `started` line was held has only its end line: what the
        # process received and did not give back is what it started)
        received = {i for e in events if e.get("event") == "received" for i in e["message_ids"]}
        released = {e["message_id"] for e in events if e.get("event") == "released"}
        started = {e["message_id"] for e in events if e.get("event") == "started"}
        started |= received - released
        completed = {e["message_id"] for e in events if e.get("event") == "completed"}
        finished_after = [e for e in events
                          if e.get("event") == "completed" and e["time"] >= signalled]
        stops.append({"at": progress, "exit": code, "seconds": round(took, 2),
                      "completed_after_sigterm": len(finished_after),
                      "in_flight_unfinished": len(started - completed)})
        assert code == 0
        assert took < shutdown_timeout, stops
        assert started == completed, stops
    # (the signals did land in the middle of messages)
    assert sum(stop["completed_after_sigterm"] for stop in stops) > 0, stops
    last = harness.start(MESSENGER_CONCURRENCY="4")
    harness.wait_processed(acknowledged, timeout=60)
    assert last.terminate() == 0
    # And across the restarts nothing was lost and nothing ran twice
    ledger = harness.collect(acknowledged)
    line = ledger.report("sigterm", stops=stops, seed=SEED,
                         seconds=round(time.monotonic() - began, 1))
    report(line)
    assert ledger.lost == set(), line
    assert ledger.duplicates == 0, line
    assert set(ledger.processed) == set(acknowledged), line
