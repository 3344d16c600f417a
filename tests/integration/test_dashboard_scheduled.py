"""Scheduled jobs on the dashboard: a channel's one-time jobs waiting in Scheduler (local
endpoint), with their due time, and an operator's cancel after a confirmation."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
import requests

from messenger import Producer
from messenger.jobs.schedule_store import ScheduleStore
from messenger.jobs.schedules import target_input
from messenger.message import MESSAGE_ID_ATTRIBUTE
from tests.dashboard import served

pytest.importorskip("starlette", reason="the dashboard extra is not installed")


class Nightly(Producer):
    channel = "nightly"


def test_list_and_cancel_a_scheduled_job(settings, clients):
    # Given two jobs due in 2 and 3 hours
    producer = Nightly(settings=settings, clients=clients)
    later = producer.push({"n": 2}, delay=timedelta(hours=3))
    sooner = producer.push({"n": 1}, delay=timedelta(hours=2))
    with served(settings, clients) as dash:
        page = requests.get(dash.url + "/channels/nightly/scheduled", timeout=30)
        assert page.status_code == 200
        # Then both are listed, soonest first, with their due time in UTC
        assert page.text.index(f'data-job="{sooner}"') < page.text.index(f'data-job="{later}"')
        assert "<time datetime=" in page.text and ">2h<" in page.text
        # When the operator cancels the sooner one (asked first, then confirmed)
        form = {"token": dash.token, "ids": sooner}
        asked = requests.post(dash.url + "/channels/nightly/cancel-scheduled", data=form,
                              timeout=30)
        assert "Cancel 1 scheduled job(s)" in asked.text
        assert [j.job_id for j in ScheduleStore(clients, settings).list("nightly")] == \
            [sooner, later]
        done = requests.post(dash.url + "/channels/nightly/cancel-scheduled", timeout=30,
                             data={**form, "confirmed": "yes"})
        assert 'data-cancelled="yes"' in done.text and "cancelled by local operator" in done.text
        # A second cancel says it is gone
        again = requests.post(dash.url + "/channels/nightly/cancel-scheduled", timeout=30,
                              data={**form, "confirmed": "yes"})
        assert 'data-cancelled="no"' in again.text
    assert [j.job_id for j in ScheduleStore(clients, settings).list("nightly")] == [later]


class TrackedNightly(Producer):
    channel = "nightly"
    track_status = True


def test_a_cancel_from_the_dashboard_is_on_the_jobs_page(settings, clients):
    # Given a tracked job scheduled in 2 hours
    producer = TrackedNightly(settings=settings, clients=clients)
    job_id = producer.push({"n": 1}, delay=timedelta(hours=2))
    producer.status.flush()
    with served(settings, clients) as dash:
        # When the operator cancels it from the channel's scheduled jobs (confirmed)
        done = requests.post(dash.url + "/channels/nightly/cancel-scheduled", timeout=30,
                             data={"token": dash.token, "ids": job_id, "confirmed": "yes"})
        assert 'data-cancelled="yes"' in done.text
        # Then the job's page shows its timeline ending CANCELLED, by whom, with the reason
        page = requests.get(dash.url + "/job", params={"id": job_id}, timeout=30)
    assert page.status_code == 200
    rows = page.text[page.text.index('id="timeline"'):]
    assert rows.index('data-event="SCHEDULED"') < rows.index('data-event="CANCELLED"')
    cancelled = rows[rows.index('data-event="CANCELLED"'):]
    assert '<td class="actor">local operator</td>' in cancelled
    assert "cancelled by local operator before it was due" in cancelled
    # And no Cancel button for a running job: it never ran
    assert "cancel-job" not in page.text


def late_job(settings, clients, endpoint: str, job_id: str, seconds_late: int) -> None:
    """A job on nightly `seconds_late` past its due time and not delivered: its target's queue
    does not exist, so every send fails and the schedule stays while Scheduler (the local
    endpoint's) retries it, as on AWS before its minute to fire is over or while a target
    refuses."""
    gone = f"{endpoint}/123456789012/{settings.namespace}-gone"
    request = target_input("sqs", gone, '{"n": 0}', {MESSAGE_ID_ATTRIBUTE: {
        "DataType": "String", "StringValue": job_id}})
    due = (datetime.now(UTC) - timedelta(seconds=seconds_late)).replace(microsecond=0)
    ScheduleStore(clients, settings).create("nightly", job_id, due, "sqs", request)


def in_column(html: str) -> dict[str, str]:
    """job id -> the text of its "in" cell, in the order listed."""
    return dict(re.findall(r'<tr data-job="([^"]+)">.*?<td class="n" data-field="in">([^<]*)</td>',
                           html, re.S))


def test_a_job_past_its_due_time_is_due_now_then_overdue_never_negative(settings, clients,
                                                                         endpoint):
    # Given a job due in 2 hours, one 30 s past its due time (within Scheduler's minute to fire
    # it) and one 5 minutes past it (Scheduler retrying a send its target refuses)
    ahead = Nightly(settings=settings, clients=clients).push({"n": 1},
                                                            delay=timedelta(hours=2))
    late_job(settings, clients, endpoint, "half-a-minute-late", 30)
    late_job(settings, clients, endpoint, "five-minutes-late", 300)
    with served(settings, clients) as dash:
        # When the page and its live list are read
        page = requests.get(dash.url + "/channels/nightly/scheduled", timeout=30)
        part = requests.get(dash.url + "/fragment/channels/nightly/scheduled", timeout=30)
    # Then each says how it stands, soonest first, and no time is negative
    assert page.status_code == part.status_code == 200
    expected = {"five-minutes-late": "overdue 5m", "half-a-minute-late": "due now", ahead: "2h"}
    assert list(in_column(page.text).items()) == list(expected.items())
    assert list(in_column(part.text).items()) == list(expected.items())
    assert not re.search(r'data-field="in">-\d', page.text)
    # and the live list is the list and its Cancel button only: no page around it, no token
    assert 'id="cancel-selected"' in part.text and "<html" not in part.text
    assert dash.token not in part.text
