"""Cancelling scheduled jobs in bulk (`messenger.operations.scheduled.cancel_scheduled`, behind
the dashboard's Cancel of the ticked jobs) on the local endpoint: one answer per job, the rest
go on past an unknown or too-late job, and an AWS error stops the batch saying so."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from messenger import Producer
from messenger.jobs.fired import JobClaims
from messenger.jobs.schedule_store import ScheduleStore
from messenger.jobs.status import StatusEvent, StatusStore
from messenger.operations.scheduled import cancel_scheduled
from tests.faults import aws_response, injected


class Nightly(Producer):
    channel = "nightly"
    track_status = True


def waiting(settings, clients) -> list[str]:
    return [job.job_id for job in ScheduleStore(clients, settings).list("nightly")]


def test_each_job_gets_its_answer_and_the_rest_go_on(settings, clients):
    # Given three jobs due in an hour or more, one of which a consumer took a firing of first
    producer = Nightly(settings=settings, clients=clients)
    first, second, fired = (producer.push({"n": n}, delay=timedelta(hours=1 + n))
                            for n in range(3))
    producer.status.flush()
    assert JobClaims(clients, settings, "nightly").claim(fired, "sqs-message-1") is None

    # When an operator cancels them, an unknown id and the first one again, in one call
    report = cancel_scheduled(clients, settings, [first, "never-scheduled", fired, second,
                                                  first], "nightly", actor="ada")

    # Then each id is answered once, in the order given
    answers = {o.job_id: o for o in report.outcomes}
    assert [o.job_id for o in report.outcomes] == [first, "never-scheduled", fired, second]
    assert answers[first].cancelled and answers[second].cancelled
    assert answers[first].text == "cancelled by ada" and answers[first].job is not None
    assert answers[first].job.job_id == first
    # the unknown one says so, the fired one is too late (it runs), nothing stopped the rest
    unknown = answers["never-scheduled"]
    assert not unknown.cancelled and unknown.attempted and unknown.job is None
    assert "unknown, already fired or already cancelled" in unknown.text
    late = answers[fired]
    assert not late.cancelled and late.too_late
    assert late.text.startswith(f"too late: scheduled job {fired!r} fired at")
    assert (report.cancelled, report.result) == (2, "partial")
    assert report.summary().startswith(f"{first}: cancelled by ada; never-scheduled: no ")
    # And only the too-late job still waits; the cancelled ones are on their timelines
    assert waiting(settings, clients) == [fired]
    timeline = StatusStore(clients, settings).timeline(second)
    assert [r.event for r in timeline] == [StatusEvent.SCHEDULED, StatusEvent.CANCELLED]
    assert timeline[-1].actor == "ada"


def test_all_cancelled_is_done_none_is_failed(settings, clients):
    producer = Nightly(settings=settings, clients=clients)
    jobs = [producer.push({"n": n}, delay=timedelta(hours=2)) for n in range(2)]
    done = cancel_scheduled(clients, settings, jobs, "nightly", actor="ada")
    assert (done.cancelled, done.result) == (2, "done")
    # the same ids again: each already cancelled, so none is
    again = cancel_scheduled(clients, settings, jobs, "nightly", actor="ada")
    assert (again.cancelled, again.result) == (0, "failed")
    assert all(o.attempted and not o.too_late for o in again.outcomes)
    assert waiting(settings, clients) == []


class RefuseDelete:
    """botocore `before-send` hook on Scheduler's DeleteSchedule: the schedule called `name`
    is refused with a 403 AccessDeniedException, as an IAM policy without that resource
    would; `refused` counts those."""

    def __init__(self, name: str) -> None:
        self.name, self.refused = name, 0

    def __call__(self, request: Any, **_: Any) -> Any:
        if f"/schedules/{self.name}" not in request.url:
            return None
        self.refused += 1
        body = json.dumps({"Message": f"not authorized to perform: scheduler:DeleteSchedule "
                                      f"on {self.name}"}).encode()
        return aws_response(request.url, 403, {"Content-Type": "application/json",
                                               "x-amzn-ErrorType": "AccessDeniedException"},
                            body)


def test_an_aws_error_stops_the_batch_and_says_what_was_not_attempted(settings, clients):
    # Given three jobs, the second's schedule not deletable (DeleteSchedule refused)
    producer = Nightly(settings=settings, clients=clients)
    jobs = [producer.push({"n": n}, delay=timedelta(hours=1 + n)) for n in range(3)]
    by_id = {job.job_id: job.name for job in ScheduleStore(clients, settings).list("nightly")}
    refuse = RefuseDelete(by_id[jobs[1]])

    # When the three are cancelled in one call
    with injected(clients, "before-send.scheduler.DeleteSchedule", refuse):
        report = cancel_scheduled(clients, settings, jobs, "nightly", actor="ada")

    # Then the first is cancelled, the second answers the error, the third was not attempted
    first, second, third = report.outcomes
    assert refuse.refused == 1
    assert first.cancelled
    assert not second.cancelled and second.attempted
    assert second.text.startswith("ClientError: ") and "AccessDeniedException" in second.text
    assert second.text.endswith("it may not be cancelled: cancel it again")
    assert not third.cancelled and not third.attempted
    assert third.text.startswith("not attempted: an earlier cancel failed (ClientError: ")
    assert report.result == "partial"
    # And the jobs not cancelled still wait; cancelling them again (allowed now) finishes
    assert waiting(settings, clients) == jobs[1:]
    again = cancel_scheduled(clients, settings, jobs[1:], "nightly", actor="ada")
    assert again.result == "done" and waiting(settings, clients) == []
