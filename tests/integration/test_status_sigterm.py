"""Status tracking at shutdown: a real `messenger consume` process, stopped with SIGTERM in the
middle of a backlog, leaves every status event it logged in the status table (the final flush
runs within the shutdown timeout), whether its records are written by a thread of the consumer
(the default) or by a writer process (MESSENGER_STATUS_WRITER=process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from messenger import Consumer, Producer, ReceivedMessage
from messenger.consume.tracking import STATUS_EVENTS
from messenger.jobs.status import StatusEvent, StatusStore

ROOT = Path(__file__).resolve().parents[2]
SHUTDOWN_TIMEOUT = 5


class TrackedJobsProducer(Producer):
    channel = "sigterm_jobs"
    track_status = True


class TrackedSleeper(Consumer):
    """Takes 0.1 s a job: SIGTERM finds several running and more received."""

    channel = "sigterm_jobs"
    track_status = True

    def handler(self, message: ReceivedMessage) -> None:
        time.sleep(0.1)


def logged_events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("writer", ["process", "thread"])
def test_sigterm_loses_nothing_from_the_timeline(settings, clients, tmp_path, writer):
    # Given a tracked backlog of 60 jobs and a consumer process working on it
    store = StatusStore(clients, settings)
    store.ensure_table()
    producer = TrackedJobsProducer(settings=settings, clients=clients)
    producer.push_many({"n": n} for n in range(60)).raise_for_failures()
    producer.status.close()
    log = tmp_path / "consumer.log"
    env = {**os.environ, "MESSENGER_NAMESPACE": settings.namespace,
           "MESSENGER_CONCURRENCY": "4", "MESSENGER_SHUTDOWN_TIMEOUT": str(SHUTDOWN_TIMEOUT),
           "MESSENGER_HEALTH_FILE": str(tmp_path / "health.json"),
           "MESSENGER_LOG_HOLD_SECONDS": "0", "MESSENGER_STATUS_WRITER": writer}
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "messenger", "consume",
             f"{__name__}:TrackedSleeper"], cwd=ROOT, env=env, stdout=out,
            stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while sum(e.get("event") == "completed" for e in logged_events(log)) < 10:
                assert process.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.05)
            # When ECS stops the task
            stopped = time.monotonic()
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=60)
            took = time.monotonic() - stopped
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    # Then it exits 0 within the shutdown timeout (plus the final flush's floor and start-up
    # of nothing: the process is already running)
    assert code == 0, log.read_text()[-3000:]
    # (a writer process that died would have been replaced by the consumer's thread: it did not)
    assert "writing status records in this process" not in log.read_text()
    assert took < SHUTDOWN_TIMEOUT + 5, took
    # and every status event it logged is in its job's timeline (the log leaves 'received' out
    # at INFO), a completed job's whole: RECEIVED, STARTED, COMPLETED
    logged: dict[str, list[StatusEvent]] = defaultdict(list)
    for event in logged_events(log):
        status = STATUS_EVENTS.get(event.get("event", ""))
        if status is not None and event.get("message_id"):
            logged[event["message_id"]].append(status)
    completed = 0
    for message_id, events in logged.items():
        stored = [r.event for r in store.timeline(message_id)]
        assert not Counter(events) - Counter(stored), (message_id, stored, events)
        if StatusEvent.COMPLETED in events:
            completed += 1
            assert stored == [StatusEvent.QUEUED, StatusEvent.RECEIVED, StatusEvent.STARTED,
                              StatusEvent.COMPLETED], (message_id, stored)
    assert completed >= 10
