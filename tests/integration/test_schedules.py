"""Scheduled jobs on the local endpoint: DelaySeconds, one-time schedules fired by the endpoint's
scheduler (messenger.tools.scheduler_fire), cancellation, retried firings, the schedule DLQ."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import ClassVar

import pytest
from pydantic import BaseModel

from messenger import Producer
from messenger.channel import schedule_dlq_name, schedule_group_name
from messenger.consume.lambda_runtime import LambdaConsumerRuntime, LocalEventSource
from messenger.errors import InvalidMessage
from messenger.jobs.schedule_store import ScheduleNotFound, ScheduleStore
from messenger.jobs.schedules import schedule_name
from messenger.jobs.status import StatusEvent, StatusStore, render_timeline
from messenger.offload import EXTENDED_SIZE_ATTRIBUTE
from messenger.schema import SCHEMA_VERSION_ATTRIBUTE
from messenger.tools import cli
from messenger.tools.scheduler_fire import ScheduleFirer, invoke_target, local_clients
from tests.faults import Throttle, injected
from tests.integration.helpers import decode, drain, queue_url
from tests.integration.test_consumer_runtime import (  # noqa: F401 - fixtures
    Recording,
    Running,
    runtime,
    wait_until,
)


class Report(BaseModel):
    schema_version: ClassVar[str] = "2"
    report_id: str
    amount: Decimal
    notes: str = ""


class ReportJobs(Producer):
    """Typed, prioritized, ordered, tracked; bodies above 100 bytes go to S3."""

    channel = "reports"
    ordered = True
    priorities = ("high", "low")
    model = Report
    offload_threshold = 100
    track_status = True


class Nightly(Producer):
    channel = "nightly"


class OrderedNightly(Producer):
    channel = "nightly"
    ordered = True


def _wait_for(sqs, url: str, timeout: float = 20.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = drain(sqs, url)
        if got:
            return got
        time.sleep(0.3)
    return []


def _schedules(clients, settings) -> list[str]:
    scheduler = clients.client("scheduler")
    try:
        pages = scheduler.get_paginator("list_schedules").paginate(
            GroupName=schedule_group_name(settings.namespace))
        return [s["Name"] for page in pages for s in page["Schedules"]]
    except scheduler.exceptions.ResourceNotFoundException:
        return []


def test_a_scheduled_job_fires_once_with_every_attribute_intact(settings, clients):
    # Given a typed, prioritized, offloaded push on an ordered channel (any `at` is a schedule)
    producer = ReportJobs(settings=settings, clients=clients)
    body = {"report_id": "r-1", "amount": "12.50", "notes": "x" * 300}
    # (what the producer creates is read from its request: under load the schedule can fire and
    # delete itself before a listing after the push; a clean-clone CI run at load 11 saw none)
    created: list[dict] = []
    pushed_at = time.time()
    with injected(clients, "provide-client-params.scheduler.CreateSchedule",
                  lambda params, **_: created.append(dict(params))):
        job_id = producer.push(body, routing_key="REPORT.DAILY", priority="high",
                               max_attempts=2, meta_headers={"locale": "de_DE"},
                               delay=timedelta(seconds=6))
    producer.status.close()
    name = schedule_name("reports", job_id)
    assert [c["Name"] for c in created] == [name]
    schedule = created[0]
    assert schedule["GroupName"] == schedule_group_name(settings.namespace)
    assert schedule["ActionAfterCompletion"] == "DELETE"
    assert schedule["Target"]["Arn"] == "arn:aws:scheduler:::aws-sdk:sqs:sendMessage"
    assert schedule["Target"]["DeadLetterConfig"]["Arn"].endswith(
        schedule_dlq_name(settings.namespace))

    # When the endpoint's scheduler fires it (about a second after it is due)
    sqs = clients.client("sqs")
    high = queue_url(sqs, f"{settings.namespace}-reports-high.fifo")
    received = _wait_for(sqs, high)

    # Then exactly one message arrived, on the level's queue, with every attribute of the push
    assert len(received) == 1
    raw = received[0]
    attributes = raw["MessageAttributes"]
    assert attributes["message_id"]["StringValue"] == job_id
    assert attributes[SCHEMA_VERSION_ATTRIBUTE]["StringValue"] == "2"
    assert EXTENDED_SIZE_ATTRIBUTE in attributes
    assert attributes["max_attempts"]["StringValue"] == "2"
    assert attributes["routing_key"]["StringValue"] == "REPORT.DAILY"
    # (its meta headers gain the scheduler's mark: the due time, by which its consumer claims it)
    headers = json.loads(attributes["meta_headers"]["StringValue"])
    assert headers.pop("messenger-scheduled").endswith("Z")
    assert headers == {"locale": "de_DE"}
    assert raw["Attributes"]["MessageGroupId"] == "reports"
    message = decode(raw, clients.client("s3"))
    assert message.body == {"report_id": "r-1", "amount": "12.50", "notes": "x" * 300}
    assert message.message_id == job_id
    # And the schedule deleted itself
    assert _schedules(clients, settings) == []
    # And the status timeline starts SCHEDULED, with the due time: 6 s from the push (not from
    # the record's own stamp, which a push slowed by load 11 took after the 6 s had passed)
    timeline = StatusStore(clients, settings).timeline(job_id)
    assert timeline[0].event is StatusEvent.SCHEDULED
    assert timeline[0].due_at is not None and timeline[0].due_at >= pushed_at + 6


def test_within_15_minutes_a_standard_channel_uses_delay_seconds(settings, clients):
    producer = Nightly(settings=settings, clients=clients)
    sent: list[dict] = []
    before = time.time()
    with injected(clients, "provide-client-params.sqs.SendMessage",
                  lambda params, **_: sent.append(dict(params))):
        job_id = producer.push({"n": 1}, delay=2)
    sqs = clients.client("sqs")
    url = queue_url(sqs, f"{settings.namespace}-nightly")
    # No schedule: SQS hides the message for 2 seconds itself
    assert [p.get("DelaySeconds") for p in sent] == [2]
    assert _schedules(clients, settings) == []
    received = _wait_for(sqs, url, timeout=10)
    assert [m["MessageAttributes"]["message_id"]["StringValue"] for m in received] == [job_id]
    # (never before the 2 s: SQS's own stamps, so a slow machine cannot fail it)
    attributes = received[0]["Attributes"]
    waited = int(attributes["ApproximateFirstReceiveTimestamp"]) - int(
        attributes["SentTimestamp"])
    assert waited >= 2000 and time.time() >= before + 2


def test_beyond_15_minutes_a_standard_channel_schedules_the_job(settings, clients, endpoint):
    # Given a job due in two hours
    producer = Nightly(settings=settings, clients=clients)
    at = datetime.now(UTC) + timedelta(hours=2)
    job_id = producer.push({"n": 2}, at=at)
    assert _schedules(clients, settings) == [schedule_name("nightly", job_id)]
    sqs = clients.client("sqs")
    url = queue_url(sqs, f"{settings.namespace}-nightly")

    # When a scheduler whose clock says it is due makes a pass (the endpoint's loop, moved on)
    firer = ScheduleFirer(local_clients(endpoint), clock=lambda: at.timestamp() + 1)
    assert firer.run_once() == 1

    # Then the job arrives once and its schedule is gone
    received = drain(sqs, url)
    assert [m["MessageAttributes"]["message_id"]["StringValue"] for m in received] == [job_id]
    assert _schedules(clients, settings) == []
    assert firer.run_once() == 0


def test_push_many_with_a_time_routes_each_item_like_push(settings, clients):
    from messenger import PushItem

    producer = Nightly(settings=settings, clients=clients)
    # When a call's items are due in two hours, one of them invalid (dedup_id: ordered only)
    result = producer.push_many([{"n": 1}, PushItem({"n": 2}, dedup_id="x"), {"n": 3}],
                                delay=timedelta(hours=2))
    # Then the good ones are one schedule each, and the bad one is reported, not raised
    assert [f.index for f in result.failures] == [1] and "dedup_id" in result.failures[0].reason
    scheduled = {job.job_id for job in ScheduleStore(clients, settings).list("nightly")}
    assert scheduled == {result.message_ids[0], result.message_ids[2]}
    # And within SQS's 15 minutes they wait in the queue (DelaySeconds), one message each
    soon = producer.push_many([{"n": 4}, {"n": 5}], delay=1)
    sqs = clients.client("sqs")
    received = _wait_for(sqs, queue_url(sqs, f"{settings.namespace}-nightly"), timeout=10)
    time.sleep(0.5)
    received += drain(sqs, queue_url(sqs, f"{settings.namespace}-nightly"))
    assert sorted(m["MessageAttributes"]["message_id"]["StringValue"] for m in received) == \
        sorted(soon.message_ids)
    # And a wrong time refuses the whole call before anything is sent
    with pytest.raises(InvalidMessage, match="in the past"):
        producer.push_many([{"n": 6}], at=datetime(2020, 1, 1, tzinfo=UTC))


def test_a_cancelled_job_never_fires(settings, clients, endpoint):
    # Given a job scheduled an hour out (the endpoint's own scheduler leaves it alone), and a
    # second one beside it, not cancelled
    producer = OrderedNightly(settings=settings, clients=clients)
    at = datetime.now(UTC) + timedelta(hours=1)
    job_id = producer.push({"n": 3}, at=at)
    kept_id = producer.push({"n": 30}, at=at)
    store = ScheduleStore(clients, settings)
    assert sorted(job.job_id for job in store.list("nightly")) == sorted([job_id, kept_id])

    # When it is cancelled
    cancelled = store.cancel(job_id)

    # Then a scheduler whose clock is past their time (the endpoint's loop, moved on) fires
    # only the other one, however long the steps above took
    assert cancelled.job_id == job_id
    firer = ScheduleFirer(local_clients(endpoint), clock=lambda: at.timestamp() + 1)
    assert firer.run_once() == 1
    assert firer.run_once() == 0
    sqs = clients.client("sqs")
    received = drain(sqs, queue_url(sqs, f"{settings.namespace}-nightly.fifo"))
    assert [m["MessageAttributes"]["message_id"]["StringValue"] for m in received] == [kept_id]
    with pytest.raises(ScheduleNotFound, match="unknown, already fired or already cancelled"):
        store.cancel(job_id)


class TrackedNightly(Producer):
    channel = "nightly"
    track_status = True


def test_a_cancel_from_the_command_is_on_the_jobs_timeline(settings, clients, monkeypatch,
                                                            capsys):
    # Given a tracked job scheduled for tomorrow
    producer = TrackedNightly(settings=settings, clients=clients)
    job_id = producer.push({"n": 4}, delay=timedelta(days=1))
    producer.status.flush()  # SCHEDULED written
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    before = time.time()

    # When an operator cancels it with `messenger schedules cancel` (no --channel: the group
    # is scanned for it)
    assert cli.main(["schedules", "cancel", job_id, "--as", "ada@example.com"]) == 0

    # Then the command names who, and the timeline ends CANCELLED by them, at that time,
    # on the job's channel
    assert "by ada@example.com" in capsys.readouterr().out
    timeline = StatusStore(clients, settings).timeline(job_id)
    assert [r.event for r in timeline] == [StatusEvent.SCHEDULED, StatusEvent.CANCELLED]
    cancelled = timeline[-1]
    assert cancelled.actor == "ada@example.com" and cancelled.channel == "nightly"
    assert cancelled.error.startswith("cancelled by ada@example.com before it was due")
    assert before <= cancelled.at <= time.time()
    assert "CANCELLED" in render_timeline(job_id, timeline)
    assert "by=ada@example.com" in render_timeline(job_id, timeline)


def test_a_cancel_without_a_status_table_records_nothing(settings, clients):
    # Given an untracked namespace (no status table): the cancel works, nothing is created
    job_id = Nightly(settings=settings, clients=clients).push({"n": 5}, delay=timedelta(days=1))
    ScheduleStore(clients, settings).cancel(job_id, "nightly", actor="ada")
    assert not StatusStore(clients, settings).exists()


def test_a_firing_retried_twice_is_one_job(settings, clients, endpoint):
    # Given a job scheduled an hour out on an ordered channel, and one on a standard channel
    ordered_id = OrderedNightly(settings=settings, clients=clients).push(
        {"n": 4}, delay=timedelta(hours=1))
    standard_id = Nightly(settings=settings, clients=clients).push(
        {"n": 5}, delay=timedelta(hours=1))
    scheduler = clients.client("scheduler")
    group = schedule_group_name(settings.namespace)
    client_for = local_clients(endpoint)

    # When Scheduler's at-least-once delivery invokes each target twice (a retried firing)
    for channel, job_id in (("nightly", ordered_id), ("nightly", standard_id)):
        schedule = scheduler.get_schedule(Name=schedule_name(channel, job_id), GroupName=group)
        due = datetime.now(UTC)
        for attempt in (1, 2):
            invoke_target(client_for, schedule["Target"], schedule["Arn"], due, attempt)

    # Then the ordered channel holds one job (SQS drops the repeated deduplication id) and the
    # standard channel's two deliveries are one job id (which its consumer runs once: below)
    sqs = clients.client("sqs")
    ordered = drain(sqs, queue_url(sqs, f"{settings.namespace}-nightly.fifo"))
    assert [m["MessageAttributes"]["message_id"]["StringValue"] for m in ordered] == [ordered_id]
    standard = drain(sqs, queue_url(sqs, f"{settings.namespace}-nightly"))
    assert {m["MessageAttributes"]["message_id"]["StringValue"] for m in standard} == {
        standard_id}


class FiredJobs(Recording):
    """A plain consumer: not idempotent."""

    channel = "fired_jobs"


class FiredJobsProducer(Producer):
    channel = "fired_jobs"


@pytest.mark.parametrize("runtime_kind", ["fargate", "lambda"])
def test_a_firing_retried_twice_runs_its_job_once_on_a_plain_consumer(
        settings, clients, endpoint, runtime, runtime_kind):  # noqa: F811
    # Given a job scheduled an hour out on a standard channel
    job_id = FiredJobsProducer(settings=settings, clients=clients).push(
        {"n": 9}, delay=timedelta(hours=1))
    schedule = clients.client("scheduler").get_schedule(
        Name=schedule_name("fired_jobs", job_id), GroupName=schedule_group_name(
            settings.namespace))
    # When Scheduler's at-least-once delivery invokes its target twice (a retried firing)
    client_for = local_clients(endpoint)
    for attempt in (1, 2):
        invoke_target(client_for, schedule["Target"], schedule["Arn"], datetime.now(UTC),
                      attempt)
    sqs = clients.client("sqs")
    url = queue_url(sqs, f"{settings.namespace}-fired_jobs")
    consumer = FiredJobs(settings=settings, clients=clients, runtime=runtime)
    if runtime_kind == "fargate":
        run = Running(consumer)
        wait_until(lambda: consumer.named("completed") and consumer.named("duplicate_firing"),
                   20)
        run.stop()
    else:
        lambda_runtime = LambdaConsumerRuntime(consumer)
        source = LocalEventSource(sqs, url, "us-east-1")
        messages = wait_until(lambda: source.receive(10, wait_seconds=1), 10)
        if len(messages) < 2:
            messages += wait_until(lambda: source.receive(10, wait_seconds=1), 10)

        class Context:
            def get_remaining_time_in_millis(self) -> int:
                return 30_000

        source.invoke(lambda_runtime.handle, messages, Context())
    # Then the plain (not idempotent) consumer ran the job once, and deleted the repeat unrun
    assert [m.message_id for m in consumer.handled] == [job_id]
    (repeat,) = consumer.named("duplicate_firing")
    assert repeat.message_id == job_id and repeat.fields["claimed_by"]
    assert len(consumer.named("completed")) == 1
    assert drain(sqs, url) == []


class TrackedJobs(Recording):
    channel = "tracked_fired"
    track_status = True


class TrackedJobsProducer(Producer):
    channel = "tracked_fired"
    track_status = True


def test_a_fired_jobs_status_moves_scheduled_queued_received_completed(
        settings, clients, endpoint, runtime):  # noqa: F811
    # Given a tracked job scheduled an hour out
    producer = TrackedJobsProducer(settings=settings, clients=clients)
    job_id = producer.push({"n": 11}, delay=timedelta(hours=1))
    producer.status.close()
    schedule = clients.client("scheduler").get_schedule(
        Name=schedule_name("tracked_fired", job_id), GroupName=schedule_group_name(
            settings.namespace))
    # When Scheduler fires it (straight into SQS: no producer records QUEUED) and it runs
    invoke_target(local_clients(endpoint), schedule["Target"], schedule["Arn"],
                  datetime.now(UTC))
    consumer = TrackedJobs(settings=settings, clients=clients, runtime=runtime)
    run = Running(consumer)
    store = StatusStore(clients, settings)
    # Then its timeline reads SCHEDULED, QUEUED (by the scheduler), RECEIVED, ..., COMPLETED
    events = wait_until(lambda: (found := store.timeline(job_id)) and found[-1].event is
                        StatusEvent.COMPLETED and found, 30)
    consumer.request_shutdown()
    run.thread.join(20)
    names = [r.event for r in events]
    assert names[:3] == [StatusEvent.SCHEDULED, StatusEvent.QUEUED, StatusEvent.RECEIVED]
    assert names[-1] is StatusEvent.COMPLETED
    assert events[1].actor == "scheduler"


def test_a_fired_job_whose_claim_cannot_be_written_is_retried_not_run_nor_lost(
        settings, clients, endpoint, runtime):  # noqa: F811
    # Given a fired job in the queue, and a dedup table that throttles every write
    job_id = FiredJobsProducer(settings=settings, clients=clients).push(
        {"n": 10}, delay=timedelta(hours=1))
    schedule = clients.client("scheduler").get_schedule(
        Name=schedule_name("fired_jobs", job_id), GroupName=schedule_group_name(
            settings.namespace))
    invoke_target(local_clients(endpoint), schedule["Target"], schedule["Arn"],
                  datetime.now(UTC))
    sqs = clients.client("sqs")
    url = queue_url(sqs, f"{settings.namespace}-fired_jobs")
    consumer = FiredJobs(settings=settings.with_changes(retry_budget_seconds=1.0),
                         clients=clients, runtime=runtime)
    source = LocalEventSource(sqs, url, "us-east-1")
    messages = wait_until(lambda: source.receive(10, wait_seconds=1), 10)

    class Context:
        def get_remaining_time_in_millis(self) -> int:
            return 30_000

    # When the consumer gets it while the claim cannot be written
    with injected(clients, "before-send.dynamodb.PutItem", Throttle(1.0, {"PutItem"})):
        source.invoke(LambdaConsumerRuntime(consumer).handle, messages, Context())
    # Then the handler did not run, and the job is back in its queue for a later attempt
    assert consumer.handled == []
    (retried,) = consumer.named("retried")
    assert "Throttl" in retried.fields["error"] or "budget" in retried.fields["error"]
    hidden = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    assert hidden["ApproximateNumberOfMessagesNotVisible"] == "1"


def test_a_firing_that_keeps_failing_goes_to_the_schedule_dlq(settings, clients, endpoint):
    # Given a scheduled job whose queue is deleted before it is due
    producer = Nightly(settings=settings, clients=clients)
    at = datetime.now(UTC) + timedelta(hours=1)
    job_id = producer.push({"n": 6}, at=at)
    sqs = clients.client("sqs")
    sqs.delete_queue(QueueUrl=queue_url(sqs, f"{settings.namespace}-nightly"))
    now = [at.timestamp() + 1]
    firer = ScheduleFirer(local_clients(endpoint), clock=lambda: now[0])

    # When the scheduler tries past its retry policy (20 retries, backoff capped at a minute)
    for _ in range(25):
        firer.run_once()
        now[0] += 61

    # Then the request is in the schedule DLQ with the error, and the schedule is gone
    dead = drain(sqs, queue_url(sqs, schedule_dlq_name(settings.namespace)))
    assert len(dead) == 1
    assert dead[0]["MessageAttributes"]["ERROR_CODE"]["StringValue"].endswith(
        "NonExistentQueue")
    request = json.loads(dead[0]["Body"])
    assert request["MessageAttributes"]["message_id"]["StringValue"] == job_id
    assert _schedules(clients, settings) == []


def _cli(local_endpoint, settings, *args: str):
    import os
    import subprocess
    import sys

    env = {**os.environ, **local_endpoint.env(), "MESSENGER_NAMESPACE": settings.namespace}
    return subprocess.run([sys.executable, "-m", "messenger", "schedules", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_schedules_cli_lists_and_cancels(settings, clients, local_endpoint):
    # Given two jobs on a channel, due in one and two hours
    producer = Nightly(settings=settings, clients=clients)
    later = producer.push({"n": 7}, delay=timedelta(hours=2))
    sooner = producer.push({"n": 8}, delay=timedelta(hours=1))

    listed = _cli(local_endpoint, settings, "list", "nightly")
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()
    assert rows[1].startswith(sooner) and rows[2].startswith(later)
    assert "in 59m" in rows[1] or "in 1h" in rows[1]
    assert rows[-1] == "2 scheduled job(s) on nightly"

    cancelled = _cli(local_endpoint, settings, "cancel", sooner)
    assert cancelled.returncode == 0 and f"cancelled scheduled job {sooner}" in cancelled.stdout
    # Then cancelling again, or an id never scheduled, exits 2 with one clear line
    again = _cli(local_endpoint, settings, "cancel", sooner)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        f"messenger: no scheduled job {sooner!r} in schedule group "
        f"'{settings.namespace}-messenger': unknown, already fired or already cancelled"]
    unknown = _cli(local_endpoint, settings, "cancel", "nope", "--channel", "nightly")
    assert unknown.returncode == 2 and "'nope'" in unknown.stderr
    assert json.loads(_cli(local_endpoint, settings, "list", "nightly", "--json").stdout)[0][
        "job_id"] == later
