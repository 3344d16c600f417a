"""An operator's controls on a real `messenger consume` process: pause and resume a channel,
cancel a running job (`messenger.operations.pause`, `messenger.jobs.controls`)."""

from __future__ import annotations

import time

import pytest

from messenger.jobs.controls import TAG_PAUSED, CancelRequests
from messenger.jobs.status import StatusStore
from messenger.jobs.workers import list_workers
from messenger.operations.pause import pause, resume
from messenger.operations.snapshot import snapshot
from messenger.ops.pauses import reapply_pauses
from tests.reliability.apps import CHANNEL

#: The paused consumer's long poll (seconds): the one in flight when it pauses ends this soon.
LONG_POLL = 1


@pytest.mark.timeout(120)
def test_a_paused_channel_is_not_consumed_until_resumed(
    harness, producer_class, settings, clients, report,
) -> None:
    # Given a consumer of the channel, listening with 1 s long polls
    consumer = harness.start("LedgerConsumer", RELIABILITY_WAIT_SECONDS=str(LONG_POLL))
    consumer.wait_listening()
    # When an operator pauses the channel
    done = pause(clients, settings, CHANNEL, actor="ada@example.com")
    assert done.ok and done.queues, done.summary()
    paused = consumer.wait_for(lambda e: e.get("event") == "paused", timeout=30)
    assert paused["by"] == "ada@example.com"
    consumer.wait_for_state("PAUSED", timeout=30)
    # (and a deploy that rewrites the queue's tags does not resume it: the consumer reads the
    # pause's record in the worker registry, which no deploy touches)
    for queue in done.queues:
        sqs = clients.client("sqs")
        sqs.untag_queue(QueueUrl=sqs.get_queue_url(QueueName=queue)["QueueUrl"],
                        TagKeys=[TAG_PAUSED])
    # Then what is pushed meanwhile waits in the queue (its long poll in flight may still take
    # what comes in its last second: the jobs go in after it answered, with seconds to spare)
    time.sleep(LONG_POLL + 4)
    producer = producer_class(settings=settings)
    jobs = [producer.push({"n": n}) for n in range(3)]
    time.sleep(4)
    assert harness.processed() == []
    # and `messenger top`'s snapshot and the registry say so
    assert reapply_pauses(clients, settings).repaired  # the tag put back, as every 15 min
    rows = [r for r in snapshot(clients, settings) if r.channel == CHANNEL]
    assert rows and all(r.paused.startswith("paused by ada@example.com at ") for r in rows)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        states = {w.state for w in list_workers(clients, settings, CHANNEL)}
        if states == {"PAUSED"}:
            break
        time.sleep(0.5)
    assert states == {"PAUSED"}
    # When it is resumed, the jobs run
    resumed = resume(clients, settings, CHANNEL, actor="ada@example.com")
    assert resumed.ok, resumed.summary()
    harness.wait_processed(jobs, timeout=30)
    assert sorted(harness.processed()) == sorted(jobs)
    assert consumer.terminate() == 0
    assert not [r for r in snapshot(clients, settings) if r.channel == CHANNEL and r.paused]
    report({"test": "pause_resume", "jobs": len(jobs), "processed": len(harness.processed())})


@pytest.mark.timeout(120)
def test_a_cancelled_running_job_is_dead_lettered_with_who_cancelled_it(
    harness, producer_class, settings, clients, report,
) -> None:
    # Given a long job running on a tracked consumer
    producer_class.track_status = True
    producer = producer_class(settings=settings)
    job = producer.push({"sleep": 60})
    consumer = harness.start("TrackedAttemptsConsumer")
    deadline = time.monotonic() + 30
    while not harness.lines("attempts") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert harness.lines("attempts"), consumer.log_path.read_text()[-3000:]
    # (its registry entry says PROCESSING, 1 in flight, within a few seconds, not 30)
    started = time.monotonic()
    entries: list = []
    while time.monotonic() - started < 5:
        entries = list_workers(clients, settings, CHANNEL)
        if [(e.state, e.in_flight) for e in entries] == [("PROCESSING", 1)]:
            break
        time.sleep(0.2)
    assert [(e.state, e.in_flight) for e in entries] == [("PROCESSING", 1)], entries
    # When an operator cancels it
    CancelRequests(clients, settings, CHANNEL).request(job, "grace@example.com")
    # Then its consumer stops it at its next heartbeat and dead-letters it with the reason
    dead = consumer.wait_for(lambda e: e.get("event") == "dead_lettered", timeout=20)
    assert dead["reason"] == "cancelled by grace@example.com"
    assert consumer.terminate() == 0
    ledger = harness.collect([job])
    assert ledger.in_dlq == [job] and ledger.processed == []
    assert ledger.dlq_reasons[job] == "cancelled by grace@example.com"
    # and the job's timeline names who cancelled it
    timeline = StatusStore(clients, settings).timeline(job)
    cancelled = [r for r in timeline if str(r.event) == "CANCELLED"]
    assert cancelled and cancelled[0].actor == "grace@example.com", timeline
    assert [str(r.event) for r in timeline][-1] == "DEAD_LETTERED"
    # and the request is gone (a requeued copy is not cancelled again)
    assert CancelRequests(clients, settings, CHANNEL).pending() == {}
    report({"test": "cancel", "events": [str(r.event) for r in timeline]})
