"""Message status by id: buffered DynamoDB records, the timeline, failure tolerance."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from messenger import ChannelSpec, Producer
from messenger.aws import ClientFactory, RequestCounter
from messenger.channel import status_table_name
from messenger.jobs.status import StatusEvent, StatusRecord, StatusStore
from tests.faults import injected


class TrackedOrders(Producer):
    channel = "orders"
    track_status = True


def test_push_records_queued_and_the_timeline_is_ordered(settings, clients):
    producer = TrackedOrders(settings=settings, clients=clients)
    message_id = producer.push({"n": 1})
    store = producer.status
    store.record(StatusRecord(message_id, StatusEvent.RECEIVED, "orders", consumer_id="c1",
                              receive_count=1))
    store.record(StatusRecord(message_id, StatusEvent.FAILED, "orders", consumer_id="c1",
                              receive_count=1, duration=0.25, error_class="ValueError",
                              error="bad sku"))
    store.close()
    timeline = StatusStore(clients, settings).timeline(message_id)
    assert [r.event for r in timeline] == [StatusEvent.QUEUED, StatusEvent.RECEIVED,
                                           StatusEvent.FAILED]
    assert timeline[-1].error_class == "ValueError" and timeline[-1].duration == 0.25
    ttl = clients.client("dynamodb").describe_time_to_live(
        TableName=status_table_name(settings.namespace))
    assert ttl["TimeToLiveDescription"]["AttributeName"] == "expires_at"


def test_records_are_written_in_batches(settings, clients):
    store = StatusStore(clients, settings)
    store.ensure_table()
    counter = RequestCounter().attach(clients)
    for n in range(100):
        store.record(StatusRecord(f"m{n}", StatusEvent.COMPLETED, "orders"))
    store.close()
    assert store.stats.written == 100
    assert counter.counts["dynamodb.BatchWriteItem"] == 4


def test_a_jobs_records_written_together_are_one_item_and_a_whole_timeline(settings, clients):
    # Given 30 jobs' RECEIVED, STARTED and COMPLETED, recorded as a consumer does
    store = StatusStore(clients, settings)
    store.prepare()
    counter = RequestCounter().attach(clients)
    events = (StatusEvent.RECEIVED, StatusEvent.STARTED, StatusEvent.COMPLETED)
    for n in range(30):
        for step, event in enumerate(events):
            store.record(StatusRecord(f"job{n}", event, "orders", at=1000.0 + n + step / 10))
    store.close()
    # Then 30 items in 2 requests (25 jobs per BatchWriteItem), every record written
    assert (store.stats.written, store.stats.items) == (90, 30)
    assert counter.counts["dynamodb.BatchWriteItem"] == 2
    # and each job's timeline reads back all three records
    for n in (0, 24, 25, 29):
        assert [r.event for r in store.timeline(f"job{n}")] == list(events)


def test_the_writer_holds_a_running_jobs_records_for_the_ones_that_follow(settings, clients):
    # Given 30 jobs received and started (more than a request's 25), finished 0.1 s later
    store = StatusStore(clients, settings)
    store.prepare()
    for n in range(30):
        store.record(StatusRecord(f"job{n}", StatusEvent.RECEIVED, "orders"))
        store.record(StatusRecord(f"job{n}", StatusEvent.STARTED, "orders"))
    time.sleep(0.1)
    for n in range(30):
        store.record(StatusRecord(f"job{n}", StatusEvent.COMPLETED, "orders"))
    # When the background writer writes them (no close: the running consumer's case)
    deadline = time.monotonic() + 10
    while store.stats.written < 90 and time.monotonic() < deadline:
        time.sleep(0.05)
    # Then each job is one item: nothing was written while its handler ran
    assert (store.stats.written, store.stats.items) == (90, 30)
    store.close()


def test_a_backlog_is_written_whole_jobs_at_a_time_oldest_first(settings, clients):
    # Given 60 jobs' records interleaved as a busy consumer's are (every RECEIVED, then every
    # STARTED, then every COMPLETED), no timer flush in between
    store = StatusStore(clients, settings, flush_interval=30)
    store.prepare()
    sent: list[list[str]] = []
    events = (StatusEvent.RECEIVED, StatusEvent.STARTED, StatusEvent.COMPLETED)
    with injected(clients, "provide-client-params.dynamodb.BatchWriteItem",  # the writer's too
                  lambda params, **_: sent.append([r["PutRequest"]["Item"]["message_id"]["S"]
                                                   for r in params["RequestItems"][store.table]])):
        for event in events:
            for n in range(60):
                store.record(StatusRecord(f"job{n:02}", event, "orders"))
        store.close()
    # Then each request carries 25 whole jobs (10 in the last), in the order they came
    assert sent == [[f"job{n:02}" for n in range(start, min(start + 25, 60))]
                    for start in (0, 25, 50)]
    assert (store.stats.written, store.stats.items, store.stats.dropped) == (180, 60, 0)
    assert [r.event for r in store.timeline("job59")] == list(events)


def test_a_full_buffer_drops_and_counts_the_new_records(settings, clients):
    # Given a buffer of 50 records and 60 jobs received, then 10 of them completed, before any
    # write (none is due: nothing settled, no timer flush)
    store = StatusStore(clients, settings, flush_interval=30, max_buffer=50)
    store.prepare()
    for n in range(60):
        store.record(StatusRecord(f"job{n:02}", StatusEvent.RECEIVED, "orders"))
    for n in range(10):
        store.record(StatusRecord(f"job{n:02}", StatusEvent.COMPLETED, "orders"))
    store.close()
    # Then the first 50 records are written, the 20 beyond the bound dropped and counted
    assert (store.stats.recorded, store.stats.written, store.stats.dropped) == (70, 50, 20)
    assert [r.event for r in store.timeline("job00")] == [StatusEvent.RECEIVED]
    assert store.timeline("job55") == []


def test_a_failing_status_store_never_fails_the_push(settings, clients):
    # The status table lives on a dead endpoint; the queue on the real one. (Each call to it
    # gives up retrying after 1 s: the factory's default, 20 s and up to 5 attempts with
    # backoff, made this test take 4-10 s.)
    producer = TrackedOrders(settings=settings, clients=clients)
    producer.status = StatusStore(ClientFactory("us-east-1", endpoint_url="http://127.0.0.1:9",
                                                call_budget=1.0), settings)
    message_id = producer.push({"n": 1})
    producer.status.close()
    assert message_id and producer.status.stats.failed == 1
    assert producer.status.stats.written == 0


def test_status_cli_prints_the_timeline(settings, clients, local_endpoint):
    producer = TrackedOrders(settings=settings, clients=clients)
    message_id = producer.push({"n": 1})
    producer.status.close()
    env = {**os.environ, **local_endpoint.env(), "MESSENGER_NAMESPACE": settings.namespace}
    done = subprocess.run([sys.executable, "-m", "messenger", "status", message_id],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"message {message_id}" in done.stdout and "QUEUED" in done.stdout
    missing = subprocess.run([sys.executable, "-m", "messenger", "status", "nope"],
                             env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "no status records for message nope" in missing.stdout


def test_requeue_records_requeued_when_tracking_is_on(settings, clients):
    from messenger.operations.requeue import Requeuer
    from messenger.provision import Provisioner
    from tests.integration.helpers import drain

    resources = Provisioner(clients, settings).ensure_channel(
        ChannelSpec("orders", namespace=settings.namespace))
    producer = TrackedOrders(settings=settings, clients=clients)
    message_id = producer.push({"n": 1})
    producer.status.close()
    sqs = clients.client("sqs")
    for raw in drain(sqs, resources.queue.url):
        sqs.send_message(QueueUrl=resources.dlq.url, MessageBody=raw["Body"],
                         MessageAttributes=raw["MessageAttributes"])
    Requeuer("orders-dlq", "orders", settings=settings, clients=clients).start()
    events = [r.event for r in StatusStore(clients, settings).timeline(message_id)]
    assert events == [StatusEvent.QUEUED, StatusEvent.REQUEUED]
