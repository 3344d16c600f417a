"""Cancel means never runs (issue 49 item 10), on the moto server: a cancel takes the job's
claim before it deletes the schedule (`messenger.jobs.fired.cancel`), so a firing that raced it
is deleted unrun and recorded CANCELLED, on both runtimes; a cancel after a consumer took the
firing says "too late: fired at T" and the command exits 2; 30 jobs due in one second, cancelled
as they fire: every job whose cancel said "cancelled" never ran, every other one ran once."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from messenger import ConsumerSettings, MultiProducer, Producer
from messenger.aws import ClientFactory
from messenger.channel import schedule_group_name
from messenger.jobs.dedup import DedupTable
from messenger.jobs.schedule_store import ScheduleNotFound, ScheduleStore, TooLate
from messenger.jobs.schedules import schedule_name
from messenger.jobs.status import StatusEvent, StatusStore
from messenger.settings import Settings
from messenger.tools.scheduler_fire import ScheduleFirer, invoke_target, local_clients
from tests.integration.helpers import queue_url
from tests.integration.test_consumer_runtime import (  # noqa: F401 - fixtures
    Recording,
    Running,
    runtime,
    wait_until,
)
from tests.integration.test_job_ids import consume, visible


class Reminders(Producer):
    channel = "reminders"
    track_status = True


class ReminderJobs(Recording):
    channel = "reminders"
    track_status = True


def fire(clients: ClientFactory, settings: Settings, endpoint: str, job_id: str) -> None:
    """Scheduler sends the job's message now, its schedule still there (as when a
    DeleteSchedule races a firing on AWS)."""
    schedule = clients.client("scheduler").get_schedule(
        Name=schedule_name("reminders", job_id),
        GroupName=schedule_group_name(settings.namespace))
    invoke_target(local_clients(endpoint), schedule["Target"], schedule["Arn"],
                  datetime.now(UTC))


@pytest.mark.parametrize("kind", ["fargate", "lambda"])
def test_a_firing_that_raced_a_cancel_is_deleted_unrun_and_recorded_cancelled(
        settings: Settings, clients: ClientFactory, endpoint: str,
        runtime: ConsumerSettings, kind: str) -> None:  # noqa: F811
    # Given a tracked job due in an hour, whose firing reaches SQS while the cancel runs
    producer = Reminders(settings=settings, clients=clients)
    job_id = producer.push({"n": 1}, delay=timedelta(hours=1))
    producer.status.close()
    fire(clients, settings, endpoint, job_id)

    # When an operator cancels it: the cancel answers "cancelled"
    cancelled = ScheduleStore(clients, settings).cancel(job_id, "reminders", actor="ada")
    assert cancelled.job_id == job_id

    # Then its consumer deletes the fired copy unrun
    sqs = clients.client("sqs")
    url = queue_url(sqs, f"{settings.namespace}-reminders")
    consumer = ReminderJobs(settings=settings, clients=clients, runtime=runtime)
    consume(consumer, sqs, url, kind, lambda: consumer.named("cancelled_unrun"), expected=1)
    assert consumer.handled == []
    (unrun,) = consumer.named("cancelled_unrun")
    assert unrun.message_id == job_id and unrun.fields["by"] == "ada"
    assert consumer.named("completed") == []
    wait_until(lambda: visible(sqs, url) == 0, 15)
    # And the job's timeline ends CANCELLED twice (the cancel's, then the consumer's: deleted
    # unrun), and never says it completed or failed
    store = StatusStore(clients, settings)
    events = wait_until(lambda: (found := store.timeline(job_id)) and len(
        [r for r in found if r.event is StatusEvent.CANCELLED]) == 2 and found, 20)
    assert not {StatusEvent.COMPLETED, StatusEvent.FAILED} & {r.event for r in events}
    assert events[-1].event is StatusEvent.CANCELLED
    assert events[-1].actor == "ada" and "deleted unrun" in events[-1].error
    # And no schedule is left
    assert ScheduleStore(clients, settings).list("reminders") == []


def _cli(local_endpoint: Any, settings: Settings, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **local_endpoint.env(), "MESSENGER_NAMESPACE": settings.namespace}
    return subprocess.run([sys.executable, "-m", "messenger", "schedules", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_cancel_after_a_consumer_took_the_firing_is_too_late_and_exits_2(
        settings: Settings, clients: ClientFactory, endpoint: str, local_endpoint: Any,
        runtime: ConsumerSettings) -> None:  # noqa: F811
    # Given a job whose firing its consumer took and ran, its schedule not yet deleted
    job_id = Reminders(settings=settings, clients=clients).push({"n": 2},
                                                                delay=timedelta(hours=1))
    fire(clients, settings, endpoint, job_id)
    sqs = clients.client("sqs")
    consumer = ReminderJobs(settings=settings, clients=clients, runtime=runtime)
    before = time.time()
    consume(consumer, sqs, queue_url(sqs, f"{settings.namespace}-reminders"), "lambda",
            lambda: consumer.named("completed"), expected=1)

    # When an operator cancels it
    late = _cli(local_endpoint, settings, "cancel", job_id, "--as", "ada")

    # Then the command exits 2 with one line: too late, fired at the time the consumer took it
    assert late.returncode == 2, late.stdout
    (line,) = late.stderr.strip().splitlines()
    assert line.startswith(f"messenger: too late: scheduled job {job_id!r} fired at ")
    fired_at = datetime.strptime(line.split(" fired at ")[1][:19], "%Y-%m-%d %H:%M:%S")
    assert int(before) - 1 <= fired_at.replace(tzinfo=UTC).timestamp() <= time.time()
    assert line.endswith("; not cancelled")
    # And once Scheduler deleted the fired schedule, a cancel naming the channel says the same
    clients.client("scheduler").delete_schedule(
        Name=schedule_name("reminders", job_id),
        GroupName=schedule_group_name(settings.namespace))
    again = _cli(local_endpoint, settings, "cancel", job_id, "--channel", "reminders")
    assert again.returncode == 2 and "too late" in again.stderr and "fired at" in again.stderr


class Bursts(Producer):
    channel = "bursts"


class BurstJobs(Recording):
    channel = "bursts"


def test_thirty_jobs_due_in_one_second_cancelled_as_the_first_fires(
        settings: Settings, clients: ClientFactory, endpoint: str,
        runtime: ConsumerSettings) -> None:  # noqa: F811
    # Given 30 jobs due in the same second, and their consumer running
    at = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    producer = Bursts(settings=settings, clients=clients)
    ids = [str(producer.push({"n": n}, at=at)) for n in range(30)]
    consumer = BurstJobs(settings=settings, clients=clients, runtime=runtime)
    run = Running(consumer)
    wait_until(lambda: consumer.resources, 30)
    DedupTable(clients, settings).ensure()  # deployed with the platform (auto: made once)
    # And a scheduler pass at their due time, in a thread (the endpoint's firing loop, moved
    # on), that fires its first job at once and each next one after one more cancel answered:
    # the firings and the cancels interleave on any machine, however busy. It fires them in
    # the order ListSchedules gives them.
    scheduler = clients.client("scheduler")
    by_name = {schedule_name("bursts", job_id): job_id for job_id in ids}
    in_firing_order = [by_name[s["Name"]] for page in scheduler.get_paginator(
        "list_schedules").paginate(GroupName=schedule_group_name(settings.namespace))
        for s in page["Schedules"]]
    assert sorted(in_firing_order) == sorted(ids)
    firer_clients = local_clients(endpoint)
    first_fired, answered = threading.Event(), threading.Semaphore(0)
    fired: list[str] = []

    def pace(params: dict[str, Any], **_: Any) -> None:
        if fired:
            answered.acquire(timeout=30)
        fired.append(params["MessageAttributes"]["message_id"]["StringValue"])

    firer_clients("sqs").meta.events.register("provide-client-params.sqs.SendMessage", pace)
    firer_clients("sqs").meta.events.register(
        "after-call.sqs.SendMessage", lambda **_: first_fired.set())
    firer = ScheduleFirer(firer_clients, clock=lambda: at.timestamp() + 1)
    firing = threading.Thread(target=firer.run_once, daemon=True)
    try:
        firing.start()
        # When an operator cancels all 30 as the first fires, the last to fire first
        assert first_fired.wait(30)
        store = ScheduleStore(clients, settings)
        answers: dict[str, str] = {}
        for job_id in reversed(in_firing_order):
            try:
                store.cancel(job_id, "bursts", actor="ada")
                answers[job_id] = "cancelled"
            except TooLate as late:
                assert f"scheduled job {job_id!r} fired at " in str(late)
                answers[job_id] = "too late"
            except ScheduleNotFound:
                answers[job_id] = "not found"  # fired; its copy not taken by a consumer yet
            answered.release()
        firing.join(60)
        assert not firing.is_alive()
        # (every job not cancelled runs: wait for each, then for the queue to be empty)
        ran = {job_id for job_id, answer in answers.items() if answer != "cancelled"}
        wait_until(lambda: {m.message_id for m in consumer.handled} >= ran, 60)
        url = queue_url(clients.client("sqs"), f"{settings.namespace}-bursts")
        wait_until(lambda: visible(clients.client("sqs"), url) == 0, 30)
    finally:
        run.stop()

    # Then every job whose cancel said "cancelled" never ran; each other job ran exactly once
    handled = [m.message_id for m in consumer.handled]
    cancelled = {job_id for job_id, answer in answers.items() if answer == "cancelled"}
    assert cancelled.isdisjoint(handled)
    assert sorted(handled) == sorted(ran)
    assert len(answers) == 30
    # (a cancelled job that fired all the same was deleted unrun where it arrived)
    assert {e.message_id for e in consumer.named("cancelled_unrun")} <= cancelled
    assert ScheduleStore(clients, settings).list("bursts") == []
    # (the race was run: the 15 cancels made before the pass reached their jobs said
    # cancelled, whatever the machine's speed; the first job fired before any cancel)
    assert set(in_firing_order[15:]) <= cancelled
    assert fired[0] == in_firing_order[0]
    print(f"answers: {sorted(answers.values()).count('cancelled')} cancelled, "
          f"{sorted(answers.values()).count('too late')} too late, "
          f"{sorted(answers.values()).count('not found')} not found; "
          f"{len(consumer.named('cancelled_unrun'))} deleted unrun")


def test_the_local_firing_loop_never_fires_a_schedule_deleted_during_its_pass(
        settings: Settings, clients: ClientFactory, endpoint: str) -> None:
    # Given two jobs due in the same second
    at = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    producer = Bursts(settings=settings, clients=clients)
    ids = [str(producer.push({"n": n}, at=at)) for n in range(2)]
    group = schedule_group_name(settings.namespace)
    firer_clients = local_clients(endpoint)
    sent: list[str] = []

    def cancel_the_other(params: dict[str, Any], **_: Any) -> None:
        # a cancel that deletes the other schedule while the pass fires the first one
        sent.append(params["MessageAttributes"]["message_id"]["StringValue"])
        if len(sent) == 1:
            other = next(job_id for job_id in ids if job_id != sent[0])
            clients.client("scheduler").delete_schedule(
                Name=schedule_name("bursts", other), GroupName=group)

    firer_clients("sqs").meta.events.register("provide-client-params.sqs.SendMessage",
                                              cancel_the_other)
    # When one pass of the loop, which listed both, fires what is due
    completed = ScheduleFirer(firer_clients, clock=lambda: at.timestamp() + 1).run_once()

    # Then only the first was sent: the deleted one was not fired from the pass's list
    assert completed == 1 and len(sent) == 1
    url = queue_url(clients.client("sqs"), f"{settings.namespace}-bursts")
    assert visible(clients.client("sqs"), url) == 1


class Alerts(MultiProducer):
    channel = "alerts"


class MailAlerts(Recording):
    channel = "alerts.mail"


class SmsAlerts(Recording):
    channel = "alerts.sms"


def test_a_cancelled_exchange_job_runs_on_none_of_its_channels(
        settings: Settings, clients: ClientFactory, endpoint: str,
        runtime: ConsumerSettings) -> None:  # noqa: F811
    # Given an exchange with two consumer channels, running
    runs = [Running(cls(settings=settings, clients=clients, runtime=runtime))
            for cls in (MailAlerts, SmsAlerts)]
    try:
        for run in runs:
            wait_until(lambda run=run: run.consumer.resources, 30)
        # And a job published to it, due in an hour
        job_id = Alerts(settings=settings, clients=clients).push({"n": 1},
                                                                 delay=timedelta(hours=1))
        schedule = clients.client("scheduler").get_schedule(
            Name=schedule_name("alerts", job_id),
            GroupName=schedule_group_name(settings.namespace))
        # When it is cancelled, and a firing Scheduler had under way reaches both queues after
        # the cancel answered (a DeleteSchedule racing a firing)
        ScheduleStore(clients, settings).cancel(job_id, "alerts", actor="ada")
        invoke_target(local_clients(endpoint), schedule["Target"], schedule["Arn"],
                      datetime.now(UTC))
        # Then each channel's consumer deletes its copy unrun
        for run in runs:
            wait_until(lambda run=run: run.consumer.named("cancelled_unrun"), 30)
    finally:
        for run in runs:
            run.stop()
    for run in runs:
        assert run.consumer.handled == []
        (unrun,) = run.consumer.named("cancelled_unrun")
        assert unrun.message_id == job_id
