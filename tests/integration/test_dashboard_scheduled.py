"""Scheduled jobs on the dashboard: a channel's one-time jobs waiting in Scheduler (local
endpoint), with their due time, and an operator's cancel after a confirmation."""

from __future__ import annotations

from datetime import timedelta

import pytest
import requests

from messenger import Producer
from messenger.jobs.schedule_store import ScheduleStore
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
