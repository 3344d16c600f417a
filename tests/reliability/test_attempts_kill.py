"""kill -9 of a consumer process during a job's last attempt: the next consumer dead-letters the
job with the reason instead of running it once more (SQS's receive count tells, before any
handler runs, that its attempts are used up)."""

from __future__ import annotations

import json
import signal
import time

import pytest


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("max_attempts", "failing"), [(1, 0), (2, 1)])
def test_a_consumer_killed_during_the_last_attempt_leaves_a_dead_letter_not_another_run(
    harness, producer_class, settings, report, max_attempts: int, failing: int,
) -> None:
    # Given a job that may run `max_attempts` times, whose first `failing` runs fail
    producer = producer_class(settings=settings)
    job = producer.push({"sleep": 60, "fail_first": failing}, max_attempts=max_attempts)
    # When the consumer is killed -9 in the middle of its last attempt
    first = harness.start("AttemptsConsumer")
    deadline = time.monotonic() + 60
    while len(harness.lines("attempts")) < max_attempts and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(harness.lines("attempts")) == max_attempts, first.log_path.read_text()[-3000:]
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(timeout=10)
    # And another consumer gets the job when its lease (2 s) lapses
    second = harness.start("AttemptsConsumer")
    dead = second.wait_for(lambda e: e.get("event") == "dead_lettered", timeout=30)
    assert second.terminate() == 0
    # Then the job ran `max_attempts` times, no more, and waits in the DLQ with the reason
    runs = [json.loads(line)["receive_count"] for line in harness.lines("attempts")]
    ledger = harness.collect([job])
    report(ledger.report("killed_in_last_attempt", max_attempts=max_attempts, runs=len(runs)))
    assert runs == list(range(1, max_attempts + 1))
    assert ledger.in_dlq == [job] and ledger.processed == [] and ledger.in_queue == []
    # (received max_attempts + 1 times, or + 2 when the killed consumer's long poll still in
    # flight took it once more: the reason names the count, not an attempt)
    count = dead["receive_count"]
    assert count in (max_attempts + 1, max_attempts + 2)
    allowed = "1 attempt" if max_attempts == 1 else f"{max_attempts} attempts"
    reason = (f"attempts_exhausted: received {count} times, {allowed} allowed (a consumer "
              f"stopped during its last attempt)")
    assert ledger.dlq_reasons[job] == reason == dead["reason"]
