"""Complete status timelines: QUEUED written when a process exits without close(), the last
attempt's failure recorded with its traceback and the consumer's DEAD_LETTERED, the dead-letter
reason and duplicate pushes shown by `messenger status`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from messenger import Consumer, Producer, ReceivedMessage
from messenger.jobs.status import StatusEvent, StatusStore, render_timeline
from tests.integration import test_consumer_runtime
from tests.integration.test_consumer_runtime import wait_until

E = StatusEvent
ROOT = Path(__file__).resolve().parents[2]
running = test_consumer_runtime.running
runtime = test_consumer_runtime.runtime


class TrackedPoison(Producer):
    channel = "poison"
    track_status = True


class AlwaysFails(Consumer):
    channel = "poison"
    track_status = True
    max_receives = 2

    def handler(self, message: ReceivedMessage) -> None:
        raise ValueError(f"cannot handle {message.body}")


def test_a_process_that_exits_without_close_still_writes_its_queued_records(
    settings, clients, local_endpoint
):
    # Given a script that pushes 3 tracked messages and exits without closing the status store
    StatusStore(clients, settings).ensure_table()
    script = textwrap.dedent("""
        from messenger import Producer

        class Tracked(Producer):
            channel = "orders"
            track_status = True

        for n in range(3):
            print(Tracked().push({"n": n}))
    """)
    env = {**os.environ, **local_endpoint.env(), "MESSENGER_NAMESPACE": settings.namespace}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    ids = done.stdout.split()
    # Then each message's timeline starts with its QUEUED record
    store = StatusStore(clients, settings)
    assert len(ids) == 3
    for message_id in ids:
        assert [r.event for r in store.timeline(message_id)] == [E.QUEUED]


@pytest.mark.timeout(60)
def test_the_last_attempt_ends_the_timeline_with_dead_lettered_its_reason_and_traceback(
    settings, clients, running, local_endpoint
):
    # Given a message its consumer fails on every one of its 2 attempts
    StatusStore(clients, settings).ensure_table()
    producer = TrackedPoison(settings=settings, clients=clients)
    message_id = producer.push({"sku": "x"})
    producer.status.close()
    run = running(AlwaysFails, retry_delay=0)
    store = run.consumer.status.store
    wait_until(lambda: store.stats.recorded >= 8, timeout=30)
    run.stop()
    # Then its timeline ends with the consumer's DEAD_LETTERED, naming why
    timeline = StatusStore(clients, settings).timeline(message_id)
    events = [r.event for r in timeline]
    assert events == [E.QUEUED, E.RECEIVED, E.STARTED, E.FAILED, E.RETRIED,
                      E.RECEIVED, E.STARTED, E.FAILED, E.DEAD_LETTERED]
    assert timeline[-1].error == "failed: attempts used up (2 of 2)"
    # ... each FAILED record keeps the traceback
    failed = [r for r in timeline if r.event is E.FAILED]
    assert all("in handler" in r.traceback and r.traceback.rstrip().endswith(
        "ValueError: cannot handle {'sku': 'x'}") for r in failed)
    # And `messenger status` shows the reason, the last error and its traceback
    env = {**os.environ, **local_endpoint.env(), "MESSENGER_NAMESPACE": settings.namespace}
    shown = subprocess.run([sys.executable, "-m", "messenger", "status", message_id],
                           env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    dead = next(line for line in lines if "DEAD_LETTERED" in line)
    assert "reason=failed: attempts used up (2 of 2)" in dead
    assert "error=ValueError: cannot handle {'sku': 'x'}" in shown.stdout
    trace = lines[lines.index("last failure's traceback:") + 1:]
    assert trace[0] == "    Traceback (most recent call last):"
    assert trace[-1] == "    ValueError: cannot handle {'sku': 'x'}"


def test_a_duplicate_ordered_push_shows_in_the_timeline(settings, clients):
    class Ledger(Producer):
        channel = "ledger"
        ordered = True
        track_status = True

    producer = Ledger(settings=settings, clients=clients)
    first = producer.push({"same": 1})
    again = producer.push({"same": 1})
    producer.status.close()
    assert first == again
    timeline = StatusStore(clients, settings).timeline(first)
    assert [r.event for r in timeline] == [E.QUEUED, E.DUPLICATE]
    lines = render_timeline(first, timeline).splitlines()
    assert "DUPLICATE" not in lines[1] and "DUPLICATE" in lines[2]


def test_a_consumer_dead_letter_reason_is_shown():
    from messenger.jobs.status import StatusRecord

    records = [
        StatusRecord("m1", E.QUEUED, "orders", at=100.0),
        StatusRecord("m1", E.DEAD_LETTERED, "orders", at=101.0,
                     error="undecodable: message body is not JSON"),
    ]
    assert "reason=undecodable: message body is not JSON" in render_timeline("m1", records)


