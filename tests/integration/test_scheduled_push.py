"""Scheduled pushes at their edges on the local endpoint: the `at`/`delay` range, 900 s as
DelaySeconds, a body offloaded on its schedule's input size, one job id one schedule, names
that never meet, no S3 object left by a refused push, SCHEDULED before the schedule exists."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError, EndpointConnectionError

from messenger import Producer
from messenger.channel import schedule_group_name
from messenger.errors import InvalidMessage
from messenger.jobs.schedule_store import ScheduleNotFound, ScheduleStore
from messenger.jobs.schedules import MAX_AHEAD_SECONDS, schedule_name, target_input
from messenger.jobs.status import StatusEvent, StatusStore
from messenger.offload import EXTENDED_SIZE_ATTRIBUTE
from messenger.produce.scheduled import SCHEDULER_MAX_INPUT_BYTES
from messenger.tools.scheduler_fire import invoke_target, local_clients
from tests.faults import aws_response, injected
from tests.integration.helpers import decode, drain, queue_url


class Later(Producer):
    channel = "later"


class TrackedLater(Producer):
    channel = "later"
    track_status = True


class OffloadedLater(Producer):
    channel = "later"
    offload_threshold = 100


def _created(clients) -> tuple[list[dict[str, Any]], Any]:
    """The CreateSchedule requests a block makes, and the hook that records them."""
    created: list[dict[str, Any]] = []
    return created, lambda params, **_: created.append(dict(params))


def _names(clients, settings) -> list[str]:
    scheduler = clients.client("scheduler")
    try:
        pages = scheduler.get_paginator("list_schedules").paginate(
            GroupName=schedule_group_name(settings.namespace))
        return sorted(s["Name"] for page in pages for s in page["Schedules"])
    except scheduler.exceptions.ResourceNotFoundException:
        return []


def _input(clients, settings, name: str) -> dict[str, Any]:
    schedule = clients.client("scheduler").get_schedule(
        Name=name, GroupName=schedule_group_name(settings.namespace))
    return json.loads(schedule["Target"]["Input"])


# -- item 3: one range ------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{"at": datetime.max.replace(tzinfo=UTC)},
                                    {"delay": timedelta.max},
                                    {"at": datetime(2099, 1, 1, tzinfo=UTC)}])
def test_a_push_beyond_366_days_is_an_invalid_message_and_sends_nothing(settings, clients,
                                                                        kwargs):
    producer = Later(settings=settings, clients=clients)
    calls: list[str] = []
    with injected(clients, "before-call", lambda model, **_: calls.append(model.name)):
        with pytest.raises(InvalidMessage, match="366 days"):
            producer.push({"n": 1}, **kwargs)
    assert calls == []
    # And the last second of the range is a schedule
    due = producer.push({"n": 2}, delay=MAX_AHEAD_SECONDS)
    assert due.scheduled and _names(clients, settings) == [schedule_name("later", due)]


# -- item 4: 900 s is DelaySeconds --------------------------------------------------------------
def test_a_delay_of_900_seconds_is_sqs_delay_seconds_not_a_schedule(settings, clients):
    producer = Later(settings=settings, clients=clients)
    sent: list[dict[str, Any]] = []
    created, on_create = _created(clients)
    with injected(clients, "provide-client-params.sqs.SendMessage",
                  lambda params, **_: sent.append(dict(params))), \
            injected(clients, "provide-client-params.scheduler.CreateSchedule", on_create):
        pushed = producer.push({"n": 1}, delay=900)
        at_pushed = producer.push({"n": 2}, at=datetime.now(UTC) + timedelta(seconds=900))
    assert created == []
    assert [p.get("DelaySeconds") for p in sent] == [900, 900]
    assert not pushed.scheduled and not at_pushed.scheduled
    # And the message waits in the queue (SQS hides it for 900 s)
    sqs = clients.client("sqs")
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue_url(sqs, f"{settings.namespace}-later"),
        AttributeNames=["ApproximateNumberOfMessagesDelayed"])["Attributes"]
    assert attributes["ApproximateNumberOfMessagesDelayed"] == "2"


# -- item 5: offloaded on the schedule's input size ---------------------------------------------
def test_a_body_that_doubles_inside_the_schedules_input_is_offloaded_and_runs(
        settings, clients, endpoint):
    # Given a body of 70,000 '"': 140 KB encoded (under the 256 KiB offload threshold), 280 KB
    # escaped again inside a schedule's input (Scheduler takes 256 KB)
    producer = Later(settings=settings, clients=clients)
    body = '"' * 70_000
    created, on_create = _created(clients)
    with injected(clients, "provide-client-params.scheduler.CreateSchedule", on_create):
        job_id = producer.push(body, delay=3600)
    # Then it is scheduled, its body in S3 and its input within Scheduler's limit
    assert job_id.scheduled and not job_id.duplicate
    [schedule] = created
    request = json.loads(schedule["Target"]["Input"])
    assert EXTENDED_SIZE_ATTRIBUTE in request["MessageAttributes"]
    assert len(schedule["Target"]["Input"].encode()) < SCHEDULER_MAX_INPUT_BYTES
    # And when it fires, the job has its whole body
    invoke_target(local_clients(endpoint), schedule["Target"], "arn:local", datetime.now(UTC))
    sqs = clients.client("sqs")
    [raw] = drain(sqs, queue_url(sqs, f"{settings.namespace}-later"))
    message = decode(raw, clients.client("s3"))
    assert message.message_id == job_id and message.body == body


# -- item 11: one job id, one schedule ----------------------------------------------------------
def test_a_second_push_of_a_scheduled_job_id_is_a_duplicate_naming_the_first_due_time(
        settings, clients):
    # Given job 'invoice-11' pushed for two hours from now
    producer = TrackedLater(settings=settings, clients=clients)
    first = producer.push({"v": 1}, message_id="invoice-11", delay=timedelta(hours=2))
    assert first.scheduled and not first.duplicate
    # When it is pushed again with another body and due time
    second = producer.push({"v": 2}, message_id="invoice-11", delay=timedelta(hours=5))
    # Then the answer is a duplicate, due when the first is; the first stands, alone
    assert second == "invoice-11" and second.duplicate and second.scheduled
    assert second.due == first.due
    name = schedule_name("later", "invoice-11")
    assert _names(clients, settings) == [name]
    assert json.loads(_input(clients, settings, name)["MessageBody"]) == {"v": 1}
    # And the timeline says SCHEDULED (the first due time) then DUPLICATE, no second SCHEDULED
    producer.status.flush()
    timeline = StatusStore(clients, settings).timeline("invoice-11")
    assert [r.event for r in timeline] == [StatusEvent.SCHEDULED, StatusEvent.DUPLICATE]
    assert timeline[0].due_at == first.due.timestamp()


def test_a_create_applied_but_answered_with_an_error_is_not_its_own_duplicate(
        settings, clients):
    # Given CreateSchedule applied on the server, then its answer lost (a dropped connection);
    # a budget that a busy machine's slow first attempt cannot use up (the retry is the point)
    producer = Later(settings=settings.with_changes(retry_budget_seconds=60), clients=clients)
    lost: list[str] = []

    def drop_answer(http_response, parsed, model, **_):
        if not lost:
            lost.append(model.name)
            raise EndpointConnectionError(endpoint_url="https://scheduler.example/")

    with injected(clients, "after-call.scheduler.CreateSchedule", drop_answer):
        pushed = producer.push({"v": 1}, message_id="retried-1", delay=timedelta(hours=2))
    # Then the retry finds the schedule this push made: scheduled, not a duplicate
    assert lost == ["CreateSchedule"]
    assert pushed.scheduled and not pushed.duplicate
    assert _names(clients, settings) == [schedule_name("later", "retried-1")]


# -- item 12: names never meet, find checks the id ----------------------------------------------
def test_an_id_shaped_like_another_ids_hash_is_another_job(settings, clients):
    # Given 'report/7' (named by its hash) and 'h' + the first 38 hex digits of that hash
    producer = Later(settings=settings, clients=clients)
    lookalike = "h" + hashlib.sha256(b"report/7").hexdigest()[:38]
    first = producer.push({"v": 1}, message_id="report/7", delay=timedelta(hours=2))
    second = producer.push({"v": 2}, message_id=lookalike, delay=timedelta(hours=3))
    # Then both are scheduled, each its own schedule
    assert not first.duplicate and not second.duplicate
    assert len(_names(clients, settings)) == 2
    # And cancelling the second leaves the first
    store = ScheduleStore(clients, settings)
    assert store.cancel(lookalike, "later").job_id == lookalike
    assert store.find(lookalike, "later") is None
    waiting = store.find("report/7", "later")
    assert waiting is not None and waiting.job_id == "report/7"
    assert [job.job_id for job in store.list("later")] == ["report/7"]


def test_find_and_cancel_check_the_job_id_a_schedule_holds(settings, clients):
    # Given a schedule made before hashed names had their '.': 'report/7' under its old name,
    # 'reports.h<38 hex>', and a channel's name that holds another job's input
    store = ScheduleStore(clients, settings)
    sqs = clients.client("sqs")
    producer = Later(settings=settings, clients=clients)
    producer.push({"warm": 1})  # the queue exists
    url = queue_url(sqs, f"{settings.namespace}-later")
    role, dlq = store.wiring()
    legacy = "h" + hashlib.sha256(b"report/7").hexdigest()[:38]

    def make(name: str, job_id: str) -> None:
        request = target_input("sqs", url, "{}", {
            "message_id": {"DataType": "String", "StringValue": job_id}})
        clients.client("scheduler").create_schedule(
            Name=name, GroupName=store.group, ScheduleExpression="at(2030-01-01T00:00:00)",
            FlexibleTimeWindow={"Mode": "OFF"}, ActionAfterCompletion="DELETE",
            Target={"Arn": "arn:aws:scheduler:::aws-sdk:sqs:sendMessage", "RoleArn": role,
                    "Input": request, "DeadLetterConfig": {"Arn": dlq}})

    make(f"later.{legacy}", "report/7")
    make(schedule_name("later", "x/1"), "someone-else")
    # Then the old name's job is found, with or without its channel, and cancelled
    assert store.find("report/7", "later").name == f"later.{legacy}"
    assert store.find("report/7").name == f"later.{legacy}"
    # And the id a name was derived from is not proof: another job's schedule is not 'x/1'
    assert store.find("x/1", "later") is None
    with pytest.raises(ScheduleNotFound):
        store.cancel("x/1", "later")
    assert store.cancel("report/7", "later").job_id == "report/7"
    assert _names(clients, settings) == [schedule_name("later", "x/1")]


# -- item 13: a refused push leaves nothing in S3 -----------------------------------------------
def test_an_offloaded_push_due_past_its_bodys_expiry_uploads_nothing(settings, clients):
    producer = OffloadedLater(settings=settings, clients=clients)
    s3 = clients.client("s3")
    bucket = producer.provisioner.ensure_bucket()

    def objects() -> int:
        return int(s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0))

    before = objects()
    puts: list[str] = []
    with injected(clients, "before-call.s3.PutObject", lambda model, **_: puts.append("put")):
        with pytest.raises(InvalidMessage, match="offloaded to S3 and expires"):
            producer.push({"text": "x" * 500}, delay=timedelta(days=2))
    assert puts == [] and objects() == before
    assert _names(clients, settings) == []
    # And within the horizon the same push is offloaded and scheduled
    assert producer.push({"text": "x" * 500}, delay=timedelta(hours=20)).scheduled
    assert objects() == before + 1


# -- item 14: SCHEDULED before the schedule exists ----------------------------------------------
def test_the_scheduled_record_is_written_before_the_schedule_is_created(settings, clients):
    producer = TrackedLater(settings=settings, clients=clients)
    status = StatusStore(clients, settings)
    status.ensure_table()  # the table is there: what the hook reads is the job's records
    seen: list[list[StatusEvent]] = []

    def read_timeline(params, **_):
        job_id = json.loads(params["Target"]["Input"])["MessageAttributes"]["message_id"][
            "StringValue"]
        seen.append([r.event for r in status.timeline(job_id)])

    # When a tracked job is scheduled
    with injected(clients, "provide-client-params.scheduler.CreateSchedule", read_timeline):
        pushed = producer.push({"n": 1}, message_id="early-14", delay=timedelta(hours=1))
    # Then its SCHEDULED record was in the table when CreateSchedule went out (a job that
    # fires before the push returns cannot see its SCHEDULED written after its QUEUED)
    assert seen == [[StatusEvent.SCHEDULED]]
    [record] = status.timeline("early-14")
    assert record.due_at == pushed.due.timestamp()


def _validation_error(request, **_) -> AWSResponse:
    """Scheduler's 400 ValidationException on the wire (its rest-json protocol), as a role it
    cannot assume gets."""
    payload = b'{"message":"Invalid request provided: role cannot be assumed"}'
    headers = {"Content-Type": "application/json",
               "x-amzn-ErrorType": "ValidationException"}
    return aws_response(request.url, 400, headers, payload)


def test_a_refused_create_leaves_no_scheduled_record(settings, clients):
    producer = TrackedLater(settings=settings, clients=clients)
    producer.push({"warm": 1}, message_id="warm", delay=timedelta(hours=1))  # table, group
    # When Scheduler refuses the CreateSchedule
    with injected(clients, "before-send.scheduler.CreateSchedule", _validation_error):
        with pytest.raises(ClientError, match="ValidationException"):
            producer.push({"n": 1}, message_id="refused-14", delay=timedelta(hours=1))
    # Then there is no schedule, and no SCHEDULED for it: the timeline is empty
    assert _names(clients, settings) == [schedule_name("later", "warm")]
    producer.status.flush()
    assert StatusStore(clients, settings).timeline("refused-14") == []
