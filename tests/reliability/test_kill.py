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
                 body: dict[str, Any], backlog: int = 100, batch: int = 50) -> None:
        super().__init__(daemon=True)
        self.producer, self.total, self.processed, self.body = producer, total, processed, body
        self.backlog, self.batch = backlog, batch
        self.acknowledged: list[str] = []
        self.failures: list[Any] = []
        self.stop = threading.Event()

    def run(self) -> None:
        for first in range(0, self.total, self.batch):
            while not self.stop.is_set() and \
                    len(set(self.acknowledged) - self.processed()) + self.batch > self.backlog:
                time.sleep(0.1)
            if self.stop.is_set():
                return
            count = min(self.batch, self.total - first)
            result = self.producer.push_many(
                {**self.body, "n": n} for n in range(first, first + count))
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

    feeder = Feeder(producer, total, processed, body={})
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
        consumer.process.send_signal(signal.SIGTERM)
    for consumer in consumers:
        assert consumer.process.wait(timeout=20) == 0
    # Then every acknowledged message was processed or is still queued (or dead-lettered)
    ledger = harness.collect(feeder.acknowledged)
    line = ledger.report("kill_9", kills=len(killed), kill_points=[k["at"] for k in killed],
                         seed=SEED, seconds=round(time.monotonic() - began, 1))
    report(line)
    assert not feeder.failures
    assert len(feeder.acknowledged) == total
    assert len(killed) == kills
    assert ledger.lost == set(), line
